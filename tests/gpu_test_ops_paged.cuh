/*
 * gpu_test_ops_paged.cuh - the paged KV cache cases of build/gpu_test_ops, area attention
 * (test_attention_paged; kept apart so that gpu_test_ops.cu stays under the size rule): the
 * paged kernels (k_attention_paged, k_attention_paged_prefill, k_kv_store_paged,
 * k_rope_kv_store_paged, k_kv_copy_block) against ref_attention_paged / ref_kv_store_paged /
 * ref_rope on fresh random pools with shuffled block tables, and the contiguous entry points
 * against the paged ones over one block (bit for bit). Included once, by gpu_test_ops.cu, after
 * tests/gpu_t.cuh.
 */
#ifndef QS_GPU_TEST_OPS_PAGED_CUH
#define QS_GPU_TEST_OPS_PAGED_CUH

#include <algorithm> /* std::max_element, std::copy_n */

#include "gpu_t.cuh" /* rng, device buffers, compare, g_pool */

/* A paged pool (kernels/ref.h "paged KV cache") for n_tabs sequences of up to cap keys: block
 * tables [n_tabs][stride] drawn from a shuffled pool of half again as many blocks as they use
 * (so no table is contiguous or in order), random fp16 contents. */
struct paged_pool {
    int bs, nkv, hd, stride;
    std::vector<int32_t> tab;     /* [n_tabs][stride] */
    std::vector<uint16_t> kh, vh; /* the pools [n_blocks][nkv][bs][hd], fp16 bits */
    std::vector<float> kf, vf;    /* the same values: the reference's pools */
};
static paged_pool paged_pool_make(int n_tabs, int cap, int bs, int nkv, int hd)
{
    paged_pool p;
    p.bs = bs, p.nkv = nkv, p.hd = hd, p.stride = (cap + bs - 1) / bs;
    const int used = n_tabs * p.stride, n_blocks = used + used / 2 + 3;
    std::vector<int32_t> perm(n_blocks);
    for (int b = 0; b < n_blocks; ++b) perm[b] = b;
    for (int b = n_blocks - 1; b > 0; --b) std::swap(perm[b], perm[rng_u64() % (b + 1)]);
    p.tab.assign(perm.begin(), perm.begin() + used);
    rand_f16(p.kh, p.kf, (size_t)n_blocks * nkv * bs * hd, -2.0f, 2.0f);
    rand_f16(p.vh, p.vf, (size_t)n_blocks * nkv * bs * hd, -2.0f, 2.0f);
    return p;
}
static int32_t paged_slot(const paged_pool &p, int t, int pos)
{
    return p.tab[(size_t)t * p.stride + pos / p.bs] * p.bs + pos % p.bs;
}
/* values of a device pool that differ (bits) from the reference pool rounded to fp16 */
static size_t pool_diff(const uint16_t *d, const std::vector<float> &want)
{
    const std::vector<uint16_t> got = dev_download(d, want.size());
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += got[i] != ref_f32_to_f16(want[i]);
    return bad;
}

/* Score options of a case (kernels/ref.h struct ref_att_score): 0 plain; 1 Gemma 2 (scale
 * 96^-0.5, soft-cap 1.5); 2 MPT's ALiBi (slopes of nh heads, bias max 8); 3 Gemma 3 (scale
 * 0.07, no cap). The host struct for the reference, the device one (slopes uploaded) for the
 * kernels; NULL both for 0. */
struct att_score_case {
    ref_att_score host{}, dev{};
    std::vector<float> slopes;
    float *dslopes = nullptr;
    bool on = false;
    att_score_case(int kind, int nh)
    {
        if (kind == 0) return;
        on = true;
        if (kind == 1) host = {1.0f / sqrtf(96.0f), 1.5f, nullptr};
        if (kind == 3) host = {0.07f, 0.0f, nullptr};
        if (kind == 2) {
            slopes.resize(nh);
            ref_alibi_slopes(slopes.data(), nh, 0, nh, 8.0f);
            dslopes = dev_upload(slopes);
            host = {0.0f, 0.0f, slopes.data()};
        }
        dev = host;
        dev.alibi = dslopes;
    }
    ~att_score_case() { if (dslopes) TCUDA(cudaFree(dslopes)); }
    const ref_att_score *h() const { return on ? &host : nullptr; }
    const ref_att_score *d() const { return on ? &dev : nullptr; }
};

/* k_kv_store_paged then k_attention_paged vs ref_kv_store_paged + ref_attention_paged: query row
 * m at position pos[m] of table rt[m] (rt empty: row_table NULL, table m), tables of cap keys;
 * its k / v row goes to its slot first (a position outside the table is clamped by the kernel,
 * by hand for the reference, and stored nowhere: slot -1). max_keys = the tables' capacity (as
 * a graph sizes it). No workspace, split, split again (bit for bit). */
static void paged_decode_case(const char *name, const std::vector<int> &pos,
                              const std::vector<int> &rt, int cap, int nh, int nkv, int hd,
                              int bs, int sw, int score = 0)
{
    const att_score_case sc(score, nh);
    const int M = (int)pos.size();
    const int n_tabs = rt.empty() ? M : *std::max_element(rt.begin(), rt.end()) + 1;
    paged_pool p = paged_pool_make(n_tabs, cap, bs, nkv, hd);
    const int keys = p.stride * bs;
    const size_t qstride = (size_t)(nh + 2 * nkv) * hd, on = (size_t)M * nh * hd;
    std::vector<uint16_t> qkvh;
    std::vector<float> qkvf, out(on);
    rand_f16(qkvh, qkvf, (size_t)M * qstride, -2.0f, 2.0f);
    std::vector<int32_t> slots(M), pc(M), pos32(pos.begin(), pos.end()), rt32(rt.begin(), rt.end());
    for (int m = 0; m < M; ++m) {
        pc[m] = std::min(std::max(pos[m], 0), keys - 1);
        slots[m] = pc[m] == pos[m] ? paged_slot(p, rt.empty() ? m : rt[m], pos[m]) : -1;
    }
    uint16_t *dq = dev_upload(qkvh), *dk = dev_upload(p.kh), *dv = dev_upload(p.vh);
    uint16_t *dout = dev_poisoned<uint16_t>(on);
    int32_t *dpos = dev_upload(pos32), *dtab = dev_upload(p.tab), *dslot = dev_upload(slots);
    int32_t *drt = rt.empty() ? nullptr : dev_upload(rt32);
    CHECK_EQ_INT(k_kv_store_paged(dk, dv, dq + (size_t)nh * hd, dq + (size_t)(nh + nkv) * hd,
                                  qstride, M, dslot, nkv, hd, bs, nullptr), K_ERR_NONE);
    ref_kv_store_paged(p.kf.data(), p.vf.data(), qkvf.data() + (size_t)nh * hd,
                       qkvf.data() + (size_t)(nh + nkv) * hd, qstride, M, slots.data(), nkv, hd, bs);
    CHECK_EQ_INT(ref_attention_paged(out.data(), (size_t)nh * hd, qkvf.data(), qstride, p.kf.data(),
                                     p.vf.data(), M, pc.data(), p.tab.data(), p.stride,
                                     rt.empty() ? nullptr : rt32.data(), nh, nkv, hd, bs, sw, sc.h(),
                                     g_pool), REF_ERR_NONE);
    const size_t ws_bytes = k_attention_workspace_bytes(M, nh, hd, keys);
    void *dws = nullptr;
    if (ws_bytes) {
        TCUDA(cudaMalloc(&dws, ws_bytes));
        TCUDA(cudaMemset(dws, 0, ws_bytes));
    }
    char what[160];
    snprintf(what, sizeof what, "attention_paged %s M=%d heads=%d kv=%d hd=%d bs=%d sw=%d%s score %d",
             name, M, nh, nkv, hd, bs, sw, rt.empty() ? "" : " row_table", score);
    std::vector<uint16_t> first;
    for (int run = 0; run < 3; ++run) {
        TCUDA(cudaMemset(dout, 0xFF, on * sizeof(uint16_t)));
        CHECK_EQ_INT(k_attention_paged(dout, (size_t)nh * hd, dq, qstride, dk, dv, M, dpos, dtab,
                                       p.stride, drt, nh, nkv, hd, bs, keys, sw, sc.d(),
                                       run ? dws : nullptr, run ? ws_bytes : 0, nullptr), K_ERR_NONE);
        const std::vector<uint16_t> raw = dev_download(dout, on);
        const std::vector<float> got = f16_to_f32(raw);
        if (run < 2) compare(what, got.data(), out.data(), on, 3e-3, 3e-3, 3e-3);
        if (run == 1) first = raw;
        if (run == 2) CHECK_MSG(raw == first, "%s: the split run differs from the first", what);
    }
    const size_t bad = pool_diff(dk, p.kf) + pool_diff(dv, p.vf);
    CHECK_MSG(bad == 0, "%s: kv_store_paged: %zu pool values differ", what, bad);
    if (dws) TCUDA(cudaFree(dws));
    if (drt) TCUDA(cudaFree(drt));
    TCUDA(cudaFree(dq)); TCUDA(cudaFree(dk)); TCUDA(cudaFree(dv)); TCUDA(cudaFree(dout));
    TCUDA(cudaFree(dpos)); TCUDA(cudaFree(dtab)); TCUDA(cudaFree(dslot));
}

/* A prompt chunk of M rows at start .. start + M - 1 of one sequence: k_kv_store_paged, then
 * k_attention_paged_prefill (v2 at M >= 16 and hd 64 / 128, else v1) vs the reference, and bit
 * for bit equal to k_attention over a contiguous copy of the sequence's cache (no workspace and
 * with one). */
static void paged_prefill_case(int M, int start, int nh, int nkv, int hd, int bs, int sw,
                               int score = 0)
{
    const att_score_case sc(score, nh);
    const int T = start + M;
    paged_pool p = paged_pool_make(1, T, bs, nkv, hd);
    const size_t qstride = (size_t)(nh + 2 * nkv) * hd, on = (size_t)M * nh * hd;
    std::vector<uint16_t> qkvh;
    std::vector<float> qkvf, out(on);
    rand_f16(qkvh, qkvf, (size_t)M * qstride, -2.0f, 2.0f);
    std::vector<int32_t> slots(M), pc(M), rt0(M, 0);
    for (int m = 0; m < M; ++m) pc[m] = start + m, slots[m] = paged_slot(p, 0, start + m);
    uint16_t *dq = dev_upload(qkvh), *dk = dev_upload(p.kh), *dv = dev_upload(p.vh);
    uint16_t *dout = dev_poisoned<uint16_t>(on), *dout2 = dev_poisoned<uint16_t>(on);
    int32_t *dtab = dev_upload(p.tab), *dslot = dev_upload(slots);
    CHECK_EQ_INT(k_kv_store_paged(dk, dv, dq + (size_t)nh * hd, dq + (size_t)(nh + nkv) * hd,
                                  qstride, M, dslot, nkv, hd, bs, nullptr), K_ERR_NONE);
    ref_kv_store_paged(p.kf.data(), p.vf.data(), qkvf.data() + (size_t)nh * hd,
                       qkvf.data() + (size_t)(nh + nkv) * hd, qstride, M, slots.data(), nkv, hd, bs);
    CHECK_EQ_INT(ref_attention_paged(out.data(), (size_t)nh * hd, qkvf.data(), qstride, p.kf.data(),
                                     p.vf.data(), M, pc.data(), p.tab.data(), p.stride, rt0.data(),
                                     nh, nkv, hd, bs, sw, sc.h(), g_pool), REF_ERR_NONE);
    std::vector<uint16_t> kc((size_t)nkv * T * hd), vc(kc.size()); /* the contiguous copy */
    for (int h = 0; h < nkv; ++h)
        for (int t = 0; t < T; ++t)
            for (int d = 0; d < hd; ++d) {
                const size_t o = ref_kv_offset(paged_slot(p, 0, t), h, nkv, bs, hd) + d;
                kc[((size_t)h * T + t) * hd + d] = ref_f32_to_f16(p.kf[o]);
                vc[((size_t)h * T + t) * hd + d] = ref_f32_to_f16(p.vf[o]);
            }
    uint16_t *dkc = dev_upload(kc), *dvc = dev_upload(vc);
    const size_t ws_bytes = k_attention_workspace_bytes(M, nh, hd, T);
    void *dws = nullptr;
    if (ws_bytes) {
        TCUDA(cudaMalloc(&dws, ws_bytes));
        TCUDA(cudaMemset(dws, 0, ws_bytes));
    }
    char what[160];
    snprintf(what, sizeof what, "attention_paged_prefill M=%d start=%d heads=%d kv=%d hd=%d bs=%d "
             "sw=%d score %d", M, start, nh, nkv, hd, bs, sw, score);
    for (int run = 0; run < 2; ++run) {
        void *w = run ? dws : nullptr;
        const size_t wb = run ? ws_bytes : 0;
        CHECK_EQ_INT(k_attention_paged_prefill(dout, (size_t)nh * hd, dq, qstride, dk, dv, M, start,
                                               dtab, nh, nkv, hd, bs, sw, sc.d(), w, wb, nullptr),
                     K_ERR_NONE);
        CHECK_EQ_INT(k_attention(dout2, (size_t)nh * hd, dq, qstride, dkc, dvc, M, start, nh, nkv,
                                 hd, T, sw, w, wb, nullptr), K_ERR_NONE);
        const std::vector<uint16_t> raw = dev_download(dout, on), raw2 = dev_download(dout2, on);
        const std::vector<float> got = f16_to_f32(raw);
        compare(what, got.data(), out.data(), on, 3e-3, 3e-3, 3e-3);
        CHECK_MSG(sc.on || raw == raw2, "%s%s: differs from k_attention over the contiguous copy",
                  what, run ? " (workspace)" : ""); /* (k_attention has no score options) */
    }
    const size_t bad = pool_diff(dk, p.kf) + pool_diff(dv, p.vf);
    CHECK_MSG(bad == 0, "%s: kv_store_paged: %zu pool values differ", what, bad);
    if (dws) TCUDA(cudaFree(dws));
    TCUDA(cudaFree(dq)); TCUDA(cudaFree(dk)); TCUDA(cudaFree(dv)); TCUDA(cudaFree(dout));
    TCUDA(cudaFree(dout2)); TCUDA(cudaFree(dtab)); TCUDA(cudaFree(dslot)); TCUDA(cudaFree(dkc));
    TCUDA(cudaFree(dvc));
}

/* The contiguous entry points are the paged ones over one block of bs = T_cap rows (table {0}),
 * bit for bit: k_kv_store / k_kv_store_paged, k_attention / k_attention_paged_prefill (v1 and
 * v2), k_attention_at / k_attention_paged (row_table all 0), k_rope_kv_store / _paged. */
static void test_paged_contiguous_same(void)
{
    struct { int M, start, nh, nkv, hd, T_cap; } cases[] = {{1, 700, 8, 2, 128, 1024},
                                                            {20, 30, 4, 2, 64, 64},
                                                            {3, 9, 2, 1, 256, 16}};
    for (auto &c : cases) {
        const size_t qstride = (size_t)(c.nh + 2 * c.nkv) * c.hd, on = (size_t)c.M * c.nh * c.hd;
        const size_t cn = (size_t)c.nkv * c.T_cap * c.hd;
        std::vector<uint16_t> qh, kh, vh;
        std::vector<float> qf, kf, vf, inv(c.hd / 2);
        rand_f16(qh, qf, (size_t)c.M * qstride, -2.0f, 2.0f);
        rand_f16(kh, kf, cn, -2.0f, 2.0f);
        rand_f16(vh, vf, cn, -2.0f, 2.0f);
        ref_rope_inv_freq(inv.data(), c.hd, 10000.0, nullptr);
        std::vector<int32_t> posv(c.M), rt0(c.M, 0);
        for (int m = 0; m < c.M; ++m) posv[m] = c.start + m;
        uint16_t *dq[2] = {dev_upload(qh), dev_upload(qh)}, *dk[2] = {dev_upload(kh), dev_upload(kh)};
        uint16_t *dv[2] = {dev_upload(vh), dev_upload(vh)};
        uint16_t *dout[2] = {dev_poisoned<uint16_t>(on), dev_poisoned<uint16_t>(on)};
        int32_t *dstart = dev_upload(std::vector<int32_t>{c.start}), *dposv = dev_upload(posv);
        int32_t *drt0 = dev_upload(rt0), *dtab0 = dev_upload(std::vector<int32_t>{0});
        float *dinv = dev_upload(inv);
        const size_t ws_bytes = k_attention_workspace_bytes(c.M, c.nh, c.hd, c.T_cap);
        void *dws = nullptr;
        if (ws_bytes) {
            TCUDA(cudaMalloc(&dws, ws_bytes));
            TCUDA(cudaMemset(dws, 0, ws_bytes));
        }
        const size_t ko = (size_t)c.nh * c.hd, vo = (size_t)(c.nh + c.nkv) * c.hd, os = ko;
        char what[96];
        snprintf(what, sizeof what, "paged = contiguous M=%d start=%d hd=%d T_cap=%d", c.M,
                 c.start, c.hd, c.T_cap);
        auto same = [&](const char *step, uint16_t *const *d, size_t n) {
            const bool eq = dev_download(d[0], n) == dev_download(d[1], n);
            CHECK_MSG(eq, "%s: %s: contiguous and paged differ", what, step);
        };
        CHECK_EQ_INT(k_kv_store(dk[0], dv[0], dq[0] + ko, dq[0] + vo, qstride, c.M, c.start, c.nkv,
                                c.hd, c.T_cap, nullptr), K_ERR_NONE);
        CHECK_EQ_INT(k_kv_store_paged(dk[1], dv[1], dq[1] + ko, dq[1] + vo, qstride, c.M, dposv,
                                      c.nkv, c.hd, c.T_cap, nullptr), K_ERR_NONE);
        same("kv_store k", dk, cn);
        same("kv_store v", dv, cn);
        CHECK_EQ_INT(k_attention(dout[0], os, dq[0], qstride, dk[0], dv[0], c.M, c.start, c.nh,
                                 c.nkv, c.hd, c.T_cap, 0, dws, ws_bytes, nullptr), K_ERR_NONE);
        CHECK_EQ_INT(k_attention_paged_prefill(dout[1], os, dq[1], qstride, dk[1], dv[1], c.M,
                                               c.start, dtab0, c.nh, c.nkv, c.hd, c.T_cap, 0,
                                               nullptr, dws, ws_bytes, nullptr), K_ERR_NONE);
        same("attention / _paged_prefill", dout, on);
        CHECK_EQ_INT(k_attention_at(dout[0], os, dq[0], qstride, dk[0], dv[0], c.M, dstart, c.nh,
                                    c.nkv, c.hd, c.T_cap, 0, dws, ws_bytes, nullptr), K_ERR_NONE);
        CHECK_EQ_INT(k_attention_paged(dout[1], os, dq[1], qstride, dk[1], dv[1], c.M, dposv, dtab0,
                                       1, drt0, c.nh, c.nkv, c.hd, c.T_cap, c.T_cap, 0, nullptr,
                                       dws, ws_bytes, nullptr), K_ERR_NONE);
        same("attention_at / _paged", dout, on);
        CHECK_EQ_INT(k_rope_kv_store(dq[0], nullptr, c.M, c.nh, c.nkv, c.hd, qstride, dposv, dinv,
                                     dk[0], dv[0], c.T_cap, nullptr), K_ERR_NONE);
        CHECK_EQ_INT(k_rope_kv_store_paged(dq[1], nullptr, c.M, c.nh, c.nkv, c.hd, qstride, dposv,
                                           dinv, dk[1], dv[1], dposv, c.T_cap, nullptr), K_ERR_NONE);
        same("rope_kv_store x", dq, (size_t)c.M * qstride);
        same("rope_kv_store k", dk, cn);
        same("rope_kv_store v", dv, cn);
        for (int i = 0; i < 2; ++i) {
            TCUDA(cudaFree(dq[i])); TCUDA(cudaFree(dk[i])); TCUDA(cudaFree(dv[i]));
            TCUDA(cudaFree(dout[i]));
        }
        if (dws) TCUDA(cudaFree(dws));
        TCUDA(cudaFree(dstart)); TCUDA(cudaFree(dposv)); TCUDA(cudaFree(drt0));
        TCUDA(cudaFree(dtab0)); TCUDA(cudaFree(dinv));
    }
}

/* k_rope_kv_store_paged vs ref_rope + ref_kv_store_paged (fused qkv rows of two sequences, from
 * x and from fp32 sums): padding rows (slot -1) are rotated but store nothing, and every pool
 * row that no slot names keeps its bits (the random contents are the sentinel). */
static void test_rope_kv_store_paged(void)
{
    struct { int M, nq, nkv, hd, bs; } cases[] = {{5, 6, 2, 64, 16}, {7, 4, 4, 128, 24},
                                                  {4, 8, 1, 128, 1}};
    for (auto &c : cases)
        for (int from_acc = 0; from_acc < 2; ++from_acc) {
            const size_t stride = (size_t)(c.nq + 2 * c.nkv) * c.hd + 64;
            paged_pool p = paged_pool_make(2, 64, c.bs, c.nkv, c.hd);
            std::vector<uint16_t> xh;
            std::vector<float> xf, xa((size_t)c.M * stride), inv(c.hd / 2);
            rand_f16(xh, xf, xa.size(), -2.0f, 2.0f);
            for (auto &v : xa) v = rng_uniform(-2.0f, 2.0f);
            ref_rope_inv_freq(inv.data(), c.hd, 500000.0, nullptr);
            std::vector<int32_t> perm(64), pos(c.M), slots(c.M);
            for (int t = 0; t < 64; ++t) perm[t] = t;
            for (int t = 63; t > 0; --t) std::swap(perm[t], perm[rng_u64() % (t + 1)]);
            for (int m = 0; m < c.M; ++m) pos[m] = perm[m], slots[m] = paged_slot(p, m % 2, pos[m]);
            slots[1] = slots[c.M - 1] = -1; /* batch padding */
            uint16_t *dx = dev_upload(xh), *dk = dev_upload(p.kh), *dv = dev_upload(p.vh);
            int32_t *dp = dev_upload(pos), *ds = dev_upload(slots);
            float *dinv = dev_upload(inv), *dxa = from_acc ? dev_upload(xa) : nullptr;
            CHECK_EQ_INT(k_rope_kv_store_paged(dx, dxa, c.M, c.nq, c.nkv, c.hd, stride, dp, dinv, dk,
                                               dv, ds, c.bs, nullptr), K_ERR_NONE);
            std::vector<float> want = from_acc ? xa : xf, wr(want.size());
            ref_rope(want.data(), c.M, c.nq + c.nkv, c.hd, stride, pos.data(), inv.data());
            for (size_t i = 0; i < want.size(); ++i) wr[i] = ref_f16_to_f32(ref_f32_to_f16(want[i]));
            std::vector<float> wk = p.kf, wv = p.vf;
            ref_kv_store_paged(wk.data(), wv.data(), wr.data() + (size_t)c.nq * c.hd,
                               wr.data() + (size_t)(c.nq + c.nkv) * c.hd, stride, c.M, slots.data(),
                               c.nkv, c.hd, c.bs);
            const std::vector<float> gx = f16_to_f32(dev_download(dx, xa.size()));
            const std::vector<uint16_t> gkh = dev_download(dk, wk.size());
            const std::vector<float> gk = f16_to_f32(gkh);
            char what[112];
            snprintf(what, sizeof what, "rope_kv_store_paged%s M=%d nq=%d nkv=%d hd=%d bs=%d",
                     from_acc ? " (acc)" : "", c.M, c.nq, c.nkv, c.hd, c.bs);
            compare(what, gx.data(), want.data(), gx.size(), 2e-3, 2e-3, 2e-3);
            compare(what, gk.data(), wk.data(), gk.size(), 2e-3, 2e-3, 2e-3);
            const size_t vbad = pool_diff(dv, wv);
            CHECK_MSG(vbad == 0, "%s: %zu v pool values differ", what, vbad);
            std::vector<char> stored(wk.size() / c.hd, 0); /* pool rows some slot names */
            for (int m = 0; m < c.M; ++m)
                for (int h = 0; h < c.nkv && slots[m] >= 0; ++h)
                    stored[ref_kv_offset(slots[m], h, c.nkv, c.bs, c.hd) / c.hd] = 1;
            size_t changed = 0;
            for (size_t i = 0; i < gkh.size(); ++i) changed += !stored[i / c.hd] && gkh[i] != p.kh[i];
            CHECK_MSG(changed == 0, "%s: %zu k values outside the stored rows changed", what, changed);
            if (dxa) {
                const size_t nz = dev_nonzero(dxa, xa.size());
                CHECK_MSG(nz == 0, "%s: %zu acc values not zeroed", what, nz);
                TCUDA(cudaFree(dxa));
            }
            TCUDA(cudaFree(dx)); TCUDA(cudaFree(dk)); TCUDA(cudaFree(dv)); TCUDA(cudaFree(dp));
            TCUDA(cudaFree(ds)); TCUDA(cudaFree(dinv));
        }
}

/* k_kv_copy_block, recorded into a CUDA graph and replayed: block dst of both pools = block
 * src, every other block keeps its bits; src == dst copies nothing. */
static void test_kv_copy_block(void)
{
    const int n_blocks = 7, src = 5, dst = 2;
    const size_t be = (size_t)2 * 16 * 64; /* nkv 2, bs 16, hd 64 */
    std::vector<uint16_t> kh, vh;
    std::vector<float> kf, vf;
    rand_f16(kh, kf, n_blocks * be, -2.0f, 2.0f);
    rand_f16(vh, vf, n_blocks * be, -2.0f, 2.0f);
    uint16_t *dk = dev_upload(kh), *dv = dev_upload(vh);
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TCUDA(cudaStreamCreate(&s));
    TCUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK_EQ_INT(k_kv_copy_block(dk, dv, src, dst, be, s), K_ERR_NONE);
    TCUDA(cudaStreamEndCapture(s, &g));
    TCUDA(cudaGraphInstantiate(&ge, g, 0));
    TCUDA(cudaGraphLaunch(ge, s));
    CHECK_EQ_INT(k_kv_copy_block(dk, dv, 3, 3, be, s), K_ERR_NONE);
    TCUDA(cudaStreamSynchronize(s));
    for (std::vector<float> *f : {&kf, &vf}) std::copy_n(f->begin() + src * be, be, f->begin() + dst * be);
    const size_t bad = pool_diff(dk, kf) + pool_diff(dv, vf);
    CHECK_MSG(bad == 0, "kv_copy_block %d -> %d: %zu pool values differ", src, dst, bad);
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_kv_copy_block(dk, dv, -1, dst, be, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_kv_copy_block(dk, dv, src, dst, 0, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_kv_copy_block(dk, nullptr, src, dst, be, nullptr), K_ERR_ARG);
    qs_log_set_quiet(false);
    TCUDA(cudaGraphExecDestroy(ge)); TCUDA(cudaGraphDestroy(g)); TCUDA(cudaStreamDestroy(s));
    TCUDA(cudaFree(dk)); TCUDA(cudaFree(dv));
}

/* the paged area of test_attention: shuffled block tables, block sizes 16, 32, 1 and 24 */
static void test_attention_paged(bool quick)
{
    test_paged_contiguous_same();
    /* decode rows of sequences of different lengths (row_table NULL): GQA 4:1, MQA, hd 256 with
     * bs 1, a window with bs 24 and a split row, positions clamped into the table */
    paged_decode_case("5 seqs", {0, 16, 39, 129, 299}, {}, 300, 8, 2, 128, 16, 0);
    paged_decode_case("4 seqs", {32, 63, 64, 999}, {}, 1000, 4, 1, 64, 32, 0);
    paged_decode_case("3 seqs", {0, 4, 69}, {}, 70, 2, 2, 256, 1, 0);
    paged_decode_case("window", {9, 23, 24, 199, 2099}, {}, 2100, 8, 2, 128, 24, 50);
    paged_decode_case("split", {1299, 1999}, {}, 2000, 4, 1, 128, 16, 0);
    paged_decode_case("clamped", {-3, 5, 64 + 7}, {}, 64, 2, 1, 128, 16, 0);
    /* rows sharing a table (a prompt chunk through v1) next to decode rows of other tables */
    paged_decode_case("chunk+decode", {20, 21, 22, 23, 24, 47, 5}, {0, 0, 0, 0, 0, 1, 2}, 48, 4, 2,
                      128, 16, 0);
    paged_decode_case("2 chunks", {10, 11, 12, 30, 31, 32}, {1, 1, 1, 0, 0, 0}, 40, 4, 1, 64, 24, 8);
    if (!quick) paged_decode_case("long", {2999, 3999, 17}, {}, 4000, 32, 8, 128, 16, 0);
    /* prompt chunks starting inside a block: v1 (M < 16, hd 256), v2 (M >= 16, bs 24, bs 1) */
    paged_prefill_case(1, 31, 4, 2, 128, 16, 0);
    paged_prefill_case(5, 14, 8, 2, 64, 16, 0);
    paged_prefill_case(16, 10, 2, 1, 128, 16, 0);
    paged_prefill_case(70, 20, 8, 2, 128, 24, 24);
    paged_prefill_case(130, 77, 4, 4, 64, 32, 100);
    paged_prefill_case(16, 5, 4, 1, 64, 1, 0);
    paged_prefill_case(20, 3, 2, 2, 256, 16, 0);
    paged_prefill_case(5, 2000, 4, 1, 128, 32, 0); /* v1 with split keys */
    /* hd 96 (Phi-3-mini): v1 for decode and prompt chunks alike, 3 value dims per lane */
    paged_decode_case("hd 96", {0, 17, 40, 1300}, {}, 1400, 8, 2, 96, 16, 0);
    paged_prefill_case(40, 9, 4, 4, 96, 16, 0);
    paged_prefill_case(3, 600, 4, 2, 96, 16, 64);
    if (!quick) paged_prefill_case(512, 1536, 32, 8, 128, 16, 0);
    /* score options: Gemma 2's scale and soft-cap, MPT's ALiBi (12 heads: interleaved slopes),
     * Gemma 3's scale at hd 256; decode (v1, split and not) and prompt chunks (v2 at hd 64 /
     * 128, v1 at 256) */
    for (int score : {1, 2, 3}) {
        const int nh = score == 2 ? 12 : 8, nkv = score == 2 ? 12 : score == 3 ? 1 : 4;
        const int hd = score == 3 ? 256 : score == 2 ? 64 : 128;
        paged_decode_case("scored", {0, 9, 40, 700, 1999}, {}, 2000, nh, nkv, hd, 16,
                          score == 1 ? 37 : 0, score);
        paged_decode_case("scored chunks", {10, 11, 12, 30, 31, 32}, {1, 1, 1, 0, 0, 0}, 40, nh, nkv,
                          hd, 16, score == 3 ? 8 : 0, score);
        paged_prefill_case(70, 20, nh, nkv, hd, 16, score == 1 ? 24 : 0, score);
        paged_prefill_case(5, 300, nh, nkv, hd, 16, 0, score);
        paged_prefill_case(130, 77, nh, nkv, hd, 32, score == 3 ? 100 : 0, score);
    }
    test_rope_kv_store_paged();
    test_kv_copy_block();
    qs_log_set_quiet(true);
    uint16_t *d = dev_poisoned<uint16_t>(1024);
    const int32_t *di = reinterpret_cast<const int32_t *>(d);
    CHECK_EQ_INT(k_attention_paged(d, 128, d, 128, d, d, 1, di, di, 1, nullptr, 1, 1, 80, 16, 16,
                                   0, nullptr, nullptr, 0, nullptr), K_ERR_SHAPE); /* hd 80 */
    CHECK_EQ_INT(k_attention_paged(d, 128, d, 128, d, d, 1, di, di, 1, nullptr, 1, 1, 128, 0, 16,
                                   0, nullptr, nullptr, 0, nullptr), K_ERR_SHAPE); /* block_size 0 */
    CHECK_EQ_INT(k_attention_paged(d, 128, d, 128, d, d, 1, nullptr, di, 1, nullptr, 1, 1, 128, 16,
                                   16, 0, nullptr, nullptr, 0, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_attention_paged_prefill(d, 128, d, 128, d, d, 1, 0, nullptr, 1, 1, 128, 16, 0,
                                           nullptr, nullptr, 0, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_attention_paged_prefill(d, 128, d, 128, d, d, 1, -1, di, 1, 1, 128, 16, 0,
                                           nullptr, nullptr, 0, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_kv_store_paged(d, d, d, d, 128, 1, nullptr, 1, 128, 16, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_kv_store_paged(d, d, d, d, 128, 1, di, 1, 128, 0, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_rope_kv_store_paged(d, nullptr, 1, 1, 1, 64, 192, di, (const float *)d, d, d,
                                       nullptr, 16, nullptr), K_ERR_ARG);
    qs_log_set_quiet(false);
    TCUDA(cudaFree(d));
}

#endif /* QS_GPU_TEST_OPS_PAGED_CUH */

/*
 * gpu_test_ops.cu - every CUDA kernel but the W4A16 linear (kernels/kernels.h) against its
 * plain-C reference (kernels/ref.h) on fresh random inputs (never zeros), outputs poisoned with
 * NaN beforehand (harness: tests/gpu_t.cuh).
 * Areas: rmsnorm (and rmsnorm_acc from fp32 sums), head_rmsnorm (Qwen3 q/k norms), silu_mul (and _acc),
 * layernorm (Falcon's LayerNorm with bias, and residual_add), gelu (and from sums), rope (and _acc),
 * rope_kv_store, embed, argmax, sample (vs runtime/rt_sample.c), attention (with the paged KV
 * cache: k_*_paged, k_kv_copy_block), moe, allreduce.
 * The W4A16 routes and their ACC epilogue feeding these consumers: tests/gpu_test_w4a16.cu.
 *
 * Run: build/gpu_test_ops [--quick] (tests/run_gpu_tests.sh; --quick = small subset for
 * compute-sanitizer). Seed: QS_TEST_SEED (default from the clock, printed).
 */
#include "gpu_t.cuh"              /* rng, device buffers, compare, gpu_test_main */
#include "gpu_test_ops_paged.cuh" /* test_attention_paged (area attention) */
#include "rt_sample.h"            /* rt_sampler: the reference of k_sample */
#include "gpu_test_ops_rows.cuh"  /* test_sample_rows (area sample) */
#include "gpu_test_ops_act.cuh"   /* test_gelu, test_gelu_tanh_softcap (areas gelu, softcap) */

// --- rmsnorm, silu_mul, rope, embed, argmax -------------------------------------------------------

static void test_rmsnorm(void)
{
    /* vector kernel (H % 4 == 0, H <= 8192, 1..8 float4 per thread) and the generic one (H = 1002,
     * 12288) */
    const int shapes[][2] = {{1, 4096}, {3, 5120}, {17, 8192}, {5, 64}, {2, 1000}, {2, 1002}, {1, 12288}};
    for (auto &s : shapes) {
        const int M = s[0], H = s[1];
        for (int mode = 0; mode < 3; ++mode) { /* 0: x+residual, 1: residual only, 2: x only */
            std::vector<uint16_t> xh;
            std::vector<float> xf, res(M * (size_t)H), w(H), out((size_t)M * H);
            rand_f16(xh, xf, (size_t)M * H, -4.0f, 4.0f);
            for (auto &r : res) r = rng_uniform(-300.0f, 300.0f); /* beyond fp16-safe squares */
            for (auto &v : w) v = rng_uniform(0.5f, 1.5f);
            uint16_t *dx = dev_upload(xh), *dout = dev_poisoned<uint16_t>((size_t)M * H);
            float *dres = dev_upload(res), *dw = dev_upload(w);
            const bool use_x = mode != 1, use_res = mode != 2;
            CHECK_EQ_INT(k_rmsnorm(dout, use_res ? dres : nullptr, use_x ? dx : nullptr, dw, M, H,
                                   1e-5f, nullptr), K_ERR_NONE);
            std::vector<float> zero((size_t)M * H, 0.0f);
            ref_rmsnorm(out.data(), use_res ? res.data() : nullptr, use_x ? xf.data() : zero.data(),
                        w.data(), M, H, 1e-5f);
            const std::vector<float> got = f16_to_f32(dev_download(dout, (size_t)M * H));
            char what[96];
            snprintf(what, sizeof what, "rmsnorm M=%d H=%d mode %d", M, H, mode);
            compare(what, got.data(), out.data(), got.size(), 1e-3, 2e-3, 2e-3);
            if (use_res) {
                const std::vector<float> r2 = dev_download(dres, (size_t)M * H);
                snprintf(what, sizeof what, "rmsnorm residual M=%d H=%d mode %d", M, H, mode);
                compare(what, r2.data(), res.data(), r2.size(), 1e-6, 1e-6, 1e-6);
            }
            TCUDA(cudaFree(dx)); TCUDA(cudaFree(dout)); TCUDA(cudaFree(dres)); TCUDA(cudaFree(dw));
        }
    }
    /* k_rmsnorm_acc: x as fp32 sums (deferred split-K), read and zeroed */
    for (auto &s : shapes) {
        const int M = s[0], H = s[1];
        std::vector<float> xa((size_t)M * H), res((size_t)M * H), w(H), out((size_t)M * H);
        for (auto &v : xa) v = rng_uniform(-4.0f, 4.0f);
        for (auto &r : res) r = rng_uniform(-300.0f, 300.0f);
        for (auto &v : w) v = rng_uniform(0.5f, 1.5f);
        uint16_t *dout = dev_poisoned<uint16_t>((size_t)M * H);
        float *dxa = dev_upload(xa), *dres = dev_upload(res), *dw = dev_upload(w);
        CHECK_EQ_INT(k_rmsnorm_acc(dout, dres, dxa, dw, M, H, 1e-5f, nullptr), K_ERR_NONE);
        ref_rmsnorm(out.data(), res.data(), xa.data(), w.data(), M, H, 1e-5f);
        const std::vector<float> got = f16_to_f32(dev_download(dout, (size_t)M * H));
        const std::vector<float> r2 = dev_download(dres, (size_t)M * H);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm_acc M=%d H=%d", M, H);
        compare(what, got.data(), out.data(), got.size(), 1e-3, 2e-3, 2e-3);
        snprintf(what, sizeof what, "rmsnorm_acc residual M=%d H=%d", M, H);
        compare(what, r2.data(), res.data(), r2.size(), 1e-6, 1e-6, 1e-6);
        const size_t nz = dev_nonzero(dxa, (size_t)M * H);
        CHECK_MSG(nz == 0, "rmsnorm_acc M=%d H=%d: %zu x_acc values not zeroed", M, H, nz);
        TCUDA(cudaFree(dout)); TCUDA(cudaFree(dxa)); TCUDA(cudaFree(dres)); TCUDA(cudaFree(dw));
    }
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_rmsnorm_acc(nullptr, nullptr, nullptr, nullptr, 1, 64, 1e-5f, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_rmsnorm(nullptr, nullptr, nullptr, nullptr, 1, 64, 1e-5f, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_rmsnorm(nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-5f, nullptr), K_ERR_SHAPE);
    qs_log_set_quiet(false);
}

/* k_head_rmsnorm (Qwen3 q_norm / k_norm) vs ref_head_rmsnorm on fresh random rows: fp16 rows in
 * place (v and the padding past the heads untouched) and fp32 sums in place */
static void test_head_rmsnorm(void)
{
    const int shapes[][4] = {{1, 32, 8, 128}, {7, 16, 8, 128}, {3, 8, 2, 64}, {2, 4, 0, 256},
                             {5, 2, 1, 96}};
    for (auto &s : shapes) {
        const int M = s[0], nq = s[1], nkv = s[2], hd = s[3];
        const size_t stride = (size_t)(nq + 2 * nkv) * hd + 8, n = (size_t)M * stride;
        std::vector<float> wq(hd), wk(hd);
        for (auto &v : wq) v = rng_uniform(0.5f, 1.5f);
        for (auto &v : wk) v = rng_uniform(0.5f, 1.5f);
        float *dwq = dev_upload(wq), *dwk = dev_upload(wk);
        char what[96];
        { /* fp16 rows */
            std::vector<uint16_t> xh;
            std::vector<float> xf;
            rand_f16(xh, xf, n, -6.0f, 6.0f);
            uint16_t *dx = dev_upload(xh);
            CHECK_EQ_INT(k_head_rmsnorm(dx, nullptr, M, nq, nkv, hd, stride, dwq, dwk, 1e-6f,
                                        nullptr), K_ERR_NONE);
            ref_head_rmsnorm(xf.data(), M, nq, nkv, hd, stride, wq.data(), wk.data(), 1e-6f);
            const std::vector<float> got = f16_to_f32(dev_download(dx, n));
            snprintf(what, sizeof what, "head_rmsnorm M=%d nq=%d nkv=%d hd=%d", M, nq, nkv, hd);
            compare(what, got.data(), xf.data(), n, 1e-3, 2e-3, 2e-3);
            TCUDA(cudaFree(dx));
        }
        { /* fp32 sums (ACC route) */
            std::vector<float> xa(n), want;
            for (auto &v : xa) v = rng_uniform(-6.0f, 6.0f);
            want = xa;
            float *da = dev_upload(xa);
            CHECK_EQ_INT(k_head_rmsnorm(nullptr, da, M, nq, nkv, hd, stride, dwq, dwk, 1e-6f,
                                        nullptr), K_ERR_NONE);
            ref_head_rmsnorm(want.data(), M, nq, nkv, hd, stride, wq.data(), wk.data(), 1e-6f);
            const std::vector<float> got = dev_download(da, n);
            snprintf(what, sizeof what, "head_rmsnorm acc M=%d nq=%d nkv=%d hd=%d", M, nq, nkv, hd);
            compare(what, got.data(), want.data(), n, 1e-5, 1e-5, 1e-5);
            TCUDA(cudaFree(da));
        }
        TCUDA(cudaFree(dwq)); TCUDA(cudaFree(dwk));
    }
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_head_rmsnorm(nullptr, nullptr, 1, 2, 1, 64, 256, nullptr, nullptr, 1e-6f, nullptr),
                 K_ERR_ARG);
    CHECK_EQ_INT(k_head_rmsnorm(nullptr, nullptr, 1, 2, 1, 64, 100, nullptr, nullptr, 1e-6f, nullptr),
                 K_ERR_SHAPE);
    qs_log_set_quiet(false);
}

/* k_layernorm (Falcon) vs ref_layernorm on fresh random rows whose mean is far from zero: the
 * three residual modes and the fp32-sums mode, with and without bias; k_residual_add (a parallel
 * residual's attention output) vs ref_residual_add from fp16 and from fp32 sums */
static void test_layernorm(void)
{
    const int shapes[][2] = {{1, 4544}, {3, 4096}, {17, 1000}, {2, 64}};
    for (auto &s : shapes) {
        const int M = s[0], H = s[1];
        for (int mode = 0; mode < 4; ++mode) { /* x+residual, residual, x, x_acc+residual */
            std::vector<uint16_t> xh;
            std::vector<float> xf, xa((size_t)M * H), res((size_t)M * H), w(H), b(H), out((size_t)M * H);
            rand_f16(xh, xf, (size_t)M * H, -4.0f, 4.0f);
            for (auto &v : xa) v = rng_uniform(-4.0f, 4.0f);
            for (auto &r : res) r = rng_uniform(100.0f, 140.0f); /* mean far from 0 */
            for (auto &v : w) v = rng_uniform(0.5f, 1.5f);
            for (auto &v : b) v = rng_uniform(-1.0f, 1.0f);
            const bool bias = (M + mode) % 2 == 0;
            uint16_t *dx = dev_upload(xh), *dout = dev_poisoned<uint16_t>((size_t)M * H);
            float *dres = dev_upload(res), *dw = dev_upload(w), *db = dev_upload(b), *dxa = dev_upload(xa);
            const bool use_x = mode == 0 || mode == 2, use_res = mode != 2, acc = mode == 3;
            CHECK_EQ_INT(k_layernorm(dout, use_res ? dres : nullptr, use_x ? dx : nullptr,
                                     acc ? dxa : nullptr, dw, bias ? db : nullptr, M, H, 1e-5f,
                                     nullptr), K_ERR_NONE);
            ref_layernorm(out.data(), use_res ? res.data() : nullptr,
                          acc ? xa.data() : use_x ? xf.data() : nullptr, w.data(),
                          bias ? b.data() : nullptr, M, H, 1e-5f);
            const std::vector<float> got = f16_to_f32(dev_download(dout, (size_t)M * H));
            char what[96];
            snprintf(what, sizeof what, "layernorm M=%d H=%d mode %d bias %d", M, H, mode, bias);
            compare(what, got.data(), out.data(), got.size(), 2e-3, 2e-3, 2e-3);
            if (use_res) {
                const std::vector<float> r2 = dev_download(dres, (size_t)M * H);
                snprintf(what, sizeof what, "layernorm residual M=%d H=%d mode %d", M, H, mode);
                compare(what, r2.data(), res.data(), r2.size(), 1e-6, 1e-6, 1e-6);
            }
            if (acc) {
                const size_t nz = dev_nonzero(dxa, xa.size());
                CHECK_MSG(nz == 0, "layernorm acc M=%d H=%d: %zu x_acc values not zeroed", M, H, nz);
            }
            TCUDA(cudaFree(dx)); TCUDA(cudaFree(dout)); TCUDA(cudaFree(dres)); TCUDA(cudaFree(dw));
            TCUDA(cudaFree(db)); TCUDA(cudaFree(dxa));
        }
        for (int from_acc = 0; from_acc < 2; ++from_acc) {
            std::vector<uint16_t> xh;
            std::vector<float> xf, xa((size_t)M * H), res((size_t)M * H);
            rand_f16(xh, xf, (size_t)M * H, -4.0f, 4.0f);
            for (auto &v : xa) v = rng_uniform(-4.0f, 4.0f);
            for (auto &r : res) r = rng_uniform(-300.0f, 300.0f);
            uint16_t *dx = dev_upload(xh);
            float *dres = dev_upload(res), *dxa = dev_upload(xa);
            CHECK_EQ_INT(k_residual_add(dres, from_acc ? nullptr : dx, from_acc ? dxa : nullptr,
                                        (size_t)M * H, nullptr), K_ERR_NONE);
            ref_residual_add(res.data(), from_acc ? xa.data() : xf.data(), (size_t)M * H);
            const std::vector<float> r2 = dev_download(dres, (size_t)M * H);
            char what[96];
            snprintf(what, sizeof what, "residual_add M=%d H=%d from %s", M, H, from_acc ? "acc" : "fp16");
            compare(what, r2.data(), res.data(), r2.size(), 1e-6, 1e-6, 1e-6);
            if (from_acc)
                CHECK_MSG(dev_nonzero(dxa, xa.size()) == 0, "%s: sums not zeroed", what);
            TCUDA(cudaFree(dx)); TCUDA(cudaFree(dres)); TCUDA(cudaFree(dxa));
        }
    }
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_layernorm(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 64, 1e-5f, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_layernorm(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-5f, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_residual_add(nullptr, nullptr, nullptr, 4, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_residual_add(nullptr, nullptr, nullptr, 0, nullptr), K_ERR_SHAPE);
    qs_log_set_quiet(false);
}

static void test_silu_mul(void)
{
    for (auto s : {std::pair<int, int>{1, 11008}, {7, 1408}, {33, 3584}, {2, 5}}) {
        const int M = s.first, I = s.second;
        std::vector<uint16_t> gh;
        std::vector<float> gf, out((size_t)M * I);
        rand_f16(gh, gf, (size_t)M * 2 * I, -8.0f, 8.0f);
        uint16_t *dg = dev_upload(gh), *dout = dev_poisoned<uint16_t>((size_t)M * I);
        CHECK_EQ_INT(k_silu_mul(dout, dg, M, I, nullptr), K_ERR_NONE);
        ref_silu_mul(out.data(), gf.data(), M, I);
        const std::vector<float> got = f16_to_f32(dev_download(dout, (size_t)M * I));
        char what[64];
        snprintf(what, sizeof what, "silu_mul M=%d I=%d", M, I);
        compare(what, got.data(), out.data(), got.size(), 1e-3, 1e-3, 1e-3);
        TCUDA(cudaFree(dg)); TCUDA(cudaFree(dout));
        /* k_silu_mul_acc: gate_up as fp32 sums, read and zeroed */
        std::vector<float> ga((size_t)M * 2 * I);
        for (auto &v : ga) v = rng_uniform(-8.0f, 8.0f);
        float *dga = dev_upload(ga);
        dout = dev_poisoned<uint16_t>((size_t)M * I);
        CHECK_EQ_INT(k_silu_mul_acc(dout, dga, M, I, nullptr), K_ERR_NONE);
        ref_silu_mul(out.data(), ga.data(), M, I);
        const std::vector<float> got2 = f16_to_f32(dev_download(dout, (size_t)M * I));
        snprintf(what, sizeof what, "silu_mul_acc M=%d I=%d", M, I);
        compare(what, got2.data(), out.data(), got2.size(), 1e-3, 1e-3, 1e-3);
        const size_t nz = dev_nonzero(dga, ga.size());
        CHECK_MSG(nz == 0, "%s: %zu gate_up values not zeroed", what, nz);
        TCUDA(cudaFree(dga)); TCUDA(cudaFree(dout));
    }
}

static void test_rope(void)
{
    struct qs_rope_scaling l3 = {QS_ROPE_LLAMA3, 8.0, 1.0, 4.0, 8192};
    struct { int M, nh, hd; double theta; const struct qs_rope_scaling *sc; } cases[] = {
        {1, 48, 128, 10000.0, nullptr}, {19, 6, 128, 500000.0, &l3}, {5, 3, 64, 10000.0, nullptr},
        {2, 40, 128, 1000000.0, nullptr}};
    for (auto &c : cases) {
        const size_t stride = (size_t)c.nh * c.hd + 64; /* a row with more than the rotated heads */
        std::vector<uint16_t> xh;
        std::vector<float> xf, inv(c.hd / 2);
        rand_f16(xh, xf, (size_t)c.M * stride, -2.0f, 2.0f);
        std::vector<int32_t> pos(c.M);
        for (auto &p : pos) p = (int32_t)(rng_u64() % 131072);
        ref_rope_inv_freq(inv.data(), c.hd, c.theta, c.sc);
        uint16_t *dx = dev_upload(xh);
        int32_t *dp = dev_upload(pos);
        float *dinv = dev_upload(inv);
        CHECK_EQ_INT(k_rope(dx, c.M, c.nh, c.hd, stride, dp, dinv, nullptr), K_ERR_NONE);
        ref_rope(xf.data(), c.M, c.nh, c.hd, stride, pos.data(), inv.data());
        const std::vector<float> got = f16_to_f32(dev_download(dx, (size_t)c.M * stride));
        char what[64];
        snprintf(what, sizeof what, "rope M=%d heads=%d hd=%d", c.M, c.nh, c.hd);
        compare(what, got.data(), xf.data(), got.size(), 2e-3, 2e-3, 2e-3);
        /* k_rope_acc: the row as fp32 sums (deferred qkv); rotated heads and the rest of the
         * row (v) into x, acc zeroed */
        std::vector<float> xa((size_t)c.M * stride);
        for (auto &v : xa) v = rng_uniform(-2.0f, 2.0f);
        float *dxa = dev_upload(xa);
        TCUDA(cudaMemset(dx, 0xFF, (size_t)c.M * stride * 2));
        CHECK_EQ_INT(k_rope_acc(dx, dxa, c.M, c.nh, c.hd, stride, dp, dinv, nullptr), K_ERR_NONE);
        ref_rope(xa.data(), c.M, c.nh, c.hd, stride, pos.data(), inv.data());
        const std::vector<float> got2 = f16_to_f32(dev_download(dx, (size_t)c.M * stride));
        snprintf(what, sizeof what, "rope_acc M=%d heads=%d hd=%d", c.M, c.nh, c.hd);
        compare(what, got2.data(), xa.data(), got2.size(), 2e-3, 2e-3, 2e-3);
        const size_t nz = dev_nonzero(dxa, xa.size());
        CHECK_MSG(nz == 0, "%s: %zu acc values not zeroed", what, nz);
        TCUDA(cudaFree(dx)); TCUDA(cudaFree(dp)); TCUDA(cudaFree(dinv)); TCUDA(cudaFree(dxa));
    }
}

/*
 * k_rope_kv_store vs ref_rope + the cache rows it must write: fused qkv rows (q | k | v | 64 extra
 * columns), from fp16 x and from fp32 sums (acc, zeroed after); caches start random and only
 * rows pos[m] in [0, T_cap) may change (one row's position is past the cache, one negative).
 */
static void test_rope_kv_store(void)
{
    struct { int M, nq, nkv, hd, T_cap; } cases[] = {{1, 32, 8, 128, 64}, {5, 6, 2, 64, 40},
                                                     {7, 4, 4, 128, 300}};
    std::vector<float> inv;
    for (auto &c : cases)
        for (int from_acc = 0; from_acc < 2; ++from_acc) {
            const size_t stride = (size_t)(c.nq + 2 * c.nkv) * c.hd + 64;
            const size_t cache_n = (size_t)c.nkv * c.T_cap * c.hd;
            inv.resize(c.hd / 2);
            ref_rope_inv_freq(inv.data(), c.hd, 500000.0, nullptr);
            std::vector<uint16_t> xh, kh, vh;
            std::vector<float> xf, kf, vf, xa((size_t)c.M * stride);
            rand_f16(xh, xf, (size_t)c.M * stride, -2.0f, 2.0f);
            for (auto &v : xa) v = rng_uniform(-2.0f, 2.0f);
            rand_f16(kh, kf, cache_n, -1.0f, 1.0f);
            rand_f16(vh, vf, cache_n, -1.0f, 1.0f);
            /* distinct positions (one call never stores a position twice): a random
             * permutation's first M */
            std::vector<int32_t> perm(c.T_cap), pos(c.M);
            for (int t = 0; t < c.T_cap; ++t) perm[t] = t;
            for (int t = c.T_cap - 1; t > 0; --t) std::swap(perm[t], perm[rng_u64() % (t + 1)]);
            for (int m = 0; m < c.M; ++m) pos[m] = perm[m];
            if (c.M > 2) pos[1] = c.T_cap + 3, pos[2] = -1; /* not stored */
            uint16_t *dx = dev_upload(xh), *dk = dev_upload(kh), *dv = dev_upload(vh);
            int32_t *dp = dev_upload(pos);
            float *dinv = dev_upload(inv), *dxa = from_acc ? dev_upload(xa) : nullptr;
            CHECK_EQ_INT(k_rope_kv_store(dx, dxa, c.M, c.nq, c.nkv, c.hd, stride, dp, dinv, dk, dv,
                                         c.T_cap, nullptr), K_ERR_NONE);
            /* expected x: the input (fp16 x, or the sums) with q and k heads rotated */
            std::vector<float> want = from_acc ? xa : xf;
            ref_rope(want.data(), c.M, c.nq + c.nkv, c.hd, stride, pos.data(), inv.data());
            std::vector<float> wk = kf, wv = vf;
            kv_rows_expected(wk, wv, want, pos, c.M, c.nq, c.nkv, c.hd, stride, c.T_cap);
            const std::vector<float> gx = f16_to_f32(dev_download(dx, (size_t)c.M * stride));
            const std::vector<float> gk = f16_to_f32(dev_download(dk, cache_n));
            const std::vector<float> gv = f16_to_f32(dev_download(dv, cache_n));
            char what[96];
            snprintf(what, sizeof what, "rope_kv_store%s M=%d nq=%d nkv=%d hd=%d x",
                     from_acc ? " (acc)" : "", c.M, c.nq, c.nkv, c.hd);
            compare(what, gx.data(), want.data(), gx.size(), 2e-3, 2e-3, 2e-3);
            snprintf(what, sizeof what, "rope_kv_store%s M=%d nq=%d nkv=%d hd=%d k_cache",
                     from_acc ? " (acc)" : "", c.M, c.nq, c.nkv, c.hd);
            compare(what, gk.data(), wk.data(), gk.size(), 2e-3, 2e-3, 2e-3);
            snprintf(what, sizeof what, "rope_kv_store%s M=%d nq=%d nkv=%d hd=%d v_cache",
                     from_acc ? " (acc)" : "", c.M, c.nq, c.nkv, c.hd);
            compare(what, gv.data(), wv.data(), gv.size(), 0, 0, 0);
            if (dxa) {
                const size_t nz = dev_nonzero(dxa, xa.size());
                CHECK_MSG(nz == 0, "%s: %zu acc values not zeroed", what, nz);
                TCUDA(cudaFree(dxa));
            }
            TCUDA(cudaFree(dx)); TCUDA(cudaFree(dk)); TCUDA(cudaFree(dv)); TCUDA(cudaFree(dp));
            TCUDA(cudaFree(dinv));
        }
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_rope_kv_store(nullptr, nullptr, 1, 1, 1, 64, 192, nullptr, nullptr, nullptr,
                                 nullptr, 1, nullptr), K_ERR_ARG);
    uint16_t *d = dev_poisoned<uint16_t>(1024);
    CHECK_EQ_INT(k_rope_kv_store(d, nullptr, 1, 1, 1, 64, 128, (const int32_t *)d, (const float *)d,
                                 d, d, 1, nullptr), K_ERR_SHAPE); /* row too short for q|k|v */
    qs_log_set_quiet(false);
    TCUDA(cudaFree(d));
}

static void test_embed(void)
{
    const int V_r = 1000, H = 256, M = 37;
    const int64_t row_begin = 2000;
    std::vector<uint16_t> th;
    std::vector<float> tf, out((size_t)M * H);
    rand_f16(th, tf, (size_t)V_r * H, -1.0f, 1.0f);
    std::vector<int32_t> tok(M);
    for (auto &t : tok) t = (int32_t)(rng_u64() % 4000); /* about a quarter on this rank */
    tok[0] = (int32_t)row_begin;
    tok[1] = (int32_t)row_begin + V_r - 1;
    uint16_t *dt = dev_upload(th);
    int32_t *dtok = dev_upload(tok);
    float *dout = dev_poisoned<float>((size_t)M * H);
    for (float sc : {1.0f, sqrtf(3584.0f)}) { /* Gemma: * sqrt(hidden) */
        CHECK_EQ_INT(k_embed(dout, dt, dtok, M, row_begin, V_r, H, sc, nullptr), K_ERR_NONE);
        ref_embed(out.data(), th.data(), tok.data(), M, row_begin, V_r, H, sc);
        const std::vector<float> got = dev_download(dout, (size_t)M * H);
        CHECK_MSG(memcmp(got.data(), out.data(), got.size() * 4) == 0,
                  "embed scale %g: not bit-identical", (double)sc);
    }
    TCUDA(cudaFree(dt)); TCUDA(cudaFree(dtok)); TCUDA(cudaFree(dout));
}

static void test_argmax(void)
{
    const int M = 6, n = 32064, vocab = 32000;
    const size_t stride = n + 16;
    std::vector<float> lg((size_t)M * stride);
    for (auto &v : lg) v = rng_uniform(-10.0f, 10.0f);
    /* row 1: the padding ids hold the largest value (must not win); row 2: a tie (lowest id
     * wins); row 3: NaNs everywhere but two ids; row 4: all NaN -> -1 */
    for (int i = vocab; i < n; ++i) lg[1 * stride + i] = 100.0f;
    lg[2 * stride + 777] = 50.0f;
    lg[2 * stride + 30000] = 50.0f;
    for (int i = 0; i < n; ++i) lg[3 * stride + i] = NAN;
    lg[3 * stride + 5] = -3.0f;
    lg[3 * stride + 9] = -2.0f;
    for (int i = 0; i < n; ++i) lg[4 * stride + i] = NAN;
    float *dl = dev_upload(lg);
    int32_t *dids = dev_poisoned<int32_t>(M);
    CHECK_EQ_INT(k_argmax(dids, dl, M, n, stride, vocab, nullptr), K_ERR_NONE);
    const std::vector<int32_t> ids = dev_download(dids, M);
    for (int m = 0; m < M; ++m) {
        const int want = ref_argmax(&lg[(size_t)m * stride], n, vocab);
        CHECK_MSG(ids[m] == want, "argmax row %d: got %d want %d", m, ids[m], want);
    }
    CHECK_EQ_INT(ids[4], -1);
    TCUDA(cudaFree(dl)); TCUDA(cudaFree(dids));
}

// --- sample: k_sample vs the CPU backend's sampler (runtime/rt_sample.c) -------------------------

static float rng_gauss(void)
{ /* Box-Muller */
    const float u1 = rng_uniform(1e-7f, 1.0f), u2 = rng_uniform(0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

struct sample_ctx {
    float *dl;      /* logits [V] */
    uint8_t *dseen; /* history bitmap */
    int32_t *did;
    uint8_t *dkeep;
    int cases, ambiguous;
};

/* The reference's survivors (ascending ids) and their probabilities for logits lg [V] after the
 * history hist. */
static std::vector<int32_t> sample_ref_set(const struct rt_sample_params &p, int V,
                                           const std::vector<int32_t> &hist, const float *lg,
                                           std::vector<double> *prob)
{
    struct rt_sampler s = {};
    std::vector<int32_t> c;
    if (rt_sampler_init(&s, &p, V) != RT_SAMPLE_ERR_NONE) { CHECK(false); return c; }
    for (int32_t id : hist) rt_sampler_accept(&s, id);
    const int n = rt_sampler_candidates(&s, lg, V);
    if (n > 0) c.assign(s.cand, s.cand + n);
    if (prob && n > 0) prob->assign(s.prob, s.prob + n);
    rt_sampler_free(&s);
    return c;
}

/*
 * One row under one parameter set: the survivor mask must equal rt_sampler_candidates' set
 * (where top-p's boundary is within rounding, equal to the set at p one float ulp lower or
 * higher: "ambiguous"), and `draws` ids drawn with the reference's own PRNG stream must equal
 * rt_sampler_next's (a differing id must still hold u within 1e-9 of its CDF interval), and so
 * must the ids for u = 0 and the largest u < 1 (the reference's inverse-CDF walk over its
 * survivors). strict: no ambiguity allowed (rows whose sums are exact in binary). The row goes
 * to the device `shift` floats past a 256-byte-aligned address (1: the kernel's unaligned path).
 */
static void sample_case(sample_ctx &cx, const char *what, const std::vector<float> &lg, int V,
                        struct rt_sample_params p, int n_hist, int draws, int shift = 0,
                        bool strict = false)
{
    float *const dl = cx.dl + shift;
    cx.cases++;
    std::vector<int32_t> hist;
    for (int i = 0; i < n_hist; ++i) hist.push_back((int32_t)(rng_u64() % (uint64_t)V));
    struct rt_sampler s = {};
    if (rt_sampler_init(&s, &p, V) != RT_SAMPLE_ERR_NONE) { CHECK_MSG(false, "%s: init", what); return; }
    for (int32_t id : hist) rt_sampler_accept(&s, id);
    TCUDA(cudaMemcpy(dl, lg.data(), (size_t)V * 4, cudaMemcpyHostToDevice));
    TCUDA(cudaMemcpy(cx.dseen, s.seen, ((size_t)V + 7) / 8, cudaMemcpyHostToDevice));
    const struct k_sample_params kp = {p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty};
    std::vector<double> prob;
    const std::vector<int32_t> want = sample_ref_set(p, V, hist, lg.data(), &prob);

    TCUDA(cudaMemset(cx.dkeep, 0xAB, (size_t)V));
    CHECK_EQ_INT(k_sample(cx.did, cx.dkeep, dl, V, cx.dseen, &kp, 0.5, nullptr), K_ERR_NONE);
    const std::vector<uint8_t> keep = dev_download(cx.dkeep, (size_t)V);
    std::vector<int32_t> got;
    bool bytes_ok = true;
    for (int i = 0; i < V; ++i) {
        if (keep[i] > 1) bytes_ok = false;
        if (keep[i] == 1) got.push_back(i);
    }
    CHECK_MSG(bytes_ok, "%s V=%d: keep mask holds bytes other than 0/1", what, V);
    if (got != want) {
        bool amb = false;
        if (p.top_p < 1.0f && !strict) {
            struct rt_sample_params lo = p, hi = p;
            lo.top_p = nextafterf(p.top_p, 0.0f);
            hi.top_p = fminf(nextafterf(p.top_p, 2.0f), 1.0f);
            amb = got == sample_ref_set(lo, V, hist, lg.data(), nullptr) ||
                  got == sample_ref_set(hi, V, hist, lg.data(), nullptr);
        }
        CHECK_MSG(amb, "%s V=%d T=%g k=%d p=%g min_p=%g r=%g: %zu survivors, reference %zu",
                  what, V, (double)p.temperature, (int)p.top_k, (double)p.top_p,
                  (double)p.min_p, (double)p.repeat_penalty, got.size(), want.size());
        cx.ambiguous += amb;
    }

    const int n_prng = p.temperature > 0.0f ? draws : 1;
    for (int d = 0; d < n_prng + (p.temperature > 0.0f ? 2 : 0); ++d) {
        double u = 0.0;
        int32_t ref_id = -1;
        if (d < n_prng) {
            struct rt_sampler peek = s; /* shares the arrays; only the PRNG state is copied */
            u = p.temperature > 0.0f ? rt_sampler_uniform(&peek) : 0.0;
            if (rt_sampler_next(&s, lg.data(), V, &ref_id) != RT_SAMPLE_ERR_NONE) ref_id = -1;
        } else { /* the ends of [0, 1): rt_sampler_next's walk over the reference survivors */
            u = d == n_prng ? 0.0 : nextafter(1.0, 0.0);
            ref_id = want.empty() ? -1 : rt_sample_pick(want.data(), prob.data(), (int32_t)want.size(), u);
        }
        CHECK_EQ_INT(k_sample(cx.did, nullptr, dl, V, cx.dseen, &kp, u, nullptr), K_ERR_NONE);
        const int32_t id = dev_download(cx.did, 1)[0];
        if (id == ref_id) { CHECK(true); continue; }
        /* a differing id must hold u within rounding of its interval of the reference CDF */
        double before = 0.0;
        bool near = false;
        for (size_t j = 0; j < want.size(); ++j) {
            if (want[j] == id)
                near = before - 1e-9 <= u && u < before + prob[j] + 1e-9;
            before += prob[j];
        }
        near = near && !strict;
        CHECK_MSG(near, "%s V=%d T=%g k=%d p=%g min_p=%g r=%g u=%.17g: GPU id %d, reference %d",
                  what, V, (double)p.temperature, (int)p.top_k, (double)p.top_p,
                  (double)p.min_p, (double)p.repeat_penalty, u, id, ref_id);
        cx.ambiguous += near;
    }
    rt_sampler_free(&s);
}

static void test_sample(bool quick)
{
    const int vmax = 151936; /* Qwen2 */
    sample_ctx cx = {};
    TCUDA(cudaMalloc(&cx.dl, ((size_t)vmax + 4) * 4));
    TCUDA(cudaMalloc(&cx.dseen, (size_t)vmax / 8 + 1));
    TCUDA(cudaMalloc(&cx.did, 4));
    TCUDA(cudaMalloc(&cx.dkeep, (size_t)vmax));
    const std::vector<int> vs = quick ? std::vector<int>{2, 1000, 32000}
                                      : std::vector<int>{1, 2, 33, 1000, 32000, 128256, vmax};
    struct P { float t; int k; float p, min_p, r; };
    const P ps[] = {
        {0.0f, 0, 1.0f, 0.0f, 1.0f},     {0.0f, 0, 1.0f, 0.0f, 1.3f},
        {1.0f, 0, 1.0f, 0.0f, 1.0f},     {0.7f, 40, 1.0f, 0.0f, 1.0f},
        {0.8f, 40, 0.95f, 0.0f, 1.0f},   {1.3f, 0, 0.9f, 0.0f, 1.0f},
        {1.0f, 0, 0.5f, 0.05f, 1.0f},    {0.6f, 1, 1.0f, 0.0f, 1.0f},
        {1.0f, -1, 1.0f, 0.0f, 1.0f},    {1.0f, -2, 0.8f, 0.0f, 1.0f},
        {1.0f, 0, 1.0f, 0.1f, 1.0f},     {0.9f, 50, 0.3f, 0.02f, 1.2f},
        {1.0f, 0, 0.999f, 0.0f, 1.0f},   {2.0f, 0, 0.1f, 0.0f, 0.8f},
    }; /* k = -1: V - 1; k = -2: V + 5 (off) */
    const char *dists[] = {"gauss1", "gauss4", "ties", "nan-inf"};
    std::vector<float> lg;
    for (int V : vs)
        for (int di = 0; di < 4; ++di) {
            lg.resize((size_t)V);
            for (int i = 0; i < V; ++i) {
                const float g = rng_gauss();
                switch (di) {
                case 0: lg[i] = g; break;
                case 1: lg[i] = 4.0f * g; break;
                case 2: lg[i] = roundf(2.0f * g) * 0.5f; break; /* many equal logits */
                default: {
                    const uint64_t r = rng_u64() % 10;
                    lg[i] = r == 0 ? NAN : r == 1 ? -INFINITY : 3.0f * g;
                }
                }
            }
            for (const P &q : ps) {
                if (quick && (q.k == -1 || q.p == 0.999f)) continue;
                struct rt_sample_params p = rt_sample_params_default();
                p.temperature = q.t;
                p.top_k = q.k == -1 ? V - 1 : q.k == -2 ? V + 5 : q.k;
                if (p.top_k < 0) p.top_k = 0;
                p.top_p = q.p;
                p.min_p = q.min_p;
                p.repeat_penalty = q.r;
                sample_case(cx, dists[di], lg, V, p, V > 4 ? 24 : 1, quick ? 3 : 8);
            }
        }
    /* every logit tied (top-p keeps a prefix of the ties in id order); one finite logit;
     * nothing finite (-1, as the reference's "no candidate") */
    for (int V : {5, 1000, 32000}) {
        lg.assign((size_t)V, 1.5f);
        struct rt_sample_params p = rt_sample_params_default();
        p.temperature = 1.0f; p.top_k = 0; p.top_p = 0.37f; p.min_p = 0.0f; p.repeat_penalty = 1.0f;
        sample_case(cx, "all-tied", lg, V, p, 0, 4);
        p.top_k = V / 3 + 1; p.top_p = 0.61f;
        sample_case(cx, "all-tied-topk", lg, V, p, 0, 4);
        lg.assign((size_t)V, -INFINITY);
        lg[(size_t)V / 2] = -7.0f;
        sample_case(cx, "one-finite", lg, V, p, 0, 2);
        lg.assign((size_t)V, NAN);
        lg[1] = -INFINITY;
        sample_case(cx, "none-finite", lg, V, p, 0, 1);
        p.temperature = 0.0f;
        sample_case(cx, "none-finite-greedy", lg, V, p, 0, 1);
    }
    /* rows whose every sum is exact in binary: top-p must cut exactly where the reference does
     * (no one-ulp allowance): 2048 and 4 tied ids at p = 1/2, 3/4 */
    for (int V : {4, 2048}) {
        lg.assign((size_t)V, 0.25f);
        for (float tp : {0.5f, 0.75f}) {
            struct rt_sample_params p = rt_sample_params_default();
            p.top_p = tp;
            sample_case(cx, "dyadic-ties", lg, V, p, 0, 4, 0, true);
        }
    }
    /* +inf logits: two given as +inf, or many from x / T overflowing at T = 1e-38 */
    for (int V : {1000, 32000}) {
        lg.resize((size_t)V);
        for (int i = 0; i < V; ++i) lg[i] = 3.0f * rng_gauss();
        lg[(size_t)V / 3] = INFINITY;
        lg[(size_t)V - 2] = INFINITY;
        for (float tp : {1.0f, 0.6f, 0.4f}) {
            struct rt_sample_params p = rt_sample_params_default();
            p.top_p = tp;
            sample_case(cx, "inf", lg, V, p, 0, 6);
            p.top_k = 40;
            sample_case(cx, "inf-topk", lg, V, p, 0, 6);
        }
        lg[(size_t)V / 3] = lg[(size_t)V - 2] = 10.0f;
        struct rt_sample_params p = rt_sample_params_default();
        p.temperature = 1e-38f;
        sample_case(cx, "overflow", lg, V, p, 0, 6);
        p.top_p = 0.9f;
        sample_case(cx, "overflow-topp", lg, V, p, 0, 6);
    }
    /* the general top-k path (k > 1024 candidates) under top-p, and a row that is not 16-byte
     * aligned (one float past an aligned address) */
    for (int V : {5003, 128256}) {
        lg.resize((size_t)V);
        for (int i = 0; i < V; ++i) lg[i] = 2.0f * rng_gauss();
        struct rt_sample_params p = rt_sample_params_default();
        p.temperature = 0.9f;
        p.top_k = 1500;
        p.top_p = 0.9f;
        sample_case(cx, "general-topk-topp", lg, V, p, 8, 6);
        p.top_k = 40;
        p.repeat_penalty = 1.2f;
        sample_case(cx, "unaligned", lg, V, p, 24, 6, 1);
        p.temperature = 0.0f;
        sample_case(cx, "unaligned-greedy", lg, V, p, 24, 1, 1);
    }
    printf("sample: %d cases, %d ambiguous (within rounding of a boundary)\n", cx.cases,
           cx.ambiguous);
    CHECK_MSG(cx.ambiguous * 20 <= cx.cases, "sample: %d of %d cases ambiguous", cx.ambiguous,
              cx.cases);
    /* refusals */
    struct k_sample_params kp = {1.0f, 0, 1.0f, 0.0f, 1.0f};
    CHECK_EQ_INT(k_sample(cx.did, nullptr, cx.dl, 10, nullptr, &kp, 1.0, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_sample(cx.did, nullptr, cx.dl, 0, nullptr, &kp, 0.5, nullptr), K_ERR_SHAPE);
    kp.repeat_penalty = 1.2f;
    CHECK_EQ_INT(k_sample(cx.did, nullptr, cx.dl, 10, nullptr, &kp, 0.5, nullptr), K_ERR_ARG);
    kp.repeat_penalty = 1.0f;
    kp.top_p = 0.0f;
    CHECK_EQ_INT(k_sample(cx.did, nullptr, cx.dl, 10, nullptr, &kp, 0.5, nullptr), K_ERR_ARG);
    TCUDA(cudaFree(cx.dl)); TCUDA(cudaFree(cx.dseen)); TCUDA(cudaFree(cx.did));
    TCUDA(cudaFree(cx.dkeep));
    test_sample_rows();
}

// --- attention ------------------------------------------------------------------------------------

/* dev_pos: through k_kv_store_at / k_attention_at, the start position in device memory (the
 * CUDA-graph decode path), which must give the same results. Attention runs without a
 * workspace (one block per row and head) and with one (keys split across blocks where the
 * decode kernel runs), each against the reference; the split run twice, bit for bit the same
 * (merged in split order; the counters it leaves are ready for the next call). */
static void test_attention_case(int M, int start_pos, int nh, int nkv, int hd, int T_cap, int sw,
                                bool dev_pos = false, int qpad = 0)
{
    const int T = start_pos + M;
    const size_t qstride = (size_t)(nh + 2 * nkv) * hd + qpad; /* a fused qkv row (+ padding) */
    std::vector<uint16_t> qkvh, kch, vch;
    std::vector<float> qkvf, kcf, vcf;
    rand_f16(qkvh, qkvf, (size_t)M * qstride, -2.0f, 2.0f);
    rand_f16(kch, kcf, (size_t)nkv * T_cap * hd, -2.0f, 2.0f); /* past positions */
    rand_f16(vch, vcf, (size_t)nkv * T_cap * hd, -2.0f, 2.0f);
    uint16_t *dqkv = dev_upload(qkvh), *dkc = dev_upload(kch), *dvc = dev_upload(vch);
    uint16_t *dout = dev_poisoned<uint16_t>((size_t)M * nh * hd);
    /* new rows go through k_kv_store, the reference cache is written by hand */
    int32_t *dpos = dev_upload(std::vector<int32_t>{start_pos});
    if (dev_pos)
        CHECK_EQ_INT(k_kv_store_at(dkc, dvc, dqkv + (size_t)nh * hd, dqkv + (size_t)(nh + nkv) * hd,
                                   qstride, M, dpos, nkv, hd, T_cap, nullptr), K_ERR_NONE);
    else
        CHECK_EQ_INT(k_kv_store(dkc, dvc, dqkv + (size_t)nh * hd, dqkv + (size_t)(nh + nkv) * hd,
                                qstride, M, start_pos, nkv, hd, T_cap, nullptr), K_ERR_NONE);
    for (int m = 0; m < M; ++m)
        for (int h = 0; h < nkv; ++h)
            for (int d = 0; d < hd; ++d) {
                const size_t dst = ((size_t)h * T_cap + start_pos + m) * hd + d;
                kcf[dst] = qkvf[(size_t)m * qstride + (size_t)(nh + h) * hd + d];
                vcf[dst] = qkvf[(size_t)m * qstride + (size_t)(nh + nkv + h) * hd + d];
            }
    std::vector<float> out((size_t)M * nh * hd);
    CHECK_EQ_INT(ref_attention(out.data(), (size_t)nh * hd, qkvf.data(), qstride, kcf.data(),
                               vcf.data(), M, start_pos, nh, nkv, hd, T_cap, sw, g_pool),
                 REF_ERR_NONE);
    const size_t ws_bytes = k_attention_workspace_bytes(M, nh, hd, T_cap);
    void *dws = nullptr;
    if (ws_bytes) {
        TCUDA(cudaMalloc(&dws, ws_bytes));
        TCUDA(cudaMemset(dws, 0, ws_bytes));
    }
    std::vector<uint16_t> first;
    /* no workspace, split, split again; dev_pos: then the host position on the same workspace
     * (splits sized for the row, not the cache) and the device position again, bit for bit */
    for (int run = 0; run < (dev_pos ? 5 : 3); ++run) {
        void *w = run ? dws : nullptr;
        const size_t wb = run ? ws_bytes : 0;
        TCUDA(cudaMemset(dout, 0xFF, (size_t)M * nh * hd * sizeof(uint16_t)));
        if (dev_pos && run != 3)
            CHECK_EQ_INT(k_attention_at(dout, (size_t)nh * hd, dqkv, qstride, dkc, dvc, M, dpos,
                                        nh, nkv, hd, T_cap, sw, w, wb, nullptr), K_ERR_NONE);
        else
            CHECK_EQ_INT(k_attention(dout, (size_t)nh * hd, dqkv, qstride, dkc, dvc, M, start_pos,
                                     nh, nkv, hd, T_cap, sw, w, wb, nullptr), K_ERR_NONE);
        const std::vector<uint16_t> raw = dev_download(dout, out.size());
        const std::vector<float> got = f16_to_f32(raw);
        char what[160];
        snprintf(what, sizeof what, "attention%s M=%d start=%d heads=%d kv=%d hd=%d T=%d sw=%d%s",
                 dev_pos ? "_at" : "", M, start_pos, nh, nkv, hd, T, sw,
                 run ? " split-KV workspace" : "");
        if (run < 2 || run == 3)
            compare(what, got.data(), out.data(), got.size(), 3e-3, 3e-3, 3e-3);
        if (run == 1) first = raw;
        if (run == 1 && T >= 1024 && M <= 8) {
            /* a decode over >= 1024 keys splits: its partials are left in the workspace (the
             * counters come back to zero), so an all-zero workspace means it did not split */
            const std::vector<uint8_t> wsh =
                ws_bytes ? dev_download(static_cast<uint8_t *>(dws), ws_bytes) : std::vector<uint8_t>();
            size_t nz = 0;
            for (uint8_t b : wsh) nz += b != 0;
            CHECK_MSG(ws_bytes > 0 && nz > 0, "%s: the workspace is untouched (no split)", what);
        }
        if (run == 2 || run == 4) CHECK_MSG(raw == first, "%s: run %d differs", what, run);
    }
    if (dws) TCUDA(cudaFree(dws));
    /* the cache rows written by k_kv_store, bit for bit */
    const std::vector<uint16_t> kc2 = dev_download(dkc, kch.size());
    size_t bad = 0;
    for (size_t i = 0; i < kc2.size(); ++i) bad += ref_f16_to_f32(kc2[i]) != kcf[i];
    CHECK_MSG(bad == 0, "kv_store: %zu cache values differ", bad);
    TCUDA(cudaFree(dqkv)); TCUDA(cudaFree(dkc)); TCUDA(cudaFree(dvc)); TCUDA(cudaFree(dout));
    TCUDA(cudaFree(dpos));
}

/* A device start position past the cache (the host cannot check it for the _at launchers):
 * kv rows outside are dropped, attention clamps its query position, and nothing is written
 * out of bounds (the cache, including a guard row after it, keeps its poison; memcheck runs
 * this too). */
static void test_attention_at_bounds(void)
{
    const int nh = 2, nkv = 2, hd = 64, T_cap = 8, M = 1;
    const size_t qstride = (size_t)(nh + 2 * nkv) * hd, cache = (size_t)nkv * T_cap * hd;
    std::vector<uint16_t> qkvh;
    std::vector<float> qkvf;
    rand_f16(qkvh, qkvf, (size_t)M * qstride, -2.0f, 2.0f);
    uint16_t *dqkv = dev_upload(qkvh);
    uint16_t *dkc = dev_poisoned<uint16_t>(cache + hd), *dvc = dev_poisoned<uint16_t>(cache + hd);
    uint16_t *dout = dev_poisoned<uint16_t>((size_t)nh * hd);
    int32_t *dpos = dev_upload(std::vector<int32_t>{T_cap + 3});
    CHECK_EQ_INT(k_kv_store_at(dkc, dvc, dqkv + (size_t)nh * hd, dqkv + (size_t)(nh + nkv) * hd,
                               qstride, M, dpos, nkv, hd, T_cap, nullptr), K_ERR_NONE);
    CHECK_EQ_INT(k_attention_at(dout, (size_t)nh * hd, dqkv, qstride, dkc, dvc, M, dpos, nh, nkv,
                                hd, T_cap, 0, nullptr, 0, nullptr), K_ERR_NONE);
    TCUDA(cudaDeviceSynchronize());
    for (uint16_t *c : {dkc, dvc}) {
        const std::vector<uint16_t> kc = dev_download(c, cache + hd);
        size_t changed = 0;
        for (uint16_t v : kc) changed += v != 0xFFFFu; /* dev_poisoned: 0xFF bytes */
        CHECK_MSG(changed == 0, "kv_store_at at position %d of %d changed %zu cache values",
                  T_cap + 3, T_cap, changed);
    }
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_attention_at(dout, (size_t)nh * hd, dqkv, qstride, dkc, dvc, M, nullptr, nh,
                                nkv, hd, T_cap, 0, nullptr, 0, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_kv_store_at(dkc, dvc, dqkv, dqkv, qstride, T_cap + 1, dpos, nkv, hd, T_cap,
                               nullptr), K_ERR_SHAPE);
    qs_log_set_quiet(false);
    TCUDA(cudaFree(dqkv)); TCUDA(cudaFree(dkc)); TCUDA(cudaFree(dvc)); TCUDA(cudaFree(dout));
    TCUDA(cudaFree(dpos));
}

static void test_attention(bool quick)
{
    /* the start position read on the device (k_kv_store_at, k_attention_at: the decode graph) */
    test_attention_case(1, 37, 8, 2, 128, 64, 0, true);
    test_attention_case(9, 30, 4, 2, 128, 64, 16, true);
    test_attention_case(1, 0, 4, 4, 64, 8, 0, true);
    test_attention_at_bounds();
    test_attention_case(1, 0, 4, 4, 128, 8, 0);       /* first decode step */
    test_attention_case(1, 37, 8, 2, 128, 64, 0);     /* decode, GQA 4:1 */
    test_attention_case(33, 0, 4, 1, 64, 40, 0);      /* prefill, MQA */
    test_attention_case(17, 20, 6, 3, 128, 40, 0);    /* chunked prefill after a prefix */
    test_attention_case(9, 30, 4, 2, 128, 64, 16);    /* sliding window */
    test_attention_case(3, 5, 2, 2, 256, 16, 0);      /* hd 256 */
    test_attention_case(1, 0, 4, 4, 96, 8, 0);        /* hd 96 (Phi-3-mini): v1 everywhere */
    test_attention_case(1, 900, 8, 2, 96, 1024, 0);   /* hd 96 split-KV decode */
    test_attention_case(33, 7, 4, 4, 96, 64, 12);     /* hd 96 prompt rows, window */
    /* M >= 16 with hd 64 / 128 runs the tensor-core prefill (v2): partial 64-row tiles, a start
     * inside a key tile, windows narrower and wider than a tile, GQA 4:1, hd 256 on v1 */
    test_attention_case(16, 0, 2, 1, 128, 16, 0);
    test_attention_case(70, 10, 8, 2, 128, 100, 24);
    test_attention_case(130, 77, 4, 4, 64, 300, 100);
    test_attention_case(20, 3, 2, 2, 256, 32, 0);
    test_attention_case(20, 3, 4, 2, 64, 32, 0, false, 4); /* q rows not 16-byte aligned: v1 */
    if (!quick) {
        test_attention_case(255, 0, 32, 8, 128, 300, 0); /* Llama-3-8B heads, prefill */
        test_attention_case(512, 1536, 32, 8, 128, 2048, 0); /* the 4th 512-row chunk of 2048 */
        test_attention_case(200, 900, 8, 8, 64, 1200, 4096); /* window wider than the context */
        test_attention_case(1, 4000, 32, 32, 128, 4096, 0); /* long decode */
    }
    /* split-KV decode: 64 splits (few heads, long cache), a window, several rows of different
     * key counts, hd 64 / 256, GQA, the device position (grid sized for the whole cache) */
    test_attention_case(1, 8000, 2, 2, 128, 8192, 0);
    test_attention_case(1, 3000, 8, 2, 128, 4096, 1000);
    test_attention_case(5, 2000, 4, 1, 128, 2100, 0);
    test_attention_case(1, 700, 8, 2, 64, 1024, 0);
    test_attention_case(1, 1500, 4, 1, 256, 2048, 0);
    test_attention_case(1, 3000, 8, 2, 128, 4096, 0, true);
    test_attention_case(1, 100, 8, 2, 128, 4096, 0, true); /* one chunk of a split grid */
    test_attention_case(3, 1300, 4, 4, 128, 2048, 300, true);
    /* GQA ratios 3, 5, 7, 8, 12, 11 (q head h reads kv head h / ratio), with and without splits;
     * rows of one launch on both sides of the first split (127..130 keys) */
    test_attention_case(1, 2500, 6, 2, 128, 4096, 0);
    test_attention_case(4, 40, 10, 2, 256, 64, 0);
    test_attention_case(1, 1800, 14, 2, 128, 2048, 0, true);
    test_attention_case(2, 3000, 16, 2, 64, 4096, 0);
    test_attention_case(1, 1000, 24, 2, 128, 1100, 500);
    test_attention_case(1, 900, 11, 1, 128, 1024, 0);
    test_attention_case(7, 20, 14, 2, 64, 32, 0, true);
    test_attention_case(4, 126, 4, 1, 128, 4096, 0, true);
    test_attention_case(24, 1000, 8, 2, 256, 2048, 0); /* hd 256 rows >= 16 (v1), split */
    test_attention_paged(quick);
    qs_log_set_quiet(true);
    uint16_t *d = dev_poisoned<uint16_t>(1024);
    CHECK_EQ_INT(k_attention(d, 80, d, 80, d, d, 1, 0, 1, 1, 80, 4, 0, nullptr, 0, nullptr),
                 K_ERR_SHAPE);
    CHECK_EQ_INT(k_attention(d, 384, d, 384, d, d, 1, 0, 3, 2, 128, 4, 0, nullptr, 0, nullptr),
                 K_ERR_SHAPE);
    CHECK_EQ_INT(k_attention(d, 128, d, 128, d, d, 2, 3, 1, 1, 128, 4, 0, nullptr, 0, nullptr),
                 K_ERR_SHAPE);
    /* a workspace smaller than the split needs: refused, nothing launched */
    CHECK_MSG(k_attention_workspace_bytes(1, 2, 128, 4096) > 0, "no split-KV workspace for a "
              "long decode");
    CHECK_EQ_INT(k_attention(d, 256, d, 768, d, d, 1, 4000, 2, 2, 128, 4096, 0, d, 64, nullptr),
                 K_ERR_WORKSPACE);
    CHECK_EQ_INT(k_attention(d, 256, d, 768, d, d, 1, 4000, 2, 2, 128, 4096, 0,
                             reinterpret_cast<uint8_t *>(d) + 4, 1 << 20, nullptr),
                 K_ERR_ARG); /* misaligned */
    CHECK_EQ_INT(k_kv_store(d, d, d, d, 128, 2, 3, 1, 128, 4, nullptr), K_ERR_SHAPE);
    qs_log_set_quiet(false);
    TCUDA(cudaFree(d));
}


// --- moe helpers ----------------------------------------------------------------------------------

static void test_moe(void)
{
    const int M = 7, K = 4096, E = 8, width = 4096, n = 9;
    std::vector<uint16_t> xh;
    std::vector<float> xf, W((size_t)E * K), yref((size_t)M * E);
    rand_f16(xh, xf, (size_t)M * K, -1.0f, 1.0f);
    for (auto &w : W) w = rng_uniform(-0.05f, 0.05f);
    uint16_t *dx = dev_upload(xh);
    float *dW = dev_upload(W), *dy = dev_poisoned<float>((size_t)M * E);
    CHECK_EQ_INT(k_router(dy, dx, dW, M, K, E, nullptr), K_ERR_NONE);
    ref_linear_f32(xf.data(), W.data(), nullptr, M, K, E, yref.data());
    const std::vector<float> y = dev_download(dy, (size_t)M * E);
    compare("router", y.data(), yref.data(), y.size(), 1e-5, 1e-5, 1e-5);

    /* gather then weighted scatter-add with a repeated row (two experts of one token) */
    std::vector<uint16_t> src_h, yh;
    std::vector<float> src_f, yf;
    rand_f16(src_h, src_f, (size_t)M * width, -1.0f, 1.0f);
    rand_f16(yh, yf, (size_t)M * width, -1.0f, 1.0f);
    std::vector<int32_t> rows = {3, 0, 6, 3, 1, 5, 2, 4, 0};
    std::vector<float> wts(n);
    for (auto &w : wts) w = rng_uniform(0.1f, 0.9f);
    uint16_t *dsrc = dev_upload(src_h), *dyy = dev_upload(yh);
    uint16_t *dg = dev_poisoned<uint16_t>((size_t)n * width);
    int32_t *drows = dev_upload(rows);
    float *dw = dev_upload(wts);
    CHECK_EQ_INT(k_gather_rows(dg, dsrc, drows, n, width, nullptr), K_ERR_NONE);
    const std::vector<uint16_t> g = dev_download(dg, (size_t)n * width);
    size_t bad = 0;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < width; ++j) bad += g[(size_t)i * width + j] != src_h[(size_t)rows[i] * width + j];
    CHECK_MSG(bad == 0, "gather_rows: %zu values differ", bad);
    CHECK_EQ_INT(k_scatter_add_rows(dyy, dg, drows, dw, n, width, nullptr), K_ERR_NONE);
    std::vector<float> want(yf);
    for (int i = 0; i < n; ++i) /* fp16 storage after each add, like the CPU fp16 emulation */
        for (int j = 0; j < width; ++j) {
            float &v = want[(size_t)rows[i] * width + j];
            v = ref_f16_to_f32(ref_f32_to_f16(v + wts[i] * src_f[(size_t)rows[i] * width + j]));
        }
    const std::vector<float> got = f16_to_f32(dev_download(dyy, (size_t)M * width));
    compare("scatter_add_rows", got.data(), want.data(), got.size(), 1e-3, 1e-3, 1e-3);
    TCUDA(cudaFree(dx)); TCUDA(cudaFree(dW)); TCUDA(cudaFree(dy)); TCUDA(cudaFree(dsrc));
    TCUDA(cudaFree(dyy)); TCUDA(cudaFree(dg)); TCUDA(cudaFree(drows)); TCUDA(cudaFree(dw));
}

/* k_gather_cols (act-order input, DESIGN 4.5) vs ref_gather_cols on a fresh random permutation,
 * bit for bit (a pure copy), at the shapes of a 7B's act-order linears (K 4096 and 11008) and
 * an odd small one; refusals. */
static void test_gather_cols(void)
{
    const int shapes[][2] = {{1, 4096}, {7, 11008}, {33, 96}};
    for (const auto &sh : shapes) {
        const int M = sh[0], K = sh[1];
        std::vector<uint16_t> xh;
        std::vector<float> xf, want((size_t)M * K);
        rand_f16(xh, xf, (size_t)M * K, -1.0f, 1.0f);
        std::vector<int32_t> perm(K);
        for (int j = 0; j < K; ++j) perm[j] = j;
        for (int j = K - 1; j > 0; --j) { /* Fisher-Yates with the test RNG */
            int r = (int)(rng_uniform(0.0f, 1.0f) * (float)(j + 1));
            if (r > j) r = j;
            std::swap(perm[j], perm[r]);
        }
        ref_gather_cols(want.data(), xf.data(), perm.data(), M, K);
        uint16_t *dx = dev_upload(xh), *dy = dev_poisoned<uint16_t>((size_t)M * K);
        int32_t *dp = dev_upload(perm);
        CHECK_EQ_INT(k_gather_cols(dy, dx, dp, M, K, nullptr), K_ERR_NONE);
        const std::vector<float> got = f16_to_f32(dev_download(dy, (size_t)M * K));
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) bad += memcmp(&got[i], &want[i], 4) != 0;
        CHECK_MSG(bad == 0, "gather_cols M=%d K=%d: %zu values differ", M, K, bad);
        CHECK_EQ_INT(k_gather_cols(dy, dx, dp, 0, K, nullptr), K_ERR_SHAPE);
        CHECK_EQ_INT(k_gather_cols(dy, dx, nullptr, M, K, nullptr), K_ERR_ARG);
        TCUDA(cudaFree(dx)); TCUDA(cudaFree(dy)); TCUDA(cudaFree(dp));
    }
}

// --- all-reduce across GPUs ------------------------------------------------------------------------

/* Between all-reduce rounds, on rank `rank`'s GPU: optionally hold the GPU for ~spin_ns (so the
 * ranks reach the next round at different times, as the two-slot scheme must survive), then
 * x = x * scale + (rank + 1) / 4 (scale a power of two: exact, so the host repeats it bit for
 * bit; the rank-dependent term keeps the ranks' inputs different every round). */
static __global__ void ar_between_kernel(void *buf, size_t n, int f16, float scale, int rank,
                                         unsigned long long spin_ns)
{
    if (spin_ns && threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < spin_ns);
    }
    const float c = 0.25f * (float)(rank + 1);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (f16) {
            __half *h = static_cast<__half *>(buf);
            h[i] = __float2half_rn(__fmul_rn(__half2float(h[i]), scale) + c);
        } else {
            float *f = static_cast<float *>(buf);
            f[i] = __fadd_rn(__fmul_rn(f[i], scale), c);
        }
    }
}

/*
 * k_allreduce_sum over every GPU with peer access to the others (2..8; with one GPU the area
 * runs only the refusals) vs ref_allreduce_sum, bit for bit on every rank: fp32 and fp16, 16
 * bytes to the 256 KB limit; R rounds in a row without host synchronisation, each followed by a
 * rank-dependent step (ar_between_kernel) on every rank and, on one rank in turn, a ~50 us hold,
 * so the ranks' inputs differ in every round and the ranks reach the rounds out of step (the
 * two receive slots and the epochs); the same rounds recorded into one CUDA graph per GPU and
 * replayed 4 times; refusals.
 */
static void test_allreduce(bool quick)
{
    int n_dev = 0;
    TCUDA(cudaGetDeviceCount(&n_dev));
    qs_log_set_quiet(true);
    const int one[1] = {0};
    struct k_allreduce *bad = nullptr;
    CHECK_EQ_INT(k_allreduce_create(1, one, &bad), K_ERR_SHAPE);
    CHECK(bad == nullptr);
    qs_log_set_quiet(false);
    int devs[K_ALLREDUCE_MAX_WORLD], W = 0;
    for (int d = 0; d < n_dev && W < K_ALLREDUCE_MAX_WORLD; ++d) {
        devs[W] = d;
        if (k_allreduce_supported(W + 1, devs) || W == 0) ++W;
    }
    if (W < 2) {
        printf("allreduce: fewer than 2 GPUs with peer access: only the refusals ran\n");
        return;
    }
    printf("allreduce: %d GPUs\n", W);
    struct k_allreduce *ar = nullptr;
    CHECK_EQ_INT(k_allreduce_create(W, devs, &ar), K_ERR_NONE);
    if (!ar) return;
    cudaStream_t st[K_ALLREDUCE_MAX_WORLD];
    for (int r = 0; r < W; ++r) {
        TCUDA(cudaSetDevice(devs[r]));
        TCUDA(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    }
    /* refusals: not a multiple of 16 bytes, too large, misaligned, rank out of range */
    qs_log_set_quiet(true);
    TCUDA(cudaSetDevice(devs[0]));
    void *d0 = nullptr;
    TCUDA(cudaMalloc(&d0, K_ALLREDUCE_MAX_BYTES + 16));
    CHECK_EQ_INT(k_allreduce_sum(ar, 0, d0, 3, 0, st[0]), K_ERR_SHAPE);
    CHECK_EQ_INT(k_allreduce_sum(ar, 0, d0, K_ALLREDUCE_MAX_BYTES / 4 + 4, 0, st[0]), K_ERR_SHAPE);
    CHECK_EQ_INT(k_allreduce_sum(ar, 0, static_cast<char *>(d0) + 4, 4, 0, st[0]), K_ERR_SHAPE);
    CHECK_EQ_INT(k_allreduce_sum(ar, W, d0, 4, 0, st[0]), K_ERR_ARG);
    CHECK_EQ_INT(k_allreduce_sum(nullptr, 0, d0, 4, 0, st[0]), K_ERR_ARG);
    TCUDA(cudaFree(d0));
    qs_log_set_quiet(false);

    float scale = 1.0f; /* 2^-ceil(log2 W): the sums stay bounded round after round */
    while (scale * (float)W > 1.0f) scale *= 0.5f;
    const size_t sizes[] = {4, 8, 1000, 4096, 8192, 14336, K_ALLREDUCE_MAX_BYTES / 4, K_ALLREDUCE_MAX_BYTES / 2};
    for (int f16 = 0; f16 <= 1; ++f16)
        for (size_t n : sizes) {
            const size_t es = f16 ? 2 : 4;
            if (n * es > K_ALLREDUCE_MAX_BYTES || (n * es) % 16) continue;
            for (int graph = 0; graph <= 1; ++graph) {
                if (quick && graph && n > 8192) continue;
                const int R = 3, replays = graph ? 4 : 1;
                /* inputs: fp16-representable values in [-1, 1) (exact in both types) */
                std::vector<std::vector<float>> cur(W);
                void *d[K_ALLREDUCE_MAX_WORLD];
                for (int r = 0; r < W; ++r) {
                    std::vector<uint16_t> h16;
                    rand_f16(h16, cur[r], n, -1.0f, 1.0f);
                    TCUDA(cudaSetDevice(devs[r]));
                    TCUDA(cudaMalloc(&d[r], n * es));
                    if (f16) TCUDA(cudaMemcpy(d[r], h16.data(), n * 2, cudaMemcpyHostToDevice));
                    else TCUDA(cudaMemcpy(d[r], cur[r].data(), n * 4, cudaMemcpyHostToDevice));
                }
                auto rounds = [&]() { /* enqueue R rounds on every rank, no host wait */
                    for (int k = 0; k < R; ++k) {
                        for (int r = 0; r < W; ++r) {
                            TCUDA(cudaSetDevice(devs[r]));
                            CHECK_EQ_INT(k_allreduce_sum(ar, r, d[r], n, f16, st[r]), K_ERR_NONE);
                        }
                        for (int r = 0; r < W; ++r) {
                            TCUDA(cudaSetDevice(devs[r]));
                            ar_between_kernel<<<8, 256, 0, st[r]>>>(d[r], n, f16, scale, r,
                                                                     r == k % W ? 50000ull : 0ull);
                            TCUDA(cudaGetLastError());
                        }
                    }
                };
                cudaGraphExec_t ge[K_ALLREDUCE_MAX_WORLD] = {};
                if (graph) {
                    for (int r = 0; r < W; ++r) {
                        TCUDA(cudaSetDevice(devs[r]));
                        TCUDA(cudaStreamBeginCapture(st[r], cudaStreamCaptureModeThreadLocal));
                    }
                    rounds();
                    /* every capture ends before any instantiation (not permitted while one of
                     * this thread's streams is capturing) */
                    cudaGraph_t g[K_ALLREDUCE_MAX_WORLD] = {};
                    for (int r = 0; r < W; ++r) {
                        TCUDA(cudaSetDevice(devs[r]));
                        TCUDA(cudaStreamEndCapture(st[r], &g[r]));
                    }
                    for (int r = 0; r < W; ++r) {
                        TCUDA(cudaSetDevice(devs[r]));
                        TCUDA(cudaGraphInstantiate(&ge[r], g[r], 0));
                        TCUDA(cudaGraphDestroy(g[r]));
                    }
                }
                for (int rep = 0; rep < replays; ++rep) {
                    if (!graph) {
                        rounds();
                        continue;
                    }
                    for (int r = 0; r < W; ++r) {
                        TCUDA(cudaSetDevice(devs[r]));
                        TCUDA(cudaGraphLaunch(ge[r], st[r]));
                    }
                }
                /* the reference: the same R * replays rounds on the host */
                std::vector<float> sum(n);
                std::vector<const float *> b(W);
                for (int k = 0; k < R * replays; ++k) {
                    for (int r = 0; r < W; ++r) b[r] = cur[r].data();
                    ref_allreduce_sum(sum.data(), b.data(), W, n);
                    for (int r = 0; r < W; ++r)
                        for (size_t i = 0; i < n; ++i) {
                            const float s_r = f16 ? ref_f16_to_f32(ref_f32_to_f16(sum[i])) : sum[i];
                            const float v = s_r * scale + 0.25f * (float)(r + 1);
                            cur[r][i] = f16 ? ref_f16_to_f32(ref_f32_to_f16(v)) : v;
                        }
                }
                for (int r = 0; r < W; ++r) {
                    TCUDA(cudaSetDevice(devs[r]));
                    TCUDA(cudaStreamSynchronize(st[r]));
                    std::vector<float> got(n);
                    if (f16) got = f16_to_f32(dev_download(static_cast<uint16_t *>(d[r]), n));
                    else got = dev_download(static_cast<float *>(d[r]), n);
                    size_t diff = 0, first = 0;
                    for (size_t i = 0; i < n; ++i)
                        if (memcmp(&got[i], &cur[r][i], 4) != 0 && diff++ == 0) first = i;
                    CHECK_MSG(diff == 0, "allreduce %d GPUs %s n=%zu %s rank %d: %zu of %zu differ from ref_allreduce_sum, first [%zu] %.9g want %.9g",
                              W, f16 ? "fp16" : "fp32", n, graph ? "graph x4" : "3 rounds", r, diff, n, first,
                              diff ? got[first] : 0.0, diff ? cur[r][first] : 0.0);
                    if (ge[r]) TCUDA(cudaGraphExecDestroy(ge[r]));
                    TCUDA(cudaFree(d[r]));
                }
            }
        }
    for (int r = 0; r < W; ++r) {
        TCUDA(cudaSetDevice(devs[r]));
        TCUDA(cudaStreamDestroy(st[r]));
    }
    k_allreduce_destroy(ar);
    TCUDA(cudaSetDevice(0));
}

// --- main -----------------------------------------------------------------------------------------

int main(int argc, char **argv)
{
    static const gpu_area areas[] = {
        {"rmsnorm", [](bool) { test_rmsnorm(); }},
        {"head_rmsnorm", [](bool) { test_head_rmsnorm(); }},
        {"silu_mul", [](bool) { test_silu_mul(); }},
        {"layernorm", [](bool) { test_layernorm(); }},
        {"gelu", [](bool) { test_gelu(); }},
        {"softcap", [](bool) { test_gelu_tanh_softcap(); }},
        {"rope", [](bool) { test_rope(); }},
        {"rope_kv_store", [](bool) { test_rope_kv_store(); }},
        {"embed", [](bool) { test_embed(); }},
        {"argmax", [](bool) { test_argmax(); }},
        {"sample", test_sample},
        {"attention", test_attention},
        {"moe", [](bool) { test_moe(); }},
        {"gather_cols", [](bool) { test_gather_cols(); }},
        {"allreduce", test_allreduce},
    };
    return gpu_test_main(argc, argv, "gpu_test_ops", "", areas, (int)(sizeof(areas) / sizeof(areas[0])));
}

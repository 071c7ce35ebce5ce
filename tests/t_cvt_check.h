/*
 * t_cvt_check.h - the converter tests' checker of one converted model against its source
 * checkpoint (tests/test_cvt.c, test_cvt_built.c): every tensor of every rank, with the split
 * rules of docs/DESIGN.md sections 4-5 restated here (not taken from the converter). Packed
 * linears are unpacked with ref_dequant_w4 and compared bit for bit with cvt_awq_dequant_source
 * (AWQ's own nibble orders) of the source slice computed here for that rank (column / row /
 * kv-replication / intermediate-padding / vocab-padding rules); padding must be exactly +0.0;
 * float tensors must equal the source converted to F16 / F32; every tensor of the rank must be
 * accounted for. ck_twins: two conversions of twin checkpoints (same weights, other variant,
 * container or config spelling) hold the same tensors, generation config, tokenizer and config
 * but for quant.source_variant / quant.source_container. Test-only.
 */
#ifndef QS_T_CVT_CHECK_H
#define QS_T_CVT_CHECK_H

#include "cvt_src.h"
#include "fmt.h"
#include "ref.h"
#include "t_cvt.h"

struct model_ck {
    const char *name;
    struct cvt_source *src;
    const struct cvt_hf_config *cfg;
    long H, I, V, nq, nkv, hd, G, L, E;
    int tp;
    /* per-tp derived numbers (DESIGN 5, restated) */
    long nq_r, nkv_r, rep, I_r, I_pad, V_r;
    int n_checked;              /* tensors checked on the current rank */
    int n_local;                /* packed linears seen with a local group size below G */
    int max_tp;                 /* INDEX.json "max_tp" (act-order fixtures: 1), 0 = none */
};

/* Largest common divisor of a and b, by counting down (not the converter's gcd). */
static inline long gcd_slow(long a, long b)
{
    long g = a < b ? a : b;
    while (a % g || b % g)
        g--;
    return g;
}

/* Can tp split this model (DESIGN 4 + 5, assuming every decoder linear is quantized)? The
 * row-parallel o_proj's local group size gcd(G, K_r) must be a multiple of 16. */
static inline bool tp_possible(const struct model_ck *m, int tp)
{
    if (m->max_tp > 0 && tp > m->max_tp) /* act-order row-parallel linears: tp 1 only */
        return false;
    if (m->nq % tp)
        return false;
    if (tp <= m->nkv ? m->nkv % tp : tp % m->nkv)
        return false;
    long nq_r = m->nq / tp, nkv_r = tp <= m->nkv ? m->nkv / tp : 1;
    long o_K = nq_r * m->hd, qkv_N = (nq_r + 2 * nkv_r) * m->hd;
    long G_o = m->G > 0 ? m->G : m->nq * m->hd; /* per-channel: G = K */
    return gcd_slow(G_o, o_K) % 16 == 0 && o_K % 16 == 0 && qkv_N % 64 == 0 && m->H % 64 == 0;
}

static inline void ck_setup_tp(struct model_ck *m, int tp)
{
    m->tp = tp;
    m->nq_r = m->nq / tp;
    m->nkv_r = tp <= m->nkv ? m->nkv / tp : 1;
    m->rep = tp <= m->nkv ? 1 : tp / m->nkv;
    long U = m->G > 0 ? lcm_slow(m->G, 64) : 64;
    m->I_pad = round_up_slow(m->I, U * tp);
    m->I_r = m->I_pad / tp;
    m->V_r = round_up_slow(m->V, tp) / tp;
}

static inline const struct fmt_tensor *find(const struct fmt_shard *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline const struct fmt_tensor *find(const struct fmt_shard *s, const char *fmt, ...)
{
    char nm[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nm, sizeof(nm), fmt, ap);
    va_end(ap);
    const struct fmt_tensor *t = fmt_shard_find(s, nm);
    CHECK_MSG(t != NULL, "tensor %s missing", nm);
    return t;
}

/* Dequantize packed linear `prefix` of a shard (its source has K_src input rows): returns [K][N]
 * fp32 (malloc'ed) or NULL. Its scales / qzeros must have K / G_r rows, G_r = gcd(G, K) (DESIGN 4
 * local group size; = G unless a row split leaves part of a group on a rank; per-channel
 * G = K_src). */
static inline float *deq_rank(struct model_ck *m, const struct fmt_shard *s, const char *prefix,
                       long K_src, long *K_out, long *N_out)
{
    const struct fmt_tensor *q = find(s, "%s.qweight", prefix);
    const struct fmt_tensor *sc = find(s, "%s.scales", prefix);
    const struct fmt_tensor *z = find(s, "%s.qzeros", prefix);
    if (!q || !sc || !z)
        return NULL;
    m->n_checked += 3;
    long K = (long)q->shape[0], N = (long)q->shape[1];
    CHECK(q->layout == FMT_LAYOUT_W4_MMA_T16X64 && sc->layout == FMT_LAYOUT_S_T64 &&
          z->layout == FMT_LAYOUT_Z4_T64);
    long G_src = m->G > 0 ? m->G : K_src, G_r = gcd_slow(G_src, K);
    CHECK_MSG(sc->shape[0] == (uint64_t)(K / G_r) && sc->shape[1] == (uint64_t)N &&
              z->shape[0] == sc->shape[0] && z->shape[1] == sc->shape[1],
              "%s: scales [%llu, %llu], want [%ld, %ld]", prefix,
              (unsigned long long)sc->shape[0], (unsigned long long)sc->shape[1], K / G_r, N);
    m->n_local += G_r < G_src;
    float *w = malloc((size_t)(K * N) * sizeof(float));
    if (!w || ref_dequant_w4(q->data, z->data, sc->data, (int)K, (int)N, (int)G_r, w)) {
        CHECK_MSG(0, "%s: ref_dequant_w4 failed", prefix);
        free(w);
        return NULL;
    }
    *K_out = K;
    *N_out = N;
    return w;
}

/* Full-source dequantization of linear `prefix` [K][N] (AWQ's own orders). */
static inline float *deq_src(struct model_ck *m, const char *prefix, long K, long N)
{
    float *w = malloc((size_t)(K * N) * sizeof(float));
    if (!w)
        return NULL;
    enum cvt_err e = cvt_awq_dequant_source(m->src, m->cfg, prefix, K, N, 0, K, 0, N, w);
    CHECK_MSG(e == CVT_ERR_NONE, "%s: cvt_awq_dequant_source: %s", prefix, cvt_err_str(e));
    if (e) {
        free(w);
        return NULL;
    }
    return w;
}

/* Source linear `prefix` [K][N], or, when the files have no such linear, columns [off, off + N)
 * of the fused source `fused` [K][N_fused] (Phi-3's qkv_proj, gate_up_proj). */
static inline float *deq_src_part(struct model_ck *m, const char *prefix, const char *fused,
                                  long K, long N, long off, long N_fused)
{
    static const char *const sfx[] = {"qweight", "weight", "weight_packed"};
    char nm[220];
    for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
        snprintf(nm, sizeof(nm), "%s.%s", prefix, sfx[i]);
        if (cvt_source_find(m->src, nm))
            return deq_src(m, prefix, K, N);
    }
    float *f = deq_src(m, fused, K, N_fused), *w = f ? malloc((size_t)(K * N) * sizeof(float)) : NULL;
    for (long k = 0; w && k < K; k++)
        memcpy(w + k * N, f + k * N_fused + off, (size_t)N * sizeof(float));
    free(f);
    return w;
}

/* ours[r][dc + c] == src[src_r0 + r][src_c0 + c] bitwise for r < n_rows, c < n_cols. */
static inline bool block_eq(const float *ours, long ours_N, long dr, long dc, const float *src,
                     long src_N, long src_r0, long src_c0, long n_rows, long n_cols)
{
    for (long r = 0; r < n_rows; r++)
        if (memcmp(ours + (dr + r) * ours_N + dc, src + (src_r0 + r) * src_N + src_c0,
                   (size_t)n_cols * sizeof(float)))
            return false;
    return true;
}

/* ours[r][c] is +0.0 for every r in [r0, r1), c in [c0, c1). */
static inline bool block_zero(const float *ours, long N, long r0, long r1, long c0, long c1)
{
    for (long r = r0; r < r1; r++)
        for (long c = c0; c < c1; c++) {
            uint32_t b;
            memcpy(&b, &ours[r * N + c], 4);
            if (b)
                return false;
        }
    return true;
}

/* Source float tensor as fp32 (all elements), or NULL. */
static inline float *src_f32(struct model_ck *m, const char *name, long *n)
{
    const struct cvt_src_tensor *t = cvt_source_find(m->src, name);
    CHECK_MSG(t != NULL, "source tensor %s missing", name);
    if (!t)
        return NULL;
    float *v = malloc((size_t)t->numel * sizeof(float));
    if (v && cvt_source_read_f32(m->src, t, 0, (uint64_t)t->numel, v)) {
        free(v);
        v = NULL;
    }
    *n = (long)t->numel;
    return v;
}

static inline uint16_t *src_f16(struct model_ck *m, const char *name, long *n)
{
    const struct cvt_src_tensor *t = cvt_source_find(m->src, name);
    CHECK_MSG(t != NULL, "source tensor %s missing", name);
    if (!t)
        return NULL;
    uint16_t *v = malloc((size_t)t->numel * sizeof(uint16_t));
    if (v && cvt_source_read_f16(m->src, t, 0, (uint64_t)t->numel, v)) {
        free(v);
        v = NULL;
    }
    *n = (long)t->numel;
    return v;
}

/* Replicated F32 tensor `name` equals source `src` (NULL: the same name) converted to fp32,
 * plus `offset` in fp32 (Gemma's norms: 1 + w). */
static inline void ck_replicated_plus(struct model_ck *m, const struct fmt_shard *s,
                                      const char *name, const char *src, float offset)
{
    const struct fmt_tensor *t = find(s, "%s", name);
    long n = 0;
    float *v = src_f32(m, src ? src : name, &n);
    for (long i = 0; v && offset != 0.0f && i < n; i++)
        v[i] += offset;
    if (t && v) {
        CHECK(t->dtype == FMT_DTYPE_F32 && t->numel == (uint64_t)n);
        CHECK_MSG(t->numel == (uint64_t)n && !memcmp(t->data, v, (size_t)n * 4), "%s differs",
                  name);
        m->n_checked++;
    }
    free(v);
}

static inline void ck_replicated_from(struct model_ck *m, const struct fmt_shard *s,
                                      const char *name, const char *src)
{
    ck_replicated_plus(m, s, name, src, 0.0f);
}

static inline void ck_replicated(struct model_ck *m, const struct fmt_shard *s, const char *name)
{
    ck_replicated_from(m, s, name, NULL);
}

/* Vocab-parallel F16 table `out_name` of rank r vs source `src_name`. */
static inline void ck_vocab(struct model_ck *m, const struct fmt_shard *s, int r, const char *out_name,
                     const char *src_name)
{
    const struct fmt_tensor *t = find(s, "%s", out_name);
    long n = 0;
    uint16_t *v = src_f16(m, src_name, &n);
    if (t && v) {
        long lo = r * m->V_r, hi = (r + 1) * m->V_r < m->V ? (r + 1) * m->V_r : m->V;
        long held = hi > lo ? hi - lo : 0;
        CHECK(t->dtype == FMT_DTYPE_F16 && t->shape[0] == (uint64_t)m->V_r &&
              t->shape[1] == (uint64_t)m->H);
        const uint16_t *d = t->data;
        CHECK_MSG(!memcmp(d, v + lo * m->H, (size_t)(held * m->H) * 2), "%s rank %d rows", out_name,
                  r);
        bool zero = true;
        for (long i = held * m->H; i < m->V_r * m->H; i++)
            zero &= d[i] == 0;
        CHECK_MSG(zero, "%s rank %d: padding rows not zero", out_name, r);
        m->n_checked++;
    }
    free(v);
}

/* The act-order permutation `<out>.perm` of output p (DESIGN 4.5): present exactly when the
 * source g_idx of `src_prefix` is not k / G, and then it must list, for every group in order, the
 * source rows of that group in ascending order, computed here from the source g_idx by a double
 * loop (not the converter's counting sort); padding rows past the source's K map to themselves.
 * Counted as checked. */
static inline void ck_perm(struct model_ck *m, const struct fmt_shard *s, const char *p,
                           const char *src_prefix, long K_src)
{
    char pn[240], gn[220];
    snprintf(pn, sizeof(pn), "%s.perm", p);
    const struct fmt_tensor *t = fmt_shard_find(s, pn);
    snprintf(gn, sizeof(gn), "%s.g_idx", src_prefix);
    const struct cvt_src_tensor *g = cvt_source_find(m->src, gn);
    if (!g) {
        snprintf(gn, sizeof(gn), "%s.weight_g_idx", src_prefix);
        g = cvt_source_find(m->src, gn);
    }
    long G = m->G > 0 ? m->G : K_src;
    int32_t *gi = NULL;
    bool act = false;
    if (g) {
        gi = malloc((size_t)K_src * 4);
        CHECK(gi && cvt_source_read(m->src, g, gi, (size_t)K_src * 4) == CVT_ERR_NONE);
        for (long k = 0; gi && k < K_src; k++)
            act |= gi[k] != (int32_t)(k / G);
    }
    CHECK_MSG(act == (t != NULL), "%s: %s although the source g_idx is %s", pn,
              t ? "present" : "missing", act ? "act-order" : "k / G or absent");
    if (!t || !act) {
        free(gi);
        return;
    }
    m->n_checked++;
    CHECK(t->dtype == FMT_DTYPE_I32 && t->n_dims == 1);
    const int32_t *pm = t->data;
    long j = 0, bad = 0;
    for (long grp = 0; grp < K_src / G; grp++)
        for (long k = 0; k < K_src && j < (long)t->shape[0]; k++)
            if (gi[k] == grp)
                bad += pm[j++] != (int32_t)k;
    long n_src = j;
    for (; j < (long)t->shape[0]; j++)
        bad += pm[j] != (int32_t)j;
    CHECK_MSG(bad == 0 && n_src == K_src, "%s: %ld entries differ from the group order of %s", pn,
              bad, gn);
    free(gi);
}

/* Fused column-parallel q/k/v (+ bias) of layer i on rank r. Source names: `att` the layer's
 * attention module (a pattern taking i: "model.layers.%d.self_attn", Falcon's
 * "transformer.h.%d.self_attention"), `fused` its fused q/k/v linear when the parts are absent
 * (Phi-3's qkv_proj, Falcon's query_key_value), `o` its output projection. */
static inline void ck_attention(struct model_ck *m, const struct fmt_shard *s, int r, int i,
                                const char *att, const char *fused, const char *o)
{
    char p[160], sa[120], fu[200], so[200];
    long K, N, hd = m->hd, kv_head = m->tp <= m->nkv ? r * m->nkv_r : r / m->rep;
    snprintf(sa, sizeof(sa), att, i);
    snprintf(fu, sizeof(fu), "%s.%s", sa, fused);
    snprintf(so, sizeof(so), "%s.%s", sa, o);
    snprintf(p, sizeof(p), "model.layers.%d.self_attn.qkv_proj", i);
    float *w = deq_rank(m, s, p, m->H, &K, &N);
    static const char *const part[3] = {"q_proj", "k_proj", "v_proj"};
    if (w && m->cfg->arch->qkv_grouped) { /* Falcon-40B: [q of group g | k_g | v_g] per kv head */
        const long rq = m->nq / m->nkv, Nt = (m->nq + 2 * m->nkv) * hd;
        CHECK(K == m->H && N == (m->nq_r + 2 * m->nkv_r) * hd);
        for (long c = 0; c < m->nq_r + 2 * m->nkv_r; c++) { /* each head of the rank's output */
            long h = r * m->nq_r + c, x = kv_head + (c - m->nq_r) % (m->nkv_r ? m->nkv_r : 1);
            long slot = c < m->nq_r ? (h / rq) * (rq + 2) + h % rq
                                    : x * (rq + 2) + rq + (c >= m->nq_r + m->nkv_r);
            char sp[200];
            snprintf(sp, sizeof(sp), "%s.grouped", sa);
            float *src = deq_src_part(m, sp, fu, m->H, hd, slot * hd, Nt);
            if (src)
                CHECK_MSG(block_eq(w, N, 0, c * hd, src, hd, 0, 0, m->H, hd),
                          "%s rank %d: output head %ld differs from source head slot %ld", p, r, c,
                          slot);
            free(src);
        }
        free(w);
        w = NULL;
    }
    if (w) {
        CHECK(K == m->H && N == (m->nq_r + 2 * m->nkv_r) * hd);
        for (int j = 0; j < 3; j++) {
            char sp[200];
            snprintf(sp, sizeof(sp), "%s.%s", sa, part[j]);
            long Ns = (j == 0 ? m->nq : m->nkv) * hd;
            long off = j == 0 ? 0 : (m->nq + (j - 1) * m->nkv) * hd;
            float *src = deq_src_part(m, sp, fu, m->H, Ns, off, (m->nq + 2 * m->nkv) * hd);
            long c0 = j == 0 ? r * m->nq_r * hd : kv_head * hd;
            long n = (j == 0 ? m->nq_r : m->nkv_r) * hd;
            long dc = j == 0 ? 0 : (m->nq_r + (j - 1) * m->nkv_r) * hd;
            if (src)
                CHECK_MSG(block_eq(w, N, 0, dc, src, Ns, 0, c0, m->H, n),
                          "%s rank %d: %s slice differs from the source", p, r, part[j]);
            free(src);
            if (j == 0) {
                char p0[200];
                snprintf(p0, sizeof(p0), "%s.q_proj", sa);
                ck_perm(m, s, p, p0, m->H);
            }
            /* bias (Qwen2): same columns */
            char bn[224];
            snprintf(bn, sizeof(bn), "%s.bias", sp);
            if (cvt_source_find(m->src, bn)) {
                long nb = 0;
                float *b = src_f32(m, bn, &nb);
                const struct fmt_tensor *t = find(s, "%s.bias", p);
                if (b && t)
                    CHECK_MSG(!memcmp((const float *)t->data + dc, b + c0, (size_t)n * 4),
                              "%s.bias rank %d: %s part differs", p, r, part[j]);
                if (j == 0 && t)
                    m->n_checked++;
                free(b);
            }
        }
        free(w);
    }
    snprintf(p, sizeof(p), "model.layers.%d.self_attn.o_proj", i);
    w = deq_rank(m, s, p, m->nq * hd, &K, &N);
    if (w) {
        float *src = deq_src(m, so, m->nq * hd, m->H);
        CHECK(K == m->nq_r * hd && N == m->H);
        if (src)
            CHECK_MSG(block_eq(w, N, 0, 0, src, m->H, r * m->nq_r * hd, 0, K, N),
                      "%s rank %d differs from the source rows", p, r);
        free(src);
        free(w);
        ck_perm(m, s, p, so, m->nq * hd);
    }
}

/* Plain (ungated) MLP of layer i on rank r (Falcon): gate_up_proj [H, I_r] = the columns of the
 * source's up projection `up`, down_proj [I_r, H] = the rows of `down` (source names under
 * `base`, a pattern taking i). */
static inline void ck_mlp_plain(struct model_ck *m, const struct fmt_shard *s, int r, int i,
                                const char *base, const char *up, const char *down)
{
    char p[200], sp[200], sb[160];
    long K, N, lo = r * m->I_r, hi = (r + 1) * m->I_r < m->I ? (r + 1) * m->I_r : m->I;
    long held = hi > lo ? hi - lo : 0;
    snprintf(sb, sizeof(sb), base, i);
    snprintf(p, sizeof(p), "model.layers.%d.mlp.gate_up_proj", i);
    float *w = deq_rank(m, s, p, m->H, &K, &N);
    if (w) {
        CHECK(K == m->H && N == m->I_r);
        snprintf(sp, sizeof(sp), "%s.%s", sb, up);
        float *src = deq_src(m, sp, m->H, m->I);
        if (src && held)
            CHECK_MSG(block_eq(w, N, 0, 0, src, m->I, 0, lo, m->H, held),
                      "%s rank %d: columns differ from %s", p, r, sp);
        CHECK_MSG(block_zero(w, N, 0, K, held, m->I_r), "%s rank %d: padding columns not zero",
                  p, r);
        free(src);
        free(w);
    }
    snprintf(p, sizeof(p), "model.layers.%d.mlp.down_proj", i);
    w = deq_rank(m, s, p, m->I, &K, &N);
    if (w) {
        CHECK(K == m->I_r && N == m->H);
        snprintf(sp, sizeof(sp), "%s.%s", sb, down);
        float *src = deq_src(m, sp, m->I, m->H);
        if (src && held)
            CHECK_MSG(block_eq(w, N, 0, 0, src, m->H, lo, 0, held, m->H),
                      "%s rank %d: rows differ from %s", p, r, sp);
        CHECK_MSG(block_zero(w, N, held, K, 0, N), "%s rank %d: padding rows not zero", p, r);
        free(src);
        free(w);
    }
}

/* Gated MLP (dense or one expert) on rank r: gate_up [H, 2 I_r], down [I_r, H]. */
static inline void ck_mlp(struct model_ck *m, const struct fmt_shard *s, int r, const char *base,
                   const char *src_base, const char *gate, const char *up, const char *down)
{
    char p[200], sp[200];
    long K, N, lo = r * m->I_r, hi = (r + 1) * m->I_r < m->I ? (r + 1) * m->I_r : m->I;
    long held = hi > lo ? hi - lo : 0;
    snprintf(p, sizeof(p), "%s.gate_up_proj", base);
    float *w = deq_rank(m, s, p, m->H, &K, &N);
    if (w) {
        CHECK(K == m->H && N == 2 * m->I_r);
        const char *parts[2] = {gate, up};
        for (int j = 0; j < 2; j++) {
            snprintf(sp, sizeof(sp), "%s.%s", src_base, parts[j]);
            char fu[220]; /* Phi-3's fused source */
            snprintf(fu, sizeof(fu), "%s.gate_up_proj", src_base);
            float *src = deq_src_part(m, sp, fu, m->H, m->I, j * m->I, 2 * m->I);
            if (src && held)
                CHECK_MSG(block_eq(w, N, 0, j * m->I_r, src, m->I, 0, lo, m->H, held),
                          "%s rank %d: %s columns differ", p, r, parts[j]);
            CHECK_MSG(block_zero(w, N, 0, K, j * m->I_r + held, (j + 1) * m->I_r),
                      "%s rank %d: padding columns of %s not zero", p, r, parts[j]);
            free(src);
        }
        free(w);
        snprintf(sp, sizeof(sp), "%s.%s", src_base, gate);
        ck_perm(m, s, p, sp, m->H);
    }
    snprintf(p, sizeof(p), "%s.down_proj", base);
    w = deq_rank(m, s, p, m->I, &K, &N);
    if (w) {
        CHECK(K == m->I_r && N == m->H);
        snprintf(sp, sizeof(sp), "%s.%s", src_base, down);
        float *src = deq_src(m, sp, m->I, m->H);
        if (src && held)
            CHECK_MSG(block_eq(w, N, 0, 0, src, m->H, lo, 0, held, m->H),
                      "%s rank %d: rows differ", p, r);
        CHECK_MSG(block_zero(w, N, held, K, 0, N), "%s rank %d: padding rows not zero", p, r);
        free(src);
        free(w);
        ck_perm(m, s, p, sp, m->I);
    }
}

/* Config JSON of rank r: the tp block and padded sizes as DESIGN 6 / 5 say. */
static inline void ck_config(struct model_ck *m, const struct fmt_shard *s, int r)
{
    const char *js;
    size_t len;
    CHECK(fmt_shard_config_json(s, &js, &len) == FMT_ERR_NONE);
    cJSON *j = cJSON_ParseWithLength(js, len);
    CHECK(j != NULL);
    if (!j)
        return;
    cJSON *tp = cJSON_GetObjectItem(j, "tp");
#define NUM(o, k) cJSON_GetNumberValue(cJSON_GetObjectItem((o), (k)))
    CHECK_EQ_INT(NUM(tp, "world_size"), m->tp);
    CHECK_EQ_INT(NUM(tp, "rank"), r);
    CHECK_EQ_INT(NUM(tp, "heads_per_rank"), m->nq_r);
    CHECK_EQ_INT(NUM(tp, "kv_heads_per_rank"), m->nkv_r);
    CHECK_EQ_INT(NUM(tp, "kv_head_replicas"), m->rep);
    CHECK_EQ_INT(NUM(tp, "intermediate_per_rank"), m->I_r);
    CHECK_EQ_INT(NUM(j, "intermediate_size_padded"), m->I_pad);
    CHECK_EQ_INT(NUM(j, "vocab_size_per_rank"), m->V_r);
    CHECK_EQ_INT(NUM(j, "vocab_size"), m->V);
    CHECK_EQ_INT(NUM(j, "hidden_size"), m->H);
    CHECK_EQ_INT(NUM(cJSON_GetObjectItem(j, "quant"), "group_size"), m->G);
    CHECK(cJSON_IsBool(cJSON_GetObjectItem(j, "tie_word_embeddings")));
#undef NUM
    cJSON_Delete(j);
}

/* Replicated float tensor of layer i: output name pattern `out`, source pattern `src` (each
 * taking i). */
static inline void ck_layer_float(struct model_ck *m, const struct fmt_shard *s, int i,
                                  const char *out, const char *src)
{
    char nm[200], src_nm[200];
    snprintf(nm, sizeof(nm), out, i);
    snprintf(src_nm, sizeof(src_nm), src, i);
    ck_replicated_from(m, s, nm, src_nm);
}

/* A LayerNorm's weight and bias of layer i: output prefix `out`, source prefix `src` (each
 * taking i; ".weight" / ".bias" appended). */
static inline void ck_layer_norm_wb(struct model_ck *m, const struct fmt_shard *s, int i,
                                    const char *out, const char *src)
{
    static const char *const sfx[2] = {".weight", ".bias"};
    char o[200], sr[200];
    for (int k = 0; k < 2; k++) {
        snprintf(o, sizeof(o), "%s%s", out, sfx[k]);
        snprintf(sr, sizeof(sr), "%s%s", src, sfx[k]);
        ck_layer_float(m, s, i, o, sr);
    }
}

/* The tied families' vocabulary on rank r: the embedding from source `src`, no lm_head. */
static inline void ck_tied_vocab(struct model_ck *m, const struct fmt_shard *s, int r,
                                 const char *src)
{
    ck_vocab(m, s, r, "model.embed_tokens.weight", src);
    CHECK_MSG(m->cfg->tie_word_embeddings && fmt_shard_find(s, "lm_head.weight") == NULL,
              "%s: lm_head", m->name);
}

/* Falcon's tensors on rank r (transformers modeling_falcon.py names): its own embedding, final
 * LayerNorm with bias, layers "transformer.h.%d" with one input_layernorm (+ bias), fused
 * query_key_value, dense, a plain MLP. */
static inline void ck_rank_falcon(struct model_ck *m, const struct fmt_shard *s, int r)
{
    ck_tied_vocab(m, s, r, "transformer.word_embeddings.weight");
    ck_replicated_from(m, s, "model.norm.weight", "transformer.ln_f.weight");
    ck_replicated_from(m, s, "model.norm.bias", "transformer.ln_f.bias");
    const bool two = cvt_source_find(m->src, "transformer.h.0.ln_attn.weight") != NULL;
    for (int i = 0; i < m->L; i++) {
        ck_layer_norm_wb(m, s, i, "model.layers.%d.input_layernorm",
                         two ? "transformer.h.%d.ln_attn" : "transformer.h.%d.input_layernorm");
        if (two) /* Falcon-40B's ln_mlp: the MLP's own norm */
            ck_layer_norm_wb(m, s, i, "model.layers.%d.post_attention_layernorm",
                             "transformer.h.%d.ln_mlp");
        ck_attention(m, s, r, i, "transformer.h.%d.self_attention", "query_key_value", "dense");
        ck_mlp_plain(m, s, r, i, "transformer.h.%d.mlp", "dense_h_to_4h", "dense_4h_to_h");
    }
}

/* MPT's tensors on rank r (modeling_mpt.py names): wte, blocks.{i}.norm_1 / norm_2 (no bias),
 * attn.Wqkv fused, attn.out_proj, ffn.up_proj / down_proj (plain), ffn.act.scales split like
 * up's columns; norm_f. */
static inline void ck_rank_mpt(struct model_ck *m, const struct fmt_shard *s, int r)
{
    ck_tied_vocab(m, s, r, "transformer.wte.weight");
    ck_replicated_from(m, s, "model.norm.weight", "transformer.norm_f.weight");
    for (int i = 0; i < m->L; i++) {
        char src_nm[200];
        ck_layer_float(m, s, i, "model.layers.%d.input_layernorm.weight",
                       "transformer.blocks.%d.norm_1.weight");
        ck_layer_float(m, s, i, "model.layers.%d.post_attention_layernorm.weight",
                       "transformer.blocks.%d.norm_2.weight");
        ck_attention(m, s, r, i, "transformer.blocks.%d.attn", "Wqkv", "out_proj");
        ck_mlp_plain(m, s, r, i, "transformer.blocks.%d.ffn", "up_proj", "down_proj");
        snprintf(src_nm, sizeof(src_nm), "transformer.blocks.%d.ffn.act.scales", i);
        const struct fmt_tensor *t = find(s, "model.layers.%d.mlp.act_scales", i);
        long n = 0;
        float *v = src_f32(m, src_nm, &n);
        if (t && v)
            CHECK_MSG((long)t->shape[0] == m->I_r && n == m->I &&
                          !memcmp(t->data, v + r * m->I_r, (size_t)m->I_r * 4),
                      "%s rank %d: act_scales differ from %s's columns", m->name, r, src_nm);
        if (t)
            m->n_checked++;
        free(v);
    }
}

/* Gemma 2 / 3's tensors on rank r (modeling_gemma2.py / modeling_gemma3.py names): LLaMA's
 * linears, tied embedding, every norm stored as 1 + w: input_layernorm, post_attention_layernorm
 * (-> self_attn.out_norm), pre_feedforward_layernorm (-> post_attention_layernorm, the MLP's
 * input norm in DESIGN 5), post_feedforward_layernorm (-> mlp.out_norm), Gemma 3's q/k norms. */
static inline void ck_rank_gemma(struct model_ck *m, const struct fmt_shard *s, int r)
{
    static const char *const norms[][2] = {
        {"model.layers.%d.input_layernorm.weight", "model.layers.%d.input_layernorm.weight"},
        {"model.layers.%d.self_attn.out_norm.weight", "model.layers.%d.post_attention_layernorm.weight"},
        {"model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.pre_feedforward_layernorm.weight"},
        {"model.layers.%d.mlp.out_norm.weight", "model.layers.%d.post_feedforward_layernorm.weight"},
        {"model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.q_norm.weight"},
        {"model.layers.%d.self_attn.k_norm.weight", "model.layers.%d.self_attn.k_norm.weight"},
    };
    char base[160], nm[200], src_nm[200];
    ck_tied_vocab(m, s, r, "model.embed_tokens.weight");
    ck_replicated_plus(m, s, "model.norm.weight", NULL, 1.0f);
    for (int i = 0; i < m->L; i++) {
        for (size_t k = 0; k < sizeof norms / sizeof norms[0]; k++) {
            snprintf(nm, sizeof(nm), norms[k][0], i);
            snprintf(src_nm, sizeof(src_nm), norms[k][1], i);
            if (k < 4 || cvt_source_find(m->src, src_nm))
                ck_replicated_plus(m, s, nm, src_nm, 1.0f);
        }
        ck_attention(m, s, r, i, "model.layers.%d.self_attn", "qkv_proj", "o_proj");
        snprintf(base, sizeof(base), "model.layers.%d.mlp", i);
        ck_mlp(m, s, r, base, base, "gate_proj", "up_proj", "down_proj");
    }
}

/* The LLaMA family's tensors on rank r (LLaMA, Mistral, Qwen2/3, Phi-3, Mixtral, Qwen3-MoE). */
static inline void ck_rank_llama(struct model_ck *m, const struct fmt_shard *s, int r)
{
    char base[160], nm[200];
    const bool tie = m->cfg->tie_word_embeddings;
    const char *emb = "model.embed_tokens.weight";
    ck_vocab(m, s, r, emb, cvt_source_find(m->src, emb) ? emb : "lm_head.weight");
    if (tie)
        CHECK_MSG(fmt_shard_find(s, "lm_head.weight") == NULL, "%s: tied model has lm_head",
                  m->name);
    else
        ck_vocab(m, s, r, "lm_head.weight", "lm_head.weight");
    ck_replicated(m, s, "model.norm.weight");
    for (int i = 0; i < m->L; i++) {
        snprintf(nm, sizeof(nm), "model.layers.%d.input_layernorm.weight", i);
        ck_replicated(m, s, nm);
        snprintf(nm, sizeof(nm), "model.layers.%d.post_attention_layernorm.weight", i);
        ck_replicated(m, s, nm);
        snprintf(nm, sizeof(nm), "model.layers.%d.self_attn.q_norm.weight", i);
        if (cvt_source_find(m->src, nm)) { /* Qwen3: per-head norms [hd], replicated */
            ck_replicated(m, s, nm);
            snprintf(nm, sizeof(nm), "model.layers.%d.self_attn.k_norm.weight", i);
            ck_replicated(m, s, nm);
        }
        ck_attention(m, s, r, i, "model.layers.%d.self_attn", "qkv_proj", "o_proj");
        if (m->E) {
            /* Mixtral: block_sparse_moe.{gate, experts.e.w1/w3/w2}; Qwen3-MoE:
             * mlp.{gate, experts.e.gate_proj/up_proj/down_proj}; both written in Mixtral's
             * canonical names */
            char src_nm[200], src_base[200];
            snprintf(src_nm, sizeof(src_nm), "model.layers.%d.mlp.gate.weight", i);
            const bool qm = cvt_source_find(m->src, src_nm) != NULL;
            snprintf(nm, sizeof(nm), "model.layers.%d.block_sparse_moe.gate.weight", i);
            ck_replicated_from(m, s, nm, qm ? src_nm : NULL);
            for (int e = 0; e < m->E; e++) {
                snprintf(base, sizeof(base), "model.layers.%d.block_sparse_moe.experts.%d", i,
                         e);
                snprintf(src_base, sizeof(src_base), "model.layers.%d.%s.experts.%d", i,
                         qm ? "mlp" : "block_sparse_moe", e);
                if (qm)
                    ck_mlp(m, s, r, base, src_base, "gate_proj", "up_proj", "down_proj");
                else
                    ck_mlp(m, s, r, base, src_base, "w1", "w3", "w2");
            }
        } else {
            snprintf(base, sizeof(base), "model.layers.%d.mlp", i);
            ck_mlp(m, s, r, base, base, "gate_proj", "up_proj", "down_proj");
        }
    }
}

/* Every tensor of every rank of out_dir vs the source. */
static inline void ck_model(struct model_ck *m, const char *out_dir)
{
    struct fmt_model *fm = NULL;
    enum fmt_err fe = fmt_model_open(out_dir, &fm);
    CHECK_MSG(fe == FMT_ERR_NONE, "%s tp %d: fmt_model_open: %s", m->name, m->tp, qs_log_last());
    if (!fm)
        return;
    CHECK_EQ_INT(fmt_model_world_size(fm), m->tp);
    for (int r = 0; r < m->tp; r++) {
        const struct fmt_shard *s = fmt_model_shard(fm, (uint32_t)r);
        m->n_checked = 0;
        ck_config(m, s, r);
        if (cvt_source_find(m->src, "transformer.word_embeddings.weight"))
            ck_rank_falcon(m, s, r);
        else if (cvt_source_find(m->src, "transformer.wte.weight"))
            ck_rank_mpt(m, s, r);
        else if (cvt_source_find(m->src, "model.layers.0.pre_feedforward_layernorm.weight"))
            ck_rank_gemma(m, s, r);
        else
            ck_rank_llama(m, s, r);
        /* nothing in the rank file that this test did not check */
        CHECK_MSG(m->n_checked == (int)fmt_shard_n_tensors(s), "%s tp %d rank %d: %d tensors "
                  "checked, file has %u", m->name, m->tp, r, m->n_checked,
                  fmt_shard_n_tensors(s));
    }
    fmt_model_close(fm);
}

/* --- twins ------------------------------------------------------------------------------- */

/* Config JSON without the two fields that name the source format. */
static inline cJSON *config_sans_source(const struct fmt_shard *s)
{
    const char *js;
    size_t len;
    if (fmt_shard_config_json(s, &js, &len))
        return NULL;
    cJSON *j = cJSON_ParseWithLength(js, len);
    cJSON *q = cJSON_GetObjectItem(j, "quant");
    cJSON_DeleteItemFromObject(q, "source_variant");
    cJSON_DeleteItemFromObject(q, "source_container");
    cJSON_DeleteItemFromObject(q, "source_format");
    return j;
}

struct tok_list {
    int n;
    char names[16][64];
    uint64_t sizes[16];
};

static inline void tok_cb(void *ctx, const char *name, uint64_t size)
{
    struct tok_list *l = ctx;
    if (l->n < 16) {
        snprintf(l->names[l->n], sizeof(l->names[0]), "%s", name);
        l->sizes[l->n++] = size;
    }
}

static inline void ck_twins(const char *dir_a, const char *dir_b, const char *what)
{
    struct fmt_model *a = NULL, *b = NULL;
    CHECK(fmt_model_open(dir_a, &a) == FMT_ERR_NONE);
    CHECK(fmt_model_open(dir_b, &b) == FMT_ERR_NONE);
    if (!a || !b)
        goto out;
    CHECK_EQ_INT(fmt_model_world_size(a), fmt_model_world_size(b));
    for (uint32_t r = 0; r < fmt_model_world_size(a) && r < fmt_model_world_size(b); r++) {
        const struct fmt_shard *sa = fmt_model_shard(a, r), *sb = fmt_model_shard(b, r);
        uint32_t n = fmt_shard_n_tensors(sa);
        CHECK_MSG(n == fmt_shard_n_tensors(sb), "%s rank %u: tensor counts differ", what, r);
        for (uint32_t i = 0; i < n && i < fmt_shard_n_tensors(sb); i++) {
            const struct fmt_tensor *ta = fmt_shard_tensor(sa, i), *tb = fmt_shard_tensor(sb, i);
            bool same = !strcmp(ta->name, tb->name) && ta->dtype == tb->dtype &&
                        ta->layout == tb->layout && ta->n_dims == tb->n_dims &&
                        !memcmp(ta->shape, tb->shape, sizeof(ta->shape)) &&
                        ta->split == tb->split && ta->size == tb->size && ta->xxh3 == tb->xxh3 &&
                        !memcmp(ta->data, tb->data, ta->size);
            CHECK_MSG(same, "%s rank %u: tensor %u (%s vs %s) differs", what, r, i, ta->name,
                      tb->name);
        }
        cJSON *ca = config_sans_source(sa), *cb = config_sans_source(sb);
        CHECK_MSG(ca && cb && cJSON_Compare(ca, cb, true), "%s rank %u: configs differ", what, r);
        cJSON_Delete(ca);
        cJSON_Delete(cb);
        const char *ga, *gb;
        size_t la, lb;
        CHECK(!fmt_shard_generation_config_json(sa, &ga, &la) &&
              !fmt_shard_generation_config_json(sb, &gb, &lb) && la == lb && !memcmp(ga, gb, la));
        struct tok_list xa = {0}, xb = {0};
        CHECK(!fmt_shard_tokenizer_list(sa, tok_cb, &xa) && !fmt_shard_tokenizer_list(sb, tok_cb, &xb));
        CHECK(xa.n == xb.n && !memcmp(xa.sizes, xb.sizes, sizeof(xa.sizes)));
    }
out:
    fmt_model_close(a);
    fmt_model_close(b);
}

#endif /* QS_T_CVT_CHECK_H */

/*
 * cvt_gptq.c - one GPTQ or compressed-tensors pack-quantized linear from the source tensors:
 * shape validation, g_idx (act-order) validation, decoding into the canonical form of
 * docs/DESIGN.md section 4 (rows in group order for act-order, cvt_src.h), and an independent
 * source dequantization for the converter's self-check. Also symmetric AWQ's implied zero.
 *
 * Entry points: cvt_awq_gidx() (cvt_src.h); cvt_gptq_probe(), cvt_gptq_decode(),
 * cvt_gptq_dequant() (cvt_src_int.h, dispatched from cvt_awq.c by the config's quant_method).
 *
 * Layout facts (docs/FORMATS.md sections 14 and 15; restated in our notation):
 *   GPTQ   qweight I32 [K/8, N]: nibble i of word [r][n] = code of input row 8r + i, column n;
 *          qzeros I32 [K/G, N/8]: nibble i of word [g][c] = zero of column 8c + i, stored z - 1
 *          for checkpoint_format "gptq" (v1), z for "gptq_v2"; scales F16 [K/G, N];
 *          g_idx I32 [K]: group of input row k. w = (q - z) * s of its row's group.
 *          (AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py` pack/forward; GPTQModel
 *          `gptqmodel/utils/model.py` convert_gptq_v1_to_v2_format adds 1 to every zero nibble.)
 *   CT     weight_packed I32 [N, K/8]: nibble i of word [n][c] = row 8c + i of column n, stored
 *          as the signed value + 8; weight_scale [N, K/G] (channel: [N, 1]) F16 or BF16;
 *          weight_zero_point, asymmetric only: I32 [N/8, K/G] with nibble i of word [r][g] =
 *          zero of column 8r + i (+ 8), or (older compressed-tensors) I8 [N, K/G] signed;
 *          weight_shape I32/I64 [2] = [N, K]; weight_g_idx I32 [K].
 *          (neuralmagic/compressed-tensors `compressors/quantized_compressors/pack_quantized.py`
 *          pack_to_int32 / unpack_from_int32 and `quantization/lifecycle/forward.py` dequantize:
 *          w = (x_q - zp) * scale with the same +8 offset on both, so q - z is unchanged.)
 *   Symmetric (GPTQ sym, CT symmetric, AWQ zero_point false): z = 8 (vLLM scalar type uint4b8).
 *
 * As in cvt_awq.c, the decoder gathers per output element and the self-check dequantizer walks
 * the packed words and scatters each nibble; act-order rows are placed by a perm built by
 * sorting (decoder) and by running group counters (self-check), so neither copies the other.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_src_int.h"
#include "qs_log.h"

#define PREFIX_MAX 400

static const struct cvt_src_tensor *find2(const struct cvt_source *src, const char *prefix,
                                          const char *suffix)
{
    char name[PREFIX_MAX + 32];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return cvt_source_find(src, name);
}

static bool is1(const struct cvt_src_tensor *t, int64_t a)
{
    return t && t->n_dims == 1 && t->shape[0] == a;
}

static bool is2(const struct cvt_src_tensor *t, int64_t a, int64_t b)
{
    return t && t->n_dims == 2 && t->shape[0] == a && t->shape[1] == b;
}

static bool half_dt(const struct cvt_src_tensor *t)
{
    return t->dtype == CVT_DT_F16 || t->dtype == CVT_DT_BF16;
}

static float load_half(const uint8_t *p, enum cvt_dtype dt)
{
    uint16_t h = cvt_ld16(p);
    return dt == CVT_DT_BF16 ? cvt_bf16_to_f32(h) : cvt_f16_to_f32(h);
}

/* --- g_idx ------------------------------------------------------------------------------------ */

static int64_t gidx_at(const uint8_t *p, enum cvt_dtype dt, int64_t k)
{
    if (dt == CVT_DT_I64) {
        uint64_t v = cvt_ld64(p + 8 * k);
        return (int64_t)v;
    }
    return (int32_t)cvt_ld32(p + 4 * k);
}

enum cvt_err cvt_awq_gidx(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                          const char *prefix, int64_t K, bool *act_order, int32_t *perm)
{
    const char *dir = cvt_source_dir(src);
    const struct cvt_src_tensor *t = find2(src, prefix, "g_idx");
    if (!t)
        t = find2(src, prefix, "weight_g_idx");
    *act_order = false;
    if (perm)
        for (int64_t j = 0; j < K; j++)
            perm[j] = (int32_t)j;
    if (!t || cfg->quant.method == CVT_QM_AWQ)
        return CVT_ERR_NONE; /* AWQ files have none; the plan refuses a stray g_idx by name */
    char b[96];
    const int64_t G = cfg->quant.group_size == -1 ? K : cfg->quant.group_size;
    if ((t->dtype != CVT_DT_I32 && t->dtype != CVT_DT_I64) || !is1(t, K) || !t->contiguous ||
        G <= 0 || K % G) {
        qs_log_error("cvt_awq_gidx", "%s: tensor %s is %s; expected I32 [%lld] (one group index "
                     "per input row, group size %lld)", dir, t->name,
                     cvt_tensor_shape_str(t, b, sizeof b), (long long)K, (long long)G);
        return CVT_ERR_SHAPE;
    }
    const int64_t ng = K / G;
    const uint8_t *p = cvt_source_data(src, t);
    int64_t *cnt = calloc((size_t)ng, sizeof *cnt);
    if (!cnt) {
        qs_log_error("cvt_awq_gidx", "tensor %s: out of memory", t->name);
        return CVT_ERR_NOMEM;
    }
    enum cvt_err err = CVT_ERR_NONE;
    bool trivial = true;
    for (int64_t k = 0; k < K; k++) {
        int64_t g = gidx_at(p, t->dtype, k);
        if (g < 0 || g >= ng) {
            qs_log_error("cvt_awq_gidx", "%s: tensor %s: row %lld has group %lld; expected 0..%lld "
                         "(%lld groups of %lld rows)", dir, t->name, (long long)k, (long long)g,
                         (long long)(ng - 1), (long long)ng, (long long)G);
            err = CVT_ERR_RANGE;
            goto out;
        }
        cnt[g]++;
        trivial &= g == k / G;
    }
    for (int64_t g = 0; g < ng; g++)
        if (cnt[g] != G) {
            qs_log_error("cvt_awq_gidx", "%s: tensor %s is not a group assignment: group %lld has "
                         "%lld rows, every group must have exactly %lld (group size)", dir,
                         t->name, (long long)g, (long long)cnt[g], (long long)G);
            err = CVT_ERR_RANGE;
            goto out;
        }
    if (!trivial && !cfg->quant.act_order) {
        qs_log_error("cvt_awq_gidx", "%s: tensor %s assigns rows to groups out of order "
                     "(act-order) but the config says %s: metadata and tensors disagree", dir,
                     t->name, cfg->quant.method == CVT_QM_GPTQ ? "desc_act false"
                                                                : "actorder is not \"group\"");
        err = CVT_ERR_CONFIG;
        goto out;
    }
    *act_order = !trivial;
    if (perm && !trivial) { /* stable counting sort by group: perm[j] = source row */
        int64_t at = 0;
        for (int64_t g = 0; g < ng; g++) {
            int64_t c = cnt[g];
            cnt[g] = at;
            at += c;
        }
        for (int64_t k = 0; k < K; k++)
            perm[cnt[gidx_at(p, t->dtype, k)]++] = (int32_t)k;
    }
out:
    free(cnt);
    return err;
}

/* --- probe ------------------------------------------------------------------------------------ */

/* Symmetric checkpoints store no zeros; asymmetric ones must. */
static enum cvt_err zeros_presence(const char *dir, const struct cvt_hf_config *cfg,
                                   const char *prefix, const struct cvt_src_tensor *z,
                                   const char *zname)
{
    const char *key = cfg->quant.method == CVT_QM_GPTQ ? "sym" : cfg->quant.method == CVT_QM_CT
                                                                     ? "symmetric"
                                                                     : "zero_point";
    if (cfg->quant.zero_point && !z) {
        qs_log_error("cvt_awq_probe", "%s: tensor %s.%s is missing: the config is asymmetric "
                     "(%s %s)", dir, prefix, zname, key,
                     cfg->quant.method == CVT_QM_AWQ ? "true" : "false");
        return CVT_ERR_MISSING_TENSOR;
    }
    if (!cfg->quant.zero_point && z && cfg->quant.method != CVT_QM_GPTQ) {
        qs_log_error("cvt_awq_probe", "%s: tensor %s.%s is present but the config says %s %s "
                     "(symmetric: no zeros are stored): metadata and tensors disagree", dir,
                     prefix, zname, key, cfg->quant.method == CVT_QM_AWQ ? "false" : "true");
        return CVT_ERR_CONFIG;
    }
    return CVT_ERR_NONE;
}

enum cvt_err cvt_awq_zeros_presence(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                                    const char *prefix, const struct cvt_src_tensor *z)
{
    return zeros_presence(cvt_source_dir(src), cfg, prefix, z, "qzeros");
}

enum cvt_err cvt_gptq_probe(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                            const char *prefix, int64_t K, int64_t N, int64_t G,
                            struct cvt_awq_info *info)
{
    const char *dir = cvt_source_dir(src);
    char b1[96], b2[96], b3[96];
    const bool ct = cfg->quant.method == CVT_QM_CT;
    const char *qn = ct ? "weight_packed" : "qweight", *sn = ct ? "weight_scale" : "scales";
    const char *zn = ct ? "weight_zero_point" : "qzeros";
    const struct cvt_src_tensor *qw = find2(src, prefix, qn), *sc = find2(src, prefix, sn);
    const struct cvt_src_tensor *qz = find2(src, prefix, zn);
    const struct cvt_src_tensor *gi = find2(src, prefix, ct ? "weight_g_idx" : "g_idx");
    const struct cvt_src_tensor *sh = ct ? find2(src, prefix, "weight_shape") : NULL;
    const int64_t KG = K / G;
    if (!qw || !sc) {
        qs_log_error("cvt_awq_probe", "%s: linear %s: tensor %s.%s is missing", dir, prefix,
                     prefix, qw ? sn : qn);
        return CVT_ERR_MISSING_TENSOR;
    }
    CVT_TRY(zeros_presence(dir, cfg, prefix, qz, zn));
    if (qw->dtype != CVT_DT_I32 || !half_dt(sc) || (qz && qz->dtype != CVT_DT_I32 &&
                                                    !(ct && qz->dtype == CVT_DT_I8))) {
        qs_log_error("cvt_awq_probe", "%s: linear %s (%s): %s %s, %s %s%s%s: expected I32 codes, "
                     "F16 or BF16 scales, I32%s zeros", dir, prefix, ct ? "compressed-tensors" : "GPTQ",
                     qw->name, cvt_dtype_str(qw->dtype), sc->name, cvt_dtype_str(sc->dtype),
                     qz ? ", zeros " : "", qz ? cvt_dtype_str(qz->dtype) : "", ct ? " (or I8)" : "");
        return CVT_ERR_DTYPE;
    }
    bool ok;
    if (ct)
        ok = K % 8 == 0 && is2(qw, N, K / 8) && is2(sc, N, KG) &&
             (!qz || (qz->dtype == CVT_DT_I32 ? N % 8 == 0 && is2(qz, N / 8, KG) : is2(qz, N, KG)));
    else
        ok = K % 8 == 0 && N % 8 == 0 && is2(qw, K / 8, N) && is2(sc, KG, N) &&
             (!qz || is2(qz, KG, N / 8));
    if (!ok) {
        qs_log_error("cvt_awq_probe", "%s: linear %s (K %lld, N %lld, group size %lld from the "
                     "config): %s %s, %s %s, zeros %s match no %s layout; expected %s [%lld, %lld], "
                     "%s [%lld, %lld]%s", dir, prefix, (long long)K, (long long)N, (long long)G,
                     qw->name, cvt_tensor_shape_str(qw, b1, sizeof b1), sc->name,
                     cvt_tensor_shape_str(sc, b2, sizeof b2),
                     qz ? cvt_tensor_shape_str(qz, b3, sizeof b3) : "(none)",
                     ct ? "compressed-tensors pack-quantized" : "GPTQ", qn,
                     (long long)(ct ? N : K / 8), (long long)(ct ? K / 8 : N), sn,
                     (long long)(ct ? N : KG), (long long)(ct ? KG : N),
                     ct ? ", weight_zero_point I32 [N/8, K/G] or I8 [N, K/G]" : ", qzeros [K/G, N/8]");
        return CVT_ERR_SHAPE;
    }
    if (ct) {
        const uint8_t *p = sh ? cvt_source_data(src, sh) : NULL;
        bool sok = sh && p && (sh->dtype == CVT_DT_I32 || sh->dtype == CVT_DT_I64) && is1(sh, 2);
        if (sok) {
            int64_t a = sh->dtype == CVT_DT_I64 ? (int64_t)cvt_ld64(p) : (int32_t)cvt_ld32(p);
            int64_t c = sh->dtype == CVT_DT_I64 ? (int64_t)cvt_ld64(p + 8) : (int32_t)cvt_ld32(p + 4);
            sok = a == N && c == K;
        }
        if (!sok) {
            qs_log_error("cvt_awq_probe", "%s: tensor %s.weight_shape is %s; expected I64 [2] "
                         "holding [%lld, %lld] (out, in features)", dir, prefix,
                         sh ? "not that" : "missing", (long long)N, (long long)K);
            return sh ? CVT_ERR_SHAPE : CVT_ERR_MISSING_TENSOR;
        }
    }
    const struct cvt_src_tensor *all[5] = {qw, sc, qz, gi, sh};
    for (int i = 0; i < 5; i++)
        if (all[i] && !all[i]->contiguous) {
            qs_log_error("cvt_awq_probe", "%s: tensor %s is a non-contiguous view: not supported",
                         dir, all[i]->name);
            return CVT_ERR_SHAPE;
        }
    info->variant = ct ? CVT_VARIANT_CT_PACKED : CVT_VARIANT_GPTQ;
    info->qweight = qw;
    info->zeros = qz;
    info->scales = sc;
    info->g_idx = gi;
    info->shape = sh;
    return CVT_ERR_NONE;
}

/* --- decoder ---------------------------------------------------------------------------------- */

/* The zero of column n in group g from the source (canonical 0..15; 8 when none are stored). */
static enum cvt_err zero_at(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                            const struct cvt_awq_info *in, const uint8_t *zp, int64_t g,
                            int64_t n, uint8_t *z)
{
    const struct cvt_src_tensor *t = in->zeros;
    int v;
    if (!t) {
        *z = 8;
        return CVT_ERR_NONE;
    }
    if (in->variant == CVT_VARIANT_GPTQ) {
        uint32_t w = cvt_ld32(zp + ((uint64_t)g * (uint64_t)(in->N / 8) + (uint64_t)(n / 8)) * 4);
        v = (int)((w >> (4 * (n % 8))) & 15u) + (cfg->quant.gptq_v1 ? 1 : 0);
    } else if (t->dtype == CVT_DT_I32) {
        uint32_t w = cvt_ld32(zp + ((uint64_t)(n / 8) * (uint64_t)(in->K / in->G) + (uint64_t)g) * 4);
        v = (int)((w >> (4 * (n % 8))) & 15u);
    } else {
        v = (int8_t)zp[(uint64_t)n * (uint64_t)(in->K / in->G) + (uint64_t)g] + 8;
    }
    if (v < 0 || v > 15) {
        qs_log_error("cvt_awq_load", "%s: tensor %s: the zero point of group %lld, column %lld is "
                     "%d, outside 0..15%s", cvt_source_dir(src), t->name, (long long)g, (long long)n,
                     v, v == 16 ? " (a GPTQ v1 file cannot store zero point 0: its packer wraps "
                                  "z - 1 = -1; re-export as gptq_v2)" : "");
        return CVT_ERR_RANGE;
    }
    if (!cfg->quant.zero_point && v != 8) {
        qs_log_error("cvt_awq_load", "%s: tensor %s: group %lld, column %lld has zero point %d but "
                     "the config says sym true (every zero point 8): metadata and tensors disagree",
                     cvt_source_dir(src), t->name, (long long)g, (long long)n, v);
        return CVT_ERR_CONFIG;
    }
    *z = (uint8_t)v;
    return CVT_ERR_NONE;
}

enum cvt_err cvt_gptq_decode(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                             const char *prefix, const struct cvt_awq_info *in,
                             struct cvt_awq_linear *o)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *sc = cvt_source_data(src, in->scales);
    const uint8_t *zp = in->zeros ? cvt_source_data(src, in->zeros) : NULL;
    const int64_t K = in->K, N = in->N, G = in->G, KG = K / G, Ns = o->N;
    const int64_t k0 = o->k0, k1 = o->k0 + o->K, n0 = o->n0, n1 = o->n0 + o->N;
    const bool ct = in->variant == CVT_VARIANT_CT_PACKED;
    bool act;
    int32_t *perm = malloc((size_t)K * sizeof *perm);
    if (!perm) {
        qs_log_error("cvt_awq_load", "linear %s: out of memory", prefix);
        return CVT_ERR_NOMEM;
    }
    enum cvt_err err = cvt_awq_gidx(src, cfg, prefix, K, &act, perm);
    if (!err && !ct) { /* GPTQ: rows of qweight are input rows / 8, contiguous along n */
        for (int64_t j = k0; j < k1; j++) {
            const int64_t k = perm[j];
            const uint8_t *row = qw + ((uint64_t)(k / 8) * (uint64_t)N + (uint64_t)n0) * 4;
            const unsigned s4 = 4u * (unsigned)(k % 8);
            uint8_t *d = o->q + (j - k0) * Ns;
            for (int64_t n = 0; n < Ns; n++)
                d[n] = (uint8_t)((cvt_ld32(row + 4 * n) >> s4) & 15u);
        }
    } else if (!err) { /* CT: rows n of weight_packed hold K codes */
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *row = qw + (uint64_t)n * (uint64_t)(K / 8) * 4;
            for (int64_t j = k0; j < k1; j++) {
                const int64_t k = perm[j];
                o->q[(j - k0) * Ns + (n - n0)] =
                    (uint8_t)((cvt_ld32(row + 4 * (k / 8)) >> (4 * (k % 8))) & 15u);
            }
        }
    }
    for (int64_t g = k0 / G; g < k1 / G && !err; g++)
        for (int64_t n = n0; n < n1 && !err; n++) {
            const int64_t at = (g - k0 / G) * Ns + (n - n0);
            uint64_t e = ct ? (uint64_t)n * (uint64_t)KG + (uint64_t)g : (uint64_t)g * (uint64_t)N + (uint64_t)n;
            float v;
            err = cvt_awq_scale_bits(src, in->scales, ct ? n : g, ct ? g : n, sc + 2 * e, &o->s[at], &v);
            if (!err)
                err = zero_at(src, cfg, in, zp, g, n, &o->z[at]);
        }
    free(perm);
    return err;
}

/* --- independent source dequantization (self-check) ------------------------------------------- */

enum cvt_err cvt_gptq_dequant(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                              const char *prefix, const struct cvt_awq_info *in, int64_t k0,
                              int64_t k1, int64_t n0, int64_t n1, float *out)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *sc = cvt_source_data(src, in->scales);
    const uint8_t *zp = in->zeros ? cvt_source_data(src, in->zeros) : NULL;
    const int64_t K = in->K, N = in->N, G = in->G, KG = K / G, Ns = n1 - n0;
    const bool ct = in->variant == CVT_VARIANT_CT_PACKED;
    bool act;
    enum cvt_err err = cvt_awq_gidx(src, cfg, prefix, K, &act, NULL); /* validation only */
    if (err)
        return err;
    /* where each source row goes: canonical row = (rows of earlier groups) + (earlier rows of
     * its own group), counted while walking the rows in order */
    int64_t *rank = malloc((size_t)K * sizeof *rank), *seen = calloc((size_t)KG, sizeof *seen);
    const int64_t g0 = k0 / G;
    float *tab = malloc((size_t)((k1 - k0) / G * Ns * 16) * sizeof *tab); /* [g-g0][n][q] (q-z)*s */
    if (!rank || !seen || !tab) {
        qs_log_error("cvt_awq_dequant_source", "linear %s: out of memory", prefix);
        err = CVT_ERR_NOMEM;
        goto out;
    }
    const struct cvt_src_tensor *gt = in->g_idx;
    const uint8_t *gp = act ? cvt_source_data(src, gt) : NULL;
    for (int64_t k = 0; k < K; k++) {
        int64_t g = act ? (gt->dtype == CVT_DT_I64 ? (int64_t)cvt_ld64(gp + 8 * k)
                                                   : (int32_t)cvt_ld32(gp + 4 * k))
                        : k / G;
        rank[k] = g * G + seen[g]++;
    }
    for (int64_t g = k0 / G; g < k1 / G; g++) /* only the groups of the canonical rows asked */
        for (int64_t n = n0; n < n1; n++) {
            uint64_t e = ct ? (uint64_t)n * (uint64_t)KG + (uint64_t)g : (uint64_t)g * (uint64_t)N + (uint64_t)n;
            float s = load_half(sc + 2 * e, in->scales->dtype);
            uint8_t z;
            if (!isfinite(s) || !(s > 0.0f)) {
                err = cvt_awq_bad_scale(src, in->scales, ct ? n : g, ct ? g : n, s);
                goto out;
            }
            if ((err = zero_at(src, cfg, in, zp, g, n, &z)))
                goto out;
            float *t = tab + ((g - g0) * Ns + (n - n0)) * 16;
            for (int q = 0; q < 16; q++)
                t[q] = (float)(q - (int)z) * s;
        }
    /* scatter every nibble of the words that hold rows mapping into [k0, k1) */
    const int64_t r_lo = act ? 0 : k0 / 8, r_hi = act ? K / 8 : k1 / 8;
    if (!ct) {
        for (int64_t r = r_lo; r < r_hi; r++)
            for (int64_t n = n0; n < n1; n++) {
                uint32_t w = cvt_ld32(qw + ((uint64_t)r * (uint64_t)N + (uint64_t)n) * 4);
                for (int i = 0; i < 8; i++, w >>= 4) {
                    int64_t j = rank[8 * r + i];
                    if (j >= k0 && j < k1)
                        out[(j - k0) * Ns + (n - n0)] = tab[((j / G - g0) * Ns + (n - n0)) * 16 + (w & 15u)];
                }
            }
    } else {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t c = r_lo; c < r_hi; c++) {
                uint32_t w = cvt_ld32(qw + ((uint64_t)n * (uint64_t)(K / 8) + (uint64_t)c) * 4);
                for (int i = 0; i < 8; i++, w >>= 4) {
                    int64_t j = rank[8 * c + i];
                    if (j >= k0 && j < k1)
                        out[(j - k0) * Ns + (n - n0)] = tab[((j / G - g0) * Ns + (n - n0)) * 16 + (w & 15u)];
                }
            }
    }
out:
    free(rank);
    free(seen);
    free(tab);
    return err;
}

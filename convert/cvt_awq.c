/*
 * cvt_awq.c - one AWQ linear from the source tensors: variant detection, shape validation,
 * decoding into the canonical form of docs/DESIGN.md section 4, and an independent source
 * dequantization for the converter's self-check.
 *
 * Entry points: cvt_awq_probe(), cvt_awq_load(), cvt_awq_linear_free(),
 * cvt_awq_dequant_source() (cvt_src.h).
 *
 * Layout facts (docs/FORMATS.md sections 2.2, 3-6; restated in our notation, no third-party code):
 *   GEMM      qweight I32 [K, N/8], word c of row k: column 8c+j in nibble REV[j],
 *             REV = {0,4,1,5,2,6,3,7} (the packer's ORDER = {0,2,4,6,1,3,5,7} inverted);
 *             qzeros I32 [K/G, N/8] same packing; scales F16 [K/G, N].
 *   GEMV      qweight I32 [N, K/8] sequential nibbles along K; qzeros I32 [N, Wz] sequential
 *             along groups; scales F16 [N, 8*Wz]; Wz = ceil(ceil((K/G)/8)/m)*m,
 *             m = 1 (G >= 128), 2 (G = 64), 4 (G = 32), other G impossible.
 *   GEMVFast  qweight I16 [N/4, K]: element (n, k) is nibble x%4 of word
 *             64*(k/64) + 16*(n%4) + x/4 of row n/4, with t = k%32,
 *             x = 32*((k%64)/32) + 8*((t%8)/2) + 4*(t%2) + t/8; scales F16 [8*Wz, N];
 *             qzeros F16 [8*Wz, N] = -(s*z) (so z = round(-qz/s)).
 *   llm-awq gen-3: as GEMVFast, zeros named `scaled_zeros`, scales/zeros F16 or BF16.
 * BF16 scales (gen-3 with a bf16 model; other exporters, docs/FORMATS.md P15) are accepted in every
 * variant when each value converts to fp16 exactly; otherwise CVT_ERR_RANGE names the element.
 * Rows/columns past K/G in GEMV/GEMVFast scales and zeros are padding and are ignored.
 *
 * The decoder (decode_*) gathers per output element through REV / the closed form above; the
 * self-check dequantizer (dq_*) is written the other way round - it walks the packed words and
 * scatters each nibble with the packer's ORDER / the inverted closed form - so a mistake in one
 * does not repeat in the other. dq_* look each nibble up in a 16-entry table of (q - z) * s per
 * (group, column), built from the source's own zeros and scales (same single rounding as per
 * element; nothing shared with kernels/ref_pack.c).
 *
 * Tested by tests/test_cvt_src.c (worked example 0x75316420, twins decode identically, decode
 * vs dequant on random data for every variant, NaN/missing/mismatch cases).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_src_int.h"
#include "qs_log.h"        /* qs_log_error */

/* The decoder's gemm_word() hard-codes REV = {0,4,1,5,2,6,3,7} (column j -> nibble REV[j]) as
 * shifts; the self-check walks the packer's direction instead: */
static const unsigned ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* nibble i -> column */

#define PREFIX_MAX 400

/* --- helpers ---------------------------------------------------------------------------------- */

const char *cvt_tensor_shape_str(const struct cvt_src_tensor *t, char *buf, size_t cap)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "%s [", cvt_dtype_str(t->dtype));
    for (int d = 0; d < t->n_dims && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
    return buf;
}

static bool is2(const struct cvt_src_tensor *t, int64_t a, int64_t b)
{
    return t && t->n_dims == 2 && t->shape[0] == a && t->shape[1] == b;
}

/* GEMV/GEMVFast zero width (docs/FORMATS.md 4.2, "calculate_zeros_width"); 0 if G impossible. */
static int64_t zeros_width(int64_t K, int64_t G)
{
    int64_t m = G >= 128 ? 1 : G == 64 ? 2 : G == 32 ? 4 : 0;
    if (!m)
        return 0;
    int64_t groups = K / G;
    int64_t w = (groups + 7) / 8;
    return (w + m - 1) / m * m;
}

static const struct cvt_src_tensor *find2(const struct cvt_source *src, const char *prefix,
                                          const char *suffix)
{
    char name[PREFIX_MAX + 32];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return cvt_source_find(src, name);
}

static float load_half(const uint8_t *p, enum cvt_dtype dt)
{
    uint16_t h = cvt_ld16(p);
    return dt == CVT_DT_BF16 ? cvt_bf16_to_f32(h) : cvt_f16_to_f32(h);
}

/* --- probe ------------------------------------------------------------------------------------ */

/* The rest of cvt_awq_probe once the variant is known: bias dtype and shape, contiguity, *info. */
static enum cvt_err probe_finish(const struct cvt_source *src, const char *prefix, int64_t K,
                                 int64_t N, int64_t G, enum cvt_variant v,
                                 const struct cvt_src_tensor *qw, const struct cvt_src_tensor *zt,
                                 const struct cvt_src_tensor *sc,
                                 const struct cvt_src_tensor *bias, struct cvt_awq_info *info)
{
    const char *dir = cvt_source_dir(src);
    char b1[96];
    if (bias) {
        if (bias->dtype != CVT_DT_F16 && bias->dtype != CVT_DT_BF16 && bias->dtype != CVT_DT_F32) {
            qs_log_error(__func__, "%s: tensor %s.bias has dtype %s, expected F16, BF16 or F32", dir, prefix,
                         cvt_dtype_str(bias->dtype));
            return CVT_ERR_DTYPE;
        }
        if (bias->n_dims != 1 || bias->shape[0] != N) {
            qs_log_error(__func__, "%s: tensor %s.bias is %s, expected [%lld]", dir, prefix,
                         cvt_tensor_shape_str(bias, b1, sizeof b1), (long long)N);
            return CVT_ERR_SHAPE;
        }
    }
    const struct cvt_src_tensor *all[4] = {qw, zt, sc, bias};
    for (int i = 0; i < 4; i++)
        if (all[i] && !all[i]->contiguous) {
            qs_log_error(__func__, "%s: tensor %s is a non-contiguous view: not supported", dir, all[i]->name);
            return CVT_ERR_SHAPE;
        }
    info->variant = v;
    info->K = K;
    info->N = N;
    info->G = G;
    info->qweight = qw;
    info->zeros = zt;
    info->scales = sc;
    info->bias = bias;
    return CVT_ERR_NONE;
}

enum cvt_err cvt_awq_probe(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                           const char *prefix, int64_t K, int64_t N, struct cvt_awq_info *info)
{
    char b1[96], b2[96], b3[96];
    memset(info, 0, sizeof *info);
    if (strlen(prefix) > PREFIX_MAX || K <= 0 || N <= 0) {
        qs_log_error(__func__, "linear %.64s: bad arguments (K %lld, N %lld)", prefix, (long long)K, (long long)N);
        return CVT_ERR_ARG;
    }
    const char *dir = cvt_source_dir(src);
    const struct cvt_src_tensor *qw = find2(src, prefix, "qweight"), *sc = find2(src, prefix, "scales");
    const struct cvt_src_tensor *qz = find2(src, prefix, "qzeros"), *sz = find2(src, prefix, "scaled_zeros");
    const struct cvt_src_tensor *bias = find2(src, prefix, "bias");
    if (cfg->quant.method == CVT_QM_CT) { /* names of cvt_gptq_probe; only weight_packed here */
        qw = find2(src, prefix, "weight_packed");
        sc = find2(src, prefix, "weight_scale");
        if (!qw) {
            qs_log_error(__func__, "%s: tensor %s.weight_packed is missing", dir, prefix);
            return CVT_ERR_MISSING_TENSOR;
        }
    }
    if (!qw) {
        qs_log_error(__func__, "%s: tensor %s.qweight is missing", dir, prefix);
        return CVT_ERR_MISSING_TENSOR;
    }
    if (!sc) {
        qs_log_error(__func__, "%s: %s.%s has no %s.%s", dir, prefix,
                     cfg->quant.method == CVT_QM_CT ? "weight_packed" : "qweight", prefix,
                     cfg->quant.method == CVT_QM_CT ? "weight_scale" : "scales");
        return CVT_ERR_MISSING_TENSOR;
    }
    const int64_t G = cfg->quant.group_size == -1 ? K : cfg->quant.group_size;
    if (G <= 0 || K % G != 0) {
        qs_log_error(__func__, "%s: linear %s: in_features K = %lld is not a multiple of group size %lld",
                     dir, prefix, (long long)K, (long long)G);
        return CVT_ERR_SHAPE;
    }
    const int64_t KG = K / G, Wz = zeros_width(K, G);
    enum cvt_variant v = CVT_VARIANT_UNKNOWN;
    const struct cvt_src_tensor *zt = NULL;

    if (cfg->quant.method != CVT_QM_AWQ) {
        CVT_TRY(cvt_gptq_probe(src, cfg, prefix, K, N, G, info));
        v = info->variant;
        qw = info->qweight;
        zt = info->zeros;
        sc = info->scales;
    } else if (!cfg->quant.zero_point) { /* symmetric AWQ: GEMM words, no zeros (z = 8) */
        CVT_TRY(cvt_awq_zeros_presence(src, cfg, prefix, qz));
        if (qw->dtype != CVT_DT_I32 || sc->dtype != CVT_DT_F16 || N % 8 ||
            !is2(qw, K, N / 8) || !is2(sc, KG, N)) {
            qs_log_error(__func__, "%s: linear %s (symmetric AWQ, K %lld, N %lld, group size %lld): %s.qweight %s, %s.scales %s; expected the GEMM layout qweight I32 [%lld, %lld], scales F16 [%lld, %lld]",
                         dir, prefix, (long long)K, (long long)N, (long long)G, prefix,
                         cvt_tensor_shape_str(qw, b1, sizeof b1), prefix, cvt_tensor_shape_str(sc, b3, sizeof b3),
                         (long long)K, (long long)(N / 8), (long long)KG, (long long)N);
            return CVT_ERR_SHAPE;
        }
        v = CVT_VARIANT_GEMM;
    } else if (qw->dtype == CVT_DT_I32) {
        if (!qz) {
            qs_log_error(__func__, "%s: %s.qweight (I32) has no %s.qzeros", dir, prefix, prefix);
            return CVT_ERR_MISSING_TENSOR;
        }
        if (qz->dtype != CVT_DT_I32 || (sc->dtype != CVT_DT_F16 && sc->dtype != CVT_DT_BF16)) {
            qs_log_error(__func__, "%s: linear %s: I32 qweight needs I32 qzeros and F16 (or BF16) scales, got %s %s, %s %s",
                         dir, prefix, qz->name, cvt_dtype_str(qz->dtype), sc->name, cvt_dtype_str(sc->dtype));
            return CVT_ERR_DTYPE;
        }
        zt = qz;
        bool gemm = N % 8 == 0 && is2(qw, K, N / 8) && is2(qz, KG, N / 8) && is2(sc, KG, N);
        bool gemv = K % 8 == 0 && Wz > 0 && is2(qw, N, K / 8) && is2(qz, N, Wz) && is2(sc, N, 8 * Wz);
        if (gemm && gemv) /* cannot happen for real shapes; let the config decide */
            v = (cfg->quant.variant_mask & CVT_VARIANT_BIT(CVT_VARIANT_GEMV)) ? CVT_VARIANT_GEMV : CVT_VARIANT_GEMM;
        else if (gemm)
            v = CVT_VARIANT_GEMM;
        else if (gemv)
            v = CVT_VARIANT_GEMV;
        else {
            bool want_gemv = !(cfg->quant.variant_mask & CVT_VARIANT_BIT(CVT_VARIANT_GEMM));
            qs_log_error(__func__, "%s: linear %s (K %lld, N %lld, group size %lld from the config): %s.qweight %s, %s.qzeros %s, %s.scales %s match no AWQ layout; %s expects qweight [%lld, %lld], qzeros [%lld, %lld], scales [%lld, %lld]",
                         dir, prefix, (long long)K, (long long)N, (long long)G, prefix, cvt_tensor_shape_str(qw, b1, sizeof b1),
                         prefix, cvt_tensor_shape_str(qz, b2, sizeof b2), prefix, cvt_tensor_shape_str(sc, b3, sizeof b3), want_gemv ? "GEMV" : "GEMM",
                         want_gemv ? (long long)N : (long long)K, want_gemv ? (long long)(K / 8) : (long long)(N / 8),
                         want_gemv ? (long long)N : (long long)KG, want_gemv ? (long long)Wz : (long long)(N / 8),
                         want_gemv ? (long long)N : (long long)KG, want_gemv ? (long long)(8 * Wz) : (long long)N);
            return CVT_ERR_SHAPE;
        }
        if (v == CVT_VARIANT_GEMV && G % 8 != 0) { /* group rows must start on a packed word */
            qs_log_error(__func__, "%s: linear %s: group size %lld is not a multiple of 8: not supported in the GEMV layout",
                         dir, prefix, (long long)G);
            return CVT_ERR_UNSUPPORTED;
        }
    } else if (qw->dtype == CVT_DT_I16) {
        if (qz && sz) {
            qs_log_error(__func__, "%s: linear %s has both qzeros and scaled_zeros: ambiguous layout", dir, prefix);
            return CVT_ERR_VARIANT;
        }
        if (!qz && !sz) {
            qs_log_error(__func__, "%s: %s.qweight (I16) has neither %s.qzeros nor %s.scaled_zeros", dir, prefix,
                         prefix, prefix);
            return CVT_ERR_MISSING_TENSOR;
        }
        v = qz ? CVT_VARIANT_GEMV_FAST : CVT_VARIANT_LLMAWQ_V3;
        zt = qz ? qz : sz;
        bool fp_ok = (sc->dtype == CVT_DT_F16 || sc->dtype == CVT_DT_BF16) &&
                     (zt->dtype == CVT_DT_F16 || zt->dtype == CVT_DT_BF16);
        if (!fp_ok) {
            qs_log_error(__func__, "%s: linear %s (%s): %s %s, %s %s: expected F16%s", dir, prefix,
                         cvt_variant_str(v), sc->name, cvt_dtype_str(sc->dtype), zt->name,
                         cvt_dtype_str(zt->dtype), " or BF16");
            return CVT_ERR_DTYPE;
        }
        if (Wz == 0) {
            qs_log_error(__func__, "%s: linear %s: group size %lld is impossible in the %s layout (32, 64 or >= 128)",
                         dir, prefix, (long long)G, cvt_variant_str(v));
            return CVT_ERR_UNSUPPORTED;
        }
        if (N % 4 != 0 || K % 64 != 0 || !is2(qw, N / 4, K) || !is2(sc, 8 * Wz, N) || !is2(zt, 8 * Wz, N)) {
            qs_log_error(__func__, "%s: linear %s (K %lld, N %lld, group size %lld, %s): %s.qweight %s, zeros %s, %s.scales %s; expected qweight I16 [%lld, %lld], zeros and scales [%lld, %lld] (N %% 4 == 0, K %% 64 == 0)",
                         dir, prefix, (long long)K, (long long)N, (long long)G, cvt_variant_str(v), prefix,
                         cvt_tensor_shape_str(qw, b1, sizeof b1), cvt_tensor_shape_str(zt, b2, sizeof b2), prefix, cvt_tensor_shape_str(sc, b3, sizeof b3),
                         (long long)(N / 4), (long long)K, (long long)(8 * Wz), (long long)N);
            return CVT_ERR_SHAPE;
        }
    } else {
        qs_log_error(__func__, "%s: tensor %s.qweight has dtype %s: AWQ qweight is I32 (GEMM/GEMV) or I16 (GEMVFast, llm-awq gen-3)",
                     dir, prefix, cvt_dtype_str(qw->dtype));
        return CVT_ERR_DTYPE;
    }

    if (!(cfg->quant.variant_mask & CVT_VARIANT_BIT(v))) {
        const char *said = cfg->quant.format[0] ? cfg->quant.format : cfg->quant.version[0] ? cfg->quant.version : "(none: gemm)";
        qs_log_error(__func__, "%s: linear %s is stored in the %s layout but %s says version \"%s\"%s%s: refusing the mismatch",
                     dir, prefix, cvt_variant_str(v), cvt_qcfg_file_str(cfg->quant.from), said,
                     cfg->quant.backend[0] ? ", backend " : "", cfg->quant.backend);
        return CVT_ERR_VARIANT;
    }
    return probe_finish(src, prefix, K, N, G, v, qw, zt, sc, bias, info);
}

static enum cvt_err check_range(const char *prefix, const struct cvt_awq_info *in, int64_t k0, int64_t k1,
                                int64_t n0, int64_t n1, const char *fn)
{
    if (k0 < 0 || k1 > in->K || k0 >= k1 || k0 % in->G || k1 % in->G || n0 < 0 || n1 > in->N || n0 >= n1) {
        qs_log_error(fn, "linear %s: slice rows [%lld, %lld) x columns [%lld, %lld) invalid for K %lld, N %lld, group size %lld",
                     prefix, (long long)k0, (long long)k1, (long long)n0, (long long)n1, (long long)in->K,
                     (long long)in->N, (long long)in->G);
        return CVT_ERR_ARG;
    }
    return CVT_ERR_NONE;
}

/* Scale value check: finite and > 0. */
enum cvt_err cvt_awq_bad_scale(const struct cvt_source *src, const struct cvt_src_tensor *sc, int64_t r, int64_t c,
                              float v)
{
    qs_log_error("cvt_awq", "%s: tensor %s: element [%lld, %lld] is %s%g: scales must be finite and > 0",
                 cvt_source_dir(src), sc->name, (long long)r, (long long)c,
                 isnan(v) ? "NaN " : isinf(v) ? "Inf " : "", v);
    return CVT_ERR_NAN;
}

/* Integer zero point from a scaled zero -(s*z) (GEMVFast / gen-3). */
static enum cvt_err unscale_zero(const struct cvt_source *src, const struct cvt_src_tensor *zt, int64_t r,
                                 int64_t c, float s, float qz, uint8_t *z)
{
    float zf = -qz / s;
    float zr = nearbyintf(zf);
    if (!isfinite(qz) || !(zr >= 0.0f && zr <= 15.0f) || fabsf(zf - zr) > 0.1f) {
        qs_log_error("cvt_awq", "%s: tensor %s: element [%lld, %lld] = %g is not -(scale * z) for an integer z in 0..15 (scale %g, -qz/s = %g)",
                     cvt_source_dir(src), zt->name, (long long)r, (long long)c, qz, s, zf);
        return CVT_ERR_RANGE;
    }
    *z = (uint8_t)zr;
    return CVT_ERR_NONE;
}

/* Scale to canonical fp16 bits (exact) with the value checks. */
enum cvt_err cvt_awq_scale_bits(const struct cvt_source *src, const struct cvt_src_tensor *sc, int64_t r, int64_t c,
                               const uint8_t *p, uint16_t *out, float *val)
{
    uint16_t raw = cvt_ld16(p);
    float v = sc->dtype == CVT_DT_BF16 ? cvt_bf16_to_f32(raw) : cvt_f16_to_f32(raw);
    if (!isfinite(v) || !(v > 0.0f))
        return cvt_awq_bad_scale(src, sc, r, c, v);
    uint16_t h = sc->dtype == CVT_DT_BF16 ? cvt_f32_to_f16(v) : raw;
    if (sc->dtype == CVT_DT_BF16 && cvt_f16_to_f32(h) != v) {
        qs_log_error("cvt_awq", "%s: tensor %s: element [%lld, %lld] = %g (BF16) has no exact fp16 value",
                     cvt_source_dir(src), sc->name, (long long)r, (long long)c, v);
        return CVT_ERR_RANGE;
    }
    *out = h;
    *val = v;
    return CVT_ERR_NONE;
}

/* --- decoder ------------------------------------------------------------------------------------ */

#define BLK 64 /* output rows staged per transposing pass */

/* One GEMM word -> columns 8c..8c+7 (column j from nibble REV[j], shifts 0,16,4,20,8,24,12,28).
 * Hot path of the converter. */
static inline void gemm_word(uint32_t w, uint8_t *d)
{
    d[0] = (uint8_t)(w & 15u);         d[1] = (uint8_t)((w >> 16) & 15u);
    d[2] = (uint8_t)((w >> 4) & 15u);  d[3] = (uint8_t)((w >> 20) & 15u);
    d[4] = (uint8_t)((w >> 8) & 15u);  d[5] = (uint8_t)((w >> 24) & 15u);
    d[6] = (uint8_t)((w >> 12) & 15u); d[7] = (uint8_t)(w >> 28);
}

/* Columns [n0, n1) of one GEMM-packed row (qweight or qzeros) into dst[0 .. n1-n0). */
static void gemm_row(const uint8_t *row, int64_t n0, int64_t n1, uint8_t *dst)
{
    uint8_t t[8];
    const int64_t c_lo = (n0 + 7) / 8, c_hi = n1 / 8;
    if (c_lo > c_hi) { /* inside one word */
        gemm_word(cvt_ld32(row + 4 * (n0 / 8)), t);
        memcpy(dst, t + n0 % 8, (size_t)(n1 - n0));
        return;
    }
    if (n0 % 8) {
        gemm_word(cvt_ld32(row + 4 * (n0 / 8)), t);
        memcpy(dst, t + n0 % 8, (size_t)(8 - n0 % 8));
    }
    for (int64_t c = c_lo; c < c_hi; c++)
        gemm_word(cvt_ld32(row + 4 * c), dst + 8 * c - n0);
    if (8 * c_hi < n1) {
        gemm_word(cvt_ld32(row + 4 * c_hi), t);
        memcpy(dst + 8 * c_hi - n0, t, (size_t)(n1 - 8 * c_hi));
    }
}

/* F16 scales row copy + check (positive, finite, non-zero); index reported as [r, c0 + i]. */
static enum cvt_err f16_scales(const struct cvt_source *src, const struct cvt_src_tensor *sc, const uint8_t *p,
                               int64_t n, int64_t r, int64_t c0, uint16_t *dst)
{
    memcpy(dst, p, (size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = dst[i];
        if ((h & 0x8000u) || (h & 0x7c00u) == 0x7c00u || h == 0)
            return cvt_awq_bad_scale(src, sc, r, c0 + i, cvt_f16_to_f32(h));
    }
    return CVT_ERR_NONE;
}

static enum cvt_err decode_gemm(const struct cvt_source *src, const struct cvt_awq_info *in,
                                struct cvt_awq_linear *o)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *sc = cvt_source_data(src, in->scales);
    const uint8_t *qz = in->zeros ? cvt_source_data(src, in->zeros) : NULL;
    const int64_t N = in->N, W = N / 8, Ns = o->N, G = in->G, n0 = o->n0, n1 = o->n0 + o->N;
    for (int64_t k = o->k0; k < o->k0 + o->K; k++)
        gemm_row(qw + (uint64_t)k * (uint64_t)W * 4, n0, n1, o->q + (k - o->k0) * Ns);
    for (int64_t g = o->k0 / G; g < (o->k0 + o->K) / G; g++) {
        const int64_t gs = g - o->k0 / G;
        if (qz)
            gemm_row(qz + (uint64_t)g * (uint64_t)W * 4, n0, n1, o->z + gs * Ns);
        else /* symmetric AWQ */
            memset(o->z + gs * Ns, 8, (size_t)Ns);
        const uint8_t *srow = sc + ((uint64_t)g * (uint64_t)N + (uint64_t)n0) * 2;
        if (in->scales->dtype == CVT_DT_F16) {
            CVT_TRY(f16_scales(src, in->scales, srow, Ns, g, n0, o->s + gs * Ns));
        } else {
            for (int64_t i = 0; i < Ns; i++) {
                float v;
                CVT_TRY(cvt_awq_scale_bits(src, in->scales, g, n0 + i, srow + 2 * i, o->s + gs * Ns + i, &v));
            }
        }
    }
    return CVT_ERR_NONE;
}

/*
 * The output-major variants (GEMV, GEMVFast) store W^T: decoding reads source rows n (K codes
 * each, sequential) into a staging tile stage[BLK][K_s + STAGE_PAD] and then writes each output
 * row k as BLK contiguous bytes. The pad keeps the BLK staging rows in distinct cache sets when K
 * is a power of two (a plain strided transpose thrashes one L1 set at stride 4096).
 */
#define STAGE_PAD 64
#define STAGE_K   512 /* K chunk per staging pass: BLK x STAGE_K stays in L1/L2 */

static void stage_to_rows(const uint8_t *stage, int64_t sstride, int64_t rows, int64_t kw, uint8_t *dst,
                          int64_t dstride)
{
    for (int64_t k = 0; k < kw; k++) {
        uint8_t *d = dst + k * dstride;
        for (int64_t j = 0; j < rows; j++)
            d[j] = stage[j * sstride + k];
    }
}

static enum cvt_err stage_alloc(const char *name, int64_t kw, uint8_t **stage)
{
    *stage = malloc((size_t)(BLK * (kw + STAGE_PAD)));
    if (!*stage) {
        qs_log_error("cvt_awq_load", "linear %s: out of memory", name);
        return CVT_ERR_NOMEM;
    }
    return CVT_ERR_NONE;
}

static enum cvt_err decode_gemv(const struct cvt_source *src, const struct cvt_awq_info *in,
                                struct cvt_awq_linear *o)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *qz = cvt_source_data(src, in->zeros),
                  *sc = cvt_source_data(src, in->scales);
    const int64_t K = in->K, G = in->G, Ns = o->N, Wz = in->zeros->shape[1], SW = in->scales->shape[1];
    const int64_t k0 = o->k0, k1 = o->k0 + o->K, n0 = o->n0, n1 = o->n0 + o->N, kw = k1 - k0;
    const int64_t g0 = k0 / G, g1 = k1 / G, ss = STAGE_K + STAGE_PAD;
    uint8_t *stage;
    (void)kw;
    CVT_TRY(stage_alloc(in->qweight->name, STAGE_K, &stage));
    for (int64_t nb = n0; nb < n1; nb += BLK) {
        const int64_t rows = nb + BLK < n1 ? BLK : n1 - nb;
        for (int64_t kc = k0; kc < k1; kc += STAGE_K) { /* k0 % 8 == 0 (G >= 32), STAGE_K % 8 == 0 */
            const int64_t kce = kc + STAGE_K < k1 ? kc + STAGE_K : k1;
            for (int64_t j = 0; j < rows; j++) { /* sequential nibbles along K */
                const uint8_t *row = qw + ((uint64_t)(nb + j) * (uint64_t)(K / 8) + (uint64_t)(kc / 8)) * 4;
                uint8_t *st = stage + j * ss;
                for (int64_t c = 0; c < (kce - kc) / 8; c++) {
                    uint32_t w = cvt_ld32(row + 4 * c);
                    for (int i = 0; i < 8; i++)
                        st[8 * c + i] = (uint8_t)((w >> (4 * i)) & 0xfu);
                }
            }
            stage_to_rows(stage, ss, rows, kce - kc, o->q + (kc - k0) * Ns + (nb - n0), Ns);
        }
    }
    free(stage);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *zrow = qz + (uint64_t)n * (uint64_t)Wz * 4;
        const uint8_t *srow = sc + (uint64_t)n * (uint64_t)SW * 2;
        for (int64_t g = g0; g < g1; g++) {
            uint32_t w = cvt_ld32(zrow + (g / 8) * 4);
            o->z[(g - g0) * Ns + n - n0] = (uint8_t)((w >> (4 * (g % 8))) & 0xfu);
            float v;
            CVT_TRY(cvt_awq_scale_bits(src, in->scales, n, g, srow + g * 2, &o->s[(g - g0) * Ns + n - n0], &v));
        }
    }
    return CVT_ERR_NONE;
}

static enum cvt_err decode_gemv_fast(const struct cvt_source *src, const struct cvt_awq_info *in,
                                     struct cvt_awq_linear *o)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *qz = cvt_source_data(src, in->zeros),
                  *sc = cvt_source_data(src, in->scales);
    const int64_t K = in->K, N = in->N, G = in->G, Ns = o->N;
    const int64_t k0 = o->k0, k1 = o->k0 + o->K, n0 = o->n0, n1 = o->n0 + o->N, kw = k1 - k0, ss = kw + STAGE_PAD;
    /* Closed form (docs/FORMATS.md 5.2), per k%64: word offset (without the 16*r term) and shift. */
    uint8_t wofs[64], sh[64];
    for (int kk = 0; kk < 64; kk++) {
        int t = kk % 32;
        int x = 32 * (kk / 32) + 8 * ((t % 8) / 2) + 4 * (t % 2) + t / 8;
        wofs[kk] = (uint8_t)(x / 4);
        sh[kk] = (uint8_t)(4 * (x % 4));
    }
    uint8_t *stage;
    (void)kw;
    (void)ss;
    const int64_t sst = STAGE_K + STAGE_PAD;
    CVT_TRY(stage_alloc(in->qweight->name, STAGE_K, &stage));
    for (int64_t nb = n0; nb < n1; nb += BLK) {
        const int64_t rows = nb + BLK < n1 ? BLK : n1 - nb;
        for (int64_t kc = k0; kc < k1; kc += STAGE_K) {
            const int64_t kce = kc + STAGE_K < k1 ? kc + STAGE_K : k1;
            for (int64_t j = 0; j < rows; j++) {
                const int64_t n = nb + j;
                const uint8_t *row = qw + (uint64_t)(n / 4) * (uint64_t)K * 2 + (uint64_t)(16 * (n % 4)) * 2;
                uint8_t *st = stage + j * sst - kc;
                for (int64_t k = kc; k < kce; k++)
                    st[k] = (uint8_t)((cvt_ld16(row + (64 * (k / 64) + wofs[k % 64]) * 2) >> sh[k % 64]) & 0xfu);
            }
            stage_to_rows(stage, sst, rows, kce - kc, o->q + (kc - k0) * Ns + (nb - n0), Ns);
        }
    }
    free(stage);
    const int64_t g0 = k0 / G, g1 = k1 / G;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t n = n0; n < n1; n++) {
            uint64_t e = ((uint64_t)g * (uint64_t)N + (uint64_t)n) * 2;
            float s;
            int64_t at = (g - g0) * Ns + n - n0;
            CVT_TRY(cvt_awq_scale_bits(src, in->scales, g, n, sc + e, &o->s[at], &s));
            CVT_TRY(unscale_zero(src, in->zeros, g, n, s, load_half(qz + e, in->zeros->dtype), &o->z[at]));
        }
    return CVT_ERR_NONE;
}

static enum cvt_err read_bias(const struct cvt_source *src, const struct cvt_awq_info *in, int64_t n0,
                              int64_t Ns, float *out)
{
    const struct cvt_src_tensor *b = in->bias;
    const uint8_t *p = cvt_source_data(src, b);
    size_t es = cvt_dtype_size(b->dtype);
    for (int64_t n = 0; n < Ns; n++) {
        const uint8_t *e = p + (uint64_t)(n0 + n) * es;
        float v;
        if (b->dtype == CVT_DT_F32)
            memcpy(&v, e, 4);
        else
            v = load_half(e, b->dtype);
        if (!isfinite(v)) {
            qs_log_error("cvt_awq", "%s: tensor %s: element %lld is %s", cvt_source_dir(src), b->name,
                         (long long)(n0 + n), isnan(v) ? "NaN" : "Inf");
            return CVT_ERR_NAN;
        }
        out[n] = v;
    }
    return CVT_ERR_NONE;
}

/* Drop the source pages a slice touched: for GEMM only its rows (the converter decodes
 * k-blocks of one linear from several threads), for the output-major layouts every row was
 * touched, so the whole tensors. */
static void release_all(const struct cvt_source *src, const struct cvt_awq_info *in, int64_t k0, int64_t k1)
{
    if (in->variant == CVT_VARIANT_GEMM) {
        const uint64_t qrow = (uint64_t)(in->N / 8) * 4, srow = (uint64_t)in->N * 2;
        const uint64_t g0 = (uint64_t)(k0 / in->G), g1 = (uint64_t)(k1 / in->G);
        cvt_source_release_range(src, in->qweight, (uint64_t)k0 * qrow, (uint64_t)(k1 - k0) * qrow);
        if (in->zeros)
            cvt_source_release_range(src, in->zeros, g0 * qrow, (g1 - g0) * qrow);
        cvt_source_release_range(src, in->scales, g0 * srow, (g1 - g0) * srow);
    } else {
        cvt_source_release(src, in->qweight);
        if (in->zeros)
            cvt_source_release(src, in->zeros);
        cvt_source_release(src, in->scales);
        if (in->g_idx)
            cvt_source_release(src, in->g_idx);
    }
    if (in->bias)
        cvt_source_release(src, in->bias);
}

void cvt_awq_linear_free(struct cvt_awq_linear *lin)
{
    if (!lin)
        return;
    free(lin->q);
    free(lin->z);
    free(lin->s);
    free(lin->bias);
    memset(lin, 0, sizeof *lin);
}

enum cvt_err cvt_awq_load(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                          const char *prefix, int64_t K, int64_t N,
                          int64_t k0, int64_t k1, int64_t n0, int64_t n1,
                          struct cvt_awq_linear *out)
{
    struct cvt_awq_info in;
    memset(out, 0, sizeof *out);
    CVT_TRY(cvt_awq_probe(src, cfg, prefix, K, N, &in));
    CVT_TRY(check_range(prefix, &in, k0, k1, n0, n1, __func__));
    const int64_t Ks = k1 - k0, Ns = n1 - n0, Gs = Ks / in.G;
    out->variant = in.variant;
    out->K = Ks;
    out->N = Ns;
    out->G = in.G;
    out->k0 = k0;
    out->n0 = n0;
    out->q = malloc((size_t)(Ks * Ns));
    out->z = malloc((size_t)(Gs * Ns));
    out->s = malloc((size_t)(Gs * Ns) * sizeof *out->s);
    out->bias = in.bias ? malloc((size_t)Ns * sizeof *out->bias) : NULL;
    enum cvt_err err = CVT_ERR_NOMEM;
    if (!out->q || !out->z || !out->s || (in.bias && !out->bias)) {
        qs_log_error(__func__, "linear %s: out of memory for a %lld x %lld slice", prefix, (long long)Ks, (long long)Ns);
        goto out_err;
    }
    switch (in.variant) {
    case CVT_VARIANT_GEMM: err = decode_gemm(src, &in, out); break;
    case CVT_VARIANT_GEMV: err = decode_gemv(src, &in, out); break;
    case CVT_VARIANT_GEMV_FAST:
    case CVT_VARIANT_LLMAWQ_V3: err = decode_gemv_fast(src, &in, out); break;
    case CVT_VARIANT_GPTQ:
    case CVT_VARIANT_CT_PACKED: err = cvt_gptq_decode(src, cfg, prefix, &in, out); break;
    default: err = CVT_ERR_VARIANT; break;
    }
    if (!err && in.bias)
        err = read_bias(src, &in, n0, Ns, out->bias);
    release_all(src, &in, k0, k1);
    if (err)
        goto out_err;
    return CVT_ERR_NONE;
out_err:
    cvt_awq_linear_free(out);
    return err;
}

/* --- independent source dequantization (self-check) ------------------------------------------- */

/* Scales [g0, g1) x [n0, n1) as float (scales_at(g, n) gives the element's byte offset) and
 * integer zeros; shared by the three self-check paths. Values are checked as in the decoder. */
struct dq_groups {
    float   *s;  /* [g1-g0][n1-n0] */
    uint8_t *z;  /* [g1-g0][n1-n0] */
};

static void dq_groups_free(struct dq_groups *d)
{
    free(d->s);
    free(d->z);
}

static enum cvt_err dq_alloc(const char *prefix, int64_t Gs, int64_t Ns, struct dq_groups *d)
{
    d->s = malloc((size_t)(Gs * Ns) * sizeof *d->s);
    d->z = malloc((size_t)(Gs * Ns));
    if (!d->s || !d->z) {
        dq_groups_free(d);
        qs_log_error("cvt_awq_dequant_source", "linear %s: out of memory", prefix);
        return CVT_ERR_NOMEM;
    }
    return CVT_ERR_NONE;
}

/* For the output-major variants: the table of (float)(q - z) * s (one rounding, as computed per
 * element) for columns [na, nz) and groups [ga, ga + ngc) of d (whose rows start at group g0 and
 * column n0, Ns wide): tab[((n - na) * ngc + (g - ga)) * 16 + q]. Built per staging block, so it
 * stays small (at most BLK x (STAGE_K/G + 2) x 16 floats). */
static void dq_block_table(const struct dq_groups *d, int64_t Ns, int64_t g0, int64_t n0,
                           int64_t na, int64_t nz, int64_t ga, int64_t ngc, float *tab)
{
    for (int64_t n = na; n < nz; n++)
        for (int64_t gg = 0; gg < ngc; gg++) {
            const int64_t i = (ga + gg - g0) * Ns + n - n0;
            float *t = tab + ((n - na) * ngc + gg) * 16;
            for (int q = 0; q < 16; q++)
                t[q] = (float)(q - (int)d->z[i]) * d->s[i];
        }
}

/* GEMM: walk each packed word and scatter nibble i to column 8c + ORDER[i]. Per group, every
 * column's zero and scale become a 16-entry table tab[n][q] = (float)(q - z) * s (the same
 * single rounding as computing it per element), so the row loop is a lookup per nibble. */
static enum cvt_err dq_gemm(const struct cvt_source *src, const struct cvt_awq_info *in, int64_t k0, int64_t k1,
                            int64_t n0, int64_t n1, float *out)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *sc = cvt_source_data(src, in->scales);
    const uint8_t *qz = in->zeros ? cvt_source_data(src, in->zeros) : NULL; /* NULL: z = 8 */
    const int64_t N = in->N, W = N / 8, Ns = n1 - n0, G = in->G, g0 = k0 / G, g1 = k1 / G;
    float *tab = malloc((size_t)Ns * 16 * sizeof *tab); /* [Ns][16] for the current group */
    uint8_t *z = malloc((size_t)Ns);
    if (!tab || !z) {
        free(tab);
        free(z);
        qs_log_error("cvt_awq_dequant_source", "linear %s: out of memory", in->qweight->name);
        return CVT_ERR_NOMEM;
    }
    enum cvt_err err = CVT_ERR_NONE;
    for (int64_t g = g0; g < g1 && !err; g++) {
        for (int64_t c = n0 / 8; c < (n1 + 7) / 8; c++) {
            uint32_t wz = qz ? cvt_ld32(qz + ((uint64_t)g * (uint64_t)W + (uint64_t)c) * 4) : 0x88888888u;
            for (unsigned i = 0; i < 8; i++) {
                int64_t col = 8 * c + ORDER[i];
                if (col >= n0 && col < n1)
                    z[col - n0] = (uint8_t)((wz >> (4 * i)) & 0xfu);
            }
        }
        for (int64_t n = n0; n < n1; n++) {
            float s = load_half(sc + ((uint64_t)g * (uint64_t)N + (uint64_t)n) * 2, in->scales->dtype);
            if (!isfinite(s) || !(s > 0.0f)) {
                err = cvt_awq_bad_scale(src, in->scales, g, n, s);
                break;
            }
            float *t = tab + (n - n0) * 16;
            for (int q = 0; q < 16; q++)
                t[q] = (float)(q - (int)z[n - n0]) * s;
        }
        for (int64_t k = g * G; k < (g + 1) * G && !err; k++) { /* k0 % G == k1 % G == 0 */
            float *orow = out + (k - k0) * Ns; /* orow[col - n0] */
            for (int64_t c = n0 / 8; c < (n1 + 7) / 8; c++) {
                uint32_t wq = cvt_ld32(qw + ((uint64_t)k * (uint64_t)W + (uint64_t)c) * 4);
                if (8 * c >= n0 && 8 * c + 8 <= n1) { /* whole word (hot path): nibble i -> ORDER[i] */
                    const float *t8 = tab + (8 * c - n0) * 16;
                    float *oc = orow + (8 * c - n0);
                    oc[0] = t8[0 * 16 + (wq & 15u)];
                    oc[2] = t8[2 * 16 + ((wq >> 4) & 15u)];
                    oc[4] = t8[4 * 16 + ((wq >> 8) & 15u)];
                    oc[6] = t8[6 * 16 + ((wq >> 12) & 15u)];
                    oc[1] = t8[1 * 16 + ((wq >> 16) & 15u)];
                    oc[3] = t8[3 * 16 + ((wq >> 20) & 15u)];
                    oc[5] = t8[5 * 16 + ((wq >> 24) & 15u)];
                    oc[7] = t8[7 * 16 + (wq >> 28)];
                    continue;
                }
                for (unsigned i = 0; i < 8; i++) {
                    int64_t col = 8 * c + ORDER[i];
                    if (col >= n0 && col < n1)
                        orow[col - n0] = tab[(col - n0) * 16 + ((wq >> (4 * i)) & 0xfu)];
                }
            }
        }
    }
    free(tab);
    free(z);
    return err;
}

/* GEMV: W[n][k] = (nib(qweight[n][k/8], k%8) - nib(qzeros[n][g/8], g%8)) * scales[n][g]. */
static enum cvt_err dq_gemv(const struct cvt_source *src, const struct cvt_awq_info *in, int64_t k0, int64_t k1,
                            int64_t n0, int64_t n1, float *out)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *qz = cvt_source_data(src, in->zeros),
                  *sc = cvt_source_data(src, in->scales);
    const int64_t KW = in->K / 8, ZW = in->zeros->shape[1], SW = in->scales->shape[1], Ns = n1 - n0, G = in->G;
    const int64_t g0 = k0 / G, g1 = k1 / G;
    struct dq_groups d = {0};
    CVT_TRY(dq_alloc(in->qweight->name, g1 - g0, Ns, &d));
    for (int64_t n = n0; n < n1; n++)
        for (int64_t g = g0; g < g1; g++) {
            float s = load_half(sc + ((uint64_t)n * (uint64_t)SW + (uint64_t)g) * 2, in->scales->dtype);
            if (!isfinite(s) || !(s > 0.0f)) {
                dq_groups_free(&d);
                return cvt_awq_bad_scale(src, in->scales, n, g, s);
            }
            uint32_t wz = cvt_ld32(qz + ((uint64_t)n * (uint64_t)ZW + (uint64_t)(g >> 3)) * 4);
            d.s[(g - g0) * Ns + n - n0] = s;
            d.z[(g - g0) * Ns + n - n0] = (uint8_t)((wz >> ((g & 7) * 4)) & 15u);
        }
    /* Rows n in order (sequential source reads) into a padded float stage, then out rows k;
     * each element through the block's (column, group) table of (q - z) * s. */
    const int64_t ss = STAGE_K + STAGE_PAD / 4, tg = STAGE_K / G + 2;
    float *stage = malloc((size_t)(BLK * ss) * sizeof *stage);
    float *tab = malloc((size_t)(BLK * tg * 16) * sizeof *tab);
    if (!stage || !tab) {
        free(stage);
        free(tab);
        dq_groups_free(&d);
        qs_log_error("cvt_awq_dequant_source", "linear %s: out of memory", in->qweight->name);
        return CVT_ERR_NOMEM;
    }
    for (int64_t nb = n0; nb < n1; nb += BLK) {
        const int64_t rows = nb + BLK < n1 ? BLK : n1 - nb;
        for (int64_t kc = k0; kc < k1; kc += STAGE_K) {
            const int64_t kce = kc + STAGE_K < k1 ? kc + STAGE_K : k1;
            const int64_t ga = kc / G, ngc = (kce - 1) / G - ga + 1;
            int32_t gofs[STAGE_K]; /* k -> table offset of its group, hoisted out of the loop */
            for (int64_t k = kc; k < kce; k++)
                gofs[k - kc] = (int32_t)((k / G - ga) * 16);
            dq_block_table(&d, Ns, g0, n0, nb, nb + rows, ga, ngc, tab);
            for (int64_t n = nb; n < nb + rows; n++) {
                const float *tn = tab + (n - nb) * ngc * 16;
                for (int64_t k = kc; k < kce; k++) {
                    uint32_t wq = cvt_ld32(qw + ((uint64_t)n * (uint64_t)KW + (uint64_t)(k >> 3)) * 4);
                    int q = (int)(wq >> ((k & 7) * 4)) & 15;
                    stage[(n - nb) * ss + (k - kc)] = tn[gofs[k - kc] + q];
                }
            }
            for (int64_t k = kc; k < kce; k++)
                for (int64_t j = 0; j < rows; j++)
                    out[(k - k0) * Ns + (nb - n0) + j] = stage[j * ss + (k - kc)];
        }
    }
    free(stage);
    free(tab);
    dq_groups_free(&d);
    return CVT_ERR_NONE;
}

/* GEMVFast / gen-3: walk the I16 words of each interleaved row and invert the packing:
 * word wi of row R: block b = wi/64, o = wi%64, r = o/16; nibble i: x = 4*(o%16) + i,
 * h = x/32, p = x%32, t = 8*(p%4) + 2*(p/8) + (p/4)%2; k = 64b + 32h + t, n = 4R + r.
 * Loop order: 64-wide K block b, then rows R, so writes stay inside a 64 x 64 tile. */
static enum cvt_err dq_gemv_fast(const struct cvt_source *src, const struct cvt_awq_info *in, int64_t k0,
                                 int64_t k1, int64_t n0, int64_t n1, float *out)
{
    const uint8_t *qw = cvt_source_data(src, in->qweight), *qz = cvt_source_data(src, in->zeros),
                  *sc = cvt_source_data(src, in->scales);
    const int64_t K = in->K, N = in->N, Ns = n1 - n0, G = in->G, g0 = k0 / G, g1 = k1 / G;
    struct dq_groups d = {0};
    CVT_TRY(dq_alloc(in->qweight->name, g1 - g0, Ns, &d));
    for (int64_t g = g0; g < g1; g++)
        for (int64_t n = n0; n < n1; n++) {
            uint64_t e = ((uint64_t)g * (uint64_t)N + (uint64_t)n) * 2;
            float s = load_half(sc + e, in->scales->dtype);
            enum cvt_err err = CVT_ERR_NONE;
            if (!isfinite(s) || !(s > 0.0f))
                err = cvt_awq_bad_scale(src, in->scales, g, n, s);
            if (!err)
                err = unscale_zero(src, in->zeros, g, n, s, load_half(qz + e, in->zeros->dtype),
                                   &d.z[(g - g0) * Ns + n - n0]);
            if (err) {
                dq_groups_free(&d);
                return err;
            }
            d.s[(g - g0) * Ns + n - n0] = s;
        }
    /* Interleaved rows R (4 output rows each) in order into a padded float stage of BLK output
     * rows, then out rows k. */
    const int64_t ss = STAGE_K + STAGE_PAD / 4, nb0 = n0 / 4 * 4, tg = STAGE_K / G + 2;
    float *stage = malloc((size_t)(BLK * ss) * sizeof *stage);
    float *tab = malloc((size_t)(BLK * tg * 16) * sizeof *tab); /* (column, group) tables */
    if (!stage || !tab) {
        free(stage);
        free(tab);
        dq_groups_free(&d);
        qs_log_error("cvt_awq_dequant_source", "linear %s: out of memory", in->qweight->name);
        return CVT_ERR_NOMEM;
    }
    for (int64_t nb = nb0; nb < n1; nb += BLK) /* nb % 4 == 0: whole interleaved rows */
        for (int64_t kc = k0 / 64 * 64; kc < k1; kc += STAGE_K) { /* 64-aligned chunks */
        const int64_t ne = nb + BLK < n1 ? nb + BLK : n1, kce = kc + STAGE_K < k1 ? kc + STAGE_K : k1;
        const int64_t klo = kc > k0 ? kc : k0;
        const int64_t ga = klo / G, ngc = (kce - 1) / G - ga + 1, na = nb > n0 ? nb : n0;
        int64_t gofs[STAGE_K]; /* k -> table offset of its group (k in [klo, kce)) */
        for (int64_t k = klo; k < kce; k++)
            gofs[k - kc] = (k / G - ga) * 16;
        dq_block_table(&d, Ns, g0, n0, na, ne, ga, ngc, tab);
        for (int64_t R = nb / 4; R < (ne + 3) / 4; R++)
            for (int64_t wi = kc; wi < 64 * ((kce + 63) / 64); wi++) {
                const int64_t b = wi / 64, o = wi % 64, n = 4 * R + o / 16;
                if (n < n0 || n >= ne)
                    continue;
                uint16_t w = cvt_ld16(qw + ((uint64_t)R * (uint64_t)K + (uint64_t)wi) * 2);
                for (int i = 0; i < 4; i++) {
                    const int64_t x = 4 * (o % 16) + i, h = x / 32, p = x % 32;
                    const int64_t t = 8 * (p % 4) + 2 * (p / 8) + (p / 4) % 2, k = 64 * b + 32 * h + t;
                    if (k < klo || k >= kce)
                        continue;
                    int q = (w >> (4 * i)) & 15;
                    stage[(n - nb) * ss + (k - kc)] = tab[(n - na) * ngc * 16 + gofs[k - kc] + q];
                }
            }
        const int64_t jlo = nb < n0 ? n0 - nb : 0;
        for (int64_t k = klo; k < kce; k++)
            for (int64_t j = jlo; j < ne - nb; j++)
                out[(k - k0) * Ns + (nb + j - n0)] = stage[j * ss + (k - kc)];
    }
    free(stage);
    free(tab);
    dq_groups_free(&d);
    return CVT_ERR_NONE;
}

enum cvt_err cvt_awq_dequant_source(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                                    const char *prefix, int64_t K, int64_t N,
                                    int64_t k0, int64_t k1, int64_t n0, int64_t n1, float *out)
{
    struct cvt_awq_info in;
    CVT_TRY(cvt_awq_probe(src, cfg, prefix, K, N, &in));
    CVT_TRY(check_range(prefix, &in, k0, k1, n0, n1, __func__));
    enum cvt_err err;
    switch (in.variant) {
    case CVT_VARIANT_GEMM: err = dq_gemm(src, &in, k0, k1, n0, n1, out); break;
    case CVT_VARIANT_GEMV: err = dq_gemv(src, &in, k0, k1, n0, n1, out); break;
    case CVT_VARIANT_GEMV_FAST:
    case CVT_VARIANT_LLMAWQ_V3: err = dq_gemv_fast(src, &in, k0, k1, n0, n1, out); break;
    case CVT_VARIANT_GPTQ:
    case CVT_VARIANT_CT_PACKED: err = cvt_gptq_dequant(src, cfg, prefix, &in, k0, k1, n0, n1, out); break;
    default: err = CVT_ERR_VARIANT; break;
    }
    release_all(src, &in, k0, k1);
    return err;
}

/*
 * cvt_src_int.h - helpers shared by the converter input side (cvt_safetensors.c, cvt_torchbin.c,
 * cvt_config.c, cvt_source.c, cvt_awq.c). Not a public header: the API is cvt_src.h.
 */
#ifndef CVT_SRC_INT_H
#define CVT_SRC_INT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cvt_src.h"
#include "qs_json.h" /* enum qs_json_err */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "qshard's converter reads little-endian files by plain loads: little-endian hosts only"
#endif

/* Unaligned little-endian loads (memcpy: never cast an unaligned pointer, docs/FORMATS.md P19). */
static inline uint16_t cvt_ld16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t cvt_ld32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t cvt_ld64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* IEEE binary16 bits -> float (exact). */
static inline float cvt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: man * 2^-24 */
            float f = (float)man * 0x1p-24f;
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* bfloat16 bits -> float (exact). */
static inline float cvt_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float -> binary16 bits, round to nearest even; overflow gives +-Inf (0x7c00), NaN a quiet NaN. */
static inline uint16_t cvt_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* >= 65520: rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal 2^-14: subnormal or zero */
        if (ax < 0x33000000u) /* < 2^-25: rounds to 0 */
            return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 -> result = m >> (shift - 10 + 13)... */
        /* value = m * 2^(e-150); in units of 2^-24: m * 2^(e-126) = m >> (126 - e) */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax - 0x38000000u) >> 13); /* rebias 127 -> 15 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

/* True if s[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF) without NUL. */
static inline bool cvt_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c == 0)
            return false;
        if (c < 0x80) { i++; continue; }
        size_t len; uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
        else return false;
        if (n - i < len)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += len;
    }
    return true;
}

/* a * b into *r; false on overflow of int64 (both >= 0). */
static inline bool cvt_mul_ok(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}

/* Printable form of a (possibly hostile) name for messages: copies at most cap-1 bytes,
 * replacing bytes outside printable ASCII by '?'. */
static inline const char *cvt_printable(const char *s, size_t n, char *buf, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    buf[k] = 0;
    return buf;
}

/* A format/qs_json.h reader's status as a converter status (the reader reported it). */
static inline enum cvt_err cvt_from_json(enum qs_json_err e)
{
    switch (e) {
    case QS_JSON_OK: return CVT_ERR_NONE;
    case QS_JSON_ERR_SYNTAX: return CVT_ERR_JSON;
    case QS_JSON_ERR_UNSUPPORTED: return CVT_ERR_UNSUPPORTED;
    case QS_JSON_ERR_NOMEM: return CVT_ERR_NOMEM;
    case QS_JSON_ERR_VALUE: break;
    }
    return CVT_ERR_CONFIG;
}

/* Forward a qs_json reader's non-zero status as a converter status. */
#define CVT_TRY_JSON(expr) CVT_TRY(cvt_from_json(expr))

struct cJSON;

/* One quant config object as read (cvt_config.c read_qparams; GPTQ and compressed-tensors keys
 * by cvt_qcfg.c). */
struct cvt_qparams {
    bool    present;
    enum cvt_qmethod method;
    int64_t bits, group;           /* group -1: one group per linear */
    bool    zero_point;            /* AWQ zero_point; GPTQ !sym; compressed-tensors !symmetric */
    bool    act_order;             /* GPTQ desc_act; compressed-tensors actorder group/dynamic */
    bool    gptq_v1;               /* GPTQ checkpoint_format "gptq": qzeros store z - 1 */
    char    version[32], format[32], backend[32], quant_method[32];
    const struct cJSON *skip;      /* modules_to_not_convert (borrowed from the tree) */
    const struct cJSON *ignore;    /* compressed-tensors "ignore" (borrowed) */
};

/* cvt_qcfg.c: the GPTQ keys / the compressed-tensors keys of quant config object o into *q
 * (method, bits, group, zero_point, act_order, gptq_v1, format); everything not implemented is
 * refused by name. cvt_qcfg_ignore: the validated "ignore" list into cfg->quant.ignore. Errors:
 * CVT_ERR_CONFIG, CVT_ERR_UNSUPPORTED, CVT_ERR_NOMEM, reported once. */
struct qs_json_ctx;
enum cvt_err cvt_qcfg_gptq(const struct qs_json_ctx *c, const struct cJSON *o, struct cvt_qparams *q);
enum cvt_err cvt_qcfg_ct(const struct qs_json_ctx *c, const struct cJSON *o, struct cvt_qparams *q);
enum cvt_err cvt_qcfg_ignore(const struct qs_json_ctx *c, const struct cJSON *ign,
                             struct cvt_hf_config *cfg);

/* cvt_awq.c helpers shared with cvt_gptq.c: "F16 [a, b]" text; a scale that is not finite and
 * > 0 reported (CVT_ERR_NAN); a half scale to canonical fp16 bits with the checks (BF16 must be
 * exact in fp16: CVT_ERR_RANGE). */
const char *cvt_tensor_shape_str(const struct cvt_src_tensor *t, char *buf, size_t cap);
enum cvt_err cvt_awq_bad_scale(const struct cvt_source *src, const struct cvt_src_tensor *sc,
                               int64_t r, int64_t c, float v);
enum cvt_err cvt_awq_scale_bits(const struct cvt_source *src, const struct cvt_src_tensor *sc,
                                int64_t r, int64_t c, const uint8_t *p, uint16_t *out, float *val);

/* cvt_gptq.c: GPTQ and compressed-tensors linears (K, N, G of the config; info filled but for
 * K/N/G/bias, which cvt_awq_probe adds), their canonical decode into o (slice fields set by the
 * caller; canonical rows in group order for act-order) and the independent dequantization of
 * canonical rows [k0, k1) x columns [n0, n1). cvt_awq_zeros_presence: symmetric AWQ's "no
 * qzeros" rule. Errors as cvt_awq_probe / cvt_awq_load. */
enum cvt_err cvt_gptq_probe(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                            const char *prefix, int64_t K, int64_t N, int64_t G,
                            struct cvt_awq_info *info);
enum cvt_err cvt_gptq_decode(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                             const char *prefix, const struct cvt_awq_info *in,
                             struct cvt_awq_linear *o);
enum cvt_err cvt_gptq_dequant(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                              const char *prefix, const struct cvt_awq_info *in, int64_t k0,
                              int64_t k1, int64_t n0, int64_t n1, float *out);
enum cvt_err cvt_awq_zeros_presence(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                                    const char *prefix, const struct cvt_src_tensor *z);

/* cvt_safetensors.c */
enum cvt_dtype cvt_dtype_from_str(const char *s);

/* cvt_source.c: a parsed `*.index.json` (also driven by tests/fuzz_config.c). */
struct cJSON;
struct cvt_index {
    struct cJSON        *root;        /* owned parse tree */
    const struct cJSON  *weight_map;  /* borrowed: tensor name -> shard file name */
    const char         **shards;      /* owned array of distinct shard names (borrowed strings) */
    size_t               n_shards;
    bool                 has_total;   /* metadata.total_size present */
    double               total_size;
};
/* Parse and validate an index: JSON object with a non-empty "weight_map" of plain shard file
 * names ending in `suffix` (no '/', no leading '.'), UTF-8 tensor names, at most 4096 shards.
 * Errors: CVT_ERR_JSON, CVT_ERR_INDEX, CVT_ERR_NOMEM; idx is freed on error. */
enum cvt_err cvt_index_parse(const char *where, const char *index_name, const char *text, size_t size,
                             const char *suffix, struct cvt_index *idx);
void cvt_index_free(struct cvt_index *idx);

/* Grow helper: ensure *cap >= need for an array of elem-size items (doubling). */
bool cvt_grow(void **ptr, size_t *cap, size_t need, size_t elem);

#endif /* CVT_SRC_INT_H */

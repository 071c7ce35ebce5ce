/*
 * cvt_config.c - read config.json, the AWQ quant config (embedded `quantization_config`,
 * quant_config.json or quantize_config.json) and generation_config.json into one validated
 * `struct cvt_hf_config`.
 *
 * Entry points: cvt_config_parse(), cvt_config_free(), cvt_config_skips_module(), the *_str()
 * helpers for qcfg-file / variant (cvt_src.h).
 *
 * The architecture is a descriptor (convert/cvt_arch.h) found from "architectures" /
 * "model_type"; it gives the defaults of absent keys (its transformers configuration class's)
 * and reads the family's own keys (sliding window, biases, experts). RoPE is read in both
 * transformers spellings, 4's rope_theta / rope_scaling and 5's rope_parameters (parse_rope).
 * Keys are read through format/qs_json.h.
 *
 * Sources of the rules: docs/FORMATS.md section 8 (spellings: bits/w_bit, group_size/q_group_size,
 * version case, backend "llm-awq"), section 10.1 (defaults per family, null vs absent, the RoPE
 * spellings), its pitfalls (section 12) P13/P14 (w_bit, zero_point, version refused by
 * name), P21 (config locations; two quant configs that disagree are refused), P24 (eos lists).
 *
 * Tested by tests/test_cvt_config.c (the real configs under tests/data, their transformers 5
 * spellings and hand-written bad ones), tests/test_cvt.c (a fixture in transformers 5's
 * spelling end to end) and fuzzed by tests/fuzz_config.c.
 */
#include <ctype.h>
#include <inttypes.h> /* PRId64 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>   /* config parsing */

#include "cvt.h"           /* struct cvt_dims, cvt_dims_from_hf */
#include "cvt_arch.h"      /* cvt_arch_by_hf_class, cvt_arch_by_model_type, struct cvt_arch */
#include "cvt_src_int.h"
#include "qs_json.h"       /* qs_json_parse_object, qs_json_int, ... */
#include "qs_log.h"        /* qs_log_error, qs_log_warn */

#define CFG_MAX_DIM   (1ll << 24)   /* hidden, intermediate, heads... far above any real model */
#define CFG_MAX_VOCAB (1ll << 24)

const char *cvt_qcfg_file_str(enum cvt_qcfg_file f)
{
    switch (f) {
    case CVT_QCFG_NONE: return "none";
    case CVT_QCFG_CONFIG_JSON: return "config.json";
    case CVT_QCFG_QUANT_CONFIG_JSON: return "quant_config.json";
    case CVT_QCFG_QUANTIZE_CONFIG_JSON: return "quantize_config.json";
    }
    return "?";
}

const char *cvt_variant_str(enum cvt_variant v)
{
    switch (v) {
    case CVT_VARIANT_UNKNOWN: return "unknown";
    case CVT_VARIANT_GEMM: return "gemm";
    case CVT_VARIANT_GEMV: return "gemv";
    case CVT_VARIANT_GEMV_FAST: return "gemv_fast";
    case CVT_VARIANT_LLMAWQ_V3: return "llm-awq-v3";
    case CVT_VARIANT_GPTQ: return "gptq";
    case CVT_VARIANT_CT_PACKED: return "compressed-tensors";
    }
    return "?";
}

const char *cvt_qmethod_str(enum cvt_qmethod m)
{
    switch (m) {
    case CVT_QM_AWQ: return "awq";
    case CVT_QM_GPTQ: return "gptq";
    case CVT_QM_CT: return "compressed-tensors";
    }
    return "?";
}

void cvt_config_free(struct cvt_hf_config *cfg)
{
    if (!cfg)
        return;
    for (int i = 0; i < cfg->quant.n_modules_to_not_convert; i++)
        free(cfg->quant.modules_to_not_convert[i]);
    for (int i = 0; i < cfg->quant.n_ignore; i++)
        free(cfg->quant.ignore[i]);
    free(cfg->config_json);
    free(cfg->generation_config_json);
    memset(cfg, 0, sizeof *cfg);
}

bool cvt_config_skips_module(const struct cvt_hf_config *cfg, const char *name)
{
    for (int i = 0; i < cfg->quant.n_modules_to_not_convert; i++)
        if (strstr(name, cfg->quant.modules_to_not_convert[i]))
            return true;
    return false;
}

/* --- architecture -------------------------------------------------------------------------- */

/* The descriptor (convert/cvt_arch.h) named by "architectures" and/or "model_type". */
static enum cvt_err parse_arch(const struct qs_json_ctx *c, const cJSON *o, struct cvt_hf_config *cfg)
{
    char mt[64] = "", list[512];
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(o, "architectures");
    const cJSON *mtv = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    const struct cvt_arch *from_cls = NULL, *from_mt = NULL;
    if (archs && !cJSON_IsNull(archs)) {
        if (!cJSON_IsArray(archs) || !cJSON_IsString(archs->child) || cJSON_GetArraySize(archs) != 1) {
            qs_log_error(c->fn, "%s/%s: \"architectures\" must be a list of one class name",
                         c->where, c->file);
            return CVT_ERR_CONFIG;
        }
        snprintf(cfg->architectures0, sizeof cfg->architectures0, "%s", archs->child->valuestring);
        if (!(from_cls = cvt_arch_by_hf_class(archs->child->valuestring))) {
            cvt_arch_list(true, list, sizeof list);
            qs_log_error(c->fn, "%s/%s: architecture \"%.60s\" is not supported (supported: %s)",
                         c->where, c->file, archs->child->valuestring, list);
            return CVT_ERR_UNSUPPORTED;
        }
    }
    if (mtv && !cJSON_IsNull(mtv)) {
        CVT_TRY_JSON(qs_json_string(c, o, "model_type", false, mt, sizeof mt));
        if (!(from_mt = cvt_arch_by_model_type(mt))) {
            cvt_arch_list(false, list, sizeof list);
            qs_log_error(c->fn, "%s/%s: model_type \"%s\" is not supported (supported: %s)",
                         c->where, c->file, mt, list);
            return CVT_ERR_UNSUPPORTED;
        }
    }
    if (!from_cls && !from_mt) {
        qs_log_error(c->fn, "%s/%s: neither \"architectures\" nor \"model_type\" names the model",
                     c->where, c->file);
        return CVT_ERR_CONFIG;
    }
    /* one runtime architecture may have several classes (Falcon's RWForCausalLM, MPT's two) */
    if (from_cls && from_mt && strcmp(from_cls->name, from_mt->name) != 0) {
        qs_log_error(c->fn, "%s/%s: architectures (%s) and model_type (%s) disagree", c->where,
                     c->file, cfg->architectures0, mt);
        return CVT_ERR_CONFIG;
    }
    cfg->arch = from_cls ? from_cls : from_mt;
    return CVT_ERR_NONE;
}

/* --- quant config ---------------------------------------------------------------------------- */


/* Read the spellings of one quant config object (docs/FORMATS.md 8.1, 8.2). */
static enum cvt_err read_qparams(const struct qs_json_ctx *c, const cJSON *o, bool is_quantize_config,
                                 struct cvt_qparams *q)
{
    memset(q, 0, sizeof *q);
    q->present = true;
    CVT_TRY_JSON(qs_json_string(c, o, "quant_method", true, q->quant_method, sizeof q->quant_method));
    /* AutoGPTQ's quantize_config.json may lack quant_method: its keys tell it apart from
     * llm-awq's (docs/FORMATS.md 14.1) */
    if (strcmp(q->quant_method, "gptq") == 0 ||
        (is_quantize_config && !q->quant_method[0] &&
         (cJSON_GetObjectItemCaseSensitive(o, "desc_act") || cJSON_GetObjectItemCaseSensitive(o, "sym") ||
          cJSON_GetObjectItemCaseSensitive(o, "damp_percent"))))
        return cvt_qcfg_gptq(c, o, q);
    if (strcmp(q->quant_method, "compressed-tensors") == 0)
        return cvt_qcfg_ct(c, o, q);
    if (q->quant_method[0] && strcmp(q->quant_method, "awq") != 0) {
        qs_log_error("cvt_config_parse", "%s/%s: quant_method \"%s\" is not supported (supported: awq, gptq, compressed-tensors)",
                     c->where, c->file, q->quant_method);
        return CVT_ERR_UNSUPPORTED;
    }
    int64_t b1, b2, g1, g2;
    CVT_TRY_JSON(qs_json_int(c, o, "bits", false, -1, 1, 64, &b1));
    CVT_TRY_JSON(qs_json_int(c, o, "w_bit", false, -1, 1, 64, &b2));
    if (b1 > 0 && b2 > 0 && b1 != b2) {
        qs_log_error("cvt_config_parse", "%s/%s: \"bits\" %lld and \"w_bit\" %lld disagree", c->where, c->file,
                     (long long)b1, (long long)b2);
        return CVT_ERR_CONFIG;
    }
    q->bits = b1 > 0 ? b1 : b2;
    CVT_TRY_JSON(qs_json_int(c, o, "group_size", false, 0, -1, 1 << 20, &g1));
    CVT_TRY_JSON(qs_json_int(c, o, "q_group_size", false, 0, -1, 1 << 20, &g2));
    if (g1 && g2 && g1 != g2) {
        qs_log_error("cvt_config_parse", "%s/%s: \"group_size\" %lld and \"q_group_size\" %lld disagree",
                     c->where, c->file, (long long)g1, (long long)g2);
        return CVT_ERR_CONFIG;
    }
    q->group = g1 ? g1 : g2;
    CVT_TRY_JSON(qs_json_bool(c, o, "zero_point", true, &q->zero_point));
    CVT_TRY_JSON(qs_json_string(c, o, "version", true, q->version, sizeof q->version));
    CVT_TRY_JSON(qs_json_string(c, o, "format", true, q->format, sizeof q->format));
    CVT_TRY_JSON(qs_json_string(c, o, "backend", true, q->backend, sizeof q->backend));
    q->skip = cJSON_GetObjectItemCaseSensitive(o, "modules_to_not_convert");
    if (q->bits <= 0) {
        qs_log_error("cvt_config_parse", "%s/%s: no bit width (\"bits\" or \"w_bit\")", c->where, c->file);
        return CVT_ERR_CONFIG;
    }
    if (q->group == 0) {
        qs_log_error("cvt_config_parse", "%s/%s: no group size (\"group_size\" or \"q_group_size\")", c->where, c->file);
        return CVT_ERR_CONFIG;
    }
    return CVT_ERR_NONE;
}

/* Which variants a version/format/backend string allows (docs/FORMATS.md 2.1, 8.3, 6.3). */
static enum cvt_err variant_mask(const struct qs_json_ctx *c, const struct cvt_qparams *q, enum cvt_qcfg_file from,
                                 unsigned *mask)
{
    const char *v = q->format[0] ? q->format : q->version;
    if (q->format[0] && q->version[0] && strcmp(q->format, q->version) != 0 &&
        !(strcmp(q->format, "llm-awq") == 0)) {
        qs_log_error("cvt_config_parse", "%s/%s: \"format\" \"%s\" and \"version\" \"%s\" disagree", c->where,
                     c->file, q->format, q->version);
        return CVT_ERR_CONFIG;
    }
    if (strcmp(q->backend, "llm-awq") == 0 || strcmp(v, "llm-awq") == 0) {
        /* llm-awq exports: gen-2 or gen-3 tensors whatever `version` says (docs/FORMATS.md 6.3). */
        *mask = CVT_VARIANT_BIT(CVT_VARIANT_GEMV) | CVT_VARIANT_BIT(CVT_VARIANT_LLMAWQ_V3);
        return CVT_ERR_NONE;
    }
    if (from == CVT_QCFG_QUANTIZE_CONFIG_JSON && !v[0]) {
        *mask = CVT_VARIANT_BIT(CVT_VARIANT_GEMM); /* llm-awq gen-1 exports */
        return CVT_ERR_NONE;
    }
    if (!v[0] || strcmp(v, "gemm") == 0 || strcmp(v, "exllama") == 0 || strcmp(v, "exllama_v2") == 0 ||
        strcmp(v, "exllamav2") == 0 || strcmp(v, "ipex") == 0 || strcmp(v, "triton") == 0) {
        *mask = CVT_VARIANT_BIT(CVT_VARIANT_GEMM); /* same on-disk layout (docs/FORMATS.md 3.4) */
        return CVT_ERR_NONE;
    }
    if (strcmp(v, "gemv") == 0) {
        *mask = CVT_VARIANT_BIT(CVT_VARIANT_GEMV);
        return CVT_ERR_NONE;
    }
    if (strcmp(v, "gemv_fast") == 0) {
        *mask = CVT_VARIANT_BIT(CVT_VARIANT_GEMV_FAST);
        return CVT_ERR_NONE;
    }
    if (strcmp(v, "marlin") == 0) {
        qs_log_error("cvt_config_parse", "%s/%s: AWQ version \"marlin\" (symmetric, Marlin-permuted layout) is not supported; re-export as GEMM",
                     c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    qs_log_error("cvt_config_parse", "%s/%s: unknown AWQ version \"%s\" (supported: gemm, gemv, gemv_fast, llm-awq)",
                 c->where, c->file, v);
    return CVT_ERR_UNSUPPORTED;
}

static enum cvt_err fill_quant(const struct qs_json_ctx *c, const struct cvt_qparams *q, enum cvt_qcfg_file from,
                               struct cvt_hf_config *cfg)
{
    if (q->bits != 4) {
        qs_log_error("cvt_config_parse", "%s/%s: bits (w_bit) %lld is not supported: qshard handles 4-bit weights only",
                     c->where, c->file, (long long)q->bits);
        return CVT_ERR_UNSUPPORTED;
    }
    if (q->group < -1 || q->group == 0) {
        qs_log_error("cvt_config_parse", "%s/%s: group size %lld invalid", c->where, c->file, (long long)q->group);
        return CVT_ERR_CONFIG;
    }
    if (q->method == CVT_QM_GPTQ)
        cfg->quant.variant_mask = CVT_VARIANT_BIT(CVT_VARIANT_GPTQ);
    else if (q->method == CVT_QM_CT)
        cfg->quant.variant_mask = CVT_VARIANT_BIT(CVT_VARIANT_CT_PACKED);
    else
        CVT_TRY(variant_mask(c, q, from, &cfg->quant.variant_mask));
    cfg->quant.from = from;
    cfg->quant.w_bit = 4;
    cfg->quant.group_size = q->group;
    cfg->quant.zero_point = q->zero_point;
    cfg->quant.method = q->method;
    cfg->quant.act_order = q->act_order;
    cfg->quant.gptq_v1 = q->gptq_v1;
    if (q->method == CVT_QM_CT)
        CVT_TRY(cvt_qcfg_ignore(c, q->ignore, cfg));
    memcpy(cfg->quant.version, q->version, sizeof cfg->quant.version);
    memcpy(cfg->quant.format, q->format, sizeof cfg->quant.format);
    memcpy(cfg->quant.backend, q->backend, sizeof cfg->quant.backend);
    const cJSON *sk = q->skip;
    if (sk && !cJSON_IsNull(sk)) {
        if (!cJSON_IsArray(sk)) {
            qs_log_error("cvt_config_parse", "%s/%s: \"modules_to_not_convert\" must be null or a list of strings",
                         c->where, c->file);
            return CVT_ERR_CONFIG;
        }
        for (const cJSON *s = sk->child; s; s = s->next) {
            if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) > 256) {
                qs_log_error("cvt_config_parse", "%s/%s: \"modules_to_not_convert\" entries must be non-empty strings",
                             c->where, c->file);
                return CVT_ERR_CONFIG;
            }
            if (cfg->quant.n_modules_to_not_convert >= CVT_MAX_SKIP_MOD) {
                qs_log_error("cvt_config_parse", "%s/%s: more than %d modules_to_not_convert entries", c->where,
                             c->file, CVT_MAX_SKIP_MOD);
                return CVT_ERR_CONFIG;
            }
            char *d = strdup(s->valuestring);
            if (!d) {
                qs_log_error("cvt_config_parse", "out of memory");
                return CVT_ERR_NOMEM;
            }
            cfg->quant.modules_to_not_convert[cfg->quant.n_modules_to_not_convert++] = d;
        }
    }
    return CVT_ERR_NONE;
}

/* Two quant configs present: they must agree on what matters (docs/FORMATS.md P21 d). */
static enum cvt_err check_agree(const char *where, const struct cvt_qparams *a, const char *fa,
                                const struct cvt_qparams *b, const char *fb)
{
    const char *va = a->format[0] ? a->format : a->version, *vb = b->format[0] ? b->format : b->version;
    bool v_ok = (!va[0] || !vb[0]) ? true : strcmp(va, vb) == 0;
    if (a->method != b->method || a->act_order != b->act_order || a->gptq_v1 != b->gptq_v1) {
        qs_log_error("cvt_config_parse", "%s: %s and %s disagree (quant_method %s vs %s, desc_act %d vs %d, checkpoint format v1 %d vs %d): refusing to guess",
                     where, fa, fb, cvt_qmethod_str(a->method), cvt_qmethod_str(b->method), a->act_order,
                     b->act_order, a->gptq_v1, b->gptq_v1);
        return CVT_ERR_CONFIG;
    }
    if (a->bits != b->bits || a->group != b->group || a->zero_point != b->zero_point || !v_ok) {
        qs_log_error("cvt_config_parse", "%s: %s and %s disagree (bits %lld vs %lld, group size %lld vs %lld, zero_point %d vs %d, version \"%s\" vs \"%s\"): refusing to guess",
                     where, fa, fb, (long long)a->bits, (long long)b->bits, (long long)a->group,
                     (long long)b->group, a->zero_point, b->zero_point, va, vb);
        return CVT_ERR_CONFIG;
    }
    return CVT_ERR_NONE;
}

/* --- RoPE ---------------------------------------------------------------------------------- */

/* One spelling of a value: its name in messages and the value (0: not given). */
struct spelling {
    const char *name;
    double v;
};

/* The value the given spellings of one key say into *out (0 when none says one); two that differ
 * are refused, naming both. */
static enum cvt_err agree(const struct qs_json_ctx *c, const struct spelling *s, int n, double *out)
{
    *out = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].v == 0)
            continue;
        for (int j = i + 1; j < n; j++)
            if (s[j].v != 0 && s[j].v != s[i].v) {
                qs_log_error(c->fn, "%s/%s: %s %g and %s %g disagree: refusing to guess", c->where,
                             c->file, s[i].name, s[i].v, s[j].name, s[j].v);
                return CVT_ERR_CONFIG;
            }
        *out = s[i].v;
        return CVT_ERR_NONE;
    }
    return CVT_ERR_NONE;
}

/* A llama3 object's original_max_position_embeddings: its own, else config.json's top-level key
 * (transformers 5 lets the top-level one win: both given must agree), else
 * max_position_embeddings (standardize_rope_params). */
static enum cvt_err resolve_omax(const struct qs_json_ctx *c, const char *key, int64_t top,
                                 struct qs_rope_object *r, int64_t max_pos)
{
    char name[64];
    double v;
    if (r->scaling.type != QS_ROPE_LLAMA3)
        return CVT_ERR_NONE;
    snprintf(name, sizeof name, "%s.original_max_position_embeddings", key);
    const struct spelling s[] = {{name, (double)r->scaling.original_max_position_embeddings},
                                 {"original_max_position_embeddings", (double)top}};
    CVT_TRY(agree(c, s, 2, &v));
    r->scaling.original_max_position_embeddings = v != 0 ? (int64_t)v : max_pos;
    return CVT_ERR_NONE;
}

/* "llama3 factor 8 low_freq_factor 1 high_freq_factor 4 original_max_position_embeddings 8192"
 * into buf[cap]: a scaling as messages name it. */
static const char *scaling_str(const struct qs_rope_scaling *r, char *buf, size_t cap)
{
    if (r->type == QS_ROPE_LLAMA3)
        snprintf(buf, cap, "llama3 factor %g low_freq_factor %g high_freq_factor %g "
                 "original_max_position_embeddings %lld", r->factor, r->low_freq_factor,
                 r->high_freq_factor, (long long)r->original_max_position_embeddings);
    else if (r->type == QS_ROPE_LINEAR)
        snprintf(buf, cap, "linear factor %g", r->factor);
    else
        snprintf(buf, cap, "%s", qs_rope_type_name(r->type));
    return buf;
}

static bool same_scaling(const struct qs_rope_scaling *a, const struct qs_rope_scaling *b)
{
    return a->type == b->type && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings;
}

/*
 * RoPE of config.json into cfg->rope_theta and cfg->rope_scaling (docs/FORMATS.md 10.1), from
 * transformers 4's spellings (top-level "rope_theta", "rope_scaling") and transformers 5's
 * ("rope_parameters": one dict holding rope_theta and the scaling keys, which transformers 5
 * saves in place of both), standardised as transformers 5 does (modeling_rope_utils.py,
 * RotaryEmbeddingConfigMixin.convert_rope_params_to_dict and standardize_rope_params):
 *   - theta: "rope_parameters".rope_theta, "rope_scaling".rope_theta or the top-level key; none
 *     of them: the family's default_theta (cfg->arch->rope_theta);
 *   - scaling: "rope_scaling" or "rope_parameters" (rope_type "default" = none); llama3's
 *     original_max_position_embeddings as resolve_omax says; cfg->max_position_embeddings must
 *     be read before;
 *   - partial_rotary_factor (top level or in either dict): 1 only (the runtime rotates whole
 *     heads), else CVT_ERR_UNSUPPORTED.
 * Where transformers silently takes one of two spellings (rope_scaling over rope_parameters,
 * rope_parameters' theta over the top-level one), both given must agree, else CVT_ERR_CONFIG
 * naming both. Per-layer-type dicts and unsupported types: CVT_ERR_UNSUPPORTED
 * (qs_json_rope_object).
 */
static enum cvt_err parse_rope(const struct qs_json_ctx *c, const cJSON *o,
                               struct cvt_hf_config *cfg)
{
    struct qs_rope_object rs, rp;
    double theta_top, prf_top, prf, theta;
    int64_t omax_top;
    char b1[160], b2[160];
    CVT_TRY_JSON(qs_json_rope_object(c, o, "rope_scaling", &rs));
    CVT_TRY_JSON(qs_json_rope_object(c, o, "rope_parameters", &rp));
    CVT_TRY_JSON(qs_json_number(c, o, "rope_theta", false, 0, 0.0, 1e12, &theta_top));
    CVT_TRY_JSON(qs_json_number(c, o, "partial_rotary_factor", false, 0, 0.0, 1.0, &prf_top));
    CVT_TRY_JSON(qs_json_int(c, o, "original_max_position_embeddings", false, 0, 1, 1ll << 30,
                             &omax_top));
    const struct spelling thetas[] = {{"rope_parameters.rope_theta", rp.rope_theta},
                                      {"rope_scaling.rope_theta", rs.rope_theta},
                                      {"rope_theta", theta_top}};
    const struct spelling prfs[] = {
        {"rope_parameters.partial_rotary_factor", rp.partial_rotary_factor},
        {"rope_scaling.partial_rotary_factor", rs.partial_rotary_factor},
        {"partial_rotary_factor", prf_top}};
    CVT_TRY(agree(c, thetas, 3, &theta));
    CVT_TRY(agree(c, prfs, 3, &prf));
    if (prf != 0 && prf != 1.0) {
        qs_log_error(c->fn, "%s/%s: partial_rotary_factor %g (RoPE on part of each head) is not supported: only 1",
                     c->where, c->file, prf);
        return CVT_ERR_UNSUPPORTED;
    }
    CVT_TRY(resolve_omax(c, "rope_scaling", omax_top, &rs, cfg->max_position_embeddings));
    CVT_TRY(resolve_omax(c, "rope_parameters", omax_top, &rp, cfg->max_position_embeddings));
    if (rs.given && rp.given && !same_scaling(&rs.scaling, &rp.scaling)) {
        qs_log_error(c->fn, "%s/%s: rope_scaling (%s) and rope_parameters (%s) disagree: refusing to guess",
                     c->where, c->file, scaling_str(&rs.scaling, b1, sizeof b1),
                     scaling_str(&rp.scaling, b2, sizeof b2));
        return CVT_ERR_CONFIG;
    }
    cfg->rope_theta = theta != 0 ? theta : cfg->arch->rope_theta;
    cfg->rope_scaling = rs.given ? rs.scaling : rp.scaling;
    return CVT_ERR_NONE;
}

/* --- model keys ----------------------------------------------------------------------------- */

/* The spelling of common key `key` to read: the key itself, or the family's alias of it when
 * config.json has only the alias (cvt_arch key_aliases). */
static const char *key_of(const cJSON *o, const struct cvt_arch *a, const char *key)
{
    if (!a->key_aliases || qs_json_given(o, key))
        return key;
    for (const char *const *p = a->key_aliases; p[0] && p[1]; p += 2)
        if (strcmp(p[0], key) == 0 && qs_json_given(o, p[1]))
            return p[1];
    return key;
}

/* A config that gives both spellings of a key with different values is refused: the family's
 * configuration class reads one of them and ignores the other, so either choice could be a
 * silently wrong model. */
static enum cvt_err check_aliases(const struct qs_json_ctx *c, const cJSON *o,
                                  const struct cvt_arch *a)
{
    for (const char *const *p = a->key_aliases; p && p[0] && p[1]; p += 2) {
        if (!qs_json_given(o, p[0]) || !qs_json_given(o, p[1]))
            continue;
        if (!cJSON_Compare(cJSON_GetObjectItemCaseSensitive(o, p[0]),
                           cJSON_GetObjectItemCaseSensitive(o, p[1]), true)) {
            qs_log_error(c->fn, "%s/%s: \"%s\" and \"%s\" (two spellings of one %s key) "
                                "disagree", c->where, c->file, p[0], p[1], a->hf_class);
            return CVT_ERR_CONFIG;
        }
    }
    return CVT_ERR_NONE;
}

/* num_key_value_heads: absent = the family's default (cfg->arch), null = num_attention_heads
 * (every class's "for backward compatibility" branch); it must divide the query heads. */
static enum cvt_err parse_kv_heads(const struct qs_json_ctx *c, const cJSON *o,
                                   struct cvt_hf_config *cfg)
{
    const int64_t nq = cfg->num_attention_heads;
    const char *kvk = key_of(o, cfg->arch, "num_key_value_heads");
    const bool absent = !cJSON_GetObjectItemCaseSensitive(o, kvk);
    if (cfg->arch->num_key_value_heads < 0) { /* the family sets it in read_keys (Falcon, MPT) */
        cfg->num_key_value_heads = nq;
        return CVT_ERR_NONE;
    }
    const int64_t def = absent && cfg->arch->num_key_value_heads ? cfg->arch->num_key_value_heads
                                                                   : nq;
    CVT_TRY_JSON(qs_json_int(c, o, kvk, false, def, 1, 65536, &cfg->num_key_value_heads));
    if (nq % cfg->num_key_value_heads != 0) {
        qs_log_error(c->fn, "%s/%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld%s%s%s",
                     c->where, c->file, (long long)nq, (long long)cfg->num_key_value_heads,
                     absent ? " (config.json has no num_key_value_heads: the default of " : "",
                     absent ? cfg->arch->hf_class : "", absent ? "'s configuration class)" : "");
        return CVT_ERR_CONFIG;
    }
    return CVT_ERR_NONE;
}

static enum cvt_err parse_model(const struct qs_json_ctx *c, const cJSON *o, struct cvt_hf_config *cfg)
{
    CVT_TRY(parse_arch(c, o, cfg));
    const struct cvt_arch *a = cfg->arch;
    CVT_TRY(check_aliases(c, o, a));
    CVT_TRY_JSON(qs_json_int(c, o, key_of(o, a, "hidden_size"), true, 0, 1, CFG_MAX_DIM,
                             &cfg->hidden_size));
    const char *ik = key_of(o, a, "intermediate_size");
    const bool i_def = a->ffn_mult > 0 && !qs_json_given(o, ik); /* None: the default too */
    if (i_def && a->ffn_mult * cfg->hidden_size > CFG_MAX_DIM) {
        qs_log_error(c->fn, "%s/%s: the default intermediate size %lld x hidden_size %lld is "
                            "too large", c->where, c->file, (long long)a->ffn_mult,
                     (long long)cfg->hidden_size);
        return CVT_ERR_CONFIG;
    }
    CVT_TRY_JSON(qs_json_int(c, o, ik, !i_def, a->ffn_mult * cfg->hidden_size, 1, CFG_MAX_DIM,
                             &cfg->intermediate_size));
    CVT_TRY_JSON(qs_json_int(c, o, key_of(o, a, "num_hidden_layers"), true, 0, 1, 4096,
                             &cfg->num_hidden_layers));
    CVT_TRY_JSON(qs_json_int(c, o, key_of(o, a, "num_attention_heads"), true, 0, 1, 65536,
                             &cfg->num_attention_heads));
    CVT_TRY(parse_kv_heads(c, o, cfg));
    CVT_TRY_JSON(qs_json_int(c, o, "vocab_size", true, 0, 1, CFG_MAX_VOCAB, &cfg->vocab_size));
    const int64_t H = cfg->hidden_size, nq = cfg->num_attention_heads;
    int64_t hd_def = a->head_dim ? a->head_dim : H % nq == 0 ? H / nq : 0;
    CVT_TRY_JSON(qs_json_int(c, o, "head_dim", false, hd_def, 1, 65536, &cfg->head_dim));
    if (cfg->head_dim == 0) {
        qs_log_error("cvt_config_parse", "%s/%s: hidden_size %lld is not a multiple of num_attention_heads %lld and no head_dim is given",
                     c->where, c->file, (long long)H, (long long)nq);
        return CVT_ERR_CONFIG;
    }
    if (cfg->head_dim % 2 != 0) {
        qs_log_error("cvt_config_parse", "%s/%s: head_dim %lld is odd (rotary embedding needs pairs)", c->where,
                     c->file, (long long)cfg->head_dim);
        return CVT_ERR_CONFIG;
    }
    CVT_TRY_JSON(qs_json_number(c, o, key_of(o, a, "rms_norm_eps"), false, a->rms_norm_eps, 0.0,
                                1.0, &cfg->rms_norm_eps));
    CVT_TRY_JSON(qs_json_int(c, o, key_of(o, a, "max_position_embeddings"), false,
                             a->max_position_embeddings, 1, 1ll << 30, &cfg->max_position_embeddings));
    CVT_TRY(parse_rope(c, o, cfg));
    CVT_TRY_JSON(qs_json_bool(c, o, "tie_word_embeddings", a->tie_word_embeddings,
                              &cfg->tie_word_embeddings));
    if (qs_json_is_null(o, "tie_word_embeddings")) /* transformers tests its truth: None = untied */
        cfg->tie_word_embeddings = false;

    /* hidden_act: the family's activation only */
    char act[32];
    const char *actk = key_of(o, a, "hidden_act");
    CVT_TRY_JSON(qs_json_string(c, o, actk, false, act, sizeof act));
    if (act[0] && strcmp(act, a->hidden_act) != 0) {
        qs_log_error(c->fn, "%s/%s: %s \"%s\" is not supported (%s only)", c->where, c->file,
                     actk, act, a->hidden_act);
        return CVT_ERR_UNSUPPORTED;
    }

    /* the family's own keys: sliding window, biases, experts */
    if (a->read_keys)
        CVT_TRY(a->read_keys(c, o, cfg));

    int64_t bos;
    CVT_TRY_JSON(qs_json_int(c, o, "bos_token_id", false, -1, 0, CFG_MAX_VOCAB - 1, &bos));
    if (bos >= 0) {
        cfg->has_bos = true;
        cfg->bos_token_id = bos;
    }
    CVT_TRY_JSON(qs_json_eos_ids(c, o, cfg->vocab_size, cfg->eos_token_id, CVT_MAX_EOS, &cfg->n_eos));

    CVT_TRY_JSON(qs_json_string(c, o, "torch_dtype", false, cfg->torch_dtype, sizeof cfg->torch_dtype));
    if (!cfg->torch_dtype[0])
        CVT_TRY_JSON(qs_json_string(c, o, "dtype", false, cfg->torch_dtype, sizeof cfg->torch_dtype));
    return CVT_ERR_NONE;
}

static enum cvt_err dup_text(const char *text, size_t size, char **out, size_t *out_size)
{
    *out = malloc(size + 1);
    if (!*out) {
        qs_log_error("cvt_config_parse", "out of memory");
        return CVT_ERR_NOMEM;
    }
    memcpy(*out, text, size);
    (*out)[size] = 0;
    *out_size = size;
    return CVT_ERR_NONE;
}

enum cvt_err cvt_config_parse(const char *where,
                              const char *config_json, size_t config_size,
                              const char *quant_config_json, size_t quant_config_size,
                              const char *quantize_config_json, size_t quantize_config_size,
                              const char *generation_config_json, size_t generation_config_size,
                              struct cvt_hf_config *cfg)
{
    enum cvt_err err = CVT_ERR_NONE;
    cJSON *jc = NULL, *jq = NULL, *jz = NULL, *jg = NULL;
    struct cvt_qparams qc = {0}, qq = {0}, qz = {0};
    memset(cfg, 0, sizeof *cfg);

    const char *fn = "cvt_config_parse";
    struct qs_json_ctx cc = {fn, where, "config.json"}, cq = {fn, where, "quant_config.json"},
                       cz = {fn, where, "quantize_config.json"},
                       cg = {fn, where, "generation_config.json"};
    if (!config_json) {
        qs_log_error(__func__, "%s: config.json is missing", where);
        return CVT_ERR_CONFIG;
    }
    if ((err = cvt_from_json(qs_json_parse_object(&cc, config_json, config_size, &jc))))
        goto out_err;
    if ((err = parse_model(&cc, jc, cfg)))
        goto out_err;

    const cJSON *qcj = cJSON_GetObjectItemCaseSensitive(jc, "quantization_config");
    if (!qcj || cJSON_IsNull(qcj)) { /* VLM-style wrappers nest it (docs/FORMATS.md P21 c) */
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(jc, "text_config");
        if (cJSON_IsObject(tc))
            qcj = cJSON_GetObjectItemCaseSensitive(tc, "quantization_config");
    }
    if (qcj && !cJSON_IsNull(qcj)) {
        if (!cJSON_IsObject(qcj)) {
            qs_log_error(__func__, "%s/config.json: \"quantization_config\" is not an object", where);
            err = CVT_ERR_CONFIG;
            goto out_err;
        }
        struct qs_json_ctx cqc = {fn, where, "config.json quantization_config"};
        if (!cJSON_GetObjectItemCaseSensitive(qcj, "quant_method")) {
            qs_log_error(__func__, "%s/config.json: quantization_config has no \"quant_method\"", where);
            err = CVT_ERR_CONFIG;
            goto out_err;
        }
        if ((err = read_qparams(&cqc, qcj, false, &qc)))
            goto out_err;
    }
    if (quant_config_json) {
        if ((err = cvt_from_json(qs_json_parse_object(&cq, quant_config_json, quant_config_size, &jq))) ||
            (err = read_qparams(&cq, jq, false, &qq)))
            goto out_err;
    }
    if (quantize_config_json) {
        if ((err = cvt_from_json(qs_json_parse_object(&cz, quantize_config_json, quantize_config_size, &jz))) ||
            (err = read_qparams(&cz, jz, true, &qz)))
            goto out_err;
    }
    if (qc.present && qq.present && (err = check_agree(where, &qc, "config.json quantization_config", &qq, "quant_config.json")))
        goto out_err;
    if (qc.present && qz.present && (err = check_agree(where, &qc, "config.json quantization_config", &qz, "quantize_config.json")))
        goto out_err;
    if (!qc.present && qq.present && qz.present && (err = check_agree(where, &qq, "quant_config.json", &qz, "quantize_config.json")))
        goto out_err;
    if (qc.present)
        err = fill_quant(&cc, &qc, CVT_QCFG_CONFIG_JSON, cfg);
    else if (qq.present)
        err = fill_quant(&cq, &qq, CVT_QCFG_QUANT_CONFIG_JSON, cfg);
    else if (qz.present)
        err = fill_quant(&cz, &qz, CVT_QCFG_QUANTIZE_CONFIG_JSON, cfg);
    if (err)
        goto out_err;

    if (generation_config_json) {
        if ((err = cvt_from_json(qs_json_parse_object(&cg, generation_config_json, generation_config_size, &jg))))
            goto out_err;
        int64_t bos;
        if ((err = cvt_from_json(qs_json_int(&cg, jg, "bos_token_id", false, -1, 0, CFG_MAX_VOCAB - 1, &bos))))
            goto out_err;
        if (bos >= 0) {
            cfg->has_bos = true;
            cfg->bos_token_id = bos;
        }
        if ((err = cvt_from_json(qs_json_eos_ids(&cg, jg, cfg->vocab_size, cfg->eos_token_id, CVT_MAX_EOS, &cfg->n_eos))))
            goto out_err;
        if ((err = dup_text(generation_config_json, generation_config_size, &cfg->generation_config_json,
                            &cfg->generation_config_json_size)))
            goto out_err;
    }
    if (cfg->has_bos && cfg->bos_token_id >= cfg->vocab_size) {
        qs_log_error(__func__, "%s: bos_token_id %lld is outside the vocabulary (vocab_size %lld)", where,
                     (long long)cfg->bos_token_id, (long long)cfg->vocab_size);
        err = CVT_ERR_CONFIG;
        goto out_err;
    }
    if ((err = dup_text(config_json, config_size, &cfg->config_json, &cfg->config_json_size)))
        goto out_err;
    cJSON_Delete(jc);
    cJSON_Delete(jq);
    cJSON_Delete(jz);
    cJSON_Delete(jg);
    return CVT_ERR_NONE;
out_err:
    cJSON_Delete(jc);
    cJSON_Delete(jq);
    cJSON_Delete(jz);
    cJSON_Delete(jg);
    cvt_config_free(cfg);
    return err;
}

/* --- dims from the HF config (the plan's view of it, cvt.h) -------------------------------------------------------------- */

enum cvt_err cvt_dims_from_hf(const struct cvt_hf_config *hf, struct cvt_dims *d)
{
    struct {
        const char *key;
        int64_t v;
        int *dst;
    } dims[] = {{"hidden_size", hf->hidden_size, &d->hidden},
                {"intermediate_size", hf->intermediate_size, &d->intermediate},
                {"num_hidden_layers", hf->num_hidden_layers, &d->n_layers},
                {"num_attention_heads", hf->num_attention_heads, &d->n_heads},
                {"num_key_value_heads", hf->num_key_value_heads, &d->n_kv_heads},
                {"head_dim", hf->head_dim, &d->head_dim},
                {"vocab_size", hf->vocab_size, &d->vocab},
                {"num_local_experts", hf->num_local_experts, &d->n_experts},
                {"num_experts_per_tok", hf->num_experts_per_tok, &d->n_experts_per_tok},
                {"group_size", hf->quant.group_size, &d->group_size}};
    memset(d, 0, sizeof(*d));
    d->arch = hf->arch;
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        if (dims[i].v < -1 || dims[i].v > (1 << 30)) {
            qs_log_error(__func__, "config key %s: expected a value in [0, 2^30], got %" PRId64,
                         dims[i].key, dims[i].v);
            return CVT_ERR_CONFIG;
        }
        *dims[i].dst = (int)dims[i].v;
    }
    if (d->group_size == 0 || d->group_size < -1) {
        qs_log_error(__func__, "quant config group_size: expected a positive multiple of 16 or -1 "
                               "(per-channel), got %d",
                     d->group_size);
        return CVT_ERR_UNSUPPORTED;
    }
    d->tie_word_embeddings = hf->tie_word_embeddings;
    d->bias_roles = hf->bias_roles;
    if (hf->quant.n_modules_to_not_convert > CVT_MAX_NOT_CONVERT) {
        qs_log_error(__func__, "modules_to_not_convert: at most %d entries supported, got %d",
                     CVT_MAX_NOT_CONVERT, hf->quant.n_modules_to_not_convert);
        return CVT_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < hf->quant.n_modules_to_not_convert; i++) {
        const char *m = hf->quant.modules_to_not_convert[i];
        if (!m || strlen(m) >= sizeof(d->not_convert[0])) {
            qs_log_error(__func__, "modules_to_not_convert[%d]: expected a string shorter than %zu "
                                   "bytes",
                         i, sizeof(d->not_convert[0]));
            return CVT_ERR_UNSUPPORTED;
        }
        snprintf(d->not_convert[d->n_not_convert++], sizeof(d->not_convert[0]), "%s", m);
    }
    return CVT_ERR_NONE;
}

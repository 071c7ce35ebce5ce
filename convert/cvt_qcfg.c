/*
 * cvt_qcfg.c - the quant configs of GPTQ (AutoGPTQ, GPTQModel, transformers' GPTQConfig) and of
 * compressed-tensors (llm-compressor), read into the same `struct cvt_qparams` as AWQ's.
 *
 * Entry points (cvt_src_int.h): cvt_qcfg_gptq(), cvt_qcfg_ct(), cvt_qcfg_ignore(); and
 * cvt_config_ignores_module() (cvt_src.h). Called by cvt_config.c read_qparams().
 *
 * Sources of the keys (docs/FORMATS.md sections 14.1 and 15.1, restated there with citations):
 *   GPTQ: AutoGPTQ `auto_gptq/modeling/_base.py` BaseQuantizeConfig (bits, group_size,
 *   damp_percent, desc_act, static_groups, sym, true_sequential, checkpoint_format "gptq" |
 *   "marlin"), GPTQModel `gptqmodel/quantization/config.py` QuantizeConfig (format "gptq" |
 *   "gptq_v2" | "marlin" | "bitblas" | "ipex" | "qqq", pack_dtype, dynamic, lm_head),
 *   transformers `utils/quantization_config.py` GPTQConfig.
 *   compressed-tensors: `compressed_tensors/config/` and `quantization/quant_config.py`
 *   QuantizationConfig (config_groups, format, quantization_status, ignore, kv_cache_scheme,
 *   sparsity_config), `quantization/quant_args.py` QuantizationArgs (num_bits, type, symmetric,
 *   strategy, group_size, actorder, dynamic, block_structure), `quantization/quant_scheme.py`
 *   (targets, weights, input_activations, output_activations, format).
 * Everything we do not implement is refused by name (P13 style), never ignored: other bit widths,
 * float types, tensor/block/token strategies, activation quantization, dynamic weights,
 * sparsity, transforms, KV-cache schemes, Marlin/BitBLAS repacked files, per-module overrides,
 * several different weight schemes in one model.
 *
 * Tested by tests/test_cvt_config.c and the bad fixtures (tests/data/bad, INDEX.json).
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cvt_src_int.h"
#include "qs_log.h"

#define FN "cvt_config_parse"

/* A key that must be absent or JSON null or an empty object/list. */
static bool empty_or_null(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return true;
    if ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child)
        return true;
    return false;
}

enum cvt_err cvt_qcfg_gptq(const struct qs_json_ctx *c, const cJSON *o, struct cvt_qparams *q)
{
    char cf[32] = "", fm[32] = "", pd[32] = "";
    bool sym, desc_act, lm_head;
    q->method = CVT_QM_GPTQ;
    CVT_TRY_JSON(qs_json_int(c, o, "bits", true, 0, 1, 64, &q->bits));
    CVT_TRY_JSON(qs_json_int(c, o, "group_size", true, 0, -1, 1 << 20, &q->group));
    CVT_TRY_JSON(qs_json_bool(c, o, "sym", true, &sym));
    CVT_TRY_JSON(qs_json_bool(c, o, "desc_act", false, &desc_act));
    CVT_TRY_JSON(qs_json_bool(c, o, "lm_head", false, &lm_head));
    CVT_TRY_JSON(qs_json_string(c, o, "checkpoint_format", true, cf, sizeof cf));
    CVT_TRY_JSON(qs_json_string(c, o, "format", true, fm, sizeof fm));
    CVT_TRY_JSON(qs_json_string(c, o, "pack_dtype", true, pd, sizeof pd));
    if (cf[0] && fm[0] && strcmp(cf, fm) != 0) {
        qs_log_error(FN, "%s/%s: GPTQ \"checkpoint_format\" \"%s\" and \"format\" \"%s\" disagree",
                     c->where, c->file, cf, fm);
        return CVT_ERR_CONFIG;
    }
    const char *f = cf[0] ? cf : fm[0] ? fm : "gptq";
    if (strcmp(f, "gptq") == 0) {
        q->gptq_v1 = true;
    } else if (strcmp(f, "gptq_v2") != 0) {
        qs_log_error(FN, "%s/%s: GPTQ checkpoint format \"%s\" is not supported (supported: gptq, "
                     "gptq_v2; Marlin, BitBLAS, QQQ and IPEX files are repacked for one kernel: "
                     "convert the original GPTQ checkpoint)", c->where, c->file, f);
        return CVT_ERR_UNSUPPORTED;
    }
    if (pd[0] && strcmp(pd, "int32") != 0) {
        qs_log_error(FN, "%s/%s: GPTQ pack_dtype \"%s\" is not supported (int32 only)", c->where,
                     c->file, pd);
        return CVT_ERR_UNSUPPORTED;
    }
    if (lm_head) {
        qs_log_error(FN, "%s/%s: GPTQ \"lm_head\": true (a quantized lm_head) is not supported",
                     c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    if (!empty_or_null(o, "dynamic")) {
        qs_log_error(FN, "%s/%s: GPTQ \"dynamic\" per-module overrides (mixed bits or group sizes "
                     "per layer) are not supported", c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    q->zero_point = !sym;
    q->act_order = desc_act;
    snprintf(q->format, sizeof q->format, "%s", f);
    return CVT_ERR_NONE;
}

/* --- compressed-tensors ---------------------------------------------------------------------- */

/* A string key that may also be null: "" when absent or null. */
static enum cvt_err str_or_null(const struct qs_json_ctx *c, const cJSON *o, const char *key,
                                char *buf, size_t cap)
{
    buf[0] = 0;
    if (qs_json_is_null(o, key))
        return CVT_ERR_NONE;
    return cvt_from_json(qs_json_string(c, o, key, true, buf, cap));
}

/* The weights scheme of one config group (QuantizationArgs). */
struct ct_weights {
    int64_t bits, group;
    bool symmetric, act_order;
    char strategy[16];
};

static enum cvt_err ct_weights(const struct qs_json_ctx *c, const char *gname, const cJSON *w,
                               struct ct_weights *o)
{
    char type[16] = "", ao[16] = "";
    bool dynamic;
    memset(o, 0, sizeof *o);
    if (!cJSON_IsObject(w)) {
        qs_log_error(FN, "%s/%s: config_groups.%s has no \"weights\" object (weight quantization "
                     "is required)", c->where, c->file, gname);
        return CVT_ERR_UNSUPPORTED;
    }
    CVT_TRY_JSON(qs_json_int(c, w, "num_bits", true, 0, 1, 64, &o->bits));
    CVT_TRY(str_or_null(c, w, "type", type, sizeof type));
    CVT_TRY_JSON(qs_json_bool(c, w, "symmetric", true, &o->symmetric));
    CVT_TRY(str_or_null(c, w, "strategy", o->strategy, sizeof o->strategy));
    CVT_TRY_JSON(qs_json_bool(c, w, "dynamic", false, &dynamic));
    if (o->bits != 4) {
        qs_log_error(FN, "%s/%s: config_groups.%s.weights num_bits %lld is not supported (4 only)",
                     c->where, c->file, gname, (long long)o->bits);
        return CVT_ERR_UNSUPPORTED;
    }
    if (type[0] && strcmp(type, "int") != 0) {
        qs_log_error(FN, "%s/%s: config_groups.%s.weights type \"%s\" is not supported (int only)",
                     c->where, c->file, gname, type);
        return CVT_ERR_UNSUPPORTED;
    }
    if (dynamic || !empty_or_null(w, "block_structure")) {
        qs_log_error(FN, "%s/%s: config_groups.%s.weights: dynamic or block_structure is not "
                     "supported", c->where, c->file, gname);
        return CVT_ERR_UNSUPPORTED;
    }
    if (strcmp(o->strategy, "group") == 0) {
        CVT_TRY_JSON(qs_json_int(c, w, "group_size", true, 0, 1, 1 << 20, &o->group));
    } else if (strcmp(o->strategy, "channel") == 0) {
        o->group = -1;
    } else {
        qs_log_error(FN, "%s/%s: config_groups.%s.weights strategy \"%s\" is not supported (group, "
                     "channel)", c->where, c->file, gname, o->strategy);
        return CVT_ERR_UNSUPPORTED;
    }
    /* actorder: null/false, "weight"/"static" (the order only changed the quantization; groups
     * stay k / G, no g_idx stored) or "group"/"dynamic"/true (g_idx stored) */
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(w, "actorder");
    if (cJSON_IsBool(a)) {
        o->act_order = cJSON_IsTrue(a);
    } else if (a && !cJSON_IsNull(a)) {
        CVT_TRY_JSON(qs_json_string(c, w, "actorder", true, ao, sizeof ao));
        if (strcmp(ao, "group") == 0 || strcmp(ao, "dynamic") == 0) {
            o->act_order = true;
        } else if (strcmp(ao, "weight") != 0 && strcmp(ao, "static") != 0) {
            qs_log_error(FN, "%s/%s: config_groups.%s.weights actorder \"%s\" is unknown (group, "
                         "weight, static, dynamic, null)", c->where, c->file, gname, ao);
            return CVT_ERR_UNSUPPORTED;
        }
    }
    return CVT_ERR_NONE;
}

/* The format one config group is stored in: its own "format", else the config's. */
static enum cvt_err ct_group_format(const struct qs_json_ctx *c, const char *gname,
                                    const cJSON *g, const char *top)
{
    char f[32] = "";
    CVT_TRY(str_or_null(c, g, "format", f, sizeof f));
    const char *eff = f[0] ? f : top;
    if (strcmp(eff, "pack-quantized") != 0) {
        qs_log_error(FN, "%s/%s: config_groups.%s is stored as \"%s\": only the compressed-tensors "
                     "\"pack-quantized\" format (int4 packed in int32) is supported",
                     c->where, c->file, gname, eff[0] ? eff : "(no format)");
        return CVT_ERR_UNSUPPORTED;
    }
    return CVT_ERR_NONE;
}

enum cvt_err cvt_qcfg_ct(const struct qs_json_ctx *c, const cJSON *o, struct cvt_qparams *q)
{
    char top[32] = "", status[32] = "";
    q->method = CVT_QM_CT;
    CVT_TRY(str_or_null(c, o, "format", top, sizeof top));
    CVT_TRY(str_or_null(c, o, "quantization_status", status, sizeof status));
    if (strcmp(status, "compressed") != 0) {
        qs_log_error(FN, "%s/%s: compressed-tensors quantization_status \"%s\": only \"compressed\" "
                     "checkpoints (packed weights) are supported", c->where, c->file, status);
        return CVT_ERR_UNSUPPORTED;
    }
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(o, "sparsity_config");
    char sf[32] = "";
    if (cJSON_IsObject(sp))
        CVT_TRY(str_or_null(c, sp, "format", sf, sizeof sf));
    if (!empty_or_null(o, "sparsity_config") && strcmp(sf, "dense") != 0) {
        qs_log_error(FN, "%s/%s: compressed-tensors sparsity_config (format \"%s\") is not "
                     "supported", c->where, c->file, sf);
        return CVT_ERR_UNSUPPORTED;
    }
    if (!empty_or_null(o, "kv_cache_scheme") || !empty_or_null(o, "transform_config")) {
        qs_log_error(FN, "%s/%s: compressed-tensors kv_cache_scheme or transform_config is not "
                     "supported", c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(o, "config_groups");
    if (!cJSON_IsObject(groups) || !groups->child) {
        qs_log_error(FN, "%s/%s: compressed-tensors config has no config_groups", c->where, c->file);
        return CVT_ERR_CONFIG;
    }
    struct ct_weights first = {0}, w;
    const char *first_name = NULL;
    for (const cJSON *g = groups->child; g; g = g->next) {
        const char *gn = g->string ? g->string : "?";
        char gbuf[64];
        gn = cvt_printable(gn, strlen(gn), gbuf, sizeof gbuf);
        if (!cJSON_IsObject(g)) {
            qs_log_error(FN, "%s/%s: config_groups.%s is not an object", c->where, c->file, gn);
            return CVT_ERR_CONFIG;
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(g, "targets");
        if (!cJSON_IsArray(t) || !t->child) {
            qs_log_error(FN, "%s/%s: config_groups.%s has no \"targets\" list", c->where, c->file, gn);
            return CVT_ERR_CONFIG;
        }
        for (const cJSON *e = t->child; e; e = e->next)
            if (!cJSON_IsString(e)) {
                qs_log_error(FN, "%s/%s: config_groups.%s.targets entries must be strings",
                             c->where, c->file, gn);
                return CVT_ERR_CONFIG;
            }
        if (!empty_or_null(g, "input_activations") || !empty_or_null(g, "output_activations")) {
            qs_log_error(FN, "%s/%s: config_groups.%s quantizes activations: only weight-only "
                         "(W4A16) schemes are supported", c->where, c->file, gn);
            return CVT_ERR_UNSUPPORTED;
        }
        CVT_TRY(ct_group_format(c, gn, g, top));
        CVT_TRY(ct_weights(c, gn, cJSON_GetObjectItemCaseSensitive(g, "weights"), &w));
        if (!first_name) {
            first = w;
            first_name = g->string ? g->string : "?";
        } else if (w.group != first.group || w.symmetric != first.symmetric ||
                   w.act_order != first.act_order) {
            qs_log_error(FN, "%s/%s: config_groups %s and %s use different weight schemes (group "
                         "size %lld vs %lld, symmetric %d vs %d, actorder %d vs %d): mixed schemes "
                         "are not supported", c->where, c->file, first_name, gn,
                         (long long)first.group, (long long)w.group, first.symmetric, w.symmetric,
                         first.act_order, w.act_order);
            return CVT_ERR_UNSUPPORTED;
        }
    }
    q->bits = 4;
    q->group = first.group;
    q->zero_point = !first.symmetric;
    q->act_order = first.act_order;
    snprintf(q->format, sizeof q->format, "pack-quantized");
    q->ignore = cJSON_GetObjectItemCaseSensitive(o, "ignore");
    return CVT_ERR_NONE;
}

/* Python `re` pattern -> POSIX ERE anchored at the start ("^(...)", re.match), for the subset
 * ignore lists use: literals, . [] () | * + ? {m,n} ^ $, the escapes \d \w \s and escaped
 * punctuation. Lazy quantifiers drop their '?' (the same names match at the start). false for
 * anything else ((?...) groups, \b, back references, ...). */
static bool py_re_to_ere(const char *in, char *out, size_t cap)
{
    size_t k = 0;
    bool cls = false;
#define PUT(str)                                     \
    do {                                             \
        const char *p_ = (str);                      \
        size_t n_ = strlen(p_);                      \
        if (k + n_ + 2 >= cap)                       \
            return false;                            \
        memcpy(out + k, p_, n_);                     \
        k += n_;                                     \
    } while (0)
    PUT("^(");
    for (const char *p = in; *p; p++) {
        char ch[2] = {*p, 0};
        if (*p == '\\') {
            char e = p[1];
            if (!e)
                return false;
            p++;
            if (e == 'd')
                PUT(cls ? "0-9" : "[0-9]");
            else if (e == 'w')
                PUT(cls ? "A-Za-z0-9_" : "[A-Za-z0-9_]");
            else if (e == 's' && !cls)
                PUT("[[:space:]]");
            else if (strchr(".^$*+?()[]{}|\\/-", e) && !cls) {
                char esc[3] = {'\\', e, 0};
                PUT(esc);
            } else if (strchr(".*+?()|$^/", e) && cls) {
                char lit[2] = {e, 0};
                PUT(lit);
            } else
                return false;
            continue;
        }
        if (cls) {
            if (*p == ']')
                cls = false;
            PUT(ch);
            continue;
        }
        if (*p == '[') {
            cls = true;
            PUT(ch);
            if (p[1] == '^') {
                PUT("^");
                p++;
            }
            if (p[1] == ']') {
                PUT("]");
                p++;
            }
            continue;
        }
        if (*p == '(' && p[1] == '?')
            return false;
        if (*p == '?' && p > in && strchr("*+?}", p[-1]) && !(p - 1 > in && p[-2] == '\\'))
            continue; /* lazy modifier */
        PUT(ch);
    }
    if (cls)
        return false;
    PUT(")");
    out[k] = 0;
    return true;
#undef PUT
}

enum cvt_err cvt_qcfg_ignore(const struct qs_json_ctx *c, const cJSON *ign,
                             struct cvt_hf_config *cfg)
{
    if (!ign || cJSON_IsNull(ign))
        return CVT_ERR_NONE;
    if (!cJSON_IsArray(ign)) {
        qs_log_error(FN, "%s/%s: compressed-tensors \"ignore\" must be a list of strings",
                     c->where, c->file);
        return CVT_ERR_CONFIG;
    }
    for (const cJSON *e = ign->child; e; e = e->next) {
        char ere[600], pb[80];
        if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) > 256) {
            qs_log_error(FN, "%s/%s: \"ignore\" entries must be non-empty strings of at most 256 "
                         "bytes", c->where, c->file);
            return CVT_ERR_CONFIG;
        }
        const char *v = e->valuestring;
        if (cfg->quant.n_ignore >= CVT_MAX_SKIP_MOD) {
            qs_log_error(FN, "%s/%s: more than %d \"ignore\" entries", c->where, c->file,
                         CVT_MAX_SKIP_MOD);
            return CVT_ERR_CONFIG;
        }
        const char *store = v;
        if (strncmp(v, "re:", 3) == 0) {
            regex_t re;
            bool ok = py_re_to_ere(v + 3, ere + 3, sizeof ere - 3);
            if (ok && regcomp(&re, ere + 3, REG_EXTENDED | REG_NOSUB) == 0)
                regfree(&re);
            else
                ok = false;
            if (!ok) {
                qs_log_error(FN, "%s/%s: \"ignore\" entry \"%s\": regular expression not supported "
                             "(literals, . [] () | * + ? {m,n} ^ $, \\d \\w \\s)", c->where,
                             c->file, cvt_printable(v, strlen(v), pb, sizeof pb));
                return CVT_ERR_UNSUPPORTED;
            }
            memcpy(ere, "re:", 3);
            store = ere;
        }
        char *d = strdup(store);
        if (!d) {
            qs_log_error(FN, "out of memory");
            return CVT_ERR_NOMEM;
        }
        cfg->quant.ignore[cfg->quant.n_ignore++] = d;
    }
    return CVT_ERR_NONE;
}

bool cvt_config_ignores_module(const struct cvt_hf_config *cfg, const char *name)
{
    for (int i = 0; i < cfg->quant.n_ignore; i++) {
        const char *e = cfg->quant.ignore[i];
        if (strncmp(e, "re:", 3) != 0) {
            if (strcmp(e, name) == 0)
                return true;
            continue;
        }
        regex_t re;
        if (regcomp(&re, e + 3, REG_EXTENDED | REG_NOSUB) != 0)
            continue; /* compiled once at parse: cannot fail here */
        bool m = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
        if (m)
            return true;
    }
    return false;
}

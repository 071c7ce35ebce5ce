/*
 * qs_json.c - see qs_json.h. Test: ./build/test_json.
 */
#include "qs_json.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h> /* cJSON_ParseWithLengthOpts, cJSON_GetObjectItemCaseSensitive */

#include "qs_log.h" /* qs_log_error */

const char *qs_json_err_str(enum qs_json_err e)
{
    switch (e) {
#define QS_JSON_X_STR(name, value, desc) \
    case name: return #name ": " desc;
        QS_JSON_ERR_LIST(QS_JSON_X_STR)
#undef QS_JSON_X_STR
    }
    return "QS_JSON_ERR_?: unknown";
}

/* Bytes of a message label: a path and a file name, each cut to 300 bytes. */
#define LABEL_CAP 640

/* The "<where>/<file>" or "<where>" label of messages, into buf[LABEL_CAP]. */
static const char *label(const struct qs_json_ctx *c, char buf[LABEL_CAP])
{
    if (c->file)
        snprintf(buf, LABEL_CAP, "%.300s/%.300s", c->where ? c->where : "?", c->file);
    else
        snprintf(buf, LABEL_CAP, "%.300s", c->where ? c->where : "?");
    return buf;
}

/* Report "<label>: \"key\" must be <what>, got <value>" (value printed as JSON, cut at 60). */
static enum qs_json_err bad_value(const struct qs_json_ctx *c, const char *key, const char *what,
                                  const cJSON *v)
{
    char lb[LABEL_CAP], *s = cJSON_PrintUnformatted(v);
    qs_log_error(c->fn, "%s: \"%s\" must be %s, got %.60s", label(c, lb), key, what,
                 s ? s : "?");
    free(s);
    return QS_JSON_ERR_VALUE;
}

static enum qs_json_err missing(const struct qs_json_ctx *c, const char *key)
{
    char lb[LABEL_CAP];
    qs_log_error(c->fn, "%s: required key \"%s\" is missing", label(c, lb), key);
    return QS_JSON_ERR_VALUE;
}

/* The value of key in o, or NULL when absent or JSON null. */
static const cJSON *given(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

bool qs_json_given(const cJSON *o, const char *key)
{
    return given(o, key) != NULL;
}

bool qs_json_is_null(const cJSON *o, const char *key)
{
    return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, key));
}

enum qs_json_err qs_json_parse_object(const struct qs_json_ctx *c, const char *text, size_t size,
                                      cJSON **out)
{
    char lb[LABEL_CAP];
    const char *end = NULL;
    *out = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, size, &end, false);
    if (!j || !cJSON_IsObject(j)) {
        size_t at = end ? (size_t)(end - text) : 0;
        qs_log_error(c->fn, "%s: not a JSON object (parse error near byte %zu of %zu)",
                     label(c, lb), at, size);
        cJSON_Delete(j);
        return QS_JSON_ERR_SYNTAX;
    }
    for (const cJSON *a = j->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (strcmp(a->string, b->string) == 0) {
                qs_log_error(c->fn, "%s: key \"%.60s\" appears twice", label(c, lb),
                             a->string);
                cJSON_Delete(j);
                return QS_JSON_ERR_SYNTAX;
            }
    for (const char *p = end; p < text + size; p++)
        if (!isspace((unsigned char)*p) && *p != 0) {
            qs_log_error(c->fn, "%s: trailing garbage after the JSON object at byte %zu",
                         label(c, lb), (size_t)(p - text));
            cJSON_Delete(j);
            return QS_JSON_ERR_SYNTAX;
        }
    *out = j;
    return QS_JSON_OK;
}

enum qs_json_err qs_json_int(const struct qs_json_ctx *c, const cJSON *o, const char *key,
                             bool required, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *v = given(o, key);
    if (!v) {
        if (required)
            return missing(c, key);
        *out = def;
        return QS_JSON_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        char what[96];
        snprintf(what, sizeof(what), "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        return bad_value(c, key, what, v);
    }
    *out = (int64_t)v->valuedouble;
    return QS_JSON_OK;
}

enum qs_json_err qs_json_number(const struct qs_json_ctx *c, const cJSON *o, const char *key,
                                bool required, double def, double lo, double hi, double *out)
{
    const cJSON *v = given(o, key);
    if (!v) {
        if (required)
            return missing(c, key);
        *out = def;
        return QS_JSON_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || !(v->valuedouble > lo) ||
        v->valuedouble > hi) {
        char what[96];
        snprintf(what, sizeof(what), "a number in (%g, %g]", lo, hi);
        return bad_value(c, key, what, v);
    }
    *out = v->valuedouble;
    return QS_JSON_OK;
}

enum qs_json_err qs_json_bool(const struct qs_json_ctx *c, const cJSON *o, const char *key,
                              bool def, bool *out)
{
    const cJSON *v = given(o, key);
    if (!v) {
        *out = def;
        return QS_JSON_OK;
    }
    if (!cJSON_IsBool(v))
        return bad_value(c, key, "true or false", v);
    *out = cJSON_IsTrue(v);
    return QS_JSON_OK;
}

enum qs_json_err qs_json_string(const struct qs_json_ctx *c, const cJSON *o, const char *key,
                                bool lower, char *buf, size_t cap)
{
    const cJSON *v = given(o, key);
    buf[0] = '\0';
    if (!v)
        return QS_JSON_OK;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) {
        char what[96];
        snprintf(what, sizeof(what), "a string of fewer than %zu bytes", cap);
        return bad_value(c, key, what, v);
    }
    size_t i = 0;
    for (; v->valuestring[i]; i++)
        buf[i] = lower ? (char)tolower((unsigned char)v->valuestring[i]) : v->valuestring[i];
    buf[i] = '\0';
    return QS_JSON_OK;
}

enum qs_json_err qs_json_eos_ids(const struct qs_json_ctx *c, const cJSON *o, int64_t max_id,
                                 int *ids, int cap, int *n)
{
    const cJSON *v = given(o, "eos_token_id");
    if (!v)
        return QS_JSON_OK;
    bool list = cJSON_IsArray(v);
    int have = *n;
    for (const cJSON *one = list ? v->child : v; one; one = list ? one->next : NULL) {
        if (!cJSON_IsNumber(one) || one->valuedouble != floor(one->valuedouble) ||
            one->valuedouble < 0 || one->valuedouble >= (double)max_id) {
            char what[96];
            snprintf(what, sizeof(what), "a token id in [0, %lld) or a list of them",
                     (long long)max_id);
            return bad_value(c, "eos_token_id", what, v);
        }
        int id = (int)one->valuedouble;
        bool dup = false;
        for (int i = 0; i < have && !dup; i++)
            dup = ids[i] == id;
        if (dup)
            continue;
        if (have >= cap) {
            char lb[LABEL_CAP];
            qs_log_error(c->fn, "%s: more than %d distinct eos_token_id values",
                         label(c, lb), cap);
            return QS_JSON_ERR_VALUE;
        }
        ids[have++] = id;
    }
    *n = have;
    return QS_JSON_OK;
}

const char *qs_rope_type_name(enum qs_rope_type t)
{
    switch (t) {
    case QS_ROPE_DEFAULT: return "default";
    case QS_ROPE_LINEAR: return "linear";
    case QS_ROPE_LLAMA3: return "llama3";
    }
    return "?";
}

/* The rope type of a RoPE object: "rope_type" or the older "type", lower-cased. */
static enum qs_json_err rope_type(const struct qs_json_ctx *c, const cJSON *rs, const char *key,
                                  char type[32])
{
    char lb[LABEL_CAP], type2[32];
    enum qs_json_err e;
    if ((e = qs_json_string(c, rs, "rope_type", true, type, 32)) ||
        (e = qs_json_string(c, rs, "type", true, type2, sizeof(type2))))
        return e;
    if (!type[0]) {
        memcpy(type, type2, sizeof(type2));
    } else if (type2[0] && strcmp(type, type2) != 0) {
        qs_log_error(c->fn, "%s: %s rope_type \"%s\" and type \"%s\" disagree", label(c, lb),
                     key, type, type2);
        return QS_JSON_ERR_VALUE;
    }
    return QS_JSON_OK;
}

/* The factors of a linear or llama3 object into *r (original_max_position_embeddings 0 when
 * absent); rc labels the keys inside the object. */
static enum qs_json_err rope_factors(const struct qs_json_ctx *c, const struct qs_json_ctx *rc,
                                     const cJSON *rs, const char *key, struct qs_rope_scaling *r)
{
    char lb[LABEL_CAP];
    const double lo = FLT_MIN, hi = 1e6;
    enum qs_json_err e;
    if ((e = qs_json_number(rc, rs, "factor", true, 0, lo, hi, &r->factor)) ||
        r->type == QS_ROPE_LINEAR)
        return e;
    if ((e = qs_json_number(rc, rs, "low_freq_factor", true, 0, lo, hi, &r->low_freq_factor)) ||
        (e = qs_json_number(rc, rs, "high_freq_factor", true, 0, lo, hi,
                            &r->high_freq_factor)) ||
        (e = qs_json_int(rc, rs, "original_max_position_embeddings", false, 0, 1, 1ll << 30,
                         &r->original_max_position_embeddings)))
        return e;
    if (!(r->high_freq_factor > r->low_freq_factor)) {
        qs_log_error(c->fn, "%s: llama3 %s needs high_freq_factor > low_freq_factor (got %g, %g)",
                     label(c, lb), key, r->high_freq_factor, r->low_freq_factor);
        return QS_JSON_ERR_VALUE;
    }
    return QS_JSON_OK;
}

/* The body of qs_json_rope_object: rs is the object under `key`; rc labels its keys. */
static enum qs_json_err rope_object(const struct qs_json_ctx *c, const struct qs_json_ctx *rc,
                                    const cJSON *rs, const char *key, struct qs_rope_object *r)
{
    char lb[LABEL_CAP], type[32];
    enum qs_json_err e;
    for (const cJSON *m = rs->child; m; m = m->next)
        if (cJSON_IsObject(m)) {
            qs_log_error(c->fn, "%s: \"%s\" holds an object under \"%.60s\": per-layer-type RoPE "
                                "parameters are not supported (one RoPE for every layer only)",
                         label(c, lb), key, m->string);
            return QS_JSON_ERR_UNSUPPORTED;
        }
    if ((e = rope_type(c, rs, key, type)) ||
        (e = qs_json_number(rc, rs, "rope_theta", false, 0, 0.0, 1e12, &r->rope_theta)) ||
        (e = qs_json_number(rc, rs, "partial_rotary_factor", false, 0, 0.0, 1.0,
                            &r->partial_rotary_factor)))
        return e;
    if (!type[0] || strcmp(type, "default") == 0)
        return QS_JSON_OK;
    if (strcmp(type, "linear") == 0)
        r->scaling.type = QS_ROPE_LINEAR;
    else if (strcmp(type, "llama3") == 0)
        r->scaling.type = QS_ROPE_LLAMA3;
    else {
        qs_log_error(c->fn, "%s: %s type \"%s\" is not supported (supported: default, linear, "
                            "llama3)",
                     label(c, lb), key, type);
        return QS_JSON_ERR_UNSUPPORTED;
    }
    return rope_factors(c, rc, rs, key, &r->scaling);
}

enum qs_json_err qs_json_rope_object(const struct qs_json_ctx *c, const cJSON *o,
                                     const char *key, struct qs_rope_object *out)
{
    char lb[LABEL_CAP], file[LABEL_CAP];
    const cJSON *rs = given(o, key);
    memset(out, 0, sizeof(*out));
    out->scaling.type = QS_ROPE_DEFAULT;
    if (!rs)
        return QS_JSON_OK;
    if (!cJSON_IsObject(rs)) {
        qs_log_error(c->fn, "%s: \"%s\" must be null or an object", label(c, lb), key);
        return QS_JSON_ERR_VALUE;
    }
    /* keys inside are reported as "<where>/<file> <key>: ..." */
    snprintf(file, sizeof(file), "%.280s %.60s", c->file ? c->file : c->where ? c->where : "?",
             key);
    const struct qs_json_ctx rc = {c->fn, c->file ? c->where : file, c->file ? file : NULL};
    struct qs_rope_object r;
    memset(&r, 0, sizeof(r));
    r.given = rs->child != NULL; /* {} says nothing (transformers 5: an empty dict is falsy) */
    r.scaling.type = QS_ROPE_DEFAULT;
    enum qs_json_err e = rope_object(c, &rc, rs, key, &r);
    if (e)
        return e;
    *out = r;
    return QS_JSON_OK;
}

enum qs_json_err qs_json_rope_scaling(const struct qs_json_ctx *c, const cJSON *o,
                                      struct qs_rope_scaling *out)
{
    char lb[LABEL_CAP];
    struct qs_rope_object r;
    memset(out, 0, sizeof(*out));
    out->type = QS_ROPE_DEFAULT;
    enum qs_json_err e = qs_json_rope_object(c, o, "rope_scaling", &r);
    if (e)
        return e;
    if (r.scaling.type == QS_ROPE_LLAMA3 && r.scaling.original_max_position_embeddings == 0) {
        qs_log_error(c->fn, "%s rope_scaling: required key \"original_max_position_embeddings\" "
                            "is missing",
                     label(c, lb));
        return QS_JSON_ERR_VALUE;
    }
    *out = r.scaling;
    return QS_JSON_OK;
}

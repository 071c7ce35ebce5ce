/*
 * rt_config.c - parse and validate the model config JSON of a rank file (docs/DESIGN.md
 * section 6) into struct rt_config. The JSON comes from a file we treat as hostile: every key
 * is type- and range-checked and every derived relation (TP split, padding) is recomputed and
 * compared, so the model code can trust the struct.
 * Entry points: rt_config_parse, rt_config_same (rt.h). Test: ./build/test_model (config cases).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h> /* cJSON_ParseWithLength, cJSON_GetObjectItemCaseSensitive */

#include "qs_log.h" /* qs_log_error */
#include "rt.h"

/* Integer key: required or defaulted; must be an integral number in [lo, hi]. */
static enum rt_err get_int(const cJSON *o, const char *key, const char *where, bool required,
                           long long lo, long long hi, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) {
            qs_log_error(__func__, "%s: config: missing key \"%s\"", where, key);
            return RT_ERR_CONFIG;
        }
        *out = def;
        return RT_ERR_NONE;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < (double)lo || d > (double)hi) {
        qs_log_error(__func__, "%s: config: \"%s\" must be an integer in [%lld, %lld]", where,
                     key, lo, hi);
        return RT_ERR_CONFIG;
    }
    *out = (int)d;
    return RT_ERR_NONE;
}

/* Positive finite number key (required unless def >= 0). */
static enum rt_err get_pos(const cJSON *o, const char *key, const char *where, double def,
                           double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0) {
            qs_log_error(__func__, "%s: config: missing key \"%s\"", where, key);
            return RT_ERR_CONFIG;
        }
        *out = def;
        return RT_ERR_NONE;
    }
    /* also representable as a positive fp32 (rms_norm_eps and rope factors are used as float) */
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0 ||
        v->valuedouble > FLT_MAX || (float)v->valuedouble <= 0) {
        qs_log_error(__func__, "%s: config: \"%s\" must be a positive number in fp32 range", where,
                     key);
        return RT_ERR_CONFIG;
    }
    *out = v->valuedouble;
    return RT_ERR_NONE;
}

static enum rt_err get_bool(const cJSON *o, const char *key, const char *where, bool def,
                            bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return RT_ERR_NONE;
    }
    if (!cJSON_IsBool(v)) {
        qs_log_error(__func__, "%s: config: \"%s\" must be true or false", where, key);
        return RT_ERR_CONFIG;
    }
    *out = cJSON_IsTrue(v);
    return RT_ERR_NONE;
}

#define TRY(expr)                        \
    do {                                 \
        enum rt_err try_err_ = (expr);   \
        if (try_err_ != RT_ERR_NONE) {   \
            err = try_err_;              \
            goto out;                    \
        }                                \
    } while (0)

#define BAD(...)                                        \
    do {                                                \
        qs_log_error("rt_config_parse", __VA_ARGS__);   \
        err = RT_ERR_CONFIG;                            \
        goto out;                                       \
    } while (0)

static enum rt_err parse_rope_scaling(const cJSON *root, const char *where, struct rt_config *c)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    c->rope_scaling.type = REF_ROPE_DEFAULT;
    if (!rs || cJSON_IsNull(rs))
        return RT_ERR_NONE;
    if (!cJSON_IsObject(rs)) {
        qs_log_error(__func__, "%s: config: \"rope_scaling\" must be null or an object", where);
        return RT_ERR_CONFIG;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) {
        qs_log_error(__func__, "%s: config: rope_scaling needs a string \"rope_type\"", where);
        return RT_ERR_CONFIG;
    }
    double f, lo, hi, L;
    enum rt_err err = get_pos(rs, "factor", where, -1, &f);
    if (err)
        return err;
    c->rope_scaling.factor = (float)f;
    if (strcmp(t->valuestring, "linear") == 0) {
        c->rope_scaling.type = REF_ROPE_LINEAR;
        return RT_ERR_NONE;
    }
    if (strcmp(t->valuestring, "llama3") != 0) {
        qs_log_error(__func__, "%s: config: rope_scaling type \"%s\" is not supported "
                     "(supported: linear, llama3)", where, t->valuestring);
        return RT_ERR_UNSUPPORTED;
    }
    if ((err = get_pos(rs, "low_freq_factor", where, -1, &lo)) ||
        (err = get_pos(rs, "high_freq_factor", where, -1, &hi)) ||
        (err = get_pos(rs, "original_max_position_embeddings", where, -1, &L)))
        return err;
    if (!(hi > lo)) {
        qs_log_error(__func__, "%s: config: rope_scaling high_freq_factor %g must exceed "
                     "low_freq_factor %g", where, hi, lo);
        return RT_ERR_CONFIG;
    }
    c->rope_scaling.type = REF_ROPE_LLAMA3;
    c->rope_scaling.low_freq_factor = (float)lo;
    c->rope_scaling.high_freq_factor = (float)hi;
    c->rope_scaling.original_max_position_embeddings = (float)L;
    return RT_ERR_NONE;
}

static enum rt_err parse_tokens(const cJSON *root, const char *where, struct rt_config *c)
{
    enum rt_err err = get_int(root, "bos_token_id", where, false, 0, INT32_MAX, -1,
                              &c->bos_token_id);
    if (err)
        return err;
    if (c->bos_token_id >= c->vocab_size) {
        qs_log_error(__func__, "%s: config: bos_token_id %d >= vocab_size %d", where,
                     c->bos_token_id, c->vocab_size);
        return RT_ERR_CONFIG;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    c->n_eos = 0;
    if (!e || cJSON_IsNull(e))
        return RT_ERR_NONE;
    const cJSON *it = e;
    bool arr = cJSON_IsArray(e);
    if (arr)
        it = e->child;
    for (; it; it = arr ? it->next : NULL) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
            it->valuedouble < 0 || it->valuedouble >= c->vocab_size) {
            qs_log_error(__func__, "%s: config: \"eos_token_id\" must be ids in [0, %d)", where,
                         c->vocab_size);
            return RT_ERR_CONFIG;
        }
        if (c->n_eos == RT_MAX_EOS) {
            qs_log_error(__func__, "%s: config: more than %d eos_token_id values", where,
                         RT_MAX_EOS);
            return RT_ERR_CONFIG;
        }
        c->eos_token_ids[c->n_eos++] = (int)it->valuedouble;
    }
    return RT_ERR_NONE;
}

/* The "tp" object and every relation DESIGN 5 derives from it. */
static enum rt_err parse_tp(const cJSON *root, const char *where, struct rt_config *c)
{
    enum rt_err err = RT_ERR_NONE;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "tp");
    if (!cJSON_IsObject(tp))
        BAD("%s: config: missing object \"tp\"", where);
    TRY(get_int(tp, "world_size", where, true, 1, FMT_MAX_WORLD_SIZE, 0, &c->world_size));
    TRY(get_int(tp, "rank", where, true, 0, c->world_size - 1, 0, &c->rank));
    TRY(get_int(tp, "heads_per_rank", where, true, 1, 1 << 20, 0, &c->heads_per_rank));
    TRY(get_int(tp, "kv_heads_per_rank", where, true, 1, 1 << 20, 0, &c->kv_heads_per_rank));
    TRY(get_int(tp, "kv_head_replicas", where, false, 1, 1 << 20, 1, &c->kv_head_replicas));
    TRY(get_int(tp, "intermediate_per_rank", where, true, 1, 1 << 28, 0,
                &c->intermediate_per_rank));
    int ws = c->world_size;
    if (c->n_heads % ws || c->heads_per_rank != c->n_heads / ws)
        BAD("%s: config: tp.heads_per_rank %d: expected num_attention_heads %d / world_size %d "
            "(which must divide)", where, c->heads_per_rank, c->n_heads, ws);
    int want_kv, want_rep;
    if (ws <= c->n_kv_heads) {
        if (c->n_kv_heads % ws)
            BAD("%s: config: num_key_value_heads %d not divisible by world_size %d", where,
                c->n_kv_heads, ws);
        want_kv = c->n_kv_heads / ws, want_rep = 1;
    } else {
        if (ws % c->n_kv_heads)
            BAD("%s: config: world_size %d not a multiple of num_key_value_heads %d", where, ws,
                c->n_kv_heads);
        want_kv = 1, want_rep = ws / c->n_kv_heads;
    }
    if (c->kv_heads_per_rank != want_kv || c->kv_head_replicas != want_rep)
        BAD("%s: config: tp kv_heads_per_rank %d, kv_head_replicas %d: expected %d, %d", where,
            c->kv_heads_per_rank, c->kv_head_replicas, want_kv, want_rep);
    if ((long long)c->intermediate_per_rank * ws != c->intermediate_size_padded)
        BAD("%s: config: tp.intermediate_per_rank %d * world_size %d != "
            "intermediate_size_padded %d", where, c->intermediate_per_rank, ws,
            c->intermediate_size_padded);
    int want_vr = (int)(((long long)c->vocab_size + ws - 1) / ws);
    if (c->vocab_size_per_rank != want_vr)
        BAD("%s: config: vocab_size_per_rank %d: expected ceil(%d / %d) = %d", where,
            c->vocab_size_per_rank, c->vocab_size, ws, want_vr);
out:
    return err;
}

static enum rt_err parse_quant(const cJSON *root, const char *where, struct rt_config *c)
{
    enum rt_err err = RT_ERR_NONE;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quant");
    if (!cJSON_IsObject(q))
        BAD("%s: config: missing object \"quant\"", where);
    TRY(get_int(q, "w_bit", where, true, 1, 64, 0, &c->w_bit));
    if (c->w_bit != 4) {
        qs_log_error(__func__, "%s: config: quant.w_bit %d: only 4-bit weights are supported",
                     where, c->w_bit);
        return RT_ERR_UNSUPPORTED;
    }
    /* -1 = per-channel AWQ (one group spans each linear's whole K; the converter writes it as
     * the source config spells it); each linear's own group size comes from its scales tensor. */
    TRY(get_int(q, "group_size", where, true, -1, 1 << 20, 0, &c->group_size));
    if (c->group_size != -1 && (c->group_size < 16 || c->group_size % 16))
        BAD("%s: config: quant.group_size %d: expected -1 (per-channel) or a multiple of 16",
            where, c->group_size);
    TRY(get_bool(q, "zero_point", where, true, &c->zero_point));
out:
    return err;
}

enum rt_err rt_config_parse(const char *json, size_t len, const char *where,
                            struct rt_config *out)
{
    enum rt_err err = RT_ERR_NONE;
    struct rt_config c;
    memset(&c, 0, sizeof(c));
    memset(out, 0, sizeof(*out));
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root))
        BAD("%s: config section is not a JSON object", where);

    int version;
    TRY(get_int(root, "qshard_config_version", where, true, 0, INT32_MAX, 0, &version));
    if (version != 1) {
        qs_log_error(__func__, "%s: config: qshard_config_version %d: this runtime reads 1",
                     where, version);
        err = RT_ERR_UNSUPPORTED;
        goto out;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architecture");
    if (!cJSON_IsString(arch))
        BAD("%s: config: missing string \"architecture\"", where);
    c.arch = rt_arch_find(arch->valuestring);
    if (!c.arch) {
        qs_log_error(__func__, "%s: config: architecture \"%.32s\" is not supported (%s)", where,
                     arch->valuestring, rt_arch_names());
        err = RT_ERR_UNSUPPORTED;
        goto out;
    }
    snprintf(c.architecture, sizeof(c.architecture), "%s", arch->valuestring);

    const int BIG = 1 << 28;
    TRY(get_int(root, "hidden_size", where, true, 1, 1 << 20, 0, &c.hidden_size));
    TRY(get_int(root, "intermediate_size", where, true, 1, BIG, 0, &c.intermediate_size));
    TRY(get_int(root, "intermediate_size_padded", where, true, c.intermediate_size, BIG, 0,
                &c.intermediate_size_padded));
    TRY(get_int(root, "num_hidden_layers", where, true, 1, 100000, 0, &c.n_layers));
    TRY(get_int(root, "num_attention_heads", where, true, 1, 1 << 16, 0, &c.n_heads));
    TRY(get_int(root, "num_key_value_heads", where, true, 1, c.n_heads, 0, &c.n_kv_heads));
    TRY(get_int(root, "head_dim", where, true, 2, 1 << 14, 0, &c.head_dim));
    TRY(get_int(root, "vocab_size", where, true, 1, BIG, 0, &c.vocab_size));
    TRY(get_int(root, "vocab_size_per_rank", where, true, 1, BIG, 0, &c.vocab_size_per_rank));
    if (c.n_heads % c.n_kv_heads)
        BAD("%s: config: num_attention_heads %d not a multiple of num_key_value_heads %d", where,
            c.n_heads, c.n_kv_heads);
    if (c.head_dim % 2)
        BAD("%s: config: head_dim %d must be even for rotary embeddings", where, c.head_dim);
    /* keeps every per-rank width the runtime computes in int: qkv columns, o_proj rows */
    if ((long long)(c.n_heads + 2LL * c.n_kv_heads) * c.head_dim > (1LL << 24))
        BAD("%s: config: (num_attention_heads %d + 2 * num_key_value_heads %d) * head_dim %d "
            "exceeds 2^24", where, c.n_heads, c.n_kv_heads, c.head_dim);
    double eps, theta;
    TRY(get_pos(root, "rms_norm_eps", where, -1, &eps));
    TRY(get_pos(root, "rope_theta", where, -1, &theta));
    c.rms_norm_eps = (float)eps;
    c.rope_theta = theta;
    TRY(parse_rope_scaling(root, where, &c));
    TRY(get_int(root, "max_position_embeddings", where, true, 1, INT32_MAX, 0,
                &c.max_position_embeddings));
    TRY(get_bool(root, "tie_word_embeddings", where, false, &c.tie_word_embeddings));
    TRY(get_int(root, "sliding_window", where, false, 1, INT32_MAX, 0, &c.sliding_window));
    TRY(get_bool(root, "attention_bias", where, false, &c.attention_bias));
    TRY(get_int(root, "num_local_experts", where, false, 0, 1 << 16, 0, &c.n_experts));
    TRY(get_int(root, "num_experts_per_tok", where, false, 0, 1 << 16, 0,
                &c.n_experts_per_tok));
    TRY(parse_quant(root, where, &c));
    TRY(parse_tokens(root, where, &c));
    TRY(parse_tp(root, where, &c));
    if (c.arch->check)
        TRY(c.arch->check(&c, where));
    *out = c;
out:
    cJSON_Delete(root);
    return err;
}

bool rt_config_same(const struct rt_config *a, const char *where_a, const struct rt_config *b,
                    const char *where_b)
{
#define SAME(f)                                                                               \
    if (a->f != b->f) {                                                                       \
        qs_log_error(__func__, "rank files %s and %s disagree on config field %s", where_a,   \
                     where_b, #f);                                                            \
        return false;                                                                         \
    }
    SAME(arch) SAME(hidden_size) SAME(intermediate_size) SAME(intermediate_size_padded)
    SAME(n_layers) SAME(n_heads) SAME(n_kv_heads) SAME(head_dim) SAME(vocab_size)
    SAME(vocab_size_per_rank) SAME(rms_norm_eps) SAME(rope_theta) SAME(rope_scaling.type)
    SAME(rope_scaling.factor) SAME(rope_scaling.low_freq_factor)
    SAME(rope_scaling.high_freq_factor) SAME(rope_scaling.original_max_position_embeddings)
    SAME(max_position_embeddings) SAME(tie_word_embeddings) SAME(sliding_window)
    SAME(attention_bias) SAME(n_experts) SAME(n_experts_per_tok) SAME(group_size)
    SAME(zero_point) SAME(world_size) SAME(heads_per_rank) SAME(kv_heads_per_rank)
    SAME(kv_head_replicas) SAME(intermediate_per_rank) SAME(bos_token_id) SAME(n_eos)
#undef SAME
    for (int i = 0; i < a->n_eos; i++)
        if (a->eos_token_ids[i] != b->eos_token_ids[i]) {
            qs_log_error(__func__, "rank files %s and %s disagree on eos_token_id", where_a,
                         where_b);
            return false;
        }
    return true;
}

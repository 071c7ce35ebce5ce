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

#include "qs_json.h" /* qs_json_int, qs_json_number, qs_json_bool, qs_json_eos_ids, ... */
#include "qs_log.h"  /* qs_log_error */
#include "rt.h"

/* Config-section readers (format/qs_json.h), as error codes of this module. `j` names the file in
 * messages ("<where>: config: ..."). */
static enum rt_err from_json(enum qs_json_err e)
{
    switch (e) {
    case QS_JSON_OK: return RT_ERR_NONE;
    case QS_JSON_ERR_UNSUPPORTED: return RT_ERR_UNSUPPORTED;
    case QS_JSON_ERR_NOMEM: return RT_ERR_NOMEM;
    case QS_JSON_ERR_SYNTAX:
    case QS_JSON_ERR_VALUE: break;
    }
    return RT_ERR_CONFIG;
}

/* Integer key in [lo, hi] (qs_json_int) into an int. */
static enum rt_err get_int(const struct qs_json_ctx *j, const cJSON *o, const char *key,
                           bool required, long long lo, long long hi, int def, int *out)
{
    int64_t v;
    enum rt_err err = from_json(qs_json_int(j, o, key, required, def, lo, hi, &v));
    if (!err)
        *out = (int)v;
    return err;
}

/* Positive number that stays positive and finite in fp32 (rms_norm_eps, rope_theta). */
static enum rt_err get_pos(const struct qs_json_ctx *j, const cJSON *o, const char *key,
                           double *out)
{
    return from_json(qs_json_number(j, o, key, true, 0, 0x1p-150, FLT_MAX, out));
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

static enum rt_err parse_tokens(const struct qs_json_ctx *j, const cJSON *root, const char *where,
                                struct rt_config *c)
{
    enum rt_err err = get_int(j, root, "bos_token_id", false, 0, INT32_MAX, -1,
                              &c->bos_token_id);
    if (err)
        return err;
    if (c->bos_token_id >= c->vocab_size) {
        qs_log_error(__func__, "%s: config: bos_token_id %d >= vocab_size %d", where,
                     c->bos_token_id, c->vocab_size);
        return RT_ERR_CONFIG;
    }
    c->n_eos = 0;
    return from_json(qs_json_eos_ids(j, root, c->vocab_size, c->eos_token_ids, RT_MAX_EOS,
                                     &c->n_eos));
}

/* The "tp" object and every relation DESIGN 5 derives from it. */
static enum rt_err parse_tp(const struct qs_json_ctx *j, const cJSON *root, const char *where,
                            struct rt_config *c)
{
    enum rt_err err = RT_ERR_NONE;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "tp");
    if (!cJSON_IsObject(tp))
        BAD("%s: config: missing object \"tp\"", where);
    TRY(get_int(j, tp, "world_size", true, 1, FMT_MAX_WORLD_SIZE, 0, &c->world_size));
    TRY(get_int(j, tp, "rank", true, 0, c->world_size - 1, 0, &c->rank));
    TRY(get_int(j, tp, "heads_per_rank", true, 1, 1 << 20, 0, &c->heads_per_rank));
    TRY(get_int(j, tp, "kv_heads_per_rank", true, 1, 1 << 20, 0, &c->kv_heads_per_rank));
    TRY(get_int(j, tp, "kv_head_replicas", false, 1, 1 << 20, 1, &c->kv_head_replicas));
    TRY(get_int(j, tp, "intermediate_per_rank", true, 1, 1 << 28, 0,
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

static enum rt_err parse_quant(const struct qs_json_ctx *j, const cJSON *root, const char *where,
                               struct rt_config *c)
{
    enum rt_err err = RT_ERR_NONE;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quant");
    if (!cJSON_IsObject(q))
        BAD("%s: config: missing object \"quant\"", where);
    TRY(get_int(j, q, "w_bit", true, 1, 64, 0, &c->w_bit));
    if (c->w_bit != 4) {
        qs_log_error(__func__, "%s: config: quant.w_bit %d: only 4-bit weights are supported",
                     where, c->w_bit);
        return RT_ERR_UNSUPPORTED;
    }
    /* -1 = per-channel AWQ (one group spans each linear's whole K; the converter writes it as
     * the source config spells it); each linear's own group size comes from its scales tensor. */
    TRY(get_int(j, q, "group_size", true, -1, 1 << 20, 0, &c->group_size));
    if (c->group_size != -1 && (c->group_size < 16 || c->group_size % 16))
        BAD("%s: config: quant.group_size %d: expected -1 (per-channel) or a multiple of 16",
            where, c->group_size);
    TRY(from_json(qs_json_bool(j, q, "zero_point", true, &c->zero_point)));
out:
    return err;
}

/* Gemma 2 / 3's keys (DESIGN 6): embed_scale and attn_scale (required), attn_softcap,
 * final_softcap, sliding_window_pattern, rope_local_theta (absent = none); allowed only where
 * the architecture has post norms (arch->post_norms). */
static enum rt_err parse_gemma(const struct qs_json_ctx *j, const cJSON *root, const char *where,
                               struct rt_config *c)
{
    enum rt_err err = RT_ERR_NONE;
    static const char *const keys[] = {"embed_scale", "attn_scale", "attn_softcap",
                                       "final_softcap", "sliding_window_pattern",
                                       "rope_local_theta"};
    if (!c->arch->post_norms) {
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (cJSON_GetObjectItemCaseSensitive(root, keys[i]))
                BAD("%s: config: key %s is not used by architecture %s", where, keys[i],
                    c->arch->name);
        c->embed_scale = 1.0f;
        return RT_ERR_NONE;
    }
    double es, as, acap, fcap, lt;
    TRY(from_json(qs_json_number(j, root, "embed_scale", true, 1.0, 1e-6, 1e6, &es)));
    TRY(from_json(qs_json_number(j, root, "attn_scale", true, 0.0, 1e-6, 1e3, &as)));
    TRY(from_json(qs_json_number(j, root, "attn_softcap", false, 0.0, 0.0, 1e6, &acap)));
    TRY(from_json(qs_json_number(j, root, "final_softcap", false, 0.0, 0.0, 1e6, &fcap)));
    TRY(from_json(qs_json_number(j, root, "rope_local_theta", false, 0.0, 0.0, 1e12, &lt)));
    TRY(get_int(j, root, "sliding_window_pattern", false, 0, 1 << 16, 0,
                &c->sliding_window_pattern));
    c->embed_scale = (float)es;
    c->attn_scale = (float)as;
    c->attn_softcap = (float)acap;
    c->final_softcap = (float)fcap;
    c->rope_local_theta = lt;
    if (c->sliding_window_pattern > 0 && c->sliding_window <= 0)
        BAD("%s: config: sliding_window_pattern %d without a sliding_window", where,
            c->sliding_window_pattern);
    if (c->rope_local_theta > 0.0 && c->rope_local_theta < 1.0)
        BAD("%s: config: rope_local_theta %g: expected >= 1 (or absent)", where,
            c->rope_local_theta);
    if (c->rope_local_theta > 0.0 && c->sliding_window_pattern <= 0)
        BAD("%s: config: rope_local_theta without a sliding_window_pattern (no local layers)",
            where);
out:
    return err;
}

enum rt_err rt_config_parse(const char *json, size_t len, const char *where,
                            struct rt_config *out)
{
    enum rt_err err = RT_ERR_NONE;
    struct rt_config c;
    char label[512];
    snprintf(label, sizeof(label), "%s: config", where);
    const struct qs_json_ctx jc = {"rt_config_parse", label, NULL}, *j = &jc;
    memset(&c, 0, sizeof(c));
    memset(out, 0, sizeof(*out));
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root))
        BAD("%s: config section is not a JSON object", where);

    int version;
    TRY(get_int(j, root, "qshard_config_version", true, 0, INT32_MAX, 0, &version));
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
    TRY(get_int(j, root, "hidden_size", true, 1, 1 << 20, 0, &c.hidden_size));
    TRY(get_int(j, root, "intermediate_size", true, 1, BIG, 0, &c.intermediate_size));
    TRY(get_int(j, root, "intermediate_size_padded", true, c.intermediate_size, BIG, 0,
                &c.intermediate_size_padded));
    TRY(get_int(j, root, "num_hidden_layers", true, 1, 100000, 0, &c.n_layers));
    TRY(get_int(j, root, "num_attention_heads", true, 1, 1 << 16, 0, &c.n_heads));
    TRY(get_int(j, root, "num_key_value_heads", true, 1, c.n_heads, 0, &c.n_kv_heads));
    TRY(get_int(j, root, "head_dim", true, 2, 1 << 14, 0, &c.head_dim));
    TRY(get_int(j, root, "vocab_size", true, 1, BIG, 0, &c.vocab_size));
    TRY(get_int(j, root, "vocab_size_per_rank", true, 1, BIG, 0, &c.vocab_size_per_rank));
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
    TRY(get_pos(j, root, "rms_norm_eps", &eps));
    TRY(get_pos(j, root, "rope_theta", &theta));
    c.rms_norm_eps = (float)eps;
    c.rope_theta = theta;
    TRY(from_json(qs_json_rope_scaling(j, root, &c.rope_scaling)));
    TRY(get_int(j, root, "max_position_embeddings", true, 1, INT32_MAX, 0,
                &c.max_position_embeddings));
    TRY(from_json(qs_json_bool(j, root, "tie_word_embeddings", false, &c.tie_word_embeddings)));
    TRY(get_int(j, root, "sliding_window", false, 1, INT32_MAX, 0, &c.sliding_window));
    TRY(from_json(qs_json_bool(j, root, "attention_bias", false, &c.attention_bias)));
    TRY(get_int(j, root, "num_local_experts", false, 0, 1 << 16, 0, &c.n_experts));
    TRY(get_int(j, root, "num_experts_per_tok", false, 0, 1 << 16, 0,
                &c.n_experts_per_tok));
    TRY(from_json(qs_json_bool(j, root, "norm_topk_prob", false, &c.norm_topk_prob)));
    if (!cJSON_GetObjectItemCaseSensitive(root, "norm_topk_prob"))
        c.norm_topk_prob = true; /* files before Qwen3-MoE: Mixtral, which always renormalises */
    double abm = 0.0;
    TRY(from_json(qs_json_number(j, root, "alibi_bias_max", false, 0.0, 0.0, 1e6, &abm)));
    c.alibi_bias_max = (float)abm;
    if ((c.alibi_bias_max > 0.0f) != c.arch->alibi)
        BAD("%s: config: alibi_bias_max %g with architecture %s (ALiBi is %s)", where,
            (double)c.alibi_bias_max, c.arch->name, c.arch->alibi ? "required" : "not used");
    TRY(parse_gemma(j, root, where, &c));
    TRY(parse_quant(j, root, where, &c));
    TRY(parse_tokens(j, root, where, &c));
    TRY(parse_tp(j, root, where, &c));
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
    SAME(attention_bias) SAME(n_experts) SAME(n_experts_per_tok) SAME(norm_topk_prob) SAME(group_size)
    SAME(alibi_bias_max) SAME(embed_scale) SAME(attn_scale) SAME(attn_softcap)
    SAME(final_softcap) SAME(sliding_window_pattern) SAME(rope_local_theta)
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

/*
 * cvt_arch_falcon.c - Falcon on the converter side: FalconForCausalLM (model_type "falcon") and
 * the older remote-code spelling RWForCausalLM (model_type "RefinedWebModel"), the layout of
 * Falcon-7B and of AutoAWQ's Falcon exports: multi-query attention (one kv head) with q, k and v
 * fused into self_attention.query_key_value as [q (num_attention_heads * head_dim) | k (head_dim)
 * | v (head_dim)] along out_features, attention and MLP in parallel on one input_layernorm
 * (LayerNorm with bias), MLP dense_h_to_4h -> GELU -> dense_4h_to_h (not gated), final
 * transformer.ln_f with bias, rotary positions.
 *
 * Tensors (transformers models/falcon/modeling_falcon.py names -> canonical roles of
 * format/fmt_names.h), per layer i of "transformer.h.%d":
 *   input_layernorm.weight / .bias -> attn norm and its bias (replicated F32);
 *   self_attention.query_key_value -> qkv_proj column-parallel [q_r | k | v] (the fused source cut
 *     in three column ranges, cvt_arch.h; the one kv head replicated on every rank);
 *   self_attention.dense -> o_proj (row-parallel);
 *   mlp.dense_h_to_4h -> mlp.gate_up_proj holding the up projection alone (column-parallel,
 *     I_r columns: the runtime's plain GELU reads it, rt_act_gated);
 *   mlp.dense_4h_to_h -> down_proj (row-parallel).
 * Config (configuration_falcon.py FalconConfig; RWConfig of the tiiuae remote code): the common
 * keys under Falcon's spellings (n_head, n_layer, n_embed, both spellings refused when they
 * disagree; num_kv_heads ignored as transformers ignores it with multi_query, n_head_kv refused,
 * layer_norm_epsilon, ffn_hidden_size = 4 * hidden_size when absent, activation "gelu");
 * defaults rope_theta 10000, max_position_embeddings 2048, layer_norm_epsilon 1e-5, tied
 * embeddings (PretrainedConfig's default). new_decoder_architecture (Falcon-40B / 180B,
 * Falcon2-11B): num_kv_heads kv heads, the fused query_key_value grouped per kv head [q of the
 * group | k | v] (gathered per rank by the plan: cvt_arch qkv_grouped), ln_attn + ln_mlp with
 * biases (num_ln_in_parallel_attn 2, the default; 1: one input_layernorm as 7B). Refused: alibi
 * (falcon-rw: ALiBi instead of rotary), multi_query false without new_decoder_architecture (q, k,
 * v interleaved per head), parallel_attn false, the remote-code n_head_kv spelling.
 * bias true puts biases on all four linears (kept; the row-parallel ones on rank 0).
 * Tests: ./build/test_cvt (fixture falcon-mqa-parallel at TP 1/2/4), ./build/test_cvt_config.
 */
#include <cjson/cJSON.h> /* n_head_kv */

#include "cvt_arch.h"
#include "cvt_src_int.h" /* CVT_TRY_JSON */
#include "qs_log.h"

static const struct cvt_arch_linear attention[2] = {
    {FMT_N_QKV, FMT_SPLIT_COLUMN, 3,
     {{"self_attention.query_key_value", CVT_AXIS_HIDDEN, CVT_AXIS_Q},
      {"self_attention.query_key_value", CVT_AXIS_HIDDEN, CVT_AXIS_KV},
      {"self_attention.query_key_value", CVT_AXIS_HIDDEN, CVT_AXIS_KV}}},
    {FMT_N_O, FMT_SPLIT_ROW, 1, {{"self_attention.dense", CVT_AXIS_Q, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_linear mlp[2] = {
    {FMT_N_GATE_UP, FMT_SPLIT_COLUMN, 1, {{"mlp.dense_h_to_4h", CVT_AXIS_HIDDEN, CVT_AXIS_INTER}}},
    {FMT_N_DOWN, FMT_SPLIT_ROW, 1, {{"mlp.dense_4h_to_h", CVT_AXIS_INTER, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "input_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM_BIAS, "input_layernorm.bias", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, attention},
    {CVT_ARCH_OP_IGNORE, FMT_N_COUNT, "self_attention.maybe_rotary.inv_freq", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, mlp},
};

/* Falcon-40B / 180B (new_decoder_architecture): q, k, v grouped per kv head in the fused source
 * (cvt_arch qkv_grouped), and with num_ln_in_parallel_attn 2 (the default) two LayerNorms:
 * ln_attn feeds attention, ln_mlp the MLP, both of the layer input */
static const struct cvt_arch_step layer40[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "ln_attn.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM_BIAS, "ln_attn.bias", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "ln_mlp.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM_BIAS, "ln_mlp.bias", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, attention},
    {CVT_ARCH_OP_IGNORE, FMT_N_COUNT, "self_attention.maybe_rotary.inv_freq", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, mlp},
};

static const char *const aliases[] = {
    "num_attention_heads", "n_head",  "num_hidden_layers", "n_layer",
    "hidden_size", "n_embed",         "rms_norm_eps", "layer_norm_epsilon",
    "intermediate_size", "ffn_hidden_size",
    "hidden_act", "activation",       NULL, NULL,
};

/* One refused Falcon layout flag: key == bad (absent: def; null is refused: transformers reads
 * None as false where the default is true). */
static enum cvt_err refuse_flag(const struct qs_json_ctx *c, const struct cJSON *o,
                                const char *key, bool def, bool bad, const char *what)
{
    bool v = def;
    if (qs_json_is_null(o, key)) {
        qs_log_error(c->fn, "%s/%s: %s is null: give true or false", c->where, c->file, key);
        return CVT_ERR_CONFIG;
    }
    CVT_TRY_JSON(qs_json_bool(c, o, key, def, &v));
    if (v == bad) {
        qs_log_error(c->fn, "%s/%s: %s %s: %s is not supported (Falcon's rotary, "
                            "multi_query or grouped, parallel_attn layouts only)", c->where, c->file, key,
                     bad ? "true" : "false", what);
        return CVT_ERR_UNSUPPORTED;
    }
    return CVT_ERR_NONE;
}

extern const struct cvt_arch cvt_arch_falcon_40b, cvt_arch_falcon_40b_ln1;

/* new_decoder_architecture (Falcon-40B / 180B; Falcon2-11B with one LayerNorm): num_kv_heads
 * (FalconConfig: num_attention_heads when absent or null) dividing the heads,
 * num_ln_in_parallel_attn 1 or 2 (absent or null: 2,
 * FalconDecoderLayer); the descriptor with the grouped query_key_value into cfg->arch. */
static enum cvt_err falcon_new_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                                    struct cvt_hf_config *cfg)
{
    const int64_t nq = cfg->num_attention_heads;
    int64_t nkv = nq, nln = 2;
    if (!qs_json_is_null(o, "num_kv_heads"))
        CVT_TRY_JSON(qs_json_int(c, o, "num_kv_heads", false, nq, 1, 65536, &nkv));
    if (nq % nkv) {
        qs_log_error(c->fn, "%s/%s: num_attention_heads %lld is not a multiple of num_kv_heads "
                            "%lld", c->where, c->file, (long long)nq, (long long)nkv);
        return CVT_ERR_CONFIG;
    }
    if (!qs_json_is_null(o, "num_ln_in_parallel_attn"))
        CVT_TRY_JSON(qs_json_int(c, o, "num_ln_in_parallel_attn", false, 2, 1, 2, &nln));
    cfg->num_key_value_heads = nkv;
    cfg->arch = nln == 2 ? &cvt_arch_falcon_40b : &cvt_arch_falcon_40b_ln1;
    return CVT_ERR_NONE;
}

static enum cvt_err falcon_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                                struct cvt_hf_config *cfg)
{
    bool bias = false, nda = false;
    CVT_TRY(refuse_flag(c, o, "alibi", false, true, "ALiBi position bias (falcon-rw)"));
    if (qs_json_is_null(o, "new_decoder_architecture")) {
        qs_log_error(c->fn, "%s/%s: new_decoder_architecture is null: give true or false",
                     c->where, c->file);
        return CVT_ERR_CONFIG;
    }
    CVT_TRY_JSON(qs_json_bool(c, o, "new_decoder_architecture", false, &nda));
    CVT_TRY_JSON(qs_json_bool(c, o, "bias", false, &bias));
    if (cJSON_GetObjectItemCaseSensitive(o, "n_head_kv")) { /* RW-40B's remote-code spelling */
        qs_log_error(c->fn, "%s/%s: n_head_kv (the remote-code RefinedWeb config of Falcon-40B) "
                            "is not supported: use the transformers config (num_kv_heads, "
                            "new_decoder_architecture)", c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    cfg->bias_roles = bias ? CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O) |
                                 CVT_ROLE_BIT(FMT_N_GATE_UP) | CVT_ROLE_BIT(FMT_N_DOWN)
                           : 0;
    /* both layouts: the MLP beside attention (new_decoder_architecture always adds them) */
    CVT_TRY(refuse_flag(c, o, "parallel_attn", true, false,
                        "sequential attention and MLP (post_attention_layernorm)"));
    if (nda)
        return falcon_new_keys(c, o, cfg);
    CVT_TRY(refuse_flag(c, o, "multi_query", true, false,
                        "query_key_value interleaved per head"));
    /* FalconAttention: one kv head with multi_query unless new_decoder_architecture */
    cfg->num_key_value_heads = 1;
    return CVT_ERR_NONE;
}

#define FALCON_COMMON                                                                          \
    .rope_theta = 10000.0, .max_position_embeddings = 2048, .num_key_value_heads = -1,         \
    .rms_norm_eps = 1e-5, .head_dim = 0, .sliding_window = 0, .hidden_act = "gelu",           \
    .ffn_mult = 4, .tie_word_embeddings = true, .key_aliases = aliases, .moe = false,          \
    .read_keys = falcon_keys, .hf_embed = "transformer.word_embeddings", .hf_lm_head = "lm_head", \
    .hf_final_norm = "transformer.ln_f.weight", .hf_final_norm_bias = "transformer.ln_f.bias",  \
    .hf_layer = "transformer.h.%d"

#define FALCON_STEPS(l) .n_steps = (int)(sizeof(l) / sizeof(l[0])), .steps = l

const struct cvt_arch cvt_arch_falcon = {
    .name = "falcon", .hf_class = "FalconForCausalLM", .model_type = "falcon", FALCON_COMMON,
    FALCON_STEPS(layer),
};

/* Not in the registry: falcon_keys picks them for new_decoder_architecture */
const struct cvt_arch cvt_arch_falcon_40b = {
    .name = "falcon", .hf_class = "FalconForCausalLM", .model_type = "falcon", FALCON_COMMON,
    FALCON_STEPS(layer40), .qkv_grouped = true,
};
const struct cvt_arch cvt_arch_falcon_40b_ln1 = {
    .name = "falcon", .hf_class = "FalconForCausalLM", .model_type = "falcon", FALCON_COMMON,
    FALCON_STEPS(layer), .qkv_grouped = true,
};

/* The same checkpoints under the tiiuae remote code's names (transformers maps them to
 * FalconForCausalLM) */
const struct cvt_arch cvt_arch_falcon_rw = {
    .name = "falcon", .hf_class = "RWForCausalLM", .model_type = "RefinedWebModel", FALCON_COMMON,
    FALCON_STEPS(layer),
};

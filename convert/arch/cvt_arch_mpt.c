/*
 * cvt_arch_mpt.c - MPT on the converter side: MPTForCausalLM / MptForCausalLM (model_type "mpt";
 * mosaicml/mpt-7b and its AutoAWQ exports, e.g. casperhansen/mpt-7b-8k-chat-awq): multi-head
 * attention with q, k and v fused into attn.Wqkv ([q | k | v] along out_features, d_model each),
 * ALiBi position biases instead of rotary, LayerNorms without bias (norm_1, norm_2, norm_f;
 * no_bias), MLP ffn.up_proj -> GELU -> ffn.down_proj, where AutoAWQ stores the smoothing scales
 * it could not fold into a weight as ffn.act.scales (awq/modules/act.py ScaledActivation: the
 * GELU output divided by them); embedding transformer.wte, output tied to it.
 *
 * Tensors (transformers models/mpt/modeling_mpt.py names -> canonical roles of
 * format/fmt_names.h), per block i of "transformer.blocks.%d":
 *   norm_1.weight, norm_2.weight -> attn / mlp norm (replicated F32);
 *   attn.Wqkv -> qkv_proj column-parallel [q_r | k_r | v_r] (the fused source cut in three);
 *   attn.out_proj -> o_proj (row-parallel);
 *   ffn.up_proj -> mlp.gate_up_proj holding the up projection alone (I_r columns; the runtime's
 *     plain GELU, rt_act_gated); ffn.down_proj -> down_proj (row-parallel);
 *   ffn.act.scales -> mlp.act_scales F32 [I_r], split like up_proj's columns.
 * Config (configuration_mpt.py MptConfig and MptAttentionConfig): d_model, n_heads, n_layers,
 * max_seq_len stand for the common keys; intermediate = expansion_ratio (default 4) * d_model;
 * layer_norm_epsilon 1e-5; vocab_size 50368; tied embeddings. attn_config: alibi (default true)
 * and alibi_bias_max (default 8) go to the config section ("alibi_bias_max"). Refused by name:
 * alibi false (learned positions), clip_qkv, qk_ln, softmax_scale, prefix_lm, an attn_type
 * other than multihead_attention, no_bias false, logit_scale.
 * Tests: ./build/test_cvt (fixture mpt-alibi-act-scales), ./build/test_cvt_config.
 */
#include <string.h>

#include <cjson/cJSON.h> /* attn_config */

#include "cvt_arch.h"
#include "cvt_src_int.h" /* CVT_TRY_JSON */
#include "qs_log.h"

static const struct cvt_arch_linear attention[2] = {
    {FMT_N_QKV, FMT_SPLIT_COLUMN, 3,
     {{"attn.Wqkv", CVT_AXIS_HIDDEN, CVT_AXIS_Q},
      {"attn.Wqkv", CVT_AXIS_HIDDEN, CVT_AXIS_KV},
      {"attn.Wqkv", CVT_AXIS_HIDDEN, CVT_AXIS_KV}}},
    {FMT_N_O, FMT_SPLIT_ROW, 1, {{"attn.out_proj", CVT_AXIS_Q, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_linear mlp[2] = {
    {FMT_N_GATE_UP, FMT_SPLIT_COLUMN, 1, {{"ffn.up_proj", CVT_AXIS_HIDDEN, CVT_AXIS_INTER}}},
    {FMT_N_DOWN, FMT_SPLIT_ROW, 1, {{"ffn.down_proj", CVT_AXIS_INTER, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "norm_1.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "norm_2.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, attention},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, mlp},
    {CVT_ARCH_OP_INTER_VECTOR, FMT_N_ACT_SCALES, "ffn.act.scales", false, 0, NULL},
};

static const char *const aliases[] = {
    "num_attention_heads", "n_heads", "num_hidden_layers", "n_layers", "hidden_size", "d_model",
    "max_position_embeddings", "max_seq_len", "rms_norm_eps", "layer_norm_epsilon", NULL, NULL,
};

/* A key of attn_config (or of the top level) that must keep its harmless value. */
static enum cvt_err refuse_set(const struct qs_json_ctx *c, const cJSON *o, const char *key,
                               const char *what)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v)) {
        qs_log_error(c->fn, "%s/%s: %s is set: %s is not supported", c->where, c->file, key, what);
        return CVT_ERR_UNSUPPORTED;
    }
    return CVT_ERR_NONE;
}

static enum cvt_err mpt_keys(const struct qs_json_ctx *c, const cJSON *o,
                             struct cvt_hf_config *cfg)
{
    int64_t er = 4;
    bool no_bias = true, alibi = true;
    double abm = 8.0;
    char at[64] = "", nt[64] = "";
    CVT_TRY_JSON(qs_json_int(c, o, "expansion_ratio", false, 4, 1, 64, &er));
    if (er * cfg->hidden_size > (int64_t)1 << 24) {
        qs_log_error(c->fn, "%s/%s: expansion_ratio %lld x d_model %lld is too large", c->where,
                     c->file, (long long)er, (long long)cfg->hidden_size);
        return CVT_ERR_CONFIG;
    }
    cfg->intermediate_size = er * cfg->hidden_size;
    CVT_TRY_JSON(qs_json_bool(c, o, "no_bias", true, &no_bias));
    if (!no_bias) {
        qs_log_error(c->fn, "%s/%s: no_bias false (biases in every linear and LayerNorm) is not "
                            "supported", c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    CVT_TRY(refuse_set(c, o, "logit_scale", "scaling the logits"));
    CVT_TRY_JSON(qs_json_string(c, o, "norm_type", false, nt, sizeof nt));
    if (nt[0] && !strstr(nt, "layernorm")) {
        qs_log_error(c->fn, "%s/%s: norm_type \"%s\" is not supported (LayerNorm only)",
                     c->where, c->file, nt);
        return CVT_ERR_UNSUPPORTED;
    }
    const cJSON *ac = cJSON_GetObjectItemCaseSensitive(o, "attn_config");
    if (ac && !cJSON_IsNull(ac)) {
        if (!cJSON_IsObject(ac)) {
            qs_log_error(c->fn, "%s/%s: attn_config must be an object", c->where, c->file);
            return CVT_ERR_CONFIG;
        }
        CVT_TRY_JSON(qs_json_bool(c, ac, "alibi", true, &alibi));
        CVT_TRY_JSON(qs_json_number(c, ac, "alibi_bias_max", false, 8.0, 1e-3, 1e3, &abm));
        CVT_TRY_JSON(qs_json_string(c, ac, "attn_type", false, at, sizeof at));
        CVT_TRY(refuse_set(c, ac, "clip_qkv", "clamping q, k and v"));
        CVT_TRY(refuse_set(c, ac, "qk_ln", "LayerNorm of q and k"));
        CVT_TRY(refuse_set(c, ac, "softmax_scale", "a softmax scale other than head_dim^-0.5"));
        CVT_TRY(refuse_set(c, ac, "prefix_lm", "prefix-LM attention"));
    }
    if (!alibi) {
        qs_log_error(c->fn, "%s/%s: attn_config alibi false (learned position embeddings) is not "
                            "supported", c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    if (at[0] && strcmp(at, "multihead_attention") != 0) {
        qs_log_error(c->fn, "%s/%s: attn_config attn_type \"%s\" is not supported "
                            "(multihead_attention only)", c->where, c->file, at);
        return CVT_ERR_UNSUPPORTED;
    }
    cfg->alibi_bias_max = abm;
    cfg->num_key_value_heads = cfg->num_attention_heads;
    cfg->bias_roles = 0;
    return CVT_ERR_NONE;
}

#define MPT_COMMON                                                                             \
    .rope_theta = 10000.0, .max_position_embeddings = 2048, .num_key_value_heads = -1,         \
    .rms_norm_eps = 1e-5, .head_dim = 0, .sliding_window = 0, .hidden_act = "gelu",           \
    .ffn_mult = 4, .tie_word_embeddings = true, .key_aliases = aliases, .moe = false,          \
    .read_keys = mpt_keys, .hf_embed = "transformer.wte", .hf_lm_head = "lm_head",             \
    .hf_final_norm = "transformer.norm_f.weight", .hf_final_norm_bias = NULL,                  \
    .hf_layer = "transformer.blocks.%d", .n_steps = (int)(sizeof(layer) / sizeof(layer[0])),   \
    .steps = layer

/* transformers' class (MptForCausalLM) and the mosaicml remote code's (MPTForCausalLM), which
 * AutoAWQ's exports name: one model_type, one runtime architecture */
const struct cvt_arch cvt_arch_mpt = {
    .name = "mpt", .hf_class = "MptForCausalLM", .model_type = "mpt", MPT_COMMON,
};
const struct cvt_arch cvt_arch_mpt_remote = {
    .name = "mpt", .hf_class = "MPTForCausalLM", .model_type = "mpt", MPT_COMMON,
};

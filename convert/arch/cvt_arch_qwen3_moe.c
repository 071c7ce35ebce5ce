/*
 * cvt_arch_qwen3_moe.c - Qwen3-MoE on the converter side (Qwen3MoeForCausalLM, model_type
 * "qwen3_moe"; Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q_norm / k_norm
 * before RoPE) with every MLP a sparse mixture of experts and no shared expert: a float router
 * mlp.gate [num_experts, H] (softmax, top num_experts_per_tok, renormalised only when
 * norm_topk_prob) and per expert a gated SiLU MLP mlp.experts.{e}.{gate,up,down}_proj of
 * moe_intermediate_size, written in the Mixtral roles (router, per-expert gate_up / down), so the
 * runtime's MoE path runs it.
 * Source of the math and names: transformers models/qwen3_moe/modular_qwen3_moe.py (Qwen3MoeAttention
 * = Qwen3Attention, Qwen3MoeSparseMoeBlock, Qwen2MoeTopKRouter, Qwen2MoeDecoderLayer: a layer is
 * sparse unless listed in mlp_only_layers or (i + 1) % decoder_sparse_step != 0) and
 * configuration_qwen3_moe.py (Qwen3MoeConfig defaults: num_experts 128, num_experts_per_tok 8,
 * norm_topk_prob false, moe_intermediate_size 768, decoder_sparse_step 1, mlp_only_layers [],
 * num_key_value_heads 4, rms_norm_eps 1e-6, max_position_embeddings 32768, rope theta the class
 * default 10000, a window on every layer only with use_sliding_window (sliding_window 4096), no
 * head_dim field: hidden / heads unless config.json has one). Refused by name: dense layers among
 * the sparse ones (mlp_only_layers not empty, decoder_sparse_step other than 1).
 * Tests: ./build/test_cvt (fixture qwen3-moe-e8-top3 at TP 1/2/4), ./build/test_cvt_config.
 */
#include "cvt_arch.h"
#include "cvt_src_int.h" /* CVT_TRY_JSON */
#include "qs_log.h"      /* qs_log_error */

#include <cjson/cJSON.h> /* mlp_only_layers */

static const struct cvt_arch_linear experts[2] = {
    {FMT_N_EXPERT_GATE_UP, FMT_SPLIT_COLUMN, 2,
     {{"mlp.experts.%d.gate_proj", CVT_AXIS_HIDDEN, CVT_AXIS_INTER},
      {"mlp.experts.%d.up_proj", CVT_AXIS_HIDDEN, CVT_AXIS_INTER}}},
    {FMT_N_EXPERT_DOWN, FMT_SPLIT_ROW, 1, {{"mlp.experts.%d.down_proj", CVT_AXIS_INTER, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "input_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "post_attention_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_HEAD_NORM, FMT_N_Q_NORM, "self_attn.q_norm.weight", false, 0, NULL},
    {CVT_ARCH_OP_HEAD_NORM, FMT_N_K_NORM, "self_attn.k_norm.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_attention},
    {CVT_ARCH_OP_IGNORE, FMT_N_COUNT, "self_attn.rotary_emb.inv_freq", false, 0, NULL},
    {CVT_ARCH_OP_ROUTER, FMT_N_ROUTER, "mlp.gate", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, true, 2, experts},
};

static enum cvt_err qwen3_moe_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                                   struct cvt_hf_config *cfg)
{
    bool use_sw = false, ab = false, norm = false;
    int64_t step, moe_i, alias;
    CVT_TRY_JSON(qs_json_bool(c, o, "use_sliding_window", false, &use_sw));
    if (use_sw) /* Qwen3MoeAttention: the config's window on every layer */
        CVT_TRY(cvt_arch_mistral_keys(c, o, cfg));
    else
        cfg->sliding_window = 0;
    CVT_TRY_JSON(qs_json_bool(c, o, "attention_bias", false, &ab));
    cfg->bias_roles = ab ? CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O) : 0;
    /* attribute_map {"num_experts": "num_local_experts"}: either spelling, both must agree */
    CVT_TRY_JSON(qs_json_int(c, o, "num_experts", false, 0, 1, 1024, &cfg->num_local_experts));
    CVT_TRY_JSON(qs_json_int(c, o, "num_local_experts", false, 0, 1, 1024, &alias));
    if (alias && cfg->num_local_experts && alias != cfg->num_local_experts) {
        qs_log_error(c->fn, "%s/%s: num_experts %lld and num_local_experts %lld disagree (one key "
                            "in Qwen3MoeConfig)", c->where, c->file,
                     (long long)cfg->num_local_experts, (long long)alias);
        return CVT_ERR_CONFIG;
    }
    if (!cfg->num_local_experts)
        cfg->num_local_experts = alias ? alias : 128;
    CVT_TRY_JSON(qs_json_int(c, o, "num_experts_per_tok", false, 8, 1, 1024,
                             &cfg->num_experts_per_tok));
    if (cfg->num_experts_per_tok > cfg->num_local_experts) {
        qs_log_error(c->fn, "%s/%s: num_experts_per_tok %lld > num_experts %lld", c->where, c->file,
                     (long long)cfg->num_experts_per_tok, (long long)cfg->num_local_experts);
        return CVT_ERR_CONFIG;
    }
    CVT_TRY_JSON(qs_json_bool(c, o, "norm_topk_prob", false, &norm));
    cfg->no_topk_renorm = !norm;
    CVT_TRY_JSON(qs_json_int(c, o, "decoder_sparse_step", false, 1, 1, 4096, &step));
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers");
    if (step != 1 || (only && !cJSON_IsNull(only) && (!cJSON_IsArray(only) ||
                                                     cJSON_GetArraySize(only) != 0))) {
        qs_log_error(c->fn, "%s/%s: dense MLP layers among the sparse ones (decoder_sparse_step "
                            "%lld, mlp_only_layers %s) are not supported: every layer must be "
                            "sparse", c->where, c->file, (long long)step,
                     only && cJSON_IsArray(only) ? "not empty" : "given");
        return CVT_ERR_UNSUPPORTED;
    }
    /* every MLP is sparse: the experts' width is the model's intermediate size */
    CVT_TRY_JSON(qs_json_int(c, o, "moe_intermediate_size", false, 768, 1, 1 << 20, &moe_i));
    cfg->intermediate_size = moe_i;
    return CVT_ERR_NONE;
}

const struct cvt_arch cvt_arch_qwen3_moe = {
    .name = "qwen3_moe", .hf_class = "Qwen3MoeForCausalLM", .model_type = "qwen3_moe",
    .rope_theta = 10000.0, .max_position_embeddings = 32768, .num_key_value_heads = 4,
    .rms_norm_eps = 1e-6, .head_dim = 0, .sliding_window = 4096, .hidden_act = "silu",
    .moe = true, .read_keys = qwen3_moe_keys, .hf_embed = "model.embed_tokens",
    .hf_lm_head = "lm_head", .hf_final_norm = "model.norm.weight",
    .hf_layer = "model.layers.%d", .n_steps = (int)(sizeof(layer) / sizeof(layer[0])),
    .steps = layer,
};

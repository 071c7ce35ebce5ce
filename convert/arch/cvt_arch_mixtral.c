/*
 * cvt_arch_mixtral.c - Mixtral (MixtralForCausalLM) on the converter side: the LLaMA family's
 * attention and norms, with the MLP replaced by a sparse mixture of experts (transformers
 * modeling_mixtral.py, MixtralSparseMoeBlock): per layer a router block_sparse_moe.gate
 * [num_local_experts, H] (float, replicated on every rank) and per expert e a SiLU-gated MLP
 * block_sparse_moe.experts.e.{w1 = gate, w3 = up, w2 = down}, split like a dense MLP
 * (w1/w3 -> experts.e.gate_up_proj column-parallel, w2 -> experts.e.down_proj row-parallel).
 * Keys: MixtralConfig's sliding_window (as Mistral), num_local_experts (8; also spelled
 * num_experts, MixtralConfig.attribute_map), num_experts_per_tok (2). Defaults of absent keys
 * (configuration_mixtral.py): rope_theta 1e6 (default_theta), max_position_embeddings 4096 * 32,
 * num_key_value_heads 8 (null: num_attention_heads), rms_norm_eps 1e-5, sliding_window None.
 *
 * Entry point: the descriptor cvt_arch_mixtral (registry: convert/cvt_arch.c).
 * Tests: ./build/test_cvt_plan (Mixtral plans), ./build/test_cvt (fixture mixtral-e4-top2).
 */
#include "cvt_arch.h"
#include "cvt_src_int.h" /* CVT_TRY_JSON */
#include "qs_log.h"      /* qs_log_error */

static const struct cvt_arch_linear experts[2] = {
    {FMT_N_EXPERT_GATE_UP, FMT_SPLIT_COLUMN, 2,
     {{"block_sparse_moe.experts.%d.w1", CVT_AXIS_HIDDEN, CVT_AXIS_INTER},
      {"block_sparse_moe.experts.%d.w3", CVT_AXIS_HIDDEN, CVT_AXIS_INTER}}},
    {FMT_N_EXPERT_DOWN, FMT_SPLIT_ROW, 1,
     {{"block_sparse_moe.experts.%d.w2", CVT_AXIS_INTER, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "input_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "post_attention_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_attention},
    {CVT_ARCH_OP_IGNORE, FMT_N_COUNT, "self_attn.rotary_emb.inv_freq", false, 0, NULL},
    {CVT_ARCH_OP_ROUTER, FMT_N_ROUTER, "block_sparse_moe.gate", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, true, 2, experts},
};

static enum cvt_err mixtral_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                                 struct cvt_hf_config *cfg)
{
    int64_t alias;
    CVT_TRY(cvt_arch_mistral_keys(c, o, cfg));
    CVT_TRY_JSON(qs_json_int(c, o, "num_local_experts", false, 0, 1, 1024,
                             &cfg->num_local_experts));
    /* attribute_map {"num_experts": "num_local_experts"}: a config.json key num_experts sets
     * num_local_experts (and wins over it) */
    CVT_TRY_JSON(qs_json_int(c, o, "num_experts", false, 0, 1, 1024, &alias));
    if (alias && cfg->num_local_experts && alias != cfg->num_local_experts) {
        qs_log_error(c->fn, "%s/%s: num_experts %lld and num_local_experts %lld disagree (one key "
                            "in MixtralConfig)", c->where, c->file, (long long)alias,
                     (long long)cfg->num_local_experts);
        return CVT_ERR_CONFIG;
    }
    if (!cfg->num_local_experts)
        cfg->num_local_experts = alias ? alias : 8;
    CVT_TRY_JSON(qs_json_int(c, o, "num_experts_per_tok", false, 2, 1, 1024,
                             &cfg->num_experts_per_tok));
    if (cfg->num_experts_per_tok > cfg->num_local_experts) {
        qs_log_error(c->fn, "%s/%s: num_experts_per_tok %lld > num_local_experts %lld", c->where,
                     c->file, (long long)cfg->num_experts_per_tok,
                     (long long)cfg->num_local_experts);
        return CVT_ERR_CONFIG;
    }
    return CVT_ERR_NONE;
}

const struct cvt_arch cvt_arch_mixtral = {
    .name = "mixtral", .hf_class = "MixtralForCausalLM", .model_type = "mixtral",
    .rope_theta = 1e6, .max_position_embeddings = 4096 * 32, .num_key_value_heads = 8,
    .rms_norm_eps = 1e-5, .sliding_window = 0, .hidden_act = "silu", .moe = true,
    .read_keys = mixtral_keys, .hf_embed = "model.embed_tokens", .hf_lm_head = "lm_head",
    .hf_final_norm = "model.norm.weight", .hf_layer = "model.layers.%d",
    .n_steps = (int)(sizeof(layer) / sizeof(layer[0])), .steps = layer,
};

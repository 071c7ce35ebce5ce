/*
 * cvt_arch_qwen3.c - Qwen3 on the converter side (Qwen3ForCausalLM, model_type "qwen3"): the
 * LLaMA decoder with a per-head RMSNorm of q and k before RoPE (self_attn.q_norm.weight,
 * self_attn.k_norm.weight, each [head_dim], replicated on every rank like the other norms), no
 * q/k/v bias unless attention_bias, and head_dim a key of its own (128 when absent, whatever
 * hidden_size / num_attention_heads is: Qwen3-0.6B has hidden 1024, 16 heads of 128).
 * Source of the math and names: transformers models/qwen3/modeling_qwen3.py (Qwen3Attention:
 * q_norm(q_proj(x).view(..., head_dim)), then RoPE) and configuration_qwen3.py (Qwen3Config
 * defaults: rope theta the class default 10000, max_position_embeddings 32768,
 * num_key_value_heads 32, head_dim 128, rms_norm_eps 1e-6, attention_bias false,
 * use_sliding_window false, sliding_window 4096, max_window_layers 28, layer_types).
 * AutoAWQ quantizes q/k/v/o and gate/up/down only; q_norm / k_norm stay float.
 * Tests: ./build/test_cvt (fixture qwen3-awq-gemm at TP 1/2/4), ./build/test_cvt_src (configs).
 */
#include "cvt_arch.h"
#include "cvt_src_int.h" /* CVT_TRY_JSON */

static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "input_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "post_attention_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_HEAD_NORM, FMT_N_Q_NORM, "self_attn.q_norm.weight", false, 0, NULL},
    {CVT_ARCH_OP_HEAD_NORM, FMT_N_K_NORM, "self_attn.k_norm.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_attention},
    {CVT_ARCH_OP_IGNORE, FMT_N_COUNT, "self_attn.rotary_emb.inv_freq", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_mlp},
};

/* Qwen3Config: attention_bias puts a bias on q, k, v and o (modeling_qwen3.py); the window keys
 * as Qwen2's. */
static enum cvt_err qwen3_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                               struct cvt_hf_config *cfg)
{
    bool ab = false;
    CVT_TRY(cvt_arch_qwen_window(c, o, cfg));
    CVT_TRY_JSON(qs_json_bool(c, o, "attention_bias", false, &ab));
    cfg->bias_roles = ab ? CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O) : 0;
    return CVT_ERR_NONE;
}

const struct cvt_arch cvt_arch_qwen3 = {
    .name = "qwen3", .hf_class = "Qwen3ForCausalLM", .model_type = "qwen3",
    .rope_theta = 10000.0, .max_position_embeddings = 32768, .num_key_value_heads = 32,
    .rms_norm_eps = 1e-6, .head_dim = 128, .sliding_window = 4096, .hidden_act = "silu",
    .moe = false, .read_keys = qwen3_keys, .hf_embed = "model.embed_tokens",
    .hf_lm_head = "lm_head", .hf_final_norm = "model.norm.weight",
    .hf_layer = "model.layers.%d", .n_steps = (int)(sizeof(layer) / sizeof(layer[0])),
    .steps = layer,
};

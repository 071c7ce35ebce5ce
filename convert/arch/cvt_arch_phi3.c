/*
 * cvt_arch_phi3.c - Phi-3 on the converter side (Phi3ForCausalLM, model_type "phi3"; Phi-3-mini,
 * -small is another architecture, -medium): the LLaMA decoder with q/k/v fused into one
 * self_attn.qkv_proj ([q | k | v] along out_features: num_attention_heads * head_dim, then
 * num_key_value_heads * head_dim twice) and gate/up fused into mlp.gate_up_proj ([gate | up],
 * intermediate_size each; modeling_phi3.py Phi3MLP: gate, up = chunk(2), up * silu(gate)).
 * AutoAWQ quantizes the fused linears as they are; the converter cuts each rank's column ranges
 * out of them ([q_r | k_r | v_r], [gate_r | up_r]: the fused-source parts of convert/cvt_arch.h),
 * so the rank file is the LLaMA layout and the runtime's descriptor is LLaMA's.
 * Source of the math and names: transformers models/phi3/modeling_phi3.py (Phi3Attention: qkv
 * split at query_pos = heads * head_dim; sliding_window from the config) and
 * configuration_phi3.py (Phi3Config defaults: vocab 32064, rope_theta 10000,
 * max_position_embeddings 4096, num_key_value_heads = num_attention_heads, rms_norm_eps 1e-5,
 * sliding_window None, partial_rotary_factor 1.0, no biases). rope_scaling "longrope" / "su"
 * (Phi-3-*-128k) is refused by the common rope parser (cvt_config.c); a partial rotary factor
 * other than 1 likewise.
 * Tests: ./build/test_cvt (fixture phi3-fused-gqa at TP 1/2/4), ./build/test_cvt_config.
 */
#include "cvt_arch.h"

static const struct cvt_arch_linear attention[2] = {
    {FMT_N_QKV, FMT_SPLIT_COLUMN, 3,
     {{"self_attn.qkv_proj", CVT_AXIS_HIDDEN, CVT_AXIS_Q},
      {"self_attn.qkv_proj", CVT_AXIS_HIDDEN, CVT_AXIS_KV},
      {"self_attn.qkv_proj", CVT_AXIS_HIDDEN, CVT_AXIS_KV}}},
    {FMT_N_O, FMT_SPLIT_ROW, 1, {{"self_attn.o_proj", CVT_AXIS_Q, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_linear mlp[2] = {
    {FMT_N_GATE_UP, FMT_SPLIT_COLUMN, 2,
     {{"mlp.gate_up_proj", CVT_AXIS_HIDDEN, CVT_AXIS_INTER},
      {"mlp.gate_up_proj", CVT_AXIS_HIDDEN, CVT_AXIS_INTER}}},
    {FMT_N_DOWN, FMT_SPLIT_ROW, 1, {{"mlp.down_proj", CVT_AXIS_INTER, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "input_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "post_attention_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, attention},
    {CVT_ARCH_OP_IGNORE, FMT_N_COUNT, "self_attn.rotary_emb.inv_freq", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, mlp},
};

const struct cvt_arch cvt_arch_phi3 = {
    .name = "phi3", .hf_class = "Phi3ForCausalLM", .model_type = "phi3",
    .rope_theta = 10000.0, .max_position_embeddings = 4096, .num_key_value_heads = 0,
    .rms_norm_eps = 1e-5, .head_dim = 0, .sliding_window = 0, .hidden_act = "silu",
    .moe = false, .read_keys = cvt_arch_mistral_keys, .hf_embed = "model.embed_tokens",
    .hf_lm_head = "lm_head", .hf_final_norm = "model.norm.weight",
    .hf_layer = "model.layers.%d", .n_steps = (int)(sizeof(layer) / sizeof(layer[0])),
    .steps = layer,
};

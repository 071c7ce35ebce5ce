/*
 * rt_arch_falcon.c - Falcon's descriptor (rt.h struct rt_arch): FalconForCausalLM with
 * parallel_attn: Falcon-7B (multi_query) and Falcon-40B / 180B (new_decoder_architecture: the
 * converter gathers the grouped query_key_value into [q | k | v]; ln_attn and ln_mlp, the
 * MLP's own LayerNorm of the layer input, when the file has an MLP norm). One block: LayerNorm with bias (input_layernorm) ->
 * fused qkv (one kv head, written [q | k | v] by the converter) -> RoPE on all of head_dim
 * (rotate_half) -> causal attention -> dense (o_proj); in parallel on the same normalised input
 * dense_h_to_4h -> exact GELU -> dense_4h_to_h; h += attention + MLP. Final LayerNorm ln_f with
 * bias. Source of the math: transformers models/falcon/modeling_falcon.py (FalconDecoderLayer,
 * FalconAttention, FalconMLP).
 * Test: ./build/test_model (fixture falcon-mqa-parallel), tests/test_e2e (golden).
 */
#include "rt.h"

const struct rt_arch rt_arch_falcon = {
    .name = "falcon", .norm = RT_NORM_LAYER, .act = RT_ACT_GELU, .rotary_fraction = 1.0f,
    .parallel_residual = true, .qk_norm = false, .moe = false, .norm_bias = true,
    .check = rt_arch_check_dense,
};

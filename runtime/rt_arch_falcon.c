/*
 * rt_arch_falcon.c - Falcon's descriptor (rt.h struct rt_arch): Falcon-7B's decoder
 * (FalconForCausalLM with parallel_attn, multi_query, no new_decoder_architecture; the
 * converter refuses the other layouts). One block: LayerNorm with bias (input_layernorm) ->
 * fused qkv (one kv head, written [q | k | v] by the converter) -> RoPE on all of head_dim
 * (rotate_half) -> causal attention -> dense (o_proj); in parallel on the same normalised input
 * dense_h_to_4h -> exact GELU -> dense_4h_to_h; h += attention + MLP. Final LayerNorm ln_f with
 * bias. Source of the math: transformers models/falcon/modeling_falcon.py (FalconDecoderLayer,
 * FalconAttention, FalconMLP).
 * Test: ./build/test_model (fixture falcon-mqa-parallel), tests/test_e2e (golden).
 */
#include "qs_log.h"
#include "rt.h"

static enum rt_err check_falcon(const struct rt_config *c, const char *where)
{
    if (c->n_experts != 0) {
        qs_log_error("rt_config_parse", "%s: config: num_local_experts %d for non-MoE "
                     "architecture %s", where, c->n_experts, c->architecture);
        return RT_ERR_CONFIG;
    }
    return RT_ERR_NONE;
}

const struct rt_arch rt_arch_falcon = {
    .name = "falcon", .norm = RT_NORM_LAYER, .act = RT_ACT_GELU, .rotary_fraction = 1.0f,
    .parallel_residual = true, .qk_norm = false, .moe = false, .norm_bias = true,
    .check = check_falcon,
};

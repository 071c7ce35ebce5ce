/*
 * rt_arch_mpt.c - MPT's descriptor (rt.h struct rt_arch): MptForCausalLM (mosaicml/mpt-7b and
 * its AutoAWQ exports). One block: LayerNorm without bias (norm_1) -> fused Wqkv ([q | k | v],
 * written as qkv_proj) -> causal multi-head attention with ALiBi position biases (no rotary) ->
 * out_proj; residual; LayerNorm (norm_2) -> up_proj -> exact GELU, divided by AutoAWQ's
 * activation scales when the file has them -> down_proj; residual. Final LayerNorm norm_f;
 * lm_head tied to the embedding. Source of the math: transformers models/mpt/modeling_mpt.py
 * (MptBlock, MptAttention, MptMLP, build_mpt_alibi_tensor) and AutoAWQ awq/modules/act.py
 * (ScaledActivation). Runs on the CPU and CUDA backends (rt_backend_ops.alibi).
 * Test: ./build/test_model_fixtures (fixture mpt-alibi-act-scales).
 */
#include "qs_log.h"
#include "rt.h"

static enum rt_err check_mpt(const struct rt_config *c, const char *where)
{
    if (c->n_kv_heads != c->n_heads) {
        qs_log_error("rt_config_parse", "%s: config: MPT has one kv head per head "
                     "(num_key_value_heads %d of %d)", where, c->n_kv_heads, c->n_heads);
        return RT_ERR_CONFIG;
    }
    return rt_arch_check_dense(c, where);
}

const struct rt_arch rt_arch_mpt = {
    .name = "mpt", .norm = RT_NORM_LAYER, .act = RT_ACT_GELU, .rotary_fraction = 0.0f,
    .parallel_residual = false, .qk_norm = false, .moe = false, .alibi = true,
    .check = check_mpt,
};

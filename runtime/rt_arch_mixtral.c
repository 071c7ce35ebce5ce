/*
 * rt_arch_mixtral.c - the Mixtral and Qwen3-MoE descriptors (rt.h struct rt_arch): the LLaMA block with the
 * dense MLP replaced by a sparse mixture of experts: router logits (fp32 block_sparse_moe.gate),
 * softmax, top-k (num_experts_per_tok), the chosen weights renormalised, each expert a gated
 * SiLU MLP (w1 = gate, w3 = up, w2 = down; converted to gate_up / down). Source of the math:
 * transformers modeling_mixtral.py (MixtralSparseMoeBlock); routing in kernels/ref_moe_route.c.
 */
#include "qs_log.h"
#include "rt.h"

static enum rt_err check_moe(const struct rt_config *c, const char *where)
{
    if (c->n_experts < 1 || c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts) {
        qs_log_error("rt_config_parse", "%s: config: %s needs num_local_experts >= 1 and 1 <= "
                     "num_experts_per_tok <= num_local_experts (got %d, %d)", where,
                     c->architecture, c->n_experts, c->n_experts_per_tok);
        return RT_ERR_CONFIG;
    }
    return RT_ERR_NONE;
}

const struct rt_arch rt_arch_mixtral = {
    .name = "mixtral", .norm = RT_NORM_RMS, .act = RT_ACT_SILU, .rotary_fraction = 1.0f,
    .parallel_residual = false, .qk_norm = false, .moe = true, .check = check_moe,
};

/* Qwen3-MoE: Qwen3's attention (per-head q/k norms) and this MoE MLP on every layer; the router
 * renormalises its kept weights only when the config's norm_topk_prob says so
 * (modular_qwen3_moe.py, Qwen2MoeTopKRouter) */
const struct rt_arch rt_arch_qwen3_moe = {
    .name = "qwen3_moe", .norm = RT_NORM_RMS, .act = RT_ACT_SILU, .rotary_fraction = 1.0f,
    .parallel_residual = false, .qk_norm = true, .moe = true, .check = check_moe,
};

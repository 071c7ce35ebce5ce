/*
 * rt_arch_llama.c - the LLaMA family's descriptors (rt.h struct rt_arch): LLaMA 1/2/3/3.1,
 * Mistral, Qwen2, Qwen3 (+ per-head q/k RMSNorm before RoPE), Phi-3 (its fused linears cut
 * apart by the converter). One decoder block: RMSNorm -> fused qkv (q/k/v biases when the config's
 * attention_bias says so: Qwen2 always, written by the converter) -> RoPE on all of head_dim
 * (rotate_half form; llama3 / linear scaling in inv_freq) -> causal GQA attention (Mistral's
 * sliding window from the config) -> o_proj -> residual; RMSNorm -> gate_up -> SiLU(gate) * up
 * -> down -> residual. Source of the math: transformers modeling_llama.py (LlamaDecoderLayer),
 * modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py, modeling_phi3.py.
 */
#include "qs_log.h"
#include "rt.h"

enum rt_err rt_arch_check_dense(const struct rt_config *c, const char *where)
{
    if (c->n_experts != 0) {
        qs_log_error("rt_config_parse", "%s: config: num_local_experts %d for non-MoE "
                     "architecture %s", where, c->n_experts, c->architecture);
        return RT_ERR_CONFIG;
    }
    return RT_ERR_NONE;
}

#define LLAMA_FAMILY(arch_name, qk)                                                           \
    {                                                                                         \
        .name = arch_name, .norm = RT_NORM_RMS, .act = RT_ACT_SILU, .rotary_fraction = 1.0f,  \
        .parallel_residual = false, .qk_norm = qk, .moe = false, .check = rt_arch_check_dense,        \
    }

const struct rt_arch rt_arch_llama = LLAMA_FAMILY("llama", false);
const struct rt_arch rt_arch_mistral = LLAMA_FAMILY("mistral", false);
const struct rt_arch rt_arch_qwen2 = LLAMA_FAMILY("qwen2", false);
/* Qwen3: q_norm / k_norm (RMSNorm over each head's head_dim values, weights [head_dim]) on q and
 * k before RoPE (modeling_qwen3.py Qwen3Attention) */
const struct rt_arch rt_arch_qwen3 = LLAMA_FAMILY("qwen3", true);
/* Phi-3: the converter cut its fused qkv_proj / gate_up_proj into the LLaMA layout */
const struct rt_arch rt_arch_phi3 = LLAMA_FAMILY("phi3", false);

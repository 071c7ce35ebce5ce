/*
 * rt_arch_gemma.c - Gemma 2 and Gemma 3 (text) descriptors (rt.h struct rt_arch). One block:
 * RMSNorm (input_layernorm) -> fused qkv -> [Gemma 3: per-head RMSNorm of q and k] -> RoPE
 * (rotate_half; Gemma 3's windowed layers with rope_local_theta, the global ones with
 * rope_theta and its scaling) -> causal GQA attention with scale query_pre_attn_scalar^-0.5,
 * [Gemma 2: scores soft-capped], the window on the local layers only (sliding_window_pattern)
 * -> o_proj -> RMSNorm (post_attention_layernorm, the attention's out_norm) -> residual;
 * RMSNorm (pre_feedforward_layernorm) -> gate_up -> gelu_tanh(gate) * up -> down -> RMSNorm
 * (post_feedforward_layernorm, the MLP's out_norm) -> residual. Embeddings times sqrt(hidden)
 * (embed_scale); final RMSNorm; lm_head tied; [Gemma 2: logits soft-capped]. Gemma's RMSNorm
 * multiplies by (1 + w): the converter stores 1 + w (fp32, as transformers computes it), so the
 * runtime's RMSNorm is LLaMA's. Source of the math: transformers models/gemma2/modeling_gemma2.py
 * (Gemma2DecoderLayer, Gemma2Attention, Gemma2RMSNorm, Gemma2Model.forward normalizer,
 * Gemma2ForCausalLM final_logit_softcapping) and models/gemma3/modeling_gemma3.py
 * (Gemma3DecoderLayer, Gemma3TextScaledWordEmbedding, rotary_emb_local).
 * Test: ./build/test_model_fixtures (fixtures gemma2-softcap-window, gemma3-qknorm-local-rope).
 */
#include "rt.h"

#define GEMMA_FAMILY(arch_name, qk)                                                            \
    {                                                                                          \
        .name = arch_name, .norm = RT_NORM_RMS, .act = RT_ACT_GELU_TANH,                       \
        .rotary_fraction = 1.0f, .parallel_residual = false, .qk_norm = qk, .moe = false,      \
        .post_norms = true, .check = rt_arch_check_dense,                                              \
    }

const struct rt_arch rt_arch_gemma2 = GEMMA_FAMILY("gemma2", false);
const struct rt_arch rt_arch_gemma3 = GEMMA_FAMILY("gemma3", true);

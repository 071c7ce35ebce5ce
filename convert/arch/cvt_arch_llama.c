/*
 * cvt_arch_llama.c - the LLaMA family on the converter side: LlamaForCausalLM, MistralForCausalLM
 * and Qwen2ForCausalLM are one decoder (pre-norm RMSNorm, rotary attention with GQA, SiLU-gated
 * MLP) that differ in config keys only: Mistral's sliding window, Qwen2's q/k/v biases and its
 * use_sliding_window / max_window_layers, LLaMA's attention_bias / mlp_bias.
 *
 * Tensors (HF transformers modeling_llama.py / modeling_mistral.py / modeling_qwen2.py names ->
 * canonical roles of format/fmt_names.h, docs/DESIGN.md section 5), per layer i:
 *   input_layernorm.weight, post_attention_layernorm.weight -> replicated F32 norms;
 *   self_attn.{q,k,v}_proj -> self_attn.qkv_proj, column-parallel [q_r | k_r | v_r] (vLLM
 *     QKVParallelLinear); self_attn.o_proj -> row-parallel (RowParallelLinear);
 *   self_attn.rotary_emb.inv_freq (transformers < 4.31 exports) -> dropped;
 *   mlp.{gate,up}_proj -> mlp.gate_up_proj, column-parallel [gate_r | up_r]
 *     (MergedColumnParallelLinear); mlp.down_proj -> row-parallel.
 * Defaults: transformers' LlamaConfig (rope_theta 10000, max_position_embeddings 2048),
 * MistralConfig (10000, 4096 * 32), Qwen2Config (10000, 32768).
 *
 * Entry points: the descriptors cvt_arch_llama, cvt_arch_mistral, cvt_arch_qwen2 (registry:
 * convert/cvt_arch.c), cvt_arch_llama_attention and cvt_arch_mistral_keys (shared with Mixtral).
 * Tests: ./build/test_cvt_plan, ./build/test_cvt_src (configs), ./build/test_cvt (fixtures).
 */
#include <string.h>

#include "cvt_arch.h"
#include "cvt_src_int.h" /* CVT_TRY_JSON */
#include "qs_log.h"      /* qs_log_error */

const struct cvt_arch_linear cvt_arch_llama_attention[2] = {
    {FMT_N_QKV, FMT_SPLIT_COLUMN, 3,
     {{"self_attn.q_proj", CVT_AXIS_HIDDEN, CVT_AXIS_Q},
      {"self_attn.k_proj", CVT_AXIS_HIDDEN, CVT_AXIS_KV},
      {"self_attn.v_proj", CVT_AXIS_HIDDEN, CVT_AXIS_KV}}},
    {FMT_N_O, FMT_SPLIT_ROW, 1, {{"self_attn.o_proj", CVT_AXIS_Q, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_linear mlp[2] = {
    {FMT_N_GATE_UP, FMT_SPLIT_COLUMN, 2,
     {{"mlp.gate_proj", CVT_AXIS_HIDDEN, CVT_AXIS_INTER},
      {"mlp.up_proj", CVT_AXIS_HIDDEN, CVT_AXIS_INTER}}},
    {FMT_N_DOWN, FMT_SPLIT_ROW, 1, {{"mlp.down_proj", CVT_AXIS_INTER, CVT_AXIS_HIDDEN}}},
};

static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "input_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "post_attention_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_attention},
    {CVT_ARCH_OP_IGNORE, FMT_N_COUNT, "self_attn.rotary_emb.inv_freq", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, mlp},
};

/* LlamaConfig: attention_bias puts a bias on q, k, v and o; mlp_bias is refused. */
static enum cvt_err llama_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                               struct cvt_hf_config *cfg)
{
    bool ab = false, mb = false;
    CVT_TRY_JSON(qs_json_bool(c, o, "attention_bias", false, &ab));
    CVT_TRY_JSON(qs_json_bool(c, o, "mlp_bias", false, &mb));
    if (mb) {
        qs_log_error(c->fn, "%s/%s: mlp_bias true is not supported", c->where, c->file);
        return CVT_ERR_UNSUPPORTED;
    }
    cfg->bias_roles = ab ? CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O) : 0;
    return CVT_ERR_NONE;
}

enum cvt_err cvt_arch_mistral_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                                   struct cvt_hf_config *cfg)
{
    /* MistralConfig / MixtralConfig: sliding_window null (full attention) or a window length */
    return cvt_from_json(qs_json_int(c, o, "sliding_window", false, 0, 1, 1ll << 30,
                                     &cfg->sliding_window));
}

/* Qwen2Config: q/k/v always carry a bias; a window only with use_sliding_window, and then only
 * on the layers from max_window_layers on (modeling_qwen2.py): all of them or none is
 * supported. */
static enum cvt_err qwen2_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                               struct cvt_hf_config *cfg)
{
    bool use_sw = false;
    int64_t sw = 0, mwl;
    CVT_TRY_JSON(qs_json_bool(c, o, "use_sliding_window", false, &use_sw));
    if (use_sw) {
        CVT_TRY_JSON(qs_json_int(c, o, "sliding_window", false, 4096, 1, 1ll << 30, &sw));
        CVT_TRY_JSON(qs_json_int(c, o, "max_window_layers", false, 28, 0, 4096, &mwl));
        if (mwl >= cfg->num_hidden_layers) {
            sw = 0; /* every layer below max_window_layers uses full attention */
        } else if (mwl != 0) {
            qs_log_error(c->fn, "%s/%s: Qwen2 use_sliding_window with max_window_layers %lld < "
                                "num_hidden_layers %lld (per-layer windows) is not supported",
                         c->where, c->file, (long long)mwl, (long long)cfg->num_hidden_layers);
            return CVT_ERR_UNSUPPORTED;
        }
    }
    cfg->sliding_window = sw;
    cfg->bias_roles = CVT_ROLE_BIT(FMT_N_QKV);
    return CVT_ERR_NONE;
}

#define LLAMA_TENSORS                                                                          \
    "model.embed_tokens", "lm_head", "model.norm.weight", "model.layers.%d",                   \
        (int)(sizeof(layer) / sizeof(layer[0])), layer

const struct cvt_arch cvt_arch_llama = {
    "llama", "LlamaForCausalLM", "llama", 10000.0, 2048, "silu", false, llama_keys,
    LLAMA_TENSORS,
};

const struct cvt_arch cvt_arch_mistral = {
    "mistral", "MistralForCausalLM", "mistral", 10000.0, 131072, "silu", false,
    cvt_arch_mistral_keys, LLAMA_TENSORS,
};

const struct cvt_arch cvt_arch_qwen2 = {
    "qwen2", "Qwen2ForCausalLM", "qwen2", 10000.0, 32768, "silu", false, qwen2_keys,
    LLAMA_TENSORS,
};

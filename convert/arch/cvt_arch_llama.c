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
 * Defaults of absent keys (docs/FORMATS.md 10.1), from transformers' configuration classes
 * (models/<family>/configuration_<family>.py; rope_theta is the class's default_theta of
 * modeling_rope_utils.py RotaryEmbeddingConfigMixin in transformers 5):
 *   LlamaConfig:   rope_theta 10000, max_position_embeddings 2048, num_key_value_heads =
 *                  num_attention_heads, rms_norm_eps 1e-6, no window;
 *   MistralConfig: 10000, 4096 * 32, num_key_value_heads 8, 1e-6, sliding_window 4096;
 *   Qwen2Config:   10000, 32768, num_key_value_heads 32, 1e-6, sliding_window 4096 (used only
 *                  with use_sliding_window), max_window_layers 28.
 * A null num_key_value_heads is num_attention_heads in all three; a null window is none.
 *
 * Entry points: the descriptors cvt_arch_llama, cvt_arch_mistral, cvt_arch_qwen2 (registry:
 * convert/cvt_arch.c), cvt_arch_llama_attention and cvt_arch_mistral_keys (shared with Mixtral),
 * cvt_arch_llama_mlp and cvt_arch_qwen_window (shared with Qwen3).
 * Tests: ./build/test_cvt_plan, ./build/test_cvt_src (configs), ./build/test_cvt (fixtures).
 */
#include <string.h>

#include <cjson/cJSON.h> /* layer_types */

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

const struct cvt_arch_linear cvt_arch_llama_mlp[2] = {
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
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_mlp},
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

/* The window length of "sliding_window": absent = the family's default (cfg->arch), null = none
 * (MistralConfig, MixtralConfig, Qwen2Config all pass None on as "no window"). */
static enum cvt_err window_length(const struct qs_json_ctx *c, const struct cJSON *o,
                                  const struct cvt_hf_config *cfg, int64_t *sw)
{
    int64_t def = qs_json_is_null(o, "sliding_window") ? 0 : cfg->arch->sliding_window;
    return cvt_from_json(qs_json_int(c, o, "sliding_window", false, def, 1, 1ll << 30, sw));
}

enum cvt_err cvt_arch_mistral_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                                   struct cvt_hf_config *cfg)
{
    /* MistralConfig / MixtralConfig: one window for every layer (modeling_mistral.py ignores
     * layer_types) */
    return window_length(c, o, cfg, &cfg->sliding_window);
}

/* Qwen2Config's "layer_types" (written by transformers >= 4.53 in place of deriving the kinds
 * from max_window_layers, which it then overrides): a list of num_hidden_layers strings, each
 * "full_attention" or "sliding_attention"; the count of the latter into *n_sliding. */
static enum cvt_err qwen2_layer_types(const struct qs_json_ctx *c, const struct cJSON *lt,
                                      int64_t n_layers, int64_t *n_sliding)
{
    int64_t n = 0, i = 0;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n_layers) {
        qs_log_error(c->fn, "%s/%s: \"layer_types\" must be a list of num_hidden_layers (%lld) "
                            "strings", c->where, c->file, (long long)n_layers);
        return CVT_ERR_CONFIG;
    }
    for (const cJSON *t = lt->child; t; t = t->next, i++) {
        bool sliding = cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
        if (!sliding && !(cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0)) {
            qs_log_error(c->fn, "%s/%s: layer_types[%lld] must be \"full_attention\" or "
                                "\"sliding_attention\" (Qwen2)", c->where, c->file, (long long)i);
            return CVT_ERR_UNSUPPORTED;
        }
        n += sliding;
    }
    *n_sliding = n;
    return CVT_ERR_NONE;
}

/* Qwen2Config: q/k/v always carry a bias; a window only with use_sliding_window, and then only
 * on the "sliding_attention" layers: those of layer_types when given, else those from
 * max_window_layers on (Qwen2Config builds layer_types that way; modeling_qwen2.py). All layers
 * or none is supported. */
enum cvt_err cvt_arch_qwen_window(const struct qs_json_ctx *c, const struct cJSON *o,
                                  struct cvt_hf_config *cfg)
{
    bool use_sw = false;
    int64_t sw = 0, mwl, L = cfg->num_hidden_layers, n_sliding = 0;
    const struct cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    const char *by = "layer_types";
    CVT_TRY_JSON(qs_json_bool(c, o, "use_sliding_window", false, &use_sw));
    if (use_sw)
        CVT_TRY(window_length(c, o, cfg, &sw));
    if (lt && !cJSON_IsNull(lt)) {
        CVT_TRY(qwen2_layer_types(c, lt, L, &n_sliding));
        if (n_sliding && !sw) {
            qs_log_error(c->fn, "%s/%s: layer_types names sliding_attention layers but no window "
                                "is set (use_sliding_window false or sliding_window null)",
                         c->where, c->file);
            return CVT_ERR_CONFIG;
        }
    } else if (sw) {
        by = "max_window_layers";
        CVT_TRY_JSON(qs_json_int(c, o, "max_window_layers", false, 28, 0, 4096, &mwl));
        n_sliding = mwl < L ? L - mwl : 0;
    }
    if (n_sliding != 0 && n_sliding != L) {
        qs_log_error(c->fn, "%s/%s: Qwen sliding window on %lld of %lld layers (by %s: per-layer "
                            "windows) is not supported",
                     c->where, c->file, (long long)n_sliding, (long long)L, by);
        return CVT_ERR_UNSUPPORTED;
    }
    cfg->sliding_window = n_sliding ? sw : 0;
    return CVT_ERR_NONE;
}

static enum cvt_err qwen2_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                               struct cvt_hf_config *cfg)
{
    CVT_TRY(cvt_arch_qwen_window(c, o, cfg));
    cfg->bias_roles = CVT_ROLE_BIT(FMT_N_QKV);
    return CVT_ERR_NONE;
}

#define LLAMA_TENSORS                                                                          \
    .hf_embed = "model.embed_tokens", .hf_lm_head = "lm_head",                                 \
    .hf_final_norm = "model.norm.weight", .hf_layer = "model.layers.%d",                       \
    .n_steps = (int)(sizeof(layer) / sizeof(layer[0])), .steps = layer

const struct cvt_arch cvt_arch_llama = {
    .name = "llama", .hf_class = "LlamaForCausalLM", .model_type = "llama",
    .rope_theta = 10000.0, .max_position_embeddings = 2048, .num_key_value_heads = 0,
    .rms_norm_eps = 1e-6, .head_dim = 0, .sliding_window = 0, .hidden_act = "silu", .moe = false,
    .read_keys = llama_keys, LLAMA_TENSORS,
};

const struct cvt_arch cvt_arch_mistral = {
    .name = "mistral", .hf_class = "MistralForCausalLM", .model_type = "mistral",
    .rope_theta = 10000.0, .max_position_embeddings = 4096 * 32, .num_key_value_heads = 8,
    .rms_norm_eps = 1e-6, .sliding_window = 4096, .hidden_act = "silu", .moe = false,
    .read_keys = cvt_arch_mistral_keys, LLAMA_TENSORS,
};

const struct cvt_arch cvt_arch_qwen2 = {
    .name = "qwen2", .hf_class = "Qwen2ForCausalLM", .model_type = "qwen2",
    .rope_theta = 10000.0, .max_position_embeddings = 32768, .num_key_value_heads = 32,
    .rms_norm_eps = 1e-6, .sliding_window = 4096, .hidden_act = "silu", .moe = false,
    .read_keys = qwen2_keys, LLAMA_TENSORS,
};

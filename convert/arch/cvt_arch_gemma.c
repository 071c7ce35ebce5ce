/*
 * cvt_arch_gemma.c - Gemma 2 and Gemma 3 (text) on the converter side: Gemma2ForCausalLM
 * (model_type "gemma2") and Gemma3ForCausalLM (model_type "gemma3_text"; the text-only
 * checkpoints such as gemma-3-1b; the multimodal Gemma3ForConditionalGeneration is refused by
 * the registry as an unknown class). LLaMA's linears (q/k/v -> qkv_proj, o_proj, gate/up ->
 * gate_up_proj, down_proj) and four RMSNorms per layer; Gemma 3 adds q_norm / k_norm.
 *
 * Tensors (transformers models/gemma2/modeling_gemma2.py, models/gemma3/modeling_gemma3.py ->
 * canonical roles of format/fmt_names.h), per layer i of "model.layers.%d":
 *   input_layernorm -> attention's input norm; post_attention_layernorm -> the attention
 *   output's norm (self_attn.out_norm); pre_feedforward_layernorm -> the MLP's input norm
 *   (post_attention_layernorm in the LLaMA names of DESIGN 5); post_feedforward_layernorm ->
 *   mlp.out_norm; Gemma 3's self_attn.q_norm / k_norm [head_dim]. Every norm is stored as
 *   1 + w (descriptor norm_offset; Gemma2RMSNorm computes x * (1 + w) in fp32).
 * Config (configuration_gemma2.py Gemma2Config, configuration_gemma3.py Gemma3TextConfig
 * defaults): head_dim 256, num_key_value_heads 4, rms_norm_eps 1e-6, tied embeddings,
 * hidden_activation gelu_pytorch_tanh (the alias of hidden_act), query_pre_attn_scalar 256
 * (attention scale query_pre_attn_scalar^-0.5), sliding_window 4096; Gemma 2: rope_theta
 * 10000, max_position_embeddings 8192, attn_logit_softcapping 50, final_logit_softcapping 30,
 * windowed and global layers alternating (layer i windowed iff (i + 1) % 2); Gemma 3:
 * rope_theta 1e6 with rope_scaling on the global layers, rope_local_base_freq 10000 on the
 * windowed ones, max_position_embeddings 131072, no soft-capping unless given, layer i
 * windowed iff (i + 1) % sliding_window_pattern (6). "layer_types", when given, must be such a
 * pattern. Embeddings are multiplied by sqrt(hidden_size) (embed_scale of the config section).
 * Refused by name: use_bidirectional_attention true, a null or non-positive sliding_window,
 * layer_types that are not one repeating pattern, attention_bias with mlp_bias.
 * Tests: ./build/test_cvt (fixtures gemma2-softcap-window, gemma3-qknorm-local-rope),
 * ./build/test_cvt_config.
 */
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h> /* layer_types */

#include "cvt_arch.h"
#include "cvt_src_int.h" /* CVT_TRY_JSON */
#include "qs_log.h"

/* One list for both: Gemma 2 takes the first GEMMA2_STEPS steps, Gemma 3 also its q/k norms */
static const struct cvt_arch_step layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "input_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_OUT_NORM, "post_attention_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "pre_feedforward_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_OUT_NORM, "post_feedforward_layernorm.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_attention},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, cvt_arch_llama_mlp},
    {CVT_ARCH_OP_HEAD_NORM, FMT_N_Q_NORM, "self_attn.q_norm.weight", false, 0, NULL},
    {CVT_ARCH_OP_HEAD_NORM, FMT_N_K_NORM, "self_attn.k_norm.weight", false, 0, NULL},
};
enum { GEMMA2_STEPS = 6 };

static const char *const aliases[] = {"hidden_act", "hidden_activation", NULL, NULL};

/* "layer_types" (a list of num_hidden_layers strings, "sliding_attention" or
 * "full_attention") as a pattern P: layer i windowed iff (i + 1) % P != 0, P the index + 1 of
 * the first global layer (P = L + 1 when every layer is windowed, 0 when none is: *none). */
static enum cvt_err layer_pattern(const struct qs_json_ctx *c, const cJSON *lt, int64_t L,
                                  int64_t *P, bool *none)
{
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != L) {
        qs_log_error(c->fn, "%s/%s: \"layer_types\" must be a list of num_hidden_layers (%lld) "
                            "strings", c->where, c->file, (long long)L);
        return CVT_ERR_CONFIG;
    }
    int64_t i = 0, first_full = -1, n_full = 0;
    bool sl[4096];
    for (const cJSON *t = lt->child; t && i < 4096; t = t->next, i++) {
        const bool s = cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
        if (!s && !(cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0)) {
            qs_log_error(c->fn, "%s/%s: layer_types[%lld] must be \"full_attention\" or "
                                "\"sliding_attention\"", c->where, c->file, (long long)i);
            return CVT_ERR_UNSUPPORTED;
        }
        sl[i] = s;
        if (!s && first_full < 0)
            first_full = i;
        n_full += !s;
    }
    *none = n_full == L;
    *P = first_full < 0 ? L + 1 : first_full + 1;
    for (i = 0; i < L && !*none; i++)
        if (sl[i] != ((i + 1) % *P != 0)) {
            qs_log_error(c->fn, "%s/%s: layer_types[%lld] breaks the pattern of one global layer "
                                "every %lld (per-layer kinds in any other order are not "
                                "supported)", c->where, c->file, (long long)i, (long long)*P);
            return CVT_ERR_UNSUPPORTED;
        }
    return CVT_ERR_NONE;
}

/* A soft-capping key: absent = def, null = none, else > 0. */
static enum cvt_err softcap(const struct qs_json_ctx *c, const cJSON *o, const char *key,
                            double def, double *out)
{
    if (qs_json_is_null(o, key)) {
        *out = 0.0;
        return CVT_ERR_NONE;
    }
    return cvt_from_json(qs_json_number(c, o, key, false, def, 1e-3, 1e6, out));
}

static enum cvt_err gemma_keys(const struct qs_json_ctx *c, const cJSON *o,
                               struct cvt_hf_config *cfg, bool gemma3)
{
    const int64_t L = cfg->num_hidden_layers;
    double qpas;
    bool ab = false, mb = false, bidir = false, none = false;
    CVT_TRY_JSON(qs_json_bool(c, o, "attention_bias", false, &ab));
    CVT_TRY_JSON(qs_json_bool(c, o, "mlp_bias", false, &mb));
    CVT_TRY_JSON(qs_json_bool(c, o, "use_bidirectional_attention", false, &bidir));
    if (mb || bidir) {
        qs_log_error(c->fn, "%s/%s: %s true is not supported", c->where, c->file,
                     mb ? "mlp_bias" : "use_bidirectional_attention");
        return CVT_ERR_UNSUPPORTED;
    }
    cfg->bias_roles = ab ? CVT_ROLE_BIT(FMT_N_QKV) | CVT_ROLE_BIT(FMT_N_O) : 0;
    CVT_TRY_JSON(qs_json_number(c, o, "query_pre_attn_scalar", false, 256.0, 1e-3, 1e9, &qpas));
    cfg->attn_scale = 1.0 / sqrt(qpas); /* Python's query_pre_attn_scalar**-0.5 */
    cfg->embed_scale = sqrt((double)cfg->hidden_size); /* hidden_size**0.5 */
    CVT_TRY(softcap(c, o, "attn_logit_softcapping", gemma3 ? 0.0 : 50.0, &cfg->attn_softcap));
    CVT_TRY(softcap(c, o, "final_logit_softcapping", gemma3 ? 0.0 : 30.0, &cfg->final_softcap));
    if (qs_json_is_null(o, "sliding_window")) {
        qs_log_error(c->fn, "%s/%s: sliding_window null: Gemma's windowed layers need a "
                            "length", c->where, c->file);
        return CVT_ERR_CONFIG;
    }
    CVT_TRY_JSON(qs_json_int(c, o, "sliding_window", false, 4096, 1, 1ll << 30,
                             &cfg->sliding_window));
    int64_t P = 2; /* Gemma 2: windowed iff (i + 1) % 2 */
    if (gemma3)
        CVT_TRY_JSON(qs_json_int(c, o, "sliding_window_pattern", false, 6, 1, 1ll << 16, &P));
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        int64_t Pl;
        CVT_TRY(layer_pattern(c, lt, L, &Pl, &none));
        if (!none && gemma3 && qs_json_given(o, "sliding_window_pattern") && Pl != P &&
            !(Pl > L && P > L)) {
            qs_log_error(c->fn, "%s/%s: layer_types (one global layer every %lld) and "
                                "sliding_window_pattern %lld disagree", c->where, c->file,
                         (long long)Pl, (long long)P);
            return CVT_ERR_CONFIG;
        }
        P = Pl;
    }
    if (none)
        cfg->sliding_window = 0;
    cfg->sliding_window_pattern = none ? 0 : P;
    cfg->rope_local_theta = 0.0;
    if (gemma3 && !none)
        CVT_TRY_JSON(qs_json_number(c, o, "rope_local_base_freq", false, 10000.0, 1e-3, 1e12,
                                    &cfg->rope_local_theta));
    return CVT_ERR_NONE;
}

static enum cvt_err gemma2_keys(const struct qs_json_ctx *c, const cJSON *o,
                                struct cvt_hf_config *cfg)
{
    return gemma_keys(c, o, cfg, false);
}

static enum cvt_err gemma3_keys(const struct qs_json_ctx *c, const cJSON *o,
                                struct cvt_hf_config *cfg)
{
    return gemma_keys(c, o, cfg, true);
}

#define GEMMA_COMMON                                                                           \
    .num_key_value_heads = 4, .rms_norm_eps = 1e-6, .head_dim = 256, .sliding_window = 4096,   \
    .hidden_act = "gelu_pytorch_tanh", .tie_word_embeddings = true, .key_aliases = aliases,    \
    .moe = false, .hf_embed = "model.embed_tokens", .hf_lm_head = "lm_head",                   \
    .hf_final_norm = "model.norm.weight", .hf_layer = "model.layers.%d", .norm_offset = 1.0

const struct cvt_arch cvt_arch_gemma2 = {
    .name = "gemma2", .hf_class = "Gemma2ForCausalLM", .model_type = "gemma2",
    .rope_theta = 10000.0, .max_position_embeddings = 8192, .read_keys = gemma2_keys,
    .n_steps = GEMMA2_STEPS, .steps = layer,
    GEMMA_COMMON,
};

const struct cvt_arch cvt_arch_gemma3 = {
    .name = "gemma3", .hf_class = "Gemma3ForCausalLM", .model_type = "gemma3_text",
    .rope_theta = 1000000.0, .max_position_embeddings = 131072, .read_keys = gemma3_keys,
    .n_steps = (int)(sizeof(layer) / sizeof(layer[0])), .steps = layer,
    GEMMA_COMMON,
};

/*
 * cvt_arch.h - architecture families as data, the converter's side: one descriptor per family
 * (convert/arch/cvt_arch_<family>.c) says which HuggingFace configs it takes, how their keys
 * default, which HF tensors it reads and how they become the canonical rank-file tensors of
 * docs/DESIGN.md section 5 (format/fmt_names.h roles): which tensors fuse into one output and how
 * each output is split across tensor-parallel ranks. The registry (convert/cvt_arch.c) lists the
 * descriptors; everything else in convert/ is generic and reads them:
 *   - cvt_config.c: architectures[0] / model_type -> descriptor; common keys (heads, kv heads,
 *     rms_norm_eps, RoPE, ...) with the descriptor's defaults; the descriptor's read_keys for the
 *     family's own keys;
 *   - cvt_plan.c: the plan of every output of every rank from the descriptor's tensor lists;
 *   - cvt_write.c: the config section's "architecture" is the descriptor's name (the runtime's
 *     descriptor of that name reads the file).
 * Adding a family (docs/CONVERT.md section 4): one file in convert/arch/, one line in the
 * registry, tests.
 *
 * Who calls it: the files above, tests/test_cvt_plan.c, tests/test_cvt_src.c.
 * Descriptors are static constant data: identified by pointer, named by `name`.
 */
#ifndef QS_CVT_ARCH_H
#define QS_CVT_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvt_src.h"   /* enum cvt_err, struct cvt_hf_config */
#include "fmt.h"       /* enum fmt_split */
#include "fmt_names.h" /* enum fmt_name */
#include "qs_json.h"   /* struct qs_json_ctx */

#ifdef __cplusplus
extern "C" {
#endif

/* A dimension of the model, as the plan sizes and splits it (DESIGN 5). */
enum cvt_axis {
    CVT_AXIS_HIDDEN = 0, /* H; never split */
    CVT_AXIS_Q = 1,      /* num_attention_heads * head_dim; split by query heads (nq_r per rank) */
    CVT_AXIS_KV = 2,     /* num_key_value_heads * head_dim; split by kv heads, replicated when
                          * tp > kv heads (rank r holds kv head r / (tp / nkv)) */
    CVT_AXIS_INTER = 3,  /* intermediate_size (per expert); padded to I_pad = I_r * tp, rank r
                          * holds [r I_r, min((r + 1) I_r, I)) */
};

/* One HF linear feeding an output: module `hf` under the layer prefix ("self_attn.q_proj"; in a
 * per-expert step a pattern taking the expert index, "block_sparse_moe.experts.%d.w1"), with
 * in_features along axis k and out_features along axis n. Consecutive parts of one output that
 * name the same module are column ranges of one fused source, in order (Phi-3's qkv_proj = parts
 * (qkv_proj, Q), (qkv_proj, KV), (qkv_proj, KV)): the source is [k, sum of their n]. */
struct cvt_arch_part {
    const char *hf;
    enum cvt_axis k, n;
};

#define CVT_ARCH_MAX_PARTS 3   /* HF linears fused into one output */
#define CVT_ARCH_MAX_LINEARS 4 /* outputs of one LINEARS step */

/* One output linear (a canonical role, DESIGN 5) and the HF linears fused into it.
 *   FMT_SPLIT_COLUMN: the parts side by side along N in order ([q_r | k_r | v_r],
 *     [gate_r | up_r]), each cut along its n axis; biases likewise.
 *   FMT_SPLIT_ROW: one part, cut along its k axis; a bias whole on rank 0 only.
 * Each part is stored quantized or float as the files say; all parts of one output alike. A bias
 * is taken when the files have one; planning from the config alone, when cfg->bias_roles has
 * CVT_ROLE_BIT(role). */
struct cvt_arch_linear {
    enum fmt_name role;
    enum fmt_split split;
    int n_parts;
    struct cvt_arch_part parts[CVT_ARCH_MAX_PARTS];
};

enum cvt_arch_op {
    CVT_ARCH_OP_NORM = 1,    /* replicated F32 vector [H]: tensor `hf` under the layer -> role */
    CVT_ARCH_OP_LINEARS = 2, /* linears[]: every part of every output looked up first, in order,
                              * then each output planned for every rank, in order */
    CVT_ARCH_OP_IGNORE = 3,  /* tensor `hf` under the layer is dropped if present (a buffer such as
                              * rotary_emb.inv_freq that old exports carry) */
    CVT_ARCH_OP_ROUTER = 4,  /* replicated F32 [num_local_experts, H] MoE router: module `hf`
                              * under the layer, its ".weight" -> role; a quantized router
                              * (`hf`.qweight) is refused */
    CVT_ARCH_OP_HEAD_NORM = 5, /* replicated F32 vector [head_dim]: tensor `hf` under the layer
                                * -> role (Qwen3's per-head q_norm / k_norm) */
    /* (a LayerNorm's bias is a NORM step of its own, role FMT_N_*_NORM_BIAS) */
    CVT_ARCH_OP_INTER_VECTOR = 6, /* F32 vector [intermediate_size]: tensor `hf` under the
                                   * layer -> role, split like the MLP's up columns (rank r:
                                   * [r I_r, (r + 1) I_r)); refused when I needs padding
                                   * (MPT's ffn.act.scales: a padded divisor would be 0) */
};

/* One step of a layer's plan. Steps run in order; the outputs they make are written in that
 * order (the rank file's tensor order). */
struct cvt_arch_step {
    enum cvt_arch_op op;
    enum fmt_name role;                     /* NORM, ROUTER */
    const char *hf;                         /* NORM, IGNORE: tensor; ROUTER: module */
    bool per_expert;                        /* LINEARS: once per expert e = 0..E-1, the parts'
                                             * hf patterns and the roles taking e */
    int n_linears;                          /* LINEARS */
    const struct cvt_arch_linear *linears;  /* LINEARS */
};

struct cvt_arch {
    const char *name;          /* "llama": the config section's "architecture" (DESIGN 6) */
    const char *hf_class;      /* config.json "architectures": ["LlamaForCausalLM"] */
    const char *model_type;    /* config.json "model_type": "llama" */
    /* config keys: the defaults of the family's transformers configuration class
     * (configuration_<family>.py), used when config.json lacks the key; an explicit JSON null is
     * Python's None, which the classes treat as said per field (docs/FORMATS.md 10.1) */
    double rope_theta;                 /* no theta in any RoPE spelling: the class's
                                        * default_theta (cvt_config.c parse_rope) */
    int64_t max_position_embeddings;   /* absent or null */
    int64_t num_key_value_heads;       /* absent: this, 0 = num_attention_heads (LlamaConfig);
                                        * null: num_attention_heads in every class; -1: the
                                        * key is not read, read_keys sets it (Falcon, MPT) */
    double rms_norm_eps;               /* absent or null */
    int64_t head_dim;                  /* absent: this, 0 = hidden_size / num_attention_heads */
    int64_t sliding_window;            /* absent: this window length, 0 = none; null: none. Read
                                        * by the family's read_keys (Mistral's always, Qwen2's only
                                        * with use_sliding_window) */
    const char *hidden_act;            /* the only "hidden_act" accepted (absent = this one) */
    int64_t ffn_mult;                  /* 0: intermediate_size is required; k: absent = k *
                                        * hidden_size (FalconConfig's ffn_hidden_size) */
    bool tie_word_embeddings;          /* absent tie_word_embeddings (PretrainedConfig: true;
                                        * LlamaConfig and the others here: false) */
    /* Other spellings of the common keys: pairs {key, alias}, NULL-terminated; the alias is read
     * when config.json lacks the key (Falcon: num_attention_heads <- n_head, ...). NULL: none. */
    const char *const *key_aliases;
    bool moe;                          /* experts: num_local_experts > 0 after read_keys */
    /* The family's own keys (sliding window, biases, experts), read after the common ones into
     * cfg (sliding_window, bias_roles, num_local_experts, num_experts_per_tok); reports and
     * returns CVT_ERR_CONFIG / CVT_ERR_UNSUPPORTED. NULL: none. */
    enum cvt_err (*read_keys)(const struct qs_json_ctx *c, const struct cJSON *o,
                              struct cvt_hf_config *cfg);
    /* HF tensor names (the source side) */
    const char *hf_embed;      /* module of the token embedding [V, H] ("model.embed_tokens") */
    const char *hf_lm_head;    /* module of the output projection [V, H] ("lm_head") */
    const char *hf_final_norm; /* tensor of the final norm [H] ("model.norm.weight") */
    const char *hf_final_norm_bias; /* its bias [H] (LayerNorm families), or NULL */
    const char *hf_layer;      /* prefix of layer i's names, taking i ("model.layers.%d") */
    bool qkv_grouped;          /* the qkv_proj output's parts (Q, KV, KV) of one fused source are
                                * laid out per kv group: [q of the group's nq/nkv heads | k | v]
                                * for each kv head in turn (Falcon-40B's query_key_value,
                                * modeling_falcon.py _split_heads with new_decoder_architecture);
                                * gathered into [q_r | k_r | v_r] */
    double norm_offset;        /* added to every stored norm weight (NORM, HEAD_NORM steps, the
                                * final norm), in fp32: Gemma's RMSNorm multiplies by 1 + w
                                * (transformers Gemma2RMSNorm: 1.0 + weight.float()); 0 others */
    int n_steps;
    const struct cvt_arch_step *steps; /* one decoder layer */
};

/* Bit of a role in a role mask (struct cvt_hf_config bias_roles). */
#define CVT_ROLE_BIT(role) (1u << (unsigned)(role))

/* The registry (convert/cvt_arch.c), in the order messages list them. */
int cvt_arch_count(void);
const struct cvt_arch *cvt_arch_at(int i);
/* The descriptor whose name (`name`), HF class (`hf_class`) or model_type (`model_type`) is s;
 * NULL when none (nothing reported). */
const struct cvt_arch *cvt_arch_find(const char *name);
const struct cvt_arch *cvt_arch_by_hf_class(const char *hf_class);
const struct cvt_arch *cvt_arch_by_model_type(const char *model_type);
/* "LlamaForCausalLM, MistralForCausalLM, ..." (hf_class) or "llama, mistral, ..." (model_type)
 * into buf[cap]: the "supported:" list of messages. */
void cvt_arch_list(bool hf_class, char *buf, size_t cap);

/* The LLaMA family's attention (q/k/v -> qkv_proj column-parallel, o_proj row-parallel), which
 * Mixtral shares (convert/arch/cvt_arch_llama.c). */
extern const struct cvt_arch_linear cvt_arch_llama_attention[2];
/* The LLaMA MLP: gate_proj + up_proj -> gate_up_proj (column), down_proj (row). */
extern const struct cvt_arch_linear cvt_arch_llama_mlp[2];
/* MistralConfig's sliding_window into cfg->sliding_window: a length, null (no window) or absent
 * (cfg->arch->sliding_window). Mistral's read_keys, which Mixtral's calls first. */
enum cvt_err cvt_arch_mistral_keys(const struct qs_json_ctx *c, const struct cJSON *o,
                                   struct cvt_hf_config *cfg);
/* Qwen2Config / Qwen3Config's window keys (use_sliding_window, sliding_window, layer_types,
 * max_window_layers) into cfg->sliding_window; a window on some layers only is refused. */
enum cvt_err cvt_arch_qwen_window(const struct qs_json_ctx *c, const struct cJSON *o,
                                  struct cvt_hf_config *cfg);

#ifdef __cplusplus
}
#endif
#endif /* QS_CVT_ARCH_H */

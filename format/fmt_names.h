/*
 * fmt_names.h - the canonical tensor names of a rank file (docs/DESIGN.md section 5), in one
 * place for the converter (which writes them) and the runtime (which binds them).
 *
 * A name is built from a role (enum fmt_name), a layer index and, for MoE experts, an expert
 * index. Linear roles name the module prefix ("model.layers.3.self_attn.qkv_proj"); the stored
 * tensors add a suffix: FMT_SUFFIX_QWEIGHT / _SCALES / _QZEROS for a packed W4 linear (DESIGN 4),
 * FMT_SUFFIX_WEIGHT for an unquantised fp16 linear, FMT_SUFFIX_BIAS for its bias. Other roles
 * name the whole tensor ("model.norm.weight"). The names are part of the file contract: a role
 * is never renamed, new roles are appended.
 *
 * Who calls it: convert/cvt_plan.c and the converter's architecture descriptors, runtime/rt_model.c
 * and the runtime's architecture descriptors, tools/cmd_inspect.c, tests.
 */
#ifndef QS_FMT_NAMES_H
#define QS_FMT_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Prefix of every per-layer name (a pattern taking the layer index). */
#define FMT_NAME_LAYER "model.layers.%d."

/* X(role, pattern, per-layer, per-expert, linear): the printf pattern takes the layer index
 * (per-layer roles) and then the expert index (per-expert roles). */
#define FMT_NAME_LIST(X)                                                                        \
    X(FMT_N_EMBED, "model.embed_tokens.weight", false, false, false)                            \
    X(FMT_N_LM_HEAD, "lm_head.weight", false, false, false)                                     \
    X(FMT_N_FINAL_NORM, "model.norm.weight", false, false, false)                               \
    X(FMT_N_ATTN_NORM, FMT_NAME_LAYER "input_layernorm.weight", true, false, false)             \
    X(FMT_N_MLP_NORM, FMT_NAME_LAYER "post_attention_layernorm.weight", true, false, false)     \
    X(FMT_N_QKV, FMT_NAME_LAYER "self_attn.qkv_proj", true, false, true)                        \
    X(FMT_N_O, FMT_NAME_LAYER "self_attn.o_proj", true, false, true)                            \
    X(FMT_N_GATE_UP, FMT_NAME_LAYER "mlp.gate_up_proj", true, false, true)                      \
    X(FMT_N_DOWN, FMT_NAME_LAYER "mlp.down_proj", true, false, true)                            \
    X(FMT_N_ROUTER, FMT_NAME_LAYER "block_sparse_moe.gate.weight", true, false, false)          \
    X(FMT_N_EXPERT_GATE_UP, FMT_NAME_LAYER "block_sparse_moe.experts.%d.gate_up_proj", true,    \
      true, true)                                                                               \
    X(FMT_N_EXPERT_DOWN, FMT_NAME_LAYER "block_sparse_moe.experts.%d.down_proj", true, true,    \
      true)                                                                                     \
    X(FMT_N_Q_NORM, FMT_NAME_LAYER "self_attn.q_norm.weight", true, false, false)               \
    X(FMT_N_K_NORM, FMT_NAME_LAYER "self_attn.k_norm.weight", true, false, false)               \
    X(FMT_N_FINAL_NORM_BIAS, "model.norm.bias", false, false, false)                            \
    X(FMT_N_ATTN_NORM_BIAS, FMT_NAME_LAYER "input_layernorm.bias", true, false, false)          \
    X(FMT_N_MLP_NORM_BIAS, FMT_NAME_LAYER "post_attention_layernorm.bias", true, false, false)  \
    X(FMT_N_ACT_SCALES, FMT_NAME_LAYER "mlp.act_scales", true, false, false)                   \
    X(FMT_N_ATTN_OUT_NORM, FMT_NAME_LAYER "self_attn.out_norm.weight", true, false, false)      \
    X(FMT_N_MLP_OUT_NORM, FMT_NAME_LAYER "mlp.out_norm.weight", true, false, false)

enum fmt_name {
#define FMT_X_ENUM(role, pattern, per_layer, per_expert, linear) role,
    FMT_NAME_LIST(FMT_X_ENUM)
#undef FMT_X_ENUM
    FMT_N_COUNT
};

#define FMT_SUFFIX_QWEIGHT ".qweight"
#define FMT_SUFFIX_SCALES ".scales"
#define FMT_SUFFIX_QZEROS ".qzeros"
#define FMT_SUFFIX_WEIGHT ".weight"
#define FMT_SUFFIX_BIAS ".bias"
#define FMT_SUFFIX_PERM ".perm" /* act-order input permutation of a W4 linear, I32 [K] (DESIGN 4.5) */

/*
 * Write the canonical name of `role` for `layer` and `expert` (ignored where the role has none)
 * followed by `suffix` (NULL or "" for none) into buf[cap]. Returns buf, or NULL (nothing
 * reported) when the role is unknown, an index is negative, or the name does not fit.
 */
char *fmt_name(char *buf, size_t cap, enum fmt_name role, int layer, int expert,
               const char *suffix);

/* Whether `role` names a linear module prefix (tensors are the prefix + a suffix). */
bool fmt_name_is_linear(enum fmt_name role);

/*
 * The role, layer and expert a full tensor name or linear prefix was built from (the inverse of
 * fmt_name; `suffix_out` receives the suffix after a linear prefix, "" otherwise). false when
 * `name` is not canonical. Used by `qshard inspect` and the tests' round trips.
 */
bool fmt_name_parse(const char *name, enum fmt_name *role, int *layer, int *expert,
                    const char **suffix_out);

/*
 * The part of a per-layer canonical name after its layer prefix FMT_NAME_LAYER
 * ("model.layers.3.self_attn.o_proj.qweight" -> "self_attn.o_proj.qweight"), or NULL when
 * `name` does not start with a layer prefix. The result points into `name`.
 */
const char *fmt_name_in_layer(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* QS_FMT_NAMES_H */

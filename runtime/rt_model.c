/*
 * rt_model.c - one rank of a converted model (rt.h): open its rank file, create its backend,
 * bind the tensors its architecture implies (canonical names of format/fmt_names.h) to weight
 * views, and allocate its activations. The forward pass is rt_forward.c, the KV cache rt_kv.c,
 * the ranks of one process rt_exec.c.
 *
 * Entry points: rt_model_open, rt_model_free and accessors, rt_err_str, rt_err_exit_code,
 * rt_opts_default. Test: ./build/test_model
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_names.h" /* fmt_name */
#include "qs_log.h"    /* qs_log_error, qs_log_info */
#include "qs_util.h"   /* qs_now_s */
#include "ref.h"       /* ref_rope_inv_freq, ref_w4_shape_ok */
#include "rt_model_int.h"

// --- errors and options ---------------------------------------------------------------------

const char *rt_err_str(enum rt_err e)
{
    switch (e) {
#define RT_X_STR(name, val, code, msg) \
    case name:                         \
        return msg;
        RT_ERR_LIST(RT_X_STR)
#undef RT_X_STR
    }
    return "unknown rt_err";
}

int rt_err_exit_code(enum rt_err e)
{
    switch (e) {
#define RT_X_CODE(name, val, code, msg) \
    case name:                          \
        return code;
        RT_ERR_LIST(RT_X_CODE)
#undef RT_X_CODE
    }
    return 3;
}

struct rt_opts rt_opts_default(void)
{
    struct rt_opts o = {.device = RT_DEVICE_AUTO, .p2p_allreduce = 1}; /* the rest 0 / false */
    return o;
}

// --- binding tensors --------------------------------------------------------------------------

static const char *dtype_str(enum fmt_dtype d)
{
    const char *s = fmt_dtype_name(d);
    return s ? s : "?";
}

static const char *layout_str(enum fmt_layout l)
{
    const char *s = fmt_layout_name(l);
    return s ? s : "?";
}

/*
 * Find tensor `name` in the shard and check dtype, layout and the 1-D or 2-D shape (d1 < 0:
 * 1-D). Missing: RT_ERR_MISSING_TENSOR unless optional (then *out = NULL).
 */
static enum rt_err bind(struct rt_model *m, const char *name, enum fmt_dtype dtype,
                        enum fmt_layout layout, long long d0, long long d1, bool optional,
                        const void **out)
{
    const struct fmt_shard *s = m->shard;
    const char *file = fmt_shard_path(s);
    const struct fmt_tensor *t = fmt_shard_find(s, name);
    *out = NULL;
    if (!t) {
        if (optional)
            return RT_ERR_NONE;
        qs_log_error(__func__, "file %s: tensor %s is missing (the %s config needs it)", file,
                     name, m->cfg.architecture);
        return RT_ERR_MISSING_TENSOR;
    }
    if (!t->layout_known) {
        qs_log_error(__func__, "file %s: tensor %s: unknown layout tag %u (written by a newer "
                     "converter?); expected %s", file, name, (unsigned)t->layout,
                     layout_str(layout));
        return RT_ERR_LAYOUT;
    }
    if (t->dtype != dtype || t->layout != layout) {
        qs_log_error(__func__, "file %s: tensor %s: expected dtype %s layout %s, got %s %s", file,
                     name, dtype_str(dtype), layout_str(layout), dtype_str(t->dtype),
                     layout_str(t->layout));
        return RT_ERR_LAYOUT;
    }
    uint32_t nd = d1 < 0 ? 1 : 2;
    if (t->n_dims != nd || t->shape[0] != (uint64_t)d0 || (nd == 2 && t->shape[1] != (uint64_t)d1)) {
        char want[64], got[96];
        if (nd == 1)
            snprintf(want, sizeof(want), "[%lld]", d0);
        else
            snprintf(want, sizeof(want), "[%lld, %lld]", d0, d1);
        snprintf(got, sizeof(got), "%u dims [%llu, %llu, ...]", t->n_dims,
                 (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
        qs_log_error(__func__, "file %s: tensor %s: config implies shape %s, file has %s", file,
                     name, want, got);
        return RT_ERR_SHAPE;
    }
    m->used[fmt_shard_tensor_index(s, t)] = true;
    m->weight_bytes += t->size;
    *out = OPS->tensor_ptr(BCTX, t);
    return RT_ERR_NONE;
}

/* bind() of role `role` (layer, expert; suffix NULL for whole-tensor roles). */
static enum rt_err bind_role(struct rt_model *m, enum fmt_name role, int layer, int expert,
                             const char *suffix, enum fmt_dtype dtype, enum fmt_layout layout,
                             long long d0, long long d1, bool optional, const void **out)
{
    char name[FMT_NAME_MAX + 1];
    if (!fmt_name(name, sizeof(name), role, layer, expert, suffix)) {
        qs_log_error(__func__, "tensor name of role %d, layer %d, expert %d does not fit",
                     (int)role, layer, expert);
        return RT_ERR_ARG;
    }
    return bind(m, name, dtype, layout, d0, d1, optional, out);
}

/*
 * The group size of the packed linear `prefix` from its scales tensor: G = K / rows of
 * `<prefix>.scales` [K/G, N]. It is per tensor, not the config's: a row-parallel rank holding part
 * of a source group has a local group size G_r = gcd(G, K_r) (DESIGN 4), each local group taking
 * its source group's scale/zero row. Checked: 2-D, rows > 0 dividing K, G % 16 == 0, and G
 * divides the config's group_size (a local group lies inside one source group). Errors:
 * RT_ERR_MISSING_TENSOR, RT_ERR_SHAPE, reported naming the tensor. The full dtype / layout / shape
 * check is bind()'s.
 */
static enum rt_err linear_group(const struct rt_model *m, enum fmt_name role, int layer,
                                int expert, const char *prefix, int K, int *G)
{
    const struct rt_config *c = &m->cfg;
    const char *file = fmt_shard_path(m->shard);
    char name[FMT_NAME_MAX + 1] = "";
    const struct fmt_tensor *t =
        fmt_name(name, sizeof(name), role, layer, expert, FMT_SUFFIX_SCALES)
            ? fmt_shard_find(m->shard, name) : NULL;
    if (!t) {
        qs_log_error(__func__, "file %s: tensor %s is missing (%s%s is present)", file, name,
                     prefix, FMT_SUFFIX_QWEIGHT);
        return RT_ERR_MISSING_TENSOR;
    }
    uint64_t rows = t->n_dims == 2 ? t->shape[0] : 0;
    if (rows == 0 || (uint64_t)K % rows) {
        qs_log_error(__func__, "file %s: tensor %s: %llu rows with K=%d input features; expected "
                     "[K/G, N] with G dividing K", file, name, (unsigned long long)rows, K);
        return RT_ERR_SHAPE;
    }
    int g = K / (int)rows;
    if (g % 16 || (c->group_size > 0 && c->group_size % g)) {
        qs_log_error(__func__, "file %s: tensor %s: [%llu, N] implies group size %d for K=%d; "
                     "expected a multiple of 16 that divides the config group_size %d", file,
                     name, (unsigned long long)rows, g, K, c->group_size);
        return RT_ERR_SHAPE;
    }
    *G = g;
    return RT_ERR_NONE;
}

/* The optional act-order permutation `<prefix>.perm` I32 [K] of linear L (DESIGN 4.5): checked
 * to be a permutation of 0..K-1 on the host mapping (a hostile file must not make the gather
 * read out of bounds). Errors: RT_ERR_LAYOUT / RT_ERR_SHAPE (bind), RT_ERR_FORMAT (not a
 * permutation: names the tensor and the entry), RT_ERR_NOMEM. */
static enum rt_err bind_perm(struct rt_model *m, enum fmt_name role, int layer, int expert,
                             struct rt_linear *L)
{
    char name[FMT_NAME_MAX + 1];
    const void *p;
    RT_TRY(bind_role(m, role, layer, expert, FMT_SUFFIX_PERM, FMT_DTYPE_I32, FMT_LAYOUT_ROW_MAJOR,
                     L->K, -1, true, &p));
    if (!p)
        return RT_ERR_NONE;
    fmt_name(name, sizeof(name), role, layer, expert, FMT_SUFFIX_PERM);
    const struct fmt_tensor *t = fmt_shard_find(m->shard, name);
    uint8_t *seen = calloc((size_t)L->K, 1);
    if (!seen) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    for (int j = 0; j < L->K; j++) {
        int32_t v;
        memcpy(&v, (const uint8_t *)t->data + 4 * (size_t)j, 4);
        if (v < 0 || v >= L->K || seen[v]) {
            qs_log_error(__func__, "file %s: tensor %s: entry %d is %d: not a permutation of "
                         "0..%d", fmt_shard_path(m->shard), name, j, (int)v, L->K - 1);
            free(seen);
            return RT_ERR_FORMAT;
        }
        seen[v] = 1;
    }
    free(seen);
    L->perm = p;
    if ((size_t)L->K > m->perm_cols)
        m->perm_cols = (size_t)L->K;
    return RT_ERR_NONE;
}

/* Bind the linear of `role` (layer, expert): packed W4 triple (group size from its scales,
 * linear_group), else `<prefix>.weight` fp16 [N, K]; `<prefix>.bias` fp32 [N] optional unless
 * need_bias. */
static enum rt_err bind_linear(struct rt_model *m, enum fmt_name role, int layer, int expert,
                               int K, int N, bool need_bias, struct rt_linear *L)
{
    char pre[FMT_NAME_MAX + 1], name[FMT_NAME_MAX + 1];
    const void *p;
    const char *file = fmt_shard_path(m->shard);
    memset(L, 0, sizeof(*L));
    L->K = K, L->N = N;
    if (!fmt_name(pre, sizeof(pre), role, layer, expert, NULL)) {
        qs_log_error(__func__, "linear name of role %d, layer %d does not fit", (int)role, layer);
        return RT_ERR_ARG;
    }
    if (fmt_name(name, sizeof(name), role, layer, expert, FMT_SUFFIX_QWEIGHT) &&
        fmt_shard_find(m->shard, name)) {
        if (!ref_w4_shape_ok(K, N, 0)) {
            qs_log_error(__func__, "file %s: %s: per-rank shape [K=%d, N=%d] cannot use the "
                         "packed layout (K %% 16 and N %% 64 must be 0)", file, pre, K, N);
            return RT_ERR_SHAPE;
        }
        RT_TRY(linear_group(m, role, layer, expert, pre, K, &L->G));
        RT_TRY(bind_role(m, role, layer, expert, FMT_SUFFIX_QWEIGHT, FMT_DTYPE_Q4,
                      FMT_LAYOUT_W4_MMA_T16X64, K, N, false, &p));
        L->qweight = p;
        RT_TRY(bind_role(m, role, layer, expert, FMT_SUFFIX_QZEROS, FMT_DTYPE_Q4, FMT_LAYOUT_Z4_T64,
                      K / L->G, N, false, &p));
        L->qzeros = p;
        RT_TRY(bind_role(m, role, layer, expert, FMT_SUFFIX_SCALES, FMT_DTYPE_F16, FMT_LAYOUT_S_T64,
                      K / L->G, N, false, &p));
        L->scales = p;
        L->acc_ok = OPS->linear_acc_ok && OPS->linear_acc_ok(BCTX, K, N, L->G);
    } else {
        if (!fmt_name(name, sizeof(name), role, layer, expert, FMT_SUFFIX_WEIGHT) ||
            !fmt_shard_find(m->shard, name)) {
            qs_log_error(__func__, "file %s: linear %s is missing (neither %s%s nor %s%s)", file,
                         pre, pre, FMT_SUFFIX_QWEIGHT, pre, FMT_SUFFIX_WEIGHT);
            return RT_ERR_MISSING_TENSOR;
        }
        RT_TRY(bind_role(m, role, layer, expert, FMT_SUFFIX_WEIGHT, FMT_DTYPE_F16,
                      FMT_LAYOUT_ROW_MAJOR, N, K, false, &p));
        L->weight_f16 = p;
    }
    RT_TRY(bind_role(m, role, layer, expert, FMT_SUFFIX_BIAS, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR,
                  N, -1, !need_bias, &p));
    L->bias = p;
    return bind_perm(m, role, layer, expert, L);
}

/* The MoE MLP of layer l: router + experts (the architecture says moe). */
static enum rt_err bind_experts(struct rt_model *m, int l)
{
    const struct rt_config *c = &m->cfg;
    struct rt_layer *ly = &m->layers[l];
    int E = c->n_experts, H = c->hidden_size, Ir = c->intermediate_per_rank;
    const void *p;
    RT_TRY(bind_role(m, FMT_N_ROUTER, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, E, H, false,
                  &p));
    ly->router = p;
    ly->expert_gate_up = calloc((size_t)E, sizeof(struct rt_linear));
    ly->expert_down = calloc((size_t)E, sizeof(struct rt_linear));
    if (!ly->expert_gate_up || !ly->expert_down) {
        qs_log_error(__func__, "out of memory for %d experts", E);
        return RT_ERR_NOMEM;
    }
    for (int e = 0; e < E; e++) {
        RT_TRY(bind_linear(m, FMT_N_EXPERT_GATE_UP, l, e, H, 2 * Ir, false, &ly->expert_gate_up[e]));
        RT_TRY(bind_linear(m, FMT_N_EXPERT_DOWN, l, e, Ir, H, false, &ly->expert_down[e]));
        ly->expert_gate_up[e].acc_ok = ly->expert_down[e].acc_ok = false; /* read by scatter */
    }
    return RT_ERR_NONE;
}

static enum rt_err bind_layer(struct rt_model *m, int l)
{
    const struct rt_config *c = &m->cfg;
    struct rt_layer *ly = &m->layers[l];
    int H = c->hidden_size, hd = c->head_dim;
    int nq = c->heads_per_rank, nkv = c->kv_heads_per_rank, Ir = c->intermediate_per_rank;
    const void *p;

    const bool ln = c->arch->norm_bias, par = c->arch->parallel_residual;
    RT_TRY(bind_role(m, FMT_N_ATTN_NORM, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, H, -1,
                  false, &p));
    ly->attn_norm = p;
    if (ln) { /* LayerNorm with bias (Falcon; MPT's have none) */
        RT_TRY(bind_role(m, FMT_N_ATTN_NORM_BIAS, l, -1, NULL, FMT_DTYPE_F32,
                         FMT_LAYOUT_ROW_MAJOR, H, -1, false, &p));
        ly->attn_norm_b = p;
    }
    /* parallel residual: the MLP reads the attention's norm, or (Falcon-40B's ln_mlp) a norm of
     * its own of the same layer input */
    RT_TRY(bind_role(m, FMT_N_MLP_NORM, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, H, -1,
                     par, &p));
    ly->mlp_norm = p;
    if (ly->mlp_norm) {
        if (ln) {
            RT_TRY(bind_role(m, FMT_N_MLP_NORM_BIAS, l, -1, NULL, FMT_DTYPE_F32,
                             FMT_LAYOUT_ROW_MAJOR, H, -1, false, &p));
            ly->mlp_norm_b = p;
        }
    }
    if (c->arch->post_norms) { /* Gemma: the block outputs' norms */
        RT_TRY(bind_role(m, FMT_N_ATTN_OUT_NORM, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR,
                         H, -1, false, &p));
        ly->attn_out_norm = p;
        RT_TRY(bind_role(m, FMT_N_MLP_OUT_NORM, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR,
                         H, -1, false, &p));
        ly->mlp_out_norm = p;
    }
    if (c->arch->qk_norm) {
        if (!m->be.ops->head_norm) {
            qs_log_error(__func__, "%s: architecture %s needs per-head q/k norms, which this "
                         "backend lacks", m->path, c->arch->name);
            return RT_ERR_UNSUPPORTED;
        }
        RT_TRY(bind_role(m, FMT_N_Q_NORM, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, hd, -1,
                      false, &p));
        ly->q_norm = p;
        RT_TRY(bind_role(m, FMT_N_K_NORM, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, hd, -1,
                      false, &p));
        ly->k_norm = p;
    }
    RT_TRY(bind_linear(m, FMT_N_QKV, l, -1, H, (nq + 2 * nkv) * hd, c->attention_bias, &ly->qkv));
    RT_TRY(bind_linear(m, FMT_N_O, l, -1, nq * hd, H, false, &ly->o));
    if (c->arch->moe)
        return bind_experts(m, l);
    if (c->arch->alibi) { /* MPT: AutoAWQ's ScaledActivation divisors, when quantized so */
        RT_TRY(bind_role(m, FMT_N_ACT_SCALES, l, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, Ir,
                         -1, true, &p));
        ly->act_scale = p;
    }
    /* gated: [gate | up] (2 I_r columns); plain (Falcon's dense_h_to_4h): I_r */
    RT_TRY(bind_linear(m, FMT_N_GATE_UP, l, -1, H, (rt_act_gated(c->arch->act) ? 2 : 1) * Ir,
                       false, &ly->gate_up));
    return bind_linear(m, FMT_N_DOWN, l, -1, Ir, H, false, &ly->down);
}

static enum rt_err bind_all(struct rt_model *m)
{
    const struct rt_config *c = &m->cfg;
    const void *p;
    uint32_t nt = fmt_shard_n_tensors(m->shard);

    m->used = calloc(nt ? nt : 1, sizeof(bool));
    m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
    if (!m->used || !m->layers) {
        qs_log_error(__func__, "out of memory for %d layers", c->n_layers);
        return RT_ERR_NOMEM;
    }
    RT_TRY(bind_role(m, FMT_N_EMBED, -1, -1, NULL, FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR,
                  c->vocab_size_per_rank, c->hidden_size, false, &p));
    m->embed = p;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else {
        RT_TRY(bind_role(m, FMT_N_LM_HEAD, -1, -1, NULL, FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR,
                      c->vocab_size_per_rank, c->hidden_size, false, &p));
        m->lm_head = p;
    }
    RT_TRY(bind_role(m, FMT_N_FINAL_NORM, -1, -1, NULL, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR,
                  c->hidden_size, -1, false, &p));
    m->final_norm = p;
    if (c->arch->norm_bias) {
        RT_TRY(bind_role(m, FMT_N_FINAL_NORM_BIAS, -1, -1, NULL, FMT_DTYPE_F32,
                         FMT_LAYOUT_ROW_MAJOR, c->hidden_size, -1, false, &p));
        m->final_norm_b = p;
    }
    for (int l = 0; l < c->n_layers; l++)
        RT_TRY(bind_layer(m, l));
    /* a tensor we do not use means a model feature we would silently ignore */
    for (uint32_t i = 0; i < nt; i++)
        if (!m->used[i]) {
            qs_log_error(__func__, "file %s: tensor %s is not used by the %s forward pass (a model "
                         "feature this runtime does not implement?)", fmt_shard_path(m->shard),
                         fmt_shard_tensor(m->shard, i)->name, c->architecture);
            return RT_ERR_UNSUPPORTED;
        }
    return RT_ERR_NONE;
}

// --- buffers ------------------------------------------------------------------------------------

static enum rt_err balloc(struct rt_model *m, size_t bytes, void *out)
{
    void *p = NULL;
    enum rt_err e = OPS->alloc(BCTX, bytes, &p);
    memcpy(out, &p, sizeof(p));
    return e;
}

/* Rows up to which linears defer and the width of the accumulator they share: qkv and gate_up
 * always (their consumers, rope_kv_store and act_mul, are local), o and down at world size 1
 * only (at world > 1 their outputs go to the all-reduce). */
static void plan_defer(struct rt_model *m)
{
    const struct rt_config *c = &m->cfg;
    m->defer_m = m->opts.no_defer ? 0 : OPS->defer_max_m;
    if (m->defer_m > m->max_batch)
        m->defer_m = m->max_batch;
    m->acc_cols = 0;
    if (m->defer_m <= 0)
        return;
    for (int l = 0; l < c->n_layers; l++) {
        struct rt_layer *ly = &m->layers[l];
        const struct rt_linear *L[4] = {&ly->qkv, &ly->gate_up, &ly->o, &ly->down};
        for (int i = 0; i < 4; i++) {
            if (!L[i]->acc_ok || (i >= 2 && m->world > 1))
                continue;
            if ((size_t)L[i]->N > m->acc_cols)
                m->acc_cols = (size_t)L[i]->N;
        }
        if (m->world > 1) /* the all-reduce reads them */
            ly->o.acc_ok = ly->down.acc_ok = false;
    }
    if (m->acc_cols == 0)
        m->defer_m = 0;
}

static enum rt_err alloc_buffers(struct rt_model *m)
{
    const struct rt_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, H = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    size_t nq = (size_t)c->heads_per_rank, nkv = (size_t)c->kv_heads_per_rank;
    size_t Ir = (size_t)c->intermediate_per_rank, A = OPS->act_size, F = sizeof(float);
    size_t Vr = (size_t)c->vocab_size_per_rank, LB = (size_t)m->logit_rows;

    RT_TRY(balloc(m, B * H * F, &m->h));
    RT_TRY(balloc(m, B * H * A, &m->x));
    RT_TRY(balloc(m, B * H * A, &m->o));
    RT_TRY(balloc(m, B * (nq + 2 * nkv) * hd * A, &m->qkv));
    RT_TRY(balloc(m, B * nq * hd * A, &m->att));
    RT_TRY(balloc(m, B * 2 * Ir * A, &m->gu));
    RT_TRY(balloc(m, B * Ir * A, &m->act));
    RT_TRY(balloc(m, B * H * A, &m->xe));
    if (c->arch->post_norms) {
        RT_TRY(balloc(m, B * H * A, &m->post));
        if (m->defer_m > 0)
            RT_TRY(balloc(m, (size_t)m->defer_m * H * F, &m->post_sums));
    }
    if (m->perm_cols)
        RT_TRY(balloc(m, B * m->perm_cols * A, &m->xperm));
    if (c->arch->moe) {
        RT_TRY(balloc(m, B * H * A, &m->ye));
        RT_TRY(balloc(m, B * (size_t)c->n_experts * F, &m->router_logits));
    }
    if (m->defer_m > 0)
        RT_TRY(balloc(m, (size_t)m->defer_m * m->acc_cols * F, &m->acc));
    RT_TRY(balloc(m, LB * Vr * F, &m->logits));
    if (m->rank == 0 && m->world > 1)
        RT_TRY(balloc(m, (size_t)m->world * LB * Vr * F, &m->logits_all));
    RT_TRY(balloc(m, hd / 2 * F, &m->inv_freq));
    /* token ids, positions, pool slots, table rows: one buffer, one upload per chunk */
    RT_TRY(balloc(m, 4 * B * sizeof(int32_t), &m->tok));
    m->pos = m->tok + B;
    m->slots = m->tok + 2 * B;
    m->row_tab = m->tok + 3 * B;
    RT_TRY(balloc(m, B * (size_t)m->tab_stride * sizeof(int32_t), &m->tabs));

    float *inv = malloc(hd / 2 * sizeof(float));
    if (!inv) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    if (c->arch->alibi) /* no rotary: cos 0 = 1, sin 0 = 0 leave q and k exactly as they are */
        memset(inv, 0, hd / 2 * sizeof(float));
    else
        ref_rope_inv_freq(inv, c->head_dim, c->rope_theta, &c->rope_scaling);
    enum rt_err e = OPS->upload(BCTX, m->inv_freq, inv, hd / 2 * sizeof(float));
    if (!e && c->rope_local_theta > 0.0) { /* Gemma 3's windowed layers: no scaling */
        ref_rope_inv_freq(inv, c->head_dim, c->rope_local_theta, NULL);
        e = balloc(m, hd / 2 * F, &m->inv_freq_local);
        if (!e)
            e = OPS->upload(BCTX, m->inv_freq_local, inv, hd / 2 * sizeof(float));
    }
    free(inv);
    if (e || !c->arch->alibi)
        return e;
    /* ALiBi: the slopes of this rank's heads [rank * nq_r, (rank + 1) * nq_r) */
    const int nh = c->heads_per_rank;
    float *sl = malloc((size_t)nh * sizeof(float));
    if (!sl) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    ref_alibi_slopes(sl, c->n_heads, m->rank * nh, nh, c->alibi_bias_max);
    e = balloc(m, (size_t)nh * F, &m->alibi);
    if (!e)
        e = OPS->upload(BCTX, m->alibi, sl, (size_t)nh * sizeof(float));
    free(sl);
    return e;
}

static enum rt_err alloc_host(struct rt_model *m)
{
    const struct rt_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, k = (size_t)(c->n_experts_per_tok ? c->n_experts_per_tok : 1);
    size_t n_logits = (size_t)m->world * (size_t)m->logit_rows * (size_t)c->vocab_size_per_rank;
    m->h_logits = m->rank == 0 ? malloc(n_logits * sizeof(float)) : NULL;
    m->h_router = malloc(B * (size_t)(c->n_experts ? c->n_experts : 1) * sizeof(float));
    m->h_ids = malloc(B * k * sizeof(int32_t));
    m->h_w = malloc(B * k * sizeof(float));
    m->h_rows = malloc(B * sizeof(int32_t));
    m->h_out = malloc(B * sizeof(int32_t));
    m->h_roww = malloc(B * sizeof(float));
    m->runs = malloc(B * sizeof(*m->runs));
    m->h_tok = calloc(4 * B, sizeof(int32_t)); /* laid out as m->tok */
    m->h_pos = m->h_tok ? m->h_tok + B : NULL;
    m->h_slots = m->h_tok ? m->h_tok + 2 * B : NULL;
    m->h_row_tab = m->h_tok ? m->h_tok + 3 * B : NULL;
    m->h_tabs = calloc(B * (size_t)m->tab_stride, sizeof(int32_t));
    if ((m->rank == 0 && !m->h_logits) || !m->h_router || !m->h_ids || !m->h_w || !m->h_rows ||
        !m->h_out || !m->h_roww || !m->runs || !m->h_pos || !m->h_slots || !m->h_row_tab ||
        !m->h_tok || !m->h_tabs) {
        qs_log_error(__func__, "out of host memory for %zu logit rows of %d", (size_t)m->logit_rows,
                     c->vocab_size_per_rank);
        return RT_ERR_NOMEM;
    }
    return RT_ERR_NONE;
}

// --- open -------------------------------------------------------------------------------------

static enum rt_err from_fmt(enum fmt_err e)
{
    switch (e) {
    case FMT_ERR_NONE:
        return RT_ERR_NONE;
    case FMT_ERR_IO:
        return RT_ERR_IO;
    case FMT_ERR_NOMEM:
        return RT_ERR_NOMEM;
    case FMT_ERR_RANK_MISMATCH:
    case FMT_ERR_MISSING_RANK:
    case FMT_ERR_DIGEST:
    case FMT_ERR_RANK:
        return RT_ERR_RANK_MISMATCH;
    default:
        return RT_ERR_FORMAT;
    }
}

/* This rank's file: from a directory through its manifest, or a single TP-1 rank file; then
 * the config, which must name this rank of a TP set of the communicator's size. */
static enum rt_err open_file(struct rt_model *m, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        qs_log_error(__func__, "%s: %s", path, strerror(errno));
        return RT_ERR_IO;
    }
    if (S_ISDIR(st.st_mode)) {
        RT_TRY(from_fmt(fmt_manifest_open_rank(path, (uint32_t)m->rank, &m->shard)));
    } else {
        RT_TRY(from_fmt(fmt_shard_open(path, &m->shard)));
        const struct fmt_header *hd = fmt_shard_header(m->shard);
        if (hd->world_size != 1) {
            qs_log_error(__func__, "%s is rank %u of a TP-%u set: open the directory that holds "
                         "all its rank files and manifest.json instead", path, hd->tp_rank,
                         hd->world_size);
            return RT_ERR_RANK_MISMATCH;
        }
    }
    const char *json;
    size_t len;
    RT_TRY(from_fmt(fmt_shard_config_json(m->shard, &json, &len)));
    RT_TRY(rt_config_parse(json, len, fmt_shard_path(m->shard), &m->cfg));
    const struct fmt_header *hd = fmt_shard_header(m->shard);
    if (m->cfg.world_size != m->world || m->cfg.rank != m->rank || (int)hd->tp_rank != m->rank ||
        (int)hd->world_size != m->world) {
        qs_log_error(__func__, "file %s: header says rank %u of %u, config says rank %d of %d, "
                     "expected rank %d of %d", fmt_shard_path(m->shard), hd->tp_rank,
                     hd->world_size, m->cfg.rank, m->cfg.world_size, m->rank, m->world);
        return RT_ERR_RANK_MISMATCH;
    }
    return RT_ERR_NONE;
}

static enum rt_err create_backend(struct rt_model *m)
{
    enum rt_device d = m->opts.device;
    if (d == RT_DEVICE_AUTO)
        d = rt_cuda_available() ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    if (d != RT_DEVICE_CPU && d != RT_DEVICE_CUDA) {
        qs_log_error(__func__, "unknown device %d", (int)m->opts.device);
        return RT_ERR_ARG;
    }
    m->device = d;
    if (d == RT_DEVICE_CUDA)
        return rt_cuda_backend_create(&m->opts, m->comm, &m->be);
    return rt_cpu_backend_create(&m->opts, m->comm, &m->be);
}

/* Context, rows per forward (rt_opts.max_batch, else the backend's default, 512 when it has
 * none, at most n_ctx) and the lm_head's rows per pass. */
static enum rt_err size_model(struct rt_model *m)
{
    const struct rt_config *c = &m->cfg;
    int maxpos = c->max_position_embeddings;
    m->n_ctx = m->opts.n_ctx > 0 ? m->opts.n_ctx : (maxpos < 4096 ? maxpos : 4096);
    if (m->n_ctx > maxpos) {
        qs_log_error(__func__, "context of %d tokens asked for, but the model was trained for at "
                     "most max_position_embeddings = %d", m->n_ctx, maxpos);
        return RT_ERR_CONTEXT;
    }
    int def = OPS->default_batch > 0 ? OPS->default_batch : 512;
    m->max_batch = m->opts.max_batch > 0 ? m->opts.max_batch : def;
    if (m->max_batch > m->n_ctx * (m->opts.n_seqs > 1 ? m->opts.n_seqs : 1))
        m->max_batch = m->n_ctx * (m->opts.n_seqs > 1 ? m->opts.n_seqs : 1);
    /* lm_head rows per pass: every row of a decode batch of up to 256 sequences at once */
    m->logit_rows = m->max_batch < 256 ? m->max_batch : 256;
    m->block_size = m->opts.block_size > 0 ? m->opts.block_size : RT_DEFAULT_BLOCK_SIZE;
    m->tab_stride = (m->n_ctx + m->block_size - 1) / m->block_size;
    return RT_ERR_NONE;
}

static enum rt_err model_open(struct rt_model *m, const char *path)
{
    const double t0 = qs_now_s();
    RT_TRY(open_file(m, path));
    const double t1 = qs_now_s();
    if (!m->be.ops)
        RT_TRY(create_backend(m));
    const double t2 = qs_now_s();
    RT_TRY(size_model(m));
    RT_TRY(OPS->load_weights(BCTX, m->shard));
    const double t3 = qs_now_s();
    if (m->cfg.arch->alibi && !OPS->alibi) {
        qs_log_error(__func__, "%s: architecture %s (ALiBi attention, scaled activation) does not "
                     "run on the %s backend yet: use --device cpu", m->path,
                     m->cfg.arch->name, OPS->name);
        return RT_ERR_UNSUPPORTED;
    }
    if (m->cfg.final_softcap > 0.0f && !OPS->softcap) {
        qs_log_error(__func__, "%s: the %s backend cannot soft-cap logits (final_softcap)",
                     m->path, OPS->name);
        return RT_ERR_UNSUPPORTED;
    }
    RT_TRY(bind_all(m));
    plan_defer(m);
    RT_TRY(alloc_buffers(m));
    RT_TRY(alloc_host(m));
    m->graphs = !m->opts.no_graph && OPS->graph_begin && OPS->graph_end && OPS->graph_ready &&
                OPS->graph_replay && !m->cfg.arch->moe;
    const struct rt_config *c = &m->cfg;
    if (m->rank == 0)
        qs_log_info("model %s: %s, %d layer%s, hidden %d, heads %d (kv %d, head_dim %d), vocab "
                    "%d, group_size %d%s; TP %d on %s; weights %.1f MiB per rank; prompts in "
                    "forwards of up to %d row%s", path, c->architecture, c->n_layers,
                    c->n_layers == 1 ? "" : "s", c->hidden_size, c->n_heads, c->n_kv_heads,
                    c->head_dim, c->vocab_size, c->group_size,
                    c->arch->moe ? ", mixture of experts" : "", m->world, OPS->name,
                    (double)m->weight_bytes / (1 << 20), m->max_batch,
                    m->max_batch == 1 ? "" : "s");
    qs_log_debug("rank %d: model open %.3f s: file %.3f s, backend %.3f s, weights %.3f s, "
                 "buffers %.3f s", m->rank, qs_now_s() - t0, t1 - t0, t2 - t1, t3 - t2,
                 qs_now_s() - t3);
    qs_log_debug("rank %d: deferred split-K up to %d row%s (accumulator of %zu columns)%s",
                 m->rank, m->defer_m, m->defer_m == 1 ? "" : "s", m->acc_cols,
                 m->graphs ? "; decode steps as graphs" : "");
    return RT_ERR_NONE;
}

enum rt_err rt_model_open(const char *path_or_dir, int rank, const struct rt_opts *opts,
                          struct rt_comm *comm, const struct rt_backend *be,
                          struct rt_model **out)
{
    *out = NULL;
    struct rt_model *m = calloc(1, sizeof(*m));
    if (!m) {
        qs_log_error(__func__, "out of memory");
        if (be && be->ops)
            be->ops->destroy(be->ctx);
        return RT_ERR_NOMEM;
    }
    m->opts = opts ? *opts : rt_opts_default();
    m->rank = rank;
    m->world = comm ? comm->world : 1;
    m->comm = comm;
    if (be && be->ops) { /* owned from here on: rt_model_free destroys it */
        m->be = *be;
        m->device = m->opts.device == RT_DEVICE_CUDA ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    }
    enum rt_err e = RT_ERR_NONE;
    if (rank < 0 || rank >= m->world) {
        qs_log_error(__func__, "rank %d outside [0, %d)", rank, m->world);
        e = RT_ERR_ARG;
    } else if (!(m->path = strdup(path_or_dir))) {
        qs_log_error(__func__, "out of memory");
        e = RT_ERR_NOMEM;
    } else {
        e = model_open(m, path_or_dir);
    }
    if (e) {
        rt_model_free(m);
        return e;
    }
    *out = m;
    return RT_ERR_NONE;
}

void rt_model_free(struct rt_model *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            free(m->layers[l].expert_gate_up);
            free(m->layers[l].expert_down);
        }
        free(m->layers);
    }
    free(m->used);
    if (m->be.ops) {
        void *bufs[] = {m->h,   m->x,     m->o,      m->qkv,          m->att,
                        m->gu,  m->act,   m->xe,     m->ye,           m->acc,
                        m->router_logits, m->logits, m->logits_all,   m->inv_freq,
                        m->tok, m->tabs,  m->xperm,  m->alibi,        m->inv_freq_local,
                        m->post, m->post_sums};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            OPS->free(BCTX, bufs[i]);
        OPS->destroy(BCTX);
    }
    free(m->h_logits);
    free(m->h_router);
    free(m->h_ids);
    free(m->h_w);
    free(m->h_rows);
    free(m->h_out);
    free(m->h_roww);
    free(m->runs);
    free(m->h_tok); /* with h_pos, h_slots, h_row_tab */
    free(m->h_tabs);
    fmt_shard_close(m->shard);
    free(m->path);
    free(m);
}

const struct rt_config *rt_model_config(const struct rt_model *m)
{
    return &m->cfg;
}

const struct fmt_shard *rt_model_shard(const struct rt_model *m)
{
    return m->shard;
}

enum rt_device rt_model_device(const struct rt_model *m)
{
    return m->device;
}

int rt_model_n_ctx(const struct rt_model *m)
{
    return m->n_ctx;
}

bool rt_model_can_pick(const struct rt_model *m)
{
    return OPS->sample && !m->opts.host_sample;
}

/*
 * rt_model.c - open a converted model (all its rank files), bind the tensors DESIGN 5 names to
 * per-rank weight views, and run the LLaMA-family forward pass through the backend interface
 * (rt.h). The same code drives the CPU backend (rt_cpu.c) and the CUDA backend (rt_cuda.cu).
 *
 * Layout of the work: every op is issued once per rank r = 0..world-1 on that rank's weights
 * and buffers; row-parallel outputs (embedding, o_proj, down_proj / experts) are summed across
 * ranks by all_reduce, so the residual stream h is replicated on every rank. Long inputs are run
 * in chunks of max_batch tokens (chunked prefill) so activations stay bounded.
 *
 * Entry points: rt_model_open, rt_model_forward, rt_model_reset, rt_model_free and accessors,
 * rt_err_str, rt_err_exit_code, rt_opts_default. Test: ./build/test_model
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qs_log.h" /* qs_log_error, qs_log_info */
#include "ref.h"    /* ref_rope_inv_freq, ref_moe_route, ref_w4_shape_ok */
#include "rt.h"

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

// --- types ------------------------------------------------------------------------------------

/* One linear of one rank: packed W4 (DESIGN 4) or unquantised fp16, plus an optional bias.
 * All pointers are backend addresses borrowed from the weight memory. */
struct rt_linear {
    int K, N, G;                /* in_features, out_features, group size of this tensor on this
                                 * rank: K / rows of its scales (G_r of DESIGN 4, may be below
                                 * the config group_size) */
    const uint8_t *qweight;     /* [K, N] packed 4.1, or NULL when weight_f16 is set */
    const uint8_t *qzeros;      /* [K/G, N] packed 4.3 */
    const uint16_t *scales;     /* [K/G, N] fp16 packed 4.2 */
    const uint16_t *weight_f16; /* [N][K] fp16 row-major (modules_to_not_convert) */
    const float *bias;          /* [N] or NULL */
};

struct rt_layer {
    const float *attn_norm;          /* [H] input_layernorm */
    const float *mlp_norm;           /* [H] post_attention_layernorm */
    struct rt_linear qkv;            /* [H] -> [(nq_r + 2 nkv_r) * hd], columns [q | k | v] */
    struct rt_linear o;              /* [nq_r * hd] -> [H], row-parallel */
    struct rt_linear gate_up;        /* dense MLP: [H] -> [2 I_r], columns [gate | up] */
    struct rt_linear down;           /* dense MLP: [I_r] -> [H], row-parallel */
    const float *router;             /* MoE: [E][H] fp32, replicated */
    struct rt_linear *expert_gate_up; /* owned array [E] */
    struct rt_linear *expert_down;    /* owned array [E] */
};

/* Everything of one rank: its shard, config, weight views and activations. */
struct rt_rank {
    const struct fmt_shard *shard; /* borrowed from the model's fmt_model / single shard */
    struct rt_config cfg;
    bool *used;                    /* owned [n_tensors]: bound by the model (unused = error) */
    const uint16_t *embed;         /* [V_r][H] fp16 */
    const uint16_t *lm_head;       /* [V_r][H] fp16 (= embed when tied) */
    const float *final_norm;       /* [H] */
    struct rt_layer *layers;       /* owned [n_layers] */
    /* backend memory, owned; B = max_batch rows; "act" = backend activation type (rt.h) */
    float *h;        /* f32 [B][H] residual stream (replicated across ranks) */
    void *x;         /* act [B][H] normalised input of the current block */
    void *o;         /* act [B][H] block output (partial sum before all_reduce) */
    void *qkv;       /* act [B][(nq_r + 2 nkv_r) hd] */
    void *att;       /* act [B][nq_r hd] */
    void *gu;        /* act [B][2 I_r] */
    void *act;       /* act [B][I_r] */
    void *xe, *ye;   /* act, MoE: [B][H] gathered expert input / expert output */
    float *router_logits; /* f32, MoE: [B][E] */
    float *logits;   /* f32 [LB][V_r] */
    float *logits_all; /* f32 [V], rank 0 at world > 1 with device sampling: the last row's
                        * logits of every rank gathered (pick_id) */
    float *inv_freq; /* f32 [hd/2] */
    void **k_cache, **v_cache; /* owned arrays [n_layers] of kv [nkv_r][n_ctx][hd] */
};

struct rt_model {
    struct fmt_model *fm;      /* owned, when opened from a directory */
    struct fmt_shard *single;  /* owned, when opened from one TP-1 rank file */
    char *path;                /* owned copy of the path given */
    int world;
    struct rt_rank *ranks;     /* owned [world] */
    struct rt_backend be;      /* owned (be.ops NULL until created) */
    enum rt_device device;
    int n_ctx;                 /* KV cache capacity in tokens */
    int max_batch;             /* rows of the activation buffers */
    int logit_rows;            /* LB: rows of lm_head output per pass */
    int n_past;                /* cached positions */
    uint64_t weight_bytes;     /* bytes of all bound tensors, all ranks */
    void **bufs;               /* owned [world]: scratch array for all_reduce arguments */
    int graph_failures;        /* decode-step recordings that failed; graphs off at 2 */
    /* host scratch, owned */
    float *h_logits;           /* [LB][V_r] */
    float *h_router;           /* [B][E] */
    int32_t *h_ids;            /* [B][top_k] */
    float *h_w;                /* [B][top_k] */
    int32_t *h_rows;           /* [B] */
    float *h_roww;             /* [B] */
};

#define OPS (m->be.ops)
#define BCTX (m->be.ctx)

#define TRY(expr)                        \
    do {                                 \
        enum rt_err try_err_ = (expr);   \
        if (try_err_ != RT_ERR_NONE)     \
            return try_err_;             \
    } while (0)

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
 * Find tensor `name` in rank r's shard and check dtype, layout and the 1-D or 2-D shape
 * (d1 < 0: 1-D). Missing: RT_ERR_MISSING_TENSOR unless optional (then *out = NULL).
 */
static enum rt_err bind(struct rt_model *m, int r, const char *name, enum fmt_dtype dtype,
                        enum fmt_layout layout, long long d0, long long d1, bool optional,
                        const void **out)
{
    const struct fmt_shard *s = m->ranks[r].shard;
    const char *file = fmt_shard_path(s);
    const struct fmt_tensor *t = fmt_shard_find(s, name);
    *out = NULL;
    if (!t) {
        if (optional)
            return RT_ERR_NONE;
        qs_log_error(__func__, "file %s: tensor %s is missing (the %s config needs it)", file,
                     name, m->ranks[r].cfg.architecture);
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
    m->ranks[r].used[fmt_shard_tensor_index(s, t)] = true;
    m->weight_bytes += t->size;
    *out = OPS->tensor_ptr(BCTX, r, t);
    return RT_ERR_NONE;
}

/*
 * The group size of the packed linear `prefix` of rank r from its scales tensor: G = K / rows of
 * `<prefix>.scales` [K/G, N]. It is per tensor, not the config's: a row-parallel rank holding part
 * of a source group has a local group size G_r = gcd(G, K_r) (DESIGN 4), each local group taking
 * its source group's scale/zero row. Checked: 2-D, rows > 0 dividing K, G % 16 == 0, and G
 * divides the config's group_size (a local group lies inside one source group). Errors:
 * RT_ERR_MISSING_TENSOR, RT_ERR_SHAPE, reported naming the tensor. The full dtype / layout / shape
 * check is bind()'s.
 */
static enum rt_err linear_group(const struct rt_model *m, int r, const char *prefix, int K, int *G)
{
    const struct rt_config *c = &m->ranks[r].cfg;
    const char *file = fmt_shard_path(m->ranks[r].shard);
    char name[FMT_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%s.scales", prefix);
    const struct fmt_tensor *t = fmt_shard_find(m->ranks[r].shard, name);
    if (!t) {
        qs_log_error(__func__, "file %s: tensor %s is missing (%s.qweight is present)", file, name,
                     prefix);
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

/* Bind linear `prefix` of rank r: packed W4 triple (group size from its scales, linear_group),
 * else `<prefix>.weight` fp16 [N, K]; `<prefix>.bias` fp32 [N] optional unless need_bias. */
static enum rt_err bind_linear(struct rt_model *m, int r, const char *prefix, int K, int N,
                               bool need_bias, struct rt_linear *L)
{
    char name[FMT_NAME_MAX + 1];
    const void *p;
    memset(L, 0, sizeof(*L));
    L->K = K, L->N = N;

    snprintf(name, sizeof(name), "%s.qweight", prefix);
    if (fmt_shard_find(m->ranks[r].shard, name)) {
        if (!ref_w4_shape_ok(K, N, 0)) {
            qs_log_error(__func__, "file %s: %s: per-rank shape [K=%d, N=%d] cannot use the "
                         "packed layout (K %% 16 and N %% 64 must be 0)",
                         fmt_shard_path(m->ranks[r].shard), prefix, K, N);
            return RT_ERR_SHAPE;
        }
        TRY(linear_group(m, r, prefix, K, &L->G));
        TRY(bind(m, r, name, FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, K, N, false, &p));
        L->qweight = p;
        snprintf(name, sizeof(name), "%s.qzeros", prefix);
        TRY(bind(m, r, name, FMT_DTYPE_Q4, FMT_LAYOUT_Z4_T64, K / L->G, N, false, &p));
        L->qzeros = p;
        snprintf(name, sizeof(name), "%s.scales", prefix);
        TRY(bind(m, r, name, FMT_DTYPE_F16, FMT_LAYOUT_S_T64, K / L->G, N, false, &p));
        L->scales = p;
    } else {
        snprintf(name, sizeof(name), "%s.weight", prefix);
        if (!fmt_shard_find(m->ranks[r].shard, name)) {
            qs_log_error(__func__, "file %s: linear %s is missing (neither %s.qweight nor "
                         "%s.weight)", fmt_shard_path(m->ranks[r].shard), prefix, prefix, prefix);
            return RT_ERR_MISSING_TENSOR;
        }
        TRY(bind(m, r, name, FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, N, K, false, &p));
        L->weight_f16 = p;
    }
    snprintf(name, sizeof(name), "%s.bias", prefix);
    TRY(bind(m, r, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, N, -1, !need_bias, &p));
    L->bias = p;
    return RT_ERR_NONE;
}

static enum rt_err bind_layer(struct rt_model *m, int r, int l)
{
    struct rt_rank *R = &m->ranks[r];
    const struct rt_config *c = &R->cfg;
    struct rt_layer *ly = &R->layers[l];
    int H = c->hidden_size, hd = c->head_dim;
    int nq = c->heads_per_rank, nkv = c->kv_heads_per_rank, Ir = c->intermediate_per_rank;
    char pre[256], name[FMT_NAME_MAX + 1];
    const void *p;

    snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", l);
    TRY(bind(m, r, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, H, -1, false, &p));
    ly->attn_norm = p;
    snprintf(name, sizeof(name), "model.layers.%d.post_attention_layernorm.weight", l);
    TRY(bind(m, r, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, H, -1, false, &p));
    ly->mlp_norm = p;
    snprintf(pre, sizeof(pre), "model.layers.%d.self_attn.qkv_proj", l);
    TRY(bind_linear(m, r, pre, H, (nq + 2 * nkv) * hd, c->attention_bias, &ly->qkv));
    snprintf(pre, sizeof(pre), "model.layers.%d.self_attn.o_proj", l);
    TRY(bind_linear(m, r, pre, nq * hd, H, false, &ly->o));

    if (c->n_experts == 0) {
        snprintf(pre, sizeof(pre), "model.layers.%d.mlp.gate_up_proj", l);
        TRY(bind_linear(m, r, pre, H, 2 * Ir, false, &ly->gate_up));
        snprintf(pre, sizeof(pre), "model.layers.%d.mlp.down_proj", l);
        TRY(bind_linear(m, r, pre, Ir, H, false, &ly->down));
        return RT_ERR_NONE;
    }
    int E = c->n_experts;
    snprintf(name, sizeof(name), "model.layers.%d.block_sparse_moe.gate.weight", l);
    TRY(bind(m, r, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, E, H, false, &p));
    ly->router = p;
    ly->expert_gate_up = calloc((size_t)E, sizeof(struct rt_linear));
    ly->expert_down = calloc((size_t)E, sizeof(struct rt_linear));
    if (!ly->expert_gate_up || !ly->expert_down) {
        qs_log_error(__func__, "out of memory for %d experts", E);
        return RT_ERR_NOMEM;
    }
    for (int e = 0; e < E; e++) {
        snprintf(pre, sizeof(pre), "model.layers.%d.block_sparse_moe.experts.%d.gate_up_proj", l,
                 e);
        TRY(bind_linear(m, r, pre, H, 2 * Ir, false, &ly->expert_gate_up[e]));
        snprintf(pre, sizeof(pre), "model.layers.%d.block_sparse_moe.experts.%d.down_proj", l, e);
        TRY(bind_linear(m, r, pre, Ir, H, false, &ly->expert_down[e]));
    }
    return RT_ERR_NONE;
}

static enum rt_err bind_rank(struct rt_model *m, int r)
{
    struct rt_rank *R = &m->ranks[r];
    const struct rt_config *c = &R->cfg;
    const void *p;
    uint32_t nt = fmt_shard_n_tensors(R->shard);

    R->used = calloc(nt ? nt : 1, sizeof(bool));
    R->layers = calloc((size_t)c->n_layers, sizeof(*R->layers));
    if (!R->used || !R->layers) {
        qs_log_error(__func__, "out of memory for %d layers", c->n_layers);
        return RT_ERR_NOMEM;
    }
    TRY(bind(m, r, "model.embed_tokens.weight", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR,
             c->vocab_size_per_rank, c->hidden_size, false, &p));
    R->embed = p;
    if (c->tie_word_embeddings) {
        R->lm_head = R->embed;
    } else {
        TRY(bind(m, r, "lm_head.weight", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR,
                 c->vocab_size_per_rank, c->hidden_size, false, &p));
        R->lm_head = p;
    }
    TRY(bind(m, r, "model.norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, c->hidden_size, -1,
             false, &p));
    R->final_norm = p;
    for (int l = 0; l < c->n_layers; l++)
        TRY(bind_layer(m, r, l));
    /* a tensor we do not use means a model feature we would silently ignore */
    for (uint32_t i = 0; i < nt; i++)
        if (!R->used[i]) {
            qs_log_error(__func__, "file %s: tensor %s is not used by the %s forward pass (a model "
                         "feature this runtime does not implement?)", fmt_shard_path(R->shard),
                         fmt_shard_tensor(R->shard, i)->name, c->architecture);
            return RT_ERR_UNSUPPORTED;
        }
    return RT_ERR_NONE;
}

// --- buffers ------------------------------------------------------------------------------------

static enum rt_err balloc_f32(struct rt_model *m, int r, size_t n, float **out)
{
    void *p = NULL;
    enum rt_err e = OPS->alloc(BCTX, r, n * sizeof(float), &p);
    *out = p;
    return e;
}

/* n activation elements (act_size bytes each) */
static enum rt_err balloc_act(struct rt_model *m, int r, size_t n, void **out)
{
    return OPS->alloc(BCTX, r, n * OPS->act_size, out);
}

/* Backend address of activation element `elems` of buffer p (whole rows or heads only). */
static void *act_at(const struct rt_model *m, void *p, size_t elems)
{
    return (char *)p + elems * OPS->act_size;
}

static enum rt_err alloc_rank(struct rt_model *m, int r)
{
    struct rt_rank *R = &m->ranks[r];
    const struct rt_config *c = &R->cfg;
    size_t B = (size_t)m->max_batch, H = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    size_t nq = (size_t)c->heads_per_rank, nkv = (size_t)c->kv_heads_per_rank;
    size_t Ir = (size_t)c->intermediate_per_rank;

    TRY(balloc_f32(m, r, B * H, &R->h));
    TRY(balloc_act(m, r, B * H, &R->x));
    TRY(balloc_act(m, r, B * H, &R->o));
    TRY(balloc_act(m, r, B * (nq + 2 * nkv) * hd, &R->qkv));
    TRY(balloc_act(m, r, B * nq * hd, &R->att));
    TRY(balloc_act(m, r, B * 2 * Ir, &R->gu));
    TRY(balloc_act(m, r, B * Ir, &R->act));
    if (c->n_experts) {
        TRY(balloc_act(m, r, B * H, &R->xe));
        TRY(balloc_act(m, r, B * H, &R->ye));
        TRY(balloc_f32(m, r, B * (size_t)c->n_experts, &R->router_logits));
    }
    TRY(balloc_f32(m, r, (size_t)m->logit_rows * (size_t)c->vocab_size_per_rank, &R->logits));
    if (r == 0 && m->world > 1 && OPS->sample && OPS->copy_ranks)
        TRY(balloc_f32(m, r, (size_t)c->vocab_size, &R->logits_all));
    TRY(balloc_f32(m, r, hd / 2, &R->inv_freq));

    float *inv = malloc(hd / 2 * sizeof(float));
    if (!inv) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    ref_rope_inv_freq(inv, c->head_dim, c->rope_theta, &c->rope_scaling);
    enum rt_err e = OPS->upload(BCTX, r, R->inv_freq, inv, hd / 2 * sizeof(float));
    free(inv);
    TRY(e);

    R->k_cache = calloc((size_t)c->n_layers, sizeof(void *));
    R->v_cache = calloc((size_t)c->n_layers, sizeof(void *));
    if (!R->k_cache || !R->v_cache) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    size_t kv = nkv * (size_t)m->n_ctx * hd * OPS->kv_size;
    for (int l = 0; l < c->n_layers; l++) {
        TRY(OPS->alloc(BCTX, r, kv, &R->k_cache[l]));
        TRY(OPS->alloc(BCTX, r, kv, &R->v_cache[l]));
    }
    return RT_ERR_NONE;
}

static void free_rank(struct rt_model *m, int r)
{
    struct rt_rank *R = &m->ranks[r];
    if (R->layers) {
        for (int l = 0; l < R->cfg.n_layers; l++) {
            free(R->layers[l].expert_gate_up);
            free(R->layers[l].expert_down);
        }
        free(R->layers);
    }
    free(R->used);
    if (m->be.ops) {
        void *bufs[] = {R->h, R->x, R->o, R->qkv, R->att, R->gu, R->act, R->xe, R->ye,
                        R->router_logits, R->logits, R->logits_all, R->inv_freq};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            OPS->free(BCTX, r, bufs[i]);
        for (int l = 0; l < R->cfg.n_layers; l++) {
            if (R->k_cache)
                OPS->free(BCTX, r, R->k_cache[l]);
            if (R->v_cache)
                OPS->free(BCTX, r, R->v_cache[l]);
        }
    }
    free(R->k_cache);
    free(R->v_cache);
    memset(R, 0, sizeof(*R));
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

/* Configs of all ranks must describe the same model and TP set (only tp.rank differs). */
static enum rt_err check_same_config(const struct rt_model *m, int r)
{
    const struct rt_config *a = &m->ranks[0].cfg, *b = &m->ranks[r].cfg;
#define SAME(f)                                                                               \
    if (a->f != b->f) {                                                                       \
        qs_log_error(__func__, "rank files %s and %s disagree on config field %s",            \
                     fmt_shard_path(m->ranks[0].shard), fmt_shard_path(m->ranks[r].shard), #f); \
        return RT_ERR_RANK_MISMATCH;                                                          \
    }
    SAME(arch) SAME(hidden_size) SAME(intermediate_size) SAME(intermediate_size_padded)
    SAME(n_layers) SAME(n_heads) SAME(n_kv_heads) SAME(head_dim) SAME(vocab_size)
    SAME(vocab_size_per_rank) SAME(rms_norm_eps) SAME(rope_theta) SAME(rope_scaling.type)
    SAME(rope_scaling.factor) SAME(rope_scaling.low_freq_factor)
    SAME(rope_scaling.high_freq_factor) SAME(rope_scaling.original_max_position_embeddings)
    SAME(max_position_embeddings) SAME(tie_word_embeddings) SAME(sliding_window)
    SAME(attention_bias) SAME(n_experts) SAME(n_experts_per_tok) SAME(group_size)
    SAME(zero_point) SAME(world_size) SAME(heads_per_rank) SAME(kv_heads_per_rank)
    SAME(kv_head_replicas) SAME(intermediate_per_rank)
#undef SAME
    return RT_ERR_NONE;
}

static enum rt_err open_files(struct rt_model *m, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        qs_log_error(__func__, "%s: %s", path, strerror(errno));
        return RT_ERR_IO;
    }
    if (S_ISDIR(st.st_mode)) {
        TRY(from_fmt(fmt_model_open(path, &m->fm)));
        m->world = (int)fmt_model_world_size(m->fm);
    } else {
        TRY(from_fmt(fmt_shard_open(path, &m->single)));
        const struct fmt_header *hd = fmt_shard_header(m->single);
        if (hd->world_size != 1) {
            qs_log_error(__func__, "%s is rank %u of a TP-%u set: open the directory that holds "
                         "all its rank files and manifest.json instead", path, hd->tp_rank,
                         hd->world_size);
            return RT_ERR_RANK_MISMATCH;
        }
        m->world = 1;
    }
    m->ranks = calloc((size_t)m->world, sizeof(*m->ranks));
    m->bufs = calloc((size_t)m->world, sizeof(*m->bufs));
    if (!m->ranks || !m->bufs) {
        qs_log_error(__func__, "out of memory for %d ranks", m->world);
        return RT_ERR_NOMEM;
    }
    for (int r = 0; r < m->world; r++) {
        struct rt_rank *R = &m->ranks[r];
        R->shard = m->fm ? fmt_model_shard(m->fm, (uint32_t)r) : m->single;
        const char *json;
        size_t len;
        TRY(from_fmt(fmt_shard_config_json(R->shard, &json, &len)));
        TRY(rt_config_parse(json, len, fmt_shard_path(R->shard), &R->cfg));
        const struct fmt_header *hd = fmt_shard_header(R->shard);
        if (R->cfg.world_size != m->world || R->cfg.rank != r || (int)hd->tp_rank != r ||
            (int)hd->world_size != m->world) {
            qs_log_error(__func__, "file %s: header says rank %u of %u, config says rank %d of "
                         "%d, expected rank %d of %d", fmt_shard_path(R->shard), hd->tp_rank,
                         hd->world_size, R->cfg.rank, R->cfg.world_size, r, m->world);
            return RT_ERR_RANK_MISMATCH;
        }
        if (r > 0)
            TRY(check_same_config(m, r));
    }
    return RT_ERR_NONE;
}

static enum rt_err create_backend(struct rt_model *m, const struct rt_opts *o)
{
    enum rt_device d = o->device;
    if (d == RT_DEVICE_AUTO)
        d = rt_cuda_available() ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    if (d != RT_DEVICE_CPU && d != RT_DEVICE_CUDA) {
        qs_log_error(__func__, "unknown device %d", (int)o->device);
        return RT_ERR_ARG;
    }
    m->device = d;
    if (d == RT_DEVICE_CUDA)
        return rt_cuda_backend_create(o, m->world, &m->be);
    return rt_cpu_backend_create(o, m->world, &m->be);
}

static enum rt_err size_context(struct rt_model *m, const struct rt_opts *o)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    int maxpos = c->max_position_embeddings;
    m->n_ctx = o->n_ctx > 0 ? o->n_ctx : (maxpos < 4096 ? maxpos : 4096);
    if (m->n_ctx > maxpos) {
        qs_log_error(__func__, "context of %d tokens asked for, but the model was trained for at "
                     "most max_position_embeddings = %d", m->n_ctx, maxpos);
        return RT_ERR_CONTEXT;
    }
    return RT_ERR_NONE;
}

/* Rows per forward: rt_opts.max_batch, else the backend's default (512 when it has none), at
 * most n_ctx. Needs the backend. */
static void size_batch(struct rt_model *m, const struct rt_opts *o)
{
    int def = OPS->default_batch > 0 ? OPS->default_batch : 512;
    m->max_batch = o->max_batch > 0 ? o->max_batch : def;
    if (m->max_batch > m->n_ctx)
        m->max_batch = m->n_ctx;
    m->logit_rows = m->max_batch < 64 ? m->max_batch : 64;
}

static enum rt_err alloc_host(struct rt_model *m)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    size_t B = (size_t)m->max_batch, k = (size_t)(c->n_experts_per_tok ? c->n_experts_per_tok : 1);
    m->h_logits = malloc((size_t)m->logit_rows * (size_t)c->vocab_size_per_rank * sizeof(float));
    m->h_router = malloc(B * (size_t)(c->n_experts ? c->n_experts : 1) * sizeof(float));
    m->h_ids = malloc(B * k * sizeof(int32_t));
    m->h_w = malloc(B * k * sizeof(float));
    m->h_rows = malloc(B * sizeof(int32_t));
    m->h_roww = malloc(B * sizeof(float));
    if (!m->h_logits || !m->h_router || !m->h_ids || !m->h_w || !m->h_rows || !m->h_roww) {
        qs_log_error(__func__, "out of host memory for %zu logit rows of %d", (size_t)m->logit_rows,
                     c->vocab_size_per_rank);
        return RT_ERR_NOMEM;
    }
    return RT_ERR_NONE;
}

static enum rt_err model_open(struct rt_model *m, const char *path, const struct rt_opts *o)
{
    TRY(open_files(m, path));
    TRY(size_context(m, o));
    if (!m->be.ops)
        TRY(create_backend(m, o));
    size_batch(m, o);
    for (int r = 0; r < m->world; r++) {
        TRY(OPS->load_weights(BCTX, r, m->ranks[r].shard));
        TRY(bind_rank(m, r));
        TRY(alloc_rank(m, r));
    }
    TRY(alloc_host(m));
    const struct rt_config *c = &m->ranks[0].cfg;
    double kv_mib = 2.0 * c->n_layers * c->kv_heads_per_rank * (double)m->n_ctx * c->head_dim *
                    (double)OPS->kv_size * m->world / (1 << 20);
    qs_log_info("model %s: %s, %d layer%s, hidden %d, heads %d (kv %d, head_dim %d), vocab %d, "
                "group_size %d%s; TP %d on %s; weights %.1f MiB per rank; KV cache %d tokens "
                "(%.1f MiB over %d rank%s); prompts in forwards of up to %d row%s", path,
                c->architecture, c->n_layers,
                c->n_layers == 1 ? "" : "s", c->hidden_size, c->n_heads, c->n_kv_heads,
                c->head_dim, c->vocab_size, c->group_size,
                c->n_experts ? ", mixture of experts" : "", m->world, OPS->name,
                (double)m->weight_bytes / m->world / (1 << 20), m->n_ctx, kv_mib, m->world,
                m->world == 1 ? "" : "s", m->max_batch, m->max_batch == 1 ? "" : "s");
    return RT_ERR_NONE;
}

static enum rt_err open_common(const char *path_or_dir, const struct rt_opts *opts,
                               const struct rt_backend *be, struct rt_model **out)
{
    *out = NULL;
    struct rt_opts o = opts ? *opts : rt_opts_default();
    struct rt_model *m = calloc(1, sizeof(*m));
    if (!m) {
        qs_log_error(__func__, "out of memory");
        if (be && be->ops)
            be->ops->destroy(be->ctx);
        return RT_ERR_NOMEM;
    }
    if (be) { /* owned from here on: rt_model_free destroys it */
        m->be = *be;
        m->device = o.device == RT_DEVICE_CUDA ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    }
    m->path = strdup(path_or_dir);
    enum rt_err e = m->path ? model_open(m, path_or_dir, &o) : RT_ERR_NOMEM;
    if (e) {
        rt_model_free(m);
        return e;
    }
    *out = m;
    return RT_ERR_NONE;
}

enum rt_err rt_model_open(const char *path_or_dir, const struct rt_opts *opts,
                          struct rt_model **out)
{
    return open_common(path_or_dir, opts, NULL, out);
}

enum rt_err rt_model_open_backend(const char *path_or_dir, const struct rt_opts *opts,
                                  const struct rt_backend *be, struct rt_model **out)
{
    if (!be || !be->ops) {
        *out = NULL;
        qs_log_error(__func__, "no backend given");
        return RT_ERR_ARG;
    }
    return open_common(path_or_dir, opts, be, out);
}

void rt_model_free(struct rt_model *m)
{
    if (!m)
        return;
    if (m->ranks)
        for (int r = 0; r < m->world; r++)
            free_rank(m, r);
    if (m->be.ops)
        OPS->destroy(BCTX);
    free(m->ranks);
    free(m->bufs);
    free(m->h_logits);
    free(m->h_router);
    free(m->h_ids);
    free(m->h_w);
    free(m->h_rows);
    free(m->h_roww);
    fmt_model_close(m->fm);
    fmt_shard_close(m->single);
    free(m->path);
    free(m);
}

void rt_model_reset(struct rt_model *m)
{
    m->n_past = 0;
}

const struct rt_config *rt_model_config(const struct rt_model *m)
{
    return &m->ranks[0].cfg;
}

int rt_model_n_ctx(const struct rt_model *m)
{
    return m->n_ctx;
}

int rt_model_n_past(const struct rt_model *m)
{
    return m->n_past;
}

int rt_model_world_size(const struct rt_model *m)
{
    return m->world;
}

enum rt_device rt_model_device(const struct rt_model *m)
{
    return m->device;
}

const struct fmt_shard *rt_model_shard(const struct rt_model *m, int rank)
{
    return rank >= 0 && rank < m->world ? m->ranks[rank].shard : NULL;
}

// --- forward ----------------------------------------------------------------------------------

static enum rt_err linear(struct rt_model *m, int r, const struct rt_linear *L, const void *x,
                          int M, void *y)
{
    if (L->qweight)
        return OPS->linear_w4(BCTX, r, x, L->qweight, L->qzeros, L->scales, L->bias, M, L->K,
                              L->N, L->G, y);
    return OPS->linear_f16(BCTX, r, x, L->weight_f16, L->bias, M, L->K, L->N, y);
}

enum which_buf { BUF_H, BUF_O };

/* Sum the first n elements of every rank's h (f32) or o (act) buffer; the sum lands in all. */
static enum rt_err all_reduce_buf(struct rt_model *m, enum which_buf which, size_t n)
{
    for (int r = 0; r < m->world; r++)
        m->bufs[r] = which == BUF_H ? (void *)m->ranks[r].h : m->ranks[r].o;
    return OPS->all_reduce(BCTX, m->bufs, m->world, n, which == BUF_H ? RT_BUF_F32 : RT_BUF_ACT);
}

/* Attention block of layer l on rank r: x -> o (partial sum of o_proj). */
static enum rt_err attn_block(struct rt_model *m, int r, int l, int M, int p0)
{
    struct rt_rank *R = &m->ranks[r];
    const struct rt_config *c = &R->cfg;
    const struct rt_layer *ly = &R->layers[l];
    int hd = c->head_dim, nq = c->heads_per_rank, nkv = c->kv_heads_per_rank;
    size_t stride = (size_t)(nq + 2 * nkv) * (size_t)hd;
    void *q = R->qkv, *k = act_at(m, R->qkv, (size_t)nq * hd);
    void *v = act_at(m, R->qkv, (size_t)(nq + nkv) * hd);

    TRY(linear(m, r, &ly->qkv, R->x, M, R->qkv));
    if (OPS->rope_kv_store) { /* one op (CUDA: one kernel instead of two per layer) */
        TRY(OPS->rope_kv_store(BCTX, r, q, M, nq, nkv, hd, stride, p0, R->inv_freq,
                               R->k_cache[l], R->v_cache[l], m->n_ctx));
    } else {
        /* the k heads follow the q heads in each row: one call rotates both */
        TRY(OPS->rope(BCTX, r, q, M, nq + nkv, hd, stride, p0, R->inv_freq));
        TRY(OPS->kv_store(BCTX, r, R->k_cache[l], R->v_cache[l], k, v, stride, M, p0, nkv, hd,
                          m->n_ctx));
    }
    TRY(OPS->attention(BCTX, r, R->att, (size_t)nq * hd, q, stride, R->k_cache[l],
                       R->v_cache[l], M, p0, nq, nkv, hd, m->n_ctx, c->sliding_window));
    return linear(m, r, &ly->o, R->att, M, R->o);
}

static enum rt_err dense_mlp(struct rt_model *m, int r, int l, int M)
{
    struct rt_rank *R = &m->ranks[r];
    const struct rt_layer *ly = &R->layers[l];
    TRY(linear(m, r, &ly->gate_up, R->x, M, R->gu));
    TRY(OPS->silu_mul(BCTX, r, R->act, R->gu, M, R->cfg.intermediate_per_rank));
    return linear(m, r, &ly->down, R->act, M, R->o);
}

/* Mixtral sparse MoE of layer l over all ranks: route on the host with rank 0's router logits
 * (the router is replicated, so every rank would compute the same), then run each selected
 * expert on the tokens routed to it and add its weighted output (experts in id order, as
 * transformers' index_add_ loop). Leaves partial sums in every rank's o. */
static enum rt_err moe(struct rt_model *m, int l, int M)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    int E = c->n_experts, k = c->n_experts_per_tok, H = c->hidden_size;
    struct rt_rank *R0 = &m->ranks[0];

    TRY(OPS->router(BCTX, 0, R0->x, R0->layers[l].router, M, H, E, R0->router_logits));
    TRY(OPS->download(BCTX, 0, m->h_router, R0->router_logits, (size_t)M * E * sizeof(float)));
    ref_moe_route(m->h_router, M, E, k, m->h_ids, m->h_w);
    for (int r = 0; r < m->world; r++)
        TRY(OPS->zero(BCTX, r, m->ranks[r].o, (size_t)M * H * OPS->act_size));
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < M; t++)
            for (int j = 0; j < k; j++)
                if (m->h_ids[t * k + j] == e) {
                    m->h_rows[n] = t;
                    m->h_roww[n++] = m->h_w[t * k + j];
                }
        if (n == 0)
            continue;
        for (int r = 0; r < m->world; r++) {
            struct rt_rank *R = &m->ranks[r];
            const struct rt_layer *ly = &R->layers[l];
            TRY(OPS->gather_rows(BCTX, r, R->xe, R->x, m->h_rows, n, H));
            TRY(linear(m, r, &ly->expert_gate_up[e], R->xe, n, R->gu));
            TRY(OPS->silu_mul(BCTX, r, R->act, R->gu, n, R->cfg.intermediate_per_rank));
            TRY(linear(m, r, &ly->expert_down[e], R->act, n, R->ye));
            TRY(OPS->scatter_add_rows(BCTX, r, R->o, R->ye, m->h_rows, m->h_roww, n, H));
        }
    }
    return RT_ERR_NONE;
}

/* The columns of the full vocabulary that rank r's lm_head slice holds: [*col0, *col0 + result)
 * with *col0 = r * vocab_size_per_rank; its padding columns past vocab_size are not counted
 * (the result is <= 0 for a rank that holds padding only). */
static int64_t rank_vocab_cols(const struct rt_config *c, int r, int64_t *col0)
{
    const int64_t Vr = c->vocab_size_per_rank, V = c->vocab_size;
    *col0 = (int64_t)r * Vr;
    return V - *col0 < Vr ? V - *col0 : Vr;
}

/* Rank r's lm_head output (its logits [n][vocab_size_per_rank], fp32) through m->h_logits into
 * its columns of out[n][vocab_size] (rank_vocab_cols). Errors: the backend's download. */
static enum rt_err download_logits(struct rt_model *m, int r, int n, float *out)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    int Vr = c->vocab_size_per_rank, V = c->vocab_size;
    TRY(OPS->download(BCTX, r, m->h_logits, m->ranks[r].logits, (size_t)n * Vr * sizeof(float)));
    int64_t col0;
    const int64_t cols = rank_vocab_cols(c, r, &col0);
    for (int i = 0; cols > 0 && i < n; i++)
        memcpy(out + (size_t)i * V + col0, m->h_logits + (size_t)i * Vr,
               (size_t)cols * sizeof(float));
    return RT_ERR_NONE;
}

/* lm_head on rows [row0, row0 + n) of x on every rank, into each rank's logits [n][V_r]. */
static enum rt_err lm_head_rows(struct rt_model *m, int row0, int n)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    int H = c->hidden_size, Vr = c->vocab_size_per_rank;
    for (int r = 0; r < m->world; r++) {
        struct rt_rank *R = &m->ranks[r];
        TRY(OPS->lm_head(BCTX, r, act_at(m, R->x, (size_t)row0 * H), R->lm_head, n, H, Vr,
                         R->logits));
    }
    return RT_ERR_NONE;
}

/* lm_head on rows [row0, row0 + n) of x, assembled across ranks into out[n][vocab_size]. */
static enum rt_err logits_rows(struct rt_model *m, int row0, int n, float *out)
{
    TRY(lm_head_rows(m, row0, n));
    for (int r = 0; r < m->world; r++)
        TRY(download_logits(m, r, n, out));
    return RT_ERR_NONE;
}

/* embed .. final rmsnorm of one chunk of M tokens at positions p0..p0+M-1: every rank's x then
 * holds the normalised hidden states of its rows. */
static enum rt_err step_body(struct rt_model *m, const int32_t *tokens, int M, int p0)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    size_t MH = (size_t)M * (size_t)c->hidden_size;

    for (int r = 0; r < m->world; r++) {
        struct rt_rank *R = &m->ranks[r];
        TRY(OPS->embed(BCTX, r, R->h, R->embed, tokens, M, (int64_t)r * c->vocab_size_per_rank,
                       c->vocab_size_per_rank, c->hidden_size));
    }
    TRY(all_reduce_buf(m, BUF_H, MH));
    for (int l = 0; l < c->n_layers; l++) {
        for (int r = 0; r < m->world; r++) {
            struct rt_rank *R = &m->ranks[r];
            const float *w = R->layers[l].attn_norm;
            if (l == 0) /* h is the embedding: normalise it as it is */
                TRY(OPS->rmsnorm(BCTX, r, R->x, R->h, NULL, w, M, c->hidden_size,
                                 c->rms_norm_eps));
            else /* h += previous MLP output, then normalise */
                TRY(OPS->rmsnorm(BCTX, r, R->x, R->h, R->o, w, M, c->hidden_size,
                                 c->rms_norm_eps));
            TRY(attn_block(m, r, l, M, p0));
        }
        TRY(all_reduce_buf(m, BUF_O, MH));
        for (int r = 0; r < m->world; r++) {
            struct rt_rank *R = &m->ranks[r];
            TRY(OPS->rmsnorm(BCTX, r, R->x, R->h, R->o, R->layers[l].mlp_norm, M,
                             c->hidden_size, c->rms_norm_eps));
            if (!c->n_experts)
                TRY(dense_mlp(m, r, l, M));
        }
        if (c->n_experts)
            TRY(moe(m, l, M));
        TRY(all_reduce_buf(m, BUF_O, MH));
    }
    for (int r = 0; r < m->world; r++) {
        struct rt_rank *R = &m->ranks[r];
        TRY(OPS->rmsnorm(BCTX, r, R->x, R->h, R->o, R->final_norm, M, c->hidden_size,
                         c->rms_norm_eps));
    }
    return RT_ERR_NONE;
}

/* Whether decode steps go through the backend's graphs (one per rank): a backend that has
 * them, no MoE (routing is decided on the host), not switched off (QSHARD_GRAPH=0, for A/B
 * runs), fewer than 2 failed recordings. */
static bool use_graph(const struct rt_model *m)
{
    static int env = -1; /* QSHARD_GRAPH=0 turns graphs off */
    if (env < 0) {
        const char *e = getenv("QSHARD_GRAPH");
        env = !(e && strcmp(e, "0") == 0);
    }
    return env && OPS->graph_replay && OPS->graph_ready && !m->ranks[0].cfg.n_experts &&
           m->graph_failures < 2;
}

/* Whether every rank has a valid decode-step recording. */
static bool graphs_ready(const struct rt_model *m)
{
    for (int r = 0; r < m->world; r++)
        if (!OPS->graph_ready(BCTX, r)) return false;
    return true;
}

/* Record step_body + lm_head of one decode step as one graph per rank (all ranks at once, so
 * the all-reduces are recorded on each rank's side). Nothing runs. false when a recording
 * failed (every rank's capture is ended and discarded; the reason is logged at debug level). */
static bool record_graphs(struct rt_model *m, int32_t token, int p0)
{
    int begun = 0;
    enum rt_err e = RT_ERR_NONE, e2 = RT_ERR_NONE;
    for (; begun < m->world && !e; begun++)
        e = OPS->graph_begin(BCTX, begun);
    if (e) begun--; /* that rank's capture did not start */
    if (!e) e = step_body(m, &token, 1, p0);
    if (!e) e = lm_head_rows(m, 0, 1);
    for (int r = 0; r < begun; r++) {
        enum rt_err er = OPS->graph_end(BCTX, r, e == RT_ERR_NONE && e2 == RT_ERR_NONE);
        if (!e2) e2 = er;
    }
    if (e || e2 || !graphs_ready(m)) {
        qs_log_debug("decode graph: recording failed (%s); this step runs op by op",
                     rt_err_str(e ? e : e2 ? e2 : RT_ERR_DEVICE));
        return false;
    }
    return true;
}

/* One decode step (M = 1) through the backend's graphs of step_body + lm_head, one per rank:
 * replay the recordings, or record them first (when any rank's is missing or stale, all are
 * recorded again, so no rank's graph waits in an all-reduce for a rank that runs none).
 * *done = false when no graphs could be made (the caller runs the step op by op; a failed
 * recording ran nothing). logits: [vocab_size], assembled across ranks. */
static enum rt_err step_graph(struct rt_model *m, int32_t token, int p0, float *logits,
                              bool *done)
{
    *done = false;
    if (!graphs_ready(m) && !record_graphs(m, token, p0)) {
        m->graph_failures++;
        return RT_ERR_NONE;
    }
    for (int r = 0; r < m->world; r++) {
        bool ran = false;
        TRY(OPS->graph_replay(BCTX, r, token, p0, &ran));
        if (!ran) { /* ready was checked for every rank just before: cannot happen */
            qs_log_error(__func__, "rank %d's decode graph went stale during the step", r);
            return RT_ERR_DEVICE;
        }
    }
    *done = true;
    if (!logits) /* the caller picks the next token on the device */
        return RT_ERR_NONE;
    for (int r = 0; r < m->world; r++)
        TRY(download_logits(m, r, 1, logits));
    return RT_ERR_NONE;
}

/* The next token, chosen on rank 0's device from the last row's logits [V]: rank 0's own
 * lm_head output at world 1; at world > 1 every rank's [V_r] slice is first copied into its
 * columns of rank 0's logits_all (rank_vocab_cols). */
static enum rt_err pick_id(struct rt_model *m, const struct rt_pick *pick, int32_t *id)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    const float *logits = m->ranks[0].logits;
    if (m->world > 1) {
        float *all = m->ranks[0].logits_all;
        for (int r = 0; r < m->world; r++) {
            int64_t col0;
            const int64_t cols = rank_vocab_cols(c, r, &col0);
            if (cols > 0)
                TRY(OPS->copy_ranks(BCTX, 0, all + col0, r, m->ranks[r].logits,
                                    (size_t)cols * sizeof(float)));
        }
        logits = all;
    }
    const int limit = pick->p.vocab_limit; /* rt_sample.h step 0: ids [0, limit) only */
    TRY(OPS->sample(BCTX, 0, logits, limit > 0 && limit < c->vocab_size ? limit : c->vocab_size,
                    pick, id));
    if (*id < 0 || *id >= c->vocab_size) {
        qs_log_error(__func__, "no finite logit among the %d ids: the model computed NaN or "
                     "-inf everywhere", c->vocab_size);
        return RT_ERR_NUMERIC;
    }
    return RT_ERR_NONE;
}

/* One chunk of M <= max_batch tokens at positions p0..p0+M-1; with `pick` (the last chunk of
 * rt_model_forward_pick) the last row's next token goes to *id instead of logits. */
static enum rt_err step(struct rt_model *m, const int32_t *tokens, int M, int p0, float *logits,
                        bool all_logits, const struct rt_pick *pick, int32_t *id)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    if (M == 1 && (logits || pick) && use_graph(m)) {
        bool done = false;
        TRY(step_graph(m, tokens[0], p0, logits, &done));
        if (done)
            return pick ? pick_id(m, pick, id) : RT_ERR_NONE;
    }
    TRY(step_body(m, tokens, M, p0));
    if (pick) {
        TRY(lm_head_rows(m, M - 1, 1));
        return pick_id(m, pick, id);
    }
    if (!logits)
        return RT_ERR_NONE;
    if (!all_logits)
        return logits_rows(m, M - 1, 1, logits);
    for (int row = 0; row < M; row += m->logit_rows) {
        int n = M - row < m->logit_rows ? M - row : m->logit_rows;
        TRY(logits_rows(m, row, n, logits + (size_t)row * c->vocab_size));
    }
    return RT_ERR_NONE;
}

static enum rt_err forward(struct rt_model *m, const int32_t *tokens, int n_tokens,
                           int start_pos, float *logits, bool all_logits,
                           const struct rt_pick *pick, int32_t *id)
{
    const struct rt_config *c = &m->ranks[0].cfg;
    if (n_tokens < 1 || !tokens) {
        qs_log_error(__func__, "no tokens to run (n_tokens = %d)", n_tokens);
        return RT_ERR_ARG;
    }
    if (start_pos < 0 || start_pos > m->n_past) {
        qs_log_error(__func__, "start_pos %d: only positions [0, %d) are in the KV cache",
                     start_pos, m->n_past);
        return RT_ERR_ARG;
    }
    if ((int64_t)start_pos + n_tokens > m->n_ctx) {
        qs_log_error(__func__, "context overflow: positions %d..%lld do not fit the KV cache of "
                     "%d tokens (n_ctx; the model allows up to %d)", start_pos,
                     (long long)start_pos + n_tokens - 1, m->n_ctx, c->max_position_embeddings);
        return RT_ERR_CONTEXT;
    }
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size) {
            qs_log_error(__func__, "token %d (at index %d) is outside the vocabulary [0, %d)",
                         tokens[i], i, c->vocab_size);
            return RT_ERR_TOKEN;
        }
    m->n_past = start_pos;
    for (int done = 0; done < n_tokens;) {
        int M = n_tokens - done < m->max_batch ? n_tokens - done : m->max_batch;
        bool last = done + M == n_tokens;
        float *out = NULL;
        if (logits && all_logits)
            out = logits + (size_t)done * c->vocab_size;
        else if (logits && last)
            out = logits;
        TRY(step(m, tokens + done, M, start_pos + done, out, all_logits, last ? pick : NULL,
                 id));
        done += M;
        m->n_past = start_pos + done;
    }
    return RT_ERR_NONE;
}

enum rt_err rt_model_forward(struct rt_model *m, const int32_t *tokens, int n_tokens,
                             int start_pos, float *logits, bool all_logits)
{
    return forward(m, tokens, n_tokens, start_pos, logits, all_logits, NULL, NULL);
}

bool rt_model_can_pick(const struct rt_model *m)
{
    static int env = -1; /* QSHARD_DEVICE_SAMPLE=0: the host samples the downloaded row */
    if (env < 0) {
        const char *e = getenv("QSHARD_DEVICE_SAMPLE");
        env = !(e && strcmp(e, "0") == 0);
    }
    return env && OPS->sample && (m->world == 1 || (OPS->copy_ranks && m->ranks[0].logits_all));
}

enum rt_err rt_model_forward_pick(struct rt_model *m, const int32_t *tokens, int n_tokens,
                                  int start_pos, const struct rt_pick *pick, int32_t *id)
{
    if (!pick || !id) {
        qs_log_error(__func__, "pick and id must not be NULL");
        return RT_ERR_ARG;
    }
    /* checked before anything runs: a refusal by the kernel would come after the forward pass
     * had already written the KV cache */
    if (rt_sample_params_check(&pick->p) != RT_SAMPLE_ERR_NONE) /* reports the field */
        return RT_ERR_ARG;
    if ((pick->p.temperature > 0.0f && !(pick->u >= 0.0 && pick->u < 1.0)) ||
        (pick->p.repeat_penalty != 1.0f && !pick->seen)) {
        qs_log_error(__func__, "bad sampling request: draw u %g (must be in [0, 1) when "
                     "sampling), history %s with repetition penalty %g", pick->u,
                     pick->seen ? "given" : "NULL", (double)pick->p.repeat_penalty);
        return RT_ERR_ARG;
    }
    if (!rt_model_can_pick(m)) {
        qs_log_error(__func__, "the %s backend with %d rank%s cannot sample on the device",
                     OPS->name, m->world, m->world == 1 ? "" : "s");
        return RT_ERR_UNSUPPORTED;
    }
    return forward(m, tokens, n_tokens, start_pos, NULL, false, pick, id);
}

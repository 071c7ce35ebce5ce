/*
 * rt_cpu.c - the CPU backend of one rank (rt_backend.h): struct rt_backend_ops over host
 * memory, every op a direct call of its plain-C reference in kernels/ref_*.c (so the CPU runtime
 * is the oracle the CUDA backend is tested against). Weights are used in place in the mmapped
 * rank file: tensor_ptr returns the mapping's address, nothing is copied. Each rank has its own
 * thread pool; the collectives go through the rank's communicator (a sum in rank order).
 * Deferred split-K (acc) is exact here: activations are fp32, so a linear's sums added into a
 * zero accumulator are the bits it would have written to y.
 * Entry point: rt_cpu_backend_create (rt_backend.h). Test: ./build/test_model
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h" /* qs_log_error */
#include "ref.h"    /* ref_* ops, struct ref_pool */
#include "rt_backend.h"

#define CPU_DEFER_MAX_M 16 /* as the CUDA backend, so CI runs the deferred epilogues */

struct cpu_ctx {
    struct ref_pool *pool; /* owned */
    struct rt_comm *comm;  /* borrowed; NULL at world size 1 */
    float *tmp;            /* [tmp_n] fp32 scratch of the deferred linear */
    size_t tmp_n;
};

static enum rt_err from_ref(enum ref_err e)
{
    switch (e) {
    case REF_ERR_NONE:
        return RT_ERR_NONE;
    case REF_ERR_NOMEM:
        return RT_ERR_NOMEM;
    case REF_ERR_THREAD:
        return RT_ERR_THREAD;
    default:
        return RT_ERR_SHAPE;
    }
}

static void cpu_destroy(void *vctx)
{
    struct cpu_ctx *c = vctx;
    if (!c)
        return;
    ref_pool_free(c->pool);
    free(c->tmp);
    free(c);
}

static enum rt_err cpu_load_weights(void *ctx, const struct fmt_shard *s)
{
    (void)ctx, (void)s;
    return RT_ERR_NONE; /* the mapping is the weight memory */
}

static const void *cpu_tensor_ptr(void *ctx, const struct fmt_tensor *t)
{
    (void)ctx;
    return t->data;
}

static enum rt_err cpu_alloc(void *ctx, size_t bytes, void **out)
{
    (void)ctx;
    /* 64-byte aligned, rounded up so aligned_alloc's size rule holds */
    size_t sz = (bytes + 63) / 64 * 64;
    *out = sz ? aligned_alloc(64, sz) : NULL;
    if (sz && !*out) {
        qs_log_error(__func__, "cannot allocate %zu bytes of host memory", bytes);
        return RT_ERR_NOMEM;
    }
    if (*out)
        memset(*out, 0, sz);
    return RT_ERR_NONE;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static enum rt_err cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    if (bytes)
        memmove(dst, src, bytes);
    return RT_ERR_NONE;
}

static enum rt_err cpu_zero(void *ctx, void *dst, size_t bytes)
{
    (void)ctx;
    if (bytes)
        memset(dst, 0, bytes);
    return RT_ERR_NONE;
}

static enum rt_err cpu_embed(void *ctx, float *out, const uint16_t *table,
                             const int32_t *tokens, int M, int64_t row_begin, int V_r, int H,
                             float scale)
{
    (void)ctx;
    ref_embed(out, table, tokens, M, row_begin, V_r, H, scale);
    return RT_ERR_NONE;
}

static enum rt_err cpu_softcap(void *ctx, float *x, size_t n, float cap)
{
    (void)ctx;
    ref_softcap(x, n, cap);
    return RT_ERR_NONE;
}

static enum rt_err unsupported(const char *what, int kind)
{
    qs_log_error("rt_cpu", "the CPU backend has no %s of kind %d", what, kind);
    return RT_ERR_UNSUPPORTED;
}

/* residual += x_acc; x_acc = 0 (the deferred sums of the linear before a norm) */
static void take_sums(float *residual, float *x_acc, size_t n)
{
    for (size_t i = 0; i < n; i++)
        residual[i] += x_acc[i];
    memset(x_acc, 0, n * sizeof(float));
}

static enum rt_err cpu_norm(void *ctx, enum rt_norm kind, void *out, float *residual,
                            const void *x, float *x_acc, const float *w, const float *b, int M,
                            int H, float eps)
{
    (void)ctx;
    if (kind != RT_NORM_RMS && kind != RT_NORM_LAYER)
        return unsupported("norm", (int)kind);
    if (x_acc && residual) {
        take_sums(residual, x_acc, (size_t)M * (size_t)H);
        x = NULL;
    }
    if (!out) { /* the residual add alone */
        if (!residual)
            return unsupported("norm without output or residual", (int)kind);
        if (x)
            ref_residual_add(residual, x, (size_t)M * (size_t)H);
        return RT_ERR_NONE;
    }
    if (kind == RT_NORM_LAYER)
        ref_layernorm(out, residual, x, w, b, M, H, eps);
    else
        ref_rmsnorm(out, residual, x, w, M, H, eps);
    return RT_ERR_NONE;
}

static enum rt_err cpu_linear_w4(void *vctx, const void *x, const uint8_t *qweight,
                                 const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                                 int M, int K, int N, int G, void *y, float *acc)
{
    struct cpu_ctx *c = vctx;
    if (!acc)
        return from_ref(ref_w4a16_linear(x, qweight, qzeros, scales, bias, M, K, N, G, y,
                                         c->pool));
    const size_t n = (size_t)M * (size_t)N;
    if (c->tmp_n < n) {
        float *p = realloc(c->tmp, n * sizeof(float));
        if (!p) {
            qs_log_error(__func__, "out of memory for %zu fp32 sums", n);
            return RT_ERR_NOMEM;
        }
        c->tmp = p;
        c->tmp_n = n;
    }
    enum rt_err e = from_ref(ref_w4a16_linear(x, qweight, qzeros, scales, bias, M, K, N, G,
                                              c->tmp, c->pool));
    for (size_t i = 0; !e && i < n; i++)
        acc[i] += c->tmp[i];
    return e;
}

static bool cpu_linear_acc_ok(void *ctx, int K, int N, int G)
{
    (void)ctx, (void)K, (void)N, (void)G;
    return true;
}

static enum rt_err cpu_linear_f16(void *vctx, const void *x, const uint16_t *W,
                                  const float *bias, int M, int K, int N, void *y)
{
    struct cpu_ctx *c = vctx;
    ref_linear_f16(x, W, bias, M, K, N, y, c->pool);
    return RT_ERR_NONE;
}

static enum rt_err cpu_lm_head(void *vctx, const void *x, const uint16_t *W, int M, int K, int N,
                               float *logits)
{
    struct cpu_ctx *c = vctx;
    ref_linear_f16(x, W, NULL, M, K, N, logits, c->pool);
    return RT_ERR_NONE;
}

static enum rt_err cpu_router(void *ctx, const void *x, const float *W, int M, int K, int N,
                              float *y)
{
    (void)ctx;
    ref_linear_f32(x, W, NULL, M, K, N, y);
    return RT_ERR_NONE;
}

static enum rt_err cpu_rope_kv_store(void *ctx, void *vx, float *x_acc, int M, int n_q, int n_kv,
                                     int hd, size_t row_stride, const int32_t *pos,
                                     const float *inv_freq, void *k_pool, void *v_pool,
                                     const int32_t *slots, int block_size)
{
    (void)ctx;
    float *x = vx;
    if (x_acc) { /* the qkv sums become the rows, and the accumulator is zero again */
        memcpy(x, x_acc, (size_t)M * row_stride * sizeof(float));
        memset(x_acc, 0, (size_t)M * row_stride * sizeof(float));
    }
    /* the k heads follow the q heads in each row: one call rotates both */
    ref_rope(x, M, n_q + n_kv, hd, row_stride, pos, inv_freq);
    ref_kv_store_paged(k_pool, v_pool, x + (size_t)n_q * hd, x + (size_t)(n_q + n_kv) * hd,
                       row_stride, M, slots, n_kv, hd, block_size);
    return RT_ERR_NONE;
}

static enum rt_err cpu_head_norm(void *ctx, void *x, float *x_acc, int M, int n_q, int n_kv,
                                 int hd, size_t row_stride, const float *wq, const float *wk,
                                 float eps)
{
    (void)ctx;
    ref_head_rmsnorm(x_acc ? x_acc : (float *)x, M, n_q, n_kv, hd, row_stride, wq, wk, eps);
    return RT_ERR_NONE;
}

static enum rt_err cpu_attention(void *vctx, void *out, size_t out_stride, const void *q,
                                 size_t q_stride, const void *k_pool, const void *v_pool, int M,
                                 const struct rt_attn_rows *a, int n_heads, int n_kv_heads,
                                 int hd, int sliding_window)
{
    struct cpu_ctx *c = vctx;
    const struct ref_att_score sc = {a->scale, a->softcap, a->alibi};
    return from_ref(ref_attention_paged(out, out_stride, q, q_stride, k_pool, v_pool, M, a->pos,
                                        a->tables, a->table_stride, a->row_table, n_heads,
                                        n_kv_heads, hd, a->block_size, sliding_window, &sc,
                                        c->pool));
}

static enum rt_err cpu_kv_copy_block(void *ctx, void *k_pool, void *v_pool, int src, int dst,
                                     size_t block_elems)
{
    (void)ctx;
    float *k = k_pool, *v = v_pool;
    memcpy(k + (size_t)dst * block_elems, k + (size_t)src * block_elems, block_elems * sizeof(float));
    memcpy(v + (size_t)dst * block_elems, v + (size_t)src * block_elems, block_elems * sizeof(float));
    return RT_ERR_NONE;
}

static enum rt_err cpu_act_mul(void *ctx, enum rt_act kind, void *out, const void *gate_up,
                               float *gate_up_acc, const float *act_scale, int M, int I)
{
    (void)ctx;
    if (kind != RT_ACT_SILU && kind != RT_ACT_GELU && kind != RT_ACT_GELU_TANH)
        return unsupported("activation", (int)kind);
    const float *in = gate_up_acc ? gate_up_acc : gate_up;
    const size_t n_in = (size_t)M * (size_t)I * (rt_act_gated(kind) ? 2 : 1);
    if (kind == RT_ACT_GELU)
        ref_gelu(out, in, (size_t)M * (size_t)I);
    else if (kind == RT_ACT_GELU_TANH)
        ref_gelu_tanh_mul(out, in, M, I);
    else
        ref_silu_mul(out, in, M, I);
    if (gate_up_acc)
        memset(gate_up_acc, 0, n_in * sizeof(float));
    if (act_scale)
        ref_div_cols(out, act_scale, M, I);
    return RT_ERR_NONE;
}

static enum rt_err cpu_gather_rows(void *ctx, void *vdst, const void *vsrc, const int32_t *rows,
                                   int n, int width)
{
    (void)ctx;
    float *dst = vdst;
    const float *src = vsrc;
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * (size_t)width, src + (size_t)rows[i] * (size_t)width,
               (size_t)width * sizeof(float));
    return RT_ERR_NONE;
}

static enum rt_err cpu_gather_cols(void *ctx, void *dst, const void *src, const int32_t *perm,
                                   int M, int K)
{
    (void)ctx;
    ref_gather_cols(dst, src, perm, M, K);
    return RT_ERR_NONE;
}

static enum rt_err cpu_scatter_add_rows(void *ctx, void *vy, const void *vsrc,
                                        const int32_t *rows, const float *weights, int n,
                                        int width)
{
    (void)ctx;
    float *y = vy;
    const float *src = vsrc;
    for (int i = 0; i < n; i++) {
        float *yr = y + (size_t)rows[i] * (size_t)width;
        const float *sr = src + (size_t)i * (size_t)width;
        for (int j = 0; j < width; j++)
            yr[j] += weights[i] * sr[j];
    }
    return RT_ERR_NONE;
}

/* Both buffer types are fp32 on the CPU: the communicator sums them in rank order. */
static enum rt_err cpu_all_reduce(void *vctx, void *buf, size_t n, enum rt_buf_type type)
{
    struct cpu_ctx *c = vctx;
    (void)type;
    if (!c->comm || c->comm->world <= 1)
        return RT_ERR_NONE;
    return c->comm->ops->all_reduce(c->comm, buf, n, RT_DTYPE_F32, NULL);
}

static enum rt_err cpu_gather(void *vctx, const void *send, size_t bytes, void *recv)
{
    struct cpu_ctx *c = vctx;
    if (!c->comm || c->comm->world <= 1) {
        memmove(recv, send, bytes);
        return RT_ERR_NONE;
    }
    return c->comm->ops->gather(c->comm, send, bytes, recv, NULL);
}

static const struct rt_backend_ops cpu_ops = {
    .name = "cpu",
    .act_size = sizeof(float),
    .kv_size = sizeof(float),
    .default_batch = 512,
    .defer_max_m = CPU_DEFER_MAX_M,
    .alibi = true,
    .destroy = cpu_destroy,
    .load_weights = cpu_load_weights,
    .tensor_ptr = cpu_tensor_ptr,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .embed = cpu_embed,
    .softcap = cpu_softcap,
    .norm = cpu_norm,
    .linear_w4 = cpu_linear_w4,
    .linear_acc_ok = cpu_linear_acc_ok,
    .linear_f16 = cpu_linear_f16,
    .lm_head = cpu_lm_head,
    .router = cpu_router,
    .rope_kv_store = cpu_rope_kv_store,
    .head_norm = cpu_head_norm,
    .attention = cpu_attention,
    .kv_copy_block = cpu_kv_copy_block,
    .act_mul = cpu_act_mul,
    .gather_rows = cpu_gather_rows,
    .gather_cols = cpu_gather_cols,
    .scatter_add_rows = cpu_scatter_add_rows,
    .all_reduce = cpu_all_reduce,
    .gather = cpu_gather,
};

enum rt_err rt_cpu_backend_create(const struct rt_opts *opts, struct rt_comm *comm,
                                  struct rt_backend *out)
{
    out->ops = NULL;
    out->ctx = NULL;
    struct cpu_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    enum ref_err e = ref_pool_create(opts ? opts->n_threads : 0, &c->pool);
    if (e) {
        if (e == REF_ERR_NOMEM)
            qs_log_error(__func__, "out of memory for the thread pool");
        free(c);
        return from_ref(e);
    }
    c->comm = comm;
    out->ops = &cpu_ops;
    out->ctx = c;
    return RT_ERR_NONE;
}

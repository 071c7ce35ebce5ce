/*
 * rt_cpu.c - the CPU backend of the runtime: struct rt_backend_ops over host memory, every op
 * a direct call of its plain-C reference in kernels/ref_*.c (so the CPU runtime is the oracle
 * the CUDA backend is tested against). Weights are used in place in the mmapped rank files:
 * tensor_ptr returns the mapping's address, nothing is copied. All ranks share one thread pool;
 * all_reduce is a sum in rank order.
 * Entry point: rt_cpu_backend_create (rt.h). Test: ./build/test_model
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h" /* qs_log_error */
#include "ref.h"    /* ref_* ops, struct ref_pool */
#include "rt.h"

struct cpu_ctx {
    struct ref_pool *pool; /* owned */
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
    free(c);
}

static enum rt_err cpu_load_weights(void *ctx, int rank, const struct fmt_shard *s)
{
    (void)ctx, (void)rank, (void)s;
    return RT_ERR_NONE; /* the mapping is the weight memory */
}

static const void *cpu_tensor_ptr(void *ctx, int rank, const struct fmt_tensor *t)
{
    (void)ctx, (void)rank;
    return t->data;
}

static enum rt_err cpu_alloc(void *ctx, int rank, size_t bytes, void **out)
{
    (void)ctx;
    /* 64-byte aligned, rounded up so aligned_alloc's size rule holds */
    size_t sz = (bytes + 63) / 64 * 64;
    *out = sz ? aligned_alloc(64, sz) : NULL;
    if (sz && !*out) {
        qs_log_error(__func__, "rank %d: cannot allocate %zu bytes of host memory", rank, bytes);
        return RT_ERR_NOMEM;
    }
    if (*out)
        memset(*out, 0, sz);
    return RT_ERR_NONE;
}

static void cpu_free(void *ctx, int rank, void *p)
{
    (void)ctx, (void)rank;
    free(p);
}

static enum rt_err cpu_copy(void *ctx, int rank, void *dst, const void *src, size_t bytes)
{
    (void)ctx, (void)rank;
    if (bytes)
        memmove(dst, src, bytes);
    return RT_ERR_NONE;
}

static enum rt_err cpu_zero(void *ctx, int rank, void *dst, size_t bytes)
{
    (void)ctx, (void)rank;
    if (bytes)
        memset(dst, 0, bytes);
    return RT_ERR_NONE;
}

static enum rt_err cpu_embed(void *ctx, int rank, float *out, const uint16_t *table,
                             const int32_t *tokens, int M, int64_t row_begin, int V_r, int H)
{
    (void)ctx, (void)rank;
    ref_embed(out, table, tokens, M, row_begin, V_r, H);
    return RT_ERR_NONE;
}

static enum rt_err cpu_rmsnorm(void *ctx, int rank, void *out, float *residual, const void *x,
                               const float *w, int M, int H, float eps)
{
    (void)ctx, (void)rank;
    ref_rmsnorm(out, residual, x, w, M, H, eps);
    return RT_ERR_NONE;
}

static enum rt_err cpu_linear_w4(void *vctx, int rank, const void *x, const uint8_t *qweight,
                                 const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                                 int M, int K, int N, int G, void *y)
{
    struct cpu_ctx *c = vctx;
    (void)rank;
    return from_ref(ref_w4a16_linear(x, qweight, qzeros, scales, bias, M, K, N, G, y, c->pool));
}

static enum rt_err cpu_linear_f16(void *vctx, int rank, const void *x, const uint16_t *W,
                                  const float *bias, int M, int K, int N, void *y)
{
    struct cpu_ctx *c = vctx;
    (void)rank;
    ref_linear_f16(x, W, bias, M, K, N, y, c->pool);
    return RT_ERR_NONE;
}

static enum rt_err cpu_lm_head(void *vctx, int rank, const void *x, const uint16_t *W, int M,
                               int K, int N, float *logits)
{
    struct cpu_ctx *c = vctx;
    (void)rank;
    ref_linear_f16(x, W, NULL, M, K, N, logits, c->pool);
    return RT_ERR_NONE;
}

static enum rt_err cpu_router(void *ctx, int rank, const void *x, const float *W, int M, int K,
                              int N, float *y)
{
    (void)ctx, (void)rank;
    ref_linear_f32(x, W, NULL, M, K, N, y);
    return RT_ERR_NONE;
}

static enum rt_err cpu_rope(void *ctx, int rank, void *vx, int M, int n_heads, int hd,
                            size_t row_stride, int start_pos, const float *inv_freq)
{
    (void)ctx, (void)rank;
    float *x = vx;
    int32_t pos[64];
    for (int m0 = 0; m0 < M; m0 += 64) { /* positions in blocks: no allocation */
        int n = M - m0 < 64 ? M - m0 : 64;
        for (int i = 0; i < n; i++)
            pos[i] = start_pos + m0 + i;
        ref_rope(x + (size_t)m0 * row_stride, n, n_heads, hd, row_stride, pos, inv_freq);
    }
    return RT_ERR_NONE;
}

static enum rt_err cpu_kv_store(void *ctx, int rank, void *vk_cache, void *vv_cache,
                                const void *vk, const void *vv, size_t row_stride, int M,
                                int start_pos, int n_kv_heads, int hd, int T_cap)
{
    (void)ctx, (void)rank;
    float *k_cache = vk_cache, *v_cache = vv_cache;
    const float *k = vk, *v = vv;
    for (int m = 0; m < M; m++)
        for (int h = 0; h < n_kv_heads; h++) {
            size_t dst = ((size_t)h * (size_t)T_cap + (size_t)(start_pos + m)) * (size_t)hd;
            size_t src = (size_t)m * row_stride + (size_t)h * (size_t)hd;
            memcpy(k_cache + dst, k + src, (size_t)hd * sizeof(float));
            memcpy(v_cache + dst, v + src, (size_t)hd * sizeof(float));
        }
    return RT_ERR_NONE;
}

static enum rt_err cpu_attention(void *vctx, int rank, void *out, size_t out_stride,
                                 const void *q, size_t q_stride, const void *k_cache,
                                 const void *v_cache, int M, int start_pos, int n_heads,
                                 int n_kv_heads, int hd, int T_cap, int sliding_window)
{
    struct cpu_ctx *c = vctx;
    (void)rank;
    return from_ref(ref_attention(out, out_stride, q, q_stride, k_cache, v_cache, M, start_pos,
                                  n_heads, n_kv_heads, hd, T_cap, sliding_window, c->pool));
}

static enum rt_err cpu_silu_mul(void *ctx, int rank, void *out, const void *gate_up, int M,
                                int I)
{
    (void)ctx, (void)rank;
    ref_silu_mul(out, gate_up, M, I);
    return RT_ERR_NONE;
}

static enum rt_err cpu_gather_rows(void *ctx, int rank, void *vdst, const void *vsrc,
                                   const int32_t *rows, int n, int width)
{
    (void)ctx, (void)rank;
    float *dst = vdst;
    const float *src = vsrc;
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * (size_t)width, src + (size_t)rows[i] * (size_t)width,
               (size_t)width * sizeof(float));
    return RT_ERR_NONE;
}

static enum rt_err cpu_scatter_add_rows(void *ctx, int rank, void *vy, const void *vsrc,
                                        const int32_t *rows, const float *weights, int n,
                                        int width)
{
    (void)ctx, (void)rank;
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

/* Both buffer types are fp32 on the CPU. Summed in rank order, so the result is deterministic. */
static enum rt_err cpu_all_reduce(void *ctx, void *const *bufs, int world_size, size_t n,
                                  enum rt_buf_type type)
{
    (void)ctx, (void)type;
    if (world_size <= 1)
        return RT_ERR_NONE;
    float *sum = bufs[0];
    for (int r = 1; r < world_size; r++) {
        const float *b = bufs[r];
        for (size_t i = 0; i < n; i++)
            sum[i] += b[i];
    }
    for (int r = 1; r < world_size; r++)
        memcpy(bufs[r], sum, n * sizeof(float));
    return RT_ERR_NONE;
}

static const struct rt_backend_ops cpu_ops = {
    .name = "cpu",
    .act_size = sizeof(float),
    .kv_size = sizeof(float),
    .destroy = cpu_destroy,
    .load_weights = cpu_load_weights,
    .tensor_ptr = cpu_tensor_ptr,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .linear_w4 = cpu_linear_w4,
    .linear_f16 = cpu_linear_f16,
    .lm_head = cpu_lm_head,
    .router = cpu_router,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .all_reduce = cpu_all_reduce,
};

enum rt_err rt_cpu_backend_create(const struct rt_opts *opts, int world_size,
                                  struct rt_backend *out)
{
    (void)world_size;
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
    out->ops = &cpu_ops;
    out->ctx = c;
    return RT_ERR_NONE;
}

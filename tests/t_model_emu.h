/*
 * t_model_emu.h - an fp16-activation backend emulated on the CPU (part of t_model.h, which
 * includes it): every op of rt_backend_ops on fp16 activations with fp32 math, as the CUDA
 * backend stores them, so the CPU tests measure what fp16 activations cost.
 */
#ifndef QS_T_MODEL_EMU_H
#define QS_T_MODEL_EMU_H

// --- an fp16-activation backend emulated on the CPU ---------------------------------------------

/*
 * The CUDA backend keeps activations and the KV cache in fp16 (act_size = kv_size = 2) and only
 * the residual stream, logits and deferred split-K sums in fp32. This backend does the same on
 * the CPU (each op: fp16 -> fp32, the ref_* function, round back to fp16; a deferred linear
 * adds its unrounded sums into the accumulator and its consumer reads them), so the model
 * code's handling of act_size (row and head offsets, buffer sizes, the norm modes, the
 * deferred epilogues, all_reduce types) is tested here, and the fp16 numerics can be compared
 * with the goldens before any GPU runs. One context per rank (rt_exec_open_with's factory).
 */
struct emu {
    int rank;
    struct rt_comm *comm; /* NULL at world size 1 */
};

T_FN float *h2f(const void *src, size_t n)
{
    const uint16_t *s = src;
    float *d = xcalloc(n ? n : 1, 4);
    for (size_t i = 0; i < n; i++)
        d[i] = ref_f16_to_f32(s[i]);
    return d;
}

T_FN void f2h(void *dst, const float *src, size_t n)
{
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = ref_f32_to_f16(src[i]);
}

T_FN void emu_destroy(void *ctx)
{
    free(ctx);
}

T_FN enum rt_err emu_load(void *ctx, const struct fmt_shard *s)
{
    (void)ctx, (void)s;
    return RT_ERR_NONE;
}

T_FN const void *emu_tensor(void *ctx, const struct fmt_tensor *t)
{
    (void)ctx;
    return t->data;
}

T_FN enum rt_err emu_alloc(void *ctx, size_t bytes, void **out)
{
    (void)ctx;
    *out = xcalloc(bytes ? bytes : 1, 1);
    return RT_ERR_NONE;
}

T_FN void emu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

T_FN enum rt_err emu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memmove(dst, src, bytes);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_zero(void *ctx, void *dst, size_t bytes)
{
    (void)ctx;
    memset(dst, 0, bytes);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_embed(void *ctx, float *out, const uint16_t *table, const int32_t *tokens,
                           int M, int64_t row_begin, int V_r, int H, float scale)
{
    (void)ctx;
    ref_embed(out, table, tokens, M, row_begin, V_r, H, scale);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_softcap(void *ctx, float *x, size_t n, float cap)
{
    (void)ctx;
    ref_softcap(x, n, cap);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_norm(void *ctx, enum rt_norm kind, void *out, float *residual,
                          const void *x, float *x_acc, const float *w, const float *b, int M,
                          int H, float eps)
{
    (void)ctx;
    if (kind != RT_NORM_RMS && kind != RT_NORM_LAYER)
        return RT_ERR_UNSUPPORTED;
    size_t n = (size_t)M * H;
    float *xf = x && !x_acc ? h2f(x, n) : NULL, *of = xcalloc(n, 4);
    if (x_acc) { /* the deferred sums, unrounded, then the accumulator is zero again */
        for (size_t i = 0; i < n; i++)
            residual[i] += x_acc[i];
        memset(x_acc, 0, n * 4);
    }
    if (!out) { /* the residual add alone */
        if (xf && residual)
            ref_residual_add(residual, xf, n);
        free(xf), free(of);
        return residual ? RT_ERR_NONE : RT_ERR_ARG;
    }
    if (kind == RT_NORM_LAYER)
        ref_layernorm(of, residual, xf, w, b, M, H, eps);
    else
        ref_rmsnorm(of, residual, xf, w, M, H, eps);
    f2h(out, of, n);
    free(xf), free(of);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_linear_w4(void *ctx, const void *x, const uint8_t *qweight,
                               const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                               int M, int K, int N, int G, void *y, float *acc)
{
    (void)ctx;
    float *xf = h2f(x, (size_t)M * K), *yf = xcalloc((size_t)M * N, 4);
    enum ref_err e = ref_w4a16_linear(xf, qweight, qzeros, scales, bias, M, K, N, G, yf, NULL);
    if (acc)
        for (size_t i = 0; i < (size_t)M * N; i++)
            acc[i] += yf[i];
    else
        f2h(y, yf, (size_t)M * N);
    free(xf), free(yf);
    return e ? RT_ERR_SHAPE : RT_ERR_NONE;
}

T_FN bool emu_acc_ok(void *ctx, int K, int N, int G)
{
    (void)ctx, (void)K, (void)N, (void)G;
    return true;
}

T_FN enum rt_err emu_linear_f16(void *ctx, const void *x, const uint16_t *W, const float *bias,
                                int M, int K, int N, void *y)
{
    (void)ctx;
    float *xf = h2f(x, (size_t)M * K), *yf = xcalloc((size_t)M * N, 4);
    ref_linear_f16(xf, W, bias, M, K, N, yf, NULL);
    f2h(y, yf, (size_t)M * N);
    free(xf), free(yf);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_lm_head(void *ctx, const void *x, const uint16_t *W, int M, int K, int N,
                             float *logits)
{
    (void)ctx;
    float *xf = h2f(x, (size_t)M * K);
    ref_linear_f16(xf, W, NULL, M, K, N, logits, NULL);
    free(xf);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_router(void *ctx, const void *x, const float *W, int M, int K, int N,
                            float *y)
{
    (void)ctx;
    float *xf = h2f(x, (size_t)M * K);
    ref_linear_f32(xf, W, NULL, M, K, N, y);
    free(xf);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_head_norm(void *ctx, void *x, float *x_acc, int M, int n_q, int n_kv, int hd,
                               size_t row_stride, const float *wq, const float *wk, float eps)
{
    (void)ctx;
    if (x_acc) { /* the sums stay f32, as the CUDA kernel leaves them */
        ref_head_rmsnorm(x_acc, M, n_q, n_kv, hd, row_stride, wq, wk, eps);
        return RT_ERR_NONE;
    }
    const size_t n = (size_t)M * row_stride;
    float *xf = h2f(x, n);
    ref_head_rmsnorm(xf, M, n_q, n_kv, hd, row_stride, wq, wk, eps);
    f2h(x, xf, n);
    free(xf);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_rope_kv_store(void *ctx, void *x, float *x_acc, int M, int n_q, int n_kv,
                                   int hd, size_t row_stride, const int32_t *pos,
                                   const float *inv_freq, void *k_pool, void *v_pool,
                                   const int32_t *slots, int block_size)
{
    (void)ctx;
    const size_t n = (size_t)M * row_stride;
    float *xf = xcalloc(n, 4);
    if (x_acc) {
        memcpy(xf, x_acc, n * 4);
        memset(x_acc, 0, n * 4);
    } else {
        float *t = h2f(x, n);
        memcpy(xf, t, n * 4);
        free(t);
    }
    ref_rope(xf, M, n_q + n_kv, hd, row_stride, pos, inv_freq);
    f2h(x, xf, n); /* the whole row rounded, as the CUDA kernel writes it */
    free(xf);
    const uint16_t *xh = x;
    for (int m = 0; m < M; m++)
        for (int h = 0; slots[m] >= 0 && h < n_kv; h++) {
            size_t dst = ref_kv_offset(slots[m], h, n_kv, block_size, hd);
            size_t src = (size_t)m * row_stride + (size_t)(n_q + h) * hd;
            memcpy((uint16_t *)k_pool + dst, xh + src, (size_t)hd * 2);
            memcpy((uint16_t *)v_pool + dst, xh + src + (size_t)n_kv * hd, (size_t)hd * 2);
        }
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_attention(void *ctx, void *out, size_t out_stride, const void *q,
                               size_t q_stride, const void *k_pool, const void *v_pool, int M,
                               const struct rt_attn_rows *a, int n_heads, int n_kv_heads, int hd,
                               int sliding_window)
{
    (void)ctx;
    size_t nq = (size_t)(M - 1) * q_stride + (size_t)n_heads * hd;
    size_t no = (size_t)(M - 1) * out_stride + (size_t)n_heads * hd;
    int max_blk = 0; /* the pool's blocks up to the highest any row reads, in fp32 */
    for (int m = 0; m < M; m++) {
        const int32_t *tab = a->tables + (size_t)a->row_table[m] * a->table_stride;
        for (int b = 0; b <= a->pos[m] / a->block_size; b++)
            max_blk = tab[b] > max_blk ? tab[b] : max_blk;
    }
    size_t nkv = (size_t)(max_blk + 1) * n_kv_heads * a->block_size * hd;
    float *qf = h2f(q, nq), *of = h2f(out, no), *kf = h2f(k_pool, nkv), *vf = h2f(v_pool, nkv);
    const struct ref_att_score sc = {a->scale, a->softcap, a->alibi};
    enum ref_err e = ref_attention_paged(of, out_stride, qf, q_stride, kf, vf, M, a->pos,
                                         a->tables, a->table_stride, a->row_table, n_heads,
                                         n_kv_heads, hd, a->block_size, sliding_window, &sc,
                                         NULL);
    f2h(out, of, no);
    free(qf), free(of), free(kf), free(vf);
    return e ? RT_ERR_SHAPE : RT_ERR_NONE;
}

T_FN enum rt_err emu_kv_copy_block(void *ctx, void *k_pool, void *v_pool, int src, int dst,
                                   size_t block_elems)
{
    (void)ctx;
    memcpy((uint16_t *)k_pool + (size_t)dst * block_elems,
           (uint16_t *)k_pool + (size_t)src * block_elems, block_elems * 2);
    memcpy((uint16_t *)v_pool + (size_t)dst * block_elems,
           (uint16_t *)v_pool + (size_t)src * block_elems, block_elems * 2);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_act_mul(void *ctx, enum rt_act kind, void *out, const void *gate_up,
                             float *gate_up_acc, const float *act_scale, int M, int I)
{
    (void)ctx;
    if (kind != RT_ACT_SILU && kind != RT_ACT_GELU && kind != RT_ACT_GELU_TANH)
        return RT_ERR_UNSUPPORTED;
    const size_t n = (size_t)M * (rt_act_gated(kind) ? 2 : 1) * I;
    float *gf = gate_up_acc ? xcalloc(n, 4) : h2f(gate_up, n), *of = xcalloc((size_t)M * I, 4);
    if (gate_up_acc) {
        memcpy(gf, gate_up_acc, n * 4);
        memset(gate_up_acc, 0, n * 4);
    }
    if (kind == RT_ACT_GELU)
        ref_gelu(of, gf, (size_t)M * I);
    else if (kind == RT_ACT_GELU_TANH)
        ref_gelu_tanh_mul(of, gf, M, I);
    else
        ref_silu_mul(of, gf, M, I);
    if (act_scale)
        ref_div_cols(of, act_scale, M, I);
    f2h(out, of, (size_t)M * I);
    free(gf), free(of);
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_gather_rows(void *ctx, void *dst, const void *src, const int32_t *rows,
                                 int n, int width)
{
    (void)ctx;
    for (int i = 0; i < n; i++)
        memcpy((uint16_t *)dst + (size_t)i * width, (const uint16_t *)src + (size_t)rows[i] * width,
               (size_t)width * 2);
    return RT_ERR_NONE;
}

/* act-order input (DESIGN 4.5): dst[m][j] = src[m][perm[j]] on fp16 rows (as k_gather_cols) */
T_FN enum rt_err emu_gather_cols(void *c, void *d, const void *s, const int32_t *p, int M, int K)
{
    (void)c;
    for (size_t i = 0; i < (size_t)M * K; i++)
        ((uint16_t *)d)[i] = ((const uint16_t *)s)[i / K * K + p[i % K]];
    return RT_ERR_NONE;
}

T_FN enum rt_err emu_scatter_add(void *ctx, void *y, const void *src, const int32_t *rows,
                                 const float *weights, int n, int width)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        uint16_t *yr = (uint16_t *)y + (size_t)rows[i] * width;
        const uint16_t *sr = (const uint16_t *)src + (size_t)i * width;
        for (int j = 0; j < width; j++)
            yr[j] = ref_f32_to_f16(ref_f16_to_f32(yr[j]) + weights[i] * ref_f16_to_f32(sr[j]));
    }
    return RT_ERR_NONE;
}

/* fp16 buffers are summed in fp32 in rank order and rounded once (the CUDA peer-to-peer
 * kernel's rule): through the communicator's fp32 sum. */
T_FN enum rt_err emu_all_reduce(void *ctx, void *buf, size_t n, enum rt_buf_type type)
{
    struct emu *c = ctx;
    if (!c->comm || c->comm->world <= 1)
        return RT_ERR_NONE;
    if (type == RT_BUF_F32)
        return c->comm->ops->all_reduce(c->comm, buf, n, RT_DTYPE_F32, NULL);
    float *f = h2f(buf, n);
    enum rt_err e = c->comm->ops->all_reduce(c->comm, f, n, RT_DTYPE_F32, NULL);
    f2h(buf, f, n);
    free(f);
    return e;
}

T_FN enum rt_err emu_gather(void *ctx, const void *send, size_t bytes, void *recv)
{
    struct emu *c = ctx;
    if (!c->comm || c->comm->world <= 1) {
        memmove(recv, send, bytes);
        return RT_ERR_NONE;
    }
    return c->comm->ops->gather(c->comm, send, bytes, recv, NULL);
}

static const struct rt_backend_ops emu_ops = {
    .name = "cpu-fp16-emulation",
    .act_size = 2,
    .kv_size = 2,
    .default_batch = 512,
    .defer_max_m = 16,
    .alibi = true,
    .destroy = emu_destroy,
    .load_weights = emu_load,
    .tensor_ptr = emu_tensor,
    .alloc = emu_alloc,
    .free = emu_free,
    .upload = emu_copy,
    .download = emu_copy,
    .zero = emu_zero,
    .embed = emu_embed,
    .softcap = emu_softcap,
    .norm = emu_norm,
    .linear_w4 = emu_linear_w4,
    .linear_acc_ok = emu_acc_ok,
    .linear_f16 = emu_linear_f16,
    .lm_head = emu_lm_head,
    .router = emu_router,
    .rope_kv_store = emu_rope_kv_store,
    .head_norm = emu_head_norm,
    .attention = emu_attention,
    .kv_copy_block = emu_kv_copy_block,
    .act_mul = emu_act_mul,
    .gather_rows = emu_gather_rows,
    .gather_cols = emu_gather_cols,
    .scatter_add_rows = emu_scatter_add,
    .all_reduce = emu_all_reduce,
    .gather = emu_gather,
};

/* rt_exec_open_with's factory: user is the ops table (emu_ops or a variant of it). */
T_FN enum rt_err emu_factory(void *user, int rank, int world, struct rt_comm *comm,
                             struct rt_backend *out)
{
    (void)world;
    struct emu *c = xcalloc(1, sizeof(*c));
    c->rank = rank;
    c->comm = comm;
    out->ops = user;
    out->ctx = c;
    return RT_ERR_NONE;
}

/* Open dir on the emulated backend (ops: emu_ops or a variant). */
T_FN enum rt_err emu_open(const char *dir, const struct rt_opts *o,
                          const struct rt_backend_ops *ops, struct rt_exec **e)
{
    return rt_exec_open_with(dir, o, emu_factory, (void *)ops, e);
}

/* fp16-activation logits of tok[0..T) (all rows) on the model in dir; NULL on failure. */
T_FN float *emu_logits(const char *dir, const int32_t *tok, int T, int V, int max_batch)
{
    struct rt_opts o = cpu_opts(T, max_batch, 1);
    struct rt_exec *e = NULL;
    enum rt_err err = emu_open(dir, &o, &emu_ops, &e);
    CHECK_MSG(err == RT_ERR_NONE, "fp16 emulation: open %s: %s (%s)", dir, rt_err_str(err),
              qs_log_last());
    if (err)
        return NULL;
    float *lg = exec_logits(e, tok, T, V);
    rt_exec_free(e);
    return lg;
}

#endif /* QS_T_MODEL_EMU_H */

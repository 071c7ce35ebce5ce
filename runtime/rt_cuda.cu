/*
 * rt_cuda.cu - the CUDA backend of one rank (rt_backend.h): struct rt_backend_ops on one GPU,
 * every op one of our kernels (kernels/kernels.h) or a cuBLAS GEMM, on the rank's stream.
 *
 *   - Activations and the KV cache are fp16 (act_size = kv_size = 2); the residual stream,
 *     logits, router logits and deferred split-K sums fp32 (rt_backend.h).
 *   - Weights: the rank's tensors are copied once into ONE device allocation (the rank file's
 *     data region, byte for byte, so a tensor's device address is base + its file offset minus
 *     the region start), by rt_cuda_upload_region (rt_cuda_load.cu: reader threads, pinned
 *     staging, docs/BENCHMARKS.md "Load"). -v prints bytes, seconds and GB/s of each phase.
 *   - cuBLAS (dequant + GEMM of large prompt chunks) is loaded and its handle created on a
 *     thread started with the backend, so it overlaps the weight upload; cublas_ready joins
 *     it before anything can use it.
 *   - W4A16 linears: k_w4a16_route_pick + k_w4a16_launch per call (kernels.h: split-K at
 *     M <= 64, wgmma up to K_W4A16_DQ_GEMM_MIN_M - 1 on sm_90a, dequant + cuBLAS above, v4 for
 *     the group sizes split-K cannot take). With the deferred epilogue the model asked for, the
 *     ACC route adds the sums into the model's accumulator and the consumer kernel
 *     (k_rmsnorm_acc, k_silu_mul_acc, k_rope_kv_store) reads and zeroes them.
 *   - Collectives: through the rank's communicator (runtime/rt_comm.c, rt_comm_cuda.cu) on
 *     this rank's stream.
 *   - Decode steps are recorded once into a CUDA graph (stream capture of every op of the step
 *     + lm_head; at world_size > 1 only when the all-reduces can be recorded: our peer-to-peer
 *     kernel, never NCCL) and replayed; the kernels read the token and position from buffers
 *     the model uploads before each step; a workspace that grows makes the recording stale and
 *     the model records again.
 *   - GPUs older than sm_80 are refused at creation with the GPU's name and compute capability;
 *     out-of-memory says what did not fit and how much was free.
 *
 * Entry points: rt_cuda_backend_create (rt_backend.h), rt_cuda_available (rt.h).
 * Test: `make test-gpu` (tests/gpu_test_e2e.py: CUDA vs CPU vs transformers goldens).
 */
#include <algorithm>        /* std::max */

#include <cublas_v2.h>    /* cublasGemmEx */
#include <cuda_runtime.h> /* cudaMalloc, streams, events */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"     /* struct fmt_shard, fmt_shard_tensor */
#include "kernels.h" /* k_* launchers */
#include "qs_log.h"  /* qs_log_error, qs_log_debug */
#include "qs_util.h" /* qs_now_s */
#include "rt_backend.h"
#include "rt_cuda_load.h" /* rt_cuda_upload_region */

#define RT_CUDA_MIN_CC 80                   /* mma.sync m16n8k16, cp.async, ldmatrix */
#define RT_CUDA_SMALL_SLOTS 8               /* pinned staging of small uploads (token ids, ...): */
#define RT_CUDA_SLOT_BYTES (128u << 10)     /* a ring of slots, each reused after its copy ran */
/* Deferred split-K up to 16 rows: decode and small batches. At 64 rows (a prompt chunk) the
 * fused consumers lost 1.7 % of pp64 against v9's own finish (13521 vs 13751 tok/s, synthetic
 * 7B, H200), at 1 row they gain 7 % of decode speed (docs/BENCHMARKS.md). */
#define RT_CUDA_DEFER_MAX_M 16

/* Report a failed CUDA call once (expression, file:line, device) and return RT_ERR_DEVICE. */
#define RT_CUDA_TRY(expr)                                                                   \
    do {                                                                                    \
        cudaError_t e_ = (expr);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            int d_ = -1;                                                                    \
            cudaGetDevice(&d_);                                                             \
            qs_log_error(__func__, "CUDA error %s (%s) at %s:%d on device %d",              \
                         cudaGetErrorString(e_), #expr, __FILE__, __LINE__, d_);            \
            return RT_ERR_DEVICE;                                                           \
        }                                                                                   \
    } while (0)

#define RT_CUBLAS_TRY(expr)                                                                 \
    do {                                                                                    \
        cublasStatus_t s_ = (expr);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            int d_ = -1;                                                                    \
            cudaGetDevice(&d_);                                                             \
            qs_log_error(__func__, "cuBLAS error %d (%s) at %s:%d on device %d", (int)s_,   \
                         #expr, __FILE__, __LINE__, d_);                                    \
            return RT_ERR_DEVICE;                                                           \
        }                                                                                   \
    } while (0)

/* A kernel launcher's status -> rt_err (the launcher already reported the shape). */
#define RT_K_TRY(expr)                                                                      \
    do {                                                                                    \
        int k_ = (expr);                                                                    \
        if (k_ != K_ERR_NONE) return k_ == K_ERR_SHAPE ? RT_ERR_SHAPE : RT_ERR_ARG;          \
    } while (0)

/* A device buffer that only grows (workspaces). */
struct grow_buf {
    void *p;
    size_t bytes;
};

/* The one rank of this backend. */
struct cuda_rank {
    int rank, device;
    struct rt_comm *comm;   /* borrowed; NULL at world size 1 */
    bool no_rope_kv;        /* rt_opts: rope and kv_store as two kernels */
    struct k_w4a16_caps caps; /* what the W4A16 router may use on this GPU (probed at creation;
                                 allow_wgmma off with rt_opts.no_wgmma) */
    cudaStream_t stream;
    cublasHandle_t cublas;  /* created by cublas_worker; use only after cublas_ready */
    pthread_t cublas_th;
    bool cublas_pending;    /* cublas_th runs or has not been joined */
    cublasStatus_t cublas_st;
    unsigned char *weights; /* owned: the rank file's data region */
    size_t weights_bytes;
    uint64_t region_off;    /* file offset of weights[0] */
    struct grow_buf ws;     /* k_w4a16 workspace (zeroed once, left zeroed by every call) */
    struct grow_buf att_ws; /* k_attention split-KV workspace (zeroed once, left ready) */
    size_t att_ws_need;     /* its size for the (n_heads, hd, T_cap) in att_ws_key */
    int att_ws_key[3];
    struct grow_buf scratch;/* dequantised fp16 weight for the dq + cuBLAS path */
    struct grow_buf rows;   /* MoE rows and weights */
    unsigned char *h_small; /* pinned [RT_CUDA_SMALL_SLOTS][RT_CUDA_SLOT_BYTES] */
    cudaEvent_t small_done[RT_CUDA_SMALL_SLOTS]; /* the last copy out of each slot has run */
    int small_next;         /* the slot the next small upload takes */
    unsigned buf_gen;       /* bumped whenever a grow_buf moves (a recorded graph is then stale) */
    /* decode-step graphs (graph_begin/end/replay), one per key */
    bool capturing;         /* ops are being recorded */
    cudaGraphExec_t gexec[RT_MAX_GRAPHS]; /* the recordings, or NULL */
    unsigned gexec_gen[RT_MAX_GRAPHS];    /* buf_gen when each was recorded */
    /* device sampling (rt_backend.h sample): the ids, then the history bitmaps sent along */
    unsigned char *d_pick;
    unsigned char *h_pick;  /* pinned host staging */
    size_t pick_bytes;
    struct k_sample_row *pick_rows; /* host [n_pick_rows]: the rows of k_sample_rows */
    int n_pick_rows;
};

/* cudaMalloc with an out-of-memory message naming what and how much was free. */
static enum rt_err dev_alloc(const char *what, int device, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0) return RT_ERR_NONE;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaSuccess) return RT_ERR_NONE;
    cudaGetLastError(); /* clear the sticky-free allocation error */
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    *out = NULL;
    if (e == cudaErrorMemoryAllocation) {
        qs_log_error(__func__, "GPU %d out of memory: %s needs %.3f GB, %.3f GB free of %.3f GB",
                     device, what, bytes / 1e9, fr / 1e9, tot / 1e9);
        return RT_ERR_NOMEM;
    }
    qs_log_error(__func__, "cudaMalloc of %zu bytes for %s on GPU %d: %s", bytes, what, device,
                 cudaGetErrorString(e));
    return RT_ERR_DEVICE;
}

static enum rt_err grow(struct cuda_rank *r, struct grow_buf *b, size_t bytes, const char *what,
                        bool zero)
{
    if (b->bytes >= bytes) return RT_ERR_NONE;
    if (r->capturing) { /* no allocation inside a recording: the model runs this step op by op */
        qs_log_debug("GPU %d: %s must grow to %zu bytes while a decode graph is recorded", r->device,
                     what, bytes);
        return RT_ERR_DEVICE;
    }
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream)); /* the old buffer may be in use */
    ++r->buf_gen;
    RT_CUDA_TRY(cudaFree(b->p));
    b->p = NULL;
    b->bytes = 0;
    const size_t want = bytes + bytes / 4; /* headroom: fewer regrowths */
    enum rt_err e = dev_alloc(what, r->device, want, &b->p);
    if (e) return e;
    /* on the rank's (non-blocking) stream: a legacy-stream memset would not be ordered
     * before the kernels that use the buffer */
    if (zero) RT_CUDA_TRY(cudaMemsetAsync(b->p, 0, want, r->stream));
    b->bytes = want;
    return RT_ERR_NONE;
}

/* Host data into device memory on the rank's stream. Small ones go through a ring of pinned
 * staging slots without synchronising (a slot is reused once its previous copy has run, which
 * in a decode loop is long done); large ones are copied and waited for (src is the caller's). */
static enum rt_err upload_staged(struct cuda_rank *r, void *dst, const void *src, size_t bytes)
{
    if (bytes > RT_CUDA_SLOT_BYTES) {
        RT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, r->stream));
        RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
        return RT_ERR_NONE;
    }
    const int s = r->small_next;
    r->small_next = (s + 1) % RT_CUDA_SMALL_SLOTS;
    unsigned char *stage = r->h_small + (size_t)s * RT_CUDA_SLOT_BYTES;
    RT_CUDA_TRY(cudaEventSynchronize(r->small_done[s]));
    memcpy(stage, src, bytes);
    RT_CUDA_TRY(cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, r->stream));
    RT_CUDA_TRY(cudaEventRecord(r->small_done[s], r->stream));
    return RT_ERR_NONE;
}

static void rank_free(struct cuda_rank *r)
{
    if (r->device < 0) return;
    cudaSetDevice(r->device);
    if (r->stream) cudaStreamSynchronize(r->stream);
    cudaFree(r->weights);
    struct grow_buf *bufs[] = {&r->ws, &r->att_ws, &r->scratch, &r->rows};
    for (struct grow_buf *b : bufs) {
        cudaFree(b->p);
        b->p = NULL;
        b->bytes = 0;
    }
    for (int k = 0; k < RT_MAX_GRAPHS; ++k)
        if (r->gexec[k]) cudaGraphExecDestroy(r->gexec[k]);
    cudaFree(r->d_pick);
    cudaFreeHost(r->h_pick);
    free(r->pick_rows);
    cudaFreeHost(r->h_small);
    for (int i = 0; i < RT_CUDA_SMALL_SLOTS; ++i)
        if (r->small_done[i]) cudaEventDestroy(r->small_done[i]);
    if (r->cublas_pending) pthread_join(r->cublas_th, NULL);
    if (r->cublas) cublasDestroy(r->cublas);
    if (r->stream) cudaStreamDestroy(r->stream);
    memset(r, 0, sizeof(*r));
    r->device = -1;
}

static void cuda_destroy(void *vctx)
{
    struct cuda_rank *r = static_cast<struct cuda_rank *>(vctx);
    if (!r) return;
    rank_free(r);
    free(r);
}

/* The rank, with its GPU current on this thread. */
static struct cuda_rank *R(void *ctx)
{
    struct cuda_rank *r = static_cast<struct cuda_rank *>(ctx);
    cudaSetDevice(r->device);
    return r;
}

/* cuBLAS's library load (dlopen, k_cublas_load.cu) and handle, off the main thread. */
static void *cublas_worker(void *arg)
{
    struct cuda_rank *r = static_cast<struct cuda_rank *>(arg);
    r->cublas_st = CUBLAS_STATUS_NOT_INITIALIZED;
    if (cudaSetDevice(r->device) != cudaSuccess) return NULL;
    r->cublas_st = cublasCreate(&r->cublas);
    if (r->cublas_st == CUBLAS_STATUS_SUCCESS) r->cublas_st = cublasSetStream(r->cublas, r->stream);
    return NULL;
}

/* Wait for cublas_worker (once); RT_ERR_DEVICE, reported, when it failed. */
static enum rt_err cublas_ready(struct cuda_rank *r)
{
    if (r->cublas_pending) {
        pthread_join(r->cublas_th, NULL);
        r->cublas_pending = false;
        if (r->cublas_st != CUBLAS_STATUS_SUCCESS)
            qs_log_error(__func__, "GPU %d: cannot create the cuBLAS handle (cuBLAS %d)",
                         r->device, (int)r->cublas_st);
    }
    return r->cublas_st == CUBLAS_STATUS_SUCCESS ? RT_ERR_NONE : RT_ERR_DEVICE;
}

// --- weights ---------------------------------------------------------------------------------

static enum rt_err cuda_load_weights(void *ctx, const struct fmt_shard *s)
{
    struct cuda_rank *r = R(ctx);
    const int rank = r->rank;
    const uint32_t n = fmt_shard_n_tensors(s);
    if (n == 0) return RT_ERR_NONE;
    /* the data region: from the lowest tensor offset to the highest end (tensors are laid out
     * in one mapping, so data pointers differ exactly as offsets do) */
    const struct fmt_tensor *lo = fmt_shard_tensor(s, 0);
    uint64_t end = 0;
    for (uint32_t i = 0; i < n; ++i) {
        const struct fmt_tensor *t = fmt_shard_tensor(s, i);
        if (t->offset < lo->offset) lo = t;
        if (t->offset + t->size > end) end = t->offset + t->size;
    }
    const size_t bytes = (size_t)(end - lo->offset);
    const unsigned char *src = static_cast<const unsigned char *>(lo->data);
    const double t0 = qs_now_s();
    char what[96];
    snprintf(what, sizeof what, "the weights of rank %d", rank);
    void *dst = NULL;
    enum rt_err e = dev_alloc(what, r->device, bytes, &dst);
    if (e) return e;
    r->weights = static_cast<unsigned char *>(dst);
    r->weights_bytes = bytes;
    r->region_off = lo->offset;
    qs_log_debug("rank %d on GPU %d: device allocation of %.3f GB in %.3f s", rank, r->device,
                 bytes / 1e9, qs_now_s() - t0);
    /* the mapping starts at file offset 0, so its header is lo's data minus lo's offset */
    e = rt_cuda_upload_region(rank, r->device, fmt_shard_path(s), src - lo->offset, src,
                              lo->offset, r->weights, bytes);
    if (!e) e = cublas_ready(r);
    return e;
}


static const void *cuda_tensor_ptr(void *ctx, const struct fmt_tensor *t)
{
    struct cuda_rank *r = static_cast<struct cuda_rank *>(ctx);
    if (!r->weights || t->offset < r->region_off ||
        t->offset + t->size > r->region_off + r->weights_bytes)
        return NULL;
    return r->weights + (t->offset - r->region_off);
}

// --- memory ------------------------------------------------------------------------------------

static enum rt_err cuda_alloc(void *ctx, size_t bytes, void **out)
{
    struct cuda_rank *r = R(ctx);
    enum rt_err e = dev_alloc("an activation or KV cache buffer", r->device, bytes, out);
    if (e) return e;
    if (bytes) RT_CUDA_TRY(cudaMemsetAsync(*out, 0, bytes, r->stream));
    return RT_ERR_NONE;
}

static void cuda_free(void *ctx, void *p)
{
    struct cuda_rank *r = R(ctx);
    if (!p) return;
    cudaStreamSynchronize(r->stream);
    cudaFree(p);
}

static enum rt_err cuda_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    return upload_staged(R(ctx), dst, src, bytes);
}

static enum rt_err cuda_download(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct cuda_rank *r = R(ctx);
    RT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_zero(void *ctx, void *dst, size_t bytes)
{
    struct cuda_rank *r = R(ctx);
    RT_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, r->stream));
    return RT_ERR_NONE;
}

// --- ops -----------------------------------------------------------------------------------------

static enum rt_err cuda_embed(void *ctx, float *out, const uint16_t *table, const int32_t *tokens,
                              int M, int64_t row_begin, int V_r, int H, float scale)
{
    struct cuda_rank *r = R(ctx);
    RT_K_TRY(k_embed(out, table, tokens, M, row_begin, V_r, H, scale, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_softcap(void *ctx, float *x, size_t n, float cap)
{
    struct cuda_rank *r = R(ctx);
    RT_K_TRY(k_softcap(x, n, cap, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_norm(void *ctx, enum rt_norm kind, void *out, float *residual,
                             const void *x, float *x_acc, const float *w, const float *b, int M,
                             int H, float eps)
{
    struct cuda_rank *r = R(ctx);
    if (!out) { /* the residual add alone */
        const bool acc = x_acc && residual;
        RT_K_TRY(k_residual_add(residual, acc ? nullptr : static_cast<const uint16_t *>(x),
                                acc ? x_acc : nullptr, (size_t)M * (size_t)H, r->stream));
        return RT_ERR_NONE;
    }
    if (kind == RT_NORM_LAYER) {
        const bool acc = x_acc && residual;
        RT_K_TRY(k_layernorm(static_cast<uint16_t *>(out), residual,
                             acc ? nullptr : static_cast<const uint16_t *>(x), acc ? x_acc : nullptr,
                             w, b, M, H, eps, r->stream));
        return RT_ERR_NONE;
    }
    if (kind != RT_NORM_RMS) {
        qs_log_error(__func__, "the CUDA backend has no norm of kind %d", (int)kind);
        return RT_ERR_UNSUPPORTED;
    }
    if (x_acc && residual) {
        RT_K_TRY(k_rmsnorm_acc(static_cast<uint16_t *>(out), residual, x_acc, w, M, H, eps,
                               r->stream));
        return RT_ERR_NONE;
    }
    RT_K_TRY(k_rmsnorm(static_cast<uint16_t *>(out), residual, static_cast<const uint16_t *>(x),
                       w, M, H, eps, r->stream));
    return RT_ERR_NONE;
}

/* Whether this linear can leave its sums for a fused consumer at up to the deferral's rows
 * (the router's answer for this GPU: split-K takes its group size). */
static bool cuda_linear_acc_ok(void *ctx, int K, int N, int G)
{
    const struct cuda_rank *r = static_cast<struct cuda_rank *>(ctx);
    return k_w4a16_acc_available(RT_CUDA_DEFER_MAX_M, N, K, G, &r->caps) != 0;
}

/* One W4A16 linear: the router's table (kernels/k_w4a16_route.c) picks the kernel for (M, N,
 * K, G) and the epilogue the model asked for (acc: the deferred sums), and says which buffers it
 * needs; the launch runs exactly that route. */
static enum rt_err cuda_linear_w4(void *ctx, const void *x, const uint8_t *qweight,
                                  const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                                  int M, int K, int N, int G, void *y, float *acc)
{
    struct cuda_rank *r = R(ctx);
    struct k_w4a16_route rt;
    if (cublas_ready(r)) return RT_ERR_DEVICE;
    RT_K_TRY(k_w4a16_route_pick(&rt, M, N, K, G, acc ? K_W4A16_EPI_ACC : K_W4A16_EPI_Y,
                                K_W4A16_KERNEL_AUTO, &r->caps));
    /* (the wgmma route sizes its workspace for its whole band, so prompt chunks of 65..128 rows
     * do not grow it, and make the decode graphs record again, one by one) */
    enum rt_err e = grow(r, &r->ws, rt.workspace_bytes, "the W4A16 workspace", true);
    if (e == RT_ERR_NONE)
        e = grow(r, &r->scratch, rt.scratch_bytes, "the dequantised weight of a prefill linear",
                 false);
    if (e) return e;
    const struct k_w4a16_weight w = {qweight, qzeros, scales, bias};
    const struct k_w4a16_bufs bufs = {r->ws.p, r->ws.bytes, r->scratch.p, r->scratch.bytes,
                                      r->cublas};
    RT_K_TRY(k_w4a16_launch(&rt, static_cast<const uint16_t *>(x), &w, static_cast<uint16_t *>(y),
                            acc, &bufs, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_linear_f16(void *ctx, const void *x, const uint16_t *W, const float *bias,
                                   int M, int K, int N, void *y)
{
    struct cuda_rank *r = R(ctx);
    const float alpha = 1.0f, beta = 0.0f;
    if (cublas_ready(r)) return RT_ERR_DEVICE;
    /* row-major y[M,N] = x[M,K] . W^T with W [N,K]: column-major y^T = op_T(W) . x^T */
    RT_CUBLAS_TRY(cublasGemmEx(r->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W,
                               CUDA_R_16F, K, x, CUDA_R_16F, K, &beta, y, CUDA_R_16F, N,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) RT_K_TRY(k_bias_add(static_cast<uint16_t *>(y), bias, M, N, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_lm_head(void *ctx, const void *x, const uint16_t *W, int M, int K, int N,
                                float *logits)
{
    struct cuda_rank *r = R(ctx);
    const float alpha = 1.0f, beta = 0.0f;
    if (cublas_ready(r)) return RT_ERR_DEVICE;
    RT_CUBLAS_TRY(cublasGemmEx(r->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W,
                               CUDA_R_16F, K, x, CUDA_R_16F, K, &beta, logits, CUDA_R_32F, N,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return RT_ERR_NONE;
}

static enum rt_err cuda_router(void *ctx, const void *x, const float *W, int M, int K, int N,
                               float *y)
{
    struct cuda_rank *r = R(ctx);
    RT_K_TRY(k_router(y, static_cast<const uint16_t *>(x), W, M, K, N, r->stream));
    return RT_ERR_NONE;
}

/* rope + the paged KV store of a fused qkv row: one kernel (k_rope_kv_store_paged, from the
 * deferred sums when given), or with no_rope_kv (A/B runs) k_rope / k_rope_acc then
 * k_kv_store_paged. pos, slots: device [M]. */
static enum rt_err cuda_rope_kv_store(void *ctx, void *x, float *x_acc, int M, int n_q, int n_kv,
                                      int hd, size_t row_stride, const int32_t *pos,
                                      const float *inv_freq, void *k_pool, void *v_pool,
                                      const int32_t *slots, int block_size)
{
    struct cuda_rank *r = R(ctx);
    uint16_t *xh = static_cast<uint16_t *>(x);
    uint16_t *kp = static_cast<uint16_t *>(k_pool), *vp = static_cast<uint16_t *>(v_pool);
    if (!r->no_rope_kv) {
        RT_K_TRY(k_rope_kv_store_paged(xh, x_acc, M, n_q, n_kv, hd, row_stride, pos, inv_freq, kp,
                                       vp, slots, block_size, r->stream));
        return RT_ERR_NONE;
    }
    if (x_acc)
        RT_K_TRY(k_rope_acc(xh, x_acc, M, n_q + n_kv, hd, row_stride, pos, inv_freq, r->stream));
    else
        RT_K_TRY(k_rope(xh, M, n_q + n_kv, hd, row_stride, pos, inv_freq, r->stream));
    RT_K_TRY(k_kv_store_paged(kp, vp, xh + (size_t)n_q * hd, xh + (size_t)(n_q + n_kv) * hd,
                              row_stride, M, slots, n_kv, hd, block_size, r->stream));
    return RT_ERR_NONE;
}

/* Per-head RMSNorm of q and k (Qwen3), on the fp16 rows or in place on the deferred sums */
static enum rt_err cuda_head_norm(void *ctx, void *x, float *x_acc, int M, int n_q, int n_kv,
                                  int hd, size_t row_stride, const float *wq, const float *wk,
                                  float eps)
{
    RT_K_TRY(k_head_rmsnorm(static_cast<uint16_t *>(x), x_acc, M, n_q, n_kv, hd, row_stride, wq,
                            wk, eps, R(ctx)->stream));
    return RT_ERR_NONE;
}

/* Attention of a chunk over the paged cache: runs of >= 16 rows (prompt chunks) through
 * k_attention_paged_prefill (FlashAttention-2 on tensor cores), consecutive shorter runs
 * (decode rows of many sequences, short chunks) together through one k_attention_paged; while
 * a graph records, every row in one k_attention_paged with the context as the key bound. */
static enum rt_err cuda_attention(void *ctx, void *out, size_t out_stride, const void *q,
                                  size_t q_stride, const void *k_pool, const void *v_pool, int M,
                                  const struct rt_attn_rows *a, int n_heads, int n_kv_heads,
                                  int hd, int sliding_window)
{
    struct cuda_rank *r = R(ctx);
    /* split-KV: one workspace for every row count and position (k_attention_workspace_bytes
     * with the kernels' largest M), grown by the first call (a prompt, op by op), so a decode
     * graph never needs it grown while it records; zero-filled, left ready by each call */
    const int T = a->table_stride * a->block_size;
    if (r->att_ws_key[0] != n_heads || r->att_ws_key[1] != hd || r->att_ws_key[2] != T) {
        r->att_ws_need = k_attention_workspace_bytes(65535, n_heads, hd, T);
        r->att_ws_key[0] = n_heads; r->att_ws_key[1] = hd; r->att_ws_key[2] = T;
    }
    const size_t ws_bytes = r->att_ws_need;
    if (ws_bytes) {
        enum rt_err e = grow(r, &r->att_ws, ws_bytes, "the attention workspace", true);
        if (e) return e;
    }
    void *ws = ws_bytes ? r->att_ws.p : NULL;
    const struct ref_att_score sc = {a->scale, a->softcap, a->alibi};
    uint16_t *o = static_cast<uint16_t *>(out);
    const uint16_t *qh = static_cast<const uint16_t *>(q);
    const uint16_t *kp = static_cast<const uint16_t *>(k_pool);
    const uint16_t *vp = static_cast<const uint16_t *>(v_pool);
    if (r->capturing) {
        RT_K_TRY(k_attention_paged(o, out_stride, qh, q_stride, kp, vp, M, a->pos, a->tables,
                                   a->table_stride, a->row_table, n_heads, n_kv_heads, hd,
                                   a->block_size, a->max_keys, sliding_window, &sc, ws,
                                   r->att_ws.bytes, r->stream));
        return RT_ERR_NONE;
    }
    for (int j = 0; j < a->n_runs;) {
        const struct rt_attn_run *run = &a->runs[j];
        if (run->n >= 16) {
            RT_K_TRY(k_attention_paged_prefill(o + (size_t)run->row0 * out_stride, out_stride,
                                               qh + (size_t)run->row0 * q_stride, q_stride, kp,
                                               vp, run->n, run->p0,
                                               a->tables + (size_t)run->table * a->table_stride,
                                               n_heads, n_kv_heads, hd, a->block_size,
                                               sliding_window, &sc, ws, r->att_ws.bytes,
                                               r->stream));
            j++;
            continue;
        }
        int k = j, keys = 1; /* consecutive short runs: one launch */
        while (k < a->n_runs && a->runs[k].n < 16) {
            keys = std::max(keys, a->runs[k].p0 + a->runs[k].n);
            k++;
        }
        const int row0 = run->row0, rows = a->runs[k - 1].row0 + a->runs[k - 1].n - row0;
        RT_K_TRY(k_attention_paged(o + (size_t)row0 * out_stride, out_stride,
                                   qh + (size_t)row0 * q_stride, q_stride, kp, vp, rows,
                                   a->pos + row0, a->tables, a->table_stride, a->row_table + row0,
                                   n_heads, n_kv_heads, hd, a->block_size, keys, sliding_window,
                                   &sc, ws, r->att_ws.bytes, r->stream));
        j = k;
    }
    return RT_ERR_NONE;
}

static enum rt_err cuda_kv_copy_block(void *ctx, void *k_pool, void *v_pool, int src, int dst,
                                      size_t block_elems)
{
    struct cuda_rank *r = R(ctx);
    RT_K_TRY(k_kv_copy_block(static_cast<uint16_t *>(k_pool), static_cast<uint16_t *>(v_pool),
                             src, dst, block_elems, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    R(ctx);
    RT_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return RT_ERR_NONE;
}

static enum rt_err cuda_act_mul(void *ctx, enum rt_act kind, void *out, const void *gate_up,
                                float *gate_up_acc, const float *act_scale, int M, int I)
{
    struct cuda_rank *r = R(ctx);
    uint16_t *o = static_cast<uint16_t *>(out);
    const uint16_t *gu = gate_up_acc ? nullptr : static_cast<const uint16_t *>(gate_up);
    if (act_scale && kind != RT_ACT_GELU) {
        qs_log_error(__func__, "the CUDA backend divides only a plain GELU by activation scales");
        return RT_ERR_UNSUPPORTED;
    }
    switch (kind) {
    case RT_ACT_GELU: /* Falcon, MPT (with its ScaledActivation divisors) */
        RT_K_TRY(k_gelu(o, gu, gate_up_acc, (size_t)M * (size_t)I, act_scale, I, r->stream));
        return RT_ERR_NONE;
    case RT_ACT_GELU_TANH: /* Gemma's GeGLU */
        RT_K_TRY(k_gelu_tanh_mul(o, gu, gate_up_acc, M, I, r->stream));
        return RT_ERR_NONE;
    case RT_ACT_SILU:
        if (gate_up_acc)
            RT_K_TRY(k_silu_mul_acc(o, gate_up_acc, M, I, r->stream));
        else
            RT_K_TRY(k_silu_mul(o, gu, M, I, r->stream));
        return RT_ERR_NONE;
    }
    qs_log_error(__func__, "the CUDA backend has no activation of kind %d", (int)kind);
    return RT_ERR_UNSUPPORTED;
}

/* rows[n] (and weights[n]) of a MoE step into the rows buffer: the int32 rows at 0, the fp32
 * weights 256-byte aligned after them. */
static enum rt_err upload_rows(struct cuda_rank *r, const int32_t *rows, const float *weights,
                               int n, int32_t **drows, float **dw)
{
    const size_t rb = ((size_t)n * sizeof(int32_t) + 255) / 256 * 256;
    enum rt_err e = grow(r, &r->rows, rb + (size_t)n * sizeof(float), "MoE rows", false);
    if (e) return e;
    *drows = static_cast<int32_t *>(r->rows.p);
    RT_CUDA_TRY(cudaMemcpyAsync(*drows, rows, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                r->stream));
    if (weights) {
        *dw = reinterpret_cast<float *>(static_cast<unsigned char *>(r->rows.p) + rb);
        RT_CUDA_TRY(cudaMemcpyAsync(*dw, weights, (size_t)n * sizeof(float),
                                    cudaMemcpyHostToDevice, r->stream));
    }
    return RT_ERR_NONE;
}

static enum rt_err cuda_gather_rows(void *ctx, void *dst, const void *src, const int32_t *rows,
                                    int n, int width)
{
    struct cuda_rank *r = R(ctx);
    if (n < 1) return RT_ERR_NONE;
    int32_t *drows = NULL;
    float *dw = NULL;
    enum rt_err e = upload_rows(r, rows, NULL, n, &drows, &dw);
    if (e) return e;
    RT_K_TRY(k_gather_rows(static_cast<uint16_t *>(dst), static_cast<const uint16_t *>(src),
                           drows, n, width, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream)); /* the pageable rows are the caller's */
    return RT_ERR_NONE;
}

static enum rt_err cuda_gather_cols(void *ctx, void *dst, const void *src, const int32_t *perm,
                                    int M, int K)
{
    struct cuda_rank *r = R(ctx);
    RT_K_TRY(k_gather_cols(static_cast<uint16_t *>(dst), static_cast<const uint16_t *>(src), perm,
                           M, K, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_scatter_add_rows(void *ctx, void *y, const void *src, const int32_t *rows,
                                         const float *weights, int n, int width)
{
    struct cuda_rank *r = R(ctx);
    if (n < 1) return RT_ERR_NONE;
    int32_t *drows = NULL;
    float *dw = NULL;
    enum rt_err e = upload_rows(r, rows, weights, n, &drows, &dw);
    if (e) return e;
    RT_K_TRY(k_scatter_add_rows(static_cast<uint16_t *>(y), static_cast<const uint16_t *>(src),
                                drows, dw, n, width, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
    return RT_ERR_NONE;
}

// --- collectives (rt_backend.h all_reduce / gather) --------------------------------------------

static enum rt_err cuda_all_reduce(void *ctx, void *buf, size_t n, enum rt_buf_type type)
{
    struct cuda_rank *r = R(ctx);
    if (!r->comm || r->comm->world <= 1) return RT_ERR_NONE;
    const enum rt_dtype t = type == RT_BUF_F32 ? RT_DTYPE_F32 : RT_DTYPE_F16;
    if (r->capturing && !r->comm->ops->can_capture(r->comm, buf, n, t)) {
        qs_log_debug("all-reduce of %zu values: NCCL cannot be recorded into a graph here", n);
        return RT_ERR_DEVICE;
    }
    return r->comm->ops->all_reduce(r->comm, buf, n, t, r->stream);
}

static enum rt_err cuda_gather(void *ctx, const void *send, size_t bytes, void *recv)
{
    struct cuda_rank *r = R(ctx);
    if (r->capturing) {
        qs_log_debug("a gather between ranks cannot be recorded in a graph");
        return RT_ERR_DEVICE;
    }
    if (!r->comm || r->comm->world <= 1) {
        if (bytes && recv != send)
            RT_CUDA_TRY(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, r->stream));
        return RT_ERR_NONE;
    }
    return r->comm->ops->gather(r->comm, send, bytes, recv, r->stream);
}

// --- decode-step graph (rt_backend.h graph_begin / graph_end / graph_replay) --------------------

static enum rt_err cuda_graph_begin(void *ctx, int key)
{
    struct cuda_rank *r = R(ctx);
    if (key < 0 || key >= RT_MAX_GRAPHS) return RT_ERR_ARG;
    if (r->gexec[key]) RT_CUDA_TRY(cudaGraphExecDestroy(r->gexec[key]));
    r->gexec[key] = NULL;
    RT_CUDA_TRY(cudaStreamBeginCapture(r->stream, cudaStreamCaptureModeThreadLocal));
    r->capturing = true;
    r->gexec_gen[key] = r->buf_gen;
    return RT_ERR_NONE;
}

static enum rt_err cuda_graph_end(void *ctx, int key, bool ok)
{
    struct cuda_rank *r = R(ctx);
    cudaGraph_t g = NULL;
    r->capturing = false;
    const cudaError_t ce = cudaStreamEndCapture(r->stream, &g); /* always: leave capture mode */
    if (ce != cudaSuccess || !ok || !g) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        if (ce != cudaSuccess)
            qs_log_debug("GPU %d: decode graph capture failed: %s", r->device, cudaGetErrorString(ce));
        return ok ? RT_ERR_DEVICE : RT_ERR_NONE;
    }
    size_t n_nodes = 0;
    cudaGraphGetNodes(g, NULL, &n_nodes);
    const cudaError_t ie = cudaGraphInstantiate(&r->gexec[key], g, 0);
    cudaGraphDestroy(g);
    if (ie != cudaSuccess) {
        r->gexec[key] = NULL;
        cudaGetLastError();
        qs_log_debug("GPU %d: decode graph instantiation failed: %s", r->device,
                     cudaGetErrorString(ie));
        return RT_ERR_DEVICE;
    }
    qs_log_debug("GPU %d: decode step of %d row%s recorded as a CUDA graph (%zu nodes)", r->device,
                 1 << key, key ? "s" : "", n_nodes);
    return RT_ERR_NONE;
}

static bool cuda_graph_ready(void *ctx, int key)
{
    const struct cuda_rank *r = static_cast<struct cuda_rank *>(ctx);
    return key >= 0 && key < RT_MAX_GRAPHS && r->gexec[key] && r->gexec_gen[key] == r->buf_gen;
}

static enum rt_err cuda_graph_replay(void *ctx, int key, bool *done)
{
    struct cuda_rank *r = R(ctx);
    *done = false;
    if (!cuda_graph_ready(ctx, key)) return RT_ERR_NONE;
    RT_CUDA_TRY(cudaGraphLaunch(r->gexec[key], r->stream));
    *done = true;
    return RT_ERR_NONE;
}

// --- device sampling (rt_backend.h sample) -------------------------------------------------------

/* ids[i] from row i: every row in one k_sample_rows launch into device ids (the history bitmaps
 * of the rows with a repetition penalty sent along; per row, one launch cost 5.6 % of a decode
 * step at 64 sequences: docs/BENCHMARKS.md), then one copy of the n ids back. */
static enum rt_err cuda_sample(void *ctx, const float *logits, size_t row_stride, int n,
                               int n_vocab, const struct rt_pick *picks, int32_t *ids)
{
    struct cuda_rank *r = R(ctx);
    const size_t seen_bytes = ((size_t)n_vocab + 7) / 8;
    size_t n_seen = 0;
    for (int i = 0; i < n; i++)
        n_seen += picks[i].p.repeat_penalty != 1.0f;
    const size_t id_bytes = ((size_t)n * sizeof(int32_t) + 15) / 16 * 16;
    const size_t arg_bytes = (k_sample_rows_args_bytes(n) + 15) / 16 * 16;
    const size_t need = id_bytes + arg_bytes + n_seen * ((seen_bytes + 15) / 16 * 16);
    if (r->pick_bytes < need) {
        RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
        cudaFree(r->d_pick);
        cudaFreeHost(r->h_pick);
        r->d_pick = r->h_pick = NULL;
        r->pick_bytes = 0;
        void *d = NULL;
        const size_t want = need + need / 2;
        enum rt_err e = dev_alloc("the sampling buffers", r->device, want, &d);
        if (e) return e;
        r->d_pick = static_cast<unsigned char *>(d);
        RT_CUDA_TRY(cudaMallocHost(&r->h_pick, want));
        r->pick_bytes = want;
    }
    /* every row in one launch (k_sample_rows): [ids | the rows' arguments | histories] */
    int32_t *d_ids = reinterpret_cast<int32_t *>(r->d_pick);
    size_t at = id_bytes + arg_bytes;
    if (n > r->n_pick_rows) {
        struct k_sample_row *nr = static_cast<struct k_sample_row *>(
            realloc(r->pick_rows, (size_t)n * sizeof(*nr)));
        if (!nr) {
            qs_log_error(__func__, "out of memory for %d sampling rows", n);
            return RT_ERR_NOMEM;
        }
        r->pick_rows = nr;
        r->n_pick_rows = n;
    }
    for (int i = 0; i < n; i++) {
        const struct rt_sample_params *p = &picks[i].p;
        const uint8_t *seen = NULL;
        if (p->repeat_penalty != 1.0f) { /* the history changes every token: send it along */
            memcpy(r->h_pick + at, picks[i].seen, seen_bytes);
            RT_CUDA_TRY(cudaMemcpyAsync(r->d_pick + at, r->h_pick + at, seen_bytes,
                                        cudaMemcpyHostToDevice, r->stream));
            seen = r->d_pick + at;
            at += (seen_bytes + 15) / 16 * 16;
        }
        r->pick_rows[i].p = (struct k_sample_params){p->temperature, p->top_k, p->top_p,
                                                     p->min_p, p->repeat_penalty};
        r->pick_rows[i].u = picks[i].u;
        r->pick_rows[i].seen = seen;
    }
    const int ke = k_sample_rows(d_ids, logits, row_stride, n, n_vocab, r->pick_rows,
                                 r->h_pick + id_bytes, r->d_pick + id_bytes, r->stream);
    if (ke != K_ERR_NONE) {
        cudaStreamSynchronize(r->stream); /* the history copies queued above read h_pick */
        RT_K_TRY(ke);
    }
    RT_CUDA_TRY(cudaMemcpyAsync(r->h_pick, r->d_pick, (size_t)n * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
    memcpy(ids, r->h_pick, (size_t)n * sizeof(int32_t));
    return RT_ERR_NONE;
}

static struct rt_backend_ops make_ops(void)
{
    struct rt_backend_ops o;
    memset(&o, 0, sizeof(o));
    o.name = "cuda";
    o.act_size = 2;
    o.kv_size = 2;
    o.default_batch = 2048;
    o.defer_max_m = RT_CUDA_DEFER_MAX_M;
    o.destroy = cuda_destroy;
    o.load_weights = cuda_load_weights;
    o.tensor_ptr = cuda_tensor_ptr;
    o.alloc = cuda_alloc;
    o.free = cuda_free;
    o.upload = cuda_upload;
    o.download = cuda_download;
    o.zero = cuda_zero;
    o.embed = cuda_embed;
    o.softcap = cuda_softcap;
    o.alibi = true;
    o.norm = cuda_norm;
    o.linear_w4 = cuda_linear_w4;
    o.linear_acc_ok = cuda_linear_acc_ok;
    o.linear_f16 = cuda_linear_f16;
    o.lm_head = cuda_lm_head;
    o.router = cuda_router;
    o.rope_kv_store = cuda_rope_kv_store;
    o.head_norm = cuda_head_norm;
    o.attention = cuda_attention;
    o.kv_copy_block = cuda_kv_copy_block;
    o.mem_info = cuda_mem_info;
    o.act_mul = cuda_act_mul;
    o.gather_rows = cuda_gather_rows;
    o.gather_cols = cuda_gather_cols;
    o.scatter_add_rows = cuda_scatter_add_rows;
    o.all_reduce = cuda_all_reduce;
    o.gather = cuda_gather;
    o.graph_begin = cuda_graph_begin;
    o.graph_end = cuda_graph_end;
    o.graph_ready = cuda_graph_ready;
    o.graph_replay = cuda_graph_replay;
    o.sample = cuda_sample;
    return o;
}

static const struct rt_backend_ops cuda_ops = make_ops();

bool rt_cuda_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        cudaGetLastError();
        return false;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return false;
    return p.major * 10 + p.minor >= RT_CUDA_MIN_CC;
}

/* The GPU of the rank: visible, sm_80 or newer (reported otherwise). */
static enum rt_err check_gpu(int device)
{
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev < 1) {
        qs_log_error(__func__, "no usable CUDA GPU (%s); run with --device cpu",
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        cudaGetLastError();
        return RT_ERR_NO_DEVICE;
    }
    if (device < 0 || device >= n_dev) {
        qs_log_error(__func__, "GPU %d is needed (rank's device), but %d GPU(s) are visible",
                     device, n_dev);
        return RT_ERR_NO_DEVICE;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        qs_log_error(__func__, "cannot query GPU %d", device);
        return RT_ERR_NO_DEVICE;
    }
    if (p.major * 10 + p.minor < RT_CUDA_MIN_CC) {
        qs_log_error(__func__, "GPU %d (%s) has compute capability %d.%d; qshard's kernels need "
                     "8.0 or newer (Ampere, Ada, Hopper); run with --device cpu", device, p.name,
                     p.major, p.minor);
        return RT_ERR_NO_DEVICE;
    }
    return RT_ERR_NONE;
}

enum rt_err rt_cuda_backend_create(const struct rt_opts *opts, struct rt_comm *comm,
                                   struct rt_backend *out)
{
    out->ops = NULL;
    out->ctx = NULL;
    const int rank = comm ? comm->rank : 0;
    const int device = (opts ? opts->cuda_device : 0) + rank;
    const double t0 = qs_now_s();
    enum rt_err err = check_gpu(device);
    if (err) return err;
    struct cuda_rank *r = static_cast<struct cuda_rank *>(calloc(1, sizeof(*r)));
    if (!r) {
        qs_log_error(__func__, "out of host memory");
        return RT_ERR_NOMEM;
    }
    r->rank = rank;
    r->device = device;
    r->comm = comm;
    r->no_rope_kv = opts && opts->no_rope_kv;
    k_set_pdl(!(opts && opts->no_pdl));
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
    for (int i = 0; i < RT_CUDA_SMALL_SLOTS && e == cudaSuccess; ++i)
        e = cudaEventCreateWithFlags(&r->small_done[i], cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaMallocHost(&r->h_small, (size_t)RT_CUDA_SMALL_SLOTS * RT_CUDA_SLOT_BYTES);
    if (e != cudaSuccess) {
        qs_log_error(__func__, "GPU %d: cannot create its stream, event or staging buffer (%s)",
                     device, cudaGetErrorString(e));
        cuda_destroy(r);
        return RT_ERR_DEVICE;
    }
    qs_log_debug("GPU %d: CUDA driver, context, stream and staging in %.3f s", device,
                 qs_now_s() - t0);
    r->cublas_pending = pthread_create(&r->cublas_th, NULL, cublas_worker, r) == 0;
    if (!r->cublas_pending) cublas_worker(r); /* no thread: here */
    /* probed now, never inside a capture; --debug-no-wgmma: dequant + cuBLAS above M = 64 */
    if (k_w4a16_caps_query(&r->caps) != K_ERR_NONE) {
        cuda_destroy(r);
        return RT_ERR_DEVICE;
    }
    r->caps.allow_wgmma = !(opts && opts->no_wgmma);
    out->ops = &cuda_ops;
    out->ctx = r;
    return RT_ERR_NONE;
}

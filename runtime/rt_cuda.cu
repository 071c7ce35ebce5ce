/*
 * rt_cuda.cu - the CUDA backend of the runtime: struct rt_backend_ops (runtime/rt.h) on GPUs,
 * every op one of our kernels (kernels/kernels.h) or a cuBLAS GEMM, on one stream per rank.
 *
 *   - Activations and the KV cache are fp16 (act_size = kv_size = 2); the residual stream,
 *     logits and router logits fp32 (rt.h).
 *   - Weights: each rank's tensors are copied once into ONE device allocation (the rank file's
 *     data region, byte for byte, so a tensor's device address is base + its file offset minus
 *     the region start). The copy goes page cache -> pinned staging buffers -> device by
 *     RT_CUDA_UPLOAD_THREADS threads, each with its own stream and two pinned buffers, so
 *     reads from the mapping and PCIe copies overlap; never cudaMemcpy from pageable memory
 *     (7x slower on the test machine, /work/shared/PERF-NOTES.md). -v prints bytes, seconds and
 *     GB/s of each phase.
 *   - W4A16 linears: k_w4a16_route_pick + k_w4a16_launch per call (kernels.h: split-K at M <= 64,
 *     wgmma up to K_W4A16_DQ_GEMM_MIN_M - 1 on sm_90a, dequant + cuBLAS above).
 *   - Multi-rank (world_size GPUs driven by one process): all_reduce is, up to 256 KB per rank
 *     and when every pair of GPUs has peer access, our peer-to-peer kernel (k_allreduce_sum),
 *     else one NCCL ncclAllReduce (sum) per rank inside ncclGroupStart/End; both enqueued on
 *     the ranks' streams: no host synchronisation (communicators from ncclCommInitAll at
 *     creation). NVLink SHARP/multicast (NVLS) is off unless NCCL_NVLS_ENABLE is set: our
 *     all-reduces are a few KB to MB of activations, latency-bound, and multicast on shared
 *     machines is a hazard (device KINDS).
 *   - Decode steps (M = 1, no MoE) are recorded once into a CUDA graph per rank (stream capture
 *     of every op of the step + lm_head, every rank's stream at once; at world_size > 1 only
 *     with the peer-to-peer all-reduce: NCCL is never recorded) and replayed with the token and
 *     position copied into d_step first (embed, rope, kv_store and attention read them there
 *     while recording); a workspace that grows makes the recording stale and the model records
 *     again.
 *   - GPUs older than sm_80 are refused at creation with the GPU's name and compute capability;
 *     out-of-memory says what did not fit and how much was free.
 *
 * Entry points: rt_cuda_backend_create, rt_cuda_available (rt.h). Test: `make test-gpu`
 * (tests/run_gpu_tests.sh runs the end-to-end CUDA-vs-CPU logits check when fixtures exist).
 */
#include <cublas_v2.h>    /* cublasGemmEx */
#include <cuda_runtime.h> /* cudaMalloc, streams, events */
#include <nccl.h>         /* ncclCommInitAll, ncclAllReduce */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmt.h"     /* struct fmt_shard, fmt_shard_tensor */
#include "kernels.h" /* k_* launchers */
#include "qs_log.h"  /* qs_log_error, qs_log_debug */
#include "rt.h"

#define RT_CUDA_MAX_RANKS 16
#define RT_CUDA_UPLOAD_THREADS 4            /* readers: one page-cache stream each */
#define RT_CUDA_STAGE_BYTES (16u << 20)     /* pinned staging buffer: >= 16 MiB runs at ~55 GB/s */
#define RT_CUDA_MIN_CC 80                   /* mma.sync m16n8k16, cp.async, ldmatrix */

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

/* A device buffer that only grows (workspaces, small uploads). */
struct grow_buf {
    void *p;
    size_t bytes;
};

/* linears remembered as "not deferred" per rank (MoE expert down projections; past this they
 * are deferred and finished separately) */
#define RT_CUDA_PLAIN_MAX 1024

struct cuda_rank {
    int device;
    cudaStream_t stream;
    cudaEvent_t ev;         /* copy_ranks: orders a copy between this rank's stream and another's */
    cublasHandle_t cublas;
    struct k_w4a16_caps caps; /* what the W4A16 router may use on this GPU (probed at creation) */
    unsigned char *weights; /* owned: the rank file's data region */
    size_t weights_bytes;
    uint64_t region_off;    /* file offset of weights[0] */
    struct grow_buf ws;     /* k_w4a16 workspace (zeroed once, left zeroed by every call) */
    struct grow_buf att_ws; /* k_attention split-KV workspace (zeroed once, left ready) */
    size_t att_ws_need;     /* its size for the (n_heads, hd, T_cap) in att_ws_key */
    int att_ws_key[3];
    struct grow_buf scratch;/* dequantised fp16 weight for the dq + cuBLAS path */
    struct grow_buf pos;    /* int32 0, 1, 2, ...: positions for k_rope */
    struct grow_buf small;  /* token ids, MoE rows and weights */
    unsigned buf_gen;       /* bumped whenever a grow_buf moves (a recorded graph is then stale) */
    /* decode-step graph (graph_begin/end/replay) */
    bool capturing;         /* ops are being recorded: take token/position from d_step */
    int32_t *d_step;        /* device [2]: token, position of the step being replayed */
    int32_t *h_step;        /* pinned host [2]: copied to d_step before each replay */
    cudaGraph_t graph;      /* captured, waiting for every rank's capture to end, or NULL */
    cudaGraphExec_t gexec;  /* the recording, or NULL */
    unsigned gexec_gen;     /* buf_gen when it was recorded */
    /* device sampling (rt.h sample): [0, 16) the id, [16, ...) the history bitmap */
    unsigned char *d_pick;  /* device */
    unsigned char *h_pick;  /* pinned host staging */
    size_t pick_bytes;
    /* deferred split-K (see settle): pend_y's [pend_M, pend_N] values are still fp32 sums at
     * the start of ws, made by the ACC route (k_w4a16_launch) with weight pend_w */
    void *pend_y;
    int pend_M, pend_N;
    const void *pend_w;
    const void *plain_w[RT_CUDA_PLAIN_MAX]; /* linears whose output a non-fusing op read */
    int n_plain;
    bool replan;            /* plain_w grew while recording: record again after one replay */
};

struct cuda_ctx {
    int world;
    struct cuda_rank r[RT_CUDA_MAX_RANKS];
    ncclComm_t comm[RT_CUDA_MAX_RANKS]; /* world > 1: one communicator per rank */
    struct k_allreduce *ar;             /* world > 1 with peer access: small all-reduces */
};

/* Whether the environment variable `name` is exactly "0": the QSHARD_* switches that turn a
 * path off for A/B measurements. */
static bool env_zero(const char *name)
{
    const char *e = getenv(name);
    return e && strcmp(e, "0") == 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

/* Host data (pageable, small) into a rank's growable buffer; returns the device copy. */
static enum rt_err upload_small(struct cuda_rank *r, const void *host, size_t bytes, size_t off,
                                void **dev)
{
    enum rt_err e = grow(r, &r->small, off + bytes, "small upload buffer", false);
    if (e) return e;
    *dev = static_cast<unsigned char *>(r->small.p) + off;
    RT_CUDA_TRY(cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, r->stream));
    return RT_ERR_NONE;
}

/*
 * Deferred split-K. At M <= RT_CUDA_DEFER_MAX_M (decode, small batches) a W4A16 linear runs
 * an ACC route (k_w4a16_launch): its slices add their partial sums into ws, nothing waits for
 * the last slice (no counter, no read-back, no fp16 y: 1.2-2.5 us per call on the H200, `qshard bench
 * kernel floor`). The op that reads y next takes the sums from ws and zeroes them: rmsnorm (the o and down projections), rope / rope_kv_store (qkv; they also round
 * the v heads), silu_mul (gate_up) have fused versions; any other op on the rank first calls
 * settle(), which writes y (k_w4a16_acc_finish), and that linear is then remembered in plain_w
 * and no longer deferred (MoE expert outputs, which scatter_add_rows reads). If a consumer fails
 * after taking the sums, release_sums() zeroes them, so the next deferred linear starts from
 * zero. World size 1 only for now. QSHARD_DEFER=0 turns it off (A/B runs).
 */
/* 16: decode and small batches. At 64 rows (a prompt chunk) the fused consumers lost 1.7 % of
 * pp64 against v9's own finish (13521 vs 13751 tok/s, synthetic 7B, H200), at 1 row they gain
 * 7 % of decode speed (docs/BENCHMARKS.md). */
#define RT_CUDA_DEFER_MAX_M 16

/* After a consumer took the pending [M, N] sums: K_ERR_NONE -> RT_ERR_NONE; on a refusal (the
 * kernel reported it) the sums are zeroed, so no later deferred linear adds onto them. */
static enum rt_err release_sums(struct cuda_rank *r, int rc, int M, size_t N)
{
    if (rc == K_ERR_NONE) return RT_ERR_NONE;
    RT_CUDA_TRY(cudaMemsetAsync(r->ws.p, 0, (size_t)M * N * sizeof(float), r->stream));
    return rc == K_ERR_SHAPE ? RT_ERR_SHAPE : RT_ERR_ARG;
}

static enum rt_err settle(struct cuda_rank *r)
{
    if (!r->pend_y) return RT_ERR_NONE;
    void *y = r->pend_y;
    r->pend_y = NULL;
    if (r->n_plain < RT_CUDA_PLAIN_MAX) {
        r->plain_w[r->n_plain++] = r->pend_w;
        if (r->capturing) r->replan = true; /* the recording holds this finish: record again */
    }
    return release_sums(r, k_w4a16_acc_finish(static_cast<uint16_t *>(y),
                                              static_cast<float *>(r->ws.p), r->pend_M,
                                              r->pend_N, r->stream),
                        r->pend_M, (size_t)r->pend_N);
}

#define SETTLE(r)                            \
    do {                                     \
        enum rt_err se_ = settle(r);         \
        if (se_ != RT_ERR_NONE) return se_;  \
    } while (0)

/* Whether y (M rows of N) is the pending output of a deferred linear: the caller consumes its
 * sums from ws and the pending state ends. */
static bool take_pending(struct cuda_rank *r, const void *y, int M, size_t N)
{
    if (!r->pend_y || r->pend_y != y || r->pend_M != M || (size_t)r->pend_N != N) return false;
    r->pend_y = NULL;
    return true;
}

static void rank_free(struct cuda_rank *r)
{
    if (r->device < 0) return;
    cudaSetDevice(r->device);
    if (r->stream) cudaStreamSynchronize(r->stream);
    cudaFree(r->weights);
    struct grow_buf *bufs[] = {&r->ws, &r->att_ws, &r->scratch, &r->pos, &r->small};
    for (struct grow_buf *b : bufs) {
        cudaFree(b->p);
        b->p = NULL;
        b->bytes = 0;
    }
    if (r->gexec) cudaGraphExecDestroy(r->gexec);
    if (r->graph) cudaGraphDestroy(r->graph);
    cudaFree(r->d_step);
    cudaFreeHost(r->h_step);
    cudaFree(r->d_pick);
    cudaFreeHost(r->h_pick);
    r->d_pick = r->h_pick = NULL;
    r->pick_bytes = 0;
    r->gexec = NULL;
    r->graph = NULL;
    r->d_step = r->h_step = NULL;
    if (r->cublas) cublasDestroy(r->cublas);
    if (r->ev) cudaEventDestroy(r->ev);
    if (r->stream) cudaStreamDestroy(r->stream);
    r->ev = NULL;
    r->weights = NULL;
    r->cublas = NULL;
    r->stream = NULL;
}

static void cuda_destroy(void *vctx)
{
    struct cuda_ctx *c = static_cast<struct cuda_ctx *>(vctx);
    if (!c) return;
    for (int i = 0; i < c->world; ++i) rank_free(&c->r[i]);
    k_allreduce_destroy(c->ar);
    for (int i = 0; i < c->world; ++i)
        if (c->comm[i]) ncclCommDestroy(c->comm[i]);
    free(c);
}

static struct cuda_rank *R(void *ctx, int rank)
{
    struct cuda_rank *r = &static_cast<struct cuda_ctx *>(ctx)->r[rank];
    cudaSetDevice(r->device);
    return r;
}

// --- weights ---------------------------------------------------------------------------------

struct upload_job {
    const unsigned char *src; /* mapping */
    unsigned char *dst;       /* device */
    size_t bytes;
    int device, slot, n_slots;
    double copy_s;            /* time in memcpy from the mapping (page cache or disk) */
    char err[256];
};

/* Worker `slot` takes chunks slot, slot + n_slots, ...: memcpy from the mapping into one of its
 * two pinned buffers while the other one's cudaMemcpyAsync is in flight. */
static void *upload_worker(void *arg)
{
    struct upload_job *j = static_cast<struct upload_job *>(arg);
    cudaStream_t st = NULL;
    unsigned char *pin[2] = {NULL, NULL};
    cudaEvent_t done[2] = {NULL, NULL};
    cudaError_t e = cudaSetDevice(j->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    for (int b = 0; b < 2 && e == cudaSuccess; ++b) {
        e = cudaHostAlloc(reinterpret_cast<void **>(&pin[b]), RT_CUDA_STAGE_BYTES, cudaHostAllocDefault);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming);
    }
    int k = 0;
    for (size_t c = (size_t)j->slot; e == cudaSuccess && c * RT_CUDA_STAGE_BYTES < j->bytes;
         c += (size_t)j->n_slots, k ^= 1) {
        const size_t off = c * RT_CUDA_STAGE_BYTES;
        const size_t len = j->bytes - off < RT_CUDA_STAGE_BYTES ? j->bytes - off : RT_CUDA_STAGE_BYTES;
        e = cudaEventSynchronize(done[k]); /* buffer k's previous copy has finished */
        if (e != cudaSuccess) break;
        const double t0 = now_s();
        memcpy(pin[k], j->src + off, len);
        j->copy_s += now_s() - t0;
        e = cudaMemcpyAsync(j->dst + off, pin[k], len, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaEventRecord(done[k], st);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess)
        snprintf(j->err, sizeof j->err, "upload worker %d on GPU %d: %s", j->slot, j->device,
                 cudaGetErrorString(e));
    for (int b = 0; b < 2; ++b) {
        if (done[b]) cudaEventDestroy(done[b]);
        if (pin[b]) cudaFreeHost(pin[b]);
    }
    if (st) cudaStreamDestroy(st);
    return NULL;
}

static enum rt_err cuda_load_weights(void *ctx, int rank, const struct fmt_shard *s)
{
    struct cuda_rank *r = R(ctx, rank);
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
    const double t0 = now_s();
    char what[96];
    snprintf(what, sizeof what, "the weights of rank %d", rank);
    void *dst = NULL;
    enum rt_err e = dev_alloc(what, r->device, bytes, &dst);
    if (e) return e;
    r->weights = static_cast<unsigned char *>(dst);
    r->weights_bytes = bytes;
    r->region_off = lo->offset;
    const double t1 = now_s();

    struct upload_job jobs[RT_CUDA_UPLOAD_THREADS];
    pthread_t th[RT_CUDA_UPLOAD_THREADS];
    bool started[RT_CUDA_UPLOAD_THREADS] = {false};
    for (int i = 0; i < RT_CUDA_UPLOAD_THREADS; ++i) {
        jobs[i] = upload_job{src, r->weights, bytes, r->device, i, RT_CUDA_UPLOAD_THREADS, 0.0, {0}};
        started[i] = pthread_create(&th[i], NULL, upload_worker, &jobs[i]) == 0;
        if (!started[i]) upload_worker(&jobs[i]); /* no thread: do its share here */
    }
    double copy_s = 0;
    const char *err = NULL;
    for (int i = 0; i < RT_CUDA_UPLOAD_THREADS; ++i) {
        if (started[i]) pthread_join(th[i], NULL);
        copy_s += jobs[i].copy_s;
        if (jobs[i].err[0] && !err) err = jobs[i].err;
    }
    cudaSetDevice(r->device);
    if (err) {
        qs_log_error(__func__, "rank %d: %s", rank, err);
        return RT_ERR_DEVICE;
    }
    const double t2 = now_s();
    qs_log_debug("rank %d on GPU %d: weights %.3f GB: device alloc %.3f s; read + upload %.3f s "
                 "(%.1f GB/s, %d threads, %u MiB pinned buffers; memcpy from the mapping %.3f "
                 "thread-s = %.1f GB/s per thread)",
                 rank, r->device, bytes / 1e9, t1 - t0, t2 - t1, bytes / 1e9 / (t2 - t1),
                 RT_CUDA_UPLOAD_THREADS, RT_CUDA_STAGE_BYTES >> 20, copy_s,
                 copy_s > 0 ? bytes / 1e9 / copy_s : 0.0);
    return RT_ERR_NONE;
}

static const void *cuda_tensor_ptr(void *ctx, int rank, const struct fmt_tensor *t)
{
    struct cuda_rank *r = &static_cast<struct cuda_ctx *>(ctx)->r[rank];
    if (!r->weights || t->offset < r->region_off ||
        t->offset + t->size > r->region_off + r->weights_bytes)
        return NULL;
    return r->weights + (t->offset - r->region_off);
}

// --- memory ------------------------------------------------------------------------------------

static enum rt_err cuda_alloc(void *ctx, int rank, size_t bytes, void **out)
{
    struct cuda_rank *r = R(ctx, rank);
    enum rt_err e = dev_alloc("an activation or KV cache buffer", r->device, bytes, out);
    if (e) return e;
    if (bytes) RT_CUDA_TRY(cudaMemsetAsync(*out, 0, bytes, r->stream));
    return RT_ERR_NONE;
}

static void cuda_free(void *ctx, int rank, void *p)
{
    struct cuda_rank *r = R(ctx, rank);
    if (!p) return;
    (void)settle(r); /* a pending linear's output may live in p; a failure is reported there */
    cudaStreamSynchronize(r->stream);
    cudaFree(p);
}

static enum rt_err cuda_upload(void *ctx, int rank, void *dst, const void *src, size_t bytes)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    RT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream)); /* the host buffer may be reused at once */
    return RT_ERR_NONE;
}

static enum rt_err cuda_download(void *ctx, int rank, void *dst, const void *src, size_t bytes)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    RT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_zero(void *ctx, int rank, void *dst, size_t bytes)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    RT_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, r->stream));
    return RT_ERR_NONE;
}

// --- ops -----------------------------------------------------------------------------------------

static enum rt_err cuda_embed(void *ctx, int rank, float *out, const uint16_t *table,
                              const int32_t *tokens, int M, int64_t row_begin, int V_r, int H)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    if (r->capturing) { /* graph: the token is in d_step[0] at replay */
        RT_K_TRY(k_embed(out, table, r->d_step, M, row_begin, V_r, H, r->stream));
        return RT_ERR_NONE;
    }
    void *dt = NULL;
    enum rt_err e = upload_small(r, tokens, (size_t)M * sizeof(int32_t), 0, &dt);
    if (e) return e;
    RT_K_TRY(k_embed(out, table, static_cast<int32_t *>(dt), M, row_begin, V_r, H, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream)); /* `small` is reused by the next upload */
    return RT_ERR_NONE;
}

static enum rt_err cuda_rmsnorm(void *ctx, int rank, void *out, float *residual, const void *x,
                                const float *w, int M, int H, float eps)
{
    struct cuda_rank *r = R(ctx, rank);
    if (residual && take_pending(r, x, M, (size_t)H))
        return release_sums(r, k_rmsnorm_acc(static_cast<uint16_t *>(out), residual,
                                             static_cast<float *>(r->ws.p), w, M, H, eps,
                                             r->stream),
                            M, (size_t)H);
    SETTLE(r);
    RT_K_TRY(k_rmsnorm(static_cast<uint16_t *>(out), residual, static_cast<const uint16_t *>(x),
                       w, M, H, eps, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_linear_w4(void *ctx, int rank, const void *x, const uint8_t *qweight,
                                  const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                                  int M, int K, int N, int G, void *y)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    static const bool defer = !env_zero("QSHARD_DEFER"); /* QSHARD_DEFER=0: never deferred */
    /* deferred: the ACC route, the sums left in ws for the consumer. World 1 only: at world > 1
     * the o and down outputs feed the all-reduce (they would be learned as plain after one
     * step), and that path has not run on 2 GPUs yet */
    bool acc = defer && M <= RT_CUDA_DEFER_MAX_M && static_cast<cuda_ctx *>(ctx)->world == 1 &&
               (uintptr_t)y % 8 == 0 && /* the finish writes 4 values at a time */
               k_w4a16_acc_available(M, N, K, G, &r->caps);
    for (int i = 0; i < r->n_plain && acc; ++i) acc = r->plain_w[i] != qweight;
    /* the router's table (kernels/k_w4a16_route.c) picks the kernel and says what it needs */
    struct k_w4a16_route rt;
    RT_K_TRY(k_w4a16_route_pick(&rt, M, N, K, G, acc ? K_W4A16_EPI_ACC : K_W4A16_EPI_Y,
                           K_W4A16_KERNEL_AUTO, &r->caps));
    enum rt_err e = grow(r, &r->ws, acc ? k_w4a16_workspace_bytes(M, N) : rt.workspace_bytes,
                         "the W4A16 workspace", true);
    if (e == RT_ERR_NONE)
        e = grow(r, &r->scratch, rt.scratch_bytes, "the dequantised weight of a prefill linear",
                 false);
    if (e) return e;
    const struct k_w4a16_weight w = {qweight, qzeros, scales, bias};
    const struct k_w4a16_bufs bufs = {r->ws.p, r->ws.bytes, r->scratch.p, r->scratch.bytes,
                                      r->cublas};
    RT_K_TRY(k_w4a16_launch(&rt, static_cast<const uint16_t *>(x), &w, static_cast<uint16_t *>(y),
                            acc ? static_cast<float *>(r->ws.p) : NULL, &bufs, r->stream));
    if (acc) {
        r->pend_y = y;
        r->pend_M = M;
        r->pend_N = N;
        r->pend_w = qweight;
    }
    return RT_ERR_NONE;
}

static enum rt_err cuda_linear_f16(void *ctx, int rank, const void *x, const uint16_t *W,
                                   const float *bias, int M, int K, int N, void *y)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    const float alpha = 1.0f, beta = 0.0f;
    /* row-major y[M,N] = x[M,K] . W^T with W [N,K]: column-major y^T = op_T(W) . x^T */
    RT_CUBLAS_TRY(cublasGemmEx(r->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W,
                               CUDA_R_16F, K, x, CUDA_R_16F, K, &beta, y, CUDA_R_16F, N,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) RT_K_TRY(k_bias_add(static_cast<uint16_t *>(y), bias, M, N, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_lm_head(void *ctx, int rank, const void *x, const uint16_t *W, int M,
                                int K, int N, float *logits)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    const float alpha = 1.0f, beta = 0.0f;
    RT_CUBLAS_TRY(cublasGemmEx(r->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W,
                               CUDA_R_16F, K, x, CUDA_R_16F, K, &beta, logits, CUDA_R_32F, N,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return RT_ERR_NONE;
}

static enum rt_err cuda_router(void *ctx, int rank, const void *x, const float *W, int M, int K,
                               int N, float *y)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    RT_K_TRY(k_router(y, static_cast<const uint16_t *>(x), W, M, K, N, r->stream));
    return RT_ERR_NONE;
}

/* Device positions start_pos .. start_pos + M - 1 for k_rope and friends: d_step + 1 while a
 * decode graph records (M = 1, filled at replay), else a slice of the 0, 1, 2, ... table, grown
 * as the context grows. */
static enum rt_err positions(struct cuda_rank *r, int start_pos, int M, const int32_t **out)
{
    if (r->capturing) {
        *out = r->d_step + 1;
        return RT_ERR_NONE;
    }
    const size_t need = (size_t)(start_pos + M) * sizeof(int32_t);
    if (r->pos.bytes < need) {
        enum rt_err e = grow(r, &r->pos, need, "the position table", false);
        if (e) return e;
        const size_t n = r->pos.bytes / sizeof(int32_t);
        int32_t *h = static_cast<int32_t *>(malloc(n * sizeof(int32_t)));
        if (!h) {
            qs_log_error(__func__, "out of host memory for %zu positions", n);
            return RT_ERR_NOMEM;
        }
        for (size_t i = 0; i < n; ++i) h[i] = (int32_t)i;
        cudaError_t ce = cudaMemcpyAsync(r->pos.p, h, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                         r->stream);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(r->stream); /* before h is freed */
        free(h);
        RT_CUDA_TRY(ce);
    }
    *out = static_cast<const int32_t *>(r->pos.p) + start_pos;
    return RT_ERR_NONE;
}

static enum rt_err cuda_rope(void *ctx, int rank, void *x, int M, int n_heads, int hd,
                             size_t row_stride, int start_pos, const float *inv_freq)
{
    struct cuda_rank *r = R(ctx, rank);
    const int32_t *pos = NULL; /* first: nothing has been taken if it fails */
    enum rt_err e = positions(r, start_pos, M, &pos);
    if (e) return e;
    uint16_t *xh = static_cast<uint16_t *>(x);
    if (take_pending(r, x, M, row_stride)) /* the qkv sums, deferred */
        return release_sums(r, k_rope_acc(xh, static_cast<float *>(r->ws.p), M, n_heads, hd,
                                          row_stride, pos, inv_freq, r->stream),
                            M, row_stride);
    SETTLE(r);
    RT_K_TRY(k_rope(xh, M, n_heads, hd, row_stride, pos, inv_freq, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_kv_store(void *ctx, int rank, void *k_cache, void *v_cache, const void *k,
                                 const void *v, size_t row_stride, int M, int start_pos,
                                 int n_kv_heads, int hd, int T_cap)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    if (r->capturing) {
        RT_K_TRY(k_kv_store_at(static_cast<uint16_t *>(k_cache), static_cast<uint16_t *>(v_cache),
                               static_cast<const uint16_t *>(k), static_cast<const uint16_t *>(v),
                               row_stride, M, r->d_step + 1, n_kv_heads, hd, T_cap, r->stream));
        return RT_ERR_NONE;
    }
    RT_K_TRY(k_kv_store(static_cast<uint16_t *>(k_cache), static_cast<uint16_t *>(v_cache),
                        static_cast<const uint16_t *>(k), static_cast<const uint16_t *>(v),
                        row_stride, M, start_pos, n_kv_heads, hd, T_cap, r->stream));
    return RT_ERR_NONE;
}

/* rope + kv_store in one kernel (k_rope_kv_store), from the deferred qkv sums when pending */
static enum rt_err cuda_rope_kv_store(void *ctx, int rank, void *x, int M, int n_q, int n_kv,
                                      int hd, size_t row_stride, int start_pos,
                                      const float *inv_freq, void *k_cache, void *v_cache,
                                      int T_cap)
{
    static const bool fused = !env_zero("QSHARD_ROPE_KV"); /* "0": rope, kv_store apart (A/B) */
    if (!fused) {
        uint16_t *q = static_cast<uint16_t *>(x);
        enum rt_err e = cuda_rope(ctx, rank, x, M, n_q + n_kv, hd, row_stride, start_pos, inv_freq);
        if (!e)
            e = cuda_kv_store(ctx, rank, k_cache, v_cache, q + (size_t)n_q * hd,
                              q + (size_t)(n_q + n_kv) * hd, row_stride, M, start_pos, n_kv, hd,
                              T_cap);
        return e;
    }
    struct cuda_rank *r = R(ctx, rank);
    if (!r->capturing && (start_pos < 0 || (long long)start_pos + M > T_cap)) {
        qs_log_error(__func__, "positions %d..%lld outside the KV cache of %d rows", start_pos,
                     (long long)start_pos + M - 1, T_cap);
        return RT_ERR_SHAPE;
    }
    const int32_t *pos = NULL; /* first: nothing has been taken if it fails */
    enum rt_err e = positions(r, start_pos, M, &pos);
    if (e) return e;
    const bool from_acc = take_pending(r, x, M, row_stride);
    if (!from_acc) SETTLE(r);
    const int rc = k_rope_kv_store(static_cast<uint16_t *>(x),
                                   from_acc ? static_cast<float *>(r->ws.p) : NULL, M, n_q, n_kv,
                                   hd, row_stride, pos, inv_freq,
                                   static_cast<uint16_t *>(k_cache),
                                   static_cast<uint16_t *>(v_cache), T_cap, r->stream);
    if (from_acc) return release_sums(r, rc, M, row_stride);
    RT_K_TRY(rc);
    return RT_ERR_NONE;
}

static enum rt_err cuda_attention(void *ctx, int rank, void *out, size_t out_stride, const void *q,
                                  size_t q_stride, const void *k_cache, const void *v_cache, int M,
                                  int start_pos, int n_heads, int n_kv_heads, int hd, int T_cap,
                                  int sliding_window)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    /* split-KV decode: one workspace for every row count and position (k_attention_workspace_
     * bytes with the kernels' largest M), grown by the first call (a prompt, op by op), so a
     * decode graph never needs it grown while it records; zero-filled, left ready by each call */
    if (r->att_ws_key[0] != n_heads || r->att_ws_key[1] != hd || r->att_ws_key[2] != T_cap) {
        r->att_ws_need = k_attention_workspace_bytes(65535, n_heads, hd, T_cap);
        r->att_ws_key[0] = n_heads; r->att_ws_key[1] = hd; r->att_ws_key[2] = T_cap;
    }
    const size_t ws_bytes = r->att_ws_need;
    if (ws_bytes) {
        enum rt_err e = grow(r, &r->att_ws, ws_bytes, "the attention workspace", true);
        if (e) return e;
    }
    void *ws = ws_bytes ? r->att_ws.p : NULL;
    if (r->capturing) {
        RT_K_TRY(k_attention_at(static_cast<uint16_t *>(out), out_stride,
                                static_cast<const uint16_t *>(q), q_stride,
                                static_cast<const uint16_t *>(k_cache),
                                static_cast<const uint16_t *>(v_cache), M, r->d_step + 1, n_heads,
                                n_kv_heads, hd, T_cap, sliding_window, ws, r->att_ws.bytes,
                                r->stream));
        return RT_ERR_NONE;
    }
    RT_K_TRY(k_attention(static_cast<uint16_t *>(out), out_stride,
                         static_cast<const uint16_t *>(q), q_stride,
                         static_cast<const uint16_t *>(k_cache),
                         static_cast<const uint16_t *>(v_cache), M, start_pos, n_heads,
                         n_kv_heads, hd, T_cap, sliding_window, ws, r->att_ws.bytes, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_silu_mul(void *ctx, int rank, void *out, const void *gate_up, int M, int I)
{
    struct cuda_rank *r = R(ctx, rank);
    if (take_pending(r, gate_up, M, 2 * (size_t)I))
        return release_sums(r, k_silu_mul_acc(static_cast<uint16_t *>(out),
                                              static_cast<float *>(r->ws.p), M, I, r->stream),
                            M, 2 * (size_t)I);
    SETTLE(r);
    RT_K_TRY(k_silu_mul(static_cast<uint16_t *>(out), static_cast<const uint16_t *>(gate_up), M,
                        I, r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_gather_rows(void *ctx, int rank, void *dst, const void *src,
                                    const int32_t *rows, int n, int width)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    if (n < 1) return RT_ERR_NONE;
    void *drows = NULL;
    enum rt_err e = upload_small(r, rows, (size_t)n * sizeof(int32_t), 0, &drows);
    if (e) return e;
    RT_K_TRY(k_gather_rows(static_cast<uint16_t *>(dst), static_cast<const uint16_t *>(src),
                           static_cast<int32_t *>(drows), n, width, r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
    return RT_ERR_NONE;
}

static enum rt_err cuda_scatter_add_rows(void *ctx, int rank, void *y, const void *src,
                                         const int32_t *rows, const float *weights, int n,
                                         int width)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    if (n < 1) return RT_ERR_NONE;
    const size_t rb = ((size_t)n * sizeof(int32_t) + 255) / 256 * 256;
    void *drows = NULL, *dw = NULL;
    enum rt_err e = grow(r, &r->small, rb + (size_t)n * sizeof(float), "small upload buffer", false);
    if (e) return e;
    e = upload_small(r, rows, (size_t)n * sizeof(int32_t), 0, &drows);
    if (!e) e = upload_small(r, weights, (size_t)n * sizeof(float), rb, &dw);
    if (e) return e;
    RT_K_TRY(k_scatter_add_rows(static_cast<uint16_t *>(y), static_cast<const uint16_t *>(src),
                                static_cast<int32_t *>(drows), static_cast<float *>(dw), n, width,
                                r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
    return RT_ERR_NONE;
}

/* Whether a graph is being recorded on any rank's stream (graph_begin .. graph_end). */
static bool any_capturing(const struct cuda_ctx *c)
{
    for (int i = 0; i < c->world; ++i)
        if (c->r[i].capturing) return true;
    return false;
}

/* Sum the ranks' buffers in place, enqueued on each rank's stream (no host wait); every rank
 * receives the same bits. Up to K_ALLREDUCE_MAX_BYTES per rank (decode rows, short prompts)
 * with k_allreduce_sum over peer memory when every pair of GPUs has peer access: fp32 sums in
 * rank order, rounded once, as the CPU backend does; a decode step that contains only these can
 * be recorded into graphs. Otherwise NCCL (ring/tree order, fp16 rounded between steps), which
 * is never called while a graph is being recorded: NCCL capture from one thread driving several
 * GPUs fails and leaves the communicators unusable (the same failure as pie-project/pie
 * issue 499 on 2 H200s), so the recording is refused instead. */
static enum rt_err cuda_all_reduce(void *vctx, void *const *bufs, int world, size_t n,
                                   enum rt_buf_type type)
{
    struct cuda_ctx *c = static_cast<struct cuda_ctx *>(vctx);
    if (world <= 1) return RT_ERR_NONE; /* nothing to read: a pending o / down stays pending */
    for (int i = 0; i < world; ++i) SETTLE(R(vctx, i));
    const int f16 = type != RT_BUF_F32;
    bool p2p = c->ar != NULL;
    for (int i = 0; i < world && p2p; ++i) p2p = k_allreduce_fits(c->ar, bufs[i], n, f16);
    if (p2p) {
        for (int i = 0; i < world; ++i) {
            struct cuda_rank *r = R(vctx, i);
            RT_K_TRY(k_allreduce_sum(c->ar, i, bufs[i], n, f16, r->stream));
        }
        return RT_ERR_NONE;
    }
    if (any_capturing(c)) {
        qs_log_debug("all-reduce of %zu values: NCCL cannot be recorded into a graph here", n);
        return RT_ERR_DEVICE;
    }
    ncclResult_t nr = ncclGroupStart();
    for (int i = 0; i < world && nr == ncclSuccess; ++i)
        nr = ncclAllReduce(bufs[i], bufs[i], n, type == RT_BUF_F32 ? ncclFloat32 : ncclFloat16,
                           ncclSum, c->comm[i], c->r[i].stream);
    const ncclResult_t ne = ncclGroupEnd();
    if (nr == ncclSuccess) nr = ne;
    if (nr != ncclSuccess) {
        qs_log_error(__func__, "NCCL all-reduce of %zu %s values over %d GPUs: %s (%s)", n,
                     type == RT_BUF_F32 ? "fp32" : "fp16", world, ncclGetErrorString(nr),
                     ncclGetLastError(NULL));
        return RT_ERR_DEVICE;
    }
    return RT_ERR_NONE;
}


// --- decode-step graph (rt.h graph_begin / graph_end / graph_replay) ------------------------------

static enum rt_err cuda_graph_begin(void *ctx, int rank)
{
    const struct cuda_ctx *c = static_cast<struct cuda_ctx *>(ctx);
    if (c->world > 1 && !c->ar) { /* the all-reduces would be NCCL calls: see cuda_all_reduce */
        qs_log_debug("decode graphs: off at world size %d without the peer-to-peer all-reduce",
                     c->world);
        return RT_ERR_DEVICE;
    }
    /* While any stream of this thread is being captured, allocations, frees and graph
     * instantiation are not permitted and would end the capture (thread-local mode): so the
     * first begin of a round, before any capture, prepares every rank, and the last end
     * instantiates every rank's graph (cuda_graph_end). */
    if (!any_capturing(c))
        for (int i = 0; i < c->world; ++i) {
            struct cuda_rank *ri = R(ctx, i);
            if (!ri->d_step) RT_CUDA_TRY(cudaMalloc(&ri->d_step, 2 * sizeof(int32_t)));
            if (!ri->h_step) RT_CUDA_TRY(cudaMallocHost(&ri->h_step, 2 * sizeof(int32_t)));
            if (ri->gexec) RT_CUDA_TRY(cudaGraphExecDestroy(ri->gexec));
            if (ri->graph) RT_CUDA_TRY(cudaGraphDestroy(ri->graph));
            ri->gexec = NULL;
            ri->graph = NULL;
        }
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r); /* before the recording: nothing pending crosses its edges */
    RT_CUDA_TRY(cudaStreamBeginCapture(r->stream, cudaStreamCaptureModeThreadLocal));
    r->capturing = true;
    r->gexec_gen = r->buf_gen;
    return RT_ERR_NONE;
}

static enum rt_err cuda_graph_end(void *ctx, int rank, bool ok)
{
    struct cuda_ctx *c = static_cast<struct cuda_ctx *>(ctx);
    struct cuda_rank *r = R(ctx, rank);
    cudaGraph_t g = NULL;
    /* a pending linear's finish belongs in the recording; after a failed one nothing ran (ws
     * is still zero), so the pending state is simply dropped */
    const enum rt_err es = ok ? settle(r) : RT_ERR_NONE;
    if (es) ok = false;
    r->pend_y = NULL;
    if (!ok) r->replan = false; /* the recording is discarded */
    r->capturing = false;
    const cudaError_t ce = cudaStreamEndCapture(r->stream, &g); /* always: leave capture mode */
    enum rt_err ret = RT_ERR_NONE;
    if (ce != cudaSuccess || !ok || !g) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        if (ce != cudaSuccess)
            qs_log_debug("GPU %d: decode graph capture failed: %s", r->device, cudaGetErrorString(ce));
        if (ok) ret = RT_ERR_DEVICE;
        if (es) ret = es;
    } else {
        r->graph = g;
    }
    if (any_capturing(c)) return ret;
    for (int i = 0; i < c->world; ++i) { /* the last capture has ended: instantiate them all */
        struct cuda_rank *ri = R(ctx, i);
        if (!ri->graph) continue;
        size_t n_nodes = 0;
        cudaGraphGetNodes(ri->graph, NULL, &n_nodes);
        const cudaError_t ie = cudaGraphInstantiate(&ri->gexec, ri->graph, 0);
        cudaGraphDestroy(ri->graph);
        ri->graph = NULL;
        if (ie != cudaSuccess) {
            ri->gexec = NULL;
            cudaGetLastError();
            qs_log_debug("GPU %d: decode graph instantiation failed: %s", ri->device,
                         cudaGetErrorString(ie));
            ret = RT_ERR_DEVICE;
            continue;
        }
        qs_log_debug("GPU %d: decode step recorded as a CUDA graph (%zu nodes)", ri->device, n_nodes);
    }
    return ret;
}

static bool cuda_graph_ready(void *ctx, int rank)
{
    const struct cuda_rank *r = R(ctx, rank);
    return r->gexec && r->gexec_gen == r->buf_gen;
}

static enum rt_err cuda_graph_replay(void *ctx, int rank, int32_t token, int pos, bool *done)
{
    struct cuda_rank *r = R(ctx, rank);
    *done = false;
    SETTLE(r); /* the recording's first linear adds into ws */
    if (!cuda_graph_ready(ctx, rank)) return RT_ERR_NONE;
    /* the previous replay's copy has run: the caller downloaded its logits (a stream sync) */
    r->h_step[0] = token;
    r->h_step[1] = pos;
    RT_CUDA_TRY(cudaMemcpyAsync(r->d_step, r->h_step, 2 * sizeof(int32_t), cudaMemcpyHostToDevice,
                                r->stream));
    RT_CUDA_TRY(cudaGraphLaunch(r->gexec, r->stream));
    *done = true;
    if (r->replan) { /* recorded while learning plain_w (settle): the next step records again */
        r->replan = false;
        ++r->buf_gen;
    }
    return RT_ERR_NONE;
}

// --- device sampling (rt.h sample) -------------------------------------------------------------

static enum rt_err cuda_sample(void *ctx, int rank, const float *logits, int vocab_size,
                               const struct rt_pick *pick, int32_t *id)
{
    struct cuda_rank *r = R(ctx, rank);
    SETTLE(r);
    const size_t seen_bytes = ((size_t)vocab_size + 7) / 8, need = 16 + seen_bytes;
    if (r->pick_bytes < need) {
        RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
        cudaFree(r->d_pick);
        cudaFreeHost(r->h_pick);
        r->d_pick = r->h_pick = NULL;
        r->pick_bytes = 0;
        void *d = NULL;
        enum rt_err e = dev_alloc("the sampling buffers", r->device, need, &d);
        if (e) return e;
        r->d_pick = static_cast<unsigned char *>(d);
        RT_CUDA_TRY(cudaMallocHost(&r->h_pick, need));
        r->pick_bytes = need;
    }
    const uint8_t *seen = NULL;
    const struct rt_sample_params *p = &pick->p;
    if (p->repeat_penalty != 1.0f) { /* the history changes every token: send it along */
        memcpy(r->h_pick + 16, pick->seen, seen_bytes);
        RT_CUDA_TRY(cudaMemcpyAsync(r->d_pick + 16, r->h_pick + 16, seen_bytes,
                                    cudaMemcpyHostToDevice, r->stream));
        seen = r->d_pick + 16;
    }
    const struct k_sample_params kp = {p->temperature, p->top_k, p->top_p, p->min_p,
                                       p->repeat_penalty};
    RT_K_TRY(k_sample(reinterpret_cast<int32_t *>(r->d_pick), NULL, logits, vocab_size, seen, &kp,
                      p->temperature > 0.0f ? pick->u : 0.0, r->stream));
    RT_CUDA_TRY(cudaMemcpyAsync(r->h_pick, r->d_pick, sizeof(int32_t), cudaMemcpyDeviceToHost,
                                r->stream));
    RT_CUDA_TRY(cudaStreamSynchronize(r->stream));
    memcpy(id, r->h_pick, sizeof(int32_t));
    return RT_ERR_NONE;
}

// --- copies between ranks (rt.h copy_ranks) ----------------------------------------------------

/* src (src_rank's device) -> dst (dst_rank's device) on dst_rank's stream after the work queued
 * on src_rank's stream (an event), and src_rank's later work after the copy (another event):
 * over NVLink when the all-reduce kernel enabled peer access, else staged by the driver. Not
 * while a graph is being recorded (events across the ranks' captures would join them). */
static enum rt_err cuda_copy_ranks(void *vctx, int dst_rank, void *dst, int src_rank,
                                   const void *src, size_t bytes)
{
    const struct cuda_ctx *c = static_cast<const struct cuda_ctx *>(vctx);
    if (any_capturing(c)) {
        qs_log_error(__func__, "a copy between ranks %d and %d cannot be recorded in a graph",
                     src_rank, dst_rank);
        return RT_ERR_DEVICE;
    }
    SETTLE(R(vctx, dst_rank));
    SETTLE(R(vctx, src_rank));
    if (bytes == 0) return RT_ERR_NONE;
    struct cuda_rank *s = R(vctx, src_rank);
    if (src_rank == dst_rank) {
        RT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
        return RT_ERR_NONE;
    }
    RT_CUDA_TRY(cudaEventRecord(s->ev, s->stream));
    struct cuda_rank *d = R(vctx, dst_rank);
    RT_CUDA_TRY(cudaStreamWaitEvent(d->stream, s->ev, 0));
    RT_CUDA_TRY(cudaMemcpyPeerAsync(dst, d->device, src, s->device, bytes, d->stream));
    RT_CUDA_TRY(cudaEventRecord(d->ev, d->stream));
    RT_CUDA_TRY(cudaStreamWaitEvent(s->stream, d->ev, 0));
    return RT_ERR_NONE;
}

static const struct rt_backend_ops cuda_ops = {
    "cuda", 2, 2, cuda_destroy, cuda_load_weights, cuda_tensor_ptr, cuda_alloc, cuda_free,
    cuda_upload, cuda_download, cuda_zero, cuda_embed, cuda_rmsnorm, cuda_linear_w4,
    cuda_linear_f16, cuda_lm_head, cuda_router, cuda_rope, cuda_kv_store, cuda_attention,
    cuda_silu_mul, cuda_gather_rows, cuda_scatter_add_rows, cuda_all_reduce,
    cuda_graph_begin, cuda_graph_end, cuda_graph_ready, cuda_graph_replay, cuda_sample,
    cuda_copy_ranks, 2048, cuda_rope_kv_store,
};

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

enum rt_err rt_cuda_backend_create(const struct rt_opts *opts, int world_size,
                                   struct rt_backend *out)
{
    out->ops = NULL;
    out->ctx = NULL;
    const int first = opts ? opts->cuda_device : 0;
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev < 1) {
        qs_log_error(__func__, "no usable CUDA GPU (%s); run with --device cpu",
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        cudaGetLastError();
        return RT_ERR_NO_DEVICE;
    }
    if (world_size < 1 || world_size > RT_CUDA_MAX_RANKS || first < 0 || first + world_size > n_dev) {
        qs_log_error(__func__, "%d rank(s) starting at GPU %d need GPUs %d..%d, but %d GPU(s) "
                     "are visible", world_size, first, first, first + world_size - 1, n_dev);
        return RT_ERR_NO_DEVICE;
    }
    for (int i = 0; i < world_size; ++i) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, first + i) != cudaSuccess) {
            qs_log_error(__func__, "cannot query GPU %d", first + i);
            return RT_ERR_NO_DEVICE;
        }
        if (p.major * 10 + p.minor < RT_CUDA_MIN_CC) {
            qs_log_error(__func__, "GPU %d (%s) has compute capability %d.%d; qshard's kernels need "
                         "8.0 or newer (Ampere, Ada, Hopper); run with --device cpu",
                         first + i, p.name, p.major, p.minor);
            return RT_ERR_NO_DEVICE;
        }
    }
    struct cuda_ctx *c = static_cast<struct cuda_ctx *>(calloc(1, sizeof(*c)));
    if (!c) {
        qs_log_error(__func__, "out of host memory");
        return RT_ERR_NOMEM;
    }
    c->world = world_size;
    k_set_pdl(!env_zero("QSHARD_PDL")); /* QSHARD_PDL=0: plain launches (A/B runs) */
    for (int i = 0; i < world_size; ++i) c->r[i].device = -1;
    for (int i = 0; i < world_size; ++i) {
        struct cuda_rank *r = &c->r[i];
        r->device = first + i;
        cudaError_t e = cudaSetDevice(r->device);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming);
        cublasStatus_t be = CUBLAS_STATUS_SUCCESS;
        if (e == cudaSuccess) be = cublasCreate(&r->cublas);
        if (e == cudaSuccess && be == CUBLAS_STATUS_SUCCESS) be = cublasSetStream(r->cublas, r->stream);
        if (e == cudaSuccess && be == CUBLAS_STATUS_SUCCESS) { /* probe now, never inside a capture */
            (void)k_w4a16_caps_query(&r->caps);
            /* QSHARD_WGMMA=0: dequant + cuBLAS above M = 64 (A/B) */
            r->caps.allow_wgmma = !env_zero("QSHARD_WGMMA");
        }
        if (e != cudaSuccess || be != CUBLAS_STATUS_SUCCESS) {
            qs_log_error(__func__, "GPU %d: cannot create its stream, event or cuBLAS handle (%s, cuBLAS %d)",
                         r->device, cudaGetErrorString(e), (int)be);
            cuda_destroy(c);
            return RT_ERR_DEVICE;
        }
    }
    if (world_size > 1) {
        setenv("NCCL_NVLS_ENABLE", "0", 0); /* see the header comment; a user's setting wins */
        int devs[RT_CUDA_MAX_RANKS];
        for (int i = 0; i < world_size; ++i) devs[i] = first + i;
        const ncclResult_t nr = ncclCommInitAll(c->comm, world_size, devs);
        if (nr != ncclSuccess) {
            qs_log_error(__func__, "NCCL: cannot create communicators for GPUs %d..%d: %s (%s)",
                         first, first + world_size - 1, ncclGetErrorString(nr),
                         ncclGetLastError(NULL));
            for (int i = 0; i < world_size; ++i) c->comm[i] = NULL;
            cuda_destroy(c);
            return RT_ERR_DEVICE;
        }
        /* small all-reduces over peer memory (rt_opts.p2p_allreduce; QSHARD_P2P_ALLREDUCE=0:
         * NCCL only, for A/B runs) */
        const bool want = (opts ? opts->p2p_allreduce : 1) && !env_zero("QSHARD_P2P_ALLREDUCE");
        if (want && k_allreduce_supported(world_size, devs) &&
            k_allreduce_create(world_size, devs, &c->ar) != K_ERR_NONE)
            c->ar = NULL; /* reported there; NCCL serves every all-reduce */
        qs_log_debug("all-reduce: %s", c->ar ? "peer-to-peer kernel up to 256 KB per rank, NCCL above"
                                              : "NCCL (no peer access, more than 8 ranks, or "
                                                "QSHARD_P2P_ALLREDUCE=0)");
    }
    out->ops = &cuda_ops;
    out->ctx = c;
    return RT_ERR_NONE;
}

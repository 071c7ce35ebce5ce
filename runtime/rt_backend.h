/*
 * rt_backend.h - the interfaces under the rank-local model (runtime/rt.h): the backend that runs
 * one rank's ops (runtime/rt_cpu.c on host memory with the plain-C references, runtime/rt_cuda.cu
 * on one GPU) and the communicator through which the ranks' collectives go (runtime/rt_comm.c:
 * the ranks of one process; runtime/rt_comm_mpi.c, rt_mpi.h: one rank per process over MPI and
 * NCCL).
 *
 * Who includes it: the model (rt_model.c), the executor (rt_exec.c), the backends, the
 * communicators, and tests that wrap or emulate a backend. Not for other callers: they use rt.h.
 */
#ifndef QS_RT_BACKEND_H
#define QS_RT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h" /* struct fmt_shard, struct fmt_tensor */
#include "rt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RT_MAX_GRAPHS 16 /* decode-graph keys per backend */

/* Return the rt_err of expr unless it is RT_ERR_NONE (the runtime's files; the failing call has
 * reported it). */
#define RT_TRY(expr)                     \
    do {                                 \
        enum rt_err rt_try_err_ = (expr); \
        if (rt_try_err_ != RT_ERR_NONE)  \
            return rt_try_err_;          \
    } while (0)

/* --- communicator ------------------------------------------------------------------------------ */

/* Element type of a collective's buffer. */
enum rt_dtype { RT_DTYPE_F32 = 0, RT_DTYPE_F16 = 1 };

struct rt_comm;

/*
 * The collectives of one rank. Every rank of a group makes the same sequence of calls with the
 * same sizes. Data buffers are "backend addresses" of this rank (host memory for a CPU backend,
 * this rank's GPU memory for CUDA, which must be current) and the work is ordered on `stream`
 * (the rank's cudaStream_t; NULL on the CPU). Every call returns RT_ERR_NONE or an error it has
 * reported; RT_ERR_PEER means the group was aborted by another rank (which reported why).
 */
struct rt_comm_ops {
    const char *name; /* "local-cpu", "local-cuda", ... */
    /* buf[n] summed over the ranks in place, every rank receiving the same bits (rank order,
     * fp32, rounded once to the type: ref_allreduce_sum; NCCL above the peer-to-peer size may
     * round in its own order). */
    enum rt_err (*all_reduce)(struct rt_comm *c, void *buf, size_t n, enum rt_dtype t,
                              void *stream);
    /* Whether all_reduce of (buf, n, t) may be recorded into a CUDA graph of this rank. */
    bool (*can_capture)(struct rt_comm *c, const void *buf, size_t n, enum rt_dtype t);
    /* Rank r's send[bytes] lands at recv + r * bytes on rank 0 (recv [world][bytes], used on
     * rank 0 only), in rank 0's memory; complete on every rank when the call returns (a later
     * write of send cannot race it). */
    enum rt_err (*gather)(struct rt_comm *c, const void *send, size_t bytes, void *recv,
                          void *stream);
    /* Host memory: rank 0's buf[bytes] copied into every other rank's buf. */
    enum rt_err (*broadcast)(struct rt_comm *c, void *buf, size_t bytes);
    /* Optional (NULL: broadcast): the same, where a rank other than 0 may wait without a time
     * limit (a follower waiting for the next step: a server may be idle for hours). A
     * communicator whose collectives have a deadline (MPI, rt_mpi.h) bounds every other call. */
    enum rt_err (*broadcast_wait)(struct rt_comm *c, void *buf, size_t bytes);
    /* Give up: every rank waiting in, or later entering, a collective of this group returns
     * RT_ERR_PEER. Safe from any rank at any time; idempotent. */
    void (*abort)(struct rt_comm *c);
    /* Free this rank's endpoint (the group goes with the last one). */
    void (*destroy)(struct rt_comm *c);
};

struct rt_comm {
    const struct rt_comm_ops *ops;
    int rank, world;
    void *impl;
};

/*
 * The communicator of `world` ranks in this process, one endpoint per rank (eps[world]): host
 * collectives through shared memory and a barrier; with device RT_DEVICE_CUDA the data
 * collectives run on GPUs first_gpu .. first_gpu + world - 1 (our peer-to-peer kernel up to
 * 256 KB per rank when every pair has peer access and `p2p`, else NCCL from communicators made
 * with ncclCommInitAll; gather by peer copies). Errors: RT_ERR_NOMEM, RT_ERR_THREAD,
 * RT_ERR_DEVICE (NCCL set-up), RT_ERR_NO_DEVICE (CUDA asked for in a build without it).
 */
enum rt_err rt_comm_local_create(int world, enum rt_device device, int first_gpu, bool p2p,
                                 struct rt_comm **eps);

/* --- backend -------------------------------------------------------------------------------- */

/*
 * One rank's ops. The model issues every op through this table and never dereferences
 * activation or weight pointers itself: they are "backend addresses" (host memory on the CPU,
 * device memory on CUDA). Only download brings data back to the host. On CUDA the ops are
 * asynchronous on the rank's stream and download synchronises. Each op returns RT_ERR_NONE or
 * an error it has reported. Shapes use the names of kernels/ref.h; the CPU backend calls the
 * matching ref_* function, and the semantics (argument order included) are exactly those of
 * that function.
 *
 * Element types of the buffers the model allocates (through alloc):
 *   act   activations x, o, qkv, att, gate_up, act, expert rows: act_size bytes per element,
 *         fp32 on the CPU (4), fp16 on CUDA (2). Passed as void *; the model offsets them only
 *         by whole rows/heads, in elements, scaled by act_size.
 *   f32   residual stream h [M][H], accumulators acc [M][N] (deferred split-K sums), router
 *         logits [M][E], lm_head logits [M][V_r], inv_freq: always fp32 (float *).
 *   i32   token ids and positions of the batch (uploaded by the model before the ops that read
 *         them, so a recorded graph reads them at replay).
 *   kv    KV cache pools [n_blocks][n_kv_heads][block_size][hd] per layer (kernels/ref.h
 *         "paged KV cache"): kv_size bytes per element.
 * Row strides are in elements.
 *
 * Deferred split-K ("acc" arguments): a W4A16 linear given acc (fp32 [M][N], zero on entry) adds
 * its sums there instead of writing y; the op the model names as its consumer (norm's x_acc,
 * act_mul's gate_up_acc, rope_kv_store's x_acc) reads them unrounded and zeroes acc again. The
 * model asks for it only where linear_acc_ok and M <= defer_max_m; the result of the pair is
 * that of the plain ops without the fp16 rounding of the linear's output.
 */
enum rt_buf_type { RT_BUF_F32 = 0, RT_BUF_ACT = 1 };

/* A run of consecutive batch rows of one sequence (host). */
struct rt_attn_run {
    int row0, n; /* rows [row0, row0 + n) of the chunk */
    int p0;      /* position of row0 */
    int table;   /* its block table: row `table` of rt_attn_rows.tables */
};

/* The paged view of one chunk's attention: per row its position and block table (backend i32
 * arrays, uploaded by the model before the ops that read them), and the runs on the host. */
struct rt_attn_rows {
    const int32_t *pos;       /* [M] */
    const int32_t *row_table; /* [M] table row of each row */
    const int32_t *tables;    /* [n_tables][table_stride] block ids */
    int table_stride, block_size;
    int max_keys;             /* >= pos + 1 of every row (host bound; the context when recording) */
    const struct rt_attn_run *runs; /* host [n_runs], in row order */
    int n_runs;
    const float *alibi;       /* f32 [n_heads] ALiBi slopes of this rank's heads (MPT), or NULL */
    float scale;              /* q.k multiplier; 0: 1 / sqrt(hd) (Gemma: query_pre_attn_scalar^-0.5) */
    float softcap;            /* > 0: scores soft-capped (Gemma 2; kernels/ref.h ref_att_score) */
};

struct rt_backend_ops {
    const char *name;  /* "cpu", "cuda" */
    size_t act_size;   /* bytes per activation element */
    size_t kv_size;    /* bytes per KV cache element */
    int default_batch; /* rows per forward when rt_opts.max_batch <= 0 (0: 512). CUDA: 2048,
                          where the W4A16 prefill path (dequant + cuBLAS) costs 0.5-0.65x of
                          cuBLAS fp16 per 256-512 rows but 0.9x at 2048 (docs/BENCHMARKS.md,
                          "Prompt chunk size") */
    int defer_max_m;   /* most rows a linear may leave as fp32 sums (0: never) */
    bool alibi;        /* attention takes ALiBi slopes (rt_attn_rows.alibi) and act_mul an
                          activation divisor (MPT); false: the model refuses such a file */
    void (*destroy)(void *ctx);

    /* weights: make shard `s` usable (CPU: nothing; CUDA: one device allocation filled from the
     * mapping), then translate tensors to backend addresses */
    enum rt_err (*load_weights)(void *ctx, const struct fmt_shard *s);
    const void *(*tensor_ptr)(void *ctx, const struct fmt_tensor *t);

    /* Optional: device memory free and in all, bytes (CUDA: cudaMemGetInfo), to size the KV
     * cache from a share of what the weights and activations left. */
    enum rt_err (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    /* memory: zero-filled allocation of `bytes`; free accepts NULL */
    enum rt_err (*alloc)(void *ctx, size_t bytes, void **out);
    void (*free)(void *ctx, void *p);
    /* host -> backend; the host buffer may be reused when it returns */
    enum rt_err (*upload)(void *ctx, void *dst, const void *src_host, size_t bytes);
    /* backend -> host, after every op queued before it */
    enum rt_err (*download)(void *ctx, void *dst_host, const void *src, size_t bytes);
    enum rt_err (*zero)(void *ctx, void *dst, size_t bytes);

    /* f32 out[M][H] = embedding rows tokens[m] - row_begin of table fp16 [V_r][H] times scale,
     * zero rows for ids another rank holds (ref_embed). tokens: i32 [M] backend memory. */
    enum rt_err (*embed)(void *ctx, float *out, const uint16_t *table, const int32_t *tokens,
                         int M, int64_t row_begin, int V_r, int H, float scale);
    /* f32 x[n] = cap * tanh(x / cap) in place (ref_softcap; Gemma 2's final logits). */
    enum rt_err (*softcap)(void *ctx, float *x, size_t n, float cap);
    /* Norm `kind` (ref_rmsnorm for RT_NORM_RMS, ref_layernorm for RT_NORM_LAYER with bias b or
     * NULL; b is NULL for RMS), act out, f32 residual: residual and x (or x_acc): residual += x,
     * out = norm(residual) (x_acc: the f32 sums, zeroed after); residual and neither:
     * out = norm(residual); no residual: out = norm(x); norm(h) includes * w (+ b). out NULL
     * (with residual and x or x_acc): the residual add alone, no norm (w, b unused: a parallel
     * residual's attention output). */
    enum rt_err (*norm)(void *ctx, enum rt_norm kind, void *out, float *residual, const void *x,
                        float *x_acc, const float *w, const float *b, int M, int H, float eps);
    /* ref_w4a16_linear: act y[M][N] = act x[M][K] . W + bias (packed DESIGN 4 tensors, bias f32
     * or NULL); with acc (y unused): acc[M][N] += x . W + bias (deferred split-K). */
    enum rt_err (*linear_w4)(void *ctx, const void *x, const uint8_t *qweight,
                             const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                             int M, int K, int N, int G, void *y, float *acc);
    /* Whether linear_w4 of this (K, N, G) can take acc at up to defer_max_m rows (decided once
     * per linear when the model binds it). */
    bool (*linear_acc_ok)(void *ctx, int K, int N, int G);
    /* ref_linear_f16: act y[M][N] = act x[M][K] . W^T + bias, W fp16 [N][K] (unquantised
     * linears of modules_to_not_convert). */
    enum rt_err (*linear_f16)(void *ctx, const void *x, const uint16_t *W, const float *bias,
                              int M, int K, int N, void *y);
    /* lm_head: f32 logits[M][N] = act x[M][K] . W^T, W fp16 [N][K] (N = V_r). */
    enum rt_err (*lm_head)(void *ctx, const void *x, const uint16_t *W, int M, int K, int N,
                           float *logits);
    /* router: f32 y[M][N] = act x[M][K] . W^T, W fp32 [N][K] (ref_linear_f32, N = E). */
    enum rt_err (*router)(void *ctx, const void *x, const float *W, int M, int K, int N,
                          float *y);
    /* On the fused qkv rows x of M tokens (act, rows of row_stride, [q (n_q heads) | k (n_kv) |
     * v (n_kv)]): ref_rope of the n_q + n_kv q and k heads at positions pos[m] (i32 backend
     * [M]), then pool row slots[m] (i32 backend [M]; < 0: not stored) of each kv head of
     * k_pool / v_pool (the paged layout of kernels/ref.h, blocks of block_size rows) = the
     * rotated k / the v of row m. With x_acc (f32 [M][row_stride], the qkv linear's deferred
     * sums): the rows are read from x_acc, written to x rounded, and x_acc zeroed. */
    enum rt_err (*rope_kv_store)(void *ctx, void *x, float *x_acc, int M, int n_q, int n_kv,
                                 int hd, size_t row_stride, const int32_t *pos,
                                 const float *inv_freq, void *k_pool, void *v_pool,
                                 const int32_t *slots, int block_size);
    /* Per-head RMSNorm of the q and k heads of the fused qkv rows (ref_head_rmsnorm; Qwen3
     * q_norm / k_norm before RoPE): in place on x (act rows of row_stride), or with x_acc (the
     * qkv linear's deferred f32 sums, which rope_kv_store reads next) in place on x_acc. wq,
     * wk: f32 [hd]. NULL in a backend that lacks it: a qk_norm architecture is refused at open. */
    enum rt_err (*head_norm)(void *ctx, void *x, float *x_acc, int M, int n_q, int n_kv, int hd,
                             size_t row_stride, const float *wq, const float *wk, float eps);
    /* ref_attention_paged (causal, GQA, sliding window <= 0 = none; scores as a's alibi, scale
     * and softcap say, struct ref_att_score) of the M rows of `a`: act
     * out, act q, the pools. While a graph is being recorded every run has one row and the
     * backend must read everything but the host fields at replay. */
    enum rt_err (*attention)(void *ctx, void *out, size_t out_stride, const void *q,
                             size_t q_stride, const void *k_pool, const void *v_pool, int M,
                             const struct rt_attn_rows *a, int n_heads, int n_kv_heads, int hd,
                             int sliding_window);
    /* Copy pool block src to block dst in both pools (block_elems = n_kv * block_size * hd
     * elements each): copy-on-write of a shared block. */
    enum rt_err (*kv_copy_block)(void *ctx, void *k_pool, void *v_pool, int src, int dst,
                                 size_t block_elems);
    /* MLP activation `kind`: gated (ref_silu_mul for RT_ACT_SILU, ref_gelu_tanh_mul for
     * RT_ACT_GELU_TANH): act out[M][I] = act(gate) *
     * up, act gate_up [M][2I] = [gate | up]; plain (ref_gelu for RT_ACT_GELU): out[M][I] =
     * act(gate_up[M][I]). With gate_up_acc (f32, the gate_up linear's deferred sums, the same
     * shape) the input is read from it and it is zeroed. act_scale: NULL, or f32 [I]: out[m][i]
     * /= act_scale[i] after the activation (AutoAWQ's ScaledActivation of MPT's GELU; only
     * backends with `alibi` take it). */
    enum rt_err (*act_mul)(void *ctx, enum rt_act kind, void *out, const void *gate_up,
                           float *gate_up_acc, const float *act_scale, int M, int I);
    /* MoE helpers on act rows of `width` elements: dst[i] = src[rows[i]], and
     * y[rows[i]] += weights[i] * src[i]. rows, weights: host [n]. */
    enum rt_err (*gather_rows)(void *ctx, void *dst, const void *src, const int32_t *rows, int n,
                               int width);
    /* Act-order input (ref_gather_cols): act dst[m][j] = src[m][perm[j]] for M rows of K;
     * perm: backend i32 [K] (a weight tensor), a permutation of 0..K-1. */
    enum rt_err (*gather_cols)(void *ctx, void *dst, const void *src, const int32_t *perm, int M,
                               int K);
    enum rt_err (*scatter_add_rows)(void *ctx, void *y, const void *src, const int32_t *rows,
                                    const float *weights, int n, int width);
    /* The collectives of this rank, through the communicator the backend was made with (the
     * backend supplies its stream and element types): buf[n] of `type` summed over the ranks;
     * send[bytes] gathered into rank 0's recv [world][bytes]. */
    enum rt_err (*all_reduce)(void *ctx, void *buf, size_t n, enum rt_buf_type type);
    enum rt_err (*gather)(void *ctx, const void *send, size_t bytes, void *recv);

    /* Optional (NULL in backends without it; all four or none): decode steps recorded as
     * replayable graphs, one per key in [0, RT_MAX_GRAPHS) (the model's batch-size buckets).
     * Between graph_begin and graph_end the ops are recorded, not run; they read the step's
     * tokens, positions, cache slots and block tables from the i32 buffers the model uploads
     * before each step, so the recording does not depend on them.
     * graph_end(ok = false) discards the recording. graph_ready: a valid recording exists (one
     * was made and no buffer it uses has been reallocated since). graph_replay runs it; *done =
     * false (nothing run) when not ready. */
    enum rt_err (*graph_begin)(void *ctx, int key);
    enum rt_err (*graph_end)(void *ctx, int key, bool ok);
    bool (*graph_ready)(void *ctx, int key);
    enum rt_err (*graph_replay)(void *ctx, int key, bool *done);

    /* Optional: ids[i] = the next token chosen on the device from row i of f32 logits (rows of
     * row_stride floats, [>= n_vocab] each) following rt_sample.h with picks[i] (host), or -1
     * when no logit of the row is finite (kernels.h k_sample), for i < n. Synchronises (the ids
     * are on the host on return). */
    enum rt_err (*sample)(void *ctx, const float *logits, size_t row_stride, int n, int n_vocab,
                          const struct rt_pick *picks, int32_t *ids);
};

struct rt_backend {
    const struct rt_backend_ops *ops;
    void *ctx;
};

/*
 * Backend constructors for rank `rank` of `comm` (its collectives go through comm; NULL: a
 * single rank). Call them on the thread that runs the rank. On failure out->ops is NULL.
 * rt_cpu_backend_create: n_threads of opts for this rank (rt_exec divides the total);
 * RT_ERR_NOMEM, RT_ERR_THREAD. rt_cuda_backend_create: GPU opts->cuda_device + rank;
 * RT_ERR_NO_DEVICE (built without CUDA, no such GPU, compute capability < 8.0: the message
 * names the GPU), RT_ERR_DEVICE, RT_ERR_NOMEM.
 */
enum rt_err rt_cpu_backend_create(const struct rt_opts *opts, struct rt_comm *comm,
                                  struct rt_backend *out);
enum rt_err rt_cuda_backend_create(const struct rt_opts *opts, struct rt_comm *comm,
                                   struct rt_backend *out);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_BACKEND_H */

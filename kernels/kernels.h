/*
 * kernels.h - extern "C" launchers of the qshard CUDA kernels (kernels/k_*.cu).
 *
 * Who calls it: the CUDA runtime backend (runtime/rt_cuda.cu), the GPU tests
 * (tests/gpu_test_*.cu), the kernel benchmark (kernels/k_bench.cu, `qshard bench kernel`) and the
 * experiments in kernels/lab/.
 * C types only, so it compiles as C11 and as C++; the stream is `struct CUstream_st *`, which is
 * exactly what `cudaStream_t` is (NULL = the legacy default stream).
 *
 * Conventions (same names as kernels/ref.h):
 *   - fp16 tensors are passed as `uint16_t *` (IEEE binary16 bits); fp32 as `float *`.
 *   - All pointers are device pointers unless a comment says otherwise; row-major; no aliasing
 *     between inputs and outputs unless a comment says "in place".
 *   - Every launcher checks its preconditions and returns K_ERR_SHAPE / K_ERR_ARG (reported once
 *     through qs_log_error with the numbers) without launching; it never allocates and never
 *     synchronises with the host (except with `make DEBUG_SYNC=1`; k_allreduce_create is a
 *     set-up call that allocates). CUDA API/launch failures are not statuses:
 *     K_CUDA_CHECK aborts with the expression, file:line and device (docs/DESIGN.md, "Errors").
 *   - Math sources: the plain-C references in kernels/ref.h are the definition; each launcher's
 *     comment names its reference.
 *
 * Tests: `make test-gpu` (tests/run_gpu_tests.sh: build/gpu_test_w4a16, build/gpu_test_ops), the
 * router without a GPU: build/test_route (`make test`). Bench: `qshard bench kernel w4a16`.
 */
#ifndef QS_KERNELS_H
#define QS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "ref.h" /* struct ref_att_score */

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* == cudaStream_t's pointee */

/* --- errors ------------------------------------------------------------------------------ */

#define K_ERR_LIST(X)                                                         \
    X(K_ERR_NONE, 0, "ok")                                                    \
    X(K_ERR_SHAPE, 1, "shape not supported by this kernel")                   \
    X(K_ERR_ARG, 2, "invalid argument (NULL pointer, bad variant, bad value)") \
    X(K_ERR_WORKSPACE, 3, "workspace missing or too small")                   \
    X(K_ERR_UNSUPPORTED, 4, "not supported by these GPUs")

enum k_err {
#define K_X_ENUM(name, val, msg) name = val,
    K_ERR_LIST(K_X_ENUM)
#undef K_X_ENUM
};

/* Short English text for a k_err value ("unknown k_err" for anything else). */
const char *k_err_str(enum k_err e);

/*
 * Programmatic Dependent Launch for the kernels that support it (the W4A16 split-K route and
 * k_w4a16_acc_finish): on (1, the default) they are launched with
 * cudaLaunchAttributeProgrammaticStreamSerialization on sm_90+, so their weight loads overlap
 * the end of the previous kernel in the stream (each waits for it before reading activations
 * or the workspace; CUDA programming guide, "Programmatic Dependent Launch"); off (0): plain
 * launches (A/B measurements: the runtime's options, `qshard bench kernel --no-pdl`).
 * Process-wide; set it before launching, not concurrently with launches.
 */
void k_set_pdl(int on);
int k_get_pdl(void);

/* Launch trace: on (1), the W4A16 launchers print each launch's shape (slice, slices, blocks,
 * shared memory, PDL) to stderr, for tuning (`qshard bench kernel --trace`); off (0, the
 * default): silent. Process-wide, as k_set_pdl. */
void k_set_trace(int on);
int k_get_trace(void);

/* --- W4A16 linear (kernels/k_w4a16.cu, router kernels/k_w4a16_route.c) --------------------- */

/*
 * y[M, N] (fp16) = x[M, K] (fp16) . W[K, N] + bias[N], fp32 accumulation, where
 * W[k][n] = (q[k][n] - z[k/G][n]) * s[k/G][n] is read from the DESIGN 4 packed layout:
 *   qweight  K*N/2 bytes   (4.1, FMT_LAYOUT_W4_MMA_T16X64)
 *   qzeros   (K/G)*N/2 bytes (4.3, FMT_LAYOUT_Z4_T64)
 *   scales   (K/G)*N fp16  (4.2, FMT_LAYOUT_S_T64)
 *   bias     [N] fp32 or NULL
 * Reference: ref_w4a16_linear (kernels/ref.h). The dequantised weight is rounded to fp16 once
 * ((q - z) exact, times s), products and sums in fp32 (tensor cores, fp16 inputs).
 *
 * Two calls per linear: k_w4a16_route_pick() picks the kernel from (M, N, K, G), the epilogue the
 * caller wants and the device's capabilities, in plain C (kernels/k_w4a16_route.c, tested
 * without a GPU by tests/test_route.c), and says which buffers it needs; k_w4a16_launch() runs
 * exactly that route (no fallback at launch). Kernels (the numbers: docs/BENCHMARKS.md, "GPU
 * kernels (H200)"; the experiments that lost: kernels/lab/README.md):
 *   SPLITK    v5, M <= 64: split-K slices x 64-column n-tiles so every SM streams weights;
 *             each lane loads its 16 bytes of a packed tile straight into registers 8 tiles
 *             ahead, dequantises them (lop3 + fp16 magic numbers) and runs the transposed
 *             product on mma.sync m16n8k16; the slices add their fp32 partial sums into an
 *             accumulator with vector reductions and nothing waits for the last one
 *             (deferred split-K; at 9 <= M <= 16 the 4 warps of a block pre-sum 4 slices in
 *             shared memory). Epilogue Y: then k_w4a16_acc_finish writes y and zeroes the
 *             workspace (BENCHMARKS "Decode after the split-K tail work": v9, 2.98x cuBLAS
 *             fp16 per 7B layer at M = 1). Epilogue ACC: the sums stay for the consumer.
 *             Weight loads start before the previous kernel ends (k_set_pdl).
 *   WGMMA     v7, sm_90a only: 128 x 128 block tiles, each 64-k step's weight tile dequantised
 *             once into shared memory and multiplied with wgmma.mma_async, split-K through the
 *             workspace at M <= 256 (BENCHMARKS "Prompts of 65-128 rows": 0.54-0.85x of
 *             cuBLAS fp16 per layer, 1.0-1.9x faster than DQ_GEMM there).
 *   DQ_GEMM   k_w4a16_dequant into `scratch` (fp16 [K, N]), cuBLAS fp16 GEMM (fp32 compute),
 *             bias added after (one more fp16 rounding): the prefill path (0.94-1.01x of
 *             cuBLAS fp16 per layer at M = 4096).
 *   FALLBACK  v4, M <= 64: stream-K (the tile stream cut into equal chunks, one per warp,
 *             fixed 36 KB of shared memory), any G: the group sizes SPLITK cannot take.
 * Auto (the table in k_w4a16_route.c, first row that fits):
 *   epilogue ACC: M <= 64 SPLITK (where v5 takes G; else no route: K_ERR_UNSUPPORTED);
 *   epilogue Y:   M <= 64 SPLITK, else FALLBACK; 65 <= M < K_W4A16_DQ_GEMM_MIN_M WGMMA where
 *                 caps->wgmma && caps->allow_wgmma; else DQ_GEMM.
 */
#define K_W4A16_SPLITK_MAX_M 64   /* SPLITK and FALLBACK take at most this many rows */
#define K_W4A16_DQ_GEMM_MIN_M 129 /* auto: DQ_GEMM from here on (WGMMA below it) */

enum k_w4a16_kernel {
    K_W4A16_KERNEL_AUTO = 0, /* k_w4a16_route_pick: the table decides; never in a route */
    K_W4A16_KERNEL_SPLITK = 1,
    K_W4A16_KERNEL_WGMMA = 2,
    K_W4A16_KERNEL_DQ_GEMM = 3,
    K_W4A16_KERNEL_FALLBACK = 4,
};

enum k_w4a16_epilogue {
    K_W4A16_EPI_Y = 0,   /* y[M, N] fp16 = x . W + bias */
    K_W4A16_EPI_ACC = 1, /* acc[M, N] fp32 += x . W + bias, left for the consumer kernel */
};

/* What the router needs to know about the GPU (k_w4a16_caps_query fills it for the current
 * device; tests fill it by hand). */
struct k_w4a16_caps {
    int wgmma;       /* 1: WGMMA runs here: compute capability 9.0 and the image CUDA loads is
                        this binary's sm_90a code */
    int allow_wgmma; /* the caller's switch (1 from k_w4a16_caps_query): 0 keeps auto off WGMMA
                        and refuses it forced (A/B runs) */
    int smem_optin;  /* bytes of shared memory one block may opt in to
                        (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on sm_90) */
};

/* The SPLITK instance and slicing for one M (host arithmetic, k_w4a16_route.c; the launcher
 * adds the occupancy-dependent slice count). */
struct k_w4a16_splitk_plan {
    int mb8;         /* token blocks of 8 rows: 1 (M <= 8), 2 (<= 16), 4 (<= 32), 8 (<= 64) */
    int scale_after; /* 1 (mb8 <= 2): the mma on exact q - z, scales applied per group in fp32 */
    int gtc;         /* G/16 when it divides 8 (1, 2, 4), 0 when it is a multiple of 8 */
    int unit;        /* slices are multiples of max(8, G/16) k-tiles (whole groups, unrolls) */
    int kc_max;      /* the largest slice (k-tiles) that fits the activation budget and smem */
    int smem_max;    /* the dynamic shared memory the blocks may take (<= caps->smem_optin) */
};

/* A route: what k_w4a16_launch runs, and the buffers it needs. */
struct k_w4a16_route {
    enum k_w4a16_kernel kernel;     /* never AUTO */
    enum k_w4a16_epilogue epilogue;
    int M, N, K, G;
    struct k_w4a16_splitk_plan splitk; /* SPLITK only */
    size_t workspace_bytes; /* workspace the launch needs (0: none): SPLITK/Y, FALLBACK: the sums
                               and counters of k_w4a16_workspace_bytes(M, N); WGMMA: the same for
                               its split-K, sized for the whole auto band (128 rows) so that one
                               buffer serves every prompt chunk there (0 above 256 rows: no
                               split) */
    size_t scratch_bytes;   /* DQ_GEMM: K*N*2 (the fp16 weight), else 0 */
};

/* Name of a kernel ("auto", "splitk", "wgmma", "dq_gemm", "fallback"; NULL for other values)
 * and the kernel of a name (K_W4A16_KERNEL_AUTO .. FALLBACK, -1 for an unknown name). */
const char *k_w4a16_kernel_name(enum k_w4a16_kernel k);
int k_w4a16_kernel_parse(const char *name);

/*
 * The route of one linear: kernel K_W4A16_KERNEL_AUTO takes the first row of the table that
 * fits (see above); any other value forces that kernel where it can run the shape. Plain C,
 * no device call; caps from k_w4a16_caps_query (or by hand).
 * Errors (reported once through qs_log_error with the numbers; *out untouched): K_ERR_SHAPE
 * (the shape is not a W4A16 linear: M, N, K >= 1, K % 16, N % 64, G >= 16, G % 16, K % G; or M
 * past the forced kernel's limit), K_ERR_ARG (NULL, unknown kernel or epilogue),
 * K_ERR_UNSUPPORTED (no route: the forced kernel cannot give this epilogue, needs wgmma the
 * caps do not have or allow, or (SPLITK) cannot take G on this device; auto ACC where SPLITK
 * cannot take G). Probe with k_w4a16_acc_available to get no report.
 */
int k_w4a16_route_pick(struct k_w4a16_route *out, int M, int N, int K, int G,
                  enum k_w4a16_epilogue epilogue, enum k_w4a16_kernel kernel,
                  const struct k_w4a16_caps *caps);

/* 1 when the ACC epilogue exists for this linear (N, K, G) at every M in 1..max_m on a device
 * with these caps (so a runtime may decide at load time that the consumer of this linear
 * reads fused sums), 0 otherwise (also for max_m > K_W4A16_SPLITK_MAX_M or a bad shape).
 * Logs nothing. */
int k_w4a16_acc_available(int max_m, int N, int K, int G, const struct k_w4a16_caps *caps);

/* Fill *caps for the current device (compute capability, sm_90a image: cudaFuncGetAttributes,
 * no launch, so it may run inside a stream capture; shared-memory opt-in); allow_wgmma = 1.
 * Errors: K_ERR_ARG (NULL). CUDA errors abort. */
int k_w4a16_caps_query(struct k_w4a16_caps *caps);

/* One packed linear's device tensors (layout above). */
struct k_w4a16_weight {
    const uint8_t *qweight; /* K*N/2 bytes */
    const uint8_t *qzeros;  /* (K/G)*N/2 bytes */
    const uint16_t *scales; /* (K/G)*N fp16 */
    const float *bias;      /* [N] fp32 or NULL */
};

struct cublasContext; /* == cublasHandle_t's pointee */

/* The buffers a route may need (route->workspace_bytes, scratch_bytes; NULL / 0 where not). */
struct k_w4a16_bufs {
    void *workspace;        /* zeroed once by the caller (cudaMemset), left zeroed by every
                               launch; 16-byte aligned; one workspace must not serve launches
                               that may run at the same time (different streams) */
    size_t workspace_bytes;
    void *scratch;          /* DQ_GEMM's fp16 weight; contents do not matter */
    size_t scratch_bytes;
    struct cublasContext *cublas; /* DQ_GEMM: a handle bound to the launch's stream
                                     (cublasSetStream) */
};
/*
 * Run `route` (from k_w4a16_route_pick, for the current device) on x [M, K] fp16 and the weight w:
 * epilogue Y writes y [M, N] fp16 (8-byte aligned for SPLITK; acc ignored); epilogue ACC adds
 * x . W + bias into acc [M, N] fp32 (16-byte aligned; zero, or partial sums to add to; y
 * ignored), and whoever reads acc next (k_w4a16_acc_finish, k_rmsnorm_acc, k_silu_mul_acc,
 * k_rope_acc, k_rope_kv_store: a later kernel in the stream) turns the sums into fp16 and
 * zeroes acc again; acc may be the start of an idle k_w4a16_workspace_bytes(M, N) workspace.
 * The order of the fp32 additions of SPLITK, FALLBACK and split WGMMA varies from run to run
 * (atomics). Every pointer check comes before the first launch.
 * Errors: K_ERR_ARG (NULL route, x, weight tensor or output; misaligned output or workspace;
 * DQ_GEMM without cuBLAS; a route made for another device's shared memory), K_ERR_WORKSPACE
 * (workspace or scratch missing or smaller than the route says), K_ERR_UNSUPPORTED (WGMMA on a
 * device without it). cuBLAS failures abort like CUDA ones.
 */
int k_w4a16_launch(const struct k_w4a16_route *route, const uint16_t *x,
                   const struct k_w4a16_weight *w, uint16_t *y, float *acc,
                   const struct k_w4a16_bufs *bufs, struct CUstream_st *stream);

/* Bytes of workspace for M rows and N columns: M*N fp32 partial sums plus one uint32 counter
 * per 64-column tile, rounded up to 256 (0 for M < 1 or N < 64). */
size_t k_w4a16_workspace_bytes(int M, int N);

/* y[M, N] = fp16(acc[M, N]) (round to nearest), then acc = 0: the consumer of an ACC route
 * when the next op reads fp16 (SPLITK's Y epilogue is the ACC route and this). y 8-byte, acc
 * 16-byte aligned. Errors: K_ERR_SHAPE (M, N < 1, N % 4), K_ERR_ARG (NULL, misaligned). */
int k_w4a16_acc_finish(uint16_t *y, float *acc, int M, int N, struct CUstream_st *stream);

/*
 * Dequantise a packed linear into a plain fp16 matrix w[K, N] row-major (DQ_GEMM, tests, the
 * benchmark's cuBLAS baseline): w[k][n] = fp16((q - z) * s). Same inputs as the linear.
 * Reference: ref_dequant_w4 (then rounded to fp16). Errors: K_ERR_SHAPE, K_ERR_ARG.
 */
int k_w4a16_dequant(const uint8_t *qweight, const uint8_t *qzeros, const uint16_t *scales,
                    uint16_t *w, int N, int K, int G, struct CUstream_st *stream);

/* y[M, N] (fp16) += bias[N] (fp32), in fp32 then rounded once (the epilogue of cuBLAS linears).
 * Errors: K_ERR_SHAPE (M, N < 1), K_ERR_ARG (NULL). */
int k_bias_add(uint16_t *y, const float *bias, int M, int N, struct CUstream_st *stream);

/* --- MoE helpers (kernels/k_moe.cu) ------------------------------------------------------- */

/* Router logits y[M, N] (fp32) = x[M, K] (fp16) . W^T, W fp32 [N, K] (Mixtral's
 * block_sparse_moe.gate, N = experts), fp32 math in increasing k (reference ref_linear_f32).
 * One warp per output. Errors: K_ERR_SHAPE, K_ERR_ARG. */
int k_router(float *y, const uint16_t *x, const float *W, int M, int K, int N,
             struct CUstream_st *stream);

/* dst[i][:] = src[rows[i]][:] for i < n, rows of `width` fp16; rows: device [n].
 * Errors: K_ERR_SHAPE (n, width < 1), K_ERR_ARG (NULL). */
int k_gather_rows(uint16_t *dst, const uint16_t *src, const int32_t *rows, int n, int width,
                  struct CUstream_st *stream);

/* Act-order input gather: dst[m][j] = src[m][perm[j]], fp16 rows of K (kernels/k_perm.cu;
 * reference ref_gather_cols); perm: device [K], a permutation. Errors: K_ERR_SHAPE, K_ERR_ARG. */
int k_gather_cols(uint16_t *dst, const uint16_t *src, const int32_t *perm, int M, int K,
                  struct CUstream_st *stream);

/* y[rows[i]][:] += weights[i] * src[i][:] (fp32 math, fp16 storage), i in order, so rows may
 * repeat (one block walks all i for its columns). rows, weights: device [n].
 * Errors: K_ERR_SHAPE, K_ERR_ARG. */
int k_scatter_add_rows(uint16_t *y, const uint16_t *src, const int32_t *rows,
                       const float *weights, int n, int width, struct CUstream_st *stream);

/* --- normalisation, elementwise, embedding, sampling ------------------------------------- */

/*
 * RMSNorm with the fused residual add (reference ref_rmsnorm; transformers LlamaRMSNorm), one
 * block per row. The residual stream is fp32 so it cannot overflow fp16 between layers:
 *   x != NULL, residual != NULL: residual[m] += x[m] (fp16 -> fp32), out = w * norm(residual[m])
 *   x == NULL, residual != NULL: out = w * norm(residual[m]) (first layer: residual = embedding)
 *   x != NULL, residual == NULL: out = w * norm(x[m])
 * norm(h) = h * rsqrt(mean(h^2) + eps), mean in fp32 (tree sum). out: [M, H] fp16; x: [M, H]
 * fp16; residual: [M, H] fp32, in place; w: [H] fp32. Errors: K_ERR_SHAPE (M < 1, H < 1),
 * K_ERR_ARG (out or w NULL, both x and residual NULL, eps < 0).
 */
int k_rmsnorm(uint16_t *out, float *residual, const uint16_t *x, const float *w, int M, int H,
              float eps, struct CUstream_st *stream);

/* k_rmsnorm with x given as fp32 sums x_acc[M, H] (an ACC route), which it reads and
 * zeroes: residual[m] += x_acc[m] (no fp16 rounding of x), x_acc[m] = 0, out = w *
 * norm(residual[m]). residual is required. Errors: K_ERR_SHAPE, K_ERR_ARG (NULL, eps < 0). */
int k_rmsnorm_acc(uint16_t *out, float *residual, float *x_acc, const float *w, int M, int H,
                  float eps, struct CUstream_st *stream);

/*
 * LayerNorm with the fused residual add (reference ref_layernorm; torch.nn.LayerNorm as
 * transformers' Falcon uses it), the three modes of k_rmsnorm, or with x_acc (fp32 sums, read
 * and zeroed; residual required) in place of x:
 *   out = (h - mean(h)) * rsqrt(var(h) + eps) * w + b,  h = residual[m] (after += x) or x[m],
 * mean and biased variance in fp32 (three passes over the row: sum, centred squares, output). b may be NULL (no bias). One block
 * per row. Errors: K_ERR_SHAPE (M < 1, H < 1), K_ERR_ARG (out or w NULL, no input, both x and
 * x_acc, x_acc without residual, eps < 0).
 */
int k_layernorm(uint16_t *out, float *residual, const uint16_t *x, float *x_acc, const float *w,
                const float *b, int M, int H, float eps, struct CUstream_st *stream);

/* residual[i] += x[i] (fp16 -> fp32) or += x_acc[i] (fp32 sums, zeroed after), n values: the
 * residual add without a norm (reference ref_residual_add; a parallel residual's attention
 * output). Errors: K_ERR_SHAPE (n < 1), K_ERR_ARG (residual NULL, not exactly one input). */
int k_residual_add(float *residual, const uint16_t *x, float *x_acc, size_t n,
                   struct CUstream_st *stream);

/*
 * Per-head RMSNorm of the q and k heads of fused qkv rows, in place (Qwen3 q_norm / k_norm;
 * reference ref_head_rmsnorm): row m (row_stride elements) is [q (n_q heads) | k (n_kv) | v];
 * each q head becomes wq * h * rsqrt(mean(h^2) + eps), each k head the same with wk; mean in
 * fp32. acc == NULL: x fp16 [M, row_stride] in place; else the fp32 sums acc [M, row_stride]
 * of an ACC route in place (x untouched; the next kernel, k_rope_kv_store_paged, reads acc).
 * One warp per head. wq, wk: [hd] fp32. Errors: K_ERR_SHAPE (M, n_q, hd < 1, n_kv < 0,
 * row_stride < (n_q + n_kv) * hd, hd > 1024), K_ERR_ARG (NULL, eps < 0).
 */
int k_head_rmsnorm(uint16_t *x, float *acc, int M, int n_q, int n_kv, int hd, size_t row_stride,
                   const float *wq, const float *wk, float eps, struct CUstream_st *stream);

/*
 * RoPE, transformers rotate_half form (reference ref_rope), in place on fp16: rows m = 0..M-1
 * at x + m*row_stride (fp16 elements), n_heads heads of hd values each, pairs (i, i + hd/2):
 * a = pos[m] * inv_freq[i] (fp32 product), x' = x cos a - x[i+hd/2] sin a, ... computed in fp32
 * with the accurate sincosf. inv_freq: [hd/2] fp32 from ref_rope_inv_freq (default, linear,
 * llama3 scaling are all in inv_freq). pos: [M] int32 device. q and k heads of a fused qkv row
 * are adjacent, so one call with n_heads = nq_r + nkv_r rotates both.
 * Errors: K_ERR_SHAPE (hd odd or < 2, M < 1, n_heads < 1, row_stride < n_heads*hd), K_ERR_ARG.
 */
int k_rope(uint16_t *x, int M, int n_heads, int hd, size_t row_stride, const int32_t *pos,
           const float *inv_freq, struct CUstream_st *stream);

/* k_rope from fp32 sums (an ACC route): x[m][c] (fp16, rows of row_stride) = the first
 * n_heads*hd columns of acc[m] rotated as k_rope does (from the unrounded sums), the rest of
 * the row (the v heads of a fused qkv row) rounded as they are; acc[M, row_stride] fp32 is
 * zeroed. Errors: as k_rope, K_ERR_SHAPE also for row_stride > INT_MAX. */
int k_rope_acc(uint16_t *x, float *acc, int M, int n_heads, int hd, size_t row_stride,
               const int32_t *pos, const float *inv_freq, struct CUstream_st *stream);

/* RoPE and the KV-cache store of a fused qkv row in one kernel (k_rope on the nq + nkv q and k
 * heads, then k_kv_store of the rotated k heads and the nkv v heads that follow them):
 *   x[m] = [q (nq heads) | k (nkv) | v (nkv) | ...] fp16, rows of row_stride; acc NULL: read
 *   from x (as k_rope), else from the fp32 sums acc[M, row_stride] (an ACC route; the
 *   whole row is written to x rounded, acc zeroed, as k_rope_acc);
 *   k_cache / v_cache [nkv][T_cap][hd] fp16: row pos[m] of each kv head = the rotated k / the v
 *   of row m; rows with pos[m] outside [0, T_cap) are not stored (the caller checks positions).
 * pos: [M] int32 device. Same math as k_rope (reference ref_rope, then the copy of
 * ref_attention's cache layout). Errors: K_ERR_SHAPE (hd odd or < 2, M, nq, nkv, T_cap < 1,
 * row_stride < (nq + 2 nkv) hd or > INT_MAX), K_ERR_ARG (NULL). */
int k_rope_kv_store(uint16_t *x, float *acc, int M, int nq, int nkv, int hd, size_t row_stride,
                    const int32_t *pos, const float *inv_freq, uint16_t *k_cache,
                    uint16_t *v_cache, int T_cap, struct CUstream_st *stream);

/* out[M, I] = silu(gate) * up, gate_up[M, 2I] = [gate | up] fp16, math in fp32 (reference
 * ref_silu_mul). Errors: K_ERR_SHAPE (M < 1, I < 1), K_ERR_ARG (NULL). */
int k_silu_mul(uint16_t *out, const uint16_t *gate_up, int M, int I, struct CUstream_st *stream);

/* k_silu_mul from fp32 sums gate_up_acc[M, 2I] (an ACC route), which it zeroes.
 * Errors: K_ERR_SHAPE (M < 1, I < 1), K_ERR_ARG (NULL). */
int k_silu_mul_acc(uint16_t *out, float *gate_up_acc, int M, int I, struct CUstream_st *stream);

/* out[i] = gelu(x[i]), exact erf form (reference ref_gelu; torch.nn.GELU()), for n fp16 values,
 * fp32 math; or from fp32 sums x_acc[n] (x NULL; an ACC route), which it zeroes. With div
 * (device f32 [I], n a multiple of I): out[i] = gelu(x[i]) / div[i % I] (MPT's activation
 * scales, ref_div_cols). The plain MLP activation of Falcon and MPT. Errors: K_ERR_SHAPE (n < 1,
 * n not a multiple of I >= 1 with div), K_ERR_ARG (out NULL, not exactly one of x and x_acc). */
int k_gelu(uint16_t *out, const uint16_t *x, float *x_acc, size_t n, const float *div, int I,
           struct CUstream_st *stream);

/* out[M, I] = gelu_tanh(gate) * up (Gemma's GeGLU; reference ref_gelu_tanh_mul), gate_up[M, 2I]
 * = [gate | up] fp16, or fp32 sums gate_up_acc (gate_up NULL; an ACC route), which it zeroes;
 * fp32 math. Errors: K_ERR_SHAPE (M < 1, I < 1), K_ERR_ARG (out NULL, not exactly one input). */
int k_gelu_tanh_mul(uint16_t *out, const uint16_t *gate_up, float *gate_up_acc, int M, int I,
                    struct CUstream_st *stream);

/* x[i] = cap * tanh(x[i] / cap) for n fp32 values in place (reference ref_softcap; Gemma 2's
 * final logits). Errors: K_ERR_SHAPE (n < 1, cap <= 0), K_ERR_ARG (NULL). */
int k_softcap(float *x, size_t n, float cap, struct CUstream_st *stream);

/*
 * Vocab-parallel embedding lookup into the fp32 residual stream (reference ref_embed):
 * out[m][:] = table[tokens[m] - row_begin][:] when row_begin <= tokens[m] < row_begin + V_r,
 * else 0, times scale (1; Gemma: sqrt(hidden)). table fp16 [V_r, H]; tokens [M] int32 device;
 * out [M, H] fp32.
 * Errors: K_ERR_SHAPE (M < 1, H < 1, V_r < 1), K_ERR_ARG (NULL, row_begin < 0).
 */
int k_embed(float *out, const uint16_t *table, const int32_t *tokens, int M, int64_t row_begin,
            int V_r, int H, float scale, struct CUstream_st *stream);

/*
 * Greedy sampling on the GPU (reference ref_argmax), one block per row: ids[m] = index of the
 * largest logits[m*row_stride + i] over i < min(n, vocab_size); ids >= vocab_size are padding
 * and never win, NaNs are skipped, ties go to the lowest id, -1 when there is no candidate.
 * logits fp32; ids [M] int32 device. Errors: K_ERR_SHAPE (M < 1, n < 1, row_stride < n),
 * K_ERR_ARG (NULL, vocab_size < 1).
 */
int k_argmax(int32_t *ids, const float *logits, int M, int n, size_t row_stride, int vocab_size,
             struct CUstream_st *stream);

/* Sampling parameters of runtime/rt_sample.h (struct rt_sample_params without the seed). */
struct k_sample_params {
    float temperature;    /* 0: greedy; else > 0 */
    int32_t top_k;        /* 0: off */
    float top_p;          /* (0, 1]; 1: off */
    float min_p;          /* [0, 1]; 0: off */
    float repeat_penalty; /* > 0; 1: off */
};

/*
 * Next-token choice on the GPU with the semantics of runtime/rt_sample.h, steps 1-7 (repetition
 * penalty, greedy, temperature, top-k, top-p, min-p, the inverse-CDF draw in id order), one
 * block. Reference: rt_sampler_next / rt_sampler_candidates (runtime/rt_sample.c); the two agree
 * except where u or p falls within rounding of a cumulative boundary (sums in another order).
 * The few-survivor fast path (top-k <= 1024, or a peaked row under top-p) sums in the CPU's
 * order; the general path's top-p masses are added with shared-memory atomics in a varying
 * order, so there two runs can differ where p * sum is within rounding of a boundary.
 * logits: fp32 [vocab_size] device (ids >= vocab_size are never read); seen: device history
 * bitmap [ceil(vocab_size/8)] (bit id%8 of byte id/8, as rt_sampler.seen), may be NULL when
 * repeat_penalty == 1; u: the draw in [0, 1) from the caller's PRNG (unused when greedy).
 * out_id: one int32 device, -1 when no logit is finite; keep: NULL, or device [vocab_size] bytes
 * set to 1 for the ids that survive steps 1-6 (tests). The caller keeps the history and the PRNG.
 * Errors: K_ERR_SHAPE (vocab_size < 1 or > 2^30), K_ERR_ARG (NULL, parameter out of range, u
 * outside [0, 1), repeat_penalty != 1 without seen).
 */
int k_sample(int32_t *out_id, uint8_t *keep, const float *logits, int vocab_size,
             const uint8_t *seen, const struct k_sample_params *p, double u,
             struct CUstream_st *stream);

/* One row of k_sample_rows: its parameters, draw and history bitmap (device, or NULL). */
struct k_sample_row {
    struct k_sample_params p;
    double u;            /* [0, 1); unused when greedy */
    const uint8_t *seen; /* as k_sample's */
};

/* Bytes of the argument buffers k_sample_rows needs for n rows (host staging and device). */
size_t k_sample_rows_args_bytes(int n);

/*
 * k_sample of n rows in one launch (one block per row, the same device code, so each row's id
 * is k_sample's for that row): out_ids[i] from logits + i * row_stride (fp32, the first
 * vocab_size read), rows[i] (host) its parameters. The per-row arguments go through h_args
 * (host, pinned for an asynchronous copy; unchanged until the stream has passed this call) and
 * d_args (device), each at least k_sample_rows_args_bytes(n) bytes, 16-byte aligned. A decode
 * step of many sequences thus costs one launch instead of one per sequence.
 * Errors: K_ERR_SHAPE (n outside [1, 65535], vocab_size outside [1, 2^30], row_stride <
 * vocab_size), K_ERR_ARG (NULL or misaligned buffer; a row's parameters as k_sample, naming the
 * row).
 */
int k_sample_rows(int32_t *out_ids, const float *logits, size_t row_stride, int n,
                  int vocab_size, const struct k_sample_row *rows, void *h_args, void *d_args,
                  struct CUstream_st *stream);

/* --- all-reduce across the GPUs of one process (kernels/k_allreduce.cu) ---------------------- */

#define K_ALLREDUCE_MAX_WORLD 8
#define K_ALLREDUCE_MAX_BYTES (256 * 1024) /* per rank and call: decode rows, not prefill */

struct k_allreduce; /* peer-mapped receive areas and flags of `world` GPUs */

/*
 * Set up the peer-to-peer all-reduce of `world` GPUs devices[0..world-1] (rank r = devices[r]):
 * enables peer access between every pair and allocates on each GPU a receive area of
 * 2 x world x K_ALLREDUCE_MAX_BYTES and its flags (zeroed). The current device is unchanged.
 * Errors: K_ERR_SHAPE (world outside [2, K_ALLREDUCE_MAX_WORLD]), K_ERR_UNSUPPORTED (a pair
 * without peer access: the caller uses NCCL), K_ERR_ARG (NULL). CUDA failures abort.
 */
int k_allreduce_create(int world, const int *devices, struct k_allreduce **out);

/* Whether k_allreduce_create can serve devices[0..world-1]: world in [2,
 * K_ALLREDUCE_MAX_WORLD] and peer access between every pair. Logs nothing. */
int k_allreduce_supported(int world, const int *devices);
void k_allreduce_destroy(struct k_allreduce *ar);

/* Whether k_allreduce_sum takes n values (fp16 when f16, else fp32) at buf: at most
 * K_ALLREDUCE_MAX_BYTES, a multiple of 16 bytes, buf 16-byte aligned. */
int k_allreduce_fits(const struct k_allreduce *ar, const void *buf, size_t n, int f16);

/*
 * Rank `rank`'s part of the all-reduce (sum) of buf [n] (fp16 when f16, else fp32; on that
 * rank's GPU, which must be current) in place, enqueued on `stream` (that GPU's): one block that
 * pushes buf to every peer, waits for every peer's buffer and writes the sum in rank order,
 * fp32, rounded once (ref_allreduce_sum), so every rank ends with the same bits. Every rank must
 * make the same sequence of calls (same n), each on its own stream; the calls of one round wait
 * for each other on the GPUs (a rank that never comes makes the others trap after ~10 s), so
 * they can be recorded into CUDA graphs and replayed. Errors: K_ERR_ARG (NULL, rank out of
 * range), K_ERR_SHAPE (!k_allreduce_fits).
 */
int k_allreduce_sum(struct k_allreduce *ar, int rank, void *buf, size_t n, int f16,
                    struct CUstream_st *stream);

/* --- attention (kernels/k_attention.cu) ---------------------------------------------------- */

/*
 * Write M new key/value rows into the fp16 KV cache at positions start_pos .. start_pos+M-1:
 * k_cache[h][start_pos + m][:] = k[m*row_stride + h*hd + :] (same for v), h < n_kv_heads.
 * k_cache, v_cache: [n_kv_heads, T_cap, hd] fp16. Errors: K_ERR_SHAPE (start_pos + M > T_cap,
 * M < 1, start_pos < 0, hd < 1), K_ERR_ARG (NULL).
 */
int k_kv_store(uint16_t *k_cache, uint16_t *v_cache, const uint16_t *k, const uint16_t *v,
               size_t row_stride, int M, int start_pos, int n_kv_heads, int hd, int T_cap,
               struct CUstream_st *stream);

/*
 * Causal attention with GQA over the KV cache, flash-style (online softmax, no [T, T] matrix):
 * prefill (M > 1) and decode (M = 1) alike (reference ref_attention, same arguments, fp16
 * tensors, fp32 math). Query row m is at position p = start_pos + m and attends to keys
 * [max(0, p - sliding_window + 1), p] (sliding_window <= 0: [0, p]); head h reads kv head
 * h / (n_heads / n_kv_heads). q row m at q + m*q_stride: [n_heads][hd] (rotated); out likewise
 * with out_stride. hd 64, 96, 128 or 256. M >= 16 with hd 64 or 128 (prefill; q and the caches 16-byte aligned, q_stride
 * a multiple of 8, out_stride even, as the runtime's buffers are): FlashAttention-2 on tensor cores (Dao
 * 2023; one block per 64 rows and head, K/V tiles of 64 keys in shared memory, mma.sync with
 * fp32 accumulation, P rounded to fp16 for P V); otherwise (decode) one block per (row, head,
 * key split) on CUDA cores (the caches 16-byte aligned): with a workspace ws of
 * k_attention_workspace_bytes(M, n_heads, hd, T_cap) bytes (16-byte aligned, zero-filled before
 * its first use; every call leaves it ready for the next) a row's keys are cut into up to 64
 * chunks of >= 128 keys, so decode at long contexts reads the KV cache from ~4 blocks per SM
 * (Flash-Decoding, Dao et al. 2023), and the partial results merge in split order (the same
 * bits at every run); ws NULL: one block per (row, head). A ws shared by calls must not be
 * used by two at once (one stream). The split count follows the current device's SM count, so
 * size ws with that device current (each GPU of a TP group sizes its own).
 * Errors: K_ERR_SHAPE (hd not 64/128/256, n_heads % n_kv_heads, start_pos + M > T_cap, M < 1),
 * K_ERR_ARG (NULL, ws misaligned), K_ERR_WORKSPACE (ws smaller than the split needs).
 */
int k_attention(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                const uint16_t *k_cache, const uint16_t *v_cache, int M, int start_pos,
                int n_heads, int n_kv_heads, int hd, int T_cap, int sliding_window, void *ws,
                size_t ws_bytes, struct CUstream_st *stream);
/* Bytes of the split-KV workspace that every k_attention / k_attention_at call of up to M rows
 * of n_heads heads of hd dims over a cache of T_cap rows needs (the most any row count <= M and
 * position takes: one buffer serves prompt chunks and decode); 0: no split (calls then take ws
 * NULL as well). Counters per (row, head), then partials [rows][n_heads][splits][hd + 2] fp32. */
size_t k_attention_workspace_bytes(int M, int n_heads, int hd, int T_cap);

/*
 * k_kv_store and k_attention with the start position read on the device at run time
 * (start_pos_dev: one int32 in device memory), so one captured CUDA graph serves every decode
 * step. The host cannot check start_pos + M <= T_cap here (the caller must, as rt_model_forward
 * does): on the device, kv rows past the cache are dropped and query positions are clamped to
 * the last cache row, so a bad position gives wrong numbers, never an out-of-bounds access.
 * Errors: as above without the start_pos checks, K_ERR_ARG also for start_pos_dev NULL.
 */
int k_kv_store_at(uint16_t *k_cache, uint16_t *v_cache, const uint16_t *k, const uint16_t *v,
                  size_t row_stride, int M, const int32_t *start_pos_dev, int n_kv_heads, int hd,
                  int T_cap, struct CUstream_st *stream);
int k_attention_at(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                   const uint16_t *k_cache, const uint16_t *v_cache, int M,
                   const int32_t *start_pos_dev, int n_heads, int n_kv_heads, int hd, int T_cap,
                   int sliding_window, void *ws, size_t ws_bytes, struct CUstream_st *stream);

/* --- paged KV cache (kernels/k_attention.cu, k_rope.cu) ------------------------------------- */

/*
 * The paged layout of kernels/ref.h ("paged KV cache"): per layer a pool
 * [n_blocks][n_kv_heads][block_size][hd] fp16; flat cache row (slot) s = block * block_size +
 * row; a sequence's block table [>= ceil(len / block_size)] int32 lists its blocks in position
 * order. All index arrays are int32 in device memory, read at run time, so one captured CUDA
 * graph serves every decode step of a batch size (the runtime uploads them before each step).
 * A pool holds fewer than 2^32 rows (n_blocks * n_kv_heads * block_size; 512 GiB at hd 64): the
 * attention kernels count pool rows in 32 bits. The contiguous entry points above run the same
 * kernels, their cache being the pool of one block of block_size = T_cap rows.
 */

/* k_rope_kv_store with the store going to the paged pool: the rotated k heads and the v heads of
 * row m go to pool row slots[m] (rows with slots[m] < 0 are rotated but not stored: batch
 * padding). Same math and bits as k_rope_kv_store. Errors: K_ERR_SHAPE (as k_rope_kv_store,
 * block_size < 1), K_ERR_ARG (NULL). */
int k_rope_kv_store_paged(uint16_t *x, float *acc, int M, int nq, int nkv, int hd,
                          size_t row_stride, const int32_t *pos, const float *inv_freq,
                          uint16_t *k_pool, uint16_t *v_pool, const int32_t *slots,
                          int block_size, struct CUstream_st *stream);

/* k_kv_store into the paged pool: pool row (slots[m], h) = k[m*row_stride + h*hd ..] (v
 * likewise), slots[m] < 0 skipped (reference ref_kv_store_paged). Errors: K_ERR_SHAPE (M, hd,
 * n_kv_heads, block_size < 1, row_stride < n_kv_heads*hd), K_ERR_ARG (NULL). */
int k_kv_store_paged(uint16_t *k_pool, uint16_t *v_pool, const uint16_t *k, const uint16_t *v,
                     size_t row_stride, int M, const int32_t *slots, int n_kv_heads, int hd,
                     int block_size, struct CUstream_st *stream);

/*
 * Attention of M query rows, each of its own sequence and position (decode steps of many
 * sequences at once, and short prompt chunks): row m is at position pos[m] of the sequence whose
 * block table is tables + row_table[m] * table_stride (row_table NULL: table row m) and attends
 * to its keys [max(0, pos[m] - sliding_window + 1), pos[m]] (reference ref_attention_paged;
 * fp32 math as k_attention's v1: one block per (row, head, key split)). max_keys: a host bound
 * >= pos[m] + 1 for every row (the context size in a graph), which sizes the split-KV grid; the
 * chunking of a row follows its own key count on the device. ws / ws_bytes: as k_attention
 * (k_attention_workspace_bytes(M, n_heads, hd, max_keys)). On the device a position < 0 is
 * clamped to 0 and one past the table to its last entry (the caller checks positions; this
 * only keeps reads in bounds). Errors: K_ERR_SHAPE (hd not 64/128/256, n_heads % n_kv_heads,
 * M outside [1, 65535], block_size or table_stride < 1, max_keys < 1), K_ERR_ARG (NULL, ws
 * misaligned), K_ERR_WORKSPACE. score: NULL (q.k / sqrt(hd)) or the scale, soft-cap and ALiBi
 * slopes of kernels/ref.h struct ref_att_score (alibi: device f32 [n_heads]).
 */
int k_attention_paged(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                      const uint16_t *k_pool, const uint16_t *v_pool, int M, const int32_t *pos,
                      const int32_t *tables, int table_stride, const int32_t *row_table,
                      int n_heads, int n_kv_heads, int hd, int block_size, int max_keys,
                      int sliding_window, const struct ref_att_score *score, void *ws,
                      size_t ws_bytes, struct CUstream_st *stream);

/*
 * Attention of M consecutive query rows of one sequence at positions start_pos .. start_pos +
 * M - 1 (a prompt chunk) over its block table `table` (device, >= ceil((start_pos + M) /
 * block_size) entries): k_attention's v2 (FlashAttention-2 on tensor cores) when M >= 16, hd 64
 * or 128 and the buffers aligned as k_attention needs, else v1 as k_attention_paged (the split
 * count from start_pos + M keys, as k_attention). Same math and bits as k_attention over a
 * contiguous copy of the sequence's cache. Errors: as k_attention (start_pos < 0), K_ERR_SHAPE
 * also for block_size < 1 or start_pos + M > INT_MAX, K_ERR_ARG also for table NULL. score:
 * as k_attention_paged.
 */
int k_attention_paged_prefill(uint16_t *out, size_t out_stride, const uint16_t *q,
                              size_t q_stride, const uint16_t *k_pool, const uint16_t *v_pool,
                              int M, int start_pos, const int32_t *table, int n_heads,
                              int n_kv_heads, int hd, int block_size, int sliding_window,
                              const struct ref_att_score *score, void *ws, size_t ws_bytes,
                              struct CUstream_st *stream);

/* dst block of both pools = src block (copy-on-write of a shared block): block_elems =
 * n_kv_heads * block_size * hd fp16 per pool; two device-to-device cudaMemcpyAsync on the
 * stream (capturable in a CUDA graph); src == dst copies nothing. Errors: K_ERR_ARG (NULL),
 * K_ERR_SHAPE (src or dst < 0, block_elems < 1). */
int k_kv_copy_block(uint16_t *k_pool, uint16_t *v_pool, int src, int dst, size_t block_elems,
                    struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* QS_KERNELS_H */

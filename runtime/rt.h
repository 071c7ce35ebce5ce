/*
 * rt.h - the qshard runtime: model config, the transformer forward pass, and the backend
 * interface that the CPU (runtime/rt_cpu.c) and CUDA (runtime/rt_cuda.cu) backends implement.
 *
 * STATUS FOR OTHER ENGINEERS (kept current by the runtime-model owner):
 *   READY and stable (CLI, tests): struct rt_config + rt_config_parse(), struct rt_opts +
 *   rt_opts_default(), rt_model_open / rt_model_forward / rt_model_forward_pick (device
 *   sampling) / rt_model_reset / rt_model_free, the
 *   accessors (rt_model_config, rt_model_n_ctx, rt_model_n_past, rt_model_world_size,
 *   rt_model_device, rt_model_shard), enum rt_err, rt_err_str(), rt_err_exit_code(),
 *   rt_model_open_backend() (a caller-made backend, for tests).
 *   The CPU backend is complete and matches the transformers goldens of every fixture
 *   (tests/test_model.c). CUDA backend: runtime/rt_cuda.cu implements struct rt_backend_ops
 *   below (activations fp16 via act_size = 2, kv_size = 2; residual h, router and lm_head
 *   logits fp32); the ops mirror kernels.h (k_rmsnorm's three modes, k_rope over nq + nkv
 *   heads of a qkv row, k_kv_store, k_attention, k_embed into the fp32 residual). Until it
 *   exists, rt_cuda_nocuda.c makes --device cuda fail with RT_ERR_NO_DEVICE and AUTO use the CPU.
 *   tests/test_model.c holds an fp16-activation backend emulated on the CPU (emu_ops, opened
 *   through rt_model_open_backend): the semantics rt_cuda.cu must match op by op, and the fp16
 *   error budget (about 6e-4 relative L2 vs the goldens on every fixture).
 *   Signature changes will be announced here first.
 *
 * Who calls it: runtime/rt_main.c (`qshard run|logits|perplexity`), tests/test_model.c, and the
 * backends. Tokenizer and sampling live in rt_tok.h and rt_sample.h; this header knows nothing
 * about text.
 *
 * What a model is: the rank files of one conversion (`qshard convert` output directory with a
 * manifest.json, or a single TP-1 rank file). rt_model_open maps ALL ranks into this process
 * and runs them together: every op is issued once per rank, and the row-parallel partial sums
 * (o_proj, down_proj, embedding rows) are combined by the backend's all_reduce (a plain sum on
 * the CPU, NCCL on GPUs). So a TP-4 set runs on one CPU and must give the same logits as TP-1.
 *
 * Ownership: struct rt_model owns the fmt shards (their read-only mappings), the backend, the
 * activations and the KV cache. Weights are views: on the CPU, pointers straight into the
 * mmapped rank files (no copy); on CUDA, views into one device allocation per rank.
 *
 * Errors: enum rt_err (X-macro list below). The check that fails reports once through
 * qs_log_error (file, tensor, expected and actual values); callers forward the code.
 *
 * Math (docs/DESIGN.md, ../shared/AWQ-FORMATS.md section 8; transformers modeling_llama.py,
 * modeling_qwen2.py, modeling_mixtral.py): h = embed(tokens); per layer
 *   h += o_proj(attn(rope(q), rope(k), v))          with x = rmsnorm(h) feeding qkv
 *   h += down(silu(gate(x)) * up(x))                 with x = rmsnorm(h), or the Mixtral MoE
 * logits = lm_head(rmsnorm(h)). fp32 activations on the CPU.
 *
 * Tests: ./build/test_model (converts the fixtures with the real converter, compares with the
 * transformers goldens and TP-N with TP-1).
 */
#ifndef QS_RT_H
#define QS_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h" /* struct fmt_shard, struct fmt_tensor */
#include "ref.h" /* struct qs_rope_scaling */
#include "rt_sample.h" /* struct rt_sample_params (struct rt_pick) */

#ifdef __cplusplus
extern "C" {
#endif

/* --- errors --------------------------------------------------------------------------------- */

/* X(name, value, exit code of DESIGN 2, description). Values are stable, never reused. */
#define RT_ERR_LIST(X)                                                                     \
    X(RT_ERR_NONE, 0, 0, "ok")                                                             \
    X(RT_ERR_IO, 1, 4, "cannot read the model path")                                       \
    X(RT_ERR_FORMAT, 2, 2, "corrupt or unsupported rank file")                             \
    X(RT_ERR_CONFIG, 3, 2, "bad model config")                                             \
    X(RT_ERR_RANK_MISMATCH, 4, 2, "rank files do not belong to one model and TP set")      \
    X(RT_ERR_MISSING_TENSOR, 5, 2, "a tensor the config needs is missing")                 \
    X(RT_ERR_LAYOUT, 6, 2, "unknown or wrong tensor layout or dtype")                      \
    X(RT_ERR_SHAPE, 7, 2, "tensor shape disagrees with the config")                        \
    X(RT_ERR_TOKEN, 8, 2, "token id outside the vocabulary")                               \
    X(RT_ERR_CONTEXT, 9, 2, "context overflow")                                            \
    X(RT_ERR_ARG, 10, 1, "invalid argument")                                               \
    X(RT_ERR_NOMEM, 11, 3, "out of memory")                                                \
    X(RT_ERR_NO_DEVICE, 12, 3, "no usable GPU (or built without CUDA)")                    \
    X(RT_ERR_DEVICE, 13, 3, "GPU runtime failure")                                         \
    X(RT_ERR_UNSUPPORTED, 14, 2, "model feature not supported")                            \
    X(RT_ERR_THREAD, 15, 3, "could not start worker threads")                              \
    X(RT_ERR_NUMERIC, 16, 3, "the model computed no finite logit")

enum rt_err {
#define RT_X_ENUM(name, val, code, msg) name = val,
    RT_ERR_LIST(RT_X_ENUM)
#undef RT_X_ENUM
};

/* Short English text of an rt_err ("unknown rt_err" otherwise). */
const char *rt_err_str(enum rt_err e);
/* The process exit code of DESIGN section 2 for an error (0 ok, 1 usage, 2 bad input,
 * 3 runtime, 4 I/O). */
int rt_err_exit_code(enum rt_err e);

/* --- model config (DESIGN section 6; runtime/rt_config.c) ------------------------------------ */

enum rt_arch { RT_ARCH_LLAMA = 1, RT_ARCH_MISTRAL = 2, RT_ARCH_QWEN2 = 3, RT_ARCH_MIXTRAL = 4 };

#define RT_MAX_EOS 16

/* The config section of one rank file, validated once (rt_config_parse), then read-only. */
struct rt_config {
    enum rt_arch arch;
    char architecture[16];          /* "llama", ... as written */
    int hidden_size;                /* H */
    int intermediate_size;          /* I, as in the checkpoint */
    int intermediate_size_padded;   /* I_pad = intermediate_per_rank * world_size >= I */
    int n_layers;
    int n_heads;                    /* query heads, whole model */
    int n_kv_heads;                 /* key/value heads, whole model (GQA when < n_heads) */
    int head_dim;                   /* hd */
    int vocab_size;                 /* V: ids [0, V) are real */
    int vocab_size_per_rank;        /* V_r = ceil(V / world_size) rows of embedding and lm_head */
    float rms_norm_eps;
    double rope_theta;
    struct qs_rope_scaling rope_scaling; /* type QS_ROPE_DEFAULT when null */
    int max_position_embeddings;
    bool tie_word_embeddings;       /* lm_head absent: the embedding is the output matrix */
    int sliding_window;             /* 0 = none; else keys with p - k < sliding_window */
    bool attention_bias;            /* qkv biases (Qwen2) */
    int n_experts;                  /* num_local_experts; 0 = dense MLP */
    int n_experts_per_tok;          /* top-k of the Mixtral router */
    int w_bit;                      /* 4 */
    int group_size;                 /* G */
    bool zero_point;
    int bos_token_id;               /* -1 when null */
    int n_eos;                      /* eos ids, generation may stop on any */
    int eos_token_ids[RT_MAX_EOS];
    /* tensor parallel ("tp" object) */
    int world_size;
    int rank;
    int heads_per_rank;             /* nq_r = n_heads / world_size */
    int kv_heads_per_rank;          /* nkv_r */
    int kv_head_replicas;           /* ranks sharing one kv head (1 when tp <= n_kv_heads) */
    int intermediate_per_rank;      /* I_r */
};

/*
 * Parse and validate a model config JSON (`json`, `len` bytes, need not be NUL-terminated).
 * `where` names the source in messages (a file path). Checks types, ranges and every derived
 * relation of DESIGN 5/6 (TP rules, vocab and intermediate padding, w_bit 4, group_size % 16,
 * rope_scaling type linear|llama3, MoE counts).
 * Errors: RT_ERR_CONFIG (names the key, expected and actual), RT_ERR_UNSUPPORTED (an
 * architecture, rope_scaling type or w_bit we do not run), RT_ERR_NOMEM.
 */
enum rt_err rt_config_parse(const char *json, size_t len, const char *where,
                            struct rt_config *out);

/* --- options -------------------------------------------------------------------------------- */

enum rt_device { RT_DEVICE_AUTO = 0, RT_DEVICE_CPU = 1, RT_DEVICE_CUDA = 2 };

struct rt_opts {
    enum rt_device device;  /* AUTO: CUDA when rt_cuda_available(), else CPU */
    int n_threads;          /* CPU worker threads; <= 0: one per online core */
    int n_ctx;              /* KV cache length in tokens; <= 0: min(max_position_embeddings,
                               4096). Must be <= max_position_embeddings. */
    int max_batch;          /* most tokens per internal forward step (activation buffers);
                               <= 0: the backend's default_batch (CUDA 2048, CPU 512), at
                               most n_ctx. Longer calls are run in chunks. */
    int cuda_device;        /* first GPU for rank 0 (rank r uses cuda_device + r) */
    int p2p_allreduce;      /* CUDA, world_size > 1: 1 = all-reduces of up to 256 KB through
                               our peer-to-peer kernel when every pair of GPUs has peer access
                               (and decode graphs at world_size > 1), 0 = NCCL only.
                               QSHARD_P2P_ALLREDUCE=0 also turns it off (needed under
                               compute-sanitizer or CUDA_LAUNCH_BLOCKING=1, which serialise the
                               ranks' kernels that wait for each other). */
};

/* Defaults: AUTO device, all cores, default context and batch, GPU 0, peer-to-peer all-reduce. */
struct rt_opts rt_opts_default(void);

/* --- model ---------------------------------------------------------------------------------- */

struct rt_model;
struct rt_backend; /* the backend interface, below */

/*
 * Open a model: a directory written by `qshard convert` (manifest.json + rank-K-of-N.qshard,
 * opened and cross-checked with fmt_model_open: same model_id, world_size, digests) or a
 * single rank file of a TP-1 conversion. Parses and cross-checks every rank's config (all ranks
 * equal apart from tp.rank; tp.rank and world_size match the file header), binds every tensor
 * the config implies with dtype, layout and shape checks, creates the backend, and allocates
 * activations and a KV cache of opts->n_ctx tokens (opts may be NULL: rt_opts_default()).
 * Errors: RT_ERR_IO, RT_ERR_FORMAT, RT_ERR_RANK_MISMATCH (a single rank file of a TP-N set, or
 * configs that disagree), RT_ERR_CONFIG, RT_ERR_UNSUPPORTED, RT_ERR_MISSING_TENSOR (names the
 * tensor and file), RT_ERR_LAYOUT, RT_ERR_SHAPE, RT_ERR_CONTEXT (n_ctx too large), RT_ERR_NOMEM,
 * RT_ERR_NO_DEVICE, RT_ERR_DEVICE. On failure *out is NULL and nothing leaks.
 */
enum rt_err rt_model_open(const char *path_or_dir, const struct rt_opts *opts,
                          struct rt_model **out);

/*
 * rt_model_open with a backend the caller made (tests that wrap or emulate a backend,
 * experiments): opts->device only labels it (CUDA or CPU). The model takes ownership of the
 * backend at once: rt_model_free destroys it, and so does a failed open.
 * Errors: those of rt_model_open, RT_ERR_ARG (be or be->ops NULL).
 */
enum rt_err rt_model_open_backend(const char *path_or_dir, const struct rt_opts *opts,
                                  const struct rt_backend *be, struct rt_model **out);

/*
 * Run n_tokens tokens at positions start_pos .. start_pos + n_tokens - 1 (prefill when
 * n_tokens > 1, decode when 1), appending their keys/values to the KV cache. Positions
 * [0, start_pos) must already be cached by earlier calls (start_pos <= rt_model_n_past);
 * a smaller start_pos rewinds: later cache entries are overwritten.
 * logits: fp32, row width vocab_size (padding rows of the vocab-parallel split are dropped, so
 * ids >= vocab_size never appear): [n_tokens][vocab_size] when all_logits, else the last
 * position only, [vocab_size]. logits may be NULL (prefill whose logits are not needed).
 * Errors (nothing is run): RT_ERR_TOKEN (id < 0 or >= vocab_size; names index and id),
 * RT_ERR_CONTEXT (start_pos + n_tokens > n_ctx), RT_ERR_ARG (n_tokens < 1,
 * start_pos > n_past); then backend errors (RT_ERR_NOMEM, RT_ERR_DEVICE).
 */
enum rt_err rt_model_forward(struct rt_model *m, const int32_t *tokens, int n_tokens,
                             int start_pos, float *logits, bool all_logits);

/*
 * One next-token choice made on the device (rt_sample.h steps 1-7). The caller's rt_sampler
 * stays the owner of the parameters (checked there), the PRNG and the history: it fills one
 * rt_pick per token, drawing u from its own stream (rt_sampler_uniform; one draw per sampled
 * token, none when greedy), so the ids are those rt_sampler_next would pick from the same
 * logits (up to rounding at a cumulative boundary, rt_sample.h).
 */
struct rt_pick {
    struct rt_sample_params p; /* the sampler's parameters (the seed is not used here) */
    double u;                  /* this token's draw in [0, 1); unused when greedy */
    const uint8_t *seen;       /* host [ceil(vocab_size/8)]: history bitmap (rt_sampler.seen) */
};

/* Whether rt_model_forward_pick can run: the backend has a device sampler (CUDA); with several
 * ranks it can also copy between them (the vocab-parallel logits are gathered on rank 0's
 * device first, rt_backend_ops.copy_ranks); and the environment does not say
 * QSHARD_DEVICE_SAMPLE=0 (A/B runs against the host sampler). */
bool rt_model_can_pick(const struct rt_model *m);

/*
 * rt_model_forward of tokens (logits of the last position only), then the next token chosen
 * on the device from those logits; only the id [0, vocab_size) comes back to the host, not the
 * [vocab_size] row. Errors: those of rt_model_forward; RT_ERR_UNSUPPORTED when
 * !rt_model_can_pick; RT_ERR_ARG (pick or id NULL, parameters rt_sample_params_check refuses,
 * u outside [0, 1) when sampling, seen NULL with a repetition penalty: checked before anything
 * runs);
 * RT_ERR_NUMERIC when no logit is finite (every one NaN or -inf: the model computed garbage).
 */
enum rt_err rt_model_forward_pick(struct rt_model *m, const int32_t *tokens, int n_tokens,
                                  int start_pos, const struct rt_pick *pick, int32_t *id);

/* Forget the KV cache (n_past = 0). */
void rt_model_reset(struct rt_model *m);
/* Free everything (activations, KV cache, backend, mappings); NULL is fine. */
void rt_model_free(struct rt_model *m);

const struct rt_config *rt_model_config(const struct rt_model *m); /* rank 0's config */
int rt_model_n_ctx(const struct rt_model *m);      /* KV cache capacity in tokens */
int rt_model_n_past(const struct rt_model *m);     /* positions currently cached */
int rt_model_world_size(const struct rt_model *m);
enum rt_device rt_model_device(const struct rt_model *m); /* CPU or CUDA after AUTO resolved */
/* Rank r's open shard (borrowed): tokenizer files, generation config. NULL if r is out of range. */
const struct fmt_shard *rt_model_shard(const struct rt_model *m, int rank);

/* --- backend interface ----------------------------------------------------------------------- */

/*
 * The model code (rt_model.c) issues every op through this table, once per rank, and never
 * dereferences activation or weight pointers itself: they are "backend addresses" (host memory
 * on the CPU, device memory on CUDA). Only download brings data back to the host (router
 * logits for MoE routing, final logits). Host-side arguments are marked "host".
 * Every op works on rank `rank`'s memory; on CUDA, ops are asynchronous on that rank's stream
 * and download synchronises. Each op returns RT_ERR_NONE or an error it has reported.
 * Shapes use the names of kernels/ref.h; the CPU backend calls the matching ref_* function, and
 * the semantics (including argument order) are exactly those of that function.
 *
 * Element types of the buffers the model allocates (through alloc):
 *   act   activations x, o, qkv, att, gate_up, act, expert rows: act_size bytes per element,
 *         fp32 on the CPU (4), fp16 on CUDA (2). Passed as void *; the model offsets them only
 *         by whole rows/heads, in elements, scaled by act_size.
 *   f32   residual stream h [M][H], router logits [M][E], lm_head logits [M][V_r], inv_freq:
 *         always fp32 (float *).
 *   kv    KV cache [n_kv_heads][T_cap][hd] per layer: kv_size bytes per element.
 * Row strides are in elements.
 */
enum rt_buf_type { RT_BUF_F32 = 0, RT_BUF_ACT = 1 };

struct rt_backend_ops {
    const char *name; /* "cpu", "cuda" */
    size_t act_size;  /* bytes per activation element */
    size_t kv_size;   /* bytes per KV cache element */
    void (*destroy)(void *ctx);

    /* weights: make shard `s` usable by rank `rank` (CPU: nothing; CUDA: one device allocation
     * filled from the mapping), then translate tensors to backend addresses. */
    enum rt_err (*load_weights)(void *ctx, int rank, const struct fmt_shard *s);
    const void *(*tensor_ptr)(void *ctx, int rank, const struct fmt_tensor *t);

    /* memory: zero-filled allocation of `bytes` on rank's device; free accepts NULL */
    enum rt_err (*alloc)(void *ctx, int rank, size_t bytes, void **out);
    void (*free)(void *ctx, int rank, void *p);
    enum rt_err (*upload)(void *ctx, int rank, void *dst, const void *src_host, size_t bytes);
    enum rt_err (*download)(void *ctx, int rank, void *dst_host, const void *src, size_t bytes);
    enum rt_err (*zero)(void *ctx, int rank, void *dst, size_t bytes);

    /* f32 out[M][H] = embedding rows tokens[m] - row_begin of table fp16 [V_r][H], zero rows for
     * ids another rank holds (ref_embed). tokens: host [M]. */
    enum rt_err (*embed)(void *ctx, int rank, float *out, const uint16_t *table,
                         const int32_t *tokens, int M, int64_t row_begin, int V_r, int H);
    /* ref_rmsnorm, act out and x, f32 residual: residual and x: residual += x, out =
     * norm(residual) * w; residual and no x: out = norm(residual) * w; no residual: out =
     * norm(x) * w. */
    enum rt_err (*rmsnorm)(void *ctx, int rank, void *out, float *residual, const void *x,
                           const float *w, int M, int H, float eps);
    /* ref_w4a16_linear: act y[M][N] = act x[M][K] . W + bias (packed DESIGN 4 tensors, bias f32
     * or NULL). */
    enum rt_err (*linear_w4)(void *ctx, int rank, const void *x, const uint8_t *qweight,
                             const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                             int M, int K, int N, int G, void *y);
    /* ref_linear_f16: act y[M][N] = act x[M][K] . W^T + bias, W fp16 [N][K] (unquantised
     * linears of modules_to_not_convert). */
    enum rt_err (*linear_f16)(void *ctx, int rank, const void *x, const uint16_t *W,
                              const float *bias, int M, int K, int N, void *y);
    /* lm_head: f32 logits[M][N] = act x[M][K] . W^T, W fp16 [N][K] (N = V_r). */
    enum rt_err (*lm_head)(void *ctx, int rank, const void *x, const uint16_t *W, int M, int K,
                           int N, float *logits);
    /* router: f32 y[M][N] = act x[M][K] . W^T, W fp32 [N][K] (ref_linear_f32, N = E). */
    enum rt_err (*router)(void *ctx, int rank, const void *x, const float *W, int M, int K,
                          int N, float *y);
    /* ref_rope on act x, M rows at positions start_pos + m; inv_freq: f32 [hd/2]. */
    enum rt_err (*rope)(void *ctx, int rank, void *x, int M, int n_heads, int hd,
                        size_t row_stride, int start_pos, const float *inv_freq);
    /* Append keys and values of positions start_pos .. start_pos+M-1 to the kv caches:
     * k_cache[h][start_pos + m][:] = k[m*row_stride + h*hd ...] (act k, v), same for v. */
    enum rt_err (*kv_store)(void *ctx, int rank, void *k_cache, void *v_cache, const void *k,
                            const void *v, size_t row_stride, int M, int start_pos,
                            int n_kv_heads, int hd, int T_cap);
    /* ref_attention (causal, GQA, sliding window <= 0 = none): act out, act q, kv caches. */
    enum rt_err (*attention)(void *ctx, int rank, void *out, size_t out_stride, const void *q,
                             size_t q_stride, const void *k_cache, const void *v_cache, int M,
                             int start_pos, int n_heads, int n_kv_heads, int hd, int T_cap,
                             int sliding_window);
    /* ref_silu_mul: act out[M][I] = silu(gate) * up, act gate_up [M][2I]. */
    enum rt_err (*silu_mul)(void *ctx, int rank, void *out, const void *gate_up, int M, int I);
    /* MoE helpers on act rows of `width` elements: dst[i] = src[rows[i]], and
     * y[rows[i]] += weights[i] * src[i]. rows, weights: host [n]. */
    enum rt_err (*gather_rows)(void *ctx, int rank, void *dst, const void *src,
                               const int32_t *rows, int n, int width);
    enum rt_err (*scatter_add_rows)(void *ctx, int rank, void *y, const void *src,
                                    const int32_t *rows, const float *weights, int n, int width);
    /* Sum bufs[0..world_size-1] (one per rank, n elements of type `type` each) and leave the sum
     * in every one. */
    enum rt_err (*all_reduce)(void *ctx, void *const *bufs, int world_size, size_t n,
                              enum rt_buf_type type);

    /* Optional (NULL in backends without it; all four or none): the decode step (M = 1) of
     * each rank as one replayable graph, so its ~10 ops per layer cost one launch. Between
     * graph_begin and graph_end the ops of one step are recorded, not run, on `rank` (the CUDA
     * backend's stream capture; with several ranks every rank records at once, all-reduces
     * included: graph_begin for every rank, the step's ops, then graph_end for every rank; a
     * backend may finish the recordings only at the last graph_end); in that mode embed reads
     * the token and rope/kv_store/rope_kv_store/attention read the position from backend memory that
     * graph_replay fills, so the recording does not depend on them. graph_end(ok = false) discards the recording. graph_ready: whether `rank` has a
     * valid recording (one was made and no buffer it uses has been reallocated since).
     * graph_replay runs the recording for `token` at position `pos`; *done = false (nothing
     * run) when graph_ready is false: record again first. */
    enum rt_err (*graph_begin)(void *ctx, int rank);
    enum rt_err (*graph_end)(void *ctx, int rank, bool ok);
    bool (*graph_ready)(void *ctx, int rank);
    enum rt_err (*graph_replay)(void *ctx, int rank, int32_t token, int pos, bool *done);

    /* Optional: *id = the next token chosen on the device from f32 logits [vocab_size] of
     * `rank` (an lm_head output) following rt_sample.h with `pick` (host), or -1 when no logit
     * is finite (kernels.h k_sample). Synchronises (the id is on the host on return). */
    enum rt_err (*sample)(void *ctx, int rank, const float *logits, int vocab_size,
                          const struct rt_pick *pick, int32_t *id);
    /* Optional (device sampling at world_size > 1): copy `bytes` from src on src_rank to dst on
     * dst_rank, after the work already queued on src_rank and before the work queued on
     * dst_rank after it; later work on src_rank does not overwrite src before the copy has
     * read it. */
    enum rt_err (*copy_ranks)(void *ctx, int dst_rank, void *dst, int src_rank,
                              const void *src, size_t bytes);
    /* Rows per forward (prefill chunk) when rt_opts.max_batch <= 0; 0: 512. CUDA: 2048, where
     * the W4A16 prefill path (dequant + cuBLAS) costs 0.5-0.65x of cuBLAS fp16 per 256-512
     * rows but 0.9x at 2048 and more (docs/BENCHMARKS.md, "Prompt chunk size"). */
    int default_batch;
    /* Optional (NULL: rope, then kv_store): both in one op on the fused qkv rows x of M tokens
     * at positions start_pos + m: rope on the n_q + n_kv q and k heads, then k and v (the n_kv
     * heads after them) appended to the caches, with the arguments of rope and kv_store. */
    enum rt_err (*rope_kv_store)(void *ctx, int rank, void *x, int M, int n_q, int n_kv, int hd,
                                 size_t row_stride, int start_pos, const float *inv_freq,
                                 void *k_cache, void *v_cache, int T_cap);
};

struct rt_backend {
    const struct rt_backend_ops *ops;
    void *ctx;
};

/*
 * Backend constructors: world_size ranks in this process. On failure out->ops is NULL.
 * rt_cpu_backend_create: RT_ERR_NOMEM, RT_ERR_THREAD.
 * rt_cuda_backend_create: RT_ERR_NO_DEVICE (built without CUDA, no GPU, fewer GPUs than ranks,
 * compute capability < 8.0: the message names the GPU), RT_ERR_DEVICE, RT_ERR_NOMEM.
 */
enum rt_err rt_cpu_backend_create(const struct rt_opts *opts, int world_size,
                                  struct rt_backend *out);
enum rt_err rt_cuda_backend_create(const struct rt_opts *opts, int world_size,
                                   struct rt_backend *out);
/* True when this build has CUDA and at least one usable GPU (no error is logged). */
bool rt_cuda_available(void);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_H */

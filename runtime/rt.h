/*
 * rt.h - the qshard runtime's public API: model config and architecture descriptors, options,
 * the batch of tokens one forward step runs, the rank-local model and its KV cache, and the
 * executor that runs every rank of this process.
 *
 * Layers (docs/DESIGN.md section 7):
 *   rt_exec   all tensor-parallel ranks this process drives (every rank of the conversion,
 *             one thread per rank after the first; under mpirun one rank per process,
 *             runtime/rt_mpi.h). Rank 0's thread is the caller's: it broadcasts every step's
 *             batch to the other ranks, runs its own rank, and returns the logits (or the next
 *             token chosen on the device). Who calls it: the session (rt_session.h), tests.
 *   rt_model  ONE rank: its rank file's weights bound by the architecture descriptor, its
 *             activations, its backend (rt_backend.h: CPU references or CUDA kernels) and the
 *             communicator (rt_backend.h struct rt_comm) through which its collectives go
 *             (all-reduce of the row-parallel partial sums, gather of the vocab-parallel logits).
 *   rt_kv     the KV cache of one rank: paged pools of fixed-size blocks the model is given
 *             with each forward, with the block tables of the batch's sequences; the tables,
 *             reference counts and prefix cache live on rank 0 (rt_blocks.c, in the executor),
 *             which sends each step's tables along with the batch.
 *
 * Math (transformers modeling_llama.py, modeling_qwen2.py, modeling_mixtral.py, and the other
 * families' files named in their descriptors; the per-layer
 * choices come from the architecture descriptor, struct rt_arch): h = embed(tokens); per layer
 *   h += o_proj(attn(rope(q), rope(k), v))        with x = norm(h) feeding qkv
 *   h += down(act(gate(x)) * up(x))               with x = norm(h), or the Mixtral MoE
 * logits = lm_head(norm(h)). fp32 residual stream; activations fp32 on the CPU, fp16 on CUDA.
 *
 * Errors: enum rt_err (X-macro list below, stable values). The check that fails reports once
 * through qs_log_error (file, tensor, expected and actual values); callers forward the code.
 *
 * Tests: ./build/test_model (converts the fixtures with the real converter, compares with the
 * transformers goldens, TP-N with TP-1, batched with one sequence at a time).
 */
#ifndef QS_RT_H
#define QS_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h"       /* struct fmt_shard */
#include "ref.h"       /* struct qs_rope_scaling */
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
    X(RT_ERR_NUMERIC, 16, 3, "the model computed no finite logit")                         \
    X(RT_ERR_TOKENIZER, 17, 2, "tokenizer missing, malformed, or text it cannot encode")  \
    X(RT_ERR_CANCELLED, 18, 3, "interrupted (a signal set the cancel flag)")                \
    X(RT_ERR_PEER, 19, 3, "another rank failed")                                        \
    X(RT_ERR_KV_FULL, 20, 3, "the KV cache has no free block left")

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

/* --- architectures (runtime/rt_arch*.c) -------------------------------------------------------- */

/* Normalisation before attention, MLP and the lm_head. */
enum rt_norm {
    RT_NORM_RMS = 1,  /* transformers LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w */
    RT_NORM_LAYER = 2 /* torch LayerNorm: (x - mean) * rsqrt(var + eps) * w + b (Falcon) */
};
/* Activation of the MLP: a gated kind computes act(gate) * up from gate_up [M][2I]; a plain
 * kind act(x) from the up projection's [M][I] (rt_act_gated). */
enum rt_act {
    RT_ACT_SILU = 1, /* gated: silu(gate) * up, silu(x) = x * sigmoid(x) (LLaMA) */
    RT_ACT_GELU = 2, /* plain: exact erf GELU (Falcon's dense_h_to_4h -> GELU -> dense_4h_to_h) */
    RT_ACT_GELU_TANH = 3 /* gated: gelu_tanh(gate) * up (Gemma 2 / 3's GeGLU, gelu_pytorch_tanh) */
};

/* Whether activation kind a is gated (its input is [gate | up], twice the intermediate width). */
static inline bool rt_act_gated(enum rt_act a)
{
    return a == RT_ACT_SILU || a == RT_ACT_GELU_TANH;
}

struct rt_config;

/*
 * What the forward pass of one architecture family does, as data (docs/DESIGN.md section 7):
 * the model code (rt_model.c) reads these fields and issues the backend ops they name; it has no
 * `if (architecture == ...)`. Adding a family is one new rt_arch_<family>.c holding its
 * descriptors and config checks, one line in the registry (rt_arch.c), and tests; the
 * converter's descriptor (convert/arch/) writes the config section this one reads.
 */
struct rt_arch {
    const char *name;        /* config "architecture" value: "llama", "mistral", ... */
    enum rt_norm norm;       /* every norm of the model */
    enum rt_act act;         /* MLP activation (gated or plain: rt_act_gated) */
    float rotary_fraction;   /* share of head_dim rotated by RoPE (1: all) */
    bool parallel_residual;  /* attention and MLP both read norm(h) of the layer input */
    bool qk_norm;            /* per-head norm of q and k before RoPE */
    bool moe;                /* sparse MoE MLP (router + experts) instead of the dense MLP */
    bool norm_bias;          /* LayerNorm families: every norm has its bias (Falcon: required;
                              * MPT: none, a bias tensor in the file is refused as unused) */
    bool alibi;              /* ALiBi position biases instead of RoPE (MPT): the config's
                              * alibi_bias_max > 0, inv_freq all zero (the rotation is the
                              * identity), per-layer activation scales when the file has them */
    bool post_norms;         /* Gemma 2 / 3: the attention and MLP outputs are normalised before
                              * the residual add (post_attention_norm, post_feedforward_norm);
                              * the config may give embed_scale, attn_scale, soft-capping, a
                              * per-layer window pattern and a local rope theta. Norm weights
                              * come with Gemma's (1 + w) folded in by the converter */
    /* Architecture-specific checks of a parsed config `c` read from `where` (after the generic
     * ones of rt_config_parse); NULL: none. Reports the key, returns RT_ERR_CONFIG or
     * RT_ERR_UNSUPPORTED. */
    enum rt_err (*check)(const struct rt_config *c, const char *where);
};

/* The descriptor of config architecture `name`, or NULL (the registry, rt_arch.c). */
const struct rt_arch *rt_arch_find(const char *name);

/* The check of a dense architecture (runtime/rt_arch_llama.c; LLaMA's family, Falcon, MPT): a
 * config with experts (num_local_experts != 0) is refused, RT_ERR_CONFIG, reported. */
enum rt_err rt_arch_check_dense(const struct rt_config *c, const char *where);
/* Comma-separated names of every registered architecture, for messages. */
const char *rt_arch_names(void);

/* --- model config (DESIGN section 6; runtime/rt_config.c) ------------------------------------ */

#define RT_MAX_EOS 16

/* The config section of one rank file, validated once (rt_config_parse), then read-only. */
struct rt_config {
    const struct rt_arch *arch;     /* the architecture descriptor (never NULL once parsed) */
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
    bool attention_bias;            /* qkv biases (config key, or the architecture's rule) */
    int n_experts;                  /* num_local_experts; 0 = dense MLP */
    int n_experts_per_tok;          /* top-k of the Mixtral router */
    bool norm_topk_prob;            /* renormalise the kept router weights (Mixtral: always) */
    float alibi_bias_max;           /* > 0: ALiBi position biases of this maximum (MPT; no
                                       rotary); 0: none */
    /* Gemma 2 / 3 (arch->post_norms; absent keys give the values of every other family) */
    float embed_scale;              /* embedding rows * this (1; Gemma: sqrt(hidden_size)) */
    float attn_scale;               /* q.k multiplier (0: 1 / sqrt(head_dim); Gemma:
                                       query_pre_attn_scalar^-0.5) */
    float attn_softcap;             /* > 0: scores = cap * tanh(scores / cap); 0: none */
    float final_softcap;            /* > 0: logits = cap * tanh(logits / cap); 0: none */
    int sliding_window_pattern;     /* 0: sliding_window on every layer; P > 0: layer l has
                                       the window iff (l + 1) % P != 0, the others are global
                                       (Gemma 2: P 2, Gemma 3: 6) */
    double rope_local_theta;        /* > 0: the windowed layers rotate with this theta and no
                                       scaling (Gemma 3's rope_local_base_freq); 0: as global */
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

/* Whether layer l of config c attends through the sliding window (a "local" layer):
 * sliding_window > 0 and, with a sliding_window_pattern P, (l + 1) % P != 0 (Gemma 2 / 3's
 * interleaving, transformers configuration_gemma2.py / configuration_gemma3.py layer_types). */
static inline bool rt_layer_local(const struct rt_config *c, int l)
{
    if (c->sliding_window <= 0)
        return false;
    return c->sliding_window_pattern <= 0 || (l + 1) % c->sliding_window_pattern != 0;
}

/*
 * Parse and validate a model config JSON (`json`, `len` bytes, need not be NUL-terminated).
 * `where` names the source in messages (a file path). Checks types, ranges and every derived
 * relation of DESIGN 5/6 (TP rules, vocab and intermediate padding, w_bit 4, group_size % 16,
 * rope_scaling type linear|llama3), then the architecture's own check (MoE counts).
 * Errors: RT_ERR_CONFIG (names the key, expected and actual), RT_ERR_UNSUPPORTED (an
 * architecture, rope_scaling type or w_bit we do not run), RT_ERR_NOMEM.
 */
enum rt_err rt_config_parse(const char *json, size_t len, const char *where,
                            struct rt_config *out);

/* Whether two ranks' configs describe the same model and TP set (every field but `rank`).
 * Reports the first field that differs, naming both sources. */
bool rt_config_same(const struct rt_config *a, const char *where_a, const struct rt_config *b,
                    const char *where_b);

/* --- options -------------------------------------------------------------------------------- */

#define RT_DEFAULT_BLOCK_SIZE 16 /* tokens per KV-cache block (docs/BENCHMARKS.md "KV block size") */

enum rt_device { RT_DEVICE_AUTO = 0, RT_DEVICE_CPU = 1, RT_DEVICE_CUDA = 2 };

/* How to open and run a model. The bool switches turn one optimisation off for A/B
 * measurements and debugging (the --debug-* options of the CLI; docs/DESIGN.md section 8). */
struct rt_opts {
    enum rt_device device;  /* AUTO: CUDA when rt_cuda_available(), else CPU */
    int n_threads;          /* CPU worker threads of all ranks together; <= 0: one per core */
    int n_ctx;              /* positions per sequence slot of the KV cache; <= 0:
                               min(max_position_embeddings, 4096). Must be <= max_position_embeddings. */
    int n_seqs;             /* sequence slots (sequences at once); <= 0: 1 */
    int block_size;         /* tokens per KV-cache block; <= 0: 16 */
    int kv_blocks;          /* blocks in the pool; <= 0: from kv_cache_bytes, else enough for
                               every slot at n_ctx */
    double kv_cache_bytes;  /* pool size per rank when kv_blocks <= 0 (bytes; <= 0: unset) */
    double kv_mem_fraction; /* CUDA, when neither is set and > 0: this share of the GPU memory
                               free after weights and activations (the engine's default 0.9) */
    bool no_prefix_cache;   /* full blocks are not registered for reuse by later prompts */
    int max_batch;          /* most tokens per internal forward step (activation buffers);
                               <= 0: the backend's default_batch (CUDA 2048, CPU 512), at
                               most n_ctx. Longer batches are run in chunks. */
    int cuda_device;        /* first GPU for rank 0 (rank r uses cuda_device + r) */
    int p2p_allreduce;      /* CUDA, world_size > 1: 1 = all-reduces of up to 256 KB through
                               our peer-to-peer kernel when every pair of GPUs has peer access
                               (and decode graphs at world_size > 1), 0 = NCCL only (needed under
                               compute-sanitizer or CUDA_LAUNCH_BLOCKING=1, which serialise the
                               ranks' kernels that wait for each other) */
    /* A/B and debugging switches (false = the normal path; the CLI's --debug-* options,
     * README "Debug options", docs/DESIGN.md section 8): */
    bool no_graph;          /* decode steps op by op, never as a CUDA graph */
    bool no_pdl;            /* CUDA: plain launches, no Programmatic Dependent Launch */
    bool no_defer;          /* no deferred split-K epilogue: every W4A16 linear writes fp16 */
    bool no_rope_kv;        /* CUDA: RoPE and the KV-cache store as two kernels */
    bool no_wgmma;          /* CUDA: dequant + cuBLAS instead of the wgmma kernel at 65-128 rows */
    bool host_sample;       /* choose the next token on the host (rt_sampler) from the
                               downloaded logits, even where the backend can on the device */
};

/* Defaults: AUTO device, all cores, default context and batch, one sequence slot, GPU 0,
 * peer-to-peer all-reduce, every optimisation on. */
struct rt_opts rt_opts_default(void);

/* --- the batch of one forward ---------------------------------------------------------------- */

/*
 * The tokens one forward runs (host arrays, borrowed for the call). Token i belongs to sequence
 * slot seq[i] (rt_kv) at position pos[i] of that sequence. The tokens of a sequence are
 * consecutive in the batch, at increasing positions without gaps, and each sequence appears
 * once; its first position p0 must be <= the positions already cached for it (p0 smaller
 * rewinds the slot: later entries are overwritten); p0 + count <= n_ctx.
 * Logits (or picks) are produced for the rows out[0..n_out-1] (strictly increasing row indices),
 * typically the last token of each sequence; every row for logits/perplexity.
 */
struct rt_batch {
    int n_tokens;             /* >= 1 */
    const int32_t *tokens;    /* [n_tokens] ids in [0, vocab_size) */
    const int32_t *pos;       /* [n_tokens] */
    const int32_t *seq;       /* [n_tokens] slots in [0, n_seqs); NULL: every token in slot 0 */
    int n_out;                /* >= 0 */
    const int32_t *out;       /* [n_out] rows in [0, n_tokens), strictly increasing */
};

/* One next-token choice made on the device (rt_sample.h steps 1-7). The caller's rt_sampler
 * stays the owner of the parameters, the PRNG and the history: it fills one rt_pick per token,
 * drawing u from its own stream (rt_sampler_uniform; one draw per sampled token, none when
 * greedy), so the ids are those rt_sampler_next would pick from the same logits (up to rounding
 * at a cumulative boundary, rt_sample.h). */
struct rt_pick {
    struct rt_sample_params p; /* the sampler's parameters (the seed is not used here) */
    double u;                  /* this token's draw in [0, 1); unused when greedy */
    const uint8_t *seen;       /* host [ceil(vocab_size/8)]: history bitmap (rt_sampler.seen) */
};

/* --- the executor: every rank of this process ------------------------------------------------- */

struct rt_exec;
struct rt_backend; /* rt_backend.h */
struct rt_comm;    /* rt_backend.h */

/*
 * Open a model for this process: a directory written by `qshard convert` (manifest.json +
 * rank-K-of-N.qshard) or a single rank file of a TP-1 conversion. Every rank r of the
 * conversion is opened by its own thread (rank 0 by the caller's): rt_model_open of rank r's
 * file only (checked against the manifest), its backend created there (CUDA: GPU cuda_device +
 * r), its weights loaded; the ranks' configs are compared (rt_config_same); each rank's KV cache
 * pool is sized from opts (kv_blocks, kv_cache_bytes, kv_mem_fraction, else n_seqs * n_ctx
 * positions; the smallest over the ranks is used) and rank 0 gets the block manager of
 * opts->n_seqs slots. opts may be NULL (rt_opts_default()).
 * Errors: those of rt_model_open from any rank (the first reported), RT_ERR_THREAD,
 * RT_ERR_RANK_MISMATCH (configs differ; a single rank file of a TP-N set). On failure *out is
 * NULL and nothing leaks.
 */
enum rt_err rt_exec_open(const char *path_or_dir, const struct rt_opts *opts,
                         struct rt_exec **out);

/* Makes rank `rank`'s backend (tests that wrap or emulate a backend); on success *out owns
 * its ctx. opts->device of the open only labels the result (CUDA or CPU). */
typedef enum rt_err (*rt_backend_factory)(void *user, int rank, int world_size,
                                          struct rt_comm *comm, struct rt_backend *out);

/* rt_exec_open with every rank's backend made by `factory` (called on that rank's thread). */
enum rt_err rt_exec_open_with(const char *path_or_dir, const struct rt_opts *opts,
                              rt_backend_factory factory, void *user, struct rt_exec **out);

/*
 * Run one batch on every rank. logits: host fp32 [n_out][vocab_size] (padded vocabulary
 * columns dropped, so ids >= vocab_size never appear), or NULL (prefill whose logits are not
 * needed; n_out is then ignored). Checked before anything runs: RT_ERR_ARG (shape of the batch:
 * empty, sequence slots, positions, out rows; names the index), RT_ERR_TOKEN (an id outside
 * the vocabulary; names index and id), RT_ERR_CONTEXT (a sequence past n_ctx), RT_ERR_KV_FULL
 * (the pool has too few free blocks for the batch: nothing ran; rt_exec_blocks_needed). Then backend
 * errors (RT_ERR_NOMEM, RT_ERR_DEVICE) or RT_ERR_PEER (another rank failed and reported it);
 * after a backend error or RT_ERR_PEER the executor is unusable (free it).
 */
enum rt_err rt_exec_forward(struct rt_exec *e, const struct rt_batch *b, float *logits);

/* Whether rt_exec_forward_pick can run: the backend samples on the device and
 * opts->host_sample is off. */
bool rt_exec_can_pick(const struct rt_exec *e);

/*
 * rt_exec_forward, then the next token of each out row chosen on the device from its logits
 * (picks[i] for row out[i]); only the ids [0, n_vocab) come back, not the rows. Errors: those of
 * rt_exec_forward; RT_ERR_UNSUPPORTED when !rt_exec_can_pick; RT_ERR_ARG (picks or ids NULL,
 * n_out < 1, parameters rt_sample_params_check refuses, u outside [0, 1) when sampling, seen
 * NULL with a repetition penalty: checked before anything runs); RT_ERR_NUMERIC when a row has
 * no finite logit. Candidates are ids [0, min(vocab_size, p.vocab_limit)).
 */
enum rt_err rt_exec_forward_pick(struct rt_exec *e, const struct rt_batch *b,
                                 const struct rt_pick *picks, int32_t *ids);

/* One sequence: tokens [n] of slot `seq` at positions start_pos.., logits of the last row
 * ([vocab_size]) or of every row ([n][vocab_size]) when all_logits; the batch is built here. */
enum rt_err rt_exec_forward_seq(struct rt_exec *e, int seq, const int32_t *tokens, int n,
                                int start_pos, float *logits, bool all_logits);
/* One sequence, the next token after its last row chosen on the device. */
enum rt_err rt_exec_forward_seq_pick(struct rt_exec *e, int seq, const int32_t *tokens, int n,
                                     int start_pos, const struct rt_pick *pick, int32_t *id);

/* Positions cached for slot `seq` (0 after open or clear). */
int rt_exec_seq_len(const struct rt_exec *e, int seq);
/* Forget slot `seq`'s cached positions and free its blocks (full ones stay in the prefix
 * cache). */
void rt_exec_seq_clear(struct rt_exec *e, int seq);

/* Stop the other ranks' threads and free everything; NULL is fine. */
void rt_exec_free(struct rt_exec *e);

const struct rt_config *rt_exec_config(const struct rt_exec *e); /* rank 0's config */
int rt_exec_world_size(const struct rt_exec *e);
int rt_exec_n_ctx(const struct rt_exec *e);       /* positions per sequence slot */
int rt_exec_n_seqs(const struct rt_exec *e);
int rt_exec_max_batch(const struct rt_exec *e);  /* rows per internal forward (rank 0) */

/* The paged KV cache seen from rank 0 (runtime/rt_blocks.h): block size, usable blocks, blocks
 * that can still be taken (free or cached but unused), blocks held by sequences, and the new
 * blocks a write of positions [p0, p0 + n) into slot `seq` would take. */
int rt_exec_block_size(const struct rt_exec *e);
int rt_exec_blocks_total(const struct rt_exec *e);
int rt_exec_blocks_available(const struct rt_exec *e);
int rt_exec_blocks_used(const struct rt_exec *e);
int rt_exec_blocks_needed(const struct rt_exec *e, int seq, int p0, int n);
/* An empty slot `seq` about to hold prompt tokens[n]: takes the cached blocks of its longest
 * cached prefix of whole blocks; returns the positions it now holds (< n; 0 when none or the
 * prefix cache is off). */
int rt_exec_seq_match_prefix(struct rt_exec *e, int seq, const int32_t *tokens, int n);
enum rt_device rt_exec_device(const struct rt_exec *e); /* CPU or CUDA after AUTO resolved */
/* Rank 0's open shard (borrowed): tokenizer files, generation config. */
const struct fmt_shard *rt_exec_shard(const struct rt_exec *e);

/* --- one rank: model and KV cache (rt_model.c, rt_kv.c) ----------------------------------------- */

struct rt_model;
struct rt_kv;

/*
 * Open rank `rank` of a model: from a directory, rank-<rank>-of-N.qshard checked against
 * manifest.json (fmt_manifest_open_rank); a single rank file must be TP-1 (rank 0). Parses the
 * config, checks it names this rank and `comm`'s world size, creates the backend (`be`: a
 * backend the caller made, owned by the model from here on - also on failure; NULL: from
 * opts->device), loads the weights, binds every tensor the architecture implies (dtype, layout,
 * shape checks; a tensor left over is an error) and allocates the activations.
 * Call it on the thread that will run the rank. Errors: RT_ERR_IO, RT_ERR_FORMAT,
 * RT_ERR_RANK_MISMATCH, RT_ERR_CONFIG, RT_ERR_UNSUPPORTED, RT_ERR_MISSING_TENSOR (names the
 * tensor and file), RT_ERR_LAYOUT, RT_ERR_SHAPE, RT_ERR_CONTEXT (n_ctx too large),
 * RT_ERR_NOMEM, RT_ERR_NO_DEVICE, RT_ERR_DEVICE. On failure *out is NULL and nothing leaks.
 */
enum rt_err rt_model_open(const char *path_or_dir, int rank, const struct rt_opts *opts,
                          struct rt_comm *comm, const struct rt_backend *be,
                          struct rt_model **out);
void rt_model_free(struct rt_model *m); /* NULL is fine */

const struct rt_config *rt_model_config(const struct rt_model *m);
const struct fmt_shard *rt_model_shard(const struct rt_model *m);
enum rt_device rt_model_device(const struct rt_model *m);
int rt_model_n_ctx(const struct rt_model *m);  /* the n_ctx the model was opened for */
/* Whether this rank's backend can choose tokens on the device (rank 0 of rt_exec_can_pick). */
bool rt_model_can_pick(const struct rt_model *m);

/*
 * The KV cache of this rank: paged pools of n_blocks blocks of block_size tokens per layer and
 * kind ([n_blocks][n_kv_heads_per_rank][block_size][head_dim], kernels/ref.h "paged KV cache"),
 * in backend memory; which blocks a sequence holds comes with every forward (struct
 * rt_kv_step). Errors: RT_ERR_ARG, RT_ERR_NOMEM (says how much).
 */
enum rt_err rt_kv_create(struct rt_model *m, int n_blocks, int block_size, struct rt_kv **out);
void rt_kv_free(struct rt_kv *kv); /* NULL is fine; before its model is freed */
int rt_kv_n_blocks(const struct rt_kv *kv);
int rt_kv_block_size(const struct rt_kv *kv);
/* Bytes of one block of every layer, keys and values, on this rank. */
size_t rt_kv_block_bytes(const struct rt_model *m, int block_size);

/* The block tables of one forward (host, borrowed; rt_exec fills it from its block manager):
 * row j of tables is the table of the j-th sequence of the batch (in order of appearance),
 * table_stride entries per row (>= ceil(positions / block_size) used); before the step, block
 * copy[2i] is copied to copy[2i + 1] in every layer (copy-on-write), i < n_copy. */
struct rt_kv_step {
    const int32_t *tables;
    int table_stride;
    int n_copy;
    const int32_t *copy;
};

/*
 * Check a batch against the model and the positions each slot holds (len[n_seqs]) in a context
 * of n_ctx positions: the checks of rt_exec_forward, the same on every rank. Reports the first
 * problem.
 */
enum rt_err rt_model_check_batch(const struct rt_model *m, const int *len, int n_seqs, int n_ctx,
                                 const struct rt_batch *b);

/* What a forward returns (every rank of a TP set must be given the same). */
enum rt_out {
    RT_OUT_NONE = 0,   /* nothing: a prefill whose logits are not needed */
    RT_OUT_LOGITS = 1, /* the out rows' logits, on rank 0's host */
    RT_OUT_PICK = 2,   /* the out rows' next tokens chosen on rank 0's device */
};

/*
 * This rank's part of one forward (the batch already checked): runs every op on its weights,
 * the collectives through its communicator (every rank must call it with the same batch, block
 * tables and `out`), and writes the keys/values into kv's blocks that ks names. Rank 0 (the gather root) receives the result:
 * RT_OUT_LOGITS: host fp32 logits [n_out][vocab_size]; RT_OUT_PICK: ids[n_out] chosen on its
 * device with picks[n_out] (rt_model_can_pick). Other ranks pass NULL for logits, picks, ids.
 * Errors: backend errors, RT_ERR_PEER (a collective failed because another rank did),
 * RT_ERR_NUMERIC (a pick with no finite logit).
 */
enum rt_err rt_model_forward(struct rt_model *m, struct rt_kv *kv, const struct rt_batch *b,
                             const struct rt_kv_step *ks, enum rt_out out, float *logits,
                             const struct rt_pick *picks, int32_t *ids);

/* --- backends ------------------------------------------------------------------------------- */

/* True when this build has CUDA and at least one usable GPU (no error is logged). */
bool rt_cuda_available(void);

/*
 * The pinned host->device copy rate of GPU `device`: `bytes` from one cudaHostAlloc buffer in
 * cudaMemcpyAsync pieces of `chunk` bytes on one stream, one warm-up pass, then the best of
 * `repeat` passes, in GB/s (1e9 bytes) in *gbps. The ceiling of the weight upload
 * (`qshard bench load`). Errors: RT_ERR_ARG (a zero size or repeat), RT_ERR_DEVICE (no such
 * GPU, out of memory, a failed copy), RT_ERR_NO_DEVICE (a build without CUDA).
 */
enum rt_err rt_cuda_h2d_rate(int device, size_t bytes, size_t chunk, int repeat, double *gbps);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_H */

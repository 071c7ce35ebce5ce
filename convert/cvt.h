/*
 * cvt.h - the converter core: tensor-parallel plan (cvt_plan.c) and conversion driver (cvt_run.c).
 *
 * Who calls it: tools/cmd_convert.c (`qshard convert`), tests/test_cvt_plan.c, tests/test_cvt*.c.
 * The input side (reading HF directories, decoding AWQ variants) is convert/cvt_src.h; the file
 * writer is format/fmt_write.h; the packed int4 layout and its references are kernels/ref.h.
 *
 * Flow:  cvt_source_open -> cvt_dims_from_hf -> cvt_plan_build (config + source tensor names)
 *        -> cvt_plan_print (--dry-run) or cvt_run (stream every (rank, tensor) job through the
 *        format writers, self-check each packed linear, then the manifest).
 *
 * The plan decides everything once (docs/DESIGN.md sections 5-6): which source tensors feed which
 * output tensor of which rank, as rectangles ("segments") of the source placed into the output;
 * whatever no segment covers is zero padding (codes 0, zeros 0, scales 0: contributes exactly 0).
 * Coordinates are always the canonical [K][N] of a linear (K = in_features, N = out_features),
 * also for unquantized linears (stored [N, K] in the source and the rank file; the driver maps
 * the indices),
 * and [rows][cols] for other matrices ([V][H] embeddings, [E][H] router); vectors have rows = 1.
 */
#ifndef QS_CVT_H
#define QS_CVT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cvt_arch.h" /* struct cvt_arch, CVT_ROLE_BIT */
#include "cvt_src.h"  /* enum cvt_err, struct cvt_hf_config, struct cvt_source */
#include "fmt.h"     /* enum fmt_split */

#ifdef __cplusplus
extern "C" {
#endif

/* --- model dimensions the plan needs ------------------------------------------------------ */

#define CVT_MAX_NOT_CONVERT 64

/* Model dimensions, normalised from config.json (+ the AWQ quant config). Filled by
 * cvt_dims_from_hf() or by hand (tests). Read-only once the plan is built. */
struct cvt_dims {
    const struct cvt_arch *arch; /* the family's descriptor (cvt_arch.h) */
    int hidden;             /* H */
    int intermediate;       /* I (per expert for Mixtral) */
    int n_layers;
    int n_heads;            /* query heads */
    int n_kv_heads;         /* = n_heads when the config has none (MHA) */
    int head_dim;           /* hd; hidden / n_heads unless the config says otherwise */
    int vocab;              /* V = config vocab_size */
    int n_experts;          /* Mixtral num_local_experts, 0 for dense models */
    int n_experts_per_tok;
    int group_size;         /* G: a positive multiple of 16, or -1 = per-channel (one group per
                             * linear: G = that linear's K) */
    bool tie_word_embeddings;
    unsigned bias_roles;    /* CVT_ROLE_BIT()s of outputs whose linears carry a bias by config
                             * (qwen2: qkv_proj; llama attention_bias: qkv_proj, o_proj): only
                             * used when planning from the config alone */
    int n_not_convert;      /* modules_to_not_convert entries (substring match on module names) */
    char not_convert[CVT_MAX_NOT_CONVERT][96];
};

/* Fill *d from a parsed HF config (group_size -1, per-channel, is kept as -1). Errors:
 * CVT_ERR_UNSUPPORTED (group_size 0, too many modules_to_not_convert), CVT_ERR_CONFIG (a
 * dimension out of int range); reported once with the key name. */
enum cvt_err cvt_dims_from_hf(const struct cvt_hf_config *hf, struct cvt_dims *d);

/* --- the plan ------------------------------------------------------------------------------ */

/* How an output tensor is produced. */
enum cvt_out_kind {
    CVT_OUT_W4 = 1,         /* packed AWQ linear: `<name>.qweight/.scales/.qzeros` (DESIGN 4.1-4.3),
                             * logical [K, N]; sources are AWQ linears (canonical q/z/s) */
    CVT_OUT_LINEAR_F16 = 2, /* unquantized linear `<name>.weight` F16 [N, K] (nn.Linear order);
                             * sources are float `<src>.weight` [N_src, K_src] */
    CVT_OUT_MAT_F16 = 3,    /* float matrix F16 [rows, cols] (embedding, lm_head) */
    CVT_OUT_VEC_F32 = 4,    /* vector F32 [cols] (norms, biases) or F32 matrix [rows, cols] (router) */
    CVT_OUT_PERM = 5,       /* act-order input permutation `<name>.perm` I32 [K] of a W4 output
                             * (DESIGN 4.5): x[perm[j]] is the linear's input j; one segment per
                             * source linear (all must agree), rows past them the identity */
};

/* Where a source tensor comes from. */
enum cvt_src_kind {
    CVT_SRC_AWQ = 1,        /* quantized linear, name = module prefix (q/z/s decoded by cvt_awq_load) */
    CVT_SRC_FLOAT = 2,      /* float tensor, name = full tensor name */
};

/* One source tensor the plan reads (deduplicated across ranks and outputs). */
struct cvt_plan_src {
    char name[160];         /* module prefix (AWQ) or full tensor name (float) */
    enum cvt_src_kind kind;
    int64_t rows, cols;     /* expected logical shape: [K, N] for linears (also float .weight,
                             * whose file shape is [N, K]); [rows, cols] matrices; [1, n] vectors */
    bool file_transposed;   /* float linear .weight: the file holds [cols, rows] = [N, K] */
    int64_t group;          /* AWQ: the source's group size G (= rows when per-channel); else 0 */
};

/* A rectangle of a source placed into an output: source rows [src_r0, src_r0 + n_rows) and
 * columns [src_c0, src_c0 + n_cols) go to output rows/columns starting at dst_r0 / dst_c0. */
struct cvt_seg {
    int src;                /* index into plan->srcs */
    int64_t src_r0, src_c0;
    int64_t n_rows, n_cols;
    int64_t dst_r0, dst_c0;
};

#define CVT_MAX_SEGS 3 /* segments the fast W4 path takes (convert/cvt_fast.c); more (Falcon-40B's
                        * grouped query_key_value: three per kv group) go the generic way */

/* One output tensor of one rank. */
struct cvt_out {
    char name[160];         /* W4: module prefix (`...qkv_proj`); otherwise the full tensor name */
    enum cvt_out_kind kind;
    enum fmt_split split;   /* format/fmt.h: NONE replicated (norms, router, row-parallel bias
                             * on rank 0); COLUMN output features (axis 1 of [K, N], axis 0 of a
                             * [N, K] F16 linear); ROW input features (axis 0 of [K, N], axis 1 of
                             * a [N, K] F16 linear); VOCAB vocabulary rows (axis 0). Recorded at
                             * any tp; the rank file says NONE at tp 1 */
    int64_t rows, cols;     /* logical [K, N] (W4 and LINEAR_F16), [rows, cols] otherwise */
    int n_segs, cap_segs;
    struct cvt_seg *segs;   /* owned [n_segs] (freed by cvt_plan_free) */
    uint64_t bytes;         /* data bytes in the rank file (W4: qweight + scales + qzeros) */
    float offset;           /* VEC_F32: added to every value read (fp32; Gemma's 1 + w norms) */
    int64_t group;          /* W4: this output's local group size G_r; scales/qzeros have
                             * rows / G_r rows (DESIGN 4: G_r = gcd(G, K_r), which divides G and
                             * every slice start, so each local group lies inside one source
                             * group and takes its scale/zero row); 0 for other kinds */
};

struct cvt_rank_plan {
    int rank;
    int n_outs;
    struct cvt_out *outs;   /* owned */
    int heads;              /* query heads on this rank (nq_r) */
    int kv_heads;           /* kv heads on this rank (nkv_r) */
    int kv_head_first;      /* first source kv head held */
    uint64_t data_bytes;    /* sum of outs[].bytes */
    uint64_t file_bytes;    /* data_bytes with every tensor aligned to CVT_FILE_ALIGN (estimate of
                             * the rank file size without header, config and tokenizer) */
};

#define CVT_FILE_ALIGN 4096 /* tensor data alignment in a .qshard file (format/SPEC.md) */

struct cvt_plan {
    struct cvt_dims d;
    int tp;                 /* world_size */
    int heads_per_rank;     /* nq_r */
    int kv_heads_per_rank;  /* nkv_r */
    int kv_head_replicas;   /* ranks sharing one kv head (1 when tp <= n_kv_heads) */
    int inter_unit;         /* U = lcm(G, 64); 64 for per-channel */
    int inter_padded;       /* I_pad = ceil(I / (U*tp)) * U*tp */
    int inter_per_rank;     /* I_r = I_pad / tp */
    int vocab_per_rank;     /* V_r = ceil(V / tp) */
    bool has_lm_head;       /* separate lm_head output (false when tied) */
    unsigned bias_roles;    /* CVT_ROLE_BIT()s of the outputs planned with a bias (from the
                             * files; the config section's attention_bias is FMT_N_QKV's) */
    int n_unquantized;      /* linears stored as F16 .weight */
    int n_srcs;
    struct cvt_plan_src *srcs;   /* owned */
    struct cvt_rank_plan *ranks; /* owned, [tp] */
};

/* Which source tensors exist (from the input's tensor catalog). `names` are full tensor names as
 * in the files; the plan only reads them during cvt_plan_build. NULL = plan from the config alone
 * (dry-run of a bare config.json): every linear is quantized unless modules_to_not_convert names
 * it, biases follow dims.bias_roles, lm_head follows tie_word_embeddings. */
struct cvt_name_list {
    int n;
    const char *const *names;
    int n_act_order;                /* quantized linears (module prefixes) whose g_idx is
                                     * act-order (cvt_awq_gidx); they get a .perm output */
    const char *const *act_order;
};

/* Build the plan for `tp` ranks. With a name list, every name must be recognised (rotary
 * `inv_freq` buffers are ignored explicitly) and every tensor the model needs must be present.
 * Errors (reported once, naming the tensor or constraint and, for --tp, the valid values):
 * CVT_ERR_TP (tp does not fit heads / kv heads / per-rank shape rules), CVT_ERR_UNKNOWN_TENSOR,
 * CVT_ERR_MISSING_TENSOR, CVT_ERR_UNSUPPORTED (quantized lm_head or router, half-quantized fused
 * group, act-order in MoE experts or in only some parts of a fused group), CVT_ERR_TP (an
 * act-order row-parallel linear at tp > 1: its groups do not follow the rank split),
 * CVT_ERR_CONFIG, CVT_ERR_NOMEM. On error *out is NULL. */
enum cvt_err cvt_plan_build(const struct cvt_dims *d, const struct cvt_name_list *names, int tp,
                            struct cvt_plan **out);

/* Free a plan (NULL ok). */
void cvt_plan_free(struct cvt_plan *p);

/* The output `name` of `rank` (W4 outputs by module prefix), or NULL. */
const struct cvt_out *cvt_plan_find(const struct cvt_plan *p, int rank, const char *name);

/* Write the tp values (ascending, at most `cap`) for which cvt_plan_build would accept the model's
 * head / kv-head / per-rank shape rules, up to max_tp. Returns how many were written. */
int cvt_plan_valid_tp(const struct cvt_dims *d, int max_tp, int *vals, int cap);

/* Human-readable plan for --dry-run: dims, per-rank heads / kv heads / sizes, every padding
 * decision. */
void cvt_plan_print(const struct cvt_plan *p, FILE *f);

/* --- the AutoAWQ GEMM fast path (cvt_fast.c) ------------------------------------------------- */

/* Working buffers of cvt_fast_w4_chunk, owned by the caller (one set per worker thread). */
struct cvt_fast_bufs {
    uint8_t *qp;       /* packed qweight of the chunk: [cw/64][K/16] tiles of 512 bytes */
    uint16_t *sp;      /* packed scales: [cw/64][K/G_r][64] fp16 bits */
    uint8_t *zp;       /* packed qzeros: [cw/64][K/G_r][8] uint32 words */
    float *src_dq;     /* [P][64] self-check piece, source side (cvt_fast_piece_bytes) */
    float *our_dq;     /* [P][64] self-check piece, our side */
};

/* First element where the self-check found the two dequantizations different. */
struct cvt_fast_mismatch {
    int64_t k, n;          /* output coordinates (row, column of the whole output) */
    const char *src_name;  /* source linear prefix, or NULL for zero padding */
    int64_t src_k, src_n;  /* source coordinates (when src_name) */
    float want, got;       /* dequantized source (or +0.0), dequantized packed output */
};

enum cvt_fast_rc {
    CVT_FAST_OK = 0,       /* chunk packed (and checked) into the buffers */
    CVT_FAST_NO = 1,       /* not for the fast path (or a bad value): use the generic path */
    CVT_FAST_MISMATCH = 2, /* self-check failed: *mm says where (nothing reported yet) */
    CVT_FAST_REF_FAIL = 3, /* ref_dequant_w4 refused the piece (reported by it) */
};

/* Can every chunk of W4 output o take the fast path (all its sources AutoAWQ GEMM with F16
 * scales, segment edges on the 8-column, 16-row and local-group grid, one segment per column)?
 * Probes the source tensors; reports nothing. */
bool cvt_fast_w4_ok(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                    const struct cvt_plan *p, const struct cvt_out *o);
/* Bytes of one [P][64] fp32 self-check piece for local group size G (P = G up to 256 rows,
 * else gcd(G, 256)); src_dq and our_dq each need this much. */
size_t cvt_fast_piece_bytes(int64_t G);
/* Pack columns [c0, c0 + cw) (multiples of 64) of W4 output o into b->qp / b->sp / b->zp
 * (K*cw/2, K/G_r*cw*2 and K/G_r*cw/2 bytes: DESIGN 4.1-4.3, bit-identical to cvt_awq_load +
 * ref_pack_*) straight from the mapped AutoAWQ GEMM source words; with `check`, the bitwise
 * self-check per [P][64] piece (source dequantized by this file's own walk, ours by
 * ref_dequant_w4; padding +0.0). `corrupt_first` flips the lowest bit of the chunk's first
 * packed byte before its check (test hook cvt_hooks.corrupt_output). Returns CVT_FAST_NO
 * without a message when the chunk is not for this path or a scale is not finite and > 0 (the
 * generic path then names it); the buffers' contents are then undefined. */
enum cvt_fast_rc cvt_fast_w4_chunk(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                                   const struct cvt_plan *p, const struct cvt_out *o, int64_t c0,
                                   int64_t cw, bool check, bool corrupt_first,
                                   const struct cvt_fast_bufs *b, struct cvt_fast_mismatch *mm);

/* --- the driver (cvt_run.c) ---------------------------------------------------------------- */

/* Test hooks: deterministic stand-ins for events a test cannot otherwise cause. NULL in
 * production (cvt_opts.hooks); tests/test_cvt*.c pass one when they call cvt_run in process. */
struct cvt_hooks {
    const char *signal_at;      /* "opened" (source open), "writing" (writers open) or "written"
                                 * (every file in the staging directory, not committed): raise
                                 * SIGINT when cvt_run reaches that point */
    const char *corrupt_output; /* name of a W4 output (module prefix): flip the lowest bit of its
                                 * first packed code after packing, before the self-check */
    int commit_fail;            /* k > 0: the k-th rename of the commit (1-based) fails as if with
                                 * EIO; 0 none */
    uint64_t chunk_bytes;       /* working-memory budget of all workers together, bytes; 0 = the
                                 * default (192 MiB). Small values make tiny fixtures go through
                                 * many chunks and row blocks */
    void (*on_stage)(const char *stage, void *arg); /* called at the signal_at points, with the
                                 * stage name, before the signal (a test starts a second convert
                                 * while this one holds OUT_DIR); NULL none */
    void *on_stage_arg;
};

struct cvt_opts {
    const char *model_dir;
    const char *out_dir;
    int tp;
    int threads;            /* 0 = one per online core */
    bool dry_run;           /* print the plan, write nothing */
    bool no_check;          /* skip the bitwise self-check */
    bool quiet;             /* no progress bar, no info messages */
    bool force;             /* replace an earlier conversion in out_dir (after the new one is
                             * complete; docs/CONVERT.md section 2) */
    bool no_fast_path;      /* --debug-no-fast-path: every packed output through the generic
                             * decoder (an A/B switch; the bytes are the same) */
    const struct cvt_hooks *hooks; /* NULL in production */
};

/* Convert model_dir into out_dir/rank-K-of-N.qshard + manifest (or print the plan with dry_run).
 * Memory is bounded (one linear per worker thread, float tensors in chunks, a byte budget across
 * workers). Everything is written into a staging directory inside out_dir and moved into place
 * only when complete; on any failure or signal before that, every file and directory this call
 * created is removed and an earlier conversion in out_dir is left as it was (docs/CONVERT.md
 * section 2). Catches SIGINT / SIGTERM / SIGHUP while it runs (restored on return). Errors:
 * every cvt_err (input, plan, self-check CVT_ERR_SELF_CHECK, writer CVT_ERR_IO),
 * CVT_ERR_TOKENIZER (tokenizer files incomplete, unloadable or larger than the vocabulary),
 * CVT_ERR_EXISTS (an earlier conversion without force), CVT_ERR_LOCKED (another convert is
 * writing out_dir), CVT_ERR_SAME_DIR (out_dir is model_dir), CVT_ERR_INTERRUPTED. */
enum cvt_err cvt_run(const struct cvt_opts *o);

#ifdef __cplusplus
}
#endif
#endif /* QS_CVT_H */

/*
 * cvt_run_int.h - the conversion driver's shared state, private to the files that make up
 * cvt_run() (cvt.h):
 *   cvt_run.c     the entry point: open, plan, validate, start the workers, finish, commit;
 *                 signals, progress;
 *   cvt_job.c     the workers: one output tensor of one rank per job (packed W4 linears with the
 *                 self-check, float tensors);
 *   cvt_write.c   what goes into each rank file before its tensors: validation of the sources,
 *                 config section (DESIGN 6), model id, tensor table;
 *   cvt_outdir.c  the output directory: lock, staging directory, commit, clean-up;
 *   cvt_tok.c     the tokenizer check (the files the rank files will carry load, and fit the
 *                 vocabulary).
 * Not a public header: the API is cvt.h.
 */
#ifndef QS_CVT_RUN_INT_H
#define QS_CVT_RUN_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cvt.h"
#include "fmt_write.h" /* struct fmt_writer */

/* Memory budget for all workers' chunk buffers together (bytes). With the input side dropping
 * mapped pages after each read, this is what bounds peak RSS (plus the plan and the catalog). */
#define CVT_CHUNK_BUDGET (192ull << 20)

/* One unit of work: output `out` of rank `rank`. */
struct cvt_job {
    int rank;
    int out;                /* index into plan->ranks[rank].outs */
};

struct cvt_run_state {
    const struct cvt_opts *o;
    const struct cvt_hooks *hooks; /* o->hooks, or an all-zero set (never NULL) */
    struct cvt_source *src;
    const struct cvt_hf_config *cfg;
    struct cvt_plan *plan;
    struct fmt_writer **w;  /* [tp], NULL once finished or aborted */
    uint32_t **idx;         /* [tp][n_outs]: first tensor index of each output (W4: q, s, z) */
    const struct cvt_src_tensor **src_t; /* [n_srcs]: catalog entry of float sources */
    char variant[64];       /* "gemm", or "gemm+gemv" when linears disagree */
    char stage[4096];       /* staging directory inside out_dir ("" until created): the
                             * rank files and manifest are written here, then committed */

    struct cvt_job *jobs;
    size_t n_jobs;
    atomic_size_t next_job;
    atomic_int failed;      /* first failure stops every worker */
    enum cvt_err err;       /* first error (under lock) */
    pthread_mutex_t lock;
    uint64_t chunk_bytes;   /* working-memory budget per worker */

    /* progress */
    atomic_uint_fast64_t done_bytes;
    uint64_t total_bytes;
    double t0;
    bool bar;
    pthread_mutex_t bar_lock;
    double last_draw;
};

/* --- cvt_run.c ------------------------------------------------------------------------------ */

/* Should workers stop (a failure elsewhere, or a signal)? */
bool cvt_run_stopped(struct cvt_run_state *R);
/* Record the first failure; every worker stops. */
void cvt_run_fail(struct cvt_run_state *R, enum cvt_err e);
/* Stream n bytes at byte `off` of tensor `index` of rank's file and count them for the progress
 * bar. Errors: CVT_ERR_NOMEM, CVT_ERR_IO (reported by the writer). */
enum cvt_err cvt_run_put_part(struct cvt_run_state *R, int rank, uint32_t index, uint64_t off,
                              const void *data, size_t n);

/* --- cvt_job.c ------------------------------------------------------------------------------ */

/* Worker thread body (pthread_create argument: the state): take jobs from R->jobs until none is
 * left or the run stops; the first error goes to cvt_run_fail. */
void *cvt_job_worker(void *state);

/* --- cvt_write.c ---------------------------------------------------------------------------- */

/* Every source the plan reads: AWQ linears probed (variant, shapes vs config), float tensors
 * found with the expected shape and a float dtype; fills R->src_t and R->variant. Errors as
 * cvt_awq_probe, CVT_ERR_MISSING_TENSOR, CVT_ERR_SHAPE, CVT_ERR_DTYPE, CVT_ERR_NOMEM. */
enum cvt_err cvt_write_validate_sources(struct cvt_run_state *R);
/* XXH3-128 of config.json bytes + the tensor catalog (names, dtypes, shapes) + tp: identical for
 * every rank of one conversion, different for another model or split. */
void cvt_write_model_id(const struct cvt_run_state *R, uint8_t id[16]);
/* Open rank's writer in R->stage: sections (config of DESIGN 6, generation config, tokenizer
 * files), every tensor of the plan declared (R->idx[rank]), data begun. Errors: CVT_ERR_IO,
 * CVT_ERR_NOMEM, CVT_ERR_ARG (reported by the writer). */
enum cvt_err cvt_write_open(struct cvt_run_state *R, int rank, const uint8_t id[16]);

/* --- cvt_outdir.c --------------------------------------------------------------------------- */

/* Directories this run created, deepest last, removed (if empty) after a failure; and the output
 * lock held while the run writes. */
struct cvt_outdir {
    int n_made;
    char made[16][4096];
    int lock_fd;            /* -1 when not held */
    char lock_path[4096 + 64];
};

/* Create out_dir if needed (d->made lists what was created); lock it against a concurrent
 * convert (CVT_ERR_LOCKED, naming the other process); refuse an earlier conversion there
 * (manifest.json or any rank-K-of-N.qshard) without --force (CVT_ERR_EXISTS); create the staging
 * directory stage[4096] ("" until it exists). Nothing existing is touched. */
enum cvt_err cvt_outdir_prepare(const struct cvt_opts *o, struct cvt_outdir *d, char *stage);
/* Move the finished conversion in stage into out_dir (docs/CONVERT.md section 2, step 6).
 * `commit_fail` (hooks, 1-based; 0 none) fails that rename as with EIO. Errors: CVT_ERR_IO,
 * CVT_ERR_NOMEM; the earlier conversion is back in place. */
enum cvt_err cvt_outdir_commit(const char *out_dir, char *stage, int tp, int commit_fail);
/* After a failure: remove the staging directory, the lock and the directories this run made. */
void cvt_outdir_cleanup(char *stage, struct cvt_outdir *d);
/* Release the lock (its file is removed); nothing to do when it is not held. */
void cvt_outdir_unlock(struct cvt_outdir *d);

/* --- cvt_tok.c ------------------------------------------------------------------------------ */

/* The tokenizer files the rank files will carry, checked as `qshard run` will load them
 * (docs/CONVERT.md section 2, step 1): a tokenizer_config.json / special_tokens_map.json /
 * added_tokens.json without tokenizer.json or tokenizer.model, a tokenizer the runtime's loader
 * (runtime/rt_tok.h) refuses, or one with more ids than the config's vocab_size is
 * CVT_ERR_TOKENIZER; no tokenizer files at all is a warning (the source reported it). */
enum cvt_err cvt_tok_check(const struct cvt_source *src, const struct cvt_hf_config *cfg);

#endif /* QS_CVT_RUN_INT_H */

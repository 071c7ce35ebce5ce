/*
 * cvt_run.c - the conversion driver: HF AWQ directory -> OUT_DIR/rank-K-of-N.qshard + manifest.
 *
 * Entry point: cvt_run() (cvt.h), called by `qshard convert` (cvt_main.c) and tests/test_cvt.c.
 *
 * Steps:
 *   1. open the source (cvt_src.h), normalise the config, build the TP plan (cvt_plan.c);
 *   2. validate every source tensor the plan reads before writing anything: AWQ linears through
 *      cvt_awq_probe (variant + shapes vs config), float tensors by catalog shape;
 *   3. open one format writer per rank (config JSON of DESIGN 6 with that rank's tp block,
 *      tokenizer files, generation config), declare every tensor, begin_data;
 *   4. a pthreads work queue over (output tensor, rank) jobs. Quantized outputs are produced in
 *      column chunks of whole 64-wide n-tiles: in the packed layouts (DESIGN 4.1-4.3) the bytes of
 *      n-tiles [a, b) of qweight, scales and qzeros are each one contiguous range, in order, so
 *      a chunk is packed on its own and streamed with fmt_writer_put_tensor_part(). Each chunk:
 *      decode the source slices in blocks of whole source groups (cvt_awq_load; a row slice that
 *      starts inside a group reads the whole group and keeps its rows), place them with the
 *      output's local group size G_r (each local group's scale/zero row is its source group's,
 *      DESIGN 4; zero padding elsewhere), pack
 *      (ref_pack_*), then the SELF-CHECK: ref_dequant_w4 of our packed chunk must equal
 *      cvt_awq_dequant_source of the same source slice bit for bit, and padding must dequantize to
 *      +0.0. Float tensors are converted in row chunks. Memory per worker is bounded by the
 *      chunk budget, so peak RSS does not grow with model size.
 *      Outputs whose sources are all AutoAWQ GEMM with F16 scales (nearly every checkpoint)
 *      take the fast path of cvt_fast.c instead: tiles straight from the mapped source words,
 *      the self-check fused per piece, chunks ~10x wider, same bytes (test_cvt compares the
 *      two paths; QSHARD_CVT_NO_FAST=1 forces the generic one). Jobs run largest first;
 *   5. finish every writer (fsync + rename), then the manifest, all inside a fresh staging
 *      directory OUT_DIR/.qshard-convert.XXXXXX; then commit: move them into OUT_DIR (an earlier
 *      conversion's files are replaced only now; stale rank files of another world size are
 *      removed). On any failure or signal before the commit: abort every writer, remove the
 *      staging directory and the output directories this call created; OUT_DIR's earlier content
 *      is untouched.
 *
 * Test: ./build/test_cvt (fixtures of tests/data/models, bad inputs, PITFALLS cases).
 */
#include "cvt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "fmt_write.h" /* fmt_writer_*, fmt_rank_file_name, fmt_manifest_write */
#include "qs_json.h"   /* qs_rope_type_name */
#include "qs_log.h"    /* qs_log_error, qs_log_warn, qs_log_info */
#include "ref.h"       /* ref_pack_w4, ref_pack_scales, ref_pack_zeros, ref_dequant_w4 */

/* Memory budget for all workers' chunk buffers together (bytes). With the input side dropping
 * mapped pages after each read, this is what bounds peak RSS (plus the plan and the catalog). */
#define CVT_CHUNK_BUDGET (192ull << 20)
/* Bytes of working memory per element of a quantized load chunk, as budgeted: codes 1, packed
 * chunk 0.5, the source-dequant block and the decoder's k-blocked slices (4.5 of slack: this once
 * also held an fp32 dequantized copy of the whole chunk, which the self-check no longer keeps). */
#define CVT_BYTES_PER_CODE 6
/* Float tensors are converted in pieces of at most this many elements. */
#define CVT_FLOAT_CHUNK (1u << 20)

/* --- state --------------------------------------------------------------------------------- */

struct job {
    int rank;
    int out;                /* index into plan->ranks[rank].outs */
};

struct run {
    const struct cvt_opts *o;
    struct cvt_source *src;
    const struct cvt_hf_config *cfg;
    struct cvt_plan *plan;
    struct fmt_writer **w;  /* [tp], NULL once finished or aborted */
    uint32_t **idx;         /* [tp][n_outs]: first tensor index of each output (W4: q, s, z) */
    const struct cvt_src_tensor **src_t; /* [n_srcs]: catalog entry of float sources */
    char variant[64];       /* "gemm", or "gemm+gemv" when linears disagree */
    char stage[4096];       /* staging directory inside out_dir ("" until created): the
                             * rank files and manifest are written here, then committed */

    struct job *jobs;
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

/* Set by SIGINT / SIGTERM / SIGHUP while cvt_run writes: workers stop, everything written so far
 * is removed, cvt_run returns CVT_ERR_INTERRUPTED. */
static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

static const int k_signals[3] = {SIGINT, SIGTERM, SIGHUP};

/* Catch SIGINT / SIGTERM / SIGHUP (old[] receives the previous actions). A signal the caller
 * ignores (SIG_IGN, e.g. under nohup) stays ignored. */
static void signals_catch(struct sigaction old[3])
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    for (int i = 0; i < 3; i++) {
        sigaction(k_signals[i], NULL, &old[i]);
        if (old[i].sa_handler != SIG_IGN)
            sigaction(k_signals[i], &sa, NULL);
    }
}

static void signals_restore(const struct sigaction old[3])
{
    for (int i = 0; i < 3; i++)
        sigaction(k_signals[i], &old[i], NULL);
}

/* Test knob (tests/test_cvt.c): QSHARD_CVT_TEST_SIGNAL=<stage> raises SIGINT when cvt_run
 * reaches `stage`, so the interrupted paths run deterministically. */
static void test_signal_point(const char *stage)
{
    const char *s = getenv("QSHARD_CVT_TEST_SIGNAL");
    if (s && !strcmp(s, stage))
        raise(SIGINT);
}

/* Did a signal arrive before anything was written? Then say so and set *e. */
static bool interrupted_early(enum cvt_err *e)
{
    if (!g_signal)
        return false;
    qs_log_error("cvt_run", "interrupted by signal %d before anything was written",
                 (int)g_signal);
    *e = CVT_ERR_INTERRUPTED;
    return true;
}

/* Do a and b name the same existing directory (symlinks and `..` resolved)? */
static bool same_dir(const char *a, const char *b)
{
    char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
    struct stat sa, sb;
    bool same = ra && rb && !strcmp(ra, rb);
    if (!same && stat(a, &sa) == 0 && stat(b, &sb) == 0) /* e.g. a bind mount */
        same = sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    free(ra);
    free(rb);
    return same;
}

/* Should workers stop (a failure elsewhere, or a signal)? */
static bool run_stopped(struct run *R) { return atomic_load(&R->failed) || g_signal; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_fail(struct run *R, enum cvt_err e)
{
    pthread_mutex_lock(&R->lock);
    if (!atomic_load(&R->failed)) {
        R->err = e;
        atomic_store(&R->failed, 1);
    }
    pthread_mutex_unlock(&R->lock);
}

/* --- progress bar -------------------------------------------------------------------------- */

static void fmt_size(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else
        snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024));
}

static void progress_draw(struct run *R, bool final)
{
    double t = now_s(), el = t - R->t0;
    uint64_t done = atomic_load(&R->done_bytes);
    double frac = R->total_bytes ? (double)done / (double)R->total_bytes : 1.0;
    double rate = el > 0 ? (double)done / el : 0;
    double eta = rate > 0 ? (double)(R->total_bytes - done) / rate : 0;
    char a[32], b[32], c[32];
    int width = 30, fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[width] = '\0';
    fmt_size(a, sizeof(a), (double)done);
    fmt_size(b, sizeof(b), (double)R->total_bytes);
    fmt_size(c, sizeof(c), rate);
    fprintf(stderr, "\r[%s] %3d%% %s / %s  %s/s  ETA %d:%02d ", bar, (int)(frac * 100), a, b, c,
            (int)eta / 60, (int)eta % 60);
    if (final)
        fputc('\n', stderr);
    fflush(stderr);
}

static void progress_add(struct run *R, uint64_t bytes)
{
    atomic_fetch_add(&R->done_bytes, bytes);
    if (!R->bar || pthread_mutex_trylock(&R->bar_lock))
        return;
    double t = now_s();
    if (t - R->last_draw >= 0.2) {
        R->last_draw = t;
        progress_draw(R, false);
    }
    pthread_mutex_unlock(&R->bar_lock);
}

/* --- writing helpers ----------------------------------------------------------------------- */

static enum cvt_err put_part(struct run *R, int rank, uint32_t index, uint64_t off, const void *data,
                             size_t n)
{
    enum fmt_err fe = fmt_writer_put_tensor_part(R->w[rank], index, off, data, n);
    if (fe)
        return fe == FMT_ERR_NOMEM ? CVT_ERR_NOMEM : CVT_ERR_IO; /* reported by the writer */
    progress_add(R, n);
    return CVT_ERR_NONE;
}

/* Columns per chunk of a quantized output with K rows: whole n-tiles within the budget. */
static int64_t chunk_cols(const struct run *R, int64_t K, int64_t N)
{
    int64_t c = (int64_t)(R->chunk_bytes / CVT_BYTES_PER_CODE) / K / 64 * 64;
    if (c < 64)
        c = 64;
    return c < N ? c : N;
}

/* --- quantized outputs --------------------------------------------------------------------- */

/* First differing element of the self-check, reported with every coordinate. */
static enum cvt_err check_fail(const struct run *R, int rank, const struct cvt_out *o,
                               const char *src_name, int64_t src_k, int64_t src_n, int64_t k,
                               int64_t n, float want, float got)
{
    if (!src_name)
        qs_log_error(__func__, "rank %d: tensor %s.qweight: self-check failed at [k=%" PRId64
                               ", n=%" PRId64 "] (zero padding): expected +0, got %.9g "
                               "(dequantized packed output)",
                     rank, o->name, k, n, (double)got);
    else
        qs_log_error(__func__, "rank %d: tensor %s.qweight: self-check failed at [k=%" PRId64
                               ", n=%" PRId64 "] (source %s [%" PRId64 ", %" PRId64 "]): "
                               "expected %.9g (dequantized source), got %.9g (dequantized "
                               "packed output)",
                     rank, o->name, k, n, src_name, src_k, src_n, (double)want, (double)got);
    (void)R;
    return CVT_ERR_SELF_CHECK;
}

/* Working buffers of one worker for a quantized output. The load chunk is [K][C] (canonical
 * codes q, zeros z, scales s); packing runs on sub-blocks of CVT_SUB_COLS columns copied to
 * small contiguous buffers (xq, xz, xs), packed into their place in the chunk's packed copy
 * (qp, sp, zp: in DESIGN 4.1-4.3 the n-tiles [a, b) of a chunk are one contiguous range of each).
 * The self-check compares ws = source dequant of one k-block of rows with xw = our packed
 * chunk dequantized one [P][64] piece at a time (w4_check_ours), never a whole fp32 chunk. */
#define CVT_SUB_COLS 256

/* Owned by one worker, kept across its jobs (grown when a job needs more), so chunk buffers
 * are not mapped, zero-filled by the kernel and unmapped again for every output. */
struct w4_bufs {
    uint8_t *q, *z;         /* [K][C], [K/G][C] */
    uint16_t *s;            /* [K/G][C] */
    float *wq, *ws;         /* unused; [k_block][C] (self-check only) */
    uint8_t *xq, *xz, *qp, *zp; /* sub-block [K][S], [K/G][S]; packed chunk [K*C/2], [K/G*C/2] */
    uint16_t *xs, *sp;      /* sub-block [K/G][S]; packed chunk [K/G*C] */
    float *xw;              /* [P][64]: one piece of our dequantized output (self-check only) */
    size_t cap[12];         /* bytes allocated for each pointer above, in order */
};

#define W4_NBUF 12

static void **w4_slot(struct w4_bufs *b, int i)
{
    void **slots[W4_NBUF] = {(void **)&b->q,  (void **)&b->z,  (void **)&b->s,  (void **)&b->wq,
                             (void **)&b->ws, (void **)&b->xq, (void **)&b->xz, (void **)&b->qp,
                             (void **)&b->zp, (void **)&b->xs, (void **)&b->sp, (void **)&b->xw};
    return slots[i];
}

/* Make buffer i at least `need` bytes (contents not kept). */
static bool w4_ensure(struct w4_bufs *b, int i, size_t need)
{
    void **p = w4_slot(b, i);
    if (need <= b->cap[i])
        return true;
    free(*p);
    *p = malloc(need ? need : 1);
    b->cap[i] = *p ? need : 0;
    return *p != NULL;
}

static void w4_bufs_free(struct w4_bufs *b)
{
    for (int i = 0; i < W4_NBUF; i++)
        free(*w4_slot(b, i));
    memset(b, 0, sizeof(*b));
}

/* Copy columns [c, c + S) of the [rows][C] matrix src into the contiguous [rows][S] dst. */
static void copy_cols(void *dst, const void *src, int64_t rows, int64_t C, int64_t c, int64_t S,
                      size_t es)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)dst + (size_t)(r * S) * es, (const char *)src + (size_t)(r * C + c) * es,
               (size_t)S * es);
}

/* Test knob (tests/test_cvt.c): QSHARD_CVT_TEST_CORRUPT=<output tensor name> flips the lowest
 * bit of the first packed code of that output (its first sub-block) after packing, standing in
 * for a packing bug, so the test can prove the bitwise self-check catches it. */
static void test_corrupt_point(const struct cvt_out *o, int64_t c, uint8_t *qp)
{
    const char *s = getenv("QSHARD_CVT_TEST_CORRUPT");
    if (s && c == 0 && !strcmp(s, o->name))
        qp[0] ^= 1;
}

/* Stream the packed qweight, scales and qzeros of `cols` further columns of W4 output o (whole
 * n-tiles, contiguous in all three layouts, DESIGN 4) to rank's file at offs[0..2], which
 * advance by the bytes written. */
static enum cvt_err put_w4_cols(struct run *R, int rank, const struct cvt_out *o, int64_t cols,
                                const uint8_t *qp, const uint16_t *sp, const uint8_t *zp,
                                uint64_t offs[3])
{
    int64_t K = o->rows, ng = K / o->group;
    uint32_t i0 = R->idx[rank][o - R->plan->ranks[rank].outs];
    size_t nq = (size_t)(K * cols / 2), ns = (size_t)(ng * cols) * 2, nz = (size_t)(ng * cols / 2);
    enum cvt_err e;
    if ((e = put_part(R, rank, i0, offs[0], qp, nq)) ||
        (e = put_part(R, rank, i0 + 1, offs[1], sp, ns)) ||
        (e = put_part(R, rank, i0 + 2, offs[2], zp, nz)))
        return e;
    offs[0] += nq;
    offs[1] += ns;
    offs[2] += nz;
    return CVT_ERR_NONE;
}

/* Pack columns [c0 + c, c0 + c + S) (a sub-block of the load chunk) into their place in the
 * chunk's packed copy (kept for the self-check) and stream the packed bytes to the rank file. */
static enum cvt_err w4_sub(struct run *R, int rank, const struct cvt_out *o, int64_t cw,
                           int64_t c, int64_t S, struct w4_bufs *b, uint64_t offs[3])
{
    int64_t K = o->rows, ng = K / o->group;
    copy_cols(b->xq, b->q, K, cw, c, S, 1);
    copy_cols(b->xz, b->z, ng, cw, c, S, 1);
    copy_cols(b->xs, b->s, ng, cw, c, S, 2);
    uint8_t *qp = b->qp + (size_t)(c * K / 2), *zp = b->zp + (size_t)(c * ng / 2);
    uint16_t *sp = b->sp + (size_t)(c * ng);
    if (ref_pack_w4(b->xq, (int)K, (int)S, qp) || ref_pack_scales(b->xs, (int)ng, (int)S, sp) ||
        ref_pack_zeros(b->xz, (int)ng, (int)S, zp)) {
        qs_log_error(__func__, "rank %d: tensor %s: packing failed (reported above)", rank,
                     o->name);
        return CVT_ERR_RANGE;
    }
    test_corrupt_point(o, c, qp);
    return put_w4_cols(R, rank, o, S, qp, sp, zp, offs);
}

/* Source rows per decoder call: whole groups, about CVT_K_BLOCK_BYTES of 4-bit codes of the
 * source's full rows (at most CVT_K_BLOCK_MAX rows). Reading a block of rows at a time keeps the
 * pages of the source mapping that one call touches (and the input side drops again afterwards)
 * small: a column slice of a GEMM qweight [K, N/8] touches every page of the rows it reads, so a
 * whole-K call would map the entire tensor (35 MB for a 13B gate_proj) in every worker at once.
 * Larger blocks mean fewer calls (each probes the tensors and madvises them). */
#define CVT_K_BLOCK_BYTES (2u << 20)
#define CVT_K_BLOCK_MAX 2048

static int64_t k_block(const struct run *R, int64_t G, int64_t N_src)
{
    /* a quarter of the worker's budget when that is smaller (the tests' tiny budgets) */
    uint64_t bytes = R->chunk_bytes / 4 < CVT_K_BLOCK_BYTES ? R->chunk_bytes / 4 : CVT_K_BLOCK_BYTES;
    int64_t rows = (int64_t)bytes / (N_src / 2 > 0 ? N_src / 2 : 1);
    if (rows > CVT_K_BLOCK_MAX)
        rows = CVT_K_BLOCK_MAX;
    rows = rows / G * G;
    return rows < G ? G : rows;
}

/* Largest k_block over the sources of output o (sizes the source-dequant buffer). */
static int64_t k_block_max(const struct run *R, const struct cvt_out *o)
{
    int64_t m = 0;
    for (int si = 0; si < o->n_segs; si++) {
        const struct cvt_plan_src *ps = &R->plan->srcs[o->segs[si].src];
        int64_t kb = k_block(R, ps->group, ps->cols);
        m = kb > m ? kb : m;
    }
    return m ? m : o->group;
}

/* The source row blocks a segment is read in: cvt_awq_load / cvt_awq_dequant_source take whole
 * source groups, but a row-parallel slice may start or end inside one (local group size G_r < G,
 * DESIGN 4), so block i reads the group-aligned rows [b0, b1) and uses only [k0, k1), the part
 * inside the segment's source rows. Blocks step by kb (a multiple of the source group). */
struct src_blk {
    int64_t b0, b1; /* rows read (multiples of the source group; b1 may be the source's K) */
    int64_t k0, k1; /* rows used, inside [b0, b1) and the segment */
};

static bool src_blk_next(const struct cvt_seg *sg, const struct cvt_plan_src *ps, int64_t kb,
                         struct src_blk *bl, bool first)
{
    int64_t Gs = ps->group, s0 = sg->src_r0, s1 = sg->src_r0 + sg->n_rows;
    bl->b0 = first ? s0 / Gs * Gs : bl->b0 + kb;
    if (bl->b0 >= s1)
        return false;
    int64_t end = (s1 + Gs - 1) / Gs * Gs;
    end = end < ps->rows ? end : ps->rows;
    bl->b1 = bl->b0 + kb < end ? bl->b0 + kb : end;
    bl->k0 = bl->b0 > s0 ? bl->b0 : s0;
    bl->k1 = bl->b1 < s1 ? bl->b1 : s1;
    return true;
}

/* Rows of one piece of the self-check's dequantization of our output: whole groups up to 256
 * rows, or a divisor of a larger group (a piece never straddles a group; G % 16 == 0). */
static int64_t check_piece_rows(int64_t G)
{
    int64_t a = G, c = 256;
    if (G <= 256)
        return G;
    while (c) { /* gcd(G, 256) */
        int64_t t = a % c;
        a = c;
        c = t;
    }
    return a;
}

/* SELF-CHECK helper: dequantize our packed chunk (b->qp, b->sp, b->zp: [K][cw] in DESIGN
 * 4.1-4.3, local group G) with the kernels' reference ref_dequant_w4, rows [r0, r1) (multiples
 * of G or of the piece) and chunk columns [ca, cb), one [P][64] piece at a time into b->xw, and
 * compare bit for bit with want[(k - r0) * ldw + (n - ca)] or, when want is NULL, with +0.0.
 * Returns 0 when all equal, 1 at the first difference (*bk, *bn chunk coordinates, *got ours,
 * *want_v expected), -1 if the reference refused the shape (reported by it). */
static int w4_check_ours(const struct w4_bufs *b, int64_t K, int64_t G, int64_t r0, int64_t r1,
                         int64_t ca, int64_t cb, const float *want, int64_t ldw, int64_t *bk,
                         int64_t *bn, float *got, float *want_v)
{
    const int64_t ng = K / G, P = check_piece_rows(G);
    for (int64_t t = ca / 64; t < (cb + 63) / 64; t++) {
        const int64_t na = t * 64 > ca ? t * 64 : ca, nb = t * 64 + 64 < cb ? t * 64 + 64 : cb;
        for (int64_t r = r0; r < r1; r += P) {
            const uint8_t *q = b->qp + (size_t)(t * (K / 16) + r / 16) * FMT_W4_TILE_BYTES;
            const uint8_t *z = b->zp + (size_t)(t * ng + r / G) * 32;
            const uint16_t *s = b->sp + (size_t)(t * ng + r / G) * 64;
            if (ref_dequant_w4(q, z, s, (int)P, 64, (int)P, b->xw))
                return -1;
            for (int64_t k = 0; k < P && r + k < r1; k++) {
                const float *ours = b->xw + k * 64 + (na - t * 64);
                if (want) {
                    const float *wr = want + (r + k - r0) * ldw + (na - ca);
                    if (!memcmp(ours, wr, (size_t)(nb - na) * sizeof(float)))
                        continue;
                    for (int64_t n = 0; n < nb - na; n++)
                        if (memcmp(&ours[n], &wr[n], sizeof(float))) {
                            *bk = r + k, *bn = na + n, *got = ours[n], *want_v = wr[n];
                            return 1;
                        }
                } else {
                    for (int64_t n = 0; n < nb - na; n++) {
                        uint32_t bits;
                        memcpy(&bits, &ours[n], sizeof(bits));
                        if (bits) {
                            *bk = r + k, *bn = na + n, *got = ours[n], *want_v = 0.0f;
                            return 1;
                        }
                    }
                }
            }
        }
    }
    return 0;
}

/* One load chunk [c0, c0 + cw) of output columns of W4 output o on `rank`. */
static enum cvt_err w4_chunk(struct run *R, int rank, const struct cvt_out *o, int64_t c0,
                             int64_t cw, struct w4_bufs *b, uint64_t offs[3])
{
    const struct cvt_plan *p = R->plan;
    int64_t K = o->rows, G = o->group, ng = K / G;
    enum cvt_err e = CVT_ERR_NONE;
    memset(b->q, 0, (size_t)(K * cw));
    memset(b->z, 0, (size_t)(ng * cw));
    memset(b->s, 0, (size_t)(ng * cw) * sizeof(uint16_t));
    /* decode each overlapping source slice into place */
    for (int si = 0; si < o->n_segs; si++) {
        const struct cvt_seg *sg = &o->segs[si];
        int64_t a = sg->dst_c0 > c0 ? sg->dst_c0 : c0;
        int64_t z = sg->dst_c0 + sg->n_cols < c0 + cw ? sg->dst_c0 + sg->n_cols : c0 + cw;
        if (a >= z)
            continue;
        const struct cvt_plan_src *ps = &p->srcs[sg->src];
        int64_t n0 = sg->src_c0 + (a - sg->dst_c0), n1 = n0 + (z - a);
        int64_t w = z - a, dc = a - c0, kb = k_block(R, ps->group, ps->cols);
        struct src_blk bl;
        for (bool ok = src_blk_next(sg, ps, kb, &bl, true); ok;
             ok = src_blk_next(sg, ps, kb, &bl, false)) {
            struct cvt_awq_linear lin;
            if ((e = cvt_awq_load(R->src, R->cfg, ps->name, ps->rows, ps->cols, bl.b0, bl.b1, n0,
                                  n1, &lin)))
                return e;
            int64_t dr = sg->dst_r0 + (bl.k0 - sg->src_r0); /* a multiple of G (plan) */
            for (int64_t k = bl.k0; k < bl.k1; k++)
                memcpy(b->q + (dr + k - bl.k0) * cw + dc, lin.q + (k - bl.b0) * w, (size_t)w);
            /* local group of output row dr + (k - k0) <- source group of row k, both whole:
             * G divides the source group, the slice start and dr (cvt_plan.c local_group) */
            for (int64_t k = bl.k0; k < bl.k1; k += G) {
                int64_t go = (dr + k - bl.k0) / G, gs = (k - bl.b0) / ps->group;
                memcpy(b->z + go * cw + dc, lin.z + gs * w, (size_t)w);
                memcpy(b->s + go * cw + dc, lin.s + gs * w, (size_t)w * sizeof(uint16_t));
            }
            cvt_awq_linear_free(&lin);
        }
    }
    for (int64_t c = 0; c < cw; c += CVT_SUB_COLS)
        if ((e = w4_sub(R, rank, o, cw, c, CVT_SUB_COLS < cw - c ? CVT_SUB_COLS : cw - c, b,
                        offs)))
            return e;
    if (R->o->no_check)
        return CVT_ERR_NONE;
    /* SELF-CHECK: every source slice, dequantized from the source tensors by an independent
     * path, must equal our packed output dequantized by ref_dequant_w4, bit for bit (ours a
     * [P][64] piece at a time, in cache; the source block is the decoder's k-block: 128-row
     * blocks measured 10% less CPU but 451 instead of 188 MiB peak RSS on a 7B, all of it
     * file-backed - likely fault-around mapping neighbouring rows that were already released) */
    int64_t bk, bn;
    float got, want_v;
    for (int si = 0; si < o->n_segs; si++) {
        const struct cvt_seg *sg = &o->segs[si];
        int64_t a = sg->dst_c0 > c0 ? sg->dst_c0 : c0;
        int64_t z = sg->dst_c0 + sg->n_cols < c0 + cw ? sg->dst_c0 + sg->n_cols : c0 + cw;
        if (a >= z)
            continue;
        const struct cvt_plan_src *ps = &p->srcs[sg->src];
        int64_t n0 = sg->src_c0 + (a - sg->dst_c0), n1 = n0 + (z - a);
        int64_t w = z - a, dc = a - c0, kb = k_block(R, ps->group, ps->cols);
        struct src_blk bl;
        for (bool ok = src_blk_next(sg, ps, kb, &bl, true); ok;
             ok = src_blk_next(sg, ps, kb, &bl, false)) {
            int64_t dr = sg->dst_r0 + (bl.k0 - sg->src_r0);
            if ((e = cvt_awq_dequant_source(R->src, R->cfg, ps->name, ps->rows, ps->cols, bl.b0,
                                            bl.b1, n0, n1, b->ws)))
                return e;
            int rc = w4_check_ours(b, K, G, dr, dr + (bl.k1 - bl.k0), dc, dc + w,
                                   b->ws + (bl.k0 - bl.b0) * w, w, &bk, &bn, &got, &want_v);
            if (rc < 0)
                return CVT_ERR_RANGE;
            if (rc)
                return check_fail(R, rank, o, ps->name, bl.k0 + (bk - dr), n0 + (bn - dc), bk,
                                  c0 + bn, want_v, got);
        }
    }
    /* everything not covered by a source is padding and must dequantize to +0.0: walk the
     * chunk's columns in runs with one covering segment (or none), check the rows outside it */
    for (int64_t c = 0; c < cw;) {
        int64_t end = cw, r0 = 0, r1 = 0; /* run [c, end) covered on rows [r0, r1) */
        for (int si = 0; si < o->n_segs; si++) {
            const struct cvt_seg *sg = &o->segs[si];
            int64_t a = sg->dst_c0 - c0, z = a + sg->n_cols;
            if (a <= c && c < z) {
                end = z < end ? z : end;
                r0 = sg->dst_r0;
                r1 = sg->dst_r0 + sg->n_rows;
            } else if (a > c && a < end) {
                end = a;
            }
        }
        /* rows [0, r0) and [r1, K) (all rows when nothing covers the run) */
        bool cov = r1 > r0;
        int64_t ra[2] = {0, cov ? r1 : K}, rb[2] = {cov ? r0 : K, K};
        for (int i = 0; i < 2; i++) {
            int rc = ra[i] < rb[i] ? w4_check_ours(b, K, G, ra[i], rb[i], c, end, NULL, 0, &bk,
                                                   &bn, &got, &want_v)
                                   : 0;
            if (rc < 0)
                return CVT_ERR_RANGE;
            if (rc)
                return check_fail(R, rank, o, NULL, 0, 0, bk, c0 + bn, 0.0f, got);
        }
        c = end;
    }
    return CVT_ERR_NONE;
}

/* Size the generic path's buffers for output o; *C receives its chunk width. */
static enum cvt_err w4_generic_bufs(struct run *R, int rank, const struct cvt_out *o,
                                    struct w4_bufs *b, int64_t *C)
{
    int64_t K = o->rows, N = o->cols, G = o->group, ng = K / G, kb = k_block_max(R, o);
    /* a source group longer than CVT_K_BLOCK_MAX rows (per-channel: G = K_src, which a row
     * slice reads whole) makes the decoder's block and the source-dequant buffer [kb][C]:
     * budget the chunk by those rows instead of K */
    *C = chunk_cols(R, kb > CVT_K_BLOCK_MAX && kb > K ? kb : K, N);
    int64_t S = CVT_SUB_COLS < *C ? CVT_SUB_COLS : *C, c = *C;
    bool ck = !R->o->no_check;
    size_t need[W4_NBUF] = {
        (size_t)(K * c), (size_t)(ng * c), (size_t)(ng * c) * 2,
        0 /* wq: unused */, ck ? (size_t)(kb * c) * 4 : 0,
        (size_t)(K * S), (size_t)(ng * S), (size_t)(K * c / 2), (size_t)(ng * c / 2),
        (size_t)(ng * S) * 2, (size_t)(ng * c) * 2,
        ck ? (size_t)check_piece_rows(G) * 64 * sizeof(float) : 0};
    for (int i = 0; i < W4_NBUF; i++)
        if (!w4_ensure(b, i, need[i])) {
            qs_log_error(__func__, "rank %d: tensor %s: out of memory for a %" PRId64
                                   " x %" PRId64 " chunk",
                         rank, o->name, K, c);
            return CVT_ERR_NOMEM;
        }
    return CVT_ERR_NONE;
}

/* Columns [c0, c0 + cw) of o through the generic path (cvt_awq_load + ref_pack_*), in its own
 * chunk width. */
static enum cvt_err w4_generic(struct run *R, int rank, const struct cvt_out *o, int64_t c0,
                               int64_t cw, struct w4_bufs *b, uint64_t offs[3])
{
    int64_t C;
    enum cvt_err e = w4_generic_bufs(R, rank, o, b, &C);
    for (int64_t c = c0; !e && c < c0 + cw && !run_stopped(R); c += C)
        e = w4_chunk(R, rank, o, c, C < c0 + cw - c ? C : c0 + cw - c, b, offs);
    return e;
}

/* Columns per chunk of the GEMM fast path: only the packed chunk is held (K/2 + 5/2 K/G bytes
 * per column), so chunks are ~10x wider than the generic path's. */
static int64_t fast_chunk_cols(const struct run *R, int64_t K, int64_t ng, int64_t N)
{
    int64_t per_col = K / 2 + ng * 3;
    int64_t c = (int64_t)R->chunk_bytes / per_col / 64 * 64;
    if (c < 64)
        c = 64;
    return c < N ? c : N;
}

static bool test_corrupt_wanted(const struct cvt_out *o)
{
    const char *s = getenv("QSHARD_CVT_TEST_CORRUPT");
    return s && !strcmp(s, o->name);
}

/* One W4 output through the GEMM fast path (cvt_fast.c), chunk by chunk; a chunk it declines
 * (a bad scale value) goes through the generic path, which reports it. */
static enum cvt_err w4_fast(struct run *R, int rank, const struct cvt_out *o, struct w4_bufs *b,
                            uint64_t offs[3])
{
    int64_t K = o->rows, N = o->cols, ng = K / o->group, C = fast_chunk_cols(R, K, ng, N);
    size_t piece = cvt_fast_piece_bytes(o->group);
    bool ck = !R->o->no_check, corrupt = test_corrupt_wanted(o);
    if (!w4_ensure(b, 7, (size_t)(K * C / 2)) || !w4_ensure(b, 8, (size_t)(ng * C / 2)) ||
        !w4_ensure(b, 10, (size_t)(ng * C) * 2) || (ck && !w4_ensure(b, 4, piece)) ||
        (ck && !w4_ensure(b, 11, piece))) {
        qs_log_error(__func__, "rank %d: tensor %s: out of memory for a %" PRId64 " x %" PRId64
                               " chunk", rank, o->name, K, C);
        return CVT_ERR_NOMEM;
    }
    enum cvt_err e = CVT_ERR_NONE;
    for (int64_t c0 = 0; c0 < N && !e && !run_stopped(R); c0 += C) {
        int64_t cw = C < N - c0 ? C : N - c0;
        struct cvt_fast_bufs fb = {b->qp, b->sp, b->zp, b->ws, b->xw};
        struct cvt_fast_mismatch mm;
        enum cvt_fast_rc rc = cvt_fast_w4_chunk(R->src, R->cfg, R->plan, o, c0, cw, ck, corrupt,
                                                &fb, &mm);
        if (rc == CVT_FAST_NO) {
            e = w4_generic(R, rank, o, c0, cw, b, offs);
            continue;
        }
        if (rc == CVT_FAST_REF_FAIL)
            return CVT_ERR_RANGE;
        if (rc == CVT_FAST_MISMATCH)
            return check_fail(R, rank, o, mm.src_name, mm.src_k, mm.src_n, mm.k, mm.n, mm.want,
                              mm.got);
        if ((e = put_w4_cols(R, rank, o, cw, b->qp, b->sp, b->zp, offs)))
            return e;
    }
    return e;
}

static enum cvt_err job_w4(struct run *R, int rank, const struct cvt_out *o, struct w4_bufs *b)
{
    uint64_t offs[3] = {0, 0, 0};
    if (!getenv("QSHARD_CVT_NO_FAST") && cvt_fast_w4_ok(R->src, R->cfg, R->plan, o))
        return w4_fast(R, rank, o, b, offs);
    return w4_generic(R, rank, o, 0, o->cols, b, offs);
}

/* --- float outputs ------------------------------------------------------------------------- */

/* Unquantized linear: output F16 [N_out][K_out] (o->cols x o->rows) from source .weight
 * [N_src][K_src]; output row n takes source row src_c0 + (n - dst_c0), columns [src_r0, +n_rows). */
static enum cvt_err job_linear_f16(struct run *R, int rank, const struct cvt_out *o)
{
    int64_t K = o->rows, N = o->cols;
    int64_t rows_per = (int64_t)CVT_FLOAT_CHUNK / K;
    if (rows_per < 1)
        rows_per = 1;
    uint16_t *buf = malloc((size_t)(rows_per * K) * sizeof(uint16_t));
    uint32_t index = R->idx[rank][o - R->plan->ranks[rank].outs];
    enum cvt_err e = CVT_ERR_NONE;
    uint64_t off = 0;
    if (!buf)
        return CVT_ERR_NOMEM;
    for (int64_t n0 = 0; n0 < N && !e && !run_stopped(R); n0 += rows_per) {
        int64_t nr = rows_per < N - n0 ? rows_per : N - n0;
        memset(buf, 0, (size_t)(nr * K) * sizeof(uint16_t));
        for (int si = 0; si < o->n_segs && !e; si++) {
            const struct cvt_seg *sg = &o->segs[si];
            const struct cvt_src_tensor *t = R->src_t[sg->src];
            int64_t K_src = R->plan->srcs[sg->src].rows;
            for (int64_t n = n0; n < n0 + nr && !e; n++) {
                if (n < sg->dst_c0 || n >= sg->dst_c0 + sg->n_cols)
                    continue;
                int64_t sn = sg->src_c0 + (n - sg->dst_c0);
                e = cvt_source_read_f16(R->src, t, (uint64_t)(sn * K_src + sg->src_r0),
                                        (uint64_t)sg->n_rows, buf + (n - n0) * K + sg->dst_r0);
            }
            cvt_source_release(R->src, t);
        }
        if (!e)
            e = put_part(R, rank, index, off, buf, (size_t)(nr * K) * sizeof(uint16_t));
        off += (uint64_t)(nr * K) * sizeof(uint16_t);
    }
    free(buf);
    return e;
}

/* F16 matrix [rows][cols] (embedding, lm_head) or F32 [rows][cols] (vectors, router) from
 * row-contiguous source pieces. */
static enum cvt_err job_float(struct run *R, int rank, const struct cvt_out *o)
{
    bool f16 = o->kind == CVT_OUT_MAT_F16;
    size_t es = f16 ? 2 : 4;
    int64_t C = o->cols;
    int64_t rows_per = (int64_t)CVT_FLOAT_CHUNK / C;
    if (rows_per < 1)
        rows_per = 1;
    void *buf = malloc((size_t)(rows_per * C) * es);
    uint32_t index = R->idx[rank][o - R->plan->ranks[rank].outs];
    enum cvt_err e = CVT_ERR_NONE;
    uint64_t off = 0;
    if (!buf)
        return CVT_ERR_NOMEM;
    for (int64_t r0 = 0; r0 < o->rows && !e && !run_stopped(R); r0 += rows_per) {
        int64_t nr = rows_per < o->rows - r0 ? rows_per : o->rows - r0;
        memset(buf, 0, (size_t)(nr * C) * es);
        for (int si = 0; si < o->n_segs && !e; si++) {
            const struct cvt_seg *sg = &o->segs[si];
            const struct cvt_src_tensor *t = R->src_t[sg->src];
            int64_t src_cols = R->plan->srcs[sg->src].cols;
            int64_t a = sg->dst_r0 > r0 ? sg->dst_r0 : r0;
            int64_t z = sg->dst_r0 + sg->n_rows < r0 + nr ? sg->dst_r0 + sg->n_rows : r0 + nr;
            for (int64_t r = a; r < z && !e; r++) {
                uint64_t first = (uint64_t)((sg->src_r0 + r - sg->dst_r0) * src_cols + sg->src_c0);
                size_t at = (size_t)((r - r0) * C + sg->dst_c0);
                /* whole rows are contiguous in the source: read them in one call */
                if (sg->src_c0 == 0 && sg->n_cols == src_cols && sg->dst_c0 == 0 &&
                    C == src_cols) {
                    int64_t nrow = z - r;
                    uint64_t cnt = (uint64_t)(nrow * C);
                    e = f16 ? cvt_source_read_f16(R->src, t, first, cnt, (uint16_t *)buf + at)
                            : cvt_source_read_f32(R->src, t, first, cnt, (float *)buf + at);
                    break;
                }
                e = f16 ? cvt_source_read_f16(R->src, t, first, (uint64_t)sg->n_cols,
                                              (uint16_t *)buf + at)
                        : cvt_source_read_f32(R->src, t, first, (uint64_t)sg->n_cols,
                                              (float *)buf + at);
            }
            cvt_source_release(R->src, t);
        }
        if (!e)
            e = put_part(R, rank, index, off, buf, (size_t)(nr * C) * es);
        off += (uint64_t)(nr * C) * es;
    }
    free(buf);
    return e;
}

static void *worker(void *arg)
{
    struct run *R = arg;
    struct w4_bufs b;
    memset(&b, 0, sizeof(b));
    for (;;) {
        if (run_stopped(R))
            break;
        size_t j = atomic_fetch_add(&R->next_job, 1);
        if (j >= R->n_jobs)
            break;
        int rank = R->jobs[j].rank;
        const struct cvt_out *o = &R->plan->ranks[rank].outs[R->jobs[j].out];
        enum cvt_err e;
        switch (o->kind) {
        case CVT_OUT_W4: e = job_w4(R, rank, o, &b); break;
        case CVT_OUT_LINEAR_F16: e = job_linear_f16(R, rank, o); break;
        default: e = job_float(R, rank, o); break;
        }
        if (e)
            run_fail(R, e);
    }
    w4_bufs_free(&b);
    return NULL;
}

static uint64_t job_bytes(const struct cvt_plan *p, const struct job *j)
{
    return p->ranks[j->rank].outs[j->out].bytes;
}

/* Job order: by output bytes, descending; ties keep their order. An insertion sort (stable,
 * unlike qsort) over at most a few thousand jobs. */
static void sort_jobs(struct job *jobs, size_t n, const struct cvt_plan *p)
{
    for (size_t i = 1; i < n; i++) {
        struct job x = jobs[i];
        size_t k = i;
        while (k > 0 && job_bytes(p, &jobs[k - 1]) < job_bytes(p, &x)) {
            jobs[k] = jobs[k - 1];
            k--;
        }
        jobs[k] = x;
    }
}

/* --- validation before writing ------------------------------------------------------------- */

static void shape_str(char *buf, size_t n, const int64_t *shape, int n_dims)
{
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < n_dims && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < n)
        snprintf(buf + at, n - at, "]");
}

/* Every source the plan reads: AWQ linears probed (variant, shapes vs config), float tensors
 * found with the expected shape and a float dtype. */
static enum cvt_err validate_sources(struct run *R)
{
    const struct cvt_plan *p = R->plan;
    unsigned seen = 0;
    R->src_t = calloc((size_t)(p->n_srcs ? p->n_srcs : 1), sizeof(*R->src_t));
    if (!R->src_t)
        return CVT_ERR_NOMEM;
    for (int i = 0; i < p->n_srcs; i++) {
        const struct cvt_plan_src *s = &p->srcs[i];
        if (s->kind == CVT_SRC_AWQ) {
            struct cvt_awq_info info;
            CVT_TRY(cvt_awq_probe(R->src, R->cfg, s->name, s->rows, s->cols, &info));
            seen |= CVT_VARIANT_BIT(info.variant);
            continue;
        }
        const struct cvt_src_tensor *t = cvt_source_find(R->src, s->name);
        if (!t) { /* the plan checked presence; a NULL here is a catalog/plan disagreement */
            qs_log_error(__func__, "tensor %s: missing from the catalog", s->name);
            return CVT_ERR_MISSING_TENSOR;
        }
        int64_t want[2];
        int nd;
        if (s->rows == 1 && !s->file_transposed) {
            want[0] = s->cols;
            nd = 1;
        } else {
            want[0] = s->file_transposed ? s->cols : s->rows;
            want[1] = s->file_transposed ? s->rows : s->cols;
            nd = 2;
        }
        bool ok = t->n_dims == nd && t->shape[0] == want[0] && (nd == 1 || t->shape[1] == want[1]);
        if (!ok) {
            char a[96], b[96];
            shape_str(a, sizeof(a), want, nd);
            shape_str(b, sizeof(b), t->shape, t->n_dims);
            qs_log_error(__func__, "file %s: tensor %s: expected shape %s from config.json, got %s",
                         cvt_source_file(R->src, t->file)->name, s->name, a, b);
            return CVT_ERR_SHAPE;
        }
        if (t->dtype != CVT_DT_F16 && t->dtype != CVT_DT_BF16 && t->dtype != CVT_DT_F32 &&
            t->dtype != CVT_DT_F64) {
            qs_log_error(__func__, "file %s: tensor %s: expected a float dtype (F16, BF16, F32), "
                                   "got %s",
                         cvt_source_file(R->src, t->file)->name, s->name, cvt_dtype_str(t->dtype));
            return CVT_ERR_DTYPE;
        }
        R->src_t[i] = t;
    }
    size_t at = 0;
    R->variant[0] = '\0';
    for (int v = CVT_VARIANT_GEMM; v <= CVT_VARIANT_LLMAWQ_V3; v++)
        if (seen & CVT_VARIANT_BIT(v))
            at += (size_t)snprintf(R->variant + at, sizeof(R->variant) - at, "%s%s",
                                   at ? "+" : "", cvt_variant_str((enum cvt_variant)v));
    if (!seen)
        snprintf(R->variant, sizeof(R->variant), "none");
    return CVT_ERR_NONE;
}

/* --- config JSON (DESIGN 6) and model id --------------------------------------------------- */

static char *config_json(const struct run *R, int rank)
{
    const struct cvt_hf_config *c = R->cfg;
    const struct cvt_plan *p = R->plan;
    cJSON *j = cJSON_CreateObject(), *q, *t, *a;
    char *out = NULL;
    if (!j)
        return NULL;
    cJSON_AddNumberToObject(j, "qshard_config_version", 1);
    cJSON_AddStringToObject(j, "architecture", c->arch->name);
    cJSON_AddNumberToObject(j, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)c->intermediate_size);
    cJSON_AddNumberToObject(j, "intermediate_size_padded", p->inter_padded);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->num_key_value_heads);
    cJSON_AddNumberToObject(j, "head_dim", (double)c->head_dim);
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(j, "vocab_size_per_rank", p->vocab_per_rank);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    if (c->rope_scaling.type == QS_ROPE_DEFAULT) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", qs_rope_type_name(c->rope_scaling.type));
        cJSON_AddNumberToObject(rs, "factor", c->rope_scaling.factor);
        if (c->rope_scaling.type == QS_ROPE_LLAMA3) {
            cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_scaling.low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_scaling.high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                    (double)c->rope_scaling.original_max_position_embeddings);
        }
    }
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)c->max_position_embeddings);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
    if (c->sliding_window > 0)
        cJSON_AddNumberToObject(j, "sliding_window", (double)c->sliding_window);
    else
        cJSON_AddNullToObject(j, "sliding_window");
    /* from the files, not the config: the plan knows whether q/k/v carry biases */
    cJSON_AddBoolToObject(j, "attention_bias", (p->bias_roles & CVT_ROLE_BIT(FMT_N_QKV)) != 0);
    cJSON_AddNumberToObject(j, "num_local_experts", (double)c->num_local_experts);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", (double)c->num_experts_per_tok);
    q = cJSON_AddObjectToObject(j, "quant");
    cJSON_AddNumberToObject(q, "w_bit", c->quant.w_bit);
    cJSON_AddNumberToObject(q, "group_size", p->d.group_size);
    cJSON_AddBoolToObject(q, "zero_point", c->quant.zero_point);
    cJSON_AddStringToObject(q, "source_variant", R->variant);
    cJSON_AddStringToObject(q, "source_container", cvt_container_str(cvt_source_container(R->src)));
    a = cJSON_AddArrayToObject(q, "modules_to_not_convert");
    for (int i = 0; i < c->quant.n_modules_to_not_convert; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(c->quant.modules_to_not_convert[i]));
    if (c->has_bos)
        cJSON_AddNumberToObject(j, "bos_token_id", (double)c->bos_token_id);
    else
        cJSON_AddNullToObject(j, "bos_token_id");
    a = cJSON_AddArrayToObject(j, "eos_token_id");
    for (int i = 0; i < c->n_eos; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)c->eos_token_id[i]));
    t = cJSON_AddObjectToObject(j, "tp");
    cJSON_AddNumberToObject(t, "world_size", p->tp);
    cJSON_AddNumberToObject(t, "rank", rank);
    cJSON_AddNumberToObject(t, "heads_per_rank", p->heads_per_rank);
    cJSON_AddNumberToObject(t, "kv_heads_per_rank", p->kv_heads_per_rank);
    cJSON_AddNumberToObject(t, "kv_head_replicas", p->kv_head_replicas);
    cJSON_AddNumberToObject(t, "intermediate_per_rank", p->inter_per_rank);
    out = cJSON_Print(j);
    cJSON_Delete(j);
    return out;
}

/* XXH3-128 of config.json bytes + the tensor catalog (names, dtypes, shapes) + tp: identical for
 * every rank of one conversion, different for another model or split. */
static void model_id(const struct run *R, uint8_t id[16])
{
    XXH3_state_t *st = XXH3_createState();
    uint32_t tp = (uint32_t)R->plan->tp;
    XXH128_canonical_t can;
    if (!st) { /* fall back to a one-shot hash of the config */
        XXH128_canonicalFromHash(&can, XXH3_128bits(R->cfg->config_json, R->cfg->config_json_size));
        memcpy(id, &can, 16);
        return;
    }
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, R->cfg->config_json, R->cfg->config_json_size);
    for (size_t i = 0; i < cvt_source_n_tensors(R->src); i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(R->src, i);
        int32_t dt = (int32_t)t->dtype;
        XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(st, &dt, sizeof(dt));
        XXH3_128bits_update(st, t->shape, sizeof(t->shape[0]) * (size_t)t->n_dims);
    }
    XXH3_128bits_update(st, &tp, sizeof(tp));
    XXH128_canonicalFromHash(&can, XXH3_128bits_digest(st));
    memcpy(id, &can, 16);
    XXH3_freeState(st);
}

/* --- writers ------------------------------------------------------------------------------- */

/* Declare output o of a rank: 3 tensors for W4, 1 otherwise. */
static enum cvt_err declare_out(struct run *R, int rank, const struct cvt_out *o, uint32_t *first)
{
    struct fmt_writer *w = R->w[rank];
    enum fmt_split sp = R->plan->tp == 1 ? FMT_SPLIT_NONE : o->split;
    uint64_t K = (uint64_t)o->rows, N = (uint64_t)o->cols, G = (uint64_t)o->group;
    char nm[200];
    enum fmt_err fe = FMT_ERR_NONE;
    uint32_t idx;
    if (o->kind == CVT_OUT_W4) {
        /* [K, N] and [K/G_r, N] (G_r: this output's local group size, DESIGN 4): column split
         * on axis 1, row split on axis 0 */
        uint32_t ax = o->split == FMT_SPLIT_COLUMN ? 1 : 0;
        uint64_t sq[2] = {K, N}, sg[2] = {K / G, N};
        snprintf(nm, sizeof(nm), "%s.qweight", o->name);
        fe = fmt_writer_add_tensor(w, nm, FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, sq, sp,
                                   sp ? ax : 0, first);
        snprintf(nm, sizeof(nm), "%s.scales", o->name);
        if (!fe)
            fe = fmt_writer_add_tensor(w, nm, FMT_DTYPE_F16, FMT_LAYOUT_S_T64, 2, sg, sp,
                                       sp ? ax : 0, &idx);
        snprintf(nm, sizeof(nm), "%s.qzeros", o->name);
        if (!fe)
            fe = fmt_writer_add_tensor(w, nm, FMT_DTYPE_Q4, FMT_LAYOUT_Z4_T64, 2, sg, sp,
                                       sp ? ax : 0, &idx);
    } else if (o->kind == CVT_OUT_LINEAR_F16) {
        uint64_t sh[2] = {N, K}; /* nn.Linear order */
        uint32_t ax = o->split == FMT_SPLIT_COLUMN ? 0 : 1;
        fe = fmt_writer_add_tensor(w, o->name, FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, sh, sp,
                                   sp ? ax : 0, first);
    } else {
        bool vec = o->rows == 1;
        uint64_t sh[2] = {vec ? N : K, N};
        /* a vector's column split (bias) is along its only axis */
        fe = fmt_writer_add_tensor(w, o->name,
                                   o->kind == CVT_OUT_MAT_F16 ? FMT_DTYPE_F16 : FMT_DTYPE_F32,
                                   FMT_LAYOUT_ROW_MAJOR, vec ? 1 : 2, sh, sp, 0, first);
    }
    if (fe)
        return fe == FMT_ERR_NOMEM ? CVT_ERR_NOMEM : CVT_ERR_ARG; /* reported by the writer */
    return CVT_ERR_NONE;
}

static enum cvt_err open_writer(struct run *R, int rank, const uint8_t id[16])
{
    const struct cvt_plan *p = R->plan;
    char path[4096 + 64], file[64];
    struct fmt_writer_opts wo;
    memset(&wo, 0, sizeof(wo));
    wo.tp_rank = (uint32_t)rank;
    wo.world_size = (uint32_t)p->tp;
    memcpy(wo.model_id, id, 16);
    fmt_rank_file_name(file, sizeof(file), (uint32_t)rank, (uint32_t)p->tp);
    snprintf(path, sizeof(path), "%s/%s", R->stage, file);
    if (fmt_writer_open(path, &wo, &R->w[rank]))
        return CVT_ERR_IO;
    char *js = config_json(R, rank);
    if (!js)
        return CVT_ERR_NOMEM;
    enum fmt_err fe = fmt_writer_set_section(R->w[rank], FMT_SECTION_CONFIG, js, strlen(js));
    free(js);
    if (!fe) {
        const char *g = R->cfg->generation_config_json;
        fe = fmt_writer_set_section(R->w[rank], FMT_SECTION_GENERATION_CONFIG, g ? g : "{}",
                                    g ? R->cfg->generation_config_json_size : 2);
    }
    size_t nt = cvt_source_n_tokenizer_files(R->src);
    if (!fe && nt) {
        const char *names[16];
        const void *datas[16];
        size_t sizes[16];
        uint32_t n = 0;
        for (size_t i = 0; i < nt && n < 16; i++, n++) {
            const struct cvt_src_blob *bl = cvt_source_tokenizer_file(R->src, i);
            names[n] = bl->name;
            datas[n] = bl->data;
            sizes[n] = bl->size;
        }
        fe = fmt_writer_set_tokenizer_files(R->w[rank], names, datas, sizes, n);
    }
    if (fe)
        return fe == FMT_ERR_NOMEM ? CVT_ERR_NOMEM : CVT_ERR_IO;
    const struct cvt_rank_plan *rp = &p->ranks[rank];
    for (int i = 0; i < rp->n_outs; i++)
        CVT_TRY(declare_out(R, rank, &rp->outs[i], &R->idx[rank][i]));
    if (fmt_writer_begin_data(R->w[rank]))
        return CVT_ERR_IO;
    return CVT_ERR_NONE;
}

/* --- output directory ---------------------------------------------------------------------- */
/*
 * Replacing a conversion (--force) must never wreck the old one: everything is written into a
 * fresh staging directory OUT_DIR/.qshard-convert.XXXXXX (same file system, so renames are
 * atomic), rank files and manifest included. Only when all of it is finished (fsync'd, verified
 * by fmt_manifest_write) does commit_outputs() move it into place: the old manifest and old rank
 * files of the same names are first moved into the staging directory (backups), the new rank
 * files in, the new manifest last; a failed rename undoes the ones done. Then stale rank files of
 * another world size are removed and the staging directory (backups) with them. A failure or
 * signal before that point removes the staging directory and leaves OUT_DIR as it was.
 */

#define CVT_STAGE_PREFIX ".qshard-convert."

static bool path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Directories this run created, deepest last, removed (if empty) after a failure. */
struct made_dirs {
    int n;
    char path[16][4096];
};

/* mkdir -p out_dir, remembering what did not exist before. */
static enum cvt_err make_dirs(const char *dir, struct made_dirs *made)
{
    char buf[4096];
    size_t len = strlen(dir);
    /* room for the staging directory and a file name inside it */
    if (len == 0 || len + 128 >= sizeof(buf)) {
        qs_log_error(__func__, "output directory '%s': expected a path of 1..%zu bytes", dir,
                     sizeof(buf) - 129);
        return CVT_ERR_IO;
    }
    memcpy(buf, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) == 0) {
            if (made->n < 16)
                snprintf(made->path[made->n++], sizeof(made->path[0]), "%s", buf);
        } else if (errno != EEXIST) {
            qs_log_error(__func__, "output directory %s: cannot create %s: %s", dir, buf,
                         strerror(errno));
            buf[i] = c;
            return CVT_ERR_IO;
        }
        buf[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        qs_log_error(__func__, "output path %s: exists and is not a directory", dir);
        return CVT_ERR_IO;
    }
    return CVT_ERR_NONE;
}

/* Parse a decimal number of 1..9 digits without sign or leading zero at *s; advances *s. */
static bool parse_u32(const char **s, uint32_t *v)
{
    const char *p = *s;
    uint32_t x = 0;
    int n = 0;
    while (*p >= '0' && *p <= '9' && n < 10) {
        x = x * 10 + (uint32_t)(*p++ - '0');
        n++;
    }
    if (n == 0 || n > 9 || (n > 1 && **s == '0'))
        return false;
    *s = p;
    *v = x;
    return true;
}

/* Is `name` a rank file name as fmt_rank_file_name writes it ("rank-K-of-N.qshard", K < N)?
 * *world receives N. */
static bool rank_file_world(const char *name, uint32_t *world)
{
    uint32_t k, n;
    const char *p = name;
    if (strncmp(p, "rank-", 5))
        return false;
    p += 5;
    if (!parse_u32(&p, &k) || strncmp(p, "-of-", 4))
        return false;
    p += 4;
    if (!parse_u32(&p, &n) || strcmp(p, ".qshard") || k >= n)
        return false;
    *world = n;
    return true;
}

/* Name (into found[256]) of the first entry of dir that belongs to a conversion: manifest.json
 * or a rank file of any world size. False if there is none. */
static bool find_old_output(const char *dir, char found[256])
{
    DIR *d = opendir(dir);
    struct dirent *de;
    uint32_t n;
    bool hit = false;
    if (!d)
        return false; /* make_dirs saw a directory; creating the staging directory will fail */
    while (!hit && (de = readdir(d)))
        if (!strcmp(de->d_name, FMT_MANIFEST_NAME) || rank_file_world(de->d_name, &n)) {
            snprintf(found, 256, "%s", de->d_name);
            hit = true;
        }
    closedir(d);
    return hit;
}

/* Remove the staging directory and everything in it (only this run writes there); stage[0] = 0
 * after. Nothing to do when stage is empty. */
static void remove_stage(char *stage)
{
    char path[4096 + 256];
    DIR *d;
    struct dirent *de;
    if (!stage[0])
        return;
    if ((d = opendir(stage))) {
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(path, sizeof(path), "%s/%s", stage, de->d_name);
                unlink(path);
            }
        closedir(d);
    }
    if (rmdir(stage))
        qs_log_warn("cannot remove the staging directory %s: %s", stage, strerror(errno));
    stage[0] = '\0';
}

/* Create out_dir if needed (made lists what we created); refuse an earlier conversion there
 * (manifest.json or any rank-K-of-N.qshard) without --force; create the staging directory
 * (stage[4096], empty string until it exists). Nothing existing is touched. */
static enum cvt_err prepare_out_dir(const struct cvt_opts *o, struct made_dirs *made, char *stage)
{
    char found[256];
    stage[0] = '\0';
    CVT_TRY(make_dirs(o->out_dir, made));
    if (!o->force && find_old_output(o->out_dir, found)) {
        qs_log_error(__func__, "output directory %s: already holds %s from an earlier "
                               "conversion; left as it is",
                     o->out_dir, found);
        return CVT_ERR_EXISTS;
    }
    snprintf(stage, 4096, "%s/" CVT_STAGE_PREFIX "XXXXXX", o->out_dir);
    if (!mkdtemp(stage)) {
        qs_log_error(__func__, "output directory %s: cannot create a staging directory: %s",
                     o->out_dir, strerror(errno));
        stage[0] = '\0';
        return CVT_ERR_IO;
    }
    return CVT_ERR_NONE;
}

/* One rename of the commit: a backup moves OUT_DIR/name to STAGE/old.name, an install moves
 * STAGE/name to OUT_DIR/name. */
struct commit_mv {
    char name[64];
    bool backup;
};

static int commit_rename(const char *out_dir, const char *stage, const struct commit_mv *m,
                         int step, bool undo)
{
    char a[4096 + 256], b[4096 + 256];
    /* test knob (tests/test_cvt.c): the commit rename number N fails as if with EIO */
    const char *knob = getenv("QSHARD_CVT_TEST_COMMIT_FAIL");
    bool fail = !undo && knob && atoi(knob) == step;
    if (m->backup) {
        snprintf(a, sizeof(a), "%s/%s", out_dir, m->name);
        snprintf(b, sizeof(b), "%s/old.%s", stage, m->name);
    } else {
        snprintf(a, sizeof(a), "%s/%s", stage, m->name);
        snprintf(b, sizeof(b), "%s/%s", out_dir, m->name);
    }
    if (fail || (undo ? rename(b, a) : rename(a, b))) {
        int en = fail ? EIO : errno;
        qs_log_error("commit_outputs", "cannot move %s to %s: %s", undo ? b : a, undo ? a : b,
                     strerror(en));
        return -1;
    }
    return 0;
}

/* Move the finished conversion (STAGE/rank-K-of-N.qshard for K < tp, STAGE/manifest.json) into
 * out_dir, replacing an earlier one, then remove stale rank files of other world sizes and the
 * staging directory. On a failed rename every rename done is undone (the earlier conversion is
 * back in place) and CVT_ERR_IO returned; if undoing fails too, the staging directory is kept
 * (stage[0] = 0) and the error names where the files are. */
static enum cvt_err commit_outputs(const char *out_dir, char *stage, int tp)
{
    struct commit_mv *mv = calloc(2 * (size_t)tp + 2, sizeof(*mv));
    char path[4096 + 256];
    int n = 0, done = 0;
    if (!mv)
        return CVT_ERR_NOMEM;
    snprintf(path, sizeof(path), "%s/%s", out_dir, FMT_MANIFEST_NAME);
    if (path_exists(path)) { /* first: a half-replaced directory never has a manifest */
        snprintf(mv[n].name, sizeof(mv[n].name), "%s", FMT_MANIFEST_NAME);
        mv[n++].backup = true;
    }
    for (int r = 0; r < tp; r++) {
        char file[64];
        fmt_rank_file_name(file, sizeof(file), (uint32_t)r, (uint32_t)tp);
        snprintf(path, sizeof(path), "%s/%s", out_dir, file);
        if (path_exists(path)) {
            snprintf(mv[n].name, sizeof(mv[n].name), "%s", file);
            mv[n++].backup = true;
        }
        snprintf(mv[n++].name, sizeof(mv[0].name), "%s", file);
    }
    snprintf(mv[n++].name, sizeof(mv[0].name), "%s", FMT_MANIFEST_NAME); /* last: commit point */
    while (done < n && commit_rename(out_dir, stage, &mv[done], done, false) == 0)
        done++;
    if (done < n) {
        bool restored = true;
        for (int i = done - 1; i >= 0; i--)
            restored &= commit_rename(out_dir, stage, &mv[i], i, true) == 0;
        if (!restored) {
            qs_log_error(__func__, "output directory %s: could not restore the earlier "
                                   "conversion; its files are in %s (old.*), the new ones there "
                                   "or in %s",
                         out_dir, stage, out_dir);
            stage[0] = '\0'; /* keep it */
        }
        free(mv);
        return CVT_ERR_IO;
    }
    free(mv);
    int fd = open(out_dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd))
        qs_log_warn("output directory %s: fsync: %s", out_dir, strerror(errno));
    if (fd >= 0)
        close(fd);
    /* stale rank files of an earlier conversion with another world size */
    DIR *d = opendir(out_dir);
    struct dirent *de;
    uint32_t world;
    while (d && (de = readdir(d)))
        if (rank_file_world(de->d_name, &world) && world != (uint32_t)tp) {
            snprintf(path, sizeof(path), "%s/%s", out_dir, de->d_name);
            if (unlink(path))
                qs_log_warn("cannot remove the stale rank file %s: %s", path, strerror(errno));
        }
    if (d)
        closedir(d);
    remove_stage(stage); /* the backups */
    return CVT_ERR_NONE;
}

/* Remove what a failed run left: the staging directory (aborted writers already removed their
 * temp files from it), then the directories we created. out_dir's earlier content is untouched. */
static void cleanup_outputs(char *stage, const struct made_dirs *made)
{
    remove_stage(stage);
    for (int i = made->n - 1; i >= 0; i--)
        rmdir(made->path[i]);
}

/* --- entry point --------------------------------------------------------------------------- */

static enum cvt_err names_of(const struct cvt_source *src, const char ***out, int *n)
{
    size_t nt = cvt_source_n_tensors(src);
    const char **v = malloc((nt ? nt : 1) * sizeof(*v));
    if (!v)
        return CVT_ERR_NOMEM;
    for (size_t i = 0; i < nt; i++)
        v[i] = cvt_source_tensor(src, i)->name;
    *out = v;
    *n = (int)nt;
    return CVT_ERR_NONE;
}

/* Does dir hold any weight file (*.safetensors, *.bin, *.pt)? */
static bool has_weight_files(const char *dir)
{
    static const char *const sfx[] = {".safetensors", ".bin", ".pt"};
    DIR *d = opendir(dir);
    struct dirent *de;
    bool found = false;
    if (!d)
        return true; /* let cvt_source_open report the problem */
    while (!found && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]) && !found; i++) {
            size_t m = strlen(sfx[i]);
            found = n > m && !strcmp(de->d_name + n - m, sfx[i]);
        }
    }
    closedir(d);
    return found;
}

/* --dry-run of a directory with config files but no weights (a config checked before a large
 * download, or tests/data/real-configs/): plan from the config alone (every decoder linear
 * quantized unless modules_to_not_convert names it) and print it. */
static enum cvt_err dry_run_config_only(const struct cvt_opts *o)
{
    static const char *const files[4] = {"config.json", "quant_config.json",
                                          "quantize_config.json", "generation_config.json"};
    char *text[4] = {NULL, NULL, NULL, NULL};
    size_t len[4] = {0, 0, 0, 0};
    struct cvt_hf_config cfg;
    struct cvt_dims d;
    struct cvt_plan *plan = NULL;
    enum cvt_err e = CVT_ERR_NONE;
    memset(&cfg, 0, sizeof(cfg));
    for (int i = 0; i < 4; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", o->model_dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        if (fseek(f, 0, SEEK_END) == 0) {
            long n = ftell(f);
            if (n >= 0 && n < (16 << 20) && fseek(f, 0, SEEK_SET) == 0 &&
                (text[i] = malloc((size_t)n + 1)) && fread(text[i], 1, (size_t)n, f) == (size_t)n)
                len[i] = (size_t)n;
        }
        fclose(f);
    }
    if (!text[0]) {
        qs_log_error(__func__, "%s: no config.json (and no weight files)", o->model_dir);
        e = CVT_ERR_IO;
        goto out;
    }
    if ((e = cvt_config_parse(o->model_dir, text[0], len[0], text[1], len[1], text[2], len[2],
                              text[3], len[3], &cfg)) ||
        (e = cvt_dims_from_hf(&cfg, &d)) || (e = cvt_plan_build(&d, NULL, o->tp, &plan)))
        goto out;
    qs_log_info("%s: no weight files: planning from the config alone (%s, quant config from %s)",
                o->model_dir, cfg.arch->name, cvt_qcfg_file_str(cfg.quant.from));
    cvt_plan_print(plan, stdout);
out:
    cvt_plan_free(plan);
    cvt_config_free(&cfg);
    for (int i = 0; i < 4; i++)
        free(text[i]);
    return e;
}

static void run_free(struct run *R)
{
    if (R->w)
        for (int r = 0; r < (R->plan ? R->plan->tp : 0); r++)
            fmt_writer_abort(R->w[r]);
    free(R->w);
    if (R->idx)
        for (int r = 0; r < (R->plan ? R->plan->tp : 0); r++)
            free(R->idx[r]);
    free(R->idx);
    free(R->src_t);
    free(R->jobs);
    cvt_plan_free(R->plan);
    cvt_source_close(R->src);
}

enum cvt_err cvt_run(const struct cvt_opts *o)
{
    struct run R;
    enum cvt_err e;
    struct made_dirs made;
    struct sigaction old_sa[3];
    const char **names = NULL;
    int n_names = 0;
    memset(&R, 0, sizeof(R));
    made.n = 0;
    R.o = o;
    pthread_mutex_init(&R.lock, NULL);
    pthread_mutex_init(&R.bar_lock, NULL);
    /* first, so a signal at any point is reported and answered with CVT_ERR_INTERRUPTED */
    signals_catch(old_sa);

    if (o->out_dir && same_dir(o->model_dir, o->out_dir)) {
        qs_log_error(__func__, "output directory %s: is the model directory %s; the rank files "
                               "go to a directory of their own",
                     o->out_dir, o->model_dir);
        e = CVT_ERR_SAME_DIR;
        goto out;
    }
    if (o->dry_run && !has_weight_files(o->model_dir)) {
        if (!(e = dry_run_config_only(o)))
            interrupted_early(&e);
        goto out;
    }
    if ((e = cvt_source_open(o->model_dir, &R.src)))
        goto out;
    test_signal_point("opened");
    if (interrupted_early(&e))
        goto out;
    R.cfg = cvt_source_config(R.src);
    struct cvt_dims d;
    if ((e = cvt_dims_from_hf(R.cfg, &d)) || (e = names_of(R.src, &names, &n_names)))
        goto out;
    struct cvt_name_list nl = {n_names, names};
    if ((e = cvt_plan_build(&d, &nl, o->tp, &R.plan)))
        goto out;
    if ((e = validate_sources(&R)))
        goto out;
    if (interrupted_early(&e))
        goto out;
    qs_log_info("%s: AWQ variant %s, container %s, quant config from %s; %s, %" PRId64
                " layers, tp %d",
                o->model_dir, R.variant, cvt_container_str(cvt_source_container(R.src)),
                cvt_qcfg_file_str(R.cfg->quant.from), R.cfg->arch->name,
                R.cfg->num_hidden_layers, o->tp);
    if (o->dry_run) {
        cvt_plan_print(R.plan, stdout);
        interrupted_early(&e);
        goto out;
    }

    int tp = R.plan->tp;
    if ((e = prepare_out_dir(o, &made, R.stage)))
        goto out_fail; /* removes only directories this call made */
    R.w = calloc((size_t)tp, sizeof(*R.w));
    R.idx = calloc((size_t)tp, sizeof(*R.idx));
    e = CVT_ERR_NOMEM;
    if (!R.w || !R.idx)
        goto out_fail;
    for (int r = 0; r < tp; r++)
        if (!(R.idx[r] = calloc((size_t)R.plan->ranks[r].n_outs + 1, sizeof(uint32_t))))
            goto out_fail;
    uint8_t id[16];
    model_id(&R, id);
    for (int r = 0; r < tp; r++)
        if ((e = open_writer(&R, r, id)))
            goto out_fail;
    test_signal_point("writing");

    /* jobs: output j of every rank, in plan order (ranks of one source close in time) */
    for (int r = 0; r < tp; r++)
        R.n_jobs += (size_t)R.plan->ranks[r].n_outs;
    R.jobs = malloc(R.n_jobs * sizeof(*R.jobs));
    e = CVT_ERR_NOMEM;
    if (!R.jobs)
        goto out_fail;
    size_t nj = 0;
    for (int j = 0;; j++) {
        bool any = false;
        for (int r = 0; r < tp; r++)
            if (j < R.plan->ranks[r].n_outs) {
                R.jobs[nj].rank = r;
                R.jobs[nj++].out = j;
                any = true;
            }
        if (!any)
            break;
    }
    /* largest outputs first (LPT: a tensor is written in order by one worker, so a large one
     * started last - lm_head is the last output of the plan - would leave the other workers
     * idle at the end); the sort is stable, so the ranks of one output stay together */
    sort_jobs(R.jobs, R.n_jobs, R.plan);
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1)
        threads = 1;
    if ((size_t)threads > R.n_jobs)
        threads = (int)(R.n_jobs ? R.n_jobs : 1);
    R.chunk_bytes = (o->chunk_bytes ? o->chunk_bytes : CVT_CHUNK_BUDGET) / (uint64_t)threads;
    /* Chunk buffers (ours and the decoder's) are MiB-sized and short-lived. glibc raises its mmap
     * threshold after the first such free and then serves them from per-thread arenas that keep
     * their peak; a fixed threshold sends them back to the kernel on free, so peak RSS stays at
     * what is live (measured: 420 -> see docs/BENCHMARKS.md, 16 threads on a 7B checkpoint). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    for (int r = 0; r < tp; r++)
        R.total_bytes += R.plan->ranks[r].data_bytes;
    R.bar = !o->quiet && isatty(STDERR_FILENO);
    R.t0 = now_s();
    pthread_t *th = calloc((size_t)threads, sizeof(*th));
    int started = 0;
    if (!th)
        goto out_fail;
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, worker, &R)) {
            qs_log_error(__func__, "cannot start worker thread %d of %d", started + 1, threads);
            run_fail(&R, CVT_ERR_NOMEM);
            break;
        }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    if (R.bar)
        progress_draw(&R, true);
    if ((e = atomic_load(&R.failed) ? R.err : CVT_ERR_NONE))
        goto out_fail;
    if (g_signal) {
        e = CVT_ERR_INTERRUPTED;
        goto out_fail;
    }

    for (int r = 0; r < tp; r++) {
        enum fmt_err fe = fmt_writer_finish(R.w[r]);
        R.w[r] = NULL;
        if (fe) {
            e = CVT_ERR_IO;
            goto out_fail;
        }
    }
    if (fmt_manifest_write(R.stage, (uint32_t)tp)) {
        e = CVT_ERR_IO;
        goto out_fail;
    }
    test_signal_point("written");
    if (g_signal) { /* the last point where the user can still get the earlier state back */
        e = CVT_ERR_INTERRUPTED;
        goto out_fail;
    }
    if ((e = commit_outputs(o->out_dir, R.stage, tp)))
        goto out_fail;
    if (g_signal)
        qs_log_warn("signal %d arrived after the new conversion was in place in %s: kept it",
                    (int)g_signal, o->out_dir);
    double el = now_s() - R.t0;
    qs_log_info("wrote %d rank file(s) and %s to %s: %.1f MiB of tensors in %.2f s (%.0f MiB/s "
                "of input)",
                tp, FMT_MANIFEST_NAME, o->out_dir, (double)R.total_bytes / (1 << 20), el,
                el > 0 ? (double)cvt_source_total_bytes(R.src) / (1 << 20) / el : 0.0);
    goto out;

out_fail:
    if (e == CVT_ERR_INTERRUPTED)
        qs_log_error(__func__, "interrupted by signal %d: removing the partial output; %s is as "
                               "it was before",
                     (int)g_signal, o->out_dir);
    if (R.w)
        for (int r = 0; r < tp; r++) {
            fmt_writer_abort(R.w[r]);
            R.w[r] = NULL;
        }
    cleanup_outputs(R.stage, &made);
out:
    signals_restore(old_sa);
    run_free(&R);
    free(names);
    pthread_mutex_destroy(&R.lock);
    pthread_mutex_destroy(&R.bar_lock);
    return e;
}

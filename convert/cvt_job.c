/*
 * cvt_job.c - the conversion's workers: each job produces one output tensor of one rank and
 * streams it into that rank's writer (cvt_run_int.h; driver: cvt_run.c).
 *
 * Quantized outputs are produced in column chunks of whole 64-wide n-tiles: in the packed
 * layouts (DESIGN 4.1-4.3) the bytes of n-tiles [a, b) of qweight, scales and qzeros are each one
 * contiguous range, in order, so a chunk is packed on its own and streamed with
 * fmt_writer_put_tensor_part(). Each chunk: decode the source slices in blocks of whole source
 * groups (cvt_awq_load; a row slice that starts inside a group reads the whole group and keeps
 * its rows), place them with the output's local group size G_r (each local group's scale/zero row
 * is its source group's, DESIGN 4; zero padding elsewhere), pack (ref_pack_*), then the
 * SELF-CHECK: ref_dequant_w4 of our packed chunk must equal cvt_awq_dequant_source of the same
 * source slice bit for bit, and padding must dequantize to +0.0. Outputs whose sources are all
 * AutoAWQ GEMM with F16 scales (nearly every checkpoint) take the fast path of cvt_fast.c instead:
 * tiles straight from the mapped source words, the self-check fused per piece, chunks ~10x wider,
 * same bytes (test_cvt compares the two paths; --debug-no-fast-path forces the generic one).
 * Float tensors are converted in row chunks. Memory per worker is bounded by the chunk budget,
 * so peak RSS does not grow with model size.
 *
 * Entry point: cvt_job_worker(). Test: ./build/test_cvt (fixtures, both paths, the self-check
 * hook), ./build/test_cvt_outputs.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_run_int.h"
#include "qs_log.h" /* qs_log_error */
#include "ref.h"    /* ref_pack_w4, ref_pack_scales, ref_pack_zeros, ref_dequant_w4 */

/* Bytes of working memory per element of a quantized load chunk, as budgeted: codes 1, packed
 * chunk 0.5, the source-dequant block and the decoder's k-blocked slices (4.5 of slack: this once
 * also held an fp32 dequantized copy of the whole chunk, which the self-check no longer keeps). */
#define CVT_BYTES_PER_CODE 6
/* Float tensors are converted in pieces of at most this many elements. */
#define CVT_FLOAT_CHUNK (1u << 20)

/* Columns per chunk of a quantized output with K rows: whole n-tiles within the budget. */
static int64_t chunk_cols(const struct cvt_run_state *R, int64_t K, int64_t N)
{
    int64_t c = (int64_t)(R->chunk_bytes / CVT_BYTES_PER_CODE) / K / 64 * 64;
    if (c < 64)
        c = 64;
    return c < N ? c : N;
}

/* --- quantized outputs --------------------------------------------------------------------- */

/* First differing element of the self-check, reported with every coordinate. */
static enum cvt_err check_fail(const struct cvt_run_state *R, int rank, const struct cvt_out *o,
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

/* Test hook (struct cvt_hooks corrupt_output, tests/test_cvt.c): is o the output whose first
 * packed code gets its lowest bit flipped after packing? It stands in for a packing bug, so the
 * test can prove the bitwise self-check catches it. */
static bool corrupt_wanted(const struct cvt_run_state *R, const struct cvt_out *o)
{
    const char *s = R->hooks->corrupt_output;
    return s && !strcmp(s, o->name);
}

/* Stream the packed qweight, scales and qzeros of `cols` further columns of W4 output o (whole
 * n-tiles, contiguous in all three layouts, DESIGN 4) to rank's file at offs[0..2], which
 * advance by the bytes written. */
static enum cvt_err put_w4_cols(struct cvt_run_state *R, int rank, const struct cvt_out *o,
                                int64_t cols, const uint8_t *qp, const uint16_t *sp,
                                const uint8_t *zp, uint64_t offs[3])
{
    int64_t K = o->rows, ng = K / o->group;
    uint32_t i0 = R->idx[rank][o - R->plan->ranks[rank].outs];
    size_t nq = (size_t)(K * cols / 2), ns = (size_t)(ng * cols) * 2, nz = (size_t)(ng * cols / 2);
    enum cvt_err e;
    if ((e = cvt_run_put_part(R, rank, i0, offs[0], qp, nq)) ||
        (e = cvt_run_put_part(R, rank, i0 + 1, offs[1], sp, ns)) ||
        (e = cvt_run_put_part(R, rank, i0 + 2, offs[2], zp, nz)))
        return e;
    offs[0] += nq;
    offs[1] += ns;
    offs[2] += nz;
    return CVT_ERR_NONE;
}

/* Pack columns [c0 + c, c0 + c + S) (a sub-block of the load chunk) into their place in the
 * chunk's packed copy (kept for the self-check) and stream the packed bytes to the rank file. */
static enum cvt_err w4_sub(struct cvt_run_state *R, int rank, const struct cvt_out *o, int64_t cw,
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
    if (c == 0 && corrupt_wanted(R, o))
        qp[0] ^= 1;
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

static int64_t k_block(const struct cvt_run_state *R, int64_t G, int64_t N_src)
{
    /* a quarter of the worker's budget when that is smaller (the tests' tiny budgets) */
    uint64_t bytes =
        R->chunk_bytes / 4 < CVT_K_BLOCK_BYTES ? R->chunk_bytes / 4 : CVT_K_BLOCK_BYTES;
    int64_t rows = (int64_t)bytes / (N_src / 2 > 0 ? N_src / 2 : 1);
    if (rows > CVT_K_BLOCK_MAX)
        rows = CVT_K_BLOCK_MAX;
    rows = rows / G * G;
    return rows < G ? G : rows;
}

/* Largest k_block over the sources of output o (sizes the source-dequant buffer). */
static int64_t k_block_max(const struct cvt_run_state *R, const struct cvt_out *o)
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

/* The part of segment sg inside the load chunk's columns [c0, c0 + cw): source columns
 * [n0, n1), w of them, at chunk column dc; its source ps and decoder row block kb. */
struct seg_part {
    const struct cvt_plan_src *ps;
    int64_t n0, n1, w, dc, kb;
};

static bool seg_part(const struct cvt_run_state *R, const struct cvt_seg *sg, int64_t c0,
                     int64_t cw, struct seg_part *sp)
{
    int64_t a = sg->dst_c0 > c0 ? sg->dst_c0 : c0;
    int64_t z = sg->dst_c0 + sg->n_cols < c0 + cw ? sg->dst_c0 + sg->n_cols : c0 + cw;
    if (a >= z)
        return false; /* not in this chunk */
    sp->ps = &R->plan->srcs[sg->src];
    sp->n0 = sg->src_c0 + (a - sg->dst_c0);
    sp->n1 = sp->n0 + (z - a);
    sp->w = z - a;
    sp->dc = a - c0;
    sp->kb = k_block(R, sp->ps->group, sp->ps->cols);
    return true;
}

/* One load chunk [c0, c0 + cw) of output columns of W4 output o on `rank`. */
static enum cvt_err w4_chunk(struct cvt_run_state *R, int rank, const struct cvt_out *o, int64_t c0,
                             int64_t cw, struct w4_bufs *b, uint64_t offs[3])
{
    int64_t K = o->rows, G = o->group, ng = K / G;
    enum cvt_err e = CVT_ERR_NONE;
    memset(b->q, 0, (size_t)(K * cw));
    memset(b->z, 0, (size_t)(ng * cw));
    memset(b->s, 0, (size_t)(ng * cw) * sizeof(uint16_t));
    /* decode each overlapping source slice into place */
    for (int si = 0; si < o->n_segs; si++) {
        const struct cvt_seg *sg = &o->segs[si];
        struct seg_part sp;
        if (!seg_part(R, sg, c0, cw, &sp))
            continue;
        const struct cvt_plan_src *ps = sp.ps;
        const int64_t n0 = sp.n0, n1 = sp.n1, w = sp.w, dc = sp.dc, kb = sp.kb;
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
        struct seg_part sp;
        if (!seg_part(R, sg, c0, cw, &sp))
            continue;
        const struct cvt_plan_src *ps = sp.ps;
        const int64_t n0 = sp.n0, n1 = sp.n1, w = sp.w, dc = sp.dc, kb = sp.kb;
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
static enum cvt_err w4_generic_bufs(struct cvt_run_state *R, int rank, const struct cvt_out *o,
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
static enum cvt_err w4_generic(struct cvt_run_state *R, int rank, const struct cvt_out *o,
                               int64_t c0, int64_t cw, struct w4_bufs *b, uint64_t offs[3])
{
    int64_t C;
    enum cvt_err e = w4_generic_bufs(R, rank, o, b, &C);
    for (int64_t c = c0; !e && c < c0 + cw && !cvt_run_stopped(R); c += C)
        e = w4_chunk(R, rank, o, c, C < c0 + cw - c ? C : c0 + cw - c, b, offs);
    return e;
}

/* Columns per chunk of the GEMM fast path: only the packed chunk is held (K/2 + 5/2 K/G bytes
 * per column), so chunks are ~10x wider than the generic path's. */
static int64_t fast_chunk_cols(const struct cvt_run_state *R, int64_t K, int64_t ng, int64_t N)
{
    int64_t per_col = K / 2 + ng * 3;
    int64_t c = (int64_t)R->chunk_bytes / per_col / 64 * 64;
    if (c < 64)
        c = 64;
    return c < N ? c : N;
}

/* One W4 output through the GEMM fast path (cvt_fast.c), chunk by chunk; a chunk it declines
 * (a bad scale value) goes through the generic path, which reports it. */
static enum cvt_err w4_fast(struct cvt_run_state *R, int rank, const struct cvt_out *o,
                            struct w4_bufs *b, uint64_t offs[3])
{
    int64_t K = o->rows, N = o->cols, ng = K / o->group, C = fast_chunk_cols(R, K, ng, N);
    size_t piece = cvt_fast_piece_bytes(o->group);
    bool ck = !R->o->no_check, corrupt = corrupt_wanted(R, o);
    if (!w4_ensure(b, 7, (size_t)(K * C / 2)) || !w4_ensure(b, 8, (size_t)(ng * C / 2)) ||
        !w4_ensure(b, 10, (size_t)(ng * C) * 2) || (ck && !w4_ensure(b, 4, piece)) ||
        (ck && !w4_ensure(b, 11, piece))) {
        qs_log_error(__func__, "rank %d: tensor %s: out of memory for a %" PRId64 " x %" PRId64
                               " chunk", rank, o->name, K, C);
        return CVT_ERR_NOMEM;
    }
    enum cvt_err e = CVT_ERR_NONE;
    for (int64_t c0 = 0; c0 < N && !e && !cvt_run_stopped(R); c0 += C) {
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

static enum cvt_err job_w4(struct cvt_run_state *R, int rank, const struct cvt_out *o,
                           struct w4_bufs *b)
{
    uint64_t offs[3] = {0, 0, 0};
    if (!R->o->no_fast_path && cvt_fast_w4_ok(R->src, R->cfg, R->plan, o))
        return w4_fast(R, rank, o, b, offs);
    return w4_generic(R, rank, o, 0, o->cols, b, offs);
}

/* --- float outputs ------------------------------------------------------------------------- */

/* Unquantized linear: output F16 [N_out][K_out] (o->cols x o->rows) from source .weight
 * [N_src][K_src]; output row n takes source row src_c0 + (n - dst_c0), columns
 * [src_r0, +n_rows). */
static enum cvt_err job_linear_f16(struct cvt_run_state *R, int rank, const struct cvt_out *o)
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
    for (int64_t n0 = 0; n0 < N && !e && !cvt_run_stopped(R); n0 += rows_per) {
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
            e = cvt_run_put_part(R, rank, index, off, buf, (size_t)(nr * K) * sizeof(uint16_t));
        off += (uint64_t)(nr * K) * sizeof(uint16_t);
    }
    free(buf);
    return e;
}

/* F16 matrix [rows][cols] (embedding, lm_head) or F32 [rows][cols] (vectors, router) from
 * row-contiguous source pieces. */
static enum cvt_err job_float(struct cvt_run_state *R, int rank, const struct cvt_out *o)
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
    for (int64_t r0 = 0; r0 < o->rows && !e && !cvt_run_stopped(R); r0 += rows_per) {
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
        if (!e && !f16 && o->offset != 0.0f) /* Gemma's norms: 1 + w, in fp32 */
            for (int64_t i = 0; i < nr * C; i++)
                ((float *)buf)[i] += o->offset;
        if (!e)
            e = cvt_run_put_part(R, rank, index, off, buf, (size_t)(nr * C) * es);
        off += (uint64_t)(nr * C) * es;
    }
    free(buf);
    return e;
}

/* Act-order permutation `<name>.perm` I32 [K] (DESIGN 4.5): the canonical-to-source rows of
 * the first source (cvt_awq_gidx); every other part of a fused output must have the same one;
 * rows past the source (padding) map to themselves. */
static enum cvt_err job_perm(struct cvt_run_state *R, int rank, const struct cvt_out *o)
{
    const int64_t K = o->cols;
    int32_t *perm = malloc((size_t)K * sizeof *perm), *other = malloc((size_t)K * sizeof *other);
    enum cvt_err e = CVT_ERR_NOMEM;
    bool act;
    if (!perm || !other) {
        qs_log_error(__func__, "tensor %s: out of memory", o->name);
        goto out;
    }
    for (int64_t j = 0; j < K; j++)
        perm[j] = (int32_t)j;
    for (int si = 0; si < o->n_segs; si++) {
        const struct cvt_plan_src *ps = &R->plan->srcs[o->segs[si].src];
        int32_t *dst = si ? other : perm;
        if ((e = cvt_awq_gidx(R->src, R->cfg, ps->name, ps->rows, &act, dst)))
            goto out;
        if (si && memcmp(perm, other, (size_t)ps->rows * sizeof *perm)) {
            const char *first = R->plan->srcs[o->segs[0].src].name;
            qs_log_error(__func__, "tensor %s.g_idx orders the input rows differently from "
                         "%s.g_idx; the fused %s needs one input order (they share their input)",
                         ps->name, first, o->name);
            e = CVT_ERR_UNSUPPORTED;
            goto out;
        }
    }
    uint32_t index = R->idx[rank][o - R->plan->ranks[rank].outs];
    e = cvt_run_put_part(R, rank, index, 0, perm, (size_t)K * sizeof *perm);
out:
    free(perm);
    free(other);
    return e;
}

void *cvt_job_worker(void *state)
{
    struct cvt_run_state *R = state;
    struct w4_bufs b;
    memset(&b, 0, sizeof(b));
    for (;;) {
        if (cvt_run_stopped(R))
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
        case CVT_OUT_PERM: e = job_perm(R, rank, o); break;
        default: e = job_float(R, rank, o); break;
        }
        if (e)
            cvt_run_fail(R, e);
    }
    w4_bufs_free(&b);
    return NULL;
}

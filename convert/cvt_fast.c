/*
 * cvt_fast.c - the converter's fast path for AutoAWQ GEMM sources: one load chunk of a packed
 * W4 output (DESIGN 4.1-4.3) made straight from the mapped source words, with the bitwise
 * self-check fused into the same pass.
 *
 * Entry point: cvt_fast_w4_chunk() (cvt.h), called by cvt_run.c for every load chunk; it
 * answers CVT_FAST_NO when the chunk is not for it (another variant, BF16 scales, a segment
 * edge not on the 8-column / 16-row / local-group grid, a bad scale value), and cvt_run.c then
 * makes the chunk through the generic path (cvt_awq_load + ref_pack_*), which also reports any
 * bad value. Both paths give the same bytes: test_cvt compares every fixture conversion with
 * its twins in other variants, which only the generic path reads.
 *
 * Why it is fast: the AutoAWQ GEMM word (qweight I32 [K, N/8], docs/FORMATS.md 3.2: nibble i holds
 * column 8c + ORDER[i], ORDER = {0,2,4,6,1,3,5,7}) and our tile word (DESIGN 4.1) are both
 * nibble permutations of the same codes. For thread t = 4m + p and word w of a tile, nibble i
 * of our word is column m of source row 2p + 8(i%2) + i/4, sub-tile 2w + (i/2)%2; with X_i that
 * source word, our word m is nibble REV[m] of every X_i: the 8 x 8 nibble transpose of
 * (X_0..X_7), whose row s lands in word m = ORDER[s]. So a tile is 16 gathers of 8 words, 16
 * nibble transposes and 128 stores; qzeros (DESIGN 4.3: word c nibble j = column 8j + c) is the
 * same transpose of the 8 source zero words of one group row. No code array, no copies.
 *
 * The SELF-CHECK (default on) runs per [P][64] piece of one n-tile and one local group (P = G_r
 * up to 256 rows, else a divisor of it), while the source words are in cache: the source is
 * dequantized by this file's own walk of the source words in the packer's ORDER with tables of
 * (q - z) * s per (group, column) built from the source qzeros/scales (fp32, one rounding), our
 * packed piece by the kernels' reference ref_dequant_w4 (kernels/ref_pack.c), and the two fp32
 * arrays must be equal bit for bit (padding: +0.0). Neither side uses the transposes above. The
 * source side is compared with ours on the fly, 4 columns at a time with SSE4.1 where the build
 * has it (x86-64-v2), else by the scalar table walk; on a difference the scalar walk writes the
 * source piece out and the first differing element is reported with both coordinates.
 * What the check shares with the packer: the column/row mapping of the segments (resolve) and
 * the staged copy of the piece's source words; which source bytes feed which output element is
 * checked by test_cvt against the generic path, the goldens and the twins instead.
 *
 * Memory: the chunk's packed bytes (the caller's buffers) plus two [P][64] fp32 pieces; source
 * rows are read from the mapping in k-blocks of about CVT_FAST_KBLOCK_BYTES of source rows,
 * whose pages are dropped again after each block (cvt_source_release_range), so RSS does not
 * grow with the tensor.
 *
 * Test: build/test_cvt (test_fast_vs_generic: every fixture at every tp byte-identical to the
 * generic path, --debug-no-fast-path; goldens and twins; the corrupt_output hook caught).
 */
#include <stdlib.h>
#include <string.h>

#include "cvt.h"
#include "cvt_src_int.h" /* cvt_ld16, cvt_ld32, cvt_f16_to_f32 */
#include "fmt.h"         /* FMT_W4_TILE_BYTES */
#include "ref.h"         /* ref_dequant_w4 */

/* Source row bytes read between two releases of their pages (per segment). */
#define CVT_FAST_KBLOCK_BYTES (1u << 20)

/* nibble i of an AutoAWQ GEMM word holds column ORDER[i] of its 8 (docs/FORMATS.md 3.2) */
static const int ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* One segment of the output that overlaps the chunk, resolved against the source mapping. */
struct fseg {
    const struct cvt_plan_src *ps;
    const struct cvt_src_tensor *tq, *tz, *ts; /* qweight, qzeros, scales */
    const uint8_t *qw, *qz, *sc;               /* mapped bytes of the three */
    int64_t W;                                 /* source words per row: N_src / 8 */
    int64_t N, Gs;                             /* source N, source group size */
    int64_t r0, r1;                            /* output rows covered */
    int64_t src_r0;                            /* source row of output row r0 */
    int64_t src_c0, dst_c0;
};

static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* 8 x 8 nibble transpose of x[i][l] (lanes l = 0..L-1 independent): afterwards nibble i of
 * x[s][l] is what nibble s of x[i][l] was. Three rounds of block swaps (4, 2, 1 nibbles). */
#define CVT_FAST_LANES 16
#define CVT_FAST_SWAP(x, i, b, m, L)                                          \
    for (int l = 0; l < (L); l++) {                                           \
        uint32_t t_ = ((x[i][l] >> (4 * (b))) ^ x[(i) + (b)][l]) & (m);       \
        x[(i) + (b)][l] ^= t_;                                                \
        x[i][l] ^= t_ << (4 * (b));                                           \
    }
#define CVT_FAST_TRANSPOSE(x, L)                                                            \
    do {                                                                                    \
        CVT_FAST_SWAP(x, 0, 4, 0x0000ffffu, L) CVT_FAST_SWAP(x, 1, 4, 0x0000ffffu, L)      \
        CVT_FAST_SWAP(x, 2, 4, 0x0000ffffu, L) CVT_FAST_SWAP(x, 3, 4, 0x0000ffffu, L)      \
        CVT_FAST_SWAP(x, 0, 2, 0x00ff00ffu, L) CVT_FAST_SWAP(x, 1, 2, 0x00ff00ffu, L)      \
        CVT_FAST_SWAP(x, 4, 2, 0x00ff00ffu, L) CVT_FAST_SWAP(x, 5, 2, 0x00ff00ffu, L)      \
        CVT_FAST_SWAP(x, 0, 1, 0x0f0f0f0fu, L) CVT_FAST_SWAP(x, 2, 1, 0x0f0f0f0fu, L)      \
        CVT_FAST_SWAP(x, 4, 1, 0x0f0f0f0fu, L) CVT_FAST_SWAP(x, 6, 1, 0x0f0f0f0fu, L)      \
    } while (0)

/* 16 lanes (the 4 x 4 (p, w) word pairs of one tile; constant trip counts vectorize) */
static void transpose_nib16(uint32_t x[8][CVT_FAST_LANES])
{
    CVT_FAST_TRANSPOSE(x, CVT_FAST_LANES);
}
/* one lane (a zeros row) */
static void transpose_nib1(uint32_t x[8][1]) { CVT_FAST_TRANSPOSE(x, 1); }

/* Source row of output row r in segment s (r inside [r0, r1)). */
static inline int64_t src_row(const struct fseg *s, int64_t r) { return s->src_r0 + (r - s->r0); }

/* Does sub-tile column group j (its segment js, -1 = none) have output row r? */
static inline bool covered(const struct fseg *sg, int js, int64_t r)
{
    return js >= 0 && r >= sg[js].r0 && r < sg[js].r1;
}

/* Source words of rows [r, r + P) of one n-tile into S[P][8] (sub-tile j = column word j;
 * 0 where not covered). The piece's rows are a power-of-two stride apart in the source for
 * most shapes (N = 4096: 2 KiB), so they share a few L1 sets; packing and the self-check read
 * this compact copy instead (one strided pass over the mapping per piece). */
static void stage_piece(const struct fseg *sg, const int8_t *js, const int64_t *jw, int64_t r,
                        int64_t P, int64_t prefetch_tiles, uint32_t *S)
{
#if defined(__GNUC__)
    /* the same rows two n-tiles on (the next cache line of each row; this one's other half
     * is read by the next n-tile) are needed a few pieces later: fetch them into L2 now, as a
     * stride of 2-6 KiB defeats the hardware prefetchers (js/jw have entries for every
     * n-tile of the chunk; the caller says how many lie ahead) */
    if (prefetch_tiles >= 2)
        for (int jj = 16; jj < 24; jj += 7) {
            if (js[jj] < 0)
                continue;
            const struct fseg *s = &sg[js[jj]];
            const uint64_t stride = (uint64_t)s->W * 4;
            for (int64_t k = 0; k < P; k++)
                if (covered(sg, js[jj], r + k))
                    __builtin_prefetch(s->qw + (uint64_t)src_row(s, r + k) * stride +
                                       (uint64_t)jw[jj] * 4, 0, 2);
        }
#endif
    bool whole = js[0] >= 0; /* one segment, consecutive words, every row: 32-byte row copies */
    for (int j = 1; j < 8 && whole; j++)
        whole = js[j] == js[0] && jw[j] == jw[0] + j;
    if (whole && r >= sg[js[0]].r0 && r + P <= sg[js[0]].r1) {
        const struct fseg *s = &sg[js[0]];
        const uint64_t stride = (uint64_t)s->W * 4;
        const uint8_t *p = s->qw + (uint64_t)src_row(s, r) * stride + (uint64_t)jw[0] * 4;
        for (int64_t k = 0; k < P; k++, p += stride)
            memcpy(S + k * 8, p, 32);
        return;
    }
    for (int j = 0; j < 8; j++) {
        if (js[j] < 0) {
            for (int64_t k = 0; k < P; k++)
                S[k * 8 + j] = 0;
            continue;
        }
        const struct fseg *s = &sg[js[j]];
        const uint64_t stride = (uint64_t)s->W * 4;
        for (int64_t k = 0; k < P; k++)
            S[k * 8 + j] = covered(sg, js[j], r + k)
                               ? cvt_ld32(s->qw + (uint64_t)src_row(s, r + k) * stride +
                                          (uint64_t)jw[j] * 4)
                               : 0;
    }
}

/* One tile from its 16 staged source rows S[16][8] (sub-tile j = word j of each row). */
static void pack_tile(const uint32_t *S, uint8_t *out)
{
    uint32_t X[8][CVT_FAST_LANES]; /* X[i][4p + w]: source row 2p + 8(i%2) + i/4, sub-tile
                                    * 2w + (i/2)%2 */
    for (int i = 0; i < 8; i++)
        for (int p = 0; p < 4; p++)
            for (int w = 0; w < 4; w++)
                X[i][4 * p + w] = S[(2 * p + 8 * (i & 1) + (i >> 2)) * 8 + 2 * w + ((i >> 1) & 1)];
    transpose_nib16(X);
    for (int s = 0; s < 8; s++) /* row s is our word for column m = ORDER[s] */
        memcpy(out + ORDER[s] * 64, X[s], 64); /* threads 4m..4m+3, words 0..3 */
}

/* Scales and zeros row (nt, g) of local group g whose first output row is r (DESIGN 4.2, 4.3).
 * Returns false on a scale that is not finite and > 0 (the generic path reports it). */
static bool pack_group(const struct fseg *sg, const int8_t *js, const int64_t *jw, int64_t r,
                       uint16_t *sp, uint8_t *zp)
{
    uint32_t Z[8][1];
    unsigned bad = 0;
    for (int j = 0; j < 8; j++) {
        Z[j][0] = 0;
        if (!covered(sg, js[j], r)) {
            for (int c = 0; c < 8; c++)
                sp[c * 8 + j] = 0;
            continue;
        }
        const struct fseg *s = &sg[js[j]];
        const int64_t gs = src_row(s, r) / s->Gs;
        Z[j][0] = cvt_ld32(s->qz + ((uint64_t)gs * (uint64_t)s->W + (uint64_t)jw[j]) * 4);
        const uint8_t *srow = s->sc + ((uint64_t)gs * (uint64_t)s->N + (uint64_t)jw[j] * 8) * 2;
        for (int c = 0; c < 8; c++) {
            uint16_t h = cvt_ld16(srow + 2 * c);
            bad |= (h & 0x8000u) | ((h & 0x7c00u) == 0x7c00u) | (h == 0); /* finite, > 0 */
            sp[c * 8 + j] = h;
        }
    }
    transpose_nib1(Z);
    for (int s = 0; s < 8; s++)
        st32(zp + 4 * ORDER[s], Z[s][0]);
    return !bad;
}

/* The source's zeros and scales of one piece (rows [r, r + P) of one n-tile), per sub-tile j:
 * zw[j] the source qzeros word (nibble i = zero of column ORDER[i]), sv[j][i] the scale of
 * column ORDER[i] as fp32, and the covered piece rows [lo[j], hi[j]) (empty: nothing covered). */
struct piece_src {
    uint32_t zw[8];
    float sv[8][8];
    int64_t lo[8], hi[8];
};

static void piece_groups(const struct fseg *sg, const int8_t *js, const int64_t *jw, int64_t r,
                         int64_t P, struct piece_src *g)
{
    for (int j = 0; j < 8; j++) {
        g->zw[j] = 0;
        g->lo[j] = g->hi[j] = 0;
        for (int i = 0; i < 8; i++)
            g->sv[j][i] = 0.0f;
        if (js[j] < 0)
            continue;
        const struct fseg *s = &sg[js[j]];
        const int64_t lo = s->r0 > r ? s->r0 - r : 0, hi = s->r1 - r < P ? s->r1 - r : P;
        if (lo >= hi)
            continue;
        const int64_t gs = src_row(s, r + lo) / s->Gs; /* one source group per piece */
        g->lo[j] = lo;
        g->hi[j] = hi;
        g->zw[j] = cvt_ld32(s->qz + ((uint64_t)gs * (uint64_t)s->W + (uint64_t)jw[j]) * 4);
        const uint8_t *srow = s->sc + ((uint64_t)gs * (uint64_t)s->N + (uint64_t)jw[j] * 8) * 2;
        for (int i = 0; i < 8; i++)
            g->sv[j][i] = cvt_f16_to_f32(cvt_ld16(srow + 2 * ORDER[i]));
    }
}

/* SELF-CHECK, source side: rows [r, r + P) x the 64 columns of one n-tile dequantized from
 * the staged source words S[P][8] (nibble i -> column ORDER[i]) with per-(group, column) tables
 * of the fp32 bits of (float)(q - z) * s built from the source qzeros / scales (g);
 * uncovered elements +0.0. With `a`, writes the values to a[P][64]; otherwise compares them
 * with ours[P][64] (our packed piece dequantized by ref_dequant_w4) and returns the OR of the
 * XORed bits: 0 when the two are bitwise equal. */
static uint32_t dequant_source(const struct piece_src *g, int64_t P, const uint32_t *S,
                               const float *ours, float *a)
{
    uint32_t tab[64][16];
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 8; i++) {
            const int col = ORDER[i];
            const int z = (int)((g->zw[j] >> (4 * i)) & 15u);
            for (int q = 0; q < 16; q++) {
                const float v = (float)(q - z) * g->sv[j][i];
                memcpy(&tab[8 * j + col][q], &v, 4);
            }
        }
    uint32_t d = 0; /* OR of the XORs */
    for (int j = 0; j < 8; j++) {
        const uint32_t(*t)[16] = tab + 8 * j;
        for (int64_t k = 0; k < P; k++) {
            uint32_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ov[8];
            if (k >= g->lo[j] && k < g->hi[j]) {
                const uint32_t wq = S[k * 8 + j];
                /* nibble i -> column ORDER[i] = 0, 2, 4, 6, 1, 3, 5, 7; uncovered: +0.0 */
                v[0] = t[0][wq & 15u];
                v[2] = t[2][(wq >> 4) & 15u];
                v[4] = t[4][(wq >> 8) & 15u];
                v[6] = t[6][(wq >> 12) & 15u];
                v[1] = t[1][(wq >> 16) & 15u];
                v[3] = t[3][(wq >> 20) & 15u];
                v[5] = t[5][(wq >> 24) & 15u];
                v[7] = t[7][wq >> 28];
            }
            if (a) {
                memcpy(a + k * 64 + 8 * j, v, sizeof(v));
                continue;
            }
            memcpy(ov, ours + k * 64 + 8 * j, sizeof(ov));
            d |= (v[0] ^ ov[0]) | (v[1] ^ ov[1]) | (v[2] ^ ov[2]) | (v[3] ^ ov[3]) |
                 (v[4] ^ ov[4]) | (v[5] ^ ov[5]) | (v[6] ^ ov[6]) | (v[7] ^ ov[7]);
        }
    }
    return d;
}

#if defined(__SSE4_1__)
#include <smmintrin.h> /* SSE4.1: _mm_mullo_epi32 (the x86-64-v2 build) */

/* The compare mode of dequant_source computed 4 columns at a time: per source word, nibbles
 * 0..3 (columns 0, 2, 4, 6) and 4..7 (columns 1, 3, 5, 7) are isolated by a multiply (a shift
 * left by 28 - 4i per lane) and a shift right by 28, then (float)(q - z) * s exactly as the
 * scalar form (int -> fp32 exact, one IEEE multiply, round to nearest). Returns nonzero when
 * any element differs from ours bitwise; the scalar form then finds and reports it. */
static uint32_t compare_source(const struct piece_src *g, int64_t P, const uint32_t *S,
                               const float *ours)
{
    const __m128i mul_even = _mm_setr_epi32(1 << 28, 1 << 24, 1 << 20, 1 << 16);
    const __m128i mul_odd = _mm_setr_epi32(1 << 12, 1 << 8, 1 << 4, 1);
    __m128i acc = _mm_setzero_si128();
    for (int j = 0; j < 8; j++) {
        const __m128i vz = _mm_set1_epi32((int)g->zw[j]);
        const __m128i z_even = _mm_srli_epi32(_mm_mullo_epi32(vz, mul_even), 28);
        const __m128i z_odd = _mm_srli_epi32(_mm_mullo_epi32(vz, mul_odd), 28);
        const __m128 s_even = _mm_loadu_ps(&g->sv[j][0]), s_odd = _mm_loadu_ps(&g->sv[j][4]);
        const float *o = ours + 8 * j;
        int64_t k = 0;
        for (; k < g->lo[j]; k++) /* uncovered rows: ours must be +0.0 */
            acc = _mm_or_si128(acc, _mm_or_si128(_mm_castps_si128(_mm_loadu_ps(o + k * 64)),
                                                 _mm_castps_si128(_mm_loadu_ps(o + k * 64 + 4))));
        for (; k < g->hi[j]; k++) {
            const __m128i w = _mm_set1_epi32((int)S[k * 8 + j]);
            const __m128i q_even = _mm_srli_epi32(_mm_mullo_epi32(w, mul_even), 28);
            const __m128i q_odd = _mm_srli_epi32(_mm_mullo_epi32(w, mul_odd), 28);
            const __m128 f_even =
                _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(q_even, z_even)), s_even);
            const __m128 f_odd = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(q_odd, z_odd)), s_odd);
            const __m128 lo4 = _mm_loadu_ps(o + k * 64), hi4 = _mm_loadu_ps(o + k * 64 + 4);
            const __m128 o_even = _mm_shuffle_ps(lo4, hi4, _MM_SHUFFLE(2, 0, 2, 0));
            const __m128 o_odd = _mm_shuffle_ps(lo4, hi4, _MM_SHUFFLE(3, 1, 3, 1));
            const __m128i d_even =
                _mm_xor_si128(_mm_castps_si128(f_even), _mm_castps_si128(o_even));
            const __m128i d_odd = _mm_xor_si128(_mm_castps_si128(f_odd), _mm_castps_si128(o_odd));
            acc = _mm_or_si128(acc, _mm_or_si128(d_even, d_odd));
        }
        for (; k < P; k++)
            acc = _mm_or_si128(acc, _mm_or_si128(_mm_castps_si128(_mm_loadu_ps(o + k * 64)),
                                                 _mm_castps_si128(_mm_loadu_ps(o + k * 64 + 4))));
    }
    return _mm_movemask_epi8(_mm_cmpeq_epi32(acc, _mm_setzero_si128())) != 0xffff;
}
#else
static uint32_t compare_source(const struct piece_src *g, int64_t P, const uint32_t *S,
                               const float *ours)
{
    return dequant_source(g, P, S, ours, NULL);
}
#endif

/* Rows of one self-check piece: the local group up to 256 rows, else gcd(G, 256), which for the
 * power of two 256 is G's lowest set bit capped at 256. */
static int64_t piece_rows(int64_t G)
{
    if (G <= 256)
        return G;
    int64_t low = G & -G;
    return low < 256 ? low : 256;
}

size_t cvt_fast_piece_bytes(int64_t G)
{
    return (size_t)(piece_rows(G) * 64) * sizeof(float);
}

/* Resolve the segments of o overlapping chunk columns [c0, c0 + cw) into sg[] and the per
 * 8-column group tables js / jw; false when the chunk is not for the fast path. */
static bool resolve(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                    const struct cvt_plan *p, const struct cvt_out *o, int64_t c0, int64_t cw,
                    struct fseg *sg, int8_t *js, int64_t *jw)
{
    const int64_t K = o->rows, G = o->group;
    if (cw % 64 || c0 % 64 || K % 16 || G % 16 || K % G || o->n_segs > CVT_MAX_SEGS)
        return false;
    for (int64_t j = 0; j < cw / 8; j++)
        js[j] = -1;
    for (int si = 0; si < o->n_segs; si++) {
        const struct cvt_seg *s = &o->segs[si];
        const int64_t a = s->dst_c0 > c0 ? s->dst_c0 : c0;
        const int64_t z = s->dst_c0 + s->n_cols < c0 + cw ? s->dst_c0 + s->n_cols : c0 + cw;
        struct fseg *f = &sg[si];
        memset(f, 0, sizeof(*f));
        f->r0 = f->r1 = 0;
        if (a >= z)
            continue;
        const struct cvt_plan_src *ps = &p->srcs[s->src];
        /* 8-column groups map to whole source words; rows on the tile and local-group grid */
        if (s->dst_c0 % 8 || s->src_c0 % 8 || s->n_cols % 8 || s->dst_r0 % G ||
            (s->n_rows % G && s->dst_r0 + s->n_rows != K) || s->n_rows % 16 || s->src_r0 % 16)
            return false;
        struct cvt_awq_info in;
        if (ps->kind != CVT_SRC_AWQ ||
            cvt_awq_probe(src, cfg, ps->name, ps->rows, ps->cols, &in) != CVT_ERR_NONE ||
            in.variant != CVT_VARIANT_GEMM || !in.zeros || in.scales->dtype != CVT_DT_F16)
            return false;
        f->ps = ps;
        f->tq = in.qweight;
        f->tz = in.zeros;
        f->ts = in.scales;
        f->qw = cvt_source_data(src, in.qweight);
        f->qz = cvt_source_data(src, in.zeros);
        f->sc = cvt_source_data(src, in.scales);
        if (!f->qw || !f->qz || !f->sc)
            return false;
        f->N = in.N;
        f->W = in.N / 8;
        f->Gs = in.G;
        f->r0 = s->dst_r0;
        f->r1 = s->dst_r0 + s->n_rows;
        f->src_r0 = s->src_r0;
        f->src_c0 = s->src_c0;
        f->dst_c0 = s->dst_c0;
        for (int64_t col = a; col < z; col += 8) {
            const int64_t j = (col - c0) / 8;
            if (js[j] >= 0) /* two segments in one column: rows stacked, not for this path */
                return false;
            js[j] = (int8_t)si;
            jw[j] = (s->src_c0 + (col - s->dst_c0)) / 8;
        }
    }
    return true;
}

/* First differing element of pieces a (source) and b (ours), P x 64, into *mm. */
static void first_diff(const struct fseg *sg, const int8_t *js, const int64_t *jw, int64_t r,
                       int64_t P, int64_t col0, const float *a, const float *b,
                       struct cvt_fast_mismatch *mm)
{
    for (int64_t k = 0; k < P; k++)
        for (int n = 0; n < 64; n++)
            if (memcmp(&a[k * 64 + n], &b[k * 64 + n], sizeof(float))) {
                const int j = n / 8;
                mm->k = r + k;
                mm->n = col0 + n;
                mm->want = a[k * 64 + n];
                mm->got = b[k * 64 + n];
                mm->src_name = NULL;
                if (covered(sg, js[j], r + k)) {
                    const struct fseg *s = &sg[js[j]];
                    mm->src_name = s->ps->name;
                    mm->src_k = src_row(s, r + k);
                    mm->src_n = jw[j] * 8 + n % 8;
                }
                return;
            }
    /* the vector compare saw a difference the scalar walk does not: a bug in one of them */
    mm->k = r;
    mm->n = col0;
    mm->want = mm->got = 0.0f;
    mm->src_name = "(none: the SSE and scalar source dequantizations disagree)";
    mm->src_k = mm->src_n = 0;
}

bool cvt_fast_w4_ok(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                    const struct cvt_plan *p, const struct cvt_out *o)
{
    struct fseg sg[CVT_MAX_SEGS];
    int8_t *js = malloc((size_t)(o->cols / 8 + 1));
    int64_t *jw = malloc((size_t)(o->cols / 8 + 1) * sizeof(*jw));
    bool ok = js && jw && o->kind == CVT_OUT_W4 && o->cols % 64 == 0 &&
              resolve(src, cfg, p, o, 0, o->cols, sg, js, jw);
    free(js);
    free(jw);
    return ok;
}

enum cvt_fast_rc cvt_fast_w4_chunk(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                                   const struct cvt_plan *p, const struct cvt_out *o, int64_t c0,
                                   int64_t cw, bool check, bool corrupt_first,
                                   const struct cvt_fast_bufs *b, struct cvt_fast_mismatch *mm)
{
    struct fseg sg[CVT_MAX_SEGS];
    uint32_t S[256 * 8]; /* staged source words of one piece, [P][8] */
    const int64_t K = o->rows, G = o->group, ng = K / G, P = piece_rows(G), NT = cw / 64;
    int8_t *js = malloc((size_t)(cw / 8));
    int64_t *jw = malloc((size_t)(cw / 8) * sizeof(*jw));
    enum cvt_fast_rc rc = CVT_FAST_NO;
    if (!js || !jw || !resolve(src, cfg, p, o, c0, cw, sg, js, jw))
        goto out;
    /* k-block: whole pieces, about CVT_FAST_KBLOCK_BYTES of the widest source's rows */
    int64_t row_bytes = 1;
    for (int si = 0; si < o->n_segs; si++)
        if (sg[si].qw && sg[si].W * 4 > row_bytes)
            row_bytes = sg[si].W * 4;
    int64_t kb = (int64_t)CVT_FAST_KBLOCK_BYTES / row_bytes / P * P;
    kb = kb < P ? P : kb;
    for (int64_t r0 = 0; r0 < K; r0 += kb) {
        const int64_t r1 = r0 + kb < K ? r0 + kb : K;
        for (int64_t nt = 0; nt < NT; nt++) {
            const int8_t *jst = js + nt * 8;
            const int64_t *jwt = jw + nt * 8;
            for (int64_t r = r0; r < r1; r += P) {
                uint8_t *q = b->qp + (size_t)(nt * (K / 16) + r / 16) * FMT_W4_TILE_BYTES;
                const int64_t g = r / G;
                uint16_t *s = b->sp + (size_t)(nt * ng + g) * 64;
                uint8_t *z = b->zp + (size_t)(nt * ng + g) * 32;
                stage_piece(sg, jst, jwt, r, P, nt % 2 == 0 ? NT - 1 - nt : 0, S);
                for (int64_t t = 0; t < P / 16; t++)
                    pack_tile(S + t * 16 * 8, q + t * FMT_W4_TILE_BYTES);
                if (r % G == 0 && !pack_group(sg, jst, jwt, r, s, z))
                    goto out; /* a bad scale: the generic path names it */
                if (corrupt_first && r == 0 && nt == 0)
                    q[0] ^= 1; /* hooks corrupt_output: stands in for a packing bug */
                if (!check)
                    continue;
                if (ref_dequant_w4(q, z, s, (int)P, 64, (int)P, b->our_dq)) {
                    rc = CVT_FAST_REF_FAIL;
                    goto out;
                }
                struct piece_src pg;
                piece_groups(sg, jst, jwt, r, P, &pg);
                if (compare_source(&pg, P, S, b->our_dq)) {
                    dequant_source(&pg, P, S, NULL, b->src_dq);
                    first_diff(sg, jst, jwt, r, P, c0 + nt * 64, b->src_dq, b->our_dq, mm);
                    rc = CVT_FAST_MISMATCH;
                    goto out;
                }
            }
        }
        for (int si = 0; si < o->n_segs; si++) { /* drop this block's source rows again */
            const struct fseg *f = &sg[si];
            const int64_t a = r0 > f->r0 ? r0 : f->r0, e = r1 < f->r1 ? r1 : f->r1;
            if (f->qw && a < e)
                cvt_source_release_range(src, f->tq, (uint64_t)src_row(f, a) * (uint64_t)f->W * 4,
                                         (uint64_t)(e - a) * (uint64_t)f->W * 4);
        }
    }
    rc = CVT_FAST_OK;
out:
    for (int si = 0; si < o->n_segs && rc != CVT_FAST_NO; si++)
        if (sg[si].qw) {
            cvt_source_release(src, sg[si].tz);
            cvt_source_release(src, sg[si].ts);
        }
    free(js);
    free(jw);
    return rc;
}

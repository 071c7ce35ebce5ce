/*
 * ref_pack.c - the packed int4 layout of docs/DESIGN.md section 4 (qweight tiles, scales and
 * zeros orders), its inverses, exact dequantisation, and fp16/bf16 <-> fp32 conversion.
 *
 * Entry points: ref_pack_w4 / ref_unpack_w4 / ref_w4_locate (4.1), ref_pack_scales /
 * ref_unpack_scales (4.2), ref_pack_zeros / ref_unpack_zeros (4.3), ref_dequant_w4 /
 * ref_dequant_w4_strided,
 * ref_f16_to_f32 / ref_f32_to_f16 / ref_bf16_to_f32, ref_err_str.
 * Packing and dequantisation walk the packed order (tiles, threads, words) with row pointers,
 * word at a time; dequantisation reads each (group, column)'s zero and scale once into a 16-entry
 * table of (q - z) * s. The per-element definitions they must equal bit for bit live in
 * tests/test_ref.c (pack_w4_naive etc.).
 * Test: ./build/test_ref
 */
#include <pthread.h>
#include <string.h>

#include "qs_log.h" /* qs_log_error */
#include "ref.h"

const char *ref_err_str(enum ref_err e)
{
    switch (e) {
#define REF_X_STR(name, val, msg) \
    case name:                    \
        return msg;
        REF_ERR_LIST(REF_X_STR)
#undef REF_X_STR
    }
    return "unknown ref_err";
}

// --- fp16 / bf16 ------------------------------------------------------------------------------

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float ref_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f) /* inf or NaN: keep the payload in the top mantissa bits */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) /* normal: rebias 15 -> 127 */
        return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0)
        return bits_f32(sign);
    /* subnormal: mant * 2^-24; normalise so the leading 1 reaches bit 10 */
    uint32_t e = 113; /* fp32 biased exponent of 2^-14 */
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

uint16_t ref_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;

    if (x > 0x7f800000u) { /* NaN: keep the top payload bits, make sure it stays a NaN */
        uint16_t payload = (uint16_t)(x >> 13) & 0x3ffu;
        return sign | 0x7c00u | (payload ? payload : 0x200u);
    }
    /* 65520 = 65504 + half an ulp; the tie rounds to the even neighbour, 2^16 = inf */
    if (x >= 0x477ff000u)
        return sign | 0x7c00u;
    if (x >= 0x38800000u) { /* result is a normal half (>= 2^-14) */
        uint32_t h = ((x >> 23) - 112u) << 10 | ((x >> 13) & 0x3ffu);
        uint32_t rest = x & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
            h++; /* a mantissa carry moves into the exponent, which is what we want */
        return sign | (uint16_t)h;
    }
    if (x <= 0x33000000u) /* <= 2^-25: the tie with 2^-24 goes to even (0) */
        return sign;
    /* subnormal half: value / 2^-24 = m * 2^(e - 150 + 24), rounded to nearest even */
    uint32_t e = x >> 23;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t h = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u)))
        h++; /* 0x3ff + 1 = 0x400 is the smallest normal: correct */
    return sign | (uint16_t)h;
}

float ref_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

static float f16_lut[65536];
static pthread_once_t f16_lut_once = PTHREAD_ONCE_INIT;

static void f16_lut_build(void)
{
    for (uint32_t h = 0; h < 65536; h++)
        f16_lut[h] = ref_f16_to_f32((uint16_t)h);
}

const float *ref_f16_lut(void)
{
    pthread_once(&f16_lut_once, f16_lut_build);
    return f16_lut;
}

// --- packed layout -------------------------------------------------------------------------------

int ref_w4_shape_ok(int K, int N, int G)
{
    if (K <= 0 || N <= 0 || K % FMT_W4_TILE_K || N % FMT_W4_TILE_N)
        return 0;
    if (G == 0)
        return 1;
    return G > 0 && G % 16 == 0 && K % G == 0;
}

/*
 * DESIGN 4.1, from the tile side: thread t, word w, nibble i of tile (kt, nt) holds q[k][n] with
 *   a = i % 4, b = i / 4, j = 2w + a/2, k = kt*16 + (t%4)*2 + (a%2)*8 + b, n = nt*64 + j*8 + t/4.
 * Below is the inverse, used by ref_w4_locate; the forward form is used by pack/unpack and the
 * test derives positions a third way, from the PTX fragment tables.
 */
void ref_w4_locate(int K, int N, int k, int n, size_t *byte_off, int *shift)
{
    (void)N;
    int kt = k / 16, nt = n / 64;
    int kr = k % 16, nc = n % 64;
    int j = nc / 8;
    int t = (nc % 8) * 4 + (kr % 8) / 2;
    int b = kr % 2;
    int a = (j % 2) * 2 + kr / 8;
    int w = j / 2;
    int i = a + 4 * b;
    size_t tile = (size_t)nt * (size_t)(K / 16) + (size_t)kt;
    *byte_off = tile * FMT_W4_TILE_BYTES + (size_t)t * 16 + (size_t)w * 4 + (size_t)(i / 2);
    *shift = (i % 2) * 4;
}

/* The (k, n) held by nibble i of word w of thread t in tile (kt, nt) (DESIGN 4.1). */
static inline void w4_coord(int kt, int nt, int t, int w, int i, int *k, int *n)
{
    int a = i % 4, b = i / 4;
    int j = 2 * w + a / 2;
    *k = kt * 16 + (t % 4) * 2 + (a % 2) * 8 + b;
    *n = nt * 64 + j * 8 + t / 4;
}

// --- fast paths: walk the packed order directly (DESIGN 4.1-4.3) ----------------------------------

/*
 * Inside tile (kt, nt), thread t's word w covers the two n8 sub-tiles j0 = 2w and j0 + 1 at
 * column c = t/4 of each (tile columns x = 16w + c and x + 8) and the four rows r0, r0+1, r0+8,
 * r0+9 with r0 = (t%4)*2 (DESIGN 4.1 with a = i%4, b = i/4). Its nibbles, i = 0..7, hold
 *   (r0, x) (r0+8, x) (r0, x+8) (r0+8, x+8) (r0+1, x) (r0+9, x) (r0+1, x+8) (r0+9, x+8).
 * The loops below walk tiles, threads and words in storage order with these row pointers and
 * never compute an element's position from (k, n); tests/test_ref.c compares them with the
 * per-element forms on random shapes.
 */

static inline uint32_t ld_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void st_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* First element > 15 of the row-major [rows][cols] array a, reported as `what`[r][c]. */
static void report_nibble_range(const char *where, const char *what, const uint8_t *a,
                                size_t rows, size_t cols)
{
    for (size_t idx = 0; idx < rows * cols; idx++)
        if (a[idx] > 15) {
            qs_log_error(where, "%s[%zu][%zu] = %u is not a 4-bit value", what, idx / cols,
                         idx % cols, a[idx]);
            return;
        }
}

static enum ref_err check_shape(const char *where, int K, int N)
{
    if (!ref_w4_shape_ok(K, N, 0)) {
        qs_log_error(where, "packed int4 shape [K=%d, N=%d]: need K %% 16 == 0 and N %% 64 == 0",
                     K, N);
        return REF_ERR_SHAPE;
    }
    return REF_ERR_NONE;
}

static inline uint64_t ld_le64(const uint8_t *p)
{
    return (uint64_t)ld_le32(p) | (uint64_t)ld_le32(p + 4) << 32;
}

/* 8 x 8 byte transpose: byte c of m[j] moves to byte j of m[c] (three rounds of block swaps). */
static inline void transpose8x8(uint64_t m[8])
{
    for (int j = 0; j < 4; j++) { /* 4x4 blocks */
        uint64_t a = m[j], b = m[j + 4];
        m[j] = (a & 0x00000000ffffffffull) | (b << 32);
        m[j + 4] = (a >> 32) | (b & 0xffffffff00000000ull);
    }
    for (int j = 0; j < 8; j += (j % 4 == 1) ? 3 : 1) { /* 2x2 blocks: rows 0,1,4,5 with +2 */
        uint64_t a = m[j], b = m[j + 2];
        m[j] = (a & 0x0000ffff0000ffffull) | ((b << 16) & 0xffff0000ffff0000ull);
        m[j + 2] = ((a >> 16) & 0x0000ffff0000ffffull) | (b & 0xffff0000ffff0000ull);
    }
    for (int j = 0; j < 8; j += 2) { /* single bytes */
        uint64_t a = m[j], b = m[j + 1];
        m[j] = (a & 0x00ff00ff00ff00ffull) | ((b << 8) & 0xff00ff00ff00ff00ull);
        m[j + 1] = ((a >> 8) & 0x00ff00ff00ff00ffull) | (b & 0xff00ff00ff00ff00ull);
    }
}

/*
 * Packing a tile, word at a time: for r = 0..7 let byte j*8 + c of the 64-byte row pair
 * m_r = q[r][.] | q[r+8][.] << 4 (two codes per byte, tile columns j*8 + c); transposing its
 * 8 x 8 bytes gives X_r[c] whose byte j is that pair for column j*8 + c. Thread t (c = t/4,
 * r0 = (t%4)*2) then has, in 16-bit lane w of X_r0[c], nibbles (r0, x) (r0+8, x) (r0, x+8)
 * (r0+8, x+8) of word w (x = 16w + c) and in lane w of X_r0+1[c] the rows r0+1, r0+9: word w =
 * lane w of X_r0[c] | lane w of X_r0+1[c] << 16 (DESIGN 4.1).
 */
enum ref_err ref_pack_w4(const uint8_t *q, int K, int N, uint8_t *qweight)
{
    enum ref_err e = check_shape(__func__, K, N);
    if (e)
        return e;
    const size_t n = (size_t)N;
    uint8_t *p = qweight;
    uint64_t all = 0; /* OR of every code: > 15 anywhere shows in a high nibble */
    for (int nt = 0; nt < N / 64; nt++)
        for (int kt = 0; kt < K / 16; kt++) {
            const uint8_t *tile = q + (size_t)kt * 16 * n + (size_t)nt * 64;
            uint64_t x[8][8]; /* x[r][c] after the transpose */
            for (int r = 0; r < 8; r++) {
                const uint8_t *lo = tile + (size_t)r * n, *hi = lo + 8 * n;
                for (int j = 0; j < 8; j++) {
                    uint64_t a = ld_le64(lo + 8 * j), b = ld_le64(hi + 8 * j);
                    all |= a | b;
                    x[r][j] = a | b << 4;
                }
                transpose8x8(x[r]);
            }
            for (int t = 0; t < 32; t++, p += 16) {
                const uint64_t X = x[(t % 4) * 2][t / 4], Y = x[(t % 4) * 2 + 1][t / 4];
                for (int w = 0; w < 4; w++)
                    st_le32(p + 4 * w, (uint32_t)((X >> (16 * w)) & 0xffffu) |
                                           (uint32_t)((Y >> (16 * w)) & 0xffffu) << 16);
            }
        }
    if (all & 0xf0f0f0f0f0f0f0f0ull) {
        report_nibble_range(__func__, "code q", q, (size_t)K, n);
        return REF_ERR_RANGE;
    }
    return REF_ERR_NONE;
}

enum ref_err ref_unpack_w4(const uint8_t *qweight, int K, int N, uint8_t *q)
{
    enum ref_err e = check_shape(__func__, K, N);
    if (e)
        return e;
    const uint8_t *p = qweight;
    for (int nt = 0; nt < N / 64; nt++)
        for (int kt = 0; kt < K / 16; kt++)
            for (int t = 0; t < 32; t++)
                for (int w = 0; w < 4; w++, p += 4) {
                    uint32_t word = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                    (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                    for (int i = 0; i < 8; i++) {
                        int k, n;
                        w4_coord(kt, nt, t, w, i, &k, &n);
                        q[(size_t)k * (size_t)N + (size_t)n] = (word >> (4 * i)) & 0xfu;
                    }
                }
    return REF_ERR_NONE;
}

static enum ref_err check_groups(const char *where, int n_groups, int N)
{
    if (n_groups < 1 || N <= 0 || N % 64) {
        qs_log_error(where, "packed group tensor shape [K/G=%d, N=%d]: need K/G >= 1 and "
                     "N %% 64 == 0", n_groups, N);
        return REF_ERR_SHAPE;
    }
    return REF_ERR_NONE;
}

/* Packed index of s[g][n] in DESIGN 4.2: [N/64][n_groups][64], p = c*8 + j for n%64 = j*8 + c. */
static inline size_t scale_pos(int n_groups, int g, int n)
{
    int nt = n / 64, j = (n % 64) / 8, c = n % 8;
    return ((size_t)nt * (size_t)n_groups + (size_t)g) * 64 + (size_t)(c * 8 + j);
}

enum ref_err ref_pack_scales(const uint16_t *s, int n_groups, int N, uint16_t *out)
{
    enum ref_err e = check_groups(__func__, n_groups, N);
    if (e)
        return e;
    /* 64-entry row (nt, g): position c*8 + j <- column j*8 + c (an 8 x 8 transpose) */
    for (int g = 0; g < n_groups; g++)
        for (int nt = 0; nt < N / 64; nt++) {
            const uint16_t *src = s + (size_t)g * (size_t)N + (size_t)nt * 64;
            uint16_t *dst = out + ((size_t)nt * (size_t)n_groups + (size_t)g) * 64;
            for (int c = 0; c < 8; c++)
                for (int j = 0; j < 8; j++)
                    dst[c * 8 + j] = src[j * 8 + c];
        }
    return REF_ERR_NONE;
}

enum ref_err ref_unpack_scales(const uint16_t *packed, int n_groups, int N, uint16_t *s)
{
    enum ref_err e = check_groups(__func__, n_groups, N);
    if (e)
        return e;
    for (int g = 0; g < n_groups; g++)
        for (int n = 0; n < N; n++)
            s[(size_t)g * (size_t)N + (size_t)n] = packed[scale_pos(n_groups, g, n)];
    return REF_ERR_NONE;
}

/* Byte and shift of z[g][n] in DESIGN 4.3: word c = n%8 nibble j = (n%64)/8 of row (nt, g). */
static inline size_t zero_pos(int n_groups, int g, int n, int *shift)
{
    int nt = n / 64, j = (n % 64) / 8, c = n % 8;
    size_t word = ((size_t)nt * (size_t)n_groups + (size_t)g) * 8 + (size_t)c;
    *shift = (j % 2) * 4;
    return word * 4 + (size_t)(j / 2);
}

enum ref_err ref_pack_zeros(const uint8_t *z, int n_groups, int N, uint8_t *out)
{
    enum ref_err e = check_groups(__func__, n_groups, N);
    if (e)
        return e;
    unsigned all = 0;
    /* row (nt, g): word c, nibble j <- column j*8 + c */
    for (int g = 0; g < n_groups; g++)
        for (int nt = 0; nt < N / 64; nt++) {
            const uint8_t *src = z + (size_t)g * (size_t)N + (size_t)nt * 64;
            uint8_t *dst = out + ((size_t)nt * (size_t)n_groups + (size_t)g) * 32;
            for (int c = 0; c < 8; c++) {
                uint32_t word = 0;
                for (int j = 0; j < 8; j++) {
                    all |= src[j * 8 + c];
                    word |= (uint32_t)src[j * 8 + c] << (4 * j);
                }
                st_le32(dst + 4 * c, word);
            }
        }
    if (all > 15) {
        report_nibble_range(__func__, "zero z", z, (size_t)n_groups, (size_t)N);
        return REF_ERR_RANGE;
    }
    return REF_ERR_NONE;
}

enum ref_err ref_unpack_zeros(const uint8_t *packed, int n_groups, int N, uint8_t *z)
{
    enum ref_err e = check_groups(__func__, n_groups, N);
    if (e)
        return e;
    for (int g = 0; g < n_groups; g++)
        for (int n = 0; n < N; n++) {
            int shift;
            size_t pos = zero_pos(n_groups, g, n, &shift);
            z[(size_t)g * (size_t)N + (size_t)n] = (packed[pos] >> shift) & 0xfu;
        }
    return REF_ERR_NONE;
}

enum ref_err ref_dequant_w4_strided(const uint8_t *qweight, const uint8_t *qzeros,
                                    const uint16_t *scales, int K, int N, int G, float *w,
                                    size_t ldw)
{
    if (!ref_w4_shape_ok(K, N, G) || ldw < (size_t)N) {
        qs_log_error(__func__, "shape [K=%d, N=%d] group_size %d, row stride %zu: need K %% 16 "
                     "== 0, N %% 64 == 0, G %% 16 == 0, K %% G == 0, stride >= N", K, N, G, ldw);
        return REF_ERR_SHAPE;
    }
    const int n_groups = K / G;
    const uint8_t *p = qweight;
    float tab[64][16]; /* tile column x -> (q - z) * s for q = 0..15 */
    for (int nt = 0; nt < N / 64; nt++)
        for (int g = 0; g < n_groups; g++) {
            /* one fp16 -> fp32 conversion per (group, column): 4.2 position c*8 + j and 4.3
             * word c nibble j both hold tile column x = j*8 + c */
            const uint16_t *sp = scales + ((size_t)nt * (size_t)n_groups + (size_t)g) * 64;
            const uint8_t *zp = qzeros + ((size_t)nt * (size_t)n_groups + (size_t)g) * 32;
            for (int c = 0; c < 8; c++) {
                uint32_t zw = ld_le32(zp + 4 * c);
                for (int j = 0; j < 8; j++) {
                    float s = ref_f16_to_f32(sp[c * 8 + j]);
                    int z = (int)((zw >> (4 * j)) & 0xfu);
                    float *tx = tab[j * 8 + c];
                    for (int q = 0; q < 16; q++)
                        tx[q] = (float)(q - z) * s;
                }
            }
            /* tiles of this group, in storage order (p is already at tile (g*G/16, nt)) */
            for (int kt = g * (G / 16); kt < (g + 1) * (G / 16); kt++) {
                float *tile = w + (size_t)kt * 16 * ldw + (size_t)nt * 64;
                for (int t = 0; t < 32; t++) {
                    const int c = t / 4;
                    float *o0 = tile + (size_t)((t % 4) * 2) * ldw + (size_t)c;
                    float *o1 = o0 + ldw, *o8 = o0 + 8 * ldw, *o9 = o0 + 9 * ldw;
                    for (int wd = 0; wd < 4; wd++, p += 4) {
                        const uint32_t word = ld_le32(p);
                        const int x = 16 * wd, y = x + 8;
                        const float *tx = tab[x + c], *ty = tab[y + c];
                        o0[x] = tx[word & 0xfu];
                        o8[x] = tx[(word >> 4) & 0xfu];
                        o0[y] = ty[(word >> 8) & 0xfu];
                        o8[y] = ty[(word >> 12) & 0xfu];
                        o1[x] = tx[(word >> 16) & 0xfu];
                        o9[x] = tx[(word >> 20) & 0xfu];
                        o1[y] = ty[(word >> 24) & 0xfu];
                        o9[y] = ty[word >> 28];
                    }
                }
            }
        }
    return REF_ERR_NONE;
}

enum ref_err ref_dequant_w4(const uint8_t *qweight, const uint8_t *qzeros,
                            const uint16_t *scales, int K, int N, int G, float *w)
{
    if (!ref_w4_shape_ok(K, N, G)) {
        qs_log_error(__func__, "shape [K=%d, N=%d] group_size %d: need K %% 16 == 0, "
                     "N %% 64 == 0, G %% 16 == 0, K %% G == 0", K, N, G);
        return REF_ERR_SHAPE;
    }
    return ref_dequant_w4_strided(qweight, qzeros, scales, K, N, G, w, (size_t)N);
}

/*
 * test_ref.c - kernels/ref.h: the packed int4 layout, fp16 conversion, and every plain-C
 * reference op against straightforward math written here, on fresh random inputs.
 *
 * Independence: nibble positions are derived here from the PTX ISA B-fragment table of
 * mma.m16n8k16 (not from DESIGN's closed form that ref_pack.c uses); fp16 conversion is compared
 * with the compiler's _Float16 (libgcc __truncsfhf2 / __extendhfsf2) where available, with known
 * bit patterns, and with round-half-even at every midpoint between adjacent halves.
 * Run: ./build/test_ref
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#include "qs_log.h"
#include "ref.h"
#include "t.h"

// --- helpers ---------------------------------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void)
{
    /* xorshift64*: fixed seed, reproducible */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static float rnd_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd_u32() >> 8) / 16777216.0f;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// --- fp16 ----------------------------------------------------------------------------------------

static void test_f16_known(void)
{
    static const struct {
        float f;
        uint16_t h;
    } known[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0.5f, 0x3800},
        {65504.0f, 0x7bff},          /* largest half */
        {65519.99f, 0x7bff},         /* just below the overflow midpoint */
        {65520.0f, 0x7c00},          /* midpoint 65504/65536: ties to even = inf */
        {1e10f, 0x7c00},
        {-1e10f, 0xfc00},
        {0.1f, 0x2e66},
        {1.0f + 1.0f / 2048.0f, 0x3c00},        /* tie, 0x3c00 is even */
        {1.0f + 3.0f / 2048.0f, 0x3c02},        /* tie, 0x3c01 odd -> 0x3c02 */
        {1.0f + 1.0f / 2048.0f + 1e-7f, 0x3c01}, /* just above the tie */
        {6.103515625e-05f, 0x0400},  /* 2^-14, smallest normal */
        {5.9604644775390625e-08f, 0x0001},   /* 2^-24, smallest subnormal */
        {2.98023223876953125e-08f, 0x0000},  /* 2^-25: tie with 0 goes to 0 */
        {2.9802326e-08f, 0x0001},    /* just above 2^-25 */
        {8.940696716308594e-08f, 0x0002},    /* 3 * 2^-25: tie between 1 and 2 -> 2 */
        {6.097555160522461e-05f, 0x03ff},    /* largest subnormal 1023 * 2^-24 */
        {6.1005353927612305e-05f, 0x0400},   /* 1023.5 * 2^-24: tie -> 0x400 (even) */
        {-5.9604644775390625e-08f, 0x8001},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        uint16_t got = ref_f32_to_f16(known[i].f);
        CHECK_MSG(got == known[i].h, "f32_to_f16(%.10g) = 0x%04x, want 0x%04x", known[i].f, got,
                  known[i].h);
    }
    CHECK(ref_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(ref_f32_to_f16(-INFINITY) == 0xfc00);
    uint16_t hn = ref_f32_to_f16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    CHECK((ref_f32_to_f16(f32_of(0x7f800001u)) & 0x3ff) != 0); /* low-payload NaN stays NaN */
    CHECK(isinf(ref_f16_to_f32(0x7c00)) && ref_f16_to_f32(0x7c00) > 0);
    CHECK(isnan(ref_f16_to_f32(0x7e00)));
    CHECK(ref_f16_to_f32(0x0001) == 5.9604644775390625e-08f);
    CHECK(ref_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(bits_of(ref_f16_to_f32(0x8000)) == 0x80000000u);

    CHECK(ref_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(ref_bf16_to_f32(0xc040) == -3.0f);
    CHECK(ref_bf16_to_f32(0x4049) == 3.140625f);
    CHECK(isinf(ref_bf16_to_f32(0x7f80)));
    CHECK(ref_bf16_to_f32(0x0001) == f32_of(0x00010000u));
}

static void test_f16_exhaustive(void)
{
    int bad_rt = 0, bad_mid = 0, bad_cc = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ref_f16_to_f32((uint16_t)h);
        if (ref_f32_to_f16(f) != h && bad_rt++ < 5)
            fprintf(stderr, "round trip 0x%04x -> %g -> 0x%04x\n", h, f, ref_f32_to_f16(f));
#ifdef __FLT16_MAX__
        _Float16 hh;
        uint16_t hu = (uint16_t)h;
        memcpy(&hh, &hu, 2);
        if (!isnan(f) && bits_of(f) != bits_of((float)hh) && bad_cc++ < 5)
            fprintf(stderr, "f16_to_f32(0x%04x) = %g, compiler says %g\n", h, f, (float)hh);
#endif
        /* midpoints to the next half up (same sign): ties to even, +-1 ulp of fp32 decides */
        uint32_t mag = h & 0x7fff;
        if (mag >= 0x7bff)
            continue;
        float lo = ref_f16_to_f32((uint16_t)h), hi = ref_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)lo + (double)hi) / 2); /* exact: 12 significant bits */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        float below = nextafterf(mid, lo), above = nextafterf(mid, hi);
        if ((ref_f32_to_f16(mid) != even || ref_f32_to_f16(below) != h ||
             ref_f32_to_f16(above) != h + 1) &&
            bad_mid++ < 5)
            fprintf(stderr, "midpoint after 0x%04x: got 0x%04x 0x%04x 0x%04x\n", h,
                    ref_f32_to_f16(below), ref_f32_to_f16(mid), ref_f32_to_f16(above));
    }
    CHECK_EQ_INT(bad_rt, 0);
    CHECK_EQ_INT(bad_mid, 0);
    CHECK_EQ_INT(bad_cc, 0);

#ifdef __FLT16_MAX__
    /* random fp32 bit patterns (all exponents) vs the compiler's conversion */
    int bad = 0;
    for (int i = 0; i < 2000000; i++) {
        float f = f32_of(rnd_u32());
        if (isnan(f))
            continue;
        _Float16 hh = (_Float16)f;
        uint16_t want;
        memcpy(&want, &hh, 2);
        if (ref_f32_to_f16(f) != want && bad++ < 5)
            fprintf(stderr, "f32_to_f16(%a) = 0x%04x, compiler 0x%04x\n", f, ref_f32_to_f16(f),
                    want);
    }
    CHECK_EQ_INT(bad, 0);
#endif
}

// --- packed layout -------------------------------------------------------------------------------

/*
 * Expected position of q[k][n] derived from the PTX ISA B-fragment of mma.m16n8k16 (.f16):
 * lane l holds b0..b3 of an n8 sub-tile with row = (l%4)*2 + (e%2) + (e/2)*8, col = l/4.
 * DESIGN 4.1 word w of lane l serves sub-tiles 2w (low byte of each half) and 2w+1 (word >> 8);
 * (word & 0x000F000F) gives {b0, b1}, (word & 0x00F000F0) gives {b2, b3}. So the nibble of each
 * (sub-tile-in-word, fragment element) is this table:
 */
static const int NIBBLE_OF[2][4] = {
    /* sub 0 (2w):   b0 b1 b2 b3 */ {0, 4, 1, 5},
    /* sub 1 (2w+1): b0 b1 b2 b3 */ {2, 6, 3, 7},
};

static void expected_pos(int K, int k, int n, size_t *byte, int *shift)
{
    int kt = k / 16, nt = n / 64, sub8 = (n % 64) / 8;
    int rk = k % 16, cn = n % 8;
    /* search the fragment table for the lane/element owning (rk, cn) */
    for (int lane = 0; lane < 32; lane++)
        for (int e = 0; e < 4; e++) {
            int row = (lane % 4) * 2 + (e % 2) + (e / 2) * 8;
            int col = lane / 4;
            if (row != rk || col != cn)
                continue;
            int w = sub8 / 2, nib = NIBBLE_OF[sub8 % 2][e];
            size_t tile_base = ((size_t)nt * (size_t)(K / 16) + (size_t)kt) * 512;
            *byte = tile_base + (size_t)lane * 16 + (size_t)w * 4 + (size_t)(nib / 2);
            *shift = (nib % 2) * 4;
            return;
        }
    *byte = (size_t)-1;
    *shift = -1;
}

static void test_pack_shape(int K, int N, int G)
{
    size_t kn = (size_t)K * N;
    int ng = K / G;
    uint8_t *q = malloc(kn), *q2 = malloc(kn), *packed = malloc(kn / 2);
    uint8_t *z = malloc((size_t)ng * N), *z2 = malloc((size_t)ng * N);
    uint8_t *zp = malloc((size_t)ng * N / 2);
    uint16_t *s = malloc((size_t)ng * N * 2), *s2 = malloc((size_t)ng * N * 2);
    uint16_t *sp = malloc((size_t)ng * N * 2);
    float *w = malloc(kn * sizeof(float));

    for (size_t i = 0; i < kn; i++)
        q[i] = rnd_u32() & 15;
    for (size_t i = 0; i < (size_t)ng * N; i++) {
        z[i] = rnd_u32() & 15;
        s[i] = ref_f32_to_f16(rnd_uniform(-0.05f, 0.05f));
    }
    memset(packed, 0xa5, kn / 2);
    CHECK_EQ_INT(ref_pack_w4(q, K, N, packed), REF_ERR_NONE);
    memset(q2, 0xff, kn);
    CHECK_EQ_INT(ref_unpack_w4(packed, K, N, q2), REF_ERR_NONE);
    CHECK_MSG(memcmp(q, q2, kn) == 0, "qweight round trip K=%d N=%d", K, N);

    /* every (k, n): independent position == ref_w4_locate, and the nibble there == q[k][n] */
    int bad_pos = 0, bad_val = 0;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            size_t b1, b2;
            int s1, s2_;
            expected_pos(K, k, n, &b1, &s1);
            ref_w4_locate(K, N, k, n, &b2, &s2_);
            if ((b1 != b2 || s1 != s2_) && bad_pos++ < 3)
                fprintf(stderr, "K=%d N=%d q[%d][%d]: PTX says byte %zu shift %d, locate %zu %d\n",
                        K, N, k, n, b1, s1, b2, s2_);
            if (b1 < kn / 2 && ((packed[b1] >> s1) & 15) != q[(size_t)k * N + n])
                bad_val++;
        }
    CHECK_EQ_INT(bad_pos, 0);
    CHECK_EQ_INT(bad_val, 0);

    /* scales: lane t's 16-byte load at (t/4)*8 of row (nt, g) gives column j*8 + t/4, j=0..7 */
    CHECK_EQ_INT(ref_pack_scales(s, ng, N, sp), REF_ERR_NONE);
    int bad_s = 0;
    for (int nt = 0; nt < N / 64; nt++)
        for (int g = 0; g < ng; g++)
            for (int t = 0; t < 32; t++)
                for (int j = 0; j < 8; j++) {
                    uint16_t got = sp[((size_t)nt * ng + g) * 64 + (size_t)(t / 4) * 8 + j];
                    if (got != s[(size_t)g * N + nt * 64 + j * 8 + t / 4])
                        bad_s++;
                }
    CHECK_EQ_INT(bad_s, 0);
    CHECK_EQ_INT(ref_unpack_scales(sp, ng, N, s2), REF_ERR_NONE);
    CHECK(memcmp(s, s2, (size_t)ng * N * 2) == 0);

    /* zeros: little-endian word c of row (nt, g), nibble j = z[g][nt*64 + j*8 + c] */
    CHECK_EQ_INT(ref_pack_zeros(z, ng, N, zp), REF_ERR_NONE);
    int bad_z = 0;
    for (int nt = 0; nt < N / 64; nt++)
        for (int g = 0; g < ng; g++)
            for (int c = 0; c < 8; c++) {
                const uint8_t *wb = zp + (((size_t)nt * ng + g) * 8 + c) * 4;
                uint32_t word = wb[0] | wb[1] << 8 | wb[2] << 16 | (uint32_t)wb[3] << 24;
                for (int j = 0; j < 8; j++)
                    if (((word >> (4 * j)) & 15) != z[(size_t)g * N + nt * 64 + j * 8 + c])
                        bad_z++;
            }
    CHECK_EQ_INT(bad_z, 0);
    CHECK_EQ_INT(ref_unpack_zeros(zp, ng, N, z2), REF_ERR_NONE);
    CHECK(memcmp(z, z2, (size_t)ng * N) == 0);

    /* dequant: exact (q - z) * s */
    CHECK_EQ_INT(ref_dequant_w4(packed, zp, sp, K, N, G, w), REF_ERR_NONE);
    int bad_w = 0;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            size_t gi = (size_t)(k / G) * N + n;
#ifdef __FLT16_MAX__
            _Float16 sh;
            memcpy(&sh, &s[gi], 2);
            float sf = (float)sh;
#else
            float sf = ref_f16_to_f32(s[gi]);
#endif
            float want = (float)((int)q[(size_t)k * N + n] - (int)z[gi]) * sf;
            if (bits_of(want) != bits_of(w[(size_t)k * N + n]) && bad_w++ < 3)
                fprintf(stderr, "dequant K=%d N=%d G=%d [%d][%d]: %g vs %g\n", K, N, G, k, n,
                        w[(size_t)k * N + n], want);
        }
    CHECK_EQ_INT(bad_w, 0);

    free(q), free(q2), free(packed), free(z), free(z2), free(zp), free(s), free(s2), free(sp);
    free(w);
}

// --- fast packers vs per-element definitions ---------------------------------------------------

/*
 * The straightforward per-element forms of DESIGN 4.1-4.3 (what ref_pack.c did before it walked
 * the packed order with row pointers and a per-group table): every packed nibble's (k, n) from
 * the closed form, every dequantized element with its own zero/scale lookup and fp16 -> fp32
 * conversion. The fast versions must produce the same bytes and the same fp32 bits.
 */
static void naive_coord(int kt, int nt, int t, int w, int i, int *k, int *n)
{
    int a = i % 4, b = i / 4, j = 2 * w + a / 2;
    *k = kt * 16 + (t % 4) * 2 + (a % 2) * 8 + b;
    *n = nt * 64 + j * 8 + t / 4;
}

static void pack_w4_naive(const uint8_t *q, int K, int N, uint8_t *qweight)
{
    uint8_t *p = qweight;
    for (int nt = 0; nt < N / 64; nt++)
        for (int kt = 0; kt < K / 16; kt++)
            for (int t = 0; t < 32; t++)
                for (int w = 0; w < 4; w++) {
                    uint32_t word = 0;
                    for (int i = 0; i < 8; i++) {
                        int k, n;
                        naive_coord(kt, nt, t, w, i, &k, &n);
                        word |= (uint32_t)q[(size_t)k * N + n] << (4 * i);
                    }
                    for (int b = 0; b < 4; b++)
                        *p++ = (uint8_t)(word >> (8 * b));
                }
}

static size_t naive_scale_pos(int ng, int g, int n)
{
    int nt = n / 64, j = (n % 64) / 8, c = n % 8;
    return ((size_t)nt * ng + g) * 64 + (size_t)(c * 8 + j);
}

static size_t naive_zero_pos(int ng, int g, int n, int *shift)
{
    int nt = n / 64, j = (n % 64) / 8, c = n % 8;
    *shift = (j % 2) * 4;
    return (((size_t)nt * ng + g) * 8 + (size_t)c) * 4 + (size_t)(j / 2);
}

static void pack_scales_naive(const uint16_t *s, int ng, int N, uint16_t *out)
{
    for (int g = 0; g < ng; g++)
        for (int n = 0; n < N; n++)
            out[naive_scale_pos(ng, g, n)] = s[(size_t)g * N + n];
}

static void pack_zeros_naive(const uint8_t *z, int ng, int N, uint8_t *out)
{
    memset(out, 0, (size_t)ng * N / 2);
    for (int g = 0; g < ng; g++)
        for (int n = 0; n < N; n++) {
            int sh;
            size_t pos = naive_zero_pos(ng, g, n, &sh);
            out[pos] |= (uint8_t)(z[(size_t)g * N + n] << sh);
        }
}

static void dequant_w4_naive(const uint8_t *qweight, const uint8_t *qzeros, const uint16_t *scales,
                             int K, int N, int G, float *w)
{
    int ng = K / G;
    const uint8_t *p = qweight;
    for (int nt = 0; nt < N / 64; nt++)
        for (int kt = 0; kt < K / 16; kt++)
            for (int t = 0; t < 32; t++)
                for (int wd = 0; wd < 4; wd++, p += 4) {
                    uint32_t word = p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
                    for (int i = 0; i < 8; i++) {
                        int k, n, sh;
                        naive_coord(kt, nt, t, wd, i, &k, &n);
                        int g = k / G;
                        size_t zp = naive_zero_pos(ng, g, n, &sh);
                        int qv = (int)((word >> (4 * i)) & 15u), zv = (qzeros[zp] >> sh) & 15;
                        float s = ref_f16_to_f32(scales[naive_scale_pos(ng, g, n)]);
                        w[(size_t)k * N + n] = (float)(qv - zv) * s;
                    }
                }
}

/* Random (K, N, G): codes, zeros and ANY fp16 scale bits (subnormals, +-0, inf, NaN included,
 * so the per-group table must carry every special value exactly as the per-element form does). */
static void test_fast_vs_naive(int K, int N, int G)
{
    size_t kn = (size_t)K * N, gn = (size_t)(K / G) * N;
    int ng = K / G;
    uint8_t *q = malloc(kn), *z = malloc(gn), *p1 = malloc(kn / 2), *p2 = malloc(kn / 2);
    uint8_t *z1 = malloc(gn / 2), *z2 = malloc(gn / 2);
    uint16_t *s = malloc(gn * 2), *s1 = malloc(gn * 2), *s2 = malloc(gn * 2);
    const size_t ldw = (size_t)N + 64 + (rnd_u32() % 3) * 16; /* strided: N plus a margin */
    float *w1 = malloc(kn * sizeof(float)), *w2 = malloc(kn * sizeof(float));
    float *w3 = malloc((size_t)K * ldw * sizeof(float));
    for (size_t i = 0; i < kn; i++)
        q[i] = rnd_u32() & 15;
    for (size_t i = 0; i < gn; i++) {
        z[i] = rnd_u32() & 15;
        uint32_t r = rnd_u32();
        s[i] = (r & 7) == 0 ? (uint16_t)(r >> 16) /* any bits */
                            : ref_f32_to_f16(rnd_uniform(-0.05f, 0.05f));
    }
    s[0] = 0x7e01;               /* NaN with a payload */
    s[gn - 1] = 0x0001;          /* smallest subnormal */
    s[gn / 2] = 0xfc00;          /* -inf: (q - z) = 0 gives NaN in both forms */
    memset(p1, 0x5a, kn / 2);
    memset(p2, 0xa5, kn / 2);
    CHECK_EQ_INT(ref_pack_w4(q, K, N, p1), REF_ERR_NONE);
    pack_w4_naive(q, K, N, p2);
    CHECK_MSG(memcmp(p1, p2, kn / 2) == 0, "pack_w4 fast != naive K=%d N=%d", K, N);
    memset(s1, 0x5a, gn * 2);
    CHECK_EQ_INT(ref_pack_scales(s, ng, N, s1), REF_ERR_NONE);
    pack_scales_naive(s, ng, N, s2);
    CHECK_MSG(memcmp(s1, s2, gn * 2) == 0, "pack_scales fast != naive ng=%d N=%d", ng, N);
    memset(z1, 0x5a, gn / 2);
    CHECK_EQ_INT(ref_pack_zeros(z, ng, N, z1), REF_ERR_NONE);
    pack_zeros_naive(z, ng, N, z2);
    CHECK_MSG(memcmp(z1, z2, gn / 2) == 0, "pack_zeros fast != naive ng=%d N=%d", ng, N);

    memset(w1, 0x5a, kn * sizeof(float));
    memset(w2, 0xa5, kn * sizeof(float));
    CHECK_EQ_INT(ref_dequant_w4(p2, z2, s2, K, N, G, w1), REF_ERR_NONE);
    dequant_w4_naive(p2, z2, s2, K, N, G, w2);
    CHECK_MSG(memcmp(w1, w2, kn * sizeof(float)) == 0, "dequant fast != naive K=%d N=%d G=%d",
              K, N, G);
    /* strided output: same bits in the first N floats of each row, the margin untouched */
    memset(w3, 0x77, (size_t)K * ldw * sizeof(float));
    CHECK_EQ_INT(ref_dequant_w4_strided(p2, z2, s2, K, N, G, w3, ldw), REF_ERR_NONE);
    int bad_row = 0, bad_pad = 0;
    for (int k = 0; k < K; k++) {
        if (memcmp(w3 + (size_t)k * ldw, w2 + (size_t)k * N, (size_t)N * sizeof(float)))
            bad_row++;
        for (size_t n = (size_t)N; n < ldw; n++)
            if (bits_of(w3[(size_t)k * ldw + n]) != 0x77777777u)
                bad_pad++;
    }
    CHECK_MSG(bad_row == 0 && bad_pad == 0, "strided dequant K=%d N=%d G=%d ldw=%zu: %d rows "
              "differ, %d margin floats written", K, N, G, ldw, bad_row, bad_pad);
    free(q), free(z), free(p1), free(p2), free(z1), free(z2), free(s), free(s1), free(s2);
    free(w1), free(w2), free(w3);
}

static void test_fast_packers(void)
{
    static const int Ks[] = {16, 64, 128, 256, 384, 1024};
    static const int Ns[] = {64, 128, 192, 448, 1024};
    for (size_t a = 0; a < sizeof(Ks) / sizeof(Ks[0]); a++)
        for (size_t b = 0; b < sizeof(Ns) / sizeof(Ns[0]); b++) {
            int K = Ks[a], N = Ns[b];
            /* G = 16, 32, 64, 128 where they divide K, and G = K (one group) */
            static const int Gs[] = {16, 32, 64, 128};
            for (size_t c = 0; c < sizeof(Gs) / sizeof(Gs[0]); c++)
                if (K % Gs[c] == 0 && Gs[c] < K && (c == 2 || c == 3 || (a + b + c) % 3 == 0))
                    test_fast_vs_naive(K, N, Gs[c]);
            test_fast_vs_naive(K, N, K);
        }
    /* random shapes */
    for (int r = 0; r < 12; r++) {
        int G = 16 << (rnd_u32() % 4);
        int K = G * (1 + (int)(rnd_u32() % 12)), N = 64 * (1 + (int)(rnd_u32() % 10));
        test_fast_vs_naive(K, N, rnd_u32() % 5 == 0 ? K : G);
    }
    /* errors of the fast paths: the first offending element in row-major order is named */
    uint8_t q[32 * 128], out[32 * 128];
    memset(q, 3, sizeof(q));
    q[20 * 128 + 100] = 17;
    q[31 * 128 + 5] = 200;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(ref_pack_w4(q, 32, 128, out), REF_ERR_RANGE);
    CHECK(strstr(qs_log_last(), "q[20][100] = 17") != NULL);
    CHECK_EQ_INT(ref_pack_zeros(q, 32, 128, out), REF_ERR_RANGE);
    CHECK(strstr(qs_log_last(), "z[20][100] = 17") != NULL);
    float wf[16 * 64];
    uint16_t sc[64] = {0};
    CHECK_EQ_INT(ref_dequant_w4_strided(out, out, sc, 16, 64, 16, wf, 63), REF_ERR_SHAPE);
    qs_log_set_quiet(false);
}

static void test_pack_errors(void)
{
    uint8_t q[16 * 64] = {0}, out[16 * 64];
    uint16_t s16[64 * 2];
    qs_log_set_quiet(true);
    CHECK_EQ_INT(ref_pack_w4(q, 8, 64, out), REF_ERR_SHAPE);
    CHECK(strstr(qs_log_last(), "K=8") != NULL);
    CHECK_EQ_INT(ref_pack_w4(q, 16, 32, out), REF_ERR_SHAPE);
    CHECK_EQ_INT(ref_unpack_w4(out, 0, 64, q), REF_ERR_SHAPE);
    q[5 * 64 + 7] = 16;
    CHECK_EQ_INT(ref_pack_w4(q, 16, 64, out), REF_ERR_RANGE);
    CHECK(strstr(qs_log_last(), "q[5][7] = 16") != NULL);
    CHECK_EQ_INT(ref_pack_zeros(q, 16, 64, out), REF_ERR_RANGE);
    CHECK_EQ_INT(ref_pack_scales(s16, 2, 96, s16), REF_ERR_SHAPE);
    CHECK_EQ_INT(ref_dequant_w4(out, out, s16, 16, 64, 24, (float *)s16), REF_ERR_SHAPE);
    CHECK_EQ_INT(ref_dequant_w4(out, out, s16, 48, 64, 32, (float *)s16), REF_ERR_SHAPE);
    qs_log_set_quiet(false);
    CHECK(ref_w4_shape_ok(4096, 11008 / 2 + 64 - (11008 / 2) % 64, 128));
    CHECK(!ref_w4_shape_ok(4096, 4100, 128));
    CHECK(strcmp(ref_err_str(REF_ERR_SHAPE), ref_err_str(REF_ERR_RANGE)) != 0);
}

// --- ops vs straightforward math ---------------------------------------------------------------

static void fill_uniform(float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rnd_uniform(lo, hi);
}

/* max over i of |got - want| / (atol + rtol * scale_i); <= 1 passes. */
static double worst_ratio(const float *got, const double *want, const double *mag, size_t n,
                          double atol, double rtol, size_t *at)
{
    double worst = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)got[i] - want[i]) / (atol + rtol * (mag ? mag[i] : fabs(want[i])));
        if (!(r <= worst)) { /* NaN counts as worst */
            worst = isnan(r) ? INFINITY : r;
            *at = i;
        }
    }
    return worst;
}

static double norm2(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

static void test_w4a16_linear(int M, int K, int N, int G, struct ref_pool **pools, int n_pools)
{
    int ng = K / G;
    size_t kn = (size_t)K * N;
    uint8_t *q = malloc(kn), *qw = malloc(kn / 2), *z = malloc((size_t)ng * N);
    uint8_t *zp = malloc((size_t)ng * N / 2);
    uint16_t *s = malloc((size_t)ng * N * 2), *sp = malloc((size_t)ng * N * 2);
    float *x = malloc((size_t)M * K * 4), *bias = malloc((size_t)N * 4);
    float *y = malloc((size_t)M * N * 4), *y2 = malloc((size_t)M * N * 4);
    double *want = malloc((size_t)M * N * 8), *mag = malloc((size_t)M * N * 8);

    for (size_t i = 0; i < kn; i++)
        q[i] = rnd_u32() & 15;
    for (size_t i = 0; i < (size_t)ng * N; i++) {
        z[i] = rnd_u32() & 15;
        s[i] = ref_f32_to_f16(rnd_uniform(0.001f, 0.03f) * ((rnd_u32() & 1) ? 1 : -1));
    }
    fill_uniform(x, (size_t)M * K, -1, 1);
    fill_uniform(bias, N, -0.5f, 0.5f);
    CHECK_EQ_INT(ref_pack_w4(q, K, N, qw), REF_ERR_NONE);
    CHECK_EQ_INT(ref_pack_zeros(z, ng, N, zp), REF_ERR_NONE);
    CHECK_EQ_INT(ref_pack_scales(s, ng, N, sp), REF_ERR_NONE);

    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = bias[n], ab = fabs(bias[n]);
            for (int k = 0; k < K; k++) {
                size_t gi = (size_t)(k / G) * N + n;
                double w = ((int)q[(size_t)k * N + n] - (int)z[gi]) * (double)ref_f16_to_f32(s[gi]);
                acc += x[(size_t)m * K + k] * w;
                ab += fabs(x[(size_t)m * K + k] * w);
            }
            want[(size_t)m * N + n] = acc;
            mag[(size_t)m * N + n] = ab;
        }

    for (int pi = 0; pi < n_pools; pi++) {
        float *out = pi == 0 ? y : y2;
        for (size_t i = 0; i < (size_t)M * N; i++)
            out[i] = NAN; /* poison */
        CHECK_EQ_INT(ref_w4a16_linear(x, qw, zp, sp, bias, M, K, N, G, out, pools[pi]),
                     REF_ERR_NONE);
        if (pi == 0) {
            size_t at;
            double r = worst_ratio(y, want, mag, (size_t)M * N, 1e-6, 1e-6, &at);
            CHECK_MSG(r <= 1, "w4a16 M=%d K=%d N=%d G=%d: worst at %zu: %g vs %g", M, K, N, G,
                      at, y[at], want[at]);
            CHECK(norm2(y, (size_t)M * N) > 0.1);
        } else {
            CHECK_MSG(memcmp(y, y2, (size_t)M * N * 4) == 0,
                      "w4a16 differs with %d threads", ref_pool_threads(pools[pi]));
        }
    }
    /* documented property: bit-identical to a naive fp32 k loop over ref_dequant_w4 */
    {
        float *W = malloc(kn * sizeof(float));
        CHECK_EQ_INT(ref_dequant_w4(qw, zp, sp, K, N, G, W), REF_ERR_NONE);
        int bad = 0;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                float acc = 0.0f;
                for (int k = 0; k < K; k++)
                    acc += x[(size_t)m * K + k] * W[(size_t)k * N + n];
                acc += bias[n];
                bad += bits_of(acc) != bits_of(y[(size_t)m * N + n]);
            }
        CHECK_MSG(bad == 0, "w4a16 M=%d K=%d N=%d: %d outputs differ from the naive loop", M, K,
                  N, bad);
        free(W);
    }
    /* without bias */
    CHECK_EQ_INT(ref_w4a16_linear(x, qw, zp, sp, NULL, M, K, N, G, y2, NULL), REF_ERR_NONE);
    for (size_t i = 0; i < (size_t)M * N; i++)
        want[i] -= bias[i % N];
    size_t at;
    CHECK(worst_ratio(y2, want, mag, (size_t)M * N, 1e-6, 1e-6, &at) <= 1);

    free(q), free(qw), free(z), free(zp), free(s), free(sp), free(x), free(bias), free(y);
    free(y2), free(want), free(mag);
}

static void test_linear_f16(int M, int K, int N, struct ref_pool *pool)
{
    uint16_t *W = malloc((size_t)N * K * 2);
    float *x = malloc((size_t)M * K * 4), *bias = malloc((size_t)N * 4);
    float *y = malloc((size_t)M * N * 4), *y1 = malloc((size_t)M * N * 4);
    float *Wf = malloc((size_t)N * K * 4), *y3 = malloc((size_t)M * N * 4);
    double *want = malloc((size_t)M * N * 8), *mag = malloc((size_t)M * N * 8);
    for (size_t i = 0; i < (size_t)N * K; i++) {
        W[i] = ref_f32_to_f16(rnd_uniform(-0.2f, 0.2f));
        Wf[i] = ref_f16_to_f32(W[i]);
    }
    fill_uniform(x, (size_t)M * K, -1, 1);
    fill_uniform(bias, N, -1, 1);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = bias[n], ab = fabs(bias[n]);
            for (int k = 0; k < K; k++) {
                double t = (double)x[(size_t)m * K + k] * ref_f16_to_f32(W[(size_t)n * K + k]);
                acc += t;
                ab += fabs(t);
            }
            want[(size_t)m * N + n] = acc;
            mag[(size_t)m * N + n] = ab;
        }
    ref_linear_f16(x, W, bias, M, K, N, y, pool);
    ref_linear_f16(x, W, bias, M, K, N, y1, NULL);
    ref_linear_f32(x, Wf, bias, M, K, N, y3);
    size_t at;
    double r = worst_ratio(y, want, mag, (size_t)M * N, 1e-6, 1e-6, &at);
    CHECK_MSG(r <= 1, "linear_f16 M=%d K=%d N=%d at %zu: %g vs %g", M, K, N, at, y[at], want[at]);
    CHECK(memcmp(y, y1, (size_t)M * N * 4) == 0);
    CHECK(worst_ratio(y3, want, mag, (size_t)M * N, 1e-6, 1e-6, &at) <= 1);
    CHECK(norm2(y, (size_t)M * N) > 0.1);
    free(W), free(x), free(bias), free(y), free(y1), free(Wf), free(y3), free(want), free(mag);
}

static void test_rmsnorm(void)
{
    enum { M = 5, H = 96 };
    float x[M * H], res[M * H], res0[M * H], w[H], out[M * H], out2[M * H];
    fill_uniform(x, M * H, -3, 3);
    fill_uniform(res, M * H, -2, 2);
    fill_uniform(w, H, 0.5f, 1.5f);
    memcpy(res0, res, sizeof(res));
    float eps = 0.05f; /* large enough that dropping or misplacing eps shows */
    ref_rmsnorm(out, res, x, w, M, H, eps);
    int bad = 0, bad_res = 0;
    for (int m = 0; m < M; m++) {
        double h[H], ss = 0;
        for (int i = 0; i < H; i++) {
            h[i] = (double)res0[m * H + i] + x[m * H + i];
            ss += h[i] * h[i];
        }
        double r = 1 / sqrt(ss / H + eps);
        for (int i = 0; i < H; i++) {
            if (fabs(res[m * H + i] - (float)h[i]) > 0)
                bad_res++;
            if (fabs(out[m * H + i] - w[i] * h[i] * r) > 1e-6 + 1e-5 * fabs(w[i] * h[i] * r))
                bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_res, 0);
    /* x == NULL: normalise the residual as it is (no add), residual untouched */
    memcpy(res0, res, sizeof(res));
    ref_rmsnorm(out2, res, NULL, w, M, H, eps);
    CHECK(memcmp(res0, res, sizeof(res)) == 0);
    bad = 0;
    for (int m = 0; m < M; m++) {
        double ss = 0;
        for (int i = 0; i < H; i++)
            ss += (double)res0[m * H + i] * res0[m * H + i];
        for (int i = 0; i < H; i++) {
            double want = w[i] * res0[m * H + i] / sqrt(ss / H + eps);
            if (fabs(out2[m * H + i] - want) > 1e-6 + 1e-5 * fabs(want))
                bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* without residual, in place; tiny inputs so eps = 1e-5 dominates the mean square */
    fill_uniform(x, M * H, -3e-3f, 3e-3f);
    eps = 1e-5f;
    memcpy(out2, x, sizeof(x));
    ref_rmsnorm(out2, NULL, out2, w, M, H, eps);
    bad = 0;
    for (int m = 0; m < M; m++) {
        double ss = 0;
        for (int i = 0; i < H; i++)
            ss += (double)x[m * H + i] * x[m * H + i];
        double r = 1 / sqrt(ss / H + eps);
        for (int i = 0; i < H; i++) {
            double want = w[i] * x[m * H + i] * r;
            if (fabs(out2[m * H + i] - want) > 1e-6 + 1e-5 * fabs(want))
                bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

/* ref_layernorm against a one-pass long double LayerNorm written here (E[h^2] - E[h]^2 instead of
 * the two passes), on rows whose mean is far from zero (a variance about 0 instead of the mean
 * would show), in the three residual modes, with and without bias */
static void test_layernorm(void)
{
    enum { M = 4, H = 200 };
    float x[M * H], res[M * H], res0[M * H], w[H], b[H], out[M * H];
    fill_uniform(x, M * H, -3, 3);
    fill_uniform(res, M * H, 20, 26);
    fill_uniform(w, H, 0.5f, 1.5f);
    fill_uniform(b, H, -1, 1);
    const float eps = 0.05f;
    for (int mode = 0; mode < 4; mode++) {
        float *r = mode < 2 ? res : NULL;
        const float *xi = mode == 1 ? NULL : x;
        const float *bi = mode == 3 ? NULL : b;
        memcpy(res0, res, sizeof(res));
        ref_layernorm(out, r, xi, w, bi, M, H, eps);
        int bad = 0, bad_res = 0;
        for (int m = 0; m < M; m++) {
            long double h[H], s = 0, ss = 0;
            for (int i = 0; i < H; i++) {
                h[i] = mode < 2 ? (long double)res0[m * H + i] + (xi ? x[m * H + i] : 0.0f)
                                : x[m * H + i];
                s += h[i];
                ss += h[i] * h[i];
            }
            const long double mean = s / H, var = ss / H - mean * mean;
            for (int i = 0; i < H; i++) {
                const double want = (double)((h[i] - mean) / sqrtl(var + eps) * w[i] + (bi ? b[i] : 0));
                if (fabs(out[m * H + i] - want) > 1e-5 + 1e-5 * fabs(want))
                    bad++;
                if (mode < 2 && res[m * H + i] != (float)h[i])
                    bad_res++;
            }
        }
        CHECK_MSG(bad == 0, "layernorm mode %d: %d values off", mode, bad);
        CHECK_EQ_INT(bad_res, 0);
    }
}

#include "t_ref_act.h" /* test_gelu, test_gelu_tanh_softcap, test_alibi */

/* ref_head_rmsnorm against a double-precision norm of each head written here: q heads with wq,
 * k heads with wk, v and the row's padding untouched */
static void test_head_rmsnorm(void)
{
    enum { M = 3, NQ = 4, NKV = 2, HD = 48, STRIDE = (NQ + 2 * NKV) * HD + 5 };
    float x[M * STRIDE], x0[M * STRIDE], wq[HD], wk[HD];
    fill_uniform(x, M * STRIDE, -3, 3);
    fill_uniform(wq, HD, 0.5f, 1.5f);
    fill_uniform(wk, HD, 0.5f, 1.5f);
    memcpy(x0, x, sizeof(x));
    const float eps = 0.05f;
    ref_head_rmsnorm(x, M, NQ, NKV, HD, STRIDE, wq, wk, eps);
    int bad = 0, moved = 0;
    for (int m = 0; m < M; m++) {
        for (int h = 0; h < NQ + NKV; h++) {
            const float *v0 = x0 + m * STRIDE + h * HD, *v = x + m * STRIDE + h * HD;
            double ss = 0;
            for (int i = 0; i < HD; i++)
                ss += (double)v0[i] * v0[i];
            for (int i = 0; i < HD; i++) {
                double want = (h < NQ ? wq[i] : wk[i]) * v0[i] / sqrt(ss / HD + eps);
                if (fabs(v[i] - want) > 1e-6 + 1e-5 * fabs(want))
                    bad++;
            }
        }
        for (int i = (NQ + NKV) * HD; i < STRIDE; i++)
            moved += x[m * STRIDE + i] != x0[m * STRIDE + i];
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(moved, 0);
}

static void test_silu_softmax_argmax_embed(void)
{
    enum { M = 3, I = 50, V = 40, H = 16 };
    float gu[M * 2 * I], out[M * I];
    fill_uniform(gu, M * 2 * I, -6, 6);
    ref_silu_mul(out, gu, M, I);
    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int i = 0; i < I; i++) {
            double g = gu[m * 2 * I + i], u = gu[m * 2 * I + I + i];
            double want = g / (1 + exp(-g)) * u;
            if (fabs(out[m * I + i] - want) > 1e-6 + 1e-5 * fabs(want))
                bad++;
        }
    CHECK_EQ_INT(bad, 0);

    float sm[M * V], sm0[M * V];
    fill_uniform(sm, M * V, -20, 20);
    memcpy(sm0, sm, sizeof(sm));
    ref_softmax(sm, M, V);
    bad = 0;
    for (int m = 0; m < M; m++) {
        double sum = 0;
        for (int i = 0; i < V; i++)
            sum += exp((double)sm0[m * V + i]);
        for (int i = 0; i < V; i++) {
            double want = exp((double)sm0[m * V + i]) / sum;
            if (fabs(sm[m * V + i] - want) > 1e-7 + 1e-5 * want)
                bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);

    float lg[V];
    fill_uniform(lg, V, -5, 5);
    lg[V - 1] = 100;    /* padding id: must never win */
    lg[13] = 50;
    lg[7] = 50;         /* tie: lowest id wins */
    lg[3] = NAN;
    CHECK_EQ_INT(ref_argmax(lg, V, V - 2), 7);
    CHECK_EQ_INT(ref_argmax(lg, V, V), V - 1);
    int first5 = 0; /* n < vocab_size: only the first n entries count */
    for (int i = 1; i < 5; i++)
        if (i != 3 && lg[i] > lg[first5])
            first5 = i;
    CHECK_EQ_INT(ref_argmax(lg, 5, V), first5);
    CHECK_EQ_INT(ref_argmax(lg, V, 0), -1);

    /* embedding: rank 1 of 3 with V_r = 14 holds ids 14..27 */
    uint16_t table[14 * H];
    for (int i = 0; i < 14 * H; i++)
        table[i] = ref_f32_to_f16(rnd_uniform(-1, 1));
    int32_t toks[5] = {13, 14, 27, 28, 20};
    float e[5 * H];
    for (int i = 0; i < 5 * H; i++)
        e[i] = NAN;
    for (int pass = 0; pass < 2; pass++) { /* scale 1, and Gemma's sqrt(hidden) */
        const float sc = pass ? sqrtf(2304.0f) : 1.0f;
        ref_embed(e, table, toks, 5, 14, 14, H, sc);
        bad = 0;
        for (int m = 0; m < 5; m++)
            for (int i = 0; i < H; i++) {
                int in = toks[m] >= 14 && toks[m] < 28;
                float want = in ? ref_f16_to_f32(table[(toks[m] - 14) * H + i]) * sc : 0.0f;
                if (!(e[m * H + i] == want))
                    bad++;
            }
        CHECK_EQ_INT(bad, 0);
    }
}

/* ref_gather_cols: distinct values m*K + k under a fresh random permutation must come out as
 * m*K + perm[j]; the source is left alone. */
static void test_gather_cols(void)
{
    enum { M = 3, K = 200 };
    static float src[M * K], dst[M * K];
    int32_t perm[K];
    for (int j = 0; j < K; j++)
        perm[j] = j;
    for (int j = K - 1; j > 0; j--) {
        int r = (int)(rnd_uniform(0, 1) * (float)(j + 1));
        r = r > j ? j : r;
        int32_t t = perm[j];
        perm[j] = perm[r];
        perm[r] = t;
    }
    for (int i = 0; i < M * K; i++)
        src[i] = (float)i;
    ref_gather_cols(dst, src, perm, M, K);
    int bad = 0, moved = 0;
    for (int m = 0; m < M; m++)
        for (int j = 0; j < K; j++) {
            bad += dst[m * K + j] != (float)(m * K + perm[j]);
            moved += perm[j] != j;
        }
    for (int i = 0; i < M * K; i++)
        bad += src[i] != (float)i;
    CHECK_EQ_INT(bad, 0);
    CHECK(moved > K / 2);
}

static void test_rope(void)
{
    /* inv_freq: default vs double math */
    float inv[64], inv_l3[64], inv_lin[64];
    ref_rope_inv_freq(inv, 128, 500000.0, NULL);
    int bad = 0;
    for (int i = 0; i < 64; i++) {
        double want = 1 / pow(500000.0, 2.0 * i / 128);
        if (fabs(inv[i] - want) > 2e-6 * want)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);

    /* Llama 3.1 scaling, written out from Meta's apply_scaling description in double */
    struct qs_rope_scaling l3 = {QS_ROPE_LLAMA3, 8.0, 1.0, 4.0, 8192};
    ref_rope_inv_freq(inv_l3, 128, 500000.0, &l3);
    int n_low = 0, n_high = 0, n_mid = 0;
    bad = 0;
    for (int i = 0; i < 64; i++) {
        double f = 1 / pow(500000.0, 2.0 * i / 128), wl = 2 * M_PI / f, want;
        if (wl < 8192.0 / 4) {
            want = f, n_high++;
        } else if (wl > 8192.0 / 1) {
            want = f / 8, n_low++;
        } else {
            double sm = (8192.0 / wl - 1) / (4 - 1);
            want = (1 - sm) * f / 8 + sm * f, n_mid++;
        }
        if (fabs(inv_l3[i] - want) > 1e-5 * want)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(n_low > 0 && n_high > 0 && n_mid > 0); /* all three branches exercised */
    CHECK(inv_l3[0] == inv[0]);
    CHECK(fabs(inv_l3[63] - inv[63] / 8) <= 1e-6 * inv[63]);

    struct qs_rope_scaling lin = {QS_ROPE_LINEAR, 4.0, 0, 0, 0};
    ref_rope_inv_freq(inv_lin, 128, 10000.0, &lin);
    ref_rope_inv_freq(inv, 128, 10000.0, NULL);
    bad = 0;
    for (int i = 0; i < 64; i++)
        if (fabs(inv_lin[i] - inv[i] / 4) > 1e-7 * inv[i])
            bad++;
    CHECK_EQ_INT(bad, 0);

    /* application: rotate (x[i], x[i + hd/2]) by pos * inv_freq[i]; heads laid out with a
     * row stride wider than n_heads * hd (as inside the fused qkv row) */
    enum { M = 4, NH = 3, HD = 32, STRIDE = NH * HD + 40 };
    float x[M * STRIDE], x0[M * STRIDE], fr[HD / 2];
    int32_t pos[M] = {0, 1, 517, 4095};
    ref_rope_inv_freq(fr, HD, 10000.0, NULL);
    fill_uniform(x, M * STRIDE, -2, 2);
    memcpy(x0, x, sizeof(x));
    ref_rope(x, M, NH, HD, STRIDE, pos, fr);
    bad = 0;
    for (int m = 0; m < M; m++) {
        for (int j = NH * HD; j < STRIDE; j++)
            if (x[m * STRIDE + j] != x0[m * STRIDE + j])
                bad++; /* outside the heads: untouched */
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++) {
                double a = (double)((float)pos[m] * fr[i]); /* HF: fp32 angle */
                double re = x0[m * STRIDE + h * HD + i], im = x0[m * STRIDE + h * HD + i + HD / 2];
                double wr = re * cos(a) - im * sin(a), wi = re * sin(a) + im * cos(a);
                if (fabs(x[m * STRIDE + h * HD + i] - wr) > 2e-6 ||
                    fabs(x[m * STRIDE + h * HD + i + HD / 2] - wi) > 2e-6)
                    bad++;
            }
    }
    CHECK_EQ_INT(bad, 0);
    for (int h = 0; h < NH * HD; h++) /* position 0 is the identity */
        if (x[h] != x0[h])
            bad++;
    CHECK_EQ_INT(bad, 0);
}

/* Naive attention in double for query row m at position p over keys [lo, p]. */
static void naive_attention(double *out, const float *q, const float *kc, const float *vc, int p,
                            int nh, int nkv, int hd, int T_cap, int window)
{
    for (int h = 0; h < nh; h++) {
        int kvh = h / (nh / nkv);
        double sc[256], mx = -INFINITY, sum = 0;
        int lo = 0;
        if (window > 0 && p - window + 1 > 0)
            lo = p - window + 1;
        for (int j = lo; j <= p; j++) {
            double d = 0;
            for (int i = 0; i < hd; i++)
                d += (double)q[h * hd + i] * kc[((size_t)kvh * T_cap + j) * hd + i];
            sc[j] = d / sqrt(hd);
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int j = lo; j <= p; j++)
            sum += (sc[j] = exp(sc[j] - mx));
        for (int i = 0; i < hd; i++) {
            double o = 0;
            for (int j = lo; j <= p; j++)
                o += sc[j] / sum * vc[((size_t)kvh * T_cap + j) * hd + i];
            out[h * hd + i] = o;
        }
    }
}

static void test_attention(struct ref_pool *pool)
{
    enum { NH = 4, NKV = 2, HD = 16, TC = 24, T = 20 };
    static float kc[NKV * TC * HD], vc[NKV * TC * HD], q[T * NH * HD];
    static float out[T * NH * HD], out2[T * NH * HD];
    static double want[NH * HD];
    fill_uniform(kc, NKV * TC * HD, -1.5f, 1.5f);
    fill_uniform(vc, NKV * TC * HD, -1, 1);
    fill_uniform(q, T * NH * HD, -1.5f, 1.5f);
    const int windows[] = {0, 5};
    for (int wi = 0; wi < 2; wi++) {
        int win = windows[wi];
        /* prefill of all T rows at once */
        CHECK_EQ_INT(ref_attention(out, NH * HD, q, NH * HD, kc, vc, T, 0, NH, NKV, HD, TC, win,
                                   pool),
                     REF_ERR_NONE);
        int bad = 0;
        for (int p = 0; p < T; p++) {
            naive_attention(want, q + p * NH * HD, kc, vc, p, NH, NKV, HD, TC, win);
            for (int i = 0; i < NH * HD; i++)
                if (fabs(out[p * NH * HD + i] - want[i]) > 1e-5 + 1e-5 * fabs(want[i]))
                    bad++;
        }
        CHECK_MSG(bad == 0, "prefill window %d: %d mismatches", win, bad);
        /* decode one row at a time and chunked prefill must give the same bits */
        for (int p = 0; p < T; p++)
            CHECK_EQ_INT(ref_attention(out2 + p * NH * HD, NH * HD, q + p * NH * HD, NH * HD, kc,
                                       vc, 1, p, NH, NKV, HD, TC, win, NULL),
                         REF_ERR_NONE);
        CHECK(memcmp(out, out2, sizeof(out)) == 0);
        CHECK_EQ_INT(ref_attention(out2 + 7 * NH * HD, NH * HD, q + 7 * NH * HD, NH * HD, kc, vc,
                                   6, 7, NH, NKV, HD, TC, win, pool),
                     REF_ERR_NONE);
        CHECK(memcmp(out, out2, sizeof(out)) == 0);
        CHECK(norm2(out, T * NH * HD) > 0.1);
    }
    qs_log_set_quiet(true);
    CHECK_EQ_INT(ref_attention(out, 1, q, 1, kc, vc, 5, 20, NH, NKV, HD, TC, 0, NULL),
                 REF_ERR_SHAPE);
    CHECK_EQ_INT(ref_attention(out, 1, q, 1, kc, vc, 1, 0, 6, 4, HD, TC, 0, NULL), REF_ERR_SHAPE);
    qs_log_set_quiet(false);
}

static void test_moe_route(void)
{
    enum { M = 50, E = 8, TOPK = 2 };
    float lg[M * E], w[M * TOPK];
    int32_t ids[M * TOPK];
    fill_uniform(lg, M * E, -3, 3);
    lg[5 * E + 2] = lg[5 * E + 6] = 10; /* tie at the top: lower expert first */
    ref_moe_route(lg, M, E, TOPK, true, ids, w);
    int bad = 0;
    for (int m = 0; m < M; m++) {
        double p[E], sum = 0;
        int order[E];
        for (int e = 0; e < E; e++) {
            p[e] = exp((double)lg[m * E + e]);
            sum += p[e];
            order[e] = e;
        }
        for (int a = 0; a < E; a++) /* stable selection sort, descending */
            for (int b = a + 1; b < E; b++)
                if (p[order[b]] > p[order[a]]) {
                    int t = order[a];
                    order[a] = order[b];
                    order[b] = t;
                }
        double kept = 0;
        for (int k = 0; k < TOPK; k++)
            kept += p[order[k]] / sum;
        for (int k = 0; k < TOPK; k++) {
            if (ids[m * TOPK + k] != order[k])
                bad++;
            if (fabs(w[m * TOPK + k] - p[order[k]] / sum / kept) > 1e-6)
                bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(ids[5 * TOPK] == 2 && ids[5 * TOPK + 1] == 6);
    /* without renorm (Qwen3-MoE norm_topk_prob false): the same experts, the plain softmax
     * probabilities */
    float w2[M * TOPK];
    int32_t ids2[M * TOPK];
    ref_moe_route(lg, M, E, TOPK, false, ids2, w2);
    bad = 0;
    for (int m = 0; m < M; m++) {
        double sum = 0;
        for (int e = 0; e < E; e++)
            sum += exp((double)lg[m * E + e]);
        for (int k = 0; k < TOPK; k++) {
            bad += ids2[m * TOPK + k] != ids[m * TOPK + k];
            double want = exp((double)lg[m * E + ids2[m * TOPK + k]]) / sum;
            bad += fabs(w2[m * TOPK + k] - want) > 1e-6;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_ops(void)
{
    struct ref_pool *pools[3] = {NULL, NULL, NULL};
    CHECK_EQ_INT(ref_pool_create(1, &pools[0]), REF_ERR_NONE);
    CHECK_EQ_INT(ref_pool_create(2, &pools[1]), REF_ERR_NONE);
    CHECK_EQ_INT(ref_pool_create(3, &pools[2]), REF_ERR_NONE);
    CHECK_EQ_INT(ref_pool_threads(pools[2]), 3);
    static const int shapes[][4] = {
        {1, 64, 128, 32}, {3, 256, 192, 128}, {17, 128, 64, 16}, {5, 384, 320, 128}, {2, 48, 576, 16},
        {1, 4096, 1024, 128}, /* Llama-2-7B q_proj at tp 4 (decode) */
        {3, 1408, 4096, 128}, /* Llama-2-7B down_proj at tp 8, I padded 11008 -> 11264 */
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        test_w4a16_linear(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], pools, 3);
    qs_log_set_quiet(true);
    CHECK_EQ_INT(ref_w4a16_linear(NULL, NULL, NULL, NULL, NULL, 1, 64, 100, 32, NULL, NULL),
                 REF_ERR_SHAPE);
    CHECK_EQ_INT(ref_w4a16_linear(NULL, NULL, NULL, NULL, NULL, 0, 64, 128, 32, NULL, NULL),
                 REF_ERR_SHAPE);
    qs_log_set_quiet(false);
    test_linear_f16(1, 100, 37, pools[2]);
    test_linear_f16(4, 1100, 13, pools[1]);
    test_rmsnorm();
    test_layernorm();
    test_gelu();
    test_gelu_tanh_softcap();
    test_head_rmsnorm();
    test_silu_softmax_argmax_embed();
    test_rope();
    test_attention(pools[2]);
    test_alibi(pools[2]);
    test_moe_route();
    for (int i = 0; i < 3; i++)
        ref_pool_free(pools[i]);
}

int main(void)
{
    T_INIT("ref");
    test_f16_known();
    test_f16_exhaustive();
    static const int shapes[][3] = {
        {16, 64, 16}, {32, 128, 32}, {128, 192, 128}, {48, 320, 16}, {256, 64, 64}, {96, 128, 32},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        test_pack_shape(shapes[i][0], shapes[i][1], shapes[i][2]);
    test_pack_errors();
    test_fast_packers();
    test_ops();
    test_gather_cols();
    return t_done();
}

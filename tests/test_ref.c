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
    return t_done();
}

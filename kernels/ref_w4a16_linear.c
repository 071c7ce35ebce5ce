/*
 * ref_w4a16_linear.c - y = x . dequant(W) + bias straight from the packed int4 layout
 * (docs/DESIGN.md 4.1-4.3): the CPU backend's quantised matmul and the oracle of the CUDA
 * W4A16 kernels. fp32 throughout; accumulation over k in increasing order, so the result does
 * not depend on the thread count and equals a naive k loop over ref_dequant_w4's output.
 *
 * Hot path of the CPU runtime (every qkv/o/gate_up/down projection): each task owns a range
 * of 64-column n-tiles, dequantises one 16x64 tile at a time into a 4 KiB buffer and adds its
 * contribution to all M rows, so the packed weights are read exactly once per call.
 * Test: ./build/test_ref
 */
#include "qs_log.h" /* qs_log_error */
#include "ref.h"

struct w4_ctx {
    const float *x;
    const uint8_t *qweight, *qzeros;
    const uint16_t *scales;
    const float *bias;
    int M, K, N, G;
    float *y;
};

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Dequantised value of every code for the 64 columns of n-tile nt in group g (DESIGN 4.2/4.3):
 * lut[col][q] = (float)(q - z) * s, the same single rounding as ref_dequant_w4, so a tile is
 * decoded by table lookups. */
static void load_group(const struct w4_ctx *c, int nt, int g, float lut[64][16])
{
    const float *f16 = ref_f16_lut();
    int n_groups = c->K / c->G;
    const uint16_t *srow = c->scales + ((size_t)nt * (size_t)n_groups + (size_t)g) * 64;
    const uint8_t *zrow = c->qzeros + ((size_t)nt * (size_t)n_groups + (size_t)g) * 32;
    for (int col = 0; col < 64; col++) {
        int j = col / 8, cc = col % 8;
        float s = f16[srow[cc * 8 + j]];
        int z = (zrow[cc * 4 + j / 2] >> ((j % 2) * 4)) & 0xf;
        for (int q = 0; q < 16; q++)
            lut[col][q] = (float)(q - z) * s;
    }
}

/* Dequantise tile (kt, nt) into wt[16][64]: the eight nibbles of word w of thread t are
 * (rows r, r+8, r, r+8, r+1, r+9, r+1, r+9) x (sub-tiles 2w, 2w, 2w+1, 2w+1, ...), r = (t%4)*2. */
static void decode_tile(const uint8_t *tile, const float lut[64][16], float wt[16][64])
{
    for (int t = 0; t < 32; t++) {
        int r = (t % 4) * 2, c0 = t / 4;
        for (int w = 0; w < 4; w++) {
            uint32_t word = le32(tile + t * 16 + w * 4);
            int na = (2 * w) * 8 + c0, nb = (2 * w + 1) * 8 + c0;
#define DQ(shift, n) (lut[n][(word >> (shift)) & 0xfu])
            wt[r][na] = DQ(0, na);
            wt[r + 8][na] = DQ(4, na);
            wt[r][nb] = DQ(8, nb);
            wt[r + 8][nb] = DQ(12, nb);
            wt[r + 1][na] = DQ(16, na);
            wt[r + 9][na] = DQ(20, na);
            wt[r + 1][nb] = DQ(24, nb);
            wt[r + 9][nb] = DQ(28, nb);
#undef DQ
        }
    }
}

static void w4_task(void *vctx, int task, int n_tasks)
{
    const struct w4_ctx *c = vctx;
    int n_tiles = c->N / 64, k_tiles = c->K / 16;
    int nt0 = (int)((int64_t)task * n_tiles / n_tasks);
    int nt1 = (int)((int64_t)(task + 1) * n_tiles / n_tasks);
    float wt[16][64], lut[64][16];

    for (int nt = nt0; nt < nt1; nt++) {
        for (int m = 0; m < c->M; m++) {
            float *yr = c->y + (size_t)m * (size_t)c->N + (size_t)nt * 64;
            for (int col = 0; col < 64; col++)
                yr[col] = 0.0f;
        }
        int cur_g = -1;
        for (int kt = 0; kt < k_tiles; kt++) {
            int g = kt * 16 / c->G;
            if (g != cur_g) {
                load_group(c, nt, g, lut);
                cur_g = g;
            }
            decode_tile(c->qweight + ((size_t)nt * (size_t)k_tiles + (size_t)kt) * 512, lut, wt);
            for (int m = 0; m < c->M; m++) {
                const float *xr = c->x + (size_t)m * (size_t)c->K + (size_t)kt * 16;
                float *yr = c->y + (size_t)m * (size_t)c->N + (size_t)nt * 64;
                for (int kk = 0; kk < 16; kk++) {
                    float xv = xr[kk];
                    for (int col = 0; col < 64; col++)
                        yr[col] += xv * wt[kk][col];
                }
            }
        }
        if (c->bias)
            for (int m = 0; m < c->M; m++) {
                float *yr = c->y + (size_t)m * (size_t)c->N + (size_t)nt * 64;
                for (int col = 0; col < 64; col++)
                    yr[col] += c->bias[nt * 64 + col];
            }
    }
}

enum ref_err ref_w4a16_linear(const float *x, const uint8_t *qweight, const uint8_t *qzeros,
                              const uint16_t *scales, const float *bias, int M, int K, int N,
                              int G, float *y, struct ref_pool *pool)
{
    if (M < 1 || !ref_w4_shape_ok(K, N, G)) {
        qs_log_error(__func__, "shape M=%d K=%d N=%d group_size=%d: need M >= 1, K %% 16 == 0, "
                     "N %% 64 == 0, G %% 16 == 0, K %% G == 0", M, K, N, G);
        return REF_ERR_SHAPE;
    }
    struct w4_ctx c = {x, qweight, qzeros, scales, bias, M, K, N, G, y};
    int n_tiles = N / 64;
    int n_tasks = ref_pool_threads(pool) * 4;
    if (n_tasks > n_tiles)
        n_tasks = n_tiles;
    ref_pool_run(pool, w4_task, &c, n_tasks);
    return REF_ERR_NONE;
}

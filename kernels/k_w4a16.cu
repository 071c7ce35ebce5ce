/*
 * k_w4a16.cu - W4A16 linear: y[M, N] (fp16) = x[M, K] (fp16) . dequant(W) + bias, fp32 accumulation,
 * reading the converter's packed int4 layout (docs/DESIGN.md section 4) directly.
 *
 *   W[k][n] = (q[k][n] - z[k/G][n]) * s[k/G][n]; reference ref_w4a16_linear (kernels/ref.h).
 *
 * Variants (kernels.h, enum k_w4a16_variant):
 *   v1 naive   one thread per output, scalar fp32 dequant via the layout formula: the oracle.
 *   v2 decode  M <= 64. Stream-K: the packed tiles of one linear are one contiguous stream
 *              (n-tile-major, DESIGN 4.1), cut into equal contiguous chunks, one per warp, over
 *              a grid that fills every SM. Each lane cp.async-copies exactly the 16 bytes that are
 *              its own B fragments (no shared-memory exchange), several tiles in flight per warp;
 *              dequant in registers (lop3 + 0x6400 trick); mma.sync m16n8k16 with the activation
 *              rows as A. When a chunk leaves a 64-column tile, the warp adds its partial sums to
 *              the fp32 workspace (atomics) and bumps that tile's counter; the last contributor
 *              writes y (+ bias) in fp16 and zeroes the workspace again.
 *   v3 GEMM    any M. 128 x 128 block tile, 4 warps of 64 x 64, 2 k-tiles per stage, 4-stage
 *              cp.async pipeline for activations (swizzled, read with ldmatrix), packed weights,
 *              scales and zeros; dequant once per warp and k-tile, 32 mma per k-tile per warp.
 *   dequant    packed -> fp16 [K, N] row-major (for cuBLAS at large M, and tests).
 *
 * Test: build-gpu/gpu_test_kernels (tests/run_gpu_tests.sh). Bench: qshard bench kernel w4a16.
 */
#include "k_common.cuh" /* K_CUDA_CHECK, k_mma_16816, k_w4_dequant_word, k_cp_async16 */

#include <algorithm>

// --- v1: naive oracle ------------------------------------------------------------------------

static __global__ void w4a16_v1_kernel(const __half *__restrict__ x, /* [M, K] */
                                       const uint8_t *__restrict__ qweight,
                                       const uint8_t *__restrict__ qzeros,
                                       const uint16_t *__restrict__ scales,
                                       const float *__restrict__ bias, /* [N] or NULL */
                                       __half *__restrict__ y,         /* [M, N] */
                                       int M, int N, int K, int G)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int n_groups = K / G;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            const int g = k / G;
            const float w = (float)(k_w4_code(qweight, K, k, n) - k_w4_zero(qzeros, n_groups, g, n)) *
                            k_w4_scale(scales, n_groups, g, n);
            acc += __half2float(x[(size_t)m * K + k]) * w;
        }
        if (bias) acc += bias[n];
        y[(size_t)m * N + n] = __float2half_rn(acc);
    }
}

// --- v2: decode, stream-K ----------------------------------------------------------------------

namespace v2 {
constexpr int WARPS = 4;  /* warps per block: small blocks let the grid tile the SMs evenly */
constexpr int STAGES = 8; /* tiles in flight per warp: 8 x 512 B, ~96 KB in flight per SM */
constexpr int MIN_CHUNK = 16; /* fewest tiles per warp: below this the flush dominates */
/* shared memory per warp: per stage 32 lanes x (16 B weights + 16 B scales + 4 B zero word) */
constexpr int SMEM_PER_WARP = STAGES * K_WARP * (16 + 16 + 4);
constexpr int SMEM_BYTES = WARPS * SMEM_PER_WARP;
} // namespace v2

/* MB = number of 16-row blocks of M handled per tile (1: M <= 16, 2: M <= 32, 4: M <= 64). */
template <int MB>
static __global__ void __launch_bounds__(v2::WARPS *K_WARP)
w4a16_v2_decode_kernel(const __half *__restrict__ x,        /* [M, K] */
                       const uint4 *__restrict__ qweight,   /* [N/64][K/16] tiles of 32 x 16 B */
                       const uint32_t *__restrict__ qzeros, /* [N/64][K/G][8] words */
                       const uint4 *__restrict__ scales,    /* [N/64][K/G][64] fp16 = 8 x 16 B */
                       const float *__restrict__ bias,      /* [N] or NULL */
                       __half *__restrict__ y,              /* [M, N] */
                       float *__restrict__ ws,              /* [M, N] fp32, zero on entry/exit */
                       unsigned *__restrict__ counters,     /* [N/64], zero on entry/exit */
                       int M, int N, int K, int G, int chunk)
{
    extern __shared__ __align__(16) unsigned char k_smem[];
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    const int KT = K / 16, GT = G / 16;
    const int T = KT * (N / 64);
    const int start = (blockIdx.x * v2::WARPS + warp) * chunk;
    if (start >= T) return;
    const int end = min(T, start + chunk);

    unsigned char *base = k_smem + warp * v2::SMEM_PER_WARP;
    uint4 *ring_w = reinterpret_cast<uint4 *>(base);                         /* [STAGES][32] */
    uint4 *ring_s = ring_w + v2::STAGES * K_WARP;                            /* [STAGES][32] */
    uint32_t *ring_z = reinterpret_cast<uint32_t *>(ring_s + v2::STAGES * K_WARP);

    /* Issue the copies of tile i into ring slot `slot`: weights always, scales and zeros when
     * the tile opens a group or the chunk (flat group index i / GT: DESIGN 4.2/4.3 are
     * n-tile-major like 4.1, so groups follow the tile stream). */
    auto issue = [&](int i, int slot) {
        k_cp_async16(&ring_w[slot * K_WARP + lane], qweight + (size_t)i * K_WARP + lane, 16);
        if (i == start || i % GT == 0) {
            const size_t fg = (size_t)(i / GT);
            k_cp_async16(&ring_s[slot * K_WARP + lane], scales + fg * 8 + lane / 4, 16);
            const uint32_t sa = (uint32_t)__cvta_generic_to_shared(&ring_z[slot * K_WARP + lane]);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa),
                         "l"(qzeros + fg * 8 + lane / 4));
        }
    };

#pragma unroll
    for (int u = 0; u < v2::STAGES - 1; ++u) {
        if (start + u < end) issue(start + u, u);
        k_cp_async_commit();
    }

    /* A-fragment rows of this lane: r = mb*16 + lane/4 and r + 8; NULL past M (rows read as 0). */
    const __half *xrow[MB][2];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
        const int r0 = mb * 16 + lane / 4, r1 = r0 + 8;
        xrow[mb][0] = r0 < M ? x + (size_t)r0 * K + (lane % 4) * 2 : nullptr;
        xrow[mb][1] = r1 < M ? x + (size_t)r1 * K + (lane % 4) * 2 : nullptr;
    }

    float acc[MB][8][4];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[mb][j][c] = 0.0f;

    k_w4_group grp;
    int nt = start / KT, kt = start % KT, slot = 0;
    for (int i = start; i < end; ++i) {
        const int ahead = i + v2::STAGES - 1;
        if (ahead < end) issue(ahead, (slot + v2::STAGES - 1) % v2::STAGES);
        k_cp_async_commit();
        k_cp_async_wait<v2::STAGES - 1>(); /* tile i's group has landed (own lane's bytes) */

        /* activations first: their L1/L2 latency overlaps the dequant below */
        uint32_t a[MB][4];
        const int koff = kt * 16;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            a[mb][0] = xrow[mb][0] ? __ldg(reinterpret_cast<const unsigned *>(xrow[mb][0] + koff)) : 0u;
            a[mb][1] = xrow[mb][1] ? __ldg(reinterpret_cast<const unsigned *>(xrow[mb][1] + koff)) : 0u;
            a[mb][2] = xrow[mb][0] ? __ldg(reinterpret_cast<const unsigned *>(xrow[mb][0] + koff + 8)) : 0u;
            a[mb][3] = xrow[mb][1] ? __ldg(reinterpret_cast<const unsigned *>(xrow[mb][1] + koff + 8)) : 0u;
        }
        if (i == start || i % GT == 0)
            k_w4_group_load(grp, ring_z[slot * K_WARP + lane], ring_s[slot * K_WARP + lane]);
        const uint4 wv = ring_w[slot * K_WARP + lane];
        const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            uint32_t b[4];
            k_w4_dequant_word(words[w], grp, w, b);
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                k_mma_16816(acc[mb][2 * w], a[mb], b[0], b[1]);
                k_mma_16816(acc[mb][2 * w + 1], a[mb], b[2], b[3]);
            }
        }
        slot = (slot + 1) % v2::STAGES;

        if (++kt == KT || i + 1 == end) {
            /* Flush this warp's partial sums of n-tile nt (C fragment: rows lane/4 (+8), cols
             * (lane%4)*2 + {0,1} of each n8 sub-tile j). */
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                const int r0 = mb * 16 + lane / 4, r1 = r0 + 8;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int col = nt * 64 + j * 8 + (lane % 4) * 2;
                    if (r0 < M) {
                        atomicAdd(ws + (size_t)r0 * N + col, acc[mb][j][0]);
                        atomicAdd(ws + (size_t)r0 * N + col + 1, acc[mb][j][1]);
                    }
                    if (r1 < M) {
                        atomicAdd(ws + (size_t)r1 * N + col, acc[mb][j][2]);
                        atomicAdd(ws + (size_t)r1 * N + col + 1, acc[mb][j][3]);
                    }
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[mb][j][c] = 0.0f;
                }
            }
            /* Contributors of n-tile nt: the warps whose chunks meet tiles [nt*KT, (nt+1)*KT). */
            const int expected = ((nt + 1) * KT - 1) / chunk - (nt * KT) / chunk + 1;
            __threadfence(); /* our adds are visible device-wide before the counter moves */
            __syncwarp();
            unsigned prev = 0;
            if (lane == 0) prev = atomicAdd(counters + nt, 1u);
            prev = __shfl_sync(0xffffffffu, prev, 0);
            if (prev == (unsigned)expected - 1) {
                __threadfence(); /* acquire side: see every other warp's adds */
                for (int e = lane; e < M * 64; e += K_WARP) {
                    const int r = e / 64, c = nt * 64 + e % 64;
                    float v = __ldcg(ws + (size_t)r * N + c);
                    if (bias) v += bias[c];
                    y[(size_t)r * N + c] = __float2half_rn(v);
                    __stcg(ws + (size_t)r * N + c, 0.0f);
                }
                if (lane == 0) atomicExch(counters + nt, 0u);
            }
            ++nt;
            kt = 0;
        }
    }
    k_cp_async_wait<0>();
}

// --- v3: GEMM ----------------------------------------------------------------------------------

namespace v3 {
constexpr int BM = 128;     /* rows of M per block */
constexpr int BNT = 2;      /* n-tiles (64 columns each) per block */
constexpr int BKT = 2;      /* k-tiles (16 each) per pipeline stage */
constexpr int STAGES = 4;   /* cp.async stages: enough to cover HBM latency at this tile size */
constexpr int THREADS = 128; /* 4 warps: 2 (M) x 2 (N), each 64 x 64 */
constexpr int A_BYTES = BM * BKT * 16 * 2;          /* 8 KB: [BM][32] fp16, 16-byte swizzle */
constexpr int B_BYTES = BNT * BKT * 512;             /* 2 KB: packed tiles as stored */
constexpr int S_BYTES = BNT * BKT * 128;             /* one 64-entry scale row per (nt, kt) */
constexpr int Z_BYTES = BNT * BKT * 32;              /* one 8-word zero row per (nt, kt) */
constexpr int STAGE_BYTES = A_BYTES + B_BYTES + S_BYTES + Z_BYTES;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;     /* 42.5 KB: fits the default 48 KB */
} // namespace v3

static __global__ void __launch_bounds__(v3::THREADS)
w4a16_v3_gemm_kernel(const __half *__restrict__ x,      /* [M, K] */
                     const uint4 *__restrict__ qweight, /* [N/64][K/16] tiles */
                     const uint4 *__restrict__ qzeros,  /* [N/64][K/G] rows of 32 B = 2 x 16 B */
                     const uint4 *__restrict__ scales,  /* [N/64][K/G] rows of 128 B = 8 x 16 B */
                     const float *__restrict__ bias,    /* [N] or NULL */
                     __half *__restrict__ y,            /* [M, N] */
                     int M, int N, int K, int G)
{
    __shared__ __align__(128) unsigned char smem[v3::SMEM_BYTES];
    const int tid = threadIdx.x, lane = tid % K_WARP, warp = tid / K_WARP;
    const int wm = warp / 2, wn = warp % 2;
    const int KT = K / 16, NT = N / 64, GT = G / 16, n_groups = K / G;
    const int KS = (KT + v3::BKT - 1) / v3::BKT; /* pipeline steps */
    const int m0 = blockIdx.y * v3::BM, nt0 = blockIdx.x * v3::BNT;

    auto stage_a = [&](int s) { return smem + s * v3::STAGE_BYTES; };
    auto stage_b = [&](int s) { return stage_a(s) + v3::A_BYTES; };
    auto stage_s = [&](int s) { return stage_b(s) + v3::B_BYTES; };
    auto stage_z = [&](int s) { return stage_s(s) + v3::S_BYTES; };

    /* Copy step ks (k-tiles ks*2, ks*2+1) into stage s. Rows past M, k-tiles past K and
     * n-tiles past N are zero-filled (src size 0) from a valid address. */
    auto load_stage = [&](int s, int ks) {
        const int kt0 = ks * v3::BKT;
        unsigned char *sa = stage_a(s);
#pragma unroll
        for (int c = 0; c < (v3::BM * v3::BKT * 2) / v3::THREADS; ++c) { /* 4 chunks of 16 B */
            const int id = tid + c * v3::THREADS, row = id / 4, ch = id % 4;
            const int kt = kt0 + ch / 2;
            const bool ok = (m0 + row < M) && (kt < KT);
            const __half *src = ok ? x + (size_t)(m0 + row) * K + kt0 * 16 + ch * 8 : x;
            k_cp_async16(sa + row * 64 + ((ch ^ ((row >> 1) & 3)) * 16), src, ok ? 16 : 0);
        }
        { /* weights: one 16-byte chunk per thread: (ntl, ktl, lane) */
            const int ntl = tid / 64, ktl = (tid / 32) % 2, nt = nt0 + ntl, kt = kt0 + ktl;
            const bool ok = nt < NT && kt < KT;
            const uint4 *src = ok ? qweight + ((size_t)nt * KT + kt) * K_WARP + lane : qweight;
            k_cp_async16(stage_b(s) + tid * 16, src, ok ? 16 : 0);
        }
        if (tid < 32) { /* scale rows: (ntl, ktl, chunk 0..7) */
            const int ntl = tid / 16, ktl = (tid / 8) % 2, ch = tid % 8;
            const int nt = nt0 + ntl, kt = kt0 + ktl;
            const bool ok = nt < NT && kt < KT;
            const uint4 *src = ok ? scales + ((size_t)nt * n_groups + kt / GT) * 8 + ch : scales;
            k_cp_async16(stage_s(s) + tid * 16, src, ok ? 16 : 0);
        } else if (tid < 40) { /* zero rows: (ntl, ktl, chunk 0..1) */
            const int t = tid - 32, ntl = t / 4, ktl = (t / 2) % 2, ch = t % 2;
            const int nt = nt0 + ntl, kt = kt0 + ktl;
            const bool ok = nt < NT && kt < KT;
            const uint4 *src = ok ? qzeros + ((size_t)nt * n_groups + kt / GT) * 2 + ch : qzeros;
            k_cp_async16(stage_z(s) + t * 16, src, ok ? 16 : 0);
        }
    };

    float acc[4][8][4];
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[mb][j][c] = 0.0f;

#pragma unroll
    for (int s = 0; s < v3::STAGES - 1; ++s) {
        if (s < KS) load_stage(s, s);
        k_cp_async_commit();
    }

    k_w4_group grp;
    for (int ks = 0; ks < KS; ++ks) {
        k_cp_async_wait<v3::STAGES - 2>();
        __syncthreads(); /* stage ks landed for all threads; stage ks-1 is free to refill */
        if (ks + v3::STAGES - 1 < KS) load_stage((ks + v3::STAGES - 1) % v3::STAGES, ks + v3::STAGES - 1);
        k_cp_async_commit();

        const int s = ks % v3::STAGES;
#pragma unroll
        for (int ktl = 0; ktl < v3::BKT; ++ktl) {
            const int kt = ks * v3::BKT + ktl;
            if (kt >= KT) break;
            if (kt % GT == 0) {
                const uint4 sc = reinterpret_cast<const uint4 *>(stage_s(s))[(wn * 2 + ktl) * 8 + lane / 4];
                const uint32_t zw = reinterpret_cast<const uint32_t *>(stage_z(s))[(wn * 2 + ktl) * 8 + lane / 4];
                k_w4_group_load(grp, zw, sc);
            }
            const uint4 wv = reinterpret_cast<const uint4 *>(stage_b(s))[(wn * 2 + ktl) * K_WARP + lane];
            const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
            uint32_t b[16];
#pragma unroll
            for (int w = 0; w < 4; ++w) k_w4_dequant_word(words[w], grp, w, b + 4 * w);
#pragma unroll
            for (int mb = 0; mb < 4; ++mb) {
                const int row = wm * 64 + mb * 16 + (lane & 15), ch = ktl * 2 + (lane >> 4);
                uint32_t a[4];
                k_ldmatrix_x4(a, stage_a(s) + row * 64 + ((ch ^ ((row >> 1) & 3)) * 16));
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    k_mma_16816(acc[mb][j], a, b[(j / 2) * 4 + (j % 2) * 2], b[(j / 2) * 4 + (j % 2) * 2 + 1]);
            }
        }
    }
    k_cp_async_wait<0>();

    const int nt = nt0 + wn;
    if (nt >= NT) return;
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) {
        const int r0 = m0 + wm * 64 + mb * 16 + lane / 4, r1 = r0 + 8;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int col = nt * 64 + j * 8 + (lane % 4) * 2;
            const float b0 = bias ? bias[col] : 0.0f, b1 = bias ? bias[col + 1] : 0.0f;
            if (r0 < M)
                *reinterpret_cast<__half2 *>(y + (size_t)r0 * N + col) =
                    __floats2half2_rn(acc[mb][j][0] + b0, acc[mb][j][1] + b1);
            if (r1 < M)
                *reinterpret_cast<__half2 *>(y + (size_t)r1 * N + col) =
                    __floats2half2_rn(acc[mb][j][2] + b0, acc[mb][j][3] + b1);
        }
    }
}

// --- dequant to fp16 ---------------------------------------------------------------------------

constexpr int DQ_WARPS = 8;

/* One warp per packed tile: dequant in registers exactly as the GEMM does, transpose through
 * shared memory, write 16 rows x 128 B coalesced. */
static __global__ void __launch_bounds__(DQ_WARPS *K_WARP)
w4a16_dequant_kernel(const uint4 *__restrict__ qweight, const uint32_t *__restrict__ qzeros,
                     const uint4 *__restrict__ scales, __half *__restrict__ w, /* [K, N] */
                     int N, int K, int G)
{
    __shared__ __align__(16) __half tile[DQ_WARPS][16][64];
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    const int KT = K / 16, GT = G / 16, T = KT * (N / 64);
    const int i = blockIdx.x * DQ_WARPS + warp;
    if (i >= T) return;
    const int nt = i / KT, kt = i % KT;
    k_w4_group grp;
    k_w4_group_load(grp, __ldg(qzeros + (size_t)(i / GT) * 8 + lane / 4),
                    __ldg(scales + (size_t)(i / GT) * 8 + lane / 4));
    const uint4 wv = __ldg(qweight + (size_t)i * K_WARP + lane);
    const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
    const int k0 = (lane % 4) * 2, c = lane / 4;
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
        uint32_t b[4];
        k_w4_dequant_word(words[wd], grp, wd, b);
#pragma unroll
        for (int h = 0; h < 2; ++h) { /* sub-tile 2wd + h */
            const int col = (2 * wd + h) * 8 + c;
            const __half2 lo = k_u32_as_half2(b[2 * h]), hi = k_u32_as_half2(b[2 * h + 1]);
            tile[warp][k0][col] = __low2half(lo);
            tile[warp][k0 + 1][col] = __high2half(lo);
            tile[warp][k0 + 8][col] = __low2half(hi);
            tile[warp][k0 + 9][col] = __high2half(hi);
        }
    }
    __syncwarp();
#pragma unroll
    for (int e = 0; e < 4; ++e) { /* 16 rows x 8 chunks of 16 B */
        const int id = lane + e * K_WARP, r = id / 8, ch = id % 8;
        *reinterpret_cast<uint4 *>(w + (size_t)(kt * 16 + r) * N + nt * 64 + ch * 8) =
            *reinterpret_cast<const uint4 *>(&tile[warp][r][ch * 8]);
    }
}

// --- launchers ---------------------------------------------------------------------------------

static int check_shape(const char *who, int M, int N, int K, int G)
{
    if (M < 1 || N < 1 || K < 1 || G < 16 || K % 16 || N % 64 || G % 16 || K % G) {
        qs_log_error(who, "W4A16 shape M=%d N=%d K=%d G=%d: need M,N,K >= 1, K %% 16 == 0, "
                     "N %% 64 == 0, G %% 16 == 0 (G >= 16), K %% G == 0 (DESIGN 4)", M, N, K, G);
        return K_ERR_SHAPE;
    }
    if ((long long)(K / 16) * (N / 64) > 0x7fffffffLL / 64) {
        qs_log_error(who, "W4A16 shape N=%d K=%d: too many tiles for 32-bit tile indices", N, K);
        return K_ERR_SHAPE;
    }
    return K_ERR_NONE;
}

size_t k_w4a16_workspace_bytes(int M, int N)
{
    if (M < 1 || N < 64) return 0;
    const size_t b = (size_t)M * N * sizeof(float) + (size_t)(N / 64) * sizeof(unsigned);
    return (b + 255) / 256 * 256;
}

static int launch_v2(const __half *x, const uint4 *qw, const uint32_t *qz, const uint4 *sc,
                     const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                     cudaStream_t stream)
{
    const int T = (K / 16) * (N / 64);
    static int blocks_per_sm[3]; /* occupancy per MB instantiation, queried once */
    const int mbi = M <= 16 ? 0 : M <= 32 ? 1 : 2;
    auto kern = mbi == 0 ? w4a16_v2_decode_kernel<1>
              : mbi == 1 ? w4a16_v2_decode_kernel<2> : w4a16_v2_decode_kernel<4>;
    if (blocks_per_sm[mbi] == 0) {
        int b = 0;
        K_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          v2::SMEM_BYTES));
        K_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kern, v2::WARPS * K_WARP,
                                                                   v2::SMEM_BYTES));
        blocks_per_sm[mbi] = std::max(b, 1);
    }
    const long max_warps = (long)k_device_sm_count() * blocks_per_sm[mbi] * v2::WARPS;
    int chunk = (int)((T + max_warps - 1) / max_warps);
    chunk = std::max(chunk, std::min(v2::MIN_CHUNK, T));
    const int warps = (T + chunk - 1) / chunk;
    const int blocks = (warps + v2::WARPS - 1) / v2::WARPS;
    float *wsf = static_cast<float *>(ws);
    unsigned *counters = reinterpret_cast<unsigned *>(wsf + (size_t)M * N);
    kern<<<blocks, v2::WARPS * K_WARP, v2::SMEM_BYTES, stream>>>(x, qw, qz, sc, bias, y, wsf,
                                                                 counters, M, N, K, G, chunk);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_w4a16_linear_variant(int variant, const uint16_t *x, const uint8_t *qweight,
                           const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                           uint16_t *y, int M, int N, int K, int G, void *workspace,
                           size_t workspace_bytes, struct CUstream_st *stream)
{
    int rc = check_shape(__func__, M, N, K, G);
    if (rc) return rc;
    if (!x || !qweight || !qzeros || !scales || !y)
        K_REFUSE(K_ERR_ARG, "NULL tensor (x %p, qweight %p, qzeros %p, scales %p, y %p)",
                 (const void *)x, (const void *)qweight, (const void *)qzeros,
                 (const void *)scales, (const void *)y);
    if (variant == K_W4A16_AUTO)
        variant = M <= K_W4A16_DECODE_MAX_M ? K_W4A16_V2_DECODE : K_W4A16_V3_GEMM;
    const __half *xh = reinterpret_cast<const __half *>(x);
    __half *yh = reinterpret_cast<__half *>(y);
    switch (variant) {
    case K_W4A16_V1_NAIVE: {
        const dim3 grid((N + 127) / 128, std::min(M, 65535));
        w4a16_v1_kernel<<<grid, 128, 0, stream>>>(xh, qweight, qzeros, scales, bias, yh, M, N, K, G);
        K_LAUNCH_CHECK();
        return K_ERR_NONE;
    }
    case K_W4A16_V2_DECODE:
        if (M > K_W4A16_DECODE_MAX_M)
            K_REFUSE(K_ERR_SHAPE, "W4A16 decode variant: M=%d > %d", M, K_W4A16_DECODE_MAX_M);
        if (!workspace || workspace_bytes < k_w4a16_workspace_bytes(M, N))
            K_REFUSE(K_ERR_WORKSPACE, "W4A16 decode M=%d N=%d: workspace %zu bytes at %p, need %zu",
                     M, N, workspace_bytes, workspace, k_w4a16_workspace_bytes(M, N));
        return launch_v2(xh, reinterpret_cast<const uint4 *>(qweight),
                         reinterpret_cast<const uint32_t *>(qzeros),
                         reinterpret_cast<const uint4 *>(scales), bias, yh, M, N, K, G,
                         workspace, stream);
    case K_W4A16_V3_GEMM: {
        const int NT = N / 64;
        const long mblocks = (M + v3::BM - 1) / v3::BM;
        if (mblocks > 65535) K_REFUSE(K_ERR_SHAPE, "W4A16 GEMM: M=%d too large", M);
        const dim3 grid((NT + v3::BNT - 1) / v3::BNT, (unsigned)mblocks);
        w4a16_v3_gemm_kernel<<<grid, v3::THREADS, 0, stream>>>(
            xh, reinterpret_cast<const uint4 *>(qweight), reinterpret_cast<const uint4 *>(qzeros),
            reinterpret_cast<const uint4 *>(scales), bias, yh, M, N, K, G);
        K_LAUNCH_CHECK();
        return K_ERR_NONE;
    }
    default:
        K_REFUSE(K_ERR_ARG, "unknown W4A16 variant %d (known: 0 auto, 1 naive, 2 decode, 3 GEMM)",
                 variant);
    }
}

int k_w4a16_linear(const uint16_t *x, const uint8_t *qweight, const uint8_t *qzeros,
                   const uint16_t *scales, const float *bias, uint16_t *y, int M, int N, int K,
                   int G, void *workspace, size_t workspace_bytes, struct CUstream_st *stream)
{
    return k_w4a16_linear_variant(K_W4A16_AUTO, x, qweight, qzeros, scales, bias, y, M, N, K, G,
                                  workspace, workspace_bytes, stream);
}

int k_w4a16_dequant(const uint8_t *qweight, const uint8_t *qzeros, const uint16_t *scales,
                    uint16_t *w, int N, int K, int G, struct CUstream_st *stream)
{
    int rc = check_shape(__func__, 1, N, K, G);
    if (rc) return rc;
    if (!qweight || !qzeros || !scales || !w)
        K_REFUSE(K_ERR_ARG, "NULL tensor (qweight %p, qzeros %p, scales %p, w %p)",
                 (const void *)qweight, (const void *)qzeros, (const void *)scales, (void *)w);
    const int T = (K / 16) * (N / 64);
    w4a16_dequant_kernel<<<(T + DQ_WARPS - 1) / DQ_WARPS, DQ_WARPS * K_WARP, 0, stream>>>(
        reinterpret_cast<const uint4 *>(qweight), reinterpret_cast<const uint32_t *>(qzeros),
        reinterpret_cast<const uint4 *>(scales), reinterpret_cast<__half *>(w), N, K, G);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/*
 * k_w4a16.cu - W4A16 linear: y[M, N] (fp16) = x[M, K] (fp16) . dequant(W) + bias, fp32 accumulation,
 * reading the converter's packed int4 layout (docs/DESIGN.md section 4) directly.
 *
 *   W[k][n] = (q[k][n] - z[k/G][n]) * s[k/G][n]; reference ref_w4a16_linear (kernels/ref.h).
 *
 * Variants (kernels.h, enum k_w4a16_variant; auto picks by M from the H200 measurements in
 * docs/BENCHMARKS.md):
 *   v1 naive   one thread per output, scalar fp32 dequant via the layout formula: the oracle.
 *   v2 decode  M <= 64 (auto: only where v5 cannot take G). Split-K slices x 4 n-tiles per block, sized to fill the
 *              resident block slots in whole waves. The block stages its activation slice in
 *              shared memory once; each lane cp.async-copies exactly the 16 bytes of a packed tile
 *              that are its own fragments (8 tiles in flight per warp), dequantises in registers
 *              (lop3 + 0x6400 trick) and runs the product transposed (weights as the mma A
 *              operand, tokens as n8) so M <= 8 costs 4 mma per tile. Slices meet through fp32
 *              atomics in the workspace; the last slice of a 64-column tile writes y.
 *   v5 / v6    M <= 64 / 16. v2's decomposition with a leaner tile loop: weights straight
 *              into registers 8 tiles ahead (v5) or through an unrolled cp.async ring (v6), the
 *              loop unrolled by 8 (compile-time slots and group boundaries); the weight loads
 *              start before the previous kernel ends (Programmatic Dependent Launch, sm_90).
 *   v8         v5 with the block pre-sum of 4 slices at M <= 16.
 *   v9         M <= 64 (auto). v5 with the deferred split-K (k_w4a16_linear_acc: the slices'
 *              sums stay in the workspace, no counter, no last-slice tail) + k_w4a16_acc_finish.
 *              The CUDA runtime's decode defers the finish into the consuming kernel instead.
 *   v4 stream  M <= 64 (auto: only where neither v5 nor v2 fits). Stream-K: the tile stream (n-tile-major, DESIGN 4.1) cut
 *              into equal contiguous chunks, one per warp; activations read per tile from L1/L2.
 *   v3 GEMM    any M (auto: M > 64 where v7 is not available). 128 x 128 block tile, 4 warps of
 *              64 x 64, 2 k-tiles per stage, 4-stage cp.async pipeline for activations
 *              (swizzled, read with ldmatrix), packed weights, scales and zeros; 32 mma per
 *              k-tile per warp. No split-K.
 *   v7 wgmma   any M, sm_90a (auto: M > 64). 128 x 128 block tile, two warpgroups; each 64-k
 *              step's weight tile is dequantised once into shared memory (stmatrix, 128-byte
 *              swizzle) and multiplied with wgmma.mma_async while the warps dequantise the next
 *              step; split-K through the workspace at M <= 256. The CUDA runtime's path for
 *              M = 65 .. K_W4A16_DQ_GEMM_MIN_M - 1.
 *   dequant    packed -> fp16 [K, N] row-major; with cuBLAS it is k_w4a16_linear_dq_gemm, the
 *              prefill path (M >= K_W4A16_DQ_GEMM_MIN_M) of the CUDA runtime.
 *
 * Test: build-gpu/gpu_test_kernels (tests/run_gpu_tests.sh). Bench: qshard bench kernel w4a16.
 */
#include "k_common.cuh" /* K_CUDA_CHECK, k_mma_16816, k_w4_dequant_word, k_cp_async16 */

#include <cublas_v2.h> /* cublasGemmEx (k_w4a16_linear_dq_gemm) */

#include <limits.h> /* INT_MAX (k_w4a16_variant_max_m) */

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

// --- v2: decode, split-K slices -----------------------------------------------------------------

namespace v2 {
constexpr int WARPS = 4;  /* warps per block, one n-tile each */
constexpr int STAGES = 8; /* weight tiles in flight per warp (8 x 512 B) */
constexpr int X_BUDGET = 16384; /* bytes of the staged activation slice at most */
constexpr int SZ_BYTES = 160;   /* one group of one n-tile: 128 B scales + 32 B zero words */
constexpr int RING_BYTES = WARPS * STAGES * 512;
/* resident blocks per SM the register allocation must allow: 6 x 4 warps keep ~96 KB of
 * weights in flight per SM at M <= 16; larger M needs the registers for accumulators */
template <int MB8> constexpr int MIN_BLOCKS = MB8 <= 2 ? 6 : 1;
} // namespace v2

/*
 * End of a split-K slice (v2, v5): add this warp's partial sums acc (the D fragments of the
 * transposed product: acc[tb][w][c], c0/c1 = column nt*64 + 2w*8 + lane/4, tokens tb*8 + 2t, +1;
 * c2/c3 = column + 8, same tokens; t = lane % 4) to the fp32 workspace; the slice that arrives
 * last at the n-tile's counter adds the bias, writes y [M, 64 columns] in fp16 and zeroes its
 * workspace columns and the counter again (so the workspace is zero on exit).
 */
template <int MB8>
static __device__ __forceinline__ void w4a16_splitk_flush(const float (&acc)[MB8][4][4],
                                                          const float *__restrict__ bias,
                                                          __half *__restrict__ y,
                                                          float *__restrict__ ws,
                                                          unsigned *__restrict__ counters, int M,
                                                          int N, int nt, int S, int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int tb = 0; tb < MB8; ++tb) {
        const int m0 = tb * 8 + 2 * t, m1 = m0 + 1;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int n0 = nt * 64 + 2 * w * 8 + g, n1 = n0 + 8;
            if (m0 < M) {
                atomicAdd(ws + (size_t)m0 * N + n0, acc[tb][w][0]);
                atomicAdd(ws + (size_t)m0 * N + n1, acc[tb][w][2]);
            }
            if (m1 < M) {
                atomicAdd(ws + (size_t)m1 * N + n0, acc[tb][w][1]);
                atomicAdd(ws + (size_t)m1 * N + n1, acc[tb][w][3]);
            }
        }
    }
    __threadfence(); /* our adds are visible device-wide before the counter moves */
    __syncwarp();
    unsigned prev = 0;
    if (lane == 0) prev = atomicAdd(counters + nt, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != (unsigned)S - 1) return;
    __threadfence(); /* the last slice sees every other slice's adds */
    for (int e = lane; e < M * 64; e += K_WARP) {
        const int r = e / 64, c = nt * 64 + e % 64;
        float v = __ldcg(ws + (size_t)r * N + c);
        if (bias) v += bias[c];
        y[(size_t)r * N + c] = __float2half_rn(v);
        __stcg(ws + (size_t)r * N + c, 0.0f);
    }
    if (lane == 0) atomicExch(counters + nt, 0u);
}

/* v + bias[0..3]: the bias of 4 columns (the last slice's finish; in the deferred split-K the
 * slice that holds k = 0 adds it once) */
static __device__ __forceinline__ float4 add_bias4(float4 v, const float *__restrict__ b)
{
    return make_float4(v.x + b[0], v.y + b[1], v.z + b[2], v.w + b[3]);
}

/* Finish 4 columns c .. c+3 of row r after the last split-K slice (v5, v7): y = fp16(ws + bias),
 * then the workspace entries back to zero. ws, y: [M, N] row-major; c % 4 == 0. */
static __device__ __forceinline__ void splitk_finish4(float *__restrict__ ws, __half *__restrict__ y,
                                                      const float *__restrict__ bias, int r, int c,
                                                      int N)
{
    float4 *p = reinterpret_cast<float4 *>(ws + (size_t)r * N + c);
    float4 v = __ldcg(p);
    if (bias) v = add_bias4(v, bias + c);
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    *reinterpret_cast<uint2 *>(y + (size_t)r * N + c) = make_uint2(k_half2_as_u32(a), k_half2_as_u32(b));
    __stcg(p, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
}

/*
 * The split-K flush of v5: as w4a16_splitk_flush, with the warp's fragments first gathered
 * row-major in its own shared-memory stage [8*MB8][64] fp32, so the workspace sees one 16-byte
 * vector reduction per 4 columns (M*16 per warp instead of M*64 scalar atomics) and the last
 * slice reads, writes and zeroes 4 columns at a time. Needs N % 4 == 0 (N % 64 == 0 holds).
 * Column c of row r lives at stage_at(r, c) = r*64 + (c ^ 4*(r & 7)): the fragment writes (lanes 4g + t hold rows
 * 2t, 2t + 1 and columns g, g + 8 of each 16-column block) then hit 32 different banks instead of
 * 4-way conflicts, and the 4-column groups the flush reads as float4 stay contiguous.
 */
static __device__ __forceinline__ int stage_at(int r, int c) { return r * 64 + (c ^ 4 * (r & 7)); }

/* The warp's mma accumulator fragments (rows 2t, 2t + 1 of each 8-row block, columns g, g + 8
 * of each 16-column block; PTX ISA "mma.m16n8k16" fragment C of y^T) into its stage, row-major
 * at stage_at(). */
template <int MB8>
static __device__ __forceinline__ void stage_fragments(const float (&acc)[MB8][4][4], float *stage,
                                                       int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int tb = 0; tb < MB8; ++tb) {
        const int m0 = tb * 8 + 2 * t, m1 = m0 + 1;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int c0 = 2 * w * 8 + g, c1 = c0 + 8;
            stage[stage_at(m0, c0)] = acc[tb][w][0];
            stage[stage_at(m1, c0)] = acc[tb][w][1];
            stage[stage_at(m0, c1)] = acc[tb][w][2];
            stage[stage_at(m1, c1)] = acc[tb][w][3];
        }
    }
}

template <int MB8>
static __device__ __forceinline__ void w4a16_splitk_flush_staged(
    const float (&acc)[MB8][4][4], float *stage, const float *__restrict__ bias,
    __half *__restrict__ y, float *__restrict__ ws, unsigned *__restrict__ counters, int M, int N,
    int nt, int S, bool first, int lane)
{
    stage_fragments<MB8>(acc, stage, lane);
    __syncwarp();
    const bool add_bias = !counters && first && bias; /* deferred: slice 0 adds the bias */
    for (int e = lane; e < M * 16; e += K_WARP) {
        const int r = e / 16, c = (e % 16) * 4;
        float4 v = *reinterpret_cast<const float4 *>(stage + stage_at(r, c));
        if (add_bias) v = add_bias4(v, bias + nt * 64 + c);
        k_red_add_v4(ws + (size_t)r * N + nt * 64 + c, v);
    }
    if (!counters) return; /* deferred split-K (k_w4a16_linear_acc): the consumer finishes */
    /* the warp's adds, then one acq_rel arrival: release orders every lane's adds before the
     * counter moves (the warp barrier puts them before lane 0's atomic, and release is
     * cumulative), acquire lets the last slice see every other slice's adds. One atomic round
     * trip instead of __threadfence + atomicAdd + __threadfence: 4.93 -> 4.66 us per call on
     * 4096 x 4096 in `bench kernel floor` (H200). PTX ISA "Memory Consistency Model" (release
     * and acquire patterns); CUTLASS's semaphore uses the same barrier + release pattern. */
    __syncwarp();
    unsigned prev = 0;
    if (lane == 0) prev = k_atom_add_acq_rel(counters + nt, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != (unsigned)S - 1) return;
    __syncwarp(); /* lane 0's acquire before every lane's reads */
    for (int e = lane; e < M * 16; e += K_WARP)
        splitk_finish4(ws, y, bias, e / 16, nt * 64 + (e % 16) * 4, N);
    if (lane == 0) atomicExch(counters + nt, 0u);
}

/*
 * The split-K flush of v5 with the block pre-sum (PS): the 4 warps of the block hold partial
 * sums of the same n-tile (4 slices); each stages its fragments as w4a16_splitk_flush_staged
 * does (stage0 + warp * rows*64, same swizzle), the block sums the 4 stages per 4 columns and
 * sends one vector reduction each, then thread 0 arrives once at the n-tile's counter (arrivals:
 * the number of blocks per n-tile) with acq_rel after the block barrier (CUTLASS's semaphore
 * pattern); the last block writes y and re-zeroes. Every warp of the block must call it.
 */
template <int MB8>
static __device__ __forceinline__ void w4a16_splitk_flush_presum(
    const float (&acc)[MB8][4][4], float *stage0, const float *__restrict__ bias,
    __half *__restrict__ y, float *__restrict__ ws, unsigned *__restrict__ counters, int M, int N,
    int nt, int arrivals, bool first, int tid, int warp, int lane)
{
    constexpr int ROWS = 8 * MB8, WARPS = 4, T = WARPS * K_WARP;
    __shared__ unsigned last_block;
    float *stage = stage0 + warp * ROWS * 64;
    stage_fragments<MB8>(acc, stage, lane);
    __syncthreads();
    for (int e = tid; e < M * 16; e += T) {
        const int r = e / 16, c = (e % 16) * 4;
        float4 v = *reinterpret_cast<const float4 *>(stage0 + stage_at(r, c));
#pragma unroll
        for (int w = 1; w < WARPS; ++w) {
            const float4 u = *reinterpret_cast<const float4 *>(stage0 + w * ROWS * 64 + stage_at(r, c));
            v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
        }
        if (!counters && first && bias) v = add_bias4(v, bias + nt * 64 + c);
        k_red_add_v4(ws + (size_t)r * N + nt * 64 + c, v);
    }
    if (!counters) return; /* deferred split-K (k_w4a16_linear_acc): the consumer finishes */
    __syncthreads(); /* every thread's adds before thread 0's release */
    if (tid == 0) last_block = k_atom_add_acq_rel(counters + nt, 1u) == (unsigned)arrivals - 1;
    __syncthreads(); /* thread 0's acquire before every thread's reads */
    if (!last_block) return;
    for (int e = tid; e < M * 16; e += T)
        splitk_finish4(ws, y, bias, e / 16, nt * 64 + (e % 16) * 4, N);
    if (tid == 0) atomicExch(counters + nt, 0u);
}

/*
 * Transposed product, so that small M wastes no tensor-core work: y^T[n, m] = W^T[n, k] x^T[k, m]
 * with mma m16n8k16 where A = W^T (16 output columns x 16 k) and B = x^T (16 k x 8 tokens).
 * The A fragment of W^T for columns {2w*8 + g, (2w+1)*8 + g} (g = lane/4) is exactly what the
 * DESIGN 4.1 word w of this lane dequantises to: {b0 of sub-tile 2w, b0 of 2w+1, b1 of 2w,
 * b1 of 2w+1} (PTX ISA "mma.m16n8k16" fragments A and B), so one 16-byte load per lane feeds
 * 4 mma per 8 tokens instead of 8.
 *
 * Block (slice s, n-group): k-tiles [s*kc, s*kc + kc) of n-tiles ng*WARPS + warp. The block
 * stages the activation slice x[0 .. 8*MB8)[k range] in shared memory once (cp.async, 16-byte
 * chunks swizzled so ldmatrix is conflict-free; rows >= M zero-filled), each warp its n-tile's
 * scale and zero rows; then each warp streams its kc contiguous packed tiles through an 8-deep
 * cp.async ring of 16 bytes per lane (each lane copies exactly its own fragments) and
 * dequantises in registers. SCALE_AFTER (MB8 <= 2): the mma runs on the exact integers q - z
 * and the group's fp32 sums are scaled once per group (fewer instructions per tile, more
 * accurate); otherwise the fp16 weight (q - z) * s goes into the mma. Partial sums go to the
 * fp32 workspace with atomics; the slice that arrives last at an n-tile's counter writes y.
 */
template <int MB8, bool SCALE_AFTER>
static __global__ void __launch_bounds__(v2::WARPS *K_WARP, v2::MIN_BLOCKS<MB8>)
w4a16_v2_decode_kernel(const __half *__restrict__ x,        /* [M, K] */
                       const uint4 *__restrict__ qweight,   /* [N/64][K/16] tiles of 32 x 16 B */
                       const uint4 *__restrict__ qzeros,    /* [N/64][K/G] rows of 2 x 16 B */
                       const uint4 *__restrict__ scales,    /* [N/64][K/G] rows of 8 x 16 B */
                       const float *__restrict__ bias,      /* [N] or NULL */
                       __half *__restrict__ y,              /* [M, N] */
                       float *__restrict__ ws,              /* [M, N] fp32, zero on entry/exit */
                       unsigned *__restrict__ counters,     /* [N/64], zero on entry/exit */
                       int M, int N, int K, int G, int kc, int S)
{
    constexpr int ROWS = 8 * MB8;
    extern __shared__ __align__(128) unsigned char k_smem[];
    const int tid = threadIdx.x, lane = tid % K_WARP, warp = tid / K_WARP;
    const int KT = K / 16, NT = N / 64, GT = G / 16, KG = K / G;
    const int s = blockIdx.x % S, nt = (blockIdx.x / S) * v2::WARPS + warp;
    const bool active = nt < NT;
    const int k_a = s * kc, kc_eff = min(kc, KT - k_a);
    const int g_a = k_a / GT, n_g = (kc_eff + GT - 1) / GT;
    const int row_bytes = kc * 32; /* one staged activation row: kc k-tiles of 16 fp16 */

    unsigned char *xs = k_smem;                                   /* [ROWS][kc*16] fp16 */
    uint4 *ring = reinterpret_cast<uint4 *>(xs + ROWS * row_bytes) + warp * v2::STAGES * K_WARP;
    unsigned char *sz = xs + ROWS * row_bytes + v2::RING_BYTES +
                        warp * ((kc + GT - 1) / GT) * v2::SZ_BYTES; /* [n_g][160 B] */

    /* group 0: activation slice (all threads), this warp's scales/zeros, tile 0 */
    for (int id = tid; id < ROWS * kc * 2; id += v2::WARPS * K_WARP) {
        const int r = id / (kc * 2), c = id % (kc * 2);
        const bool ok = r < M && c < kc_eff * 2;
        const __half *src = ok ? x + (size_t)r * K + (size_t)k_a * 16 + c * 8 : x;
        k_cp_async16(xs + r * row_bytes + ((c ^ (r & 7)) * 16), src, ok ? 16 : 0);
    }
    const uint4 *qw = qweight + ((size_t)nt * KT + k_a) * K_WARP + lane;
    if (active) {
        for (int id = lane; id < n_g * 10; id += K_WARP) {
            const int g = id / 10, part = id % 10;
            const size_t row = (size_t)nt * KG + g_a + g;
            const uint4 *src = part < 8 ? scales + row * 8 + part : qzeros + row * 2 + (part - 8);
            k_cp_async16(sz + g * v2::SZ_BYTES + part * 16, src, 16);
        }
        k_cp_async16(&ring[lane], qw, 16);
    }
    k_cp_async_commit();
#pragma unroll
    for (int u = 1; u < v2::STAGES - 1; ++u) {
        if (active && u < kc_eff) k_cp_async16(&ring[u * K_WARP + lane], qw + (size_t)u * K_WARP, 16);
        k_cp_async_commit();
    }

    /* acc[tb][w][c]: D fragment of token block tb and column pair w: c0,c1 = column 2w*8+g,
     * tokens tb*8 + 2t, +1; c2,c3 = column (2w+1)*8+g, same tokens (t = lane%4). */
    float acc[MB8][4][4], gacc[SCALE_AFTER ? MB8 : 1][4][4];
#pragma unroll
    for (int tb = 0; tb < MB8; ++tb)
#pragma unroll
        for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                acc[tb][w][c] = 0.0f;
                if (SCALE_AFTER) gacc[tb][w][c] = 0.0f;
            }

    k_w4_group grp;
    float sf[8]; /* this lane's scales as fp32 (SCALE_AFTER) */
    int slot = 0, g_left = 0;
    const unsigned char *gz = sz;
    for (int i = 0; i < kc_eff; ++i) {
        const int ahead = i + v2::STAGES - 1;
        if (active && ahead < kc_eff)
            k_cp_async16(&ring[((slot + v2::STAGES - 1) % v2::STAGES) * K_WARP + lane],
                         qw + (size_t)ahead * K_WARP, 16);
        k_cp_async_commit();
        k_cp_async_wait<v2::STAGES - 1>(); /* this thread's copies of tile i (and group 0) landed */
        if (i == 0) {
            __syncthreads(); /* everyone's activation chunks landed */
            if (!active) return;
        }
        if (--g_left <= 0) { /* a new group starts (i % GT == 0) without a division */
            if (SCALE_AFTER && i > 0) {
#pragma unroll
                for (int tb = 0; tb < MB8; ++tb)
#pragma unroll
                    for (int w = 0; w < 4; ++w)
#pragma unroll
                        for (int c = 0; c < 4; ++c) {
                            acc[tb][w][c] = fmaf(sf[2 * w + c / 2], gacc[tb][w][c], acc[tb][w][c]);
                            gacc[tb][w][c] = 0.0f;
                        }
            }
            k_w4_group_load(grp, reinterpret_cast<const uint32_t *>(gz + 128)[lane / 4],
                            reinterpret_cast<const uint4 *>(gz)[lane / 4]);
            if (SCALE_AFTER) {
#pragma unroll
                for (int j = 0; j < 8; ++j) sf[j] = __low2float(grp.s[j]);
            }
            gz += v2::SZ_BYTES;
            g_left = GT;
        }
        /* B fragments (x^T, 16 k x 8 tokens) of each token block, from the staged slice */
        uint32_t bx[MB8][2];
#pragma unroll
        for (int tb = 0; tb < MB8; ++tb) {
            const int r = tb * 8 + (lane & 7), c = i * 2 + ((lane >> 3) & 1);
            const uint32_t sa = (uint32_t)__cvta_generic_to_shared(xs + r * row_bytes + ((c ^ (r & 7)) * 16));
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                         : "=r"(bx[tb][0]), "=r"(bx[tb][1]) : "r"(sa));
        }
        const uint4 wv = ring[slot * K_WARP + lane];
        const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            uint32_t b[4];
            if (SCALE_AFTER) k_w4_dequant_word_int(words[w], grp, w, b);
            else k_w4_dequant_word(words[w], grp, w, b);
            const uint32_t a[4] = {b[0], b[2], b[1], b[3]};
#pragma unroll
            for (int tb = 0; tb < MB8; ++tb) {
                if (SCALE_AFTER) k_mma_16816(gacc[tb][w], a, bx[tb][0], bx[tb][1]);
                else k_mma_16816(acc[tb][w], a, bx[tb][0], bx[tb][1]);
            }
        }
        slot = (slot + 1) % v2::STAGES;
    }
    k_cp_async_wait<0>();
    if (!active || kc_eff < 1) return;
    if (SCALE_AFTER) {
#pragma unroll
        for (int tb = 0; tb < MB8; ++tb)
#pragma unroll
            for (int w = 0; w < 4; ++w)
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    acc[tb][w][c] = fmaf(sf[2 * w + c / 2], gacc[tb][w][c], acc[tb][w][c]);
    }

    w4a16_splitk_flush<MB8>(acc, bias, y, ws, counters, M, N, nt, S, lane);
}

// --- v5: decode, split-K slices, weights through registers -------------------------------------

namespace v5 {
/* warps per block, one n-tile each; at M > 16 eight warps share one activation slice, which
 * halves the slice reads and the split-K partial sums per weight byte */
template <int MB8> constexpr int WARPS = MB8 >= 4 ? 8 : 4;
constexpr int DEPTH = 8;        /* weight tiles in flight per lane, held in registers */
/* bytes of the staged activation slice at most: 16 KB (M <= 8) or 32 KB (M <= 16) holds 64
 * k-tiles per slice. At M = 16 a 16 KB slice meant twice the slices, each flushing M x 64
 * columns of fp32 adds (70B gate_up 100.6 -> 89.9 us with 32 KB on the H200; M <= 8 lost 2-3 %
 * there with 32 KB, so it keeps 16 KB) */
template <int MB8> constexpr int X_BUDGET = MB8 == 1 ? 16384 : MB8 == 2 ? 32768 : MB8 == 4 ? 131072 : 196608;
constexpr int SZ_BYTES = 160;   /* one group of one n-tile: 128 B scales + 32 B zero words */
/* resident blocks per SM the register allocation must allow: M <= 8 4 x 4 warps x 8 tiles x
 * 512 B = 64 KB of weights in flight per SM (at 133 registers, 3 blocks, the 70B layers ran
 * 4-9 % slower on the H200), M <= 16 3 blocks (48 KB); the cp.async ring (v6) keeps the tiles
 * in shared memory and leaves registers for 6 / 4 blocks */
template <int MB8, bool RING> constexpr int MIN_BLOCKS = RING ? (MB8 == 1 ? 6 : 4) : MB8 == 1 ? 4 : MB8 == 2 ? 3 : 1;
/* M > 16 (MB8 >= 4): the flush stage [8*MB8][64] fp32 per warp (32 / 64 KB per block) is laid
 * over the activation slice and the scale/zero rows once every warp of the block is past its
 * tile loop, instead of taking shared memory of its own */
template <int MB8, bool RING> constexpr bool STAGE_OVER_X = !RING && MB8 >= 4;
} // namespace v5

/* acc += s * gacc per column (SCALE_AFTER: the group's exact-integer sums times its scales,
 * fp32), then gacc = 0 when reset. sraw: the lane's 8 fp16 scales, column pair w = {2w, 2w+1}. */
template <int MB8>
static __device__ __forceinline__ void v5_scale_group(float (&acc)[MB8][4][4],
                                                      float (&gacc)[MB8][4][4], uint4 sraw,
                                                      bool reset)
{
    const uint32_t sw[4] = {sraw.x, sraw.y, sraw.z, sraw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const float2 sf = __half22float2(k_u32_as_half2(sw[w]));
#pragma unroll
        for (int tb = 0; tb < MB8; ++tb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc[tb][w][e] = fmaf(e < 2 ? sf.x : sf.y, gacc[tb][w][e], acc[tb][w][e]);
                if (reset) gacc[tb][w][e] = 0.0f;
            }
    }
}

/*
 * Same decomposition and product as v2 (split-K slices x 4 n-tiles per block, transposed mma
 * with the weights as the A operand, activation slice staged once per block, fp32 atomics into
 * the workspace, the last slice writes y), with a leaner tile loop:
 *   - the loop is unrolled by DEPTH, so ring slots, activation addresses and (for GT <= DEPTH,
 *     GT | DEPTH) group boundaries are compile-time: no per-tile bookkeeping;
 *   - weights: RING = false: each lane loads its own 16 bytes of a tile straight into registers
 *     (ld.global.nc; no lane reads another lane's bytes), DEPTH tiles ahead; the load that
 *     refills a register slot is ordered after the dequantisation that read it (a fake register
 *     dependency), so the compiler needs no register rotation that would wait on the load.
 *     RING = true: the same through a per-warp cp.async ring in shared memory (v2's pipeline).
 *   - Programmatic Dependent Launch (sm_90): the constant data (weights of the first tiles, this
 *     slice's scales and zeros) is requested before griddepcontrol.wait, so it streams while the
 *     previous kernel in the stream finishes; activations, workspace and y are touched only
 *     after it (PTX ISA "griddepcontrol"; CUDA guide "Programmatic Dependent Launch").
 * GTC: tiles per group when GT divides DEPTH (1, 2, 4, 8); 0 when GT is a multiple of DEPTH.
 * PS (block pre-sum, M <= 16, S % 4 == 0): the 4 warps of a block take 4 consecutive slices of
 * ONE n-tile instead of one slice of 4 n-tiles; the block stages the 4 slices' activations,
 * sums the warps' partial sums in shared memory and sends one set of reductions and one
 * counter arrival per block (S/4 per n-tile instead of S). Slices past K contribute zeros.
 */
template <int MB8, bool SCALE_AFTER, int GTC, bool RING, bool PS>
static __global__ void __launch_bounds__(v5::WARPS<MB8> *K_WARP, v5::MIN_BLOCKS<MB8, RING>)
w4a16_v5_decode_kernel(const __half *__restrict__ x,        /* [M, K] */
                       const uint4 *__restrict__ qweight,   /* [N/64][K/16] tiles of 32 x 16 B */
                       const uint4 *__restrict__ qzeros,    /* [N/64][K/G] rows of 2 x 16 B */
                       const uint4 *__restrict__ scales,    /* [N/64][K/G] rows of 8 x 16 B */
                       const float *__restrict__ bias,      /* [N] or NULL */
                       __half *__restrict__ y,              /* [M, N] */
                       float *__restrict__ ws,              /* [M, N] fp32, zero on entry/exit */
                       unsigned *__restrict__ counters,     /* [N/64], zero on entry/exit; NULL:
                                                               deferred, ws keeps the sums */
                       int M, int N, int K, int G, int kc, int S)
{
    constexpr int ROWS = 8 * MB8, D = v5::DEPTH;
    extern __shared__ __align__(128) unsigned char k_smem[];
    const int tid = threadIdx.x, lane = tid % K_WARP, warp = tid / K_WARP;
    const int KT = K / 16, NT = N / 64, GT = G / 16, KG = K / G;
    static_assert(!PS || (!RING && MB8 <= 2 && v5::WARPS<MB8> == 4), "pre-sum: v5 at M <= 16");
    constexpr int XS = PS ? v5::WARPS<MB8> : 1; /* slices staged per block */
    const int s = PS ? (blockIdx.x % (S / XS)) * XS + warp : blockIdx.x % S;
    const int nt = PS ? blockIdx.x / (S / XS) : (blockIdx.x / S) * v5::WARPS<MB8> + warp;
    const int k_a = s * kc, kc_eff = max(0, min(kc, KT - k_a)); /* both multiples of GT */
    const bool active = nt < NT && kc_eff > 0;
    const int g_a = k_a / GT, n_g = kc_eff / GT;
    const int k_b = (s - (PS ? warp : 0)) * kc, kc_b = max(0, min(XS * kc, KT - k_b)); /* the block's */
    const int row_bytes = XS * kc * 32; /* one staged activation row: XS*kc k-tiles of 16 fp16 */

    unsigned char *xs = k_smem;                                        /* [ROWS][kc*16] fp16 */
    uint4 *ring = reinterpret_cast<uint4 *>(xs + ROWS * row_bytes) + warp * D * K_WARP;
    unsigned char *sz = xs + ROWS * row_bytes + (RING ? v5::WARPS<MB8> * D * 512 : 0) +
                        warp * (kc / GT) * v5::SZ_BYTES; /* [n_g][160 B] */
    /* [ROWS][64] fp32: the flush; RING: in the warp's own ring, free once its last tile is read */
    static_assert(!RING || ROWS * 64 * 4 <= D * 512, "the flush stage fits in the ring");
    constexpr bool OVER_X = v5::STAGE_OVER_X<MB8, RING>;
    float *stage = RING     ? reinterpret_cast<float *>(ring)
                   : OVER_X ? reinterpret_cast<float *>(xs) + warp * ROWS * 64
                            : reinterpret_cast<float *>(xs + ROWS * row_bytes +
                                                        v5::WARPS<MB8> * (kc / GT) * v5::SZ_BYTES) +
                                  warp * ROWS * 64;

    /* 1. constant data: this warp's scales/zeros and its first tiles */
    const uint4 *qw = qweight + ((size_t)nt * KT + k_a) * K_WARP + lane;
    uint4 buf[RING ? 1 : D];
    if (active) {
        for (int id = lane; id < n_g * 10; id += K_WARP) {
            const int g = id / 10, part = id % 10;
            const size_t row = (size_t)nt * KG + g_a + g;
            const uint4 *src = part < 8 ? scales + row * 8 + part : qzeros + row * 2 + (part - 8);
            k_cp_async16(sz + g * v5::SZ_BYTES + part * 16, src, 16);
        }
        if constexpr (!RING) {
#pragma unroll
            for (int j = 0; j < D; ++j)
                if (j < kc_eff) buf[j] = k_ld_stream_v4(qw + (size_t)j * K_WARP);
        }
    }
    k_cp_async_commit(); /* group: scales/zeros */
    if constexpr (RING) { /* groups 1 .. D-1: tiles 0 .. D-2 */
#pragma unroll
        for (int j = 0; j < D - 1; ++j) {
            if (active && j < kc_eff) k_cp_async16(&ring[j * K_WARP + lane], qw + (size_t)j * K_WARP, 16);
            k_cp_async_commit();
        }
    }
    k_pdl_launch_dependents();
    k_pdl_wait(); /* the previous kernel's output (x) and its use of ws are complete */

    /* 2. the activation slice (all threads), swizzled for ldmatrix. Rows M .. ROWS-1 are not
     * written: in the transposed product each token row of x is its own column of D (one dot
     * product per element), so whatever they hold lands only in D columns the flush never reads
     * (at M = 1 this skips 7/8 of the staging) */
    const int x_rows = min(M, ROWS);
    for (int id = tid; id < x_rows * XS * kc * 2; id += v5::WARPS<MB8> * K_WARP) {
        const int r = id / (XS * kc * 2), c = id % (XS * kc * 2);
        const bool ok = r < M && c < kc_b * 2;
        const __half *src = ok ? x + (size_t)r * K + (size_t)k_b * 16 + c * 8 : x;
        k_cp_async16(xs + r * row_bytes + ((c ^ (r & 7)) * 16), src, ok ? 16 : 0);
    }
    k_cp_async_commit();
    k_cp_async_wait<0>(); /* RING: also tiles 0 .. D-2, which is what the first steps need */
    __syncthreads();
    /* OVER_X, PS: every warp meets the barrier before the flush */
    if (!active && !OVER_X && !PS) return;
    const int n_tiles = active ? kc_eff : 0;

    float acc[MB8][4][4], gacc[SCALE_AFTER ? MB8 : 1][4][4];
#pragma unroll
    for (int tb = 0; tb < MB8; ++tb)
#pragma unroll
        for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                acc[tb][w][c] = 0.0f;
                if (SCALE_AFTER) gacc[tb][w][c] = 0.0f;
            }

    /* ldmatrix row address of this lane: row r7 (+8 per token block), 16-byte chunk
     * (2i + hb) ^ r7 of tile i; for i = c + j (c a multiple of D) that is 2c + ((2j + hb) ^ r7) */
    const int r7 = lane & 7, hb = (lane >> 3) & 1;
    const uint32_t xa = (uint32_t)__cvta_generic_to_shared(xs + r7 * row_bytes + (PS ? warp * kc * 32 : 0));
    uint32_t xo[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) xo[j] = (uint32_t)(((2 * j + hb) ^ r7) * 16);

    k_w4_group grp;
    uint4 sraw = make_uint4(0, 0, 0, 0); /* this lane's 8 fp16 scales of the current group */
    const unsigned char *gz = sz;
    int g_left = 0; /* GTC == 0: tiles left in the current group */
    for (int c = 0; c < n_tiles; c += D) {
        const uint4 *qn = qw + (size_t)(c + (RING ? D - 1 : D)) * K_WARP; /* refills start here */
        const uint32_t xc = xa + (uint32_t)(c * 32);
#pragma unroll
        for (int j = 0; j < D; ++j) {
            const int i = c + j;
            if (i >= kc_eff) break;
            if constexpr (RING) { /* refill the slot freed one step ago, then wait for tile i */
                if (i + D - 1 < kc_eff)
                    k_cp_async16(&ring[((j + D - 1) % D) * K_WARP + lane], qn + j * K_WARP, 16);
                k_cp_async_commit();
                k_cp_async_wait<D - 1>();
            }
            bool new_group;
            if (GTC) new_group = j % (GTC ? GTC : 1) == 0;
            else {
                new_group = j == 0 && g_left == 0;
                if (j == 0) g_left = (g_left == 0 ? GT : g_left) - D;
            }
            if (new_group) {
                if constexpr (SCALE_AFTER) {
                    if (i > 0) v5_scale_group<MB8>(acc, gacc, sraw, true);
                }
                sraw = reinterpret_cast<const uint4 *>(gz)[lane / 4];
                k_w4_group_load(grp, reinterpret_cast<const uint32_t *>(gz + 128)[lane / 4], sraw);
                gz += v5::SZ_BYTES;
            }
            uint32_t bx[MB8][2];
#pragma unroll
            for (int tb = 0; tb < MB8; ++tb) {
                const uint32_t sa = xc + (uint32_t)(tb * 8 * row_bytes) + xo[j & 3] + (uint32_t)((j >> 2) * 128);
                asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                             : "=r"(bx[tb][0]), "=r"(bx[tb][1]) : "r"(sa));
            }
            const uint4 wv = RING ? ring[j * K_WARP + lane] : buf[RING ? 0 : j];
            const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
            uint32_t a[4][4];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                uint32_t b[4];
                if (SCALE_AFTER) k_w4_dequant_word_int(words[w], grp, w, b);
                else k_w4_dequant_word(words[w], grp, w, b);
                a[w][0] = b[0]; a[w][1] = b[2]; a[w][2] = b[1]; a[w][3] = b[3];
            }
            if constexpr (!RING) {
                /* refill slot j: after the dequant read it (the load takes the dequantised
                 * registers as inputs, so it cannot be hoisted above them) */
                if (i + D < kc_eff) buf[j] = k_ld_stream_v4_after(qn + j * K_WARP, a);
            }
#pragma unroll
            for (int w = 0; w < 4; ++w)
#pragma unroll
                for (int tb = 0; tb < MB8; ++tb) {
                    if (SCALE_AFTER) k_mma_16816(gacc[tb][w], a[w], bx[tb][0], bx[tb][1]);
                    else k_mma_16816(acc[tb][w], a[w], bx[tb][0], bx[tb][1]);
                }
        }
    }
    if constexpr (RING) {
        k_cp_async_wait<0>();
        __syncwarp(); /* every lane has read its last ring slot before the stage overwrites it */
    }
    if constexpr (SCALE_AFTER) v5_scale_group<MB8>(acc, gacc, sraw, false);
    if constexpr (OVER_X) {
        __syncthreads(); /* no warp reads the activation slice or the scale rows any more */
        if (!active) return;
    }
    if constexpr (PS)
        w4a16_splitk_flush_presum<MB8>(acc, stage - warp * ROWS * 64, bias, y, ws, counters, M, N,
                                       nt, S / XS, s == warp, tid, warp, lane);
    else
        w4a16_splitk_flush_staged<MB8>(acc, stage, bias, y, ws, counters, M, N, nt, S, s == 0,
                                       lane);
}

// --- v4: decode, stream-K over warps --------------------------------------------------------------

namespace v4 {
constexpr int WARPS = 4;  /* warps per block: small blocks let the grid tile the SMs evenly */
constexpr int STAGES = 8; /* tiles in flight per warp: 8 x 512 B, ~96 KB in flight per SM */
constexpr int MIN_CHUNK = 16; /* fewest tiles per warp: below this the flush dominates */
/* shared memory per warp: per stage 32 lanes x (16 B weights + 16 B scales + 4 B zero word) */
constexpr int SMEM_PER_WARP = STAGES * K_WARP * (16 + 16 + 4);
constexpr int SMEM_BYTES = WARPS * SMEM_PER_WARP;
} // namespace v4

/* MB = number of 16-row blocks of M handled per tile (1: M <= 16, 2: M <= 32, 4: M <= 64). */
template <int MB>
static __global__ void __launch_bounds__(v4::WARPS *K_WARP)
w4a16_v4_streamk_kernel(const __half *__restrict__ x,        /* [M, K] */
                       const uint4 *__restrict__ qweight,   /* [N/64][K/16] tiles of 32 x 16 B */
                       const uint32_t *__restrict__ qzeros, /* [N/64][K/G][8] words */
                       const uint4 *__restrict__ scales,    /* [N/64][K/G][64] fp16 = 8 x 16 B */
                       const float *__restrict__ bias,      /* [N] or NULL */
                       __half *__restrict__ y,              /* [M, N] */
                       float *__restrict__ ws,              /* [M, N] fp32, zero on entry/exit */
                       unsigned *__restrict__ counters,     /* [N/64], zero on entry/exit */
                       int M, int N, int K, int G, int chunk)
{
    extern __shared__ __align__(128) unsigned char k_smem[];
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    const int KT = K / 16, GT = G / 16;
    const int T = KT * (N / 64);
    const int start = (blockIdx.x * v4::WARPS + warp) * chunk;
    if (start >= T) return;
    const int end = min(T, start + chunk);

    unsigned char *base = k_smem + warp * v4::SMEM_PER_WARP;
    uint4 *ring_w = reinterpret_cast<uint4 *>(base);                         /* [STAGES][32] */
    uint4 *ring_s = ring_w + v4::STAGES * K_WARP;                            /* [STAGES][32] */
    uint32_t *ring_z = reinterpret_cast<uint32_t *>(ring_s + v4::STAGES * K_WARP);

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
    for (int u = 0; u < v4::STAGES - 1; ++u) {
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
        const int ahead = i + v4::STAGES - 1;
        if (ahead < end) issue(ahead, (slot + v4::STAGES - 1) % v4::STAGES);
        k_cp_async_commit();
        k_cp_async_wait<v4::STAGES - 1>(); /* tile i's group has landed (own lane's bytes) */

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
        slot = (slot + 1) % v4::STAGES;

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

// --- v7: Hopper GEMM, wgmma on a weight tile dequantised into shared memory --------------------

/*
 * v7 (sm_90a only): y[M, N] = x . W for M > 64 (prompts), on Hopper's warpgroup MMA.
 *
 * Block tile 128 tokens x 128 columns, k in steps of 64, two warpgroups of 4 warps; warpgroup
 * wg owns tokens wg*64 .. +63 and all 128 columns (wgmma.m64n128k16, 64 fp32 accumulators per
 * thread). Per step the block copies (cp.async, 3-stage ring) the activation tile [128][64]
 * fp16 in the 128-byte-swizzled K-major layout wgmma reads, and the 8 packed 512-byte tiles of
 * W (DESIGN 4.1) with their group's scales and zeros, one tile per warp. Each warp dequantises
 * its tile in registers (k_w4_dequant_word: the mma.sync B fragments) and writes it with
 * stmatrix into a [128 n][64 k] fp16 buffer in the same swizzled K-major layout; the fragment
 * of sub-tile j, half h is the 8 x 8 matrix of rows n = j*8 .. +7, columns k = h*8 .. +7 in
 * ldmatrix order, which is what stmatrix stores. Two such buffers alternate, so the warps
 * dequantise step s + 1 while the tensor cores run step s asynchronously (wgmma.mma_async,
 * waited after the dequantisation). Prompts too short to fill the GPU with 128 x 128 tiles
 * split K (gridDim.z slices): fp32 reductions into the workspace, the last slice of a tile
 * adds the bias and writes y (as v2 / v5).
 *
 * Why: mma.sync tops out near 250 TFLOP/s in v3 on the H200, and dequant + cuBLAS writes and
 * reads the whole fp16 weight per call (~0.5x of cuBLAS fp16 at M = 65..256). wgmma reads both
 * operands from shared memory, so the weight is dequantised once per block and never leaves
 * the SM. Layouts and descriptors: PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-
 * Accumulate" (9.7.15: matrix descriptor, 128-byte swizzling mode, K-major canonical layouts),
 * https://docs.nvidia.com/cuda/parallel-thread-execution/#asynchronous-warpgroup-level-matrix-instructions
 */
namespace v7 {
constexpr int BM = 128;                /* token rows per block: 2 warpgroups x m64 */
constexpr int BN = 128;                /* columns per block: 2 packed n-tiles */
constexpr int BK = 64;                 /* k per step: 4 packed k-tiles = one 128-byte smem row */
constexpr int STAGES = 3;              /* cp.async ring */
constexpr int THREADS = 256;           /* warp w dequantises packed tile (kt = w % 4, nt = w / 4) */
constexpr int A_BYTES = BM * BK * 2;   /* 16 KB, [BM][64] fp16, 128-byte swizzle */
constexpr int B_BYTES = BN * BK * 2;   /* 16 KB, [BN][64] fp16, 128-byte swizzle */
constexpr int P_BYTES = 8 * 512;       /* the 8 packed tiles as stored */
constexpr int SZ_BYTES = 8 * 160;      /* per warp: its group's 64 scales (128 B) + 8 zero words */
constexpr int SMEM_BYTES = STAGES * A_BYTES + 2 * B_BYTES + STAGES * (P_BYTES + SZ_BYTES) +
                           1024;       /* + slack to align the swizzled tiles to 1024 bytes */
constexpr int SPLIT_MAX_M = 2 * BM;    /* split-K only for 1-2 row blocks (counters: N/64) */
} // namespace v7

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define K_V7_WGMMA 1
#else
#define K_V7_WGMMA 0
#endif

#if K_V7_WGMMA
/* wgmma shared-memory matrix descriptor (PTX ISA 9.7.15.5.1): start address >> 4 (bits 0-13),
 * leading byte offset (unused by swizzled K-major layouts: 1), stride byte offset 1024 >> 4
 * (bits 32-45: from one group of 8 rows of 128 bytes to the next), 128-byte swizzle (bits
 * 62-63 = 1). The tile must start on a 1024-byte boundary; moving along k by 16 fp16 inside
 * the 128-byte rows is +32 bytes on the start address (+2 in the descriptor). */
static __device__ __forceinline__ uint64_t v7_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}

/* d[64] += A[64 x 16] . B[16 x 128] (PTX "wgmma.mma_async ... m64n128k16.f32.f16.f16", both
 * from shared memory through descriptors, K-major, scale-d = 1). d: the warpgroup's 64 x 128
 * fp32 tile, thread (warp q, lane l) holds rows 16q + l/4 (+8), columns 8i + 2(l%4) (+1) as
 * d[4i .. 4i+3]. Asynchronous: complete only after k_wgmma_wait. */
static __device__ __forceinline__ void k_wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db)
{
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(1));
}
static __device__ __forceinline__ void k_wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void k_wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void k_wgmma_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Orders this thread's generic-proxy shared-memory writes (st.shared, stmatrix, completed
 * cp.async) before later async-proxy reads (wgmma), PTX ISA "membar / fence" proxy fences. */
static __device__ __forceinline__ void k_fence_proxy_async(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* Keeps the compiler from moving accesses of the accumulators across the wgmma fence / wait. */
static __device__ __forceinline__ void v7_pin(float (&d)[64])
{
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

/* kps: 64-k steps per split-K slice (blockIdx.z); ws / counters used only when gridDim.z > 1. */
static __global__ void __launch_bounds__(v7::THREADS, 2)
w4a16_v7_kernel(const __half *__restrict__ x,      /* [M, K] */
                const uint4 *__restrict__ qweight, /* [N/64][K/16] tiles of 512 B */
                const uint4 *__restrict__ qzeros,  /* [N/64][K/G] rows of 32 B */
                const uint4 *__restrict__ scales,  /* [N/64][K/G] rows of 128 B */
                const float *__restrict__ bias,    /* [N] or NULL */
                __half *__restrict__ y,            /* [M, N] */
                float *__restrict__ ws, unsigned *__restrict__ counters, int M, int N, int K,
                int G, int kps)
{
#if K_V7_WGMMA
    extern __shared__ unsigned char v7_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(v7_smem_raw);
    unsigned char *smem = v7_smem_raw + ((1024 - (raw & 1023)) & 1023);
    unsigned char *const sA = smem;                                  /* STAGES x A_BYTES */
    unsigned char *const sB = sA + v7::STAGES * v7::A_BYTES;         /* 2 x B_BYTES */
    unsigned char *const sP = sB + 2 * v7::B_BYTES;                  /* STAGES x P_BYTES */
    unsigned char *const sZ = sP + v7::STAGES * v7::P_BYTES;         /* STAGES x SZ_BYTES */

    const int tid = threadIdx.x, lane = tid % K_WARP, warp = tid / K_WARP, wg = warp / 4;
    const int KT = K / 16, NT = N / 64, n_groups = K / G, KS = (K + v7::BK - 1) / v7::BK;
    const int m0 = blockIdx.y * v7::BM, n0 = blockIdx.x * v7::BN;
    const int ks0 = blockIdx.z * kps, nsteps = min(KS, ks0 + kps) - ks0;
    const int wkt = warp % 4, wnt = warp / 4, nt_g = n0 / 64 + wnt;

    /* Copy step i of this slice into stage s. Rows past M and k past K are zero-filled; the
     * packed tile of a warp past K or N is not copied (its dequantised rows are zeros). */
    auto load = [&](int i, int s) {
        const int k0 = (ks0 + i) * v7::BK;
        unsigned char *a = sA + s * v7::A_BYTES;
#pragma unroll
        for (int c = 0; c < v7::BM * v7::BK * 2 / 16 / v7::THREADS; ++c) { /* 4 x 16 B */
            const int id = tid + c * v7::THREADS, row = id / 8, ch = id % 8;
            const int gm = m0 + row, gk = k0 + ch * 8;
            const bool ok = gm < M && gk < K;
            k_cp_async16(a + row * 128 + ((ch ^ (row & 7)) << 4),
                         ok ? (const void *)(x + (size_t)gm * K + gk) : (const void *)x,
                         ok ? 16 : 0);
        }
        const int kt_g = (ks0 + i) * 4 + wkt;
        if (nt_g < NT && kt_g < KT) {
            k_cp_async16(sP + s * v7::P_BYTES + warp * 512 + lane * 16,
                         qweight + ((size_t)nt_g * KT + kt_g) * 32 + lane, 16);
            const size_t row = (size_t)nt_g * n_groups + (size_t)kt_g * 16 / G;
            unsigned char *z = sZ + s * v7::SZ_BYTES + warp * 160;
            if (lane < 8) k_cp_async16(z + lane * 16, scales + row * 8 + lane, 16);
            else if (lane < 10) k_cp_async16(z + lane * 16, qzeros + row * 2 + (lane - 8), 16);
        }
    };

    /* Dequantise this warp's packed tile of step i (stage s) into buffer b. */
    auto dequant = [&](int i, int s, int b) {
        const int kt_g = (ks0 + i) * 4 + wkt;
        uint32_t r[4][4];
        if (nt_g < NT && kt_g < KT) {
            const uint4 word = *reinterpret_cast<const uint4 *>(sP + s * v7::P_BYTES + warp * 512 + lane * 16);
            const unsigned char *z = sZ + s * v7::SZ_BYTES + warp * 160;
            k_w4_group g;
            k_w4_group_load(g, *reinterpret_cast<const uint32_t *>(z + 128 + (lane / 4) * 4),
                            *reinterpret_cast<const uint4 *>(z + (lane / 4) * 16));
            k_w4_dequant_word(word.x, g, 0, r[0]);
            k_w4_dequant_word(word.y, g, 1, r[1]);
            k_w4_dequant_word(word.z, g, 2, r[2]);
            k_w4_dequant_word(word.w, g, 3, r[3]);
        } else {
#pragma unroll
            for (int w = 0; w < 4; ++w) r[w][0] = r[w][1] = r[w][2] = r[w][3] = 0u;
        }
        /* stmatrix of word w: matrix l/8 = (sub-tile j = 2w + (l/8)/2, k half h = (l/8)%2),
         * lane l addresses its row l%8: n = wnt*64 + j*8 + l%8, 16-byte chunk wkt*2 + h */
        const int mi = lane / 8, rr = lane % 8, h = mi % 2;
        unsigned char *bb = sB + b * v7::B_BYTES;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int n = wnt * 64 + (2 * w + mi / 2) * 8 + rr;
            k_stmatrix_x4(bb + n * 128 + (((wkt * 2 + h) ^ rr) << 4), r[w]);
        }
    };

    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < v7::STAGES - 1; ++s) {
        if (s < nsteps) load(s, s);
        k_cp_async_commit();
    }
    k_cp_async_wait<v7::STAGES - 2>();
    __syncwarp();
    dequant(0, 0, 0);
    k_fence_proxy_async();
    __syncthreads();

    const uint32_t a_base = (uint32_t)__cvta_generic_to_shared(sA) + wg * 64 * 128;
    const uint32_t b_base = (uint32_t)__cvta_generic_to_shared(sB);
    for (int i = 0; i < nsteps; ++i) {
        const int s = i % v7::STAGES, b = i & 1;
        v7_pin(d);
        k_wgmma_fence();
        const uint64_t da = v7_desc(a_base + s * v7::A_BYTES), db = v7_desc(b_base + b * v7::B_BYTES);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) k_wgmma_m64n128k16(d, da + 2 * kk, db + 2 * kk);
        k_wgmma_commit();
        /* stage (i - 1) % STAGES and buffer (i + 1) & 1 were read by step i - 1, complete */
        if (i + v7::STAGES - 1 < nsteps) load(i + v7::STAGES - 1, (i + v7::STAGES - 1) % v7::STAGES);
        k_cp_async_commit();
        k_cp_async_wait<v7::STAGES - 2>(); /* this thread's copies of step i + 1 landed */
        __syncwarp();                      /* ... and the warp's (scales / zeros lanes) */
        if (i + 1 < nsteps) dequant(i + 1, (i + 1) % v7::STAGES, b ^ 1);
        k_fence_proxy_async();
        k_wgmma_wait0();
        v7_pin(d);
        __syncthreads(); /* step i + 1's activations and dequantised tile are complete */
    }
    k_cp_async_wait<0>();

    /* Epilogue: thread (warp q of warpgroup wg, lane l) holds rows r0 = wg*64 + 16q + l/4 and
     * r0 + 8, columns 8i + 2(l%4), +1 (i = 0..15). */
    const int r0 = m0 + wg * 64 + (warp % 4) * 16 + lane / 4, r1 = r0 + 8;
    const int cbase = n0 + 2 * (lane % 4);
    if (gridDim.z == 1) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int c = cbase + 8 * i;
            if (c >= N) continue;
            const float b0 = bias ? bias[c] : 0.0f, b1 = bias ? bias[c + 1] : 0.0f;
            if (r0 < M)
                *reinterpret_cast<__half2 *>(y + (size_t)r0 * N + c) = __floats2half2_rn(d[4 * i] + b0, d[4 * i + 1] + b1);
            if (r1 < M)
                *reinterpret_cast<__half2 *>(y + (size_t)r1 * N + c) = __floats2half2_rn(d[4 * i + 2] + b0, d[4 * i + 3] + b1);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int c = cbase + 8 * i;
        if (c >= N) continue;
        if (r0 < M)
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(ws + (size_t)r0 * N + c),
                         "f"(d[4 * i]), "f"(d[4 * i + 1]) : "memory");
        if (r1 < M)
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(ws + (size_t)r1 * N + c),
                         "f"(d[4 * i + 2]), "f"(d[4 * i + 3]) : "memory");
    }
    __threadfence(); /* our adds are visible device-wide before the counter moves */
    __syncthreads();
    __shared__ unsigned last;
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(counters + tile, 1u) == gridDim.z - 1;
    __syncthreads();
    if (!last) return;
    __threadfence(); /* the last slice sees every other slice's adds */
    const int rows = min(v7::BM, M - m0), cols = min(v7::BN, N - n0);
    for (int e = tid; e < rows * (cols / 4); e += v7::THREADS)
        splitk_finish4(ws, y, bias, m0 + e / (cols / 4), n0 + (e % (cols / 4)) * 4, N);
    if (tid == 0) atomicExch(counters + tile, 0u);
#else
    (void)x; (void)qweight; (void)qzeros; (void)scales; (void)bias; (void)y; (void)ws;
    (void)counters; (void)M; (void)N; (void)K; (void)G; (void)kps;
#endif
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

/* K_ERR_WORKSPACE, logged under `who` with `what` (the variant's name), unless workspace is
 * non-NULL and holds k_w4a16_workspace_bytes(M, N) bytes; K_ERR_NONE otherwise. */
static int check_workspace(const char *who, const char *what, int M, int N, void *workspace,
                           size_t workspace_bytes)
{
    if (!workspace || workspace_bytes < k_w4a16_workspace_bytes(M, N)) {
        qs_log_error(who, "W4A16 %s M=%d N=%d: workspace %zu bytes at %p, need %zu", what, M, N,
                     workspace_bytes, workspace, k_w4a16_workspace_bytes(M, N));
        return K_ERR_WORKSPACE;
    }
    if ((uintptr_t)workspace % 16) { /* 16-byte vector reductions and reads */
        qs_log_error(who, "W4A16 %s: workspace at %p is not 16-byte aligned", what, workspace);
        return K_ERR_ARG;
    }
    return K_ERR_NONE;
}

/* Resident blocks per SM (at least 1) of kern (v2, v4, v5) launched with `threads` threads and
 * `smem` bytes of dynamic shared memory, after raising its dynamic shared-memory limit to
 * max_smem (above the default 48 KB). Both are per device: computed once per device and kept in
 * the caller's cache, one per instantiation (k_per_device). CUDA errors abort (K_CUDA_CHECK). */
template <typename Kern>
static int resident_blocks(int (&cache)[K_MAX_DEVICES], Kern kern, int threads, int smem,
                           int max_smem)
{
    return k_per_device(cache, [&](int) {
        K_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
        int b = 0;
        K_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kern, threads, smem));
        return std::max(b, 1);
    });
}

/* k-tiles per split-K slice (v2, v5): fill the resident block slots (blocks_per_sm x SMs) in
 * whole waves (a partial last wave would run the tail at a fraction of the bandwidth) with at
 * most kc_max k-tiles per slice; a multiple of unit. n_groups: blocks along N. */
static int splitk_slice(int KT, int n_groups, int blocks_per_sm, int kc_max, int unit)
{
    const long slots = (long)k_device_sm_count() * blocks_per_sm;
    int kc = kc_max;
    for (int waves = 1; waves <= 64; ++waves) {
        const long S_w = std::max(1L, slots * waves / n_groups);
        kc = (int)((KT + S_w - 1) / S_w);
        kc = (kc + unit - 1) / unit * unit;
        if (kc <= kc_max) break;
        kc = kc_max;
    }
    return kc;
}

/* Dynamic shared memory a v2 block may take on the current device: 200 KB, less where the
 * device offers less. */
static int v2_smem_max(void)
{
    return std::min(200 * 1024, k_smem_optin());
}

/* false (nothing launched) when even the smallest slice (whole groups) needs more shared memory
 * than a block may have: very large G, e.g. per-channel quantisation (G = K) */
template <int MB8, bool SCALE_AFTER>
static bool launch_v2_tb(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                         const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                         cudaStream_t stream)
{
    constexpr int ROWS = 8 * MB8;
    const int KT = K / 16, NT = N / 64, GT = G / 16;
    auto kern = w4a16_v2_decode_kernel<MB8, SCALE_AFTER>;
    /* kc: a multiple of lcm(8, GT) (whole groups; >= 4 k-tiles per row for the swizzle) */
    int unit = 8;
    while (unit % GT) unit += 8;
    const int kc_max = std::max(unit, (v2::X_BUDGET / (ROWS * 32)) / unit * unit);
    auto smem_for = [&](int kc) {
        return ROWS * kc * 32 + v2::RING_BYTES + v2::WARPS * ((kc + GT - 1) / GT) * v2::SZ_BYTES;
    };
    const int smem_max = v2_smem_max();
    if (smem_for(kc_max) > smem_max) return false;
    static int bps[K_MAX_DEVICES]; /* at the largest slice, per instantiation and device */
    const int blocks_per_sm =
        resident_blocks(bps, kern, v2::WARPS * K_WARP, smem_for(kc_max), smem_max);
    const int n_groups = (NT + v2::WARPS - 1) / v2::WARPS;
    const int kc = splitk_slice(KT, n_groups, blocks_per_sm, kc_max, unit);
    const int S = (KT + kc - 1) / kc;
    float *wsf = static_cast<float *>(ws);
    unsigned *counters = reinterpret_cast<unsigned *>(wsf + (size_t)M * N);
    static const bool verbose = getenv("QS_K_VERBOSE") != nullptr; /* launch shapes, for tuning */
    if (verbose)
        fprintf(stderr, "w4a16 v2<%d,%d> M=%d N=%d K=%d: kc=%d S=%d blocks=%d (%d/SM) smem=%d\n",
                MB8, (int)SCALE_AFTER, M, N, K, kc, S, n_groups * S, blocks_per_sm, smem_for(kc));
    kern<<<n_groups * S, v2::WARPS * K_WARP, smem_for(kc), stream>>>(x, qw, qz, sc, bias, y, wsf,
                                                                     counters, M, N, K, G, kc, S);
    K_LAUNCH_CHECK();
    return true;
}

/* v2 for M <= 64; false (nothing launched) when G is too large for its slices (above) */
static bool launch_v2(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                      const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                      cudaStream_t stream)
{
    if (M <= 8) return launch_v2_tb<1, true>(x, qw, qz, sc, bias, y, M, N, K, G, ws, stream);
    if (M <= 16) return launch_v2_tb<2, false>(x, qw, qz, sc, bias, y, M, N, K, G, ws, stream);
    if (M <= 32) return launch_v2_tb<4, false>(x, qw, qz, sc, bias, y, M, N, K, G, ws, stream);
    return launch_v2_tb<8, false>(x, qw, qz, sc, bias, y, M, N, K, G, ws, stream);
}

/* v5 for one instantiation; false (nothing launched) when even one unit of k-tiles needs more
 * shared memory than a block may have (large G: whole groups per slice; per-channel G = K).
 * defer: no counters, the sums stay in ws (k_w4a16_linear_acc).
 * When v5 sums the 4 warps of a block in shared memory first (PS, M <= 16 only): presum 0 never
 * (variant 5), 1 auto: at 9 <= M <= 16 wherever it fits, 2 wherever it fits (variant 8). Each
 * slice of an n-tile sends M x 16 vector reductions and one counter arrival, which serialise in
 * L2 when S is large; PS cuts both by 4 but stages 4 activation slices per block. H200, same
 * run (docs/BENCHMARKS.md): M = 16 4096 x 4096 10.41 -> 8.39 us, Llama-3-8B qkv 10.53 -> 8.82,
 * 70B tp 8 qkv 10.00 -> 6.59, o 8.85 -> 6.08, the rest within 0.5 %; at M = 1 it lost on 7 of
 * the 10 shapes it applies to (7B qkv 8.85 -> 14.29 us) and won 0.27 us on 4096 x 4096 only. */
template <int MB8, bool SCALE_AFTER, int GTC, bool RING>
static bool launch_v5_tb(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                         const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                         int presum, bool defer, cudaStream_t stream)
{
    constexpr int ROWS = 8 * MB8;
    constexpr bool CAN_PS = !RING && MB8 <= 2;
    const int KT = K / 16, NT = N / 64, GT = G / 16;
    auto kern = w4a16_v5_decode_kernel<MB8, SCALE_AFTER, GTC, RING, false>;
    auto kern_ps = w4a16_v5_decode_kernel<MB8, SCALE_AFTER, GTC, RING, CAN_PS>;
    const int unit = std::max(v5::DEPTH, GT); /* GT | DEPTH or DEPTH | GT: whole groups, whole unrolls */
    int kc_max = std::max(unit, (v5::X_BUDGET<MB8> / (ROWS * 32)) / unit * unit);
    constexpr bool OVER_X = v5::STAGE_OVER_X<MB8, RING>;
    auto smem_for = [&](int kc, int xs) {
        const int loop = ROWS * xs * kc * 32 + (RING ? v5::WARPS<MB8> * v5::DEPTH * 512 : 0) +
                         v5::WARPS<MB8> * (kc / GT) * v5::SZ_BYTES;
        const int stage = v5::WARPS<MB8> * ROWS * 64 * 4;
        return RING ? loop : OVER_X ? std::max(loop, stage) : loop + stage;
    };
    /* 220 KB of the 227 KB a block may use on sm_90; less where the device offers less */
    const int smem_max = std::min(220 * 1024, k_smem_optin());
    while (kc_max > unit && smem_for(kc_max, 1) > smem_max) kc_max -= unit; /* small G: many scale rows */
    if (smem_for(kc_max, 1) > smem_max) return false;
    static int bps[K_MAX_DEVICES]; /* at the largest slice, per instantiation and device */
    const int blocks_per_sm =
        resident_blocks(bps, kern, v5::WARPS<MB8> * K_WARP, smem_for(kc_max, 1), smem_max);
    const int n_groups = (NT + v5::WARPS<MB8> - 1) / v5::WARPS<MB8>;
    const int kc = splitk_slice(KT, n_groups, blocks_per_sm, kc_max, unit);
    const int S = (KT + kc - 1) / kc;
    float *wsf = static_cast<float *>(ws);
    /* deferred split-K: no counters; ws [M, N] keeps the sums for the consumer */
    unsigned *counters = defer ? nullptr : reinterpret_cast<unsigned *>(wsf + (size_t)M * N);
    static const bool verbose = getenv("QS_K_VERBOSE") != nullptr; /* launch shapes, for tuning */
    constexpr int XS = v5::WARPS<MB8>;
    /* pre-sum: S rounded up to whole blocks of XS slices, the slice no longer (trailing slices
     * past K are empty), the block's XS slices within the activation budget */
    if (CAN_PS && (presum == 2 || (presum == 1 && MB8 == 2)) && S >= 2) {
        const int S4 = (S + XS - 1) / XS * XS;
        const int kc4 = ((KT + S4 - 1) / S4 + unit - 1) / unit * unit;
        /* M <= 8 may stage twice the usual budget (4 blocks/SM x ~42 KB still fit) */
        if (kc4 * XS <= (MB8 == 1 ? 2 : 1) * kc_max && smem_for(kc4, XS) <= smem_max) {
            if (verbose)
                fprintf(stderr, "w4a16 v5<%d,%d,%d> pre-sum M=%d N=%d K=%d: kc=%d S=%d blocks=%d smem=%d pdl=%d\n",
                        MB8, (int)SCALE_AFTER, GTC, M, N, K, kc4, S4, NT * (S4 / XS), smem_for(kc4, XS),
                        (int)k_pdl_usable());
            static int ps_attr[K_MAX_DEVICES]; /* sets the opt-in shared-memory size, per device */
            (void)resident_blocks(ps_attr, kern_ps, v5::WARPS<MB8> * K_WARP, smem_for(kc4, XS), smem_max);
            k_launch_ex(kern_ps, dim3(NT * (S4 / XS)), dim3(v5::WARPS<MB8> * K_WARP), smem_for(kc4, XS),
                        stream, k_pdl_usable(), x, qw, qz, sc, bias, y, wsf, counters, M, N, K, G,
                        kc4, S4);
            return true;
        }
    }
    if (verbose)
        fprintf(stderr, "w4a16 v5<%d,%d,%d,ring %d> M=%d N=%d K=%d: kc=%d S=%d blocks=%d (%d/SM) smem=%d pdl=%d\n",
                MB8, (int)SCALE_AFTER, GTC, (int)RING, M, N, K, kc, S, n_groups * S, blocks_per_sm,
                smem_for(kc, 1), (int)k_pdl_usable());
    k_launch_ex(kern, dim3(n_groups * S), dim3(v5::WARPS<MB8> * K_WARP), smem_for(kc, 1), stream,
                k_pdl_usable(), x, qw, qz, sc, bias, y, wsf, counters, M, N, K, G, kc, S);
    return true;
}

/* v5 for G/16 in {1, 2, 4, 8} or a multiple of 8 whose slice fits in shared memory; false
 * (nothing launched) otherwise. */
template <int MB8, bool SCALE_AFTER, bool RING>
static bool launch_v5_g(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                        const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                        int presum, bool defer, cudaStream_t stream)
{
    switch (G / 16) {
    case 1: return launch_v5_tb<MB8, SCALE_AFTER, 1, RING>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
    case 2: return launch_v5_tb<MB8, SCALE_AFTER, 2, RING>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
    case 4: return launch_v5_tb<MB8, SCALE_AFTER, 4, RING>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
    default:
        if ((G / 16) % v5::DEPTH) return false;
        return launch_v5_tb<MB8, SCALE_AFTER, 0, RING>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
    }
}

static int launch_v4(const __half *x, const uint4 *qw, const uint32_t *qz, const uint4 *sc,
                     const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                     cudaStream_t stream)
{
    const int T = (K / 16) * (N / 64);
    static int bps[3][K_MAX_DEVICES]; /* occupancy per MB instantiation and device */
    const int mbi = M <= 16 ? 0 : M <= 32 ? 1 : 2;
    auto kern = mbi == 0 ? w4a16_v4_streamk_kernel<1>
              : mbi == 1 ? w4a16_v4_streamk_kernel<2> : w4a16_v4_streamk_kernel<4>;
    const int blocks_per_sm =
        resident_blocks(bps[mbi], kern, v4::WARPS * K_WARP, v4::SMEM_BYTES, v4::SMEM_BYTES);
    const long max_warps = (long)k_device_sm_count() * blocks_per_sm * v4::WARPS;
    int chunk = (int)((T + max_warps - 1) / max_warps);
    chunk = std::max(chunk, std::min(v4::MIN_CHUNK, T));
    const int warps = (T + chunk - 1) / chunk;
    const int blocks = (warps + v4::WARPS - 1) / v4::WARPS;
    float *wsf = static_cast<float *>(ws);
    unsigned *counters = reinterpret_cast<unsigned *>(wsf + (size_t)M * N);
    kern<<<blocks, v4::WARPS * K_WARP, v4::SMEM_BYTES, stream>>>(x, qw, qz, sc, bias, y, wsf,
                                                                 counters, M, N, K, G, chunk);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/* M <= 16 runs the exact-integer dequantisation with the scales applied per group too (167
 * registers, 3 blocks/SM, no spill): 70B gate_up at M = 16 96.5 -> 90.2 us, 70B down 52.4 ->
 * 49.4 us against the fp16 scale inside the dequantisation, same run on the H200.
 * 16 < M <= 64: 32 / 64 token rows, fp16 scale inside the dequantisation (the per-group fp32
 * sums would double the 64 / 128 accumulator registers), 8 warps per block (186 / 246
 * registers, no spill, 1 block/SM) sharing a 128 / 192 KB activation slice, so most layers run
 * in one wave with 2-6 split-K slices. On the H200, per Llama-2-7B layer: M = 17 85.9 -> 76.8
 * us and M = 64 178.4 -> 144.6 us against 4 warps per block with 64 / 96 KB slices; v2 / v4 /
 * dequant + cuBLAS took 2-3x longer (docs/BENCHMARKS.md).
 * false when nothing was launched (v5 cannot take G). */
template <bool RING>
static bool launch_v5_m(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                        const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                        int presum, bool defer, cudaStream_t stream)
{
    if (M <= 8) return launch_v5_g<1, true, RING>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
    if (M <= 16 || RING) return launch_v5_g<2, true, RING>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
    if (M <= 32) return launch_v5_g<4, false, false>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
    return launch_v5_g<8, false, false>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, defer, stream);
}

/* v5 by M; where it cannot take G (G/16 neither divides nor is a multiple of 8, or a slice of
 * whole groups does not fit), v2, else v4 (stream-K: a fixed 36 KB of shared memory, any G). */
template <bool RING>
static int launch_v5(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                     const float *bias, __half *y, int M, int N, int K, int G, void *ws,
                     int presum, cudaStream_t stream)
{
    bool done = launch_v5_m<RING>(x, qw, qz, sc, bias, y, M, N, K, G, ws, presum, false, stream);
    if (!done && !launch_v2(x, qw, qz, sc, bias, y, M, N, K, G, ws, stream))
        return launch_v4(x, qw, reinterpret_cast<const uint32_t *>(qz), sc, bias, y, M, N, K, G,
                         ws, stream);
    return K_ERR_NONE;
}

int k_w4a16_wgmma_available(void)
{
    static int cache[K_MAX_DEVICES]; /* 1: no, 2: yes */
    return k_per_device(cache, [](int d) {
        int major = 0, minor = 0;
        K_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
        K_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d));
        if (major != 9 || minor != 0) return 1; /* wgmma as compiled here: sm_90a only */
        /* The image CUDA picked for this device holds the real body only if it is sm_90a code
         * (a build without sm_90a JITs the empty body from compute_90 PTX); only the real body
         * has the static shared variable `last`, so its size tells them apart without a launch
         * (safe inside a stream capture). */
        cudaFuncAttributes a;
        K_CUDA_CHECK(cudaFuncGetAttributes(&a, w4a16_v7_kernel));
        return a.sharedSizeBytes > 0 ? 2 : 1;
    }) == 2;
}

/* Split-K slices of v7 for mn tiles of 128 x 128 and KS steps of 64: the S (1..16, slices of at
 * least 4 steps) with the fewest step-times, counting whole waves of the resident block slots
 * and two step-times per slice for the fp32 reduction when S > 1. */
static int v7_slices(long mn, int KS, long slots)
{
    int best = 1;
    long best_cost = -1;
    for (int S = 1; S <= 16 && (S == 1 || KS / S >= 4); ++S) {
        const int kps = (KS + S - 1) / S;
        const long waves = (mn * ((KS + kps - 1) / kps) + slots - 1) / slots;
        const long cost = waves * (kps + (S > 1 ? 2 : 0));
        if (best_cost < 0 || cost < best_cost) best = S, best_cost = cost;
    }
    return best;
}

/* v7 launch: split K when the 128 x 128 tiles alone leave block slots idle, M <= 256 and the
 * workspace is there (else one slice). K_ERR_UNSUPPORTED off sm_90a. */
static int launch_v7(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                     const float *bias, __half *y, int M, int N, int K, int G, void *workspace,
                     size_t workspace_bytes, cudaStream_t stream)
{
    if (!k_w4a16_wgmma_available())
        K_REFUSE(K_ERR_UNSUPPORTED, "W4A16 variant 7 (wgmma) needs compute capability 9.0 and a "
                 "build with sm_90a");
    static int occ[K_MAX_DEVICES];
    const int per_sm = resident_blocks(occ, w4a16_v7_kernel, v7::THREADS, v7::SMEM_BYTES,
                                       v7::SMEM_BYTES);
    const int KS = (K + v7::BK - 1) / v7::BK, nb = (N + v7::BN - 1) / v7::BN;
    const int mb = (M + v7::BM - 1) / v7::BM;
    int S = 1;
    if (M <= v7::SPLIT_MAX_M && (long)mb * nb <= N / 64 && workspace &&
        workspace_bytes >= k_w4a16_workspace_bytes(M, N))
        S = v7_slices((long)mb * nb, KS, (long)k_device_sm_count() * per_sm);
    const int kps = (KS + S - 1) / S;
    S = (KS + kps - 1) / kps;
    float *ws = static_cast<float *>(workspace);
    unsigned *counters = S > 1 ? reinterpret_cast<unsigned *>(ws + (size_t)M * N) : nullptr;
    w4a16_v7_kernel<<<dim3(nb, mb, S), v7::THREADS, v7::SMEM_BYTES, stream>>>(
        x, qw, qz, sc, bias, y, S > 1 ? ws : nullptr, counters, M, N, K, G, kps);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_w4a16_variant_max_m(int variant)
{
    switch (variant) {
    case K_W4A16_AUTO: /* M > K_W4A16_V5_MAX_M goes to v7 or v3 */
    case K_W4A16_V3_GEMM:
    case K_W4A16_V7_WGMMA: /* grid.y: ceil(M / 128) <= 65535 */
        static_assert(v7::BM == v3::BM, "v3 and v7 share the row limit");
        return 65535 * v3::BM;
    case K_W4A16_V1_NAIVE: return INT_MAX;       /* the grid loops over M */
    case K_W4A16_V2_DECODE:
    case K_W4A16_V4_STREAMK: return K_W4A16_DECODE_MAX_M;
    case K_W4A16_V5_DECODE:
    case K_W4A16_V8_DECODE_PRESUM:
    case K_W4A16_V9_DEFER_FINISH: return K_W4A16_V5_MAX_M;
    case K_W4A16_V6_DECODE_RING: return K_W4A16_V6_MAX_M;
    default: return 0;
    }
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
    int presum = 0; /* v5's block pre-sum: 0 never (variant 5), 1 by the S rule (auto), 2 where it fits */
    if (variant == K_W4A16_AUTO) { /* measured on H200: docs/BENCHMARKS.md */
        variant = M <= K_W4A16_V5_MAX_M ? K_W4A16_V9_DEFER_FINISH
                  : k_w4a16_wgmma_available() ? K_W4A16_V7_WGMMA : K_W4A16_V3_GEMM;
        presum = 1;
    } else if (variant == K_W4A16_V8_DECODE_PRESUM) {
        variant = K_W4A16_V5_DECODE;
        presum = 2;
    } else if (variant == K_W4A16_V9_DEFER_FINISH) {
        presum = 1; /* as auto */
    }
    const int max_m = k_w4a16_variant_max_m(variant);
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
        if (M > max_m) K_REFUSE(K_ERR_SHAPE, "W4A16 decode variant: M=%d > %d", M, max_m);
        rc = check_workspace(__func__, "decode", M, N, workspace, workspace_bytes);
        if (rc) return rc;
        if (!launch_v2(xh, reinterpret_cast<const uint4 *>(qweight),
                       reinterpret_cast<const uint4 *>(qzeros),
                       reinterpret_cast<const uint4 *>(scales), bias, yh, M, N, K, G, workspace,
                       stream))
            K_REFUSE(K_ERR_SHAPE, "W4A16 decode variant: G=%d needs a slice larger than the %d "
                     "bytes of shared memory a block may have (variants 4, 5 and auto take it)",
                     G, v2_smem_max());
        return K_ERR_NONE;
    case K_W4A16_V9_DEFER_FINISH:
    case K_W4A16_V5_DECODE:
    case K_W4A16_V6_DECODE_RING: {
        if (M > max_m) K_REFUSE(K_ERR_SHAPE, "W4A16 lean decode variant %d: M=%d > %d", variant, M, max_m);
        rc = check_workspace(__func__, "decode", M, N, workspace, workspace_bytes);
        if (rc) return rc;
        /* before anything runs: the last slice (v5, v6) or the finish (v9) writes y 4 values at
         * a time */
        if ((uintptr_t)y % 8) K_REFUSE(K_ERR_ARG, "W4A16 decode: y at %p is not 8-byte aligned", (void *)y);
        const uint4 *qw = reinterpret_cast<const uint4 *>(qweight);
        const uint4 *qz = reinterpret_cast<const uint4 *>(qzeros);
        const uint4 *sc = reinterpret_cast<const uint4 *>(scales);
        /* v9: the sums into the workspace, then y from them (the workspace zeroed again); where
         * v5 cannot take G, as variant 5 (with its own fallbacks) */
        if (variant == K_W4A16_V9_DEFER_FINISH &&
            launch_v5_m<false>(xh, qw, qz, sc, bias, nullptr, M, N, K, G, workspace, presum, true,
                               stream))
            return k_w4a16_acc_finish(y, static_cast<float *>(workspace), M, N, stream);
        return (variant == K_W4A16_V6_DECODE_RING ? launch_v5<true> : launch_v5<false>)(
            xh, qw, qz, sc, bias, yh, M, N, K, G, workspace, presum, stream);
    }
    case K_W4A16_V4_STREAMK:
        if (M > max_m) K_REFUSE(K_ERR_SHAPE, "W4A16 stream-K variant: M=%d > %d", M, max_m);
        rc = check_workspace(__func__, "stream-K", M, N, workspace, workspace_bytes);
        if (rc) return rc;
        return launch_v4(xh, reinterpret_cast<const uint4 *>(qweight),
                         reinterpret_cast<const uint32_t *>(qzeros),
                         reinterpret_cast<const uint4 *>(scales), bias, yh, M, N, K, G,
                         workspace, stream);
    case K_W4A16_V3_GEMM: {
        const int NT = N / 64;
        if (M > max_m) K_REFUSE(K_ERR_SHAPE, "W4A16 GEMM: M=%d too large", M);
        const long mblocks = (M + v3::BM - 1) / v3::BM;
        const dim3 grid((NT + v3::BNT - 1) / v3::BNT, (unsigned)mblocks);
        w4a16_v3_gemm_kernel<<<grid, v3::THREADS, 0, stream>>>(
            xh, reinterpret_cast<const uint4 *>(qweight), reinterpret_cast<const uint4 *>(qzeros),
            reinterpret_cast<const uint4 *>(scales), bias, yh, M, N, K, G);
        K_LAUNCH_CHECK();
        return K_ERR_NONE;
    }
    case K_W4A16_V7_WGMMA:
        if (M > max_m) K_REFUSE(K_ERR_SHAPE, "W4A16 wgmma GEMM: M=%d too large", M);
        return launch_v7(xh, reinterpret_cast<const uint4 *>(qweight),
                         reinterpret_cast<const uint4 *>(qzeros),
                         reinterpret_cast<const uint4 *>(scales), bias, yh, M, N, K, G,
                         workspace, workspace_bytes, stream);
    default:
        K_REFUSE(K_ERR_ARG, "unknown W4A16 variant %d (known: 0 auto, 1 naive, 2 decode, 3 GEMM, 4 stream-K, 5 lean decode, 6 lean decode with a shared-memory ring, 7 wgmma GEMM, 8 lean decode with the block pre-sum, 9 deferred split-K + finish)",
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

int k_w4a16_linear_acc(const uint16_t *x, const uint8_t *qweight, const uint8_t *qzeros,
                       const uint16_t *scales, const float *bias, float *acc, int M, int N, int K,
                       int G, struct CUstream_st *stream)
{
    int rc = check_shape(__func__, M, N, K, G);
    if (rc) return rc;
    if (M > K_W4A16_V5_MAX_M)
        K_REFUSE(K_ERR_SHAPE, "deferred W4A16 linear: M=%d > %d", M, K_W4A16_V5_MAX_M);
    if (!x || !qweight || !qzeros || !scales || !acc || (uintptr_t)acc % 16)
        K_REFUSE(K_ERR_ARG, "deferred W4A16 linear: NULL tensor or acc not 16-byte aligned "
                 "(x %p, qweight %p, qzeros %p, scales %p, acc %p)", (const void *)x,
                 (const void *)qweight, (const void *)qzeros, (const void *)scales, (void *)acc);
    /* presum 1: as auto (the block pre-sum at 9 <= M <= 16) */
    if (!launch_v5_m<false>(reinterpret_cast<const __half *>(x),
                            reinterpret_cast<const uint4 *>(qweight),
                            reinterpret_cast<const uint4 *>(qzeros),
                            reinterpret_cast<const uint4 *>(scales), bias, nullptr, M, N, K, G,
                            acc, 1, true, stream))
        return K_ERR_UNSUPPORTED; /* not reported: the caller falls back to k_w4a16_linear */
    return K_ERR_NONE;
}

/* y = fp16(acc), acc = 0; 4 columns per thread (N % 64 == 0) */
static __global__ void acc_finish_kernel(__half *__restrict__ y, float *__restrict__ acc,
                                         long long n4)
{
    k_pdl_launch_dependents(); /* the next kernel may start loading (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): the deferred linear is complete */
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 *p = reinterpret_cast<float4 *>(acc) + i;
    const float4 v = *p;
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    reinterpret_cast<uint2 *>(y)[i] = make_uint2(k_half2_as_u32(a), k_half2_as_u32(b));
    *p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

int k_w4a16_acc_finish(uint16_t *y, float *acc, int M, int N, struct CUstream_st *stream)
{
    if (M < 1 || N < 1 || N % 4)
        K_REFUSE(K_ERR_SHAPE, "acc_finish M=%d N=%d: need M, N >= 1, N %% 4 == 0", M, N);
    if (!y || !acc || (uintptr_t)acc % 16 || (uintptr_t)y % 8)
        K_REFUSE(K_ERR_ARG, "acc_finish: NULL or misaligned y %p / acc %p", (void *)y, (void *)acc);
    const long long n4 = (long long)M * N / 4;
    k_launch_ex(acc_finish_kernel, dim3((unsigned)((n4 + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(y), acc, n4);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
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

static __global__ void bias_add_kernel(__half *__restrict__ y, const float *__restrict__ bias,
                                       int M, int N)
{
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)M * N) return;
    y[id] = __float2half_rn(__half2float(y[id]) + bias[id % N]);
}

int k_w4a16_linear_dq_gemm(struct cublasContext *cublas, const uint16_t *x, const uint8_t *qweight,
                           const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                           uint16_t *y, int M, int N, int K, int G, void *scratch,
                           size_t scratch_bytes, struct CUstream_st *stream)
{
    int rc = check_shape(__func__, M, N, K, G);
    if (rc) return rc;
    if (!cublas || !x || !qweight || !qzeros || !scales || !y)
        K_REFUSE(K_ERR_ARG, "NULL handle or tensor (cublas %p, x %p, qweight %p, y %p)",
                 (void *)cublas, (const void *)x, (const void *)qweight, (void *)y);
    if (!scratch || scratch_bytes < (size_t)K * N * 2)
        K_REFUSE(K_ERR_WORKSPACE, "W4A16 dequant+GEMM K=%d N=%d: scratch %zu bytes at %p, need %zu",
                 K, N, scratch_bytes, scratch, (size_t)K * N * 2);
    rc = k_w4a16_dequant(qweight, qzeros, scales, static_cast<uint16_t *>(scratch), N, K, G, stream);
    if (rc) return rc;
    /* row-major y[M,N] = x[M,K] . W[K,N]  <=>  column-major y^T[N,M] = W^T[N,K] . x^T[K,M] */
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha,
                                           scratch, CUDA_R_16F, N, x, CUDA_R_16F, K, &beta, y,
                                           CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        int dev = -1;
        cudaGetDevice(&dev);
        fprintf(stderr, "qshard: cuBLAS error %d in cublasGemmEx (M=%d N=%d K=%d) in %s at %s:%d on device %d\n",
                (int)st, M, N, K, __func__, __FILE__, __LINE__, dev);
        abort();
    }
    if (bias) {
        const long long n = (long long)M * N;
        bias_add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
            reinterpret_cast<__half *>(y), bias, M, N);
        K_LAUNCH_CHECK();
    }
    return K_ERR_NONE;
}

int k_bias_add(uint16_t *y, const float *bias, int M, int N, struct CUstream_st *stream)
{
    if (M < 1 || N < 1) K_REFUSE(K_ERR_SHAPE, "bias_add M=%d N=%d", M, N);
    if (!y || !bias) K_REFUSE(K_ERR_ARG, "bias_add: NULL y or bias");
    const long long n = (long long)M * N;
    bias_add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(reinterpret_cast<__half *>(y),
                                                                    bias, M, N);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

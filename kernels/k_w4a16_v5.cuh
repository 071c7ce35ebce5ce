/*
 * k_w4a16_v5.cuh - the v5 split-K family of the W4A16 linear (M <= 64): device code and its
 * launch arithmetic. Included by kernels/k_w4a16.cu (the library's SPLITK route: the deferred
 * split-K, sums left in an fp32 accumulator for the finish kernel or the consumer) and by
 * kernels/lab/w4a16_decode.cu (the experiments on the same kernel: the in-kernel split-K tail
 * (counters), the cp.async weight ring v6, the block pre-sum at every M v8). One kernel
 * template, so the library and the lab measure the same instructions.
 *
 * Decomposition: split-K slices x 64-column n-tiles, one n-tile per warp (or, with the block
 * pre-sum, 4 slices of one n-tile per block); the transposed product y^T = W^T x^T on
 * mma.sync m16n8k16 with the dequantised weights as the A operand, so M <= 8 costs 4 mma per
 * 16 x 64 tile; the block stages its activation slice in shared memory once; the slices add
 * their partial sums into the fp32 workspace with 16-byte vector reductions. Shared-memory
 * sizes: k_w4a16_v5_smem / k_w4a16_v5_plan (kernels/k_w4a16_int.h), so the plain-C router
 * decides before any launch whether a group size fits.
 */
#ifndef QS_K_W4A16_V5_CUH
#define QS_K_W4A16_V5_CUH

#include <algorithm>

#include "k_common.cuh"   /* K_CUDA_CHECK, k_mma_16816, k_w4_dequant_word, k_cp_async16, PDL */
#include "k_w4a16_int.h"  /* K_V5_*, k_w4a16_v5_smem, struct k_w4a16_splitk_plan */

// --- split-K flush ------------------------------------------------------------------------------

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
 * The split-K flush of v5: the warp's fragments are first gathered row-major in its own
 * shared-memory stage [8*MB8][64] fp32, so the workspace sees one 16-byte vector reduction per
 * 4 columns (M*16 per warp instead of the M*64 scalar atomics of v2, kernels/lab); with
 * counters, the slice that arrives last at the n-tile's counter adds the bias, reads, writes y
 * and zeroes 4 columns at a time (without: deferred, slice 0 adds the bias). Needs N % 4 == 0 (N % 64 == 0 holds).
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
    if (!counters) return; /* deferred split-K (the ACC route): the consumer finishes */
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
    if (!counters) return; /* deferred split-K (the ACC route): the consumer finishes */
    __syncthreads(); /* every thread's adds before thread 0's release */
    if (tid == 0) last_block = k_atom_add_acq_rel(counters + nt, 1u) == (unsigned)arrivals - 1;
    __syncthreads(); /* thread 0's acquire before every thread's reads */
    if (!last_block) return;
    for (int e = tid; e < M * 16; e += T)
        splitk_finish4(ws, y, bias, e / 16, nt * 64 + (e % 16) * 4, N);
    if (tid == 0) atomicExch(counters + nt, 0u);
}

// --- v5: decode, split-K slices, weights through registers -------------------------------------

namespace v5 {
/* warps per block, one n-tile each; at M > 16 eight warps share one activation slice, which
 * halves the slice reads and the split-K partial sums per weight byte */
template <int MB8> constexpr int WARPS = K_V5_WARPS(MB8);
constexpr int DEPTH = K_V5_DEPTH; /* weight tiles in flight per lane, held in registers */
/* bytes of the staged activation slice at most: 16 KB (M <= 8) or 32 KB (M <= 16) holds 64
 * k-tiles per slice. At M = 16 a 16 KB slice meant twice the slices, each flushing M x 64
 * columns of fp32 adds (70B gate_up 100.6 -> 89.9 us with 32 KB on the H200; M <= 8 lost 2-3 %
 * there with 32 KB, so it keeps 16 KB) */
template <int MB8> constexpr int X_BUDGET = K_V5_X_BUDGET(MB8);
constexpr int SZ_BYTES = K_V5_SZ_BYTES; /* one group of one n-tile: 128 B scales + 32 B zero words */
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
 * Same decomposition and product as v2 (kernels/lab/w4a16_decode.cu: split-K slices x 4
 * n-tiles per block, transposed mma with the weights as the A operand, activation slice staged
 * once per block, fp32 reductions into the workspace), with a leaner tile loop:
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

// --- host: occupancy, slicing, launch ------------------------------------------------------------

/* Resident blocks per SM (at least 1) of kern (v4, v5, v7; v2 in kernels/lab) launched with `threads` threads and
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

/* k-tiles per split-K slice (v5; v2 in kernels/lab): fill the resident block slots
 * (blocks_per_sm x SMs) in whole waves (a partial last wave would run the tail at a fraction of
 * the bandwidth) with at most kc_max k-tiles per slice; a multiple of unit. n_groups: blocks
 * along N. */
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

/*
 * Launch one v5 instance with the plan of k_w4a16_v5_plan (the slice unit and the largest
 * slice that fits): the slice from the occupancy (splitk_slice), then either the plain kernel or,
 * where CAN_PS && presum and the block's XS slices fit the budget, the block pre-sum (PS): the
 * 4 warps of a block take 4 slices of one n-tile and sum them in shared memory first, so each
 * slice of an n-tile sends M x 16 vector reductions (and with counters one arrival) per block
 * instead of per warp. H200, same run (docs/BENCHMARKS.md, "Decode after the split-K tail
 * work"): M = 16 4096 x 4096 10.41 -> 8.39 us, Llama-3-8B qkv 10.53 -> 8.82, 70B tp 8 qkv
 * 10.00 -> 6.59, o 8.85 -> 6.08, the rest within 0.5 %; at M = 1 it lost on 7 of the 10 shapes
 * it applies to (7B qkv 8.85 -> 14.29 us): the library takes it at 9 <= M <= 16 only.
 * counters: NULL = deferred (the sums stay in ws [M, N] for the consumer, y unused); else
 * [N/64] zeroed counters and the last slice of each n-tile writes y and re-zeroes ws (the
 * in-kernel tail, kernels/lab). Weight loads start before the previous kernel ends (PDL).
 */
template <int MB8, bool SCALE_AFTER, int GTC, bool RING, bool CAN_PS>
static void v5_launch(const k_w4a16_splitk_plan &p, const __half *x, const uint4 *qw,
                      const uint4 *qz, const uint4 *sc, const float *bias, __half *y, float *ws,
                      unsigned *counters, int M, int N, int K, int G, bool presum,
                      cudaStream_t stream)
{
    const int KT = K / 16, NT = N / 64, GT = G / 16;
    auto kern = w4a16_v5_decode_kernel<MB8, SCALE_AFTER, GTC, RING, false>;
    auto kern_ps = w4a16_v5_decode_kernel<MB8, SCALE_AFTER, GTC, RING, CAN_PS>;
    auto smem_for = [&](int kc, int xs) { return (int)k_w4a16_v5_smem(MB8, GT, kc, xs, RING); };
    static int bps[K_MAX_DEVICES]; /* at the largest slice, per instantiation and device */
    const int blocks_per_sm =
        resident_blocks(bps, kern, v5::WARPS<MB8> * K_WARP, smem_for(p.kc_max, 1), p.smem_max);
    const int n_groups = (NT + v5::WARPS<MB8> - 1) / v5::WARPS<MB8>;
    const int kc = splitk_slice(KT, n_groups, blocks_per_sm, p.kc_max, p.unit);
    const int S = (KT + kc - 1) / kc;
    constexpr int XS = v5::WARPS<MB8>;
    /* pre-sum: S rounded up to whole blocks of XS slices, the slice no longer (trailing slices
     * past K are empty), the block's XS slices within the activation budget */
    if (CAN_PS && presum && S >= 2) {
        const int S4 = (S + XS - 1) / XS * XS;
        const int kc4 = ((KT + S4 - 1) / S4 + p.unit - 1) / p.unit * p.unit;
        /* M <= 8 may stage twice the usual budget (4 blocks/SM x ~42 KB still fit) */
        if (kc4 * XS <= (MB8 == 1 ? 2 : 1) * p.kc_max && smem_for(kc4, XS) <= p.smem_max) {
            if (k_get_trace())
                fprintf(stderr, "w4a16 v5<%d,%d,%d> pre-sum M=%d N=%d K=%d: kc=%d S=%d blocks=%d smem=%d pdl=%d\n",
                        MB8, (int)SCALE_AFTER, GTC, M, N, K, kc4, S4, NT * (S4 / XS), smem_for(kc4, XS),
                        (int)k_pdl_usable());
            static int ps_attr[K_MAX_DEVICES]; /* sets the opt-in shared-memory size, per device */
            (void)resident_blocks(ps_attr, kern_ps, v5::WARPS<MB8> * K_WARP, smem_for(kc4, XS), p.smem_max);
            k_launch_ex(kern_ps, dim3(NT * (S4 / XS)), dim3(v5::WARPS<MB8> * K_WARP), smem_for(kc4, XS),
                        stream, k_pdl_usable(), x, qw, qz, sc, bias, y, ws, counters, M, N, K, G,
                        kc4, S4);
            return;
        }
    }
    if (k_get_trace())
        fprintf(stderr, "w4a16 v5<%d,%d,%d,ring %d> M=%d N=%d K=%d: kc=%d S=%d blocks=%d (%d/SM) smem=%d pdl=%d\n",
                MB8, (int)SCALE_AFTER, GTC, (int)RING, M, N, K, kc, S, n_groups * S, blocks_per_sm,
                smem_for(kc, 1), (int)k_pdl_usable());
    k_launch_ex(kern, dim3(n_groups * S), dim3(v5::WARPS<MB8> * K_WARP), smem_for(kc, 1), stream,
                k_pdl_usable(), x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, kc, S);
}

/* v5_launch for the plan's group instance (GTC = G/16 in {1, 2, 4}, else 0) */
template <int MB8, bool SCALE_AFTER, bool RING, bool CAN_PS>
static void v5_launch_g(const k_w4a16_splitk_plan &p, const __half *x, const uint4 *qw,
                        const uint4 *qz, const uint4 *sc, const float *bias, __half *y, float *ws,
                        unsigned *counters, int M, int N, int K, int G, bool presum,
                        cudaStream_t stream)
{
    switch (p.gtc) {
    case 1: v5_launch<MB8, SCALE_AFTER, 1, RING, CAN_PS>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    case 2: v5_launch<MB8, SCALE_AFTER, 2, RING, CAN_PS>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    case 4: v5_launch<MB8, SCALE_AFTER, 4, RING, CAN_PS>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    default: v5_launch<MB8, SCALE_AFTER, 0, RING, CAN_PS>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    }
}

/*
 * v5 by the plan's instance (k_w4a16_v5_plan: mb8 from M, gtc from G). M <= 16 runs the
 * exact-integer dequantisation with the scales applied per group (167 registers, 3 blocks/SM,
 * no spill): 70B gate_up at M = 16 96.5 -> 90.2 us, 70B down 52.4 -> 49.4 us against the fp16
 * scale inside the dequantisation, same run on the H200. 16 < M <= 64: 32 / 64 token rows, fp16
 * scale inside the dequantisation (the per-group fp32 sums would double the 64 / 128
 * accumulator registers), 8 warps per block (186 / 246 registers, no spill, 1 block/SM) sharing
 * a 128 / 192 KB activation slice, so most layers run in one wave with 2-6 split-K slices. On
 * the H200, per Llama-2-7B layer: M = 17 85.9 -> 76.8 us and M = 64 178.4 -> 144.6 us against 4
 * warps per block with 64 / 96 KB slices (docs/BENCHMARKS.md). RING: the weights through a
 * per-warp cp.async ring (v6, plan with ring = 1: M <= 16 only); PS1: the block pre-sum may run
 * at M <= 8 too (v8); M <= 16 may always use it.
 */
template <bool RING, bool PS1>
static void v5_launch_plan(const k_w4a16_splitk_plan &p, const __half *x, const uint4 *qw,
                           const uint4 *qz, const uint4 *sc, const float *bias, __half *y,
                           float *ws, unsigned *counters, int M, int N, int K, int G, bool presum,
                           cudaStream_t stream)
{
    switch (p.mb8) {
    case 1: v5_launch_g<1, true, RING, !RING && PS1>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    case 2: v5_launch_g<2, true, RING, !RING>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    case 4: v5_launch_g<4, false, false, false>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    default: v5_launch_g<8, false, false, false>(p, x, qw, qz, sc, bias, y, ws, counters, M, N, K, G, presum, stream); break;
    }
}

#endif /* QS_K_W4A16_V5_CUH */

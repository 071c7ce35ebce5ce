/*
 * k_w4a16.cu - W4A16 linear: y[M, N] (fp16) = x[M, K] (fp16) . dequant(W) + bias, fp32 accumulation,
 * reading the converter's packed int4 layout (docs/DESIGN.md section 4) directly.
 *
 *   W[k][n] = (q[k][n] - z[k/G][n]) * s[k/G][n]; reference ref_w4a16_linear (kernels/ref.h).
 *
 * The kernels the router (kernels/k_w4a16_route.c, kernels.h "W4A16 linear") can pick, and
 * k_w4a16_launch, which runs a route exactly:
 *   SPLITK    v5 (kernels/k_w4a16_v5.cuh), M <= 64: deferred split-K, the slices' sums in an
 *             fp32 accumulator; epilogue Y adds k_w4a16_acc_finish (what was variant 9).
 *   FALLBACK  v4, M <= 64, any G: stream-K, the tile stream (n-tile-major, DESIGN 4.1) cut into
 *             equal contiguous chunks, one per warp; activations read per tile from L1/L2; for
 *             the group sizes v5 cannot take.
 *   WGMMA     v7, sm_90a: 128 x 128 block tile, two warpgroups; each 64-k step's weight tile is
 *             dequantised once into shared memory (stmatrix, 128-byte swizzle) and multiplied
 *             with wgmma.mma_async while the warps dequantise the next step; split-K through
 *             the workspace at M <= 256.
 *   DQ_GEMM   dequant to fp16 [K, N] row-major, then cuBLAS (the prefill path).
 * The experiments that lost (v1 naive, v2, v3 mma.sync GEMM, v6, v8, v5 with its in-kernel
 * split-K tail) are standalone programs in kernels/lab/ (kernels/lab/README.md).
 *
 * Test: build/gpu_test_w4a16 (tests/run_gpu_tests.sh), router: build/test_route.
 * Bench: qshard bench kernel w4a16 --routes auto,splitk,acc,wgmma,dq_gemm,fallback.
 */
#include "k_w4a16_v5.cuh" /* v5 (SPLITK), resident_blocks, k_common.cuh, k_w4a16_int.h */

#include <cublas_v2.h> /* cublasGemmEx (DQ_GEMM) */

#include <algorithm>

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

/* K_ERR_WORKSPACE, logged under `who` with `what` (the route's name), unless workspace is
 * non-NULL and holds `need` bytes; K_ERR_ARG unless it is 16-byte aligned. */
static int check_workspace(const char *who, const char *what, void *workspace,
                           size_t workspace_bytes, size_t need)
{
    if (!workspace || workspace_bytes < need) {
        qs_log_error(who, "W4A16 %s: workspace %zu bytes at %p, need %zu", what, workspace_bytes,
                     workspace, need);
        return K_ERR_WORKSPACE;
    }
    if ((uintptr_t)workspace % 16) { /* 16-byte vector reductions and reads */
        qs_log_error(who, "W4A16 %s: workspace at %p is not 16-byte aligned", what, workspace);
        return K_ERR_ARG;
    }
    return K_ERR_NONE;
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

/* 1 when v7 (wgmma) runs on the current device: compute capability 9.0 and the kernel image
 * CUDA loads for it is this binary's sm_90a code (cudaFuncGetAttributes, no launch, so it may
 * be called during a stream capture; cached per device); 0 otherwise. CUDA errors abort. */
static int wgmma_available(void)
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
/* v7 launch: split K when the 128 x 128 tiles alone leave block slots idle, M <= 256 and the
 * workspace is there (else one slice). K_ERR_UNSUPPORTED off sm_90a. */
static int launch_v7(const __half *x, const uint4 *qw, const uint4 *qz, const uint4 *sc,
                     const float *bias, __half *y, int M, int N, int K, int G, void *workspace,
                     size_t workspace_bytes, cudaStream_t stream)
{
    if (!wgmma_available())
        K_REFUSE(K_ERR_UNSUPPORTED, "W4A16 wgmma route needs compute capability 9.0 and a "
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
    int rc = k_w4a16_check_shape(__func__, 1, N, K, G);
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

/* DQ_GEMM: k_w4a16_dequant into scratch (fp16 [K, N]), y = x . W with cublasGemmEx (fp16 in
 * and out, fp32 compute), then + bias (fp32 add, one more fp16 rounding). At M >= 129 this
 * beats every kernel here on the H200 (cuBLAS's wgmma tiles run at ~700 TFLOP/s, v7 at ~300;
 * the dequant costs ~5 fp16 weight passes, so at M <= 64 v5 is faster and at 65..128 v7, which
 * never writes the fp16 weight; above 128 v7 runs two row blocks, each dequantising every
 * weight tile), and at M > 64 it beats the mma.sync kernels on GPUs without v7
 * (docs/BENCHMARKS.md). The caller checked shape, pointers, cuBLAS handle and scratch. */
static int launch_dq_gemm(struct cublasContext *cublas, const uint16_t *x, const uint8_t *qweight,
                          const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                          uint16_t *y, int M, int N, int K, int G, void *scratch,
                          struct CUstream_st *stream)
{
    const int rc = k_w4a16_dequant(qweight, qzeros, scales, static_cast<uint16_t *>(scratch), N, K, G, stream);
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
    return bias ? k_bias_add(y, bias, M, N, stream) : K_ERR_NONE;
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

// --- the route launcher --------------------------------------------------------------------------

int k_w4a16_caps_query(struct k_w4a16_caps *caps)
{
    if (!caps) K_REFUSE(K_ERR_ARG, "NULL caps");
    caps->wgmma = wgmma_available();
    caps->allow_wgmma = 1;
    caps->smem_optin = k_smem_optin();
    return K_ERR_NONE;
}

/* Whether a SPLITK route's plan is the one k_w4a16_route_pick makes for the current device (a
 * route made with another device's caps, or edited, could ask for more shared memory than this
 * device has). */
static bool splitk_plan_current(const struct k_w4a16_route *r)
{
    k_w4a16_splitk_plan p;
    if (r->M > K_W4A16_SPLITK_MAX_M || k_w4a16_v5_plan(r->M, r->K, r->G, k_smem_optin(), 0, &p))
        return false;
    const k_w4a16_splitk_plan &q = r->splitk;
    return p.mb8 == q.mb8 && p.scale_after == q.scale_after && p.gtc == q.gtc &&
           p.unit == q.unit && p.kc_max == q.kc_max && p.smem_max == q.smem_max;
}

int k_w4a16_launch(const struct k_w4a16_route *route, const uint16_t *x,
                   const struct k_w4a16_weight *w, uint16_t *y, float *acc,
                   const struct k_w4a16_bufs *bufs, struct CUstream_st *stream)
{
    if (!route || !w || !bufs) K_REFUSE(K_ERR_ARG, "NULL route, weight or buffers");
    const struct k_w4a16_route &r = *route;
    const char *name = k_w4a16_kernel_name(r.kernel);
    int rc = k_w4a16_check_shape(__func__, r.M, r.N, r.K, r.G);
    if (rc) return rc;
    if (r.epilogue != K_W4A16_EPI_Y && r.epilogue != K_W4A16_EPI_ACC)
        K_REFUSE(K_ERR_ARG, "W4A16: unknown epilogue %d", (int)r.epilogue);
    const bool to_acc = r.epilogue == K_W4A16_EPI_ACC;
    if (!x || !w->qweight || !w->qzeros || !w->scales || (to_acc ? !acc : !y))
        K_REFUSE(K_ERR_ARG, "W4A16 %s: NULL tensor (x %p, qweight %p, qzeros %p, scales %p, %s %p)",
                 name ? name : "?", (const void *)x, (const void *)w->qweight,
                 (const void *)w->qzeros, (const void *)w->scales, to_acc ? "acc" : "y",
                 to_acc ? (void *)acc : (void *)y);
    if (r.workspace_bytes) {
        rc = check_workspace(__func__, name ? name : "?", bufs->workspace, bufs->workspace_bytes,
                             r.workspace_bytes);
        if (rc) return rc;
    }
    const __half *xh = reinterpret_cast<const __half *>(x);
    __half *yh = reinterpret_cast<__half *>(y);
    const uint4 *qw = reinterpret_cast<const uint4 *>(w->qweight);
    const uint4 *qz = reinterpret_cast<const uint4 *>(w->qzeros);
    const uint4 *sc = reinterpret_cast<const uint4 *>(w->scales);
    /* only SPLITK gives ACC: anything else is refused after the switch */
    switch (to_acc && r.kernel != K_W4A16_KERNEL_SPLITK ? K_W4A16_KERNEL_AUTO : r.kernel) {
    case K_W4A16_KERNEL_SPLITK: { /* ACC: the sums into acc; Y: into the workspace, then y */
        if (!splitk_plan_current(route))
            K_REFUSE(K_ERR_ARG, "W4A16 splitk M=%d N=%d K=%d G=%d: the route was not made by "
                     "k_w4a16_route_pick for this device", r.M, r.N, r.K, r.G);
        /* the finish writes y 4 values at a time; the sums are read as float4 */
        if (to_acc ? (uintptr_t)acc % 16 : (uintptr_t)y % 8)
            K_REFUSE(K_ERR_ARG, "W4A16 splitk: %s at %p is not %d-byte aligned", to_acc ? "acc" : "y",
                     to_acc ? (void *)acc : (void *)y, to_acc ? 16 : 8);
        float *sums = to_acc ? acc : static_cast<float *>(bufs->workspace);
        v5_launch_plan<false, false>(r.splitk, xh, qw, qz, sc, w->bias, nullptr, sums, nullptr,
                                     r.M, r.N, r.K, r.G, true, stream);
        return to_acc ? K_ERR_NONE : k_w4a16_acc_finish(y, sums, r.M, r.N, stream);
    }
    case K_W4A16_KERNEL_FALLBACK:
        if (r.M > K_W4A16_SPLITK_MAX_M) break;
        return launch_v4(xh, qw, reinterpret_cast<const uint32_t *>(w->qzeros), sc, w->bias, yh,
                         r.M, r.N, r.K, r.G, bufs->workspace, stream);
    case K_W4A16_KERNEL_WGMMA:
        return launch_v7(xh, qw, qz, sc, w->bias, yh, r.M, r.N, r.K, r.G,
                         r.workspace_bytes ? bufs->workspace : nullptr, bufs->workspace_bytes,
                         stream);
    case K_W4A16_KERNEL_DQ_GEMM:
        if (!bufs->cublas) K_REFUSE(K_ERR_ARG, "W4A16 dq_gemm: NULL cuBLAS handle");
        if (!bufs->scratch || bufs->scratch_bytes < (size_t)r.K * r.N * 2)
            K_REFUSE(K_ERR_WORKSPACE, "W4A16 dq_gemm K=%d N=%d: scratch %zu bytes at %p, need %zu",
                     r.K, r.N, bufs->scratch_bytes, bufs->scratch, (size_t)r.K * r.N * 2);
        return launch_dq_gemm(bufs->cublas, x, w->qweight, w->qzeros, w->scales, w->bias, y, r.M,
                              r.N, r.K, r.G, bufs->scratch, stream);
    case K_W4A16_KERNEL_AUTO: break;
    }
    K_REFUSE(K_ERR_ARG, "W4A16: route kernel %d (%s) with epilogue %d at M=%d is not a route of "
             "k_w4a16_route_pick", (int)r.kernel, name ? name : "?", (int)r.epilogue, r.M);
}

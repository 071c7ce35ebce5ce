/*
 * w4a16_gemm.cu - the W4A16 prompt experiment (M > 64) that the library's routes do not take,
 * beside the two routes that won (kernels/k_w4a16.cu), on one table:
 *
 *   v3   GEMM on mma.sync: 128 x 128 block tiles, 4 warps of 64 x 64, 2 k-tiles per stage, a
 *        4-stage cp.async pipeline for activations (swizzled, read with ldmatrix), packed
 *        weights, scales and zeros; 32 mma per k-tile per warp; no split-K (auto above 64 rows
 *        on GPUs without wgmma until the router; the runtime never ran it: dequant + cuBLAS is
 *        faster there)
 *   v7   the library's wgmma route (sm_90a: weight tiles dequantised once into shared memory,
 *        wgmma.mma_async; auto at 65..128 rows)
 *   v10  the library's dq_gemm route (dequant to fp16, cuBLAS; auto from 129 rows)
 * Numbers on the H200: kernels/lab/README.md (from docs/BENCHMARKS.md).
 *
 * Build: make lab (-> $(BUILD)/lab/w4a16_gemm). Run: build/lab/w4a16_gemm [VERSION] [--quick]:
 * checks every version against ref_w4a16_linear on fresh random inputs, then times them on
 * Llama-2-7B layer shapes against cuBLAS fp16 and the copy bandwidth
 * (kernels/lab/lab_common.cuh).
 */
#include "../k_common.cuh" /* k_mma_16816, k_w4_dequant_word, k_cp_async16, k_ldmatrix_x4 */
#include "lab_common.cuh"  /* lab_main, lab_args, kernels/k_bench.cuh */

// --- v3: GEMM on mma.sync ------------------------------------------------------------------------

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

// --- launchers: one per version ---------------------------------------------------------------

static bool run_v3(const lab_args &a, cudaStream_t st)
{
    const long mblocks = (a.M + v3::BM - 1) / v3::BM;
    if (mblocks > 65535) return false;
    const dim3 grid((a.N / 64 + v3::BNT - 1) / v3::BNT, (unsigned)mblocks);
    w4a16_v3_gemm_kernel<<<grid, v3::THREADS, 0, st>>>(
        a.x, reinterpret_cast<const uint4 *>(a.qweight), reinterpret_cast<const uint4 *>(a.qzeros),
        reinterpret_cast<const uint4 *>(a.scales), a.bias, a.y, a.M, a.N, a.K, a.G);
    K_LAUNCH_CHECK();
    return true;
}

static bool run_v7(const lab_args &a, cudaStream_t st) { return lab_route(a, st, K_W4A16_KERNEL_WGMMA); }
static bool run_v10(const lab_args &a, cudaStream_t st) { return lab_route(a, st, K_W4A16_KERNEL_DQ_GEMM); }

int main(int argc, char **argv)
{
    static const lab_version versions[] = {
        {3, "v3 mma.sync", run_v3}, {7, "wgmma route", run_v7}, {10, "dq_gemm route", run_v10}};
    /* odd M across one, two and three row blocks; group sizes 16..256; an odd number of
     * k-tiles (K = 48) and a partial last 64-k step (K = 1040) */
    static const lab_shape checks[] = {
        {"small", 65, 128, 128, 128},   {"small", 97, 192, 256, 64},  {"small", 129, 576, 1024, 128},
        {"small", 257, 128, 1536, 256}, {"odd-kt", 129, 128, 48, 48}, {"partial-k", 200, 128, 1040, 16},
    };
    static const lab_shape timings[] = {
        {"7B gate_up", 128, 22016, 4096, 128}, {"7B down", 128, 4096, 11008, 128},
        {"7B gate_up", 512, 22016, 4096, 128}, {"7B qkv", 4096, 12288, 4096, 128},
    };
    return lab_main(argc, argv, "w4a16_gemm", versions, (int)(sizeof(versions) / sizeof(versions[0])),
                    checks, (int)(sizeof(checks) / sizeof(checks[0])), timings,
                    (int)(sizeof(timings) / sizeof(timings[0])));
}

/*
 * w4a16_decode.cu - the W4A16 decode experiments (M <= 64) that the library's routes do not
 * take, beside the two routes that won (kernels/k_w4a16.cu), on one table:
 *
 *   v1  naive: one thread per output, scalar fp32 dequantisation via the layout formula (the
 *       device oracle the first kernels were checked against)
 *   v2  split-K slices x 4 n-tiles per block, the activation slice staged once per block, each
 *       lane cp.async-copying its own 16 bytes of a packed tile through an 8-deep ring,
 *       mma.sync on the transposed product, scalar fp32 atomics into the workspace, the last
 *       slice of an n-tile writes y (milestone 1's decode kernel; until this change the
 *       library's second fallback)
 *   v5  v5 with the in-kernel split-K tail: counters per n-tile, the last slice reads the sums
 *       back and writes y (auto until the deferred split-K)
 *   v6  v5 with the weights through a per-warp cp.async ring instead of registers, M <= 16
 *   v8  v5 (with the tail) and the block pre-sum at every M <= 16, where the library takes it
 *       at 9 <= M <= 16 only
 *   v9  the library's splitk route: v5 deferred + k_w4a16_acc_finish (auto at M <= 64)
 *   v4  the library's fallback route: stream-K, any G
 * v5, v6 and v8 are instances of the library's kernel template (kernels/k_w4a16_v5.cuh).
 * Numbers on the H200: kernels/lab/README.md (from docs/BENCHMARKS.md).
 *
 * Build: make lab (-> $(BUILD)/lab/w4a16_decode). Run: build/lab/w4a16_decode [VERSION]
 * [--quick]: checks every version against ref_w4a16_linear on fresh random inputs, then times
 * them on Llama-2-7B / 70B layer shapes against cuBLAS fp16 and the copy bandwidth
 * (kernels/lab/lab_common.cuh).
 */
#include "../k_w4a16_v5.cuh" /* w4a16_v5_decode_kernel, v5_launch_plan, resident_blocks, splitk_slice */
#include "lab_common.cuh"    /* lab_main, lab_args, kernels/k_bench.cuh */

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

// --- v2: decode, split-K slices, weights through a cp.async ring --------------------------------


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
 * End of a split-K slice (v2): add this warp's partial sums acc (the D fragments of the
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
    if (k_get_trace())
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

// --- launchers: one per version ---------------------------------------------------------------

static const uint4 *u4(const void *p) { return static_cast<const uint4 *>(p); }

static bool run_v1(const lab_args &a, cudaStream_t st)
{
    const dim3 grid((a.N + 127) / 128, std::min(a.M, 65535));
    w4a16_v1_kernel<<<grid, 128, 0, st>>>(a.x, a.qweight, a.qzeros, a.scales, a.bias, a.y, a.M,
                                          a.N, a.K, a.G);
    K_LAUNCH_CHECK();
    return true;
}

static bool run_v2(const lab_args &a, cudaStream_t st)
{
    return a.M <= 64 && launch_v2(a.x, u4(a.qweight), u4(a.qzeros), u4(a.scales), a.bias, a.y,
                                  a.M, a.N, a.K, a.G, a.ws, st);
}

/* v5 family with the in-kernel tail: counters after the [M, N] sums (k_w4a16_workspace_bytes);
 * RING: v6 (M <= 16); PS1 + presum: the block pre-sum at every M <= 16 (v8) */
template <bool RING, bool PS1>
static bool run_v5_tail(const lab_args &a, cudaStream_t st, bool presum)
{
    k_w4a16_splitk_plan p;
    if (a.M > (RING ? 16 : 64) || k_w4a16_v5_plan(a.M, a.K, a.G, k_smem_optin(), RING, &p)) return false;
    float *ws = static_cast<float *>(a.ws);
    v5_launch_plan<RING, PS1>(p, a.x, u4(a.qweight), u4(a.qzeros), u4(a.scales), a.bias, a.y, ws,
                              reinterpret_cast<unsigned *>(ws + (size_t)a.M * a.N), a.M, a.N, a.K,
                              a.G, presum, st);
    return true;
}
static bool run_v5(const lab_args &a, cudaStream_t st) { return run_v5_tail<false, false>(a, st, false); }
static bool run_v6(const lab_args &a, cudaStream_t st) { return run_v5_tail<true, false>(a, st, false); }
static bool run_v8(const lab_args &a, cudaStream_t st) { return run_v5_tail<false, true>(a, st, true); }
/* the library's routes, the baselines */
static bool run_v9(const lab_args &a, cudaStream_t st) { return lab_route(a, st, K_W4A16_KERNEL_SPLITK); }
static bool run_v4(const lab_args &a, cudaStream_t st) { return lab_route(a, st, K_W4A16_KERNEL_FALLBACK); }

int main(int argc, char **argv)
{
    static const lab_version versions[] = {
        {1, "naive", run_v1},          {2, "v2 cp.async", run_v2}, {5, "v5 tail", run_v5},
        {6, "v6 ring", run_v6},        {8, "v8 pre-sum", run_v8},  {9, "splitk route", run_v9},
        {4, "fallback route", run_v4},
    };
    /* odd M, every instance (8 / 16 / 32 / 64 rows), group sizes 32..256, G = 48 (v5 cannot
     * take it), per-channel G = K */
    static const lab_shape checks[] = {
        {"small", 1, 128, 128, 128},   {"small", 3, 320, 384, 32},     {"small", 13, 256, 4096, 128},
        {"small", 16, 576, 1024, 64},  {"small", 33, 128, 1536, 256},  {"small", 64, 192, 256, 64},
        {"odd-G", 5, 128, 96, 48},     {"per-channel", 1, 128, 4096, 4096},
        {"per-channel", 41, 128, 4096, 4096},
    };
    static const lab_shape timings[] = {
        {"7B gate_up", 1, 22016, 4096, 128}, {"7B o", 1, 4096, 4096, 128},
        {"7B qkv", 16, 12288, 4096, 128},    {"70B gate_up", 16, 57344, 8192, 128},
        {"7B down", 64, 4096, 11008, 128},
        /* G = 48: what moved from v2 to the fallback (v4) when v2 left the library */
        {"4032x4096 G=48", 1, 4096, 4032, 48}, {"4032x4096 G=48", 16, 4096, 4032, 48},
        {"4032x4096 G=48", 64, 4096, 4032, 48},
    };
    return lab_main(argc, argv, "w4a16_decode", versions, (int)(sizeof(versions) / sizeof(versions[0])),
                    checks, (int)(sizeof(checks) / sizeof(checks[0])), timings,
                    (int)(sizeof(timings) / sizeof(timings[0])));
}

/*
 * k_bench.cu - `qshard bench kernel`: the W4A16 routes against the device copy bandwidth and
 * cuBLAS fp16, measured in ONE run, and three side benchmarks (floor, stream, sample).
 *
 * `qshard bench kernel w4a16 [--m 1,16,64,256,4096] [--shapes llama2-7b,...] [--routes ...]`:
 * for every (model layer shape after the TP split, M):
 *   - our linear by route (k_w4a16_route_pick + k_w4a16_launch; auto = the router's table, or a
 *     kernel forced: splitk, wgmma, dq_gemm, fallback; acc = auto with the fp32-accumulator
 *     epilogue alone, the consumer's finish not timed); routes that cannot run the shape here
 *     are skipped,
 *   - cuBLAS fp16 GEMM (cublasGemmEx, fp32 compute) on the same shape with fp16 weights,
 * each validated once against dequant + cuBLAS before timing (a wrong kernel gets no time).
 * Weights rotate among copies that together exceed 3x the L2 size, so every call streams from
 * HBM; CUDA events around a loop of calls after warm-up; the median of 5 loops is printed
 * (harness: kernels/k_bench.cuh). Bytes counted for W4A16: qweight + scales + qzeros
 * (K*N/2 + (K/G)*N*2.5); for cuBLAS: the fp16 weight K*N*2. Activations and outputs are not
 * counted (small at decode). "% copy" = GB/s over the device-to-device cudaMemcpy bandwidth
 * measured at the start (bytes read + bytes written), "x cuBLAS" = cuBLAS time / our time.
 *
 * Output: one line per config: op shape M route | us | GB/s | % copy | TFLOP/s | x cuBLAS.
 * `qshard bench kernel floor`, `... stream`, `... sample`: see bench_floor, bench_stream and
 * bench_sample below. Entry point: bench_kernel_main (kernels/k_bench.h).
 */
#include <cerrno>
#include <cctype>
#include <cublas_v2.h> /* cublasCreate */
#include <getopt.h>
#include <time.h> /* clock_gettime */

#include <algorithm>
#include <string>
#include <vector>

#include "k_bench.cuh" /* kb_time_us, kb_copy_bandwidth_gbs, rand_fill, cublas_linear, validate */
#include "k_bench.h"   /* bench_kernel_main, K_BENCH_EXIT_* */
#include "qs_log.h"    /* qs_log_set_quiet: routes that do not apply are skipped silently */
#include "rt_sample.h" /* rt_sampler: the host path that `bench kernel sample` compares with */

namespace {

struct bmodel { const char *name; int H, I, heads, kv, hd; };
const bmodel BMODELS[] = {
    {"llama2-7b", 4096, 11008, 32, 32, 128},
    {"llama3-8b", 4096, 14336, 32, 8, 128},
    {"llama2-13b", 5120, 13824, 40, 40, 128},
    {"70b", 8192, 28672, 64, 8, 128},
};

struct bshape { std::string name; int K, N; };

/* Layer shapes of one rank (DESIGN 5 TP rules). */
bool rank_shapes(const bmodel &m, int tp, int G, std::vector<bshape> &out)
{
    if (tp < 1 || m.heads % tp) return false;
    int nkv;
    if (tp <= m.kv) { if (m.kv % tp) return false; nkv = m.kv / tp; }
    else { if (tp % m.kv) return false; nkv = 1; }
    const int nq = m.heads / tp;
    int a = G, b = 64;
    while (b) { const int t = a % b; a = b; b = t; }
    const long up = (long)(G / a * 64) * tp;
    const int I_r = (int)((m.I + up - 1) / up * up / tp);
    const std::string p = std::string(m.name) + (tp > 1 ? "/tp" + std::to_string(tp) : "") + " ";
    out.push_back({p + "qkv", m.H, (nq + 2 * nkv) * m.hd});
    out.push_back({p + "o", nq * m.hd, m.H});
    out.push_back({p + "gate_up", m.H, 2 * I_r});
    out.push_back({p + "down", I_r, m.H});
    return true;
}

kb_clock g_clock = {nullptr, true}; /* the bench stream (made once the options are good); graphs */

std::vector<int> parse_ints(const char *s)
{
    std::vector<int> v;
    std::string t(s);
    size_t p = 0;
    while (p <= t.size()) {
        size_t q = t.find(',', p);
        if (q == std::string::npos) q = t.size();
        if (q > p) v.push_back(atoi(t.substr(p, q - p).c_str()));
        p = q + 1;
    }
    return v;
}


/* --- `bench kernel stream`: read-bandwidth of access patterns (explains the W4A16 numbers) --- */

constexpr int ST_DEPTH = 8; /* 512-byte chunks in flight per warp */

/* pattern 0: each warp reads its own contiguous range of chunks (what split-K/stream-K warps do)
 * pattern 1: the warps of a block interleave over the block's contiguous range
 * pattern 2: all warps of the grid interleave (warp w reads chunks w, w + W, ...)
 * use_cp: cp.async.cg ring in shared memory, else ld.global.nc registers */
template <bool USE_CP>
__global__ void __launch_bounds__(128) stream_kernel(const uint4 *__restrict__ src, size_t n_chunks,
                                                     int pattern, unsigned *__restrict__ sink)
{
    __shared__ __align__(16) uint4 ring[4][ST_DEPTH][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const size_t W = (size_t)gridDim.x * 4, gw = (size_t)blockIdx.x * 4 + warp;
    size_t first, step, count;
    if (pattern == 0) {
        const size_t per = (n_chunks + W - 1) / W;
        first = gw * per; step = 1;
        count = first < n_chunks ? min(per, n_chunks - first) : 0;
    } else if (pattern == 1) {
        const size_t perb = (n_chunks + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * perb;
        const size_t nb = b0 < n_chunks ? min(perb, n_chunks - b0) : 0;
        first = b0 + warp; step = 4;
        count = nb > (size_t)warp ? (nb - warp + 3) / 4 : 0;
    } else {
        first = gw; step = W;
        count = gw < n_chunks ? (n_chunks - gw + W - 1) / W : 0;
    }
    unsigned acc = 0;
    if (USE_CP) {
        for (int u = 0; u < ST_DEPTH - 1; ++u) {
            if ((size_t)u < count) k_cp_async16(&ring[warp][u][lane], src + (first + u * step) * 32 + lane, 16);
            k_cp_async_commit();
        }
        int slot = 0;
        for (size_t i = 0; i < count; ++i) {
            const size_t ahead = i + ST_DEPTH - 1;
            if (ahead < count)
                k_cp_async16(&ring[warp][(slot + ST_DEPTH - 1) % ST_DEPTH][lane], src + (first + ahead * step) * 32 + lane, 16);
            k_cp_async_commit();
            k_cp_async_wait<ST_DEPTH - 1>();
            const uint4 v = ring[warp][slot][lane];
            acc ^= v.x + v.y * 3 + v.z * 5 + v.w * 7;
            slot = (slot + 1) % ST_DEPTH;
        }
        k_cp_async_wait<0>();
    } else {
        for (size_t i = 0; i < count; i += ST_DEPTH) {
            uint4 v[ST_DEPTH];
#pragma unroll
            for (int u = 0; u < ST_DEPTH; ++u)
                if (i + u < count) v[u] = k_ld_stream_v4(src + (first + (i + u) * step) * 32 + lane);
#pragma unroll
            for (int u = 0; u < ST_DEPTH; ++u)
                if (i + u < count) acc ^= v[u].x + v[u].y * 3 + v[u].z * 5 + v[u].w * 7;
        }
    }
    if (acc == 0x12345678u) sink[0] = acc; /* keeps the loads alive */
}

int bench_stream(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *buf = nullptr;
    unsigned *sink = nullptr;
    K_CUDA_CHECK(cudaMalloc(&buf, bytes));
    K_CUDA_CHECK(cudaMalloc(&sink, 4));
    rand_fill(buf, bytes, 5);
    const double copy_bw = kb_copy_bandwidth_gbs(g_clock.stream);
    int sms = 0;
    K_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("read patterns over 1 GiB, 512-byte chunks, %d in flight per warp; copy %.0f GB/s\n",
           ST_DEPTH, copy_bw);
    const char *pname[3] = {"warp-contiguous", "block-interleaved", "grid-interleaved"};
    for (int cp = 0; cp < 2; ++cp)
        for (int pat = 0; pat < 3; ++pat)
            for (int bps : {4, 8, 16}) {
                const int blocks = sms * bps;
                const double us = kb_time_us(g_clock, [&](int) {
                    if (cp) stream_kernel<true><<<blocks, 128, 0, g_clock.stream>>>((const uint4 *)buf, bytes / 512, pat, sink);
                    else stream_kernel<false><<<blocks, 128, 0, g_clock.stream>>>((const uint4 *)buf, bytes / 512, pat, sink);
                }, 50);
                printf("stream %-8s %-18s %3d warps/SM | %9.1f us | %6.0f GB/s | %5.1f%% copy\n",
                       cp ? "cp.async" : "ld.nc", pname[pat], bps * 4, us, bytes / (us * 1e3),
                       100.0 * bytes / (us * 1e3) / copy_bw);
            }
    K_CUDA_CHECK(cudaFree(buf));
    K_CUDA_CHECK(cudaFree(sink));
    return K_BENCH_EXIT_OK;
}

/* --- `bench kernel gather`: the act-order input gather (k_gather_cols, DESIGN 4.5) ----------- */

/* Time per call of k_gather_cols at the activation widths of act-order linears (the 7B's
 * qkv/gate_up input H = 4096 and down_proj input I = 11008, the 8B's 14336, the 70B's 8192 and
 * 28672) and M rows (default 1, 16, 64), graph-replayed like a decode step; the per-token cost
 * of a 7B is 3 gathers of 4096 and one of 11008 per layer, 32 layers. */
int bench_gather(const std::vector<int> &ms, double target_ms)
{
    const int widths[] = {4096, 8192, 11008, 14336, 28672};
    const int max_m = *std::max_element(ms.begin(), ms.end());
    const size_t elems = (size_t)max_m * 28672;
    uint16_t *src = nullptr, *dst = nullptr;
    int32_t *perm = nullptr;
    K_CUDA_CHECK(cudaMalloc(&src, elems * 2));
    K_CUDA_CHECK(cudaMalloc(&dst, elems * 2));
    K_CUDA_CHECK(cudaMalloc(&perm, 28672 * sizeof(int32_t)));
    K_CUDA_CHECK(cudaMemset(src, 0, elems * 2));
    std::vector<int32_t> hp(28672);
    for (int j = 0; j < 28672; ++j) hp[j] = (int32_t)(((long long)j * 7919) % 28672); /* a permutation */
    double per_m1[5] = {0};
    for (int M : ms)
        for (int wi = 0; wi < 5; ++wi) {
            const int K = widths[wi];
            std::vector<int32_t> pk(K);
            for (int j = 0; j < K; ++j) pk[j] = (int32_t)(((long long)j * 7919) % K);
            K_CUDA_CHECK(cudaMemcpy(perm, pk.data(), K * sizeof(int32_t), cudaMemcpyHostToDevice));
            const double us = kb_time_us(g_clock, [&](int) {
                if (k_gather_cols(dst, src, perm, M, K, g_clock.stream)) abort();
            }, target_ms);
            if (M == 1) per_m1[wi] = us;
            printf("gather_cols M %4d K %6d | %7.2f us | %6.1f GB/s (read + write)\n", M, K, us,
                   (double)M * K * 4 / (us * 1e3));
        }
    if (per_m1[0] > 0)
        printf("7B act-order per token (32 x (3 x K 4096 + K 11008)) at M 1: %.1f us\n",
               32 * (3 * per_m1[0] + per_m1[2]));
    K_CUDA_CHECK(cudaFree(src));
    K_CUDA_CHECK(cudaFree(dst));
    K_CUDA_CHECK(cudaFree(perm));
    return K_BENCH_EXIT_OK;
}

/* --- `bench kernel floor`: the per-call floor of a chain of weight-streaming kernels -------- */
/*
 * What a kernel that does nothing but stream one linear's W4A16 bytes (qweight + scales + zeros,
 * K*N/2 + 2.5*N*K/G) costs per call when calls are chained as the runtime chains its linears
 * (CUDA graph, Programmatic Dependent Launch, a dependent output), with v5's M = 1 decomposition:
 * 4 warps per block, one 64-column n-tile per warp, S split-K slices per n-tile (resident block
 * slots filled, >= 8 tiles per slice), chunks of 512 B read 8 at a time per warp into registers
 * (bench kernel stream's warp-contiguous pattern), the first 8 requested before
 * griddepcontrol.wait. No dequantisation, no tensor cores. Modes (after the stream):
 *   0 one plain store per warp (no reduction at all);
 *   1 v5's split-K tail: red.global.add.v4 of 64 fp32 per warp into a workspace, __threadfence,
 *     a counter per n-tile, the last slice reads the row back, writes y and re-zeroes (the
 *     dependent round trips of w4a16_splitk_flush_staged at M = 1);
 *   2 mode 1 without PDL;
 *   3 the vector reductions only (no fence, no counter: a consumer would read the fp32 sums
 *     after the kernel boundary);
 *   4 mode 1 with the counter as atom.add.acq_rel.gpu instead of the two __threadfence (what
 *     v5 does since this benchmark);
 *   5 mode 4 with S rounded to a multiple of 4 and the 4 warps of a block on 4 slices of one
 *     n-tile: summed in shared memory first, one reduction and one arrival per block.
 * Mode 0 against the copy bandwidth is the cost of chaining calls of this size; mode 1 against
 * mode 0 the split-K tail; our W4A16 time against mode 1 the dequantisation and product.
 */
template <int MODE>
__global__ void __launch_bounds__(128) floor_kernel(const uint4 *__restrict__ src, size_t n_chunks,
                                                    int NT, int S, float *__restrict__ ws,
                                                    unsigned *__restrict__ counters, float *__restrict__ y)
{
    const int lane = threadIdx.x % 32, gw = blockIdx.x * 4 + threadIdx.x / 32;
    const size_t W = (size_t)NT * S, per = (n_chunks + W - 1) / W, first = (size_t)gw * per;
    const size_t count = gw < (int)W && first < n_chunks ? min(per, n_chunks - first) : 0;
    uint4 v[ST_DEPTH];
#pragma unroll
    for (int u = 0; u < ST_DEPTH; ++u)
        if ((size_t)u < count) v[u] = k_ld_stream_v4(src + (first + u) * 32 + lane);
    k_pdl_launch_dependents();
    k_pdl_wait();
    unsigned acc = 0;
    for (size_t i = 0; i < count; i += ST_DEPTH) {
        if (i > 0) {
#pragma unroll
            for (int u = 0; u < ST_DEPTH; ++u)
                if (i + u < count) v[u] = k_ld_stream_v4(src + (first + i + u) * 32 + lane);
        }
#pragma unroll
        for (int u = 0; u < ST_DEPTH; ++u)
            if (i + u < count) acc ^= v[u].x + v[u].y * 3 + v[u].z * 5 + v[u].w * 7;
    }
    if (gw >= (int)W) return;
    const int nt = gw / S;
    if (MODE == 0) {
        if (lane == 0) y[gw] = (float)acc;
        return;
    }
    const float f = (float)(acc & 0xffff) * 1e-9f;
    if (MODE == 5) { /* S % 4 == 0, so the block's 4 warps share nt */
        __shared__ float4 part[4][16];
        const int warp = threadIdx.x / 32;
        if (lane < 16) part[warp][lane] = make_float4(f, f, f, f);
        __syncthreads();
        if (warp != 0) return;
        if (lane < 16) {
            float4 t = part[0][lane];
            for (int w = 1; w < 4; ++w) {
                t.x += part[w][lane].x; t.y += part[w][lane].y; t.z += part[w][lane].z; t.w += part[w][lane].w;
            }
            k_red_add_v4(ws + nt * 64 + lane * 4, t);
        }
    } else if (lane < 16) {
        k_red_add_v4(ws + nt * 64 + lane * 4, make_float4(f, f, f, f));
    }
    if (MODE == 3) return;
    const bool ar = MODE == 4 || MODE == 5;
    if (!ar) __threadfence();
    __syncwarp();
    unsigned old = 0;
    if (lane == 0) old = ar ? k_atom_add_acq_rel(&counters[nt], 1u) : atomicAdd(&counters[nt], 1u);
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old != (unsigned)(MODE == 5 ? S / 4 : S) - 1) return;
    if (!ar) __threadfence();
    __syncwarp();
    if (lane < 16) {
        float4 *p = reinterpret_cast<float4 *>(ws + nt * 64) + lane;
        const float4 t = __ldcg(p);
        reinterpret_cast<float4 *>(y + nt * 64)[lane] = t;
        __stcg(p, make_float4(0, 0, 0, 0));
    }
    if (lane == 0) counters[nt] = 0;
}

int bench_floor(const std::vector<bshape> &list, int G, double target_ms)
{
    int sms = 0;
    K_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int l2 = 0;
    K_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const double copy_bw = kb_copy_bandwidth_gbs(g_clock.stream);
    constexpr int N_MODES = 6;
    const char *mname[N_MODES] = {"0 stream + store", "1 + split-K tail", "2 = 1 without PDL",
                                  "3 reductions only", "4 = 1, acq_rel counter",
                                  "5 = 4, block pre-sum"};
    printf("per-call floor of chained weight-streaming kernels (v5's M = 1 decomposition); copy %.0f GB/s\n", copy_bw);
    printf("%-30s %7s", "shape (K x N)", "MB");
    for (int m = 0; m < N_MODES; ++m) printf(" | %-22s", mname[m]);
    printf("\n");
    for (const auto &s : list) {
        const size_t bytes = (size_t)s.K * s.N / 2 + (size_t)s.N * (s.K / G) * 5 / 2;
        const size_t region = (bytes + 4095) / 4096 * 4096;
        const int R = std::max(2, (int)((3.0 * l2 + region - 1) / region));
        const int NT = s.N / 64, KT = s.K / 16;
        const int n_groups = (NT + 3) / 4;
        const int S = std::max(1, std::min(std::max(1, KT / 8), 4 * sms / n_groups));
        const int blocks = (NT * S + 3) / 4;
        const int S4 = std::max(4, (S + 2) / 4 * 4);
        unsigned char *buf = nullptr;
        float *ws = nullptr, *y = nullptr;
        unsigned *cnt = nullptr;
        K_CUDA_CHECK(cudaMalloc(&buf, region * R));
        K_CUDA_CHECK(cudaMalloc(&ws, (size_t)NT * 64 * 4));
        K_CUDA_CHECK(cudaMalloc(&y, (size_t)NT * std::max(S, S4) * 64 * 4));
        K_CUDA_CHECK(cudaMalloc(&cnt, (size_t)NT * 4));
        K_CUDA_CHECK(cudaMemset(ws, 0, (size_t)NT * 64 * 4));
        K_CUDA_CHECK(cudaMemset(cnt, 0, (size_t)NT * 4));
        rand_fill(buf, region * R, 11);
        K_CUDA_CHECK(cudaDeviceSynchronize());
        const size_t n_chunks = bytes / 512;
        double t[N_MODES];
        for (int mode = 0; mode < N_MODES; ++mode)
            t[mode] = kb_time_us(g_clock, [&](int i) {
                const uint4 *cur = reinterpret_cast<const uint4 *>(buf + region * (i % R));
                const dim3 g(blocks), b(128);
                switch (mode) {
                case 0: k_launch_ex(floor_kernel<0>, g, b, 0, g_clock.stream, true, cur, n_chunks, NT, S, ws, cnt, y); break;
                case 1: k_launch_ex(floor_kernel<1>, g, b, 0, g_clock.stream, true, cur, n_chunks, NT, S, ws, cnt, y); break;
                case 2: k_launch_ex(floor_kernel<1>, g, b, 0, g_clock.stream, false, cur, n_chunks, NT, S, ws, cnt, y); break;
                case 3: k_launch_ex(floor_kernel<3>, g, b, 0, g_clock.stream, true, cur, n_chunks, NT, S, ws, cnt, y); break;
                case 4: k_launch_ex(floor_kernel<4>, g, b, 0, g_clock.stream, true, cur, n_chunks, NT, S, ws, cnt, y); break;
                default:
                    k_launch_ex(floor_kernel<5>, dim3(NT * S4 / 4), b, 0, g_clock.stream, true, cur, n_chunks, NT, S4, ws, cnt, y);
                    break;
                }
            }, target_ms);
        char name[96];
        snprintf(name, sizeof name, "%s (%dx%d)", s.name.c_str(), s.K, s.N);
        printf("%-30s %7.2f", name, bytes / 1e6);
        for (int mode = 0; mode < N_MODES; ++mode)
            printf(" | %7.2f us %5.1f%% copy", t[mode], 100.0 * bytes / (t[mode] * 1e3) / copy_bw);
        printf("  (S=%d, %d blocks; mode 5 S=%d)\n", S, blocks, S4);
        K_CUDA_CHECK(cudaFree(buf)); K_CUDA_CHECK(cudaFree(ws)); K_CUDA_CHECK(cudaFree(y)); K_CUDA_CHECK(cudaFree(cnt));
    }
    return K_BENCH_EXIT_OK;
}

/* --- `bench kernel sample`: next-token choice on the GPU vs on the host ------------------------ */
/*
 * Per vocabulary size, logit shape and sampler setting, the time of one token's choice as
 * `qshard run` makes it, wall clock per call, median of 3 loops of 200:
 *   gpu:  k_sample on the device row, then the 4-byte id to the host (rt.h sample);
 *   host: the row to pageable host memory (the runtime's download) + rt_sampler_next.
 * Logits: "flat" N(0, 2^2) (a random model); "peaked" the same plus 12 on 16 ids (a trained
 * model's few likely tokens). The ids of both paths are compared on every call.
 */
double b_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int bench_sample(const std::vector<int> &vocabs)
{
    struct cfg { const char *name; float t; int k; float p, min_p, r; };
    const cfg cfgs[] = {
        {"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f},
        {"T0.8", 0.8f, 0, 1.0f, 0.0f, 1.0f},
        {"T0.8 k40", 0.8f, 40, 1.0f, 0.0f, 1.0f},
        {"T0.8 p0.95", 0.8f, 0, 0.95f, 0.0f, 1.0f},
        {"T0.8 k40 p0.95", 0.8f, 40, 0.95f, 0.0f, 1.0f},
        {"T0.7 r1.1 minp0.05", 0.7f, 0, 1.0f, 0.05f, 1.1f},
    };
    printf("%-8s %-7s %-20s | %9s | %9s | %7s | %s\n", "vocab", "logits", "sampler", "gpu us",
           "host us", "x host", "ids equal");
    uint64_t rs = 0x9E3779B97F4A7C15ULL;
    auto rnd = [&rs]() { rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27; return rs * 0x2545F4914F6CDD1DULL; };
    for (int V : vocabs) {
        std::vector<float> lg((size_t)V), host((size_t)V);
        float *dl = nullptr;
        int32_t *did = nullptr, *hid = nullptr;
        uint8_t *dseen = nullptr;
        K_CUDA_CHECK(cudaMalloc(&dl, (size_t)V * 4));
        K_CUDA_CHECK(cudaMalloc(&dseen, (size_t)V / 8 + 1));
        K_CUDA_CHECK(cudaMalloc(&did, 4));
        K_CUDA_CHECK(cudaMallocHost(&hid, 4));
        for (int peaked = 0; peaked < 2; ++peaked) {
            for (int i = 0; i < V; ++i) {
                const double u1 = ((rnd() >> 11) + 1) * 0x1p-53, u2 = (rnd() >> 11) * 0x1p-53;
                lg[i] = (float)(2.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
            }
            if (peaked)
                for (int j = 0; j < 16; ++j) lg[rnd() % (uint64_t)V] += 12.0f;
            K_CUDA_CHECK(cudaMemcpy(dl, lg.data(), (size_t)V * 4, cudaMemcpyHostToDevice));
            for (const cfg &c : cfgs) {
                struct rt_sample_params sp = rt_sample_params_default();
                sp.temperature = c.t; sp.top_k = c.k; sp.top_p = c.p; sp.min_p = c.min_p;
                sp.repeat_penalty = c.r; sp.seed = 1;
                struct rt_sampler smp = {};
                if (rt_sampler_init(&smp, &sp, V) != RT_SAMPLE_ERR_NONE) return K_BENCH_EXIT_RUNTIME;
                for (int j = 0; j < 64; ++j) rt_sampler_accept(&smp, (int32_t)(rnd() % (uint64_t)V));
                K_CUDA_CHECK(cudaMemcpy(dseen, smp.seen, ((size_t)V + 7) / 8, cudaMemcpyHostToDevice));
                const struct k_sample_params kp = {c.t, c.k, c.p, c.min_p, c.r};
                const int n = 200;
                std::vector<double> tg, th;
                int equal = 0, total = 0;
                for (int loop = 0; loop < 3; ++loop) {
                    std::vector<double> us(n);
                    std::vector<int32_t> gid(n), hid_v(n);
                    /* the draws the host loop below will make, from a copy of its PRNG */
                    struct rt_sampler ps = smp;
                    std::vector<double> u(n);
                    for (int j = 0; j < n; ++j) u[j] = c.t > 0.0f ? rt_sampler_uniform(&ps) : 0.0;
                    double t0 = b_now();
                    for (int j = 0; j < n; ++j) {
                        if (k_sample(did, nullptr, dl, V, dseen, &kp, u[j], g_clock.stream) != K_ERR_NONE)
                            return K_BENCH_EXIT_RUNTIME;
                        K_CUDA_CHECK(cudaMemcpyAsync(hid, did, 4, cudaMemcpyDeviceToHost, g_clock.stream));
                        K_CUDA_CHECK(cudaStreamSynchronize(g_clock.stream));
                        gid[j] = *hid;
                    }
                    tg.push_back((b_now() - t0) / n * 1e6);
                    t0 = b_now();
                    for (int j = 0; j < n; ++j) {
                        K_CUDA_CHECK(cudaMemcpyAsync(host.data(), dl, (size_t)V * 4, cudaMemcpyDeviceToHost, g_clock.stream));
                        K_CUDA_CHECK(cudaStreamSynchronize(g_clock.stream));
                        if (rt_sampler_next(&smp, host.data(), V, &hid_v[j]) != RT_SAMPLE_ERR_NONE) hid_v[j] = -1;
                    }
                    th.push_back((b_now() - t0) / n * 1e6);
                    for (int j = 0; j < n; ++j) { equal += gid[j] == hid_v[j]; ++total; }
                }
                rt_sampler_free(&smp);
                std::sort(tg.begin(), tg.end());
                std::sort(th.begin(), th.end());
                printf("%-8d %-7s %-20s | %9.1f | %9.1f | %7.2f | %d/%d\n", V,
                       peaked ? "peaked" : "flat", c.name, tg[1], th[1], th[1] / tg[1], equal, total);
                fflush(stdout);
            }
        }
        K_CUDA_CHECK(cudaFree(dl)); K_CUDA_CHECK(cudaFree(dseen)); K_CUDA_CHECK(cudaFree(did));
        K_CUDA_CHECK(cudaFreeHost(hid));
    }
    return K_BENCH_EXIT_OK;
}

/* --- `bench kernel w4a16`: the routes against cuBLAS fp16 ------------------------------------ */

/* One --routes entry: a kernel of the router with the fp16 epilogue, or "acc" (auto with the
 * fp32-accumulator epilogue: the deferred split-K the runtime's decode runs, its finish left to
 * the consumer, so not a candidate for the per-layer best: it writes no y). */
struct broute {
    std::string name;
    enum k_w4a16_kernel kernel;
    enum k_w4a16_epilogue epilogue;
};

/* "auto,splitk,acc,..." -> routes; false (and *bad = the name) for an unknown name. */
bool parse_routes(const char *s, std::vector<broute> &out, std::string *bad)
{
    out.clear();
    std::string t = std::string(s) + ",";
    size_t p = 0, q;
    while ((q = t.find(',', p)) != std::string::npos) {
        const std::string name = t.substr(p, q - p);
        p = q + 1;
        if (name.empty()) continue;
        const int k = name == "acc" ? (int)K_W4A16_KERNEL_AUTO : k_w4a16_kernel_parse(name.c_str());
        if (k < 0) {
            *bad = name;
            return false;
        }
        out.push_back({name, (enum k_w4a16_kernel)k, name == "acc" ? K_W4A16_EPI_ACC : K_W4A16_EPI_Y});
    }
    if (out.empty()) *bad = "(none)";
    return !out.empty();
}

/* The options of bench_kernel_main. */
struct bopts {
    std::vector<int> Ms = {1, 16, 64, 256, 4096}, vocabs;
    std::vector<broute> routes = {{"auto", K_W4A16_KERNEL_AUTO, K_W4A16_EPI_Y}};
    std::string shapes = "llama2-7b,llama3-8b,70b";
    int tp = 1, G = 128;
    double target_ms = 20;
    bool m_given = false;
};

/* kb_linear with the launch of a route on rotation i */
struct bdata : kb_linear {
    using kb_linear::kb_linear;
    /* one launch of `rt` on rotation i (x[i % 2], weight copy i % R) */
    int launch(const k_w4a16_route &rt, int i, cublasHandle_t cub, cudaStream_t st)
    {
        const k_w4a16_weight w = {qw[i % R], qz[i % R], sc[i % R], nullptr};
        const k_w4a16_bufs b = {ws, ws_b, scratch, scratch_b, cub};
        return k_w4a16_launch(&rt, reinterpret_cast<uint16_t *>(x[i % 2]), &w,
                              reinterpret_cast<uint16_t *>(y), static_cast<float *>(ws), &b, st);
    }
};

/* The context every route line of one run shares. */
struct brun {
    cublasHandle_t cub;
    k_w4a16_caps caps;
    double copy_bw;
    int invalid = 0;
};

/* Validate, then time route br on d (shape label `shape`, cuBLAS time t_cub); prints its line.
 * Returns the time in us, 0 when the route does not run this shape here or failed validation. */
double time_route(brun &run, bdata &d, const broute &br, const char *shape, double t_cub,
                  double target_ms)
{
    k_w4a16_route rt;
    qs_log_set_quiet(true); /* a route that cannot take this (M, G) on this GPU: skipped */
    const int rr = k_w4a16_route_pick(&rt, d.M, d.N, d.K, d.G, br.epilogue, br.kernel, &run.caps);
    qs_log_set_quiet(false);
    if (rr != K_ERR_NONE) return 0;
    const bool to_acc = br.epilogue == K_W4A16_EPI_ACC;
    K_CUDA_CHECK(cudaMemset(d.y, 0xFF, (size_t)d.M * d.N * 2));
    int rc = d.launch(rt, 0, run.cub, nullptr);
    if (rc == K_ERR_NONE && to_acc) /* the consumer's part, for the check only */
        rc = k_w4a16_acc_finish(reinterpret_cast<uint16_t *>(d.y), static_cast<float *>(d.ws), d.M,
                                d.N, nullptr);
    double rel = 0;
    if (rc != K_ERR_NONE || !validate(d.y, d.yref, (size_t)d.M * d.N, &rel)) {
        printf("%-34s %-9s | INVALID (rc %d, rel L2 %.3g vs dequant+cuBLAS): not timed\n", shape,
               br.name.c_str(), rc, rel);
        ++run.invalid;
        return 0;
    }
    const double t = kb_time_us(g_clock, [&](int i) { d.launch(rt, i, run.cub, g_clock.stream); },
                                target_ms);
    if (to_acc) K_CUDA_CHECK(cudaMemset(d.ws, 0, d.ws_b)); /* "acc" left its sums there */
    const double gbs = d.q_bytes / (t * 1e3), flops = 2.0 * d.M * d.K * d.N;
    printf("%-34s %-9s | %9.2f | %7.0f | %5.1f%% | %7.1f | %7.2fx\n", shape, br.name.c_str(), t,
           gbs, 100.0 * gbs / run.copy_bw, flops / (t * 1e6), t_cub / t);
    return t;
}

/* Buffers the routes may need for (M, N, K, G): the largest workspace and scratch they ask. */
void route_needs(const std::vector<broute> &routes, const k_w4a16_caps &caps, int M, int N, int K,
                 int G, size_t *ws, size_t *scratch)
{
    *ws = k_w4a16_workspace_bytes(M, N); /* also the "acc" sums */
    *scratch = 0;
    qs_log_set_quiet(true);
    for (const auto &br : routes) {
        k_w4a16_route rt;
        if (k_w4a16_route_pick(&rt, M, N, K, G, br.epilogue, br.kernel, &caps) != K_ERR_NONE) continue;
        *ws = std::max(*ws, rt.workspace_bytes);
        *scratch = std::max(*scratch, rt.scratch_bytes);
    }
    qs_log_set_quiet(false);
}

/* `bench kernel w4a16`: every M x layer shape, the routes and cuBLAS fp16; then per layer. */
int bench_w4a16(const bopts &o, const std::vector<bshape> &list)
{
    int dev = 0;
    cudaDeviceProp prop;
    K_CUDA_CHECK(cudaGetDevice(&dev));
    K_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    if (prop.major * 10 + prop.minor < K_SM80) {
        fprintf(stderr, "qshard bench kernel: %s is sm_%d%d; the kernels need sm_80 or newer\n",
                prop.name, prop.major, prop.minor);
        return K_BENCH_EXIT_RUNTIME;
    }
    brun run;
    B_CUBLAS_CHECK(cublasCreate(&run.cub));
    B_CUBLAS_CHECK(cublasSetStream(run.cub, g_clock.stream));
    (void)k_w4a16_caps_query(&run.caps);
    const double l2 = prop.l2CacheSize;
    run.copy_bw = kb_copy_bandwidth_gbs(g_clock.stream);
    printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MB, memory %.0f GB; wgmma %s, PDL %s\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, l2 / 1e6,
           prop.totalGlobalMem / 1e9, run.caps.wgmma ? "on" : "off", k_get_pdl() ? "on" : "off");
    printf("device-to-device copy (cudaMemcpy 1 GiB, read + write): %.0f GB/s\n", run.copy_bw);
    printf("timing: %s, median of 5 loops, weights rotated over >= 3x L2\n",
           g_clock.graph ? "CUDA-graph replays of n calls" : "back-to-back launches (--no-graph)");
    printf("%-34s %-9s | %9s | %7s | %6s | %7s | %8s\n", "op shape (K x N) M", "route", "us",
           "GB/s", "% copy", "TFLOP/s", "x cuBLAS");
    struct sum { double ours = 0, cub = 0; };
    std::vector<std::pair<std::string, sum>> sums;
    for (int M : o.Ms)
        for (const auto &s : list) {
            size_t ws_b, scratch_b;
            route_needs(o.routes, run.caps, M, s.N, s.K, o.G, &ws_b, &scratch_b);
            bdata d(M, s.N, s.K, o.G, l2, ws_b, scratch_b);
            char shape[96];
            snprintf(shape, sizeof shape, "%s (%dx%d) M=%d", s.name.c_str(), s.K, s.N, M);
            cublas_linear(run.cub, d.x[0], d.w16[0], d.yref, M, s.N, s.K); /* the reference */
            const double t_cub = kb_time_us(g_clock, [&](int i) {
                cublas_linear(run.cub, d.x[i % 2], d.w16[i % d.R16], d.y, M, s.N, s.K);
            }, o.target_ms);
            double t_best = 0;
            for (const auto &br : o.routes) {
                const double t = time_route(run, d, br, shape, t_cub, o.target_ms);
                if (t > 0 && br.epilogue == K_W4A16_EPI_Y && (t_best == 0 || t < t_best)) t_best = t;
            }
            printf("%-34s %-9s | %9.2f | %7.0f | %5.1f%% | %7.1f |\n", shape, "cublas", t_cub,
                   d.w16_b / (t_cub * 1e3), 100.0 * (d.w16_b / (t_cub * 1e3)) / run.copy_bw,
                   2.0 * M * s.K * s.N / (t_cub * 1e6));
            std::string key = s.name.substr(0, s.name.find(' ')) + " M=" + std::to_string(M);
            auto it = std::find_if(sums.begin(), sums.end(), [&](const auto &p) { return p.first == key; });
            if (it == sums.end()) { sums.push_back({key, sum()}); it = sums.end() - 1; }
            it->second.ours += t_best;
            it->second.cub += t_cub;
        }
    printf("\nper layer (qkv + o + gate_up + down), best fp16-output route vs cuBLAS fp16:\n");
    for (const auto &p : sums)
        printf("  %-24s w4a16 %9.1f us   cublas %9.1f us   %5.2fx\n", p.first.c_str(),
               p.second.ours, p.second.cub, p.second.ours > 0 ? p.second.cub / p.second.ours : 0.0);
    B_CUBLAS_CHECK(cublasDestroy(run.cub));
    if (run.invalid) {
        fprintf(stderr, "qshard bench kernel: %d configs failed validation\n", run.invalid);
        return K_BENCH_EXIT_RUNTIME;
    }
    return K_BENCH_EXIT_OK;
}

/* --- options ------------------------------------------------------------------------------- */

void usage(FILE *f)
{
    fprintf(f,
            "usage: qshard bench kernel w4a16 [options]\n"
            "       qshard bench kernel stream   (read bandwidth of the access patterns)\n"
            "       qshard bench kernel floor [--shapes ...] [--tp N] [--group N]\n"
            "                                    (per-call floor: chained kernels that only stream\n"
            "                                    each shape's W4A16 bytes)\n"
            "       qshard bench kernel sample [--vocab 32000,128256]\n"
            "                                    (next-token choice: k_sample vs download + host sampler)\n"
            "       qshard bench kernel gather [--m 1,16,64]\n"
            "                                    (the act-order input gather, k_gather_cols)\n"
            "  --m LIST         activation rows M (default 1,16,64,256,4096)\n"
            "  --shapes LIST    llama2-7b,llama3-8b,llama2-13b,70b (default llama2-7b,llama3-8b,70b)\n"
            "                   or one layer as KxN, e.g. 8192x57344 (--tp does not apply to it)\n"
            "  --tp N           tensor-parallel size of the layer shapes (default 1)\n"
            "  --routes LIST    W4A16 routes to time (kernels.h): auto (the router's choice),\n"
            "                   splitk (v5 deferred split-K + finish, M <= 64), wgmma (v7, sm_90a),\n"
            "                   dq_gemm (dequant + cuBLAS), fallback (v4 stream-K, M <= 64), acc\n"
            "                   (auto with the fp32-accumulator epilogue: the deferred linear alone,\n"
            "                   as the runtime's decode runs it, M <= 64); a route that cannot run\n"
            "                   a shape is skipped (default auto)\n"
            "  --group N        group size G (default 128)\n"
            "  --ms T           target milliseconds per timed loop (default 20)\n"
            "  --no-graph       time back-to-back launches instead of CUDA-graph replays\n"
            "  --no-pdl         launch without Programmatic Dependent Launch (k_set_pdl(0))\n"
            "  --trace          print each W4A16 launch's shape (slices, blocks, shared memory)\n"
            "  -h, --help       this text\n"
            "The experiments that are not routes (v1, v2, v3, v6, v8, v5 with its in-kernel\n"
            "split-K tail) are programs of their own: `make lab`, kernels/lab/README.md.\n");
}

/* Parse a comma list of positive ints for option `what`; false (reported) on a bad value. */
bool parse_positive(const char *s, const char *what, std::vector<int> &out)
{
    out = parse_ints(s);
    for (int v : out)
        if (v < 1) {
            fprintf(stderr, "qshard bench kernel: bad %s value %d\n", what, v);
            return false;
        }
    if (out.empty()) fprintf(stderr, "qshard bench kernel: %s needs at least one value\n", what);
    return !out.empty();
}

/* getopt over argv into *o (and the process-wide switches); K_BENCH_EXIT_OK to go on, -1 after
 * --help, else the usage exit code. */
int parse_options(int argc, char **argv, bopts *o)
{
    static const struct option opts[] = {
        {"m", required_argument, nullptr, 'm'},       {"shapes", required_argument, nullptr, 's'},
        {"tp", required_argument, nullptr, 't'},      {"routes", required_argument, nullptr, 'r'},
        {"group", required_argument, nullptr, 'g'},   {"ms", required_argument, nullptr, 'T'},
        {"no-graph", no_argument, nullptr, 'G'},      {"help", no_argument, nullptr, 'h'},
        {"vocab", required_argument, nullptr, 'V'},   {"no-pdl", no_argument, nullptr, 'P'},
        {"trace", no_argument, nullptr, 'X'},         {nullptr, 0, nullptr, 0}};
    optind = 1;
    int c;
    std::string bad;
    while ((c = getopt_long(argc, argv, "h", opts, nullptr)) != -1) {
        switch (c) {
        case 'm': if (!parse_positive(optarg, "--m", o->Ms)) return K_BENCH_EXIT_USAGE; o->m_given = true; break;
        case 's': o->shapes = optarg; break;
        case 't': o->tp = atoi(optarg); break;
        case 'r':
            if (!parse_routes(optarg, o->routes, &bad)) {
                fprintf(stderr, "qshard bench kernel: unknown --routes value '%s' (auto, splitk, "
                        "acc, wgmma, dq_gemm, fallback)\n", bad.c_str());
                return K_BENCH_EXIT_USAGE;
            }
            break;
        case 'g': o->G = atoi(optarg); break;
        case 'T': o->target_ms = atof(optarg); break;
        case 'G': g_clock.graph = false; break;
        case 'P': k_set_pdl(0); break;
        case 'X': k_set_trace(1); break;
        case 'V': if (!parse_positive(optarg, "--vocab", o->vocabs)) return K_BENCH_EXIT_USAGE; break;
        case 'h': usage(stdout); return -1;
        default: usage(stderr); return K_BENCH_EXIT_USAGE;
        }
    }
    if (o->G < 16 || o->G % 16 || o->G > (1 << 20)) {
        fprintf(stderr, "qshard bench kernel: --group %d: must be a multiple of 16 in [16, 2^20]\n", o->G);
        return K_BENCH_EXIT_USAGE;
    }
    if (!(o->target_ms > 0 && o->target_ms <= 60000)) {
        fprintf(stderr, "qshard bench kernel: --ms %g: must be in (0, 60000]\n", o->target_ms);
        return K_BENCH_EXIT_USAGE;
    }
    return K_BENCH_EXIT_OK;
}

/* --shapes -> layer shapes (model sets split tp ways, or one KxN); false (reported) on a bad one. */
bool parse_shapes(const bopts &o, std::vector<bshape> &list)
{
    std::string t = o.shapes + ",";
    size_t p = 0, q;
    while ((q = t.find(',', p)) != std::string::npos) {
        const std::string name = t.substr(p, q - p);
        p = q + 1;
        if (name.empty()) continue;
        /* one layer given as K x N (one rank's shape, no TP split applied) */
        const char *s0 = name.c_str();
        char *e1 = nullptr, *e2 = nullptr;
        errno = 0;
        const long K = isdigit((unsigned char)s0[0]) ? strtol(s0, &e1, 10) : -1;
        const long N = K >= 0 && *e1 == 'x' && isdigit((unsigned char)e1[1]) ? strtol(e1 + 1, &e2, 10) : -1;
        if (N >= 0 && *e2 == '\0') {
            const long MAXD = 1L << 20; /* 2^20 x 2^20 / 2 bytes = 512 GiB: any real layer fits */
            if (errno || K < 16 || N < 64 || K > MAXD || N > MAXD || K % o.G || K % 16 || N % 64) {
                fprintf(stderr, "qshard bench kernel: shape %s: K must be a multiple of 16 and "
                        "of --group %d, N a multiple of 64, both positive and at most 2^20\n", s0, o.G);
                return false;
            }
            list.push_back({name, (int)K, (int)N});
            continue;
        }
        const bmodel *bm = nullptr;
        for (const auto &m : BMODELS)
            if (name == m.name) bm = &m;
        if (!bm) {
            fprintf(stderr, "qshard bench kernel: unknown shape set '%s'\n", name.c_str());
            return false;
        }
        if (!rank_shapes(*bm, o.tp, o.G, list)) {
            fprintf(stderr, "qshard bench kernel: %s cannot be split %d ways\n", bm->name, o.tp);
            return false;
        }
    }
    return true;
}

/* A blocking stream: setup work on the legacy default stream is ordered before it; made once
 * the arguments are known to be good (usage errors come first, also without a GPU). */
bool need_stream(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1 ||
        (!g_clock.stream && cudaStreamCreate(&g_clock.stream) != cudaSuccess)) {
        fprintf(stderr, "qshard bench kernel: no usable CUDA device (%s)\n",
                cudaGetErrorString(cudaGetLastError()));
        return false;
    }
    return true;
}

} // namespace

int bench_kernel_main(int argc, char **argv)
{
    bopts o;
    const int rc = parse_options(argc, argv, &o);
    if (rc != K_BENCH_EXIT_OK) return rc < 0 ? K_BENCH_EXIT_OK : rc;
    const char *op = optind < argc ? argv[optind] : "";
    if (strcmp(op, "stream") == 0) return need_stream() ? bench_stream() : K_BENCH_EXIT_RUNTIME;
    if (strcmp(op, "gather") == 0)
        return need_stream() ? bench_gather(o.m_given ? o.Ms : std::vector<int>{1, 16, 64}, o.target_ms)
                             : K_BENCH_EXIT_RUNTIME;
    if (strcmp(op, "sample") == 0)
        return need_stream() ? bench_sample(o.vocabs.empty() ? std::vector<int>{32000, 128256} : o.vocabs)
                             : K_BENCH_EXIT_RUNTIME;
    if (strcmp(op, "floor") != 0 && strcmp(op, "w4a16") != 0) {
        fprintf(stderr, "qshard bench kernel: name the op (w4a16, floor, gather, sample or stream)\n");
        usage(stderr);
        return K_BENCH_EXIT_USAGE;
    }
    std::vector<bshape> list;
    if (!parse_shapes(o, list)) return K_BENCH_EXIT_USAGE;
    if (!need_stream()) return K_BENCH_EXIT_RUNTIME;
    return strcmp(op, "floor") == 0 ? bench_floor(list, o.G, o.target_ms) : bench_w4a16(o, list);
}

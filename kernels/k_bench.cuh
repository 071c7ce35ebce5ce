/*
 * k_bench.cuh - the measuring harness of `qshard bench kernel` (kernels/k_bench.cu) and of the
 * experiments in kernels/lab/: seeded device fills, CUDA-event timing of a chain of calls (as
 * CUDA-graph replays or back-to-back launches), the device-to-device copy bandwidth that the
 * "% copy" columns divide by, the cuBLAS fp16 baseline, and the rel-L2 check that every config
 * passes before it is timed (a wrong kernel gets no time). In the style of llm.c's
 * dev/cuda/common.h. Host + device code for .cu programs only (C++17).
 */
#ifndef QS_K_BENCH_CUH
#define QS_K_BENCH_CUH

#include <cublas_v2.h> /* cublasGemmEx */
#include <math.h>

#include <algorithm>
#include <vector>

#include "k_common.cuh" /* K_CUDA_CHECK, K_LAUNCH_CHECK */

#define B_CUBLAS_CHECK(expr)                                                                \
    do {                                                                                    \
        cublasStatus_t s_ = (expr);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            fprintf(stderr, "qshard: cuBLAS error %d (%s) at %s:%d\n", (int)s_, #expr,      \
                    __FILE__, __LINE__);                                                    \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

namespace { /* internal linkage in every program that includes it (inline: used or not) */

__global__ void fill_bytes(uint32_t *p, size_t n_words, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_words;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15; h *= 0x85EBCA77u; h ^= h >> 13; h *= 0xC2B2AE3Du; h ^= h >> 16;
        p[i] = h;
    }
}
__global__ void fill_f16(__half *p, size_t n, float lo, float hi, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15; h *= 0x85EBCA77u; h ^= h >> 13; h *= 0xC2B2AE3Du; h ^= h >> 16;
        p[i] = __float2half_rn(lo + (hi - lo) * (float)(h >> 8) * (1.0f / 16777216.0f));
    }
}

inline void rand_fill(void *p, size_t bytes, uint32_t seed)
{
    fill_bytes<<<1024, 256>>>(static_cast<uint32_t *>(p), bytes / 4, seed);
    K_LAUNCH_CHECK();
}
inline void rand_f16(void *p, size_t n, float lo, float hi, uint32_t seed)
{
    fill_f16<<<1024, 256>>>(static_cast<__half *>(p), n, lo, hi, seed);
    K_LAUNCH_CHECK();
}

/* Where and how kb_time_us times: every timed call runs on `stream`; graph: each loop is one
 * replay of a captured CUDA graph of n calls (removes most of the CPU launch overhead, as a
 * runtime that graph-launches its decode step sees it), else n back-to-back launches. */
struct kb_clock {
    cudaStream_t stream;
    bool graph;
};

/* Median over 5 loops of the mean time per call (us) of fn(i), i = rotation index; n calls per
 * loop so that a loop takes about target_ms / 5. */
template <class F> double kb_time_us(const kb_clock &ck, F fn, double target_ms)
{
    cudaEvent_t a, b;
    K_CUDA_CHECK(cudaEventCreate(&a));
    K_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) fn(i); /* warm-up: module load, attributes, handles */
    K_CUDA_CHECK(cudaEventRecord(a, ck.stream));
    fn(3);
    K_CUDA_CHECK(cudaEventRecord(b, ck.stream));
    K_CUDA_CHECK(cudaEventSynchronize(b));
    float one = 0;
    K_CUDA_CHECK(cudaEventElapsedTime(&one, a, b));
    const int n = std::max(5, std::min(1000, (int)(target_ms / 5 / std::max(one, 1e-3f))));
    std::vector<double> t;
    int it = 4;
    cudaGraphExec_t exec = nullptr;
    if (ck.graph) {
        cudaGraph_t graph;
        K_CUDA_CHECK(cudaStreamBeginCapture(ck.stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < n; ++i) fn(it++);
        K_CUDA_CHECK(cudaStreamEndCapture(ck.stream, &graph));
        K_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        K_CUDA_CHECK(cudaGraphDestroy(graph));
        K_CUDA_CHECK(cudaGraphLaunch(exec, ck.stream)); /* upload the graph */
    }
    for (int r = 0; r < 5; ++r) {
        K_CUDA_CHECK(cudaEventRecord(a, ck.stream));
        if (exec) K_CUDA_CHECK(cudaGraphLaunch(exec, ck.stream));
        else for (int i = 0; i < n; ++i) fn(it++);
        K_CUDA_CHECK(cudaEventRecord(b, ck.stream));
        K_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        K_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0 / n);
    }
    if (exec) K_CUDA_CHECK(cudaGraphExecDestroy(exec));
    K_CUDA_CHECK(cudaEventDestroy(a));
    K_CUDA_CHECK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[2];
}

/* Device-to-device copy bandwidth (cudaMemcpyAsync of 1 GiB on `stream`, read + write), GB/s:
 * the ceiling the "% copy" columns compare with. */
inline double kb_copy_bandwidth_gbs(cudaStream_t stream)
{
    const size_t bytes = (size_t)1 << 30;
    void *src = nullptr, *dst = nullptr;
    K_CUDA_CHECK(cudaMalloc(&src, bytes));
    K_CUDA_CHECK(cudaMalloc(&dst, bytes));
    rand_fill(src, bytes, 1);
    /* plain launches: a 1 GiB copy hides launch overhead, and graph memcpy nodes were measured
     * slower (2.8 vs 4.2 TB/s) than cudaMemcpyAsync on the H200 */
    const kb_clock plain = {stream, false};
    const double us = kb_time_us(plain, [&](int) { K_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); }, 100);
    K_CUDA_CHECK(cudaFree(src));
    K_CUDA_CHECK(cudaFree(dst));
    return 2.0 * bytes / (us * 1e3); /* read + write, GB/s */
}

/* y = x . W with W fp16 [K, N] row-major: column-major Y^T[N, M] = W^T[N, K] . X^T[K, M]. */
inline void cublas_linear(cublasHandle_t h, const __half *x, const __half *w, __half *y, int M, int N, int K)
{
    const float alpha = 1.0f, beta = 0.0f;
    B_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha, w, CUDA_R_16F, N, x,
                                CUDA_R_16F, K, &beta, y, CUDA_R_16F, N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
}

/* rel L2 and max |d| / rms of a vs b (fp16 device arrays). */
inline bool validate(const __half *a, const __half *b, size_t n, double *rel_out)
{
    std::vector<__half> ha(n), hb(n);
    K_CUDA_CHECK(cudaDeviceSynchronize());
    K_CUDA_CHECK(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
    K_CUDA_CHECK(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
    double sd = 0, sr = 0;
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
        const double x = __half2float(ha[i]), r = __half2float(hb[i]);
        if (!std::isfinite(x)) finite = false;
        sd += (x - r) * (x - r);
        sr += r * r;
    }
    *rel_out = sr > 0 ? sqrt(sd / sr) : 1.0;
    return finite && sr > 0 && *rel_out < 5e-3;
}

/* The device buffers of one timed linear (layer shape, M; random data, never zeros): R rotating
 * copies of the packed weight (together > 3x L2, so every call streams from HBM), R16 of its
 * fp16 dequantisation (cuBLAS's operand), two activations, y, the reference yref (the caller
 * fills it, e.g. cublas_linear of x[0] and w16[0]), a zeroed workspace of ws_b bytes and a
 * scratch of scratch_b bytes. Rotation i uses x[i % 2] and weight copy i % R. */
struct kb_linear {
    int M, N, K, G, R, R16;
    size_t q_bytes, w16_b, ws_b, scratch_b;
    std::vector<uint8_t *> qw, qz;
    std::vector<uint16_t *> sc;
    std::vector<__half *> w16;
    __half *x[2] = {nullptr, nullptr}, *y = nullptr, *yref = nullptr;
    void *ws = nullptr, *scratch = nullptr;
    kb_linear(int M_, int N_, int K_, int G_, double l2, size_t ws_bytes, size_t scratch_bytes)
        : M(M_), N(N_), K(K_), G(G_), ws_b(ws_bytes), scratch_b(scratch_bytes)
    {
        const size_t qw_b = (size_t)K * N / 2, sc_b = (size_t)(K / G) * N * 2,
                     qz_b = (size_t)(K / G) * N / 2;
        w16_b = (size_t)K * N * 2;
        q_bytes = qw_b + sc_b + qz_b;
        R = (int)std::max<double>(2, ceil(3 * l2 / q_bytes) + 1);
        R16 = (int)std::max<double>(2, ceil(3 * l2 / w16_b) + 1);
        qw.resize(R), qz.resize(R), sc.resize(R), w16.resize(R16);
        for (int r = 0; r < R; ++r) {
            K_CUDA_CHECK(cudaMalloc(&qw[r], qw_b));
            K_CUDA_CHECK(cudaMalloc(&qz[r], qz_b));
            K_CUDA_CHECK(cudaMalloc(&sc[r], sc_b));
            rand_fill(qw[r], qw_b, 11 + r);
            rand_fill(qz[r], qz_b, 1000 + r);
            rand_f16(sc[r], sc_b / 2, 0.002f, 0.02f, 2000 + r);
        }
        for (int r = 0; r < R16; ++r) {
            K_CUDA_CHECK(cudaMalloc(&w16[r], w16_b));
            if (k_w4a16_dequant(qw[r % R], qz[r % R], sc[r % R],
                                reinterpret_cast<uint16_t *>(w16[r]), N, K, G, nullptr))
                abort(); /* the callers pass valid shapes */
        }
        for (int i = 0; i < 2; ++i) {
            K_CUDA_CHECK(cudaMalloc(&x[i], (size_t)M * K * 2));
            rand_f16(x[i], (size_t)M * K, -1.0f, 1.0f, 77 + (uint32_t)i);
        }
        K_CUDA_CHECK(cudaMalloc(&y, (size_t)M * N * 2));
        K_CUDA_CHECK(cudaMalloc(&yref, (size_t)M * N * 2));
        K_CUDA_CHECK(cudaMalloc(&ws, ws_b));
        K_CUDA_CHECK(cudaMemset(ws, 0, ws_b));
        if (scratch_b) K_CUDA_CHECK(cudaMalloc(&scratch, scratch_b));
    }
    ~kb_linear()
    {
        for (int r = 0; r < R; ++r) {
            K_CUDA_CHECK(cudaFree(qw[r])); K_CUDA_CHECK(cudaFree(qz[r])); K_CUDA_CHECK(cudaFree(sc[r]));
        }
        for (auto p : w16) K_CUDA_CHECK(cudaFree(p));
        for (auto p : x) K_CUDA_CHECK(cudaFree(p));
        K_CUDA_CHECK(cudaFree(y)); K_CUDA_CHECK(cudaFree(yref)); K_CUDA_CHECK(cudaFree(ws));
        K_CUDA_CHECK(cudaFree(scratch));
    }
    kb_linear(const kb_linear &) = delete;
    kb_linear &operator=(const kb_linear &) = delete;
};

} // namespace

#endif /* QS_K_BENCH_CUH */

/*
 * lab_common.cuh - the driver the W4A16 experiments in kernels/lab/ share (llm.c's
 * dev/cuda/common.h in spirit): a program lists its versions (a launcher each) and two shape
 * lists; lab_main then
 *   1. checks every version against the plain-C reference ref_w4a16_linear (kernels/ref.h) on
 *      fresh random inputs (random packed bytes, x in [-1, 1), a bias on odd M), each version
 *      run twice on one workspace that must come back zeroed; tolerance as the GPU tests
 *      (|d| <= 4e-3 rms(ref) + 4e-3 |ref| per element, rel L2 <= 2e-3, norm(y) > 0); prints
 *      "lab <prog>: N passed, N failed";
 *   2. times every version that passed on the timing shapes (harness kernels/k_bench.cuh:
 *      weights rotated over > 3x L2, CUDA-graph replays, median of 5), each first validated
 *      against dequant + cuBLAS, in a table against cuBLAS fp16 and the copy bandwidth.
 * Usage of every lab program: `prog [VERSION] [--quick]` (VERSION: one id of its table, default
 * all; --quick: the first timing shape only, short loops). Exit status: failures != 0.
 */
#ifndef QS_LAB_COMMON_CUH
#define QS_LAB_COMMON_CUH

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../k_bench.cuh" /* kb_linear, kb_time_us, kb_copy_bandwidth_gbs, cublas_linear, validate */
#include "qs_log.h"       /* qs_log_set_quiet */
#include "ref.h"          /* ref_w4a16_linear, ref_pool, fp16 conversion */

/* What a version's launcher gets: device tensors of one linear (x [M, K] fp16, the DESIGN 4
 * packed weight, bias [N] or NULL, y [M, N] fp16), a zeroed workspace of ws_bytes =
 * lab_ws_bytes(M, N) that it must leave zeroed, a scratch of scratch_bytes >= K*N*2,
 * a cuBLAS handle bound to the stream. */
struct lab_args {
    const __half *x;
    const uint8_t *qweight, *qzeros;
    const uint16_t *scales;
    const float *bias;
    __half *y;
    int M, N, K, G;
    void *ws;
    size_t ws_bytes;
    void *scratch;
    size_t scratch_bytes;
    cublasHandle_t cublas;
};

/* One version: launch returns false (nothing launched) where it cannot take the shape. */
struct lab_version {
    int id;
    const char *name;
    bool (*launch)(const lab_args &a, cudaStream_t stream);
};

struct lab_shape {
    const char *name;
    int M, N, K, G;
};

namespace {

uint64_t g_lab_rng = 0x9E3779B97F4A7C15ULL;
inline uint64_t lab_u64(void) /* xorshift64* (Vigna 2016) */
{
    g_lab_rng ^= g_lab_rng >> 12;
    g_lab_rng ^= g_lab_rng << 25;
    g_lab_rng ^= g_lab_rng >> 27;
    return g_lab_rng * 0x2545F4914F6CDD1DULL;
}
inline float lab_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((lab_u64() >> 40) * (1.0 / 16777216.0));
}

template <class T> T *lab_upload(const std::vector<T> &h)
{
    T *d = nullptr;
    K_CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
    K_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

/* The workspace every version gets: k_w4a16_workspace_bytes for at least the 128 rows the
 * wgmma route sizes its split-K for (kernels.h, struct k_w4a16_route). */
inline size_t lab_ws_bytes(int M, int N)
{
    return k_w4a16_workspace_bytes(std::max(M, K_W4A16_DQ_GEMM_MIN_M - 1), N);
}

/* Per element |got - ref| <= 4e-3 rms(ref) + 4e-3 |ref|, rel L2 <= 2e-3, norm(got) > 0. */
inline bool lab_close(const std::vector<float> &got, const std::vector<float> &ref, double *rel)
{
    double ss_ref = 0, ss_d = 0, ss_got = 0;
    for (float r : ref) ss_ref += (double)r * r;
    const double atol = 4e-3 * sqrt(ss_ref / (double)ref.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = fabs((double)got[i] - ref[i]);
        bad += !(isfinite(got[i]) && d <= atol + 4e-3 * fabs(ref[i]));
        ss_d += isfinite(got[i]) ? d * d : 1e30;
        ss_got += (double)got[i] * got[i];
    }
    *rel = ss_ref > 0 ? sqrt(ss_d / ss_ref) : 1.0;
    return bad == 0 && *rel <= 2e-3 && ss_got > 0;
}

/* A library route forced (k_w4a16_route_pick + k_w4a16_launch) on a: the baselines of the
 * experiments. false where the router refuses it on this GPU. */
inline bool lab_route(const lab_args &a, cudaStream_t st, enum k_w4a16_kernel k)
{
    static struct k_w4a16_caps caps;
    static bool have_caps = k_w4a16_caps_query(&caps) == K_ERR_NONE;
    k_w4a16_route r;
    qs_log_set_quiet(true);
    const int rc = have_caps ? k_w4a16_route_pick(&r, a.M, a.N, a.K, a.G, K_W4A16_EPI_Y, k, &caps)
                             : K_ERR_ARG;
    qs_log_set_quiet(false);
    if (rc != K_ERR_NONE || r.workspace_bytes > a.ws_bytes) return false;
    const k_w4a16_weight w = {a.qweight, a.qzeros, a.scales, a.bias};
    const k_w4a16_bufs b = {a.ws, a.ws_bytes, a.scratch, a.scratch_bytes, a.cublas};
    return k_w4a16_launch(&r, reinterpret_cast<const uint16_t *>(a.x), &w,
                          reinterpret_cast<uint16_t *>(a.y), nullptr, &b, st) == K_ERR_NONE;
}

/* Check version v on shape s against ref_w4a16_linear; returns the failures (0, 1, 2), -1 when
 * v cannot take the shape. */
int lab_check(const lab_version &v, const lab_shape &s, struct ref_pool *pool, cublasHandle_t cub)
{
    const int M = s.M, N = s.N, K = s.K, G = s.G, ng = K / G;
    std::vector<uint8_t> qw((size_t)K * N / 2), qz((size_t)ng * N / 2);
    std::vector<uint16_t> sc((size_t)ng * N), xh((size_t)M * K);
    std::vector<float> xf((size_t)M * K), bias(M % 2 ? N : 0), yref((size_t)M * N);
    for (auto &b : qw) b = (uint8_t)lab_u64(); /* every byte pattern is a valid packed tensor */
    for (auto &b : qz) b = (uint8_t)lab_u64();
    for (auto &h : sc) h = ref_f32_to_f16(lab_uniform(0.002f, 0.02f));
    for (size_t i = 0; i < xh.size(); ++i) {
        xh[i] = ref_f32_to_f16(lab_uniform(-1.0f, 1.0f));
        xf[i] = ref_f16_to_f32(xh[i]);
    }
    for (auto &b : bias) b = lab_uniform(-0.5f, 0.5f);
    const float *bp = bias.empty() ? nullptr : bias.data();
    if (ref_w4a16_linear(xf.data(), qw.data(), qz.data(), sc.data(), bp, M, K, N, G, yref.data(),
                         pool) != REF_ERR_NONE)
        return 2;
    lab_args a = {};
    a.x = reinterpret_cast<const __half *>(lab_upload(xh));
    a.qweight = lab_upload(qw), a.qzeros = lab_upload(qz), a.scales = lab_upload(sc);
    a.bias = bp ? lab_upload(bias) : nullptr;
    a.M = M, a.N = N, a.K = K, a.G = G;
    a.ws_bytes = lab_ws_bytes(M, N), a.scratch_bytes = (size_t)K * N * 2;
    K_CUDA_CHECK(cudaMalloc(&a.y, (size_t)M * N * 2));
    K_CUDA_CHECK(cudaMalloc(&a.ws, a.ws_bytes));
    K_CUDA_CHECK(cudaMemset(a.ws, 0, a.ws_bytes));
    K_CUDA_CHECK(cudaMalloc(&a.scratch, a.scratch_bytes));
    a.cublas = cub;
    int failed = 0;
    for (int run = 0; run < 2 && failed >= 0; ++run) {
        K_CUDA_CHECK(cudaMemset(a.y, 0xFF, (size_t)M * N * 2)); /* NaN */
        if (!v.launch(a, nullptr)) {
            failed = -1;
            break;
        }
        std::vector<uint16_t> yh((size_t)M * N);
        K_CUDA_CHECK(cudaDeviceSynchronize());
        K_CUDA_CHECK(cudaMemcpy(yh.data(), a.y, yh.size() * 2, cudaMemcpyDeviceToHost));
        std::vector<float> y(yh.size());
        for (size_t i = 0; i < y.size(); ++i) y[i] = ref_f16_to_f32(yh[i]);
        double rel = 0;
        if (!lab_close(y, yref, &rel)) {
            fprintf(stderr, "  v%d %s %s M=%d N=%d K=%d G=%d run %d: rel L2 %.3g\n", v.id, v.name,
                    s.name, M, N, K, G, run + 1, rel);
            ++failed;
        }
    }
    if (failed >= 0) { /* the workspace must be back to zero */
        std::vector<float> w(a.ws_bytes / 4);
        K_CUDA_CHECK(cudaMemcpy(w.data(), a.ws, a.ws_bytes / 4 * 4, cudaMemcpyDeviceToHost));
        size_t nz = 0;
        for (float f : w) nz += f != 0.0f;
        if (nz) fprintf(stderr, "  v%d %s %s M=%d: %zu workspace words left non-zero\n", v.id, v.name, s.name, M, nz);
        failed += nz != 0;
    }
    K_CUDA_CHECK(cudaFree(const_cast<__half *>(a.x)));
    K_CUDA_CHECK(cudaFree(const_cast<uint8_t *>(a.qweight)));
    K_CUDA_CHECK(cudaFree(const_cast<uint8_t *>(a.qzeros)));
    K_CUDA_CHECK(cudaFree(const_cast<uint16_t *>(a.scales)));
    K_CUDA_CHECK(cudaFree(const_cast<float *>(a.bias)));
    K_CUDA_CHECK(cudaFree(a.y)); K_CUDA_CHECK(cudaFree(a.ws)); K_CUDA_CHECK(cudaFree(a.scratch));
    return failed;
}

/* Time the versions in use[] on shape s: one table block, cuBLAS fp16 last. */
void lab_time(const lab_version *vs, int n, const bool *use, const lab_shape &s, cublasHandle_t cub,
              const kb_clock &ck, double copy_bw, double l2, double target_ms, int *invalid)
{
    const size_t ws_b = lab_ws_bytes(s.M, s.N), scratch_b = (size_t)s.K * s.N * 2;
    kb_linear d(s.M, s.N, s.K, s.G, l2, ws_b, scratch_b);
    cublas_linear(cub, d.x[0], d.w16[0], d.yref, s.M, s.N, s.K);
    const double t_cub = kb_time_us(ck, [&](int i) {
        cublas_linear(cub, d.x[i % 2], d.w16[i % d.R16], d.y, s.M, s.N, s.K);
    }, target_ms);
    char shape[96];
    snprintf(shape, sizeof shape, "%s (%dx%d) M=%d", s.name, s.K, s.N, s.M);
    auto args = [&](int i) {
        lab_args a = {d.x[i % 2], d.qw[i % d.R], d.qz[i % d.R], d.sc[i % d.R], nullptr, d.y,
                      s.M, s.N, s.K, s.G, d.ws, d.ws_b, d.scratch, d.scratch_b, cub};
        return a;
    };
    for (int k = 0; k < n; ++k) {
        if (!use[k]) continue;
        K_CUDA_CHECK(cudaMemset(d.y, 0xFF, (size_t)s.M * s.N * 2));
        if (!vs[k].launch(args(0), nullptr)) continue;
        double rel = 0;
        if (!validate(d.y, d.yref, (size_t)s.M * s.N, &rel)) {
            printf("%-30s v%-2d %-14s | INVALID (rel L2 %.3g vs dequant+cuBLAS): not timed\n", shape,
                   vs[k].id, vs[k].name, rel);
            ++*invalid;
            continue;
        }
        const double t = kb_time_us(ck, [&](int i) { vs[k].launch(args(i), ck.stream); }, target_ms);
        const double gbs = d.q_bytes / (t * 1e3);
        printf("%-30s v%-2d %-14s | %9.2f | %7.0f | %5.1f%% | %7.2fx\n", shape, vs[k].id, vs[k].name,
               t, gbs, 100.0 * gbs / copy_bw, t_cub / t);
    }
    printf("%-30s %-18s | %9.2f | %7.0f | %5.1f%% |\n", shape, "cuBLAS fp16", t_cub,
           d.w16_b / (t_cub * 1e3), 100.0 * d.w16_b / (t_cub * 1e3) / copy_bw);
}

/* The whole program: check, then time (see the top of this file). */
int lab_main(int argc, char **argv, const char *prog, const lab_version *vs, int n,
             const lab_shape *checks, int n_checks, const lab_shape *timings, int n_timings)
{
    bool quick = false;
    int only = -1;
    for (int i = 1; i < argc; ++i) {
        char *end = nullptr;
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
            continue;
        }
        only = (int)strtol(argv[i], &end, 10);
        if (*end || end == argv[i]) {
            fprintf(stderr, "usage: %s [VERSION] [--quick]\n", prog);
            return 1;
        }
    }
    std::vector<bool> use_v(n);
    bool any = false;
    for (int k = 0; k < n; ++k) any |= (use_v[k] = only < 0 || vs[k].id == only);
    if (!any) {
        fprintf(stderr, "%s: no version %d (versions:", prog, only);
        for (int k = 0; k < n; ++k) fprintf(stderr, " %d %s", vs[k].id, vs[k].name);
        fprintf(stderr, ")\n");
        return 1;
    }
    g_lab_rng ^= (uint64_t)time(nullptr) * 0x9E3779B97F4A7C15ULL; /* fresh inputs every run */
    struct ref_pool *pool = nullptr;
    if (ref_pool_create(0, &pool) != REF_ERR_NONE) return 2;
    cudaStream_t st;
    K_CUDA_CHECK(cudaStreamCreate(&st));
    cublasHandle_t cub;
    B_CUBLAS_CHECK(cublasCreate(&cub));
    B_CUBLAS_CHECK(cublasSetStream(cub, st));
    cudaDeviceProp prop;
    K_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s: %s (sm_%d%d, %d SMs)\n", prog, prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    int passed = 0, failed = 0;
    bool ok[64];
    for (int k = 0; k < n && k < 64; ++k) {
        ok[k] = use_v[k];
        int ran = 0;
        for (int c = 0; c < n_checks && use_v[k]; ++c) {
            const int f = lab_check(vs[k], checks[c], pool, cub);
            if (f < 0) continue; /* not a shape this version takes */
            ++ran;
            passed += f == 0;
            failed += f != 0;
            ok[k] = ok[k] && f == 0;
        }
        if (use_v[k]) printf("  v%d %s: checked on %d of %d shapes%s\n", vs[k].id, vs[k].name, ran,
                             n_checks, ok[k] ? "" : ", FAILED (not timed)");
    }
    printf("lab %s: %d passed, %d failed\n", prog, passed, failed);
    const kb_clock ck = {st, true};
    const double copy_bw = kb_copy_bandwidth_gbs(st);
    printf("copy %.0f GB/s; %-18s | %9s | %7s | %6s | %8s\n", copy_bw, "version", "us", "GB/s",
           "% copy", "x cuBLAS");
    int invalid = 0;
    for (int t = 0; t < (quick ? 1 : n_timings); ++t)
        lab_time(vs, n, ok, timings[t], cub, ck, copy_bw, prop.l2CacheSize, quick ? 3 : 10, &invalid);
    B_CUBLAS_CHECK(cublasDestroy(cub));
    K_CUDA_CHECK(cudaStreamDestroy(st));
    ref_pool_free(pool);
    return failed + invalid != 0;
}

} // namespace

#endif /* QS_LAB_COMMON_CUH */

/*
 * gpu_t.cuh - what the GPU test programs (tests/gpu_test_*.cu) share: fresh random inputs
 * (xorshift64*, seeded from QS_TEST_SEED or the clock, printed), device buffers poisoned with
 * NaN before a kernel writes them, the tolerant comparison (per element |got - ref| <= atol +
 * rtol*|ref| with atol relative to rms(ref), plus relative L2 and norm(got) > 0, so neither
 * zeros nor NaNs can pass), and the program skeleton: areas that print "<area>: N passed, N
 * failed", then the program's "<program> total: N passed, N failed" (tests/run_gpu_tests.sh sums
 * the areas). Included once per program; functions are static inline (a program uses a subset).
 */
#ifndef QS_GPU_T_CUH
#define QS_GPU_T_CUH

#include <cuda_fp16.h>    /* __half (device code of the tests) */
#include <cuda_runtime.h> /* cudaMalloc, cudaMemcpy */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#include "kernels.h" /* k_* launchers */
#include "qs_log.h"  /* qs_log_set_quiet */
#include "ref.h"     /* ref_* oracles, ref_pack_*, fp16 conversion */
#include "t.h"       /* CHECK, CHECK_MSG, t_pass, t_fail */

#define TCUDA(expr)                                                                         \
    do {                                                                                    \
        cudaError_t e_ = (expr);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: CUDA error %s in %s\n", __FILE__, __LINE__,             \
                    cudaGetErrorString(e_), #expr);                                         \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

// --- random inputs -----------------------------------------------------------------------------

static uint64_t rng_state;
static inline uint64_t rng_u64(void)
{ /* xorshift64* (Vigna 2016) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static inline float rng_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_u64() >> 40) * (1.0 / 16777216.0));
}
/* fp16-representable random values in [lo, hi): bits for the device, floats for the reference. */
static inline void rand_f16(std::vector<uint16_t> &h, std::vector<float> &f, size_t n, float lo, float hi)
{
    h.resize(n);
    f.resize(n);
    for (size_t i = 0; i < n; ++i) {
        h[i] = ref_f32_to_f16(rng_uniform(lo, hi));
        f[i] = ref_f16_to_f32(h[i]);
    }
}
static inline void rand_bytes(std::vector<uint8_t> &b, size_t n)
{
    b.resize(n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t r = rng_u64();
        memcpy(&b[i], &r, 8);
    }
    for (; i < n; ++i) b[i] = (uint8_t)rng_u64();
}

// --- device buffers ------------------------------------------------------------------------------

template <class T> static T *dev_upload(const std::vector<T> &h)
{
    T *d = nullptr;
    TCUDA(cudaMalloc(&d, h.size() * sizeof(T) + 16));
    TCUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T> static T *dev_poisoned(size_t n)
{ /* 0xFF bytes: fp16 0xFFFF and fp32 0xFFFFFFFF are NaNs, int32 -1 */
    T *d = nullptr;
    TCUDA(cudaMalloc(&d, n * sizeof(T) + 16));
    TCUDA(cudaMemset(d, 0xFF, n * sizeof(T)));
    return d;
}
template <class T> static std::vector<T> dev_download(const T *d, size_t n)
{
    std::vector<T> h(n);
    TCUDA(cudaDeviceSynchronize());
    TCUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
static inline std::vector<float> f16_to_f32(const std::vector<uint16_t> &h)
{
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = ref_f16_to_f32(h[i]);
    return f;
}

/* Count of nonzero floats in a device buffer (the deferred consumers must leave acc zeroed). */
static inline size_t dev_nonzero(const float *d, size_t n)
{
    const std::vector<float> h = dev_download(d, n);
    size_t nz = 0;
    for (float v : h) nz += v != 0.0f;
    return nz;
}

// --- comparison ----------------------------------------------------------------------------------

/* Element-wise |got - ref| <= atol_rms*rms(ref) + rtol*|ref|, rel L2 <= l2tol, norm(got) > 0;
 * prints the first mismatches and the worst index. One CHECK. Returns true on pass. */
static inline bool compare(const char *what, const float *got, const float *ref, size_t n,
                    double atol_rms, double rtol, double l2tol)
{
    double ss_ref = 0, ss_d = 0, ss_got = 0;
    for (size_t i = 0; i < n; ++i) ss_ref += (double)ref[i] * ref[i];
    const double rms = sqrt(ss_ref / (double)n);
    const double atol = atol_rms * (rms > 0 ? rms : 1.0);
    size_t bad = 0, worst = 0;
    double worst_ex = -1;
    int printed = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = fabs((double)got[i] - ref[i]);
        const double lim = atol + rtol * fabs(ref[i]);
        ss_got += (double)got[i] * got[i];
        if (isfinite(got[i])) ss_d += d * d;
        const bool ok = isfinite(got[i]) && d <= lim;
        const double ex = isfinite(got[i]) ? d / lim : INFINITY;
        if (ex > worst_ex) { worst_ex = ex; worst = i; }
        if (!ok) {
            if (printed < 4) {
                fprintf(stderr, "  %s: [%zu] got %.7g ref %.7g (|d| %.3g > %.3g)\n", what, i,
                        got[i], ref[i], d, lim);
                ++printed;
            }
            ++bad;
        }
    }
    const double rel = ss_ref > 0 ? sqrt(ss_d / ss_ref) : sqrt(ss_d);
    const bool pass = bad == 0 && rel <= l2tol && ss_got > 0 && isfinite(ss_got);
    CHECK_MSG(pass, "%s: %zu/%zu outside tolerance, rel L2 %.3g (max %.3g), worst [%zu] got %.7g "
              "ref %.7g, norm(got)^2 %.3g", what, bad, n, rel, l2tol, worst, got[worst],
              ref[worst], ss_got);
    return pass;
}

/* What k_rope_kv_store leaves in the caches k, v [nkv][T_cap][hd] (fp16 values as floats): row
 * pos[m] of each kv head = the rotated k heads / the v heads of row m of x (the expected fused
 * qkv rows, [M][stride]: q (nq heads) | k (nkv) | v (nkv) | ...) rounded to fp16; rows whose
 * position is outside [0, T_cap) are not stored. */
static inline void kv_rows_expected(std::vector<float> &k, std::vector<float> &v,
                                    const std::vector<float> &x, const std::vector<int32_t> &pos,
                                    int M, int nq, int nkv, int hd, size_t stride, int T_cap)
{
    for (int m = 0; m < M; ++m) {
        if (pos[m] < 0 || pos[m] >= T_cap) continue;
        for (int h = 0; h < nkv; ++h)
            for (int d = 0; d < hd; ++d) {
                const size_t dst = ((size_t)h * T_cap + pos[m]) * hd + d;
                const size_t src = (size_t)m * stride + (size_t)(nq + h) * hd + d;
                k[dst] = ref_f16_to_f32(ref_f32_to_f16(x[src]));
                v[dst] = ref_f16_to_f32(ref_f32_to_f16(x[src + (size_t)nkv * hd]));
            }
    }
}

// --- the program ------------------------------------------------------------------------------------

static struct ref_pool *g_pool; /* the CPU references' threads (2 with --quick) */

typedef void (*gpu_area_fn)(bool quick);
struct gpu_area {
    const char *name;
    gpu_area_fn fn;
};

/* main of a GPU test program: `prog [--quick]` (--quick: the small subset run under
 * compute-sanitizer); prints the device and seed (what = extra words for that line), runs the
 * areas, prints the total; returns the exit status (failures != 0). */
static inline int gpu_test_main(int argc, char **argv, const char *prog, const char *what,
                                const gpu_area *areas, int n_areas)
{
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const char *seed_env = getenv("QS_TEST_SEED");
    const uint64_t seed = seed_env ? strtoull(seed_env, nullptr, 0) : (uint64_t)time(nullptr);
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    int dev = 0;
    cudaDeviceProp prop;
    TCUDA(cudaGetDevice(&dev));
    TCUDA(cudaGetDeviceProperties(&prop, dev));
    printf("%s: %s (sm_%d%d, %d SMs), seed %llu%s%s\n", prog, prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (unsigned long long)seed, quick ? ", quick" : "", what);
    if (ref_pool_create(quick ? 2 : 0, &g_pool) != REF_ERR_NONE) return 2;
    int tp = 0, tf = 0;
    for (int i = 0; i < n_areas; ++i) {
        t_pass = t_fail = 0;
        T_INIT(areas[i].name);
        areas[i].fn(quick);
        printf("%s: %d passed, %d failed\n", areas[i].name, t_pass, t_fail);
        fflush(stdout);
        tp += t_pass;
        tf += t_fail;
    }
    ref_pool_free(g_pool);
    TCUDA(cudaDeviceSynchronize());
    printf("%s total: %d passed, %d failed\n", prog, tp, tf);
    return tf != 0;
}

#endif /* QS_GPU_T_CUH */

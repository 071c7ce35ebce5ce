/*
 * k_moe.cu - the small Mixtral helpers: router logits (fp16 activations x fp32 router weight),
 * row gather and weighted scatter-add of expert rows. References: ref_linear_f32 and the CPU
 * backend's gather/scatter loops (runtime/rt_cpu.c). Not on the hot path of dense models.
 * Test: build/gpu_test_ops (area moe).
 */
#include "k_common.cuh"

/* One warp per output y[m][n]: lanes take k strided, then a shuffle tree (order differs from
 * the serial reference by rounding only). */
static __global__ void router_kernel(float *__restrict__ y, const __half *__restrict__ x,
                                     const float *__restrict__ W, int M, int K, int N)
{
    const long long wid = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / K_WARP;
    const int lane = threadIdx.x % K_WARP;
    if (wid >= (long long)M * N) return;
    const int m = (int)(wid / N), n = (int)(wid % N);
    float s = 0.0f;
    for (int k = lane; k < K; k += K_WARP)
        s = fmaf(__half2float(x[(size_t)m * K + k]), W[(size_t)n * K + k], s);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[(size_t)m * N + n] = s;
}

static __global__ void gather_kernel(__half *__restrict__ dst, const __half *__restrict__ src,
                                     const int32_t *__restrict__ rows, int width)
{
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < width; j += blockDim.x)
        dst[(size_t)i * width + j] = src[(size_t)rows[i] * width + j];
}

static __global__ void scatter_add_kernel(__half *__restrict__ y, const __half *__restrict__ src,
                                          const int32_t *__restrict__ rows,
                                          const float *__restrict__ weights, int n, int width)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    for (int i = 0; i < n; ++i) { /* in order: repeated rows accumulate like the reference */
        __half *yr = y + (size_t)rows[i] * width + j;
        *yr = __float2half_rn(__half2float(*yr) + weights[i] * __half2float(src[(size_t)i * width + j]));
    }
}

int k_router(float *y, const uint16_t *x, const float *W, int M, int K, int N,
             struct CUstream_st *stream)
{
    if (M < 1 || K < 1 || N < 1) K_REFUSE(K_ERR_SHAPE, "router M=%d K=%d N=%d", M, K, N);
    if (!y || !x || !W) K_REFUSE(K_ERR_ARG, "router: NULL pointer");
    const long long threads = (long long)M * N * K_WARP;
    router_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, stream>>>(
        y, reinterpret_cast<const __half *>(x), W, M, K, N);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_gather_rows(uint16_t *dst, const uint16_t *src, const int32_t *rows, int n, int width,
                  struct CUstream_st *stream)
{
    if (n < 1 || width < 1) K_REFUSE(K_ERR_SHAPE, "gather_rows n=%d width=%d", n, width);
    if (!dst || !src || !rows) K_REFUSE(K_ERR_ARG, "gather_rows: NULL pointer");
    gather_kernel<<<n, 256, 0, stream>>>(reinterpret_cast<__half *>(dst),
                                         reinterpret_cast<const __half *>(src), rows, width);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_scatter_add_rows(uint16_t *y, const uint16_t *src, const int32_t *rows,
                       const float *weights, int n, int width, struct CUstream_st *stream)
{
    if (n < 1 || width < 1) K_REFUSE(K_ERR_SHAPE, "scatter_add_rows n=%d width=%d", n, width);
    if (!y || !src || !rows || !weights) K_REFUSE(K_ERR_ARG, "scatter_add_rows: NULL pointer");
    scatter_add_kernel<<<(width + 255) / 256, 256, 0, stream>>>(
        reinterpret_cast<__half *>(y), reinterpret_cast<const __half *>(src), rows, weights, n,
        width);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

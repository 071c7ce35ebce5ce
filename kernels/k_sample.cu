/*
 * k_sample.cu - sampling on the GPU. Greedy: ids[m] = argmax of logits row m over ids
 * < min(n, vocab_size) (padding ids never win, NaNs skipped, ties to the lowest id, -1 if no
 * candidate). Reference ref_argmax. One block per row, (value, index) pairs reduced with warp
 * shuffles then across warps in shared memory. Top-k/top-p/temperature: not yet (CPU backend).
 * Test: build-gpu/gpu_test_kernels (area argmax).
 */
#include "k_common.cuh"

#include <math.h>

constexpr int AM_THREADS = 1024;

/* (v, i) beats (bv, bi): larger value, or equal value and smaller index; index -1 = empty. */
static __device__ __forceinline__ bool am_better(float v, int i, float bv, int bi)
{
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

static __global__ void __launch_bounds__(AM_THREADS)
argmax_kernel(int32_t *__restrict__ ids, const float *__restrict__ logits, int n,
              size_t row_stride)
{
    __shared__ float sv[AM_THREADS / K_WARP];
    __shared__ int si[AM_THREADS / K_WARP];
    const float *row = logits + (size_t)blockIdx.x * row_stride;
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        if (!isnan(v) && am_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / K_WARP); ++w)
            if (am_better(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }
        ids[blockIdx.x] = bi;
    }
}

int k_argmax(int32_t *ids, const float *logits, int M, int n, size_t row_stride, int vocab_size,
             struct CUstream_st *stream)
{
    if (M < 1 || n < 1 || row_stride < (size_t)n)
        K_REFUSE(K_ERR_SHAPE, "argmax M=%d n=%d row_stride=%zu", M, n, row_stride);
    if (!ids || !logits || vocab_size < 1)
        K_REFUSE(K_ERR_ARG, "argmax: NULL pointer or vocab_size %d < 1", vocab_size);
    argmax_kernel<<<M, AM_THREADS, 0, stream>>>(ids, logits, n < vocab_size ? n : vocab_size,
                                                row_stride);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

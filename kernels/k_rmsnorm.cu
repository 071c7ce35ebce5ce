/*
 * k_rmsnorm.cu - RMSNorm fused with the residual add, fp32 residual stream, fp16 output:
 *   residual[m] += x[m];  out[m] = w * residual[m] * rsqrt(mean(residual[m]^2) + eps)
 * (transformers LlamaRMSNorm; reference ref_rmsnorm). One block per row; the residual row is
 * read once into registers-sized chunks, reduced with warp shuffles, then normalised.
 * Test: build-gpu/gpu_test_kernels (area rmsnorm).
 */
#include "k_common.cuh" /* K_CUDA_CHECK, K_REFUSE */

constexpr int RMS_THREADS = 256; /* 8 warps: one row of H = 4096..8192 is 16..32 values each */

/* Sum over the block; every thread gets the total. red: RMS_THREADS/32 floats of shared memory.
 * Warp shuffles (CUDA guide "Warp Shuffle Functions") avoid a shared-memory tree per step. */
static __device__ float block_sum(float v, float *red)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < (int)(blockDim.x / K_WARP); ++i) t += red[i];
    return t;
}

static __global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_kernel(__half *__restrict__ out,         /* [M, H] */
               float *__restrict__ residual,     /* [M, H] fp32 in/out, or NULL */
               const __half *__restrict__ x,     /* [M, H] or NULL */
               const float *__restrict__ w,      /* [H] */
               int H, float eps)
{
    __shared__ float red[RMS_THREADS / K_WARP];
    const size_t row = (size_t)blockIdx.x * H;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float h;
        if (residual) {
            h = residual[row + i] + (x ? __half2float(x[row + i]) : 0.0f);
            if (x) residual[row + i] = h;
        } else {
            h = __half2float(x[row + i]);
        }
        ss += h * h;
    }
    const float r = rsqrtf(block_sum(ss, red) / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float h = residual ? residual[row + i] : __half2float(x[row + i]);
        out[row + i] = __float2half_rn(w[i] * (h * r));
    }
}

int k_rmsnorm(uint16_t *out, float *residual, const uint16_t *x, const float *w, int M, int H,
              float eps, struct CUstream_st *stream)
{
    if (M < 1 || H < 1) K_REFUSE(K_ERR_SHAPE, "rmsnorm M=%d H=%d: need M, H >= 1", M, H);
    if (!out || !w || (!x && !residual) || !(eps >= 0.0f))
        K_REFUSE(K_ERR_ARG, "rmsnorm: out %p, w %p, x %p, residual %p, eps %g", (void *)out,
                 (const void *)w, (const void *)x, (void *)residual, (double)eps);
    rmsnorm_kernel<<<M, RMS_THREADS, 0, stream>>>(reinterpret_cast<__half *>(out), residual,
                                                  reinterpret_cast<const __half *>(x), w, H, eps);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

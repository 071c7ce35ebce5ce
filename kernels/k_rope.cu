/*
 * k_rope.cu - rotary position embedding, transformers rotate_half form, in place on fp16 rows:
 *   a = pos[m] * inv_freq[i];  (x_i, x_{i+hd/2}) <- (x_i cos a - x_{i+hd/2} sin a,
 *                                                   x_{i+hd/2} cos a + x_i sin a)
 * Reference ref_rope; the scaling variants (linear, llama3) live in inv_freq (ref_rope_inv_freq).
 * One thread per (row, head, pair). sincosf is the accurate one (not __sinf): positions reach
 * 1e5 and the fast path's range reduction is only good near 0 (CUDA guide, "Intrinsic Functions").
 * Test: build-gpu/gpu_test_kernels (area rope).
 */
#include "k_common.cuh"

static __global__ void rope_kernel(__half *__restrict__ x, int M, int n_heads, int hd,
                                   size_t row_stride, const int32_t *__restrict__ pos,
                                   const float *__restrict__ inv_freq)
{
    k_pdl_launch_dependents(); /* the KV-cache store may launch (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): the qkv projection is complete */
    const int half_hd = hd / 2;
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)M * n_heads * half_hd) return;
    const int i = (int)(id % half_hd);
    const long long mh = id / half_hd;
    const int h = (int)(mh % n_heads), m = (int)(mh / n_heads);
    __half *p = x + (size_t)m * row_stride + (size_t)h * hd;
    const float a = (float)pos[m] * inv_freq[i];
    float s, c;
    sincosf(a, &s, &c);
    const float x0 = __half2float(p[i]), x1 = __half2float(p[i + half_hd]);
    p[i] = __float2half_rn(x0 * c - x1 * s);
    p[i + half_hd] = __float2half_rn(x1 * c + x0 * s);
}

int k_rope(uint16_t *x, int M, int n_heads, int hd, size_t row_stride, const int32_t *pos,
           const float *inv_freq, struct CUstream_st *stream)
{
    if (M < 1 || n_heads < 1 || hd < 2 || hd % 2 || row_stride < (size_t)n_heads * hd)
        K_REFUSE(K_ERR_SHAPE, "rope M=%d n_heads=%d hd=%d row_stride=%zu: need hd even, "
                 "row_stride >= n_heads*hd", M, n_heads, hd, row_stride);
    if (!x || !pos || !inv_freq) K_REFUSE(K_ERR_ARG, "rope: NULL x, pos or inv_freq");
    const long long n = (long long)M * n_heads * (hd / 2);
    const int threads = 256;
    k_launch_ex(rope_kernel, dim3((unsigned)((n + threads - 1) / threads)), dim3(threads), 0,
                stream, k_pdl_usable(), reinterpret_cast<__half *>(x), M, n_heads, hd,
                row_stride, pos, inv_freq);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

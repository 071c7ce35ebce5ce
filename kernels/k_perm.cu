/*
 * k_perm.cu - the act-order input gather (docs/DESIGN.md section 4.5): dst[m][j] =
 * src[m][perm[j]] on fp16 rows. Reference: ref_gather_cols (kernels/ref_perm.c). One thread per
 * output element, reads of src scattered within a row (it is in L2: a row is at most a few
 * tens of KB). Launched with PDL like the norms, so the next linear streams its weights while
 * the gather runs; cost measured in docs/BENCHMARKS.md ("Act-order").
 * Test: tests/gpu_test_ops.cu (test_gather_cols).
 */
#include "k_common.cuh"

__global__ void gather_cols_kernel(__half *__restrict__ dst, const __half *__restrict__ src,
                                   const int32_t *__restrict__ perm, int M, int K)
{
    k_pdl_launch_dependents(); /* the linear may start loading its weights (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): the input rows are complete */
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)M * K)
        return;
    const int m = (int)(i / K), j = (int)(i % K);
    dst[i] = src[(size_t)m * K + perm[j]];
}

int k_gather_cols(uint16_t *dst, const uint16_t *src, const int32_t *perm, int M, int K,
                  struct CUstream_st *stream)
{
    if (M < 1 || K < 1) K_REFUSE(K_ERR_SHAPE, "gather_cols M=%d K=%d", M, K);
    if (!dst || !src || !perm) K_REFUSE(K_ERR_ARG, "gather_cols: NULL pointer");
    const long long n = (long long)M * K;
    k_launch_ex(gather_cols_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(dst),
                reinterpret_cast<const __half *>(src), perm, M, K);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

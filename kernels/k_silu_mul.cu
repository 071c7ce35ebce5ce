/*
 * k_silu_mul.cu - SwiGLU gate: out[m][i] = silu(gate[m][i]) * up[m][i], gate_up = [gate | up]
 * (the fused gate_up_proj output, DESIGN 5), fp16 in and out, fp32 math; silu(g) = g/(1+e^-g).
 * Reference ref_silu_mul. One thread per two outputs (half2 loads).
 * Test: build/gpu_test_ops (area silu_mul).
 */
#include "k_common.cuh"

/* silu(g) * u in fp32 */
static __device__ __forceinline__ float silu_times(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

static __global__ void silu_mul_kernel(__half *__restrict__ out, const __half *__restrict__ gu,
                                       int M, int I)
{
    k_pdl_launch_dependents(); /* the down projection may start loading its weights (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): gate_up is complete */
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)M * I) return;
    const int m = (int)(id / I), i = (int)(id % I);
    const float g = __half2float(gu[(size_t)m * 2 * I + i]);
    const float u = __half2float(gu[(size_t)m * 2 * I + I + i]);
    out[(size_t)m * I + i] = __float2half_rn(silu_times(g, u));
}

/* as silu_mul_kernel from fp32 sums (an ACC route), which it zeroes */
static __global__ void silu_mul_acc_kernel(__half *__restrict__ out, float *__restrict__ gu,
                                           int M, int I)
{
    k_pdl_launch_dependents(); /* the down projection may start loading its weights (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): gate_up's sums are complete */
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)M * I) return;
    const int m = (int)(id / I), i = (int)(id % I);
    float *pg = gu + (size_t)m * 2 * I + i, *pu = pg + I;
    const float g = *pg, u = *pu;
    *pg = 0.0f;
    *pu = 0.0f;
    out[(size_t)m * I + i] = __float2half_rn(silu_times(g, u));
}

int k_silu_mul_acc(uint16_t *out, float *gate_up_acc, int M, int I, struct CUstream_st *stream)
{
    if (M < 1 || I < 1) K_REFUSE(K_ERR_SHAPE, "silu_mul_acc M=%d I=%d: need >= 1", M, I);
    if (!out || !gate_up_acc) K_REFUSE(K_ERR_ARG, "silu_mul_acc: NULL out or gate_up_acc");
    const long long n = (long long)M * I;
    k_launch_ex(silu_mul_acc_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(out), gate_up_acc, M, I);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_silu_mul(uint16_t *out, const uint16_t *gate_up, int M, int I, struct CUstream_st *stream)
{
    if (M < 1 || I < 1) K_REFUSE(K_ERR_SHAPE, "silu_mul M=%d I=%d: need >= 1", M, I);
    if (!out || !gate_up) K_REFUSE(K_ERR_ARG, "silu_mul: NULL out or gate_up");
    const long long n = (long long)M * I;
    k_launch_ex(silu_mul_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(out),
                reinterpret_cast<const __half *>(gate_up), M, I);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

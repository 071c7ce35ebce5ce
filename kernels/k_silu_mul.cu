/*
 * k_silu_mul.cu - SwiGLU gate: out[m][i] = silu(gate[m][i]) * up[m][i], gate_up = [gate | up]
 * (the fused gate_up_proj output, DESIGN 5), fp16 in and out, fp32 math; silu(g) = g/(1+e^-g).
 * Reference ref_silu_mul. One thread per output.
 * k_gelu: the plain GELU of Falcon's MLP (exact erf form, reference ref_gelu).
 * Test: build/gpu_test_ops (areas silu_mul, gelu).
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

/* gelu(x) = x/2 * (1 + erf(x / sqrt(2))) from fp16 x or fp32 sums xf (zeroed) */
static __global__ void gelu_kernel(__half *__restrict__ out, const __half *__restrict__ x,
                                   float *__restrict__ xf, size_t n)
{
    k_pdl_launch_dependents(); /* the down projection may start loading its weights */
    k_pdl_wait();              /* launched early (PDL): the up projection's output is complete */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v;
    if (xf) {
        v = xf[i];
        xf[i] = 0.0f;
    } else {
        v = __half2float(x[i]);
    }
    out[i] = __float2half_rn(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
}

int k_gelu(uint16_t *out, const uint16_t *x, float *x_acc, size_t n, struct CUstream_st *stream)
{
    if (n < 1 || n > ((size_t)1 << 38)) K_REFUSE(K_ERR_SHAPE, "gelu n=%zu: need 1 .. 2^38", n);
    if (!out || (!x) == (!x_acc))
        K_REFUSE(K_ERR_ARG, "gelu: out %p, x %p, x_acc %p (exactly one input)", (void *)out,
                 (const void *)x, (void *)x_acc);
    k_launch_ex(gelu_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(out),
                reinterpret_cast<const __half *>(x), x_acc, n);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

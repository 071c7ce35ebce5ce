/*
 * k_silu_mul.cu - SwiGLU gate: out[m][i] = silu(gate[m][i]) * up[m][i], gate_up = [gate | up]
 * (the fused gate_up_proj output, DESIGN 5), fp16 in and out, fp32 math; silu(g) = g/(1+e^-g).
 * Reference ref_silu_mul. One thread per output.
 * k_gelu: the plain GELU of Falcon's and MPT's MLP (exact erf form, reference ref_gelu; MPT's
 * activation divisor, ref_div_cols). k_gelu_tanh_mul: Gemma's GeGLU (reference
 * ref_gelu_tanh_mul). k_softcap: Gemma 2's logit soft-capping (reference ref_softcap).
 * Test: build/gpu_test_ops (areas silu_mul, gelu, softcap).
 */
#include "k_common.cuh"

/* The gate's activation: SiLU (LLaMA) or tanh-approximated GELU (Gemma's GeGLU). */
enum gate_act { GATE_SILU = 0, GATE_GELU_TANH = 1 };

/* act(g) * u in fp32 */
template <int A>
static __device__ __forceinline__ float silu_times(float g, float u)
{
    if constexpr (A == GATE_GELU_TANH) /* x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    return g / (1.0f + expf(-g)) * u;
}

template <int A>
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
    out[(size_t)m * I + i] = __float2half_rn(silu_times<A>(g, u));
}

/* as silu_mul_kernel from fp32 sums (an ACC route), which it zeroes */
template <int A>
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
    out[(size_t)m * I + i] = __float2half_rn(silu_times<A>(g, u));
}

/* the gated activation A from fp16 gate_up or fp32 sums gate_up_acc (zeroed) */
template <int A>
static int gated_launch(const char *what, uint16_t *out, const uint16_t *gate_up,
                        float *gate_up_acc, int M, int I, struct CUstream_st *stream)
{
    if (M < 1 || I < 1) K_REFUSE(K_ERR_SHAPE, "%s M=%d I=%d: need >= 1", what, M, I);
    if (!out || (!gate_up && !gate_up_acc)) K_REFUSE(K_ERR_ARG, "%s: NULL out or input", what);
    const long long n = (long long)M * I;
    const dim3 grid((unsigned)((n + 255) / 256));
    if (gate_up_acc)
        k_launch_ex(silu_mul_acc_kernel<A>, grid, dim3(256), 0, stream, k_pdl_usable(),
                    reinterpret_cast<__half *>(out), gate_up_acc, M, I);
    else
        k_launch_ex(silu_mul_kernel<A>, grid, dim3(256), 0, stream, k_pdl_usable(),
                    reinterpret_cast<__half *>(out), reinterpret_cast<const __half *>(gate_up),
                    M, I);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_silu_mul_acc(uint16_t *out, float *gate_up_acc, int M, int I, struct CUstream_st *stream)
{
    return gated_launch<GATE_SILU>("silu_mul_acc", out, nullptr, gate_up_acc, M, I, stream);
}

int k_silu_mul(uint16_t *out, const uint16_t *gate_up, int M, int I, struct CUstream_st *stream)
{
    return gated_launch<GATE_SILU>("silu_mul", out, gate_up, nullptr, M, I, stream);
}

int k_gelu_tanh_mul(uint16_t *out, const uint16_t *gate_up, float *gate_up_acc, int M, int I,
                    struct CUstream_st *stream)
{
    if (gate_up && gate_up_acc)
        K_REFUSE(K_ERR_ARG, "gelu_tanh_mul: both gate_up and gate_up_acc given");
    return gated_launch<GATE_GELU_TANH>("gelu_tanh_mul", out, gate_up, gate_up_acc, M, I, stream);
}

/* x[i] = cap * tanh(x[i] / cap), fp32 in place */
static __global__ void softcap_kernel(float *__restrict__ x, size_t n, float cap)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

int k_softcap(float *x, size_t n, float cap, struct CUstream_st *stream)
{
    if (n < 1 || n > ((size_t)1 << 38) || !(cap > 0.0f))
        K_REFUSE(K_ERR_SHAPE, "softcap n=%zu cap=%g: need n in 1 .. 2^38, cap > 0", n, (double)cap);
    if (!x) K_REFUSE(K_ERR_ARG, "softcap: NULL x");
    softcap_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, n, cap);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/* gelu(x) = x/2 * (1 + erf(x / sqrt(2))) from fp16 x or fp32 sums xf (zeroed), divided by
 * div[i % I] when div is given */
static __global__ void gelu_kernel(__half *__restrict__ out, const __half *__restrict__ x,
                                   float *__restrict__ xf, size_t n, const float *__restrict__ div,
                                   int I)
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
    float g = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    if (div) g /= div[i % (size_t)I];
    out[i] = __float2half_rn(g);
}

int k_gelu(uint16_t *out, const uint16_t *x, float *x_acc, size_t n, const float *div, int I,
           struct CUstream_st *stream)
{
    if (n < 1 || n > ((size_t)1 << 38) || (div && (I < 1 || n % (size_t)I)))
        K_REFUSE(K_ERR_SHAPE, "gelu n=%zu I=%d: need n in 1 .. 2^38 (a multiple of I >= 1 with "
                 "a divisor)", n, I);
    if (!out || (!x) == (!x_acc))
        K_REFUSE(K_ERR_ARG, "gelu: out %p, x %p, x_acc %p (exactly one input)", (void *)out,
                 (const void *)x, (void *)x_acc);
    k_launch_ex(gelu_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(out),
                reinterpret_cast<const __half *>(x), x_acc, n, div, I);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

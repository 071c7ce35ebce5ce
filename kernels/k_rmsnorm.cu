/*
 * k_rmsnorm.cu - RMSNorm fused with the residual add, fp32 residual stream, fp16 output:
 *   residual[m] += x[m];  out[m] = w * residual[m] * rsqrt(mean(residual[m]^2) + eps)
 * (transformers LlamaRMSNorm; reference ref_rmsnorm). One block per row, reduced with warp
 * shuffles. The fast kernel (H % 4 == 0, H <= 8192) issues every load of its row up front
 * (4 values per 16-byte load, kept in registers), so a row costs one memory round trip instead
 * of one per loop iteration: at decode (M = 1) the generic loop took ~16 us per call on the
 * H200 (ncu), more than a 4096 x 4096 W4A16 linear. Other shapes take the generic kernel.
 * k_head_rmsnorm: the same norm on each q and k head of fused qkv rows (Qwen3 q_norm / k_norm),
 * one warp per head, in place on the fp16 rows or on the fp32 sums of an ACC route.
 * k_layernorm: LayerNorm with bias (Falcon), the same residual modes, a plain three-pass kernel.
 * Test: build/gpu_test_ops (areas rmsnorm, head_rmsnorm, layernorm).
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
               float *__restrict__ xf,           /* [M, H] fp32 (zeroed after), or NULL */
               const float *__restrict__ w,      /* [H] */
               int H, float eps)
{
    k_pdl_launch_dependents(); /* the next linear may start loading its weights (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): the previous kernel's output is complete */
    __shared__ float red[RMS_THREADS / K_WARP];
    const size_t row = (size_t)blockIdx.x * H;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float h;
        if (xf) { /* residual != NULL (k_rmsnorm_acc) */
            h = residual[row + i] + xf[row + i];
            xf[row + i] = 0.0f;
            residual[row + i] = h;
        } else if (residual) {
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

/* Fast path: VPT chunks of 4 values per thread, all loaded before any arithmetic. */
template <int VPT>
static __global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_vec_kernel(__half *__restrict__ out,         /* [M, H] */
                   float *__restrict__ residual,     /* [M, H] fp32 in/out, or NULL */
                   const __half *__restrict__ x,     /* [M, H] or NULL */
                   float *__restrict__ xf,           /* [M, H] fp32 (zeroed after), or NULL */
                   const float *__restrict__ w,      /* [H] */
                   int H, float eps)
{
    k_pdl_launch_dependents(); /* the next linear may start loading its weights (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): the previous kernel's output is complete */
    __shared__ float red[RMS_THREADS / K_WARP];
    const size_t row = (size_t)blockIdx.x * H;
    float4 h[VPT];
    float ss = 0.0f;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
        const int i = (v * RMS_THREADS + threadIdx.x) * 4;
        h[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i >= H) continue;
        float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (xf) {
            float4 *p = reinterpret_cast<float4 *>(xf + row + i);
            xv = *p;
            *p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        } else if (x) {
            const uint2 raw = *reinterpret_cast<const uint2 *>(x + row + i);
            const float2 a = __half22float2(k_u32_as_half2(raw.x)), b = __half22float2(k_u32_as_half2(raw.y));
            xv = make_float4(a.x, a.y, b.x, b.y);
        }
        if (residual) {
            const float4 r = *reinterpret_cast<const float4 *>(residual + row + i);
            h[v] = make_float4(r.x + xv.x, r.y + xv.y, r.z + xv.z, r.w + xv.w);
        } else {
            h[v] = xv;
        }
    }
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
        const int i = (v * RMS_THREADS + threadIdx.x) * 4;
        if (i >= H) continue;
        if (residual && (x || xf)) *reinterpret_cast<float4 *>(residual + row + i) = h[v];
        ss += h[v].x * h[v].x + h[v].y * h[v].y + h[v].z * h[v].z + h[v].w * h[v].w;
    }
    const float r = rsqrtf(block_sum(ss, red) / (float)H + eps);
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
        const int i = (v * RMS_THREADS + threadIdx.x) * 4;
        if (i >= H) continue;
        const float4 wv = *reinterpret_cast<const float4 *>(w + i);
        const __half2 a = __floats2half2_rn(wv.x * (h[v].x * r), wv.y * (h[v].y * r));
        const __half2 b = __floats2half2_rn(wv.z * (h[v].z * r), wv.w * (h[v].w * r));
        *reinterpret_cast<uint2 *>(out + row + i) = make_uint2(k_half2_as_u32(a), k_half2_as_u32(b));
    }
}

/* k_rmsnorm (x fp16) or k_rmsnorm_acc (xf fp32, residual != NULL), checked by the callers */
static int launch_rmsnorm(uint16_t *out, float *residual, const uint16_t *x, float *xf,
                          const float *w, int M, int H, float eps, struct CUstream_st *stream)
{
    __half *o = reinterpret_cast<__half *>(out);
    const __half *xh = reinterpret_cast<const __half *>(x);
    /* 16-byte (fp32) and 8-byte (fp16) vector accesses need H % 4 == 0 and aligned bases */
    const bool vec = H % 4 == 0 && ((uintptr_t)out | (uintptr_t)x) % 8 == 0 &&
                     ((uintptr_t)residual | (uintptr_t)w | (uintptr_t)xf) % 16 == 0;
    const int chunks = (H / 4 + RMS_THREADS - 1) / RMS_THREADS; /* float4 per thread */
    auto kern = !vec || chunks > 8 ? rmsnorm_kernel
              : chunks <= 1      ? rmsnorm_vec_kernel<1>
              : chunks <= 2      ? rmsnorm_vec_kernel<2>
              : chunks <= 4      ? rmsnorm_vec_kernel<4>
                                 : rmsnorm_vec_kernel<8>;
    /* PDL: starts during the previous kernel's tail (k_common.cuh) */
    k_launch_ex(kern, dim3(M), dim3(RMS_THREADS), 0, stream, k_pdl_usable(), o, residual, xh, xf,
                w, H, eps);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_rmsnorm(uint16_t *out, float *residual, const uint16_t *x, const float *w, int M, int H,
              float eps, struct CUstream_st *stream)
{
    if (M < 1 || H < 1) K_REFUSE(K_ERR_SHAPE, "rmsnorm M=%d H=%d: need M, H >= 1", M, H);
    if (!out || !w || (!x && !residual) || !(eps >= 0.0f))
        K_REFUSE(K_ERR_ARG, "rmsnorm: out %p, w %p, x %p, residual %p, eps %g", (void *)out,
                 (const void *)w, (const void *)x, (void *)residual, (double)eps);
    return launch_rmsnorm(out, residual, x, nullptr, w, M, H, eps, stream);
}

int k_rmsnorm_acc(uint16_t *out, float *residual, float *x_acc, const float *w, int M, int H,
                  float eps, struct CUstream_st *stream)
{
    if (M < 1 || H < 1) K_REFUSE(K_ERR_SHAPE, "rmsnorm_acc M=%d H=%d: need M, H >= 1", M, H);
    if (!out || !w || !x_acc || !residual || !(eps >= 0.0f))
        K_REFUSE(K_ERR_ARG, "rmsnorm_acc: out %p, w %p, x_acc %p, residual %p, eps %g",
                 (void *)out, (const void *)w, (void *)x_acc, (void *)residual, (double)eps);
    return launch_rmsnorm(out, residual, nullptr, x_acc, w, M, H, eps, stream);
}

/* --- LayerNorm (Falcon) ------------------------------------------------------------------------ */

/* One block per row, three passes over the row (h -> mean -> centred sum of squares -> out); the
 * residual row is written in the first pass and read back (L1/L2) in the others. */
static __global__ void __launch_bounds__(RMS_THREADS)
layernorm_kernel(__half *__restrict__ out,         /* [M, H] */
                 float *__restrict__ residual,     /* [M, H] fp32 in/out, or NULL */
                 const __half *__restrict__ x,     /* [M, H] or NULL */
                 float *__restrict__ xf,           /* [M, H] fp32 (zeroed after), or NULL */
                 const float *__restrict__ w,      /* [H] */
                 const float *__restrict__ b,      /* [H] or NULL */
                 int H, float eps)
{
    k_pdl_launch_dependents();
    k_pdl_wait(); /* launched early (PDL): the previous kernel's output is complete */
    __shared__ float red[RMS_THREADS / K_WARP];
    const size_t row = (size_t)blockIdx.x * H;
    float s = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float h;
        if (residual) {
            float a = 0.0f;
            if (xf) {
                a = xf[row + i];
                xf[row + i] = 0.0f;
            } else if (x) {
                a = __half2float(x[row + i]);
            }
            h = residual[row + i] + a;
            if (xf || x) residual[row + i] = h;
        } else {
            h = __half2float(x[row + i]);
        }
        s += h;
    }
    const float mean = block_sum(s, red) / (float)H;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float d = (residual ? residual[row + i] : __half2float(x[row + i])) - mean;
        ss += d * d;
    }
    const float r = rsqrtf(block_sum(ss, red) / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float h = residual ? residual[row + i] : __half2float(x[row + i]);
        out[row + i] = __float2half_rn(w[i] * ((h - mean) * r) + (b ? b[i] : 0.0f));
    }
}

int k_layernorm(uint16_t *out, float *residual, const uint16_t *x, float *x_acc, const float *w,
                const float *b, int M, int H, float eps, struct CUstream_st *stream)
{
    if (M < 1 || H < 1) K_REFUSE(K_ERR_SHAPE, "layernorm M=%d H=%d: need M, H >= 1", M, H);
    if (!out || !w || (!x && !residual) || (x && x_acc) || (x_acc && !residual) || !(eps >= 0.0f))
        K_REFUSE(K_ERR_ARG, "layernorm: out %p, w %p, x %p, x_acc %p, residual %p, eps %g",
                 (void *)out, (const void *)w, (const void *)x, (void *)x_acc, (void *)residual,
                 (double)eps);
    k_launch_ex(layernorm_kernel, dim3(M), dim3(RMS_THREADS), 0, stream, k_pdl_usable(),
                reinterpret_cast<__half *>(out), residual, reinterpret_cast<const __half *>(x),
                x_acc, w, b, H, eps);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

static __global__ void residual_add_kernel(float *__restrict__ residual,
                                           const __half *__restrict__ x, float *__restrict__ xf,
                                           size_t n)
{
    k_pdl_launch_dependents();
    k_pdl_wait();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (xf) {
        residual[i] += xf[i];
        xf[i] = 0.0f;
    } else {
        residual[i] += __half2float(x[i]);
    }
}

int k_residual_add(float *residual, const uint16_t *x, float *x_acc, size_t n,
                   struct CUstream_st *stream)
{
    if (n < 1 || n > ((size_t)1 << 38))
        K_REFUSE(K_ERR_SHAPE, "residual_add n=%zu: need 1 .. 2^38", n);
    if (!residual || (!x) == (!x_acc))
        K_REFUSE(K_ERR_ARG, "residual_add: residual %p, x %p, x_acc %p (exactly one input)",
                 (void *)residual, (const void *)x, (void *)x_acc);
    k_launch_ex(residual_add_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), residual, reinterpret_cast<const __half *>(x), x_acc, n);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/* --- per-head RMSNorm of q and k (Qwen3) ------------------------------------------------------ */

constexpr int HEAD_NORM_WARPS = 4; /* heads per block */

static __global__ void __launch_bounds__(HEAD_NORM_WARPS * K_WARP)
head_rmsnorm_kernel(__half *__restrict__ x,      /* [M, row_stride] fp16, or NULL */
                    float *__restrict__ acc,     /* [M, row_stride] fp32, or NULL */
                    int n_heads, int n_q, int hd, size_t row_stride, int n_rows_heads,
                    const float *__restrict__ wq, const float *__restrict__ wk, float eps)
{
    k_pdl_launch_dependents();
    k_pdl_wait(); /* the qkv linear's output (or sums) is complete */
    const int lane = threadIdx.x % K_WARP;
    const int item = blockIdx.x * HEAD_NORM_WARPS + (int)(threadIdx.x / K_WARP);
    if (item >= n_rows_heads) return;
    const int m = item / n_heads, h = item % n_heads;
    const size_t base = (size_t)m * row_stride + (size_t)h * (size_t)hd;
    const float *w = h < n_q ? wq : wk;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += K_WARP) {
        const float v = acc ? acc[base + i] : __half2float(x[base + i]);
        ss += v * v;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)hd + eps);
    for (int i = lane; i < hd; i += K_WARP) {
        if (acc)
            acc[base + i] = w[i] * (acc[base + i] * r);
        else
            x[base + i] = __float2half_rn(w[i] * (__half2float(x[base + i]) * r));
    }
}

int k_head_rmsnorm(uint16_t *x, float *acc, int M, int n_q, int n_kv, int hd, size_t row_stride,
                   const float *wq, const float *wk, float eps, struct CUstream_st *stream)
{
    if (M < 1 || n_q < 1 || n_kv < 0 || hd < 1 || hd > 1024 ||
        row_stride < (size_t)(n_q + n_kv) * (size_t)hd)
        K_REFUSE(K_ERR_SHAPE, "head_rmsnorm M=%d n_q=%d n_kv=%d hd=%d row_stride=%zu: need M, "
                 "n_q >= 1, n_kv >= 0, 1 <= hd <= 1024, row_stride >= (n_q + n_kv) * hd", M,
                 n_q, n_kv, hd, row_stride);
    if ((!x && !acc) || !wq || (n_kv && !wk) || !(eps >= 0.0f))
        K_REFUSE(K_ERR_ARG, "head_rmsnorm: x %p, acc %p, wq %p, wk %p, eps %g", (void *)x,
                 (void *)acc, (const void *)wq, (const void *)wk, (double)eps);
    if ((long long)M * (n_q + n_kv) > (long long)INT32_MAX - HEAD_NORM_WARPS)
        K_REFUSE(K_ERR_SHAPE, "head_rmsnorm: M=%d x %d heads is too many", M, n_q + n_kv);
    const int items = M * (n_q + n_kv);
    const int blocks = (items + HEAD_NORM_WARPS - 1) / HEAD_NORM_WARPS;
    k_launch_ex(head_rmsnorm_kernel, dim3(blocks), dim3(HEAD_NORM_WARPS * K_WARP), 0, stream,
                k_pdl_usable(), acc ? nullptr : reinterpret_cast<__half *>(x), acc, n_q + n_kv,
                n_q, hd, row_stride, items, wq, wk, eps);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/*
 * k_attention.cu - causal attention with GQA over the fp16 KV cache, flash-style (online
 * softmax; the [T, T] score matrix never exists), for prefill and decode alike:
 *   out[m, h] = sum_t softmax_t(q[m, h] . k[t] / sqrt(hd)) v[t],
 *   t in [max(0, p - sliding_window + 1), p], p = start_pos + m, kv head = h / (n_heads/n_kv)
 * Reference ref_attention (same arguments). Plus k_kv_store, which appends rows to the cache.
 *
 * v1 (the only variant so far), CUDA cores, fp32 math: one block per (query row, head);
 * its ATT_WARPS warps take interleaved tiles of 32 keys. In a tile each lane owns one key
 * (q . k over hd from a 16-byte-loaded key row against q in shared memory), the warp updates
 * the running max / sum with two shuffle reductions, then the lanes switch to owning hd/32
 * output dims and accumulate p_t v_t with coalesced value rows. Warps merge (max, sum, acc)
 * through shared memory at the end. Scores use exp2 with log2(e)/sqrt(hd) folded into q.
 * Weak spot: no tensor cores and no reuse of K/V across query rows in prefill (L1/L2 serve
 * the re-reads); decode of few heads uses few SMs.
 * Test: build-gpu/gpu_test_kernels (area attention).
 */
#include "k_common.cuh"

#include <math.h>

constexpr int ATT_WARPS = 4; /* key splits per (row, head) */

template <int HD>
static __global__ void __launch_bounds__(ATT_WARPS *K_WARP)
attention_kernel(__half *__restrict__ out, size_t out_stride, const __half *__restrict__ q,
                 size_t q_stride, const __half *__restrict__ k_cache,
                 const __half *__restrict__ v_cache, int start_pos,
                 const int32_t *__restrict__ start_pos_dev, int n_heads, int n_kv_heads,
                 int T_cap, int sliding_window)
{
    k_pdl_launch_dependents(); /* the o projection may start loading its weights (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): q and the KV cache rows are complete */
    constexpr int DPL = HD / K_WARP; /* output dims per lane */
    __shared__ __align__(16) float q_s[HD];
    __shared__ float m_s[ATT_WARPS], l_s[ATT_WARPS];
    __shared__ float acc_s[ATT_WARPS][HD];
    const int h = blockIdx.x, m = blockIdx.y;
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    /* start_pos_dev (k_attention_at): read on the device; a position past the cache is clamped
     * to its last row (the caller checks the context; this only keeps reads in bounds) */
    const int p = min((start_pos_dev ? max(*start_pos_dev, 0) : start_pos) + m, T_cap - 1);
    const int kbeg = sliding_window > 0 ? max(0, p - sliding_window + 1) : 0, kend = p + 1;
    const int kvh = h / (n_heads / n_kv_heads);
    const float qscale = 1.4426950408889634f / sqrtf((float)HD); /* log2(e) / sqrt(hd) */

    for (int d = threadIdx.x; d < HD; d += blockDim.x)
        q_s[d] = __half2float(q[(size_t)m * q_stride + (size_t)h * HD + d]) * qscale;
    __syncthreads();

    const __half *kc = k_cache + (size_t)kvh * T_cap * HD;
    const __half *vc = v_cache + (size_t)kvh * T_cap * HD;
    float m_run = -INFINITY, l_run = 0.0f, acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; ++d) acc[d] = 0.0f;

    for (int t0 = kbeg + warp * K_WARP; t0 < kend; t0 += ATT_WARPS * K_WARP) {
        const int t = t0 + lane;
        float s = -INFINITY;
        if (t < kend) {
            const uint4 *kr = reinterpret_cast<const uint4 *>(kc + (size_t)t * HD);
            float dot = 0.0f;
#pragma unroll
            for (int c = 0; c < HD / 8; ++c) {
                const uint4 kv = __ldg(kr + c);
                const uint32_t kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 kf = __half22float2(k_u32_as_half2(kw[e]));
                    dot = fmaf(q_s[c * 8 + 2 * e], kf.x, dot);
                    dot = fmaf(q_s[c * 8 + 2 * e + 1], kf.y, dot);
                }
            }
            s = dot;
        }
        float tmax = s;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
        const float m_new = fmaxf(m_run, tmax); /* finite: key t0 < kend exists */
        const float corr = exp2f(m_run - m_new); /* 0 when m_run = -inf */
        const float pl = t < kend ? exp2f(s - m_new) : 0.0f;
        float psum = pl;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        l_run = l_run * corr + psum;
#pragma unroll
        for (int d = 0; d < DPL; ++d) acc[d] *= corr;
        const int nt = min(K_WARP, kend - t0);
        for (int j = 0; j < nt; ++j) {
            const float pj = __shfl_sync(0xffffffffu, pl, j);
            const __half *vr = vc + (size_t)(t0 + j) * HD + lane * DPL;
#pragma unroll
            for (int d = 0; d < DPL; d += 2) {
                const float2 vf = __half22float2(*reinterpret_cast<const __half2 *>(vr + d));
                acc[d] = fmaf(pj, vf.x, acc[d]);
                acc[d + 1] = fmaf(pj, vf.y, acc[d + 1]);
            }
        }
        m_run = m_new;
    }

    if (lane == 0) { m_s[warp] = m_run; l_s[warp] = l_run; }
#pragma unroll
    for (int d = 0; d < DPL; ++d) acc_s[warp][lane * DPL + d] = acc[d];
    __syncthreads();
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, m_s[w]);
    float l = 0.0f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) {
        f[w] = exp2f(m_s[w] - mx);
        l += l_s[w] * f[w];
    }
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) o += acc_s[w][d] * f[w];
        out[(size_t)m * out_stride + (size_t)h * HD + d] = __float2half_rn(o / l);
    }
}

static __global__ void kv_store_kernel(__half *__restrict__ k_cache, __half *__restrict__ v_cache,
                                       const __half *__restrict__ k, const __half *__restrict__ v,
                                       size_t row_stride, int M, int start_pos,
                                       const int32_t *__restrict__ start_pos_dev, int n_kv_heads,
                                       int hd, int T_cap)
{
    k_pdl_launch_dependents(); /* attention may launch (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): k and v (after rope) are complete */
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)M * n_kv_heads * hd) return;
    const int d = (int)(id % hd);
    const long long mh = id / hd;
    const int h = (int)(mh % n_kv_heads), m = (int)(mh / n_kv_heads);
    if (start_pos_dev) { /* k_kv_store_at: rows outside the cache are dropped */
        start_pos = *start_pos_dev;
        if (start_pos < 0 || (long long)start_pos + m >= T_cap) return;
    }
    const size_t dst = ((size_t)h * T_cap + start_pos + m) * hd + d;
    const size_t src = (size_t)m * row_stride + (size_t)h * hd + d;
    k_cache[dst] = k[src];
    v_cache[dst] = v[src];
}

int k_kv_store(uint16_t *k_cache, uint16_t *v_cache, const uint16_t *k, const uint16_t *v,
               size_t row_stride, int M, int start_pos, int n_kv_heads, int hd, int T_cap,
               struct CUstream_st *stream)
{
    if (M < 1 || start_pos < 0 || hd < 1 || n_kv_heads < 1 || (long long)start_pos + M > T_cap ||
        row_stride < (size_t)n_kv_heads * hd)
        K_REFUSE(K_ERR_SHAPE, "kv_store M=%d start_pos=%d T_cap=%d n_kv_heads=%d hd=%d "
                 "row_stride=%zu", M, start_pos, T_cap, n_kv_heads, hd, row_stride);
    if (!k_cache || !v_cache || !k || !v) K_REFUSE(K_ERR_ARG, "kv_store: NULL pointer");
    const long long n = (long long)M * n_kv_heads * hd;
    k_launch_ex(kv_store_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(k_cache),
                reinterpret_cast<__half *>(v_cache), reinterpret_cast<const __half *>(k),
                reinterpret_cast<const __half *>(v), row_stride, M, start_pos,
                static_cast<const int32_t *>(nullptr), n_kv_heads, hd, T_cap);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_kv_store_at(uint16_t *k_cache, uint16_t *v_cache, const uint16_t *k, const uint16_t *v,
                  size_t row_stride, int M, const int32_t *start_pos_dev, int n_kv_heads, int hd,
                  int T_cap, struct CUstream_st *stream)
{
    if (M < 1 || M > T_cap || hd < 1 || n_kv_heads < 1 || row_stride < (size_t)n_kv_heads * hd)
        K_REFUSE(K_ERR_SHAPE, "kv_store_at M=%d T_cap=%d n_kv_heads=%d hd=%d row_stride=%zu", M,
                 T_cap, n_kv_heads, hd, row_stride);
    if (!k_cache || !v_cache || !k || !v || !start_pos_dev)
        K_REFUSE(K_ERR_ARG, "kv_store_at: NULL pointer");
    const long long n = (long long)M * n_kv_heads * hd;
    k_launch_ex(kv_store_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(k_cache),
                reinterpret_cast<__half *>(v_cache), reinterpret_cast<const __half *>(k),
                reinterpret_cast<const __half *>(v), row_stride, M, 0, start_pos_dev, n_kv_heads,
                hd, T_cap);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

static int attention_launch(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                            const uint16_t *k_cache, const uint16_t *v_cache, int M, int start_pos,
                            const int32_t *start_pos_dev, int n_heads, int n_kv_heads, int hd,
                            int T_cap, int sliding_window, struct CUstream_st *stream)
{
    const dim3 grid(n_heads, M);
    const __half *qh = reinterpret_cast<const __half *>(q);
    const __half *kh = reinterpret_cast<const __half *>(k_cache);
    const __half *vh = reinterpret_cast<const __half *>(v_cache);
    __half *oh = reinterpret_cast<__half *>(out);
#define ATT_LAUNCH(HDV)                                                                      \
    k_launch_ex(attention_kernel<HDV>, grid, dim3(ATT_WARPS * K_WARP), 0, stream,              \
                k_pdl_usable(), oh, out_stride, qh, q_stride, kh, vh, start_pos, start_pos_dev, \
                n_heads, n_kv_heads, T_cap, sliding_window)
    if (hd == 64) ATT_LAUNCH(64);
    else if (hd == 128) ATT_LAUNCH(128);
    else ATT_LAUNCH(256);
#undef ATT_LAUNCH
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_attention(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                const uint16_t *k_cache, const uint16_t *v_cache, int M, int start_pos,
                int n_heads, int n_kv_heads, int hd, int T_cap, int sliding_window,
                struct CUstream_st *stream)
{
    if (M < 1 || M > 65535 || start_pos < 0 || n_heads < 1 || n_kv_heads < 1 ||
        n_heads % n_kv_heads || (long long)start_pos + M > T_cap ||
        (hd != 64 && hd != 128 && hd != 256) || q_stride < (size_t)n_heads * hd ||
        out_stride < (size_t)n_heads * hd)
        K_REFUSE(K_ERR_SHAPE, "attention M=%d start_pos=%d n_heads=%d n_kv_heads=%d hd=%d "
                 "T_cap=%d: need hd in {64,128,256}, n_heads %% n_kv_heads == 0, "
                 "start_pos + M <= T_cap", M, start_pos, n_heads, n_kv_heads, hd, T_cap);
    if (!out || !q || !k_cache || !v_cache) K_REFUSE(K_ERR_ARG, "attention: NULL pointer");
    return attention_launch(out, out_stride, q, q_stride, k_cache, v_cache, M, start_pos, nullptr,
                            n_heads, n_kv_heads, hd, T_cap, sliding_window, stream);
}

int k_attention_at(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                   const uint16_t *k_cache, const uint16_t *v_cache, int M,
                   const int32_t *start_pos_dev, int n_heads, int n_kv_heads, int hd, int T_cap,
                   int sliding_window, struct CUstream_st *stream)
{
    if (M < 1 || M > 65535 || M > T_cap || n_heads < 1 || n_kv_heads < 1 ||
        n_heads % n_kv_heads || (hd != 64 && hd != 128 && hd != 256) ||
        q_stride < (size_t)n_heads * hd || out_stride < (size_t)n_heads * hd)
        K_REFUSE(K_ERR_SHAPE, "attention_at M=%d n_heads=%d n_kv_heads=%d hd=%d T_cap=%d: need "
                 "hd in {64,128,256}, n_heads %% n_kv_heads == 0", M, n_heads, n_kv_heads, hd,
                 T_cap);
    if (!out || !q || !k_cache || !v_cache || !start_pos_dev)
        K_REFUSE(K_ERR_ARG, "attention_at: NULL pointer");
    return attention_launch(out, out_stride, q, q_stride, k_cache, v_cache, M, 0, start_pos_dev,
                            n_heads, n_kv_heads, hd, T_cap, sliding_window, stream);
}

/*
 * k_rope.cu - rotary position embedding, transformers rotate_half form, in place on fp16 rows:
 *   a = pos[m] * inv_freq[i];  (x_i, x_{i+hd/2}) <- (x_i cos a - x_{i+hd/2} sin a,
 *                                                   x_{i+hd/2} cos a + x_i sin a)
 * Reference ref_rope; the scaling variants (linear, llama3) live in inv_freq (ref_rope_inv_freq).
 * One thread per (row, head, pair). sincosf is the accurate one (not __sinf): positions reach
 * 1e5 and the fast path's range reduction is only good near 0 (CUDA guide, "Intrinsic Functions").
 * Test: build/gpu_test_ops (area rope).
 */
#include <limits.h> /* INT_MAX */

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

/* k_rope_kv_store and k_rope_acc: rope_kernel's rotation over the nq + nkv q and k heads, from
 * x (acc == NULL) or from the fp32 sums in acc (zeroed; the whole row is then written to x),
 * plus the KV-cache store of the rotated k heads and of the nkv v heads after them (nkv = 0:
 * no cache, which may then be NULL). Threads [0, M*(nq+nkv)*hd/2) take one rotated pair each,
 * the rest one column of [(nq+nkv)*hd, row_stride) each. The store goes to slot slots[m] of
 * the paged pools of block_size rows (k_rope_kv_store_paged; slots < 0 are not stored), or
 * with slots NULL to slot pos[m] of the contiguous cache (block_size = T_cap; rows whose pos is
 * outside [0, T_cap) are not stored). */
static __global__ void rope_kv_store_kernel(__half *__restrict__ x, float *__restrict__ acc,
                                            int M, int nq, int nkv, int hd, int row_stride,
                                            const int32_t *__restrict__ pos,
                                            const float *__restrict__ inv_freq,
                                            __half *__restrict__ k_pool,
                                            __half *__restrict__ v_pool,
                                            const int32_t *__restrict__ slots, int block_size)
{
    k_pdl_launch_dependents(); /* attention may launch (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): the qkv projection is complete */
    const int half_hd = hd / 2, n_heads = nq + nkv, rest = row_stride - n_heads * hd;
    const long long n_rot = (long long)M * n_heads * half_hd;
    long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id < n_rot) {
        const int i = (int)(id % half_hd);
        const long long mh = id / half_hd;
        const int h = (int)(mh % n_heads), m = (int)(mh / n_heads);
        const size_t o = (size_t)m * row_stride + (size_t)h * hd;
        const int p = pos[m];
        const float a = (float)p * inv_freq[i];
        float s, c;
        sincosf(a, &s, &c);
        float x0, x1;
        if (acc) {
            x0 = acc[o + i];
            x1 = acc[o + i + half_hd];
            acc[o + i] = 0.0f;
            acc[o + i + half_hd] = 0.0f;
        } else {
            x0 = __half2float(x[o + i]);
            x1 = __half2float(x[o + i + half_hd]);
        }
        const __half r0 = __float2half_rn(x0 * c - x1 * s), r1 = __float2half_rn(x1 * c + x0 * s);
        x[o + i] = r0;
        x[o + i + half_hd] = r1;
        if (h >= nq) {
            const int slot = slots ? slots[m] : p;
            if (slot >= 0 && (slots || slot < block_size)) {
                __half *kc = k_pool + k_kv_offset(slot, h - nq, nkv, block_size, hd);
                kc[i] = r0;
                kc[i + half_hd] = r1;
            }
        }
        return;
    }
    id -= n_rot;
    if (id >= (long long)M * rest) return;
    const int m = (int)(id / rest), j = (int)(id % rest);
    const size_t o = (size_t)m * row_stride + (size_t)n_heads * hd + j;
    __half v;
    if (acc) {
        v = __float2half_rn(acc[o]);
        acc[o] = 0.0f;
        x[o] = v;
    } else {
        v = x[o];
    }
    if (j >= nkv * hd) return;
    const int slot = slots ? slots[m] : pos[m];
    if (slot >= 0 && (slots || slot < block_size))
        v_pool[k_kv_offset(slot, j / hd, nkv, block_size, hd) + j % hd] = v;
}

/* rope_kv_store_kernel over M rows (arguments checked by the callers): slots NULL stores to
 * the contiguous cache of block_size = T_cap rows at pos[m], else to the pools at slots[m] */
static int launch_rope_kv_store(uint16_t *x, float *acc, int M, int nq, int nkv, int hd,
                                size_t row_stride, const int32_t *pos, const float *inv_freq,
                                uint16_t *k_pool, uint16_t *v_pool, const int32_t *slots,
                                int block_size, struct CUstream_st *stream)
{
    const long long n = (long long)M * (nq + nkv) * (hd / 2) +
                        (long long)M * ((long long)row_stride - (long long)(nq + nkv) * hd);
    const int threads = 256;
    k_launch_ex(rope_kv_store_kernel, dim3((unsigned)((n + threads - 1) / threads)), dim3(threads),
                0, stream, k_pdl_usable(), reinterpret_cast<__half *>(x), acc, M, nq, nkv, hd,
                (int)row_stride, pos, inv_freq, reinterpret_cast<__half *>(k_pool),
                reinterpret_cast<__half *>(v_pool), slots, block_size);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_rope_kv_store(uint16_t *x, float *acc, int M, int nq, int nkv, int hd, size_t row_stride,
                    const int32_t *pos, const float *inv_freq, uint16_t *k_cache,
                    uint16_t *v_cache, int T_cap, struct CUstream_st *stream)
{
    if (M < 1 || nq < 1 || nkv < 1 || hd < 2 || hd % 2 || T_cap < 1 ||
        row_stride < (size_t)(nq + 2 * nkv) * hd || row_stride > (size_t)INT_MAX)
        K_REFUSE(K_ERR_SHAPE, "rope_kv_store M=%d nq=%d nkv=%d hd=%d row_stride=%zu T_cap=%d: "
                 "need hd even, (nq + 2 nkv) hd <= row_stride <= INT_MAX", M, nq, nkv, hd,
                 row_stride, T_cap);
    if (!x || !pos || !inv_freq || !k_cache || !v_cache)
        K_REFUSE(K_ERR_ARG, "rope_kv_store: NULL x, pos, inv_freq or cache");
    return launch_rope_kv_store(x, acc, M, nq, nkv, hd, row_stride, pos, inv_freq, k_cache,
                                v_cache, nullptr, T_cap, stream);
}

int k_rope_kv_store_paged(uint16_t *x, float *acc, int M, int nq, int nkv, int hd,
                          size_t row_stride, const int32_t *pos, const float *inv_freq,
                          uint16_t *k_pool, uint16_t *v_pool, const int32_t *slots,
                          int block_size, struct CUstream_st *stream)
{
    if (M < 1 || nq < 1 || nkv < 1 || hd < 2 || hd % 2 || block_size < 1 ||
        row_stride < (size_t)(nq + 2 * nkv) * hd || row_stride > (size_t)INT_MAX)
        K_REFUSE(K_ERR_SHAPE, "rope_kv_store_paged M=%d nq=%d nkv=%d hd=%d row_stride=%zu "
                 "block_size=%d: need hd even, (nq + 2 nkv) hd <= row_stride <= INT_MAX", M, nq,
                 nkv, hd, row_stride, block_size);
    if (!x || !pos || !inv_freq || !k_pool || !v_pool || !slots)
        K_REFUSE(K_ERR_ARG, "rope_kv_store_paged: NULL x, pos, inv_freq, pool or slots");
    return launch_rope_kv_store(x, acc, M, nq, nkv, hd, row_stride, pos, inv_freq, k_pool,
                                v_pool, slots, block_size, stream);
}

/* k_rope_acc = the kernel of k_rope_kv_store with every head rotated (nkv = 0: no cache) */
int k_rope_acc(uint16_t *x, float *acc, int M, int n_heads, int hd, size_t row_stride,
               const int32_t *pos, const float *inv_freq, struct CUstream_st *stream)
{
    if (M < 1 || n_heads < 1 || hd < 2 || hd % 2 || row_stride < (size_t)n_heads * hd ||
        row_stride > (size_t)INT_MAX)
        K_REFUSE(K_ERR_SHAPE, "rope_acc M=%d n_heads=%d hd=%d row_stride=%zu: need hd even, "
                 "n_heads*hd <= row_stride <= INT_MAX", M, n_heads, hd, row_stride);
    if (!x || !acc || !pos || !inv_freq) K_REFUSE(K_ERR_ARG, "rope_acc: NULL x, acc, pos or inv_freq");
    return launch_rope_kv_store(x, acc, M, n_heads, 0, hd, row_stride, pos, inv_freq, nullptr,
                                nullptr, nullptr, 1, stream);
}

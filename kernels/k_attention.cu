/*
 * k_attention.cu - causal attention with GQA over the fp16 KV cache, flash-style (online
 * softmax; the [T, T] score matrix never exists), for prefill and decode alike:
 *   out[m, h] = sum_t softmax_t(q[m, h] . k[t] / sqrt(hd)) v[t],
 *   t in [max(0, p - sliding_window + 1), p], p = start_pos + m, kv head = h / (n_heads/n_kv)
 * Reference ref_attention (same arguments). Plus k_kv_store, which appends rows to the cache.
 *
 * Paged KV cache (kernels/ref.h, "paged KV cache"; k_attention_paged, _paged_prefill,
 * k_kv_store_paged, k_kv_copy_block): the pools are [n_blocks][n_kv][bs][hd] and key t of kv
 * head h of a sequence with block table tab is pool row (tab[t / bs] * n_kv + h) * bs + t % bs
 * (struct att_kv, att_key_row; a shift and a mask when bs is a power of two). The contiguous
 * cache [n_kv][T_cap][hd] is that pool with one block of bs = T_cap rows and no table (block
 * 0), so k_attention / k_attention_at / k_kv_store(_at) run the same kernels with tables NULL.
 * In v1 each lane looks up its own key's row and the value loop takes row t from lane t's
 * lookup (a shuffle); v2 looks up each of the 64 rows of a K/V tile as it loads it.
 *
 * v2 (prefill, M >= 16, hd 64 / 128, host start position): FlashAttention-2 on tensor cores,
 * below. v1 (decode, the device-position launches, hd 96 and 256), CUDA cores, fp32 math: one block per
 * (query row, head, key split); its ATT_WARPS warps take interleaved tiles of 32 keys. In a
 * tile each lane owns one key (q . k over hd from its key row, 16-byte loads in flight
 * together, against q in shared memory), the warp updates the running max / sum with two
 * shuffle reductions, then the lanes switch to owning hd/32 output dims and accumulate p_t v_t
 * from coalesced value rows, 16 rows loaded before they are used. Warps merge (max, sum, acc)
 * through shared memory; with a workspace the keys are split across blocks (Flash-Decoding),
 * so a decode step of 32 heads runs ~500 blocks instead of 32, and the splits merge in the
 * last one to finish. Scores use exp2 with log2(e)/sqrt(hd) folded into q; the paged entry
 * points also take a scale, Gemma 2's soft-cap and MPT's ALiBi slopes (struct ref_att_score;
 * log2(e) then comes after them, att_shape).
 * Weak spot of v1: no tensor cores and no reuse of K/V across query rows or across the q heads
 * of a GQA group (L1/L2 serve the re-reads), which v2 fixes for prefill.
 * Test: build/gpu_test_ops (area attention).
 */
#include "k_common.cuh"

#include <limits.h> /* INT_MAX */
#include <math.h>

#include <algorithm>

constexpr int ATT_WARPS = 4;        /* key tiles of 32 in flight per block */
constexpr int ATT_SPLIT_KEYS = 128; /* split-KV chunks are multiples of ATT_WARPS * 32 keys */
constexpr int ATT_MAX_SPLITS = 64;

/*
 * Where a launch's keys and values are and where its query rows sit (kernels/ref.h, "paged KV
 * cache"). Pool rows are counted in 32 bits (a pool has < 2^32 rows: 512 GiB at hd 64).
 * Positions: pos given (k_attention_paged), row m is at pos[m] on table row row_table[m] (m
 * when row_table is NULL); else row m is at start + m (start_pos, or *start_pos_dev read on the
 * device and raised to 0) on table row 0. Either way the position is clamped to [0,
 * table_stride * bs), which only keeps reads in bounds (the callers check positions).
 */
struct att_kv {
    const __half *k, *v;          /* the pools [n_blocks][n_kv_heads][bs][hd] */
    const int32_t *tables;        /* block tables [.][table_stride]; NULL: every key in block 0
                                     (the contiguous cache, bs = T_cap) */
    const int32_t *row_table;     /* [M] table row of each query row (pos given), or NULL */
    const int32_t *pos;           /* [M] position of each query row, or NULL */
    const int32_t *start_pos_dev; /* pos NULL: the start position in device memory, or NULL */
    int start_pos;                /* pos and start_pos_dev NULL: the start position */
    int table_stride;             /* entries per table row */
    int bs, bs_shift;             /* block size; log2(bs) when it is a power of two, else -1 */
    int n_kv_heads;
    /* score options (kernels/ref.h struct ref_att_score): scale 0 = 1/sqrt(hd); softcap > 0:
     * cap * tanh(s / cap); alibi: device slopes [n_heads] or NULL */
    float scale, softcap;
    const float *alibi;
};

/* The launch's score options into kv (NULL: plain). */
static void att_kv_score(att_kv &kv, const struct ref_att_score *score)
{
    if (!score) return;
    kv.scale = score->scale;
    kv.softcap = score->softcap;
    kv.alibi = score->alibi;
}

/* Whether the scores need more than q.k * scale (then exp2's log2(e) is applied after). */
static __device__ __forceinline__ bool att_plain(const att_kv &kv)
{
    return kv.softcap <= 0.0f && !kv.alibi;
}

/* The factor applied to q: scale (1/sqrt(hd) when 0), times log2(e) when the scores are plain
 * (log2(e) / sqrt(hd) rounded once, as before the options existed). */
static __device__ __forceinline__ float att_qscale(const att_kv &kv, int hd, bool plain)
{
    const float l2e = 1.4426950408889634f;
    if (kv.scale > 0.0f) return plain ? l2e * kv.scale : kv.scale;
    return plain ? l2e / sqrtf((float)hd) : 1.0f / sqrtf((float)hd);
}

/* A score s = q.k * scale (already scaled) of head h, key t, query position p into the log2
 * domain: soft-capped and ALiBi-biased as kv says, times log2(e). */
static __device__ __forceinline__ float att_shape(const att_kv &kv, float s, int h, int t, int p)
{
    if (kv.softcap > 0.0f) s = tanhf(s / kv.softcap) * kv.softcap;
    if (kv.alibi) s += __ldg(kv.alibi + h) * (float)(t - p);
    return s * 1.4426950408889634f;
}

/* att_kv of the contiguous cache [n_kv_heads][T_cap][hd]: one block of T_cap rows, no table */
static att_kv att_kv_contiguous(const uint16_t *k_cache, const uint16_t *v_cache, int start_pos,
                                const int32_t *start_pos_dev, int n_kv_heads, int T_cap)
{
    att_kv kv = {};
    kv.k = reinterpret_cast<const __half *>(k_cache);
    kv.v = reinterpret_cast<const __half *>(v_cache);
    kv.start_pos_dev = start_pos_dev;
    kv.start_pos = start_pos;
    kv.table_stride = 1;
    kv.bs = T_cap;
    kv.bs_shift = -1; /* unused without a table */
    kv.n_kv_heads = n_kv_heads;
    return kv;
}

/* att_kv of a paged pool with block size bs (the tables and positions set by the caller) */
static att_kv att_kv_paged(const uint16_t *k_pool, const uint16_t *v_pool, int n_kv_heads, int bs)
{
    att_kv kv = att_kv_contiguous(k_pool, v_pool, 0, nullptr, n_kv_heads, bs);
    kv.bs_shift = (bs & (bs - 1)) ? -1 : __builtin_ctz((unsigned)bs);
    return kv;
}

/* Query row m's position (clamped, see att_kv) and its block table (NULL: block 0). */
static __device__ __forceinline__ int att_row_pos(const att_kv &kv, int m, const int32_t **tab)
{
    long long p; /* 64-bit: start + m cannot overflow */
    *tab = kv.tables;
    if (kv.pos) {
        p = kv.pos[m];
        if (kv.tables) *tab += (size_t)(kv.row_table ? kv.row_table[m] : m) * kv.table_stride;
    } else {
        p = (long long)(kv.start_pos_dev ? max(*kv.start_pos_dev, 0) : kv.start_pos) + m;
    }
    const long long cap = (long long)kv.table_stride * kv.bs;
    return (int)min(max(p, 0LL), cap - 1);
}

/* Pool row (in rows of hd) of key t of kv head kvh in the sequence with block table tab. */
static __device__ __forceinline__ uint32_t att_key_row(const att_kv &kv, const int32_t *tab,
                                                       int kvh, int t)
{
    if (!tab) return (uint32_t)kvh * (uint32_t)kv.bs + (uint32_t)t; /* block 0 */
    int b, r;
    if (kv.bs_shift >= 0) {
        b = t >> kv.bs_shift;
        r = t & (kv.bs - 1);
    } else {
        b = t / kv.bs;
        r = t - b * kv.bs;
    }
    return ((uint32_t)__ldg(tab + b) * (uint32_t)kv.n_kv_heads + (uint32_t)kvh) *
               (uint32_t)kv.bs + (uint32_t)r;
}

/*
 * v1 with split-KV (Flash-Decoding: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context
 * inference", 2023): block (head h, row m, split s). The keys [kbeg, kend) of row m are cut
 * into chunks of a multiple of 128 keys, at most gridDim.z of them (fewer when the row has
 * fewer keys: a split past the last chunk returns at once; the chunking depends only on the
 * row's key count, so the graph-launched decode (position read on the device) keeps one grid
 * for every position). One chunk: the output is written directly (the v1 of earlier
 * versions). Several: each split writes its (max, sum, unnormalised output) to ws and the
 * split that arrives last at the (row, head) counter merges them in split order (so results
 * do not depend on arrival order), writes out and zeroes the counter again. The keys of row m
 * are found through kv (att_kv: a contiguous cache or a paged pool).
 */
template <int HD>
static __global__ void __launch_bounds__(ATT_WARPS *K_WARP)
attention_kernel(__half *__restrict__ out, size_t out_stride, const __half *__restrict__ q,
                 size_t q_stride, const att_kv kv, int n_heads, int sliding_window,
                 float *__restrict__ ws, unsigned *__restrict__ counters)
{
    k_pdl_launch_dependents(); /* the o projection may start loading its weights (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): q and the KV cache rows are complete */
    constexpr int DPL = HD / K_WARP; /* output dims per lane */
    constexpr int KB = HD / 8 < 16 ? HD / 8 : 16; /* 16-byte key loads in flight per lane */
    constexpr int VB = 16;                         /* value rows in flight per warp */
    __shared__ __align__(16) float q_s[HD];
    __shared__ float m_s[ATT_WARPS], l_s[ATT_WARPS];
    __shared__ float acc_s[ATT_WARPS][HD];
    __shared__ bool last_s;
    const int h = blockIdx.x, m = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    /* the position read on the device (k_attention_at, _paged) is clamped to the cache / table
     * (the caller checks the context; this only keeps reads in bounds) */
    const int32_t *tab;
    const int p = att_row_pos(kv, m, &tab);
    const int kbeg = sliding_window > 0 ? max(0, p - sliding_window + 1) : 0, kend = p + 1;
    const int n = kend - kbeg;
    int chunk = n, s_act = 1;
    if (S > 1) {
        chunk = ((n + S - 1) / S + ATT_SPLIT_KEYS - 1) / ATT_SPLIT_KEYS * ATT_SPLIT_KEYS;
        s_act = (n + chunk - 1) / chunk;
    }
    if (s >= s_act) return; /* the whole block: no barrier is skipped */
    const int cbeg = kbeg + s * chunk, cend = min(kend, cbeg + chunk);
    const int kvh = h / (n_heads / kv.n_kv_heads);
    /* scale (1/sqrt(hd) by default) in q; log2(e) too when the scores are plain, else after
     * the soft-cap / ALiBi (att_shape) */
    const bool plain = att_plain(kv);
    const float qscale = att_qscale(kv, HD, plain);

    for (int d = threadIdx.x; d < HD; d += blockDim.x)
        q_s[d] = __half2float(q[(size_t)m * q_stride + (size_t)h * HD + d]) * qscale;
    __syncthreads();

    float m_run = -INFINITY, l_run = 0.0f, acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; ++d) acc[d] = 0.0f;

    for (int t0 = cbeg + warp * K_WARP; t0 < cend; t0 += ATT_WARPS * K_WARP) {
        const int t = t0 + lane;
        float s_t = -INFINITY;
        uint32_t row = 0; /* this lane's key row in the pool; the value loop reads it too */
        if (t < cend) { /* this lane's key: KB 16-byte loads in flight, then the dot product */
            row = att_key_row(kv, tab, kvh, t);
            const uint4 *kr = reinterpret_cast<const uint4 *>(kv.k + (size_t)row * HD);
            float dot = 0.0f;
#pragma unroll
            for (int c0 = 0; c0 < HD / 8; c0 += KB) {
                uint4 kb[KB];
#pragma unroll
                for (int c = 0; c < KB; ++c) kb[c] = __ldg(kr + c0 + c);
#pragma unroll
                for (int c = 0; c < KB; ++c) {
                    const uint32_t kw[4] = {kb[c].x, kb[c].y, kb[c].z, kb[c].w};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 kf = __half22float2(k_u32_as_half2(kw[e]));
                        dot = fmaf(q_s[(c0 + c) * 8 + 2 * e], kf.x, dot);
                        dot = fmaf(q_s[(c0 + c) * 8 + 2 * e + 1], kf.y, dot);
                    }
                }
            }
            s_t = plain ? dot : att_shape(kv, dot, h, t, p);
        }
        float tmax = s_t;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
        const float m_new = fmaxf(m_run, tmax); /* finite: key t0 < cend exists */
        const float corr = exp2f(m_run - m_new); /* 0 when m_run = -inf */
        const float pl = t < cend ? exp2f(s_t - m_new) : 0.0f;
        float psum = pl;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        l_run = l_run * corr + psum;
#pragma unroll
        for (int d = 0; d < DPL; ++d) acc[d] *= corr;
        const int nt = min(K_WARP, cend - t0);
        if constexpr (DPL % 2 == 1) { /* hd 96 (Phi-3-mini): 3 dims per lane, fp16 loads */
            for (int j0 = 0; j0 < nt; j0 += VB) {
                __half vh[VB][DPL];
#pragma unroll
                for (int j = 0; j < VB; ++j) {
                    if (j0 + j >= nt) continue;
                    const uint32_t vrow = __shfl_sync(0xffffffffu, row, j0 + j);
                    const __half *vr = kv.v + (size_t)vrow * HD + lane * DPL;
#pragma unroll
                    for (int d = 0; d < DPL; ++d) vh[j][d] = vr[d];
                }
#pragma unroll
                for (int j = 0; j < VB; ++j) {
                    if (j0 + j >= nt) continue;
                    const float pj = __shfl_sync(0xffffffffu, pl, j0 + j);
#pragma unroll
                    for (int d = 0; d < DPL; ++d) acc[d] = fmaf(pj, __half2float(vh[j][d]), acc[d]);
                }
            }
        } else {
        for (int j0 = 0; j0 < nt; j0 += VB) { /* VB value rows loaded, then accumulated */
            uint32_t vw[VB][DPL / 2 > 0 ? DPL / 2 : 1];
#pragma unroll
            for (int j = 0; j < VB; ++j) {
                if (j0 + j >= nt) continue; /* (not break: the unrolled slots stay registers) */
                /* value row of key t0 + j0 + j: lane j0 + j looked it up (warp-uniform here) */
                const uint32_t vrow = __shfl_sync(0xffffffffu, row, j0 + j);
                const __half *vr = kv.v + (size_t)vrow * HD + lane * DPL;
                if constexpr (DPL == 2) {
                    vw[j][0] = __ldg(reinterpret_cast<const unsigned *>(vr));
                } else if constexpr (DPL == 4) {
                    const uint2 u = __ldg(reinterpret_cast<const uint2 *>(vr));
                    vw[j][0] = u.x; vw[j][1] = u.y;
                } else {
                    const uint4 u = __ldg(reinterpret_cast<const uint4 *>(vr));
                    vw[j][0] = u.x; vw[j][1] = u.y; vw[j][2] = u.z; vw[j][3] = u.w;
                }
            }
#pragma unroll
            for (int j = 0; j < VB; ++j) {
                if (j0 + j >= nt) continue;
                const float pj = __shfl_sync(0xffffffffu, pl, j0 + j);
#pragma unroll
                for (int d = 0; d < DPL; d += 2) {
                    const float2 vf = __half22float2(k_u32_as_half2(vw[j][d / 2]));
                    acc[d] = fmaf(pj, vf.x, acc[d]);
                    acc[d + 1] = fmaf(pj, vf.y, acc[d + 1]);
                }
            }
        }
        } /* DPL even */
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
    __half *orow = out + (size_t)m * out_stride + (size_t)h * HD;
    if (s_act == 1) {
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; ++w) o += acc_s[w][d] * f[w];
            orow[d] = __float2half_rn(o / l);
        }
        return;
    }
    /* split s of s_act: (max, sum, output relative to the max) into ws[m][h][s][HD + 2] */
    const size_t rh = (size_t)m * n_heads + h;
    float *part = ws + (rh * S + s) * (HD + 2);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) o += acc_s[w][d] * f[w];
        part[2 + d] = o;
    }
    if (threadIdx.x == 0) { part[0] = mx; part[1] = l; }
    __threadfence(); /* this block's partial is visible device-wide before the counter moves */
    __syncthreads();
    if (threadIdx.x == 0) last_s = atomicAdd(counters + rh, 1u) == (unsigned)s_act - 1;
    __syncthreads();
    if (!last_s) return;
    __threadfence(); /* the last split sees every other split's partial */
    const float *base = ws + rh * S * (HD + 2);
    float gm = -INFINITY;
    for (int j = 0; j < s_act; ++j) gm = fmaxf(gm, __ldcg(base + (size_t)j * (HD + 2)));
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float o = 0.0f, lsum = 0.0f;
        for (int j = 0; j < s_act; ++j) { /* split order: the same sum at every run */
            const float *pj = base + (size_t)j * (HD + 2);
            const float fj = exp2f(__ldcg(pj) - gm);
            lsum = fmaf(__ldcg(pj + 1), fj, lsum);
            o = fmaf(__ldcg(pj + 2 + d), fj, o);
        }
        orow[d] = __float2half_rn(o / lsum);
    }
    if (threadIdx.x == 0) atomicExch(counters + rh, 0u);
}

/* Row m of k / v into the pool (one thread per element): at slot slots[m] (skipped when < 0;
 * k_kv_store_paged), else at slot start_pos + m of the contiguous cache (block_size = T_cap;
 * start_pos_dev: read on the device, rows outside the cache dropped). */
static __global__ void kv_store_kernel(__half *__restrict__ k_pool, __half *__restrict__ v_pool,
                                       const __half *__restrict__ k, const __half *__restrict__ v,
                                       size_t row_stride, int M, int start_pos,
                                       const int32_t *__restrict__ start_pos_dev,
                                       const int32_t *__restrict__ slots, int n_kv_heads, int hd,
                                       int block_size)
{
    k_pdl_launch_dependents(); /* attention may launch (k_common.cuh) */
    k_pdl_wait();              /* launched early (PDL): k and v (after rope) are complete */
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)M * n_kv_heads * hd) return;
    const int d = (int)(id % hd);
    const long long mh = id / hd;
    const int h = (int)(mh % n_kv_heads), m = (int)(mh / n_kv_heads);
    int slot;
    if (slots) { /* k_kv_store_paged: padding rows (slot < 0) are skipped */
        slot = slots[m];
        if (slot < 0) return;
    } else {
        if (start_pos_dev) { /* k_kv_store_at: rows outside the cache are dropped */
            start_pos = *start_pos_dev;
            if (start_pos < 0 || (long long)start_pos + m >= block_size) return;
        }
        slot = start_pos + m;
    }
    const size_t dst = k_kv_offset(slot, h, n_kv_heads, block_size, hd) + d;
    const size_t src = (size_t)m * row_stride + (size_t)h * hd + d;
    k_pool[dst] = k[src];
    v_pool[dst] = v[src];
}

/* kv_store_kernel over M rows (arguments checked by the callers): slots given: the paged
 * store (k_kv_store_paged); else start_pos_dev NULL uses start_pos (k_kv_store), else the
 * position read on the device (k_kv_store_at), with block_size = T_cap. */
static int kv_store_launch(uint16_t *k_pool, uint16_t *v_pool, const uint16_t *k,
                           const uint16_t *v, size_t row_stride, int M, int start_pos,
                           const int32_t *start_pos_dev, const int32_t *slots, int n_kv_heads,
                           int hd, int block_size, struct CUstream_st *stream)
{
    const long long n = (long long)M * n_kv_heads * hd;
    k_launch_ex(kv_store_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream,
                k_pdl_usable(), reinterpret_cast<__half *>(k_pool),
                reinterpret_cast<__half *>(v_pool), reinterpret_cast<const __half *>(k),
                reinterpret_cast<const __half *>(v), row_stride, M, start_pos, start_pos_dev,
                slots, n_kv_heads, hd, block_size);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
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
    return kv_store_launch(k_cache, v_cache, k, v, row_stride, M, start_pos, nullptr, nullptr,
                           n_kv_heads, hd, T_cap, stream);
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
    return kv_store_launch(k_cache, v_cache, k, v, row_stride, M, 0, start_pos_dev, nullptr,
                           n_kv_heads, hd, T_cap, stream);
}

int k_kv_store_paged(uint16_t *k_pool, uint16_t *v_pool, const uint16_t *k, const uint16_t *v,
                     size_t row_stride, int M, const int32_t *slots, int n_kv_heads, int hd,
                     int block_size, struct CUstream_st *stream)
{
    if (M < 1 || hd < 1 || n_kv_heads < 1 || block_size < 1 ||
        row_stride < (size_t)n_kv_heads * hd)
        K_REFUSE(K_ERR_SHAPE, "kv_store_paged M=%d n_kv_heads=%d hd=%d block_size=%d "
                 "row_stride=%zu", M, n_kv_heads, hd, block_size, row_stride);
    if (!k_pool || !v_pool || !k || !v || !slots)
        K_REFUSE(K_ERR_ARG, "kv_store_paged: NULL pointer");
    return kv_store_launch(k_pool, v_pool, k, v, row_stride, M, 0, nullptr, slots, n_kv_heads,
                           hd, block_size, stream);
}

int k_kv_copy_block(uint16_t *k_pool, uint16_t *v_pool, int src, int dst, size_t block_elems,
                    struct CUstream_st *stream)
{
    if (src < 0 || dst < 0 || block_elems < 1)
        K_REFUSE(K_ERR_SHAPE, "kv_copy_block src=%d dst=%d block_elems=%zu", src, dst,
                 block_elems);
    if (!k_pool || !v_pool) K_REFUSE(K_ERR_ARG, "kv_copy_block: NULL pool");
    if (src == dst) return K_ERR_NONE; /* nothing to copy (and memcpy must not overlap) */
    const size_t bytes = block_elems * sizeof(uint16_t);
    for (uint16_t *pool : {k_pool, v_pool}) /* device to device: capturable in a CUDA graph */
        K_CUDA_CHECK(cudaMemcpyAsync(pool + (size_t)dst * block_elems,
                                     pool + (size_t)src * block_elems, bytes,
                                     cudaMemcpyDeviceToDevice, stream));
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

// --- v2: prefill on tensor cores --------------------------------------------------------------

/*
 * Prefill (M >= fa::MIN_M query rows, hd 64 or 128, host start position) in the FlashAttention-2
 * decomposition (Dao, "FlashAttention-2", 2023, Algorithm 1): one block per (64 query rows,
 * head), 4 warps of 16 rows; K and V tiles of 64 keys go through shared memory in a two-stage
 * cp.async pipeline, shared by the block's rows; S = Q K^T and O += P V on mma.sync m16n8k16
 * (fp16 inputs, fp32 accumulation), the online softmax on the S fragments in registers (rows
 * reduced over the 4 lanes of a quad). P is rounded to fp16 for the P V product (as
 * FlashAttention does); max, sum and O stay fp32. Keys past the block's last position are
 * zero-filled (never read from unwritten cache rows) and masked, like those outside a row's
 * causal / sliding window. Shared-memory rows of hd fp16 are XOR-swizzled in 16-byte chunks
 * (chunk c of row r at c ^ (r & 7)) so ldmatrix reads 8 rows without bank conflicts.
 */
namespace fa {
constexpr int BM = 64, BN = 64, WARPS = 4;
constexpr int MIN_M = 16; /* fewer rows: v1 (one block per row and head) */
} // namespace fa

template <int HD>
static __device__ __forceinline__ uint32_t fa_off(int r, int c)
{
    return (uint32_t)(r * HD * 2 + ((c ^ (r & 7)) * 16));
}

/* rows [0, 64) of a [64][HD] fp16 tile from src (row stride `stride` halves), rows >= n_valid
 * zero-filled; all threads of the block take part */
template <int HD>
static __device__ __forceinline__ void fa_load_tile(unsigned char *dst, const __half *src,
                                                    size_t stride, int n_valid, int tid)
{
    constexpr int CH = HD / 8;
    for (int id = tid; id < 64 * CH; id += fa::WARPS * K_WARP) {
        const int r = id / CH, c = id % CH;
        const bool ok = r < n_valid;
        k_cp_async16(dst + fa_off<HD>(r, c), ok ? src + (size_t)r * stride + c * 8 : src, ok ? 16 : 0);
    }
}

/* keys [t1, t1 + 64) of kv head kvh into the K and V tiles kdst, vdst, rows >= n_valid
 * zero-filled; each row's pool address through the block table tab (att_key_row: the same row
 * of both pools); all threads of the block take part */
template <int HD>
static __device__ __forceinline__ void fa_load_kv_tile(unsigned char *kdst, unsigned char *vdst,
                                                       const att_kv &kv, const int32_t *tab,
                                                       int kvh, int t1, int n_valid, int tid)
{
    constexpr int CH = HD / 8;
    for (int id = tid; id < 64 * CH; id += fa::WARPS * K_WARP) {
        const int r = id / CH, c = id % CH;
        const bool ok = r < n_valid;
        const size_t off = ok ? (size_t)att_key_row(kv, tab, kvh, t1 + r) * HD + c * 8 : 0;
        k_cp_async16(kdst + fa_off<HD>(r, c), kv.k + off, ok ? 16 : 0);
        k_cp_async16(vdst + fa_off<HD>(r, c), kv.v + off, ok ? 16 : 0);
    }
}

static __device__ __forceinline__ uint32_t fa_pack_half2(float a, float b)
{
    return k_half2_as_u32(__floats2half2_rn(a, b));
}

template <int HD>
static __global__ void __launch_bounds__(fa::WARPS *K_WARP)
attention_fa_kernel(__half *__restrict__ out, size_t out_stride, const __half *__restrict__ q,
                    size_t q_stride, const att_kv kv, int M, int n_heads, int sliding_window)
{
    k_pdl_launch_dependents();
    k_pdl_wait(); /* launched early (PDL): q and the KV cache rows are complete */
    constexpr int TILE = 64 * HD * 2, KS = HD / 16, NO = HD / 8;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    unsigned char *qs = fa_smem; /* then K stages 0, 1 and V stages 0, 1 */
    auto ks = [&](int st) { return fa_smem + (1 + st) * TILE; };
    auto vs = [&](int st) { return fa_smem + (3 + st) * TILE; };
    const int tid = threadIdx.x, lane = tid % K_WARP, warp = tid / K_WARP;
    const int g = lane / 4, t = lane % 4;
    /* the heaviest (latest) row tiles first: causal work grows with the position */
    const int mt = (int)gridDim.x - 1 - (int)blockIdx.x, h = blockIdx.y;
    const int m0 = mt * fa::BM, rows = min(fa::BM, M - m0);
    const int p0 = kv.start_pos + m0, p_last = p0 + rows - 1; /* host start: no clamping */
    const int kbeg = sliding_window > 0 ? max(0, p0 - sliding_window + 1) : 0, kend = p_last + 1;
    const int kvh = h / (n_heads / kv.n_kv_heads);
    const int32_t *tab = kv.tables; /* one sequence: table row 0 (NULL: block 0) */

    fa_load_tile<HD>(qs, q + (size_t)m0 * q_stride + (size_t)h * HD, q_stride, rows, tid);
    fa_load_kv_tile<HD>(ks(0), vs(0), kv, tab, kvh, kbeg, kend - kbeg, tid);
    k_cp_async_commit();
    k_cp_async_wait<0>();
    __syncthreads();

    uint32_t qa[KS][4]; /* this warp's 16 query rows as A fragments */
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
        k_ldmatrix_x4(qa[kk], qs + fa_off<HD>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));

    const bool plain = att_plain(kv);
    const float qscale = att_qscale(kv, HD, plain); /* log2(e) after att_shape */
    float o[NO][4], m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const int pr[2] = {p0 + warp * 16 + g, p0 + warp * 16 + g + 8}; /* this lane's two rows */
    int lo[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) lo[i] = sliding_window > 0 ? pr[i] - sliding_window + 1 : 0;

    int stage = 0;
    for (int t0 = kbeg; t0 < kend; t0 += fa::BN, stage ^= 1) {
        if (t0 + fa::BN < kend) { /* next tile into the other stage while this one is used */
            const int t1 = t0 + fa::BN;
            fa_load_kv_tile<HD>(ks(stage ^ 1), vs(stage ^ 1), kv, tab, kvh, t1, kend - t1, tid);
        }
        k_cp_async_commit();
        /* S = Q K^T: 16 rows x 64 keys, 8 n8 tiles */
        float sacc[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk)
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                uint32_t b[4];
                const int mat = lane >> 3;
                k_ldmatrix_x4(b, ks(stage) + fa_off<HD>(8 * j + 8 * (mat >> 1) + (lane & 7), 2 * kk + (mat & 1)));
                k_mma_16816(sacc[j], qa[kk], b[0], b[1]);
                k_mma_16816(sacc[j + 1], qa[kk], b[2], b[3]);
            }
        /* mask, scale, online softmax: element e of n8 tile j is row i = e / 2, key t0 + 8j +
         * 2t + (e & 1) */
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e >> 1, key = t0 + 8 * j + 2 * t + (e & 1);
                const bool ok = key <= pr[i] && key >= lo[i];
                sacc[j][e] = !ok ? -INFINITY
                             : plain ? sacc[j][e] * qscale
                                     : att_shape(kv, sacc[j][e] * qscale, h, key, pr[i]);
                tmax[i] = fmaxf(tmax[i], sacc[j][e]);
            }
        float corr[2], base[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
            tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
            const float m_new = fmaxf(m_run[i], tmax[i]);
            base[i] = m_new == -INFINITY ? 0.0f : m_new; /* a row with no key yet */
            corr[i] = exp2f(m_run[i] - base[i]);
            m_run[i] = m_new;
            l_run[i] *= corr[i];
        }
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            o[n][0] *= corr[0]; o[n][1] *= corr[0];
            o[n][2] *= corr[1]; o[n][3] *= corr[1];
        }
        uint32_t pa[4][4]; /* P as A fragments, 16 keys per k-step */
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pv[e] = exp2f(sacc[j][e] - base[e >> 1]);
                l_run[e >> 1] += pv[e];
            }
            pa[j / 2][(j & 1) * 2 + 0] = fa_pack_half2(pv[0], pv[1]);
            pa[j / 2][(j & 1) * 2 + 1] = fa_pack_half2(pv[2], pv[3]);
        }
        /* O += P V: V rows (keys) through ldmatrix.trans as B fragments */
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int n = 0; n < NO; n += 2) {
                uint32_t b[4];
                const int mat = lane >> 3;
                k_ldmatrix_x4_trans(b, vs(stage) + fa_off<HD>(16 * kk + 8 * (mat & 1) + (lane & 7),
                                                              n + (mat >> 1)));
                k_mma_16816(o[n], pa[kk], b[0], b[1]);
                k_mma_16816(o[n + 1], pa[kk], b[2], b[3]);
            }
        k_cp_async_wait<0>();
        __syncthreads(); /* the next stage has landed; nobody reads this one any more */
    }

    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
        inv[i] = 1.0f / l_run[i]; /* > 0: key p itself is always in the window */
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = warp * 16 + g + 8 * i;
        if (r >= rows) continue;
        __half *dst = out + (size_t)(m0 + r) * out_stride + (size_t)h * HD + 2 * t;
#pragma unroll
        for (int n = 0; n < NO; ++n)
            *reinterpret_cast<__half2 *>(dst + 8 * n) =
                __floats2half2_rn(o[n][2 * i] * inv[i], o[n][2 * i + 1] * inv[i]);
    }
}

template <int HD>
static void attention_fa_launch(__half *out, size_t out_stride, const __half *q, size_t q_stride,
                                const att_kv &kv, int M, int n_heads, int sliding_window,
                                cudaStream_t stream)
{
    constexpr int SMEM = 5 * 64 * HD * 2; /* Q + 2 stages of K and V: 40 / 80 KB */
    static int attr_set[K_MAX_DEVICES];
    k_per_device(attr_set, [&](int) {
        K_CUDA_CHECK(cudaFuncSetAttribute(attention_fa_kernel<HD>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
        return 1;
    });
    const dim3 grid((unsigned)((M + fa::BM - 1) / fa::BM), (unsigned)n_heads);
    k_launch_ex(attention_fa_kernel<HD>, grid, dim3(fa::WARPS * K_WARP), SMEM, stream,
                k_pdl_usable(), out, out_stride, q, q_stride, kv, M, n_heads, sliding_window);
}

/* Splits of the v1 kernel for M rows of n_heads heads with at most n_keys keys per row: enough
 * blocks for ~4 per SM, chunks of >= ATT_SPLIT_KEYS keys, at most ATT_MAX_SPLITS. */
static int attention_splits(int M, int n_heads, long n_keys)
{
    const long base = (long)M * n_heads, target = 4L * k_device_sm_count();
    long S = (target + base - 1) / base;
    S = std::min(S, (long)ATT_MAX_SPLITS);
    S = std::min(S, (n_keys + ATT_SPLIT_KEYS - 1) / ATT_SPLIT_KEYS);
    return (int)std::max(S, 1L);
}

/* ws of the v1 kernel with S splits: first a counter per (row, head), at a place that does not
 * depend on M (S > 1 only where M * n_heads < 4 * SMs, attention_splits, so that many
 * counters cover every call; calls with other M then never write partials over another
 * call's counters), then the partials [M][n_heads][S][hd + 2] fp32; nothing for S = 1 */
static size_t attention_counter_bytes(void)
{
    return ((size_t)4 * k_device_sm_count() * sizeof(unsigned) + 15) / 16 * 16;
}

static size_t attention_ws_bytes(int M, int n_heads, int hd, int S)
{
    if (S <= 1) return 0;
    return attention_counter_bytes() + (size_t)M * n_heads * S * (hd + 2) * sizeof(float);
}

size_t k_attention_workspace_bytes(int M, int n_heads, int hd, int T_cap)
{
    if (M < 1 || n_heads < 1 || hd < 1 || T_cap < 1) return 0;
    /* the most any call of up to M rows takes: rows x splits peaks below 4 * SMs rows' worth */
    const int hi = (int)std::min<long>(M, 4L * k_device_sm_count());
    size_t most = 0;
    for (int m = 1; m <= hi; ++m)
        most = std::max(most, attention_ws_bytes(m, n_heads, hd,
                                                 attention_splits(m, n_heads, T_cap)));
    return most;
}

/* v2 or v1 over kv (arguments checked by the callers). v2 where the rows are one sequence at a
 * host start position (kv.pos and kv.start_pos_dev NULL), M >= fa::MIN_M, hd 64 / 128 and the
 * buffers aligned; else v1, its keys split when a workspace is given: the split count from
 * n_keys, the most keys of any row (the chunking of a row follows its own count on the device,
 * so the device-position launches size the grid for the whole cache / max_keys). */
static int attention_launch(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                            const att_kv &kv, int M, int n_heads, int hd, long n_keys,
                            int sliding_window, void *ws, size_t ws_bytes,
                            struct CUstream_st *stream)
{
    const __half *qh = reinterpret_cast<const __half *>(q);
    __half *oh = reinterpret_cast<__half *>(out);
    /* prefill: v2, which reads q rows and K/V tiles in 16-byte chunks and writes out in pairs */
    const bool aligned = (uintptr_t)q % 16 == 0 && q_stride % 8 == 0 && (uintptr_t)out % 4 == 0 &&
                         out_stride % 2 == 0 && (uintptr_t)kv.k % 16 == 0 &&
                         (uintptr_t)kv.v % 16 == 0;
    if (!kv.pos && !kv.start_pos_dev && M >= fa::MIN_M && (hd == 64 || hd == 128) && aligned) {
        if (hd == 64)
            attention_fa_launch<64>(oh, out_stride, qh, q_stride, kv, M, n_heads, sliding_window,
                                    stream);
        else
            attention_fa_launch<128>(oh, out_stride, qh, q_stride, kv, M, n_heads, sliding_window,
                                     stream);
        K_LAUNCH_CHECK();
        return K_ERR_NONE;
    }
    int S = 1;
    if (ws) {
        S = attention_splits(M, n_heads, n_keys);
        const size_t need = attention_ws_bytes(M, n_heads, hd, S);
        if ((uintptr_t)ws % 16)
            K_REFUSE(K_ERR_ARG, "attention: workspace at %p is not 16-byte aligned", ws);
        if (ws_bytes < need)
            K_REFUSE(K_ERR_WORKSPACE, "attention M=%d n_heads=%d hd=%d keys=%ld: workspace of "
                     "%zu bytes needed, got %zu", M, n_heads, hd, n_keys, need, ws_bytes);
    }
    unsigned *counters = S > 1 ? static_cast<unsigned *>(ws) : nullptr;
    float *wsf = S > 1 ? reinterpret_cast<float *>(static_cast<unsigned char *>(ws) +
                                                   attention_counter_bytes())
                       : nullptr;
    const dim3 grid(n_heads, M, S);
#define ATT_LAUNCH(HDV)                                                                      \
    k_launch_ex(attention_kernel<HDV>, grid, dim3(ATT_WARPS * K_WARP), 0, stream,              \
                k_pdl_usable(), oh, out_stride, qh, q_stride, kv, n_heads, sliding_window, wsf, \
                counters)
    if (hd == 64) ATT_LAUNCH(64);
    else if (hd == 96) ATT_LAUNCH(96);
    else if (hd == 128) ATT_LAUNCH(128);
    else ATT_LAUNCH(256);
#undef ATT_LAUNCH
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/* The shape checks every attention entry point makes (the heads, hd, M and the row strides). */
static bool attention_heads_ok(int M, int n_heads, int n_kv_heads, int hd, size_t q_stride,
                               size_t out_stride)
{
    return M >= 1 && M <= 65535 && n_heads >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0 &&
           (hd == 64 || hd == 96 || hd == 128 || hd == 256) && q_stride >= (size_t)n_heads * hd &&
           out_stride >= (size_t)n_heads * hd;
}

int k_attention(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                const uint16_t *k_cache, const uint16_t *v_cache, int M, int start_pos,
                int n_heads, int n_kv_heads, int hd, int T_cap, int sliding_window, void *ws,
                size_t ws_bytes, struct CUstream_st *stream)
{
    if (!attention_heads_ok(M, n_heads, n_kv_heads, hd, q_stride, out_stride) || start_pos < 0 ||
        (long long)start_pos + M > T_cap)
        K_REFUSE(K_ERR_SHAPE, "attention M=%d start_pos=%d n_heads=%d n_kv_heads=%d hd=%d "
                 "T_cap=%d: need hd in {64,96,128,256}, n_heads %% n_kv_heads == 0, "
                 "start_pos + M <= T_cap", M, start_pos, n_heads, n_kv_heads, hd, T_cap);
    if (!out || !q || !k_cache || !v_cache) K_REFUSE(K_ERR_ARG, "attention: NULL pointer");
    const att_kv kv = att_kv_contiguous(k_cache, v_cache, start_pos, nullptr, n_kv_heads, T_cap);
    return attention_launch(out, out_stride, q, q_stride, kv, M, n_heads, hd,
                            (long)start_pos + M, sliding_window, ws, ws_bytes, stream);
}

int k_attention_at(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                   const uint16_t *k_cache, const uint16_t *v_cache, int M,
                   const int32_t *start_pos_dev, int n_heads, int n_kv_heads, int hd, int T_cap,
                   int sliding_window, void *ws, size_t ws_bytes, struct CUstream_st *stream)
{
    if (!attention_heads_ok(M, n_heads, n_kv_heads, hd, q_stride, out_stride) || M > T_cap)
        K_REFUSE(K_ERR_SHAPE, "attention_at M=%d n_heads=%d n_kv_heads=%d hd=%d T_cap=%d: need "
                 "hd in {64,96,128,256}, n_heads %% n_kv_heads == 0", M, n_heads, n_kv_heads, hd,
                 T_cap);
    if (!out || !q || !k_cache || !v_cache || !start_pos_dev)
        K_REFUSE(K_ERR_ARG, "attention_at: NULL pointer");
    const att_kv kv = att_kv_contiguous(k_cache, v_cache, 0, start_pos_dev, n_kv_heads, T_cap);
    return attention_launch(out, out_stride, q, q_stride, kv, M, n_heads, hd, (long)T_cap,
                            sliding_window, ws, ws_bytes, stream);
}

int k_attention_paged(uint16_t *out, size_t out_stride, const uint16_t *q, size_t q_stride,
                      const uint16_t *k_pool, const uint16_t *v_pool, int M, const int32_t *pos,
                      const int32_t *tables, int table_stride, const int32_t *row_table,
                      int n_heads, int n_kv_heads, int hd, int block_size, int max_keys,
                      int sliding_window, const struct ref_att_score *score, void *ws,
                      size_t ws_bytes, struct CUstream_st *stream)
{
    if (!attention_heads_ok(M, n_heads, n_kv_heads, hd, q_stride, out_stride) ||
        block_size < 1 || table_stride < 1 || max_keys < 1)
        K_REFUSE(K_ERR_SHAPE, "attention_paged M=%d n_heads=%d n_kv_heads=%d hd=%d "
                 "block_size=%d table_stride=%d max_keys=%d: need hd in {64,96,128,256}, n_heads %% "
                 "n_kv_heads == 0, M <= 65535, block_size, table_stride, max_keys >= 1", M,
                 n_heads, n_kv_heads, hd, block_size, table_stride, max_keys);
    if (!out || !q || !k_pool || !v_pool || !pos || !tables)
        K_REFUSE(K_ERR_ARG, "attention_paged: NULL pointer");
    att_kv kv = att_kv_paged(k_pool, v_pool, n_kv_heads, block_size);
    kv.tables = tables;
    kv.table_stride = table_stride;
    kv.row_table = row_table;
    kv.pos = pos;
    att_kv_score(kv, score);
    return attention_launch(out, out_stride, q, q_stride, kv, M, n_heads, hd, (long)max_keys,
                            sliding_window, ws, ws_bytes, stream);
}

int k_attention_paged_prefill(uint16_t *out, size_t out_stride, const uint16_t *q,
                              size_t q_stride, const uint16_t *k_pool, const uint16_t *v_pool,
                              int M, int start_pos, const int32_t *table, int n_heads,
                              int n_kv_heads, int hd, int block_size, int sliding_window,
                              const struct ref_att_score *score, void *ws, size_t ws_bytes,
                              struct CUstream_st *stream)
{
    if (!attention_heads_ok(M, n_heads, n_kv_heads, hd, q_stride, out_stride) || start_pos < 0 ||
        block_size < 1 || (long long)start_pos + M > INT_MAX)
        K_REFUSE(K_ERR_SHAPE, "attention_paged_prefill M=%d start_pos=%d n_heads=%d "
                 "n_kv_heads=%d hd=%d block_size=%d: need hd in {64,96,128,256}, n_heads %% "
                 "n_kv_heads == 0, start_pos >= 0, block_size >= 1", M, start_pos, n_heads,
                 n_kv_heads, hd, block_size);
    if (!out || !q || !k_pool || !v_pool || !table)
        K_REFUSE(K_ERR_ARG, "attention_paged_prefill: NULL pointer");
    const long long T = (long long)start_pos + M;
    att_kv kv = att_kv_paged(k_pool, v_pool, n_kv_heads, block_size);
    kv.tables = table;
    kv.table_stride = (int)((T + block_size - 1) / block_size); /* >= T rows: no clamping */
    kv.start_pos = start_pos;
    att_kv_score(kv, score);
    return attention_launch(out, out_stride, q, q_stride, kv, M, n_heads, hd, (long)T,
                            sliding_window, ws, ws_bytes, stream);
}

/*
 * k_sample.cu - sampling on the GPU. Greedy: ids[m] = argmax of logits row m over ids
 * < min(n, vocab_size) (padding ids never win, NaNs skipped, ties to the lowest id, -1 if no
 * candidate). Reference ref_argmax. One block per row, (value, index) pairs reduced with warp
 * shuffles then across warps in shared memory.
 * k_sample: one id from one row with every step of runtime/rt_sample.h (repetition penalty,
 * greedy, temperature, top-k, top-p, min-p, the draw); its reference is rt_sample.c itself, the
 * CPU backend's sampler. Test: build/gpu_test_ops (areas argmax, sample).
 */
#include "k_common.cuh"

#include <limits.h> /* INT_MAX */
#include <math.h>

constexpr int AM_THREADS = 1024;

/* (v, i) beats (bv, bi): larger value, or equal value and smaller index; index -1 = empty. */
static __device__ __forceinline__ bool am_better(float v, int i, float bv, int bi)
{
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

/* The best (value, index) of the block under am_better (so ties go to the lowest index) from
 * every thread's (bv, bi): warp shuffles, then thread 0 over the n_warps partials in sv/si
 * (shared [n_warps]). The result is valid in thread 0 only (-1: no candidate). */
static __device__ __forceinline__ int am_block_best(float bv, int bi, float *sv, int *si,
                                                    int n_warps)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x % K_WARP, warp = threadIdx.x / K_WARP;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < n_warps; ++w)
            if (am_better(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }
    return bi;
}

static __global__ void __launch_bounds__(AM_THREADS)
argmax_kernel(int32_t *__restrict__ ids, const float *__restrict__ logits, int n,
              size_t row_stride)
{
    __shared__ float sv[AM_THREADS / K_WARP];
    __shared__ int si[AM_THREADS / K_WARP];
    const float *row = logits + (size_t)blockIdx.x * row_stride;
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        if (!isnan(v) && am_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    bi = am_block_best(bv, bi, sv, si, (int)(blockDim.x / K_WARP));
    if (threadIdx.x == 0) ids[blockIdx.x] = bi;
}

int k_argmax(int32_t *ids, const float *logits, int M, int n, size_t row_stride, int vocab_size,
             struct CUstream_st *stream)
{
    if (M < 1 || n < 1 || row_stride < (size_t)n)
        K_REFUSE(K_ERR_SHAPE, "argmax M=%d n=%d row_stride=%zu", M, n, row_stride);
    if (!ids || !logits || vocab_size < 1)
        K_REFUSE(K_ERR_ARG, "argmax: NULL pointer or vocab_size %d < 1", vocab_size);
    argmax_kernel<<<M, AM_THREADS, 0, stream>>>(ids, logits, n < vocab_size ? n : vocab_size,
                                                row_stride);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/* --- k_sample: rt_sample.h steps 1-7 in one block ------------------------------------------- */
/*
 * One block of SP_THREADS walks the row several times (each walk recomputes the processed
 * logit of an id from the row, which stays in L2): no sort and no [V] scratch.
 *   - top-k threshold: radix select (4 passes of 8 bits) of the k-th largest order-preserving
 *     key among the finite logits, counting multiplicity, as a k-entry heap does.
 *   - top-p: the same radix walk weighted by probability mass finds K*, the smallest key whose
 *     larger survivors hold mass < p (the ids of keys above K* are all kept, of keys below none);
 *     ids tied at K* are kept in ascending id order while the mass before them stays < p, and a
 *     count-select over ids finds the last one kept.
 *   - draw: each thread owns a contiguous run of ids; an exclusive block scan of the runs'
 *     probability sums gives every run its start, and the run holding u walks its ids.
 * Sums differ from the CPU's sequential sums only in rounding (the order of a tree), so the
 * result differs only where u or p lands within rounding of a cumulative boundary (rt_sample.h).
 */
constexpr int SP_THREADS = 1024;
constexpr int SP_WARPS = SP_THREADS / K_WARP;

struct sp_args {
    const float *logits;  /* [V] */
    const uint8_t *seen;  /* [ceil(V/8)] or NULL (repeat penalty off) */
    int32_t *out_id;
    uint8_t *keep;        /* [V] or NULL */
    int V;
    int top_k;
    float temperature, top_p, min_p, rp;
    double u;
};

constexpr int SP_CAP = 1024; /* candidates the fast path holds in shared memory */

struct sp_smem {
    uint32_t cnt[256];
    double mass[256];
    double dred[SP_WARPS];
    float fred[SP_WARPS];
    int ired[SP_WARPS];
    int bucket;
    uint32_t rest;
    double above;
    int pick;
    /* fast path (sp_fast) */
    unsigned long long cand[SP_CAP]; /* (~key(x) << 32 | id): ascending = x descending, id ascending */
    unsigned long long byid[SP_CAP]; /* (id << 32 | rank in cand[]) of the survivors, sorted */
    double e[SP_CAP];                /* exp(x - mx) of cand[r] */
    int n_cand;
};

/* Step 1 (NaN -> -inf, repetition penalty) and, with `scale`, step 3 (temperature) on the raw
 * logit `x` of id i whose history byte is `seen_byte`, with the CPU's float operations so both
 * give the same bits. */
static __device__ __forceinline__ float sp_fix(const sp_args &a, int i, float x,
                                               unsigned seen_byte, bool scale)
{
    if (isnan(x)) x = -INFINITY;
    if (a.rp != 1.0f && ((seen_byte >> (i & 7)) & 1)) x = x > 0.0f ? x / a.rp : x * a.rp;
    if (scale && a.temperature != 1.0f) x = x / a.temperature;
    return x;
}
static __device__ __forceinline__ float sp_x(const sp_args &a, int i, bool scale)
{
    return sp_fix(a, i, a.logits[i], a.rp != 1.0f ? a.seen[i >> 3] : 0u, scale);
}

/*
 * Calls f(i, valid, x) for the ids of the row, x its processed logit (sp_fix), in a
 * warp-uniform order: each thread first issues SP_R 16-byte loads (4 ids each), then uses them
 * (a pass over a 128k-id row from one block is latency-bound otherwise); a row that is not
 * 16-byte aligned, and the last V % 4 ids, go one id per thread. Ids past V come with
 * valid = false and x = -inf, so that warp-collective code in f sees whole warps. The 4 ids of
 * one load share one history byte (4q .. 4q+3 lie in byte q/2).
 */
constexpr int SP_R = 2;
template <class F>
static __device__ __forceinline__ void sp_each(const sp_args &a, bool scale, F &&f)
{
    const int V4 = reinterpret_cast<uintptr_t>(a.logits) % 16 == 0 ? a.V / 4 : 0;
    const float4 *l4 = reinterpret_cast<const float4 *>(a.logits);
    for (int base = 0; base < V4; base += SP_R * SP_THREADS) {
        float4 raw[SP_R];
        unsigned sb[SP_R];
#pragma unroll
        for (int j = 0; j < SP_R; ++j) {
            const int q = base + j * SP_THREADS + (int)threadIdx.x;
            raw[j] = q < V4 ? __ldg(l4 + q) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            sb[j] = q < V4 && a.rp != 1.0f ? __ldg(a.seen + (q >> 1)) : 0u;
        }
#pragma unroll
        for (int j = 0; j < SP_R; ++j) {
            const int q = base + j * SP_THREADS + (int)threadIdx.x, i = 4 * q;
            const bool valid = q < V4;
            f(i, valid, sp_fix(a, i, raw[j].x, sb[j], scale));
            f(i + 1, valid, sp_fix(a, i + 1, raw[j].y, sb[j], scale));
            f(i + 2, valid, sp_fix(a, i + 2, raw[j].z, sb[j], scale));
            f(i + 3, valid, sp_fix(a, i + 3, raw[j].w, sb[j], scale));
        }
    }
    for (int base = 4 * V4; base < a.V; base += SP_THREADS) {
        const int i = base + (int)threadIdx.x;
        const bool valid = i < a.V;
        f(i, valid, valid ? sp_x(a, i, scale) : -INFINITY);
    }
}

/* Order-preserving key of a non-NaN float (-0 and +0 map to one key, as they compare equal). */
static __device__ __forceinline__ uint32_t sp_key(float x)
{
    const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
static __device__ __forceinline__ float sp_unkey(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Block-wide reduction with op (warp shuffles, then the warps' partials in red[SP_WARPS] from
 * init), the same tree every time (deterministic); every thread gets the result. */
template <class T, class Op>
static __device__ __forceinline__ T sp_reduce(T v, T *red, T init, Op op)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (threadIdx.x % K_WARP == 0) red[threadIdx.x / K_WARP] = v;
    __syncthreads();
    T s = init;
    for (int w = 0; w < SP_WARPS; ++w) s = op(s, red[w]);
    return s;
}
static __device__ double sp_sum(double v, sp_smem &sm)
{
    return sp_reduce(v, sm.dred, 0.0, [](double x, double y) { return x + y; });
}
static __device__ float sp_max(float v, sp_smem &sm)
{
    return sp_reduce(v, sm.fred, -INFINITY, [](float x, float y) { return fmaxf(x, y); });
}
static __device__ int sp_sum_int(int v, sp_smem &sm)
{
    return sp_reduce(v, sm.ired, 0, [](int x, int y) { return x + y; });
}

/*
 * Histogram update from a whole warp (call it warp-uniformly): every lane with `valid` adds 1
 * (and with MASS its m) to bucket b, one shared-memory atomic per distinct bucket in the warp.
 * Logits cluster in a few buckets of the top key bits, where per-lane atomics serialise on one
 * address.
 */
static __device__ __forceinline__ void sp_count_add(bool valid, uint32_t b, uint32_t *cnt)
{ /* counts: the lanes of one bucket find each other in one instruction */
    const unsigned act = __ballot_sync(0xffffffffu, valid);
    const unsigned peers = __match_any_sync(0xffffffffu, valid ? b : 0xffffffffu) & act;
    if (valid && (int)(threadIdx.x % K_WARP) == __ffs(peers) - 1)
        atomicAdd(&cnt[b], (uint32_t)__popc(peers));
}
template <bool MASS>
static __device__ __forceinline__ void sp_hist_add(bool valid, uint32_t b, double m, sp_smem &sm)
{
    const int lane = threadIdx.x % K_WARP;
    if (!MASS) {
        sp_count_add(valid, b, sm.cnt);
        return;
    }
    bool pending = valid;
    for (;;) {
        const unsigned todo = __ballot_sync(0xffffffffu, pending);
        if (!todo) break;
        const int src = __ffs(todo) - 1;
        const uint32_t b0 = __shfl_sync(0xffffffffu, b, src);
        const bool in = pending && b == b0;
        const unsigned grp = __ballot_sync(0xffffffffu, in);
        if (MASS) {
            double t = in ? m : 0.0;
#pragma unroll
            for (int o = 16; o > 0; o /= 2) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == src) atomicAdd(&sm.mass[b0], t);
        }
        if (lane == src) atomicAdd(&sm.cnt[b0], (uint32_t)__popc(grp));
        pending = pending && !in;
    }
}

/*
 * Warp 0 finds the bucket b of sm.cnt (counts of 256 buckets) where the count from the top
 * reaches k (>= 1; the caller guarantees the total does): lane l sums buckets 255-8l ..
 * 248-8l, a warp scan finds the lane where the count reaches k, that lane walks its 8 buckets.
 * Leaves sm.bucket = b, sm.rest = k minus the count above b, and sm.above = the count up to
 * and including b. The caller synchronises before and after.
 */
static __device__ void sp_find_bucket(uint32_t k, sp_smem &sm)
{
    if (threadIdx.x >= K_WARP) return;
    const int lane = threadIdx.x, top = 255 - 8 * lane;
    uint32_t own = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) own += sm.cnt[top - j];
    uint32_t incl = own;
#pragma unroll
    for (int o = 1; o < K_WARP; o *= 2) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, incl >= k);
    if (lane == __ffs(hit) - 1) {
        uint32_t acc = incl - own;
        for (int j = 0; j < 8; ++j) {
            const uint32_t c = sm.cnt[top - j];
            if (acc + c >= k) {
                sm.bucket = top - j;
                sm.rest = k - acc;
                sm.above = (double)(acc + c);
                break;
            }
            acc += c;
        }
    }
}

/*
 * The key of the k-th largest (k >= 1, counting multiplicity) among the ids where
 * f(i, x, &key) is true (x: the processed logit); the caller guarantees at least k of them.
 * Radix select, 8 bits per pass from the top (sp_find_bucket picks each pass's bucket).
 */
template <class F>
static __device__ uint32_t sp_select(const sp_args &a, const F &f, uint32_t k, sp_smem &sm)
{
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += SP_THREADS) sm.cnt[b] = 0;
        __syncthreads();
        sp_each(a, true, [&](int i, bool valid, float x) {
            uint32_t key = 0;
            const bool v = valid && f(i, x, &key) && (key & mask) == prefix;
            sp_hist_add<false>(v, (key >> shift) & 255u, 0.0, sm);
        });
        __syncthreads();
        sp_find_bucket(k, sm);
        __syncthreads();
        prefix |= (uint32_t)sm.bucket << shift;
        mask |= 0xffu << shift;
        k = sm.rest;
        __syncthreads();
    }
    return prefix;
}

/* Uniform (block-wide) state of the survivor test after steps 4-6. */
struct sp_state {
    float thr;       /* top-k: keep x >= thr */
    double mx;       /* largest finite processed logit */
    bool top_p;      /* top-p applies */
    uint32_t kstar;  /* top-p: keys > kstar kept, == kstar kept for ids <= id_cut */
    int id_cut;
    double min_p;    /* min-p cut on e = exp(x - mx); 0: off */
};

/* The unnormalised weight exp(x - mx) of a survivor; 1 for x == mx, so a +inf maximum gives
 * the ids at +inf equal weight and the rest 0 instead of NaN (rt_sample.h, rt_sample.c weight). */
static __device__ __forceinline__ double sp_weight(float x, double mx)
{
    return (double)x == mx ? 1.0 : exp((double)x - mx);
}

/* Whether id i with processed logit x survives steps 4-5 (and 6 with `minp`); *e = its weight. */
static __device__ __forceinline__ bool sp_survives(const sp_state &st, int i, float x, bool minp,
                                                   double *e)
{
    if (x == -INFINITY || !(x >= st.thr)) return false;
    if (st.top_p) {
        const uint32_t k = sp_key(x);
        if (k < st.kstar || (k == st.kstar && i > st.id_cut)) return false;
    }
    *e = sp_weight(x, st.mx);
    return !(minp && *e < st.min_p);
}

/* Ascending bitonic sort of v[0..n) in shared memory (n <= SP_CAP; the slots up to the next power
 * of two are filled with ~0, which sorts last). Whole block. */
static __device__ void sp_sort(unsigned long long *v, int n)
{
    int N = 1;
    while (N < n) N *= 2;
    for (int i = n + (int)threadIdx.x; i < N; i += SP_THREADS) v[i] = ~0ull;
    __syncthreads();
    for (int k = 2; k <= N; k *= 2)
        for (int j = k / 2; j > 0; j /= 2) {
            for (int i = threadIdx.x; i < N; i += SP_THREADS) {
                const int l = i ^ j;
                if (l > i) {
                    const unsigned long long x = v[i], y = v[l];
                    if (((i & k) == 0) == (x > y)) { v[i] = y; v[l] = x; }
                }
            }
            __syncthreads();
        }
}

/*
 * Fast path for few survivors (the usual top-k 40, or a peaked distribution under top-p
 * alone): the candidates go to shared memory, are sorted, and thread 0 then runs exactly the
 * CPU's sequence of rt_sample.c (sums in ascending id order, the top-p walk in descending
 * order), so the result is the CPU's, bit for bit where exp() rounds alike.
 *   - top-k (k <= SP_CAP, at least k finite): candidates are the ids whose first key byte
 *     (or, when that bucket holds too many, first two bytes) is at least the k-th largest's,
 *     found from pass 1's counts (and one more counting pass over that bucket);
 *   - top-p with top-k off: the ids with e >= (1 - p) / n (n finite ids), a superset of the
 *     nucleus (rt_sample.c top_p_cut), with sum(e) from a tree sum over all finite ids;
 *   - otherwise, or with more than SP_CAP candidates: returns false (block-uniform) and the
 *     general path runs.
 */
static __device__ bool sp_fast(const sp_args &a, float mx, int nfin, sp_smem &sm)
{
    const int V = a.V, tid = threadIdx.x;
    const bool use_k = a.top_k > 0 && a.top_k < V && nfin >= a.top_k; /* else: all finite survive */
    const double dmx = (double)mx;
    uint32_t key_lo = 0;
    double x_lo = 0.0, sum_all = 0.0;
    if (use_k && a.top_k <= SP_CAP) {
        /* sm.cnt: pass 1's counts of the first key byte; the k-th largest is in bucket b1 */
        __syncthreads();
        sp_find_bucket((uint32_t)a.top_k, sm);
        __syncthreads();
        const uint32_t b1 = (uint32_t)sm.bucket, k2 = sm.rest;
        const double through = sm.above, above = through - (double)sm.cnt[b1];
        key_lo = b1 << 24;
        if (through > SP_CAP) { /* b1 is too full (a byte spans 4 octaves): count its 2nd byte */
            __syncthreads();
            for (int b = tid; b < 256; b += SP_THREADS) sm.cnt[b] = 0;
            __syncthreads();
            sp_each(a, true, [&](int, bool valid, float x) {
                const uint32_t key = sp_key(x);
                sp_count_add(valid && x != -INFINITY && key >> 24 == b1, (key >> 16) & 255u,
                             sm.cnt);
            });
            __syncthreads();
            sp_find_bucket(k2, sm);
            __syncthreads();
            if (above + sm.above > SP_CAP) return false;
            key_lo |= (uint32_t)sm.bucket << 16;
        }
    } else if (!use_k && a.top_p < 1.0f) {
        x_lo = dmx + log((1.0 - (double)a.top_p) / (double)nfin * (1.0 - 1e-6));
        double t = 0.0;
        sp_each(a, true, [&](int, bool valid, float x) {
            if (valid && x != -INFINITY) t += sp_weight(x, dmx);
        });
        sum_all = sp_sum(t, sm);
    } else {
        return false;
    }
    __syncthreads();
    if (tid == 0) sm.n_cand = 0;
    __syncthreads();
    sp_each(a, true, [&](int i, bool valid, float x) {
        const bool v = valid && x != -INFINITY && (use_k ? sp_key(x) >= key_lo : (double)x >= x_lo);
        const unsigned act = __ballot_sync(0xffffffffu, v);
        if (!act) return;
        const int lane = tid % K_WARP, lead = __ffs(act) - 1;
        int base = 0;
        if (lane == lead) base = atomicAdd(&sm.n_cand, __popc(act));
        base = __shfl_sync(0xffffffffu, base, lead);
        const int pos = base + __popc(act & ((1u << lane) - 1));
        if (v && pos < SP_CAP)
            sm.cand[pos] = (unsigned long long)(~sp_key(x)) << 32 | (uint32_t)i;
    });
    __syncthreads();
    const int n_c = sm.n_cand;
    if (n_c > SP_CAP) return false; /* top-p alone on a flat distribution */
    sp_sort(sm.cand, n_c);
    /* survivors of step 4: with top-k, those >= the k-th largest (ties kept); else all candidates */
    int n_s = n_c;
    if (use_k) {
        const uint32_t kk = (uint32_t)(sm.cand[a.top_k - 1] >> 32);
        if (tid == 0) {
            int n = a.top_k;
            while (n < n_c && (uint32_t)(sm.cand[n] >> 32) == kk) ++n;
            sm.rest = (uint32_t)n;
        }
        __syncthreads();
        n_s = (int)sm.rest;
    }
    for (int r = tid; r < n_s; r += SP_THREADS) {
        const unsigned long long c = sm.cand[r];
        sm.byid[r] = (unsigned long long)(uint32_t)c << 32 | (uint32_t)r;
        sm.e[r] = sp_weight(sp_unkey(~(uint32_t)(c >> 32)), dmx);
    }
    __syncthreads();
    sp_sort(sm.byid, n_s);
    if (tid == 0) {
        /* rt_sample.c from here on: sum over the survivors in id order (exp_pairs) */
        double sum = 0.0;
        if (use_k) {
            for (int j = 0; j < n_s; ++j) sum += sm.e[(uint32_t)sm.byid[j]];
        } else {
            sum = sum_all;
        }
        int n_k = n_s; /* top_p_cut: walk in descending order while the mass before is < p */
        if (a.top_p < 1.0f) {
            const double p = (double)a.top_p;
            double before = 0.0;
            n_k = 0;
            while (n_k < n_s && (n_k == 0 || before < p)) before += sm.e[n_k++] / sum;
        }
        /* min-p, then the final sum and the draw, in id order */
        const bool minp = a.min_p > 0.0f;
        const double cut = (double)a.min_p;
        double fsum = 0.0;
        int n_f = 0, last = -1;
        for (int j = 0; j < n_s; ++j) {
            const uint32_t r = (uint32_t)sm.byid[j];
            if ((int)r >= n_k || (minp && sm.e[r] < cut)) continue;
            fsum += sm.e[r];
            ++n_f;
            last = (int)(sm.byid[j] >> 32);
        }
        int pick = last, seen_f = 0;
        double acc = 0.0;
        for (int j = 0; j < n_s && seen_f < n_f - 1; ++j) {
            const uint32_t r = (uint32_t)sm.byid[j];
            if ((int)r >= n_k || (minp && sm.e[r] < cut)) continue;
            ++seen_f;
            acc += sm.e[r] / fsum;
            if (a.u < acc) { pick = (int)(sm.byid[j] >> 32); break; }
        }
        *a.out_id = pick;
        sm.rest = (uint32_t)n_k;
    }
    if (a.keep) {
        for (int i = tid; i < V; i += SP_THREADS) a.keep[i] = 0;
        __syncthreads();
        const int n_k = (int)sm.rest;
        const bool minp = a.min_p > 0.0f;
        for (int j = tid; j < n_s; j += SP_THREADS) {
            const uint32_t r = (uint32_t)sm.byid[j];
            if ((int)r < n_k && !(minp && sm.e[r] < (double)a.min_p))
                a.keep[sm.byid[j] >> 32] = 1;
        }
    }
    return true;
}

/* One row's choice by one block of SP_THREADS (sample_kernel, sample_rows_kernel). */
static __device__ __forceinline__ void sample_row(const sp_args &a)
{
    __shared__ sp_smem sm;
    const int V = a.V, tid = threadIdx.x;

    if (a.temperature <= 0.0f) { /* step 2: greedy on the penalised logits */
        float bv = -INFINITY;
        int bi = -1;
        sp_each(a, false, [&](int i, bool valid, float v) {
            if (valid && v != -INFINITY && am_better(v, i, bv, bi)) { bv = v; bi = i; }
        });
        bi = am_block_best(bv, bi, sm.fred, sm.ired, SP_WARPS);
        if (tid == 0) {
            *a.out_id = bi;
            sm.pick = bi;
        }
        if (a.keep) {
            __syncthreads();
            for (int i = tid; i < V; i += SP_THREADS) a.keep[i] = i == sm.pick;
        }
        return;
    }

    /* finite count and maximum of the processed logits; for the fast top-k path also the
     * counts of the first key byte (sp_fast) */
    const bool hist1 = a.top_k > 0 && a.top_k < V && a.top_k <= SP_CAP;
    if (hist1) {
        for (int b = tid; b < 256; b += SP_THREADS) sm.cnt[b] = 0;
        __syncthreads();
    }
    float mx = -INFINITY;
    int nfin = 0;
    sp_each(a, true, [&](int, bool valid, float x) {
        const bool fin = valid && x != -INFINITY;
        if (fin) { mx = fmaxf(mx, x); ++nfin; }
        if (hist1) sp_count_add(fin, sp_key(x) >> 24, sm.cnt);
    });
    mx = sp_max(mx, sm);
    nfin = sp_sum_int(nfin, sm);
    if (nfin == 0) {
        if (tid == 0) *a.out_id = -1;
        if (a.keep)
            for (int i = tid; i < V; i += SP_THREADS) a.keep[i] = 0;
        return;
    }
    sp_state st;
    st.thr = -INFINITY;
    st.mx = (double)mx;
    st.top_p = false;
    st.kstar = 0;
    st.id_cut = INT_MAX;
    st.min_p = (double)a.min_p;

    if (sp_fast(a, mx, nfin, sm)) return;

    /* the general path: step 4, top-k */
    if (a.top_k > 0 && a.top_k < V && nfin >= a.top_k) {
        auto fin = [](int, float x, uint32_t *key) {
            *key = sp_key(x);
            return x != -INFINITY;
        };
        st.thr = sp_unkey(sp_select(a, fin, (uint32_t)a.top_k, sm));
    }

    /* step 5: top-p over the top-k survivors. Masses are the unnormalised e = exp(x - mx); the
     * first level's histogram sums to sum1, and "probability before < p" becomes "e-mass
     * before < p * sum1". */
    if (a.top_p < 1.0f) {
        double p = (double)a.top_p, above = 0.0;
        uint32_t prefix = 0, mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += SP_THREADS) { sm.cnt[b] = 0; sm.mass[b] = 0.0; }
            __syncthreads();
            sp_each(a, true, [&](int, bool valid, float x) {
                const uint32_t key = sp_key(x);
                const bool v = valid && x != -INFINITY && x >= st.thr && (key & mask) == prefix;
                const double e = v ? sp_weight(x, st.mx) : 0.0;
                sp_hist_add<true>(v, (key >> shift) & 255u, e, sm);
            });
            __syncthreads();
            if (shift == 24) { /* every survivor is in this level: its masses sum to sum1 */
                double t = 0.0;
                for (int b = tid; b < 256; b += SP_THREADS) t += sm.mass[b];
                p *= sp_sum(t, sm);
            }
            if (tid < K_WARP) {
                /* first bucket from the top where the mass above it plus its own reaches p:
                 * K* lies in it; none (rounding): the lowest non-empty bucket */
                const int lane = tid, top = 255 - 8 * lane;
                double own = 0.0;
                int lowest = -1;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    own += sm.mass[top - j];
                    if (sm.cnt[top - j]) lowest = top - j;
                }
                double incl = own;
#pragma unroll
                for (int o = 1; o < K_WARP; o *= 2) {
                    const double t = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o) incl += t;
                }
                const unsigned hit = __ballot_sync(0xffffffffu, above + incl >= p);
                const unsigned nonempty = __ballot_sync(0xffffffffu, lowest >= 0);
                /* the lane that holds K*: the first crossing, else the last non-empty lane */
                const int owner = hit ? __ffs(hit) - 1 : 31 - __clz(nonempty);
                if (lane == owner) {
                    double acc = above + (incl - own);
                    int b = -1;
                    double b_above = acc;
                    for (int j = 0; j < 8; ++j) {
                        const int bb = top - j;
                        if (!sm.cnt[bb]) continue;
                        b = bb;
                        b_above = acc;
                        if (acc + sm.mass[bb] >= p) break;
                        acc += sm.mass[bb];
                    }
                    sm.bucket = b;
                    sm.above = b_above;
                }
            }
            __syncthreads();
            prefix |= (uint32_t)sm.bucket << shift;
            mask |= 0xffu << shift;
            above = sm.above;
            __syncthreads();
        }
        st.top_p = true;
        st.kstar = prefix;
        /* ids tied at K*: kept in id order while the mass before them is < p */
        const uint32_t n_tie = sm.cnt[prefix & 255u];
        __syncthreads();
        if (tid == 0) {
            const double w = sp_weight(sp_unkey(prefix), st.mx);
            double before = above;
            uint32_t kept = 0;
            while (kept < n_tie && (kept == 0 || before < p)) {
                before += w;
                ++kept;
            }
            sm.rest = kept;
        }
        __syncthreads();
        const uint32_t kept = sm.rest;
        __syncthreads();
        if (kept < n_tie) {
            const float thr = st.thr;
            const uint32_t kstar = st.kstar;
            auto tie = [thr, kstar](int i, float x, uint32_t *key) {
                *key = ~(uint32_t)i; /* largest ~id = smallest id */
                return x != -INFINITY && x >= thr && sp_key(x) == kstar;
            };
            st.id_cut = (int)~sp_select(a, tie, kept, sm);
        }
    }

    /* step 6 and the draw (step 7) over the final survivors, each thread a contiguous run */
    const bool minp = a.min_p > 0.0f;
    const int run = (V + SP_THREADS - 1) / SP_THREADS;
    const int i0 = tid * run < V ? tid * run : V, i1 = i0 + run < V ? i0 + run : V;
    double own = 0.0;
    int last = -1;
#pragma unroll 8
    for (int i = i0; i < i1; ++i) {
        double e;
        if (sp_survives(st, i, sp_x(a, i, true), minp, &e)) { own += e; last = i; }
    }
    const double total = sp_sum(own, sm);
    /* exclusive scan of the runs' sums (in id order) */
    double incl = own;
    const int lane = tid % K_WARP, warp = tid / K_WARP;
#pragma unroll
    for (int o = 1; o < K_WARP; o *= 2) {
        const double t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == K_WARP - 1) sm.dred[warp] = incl;
    if (tid == 0) sm.pick = INT_MAX;
    __syncthreads();
    double base = 0.0;
    for (int w = 0; w < warp; ++w) base += sm.dred[w];
    const double target = a.u * total; /* u < acc/total  <=>  u * total < acc */
    double acc = base + incl - own;
    if (own > 0.0 && acc + own > target) {
        for (int i = i0; i < i1; ++i) {
            double e;
            if (!sp_survives(st, i, sp_x(a, i, true), minp, &e)) continue;
            acc += e;
            if (target < acc) { atomicMin(&sm.pick, i); break; }
        }
    }
    int lastall = last;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) lastall = max(lastall, __shfl_xor_sync(0xffffffffu, lastall, o));
    if (lane == 0) sm.ired[warp] = lastall;
    __syncthreads();
    if (tid == 0) {
        int l = -1;
        for (int w = 0; w < SP_WARPS; ++w) l = max(l, sm.ired[w]);
        *a.out_id = sm.pick != INT_MAX ? sm.pick : l; /* none crossed (rounding): the last */
    }
    if (a.keep)
        sp_each(a, true, [&](int i, bool valid, float x) {
            double e;
            if (valid) a.keep[i] = sp_survives(st, i, x, minp, &e);
        });
}

static __global__ void __launch_bounds__(SP_THREADS) sample_kernel(const sp_args a)
{
    sample_row(a);
}

/* block b: row b of the batch, its arguments from device memory */
static __global__ void __launch_bounds__(SP_THREADS) sample_rows_kernel(const sp_args *__restrict__ all)
{
    const sp_args a = all[blockIdx.x];
    sample_row(a);
}

/* The checks of one row's parameters (k_sample, k_sample_rows). */
static int sample_params_ok(const struct k_sample_params *p, const uint8_t *seen, double u,
                            const char *fn, int row)
{
    if (!(p->temperature >= 0.0f) || isinf(p->temperature) || p->top_k < 0 ||
        !(p->top_p > 0.0f && p->top_p <= 1.0f) || !(p->min_p >= 0.0f && p->min_p <= 1.0f) ||
        !(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        K_REFUSE(K_ERR_ARG, "%s row %d: parameter out of range (temperature %g, top_k %d, "
                 "top_p %g, min_p %g, repeat_penalty %g)", fn, row, (double)p->temperature,
                 (int)p->top_k, (double)p->top_p, (double)p->min_p, (double)p->repeat_penalty);
    if (p->repeat_penalty != 1.0f && !seen)
        K_REFUSE(K_ERR_ARG, "%s row %d: repeat_penalty %g needs the history bitmap", fn, row,
                 (double)p->repeat_penalty);
    if (!(u >= 0.0 && u < 1.0))
        K_REFUSE(K_ERR_ARG, "%s row %d: draw u = %g is not in [0, 1)", fn, row, u);
    return K_ERR_NONE;
}

static sp_args make_args(int32_t *out_id, uint8_t *keep, const float *logits, int V,
                         const uint8_t *seen, const struct k_sample_params *p, double u)
{
    sp_args a;
    a.logits = logits;
    a.seen = seen;
    a.out_id = out_id;
    a.keep = keep;
    a.V = V;
    a.top_k = p->top_k;
    a.temperature = p->temperature;
    a.top_p = p->top_p;
    a.min_p = p->min_p;
    a.rp = p->repeat_penalty;
    a.u = u;
    return a;
}

size_t k_sample_rows_args_bytes(int n)
{
    return n > 0 ? (size_t)n * sizeof(sp_args) : 0;
}

int k_sample_rows(int32_t *out_ids, const float *logits, size_t row_stride, int n,
                  int vocab_size, const struct k_sample_row *rows, void *h_args, void *d_args,
                  struct CUstream_st *stream)
{
    if (vocab_size < 1 || vocab_size > (1 << 30) || n < 1 || n > 65535 ||
        row_stride < (size_t)vocab_size)
        K_REFUSE(K_ERR_SHAPE, "sample_rows: n %d, vocab_size %d, row_stride %zu (need 1 <= n <= "
                 "65535, 1 <= vocab_size <= 2^30, row_stride >= vocab_size)", n, vocab_size,
                 row_stride);
    if (!out_ids || !logits || !rows || !h_args || !d_args)
        K_REFUSE(K_ERR_ARG, "sample_rows: NULL pointer");
    if ((uintptr_t)d_args % 16 || (uintptr_t)h_args % 16)
        K_REFUSE(K_ERR_ARG, "sample_rows: argument buffers must be 16-byte aligned");
    sp_args *h = static_cast<sp_args *>(h_args);
    for (int i = 0; i < n; ++i) {
        const double u = rows[i].p.temperature > 0.0f ? rows[i].u : 0.0; /* greedy: unused */
        const int e = sample_params_ok(&rows[i].p, rows[i].seen, u, "sample_rows", i);
        if (e) return e;
        h[i] = make_args(out_ids + i, nullptr, logits + (size_t)i * row_stride, vocab_size,
                         rows[i].seen, &rows[i].p, u);
    }
    K_CUDA_CHECK(cudaMemcpyAsync(d_args, h_args, (size_t)n * sizeof(sp_args),
                                 cudaMemcpyHostToDevice, stream));
    sample_rows_kernel<<<n, SP_THREADS, 0, stream>>>(static_cast<const sp_args *>(d_args));
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

int k_sample(int32_t *out_id, uint8_t *keep, const float *logits, int vocab_size,
             const uint8_t *seen, const struct k_sample_params *p, double u,
             struct CUstream_st *stream)
{
    if (vocab_size < 1 || vocab_size > (1 << 30)) /* ids, 4 * id and V + 1023 stay in int */
        K_REFUSE(K_ERR_SHAPE, "sample: vocab_size %d outside [1, 2^30]", vocab_size);
    if (!out_id || !logits || !p) K_REFUSE(K_ERR_ARG, "sample: NULL pointer");
    const int e = sample_params_ok(p, seen, u, "sample", 0);
    if (e) return e;
    sample_kernel<<<1, SP_THREADS, 0, stream>>>(make_args(out_id, keep, logits, vocab_size, seen, p, u));
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/*
 * k_allreduce.cu - sum of small buffers across the GPUs of one process over peer-to-peer
 * (NVLink) memory access, as one kernel per rank: what tensor-parallel decode needs between
 * layers (one row of hidden_size values, a few KB). Unlike an NCCL call it can be recorded into
 * a CUDA graph from the one host thread that drives every rank, so the decode step of every
 * rank is one graph launch (runtime/rt_cuda.cu).
 *
 * One-shot push (the scheme of the "custom all-reduce" of vLLM and TensorRT-LLM for small
 * messages): rank r copies its buffer into slot (e & 1) of every peer's receive area, sets its
 * flag in every peer to the call's epoch e (st.release.sys), waits until every peer's flag in
 * its own memory reaches e (ld.acquire.sys), then adds the world's buffers in rank order 0, 1,
 * ... (its own from its buffer, the others from its receive area) in fp32 and writes the sum
 * back in place, rounded once to the buffer's type. Every rank adds the same values in the same
 * order, so every rank gets the same bits (reference: ref_allreduce_sum, kernels/ref.h).
 *
 * Why two slots are enough: a peer writes slot (e + 1) & 1 in call e + 1 while this rank may
 * still read slot e & 1; it can reach call e + 2 (slot e & 1 again) only after this rank's flag
 * for e + 1, which this rank sets after its call e has finished (stream order). Epochs live in
 * device memory (the last word of each rank's flag array), so a recorded graph replays with
 * fresh epochs. A peer that never arrives (its launch failed, or launches are serialised:
 * CUDA_LAUNCH_BLOCKING=1, compute-sanitizer) ends the wait after ~10 s with a trap, a sticky
 * CUDA error that ends the process, instead of a hang; runtime/rt_cuda.cu switches this kernel
 * off with QSHARD_P2P_ALLREDUCE=0 for such runs.
 *
 * PTX ISA "Memory Consistency Model" (release/acquire at .sys scope, cumulativity through
 * bar.sync); CUDA guide "Peer-to-Peer Memory Access".
 */
#include "k_common.cuh"

#include <stdlib.h>

namespace ar {
constexpr int THREADS = 512;
constexpr unsigned long long SPIN_NS = 10ull * 1000 * 1000 * 1000; /* give up on a peer after */
} // namespace ar

/* What the kernel of every rank gets by value: every rank's receive area and flags (peer
 * pointers; entries past the world size are NULL). */
struct ar_peers {
    unsigned char *recv[K_ALLREDUCE_MAX_WORLD]; /* on GPU r: [2][world][K_ALLREDUCE_MAX_BYTES] */
    unsigned *flags[K_ALLREDUCE_MAX_WORLD];     /* on GPU r: [world] peers' epochs, [world] own */
};

struct k_allreduce {
    int world;
    int device[K_ALLREDUCE_MAX_WORLD];
    ar_peers p;
};

static __device__ __forceinline__ unsigned long long globaltimer_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
static __device__ __forceinline__ void ar_store_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ unsigned ar_load_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* 16 bytes as fp32 values: 4 (fp32) or 8 (fp16). */
template <bool F16> struct ar_vec;
template <> struct ar_vec<false> {
    static constexpr int N = 4;
    static __device__ __forceinline__ void add(float (&a)[8], uint4 v)
    {
        a[0] += __uint_as_float(v.x); a[1] += __uint_as_float(v.y);
        a[2] += __uint_as_float(v.z); a[3] += __uint_as_float(v.w);
    }
    static __device__ __forceinline__ uint4 pack(const float (&a)[8])
    {
        return make_uint4(__float_as_uint(a[0]), __float_as_uint(a[1]), __float_as_uint(a[2]),
                          __float_as_uint(a[3]));
    }
};
template <> struct ar_vec<true> {
    static constexpr int N = 8;
    static __device__ __forceinline__ void add(float (&a)[8], uint4 v)
    {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(k_u32_as_half2(w[i]));
            a[2 * i] += f.x;
            a[2 * i + 1] += f.y;
        }
    }
    static __device__ __forceinline__ uint4 pack(const float (&a)[8])
    {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = k_half2_as_u32(__floats2half2_rn(a[2 * i], a[2 * i + 1]));
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

/* One block per rank. buf: [n16] 16-byte chunks in this rank's memory, summed in place. */
template <bool F16>
static __global__ void __launch_bounds__(ar::THREADS)
allreduce_kernel(uint4 *__restrict__ buf, int n16, int rank, int world, ar_peers p)
{
    __shared__ unsigned s_epoch;
    unsigned *own = p.flags[rank];
    if (threadIdx.x == 0) s_epoch = own[world] + 1;
    __syncthreads();
    const unsigned e = s_epoch;
    const size_t slot = e & 1;
    /* 1. push this rank's buffer into slot e & 1, row `rank`, of every peer */
    for (int j = 0; j < world; ++j) {
        if (j == rank) continue;
        uint4 *dst = reinterpret_cast<uint4 *>(p.recv[j] + (slot * world + rank) * K_ALLREDUCE_MAX_BYTES);
        for (int i = threadIdx.x; i < n16; i += ar::THREADS) __stcg(dst + i, __ldcg(buf + i));
    }
    __syncthreads(); /* every thread's pushes happen before the flags below (cumulativity) */
    /* 2. thread j < world: tell peer j that epoch e has arrived, then wait for peer j's */
    const int j = threadIdx.x;
    if (j < world && j != rank) {
        __threadfence_system();
        ar_store_release(p.flags[j] + rank, e);
        const unsigned long long t0 = globaltimer_ns();
        while ((int)(ar_load_acquire(own + j) - e) < 0)
            if (globaltimer_ns() - t0 > ar::SPIN_NS) __trap(); /* peer j never came */
    }
    __syncthreads();
    /* 3. the sum in rank order, fp32, rounded once */
    const uint4 *mine = reinterpret_cast<const uint4 *>(p.recv[rank] + slot * world * K_ALLREDUCE_MAX_BYTES);
    for (int i = threadIdx.x; i < n16; i += ar::THREADS) {
        float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int q = 0; q < world; ++q) {
            const uint4 v = q == rank ? buf[i] : __ldcg(mine + (size_t)q * (K_ALLREDUCE_MAX_BYTES / 16) + i);
            ar_vec<F16>::add(a, v);
        }
        buf[i] = ar_vec<F16>::pack(a);
    }
    if (threadIdx.x == 0) own[world] = e; /* only this rank reads its epoch */
}

int k_allreduce_supported(int world, const int *devices)
{
    if (!devices || world < 2 || world > K_ALLREDUCE_MAX_WORLD) return 0;
    for (int a = 0; a < world; ++a)
        for (int b = 0; b < world; ++b) {
            int ok = 0;
            if (a != b && (cudaDeviceCanAccessPeer(&ok, devices[a], devices[b]) != cudaSuccess || !ok)) {
                (void)cudaGetLastError();
                return 0;
            }
        }
    return 1;
}

int k_allreduce_create(int world, const int *devices, struct k_allreduce **out)
{
    if (!out || !devices) K_REFUSE(K_ERR_ARG, "NULL argument (devices %p, out %p)", (const void *)devices, (void *)out);
    *out = nullptr;
    if (world < 2 || world > K_ALLREDUCE_MAX_WORLD)
        K_REFUSE(K_ERR_SHAPE, "world size %d outside [2, %d]", world, K_ALLREDUCE_MAX_WORLD);
    if (!k_allreduce_supported(world, devices))
        K_REFUSE(K_ERR_UNSUPPORTED, "GPUs %d..: a pair without peer-to-peer access", devices[0]);
    int prev = 0;
    K_CUDA_CHECK(cudaGetDevice(&prev));
    struct k_allreduce *ar = static_cast<struct k_allreduce *>(calloc(1, sizeof *ar));
    if (!ar) K_REFUSE(K_ERR_ARG, "out of host memory");
    ar->world = world;
    for (int r = 0; r < world; ++r) {
        ar->device[r] = devices[r];
        K_CUDA_CHECK(cudaSetDevice(devices[r]));
        for (int b = 0; b < world; ++b) {
            if (b == r) continue;
            const cudaError_t e = cudaDeviceEnablePeerAccess(devices[b], 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
            else K_CUDA_CHECK(e);
        }
        K_CUDA_CHECK(cudaMalloc(&ar->p.recv[r], 2 * (size_t)world * K_ALLREDUCE_MAX_BYTES));
        K_CUDA_CHECK(cudaMalloc(&ar->p.flags[r], 2 * (size_t)world * sizeof(unsigned)));
        K_CUDA_CHECK(cudaMemset(ar->p.flags[r], 0, 2 * (size_t)world * sizeof(unsigned)));
        K_CUDA_CHECK(cudaDeviceSynchronize());
    }
    K_CUDA_CHECK(cudaSetDevice(prev));
    *out = ar;
    return K_ERR_NONE;
}

void k_allreduce_destroy(struct k_allreduce *ar)
{
    if (!ar) return;
    int prev = 0;
    cudaGetDevice(&prev);
    for (int r = 0; r < ar->world; ++r) {
        cudaSetDevice(ar->device[r]);
        cudaFree(ar->p.recv[r]);
        cudaFree(ar->p.flags[r]);
    }
    cudaSetDevice(prev);
    free(ar);
}

int k_allreduce_fits(const struct k_allreduce *ar, const void *buf, size_t n, int f16)
{
    const size_t bytes = n * (f16 ? 2 : 4);
    return ar && buf && n > 0 && bytes <= K_ALLREDUCE_MAX_BYTES && bytes % 16 == 0 &&
           (reinterpret_cast<uintptr_t>(buf) & 15) == 0;
}

int k_allreduce_sum(struct k_allreduce *ar, int rank, void *buf, size_t n, int f16,
                    struct CUstream_st *stream)
{
    if (!ar || rank < 0 || rank >= ar->world)
        K_REFUSE(K_ERR_ARG, "no all-reduce context or rank %d outside [0, %d)", rank, ar ? ar->world : 0);
    if (!k_allreduce_fits(ar, buf, n, f16))
        K_REFUSE(K_ERR_SHAPE, "all-reduce of %zu %s values at %p: needs 16-byte alignment and a "
                 "multiple of 16 bytes, at most %d", n, f16 ? "fp16" : "fp32", buf, K_ALLREDUCE_MAX_BYTES);
    const int n16 = (int)(n * (f16 ? 2 : 4) / 16);
    if (f16)
        allreduce_kernel<true><<<1, ar::THREADS, 0, stream>>>(static_cast<uint4 *>(buf), n16, rank, ar->world, ar->p);
    else
        allreduce_kernel<false><<<1, ar::THREADS, 0, stream>>>(static_cast<uint4 *>(buf), n16, rank, ar->world, ar->p);
    /* the launch error only: a DEBUG_SYNC device synchronisation here would wait for this
     * rank's kernel, which waits for the ranks not launched yet (K_LAUNCH_CHECK) */
    K_CUDA_CHECK(cudaGetLastError());
    return K_ERR_NONE;
}

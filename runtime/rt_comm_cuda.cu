/*
 * rt_comm_cuda.cu - the device collectives of the GPU ranks of one process (rt_comm_cuda.h):
 *   - all-reduce: up to K_ALLREDUCE_MAX_BYTES (256 KB) per rank, when every pair of GPUs has
 *     peer access, our peer-to-peer kernel (kernels/k_allreduce.cu: fp32 sums in rank order,
 *     rounded once, the same bits on every rank; it can be recorded into a CUDA graph); else
 *     ncclAllReduce (sum) on the rank's stream, from the rank's own thread. NCCL is never
 *     recorded into a graph (can_capture says so; capture of NCCL calls failed on 2 H200s in an
 *     earlier version driven from one thread, as pie-project/pie issue 499 reports).
 *   - NVLink SHARP / multicast (NVLS) is off unless NCCL_NVLS_ENABLE is set: our all-reduces are
 *     a few KB to MB of activations, latency-bound, and multicast on shared machines is a hazard.
 *   - gather: cudaMemcpyPeerAsync into rank 0's memory (rt_comm.c orders it with barriers).
 *   - one process per rank (rt_nccl_rank_*, used by rt_comm_mpi.c): a communicator of one GPU
 *     made with ncclCommInitRank from an id rank 0 sends over MPI; all-reduce by ncclAllReduce,
 *     gather by ncclSend/ncclRecv, waited for with a deadline.
 * Test: `make test-gpu` (tests/gpu_test_e2e.py --tp 2 on two GPUs).
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h> /* memcpy */
#include <time.h>   /* clock_gettime, nanosleep */

#include "kernels.h" /* k_allreduce_* */
#include "qs_log.h"
#include "rt_comm_cuda.h"

#define RT_COMM_CUDA_MAX 16

struct rt_comm_cuda {
    int world;
    int device[RT_COMM_CUDA_MAX];
    ncclComm_t comm[RT_COMM_CUDA_MAX];
    struct k_allreduce *ar; /* NULL: NCCL serves every all-reduce */
};

#define CUDA_TRY(expr)                                                                      \
    do {                                                                                    \
        const cudaError_t e_ = (expr);                                                      \
        if (e_ != cudaSuccess) {                                                            \
            qs_log_error(__func__, "CUDA error %s (%s) at %s:%d", cudaGetErrorString(e_),   \
                         #expr, __FILE__, __LINE__);                                        \
            return RT_ERR_DEVICE;                                                           \
        }                                                                                   \
    } while (0)

enum rt_err rt_comm_cuda_create(int world, int first_gpu, bool p2p, struct rt_comm_cuda **out)
{
    *out = NULL;
    if (world < 1 || world > RT_COMM_CUDA_MAX) {
        qs_log_error(__func__, "%d GPU ranks: at most %d in one process", world, RT_COMM_CUDA_MAX);
        return RT_ERR_ARG;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || first_gpu < 0 || first_gpu + world > n_dev) {
        (void)cudaGetLastError();
        qs_log_error(__func__, "%d rank(s) starting at GPU %d need GPUs %d..%d, but %d GPU(s) "
                     "are visible", world, first_gpu, first_gpu, first_gpu + world - 1, n_dev);
        return RT_ERR_NO_DEVICE;
    }
    struct rt_comm_cuda *d = static_cast<struct rt_comm_cuda *>(calloc(1, sizeof(*d)));
    if (!d) {
        qs_log_error(__func__, "out of host memory");
        return RT_ERR_NOMEM;
    }
    d->world = world;
    for (int r = 0; r < world; ++r) d->device[r] = first_gpu + r;
    if (world > 1) {
        setenv("NCCL_NVLS_ENABLE", "0", 0); /* see the header comment; a user's setting wins */
        const ncclResult_t nr = ncclCommInitAll(d->comm, world, d->device);
        if (nr != ncclSuccess) {
            qs_log_error(__func__, "NCCL: cannot create communicators for GPUs %d..%d: %s (%s)",
                         first_gpu, first_gpu + world - 1, ncclGetErrorString(nr),
                         ncclGetLastError(NULL));
            free(d);
            return RT_ERR_DEVICE;
        }
        if (p2p && k_allreduce_supported(world, d->device) &&
            k_allreduce_create(world, d->device, &d->ar) != K_ERR_NONE)
            d->ar = NULL; /* reported there; NCCL serves every all-reduce */
        qs_log_debug("all-reduce: %s", d->ar ? "peer-to-peer kernel up to 256 KB per rank, NCCL above"
                                              : "NCCL (no peer access, more than 8 ranks, or "
                                                "--debug-no-p2p)");
    }
    *out = d;
    return RT_ERR_NONE;
}

void rt_comm_cuda_destroy(struct rt_comm_cuda *d)
{
    if (!d) return;
    k_allreduce_destroy(d->ar);
    for (int r = 0; r < d->world; ++r)
        if (d->comm[r]) ncclCommDestroy(d->comm[r]);
    free(d);
}

void rt_comm_cuda_abort(struct rt_comm_cuda *d)
{
    if (!d) return;
    for (int r = 0; r < d->world; ++r)
        if (d->comm[r]) {
            ncclCommAbort(d->comm[r]);
            d->comm[r] = NULL;
        }
}

static bool ar_fits(const struct rt_comm_cuda *d, const void *buf, size_t n, enum rt_dtype t)
{
    return d->ar && k_allreduce_fits(d->ar, buf, n, t == RT_DTYPE_F16) != 0;
}

enum rt_err rt_comm_cuda_all_reduce(struct rt_comm_cuda *d, int rank, void *buf, size_t n,
                                    enum rt_dtype t, void *stream)
{
    if (d->world <= 1) return RT_ERR_NONE;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (ar_fits(d, buf, n, t)) {
        const int rc = k_allreduce_sum(d->ar, rank, buf, n, t == RT_DTYPE_F16, st);
        return rc == K_ERR_NONE ? RT_ERR_NONE : RT_ERR_ARG;
    }
    if (!d->comm[rank]) {
        qs_log_error(__func__, "rank %d: the NCCL communicator was aborted", rank);
        return RT_ERR_PEER;
    }
    const ncclResult_t nr = ncclAllReduce(buf, buf, n, t == RT_DTYPE_F32 ? ncclFloat32 : ncclFloat16,
                                          ncclSum, d->comm[rank], st);
    if (nr != ncclSuccess) {
        qs_log_error(__func__, "rank %d: NCCL all-reduce of %zu %s values over %d GPUs: %s (%s)",
                     rank, n, t == RT_DTYPE_F32 ? "fp32" : "fp16", d->world,
                     ncclGetErrorString(nr), ncclGetLastError(NULL));
        return RT_ERR_DEVICE;
    }
    return RT_ERR_NONE;
}

bool rt_comm_cuda_can_capture(const struct rt_comm_cuda *d, const void *buf, size_t n,
                              enum rt_dtype t)
{
    return d->world <= 1 || ar_fits(d, buf, n, t);
}

enum rt_err rt_comm_cuda_sync(const struct rt_comm_cuda *d, int rank, void *stream)
{
    (void)d, (void)rank;
    CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return RT_ERR_NONE;
}

enum rt_err rt_comm_cuda_copy_from(const struct rt_comm_cuda *d, void *dst, const void *src,
                                   int src_rank, size_t bytes, void *stream)
{
    if (bytes == 0) return RT_ERR_NONE;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (src_rank == 0) {
        CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
        return RT_ERR_NONE;
    }
    CUDA_TRY(cudaMemcpyPeerAsync(dst, d->device[0], src, d->device[src_rank], bytes, st));
    return RT_ERR_NONE;
}

/* --- one GPU rank of a multi-process group (rt_comm_mpi.c) ------------------------------------ */

struct rt_nccl_rank {
    int world, rank, gpu;
    ncclComm_t comm; /* NULL once aborted */
};

static_assert(sizeof(ncclUniqueId) == RT_NCCL_ID_BYTES, "NCCL unique id size");

enum rt_err rt_nccl_rank_id(void *id)
{
    const ncclResult_t nr = ncclGetUniqueId(static_cast<ncclUniqueId *>(id));
    if (nr != ncclSuccess) {
        qs_log_error(__func__, "NCCL: cannot make a unique id: %s (%s)", ncclGetErrorString(nr),
                     ncclGetLastError(NULL));
        return RT_ERR_DEVICE;
    }
    return RT_ERR_NONE;
}

enum rt_err rt_nccl_rank_create(int world, int rank, const void *id, int gpu,
                                struct rt_nccl_rank **out)
{
    *out = NULL;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || gpu < 0 || gpu >= n_dev) {
        (void)cudaGetLastError();
        qs_log_error(__func__, "rank %d needs GPU %d, but %d GPU(s) are visible on this node",
                     rank, gpu, n_dev);
        return RT_ERR_NO_DEVICE;
    }
    CUDA_TRY(cudaSetDevice(gpu));
    struct rt_nccl_rank *d = static_cast<struct rt_nccl_rank *>(calloc(1, sizeof(*d)));
    if (!d) {
        qs_log_error(__func__, "out of host memory");
        return RT_ERR_NOMEM;
    }
    *d = rt_nccl_rank{world, rank, gpu, NULL};
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* see the header comment; a user's setting wins */
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof(uid));
    const ncclResult_t nr = ncclCommInitRank(&d->comm, world, uid, rank);
    if (nr != ncclSuccess) {
        qs_log_error(__func__, "NCCL: rank %d of %d (GPU %d) cannot join the communicator: %s "
                     "(%s)", rank, world, gpu, ncclGetErrorString(nr), ncclGetLastError(NULL));
        free(d);
        return RT_ERR_DEVICE;
    }
    qs_log_debug("rank %d of %d: NCCL communicator on GPU %d", rank, world, gpu);
    *out = d;
    return RT_ERR_NONE;
}

enum rt_err rt_nccl_rank_all_reduce(struct rt_nccl_rank *d, void *buf, size_t n,
                                    enum rt_dtype t, void *stream)
{
    if (!d->comm) {
        qs_log_error(__func__, "rank %d: the NCCL communicator was aborted", d->rank);
        return RT_ERR_PEER;
    }
    const ncclResult_t nr = ncclAllReduce(buf, buf, n, t == RT_DTYPE_F32 ? ncclFloat32 : ncclFloat16,
                                          ncclSum, d->comm, static_cast<cudaStream_t>(stream));
    if (nr != ncclSuccess) {
        qs_log_error(__func__, "rank %d: NCCL all-reduce of %zu values over %d ranks: %s (%s)",
                     d->rank, n, d->world, ncclGetErrorString(nr), ncclGetLastError(NULL));
        return RT_ERR_DEVICE;
    }
    return RT_ERR_NONE;
}

/* Wait for `st` at most timeout_s, watching the communicator for asynchronous errors. */
static enum rt_err wait_stream(struct rt_nccl_rank *d, cudaStream_t st, double timeout_s)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        const cudaError_t ce = cudaStreamQuery(st);
        if (ce == cudaSuccess)
            return RT_ERR_NONE;
        if (ce != cudaErrorNotReady) {
            qs_log_error(__func__, "rank %d: CUDA error %s while waiting for a collective",
                         d->rank, cudaGetErrorString(ce));
            return RT_ERR_DEVICE;
        }
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(d->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
            qs_log_error(__func__, "rank %d: NCCL: %s (%s)", d->rank, ncclGetErrorString(async),
                         ncclGetLastError(d->comm));
            return RT_ERR_DEVICE;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > timeout_s) {
            qs_log_error(__func__, "rank %d: a collective did not finish within %.0f s (a rank "
                         "hung or never joined)", d->rank, timeout_s);
            return RT_ERR_DEVICE;
        }
        const struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

enum rt_err rt_nccl_rank_gather(struct rt_nccl_rank *d, const void *send, size_t bytes,
                                void *recv, void *stream, double timeout_s)
{
    if (!d->comm) {
        qs_log_error(__func__, "rank %d: the NCCL communicator was aborted", d->rank);
        return RT_ERR_PEER;
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    ncclResult_t nr = ncclGroupStart();
    if (d->rank == 0) {
        if (bytes)
            CUDA_TRY(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, st));
        for (int r = 1; r < d->world && nr == ncclSuccess; ++r)
            nr = ncclRecv(static_cast<char *>(recv) + (size_t)r * bytes, bytes, ncclChar, r,
                          d->comm, st);
    } else if (nr == ncclSuccess) {
        nr = ncclSend(send, bytes, ncclChar, 0, d->comm, st);
    }
    const ncclResult_t ne = ncclGroupEnd();
    if (nr == ncclSuccess)
        nr = ne;
    if (nr != ncclSuccess) {
        qs_log_error(__func__, "rank %d: NCCL gather of %zu bytes per rank: %s (%s)", d->rank,
                     bytes, ncclGetErrorString(nr), ncclGetLastError(NULL));
        return RT_ERR_DEVICE;
    }
    return wait_stream(d, st, timeout_s);
}

void rt_nccl_rank_abort(struct rt_nccl_rank *d)
{
    if (d && d->comm) {
        ncclCommAbort(d->comm);
        d->comm = NULL;
    }
}

void rt_nccl_rank_destroy(struct rt_nccl_rank *d)
{
    if (!d) return;
    if (d->comm) ncclCommDestroy(d->comm);
    free(d);
}

/*
 * rt_comm_cuda.h - the device half of the communicator of one process's GPU ranks (private to
 * runtime/rt_comm.c, which adds the host barrier and abort): NCCL communicators of every GPU
 * (ncclCommInitAll), our peer-to-peer all-reduce kernel (kernels.h k_allreduce_*), peer copies.
 * Every call but create/destroy/abort is made by rank `rank`'s thread, with its GPU current.
 * Without nvcc, rt_comm_cuda_nocuda.c makes create fail with RT_ERR_NO_DEVICE.
 */
#ifndef QS_RT_COMM_CUDA_H
#define QS_RT_COMM_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "rt_backend.h" /* enum rt_err, enum rt_dtype */

#ifdef __cplusplus
extern "C" {
#endif

struct rt_comm_cuda;

/* NCCL communicators for GPUs first_gpu .. first_gpu + world - 1 (NCCL_NVLS_ENABLE=0 unless the
 * user set it) and, with p2p and peer access between every pair, the peer-to-peer all-reduce.
 * world 1: nothing to set up. Errors: RT_ERR_NO_DEVICE, RT_ERR_DEVICE, RT_ERR_NOMEM. */
enum rt_err rt_comm_cuda_create(int world, int first_gpu, bool p2p, struct rt_comm_cuda **out);
void rt_comm_cuda_destroy(struct rt_comm_cuda *d); /* NULL is fine */
/* Abort the NCCL communicators (a rank failed: collectives in flight return an error). */
void rt_comm_cuda_abort(struct rt_comm_cuda *d);

/* Rank `rank`'s part of the in-place sum of buf[n] on `stream`: our kernel up to 256 KB when
 * it was set up and the buffer fits, else ncclAllReduce. */
enum rt_err rt_comm_cuda_all_reduce(struct rt_comm_cuda *d, int rank, void *buf, size_t n,
                                    enum rt_dtype t, void *stream);
/* Whether that all-reduce may be recorded into a CUDA graph (our kernel only). */
bool rt_comm_cuda_can_capture(const struct rt_comm_cuda *d, const void *buf, size_t n,
                              enum rt_dtype t);
/* Wait for the work queued on `stream`. */
enum rt_err rt_comm_cuda_sync(const struct rt_comm_cuda *d, int rank, void *stream);
/* dst (rank 0's GPU) = src (src_rank's GPU)[bytes], queued on rank 0's stream. */
enum rt_err rt_comm_cuda_copy_from(const struct rt_comm_cuda *d, void *dst, const void *src,
                                   int src_rank, size_t bytes, void *stream);

/* --- one GPU rank of a multi-process group (runtime/rt_comm_mpi.c, one process per rank) --- */

#define RT_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

struct rt_nccl_rank;

/* A new NCCL unique id into id[RT_NCCL_ID_BYTES] (rank 0; the caller sends it to the others).
 * Errors: RT_ERR_DEVICE, RT_ERR_NO_DEVICE (built without CUDA). */
enum rt_err rt_nccl_rank_id(void *id);
/* Rank `rank` of `world` on GPU `gpu` (made current) joins the communicator of `id`
 * (ncclCommInitRank; NCCL_NVLS_ENABLE=0 unless the user set it). Every rank calls it at once.
 * Errors: RT_ERR_NO_DEVICE (no such GPU, no CUDA), RT_ERR_DEVICE (NCCL), RT_ERR_NOMEM. */
enum rt_err rt_nccl_rank_create(int world, int rank, const void *id, int gpu,
                                struct rt_nccl_rank **out);
/* ncclAllReduce (sum, in place) of buf[n] on `stream` (NCCL's order of the sums). */
enum rt_err rt_nccl_rank_all_reduce(struct rt_nccl_rank *d, void *buf, size_t n,
                                    enum rt_dtype t, void *stream);
/* send[bytes] of every rank into rank 0's recv [world][bytes] (ncclSend / ncclRecv on `stream`),
 * then wait for the stream at most timeout_s seconds (RT_ERR_DEVICE when it passes: a peer
 * never joined). */
enum rt_err rt_nccl_rank_gather(struct rt_nccl_rank *d, const void *send, size_t bytes,
                                void *recv, void *stream, double timeout_s);
void rt_nccl_rank_abort(struct rt_nccl_rank *d);   /* ncclCommAbort; NULL is fine */
void rt_nccl_rank_destroy(struct rt_nccl_rank *d); /* NULL is fine */

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_COMM_CUDA_H */

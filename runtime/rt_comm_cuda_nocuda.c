/*
 * rt_comm_cuda_nocuda.c - stands in for rt_comm_cuda.cu in builds without nvcc: no device
 * collectives (rt_comm_cuda.h). Only rt_comm_cuda_create is reachable; it says why.
 */
#include "qs_log.h"
#include "rt_comm_cuda.h"

enum rt_err rt_comm_cuda_create(int world, int first_gpu, bool p2p, struct rt_comm_cuda **out)
{
    (void)world, (void)first_gpu, (void)p2p;
    *out = NULL;
    qs_log_error(__func__, "this qshard was built without CUDA (no nvcc): GPU ranks cannot "
                 "communicate; run with --device cpu");
    return RT_ERR_NO_DEVICE;
}

void rt_comm_cuda_destroy(struct rt_comm_cuda *d) { (void)d; }
void rt_comm_cuda_abort(struct rt_comm_cuda *d) { (void)d; }

enum rt_err rt_comm_cuda_all_reduce(struct rt_comm_cuda *d, int rank, void *buf, size_t n,
                                    enum rt_dtype t, void *stream)
{
    (void)d, (void)rank, (void)buf, (void)n, (void)t, (void)stream;
    return RT_ERR_NO_DEVICE;
}

bool rt_comm_cuda_can_capture(const struct rt_comm_cuda *d, const void *buf, size_t n,
                              enum rt_dtype t)
{
    (void)d, (void)buf, (void)n, (void)t;
    return false;
}

enum rt_err rt_comm_cuda_sync(const struct rt_comm_cuda *d, int rank, void *stream)
{
    (void)d, (void)rank, (void)stream;
    return RT_ERR_NO_DEVICE;
}

enum rt_err rt_comm_cuda_copy_from(const struct rt_comm_cuda *d, void *dst, const void *src,
                                   int src_rank, size_t bytes, void *stream)
{
    (void)d, (void)dst, (void)src, (void)src_rank, (void)bytes, (void)stream;
    return RT_ERR_NO_DEVICE;
}

enum rt_err rt_nccl_rank_id(void *id)
{
    (void)id;
    qs_log_error(__func__, "this qshard was built without CUDA (no nvcc): no NCCL; run with "
                 "--device cpu");
    return RT_ERR_NO_DEVICE;
}

enum rt_err rt_nccl_rank_create(int world, int rank, const void *id, int gpu,
                                struct rt_nccl_rank **out)
{
    (void)world, (void)rank, (void)id, (void)gpu;
    *out = NULL;
    return rt_nccl_rank_id(NULL);
}

enum rt_err rt_nccl_rank_all_reduce(struct rt_nccl_rank *d, void *buf, size_t n,
                                    enum rt_dtype t, void *stream)
{
    (void)d, (void)buf, (void)n, (void)t, (void)stream;
    return RT_ERR_NO_DEVICE;
}

enum rt_err rt_nccl_rank_gather(struct rt_nccl_rank *d, const void *send, size_t bytes,
                                void *recv, void *stream, double timeout_s)
{
    (void)d, (void)send, (void)bytes, (void)recv, (void)stream, (void)timeout_s;
    return RT_ERR_NO_DEVICE;
}

void rt_nccl_rank_abort(struct rt_nccl_rank *d) { (void)d; }
void rt_nccl_rank_destroy(struct rt_nccl_rank *d) { (void)d; }

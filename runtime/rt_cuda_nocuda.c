/*
 * rt_cuda_nocuda.c - stands in for runtime/rt_cuda.cu in builds without nvcc (or before the
 * CUDA backend exists): the CUDA backend cannot be created, with a message that says why.
 * `--device auto` then falls back to the CPU (rt_cuda_available() is false).
 */
#include "qs_log.h" /* qs_log_error */
#include "rt_backend.h"

bool rt_cuda_available(void)
{
    return false;
}

enum rt_err rt_cuda_backend_create(const struct rt_opts *opts, struct rt_comm *comm,
                                   struct rt_backend *out)
{
    (void)opts, (void)comm;
    out->ops = NULL;
    out->ctx = NULL;
    qs_log_error(__func__, "this qshard was built without the CUDA backend (no nvcc found, or NO_CUDA=1), so no "
                 "GPU can be used; run with --device cpu, or rebuild on a machine with the "
                 "CUDA toolkit");
    return RT_ERR_NO_DEVICE;
}

enum rt_err rt_cuda_h2d_rate(int device, size_t bytes, size_t chunk, int repeat, double *gbps)
{
    (void)device, (void)bytes, (void)chunk, (void)repeat;
    *gbps = 0;
    qs_log_error(__func__, "this qshard was built without the CUDA backend: no GPU to measure");
    return RT_ERR_NO_DEVICE;
}

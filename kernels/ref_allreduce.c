/*
 * ref_allreduce.c - the sum every rank of a tensor-parallel all-reduce must end with; reference
 * of k_allreduce_sum (kernels/k_allreduce.cu). Test: build/gpu_test_ops (area allreduce).
 */
#include "ref.h"

void ref_allreduce_sum(float *out, const float *const *bufs, int world, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float acc = 0.0f;
        for (int q = 0; q < world; q++)
            acc += bufs[q][i];
        out[i] = acc;
    }
}

/*
 * ref_perm.c - the act-order input gather (docs/DESIGN.md section 4.5): a GPTQ / compressed-
 * tensors act-order linear stores its input rows in group order, so its input is
 * x'[m][j] = x[m][perm[j]]. Reference of k_gather_cols (kernels/k_perm.cu); the CPU backend's op.
 * Test: ./build/test_ref (against a loop over a random permutation), tests/gpu_test_ops.cu.
 */
#include "ref.h"

void ref_gather_cols(float *dst, const float *src, const int32_t *perm, int M, int K)
{
    for (int m = 0; m < M; m++) {
        const float *s = src + (size_t)m * (size_t)K;
        float *d = dst + (size_t)m * (size_t)K;
        for (int j = 0; j < K; j++)
            d[j] = s[perm[j]];
    }
}

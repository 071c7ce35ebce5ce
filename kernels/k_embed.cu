/*
 * k_embed.cu - vocab-parallel embedding lookup into the fp32 residual stream:
 *   out[m][:] = table[tokens[m] - row_begin][:] if the token's row lives on this rank, else 0
 * (the TP all-reduce sums the ranks' rows), times scale (Gemma: sqrt(hidden)). Reference ref_embed. One block per token row.
 * Test: build/gpu_test_ops (area embed).
 */
#include "k_common.cuh"

static __global__ void embed_kernel(float *__restrict__ out, const __half *__restrict__ table,
                                    const int32_t *__restrict__ tokens, long long row_begin,
                                    int V_r, int H, float scale)
{
    const int m = blockIdx.x;
    const long long r = (long long)tokens[m] - row_begin;
    const bool here = r >= 0 && r < V_r;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        out[(size_t)m * H + i] = here ? __half2float(table[(size_t)r * H + i]) * scale : 0.0f;
}

int k_embed(float *out, const uint16_t *table, const int32_t *tokens, int M, int64_t row_begin,
            int V_r, int H, float scale, struct CUstream_st *stream)
{
    if (M < 1 || H < 1 || V_r < 1)
        K_REFUSE(K_ERR_SHAPE, "embed M=%d V_r=%d H=%d: need >= 1", M, V_r, H);
    if (!out || !table || !tokens || row_begin < 0)
        K_REFUSE(K_ERR_ARG, "embed: NULL pointer or row_begin %lld < 0", (long long)row_begin);
    embed_kernel<<<M, 256, 0, stream>>>(out, reinterpret_cast<const __half *>(table), tokens,
                                        (long long)row_begin, V_r, H, scale);
    K_LAUNCH_CHECK();
    return K_ERR_NONE;
}

/*
 * ref_moe_route.c - Mixtral top-k routing (transformers MixtralSparseMoeBlock.forward:
 * softmax(router_logits, dtype=float) -> topk -> divide by the kept sum); Qwen3-MoE the same with
 * the division only when norm_topk_prob (modeling_qwen2_moe.py Qwen2MoeTopKRouter).
 * Test: ./build/test_ref
 */
#include <math.h>

#include "ref.h"

void ref_moe_route(const float *logits, int M, int E, int top_k, bool renorm, int32_t *ids,
                   float *weights)
{
    for (int m = 0; m < M; m++) {
        const float *l = logits + (size_t)m * (size_t)E;
        int32_t *id = ids + (size_t)m * (size_t)top_k;
        float *wt = weights + (size_t)m * (size_t)top_k;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++)
            sum += expf(l[e] - mx);
        float kept = 0.0f;
        for (int k = 0; k < top_k; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++)
                    taken |= id[j] == e;
                if (!taken && (best < 0 || l[e] > l[best]))
                    best = e;
            }
            id[k] = best;
            wt[k] = expf(l[best] - mx) / sum;
            kept += wt[k];
        }
        for (int k = 0; renorm && k < top_k; k++)
            wt[k] /= kept;
    }
}

/*
 * ref_linear_f16.c - linears with unquantised weights in nn.Linear orientation W[N][K]:
 * fp16 (lm_head, tied embeddings, modules_to_not_convert; DESIGN 5) and fp32 (Mixtral router).
 * y = x . W^T + bias, fp32 accumulation in a fixed order: per chunk of CHUNK_K values 8
 * interleaved partial sums combined pairwise, chunks added in increasing k.
 *
 * Hot path of the CPU runtime for the lm_head ([V_r, H] per token): tasks own ranges of output
 * rows n; each weight row is converted once per call through the fp16 table, in chunks of
 * CHUNK_K values, and applied to all M activation rows.
 * Test: ./build/test_ref
 */
#include "ref.h"

#define CHUNK_K 512 /* 2 KiB of converted weights on the stack, reused for every m */

struct f16_ctx {
    const float *x;
    const uint16_t *W;
    const float *bias;
    int M, K, N;
    float *y;
};

static void f16_task(void *vctx, int task, int n_tasks)
{
    const struct f16_ctx *c = vctx;
    const float *lut = ref_f16_lut();
    int n0 = (int)((int64_t)task * c->N / n_tasks), n1 = (int)((int64_t)(task + 1) * c->N / n_tasks);
    float wrow[CHUNK_K];

    for (int n = n0; n < n1; n++) {
        const uint16_t *wr = c->W + (size_t)n * (size_t)c->K;
        for (int m = 0; m < c->M; m++)
            c->y[(size_t)m * (size_t)c->N + (size_t)n] = 0.0f;
        for (int k0 = 0; k0 < c->K; k0 += CHUNK_K) {
            int len = c->K - k0 < CHUNK_K ? c->K - k0 : CHUNK_K;
            for (int i = 0; i < len; i++)
                wrow[i] = lut[wr[k0 + i]];
            for (int m = 0; m < c->M; m++) {
                const float *xr = c->x + (size_t)m * (size_t)c->K + (size_t)k0;
                /* 8 interleaved partial sums (vectorisable; a fixed order, so still
                 * independent of the thread count), combined pairwise */
                float a[8] = {0};
                int i = 0;
                for (; i + 8 <= len; i += 8)
                    for (int j = 0; j < 8; j++)
                        a[j] += xr[i + j] * wrow[i + j];
                for (; i < len; i++)
                    a[i % 8] += xr[i] * wrow[i];
                float part = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
                c->y[(size_t)m * (size_t)c->N + (size_t)n] += part;
            }
        }
        if (c->bias)
            for (int m = 0; m < c->M; m++)
                c->y[(size_t)m * (size_t)c->N + (size_t)n] += c->bias[n];
    }
}

void ref_linear_f16(const float *x, const uint16_t *W, const float *bias, int M, int K, int N,
                    float *y, struct ref_pool *pool)
{
    struct f16_ctx c = {x, W, bias, M, K, N, y};
    int n_tasks = ref_pool_threads(pool) * 4;
    if (n_tasks > N)
        n_tasks = N;
    ref_pool_run(pool, f16_task, &c, n_tasks);
}

void ref_linear_f32(const float *x, const float *W, const float *bias, int M, int K, int N,
                    float *y)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)m * (size_t)K, *wr = W + (size_t)n * (size_t)K;
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc += xr[k] * wr[k];
            y[(size_t)m * (size_t)N + (size_t)n] = bias ? acc + bias[n] : acc;
        }
}

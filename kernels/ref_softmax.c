/*
 * ref_softmax.c - row softmax and the padded-vocabulary argmax (greedy decoding).
 * Test: ./build/test_ref
 */
#include <math.h>

#include "ref.h"

void ref_softmax(float *x, int M, int N)
{
    for (int m = 0; m < M; m++) {
        float *r = x + (size_t)m * (size_t)N;
        float mx = -INFINITY;
        for (int i = 0; i < N; i++)
            mx = r[i] > mx ? r[i] : mx;
        float sum = 0.0f;
        for (int i = 0; i < N; i++) {
            r[i] = expf(r[i] - mx);
            sum += r[i];
        }
        for (int i = 0; i < N; i++)
            r[i] /= sum;
    }
}

int ref_argmax(const float *logits, int n, int vocab_size)
{
    int lim = n < vocab_size ? n : vocab_size;
    int best = -1;
    for (int i = 0; i < lim; i++) {
        if (isnan(logits[i]))
            continue;
        if (best < 0 || logits[i] > logits[best])
            best = i;
    }
    return best;
}

/*
 * ref_embed.c - vocab-parallel embedding lookup (DESIGN 5: rank r holds rows
 * [r*V_r, (r+1)*V_r); other ids give zero rows, summed by the all-reduce). Reference of k_embed.
 * Test: ./build/test_ref
 */
#include <string.h>

#include "ref.h"

void ref_embed(float *out, const uint16_t *table, const int32_t *tokens, int M, int64_t row_begin,
               int V_r, int H, float scale)
{
    const float *lut = ref_f16_lut();
    for (int m = 0; m < M; m++) {
        float *o = out + (size_t)m * (size_t)H;
        int64_t row = (int64_t)tokens[m] - row_begin;
        if (row < 0 || row >= V_r) {
            memset(o, 0, (size_t)H * sizeof(float));
            continue;
        }
        const uint16_t *t = table + (size_t)row * (size_t)H;
        for (int i = 0; i < H; i++)
            o[i] = lut[t[i]] * scale;
    }
}

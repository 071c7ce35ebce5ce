/*
 * ref_rmsnorm.c - RMSNorm with optional fused residual add (transformers LlamaRMSNorm:
 * variance = mean(h^2); h * rsqrt(variance + eps); weight * h), fp32; reference of k_rmsnorm.
 * Test: ./build/test_ref
 */
#include <math.h>

#include "ref.h"

void ref_rmsnorm(float *out, float *residual, const float *x, const float *w, int M, int H,
                 float eps)
{
    for (int m = 0; m < M; m++) {
        const float *xr = x ? x + (size_t)m * (size_t)H : NULL;
        float *hr;
        if (residual) {
            hr = residual + (size_t)m * (size_t)H;
            if (x)
                for (int i = 0; i < H; i++)
                    hr[i] += xr[i];
        } else {
            hr = (float *)xr; /* only read below */
        }
        double ss = 0.0;
        for (int i = 0; i < H; i++)
            ss += (double)hr[i] * (double)hr[i];
        float r = 1.0f / sqrtf((float)(ss / H) + eps);
        float *orow = out + (size_t)m * (size_t)H;
        for (int i = 0; i < H; i++)
            orow[i] = w[i] * (hr[i] * r);
    }
}

/*
 * ref_rmsnorm.c - RMSNorm with optional fused residual add (transformers LlamaRMSNorm:
 * variance = mean(h^2); h * rsqrt(variance + eps); weight * h), fp32; reference of k_rmsnorm.
 * ref_head_rmsnorm: the same norm on every q and k head of a fused qkv row (Qwen3 q_norm /
 * k_norm, transformers modeling_qwen3.py Qwen3Attention); reference of k_head_rmsnorm.
 * ref_layernorm: LayerNorm with bias (torch.nn.LayerNorm; Falcon, MPT) in the same three modes;
 * reference of k_layernorm.
 * Test: ./build/test_ref
 */
#include <math.h>

#include "ref.h"

/* Row m of a norm's input (the three modes of ref_rmsnorm / ref_layernorm): residual[m] after
 * residual[m] += x[m], residual[m] as it is (x NULL), or x[m] (residual NULL). */
static const float *norm_input(float *residual, const float *x, int m, int H)
{
    const float *xr = x ? x + (size_t)m * (size_t)H : NULL;
    if (!residual)
        return xr;
    float *hr = residual + (size_t)m * (size_t)H;
    if (x)
        for (int i = 0; i < H; i++)
            hr[i] += xr[i];
    return hr;
}

void ref_rmsnorm(float *out, float *residual, const float *x, const float *w, int M, int H,
                 float eps)
{
    for (int m = 0; m < M; m++) {
        const float *hr = norm_input(residual, x, m, H);
        double ss = 0.0;
        for (int i = 0; i < H; i++)
            ss += (double)hr[i] * (double)hr[i];
        float r = 1.0f / sqrtf((float)(ss / H) + eps);
        float *orow = out + (size_t)m * (size_t)H;
        for (int i = 0; i < H; i++)
            orow[i] = w[i] * (hr[i] * r);
    }
}

void ref_layernorm(float *out, float *residual, const float *x, const float *w, const float *b,
                   int M, int H, float eps)
{
    for (int m = 0; m < M; m++) {
        const float *hr = norm_input(residual, x, m, H);
        double s = 0.0, ss = 0.0;
        for (int i = 0; i < H; i++)
            s += (double)hr[i];
        const double mean = s / H;
        for (int i = 0; i < H; i++)
            ss += ((double)hr[i] - mean) * ((double)hr[i] - mean);
        const float r = 1.0f / sqrtf((float)(ss / H) + eps), mf = (float)mean;
        float *orow = out + (size_t)m * (size_t)H;
        for (int i = 0; i < H; i++)
            orow[i] = w[i] * ((hr[i] - mf) * r) + (b ? b[i] : 0.0f);
    }
}

void ref_residual_add(float *residual, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        residual[i] += x[i];
}

/* One vector v[hd] in place: v * rsqrt(mean(v^2) + eps) * w. */
static void norm_head(float *v, const float *w, int hd, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < hd; i++)
        ss += (double)v[i] * (double)v[i];
    float r = 1.0f / sqrtf((float)(ss / hd) + eps);
    for (int i = 0; i < hd; i++)
        v[i] = w[i] * (v[i] * r);
}

void ref_head_rmsnorm(float *x, int M, int n_q, int n_kv, int hd, size_t row_stride,
                      const float *wq, const float *wk, float eps)
{
    for (int m = 0; m < M; m++) {
        float *row = x + (size_t)m * row_stride;
        for (int h = 0; h < n_q + n_kv; h++)
            norm_head(row + (size_t)h * (size_t)hd, h < n_q ? wq : wk, hd, eps);
    }
}

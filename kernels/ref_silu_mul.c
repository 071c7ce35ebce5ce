/*
 * ref_silu_mul.c - the SiLU-gated MLP's elementwise step, out = silu(gate) * up, on the fused
 * gate_up_proj output [M][2*I] = [gate | up] (DESIGN 5); reference of k_silu_mul.
 * silu(g) = g * sigmoid(g) (Elfwing et al. 2018; torch.nn.functional.silu).
 * ref_gelu: the plain (ungated) MLP activation of Falcon and MPT, exact erf GELU (Hendrycks &
 * Gimpel 2016; torch.nn.GELU()); reference of k_gelu. ref_gelu_tanh_mul: Gemma's GeGLU
 * (gelu_pytorch_tanh of the gate times up); reference of k_gelu_tanh_mul. ref_softcap: Gemma 2's
 * soft-capping; reference of k_softcap. Test: ./build/test_ref
 */
#include <math.h>

#include "ref.h"

void ref_silu_mul(float *out, const float *gate_up, int M, int I)
{
    for (int m = 0; m < M; m++) {
        const float *g = gate_up + (size_t)m * 2 * (size_t)I, *u = g + I;
        float *o = out + (size_t)m * (size_t)I;
        for (int i = 0; i < I; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void ref_gelu(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const double v = (double)x[i];
        out[i] = (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)));
    }
}

void ref_gelu_tanh_mul(float *out, const float *gate_up, int M, int I)
{
    for (int m = 0; m < M; m++) {
        const float *g = gate_up + (size_t)m * 2 * (size_t)I, *u = g + I;
        float *o = out + (size_t)m * (size_t)I;
        for (int i = 0; i < I; i++) {
            const double x = (double)g[i];
            const double t = tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x));
            o[i] = (float)(0.5 * x * (1.0 + t)) * u[i];
        }
    }
}

void ref_softcap(float *x, size_t n, float cap)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)tanh((double)(x[i] / cap)) * cap;
}

void ref_div_cols(float *x, const float *d, int M, int I)
{
    for (int m = 0; m < M; m++)
        for (int i = 0; i < I; i++)
            x[(size_t)m * (size_t)I + i] /= d[i];
}

/*
 * ref_rope.c - rotary position embedding (Su et al. 2021, "RoFormer") in transformers'
 * rotate_half form, and the inverse frequencies with linear and llama3 scaling
 * (transformers modeling_rope_utils.py: _compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters, _compute_llama3_parameters). All in fp32 like
 * transformers, so positions far out round the same way. Reference of k_rope.
 * Test: ./build/test_ref
 */
#include <math.h>

#include "ref.h"

void ref_rope_inv_freq(float *inv_freq, int hd, double rope_theta,
                       const struct qs_rope_scaling *sc)
{
    const float two_pi = (float)(2.0 * M_PI);
    /* the config's values in fp32, as transformers uses them */
    const float factor = sc ? (float)sc->factor : 1.0f;
    const float low = sc ? (float)sc->low_freq_factor : 0.0f;
    const float high = sc ? (float)sc->high_freq_factor : 0.0f;
    const float L = sc ? (float)sc->original_max_position_embeddings : 0.0f;
    for (int i = 0; i < hd / 2; i++) {
        float e = (float)(2 * i) / (float)hd;
        float f = 1.0f / powf((float)rope_theta, e);
        if (sc && sc->type == QS_ROPE_LINEAR) {
            f = f / factor;
        } else if (sc && sc->type == QS_ROPE_LLAMA3) {
            float low_wavelen = L / low;
            float high_wavelen = L / high;
            float wavelen = two_pi / f;
            if (wavelen > low_wavelen) {
                f = f / factor;
            } else if (!(wavelen < high_wavelen)) {
                float s = (L / wavelen - low) / (high - low);
                f = (1.0f - s) * f / factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

void ref_rope(float *x, int M, int n_heads, int hd, size_t row_stride, const int32_t *pos,
              const float *inv_freq)
{
    int half = hd / 2;
    for (int m = 0; m < M; m++) {
        for (int i = 0; i < half; i++) {
            float a = (float)pos[m] * inv_freq[i];
            float c = cosf(a), s = sinf(a);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + (size_t)m * row_stride + (size_t)h * (size_t)hd;
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

/*
 * gpu_test_ops_act.cuh - the activation cases of build/gpu_test_ops (areas gelu, softcap):
 * k_gelu (Falcon, MPT's divisor), k_gelu_tanh_mul (Gemma's GeGLU) and k_softcap (Gemma 2's
 * logits) against ref_gelu / ref_div_cols / ref_gelu_tanh_mul / ref_softcap on fresh random
 * inputs. Included once, by gpu_test_ops.cu, after tests/gpu_t.cuh.
 */
#ifndef QS_GPU_TEST_OPS_ACT_CUH
#define QS_GPU_TEST_OPS_ACT_CUH

#include "gpu_t.cuh" /* rng, device buffers, compare */

/* k_gelu (Falcon's MLP) vs ref_gelu from fp16 and from fp32 sums (zeroed after) */
static void test_gelu(void)
{
    for (size_t n : {(size_t)18176, (size_t)7 * 1408, (size_t)5}) {
        std::vector<uint16_t> xh;
        std::vector<float> xf, xa(n), out(n);
        rand_f16(xh, xf, n, -8.0f, 8.0f);
        for (auto &v : xa) v = rng_uniform(-8.0f, 8.0f);
        uint16_t *dx = dev_upload(xh), *dout = dev_poisoned<uint16_t>(n);
        float *dxa = dev_upload(xa);
        CHECK_EQ_INT(k_gelu(dout, dx, nullptr, n, nullptr, 0, nullptr), K_ERR_NONE);
        ref_gelu(out.data(), xf.data(), n);
        std::vector<float> got = f16_to_f32(dev_download(dout, n));
        char what[64];
        snprintf(what, sizeof what, "gelu n=%zu", n);
        compare(what, got.data(), out.data(), n, 1e-3, 1e-3, 1e-3);
        CHECK_EQ_INT(k_gelu(dout, nullptr, dxa, n, nullptr, 0, nullptr), K_ERR_NONE);
        ref_gelu(out.data(), xa.data(), n);
        got = f16_to_f32(dev_download(dout, n));
        snprintf(what, sizeof what, "gelu acc n=%zu", n);
        compare(what, got.data(), out.data(), n, 1e-3, 1e-3, 1e-3);
        CHECK_MSG(dev_nonzero(dxa, n) == 0, "%s: sums not zeroed", what);
        /* MPT: divided by per-column activation scales (ref_div_cols) */
        const int I = n % 1408 == 0 ? 1408 : (int)n;
        std::vector<float> dv((size_t)I);
        for (auto &v : dv) v = expf(rng_uniform(-1.0f, 1.0f));
        float *ddv = dev_upload(dv);
        CHECK_EQ_INT(k_gelu(dout, dx, nullptr, n, ddv, I, nullptr), K_ERR_NONE);
        ref_gelu(out.data(), xf.data(), n);
        ref_div_cols(out.data(), dv.data(), (int)(n / I), I);
        got = f16_to_f32(dev_download(dout, n));
        snprintf(what, sizeof what, "gelu / act_scales n=%zu I=%d", n, I);
        compare(what, got.data(), out.data(), n, 1e-3, 1e-3, 1e-3);
        TCUDA(cudaFree(dx)); TCUDA(cudaFree(dout)); TCUDA(cudaFree(dxa)); TCUDA(cudaFree(ddv));
    }
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_gelu(nullptr, nullptr, nullptr, 4, nullptr, 0, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_gelu(nullptr, nullptr, nullptr, 0, nullptr, 0, nullptr), K_ERR_SHAPE);
    float *d1 = dev_upload(std::vector<float>(4, 1.0f));
    CHECK_EQ_INT(k_gelu(nullptr, nullptr, nullptr, 6, d1, 4, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_softcap(d1, 4, 0.0f, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_softcap(nullptr, 4, 1.0f, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_gelu_tanh_mul(nullptr, nullptr, nullptr, 1, 4, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_gelu_tanh_mul(nullptr, nullptr, nullptr, 0, 4, nullptr), K_ERR_SHAPE);
    TCUDA(cudaFree(d1));
    qs_log_set_quiet(false);
}

/* k_gelu_tanh_mul (Gemma's GeGLU) vs ref_gelu_tanh_mul from fp16 and fp32 sums (zeroed after);
 * k_softcap (Gemma 2's logits) vs ref_softcap */
static void test_gelu_tanh_softcap(void)
{
    for (auto s : {std::pair<int, int>{1, 14336}, {9, 1152}, {3, 5}}) {
        const int M = s.first, I = s.second;
        const size_t n = (size_t)M * I;
        std::vector<uint16_t> gh;
        std::vector<float> gf, ga(2 * n), out(n);
        rand_f16(gh, gf, 2 * n, -6.0f, 6.0f);
        for (auto &v : ga) v = rng_uniform(-6.0f, 6.0f);
        uint16_t *dg = dev_upload(gh), *dout = dev_poisoned<uint16_t>(n);
        float *dga = dev_upload(ga);
        char what[64];
        CHECK_EQ_INT(k_gelu_tanh_mul(dout, dg, nullptr, M, I, nullptr), K_ERR_NONE);
        ref_gelu_tanh_mul(out.data(), gf.data(), M, I);
        std::vector<float> got = f16_to_f32(dev_download(dout, n));
        snprintf(what, sizeof what, "gelu_tanh_mul M=%d I=%d", M, I);
        compare(what, got.data(), out.data(), n, 1e-3, 1e-3, 1e-3);
        CHECK_EQ_INT(k_gelu_tanh_mul(dout, nullptr, dga, M, I, nullptr), K_ERR_NONE);
        ref_gelu_tanh_mul(out.data(), ga.data(), M, I);
        got = f16_to_f32(dev_download(dout, n));
        snprintf(what, sizeof what, "gelu_tanh_mul acc M=%d I=%d", M, I);
        compare(what, got.data(), out.data(), n, 1e-3, 1e-3, 1e-3);
        CHECK_MSG(dev_nonzero(dga, 2 * n) == 0, "%s: sums not zeroed", what);
        TCUDA(cudaFree(dg)); TCUDA(cudaFree(dout)); TCUDA(cudaFree(dga));
    }
    std::vector<float> lg(256000 + 7), want;
    for (auto &v : lg) v = rng_uniform(-200.0f, 200.0f);
    want = lg;
    ref_softcap(want.data(), want.size(), 30.0f);
    float *dl = dev_upload(lg);
    CHECK_EQ_INT(k_softcap(dl, lg.size(), 30.0f, nullptr), K_ERR_NONE);
    const std::vector<float> got = dev_download(dl, lg.size());
    compare("softcap 30", got.data(), want.data(), got.size(), 1e-5, 1e-5, 1e-5);
    TCUDA(cudaFree(dl));
}

#endif /* QS_GPU_TEST_OPS_ACT_CUH */

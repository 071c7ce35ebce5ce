/*
 * t_ref_act.h - cases of build/test_ref for the activations and score options the newer
 * families added (ref_gelu, ref_gelu_tanh_mul, ref_softcap; ref_alibi_slopes and the
 * ref_att_score options of ref_attention_paged against double-precision loops written here).
 * Included once, by tests/test_ref.c, after its helpers (fill_uniform).
 */
#ifndef QS_T_REF_ACT_H
#define QS_T_REF_ACT_H

/* ref_gelu against x * Phi(x) with Phi from erfc (a different libm function than erf) and two
 * known values */
static void test_gelu(void)
{
    enum { N = 300 };
    float x[N], y[N];
    fill_uniform(x, N, -8, 8);
    x[0] = 1.0f;
    x[1] = -1.0f;
    ref_gelu(y, x, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const double want = x[i] * 0.5 * erfc(-x[i] / sqrt(2.0));
        if (fabs(y[i] - want) > 1e-7 + 1e-6 * fabs(want))
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(fabs(y[0] - 0.8413447460685429) < 1e-7);
    CHECK(fabs(y[1] + 0.15865525393145707) < 1e-7);
    ref_gelu(x, x, N); /* in place */
    CHECK(memcmp(x, y, sizeof(y)) == 0);
}

/* ref_gelu_tanh_mul against x * sigmoid(2 z) (the same function as x/2 (1 + tanh z), written
 * through exp instead of tanh), z = sqrt(2/pi) (x + 0.044715 x^3), times up; ref_softcap
 * against cap * (1 - 2 / (exp(2 x / cap) + 1)) and its bound |y| < cap for large inputs */
static void test_gelu_tanh_softcap(void)
{
    enum { M = 3, I = 100 };
    float gu[M * 2 * I], out[M * I];
    fill_uniform(gu, M * 2 * I, -6, 6);
    ref_gelu_tanh_mul(out, gu, M, I);
    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int i = 0; i < I; i++) {
            const double x = gu[m * 2 * I + i], u = gu[m * 2 * I + I + i];
            const double z = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
            const double want = x / (1.0 + exp(-2.0 * z)) * u;
            bad += fabs(out[m * I + i] - want) > 1e-6 + 1e-6 * fabs(want);
        }
    CHECK_EQ_INT(bad, 0);
    float y[200];
    fill_uniform(y, 200, -400, 400);
    float y0[200];
    memcpy(y0, y, sizeof(y));
    ref_softcap(y, 200, 30.0f);
    bad = 0;
    for (int i = 0; i < 200; i++) {
        const double want = 30.0 * (1.0 - 2.0 / (exp(2.0 * y0[i] / 30.0) + 1.0));
        bad += fabs(y[i] - want) > 1e-5 + 1e-6 * fabs(want) || fabsf(y[i]) > 30.0f;
    }
    CHECK_EQ_INT(bad, 0);
}

/* ref_alibi_slopes against MPT's slopes written out by hand (8 heads: 2^-1 .. 2^-8; 6 heads:
 * the 8-head slopes at odd positions, then even ones), and ref_attention_paged with ALiBi
 * against a double-precision loop written here: score + slope * (key - query position) */
static void test_alibi(struct ref_pool *pool)
{
    float s8[8], s6[6], s6b[3];
    ref_alibi_slopes(s8, 8, 0, 8, 8.0f);
    for (int h = 0; h < 8; h++)
        CHECK(s8[h] == ldexpf(1.0f, -(h + 1)));
    ref_alibi_slopes(s6, 6, 0, 6, 8.0f);
    const float want6[6] = {0.25f, 0.0625f, 1.0f / 64, 1.0f / 256, 0.5f, 0.125f};
    for (int h = 0; h < 6; h++)
        CHECK_MSG(s6[h] == want6[h], "alibi 6 heads: head %d slope %g, want %g", h, s6[h], want6[h]);
    ref_alibi_slopes(s6b, 6, 3, 3, 8.0f); /* a rank's heads 3..5 */
    CHECK(s6b[0] == want6[3] && s6b[1] == want6[4] && s6b[2] == want6[5]);
    enum { NH = 6, HD = 8, BS = 4, T = 11 };
    float q[T * NH * HD], k[16 * NH * BS * HD], v[16 * NH * BS * HD], out[T * NH * HD];
    fill_uniform(q, T * NH * HD, -1, 1);
    fill_uniform(k, 16 * NH * BS * HD, -1, 1);
    fill_uniform(v, 16 * NH * BS * HD, -1, 1);
    int32_t pos[T], row_table[T], tab[4] = {3, 0, 7, 5};
    for (int m = 0; m < T; m++) {
        pos[m] = m + 2; /* rows at positions 2..12 of one sequence */
        row_table[m] = 0;
    }
    /* ALiBi; then Gemma's scale and soft-capping (tanh in double below) */
    const struct ref_att_score opts[2] = {{0.0f, 0.0f, s6}, {0.21f, 0.75f, NULL}};
    for (int c = 0; c < 2; c++) {
    const struct ref_att_score *o = &opts[c];
    CHECK_EQ_INT(ref_attention_paged(out, NH * HD, q, NH * HD, k, v, T, pos, tab, 4, row_table, NH,
                                     NH, HD, BS, 0, o, pool), REF_ERR_NONE);
    int bad = 0;
    for (int m = 0; m < T; m++)
        for (int h = 0; h < NH; h++) {
            double sc[16], mx = -1e300, sum = 0;
            for (int t = 0; t <= pos[m]; t++) {
                const float *kr = k + ref_kv_offset((int64_t)tab[t / BS] * BS + t % BS, h, NH, BS, HD);
                double d = 0;
                for (int i = 0; i < HD; i++)
                    d += (double)q[(m * NH + h) * HD + i] * kr[i];
                sc[t] = o->scale > 0 ? d * o->scale : d / sqrt((double)HD);
                if (o->softcap > 0)
                    sc[t] = o->softcap * tanh(sc[t] / o->softcap);
                if (o->alibi)
                    sc[t] += (double)want6[h] * (t - pos[m]);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int t = 0; t <= pos[m]; t++)
                sum += exp(sc[t] - mx);
            for (int i = 0; i < HD; i++) {
                double ov = 0;
                for (int t = 0; t <= pos[m]; t++)
                    ov += exp(sc[t] - mx) / sum *
                          v[ref_kv_offset((int64_t)tab[t / BS] * BS + t % BS, h, NH, BS, HD) + i];
                bad += fabs(out[(m * NH + h) * HD + i] - ov) > 1e-5;
            }
        }
    CHECK_MSG(bad == 0, "score options %d: %d values off", c, bad);
    }
}

#endif /* QS_T_REF_ACT_H */

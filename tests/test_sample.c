/*
 * test_sample.c - runtime/rt_sample.c against straightforward, independent computations on
 * fresh random logits:
 *   - greedy == argmax (lowest id on ties), also with the repetition penalty;
 *   - the survivor set and renormalised probabilities of temperature / top-k / top-p / min-p /
 *     penalty, recomputed here the way HF transformers writes them (top-p via an ascending sort
 *     and `cumsum <= 1 - p` removal, top-k via the k-th largest value), with p placed strictly
 *     between two cumulative masses so the cutoff is exact;
 *   - empirical frequencies over many draws vs that distribution (Pearson chi-square, bound at
 *     p = 1e-4 via the Wilson-Hilferty approximation);
 *   - padded ids (>= vocab_size) are never chosen even when their logits are huge;
 *   - a seed reproduces its sequence, different seeds differ, reset restarts;
 *   - bad parameters and all -inf rows are refused.
 * Run: ./build/test_sample  (QSHARD_TEST_SEED=n changes the logits' seed; default 12345)
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "rt_sample.h"
#include "t.h"

// --- the test's own random numbers (independent of the sampler's PRNG) ----------------------

static uint64_t g_state = 12345;

static double urand(void) /* 64-bit LCG (Knuth MMIX constants), top 53 bits */
{
    g_state = g_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(g_state >> 11) * 0x1.0p-53;
}

static float nrand(void) /* Box-Muller */
{
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static void fill_logits(float *x, int n, float scale)
{
    for (int i = 0; i < n; i++)
        x[i] = nrand() * scale;
}

// --- the independent reference: HF transformers' processors, written plainly ----------------

/* Returns the reference distribution over [0, v) in ref[] (0 for removed ids). */
static void ref_distribution(const float *logits, int v, const unsigned char *seen,
                             const struct rt_sample_params *p, double *ref)
{
    double *x = malloc(sizeof(double) * v);
    for (int i = 0; i < v; i++) {
        double l = logits[i];
        if (seen && seen[i])
            l = l < 0 ? l * p->repeat_penalty : l / p->repeat_penalty; /* torch.where(s<0,..) */
        x[i] = l / p->temperature;
    }
    /* top-k: remove scores < k-th largest (sorted copy, descending) */
    if (p->top_k > 0 && p->top_k < v) {
        double *srt = malloc(sizeof(double) * v);
        memcpy(srt, x, sizeof(double) * v);
        for (int i = 1; i < v; i++) /* insertion sort, descending */
            for (int j = i; j > 0 && srt[j] > srt[j - 1]; j--) {
                double t = srt[j];
                srt[j] = srt[j - 1];
                srt[j - 1] = t;
            }
        double kth = srt[p->top_k - 1];
        for (int i = 0; i < v; i++)
            if (x[i] < kth)
                x[i] = -INFINITY;
        free(srt);
    }
    /* softmax */
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < v; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < v; i++) {
        ref[i] = exp(x[i] - mx);
        sum += ref[i];
    }
    for (int i = 0; i < v; i++)
        ref[i] /= sum;
    /* top-p, HF style: sort ascending, cumsum, remove where cumsum <= 1 - p, keep the last */
    if (p->top_p < 1.0f) {
        int *ord = malloc(sizeof(int) * v);
        for (int i = 0; i < v; i++)
            ord[i] = i;
        for (int i = 1; i < v; i++) /* ascending prob, ties: higher id first (= kept last) */
            for (int j = i; j > 0; j--) {
                int a = ord[j - 1], b = ord[j];
                if (ref[b] < ref[a] || (ref[b] == ref[a] && b > a)) {
                    ord[j - 1] = b;
                    ord[j] = a;
                } else {
                    break;
                }
            }
        double cum = 0;
        for (int i = 0; i < v - 1; i++) {
            cum += ref[ord[i]];
            if (cum <= 1.0 - p->top_p)
                ref[ord[i]] = 0;
        }
        free(ord);
        sum = 0;
        for (int i = 0; i < v; i++)
            sum += ref[i];
        for (int i = 0; i < v; i++)
            ref[i] /= sum;
    }
    /* min-p: remove probs < min_p * max prob */
    if (p->min_p > 0) {
        double top = 0;
        for (int i = 0; i < v; i++)
            top = ref[i] > top ? ref[i] : top;
        sum = 0;
        for (int i = 0; i < v; i++) {
            if (ref[i] < p->min_p * top)
                ref[i] = 0;
            sum += ref[i];
        }
        for (int i = 0; i < v; i++)
            ref[i] /= sum;
    }
    free(x);
}

/* Upper critical value of chi-square with df degrees of freedom at tail probability 1e-4
 * (Wilson-Hilferty: chi2 ~ df * (1 - 2/(9df) + z sqrt(2/(9df)))^3, z = 3.719). */
static double chi2_crit(int df)
{
    double a = 2.0 / (9.0 * df);
    double c = 1.0 - a + 3.719 * sqrt(a);
    return df * c * c * c;
}

/* Compare the sampler's survivors (ids + probabilities) with ref[]; returns the number of
 * mismatching ids. */
static int compare_candidates(struct rt_sampler *s, const float *logits, int v, const double *ref)
{
    int n = rt_sampler_candidates(s, logits, v);
    int bad = 0, n_ref = 0;
    for (int i = 0; i < v; i++)
        n_ref += ref[i] > 0;
    if (n != n_ref) {
        fprintf(stderr, "  survivors: sampler %d, reference %d\n", n, n_ref);
        return 1 + abs(n - n_ref);
    }
    for (int i = 0; i < n; i++) {
        int id = s->cand[i];
        if (ref[id] <= 0 || fabs(s->prob[i] - ref[id]) > 1e-9 + 1e-5 * ref[id]) {
            if (bad < 5)
                fprintf(stderr, "  id %d: sampler p=%.9g, reference p=%.9g\n", id, s->prob[i],
                        ref[id]);
            bad++;
        }
    }
    return bad;
}

/* Draw `draws` tokens and run a chi-square test against ref[] (bins with expected < 5 merged);
 * also fails if any draw lands on an id with reference probability 0. */
static void check_frequencies(struct rt_sampler *s, const float *logits, int v, const double *ref,
                              int draws, const char *what)
{
    long *cnt = calloc((size_t)v, sizeof(long));
    int outside = 0;
    for (int d = 0; d < draws; d++) {
        int32_t id = -1;
        if (rt_sampler_next(s, logits, v, &id) != RT_SAMPLE_ERR_NONE || id < 0 || id >= v) {
            outside++;
            continue;
        }
        cnt[id]++;
        if (ref[id] == 0)
            outside++;
    }
    double chi2 = 0, lump_e = 0, lump_o = 0;
    int bins = 0;
    for (int i = 0; i < v; i++) {
        if (ref[i] == 0)
            continue;
        double e = ref[i] * draws;
        if (e < 5) {
            lump_e += e;
            lump_o += cnt[i];
            continue;
        }
        chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
        bins++;
    }
    if (lump_e > 0) {
        chi2 += (lump_o - lump_e) * (lump_o - lump_e) / lump_e;
        bins++;
    }
    CHECK_MSG(outside == 0, "%s: %d draws outside the reference support", what, outside);
    if (bins >= 2) {
        double crit = chi2_crit(bins - 1);
        CHECK_MSG(chi2 < crit, "%s: chi2 = %.2f over %d bins, bound %.2f", what, chi2, bins, crit);
    }
    free(cnt);
}

// --- cases ---------------------------------------------------------------------------------

static void test_greedy(void)
{
    enum { V = 1000 };
    float x[V];
    struct rt_sample_params p = rt_sample_params_default();
    p.temperature = 0;
    struct rt_sampler s;
    CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
    for (int rep = 0; rep < 50; rep++) {
        fill_logits(x, V, 3.0f);
        if (rep % 5 == 0) { /* a tie: copy the maximum to a higher and a lower id */
            int a = (int)(urand() * V), b = (int)(urand() * V);
            x[a] = x[b] = 100.0f;
        }
        int best = 0;
        for (int i = 1; i < V; i++)
            if (x[i] > x[best])
                best = i;
        int32_t id = -1;
        CHECK_EQ_INT(rt_sampler_next(&s, x, V, &id), RT_SAMPLE_ERR_NONE);
        CHECK_EQ_INT(id, best);
    }
    rt_sampler_free(&s);
}

static void test_padded_vocab(void)
{
    enum { V = 101, PAD = 27 }; /* row of V + PAD, like V_r * world_size > vocab_size */
    float x[V + PAD];
    fill_logits(x, V, 1.0f);
    for (int i = V; i < V + PAD; i++)
        x[i] = 1e30f; /* the padding would win everything if it were read */
    struct rt_sample_params p = rt_sample_params_default();
    struct rt_sampler s;
    for (int mode = 0; mode < 3; mode++) {
        p.temperature = mode == 0 ? 0.0f : 1.5f;
        p.top_k = mode == 2 ? 5 : 0;
        p.seed = 7 + (uint64_t)mode;
        CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
        int ok = 1;
        for (int d = 0; d < 5000; d++) {
            int32_t id = -1;
            if (rt_sampler_next(&s, x, V + PAD, &id) || id < 0 || id >= V)
                ok = 0;
        }
        CHECK_MSG(ok, "mode %d sampled a padded id or failed", mode);
        /* a row shorter than the vocabulary is refused */
        int32_t id;
        qs_log_set_quiet(true);
        CHECK_EQ_INT(rt_sampler_next(&s, x, V - 1, &id), RT_SAMPLE_ERR_PARAM);
        qs_log_set_quiet(false);
        rt_sampler_free(&s);
    }
}

/* vocab_limit (rt_sample.h step 0): ids at or past the limit (lm_head rows past the
 * tokenizer's vocabulary) are never candidates, even when their logits are the largest; the
 * ids below it keep the distribution of a sampler over just those ids (HF reference); the
 * history still takes every model id. */
static void test_vocab_limit(void)
{
    enum { V = 128, L = 100 };
    float x[V];
    double ref[V];
    fill_logits(x, V, 2.0f);
    for (int i = L; i < V; i++)
        x[i] = 50.0f; /* would win every draw if read */
    struct rt_sample_params p = rt_sample_params_default();
    p.vocab_limit = L;
    struct rt_sampler s;
    p.temperature = 0.0f;
    CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
    int32_t id = -1, best = 0;
    for (int i = 1; i < L; i++)
        best = x[i] > x[best] ? i : best;
    CHECK(rt_sampler_next(&s, x, V, &id) == RT_SAMPLE_ERR_NONE && id == best);
    CHECK_EQ_INT(rt_sampler_accept(&s, V - 1), RT_SAMPLE_ERR_NONE);
    rt_sampler_free(&s);
    p.temperature = 1.3f;
    p.top_p = 0.9f;
    p.seed = 99;
    CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
    ref_distribution(x, L, NULL, &p, ref);
    for (int i = L; i < V; i++)
        ref[i] = 0.0;
    CHECK_EQ_INT(compare_candidates(&s, x, V, ref), 0);
    check_frequencies(&s, x, V, ref, 20000, "vocab_limit 100 of 128");
    rt_sampler_free(&s);
    p.vocab_limit = -1;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(rt_sample_params_check(&p), RT_SAMPLE_ERR_PARAM);
    qs_log_set_quiet(false);
}

static void test_distributions(void)
{
    enum { V = 48 };
    float x[V];
    double ref[V];
    unsigned char seen[V];
    struct {
        float temp;
        int top_k;
        float top_p; /* < 0: place exactly between two cumulative masses */
        float min_p;
        float penalty;
        const char *what;
    } cases[] = {
        {1.0f, 0, 1.0f, 0.0f, 1.0f, "plain softmax"},
        {0.7f, 0, 1.0f, 0.0f, 1.0f, "temperature 0.7"},
        {1.8f, 0, 1.0f, 0.0f, 1.0f, "temperature 1.8"},
        {1.0f, 10, 1.0f, 0.0f, 1.0f, "top-k 10"},
        {0.8f, 1, 1.0f, 0.0f, 1.0f, "top-k 1"},
        {1.0f, 0, -1.0f, 0.0f, 1.0f, "top-p exact cutoff"},
        {1.3f, 20, -1.0f, 0.0f, 1.0f, "top-k 20 + top-p"},
        {1.0f, 0, 1.0f, 0.05f, 1.0f, "min-p 0.05"},
        {0.9f, 0, 1.0f, 0.0f, 1.3f, "repetition penalty 1.3"},
        {1.2f, 30, -1.0f, 0.02f, 1.5f, "all processors"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        fill_logits(x, V, 2.0f);
        for (int i = 0; i < V; i++)
            seen[i] = urand() < 0.3;
        struct rt_sample_params p = rt_sample_params_default();
        p.temperature = cases[c].temp;
        p.top_k = cases[c].top_k;
        p.min_p = cases[c].min_p;
        p.repeat_penalty = cases[c].penalty;
        p.seed = 1000 + c;
        p.top_p = 1.0f;
        if (cases[c].top_p < 0) {
            /* cumulative masses of the distribution before top-p, in descending order; put p
             * midway between c_{m-1} and c_m for a random m, so exactly m ids survive */
            ref_distribution(x, V, seen, &p, ref);
            double srt[V];
            int n = 0;
            for (int i = 0; i < V; i++)
                if (ref[i] > 0)
                    srt[n++] = ref[i];
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && srt[j] > srt[j - 1]; j--) {
                    double t = srt[j];
                    srt[j] = srt[j - 1];
                    srt[j - 1] = t;
                }
            int m = 2 + (int)(urand() * (n / 2));
            double cm1 = 0;
            for (int i = 0; i < m - 1; i++)
                cm1 += srt[i];
            p.top_p = (float)(cm1 + srt[m - 1] / 2);
            ref_distribution(x, V, seen, &p, ref);
            int kept = 0;
            for (int i = 0; i < V; i++)
                kept += ref[i] > 0;
            CHECK_MSG(kept == m, "%s: reference keeps %d, expected %d", cases[c].what, kept, m);
        } else {
            ref_distribution(x, V, seen, &p, ref);
        }
        struct rt_sampler s;
        CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
        for (int i = 0; i < V; i++)
            if (seen[i])
                CHECK_EQ_INT(rt_sampler_accept(&s, i), RT_SAMPLE_ERR_NONE);
        int bad = compare_candidates(&s, x, V, ref);
        CHECK_MSG(bad == 0, "%s: %d survivor mismatches", cases[c].what, bad);
        check_frequencies(&s, x, V, ref, 200000, cases[c].what);
        rt_sampler_free(&s);
    }
}

static void test_top_p_boundary(void)
{
    /* 8 equal logits: every probability is exactly 1/8 and every cumulative mass m/8 is exact
     * in binary, so p = m/8 sits on a boundary. HF removes ids whose ascending cumsum is
     * <= 1 - p, which keeps exactly m ids; the tie order keeps the lowest ids. */
    enum { V = 8 };
    float x[V];
    for (int i = 0; i < V; i++)
        x[i] = 0.75f;
    for (int m = 1; m <= V; m++) {
        struct rt_sample_params p = rt_sample_params_default();
        p.top_p = (float)m / V;
        struct rt_sampler s;
        CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
        int n = rt_sampler_candidates(&s, x, V);
        CHECK_MSG(n == m, "top-p %g on 8 equal logits keeps %d, expected %d", (double)p.top_p, n,
                  m);
        for (int i = 0; i < n && i < m; i++)
            CHECK_EQ_INT(s.cand[i], i);
        rt_sampler_free(&s);
    }
}

/* +inf logits (from a temperature so small that x / T overflows, or given as +inf): the ids at
 * +inf share the mass equally, every other id gets 0; never NaN, never a stale id. */
static void test_inf_logits(void)
{
    static const float tiny_t[8] = {1, 2, 5, 3, 4, 0, 0, 0}; /* / 1e-38: 5 and 4 overflow */
    const float inf_in[4] = {1, INFINITY, 3, INFINITY};
    const struct {
        const float *x;
        int V;
        float t, top_p;
        int a, b; /* the two ids at +inf */
    } cases[] = {
        {tiny_t, 8, 1e-38f, 0.9f, 2, 4}, {tiny_t, 8, 1e-38f, 1.0f, 2, 4},
        {inf_in, 4, 1.0f, 0.6f, 1, 3},   {inf_in, 4, 1.0f, 1.0f, 1, 3},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct rt_sample_params p = rt_sample_params_default();
        p.temperature = cases[c].t;
        p.top_p = cases[c].top_p;
        p.seed = 7 + c;
        struct rt_sampler s;
        CHECK_EQ_INT(rt_sampler_init(&s, &p, cases[c].V), RT_SAMPLE_ERR_NONE);
        int n = rt_sampler_candidates(&s, cases[c].x, cases[c].V);
        double mass = 0.0;
        for (int j = 0; j < n; j++) {
            CHECK_MSG(isfinite(s.prob[j]), "case %zu: probability of id %d is %g", c,
                      (int)s.cand[j], s.prob[j]);
            if (s.cand[j] == cases[c].a || s.cand[j] == cases[c].b)
                mass += s.prob[j];
        }
        CHECK_MSG(n >= 2 && fabs(mass - 1.0) < 1e-12, "case %zu: %d survivors, mass at +inf %g",
                  c, n, mass);
        int hits[2] = {0, 0}, other = 0;
        for (int d = 0; d < 64; d++) {
            int32_t id = -1;
            CHECK_EQ_INT(rt_sampler_next(&s, cases[c].x, cases[c].V, &id), RT_SAMPLE_ERR_NONE);
            if (id == cases[c].a)
                hits[0]++;
            else if (id == cases[c].b)
                hits[1]++;
            else
                other++;
        }
        CHECK_MSG(other == 0 && hits[0] > 8 && hits[1] > 8,
                  "case %zu: 64 draws gave %d x id %d, %d x id %d, %d others", c, hits[0],
                  cases[c].a, hits[1], cases[c].b, other);
        rt_sampler_free(&s);
    }
}

static void test_top_k_ties(void)
{
    /* HF keeps every id whose score is >= the k-th largest: with ties at the boundary more
     * than k ids survive. Fresh random values, then copies of the k-th largest planted. */
    enum { V = 40 };
    float x[V];
    for (int rep = 0; rep < 20; rep++) {
        fill_logits(x, V, 1.0f);
        int k = 1 + (int)(urand() * 10);
        float srt[V];
        memcpy(srt, x, sizeof(x));
        for (int i = 1; i < V; i++)
            for (int j = i; j > 0 && srt[j] > srt[j - 1]; j--) {
                float t = srt[j];
                srt[j] = srt[j - 1];
                srt[j - 1] = t;
            }
        float kth = srt[k - 1];
        int planted = 1 + (int)(urand() * 3);
        for (int i = 0, done = 0; i < V && done < planted; i++)
            if (x[i] < kth) {
                x[i] = kth;
                done++;
            }
        int want = 0;
        for (int i = 0; i < V; i++)
            want += x[i] >= kth;
        struct rt_sample_params p = rt_sample_params_default();
        p.top_k = k;
        struct rt_sampler s;
        CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
        int n = rt_sampler_candidates(&s, x, V);
        CHECK_MSG(n == want, "top-k %d with %d planted ties: %d survivors, expected %d", k,
                  planted, n, want);
        rt_sampler_free(&s);
    }
}

static void test_penalty_greedy(void)
{
    /* the penalty flips the argmax: a seen positive leader is divided, a seen negative id is
     * multiplied; the expected winner is computed from the penalised logits here */
    enum { V = 64 };
    float x[V];
    for (int rep = 0; rep < 20; rep++) {
        fill_logits(x, V, 1.0f);
        struct rt_sample_params p = rt_sample_params_default();
        p.temperature = 0;
        p.repeat_penalty = 1.0f + (float)urand() * 2.0f;
        struct rt_sampler s;
        CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
        float y[V];
        for (int i = 0; i < V; i++) {
            y[i] = x[i];
            if (urand() < 0.5) {
                rt_sampler_accept(&s, i);
                rt_sampler_accept(&s, i); /* twice: still penalised once */
                y[i] = x[i] < 0 ? x[i] * p.repeat_penalty : x[i] / p.repeat_penalty;
            }
        }
        int best = 0;
        for (int i = 1; i < V; i++)
            if (y[i] > y[best])
                best = i;
        int32_t id = -1;
        CHECK_EQ_INT(rt_sampler_next(&s, x, V, &id), RT_SAMPLE_ERR_NONE);
        CHECK_EQ_INT(id, best);
        rt_sampler_free(&s);
    }
}

static void test_freq_presence(void)
{
    /* OpenAI's frequency / presence penalties (vLLM applies them after the repetition
     * penalty, on generated tokens only): logits - f * count - p * (count > 0), recomputed
     * here; the sampler's candidates at temperature 1 must be the softmax of that */
    enum { V = 48 };
    float x[V];
    for (int rep = 0; rep < 20; rep++) {
        fill_logits(x, V, 1.0f);
        struct rt_sample_params p = rt_sample_params_default();
        p.frequency_penalty = (float)(urand() * 4.0 - 2.0);
        p.presence_penalty = (float)(urand() * 4.0 - 2.0);
        p.repeat_penalty = rep % 2 ? 1.0f : 1.5f;
        struct rt_sampler s;
        CHECK_EQ_INT(rt_sampler_init(&s, &p, V), RT_SAMPLE_ERR_NONE);
        double y[V], mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) {
            y[i] = x[i];
            if (i % 3 == 0) { /* a prompt token: only the repetition penalty */
                rt_sampler_accept(&s, i);
                y[i] = x[i] < 0 ? x[i] * p.repeat_penalty : x[i] / p.repeat_penalty;
            } else if (i % 3 == 1) { /* generated i % 5 + 1 times */
                const int c = i % 5 + 1;
                for (int k = 0; k < c; k++) {
                    rt_sampler_accept(&s, i);
                    rt_sampler_accept_output(&s, i);
                }
                y[i] = x[i] < 0 ? x[i] * p.repeat_penalty : x[i] / p.repeat_penalty;
                y[i] -= (double)p.frequency_penalty * c + p.presence_penalty;
            }
            mx = y[i] > mx ? y[i] : mx;
        }
        for (int i = 0; i < V; i++)
            sum += exp(y[i] - mx);
        const int32_t n = rt_sampler_candidates(&s, x, V);
        CHECK_EQ_INT(n, V);
        double worst = 0;
        for (int32_t j = 0; j < n && j < V; j++) {
            const double want = exp(y[s.cand[j]] - mx) / sum;
            worst = fmax(worst, fabs(s.prob[j] - want));
        }
        CHECK_MSG(worst < 1e-5, "frequency/presence: probabilities off by %g", worst);
        rt_sampler_free(&s);
    }
    struct rt_sample_params bad = rt_sample_params_default();
    bad.presence_penalty = 2.5f;
    struct rt_sampler s;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(rt_sampler_init(&s, &bad, 8), RT_SAMPLE_ERR_PARAM);
    qs_log_set_quiet(false);
    rt_sampler_free(&s);
}

static void test_seeds(void)
{
    enum { V = 500, N = 2000 };
    float x[V];
    fill_logits(x, V, 1.0f);
    struct rt_sample_params p = rt_sample_params_default();
    p.temperature = 1.0f;
    p.top_p = 0.95f;
    int32_t a[N], b[N], c[N], d[N];
    struct rt_sampler s1, s2, s3;
    p.seed = 42;
    CHECK_EQ_INT(rt_sampler_init(&s1, &p, V), RT_SAMPLE_ERR_NONE);
    CHECK_EQ_INT(rt_sampler_init(&s2, &p, V), RT_SAMPLE_ERR_NONE);
    p.seed = 43;
    CHECK_EQ_INT(rt_sampler_init(&s3, &p, V), RT_SAMPLE_ERR_NONE);
    for (int i = 0; i < N; i++) {
        rt_sampler_next(&s1, x, V, &a[i]);
        rt_sampler_next(&s2, x, V, &b[i]);
        rt_sampler_next(&s3, x, V, &c[i]);
    }
    rt_sampler_reset(&s1);
    for (int i = 0; i < N; i++)
        rt_sampler_next(&s1, x, V, &d[i]);
    CHECK(memcmp(a, b, sizeof(a)) == 0);
    CHECK(memcmp(a, d, sizeof(a)) == 0);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += a[i] == c[i];
    CHECK_MSG(same < N / 2, "seeds 42 and 43 agree on %d of %d draws", same, N);
    /* the uniforms are uniform: mean 1/2, variance 1/12 within 5 sigma for 1e6 draws */
    double m = 0, m2 = 0;
    const int U = 1000000;
    int out_of_range = 0;
    for (int i = 0; i < U; i++) {
        double u = rt_sampler_uniform(&s3);
        out_of_range += !(u >= 0 && u < 1);
        m += u;
        m2 += u * u;
    }
    CHECK_EQ_INT(out_of_range, 0);
    m /= U;
    m2 = m2 / U - m * m;
    CHECK_MSG(fabs(m - 0.5) < 5 * sqrt(1.0 / 12 / U), "uniform mean %g", m);
    CHECK_MSG(fabs(m2 - 1.0 / 12) < 5 * sqrt(1.0 / 180 / U), "uniform variance %g", m2);
    rt_sampler_free(&s1);
    rt_sampler_free(&s2);
    rt_sampler_free(&s3);
}

static void test_errors(void)
{
    qs_log_set_quiet(true);
    struct rt_sampler s;
    struct rt_sample_params p = rt_sample_params_default();
    struct rt_sample_params bad[6];
    for (int i = 0; i < 6; i++)
        bad[i] = p;
    bad[0].temperature = -1;
    bad[1].temperature = NAN;
    bad[2].top_k = -3;
    bad[3].top_p = 0;
    bad[4].min_p = 1.5f;
    bad[5].repeat_penalty = 0;
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(rt_sampler_init(&s, &bad[i], 10), RT_SAMPLE_ERR_PARAM);
        CHECK(s.work == NULL);
        rt_sampler_free(&s);
    }
    CHECK_EQ_INT(rt_sampler_init(&s, &p, 0), RT_SAMPLE_ERR_PARAM);
    CHECK_EQ_INT(rt_sampler_init(&s, &p, 10), RT_SAMPLE_ERR_NONE);
    CHECK_EQ_INT(rt_sampler_accept(&s, 10), RT_SAMPLE_ERR_TOKEN);
    CHECK_EQ_INT(rt_sampler_accept(&s, -1), RT_SAMPLE_ERR_TOKEN);
    float x[10];
    for (int i = 0; i < 10; i++)
        x[i] = (i % 2) ? -INFINITY : NAN;
    int32_t id = 77;
    CHECK_EQ_INT(rt_sampler_next(&s, x, 10, &id), RT_SAMPLE_ERR_NO_CANDIDATE);
    CHECK_EQ_INT(id, 77);
    x[9] = -1e30f; /* one finite id among NaNs: greedy and sampled both pick it */
    CHECK_EQ_INT(rt_sampler_next(&s, x, 10, &id), RT_SAMPLE_ERR_NONE);
    CHECK_EQ_INT(id, 9);
    rt_sampler_free(&s);
    rt_sampler_free(&s); /* idempotent */
    CHECK(strcmp(rt_sample_err_str(RT_SAMPLE_ERR_TOKEN), "token id outside the vocabulary") == 0);
    qs_log_set_quiet(false);
}

int main(void)
{
    T_INIT("sample");
    const char *seed = getenv("QSHARD_TEST_SEED");
    if (seed)
        g_state = strtoull(seed, NULL, 10);
    test_greedy();
    test_padded_vocab();
    test_vocab_limit();
    test_distributions();
    test_top_p_boundary();
    test_inf_logits();
    test_top_k_ties();
    test_penalty_greedy();
    test_freq_presence();
    test_seeds();
    test_errors();
    return t_done();
}

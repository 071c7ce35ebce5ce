/*
 * t_model.h - what the runtime-model tests share (tests/test_model*.c): a seeded RNG, relative
 * L2 errors, synthetic models (random canonical AWQ weights for small llama / mistral / qwen2 /
 * mixtral shapes), an independent double-precision forward pass of them, a writer of their
 * rank files under DESIGN 5's TP rules (with deliberate corruptions for the error tests), the
 * executor on the CPU backend, and an fp16-activation backend emulated on the CPU.
 *
 * Included once by each test program (static functions, T_FN: not every program uses all).
 */
#ifndef QS_T_MODEL_H
#define QS_T_MODEL_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt.h"
#include "fmt_write.h"
#include "qs_log.h"
#include "ref.h"
#include "rt.h"
#include "rt_backend.h" /* the emulated backend */
#include "rt_sample.h"
#include "t.h"

#define T_FN static __attribute__((unused))

// --- random numbers ---------------------------------------------------------------------------

static uint64_t rng = 0x243f6a8885a308d3ull;

T_FN uint32_t rnd_u32(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

T_FN float rnd_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd_u32() >> 8) / 16777216.0f;
}

T_FN void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "test_model: out of memory\n");
        abort();
    }
    return p;
}

T_FN double rel_l2(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

T_FN double rel_l2_f(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

// --- synthetic model: canonical weights --------------------------------------------------------

/* One AWQ linear in canonical form (DESIGN 4): codes [K][N], zeros and fp16 scales [K/G][N]. */
struct qlin {
    int K, N;
    uint8_t *q, *z;
    uint16_t *s;
    float *bias; /* [N] or NULL */
    bool f16;    /* store unquantised (fp16 [N][K] of the dequantised values) */
};

struct syn_spec {
    const char *arch;
    int H, I, L, nh, nkv, hd, V, G, E, topk, window;
    bool tie, qkv_bias, o_bias, f16_down1; /* f16_down1: layer 1 down_proj unquantised */
    bool llama3;                             /* llama3 rope scaling with L = 32 */
    double theta;
};

struct syn_layer {
    struct qlin q, k, v, o, gate, up, down;
    float *attn_norm, *mlp_norm;
    float *router;                  /* [E][H] */
    struct qlin *eg, *eu, *ed;      /* experts w1 (gate), w3 (up), w2 (down) */
};

struct syn_model {
    struct syn_spec sp;
    uint16_t *embed, *lm_head;      /* [V][H] fp16 */
    float *final_norm;
    struct syn_layer *layers;
    uint8_t model_id[16];
};

T_FN void qlin_init(struct qlin *l, int K, int N, int G, float smax)
{
    l->K = K, l->N = N;
    l->q = xcalloc((size_t)K * N, 1);
    l->z = xcalloc((size_t)(K / G) * N, 1);
    l->s = xcalloc((size_t)(K / G) * N, 2);
    for (size_t i = 0; i < (size_t)K * N; i++)
        l->q[i] = rnd_u32() & 15;
    for (size_t i = 0; i < (size_t)(K / G) * N; i++) {
        l->z[i] = rnd_u32() & 15;
        l->s[i] = ref_f32_to_f16(rnd_uniform(0.3f, 1.0f) * smax);
    }
}

T_FN void qlin_free(struct qlin *l)
{
    free(l->q), free(l->z), free(l->s), free(l->bias);
}

T_FN double qlin_w(const struct qlin *l, int G, int k, int n)
{
    size_t gi = (size_t)(k / G) * l->N + n;
    return ((int)l->q[(size_t)k * l->N + n] - (int)l->z[gi]) * (double)ref_f16_to_f32(l->s[gi]);
}

T_FN float *rand_vec(int n, float lo, float hi)
{
    float *v = xcalloc((size_t)n, sizeof(float));
    for (int i = 0; i < n; i++)
        v[i] = rnd_uniform(lo, hi);
    return v;
}

T_FN uint16_t *rand_f16(size_t n, float lo, float hi)
{
    uint16_t *v = xcalloc(n, 2);
    for (size_t i = 0; i < n; i++)
        v[i] = ref_f32_to_f16(rnd_uniform(lo, hi));
    return v;
}

T_FN void syn_build(struct syn_model *m, const struct syn_spec *sp)
{
    memset(m, 0, sizeof(*m));
    m->sp = *sp;
    int H = sp->H, G = sp->G, qd = sp->nh * sp->hd, kvd = sp->nkv * sp->hd;
    /* scale sizes chosen so activations stay O(1): |w| ~ 8 * smax */
    float sH = 0.5f / (8 * sqrtf((float)H)), sQ = 0.5f / (8 * sqrtf((float)qd));
    float sI = 0.5f / (8 * sqrtf((float)sp->I));
    m->embed = rand_f16((size_t)sp->V * H, -1, 1);
    m->lm_head = sp->tie ? NULL : rand_f16((size_t)sp->V * H, -0.2f, 0.2f);
    m->final_norm = rand_vec(H, 0.8f, 1.2f);
    m->layers = xcalloc((size_t)sp->L, sizeof(*m->layers));
    for (int l = 0; l < sp->L; l++) {
        struct syn_layer *y = &m->layers[l];
        y->attn_norm = rand_vec(H, 0.8f, 1.2f);
        y->mlp_norm = rand_vec(H, 0.8f, 1.2f);
        qlin_init(&y->q, H, qd, G, sH * 4);
        qlin_init(&y->k, H, kvd, G, sH * 4);
        qlin_init(&y->v, H, kvd, G, sH);
        qlin_init(&y->o, qd, H, G, sQ);
        if (sp->qkv_bias) {
            y->q.bias = rand_vec(qd, -0.5f, 0.5f);
            y->k.bias = rand_vec(kvd, -0.5f, 0.5f);
            y->v.bias = rand_vec(kvd, -0.5f, 0.5f);
        }
        if (sp->o_bias)
            y->o.bias = rand_vec(H, -0.2f, 0.2f);
        if (sp->E == 0) {
            qlin_init(&y->gate, H, sp->I, G, sH);
            qlin_init(&y->up, H, sp->I, G, sH);
            qlin_init(&y->down, sp->I, H, G, sI);
            y->down.f16 = sp->f16_down1 && l == 1;
            continue;
        }
        y->router = rand_vec(sp->E * H, -0.3f, 0.3f);
        y->eg = xcalloc((size_t)sp->E, sizeof(struct qlin));
        y->eu = xcalloc((size_t)sp->E, sizeof(struct qlin));
        y->ed = xcalloc((size_t)sp->E, sizeof(struct qlin));
        for (int e = 0; e < sp->E; e++) {
            qlin_init(&y->eg[e], H, sp->I, G, sH);
            qlin_init(&y->eu[e], H, sp->I, G, sH);
            qlin_init(&y->ed[e], sp->I, H, G, sI);
        }
    }
    for (int i = 0; i < 16; i++)
        m->model_id[i] = (uint8_t)rnd_u32();
}

T_FN void syn_free(struct syn_model *m)
{
    for (int l = 0; l < m->sp.L; l++) {
        struct syn_layer *y = &m->layers[l];
        free(y->attn_norm), free(y->mlp_norm), free(y->router);
        qlin_free(&y->q), qlin_free(&y->k), qlin_free(&y->v), qlin_free(&y->o);
        if (m->sp.E == 0) {
            qlin_free(&y->gate), qlin_free(&y->up), qlin_free(&y->down);
            continue;
        }
        for (int e = 0; e < m->sp.E; e++)
            qlin_free(&y->eg[e]), qlin_free(&y->eu[e]), qlin_free(&y->ed[e]);
        free(y->eg), free(y->eu), free(y->ed);
    }
    free(m->layers), free(m->embed), free(m->lm_head), free(m->final_norm);
}

// --- independent reference forward (double precision) ----------------------------------------

T_FN void d_rmsnorm(double *out, const double *h, const float *w, int H, double eps)
{
    double ss = 0;
    for (int i = 0; i < H; i++)
        ss += h[i] * h[i];
    double r = 1 / sqrt(ss / H + eps);
    for (int i = 0; i < H; i++)
        out[i] = w[i] * h[i] * r;
}

/* y[N] = x[K] . W + bias with W dequantised from canonical codes. */
T_FN void d_linear(double *y, const double *x, const struct qlin *l, int G)
{
    for (int n = 0; n < l->N; n++)
        y[n] = l->bias ? l->bias[n] : 0;
    for (int k = 0; k < l->K; k++)
        for (int n = 0; n < l->N; n++) {
            double w = qlin_w(l, G, k, n);
            if (l->f16) /* stored as fp16: the runtime sees the rounded value */
                w = ref_f16_to_f32(ref_f32_to_f16((float)w));
            y[n] += x[k] * w;
        }
}

T_FN void d_inv_freq(double *f, const struct syn_spec *sp)
{
    for (int i = 0; i < sp->hd / 2; i++) {
        double v = 1 / pow(sp->theta, 2.0 * i / sp->hd);
        if (sp->llama3) { /* factor 4, low 1, high 4, original 32 */
            double wl = 2 * M_PI / v, L = 32;
            if (wl > L / 1)
                v = v / 4;
            else if (wl >= L / 4) {
                double sm = (L / wl - 1) / (4 - 1);
                v = (1 - sm) * v / 4 + sm * v;
            }
        }
        f[i] = v;
    }
}

T_FN void d_rope(double *x, int n_heads, int hd, int pos, const double *inv)
{
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hd / 2; i++) {
            double a = pos * inv[i], c = cos(a), s = sin(a);
            double *v = x + h * hd, x1 = v[i], x2 = v[i + hd / 2];
            v[i] = x1 * c - x2 * s;
            v[i + hd / 2] = x2 * c + x1 * s;
        }
}

T_FN void d_mlp(double *out, const double *x, const struct qlin *g, const struct qlin *u,
                  const struct qlin *d, int G, int I)
{
    double *gv = xcalloc((size_t)I, 8), *uv = xcalloc((size_t)I, 8);
    d_linear(gv, x, g, G);
    d_linear(uv, x, u, G);
    for (int i = 0; i < I; i++)
        gv[i] = gv[i] / (1 + exp(-gv[i])) * uv[i];
    d_linear(out, gv, d, G);
    free(gv), free(uv);
}

/* logits [T][V] of tokens[0..T) from position 0. */
T_FN void d_forward(const struct syn_model *m, const int32_t *tok, int T, double *logits)
{
    const struct syn_spec *sp = &m->sp;
    int H = sp->H, hd = sp->hd, nh = sp->nh, nkv = sp->nkv, G = sp->G;
    double eps = 1e-5;
    double *h = xcalloc((size_t)T * H, 8), *x = xcalloc(H, 8), *o = xcalloc(H, 8);
    double *q = xcalloc((size_t)T * nh * hd, 8), *k = xcalloc((size_t)T * nkv * hd, 8);
    double *v = xcalloc((size_t)T * nkv * hd, 8), *att = xcalloc((size_t)nh * hd, 8);
    double *inv = xcalloc((size_t)hd / 2, 8), *sc = xcalloc((size_t)T, 8), *tmp = xcalloc(H, 8);
    d_inv_freq(inv, sp);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++)
            h[(size_t)t * H + i] = ref_f16_to_f32(m->embed[(size_t)tok[t] * H + i]);
    for (int l = 0; l < sp->L; l++) {
        const struct syn_layer *y = &m->layers[l];
        for (int t = 0; t < T; t++) {
            d_rmsnorm(x, h + (size_t)t * H, y->attn_norm, H, eps);
            d_linear(q + (size_t)t * nh * hd, x, &y->q, G);
            d_linear(k + (size_t)t * nkv * hd, x, &y->k, G);
            d_linear(v + (size_t)t * nkv * hd, x, &y->v, G);
            d_rope(q + (size_t)t * nh * hd, nh, hd, t, inv);
            d_rope(k + (size_t)t * nkv * hd, nkv, hd, t, inv);
        }
        for (int t = 0; t < T; t++) {
            for (int hh = 0; hh < nh; hh++) {
                int kh = hh / (nh / nkv), lo = 0;
                if (sp->window > 0 && t - sp->window + 1 > 0)
                    lo = t - sp->window + 1;
                double mx = -INFINITY, sum = 0;
                for (int j = lo; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += q[((size_t)t * nh + hh) * hd + i] * k[((size_t)j * nkv + kh) * hd + i];
                    sc[j] = d / sqrt(hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = lo; j <= t; j++)
                    sum += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = lo; j <= t; j++)
                        a += sc[j] / sum * v[((size_t)j * nkv + kh) * hd + i];
                    att[hh * hd + i] = a;
                }
            }
            d_linear(o, att, &y->o, G);
            for (int i = 0; i < H; i++)
                h[(size_t)t * H + i] += o[i];
        }
        for (int t = 0; t < T; t++) {
            d_rmsnorm(x, h + (size_t)t * H, y->mlp_norm, H, eps);
            if (sp->E == 0) {
                d_mlp(o, x, &y->gate, &y->up, &y->down, G, sp->I);
            } else {
                double p[16], mx = -INFINITY, sum = 0;
                int chosen[16] = {0};
                for (int e = 0; e < sp->E; e++) {
                    double d = 0;
                    for (int i = 0; i < H; i++)
                        d += x[i] * (double)y->router[e * H + i];
                    p[e] = d;
                    mx = fmax(mx, d);
                }
                for (int e = 0; e < sp->E; e++)
                    sum += (p[e] = exp(p[e] - mx));
                double kept = 0;
                for (int j = 0; j < sp->topk; j++) {
                    int best = -1;
                    for (int e = 0; e < sp->E; e++)
                        if (!chosen[e] && (best < 0 || p[e] > p[best]))
                            best = e;
                    chosen[best] = 1;
                    kept += p[best] / sum;
                }
                memset(o, 0, (size_t)H * 8);
                for (int e = 0; e < sp->E; e++) {
                    if (!chosen[e])
                        continue;
                    d_mlp(tmp, x, &y->eg[e], &y->eu[e], &y->ed[e], G, sp->I);
                    for (int i = 0; i < H; i++)
                        o[i] += p[e] / sum / kept * tmp[i];
                }
            }
            for (int i = 0; i < H; i++)
                h[(size_t)t * H + i] += o[i];
        }
    }
    const uint16_t *head = sp->tie ? m->embed : m->lm_head;
    for (int t = 0; t < T; t++) {
        d_rmsnorm(x, h + (size_t)t * H, m->final_norm, H, eps);
        for (int n = 0; n < sp->V; n++) {
            double a = 0;
            for (int i = 0; i < H; i++)
                a += x[i] * ref_f16_to_f32(head[(size_t)n * H + i]);
            logits[(size_t)t * sp->V + n] = a;
        }
    }
    free(h), free(x), free(o), free(q), free(k), free(v), free(att), free(inv), free(sc);
    free(tmp);
}

// --- writing rank files (DESIGN 5 split rules) --------------------------------------------------

struct tbuf {
    char name[256];
    enum fmt_dtype dt;
    enum fmt_layout lay;
    uint32_t nd;
    uint64_t shape[2];
    void *data; /* owned */
    size_t size;
};

struct tlist {
    struct tbuf t[512];
    int n;
};

T_FN void tl_add(struct tlist *l, const char *name, enum fmt_dtype dt, enum fmt_layout lay,
                   uint32_t nd, uint64_t d0, uint64_t d1, void *data, size_t size)
{
    if (l->n == 512)
        abort();
    struct tbuf *t = &l->t[l->n++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->dt = dt, t->lay = lay, t->nd = nd, t->shape[0] = d0, t->shape[1] = d1;
    t->data = data, t->size = size;
}

T_FN void tl_free(struct tlist *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->t[i].data);
    l->n = 0;
}

/* Which ways to break a rank file. */
enum corrupt {
    CORRUPT_NONE,
    CORRUPT_MISSING,       /* drop model.layers.1.post_attention_layernorm.weight */
    CORRUPT_WRONG_LAYOUT,  /* layer 0 o_proj.scales written ROW_MAJOR */
    CORRUPT_SHAPE,         /* model.norm.weight one element too long */
    CORRUPT_EXTRA,         /* an unused q_norm tensor (a Qwen3 feature) */
    CORRUPT_TOKEN_CONFIG,  /* config with vocab_size_per_rank off by one */
    CORRUPT_GROUP,         /* layer 0 o_proj with one group over all its rows (> group_size) */
};

T_FN int gcd_i(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b, b = t;
    }
    return a;
}

/* Slice of a canonical linear: columns cols[0..nc) (-1 = zero padding), rows [r0, r0 + nr_real)
 * padded with zero rows to nr; then packed (or fp16) and added under `prefix`. The slice's
 * group size is Gl = gcd(G, nr, r0) (DESIGN 4 local group size: a rank holding part of a group
 * of G rows gets groups of Gl rows, each repeating its source group's scale and zero row);
 * nr_real must be a multiple of Gl or nr. */
T_FN void add_linear(struct tlist *tl, const char *prefix, const struct qlin *l, int G,
                       const int *cols, int nc, int r0, int nr_real, int nr, bool with_bias)
{
    char name[200];
    int Gl = gcd_i(gcd_i(G, nr), r0), ng = nr / Gl;
    uint8_t *q = xcalloc((size_t)nr * nc, 1), *z = xcalloc((size_t)ng * nc, 1);
    uint16_t *s = xcalloc((size_t)ng * nc, 2);
    for (int c = 0; c < nc; c++) {
        if (cols[c] < 0)
            continue;
        for (int r = 0; r < nr_real; r++)
            q[(size_t)r * nc + c] = l->q[(size_t)(r0 + r) * l->N + cols[c]];
        for (int g = 0; g < (nr_real + Gl - 1) / Gl; g++) {
            z[(size_t)g * nc + c] = l->z[(size_t)((r0 + g * Gl) / G) * l->N + cols[c]];
            s[(size_t)g * nc + c] = l->s[(size_t)((r0 + g * Gl) / G) * l->N + cols[c]];
        }
    }
    if (l->f16) {
        uint16_t *w = xcalloc((size_t)nr * nc, 2);
        for (int c = 0; c < nc; c++)
            for (int r = 0; r < nr_real; r++)
                if (cols[c] >= 0)
                    w[(size_t)c * nr + r] = ref_f32_to_f16((float)qlin_w(l, G, r0 + r, cols[c]));
        snprintf(name, sizeof(name), "%s.weight", prefix);
        tl_add(tl, name, FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, nc, nr, w, (size_t)nr * nc * 2);
    } else {
        uint8_t *qp = xcalloc((size_t)nr * nc / 2, 1), *zp = xcalloc((size_t)ng * nc / 2, 1);
        uint16_t *sp = xcalloc((size_t)ng * nc, 2);
        if (ref_pack_w4(q, nr, nc, qp) || ref_pack_zeros(z, ng, nc, zp) ||
            ref_pack_scales(s, ng, nc, sp))
            abort();
        snprintf(name, sizeof(name), "%s.qweight", prefix);
        tl_add(tl, name, FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, nr, nc, qp, (size_t)nr * nc / 2);
        snprintf(name, sizeof(name), "%s.qzeros", prefix);
        tl_add(tl, name, FMT_DTYPE_Q4, FMT_LAYOUT_Z4_T64, 2, ng, nc, zp, (size_t)ng * nc / 2);
        snprintf(name, sizeof(name), "%s.scales", prefix);
        tl_add(tl, name, FMT_DTYPE_F16, FMT_LAYOUT_S_T64, 2, ng, nc, sp, (size_t)ng * nc * 2);
    }
    if (with_bias && l->bias) {
        float *b = xcalloc((size_t)nc, 4);
        for (int c = 0; c < nc; c++)
            b[c] = cols[c] >= 0 ? l->bias[cols[c]] : 0;
        snprintf(name, sizeof(name), "%s.bias", prefix);
        tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, nc, 0, b, (size_t)nc * 4);
    }
    free(q), free(z), free(s);
}

/* A fused per-rank linear from several canonical linears' column ranges: parts[i] gives the
 * source and its [c0, c0 + n) columns, padded with zero columns to width[i]. Biases are fused
 * the same way when any part has one. */
struct part {
    const struct qlin *l;
    int c0, n, width;
};

T_FN void add_fused(struct tlist *tl, const char *prefix, const struct part *parts, int np,
                      int G)
{
    int nc = 0;
    for (int i = 0; i < np; i++)
        nc += parts[i].width;
    /* build a temporary canonical linear holding the concatenated columns */
    struct qlin f = {0};
    int K = parts[0].l->K;
    f.K = K, f.N = nc, f.f16 = parts[0].l->f16;
    f.q = xcalloc((size_t)K * nc, 1);
    f.z = xcalloc((size_t)(K / G) * nc, 1);
    f.s = xcalloc((size_t)(K / G) * nc, 2);
    bool any_bias = false;
    for (int i = 0; i < np; i++)
        any_bias |= parts[i].l->bias != NULL;
    if (any_bias)
        f.bias = xcalloc((size_t)nc, 4);
    int c = 0;
    for (int i = 0; i < np; i++) {
        const struct qlin *l = parts[i].l;
        for (int j = 0; j < parts[i].n; j++, c++) {
            int sc = parts[i].c0 + j;
            for (int k = 0; k < K; k++)
                f.q[(size_t)k * nc + c] = l->q[(size_t)k * l->N + sc];
            for (int g = 0; g < K / G; g++) {
                f.z[(size_t)g * nc + c] = l->z[(size_t)g * l->N + sc];
                f.s[(size_t)g * nc + c] = l->s[(size_t)g * l->N + sc];
            }
            if (l->bias)
                f.bias[c] = l->bias[sc];
        }
        c += parts[i].width - parts[i].n; /* zero padding columns */
    }
    int *cols = xcalloc((size_t)nc, sizeof(int));
    for (int j = 0; j < nc; j++)
        cols[j] = j;
    add_linear(tl, prefix, &f, G, cols, nc, 0, K, K, true);
    free(cols);
    qlin_free(&f);
}

T_FN int lcm(int a, int b)
{
    int x = a, y = b;
    while (y) {
        int t = x % y;
        x = y, y = t;
    }
    return a / x * b;
}

T_FN void config_json(char *buf, size_t n, const struct syn_spec *sp, int ws, int rank,
                        int vr_delta)
{
    int U = lcm(sp->G, 64);
    int Ipad = (sp->I + U * ws - 1) / (U * ws) * U * ws;
    int kvr = ws <= sp->nkv ? sp->nkv / ws : 1, rep = ws <= sp->nkv ? 1 : ws / sp->nkv;
    char rope[200] = "null", win[32] = "null";
    if (sp->llama3)
        snprintf(rope, sizeof(rope), "{\"rope_type\": \"llama3\", \"factor\": 4.0, "
                 "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                 "\"original_max_position_embeddings\": 32}");
    if (sp->window)
        snprintf(win, sizeof(win), "%d", sp->window);
    snprintf(buf, n,
             "{\"qshard_config_version\": 1, \"architecture\": \"%s\", \"hidden_size\": %d, "
             "\"intermediate_size\": %d, \"intermediate_size_padded\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
             "\"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
             "\"vocab_size_per_rank\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": %g, "
             "\"rope_scaling\": %s, \"max_position_embeddings\": 64, "
             "\"tie_word_embeddings\": %s, \"sliding_window\": %s, \"attention_bias\": %s, "
             "\"num_local_experts\": %d, \"num_experts_per_tok\": %d, "
             "\"quant\": {\"w_bit\": 4, \"group_size\": %d, \"zero_point\": true, "
             "\"source_variant\": \"gemm\", \"source_container\": \"safetensors\", "
             "\"modules_to_not_convert\": []}, \"bos_token_id\": 1, \"eos_token_id\": [2], "
             "\"tp\": {\"world_size\": %d, \"rank\": %d, \"heads_per_rank\": %d, "
             "\"kv_heads_per_rank\": %d, \"kv_head_replicas\": %d, "
             "\"intermediate_per_rank\": %d}}",
             sp->arch, sp->H, sp->I, Ipad, sp->L, sp->nh, sp->nkv, sp->hd, sp->V,
             (sp->V + ws - 1) / ws + vr_delta, sp->theta, rope, sp->tie ? "true" : "false", win,
             sp->qkv_bias ? "true" : "false", sp->E, sp->topk, sp->G, ws, rank, sp->nh / ws,
             kvr, rep, Ipad / ws);
}

/* Tensors of rank `rank` of a TP-ws split of m (DESIGN 5). */
T_FN void rank_tensors(struct tlist *tl, const struct syn_model *m, int ws, int rank,
                         enum corrupt cor)
{
    const struct syn_spec *sp = &m->sp;
    int H = sp->H, hd = sp->hd, G = sp->G;
    int Vr = (sp->V + ws - 1) / ws;
    int U = lcm(G, 64), Ipad = (sp->I + U * ws - 1) / (U * ws) * U * ws, Ir = Ipad / ws;
    int nq = sp->nh / ws, nkv = ws <= sp->nkv ? sp->nkv / ws : 1;
    int kv0 = ws <= sp->nkv ? rank * nkv : rank / (ws / sp->nkv);
    char name[240];

    uint16_t *emb = xcalloc((size_t)Vr * H, 2), *head = NULL;
    for (int v = 0; v < Vr && rank * Vr + v < sp->V; v++)
        memcpy(emb + (size_t)v * H, m->embed + (size_t)(rank * Vr + v) * H, (size_t)H * 2);
    tl_add(tl, "model.embed_tokens.weight", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, Vr, H, emb,
           (size_t)Vr * H * 2);
    if (!sp->tie) {
        head = xcalloc((size_t)Vr * H, 2);
        for (int v = 0; v < Vr && rank * Vr + v < sp->V; v++)
            memcpy(head + (size_t)v * H, m->lm_head + (size_t)(rank * Vr + v) * H, (size_t)H * 2);
        tl_add(tl, "lm_head.weight", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, Vr, H, head,
               (size_t)Vr * H * 2);
    }
    int nlen = cor == CORRUPT_SHAPE ? H + 1 : H;
    float *fn = xcalloc((size_t)nlen, 4);
    memcpy(fn, m->final_norm, (size_t)H * 4);
    tl_add(tl, "model.norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, nlen, 0, fn,
           (size_t)nlen * 4);
    if (cor == CORRUPT_EXTRA)
        tl_add(tl, "model.layers.0.self_attn.q_norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR,
               1, hd, 0, rand_vec(hd, 0.9f, 1.1f), (size_t)hd * 4);

    for (int l = 0; l < sp->L; l++) {
        const struct syn_layer *y = &m->layers[l];
        float *an = xcalloc((size_t)H, 4), *mn = xcalloc((size_t)H, 4);
        memcpy(an, y->attn_norm, (size_t)H * 4);
        memcpy(mn, y->mlp_norm, (size_t)H * 4);
        snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", l);
        tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, H, 0, an, (size_t)H * 4);
        snprintf(name, sizeof(name), "model.layers.%d.post_attention_layernorm.weight", l);
        if (cor == CORRUPT_MISSING && l == 1)
            free(mn);
        else
            tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, H, 0, mn, (size_t)H * 4);

        struct part qkv[3] = {{&y->q, rank * nq * hd, nq * hd, nq * hd},
                              {&y->k, kv0 * hd, nkv * hd, nkv * hd},
                              {&y->v, kv0 * hd, nkv * hd, nkv * hd}};
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.qkv_proj", l);
        add_fused(tl, name, qkv, 3, G);

        int *cols = xcalloc((size_t)(H > 2 * Ir ? H : 2 * Ir), sizeof(int));
        for (int c = 0; c < H; c++)
            cols[c] = c;
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.o_proj", l);
        if (cor == CORRUPT_GROUP && l == 0) { /* G' = K_r: one group, larger than group_size */
            struct qlin o1 = y->o;
            o1.z = xcalloc((size_t)o1.N, 1);
            o1.s = xcalloc((size_t)o1.N, 2);
            memcpy(o1.z, y->o.z, (size_t)o1.N);
            memcpy(o1.s, y->o.s, (size_t)o1.N * 2);
            add_linear(tl, name, &o1, o1.K, cols, H, 0, o1.K, o1.K, rank == 0);
            free(o1.z), free(o1.s);
        } else {
            add_linear(tl, name, &y->o, G, cols, H, rank * nq * hd, nq * hd, nq * hd, rank == 0);
        }
        if (cor == CORRUPT_WRONG_LAYOUT && l == 0)
            for (int i = 0; i < tl->n; i++)
                if (strcmp(tl->t[i].name, "model.layers.0.self_attn.o_proj.scales") == 0)
                    tl->t[i].lay = FMT_LAYOUT_ROW_MAJOR;

        int i0 = rank * Ir, ireal = sp->I - i0 < Ir ? (sp->I - i0 > 0 ? sp->I - i0 : 0) : Ir;
        int E = sp->E ? sp->E : 1;
        for (int e = 0; e < E; e++) {
            const struct qlin *g = sp->E ? &y->eg[e] : &y->gate, *u = sp->E ? &y->eu[e] : &y->up;
            const struct qlin *d = sp->E ? &y->ed[e] : &y->down;
            char pre[128];
            if (sp->E)
                snprintf(pre, sizeof(pre), "model.layers.%d.block_sparse_moe.experts.%d", l, e);
            else
                snprintf(pre, sizeof(pre), "model.layers.%d.mlp", l);
            struct part gu[2] = {{g, i0, ireal, Ir}, {u, i0, ireal, Ir}};
            snprintf(name, sizeof(name), "%s.gate_up_proj", pre);
            add_fused(tl, name, gu, 2, G);
            snprintf(name, sizeof(name), "%s.down_proj", pre);
            add_linear(tl, name, d, G, cols, H, i0, ireal, Ir, rank == 0);
        }
        if (sp->E) {
            float *rt = xcalloc((size_t)sp->E * H, 4);
            memcpy(rt, y->router, (size_t)sp->E * H * 4);
            snprintf(name, sizeof(name), "model.layers.%d.block_sparse_moe.gate.weight", l);
            tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 2, sp->E, H, rt,
                   (size_t)sp->E * H * 4);
        }
        free(cols);
    }
}

T_FN int write_rank(const struct syn_model *m, const char *path, int ws, int rank,
                      enum corrupt cor, const uint8_t *model_id)
{
    struct tlist *tl = xcalloc(1, sizeof(*tl));
    char cfg[4096];
    config_json(cfg, sizeof(cfg), &m->sp, ws, rank, cor == CORRUPT_TOKEN_CONFIG ? 1 : 0);
    rank_tensors(tl, m, ws, rank, cor);
    struct fmt_writer_opts o = {(uint32_t)rank, (uint32_t)ws, {0}};
    memcpy(o.model_id, model_id ? model_id : m->model_id, 16);
    struct fmt_writer *w;
    int rc = -1;
    if (fmt_writer_open(path, &o, &w))
        goto out;
    if (fmt_writer_set_section(w, FMT_SECTION_CONFIG, cfg, strlen(cfg)))
        goto abort;
    uint32_t idx[512];
    for (int i = 0; i < tl->n; i++)
        if (fmt_writer_add_tensor(w, tl->t[i].name, tl->t[i].dt, tl->t[i].lay, tl->t[i].nd,
                                  tl->t[i].shape, FMT_SPLIT_NONE, 0, &idx[i]))
            goto abort;
    if (fmt_writer_begin_data(w))
        goto abort;
    for (int i = 0; i < tl->n; i++)
        if (fmt_writer_put_tensor(w, idx[i], tl->t[i].data, tl->t[i].size))
            goto abort;
    rc = fmt_writer_finish(w) ? -1 : 0;
    goto out;
abort:
    fmt_writer_abort(w);
out:
    tl_free(tl);
    free(tl);
    return rc;
}

/* Write a TP-ws set into dir (created) with its manifest. */
T_FN int write_set(const struct syn_model *m, const char *dir, int ws, enum corrupt cor)
{
    char path[640];
    mkdir(dir, 0755);
    for (int r = 0; r < ws; r++) {
        char fname[64];
        fmt_rank_file_name(fname, sizeof(fname), (uint32_t)r, (uint32_t)ws);
        snprintf(path, sizeof(path), "%s/%s", dir, fname);
        if (write_rank(m, path, ws, r, cor, NULL))
            return -1;
    }
    return fmt_manifest_write(dir, (uint32_t)ws) ? -1 : 0;
}

T_FN void rm_rf(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_model: could not remove %s\n", dir);
}


// --- the synthetic models every test program runs ------------------------------------------------

struct t_case {
    const char *label;
    struct syn_spec sp;
    int tps[3];
    int n_tp;
};

/* The shapes: llama (GQA 4/2, head_dim 64 != H/heads, llama3 rope, odd vocab, padded I, an fp16
 * linear), qwen2 (qkv biases, tied embeddings, o_proj bias on rank 0 only, MHA), mistral
 * (sliding window 5 over 12 tokens), llama-g128 (the fixtures' shape: at TP-4 o_proj holds 64
 * rows of each 128-row group, stored with local group size 64, DESIGN 4), mixtral (4 experts,
 * top-2). */
T_FN const struct t_case *t_cases(int *n)
{
    static const struct t_case cases[] = {
        {"llama", {"llama", 128, 160, 2, 4, 2, 64, 101, 32, 0, 0, 0, false, false, false, true,
                   true, 10000.0}, {1, 2, 4}, 3},
        {"qwen2", {"qwen2", 128, 256, 2, 2, 2, 64, 77, 64, 0, 0, 0, true, true, true, false,
                   false, 1000000.0}, {1, 2, 0}, 2},
        {"mistral", {"mistral", 128, 128, 2, 4, 1, 32 * 2, 64, 32, 0, 0, 5, false, false, false,
                     false, false, 10000.0}, {1, 2, 4}, 3},
        {"llama-g128", {"llama", 256, 256, 2, 4, 2, 64, 101, 128, 0, 0, 0, false, false, false,
                        false, false, 10000.0}, {1, 2, 4}, 3},
        {"mixtral", {"mixtral", 128, 128, 2, 4, 2, 64, 90, 32, 4, 2, 0, false, false, false,
                     false, false, 1000000.0}, {1, 2, 0}, 2},
    };
    *n = (int)(sizeof(cases) / sizeof(cases[0]));
    return cases;
}

// --- the executor on the CPU ---------------------------------------------------------------------

static char tmp_root[256];

/* A fresh temp directory for this program's files (tmp_root); false with a message on failure. */
T_FN bool t_tmp_root(const char *prog)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp_root, sizeof(tmp_root), "%s/qshard-%s-XXXXXX", tmp, prog);
    if (!mkdtemp(tmp_root)) {
        fprintf(stderr, "%s: mkdtemp %s: %s\n", prog, tmp_root, strerror(errno));
        return false;
    }
    return true;
}

T_FN struct rt_opts cpu_opts(int n_ctx, int max_batch, int threads)
{
    struct rt_opts o = rt_opts_default();
    o.device = RT_DEVICE_CPU;
    o.n_ctx = n_ctx;
    o.max_batch = max_batch;
    o.n_threads = threads;
    return o;
}

/* All-position logits of tok[0..T) of slot 0 on an opened executor; NULL on failure. */
T_FN float *exec_logits(struct rt_exec *e, const int32_t *tok, int T, int V)
{
    float *lg = xcalloc((size_t)T * V, 4);
    enum rt_err err = rt_exec_forward_seq(e, 0, tok, T, 0, lg, true);
    CHECK_MSG(err == RT_ERR_NONE, "forward: %s (%s)", rt_err_str(err), qs_log_last());
    if (err) {
        free(lg);
        return NULL;
    }
    return lg;
}

/* Run all-position logits of tok[0..T) on the model in path (CPU); NULL on failure. */
T_FN float *run_logits(const char *path, const int32_t *tok, int T, int max_batch, int V)
{
    struct rt_exec *e = NULL;
    struct rt_opts o = cpu_opts(64, max_batch, 2);
    enum rt_err err = rt_exec_open(path, &o, &e);
    CHECK_MSG(err == RT_ERR_NONE, "open %s: %s (%s)", path, rt_err_str(err), qs_log_last());
    if (err)
        return NULL;
    float *lg = exec_logits(e, tok, T, V);
    rt_exec_free(e);
    return lg;
}

#include "t_model_emu.h" /* the fp16-activation backend emulated on the CPU */


/* The start of every model test program: its area name for t_done, warnings only (no start-up
 * info lines between the results), a fresh tmp_root; the synthetic cases in *cases[*n]. false
 * when the temp directory cannot be made (reported). */
T_FN bool t_model_begin(const char *area, const char *prog, const struct t_case **cases, int *n)
{
    T_INIT(area);
    qs_log_set_level(QS_LOG_WARN);
    if (!t_tmp_root(prog))
        return false;
    *cases = t_cases(n);
    return true;
}

#endif /* QS_T_MODEL_H */

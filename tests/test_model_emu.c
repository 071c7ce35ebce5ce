/*
 * test_model_emu.c - the runtime model on the fp16-activation backend emulated on the CPU
 * (tests/t_model.h emu_ops): what the CUDA backend's choices cost numerically, and the model's
 * plumbing of the optional backend ops, checked before any GPU runs.
 *
 *   - fp16 activations vs the double-precision reference on every synthetic shape at every TP
 *     (relative L2 in (1e-6, 2e-3]: fp16 shows, and stays small), in chunks of 5 rows (the
 *     deferred split-K epilogues run on every chunk of <= 16 rows), in one chunk, and with
 *     deferral off (opts.no_defer), whose logits must differ from the deferred run's (the fp16
 *     rounding of each linear's output that deferral removes: proof that it ran).
 *   - device picks (rt_exec_forward_seq_pick on a backend with a sample op) give the ids of the
 *     host sampler on the same logits, greedy and sampled with a repetition penalty, at TP-1 and
 *     TP-N (the vocab slices gathered on rank 0); a smaller candidate vocabulary (the sampling
 *     parameters' vocab_limit) is honoured; bad requests are refused before anything runs.
 *   - decode-step graphs: with graph ops that record nothing (every recording fails) each rank
 *     tries twice, then runs op by op, and the logits are those of a run without graph ops.
 *
 * Run: ./build/test_model_emu (from the repository root).
 */
#include "t_model.h"

enum { T = 12 };

/* --- fp16 emulation -------------------------------------------------------------------------- */

static void test_fp16(const char *label, const struct syn_model *m, const int32_t *tok,
                      const double *want, const int *tps, int n_tp)
{
    const int V = m->sp.V;
    char dir[512];
    for (int i = 0; i < n_tp; i++) {
        snprintf(dir, sizeof(dir), "%s/%s-tp%d", tmp_root, label, tps[i]);
        float *deferred = NULL;
        for (int mode = 0; mode < 3; mode++) { /* chunks of 5, one chunk, no deferral */
            struct rt_opts o = cpu_opts(T, mode == 1 ? 0 : 5, 1);
            o.no_defer = mode == 2;
            struct rt_exec *e = NULL;
            float *lg = NULL;
            if (emu_open(dir, &o, &emu_ops, &e) == RT_ERR_NONE)
                lg = exec_logits(e, tok, T, V);
            rt_exec_free(e);
            CHECK_MSG(lg != NULL, "%s TP-%d: fp16 emulation failed: %s", label, tps[i],
                      qs_log_last());
            if (!lg)
                continue;
            double err = rel_l2(lg, want, (size_t)T * V);
            printf("  %-12s TP-%d fp16 activations (%s) vs double reference: rel L2 %.2e\n",
                   label, tps[i], mode == 0 ? "chunks of 5" : mode == 1 ? "one chunk" : "no defer",
                   err);
            CHECK_MSG(err <= 2e-3 && err > 1e-6, "%s TP-%d fp16 emulation mode %d: rel L2 %g",
                      label, tps[i], mode, err);
            if (mode == 2 && deferred)
                CHECK_MSG(memcmp(lg, deferred, (size_t)T * V * 4) != 0,
                          "%s TP-%d: logits with and without deferral are identical", label,
                          tps[i]);
            if (mode == 0)
                deferred = lg;
            else
                free(lg);
        }
        free(deferred);
    }
}

/* --- device picks ------------------------------------------------------------------------------ */

/* rt_backend.h's optional sample op, on the host: the survivors and probabilities of
 * rt_sampler (the reference) for the parameters and history in `pk`, then rt_sample_pick
 * (step 7) with the caller's draw pk->u. With it the emulated backend runs the model's pick
 * path (which row reaches the sampler, chunked prefill, the gathered vocab slices, the draw and
 * the history passed through); the CUDA kernel itself is checked in the GPU tests. */
static enum rt_err emu_sample_row(const float *logits, int n_vocab, const struct rt_pick *pk,
                                  int32_t *id)
{
    struct rt_sampler s = {0};
    if (rt_sampler_init(&s, &pk->p, n_vocab) != RT_SAMPLE_ERR_NONE)
        return RT_ERR_ARG;
    if (pk->seen) /* may be NULL without a repetition penalty (rt.h) */
        memcpy(s.seen, pk->seen, ((size_t)n_vocab + 7) / 8);
    int32_t n = rt_sampler_candidates(&s, logits, n_vocab);
    *id = n < 1                      ? -1
          : pk->p.temperature > 0.0f ? rt_sample_pick(s.cand, s.prob, n, pk->u)
                                     : s.cand[0];
    rt_sampler_free(&s);
    return RT_ERR_NONE;
}

static enum rt_err emu_sample(void *ctx, const float *logits, size_t row_stride, int n,
                              int n_vocab, const struct rt_pick *picks, int32_t *ids)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        enum rt_err e = emu_sample_row(logits + (size_t)i * row_stride, n_vocab, &picks[i], &ids[i]);
        if (e)
            return e;
    }
    return RT_ERR_NONE;
}

/* 9 tokens after tok[0..T) (prefill, then 8 decode steps), picked on the "device" (mode 1)
 * or by the host sampler on downloaded logits (mode 0), candidates [0, nv). */
static bool pick_run(const char *dir, const struct rt_backend_ops *ops, int mode,
                     const struct rt_sample_params *sp, const int32_t *tok, int V, int nv,
                     int32_t *out)
{
    struct rt_opts o = cpu_opts(T + 8, 5, 1);
    struct rt_exec *e = NULL;
    struct rt_sampler smp = {0};
    struct rt_sample_params p = *sp;
    p.vocab_limit = nv < V ? nv : 0;
    if (emu_open(dir, &o, ops, &e) != RT_ERR_NONE ||
        rt_sampler_init(&smp, &p, V) != RT_SAMPLE_ERR_NONE) {
        CHECK_MSG(0, "%s: pick test set-up failed: %s", dir, qs_log_last());
        rt_exec_free(e);
        return false;
    }
    CHECK(rt_exec_can_pick(e) == (mode == 1));
    for (int t = 0; t < T; t++)
        rt_sampler_accept(&smp, tok[t] < nv ? tok[t] : 0);
    float *row = xcalloc((size_t)V, 4);
    for (int step = 0; step < 9; step++) {
        const int32_t *in = step ? &out[step - 1] : tok;
        int n = step ? 1 : T, pos = step ? T + step - 1 : 0;
        if (mode) {
            struct rt_pick pk = {smp.p, smp.p.temperature > 0 ? rt_sampler_uniform(&smp) : 0.0,
                                 smp.seen};
            CHECK_EQ_INT(rt_exec_forward_seq_pick(e, 0, in, n, pos, &pk, &out[step]),
                         RT_ERR_NONE);
        } else {
            CHECK_EQ_INT(rt_exec_forward_seq(e, 0, in, n, pos, row, false), RT_ERR_NONE);
            CHECK_EQ_INT(rt_sampler_next(&smp, row, V, &out[step]), RT_SAMPLE_ERR_NONE);
        }
        CHECK(out[step] >= 0 && out[step] < nv);
        rt_sampler_accept(&smp, out[step] >= 0 && out[step] < nv ? out[step] : 0);
    }
    free(row);
    rt_sampler_free(&smp);
    rt_exec_free(e);
    return true;
}

static void test_pick(const char *dir, const char *dir_tpn, const int32_t *tok, int V)
{
    struct rt_backend_ops pick_ops = emu_ops;
    pick_ops.sample = emu_sample;
    struct rt_sample_params ps[2] = {rt_sample_params_default(), rt_sample_params_default()};
    ps[0].temperature = 0.0f;
    ps[0].repeat_penalty = 1.5f;
    ps[1].temperature = 0.9f;
    ps[1].top_k = 12;
    ps[1].top_p = 0.9f;
    ps[1].repeat_penalty = 1.3f;
    ps[1].seed = 42;
    /* the TP-1 set, then the TP-N set (its vocab-parallel slices gathered on rank 0, padding
     * columns past V never candidates); both settings; all of V, then a smaller vocabulary */
    for (int c = 0; c < 8; c++) {
        const char *dd = c % 4 < 2 ? dir : dir_tpn;
        const int nv = c < 4 ? V : V - 7;
        if (!dd)
            continue;
        int32_t want[9], got[9];
        if (!pick_run(dd, &emu_ops, 0, &ps[c % 2], tok, V, nv, want) ||
            !pick_run(dd, &pick_ops, 1, &ps[c % 2], tok, V, nv, got))
            return;
        CHECK_MSG(memcmp(want, got, sizeof(want)) == 0,
                  "%s: ids picked on the device differ from the host sampler's (setting %d, "
                  "vocab limit %d)", dd, c % 2, nv);
    }
    /* refusals: the plain CPU backend has no sample op */
    qs_log_set_quiet(true);
    struct rt_opts o = cpu_opts(T + 8, 5, 1);
    struct rt_exec *e = NULL;
    struct rt_pick pk = {rt_sample_params_default(), 0.0, NULL};
    pk.p.temperature = 0.0f; /* greedy, no penalty: no draw, no history */
    int32_t id = 0;
    if (rt_exec_open(dir, &o, &e) == RT_ERR_NONE) {
        CHECK(!rt_exec_can_pick(e));
        CHECK_EQ_INT(rt_exec_forward_seq_pick(e, 0, tok, 1, 0, &pk, &id), RT_ERR_UNSUPPORTED);
        CHECK_EQ_INT(rt_exec_forward_seq_pick(e, 0, tok, 1, 0, NULL, &id), RT_ERR_ARG);
        rt_exec_free(e);
    }
    /* bad requests are refused before anything runs (the cached length stays) */
    if (emu_open(dir, &o, &pick_ops, &e) == RT_ERR_NONE) {
        CHECK_EQ_INT(rt_exec_forward_seq_pick(e, 0, tok, 3, 0, &pk, &id), RT_ERR_NONE);
        struct rt_pick bad[6] = {pk, pk, pk, pk, pk, pk};
        bad[0].p.repeat_penalty = 1.2f; /* no history */
        bad[1].p.temperature = 0.7f;
        bad[1].u = 1.0;
        bad[2].p.top_p = 0.0f;
        bad[3].p.temperature = NAN;
        bad[4].p.min_p = 1.5f;
        bad[5].p.vocab_limit = -1;
        for (int b = 0; b < 6; b++) {
            CHECK_EQ_INT(rt_exec_forward_seq_pick(e, 0, tok + 3, 1, 3, &bad[b], &id), RT_ERR_ARG);
            CHECK_EQ_INT(rt_exec_seq_len(e, 0), 3);
        }
        rt_exec_free(e);
    }
    qs_log_set_quiet(false);
}

/* --- decode-step graphs ------------------------------------------------------------------------ */

/*
 * The model's side of the decode-step graphs (rt_backend.h graph_begin / graph_end /
 * graph_ready / graph_replay) with graph ops that record nothing: while "recording" the
 * emulated ops still run (their collectives do not: a real recording would only record them),
 * so a recording runs the step once, and the model, since graph_ready stays false, runs it again
 * op by op (same inputs, same KV rows: the same numbers). Checked per rank (each rank records
 * its own graph on its own thread): begin before end, an end only after a successful begin,
 * two tries then op by op, no replay, and the logits exactly those without graph ops.
 */
#define MAX_RANKS 8
static struct {
    int fail_begin, fail_end; /* rank whose graph_begin / graph_end fails; -1: none */
    int begins[MAX_RANKS], ends[MAX_RANKS], replays[MAX_RANKS];
    bool capturing[MAX_RANKS], bad_order;
} g_graph;

static int ctx_rank(void *ctx)
{
    const int r = ((struct emu *)ctx)->rank;
    return r >= 0 && r < MAX_RANKS ? r : 0;
}

static enum rt_err mock_graph_begin(void *ctx, int key)
{
    (void)key;
    const int r = ctx_rank(ctx);
    g_graph.begins[r]++;
    if (g_graph.capturing[r])
        g_graph.bad_order = true;
    if (r == g_graph.fail_begin)
        return RT_ERR_DEVICE;
    g_graph.capturing[r] = true;
    return RT_ERR_NONE;
}

static enum rt_err mock_graph_end(void *ctx, int key, bool ok)
{
    (void)key;
    const int r = ctx_rank(ctx);
    g_graph.ends[r]++;
    if (!g_graph.capturing[r])
        g_graph.bad_order = true;
    g_graph.capturing[r] = false;
    return ok && r == g_graph.fail_end ? RT_ERR_DEVICE : RT_ERR_NONE;
}

static bool mock_graph_ready(void *ctx, int key)
{
    (void)ctx, (void)key;
    return false; /* nothing is ever recorded: every attempt ends as a failed recording */
}

static enum rt_err mock_graph_replay(void *ctx, int key, bool *done)
{
    (void)key;
    g_graph.replays[ctx_rank(ctx)]++;
    *done = false;
    return RT_ERR_NONE;
}

/* Collectives are recorded, not run, while a rank records. */
static enum rt_err mock_all_reduce(void *ctx, void *buf, size_t n, enum rt_buf_type type)
{
    return g_graph.capturing[ctx_rank(ctx)] ? RT_ERR_NONE : emu_all_reduce(ctx, buf, n, type);
}

static void test_graph_fallback(const char *dir, const int32_t *tok, int V, int world, bool moe)
{
    struct rt_backend_ops gops = emu_ops;
    gops.graph_begin = mock_graph_begin;
    gops.graph_end = mock_graph_end;
    gops.graph_ready = mock_graph_ready;
    gops.graph_replay = mock_graph_replay;
    gops.all_reduce = mock_all_reduce;
    struct rt_opts o = cpu_opts(T + 8, 0, 1);
    enum { STEPS = 4 };
    float *want = xcalloc((size_t)STEPS * V, 4), *got = xcalloc((size_t)STEPS * V, 4);
    /* scenarios: no graph ops; no failure; rank 0's / the last rank's begin fails; rank 0's
     * end fails */
    for (int sc = -1; sc < 4; sc++) {
        struct rt_exec *e = NULL;
        memset(&g_graph, 0, sizeof g_graph);
        g_graph.fail_begin = sc == 1 ? 0 : sc == 2 ? world - 1 : -1;
        g_graph.fail_end = sc == 3 ? 0 : -1;
        if (emu_open(dir, &o, sc < 0 ? &emu_ops : &gops, &e) != RT_ERR_NONE) {
            CHECK_MSG(0, "%s: graph test set-up failed: %s", dir, qs_log_last());
            break;
        }
        CHECK_EQ_INT(rt_exec_forward_seq(e, 0, tok, T, 0, NULL, false), RT_ERR_NONE);
        int32_t next = tok[T - 1];
        for (int st = 0; st < STEPS; st++) {
            float *row = (sc < 0 ? want : got) + (size_t)st * V;
            CHECK_EQ_INT(rt_exec_forward_seq(e, 0, &next, 1, T + st, row, false), RT_ERR_NONE);
            next = (int32_t)(((unsigned)next * 7u + 3u) % (unsigned)V); /* any valid id */
        }
        rt_exec_free(e);
        if (sc < 0)
            continue;
        CHECK_MSG(memcmp(want, got, (size_t)STEPS * V * 4) == 0,
                  "%s: scenario %d: decode logits after failed graph recordings differ from "
                  "the run without graphs", dir, sc);
        CHECK_MSG(!g_graph.bad_order, "%s: scenario %d: graph_begin / graph_end out of order",
                  dir, sc);
        const int tries = moe ? 0 : 2; /* two failed recordings, then op by op */
        for (int r = 0; r < world && r < MAX_RANKS; r++) {
            CHECK_EQ_INT(g_graph.replays[r], 0); /* never ready: never replayed */
            const int want_ends = r == g_graph.fail_begin ? 0 : tries;
            CHECK_MSG(g_graph.begins[r] == tries && g_graph.ends[r] == want_ends,
                      "%s: scenario %d, rank %d of %d: %d begins, %d ends, want %d and %d", dir,
                      sc, r, world, g_graph.begins[r], g_graph.ends[r], tries, want_ends);
        }
    }
    free(want);
    free(got);
}

int main(void)
{
    int n;
    const struct t_case *cs;
    if (!t_model_begin("model_emu", "test-model-emu", &cs, &n))
        return 1;
    for (int i = 0; i < n; i++) {
        const struct t_case *c = &cs[i];
        struct syn_model m;
        syn_build(&m, &c->sp);
        int32_t tok[T];
        for (int t = 0; t < T; t++)
            tok[t] = (int32_t)(rnd_u32() % (uint32_t)c->sp.V);
        double *want = xcalloc((size_t)T * c->sp.V, 8);
        d_forward(&m, tok, T, want);
        char dir[512], dir_n[512];
        bool ok = true;
        for (int k = 0; k < c->n_tp; k++) {
            snprintf(dir, sizeof(dir), "%s/%s-tp%d", tmp_root, c->label, c->tps[k]);
            ok = ok && write_set(&m, dir, c->tps[k], CORRUPT_NONE) == 0;
        }
        CHECK_MSG(ok, "%s: writing the rank files failed: %s", c->label, qs_log_last());
        if (ok) {
            const int tpn = c->tps[c->n_tp - 1];
            snprintf(dir, sizeof(dir), "%s/%s-tp1", tmp_root, c->label);
            snprintf(dir_n, sizeof(dir_n), "%s/%s-tp%d", tmp_root, c->label, tpn);
            test_fp16(c->label, &m, tok, want, c->tps, c->n_tp);
            test_pick(dir, tpn > 1 ? dir_n : NULL, tok, c->sp.V);
            test_graph_fallback(dir, tok, c->sp.V, 1, c->sp.E > 0);
            if (tpn > 1)
                test_graph_fallback(dir_n, tok, c->sp.V, tpn, c->sp.E > 0);
        }
        free(want);
        syn_free(&m);
    }
    rm_rf(tmp_root);
    return t_done();
}

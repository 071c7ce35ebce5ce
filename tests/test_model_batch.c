/*
 * test_model_batch.c - the batch-shaped forward (rt.h struct rt_batch) on the CPU backend:
 * tokens of several sequences in one forward, each with its own KV-cache slot and positions.
 *
 *   - a batch of 4 sequences with prompts of different lengths, then decode steps of every
 *     sequence in one batch, a sequence that joins mid-run (its prompt chunk beside the others'
 *     decode tokens) and one that leaves (its slot cleared and reused), in chunks of 5 rows so
 *     sequences cross chunk boundaries: logits within 1e-6 relative L2 of each sequence run alone
 *     in a fresh executor, greedy ids identical; at TP 1 and TP 2 (threads + communicator), on the
 *     CPU backend and the fp16 emulation (1e-3 there: fp16 accumulation orders differ with M);
 *   - malformed batches refused before anything runs (slot twice, slot out of range, a gap in
 *     the positions, a start past the cached length, out rows not increasing, past n_ctx);
 *   - a rank whose backend fails mid-step: the step returns an error on rank 0 within the test's
 *     time, the executor is dead afterwards, and freeing it ends every thread (no hang); a rank
 *     that fails to open makes the open fail with its error.
 *
 * Run: ./build/test_model_batch (from the repository root).
 */
#include "t_model.h"

enum { NSEQ = 4, TMAX = 12, DECODE = 5 };

/* One sequence's prompt length and where its tokens come from. */
static const int plen[NSEQ] = {7, 3, 12, 1};

/* logits of every prompt row then of DECODE greedy steps of sequence s, run alone (slot 0 of a
 * fresh executor): into rows[(plen + DECODE)][V]; ids[DECODE] the greedy tokens. */
static bool run_alone(const char *dir, const struct rt_backend_ops *ops, const int32_t *prompt,
                      int n, int V, float *rows, int32_t *ids)
{
    struct rt_opts o = cpu_opts(TMAX + DECODE + 2, 5, 1);
    struct rt_exec *e = NULL;
    enum rt_err err = ops ? emu_open(dir, &o, ops, &e) : rt_exec_open(dir, &o, &e);
    CHECK_MSG(err == RT_ERR_NONE, "open %s: %s", dir, qs_log_last());
    if (err)
        return false;
    CHECK_EQ_INT(rt_exec_forward_seq(e, 0, prompt, n, 0, rows, true), RT_ERR_NONE);
    int32_t tok = ref_argmax(rows + (size_t)(n - 1) * V, V, V);
    for (int i = 0; i < DECODE; i++) {
        ids[i] = tok;
        float *row = rows + (size_t)(n + i) * V;
        CHECK_EQ_INT(rt_exec_forward_seq(e, 0, &tok, 1, n + i, row, false), RT_ERR_NONE);
        tok = ref_argmax(row, V, V);
    }
    rt_exec_free(e);
    return true;
}

struct bstate {
    int32_t tok[64], pos[64], seq[64], out[64];
    int n, n_out;
};

static void badd(struct bstate *b, int32_t tok, int32_t pos, int32_t seq, bool want)
{
    if (want)
        b->out[b->n_out++] = b->n;
    b->tok[b->n] = tok, b->pos[b->n] = pos, b->seq[b->n] = seq;
    b->n++;
}

/*
 * The batched schedule: step 0 prefills sequences 0-2 together; sequence 3 joins at step 1
 * (its prompt beside the decode tokens of 0-2); every later step decodes all active sequences;
 * sequence 1 leaves after its DECODE steps and its slot is cleared and reused by a second run of
 * sequence 1's prompt ("1b", same expected logits). Greedy: each sequence's next token is the
 * argmax of its own last row.
 */
static void test_batch(const char *label, const char *dir, const struct rt_backend_ops *ops,
                       int V, double tol)
{
    int32_t prompts[NSEQ][TMAX];
    for (int s = 0; s < NSEQ; s++)
        for (int t = 0; t < plen[s]; t++)
            prompts[s][t] = (int32_t)(rnd_u32() % (uint32_t)V);
    float *alone[NSEQ];
    int32_t ids[NSEQ][DECODE];
    for (int s = 0; s < NSEQ; s++) {
        alone[s] = xcalloc((size_t)(plen[s] + DECODE) * V, 4);
        if (!run_alone(dir, ops, prompts[s], plen[s], V, alone[s], ids[s]))
            return;
    }
    struct rt_opts o = cpu_opts(TMAX + DECODE + 2, 5, 1);
    o.n_seqs = NSEQ + 1;
    struct rt_exec *e = NULL;
    if ((ops ? emu_open(dir, &o, ops, &e) : rt_exec_open(dir, &o, &e)) != RT_ERR_NONE) {
        CHECK_MSG(0, "%s: open with %d slots: %s", label, NSEQ + 1, qs_log_last());
        return;
    }
    CHECK_EQ_INT(rt_exec_n_seqs(e), NSEQ + 1);
    /* slot of sequence s: s, and sequence 1's second run in slot 1 again after a clear */
    int done[NSEQ + 1] = {0}; /* rows done: the prompt's last, then each decode step */
    int32_t next[NSEQ + 1];
    double worst = 0;
    bool greedy_ok = true;
    float *lg = xcalloc(64 * (size_t)V, 4);
    for (int step = 0; step < 64; step++) {
        struct bstate b = {.n = 0};
        int who[64], row_of[64]; /* out row -> sequence, its row in `alone` */
        for (int q = 0; q <= NSEQ; q++) {
            const int s = q == NSEQ ? 1 : q; /* q = NSEQ: sequence 1 again ("1b") */
            const int start = q == 3 ? 1 : q == NSEQ ? DECODE + 2 : 0; /* step it begins */
            if (step < start || done[q] == DECODE + 1)
                continue;
            const int slot = q == NSEQ ? 1 : q;
            if (step == start) { /* the prompt */
                if (q == NSEQ)
                    rt_exec_seq_clear(e, slot); /* 1 has left: its slot is reused */
                for (int t = 0; t < plen[s]; t++) {
                    if (t == plen[s] - 1) {
                        who[b.n_out] = q;
                        row_of[b.n_out] = t;
                    }
                    badd(&b, prompts[s][t], t, slot, t == plen[s] - 1);
                }
            } else { /* decode: the token chosen last step, at the next position */
                who[b.n_out] = q;
                row_of[b.n_out] = plen[s] + done[q] - 1;
                badd(&b, next[q], plen[s] + done[q] - 1, slot, true);
            }
        }
        if (b.n == 0)
            break;
        struct rt_batch batch = {b.n, b.tok, b.pos, b.seq, b.n_out, b.out};
        CHECK_EQ_INT(rt_exec_forward(e, &batch, lg), RT_ERR_NONE);
        for (int j = 0; j < b.n_out; j++) {
            const int q = who[j], s = q == NSEQ ? 1 : q;
            const float *want = alone[s] + (size_t)row_of[j] * V, *got = lg + (size_t)j * V;
            double d = rel_l2_f(got, want, (size_t)V);
            worst = d > worst ? d : worst;
            CHECK_MSG(d <= tol, "%s: step %d, sequence %d row %d: rel L2 %g vs alone", label,
                      step, q, row_of[j], d);
            const int32_t g = ref_argmax(got, V, V);
            if (done[q] < DECODE)
                greedy_ok = greedy_ok && g == ids[s][done[q]];
            next[q] = g;
            done[q]++;
        }
    }
    for (int q = 0; q <= NSEQ; q++)
        CHECK_MSG(done[q] == DECODE + 1, "%s: sequence %d ran %d of %d steps", label, q, done[q],
                  DECODE + 1);
    CHECK_MSG(greedy_ok, "%s: greedy ids of the batched run differ from the runs alone", label);
    printf("  %-24s batched vs alone: worst rel L2 %.2e, greedy %s\n", label, worst,
           greedy_ok ? "identical" : "DIFFERS");
    free(lg);
    rt_exec_free(e);
    for (int s = 0; s < NSEQ; s++)
        free(alone[s]);
}

/* --- malformed batches ------------------------------------------------------------------------ */

static void test_refusals(const char *dir, int V)
{
    struct rt_opts o = cpu_opts(8, 0, 1);
    o.n_seqs = 2;
    struct rt_exec *e = NULL;
    if (rt_exec_open(dir, &o, &e) != RT_ERR_NONE) {
        CHECK_MSG(0, "open %s: %s", dir, qs_log_last());
        return;
    }
    float *lg = xcalloc(8 * (size_t)V, 4);
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct {
        int32_t pos[4], seq[4], out[4];
        int n, n_out;
        enum rt_err want;
        const char *needle;
    } cases[] = {
        {{0, 1, 0, 1}, {0, 0, 1, 0}, {3}, 4, 1, RT_ERR_ARG, "appears twice"},
        {{0, 1, 0, 0}, {0, 0, 2, 0}, {2}, 3, 1, RT_ERR_ARG, "outside [0, 2)"},
        {{0, 2, 0, 0}, {0, 0, 0, 0}, {1}, 2, 1, RT_ERR_ARG, "follow each other"},
        {{1, 2, 0, 0}, {0, 0, 0, 0}, {1}, 2, 1, RT_ERR_ARG, "start_pos 1"},
        {{0, 1, 2, 0}, {0, 0, 0, 0}, {2, 1}, 3, 2, RT_ERR_ARG, "increasing"},
        {{0, 1, 2, 0}, {0, 0, 0, 0}, {3}, 3, 1, RT_ERR_ARG, "out row"},
        {{6, 7, 8, 0}, {1, 1, 1, 0}, {2}, 3, 1, RT_ERR_ARG, "start_pos 6"},
    };
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct rt_batch b = {cases[i].n, tok, cases[i].pos, cases[i].seq, cases[i].n_out,
                             cases[i].out};
        enum rt_err err = rt_exec_forward(e, &b, lg);
        CHECK_MSG(err == cases[i].want, "refusal %zu: got %s (%s)", i, rt_err_str(err),
                  qs_log_last());
        CHECK_MSG(strstr(qs_log_last(), cases[i].needle), "refusal %zu: \"%s\" lacks \"%s\"", i,
                  qs_log_last(), cases[i].needle);
        CHECK_EQ_INT(rt_exec_seq_len(e, 0), 0); /* nothing ran */
    }
    /* slot 1 filled to n_ctx: one more position is a context overflow; slot 0 still runs */
    int32_t pos8[8] = {0, 1, 2, 3, 4, 5, 6, 7}, seq1[8] = {1, 1, 1, 1, 1, 1, 1, 1}, last = 7;
    struct rt_batch full = {8, tok, pos8, seq1, 1, &last};
    CHECK_EQ_INT(rt_exec_forward(e, &full, lg), RT_ERR_NONE);
    CHECK_EQ_INT(rt_exec_seq_len(e, 1), 8);
    int32_t p9 = 8, s1 = 1, r0 = 0;
    struct rt_batch over = {1, tok, &p9, &s1, 1, &r0};
    CHECK_EQ_INT(rt_exec_forward(e, &over, lg), RT_ERR_CONTEXT);
    CHECK_EQ_INT(rt_exec_forward_seq(e, 0, tok, 2, 0, lg, false), RT_ERR_NONE);
    qs_log_set_quiet(false);
    free(lg);
    rt_exec_free(e);
}

/* --- a rank that fails ------------------------------------------------------------------------- */

static int g_fail_rank = -1, g_fail_after = -1; /* rank 1's linear fails at its N-th call */
static int g_calls[8];

static enum rt_err failing_linear(void *ctx, const void *x, const uint8_t *qweight,
                                  const uint8_t *qzeros, const uint16_t *scales,
                                  const float *bias, int M, int K, int N, int G, void *y,
                                  float *acc)
{
    const int r = ((struct emu *)ctx)->rank;
    if (r == g_fail_rank && g_calls[r]++ == g_fail_after) {
        qs_log_error(__func__, "rank %d: injected failure", r);
        return RT_ERR_DEVICE;
    }
    return emu_linear_w4(ctx, x, qweight, qzeros, scales, bias, M, K, N, G, y, acc);
}

static enum rt_err failing_factory(void *user, int rank, int world, struct rt_comm *comm,
                                   struct rt_backend *out)
{
    if (rank == g_fail_rank && g_fail_after < 0) {
        qs_log_error(__func__, "rank %d: injected open failure", rank);
        return RT_ERR_NOMEM;
    }
    return emu_factory(user, rank, world, comm, out);
}

static void test_rank_failure(const char *dir_tp2, int V)
{
    struct rt_backend_ops ops = emu_ops;
    ops.linear_w4 = failing_linear;
    struct rt_opts o = cpu_opts(16, 0, 1);
    int32_t tok[4] = {1, 2, 3, 4};
    float *lg = xcalloc(4 * (size_t)V, 4);
    qs_log_set_quiet(true);
    for (int after = 0; after < 6; after += 5) { /* the first linear of the step, a later one */
        memset(g_calls, 0, sizeof(g_calls));
        g_fail_rank = -1;
        struct rt_exec *e = NULL;
        if (rt_exec_open_with(dir_tp2, &o, failing_factory, &ops, &e) != RT_ERR_NONE) {
            CHECK_MSG(0, "open %s: %s", dir_tp2, qs_log_last());
            break;
        }
        CHECK_EQ_INT(rt_exec_forward_seq(e, 0, tok, 2, 0, lg, false), RT_ERR_NONE);
        memset(g_calls, 0, sizeof(g_calls));
        g_fail_rank = 1;
        g_fail_after = after;
        enum rt_err err = rt_exec_forward_seq(e, 0, tok + 2, 2, 2, lg, false);
        CHECK_MSG(err == RT_ERR_PEER || err == RT_ERR_DEVICE,
                  "a step with rank 1 failing returned %s", rt_err_str(err));
        CHECK_EQ_INT(rt_exec_forward_seq(e, 0, tok, 1, 0, lg, false), RT_ERR_PEER);
        rt_exec_free(e); /* must return: every thread ends */
    }
    g_fail_rank = 1;
    g_fail_after = -1; /* rank 1 cannot open */
    struct rt_exec *e = (struct rt_exec *)&e;
    CHECK_EQ_INT(rt_exec_open_with(dir_tp2, &o, failing_factory, &ops, &e), RT_ERR_NOMEM);
    CHECK(e == NULL);
    g_fail_rank = -1;
    qs_log_set_quiet(false);
    free(lg);
}

int main(void)
{
    int n;
    const struct t_case *cs;
    if (!t_model_begin("model_batch", "test-model-batch", &cs, &n))
        return 1;
    for (int i = 0; i < n; i++) {
        const struct t_case *c = &cs[i];
        struct syn_model m;
        syn_build(&m, &c->sp);
        char dir[512], label[64];
        for (int tp = 1; tp <= 2; tp++) {
            snprintf(dir, sizeof(dir), "%s/%s-tp%d", tmp_root, c->label, tp);
            if (write_set(&m, dir, tp, CORRUPT_NONE) != 0) {
                CHECK_MSG(0, "%s: writing TP-%d failed: %s", c->label, tp, qs_log_last());
                continue;
            }
            snprintf(label, sizeof(label), "%s TP-%d", c->label, tp);
            test_batch(label, dir, NULL, c->sp.V, 1e-6);
            snprintf(label, sizeof(label), "%s TP-%d fp16", c->label, tp);
            test_batch(label, dir, &emu_ops, c->sp.V, 1e-3);
            if (i == 0 && tp == 1)
                test_refusals(dir, c->sp.V);
            if (i == 0 && tp == 2)
                test_rank_failure(dir, c->sp.V);
        }
        syn_free(&m);
    }
    rm_rf(tmp_root);
    return t_done();
}

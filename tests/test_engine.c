/*
 * test_engine.c - the batching engine (runtime/rt_engine.h) against the single-sequence loop
 * (rt_generate, one request at a time on a fresh session) on the synthetic models of t_model.h,
 * CPU backend: 12 requests with prompts of 1..45 tokens (crossing blocks of 4 tokens), four of
 * them sharing a 20-token prefix, different max_tokens (so sequences leave and others join
 * mid-run), half greedy and half sampled with their own seeds; the engine runs them at most 4
 * at once, in steps of at most 16 tokens (chunked prefill beside decode tokens). Every request's
 * generated ids and finish reason must equal its run alone - with a pool big enough for all
 * (prefix cache hits expected), with a pool so small that sequences are preempted and
 * recomputed (preemptions expected), with the prefix cache off, and at TP 2 and TP 4 (threads
 * and the communicator). Also: a prompt longer than the context fails alone at rt_engine_add;
 * a pool too small for one sequence of the context is refused at open with a message;
 * cancellation ends a request with finish "cancelled" and frees its blocks.
 * Run: ./build/test_engine
 */
#include "t_model.h"

#include "rt_engine.h"
#include "rt_session.h"

enum { NREQ = 12, NCTX = 64, MAXP = 45 };

struct req {
    int32_t prompt[MAXP];
    int n;
    struct rt_gen_params gp;
    int32_t want[NCTX];
    size_t n_want;
    enum rt_gen_finish want_finish;
    int32_t got[NCTX];
    size_t n_got;
    enum rt_gen_finish got_finish;
    enum rt_err got_err;
    bool done;
};

static struct req reqs[NREQ];

static void make_reqs(int V)
{
    int32_t prefix[20];
    for (int i = 0; i < 20; i++)
        prefix[i] = (int32_t)(rnd_u32() % (unsigned)V);
    for (int r = 0; r < NREQ; r++) {
        struct req *q = &reqs[r];
        memset(q, 0, sizeof(*q));
        q->n = 1 + (int)((unsigned)(r * 17 + 5) % MAXP);
        for (int i = 0; i < q->n; i++)
            q->prompt[i] = r % 3 == 0 && i < 20 ? prefix[i] : (int32_t)(rnd_u32() % (unsigned)V);
        q->gp = rt_gen_params_default();
        q->gp.max_tokens = 3 + (r * 5) % 10;
        if (q->n + q->gp.max_tokens >= NCTX)
            q->gp.max_tokens = NCTX - 1 - q->n;
        if (r % 2) {
            q->gp.sample.temperature = 0.9f;
            q->gp.sample.top_k = 20;
            q->gp.sample.seed = 1000 + (uint64_t)r;
        } else {
            q->gp.sample.temperature = 0.0f;
        }
        q->gp.ignore_eos = true; /* synthetic models have no real eos: run to max_tokens */
    }
}

static struct rt_session *open_session(const char *dir, int n_seqs, int kv_blocks, bool prefix)
{
    struct rt_session_opts so = {.path = dir, .model = cpu_opts(NCTX, 16, 2)};
    so.model.n_seqs = n_seqs;
    so.model.block_size = 4;
    so.model.kv_blocks = kv_blocks;
    so.model.no_prefix_cache = !prefix;
    struct rt_session *s = NULL;
    enum rt_err e = rt_session_open(&so, &s);
    CHECK_MSG(e == RT_ERR_NONE, "open %s: %s", dir, qs_log_last());
    return s;
}

static void run_alone(const char *dir)
{
    struct rt_session *s = open_session(dir, 1, 0, true);
    if (!s)
        return;
    for (int r = 0; r < NREQ; r++) {
        struct req *q = &reqs[r];
        struct rt_gen_result res;
        CHECK_EQ_INT(rt_generate(s, q->prompt, (size_t)q->n, &q->gp, NULL, &res), RT_ERR_NONE);
        q->n_want = res.n_ids;
        memcpy(q->want, res.ids, res.n_ids * sizeof(int32_t));
        q->want_finish = res.finish;
        rt_gen_result_free(&res);
    }
    rt_session_close(s);
}

static void on_finish(void *user, const struct rt_engine_done *d)
{
    struct req *q = user;
    q->done = true;
    q->got_err = d->err;
    q->got_finish = d->res->finish;
    q->n_got = d->res->n_ids < NCTX ? d->res->n_ids : NCTX;
    memcpy(q->got, d->res->ids, q->n_got * sizeof(int32_t));
}

/* The engine on all requests; returns its stats. */
static struct rt_engine_stats run_engine(const char *label, const char *dir, int kv_blocks,
                                         bool prefix)
{
    struct rt_engine_stats st = {0};
    struct rt_session *s = open_session(dir, 4, kv_blocks, prefix);
    if (!s)
        return st;
    struct rt_engine *e = NULL;
    const struct rt_engine_opts eo = {.max_batch_tokens = 16};
    CHECK_EQ_INT(rt_engine_create(s, &eo, &e), RT_ERR_NONE);
    for (int r = 0; e && r < NREQ; r++) {
        struct req *q = &reqs[r];
        q->done = false;
        const struct rt_engine_req er = {.ids = q->prompt, .n_ids = (size_t)q->n, .gen = q->gp,
                                         .on_finish = on_finish, .user = q};
        int64_t id;
        CHECK_EQ_INT(rt_engine_add(e, &er, &id), RT_ERR_NONE);
    }
    if (e) {
        CHECK_EQ_INT(rt_engine_run(e), RT_ERR_NONE);
        rt_engine_stats(e, &st);
        CHECK_MSG(st.blocks_used == 0 && st.running == 0 && st.waiting == 0,
                  "%s: after the run %d blocks used, %d running, %d waiting", label,
                  st.blocks_used, st.running, st.waiting);
    }
    for (int r = 0; r < NREQ; r++) {
        const struct req *q = &reqs[r];
        CHECK_MSG(q->done && q->got_err == RT_ERR_NONE, "%s: request %d done %d err %s", label, r,
                  q->done, rt_err_str(q->got_err));
        bool same = q->n_got == q->n_want && !memcmp(q->got, q->want, q->n_want * sizeof(int32_t));
        CHECK_MSG(same && q->got_finish == q->want_finish,
                  "%s: request %d (%s, prompt %d): %zu ids (first %d) finish %d in the batch, "
                  "%zu ids (first %d) finish %d alone", label, r,
                  q->gp.sample.temperature > 0 ? "sampled" : "greedy", q->n, q->n_got,
                  q->n_got ? q->got[0] : -1, q->got_finish, q->n_want,
                  q->n_want ? q->want[0] : -1, q->want_finish);
    }
    rt_engine_free(e);
    rt_session_close(s);
    return st;
}

/* More requests queued than the engine's first table holds (it grows while requests are
 * pending): each still gets its own result, equal to its run alone. */
static void test_many(const char *dir, int V)
{
    enum { MANY = 150 };
    struct rt_session *s = open_session(dir, 4, 0, true);
    struct rt_engine *e = NULL;
    if (!s || rt_engine_create(s, NULL, &e) != RT_ERR_NONE) {
        CHECK_MSG(0, "test_many set-up failed: %s", qs_log_last());
        rt_session_close(s);
        return;
    }
    static struct req many[MANY];
    for (int r = 0; r < MANY; r++) {
        struct req *q = &many[r];
        memset(q, 0, sizeof(*q));
        q->n = 2;
        q->prompt[0] = (int32_t)(r % V);
        q->prompt[1] = (int32_t)((r * 7 + 1) % V);
        q->gp = rt_gen_params_default();
        q->gp.sample.temperature = 0.0f;
        q->gp.max_tokens = 1 + r % 4;
        q->gp.ignore_eos = true;
        const struct rt_engine_req er = {.ids = q->prompt, .n_ids = 2, .gen = q->gp,
                                         .on_finish = on_finish, .user = q};
        int64_t id;
        CHECK_EQ_INT(rt_engine_add(e, &er, &id), RT_ERR_NONE);
    }
    CHECK_EQ_INT(rt_engine_run(e), RT_ERR_NONE);
    rt_engine_free(e);
    for (int r = 0; r < MANY; r++) {
        struct req *q = &many[r];
        struct rt_gen_result res;
        CHECK_EQ_INT(rt_generate(s, q->prompt, 2, &q->gp, NULL, &res), RT_ERR_NONE);
        CHECK_MSG(q->done && q->n_got == res.n_ids &&
                      !memcmp(q->got, res.ids, res.n_ids * sizeof(int32_t)),
                  "request %d of %d: %zu ids in the engine, %zu alone", r, MANY, q->n_got,
                  res.n_ids);
        rt_gen_result_free(&res);
    }
    rt_session_close(s);
}

static void test_errors(const char *dir, int V)
{
    struct rt_session *s = open_session(dir, 2, 0, true);
    if (!s)
        return;
    struct rt_engine *e = NULL;
    CHECK_EQ_INT(rt_engine_create(s, NULL, &e), RT_ERR_NONE);
    int32_t longp[NCTX];
    for (int i = 0; i < NCTX; i++)
        longp[i] = i % V;
    struct rt_engine_req er = {.ids = longp, .n_ids = NCTX, .gen = rt_gen_params_default()};
    int64_t id = 0;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(rt_engine_add(e, &er, &id), RT_ERR_CONTEXT);
    CHECK(id == -1);
    longp[3] = V + 5;
    er.n_ids = 8;
    CHECK_EQ_INT(rt_engine_add(e, &er, &id), RT_ERR_TOKEN);
    qs_log_set_quiet(false);
    /* cancel: a running request ends cancelled, its blocks freed */
    longp[3] = 1;
    er.gen.max_tokens = 40;
    er.gen.ignore_eos = true;
    struct req q = {0};
    er.on_finish = on_finish;
    er.user = &q;
    CHECK_EQ_INT(rt_engine_add(e, &er, &id), RT_ERR_NONE);
    int running = 0, waiting = 0;
    CHECK_EQ_INT(rt_engine_step(e, &running, &waiting), RT_ERR_NONE);
    CHECK_EQ_INT(rt_engine_step(e, &running, &waiting), RT_ERR_NONE);
    CHECK(running == 1 && !q.done);
    CHECK(rt_engine_cancel(e, id));
    CHECK_EQ_INT(rt_engine_step(e, &running, &waiting), RT_ERR_NONE);
    CHECK(q.done && q.got_finish == RT_GEN_FINISH_CANCELLED && running == 0);
    struct rt_engine_stats st;
    rt_engine_stats(e, &st);
    CHECK_EQ_INT(st.blocks_used, 0);
    CHECK(!rt_engine_cancel(e, id));
    rt_engine_free(e);
    rt_session_close(s);
    /* a pool that cannot hold one sequence of the context */
    struct rt_session_opts so = {.path = dir, .model = cpu_opts(NCTX, 16, 2)};
    so.model.block_size = 4;
    so.model.kv_blocks = NCTX / 4; /* one short: block 0 is reserved */
    struct rt_session *bad = NULL;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(rt_session_open(&so, &bad), RT_ERR_ARG);
    qs_log_set_quiet(false);
    CHECK(bad == NULL && strstr(qs_log_last(), "less than one sequence") != NULL);
}

int main(void)
{
    int n;
    const struct t_case *cs;
    if (!t_model_begin("engine", "test-engine", &cs, &n))
        return 1;
    for (int i = 0; i < n; i++) {
        const struct t_case *c = &cs[i];
        struct syn_model m;
        syn_build(&m, &c->sp);
        make_reqs(c->sp.V);
        char dir[512], label[96];
        snprintf(dir, sizeof(dir), "%s/%s-tp1", tmp_root, c->label);
        if (write_set(&m, dir, 1, CORRUPT_NONE) != 0) {
            CHECK_MSG(0, "%s: writing failed: %s", c->label, qs_log_last());
            syn_free(&m);
            continue;
        }
        run_alone(dir);
        snprintf(label, sizeof(label), "%s big pool", c->label);
        struct rt_engine_stats st = run_engine(label, dir, 0, true);
        CHECK_MSG(st.cached_tokens > 0, "%s: no prefix cache hit", label);
        snprintf(label, sizeof(label), "%s small pool", c->label);
        st = run_engine(label, dir, 1 + NCTX / 4, true);
        CHECK_MSG(st.preemptions > 0, "%s: the small pool preempted nothing", label);
        CHECK(st.peak_blocks_used <= NCTX / 4);
        snprintf(label, sizeof(label), "%s no prefix cache", c->label);
        st = run_engine(label, dir, 0, false);
        CHECK_EQ_INT((int)st.cached_tokens, 0);
        for (int k = 0; k < c->n_tp; k++) {
            const int tp = c->tps[k];
            if (tp < 2)
                continue;
            snprintf(dir, sizeof(dir), "%s/%s-tp%d", tmp_root, c->label, tp);
            if (write_set(&m, dir, tp, CORRUPT_NONE) != 0) {
                CHECK_MSG(0, "%s: writing TP-%d failed: %s", c->label, tp, qs_log_last());
                continue;
            }
            snprintf(label, sizeof(label), "%s TP-%d small pool", c->label, tp);
            run_engine(label, dir, 1 + NCTX / 4, true);
        }
        if (i == 0) {
            snprintf(dir, sizeof(dir), "%s/%s-tp1", tmp_root, c->label);
            test_errors(dir, c->sp.V);
            test_many(dir, c->sp.V);
        }
        syn_free(&m);
    }
    rm_rf(tmp_root);
    return t_done();
}

/*
 * test_blocks.c - the paged KV cache's block manager (runtime/rt_blocks.c) against a model of
 * what its pool must hold: random sequences of prepare / commit / match / clear / rewind on a
 * small pool (so blocks run out, cached blocks are evicted and prefixes are shared), with the
 * pool's content simulated token by token. After every operation: the manager's own invariants
 * (rt_blocks_check), and every slot read through its block table gives exactly the tokens the
 * slot was given, in order (so sharing, copy-on-write, eviction and rewinds never let one
 * sequence see another's rows). Also: prefix hits need equal tokens, not only an equal hash;
 * a full pool refuses without changing anything.
 * Run: ./build/test_blocks
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "rt_blocks.h"
#include "t.h"

#define BS 4
#define NB 40
#define NSLOT 5
#define MAXB 12

static int32_t pool[NB][BS];       /* simulated pool: the token each row holds */
static int32_t want[NSLOT][MAXB * BS];
static int want_len[NSLOT];

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* write tokens[n] at p0.. of slot through the manager; false when it refused (pool full) */
static bool write(struct rt_blocks *b, int slot, int p0, const int32_t *tokens, int n)
{
    int32_t copy[2 * (MAXB + 2)];
    int n_copy = 0;
    const int avail = rt_blocks_available(b), need = rt_blocks_needed(b, slot, p0, n);
    enum rt_err e = rt_blocks_prepare(b, slot, p0, n, copy, &n_copy);
    if (e == RT_ERR_KV_FULL) {
        CHECK(rt_blocks_available(b) == avail && rt_blocks_len(b, slot) == want_len[slot]);
        CHECK(need > 0);
        return false;
    }
    CHECK_EQ_INT(e, RT_ERR_NONE);
    for (int i = 0; i < n_copy; i++)
        memcpy(pool[copy[2 * i + 1]], pool[copy[2 * i]], sizeof(pool[0]));
    const int32_t *tab = rt_blocks_table(b, slot);
    for (int i = 0; i < n; i++)
        pool[tab[(p0 + i) / BS]][(p0 + i) % BS] = tokens[i];
    rt_blocks_commit(b, slot, tokens, p0, n);
    memcpy(want[slot] + p0, tokens, (size_t)n * sizeof(int32_t));
    want_len[slot] = p0 + n;
    return true;
}

static void check_all(struct rt_blocks *b, const char *after)
{
    CHECK_MSG(rt_blocks_check(b), "after %s", after);
    for (int s = 0; s < NSLOT; s++) {
        CHECK_MSG(rt_blocks_len(b, s) == want_len[s], "slot %d holds %d, want %d (after %s)", s,
                  rt_blocks_len(b, s), want_len[s], after);
        const int32_t *tab = rt_blocks_table(b, s);
        int bad = -1;
        for (int p = 0; p < want_len[s] && bad < 0; p++)
            if (pool[tab[p / BS]][p % BS] != want[s][p])
                bad = p;
        CHECK_MSG(bad < 0, "slot %d position %d reads %d, wrote %d (after %s)", s, bad,
                  bad >= 0 ? pool[tab[bad / BS]][bad % BS] : 0, bad >= 0 ? want[s][bad] : 0,
                  after);
    }
}

/* a prompt: one of three shared prefixes (so matches happen), then random tokens */
static int make_prompt(int32_t *t, int n)
{
    const int family = (int)rnd(3);
    for (int i = 0; i < n; i++)
        t[i] = i < 9 ? family * 100 + i : (int32_t)rnd(7);
    return n;
}

static void test_random(void)
{
    struct rt_blocks *b = NULL;
    CHECK_EQ_INT(rt_blocks_create(NB, BS, NSLOT, MAXB, true, &b), RT_ERR_NONE);
    if (!b) return;
    int hits = 0, full = 0, cows = 0;
    for (int step = 0; step < 20000; step++) {
        const int s = (int)rnd(NSLOT), op = (int)rnd(10);
        int32_t t[MAXB * BS];
        if (op == 0) { /* the sequence ends */
            rt_blocks_clear(b, s);
            want_len[s] = 0;
            check_all(b, "clear");
        } else if (op <= 2 && want_len[s] == 0) { /* a new prompt, cached prefix first */
            const int n = 2 + (int)rnd(MAXB * BS - 2);
            make_prompt(t, n);
            const int hit = rt_blocks_match(b, s, t, n);
            CHECK(hit % BS == 0 && hit < n);
            memcpy(want[s], t, (size_t)hit * sizeof(int32_t));
            want_len[s] = hit;
            hits += hit > 0;
            check_all(b, "match");
            if (!write(b, s, hit, t + hit, n - hit)) {
                full++;
                rt_blocks_clear(b, s);
                want_len[s] = 0;
            }
            check_all(b, "prefill");
        } else if (op == 3 && want_len[s] > 1) { /* rewind into the sequence, then write */
            const int p0 = (int)rnd((uint32_t)want_len[s]);
            int n = 1 + (int)rnd(3);
            if (p0 + n > MAXB * BS) n = MAXB * BS - p0;
            for (int i = 0; i < n; i++) t[i] = 1000 + (int32_t)rnd(5);
            const int before = rt_blocks_available(b);
            if (write(b, s, p0, t, n)) cows += rt_blocks_available(b) < before;
            check_all(b, "rewind");
        } else if (want_len[s] > 0 && want_len[s] < MAXB * BS) { /* a decode step */
            t[0] = (int32_t)rnd(7);
            if (!write(b, s, want_len[s], t, 1)) full++;
            check_all(b, "decode");
        }
    }
    CHECK_MSG(hits > 100 && full > 10 && cows > 10,
              "the random run must reach prefix hits (%d), a full pool (%d), rewinds (%d)", hits,
              full, cows);
    rt_blocks_free(b);
}

static void test_exact_tokens(void)
{
    struct rt_blocks *b = NULL;
    CHECK_EQ_INT(rt_blocks_create(16, BS, 3, MAXB, true, &b), RT_ERR_NONE);
    if (!b) return;
    memset(want_len, 0, sizeof(want_len));
    int32_t a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, c[9] = {1, 2, 3, 4, 5, 6, 7, 9, 9};
    CHECK(write(b, 0, 0, a, 9));
    CHECK_EQ_INT(rt_blocks_cached(b), 2);
    CHECK_EQ_INT(rt_blocks_match(b, 1, c, 9), 4); /* second block differs in one token */
    CHECK_EQ_INT(rt_blocks_match(b, 2, a, 9), 8);
    CHECK_EQ_INT(rt_blocks_match(b, 2, a, 9), 0); /* not empty any more */
    rt_blocks_clear(b, 0);
    rt_blocks_clear(b, 1);
    rt_blocks_clear(b, 2);
    CHECK_EQ_INT(rt_blocks_used(b), 0);
    CHECK_EQ_INT(rt_blocks_cached(b), 2);          /* evictable, still matchable */
    CHECK_EQ_INT(rt_blocks_match(b, 0, a, 8), 4);  /* one token must stay to compute */
    CHECK(rt_blocks_check(b));
    rt_blocks_free(b);
    /* without the prefix cache nothing is registered */
    CHECK_EQ_INT(rt_blocks_create(16, BS, 2, MAXB, false, &b), RT_ERR_NONE);
    memset(want_len, 0, sizeof(want_len));
    CHECK(write(b, 0, 0, a, 9));
    CHECK_EQ_INT(rt_blocks_cached(b), 0);
    CHECK_EQ_INT(rt_blocks_match(b, 1, a, 9), 0);
    rt_blocks_free(b);
    CHECK_EQ_INT(rt_blocks_create(1, BS, 2, MAXB, true, &b), RT_ERR_ARG);
    CHECK(b == NULL);
}

int main(void)
{
    T_INIT("blocks");
    qs_log_set_level(QS_LOG_ERROR);
    test_exact_tokens();
    memset(want_len, 0, sizeof(want_len));
    test_random();
    return t_done();
}

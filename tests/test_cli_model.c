/*
 * test_cli_model.c - the model commands end to end against references we did not write: runs
 * the qshard binary (tests/t_cli.h) on fixture models converted with `qshard convert` into a
 * temp directory and compares with the transformers goldens (tests/data/models/INDEX.json):
 *   - `run --tokens <prompt ids> --temp 0 -n 16 --print-ids --ignore-eos` equals the golden
 *     greedy ids (a mismatch is tolerated only from a step whose golden top1-top2 margin is
 *     below GREEDY_TIE_MARGIN, where fp32 rounding may legitimately pick the other id);
 *   - `logits --tokens ... --out x.npy` equals the golden [T, vocab] within relative L2 5e-3;
 *   - the same through a TP-2 conversion (all ranks in one process), and every fixture with
 *     goldens through a TP-4 conversion (o_proj then holds half of each 128-row group per
 *     rank: DESIGN 4 local group size), logits also vs the TP-1 conversion within 1e-5;
 *   - `perplexity` equals the perplexity computed here from the golden logits with llama.cpp's
 *     method (second half of the chunk scored), and over several chunks from `logits` of each
 *     chunk (BOS replacement, running estimates, the +/- term), on a model built around the
 *     real Llama-2 tokenizer (tests/t_cli.h cli_llama2_model) and its vector texts;
 *   - `perplexity --file` of the trained KJV model's held-out text: as many tokens as
 *     transformers, and transformers' running perplexity within 0.1 % (issue 21);
 *   - eos: greedy generation stops at the golden step whose id generation_config lists, also
 *     for a rewritten generation_config eos list;
 *   - `bench model`: one row per test, the tg test's greedy ids equal `run`'s, -d, usage
 *     errors, -o json;
 *   - `bench load`: its rows (bytes = the rank files' sizes, first token before exit), the
 *     child's timing lines, --cold, usage and input errors;
 *   - rank files that do not belong (one rank of a TP-2 set, a rank of another model).
 * Run: ./build/test_cli_model (from the repository root); QSHARD_DEVICE=cuda runs the golden
 * comparisons on the GPU, QSHARD_DEVICE_TP2=cuda / QSHARD_DEVICE_TP4=cuda the TP-2 / TP-4 ones.
 */
#include "t_cli.h"

static void check_greedy(const char *model, const char *name, const cJSON *prompt)
{
    const cJSON *gold = cJSON_GetObjectItemCaseSensitive(prompt, "greedy_ids");
    const cJSON *marg = cJSON_GetObjectItemCaseSensitive(prompt, "greedy_margins");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "ids");
    if (!cJSON_IsArray(gold) || !cJSON_IsArray(pids))
        return;
    char *csv = ids_csv(pids), nstr[16];
    int ng = cJSON_GetArraySize(gold);
    snprintf(nstr, sizeof(nstr), "%d", ng);
    struct proc p = run("run", model, "--tokens", csv, "--temp", "0", "-n", nstr, "--print-ids",
                        "--ignore-eos", "--device", g_device, NULL);
    CHECK_EXIT(p, 0, name);
    int32_t got[256];
    int n = parse_ids(p.out, got, 256);
    CHECK_MSG(n == ng, "%s: %d greedy ids printed, golden has %d (stdout: %.200s)", name, n, ng,
              p.out);
    for (int i = 0; i < n && i < ng; i++) {
        int want = cJSON_GetArrayItem(gold, i)->valueint;
        if (got[i] == want)
            continue;
        double m = cJSON_IsArray(marg) ? cJSON_GetArrayItem(marg, i)->valuedouble : INFINITY;
        CHECK_MSG(m < GREEDY_TIE_MARGIN,
                  "%s: greedy step %d: got %d, golden %d (golden margin %.4g)", name, i,
                  (int)got[i], want, m);
        if (m < GREEDY_TIE_MARGIN)
            fprintf(stderr, "note: %s: greedy step %d differs at a near-tie (margin %.3g)\n",
                    name, i, m);
        break;
    }
    proc_free(&p);
    free(csv);
}

static void check_logits(const char *model, const char *name, const cJSON *prompt)
{
    const char *lpath = jstr(prompt, "logits");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "ids");
    if (!lpath || !cJSON_IsArray(pids))
        return;
    char gpath[512], out[512];
    snprintf(gpath, sizeof(gpath), DATA "%s", lpath);
    snprintf(out, sizeof(out), "%s/logits.npy", g_tmp);
    char *csv = ids_csv(pids);
    struct proc p =
        run("logits", model, "--tokens", csv, "--out", out, "--device", g_device, NULL);
    CHECK_EXIT(p, 0, name);
    float *a = NULL, *b = NULL;
    int64_t ra = 0, ca = 0, rb = 0, cb = 0;
    CHECK_MSG(rt_npy_read_f32(out, &a, &ra, &ca) == RT_IO_ERR_NONE, "%s: no logits file", name);
    CHECK_MSG(rt_npy_read_f32(gpath, &b, &rb, &cb) == RT_IO_ERR_NONE, "%s: golden unreadable",
              name);
    CHECK_MSG(ra == rb && ca == cb, "%s: logits shape (%lld, %lld), golden (%lld, %lld)", name,
              (long long)ra, (long long)ca, (long long)rb, (long long)cb);
    if (a && b && ra == rb && ca == cb) {
        double nb;
        double e = rel_l2(a, b, (size_t)(ra * ca), &nb);
        CHECK_MSG(nb > 0, "%s: golden logits are all zero", name);
        CHECK_MSG(e <= REL_L2_MAX, "%s: logits rel L2 %.3g > %.1g", name, e, REL_L2_MAX);
    }
    unlink(out);
    free(a);
    free(b);
    free(csv);
    proc_free(&p);
}

/* `logits` of the TP-N conversion `model` (on g_device) against the TP-1 conversion `tp1` (on
 * cpu): relative L2 <= TP_REL_L2_MAX (only summation order differs). */
static void check_logits_vs_tp1(const char *model, const char *tp1, const char *name,
                                const cJSON *prompt)
{
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "ids");
    if (!cJSON_IsArray(pids))
        return;
    char out_a[512], out_b[512];
    snprintf(out_a, sizeof(out_a), "%s/logits-tpn.npy", g_tmp);
    snprintf(out_b, sizeof(out_b), "%s/logits-tp1.npy", g_tmp);
    char *csv = ids_csv(pids);
    struct proc p =
        run("logits", model, "--tokens", csv, "--out", out_a, "--device", g_device, NULL);
    CHECK_EXIT(p, 0, name);
    proc_free(&p);
    p = run("logits", tp1, "--tokens", csv, "--out", out_b, "--device", "cpu", NULL);
    CHECK_EXIT(p, 0, name);
    float *a = NULL, *b = NULL;
    int64_t ra = 0, ca = 0, rb = 0, cb = 0;
    CHECK_MSG(rt_npy_read_f32(out_a, &a, &ra, &ca) == RT_IO_ERR_NONE &&
                  rt_npy_read_f32(out_b, &b, &rb, &cb) == RT_IO_ERR_NONE,
              "%s: logits files unreadable", name);
    CHECK_MSG(ra == rb && ca == cb, "%s: logits shape (%lld, %lld), TP-1 (%lld, %lld)", name,
              (long long)ra, (long long)ca, (long long)rb, (long long)cb);
    if (a && b && ra == rb && ca == cb) {
        double nb;
        double e = rel_l2(a, b, (size_t)(ra * ca), &nb);
        CHECK_MSG(nb > 0 && e <= TP_REL_L2_MAX, "%s: logits vs TP-1 rel L2 %.3g > %.1g", name, e,
                  TP_REL_L2_MAX);
    }
    unlink(out_a);
    unlink(out_b);
    free(a);
    free(b);
    free(csv);
    proc_free(&p);
}

/* llama.cpp's perplexity computed here from the golden logits: one chunk of T tokens, rows
 * j = T/2 .. T-2 score ids[j+1]. Through --tokens for every golden prompt; through --file
 * where the golden's prompt ids are HF's tokenization of its text (so the file we write
 * tokenizes to the ids the golden logits belong to). */
static void check_perplexity(const char *model, const char *name, const cJSON *prompt)
{
    const char *text = jstr(prompt, "text"), *lpath = jstr(prompt, "logits");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "ids");
    const cJSON *hf = cJSON_GetObjectItemCaseSensitive(prompt, "hf_ids_tokenizers");
    int T = cJSON_GetArraySize(pids);
    if (!lpath || T < 4)
        return;
    char gpath[512], file[512], ctx[16];
    snprintf(gpath, sizeof(gpath), DATA "%s", lpath);
    float *g = NULL;
    int64_t r, c;
    CHECK_EQ_INT(rt_npy_read_f32(gpath, &g, &r, &c), RT_IO_ERR_NONE);
    if (!g || r != T) {
        free(g);
        return;
    }
    double nll = 0;
    int count = 0;
    for (int j = T / 2; j < T - 1; j++) {
        nll -= cli_log_softmax(g + (size_t)j * (size_t)c, c,
                               cJSON_GetArrayItem(pids, j + 1)->valueint);
        count++;
    }
    free(g);
    double want = exp(nll / count);
    snprintf(ctx, sizeof(ctx), "%d", T);
    bool by_text = text && cJSON_IsArray(hf) && cJSON_Compare(hf, pids, 1);
    if (text && !by_text)
        printf("cli: note: %s: golden ids are not HF's tokenization of the text: perplexity "
               "--file check skipped\n", name);
    for (int mode = 0; mode < 1 + by_text; mode++) {
        struct proc p;
        char *csv = NULL;
        if (mode == 0) {
            csv = ids_csv(pids);
            p = run("perplexity", model, "--tokens", csv, "--ctx", ctx, "--device", g_device,
                    NULL);
        } else {
            snprintf(file, sizeof(file), "%s/ppl.txt", g_tmp);
            FILE *f = fopen(file, "wb");
            fputs(text, f);
            fclose(f);
            p = run("perplexity", model, "--file", file, "--ctx", ctx, "--device", g_device,
                    NULL);
        }
        CHECK_EXIT(p, 0, name);
        const char *fin = strstr(p.out, "Final estimate: PPL = ");
        CHECK_MSG(fin != NULL, "%s: no final estimate in: %.200s", name, p.out);
        if (fin) {
            double got = strtod(fin + strlen("Final estimate: PPL = "), NULL);
            CHECK_MSG(fabs(got - want) <= 1e-3 * want, "%s: PPL %.6g, from golden %.6g", name,
                      got, want);
        }
        CHECK(strstr(p.out, "[1]") == p.out); /* the running estimate of chunk 1 comes first */
        free(csv);
        proc_free(&p);
    }
}

/* Eos: generation stops at the first golden greedy id that generation_config lists as eos. */
static void check_eos(const char *model, const char *name, const cJSON *prompt,
                      const cJSON *eos_list)
{
    const cJSON *gold = cJSON_GetObjectItemCaseSensitive(prompt, "greedy_ids");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "ids");
    if (!cJSON_IsArray(gold) || !cJSON_IsArray(pids) || !cJSON_IsArray(eos_list))
        return;
    int stop_at = -1, ng = cJSON_GetArraySize(gold);
    for (int i = 0; i < ng && stop_at < 0; i++) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos_list) if (e->valueint == cJSON_GetArrayItem(gold, i)->valueint)
            stop_at = i;
    }
    if (stop_at < 0)
        return; /* this prompt's greedy run never meets an eos id */
    char *csv = ids_csv(pids), nstr[16];
    snprintf(nstr, sizeof(nstr), "%d", ng);
    struct proc p = run("run", model, "--tokens", csv, "--temp", "0", "-n", nstr, "--print-ids",
                        "--device", g_device, NULL);
    CHECK_EXIT(p, 0, name);
    int32_t got[256];
    int n = parse_ids(p.out, got, 256);
    CHECK_MSG(n == stop_at, "%s: %d ids before eos, golden eos at step %d", name, n, stop_at);
    proc_free(&p);
    free(csv);
}

/* Multi-chunk perplexity (llama.cpp tools/perplexity method) recomputed here from `qshard
 * logits` of each chunk: ids cut into chunks of ctx, first id of each chunk replaced by BOS,
 * rows ctx/2 .. ctx-2 scored, running estimate after each chunk, final
 * PPL +/- ppl * sqrt((E[nll^2] - E[nll]^2) / (count - 1)). */
static void check_perplexity_chunks(const char *model, const char *text, const cJSON *ids,
                                    int bos)
{
    enum { CTX = 32, CHUNKS = 3 };
    int n = cJSON_GetArraySize(ids);
    if (n < CTX * CHUNKS) {
        CHECK_MSG(0, "perplexity text has %d tokens, need %d", n, CTX * CHUNKS);
        return;
    }
    char file[512], out[512], ctx[16];
    snprintf(file, sizeof(file), "%s/ppl_long.txt", g_tmp);
    snprintf(out, sizeof(out), "%s/chunk.npy", g_tmp);
    FILE *f = fopen(file, "wb");
    fputs(text, f);
    fclose(f);
    double nll = 0, nll2 = 0, running[CHUNKS];
    int count = 0;
    for (int k = 0; k < CHUNKS; k++) {
        cJSON *chunk = cJSON_CreateArray();
        for (int j = 0; j < CTX; j++)
            cJSON_AddItemToArray(chunk, cJSON_CreateNumber(
                j == 0 ? bos : cJSON_GetArrayItem(ids, k * CTX + j)->valueint));
        char *csv = ids_csv(chunk);
        struct proc p = run("logits", model, "--tokens", csv, "--out", out, NULL);
        CHECK_EXIT(p, 0, "chunk logits");
        float *lg = NULL;
        int64_t r = 0, c = 0;
        if (p.code == 0 && !rt_npy_read_f32(out, &lg, &r, &c) && r == CTX) {
            for (int j = CTX / 2; j < CTX - 1; j++) {
                double lp = cli_log_softmax(lg + (size_t)j * (size_t)c, c,
                                            cJSON_GetArrayItem(chunk, j + 1)->valueint);
                nll -= lp;
                nll2 += lp * lp;
                count++;
            }
        }
        running[k] = exp(nll / count);
        free(lg);
        free(csv);
        cJSON_Delete(chunk);
        proc_free(&p);
    }
    double mean = nll / count, ppl = exp(mean);
    double err = ppl * sqrt((nll2 / count - mean * mean) / (count - 1));
    snprintf(ctx, sizeof(ctx), "%d", CTX);
    struct proc p = run("perplexity", model, "--file", file, "--ctx", ctx, "--chunks", "3", NULL);
    CHECK_EXIT(p, 0, "perplexity chunks");
    const char *q = p.out;
    for (int k = 0; k < CHUNKS; k++) {
        int idx = 0;
        double v = 0;
        int used = 0;
        CHECK_MSG(sscanf(q, "[%d]%lf,%n", &idx, &v, &used) == 2 && idx == k + 1,
                  "chunk %d: output \"%.80s\"", k + 1, q);
        CHECK_MSG(fabs(v - running[k]) <= 1e-3 * running[k] + 1e-4,
                  "running estimate %d: %.6g, expected %.6g", k + 1, v, running[k]);
        q += used;
        if (!used)
            break;
    }
    const char *fin = strstr(p.out, "Final estimate: PPL = ");
    double gp = 0, ge = 0;
    CHECK_MSG(fin && sscanf(fin, "Final estimate: PPL = %lf +/- %lf", &gp, &ge) == 2,
              "final line missing: %.200s", p.out);
    CHECK_MSG(fabs(gp - ppl) <= 1e-3 * ppl, "final PPL %.6g, expected %.6g", gp, ppl);
    CHECK_MSG(fabs(ge - err) <= 1e-2 * err + 1e-5, "final +/- %.6g, expected %.6g", ge, err);
    proc_free(&p);
}

/* eos ids of a fixture directory: config.json and generation_config.json eos_token_id (an int
 * or a list). Returns a cJSON array the caller deletes. */
static cJSON *fixture_eos(const cJSON *m)
{
    cJSON *out = cJSON_CreateArray();
    const char *files[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        char path[512], *buf = NULL;
        size_t len;
        snprintf(path, sizeof(path), DATA "%s/%s", jstr(m, "path"), files[i]);
        qs_log_set_quiet(true);
        enum rt_io_err e = rt_file_read(path, 1 << 20, &buf, &len);
        qs_log_set_quiet(false);
        if (e)
            continue;
        cJSON *j = cJSON_ParseWithLength(buf, len);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), *it;
        const cJSON *list = cJSON_IsArray(v) ? v : NULL;
        if (cJSON_IsNumber(v))
            cJSON_AddItemToArray(out, cJSON_CreateNumber(v->valueint));
        cJSON_ArrayForEach(it, list)
            cJSON_AddItemToArray(out, cJSON_CreateNumber(it->valueint));
        cJSON_Delete(j);
        free(buf);
    }
    return out;
}

/* generation_config.json listing several eos ids: a copy of the fixture whose
 * generation_config says eos_token_id = [<an id the greedy run never emits>, greedy_ids[k]]
 * (k: the first step >= 2 whose id is new), converted; greedy generation must stop right
 * before step k and print nothing of the eos token. */
static bool check_eos_list(const cJSON *m, const cJSON *prompt)
{
    const cJSON *gold = cJSON_GetObjectItemCaseSensitive(prompt, "greedy_ids");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "ids");
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(m, "vocab_size");
    int ng = cJSON_GetArraySize(gold), k = -1, vocab = cJSON_IsNumber(vs) ? vs->valueint : 0;
    for (int i = 2; i < ng && k < 0; i++) {
        int id = cJSON_GetArrayItem(gold, i)->valueint, seen = 0;
        for (int j = 0; j < i; j++)
            seen |= cJSON_GetArrayItem(gold, j)->valueint == id;
        if (!seen)
            k = i;
    }
    int unused = -1;
    for (int cand = vocab - 1; cand >= 0 && unused < 0; cand--) {
        int used = 0;
        for (int j = 0; j < ng; j++)
            used |= cJSON_GetArrayItem(gold, j)->valueint == cand;
        if (!used)
            unused = cand;
    }
    if (k < 0 || unused < 0)
        return false; /* a degenerate greedy run (one id repeated): try another prompt */
    char dir[512], out[512], gc[600];
    cli_fixture_copy(m, "eoslist", dir, out, sizeof(dir));
    snprintf(gc, sizeof(gc), "%s/generation_config.json", dir);
    FILE *f = fopen(gc, "wb");
    CHECK(f != NULL);
    if (!f)
        return true;
    fprintf(f, "{\"eos_token_id\": [%d, %d]}\n", unused,
            cJSON_GetArrayItem(gold, k)->valueint);
    fclose(f);
    struct proc p = run("convert", dir, out, "--tp", "1", NULL);
    CHECK_EXIT(p, 0, "convert with an eos list");
    proc_free(&p);
    char *csv = ids_csv(pids), nstr[16];
    snprintf(nstr, sizeof(nstr), "%d", ng);
    p = run("run", out, "--tokens", csv, "--temp", "0", "-n", nstr, "--print-ids", NULL);
    CHECK_EXIT(p, 0, "run with an eos list");
    int32_t got[256];
    int n = parse_ids(p.out, got, 256), bad = 0;
    for (int i = 0; i < n && i < k; i++)
        bad += got[i] != cJSON_GetArrayItem(gold, i)->valueint;
    CHECK_MSG(n == k && bad == 0, "%s: eos list [%d, %d]: %d ids printed (%d differ), expected "
              "the %d golden ids before the eos", jstr(m, "name"), unused,
              cJSON_GetArrayItem(gold, k)->valueint, n, bad, k);
    CHECK_MSG(strstr(p.err, "stopped: eos") != NULL, "stderr: %.300s", p.err);
    printf("cli: %s/%s: generation_config eos list [%d, %d] stops before step %d\n",
           jstr(m, "name"), jstr(prompt, "name"), unused, cJSON_GetArrayItem(gold, k)->valueint,
           k);
    proc_free(&p);
    free(csv);
    return true;
}

/* `bench model`: the table has one row per test with a positive rate; the tg test's greedy ids
 * (debug log of its first timed run) are those `run --tokens BOS --temp 0` prints; the warm-up,
 * the timed runs and `run` each start from an empty KV cache. Bad lists, -r and a test longer
 * than --ctx are usage errors. */
/* bench load: the rows and their relations (first token before exit, the byte count = the rank
 * files' sizes), the child's own timing, --cold, usage and input errors. */
static void check_bench_load(const char *model, const char *name)
{
    struct proc p = run("bench", "load", model, "-r", "2", "--device", g_device, NULL);
    CHECK_EXIT(p, 0, "bench load");
    const char *o = p.out ? p.out : "";
    double gb = -1, rate = 0, first = 0, best = 0, ex = 0;
    const char *h = strstr(o, " rank file");
    const char *r = strstr(o, "| read: rank files, sequential read() | ");
    const char *f = strstr(o, "exec -> first token, median of 2 (best) | ");
    const char *x = strstr(o, "exec -> exit, median | ");
    if (h && (h = strstr(h, ", ")))
        gb = strtod(h + 2, NULL);
    if (r)
        rate = strtod(r + strlen("| read: rank files, sequential read() | "), NULL);
    if (f && sscanf(f + strlen("exec -> first token, median of 2 (best) | "), "%lf s (%lf s)",
                    &first, &best) != 2)
        first = 0;
    if (x)
        ex = strtod(x + strlen("exec -> exit, median | "), NULL);
    /* the bytes: every rank file of the directory */
    double want = 0;
    for (int rank = 0; rank < 8; rank++) {
        char fp[512];
        struct stat st;
        snprintf(fp, sizeof(fp), "%s/rank-%d-of-1.qshard", model, rank);
        if (stat(fp, &st) == 0)
            want += (double)st.st_size;
    }
    CHECK_MSG(want > 0 && fabs(gb - want / 1e9) < 0.0006, "%s: bench load counts %.3f GB, the "
              "rank files hold %.6f GB (stdout: %.300s)", name, gb, want / 1e9, o);
    CHECK_MSG(rate > 0 && isfinite(rate), "%s: bench load read rate %g", name, rate);
    CHECK_MSG(best > 0 && best <= first && first <= ex && ex < 60, "%s: bench load start times "
              "best %g, median %g, exit %g", name, best, first, ex);
    CHECK_MSG(strstr(o, "child: qshard run: debug: rank 0: model open") != NULL,
              "%s: bench load printed no timing line of the child (stdout: %.400s)", name, o);
    proc_free(&p);
    p = run("bench", "load", model, "-r", "1", "--cold", "--device", g_device, NULL);
    CHECK_EXIT(p, 0, "bench load --cold");
    CHECK_MSG(p.out && strstr(p.out, "cold page cache") && strstr(p.out, "| test | cold |"),
              "bench load --cold: %.200s", p.out ? p.out : "");
    proc_free(&p);
    p = run("bench", "load", NULL);
    CHECK_EXIT(p, 1, "bench load without MODEL");
    proc_free(&p);
    p = run("bench", "load", model, "-r", "0", NULL);
    CHECK_EXIT(p, 1, "bench load -r 0");
    proc_free(&p);
    char missing[512], cfg[512];
    snprintf(missing, sizeof(missing), "%s/no-such-model", g_tmp);
    p = run("bench", "load", missing, NULL);
    CHECK_EXIT(p, 4, "bench load of a missing path");
    proc_free(&p);
    snprintf(cfg, sizeof(cfg), "%s/manifest.json", model);
    p = run("bench", "load", cfg, "--device", "cpu", NULL);
    CHECK_EXIT(p, 2, "bench load of a file that is no rank file");
    proc_free(&p);
}

static void check_bench_model(const char *model, const char *name)
{
    struct proc p = run("bench", "model", model, "-p", "5,12", "-n", "6", "-r", "2", "--device",
                        g_device, "-v", NULL);
    CHECK_EXIT(p, 0, "bench model");
    const char *tests[] = {"pp5", "pp12", "tg6"};
    for (int i = 0; i < 3; i++) {
        char key[32];
        snprintf(key, sizeof(key), "| %s | ", tests[i]);
        const char *row = p.out ? strstr(p.out, key) : NULL;
        double rate = row ? strtod(row + strlen(key), NULL) : 0.0;
        CHECK_MSG(row && rate > 0.0 && isfinite(rate), "%s: bench model row %s missing or rate "
                  "%g (stdout: %.400s)", name, tests[i], rate, p.out ? p.out : "");
    }
    const char *dbg = p.err ? strstr(p.err, "bench tg6: greedy ids after ") : NULL;
    CHECK_MSG(dbg != NULL, "%s: bench model -v printed no tg ids (stderr: %.300s)", name,
              p.err ? p.err : "");
    if (dbg) {
        dbg += strlen("bench tg6: greedy ids after ");
        char first[16];
        snprintf(first, sizeof(first), "%ld", strtol(dbg, NULL, 10));
        int32_t got[16], want[16];
        int ng = parse_ids(strchr(dbg, ':') ? strchr(dbg, ':') + 1 : "", got, 16);
        struct proc r = run("run", model, "--tokens", first, "--temp", "0", "-n", "6",
                            "--print-ids", "--ignore-eos", "--device", g_device, NULL);
        CHECK_EXIT(r, 0, "run for bench model");
        int nw = parse_ids(r.out ? r.out : "", want, 16);
        CHECK_MSG(ng == 6 && nw == 6 && !memcmp(got, want, sizeof(int32_t) * 6),
                  "%s: bench tg6 ids (%d) differ from run's (%d): %.80s vs %.80s", name, ng, nw,
                  dbg, r.out ? r.out : "");
        proc_free(&r);
    }
    proc_free(&p);
    /* -d: the tg run continues a filled KV cache; its ids are those `run` prints after the
     * prefix and the first fed id. On the CPU: there `run`'s 8-row prompt and bench's 7-row
     * prefill + one decode row give the same logits (on a GPU they take different kernels, and
     * a near tie could pick another id) */
    p = run("bench", "model", model, "-p", "3", "-n", "4", "-d", "0,7", "-r", "1", "--device",
            "cpu", "-v", NULL);
    CHECK_EXIT(p, 0, "bench model -d");
    const char *drows[] = {"| pp3 | ", "| tg4 | ", "| pp3 @ d7 | ", "| tg4 @ d7 | "};
    for (int i = 0; i < 4; i++)
        CHECK_MSG(p.out && strstr(p.out, drows[i]), "%s: bench model -d: no row %s (stdout: "
                  "%.400s)", name, drows[i], p.out ? p.out : "");
    const char *pre = p.err ? strstr(p.err, "bench tg4 @ d7: prefix ids ") : NULL;
    const char *after = pre ? strstr(pre, "bench tg4: greedy ids after ") : NULL;
    CHECK_MSG(pre && after, "%s: bench model -d -v printed no prefix or ids (stderr: %.300s)",
              name, p.err ? p.err : "");
    if (pre && after) {
        pre += strlen("bench tg4 @ d7: prefix ids ");
        after += strlen("bench tg4: greedy ids after ");
        char prompt[256];
        int n = snprintf(prompt, sizeof(prompt), "%.*s,%ld", (int)strcspn(pre, "\n"), pre,
                         strtol(after, NULL, 10));
        int32_t got[16], want[16], pre_ids[16];
        CHECK_MSG(parse_ids(prompt, pre_ids, 16) == 8 && n > 0, "%s: bench -d prompt %s", name,
                  prompt);
        int ng = parse_ids(strchr(after, ':') ? strchr(after, ':') + 1 : "", got, 16);
        struct proc r = run("run", model, "--tokens", prompt, "--temp", "0", "-n", "4",
                            "--print-ids", "--ignore-eos", "--device", "cpu", NULL);
        CHECK_EXIT(r, 0, "run for bench model -d");
        int nw = parse_ids(r.out ? r.out : "", want, 16);
        CHECK_MSG(ng == 4 && nw == 4 && !memcmp(got, want, sizeof(int32_t) * 4),
                  "%s: bench tg4 @ d7 ids (%d) differ from run's (%d): %.80s vs %.80s", name, ng,
                  nw, after, r.out ? r.out : "");
        proc_free(&r);
    }
    proc_free(&p);
    /* the --ctx cases: a prompt and a generation each longer than the cache, the other off */
    const char *bad[][6] = {{"-p", "0", "-n", "0"}, {"-p", "5,,6", "-n", "2"},
                            {"-p", "abc", "-n", "2"}, {"-p", "4", "-r", "0"},
                            {"-p", "8", "-n", "0", "--ctx", "4"},
                            {"-p", "0", "-n", "5", "--ctx", "4"}, {"-n", "3,", "-r", "1"},
                            {"-n", "2", "-d", "x"}, {"-n", "2", "-d", "3", "--ctx", "4"},
                            {"extra", "-p", "4"}, {"-p", "4", "-d", "16000000"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = run("bench", "model", model, bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4],
                bad[i][5], NULL);
        char what[128];
        snprintf(what, sizeof(what), "bench model %s %s %s %s %s %s", bad[i][0], bad[i][1],
                 bad[i][2], bad[i][3], bad[i][4] ? bad[i][4] : "", bad[i][5] ? bad[i][5] : "");
        CHECK_EXIT(p, 1, what);
        CHECK_MSG(p.err && strstr(p.err, "qshard bench model"), "%s: stderr %.200s", what,
                  p.err ? p.err : "");
        proc_free(&p);
    }
}

/* Rank files that do not belong: one rank of a TP-2 set alone, and a directory whose rank 1
 * comes from another model's TP-2 conversion. */
static void check_rank_mismatch(const char *tp2_a, const char *tp2_b)
{
    char r0[600], r1b[600], mixed[600], cmd[2048];
    snprintf(r0, sizeof(r0), "%s/rank-0-of-2.qshard", tp2_a);
    struct proc p = run("run", r0, "--tokens", "1,2", "-n", "1", NULL);
    CHECK_EXIT(p, 2, "single rank of a TP-2 set");
    proc_free(&p);
    snprintf(mixed, sizeof(mixed), "%s/mixed", g_tmp);
    snprintf(r1b, sizeof(r1b), "%s/rank-1-of-2.qshard", tp2_b);
    snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s' && cp '%s' '%s/rank-1-of-2.qshard'", tp2_a,
             mixed, r1b, mixed);
    CHECK(system(cmd) == 0);
    p = run("run", mixed, "--tokens", "1,2", "-n", "1", NULL);
    CHECK_EXIT(p, 2, "rank 1 from another model");
    proc_free(&p);
}

/* `bench model -o json`: one JSON document, one entry per test with a positive rate and the
 * runs' seconds. */
static void check_bench_json(const char *model)
{
    struct proc p = run("bench", "model", model, "-p", "5", "-n", "3", "-r", "2", "-o", "json",
                        "--device", "cpu", NULL);
    CHECK_EXIT(p, 0, "bench model -o json");
    cJSON *j = cJSON_Parse(p.out);
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(j, "tests");
    CHECK_MSG(cJSON_GetArraySize(tests) == 2, "bench -o json: %.300s", p.out);
    const cJSON *t;
    cJSON_ArrayForEach(t, tests)
    {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(t, "tokens_per_s");
        CHECK(cJSON_IsNumber(r) && r->valuedouble > 0 && isfinite(r->valuedouble));
        CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(t, "runs_s")), 2);
    }
    CHECK_EQ_STR(jstr(cJSON_GetArrayItem(tests, 0), "test"), "pp5");
    CHECK_EQ_STR(jstr(cJSON_GetArrayItem(tests, 1), "test"), "tg3");
    cJSON_Delete(j);
    proc_free(&p);
}

/* The longest Llama-2 vector text drives the multi-chunk perplexity check (on the model built
 * around the Llama-2 tokenizer: tests/t_cli.h cli_llama2_model). */
static void check_perplexity_vectors(const char *model)
{
    cJSON *root = cli_read_json("tokenizer-test-vectors.json");
    CHECK(root != NULL);
    const cJSON *c, *best = NULL;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(
                              cJSON_GetObjectItemCaseSensitive(root, "llama2_spm"), "cases"))
        if (jstr(c, "text") && (!best || strlen(jstr(c, "text")) > strlen(jstr(best, "text"))))
            best = c;
    if (best) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(best, "ids");
        check_perplexity_chunks(model, jstr(best, "text"), ids,
                                cJSON_GetArrayItem(ids, 0)->valueint);
    }
    cJSON_Delete(root);
}

/*
 * Issue 21's perplexity check, for a fixture whose INDEX entry names a perplexity golden (the
 * trained KJV model: transformers fp32 on the dequantized AWQ weights, with `qshard perplexity`'s
 * chunking, tools/train/run_all.py): `perplexity --file <held-out text> --ctx <ctx> --chunks N`
 * tokenizes the whole file into as many tokens as transformers did, and each running estimate
 * [1]..[N] and the final one equal the golden's running values within 0.1 %. N is 4 (1020 scored
 * tokens; all 56 chunks take ~40 s on the CPU, ten times that under ASan), or
 * QSHARD_PPL_CHUNKS; run_all.py --qshard compares all of them.
 */
static void check_perplexity_golden(const char *model, const char *name, const cJSON *m)
{
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(m, "perplexity");
    if (!pp)
        return;
    cJSON *g = cli_read_json(jstr(pp, "golden") ? jstr(pp, "golden") : "");
    const cJSON *awq = cJSON_GetObjectItemCaseSensitive(g, "awq");
    const cJSON *running = cJSON_GetObjectItemCaseSensitive(awq, "running");
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(g, "tokens");
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(pp, "ctx");
    const char *text = jstr(pp, "text");
    CHECK_MSG(cJSON_IsArray(running) && cJSON_IsNumber(tokens) && cJSON_IsNumber(ctx) && text,
              "%s: perplexity golden %s unreadable or incomplete", name, jstr(pp, "golden"));
    int n = getenv("QSHARD_PPL_CHUNKS") ? atoi(getenv("QSHARD_PPL_CHUNKS")) : 4;
    if (n < 1 || n > cJSON_GetArraySize(running))
        n = cJSON_GetArraySize(running);
    if (!cJSON_IsArray(running) || !cJSON_IsNumber(tokens) || !cJSON_IsNumber(ctx) || !text) {
        cJSON_Delete(g);
        return;
    }
    char file[512], ctxs[16], chunks[16], count[64];
    snprintf(file, sizeof(file), DATA "%s", text);
    snprintf(ctxs, sizeof(ctxs), "%d", ctx->valueint);
    snprintf(chunks, sizeof(chunks), "%d", n);
    snprintf(count, sizeof(count), ", %d tokens: %d chunks of %d", tokens->valueint, n,
             ctx->valueint);
    struct proc p = run("perplexity", model, "--file", file, "--ctx", ctxs, "--chunks", chunks,
                        "--device", g_device, NULL);
    CHECK_EXIT(p, 0, name);
    CHECK_MSG(strstr(p.err, count) != NULL, "%s: held-out text not tokenized as transformers "
              "(\"%s\" expected): %.400s", name, count, p.err);
    const char *q = p.out;
    double v = 0, worst = 0;
    for (int k = 0; k < n; k++) {
        int idx = 0, used = 0;
        const double want = cJSON_GetArrayItem(running, k)->valuedouble;
        bool ok = sscanf(q, "[%d]%lf,%n", &idx, &v, &used) == 2 && idx == k + 1 && used > 0;
        CHECK_MSG(ok && fabs(v - want) <= 1e-3 * want, "%s: running perplexity [%d] %.6g, "
                  "transformers %.6g (output \"%.60s\")", name, k + 1, v, want, q);
        worst = fmax(worst, fabs(v - want) / want);
        if (!ok)
            break;
        q += used;
    }
    const double want = cJSON_GetArrayItem(running, n - 1)->valuedouble;
    const char *fin = strstr(p.out, "Final estimate: PPL = ");
    v = fin ? strtod(fin + strlen("Final estimate: PPL = "), NULL) : 0;
    CHECK_MSG(fin && fabs(v - want) <= 1e-3 * want, "%s: final PPL %.6g after %d chunks, "
              "transformers %.6g", name, v, n, want);
    printf("cli_model: %s: held-out perplexity after %d chunks %.4f, transformers %.4f (worst "
           "running rel diff %.1e)\n", name, n, v, want, worst);
    proc_free(&p);
    cJSON_Delete(g);
}

/* TP-N conversions of one model: greedy and logits vs the goldens (and vs TP-1 for TP-4). */
static char *check_tp(const cJSON *m, int tp, const char *dev, const char *tp1)
{
    char *d = convert(m, tp);
    if (!d)
        return NULL;
    const char *dev1 = g_device;
    g_device = dev;
    const cJSON *pr;
    cJSON_ArrayForEach(pr, cJSON_GetObjectItemCaseSensitive(m, "prompts"))
    {
        char what[256];
        snprintf(what, sizeof(what), "%s/%s tp%d", jstr(m, "name"), jstr(pr, "name"), tp);
        check_greedy(d, what, pr);
        check_logits(d, what, pr);
        if (tp1)
            check_logits_vs_tp1(d, tp1, what, pr);
    }
    g_device = dev1;
    return d;
}

int main(void)
{
    T_INIT("cli_model");
    if (!cli_setup())
        return 1;
    printf("cli_model: golden comparisons on --device %s (TP-2: %s, TP-4: %s)\n", g_device,
           g_device_tp2, g_device_tp4);
    cJSON *index = load_index();
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(index, "models"), *m;
    CHECK_MSG(cJSON_IsArray(models), "tests/data/models/INDEX.json not found");
    char *tp2[2] = {NULL, NULL};
    const char *tp2_group = NULL;
    int n_tp2 = 0;
    bool done_eos_list = false, done_bench = false;
    cJSON_ArrayForEach(m, models)
    {
        const char *name = jstr(m, "name");
        if (!name || !jstr(m, "path") ||
            cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "golden_files")) == 0)
            continue;
        const bool has_tok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "tokenizer"));
        const int checks_before = t_pass + t_fail;
        char *dir = convert(m, 1);
        if (!dir)
            continue;
        const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(m, "prompts"), *pr;
        cJSON *eos = fixture_eos(m);
        cJSON_ArrayForEach(pr, prompts)
        {
            char what[256];
            snprintf(what, sizeof(what), "%s/%s", name, jstr(pr, "name"));
            check_greedy(dir, what, pr);
            check_logits(dir, what, pr);
            check_perplexity(dir, what, pr);
            check_eos(dir, what, pr, eos);
            if (!done_eos_list && !has_tok)
                done_eos_list = check_eos_list(m, pr);
        }
        cJSON_Delete(eos);
        if (!done_bench) {
            check_bench_model(dir, name);
            check_bench_json(dir);
            check_bench_load(dir, name);
            done_bench = true;
        }
        check_perplexity_golden(dir, name, m);
        /* TP-2 for two models of different twin groups (twins convert to identical files, so
         * mixing their ranks would not be a mismatch) */
        const char *tg = jstr(m, "twin_group");
        if (n_tp2 < 2 && !has_tok && (n_tp2 == 0 || !tp2_group || !tg || strcmp(tg, tp2_group))) {
            if ((tp2[n_tp2] = check_tp(m, 2, g_device_tp2, NULL)))
                tp2_group = tg, n_tp2++;
        }
        free(check_tp(m, 4, g_device_tp4, dir));
        printf("cli_model: %s: %d checks\n", name, t_pass + t_fail - checks_before);
        free(dir);
    }
    if (n_tp2 == 2)
        check_rank_mismatch(tp2[0], tp2[1]);
    char *l2 = cli_llama2_model();
    if (l2)
        check_perplexity_vectors(l2);
    free(l2);
    CHECK_MSG(done_eos_list, "no fixture prompt has a greedy run with a new id after step 2: "
              "eos-list check not run");
    free(tp2[0]);
    free(tp2[1]);
    cJSON_Delete(index);
    cli_teardown();
    return t_done();
}

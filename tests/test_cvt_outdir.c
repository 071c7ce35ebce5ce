/*
 * test_cvt_outdir.c - what `qshard convert` does to OUT_DIR and on the command line: usage errors
 * and --dry-run (nothing written); a second conversion refused without --force and replaced with
 * it; a failed or interrupted --force run (SIGINT after opening the source, with the writers
 * open, with every new file written but not committed; a failed commit rename, undone) leaving
 * the earlier conversion byte for byte; OUT_DIR = MODEL_DIR refused; the bitwise self-check
 * catching a flipped bit on both packing paths; the output lock (a second convert into a
 * directory being written fails at once naming the writer's pid; a stale lock file blocks
 * nothing; no lock file is left); the tokenizer checks (incomplete, unloadable, larger than the
 * vocabulary: exit 2 before anything is written; smaller: fine).
 * Interrupts, rollbacks, the corrupted bit and the concurrent convert run cvt_run in process
 * with struct cvt_hooks; everything else runs the binary.
 *
 * Run from the repository root: ./build/test_cvt_outdir (QSHARD names the binary).
 */
#include <sys/file.h> /* flock */

#include "t_cvt.h"

static void test_cli(void)
{
    const char *dir = DATA "models/qwen2-bias-tied-v509";
    char out[512], *err = NULL, *sout = NULL, f[600];
    snprintf(out, sizeof(out), "%s/cli/out", g_tmp);
    CHECK_EQ_INT(run(NULL, &sout, "convert --help"), 0);
    CHECK(sout && strstr(sout, "--debug-no-fast-path") && strstr(sout, "another convert"));
    free(sout);
    sout = NULL;
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s", dir, out), 1);             /* no --tp */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp abc", dir, out), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 0", dir, out), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s --tp 1", dir), 1);               /* no OUT_DIR */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 --bogus", dir, out), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s/nonexistent %s --tp 1", g_tmp, out), 4);
    CHECK(!exists(out));
    /* impossible tp: 4 heads at tp 3; 4 is valid (o_proj local group size 64, DESIGN 4) */
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 3", dir, out), 2);
    CHECK(err && strstr(err, "valid --tp values for this model: 1 2 4"));
    free(err);
    err = NULL;
    /* --dry-run: the plan on stdout, nothing written */
    CHECK_EQ_INT(run(NULL, &sout, "convert %s %s --tp 2 --dry-run", dir, out), 0);
    CHECK(sout && strstr(sout, "V_r = ceil(509 / 2) = 255") && strstr(sout, "I_pad = 512"));
    CHECK(!exists(out));
    free(sout);
    /* --dry-run at tp 4 names the local group size decision of o_proj (K_r = 64, G = 128) */
    CHECK_EQ_INT(run(NULL, &sout, "convert %s %s --tp 4 --dry-run", dir, out), 0);
    CHECK(sout && strstr(sout, "self_attn.o_proj [K_r=64, N_r=256]: G_r = 64 < source group 128"));
    CHECK(!exists(out));
    free(sout);
    /* --dry-run names every rank's share of the intermediate (DESIGN 5, restated: U = lcm(G,
     * 64), I_pad = I rounded up to U tp, rank r holds [r I_r, min((r + 1) I_r, I))) */
    {
        const char *mi = DATA "models/llama3-gqa-i640";
        cJSON *cj = load_json(DATA "models/llama3-gqa-i640/config.json");
        long I = (long)cJSON_GetNumberValue(cJSON_GetObjectItem(cj, "intermediate_size"));
        long G = (long)cJSON_GetNumberValue(cJSON_GetObjectItem(
            cJSON_GetObjectItem(cj, "quantization_config"), "group_size"));
        cJSON_Delete(cj);
        CHECK(I > 0 && G > 0);
        for (int tp = 2; tp <= 4 && I > 0 && G > 0; tp += 2) {
            CHECK_EQ_INT(run(NULL, &sout, "convert %s --tp %d --dry-run -q", mi, tp), 0);
            long I_r = round_up_slow(I, lcm_slow(G, 64) * tp) / tp;
            for (int r = 0; r < tp; r++) {
                long lo = r * I_r < I ? r * I_r : I, hi = (r + 1) * I_r < I ? (r + 1) * I_r : I;
                char want[160];
                if (hi == lo)
                    snprintf(want, sizeof(want), "rank %d holds no intermediate rows, only %ld "
                             "zero padding\n", r, I_r);
                else if (hi - lo < I_r)
                    snprintf(want, sizeof(want), "rank %d holds intermediate [%ld, %ld) + %ld zero "
                             "padding\n", r, lo, hi, I_r - (hi - lo));
                else
                    snprintf(want, sizeof(want), "rank %d holds intermediate [%ld, %ld)\n", r, lo,
                             hi);
                CHECK_MSG(sout && strstr(sout, want), "tp %d dry-run lacks '%s'", tp, want);
            }
            free(sout);
            sout = NULL;
        }
    }
    /* --dry-run of a directory holding only a real config.json (no weights) */
    CHECK_EQ_INT(run(NULL, &sout, "convert " DATA "real-configs/twhoool02--Llama-2-7b-chat-hf-AWQ "
                                  "--tp 4 --dry-run"), 0);
    CHECK(sout && strstr(sout, "I_pad = 11264") && strstr(sout, "I_r = 2816"));
    free(sout);
    CHECK_EQ_INT(run(&err, NULL, "convert " DATA "real-configs/twhoool02--Llama-2-7b-chat-hf-AWQ "
                                 "--tp 3 --dry-run"), 2);
    CHECK(err && strstr(err, "valid --tp values for this model: 1 2 4 8 16 32"));
    free(err);
    err = NULL;
    /* second conversion into the same place: refused without --force, files untouched */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q", dir, out), 0);
    snprintf(f, sizeof(f), "%s/rank-1-of-2.qshard", out);
    size_t len0 = 0;
    char *before = t_slurp(f, &len0);
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 2 -q", dir, out), 1);
    CHECK(err && strstr(err, "--force"));
    free(err);
    size_t len1 = 0;
    char *after = t_slurp(f, &len1);
    CHECK(before && after && len0 == len1 && !memcmp(before, after, len0));
    free(after);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q --force", dir, out), 0);
    after = t_slurp(f, &len1);
    CHECK(before && after && len0 == len1 && !memcmp(before, after, len0)); /* deterministic */
    free(after);
    free(before);
    CHECK_EQ_INT(run(NULL, NULL, "verify %s", out), 0);
}
/* out_dir still holds exactly `want` (names), its manifest and rank file are byte-identical to
 * the snapshots, and `qshard verify` accepts it. */
static void ck_intact(const char *out_dir, const char *want, const char *rank_file,
                      const char *rank_bytes, size_t rank_len, const char *man_bytes,
                      size_t man_len, const char *what)
{
    char f[700], *names = dir_list(out_dir), *b;
    size_t len = 0;
    CHECK_MSG(names && !strcmp(names, want), "%s: %s holds '%s', expected '%s'", what, out_dir,
              names ? names : "(unreadable)", want);
    free(names);
    snprintf(f, sizeof(f), "%s/%s", out_dir, rank_file);
    b = t_slurp(f, &len);
    CHECK_MSG(b && rank_bytes && len == rank_len && !memcmp(b, rank_bytes, len),
              "%s: %s changed", what, f);
    free(b);
    snprintf(f, sizeof(f), "%s/manifest.json", out_dir);
    b = t_slurp(f, &len);
    CHECK_MSG(b && man_bytes && len == man_len && !memcmp(b, man_bytes, len),
              "%s: %s changed", what, f);
    free(b);
    CHECK_MSG(run(NULL, NULL, "verify %s", out_dir) == 0, "%s: verify %s fails", what, out_dir);
}

/* A failed or interrupted `convert --force` leaves the earlier conversion as it was; a
 * successful one leaves exactly the new rank files + manifest (stale ranks of another tp gone,
 * other files kept); an early signal is reported with exit 3 and leaves nothing. */
static void test_replace(void)
{
    const char *model = DATA "models/kjv-llama-awq-gemm";
    char out[512], fresh[512], f[700], g[700], *err = NULL;
    snprintf(out, sizeof(out), "%s/replace/out", g_tmp);
    snprintf(fresh, sizeof(fresh), "%s/replace/fresh", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q", model, out), 0);
    snprintf(f, sizeof(f), "%s/notes.txt", out);
    CHECK(write_text(f, "the user's own file\n"));
    size_t rank_len = 0, man_len = 0;
    snprintf(f, sizeof(f), "%s/rank-0-of-1.qshard", out);
    char *rank0 = t_slurp(f, &rank_len);
    snprintf(f, sizeof(f), "%s/manifest.json", out);
    char *man0 = t_slurp(f, &man_len);
    const char *old = "manifest.json,notes.txt,rank-0-of-1.qshard";

    /* a --force run that fails after its writers were opened (NaN scale found while repacking) */
    CHECK_EQ_INT(run(&err, NULL, "convert " DATA "bad/nan-scale %s --tp 1 --force", out), 2);
    CHECK(err && strstr(err, "NaN"));
    free(err);
    err = NULL;
    ck_intact(out, old, "rank-0-of-1.qshard", rank0, rank_len, man0, man_len, "failed --force");

    /* SIGINT during a --force run (other tp): after opening the source, with the writers open,
     * and with every new file written but not yet in place */
    static const char *const stages[] = {"opened", "writing", "written"};
    for (int i = 0; i < 3; i++) {
        const struct cvt_hooks h = {.signal_at = stages[i]};
        enum cvt_err e = cvt_inproc(&h, model, out, 2, true, false);
        CHECK_MSG(e == CVT_ERR_INTERRUPTED, "SIGINT at %s: %s, expected CVT_ERR_INTERRUPTED",
                  stages[i], cvt_err_str(e));
        CHECK_MSG(strstr(qs_log_last(), "interrupted by signal 2"), "SIGINT at %s: %s",
                  stages[i], qs_log_last());
        ck_intact(out, old, "rank-0-of-1.qshard", rank0, rank_len, man0, man_len, stages[i]);
    }
    /* an early signal into a new directory: reported, interrupted, nothing created */
    const struct cvt_hooks early = {.signal_at = "opened"};
    CHECK_EQ_INT(cvt_inproc(&early, model, fresh, 2, false, false), CVT_ERR_INTERRUPTED);
    CHECK(strstr(qs_log_last(), "interrupted by signal 2 before anything was written"));
    CHECK(!exists(fresh));

    /* a failed rename while moving a new conversion (another model, same tp) into place: every
     * rename done is undone (renames: old manifest and old rank file out, new rank file and new
     * manifest in; number k fails) */
    for (int k = 0; k < 4; k++) {
        const struct cvt_hooks h = {.commit_fail = k + 1};
        enum cvt_err e = cvt_inproc(&h, DATA "models/llama3-gqa-i640", out, 1, true, false);
        CHECK_MSG(e == CVT_ERR_IO && strstr(qs_log_last(), "cannot move"),
                  "commit rename %d fails: %s: %s", k, cvt_err_str(e), qs_log_last());
        snprintf(g, sizeof(g), "commit rename %d fails", k);
        ck_intact(out, old, "rank-0-of-1.qshard", rank0, rank_len, man0, man_len, g);
    }

    /* --force with another tp: exactly the new files (as a fresh conversion) + the user's file */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q --force", model, out), 0);
    char *names = dir_list(out);
    CHECK_MSG(names && !strcmp(names, "manifest.json,notes.txt,rank-0-of-2.qshard,"
                                      "rank-1-of-2.qshard"),
              "after --force --tp 2: %s", names ? names : "(unreadable)");
    free(names);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q", model, fresh), 0);
    static const char *const files[] = {"rank-0-of-2.qshard", "rank-1-of-2.qshard",
                                        "manifest.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(f, sizeof(f), "%s/%s", out, files[i]);
        snprintf(g, sizeof(g), "%s/%s", fresh, files[i]);
        CHECK_MSG(files_equal(f, g), "after --force --tp 2: %s differs from a fresh conversion",
                  files[i]);
    }
    snprintf(f, sizeof(f), "%s/notes.txt", out);
    char *notes = t_slurp(f, NULL);
    CHECK(notes && !strcmp(notes, "the user's own file\n"));
    free(notes);
    CHECK_EQ_INT(run(NULL, NULL, "verify %s", out), 0);
    free(rank0);
    free(man0);

    /* without --force a rank file of any world size is an earlier conversion: refused, "--force"
     * said once, nothing touched; with --force it is replaced */
    char stray[512];
    snprintf(stray, sizeof(stray), "%s/replace/stray", g_tmp);
    CHECK(mkdir(stray, 0777) == 0);
    snprintf(f, sizeof(f), "%s/rank-0-of-2.qshard", fresh);
    snprintf(g, sizeof(g), "%s/rank-0-of-3.qshard", stray);
    CHECK(copy_file(f, g));
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", model, stray), 1);
    CHECK_MSG(count_str(err, "--force") == 1, "'--force' said %d times: %s",
              count_str(err, "--force"), err ? err : "");
    free(err);
    err = NULL;
    names = dir_list(stray);
    CHECK(names && !strcmp(names, "rank-0-of-3.qshard"));
    free(names);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q --force", model, stray), 0);
    names = dir_list(stray);
    CHECK_MSG(names && !strcmp(names, "manifest.json,rank-0-of-1.qshard"), "stray: %s",
              names ? names : "(unreadable)");
    free(names);
}
/* OUT_DIR resolving to MODEL_DIR (same path, a trailing '.', a symlink) is refused with exit 1
 * and a message, and nothing is written into the model's folder. */
static void test_same_dir(void)
{
    char m[512], link[512], cmd[1200], *err = NULL;
    snprintf(m, sizeof(m), "%s/samedir/model", g_tmp);
    snprintf(link, sizeof(link), "%s/samedir/link", g_tmp);
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/samedir' && cp -r " DATA "models/kjv-llama-awq-gemm '%s'",
             g_tmp, m);
    CHECK_EQ_INT(system(cmd), 0);
    CHECK(symlink("model", link) == 0);
    char *before = dir_list(m);
    const char *outs[3] = {m, NULL, link};
    char dot[600];
    snprintf(dot, sizeof(dot), "%s/./", m);
    outs[1] = dot;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", m, outs[i]), 1);
        CHECK_MSG(err && strstr(err, "is the model directory"), "OUT_DIR %s: stderr: %s",
                  outs[i], err ? err : "");
        free(err);
        err = NULL;
        char *after = dir_list(m);
        CHECK_MSG(before && after && !strcmp(before, after), "OUT_DIR %s: model folder now %s",
                  outs[i], after ? after : "(unreadable)");
        free(after);
    }
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 --force -q", m, link), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 --dry-run -q", m, m), 1);
    char *after = dir_list(m);
    CHECK(before && after && !strcmp(before, after));
    free(after);
    free(before);
}
/* The bitwise self-check catches a packing error: one flipped code bit in one output (the
 * corrupt_output test hook of struct cvt_hooks) fails the conversion with CVT_ERR_SELF_CHECK
 * (exit 5) on the fast and on the generic path, names the tensor and the element, and leaves no
 * output; with --no-check the same corruption goes through. */
static void test_self_check(void)
{
    const char *t = "model.layers.1.mlp.down_proj";
    char out[512];
    snprintf(out, sizeof(out), "%s/selfcheck", g_tmp);
    const struct cvt_hooks h = {.corrupt_output = t};
    for (int no_fast = 0; no_fast < 2; no_fast++) { /* both packing paths */
        char *m = NULL;
        CHECK_EQ_INT(cvt_inproc_err(&h, DATA "models/llama-gqa-gemm", out, 2, false, no_fast, &m),
                     CVT_ERR_SELF_CHECK);
        CHECK_MSG(m && strstr(m, "self-check failed") && strstr(m, t) && strstr(m, "[k=0, n=0]"),
                  "fast path %s: %s", no_fast ? "off" : "on", m ? m : "");
        CHECK(!exists(out));
        free(m);
    }
    struct cvt_opts o;
    memset(&o, 0, sizeof(o));
    o.model_dir = DATA "models/llama-gqa-gemm";
    o.out_dir = out;
    o.tp = 2;
    o.quiet = o.no_check = true;
    o.hooks = &h;
    CHECK_EQ_INT(cvt_run(&o), CVT_ERR_NONE);
    CHECK(exists(out));
}
/* --- the output lock ---------------------------------------------------------------------- */

/* cvt_hooks on_stage: at "writing" (the first run holds the lock, its writers are open) run a
 * second convert into the same OUT_DIR through the binary. */
struct second_run {
    const char *model, *out;
    int rc;
    char *err;
};

static void second_convert(const char *stage, void *arg)
{
    struct second_run *s = arg;
    if (!strcmp(stage, "writing"))
        s->rc = run(&s->err, NULL, "convert %s %s --tp 1 --force", s->model, s->out);
}

static void test_lock(void)
{
    const char *model = DATA "models/llama-gqa-gemm";
    char out[512], held[512], lock[600], want[96], *err = NULL;
    snprintf(out, sizeof(out), "%s/lock/out", g_tmp);
    /* two converts into one directory at once: the second fails at once, naming the first */
    struct second_run b = {model, out, -1, NULL};
    const struct cvt_hooks h = {.on_stage = second_convert, .on_stage_arg = &b};
    CHECK_EQ_INT(cvt_inproc(&h, model, out, 1, false, false), CVT_ERR_NONE);
    snprintf(want, sizeof(want), "another qshard convert (pid %ld) is writing it", (long)getpid());
    CHECK_MSG(b.rc == 4 && b.err && strstr(b.err, want), "second convert: exit %d: %s", b.rc,
              b.err ? b.err : "");
    free(b.err);
    char *names = dir_list(out);
    CHECK_MSG(names && !strcmp(names, "manifest.json,rank-0-of-1.qshard"), "after the race: %s",
              names ? names : "(unreadable)");
    free(names);
    CHECK_EQ_INT(run(NULL, NULL, "verify %s", out), 0);

    /* a lock held by someone else: refused, nothing created; released: a stale lock file is no
     * obstacle and is gone afterwards */
    snprintf(held, sizeof(held), "%s/lock/held", g_tmp);
    snprintf(lock, sizeof(lock), "%s/.qshard-convert.lock", held);
    CHECK(mkdir(held, 0777) == 0);
    int fd = open(lock, O_RDWR | O_CREAT, 0644);
    CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && write(fd, "4242\n", 5) == 5);
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1 -q", model, held), 4);
    CHECK_MSG(err && strstr(err, "another qshard convert (pid 4242)"), "stderr: %s",
              err ? err : "");
    free(err);
    names = dir_list(held);
    CHECK_MSG(names && !strcmp(names, ".qshard-convert.lock"), "locked: %s",
              names ? names : "(unreadable)");
    free(names);
    if (fd >= 0)
        close(fd);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q", model, held), 0);
    names = dir_list(held);
    CHECK_MSG(names && !strcmp(names, "manifest.json,rank-0-of-1.qshard"), "stale lock: %s",
              names ? names : "(unreadable)");
    free(names);
}

/* --- tokenizer files ------------------------------------------------------------------------ */

/* Copy fixture `fixture` to g_tmp/tok/<name>, then apply: remove the files `rm` names (separated
 * by single spaces; or NULL), write `text` to file `wr` (or NULL). Returns the copy's path
 * (static buffer). */
static const char *tok_case(const char *name, const char *fixture, const char *rm,
                            const char *wr, const char *text)
{
    static char dir[512];
    char cmd[1400], f[600];
    snprintf(dir, sizeof(dir), "%s/tok/%s", g_tmp, name);
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/tok' && cp -r " DATA "models/%s '%s'", g_tmp,
             fixture, dir);
    CHECK_EQ_INT(system(cmd), 0);
    for (const char *r = rm; r && *r; r += strcspn(r, " "), r += *r == ' ') {
        snprintf(f, sizeof(f), "%s/%.*s", dir, (int)strcspn(r, " "), r);
        CHECK_MSG(unlink(f) == 0, "tok_case %s: cannot remove %s", name, f);
    }
    if (wr) {
        snprintf(f, sizeof(f), "%s/%s", dir, wr);
        CHECK(write_text(f, text));
    }
    return dir;
}

static void test_tokenizer(void)
{
    static const struct {
        const char *name, *fixture, *rm, *wr, *text;
        int want;
        const char *needle; /* in stderr */
    } cases[] = {
        /* incomplete: tokenizer_config.json / special_tokens_map.json without the model file */
        {"no-model-file", "kjv-llama-awq-gemm", "tokenizer.json tokenizer.model", NULL, NULL, 2,
         "incomplete tokenizer"},
        /* JSON, but not a tokenizer the runtime's loader takes */
        {"not-a-tokenizer", "kjv-llama-awq-gemm", NULL, "tokenizer.json", "{\"model\": {}}", 2,
         "hint: the tokenizer files"},
        {"unsupported", "kjv-llama-awq-gemm", NULL, "tokenizer.json",
         "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", 2, "hint: the tokenizer files"},
        {"not-json", "kjv-llama-awq-gemm", NULL, "tokenizer.json", "{\"model\": ", 2,
         "not valid JSON"},
        /* more ids than vocab_size: the 32000-id tokenizer next to a 128-id model */
        {"too-large", "llama-gqa-gemm", NULL, NULL, NULL, 2,
         "the tokenizer has 32000 ids but config.json's vocab_size is 128"},
        /* fewer ids than vocab_size (padded vocabularies, as Qwen2's): fine */
        {"smaller", "llama-gqa-gemm", NULL, "tokenizer.json",
         "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
         "\"merges\": [\"a b\"]}}",
         0, NULL},
        /* none at all: converts for token ids, with a warning */
        {"none", "llama-gqa-gemm", NULL, NULL, NULL, 0, "no tokenizer files"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *dir = tok_case(cases[i].name, cases[i].fixture, cases[i].rm, cases[i].wr,
                                   cases[i].text);
        char out[600], *err = NULL, f[700];
        if (!strcmp(cases[i].name, "too-large")) {
            snprintf(f, sizeof(f), "%s/tokenizer.json", dir);
            CHECK(copy_file(DATA "tokenizers/llama2/tokenizer.json", f));
        }
        snprintf(out, sizeof(out), "%s.out", dir);
        int rc = run(&err, NULL, "convert %s %s --tp 1", dir, out);
        CHECK_MSG(rc == cases[i].want, "tokenizer case %s: exit %d, expected %d: %s",
                  cases[i].name, rc, cases[i].want, err ? err : "");
        CHECK_MSG(!cases[i].needle || (err && strstr(err, cases[i].needle)),
                  "tokenizer case %s: stderr lacks '%s': %s", cases[i].name, cases[i].needle,
                  err ? err : "");
        CHECK_MSG(cases[i].want == 0 ? exists(out) : !exists(out), "tokenizer case %s: output",
                  cases[i].name);
        free(err);
        if (cases[i].want) { /* --dry-run reads the same files: refused as well */
            CHECK_EQ_INT(run(NULL, NULL, "convert %s --tp 1 --dry-run -q", dir), cases[i].want);
        }
    }
}

int main(void)
{
    if (!t_cvt_init("cvt_outdir"))
        return 1;
    test_cli();
    test_replace();
    test_same_dir();
    test_self_check();
    test_lock();
    test_tokenizer();
    return t_cvt_done();
}

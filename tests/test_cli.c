/*
 * test_cli.c - the runtime commands end to end: runs the qshard binary (env QSHARD, default
 * build/qshard) on fixture models converted with `qshard convert` into a temp directory, and
 * compares with references we did not write (tests/data/models/INDEX.json, goldens from HF
 * transformers):
 *   - `run --tokens <prompt ids> --temp 0 -n 16 --print-ids --ignore-eos` equals the golden
 *     greedy ids (a mismatch is tolerated only from a step whose golden top1-top2 margin is
 *     below GREEDY_TIE_MARGIN, where fp32 rounding may legitimately pick the other id);
 *   - `logits --tokens ... --out x.npy` equals the golden [T, vocab] within relative L2 5e-3;
 *   - the same through a TP-2 conversion (all ranks in one process);
 *   - every fixture with goldens also through a TP-4 conversion (o_proj then holds half of each
 *     128-row group per rank: DESIGN 4 local group size): greedy ids and logits vs the goldens
 *     as above, and logits vs the TP-1 conversion's within relative L2 1e-5;
 *   - `tokenize --text` equals HF's ids, `tokenize --decode` gives back the text, and the
 *     real Llama-2 tokenizer vectors (tests/data/tokenizer-test-vectors.json) come out of
 *     `qshard tokenize` on the rank file's embedded tokenizer;
 *   - `perplexity` equals the perplexity computed here from the golden logits with llama.cpp's
 *     method (second half of the chunk scored), and over several chunks from `logits` of each
 *     chunk (BOS replacement, running estimates, the +/- term);
 *   - `--stop STR`: the output is exactly the unstopped output cut before STR; a rewritten
 *     generation_config eos list stops greedy generation at the golden step;
 *   - streaming: stdout read from a pipe piece by piece is whole UTF-8 in every piece;
 *   - --chat gives one BOS; a seed repeats its sample, another seed differs; -f equals -p;
 *   - errors and their exit codes (DESIGN 2): token id >= vocab, prompt longer than the
 *     context (and --truncate), invalid UTF-8, empty prompt, a rank file from another model or
 *     TP set, text for a model without tokenizer (each command's hint names only its own
 *     options), bad flags (one "qshard CMD: unrecognized option" line plus "try ... --help",
 *     -n and --ctx ranges named), missing paths, an unconverted HuggingFace directory (exit 2
 *     with the convert command), --help (exit codes listed, descriptions at column 26);
 *   - `bench model`: one row per test, the tg test's greedy ids equal `run`'s, usage errors;
 *   - run --tokens on a model without tokenizer prints the ids as --print-ids does (one note
 *     on stderr); tokenize "" gives [BOS] (llama2.c vector) or nothing with --no-bos;
 *     --chat-template mistral equals BOS + tokenize("[INST] ... [/INST]"); singular "1 token".
 * Without tests/data/models/INDEX.json only the fixture-free cases run (a line says so).
 * Run: ./build/test_cli (from the repository root); QSHARD_DEVICE=cuda runs the golden
 * comparisons (greedy, logits, perplexity, stop strings) on the GPU; QSHARD_DEVICE_TP2=cuda
 * the TP-2 ones too (two GPUs), QSHARD_DEVICE_TP4=cuda the TP-4 ones (four GPUs).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "qs_log.h"
#include "rt.h"    /* rt_cuda_available */
#include "rt_io.h"
#include "t.h"

#define DATA "tests/data/"
#define REL_L2_MAX 5e-3
#define GREEDY_TIE_MARGIN 1e-2
#define MAX_ARGS 64

static const char *g_bin;
static const char *g_device = "cpu"; /* env QSHARD_DEVICE: where the golden comparisons run */
/* env QSHARD_DEVICE_TP2: where the TP-2 comparisons run (default cpu: all ranks in one process;
 * cuda needs two GPUs) */
static const char *g_device_tp2 = "cpu";
/* env QSHARD_DEVICE_TP4: where the TP-4 comparisons run (default cpu; cuda needs four GPUs) */
static const char *g_device_tp4 = "cpu";
#define TP_REL_L2_MAX 1e-5
static char g_tmp[256];

// --- running the binary --------------------------------------------------------------------

struct proc {
    int code;  /* exit status; -1 if it did not exit normally (crash) */
    char *out; /* stdout, NUL-terminated */
    char *err; /* stderr */
    size_t out_len;
};

static void proc_free(struct proc *p)
{
    free(p->out);
    free(p->err);
    memset(p, 0, sizeof(*p));
}

/* Run g_bin with argv (NULL-terminated, without argv[0]); capture stdout/stderr. */
static struct proc run_v(const char *const *args)
{
    struct proc p = {.code = -1};
    char outp[300], errp[300];
    snprintf(outp, sizeof(outp), "%s/stdout", g_tmp);
    snprintf(errp, sizeof(errp), "%s/stderr", g_tmp);
    const char *argv[MAX_ARGS + 2];
    int n = 0;
    argv[n++] = g_bin;
    for (; args[n - 1] && n < MAX_ARGS; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0)
            _exit(127);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st))
        p.code = WEXITSTATUS(st);
    size_t el;
    qs_log_set_quiet(true);
    if (rt_file_read(outp, 1 << 26, &p.out, &p.out_len))
        p.out = strdup("");
    if (rt_file_read(errp, 1 << 26, &p.err, &el))
        p.err = strdup("");
    qs_log_set_quiet(false);
    return p;
}

/* run(a, b, ..., NULL) */
static struct proc run(const char *a0, ...)
{
    const char *args[MAX_ARGS + 1];
    int n = 0;
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && n < MAX_ARGS; a = va_arg(ap, const char *))
        args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    return run_v(args);
}

/* Check the exit code; print the command's stderr when it differs. */
#define CHECK_EXIT(p, want, what)                                                          \
    do {                                                                                   \
        CHECK_MSG((p).code == (want), "%s: exit %d, expected %d; stderr: %.400s", (what),  \
                  (p).code, (want), (p).err);                                              \
    } while (0)

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

// --- small parsers -------------------------------------------------------------------------

/* "1,2,3\n" -> ids; returns count (or -1 on junk). */
static int parse_ids(const char *s, int32_t *ids, int cap)
{
    int n = 0;
    while (*s) {
        while (*s == ',' || *s == '\n' || *s == ' ')
            s++;
        if (!*s)
            break;
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || n == cap)
            return -1;
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

static char *ids_csv(const cJSON *arr)
{
    size_t cap = 16 * (size_t)cJSON_GetArraySize(arr) + 2, len = 0;
    char *s = malloc(cap);
    s[0] = '\0';
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
        len += (size_t)snprintf(s + len, cap - len, "%s%d", len ? "," : "", it->valueint);
    return s;
}

static cJSON *load_index(void)
{
    char *buf = NULL;
    size_t len = 0;
    qs_log_set_quiet(true);
    enum rt_io_err e = rt_file_read(DATA "models/INDEX.json", 1 << 24, &buf, &len);
    qs_log_set_quiet(false);
    if (e)
        return NULL;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    return j;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

// --- fixture checks ------------------------------------------------------------------------

/* Convert tests/data/<model path> into g_tmp/<name>-tp<tp>; returns the output dir or NULL. */
static char *convert(const cJSON *m, int tp)
{
    char src[512], *dst = malloc(512), tps[16];
    snprintf(src, sizeof(src), DATA "%s", jstr(m, "path"));
    snprintf(dst, 512, "%s/%s-tp%d", g_tmp, jstr(m, "name"), tp);
    snprintf(tps, sizeof(tps), "%d", tp);
    struct proc p = run("convert", src, dst, "--tp", tps, NULL);
    CHECK_EXIT(p, 0, jstr(m, "name"));
    bool ok = p.code == 0;
    proc_free(&p);
    if (!ok) {
        free(dst);
        return NULL;
    }
    return dst;
}

static double rel_l2(const float *a, const float *b, size_t n, double *norm_b)
{
    double d = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        d += e * e;
        nb += (double)b[i] * b[i];
    }
    *norm_b = sqrt(nb);
    return nb > 0 ? sqrt(d / nb) : INFINITY;
}

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
        const float *row = g + (size_t)j * (size_t)c;
        double mx = -INFINITY, s = 0;
        for (int64_t v = 0; v < c; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int64_t v = 0; v < c; v++)
            s += exp(row[v] - mx);
        int tgt = cJSON_GetArrayItem(pids, j + 1)->valueint;
        nll -= row[tgt] - mx - log(s);
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

static void check_tokenize(const char *model, const char *name, const cJSON *prompt)
{
    /* HF's ids: the golden's "hf_ids_tokenizers" (the HF tokenizers library's encoding of the
     * text, stored by the fixture generator) */
    const char *text = jstr(prompt, "text");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "hf_ids_tokenizers");
    if (!text)
        return;
    if (!cJSON_IsArray(pids)) {
        printf("cli: note: %s has no HF token ids in the golden: tokenize check skipped\n", name);
        return;
    }
    struct proc p = run("tokenize", model, "--text", text, NULL);
    CHECK_EXIT(p, 0, name);
    int32_t got[512];
    int n = parse_ids(p.out, got, 512), ng = cJSON_GetArraySize(pids), bad = 0;
    for (int i = 0; i < n && i < ng; i++)
        bad += got[i] != cJSON_GetArrayItem(pids, i)->valueint;
    CHECK_MSG(n == ng && bad == 0, "%s: tokenize \"%s\" gives %d ids (%d differ), HF has %d",
              name, text, n, bad, ng);
    proc_free(&p);
    /* decode the ids without the BOS: the text comes back (HF decode, leading space stripped) */
    if (ng > 1) {
        cJSON *rest = cJSON_Duplicate(pids, 1);
        cJSON_DeleteItemFromArray(rest, 0);
        char *csv = ids_csv(rest);
        p = run("tokenize", model, "--decode", csv, NULL);
        CHECK_EXIT(p, 0, name);
        size_t tl = strlen(text);
        CHECK_MSG(p.out_len == tl + 1 && !strncmp(p.out, text, tl),
                  "%s: decode gives \"%s\", expected \"%s\"", name, p.out, text);
        proc_free(&p);
        free(csv);
        cJSON_Delete(rest);
    }
}

/* --stop: the stopped output is the unstopped output cut right before the stop string's first
 * occurrence in the continuation. */
static void check_stop(const char *model, const char *name, const cJSON *prompt)
{
    const char *text = jstr(prompt, "text");
    if (!text)
        return;
    struct proc full = run("run", model, "-p", text, "--temp", "0", "-n", "24", "--ignore-eos",
                           "--device", g_device, NULL);
    CHECK_EXIT(full, 0, name);
    size_t tl = strlen(text);
    CHECK_MSG(full.out_len > tl && !strncmp(full.out, text, tl), "%s: prompt not echoed", name);
    /* -f FILE is the same prompt as -p TEXT */
    char pf[512];
    snprintf(pf, sizeof(pf), "%s/prompt.txt", g_tmp);
    FILE *f = fopen(pf, "wb");
    fputs(text, f);
    fclose(f);
    struct proc byfile = run("run", model, "-f", pf, "--temp", "0", "-n", "24", "--ignore-eos",
                             "--device", g_device, NULL);
    CHECK_EXIT(byfile, 0, name);
    CHECK_MSG(!strcmp(byfile.out, full.out), "%s: -f output differs from -p", name);
    proc_free(&byfile);
    if (full.code != 0 || full.out_len <= tl + 4) {
        proc_free(&full);
        return;
    }
    /* a stop string from the middle of the continuation, starting at a UTF-8 lead byte */
    const char *cont = full.out + tl;
    size_t cl = strlen(cont), at;
    if (cl > 0 && cont[cl - 1] == '\n')
        cl--; /* the closing newline is printed by run, not generated */
    at = cl / 3;
    while (at < cl && ((unsigned char)cont[at] & 0xC0) == 0x80)
        at++;
    size_t sl = 0;
    while (at + sl < cl && sl < 3) { /* three characters, or what is left */
        sl++;
        while (at + sl < cl && ((unsigned char)cont[at + sl] & 0xC0) == 0x80)
            sl++;
    }
    char stop[64];
    if (sl == 0 || sl >= sizeof(stop) || cont[at] == '\n') {
        proc_free(&full);
        return;
    }
    memcpy(stop, cont + at, sl);
    stop[sl] = '\0';
    size_t first = (size_t)(strstr(cont, stop) - cont);
    struct proc p = run("run", model, "-p", text, "--temp", "0", "-n", "24", "--ignore-eos",
                        "--stop", stop, "--stop", "\xF0\x9F\xA6\x99 never", "--device", g_device,
                        NULL);
    CHECK_EXIT(p, 0, name);
    /* expected: prompt + continuation before the stop string, then the closing newline */
    CHECK_MSG(p.out_len == tl + first + 1 && !strncmp(p.out, full.out, tl + first),
              "%s: --stop \"%s\": got \"%s\", expected the first %zu bytes of \"%s\"", name,
              stop, p.out, tl + first, full.out);
    CHECK_MSG(strstr(p.err, "stopped: stop string") != NULL, "%s: stderr: %.300s", name, p.err);
    proc_free(&p);
    proc_free(&full);
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

/* Is the fixture's tokenizer.json the Llama-2 one whose real vectors we hold? */
static bool has_llama2_tokenizer(const cJSON *m)
{
    char path[512], *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    snprintf(path, sizeof(path), DATA "%s/tokenizer.json", jstr(m, "path"));
    qs_log_set_quiet(true);
    bool same = !rt_file_read(path, 1 << 26, &a, &la) &&
                !rt_file_read(DATA "tokenizers/llama2/tokenizer.json", 1 << 26, &b, &lb) &&
                la == lb && !memcmp(a, b, la);
    qs_log_set_quiet(false);
    free(a);
    free(b);
    return same;
}

/* `qshard tokenize` on the embedded tokenizer vs the real Llama-2 vectors (third-party ids,
 * tests/data/tokenizer-test-vectors.json "llama2_spm"); returns the vectors for later use. */
static cJSON *check_tokenize_vectors(const char *model)
{
    char *buf = NULL;
    size_t len;
    if (rt_file_read(DATA "tokenizer-test-vectors.json", 1 << 26, &buf, &len)) {
        CHECK_MSG(0, "tests/data/tokenizer-test-vectors.json unreadable");
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "llama2_spm"), "cases");
    CHECK(cJSON_GetArraySize(cases) > 0);
    const cJSON *c;
    int n_checked = 0;
    cJSON_ArrayForEach(c, cases)
    {
        const char *text = jstr(c, "text");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "ids");
        if (!text || !cJSON_IsArray(ids))
            continue; /* "" included: [BOS], as HF tokenizer("") */
        struct proc p = run("tokenize", model, "--text", text, NULL);
        CHECK_EXIT(p, 0, "tokenize vector");
        int32_t got[4096];
        int n = parse_ids(p.out, got, 4096), nw = cJSON_GetArraySize(ids), bad = 0;
        for (int i = 0; i < n && i < nw; i++)
            bad += got[i] != cJSON_GetArrayItem(ids, i)->valueint;
        CHECK_MSG(n == nw && bad == 0, "tokenize \"%.40s\": %d ids (%d differ), vector has %d",
                  text, n, bad, nw);
        proc_free(&p);
        n_checked++;
    }
    printf("cli: %d Llama-2 tokenizer vectors through `qshard tokenize`\n", n_checked);
    /* `logits --text` encodes like `tokenize` (BOS included): same file as with the vector ids */
    const cJSON *c0 = cJSON_GetArrayItem(cases, 0);
    if (c0 && jstr(c0, "text")) {
        char a[512], b[512], *csv = ids_csv(cJSON_GetObjectItemCaseSensitive(c0, "ids"));
        snprintf(a, sizeof(a), "%s/by_text.npy", g_tmp);
        snprintf(b, sizeof(b), "%s/by_ids.npy", g_tmp);
        struct proc p = run("logits", model, "--text", jstr(c0, "text"), "--out", a, NULL);
        CHECK_EXIT(p, 0, "logits --text");
        proc_free(&p);
        p = run("logits", model, "--tokens", csv, "--out", b, NULL);
        CHECK_EXIT(p, 0, "logits --tokens");
        proc_free(&p);
        char *fa = NULL, *fb = NULL;
        size_t la = 0, lb = 0;
        CHECK(!rt_file_read(a, 1 << 26, &fa, &la) && !rt_file_read(b, 1 << 26, &fb, &lb) &&
              la == lb && la > 128 && !memcmp(fa, fb, la));
        free(fa);
        free(fb);
        free(csv);
    }
    return root;
}

/* --chat on a Llama-2 tokenizer: the prompt is the Llama-2 template ([INST] <<SYS>> ...) with
 * exactly one BOS (the template text has "<s>" and encode must not add a second); a model
 * whose tokenizer_config has no recognisable template needs --chat-template (exit 2 + hint). */
static void check_chat(const char *model, const char *name, const char *fixture_path)
{
    struct proc p = run("run", model, "-p", "Hello there", "--chat-template", "llama2",
                        "--system", "Be brief.", "-n", "1", "--temp", "0", "-v", NULL);
    CHECK_EXIT(p, 0, name);
    const char *at = strstr(p.err, "prompt ids: ");
    int32_t ids[256];
    char line[1024] = "";
    if (at)
        sscanf(at + strlen("prompt ids: "), "%1023[0-9,]", line);
    int n = parse_ids(line, ids, 256);
    /* ids: BOS, then the template's "[INST]" pieces; never BOS twice */
    CHECK_MSG(n > 2 && ids[0] == 1 && ids[1] != 1, "%s: chat prompt ids: %.200s", name,
              at ? at : p.err);
    proc_free(&p);
    /* the fixture's tokenizer_config.json: a known family only if it has a chat_template */
    char cfg[512], *buf = NULL;
    size_t len;
    snprintf(cfg, sizeof(cfg), DATA "%s/tokenizer_config.json", fixture_path);
    bool has_template = false;
    CHECK_EQ_INT(rt_file_read(cfg, 1 << 24, &buf, &len), RT_IO_ERR_NONE);
    has_template = buf && strstr(buf, "chat_template") != NULL;
    free(buf);
    if (!has_template) {
        p = run("run", model, "-p", "Hello", "--chat", "-n", "1", NULL);
        CHECK_EXIT(p, 2, "--chat without a chat template");
        CHECK_MSG(strstr(p.err, "--chat-template") != NULL, "no hint: %.300s", p.err);
        /* the hint names every family rt_chat_family_parse accepts */
        CHECK_MSG(strstr(p.err, "llama2") && strstr(p.err, "llama3") && strstr(p.err, "mistral") &&
                      strstr(p.err, "chatml"),
                  "hint does not list all four families: %.300s", p.err);
        proc_free(&p);
    }
    p = run("run", model, "-p", "Hello", "--chat-template", "vicuna", "-n", "1", NULL);
    CHECK_EXIT(p, 1, "unknown --chat-template");
    CHECK_MSG(strstr(p.err, "mistral") != NULL,
              "unknown-family error does not list mistral: %.300s", p.err);
    proc_free(&p);
    /* --chat-template mistral (implies --chat): "<s>[INST] Hello there [/INST]" as the Mistral
     * Instruct template renders one user turn, i.e. BOS + tokenizer("[INST] Hello there [/INST]")
     * without its own BOS */
    p = run("run", model, "-p", "Hello there", "--chat-template", "mistral", "-n", "1", "--temp",
            "0", "-v", NULL);
    CHECK_EXIT(p, 0, "--chat-template mistral");
    struct proc t = run("tokenize", model, "--text", "[INST] Hello there [/INST]", "--ids", NULL);
    CHECK_EXIT(t, 0, "tokenize [INST]");
    at = strstr(p.err, "prompt ids: ");
    line[0] = '\0';
    if (at)
        sscanf(at + strlen("prompt ids: "), "%1023[0-9,]", line);
    char want[1024] = "";
    sscanf(t.out, "[%1023[0-9, ]", want);
    for (char *r = want, *w = want;; r++) /* "1, 2" -> "1,2" */
        if (*r != ' ' && !(*w++ = *r))
            break;
    CHECK_MSG(line[0] && !strcmp(line, want), "%s: mistral chat prompt ids %s, expected %s", name,
              line, want);
    proc_free(&t);
    proc_free(&p);
}

/* Structural UTF-8 check (RFC 3629); returns the offset of the first bad byte or -1. */
static long utf8_bad_at(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2
                                        : c >= 0xE0 && c <= 0xEF ? 3
                                        : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + len > n)
            return (long)i;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (len > 1 && (p[i + 1] < lo || p[i + 1] > hi))
            return (long)i;
        for (unsigned k = 2; k < len; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return (long)i;
        i += len;
    }
    return -1;
}

/* Streaming never writes half a UTF-8 character: read `run`'s stdout from a pipe as it is
 * written (each read returns one or more whole writes) and check every piece on its own.
 * Sampling at temperature 2 over the whole vocabulary draws byte-fallback tokens (<0xE5>...),
 * which hold partial characters until the next token completes them. */
static void check_streaming(const char *model)
{
    int fd[2];
    if (pipe(fd) != 0)
        return;
    const char *argv[] = {g_bin, "run", model, "-p", "Grüße 🦙", "-n", "300", "--temp", "2",
                          "--top-k", "0", "--top-p", "1", "--seed", "11", "--ignore-eos",
                          NULL};
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    static unsigned char all[1 << 20];
    size_t total = 0;
    int pieces = 0, bad_pieces = 0;
    for (;;) {
        unsigned char buf[65536];
        ssize_t r = read(fd[0], buf, sizeof(buf));
        if (r <= 0)
            break;
        pieces++;
        if (utf8_bad_at(buf, (size_t)r) >= 0)
            bad_pieces++;
        if (total + (size_t)r <= sizeof(all)) {
            memcpy(all + total, buf, (size_t)r);
            total += (size_t)r;
        }
    }
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "streaming run failed");
    CHECK_MSG(bad_pieces == 0, "%d of %d pieces of streamed output are not whole UTF-8",
              bad_pieces, pieces);
    CHECK_MSG(utf8_bad_at(all, total) < 0, "streamed output is not valid UTF-8");
    CHECK_MSG(pieces > 10, "only %d pieces: the output was not streamed", pieces);
    printf("cli: streaming: %zu bytes in %d pieces, each whole UTF-8\n", total, pieces);
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
                const float *row = lg + (size_t)j * (size_t)c;
                double mx = -INFINITY, sm = 0;
                for (int64_t v = 0; v < c; v++)
                    mx = row[v] > mx ? row[v] : mx;
                for (int64_t v = 0; v < c; v++)
                    sm += exp(row[v] - mx);
                double lp = row[cJSON_GetArrayItem(chunk, j + 1)->valueint] - mx - log(sm);
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
    char src[512], dir[512], out[512], cmd[2048], gc[600];
    snprintf(src, sizeof(src), DATA "%s", jstr(m, "path"));
    snprintf(dir, sizeof(dir), "%s/eoslist-src", g_tmp);
    snprintf(out, sizeof(out), "%s/eoslist", g_tmp);
    snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s'", src, dir);
    CHECK(system(cmd) == 0);
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

// --- error cases ---------------------------------------------------------------------------

/* --help layout: every option line ("  -x" / "  --x") has its description at column 26, and
 * every continuation line is indented to column 26. */
static void check_help_layout(const char *cmd, const char *help)
{
    int bad = 0;
    const char *first_bad = NULL;
    for (const char *l = help; *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        long col = -1; /* where the description starts */
        if (n > 3 && !strncmp(l, "  -", 3)) {
            const char *gap = strstr(l + 2, "  "); /* option text has single spaces only */
            if (gap && gap < l + n) {
                col = gap - l;
                while (col < (long)n && l[col] == ' ')
                    col++;
            }
        } else if (n > 3 && !strncmp(l, "   ", 3)) {
            col = 0;
            while (col < (long)n && l[col] == ' ')
                col++;
        }
        if (col >= 0 && col != 26 && !bad++)
            first_bad = l;
        l += n + (e != NULL);
    }
    CHECK_MSG(bad == 0, "%s --help: %d line(s) not aligned at column 26, first: %.80s", cmd, bad,
              first_bad ? first_bad : "");
}

/* `bench model`: the table has one row per test with a positive rate; the tg test's greedy ids
 * (debug log of its first timed run) are those `run --tokens BOS --temp 0` prints; the warm-up,
 * the timed runs and `run` each start from an empty KV cache. Bad lists, -r and a test longer
 * than --ctx are usage errors. */
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

/* `run`/`logits`/`perplexity`/`tokenize` on a HuggingFace checkpoint directory (not converted):
 * exit 2 and the convert command, for every command. */
static void check_hf_dir(const char *src)
{
    char txt[300];
    snprintf(txt, sizeof(txt), "%s/hf.txt", g_tmp);
    FILE *f = fopen(txt, "wb");
    fputs("some text", f);
    fclose(f);
    struct proc p[4] = {
        run("run", src, "-p", "hi", "-n", "1", NULL),
        run("logits", src, "--tokens", "1,2", "--out", "/dev/null", NULL),
        run("perplexity", src, "--file", txt, "--ctx", "4", NULL),
        run("tokenize", src, "--text", "hi", NULL),
    };
    for (int i = 0; i < 4; i++) {
        CHECK_EXIT(p[i], 2, "HF directory");
        CHECK_MSG(strstr(p[i].err, "HuggingFace model directory") &&
                      strstr(p[i].err, "qshard convert"),
                  "HF directory %s: %.300s", src, p[i].err);
        proc_free(&p[i]);
    }
}

static void check_errors_without_fixtures(void)
{
    {
        struct proc p = run("bench", "model", "--help", NULL);
        CHECK_EXIT(p, 0, "bench model --help");
        CHECK_MSG(p.out && strstr(p.out, "usage: qshard bench model") && strstr(p.out, "exit codes:"),
                  "bench model --help: %.100s", p.out ? p.out : "");
        check_help_layout("bench model", p.out ? p.out : "");
        proc_free(&p);
        p = run("bench", "model", "--no-such-flag", NULL);
        CHECK_EXIT(p, 1, "bench model --no-such-flag");
        CHECK_MSG(p.err && strstr(p.err, "try 'qshard bench model --help'"), "bench model "
                  "--no-such-flag: stderr \"%.300s\"", p.err ? p.err : "");
        proc_free(&p);
    }
    const char *cmds[] = {"run", "logits", "perplexity", "tokenize"};
    for (int i = 0; i < 4; i++) {
        struct proc p = run(cmds[i], "--help", NULL);
        CHECK_EXIT(p, 0, cmds[i]);
        CHECK_MSG(strstr(p.out, "usage: qshard") != NULL, "%s --help: %.100s", cmds[i], p.out);
        CHECK_MSG(strstr(p.out, "exit codes:") != NULL, "%s --help lists no exit codes", cmds[i]);
        check_help_layout(cmds[i], p.out);
        proc_free(&p);
        /* an unknown option: one message naming the command and a pointer to --help, not the
         * whole help text */
        char want[128], try[128];
        snprintf(want, sizeof(want), "qshard %s: unknown option '--no-such-flag'", cmds[i]);
        snprintf(try, sizeof(try), "try 'qshard %s --help'", cmds[i]);
        p = run(cmds[i], "--no-such-flag", NULL);
        CHECK_EXIT(p, 1, cmds[i]);
        CHECK_MSG(strstr(p.err, want) && strstr(p.err, try) && !strstr(p.err, "usage:"),
                  "%s --no-such-flag: stderr \"%.300s\"", cmds[i], p.err);
        proc_free(&p);
        p = run(cmds[i], NULL); /* no model */
        CHECK_EXIT(p, 1, cmds[i]);
        proc_free(&p);
    }
    struct proc p = run("run", "--help", NULL);
    CHECK_MSG(strstr(p.out, "mistral") && strstr(p.out, "implies"),
              "run --help: --chat-template families or 'implies --chat' missing");
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", NULL);
    CHECK_EXIT(p, 4, "missing model path");
    proc_free(&p);
    /* -n: [-1, 2^24], the message names the range */
    p = run("run", "/nonexistent/model", "-p", "hi", "-n", "16777217", NULL);
    CHECK_EXIT(p, 1, "-n 2^24 + 1");
    CHECK_MSG(strstr(p.err, "16777216") != NULL, "-n range not named: %.300s", p.err);
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "-n", "16777216", NULL);
    CHECK_EXIT(p, 4, "-n 2^24 accepted (then the missing model)");
    proc_free(&p);
    /* --ctx: at least 2 (one prompt token and one generated), refused as a usage error */
    struct proc pc[2] = {
        run("run", "/nonexistent/model", "--tokens", "1", "--ctx", "1", NULL),
        run("logits", "/nonexistent/model", "--tokens", "1", "--ctx", "1", "--out", "/dev/null",
            NULL),
    };
    for (int i = 0; i < 2; i++) {
        CHECK_EXIT(pc[i], 1, "--ctx 1");
        CHECK_MSG(strstr(pc[i].err, "--ctx") && strstr(pc[i].err, "[2,"), "--ctx 1: %.300s",
                  pc[i].err);
        proc_free(&pc[i]);
    }
    p = run("run", "/nonexistent/model", "--tokens", "1", "--ctx", "2", NULL);
    CHECK_EXIT(p, 4, "--ctx 2 accepted (then the missing model)");
    proc_free(&p);
    p = run("tokenize", "/nonexistent/model", "--text", "hi", NULL);
    CHECK_EXIT(p, 4, "tokenize missing model path");
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "--temp", "-1", NULL);
    CHECK_EXIT(p, 1, "negative temperature");
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "--top-p", "1.5", NULL);
    CHECK_EXIT(p, 1, "top-p > 1");
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "--tokens", "1,2", NULL);
    CHECK_EXIT(p, 1, "both -p and --tokens");
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "--device", "tpu", NULL);
    CHECK_EXIT(p, 1, "unknown device");
    proc_free(&p);
    p = run("logits", "/nonexistent/model", "--tokens", "1,2", NULL);
    CHECK_EXIT(p, 1, "logits without --out");
    proc_free(&p);
    /* a file that is not a rank file */
    char junk[300];
    snprintf(junk, sizeof(junk), "%s/junk.qshard", g_tmp);
    FILE *f = fopen(junk, "wb");
    fputs("this is not a qshard file, just some text long enough to read a header from it......"
          "...................................................................................."
          "....................................................................................",
          f);
    fclose(f);
    p = run("run", junk, "--tokens", "1,2", NULL);
    CHECK_EXIT(p, 2, "junk rank file");
    proc_free(&p);
    p = run("tokenize", junk, "--text", "hi", NULL);
    CHECK_EXIT(p, 2, "tokenize junk rank file");
    proc_free(&p);
}

static void check_errors_with_model(const char *model, const char *name, bool has_tok,
                                    int vocab)
{
    char big[32], msg[128];
    snprintf(big, sizeof(big), "1,%d", vocab);
    snprintf(msg, sizeof(msg), "%s: token id = vocab_size", name);
    struct proc p = run("run", model, "--tokens", big, "-n", "1", NULL);
    CHECK_EXIT(p, 2, msg);
    CHECK_MSG(strstr(p.err, "vocab") || strstr(p.err, "outside"), "%s: %.200s", msg, p.err);
    proc_free(&p);
    p = run("logits", model, "--tokens", big, "--out", "/dev/null", NULL);
    CHECK_EXIT(p, 2, msg);
    proc_free(&p);
    p = run("run", model, "--tokens", "1,2,x", NULL);
    CHECK_EXIT(p, 2, "malformed --tokens");
    proc_free(&p);
    /* context: 5 prompt tokens, --ctx 4: refused with the limit named, or truncated */
    p = run("run", model, "--tokens", "1,5,6,7,8", "--ctx", "4", "-n", "2", "--temp", "0",
            "--print-ids", NULL);
    CHECK_EXIT(p, 2, "prompt longer than the context");
    CHECK_MSG(strstr(p.err, "5 tokens") && strstr(p.err, "4"), "context message: %.300s", p.err);
    proc_free(&p);
    p = run("run", model, "--tokens", "1,5,6,7,8", "--ctx", "4", "-n", "3", "--temp", "0",
            "--print-ids", "--truncate", "--ignore-eos", NULL);
    CHECK_EXIT(p, 0, "--truncate");
    int32_t ids[8];
    CHECK_MSG(parse_ids(p.out, ids, 8) == 2, "--truncate with ctx 4: 3 prompt tokens, 2 "
              "generated before the context is full; got \"%s\"", p.out);
    CHECK_MSG(strstr(p.err, "context full") != NULL, "no context-full note: %.300s", p.err);
    proc_free(&p);
    p = run("logits", model, "--tokens", "1,5,6,7,8", "--ctx", "4", "--out", "/dev/null", NULL);
    CHECK_EXIT(p, 2, "logits prompt longer than the context");
    proc_free(&p);
    /* a seed repeats its sample; another seed gives another one (24 tokens at temperature 1.5
     * over >= 128 ids: equal by chance with negligible probability) */
    struct proc a = run("run", model, "--tokens", "1,5,6", "-n", "24", "--temp", "1.5", "--top-k",
                        "0", "--top-p", "1", "--seed", "7", "--print-ids", "--ignore-eos", NULL);
    struct proc b = run("run", model, "--tokens", "1,5,6", "-n", "24", "--temp", "1.5", "--top-k",
                        "0", "--top-p", "1", "--seed", "7", "--print-ids", "--ignore-eos", NULL);
    struct proc d = run("run", model, "--tokens", "1,5,6", "-n", "24", "--temp", "1.5", "--top-k",
                        "0", "--top-p", "1", "--seed", "8", "--print-ids", "--ignore-eos", NULL);
    CHECK_EXIT(a, 0, "seeded run");
    CHECK_MSG(a.out_len > 24 && !strcmp(a.out, b.out), "%s: seed 7 twice: \"%s\" vs \"%s\"",
              name, a.out, b.out);
    CHECK_MSG(strcmp(a.out, d.out) != 0, "%s: seeds 7 and 8 both give \"%s\"", name, a.out);
    proc_free(&a);
    proc_free(&b);
    proc_free(&d);
    /* -n 2: one prefill of 3 tokens, one decode step: "decode 1 token in", never "1 tokens" */
    p = run("run", model, "--tokens", "1,5,6", "-n", "2", "--temp", "0", "--print-ids",
            "--ignore-eos", NULL);
    CHECK_EXIT(p, 0, "run -n 2");
    CHECK_MSG(strstr(p.err, "prefill 3 tokens in") && strstr(p.err, "decode 1 token in") &&
                  !strstr(p.err, " 1 tokens"),
              "%s: speed line: %.300s", name, p.err);
    proc_free(&p);
    if (!rt_cuda_available()) {
        p = run("run", model, "--tokens", "1,5,6", "-n", "1", "--device", "cuda", NULL);
        CHECK_EXIT(p, 3, "--device cuda without a usable GPU");
        proc_free(&p);
    }
    if (has_tok) {
        p = run("run", model, "-p", "", NULL);
        CHECK_EXIT(p, 2, "empty prompt");
        proc_free(&p);
        p = run("run", model, "-p", "caf\xC3", "-n", "1", NULL);
        CHECK_EXIT(p, 2, "truncated UTF-8");
        proc_free(&p);
        p = run("run", model, "-p", "\xED\xA0\x80 surrogate", "-n", "1", NULL);
        CHECK_EXIT(p, 2, "UTF-8 surrogate");
        proc_free(&p);
        p = run("tokenize", model, "--text", "\xC0\xAF", NULL);
        CHECK_EXIT(p, 2, "tokenize overlong UTF-8");
        proc_free(&p);
        p = run("tokenize", model, "--decode", big, NULL);
        CHECK_EXIT(p, 2, "decode id >= vocab");
        proc_free(&p);
        /* tokenize "" without BOS: nothing, exit 0 (HF tokenizer("", add_special_tokens=False)
         * is []); with BOS the Llama-2 vectors check [1] */
        p = run("tokenize", model, "--text", "", "--no-bos", NULL);
        CHECK_EXIT(p, 0, "tokenize empty text --no-bos");
        CHECK_MSG(p.out_len == 0, "tokenize \"\" --no-bos printed \"%s\"", p.out);
        proc_free(&p);
        p = run("tokenize", model, "--text", "", "--no-bos", "--ids", NULL);
        CHECK_EXIT(p, 0, "tokenize empty text --no-bos --ids");
        CHECK_MSG(!strcmp(p.out, "[]\n"), "tokenize \"\" --no-bos --ids printed \"%s\"", p.out);
        proc_free(&p);
    } else {
        p = run("run", model, "-p", "hello", "-n", "1", NULL);
        CHECK_EXIT(p, 2, "text without tokenizer");
        CHECK_MSG(strstr(p.err, "--tokens") != NULL, "no --tokens hint: %.300s", p.err);
        proc_free(&p);
        /* logits/perplexity: the hint names only their own options */
        char txt[300];
        snprintf(txt, sizeof(txt), "%s/hello.txt", g_tmp);
        FILE *f = fopen(txt, "wb");
        fputs("hello world", f);
        fclose(f);
        p = run("logits", model, "--text", "hello", "--out", "/dev/null", NULL);
        CHECK_EXIT(p, 2, "logits text without tokenizer");
        CHECK_MSG(strstr(p.err, "--tokens") && !strstr(p.err, "--print-ids"),
                  "logits hint: %.300s", p.err);
        proc_free(&p);
        p = run("perplexity", model, "--file", txt, "--ctx", "4", NULL);
        CHECK_EXIT(p, 2, "perplexity file without tokenizer");
        CHECK_MSG(strstr(p.err, "--tokens") && !strstr(p.err, "--print-ids"),
                  "perplexity hint: %.300s", p.err);
        proc_free(&p);
        /* run --tokens without a tokenizer prints the generated ids (as --print-ids) and says
         * so once on stderr */
        struct proc q = run("run", model, "--tokens", "1,5,6", "-n", "4", "--temp", "0",
                            "--ignore-eos", NULL);
        struct proc r = run("run", model, "--tokens", "1,5,6", "-n", "4", "--temp", "0",
                            "--ignore-eos", "--print-ids", NULL);
        CHECK_EXIT(q, 0, "run without tokenizer");
        CHECK_EXIT(r, 0, "run --print-ids");
        int32_t got[8];
        CHECK_MSG(parse_ids(q.out, got, 8) == 4 && !strcmp(q.out, r.out),
                  "%s: run without tokenizer printed \"%s\", --print-ids \"%s\"", name, q.out,
                  r.out);
        const char *note = strstr(q.err, "no tokenizer");
        CHECK_MSG(note && !strstr(note + 1, "no tokenizer"), "%s: note on stderr: %.300s", name,
                  q.err);
        CHECK_MSG(!strstr(r.err, "no tokenizer"), "%s: note with --print-ids: %.300s", name,
                  r.err);
        proc_free(&q);
        proc_free(&r);
        p = run("run", model, "--tokens", "1,2", "--stop", "x", NULL);
        CHECK_EXIT(p, 2, "--stop without tokenizer");
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

int main(void)
{
    T_INIT("cli");
    g_bin = getenv("QSHARD") ? getenv("QSHARD") : "build/qshard";
    if (getenv("QSHARD_DEVICE"))
        g_device = getenv("QSHARD_DEVICE");
    if (getenv("QSHARD_DEVICE_TP2"))
        g_device_tp2 = getenv("QSHARD_DEVICE_TP2");
    if (getenv("QSHARD_DEVICE_TP4"))
        g_device_tp4 = getenv("QSHARD_DEVICE_TP4");
    printf("cli: golden comparisons on --device %s (TP-2: %s, TP-4: %s)\n", g_device,
           g_device_tp2, g_device_tp4);
    const char *tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_tmp, sizeof(g_tmp), "%s/qshard_test_cli_XXXXXX", tmpdir);
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    check_errors_without_fixtures();

    cJSON *index = load_index();
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(index, "models");
    if (!cJSON_IsArray(models)) {
        printf("cli: tests/data/models/INDEX.json not found: fixture cases skipped\n");
    } else {
        char *tp2[2] = {NULL, NULL};
        const char *tp2_group = NULL;
        int n_tp2 = 0;
        bool done_eos_list = false;
        const cJSON *m;
        cJSON_ArrayForEach(m, models)
        {
            const char *name = jstr(m, "name");
            const cJSON *golden = cJSON_GetObjectItemCaseSensitive(m, "golden_files");
            if (!name || !jstr(m, "path"))
                continue;
            bool has_golden = cJSON_GetArraySize(golden) > 0;
            bool has_tok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "tokenizer"));
            int vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab_size")
                            ? cJSON_GetObjectItemCaseSensitive(m, "vocab_size")->valueint
                            : 0;
            int checks_before = t_pass + t_fail;
            if (m == cJSON_GetArrayItem(models, 0)) { /* an unconverted HF directory */
                char src[512];
                snprintf(src, sizeof(src), DATA "%s", jstr(m, "path"));
                check_hf_dir(src);
            }
            char *dir = convert(m, 1);
            if (!dir)
                continue;
            const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(m, "prompts"), *pr;
            cJSON_ArrayForEach(pr, prompts)
            {
                char what[256];
                snprintf(what, sizeof(what), "%s/%s", name, jstr(pr, "name"));
                if (has_golden) {
                    check_greedy(dir, what, pr);
                    check_logits(dir, what, pr);
                    check_perplexity(dir, what, pr);
                    cJSON *eos = fixture_eos(m);
                    check_eos(dir, what, pr, eos);
                    cJSON_Delete(eos);
                }
                if (has_tok) {
                    check_tokenize(dir, what, pr);
                    check_stop(dir, what, pr);
                }
            }
            if (vocab > 0)
                check_errors_with_model(dir, name, has_tok, vocab);
            static bool done_bench;
            if (!done_bench && has_golden) {
                check_bench_model(dir, name);
                done_bench = true;
            }
            if (has_tok && has_llama2_tokenizer(m)) {
                check_chat(dir, name, jstr(m, "path"));
                check_streaming(dir);
                cJSON *vec = check_tokenize_vectors(dir);
                /* the longest vector text drives the multi-chunk perplexity check */
                const cJSON *c, *best = NULL;
                cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(
                                          cJSON_GetObjectItemCaseSensitive(vec, "llama2_spm"),
                                          "cases"))
                    if (jstr(c, "text") && (!best || strlen(jstr(c, "text")) >
                                                         strlen(jstr(best, "text"))))
                        best = c;
                if (best)
                    check_perplexity_chunks(
                        dir, jstr(best, "text"), cJSON_GetObjectItemCaseSensitive(best, "ids"),
                        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(best, "ids"), 0)
                            ->valueint);
                cJSON_Delete(vec);
            }
            cJSON_ArrayForEach(pr, prompts)
                if (!done_eos_list && has_golden && !has_tok)
                    done_eos_list = check_eos_list(m, pr);
            /* TP-2 through the CLI for two models of different twin groups (twins convert to
             * identical files, so mixing their ranks would not be a mismatch) */
            const char *tg = jstr(m, "twin_group");
            bool new_group = n_tp2 == 0 || !tp2_group || !tg || strcmp(tg, tp2_group) != 0;
            if (n_tp2 < 2 && has_golden && !has_tok && new_group) {
                char *d2 = convert(m, 2);
                if (d2) {
                    tp2[n_tp2++] = d2;
                    tp2_group = tg;
                    const char *dev1 = g_device;
                    g_device = g_device_tp2;
                    cJSON_ArrayForEach(pr, prompts)
                    {
                        char what[256];
                        snprintf(what, sizeof(what), "%s/%s tp2", name, jstr(pr, "name"));
                        check_greedy(d2, what, pr);
                        check_logits(d2, what, pr);
                    }
                    g_device = dev1;
                }
            }
            /* TP-4 of every fixture with goldens (the fixtures have 4 heads of 64 and group
             * size 128 or 64: row-parallel o_proj with a local group size) */
            if (has_golden) {
                char *d4 = convert(m, 4);
                if (d4) {
                    const char *dev1 = g_device;
                    g_device = g_device_tp4;
                    cJSON_ArrayForEach(pr, prompts)
                    {
                        char what[256];
                        snprintf(what, sizeof(what), "%s/%s tp4", name, jstr(pr, "name"));
                        check_greedy(d4, what, pr);
                        check_logits(d4, what, pr);
                        check_logits_vs_tp1(d4, dir, what, pr);
                    }
                    g_device = dev1;
                    free(d4);
                }
            }
            printf("cli: %s: %d checks%s\n", name, t_pass + t_fail - checks_before,
                   has_golden ? "" : " (no golden files)");
            free(dir);
        }
        if (n_tp2 == 2)
            check_rank_mismatch(tp2[0], tp2[1]);
        CHECK_MSG(done_eos_list, "no fixture prompt has a greedy run with a new id after step 2: "
                  "eos-list check not run");
        free(tp2[0]);
        free(tp2[1]);
    }
    cJSON_Delete(index);
    nftw(g_tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return t_done();
}

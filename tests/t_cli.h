/*
 * t_cli.h - the harness of the tests that run the qshard binary (tests/test_cli_*.c): run it
 * with arguments and capture stdout, stderr and the exit code; convert fixtures into a temp
 * directory; small parsers. Each test program includes it once (after t.h).
 *
 * Environment: QSHARD names the binary (default build/qshard); QSHARD_DEVICE=cuda runs the
 * golden comparisons on the GPU (QSHARD_DEVICE_TP2 / _TP4 those of the TP-2 / TP-4
 * conversions); TMPDIR the temp root.
 */
#ifndef QS_T_CLI_H
#define QS_T_CLI_H

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
#include "t_safetensors.h" /* cli_llama2_model */

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
static const char *g_stdin; /* a file run_v gives the binary as standard input, or NULL */

// --- running the binary --------------------------------------------------------------------

struct proc {
    int code;  /* exit status; -1 if it did not exit normally (crash) */
    char *out; /* stdout, NUL-terminated */
    char *err; /* stderr */
    size_t out_len;
};

static inline void proc_free(struct proc *p)
{
    free(p->out);
    free(p->err);
    memset(p, 0, sizeof(*p));
}

/* argv of g_bin for args (NULL-terminated, without argv[0]; at most MAX_ARGS). */
static inline void cli_argv(const char *const *args, const char **argv)
{
    int n = 0;
    argv[n++] = g_bin;
    for (; args[n - 1] && n < MAX_ARGS; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
}

/* Run g_bin with argv (NULL-terminated, without argv[0]); capture stdout/stderr. */
static inline struct proc run_v(const char *const *args)
{
    struct proc p = {.code = -1};
    char outp[300], errp[300];
    snprintf(outp, sizeof(outp), "%s/stdout", g_tmp);
    snprintf(errp, sizeof(errp), "%s/stderr", g_tmp);
    const char *argv[MAX_ARGS + 2];
    cli_argv(args, argv);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fi = g_stdin ? open(g_stdin, O_RDONLY) : -1;
        if (fi >= 0)
            dup2(fi, 0);
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

/* run_v of a0 and the arguments after it in ap (up to a NULL) */
static inline struct proc run_va(const char *a0, va_list ap)
{
    const char *args[MAX_ARGS + 1];
    int n = 0;
    for (const char *a = a0; a && n < MAX_ARGS; a = va_arg(ap, const char *))
        args[n++] = a;
    args[n] = NULL;
    return run_v(args);
}

/* run(a, b, ..., NULL) */
static inline struct proc run(const char *a0, ...)
{
    va_list ap;
    va_start(ap, a0);
    struct proc p = run_va(a0, ap);
    va_end(ap);
    return p;
}

/* Check the exit code; print the command's stderr when it differs. */
#define CHECK_EXIT(p, want, what)                                                          \
    do {                                                                                   \
        CHECK_MSG((p).code == (want), "%s: exit %d, expected %d; stderr: %.400s", (what),  \
                  (p).code, (want), (p).err);                                              \
    } while (0)

static inline int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

// --- small parsers -------------------------------------------------------------------------

/* "1,2,3\n" -> ids; returns count (or -1 on junk). */
static inline int parse_ids(const char *s, int32_t *ids, int cap)
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

static inline char *ids_csv(const cJSON *arr)
{
    size_t cap = 16 * (size_t)cJSON_GetArraySize(arr) + 2, len = 0;
    char *s = malloc(cap);
    s[0] = '\0';
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
        len += (size_t)snprintf(s + len, cap - len, "%s%d", len ? "," : "", it->valueint);
    return s;
}

/* A JSON file under tests/data (path relative to it), parsed; NULL (quietly) when it cannot be
 * read: the caller decides whether that fails a check. */
static inline cJSON *cli_read_json(const char *rel)
{
    char path[512], *buf = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), DATA "%s", rel);
    qs_log_set_quiet(true);
    enum rt_io_err e = rt_file_read(path, 1 << 26, &buf, &len);
    qs_log_set_quiet(false);
    cJSON *j = e ? NULL : cJSON_ParseWithLength(buf, len);
    free(buf);
    return j;
}

static inline cJSON *load_index(void)
{
    return cli_read_json("models/INDEX.json");
}

static inline const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

// --- fixture checks ------------------------------------------------------------------------

/* Convert tests/data/<model path> into g_tmp/<name>-tp<tp>; returns the output dir or NULL. */
static inline char *convert(const cJSON *m, int tp)
{
    char src[512], *dst = malloc(512), tps[16];
    snprintf(src, sizeof(src), DATA "%s", jstr(m, "path"));
    snprintf(dst, 512, "%s/%s-tp%d", g_tmp, jstr(m, "name"), tp);
    snprintf(tps, sizeof(tps), "%d", tp);
    struct proc p = run("convert", src, dst, "--tp", tps, NULL);
    /* INDEX "max_tp" (act-order fixtures: row-parallel act-order linears stay whole, DESIGN
     * 4.5): a larger tp is refused with exit 2 naming --tp */
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m, "max_tp");
    if (cJSON_IsNumber(mt) && tp > mt->valueint) {
        CHECK_EXIT(p, 2, jstr(m, "name"));
        CHECK_MSG(p.err && strstr(p.err, "--tp"), "%s: refusal of --tp %d does not name --tp",
                  jstr(m, "name"), tp);
        proc_free(&p);
        free(dst);
        return NULL;
    }
    CHECK_EXIT(p, 0, jstr(m, "name"));
    bool ok = p.code == 0;
    proc_free(&p);
    if (!ok) {
        free(dst);
        return NULL;
    }
    return dst;
}

static inline double rel_l2(const float *a, const float *b, size_t n, double *norm_b)
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

/* --help layout: every option line ("  -x" / "  --x") has its description at column 26, and
 * every continuation line of an option (indented by 3 or more, right after it) is indented to
 * column 26. Usage lines and the exit-code trailer are free text. */
static inline void check_help_layout(const char *cmd, const char *help)
{
    int bad = 0;
    const char *first_bad = NULL;
    bool in_opt = false;
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
            in_opt = true;
        } else if (in_opt && n > 3 && !strncmp(l, "   ", 3)) {
            col = 0;
            while (col < (long)n && l[col] == ' ')
                col++;
        } else {
            in_opt = false;
        }
        if (col >= 0 && col != 26 && !bad++)
            first_bad = l;
        l += n + (e != NULL);
    }
    CHECK_MSG(bad == 0, "%s --help: %d line(s) not aligned at column 26, first: %.80s", cmd, bad,
              first_bad ? first_bad : "");
}

/* Structural UTF-8 check (RFC 3629); returns the offset of the first bad byte or -1. */
static inline long utf8_bad_at(const unsigned char *p, size_t n)
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

/* log P(id) of a logits row [V] (log-softmax in double): the reference the checks compute. */
static inline double cli_log_softmax(const float *row, int64_t V, int id)
{
    double mx = -INFINITY, s = 0;
    for (int64_t v = 0; v < V; v++)
        mx = row[v] > mx ? row[v] : mx;
    for (int64_t v = 0; v < V; v++)
        s += exp((double)row[v] - mx);
    return (double)row[id] - mx - log(s);
}

/* Copy fixture m's directory to g_tmp/<tag>-src (dir, for edits) and name g_tmp/<tag> (out,
 * the conversion to make of it); dir and out hold n bytes. */
static inline void cli_fixture_copy(const cJSON *m, const char *tag, char *dir, char *out,
                                    size_t n)
{
    char cmd[2048];
    snprintf(dir, n, "%s/%s-src", g_tmp, tag);
    snprintf(out, n, "%s/%s", g_tmp, tag);
    snprintf(cmd, sizeof(cmd), "cp -r '" DATA "%s' '%s'", jstr(m, "path"), dir);
    CHECK(system(cmd) == 0);
}

/* Set up g_bin, the devices and the temp directory; false if the directory cannot be made. */
static inline bool cli_setup(void)
{
    g_bin = getenv("QSHARD") ? getenv("QSHARD") : "build/qshard";
    if (getenv("QSHARD_DEVICE"))
        g_device = getenv("QSHARD_DEVICE");
    if (getenv("QSHARD_DEVICE_TP2"))
        g_device_tp2 = getenv("QSHARD_DEVICE_TP2");
    if (getenv("QSHARD_DEVICE_TP4"))
        g_device_tp4 = getenv("QSHARD_DEVICE_TP4");
    const char *tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_tmp, sizeof(g_tmp), "%s/qshard_test_cli_XXXXXX", tmpdir);
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return false;
    }
    return true;
}

static inline void cli_teardown(void)
{
    nftw(g_tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* Write text to g_tmp/name; returns the path (static buffer of the caller's). */
static inline const char *cli_write_tmp(const char *name, const char *text, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

/* Write len bytes to path; false on any error. */
static inline bool cli_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(data, 1, len, f) == len;
    return f ? fclose(f) == 0 && ok : false;
}

/* tests/data/bad/control-valid's config.json with vocab_size 32000, into dir. */
static inline bool cli_llama2_config(const char *dir)
{
    char path[700], *buf = NULL;
    size_t len = 0;
    if (rt_file_read(DATA "bad/control-valid/config.json", 1 << 20, &buf, &len))
        return false;
    cJSON *c = cJSON_ParseWithLength(buf, len);
    free(buf);
    bool ok = c && cJSON_ReplaceItemInObject(c, "vocab_size", cJSON_CreateNumber(32000));
    char *js = ok ? cJSON_Print(c) : NULL;
    cJSON_Delete(c);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    ok = js && cli_write_file(path, js, strlen(js));
    free(js);
    return ok;
}

/*
 * A converted model carrying the real Llama-2 tokenizer, for the checks that need its ids (the
 * vectors of tests/data/tokenizer-test-vectors.json "llama2_spm" and tokenizers/decode-vectors.json
 * "hf_llama2"): the tiny random bad/control-valid (hidden 64, 1 layer, tied embedding) with the
 * embedding grown to 32000 rows (row r = row r mod 64) and vocab_size 32000, plus
 * tests/data/tokenizers/llama2/tokenizer.json and the tokenizer_config.json /
 * special_tokens_map.json keys of meta-llama/Llama-2-7b-hf (LlamaTokenizer, add_bos_token true,
 * <s> / </s> / <unk>). Written to g_tmp/llama2-src and converted to g_tmp/llama2 at TP 1.
 * Returns the converted directory (the caller frees it) or NULL after a failed check.
 */
static inline char *cli_llama2_model(void)
{
    enum { V = 32000 };
    static const char tok_config[] =
        "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": \"<s>\", "
        "\"clean_up_tokenization_spaces\": false, \"eos_token\": \"</s>\", \"legacy\": false, "
        "\"model_max_length\": 4096, \"pad_token\": null, \"padding_side\": \"right\", "
        "\"sp_model_kwargs\": {}, \"tokenizer_class\": \"LlamaTokenizer\", \"unk_token\": \"<unk>\"}\n";
    static const char special[] =
        "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"unk_token\": \"<unk>\"}\n";
    char src[512], path[700], *tok = NULL;
    char *out = malloc(512);
    size_t tok_len = 0;
    snprintf(src, sizeof(src), "%s/llama2-src", g_tmp);
    snprintf(out, 512, "%s/llama2", g_tmp);
    struct st_entry *e = NULL;
    int n = 0;
    bool ok = mkdir(src, 0777) == 0 && st_read_model(DATA "bad/control-valid", &e, &n);
    for (int i = 0; ok && i < n; i++) {
        struct st_entry *x = &e[i];
        if (strcmp(x->name, "model.embed_tokens.weight"))
            continue;
        size_t row = x->size / (size_t)x->shape[0];
        uint8_t *big = malloc((size_t)V * row);
        ok = big != NULL;
        for (int r = 0; ok && r < V; r++)
            memcpy(big + (size_t)r * row, (uint8_t *)x->data + (size_t)(r % x->shape[0]) * row,
                   row);
        free(x->data);
        x->data = big, x->shape[0] = V, x->size = (size_t)V * row;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", src);
    ok = ok && write_safetensors(path, e, n) && cli_llama2_config(src);
    st_free(e, n);
    ok = ok && !rt_file_read(DATA "tokenizers/llama2/tokenizer.json", 1 << 26, &tok, &tok_len);
    snprintf(path, sizeof(path), "%s/tokenizer.json", src);
    ok = ok && cli_write_file(path, tok, tok_len);
    free(tok);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", src);
    ok = ok && cli_write_file(path, tok_config, strlen(tok_config));
    snprintf(path, sizeof(path), "%s/special_tokens_map.json", src);
    ok = ok && cli_write_file(path, special, strlen(special));
    CHECK_MSG(ok, "cannot write the Llama-2-tokenizer model into %s", src);
    struct proc p = ok ? run("convert", src, out, "--tp", "1", NULL) : (struct proc){.code = -1};
    if (ok)
        CHECK_EXIT(p, 0, "convert the Llama-2-tokenizer model");
    ok = ok && p.code == 0;
    proc_free(&p);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

#endif /* QS_T_CLI_H */

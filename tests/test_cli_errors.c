/*
 * test_cli_errors.c - how the qshard commands refuse bad input, without a model or on an
 * unconverted one (tests/t_cli.h runs the binary): exit codes of docs/DESIGN.md section 2 and
 * the messages a user reads.
 *   - options: one message "qshard CMD: ..." and "try 'qshard CMD --help'" (not the whole
 *     help); a short option glued to an invalid value is an unknown option ("-ngl" is not
 *     "-n gl"), "-n5" is "-n 5"; ranges named with the value and why ("out of range");
 *     every value validated before the model loads (the missing model's exit 4 comes after);
 *     `bench synth --tensors 0` names --tensors;
 *   - messages start with the command; the function that detected an error only with -v;
 *   - a directory that is not a converted model says to convert it first, with or without
 *     config.json (an HF checkpoint);
 *   - --help of every command: usage, exit codes, descriptions at column 26.
 * Run: ./build/test_cli_errors (from the repository root).
 */
#include "t_cli.h"

/* Run the binary with the arguments (NULL-terminated) and check its exit code. */
static void expect(int code, const char *what, const char *a0, ...)
{
    va_list ap;
    va_start(ap, a0);
    struct proc p = run_va(a0, ap);
    va_end(ap);
    CHECK_EXIT(p, code, what);
    proc_free(&p);
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
    expect(4, "missing model path", "run", "/nonexistent/model", "-p", "hi", NULL);
    /* -n: [-1, 2^24], the message names the range */
    p = run("run", "/nonexistent/model", "-p", "hi", "-n", "16777217", NULL);
    CHECK_EXIT(p, 1, "-n 2^24 + 1");
    CHECK_MSG(strstr(p.err, "16777216") != NULL, "-n range not named: %.300s", p.err);
    proc_free(&p);
    expect(4, "-n 2^24 accepted (then the missing model)", "run", "/nonexistent/model", "-p", "hi", "-n", "16777216", NULL);
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
    expect(4, "--ctx 2 accepted (then the missing model)", "run", "/nonexistent/model", "--tokens", "1", "--ctx", "2", NULL);
    expect(4, "tokenize missing model path", "tokenize", "/nonexistent/model", "--text", "hi", NULL);
    expect(1, "negative temperature", "run", "/nonexistent/model", "-p", "hi", "--temp", "-1", NULL);
    expect(1, "top-p > 1", "run", "/nonexistent/model", "-p", "hi", "--top-p", "1.5", NULL);
    expect(1, "both -p and --tokens", "run", "/nonexistent/model", "-p", "hi", "--tokens", "1,2", NULL);
    expect(1, "unknown device", "run", "/nonexistent/model", "-p", "hi", "--device", "tpu", NULL);
    expect(1, "logits without --out", "logits", "/nonexistent/model", "--tokens", "1,2", NULL);
    /* a file that is not a rank file */
    char junk[300];
    snprintf(junk, sizeof(junk), "%s/junk.qshard", g_tmp);
    FILE *f = fopen(junk, "wb");
    fputs("this is not a qshard file, just some text long enough to read a header from it......"
          "...................................................................................."
          "....................................................................................",
          f);
    fclose(f);
    expect(2, "junk rank file", "run", junk, "--tokens", "1,2", NULL);
    expect(2, "tokenize junk rank file", "tokenize", junk, "--text", "hi", NULL);
}

/* Short options: clusters that are not an option with a valid value are refused whole. */
static void check_short_options(void)
{
    struct proc p = run("run", "/nonexistent/model", "-ngl", "99", "-p", "hi", NULL);
    CHECK_EXIT(p, 1, "-ngl 99");
    CHECK_MSG(strstr(p.err, "qshard run: unknown option '-ngl'") && strstr(p.err, "try 'qshard run --help'"),
              "-ngl: %.300s", p.err);
    proc_free(&p);
    const char *ok[][3] = {{"-n5", NULL, NULL}, {"-n", "5", NULL}, {"-vn5", NULL, NULL},
                           {"--n-predict=5", NULL, NULL}, {"--n-pre", "5", NULL}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        p = run("run", "/nonexistent/model", "-p", "hi", ok[i][0], ok[i][1], NULL);
        CHECK_MSG(p.code == 4, "%s %s: exit %d (options fine, then the missing model): %.200s",
                  ok[i][0], ok[i][1] ? ok[i][1] : "", p.code, p.err);
        proc_free(&p);
    }
    p = run("run", "/nonexistent/model", "-p", "hi", "-vx", NULL);
    CHECK_MSG(p.code == 1 && strstr(p.err, "unknown option '-vx'"), "-vx: %.200s", p.err);
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "--to", "3", NULL);
    CHECK_MSG(p.code == 1 && strstr(p.err, "ambiguous option '--to'"), "--to: %.200s", p.err);
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "--temp", NULL);
    CHECK_MSG(p.code == 1 && strstr(p.err, "--temp needs a value"), "--temp: %.200s", p.err);
    proc_free(&p);
    p = run("run", "/nonexistent/model", "-p", "hi", "--chat=1", NULL);
    CHECK_MSG(p.code == 1 && strstr(p.err, "--chat takes no value"), "--chat=1: %.200s", p.err);
    proc_free(&p);
}

/* Values: the uniform message, the reason, every one checked before the model loads. */
static void check_values(void)
{
    struct {
        const char *opt, *val, *want;
    } bad[] = {
        {"--temp", "1e39", "qshard run: --temp must be a number >= 0, got '1e39' (out of range)"},
        {"--temp", "abc", "qshard run: --temp must be a number >= 0, got 'abc' (not a number)"},
        {"--temp", "nan", "(not a number)"},
        {"--top-p", "0", "--top-p must be a number in (0, 1], got '0' (out of range)"},
        {"--top-k", "99999999999", "--top-k must be an integer >= 0, got '99999999999' (out of range)"},
        {"--seed", "-3", "--seed must be a non-negative integer"},
        {"--device", "tpu", "--device must be one of cpu|cuda, got 'tpu'"},
        {"--threads", "0", "--threads must be an integer in [1, 4096], got '0' (out of range)"},
        {"--logprobs", "21", "--logprobs must be an integer in [1, 20]"},
        {"--stop", "", "--stop must be a non-empty string"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct proc p = run("run", "/nonexistent/model", "-p", "hi", bad[i].opt, bad[i].val, NULL);
        CHECK_MSG(p.code == 1 && strstr(p.err, bad[i].want), "%s %s: exit %d: %.300s", bad[i].opt,
                  bad[i].val, p.code, p.err);
        proc_free(&p);
    }
    struct proc p = run("bench", "synth", "/tmp/qshard-unused.qshard", "--size-mb", "1",
                        "--tensors", "0", NULL);
    CHECK_MSG(p.code == 1 && strstr(p.err, "qshard bench synth: --tensors must be an integer in "
                                           "[1, 1000000], got '0'"),
              "bench synth --tensors 0: %.300s", p.err);
    proc_free(&p);
    p = run("bench", "synth", "/tmp/qshard-unused.qshard", "--tensors", "4", NULL);
    CHECK_MSG(p.code == 1 && strstr(p.err, "--size-mb"), "bench synth without --size-mb: %.300s",
              p.err);
    proc_free(&p);
    p = run("convert", "/nonexistent", "/tmp/qshard-unused-out", "--tp", "0", NULL);
    CHECK_MSG(p.code == 1 && strstr(p.err, "qshard convert: --tp must be an integer in [1, 4096]"),
              "convert --tp 0: %.300s", p.err);
    proc_free(&p);
}

/* "qshard CMD: error: ..." without the function name; with -v the function too. */
static void check_message_prefix(void)
{
    struct proc p = run("run", "/nonexistent/model", "-p", "hi", NULL);
    struct proc v = run("run", "/nonexistent/model", "-p", "hi", "-v", NULL);
    CHECK_MSG(!strncmp(p.err, "qshard run: error: /nonexistent/model", 37),
              "run error line: %.200s", p.err);
    const char *e = strstr(v.err, "qshard run: error: ");
    const char *after = e ? e + strlen("qshard run: error: ") : "";
    size_t id = strspn(after, "abcdefghijklmnopqrstuvwxyz_0123456789");
    CHECK_MSG(id > 0 && after[id] == ':' && after[0] != '/', "-v names the function: %.200s",
              v.err);
    proc_free(&p);
    proc_free(&v);
    p = run("convert", "/nonexistent/hf", "/tmp/qshard-unused-out", "--tp", "1", NULL);
    CHECK_MSG(p.code != 0 && !strncmp(p.err, "qshard convert: error: ", 23), "convert: %.200s",
              p.err);
    proc_free(&p);
    p = run("verify", "/nonexistent/x.qshard", NULL);
    CHECK_MSG(p.code == 4 && strstr(p.err, "qshard verify: error: "), "verify: %.200s", p.err);
    proc_free(&p);
}

/* A directory with neither manifest.json nor a .qshard file: "convert it first", exit 2. */
static void check_unconverted(void)
{
    char dir[400];
    snprintf(dir, sizeof(dir), "%s/empty-dir", g_tmp);
    mkdir(dir, 0755);
    const char *cmds[][6] = {{"run", dir, "-p", "hi", NULL}, {"logits", dir, "--tokens", "1", "--out", "/dev/null"},
                             {"tokenize", dir, "--text", "hi", NULL}, {"bench", "model", dir, NULL}};
    for (int i = 0; i < 4; i++) {
        struct proc p = run(cmds[i][0], cmds[i][1], cmds[i][2], cmds[i][3], cmds[i][4], cmds[i][5],
                            NULL);
        CHECK_MSG(p.code == 2 && strstr(p.err, "is not a converted model") &&
                      strstr(p.err, "convert it first: qshard convert"),
                  "%s on an empty directory: exit %d: %.300s", cmds[i][0], p.code, p.err);
        proc_free(&p);
    }
}

/* --help of every command: usage, exit codes, descriptions at column 26. */
static void check_all_help(void)
{
    const char *cmds[][2] = {{"convert", NULL}, {"inspect", NULL}, {"verify", NULL},
                             {"bench", "synth"}, {"bench", "open"}, {"bench", "verify"},
                             {"bench", "model"}, {"run", NULL}, {"logits", NULL},
                             {"perplexity", NULL}, {"tokenize", NULL}};
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        struct proc p = cmds[i][1] ? run(cmds[i][0], cmds[i][1], "--help", NULL)
                                   : run(cmds[i][0], "--help", NULL);
        char what[64];
        snprintf(what, sizeof(what), "%s %s --help", cmds[i][0], cmds[i][1] ? cmds[i][1] : "");
        CHECK_EXIT(p, 0, what);
        CHECK_MSG(strstr(p.out, "usage: qshard") && strstr(p.out, "exit"), "%s: %.100s", what,
                  p.out);
        check_help_layout(what, p.out);
        proc_free(&p);
    }
    struct proc p = run("run", "--help", NULL);
    CHECK_MSG(strstr(p.out, "Debug options") && strstr(p.out, "--debug-no-graph") &&
                  strstr(p.out, "--debug-host-sample") && strstr(p.out, "(default 0.8)"),
              "run --help: debug options or defaults missing");
    proc_free(&p);
}

int main(void)
{
    T_INIT("cli_errors");
    if (!cli_setup())
        return 1;
    check_errors_without_fixtures();
    check_short_options();
    check_values();
    check_message_prefix();
    check_unconverted();
    check_all_help();
    cJSON *index = load_index();
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(index, "models"), 0);
    CHECK_MSG(m && jstr(m, "path"), "tests/data/models/INDEX.json not found");
    if (m && jstr(m, "path")) { /* an unconverted HF directory */
        char src[512];
        snprintf(src, sizeof(src), DATA "%s", jstr(m, "path"));
        check_hf_dir(src);
    }
    cJSON_Delete(index);
    cli_teardown();
    return t_done();
}

/*
 * test_cli_run.c - `qshard run` end to end (tests/t_cli.h runs the binary on fixtures converted
 * into a temp directory): the generation loop of runtime/rt_session.h seen from outside.
 *   - --stop STR: the output is exactly the unstopped output cut before STR; -f FILE and
 *     -f - (standard input) equal -p;
 *   - streaming: stdout read from a pipe piece by piece is whole UTF-8 in every piece;
 *   - --chat gives one BOS; --chat-template mistral equals BOS + tokenize("[INST] ... [/INST]");
 *   - a seed repeats its sample, another seed differs; context limits, --truncate, the speed
 *     line, exit codes of bad prompts; a model without a tokenizer prints ids;
 *   - Ctrl-C (SIGINT) during run, perplexity and bench model ends cleanly: the partial output
 *     and the summary line are printed, exit 3 (as convert);
 *   - ids past the tokenizer's vocabulary (padded lm_head rows) are never generated: a copy of
 *     a fixture given a tokenizer smaller than its vocab_size, sampled at a high temperature,
 *     and greedy equals the argmax of `logits` over the tokenizer's ids;
 *   - generation_config.json sampling defaults apply when no option is given, options win, -v
 *     says where each value came from;
 *   - --json: one object whose ids equal --print-ids, text equal the streamed text, usage,
 *     finish reason, and --logprobs equal to the log-softmax of `logits` at each step.
 * Run: ./build/test_cli_run (from the repository root).
 */
#include <signal.h>

#include "t_cli.h"

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

/* --chat-template llama2: the prompt is the Llama-2 template ([INST] <<SYS>> ...) with exactly
 * one BOS (the template text has "<s>" and encode must not add a second); a model
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
     * Instruct template renders one user turn, tokenized as transformers' apply_chat_template
     * does: special tokens parsed, no BOS added. (With a Llama-2-style tokenizer that is BOS +
     * tokenizer("[INST] Hello there [/INST]"); the KJV tokenizer.json's Metaspace, prepend_scheme
     * "first", puts no "▁" after the <s>: HF tokenizers 0.23.2 gives 1,94,4050,... there too.) */
    p = run("run", model, "-p", "Hello there", "--chat-template", "mistral", "-n", "1", "--temp",
            "0", "-v", NULL);
    CHECK_EXIT(p, 0, "--chat-template mistral");
    struct proc t = run("tokenize", model, "--text", "<s>[INST] Hello there [/INST]", "--no-bos",
                        "--ids", NULL);
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
    printf("cli_run: streaming: %zu bytes in %d pieces, each whole UTF-8\n", total, pieces);
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

// --- Ctrl-C ------------------------------------------------------------------------------

/* Run the binary with args, wait until its stdout holds `needle`, send SIGINT, collect the
 * rest; p.code is -1 when it was killed by the signal (the state before the fix). */
static struct proc run_interrupted(const char *const *args, const char *needle)
{
    struct proc p = {.code = -1};
    int fo[2], fe[2];
    if (pipe(fo) != 0 || pipe(fe) != 0)
        return p;
    const char *argv[MAX_ARGS + 2];
    cli_argv(args, argv);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fo[1], 1);
        dup2(fe[1], 2);
        close(fo[0]);
        close(fe[0]);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    close(fo[1]);
    close(fe[1]);
    static char out[1 << 20];
    size_t len = 0;
    bool sent = false;
    for (ssize_t r; (r = read(fo[0], out + len, sizeof(out) - 1 - len)) > 0;) {
        len += (size_t)r;
        out[len] = '\0';
        if (!sent && strstr(out, needle)) {
            kill(pid, SIGINT);
            sent = true;
        }
    }
    static char err[1 << 16];
    size_t el = 0;
    for (ssize_t r; (r = read(fe[0], err + el, sizeof(err) - 1 - el)) > 0;)
        el += (size_t)r;
    err[el] = '\0';
    close(fo[0]);
    close(fe[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    p.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    p.out = strdup(out);
    p.err = strdup(err);
    p.out_len = len;
    CHECK_MSG(sent, "%s: '%s' never appeared on stdout", args[0], needle);
    return p;
}

static void check_interrupt(const char *model)
{
    /* run: generation until the context is full, interrupted after the first text */
    const char *r_args[] = {"run", model, "-p", "Hello", "-n", "-1", "--ignore-eos", "--temp",
                            "0", "--no-echo", NULL};
    struct proc p = run_interrupted(r_args, " ");
    CHECK_EXIT(p, 3, "run interrupted by SIGINT");
    CHECK_MSG(strstr(p.err, "stopped: interrupted") && strstr(p.err, "interrupted by signal 2"),
              "run SIGINT: stderr %.400s", p.err);
    CHECK_MSG(p.out_len > 0 && p.out[p.out_len - 1] == '\n', "run SIGINT: output not ended");
    proc_free(&p);
    /* perplexity: a long text in short chunks, interrupted after the first estimate */
    char path[512];
    size_t cap = 1 << 19, n = 0;
    char *text = malloc(cap + 64);
    while (n < cap)
        n += (size_t)snprintf(text + n, 64, "The llama is a domesticated camelid. %zu ", n);
    cli_write_tmp("long.txt", text, path, sizeof(path));
    free(text);
    const char *p_args[] = {"perplexity", model, "--file", path, "--ctx", "32", NULL};
    p = run_interrupted(p_args, "[1]");
    CHECK_EXIT(p, 3, "perplexity interrupted by SIGINT");
    CHECK_MSG(strstr(p.out, "Final estimate: PPL = ") && strstr(p.err, "interrupted"),
              "perplexity SIGINT: stdout %.200s stderr %.300s", p.out, p.err);
    proc_free(&p);
    /* bench model: the rows done, then the summary (a tg64 run takes ~0.3 s, 30 of them 9 s) */
    const char *b_args[] = {"bench", "model", model, "-p", "0", "-n", "4,64", "-r", "30",
                            "--device", "cpu", NULL};
    p = run_interrupted(b_args, "| tg4 |");
    CHECK_EXIT(p, 3, "bench model interrupted by SIGINT");
    CHECK_MSG(strstr(p.err, "interrupted: 1 of 2 tests done"), "bench SIGINT: %.300s", p.err);
    proc_free(&p);
}

// --- generated ids stay in the tokenizer's vocabulary -------------------------------------

/* A tokenizer.json of n_ids ids: <unk> <s> </s>, the 256 byte tokens, then single letters. */
static void write_small_tokenizer(const char *dir, int n_ids)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    fprintf(f, "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", "
               "\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
    for (int b = 0; b < 256; b++)
        fprintf(f, ", \"<0x%02X>\": %d", b, 3 + b);
    for (int i = 259; i < n_ids; i++)
        fprintf(f, ", \"%c%c\": %d", 'a' + (i - 259) % 26, 'a' + (i - 259) / 26, i);
    fprintf(f, "}, \"merges\": []}, \"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", "
               "\"special\": true}, {\"id\": 1, \"content\": \"<s>\", \"special\": true}, "
               "{\"id\": 2, \"content\": \"</s>\", \"special\": true}], \"decoder\": "
               "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}]}}\n");
    fclose(f);
}

static void check_vocab_limit(const cJSON *models)
{
    enum { N_TOK = 300 };
    const cJSON *m, *fx = NULL;
    cJSON_ArrayForEach(m, models)
        if (jstr(m, "name") && !strcmp(jstr(m, "name"), "qwen2-bias-tied-v509"))
            fx = m;
    CHECK_MSG(fx != NULL, "fixture qwen2-bias-tied-v509 (vocab 509) missing");
    if (!fx)
        return;
    char dir[600], out[600], npy[600];
    cli_fixture_copy(fx, "smalltok", dir, out, sizeof(dir));
    write_small_tokenizer(dir, N_TOK);
    struct proc p = run("convert", dir, out, "--tp", "1", NULL);
    CHECK_EXIT(p, 0, "convert with a 300-id tokenizer");
    proc_free(&p);
    p = run("run", out, "--tokens", "1,5,6", "-n", "200", "--temp", "5", "--top-k", "0",
            "--top-p", "1", "--seed", "3", "--print-ids", "--ignore-eos", NULL);
    CHECK_EXIT(p, 0, "sampling with vocab 509, tokenizer 300");
    int32_t ids[256];
    int n = parse_ids(p.out, ids, 256), beyond = 0;
    for (int i = 0; i < n; i++)
        beyond += ids[i] >= N_TOK;
    CHECK_MSG(n == 200 && beyond == 0, "%d of %d sampled ids >= %d (the tokenizer's ids)", beyond,
              n, N_TOK);
    proc_free(&p);
    /* greedy: the argmax of the logits over the tokenizer's ids, not over all 509 rows */
    snprintf(npy, sizeof(npy), "%s/smalltok.npy", g_tmp);
    p = run("logits", out, "--tokens", "1,5,6", "--out", npy, NULL);
    CHECK_EXIT(p, 0, "logits");
    proc_free(&p);
    float *lg = NULL;
    int64_t r = 0, c = 0;
    CHECK(rt_npy_read_f32(npy, &lg, &r, &c) == RT_IO_ERR_NONE && r == 3 && c == 509);
    p = run("run", out, "--tokens", "1,5,6", "-n", "1", "--temp", "0", "--print-ids", NULL);
    if (lg && r == 3 && c == 509) {
        int best = 0;
        for (int v = 1; v < N_TOK; v++)
            best = lg[2 * 509 + v] > lg[2 * 509 + best] ? v : best;
        CHECK_MSG(p.code == 0 && atoi(p.out) == best, "greedy id %s, argmax over %d ids %d",
                  p.out, N_TOK, best);
    }
    free(lg);
    proc_free(&p);
}

// --- generation_config.json defaults --------------------------------------------------------

static void check_gen_defaults(const cJSON *models)
{
    const cJSON *m, *fx = NULL;
    cJSON_ArrayForEach(m, models)
        if (!fx && jstr(m, "name") && !strcmp(jstr(m, "name"), "llama-gqa-gemm"))
            fx = m;
    if (!fx)
        return;
    char dir[600], out[600], gc[800];
    cli_fixture_copy(fx, "gendef", dir, out, sizeof(dir));
    snprintf(gc, sizeof(gc), "%s/generation_config.json", dir);
    FILE *f = fopen(gc, "wb");
    if (!f)
        return;
    fputs("{\"do_sample\": true, \"temperature\": 0.7, \"top_k\": 1, \"top_p\": 0.9, "
          "\"repetition_penalty\": 1.0}\n", f);
    fclose(f);
    struct proc p = run("convert", dir, out, "--tp", "1", NULL);
    CHECK_EXIT(p, 0, "convert with sampling defaults");
    proc_free(&p);
    /* top_k 1 from the file: any seed gives the greedy ids */
    struct proc g = run("run", out, "--tokens", "1,5,6", "-n", "12", "--temp", "0", "--print-ids",
                        "--ignore-eos", NULL);
    struct proc a = run("run", out, "--tokens", "1,5,6", "-n", "12", "--seed", "1", "--print-ids",
                        "--ignore-eos", "-v", NULL);
    struct proc b = run("run", out, "--tokens", "1,5,6", "-n", "12", "--seed", "2", "--print-ids",
                        "--ignore-eos", NULL);
    CHECK_EXIT(a, 0, "run with generation_config defaults");
    CHECK_MSG(g.out_len > 12 && !strcmp(a.out, g.out) && !strcmp(b.out, g.out),
              "generation_config top_k 1: %s / %s, greedy %s", a.out, b.out, g.out);
    CHECK_MSG(strstr(a.err, "temp 0.7 (generation_config.json)") &&
                  strstr(a.err, "top-k 1 (generation_config.json)") &&
                  strstr(a.err, "min-p 0 (default)") && strstr(a.err, "seed 1 (option)"),
              "-v sources: %.600s", a.err);
    proc_free(&a);
    proc_free(&b);
    /* an option wins over the file: top-k 0 samples at the file's temperature 0.7 */
    int differ = 0;
    for (int s = 1; s <= 4; s++) {
        char seed[16];
        snprintf(seed, sizeof(seed), "%d", s);
        a = run("run", out, "--tokens", "1,5,6", "-n", "12", "--top-k", "0", "--temp", "2",
                "--seed", seed, "--print-ids", "--ignore-eos", NULL);
        differ += strcmp(a.out, g.out) != 0;
        proc_free(&a);
    }
    CHECK_MSG(differ > 0, "--top-k 0 --temp 2 gave the greedy ids for 4 seeds");
    proc_free(&g);
}

// --- --json -----------------------------------------------------------------------------------

static void check_json(const char *model, bool has_tok)
{
    struct proc ids = run("run", model, "--tokens", "1,5,6", "-n", "6", "--temp", "0",
                          "--print-ids", "--ignore-eos", NULL);
    struct proc p = run("run", model, "--tokens", "1,5,6", "-n", "6", "--temp", "0", "--json",
                        "--logprobs", "3", "--ignore-eos", NULL);
    CHECK_EXIT(p, 0, "run --json");
    cJSON *j = cJSON_Parse(p.out);
    CHECK_MSG(j != NULL, "run --json is not one JSON object: %.300s", p.out);
    char *csv = ids_csv(cJSON_GetObjectItemCaseSensitive(j, "ids"));
    CHECK_MSG(ids.out_len > 1 && !strncmp(csv, ids.out, ids.out_len - 1) &&
                  strlen(csv) == ids.out_len - 1, "--json ids %s, --print-ids %s", csv, ids.out);
    CHECK_EQ_STR(jstr(j, "finish_reason"), "length");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    CHECK_EQ_INT(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens")->valueint, 3);
    CHECK_EQ_INT(cJSON_GetObjectItemCaseSensitive(u, "completion_tokens")->valueint, 6);
    CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, "timings"), "prefill_s")));
    /* logprobs: the log-softmax of `logits` of prompt + generated at each step */
    char all[512], npy[600];
    snprintf(all, sizeof(all), "1,5,6,%s", csv);
    snprintf(npy, sizeof(npy), "%s/json.npy", g_tmp);
    struct proc l = run("logits", model, "--tokens", all, "--out", npy, NULL);
    float *lg = NULL;
    int64_t r = 0, c = 0;
    CHECK(l.code == 0 && rt_npy_read_f32(npy, &lg, &r, &c) == RT_IO_ERR_NONE && r == 9);
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(j, "logprobs"), *e;
    CHECK_EQ_INT(cJSON_GetArraySize(lp), 6);
    int k = 0;
    cJSON_ArrayForEach(e, lp)
    {
        const int id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        const double got = cJSON_GetObjectItemCaseSensitive(e, "logprob")->valuedouble;
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(e, "top");
        if (lg && r == 9) {
            double want = cli_log_softmax(lg + (size_t)(2 + k) * (size_t)c, c, id);
            CHECK_MSG(fabs(got - want) < 1e-3, "step %d: logprob %g, from logits %g", k, got, want);
        }
        CHECK(cJSON_GetArraySize(top) == 3 &&
              cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(top, 0), "id")->valueint == id);
        k++;
    }
    free(lg);
    free(csv);
    cJSON_Delete(j);
    proc_free(&l);
    proc_free(&p);
    proc_free(&ids);
    if (!has_tok)
        return;
    /* the text is the streamed continuation */
    struct proc s = run("run", model, "-p", "Hello", "-n", "8", "--temp", "0", "--no-echo",
                        "--ignore-eos", NULL);
    p = run("run", model, "-p", "Hello", "-n", "8", "--temp", "0", "--json", "--ignore-eos", NULL);
    j = cJSON_Parse(p.out);
    const char *t = jstr(j, "text");
    CHECK_MSG(t && s.out_len == strlen(t) + 1 && !strncmp(s.out, t, strlen(t)),
              "--json text \"%s\", streamed \"%s\"", t ? t : "", s.out);
    cJSON_Delete(j);
    proc_free(&p);
    proc_free(&s);
}

/* run -f - : standard input is the prompt, as -p. */
static void check_stdin_prompt(const char *model)
{
    char path[512];
    g_stdin = cli_write_tmp("prompt-stdin.txt", "Once upon a time", path, sizeof(path));
    struct proc a = run("run", model, "-f", "-", "-n", "8", "--temp", "0", "--ignore-eos", NULL);
    g_stdin = NULL;
    struct proc b = run("run", model, "-p", "Once upon a time", "-n", "8", "--temp", "0",
                        "--ignore-eos", NULL);
    CHECK_EXIT(a, 0, "run -f -");
    CHECK_MSG(a.out_len > 16 && !strcmp(a.out, b.out), "-f - gives \"%s\", -p \"%s\"", a.out,
              b.out);
    proc_free(&a);
    proc_free(&b);
}

int main(void)
{
    T_INIT("cli_run");
    if (!cli_setup())
        return 1;
    cJSON *index = load_index();
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(index, "models"), *m;
    CHECK_MSG(cJSON_IsArray(models), "tests/data/models/INDEX.json not found");
    bool done_json = false, done_tok = false;
    cJSON_ArrayForEach(m, models)
    {
        const char *name = jstr(m, "name");
        const bool has_tok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "tokenizer"));
        const cJSON *vs = cJSON_GetObjectItemCaseSensitive(m, "vocab_size");
        if (!name || !jstr(m, "path"))
            continue;
        char *dir = convert(m, 1);
        if (!dir)
            continue;
        const int checks_before = t_pass + t_fail;
        const cJSON *pr;
        if (cJSON_IsNumber(vs))
            check_errors_with_model(dir, name, has_tok, vs->valueint);
        if (!done_json && !has_tok) {
            check_json(dir, false);
            done_json = true;
        }
        if (has_tok && !done_tok) { /* the checks that need text, on the first such model */
            done_tok = true;
            cJSON_ArrayForEach(pr, cJSON_GetObjectItemCaseSensitive(m, "prompts"))
            {
                char what[256];
                snprintf(what, sizeof(what), "%s/%s", name, jstr(pr, "name"));
                check_stop(dir, what, pr);
            }
            check_chat(dir, name, jstr(m, "path"));
            check_streaming(dir);
            check_stdin_prompt(dir);
            check_json(dir, true);
            check_interrupt(dir);
        }
        printf("cli_run: %s: %d checks\n", name, t_pass + t_fail - checks_before);
        free(dir);
    }
    CHECK_MSG(done_tok, "no fixture with a tokenizer: chat, streaming, --json text, SIGINT "
              "checks not run");
    check_vocab_limit(models);
    check_gen_defaults(models);
    cJSON_Delete(index);
    cli_teardown();
    return t_done();
}

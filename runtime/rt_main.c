/*
 * rt_main.c - the user-facing runtime commands: `qshard run`, `logits`, `perplexity`,
 * `tokenize`, `bench model` (tools/cmd.h entry points cmd_run, cmd_logits, cmd_perplexity,
 * cmd_tokenize, cmd_bench_model).
 *
 *   qshard run MODEL -p "text" [-n 128] [sampling flags] [--chat] [--stop STR]...
 *   qshard run MODEL --tokens 1,2,3 --temp 0 -n 16 --print-ids
 *   qshard logits MODEL (--tokens 1,2,3 | --text "...") --out logits.npy
 *   qshard perplexity MODEL --file text.txt [--ctx 512]
 *   qshard tokenize MODEL --text "..." | --decode 1,2,3
 *   qshard bench model MODEL [-p 512] [-n 128] [-d 0] [-r 5]   (tools/cmd_bench.c dispatches here)
 *
 * MODEL is a directory written by `qshard convert` (every TP rank; on the CPU they run in one
 * process) or a single TP-1 rank file; a HuggingFace checkpoint directory (config.json, no
 * manifest.json or *.qshard) is refused with the convert command to run (exit 2). The tokenizer
 * comes from the files embedded in rank 0 (fmt_shard_tokenizer_file); a model converted without
 * one works with --tokens only (run then prints the generated ids, as --print-ids).
 *
 * Policies (also in each --help):
 *   - Context: the limit is --ctx (default: rt_opts_default's min(max_position_embeddings,
 *     4096); more than max_position_embeddings is refused by rt_model_open). A prompt that does
 *     not fit (prompt tokens >= ctx: one position must stay free to generate) is refused with
 *     exit 2 naming both numbers; --truncate keeps the last ctx-1 prompt tokens instead.
 *     Generation that reaches the limit stops with a note.
 *   - Stops: any eos id (union of the model config's eos_token_id list, the embedded
 *     generation_config.json's eos_token_id (an int or a list) and the tokenizer's eos) and any
 *     --stop string (matched on the generated text only); the stop token or string is not
 *     printed. With --print-ids the id that completed a stop string is the last one printed.
 *   - Special tokens: prompts are encoded as HF's tokenizer(text) does: BOS per the tokenizer
 *     files, special added tokens ("<|eot_id|>") recognised in the text; --chat formats the
 *     prompt with the model's chat template family (rt_chat_format), never a double BOS.
 *   - Streaming: text is printed as tokens arrive, never half a UTF-8 character, and never a
 *     partial match of a --stop string that might still complete.
 *   - Exit codes (docs/DESIGN.md section 2): 1 usage, 2 bad input (bad model file, prompt, token
 *     id, UTF-8), 3 runtime failure (GPU, out of memory), 4 I/O. A bad option prints getopt's
 *     "qshard CMD: ..." line and "try 'qshard CMD --help'", not the whole help.
 *
 * Tests: ./build/test_cli (runs build/qshard on converted fixtures), ./build/test_sample,
 * ./build/test_io.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h> /* generation_config.json eos_token_id */

#include "cmd.h"       /* QS_EXIT_*, cmd_* prototypes */
#include "fmt.h"       /* fmt_shard_open, fmt_manifest_open_rank, fmt_shard_tokenizer_file */
#include "qs_log.h"    /* qs_log_error, qs_log_set_level */
#include "rt.h"        /* rt_model_open, rt_model_forward, rt_model_config */
#include "rt_io.h"     /* rt_npy_write_f32, rt_file_read, rt_ids_parse */
#include "rt_sample.h" /* struct rt_sampler */
#include "rt_tok.h"    /* rt_tok_load, rt_tok_encode, rt_tok_stream, rt_chat_format */

#define MAX_STOPS 16
#define MAX_TEXT_FILE (1ull << 30) /* perplexity input bound */
#define MAX_N_PREDICT (1L << 24)   /* -n upper bound (tokens) */
#define MAX_CTX (1L << 24)         /* --ctx upper bound (tokens) */

// --- small helpers -------------------------------------------------------------------------

/* "s" unless n is 1: "1 token", "2 tokens". */
static const char *plural(long long n)
{
    return n == 1 ? "" : "s";
}

/* Before a getopt_long loop: getopt reports bad options as "argv[0]: ...", so argv[0] (the
 * subcommand name, tools/qshard.c passes argv + 1) becomes `prog` ("qshard run"), a static
 * string of the caller. */
static void getopt_begin(char **argv, char *prog)
{
    argv[0] = prog;
    optind = 1;
    opterr = 1;
}

/* After getopt reported an unknown option or a missing argument: one line pointing at --help
 * (not the whole help text). Returns the usage exit code. */
static int bad_option(const char *cmd)
{
    fprintf(stderr, "try 'qshard %s --help'\n", cmd);
    return QS_EXIT_USAGE;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Parse a whole decimal integer option; false on junk or out of [lo, hi]. */
static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

/* Structural UTF-8 check (RFC 3629: no overlongs, surrogates or > U+10FFFF); returns the byte
 * offset of the first invalid sequence or -1. */
static long utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0;
            if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        } else {
            return (long)i;
        }
        if (i + len > n || p[i + 1] < lo || p[i + 1] > hi)
            return (long)i;
        for (size_t k = 2; k < len; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF)
                return (long)i;
        i += len;
    }
    return -1;
}

static int exit_for_tok_err(enum rt_tok_err e)
{
    return e == RT_TOK_ERR_NOMEM ? QS_EXIT_RUNTIME : QS_EXIT_BAD_INPUT;
}

static int exit_for_io_err(enum rt_io_err e)
{
    switch (e) {
    case RT_IO_ERR_NONE:
        return QS_EXIT_OK;
    case RT_IO_ERR_FORMAT:
    case RT_IO_ERR_PARSE:
    case RT_IO_ERR_TOO_BIG:
        return QS_EXIT_BAD_INPUT;
    case RT_IO_ERR_NOMEM:
        return QS_EXIT_RUNTIME;
    default:
        return QS_EXIT_IO;
    }
}

// --- options common to every model command ------------------------------------------------

struct model_opts {
    const char *path;   /* MODEL_DIR or rank file */
    const char *device; /* "cpu", "cuda" or NULL (auto) */
    long threads;       /* 0: all online CPUs */
    long ctx;           /* 0: the model's maximum */
    long batch;         /* rows per forward (prefill chunk); 0: the backend's default */
    bool verbose;
};

enum {
    OPT_DEVICE = 1000, OPT_THREADS, OPT_CTX, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P,
    OPT_REPEAT, OPT_SEED, OPT_CHAT, OPT_SYSTEM, OPT_STOP, OPT_TOKENS, OPT_PRINT_IDS, OPT_TEXT,
    OPT_OUT, OPT_FILE, OPT_DECODE, OPT_TRUNCATE, OPT_CHAT_TEMPLATE, OPT_NO_ECHO, OPT_NO_BOS,
    OPT_NO_PARSE_SPECIAL, OPT_CHUNKS, OPT_IDS, OPT_IGNORE_EOS,
};

/* Handles the options shared by run/logits/perplexity; returns 1 if `c` was one of them, 0 if
 * not, -1 on a bad value (reported). */
static int model_opt(int c, const char *arg, struct model_opts *mo, const char *cmd)
{
    switch (c) {
    case OPT_DEVICE:
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda")) {
            fprintf(stderr, "qshard %s: --device must be cpu or cuda, got '%s'\n", cmd, arg);
            return -1;
        }
        mo->device = arg;
        return 1;
    case OPT_THREADS:
        if (!parse_int(arg, 1, 4096, &mo->threads)) {
            fprintf(stderr, "qshard %s: --threads must be an integer in [1, 4096]\n", cmd);
            return -1;
        }
        return 1;
    case OPT_CTX:
        if (!parse_int(arg, 2, MAX_CTX, &mo->ctx)) {
            fprintf(stderr, "qshard %s: --ctx must be an integer in [2, %ld]: the context holds "
                            "at least one prompt token and one generated token\n", cmd, MAX_CTX);
            return -1;
        }
        return 1;
    case 'b':
        if (!parse_int(arg, 1, MAX_CTX, &mo->batch)) {
            fprintf(stderr, "qshard %s: --batch-size must be an integer in [1, %ld], got '%s'\n",
                    cmd, MAX_CTX, arg);
            return -1;
        }
        return 1;
    case 'v':
        mo->verbose = true;
        qs_log_set_level(QS_LOG_DEBUG);
        return 1;
    default:
        return 0;
    }
}

/* Help lines: options at column 2, descriptions at column 26 in every command. */
#define MODEL_OPTS_HELP                                                                      \
    "  --device cpu|cuda       where to run (default: cuda when the binary has CUDA and a GPU\n" \
    "                          is present, else cpu)\n"                                      \
    "  --threads N             CPU threads (default: all online CPUs)\n"                     \
    "  -b, --batch-size N      most prompt tokens per forward pass (default: 2048 on cuda, 512\n" \
    "                          on cpu; at most the context); longer prompts run in chunks\n"   \
    "  -v, --verbose           print the resolved config and debug messages\n"               \
    "  -h, --help              this text\n"

#define MODEL_LONGOPTS                                                                       \
    {"device", required_argument, NULL, OPT_DEVICE},                                         \
        {"threads", required_argument, NULL, OPT_THREADS},                                   \
        {"ctx", required_argument, NULL, OPT_CTX}, {"verbose", no_argument, NULL, 'v'},      \
        {"batch-size", required_argument, NULL, 'b'}, {"help", no_argument, NULL, 'h'}

// --- the model (runtime/rt.h) --------------------------------------------------------------

/* An opened model plus what the commands need from its config. */
struct session {
    struct rt_exec *model;
    int32_t vocab_size;     /* real vocabulary: ids [0, vocab_size) */
    int64_t logits_stride;  /* floats per logits row written by rt_model_forward */
    int64_t ctx;            /* context limit in tokens */
    int32_t eos[64];        /* model eos ids (config/generation_config) + tokenizer eos */
    int n_eos;
    int32_t bos;            /* -1: none */
    struct rt_tok *tok;     /* NULL: the model carries no tokenizer */
    enum rt_err open_err;   /* why rt_model_open failed (session_open), else RT_ERR_NONE */
};

static void add_eos(struct session *s, int32_t id)
{
    if (id < 0)
        return;
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id)
            return;
    if (s->n_eos < (int)(sizeof(s->eos) / sizeof(s->eos[0])))
        s->eos[s->n_eos++] = id;
}

static bool is_eos(const struct session *s, int32_t id)
{
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id)
            return true;
    return false;
}

/* Load the tokenizer embedded in shard `sh` (rank 0). *tok = NULL and exit 0 when the model
 * has none. */
static int tok_from_shard(const struct fmt_shard *sh, struct rt_tok **tok)
{
    *tok = NULL;
    const char *names[3] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"};
    void *buf[3] = {NULL, NULL, NULL};
    size_t len[3] = {0, 0, 0};
    int rc = QS_EXIT_OK;
    for (int i = 0; i < 3; i++) {
        enum fmt_err fe = fmt_shard_tokenizer_file(sh, names[i], &buf[i], &len[i]);
        if (fe == FMT_ERR_NOT_FOUND) {
            buf[i] = NULL;
            continue;
        }
        if (fe != FMT_ERR_NONE) {
            rc = fe == FMT_ERR_NOMEM ? QS_EXIT_RUNTIME : QS_EXIT_BAD_INPUT;
            goto out;
        }
    }
    if (!buf[0] && !buf[1])
        goto out; /* no tokenizer: fine until text is needed */
    struct rt_tok_files files = {
        .json = buf[0], .json_len = len[0],
        .model = buf[1], .model_len = len[1],
        .config = buf[2], .config_len = len[2],
    };
    enum rt_tok_err te = rt_tok_load(&files, tok);
    if (te != RT_TOK_ERR_NONE)
        rc = exit_for_tok_err(te);
out:
    for (int i = 0; i < 3; i++)
        free(buf[i]);
    return rc;
}

/* A HuggingFace checkpoint directory given where a converted model belongs (the vLLM habit):
 * a directory with config.json but neither manifest.json nor a *.qshard file. Then reports
 * that, with the convert command, and returns QS_EXIT_BAD_INPUT; QS_EXIT_OK for anything else
 * (which the model loader opens or reports). */
static int refuse_hf_dir(const char *path)
{
    struct stat st;
    char sub[4096];
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return QS_EXIT_OK;
    int l = snprintf(sub, sizeof(sub), "%s/config.json", path);
    if (l < 0 || (size_t)l >= sizeof(sub) || stat(sub, &st) != 0 || !S_ISREG(st.st_mode))
        return QS_EXIT_OK;
    snprintf(sub, sizeof(sub), "%s/manifest.json", path);
    if (stat(sub, &st) == 0)
        return QS_EXIT_OK;
    DIR *d = opendir(path);
    if (!d)
        return QS_EXIT_OK;
    bool has_rank = false;
    for (struct dirent *e; !has_rank && (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        has_rank = n > 7 && !strcmp(e->d_name + n - 7, ".qshard");
    }
    closedir(d);
    if (has_rank)
        return QS_EXIT_OK;
    qs_log_error(__func__, "%s has config.json but no manifest.json or *.qshard file: this looks "
                 "like a HuggingFace model directory; convert it first: qshard convert %s "
                 "OUT_DIR --tp N", path, path);
    return QS_EXIT_BAD_INPUT;
}

/* Open rank 0 of `path` (a directory or a rank file) for its tokenizer only. */
static int tok_open_path(const char *path, struct rt_tok **tok)
{
    *tok = NULL;
    struct fmt_shard *sh = NULL;
    struct stat st;
    enum fmt_err fe;
    if (stat(path, &st) != 0) {
        qs_log_error(__func__, "cannot open model %s: %s", path, strerror(errno));
        return QS_EXIT_IO;
    }
    int rc = refuse_hf_dir(path);
    if (rc)
        return rc;
    if (S_ISDIR(st.st_mode))
        fe = fmt_manifest_open_rank(path, 0, &sh);
    else
        fe = fmt_shard_open(path, &sh);
    if (fe != FMT_ERR_NONE)
        return fe == FMT_ERR_IO ? QS_EXIT_IO
                                : fe == FMT_ERR_NOMEM ? QS_EXIT_RUNTIME : QS_EXIT_BAD_INPUT;
    rc = tok_from_shard(sh, tok);
    fmt_shard_close(sh);
    return rc;
}

/* eos_token_id of generation_config.json (an int or a list of ints) into the session's set;
 * anything else there is ignored (the converter validated the JSON when it embedded it). */
static void add_generation_eos(struct session *s, const struct fmt_shard *sh)
{
    const char *json;
    size_t len;
    if (fmt_shard_generation_config_json(sh, &json, &len) != FMT_ERR_NONE)
        return;
    cJSON *root = cJSON_ParseWithLength(json, len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    const cJSON *it, *list = cJSON_IsArray(e) ? e : NULL;
    cJSON_ArrayForEach(it, list)
        if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < s->vocab_size)
            add_eos(s, (int32_t)it->valuedouble);
    if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < s->vocab_size)
        add_eos(s, (int32_t)e->valuedouble);
    cJSON_Delete(root);
}

static void session_close(struct session *s)
{
    rt_tok_free(s->tok);
    rt_exec_free(s->model);
    memset(s, 0, sizeof(*s));
}

/* Open model and tokenizer. need_model = false opens the tokenizer only (tokenize). */
static int session_open(struct session *s, const struct model_opts *mo, bool need_model)
{
    memset(s, 0, sizeof(*s));
    s->bos = -1;
    int rc;
    if (!need_model) {
        rc = tok_open_path(mo->path, &s->tok);
        if (rc == QS_EXIT_OK && s->tok) {
            s->vocab_size = rt_tok_n_vocab(s->tok);
            s->bos = rt_tok_bos_id(s->tok);
        }
        return rc;
    }
    struct rt_opts ro = rt_opts_default();
    if (mo->device)
        ro.device = !strcmp(mo->device, "cuda") ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    if (mo->threads > 0)
        ro.n_threads = (int)mo->threads;
    if (mo->ctx > 0)
        ro.n_ctx = (int)mo->ctx;
    if (mo->batch > 0)
        ro.max_batch = (int)mo->batch;
    /* the A/B switches (until the --debug-* options replace them) */
    static const char *const envs[] = {"QSHARD_GRAPH", "QSHARD_PDL", "QSHARD_DEFER",
                                       "QSHARD_ROPE_KV", "QSHARD_WGMMA", "QSHARD_DEVICE_SAMPLE",
                                       "QSHARD_P2P_ALLREDUCE"};
    bool *flags[] = {&ro.no_graph, &ro.no_pdl, &ro.no_defer, &ro.no_rope_kv, &ro.no_wgmma,
                     &ro.host_sample, NULL};
    for (size_t i = 0; i < sizeof(envs) / sizeof(envs[0]); i++) {
        const char *v = getenv(envs[i]);
        if (!v || strcmp(v, "0") != 0)
            continue;
        if (flags[i])
            *flags[i] = true;
        else
            ro.p2p_allreduce = 0;
    }
    rc = refuse_hf_dir(mo->path);
    if (rc)
        return rc;
    enum rt_err e = rt_exec_open(mo->path, &ro, &s->model);
    s->open_err = e;
    if (e != RT_ERR_NONE)
        return rt_err_exit_code(e);
    const struct rt_config *cfg = rt_exec_config(s->model);
    const struct fmt_shard *sh = rt_exec_shard(s->model);
    s->vocab_size = cfg->vocab_size;
    s->logits_stride = cfg->vocab_size; /* rt_model_forward drops the padded columns */
    s->ctx = rt_exec_n_ctx(s->model);
    s->bos = cfg->bos_token_id;
    for (int i = 0; i < cfg->n_eos; i++)
        add_eos(s, cfg->eos_token_ids[i]);
    add_generation_eos(s, sh);
    rc = tok_from_shard(sh, &s->tok);
    if (rc)
        goto fail;
    if (s->tok) {
        size_t n = 0;
        const int32_t *te = rt_tok_eos_ids(s->tok, &n);
        for (size_t i = 0; i < n; i++)
            add_eos(s, te[i]);
        if (s->bos < 0)
            s->bos = rt_tok_bos_id(s->tok);
        if (rt_tok_n_vocab(s->tok) > s->vocab_size) {
            qs_log_error(__func__,
                         "model %s: the tokenizer has %d ids but the model's vocab_size is %d",
                         mo->path, (int)rt_tok_n_vocab(s->tok), (int)s->vocab_size);
            rc = QS_EXIT_BAD_INPUT;
            goto fail;
        }
    }
    qs_log_debug("model %s: %s, device %s, world_size %d, vocab %d, context %lld, %d eos id(s), "
                 "bos %d, tokenizer %s",
                 mo->path, cfg->architecture,
                 rt_exec_device(s->model) == RT_DEVICE_CUDA ? "cuda" : "cpu",
                 rt_exec_world_size(s->model), (int)s->vocab_size, (long long)s->ctx, s->n_eos,
                 (int)s->bos, s->tok ? "yes" : "no");
    return QS_EXIT_OK;
fail:
    session_close(s);
    return rc;
}

/* Every id must be in [0, vocab_size). */
static int check_ids(const struct session *s, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab_size) {
            qs_log_error(__func__, "token id %d at position %zu is outside the vocabulary [0, %d)",
                         (int)ids[i], i, (int)s->vocab_size);
            return QS_EXIT_BAD_INPUT;
        }
    return QS_EXIT_OK;
}

/* Run the model on ids [n] starting at position pos; logits [n, logits_stride] when all_rows,
 * else only the last row's [logits_stride]. */
static int forward(struct session *s, const int32_t *ids, size_t n, int64_t pos, float *logits,
                   bool all_rows)
{
    enum rt_err e = rt_exec_forward_seq(s->model, 0, ids, (int)n, (int)pos, logits, all_rows);
    return e == RT_ERR_NONE ? QS_EXIT_OK : rt_err_exit_code(e);
}

/* forward, then the next token chosen on the device (rt_model_forward_pick) with the sampler's
 * parameters, history and PRNG stream: one draw per sampled token, as rt_sampler_next. */
static int forward_pick(struct session *s, const int32_t *ids, size_t n, int64_t pos,
                        struct rt_sampler *smp, int32_t *next)
{
    const struct rt_pick pk = {
        .p = smp->p,
        .u = smp->p.temperature > 0.0f ? rt_sampler_uniform(smp) : 0.0,
        .seen = smp->seen,
    };
    enum rt_err e = rt_exec_forward_seq_pick(s->model, 0, ids, (int)n, (int)pos, &pk, next);
    return e == RT_ERR_NONE ? QS_EXIT_OK : rt_err_exit_code(e);
}

// --- prompts -------------------------------------------------------------------------------

struct prompt_opts {
    const char *text;        /* -p / --text */
    const char *tokens;      /* --tokens list */
    bool chat;               /* --chat */
    const char *system;      /* --system */
    const char *chat_family; /* --chat-template */
    bool no_bos;             /* --no-bos */
    bool no_parse_special;   /* --no-parse-special */
    bool allow_empty;        /* tokenize: "" encodes to [BOS] or nothing, as HF tokenizer("") */
    const char *no_tok_hint; /* the command's own way around a missing tokenizer */
};

/* Turn the prompt options into ids (*ids malloc'd [*n]); every failure reported. */
static int prompt_ids(const struct session *s, const struct prompt_opts *po, int32_t **ids,
                      size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (po->tokens) {
        enum rt_io_err ie = rt_ids_parse(po->tokens, ids, n);
        if (ie)
            return exit_for_io_err(ie);
        return check_ids(s, *ids, *n);
    }
    if (!po->text) {
        qs_log_error(__func__, "no prompt: give -p/--text \"...\" or --tokens 1,2,3");
        return QS_EXIT_USAGE;
    }
    size_t len = strlen(po->text);
    if (len == 0 && !po->chat && !po->allow_empty) {
        qs_log_error(__func__, "empty prompt: give some text, or token ids with --tokens");
        return QS_EXIT_BAD_INPUT;
    }
    long bad = utf8_invalid_at(po->text, len);
    if (bad >= 0) {
        qs_log_error(__func__, "the prompt is not valid UTF-8 (byte offset %ld)", bad);
        return QS_EXIT_BAD_INPUT;
    }
    if (!s->tok) {
        qs_log_error(__func__, "the model carries no tokenizer, so text cannot be encoded");
        if (po->no_tok_hint)
            fprintf(stderr, "hint: %s\n", po->no_tok_hint);
        return QS_EXIT_BAD_INPUT;
    }
    unsigned flags = RT_TOK_DEFAULT_SPECIAL | (po->no_parse_special ? 0 : RT_TOK_PARSE_SPECIAL);
    if (po->no_bos)
        flags = po->no_parse_special ? 0 : RT_TOK_PARSE_SPECIAL;
    char *chat = NULL;
    const char *text = po->text;
    enum rt_tok_err te;
    if (po->chat) {
        enum rt_chat_family fam = RT_CHAT_NONE;
        if (po->chat_family) {
            fam = rt_chat_family_parse(po->chat_family);
            if (fam == RT_CHAT_NONE) {
                qs_log_error(__func__,
                             "unknown --chat-template '%s' (llama2, llama3, mistral, chatml)",
                             po->chat_family);
                return QS_EXIT_USAGE;
            }
        }
        struct rt_chat_msg msgs[2];
        size_t nm = 0;
        if (po->system)
            msgs[nm++] = (struct rt_chat_msg){"system", po->system};
        msgs[nm++] = (struct rt_chat_msg){"user", po->text};
        te = rt_chat_format(s->tok, fam, msgs, nm, true, &chat, &len);
        if (te) {
            if (te == RT_TOK_ERR_CHAT && fam == RT_CHAT_NONE)
                fprintf(stderr, "hint: name the family with --chat-template "
                                "llama2|llama3|mistral|chatml\n");
            return exit_for_tok_err(te);
        }
        text = chat;
        flags |= RT_TOK_PARSE_SPECIAL; /* the template's own special tokens */
    }
    te = rt_tok_encode(s->tok, text, len, flags, ids, n);
    free(chat);
    if (te)
        return exit_for_tok_err(te);
    if (*n == 0 && !po->allow_empty) {
        free(*ids);
        *ids = NULL;
        qs_log_error(__func__, "the prompt encodes to no tokens");
        return QS_EXIT_BAD_INPUT;
    }
    return check_ids(s, *ids, *n);
}

// --- qshard run ----------------------------------------------------------------------------

/* Text printer for `run`: holds back what could still become a --stop string. */
struct printer {
    char *pending; /* text not printed yet (whole UTF-8 characters) */
    size_t n, cap;
    const char *const *stops;
    int n_stops;
    bool print; /* false with --print-ids: track text for stops only */
};

/* Append text; print what can no longer be part of a stop string. Returns true when a stop
 * string completed (the text before it has been printed, the stop string not). */
static bool printer_push(struct printer *p, const char *t, size_t len)
{
    if (p->n + len + 1 > p->cap) {
        size_t nc = (p->n + len + 1) * 2;
        char *np = realloc(p->pending, nc);
        if (!np)
            abort(); /* a few bytes per token: out of memory here is not recoverable */
        p->pending = np;
        p->cap = nc;
    }
    memcpy(p->pending + p->n, t, len);
    p->n += len;
    p->pending[p->n] = '\0';
    /* earliest complete stop string */
    size_t cut = p->n;
    bool stopped = false;
    for (int i = 0; i < p->n_stops; i++) {
        /* memmem, not strstr: generated text may hold NUL bytes (<0x00> tokens) */
        const char *hit = memmem(p->pending, p->n, p->stops[i], strlen(p->stops[i]));
        if (hit && (size_t)(hit - p->pending) < cut) {
            cut = (size_t)(hit - p->pending);
            stopped = true;
        }
    }
    if (!stopped) {
        /* keep the longest suffix that is a proper prefix of a stop string */
        size_t keep = 0;
        for (int i = 0; i < p->n_stops; i++) {
            size_t sl = strlen(p->stops[i]);
            for (size_t k = sl - 1; k > keep; k--)
                if (k <= p->n && !memcmp(p->pending + p->n - k, p->stops[i], k)) {
                    keep = k;
                    break;
                }
        }
        cut = p->n - keep;
    }
    if (p->print && cut > 0) {
        fwrite(p->pending, 1, cut, stdout);
        fflush(stdout);
    }
    memmove(p->pending, p->pending + cut, p->n - cut);
    p->n -= cut;
    return stopped;
}

static void printer_flush(struct printer *p)
{
    if (p->print && p->n)
        fwrite(p->pending, 1, p->n, stdout);
    p->n = 0;
    fflush(stdout);
}

static void run_usage(FILE *f)
{
    fprintf(f,
        "usage: qshard run MODEL (-p \"text\" | --tokens 1,2,3) [options]\n"
        "\n"
        "Generate from a converted model (a directory written by `qshard convert`, or a TP-1\n"
        "rank file). Text streams to stdout; speed (prefill and decode tokens/s) goes to\n"
        "stderr. Without --chat the prompt is echoed first.\n"
        "\n"
        "  -p, --prompt TEXT       prompt text (UTF-8), encoded as HF tokenizer(text) does\n"
        "  -f, --file FILE         read the prompt text from FILE\n"
        "  --tokens 1,2,3          prompt as token ids instead of text\n"
        "  -n, --n-predict N       tokens to generate, 0..%ld (default 128; -1: until eos, a\n"
        "                          stop string or a full context)\n"
        "  --print-ids             print the generated ids (comma-separated, one line) instead\n"
        "                          of text; the default for a model without a tokenizer\n"
        "  --chat                  format the prompt with the model's chat template (Llama-2,\n"
        "                          Llama-3, Mistral or ChatML family, from\n"
        "                          tokenizer_config.json)\n"
        "  --chat-template F       force the family: llama2, llama3, mistral, chatml (implies\n"
        "                          --chat)\n"
        "  --system TEXT           system message for --chat\n"
        "  --stop STR              stop when the text contains STR (repeatable, up to %d);\n"
        "                          generation also stops on every eos id of the model\n"
        "  --ignore-eos            keep generating past eos ids (for comparisons)\n"
        "  --no-echo               do not print the prompt before the continuation\n"
        "  --no-bos                do not add BOS\n"
        "  --no-parse-special      treat \"<s>\", \"<|eot_id|>\"... in the prompt as plain text\n"
        "\n"
        "Sampling (HF transformers order: repetition penalty, temperature, top-k, top-p, min-p):\n"
        "  --temp T                temperature (default 0.8); 0 = greedy (argmax)\n"
        "  --top-k K               keep the K most likely tokens (default 40; 0 = off)\n"
        "  --top-p P               nucleus: smallest set with mass >= P (default 0.95; 1 = off)\n"
        "  --min-p P               drop tokens below P x the top probability (default 0 = off)\n"
        "  --repeat-penalty R      CTRL penalty on tokens already seen (default 1 = off)\n"
        "  --seed S                PRNG seed: the same seed gives the same output (default:\n"
        "                          from the clock, printed with -v)\n"
        "\n"
        "Context:\n"
        "  --ctx N                 context limit = KV cache length in tokens, >= 2 (default:\n"
        "                          min(max_position_embeddings, 4096))\n"
        "  --truncate              keep the last ctx-1 prompt tokens of a prompt that does not\n"
        "                          fit (default: refuse it, exit 2)\n"
        MODEL_OPTS_HELP
        "\nexit codes: 0 ok, 1 usage, 2 bad input (model file, prompt, token id), 3 runtime\n"
        "failure (GPU, memory), 4 I/O error\n",
        MAX_N_PREDICT, MAX_STOPS);
}

int cmd_run(int argc, char **argv)
{
    static const struct option longopts[] = {
        MODEL_LONGOPTS,
        {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},
        {"n-predict", required_argument, NULL, 'n'},
        {"temp", required_argument, NULL, OPT_TEMP},
        {"top-k", required_argument, NULL, OPT_TOP_K},
        {"top-p", required_argument, NULL, OPT_TOP_P},
        {"min-p", required_argument, NULL, OPT_MIN_P},
        {"repeat-penalty", required_argument, NULL, OPT_REPEAT},
        {"seed", required_argument, NULL, OPT_SEED},
        {"chat", no_argument, NULL, OPT_CHAT},
        {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
        {"system", required_argument, NULL, OPT_SYSTEM},
        {"stop", required_argument, NULL, OPT_STOP},
        {"tokens", required_argument, NULL, OPT_TOKENS},
        {"print-ids", no_argument, NULL, OPT_PRINT_IDS},
        {"truncate", no_argument, NULL, OPT_TRUNCATE},
        {"no-echo", no_argument, NULL, OPT_NO_ECHO},
        {"no-bos", no_argument, NULL, OPT_NO_BOS},
        {"no-parse-special", no_argument, NULL, OPT_NO_PARSE_SPECIAL},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {NULL, 0, NULL, 0},
    };
    struct model_opts mo = {0};
    struct prompt_opts po = {0};
    struct rt_sample_params sp = rt_sample_params_default();
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    bool seed_given = false, print_ids = false, truncate = false, no_echo = false;
    bool ignore_eos = false;
    const char *prompt_file = NULL;
    char *file_text = NULL;
    long n_predict = 128;
    const char *stops[MAX_STOPS];
    int n_stops = 0;
    long lv;
    int c;
    static char prog[] = "qshard run";
    getopt_begin(argv, prog);
    while ((c = getopt_long(argc, argv, "p:f:n:b:vh", longopts, NULL)) != -1) {
        int m = model_opt(c, optarg, &mo, "run");
        if (m < 0)
            return QS_EXIT_USAGE;
        if (m > 0)
            continue;
        switch (c) {
        case 'h':
            run_usage(stdout);
            return QS_EXIT_OK;
        case 'p':
            po.text = optarg;
            break;
        case 'f':
            prompt_file = optarg;
            break;
        case 'n':
            if (!parse_int(optarg, -1, MAX_N_PREDICT, &n_predict)) {
                fprintf(stderr, "qshard run: -n must be an integer in [-1, %ld] (-1: until eos "
                                "or a full context)\n", MAX_N_PREDICT);
                return QS_EXIT_USAGE;
            }
            break;
        case OPT_TEMP:
            if (!parse_float(optarg, &sp.temperature) || sp.temperature < 0) {
                fprintf(stderr, "qshard run: --temp must be a number >= 0 (0 = greedy)\n");
                return QS_EXIT_USAGE;
            }
            break;
        case OPT_TOP_K:
            if (!parse_int(optarg, 0, INT32_MAX, &lv)) {
                fprintf(stderr, "qshard run: --top-k must be an integer >= 0\n");
                return QS_EXIT_USAGE;
            }
            sp.top_k = (int32_t)lv;
            break;
        case OPT_TOP_P:
            if (!parse_float(optarg, &sp.top_p) || !(sp.top_p > 0 && sp.top_p <= 1)) {
                fprintf(stderr, "qshard run: --top-p must be in (0, 1]\n");
                return QS_EXIT_USAGE;
            }
            break;
        case OPT_MIN_P:
            if (!parse_float(optarg, &sp.min_p) || !(sp.min_p >= 0 && sp.min_p <= 1)) {
                fprintf(stderr, "qshard run: --min-p must be in [0, 1]\n");
                return QS_EXIT_USAGE;
            }
            break;
        case OPT_REPEAT:
            if (!parse_float(optarg, &sp.repeat_penalty) || !(sp.repeat_penalty > 0)) {
                fprintf(stderr, "qshard run: --repeat-penalty must be > 0 (1 = off)\n");
                return QS_EXIT_USAGE;
            }
            break;
        case OPT_SEED:
            if (!parse_u64(optarg, &sp.seed)) {
                fprintf(stderr, "qshard run: --seed must be a non-negative integer\n");
                return QS_EXIT_USAGE;
            }
            seed_given = true;
            break;
        case OPT_CHAT:
            po.chat = true;
            break;
        case OPT_CHAT_TEMPLATE:
            po.chat_family = optarg;
            po.chat = true;
            break;
        case OPT_SYSTEM:
            po.system = optarg;
            break;
        case OPT_STOP:
            if (n_stops == MAX_STOPS) {
                fprintf(stderr, "qshard run: at most %d --stop strings\n", MAX_STOPS);
                return QS_EXIT_USAGE;
            }
            if (!*optarg) {
                fprintf(stderr, "qshard run: --stop needs a non-empty string\n");
                return QS_EXIT_USAGE;
            }
            stops[n_stops++] = optarg;
            break;
        case OPT_TOKENS:
            po.tokens = optarg;
            break;
        case OPT_PRINT_IDS:
            print_ids = true;
            break;
        case OPT_TRUNCATE:
            truncate = true;
            break;
        case OPT_NO_ECHO:
            no_echo = true;
            break;
        case OPT_IGNORE_EOS:
            ignore_eos = true;
            break;
        case OPT_NO_BOS:
            po.no_bos = true;
            break;
        case OPT_NO_PARSE_SPECIAL:
            po.no_parse_special = true;
            break;
        default:
            return bad_option("run");
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "qshard run: expected one MODEL argument (see qshard run --help)\n");
        return QS_EXIT_USAGE;
    }
    mo.path = argv[optind];
    if (!!po.text + !!po.tokens + !!prompt_file != 1) {
        fprintf(stderr, "qshard run: give exactly one of -p \"text\", -f FILE and --tokens "
                        "1,2,3\n");
        return QS_EXIT_USAGE;
    }
    if (po.tokens && po.chat) {
        fprintf(stderr, "qshard run: --chat formats text; it cannot be used with --tokens\n");
        return QS_EXIT_USAGE;
    }
    if (po.system && !po.chat) {
        fprintf(stderr, "qshard run: --system needs --chat\n");
        return QS_EXIT_USAGE;
    }
    for (int i = 0; i < n_stops; i++)
        if (utf8_invalid_at(stops[i], strlen(stops[i])) >= 0) {
            qs_log_error(__func__, "--stop string %d is not valid UTF-8", i + 1);
            return QS_EXIT_BAD_INPUT;
        }
    if (!seed_given)
        sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (prompt_file) {
        size_t fl = 0;
        enum rt_io_err ie = rt_file_read(prompt_file, MAX_TEXT_FILE, &file_text, &fl);
        if (ie)
            return exit_for_io_err(ie);
        if (strlen(file_text) != fl) {
            qs_log_error(__func__, "%s contains a NUL byte: not a text file", prompt_file);
            free(file_text);
            return QS_EXIT_BAD_INPUT;
        }
        po.text = file_text;
    }

    po.no_tok_hint = "give token ids with --tokens 1,2,3 (the generated ids are printed then)";
    struct session s;
    int rc = session_open(&s, &mo, true);
    if (rc) {
        free(file_text);
        return rc;
    }
    int32_t *ids = NULL, *out_ids = NULL;
    size_t n_ids = 0, n_out = 0;
    float *logits = NULL;
    struct rt_sampler smp = {0};
    struct rt_tok_stream ts;
    bool have_stream = false;
    struct printer pr = {.stops = stops, .n_stops = n_stops, .print = !print_ids};

    if (n_stops > 0 && !s.tok) {
        qs_log_error(__func__, "--stop strings need the model's tokenizer, which it lacks");
        rc = QS_EXIT_BAD_INPUT;
        goto out;
    }
    if (!s.tok && !print_ids && po.tokens) {
        /* no text to print: the ids are the output (a text prompt is refused below) */
        print_ids = true;
        pr.print = false;
        fprintf(stderr, "qshard run: the model carries no tokenizer: printing the generated "
                        "token ids (as --print-ids)\n");
    }
    rc = prompt_ids(&s, &po, &ids, &n_ids);
    if (rc)
        goto out;
    if (po.chat) {
        /* An assistant turn ends with the family's end token (Llama-3 <|eot_id|>, ChatML
         * <|im_end|>) even where generation_config.json does not list it as an eos id. */
        int32_t end = rt_chat_end_id(s.tok, po.chat_family ? rt_chat_family_parse(po.chat_family)
                                                           : RT_CHAT_NONE);
        if (end >= 0)
            add_eos(&s, end);
    }
    if ((int64_t)n_ids >= s.ctx) {
        if (!truncate) {
            qs_log_error(__func__,
                         "the prompt has %zu tokens, the context holds %lld (one position must "
                         "stay free to generate)",
                         n_ids, (long long)s.ctx);
            fprintf(stderr, "hint: shorten the prompt, raise --ctx, or pass --truncate to keep "
                            "the last %lld token%s\n", (long long)s.ctx - 1,
                    plural((long long)s.ctx - 1));
            rc = QS_EXIT_BAD_INPUT;
            goto out;
        }
        size_t keep = (size_t)s.ctx - 1;
        qs_log_warn("prompt truncated from %zu to its last %zu token%s (--ctx %lld)", n_ids, keep,
                    plural((long long)keep), (long long)s.ctx);
        memmove(ids, ids + (n_ids - keep), keep * sizeof(*ids));
        n_ids = keep;
        if (keep == 0) {
            qs_log_error(__func__, "a context of %lld token%s leaves no room for a prompt",
                         (long long)s.ctx, plural(s.ctx));
            rc = QS_EXIT_BAD_INPUT;
            goto out;
        }
    }
    if (rt_sampler_init(&smp, &sp, s.vocab_size) != RT_SAMPLE_ERR_NONE) {
        rc = QS_EXIT_USAGE;
        goto out;
    }
    for (size_t i = 0; i < n_ids; i++)
        rt_sampler_accept(&smp, ids[i]);
    if (mo.verbose) {
        char buf[512];
        size_t bl = 0;
        for (size_t i = 0; i < n_ids && i < 48 && bl + 16 < sizeof(buf); i++)
            bl += (size_t)snprintf(buf + bl, sizeof(buf) - bl, "%s%d", i ? "," : "", (int)ids[i]);
        qs_log_debug("prompt ids: %s%s", buf, n_ids > 48 ? ",..." : "");
    }
    if (mo.verbose)
        qs_log_debug("prompt: %zu token(s); sampling: temp %g, top-k %d, top-p %g, min-p %g, "
                     "repeat-penalty %g, seed %llu", n_ids, (double)sp.temperature,
                     (int)sp.top_k, (double)sp.top_p, (double)sp.min_p,
                     (double)sp.repeat_penalty, (unsigned long long)sp.seed);
    logits = malloc((size_t)s.logits_stride * sizeof(float));
    if (n_predict < 0 || n_predict > s.ctx)
        n_predict = (long)s.ctx; /* -1: until eos, a stop string or a full context */
    out_ids = malloc(((size_t)n_predict + 1) * sizeof(*out_ids));
    if (!logits || !out_ids) {
        qs_log_error(__func__, "out of memory for the logits row (%lld floats)",
                     (long long)s.logits_stride);
        rc = QS_EXIT_RUNTIME;
        goto out;
    }
    if (s.tok) {
        /* continuation of a prompt keeps its leading space; a chat reply is decoded alone */
        unsigned df = RT_TOK_DECODE_SKIP_SPECIAL | (po.chat ? 0 : RT_TOK_DECODE_KEEP_SPACE);
        rt_tok_stream_init(&ts, s.tok, df);
        have_stream = true;
    }
    if (!print_ids && !no_echo && !po.chat && po.text) {
        fputs(po.text, stdout);
        fflush(stdout);
    }

    /* CUDA: the next token is chosen on the (first) GPU and only its id comes back */
    const bool dev_pick = n_predict != 0 && rt_exec_can_pick(s.model); /* -n 0: no pick */
    if (mo.verbose)
        qs_log_debug("sampling on the %s", dev_pick ? "GPU (k_sample)" : "host (rt_sampler)");
    int32_t next = -1;
    double t0 = now_s();
    rc = dev_pick ? forward_pick(&s, ids, n_ids, 0, &smp, &next)
                  : forward(&s, ids, n_ids, 0, logits, false);
    if (rc)
        goto out;
    double t_prefill = now_s() - t0, t_decode = 0;
    int64_t pos = (int64_t)n_ids;
    long n_decode = 0;
    const char *why = n_predict == 0 ? "-n 0" : "-n reached";
    bool warned_no_text = false;
    for (long i = 0; i < n_predict; i++) {
        if (!dev_pick) { /* host sampling counts as part of the step it completes */
            double t_s = now_s();
            enum rt_sample_err se = rt_sampler_next(&smp, logits, s.logits_stride, &next);
            *(i == 0 ? &t_prefill : &t_decode) += now_s() - t_s;
            if (se != RT_SAMPLE_ERR_NONE) {
                rc = QS_EXIT_RUNTIME; /* every logit NaN/-inf: the model computed garbage */
                goto out;
            }
        }
        if (!ignore_eos && is_eos(&s, next)) {
            why = "eos";
            break;
        }
        out_ids[n_out++] = next;
        rt_sampler_accept(&smp, next);
        /* ids past the tokenizer's vocabulary (config vocab_size padded beyond it, as Qwen2's
         * 151936 vs 151646) have no text: they are generated but print nothing */
        if (have_stream && next >= rt_tok_n_vocab(s.tok)) {
            if (!warned_no_text)
                qs_log_warn("generated id %d has no text (the tokenizer has %d ids)", (int)next,
                            (int)rt_tok_n_vocab(s.tok));
            warned_no_text = true;
        } else if (have_stream) {
            const char *t;
            size_t tl;
            if (rt_tok_stream_push(&ts, next, &t, &tl) != RT_TOK_ERR_NONE) {
                rc = QS_EXIT_RUNTIME;
                goto out;
            }
            if (printer_push(&pr, t, tl)) {
                why = "stop string";
                break;
            }
        }
        if (i + 1 == n_predict)
            break;
        if (pos >= s.ctx) {
            qs_log_warn("context full (%lld tokens): generation stopped", (long long)s.ctx);
            why = "context full";
            break;
        }
        double t1 = now_s();
        const int32_t cur = next;
        rc = dev_pick ? forward_pick(&s, &cur, 1, pos, &smp, &next)
                      : forward(&s, &cur, 1, pos, logits, false);
        if (rc)
            goto out;
        t_decode += now_s() - t1;
        n_decode++;
        pos++;
    }
    if (have_stream && strcmp(why, "stop string") != 0) {
        const char *t;
        size_t tl;
        if (rt_tok_stream_flush(&ts, &t, &tl) == RT_TOK_ERR_NONE && !printer_push(&pr, t, tl))
            printer_flush(&pr);
    }
    if (print_ids) {
        for (size_t i = 0; i < n_out; i++)
            printf("%s%d", i ? "," : "", (int)out_ids[i]);
    }
    if (print_ids || !po.chat || n_out)
        putchar('\n');
    if (fflush(stdout) != 0 || ferror(stdout)) {
        qs_log_error(__func__, "writing the output failed: %s", strerror(errno));
        rc = QS_EXIT_IO;
        goto out;
    }
    fprintf(stderr,
            "qshard: prefill %zu token%s in %.3f s (%.2f tok/s), decode %ld token%s in %.3f s "
            "(%.2f tok/s), %zu generated, stopped: %s\n",
            n_ids, plural((long long)n_ids), t_prefill,
            t_prefill > 0 ? (double)n_ids / t_prefill : 0.0, n_decode, plural(n_decode),
            t_decode, t_decode > 0 ? (double)n_decode / t_decode : 0.0, n_out, why);
out:
    if (have_stream)
        rt_tok_stream_free(&ts);
    free(pr.pending);
    rt_sampler_free(&smp);
    free(logits);
    free(out_ids);
    free(ids);
    free(file_text);
    session_close(&s);
    return rc;
}

// --- qshard logits -------------------------------------------------------------------------

static void logits_usage(FILE *f)
{
    fprintf(f,
        "usage: qshard logits MODEL (--tokens 1,2,3 | --text \"...\") --out logits.npy\n"
        "\n"
        "Run the prompt through the model and write the logits of every position as a float32\n"
        ".npy array [T, vocab_size] (NumPy format 1.0, C order; padded vocabulary columns are\n"
        "left out). --text is encoded as HF tokenizer(text) does (BOS per the tokenizer).\n"
        "\n"
        "  --tokens 1,2,3          prompt token ids\n"
        "  --text TEXT             prompt text (needs the model's tokenizer)\n"
        "  -o, --out FILE          output .npy (written to a temp name, then renamed)\n"
        "  --no-bos                with --text: do not add BOS\n"
        "  --ctx N                 context limit, >= 2 (default: min(max_position_embeddings,\n"
        "                          4096)); T must be <= N\n"
        MODEL_OPTS_HELP
        "\nexit codes: 0 ok, 1 usage, 2 bad input (model file, prompt, token id), 3 runtime\n"
        "failure (GPU, memory), 4 I/O error (cannot read the model or write the .npy)\n");
}

int cmd_logits(int argc, char **argv)
{
    static const struct option longopts[] = {
        MODEL_LONGOPTS,
        {"tokens", required_argument, NULL, OPT_TOKENS},
        {"text", required_argument, NULL, OPT_TEXT},
        {"out", required_argument, NULL, OPT_OUT},
        {"no-bos", no_argument, NULL, OPT_NO_BOS},
        {NULL, 0, NULL, 0},
    };
    struct model_opts mo = {0};
    struct prompt_opts po = {0};
    const char *out_path = NULL;
    int c;
    static char prog[] = "qshard logits";
    getopt_begin(argv, prog);
    while ((c = getopt_long(argc, argv, "o:b:vh", longopts, NULL)) != -1) {
        int m = model_opt(c, optarg, &mo, "logits");
        if (m < 0)
            return QS_EXIT_USAGE;
        if (m > 0)
            continue;
        switch (c) {
        case 'h':
            logits_usage(stdout);
            return QS_EXIT_OK;
        case OPT_TOKENS:
            po.tokens = optarg;
            break;
        case OPT_TEXT:
            po.text = optarg;
            break;
        case 'o':
        case OPT_OUT:
            out_path = optarg;
            break;
        case OPT_NO_BOS:
            po.no_bos = true;
            break;
        default:
            return bad_option("logits");
        }
    }
    if (optind != argc - 1 || !out_path || !!po.text + !!po.tokens != 1) {
        fprintf(stderr, "qshard logits: need MODEL, one of --tokens/--text, and --out FILE "
                        "(see qshard logits --help)\n");
        return QS_EXIT_USAGE;
    }
    mo.path = argv[optind];
    po.no_tok_hint = "give token ids with --tokens 1,2,3 instead of --text";
    struct session s;
    int rc = session_open(&s, &mo, true);
    if (rc)
        return rc;
    int32_t *ids = NULL;
    size_t n = 0;
    float *all = NULL;
    rc = prompt_ids(&s, &po, &ids, &n);
    if (rc)
        goto out;
    if ((int64_t)n > s.ctx) {
        qs_log_error(__func__, "the prompt has %zu tokens, the context holds %lld", n,
                     (long long)s.ctx);
        rc = QS_EXIT_BAD_INPUT;
        goto out;
    }
    all = malloc(n * (size_t)s.logits_stride * sizeof(float));
    if (!all) {
        qs_log_error(__func__, "out of memory for %zu x %lld logits", n,
                     (long long)s.logits_stride);
        rc = QS_EXIT_RUNTIME;
        goto out;
    }
    double t0 = now_s();
    rc = forward(&s, ids, n, 0, all, true);
    if (rc)
        goto out;
    double dt = now_s() - t0;
    /* drop padded vocabulary columns in place: row i moves to i * vocab_size */
    for (size_t i = 0; i < n && s.logits_stride != s.vocab_size; i++)
        memmove(all + i * (size_t)s.vocab_size, all + i * (size_t)s.logits_stride,
                (size_t)s.vocab_size * sizeof(float));
    enum rt_io_err ie = rt_npy_write_f32(out_path, all, (int64_t)n, s.vocab_size);
    if (ie) {
        rc = exit_for_io_err(ie);
        goto out;
    }
    fprintf(stderr, "qshard: %zu position%s x %d logits written to %s (forward %.3f s)\n", n,
            plural((long long)n), (int)s.vocab_size, out_path, dt);
out:
    free(all);
    free(ids);
    session_close(&s);
    return rc;
}

// --- qshard perplexity ---------------------------------------------------------------------

static void perplexity_usage(FILE *f)
{
    fprintf(f,
        "usage: qshard perplexity MODEL (--file text.txt | --tokens 1,2,3) [--ctx 512]\n"
        "\n"
        "Perplexity of a text file, computed the way llama.cpp's tools/perplexity does\n"
        "(perplexity()): the whole file is tokenized (with BOS when the tokenizer adds one;\n"
        "text such as \"<s>\" in the file is not read as a special token), cut into\n"
        "non-overlapping chunks of ctx tokens (the remainder is dropped); each chunk is\n"
        "evaluated from an empty KV cache with its first token replaced by BOS (if the\n"
        "tokenizer adds one; not with --tokens), and only the second half is scored: the\n"
        "negative log-likelihood of token j+1 from the logits at j, for j = ctx/2 .. ctx-2.\n"
        "Prints the running estimate after each chunk ([i]ppl) and \"Final estimate: PPL = x\n"
        "+/- y\", where y = ppl * stddev(nll) / sqrt(count - 1) as in llama.cpp. llama.cpp\n"
        "asks for at least 2*ctx tokens; one full chunk suffices here.\n"
        "\n"
        "  -f, --file FILE         UTF-8 text\n"
        "  --tokens 1,2,3          token ids instead of text (models without a tokenizer; no\n"
        "                          BOS replacement)\n"
        "  --ctx N                 chunk length in tokens, >= 4 (default 512; at most the\n"
        "                          model's)\n"
        "  --chunks N              evaluate at most N chunks (default: all)\n"
        MODEL_OPTS_HELP
        "\nexit codes: 0 ok, 1 usage, 2 bad input (model file, text, token id, fewer tokens\n"
        "than one chunk), 3 runtime failure (GPU, memory), 4 I/O error\n");
}

int cmd_perplexity(int argc, char **argv)
{
    static const struct option longopts[] = {
        MODEL_LONGOPTS,
        {"file", required_argument, NULL, 'f'},
        {"chunks", required_argument, NULL, OPT_CHUNKS},
        {"tokens", required_argument, NULL, OPT_TOKENS},
        {NULL, 0, NULL, 0},
    };
    struct model_opts mo = {0};
    const char *file = NULL, *tokens = NULL;
    long max_chunks = -1;
    int c;
    static char prog[] = "qshard perplexity";
    getopt_begin(argv, prog);
    while ((c = getopt_long(argc, argv, "f:b:vh", longopts, NULL)) != -1) {
        int m = model_opt(c, optarg, &mo, "perplexity");
        if (m < 0)
            return QS_EXIT_USAGE;
        if (m > 0)
            continue;
        switch (c) {
        case 'h':
            perplexity_usage(stdout);
            return QS_EXIT_OK;
        case 'f':
            file = optarg;
            break;
        case OPT_TOKENS:
            tokens = optarg;
            break;
        case OPT_CHUNKS:
            if (!parse_int(optarg, 1, INT32_MAX, &max_chunks)) {
                fprintf(stderr, "qshard perplexity: --chunks must be a positive integer\n");
                return QS_EXIT_USAGE;
            }
            break;
        default:
            return bad_option("perplexity");
        }
    }
    if (optind != argc - 1 || !!file + !!tokens != 1) {
        fprintf(stderr, "qshard perplexity: need MODEL and one of --file FILE and --tokens "
                        "(see --help)\n");
        return QS_EXIT_USAGE;
    }
    mo.path = argv[optind];
    long ctx = mo.ctx > 0 ? mo.ctx : 512;
    if (ctx < 4) {
        fprintf(stderr, "qshard perplexity: --ctx must be at least 4 (half of it is scored)\n");
        return QS_EXIT_USAGE;
    }
    mo.ctx = ctx;
    char *text = NULL;
    size_t text_len = 0;
    if (file) {
        enum rt_io_err ie = rt_file_read(file, MAX_TEXT_FILE, &text, &text_len);
        if (ie)
            return exit_for_io_err(ie);
    }
    struct session s;
    int rc = session_open(&s, &mo, true);
    if (rc) {
        free(text);
        return rc;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    float *logits = NULL;
    int32_t *chunk = NULL;
    /* as llama.cpp: BOS per the tokenizer, special-token text in the file stays plain text */
    struct prompt_opts po = {.text = text, .tokens = tokens, .no_parse_special = true,
                             .no_tok_hint = "give token ids with --tokens 1,2,3 instead of "
                                            "--file"};
    if (text && strlen(text) != text_len) {
        qs_log_error(__func__, "%s contains a NUL byte (offset %zu): not a text file", file,
                     strlen(text));
        rc = QS_EXIT_BAD_INPUT;
        goto out;
    }
    rc = prompt_ids(&s, &po, &ids, &n);
    if (rc)
        goto out;
    long n_chunks = (long)(n / (size_t)ctx);
    if (n_chunks == 0) {
        qs_log_error(__func__, "%s has %zu token%s, fewer than one chunk of --ctx %ld",
                     file ? file : "--tokens", n, plural((long long)n), ctx);
        rc = QS_EXIT_BAD_INPUT;
        goto out;
    }
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    logits = malloc((size_t)ctx * (size_t)s.logits_stride * sizeof(float));
    chunk = malloc((size_t)ctx * sizeof(*chunk));
    if (!logits || !chunk) {
        qs_log_error(__func__, "out of memory for %ld x %lld logits", ctx,
                     (long long)s.logits_stride);
        rc = QS_EXIT_RUNTIME;
        goto out;
    }
    fprintf(stderr, "qshard: %zu tokens, %ld chunk%s of %ld, scoring positions %ld..%ld of "
            "each\n", n, n_chunks, plural(n_chunks), ctx, ctx / 2, ctx - 2);
    const long first = ctx / 2;
    double nll = 0, nll2 = 0, t0 = now_s();
    long count = 0;
    for (long k = 0; k < n_chunks; k++) {
        memcpy(chunk, ids + (size_t)k * (size_t)ctx, (size_t)ctx * sizeof(*chunk));
        if (s.bos >= 0 && text && ids[0] == s.bos)
            chunk[0] = s.bos; /* llama.cpp: add_bos -> first token of each chunk is BOS */
        rt_exec_seq_clear(s.model, 0);
        rc = forward(&s, chunk, (size_t)ctx, 0, logits, true);
        if (rc)
            goto out;
        for (long j = first; j < ctx - 1; j++) {
            const float *row = logits + (size_t)j * (size_t)s.logits_stride;
            double mx = -INFINITY, sum = 0;
            for (int32_t v = 0; v < s.vocab_size; v++)
                mx = row[v] > mx ? row[v] : mx;
            for (int32_t v = 0; v < s.vocab_size; v++)
                sum += exp((double)row[v] - mx);
            double lp = (double)row[chunk[j + 1]] - mx - log(sum);
            nll -= lp;
            nll2 += lp * lp;
            count++;
        }
        printf("[%ld]%.4f,", k + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    printf("\n");
    double mean = nll / (double)count, ppl = exp(mean);
    double var = nll2 / (double)count - mean * mean;
    if (count > 1 && var > 0)
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * sqrt(var / (double)(count - 1)));
    else
        printf("Final estimate: PPL = %.4f\n", ppl);
    fprintf(stderr, "qshard: %ld chunk%s, %ld scored token%s in %.2f s\n", n_chunks,
            plural(n_chunks), count, plural(count),
            now_s() - t0);
out:
    free(chunk);
    free(logits);
    free(ids);
    free(text);
    session_close(&s);
    return rc;
}

// --- qshard tokenize -----------------------------------------------------------------------

static void tokenize_usage(FILE *f)
{
    fprintf(f,
        "usage: qshard tokenize MODEL (--text \"...\" | --file FILE | --decode 1,2,3)\n"
        "\n"
        "Encode text with the tokenizer embedded in the model and print the token ids one per\n"
        "line (like llama.cpp's llama-tokenize), as HF tokenizer(text) does: BOS per the\n"
        "tokenizer files, special tokens in the text recognised. --decode prints the text of\n"
        "a list of ids (as HF tokenizer.decode).\n"
        "\n"
        "  --text TEXT             text to encode (UTF-8); \"\" gives just BOS, if the\n"
        "                          tokenizer adds one (as HF tokenizer(\"\"))\n"
        "  -f, --file FILE         encode a file's contents\n"
        "  --decode 1,2,3          decode ids instead\n"
        "  --ids                   print the ids on one line as [1, 2, 3]\n"
        "  --no-bos                do not add BOS (HF add_special_tokens=False)\n"
        "  --no-parse-special      treat special-token text as plain text\n"
        "  -v, --verbose           debug messages\n"
        "  -h, --help              this text\n"
        "\nexit codes: 0 ok, 1 usage, 2 bad input (model file, no tokenizer, invalid UTF-8,\n"
        "token id), 3 out of memory, 4 I/O error\n");
}

int cmd_tokenize(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"text", required_argument, NULL, OPT_TEXT},
        {"file", required_argument, NULL, 'f'},
        {"decode", required_argument, NULL, OPT_DECODE},
        {"ids", no_argument, NULL, OPT_IDS},
        {"no-bos", no_argument, NULL, OPT_NO_BOS},
        {"no-parse-special", no_argument, NULL, OPT_NO_PARSE_SPECIAL},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct model_opts mo = {0};
    struct prompt_opts po = {0};
    const char *file = NULL, *decode = NULL;
    bool list = false;
    int c;
    static char prog[] = "qshard tokenize";
    getopt_begin(argv, prog);
    while ((c = getopt_long(argc, argv, "f:vh", longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            tokenize_usage(stdout);
            return QS_EXIT_OK;
        case 'v':
            qs_log_set_level(QS_LOG_DEBUG);
            break;
        case OPT_TEXT:
            po.text = optarg;
            break;
        case 'f':
            file = optarg;
            break;
        case OPT_DECODE:
            decode = optarg;
            break;
        case OPT_IDS:
            list = true;
            break;
        case OPT_NO_BOS:
            po.no_bos = true;
            break;
        case OPT_NO_PARSE_SPECIAL:
            po.no_parse_special = true;
            break;
        default:
            return bad_option("tokenize");
        }
    }
    if (optind != argc - 1 || !!po.text + !!file + !!decode != 1) {
        fprintf(stderr, "qshard tokenize: need MODEL and one of --text, --file, --decode "
                        "(see --help)\n");
        return QS_EXIT_USAGE;
    }
    mo.path = argv[optind];
    struct session s;
    int rc = session_open(&s, &mo, false);
    if (rc)
        return rc;
    char *text = NULL, *out = NULL;
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    if (!s.tok) {
        qs_log_error(__func__, "model %s carries no tokenizer", mo.path);
        rc = QS_EXIT_BAD_INPUT;
        goto out;
    }
    if (decode) {
        enum rt_io_err ie = rt_ids_parse(decode, &ids, &n);
        if (ie) {
            rc = exit_for_io_err(ie);
            goto out;
        }
        rc = check_ids(&s, ids, n);
        if (rc)
            goto out;
        enum rt_tok_err te = rt_tok_decode(s.tok, ids, n, 0, &out, &len);
        if (te) {
            rc = exit_for_tok_err(te);
            goto out;
        }
        fwrite(out, 1, len, stdout);
        putchar('\n');
        goto out;
    }
    if (file) {
        enum rt_io_err ie = rt_file_read(file, MAX_TEXT_FILE, &text, &len);
        if (ie) {
            rc = exit_for_io_err(ie);
            goto out;
        }
        if (strlen(text) != len) {
            qs_log_error(__func__, "%s contains a NUL byte: not a text file", file);
            rc = QS_EXIT_BAD_INPUT;
            goto out;
        }
        po.text = text;
    }
    po.allow_empty = true; /* HF tokenizer("") is [BOS] (or [] without one) */
    rc = prompt_ids(&s, &po, &ids, &n);
    if (rc)
        goto out;
    if (list) {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", (int)ids[i]);
        printf("]\n");
    } else {
        for (size_t i = 0; i < n; i++)
            printf("%d\n", (int)ids[i]);
    }
out:
    if ((fflush(stdout) != 0 || ferror(stdout)) && rc == QS_EXIT_OK) {
        qs_log_error(__func__, "writing the output failed: %s", strerror(errno));
        rc = QS_EXIT_IO;
    }
    free(out);
    free(ids);
    free(text);
    session_close(&s);
    return rc;
}

// --- qshard bench model --------------------------------------------------------------------

#define BENCH_MAX_TESTS 16

static void bench_model_usage(FILE *f)
{
    fprintf(f,
        "usage: qshard bench model MODEL [-p 512] [-n 128] [-d 0] [-r 5] [-b 2048]\n"
        "                          [--device cpu|cuda]\n"
        "\n"
        "Prompt processing and generation speed of a converted model, measured the way\n"
        "llama.cpp's llama-bench does: ppN runs a prompt of N token ids from an empty KV cache\n"
        "(forwards of at most --batch-size positions) up to the first generated token; tgN\n"
        "generates N tokens one at a time from an empty cache (decode steps, the first after\n"
        "BOS). Ids are pseudo-random (fixed seed), the next token greedy, chosen where\n"
        "`qshard run` chooses it (on the GPU when it can). Each test runs once untimed\n"
        "(warm-up: kernels loaded, decode graph recorded), then -r times; prints a table of\n"
        "mean tokens/s +/- the standard deviation over the runs. With a depth d > 0\n"
        "(\"ppN @ dD\", \"tgN @ dD\"), each run first fills the KV cache with d prompt ids\n"
        "(not timed), then runs the test at positions d, d+1, ...\n"
        "\n"
        "  -p, --n-prompt LIST     prompt lengths, e.g. 16,64,512 (default 512; 0: none)\n"
        "  -n, --n-gen LIST        generation lengths (default 128; 0: none)\n"
        "  -d, --n-depth LIST      KV cache depths to run every test at (default 0)\n"
        "  -r, --repetitions N     timed runs per test, 1..1000 (default 5)\n"
        "  --ctx N                 KV cache length (default: what the longest test needs)\n"
        MODEL_OPTS_HELP
        "\nexit codes: 0 ok, 1 usage (also a test longer than --ctx), 2 bad input (model\n"
        "file), 3 runtime failure (GPU, memory), 4 I/O error\n");
}

/* "16,64,512" into out[] (at most BENCH_MAX_TESTS values in [0, hi]; a lone 0 means none,
 * unless zero_ok, where 0 is a value like any other); false on junk. */
static bool parse_test_list(const char *arg, long hi, bool zero_ok, long *out, int *n_out)
{
    int n = 0;
    const char *p = arg;
    while (*p) {
        char buf[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof(buf) || n == BENCH_MAX_TESTS)
            return false;
        memcpy(buf, p, len);
        buf[len] = '\0';
        if (!parse_int(buf, 0, hi, &out[n]))
            return false;
        n++;
        p += len;
        if (*p == ',' && *++p == '\0')
            return false;
    }
    if (n == 0)
        return false;
    if (n == 1 && out[0] == 0 && !zero_ok)
        n = 0;
    for (int i = 0; i < n && !zero_ok; i++)
        if (out[i] == 0)
            return false;
    *n_out = n;
    return true;
}

/* The next id after ids[0..n) placed at positions pos..pos+n-1, greedy: on the device when
 * dev_pick (rt_model_forward_pick, as `run`), else rt_sampler_next on the host logits row. */
static int bench_step(struct session *s, bool dev_pick, struct rt_sampler *smp, float *logits,
                      const int32_t *ids, int n, int pos, int32_t *next)
{
    if (dev_pick)
        return forward_pick(s, ids, (size_t)n, pos, smp, next);
    int rc = forward(s, ids, (size_t)n, pos, logits, false);
    if (rc)
        return rc;
    return rt_sampler_next(smp, logits, s->logits_stride, next) == RT_SAMPLE_ERR_NONE
               ? QS_EXIT_OK
               : QS_EXIT_RUNTIME;
}

/*
 * One test, warm-up then `reps` timed runs from an empty KV cache; secs[r]: the seconds of
 * run r (>= 1 ns). depth > 0: each run first places ids[0..depth) (one untimed forward, in
 * --batch-size chunks) and the test continues from position depth. pp: ids[depth..depth+len)
 * in one rt_model_forward up to the first generated id. tg: `len` decode steps, the first fed
 * ids[depth] (ids[0] = BOS at depth 0), each next fed the id it chose; the first timed run's
 * ids go to the debug log (tests compare them with `qshard run`).
 */
static int bench_test(struct session *s, bool dev_pick, struct rt_sampler *smp, float *logits,
                      const int32_t *ids, int depth, bool pp, int len, int reps, double *secs)
{
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        rt_exec_seq_clear(s->model, 0);
        rt_sampler_reset(smp);
        int32_t next = ids[depth];
        char seen[256];
        size_t sl = 0;
        seen[0] = '\0';
        int rc = QS_EXIT_OK;
        if (depth > 0) {
            int32_t ignored;
            rc = bench_step(s, dev_pick, smp, logits, ids, depth, 0, &ignored);
            if (rc)
                return rc;
        }
        double t0 = now_s();
        if (pp) {
            rc = bench_step(s, dev_pick, smp, logits, ids + depth, len, depth, &next);
        } else {
            for (int i = 0; i < len && !rc; i++) {
                const int32_t cur = next;
                rc = bench_step(s, dev_pick, smp, logits, &cur, 1, depth + i, &next);
                if (!rc && r == 0 && sl + 16 < sizeof(seen))
                    sl += (size_t)snprintf(seen + sl, sizeof(seen) - sl, "%s%d", i ? "," : "",
                                           (int)next);
            }
        }
        const double dt = now_s() - t0;
        if (rc)
            return rc;
        if (r >= 0)
            secs[r] = dt > 1e-9 ? dt : 1e-9;
        if (r == 0 && !pp && depth > 0) {
            char pre[256];
            size_t pl = 0;
            pre[0] = '\0';
            for (int i = 0; i < depth && pl + 16 < sizeof(pre); i++)
                pl += (size_t)snprintf(pre + pl, sizeof(pre) - pl, "%s%d", i ? "," : "",
                                       (int)ids[i]);
            qs_log_debug("bench tg%d @ d%d: prefix ids %s%s", len, depth, pre,
                         pl + 16 >= sizeof(pre) ? ",..." : "");
        }
        if (r == 0 && !pp)
            qs_log_debug("bench tg%d: greedy ids after %d: %s%s", len, (int)ids[depth], seen,
                         sl + 16 >= sizeof(seen) ? ",..." : "");
    }
    return QS_EXIT_OK;
}

int cmd_bench_model(int argc, char **argv)
{
    static const struct option longopts[] = {
        MODEL_LONGOPTS,
        {"n-prompt", required_argument, NULL, 'p'},
        {"n-gen", required_argument, NULL, 'n'},
        {"repetitions", required_argument, NULL, 'r'},
        {"n-depth", required_argument, NULL, 'd'},
        {NULL, 0, NULL, 0},
    };
    struct model_opts mo = {0};
    long pp[BENCH_MAX_TESTS] = {512}, tg[BENCH_MAX_TESTS] = {128}, dp[BENCH_MAX_TESTS] = {0};
    long reps = 5;
    int n_pp = 1, n_tg = 1, n_dp = 1, c;
    static char prog[] = "qshard bench model";
    getopt_begin(argv, prog);
    while ((c = getopt_long(argc, argv, "p:n:d:r:b:vh", longopts, NULL)) != -1) {
        int m = model_opt(c, optarg, &mo, "bench model");
        if (m < 0)
            return QS_EXIT_USAGE;
        if (m > 0)
            continue;
        switch (c) {
        case 'h':
            bench_model_usage(stdout);
            return QS_EXIT_OK;
        case 'p':
        case 'n':
            if (!parse_test_list(optarg, c == 'p' ? MAX_CTX : MAX_N_PREDICT, false,
                                 c == 'p' ? pp : tg, c == 'p' ? &n_pp : &n_tg)) {
                fprintf(stderr, "qshard bench model: %s takes a comma-separated list of up to %d "
                                "lengths >= 1 (or 0 for none), got '%s'\n",
                        c == 'p' ? "-p/--n-prompt" : "-n/--n-gen", BENCH_MAX_TESTS, optarg);
                return QS_EXIT_USAGE;
            }
            break;
        case 'd':
            if (!parse_test_list(optarg, MAX_CTX, true, dp, &n_dp)) {
                fprintf(stderr, "qshard bench model: -d/--n-depth takes a comma-separated list "
                                "of up to %d depths >= 0, got '%s'\n", BENCH_MAX_TESTS, optarg);
                return QS_EXIT_USAGE;
            }
            break;
        case 'r':
            if (!parse_int(optarg, 1, 1000, &reps)) {
                fprintf(stderr, "qshard bench model: -r/--repetitions must be an integer in "
                                "[1, 1000]\n");
                return QS_EXIT_USAGE;
            }
            break;
        default:
            return bad_option("bench model");
        }
    }
    if (optind != argc - 1 || n_pp + n_tg == 0) {
        if (optind < argc - 1)
            fprintf(stderr, "qshard bench model: expected one MODEL argument, got '%s' and '%s'\n",
                    argv[optind], argv[optind + 1]);
        else
            fprintf(stderr, "qshard bench model: need MODEL and at least one test (see qshard "
                            "bench model --help)\n");
        return QS_EXIT_USAGE;
    }
    mo.path = argv[optind];
    long need = 2, longest = 0, deepest = 0; /* the KV cache the longest test fills */
    bool longest_pp = false;
    for (int i = 0; i < n_pp; i++)
        if (pp[i] > longest) {
            longest = pp[i];
            longest_pp = true;
        }
    for (int i = 0; i < n_tg; i++)
        if (tg[i] > longest) {
            longest = tg[i];
            longest_pp = false;
        }
    for (int i = 0; i < n_dp; i++)
        deepest = dp[i] > deepest ? dp[i] : deepest;
    need = deepest + longest > need ? deepest + longest : need;
    char longest_name[64];
    snprintf(longest_name, sizeof(longest_name), "%s%ld%s%.0ld", longest_pp ? "pp" : "tg",
             longest, deepest ? " @ d" : "", deepest);
    if (mo.ctx > 0 && need > mo.ctx) {
        fprintf(stderr, "qshard bench model: the longest test (%s) needs %ld positions, --ctx "
                        "is %ld\n", longest_name, need, mo.ctx);
        return QS_EXIT_USAGE;
    }
    const bool ctx_given = mo.ctx > 0;
    if (mo.ctx <= 0)
        mo.ctx = need;
    struct session s;
    int rc = session_open(&s, &mo, true);
    if (rc && !ctx_given && s.open_err == RT_ERR_CONTEXT) {
        fprintf(stderr, "qshard bench model: the longest test (%s) needs %ld positions, more than "
                        "the model's context (max_position_embeddings above): shorten -p/-n/-d\n",
                longest_name, need);
        return QS_EXIT_USAGE;
    }
    if (rc)
        return rc;
    struct rt_sampler smp = {0};
    struct rt_sample_params sp = rt_sample_params_default();
    sp.temperature = 0.0f; /* greedy */
    sp.repeat_penalty = 1.0f;
    sp.seed = 1; /* its PRNG draws the prompt ids: the same every run */
    int32_t *ids = malloc((size_t)need * sizeof(*ids));
    float *logits = malloc((size_t)s.logits_stride * sizeof(float));
    double *secs = malloc((size_t)reps * sizeof(double));
    if (!ids || !logits || !secs) {
        qs_log_error(__func__, "out of memory for %ld ids and %lld logits", need,
                     (long long)s.logits_stride);
        rc = QS_EXIT_RUNTIME;
        goto out;
    }
    if (rt_sampler_init(&smp, &sp, s.vocab_size) != RT_SAMPLE_ERR_NONE) {
        rc = QS_EXIT_RUNTIME;
        goto out;
    }
    for (long i = 0; i < need; i++) /* uniform in [0, 1) times vocab_size: < vocab_size */
        ids[i] = (int32_t)(rt_sampler_uniform(&smp) * (double)s.vocab_size);
    if (s.bos >= 0)
        ids[0] = s.bos;
    const bool dev_pick = rt_exec_can_pick(s.model);
    const struct rt_config *cfg = rt_exec_config(s.model);
    const char *dev = rt_exec_device(s.model) == RT_DEVICE_CUDA ? "cuda" : "cpu";
    fprintf(stderr, "qshard bench model: %s (%s, %d layers, hidden %d, vocab %d), %s, TP %d, "
                    "KV cache %lld tokens; %ld timed run%s per test after one warm-up; next "
                    "token greedy on the %s\n",
            mo.path, cfg->architecture, (int)cfg->n_layers, (int)cfg->hidden_size,
            (int)s.vocab_size, dev, rt_exec_world_size(s.model), (long long)s.ctx, reps,
            plural(reps), dev_pick ? "GPU" : "host");
    printf("| model | device | tp | test | t/s | ms per run |\n");
    printf("|---|---|--:|---|--:|--:|\n");
    fflush(stdout);
    for (int t = 0; t < (n_pp + n_tg) * n_dp; t++) {
        const int ti = t % (n_pp + n_tg), depth = (int)dp[t / (n_pp + n_tg)];
        const bool is_pp = ti < n_pp;
        const int len = (int)(is_pp ? pp[ti] : tg[ti - n_pp]);
        rc = bench_test(&s, dev_pick, &smp, logits, ids, depth, is_pp, len, (int)reps, secs);
        if (rc)
            goto out;
        double mean = 0, var = 0, ms = 0;
        for (long r = 0; r < reps; r++) {
            mean += len / secs[r] / (double)reps;
            ms += 1e3 * secs[r] / (double)reps;
        }
        for (long r = 0; r < reps; r++)
            var += (len / secs[r] - mean) * (len / secs[r] - mean);
        const double sd = reps > 1 ? sqrt(var / (double)(reps - 1)) : 0.0;
        char at[32] = "";
        if (depth > 0)
            snprintf(at, sizeof(at), " @ d%d", depth);
        printf("| %s | %s | %d | %s%d%s | %.2f ± %.2f | %.3f |\n", mo.path, dev,
               rt_exec_world_size(s.model), is_pp ? "pp" : "tg", len, at, mean, sd, ms);
        if (fflush(stdout) != 0 || ferror(stdout)) {
            qs_log_error(__func__, "writing the output failed: %s", strerror(errno));
            rc = QS_EXIT_IO;
            goto out;
        }
    }
out:
    rt_sampler_free(&smp);
    free(secs);
    free(logits);
    free(ids);
    session_close(&s);
    return rc;
}

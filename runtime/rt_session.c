/*
 * rt_session.c - the session of runtime/rt_session.h: open (model, embedded tokenizer, eos set,
 * generation_config.json defaults), prompt encoding, and the model steps every command uses.
 * The generation loop is runtime/rt_generate.c.
 *
 * Every call into the model API (rt_model_*) of this file is in rt_session_open and the four
 * small step functions at the end, so a change of that API touches only them.
 *
 * Tests: ./build/test_cli_run, ./build/test_cli_tok, ./build/test_cli_errors.
 */
#include "rt_session.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h> /* generation_config.json */

#include "fmt.h"     /* fmt_manifest_open_rank, fmt_shard_tokenizer_file, ..._generation_config */
#include "qs_json.h" /* qs_json_eos_ids */
#include "qs_log.h"  /* qs_log_error, qs_log_debug */
#include "qs_util.h" /* qs_path_join, qs_now_s */

#define MAX_EOS 64

struct rt_session {
    struct rt_exec *model;   /* owned; NULL with tokenizer_only */
    struct rt_tok *tok;      /* owned; NULL: the model carries no tokenizer */
    struct rt_opts opts;     /* as opened */
    int32_t n_vocab;         /* ids [0, n_vocab) are accepted */
    int32_t n_pick;          /* ids [0, n_pick) may be generated */
    int n_ctx;
    int32_t bos;             /* -1: none */
    int32_t eos[MAX_EOS];
    int n_eos;
    struct rt_sample_params gen_def; /* generation_config.json values ... */
    unsigned gen_set;                /* ... of these fields (RT_GEN_*) */
};

// --- not a converted model ---------------------------------------------------------------------

/* A directory given where a converted model belongs, with neither manifest.json nor a *.qshard
 * file (an HF checkpoint, the vLLM habit, or just the wrong directory): report it with the
 * convert command and return RT_ERR_FORMAT; RT_ERR_NONE for anything else (which the loaders
 * open or report). */
static enum rt_err refuse_unconverted(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return RT_ERR_NONE;
    char *man = qs_path_join(path, FMT_MANIFEST_NAME), *cfg = qs_path_join(path, "config.json");
    bool has_man = man && stat(man, &st) == 0;
    bool has_cfg = cfg && stat(cfg, &st) == 0 && S_ISREG(st.st_mode);
    free(man);
    free(cfg);
    if (has_man)
        return RT_ERR_NONE;
    DIR *d = opendir(path);
    if (!d)
        return RT_ERR_NONE;
    bool has_rank = false;
    for (struct dirent *e; !has_rank && (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        has_rank = n > 7 && !strcmp(e->d_name + n - 7, ".qshard");
    }
    closedir(d);
    if (has_rank)
        return RT_ERR_NONE;
    qs_log_error(__func__, "%s is not a converted model (no %s and no .qshard file)%s; convert "
                 "it first: qshard convert %s OUT_DIR --tp N", path, FMT_MANIFEST_NAME,
                 has_cfg ? ": it has config.json, so it looks like a HuggingFace model directory"
                         : "", path);
    return RT_ERR_FORMAT;
}

// --- tokenizer, eos, generation_config -------------------------------------------------------

static enum rt_err err_from_fmt(enum fmt_err e)
{
    return e == FMT_ERR_NONE ? RT_ERR_NONE
           : e == FMT_ERR_IO ? RT_ERR_IO
           : e == FMT_ERR_NOMEM ? RT_ERR_NOMEM : RT_ERR_FORMAT;
}

static enum rt_err err_from_tok(enum rt_tok_err e)
{
    return e == RT_TOK_ERR_NONE ? RT_ERR_NONE : e == RT_TOK_ERR_NOMEM ? RT_ERR_NOMEM
                                                                      : RT_ERR_TOKENIZER;
}

/* The tokenizer embedded in shard sh (rank 0); *tok = NULL when it has none. */
static enum rt_err tok_from_shard(const struct fmt_shard *sh, struct rt_tok **tok)
{
    static const char *const names[3] = {"tokenizer.json", "tokenizer.model",
                                         "tokenizer_config.json"};
    void *buf[3] = {NULL, NULL, NULL};
    size_t len[3] = {0, 0, 0};
    enum rt_err e = RT_ERR_NONE;
    *tok = NULL;
    for (int i = 0; i < 3 && !e; i++) {
        enum fmt_err fe = fmt_shard_tokenizer_file(sh, names[i], &buf[i], &len[i]);
        if (fe == FMT_ERR_NOT_FOUND)
            buf[i] = NULL;
        else
            e = err_from_fmt(fe);
    }
    if (!e && (buf[0] || buf[1])) {
        struct rt_tok_files files = {
            .json = buf[0], .json_len = len[0],
            .model = buf[1], .model_len = len[1],
            .config = buf[2], .config_len = len[2],
        };
        e = err_from_tok(rt_tok_load(&files, tok));
    }
    for (int i = 0; i < 3; i++)
        free(buf[i]);
    return e;
}

static void add_eos(struct rt_session *s, int32_t id)
{
    if (id < 0 || id >= s->n_vocab)
        return;
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id)
            return;
    if (s->n_eos < MAX_EOS)
        s->eos[s->n_eos++] = id;
}

/* generation_config.json eos_token_id (an int or a list of ints) into the eos set; anything
 * else there is ignored (the converter validated the JSON when it embedded it). The one place
 * that reads it: format/qs_json.h's eos parser replaces it when it lands. */
/* eos_token_id of generation_config.json (an int or a list, format/qs_json.h) into the eos set.
 * Errors: RT_ERR_CONFIG (an id that is not an integer in [0, vocab), reported there). */
static enum rt_err gen_config_eos(struct rt_session *s, const cJSON *root, const char *where)
{
    const struct qs_json_ctx jc = {"rt_session_open", where, "generation_config.json"};
    int ids[MAX_EOS], n = 0;
    if (qs_json_eos_ids(&jc, root, s->n_vocab, ids, MAX_EOS, &n) != QS_JSON_OK)
        return RT_ERR_CONFIG;
    for (int i = 0; i < n; i++)
        add_eos(s, ids[i]);
    return RT_ERR_NONE;
}

/* One sampling default: a number within [lo, hi] (lo excluded when lo_open), else a warning. */
static bool gen_number(const cJSON *root, const char *key, double lo, bool lo_open, double hi,
                       double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v))
        return false;
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(x >= lo && x <= hi) || (lo_open && x == lo)) {
        qs_log_warn("generation_config.json: %s is not a number in %s%g, %g], ignored", key,
                    lo_open ? "(" : "[", lo, hi);
        return false;
    }
    *out = x;
    return true;
}

/* The sampling defaults vLLM takes from generation_config.json (temperature, top_k, top_p,
 * min_p, repetition_penalty; vllm/config: get_diff_sampling_param). top_k 0 or negative means
 * off there, as 0 here. */
static void gen_config_sampling(struct rt_session *s, const cJSON *root)
{
    double x;
    s->gen_def = rt_sample_params_default();
    if (gen_number(root, "temperature", 0.0, false, 1e6, &x)) {
        s->gen_def.temperature = (float)x;
        s->gen_set |= RT_GEN_TEMPERATURE;
    }
    if (gen_number(root, "top_k", -1.0, false, 1e9, &x)) {
        s->gen_def.top_k = x > 0 ? (int32_t)x : 0;
        s->gen_set |= RT_GEN_TOP_K;
    }
    if (gen_number(root, "top_p", 0.0, true, 1.0, &x)) {
        s->gen_def.top_p = (float)x;
        s->gen_set |= RT_GEN_TOP_P;
    }
    if (gen_number(root, "min_p", 0.0, false, 1.0, &x)) {
        s->gen_def.min_p = (float)x;
        s->gen_set |= RT_GEN_MIN_P;
    }
    if (gen_number(root, "repetition_penalty", 0.0, true, 1e6, &x)) {
        s->gen_def.repeat_penalty = (float)x;
        s->gen_set |= RT_GEN_REPEAT_PENALTY;
    }
}

/* The generation config embedded in rank 0 (optional): eos ids and sampling defaults. Errors:
 * RT_ERR_CONFIG (its eos_token_id is not a valid id list; the converter checked it, so the file
 * was changed since). */
static enum rt_err read_generation_config(struct rt_session *s, const struct fmt_shard *sh)
{
    const char *json;
    size_t len;
    s->gen_def = rt_sample_params_default();
    if (fmt_shard_generation_config_json(sh, &json, &len) != FMT_ERR_NONE)
        return RT_ERR_NONE;
    cJSON *root = cJSON_ParseWithLength(json, len);
    enum rt_err e = gen_config_eos(s, root, fmt_shard_path(sh));
    if (!e)
        gen_config_sampling(s, root);
    cJSON_Delete(root);
    return e;
}

// --- open / close ------------------------------------------------------------------------------

/* Rank 0 of path (a directory or a rank file), opened as the model loaders open it (errors
 * reported there; a missing path as "PATH: reason", or "cannot open model PATH: reason" for
 * the tokenizer-only commands). */
static enum rt_err open_rank0(const char *path, bool tok_only, struct fmt_shard **sh)
{
    struct stat st;
    *sh = NULL;
    if (stat(path, &st) != 0) {
        qs_log_error(__func__, "%s%s: %s", tok_only ? "cannot open model " : "", path,
                     strerror(errno));
        return RT_ERR_IO;
    }
    return err_from_fmt(S_ISDIR(st.st_mode) ? fmt_manifest_open_rank(path, 0, sh)
                                            : fmt_shard_open(path, sh));
}

/* Rank 0 of path for its tokenizer only. */
static enum rt_err open_tokenizer_only(struct rt_session *s, const char *path)
{
    struct fmt_shard *sh = NULL;
    enum rt_err e = open_rank0(path, true, &sh);
    if (!e)
        e = tok_from_shard(sh, &s->tok);
    fmt_shard_close(sh);
    if (!e && !s->tok) {
        qs_log_error(__func__, "model %s carries no tokenizer", path);
        e = RT_ERR_TOKENIZER;
    }
    if (!e) {
        s->n_vocab = s->n_pick = rt_tok_n_vocab(s->tok);
        s->bos = rt_tok_bos_id(s->tok);
    }
    return e;
}

/* The tokenizer of one open rank file, parsed on its own thread while the model loads. */
struct tok_job {
    const struct fmt_shard *sh;
    struct rt_tok *tok; /* NULL: none in the file */
    enum rt_err err;
    double secs;
};

static void *tok_job_run(void *arg)
{
    struct tok_job *j = arg;
    const double t0 = qs_now_s();
    j->err = tok_from_shard(j->sh, &j->tok);
    j->secs = qs_now_s() - t0;
    return NULL;
}

/* The model, and beside it (a second thread) the tokenizer embedded in rank 0: a Llama 3
 * tokenizer takes ~0.2-0.45 s to parse, which the weight upload hides. The rank file is opened
 * (and checked) first, so a file that is no model is reported once. */
static enum rt_err open_model_and_tok(struct rt_session *s, const char *path)
{
    struct fmt_shard *sh = NULL;
    enum rt_err e = open_rank0(path, false, &sh);
    if (e) {
        fmt_shard_close(sh);
        return e;
    }
    struct tok_job j = {.sh = sh};
    pthread_t th;
    const bool threaded = pthread_create(&th, NULL, tok_job_run, &j) == 0;
    if (!threaded)
        tok_job_run(&j);
    const double t0 = qs_now_s();
    e = rt_exec_open(path, &s->opts, &s->model);
    const double t_model = qs_now_s() - t0;
    if (threaded)
        pthread_join(th, NULL);
    /* the tokenizer must come from the file the model loaded (a path switched in between) */
    if (!e) {
        const struct fmt_header *a = fmt_shard_header(sh);
        const struct fmt_header *b = fmt_shard_header(rt_exec_shard(s->model));
        if (memcmp(a->model_id, b->model_id, sizeof a->model_id) ||
            a->header_xxh3 != b->header_xxh3) {
            qs_log_error(__func__, "model %s was replaced while it was being opened", path);
            e = RT_ERR_FORMAT;
        }
    }
    fmt_shard_close(sh);
    s->tok = j.tok;
    qs_log_debug("model %s: open %.3f s; tokenizer %.3f s beside it", path, t_model, j.secs);
    return e ? e : j.err;
}

/* With the model and its tokenizer open: config eos, generation_config.json, the tokenizer's
 * eos ids, n_pick. */
static enum rt_err open_with_model(struct rt_session *s, const char *path)
{
    const struct rt_config *cfg = rt_exec_config(s->model);
    const struct fmt_shard *sh = rt_exec_shard(s->model);
    s->n_vocab = s->n_pick = cfg->vocab_size;
    s->n_ctx = rt_exec_n_ctx(s->model);
    s->bos = cfg->bos_token_id;
    for (int i = 0; i < cfg->n_eos; i++)
        add_eos(s, cfg->eos_token_ids[i]);
    enum rt_err e = read_generation_config(s, sh);
    if (e)
        return e;
    if (!s->tok) /* loaded beside the model (open_model_and_tok) */
        return RT_ERR_NONE;
    size_t n = 0;
    const int32_t *te = rt_tok_eos_ids(s->tok, &n);
    for (size_t i = 0; i < n; i++)
        add_eos(s, te[i]);
    if (s->bos < 0)
        s->bos = rt_tok_bos_id(s->tok);
    const int32_t nt = rt_tok_n_vocab(s->tok);
    if (nt > s->n_vocab) {
        qs_log_error(__func__, "model %s: the tokenizer has %d ids but the model's vocab_size is "
                     "%d", path, (int)nt, (int)s->n_vocab);
        return RT_ERR_TOKENIZER;
    }
    s->n_pick = nt;
    return RT_ERR_NONE;
}

enum rt_err rt_session_open(const struct rt_session_opts *o, struct rt_session **out)
{
    *out = NULL;
    struct rt_session *s = calloc(1, sizeof(*s));
    if (!s) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    s->opts = o->model;
    s->bos = -1;
    s->gen_def = rt_sample_params_default();
    enum rt_err e = refuse_unconverted(o->path);
    if (!e && o->tokenizer_only)
        e = open_tokenizer_only(s, o->path);
    if (!e && !o->tokenizer_only) {
        e = open_model_and_tok(s, o->path);
        if (!e)
            e = open_with_model(s, o->path);
    }
    if (e) {
        rt_session_close(s);
        return e;
    }
    if (s->model)
        qs_log_debug("model %s: %s, device %s, world_size %d, vocab %d (%d may be generated), "
                     "context %d, %d eos id(s), bos %d, tokenizer %s", o->path,
                     rt_exec_config(s->model)->architecture,
                     rt_exec_device(s->model) == RT_DEVICE_CUDA ? "cuda" : "cpu",
                     rt_exec_world_size(s->model), (int)s->n_vocab, (int)s->n_pick, s->n_ctx,
                     s->n_eos, (int)s->bos, s->tok ? "yes" : "no");
    *out = s;
    return RT_ERR_NONE;
}

void rt_session_close(struct rt_session *s)
{
    if (!s)
        return;
    rt_tok_free(s->tok);
    rt_exec_free(s->model);
    free(s);
}

struct rt_exec *rt_session_model(const struct rt_session *s) { return s->model; }
const struct rt_tok *rt_session_tok(const struct rt_session *s) { return s->tok; }
int32_t rt_session_n_vocab(const struct rt_session *s) { return s->n_vocab; }
int32_t rt_session_n_pick(const struct rt_session *s) { return s->n_pick; }
int rt_session_n_ctx(const struct rt_session *s) { return s->n_ctx; }
int32_t rt_session_bos(const struct rt_session *s) { return s->bos; }

const int32_t *rt_session_eos(const struct rt_session *s, int *n)
{
    *n = s->n_eos;
    return s->eos;
}

unsigned rt_session_sampling_defaults(const struct rt_session *s, unsigned given,
                                      struct rt_sample_params *p)
{
    const unsigned take = s->gen_set & ~given;
    if (take & RT_GEN_TEMPERATURE)
        p->temperature = s->gen_def.temperature;
    if (take & RT_GEN_TOP_K)
        p->top_k = s->gen_def.top_k;
    if (take & RT_GEN_TOP_P)
        p->top_p = s->gen_def.top_p;
    if (take & RT_GEN_MIN_P)
        p->min_p = s->gen_def.min_p;
    if (take & RT_GEN_REPEAT_PENALTY)
        p->repeat_penalty = s->gen_def.repeat_penalty;
    return take;
}

// --- prompts -----------------------------------------------------------------------------------

static enum rt_err check_ids(const struct rt_session *s, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->n_vocab) {
            qs_log_error(__func__, "token id %d at position %zu is outside the vocabulary [0, %d)",
                         (int)ids[i], i, (int)s->n_vocab);
            return RT_ERR_TOKEN;
        }
    return RT_ERR_NONE;
}

/* The text to encode and its flags: the prompt text, or the chat rendered (*chat malloc'd). */
static enum rt_err prompt_text(const struct rt_session *s, const struct rt_prompt *p,
                               char **chat, const char **text, size_t *len, unsigned *flags)
{
    *flags = RT_TOK_DEFAULT_SPECIAL | (p->no_parse_special ? 0 : RT_TOK_PARSE_SPECIAL);
    if (p->no_bos)
        *flags &= ~(unsigned)RT_TOK_DEFAULT_SPECIAL;
    if (!p->msgs) {
        *text = p->text;
        *len = strlen(p->text);
        if (*len == 0 && !p->allow_empty) {
            qs_log_error(__func__, "empty prompt: give some text, or token ids");
            return RT_ERR_TOKENIZER;
        }
        return RT_ERR_NONE;
    }
    enum rt_tok_err te = rt_chat_format(s->tok, p->family, p->msgs, p->n_msgs, true, chat, len);
    if (te)
        return err_from_tok(te);
    *text = *chat;
    *flags |= RT_TOK_PARSE_SPECIAL; /* the template's own special tokens */
    return RT_ERR_NONE;
}

enum rt_err rt_session_encode(const struct rt_session *s, const struct rt_prompt *p,
                              int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!!p->text + !!p->ids + !!p->msgs != 1) {
        qs_log_error(__func__, "a prompt is exactly one of text, token ids and chat messages");
        return RT_ERR_ARG;
    }
    if (p->ids) {
        enum rt_err e = check_ids(s, p->ids, p->n_ids);
        if (e)
            return e;
        if (!(*ids = malloc((p->n_ids ? p->n_ids : 1) * sizeof(**ids)))) {
            qs_log_error(__func__, "out of memory for %zu ids", p->n_ids);
            return RT_ERR_NOMEM;
        }
        memcpy(*ids, p->ids, p->n_ids * sizeof(**ids));
        *n = p->n_ids;
        return RT_ERR_NONE;
    }
    if (!s->tok) {
        qs_log_error(__func__, "the model carries no tokenizer, so text cannot be encoded");
        return RT_ERR_TOKENIZER;
    }
    char *chat = NULL;
    const char *text;
    size_t len;
    unsigned flags;
    enum rt_err e = prompt_text(s, p, &chat, &text, &len, &flags);
    if (!e)
        e = err_from_tok(rt_tok_encode(s->tok, text, len, flags, ids, n));
    free(chat);
    if (!e && *n == 0 && !p->allow_empty) {
        qs_log_error(__func__, "the prompt encodes to no tokens");
        e = RT_ERR_TOKENIZER;
    }
    if (!e)
        e = check_ids(s, *ids, *n);
    if (e) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return e;
}

int32_t rt_session_chat_end(const struct rt_session *s, const struct rt_prompt *p)
{
    return p->msgs && s->tok ? rt_chat_end_id(s->tok, p->family) : -1;
}

// --- model steps -------------------------------------------------------------------------------

void rt_session_reset(struct rt_session *s)
{
    rt_exec_seq_clear(s->model, 0);
}

enum rt_err rt_session_forward(struct rt_session *s, const int32_t *ids, int n, int pos,
                               float *logits, bool all_rows)
{
    return rt_exec_forward_seq(s->model, 0, ids, n, pos, logits, all_rows);
}

bool rt_session_can_pick(const struct rt_session *s)
{
    return s->model && !s->opts.host_sample && rt_exec_can_pick(s->model);
}

enum rt_err rt_session_sampler_init(const struct rt_session *s, const struct rt_sample_params *p,
                                    struct rt_sampler *smp)
{
    struct rt_sample_params q = *p;
    q.vocab_limit = s->n_pick < s->n_vocab ? s->n_pick : 0;
    enum rt_sample_err e = rt_sampler_init(smp, &q, s->n_vocab);
    return e == RT_SAMPLE_ERR_NONE ? RT_ERR_NONE
           : e == RT_SAMPLE_ERR_NOMEM ? RT_ERR_NOMEM : RT_ERR_ARG;
}

enum rt_err rt_session_step(struct rt_session *s, struct rt_sampler *smp, const int32_t *ids,
                            int n, int pos, bool dev_pick, float *logits, int32_t *next)
{
    if (dev_pick) {
        const struct rt_pick pk = {
            .p = smp->p,
            .u = smp->p.temperature > 0.0f ? rt_sampler_uniform(smp) : 0.0,
            .seen = smp->seen,
        };
        return rt_exec_forward_seq_pick(s->model, 0, ids, n, pos, &pk, next);
    }
    enum rt_err e = rt_exec_forward_seq(s->model, 0, ids, n, pos, logits, false);
    if (e)
        return e;
    /* every logit NaN/-inf: the model computed garbage (reported by the sampler) */
    return rt_sampler_next(smp, logits, s->n_vocab, next) == RT_SAMPLE_ERR_NONE ? RT_ERR_NONE
                                                                               : RT_ERR_NUMERIC;
}

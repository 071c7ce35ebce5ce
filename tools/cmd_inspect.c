/*
 * cmd_inspect.c - `qshard inspect [--tensors] [--json] FILE|DIR...`: open (validate metadata
 * only, O(header)) and describe .qshard files. By default a summary of the model: the rank
 * files and their sizes, the config, the embedded tokenizer and generation config; --tensors
 * prints every rank file in full (header, sections, tokenizer files, config, tensor table);
 * --json gives the full description as one JSON document. A DIR with a manifest.json is shown
 * through the manifest (and its ranks are checked against it); a DIR without one shows every
 * *.qshard file in it.
 *
 * Exit codes (docs/DESIGN.md section 2): 0 ok, 1 usage, 2 for any bad or corrupt file, 4 I/O
 * error. The error itself is reported once, where format/ detects it.
 *
 * Test: ./build/test_fmt (section 6, "the qshard binary"), ./build/test_cli_errors (summary).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h> /* --json, the config on one line */

#include "cli.h"
#include "cmd.h"
#include "fmt.h"        /* fmt_shard_*, fmt_model_*, fmt_manifest_* */
#include "qs_util.h"    /* qs_path_join */
#include "rt.h"         /* rt_config_parse (summary) */
#include "rt_session.h" /* the embedded tokenizer (summary) */

static const char k_usage[] =
    "usage: qshard inspect [--tensors] [--json] FILE|DIR...\n"
    "  Describe .qshard files (a DIR: through its manifest.json, or every *.qshard in it):\n"
    "  by default a summary (rank files and sizes, config, tokenizer, generation config).\n"
    "  Validates the structure only; `qshard verify` checks the data.\n"
    "\n";
static const char k_trailer[] = "exit codes: 0 ok, 1 usage, 2 bad or corrupt file, 4 I/O error\n";

enum inspect_mode { INSPECT_SUMMARY, INSPECT_FULL, INSPECT_JSON };

/* Where the description goes. */
struct inspect_out {
    enum inspect_mode mode;
    cJSON *files; /* INSPECT_JSON: the "files" array */
};

/* The config section on one line (at most 600 bytes of it). */
static void print_config_line(const char *label, const char *cfg, size_t cl)
{
    cJSON *c = cJSON_ParseWithLength(cfg, cl);
    char *one = c ? cJSON_PrintUnformatted(c) : NULL;
    const char *txt = one ? one : cfg;
    size_t tl = one ? strlen(one) : cl;
    printf("  %s %.*s%s\n", label, (int)(tl > 600 ? 600 : tl), txt, tl > 600 ? " ..." : "");
    free(one);
    cJSON_Delete(c);
}

static void shape_str(const struct fmt_tensor *t, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (uint32_t d = 0; d < t->n_dims && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

static void tok_print(void *ctx, const char *name, uint64_t size)
{
    (void)ctx;
    printf("  tokenizer file  %-28s %10" PRIu64 " bytes\n", name, size);
}

static void tok_json(void *ctx, const char *name, uint64_t size)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "size", (double)size);
    cJSON_AddItemToArray((cJSON *)ctx, o);
}

static void print_shard(const struct fmt_shard *s)
{
    const struct fmt_header *h = fmt_shard_header(s);
    char id[33];
    cli_hex_id(h->model_id, id);
    printf("%s\n", fmt_shard_path(s));
    printf("  format %u.%u  rank %u of %u  model_id %s\n", h->version_major, h->version_minor,
           h->tp_rank, h->world_size, id);
    printf("  file %" PRIu64 " bytes (%.3f GiB), metadata %" PRIu64 " bytes, digest %016" PRIx64
           ", %u tensors\n", h->file_size, (double)h->file_size / (1 << 30), h->meta_size,
           fmt_shard_digest(s), fmt_shard_n_tensors(s));
    for (int k = FMT_SECTION_CONFIG; k <= FMT_SECTION_TENSOR_TABLE; k++) {
        const void *d;
        uint64_t n;
        if (fmt_shard_section(s, (enum fmt_section_kind)k, &d, &n) == FMT_ERR_NONE)
            printf("  section %-18s %10" PRIu64 " bytes\n", fmt_section_name((enum fmt_section_kind)k), n);
    }
    if (fmt_shard_tokenizer_list(s, tok_print, NULL) != FMT_ERR_NONE)
        printf("  tokenizer archive: CORRUPT (see error above)\n");
    const char *cfg;
    size_t cl;
    if (fmt_shard_config_json(s, &cfg, &cl) == FMT_ERR_NONE)
        print_config_line("config", cfg, cl);
    int w = 4;
    for (uint32_t i = 0; i < fmt_shard_n_tensors(s); i++) {
        int l = (int)strlen(fmt_shard_tensor(s, i)->name);
        w = l > w ? (l < 200 ? l : 200) : w;
    }
    printf("  %5s  %-*s %-5s %-14s %-20s %-12s %14s %12s  %s\n", "#", w, "name", "dtype", "layout",
           "shape", "split", "offset", "size", "xxh3");
    for (uint32_t i = 0; i < fmt_shard_n_tensors(s); i++) {
        const struct fmt_tensor *t = fmt_shard_tensor(s, i);
        char shape[128], split[32], layout[32];
        shape_str(t, shape, sizeof(shape));
        if (t->split == FMT_SPLIT_NONE)
            snprintf(split, sizeof(split), "none");
        else
            snprintf(split, sizeof(split), "%s/%u", fmt_split_name(t->split), t->split_axis);
        if (t->layout_known)
            snprintf(layout, sizeof(layout), "%s", fmt_layout_name(t->layout));
        else
            snprintf(layout, sizeof(layout), "UNKNOWN(%u)", (unsigned)t->layout);
        printf("  %5u  %-*s %-5s %-14s %-20s %-12s %14" PRIu64 " %12" PRIu64 "  %016" PRIx64 "\n",
               i, w, t->name, fmt_dtype_name(t->dtype), layout, shape, split, t->offset, t->size,
               t->xxh3);
    }
}

static cJSON *shard_json(const struct fmt_shard *s)
{
    const struct fmt_header *h = fmt_shard_header(s);
    char id[33], buf[64];
    cli_hex_id(h->model_id, id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", fmt_shard_path(s));
    snprintf(buf, sizeof(buf), "%u.%u", h->version_major, h->version_minor);
    cJSON_AddStringToObject(o, "version", buf);
    cJSON_AddNumberToObject(o, "tp_rank", h->tp_rank);
    cJSON_AddNumberToObject(o, "world_size", h->world_size);
    cJSON_AddStringToObject(o, "model_id", id);
    cJSON_AddNumberToObject(o, "file_size", (double)h->file_size);
    cJSON_AddNumberToObject(o, "meta_size", (double)h->meta_size);
    snprintf(buf, sizeof(buf), "%016" PRIx64, fmt_shard_digest(s));
    cJSON_AddStringToObject(o, "digest", buf);
    cJSON *secs = cJSON_AddArrayToObject(o, "sections");
    for (int k = FMT_SECTION_CONFIG; k <= FMT_SECTION_TENSOR_TABLE; k++) {
        const void *d;
        uint64_t n;
        if (fmt_shard_section(s, (enum fmt_section_kind)k, &d, &n) != FMT_ERR_NONE)
            continue;
        cJSON *so = cJSON_CreateObject();
        cJSON_AddStringToObject(so, "kind", fmt_section_name((enum fmt_section_kind)k));
        cJSON_AddNumberToObject(so, "size", (double)n);
        cJSON_AddItemToArray(secs, so);
    }
    cJSON *tok = cJSON_AddArrayToObject(o, "tokenizer_files");
    if (fmt_shard_tokenizer_list(s, tok_json, tok) != FMT_ERR_NONE)
        cJSON_AddBoolToObject(o, "tokenizer_corrupt", 1);
    const char *cfg;
    size_t cl;
    if (fmt_shard_config_json(s, &cfg, &cl) == FMT_ERR_NONE) {
        cJSON *c = cJSON_ParseWithLength(cfg, cl);
        if (c)
            cJSON_AddItemToObject(o, "config", c);
        else
            cJSON_AddNullToObject(o, "config");
    }
    cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
    for (uint32_t i = 0; i < fmt_shard_n_tensors(s); i++) {
        const struct fmt_tensor *t = fmt_shard_tensor(s, i);
        cJSON *to = cJSON_CreateObject();
        cJSON_AddStringToObject(to, "name", t->name);
        cJSON_AddStringToObject(to, "dtype", fmt_dtype_name(t->dtype));
        if (t->layout_known)
            cJSON_AddStringToObject(to, "layout", fmt_layout_name(t->layout));
        else
            cJSON_AddNumberToObject(to, "layout", (double)t->layout);
        cJSON *sh = cJSON_AddArrayToObject(to, "shape");
        for (uint32_t d = 0; d < t->n_dims; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddStringToObject(to, "split", fmt_split_name(t->split));
        cJSON_AddNumberToObject(to, "split_axis", t->split_axis);
        cJSON_AddNumberToObject(to, "offset", (double)t->offset);
        cJSON_AddNumberToObject(to, "size", (double)t->size);
        snprintf(buf, sizeof(buf), "%016" PRIx64, t->xxh3);
        cJSON_AddStringToObject(to, "xxh3", buf);
        cJSON_AddItemToArray(ts, to);
    }
    return o;
}

// --- summary ----------------------------------------------------------------------------------

/* What the file was converted from (config "quant": source_format, source_variant,
 * source_container, zero_point, act_order); nothing for files written before these keys. */
static void print_source_summary(const char *cfg, size_t cl)
{
    cJSON *j = cJSON_ParseWithLength(cfg, cl);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quant");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(q, "source_format");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, "source_variant");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(q, "source_container");
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(q, "zero_point");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(q, "act_order");
    if (cJSON_IsString(v) && cJSON_IsString(k))
        printf("  source: %s checkpoint (layout %s, container %s)%s%s\n",
               cJSON_IsString(f) ? f->valuestring : "awq", v->valuestring, k->valuestring,
               cJSON_IsFalse(z) ? ", symmetric" : "", cJSON_IsTrue(a) ? ", act-order" : "");
    cJSON_Delete(j);
}

static void print_config_summary(const struct fmt_shard *s)
{
    const char *cfg;
    size_t cl;
    struct rt_config c;
    if (fmt_shard_config_json(s, &cfg, &cl) != FMT_ERR_NONE)
        return;
    qs_log_set_quiet(true); /* not a model config (a synthetic file): shown as it is */
    enum rt_err e = rt_config_parse(cfg, cl, fmt_shard_path(s), &c);
    qs_log_set_quiet(false);
    if (e) {
        print_config_line("config:", cfg, cl);
        return;
    }
    printf("  config: %s, %d layers, hidden %d, intermediate %d, %d heads (%d kv, head_dim %d), "
           "vocab %d, max_position_embeddings %d, rope_theta %g, W%dA16 g%d%s%s%s\n",
           c.architecture, c.n_layers, c.hidden_size, c.intermediate_size, c.n_heads,
           c.n_kv_heads, c.head_dim, c.vocab_size, c.max_position_embeddings, c.rope_theta,
           c.w_bit, c.group_size, c.tie_word_embeddings ? ", tied embeddings" : "",
           c.n_experts ? ", MoE" : "", c.attention_bias ? ", qkv bias" : "");
    print_source_summary(cfg, cl);
}

static void tok_file_line(void *ctx, const char *name, uint64_t size)
{
    int *n = ctx;
    printf("%s%s (%" PRIu64 " bytes)", (*n)++ ? ", " : "  tokenizer: ", name, size);
}

/* The embedded tokenizer: its files, and what it loads to. path: the file or directory. */
static void print_tokenizer_summary(const struct fmt_shard *s, const char *path)
{
    static const char *const family[] = {"none", "llama2", "llama3", "chatml", "mistral"};
    int n = 0;
    if (fmt_shard_tokenizer_list(s, tok_file_line, &n) != FMT_ERR_NONE || n == 0) {
        printf("%s", n ? "\n" : "  tokenizer: none (run and logits take --tokens only)\n");
        return;
    }
    struct rt_session_opts so = {.path = path, .model = rt_opts_default(), .tokenizer_only = true};
    struct rt_session *ses = NULL;
    qs_log_set_quiet(true);
    enum rt_err e = rt_session_open(&so, &ses);
    qs_log_set_quiet(false);
    if (e) {
        printf("\n  tokenizer does not load: %s\n", qs_log_last());
        return;
    }
    const struct rt_tok *tok = rt_session_tok(ses);
    size_t n_eos = 0;
    const int32_t *eos = rt_tok_eos_ids(tok, &n_eos);
    const enum rt_chat_family f = rt_chat_detect(tok);
    printf(": %d ids, bos %d, eos %d, chat template %s\n", (int)rt_tok_n_vocab(tok),
           (int)rt_tok_bos_id(tok), n_eos ? (int)eos[0] : -1,
           (unsigned)f < sizeof(family) / sizeof(family[0]) ? family[f] : "?");
    rt_session_close(ses);
}

/* The summary of one model: its rank files sh[n] (rank order), then rank 0's contents. */
static void print_summary(const char *label, const struct fmt_shard *const *sh, int n,
                          const char *path)
{
    const struct fmt_header *h = fmt_shard_header(sh[0]);
    char id[33];
    uint64_t total = 0;
    cli_hex_id(h->model_id, id);
    printf("%s: format %u.%u, model_id %s, world_size %u\n", label, h->version_major,
           h->version_minor, id, h->world_size);
    for (int k = 0; k < n; k++) {
        const struct fmt_header *hk = fmt_shard_header(sh[k]);
        const char *p = fmt_shard_path(sh[k]), *base = strrchr(p, '/');
        total += hk->file_size;
        printf("  rank %u  %-24s %14" PRIu64 " bytes (%.3f GiB), %u tensors\n", hk->tp_rank,
               base ? base + 1 : p, hk->file_size, (double)hk->file_size / (1 << 30),
               fmt_shard_n_tensors(sh[k]));
    }
    if (n > 1)
        printf("  total  %39" PRIu64 " bytes (%.3f GiB)\n", total, (double)total / (1 << 30));
    print_config_summary(sh[0]);
    print_tokenizer_summary(sh[0], path);
    const char *gc;
    size_t gl;
    if (fmt_shard_generation_config_json(sh[0], &gc, &gl) == FMT_ERR_NONE)
        print_config_line("generation config:", gc, gl);
    else
        printf("  generation config: none\n");
    fflush(stdout);
}

// --- files and directories -------------------------------------------------------------------

/* Inspect one file; return the exit code. */
static int inspect_file(const char *path, struct inspect_out *o)
{
    struct fmt_shard *s;
    qs_log_clear();
    enum fmt_err e = fmt_shard_open(path, &s);
    if (e) {
        cli_report_unlogged(e, path);
        return cli_exit_fmt(e);
    }
    if (o->mode == INSPECT_JSON)
        cJSON_AddItemToArray(o->files, shard_json(s));
    else if (o->mode == INSPECT_FULL)
        print_shard(s);
    else
        print_summary(path, (const struct fmt_shard *const *)&s, 1, path);
    fflush(stdout); /* keep the tables in order with errors on stderr */
    fmt_shard_close(s);
    return QS_EXIT_OK;
}

/* A DIR without manifest.json: every *.qshard in it. */
static int inspect_dir_files(const char *dir, struct inspect_out *o)
{
    char **v;
    int n = cli_list_qshard(dir, &v);
    if (n < 0) {
        qs_log_error(__func__, "directory %s: cannot list: %s", dir, strerror(errno));
        return QS_EXIT_IO;
    }
    if (n == 0) {
        qs_log_error(__func__, "directory %s: no %s and no .qshard files", dir, FMT_MANIFEST_NAME);
        return QS_EXIT_BAD_INPUT;
    }
    if (o->mode != INSPECT_JSON)
        printf("%s: no %s; %d .qshard file(s)\n\n", dir, FMT_MANIFEST_NAME, n);
    int rc = QS_EXIT_OK;
    for (int i = 0; i < n; i++)
        rc = cli_worse(rc, inspect_file(v[i], o));
    cli_free_list(v, n);
    return rc;
}

static void print_manifest(const char *dir, const struct fmt_manifest *man)
{
    char id[33];
    cli_hex_id(man->model_id, id);
    printf("%s: manifest: model_id %s, world_size %u\n", dir, id, man->world_size);
    for (uint32_t k = 0; k < man->world_size; k++)
        printf("  rank %u  %-28s %14" PRIu64 " bytes  digest %016" PRIx64 "\n", k,
               man->ranks[k].file, man->ranks[k].size, man->ranks[k].digest);
    printf("\n");
}

static int inspect_dir(const char *dir, struct inspect_out *o)
{
    char *man_path = qs_path_join(dir, FMT_MANIFEST_NAME);
    struct stat st;
    const bool has_man = man_path && stat(man_path, &st) == 0;
    free(man_path);
    if (!has_man)
        return inspect_dir_files(dir, o);
    struct fmt_model *m;
    qs_log_clear();
    enum fmt_err e = fmt_model_open(dir, &m);
    if (e) {
        cli_report_unlogged(e, dir);
        return cli_exit_fmt(e);
    }
    const uint32_t world = fmt_model_world_size(m);
    const struct fmt_shard *sh[64];
    if (o->mode == INSPECT_SUMMARY && world <= 64) {
        for (uint32_t k = 0; k < world; k++)
            sh[k] = fmt_model_shard(m, k);
        print_summary(dir, sh, (int)world, dir);
        fmt_model_close(m);
        return QS_EXIT_OK;
    }
    if (o->mode != INSPECT_JSON)
        print_manifest(dir, fmt_model_manifest(m));
    for (uint32_t k = 0; k < world; k++) {
        if (o->mode == INSPECT_JSON) {
            cJSON_AddItemToArray(o->files, shard_json(fmt_model_shard(m, k)));
        } else {
            print_shard(fmt_model_shard(m, k));
            printf("\n");
            fflush(stdout);
        }
    }
    fmt_model_close(m);
    return QS_EXIT_OK;
}

int cmd_inspect(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_INSPECT, "qshard inspect", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos == 0)
        return cli_usage_error("give at least one FILE or DIR");
    struct inspect_out o = {a.json ? INSPECT_JSON : a.tensor_table ? INSPECT_FULL
                                                                   : INSPECT_SUMMARY, NULL};
    cJSON *root = a.json ? cJSON_CreateObject() : NULL;
    if (root)
        o.files = cJSON_AddArrayToObject(root, "files");
    for (int i = 0; i < a.n_pos; i++)
        rc = cli_worse(rc, cli_is_dir(a.pos[i]) ? inspect_dir(a.pos[i], &o)
                                                : inspect_file(a.pos[i], &o));
    if (root) {
        char *text = cJSON_Print(root);
        if (text)
            printf("%s\n", text);
        free(text);
        cJSON_Delete(root);
    }
    return cli_worse(rc, cli_flush_stdout());
}

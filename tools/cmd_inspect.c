/*
 * cmd_inspect.c - `qshard inspect FILE|DIR... [--json]` and `qshard verify FILE|DIR...`.
 *
 * inspect: open (validate metadata only, O(header)) and print header, sections, tokenizer files,
 *          model config and tensor table, as a table or as JSON (--json). A DIR with a
 *          manifest.json is shown through the manifest (and its ranks are checked against it);
 *          a DIR without one shows every *.qshard file in it.
 * verify:  structure + header/section checksums + every tensor checksum (or only one: --tensor
 *          NAME) + zero padding + tokenizer archive, and for a DIR the manifest: every rank
 *          present, same model, file sizes and metadata digests as recorded. A DIR without a
 *          manifest: every *.qshard in it is verified, then it fails (the set's completeness
 *          cannot be checked). One status line per file (ok/FAILED) and a summary on stdout.
 *
 * Exit codes (docs/DESIGN.md section 2): 0 ok, 1 usage, 4 I/O error. inspect: 2 for any bad or
 * corrupt file. verify: 2 when a file cannot be parsed (format/SPEC.md section 8 structure
 * checks, malformed manifest), 5 when a check fails on a parsed file: any checksum (header,
 * section, tensor), manifest size/digest, padding, tokenizer archive, missing or foreign rank,
 * no manifest. The error itself is reported once, where format/ detects it (qs_log_error);
 * this file prints it only when the library returned an error without logging one.
 *
 * Test: ./build/test_fmt (section 6, "the qshard binary").
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h> /* --json output */

#include "cmd.h"    /* QS_EXIT_* */
#include "fmt.h"    /* fmt_shard_*, fmt_model_*, fmt_manifest_* */
#include "qs_log.h" /* qs_log_error */

/* --- exit codes ---------------------------------------------------------------------------- */

static int exit_open(enum fmt_err e)
{
    switch (e) {
    case FMT_ERR_NONE: return QS_EXIT_OK;
    case FMT_ERR_IO: case FMT_ERR_NOMEM: return QS_EXIT_IO;
    default: return QS_EXIT_BAD_INPUT;
    }
}

/* verify: 5 for a check that fails on a file that parses (every checksum, the manifest's size
 * and digest, padding, tokenizer archive, rank set); 2 for one that does not parse (including a
 * malformed manifest.json: FMT_ERR_MANIFEST); 4 for I/O. */
static int exit_verify(enum fmt_err e)
{
    switch (e) {
    case FMT_ERR_CHECKSUM: case FMT_ERR_META_CHECKSUM: case FMT_ERR_DIGEST:
    case FMT_ERR_PADDING: case FMT_ERR_ZLIB: case FMT_ERR_MISSING_RANK:
    case FMT_ERR_RANK_MISMATCH:
        return QS_EXIT_VERIFY;
    default:
        return exit_open(e);
    }
}

static int worse(int a, int b) { return a > b ? a : b; }

/* A status line on stdout, flushed so that it stays in order with the errors on stderr. */
static void status_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void status_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* `e` came from a format/ call made after qs_log_clear(), which reports its errors itself
 * (DESIGN section 3: once); report here only if it returned an error without a message. */
static void report_unlogged(enum fmt_err e, const char *path)
{
    if (e && !qs_log_last()[0])
        qs_log_error("qshard", "%s: %s", path, fmt_err_str(e));
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void shape_str(const struct fmt_tensor *t, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (uint32_t d = 0; d < t->n_dims && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

static void hex_id(const uint8_t id[16], char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", id[i]);
}

static void free_list(char **v, int n);

/* Files to look at for a DIR without manifest: every *.qshard, sorted. -1 (errno set, *out
 * NULL) if the directory cannot be read or memory runs out: never a partial list. */
static int list_qshard_files(const char *dir, char ***out)
{
    DIR *d = opendir(dir);
    int n = 0, cap = 0;
    char **v = NULL;
    *out = NULL;
    if (!d)
        return -1;
    errno = 0;
    for (struct dirent *e; (e = readdir(d)); errno = 0) {
        size_t l = strlen(e->d_name);
        if (l < 8 || strcmp(e->d_name + l - 7, ".qshard") != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, (size_t)cap * sizeof(*v));
            if (!nv)
                goto fail;
            v = nv;
        }
        size_t pl = strlen(dir) + l + 2;
        if (!(v[n] = malloc(pl)))
            goto fail;
        snprintf(v[n], pl, "%s/%s", dir, e->d_name);
        n++;
    }
    if (errno) /* readdir failed */
        goto fail;
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of files */
        for (int j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
            char *t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    *out = v;
    return n;
fail:;
    int saved = errno ? errno : ENOMEM;
    closedir(d);
    free_list(v, n);
    errno = saved;
    return -1;
}

static void free_list(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* --- inspect ------------------------------------------------------------------------------- */

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
    hex_id(h->model_id, id);
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
    if (fmt_shard_config_json(s, &cfg, &cl) == FMT_ERR_NONE) {
        cJSON *c = cJSON_ParseWithLength(cfg, cl); /* shown on one line */
        char *one = c ? cJSON_PrintUnformatted(c) : NULL;
        const char *txt = one ? one : cfg;
        size_t tl = one ? strlen(one) : cl;
        printf("  config %.*s%s\n", (int)(tl > 600 ? 600 : tl), txt, tl > 600 ? " ..." : "");
        free(one);
        cJSON_Delete(c);
    }
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
    hex_id(h->model_id, id);
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

/* Inspect one file: print it (or add it to files[]), return the exit code. */
static int inspect_file(const char *path, cJSON *files)
{
    struct fmt_shard *s;
    qs_log_clear();
    enum fmt_err e = fmt_shard_open(path, &s);
    if (e) {
        report_unlogged(e, path);
        return exit_open(e);
    }
    if (files)
        cJSON_AddItemToArray(files, shard_json(s));
    else
        print_shard(s);
    fflush(stdout); /* keep the tables in order with errors on stderr */
    fmt_shard_close(s);
    return QS_EXIT_OK;
}

static int inspect_dir(const char *dir, cJSON *files)
{
    struct fmt_model *m;
    struct fmt_manifest *man;
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, FMT_MANIFEST_NAME);
    struct stat st;
    if (stat(path, &st) != 0) {
        char **v;
        int n = list_qshard_files(dir, &v);
        if (n < 0) {
            qs_log_error(__func__, "directory %s: cannot list: %s", dir, strerror(errno));
            return QS_EXIT_IO;
        }
        if (n == 0) {
            qs_log_error(__func__, "directory %s: no %s and no .qshard files", dir,
                         FMT_MANIFEST_NAME);
            return QS_EXIT_BAD_INPUT;
        }
        if (!files)
            printf("%s: no %s; %d .qshard file(s)\n\n", dir, FMT_MANIFEST_NAME, n);
        int rc = QS_EXIT_OK;
        for (int i = 0; i < n; i++)
            rc = worse(rc, inspect_file(v[i], files));
        free_list(v, n);
        return rc;
    }
    qs_log_clear();
    enum fmt_err e = fmt_model_open(dir, &m);
    if (e) {
        report_unlogged(e, dir);
        return exit_open(e);
    }
    man = (struct fmt_manifest *)fmt_model_manifest(m);
    if (!files) {
        char id[33];
        hex_id(man->model_id, id);
        printf("%s: manifest: model_id %s, world_size %u\n", dir, id, man->world_size);
        for (uint32_t k = 0; k < man->world_size; k++)
            printf("  rank %u  %-28s %14" PRIu64 " bytes  digest %016" PRIx64 "\n", k,
                   man->ranks[k].file, man->ranks[k].size, man->ranks[k].digest);
        printf("\n");
    }
    for (uint32_t k = 0; k < fmt_model_world_size(m); k++) {
        if (files) {
            cJSON_AddItemToArray(files, shard_json(fmt_model_shard(m, k)));
        } else {
            print_shard(fmt_model_shard(m, k));
            printf("\n");
            fflush(stdout);
        }
    }
    fmt_model_close(m);
    return QS_EXIT_OK;
}

static void inspect_usage(FILE *f)
{
    fprintf(f, "usage: qshard inspect [--json] FILE|DIR...\n"
               "  Print the header, sections, tokenizer files, model config and tensor table of\n"
               "  .qshard files (a DIR: through its manifest.json, or every *.qshard in it).\n"
               "  Validates the structure only; `qshard verify` checks the data.\n"
               "  --json     one JSON document {\"files\": [...]} on stdout\n"
               "  -h, --help this text\n"
               "exit: 0 ok, 1 usage, 2 bad or corrupt file, 4 I/O error\n");
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'h': inspect_usage(stdout); return QS_EXIT_OK;
        default: inspect_usage(stderr); return QS_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        inspect_usage(stderr);
        return QS_EXIT_USAGE;
    }
    cJSON *root = json ? cJSON_CreateObject() : NULL;
    cJSON *files = json ? cJSON_AddArrayToObject(root, "files") : NULL;
    int rc = QS_EXIT_OK;
    for (int i = optind; i < argc; i++)
        rc = worse(rc, is_dir(argv[i]) ? inspect_dir(argv[i], files) : inspect_file(argv[i], files));
    if (json) {
        char *text = cJSON_Print(root);
        if (text)
            printf("%s\n", text);
        free(text);
        cJSON_Delete(root);
    }
    return rc;
}

/* --- verify -------------------------------------------------------------------------------- */

struct verify_opts {
    bool verbose;       /* progress on stderr */
    const char *tensor; /* --tensor NAME, or NULL: every tensor */
};

/* Counts over one `verify` run, for the summary line. */
struct tally {
    int files, files_bad; /* rank files looked at, and those that failed any check */
    int dirs, dirs_bad;   /* directories, and those whose manifest check failed */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct progress {
    bool on;
    double t0, last;
};

static void progress_fn(void *ctx, uint32_t done, uint32_t n, uint64_t bytes, uint64_t total)
{
    struct progress *p = ctx;
    double t = now_s();
    if (!p->on || (t - p->last < 0.5 && done != n))
        return;
    p->last = t;
    fprintf(stderr, "\r  %u/%u tensors, %.2f/%.2f GiB", done, n, (double)bytes / (1 << 30),
            (double)total / (1 << 30));
    if (done == n)
        fputc('\n', stderr);
}

/* Mark one rank file failed: the error itself was reported where it was detected. */
static int file_failed(struct tally *t, const char *path, enum fmt_err e)
{
    t->files++;
    t->files_bad++;
    status_line("FAILED: %s\n", path);
    return exit_verify(e);
}

/* Verify one open shard (every tensor, or o->tensor); prints its status line; returns the exit
 * code. */
static int verify_shard(const struct fmt_shard *s, const struct verify_opts *o, struct tally *t)
{
    const char *path = fmt_shard_path(s);
    enum fmt_err e;
    double t0 = now_s();
    qs_log_clear();
    if (o->tensor) {
        const struct fmt_tensor *ft = fmt_shard_find(s, o->tensor);
        if (!ft) {
            qs_log_error(__func__, "file %s: no tensor named %s", path, o->tensor);
            file_failed(t, path, FMT_ERR_NOT_FOUND);
            return QS_EXIT_BAD_INPUT;
        }
        if (!(e = fmt_shard_verify_tensor(s, fmt_shard_tensor_index(s, ft)))) {
            t->files++;
            status_line("ok: %s: tensor %s (%" PRIu64 " bytes, xxh3 %016" PRIx64 ")\n", path,
                        o->tensor, ft->size, ft->xxh3);
            return QS_EXIT_OK;
        }
    } else {
        struct progress p = {o->verbose, t0, 0};
        if (!(e = fmt_shard_verify_all(s, progress_fn, &p))) {
            uint64_t bytes = fmt_shard_header(s)->file_size;
            double dt = now_s() - t0, mib = (double)bytes / (1 << 20);
            t->files++;
            status_line("ok: %s: %u tensor%s, %" PRIu64 " bytes (%.1f MiB) in %.3f s, %.0f MiB/s\n",
                        path, fmt_shard_n_tensors(s), fmt_shard_n_tensors(s) == 1 ? "" : "s",
                        bytes, mib, dt, dt > 0 ? mib / dt : 0.0);
            return QS_EXIT_OK;
        }
    }
    report_unlogged(e, path);
    return file_failed(t, path, e);
}

/* Open (structure, header and section checksums) and verify one file. */
static int verify_file(const char *path, const struct verify_opts *o, struct tally *t)
{
    struct fmt_shard *s;
    qs_log_clear();
    enum fmt_err e = fmt_shard_open(path, &s);
    if (e) {
        report_unlogged(e, path);
        return file_failed(t, path, e);
    }
    int rc = verify_shard(s, o, t);
    fmt_shard_close(s);
    return rc;
}

/* A DIR without manifest.json: verify every *.qshard in it, then fail (exit 5): without the
 * manifest nobody can tell whether a rank is missing or belongs to another conversion. */
static int verify_dir_no_manifest(const char *dir, const struct verify_opts *o, struct tally *t)
{
    char **v;
    int n = list_qshard_files(dir, &v);
    t->dirs_bad++;
    if (n < 0) {
        qs_log_error(__func__, "directory %s: cannot list: %s", dir, strerror(errno));
        return QS_EXIT_IO;
    }
    if (n == 0) {
        qs_log_error(__func__, "directory %s: no %s and no .qshard files", dir, FMT_MANIFEST_NAME);
        free_list(v, n);
        return QS_EXIT_BAD_INPUT;
    }
    int rc = QS_EXIT_OK;
    for (int i = 0; i < n; i++)
        rc = worse(rc, verify_file(v[i], o, t));
    free_list(v, n);
    qs_log_error(__func__, "directory %s: no %s: the set cannot be checked for completeness "
                 "(missing ranks, files of another conversion); its %d .qshard file(s) were "
                 "verified one by one. `qshard convert` writes the manifest last", dir,
                 FMT_MANIFEST_NAME, n);
    return worse(rc, QS_EXIT_VERIFY);
}

/* A DIR with manifest.json: every rank against the manifest, then each rank's data. A rank that
 * fails to open does not stop the others from being checked. */
static int verify_dir(const char *dir, const struct verify_opts *o, struct tally *t)
{
    char path[4096];
    struct stat st;
    t->dirs++;
    snprintf(path, sizeof(path), "%s/%s", dir, FMT_MANIFEST_NAME);
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return verify_dir_no_manifest(dir, o, t);
        qs_log_error(__func__, "file %s: %s", path, strerror(errno));
        t->dirs_bad++;
        return QS_EXIT_IO;
    }
    struct fmt_manifest *man;
    qs_log_clear();
    enum fmt_err e = fmt_manifest_load(dir, &man);
    if (e) {
        report_unlogged(e, path);
        t->dirs_bad++;
        status_line("FAILED: %s\n", path);
        return exit_verify(e);
    }
    uint32_t world = man->world_size;
    struct fmt_shard **sh = calloc(world, sizeof(*sh));
    if (!sh) {
        qs_log_error(__func__, "directory %s: out of memory", dir);
        fmt_manifest_free(man);
        t->dirs_bad++;
        return QS_EXIT_IO;
    }
    int rc = QS_EXIT_OK;
    for (uint32_t k = 0; k < world; k++) {
        qs_log_clear();
        if ((e = fmt_manifest_open_rank(dir, k, &sh[k]))) {
            char rp[4096];
            snprintf(rp, sizeof(rp), "%s/%s", dir, man->ranks[k].file);
            report_unlogged(e, rp);
            rc = worse(rc, file_failed(t, rp, e));
        }
    }
    if (rc == QS_EXIT_OK) /* the digest covers [0, meta_size): not the tensor bytes */
        status_line("ok: %s: %s: %u ranks present, same model, file sizes and metadata digests "
                    "match (tensor data: see each file)\n", dir, FMT_MANIFEST_NAME, world);
    for (uint32_t k = 0; k < world; k++) {
        if (sh[k])
            rc = worse(rc, verify_shard(sh[k], o, t));
        fmt_shard_close(sh[k]);
    }
    free(sh);
    fmt_manifest_free(man);
    return rc;
}

static void verify_usage(FILE *f)
{
    fprintf(f,
        "usage: qshard verify [-v] [--tensor NAME] FILE|DIR...\n"
        "  Check the structure, header and section checksums, every tensor checksum (XXH3-64),\n"
        "  zero padding and the tokenizer archive of .qshard files. A DIR must hold a\n"
        "  manifest.json: every rank present, same model_id and world_size, file sizes and\n"
        "  metadata digests as recorded (the digest covers the header, sections and tensor\n"
        "  table with every tensor hash, not the tensor bytes: those are checked per file).\n"
        "  A DIR without manifest.json: every *.qshard in it is verified, then verify fails\n"
        "  (exit 5) because the set cannot be checked for completeness.\n"
        "  Prints one line per file (ok/FAILED; the error itself is on stderr) and a summary.\n"
        "  -t, --tensor NAME  check only this tensor's checksum (and the structure)\n"
        "  -v, --verbose  progress on stderr\n"
        "  -h, --help     this text\n"
        "exit (the worst over all inputs):\n"
        "  0 ok\n"
        "  1 usage\n"
        "  2 a file cannot be parsed: bad magic, version or header field, truncated, offset,\n"
        "    size or shape out of range, malformed manifest.json, --tensor NAME not in a file\n"
        "  4 I/O error (missing or unreadable path)\n"
        "  5 verification failed: a checksum does not match (header, section, tensor), the\n"
        "    manifest's size or digest does not match, non-zero padding, corrupt tokenizer\n"
        "    archive, a rank missing or of another conversion, or no manifest.json\n"
        "  A file fails at the first check in format/SPEC.md section 8 order, so a flipped\n"
        "  byte in an offset field can give 2 where one in the data gives 5.\n");
}

int cmd_verify(int argc, char **argv)
{
    static const struct option opts[] = {{"verbose", no_argument, NULL, 'v'},
                                          {"tensor", required_argument, NULL, 't'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    struct verify_opts o = {false, NULL};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "vt:h", opts, NULL)) != -1) {
        switch (c) {
        case 'v': o.verbose = true; break;
        case 't': o.tensor = optarg; break;
        case 'h': verify_usage(stdout); return QS_EXIT_OK;
        default: verify_usage(stderr); return QS_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        verify_usage(stderr);
        return QS_EXIT_USAGE;
    }
    struct tally t = {0, 0, 0, 0};
    int rc = QS_EXIT_OK;
    for (int i = optind; i < argc; i++)
        rc = worse(rc, is_dir(argv[i]) ? verify_dir(argv[i], &o, &t)
                                        : verify_file(argv[i], &o, &t));
    const char *fs = t.files == 1 ? "" : "s";
    if (rc == QS_EXIT_OK) {
        status_line("ok: all %d file%s verified (structure + %s%s%s)%s\n", t.files, fs,
                    o.tensor ? "checksum of tensor " : "every tensor checksum",
                    o.tensor ? o.tensor : "", o.tensor ? "" : ", padding, tokenizer archive",
                    t.dirs ? "; every manifest matches" : "");
    } else if (t.dirs_bad) {
        char files[96];
        if (t.files_bad)
            snprintf(files, sizeof(files), "%d of %d file%s failed", t.files_bad, t.files, fs);
        else if (!t.files)
            snprintf(files, sizeof(files), "no rank file checked");
        else
            snprintf(files, sizeof(files), "all %d file%s passed", t.files, fs);
        status_line("FAILED: %s; %d of %d director%s without a usable %s (the set is not "
                    "checked for completeness)\n", files, t.dirs_bad, t.dirs,
                    t.dirs == 1 ? "y" : "ies", FMT_MANIFEST_NAME);
    } else {
        status_line("FAILED: %d of %d file%s\n", t.files_bad, t.files, fs);
    }
    return rc;
}

/*
 * cvt_source.c - open a HuggingFace AWQ model directory: find and validate the weight files
 * (index + shards, single file, torch .bin/.pt), build the tensor catalog, read the configs and
 * tokenizer files; serve tensor reads from read-only mappings.
 *
 * Entry points: cvt_source_open/close and the getters and readers of cvt_src.h, cvt_err_str(),
 * cvt_err_exit_code(), cvt_container_str().
 *
 * Decisions (docs/FORMATS.md P08/P09/P17/P19/P21, issue 4 "Bad input"):
 *   - Which weights: `model.safetensors.index.json` (sharded) > `model.safetensors` > the only
 *     `*.safetensors` > `pytorch_model.bin.index.json` > `pytorch_model.bin` > the only `*.bin`
 *     (not training_args.bin) > the only `*.pt`. Safetensors win over torch files when both exist
 *     (info message). Two candidates of the same rank (e.g. two unindexed .safetensors) are an
 *     error: we never guess which one is meant.
 *   - Index: every shard it names must exist; every tensor it lists must be in exactly that shard;
 *     every tensor of a shard must be listed; a weight file of the same kind in the directory
 *     that the index does not name is an ERROR (CVT_ERR_INDEX), not a warning: it signals a mixed
 *     or half-updated download. Shard names must be plain file names (no '/', no leading '.').
 *   - A tensor name may occur once in the whole checkpoint.
 *   - quantized checkpoints only: `.qweight` (AWQ, GPTQ) or `.weight_packed` (compressed-tensors)
 *     tensors need a quant config and vice versa.
 *   - Tokenizer files are optional (warning when none); JSON ones must parse.
 *
 * Reads are memcpy from the mapping followed by madvise(MADV_DONTNEED) on the pages read, so RSS
 * does not grow with the checkpoint size (issue 4: peak RSS <= 512 MiB for any model).
 *
 * Tested by tests/test_cvt_src.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>   /* index and tokenizer JSON */
#include <xxhash.h>        /* XXH3_64bits: catalog hash */

#include "cvt_src_int.h"
#include "qs_log.h"        /* qs_log_error, qs_log_warn, qs_log_info */
#include "qs_util.h"       /* qs_path_join */

#define MAX_CONFIG_FILE (16u << 20)
#define MAX_TOKEN_FILE  (64u << 20)
#define MAX_INDEX_FILE  (64u << 20)
#define MAX_WEIGHT_FILES 100000u
#define MAX_SHARDS       4096u

/* --- errors -------------------------------------------------------------------------------- */

const char *cvt_err_str(enum cvt_err e)
{
    switch (e) {
#define CVT_ERR_CASE_(name, value, desc) case name: return #name ": " desc;
        CVT_ERR_LIST(CVT_ERR_CASE_)
#undef CVT_ERR_CASE_
    }
    return "CVT_ERR_?: unknown";
}

int cvt_err_exit_code(enum cvt_err e)
{
    switch (e) {
    case CVT_ERR_NONE: return 0;
    case CVT_ERR_ARG: return 1;
    case CVT_ERR_NOMEM: return 3;
    case CVT_ERR_IO: return 4;
    default: return 2;
    }
}

const char *cvt_container_str(enum cvt_container c)
{
    switch (c) {
    case CVT_CONTAINER_SAFETENSORS: return "safetensors";
    case CVT_CONTAINER_SAFETENSORS_SHARDED: return "safetensors-sharded";
    case CVT_CONTAINER_TORCH_BIN: return "torch-bin";
    case CVT_CONTAINER_TORCH_PT: return "torch-pt";
    }
    return "?";
}

/* --- the source object ------------------------------------------------------------------------ */

struct src_map {
    const uint8_t *map;   /* PROT_READ mapping of the whole file, NULL when size 0 */
    uint64_t       size;
};

static const char *const tokenizer_names[] = {
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json",
};
#define N_TOK (sizeof tokenizer_names / sizeof tokenizer_names[0])

struct cvt_source {
    char                  *dir;
    struct cvt_hf_config   cfg;
    enum cvt_container     container;
    struct cvt_src_file   *files;     /* [n_files], path owned */
    struct src_map        *maps;      /* [n_files] */
    size_t                 n_files, cap_files;
    struct cvt_src_tensor *t;         /* catalog, names owned */
    size_t                 n, cap;
    uint32_t              *hash;      /* open addressing: catalog index + 1, 0 = empty */
    size_t                 hash_mask;
    struct cvt_src_blob    tok[N_TOK];
    size_t                 n_tok;
    uint64_t               total;
    long                   page;
};

void cvt_source_close(struct cvt_source *src)
{
    if (!src)
        return;
    for (size_t i = 0; i < src->n_files; i++) {
        if (src->maps[i].map)
            munmap((void *)src->maps[i].map, (size_t)src->maps[i].size);
        free((char *)src->files[i].path);
    }
    free(src->files);
    free(src->maps);
    for (size_t i = 0; i < src->n; i++)
        free((char *)src->t[i].name);
    free(src->t);
    free(src->hash);
    for (size_t i = 0; i < src->n_tok; i++)
        free((void *)src->tok[i].data);
    cvt_config_free(&src->cfg);
    free(src->dir);
    free(src);
}

/* --- small helpers ----------------------------------------------------------------------------- */

static bool file_exists(const char *dir, const char *name)
{
    char *p = qs_path_join(dir, name);
    struct stat st;
    bool ok = p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
    free(p);
    return ok;
}

/* Read dir/name whole (NUL-terminated) if it exists. *data NULL when absent. */
static enum cvt_err read_small(const char *dir, const char *name, size_t max, char **data, size_t *size)
{
    *data = NULL;
    *size = 0;
    char *p = qs_path_join(dir, name);
    if (!p) {
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block */
    if (fd < 0) {
        enum cvt_err e = CVT_ERR_NONE;
        if (errno != ENOENT) {
            qs_log_error(__func__, "cannot open %s: %s", p, strerror(errno));
            e = CVT_ERR_IO;
        }
        free(p);
        return e;
    }
    struct stat st;
    enum cvt_err err = CVT_ERR_IO;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        qs_log_error(__func__, "%s: not a regular file", p);
        goto out;
    }
    if ((uint64_t)st.st_size > max) {
        qs_log_error(__func__, "%s: %lld bytes exceeds the %zu-byte limit for this file", p,
                     (long long)st.st_size, max);
        err = CVT_ERR_CONFIG;
        goto out;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        qs_log_error(__func__, "%s: out of memory", p);
        err = CVT_ERR_NOMEM;
        goto out;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            qs_log_error(__func__, "%s: read failed: %s", p, r < 0 ? strerror(errno) : "short file");
            free(buf);
            goto out;
        }
        got += (size_t)r;
    }
    buf[got] = 0;
    *data = buf;
    *size = got;
    err = CVT_ERR_NONE;
out:
    close(fd);
    free(p);
    return err;
}

/* Map dir/name and register it as weight file; *idx = its index. */
static enum cvt_err add_file(struct cvt_source *src, const char *name, size_t *idx)
{
    if (src->n_files >= MAX_WEIGHT_FILES) {
        qs_log_error(__func__, "%s: more than %u weight files", src->dir, MAX_WEIGHT_FILES);
        return CVT_ERR_INDEX;
    }
    if (!cvt_grow((void **)&src->files, &src->cap_files, src->n_files + 1, sizeof *src->files)) {
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    struct src_map *m = realloc(src->maps, src->cap_files * sizeof *m); /* lockstep with files */
    if (!m) {
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    src->maps = m;
    char *p = qs_path_join(src->dir, name);
    if (!p) {
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block */
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        qs_log_error(__func__, "cannot open weight file %s: %s", p, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        free(p);
        return CVT_ERR_IO;
    }
    const uint8_t *map = NULL;
    if (st.st_size > 0) {
        void *mm = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mm == MAP_FAILED) {
            qs_log_error(__func__, "cannot map %s (%lld bytes): %s", p, (long long)st.st_size, strerror(errno));
            close(fd);
            free(p);
            return CVT_ERR_IO;
        }
        map = mm;
    }
    close(fd);
    struct cvt_src_file *f = &src->files[src->n_files];
    f->path = p;
    f->name = p + strlen(src->dir) + 1;
    f->size = (uint64_t)st.st_size;
    src->maps[src->n_files].map = map;
    src->maps[src->n_files].size = (uint64_t)st.st_size;
    *idx = src->n_files++;
    src->total += (uint64_t)st.st_size;
    return CVT_ERR_NONE;
}

static int cmp_offset(const void *a, const void *b)
{
    const struct cvt_src_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

/* Parse weight file `name` and append its tensors to the catalog. */
static enum cvt_err load_weight_file(struct cvt_source *src, const char *name, bool torch)
{
    size_t fi;
    CVT_TRY(add_file(src, name, &fi));
    const struct src_map *m = &src->maps[fi];
    struct cvt_tensor_list l = {0, NULL};
    static const uint8_t empty[8];
    const uint8_t *buf = m->map ? m->map : empty;
    enum cvt_err err = torch ? cvt_torchzip_parse(src->files[fi].path, buf, m->size, &l)
                             : cvt_safetensors_parse(src->files[fi].path, buf, (size_t)m->size, m->size, &l);
    if (err)
        return err;
    if (torch && l.n > 1)
        qsort(l.t, l.n, sizeof *l.t, cmp_offset);
    if (!cvt_grow((void **)&src->t, &src->cap, src->n + l.n, sizeof *src->t)) {
        cvt_tensor_list_free(&l);
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    for (size_t i = 0; i < l.n; i++) {
        l.t[i].file = (uint32_t)fi;
        src->t[src->n++] = l.t[i]; /* name ownership moves */
    }
    free(l.t);
    return CVT_ERR_NONE;
}

static uint64_t name_hash(const char *s)
{
    return XXH3_64bits(s, strlen(s));
}

/* Build the hash; a name seen twice across files is an error. */
static enum cvt_err build_hash(struct cvt_source *src)
{
    size_t cap = 16;
    while (cap < 2 * src->n + 1)
        cap *= 2;
    src->hash = calloc(cap, sizeof *src->hash);
    if (!src->hash) {
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    src->hash_mask = cap - 1;
    for (size_t i = 0; i < src->n; i++) {
        size_t h = (size_t)name_hash(src->t[i].name) & src->hash_mask;
        while (src->hash[h]) {
            const struct cvt_src_tensor *o = &src->t[src->hash[h] - 1];
            if (strcmp(o->name, src->t[i].name) == 0) {
                qs_log_error(__func__, "%s: tensor %s is stored twice (in %s and %s)", src->dir, o->name,
                             src->files[o->file].name, src->files[src->t[i].file].name);
                return CVT_ERR_INDEX;
            }
            h = (h + 1) & src->hash_mask;
        }
        src->hash[h] = (uint32_t)(i + 1);
    }
    return CVT_ERR_NONE;
}

const struct cvt_src_tensor *cvt_source_find(const struct cvt_source *src, const char *name)
{
    if (!src->hash)
        return NULL;
    size_t h = (size_t)name_hash(name) & src->hash_mask;
    while (src->hash[h]) {
        const struct cvt_src_tensor *t = &src->t[src->hash[h] - 1];
        if (strcmp(t->name, name) == 0)
            return t;
        h = (h + 1) & src->hash_mask;
    }
    return NULL;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int cmp_name_ptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Names of regular files in dir ending in `suffix` (sorted). */
static enum cvt_err list_dir(const char *dir, const char *suffix, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    size_t cap = 0;
    DIR *d = opendir(dir);
    if (!d) {
        qs_log_error(__func__, "cannot list %s: %s", dir, strerror(errno));
        return CVT_ERR_IO;
    }
    struct dirent *e;
    enum cvt_err err = CVT_ERR_NONE;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, suffix) || !file_exists(dir, e->d_name))
            continue;
        char *c = strdup(e->d_name);
        if (!c || !cvt_grow((void **)names, &cap, *n + 1, sizeof **names)) {
            free(c);
            qs_log_error(__func__, "out of memory");
            err = CVT_ERR_NOMEM;
            break;
        }
        (*names)[(*n)++] = c;
    }
    closedir(d);
    if (!err && *n > 1)
        qsort(*names, *n, sizeof **names, cmp_name_ptr);
    return err;
}

/* A shard name from an index must be a plain file name inside the directory. */
static bool plain_name(const char *s)
{
    return s[0] && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\') && strlen(s) < 256;
}

void cvt_index_free(struct cvt_index *idx)
{
    cJSON_Delete(idx->root);
    free(idx->shards);
    memset(idx, 0, sizeof *idx);
}

enum cvt_err cvt_index_parse(const char *where, const char *index_name, const char *text, size_t size,
                             const char *suffix, struct cvt_index *idx)
{
    size_t cap = 0;
    memset(idx, 0, sizeof *idx);
    const char *end = NULL;
    idx->root = cJSON_ParseWithLengthOpts(text, size, &end, false);
    if (!idx->root || !cJSON_IsObject(idx->root)) {
        qs_log_error(__func__, "%s/%s: not a JSON object (parse error near byte %zu)", where, index_name,
                     end ? (size_t)(end - text) : (size_t)0);
        cvt_index_free(idx);
        return CVT_ERR_JSON;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx->root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        qs_log_error(__func__, "%s/%s: \"weight_map\" missing, empty or not an object", where, index_name);
        goto out_err;
    }
    idx->weight_map = wm;
    for (const cJSON *e = wm->child; e; e = e->next) {
        char pb[96], pn[96];
        if (!cJSON_IsString(e) || !plain_name(e->valuestring) || !ends_with(e->valuestring, suffix)) {
            qs_log_error(__func__, "%s/%s: tensor %s: shard name must be a plain file name ending in %s, got %s",
                         where, index_name, cvt_printable(e->string, strlen(e->string), pn, sizeof pn), suffix,
                         cJSON_IsString(e) ? cvt_printable(e->valuestring, strlen(e->valuestring), pb, sizeof pb)
                                           : "a non-string");
            goto out_err;
        }
        if (!e->string[0] || !cvt_utf8_valid((const uint8_t *)e->string, strlen(e->string))) {
            qs_log_error(__func__, "%s/%s: a tensor name is empty or not valid UTF-8", where, index_name);
            goto out_err;
        }
        bool dup = false; /* entries come grouped by shard: search the newest first */
        for (size_t i = idx->n_shards; i-- > 0 && !dup;)
            dup = strcmp(idx->shards[i], e->valuestring) == 0;
        if (dup)
            continue;
        if (idx->n_shards >= MAX_SHARDS) {
            qs_log_error(__func__, "%s/%s: more than %u shards", where, index_name, MAX_SHARDS);
            goto out_err;
        }
        if (!cvt_grow((void **)&idx->shards, &cap, idx->n_shards + 1, sizeof *idx->shards)) {
            qs_log_error(__func__, "out of memory");
            cvt_index_free(idx);
            return CVT_ERR_NOMEM;
        }
        idx->shards[idx->n_shards++] = e->valuestring; /* borrowed from the tree */
    }
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(idx->root, "metadata");
    const cJSON *ts = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, "total_size") : NULL;
    if (cJSON_IsNumber(ts)) {
        idx->has_total = true;
        idx->total_size = ts->valuedouble;
    }
    return CVT_ERR_NONE;
out_err:
    cvt_index_free(idx);
    return CVT_ERR_INDEX;
}

/*
 * Sharded checkpoint: parse `index_name`, load every shard it names, then check the weight map
 * against the catalog both ways and look for unnamed shards in the directory.
 */
static enum cvt_err load_indexed(struct cvt_source *src, const char *index_name, bool torch)
{
    char *text = NULL, **dir_names = NULL;
    size_t size = 0, n_dir = 0;
    struct cvt_index idx = {0};
    bool *seen = NULL;
    enum cvt_err err;
    const char *suffix = torch ? ".bin" : ".safetensors";

    if ((err = read_small(src->dir, index_name, MAX_INDEX_FILE, &text, &size)))
        return err;
    if ((err = cvt_index_parse(src->dir, index_name, text, size, suffix, &idx)))
        goto out;
    err = CVT_ERR_INDEX;
    for (size_t i = 0; i < idx.n_shards; i++)
        if (!file_exists(src->dir, idx.shards[i])) {
            qs_log_error(__func__, "%s/%s names shard %s, which is missing from the directory (incomplete download?)",
                         src->dir, index_name, idx.shards[i]);
            goto out;
        }
    /* Weight files of the same kind the index does not name. */
    if ((err = list_dir(src->dir, suffix, &dir_names, &n_dir)))
        goto out;
    err = CVT_ERR_INDEX;
    for (size_t i = 0; i < n_dir; i++) {
        if (torch && strncmp(dir_names[i], "pytorch_model", 13) != 0)
            continue; /* training_args.bin and friends are not weights */
        bool named = false;
        for (size_t k = 0; k < idx.n_shards && !named; k++)
            named = strcmp(dir_names[i], idx.shards[k]) == 0;
        if (!named) {
            qs_log_error(__func__, "%s: weight file %s is not named by %s (stale or mixed download?): remove it or fix the index",
                         src->dir, dir_names[i], index_name);
            goto out;
        }
    }
    for (size_t i = 0; i < idx.n_shards; i++)
        if ((err = load_weight_file(src, idx.shards[i], torch)))
            goto out;
    if ((err = build_hash(src)))
        goto out;
    err = CVT_ERR_INDEX;
    /* Both directions: listed -> present in that shard; present -> listed once. */
    seen = calloc(src->n ? src->n : 1, sizeof *seen);
    if (!seen) {
        qs_log_error(__func__, "out of memory");
        err = CVT_ERR_NOMEM;
        goto out;
    }
    for (const cJSON *e = idx.weight_map->child; e; e = e->next) {
        const struct cvt_src_tensor *t = cvt_source_find(src, e->string);
        if (!t) {
            qs_log_error(__func__, "%s/%s lists tensor %s in %s, but no shard contains it", src->dir, index_name,
                         e->string, e->valuestring);
            goto out;
        }
        if (strcmp(src->files[t->file].name, e->valuestring) != 0) {
            qs_log_error(__func__, "%s/%s lists tensor %s in %s, but it is in %s", src->dir, index_name, e->string,
                         e->valuestring, src->files[t->file].name);
            goto out;
        }
        size_t i = (size_t)(t - src->t);
        if (seen[i]) {
            qs_log_error(__func__, "%s/%s lists tensor %s twice", src->dir, index_name, e->string);
            goto out;
        }
        seen[i] = true;
    }
    for (size_t i = 0; i < src->n; i++)
        if (!seen[i]) {
            qs_log_error(__func__, "%s: tensor %s in %s is not listed in %s", src->dir, src->t[i].name,
                         src->files[src->t[i].file].name, index_name);
            goto out;
        }
    /* metadata.total_size: advisory (writers disagree on what it counts). */
    if (idx.has_total) {
        uint64_t sum = 0;
        for (size_t i = 0; i < src->n; i++)
            sum += src->t[i].nbytes;
        if ((double)sum != idx.total_size)
            qs_log_warn("%s/%s: metadata.total_size %.0f differs from the %llu bytes of tensor data found",
                        src->dir, index_name, idx.total_size, (unsigned long long)sum);
    }
    err = CVT_ERR_NONE;
out:
    free(seen);
    cvt_index_free(&idx);
    free_names(dir_names, n_dir);
    free(text);
    return err;
}

/* Remove trainer side files (not weights) from a name list; returns the new count. */
static size_t drop_training_files(char **names, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(names[i], "training_args", 13) == 0 || strncmp(names[i], "optimizer", 9) == 0 ||
            strncmp(names[i], "scheduler", 9) == 0 || strncmp(names[i], "rng_state", 9) == 0) {
            free(names[i]);
            continue;
        }
        names[w++] = names[i];
    }
    return w;
}

/* Pick the weight files (see the top comment) and load them into the catalog. */
static enum cvt_err load_weights(struct cvt_source *src)
{
    char **st = NULL, **bins = NULL, **pts = NULL;
    size_t n_st = 0, n_bin = 0, n_pt = 0;
    enum cvt_err err;
    if ((err = list_dir(src->dir, ".safetensors", &st, &n_st)) || (err = list_dir(src->dir, ".bin", &bins, &n_bin)) ||
        (err = list_dir(src->dir, ".pt", &pts, &n_pt)))
        goto out;
    /* training_args.bin, optimizer.pt etc. are not weights. */
    n_bin = drop_training_files(bins, n_bin);
    n_pt = drop_training_files(pts, n_pt);
    bool st_index = file_exists(src->dir, "model.safetensors.index.json");
    bool bin_index = file_exists(src->dir, "pytorch_model.bin.index.json");
    if ((st_index || n_st) && (bin_index || n_bin || n_pt))
        qs_log_info("%s: both safetensors and torch weight files present; using the safetensors", src->dir);
    err = CVT_ERR_INDEX;
    if (st_index) {
        if (file_exists(src->dir, "model.safetensors")) {
            qs_log_error(__func__, "%s: both model.safetensors and model.safetensors.index.json exist: remove the stale one",
                         src->dir);
            goto out;
        }
        src->container = CVT_CONTAINER_SAFETENSORS_SHARDED;
        err = load_indexed(src, "model.safetensors.index.json", false);
    } else if (n_st) {
        if (n_st > 1) {
            qs_log_error(__func__, "%s: %zu .safetensors files (%s, %s, ...) but no model.safetensors.index.json",
                         src->dir, n_st, st[0], st[1]);
            goto out;
        }
        src->container = CVT_CONTAINER_SAFETENSORS;
        if (!(err = load_weight_file(src, st[0], false)))
            err = build_hash(src);
    } else if (bin_index) {
        src->container = CVT_CONTAINER_TORCH_BIN;
        err = load_indexed(src, "pytorch_model.bin.index.json", true);
    } else if (n_bin || n_pt) {
        if (n_bin + n_pt > 1) {
            qs_log_error(__func__, "%s: %zu .bin/.pt weight files but no pytorch_model.bin.index.json", src->dir,
                         n_bin + n_pt);
            goto out;
        }
        src->container = n_bin ? CVT_CONTAINER_TORCH_BIN : CVT_CONTAINER_TORCH_PT;
        if (!(err = load_weight_file(src, n_bin ? bins[0] : pts[0], true)))
            err = build_hash(src);
    } else {
        qs_log_error(__func__, "%s: no weights (model.safetensors, *.safetensors + index, pytorch_model.bin, *.pt)",
                     src->dir);
        err = CVT_ERR_MISSING_TENSOR;
    }
out:
    free_names(st, n_st);
    free_names(bins, n_bin);
    free_names(pts, n_pt);
    return err;
}

static enum cvt_err load_tokenizer(struct cvt_source *src)
{
    for (size_t i = 0; i < N_TOK; i++) {
        char *data;
        size_t size;
        CVT_TRY(read_small(src->dir, tokenizer_names[i], MAX_TOKEN_FILE, &data, &size));
        if (!data)
            continue;
        if (ends_with(tokenizer_names[i], ".json")) {
            cJSON *j = cJSON_ParseWithLength(data, size);
            bool ok = j && (cJSON_IsObject(j) || cJSON_IsArray(j));
            cJSON_Delete(j);
            if (!ok) {
                qs_log_error(__func__, "%s/%s: not valid JSON", src->dir, tokenizer_names[i]);
                free(data);
                return CVT_ERR_JSON;
            }
        }
        src->tok[src->n_tok].name = tokenizer_names[i];
        src->tok[src->n_tok].data = (const uint8_t *)data;
        src->tok[src->n_tok].size = size;
        src->n_tok++;
    }
    if (!src->n_tok)
        qs_log_warn("%s: no tokenizer files (tokenizer.json / tokenizer.model): the runtime will take token ids only",
                    src->dir);
    return CVT_ERR_NONE;
}

/* AWQ checkpoint sanity: quantized tensors and a quant config go together (docs/FORMATS.md P20, P21 e). */
static enum cvt_err check_quantized(const struct cvt_source *src)
{
    const char *q = NULL;
    for (size_t i = 0; i < src->n && !q; i++)
        if (ends_with(src->t[i].name, ".qweight") || ends_with(src->t[i].name, ".weight_packed"))
            q = src->t[i].name;
    if (q && src->cfg.quant.from == CVT_QCFG_NONE) {
        qs_log_error(__func__, "%s: tensor %s is quantized but there is no quant config (config.json quantization_config, quant_config.json or quantize_config.json): add one naming w_bit, group size and version",
                     src->dir, q);
        return CVT_ERR_CONFIG;
    }
    if (!q) {
        qs_log_error(__func__, "%s: no quantized tensors (.qweight, .weight_packed): not a W4A16 checkpoint%s", src->dir,
                     src->cfg.quant.from != CVT_QCFG_NONE ? " (although the config declares one)" : "");
        return src->cfg.quant.from != CVT_QCFG_NONE ? CVT_ERR_CONFIG : CVT_ERR_UNSUPPORTED;
    }
    return CVT_ERR_NONE;
}

enum cvt_err cvt_source_open(const char *dir, struct cvt_source **out)
{
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0) {
        qs_log_error(__func__, "cannot open model directory %s: %s", dir, strerror(errno));
        return CVT_ERR_IO;
    }
    if (!S_ISDIR(st.st_mode)) {
        qs_log_error(__func__, "%s is not a directory (pass the model directory)", dir);
        return CVT_ERR_IO;
    }
    struct cvt_source *src = calloc(1, sizeof *src);
    if (!src || !(src->dir = strdup(dir))) {
        free(src);
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    size_t dl = strlen(src->dir);
    while (dl > 1 && src->dir[dl - 1] == '/')
        src->dir[--dl] = 0;
    src->page = sysconf(_SC_PAGESIZE);
    if (src->page <= 0)
        src->page = 4096;

    enum cvt_err err;
    char *cj = NULL, *qj = NULL, *zj = NULL, *gj = NULL;
    size_t cs = 0, qs = 0, zs = 0, gs = 0;
    if ((err = read_small(src->dir, "config.json", MAX_CONFIG_FILE, &cj, &cs)) ||
        (err = read_small(src->dir, "quant_config.json", MAX_CONFIG_FILE, &qj, &qs)) ||
        (err = read_small(src->dir, "quantize_config.json", MAX_CONFIG_FILE, &zj, &zs)) ||
        (err = read_small(src->dir, "generation_config.json", MAX_CONFIG_FILE, &gj, &gs)))
        goto out_cfg;
    if (!cj) {
        qs_log_error(__func__, "%s: config.json is missing", src->dir);
        err = CVT_ERR_CONFIG;
        goto out_cfg;
    }
    err = cvt_config_parse(src->dir, cj, cs, qj, qs, zj, zs, gj, gs, &src->cfg);
out_cfg:
    free(cj);
    free(qj);
    free(zj);
    free(gj);
    if (err || (err = load_weights(src)) || (err = check_quantized(src)) || (err = load_tokenizer(src))) {
        cvt_source_close(src);
        return err;
    }
    *out = src;
    return CVT_ERR_NONE;
}

/* --- getters ----------------------------------------------------------------------------------- */

const struct cvt_hf_config *cvt_source_config(const struct cvt_source *src) { return &src->cfg; }
enum cvt_container cvt_source_container(const struct cvt_source *src) { return src->container; }
const char *cvt_source_dir(const struct cvt_source *src) { return src->dir; }
uint64_t cvt_source_total_bytes(const struct cvt_source *src) { return src->total; }
size_t cvt_source_n_files(const struct cvt_source *src) { return src->n_files; }
size_t cvt_source_n_tensors(const struct cvt_source *src) { return src->n; }
size_t cvt_source_n_tokenizer_files(const struct cvt_source *src) { return src->n_tok; }

const struct cvt_src_file *cvt_source_file(const struct cvt_source *src, size_t i)
{
    return i < src->n_files ? &src->files[i] : NULL;
}

const struct cvt_src_tensor *cvt_source_tensor(const struct cvt_source *src, size_t i)
{
    return i < src->n ? &src->t[i] : NULL;
}

const struct cvt_src_blob *cvt_source_tokenizer_file(const struct cvt_source *src, size_t i)
{
    return i < src->n_tok ? &src->tok[i] : NULL;
}

/* --- reads --------------------------------------------------------------------------------------- */

const void *cvt_source_data(const struct cvt_source *src, const struct cvt_src_tensor *t)
{
    if (!t->contiguous || t->file >= src->n_files || !src->maps[t->file].map)
        return NULL;
    return src->maps[t->file].map + t->offset;
}

/* Fault-around (Linux mm/memory.c do_fault_around, fault_around_bytes default 64 KiB): a read
 * fault maps the page-cache pages of the whole aligned 64 KiB window around it, so reading the
 * first row of a block maps again up to 60 KiB of rows released before it. A whole-range
 * release also drops that much on either side (measured: 7B tp 1 peak RssFile grew to ~180 MiB
 * without it, one window per released block). */
#define CVT_FAULT_AROUND_BYTES (64u << 10)

/* Drop the pages of [off, off + n) of file f from this process (advisory). `inner`: only pages
 * entirely inside the range (after a partial read: the edge pages are likely read next);
 * otherwise every page the range touches plus CVT_FAULT_AROUND_BYTES either side. */
static void release_pages(const struct cvt_source *src, uint32_t f, uint64_t off, uint64_t n, bool inner)
{
    if (!n || f >= src->n_files || !src->maps[f].map)
        return;
    uint64_t pg = (uint64_t)src->page;
    if (!inner) {
        uint64_t lo = off > CVT_FAULT_AROUND_BYTES ? off - CVT_FAULT_AROUND_BYTES : 0;
        n += (off - lo) + CVT_FAULT_AROUND_BYTES;
        off = lo;
    }
    uint64_t a = inner ? (off + pg - 1) / pg * pg : off / pg * pg;
    uint64_t b = inner ? (off + n) / pg * pg : (off + n + pg - 1) / pg * pg;
    if (b > src->maps[f].size)
        b = src->maps[f].size; /* madvise accepts a partial last page */
    if (b > a)
        madvise((void *)(src->maps[f].map + a), (size_t)(b - a), MADV_DONTNEED);
}

void cvt_source_release(const struct cvt_source *src, const struct cvt_src_tensor *t)
{
    release_pages(src, t->file, t->offset, t->nbytes, false);
}

void cvt_source_release_range(const struct cvt_source *src, const struct cvt_src_tensor *t,
                              uint64_t byte_off, uint64_t nbytes)
{
    if (byte_off >= t->nbytes)
        return;
    if (nbytes > t->nbytes - byte_off)
        nbytes = t->nbytes - byte_off;
    release_pages(src, t->file, t->offset + byte_off, nbytes, false);
}

static void release_range(const struct cvt_source *src, uint32_t f, uint64_t off, uint64_t n)
{
    release_pages(src, f, off, n, true);
}

static enum cvt_err check_readable(const struct cvt_source *src, const struct cvt_src_tensor *t, const char *fn)
{
    if (!t->contiguous) {
        qs_log_error(fn, "file %s: tensor %s is a non-contiguous view: not supported", src->files[t->file].name,
                     t->name);
        return CVT_ERR_SHAPE;
    }
    if (t->nbytes && (t->file >= src->n_files || !src->maps[t->file].map ||
                      t->offset > src->maps[t->file].size || t->nbytes > src->maps[t->file].size - t->offset)) {
        qs_log_error(fn, "tensor %s: data outside its file", t->name);
        return CVT_ERR_ARG;
    }
    return CVT_ERR_NONE;
}

enum cvt_err cvt_source_read_range(const struct cvt_source *src, const struct cvt_src_tensor *t,
                                   uint64_t byte_off, uint64_t nbytes, void *dst)
{
    CVT_TRY(check_readable(src, t, __func__));
    if (byte_off > t->nbytes || nbytes > t->nbytes - byte_off) {
        qs_log_error(__func__, "tensor %s: byte range [%llu, +%llu) outside its %llu bytes", t->name,
                     (unsigned long long)byte_off, (unsigned long long)nbytes, (unsigned long long)t->nbytes);
        return CVT_ERR_ARG;
    }
    if (!nbytes)
        return CVT_ERR_NONE;
    memcpy(dst, src->maps[t->file].map + t->offset + byte_off, (size_t)nbytes);
    release_range(src, t->file, t->offset + byte_off, nbytes);
    return CVT_ERR_NONE;
}

enum cvt_err cvt_source_read(const struct cvt_source *src, const struct cvt_src_tensor *t, void *dst,
                             size_t dst_size)
{
    if (dst_size < t->nbytes) {
        qs_log_error(__func__, "tensor %s: %llu bytes do not fit a %zu-byte buffer", t->name,
                     (unsigned long long)t->nbytes, dst_size);
        return CVT_ERR_ARG;
    }
    return cvt_source_read_range(src, t, 0, t->nbytes, dst);
}

/* Element k of a float tensor as double (F16, BF16, F32, F64). */
static double load_float(const uint8_t *p, enum cvt_dtype dt)
{
    switch (dt) {
    case CVT_DT_F16: return cvt_f16_to_f32(cvt_ld16(p));
    case CVT_DT_BF16: return cvt_bf16_to_f32(cvt_ld16(p));
    case CVT_DT_F32: { float f; memcpy(&f, p, 4); return f; }
    case CVT_DT_F64: { double d; memcpy(&d, p, 8); return d; }
    default: return NAN;
    }
}

static enum cvt_err float_range(const struct cvt_source *src, const struct cvt_src_tensor *t, uint64_t first,
                                uint64_t count, const char *fn, const uint8_t **p)
{
    CVT_TRY(check_readable(src, t, fn));
    if (t->dtype != CVT_DT_F16 && t->dtype != CVT_DT_BF16 && t->dtype != CVT_DT_F32 && t->dtype != CVT_DT_F64) {
        qs_log_error(fn, "file %s: tensor %s has dtype %s, expected a float tensor (F16, BF16, F32, F64)",
                     src->files[t->file].name, t->name, cvt_dtype_str(t->dtype));
        return CVT_ERR_DTYPE;
    }
    if (first > (uint64_t)t->numel || count > (uint64_t)t->numel - first) {
        qs_log_error(fn, "tensor %s: elements [%llu, +%llu) outside its %lld elements", t->name,
                     (unsigned long long)first, (unsigned long long)count, (long long)t->numel);
        return CVT_ERR_ARG;
    }
    *p = src->maps[t->file].map + t->offset + first * cvt_dtype_size(t->dtype);
    return CVT_ERR_NONE;
}

enum cvt_err cvt_source_read_f32(const struct cvt_source *src, const struct cvt_src_tensor *t,
                                 uint64_t first, uint64_t count, float *dst)
{
    const uint8_t *p;
    CVT_TRY(float_range(src, t, first, count, __func__, &p));
    size_t es = cvt_dtype_size(t->dtype);
    enum cvt_err err = CVT_ERR_NONE;
    for (uint64_t i = 0; i < count; i++) {
        double v = load_float(p + i * es, t->dtype);
        if (!isfinite(v)) {
            qs_log_error(__func__, "file %s: tensor %s: element %llu is %s", src->files[t->file].name, t->name,
                         (unsigned long long)(first + i), isnan(v) ? "NaN" : "Inf");
            err = CVT_ERR_NAN;
            break;
        }
        if (fabs(v) > FLT_MAX) {
            qs_log_error(__func__, "file %s: tensor %s: element %llu = %g overflows fp32", src->files[t->file].name,
                         t->name, (unsigned long long)(first + i), v);
            err = CVT_ERR_RANGE;
            break;
        }
        dst[i] = (float)v;
    }
    release_range(src, t->file, t->offset + first * es, count * es);
    return err;
}

enum cvt_err cvt_source_read_f16(const struct cvt_source *src, const struct cvt_src_tensor *t,
                                 uint64_t first, uint64_t count, uint16_t *dst)
{
    const uint8_t *p;
    CVT_TRY(float_range(src, t, first, count, __func__, &p));
    size_t es = cvt_dtype_size(t->dtype);
    enum cvt_err err = CVT_ERR_NONE;
    if (t->dtype == CVT_DT_F16) { /* hot (embedding, lm_head): copy, then one vectorizable scan */
        memcpy(dst, p, (size_t)count * 2);
        unsigned bad = 0;
        for (uint64_t i = 0; i < count; i++)
            bad |= (dst[i] & 0x7c00u) == 0x7c00u;
        if (!bad) {
            release_range(src, t->file, t->offset + first * es, count * es);
            return CVT_ERR_NONE;
        }
    }
    for (uint64_t i = 0; i < count; i++) { /* other dtypes, or find the bad F16 element */
        uint16_t h;
        if (t->dtype == CVT_DT_F16) {
            h = cvt_ld16(p + i * es);
            if ((h & 0x7c00u) == 0x7c00u) {
                qs_log_error(__func__, "file %s: tensor %s: element %llu is %s", src->files[t->file].name, t->name,
                             (unsigned long long)(first + i), (h & 0x3ffu) ? "NaN" : "Inf");
                err = CVT_ERR_NAN;
                break;
            }
        } else {
            double v = load_float(p + i * es, t->dtype);
            if (!isfinite(v)) {
                qs_log_error(__func__, "file %s: tensor %s: element %llu is %s", src->files[t->file].name, t->name,
                             (unsigned long long)(first + i), isnan(v) ? "NaN" : "Inf");
                err = CVT_ERR_NAN;
                break;
            }
            /* F64 -> F32 -> F16 can double-round; values from F64 sources are rare (none in AWQ). */
            h = fabs(v) > FLT_MAX ? 0x7c00u : cvt_f32_to_f16((float)v);
            if ((h & 0x7c00u) == 0x7c00u) {
                qs_log_error(__func__, "file %s: tensor %s: element %llu = %g is outside the fp16 range (|x| <= 65504)",
                             src->files[t->file].name, t->name, (unsigned long long)(first + i), v);
                err = CVT_ERR_RANGE;
                break;
            }
        }
        dst[i] = h;
    }
    release_range(src, t->file, t->offset + first * es, count * es);
    return err;
}

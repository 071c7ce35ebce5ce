/*
 * fmt_manifest.c - manifest.json tying the rank files of one converted model together, and
 * opening every rank of a model directory (format/SPEC.md section 9).
 *
 *   {"format": "qshard-manifest", "version": 1, "model_id": "<32 hex>", "world_size": N,
 *    "ranks": [{"rank": k, "file": "rank-k-of-N.qshard", "size": bytes, "digest": "<16 hex>"}]}
 *
 * digest = XXH3-64 of the rank file's bytes [0, meta_size) (fmt_shard_digest): header, sections
 * and tensor table, which holds every tensor hash; checking it costs O(metadata), and a full
 * `qshard verify` then checks every tensor against the table.
 *
 * Entry points: fmt_manifest_write / load / free, fmt_manifest_open_rank, fmt_model_open / close.
 * Test: ./build/test_fmt (manifest cases).
 */
#include "fmt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> /* cJSON_Parse, cJSON_Print */

#include "fmt_internal.h" /* fmt_model_id_hex */
#include "qs_log.h"       /* qs_log_error */
#include "qs_util.h"      /* qs_path_join */

#define MANIFEST_MAX_BYTES (16u << 20)

void fmt_rank_file_name(char *buf, size_t n, uint32_t rank, uint32_t world_size)
{
    snprintf(buf, n, "rank-%u-of-%u.qshard", rank, world_size);
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Parse exactly 2*n hex digits into out[n]. */
static bool parse_hex(const char *s, uint8_t *out, size_t n)
{
    if (!s || strlen(s) != 2 * n)
        return false;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* --- write --------------------------------------------------------------------------------- */

/* Check that shard s (opened from `file`) is rank `rank` of the model described by id/world. */
static enum fmt_err check_belongs(const struct fmt_shard *s, const char *file, uint32_t rank,
                                  const uint8_t id[16], uint32_t world)
{
    const struct fmt_header *h = fmt_shard_header(s);
    char a[33], b[33];
    if (h->world_size != world || h->tp_rank != rank) {
        qs_log_error(__func__, "file %s: is rank %u of %u, expected rank %u of %u", file,
                     h->tp_rank, h->world_size, rank, world);
        return FMT_ERR_RANK_MISMATCH;
    }
    if (memcmp(h->model_id, id, 16) != 0) {
        fmt_model_id_hex(h->model_id, a);
        fmt_model_id_hex(id, b);
        qs_log_error(__func__, "file %s: model_id %s, expected %s: ranks from different "
                     "conversions", file, a, b);
        return FMT_ERR_RANK_MISMATCH;
    }
    return FMT_ERR_NONE;
}

static int text_fill(int fd, void *ctx)
{
    const char *text = ctx;
    return qs_write_all(fd, text, strlen(text));
}

/* manifest.json whole or not at all (temp name, fsync, rename: qs_write_atomic). */
static enum fmt_err write_text_atomic(const char *path, const char *text)
{
    const enum qs_write_err e = qs_write_atomic("fmt_manifest_write", path, text_fill,
                                                (void *)text);
    return e == QS_WRITE_OK ? FMT_ERR_NONE : e == QS_WRITE_NOMEM ? FMT_ERR_NOMEM : FMT_ERR_IO;
}

enum fmt_err fmt_manifest_write(const char *dir, uint32_t world_size)
{
    if (world_size == 0 || world_size > FMT_MAX_WORLD_SIZE) {
        qs_log_error(__func__, "directory %s: world_size %u out of range", dir, world_size);
        return FMT_ERR_RANK;
    }
    enum fmt_err err = FMT_ERR_NONE;
    uint8_t id[16];
    char idhex[33], dig[17], name[64];
    char *path = NULL, *text = NULL;
    struct fmt_shard *s = NULL;
    cJSON *root = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
    if (!root || !ranks)
        goto out_nomem;
    for (uint32_t k = 0; k < world_size; k++) {
        fmt_rank_file_name(name, sizeof(name), k, world_size);
        free(path);
        if (!(path = qs_path_join(dir, name)))
            goto out_nomem;
        if (!file_exists(path)) {
            qs_log_error(__func__, "directory %s: rank %u of %u: %s is missing", dir, k,
                         world_size, name);
            err = FMT_ERR_MISSING_RANK;
            goto out;
        }
        if ((err = fmt_shard_open(path, &s)))
            goto out;
        if (k == 0)
            memcpy(id, fmt_shard_header(s)->model_id, 16);
        if ((err = check_belongs(s, path, k, id, world_size)))
            goto out;
        snprintf(dig, sizeof(dig), "%016" PRIx64, fmt_shard_digest(s));
        cJSON *r = cJSON_CreateObject();
        if (!r || !cJSON_AddItemToArray(ranks, r))
            goto out_nomem;
        if (!cJSON_AddNumberToObject(r, "rank", k) || !cJSON_AddStringToObject(r, "file", name) ||
            !cJSON_AddNumberToObject(r, "size", (double)fmt_shard_header(s)->file_size) ||
            !cJSON_AddStringToObject(r, "digest", dig))
            goto out_nomem;
        fmt_shard_close(s);
        s = NULL;
    }
    fmt_model_id_hex(id, idhex);
    if (!cJSON_AddStringToObject(root, "format", "qshard-manifest") ||
        !cJSON_AddNumberToObject(root, "version", 1) ||
        !cJSON_AddStringToObject(root, "model_id", idhex) ||
        !cJSON_AddNumberToObject(root, "world_size", world_size))
        goto out_nomem;
    cJSON_AddItemToObject(root, "ranks", ranks);
    ranks = NULL;
    if (!(text = cJSON_Print(root)))
        goto out_nomem;
    free(path);
    if (!(path = qs_path_join(dir, FMT_MANIFEST_NAME)))
        goto out_nomem;
    {
        size_t tl = strlen(text);
        char *t2 = realloc(text, tl + 2);
        if (!t2)
            goto out_nomem;
        text = t2;
        memcpy(text + tl, "\n", 2);
    }
    err = write_text_atomic(path, text);
    goto out;
out_nomem:
    qs_log_error(__func__, "directory %s: out of memory writing the manifest", dir);
    err = FMT_ERR_NOMEM;
out:
    fmt_shard_close(s);
    cJSON_Delete(ranks);
    cJSON_Delete(root);
    free(text);
    free(path);
    return err;
}

/* --- load ---------------------------------------------------------------------------------- */

void fmt_manifest_free(struct fmt_manifest *m)
{
    if (!m)
        return;
    if (m->ranks)
        for (uint32_t i = 0; i < m->world_size; i++)
            free(m->ranks[i].file);
    free(m->ranks);
    free(m);
}

static char *read_small_file(const char *path, size_t max, enum fmt_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        qs_log_error(__func__, "file %s: cannot open: %s", path, strerror(errno));
        *err = errno == ENOENT ? FMT_ERR_MANIFEST : FMT_ERR_IO;
        return NULL;
    }
    struct stat st;
    size_t want = max;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < max)
        want = (size_t)st.st_size; /* a larger read below detects growth past max */
    char *buf = malloc(want + 1);
    if (!buf) {
        fclose(f);
        qs_log_error(__func__, "file %s: out of memory", path);
        *err = FMT_ERR_NOMEM;
        return NULL;
    }
    size_t n = fread(buf, 1, want + 1, f);
    bool bad = ferror(f);
    fclose(f);
    if (bad || n > want) {
        free(buf);
        qs_log_error(__func__, "file %s: %s", path,
                     bad ? "read error" : n > max ? "larger than 16 MiB" : "changed while read");
        *err = bad ? FMT_ERR_IO : FMT_ERR_MANIFEST;
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* A JSON number that is an integer in [0, max] (exact in a double up to 2^53). */
static bool json_uint(const cJSON *o, const char *key, double max, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= max) || d != (double)(uint64_t)d)
        return false;
    *out = (uint64_t)d;
    return true;
}

enum fmt_err fmt_manifest_load(const char *dir, struct fmt_manifest **out)
{
    *out = NULL;
    enum fmt_err err = FMT_ERR_NONE;
    char *path = qs_path_join(dir, FMT_MANIFEST_NAME), *text = NULL;
    struct fmt_manifest *m = NULL;
    cJSON *root = NULL;
    if (!path) {
        qs_log_error(__func__, "directory %s: out of memory", dir);
        return FMT_ERR_NOMEM;
    }
    if (!(text = read_small_file(path, MANIFEST_MAX_BYTES, &err)))
        goto out;
    err = FMT_ERR_MANIFEST;
    if (!(root = cJSON_Parse(text))) {
        qs_log_error(__func__, "file %s: not valid JSON", path);
        goto out;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *mid = cJSON_GetObjectItemCaseSensitive(root, "model_id");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(root, "ranks");
    uint64_t version, world;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "qshard-manifest") != 0) {
        qs_log_error(__func__, "file %s: \"format\" must be \"qshard-manifest\"", path);
        goto out;
    }
    if (!json_uint(root, "version", 1e9, &version) || version != 1) {
        qs_log_error(__func__, "file %s: \"version\": expected 1", path);
        goto out;
    }
    if (!json_uint(root, "world_size", FMT_MAX_WORLD_SIZE, &world) || world == 0) {
        qs_log_error(__func__, "file %s: \"world_size\": expected an integer 1..%d", path,
                     FMT_MAX_WORLD_SIZE);
        goto out;
    }
    if (!(m = calloc(1, sizeof(*m))) || !(m->ranks = calloc(world, sizeof(*m->ranks)))) {
        qs_log_error(__func__, "file %s: out of memory", path);
        err = FMT_ERR_NOMEM;
        goto out;
    }
    m->world_size = (uint32_t)world;
    if (!cJSON_IsString(mid) || !parse_hex(mid->valuestring, m->model_id, 16)) {
        qs_log_error(__func__, "file %s: \"model_id\": expected 32 hex digits", path);
        goto out;
    }
    if (!cJSON_IsArray(ranks)) {
        qs_log_error(__func__, "file %s: \"ranks\": expected an array", path);
        goto out;
    }
    const cJSON *r;
    uint32_t i = 0;
    cJSON_ArrayForEach(r, ranks) {
        uint64_t rank, size;
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(r, "file");
        const cJSON *dig = cJSON_GetObjectItemCaseSensitive(r, "digest");
        uint8_t d[8];
        if (!json_uint(r, "rank", FMT_MAX_WORLD_SIZE, &rank) || rank >= world) {
            qs_log_error(__func__, "file %s: ranks[%u].rank: expected an integer < world_size "
                         "%" PRIu64, path, i, world);
            goto out;
        }
        struct fmt_manifest_rank *mr = &m->ranks[rank];
        if (mr->file) {
            qs_log_error(__func__, "file %s: rank %" PRIu64 " listed twice", path, rank);
            goto out;
        }
        if (!cJSON_IsString(file) || !*file->valuestring || strchr(file->valuestring, '/') ||
            !strcmp(file->valuestring, ".") || !strcmp(file->valuestring, "..")) {
            qs_log_error(__func__, "file %s: ranks[%u].file: expected a plain file name", path, i);
            goto out;
        }
        if (!json_uint(r, "size", 9007199254740992.0, &size)) {
            qs_log_error(__func__, "file %s: ranks[%u].size: expected a byte count", path, i);
            goto out;
        }
        if (!cJSON_IsString(dig) || !parse_hex(dig->valuestring, d, 8)) {
            qs_log_error(__func__, "file %s: ranks[%u].digest: expected 16 hex digits", path, i);
            goto out;
        }
        if (!(mr->file = strdup(file->valuestring))) {
            qs_log_error(__func__, "file %s: out of memory", path);
            err = FMT_ERR_NOMEM;
            goto out;
        }
        mr->rank = (uint32_t)rank;
        mr->size = size;
        mr->digest = 0;
        for (int b = 0; b < 8; b++)
            mr->digest = mr->digest << 8 | d[b];
        i++;
    }
    for (uint32_t k = 0; k < m->world_size; k++) {
        if (!m->ranks[k].file) {
            qs_log_error(__func__, "file %s: no entry for rank %u of %u", path, k, m->world_size);
            err = FMT_ERR_MISSING_RANK;
            goto out;
        }
    }
    *out = m;
    m = NULL;
    err = FMT_ERR_NONE;
out:
    fmt_manifest_free(m);
    cJSON_Delete(root);
    free(text);
    free(path);
    return err;
}

/* --- open ranks ---------------------------------------------------------------------------- */

static enum fmt_err open_rank(const char *dir, const struct fmt_manifest *m, uint32_t rank,
                              struct fmt_shard **out)
{
    *out = NULL;
    const struct fmt_manifest_rank *mr = &m->ranks[rank];
    char *path = qs_path_join(dir, mr->file);
    if (!path) {
        qs_log_error(__func__, "directory %s: out of memory", dir);
        return FMT_ERR_NOMEM;
    }
    enum fmt_err err;
    struct fmt_shard *s = NULL;
    if (!file_exists(path)) {
        qs_log_error(__func__, "file %s: rank %u of %u named by the manifest is missing", path,
                     rank, m->world_size);
        err = FMT_ERR_MISSING_RANK;
        goto out;
    }
    if ((err = fmt_shard_open(path, &s)))
        goto out;
    if ((err = check_belongs(s, path, rank, m->model_id, m->world_size)))
        goto out;
    uint64_t size = fmt_shard_header(s)->file_size, dig = fmt_shard_digest(s);
    if (size != mr->size || dig != mr->digest) {
        qs_log_error(__func__, "file %s: manifest says %" PRIu64 " bytes, digest %016" PRIx64
                     "; file has %" PRIu64 " bytes, digest %016" PRIx64, path, mr->size,
                     mr->digest, size, dig);
        err = FMT_ERR_DIGEST;
        goto out;
    }
    *out = s;
    s = NULL;
out:
    fmt_shard_close(s);
    free(path);
    return err;
}

enum fmt_err fmt_manifest_open_rank(const char *dir, uint32_t rank, struct fmt_shard **out)
{
    *out = NULL;
    struct fmt_manifest *m;
    FMT_TRY(fmt_manifest_load(dir, &m));
    enum fmt_err err;
    if (rank >= m->world_size) {
        qs_log_error(__func__, "directory %s: rank %u requested, model has world_size %u", dir,
                     rank, m->world_size);
        err = FMT_ERR_RANK;
    } else {
        err = open_rank(dir, m, rank, out);
    }
    fmt_manifest_free(m);
    return err;
}

struct fmt_model {
    struct fmt_manifest *manifest;
    struct fmt_shard **shards; /* [world_size] */
};

void fmt_model_close(struct fmt_model *m)
{
    if (!m)
        return;
    if (m->shards)
        for (uint32_t k = 0; k < m->manifest->world_size; k++)
            fmt_shard_close(m->shards[k]);
    free(m->shards);
    fmt_manifest_free(m->manifest);
    free(m);
}

enum fmt_err fmt_model_open(const char *dir, struct fmt_model **out)
{
    *out = NULL;
    struct fmt_model *m = calloc(1, sizeof(*m));
    if (!m) {
        qs_log_error(__func__, "directory %s: out of memory", dir);
        return FMT_ERR_NOMEM;
    }
    enum fmt_err first = fmt_manifest_load(dir, &m->manifest);
    if (first) {
        free(m);
        return first;
    }
    uint32_t world = m->manifest->world_size;
    if (!(m->shards = calloc(world, sizeof(*m->shards)))) {
        qs_log_error(__func__, "directory %s: out of memory", dir);
        fmt_model_close(m);
        return FMT_ERR_NOMEM;
    }
    for (uint32_t k = 0; k < world; k++) {
        enum fmt_err err = open_rank(dir, m->manifest, k, &m->shards[k]);
        if (err && !first)
            first = err;
    }
    if (first) {
        fmt_model_close(m);
        return first;
    }
    *out = m;
    return FMT_ERR_NONE;
}

const struct fmt_manifest *fmt_model_manifest(const struct fmt_model *m) { return m->manifest; }
uint32_t fmt_model_world_size(const struct fmt_model *m) { return m->manifest->world_size; }
const struct fmt_shard *fmt_model_shard(const struct fmt_model *m, uint32_t rank)
{
    return rank < m->manifest->world_size ? m->shards[rank] : NULL;
}

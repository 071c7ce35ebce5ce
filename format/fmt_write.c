/*
 * fmt_write.c - streaming .qshard writer (fmt_write.h). Sections and the tensor table are kept
 * in memory (kilobytes to a few megabytes); tensor bytes go straight to their final offsets in
 * final_path.tmp with pwrite, from any thread. Before writing anything the metadata image is
 * run through the reader's own validator (fmt_parse_meta), so what we write is what we read.
 *
 * Entry points: fmt_writer_open ... fmt_writer_finish / fmt_writer_abort (see fmt_write.h).
 * Test: ./build/test_fmt (round trips, writer failure paths).
 */
#include "fmt_write.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <libgen.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h> /* XXH3_64bits, XXH3_state_t */
#include <zlib.h>   /* compress2 */

#include "fmt_internal.h" /* fmt_st*, fmt_parse_meta, fmt_header_encode, struct fmt_shard */
#include "qs_log.h"       /* qs_log_error */

enum wt_state { WT_EMPTY = 0, WT_BUSY, WT_PARTIAL, WT_DONE };

struct wtensor {
    char *name;        /* owned */
    uint32_t name_len;
    enum fmt_dtype dtype;
    enum fmt_layout layout;
    uint32_t n_dims;
    uint64_t shape[FMT_MAX_DIMS];
    enum fmt_split split;
    uint32_t split_axis;
    uint64_t size, offset, written, xxh3;
    XXH3_state_t *hs;  /* owned while a chunked write is in progress */
    enum wt_state state;
};

struct fmt_writer {
    char *final_path, *tmp_path; /* owned */
    int fd;
    struct fmt_writer_opts opts;
    uint8_t *sec_data[FMT_N_SECTION_KINDS]; /* owned; CONFIG, TOKENIZER, GENERATION_CONFIG */
    size_t sec_size[FMT_N_SECTION_KINDS];
    struct wtensor *t;           /* owned, [n] */
    uint32_t n, cap;
    uint32_t *idx;               /* name hash table: tensor index + 1, 0 = empty */
    uint32_t idx_cap;
    uint64_t names_size, meta_size, file_size;
    bool data_begun;
    enum fmt_err failed;         /* first failed put; finish refuses */
    pthread_mutex_t mu;          /* guards t[].state/written/hs and failed */
};

/* --- helpers ------------------------------------------------------------------------------- */

static enum fmt_err pwrite_all(struct fmt_writer *w, const void *data, size_t n, uint64_t off,
                               const char *what)
{
    const uint8_t *p = data;
    while (n) {
        ssize_t r = pwrite(w->fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            qs_log_error(__func__, "file %s: writing %s at offset %" PRIu64 ": %s", w->tmp_path,
                         what, off, r < 0 ? strerror(errno) : "no progress");
            return FMT_ERR_IO;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return FMT_ERR_NONE;
}

static void writer_free(struct fmt_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    for (uint32_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        if (w->t[i].hs)
            XXH3_freeState(w->t[i].hs);
    }
    for (int k = 0; k < FMT_N_SECTION_KINDS; k++)
        free(w->sec_data[k]);
    free(w->t);
    free(w->idx);
    free(w->final_path);
    free(w->tmp_path);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void fmt_writer_abort(struct fmt_writer *w)
{
    if (!w)
        return;
    if (w->tmp_path)
        unlink(w->tmp_path);
    writer_free(w);
}

static void set_failed(struct fmt_writer *w, enum fmt_err err)
{
    pthread_mutex_lock(&w->mu);
    if (!w->failed)
        w->failed = err;
    pthread_mutex_unlock(&w->mu);
}

/* --- open and declarations ----------------------------------------------------------------- */

enum fmt_err fmt_writer_open(const char *final_path, const struct fmt_writer_opts *opts,
                             struct fmt_writer **out)
{
    *out = NULL;
    if (!final_path || !opts || !*final_path) {
        qs_log_error(__func__, "missing path or options");
        return FMT_ERR_ARG;
    }
    if (opts->world_size == 0 || opts->world_size > FMT_MAX_WORLD_SIZE ||
        opts->tp_rank >= opts->world_size) {
        qs_log_error(__func__, "file %s: tp_rank %u / world_size %u: expected world_size 1..%d "
                     "and tp_rank < world_size", final_path, opts->tp_rank, opts->world_size,
                     FMT_MAX_WORLD_SIZE);
        return FMT_ERR_RANK;
    }
    struct fmt_writer *w = calloc(1, sizeof(*w));
    if (!w) {
        qs_log_error(__func__, "file %s: out of memory", final_path);
        return FMT_ERR_NOMEM;
    }
    w->fd = -1;
    pthread_mutex_init(&w->mu, NULL);
    w->opts = *opts;
    size_t n = strlen(final_path);
    w->final_path = strdup(final_path);
    w->tmp_path = malloc(n + 5);
    if (!w->final_path || !w->tmp_path) {
        free(w->tmp_path);
        w->tmp_path = NULL;
        writer_free(w);
        qs_log_error(__func__, "file %s: out of memory", final_path);
        return FMT_ERR_NOMEM;
    }
    memcpy(w->tmp_path, final_path, n);
    memcpy(w->tmp_path + n, ".tmp", 5);
    w->fd = open(w->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        qs_log_error(__func__, "file %s: cannot create: %s", w->tmp_path, strerror(errno));
        free(w->tmp_path);
        w->tmp_path = NULL; /* nothing to unlink: we did not create it */
        writer_free(w);
        return FMT_ERR_IO;
    }
    *out = w;
    return FMT_ERR_NONE;
}

enum fmt_err fmt_writer_set_section(struct fmt_writer *w, enum fmt_section_kind kind,
                                    const void *data, size_t size)
{
    if (w->data_begun) {
        qs_log_error(__func__, "file %s: sections are frozen after fmt_writer_begin_data",
                     w->final_path);
        return FMT_ERR_STATE;
    }
    if (kind != FMT_SECTION_CONFIG && kind != FMT_SECTION_GENERATION_CONFIG) {
        qs_log_error(__func__, "file %s: section kind %d cannot be set directly", w->final_path,
                     (int)kind);
        return FMT_ERR_ARG;
    }
    if (size == 0 || memchr(data, 0, size) || !fmt_utf8_valid(data, size)) {
        qs_log_error(__func__, "file %s: section %s must be non-empty UTF-8 without NUL bytes",
                     w->final_path, fmt_section_name(kind));
        return FMT_ERR_ARG;
    }
    uint8_t *copy = malloc(size);
    if (!copy) {
        qs_log_error(__func__, "file %s: out of memory for section %s", w->final_path,
                     fmt_section_name(kind));
        return FMT_ERR_NOMEM;
    }
    memcpy(copy, data, size);
    free(w->sec_data[kind]);
    w->sec_data[kind] = copy;
    w->sec_size[kind] = size;
    return FMT_ERR_NONE;
}

enum fmt_err fmt_writer_set_tokenizer_files(struct fmt_writer *w, const char *const *names,
                                            const void *const *datas, const size_t *sizes,
                                            uint32_t n)
{
    if (w->data_begun) {
        qs_log_error(__func__, "file %s: sections are frozen after fmt_writer_begin_data",
                     w->final_path);
        return FMT_ERR_STATE;
    }
    if (n > FMT_TOK_MAX_FILES) {
        qs_log_error(__func__, "file %s: %u tokenizer files, at most %d", w->final_path, n,
                     FMT_TOK_MAX_FILES);
        return FMT_ERR_ARG;
    }
    uint64_t raw = 8;
    for (uint32_t i = 0; i < n; i++) {
        size_t nl = strlen(names[i]);
        if (nl == 0 || nl > FMT_TOK_NAME_MAX || strchr(names[i], '/') ||
            !fmt_utf8_valid((const uint8_t *)names[i], nl)) {
            qs_log_error(__func__, "file %s: bad tokenizer file name \"%s\"", w->final_path,
                         names[i]);
            return FMT_ERR_ARG;
        }
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(names[i], names[j])) {
                qs_log_error(__func__, "file %s: tokenizer file %s given twice", w->final_path,
                             names[i]);
                return FMT_ERR_ARG;
            }
        raw += 16 + nl + (uint64_t)sizes[i];
    }
    if (raw > FMT_TOKENIZER_MAX) {
        qs_log_error(__func__, "file %s: tokenizer files total %" PRIu64 " bytes, limit %llu",
                     w->final_path, raw, (unsigned long long)FMT_TOKENIZER_MAX);
        return FMT_ERR_ARG;
    }
    enum fmt_err err = FMT_ERR_NONE;
    uint8_t *arch = malloc((size_t)raw);
    uLong zcap = compressBound((uLong)raw);
    uint8_t *sec = malloc(8 + (size_t)zcap);
    if (!arch || !sec) {
        qs_log_error(__func__, "file %s: out of memory for the tokenizer archive", w->final_path);
        err = FMT_ERR_NOMEM;
        goto out;
    }
    fmt_st32(arch, n);
    fmt_st32(arch + 4, 0);
    uint64_t pos = 8;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t nl = (uint32_t)strlen(names[i]);
        fmt_st32(arch + pos, nl);
        fmt_st32(arch + pos + 4, 0);
        fmt_st64(arch + pos + 8, sizes[i]);
        memcpy(arch + pos + 16, names[i], nl);
        if (sizes[i])
            memcpy(arch + pos + 16 + nl, datas[i], sizes[i]);
        pos += 16 + nl + sizes[i];
    }
    uLongf zlen = zcap;
    int zr = compress2(sec + 8, &zlen, arch, (uLong)raw, 6);
    if (zr != Z_OK) {
        qs_log_error(__func__, "file %s: zlib compress2 failed with %d", w->final_path, zr);
        err = FMT_ERR_ZLIB;
        goto out;
    }
    fmt_st64(sec, raw);
    free(w->sec_data[FMT_SECTION_TOKENIZER]);
    w->sec_data[FMT_SECTION_TOKENIZER] = sec;
    w->sec_size[FMT_SECTION_TOKENIZER] = 8 + zlen;
    sec = NULL;
out:
    free(arch);
    free(sec);
    return err;
}

static uint32_t idx_slot(const struct fmt_writer *w, const char *name, size_t len, bool *found)
{
    uint32_t mask = w->idx_cap - 1, i = (uint32_t)XXH3_64bits(name, len) & mask;
    while (w->idx[i]) {
        if (!strcmp(w->t[w->idx[i] - 1].name, name)) {
            *found = true;
            return i;
        }
        i = (i + 1) & mask;
    }
    *found = false;
    return i;
}

static enum fmt_err idx_grow(struct fmt_writer *w)
{
    uint32_t cap = w->idx_cap ? w->idx_cap * 2 : 64;
    uint32_t *idx = calloc(cap, sizeof(*idx));
    if (!idx)
        return FMT_ERR_NOMEM;
    free(w->idx);
    w->idx = idx;
    w->idx_cap = cap;
    for (uint32_t i = 0; i < w->n; i++) {
        bool found;
        uint32_t s = idx_slot(w, w->t[i].name, w->t[i].name_len, &found);
        w->idx[s] = i + 1;
    }
    return FMT_ERR_NONE;
}

enum fmt_err fmt_writer_add_tensor(struct fmt_writer *w, const char *name, enum fmt_dtype dtype,
                                   enum fmt_layout layout, uint32_t n_dims,
                                   const uint64_t *shape, enum fmt_split split,
                                   uint32_t split_axis, uint32_t *index)
{
    const char *fp = w->final_path;
    if (w->data_begun) {
        qs_log_error(__func__, "file %s: tensor %s: declared after fmt_writer_begin_data", fp,
                     name ? name : "(null)");
        return FMT_ERR_STATE;
    }
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > FMT_NAME_MAX || !fmt_utf8_valid((const uint8_t *)name, nl)) {
        qs_log_error(__func__, "file %s: tensor name \"%s\": expected 1..%d bytes of UTF-8", fp,
                     name ? name : "(null)", FMT_NAME_MAX);
        return FMT_ERR_NAME;
    }
    if (!fmt_dtype_name(dtype)) {
        qs_log_error(__func__, "file %s: tensor %s: unknown dtype %d", fp, name, (int)dtype);
        return FMT_ERR_DTYPE;
    }
    if (!fmt_layout_name(layout)) {
        qs_log_error(__func__, "file %s: tensor %s: unknown layout tag %d", fp, name, (int)layout);
        return FMT_ERR_LAYOUT;
    }
    if (n_dims > FMT_MAX_DIMS || (n_dims && !shape)) {
        qs_log_error(__func__, "file %s: tensor %s: n_dims %u, expected 0..%d", fp, name, n_dims,
                     FMT_MAX_DIMS);
        return FMT_ERR_SHAPE;
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (shape[d] == 0) {
            qs_log_error(__func__, "file %s: tensor %s: shape[%u] = 0", fp, name, d);
            return FMT_ERR_SHAPE;
        }
        if (numel > UINT64_MAX / shape[d]) {
            qs_log_error(__func__, "file %s: tensor %s: element count overflows", fp, name);
            return FMT_ERR_OVERFLOW;
        }
        numel *= shape[d];
    }
    uint64_t size = fmt_dtype_size_bytes(dtype, numel);
    if (size == 0) {
        qs_log_error(__func__, "file %s: tensor %s: %" PRIu64 " elements of %s: %s", fp, name,
                     numel, fmt_dtype_name(dtype),
                     dtype == FMT_DTYPE_Q4 ? "Q4 needs an even count" : "size overflows");
        return dtype == FMT_DTYPE_Q4 ? FMT_ERR_SHAPE : FMT_ERR_OVERFLOW;
    }
    if (layout != FMT_LAYOUT_ROW_MAJOR) {
        enum fmt_dtype want = layout == FMT_LAYOUT_S_T64 ? FMT_DTYPE_F16 : FMT_DTYPE_Q4;
        uint64_t kmul = layout == FMT_LAYOUT_W4_MMA_T16X64 ? FMT_W4_TILE_K : 1;
        if (dtype != want || n_dims != 2 || shape[0] % kmul || shape[1] % FMT_W4_TILE_N) {
            qs_log_error(__func__, "file %s: tensor %s: layout %s needs %s [K, N] with K %% %"
                         PRIu64 " == 0, N %% %d == 0; got %s with %u dims", fp, name,
                         fmt_layout_name(layout), fmt_dtype_name(want), kmul, FMT_W4_TILE_N,
                         fmt_dtype_name(dtype), n_dims);
            return FMT_ERR_LAYOUT;
        }
    }
    if (!fmt_split_name(split) ||
        (split == FMT_SPLIT_NONE ? split_axis != 0 : split_axis >= n_dims)) {
        qs_log_error(__func__, "file %s: tensor %s: split %d axis %u invalid for %u dims", fp,
                     name, (int)split, split_axis, n_dims);
        return FMT_ERR_SPLIT;
    }
    if (w->n >= UINT32_MAX / 4) {
        qs_log_error(__func__, "file %s: too many tensors", fp);
        return FMT_ERR_ARG;
    }
    if (2 * (w->n + 1) > w->idx_cap && idx_grow(w)) {
        qs_log_error(__func__, "file %s: out of memory", fp);
        return FMT_ERR_NOMEM;
    }
    bool found;
    uint32_t slot = idx_slot(w, name, nl, &found);
    if (found) {
        qs_log_error(__func__, "file %s: duplicate tensor name %s", fp, name);
        return FMT_ERR_DUP_NAME;
    }
    if (w->n == w->cap) {
        uint32_t cap = w->cap ? w->cap * 2 : 64;
        struct wtensor *t = realloc(w->t, cap * sizeof(*t));
        if (!t) {
            qs_log_error(__func__, "file %s: out of memory", fp);
            return FMT_ERR_NOMEM;
        }
        w->t = t;
        w->cap = cap;
    }
    struct wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof(*t));
    if (!(t->name = strdup(name))) {
        qs_log_error(__func__, "file %s: out of memory", fp);
        return FMT_ERR_NOMEM;
    }
    t->name_len = (uint32_t)nl;
    t->dtype = dtype;
    t->layout = layout;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < n_dims; d++)
        t->shape[d] = shape[d];
    t->split = split;
    t->split_axis = split_axis;
    t->size = size;
    w->idx[slot] = w->n + 1;
    w->names_size += nl + 1;
    if (index)
        *index = w->n;
    w->n++;
    return FMT_ERR_NONE;
}

/* --- metadata image ------------------------------------------------------------------------ */

static const enum fmt_section_kind sec_order[] = {
    FMT_SECTION_CONFIG, FMT_SECTION_GENERATION_CONFIG, FMT_SECTION_TOKENIZER,
    FMT_SECTION_TENSOR_TABLE,
};
#define N_SEC ((uint32_t)(sizeof(sec_order) / sizeof(sec_order[0])))

static uint64_t table_size(const struct fmt_writer *w)
{
    return FMT_TABLE_HEADER_SIZE + (uint64_t)w->n * FMT_TENSOR_ENTRY_SIZE + w->names_size;
}

/* Build header + section table + sections + tensor table (with the current tensor hashes) into
 * a malloc'ed buffer of meta_size bytes, then validate it with the reader's checks. */
static enum fmt_err build_meta(struct fmt_writer *w, uint8_t **out)
{
    *out = NULL;
    uint8_t *m = calloc(1, (size_t)w->meta_size);
    if (!m) {
        qs_log_error(__func__, "file %s: out of memory for %" PRIu64 " metadata bytes",
                     w->final_path, w->meta_size);
        return FMT_ERR_NOMEM;
    }
    uint64_t pos = FMT_HEADER_SIZE + N_SEC * FMT_SECTION_ENTRY_SIZE;
    for (uint32_t i = 0; i < N_SEC; i++) {
        enum fmt_section_kind k = sec_order[i];
        pos = fmt_align_up(pos, FMT_SECTION_ALIGN);
        uint8_t *p = m + pos;
        uint64_t size;
        if (k == FMT_SECTION_TENSOR_TABLE) {
            size = table_size(w);
            fmt_st32(p, w->n);
            fmt_st32(p + 4, FMT_TENSOR_ENTRY_SIZE);
            fmt_st64(p + 8, w->names_size);
            uint8_t *pool = p + FMT_TABLE_HEADER_SIZE + (uint64_t)w->n * FMT_TENSOR_ENTRY_SIZE;
            uint32_t name_off = 0;
            for (uint32_t j = 0; j < w->n; j++) {
                const struct wtensor *t = &w->t[j];
                uint8_t *e = p + FMT_TABLE_HEADER_SIZE + (uint64_t)j * FMT_TENSOR_ENTRY_SIZE;
                fmt_st32(e, name_off);
                fmt_st32(e + 4, t->name_len);
                fmt_st32(e + 8, (uint32_t)t->dtype);
                fmt_st32(e + 12, (uint32_t)t->layout);
                fmt_st32(e + 16, t->n_dims);
                fmt_st32(e + 20, (uint32_t)t->split);
                fmt_st32(e + 24, t->split_axis);
                for (int d = 0; d < FMT_MAX_DIMS; d++)
                    fmt_st64(e + 32 + 8 * d, t->shape[d]);
                fmt_st64(e + 64, t->offset);
                fmt_st64(e + 72, t->size);
                fmt_st64(e + 80, t->xxh3);
                memcpy(pool + name_off, t->name, t->name_len + 1);
                name_off += t->name_len + 1;
            }
        } else {
            size = w->sec_size[k];
            memcpy(p, w->sec_data[k], (size_t)size);
        }
        uint8_t *e = m + FMT_HEADER_SIZE + i * FMT_SECTION_ENTRY_SIZE;
        fmt_st32(e, (uint32_t)k);
        fmt_st64(e + 8, pos);
        fmt_st64(e + 16, size);
        fmt_st64(e + 24, XXH3_64bits(p, (size_t)size));
        pos += size;
    }
    struct fmt_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, FMT_MAGIC, 8);
    h.version_major = FMT_VERSION_MAJOR;
    h.version_minor = FMT_VERSION_MINOR;
    h.endian_mark = FMT_ENDIAN_MARK;
    h.header_size = FMT_HEADER_SIZE;
    h.tp_rank = w->opts.tp_rank;
    h.world_size = w->opts.world_size;
    h.file_size = w->file_size;
    memcpy(h.model_id, w->opts.model_id, 16);
    h.section_table_offset = FMT_HEADER_SIZE;
    h.section_count = N_SEC;
    h.section_entry_size = FMT_SECTION_ENTRY_SIZE;
    h.meta_size = w->meta_size;
    h.checksum_algo = FMT_CHECKSUM_XXH3_64;
    fmt_header_encode(&h, m);

    /* Self-check with the reader's validator: a writer bug is caught before a byte is written. */
    struct fmt_shard chk;
    memset(&chk, 0, sizeof(chk));
    chk.path = w->tmp_path;
    enum fmt_err err = fmt_parse_meta(&chk, m, w->meta_size, UINT64_MAX);
    fmt_shard_free_parts(&chk);
    if (err) {
        free(m);
        return err;
    }
    *out = m;
    return FMT_ERR_NONE;
}

enum fmt_err fmt_writer_begin_data(struct fmt_writer *w)
{
    if (w->data_begun) {
        qs_log_error(__func__, "file %s: fmt_writer_begin_data called twice", w->final_path);
        return FMT_ERR_STATE;
    }
    if (!w->sec_data[FMT_SECTION_CONFIG]) {
        qs_log_error(__func__, "file %s: no CONFIG section set", w->final_path);
        return FMT_ERR_SECTION;
    }
    if (!w->sec_data[FMT_SECTION_GENERATION_CONFIG])
        FMT_TRY(fmt_writer_set_section(w, FMT_SECTION_GENERATION_CONFIG, "{}", 2));
    if (!w->sec_data[FMT_SECTION_TOKENIZER])
        FMT_TRY(fmt_writer_set_tokenizer_files(w, NULL, NULL, NULL, 0));
    uint64_t pos = FMT_HEADER_SIZE + N_SEC * FMT_SECTION_ENTRY_SIZE;
    for (uint32_t i = 0; i < N_SEC; i++) {
        enum fmt_section_kind k = sec_order[i];
        pos = fmt_align_up(pos, FMT_SECTION_ALIGN);
        pos += k == FMT_SECTION_TENSOR_TABLE ? table_size(w) : w->sec_size[k];
    }
    w->meta_size = pos;
    for (uint32_t j = 0; j < w->n; j++) {
        w->t[j].offset = fmt_align_up(pos, FMT_ALIGN);
        if (w->t[j].offset > UINT64_MAX - w->t[j].size) {
            qs_log_error(__func__, "file %s: total size overflows", w->final_path);
            return FMT_ERR_OVERFLOW;
        }
        pos = w->t[j].offset + w->t[j].size;
    }
    w->file_size = pos;
    uint8_t *m;
    FMT_TRY(build_meta(w, &m));
    free(m);
    /* Reserve the space now, so a full disk fails here and not after hours of converting;
     * filesystems without fallocate get a sparse file. Either way unwritten bytes read as 0. */
    if (w->file_size && fallocate(w->fd, 0, 0, (off_t)w->file_size) != 0) {
        if (errno != EOPNOTSUPP && errno != ENOSYS) {
            qs_log_error(__func__, "file %s: cannot reserve %" PRIu64 " bytes: %s", w->tmp_path,
                         w->file_size, strerror(errno));
            return FMT_ERR_IO;
        }
    }
    if (ftruncate(w->fd, (off_t)w->file_size) != 0) {
        qs_log_error(__func__, "file %s: cannot size to %" PRIu64 " bytes: %s", w->tmp_path,
                     w->file_size, strerror(errno));
        return FMT_ERR_IO;
    }
    w->data_begun = true;
    return FMT_ERR_NONE;
}

uint64_t fmt_writer_tensor_size(const struct fmt_writer *w, uint32_t index)
{
    return index < w->n ? w->t[index].size : 0;
}

/* --- tensor data (thread-safe) ------------------------------------------------------------- */

/* Under w->mu: take tensor `index` for writing n bytes at `off`; *t gets the tensor. */
static enum fmt_err claim(struct fmt_writer *w, uint32_t index, uint64_t off, size_t n,
                          bool whole, struct wtensor **tp)
{
    if (!w->data_begun) {
        qs_log_error(__func__, "file %s: tensor data written before fmt_writer_begin_data",
                     w->final_path);
        return FMT_ERR_STATE;
    }
    if (index >= w->n) {
        qs_log_error(__func__, "file %s: tensor index %u >= %u declared", w->final_path, index,
                     w->n);
        return FMT_ERR_ARG;
    }
    struct wtensor *t = &w->t[index];
    if (t->state == WT_BUSY || t->state == WT_DONE || (whole && t->state != WT_EMPTY)) {
        qs_log_error(__func__, "file %s: tensor %s: %s", w->final_path, t->name,
                     t->state == WT_DONE ? "already written" : "already being written");
        return FMT_ERR_STATE;
    }
    if (whole ? n != t->size : (off != t->written || n > t->size - off)) {
        qs_log_error(__func__, "file %s: tensor %s: %s: expected %" PRIu64 " bytes%s%" PRIu64
                     ", got %zu bytes at %" PRIu64, w->final_path, t->name,
                     whole ? "size" : "chunk", whole ? t->size : t->size - t->written,
                     whole ? "" : " at most from offset ", whole ? 0 : t->written, n, off);
        return FMT_ERR_ARG;
    }
    if (!whole && !t->hs) {
        if (!(t->hs = XXH3_createState()) || XXH3_64bits_reset(t->hs) != XXH_OK) {
            qs_log_error(__func__, "file %s: tensor %s: out of memory", w->final_path, t->name);
            return FMT_ERR_NOMEM;
        }
    }
    t->state = WT_BUSY;
    *tp = t;
    return FMT_ERR_NONE;
}

enum fmt_err fmt_writer_put_tensor(struct fmt_writer *w, uint32_t index, const void *data,
                                   size_t size)
{
    struct wtensor *t;
    pthread_mutex_lock(&w->mu);
    enum fmt_err err = claim(w, index, 0, size, true, &t);
    pthread_mutex_unlock(&w->mu);
    if (err) {
        set_failed(w, err);
        return err;
    }
    err = pwrite_all(w, data, size, t->offset, t->name);
    uint64_t h = err ? 0 : XXH3_64bits(data, size);
    pthread_mutex_lock(&w->mu);
    if (err) {
        t->state = WT_EMPTY;
        if (!w->failed)
            w->failed = err;
    } else {
        t->xxh3 = h;
        t->written = size;
        t->state = WT_DONE;
    }
    pthread_mutex_unlock(&w->mu);
    return err;
}

enum fmt_err fmt_writer_put_tensor_part(struct fmt_writer *w, uint32_t index,
                                        uint64_t offset_in_tensor, const void *data, size_t n)
{
    struct wtensor *t;
    pthread_mutex_lock(&w->mu);
    enum fmt_err err = claim(w, index, offset_in_tensor, n, false, &t);
    pthread_mutex_unlock(&w->mu);
    if (err) {
        set_failed(w, err);
        return err;
    }
    err = pwrite_all(w, data, n, t->offset + offset_in_tensor, t->name);
    if (!err && XXH3_64bits_update(t->hs, data, n) != XXH_OK) {
        qs_log_error(__func__, "file %s: tensor %s: XXH3 update failed", w->final_path, t->name);
        err = FMT_ERR_ARG;
    }
    pthread_mutex_lock(&w->mu);
    if (err) {
        t->state = WT_PARTIAL; /* hash state is now unusable: the writer is failed anyway */
        if (!w->failed)
            w->failed = err;
    } else {
        t->written += n;
        if (t->written == t->size) {
            t->xxh3 = XXH3_64bits_digest(t->hs);
            XXH3_freeState(t->hs);
            t->hs = NULL;
            t->state = WT_DONE;
        } else {
            t->state = WT_PARTIAL;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return err;
}

/* --- finish -------------------------------------------------------------------------------- */

static enum fmt_err fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy) {
        qs_log_error(__func__, "out of memory");
        return FMT_ERR_NOMEM;
    }
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    enum fmt_err err = FMT_ERR_NONE;
    if (fd < 0 || fsync(fd) != 0) {
        qs_log_error(__func__, "directory %s: open/fsync: %s", dir, strerror(errno));
        err = FMT_ERR_IO;
    }
    if (fd >= 0)
        close(fd);
    free(copy);
    return err;
}

static enum fmt_err finish(struct fmt_writer *w)
{
    if (!w->data_begun) {
        qs_log_error(__func__, "file %s: fmt_writer_finish before fmt_writer_begin_data",
                     w->final_path);
        return FMT_ERR_STATE;
    }
    if (w->failed) {
        qs_log_error(__func__, "file %s: not finished: an earlier write failed (%s)",
                     w->final_path, fmt_err_str(w->failed));
        return w->failed;
    }
    for (uint32_t j = 0; j < w->n; j++) {
        if (w->t[j].state != WT_DONE) {
            qs_log_error(__func__, "file %s: tensor %s: %" PRIu64 " of %" PRIu64 " bytes written",
                         w->final_path, w->t[j].name, w->t[j].written, w->t[j].size);
            return FMT_ERR_INCOMPLETE;
        }
    }
    uint8_t *m;
    FMT_TRY(build_meta(w, &m));
    enum fmt_err err = pwrite_all(w, m, (size_t)w->meta_size, 0, "metadata");
    free(m);
    if (err)
        return err;
    if (fsync(w->fd) != 0) {
        qs_log_error(__func__, "file %s: fsync: %s", w->tmp_path, strerror(errno));
        return FMT_ERR_IO;
    }
    if (close(w->fd) != 0) {
        w->fd = -1;
        qs_log_error(__func__, "file %s: close: %s", w->tmp_path, strerror(errno));
        return FMT_ERR_IO;
    }
    w->fd = -1;
    if (rename(w->tmp_path, w->final_path) != 0) {
        qs_log_error(__func__, "file %s: rename to %s: %s", w->tmp_path, w->final_path,
                     strerror(errno));
        return FMT_ERR_IO;
    }
    free(w->tmp_path);
    w->tmp_path = NULL; /* renamed: nothing to remove any more */
    return fsync_dir_of(w->final_path);
}

enum fmt_err fmt_writer_finish(struct fmt_writer *w)
{
    if (!w)
        return FMT_ERR_ARG;
    enum fmt_err err = finish(w);
    fmt_writer_abort(w); /* removes the temp file if it is still there, frees */
    return err;
}

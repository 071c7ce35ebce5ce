/*
 * fmt.c - .qshard reader: open (mmap + validate metadata), tensor lookup, sections, tokenizer
 * archive, checksum verification. format/SPEC.md is the normative layout; section 8 of it lists
 * the checks done here in the order they are done.
 *
 * Entry points: fmt_shard_open / fmt_shard_close and the accessors declared in fmt.h.
 * fmt_parse_meta() is shared with the writer (fmt_write.c), which validates the metadata it is
 * about to write with the same code.
 *
 * Test: ./build/test_fmt; fuzz: make fuzz.
 */
#include "fmt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h> /* XXH3_64bits */
#include <zlib.h>   /* inflate */

#include "fmt_internal.h" /* struct fmt_shard, fmt_ld*, fmt_parse_meta */
#include "qs_log.h"       /* qs_log_error */

/* --- names of enums ------------------------------------------------------------------------ */

const char *fmt_err_str(enum fmt_err err)
{
    switch (err) {
#define FMT_ERR_STR_(name, value, desc)                                                      \
    case FMT_ERR_##name:                                                                     \
        return "FMT_ERR_" #name ": " desc;
        FMT_ERR_LIST(FMT_ERR_STR_)
#undef FMT_ERR_STR_
    }
    return "FMT_ERR_?: unknown error code";
}

const char *fmt_err_name(enum fmt_err err)
{
    switch (err) {
#define FMT_ERR_NAME_(name, value, desc)                                                     \
    case FMT_ERR_##name:                                                                     \
        return #name;
        FMT_ERR_LIST(FMT_ERR_NAME_)
#undef FMT_ERR_NAME_
    }
    return "?";
}

/* Bytes per element, or 0 for Q4 (half a byte) and unknown dtypes. */
static uint64_t dtype_elem_bytes(enum fmt_dtype dtype)
{
    switch (dtype) {
    case FMT_DTYPE_F32: case FMT_DTYPE_I32: case FMT_DTYPE_U32: return 4;
    case FMT_DTYPE_F16: case FMT_DTYPE_BF16: case FMT_DTYPE_I16: return 2;
    case FMT_DTYPE_U8: return 1;
    case FMT_DTYPE_Q4: return 0;
    }
    return 0;
}

const char *fmt_dtype_name(enum fmt_dtype dtype)
{
    switch (dtype) {
    case FMT_DTYPE_F32: return "F32";
    case FMT_DTYPE_F16: return "F16";
    case FMT_DTYPE_BF16: return "BF16";
    case FMT_DTYPE_I32: return "I32";
    case FMT_DTYPE_I16: return "I16";
    case FMT_DTYPE_U8: return "U8";
    case FMT_DTYPE_U32: return "U32";
    case FMT_DTYPE_Q4: return "Q4";
    }
    return NULL;
}

size_t fmt_dtype_size_bytes(enum fmt_dtype dtype, uint64_t numel)
{
    if (!fmt_dtype_name(dtype))
        return 0;
    if (dtype == FMT_DTYPE_Q4)
        return (numel % 2) ? 0 : (size_t)(numel / 2);
    uint64_t eb = dtype_elem_bytes(dtype);
    if (numel > UINT64_MAX / eb || numel * eb > SIZE_MAX)
        return 0;
    return (size_t)(numel * eb);
}

const char *fmt_layout_name(enum fmt_layout layout)
{
    switch (layout) {
    case FMT_LAYOUT_ROW_MAJOR: return "ROW_MAJOR";
    case FMT_LAYOUT_W4_MMA_T16X64: return "W4_MMA_T16X64";
    case FMT_LAYOUT_S_T64: return "S_T64";
    case FMT_LAYOUT_Z4_T64: return "Z4_T64";
    }
    return NULL;
}

const char *fmt_split_name(enum fmt_split split)
{
    switch (split) {
    case FMT_SPLIT_NONE: return "none";
    case FMT_SPLIT_COLUMN: return "column";
    case FMT_SPLIT_ROW: return "row";
    case FMT_SPLIT_VOCAB: return "vocab";
    }
    return NULL;
}

const char *fmt_section_name(enum fmt_section_kind kind)
{
    switch (kind) {
    case FMT_SECTION_CONFIG: return "CONFIG";
    case FMT_SECTION_TOKENIZER: return "TOKENIZER";
    case FMT_SECTION_GENERATION_CONFIG: return "GENERATION_CONFIG";
    case FMT_SECTION_TENSOR_TABLE: return "TENSOR_TABLE";
    }
    return NULL;
}

/* --- small helpers ------------------------------------------------------------------------- */

bool fmt_utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (n - i < len)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

static bool all_zero(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

static void hex16(const uint8_t id[16], char out[33])
{
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = d[id[i] >> 4];
        out[2 * i + 1] = d[id[i] & 15];
    }
    out[32] = '\0';
}

/* a + b into *r; false on u64 wrap. */
static bool add_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    if (a > UINT64_MAX - b)
        return false;
    *r = a + b;
    return true;
}

/* --- header -------------------------------------------------------------------------------- */

static void header_decode(const uint8_t *p, struct fmt_header *h)
{
    memcpy(h->magic, p, 8);
    h->version_major = fmt_ld16(p + 8);
    h->version_minor = fmt_ld16(p + 10);
    h->endian_mark = fmt_ld32(p + 12);
    h->header_size = fmt_ld32(p + 16);
    h->flags = fmt_ld32(p + 20);
    h->tp_rank = fmt_ld32(p + 24);
    h->world_size = fmt_ld32(p + 28);
    h->file_size = fmt_ld64(p + 32);
    memcpy(h->model_id, p + 40, 16);
    h->section_table_offset = fmt_ld64(p + 56);
    h->section_count = fmt_ld32(p + 64);
    h->section_entry_size = fmt_ld32(p + 68);
    h->meta_size = fmt_ld64(p + 72);
    h->checksum_algo = fmt_ld32(p + 80);
    memcpy(h->reserved, p + 84, sizeof(h->reserved));
    h->header_xxh3 = fmt_ld64(p + 248);
}

/* XXH3-64 of the 256 header bytes with the header_xxh3 field taken as zero. */
static uint64_t header_hash(const uint8_t *p)
{
    uint8_t tmp[FMT_HEADER_SIZE];
    memcpy(tmp, p, FMT_HEADER_SIZE);
    memset(tmp + 248, 0, 8);
    return XXH3_64bits(tmp, FMT_HEADER_SIZE);
}

void fmt_header_encode(const struct fmt_header *h, uint8_t out[FMT_HEADER_SIZE])
{
    memset(out, 0, FMT_HEADER_SIZE);
    memcpy(out, h->magic, 8);
    fmt_st16(out + 8, h->version_major);
    fmt_st16(out + 10, h->version_minor);
    fmt_st32(out + 12, h->endian_mark);
    fmt_st32(out + 16, h->header_size);
    fmt_st32(out + 20, h->flags);
    fmt_st32(out + 24, h->tp_rank);
    fmt_st32(out + 28, h->world_size);
    fmt_st64(out + 32, h->file_size);
    memcpy(out + 40, h->model_id, 16);
    fmt_st64(out + 56, h->section_table_offset);
    fmt_st32(out + 64, h->section_count);
    fmt_st32(out + 68, h->section_entry_size);
    fmt_st64(out + 72, h->meta_size);
    fmt_st32(out + 80, h->checksum_algo);
    memcpy(out + 84, h->reserved, sizeof(h->reserved));
    fmt_st64(out + 248, header_hash(out));
}

/* Header checks, SPEC.md section 8 steps 1-9. */
static enum fmt_err check_header(struct fmt_shard *s, const uint8_t *buf, uint64_t avail,
                                 uint64_t file_bytes)
{
    const char *path = s->path;
    struct fmt_header *h = &s->hdr;
    size_t nm = avail < 8 ? (size_t)avail : 8;
    if (memcmp(buf, FMT_MAGIC, nm) != 0) {
        qs_log_error(__func__, "file %s: bad magic: expected \"QSHARD\\r\\n\" "
                     "(51 53 48 41 52 44 0d 0a), got %02x %02x %02x %02x ...: not a .qshard file",
                     path, buf[0], nm > 1 ? buf[1] : 0, nm > 2 ? buf[2] : 0, nm > 3 ? buf[3] : 0);
        return FMT_ERR_MAGIC;
    }
    if (avail < FMT_HEADER_SIZE) {
        qs_log_error(__func__, "file %s: truncated inside the header: expected at least %d "
                     "bytes, got %" PRIu64, path, FMT_HEADER_SIZE, avail);
        return FMT_ERR_TRUNCATED;
    }
    header_decode(buf, h);
    if (h->endian_mark != FMT_ENDIAN_MARK) {
        if (h->endian_mark == 0x04030201u) {
            qs_log_error(__func__, "file %s: endianness mark reads 0x%08x, expected 0x%08x: "
                         "the file was written big-endian", path, h->endian_mark, FMT_ENDIAN_MARK);
            return FMT_ERR_ENDIAN;
        }
        qs_log_error(__func__, "file %s: bad endianness mark: expected 0x%08x, got 0x%08x", path,
                     FMT_ENDIAN_MARK, h->endian_mark);
        return FMT_ERR_ENDIAN;
    }
    if (h->version_major != FMT_VERSION_MAJOR) {
        qs_log_error(__func__, "file %s: format version %u.%u, this reader supports %d.%d "
                     "(major versions are incompatible)", path, h->version_major,
                     h->version_minor, FMT_VERSION_MAJOR, FMT_VERSION_MINOR);
        return FMT_ERR_VERSION;
    }
    if (h->header_size != FMT_HEADER_SIZE) {
        qs_log_error(__func__, "file %s: header_size: expected %d, got %u", path,
                     FMT_HEADER_SIZE, h->header_size);
        return FMT_ERR_HEADER;
    }
    if (h->checksum_algo != FMT_CHECKSUM_XXH3_64) {
        qs_log_error(__func__, "file %s: checksum_algo: expected %d (XXH3-64), got %u", path,
                     FMT_CHECKSUM_XXH3_64, h->checksum_algo);
        return FMT_ERR_HEADER;
    }
    uint64_t hh = header_hash(buf);
    if (hh != h->header_xxh3) {
        qs_log_error(__func__, "file %s: header checksum: stored %016" PRIx64 ", computed %016"
                     PRIx64, path, h->header_xxh3, hh);
        return FMT_ERR_META_CHECKSUM;
    }
    bool newer = h->version_minor > FMT_VERSION_MINOR;
    if (h->flags != 0 && !newer) {
        qs_log_error(__func__, "file %s: header flags: expected 0 (no flag defined in %d.%d), "
                     "got 0x%08x", path, FMT_VERSION_MAJOR, FMT_VERSION_MINOR, h->flags);
        return FMT_ERR_HEADER;
    }
    if (!newer && !all_zero(h->reserved, sizeof(h->reserved))) {
        qs_log_error(__func__, "file %s: reserved header bytes 84..247 must be 0 in version "
                     "%u.%u", path, h->version_major, h->version_minor);
        return FMT_ERR_HEADER;
    }
    if (file_bytes != UINT64_MAX && h->file_size != file_bytes) {
        qs_log_error(__func__, "file %s: %s: header says %" PRIu64 " bytes, file has %" PRIu64,
                     path, file_bytes < h->file_size ? "truncated" : "size mismatch",
                     h->file_size, file_bytes);
        return FMT_ERR_TRUNCATED;
    }
    if (h->world_size == 0 || h->world_size > FMT_MAX_WORLD_SIZE) {
        qs_log_error(__func__, "file %s: world_size: expected 1..%d, got %u", path,
                     FMT_MAX_WORLD_SIZE, h->world_size);
        return FMT_ERR_RANK;
    }
    if (h->tp_rank >= h->world_size) {
        qs_log_error(__func__, "file %s: tp_rank %u >= world_size %u", path, h->tp_rank,
                     h->world_size);
        return FMT_ERR_RANK;
    }
    if (h->meta_size > h->file_size) {
        qs_log_error(__func__, "file %s: meta_size %" PRIu64 " past the end of the file (%" PRIu64
                     " bytes)", path, h->meta_size, h->file_size);
        return FMT_ERR_OFFSET;
    }
    if (h->meta_size > avail) {
        qs_log_error(__func__, "file %s: truncated: metadata needs %" PRIu64 " bytes, have %"
                     PRIu64, path, h->meta_size, avail);
        return FMT_ERR_TRUNCATED;
    }
    return FMT_ERR_NONE;
}

/* --- sections ------------------------------------------------------------------------------ */

static enum fmt_err check_sections(struct fmt_shard *s, const uint8_t *buf)
{
    const char *path = s->path;
    const struct fmt_header *h = &s->hdr;
    bool newer = h->version_minor > FMT_VERSION_MINOR;
    if (h->section_entry_size < FMT_SECTION_ENTRY_SIZE ||
        h->section_entry_size > FMT_MAX_ENTRY_SIZE || h->section_entry_size % 8) {
        qs_log_error(__func__, "file %s: section_entry_size: expected a multiple of 8 in %d..%d, "
                     "got %u", path, FMT_SECTION_ENTRY_SIZE, FMT_MAX_ENTRY_SIZE,
                     h->section_entry_size);
        return FMT_ERR_SECTION;
    }
    if (h->section_count == 0 || h->section_count > FMT_MAX_SECTIONS) {
        qs_log_error(__func__, "file %s: section_count: expected 1..%d, got %u", path,
                     FMT_MAX_SECTIONS, h->section_count);
        return FMT_ERR_SECTION;
    }
    if (h->section_table_offset % FMT_SECTION_ALIGN) {
        qs_log_error(__func__, "file %s: section_table_offset %" PRIu64 " is not a multiple of %d",
                     path, h->section_table_offset, FMT_SECTION_ALIGN);
        return FMT_ERR_ALIGN;
    }
    uint64_t table_end;
    if (!add_ok(h->section_table_offset,
                (uint64_t)h->section_count * h->section_entry_size, &table_end)) {
        qs_log_error(__func__, "file %s: section table offset %" PRIu64 " + size overflows",
                     path, h->section_table_offset);
        return FMT_ERR_OVERFLOW;
    }
    if (h->section_table_offset < FMT_HEADER_SIZE || table_end > h->meta_size) {
        qs_log_error(__func__, "file %s: section table [%" PRIu64 ", %" PRIu64 ") outside the "
                     "metadata region [%d, %" PRIu64 ")", path, h->section_table_offset,
                     table_end, FMT_HEADER_SIZE, h->meta_size);
        return FMT_ERR_OFFSET;
    }
    /* Each section in [table_end, meta_size), sections pairwise disjoint. */
    for (uint32_t i = 0; i < h->section_count; i++) {
        const uint8_t *e = buf + h->section_table_offset + (uint64_t)i * h->section_entry_size;
        uint32_t kind = fmt_ld32(e), flags = fmt_ld32(e + 4);
        uint64_t off = fmt_ld64(e + 8), size = fmt_ld64(e + 16), xh = fmt_ld64(e + 24), end;
        const char *kname = fmt_section_name((enum fmt_section_kind)kind);
        char kbuf[32];
        if (!kname) {
            snprintf(kbuf, sizeof(kbuf), "kind %u", kind);
            kname = kbuf;
        }
        if (off % FMT_SECTION_ALIGN) {
            qs_log_error(__func__, "file %s: section %u (%s): offset %" PRIu64
                         " is not a multiple of %d", path, i, kname, off, FMT_SECTION_ALIGN);
            return FMT_ERR_ALIGN;
        }
        if (!add_ok(off, size, &end)) {
            qs_log_error(__func__, "file %s: section %u (%s): offset %" PRIu64 " + size %" PRIu64
                         " overflows", path, i, kname, off, size);
            return FMT_ERR_OVERFLOW;
        }
        if (off < table_end || end > h->meta_size) {
            qs_log_error(__func__, "file %s: section %u (%s): [%" PRIu64 ", %" PRIu64 ") outside "
                         "[%" PRIu64 ", meta_size %" PRIu64 ")", path, i, kname, off, end,
                         table_end, h->meta_size);
            return FMT_ERR_OFFSET;
        }
        for (uint32_t j = 0; j < i; j++) {
            const uint8_t *f = buf + h->section_table_offset + (uint64_t)j * h->section_entry_size;
            uint64_t o2 = fmt_ld64(f + 8), e2 = o2 + fmt_ld64(f + 16); /* checked above */
            if (off < e2 && o2 < end && size && e2 > o2) {
                qs_log_error(__func__, "file %s: section %u (%s) [%" PRIu64 ", %" PRIu64
                             ") overlaps section %u [%" PRIu64 ", %" PRIu64 ")", path, i, kname,
                             off, end, j, o2, e2);
                return FMT_ERR_OVERLAP;
            }
        }
        if (kind == 0 || kind >= FMT_N_SECTION_KINDS) {
            if (newer)
                continue; /* unknown kind from a newer minor: skipped */
            qs_log_error(__func__, "file %s: section %u: unknown kind %u in a version %u.%u file",
                         path, i, kind, h->version_major, h->version_minor);
            return FMT_ERR_SECTION;
        }
        if (flags && !newer) {
            qs_log_error(__func__, "file %s: section %u (%s): flags must be 0, got 0x%x", path, i,
                         kname, flags);
            return FMT_ERR_SECTION;
        }
        if (s->sec[kind].present) {
            qs_log_error(__func__, "file %s: section %s appears twice", path, kname);
            return FMT_ERR_SECTION;
        }
        uint64_t got = XXH3_64bits(buf + off, (size_t)size);
        if (got != xh) {
            qs_log_error(__func__, "file %s: section %s checksum: stored %016" PRIx64
                         ", computed %016" PRIx64, path, kname, xh, got);
            return FMT_ERR_META_CHECKSUM;
        }
        s->sec[kind] = (struct fmt_section_info){true, off, size, xh};
    }
    for (uint32_t k = 1; k < FMT_N_SECTION_KINDS; k++) {
        if (!s->sec[k].present) {
            qs_log_error(__func__, "file %s: required section %s is missing", path,
                         fmt_section_name((enum fmt_section_kind)k));
            return FMT_ERR_SECTION;
        }
    }
    /* Content rules of the JSON sections: non-empty, UTF-8, no NUL. */
    for (uint32_t k = FMT_SECTION_CONFIG; k <= FMT_SECTION_GENERATION_CONFIG; k++) {
        if (k == FMT_SECTION_TOKENIZER)
            continue;
        const uint8_t *p = buf + s->sec[k].offset;
        uint64_t n = s->sec[k].size;
        if (n == 0 || memchr(p, 0, (size_t)n) || !fmt_utf8_valid(p, (size_t)n)) {
            qs_log_error(__func__, "file %s: section %s must be non-empty UTF-8 JSON without NUL "
                         "bytes", path, fmt_section_name((enum fmt_section_kind)k));
            return FMT_ERR_SECTION;
        }
    }
    if (s->sec[FMT_SECTION_TOKENIZER].size < 8) {
        qs_log_error(__func__, "file %s: section TOKENIZER: expected at least 8 bytes, got %"
                     PRIu64, path, s->sec[FMT_SECTION_TOKENIZER].size);
        return FMT_ERR_SECTION;
    }
    return FMT_ERR_NONE;
}

/* --- tensor table -------------------------------------------------------------------------- */

static uint32_t name_slot(const struct fmt_shard *s, const char *name, size_t len, bool *found)
{
    uint32_t mask = s->name_index_cap - 1;
    uint32_t i = (uint32_t)XXH3_64bits(name, len) & mask;
    for (;;) {
        uint32_t v = s->name_index[i];
        if (v == 0) {
            *found = false;
            return i;
        }
        const char *other = s->tensors[v - 1].name;
        if (strncmp(other, name, len) == 0 && other[len] == '\0') {
            *found = true;
            return i;
        }
        i = (i + 1) & mask;
    }
}

/* Layout tag vs dtype and shape (DESIGN section 4); unknown tags are accepted here. */
static enum fmt_err check_layout(const char *path, const struct fmt_tensor *t)
{
    const char *ln = fmt_layout_name(t->layout);
    enum fmt_dtype want;
    switch (t->layout) {
    case FMT_LAYOUT_ROW_MAJOR:
        return FMT_ERR_NONE;
    case FMT_LAYOUT_W4_MMA_T16X64: want = FMT_DTYPE_Q4; break;
    case FMT_LAYOUT_S_T64: want = FMT_DTYPE_F16; break;
    case FMT_LAYOUT_Z4_T64: want = FMT_DTYPE_Q4; break;
    default:
        return FMT_ERR_NONE;
    }
    if (t->dtype != want || t->n_dims != 2) {
        qs_log_error(__func__, "file %s: tensor %s: layout %s needs dtype %s and 2 dims, got %s "
                     "and %u dims", path, t->name, ln, fmt_dtype_name(want),
                     fmt_dtype_name(t->dtype), t->n_dims);
        return FMT_ERR_LAYOUT;
    }
    uint64_t kmul = t->layout == FMT_LAYOUT_W4_MMA_T16X64 ? FMT_W4_TILE_K : 1;
    if (t->shape[0] % kmul || t->shape[1] % FMT_W4_TILE_N) {
        qs_log_error(__func__, "file %s: tensor %s: layout %s needs shape[0] %% %" PRIu64
                     " == 0 and shape[1] %% %d == 0, got [%" PRIu64 ", %" PRIu64 "]", path,
                     t->name, ln, kmul, FMT_W4_TILE_N, t->shape[0], t->shape[1]);
        return FMT_ERR_LAYOUT;
    }
    return FMT_ERR_NONE;
}

/* Entry i's name (in the pool of names_size bytes): length, inside the pool, NUL-terminated,
 * UTF-8, not seen before (s->name_index). */
static enum fmt_err entry_name(struct fmt_shard *s, uint32_t i, const uint8_t *e,
                               const uint8_t *pool, uint64_t names_size)
{
    const char *path = s->path;
    struct fmt_tensor *t = &s->tensors[i];
    uint32_t name_off = fmt_ld32(e), name_len = fmt_ld32(e + 4);
    if (name_len == 0 || name_len > FMT_NAME_MAX) {
        qs_log_error("check_table", "file %s: tensor #%u: name length %u, expected 1..%d", path,
                     i, name_len, FMT_NAME_MAX);
        return FMT_ERR_NAME;
    }
    if ((uint64_t)name_off + name_len + 1 > names_size) {
        qs_log_error("check_table", "file %s: tensor #%u: name [%u, +%u] + NUL outside the name "
                     "pool (%" PRIu64 " bytes)", path, i, name_off, name_len, names_size);
        return FMT_ERR_NAME;
    }
    const uint8_t *nm = pool + name_off;
    if (nm[name_len] != 0 || memchr(nm, 0, name_len)) {
        qs_log_error("check_table", "file %s: tensor #%u: name is not %u NUL-free bytes followed "
                     "by a NUL", path, i, name_len);
        return FMT_ERR_NAME;
    }
    if (!fmt_utf8_valid(nm, name_len)) {
        qs_log_error("check_table", "file %s: tensor #%u: name is not valid UTF-8", path, i);
        return FMT_ERR_NAME;
    }
    t->name = (const char *)nm;
    bool found;
    uint32_t slot = name_slot(s, t->name, name_len, &found);
    if (found) {
        qs_log_error("check_table", "file %s: tensor #%u: duplicate name %s (also tensor #%u)",
                     path, i, t->name, s->name_index[slot] - 1);
        return FMT_ERR_DUP_NAME;
    }
    s->name_index[slot] = i + 1;
    return FMT_ERR_NONE;
}

/* Entry fields after the name into t: dtype known, dims and shape consistent, element and byte
 * counts without overflow, size = dtype x shape, layout, split; flags and reserved 0 unless the
 * file is of a newer minor version. *end = offset + size. */
static enum fmt_err entry_fields(const struct fmt_shard *s, struct fmt_tensor *t,
                                 const uint8_t *e, uint64_t *end)
{
    const char *path = s->path;
    t->dtype = (enum fmt_dtype)fmt_ld32(e + 8);
    t->layout = (enum fmt_layout)fmt_ld32(e + 12);
    t->layout_known = fmt_layout_name(t->layout) != NULL;
    t->n_dims = fmt_ld32(e + 16);
    t->split = (enum fmt_split)fmt_ld32(e + 20);
    t->split_axis = fmt_ld32(e + 24);
    uint32_t flags = fmt_ld32(e + 28);
    for (int d = 0; d < FMT_MAX_DIMS; d++)
        t->shape[d] = fmt_ld64(e + 32 + 8 * d);
    t->offset = fmt_ld64(e + 64);
    t->size = fmt_ld64(e + 72);
    t->xxh3 = fmt_ld64(e + 80);
    uint64_t reserved = fmt_ld64(e + 88);
    if (!fmt_dtype_name(t->dtype)) {
        qs_log_error("check_table", "file %s: tensor %s: unknown dtype %u", path, t->name,
                     (unsigned)t->dtype);
        return FMT_ERR_DTYPE;
    }
    if (t->n_dims > FMT_MAX_DIMS) {
        qs_log_error("check_table", "file %s: tensor %s: n_dims %u, expected 0..%d", path,
                     t->name, t->n_dims, FMT_MAX_DIMS);
        return FMT_ERR_SHAPE;
    }
    t->numel = 1;
    for (uint32_t d = 0; d < FMT_MAX_DIMS; d++) {
        if (d >= t->n_dims) {
            if (t->shape[d] != 0) {
                qs_log_error("check_table", "file %s: tensor %s: shape[%u] = %" PRIu64 " beyond "
                             "n_dims %u, expected 0", path, t->name, d, t->shape[d], t->n_dims);
                return FMT_ERR_SHAPE;
            }
            continue;
        }
        if (t->shape[d] == 0) {
            qs_log_error("check_table", "file %s: tensor %s: shape[%u] = 0, expected >= 1", path,
                         t->name, d);
            return FMT_ERR_SHAPE;
        }
        if (t->numel > UINT64_MAX / t->shape[d]) {
            qs_log_error("check_table", "file %s: tensor %s: element count overflows u64 at "
                         "shape[%u] = %" PRIu64, path, t->name, d, t->shape[d]);
            return FMT_ERR_OVERFLOW;
        }
        t->numel *= t->shape[d];
    }
    if (t->dtype != FMT_DTYPE_Q4 && t->numel > UINT64_MAX / dtype_elem_bytes(t->dtype)) {
        qs_log_error("check_table", "file %s: tensor %s: %" PRIu64 " elements of %s overflow u64 "
                     "bytes", path, t->name, t->numel, fmt_dtype_name(t->dtype));
        return FMT_ERR_OVERFLOW;
    }
    if (!add_ok(t->offset, t->size, end)) {
        qs_log_error("check_table", "file %s: tensor %s: offset %" PRIu64 " + size %" PRIu64
                     " overflows u64", path, t->name, t->offset, t->size);
        return FMT_ERR_OVERFLOW;
    }
    uint64_t want_size = t->dtype == FMT_DTYPE_Q4 ? t->numel / 2
                                                  : t->numel * dtype_elem_bytes(t->dtype);
    if ((t->dtype == FMT_DTYPE_Q4 && t->numel % 2) || t->size != want_size) {
        qs_log_error("check_table", "file %s: tensor %s: size: expected %" PRIu64 " bytes (%s x %"
                     PRIu64 "%s), got %" PRIu64, path, t->name, want_size,
                     fmt_dtype_name(t->dtype), t->numel,
                     (t->dtype == FMT_DTYPE_Q4 && t->numel % 2) ? ", odd Q4 count" : "",
                     t->size);
        return FMT_ERR_SHAPE;
    }
    enum fmt_err err = check_layout(path, t);
    if (err)
        return err;
    if (!fmt_split_name(t->split) ||
        (t->split == FMT_SPLIT_NONE ? t->split_axis != 0 : t->split_axis >= t->n_dims)) {
        qs_log_error("check_table", "file %s: tensor %s: split %u axis %u invalid for %u dims",
                     path, t->name, (unsigned)t->split, t->split_axis, t->n_dims);
        return FMT_ERR_SPLIT;
    }
    if ((flags || reserved) && s->hdr.version_minor <= FMT_VERSION_MINOR) {
        qs_log_error("check_table", "file %s: tensor %s: flags/reserved must be 0, got 0x%x/0x%"
                     PRIx64, path, t->name, flags, reserved);
        return FMT_ERR_SECTION;
    }
    return FMT_ERR_NONE;
}

/* Placement of tensor i ending at `end`: aligned, inside the file, right after the previous
 * one (*prev_end; the metadata for the first) at the next boundary, no hole. */
static enum fmt_err entry_place(const struct fmt_shard *s, uint32_t i, const struct fmt_tensor *t,
                                uint64_t end, uint64_t *prev_end)
{
    const char *path = s->path;
    if (t->offset % FMT_ALIGN) {
        qs_log_error("check_table", "file %s: tensor %s: offset %" PRIu64 " is not a multiple "
                     "of %d", path, t->name, t->offset, FMT_ALIGN);
        return FMT_ERR_ALIGN;
    }
    if (end > s->hdr.file_size) {
        qs_log_error("check_table", "file %s: tensor %s: [%" PRIu64 ", %" PRIu64 ") past the end "
                     "of the file (%" PRIu64 " bytes)", path, t->name, t->offset, end,
                     s->hdr.file_size);
        return FMT_ERR_OFFSET;
    }
    if (t->offset < *prev_end) {
        qs_log_error("check_table", "file %s: tensor %s: offset %" PRIu64 " overlaps the %s "
                     "ending at %" PRIu64, path, t->name, t->offset,
                     i ? "previous tensor" : "metadata", *prev_end);
        return FMT_ERR_OVERLAP;
    }
    uint64_t expect = fmt_align_up(*prev_end, FMT_ALIGN);
    if (t->offset != expect) {
        qs_log_error("check_table", "file %s: tensor %s: offset: expected %" PRIu64 " (next %d-"
                     "byte boundary), got %" PRIu64, path, t->name, expect, FMT_ALIGN, t->offset);
        return FMT_ERR_OFFSET;
    }
    *prev_end = end;
    return FMT_ERR_NONE;
}

static enum fmt_err check_table(struct fmt_shard *s, const uint8_t *buf)
{
    const char *path = s->path;
    const struct fmt_section_info *sec = &s->sec[FMT_SECTION_TENSOR_TABLE];
    const uint8_t *p = buf + sec->offset;
    if (sec->size < FMT_TABLE_HEADER_SIZE) {
        qs_log_error(__func__, "file %s: TENSOR_TABLE: %" PRIu64 " bytes, expected at least %d",
                     path, sec->size, FMT_TABLE_HEADER_SIZE);
        return FMT_ERR_SECTION;
    }
    uint32_t n = fmt_ld32(p), esize = fmt_ld32(p + 4);
    uint64_t names_size = fmt_ld64(p + 8);
    if (esize < FMT_TENSOR_ENTRY_SIZE || esize > FMT_MAX_ENTRY_SIZE || esize % 8) {
        qs_log_error(__func__, "file %s: TENSOR_TABLE: entry_size: expected a multiple of 8 in "
                     "%d..%d, got %u", path, FMT_TENSOR_ENTRY_SIZE, FMT_MAX_ENTRY_SIZE, esize);
        return FMT_ERR_SECTION;
    }
    uint64_t want;
    if (!add_ok(FMT_TABLE_HEADER_SIZE + (uint64_t)n * esize, names_size, &want)) {
        qs_log_error(__func__, "file %s: TENSOR_TABLE: names_size %" PRIu64 " overflows", path,
                     names_size);
        return FMT_ERR_OVERFLOW;
    }
    if (want != sec->size) {
        qs_log_error(__func__, "file %s: TENSOR_TABLE: %u entries of %u bytes + %" PRIu64
                     " name bytes need %" PRIu64 " bytes, section has %" PRIu64, path, n, esize,
                     names_size, want, sec->size);
        return FMT_ERR_SECTION;
    }
    const uint8_t *pool = p + FMT_TABLE_HEADER_SIZE + (uint64_t)n * esize;
    s->n_tensors = n;
    if (n) {
        s->tensors = calloc(n, sizeof(*s->tensors));
        uint32_t cap = 16;
        while (cap < 2 * (uint64_t)n)
            cap *= 2;
        s->name_index = calloc(cap, sizeof(uint32_t));
        s->name_index_cap = cap;
        if (!s->tensors || !s->name_index) {
            qs_log_error(__func__, "file %s: out of memory for %u tensors", path, n);
            return FMT_ERR_NOMEM;
        }
    }
    uint64_t prev_end = s->hdr.meta_size; /* first tensor at align_up(meta_size, 4096) */
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = p + FMT_TABLE_HEADER_SIZE + (uint64_t)i * esize;
        struct fmt_tensor *t = &s->tensors[i];
        uint64_t end;
        enum fmt_err err;
        if ((err = entry_name(s, i, e, pool, names_size)) ||
            (err = entry_fields(s, t, e, &end)) || (err = entry_place(s, i, t, end, &prev_end)))
            return err;
        t->data = s->map ? s->map + t->offset : NULL;
    }
    if (prev_end != s->hdr.file_size) {
        qs_log_error(__func__, "file %s: file_size %" PRIu64 ", expected %" PRIu64 " (end of the "
                     "last tensor): trailing bytes", path, s->hdr.file_size, prev_end);
        return FMT_ERR_OFFSET;
    }
    return FMT_ERR_NONE;
}

enum fmt_err fmt_parse_meta(struct fmt_shard *s, const uint8_t *buf, uint64_t avail,
                            uint64_t file_bytes)
{
    FMT_TRY(check_header(s, buf, avail, file_bytes));
    FMT_TRY(check_sections(s, buf));
    return check_table(s, buf);
}

void fmt_shard_free_parts(struct fmt_shard *s)
{
    free(s->tensors);
    s->tensors = NULL;
    free(s->name_index);
    s->name_index = NULL;
    s->n_tensors = 0;
}

/* --- open / close -------------------------------------------------------------------------- */

enum fmt_err fmt_shard_open(const char *path, struct fmt_shard **out)
{
    enum fmt_err err = FMT_ERR_NONE;
    *out = NULL;
    struct fmt_shard *s = calloc(1, sizeof(*s));
    if (!s || !(s->path = strdup(path))) {
        free(s);
        qs_log_error(__func__, "file %s: out of memory", path);
        return FMT_ERR_NOMEM;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        qs_log_error(__func__, "file %s: cannot open: %s", path, strerror(errno));
        err = FMT_ERR_IO;
        goto out_free;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        qs_log_error(__func__, "file %s: fstat: %s", path, strerror(errno));
        err = FMT_ERR_IO;
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        qs_log_error(__func__, "file %s: not a regular file", path);
        err = FMT_ERR_IO;
        goto out_close;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    if (fsize < FMT_HEADER_SIZE) {
        /* Too small to map usefully: read what is there for the magic/size message. */
        uint8_t small[FMT_HEADER_SIZE] = {0};
        ssize_t r = pread(fd, small, sizeof(small), 0);
        if (r < 0) {
            qs_log_error(__func__, "file %s: read: %s", path, strerror(errno));
            err = FMT_ERR_IO;
            goto out_close;
        }
        err = check_header(s, small, (uint64_t)r, fsize);
        goto out_close;
    }
    void *map = mmap(NULL, (size_t)fsize, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        qs_log_error(__func__, "file %s: mmap of %" PRIu64 " bytes: %s", path, fsize,
                     strerror(errno));
        err = FMT_ERR_IO;
        goto out_close;
    }
    s->map = map;
    s->map_size = fsize;
    close(fd);
    fd = -1;
    err = fmt_parse_meta(s, s->map, fsize, fsize);
    if (err)
        goto out_free;
    *out = s;
    return FMT_ERR_NONE;

out_close:
    if (fd >= 0)
        close(fd);
out_free:
    fmt_shard_close(s);
    return err;
}

void fmt_shard_close(struct fmt_shard *s)
{
    if (!s)
        return;
    if (s->map)
        munmap((void *)s->map, (size_t)s->map_size);
    fmt_shard_free_parts(s);
    free(s->path);
    free(s);
}

/* --- accessors ----------------------------------------------------------------------------- */

const struct fmt_header *fmt_shard_header(const struct fmt_shard *s) { return &s->hdr; }
const char *fmt_shard_path(const struct fmt_shard *s) { return s->path; }
uint32_t fmt_shard_n_tensors(const struct fmt_shard *s) { return s->n_tensors; }

const struct fmt_tensor *fmt_shard_tensor(const struct fmt_shard *s, uint32_t i)
{
    return i < s->n_tensors ? &s->tensors[i] : NULL;
}

const struct fmt_tensor *fmt_shard_find(const struct fmt_shard *s, const char *name)
{
    if (!s->n_tensors || !name)
        return NULL;
    bool found;
    uint32_t slot = name_slot(s, name, strlen(name), &found);
    return found ? &s->tensors[s->name_index[slot] - 1] : NULL;
}

uint32_t fmt_shard_tensor_index(const struct fmt_shard *s, const struct fmt_tensor *t)
{
    return (uint32_t)(t - s->tensors);
}

enum fmt_err fmt_shard_section(const struct fmt_shard *s, enum fmt_section_kind kind,
                               const void **data, uint64_t *size)
{
    if ((unsigned)kind == 0 || (unsigned)kind >= FMT_N_SECTION_KINDS || !s->sec[kind].present)
        return FMT_ERR_NOT_FOUND;
    *data = s->map + s->sec[kind].offset;
    *size = s->sec[kind].size;
    return FMT_ERR_NONE;
}

enum fmt_err fmt_shard_config_json(const struct fmt_shard *s, const char **json, size_t *len)
{
    const void *d;
    uint64_t n;
    FMT_TRY(fmt_shard_section(s, FMT_SECTION_CONFIG, &d, &n));
    *json = d;
    *len = (size_t)n;
    return FMT_ERR_NONE;
}

enum fmt_err fmt_shard_generation_config_json(const struct fmt_shard *s, const char **json,
                                              size_t *len)
{
    const void *d;
    uint64_t n;
    FMT_TRY(fmt_shard_section(s, FMT_SECTION_GENERATION_CONFIG, &d, &n));
    *json = d;
    *len = (size_t)n;
    return FMT_ERR_NONE;
}

uint64_t fmt_shard_digest(const struct fmt_shard *s)
{
    return XXH3_64bits(s->map, (size_t)s->hdr.meta_size);
}

/* --- tokenizer archive --------------------------------------------------------------------- */

/* Inflate the TOKENIZER section into a malloc'ed archive of exactly its declared raw size. */
static enum fmt_err tokenizer_inflate(const struct fmt_shard *s, uint8_t **arch, uint64_t *n)
{
    const uint8_t *p = s->map + s->sec[FMT_SECTION_TOKENIZER].offset;
    uint64_t size = s->sec[FMT_SECTION_TOKENIZER].size; /* >= 8, checked at open */
    uint64_t raw = fmt_ld64(p), zsize = size - 8;
    *arch = NULL;
    if (raw < 8 || raw > FMT_TOKENIZER_MAX || zsize > UINT32_MAX ||
        raw > zsize * FMT_DEFLATE_MAX_RATIO) {
        qs_log_error(__func__, "file %s: tokenizer archive: uncompressed size %" PRIu64
                     " impossible for %" PRIu64 " compressed bytes (limit %llu)", s->path, raw,
                     zsize, (unsigned long long)FMT_TOKENIZER_MAX);
        return FMT_ERR_ZLIB;
    }
    uint8_t *out = malloc((size_t)raw);
    if (!out) {
        qs_log_error(__func__, "file %s: out of memory for a %" PRIu64 "-byte tokenizer archive",
                     s->path, raw);
        return FMT_ERR_NOMEM;
    }
    z_stream zs;
    memset(&zs, 0, sizeof(zs));
    if (inflateInit(&zs) != Z_OK) {
        free(out);
        qs_log_error(__func__, "file %s: inflateInit failed", s->path);
        return FMT_ERR_NOMEM;
    }
    /* zlib's counters are uInt: the bounds above keep both sizes below 4 GiB. */
    zs.next_in = (Bytef *)(uintptr_t)(p + 8);
    zs.avail_in = (uInt)zsize;
    zs.next_out = out;
    zs.avail_out = (uInt)raw;
    int zr = inflate(&zs, Z_FINISH);
    uint64_t produced = zs.total_out;
    uInt left_in = zs.avail_in;
    inflateEnd(&zs);
    if (zr != Z_STREAM_END || produced != raw || left_in != 0) {
        free(out);
        qs_log_error(__func__, "file %s: tokenizer archive: zlib status %d, produced %" PRIu64
                     " of %" PRIu64 " bytes, %u input bytes left over", s->path, zr, produced, raw,
                     left_in);
        return FMT_ERR_ZLIB;
    }
    *arch = out;
    *n = raw;
    return FMT_ERR_NONE;
}

/* Walk the archive: calls fn for each file until fn returns true (stop). Validates structure. */
static enum fmt_err tokenizer_walk(const struct fmt_shard *s, const uint8_t *a, uint64_t n,
                                   bool (*fn)(void *ctx, const char *name, size_t name_len,
                                              const uint8_t *data, uint64_t size),
                                   void *ctx)
{
    uint32_t n_files = fmt_ld32(a), res = fmt_ld32(a + 4);
    if (n_files > FMT_TOK_MAX_FILES || res) {
        qs_log_error(__func__, "file %s: tokenizer archive: %u files (max %d), reserved %u",
                     s->path, n_files, FMT_TOK_MAX_FILES, res);
        return FMT_ERR_ZLIB;
    }
    uint64_t pos = 8;
    for (uint32_t i = 0; i < n_files; i++) {
        if (n - pos < 16) {
            qs_log_error(__func__, "file %s: tokenizer archive: entry %u truncated", s->path, i);
            return FMT_ERR_ZLIB;
        }
        uint32_t nl = fmt_ld32(a + pos), r2 = fmt_ld32(a + pos + 4);
        uint64_t size = fmt_ld64(a + pos + 8);
        pos += 16;
        if (nl == 0 || nl > FMT_TOK_NAME_MAX || r2 || nl > n - pos || size > n - pos - nl) {
            qs_log_error(__func__, "file %s: tokenizer archive: entry %u: name length %u, size %"
                         PRIu64 " do not fit the %" PRIu64 "-byte archive", s->path, i, nl, size, n);
            return FMT_ERR_ZLIB;
        }
        const char *name = (const char *)(a + pos);
        if (memchr(name, 0, nl) || memchr(name, '/', nl) || !fmt_utf8_valid(a + pos, nl)) {
            qs_log_error(__func__, "file %s: tokenizer archive: entry %u: bad file name", s->path, i);
            return FMT_ERR_ZLIB;
        }
        if (fn && fn(ctx, name, nl, a + pos + nl, size))
            return FMT_ERR_NONE;
        pos += nl + size;
    }
    if (pos != n) {
        qs_log_error(__func__, "file %s: tokenizer archive: %" PRIu64 " trailing bytes", s->path,
                     n - pos);
        return FMT_ERR_ZLIB;
    }
    return FMT_ERR_NONE;
}

struct tok_find {
    const char *want;
    void *buf;
    size_t len;
    bool found, nomem;
};

static bool tok_find_fn(void *ctx, const char *name, size_t nl, const uint8_t *data, uint64_t size)
{
    struct tok_find *f = ctx;
    if (strlen(f->want) != nl || memcmp(f->want, name, nl) != 0)
        return false;
    f->found = true;
    f->buf = malloc((size_t)size + 1);
    if (!f->buf) {
        f->nomem = true;
        return true;
    }
    memcpy(f->buf, data, (size_t)size);
    ((char *)f->buf)[size] = '\0';
    f->len = (size_t)size;
    return true;
}

enum fmt_err fmt_shard_tokenizer_file(const struct fmt_shard *s, const char *filename,
                                      void **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    uint8_t *a;
    uint64_t n;
    FMT_TRY(tokenizer_inflate(s, &a, &n));
    struct tok_find f = {.want = filename};
    enum fmt_err err = tokenizer_walk(s, a, n, tok_find_fn, &f);
    free(a);
    if (err) {
        free(f.buf);
        return err;
    }
    if (f.nomem) {
        qs_log_error(__func__, "file %s: out of memory for tokenizer file %s", s->path, filename);
        return FMT_ERR_NOMEM;
    }
    if (!f.found)
        return FMT_ERR_NOT_FOUND;
    *buf = f.buf;
    *len = f.len;
    return FMT_ERR_NONE;
}

struct tok_list {
    void (*fn)(void *ctx, const char *name, uint64_t size);
    void *ctx;
};

static bool tok_list_fn(void *ctx, const char *name, size_t nl, const uint8_t *data, uint64_t size)
{
    (void)data;
    struct tok_list *l = ctx;
    char nbuf[FMT_TOK_NAME_MAX + 1];
    memcpy(nbuf, name, nl);
    nbuf[nl] = '\0';
    l->fn(l->ctx, nbuf, size);
    return false;
}

enum fmt_err fmt_shard_tokenizer_list(const struct fmt_shard *s,
                                      void (*fn)(void *ctx, const char *name, uint64_t size),
                                      void *ctx)
{
    uint8_t *a;
    uint64_t n;
    FMT_TRY(tokenizer_inflate(s, &a, &n));
    struct tok_list l = {fn, ctx};
    enum fmt_err err = tokenizer_walk(s, a, n, fn ? tok_list_fn : NULL, &l);
    free(a);
    return err;
}

/* --- verification -------------------------------------------------------------------------- */

enum fmt_err fmt_shard_verify_tensor(const struct fmt_shard *s, uint32_t i)
{
    if (i >= s->n_tensors) {
        qs_log_error(__func__, "file %s: tensor index %u >= %u tensors", s->path, i, s->n_tensors);
        return FMT_ERR_NOT_FOUND;
    }
    const struct fmt_tensor *t = &s->tensors[i];
    /* Hot path of `qshard verify`: one sequential pass over the mapping. */
    madvise((void *)((uintptr_t)t->data & ~(uintptr_t)(FMT_ALIGN - 1)), (size_t)t->size,
            MADV_SEQUENTIAL);
    uint64_t got = XXH3_64bits(t->data, (size_t)t->size);
    if (got != t->xxh3) {
        qs_log_error(__func__, "file %s: tensor %s: checksum mismatch: stored %016" PRIx64
                     ", computed %016" PRIx64, s->path, t->name, t->xxh3, got);
        return FMT_ERR_CHECKSUM;
    }
    return FMT_ERR_NONE;
}

enum fmt_err fmt_shard_verify_all(const struct fmt_shard *s, fmt_progress_fn progress, void *ctx)
{
    enum fmt_err first = FMT_ERR_NONE, err;
    uint64_t total = 0, done = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++)
        total += s->tensors[i].size;
    uint64_t prev_end = s->hdr.meta_size;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const struct fmt_tensor *t = &s->tensors[i];
        if (!all_zero(s->map + prev_end, t->offset - prev_end)) {
            qs_log_error(__func__, "file %s: non-zero padding in [%" PRIu64 ", %" PRIu64
                         ") before tensor %s", s->path, prev_end, t->offset, t->name);
            if (!first)
                first = FMT_ERR_PADDING;
        }
        err = fmt_shard_verify_tensor(s, i);
        if (err && !first)
            first = err;
        prev_end = t->offset + t->size;
        done += t->size;
        if (progress)
            progress(ctx, i + 1, s->n_tensors, done, total);
    }
    err = fmt_shard_tokenizer_list(s, NULL, NULL);
    if (err && !first)
        first = err;
    return first;
}

void fmt_model_id_hex(const uint8_t id[16], char out[33]) { hex16(id, out); }

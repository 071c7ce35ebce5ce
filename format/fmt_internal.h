/*
 * fmt_internal.h - shared between format/fmt.c (reader), fmt_write.c and fmt_manifest.c only;
 * not a public header. Little-endian load/store helpers, the struct behind struct fmt_shard,
 * and the one metadata validator that both the reader and the writer run (so the writer can
 * never produce a file the reader rejects).
 */
#ifndef QS_FMT_INTERNAL_H
#define QS_FMT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fmt.h" /* struct fmt_header, fmt_tensor, enum fmt_err */

/* --- little-endian helpers: explicit byte order, independent of the host ------------------ */

static inline uint16_t fmt_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t fmt_ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t fmt_ld64(const uint8_t *p)
{
    return (uint64_t)fmt_ld32(p) | (uint64_t)fmt_ld32(p + 4) << 32;
}
static inline void fmt_st16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void fmt_st32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void fmt_st64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t fmt_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Sizes of the 1.0 structures on disk. */
#define FMT_SECTION_ENTRY_SIZE 32
#define FMT_TABLE_HEADER_SIZE  16
#define FMT_TENSOR_ENTRY_SIZE  96
#define FMT_N_SECTION_KINDS    5 /* known kinds are 1..4 */

/* Tokenizer archive (before compression), SPEC.md section 5.2:
 * u32 n_files, u32 reserved(0), then per file: u32 name_len, u32 reserved(0), u64 size,
 * name bytes (no NUL), content bytes. */
#define FMT_TOK_MAX_FILES    64
#define FMT_TOK_NAME_MAX     255
#define FMT_DEFLATE_MAX_RATIO 1032 /* zlib's bound on the expansion of a deflate stream */

struct fmt_section_info {
    bool present;
    uint64_t offset, size, xxh3;
};

struct fmt_shard {
    char *path;                   /* owned */
    const uint8_t *map;           /* owned mapping (NULL while the writer self-checks) */
    uint64_t map_size;
    struct fmt_header hdr;        /* decoded */
    struct fmt_section_info sec[FMT_N_SECTION_KINDS]; /* by kind */
    uint32_t n_tensors;
    struct fmt_tensor *tensors;   /* owned, [n_tensors] */
    uint32_t *name_index;         /* owned open-addressing table of tensor index + 1 (0 empty) */
    uint32_t name_index_cap;      /* power of two >= 2 * n_tensors */
};

/*
 * Validate the metadata in buf[0, avail) (avail >= meta_size is required, else TRUNCATED) and
 * fill s (hdr, sec, tensors, name_index). `file_bytes` is the actual file size, checked against
 * the header, or UINT64_MAX to skip that check (writer self-check). Tensor data pointers are
 * set only when s->map is non-NULL. On error s may be partly filled: fmt_shard_free_parts().
 */
enum fmt_err fmt_parse_meta(struct fmt_shard *s, const uint8_t *buf, uint64_t avail,
                            uint64_t file_bytes);
void fmt_shard_free_parts(struct fmt_shard *s);

/* Strict UTF-8 (no overlongs, surrogates or code points > U+10FFFF). */
bool fmt_utf8_valid(const uint8_t *p, size_t n);

/* 32 lowercase hex digits + NUL. */
void fmt_model_id_hex(const uint8_t id[16], char out[33]);

/* Encode the header into 256 bytes, computing header_xxh3. */
void fmt_header_encode(const struct fmt_header *h, uint8_t out[FMT_HEADER_SIZE]);

#endif /* QS_FMT_INTERNAL_H */

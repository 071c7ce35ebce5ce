/*
 * fmt.h - the .qshard file format: reader, checksums, manifest (public header of format/).
 *
 * A .qshard file holds everything one tensor-parallel rank needs: the model config (JSON), the
 * original tokenizer files (zlib archive), the generation config (JSON) and every tensor of that
 * rank, each aligned to 4096 bytes so it can be mmapped and DMA'd as is. format/SPEC.md is the
 * normative byte layout; this header repeats its tables next to the structs that implement them.
 *
 * Who calls it: convert/ writes files through fmt_write.h; runtime/ maps them with
 * fmt_shard_open() (or fmt_model_open() for a directory of ranks); tools/cmd_inspect.c prints and
 * verifies them. kernels/ includes this header only for the layout constants.
 *
 * Ownership: struct fmt_shard owns the read-only mapping; every pointer handed out (tensor
 * names, tensor data, section data, the header) is borrowed from it and dies with
 * fmt_shard_close(). fmt_shard_tokenizer_file() returns malloc'ed memory the caller frees.
 *
 * Errors: every function that can fail returns enum fmt_err and, where the failure is detected,
 * reports it once through qs_log_error() naming the file, tensor, expected and actual values.
 * A failed open leaves *out NULL and leaks nothing. Files are hostile: fmt_shard_open() checks
 * every count, offset, size, alignment and overflow before anything is used, and does
 * O(header + tensor table) work: it never touches tensor data (fmt_shard_verify_*() does).
 *
 * Threads: an open shard is immutable; every reader function may be called on it from several
 * threads at once. The mapping is MAP_SHARED: if another process truncates the file while it is
 * mapped, touching the lost pages raises SIGBUS (files are written once under a temp name and
 * renamed, so this only happens if someone edits them in place).
 *
 * Test: ./build/test_fmt (round trips, SPEC.md hex dump, enumerated corrupt files);
 * fuzz: make fuzz (tests/fuzz_fmt.c).
 */
#ifndef QS_FMT_H
#define QS_FMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* --- constants ------------------------------------------------------------------------------ */

#define FMT_MAGIC             "QSHARD\r\n" /* 8 bytes, no NUL on disk */
#define FMT_VERSION_MAJOR     1
#define FMT_VERSION_MINOR     0
#define FMT_ENDIAN_MARK       0x01020304u  /* on disk: 04 03 02 01 */
#define FMT_HEADER_SIZE       256
#define FMT_CHECKSUM_XXH3_64  1            /* XXH3_64bits(), seed 0, xxHash >= 0.8.0 */
#define FMT_ALIGN             4096         /* every tensor's file offset is a multiple of this */
#define FMT_SECTION_ALIGN     8            /* every section's file offset is a multiple of this */
#define FMT_MAX_DIMS          4
#define FMT_NAME_MAX          1024         /* tensor name bytes, without the NUL */
#define FMT_MAX_WORLD_SIZE    4096
#define FMT_MAX_SECTIONS      256
#define FMT_MAX_ENTRY_SIZE    4096         /* bound on stored entry sizes (newer minors grow them) */
#define FMT_TOKENIZER_MAX     (1ull << 30) /* bound on the uncompressed tokenizer archive */

/* Packed int4 layout tiles (docs/DESIGN.md section 4): shared with kernels/. */
#define FMT_W4_TILE_K         16
#define FMT_W4_TILE_N         64
#define FMT_W4_TILE_BYTES     512          /* 16 x 64 codes, 4 bits each */

/* --- errors --------------------------------------------------------------------------------- */

/* X(name, value, description): values are stable and never reused. */
#define FMT_ERR_LIST(X)                                                              \
    X(NONE, 0, "ok")                                                                 \
    X(IO, 1, "I/O or system error")                                                  \
    X(MAGIC, 2, "not a .qshard file (bad magic)")                                    \
    X(VERSION, 3, "unsupported format version")                                      \
    X(ENDIAN, 4, "wrong byte order")                                                 \
    X(TRUNCATED, 5, "file size does not match the header (truncated?)")              \
    X(OVERFLOW, 6, "integer overflow in an offset, size or shape")                   \
    X(ALIGN, 7, "misaligned offset")                                                 \
    X(OFFSET, 8, "offset out of bounds or out of order")                             \
    X(OVERLAP, 9, "overlapping regions")                                             \
    X(DUP_NAME, 10, "duplicate tensor name")                                         \
    X(DTYPE, 11, "unknown dtype")                                                    \
    X(SHAPE, 12, "bad shape, or size does not match dtype and shape")                \
    X(CHECKSUM, 13, "tensor checksum mismatch")                                      \
    X(RANK, 14, "bad tp_rank or world_size")                                         \
    X(SECTION, 15, "bad, missing or duplicate section")                              \
    X(NAME, 16, "bad tensor name")                                                   \
    X(NOT_FOUND, 17, "not found")                                                    \
    X(MANIFEST, 18, "bad or missing manifest")                                       \
    X(MISSING_RANK, 19, "a rank file is missing")                                    \
    X(RANK_MISMATCH, 20, "rank files do not belong together")                        \
    X(NOMEM, 21, "out of memory")                                                    \
    X(ZLIB, 22, "bad compressed tokenizer archive")                                  \
    X(HEADER, 23, "bad header field")                                                \
    X(META_CHECKSUM, 24, "header or section checksum mismatch")                      \
    X(LAYOUT, 25, "layout tag inconsistent with dtype or shape")                     \
    X(SPLIT, 26, "bad tensor-parallel split")                                        \
    X(DIGEST, 27, "rank file size or digest differs from the manifest")              \
    X(PADDING, 28, "non-zero padding bytes")                                         \
    X(ARG, 29, "invalid argument")                                                   \
    X(STATE, 30, "call out of order")                                                \
    X(INCOMPLETE, 31, "not every tensor was fully written")

enum fmt_err {
#define FMT_ERR_ENUM_(name, value, desc) FMT_ERR_##name = value,
    FMT_ERR_LIST(FMT_ERR_ENUM_)
#undef FMT_ERR_ENUM_
};

/* Forward a failure: `FMT_TRY(fmt_shard_section(...));` inside a function returning fmt_err. */
#define FMT_TRY(expr)                                                                \
    do {                                                                             \
        enum fmt_err fmt_try_err_ = (expr);                                          \
        if (fmt_try_err_ != FMT_ERR_NONE)                                            \
            return fmt_try_err_;                                                     \
    } while (0)

/* "FMT_ERR_CHECKSUM: tensor checksum mismatch"-style text; never NULL. */
const char *fmt_err_str(enum fmt_err err);
/* The bare name, e.g. "CHECKSUM"; "?" for unknown values. */
const char *fmt_err_name(enum fmt_err err);

/* --- dtypes, layouts, splits ---------------------------------------------------------------- */

/* Element types. Values are stable; a retired value stays here as a comment. */
enum fmt_dtype {
    FMT_DTYPE_F32 = 1,
    FMT_DTYPE_F16 = 2,
    FMT_DTYPE_BF16 = 3,
    FMT_DTYPE_I32 = 4,
    FMT_DTYPE_I16 = 5,
    FMT_DTYPE_U8 = 6,
    FMT_DTYPE_U32 = 7,
    FMT_DTYPE_Q4 = 16, /* packed 4-bit codes, two per byte: size = numel / 2 (numel even) */
};

/*
 * Layout tags: how a tensor's bytes are ordered. The registry is format/SPEC.md section 7
 * (definitions copied from docs/DESIGN.md section 4). A reader that meets an unknown tag opens
 * the file, reports the tensor with layout_known = false, and a runtime must refuse to use it.
 */
enum fmt_layout {
    FMT_LAYOUT_ROW_MAJOR = 1,      /* C order over shape[0..n_dims-1], any dtype */
    FMT_LAYOUT_W4_MMA_T16X64 = 16, /* Q4 qweight [K, N]: 16x64 mma tiles (DESIGN 4.1) */
    FMT_LAYOUT_S_T64 = 17,         /* F16 scales [K/G, N] stored [N/64][K/G][64] (DESIGN 4.2) */
    FMT_LAYOUT_Z4_T64 = 18,        /* Q4 qzeros [K/G, N] stored [N/64][K/G][8] u32 (DESIGN 4.3) */
};

/* The tensor-parallel split that produced this rank's slice (informational; shapes are per rank). */
enum fmt_split {
    FMT_SPLIT_NONE = 0,   /* replicated (or tp = 1) */
    FMT_SPLIT_COLUMN = 1, /* output features divided across ranks along split_axis */
    FMT_SPLIT_ROW = 2,    /* input features divided across ranks along split_axis */
    FMT_SPLIT_VOCAB = 3,  /* vocabulary rows divided across ranks along split_axis (padded) */
};

/* Section kinds. Unknown kinds in a file of a newer minor version are skipped. */
enum fmt_section_kind {
    FMT_SECTION_CONFIG = 1,            /* UTF-8 JSON: the model config (DESIGN section 6) */
    FMT_SECTION_TOKENIZER = 2,         /* u64 raw size + zlib stream of a tokenizer archive */
    FMT_SECTION_GENERATION_CONFIG = 3, /* UTF-8 JSON, "{}" when the model has none */
    FMT_SECTION_TENSOR_TABLE = 4,      /* struct fmt_table_header, entries, name pool */
};

/* Bytes of `numel` elements of `dtype`; 0 for an unknown dtype, an odd Q4 count, or overflow. */
size_t fmt_dtype_size_bytes(enum fmt_dtype dtype, uint64_t numel);
/* "F32", "Q4", ...; NULL for an unknown value (callers print the number). */
const char *fmt_dtype_name(enum fmt_dtype dtype);
/* "ROW_MAJOR", "W4_MMA_T16X64", ...; NULL for an unknown tag. */
const char *fmt_layout_name(enum fmt_layout layout);
/* "none", "column", "row", "vocab"; NULL for an unknown value. */
const char *fmt_split_name(enum fmt_split split);
/* "CONFIG", "TOKENIZER", ...; NULL for an unknown kind. */
const char *fmt_section_name(enum fmt_section_kind kind);

/* --- on-disk structures (little-endian; decoded field by field, so host order does not matter) */

/*
 * Header, SPEC.md section 4 (copy of its table; keep the two identical):
 *
 * OFFSET SIZE TYPE     FIELD                 DESCRIPTION
 *      0    8 u8[8]    magic                 "QSHARD\r\n" (51 53 48 41 52 44 0d 0a)
 *      8    2 u16      version_major         1; a reader rejects any other major
 *     10    2 u16      version_minor         0; a newer minor opens (unknown parts ignored)
 *     12    4 u32      endian_mark           0x01020304 (bytes 04 03 02 01)
 *     16    4 u32      header_size           256
 *     20    4 u32      flags                 no flag defined: MUST be 0
 *     24    4 u32      tp_rank               0 <= tp_rank < world_size
 *     28    4 u32      world_size            1..4096
 *     32    8 u64      file_size             total file size in bytes
 *     40   16 u8[16]   model_id              same in every rank of one conversion
 *     56    8 u64      section_table_offset  256 in files written by 1.0
 *     64    4 u32      section_count         1..256
 *     68    4 u32      section_entry_size    >= 32 (32 in 1.0)
 *     72    8 u64      meta_size             bytes [0, meta_size) = header, section table, sections
 *     80    4 u32      checksum_algo         1 = XXH3-64 (XXH3_64bits, seed 0)
 *     84  164 u8[164]  reserved              MUST be 0 (ignored if version_minor > reader's)
 *    248    8 u64      header_xxh3           XXH3-64 of bytes 0..255 with this field zeroed
 */
struct fmt_header {
    uint8_t  magic[8];
    uint16_t version_major;
    uint16_t version_minor;
    uint32_t endian_mark;
    uint32_t header_size;
    uint32_t flags;
    uint32_t tp_rank;
    uint32_t world_size;
    uint64_t file_size;
    uint8_t  model_id[16];
    uint64_t section_table_offset;
    uint32_t section_count;
    uint32_t section_entry_size;
    uint64_t meta_size;
    uint32_t checksum_algo;
    uint8_t  reserved[164];
    uint64_t header_xxh3;
};

/*
 * Section table entry, SPEC.md section 5 (section_entry_size bytes each; these are the first 32):
 *
 * OFFSET SIZE TYPE FIELD   DESCRIPTION
 *      0    4 u32  kind    enum fmt_section_kind
 *      4    4 u32  flags   MUST be 0
 *      8    8 u64  offset  absolute file offset, multiple of 8, inside [table end, meta_size)
 *     16    8 u64  size    bytes
 *     24    8 u64  xxh3    XXH3-64 of the section's bytes
 */
struct fmt_section_entry {
    uint32_t kind;
    uint32_t flags;
    uint64_t offset;
    uint64_t size;
    uint64_t xxh3;
};

/*
 * TENSOR_TABLE section, SPEC.md section 6: this 16-byte header, then n_tensors entries of
 * entry_size bytes (struct fmt_tensor_entry is the first 96), then names_size bytes of names.
 *
 * OFFSET SIZE TYPE FIELD       DESCRIPTION
 *      0    4 u32  n_tensors   number of entries
 *      4    4 u32  entry_size  >= 96 (96 in 1.0)
 *      8    8 u64  names_size  bytes of the name pool that follows the entries
 */
struct fmt_table_header {
    uint32_t n_tensors;
    uint32_t entry_size;
    uint64_t names_size;
};

/*
 * Tensor table entry (first 96 bytes):
 *
 * OFFSET SIZE TYPE    FIELD        DESCRIPTION
 *      0    4 u32     name_offset  into the name pool; the name is followed by one NUL byte
 *      4    4 u32     name_len     bytes, 1..1024, UTF-8, no NUL
 *      8    4 u32     dtype        enum fmt_dtype
 *     12    4 u32     layout       enum fmt_layout (unknown tags allowed, see above)
 *     16    4 u32     n_dims       0..4
 *     20    4 u32     split        enum fmt_split
 *     24    4 u32     split_axis   < n_dims when split != NONE, else 0
 *     28    4 u32     flags        MUST be 0
 *     32   32 u64[4]  shape        per-rank shape; entries >= n_dims are 0, the others >= 1
 *     64    8 u64     offset       absolute file offset, multiple of 4096
 *     72    8 u64     size         bytes = fmt_dtype_size_bytes(dtype, product of shape)
 *     80    8 u64     xxh3         XXH3-64 (seed 0) of the tensor's bytes
 *     88    8 u64     reserved     MUST be 0
 */
struct fmt_tensor_entry {
    uint32_t name_offset;
    uint32_t name_len;
    uint32_t dtype;
    uint32_t layout;
    uint32_t n_dims;
    uint32_t split;
    uint32_t split_axis;
    uint32_t flags;
    uint64_t shape[FMT_MAX_DIMS];
    uint64_t offset;
    uint64_t size;
    uint64_t xxh3;
    uint64_t reserved;
};

#if defined(__cplusplus)
#define FMT_STATIC_ASSERT_ static_assert
#else
#define FMT_STATIC_ASSERT_ _Static_assert
#endif
FMT_STATIC_ASSERT_(sizeof(struct fmt_header) == FMT_HEADER_SIZE, "header is 256 bytes");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, version_major) == 8, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, endian_mark) == 12, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, header_size) == 16, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, tp_rank) == 24, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, file_size) == 32, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, model_id) == 40, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, section_table_offset) == 56, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, section_count) == 64, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, meta_size) == 72, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, checksum_algo) == 80, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, reserved) == 84, "SPEC.md section 4");
FMT_STATIC_ASSERT_(offsetof(struct fmt_header, header_xxh3) == 248, "SPEC.md section 4");
FMT_STATIC_ASSERT_(sizeof(struct fmt_section_entry) == 32, "SPEC.md section 5");
FMT_STATIC_ASSERT_(offsetof(struct fmt_section_entry, xxh3) == 24, "SPEC.md section 5");
FMT_STATIC_ASSERT_(sizeof(struct fmt_table_header) == 16, "SPEC.md section 6");
FMT_STATIC_ASSERT_(sizeof(struct fmt_tensor_entry) == 96, "SPEC.md section 6");
FMT_STATIC_ASSERT_(offsetof(struct fmt_tensor_entry, shape) == 32, "SPEC.md section 6");
FMT_STATIC_ASSERT_(offsetof(struct fmt_tensor_entry, offset) == 64, "SPEC.md section 6");
FMT_STATIC_ASSERT_(offsetof(struct fmt_tensor_entry, xxh3) == 80, "SPEC.md section 6");
FMT_STATIC_ASSERT_(offsetof(struct fmt_tensor_entry, reserved) == 88, "SPEC.md section 6");

/* --- reader --------------------------------------------------------------------------------- */

struct fmt_shard; /* an open, validated, read-only mapped rank file */

/* One tensor of an open shard: a decoded, validated copy of its table entry. */
struct fmt_tensor {
    const char *name;              /* borrowed: mapping; NUL-terminated UTF-8 */
    enum fmt_dtype dtype;
    enum fmt_layout layout;
    bool layout_known;             /* false: unknown tag; a runtime must refuse the tensor */
    uint32_t n_dims;               /* 0..4 */
    uint64_t shape[FMT_MAX_DIMS];  /* per-rank shape; shape[i] = 0 for i >= n_dims */
    uint64_t numel;                /* product of shape (1 for n_dims = 0) */
    enum fmt_split split;
    uint32_t split_axis;
    uint64_t offset;               /* absolute file offset, multiple of FMT_ALIGN */
    uint64_t size;                 /* bytes */
    uint64_t xxh3;                 /* stored XXH3-64 of the bytes */
    const void *data;              /* borrowed: mapping; size bytes, 4096-aligned */
};

/*
 * Map `path` read-only and validate header, section table, sections (and their checksums) and
 * the tensor table (SPEC.md section 8 lists every check). Never touches tensor data.
 * Returns FMT_ERR_NONE and *out, or an error with *out = NULL: FMT_ERR_IO (cannot open/map),
 * MAGIC, VERSION, ENDIAN, HEADER, META_CHECKSUM, TRUNCATED, RANK, SECTION, OVERFLOW, ALIGN,
 * OFFSET, OVERLAP, NAME, DUP_NAME, DTYPE, SHAPE, LAYOUT, SPLIT, NOMEM.
 */
enum fmt_err fmt_shard_open(const char *path, struct fmt_shard **out);
/* Unmap and free; NULL is fine. Every pointer borrowed from the shard dies here. */
void fmt_shard_close(struct fmt_shard *s);

/* The decoded header (host byte order). */
const struct fmt_header *fmt_shard_header(const struct fmt_shard *s);
/* The path the shard was opened with. */
const char *fmt_shard_path(const struct fmt_shard *s);
uint32_t fmt_shard_n_tensors(const struct fmt_shard *s);
/* Tensor i in table (= file) order; NULL if i >= n_tensors. */
const struct fmt_tensor *fmt_shard_tensor(const struct fmt_shard *s, uint32_t i);
/* The tensor named `name`, or NULL (no error is logged: absence is often expected). O(1). */
const struct fmt_tensor *fmt_shard_find(const struct fmt_shard *s, const char *name);
/* Index of a tensor pointer returned by fmt_shard_tensor/find. */
uint32_t fmt_shard_tensor_index(const struct fmt_shard *s, const struct fmt_tensor *t);

/* Raw bytes of a section (borrowed). FMT_ERR_NOT_FOUND if the file has none of that kind. */
enum fmt_err fmt_shard_section(const struct fmt_shard *s, enum fmt_section_kind kind,
                               const void **data, uint64_t *size);
/* The model config JSON (borrowed, NOT NUL-terminated: use len). */
enum fmt_err fmt_shard_config_json(const struct fmt_shard *s, const char **json, size_t *len);
/* The generation config JSON (borrowed, not NUL-terminated; "{}" when the model had none). */
enum fmt_err fmt_shard_generation_config_json(const struct fmt_shard *s, const char **json,
                                              size_t *len);
/*
 * Decompress the tokenizer archive and return a malloc'ed copy of file `filename` (e.g.
 * "tokenizer.json"), plus one NUL byte after the content (not counted in *len) so text files
 * can be used as C strings. The caller frees *buf. FMT_ERR_NOT_FOUND if the archive has no such
 * file (not logged), FMT_ERR_ZLIB for a corrupt archive, FMT_ERR_NOMEM.
 */
enum fmt_err fmt_shard_tokenizer_file(const struct fmt_shard *s, const char *filename,
                                      void **buf, size_t *len);
/*
 * Names and sizes of the files in the tokenizer archive, for listing: calls fn once per file in
 * archive order. FMT_ERR_ZLIB for a corrupt archive.
 */
enum fmt_err fmt_shard_tokenizer_list(const struct fmt_shard *s,
                                      void (*fn)(void *ctx, const char *name, uint64_t size),
                                      void *ctx);

/*
 * XXH3-64 of the bytes [0, meta_size): header, section table and every section, including the
 * tensor table and so every tensor hash. The manifest stores it as the rank's digest.
 */
uint64_t fmt_shard_digest(const struct fmt_shard *s);

/* Recompute tensor i's XXH3-64 and compare: FMT_ERR_CHECKSUM (logged with file, tensor, both
 * hashes) or FMT_ERR_NOT_FOUND for a bad index. Reads the tensor's bytes (page faults). */
enum fmt_err fmt_shard_verify_tensor(const struct fmt_shard *s, uint32_t i);

/* Progress callback of fmt_shard_verify_all: after each tensor. */
typedef void (*fmt_progress_fn)(void *ctx, uint32_t tensors_done, uint32_t n_tensors,
                                uint64_t bytes_done, uint64_t bytes_total);
/*
 * Verify every tensor checksum, that every padding byte is zero, and that the tokenizer archive
 * decompresses. Checks everything, logging each failure once, and returns the first failure:
 * FMT_ERR_CHECKSUM, FMT_ERR_PADDING, FMT_ERR_ZLIB. `progress` may be NULL.
 */
enum fmt_err fmt_shard_verify_all(const struct fmt_shard *s, fmt_progress_fn progress, void *ctx);

/* --- manifest and multi-rank directories ---------------------------------------------------- */

#define FMT_MANIFEST_NAME "manifest.json"

/* Writes "rank-K-of-N.qshard" into buf (at least 64 bytes). */
void fmt_rank_file_name(char *buf, size_t n, uint32_t rank, uint32_t world_size);

struct fmt_manifest_rank {
    uint32_t rank;
    char *file;      /* owned; a plain file name inside the manifest's directory */
    uint64_t size;   /* bytes */
    uint64_t digest; /* fmt_shard_digest() of that file */
};

struct fmt_manifest {
    uint8_t model_id[16];
    uint32_t world_size;
    struct fmt_manifest_rank *ranks; /* owned; [world_size], ranks[k].rank == k */
};

/*
 * Write dir/manifest.json for the finished rank files dir/rank-K-of-N.qshard, K = 0..N-1:
 * opens each (validating it), checks they belong together (same model_id and world_size, rank K
 * in file K), and records size and digest. Written to a temp name, fsync'd, renamed.
 * Errors: those of fmt_shard_open, MISSING_RANK, RANK_MISMATCH, IO, NOMEM.
 */
enum fmt_err fmt_manifest_write(const char *dir, uint32_t world_size);
/* Parse and validate dir/manifest.json into *out (fmt_manifest_free). FMT_ERR_MANIFEST for a
 * missing or malformed manifest, FMT_ERR_MISSING_RANK when a rank has no entry. */
enum fmt_err fmt_manifest_load(const char *dir, struct fmt_manifest **out);
void fmt_manifest_free(struct fmt_manifest *m);

/*
 * Open rank `rank` of the model in `dir` and check it against the manifest: the file exists
 * (else FMT_ERR_MISSING_RANK), opens, has the manifest's size and digest (FMT_ERR_DIGEST) and its
 * header's model_id, world_size and tp_rank match (FMT_ERR_RANK_MISMATCH). For a runtime process
 * that serves one rank. O(header) like fmt_shard_open.
 */
enum fmt_err fmt_manifest_open_rank(const char *dir, uint32_t rank, struct fmt_shard **out);

struct fmt_model; /* every rank of one converted model, opened together */

/* Open every rank of dir as fmt_manifest_open_rank does and check they belong together.
 * Reports every problem it finds, returns the first. */
enum fmt_err fmt_model_open(const char *dir, struct fmt_model **out);
void fmt_model_close(struct fmt_model *m); /* NULL ok */
const struct fmt_manifest *fmt_model_manifest(const struct fmt_model *m);
uint32_t fmt_model_world_size(const struct fmt_model *m);
const struct fmt_shard *fmt_model_shard(const struct fmt_model *m, uint32_t rank);

#ifdef __cplusplus
}
#endif
#endif /* QS_FMT_H */

/*
 * rt_io.h - small file helpers of the runtime's commands: float32 .npy write/read, whole-file
 * read, and parsing of token-id lists ("1,2,3").
 *
 * Who calls it: tools/cmd_*.c (`qshard logits` writes .npy, `perplexity` reads its text
 * file, `--tokens` lists), tests/test_cli_*.c and tests/test_sample.c style tests (read the .npy
 * goldens). Every function reports a failure once through qs_log_error (file name and numbers)
 * and returns an enum rt_io_err; out-parameters are NULL / 0 on error. Buffers returned through
 * out-parameters are malloc'd and owned by the caller (free()).
 *
 * .npy: NumPy format version 1.0 as specified in numpy/lib/format.py and NEP 1 ("A Simple File
 * Format for NumPy Arrays"): the 6-byte magic "\x93NUMPY", major/minor version bytes, a
 * little-endian uint16 header length (uint32 for versions 2.0 and 3.0), then an ASCII Python
 * dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (T, V), } padded with spaces
 * and ended by '\n' so that the data starts at a multiple of 64 bytes; then the C-order data.
 *
 * Test: ./build/test_io
 */
#ifndef QS_RT_IO_H
#define QS_RT_IO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_IO_ERR_LIST(X)                                                    \
    X(RT_IO_ERR_NONE, 0, "ok")                                               \
    X(RT_IO_ERR_OPEN, 1, "cannot open file")                                 \
    X(RT_IO_ERR_READ, 2, "read failed")                                      \
    X(RT_IO_ERR_WRITE, 3, "write failed")                                    \
    X(RT_IO_ERR_FORMAT, 4, "malformed or unsupported .npy file")             \
    X(RT_IO_ERR_NOMEM, 5, "out of memory")                                   \
    X(RT_IO_ERR_PARSE, 6, "malformed token-id list")                         \
    X(RT_IO_ERR_TOO_BIG, 7, "file or list too large")

enum rt_io_err {
#define RT_IO_X_ENUM(name, value, msg) name = value,
    RT_IO_ERR_LIST(RT_IO_X_ENUM)
#undef RT_IO_X_ENUM
};

/* Stable message for a status ("unknown error" for a value not in the list). */
const char *rt_io_err_str(enum rt_io_err e);

/* Write data [rows, cols] float32 (C order) to `path` as a version 1.0 .npy file with
 * descr '<f4' (little-endian on every host). Written to "<path>.tmp.<pid>", fsync'd, renamed.
 * Errors: RT_IO_ERR_OPEN, RT_IO_ERR_WRITE (disk full, ...), RT_IO_ERR_TOO_BIG (header or size
 * overflow). rows or cols may be 0. */
enum rt_io_err rt_npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols);

/* Parse a float32 .npy image buf [len bytes] (versions 1.0-3.0, descr '<f4' only,
 * fortran_order False, shape of 1 or 2 dims; a 1-d shape (n,) reads as rows = 1, cols = n;
 * the data must be exactly rows*cols*4 bytes). `name` labels messages. *data = malloc'd
 * [rows * cols]. Errors: RT_IO_ERR_FORMAT (bad magic, version, header syntax, dtype, order,
 * dims, size), RT_IO_ERR_NOMEM. */
enum rt_io_err rt_npy_parse_f32(const void *buf, size_t len, const char *name, float **data,
                                int64_t *rows, int64_t *cols);

/* Largest .npy file rt_npy_read_f32 reads (it holds the file and the floats at once). */
#define RT_NPY_READ_MAX (4ull << 30)

/* Read a .npy file as rt_npy_parse_f32 does. Errors: RT_IO_ERR_OPEN, RT_IO_ERR_READ, those of
 * rt_npy_parse_f32 (a file over RT_NPY_READ_MAX is RT_IO_ERR_FORMAT). */
/* Write data[len] to path atomically: a temp name in the same directory, fsync, rename (the
 * old file stays until the new one is complete). Errors: RT_IO_ERR_OPEN, RT_IO_ERR_WRITE,
 * RT_IO_ERR_NOMEM. */
enum rt_io_err rt_file_write(const char *path, const void *data, size_t len);

enum rt_io_err rt_npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols);

/* Read a whole file (at most `max_len` bytes, else RT_IO_ERR_TOO_BIG); *buf = malloc'd copy
 * with a NUL after the content (not counted in *len). Errors: RT_IO_ERR_OPEN, RT_IO_ERR_READ,
 * RT_IO_ERR_TOO_BIG, RT_IO_ERR_NOMEM. */
enum rt_io_err rt_file_read(const char *path, size_t max_len, char **buf, size_t *len);

/* Parse a list of non-negative decimal token ids separated by commas and/or whitespace
 * ("1,2,3", "1 2 3", "[1, 2, 3]" - one optional pair of brackets), each < 2^31; *ids = malloc'd
 * [*n] (n >= 1). Errors: RT_IO_ERR_PARSE (empty list, sign, non-digit, overflow: the offending
 * position is reported), RT_IO_ERR_NOMEM. */
enum rt_io_err rt_ids_parse(const char *text, int32_t **ids, size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_IO_H */

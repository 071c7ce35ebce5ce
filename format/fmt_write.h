/*
 * fmt_write.h - streaming writer of one .qshard rank file (format/SPEC.md).
 *
 * Who calls it: convert/ (one writer per rank, tensors written from several threads), tests,
 * and `qshard bench synth`. The whole model is never held in memory: tensors are declared up
 * front (name, dtype, layout, shape), then their bytes are written one at a time, or in chunks,
 * straight to their final offsets.
 *
 * Sequence:
 *   fmt_writer_open(final_path, &opts, &w)           creates final_path.tmp
 *   fmt_writer_set_section(w, FMT_SECTION_CONFIG, json, len)         (required)
 *   fmt_writer_set_section(w, FMT_SECTION_GENERATION_CONFIG, ...)    (optional, default "{}")
 *   fmt_writer_set_tokenizer_files(w, names, datas, sizes, n)        (optional, default empty)
 *   fmt_writer_add_tensor(w, name, dtype, layout, n_dims, shape, split, axis, &index)  per tensor
 *   fmt_writer_begin_data(w)                         fixes every offset; sections frozen
 *   fmt_writer_put_tensor(w, index, data, size)      any order, any thread
 *     or fmt_writer_put_tensor_part(w, index, offset_in_tensor, data, n)  chunks in order
 *   fmt_writer_finish(w)                             header + table, fsync, rename, fsync dir
 *
 * Failure: nothing half-written survives. fmt_writer_finish() frees the writer whether it
 * succeeds or not (on failure it removes the temp file); fmt_writer_abort() removes the temp file
 * and frees the writer at any earlier point (NULL ok). After either, the pointer is dead.
 * A put that fails marks the writer failed: finish then refuses (returns the first error).
 *
 * Errors: enum fmt_err (fmt.h), reported once via qs_log_error with the file and tensor name.
 * Test: ./build/test_fmt.
 */
#ifndef QS_FMT_WRITE_H
#define QS_FMT_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "fmt.h" /* enum fmt_err, fmt_dtype, fmt_layout, fmt_split, fmt_section_kind */

#ifdef __cplusplus
extern "C" {
#endif

struct fmt_writer;

struct fmt_writer_opts {
    uint32_t tp_rank;     /* 0 <= tp_rank < world_size */
    uint32_t world_size;  /* 1..FMT_MAX_WORLD_SIZE */
    uint8_t model_id[16]; /* identical for every rank of one conversion (e.g. random) */
};

/* Create final_path.tmp (truncating a stale one). FMT_ERR_IO (message names the path and
 * errno), FMT_ERR_RANK for bad rank/world_size, FMT_ERR_ARG, FMT_ERR_NOMEM. *out NULL on error. */
enum fmt_err fmt_writer_open(const char *final_path, const struct fmt_writer_opts *opts,
                             struct fmt_writer **out);

/* Copy the content of the CONFIG or GENERATION_CONFIG section (UTF-8 JSON, no NUL bytes).
 * Before begin_data only (FMT_ERR_STATE). FMT_ERR_ARG for other kinds or a NUL byte. */
enum fmt_err fmt_writer_set_section(struct fmt_writer *w, enum fmt_section_kind kind,
                                    const void *data, size_t size);

/* Build and zlib-compress the tokenizer archive from n files (plain names such as
 * "tokenizer.json": no '/', unique, 1..255 bytes). n = 0 gives an empty archive. FMT_ERR_ARG,
 * FMT_ERR_ZLIB, FMT_ERR_NOMEM, FMT_ERR_STATE (after begin_data). */
enum fmt_err fmt_writer_set_tokenizer_files(struct fmt_writer *w, const char *const *names,
                                            const void *const *datas, const size_t *sizes,
                                            uint32_t n);

/*
 * Declare a tensor: its per-rank shape[n_dims] (n_dims 0..4, every dim >= 1), dtype, layout tag
 * (must be a known one and consistent: W4_MMA_T16X64 is Q4 [K, N] with K % 16 == 0 and
 * N % 64 == 0; S_T64 is F16 [K/G, N], Z4_T64 is Q4 [K/G, N], both with N % 64 == 0), and the TP
 * split applied (axis < n_dims unless FMT_SPLIT_NONE, then 0). *index receives its index, which
 * is also its position in the file. Errors: NAME, DUP_NAME, DTYPE, SHAPE, LAYOUT, SPLIT,
 * OVERFLOW, STATE (after begin_data), NOMEM.
 */
enum fmt_err fmt_writer_add_tensor(struct fmt_writer *w, const char *name, enum fmt_dtype dtype,
                                   enum fmt_layout layout, uint32_t n_dims,
                                   const uint64_t *shape, enum fmt_split split,
                                   uint32_t split_axis, uint32_t *index);

/* Fix every section and tensor offset, and reserve the whole file on disk (fallocate, so a full
 * disk fails here; padding reads as zero). FMT_ERR_SECTION if no CONFIG was set, FMT_ERR_IO
 * (e.g. not enough space), FMT_ERR_STATE. */
enum fmt_err fmt_writer_begin_data(struct fmt_writer *w);

/* Bytes of tensor `index` as declared (after begin_data). */
uint64_t fmt_writer_tensor_size(const struct fmt_writer *w, uint32_t index);

/*
 * Write all `size` bytes of tensor `index` at its offset and record their XXH3-64.
 * Thread-safe: several threads may write different tensors at once, in any order.
 * Errors: ARG (bad index, size != declared size), STATE (before begin_data, or the tensor was
 * already written or is being written), IO.
 */
enum fmt_err fmt_writer_put_tensor(struct fmt_writer *w, uint32_t index, const void *data,
                                   size_t size);

/*
 * Write n bytes of tensor `index` starting at byte offset_in_tensor. The chunks of one tensor
 * must come in order (offset_in_tensor = bytes written so far) and not concurrently; different
 * tensors may be written from different threads. The hash is streamed (XXH3 state per tensor).
 * Errors as fmt_writer_put_tensor, plus FMT_ERR_ARG for an out-of-order or oversized chunk.
 */
enum fmt_err fmt_writer_put_tensor_part(struct fmt_writer *w, uint32_t index,
                                        uint64_t offset_in_tensor, const void *data, size_t n);

/*
 * Check every tensor was fully written (FMT_ERR_INCOMPLETE naming the first one missing), write
 * header, section table, sections and tensor table, fsync, rename to final_path, fsync the
 * directory. Frees w in every case; on failure the temp file is removed.
 */
enum fmt_err fmt_writer_finish(struct fmt_writer *w);

/* Remove the temp file and free w. Safe at any point; NULL ok. */
void fmt_writer_abort(struct fmt_writer *w);

#ifdef __cplusplus
}
#endif
#endif /* QS_FMT_WRITE_H */

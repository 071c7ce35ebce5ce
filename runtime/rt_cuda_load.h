/*
 * rt_cuda_load.h - inside the CUDA backend (rt_cuda.cu): a rank file's data region onto its
 * GPU (rt_cuda_load.cu). Not a public header: rt.h declares rt_cuda_h2d_rate.
 */
#ifndef QS_RT_CUDA_LOAD_H
#define QS_RT_CUDA_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "rt.h" /* enum rt_err */

/* Reader threads of the upload when QSHARD_UPLOAD_THREADS is not set (docs/BENCHMARKS.md
 * "Load": the page cache -> pinned rate stops growing there on the 16-core GPU host). */
#define RT_CUDA_UPLOAD_THREADS 8

/*
 * Copy bytes of the file `path` from file offset file_off (mapped at src) into device memory
 * dst on GPU `device`: reader threads, pinned staging, one stream each (rt_cuda_load.cu says
 * how; QSHARD_UPLOAD_THREADS / QSHARD_UPLOAD_SRC choose). mapped_header: the file's first 256
 * bytes as mapped when it was opened; a file read by path must still begin with them. -v logs
 * seconds and GB/s. Errors (reported here with the rank): RT_ERR_IO (the file cannot be opened
 * or read, or was replaced since it was opened), RT_ERR_DEVICE (a CUDA call failed).
 */
enum rt_err rt_cuda_upload_region(int rank, int device, const char *path,
                                  const unsigned char *mapped_header, const unsigned char *src,
                                  uint64_t file_off, unsigned char *dst, size_t bytes);

#endif /* QS_RT_CUDA_LOAD_H */

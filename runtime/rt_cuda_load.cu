/*
 * rt_cuda_load.cu - a rank file's weights onto its GPU, and the pinned host->device rate that
 * bounds it (`qshard bench load`).
 *
 * rt_cuda_upload_region copies the file's data region [file_off, file_off + bytes) into device
 * memory with n reader threads (QSHARD_UPLOAD_THREADS, 1..32, default RT_CUDA_UPLOAD_THREADS);
 * thread i takes the 16 MiB chunks i, i + n, ... Each has its own stream and two pinned
 * staging buffers (one cudaHostAlloc), so its next read overlaps its previous copy. The source
 * (QSHARD_UPLOAD_SRC, docs/BENCHMARKS.md "Load" measured each):
 *   pread    (default) pread() of the file into the pinned buffer: the page cache copies
 *            straight into it, no page-table work for the mapping;
 *   mmap     memcpy from the file's mapping (what qshard did before 2026-12-07): every 4 KiB
 *            page of the mapping is faulted in by the reader;
 *   register cudaHostRegister of the mapping (read-only), then cudaMemcpyAsync straight from
 *            it: no staging copy, but the pages are pinned first (the registration is timed);
 *   direct   pread() with O_DIRECT into the pinned buffer: the disk's DMA lands in it, the page
 *            cache is bypassed (for a cold cache; a warm one is not used). Reads are rounded up
 *            to 4 KiB (tensor offsets are 4 KiB-aligned, FMT_ALIGN); a file system without
 *            O_DIRECT falls back to pread.
 * Never cudaMemcpy from pageable memory: 7x slower on the H200 machine.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "qs_log.h"  /* qs_log_error, qs_log_debug */
#include "qs_util.h" /* qs_now_s */
#include "rt_cuda_load.h"

#define STAGE_BYTES ((size_t)16 << 20) /* >= 16 MiB per copy runs at ~55 GB/s pinned */
#define MAX_THREADS 32

enum upload_src { SRC_PREAD, SRC_MMAP, SRC_REGISTER, SRC_DIRECT };

struct upload_job {
    const unsigned char *src; /* the mapping of the region (mmap, register) */
    int fd;                   /* the file (pread) */
    uint64_t file_off;        /* file offset of src[0] */
    unsigned char *dst;       /* device */
    size_t bytes;
    int device, slot, n_slots;
    enum upload_src mode;
    double read_s;            /* time in pread / memcpy (page cache or disk) */
    char err[256];
};

/* Read len bytes at off into p (short reads continued); with O_DIRECT (direct) the request is
 * len rounded up to 4 KiB, and the file may end inside that rounding. Returns errno, 0 on
 * success. */
static int pread_full(int fd, unsigned char *p, size_t len, uint64_t off, bool direct)
{
    size_t want = direct ? (len + 4095) & ~(size_t)4095 : len;
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, p + got, want - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? errno : EIO; /* 0: the file is shorter than its table says */
        got += (size_t)n;
    }
    return 0;
}

static void *upload_worker(void *arg)
{
    struct upload_job *j = static_cast<struct upload_job *>(arg);
    cudaStream_t st = NULL;
    unsigned char *pin = NULL;
    cudaEvent_t done[2] = {NULL, NULL};
    int rerr = 0;
    cudaError_t e = cudaSetDevice(j->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e == cudaSuccess && j->mode != SRC_REGISTER)
        e = cudaHostAlloc(reinterpret_cast<void **>(&pin), 2 * STAGE_BYTES, cudaHostAllocDefault);
    for (int b = 0; b < 2 && e == cudaSuccess; ++b)
        e = cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming);
    int k = 0;
    for (size_t c = (size_t)j->slot; e == cudaSuccess && !rerr && c * STAGE_BYTES < j->bytes;
         c += (size_t)j->n_slots, k ^= 1) {
        const size_t off = c * STAGE_BYTES;
        const size_t len = j->bytes - off < STAGE_BYTES ? j->bytes - off : STAGE_BYTES;
        if (j->mode == SRC_REGISTER) {
            e = cudaMemcpyAsync(j->dst + off, j->src + off, len, cudaMemcpyHostToDevice, st);
            continue;
        }
        e = cudaEventSynchronize(done[k]); /* buffer k's previous copy has finished */
        if (e != cudaSuccess) break;
        unsigned char *buf = pin + (size_t)k * STAGE_BYTES;
        const double t0 = qs_now_s();
        if (j->mode == SRC_PREAD || j->mode == SRC_DIRECT)
            rerr = pread_full(j->fd, buf, len, j->file_off + off, j->mode == SRC_DIRECT);
        else
            memcpy(buf, j->src + off, len);
        j->read_s += qs_now_s() - t0;
        if (rerr) break;
        e = cudaMemcpyAsync(j->dst + off, buf, len, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaEventRecord(done[k], st);
    }
    if (e == cudaSuccess && st) e = cudaStreamSynchronize(st);
    if (rerr)
        snprintf(j->err, sizeof j->err, "upload worker %d: reading the file: %s", j->slot,
                 strerror(rerr));
    else if (e != cudaSuccess)
        snprintf(j->err, sizeof j->err, "upload worker %d on GPU %d: %s", j->slot, j->device,
                 cudaGetErrorString(e));
    for (int b = 0; b < 2; ++b)
        if (done[b]) cudaEventDestroy(done[b]);
    if (pin) cudaFreeHost(pin);
    if (st) cudaStreamDestroy(st);
    return NULL;
}

/* The environment's choice of threads and source (unknown values: the default, warned). */
static void upload_config(int *threads, enum upload_src *mode)
{
    *threads = RT_CUDA_UPLOAD_THREADS;
    *mode = SRC_PREAD;
    const char *t = getenv("QSHARD_UPLOAD_THREADS"), *m = getenv("QSHARD_UPLOAD_SRC");
    if (t && *t) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v < 1 || v > MAX_THREADS)
            qs_log_warn("QSHARD_UPLOAD_THREADS=%s is not in 1..%d: %d threads", t, MAX_THREADS,
                        *threads);
        else
            *threads = (int)v;
    }
    if (m && *m) {
        if (!strcmp(m, "pread")) *mode = SRC_PREAD;
        else if (!strcmp(m, "mmap")) *mode = SRC_MMAP;
        else if (!strcmp(m, "register")) *mode = SRC_REGISTER;
        else if (!strcmp(m, "direct")) *mode = SRC_DIRECT;
        else qs_log_warn("QSHARD_UPLOAD_SRC=%s is not pread, mmap, register or direct: pread", m);
    }
}

enum rt_err rt_cuda_upload_region(int rank, int device, const char *path,
                                  const unsigned char *mapped_header, const unsigned char *src,
                                  uint64_t file_off, unsigned char *dst, size_t bytes)
{
    static const char *const names[] = {"pread", "mmap", "register", "direct"};
    int n_threads;
    enum upload_src mode;
    upload_config(&n_threads, &mode);
    const size_t n_chunks = (bytes + STAGE_BYTES - 1) / STAGE_BYTES;
    if ((size_t)n_threads > n_chunks) n_threads = n_chunks ? (int)n_chunks : 1;
    const double t0 = qs_now_s();
    int fd = -1;
    enum rt_err ret = RT_ERR_NONE;
    const unsigned char *reg = NULL; /* the page-aligned start of a registered range */
    size_t reg_len = 0;
    if (mode == SRC_PREAD || mode == SRC_DIRECT) {
        /* the file read must be the one whose table placed the tensors: its header (file
         * size, model_id, header hash) equal to the mapping's */
        fd = open(path, O_RDONLY | O_CLOEXEC);
        unsigned char h[256];
        if (fd < 0 || pread_full(fd, h, sizeof h, 0, false) != 0 || memcmp(h, mapped_header, 256)) {
            qs_log_error(__func__, "rank %d: %s %s", rank, path,
                         fd < 0 ? strerror(errno) : "was replaced or changed since it was opened");
            if (fd >= 0) close(fd);
            return RT_ERR_IO;
        }
        if (mode == SRC_DIRECT) {
            close(fd);
            fd = -1;
        }
    }
    if (mode == SRC_DIRECT) {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd < 0) {
            qs_log_warn("rank %d: %s: O_DIRECT: %s; reading through the page cache", rank, path,
                        strerror(errno));
            mode = SRC_PREAD;
        }
    }
    if (mode == SRC_PREAD) {
        if (fd < 0) fd = open(path, O_RDONLY | O_CLOEXEC); /* after an O_DIRECT refusal */
        if (fd < 0) {
            qs_log_error(__func__, "rank %d: %s: %s", rank, path, strerror(errno));
            return RT_ERR_IO;
        }
        (void)posix_fadvise(fd, (off_t)file_off, (off_t)bytes, POSIX_FADV_SEQUENTIAL);
    } else if (mode == SRC_REGISTER) {
        const long page = sysconf(_SC_PAGESIZE);
        const uintptr_t a = reinterpret_cast<uintptr_t>(src) & ~(uintptr_t)(page - 1);
        reg = reinterpret_cast<const unsigned char *>(a);
        reg_len = (size_t)(reinterpret_cast<uintptr_t>(src) - a) + bytes;
        cudaError_t ce = cudaHostRegister(const_cast<unsigned char *>(reg), reg_len,
                                          cudaHostRegisterReadOnly);
        if (ce != cudaSuccess) {
            qs_log_error(__func__, "rank %d: cudaHostRegister of the %.3f GB mapping of %s: %s",
                         rank, reg_len / 1e9, path, cudaGetErrorString(ce));
            return RT_ERR_DEVICE;
        }
    }
    const double t1 = qs_now_s();
    struct upload_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int i = 0; i < n_threads; ++i) {
        jobs[i] = upload_job{src, fd, file_off, dst, bytes, device, i, n_threads, mode, 0.0, {0}};
        started[i] = pthread_create(&th[i], NULL, upload_worker, &jobs[i]) == 0;
        if (!started[i]) upload_worker(&jobs[i]); /* no thread: do its share here */
    }
    double read_s = 0;
    const char *err = NULL;
    for (int i = 0; i < n_threads; ++i) {
        if (started[i]) pthread_join(th[i], NULL);
        read_s += jobs[i].read_s;
        if (jobs[i].err[0] && !err) err = jobs[i].err;
    }
    cudaSetDevice(device);
    const double t2 = qs_now_s();
    if (err) {
        qs_log_error(__func__, "rank %d: %s", rank, err);
        ret = strstr(err, "reading the file") ? RT_ERR_IO : RT_ERR_DEVICE;
    } else {
        qs_log_debug("rank %d on GPU %d: weights %.3f GB read + upload %.3f s (%.1f GB/s; %s, "
                     "%d threads, %zu MiB chunks; %.3f thread-s reading = %.1f GB/s per "
                     "thread%s%.3f s)", rank, device, bytes / 1e9, t2 - t1,
                     bytes / 1e9 / (t2 - t1), names[mode], n_threads, STAGE_BYTES >> 20, read_s,
                     read_s > 0 ? bytes / 1e9 / read_s : 0.0,
                     mode == SRC_REGISTER ? "; cudaHostRegister " : "; open ", t1 - t0);
    }
    if (reg) cudaHostUnregister(const_cast<unsigned char *>(reg));
    if (fd >= 0) close(fd);
    return ret;
}

enum rt_err rt_cuda_h2d_rate(int device, size_t bytes, size_t chunk, int repeat, double *gbps)
{
    *gbps = 0;
    if (bytes == 0 || chunk == 0 || repeat < 1) {
        qs_log_error(__func__, "bytes, chunk and repeat must be positive");
        return RT_ERR_ARG;
    }
    void *h = NULL, *d = NULL;
    cudaStream_t st = NULL;
    enum rt_err ret = RT_ERR_NONE;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaHostAlloc(&h, bytes, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaMalloc(&d, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e == cudaSuccess) memset(h, 1, bytes); /* touched: no first-use cost in the timing */
    double best = 0;
    for (int r = 0; r <= repeat && e == cudaSuccess; ++r) { /* r = 0: warm-up */
        const double t0 = qs_now_s();
        for (size_t off = 0; off < bytes && e == cudaSuccess; off += chunk)
            e = cudaMemcpyAsync(static_cast<char *>(d) + off, static_cast<char *>(h) + off,
                                bytes - off < chunk ? bytes - off : chunk,
                                cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        const double g = bytes / 1e9 / (qs_now_s() - t0);
        if (r > 0 && g > best) best = g;
    }
    if (e != cudaSuccess) {
        qs_log_error(__func__, "GPU %d: pinned host->device copy of %.3f GB: %s", device,
                     bytes / 1e9, cudaGetErrorString(e));
        ret = RT_ERR_DEVICE;
    } else {
        *gbps = best;
    }
    if (st) cudaStreamDestroy(st);
    if (d) cudaFree(d);
    if (h) cudaFreeHost(h);
    return ret;
}

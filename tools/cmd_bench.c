/*
 * cmd_bench.c - `qshard bench ...`: format benchmarks, and the entry to the kernel benchmarks.
 *
 *   qshard bench synth FILE --size-mb N [--tensor-mb M | --tensors N]
 *                                            write a synthetic .qshard (the writer, chunked
 *                                            puts) of M MiB tensors (default 64) or of N equal
 *                                            tensors; report write GB/s
 *   qshard bench open FILE [--repeat N]                    open+validate+close time (min, median)
 *   qshard bench verify FILE [--repeat N] [--cold]         plain read() of the file vs
 *                                                           fmt_shard_verify_all, GB/s, same run
 *   qshard bench kernel ...                                 kernels (bench_kernel_main)
 *   qshard bench model MODEL [-p 512] [-n 128] [-d 0] [-r 5]  prompt / generation tokens/s of a
 *                                                           converted model (cmd_bench_model)
 *   qshard bench load MODEL [--cold]                        process start -> first token, with
 *                                                           the read and copy ceilings (cmd_bench_load)
 *
 * --cold drops the file's pages from the page cache (posix_fadvise DONTNEED, this file only)
 * before every timed pass, so both passes read from the disk. tools/bench_cpu.sh (`make bench`)
 * drives these; docs/BENCHMARKS.md records the numbers.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h> /* XXH3_64bits: in-memory hash speed, the ceiling for verify */

#include "cli.h"       /* cli_parse: the option table */
#include "cmd.h"       /* QS_EXIT_*, cmd_bench_model */
#include "k_bench.h"   /* bench_kernel_main */
#include "fmt.h"       /* fmt_shard_open, fmt_shard_verify_all */
#include "fmt_write.h" /* fmt_writer_* */
#include "qs_log.h"    /* qs_log_error */
#include "qs_util.h"   /* qs_now_s */

static int exit_for(enum fmt_err e)
{
    if (e == FMT_ERR_NONE)
        return QS_EXIT_OK;
    return (e == FMT_ERR_IO || e == FMT_ERR_NOMEM) ? QS_EXIT_IO : QS_EXIT_BAD_INPUT;
}


static const char k_usage[] =
    "usage: qshard bench synth FILE --size-mb N [--tensor-mb M | --tensors N]\n"
    "       qshard bench open FILE [--repeat N]\n"
    "       qshard bench verify FILE [--repeat N] [--cold]\n"
    "       qshard bench kernel ...   (qshard bench kernel --help)\n"
    "       qshard bench model MODEL [-p 512] [-n 128] [-d 0] ...   (qshard bench model --help)\n"
    "       qshard bench batch MODEL [--concurrency 1,8,64] ...     (qshard bench batch --help)\n"
    "       qshard bench load MODEL [--cold] [-r 3] [--device cpu|cuda]   (qshard bench load --help)\n"
    "       qshard bench serve [--url http://127.0.0.1:8000] ...    (qshard bench serve --help)\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad file, 3 runtime failure (GPU, memory), 4 I/O error\n";

/* --- synth --------------------------------------------------------------------------------- */

#define SYNTH_CHUNK (4u << 20)

static int bench_synth(const char *path, uint64_t size_mb, uint64_t tensor_mb, uint32_t n_tensors)
{
    uint64_t total = size_mb << 20, tsize = tensor_mb << 20;
    uint32_t n = (uint32_t)((total + tsize - 1) / tsize);
    if (n_tensors) { /* a fixed count (e.g. a real model's), sizes from the total */
        n = n_tensors;
        tsize = (total + n - 1) / n;
        if (tsize * (n - 1) >= total) {
            return cli_usage_error("%u tensors do not fit %" PRIu64 " MiB", n, size_mb);
        }
    }
    struct fmt_writer_opts o = {0, 1, {0}};
    for (int i = 0; i < 16; i++)
        o.model_id[i] = (uint8_t)(0xA0 + i);
    struct fmt_writer *w;
    enum fmt_err e = fmt_writer_open(path, &o, &w);
    if (e)
        return exit_for(e);
    uint64_t *buf = malloc(SYNTH_CHUNK);
    if (!buf) {
        fmt_writer_abort(w);
        return QS_EXIT_IO;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < SYNTH_CHUNK / 8; i++) { /* xorshift64: incompressible bytes */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = x;
    }
    static const char cfg[] = "{\"qshard_config_version\":1,\"architecture\":\"synthetic\"}";
    e = fmt_writer_set_section(w, FMT_SECTION_CONFIG, cfg, sizeof(cfg) - 1);
    for (uint32_t i = 0; i < n && !e; i++) {
        char name[64];
        uint64_t sz = i + 1 < n ? tsize : total - (uint64_t)i * tsize;
        snprintf(name, sizeof(name), "synthetic.%05u.weight", i);
        e = fmt_writer_add_tensor(w, name, FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 1, &sz,
                                  FMT_SPLIT_NONE, 0, NULL);
    }
    double t0 = qs_now_s();
    if (!e)
        e = fmt_writer_begin_data(w);
    for (uint32_t i = 0; i < n && !e; i++) {
        uint64_t sz = fmt_writer_tensor_size(w, i);
        for (uint64_t off = 0; off < sz && !e; off += SYNTH_CHUNK) {
            buf[0] = i;
            buf[1] = off; /* no two chunks alike */
            size_t c = sz - off < SYNTH_CHUNK ? (size_t)(sz - off) : SYNTH_CHUNK;
            e = fmt_writer_put_tensor_part(w, i, off, buf, c);
        }
    }
    free(buf);
    if (e) {
        fmt_writer_abort(w);
        return exit_for(e);
    }
    e = fmt_writer_finish(w);
    double dt = qs_now_s() - t0;
    if (e)
        return exit_for(e);
    printf("synth: %s: %u tensors, %" PRIu64 " MiB, written+fsync'd in %.2f s (%.2f GB/s)\n", path,
           n, size_mb, dt, (double)total / dt / 1e9);
    return QS_EXIT_OK;
}

/* --- open ---------------------------------------------------------------------------------- */

static int bench_open(const char *path, int repeat)
{
    double *t = calloc((size_t)repeat, sizeof(double));
    uint64_t size = 0;
    uint32_t n = 0;
    if (!t)
        return QS_EXIT_IO;
    for (int r = 0; r < repeat; r++) {
        struct fmt_shard *s;
        double t0 = qs_now_s();
        enum fmt_err e = fmt_shard_open(path, &s);
        if (!e) {
            size = fmt_shard_header(s)->file_size;
            n = fmt_shard_n_tensors(s);
        }
        fmt_shard_close(s);
        t[r] = qs_now_s() - t0;
        if (e) {
            free(t);
            return exit_for(e);
        }
    }
    qsort(t, (size_t)repeat, sizeof(double), cli_cmp_double);
    printf("open: %s: %.3f GiB, %u tensors: open+validate+close min %.1f us, median %.1f us "
           "(%d runs)\n", path, (double)size / (1 << 30), n, t[0] * 1e6, t[repeat / 2] * 1e6,
           repeat);
    free(t);
    return QS_EXIT_OK;
}

/* --- verify vs read ------------------------------------------------------------------------ */

#define READ_BUF (8u << 20)

static int bench_verify(const char *path, int repeat, bool cold)
{
    uint8_t *buf = malloc(READ_BUF);
    if (!buf)
        return QS_EXIT_IO;
    double best_read = 1e30, best_verify = 1e30, best_hash = 1e30;
    int64_t bytes = 0;
    uint64_t data_bytes = 0;
    int rc = QS_EXIT_OK;
    /* XXH3 over a buffer already in cache: the ceiling verify can reach */
    memset(buf, 0x5A, READ_BUF);
    for (int r = 0; r < 5; r++) {
        double t0 = qs_now_s();
        volatile uint64_t h = 0;
        for (int k = 0; k < 32; k++)
            h ^= XXH3_64bits(buf, READ_BUF);
        (void)h;
        double dt = qs_now_s() - t0;
        best_hash = dt < best_hash ? dt : best_hash;
    }
    for (int r = 0; r < repeat; r++) {
        if (cold)
            cli_drop_page_cache(path);
        double t0 = qs_now_s();
        bytes = cli_read_through(path, buf, READ_BUF);
        double dt = qs_now_s() - t0;
        if (bytes < 0) {
            rc = QS_EXIT_IO;
            goto out;
        }
        best_read = dt < best_read ? dt : best_read;

        if (cold)
            cli_drop_page_cache(path);
        struct fmt_shard *s;
        t0 = qs_now_s();
        enum fmt_err e = fmt_shard_open(path, &s);
        if (!e)
            e = fmt_shard_verify_all(s, NULL, NULL);
        if (s)
            data_bytes = fmt_shard_header(s)->file_size - fmt_shard_header(s)->meta_size;
        fmt_shard_close(s);
        dt = qs_now_s() - t0;
        if (e) {
            rc = exit_for(e);
            goto out;
        }
        best_verify = dt < best_verify ? dt : best_verify;
    }
    double rd = (double)bytes / best_read / 1e9, vf = (double)bytes / best_verify / 1e9;
    printf("verify: %s: %.3f GiB (%s page cache, best of %d)\n", path, (double)bytes / (1 << 30),
           cold ? "cold" : "warm", repeat);
    printf("  plain read()        %8.3f s  %6.2f GB/s\n", best_read, rd);
    printf("  open+verify_all     %8.3f s  %6.2f GB/s  (%.0f%% of read; %" PRIu64 " data bytes)\n",
           best_verify, vf, 100.0 * vf / rd, data_bytes);
    printf("  XXH3 in memory                 %6.2f GB/s  (hash ceiling, 8 MiB buffer)\n",
           32.0 * READ_BUF / best_hash / 1e9);
out:
    free(buf);
    return rc;
}

/* --- dispatch ------------------------------------------------------------------------------ */

int cmd_bench(int argc, char **argv)
{
    static const struct {
        const char *name, *prog;
        unsigned cmd;
    } subs[] = {
        {"synth", "qshard bench synth", CLI_BENCH_SYNTH},
        {"open", "qshard bench open", CLI_BENCH_OPEN},
        {"verify", "qshard bench verify", CLI_BENCH_VERIFY},
    };
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(k_usage, argc < 2 ? stderr : stdout);
        fprintf(argc < 2 ? stderr : stdout, "%s", k_trailer);
        return argc < 2 ? QS_EXIT_USAGE : QS_EXIT_OK;
    }
    if (!strcmp(argv[1], "kernel")) {
        qs_log_set_prog("qshard bench kernel");
        return bench_kernel_main(argc - 1, argv + 1);
    }
    if (!strcmp(argv[1], "model"))
        return cmd_bench_model(argc - 1, argv + 1);
    if (!strcmp(argv[1], "batch"))
        return cmd_bench_batch(argc - 1, argv + 1);
    if (!strcmp(argv[1], "load"))
        return cmd_bench_load(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve"))
        return cmd_bench_serve(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        if (strcmp(argv[1], subs[i].name))
            continue;
        struct cli_args a;
        int rc = cli_parse(subs[i].cmd, subs[i].prog, k_usage, k_trailer, argc - 1, argv + 1,
                           &a);
        if (rc)
            return rc == CLI_HELP ? QS_EXIT_OK : rc;
        if (a.n_pos != 1)
            return cli_usage_error("expected one FILE argument, got %d", a.n_pos);
        if (subs[i].cmd == CLI_BENCH_SYNTH && a.size_mb == 0)
            return cli_usage_error("--size-mb N (1..16777216) is required");
        if (subs[i].cmd == CLI_BENCH_SYNTH)
            return bench_synth(a.pos[0], (uint64_t)a.size_mb, (uint64_t)a.tensor_mb,
                               (uint32_t)a.n_tensors);
        if (subs[i].cmd == CLI_BENCH_OPEN)
            return bench_open(a.pos[0], (int)a.repeat);
        return bench_verify(a.pos[0], (int)a.repeat, a.cold);
    }
    fprintf(stderr, "qshard bench: unknown benchmark '%s'\n", argv[1]);
    fputs(k_usage, stderr);
    return QS_EXIT_USAGE;
}

/*
 * cmd_bench_load.c - `qshard bench load MODEL [--cold] [-r 3] [--device cpu|cuda]`: how long a
 * user waits for the first token, beside the two ceilings of loading, all in one run:
 *
 *   read   the model's rank files read() start to end in 16 MiB pieces on one thread (the
 *          file's sequential read rate: from the page cache, or with --cold from the disk);
 *   h2d    the GPU's pinned host->device copy rate (rt_cuda_h2d_rate: 1 GiB in 64 MiB
 *          copies, best of 3), with --device cuda, measured after the starts so that this
 *          process holds no CUDA context while they run;
 *   start  -r times: this program is started again as `qshard run MODEL --tokens 1 -n 1
 *          --temp 0 --no-echo --print-ids -v [--device D]` (fork + exec of /proc/self/exe),
 *          timed from before the fork to the first byte of its output (the id, printed and
 *          flushed before the model is freed) and to its exit. With --cold the rank files are
 *          dropped from the page cache (posix_fadvise DONTNEED: no root needed) before each start.
 *          The child's -v timing lines (CUDA start, device allocation, read + upload, model open)
 *          are printed from the last start, and its upload rate is set against h2d (warm) or
 *          against read (cold).
 *
 * The page cache is warm for the warm rows because the read row reads every file first.
 * docs/BENCHMARKS.md "Load" has the numbers; tools/bench_load_gpu.sh adds the Hugging Face
 * baseline (safetensors + torch onto the GPU) in the same call.
 *
 * Test: ./build/test_cli_model (usage errors, the rows on the CPU backend).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cmd.h"
#include "qs_util.h" /* qs_now_s */

#define LOAD_MAX_RANKS 64
#define LOAD_READ_CHUNK ((size_t)16 << 20)
#define LOAD_LOG_MAX (64u << 10)

static const char k_usage[] =
    "usage: qshard bench load MODEL [--cold] [-r 3] [--device cpu|cuda]\n"
    "\n"
    "Process start to first token of `qshard run MODEL` (started -r times as a child process,\n"
    "one token id in, one out), beside the sequential read rate of the model's rank files\n"
    "and, on cuda, the pinned host-to-device copy rate, all measured in this run. --cold\n"
    "drops the rank files from the page cache before each read and start.\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad input (model file), 3 runtime failure (GPU), 4 I/O\n"
    "error; a child run that fails gives its own code\n";

/* The model's rank files (a directory through its manifest, or one TP-1 file). */
static int rank_paths(const char *model, char paths[][4096], int *n)
{
    struct stat st;
    *n = 0;
    if (stat(model, &st) != 0) {
        qs_log_error(__func__, "%s: %s", model, strerror(errno));
        return QS_EXIT_IO;
    }
    if (!S_ISDIR(st.st_mode)) { /* a TP-1 rank file: checked as `run` will */
        struct fmt_shard *sh = NULL;
        enum fmt_err e = fmt_shard_open(model, &sh);
        if (e)
            return cli_exit_fmt(e);
        const uint32_t world = fmt_shard_header(sh)->world_size;
        fmt_shard_close(sh);
        if (world != 1) {
            qs_log_error(__func__, "%s is one rank of a TP-%u set: give its directory", model,
                         world);
            return QS_EXIT_BAD_INPUT;
        }
        snprintf(paths[0], 4096, "%s", model);
        *n = 1;
        return QS_EXIT_OK;
    }
    struct fmt_model *fm = NULL; /* every rank, checked to belong together */
    enum fmt_err e = fmt_model_open(model, &fm);
    if (e) {
        fmt_model_close(fm);
        return cli_exit_fmt(e);
    }
    const uint32_t world = fmt_model_world_size(fm);
    if (world > LOAD_MAX_RANKS) {
        fmt_model_close(fm);
        qs_log_error(__func__, "%s: %u ranks, at most %d are measured", model, world,
                     LOAD_MAX_RANKS);
        return QS_EXIT_BAD_INPUT;
    }
    for (uint32_t r = 0; r < world; r++)
        snprintf(paths[r], 4096, "%s", fmt_shard_path(fmt_model_shard(fm, r)));
    fmt_model_close(fm);
    *n = (int)world;
    return QS_EXIT_OK;
}

static void drop_cache(char paths[][4096], int n)
{
    for (int i = 0; i < n; i++)
        cli_drop_page_cache(paths[i]);
}

/* read() every file start to end; *gbps over all of them, *bytes their total. */
static int read_rate(char paths[][4096], int n, double *gbps, double *bytes)
{
    char *buf = malloc(LOAD_READ_CHUNK);
    int rc = QS_EXIT_OK;
    double total = 0;
    if (!buf) {
        qs_log_error(__func__, "out of memory");
        return QS_EXIT_RUNTIME;
    }
    const double t0 = qs_now_s();
    for (int i = 0; i < n && !rc; i++) {
        const int64_t got = cli_read_through(paths[i], buf, LOAD_READ_CHUNK);
        if (got < 0)
            rc = QS_EXIT_IO;
        else
            total += (double)got;
    }
    const double dt = qs_now_s() - t0;
    free(buf);
    *bytes = total;
    *gbps = dt > 0 ? total / 1e9 / dt : 0;
    return rc;
}

/* One child `qshard run`: seconds to its first output byte and to its exit; its stderr (the -v
 * lines) into log[LOAD_LOG_MAX]. */
static int start_once(const char *model, const char *device, double *t_first, double *t_exit,
                      char *log)
{
    int out[2], err[2];
    log[0] = '\0';
    if (pipe2(out, O_CLOEXEC) != 0) {
        qs_log_error(__func__, "pipe: %s", strerror(errno));
        return QS_EXIT_RUNTIME;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
        qs_log_error(__func__, "pipe: %s", strerror(errno));
        close(out[0]), close(out[1]);
        return QS_EXIT_RUNTIME;
    }
    const double t0 = qs_now_s();
    pid_t pid = fork();
    if (pid < 0) {
        qs_log_error(__func__, "fork: %s", strerror(errno));
        close(out[0]), close(out[1]), close(err[0]), close(err[1]);
        return QS_EXIT_RUNTIME;
    }
    if (pid == 0) { /* the child: only async-signal-safe calls until exec */
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        char *argv[16] = {"qshard", "run", (char *)model, "--tokens", "1", "-n", "1", "--temp",
                          "0", "--no-echo", "--print-ids", "-v", NULL};
        if (device) {
            argv[12] = "--device";
            argv[13] = (char *)device;
            argv[14] = NULL;
        }
        execv("/proc/self/exe", argv);
        static const char msg[] = "qshard bench load: cannot exec /proc/self/exe\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        _exit(127);
    }
    close(out[1]), close(err[1]);
    *t_first = -1;
    size_t n_log = 0;
    char tmp[4096];
    /* both pipes at once until both reach EOF (the child may write more than a pipe holds
     * to either before it exits): stdout's first byte is the first token */
    struct pollfd fds[2] = {{.fd = out[0], .events = POLLIN}, {.fd = err[0], .events = POLLIN}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            qs_log_error(__func__, "poll: %s", strerror(errno));
            kill(pid, SIGKILL); /* it may be blocked writing to a pipe no one reads */
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t got = read(fds[i].fd, tmp, sizeof tmp);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                fds[i].fd = -1; /* poll ignores negative descriptors */
                open_fds--;
                continue;
            }
            if (i == 0 && *t_first < 0)
                *t_first = qs_now_s() - t0;
            if (i == 1) {
                size_t room = LOAD_LOG_MAX - 1 - n_log;
                size_t take = (size_t)got < room ? (size_t)got : room;
                memcpy(log + n_log, tmp, take);
                n_log += take;
            }
        }
    }
    log[n_log] = '\0';
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *t_exit = qs_now_s() - t0;
    close(out[0]), close(err[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || *t_first < 0) {
        fprintf(stderr, "%s", log);
        qs_log_error(__func__, "the child `qshard run %s` failed (%s %d)", model,
                     WIFEXITED(status) ? "exit" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        /* its own exit code (bad file 2, I/O 4, ...); a signal or a silent success: 3 */
        const int c = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        return c >= QS_EXIT_BAD_INPUT && c <= QS_EXIT_IO ? c : QS_EXIT_RUNTIME;
    }
    return QS_EXIT_OK;
}

/* The child's timing lines; *upload_gbps from its "read + upload ... (X GB/s" (sum over ranks
 * is not taken: the first rank's), 0 when absent (cpu). */
static void child_timing(const char *log, double *upload_gbps)
{
    static const char *const keys[] = {"CUDA driver", "device allocation", "read + upload",
                                       "model open", "beside it", "prefill"};
    *upload_gbps = 0;
    for (const char *p = log; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            const char *hit = memmem(p, len, keys[k], strlen(keys[k]));
            if (!hit)
                continue;
            printf("  child: %.*s\n", (int)len, p);
            const char *par = k == 2 ? memchr(hit, '(', len - (size_t)(hit - p)) : NULL;
            double g;
            if (par && *upload_gbps == 0 && sscanf(par, "(%lf GB/s", &g) == 1)
                *upload_gbps = g;
            break;
        }
        p += len + (e ? 1 : 0);
    }
}

int cmd_bench_load(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_BENCH_LOAD, "qshard bench load", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos != 1)
        return cli_usage_error("expected one MODEL argument, got %d", a.n_pos);
    static char paths[LOAD_MAX_RANKS][4096];
    int n = 0;
    if ((rc = rank_paths(a.pos[0], paths, &n)))
        return rc;
    const bool cuda = a.device ? !strcmp(a.device, "cuda") : rt_cuda_available();
    const char *mode = a.cold ? "cold" : "warm";
    double read_gbps = 0, bytes = 0, h2d = 0;
    if (a.cold)
        drop_cache(paths, n);
    else if ((rc = read_rate(paths, n, &read_gbps, &bytes))) /* fills the page cache */
        return rc;
    if ((rc = read_rate(paths, n, &read_gbps, &bytes)))
        return rc;
    printf("qshard bench load: %s, %d rank file%s, %.3f GB, %s page cache, device %s\n",
           a.pos[0], n, cli_plural(n), bytes / 1e9, mode, cuda ? "cuda" : "cpu");
    printf("| test | %s |\n|---|--:|\n", mode);
    printf("| read: rank files, sequential read() | %.2f GB/s |\n", read_gbps);
    fflush(stdout);
    char *log = malloc(LOAD_LOG_MAX);
    double *first = calloc((size_t)a.repeat, sizeof(double));
    double *exit_s = calloc((size_t)a.repeat, sizeof(double));
    if (!log || !first || !exit_s) {
        qs_log_error(__func__, "out of memory");
        rc = QS_EXIT_RUNTIME;
    }
    for (long r = 0; r < a.repeat && !rc; r++) {
        if (a.cold)
            drop_cache(paths, n);
        rc = start_once(a.pos[0], a.device, &first[r], &exit_s[r], log);
    }
    if (!rc) {
        double best = first[0];
        for (long r = 1; r < a.repeat; r++)
            best = first[r] < best ? first[r] : best;
        qsort(first, (size_t)a.repeat, sizeof(double), cli_cmp_double);
        qsort(exit_s, (size_t)a.repeat, sizeof(double), cli_cmp_double);
        printf("| start: exec -> first token, median of %ld (best) | %.3f s (%.3f s) |\n",
               a.repeat, first[a.repeat / 2], best);
        printf("| start: exec -> exit, median | %.3f s |\n", exit_s[a.repeat / 2]);
        if (cuda) { /* after the starts: this process's CUDA context would sit beside theirs */
            enum rt_err e = rt_cuda_h2d_rate(0, (size_t)1 << 30, (size_t)64 << 20, 3, &h2d);
            if (e)
                rc = cli_exit_rt(e);
            else
                printf("| h2d: pinned host->device, 1 GiB | %.2f GB/s |\n", h2d);
        }
        double up = 0;
        printf("last start's own timing (-v):\n");
        child_timing(log, &up);
        if (up > 0 && cuda && !a.cold && h2d > 0)
            printf("upload %.2f GB/s = %.0f %% of the pinned host->device rate\n", up,
                   100.0 * up / h2d);
        if (up > 0 && a.cold && read_gbps > 0)
            printf("upload %.2f GB/s = %.0f %% of the sequential read rate\n", up,
                   100.0 * up / read_gbps);
        const int frc = cli_flush_stdout();
        rc = rc ? rc : frc;
    }
    free(log);
    free(first);
    free(exit_s);
    return rc;
}

/*
 * qshard.c - the one main() of the qshard binary: dispatch to a subcommand (tools/cmd.h), one
 * file each in tools/; messages are prefixed "qshard CMD" (qs_log_set_prog).
 *
 *   qshard convert MODEL_DIR OUT_DIR --tp N     HF AWQ directory -> per-rank .qshard files
 *   qshard run MODEL_DIR -p "text"              generate text (CPU or CUDA)
 *   qshard inspect|verify FILE|DIR              look at / check .qshard files
 *   qshard logits|perplexity|tokenize|bench ...
 *
 * Under mpirun (rt_mpi.h; README "Several processes"): MPI is initialised here and only here;
 * rank 0 runs the command (run, logits, perplexity, serve; the others are refused when the world
 * is larger than 1) and, on every way out, ends the followers' wait with its exit code; ranks > 0
 * never run the command: they follow rank 0's models (rt_exec_follow) and exit with rank 0's
 * code. QSHARD_MPI_TIMEOUT (seconds, default 30) bounds each collective of a step.
 */
#include <execinfo.h> /* backtrace: a crash report */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h> /* getenv, strtod */
#include <string.h>
#include <unistd.h>

#include "cmd.h"    /* cmd_* entry points, QS_EXIT_* */
#include "qs_log.h" /* qs_log_set_prog */
#include "rt_mpi.h" /* one process per rank */

#ifndef QSHARD_VERSION
#define QSHARD_VERSION "0.1.0"
#endif

struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct subcommand commands[] = {
    {"convert", cmd_convert, "convert a HuggingFace AWQ model directory into per-rank .qshard files"},
    {"run", cmd_run, "generate text from a converted model (CPU or CUDA)"},
    {"logits", cmd_logits, "write float32 logits [T, vocab] of a prompt as .npy"},
    {"perplexity", cmd_perplexity, "perplexity of a text file (llama.cpp style)"},
    {"tokenize", cmd_tokenize, "encode text to token ids, or decode ids to text"},
    {"inspect", cmd_inspect, "print the header, config and tensor table of .qshard files"},
    {"verify", cmd_verify, "check structure, every checksum and the manifest of .qshard files"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (continuous batching)"},
    {"bench", cmd_bench, "benchmarks (model tokens/s, kernels, load, verify, batch, serve)"},
};

static void usage(FILE *f)
{
    fprintf(f, "qshard %s - 4-bit AWQ models: convert once, map, run\n\n", QSHARD_VERSION);
    fprintf(f, "usage: qshard <command> [options]   (qshard <command> --help for details)\n\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit codes: 0 ok, 1 usage, 2 bad input, 3 runtime/GPU failure, 4 I/O error, "
               "5 verification failed\n");
}

#ifndef __SANITIZE_ADDRESS__ /* AddressSanitizer reports crashes itself */
/* A crash (a bug: bad input never crashes qshard) prints its call stack to stderr
 * (addresses: `addr2line -e qshard -f -p OFFSET`), then dies of the same signal. */
static void on_crash(int sig)
{
    static const char msg[] = "qshard: internal error (crash); call stack:\n";
    void *frames[48];
    const int n = backtrace(frames, 48);
    if (write(2, msg, sizeof msg - 1) < 0) { /* nothing more can be done */
    }
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}
#endif

/* The command of argv[1] (argv[0] is the program), or NULL. */
static const struct subcommand *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(name, commands[i].name))
            return &commands[i];
    return NULL;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return QS_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return QS_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("qshard %s\n", QSHARD_VERSION);
        return QS_EXIT_OK;
    }
    static char prog[64];
    const struct subcommand *c = find_command(argv[1]);
    if (c) {
        snprintf(prog, sizeof(prog), "qshard %s", c->name);
        qs_log_set_prog(prog);
        return c->fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "qshard: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return QS_EXIT_USAGE;
}

/* Under mpirun: rank 0 runs the command (those that run a model across processes), the others
 * follow it; every rank returns rank 0's exit code. */
static int mpi_main(int argc, char **argv)
{
    if (rt_mpi_init(&argc, &argv)) {
        fprintf(stderr, "qshard: started by mpirun, but MPI cannot start (the error above)\n");
        rt_mpi_finalize();
        return QS_EXIT_RUNTIME;
    }
    const char *t = getenv("QSHARD_MPI_TIMEOUT");
    if (t)
        rt_mpi_set_timeout(strtod(t, NULL));
    static char prog[96];
    const int rank = rt_mpi_rank(), world = rt_mpi_world();
    const struct subcommand *c = argc > 1 ? find_command(argv[1]) : NULL;
    int rc = QS_EXIT_OK;
    if (world > 1 && rank > 0) {
        snprintf(prog, sizeof(prog), "qshard %s (rank %d)", c ? c->name : "", rank);
        qs_log_set_prog(prog);
        /* rank 0 decides when the job ends (Ctrl-C of run, a server's drain) and tells the
         * followers; mpirun's own kill of the job (SIGTERM to mpirun) still ends with SIGKILL */
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        if (rt_exec_follow(&rc))
            rc = QS_EXIT_RUNTIME;
    } else if (world > 1 && c && strcmp(c->name, "run") && strcmp(c->name, "logits") &&
               strcmp(c->name, "perplexity") && strcmp(c->name, "serve")) {
        fprintf(stderr, "qshard %s: runs in one process: under mpirun (here %d processes) only "
                        "run, logits, perplexity and serve run, one rank per process\n",
                c->name, world);
        rc = QS_EXIT_USAGE;
    } else {
        rc = dispatch(argc, argv);
    }
    rt_exec_mpi_end(rc);
    rt_mpi_finalize();
    return rc;
}

int main(int argc, char **argv)
{
#ifndef __SANITIZE_ADDRESS__ /* AddressSanitizer reports crashes itself */
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    signal(SIGFPE, on_crash);
#endif
    if (rt_mpi_launched())
        return mpi_main(argc, argv);
    return dispatch(argc, argv);
}

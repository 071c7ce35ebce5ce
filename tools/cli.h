/*
 * cli.h - what the qshard commands (tools/cmd_*.c) share: the one option table (tools/cli_table.c)
 * with its parser and --help printer (tools/cli_opt.c), and small helpers (tools/cli_util.c):
 * exit codes of library errors, UTF-8 checks, reading a text file or stdin, the SIGINT flag.
 *
 * The option table follows the shape of llama.cpp's common/arg.cpp: every option is defined
 * once (long and short name, argument kind, range, default, help text, the commands it applies
 * to); each command takes the options whose `cmds` mask names it; parsing writes into one
 * struct cli_args and validates every value before the command does any work, with one message
 * form: "qshard run: --temp must be a number >= 0, got '1e39' (out of range)". --help text is
 * generated from the table: options at column 2, descriptions at column 26.
 *
 * Parsing rules: "--long value", "--long=value", unambiguous prefixes of long names (as
 * getopt_long), "-s value", "-svalue" (the value must be valid: "-ngl" is not "-n gl" but an
 * unknown option '-ngl'), clusters of flags ("-vq"), "--" ends the options, "-" alone is a
 * positional (stdin where a command reads a file), options and positionals in any order.
 * Errors print "qshard CMD: ..." and "try 'qshard CMD --help'" and give exit 1.
 *
 * Tools only: nothing in format/, kernels/, convert/ or runtime/ includes this (Makefile
 * include paths).
 */
#ifndef QS_CLI_H
#define QS_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fmt.h"       /* enum fmt_err */
#include "qs_log.h"    /* enum qs_exit */
#include "rt.h"        /* struct rt_opts, enum rt_err */
#include "rt_io.h"      /* enum rt_io_err */
#include "rt_session.h" /* RT_GEN_MAX_STOPS, struct rt_session */

/* The commands that take options from the table (bits of struct cli_opt.cmds). */
enum cli_cmd {
    CLI_RUN = 1u << 0,
    CLI_LOGITS = 1u << 1,
    CLI_PERPLEXITY = 1u << 2,
    CLI_TOKENIZE = 1u << 3,
    CLI_BENCH_MODEL = 1u << 4,
    CLI_BENCH_SYNTH = 1u << 5,
    CLI_BENCH_OPEN = 1u << 6,
    CLI_BENCH_VERIFY = 1u << 7,
    CLI_INSPECT = 1u << 8,
    CLI_VERIFY = 1u << 9,
    CLI_CONVERT = 1u << 10,
    CLI_BENCH_BATCH = 1u << 11,
    CLI_SERVE = 1u << 12,
    CLI_BENCH_SERVE = 1u << 13,
    CLI_BENCH_LOAD = 1u << 14,
};
#define CLI_MODEL_CMDS \
    (CLI_RUN | CLI_LOGITS | CLI_PERPLEXITY | CLI_BENCH_MODEL | CLI_BENCH_BATCH | CLI_SERVE)

#define CLI_MAX_LIST 16 /* values of a bench model list (-p 16,64,512) */
#define CLI_MAX_POS 64  /* positional arguments */

/* Every option value of every command (one field per option; zero unless set or defaulted). */
struct cli_args {
    /* model commands */
    const char *device;
    long threads, ctx, batch;
    bool verbose;
    bool no_graph, no_pdl, no_defer, no_rope_kv, no_wgmma, no_p2p, host_sample;
    /* prompts */
    const char *prompt, *file, *tokens, *text, *decode, *system, *chat_template, *out;
    bool chat, no_bos, no_parse_special, print_ids, truncate, no_echo, ignore_eos, json;
    bool ids_list, skip_special;
    /* sampling */
    long n_predict, top_k, logprobs;
    float temp, top_p, min_p, repeat_penalty;
    uint64_t seed;
    const char *stops[RT_GEN_MAX_STOPS];
    int n_stops;
    /* batching engine: run --prompts, bench batch */
    const char *prompts;
    long max_num_seqs, max_batch_tokens, block_size;
    float kv_cache_gb;
    long conc[CLI_MAX_LIST];
    int n_conc;
    long input_len, output_len, num_prompts;
    /* serve, bench serve */
    const char *host, *api_key, *served_model_name, *url;
    long port, max_queue, timeout, max_body_mb, shutdown_timeout;
    /* perplexity */
    long chunks;
    /* bench model */
    long pp[CLI_MAX_LIST], tg[CLI_MAX_LIST], dp[CLI_MAX_LIST];
    int n_pp, n_tg, n_dp;
    long reps;
    const char *output;
    /* bench synth / open / verify */
    long size_mb, tensor_mb, n_tensors, repeat;
    bool cold;
    /* inspect / verify */
    bool tensor_table;
    const char *tensor;
    /* convert */
    long tp, cvt_threads;
    bool dry_run, no_check, quiet, force, no_fast_path;
    /* positional arguments, in order */
    const char *pos[CLI_MAX_POS];
    int n_pos;
    /* which options the user gave, by table index (cli_given) */
    bool given[128];
};

enum cli_kind {
    CLI_FLAG,   /* bool, no value */
    CLI_INT,    /* long in [lo, hi] */
    CLI_FLOAT,  /* float in [lo, hi] (lo_open / hi_open exclude the end), finite */
    CLI_U64,    /* uint64_t, decimal or 0x hex */
    CLI_STR,    /* const char *, any string */
    CLI_CHOICE, /* const char *, one of the '|'-separated words of `choices` */
    CLI_CUSTOM, /* parsed by `parse` */
};

struct cli_opt;
/* A custom parser: store arg into a; false with *why set ("not a number", ...) when invalid. */
typedef bool (*cli_parse_fn)(const struct cli_opt *o, const char *arg, struct cli_args *a,
                             const char **why);

enum cli_section {
    CLI_SEC_MAIN = 0,     /* the command's own options (no header) */
    CLI_SEC_SAMPLING = 1, /* "Sampling (...):" */
    CLI_SEC_CONTEXT = 2,  /* "Context:" */
    CLI_SEC_MODEL = 3,    /* device, threads, batch, -v, -h (no header) */
    CLI_SEC_DEBUG = 4,    /* "Debug options ...:" */
    CLI_N_SECTIONS = 5,
};

struct cli_opt {
    const char *lng;      /* long name without "--" */
    char shrt;            /* short name, 0 for none */
    enum cli_kind kind;
    const char *metavar;  /* value placeholder in --help ("N", "FILE"); NULL for flags */
    unsigned cmds;        /* enum cli_cmd bits: the commands that take it */
    enum cli_section sec;
    size_t off;           /* offsetof(struct cli_args, field) */
    double lo, hi;        /* CLI_INT / CLI_FLOAT range */
    bool lo_open, hi_open;
    const char *must;     /* what a valid value is, for messages ("a number >= 0"); NULL: from
                             the kind and range */
    const char *choices;  /* CLI_CHOICE: "cpu|cuda" */
    const char *def;      /* default as text (parsed like a user value, shown in --help), or
                             NULL (none, or one the help text explains) */
    const char *help;     /* description (wrapped at column 26 by the help printer) */
    cli_parse_fn parse;   /* CLI_CUSTOM */
};

extern const struct cli_opt cli_table[];
extern const size_t cli_table_n;

/* Index of an option in cli_table by long name (for cli_given); -1 if none. */
int cli_find(const char *lng);
/* Whether the user gave option `lng` (not only its default). */
bool cli_given(const struct cli_args *a, const char *lng);

#define CLI_HELP (-1) /* cli_parse printed --help */

/*
 * Parse argv[1..argc) (argv[0] = the command's name) for command `cmd` into *a (defaults of the
 * table applied first). prog: "qshard run", for messages and --help. usage / trailer: the help
 * text above and below the option list (the usage line and description; the exit codes).
 * Returns QS_EXIT_OK, CLI_HELP (help printed on stdout: the command returns 0) or
 * QS_EXIT_USAGE (message and "try ... --help" printed on stderr).
 */
int cli_parse(unsigned cmd, const char *prog, const char *usage, const char *trailer, int argc,
              char **argv, struct cli_args *a);

/* Print the help of command cmd to f: usage, the table's options by section, trailer. */
void cli_help(FILE *f, unsigned cmd, const char *usage, const char *trailer);

/* "qshard CMD: <message>" and "try 'qshard CMD --help'" on stderr; returns QS_EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The model options of a (device, threads, ctx, batch, --debug-*) onto rt_opts_default(). */
struct rt_opts cli_model_opts(const struct cli_args *a);

/* --- cli_util.c ------------------------------------------------------------------------------ */

/* Mean, p50 and p99 of a latency sample (benchmarks: bench batch, bench serve). */
struct cli_summary {
    double mean, p50, p99;
};
/* The summary of v[n] times scale (1e3: seconds to ms); sorts v. Percentiles by nearest rank:
 * the value at ceil(p / 100 * n) - 1 of the sorted sample. Zeros for n = 0. */
struct cli_summary cli_summarize(double *v, size_t n, double scale);

/* qsort comparator of doubles, ascending. */
int cli_cmp_double(const void *a, const void *b);

/* Drop path's pages from the page cache (posix_fadvise DONTNEED: no root needed; advisory, so a
 * failure is warned about and the benchmark goes on). For the --cold benchmarks. */
void cli_drop_page_cache(const char *path);

/* read() the whole file path start to end through buf[size] (the plain sequential read the
 * load and verify benchmarks set themselves against). Returns its bytes, or -1 after reporting
 * why it could not be opened or read. */
int64_t cli_read_through(const char *path, void *buf, size_t size);

/* o->device with AUTO resolved (CUDA when rt_cuda_available(), else CPU), written back and
 * returned: for defaults that depend on the device (--max-num-seqs). */
enum rt_device cli_resolve_device(struct rt_opts *o);

/* Exit code of a library error (rt_err_exit_code, with the CLI's meaning of each). */
int cli_exit_rt(enum rt_err e);

/* Exit code of an rt_io error (2 malformed or too large, 3 memory, 4 I/O). */
int cli_exit_io(enum rt_io_err e);

/* Encode a prompt of text or of a token-id list ("1,2,3"; exactly one non-NULL) through
 * rt_session_encode; a missing tokenizer adds "hint: <no_tok_hint>". Returns an exit code. */
int cli_prompt_ids(const struct rt_session *s, const char *text, const char *tokens,
                   bool no_bos, bool no_parse_special, const char *no_tok_hint, int32_t **ids,
                   size_t *n);

/* "s" unless n is 1: "1 token", "2 tokens". */
const char *cli_plural(long long n);

/* Offset of the first byte that is not well-formed UTF-8 (RFC 3629: no overlongs, surrogates
 * or > U+10FFFF), or -1. */
long cli_utf8_invalid_at(const char *s, size_t n);

/* A text file, or stdin for "-", at most max bytes; *buf malloc'd with a NUL after the content.
 * A NUL byte inside is refused (not a text file). Reports once; returns an exit code. */
int cli_read_text(const char *path, size_t max, char **buf, size_t *len);

/* fflush(stdout) and check it; reports a failed write once. Returns an exit code. */
int cli_flush_stdout(void);

/* SIGINT / SIGTERM: the first one sets cli_cancel (to the signal number) and restores the
 * default action, so a second one ends the process at once. The commands check the flag
 * between steps, finish cleanly (partial output flushed, summary printed) and exit 3, as
 * `qshard convert` does on a signal (docs/DESIGN.md section 2: runtime failure). */
extern volatile sig_atomic_t cli_cancel;
void cli_catch_signals(void);
/* "interrupted by signal N" reported once (qs_log_error) after a cancelled command. */
void cli_report_cancel(void);

/* --- cli_files.c: inspect and verify ------------------------------------------------------ */

/* Exit code of a format error at open: 4 for I/O and memory, 2 for anything else. */
int cli_exit_fmt(enum fmt_err e);
/* The worse of two exit codes (the higher). */
int cli_worse(int a, int b);
/* A status line on stdout, flushed so that it stays in order with the errors on stderr. */
void cli_status_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* `e` came from a format/ call made after qs_log_clear(), which reports its errors itself
 * (DESIGN section 3: once); report here only if it returned an error without a message. */
void cli_report_unlogged(enum fmt_err e, const char *path);
bool cli_is_dir(const char *path);
/* 32 hex digits and a NUL. */
void cli_hex_id(const uint8_t id[16], char out[33]);
/* Every *.qshard of dir, sorted, as malloc'd paths (*out, cli_free_list); the count, or -1
 * (errno set, *out NULL) when the directory cannot be read or memory runs out. */
int cli_list_qshard(const char *dir, char ***out);
void cli_free_list(char **v, int n);

#endif /* QS_CLI_H */

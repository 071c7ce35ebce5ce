/*
 * cvt_main.c - `qshard convert MODEL_DIR OUT_DIR --tp N`: parse the command line, run the
 * converter (cvt_run, cvt.h), map its status to an exit code (docs/DESIGN.md section 2).
 *
 * Test: ./build/test_cvt runs the binary on every fixture; `qshard convert --help`.
 */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"    /* cmd_convert, QS_EXIT_* */
#include "cvt.h"    /* cvt_run, struct cvt_opts */
#include "qs_log.h" /* qs_log_set_level */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: qshard convert MODEL_DIR OUT_DIR --tp N [options]\n"
            "\n"
            "Convert a HuggingFace AWQ 4-bit checkpoint directory (config.json + safetensors,\n"
            "sharded safetensors, or PyTorch .bin/.pt; AutoAWQ GEMM, GEMV, GEMVFast, llm-awq)\n"
            "into OUT_DIR/rank-K-of-N.qshard (one self-contained file per tensor-parallel rank)\n"
            "plus OUT_DIR/manifest.json.\n"
            "\n"
            "options:\n"
            "  -t, --tp N         tensor-parallel ranks (required; N must divide the attention\n"
            "                     heads; the error lists the valid values)\n"
            "  -n, --dry-run      print the plan (per-rank heads, sizes, padding) and write nothing\n"
            "      --no-check     skip the bitwise self-check of every repacked linear\n"
            "  -j, --threads N    worker threads (default: one per online core)\n"
            "  -q, --quiet        no progress bar and no info messages\n"
            "  -f, --force        replace an earlier conversion in OUT_DIR: it stays intact\n"
            "                     until the new one is complete, then its manifest and rank\n"
            "                     files (any tp) are replaced; other files are left alone\n"
            "      --debug-no-fast-path\n"
            "                     repack every linear through the generic AWQ decoder instead\n"
            "                     of the AutoAWQ GEMM fast path (slower; same bytes: an A/B\n"
            "                     check of the two paths)\n"
            "  -h, --help         this text\n"
            "\n"
            "exit codes: 0 ok, 1 usage, 2 bad input (unsupported or corrupt checkpoint,\n"
            "impossible --tp, incomplete or unloadable tokenizer files), 3 out of memory or\n"
            "interrupted (nothing is left in OUT_DIR), 4 I/O error (also: another convert is\n"
            "writing OUT_DIR), 5 self-check failed\n"
            "OUT_DIR must not be MODEL_DIR.\n");
}

static bool parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

/* Exit code for a converter status: the input side's mapping plus the core's own codes. */
static int exit_code(enum cvt_err e)
{
    switch (e) {
    case CVT_ERR_SELF_CHECK: return QS_EXIT_VERIFY;
    case CVT_ERR_EXISTS: return QS_EXIT_USAGE;
    case CVT_ERR_SAME_DIR: return QS_EXIT_USAGE;
    case CVT_ERR_LOCKED: return QS_EXIT_IO;
    case CVT_ERR_INTERRUPTED: return QS_EXIT_RUNTIME;
    default: return cvt_err_exit_code(e);
    }
}

int cmd_convert(int argc, char **argv)
{
    enum { OPT_NO_CHECK = 256, OPT_NO_FAST };
    static const struct option longopts[] = {
        {"tp", required_argument, NULL, 't'},
        {"dry-run", no_argument, NULL, 'n'},
        {"no-check", no_argument, NULL, OPT_NO_CHECK},
        {"debug-no-fast-path", no_argument, NULL, OPT_NO_FAST},
        {"threads", required_argument, NULL, 'j'},
        {"quiet", no_argument, NULL, 'q'},
        {"force", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct cvt_opts o;
    int c, tp = 0;
    memset(&o, 0, sizeof(o));
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":t:nj:qfh", longopts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (!parse_int(optarg, 1, 4096, &tp)) {
                fprintf(stderr, "qshard convert: --tp: expected an integer 1..4096, got '%s'\n",
                        optarg);
                return QS_EXIT_USAGE;
            }
            break;
        case 'n': o.dry_run = true; break;
        case OPT_NO_CHECK: o.no_check = true; break;
        case OPT_NO_FAST: o.no_fast_path = true; break;
        case 'j':
            if (!parse_int(optarg, 1, 1024, &o.threads)) {
                fprintf(stderr, "qshard convert: --threads: expected an integer 1..1024, got "
                                "'%s'\n",
                        optarg);
                return QS_EXIT_USAGE;
            }
            break;
        case 'q': o.quiet = true; break;
        case 'f': o.force = true; break;
        case 'h': usage(stdout); return QS_EXIT_OK;
        case ':':
            fprintf(stderr, "qshard convert: option %s needs a value\n", argv[optind - 1]);
            usage(stderr);
            return QS_EXIT_USAGE;
        default:
            fprintf(stderr, "qshard convert: unknown option %s\n", argv[optind - 1]);
            usage(stderr);
            return QS_EXIT_USAGE;
        }
    }
    int n_pos = argc - optind;
    if (n_pos < 1 || (n_pos < 2 && !o.dry_run) || n_pos > 2) {
        fprintf(stderr, "qshard convert: expected MODEL_DIR and OUT_DIR, got %d argument(s)\n",
                n_pos);
        usage(stderr);
        return QS_EXIT_USAGE;
    }
    if (!tp) {
        fprintf(stderr, "qshard convert: --tp N is required\n");
        fprintf(stderr, "hint: --tp 1 for one GPU; `--tp N --dry-run` shows the plan, and an "
                        "impossible N lists the valid values\n");
        return QS_EXIT_USAGE;
    }
    o.model_dir = argv[optind];
    o.out_dir = n_pos == 2 ? argv[optind + 1] : NULL;
    o.tp = tp;
    if (o.quiet)
        qs_log_set_level(QS_LOG_WARN);
    enum cvt_err e = cvt_run(&o);
    if (e == CVT_ERR_TP)
        fprintf(stderr, "hint: run `qshard convert %s --tp 1 --dry-run` to see the model's "
                        "shapes\n",
                o.model_dir);
    if (e == CVT_ERR_TOKENIZER)
        fprintf(stderr, "hint: the tokenizer files of %s are copied into every rank file and "
                        "loaded by `qshard run`; complete or fix them, or remove them all to "
                        "convert for token ids only\n",
                o.model_dir);
    if (e == CVT_ERR_EXISTS)
        fprintf(stderr, "hint: pass --force to replace the earlier conversion (it stays intact "
                        "until the new one is complete)\n");
    return exit_code(e);
}

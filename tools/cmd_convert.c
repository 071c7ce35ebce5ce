/*
 * cmd_convert.c - `qshard convert MODEL_DIR OUT_DIR --tp N`: the options (tools/cli_table.c),
 * the converter (cvt_run, convert/cvt.h), its status as an exit code (docs/DESIGN.md
 * section 2). Moved from convert/cvt_main.c (issue 18: no command code in the library).
 *
 * Test: ./build/test_cvt runs the binary on every fixture; `qshard convert --help`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"    /* cli_parse */
#include "cmd.h"    /* cmd_convert, QS_EXIT_* */
#include "cvt.h"    /* cvt_run, struct cvt_opts */
#include "qs_log.h" /* qs_log_set_level */

static const char k_usage[] =
    "usage: qshard convert MODEL_DIR OUT_DIR --tp N [options]\n"
    "\n"
    "Convert a HuggingFace AWQ 4-bit checkpoint directory (config.json + safetensors,\n"
    "sharded safetensors, or PyTorch .bin/.pt; AutoAWQ GEMM, GEMV, GEMVFast, llm-awq)\n"
    "into OUT_DIR/rank-K-of-N.qshard (one self-contained file per tensor-parallel rank)\n"
    "plus OUT_DIR/manifest.json.\n"
    "\n"
    "options:\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad input (unsupported or corrupt checkpoint,\n"
    "impossible --tp, incomplete or unloadable tokenizer files), 3 out of memory or\n"
    "interrupted (nothing is left in OUT_DIR), 4 I/O error (also: another convert is\n"
    "writing OUT_DIR), 5 self-check failed\n"
    "OUT_DIR must not be MODEL_DIR.\n";

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
    struct cli_args a;
    struct cvt_opts o;
    int rc = cli_parse(CLI_CONVERT, "qshard convert", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos < 1 || (a.n_pos < 2 && !a.dry_run) || a.n_pos > 2)
        return cli_usage_error("expected MODEL_DIR and OUT_DIR, got %d argument(s)", a.n_pos);
    if (!a.tp) {
        fprintf(stderr, "qshard convert: --tp N is required\n");
        fprintf(stderr, "hint: --tp 1 for one GPU; `--tp N --dry-run` shows the plan, and an "
                        "impossible N lists the valid values\n");
        return QS_EXIT_USAGE;
    }
    memset(&o, 0, sizeof(o));
    o.dry_run = a.dry_run;
    o.no_check = a.no_check;
    o.threads = (int)a.cvt_threads;
    o.quiet = a.quiet;
    o.force = a.force;
    o.no_fast_path = a.no_fast_path;
    const int n_pos = a.n_pos;
    const int tp = (int)a.tp;
    o.model_dir = a.pos[0];
    o.out_dir = n_pos == 2 ? a.pos[1] : NULL;
    o.tp = tp;
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

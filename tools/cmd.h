/*
 * cmd.h - the qshard subcommands. tools/qshard.c dispatches argv[1] to one of these.
 * Each takes the subcommand's own argv (argv[0] = subcommand name), parses it with getopt_long,
 * prints --help, and returns a process exit code (docs/DESIGN.md section 2):
 *   0 ok, 1 usage, 2 bad input, 3 runtime/GPU failure, 4 I/O or system error, 5 verify failed.
 * None of them calls exit().
 */
#ifndef QS_CMD_H
#define QS_CMD_H

#include "qs_log.h" /* enum qs_exit: QS_EXIT_* */

int cmd_convert(int argc, char **argv);    /* convert/cvt_main.c */
int cmd_run(int argc, char **argv);        /* runtime/rt_main.c */
int cmd_logits(int argc, char **argv);     /* runtime/rt_main.c */
int cmd_perplexity(int argc, char **argv); /* runtime/rt_main.c */
int cmd_tokenize(int argc, char **argv);   /* runtime/rt_main.c */
int cmd_bench_model(int argc, char **argv); /* runtime/rt_main.c: `qshard bench model ...` */
int cmd_inspect(int argc, char **argv);    /* tools/cmd_inspect.c */
int cmd_verify(int argc, char **argv);     /* tools/cmd_inspect.c */
int cmd_bench(int argc, char **argv);      /* tools/cmd_bench.c */

/* `qshard bench kernel ...`: kernels/k_bench.cu (kernels/k_bench_nocuda.c without nvcc). */
int bench_kernel_main(int argc, char **argv);

#endif /* QS_CMD_H */

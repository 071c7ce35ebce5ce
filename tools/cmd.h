/*
 * cmd.h - the qshard subcommands, one file each in tools/. tools/qshard.c dispatches argv[1]
 * to one of these. Each takes the subcommand's own argv (argv[0] = subcommand name), parses it
 * with the option table (tools/cli.h), prints --help, and returns a process exit code
 * (docs/DESIGN.md section 2, enum qs_exit in format/qs_log.h): 0 ok, 1 usage, 2 bad input,
 * 3 runtime/GPU failure or interrupted, 4 I/O or system error, 5 verify failed.
 * None of them calls exit(). Tools only: no library file includes this (Makefile).
 */
#ifndef QS_CMD_H
#define QS_CMD_H

#include "qs_log.h" /* enum qs_exit: QS_EXIT_* */

int cmd_convert(int argc, char **argv);     /* tools/cmd_convert.c */
int cmd_run(int argc, char **argv);         /* tools/cmd_run.c */
struct cli_args;
struct rt_sample_params;
/* qshard run --prompts (tools/cmd_run_batch.c): base = the sampling options, given = which the
 * user set (RT_GEN_* bits). */
int cmd_run_prompts(const struct cli_args *a, const struct rt_sample_params *base,
                    unsigned base_given);
int cmd_bench_batch(int argc, char **argv); /* tools/cmd_bench_batch.c */
int cmd_bench_serve(int argc, char **argv); /* tools/cmd_bench_serve.c */
int cmd_serve(int argc, char **argv);       /* tools/serve/cmd_serve.c */
int cmd_logits(int argc, char **argv);      /* tools/cmd_logits.c */
int cmd_perplexity(int argc, char **argv);  /* tools/cmd_perplexity.c */
int cmd_tokenize(int argc, char **argv);    /* tools/cmd_tokenize.c */
int cmd_bench(int argc, char **argv);       /* tools/cmd_bench.c: synth, open, verify, and the
                                               dispatch to kernel (kernels.h) and model */
int cmd_bench_model(int argc, char **argv); /* tools/cmd_bench_model.c */
int cmd_bench_load(int argc, char **argv);  /* tools/cmd_bench_load.c */
int cmd_inspect(int argc, char **argv);     /* tools/cmd_inspect.c */
int cmd_verify(int argc, char **argv);      /* tools/cmd_verify.c */

#endif /* QS_CMD_H */

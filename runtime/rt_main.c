/* runtime/rt_main.c - STUB: to be replaced by the module owner. */
#include <stdio.h>
#include "cmd.h"
int cmd_run(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard run: not implemented yet\n"); return QS_EXIT_RUNTIME; }
int cmd_logits(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard logits: not implemented yet\n"); return QS_EXIT_RUNTIME; }
int cmd_perplexity(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard perplexity: not implemented yet\n"); return QS_EXIT_RUNTIME; }
int cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard tokenize: not implemented yet\n"); return QS_EXIT_RUNTIME; }

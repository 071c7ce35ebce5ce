/* tools/cmd_bench.c - STUB: to be replaced by the module owner. */
#include <stdio.h>
#include "cmd.h"
int cmd_bench(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard bench: not implemented yet\n"); return QS_EXIT_RUNTIME; }

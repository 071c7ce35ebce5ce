/* tools/cmd_inspect.c - STUB: to be replaced by the module owner. */
#include <stdio.h>
#include "cmd.h"
int cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard inspect: not implemented yet\n"); return QS_EXIT_RUNTIME; }
int cmd_verify(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard verify: not implemented yet\n"); return QS_EXIT_RUNTIME; }

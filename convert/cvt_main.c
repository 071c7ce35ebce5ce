/* convert/cvt_main.c - STUB: to be replaced by the module owner. */
#include <stdio.h>
#include "cmd.h"
int cmd_convert(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "qshard convert: not implemented yet\n"); return QS_EXIT_RUNTIME; }

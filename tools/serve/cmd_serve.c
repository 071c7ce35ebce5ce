/* cmd_serve.c - `qshard serve` (placeholder). */
#include "cli.h"
#include "cmd.h"

int cmd_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    qs_log_error("serve", "not built yet");
    return QS_EXIT_USAGE;
}

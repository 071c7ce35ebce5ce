/* cmd_bench_serve.c - `qshard bench serve` (placeholder until the client lands). */
#include "cli.h"
#include "cmd.h"

int cmd_bench_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    qs_log_error("bench serve", "not built yet");
    return QS_EXIT_USAGE;
}

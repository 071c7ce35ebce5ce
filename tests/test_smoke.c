/*
 * test_smoke.c - the qshard binary's dispatcher: usage errors and help exit codes.
 * Run: ./build/test_smoke (from the repository root; QSHARD names the binary).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "t.h"

static int run(const char *args)
{
    const char *bin = getenv("QSHARD") ? getenv("QSHARD") : "build/qshard";
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s %s >/dev/null 2>&1", bin, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    T_INIT("smoke");
    CHECK_EQ_INT(run("--help"), 0);
    CHECK_EQ_INT(run(""), 1);
    CHECK_EQ_INT(run("no-such-command"), 1);
    CHECK_EQ_INT(run("--version"), 0);
    return t_done();
}

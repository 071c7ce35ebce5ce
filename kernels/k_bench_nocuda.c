/* k_bench_nocuda.c - stands in for k_bench.cu in builds without nvcc. */
#include <stdio.h>

#include "k_bench.h" /* bench_kernel_main, K_BENCH_EXIT_RUNTIME */

int bench_kernel_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "qshard bench kernel: this qshard was built without the CUDA backend (no nvcc found, or NO_CUDA=1)\n");
    return K_BENCH_EXIT_RUNTIME;
}

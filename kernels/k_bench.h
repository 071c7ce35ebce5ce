/*
 * k_bench.h - entry point of `qshard bench kernel` (kernels/k_bench.cu; kernels/k_bench_nocuda.c
 * in builds without nvcc), so the CLI (tools/) calls into kernels/ and not the other way round.
 * C linkage, C11 and C++.
 */
#ifndef QS_K_BENCH_H
#define QS_K_BENCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* What bench_kernel_main returns: the process exit codes of docs/DESIGN.md section 2. */
enum k_bench_exit {
    K_BENCH_EXIT_OK = 0,
    K_BENCH_EXIT_USAGE = 1,   /* bad option or value (the usage text was printed) */
    K_BENCH_EXIT_RUNTIME = 3, /* no usable GPU, a config that failed validation, CUDA failure */
};

/*
 * `qshard bench kernel OP [options]` with argv[0] = "kernel": OP is w4a16 (the W4A16 routes
 * against cuBLAS fp16 and the copy bandwidth), floor (chained weight-streaming kernels),
 * stream (read bandwidth of access patterns) or sample (next-token choice on the GPU vs the
 * host); `--help` lists the options. Prints to stdout, errors to stderr; returns an
 * enum k_bench_exit value and never exits.
 */
int bench_kernel_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* QS_K_BENCH_H */

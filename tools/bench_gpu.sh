#!/bin/sh
# bench_gpu.sh - GPU benchmarks (`make bench-gpu`, on the GPU machine): the W4A16 routes vs the
# device copy bandwidth and cuBLAS fp16 in one run, Llama-2-7B / Llama-3-8B / 70B layer shapes at
# tp 1 and the 70B shapes at tp 8 (auto, dequant + cuBLAS, and the deferred split-K alone: acc),
# then the per-call floor of chained linears (bench kernel floor), the read-bandwidth ceilings
# of the access patterns, then the next-token choice on the GPU (k_sample) vs the download +
# host sampler. The experiments that are not routes (v5 with its in-kernel tail, v8, ...) run
# in their own programs: `make lab-run` (kernels/lab/README.md).
# docs/BENCHMARKS.md ("GPU kernels (H200)") records the output.
#   QSHARD=build/qshard sh tools/bench_gpu.sh
set -e
QSHARD=${QSHARD:-build/qshard}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
"$QSHARD" bench kernel w4a16 --m 1,16,64,256,4096 --shapes llama2-7b,llama3-8b,70b --routes auto,dq_gemm,acc --ms 10
"$QSHARD" bench kernel w4a16 --m 1,16,64 --shapes 70b --tp 8 --routes auto,acc --ms 10
"$QSHARD" bench kernel floor --shapes llama2-7b,llama3-8b,70b --ms 10
"$QSHARD" bench kernel floor --shapes 70b --tp 8 --ms 10
"$QSHARD" bench kernel stream
"$QSHARD" bench kernel sample --vocab 32000,128256,151936

#!/bin/sh
# bench_batch_gpu.sh - the batching engine on the GPU (`make bench-batch-gpu`, on the GPU
# machine): synthetic full-size Llama-2-7B and Llama-3-8B (tools/fixtures/gen_fullsize.py),
# converted at TP 1, then in one process per model: `bench model` tg128 (the single-sequence
# baseline) and `bench batch` 128 in / 128 out at concurrency 1..256. docs/BENCHMARKS.md
# ("Batching engine") records the output.
#   QSHARD=build-dev/qshard sh tools/bench_batch_gpu.sh [MODELS] [CONCURRENCY]
set -e
QSHARD=${QSHARD:-build/qshard}
MODELS=${1:-llama2-7b llama3-8b}
CONC=${2:-1,8,16,32,64,128,256}
W=${QSHARD_BENCH_DIR:-/tmp/qshard-batch}
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
for m in $MODELS; do
    [ -d "$W/in/$m" ] || python3 "$(dirname "$0")/fixtures/gen_fullsize.py" "$m" "$W/in" >/dev/null
    [ -d "$W/q/$m" ] || "$QSHARD" convert "$W/in/$m" "$W/q/$m" --tp 1 -q
    echo "== $m: bench model tg128 (one sequence)"
    "$QSHARD" bench model "$W/q/$m" -p 0 -n 128 -r 3
    echo "== $m: bench batch 128/128"
    "$QSHARD" bench batch "$W/q/$m" --concurrency "$CONC" --input-len 128 --output-len 128 \
        ${QSHARD_BENCH_PROMPTS:+--num-prompts $QSHARD_BENCH_PROMPTS}
    rm -rf "$W/in/$m"
done

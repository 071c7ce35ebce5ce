#!/bin/sh
# bench_actorder_gpu.sh - what act-order costs on the GPU (`make bench-actorder-gpu`, on the GPU
# machine): the synthetic Llama-2-7B as AutoAWQ GEMM and as GPTQ with desc_act (random g_idx,
# tools/fixtures/gen_fullsize.py --format gptq-act), both converted at TP 1 (the GPTQ one with
# its .perm tensors, docs/DESIGN.md 4.5), then in one run: `bench model` pp512 + tg128 of each
# (the act-order model gathers its input columns before each of its 4 linears per layer), and
# the gather kernel alone at the 7B's shapes (bench kernel gather). docs/BENCHMARKS.md
# ("Act-order") records the output.
#   QSHARD=build-dev/qshard sh tools/bench_actorder_gpu.sh
set -e
QSHARD=${QSHARD:-build/qshard}
W=${QSHARD_BENCH_DIR:-/dev/shm/qshard-act}
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
G=$(dirname "$0")/fixtures/gen_fullsize.py
[ -d "$W/in/llama2-7b" ] || python3 "$G" llama2-7b "$W/in" >/dev/null
[ -d "$W/in/llama2-7b-gptq-act" ] || python3 "$G" llama2-7b "$W/in" --format gptq-act >/dev/null
for m in llama2-7b llama2-7b-gptq-act; do
    t0=$(date +%s.%N)
    [ -d "$W/q/$m" ] || "$QSHARD" convert "$W/in/$m" "$W/q/$m" --tp 1 -q
    echo "== $m: converted in $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
    rm -rf "$W/in/$m"
done
for m in llama2-7b llama2-7b-gptq-act; do
    echo "== $m: bench model pp512 / tg128"
    "$QSHARD" bench model "$W/q/$m" -p 512 -n 0 -r 3
    "$QSHARD" bench model "$W/q/$m" -p 0 -n 128 -r 3
done
"$QSHARD" bench kernel gather --ms 10
rm -rf "$W"

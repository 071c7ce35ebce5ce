#!/bin/sh
# bench_arch_gpu.sh - decode and prefill of the architectures added after LLaMA (issue 23) on the
# GPU machine (`make bench-arch-gpu`): synthetic full-size AutoAWQ GEMM checkpoints written by
# tools/fixtures/gen_fullsize.py (Qwen3-8B beside Llama-3-8B, the closest LLaMA shape: 4096
# hidden, 8 kv heads, vocab 128256 vs 151936, 32 vs 36 layers; Phi-3-mini beside Llama-2-7B: 32
# layers of MHA, 3072 vs 4096 hidden; Falcon-7B beside it too: 4544 hidden, 71 heads sharing one
# kv head, parallel attention + GELU MLP, LayerNorm; MPT-7B beside it: Llama-2-7B's
# linears but one fused Wqkv, a GELU MLP of 4 x hidden with AutoAWQ's act scales, ALiBi, LayerNorm
# without bias, vocab 50432 tied; Gemma-2-9B and Gemma-3-1B: head_dim 256,
# four norms per layer, soft-capping), each converted at TP 1, then in one run `bench model`
# pp512 and tg128 of each. docs/BENCHMARKS.md ("Architectures") records it.
#   QSHARD=build-dev/qshard sh tools/bench_arch_gpu.sh [MODEL ...]
set -e
QSHARD=${QSHARD:-build/qshard}
W=${QSHARD_BENCH_DIR:-/dev/shm/qshard-arch}
MODELS=${*:-"llama3-8b qwen3-8b llama2-7b phi3-mini falcon-7b mpt-7b gemma2-9b gemma3-1b"}
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
G=$(dirname "$0")/fixtures/gen_fullsize.py
for m in $MODELS; do
    [ -d "$W/q/$m" ] && continue
    python3 "$G" "$m" "$W/in" >/dev/null
    t0=$(date +%s.%N)
    "$QSHARD" convert "$W/in/$m" "$W/q/$m" --tp 1 -q
    echo "== $m: converted in $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
    rm -rf "$W/in/$m"
done
for m in $MODELS; do
    echo "== $m: bench model pp512 / tg128"
    "$QSHARD" bench model "$W/q/$m" -p 512 -n 0 -r 3
    "$QSHARD" bench model "$W/q/$m" -p 0 -n 128 -r 3
done
rm -rf "$W"

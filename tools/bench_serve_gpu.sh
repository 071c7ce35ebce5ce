#!/bin/sh
# bench_serve_gpu.sh - `qshard serve` on the GPU (`make bench-serve-gpu`, on the GPU machine):
#   1. the demo model on cuda: greedy answers of the server (completions and chat, streamed and
#      not, 16 at once) equal `qshard run --prompts` on the same GPU (the engine alone);
#   2. a synthetic full-size Llama-2-7B (tools/fixtures/gen_fullsize.py) converted at TP 1:
#      process start -> GET /health 200, three starts from a warm page cache;
#   3. `qshard bench batch` and `qshard bench serve` (over loopback HTTP) at the same
#      concurrencies, 128 in / 128 out, so the server's overhead is the ratio of the two.
# docs/BENCHMARKS.md ("Server") records the output.
#   QSHARD=build-dev/qshard sh tools/bench_serve_gpu.sh [MODEL] [CONCURRENCY]
set -e
QSHARD=${QSHARD:-build/qshard}
M=${1:-llama2-7b}
CONC=${2:-1,8,32,64,256}
W=${QSHARD_BENCH_DIR:-/tmp/qshard-serve}
HERE=$(dirname "$0")
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
echo "== the demo model on cuda: the server's greedy answers vs run --prompts"
rm -rf "$W/demo" && "$QSHARD" convert tests/data/models/kjv-llama-awq-gemm "$W/demo" --tp 1 -q
python3 "$HERE/serve_check.py" "$QSHARD" "$W/demo"
[ -d "$W/in/$M" ] || python3 "$HERE/fixtures/gen_fullsize.py" "$M" "$W/in" >/dev/null
# the real Llama-2 tokenizer (32000 ids; tests/data/PROVENANCE.md) so that the server streams
# text, as it does for a real checkpoint: detokenisation is part of what is measured
case $M in llama2-*) cp tests/data/tokenizers/llama2/tokenizer.* "$W/in/$M/" ;; esac
[ -d "$W/q/$M" ] || "$QSHARD" convert "$W/in/$M" "$W/q/$M" --tp 1 -q
rm -rf "$W/in/$M"
echo "== $M: process start -> /health 200 (warm page cache)"
python3 "$HERE/serve_check.py" --start-time "$QSHARD" "$W/q/$M"
echo "== $M: bench batch 128/128 (the engine in-process)"
"$QSHARD" bench batch "$W/q/$M" --concurrency "$CONC" --input-len 128 --output-len 128
echo "== $M: bench serve 128/128 (HTTP, streaming, loopback)"
"$QSHARD" serve "$W/q/$M" --port 18123 --max-num-seqs 256 2>"$W/serve.log" &
pid=$!
python3 "$HERE/serve_check.py" --wait http://127.0.0.1:18123
"$QSHARD" bench serve --url http://127.0.0.1:18123 --concurrency "$CONC" --input-len 128 \
    --output-len 128 || echo "bench serve: exit $?"
kill -TERM $pid
wait $pid || echo "serve: exit $?"
grep -c "POST /v1/completions 200" "$W/serve.log" | sed 's/^/requests logged with 200: /'
grep -v "POST /v1/completions 200" "$W/serve.log" | tail -n 20

#!/bin/sh
# bench_load_gpu.sh - cold start on the GPU machine (issue 24; docs/BENCHMARKS.md "Load"):
# a synthetic Llama-2-7B AutoAWQ checkpoint (tools/fixtures/gen_fullsize.py) converted at TP 1
# onto a disk directory (not /dev/shm: --cold must be able to drop it from the page cache),
# then in one run:
#   1. `qshard bench load` warm and --cold (read rate, pinned h2d rate, exec -> first token);
#   2. the upload variants: QSHARD_UPLOAD_SRC = direct (cold), pread | mmap | register (warm)
#      and QSHARD_UPLOAD_THREADS = 4 | 8 | 16;
#   3. the Hugging Face baseline: the AWQ directory's safetensors onto the GPU with torch
#      (tools/bench_load_torch.py), warm and cold, timed from outside too.
#   QSHARD=build-dev/qshard sh tools/bench_load_gpu.sh [MODEL]
set -e
QSHARD=${QSHARD:-build/qshard}
M=${1:-llama2-7b}
W=${QSHARD_BENCH_DIR:-/tmp/qshard-load}
H=$(dirname "$0")
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
# with a real tokenizer of the same vocabulary (QSHARD_LOAD_TOKENIZER: a directory holding
# tokenizer.json and/or tokenizer.model, tokenizer_config.json; default the Llama 2 one of
# tests/data), so the start
# includes its parse as a user's does
TOK=${QSHARD_LOAD_TOKENIZER:-$H/../tests/data/tokenizers/llama2}
if [ ! -d "$W/in/$M" ]; then
    python3 "$H/fixtures/gen_fullsize.py" "$M" "$W/in" >/dev/null
    for f in tokenizer.json tokenizer.model tokenizer_config.json; do
        if [ -f "$TOK/$f" ]; then cp "$TOK/$f" "$W/in/$M/"; fi
    done
fi
[ -d "$W/q/$M" ] || "$QSHARD" convert "$W/in/$M" "$W/q/$M" --tp 1 -q 2>/dev/null
echo "== $M: bench load, warm"
"$QSHARD" bench load "$W/q/$M" -r 5
echo "== $M: bench load, cold"
"$QSHARD" bench load "$W/q/$M" -r 3 --cold
echo "== upload direct (O_DIRECT), cold"
QSHARD_UPLOAD_SRC=direct "$QSHARD" bench load "$W/q/$M" -r 3 --cold | grep -E "first token|read \+ upload|model open|sequential"
for src in pread mmap register; do
    for th in 4 8 16; do
        [ "$src" = register ] && [ "$th" != 8 ] && continue
        echo "== upload $src, $th threads (warm)"
        QSHARD_UPLOAD_SRC=$src QSHARD_UPLOAD_THREADS=$th "$QSHARD" bench load "$W/q/$M" -r 3 |
            grep -E "first token|read \+ upload|model open"
    done
done
for mode in warm cold; do
    cat "$W/in/$M"/*.safetensors > /dev/null
    t0=$(date +%s.%N)
    if [ $mode = cold ]; then python3 "$H/bench_load_torch.py" "$W/in/$M" --cold
    else python3 "$H/bench_load_torch.py" "$W/in/$M"; fi
    echo "   (process, from outside: $(python3 -c "import time; print(round(time.time() - $t0, 3))") s)"
done
[ -n "$QSHARD_BENCH_KEEP" ] || rm -rf "$W"

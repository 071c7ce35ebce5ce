#!/bin/sh
# demo.sh - what `make demo` runs: convert the bundled demo model and generate text from it.
#
# The demo model is tests/data/models/llama2-tok-demo: a tiny LLaMA (hidden 256, 2 layers,
# random weights, AWQ GEMM 4-bit) carrying the real Llama-2 tokenizer (tests/data/models/INDEX.json
# lists it with "tokenizer": true). Its weights are random, so the text is gibberish made of
# real Llama-2 tokens; the point is the whole path: convert -> map -> tokenize -> forward ->
# sample -> stream. Runs on the CPU, or on CUDA where the binary has it and a GPU is present
# (`qshard run` picks the device; DEVICE=cpu|cuda forces one).
#
# Usage: sh tools/demo.sh            (after `make`; QSHARD names the binary, default build/qshard)
# Every command is printed before it runs.
set -eu

QSHARD=${QSHARD:-build/qshard}
MODEL=${MODEL:-tests/data/models/llama2-tok-demo}
OUT=${OUT:-build/demo}
PROMPT=${PROMPT:-The capital of France is}

if [ ! -x "$QSHARD" ]; then
    echo "demo: $QSHARD not found: run make first" >&2
    exit 1
fi
if [ ! -d "$MODEL" ]; then
    echo "demo: demo model $MODEL not found (tests/data/models/INDEX.json lists the fixtures)" >&2
    exit 1
fi

# Print the command (arguments with spaces in single quotes), then run it.
show() {
    line="+"
    for a in "$@"; do
        case $a in
        *" "*) line="$line '$a'" ;;
        *) line="$line $a" ;;
        esac
    done
    printf '%s\n' "$line" >&2
    "$@"
}

DEV=""
if [ -n "${DEVICE:-}" ]; then
    DEV="--device $DEVICE"
fi

rm -rf "$OUT"
show "$QSHARD" convert "$MODEL" "$OUT" --tp 1
show "$QSHARD" tokenize "$OUT" --text "$PROMPT"
# shellcheck disable=SC2086 # DEV is empty or two words
show "$QSHARD" run "$OUT" -p "$PROMPT" -n 32 --temp 0 $DEV
# shellcheck disable=SC2086
show "$QSHARD" run "$OUT" -p "$PROMPT" -n 32 --temp 0.8 --top-k 40 --top-p 0.95 --seed 42 $DEV

#!/bin/sh
# demo.sh - what `make demo` runs: convert the bundled demo model and generate text from it.
#
# The demo model is tests/data/models/kjv-llama-awq-gemm: a small LLaMA (13.9M parameters:
# hidden 512, 5 layers, 8 query / 4 kv heads) trained here on the King James Bible (public
# domain) with its own 4096-piece SentencePiece tokenizer, then 4-bit AWQ-quantized (group 128,
# AutoAWQ GEMM layout); docs/QUALITY.md says how it was made and what the quantization costs.
# It writes KJV-style sentences, so the whole path shows: convert -> map -> tokenize ->
# forward -> sample -> stream. Runs on the CPU, or on CUDA where the binary has it and a GPU is
# present (`qshard run` picks the device; DEVICE=cpu|cuda forces one).
#
# Usage: sh tools/demo.sh            (after `make`; QSHARD names the binary, default build/qshard)
# Every command is printed before it runs.
set -eu

QSHARD=${QSHARD:-build/qshard}
MODEL=${MODEL:-tests/data/models/kjv-llama-awq-gemm}
# DEMO_OUT: where the converted model goes (removed and rewritten on every run)
DEMO_OUT=${DEMO_OUT:-build/demo}
PROMPT=${PROMPT:-And God said}

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

rm -rf "$DEMO_OUT"
show "$QSHARD" convert "$MODEL" "$DEMO_OUT" --tp 1
show "$QSHARD" tokenize "$DEMO_OUT" --text "$PROMPT"
# shellcheck disable=SC2086 # DEV is empty or two words
show "$QSHARD" run "$DEMO_OUT" -p "$PROMPT" -n 32 --temp 0 $DEV
# shellcheck disable=SC2086
show "$QSHARD" run "$DEMO_OUT" -p "$PROMPT" -n 32 --temp 0.8 --top-k 40 --top-p 0.95 --seed 42 $DEV

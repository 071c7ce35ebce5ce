#!/bin/sh
# bench_load_gpu.sh - how the weight upload scales with its reader threads and with pread vs
# memcpy from the mapping (runtime/rt_cuda.cu cuda_load_weights; --debug-upload-threads,
# --debug-upload-pread, README "Debug options"), on the GPU machine (`make bench-load-gpu`): the
# synthetic Llama-2-7B (tools/fixtures/gen_fullsize.py) converted at TP 1 in /dev/shm (a warm
# page cache by construction), then `qshard run -v` of one token per setting, twice each, the
# load line (GB/s of read + upload, per-thread read rate) and the process's wall time (exec ->
# exit, one prompt token, one generated). docs/BENCHMARKS.md ("Load") records the output.
#   QSHARD=build-dev/qshard sh tools/bench_load_gpu.sh
set -e
QSHARD=${QSHARD:-build/qshard}
W=${QSHARD_BENCH_DIR:-/dev/shm/qshard-load}
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
echo "cpus: $(nproc)"
[ -d "$W/q" ] || { python3 "$(dirname "$0")/fixtures/gen_fullsize.py" llama2-7b "$W/in" >/dev/null &&
    "$QSHARD" convert "$W/in/llama2-7b" "$W/q" --tp 1 -q && rm -rf "$W/in"; }
one() { # $1 threads, $2 pread 0/1
    t0=$(date +%s.%N)
    pr=""
    [ "$2" = 1 ] && pr=--debug-upload-pread
    "$QSHARD" run "$W/q" --tokens 1 -n 1 --temp 0 --print-ids -v --debug-upload-threads "$1" $pr \
        > /dev/null 2> "$W/err" || { tail -3 "$W/err"; return 1; }
    t1=$(date +%s.%N)
    l=$(grep -o 'read + upload [0-9.]* s ([0-9.]* GB/s, [0-9]* threads' "$W/err" | head -1)
    p=$(grep -o '= [0-9.]* GB/s per thread' "$W/err" | head -1)
    echo "threads $1 pread $2 | $l | $p | exec -> exit $(python3 -c "print(round($t1 - $t0, 3))") s"
}
for th in 4 8 12 16; do
    for pr in 0 1; do
        one $th $pr
        one $th $pr
    done
done
rm -rf "$W"

#!/bin/sh
# run_gpu_tests.sh - run the GPU test programs given as arguments (tests/gpu_test_*.cu builds),
# the end-to-end fixture check (tests/gpu_test_e2e.py with $QSHARD, default: the qshard next to
# the first program), then a quick subset of each program under compute-sanitizer memcheck
# (when it is installed), sum their
# "<area>: N passed, N failed" lines and print the total last ("gpu: N passed, N failed").
# Exit status non-zero if anything failed or crashed. Used by `make test-gpu`; needs a GPU.
#   sh tests/run_gpu_tests.sh build/gpu_test_w4a16 build/gpu_test_ops
pass=0; fail=0; bad=""
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}

tally() { # $1 = label, $2 = output file, $3 = exit code
    # per-area lines only: a program's own total ("<program> total: ...") would count them twice
    lines=$(grep -E '^[A-Za-z0-9_/ -]+: [0-9]+ passed, [0-9]+ failed$' "$2" | grep -vE ' total: ')
    if [ -z "$lines" ]; then
        tail -n 40 "$2"
        echo "$1: crashed or printed no summary (exit $3)"
        fail=$((fail + 1)); bad="$bad $1"; return
    fi
    echo "$lines" | while read -r l; do echo "$l"; done
    p=$(echo "$lines" | sed -E 's/.*: ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
    f=$(echo "$lines" | sed -E 's/.* ([0-9]+) failed$/\1/' | awk '{s+=$1} END {print s+0}')
    if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    [ "$f" -ne 0 ] && { grep -E 'CHECK|error|ERROR' "$2" | head -n 40; bad="$bad $1"; }
    pass=$((pass + p)); fail=$((fail + f))
}

tmp=$(mktemp)
for t in "$@"; do
    "$t" >"$tmp" 2>&1; rc=$?
    head -n 1 "$tmp"
    tally "$t" "$tmp" "$rc"
done
# end to end on the fixtures: CUDA vs CPU backend vs transformers goldens, greedy ids
QSHARD=${QSHARD:-$(dirname "$1")/qshard}
if [ -x "$QSHARD" ] && python3 -c 'import numpy' 2>/dev/null; then
    QSHARD="$QSHARD" python3 "$(dirname "$0")/gpu_test_e2e.py" >"$tmp" 2>&1; rc=$?
    grep -E '^FAIL|vs golden' "$tmp" | head -n 120
    tally "e2e" "$tmp" "$rc"
else
    echo "e2e skipped: no $QSHARD or no python3 numpy"
fi
# the batching engine on the GPU: `qshard run --prompts` (batched, preempted, TP-1 and TP-2 on
# one GPU's ranks is not possible: TP-2 runs on the CPU) equal to each request run alone, and
# bench batch; then a small batch under memcheck
B=$(dirname "$QSHARD")
if [ -x "$B/test_cli_batch" ]; then
    QSHARD="$QSHARD" QSHARD_DEVICE=cuda "$B/test_cli_batch" >"$tmp" 2>&1; rc=$?
    tally "cli_batch (cuda)" "$tmp" "$rc"
fi
# one process per GPU (mpirun) at world size 1 on this GPU: tests/test_mpi.sh with
# QSHARD_MPI_DEVICE=cuda, when `make carry-mpi` put an MPI build (qshard-mpi) and, for a machine
# without OpenMPI, a relocatable OpenMPI (ompi/with-mpi, tools/mpi_bundle.sh) next to qshard
if [ -x "$B/qshard-mpi" ]; then
    W=""
    command -v mpirun >/dev/null 2>&1 || W="$B/ompi/with-mpi"
    if [ -z "$W" ] || [ -x "$W" ]; then
        QSHARD="$B/qshard-mpi" QSHARD_MPI_DEVICE=cuda $W bash "$(dirname "$0")/test_mpi.sh" >"$tmp" 2>&1; rc=$?
        grep -E '^(ok|FAIL) ' "$tmp" | head -n 40
        tally "mpi (cuda, world size 1)" "$tmp" "$rc"
    else
        echo "mpi (cuda) skipped: no mpirun and no $W (make carry-mpi)"
    fi
fi
if [ -x "$SAN" ] && [ -x "$QSHARD" ]; then
    # a small batch through the engine under memcheck: paged attention, bucketed decode graphs,
    # chunked prefill beside decode rows, preemption in a pool of 6 blocks
    d=$(mktemp -d)
    "$QSHARD" convert "$(dirname "$0")/data/models/kjv-llama-awq-gemm" "$d/m" --tp 1 -q 2>/dev/null
    for i in 1 2 3 4 5 6; do
        echo "{\"prompt\": \"And God said $i\", \"max_tokens\": $((20 + 4 * i)), \"temperature\": 0.$i, \"seed\": $i}"
    done >"$d/p.jsonl"
    "$SAN" --tool memcheck --error-exitcode 99 "$QSHARD" run "$d/m" --prompts "$d/p.jsonl" \
        --device cuda --max-num-seqs 3 --ctx 96 --kv-cache-gb 0.000575 -b 32 >"$tmp" 2>&1; rc=$?
    echo "memcheck qshard run --prompts (exit $rc):"
    grep -E 'ERROR SUMMARY|preemption' "$tmp" | sed 's/^/  /'
    n=$(grep -c '"finish_reason"' "$tmp")
    if [ "$rc" -eq 0 ] && [ "$n" -eq 6 ]; then echo "memcheck_batch: 1 passed, 0 failed" >"$tmp"
    else tail -n 20 "$tmp"; echo "memcheck_batch: 0 passed, 1 failed" >"$tmp"; fi
    tally "memcheck qshard run --prompts" "$tmp" 0
    rm -rf "$d"
fi
if [ -x "$SAN" ]; then
    # one GPU under the sanitizer: the all-reduce's ranks wait for each other on the GPUs, and
    # instrumented launches need not run at the same time (that area then runs its refusals only)
    vis=${CUDA_VISIBLE_DEVICES:-0}
    for t in "$@"; do
        CUDA_VISIBLE_DEVICES=${vis%%,*} "$SAN" --tool memcheck --leak-check full --error-exitcode 99 "$t" --quick >"$tmp" 2>&1; rc=$?
        echo "memcheck $t --quick (exit $rc):"
        grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$tmp" | sed 's/^/  /'
        sed -i -E 's/^([A-Za-z0-9_]+): ([0-9]+ passed)/memcheck_\1: \2/' "$tmp"
        tally "memcheck $t" "$tmp" "$rc"
    done
else
    echo "compute-sanitizer not found ($SAN): memcheck skipped"
fi
rm -f "$tmp"
[ -n "$bad" ] && echo "failing:$bad"
echo "gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

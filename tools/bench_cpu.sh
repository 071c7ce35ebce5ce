#!/bin/sh
# bench_cpu.sh - CPU benchmarks of the .qshard format (what `make bench` runs; appends nothing).
#
# Writes two synthetic .qshard files with the library writer into a temp directory, each with the
# same number of tensors (QSHARD_BENCH_TENSORS, default 291 = LLaMA-7B's count) so only the data
# size differs, then reports:
#   - open+validate+close time of both (must not grow with data size: O(metadata));
#   - verify throughput (XXH3-64 of every tensor via the mapping) against a plain read() of the
#     same file, in the same run, with a warm page cache and with the file dropped from it.
# Knobs: QSHARD (binary, default build/qshard), QSHARD_BENCH_GB (big file, default 4),
# QSHARD_BENCH_SMALL_MB (small file, default 1024), QSHARD_BENCH_DIR (default $TMPDIR or /tmp).
# The temp directory is removed at exit.
set -e
Q=${QSHARD:-build/qshard}
GB=${QSHARD_BENCH_GB:-4}
SMALL_MB=${QSHARD_BENCH_SMALL_MB:-1024}
NT=${QSHARD_BENCH_TENSORS:-291}
BIG_MB=$((GB * 1024))
base=${QSHARD_BENCH_DIR:-${TMPDIR:-/tmp}}
[ -x "$Q" ] || { echo "bench_cpu.sh: $Q not found (make first, or set QSHARD)" >&2; exit 1; }

need_kb=$(( (BIG_MB + SMALL_MB + 64) * 1024 ))
free_kb=$(df -Pk "$base" | awk 'NR == 2 { print $4 }')
if [ "$free_kb" -lt "$need_kb" ]; then
    echo "bench_cpu.sh: need $((need_kb / 1024)) MiB free in $base, have $((free_kb / 1024)) MiB" \
         "(set QSHARD_BENCH_GB or QSHARD_BENCH_DIR)" >&2
    exit 1
fi
dir=$(mktemp -d "$base/qshard-bench.XXXXXX")
trap 'rm -rf "$dir"' EXIT INT TERM

echo "== qshard format benchmark"
echo "machine: $(uname -srm); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //');" \
     "$(awk '/MemTotal/ { printf "%.1f GiB RAM", $2 / 1048576 }' /proc/meminfo);" \
     "files on $(df -PT "$dir" | awk 'NR == 2 { print $2 }') ($dir)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews the numbers)"
echo "command: QSHARD_BENCH_GB=$GB QSHARD_BENCH_SMALL_MB=$SMALL_MB QSHARD_BENCH_TENSORS=$NT sh tools/bench_cpu.sh"
echo
echo "-- write (fmt_writer, 4 MiB chunks, one thread; includes fsync)"
"$Q" bench synth "$dir/small.qshard" --size-mb "$SMALL_MB" --tensors "$NT"
"$Q" bench synth "$dir/big.qshard" --size-mb "$BIG_MB" --tensors "$NT"
echo
echo "-- open + validate + close (fmt_shard_open: header, sections, table; no tensor data)"
"$Q" bench open "$dir/small.qshard" --repeat 200
"$Q" bench open "$dir/big.qshard" --repeat 200
echo
echo "-- verify (every tensor XXH3-64 + padding + tokenizer) vs plain read() of the same file"
"$Q" bench verify "$dir/big.qshard" --repeat 3
"$Q" bench verify "$dir/big.qshard" --repeat 2 --cold

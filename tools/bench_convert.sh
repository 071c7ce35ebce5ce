#!/bin/sh
# bench_convert.sh - converter throughput and peak RSS on a full-size synthetic checkpoint.
#
# Generates a synthetic AutoAWQ GEMM checkpoint with the real tensor names and shapes
# (tools/fixtures/gen_fullsize.py, default llama2-7b, ~3.9 GB) unless QSHARD_BENCH_MODEL names an
# existing model directory, warms the page cache with one `cat`, then in the same run reports:
#   - `cat` of the same input files to /dev/null (warm page cache): the issue's baseline;
#   - `qshard convert --tp N` (self-check on, the default) and with --no-check: wall time,
#     input bytes / wall time, ratio to cat, peak RSS and CPU use from /usr/bin/time -v.
# Output goes to the same filesystem as the input; every run includes the writer's fsync.
# Knobs: QSHARD (binary, default build/qshard), QSHARD_BENCH_DIR (default $TMPDIR or /tmp),
# QSHARD_BENCH_MODEL (existing directory), QSHARD_BENCH_WHICH (gen_fullsize model, default
# llama2-7b), QSHARD_BENCH_TP (default "1 2"), PYTHON (default python3). Temp files are removed.
set -e
Q=${QSHARD:-build/qshard}
PY=${PYTHON:-python3}
WHICH=${QSHARD_BENCH_WHICH:-llama2-7b}
TPS=${QSHARD_BENCH_TP:-"1 2"}
base=${QSHARD_BENCH_DIR:-${TMPDIR:-/tmp}}
[ -x "$Q" ] || { echo "bench_convert.sh: $Q not found (make first, or set QSHARD)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench_convert.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
dir=$(mktemp -d "$base/qshard-bench-cvt.XXXXXX")
trap 'rm -rf "$dir"' EXIT INT TERM

model=${QSHARD_BENCH_MODEL:-}
if [ -z "$model" ]; then
    "$PY" tools/fixtures/gen_fullsize.py "$WHICH" "$dir/in" >/dev/null
    model="$dir/in/$WHICH"
fi
files=$(ls "$model"/*.safetensors "$model"/*.bin "$model"/*.pt 2>/dev/null || true)
bytes=$(cat $files | wc -c)

echo "== qshard convert benchmark"
echo "machine: $(uname -srm); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //');" \
     "$(awk '/MemTotal/ { printf "%.1f GiB RAM", $2 / 1048576 }' /proc/meminfo);" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); files on $(df -PT "$dir" | awk 'NR == 2 { print $2 }')"
echo "command: QSHARD_BENCH_WHICH=$WHICH QSHARD_BENCH_TP=\"$TPS\" sh tools/bench_convert.sh"
echo "input: $model: $(echo $files | wc -w) file(s), $bytes bytes"
echo

cat $files >/dev/null # warm the page cache
t0=$(date +%s.%N)
cat $files >/dev/null
t1=$(date +%s.%N)
cat_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
cat_gbs=$(awk -v n="$bytes" -v s="$cat_s" 'BEGIN { print n / s / 1e9 }')
printf "cat (warm)                     %8.2f s  %6.2f GB/s\n" "$cat_s" "$cat_gbs"

run() { # label, then convert arguments
    label=$1
    shift
    rm -rf "$dir/out"
    /usr/bin/time -v -o "$dir/time.txt" "$Q" convert "$model" "$dir/out" -q "$@"
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0;
                       for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s }' "$dir/time.txt")
    rss=$(awk -F': ' '/Maximum resident set size/ { printf "%.0f", $2 / 1024 }' "$dir/time.txt")
    cpu=$(awk -F': ' '/Percent of CPU/ { print $2 }' "$dir/time.txt")
    gbs=$(awk -v n="$bytes" -v s="$wall" 'BEGIN { print n / s / 1e9 }')
    ratio=$(awk -v a="$gbs" -v b="$cat_gbs" 'BEGIN { print a / b }')
    printf "%-30s %8.2f s  %6.2f GB/s  %5.2fx cat  peak RSS %5s MiB  CPU %s\n" "$label" "$wall" \
           "$gbs" "$ratio" "$rss" "$cpu"
}
for tp in $TPS; do
    run "convert --tp $tp" --tp "$tp"
    run "convert --tp $tp --no-check" --tp "$tp" --no-check
done

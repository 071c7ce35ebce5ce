#!/bin/sh
# bench_convert.sh - converter throughput, CPU time and peak RSS on a full-size synthetic
# checkpoint, against two `cat` baselines measured in the same run.
#
# Generates a synthetic AutoAWQ GEMM checkpoint with the real tensor names and shapes
# (tools/fixtures/gen_fullsize.py, default llama2-7b, ~3.9 GB) unless QSHARD_BENCH_MODEL names an
# existing model directory, warms the page cache with one `cat`, then reports:
#   - `cat` of the input files to /dev/null (warm page cache): the issue's baseline;
#   - `cat` of the input files into one file in the output directory, then `sync` of that file
#     (fsync: what any converter must at least do: read the input, write as many bytes, make
#     them durable) - "cat+sync";
#   - `qshard convert --tp N` (self-check on, the default) and with --no-check, each into a
#     fresh directory next to cat+sync's file (the converter fsyncs and renames every file).
# Per run: wall time, input bytes / wall time, ratio to both baselines (baseline time / convert
# time: 1 = as fast), CPU seconds (user + sys) and peak RSS. Timing and rusage come from a small
# python3 wrapper (os.wait4), so /usr/bin/time is not needed.
#
# Knobs: QSHARD (binary, default build/qshard; e.g. a carried build-dev/qshard),
#   QSHARD_BENCH_OUT (directory to convert into, default the bench's temp directory; e.g.
#   /dev/shm to take the disk out: needs RAM for one rank set of output, ~3.7 GB for the 7B),
#   QSHARD_BENCH_DIR (temp directory for a generated model, default $TMPDIR or /tmp),
#   QSHARD_BENCH_MODEL (existing model directory: skip generation),
#   QSHARD_BENCH_WHICH (gen_fullsize model, default llama2-7b), QSHARD_BENCH_TP (default "1 2"),
#   QSHARD_BENCH_ARGS (extra convert arguments, e.g. "--threads 8"), PYTHON (default python3).
# Everything it creates is removed on exit.
set -e
Q=${QSHARD:-build/qshard}
PY=${PYTHON:-python3}
WHICH=${QSHARD_BENCH_WHICH:-llama2-7b}
TPS=${QSHARD_BENCH_TP:-"1 2"}
EXTRA=${QSHARD_BENCH_ARGS:-}
base=${QSHARD_BENCH_DIR:-${TMPDIR:-/tmp}}
[ -x "$Q" ] || { echo "bench_convert.sh: $Q not found (make first, or set QSHARD)" >&2; exit 1; }
command -v "$PY" >/dev/null || { echo "bench_convert.sh: needs $PY" >&2; exit 1; }
dir=$(mktemp -d "$base/qshard-bench-cvt.XXXXXX")
outbase=$dir
if [ -n "${QSHARD_BENCH_OUT:-}" ]; then
    mkdir -p "$QSHARD_BENCH_OUT"
    outbase=$(mktemp -d "$QSHARD_BENCH_OUT/qshard-bench-out.XXXXXX")
fi
trap 'rm -rf "$dir" "$outbase"' EXIT INT TERM

# measure CMD...: runs CMD (stdout to $MEASURE_STDOUT or /dev/null, stderr to $MEASURE_STDERR
# when set) and prints
# "wall_s user_s sys_s maxrss_kib exit_code" (rusage of CMD and its children).
measure() {
    "$PY" - "$@" <<'EOF'
import os, sys, time
out = os.environ.get("MEASURE_STDOUT", "/dev/null")
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    if os.environ.get("MEASURE_STDERR"):
        fd = os.open(os.environ["MEASURE_STDERR"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        sys.stderr.write("bench_convert.sh: %s: %s\n" % (sys.argv[1], e))
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.monotonic() - t0
print("%.3f %.2f %.2f %d %d" % (wall, ru.ru_utime, ru.ru_stime, ru.ru_maxrss,
                                os.waitstatus_to_exitcode(status)))
EOF
}

model=${QSHARD_BENCH_MODEL:-}
if [ -z "$model" ]; then
    "$PY" tools/fixtures/gen_fullsize.py "$WHICH" "$dir/in" >/dev/null
    model="$dir/in/$WHICH"
fi
files=$(ls "$model"/*.safetensors "$model"/*.bin "$model"/*.pt 2>/dev/null || true)
[ -n "$files" ] || { echo "bench_convert.sh: no weight files in $model" >&2; exit 1; }
bytes=$(cat $files | wc -c)

echo "== qshard convert benchmark"
echo "machine: $(uname -srm); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //');" \
     "$(awk '/MemTotal/ { printf "%.1f GiB RAM", $2 / 1048576 }' /proc/meminfo);" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
fstype() { df -PT "$1" | awk 'NR == 2 { print $2 }'; }
echo "input: $model: $(echo $files | wc -w) file(s), $bytes bytes, on $(fstype "$model")"
echo "output: $outbase on $(fstype "$outbase")"
knobs="QSHARD=$Q QSHARD_BENCH_TP=\"$TPS\""
[ -z "${QSHARD_BENCH_OUT:-}" ] || knobs="$knobs QSHARD_BENCH_OUT=$QSHARD_BENCH_OUT"
[ -z "$EXTRA" ] || knobs="$knobs QSHARD_BENCH_ARGS=\"$EXTRA\""
echo "command: $knobs sh tools/bench_convert.sh"
echo

cat $files >/dev/null # warm the page cache
set -- $(measure cat $files)
cat_s=$1
set -- $(measure sh -c 'cat "$@" > "$0/cat.out" && sync "$0/cat.out"' "$outbase" $files)
catsync_s=$1
catsync_rc=$5
rm -f "$outbase/cat.out"
[ "$catsync_rc" = 0 ] ||
    echo "warning: cat+sync exited $catsync_rc (sync FILE needs coreutils >= 8.24)"
gbs() { awk -v n="$bytes" -v s="$1" 'BEGIN { printf "%.2f", n / s / 1e9 }'; }
printf "%-34s %8.2f s  %6.2f GB/s\n" "cat > /dev/null (warm)" "$cat_s" "$(gbs "$cat_s")"
printf "%-34s %8.2f s  %6.2f GB/s\n" "cat > OUT/file && sync file" "$catsync_s" \
       "$(gbs "$catsync_s")"

fail=0
run() { # label, then convert arguments
    label=$1
    shift
    rm -rf "$outbase/out"
    set -- $(MEASURE_STDERR="$dir/stderr.txt" measure "$Q" convert "$model" "$outbase/out" -q "$@")
    if [ "$5" != 0 ]; then
        printf "%-34s FAILED (exit %s)\n" "$label" "$5"
        cat "$dir/stderr.txt"
        fail=1
        return
    fi
    r_cat=$(awk -v a="$cat_s" -v b="$1" 'BEGIN { printf "%.3f", a / b }')
    r_sync=$(awk -v a="$catsync_s" -v b="$1" 'BEGIN { printf "%.3f", a / b }')
    cpu=$(awk -v u="$2" -v s="$3" 'BEGIN { printf "%.1f", u + s }')
    fmt="%-34s %8.2f s  %6.2f GB/s  %5.3fx cat  %5.3fx cat+sync  CPU %6s s (user %s, sys %s)"
    printf "$fmt  peak RSS %d MiB\n" "$label" "$1" "$(gbs "$1")" "$r_cat" "$r_sync" "$cpu" "$2" \
           "$3" $(($4 / 1024))
    rm -rf "$outbase/out"
}
for tp in $TPS; do
    run "convert --tp $tp" --tp "$tp" $EXTRA
    run "convert --tp $tp --no-check" --tp "$tp" --no-check $EXTRA
done
exit $fail

#!/bin/sh
# run_fuzz.sh - run each libFuzzer binary given as an argument for $QSHARD_FUZZ_SECONDS (default
# 60) on a temporary copy of its seed corpus tests/data/fuzz/<binary name>/ (the committed seeds
# are never modified). Exits non-zero if any target crashes, leaks, times out or finds an
# ASan/UBSan error; the crashing input is kept and its path printed. Used by `make fuzz`
# (`make fuzz FUZZ_SECONDS=600` for a longer run). Run from the repository root.
secs=${QSHARD_FUZZ_SECONDS:-60}
status=0
[ $# -gt 0 ] || { echo "usage: tests/run_fuzz.sh FUZZ_BINARY..." >&2; exit 1; }
for bin in "$@"; do
    name=$(basename "$bin")
    seeds="tests/data/fuzz/$name"
    work=$(mktemp -d "${TMPDIR:-/tmp}/qshard-$name.XXXXXX") || exit 1
    mkdir -p "$work/corpus" "$work/artifacts"
    if [ -d "$seeds" ]; then
        cp "$seeds"/* "$work/corpus/" 2>/dev/null
    else
        echo "fuzz: $name: warning: no seed corpus at $seeds"
    fi
    n=$(ls "$work/corpus" | wc -l)
    echo "fuzz: $name for ${secs}s on $n seed file(s)"
    "$bin" -max_total_time="$secs" -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" \
        >"$work/log" 2>&1
    rc=$?
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+.*DONE' "$work/log" | sed 's/^/  /'
    if [ "$rc" -ne 0 ] || [ -n "$(ls "$work/artifacts")" ]; then
        tail -n 60 "$work/log"
        echo "fuzz: $name FAILED (exit $rc); log and crashing input kept in $work"
        status=1
    else
        echo "fuzz: $name ok ($(ls "$work/corpus" | wc -l) corpus files at the end)"
        rm -rf "$work"
    fi
done
exit $status

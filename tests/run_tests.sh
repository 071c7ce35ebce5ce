#!/bin/sh
# run_tests.sh - run every CPU test program given as arguments from the repository root, sum
# their "<area>: N passed, N failed" lines and print the total as the last line. Exit status is
# non-zero if any program failed or crashed. Used by `make test` and `make check`.
pass=0; fail=0; bad=""
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[A-Za-z0-9_-]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        printf '%s\n' "$out"
        echo "$t: crashed or printed no summary (exit $rc)"
        fail=$((fail + 1)); bad="$bad $t"; continue
    fi
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    [ "$f" -ne 0 ] && { printf '%s\n' "$out" | tail -n 40; bad="$bad $t"; }
    echo "$line"
    pass=$((pass + p)); fail=$((fail + f))
done
[ -n "$bad" ] && echo "failing:$bad"
echo "qshard: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

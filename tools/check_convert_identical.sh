#!/bin/sh
# check_convert_identical.sh OLD NEW - the converter's output contract across a code change:
# convert every fixture of tests/data/models/INDEX.json at every tp from 1 to 8 with the qshard
# binary OLD and the qshard binary NEW and require
#   - the same exit status (a tp the model cannot take is refused by both, with the same code);
#   - byte-identical files (`cmp`) for every file either conversion wrote (rank files,
#     manifest.json), and the same list of files;
# and the same `--dry-run` plan on stdout for every fixture and tp both convert, and for every
# directory under tests/data/real-configs/ (config files only, no weights) at every tp from 1
# to 8 (with the same exit status).
# Run from the repository root, e.g.
#   sh tools/check_convert_identical.sh /path/to/old/build/qshard build/qshard
# Prints one line per difference and a summary; exits 1 if anything differs, 2 on bad usage.
set -u
if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: $0 OLD_QSHARD NEW_QSHARD (two executable qshard binaries)" >&2
    exit 2
fi
OLD=$1
NEW=$2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/qshard-identical.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
paths=$(python3 -c 'import json; print("\n".join(m["path"] for m in json.load(open("tests/data/models/INDEX.json"))["models"]))') || exit 2

n_conv=0; n_files=0; n_refused=0; n_plans=0; bad=0
for p in $paths; do
    for tp in 1 2 3 4 5 6 7 8; do
        o="$TMP/old/$p/tp$tp"; n="$TMP/new/$p/tp$tp"
        "$OLD" convert "tests/data/$p" "$o" --tp "$tp" --quiet >"$TMP/old.out" 2>&1; rc_o=$?
        "$NEW" convert "tests/data/$p" "$n" --tp "$tp" --quiet >"$TMP/new.out" 2>&1; rc_n=$?
        if [ "$rc_o" -ne "$rc_n" ]; then
            echo "DIFF $p tp $tp: exit $rc_o (old) vs $rc_n (new)"; bad=$((bad + 1)); continue
        fi
        if [ "$rc_o" -ne 0 ]; then n_refused=$((n_refused + 1)); continue; fi
        lo=$(cd "$o" && ls -A); ln=$(cd "$n" && ls -A)
        if [ "$lo" != "$ln" ]; then
            echo "DIFF $p tp $tp: files [$lo] (old) vs [$ln] (new)"; bad=$((bad + 1)); continue
        fi
        for f in $lo; do
            if cmp -s "$o/$f" "$n/$f"; then n_files=$((n_files + 1)); else
                echo "DIFF $p tp $tp: $f differs"; bad=$((bad + 1)); fi
        done
        n_conv=$((n_conv + 1))
        rm -rf "$o" "$n"
        "$OLD" convert "tests/data/$p" --tp "$tp" --dry-run --quiet >"$TMP/old.out" 2>/dev/null
        "$NEW" convert "tests/data/$p" --tp "$tp" --dry-run --quiet >"$TMP/new.out" 2>/dev/null
        if cmp -s "$TMP/old.out" "$TMP/new.out"; then n_plans=$((n_plans + 1)); else
            echo "DIFF $p tp $tp: dry-run plan differs"; bad=$((bad + 1)); fi
    done
done
for d in tests/data/real-configs/*/; do
    for tp in 1 2 3 4 5 6 7 8; do
        "$OLD" convert "$d" --tp "$tp" --dry-run --quiet >"$TMP/old.out" 2>/dev/null; rc_o=$?
        "$NEW" convert "$d" --tp "$tp" --dry-run --quiet >"$TMP/new.out" 2>/dev/null; rc_n=$?
        if [ "$rc_o" -ne "$rc_n" ] || ! cmp -s "$TMP/old.out" "$TMP/new.out"; then
            echo "DIFF $d tp $tp: dry-run plan or exit status ($rc_o vs $rc_n) differs"
            bad=$((bad + 1))
        fi
        n_plans=$((n_plans + 1))
    done
done
echo "check_convert_identical: $n_conv conversions ($n_files files byte-identical), $n_refused tp refused by both, $n_plans dry-run plans compared, $bad difference(s)"
[ "$bad" -eq 0 ]

#!/bin/sh
# instr_ops.sh: instructions an op costs, all threads of a rank together, counted by callgrind (the
# build VM's wall clock is too noisy for differences of a few hundred instructions).
#   scripts/bench/instr_ops.sh [TPSH] [CASE...]     (default build/tpsh; cases add_fresh add_out all_reduce)
# Each case runs twice, with 20,000 and 60,000 ops after the same warm-up: the difference over 40,000 is
# the cost of an op without start-up's. Collectives run on one rank (with two, MPI's polling under
# callgrind, which runs one thread at a time, counts as long as the other rank takes). Figures: docs/perf.md.
set -eu
tpsh=${1:-build/tpsh}
[ $# -gt 0 ] && shift
cases=${*:-add_fresh add_out all_reduce}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
script=$(dirname "$0")/instr_ops.lua
total() {  # callgrind's total for case $1 with $2 ops
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg" "$tpsh" --backend cpu "$script" "$1" "$2" \
    >/dev/null 2>"$dir/log" || { cat "$dir/log" >&2; exit 1; }
  awk '/^summary:/ { print $2 }' "$dir/cg"
}
for c in $cases; do
  a=$(total "$c" 20000)
  b=$(total "$c" 60000)
  echo "$c" "$a" "$b" | awk '{ printf "instructions an op %-10s %7.0f\n", $1, ($3 - $2) / 40000 }'
done

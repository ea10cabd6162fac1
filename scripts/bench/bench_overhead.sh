#!/usr/bin/env bash
# Runs the Lua and the C overhead loops back to back and prints the ratio per case.
#   scripts/bench/bench_overhead.sh [build dir] [iters] [--backend cuda]
set -euo pipefail
build=${1:-build}; iters=${2:-200000}; shift $(( $# > 2 ? 2 : $# )) || true
lua=$("$build/tpsh" "$@" scripts/bench/bench_overhead.lua "$iters")
ref=$("$build/bench_overhead_ref" "$iters" "$@")
echo "$lua"; echo "$ref"
paste <(echo "$lua") <(echo "$ref") | awk -F'\t' '{
  n = split($1, a, / +/); split($2, b, / +/);
  name = $1; sub(/^lua +/, "", name); sub(/ +[0-9.]+ us\/op$/, "", name);
  printf("ratio %-28s %6.2fx  (lua %s us, c %s us)\n", name, a[n-1] / b[n-1], a[n-1], b[n-1]) }'

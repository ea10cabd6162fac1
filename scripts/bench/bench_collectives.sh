#!/bin/sh
# bench_collectives.sh: tpsh's collectives against C code calling MPI directly, in the same run.
#
#   scripts/bench/bench_collectives.sh [-n NP] [-r REPEATS] [-b BUILD_DIR] [--min 1K --max 64M --iters N ...]
#
# Runs build/bench_collectives_ref (C, blocking MPI calls from main) and scripts/bench/bench_collectives.lua
# (tpsh, the current stream) alternately REPEATS times with the same arguments, keeps the best busbw
# of each per (collective, size) (a shared machine is noisy; the best run is the least disturbed), and
# prints both with the ratio tpsh / C. The last lines give, per collective, the lowest ratio at sizes
# of 1 MiB and above (the target is >= 0.9).
set -eu
NP=2 REPEATS=3 BUILD=build
while [ $# -gt 0 ]; do
  case "$1" in
    -n) NP=$2; shift 2 ;;
    -r) REPEATS=$2; shift 2 ;;
    -b) BUILD=$2; shift 2 ;;
    *) break ;;
  esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
i=1
while [ "$i" -le "$REPEATS" ]; do
  mpiexec -n "$NP" "$BUILD/bench_collectives_ref" "$@" --csv "$TMP/ref$i.csv" >/dev/null
  mpiexec -n "$NP" "$BUILD/tpsh" --backend cpu scripts/bench/bench_collectives.lua "$@" --csv "$TMP/tp$i.csv" >/dev/null
  i=$((i + 1))
done
echo "# $NP ranks, best of $REPEATS runs each; busbw in GB/s (nccl-tests factors), time of the best run in us"
awk -F, '
  FNR == 1 { kind = (FILENAME ~ /\/ref[0-9]+\.csv$/) ? "c" : "t"; next }
  {
    k = $1 SUBSEP $2
    if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    if ($7 + 0 > best[kind, k] + 0) { best[kind, k] = $7; time[kind, k] = $5 }
  }
  END {
    printf "%-15s %12s %12s %10s %12s %10s %7s\n", "collective", "size (B)", "C time", "C busbw", "tpsh time", "tpsh busbw", "ratio"
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, p, SUBSEP)
      r = best["c", k] > 0 ? best["t", k] / best["c", k] : 0
      printf "%-15s %12d %12.1f %10.3f %12.1f %10.3f %7.2f\n", p[1], p[2], time["c", k], best["c", k], time["t", k], best["t", k], r
      if (p[2] >= 1048576 && (!(p[1] in worst) || r < worst[p[1]])) { worst[p[1]] = r; if (!(p[1] in ops)) { ops[p[1]] = 1; oo[++m] = p[1] } }
    }
    print ""
    for (j = 1; j <= m; j++) printf "%-15s lowest ratio at >= 1 MiB: %.2f\n", oo[j], worst[oo[j]]
  }' "$TMP"/ref*.csv "$TMP"/tp*.csv

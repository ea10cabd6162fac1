#!/usr/bin/env bash
# ab_collectives.sh: A/B of tpsh builds on one GPU machine, in one call. Each binary runs
# bench_collectives.lua --ref --ref-event (the C loop and the C loop with an end event in its own
# process, in turn) R times, the binaries interleaved, so that every variant sees the same machine;
# prints per process the median over 1-4 KiB sizes x rounds of tpsh / C and tpsh / (C + end event).
# Machines differ by more than most changes (docs/perf.md), so compare variants within one call only.
#   VARIANTS="build-a/tpsh build-b/tpsh" [R=4] [OPS=reduce_scatter,all_gather] OUT=... scripts/bench/ab_collectives.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-$( [ -x .gpu/build/tpsh ] && echo .gpu/build || echo build )}
OUT=${OUT:-/tmp/ab}; R=${R:-4}; VARIANTS=${VARIANTS:-$BUILD/tpsh}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
for i in $(seq "$R"); do
  for v in $VARIANTS; do
    n=$(basename "$(dirname "$v")")_$(basename "$v")
    mpiexec -n 2 "$v" --backend cuda scripts/bench/bench_collectives.lua --ops "${OPS:-reduce_scatter,all_gather}" \
      --min 1K --max 4K --rounds 9 --ref "$BUILD/libtpsh_nccl_ref.so" --ref-event --csv "$OUT/ab_${n}_$i.csv" \
      > /dev/null || echo "ab: $v failed in run $i"
  done
done
for v in $VARIANTS; do
  n=$(basename "$(dirname "$v")")_$(basename "$v")
  for i in $(seq "$R"); do
    awk -F, -f scripts/bench/paired_medians.awk "$OUT/ab_${n}_$i.csv" | while read -r c ratio ratio_ev _; do
      printf '%-15s %-28s run %d: tpsh / C %s, tpsh / (C + end event) %s\n' "$c" "$n" "$i" "$ratio" "$ratio_ev"
    done
  done
done | sort

#!/usr/bin/env bash
# profile_collective.sh: where a small collective's host time goes, by sampling. Rank 0 of
# scripts/diag/profile_loop.lua runs under perf (cpu-clock at 20 kHz: the GPU machine's VM has no hardware
# counters), once per mode (the C loop, NCCL through the FFI, the public call); the reports are of its
# main thread only, by library and by function, per mode, in $OUT; ANNOTATE="fn ..." adds the hottest
# instructions of those functions of the public call. perf is not on the GPU machine:
# scripts/gpu/gpu_prepare.sh packs the build machine's (Debian's linux-perf; scripts/diag/rank0_tool.sh).
#   OUT=... [N=1000000] [MODES="cloop raw public"] [ANNOTATE="batch_issue ..."] scripts/diag/profile_collective.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/diag/rank0_tool.sh
OUT=${OUT:-/tmp/profile}; N=${N:-1000000}
mkdir -p "$OUT"
need_tool perf
PERF() { LD_LIBRARY_PATH=/tmp/perfpack/lib /tmp/perfpack/perf "$@"; }
for m in ${MODES:-cloop raw public}; do
  rank0 "$m" "$N" /tmp/perfpack/perf record -q -F 20000 -e cpu-clock -o "$OUT/p_$m.data" -- 2>&1 | grep -v '^\[ perf'
  tid=$(PERF report -i "$OUT/p_$m.data" --stdio --sort pid 2>/dev/null | grep -v '^#' | grep -m1 -oE '[0-9]+:tpsh' | cut -d: -f1)
  PERF report -i "$OUT/p_$m.data" --stdio -n --tid "$tid" --sort dso 2>/dev/null | grep -v '^$' | head -20 > "$OUT/dso_$m.txt"
  PERF report -i "$OUT/p_$m.data" --stdio -n --tid "$tid" --sort dso,sym --percent-limit 0.04 2>/dev/null |
    grep -v '^$' > "$OUT/sym_$m.txt"
  if [ "$m" = public ]; then
    for f in ${ANNOTATE:-}; do
      PERF annotate -i "$OUT/p_$m.data" --stdio -s "$f" 2>/dev/null | grep -E '^\s+[0-9]+\.[0-9]+ :' |
        sort -rn | head -25 > "$OUT/ann_$f.txt"
    done
  fi
  rm -f "$OUT/p_$m.data"
done
head -30 "$OUT"/dso_*.txt

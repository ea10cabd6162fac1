#!/usr/bin/env bash
# profile_collective.sh: where a small collective's host time goes, by sampling. Rank 0 of
# scripts/profile_loop.lua runs under perf (cpu-clock at 20 kHz: the GPU machine's VM has no hardware
# counters), once per mode (the C loop, NCCL through the FFI, the public call); the reports are of its
# main thread only, by library and by function, per mode, in $OUT; ANNOTATE="fn ..." adds the hottest
# instructions of those functions of the public call. perf is not on the GPU machine:
# scripts/gpu_prepare.sh packs the build machine's (Debian's linux-perf) into .gpu/tools.tar.xz.
#   OUT=... [N=1000000] [MODES="cloop raw public"] [ANNOTATE="batch_issue ..."] scripts/profile_collective.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-$( [ -x .gpu/build/tpsh ] && echo .gpu/build || echo build )}
OUT=${OUT:-/tmp/profile}; N=${N:-1000000}
mkdir -p "$OUT"
[ -x /tmp/perfpack/perf ] || tar xJf .gpu/tools.tar.xz -C /tmp || { echo "no perf: run scripts/gpu_prepare.sh where perf is installed"; exit 1; }
PERF() { LD_LIBRARY_PATH=/tmp/perfpack/lib /tmp/perfpack/perf "$@"; }
export TPSH_NCCL_REF=$(realpath "$BUILD/libtpsh_nccl_ref.so") BUILD N OUT
for m in ${MODES:-cloop raw public}; do
  # perf's own libraries only for perf: tpsh gets the caller's library path back
  mpiexec -n 2 bash -c 'if [ "$PMI_RANK" = 0 ]; then
      L=${LD_LIBRARY_PATH:-}; LD_LIBRARY_PATH=/tmp/perfpack/lib /tmp/perfpack/perf record -q -F 20000 -e cpu-clock \
        -o "$OUT/p_$0.data" -- env LD_LIBRARY_PATH="$L" "$BUILD/tpsh" --backend cuda scripts/profile_loop.lua "$0" "$N"
    else exec "$BUILD/tpsh" --backend cuda scripts/profile_loop.lua "$0" "$N"; fi' "$m" 2>&1 | grep -v '^\[ perf'
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

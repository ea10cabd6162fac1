#!/usr/bin/env bash
# diag_memory_pressure.sh: the GPU machine's slow state on demand. The small-collective comparison of
# gpu_check's paired step (bench_collectives.lua --ref --ref-event: tpsh against NCCL called from C, in
# one process, round by round, at 1-4 KiB) while N other processes stream through memory on other CPUs,
# as a busy neighbour on the same host would. docs/perf.md ("the slow state on demand") has what it
# showed: NCCL's own call slows by up to 2x, and tpsh's excess over it grows faster than the call does.
#
#   tar xJf .gpu/runtime.tar.xz -C /tmp && source /tmp/tpsh-rt/env.sh &&
#     LEVELS="0 12 24" REPS=3 scripts/diag/diag_memory_pressure.sh          (gpu_check step "pressure")
#
# The ranks run on CPUs 0..NP-1 (taskset around mpiexec); streamer k on CPU NP+2+k, each a python3
# process adding 1.0 to a 256 MiB numpy array in a loop (python3 with numpy comes with PyTorch on the
# GPU machine). Levels are taken in turn within each repeat, so that a drift of the machine's own state
# falls on every level. Env: OUT (default /tmp/pressure), BUILD, NP (default 2), LEVELS (numbers of
# streamers, default "0 12 24"), REPS (default 3), ROUNDS (bench rounds a size, default 9).
# Per run: the C loop's best time a call at 1 KiB and the medians over sizes x rounds of tpsh / C and
# tpsh / (C + an end event per call) (scripts/bench/paired_medians.awk); then per level the median of the runs' figures. CSVs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pressure}
BUILD=${BUILD:-$( [ -x .gpu/build/tpsh ] && echo .gpu/build || echo build )}
NP=${NP:-2}; LEVELS=${LEVELS:-0 12 24}; REPS=${REPS:-3}; ROUNDS=${ROUNDS:-9}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
die() { echo "diag_memory_pressure: $*" >&2; exit 1; }
[ -f "$BUILD/libtpsh_nccl_ref.so" ] || die "$BUILD/libtpsh_nccl_ref.so is missing (the C reference: a CUDA build)"
python3 -c 'import numpy' 2>/dev/null || die "python3 with numpy is needed for the memory streamers"
ncpu=$(nproc)
for n in $LEVELS; do
  [ $((NP + 2 + n)) -le "$ncpu" ] || die "level $n needs $((NP + 2 + n)) CPUs (ranks, two spare, streamers); this machine has $ncpu"
done

pids=()
start_streamers() {
  local k
  for ((k = 0; k < $1; k++)); do
    taskset -c $((NP + 2 + k)) python3 -c 'import numpy as np
a = np.ones(1 << 25)                       # 256 MiB, far larger than any cache
while True: a += 1.0' &
    pids+=($!)
  done
  sleep 1                                  # every streamer has allocated and is streaming
}
stop_streamers() {
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  pids=()
}
trap stop_streamers EXIT
trap 'exit 1' TERM INT                  # through the EXIT trap: no streamer outlives the script

# the median of column $2 of the runs at level $1 in pressure.log (rows that start with a repeat number)
level_median() {
  awk -v n="$1" -v k="$2" '$1 ~ /^[0-9]+$/ && $2 == n { print $k }' "$OUT/pressure.log" | sort -g |
    awk '{ v[++m] = $1 } END { if (m) printf "%.3f", m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }'
}

ranks=$(seq -s, 0 $((NP - 1)))
printf '%-5s %-6s %-15s %12s %8s %14s\n' rep level collective "C @1K (us)" "tpsh/C" "tpsh/(C+ev)" | tee "$OUT/pressure.log"
for rep in $(seq "$REPS"); do
  for n in $LEVELS; do
    start_streamers "$n"
    csv=$OUT/pressure_${n}_$rep.csv
    taskset -c "$ranks" mpiexec -n "$NP" "$BUILD/tpsh" --backend cuda scripts/bench/bench_collectives.lua \
      --ops all_gather,all_reduce,reduce_scatter --min 1K --max 4K --rounds "$ROUNDS" \
      --ref "$BUILD/libtpsh_nccl_ref.so" --ref-event --csv "$csv" > "$OUT/pressure_${n}_$rep.log" 2>&1
    rc=$?
    stop_streamers
    [ $rc -eq 0 ] || die "the bench failed at level $n (log: $OUT/pressure_${n}_$rep.log)"
    awk -F, -f scripts/bench/paired_medians.awk "$csv" | while read -r op ratio ratio_ev c_us; do
      printf '%-5s %-6s %-15s %12s %8s %14s\n' "$rep" "$n" "$op" "$c_us" "$ratio" "$ratio_ev"
    done | tee -a "$OUT/pressure.log"
  done
done
echo
echo "per level, the median of the runs above (every collective, every repeat):"
for n in $LEVELS; do
  printf 'pressure %2d streamers: C loop %s us a call at 1 KiB, tpsh / C %s, tpsh / (C + end event) %s\n' "$n" \
    "$(level_median "$n" 4)" "$(level_median "$n" 5)" "$(level_median "$n" 6)"
done | tee -a "$OUT/pressure.log"

#!/usr/bin/env bash
# syscalls_collective.sh: what a small collective asks of the kernel, per call, in each mode of
# scripts/diag/profile_loop.lua (the C loop, the C loop with an end event, NCCL through the FFI, the public
# call). A sampling profile (profile_collective.sh) put half of rank 0's main thread in the kernel
# during a loop of plain ncclReduceScatter calls; this counts what it does there.
# Rank 0 runs each mode twice, with 0 and with N timed calls (after the same warm-up), so that the
# difference is the loop's alone: system calls per call and thread (strace -f -ff), page faults and
# context switches per call (perf stat, all threads), printed as one table per mode.
#   OUT=... [N=20000] [MODES="cloop cloop_ev raw public"] scripts/diag/syscalls_collective.sh
# strace and perf are not on the GPU machine: scripts/gpu/gpu_prepare.sh packs the build machine's
# (scripts/diag/rank0_tool.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/diag/rank0_tool.sh
OUT=${OUT:-/tmp/syscalls}; N=${N:-20000}
mkdir -p "$OUT"
need_tool strace

# Per thread (the main thread first, named by the process's pid) and system call: the count in dir.
count() {
  local dir=$1 main
  main=$(ls "$dir" | sed 's/.*\.//' | sort -n | head -1)
  for f in "$dir"/st.*; do
    local tid=${f##*.} who=other
    [ "$tid" = "$main" ] && who=main
    grep -v -e '^+++' -e '^---' -e 'resumed>' "$f" | sed -E 's/^([a-z_0-9]+)\(.*/\1/' | grep -E '^[a-z_0-9]+$' |
      sort | uniq -c | awk -v who=$who '{print who, $2, $1}'
  done | awk '{c[$1" "$2] += $3} END {for (k in c) print k, c[k]}' | sort
}

for m in ${MODES:-cloop cloop_ev raw public}; do
  for n in 0 "$N"; do
    rm -rf "$OUT/st_${m}_$n" && mkdir -p "$OUT/st_${m}_$n"
    rank0 "$m" "$n" /tmp/perfpack/strace -f -ff -o "$OUT/st_${m}_$n/st" > /dev/null 2>&1 || echo "$m: strace run failed"
    count "$OUT/st_${m}_$n" > "$OUT/count_${m}_$n.txt"
    rank0 "$m" "$((n * 5))" /tmp/perfpack/perf stat -x, -o "$OUT/stat_${m}_$n.txt" \
      -e page-faults,context-switches,cpu-migrations > "$OUT/time_${m}_$n.txt" 2>&1 || echo "$m: perf stat run failed"
    tar czf "$OUT/st_${m}_$n.tgz" -C "$OUT" "st_${m}_$n" && rm -rf "$OUT/st_${m}_$n"
  done
  echo "== $m: $(grep -h 'a call' "$OUT/time_${m}_$N.txt")"
  echo "   per call (N=$N under strace, $((N * 5)) under perf stat); thread, system call:"
  join -a2 -e 0 -o 0,1.2,2.2 <(awk '{print $1"/"$2, $3}' "$OUT/count_${m}_0.txt" | sort) \
    <(awk '{print $1"/"$2, $3}' "$OUT/count_${m}_$N.txt" | sort) |
    awk -v n="$N" '{d = ($3 - $2) / n; if (d >= 0.01 || d <= -0.01) printf "     %-32s %8.3f\n", $1, d}'
  for ev in page-faults context-switches cpu-migrations; do
    a=$(awk -F, -v e=$ev '$3 == e {print $1}' "$OUT/stat_${m}_0.txt"); b=$(awk -F, -v e=$ev '$3 == e {print $1}' "$OUT/stat_${m}_$N.txt")
    awk -v a="${a:-0}" -v b="${b:-0}" -v n="$((N * 5))" -v e=$ev 'BEGIN {printf "     %-32s %8.3f\n", e, (b - a) / n}'
  done
done

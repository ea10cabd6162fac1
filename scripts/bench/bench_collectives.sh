#!/bin/sh
# bench_collectives.sh: tpsh's collectives against C code calling MPI directly, in the same run.
#
#   scripts/bench/bench_collectives.sh [-n "2 4 8"] [-r REPEATS] [-b BUILD_DIR] [-V "REF OPTIONS"]... [-P ROUNDS]
#                                [--min 1K --max 64M --iters N ...]
#
# For each rank count of -n (default 2): runs build/bench_collectives_ref (C, blocking MPI calls from
# main) and scripts/bench/bench_collectives.lua (tpsh, the current stream) alternately REPEATS times with the
# same arguments, keeps the best busbw of each per (collective, size) (a shared machine is noisy; the
# best run is the least disturbed), and prints both with the ratio tpsh / C, then one line per
# collective, size and rank count for docs/perf.md:
#   ratio <collective> <ranks> ranks <bytes> B: tpsh / C <x> (C <GB/s>, tpsh <GB/s> busbw)
# and per collective the lowest ratio at >= 1 MiB (target >= 0.97) and at 4-64 KiB (target >= 0.95).
# Each -V adds a variant of the C reference run in turn with the others (bench_collectives_ref.c's
# --thread-multiple, --worker, --tpsh-buffers: tpsh's conditions, one at a time), with lines
#   ratio <collective> <ranks> ranks <bytes> B: C[<options>] / C <x>
# so that a gap between tpsh and C splits into what each condition costs.
# -P ROUNDS instead compares inside one process (bench_collectives.lua --ref BUILD/libtpsh_mpi_ref.so): the
# C loop and tpsh's calls alternate on the same buffers and communicator, ROUNDS rounds a size, so that what
# makes one process faster than the next (up to 2x at a size on the GPU machine's 16 CPUs) cancels; lines
#   ratio in-process <collective> <ranks> ranks <bytes> B: tpsh / C <x> (median of the rounds' C time / tpsh time)
# and per collective the lowest at >= 1 MiB and at 4-64 KiB. With --ref-thread after the options (a third
# side: the C loop's calls handed to a thread of their own, as tpsh's to a stream's worker) the line adds
#   tpsh / C on a thread <x>, C on a thread / C <x>
# and the lowest of tpsh / C on a thread per collective: what tpsh costs beyond the threads-as-streams model.
set -eu
NPS=2 REPEATS=3 BUILD=build VARIANTS="" PAIRED=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) NPS=$2; shift 2 ;;
    -r) REPEATS=$2; shift 2 ;;
    -b) BUILD=$2; shift 2 ;;
    -V) VARIANTS="$VARIANTS${VARIANTS:+|}$2"; shift 2 ;;
    -P) PAIRED=$2; shift 2 ;;
    *) break ;;
  esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ -n "$PAIRED" ]; then
  for NP in $NPS; do
    mpiexec -n "$NP" "$BUILD/tpsh" --backend cpu scripts/bench/bench_collectives.lua --ref "$BUILD/libtpsh_mpi_ref.so" \
      --rounds "$PAIRED" "$@" --csv "$TMP/paired$NP.csv" >/dev/null
    echo "# $NP ranks, in one process: C loop and tpsh alternately, $PAIRED rounds a size"
    # CSV: collective,bytes,count,iters,time_us,algbw,busbw,enqueue_us,ref_time_us,ref_enqueue_us,paired_ratio,...
    awk -F, -v np="$NP" 'FNR == 1 { next }
      { r = $11 > 0 ? 1 / $11 : 0; c = $1; thr = NF >= 15 && $14 > 0
        extra = thr ? sprintf("; tpsh / C on a thread %.3f, C on a thread / C %.3f (%.2f us)", 1 / $14, $9 / $13, $13) : ""
        printf "ratio in-process %-15s %d ranks %9d B: tpsh / C %.3f (C %.2f us, tpsh %.2f us, best rounds)%s\n", c, np, $2, r, $9, $5, extra
        big = $2 >= 1048576 - 4 * np; small = $2 >= 4096 - 4 * np && $2 <= 65536
        for (k = 0; k <= thr; k++) { x = k ? 1 / $14 : r; w = k ? "thread" : "C"
          if (big && (!((c, "big", w) in lo) || x < lo[c, "big", w])) lo[c, "big", w] = x
          if (small && (!((c, "small", w) in lo) || x < lo[c, "small", w])) lo[c, "small", w] = x }
        if (!(c in listed)) { listed[c] = 1; ops[++m] = c } }
      END { for (j = 1; j <= m; j++) { c = ops[j]
          if ((c, "big", "C") in lo) printf "%-15s %d ranks: in-process lowest ratio at >= 1 MiB: %.3f (target >= 0.97)\n", c, np, lo[c, "big", "C"]
          if ((c, "small", "C") in lo) printf "%-15s %d ranks: in-process lowest ratio at 4-64 KiB: %.3f (target >= 0.95)\n", c, np, lo[c, "small", "C"]
          if ((c, "big", "thread") in lo) printf "%-15s %d ranks: in-process lowest tpsh / C on a thread at >= 1 MiB: %.3f\n", c, np, lo[c, "big", "thread"]
          if ((c, "small", "thread") in lo) printf "%-15s %d ranks: in-process lowest tpsh / C on a thread at 4-64 KiB: %.3f\n", c, np, lo[c, "small", "thread"] } }' \
      "$TMP/paired$NP.csv"
    echo
  done
  exit 0
fi
for NP in $NPS; do
  mkdir -p "$TMP/$NP"
  i=1
  while [ "$i" -le "$REPEATS" ]; do
    mpiexec -n "$NP" "$BUILD/bench_collectives_ref" "$@" --csv "$TMP/$NP/ref$i.csv" >/dev/null
    mpiexec -n "$NP" "$BUILD/tpsh" --backend cpu scripts/bench/bench_collectives.lua "$@" --csv "$TMP/$NP/tp$i.csv" >/dev/null
    if [ -n "$VARIANTS" ]; then
      v=1
      # shellcheck disable=SC2086  # a variant is a list of options
      echo "$VARIANTS" | tr '|' '\n' | while read -r opts; do
        echo "$opts" > "$TMP/$NP/variant$v.name"
        mpiexec -n "$NP" "$BUILD/bench_collectives_ref" $opts "$@" --csv "$TMP/$NP/var${v}_$i.csv" >/dev/null </dev/null
        v=$((v + 1))
      done
    fi
    i=$((i + 1))
  done
  echo "# $NP ranks, best of $REPEATS runs each; busbw in GB/s (nccl-tests factors), time of the best run in us"
  # names of the variants, in -V order, for the ratio lines
  names=$(for f in "$TMP/$NP"/variant*.name; do [ -f "$f" ] && printf '%s|' "$(cat "$f")"; done; true)
  awk -F, -v np="$NP" -v names="$names" '
    FNR == 1 {
      f = FILENAME; sub(/.*\//, "", f)
      kind = f ~ /^ref/ ? "c" : f ~ /^tp/ ? "t" : "v" substr(f, 4, index(f, "_") - 4)
      if (kind ~ /^v/) nv = substr(kind, 2) + 0 > nv ? substr(kind, 2) + 0 : nv
      next
    }
    {
      k = $1 SUBSEP $2
      if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      if ($7 + 0 > best[kind, k] + 0) { best[kind, k] = $7; time[kind, k] = $5 }
    }
    END {
      split(names, vname, "|")
      printf "%-15s %12s %12s %10s %12s %10s %7s\n", "collective", "size (B)", "C time", "C busbw", "tpsh time", "tpsh busbw", "ratio"
      for (i = 1; i <= n; i++) {
        k = order[i]; split(k, p, SUBSEP)
        r[k] = best["c", k] > 0 ? best["t", k] / best["c", k] : 0
        printf "%-15s %12d %12.1f %10.3f %12.1f %10.3f %7.3f\n", p[1], p[2], time["c", k], best["c", k], time["t", k], best["t", k], r[k]
      }
      print ""
      for (i = 1; i <= n; i++) {
        k = order[i]; split(k, p, SUBSEP)
        printf "ratio %-15s %d ranks %9d B: tpsh / C %.3f (C %.3f, tpsh %.3f GB/s busbw)\n", p[1], np, p[2], r[k], best["c", k], best["t", k]
        for (v = 1; v <= nv; v++)
          if (best["c", k] > 0)
            printf "ratio %-15s %d ranks %9d B: C[%s] / C %.3f\n", p[1], np, p[2], vname[v], best["v" v, k] / best["c", k]
        # sizes are rounded down to a multiple of the ranks (3 ranks: 1048572 B stands for 1 MiB)
        big = p[2] >= 1048576 - 4 * np; small = p[2] >= 4096 - 4 * np && p[2] <= 65536
        if (big && (!((p[1], "big") in lo) || r[k] < lo[p[1], "big"])) lo[p[1], "big"] = r[k]
        if (small && (!((p[1], "small") in lo) || r[k] < lo[p[1], "small"])) lo[p[1], "small"] = r[k]
        if (!(p[1] in listed)) { listed[p[1]] = 1; ops[++m] = p[1] }
      }
      for (j = 1; j <= m; j++) {
        c = ops[j]
        if ((c, "big") in lo) printf "%-15s %d ranks: lowest ratio at >= 1 MiB: %.3f (target >= 0.97)\n", c, np, lo[c, "big"]
        if ((c, "small") in lo) printf "%-15s %d ranks: lowest ratio at 4-64 KiB: %.3f (target >= 0.95)\n", c, np, lo[c, "small"]
      }
    }' "$TMP/$NP"/ref*.csv "$TMP/$NP"/tp*.csv $(ls "$TMP/$NP"/var*.csv 2>/dev/null || true)
  echo
done

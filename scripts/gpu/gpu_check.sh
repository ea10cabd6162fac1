#!/usr/bin/env bash
# The GPU proof of the CUDA backend, in one call on the GPU machine (it builds nothing there):
#
#   tar xJf .gpu/runtime.tar.xz -C /tmp && source /tmp/tpsh-rt/env.sh && scripts/gpu/gpu_check.sh
#
# (prepared on the build machine by scripts/gpu/gpu_prepare.sh; carry [".gpu"]). Steps, each logged to
# $OUT/<step>.log: versions and GPUs; every op on every dtype on cuda diffed against the CPU backend
# (scripts/gpu/gpu_smoke.lua); the spec suite with --backend cuda on 1 rank and, with two GPUs, on 2 ranks
# (tests/gpu/*_spec.lua included: pool reuse across streams, 2 GiB tensors, bf16 8192^3 matmul
# against f64, out of memory); the collectives against NCCL called from C (scripts/bench/nccl_ref.c), in
# another process and in tpsh's own (bench_collectives.lua --ref, step "paired"); host
# cost per op against plain CUDA (scripts/bench/overhead_ref.cu) and PyTorch, fresh outputs against preallocated
# ones beside PyTorch (scripts/bench/bench_alloc.lua, torch_alloc.py), element-wise ops on 64 MiB in GB/s beside
# PyTorch (scripts/bench/bench_pointwise.lua, torch_pointwise.py; step "pointwise"), softmax, norms, reductions,
# addmm and bmm beside PyTorch (scripts/bench/bench_reduce.lua, torch_reduce.py), tp.graph's specs and replays
# beside PyTorch's CUDA graphs (scripts/bench/bench_graph.lua, torch_graph.py, step "graph"), and a small collective's host
# cost split into its parts (scripts/diag/diag_host_cost.lua), PyTorch's small collectives against the same C
# loop in PyTorch's process (scripts/bench/torch_collectives.py); the overlap example and the lab (traced
# examples). The last lines are a table of the steps. Env: OUT (default /tmp/gpu_check), BUILD (default
# .gpu/build if it exists, else build), NP (ranks of the multi-rank steps, default: the visible GPUs),
# COLL_REPEATS (default 5), SMALL_REPEATS (default 10), PAIRED_RUNS (default 3), PAIRED_ROUNDS
# (default 9), STEPS (default "version smoke specs check ending ranges chaos repl alloc pointwise reduce graph collectives paired diag torch overhead overlap lab";
# also "pipeline1" (examples/pipeline.lua on one GPU, traced), "cpu_collectives", "cpu_paired" and "cpu_collectives_split", the CPU backend's collectives against MPI from C;
# also "slow", the machine's two speeds: scripts/diag/diag_slow_state.lua, and "pressure", the slow state
# reproduced by memory traffic on other CPUs: scripts/diag/diag_memory_pressure.sh): a
# device call is limited to 10 minutes, so the checks and
# the benchmarks may go in two calls).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_check}
BUILD=${BUILD:-$( [ -x .gpu/build/tpsh ] && echo .gpu/build || echo build )}
TP=$BUILD/tpsh
mkdir -p "$OUT"
export OUT BUILD TP
export NCCL_NVLS_ENABLE=0 TPSH_TIMEOUT=${TPSH_TIMEOUT:-120}
# The binaries carry no RPATH for the CUDA libraries (CMake treats the toolkit's directory as implicit):
# where the loader's configuration does not list it, the toolkit's lib directory must be on the path.
# Only then: a directory added here is searched before the system's (where NCCL lives there).
if ldd "$TP" | grep -q 'not found'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
  done
  export LD_LIBRARY_PATH
fi
ldd "$TP" | grep -E 'cuda|cublas|nccl|not found' > "$OUT/libs.log"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# Ranks of the multi-rank steps: one per GPU (NCCL needs a GPU per rank); NP=2 on a larger machine
# reproduces the 2-GPU figures.
NP=${NP:-$NGPU}
export NP                        # the step functions run in child shells
STEPS=${STEPS:-version smoke specs check ending ranges chaos repl alloc pointwise reduce graph collectives paired diag torch overhead overlap lab}
declare -a SUMMARY=()
want() { [[ " $STEPS " == *" $1 "* ]]; }

# dump_stacks NAME: all threads' backtraces of every running tpsh into $OUT/NAME.stacks
dump_stacks() {
  local p
  for p in $(pgrep -x tpsh); do
    echo "==== pid $p ($(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-120))"
    timeout 40 cuda-gdb -q -batch -p "$p" -ex 'thread apply all bt 25' 2>&1 | grep -E '^(#|Thread)' | cut -c1-200
  done > "$OUT/$1.stacks" 2>&1
  echo "step $1 still running near its limit: stacks in $OUT/$1.stacks" >> "$OUT/all.log"
}

# step NAME TIMEOUT CMD...: runs CMD with its output in $OUT/NAME.log; records status, time, last line
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$OUT/all.log"
  # through bash -c so that the exported shell functions below can be steps too
  timeout "$limit" bash -c '"$@"' "$name" "$@" > "$OUT/$name.log" 2>&1 &
  local pid=$!
  # A step still running 30 s before its limit is probably hung: take every tpsh's stacks first (the
  # machine has cuda-gdb but no gdb), so that the log says where it waits.
  # Its output goes nowhere and its sleep is killed with it: a sleep left holding this script's stdout
  # kept a caller's `| tail` waiting for minutes after the steps had ended.
  ( sleep $((limit > 60 ? limit - 30 : limit / 2)); kill -0 $pid 2>/dev/null && dump_stacks "$name" ) \
    > /dev/null 2>&1 &
  local watcher=$!
  wait $pid
  local rc=$?
  pkill -P $watcher 2>/dev/null; kill $watcher 2>/dev/null; wait $watcher 2>/dev/null
  tail -n 40 "$OUT/$name.log" >> "$OUT/all.log"
  local last
  last=$(grep -E 'passed|failed$|failure|ratio|diff|TFLOP|efficiency|torch / C|median over|streamers:|^ending:' "$OUT/$name.log" | tail -n 1 | cut -c1-70)
  # MPICH/UCX's shut-down race, cut short by src/host/finalize.c: worth seeing, not a failure
  grep -q 'MPI_Finalize has not returned' "$OUT/$name.log" && last="$last (finalize guard fired)"
  SUMMARY+=("$(printf '%-22s %-6s %5ss  %s' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL:$rc)" $((SECONDS - t0)) "$last")")
  return $rc
}

want version && step version 60 bash -c "$TP -v; uname -r; nproc; nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv"

# ---- every op on every dtype: cuda against the CPU backend ------------------------------------------
smoke() {
  "$TP" --backend cpu scripts/gpu/gpu_smoke.lua > "$OUT/smoke_cpu.txt" 2>&1
  "$TP" --backend cuda scripts/gpu/gpu_smoke.lua > "$OUT/smoke_cuda.txt" 2>&1
  local rc=$?
  grep -E '^FAIL|smoke:' "$OUT/smoke_cuda.txt"
  # every line but the last, which names the backend
  if diff <(grep -v '^smoke:' "$OUT/smoke_cpu.txt") <(grep -v '^smoke:' "$OUT/smoke_cuda.txt") > "$OUT/smoke.diff"; then
    echo "diff: cuda matches the CPU backend on every line"
  else
    echo "diff: $(grep -c '^<' "$OUT/smoke.diff") lines differ (first ones below; all in smoke.diff)"
    head -n 20 "$OUT/smoke.diff" | cut -c1-300
    rc=1
  fi
  return $rc
}
export -f smoke
want smoke && step smoke 180 smoke

# ---- the spec suite (tests/gpu included) -------------------------------------------------------------
if want specs; then
  # the child jobs of tests/*_spec.lua run the CPU backend (CI runs them); tests/gpu's run CUDA
  step specs_np1 300 env TPSH_SPEC_CHILD_JOBS=0 mpiexec -n 1 "$TP" --backend cuda test -o plain tests/*_spec.lua
  step specs_gpu_np1 120 mpiexec -n 1 "$TP" --backend cuda test -o plain tests/gpu/
  if [ "$NP" -ge 2 ]; then
    step specs_np$NP 300 mpiexec -n "$NP" "$TP" --backend cuda test -o plain tests/
  else
    SUMMARY+=("$(printf '%-22s %-6s' specs_np2 "skip (one GPU: NCCL needs a GPU per rank)")")
  fi
fi

# ---- the spec suite in check mode, as CI's specs_check_np3: a test that leaves a sanitizer report fails --
want check && step specs_check_np$NP 300 env TPSH_SPEC_CHILD_JOBS=0 mpiexec -n "$NP" "$TP" --backend cuda --check test -o plain tests/

# ---- a run that the watchdog or a signal ends, with --trace: the host writes its own records first -----
# (src/core/host_ending.c) while it waits for a CUDA stream: a spin past --timeout 2 (status 124), and a
# SIGTERM through mpiexec during a spin (status 143); each file must hold "spin (not finished)".
ending() {
  local rc=0 f
  rm -f "$OUT"/ending_*.json
  "$TP" --backend cuda --timeout 2 --trace "$OUT/ending_wd.json" -e 'local x = tp.ones{4}; tp.spin(60000); print(x:sum():item())'
  echo "watchdog end: status $?"
  mpiexec -n 1 "$TP" --backend cuda --trace "$OUT/ending_sig.json" -e 'local x = tp.ones{4}; tp.spin(60000); print(x:sum():item())' &
  local p=$!
  sleep 4; kill -TERM $p; wait $p
  echo "SIGTERM end: status $?"
  for f in ending_wd ending_sig; do
    if grep -q '"name":"spin (not finished)"' "$OUT/$f.json" 2>/dev/null; then
      echo "$f.json: $(grep -o '"run_ended_by_failure":{"0":{"status":[0-9]*,"ops_not_finished":[0-9]*,"ops_not_started":[0-9]*' "$OUT/$f.json")"
    else echo "$f.json: no unfinished spin in it"; rc=1; fi
  done
  [ $rc = 0 ] && echo "ending: both files hold the unfinished spin" || echo "ending: not as expected"
  return $rc
}
export -f ending
want ending && step ending 60 ending

# ---- named ranges as NVTX ranges (src/core/range.c): three steps of forward and backward matmuls, each a
# tp.range with nested ones, under Nsight Systems where nsys is there (its nvtx_sum report must list
# "step 1".."step 3" once each and forward and backward three times each), else in the --trace JSON's
# "ranges" track (9 range records) ------------------------------------------------------------------------
ranges() {
  local script="$OUT/ranges.lua" n
  cat > "$script" <<'LUA'
local x = tp.ones { 1024, 1024 }
for i = 1, 3 do
  tp.range("step " .. i, function()
    tp.range_push("forward")
    local y = tp.matmul(x, x)
    tp.range_pop("forward")
    tp.range("backward", function() local z = tp.matmul(x, x) end)
  end)
end
tp.synchronize()
LUA
  if command -v nsys > /dev/null; then
    rm -f "$OUT"/ranges.nsys-rep "$OUT"/ranges.sqlite
    nsys profile -t nvtx,cuda -o "$OUT/ranges" "$TP" --backend cuda "$script" > "$OUT/ranges_profile.txt" 2>&1 || {
      tail -n 20 "$OUT/ranges_profile.txt"; return 1; }
    nsys stats --report nvtx_sum "$OUT/ranges.nsys-rep" > "$OUT/ranges_nvtx.txt" 2>&1
    grep -E 'step [123]|forward|backward|Range' "$OUT/ranges_nvtx.txt"
    for n in "step 1" "step 2" "step 3" forward backward; do
      grep -q "$n" "$OUT/ranges_nvtx.txt" || { echo "ranges: nvtx_sum lacks '$n'"; return 1; }
    done
    echo "ranges: passed (nsys nvtx_sum lists step 1-3, forward and backward)"
  else
    "$TP" --backend cuda --trace "$OUT/ranges.json" "$script" || return 1
    grep -o '"name":"[^"]*","cat":"range"[^}]*"depth":[0-9]' "$OUT/ranges.json"
    n=$(grep -c '"cat":"range"' "$OUT/ranges.json")
    grep -q '"args":{"name":"ranges"}' "$OUT/ranges.json" || { echo "ranges: no ranges track"; return 1; }
    [ "$n" = 9 ] || { echo "ranges: $n range records, not 9"; return 1; }
    echo "ranges: passed (no nsys here; the trace JSON's ranges track holds the 9 ranges)"
  fi
}
export -f ranges
want ranges && step ranges 120 ranges

# ---- chaos mode on the GPU (src/core/chaos.c): an async all_gather's output read before w:wait() under
# --chaos=SEED for the seeds 1-8 until one fails (it must say "chaos seed N"), then that seed again (it
# must fail again); and the same schedule with w:wait() before the read passes under all 8 ------------------
chaos() {
  # (the race is the script's second all_gather, past NCCL's set-up for the kind; on the H100 it read
  # right under seeds 1-8 as the first and as the second: docs/api.md, "Chaos mode")
  local race='local x, out = tp.ones{65536}, tp.full({65536}, -1)
tp.world:all_gather(out, x)
out:fill_(-1)
local w = tp.world:all_gather(out, x, {async = true})
local s = out:sum():item()
w:wait()
print("chaos: seed, delays, ms", tp.chaos())
assert(s == 65536, "read " .. s .. " before the all_gather wrote")'
  local fine=${race/local s = out:sum():item()
w:wait()/w:wait()
local s = out:sum():item()}
  local seed found=
  for seed in 1 2 3 4 5 6 7 8; do
    "$TP" --backend cuda --chaos=$seed -e "$race" > "$OUT/chaos_$seed.txt" 2>&1
    grep -q "before the all_gather wrote" "$OUT/chaos_$seed.txt" && { found=$seed; break; }
  done
  if [ -z "$found" ]; then
    echo "chaos: no seed of 1-8 exposed the race"; cat "$OUT/chaos_1.txt"
    # where the delays went and when each stream ran, at this size and at the 8 elements of chaos_spec's race
    for n in 65536 8; do "$TP" --backend cuda --chaos=2 scripts/diag/diag_chaos_race.lua $n 2>&1 | tail -14; done
    return 1
  fi
  grep -E 'before the all_gather wrote|chaos seed' "$OUT/chaos_$found.txt"
  "$TP" --backend cuda --chaos=$found -e "$race" > "$OUT/chaos_again.txt" 2>&1
  grep -q "before the all_gather wrote" "$OUT/chaos_again.txt" || { echo "chaos: seed $found passed the second time"; return 1; }
  for seed in 1 2 3 4 5 6 7 8; do
    "$TP" --backend cuda --chaos=$seed -e "$fine" > "$OUT/chaos_fine.txt" 2>&1 || {
      echo "chaos: the correct schedule failed with seed $seed"; cat "$OUT/chaos_fine.txt"; return 1; }
  done
  echo "chaos: passed (seed $found exposed the race twice; the waited schedule was right under seeds 1-8)"
}
export -f chaos
want chaos && step chaos 120 chaos

# ---- the interactive REPL on a pty, every case of CI's tests/repl_test.py with --backend cuda on 2 ranks --
# (ranks waiting in NCCL when Ctrl-C comes, cuda's start-up inside the session's deadlines)
if want repl; then
  if [ "$NP" -ge 2 ]; then step repl 240 env REPL_TEST_BACKEND=cuda python3 tests/repl_test.py "$TP" mpiexec
  else SUMMARY+=("$(printf '%-22s %-6s' repl "skip (one GPU: the REPL's tests run 2 ranks, NCCL a GPU per rank)")"); fi
fi

# ---- `tpsh test` when a test fails on one rank, on NCCL: the run must end within seconds ----------------
# tests/runner/peer_fixture.lua: rank 1 fails before an all_reduce that rank 0 then waits in (ended by
# the watchdog's question 5 s in, status 1); dangle_fixture.lua: rank 0 raises after an all_reduce that
# rank 1 never calls (on NCCL rank 0 blocks inside the call: its watchdog asks after 1 s; status 1).
# Both with a 100 s timeout. Then plain scripts: one with the watchdog's timeout, one that a rank
# finishes without the collective the other waits in (below).
if want specs && [ "$NP" -ge 2 ]; then
  peer() {
    local f t0 rc ok=0
    for f in peer dangle; do
      t0=$SECONDS
      mpiexec -n "$NP" "$TP" --backend cuda --timeout 100 test -o plain "tests/runner/${f}_fixture.lua" \
        > "$OUT/peer_$f.txt" 2>&1
      rc=$?
      grep -E "failed this test|left waiting|different numbers|tpsh watchdog" "$OUT/peer_$f.txt" | cut -c1-200
      echo "$f fixture: status $rc after $((SECONDS - t0)) s"
      [ $rc = 1 ] && [ $((SECONDS - t0)) -lt 60 ] || ok=1
    done
    # and a plain script whose rank 1 skips the world's first collective: rank 0 blocks inside NCCL's
    # call (it connects to the peers there), which the watchdog (--timeout 5) must end, abort hook and all
    t0=$SECONDS
    mpiexec -n "$NP" "$TP" --backend cuda --timeout 5 \
      -e 'local x = tp.ones{4}; if tp.rank == 0 then tp.world:all_reduce(x) end; x:sum():item(); tp.barrier()' \
      > "$OUT/peer_skip.txt" 2>&1
    rc=$?
    grep -E "tpsh watchdog|abort" "$OUT/peer_skip.txt" | cut -c1-200
    echo "skipped collective: status $rc after $((SECONDS - t0)) s"
    [ $rc != 0 ] && [ $((SECONDS - t0)) -lt 40 ] || ok=1
    # a plain script that rank 1 finishes without the collective rank 0 waits in (inside NCCL's call):
    # rank 1 waits at the script's end, where rank 0's watchdog asks it 1 s in (--timeout 100)
    t0=$SECONDS
    mpiexec -n "$NP" "$TP" --backend cuda --timeout 100 \
      -e 'if tp.rank == 0 then tp.world:all_reduce(tp.ones{4}); tp.synchronize() end' > "$OUT/peer_end.txt" 2>&1
    rc=$?
    grep -E "finished the script|will not join|tpsh watchdog" "$OUT/peer_end.txt" | cut -c1-200
    echo "finished rank: status $rc after $((SECONDS - t0)) s"
    [ $rc = 1 ] && [ $((SECONDS - t0)) -lt 40 ] || ok=1
    [ $ok = 0 ] && echo "peer failures: the four runs ended non-zero within 60 s" || echo "peer failures: not as expected"
    return $ok
  }
  export -f peer
  step peer 200 peer
fi

# ---- collectives: tpsh against NCCL from C, same sizes and iteration counts, alternately -----------
# COLL_REPEATS runs of each (default 5), then SMALL_REPEATS (default 10) more of sizes up to 64 KiB;
# each side keeps its best run per (collective, size). A third run, NCCL from C on pool memory and a
# middle-priority stream as tpsh allocates them, up to 64 KiB, tells what NCCL costs on those from
# what tpsh adds ("C pool" columns), and one with an untimed event recorded after every call (as a
# Work's end event is) what the Work contract costs ("C+event").
if want collectives && [ "$NP" -ge 2 ]; then
  coll() {
    local i ops=all_gather,all_reduce,reduce_scatter small="--min 1K --max 64K"
    # the C reference and tpsh's benchmark on the same collectives; more arguments follow
    c_ref() { mpiexec -n "$NP" "$BUILD/nccl_ref" --ops "$ops" "$@"; }
    tpsh_bench() { mpiexec -n "$NP" "$TP" --backend cuda scripts/bench/bench_collectives.lua --ops "$ops" "$@"; }
    for i in $(seq "${COLL_REPEATS:-5}"); do
      c_ref --min 1K --max 1G --csv "$OUT/nccl_ref$i.csv" || return 1
      tpsh_bench --min 1K --max 1G --csv "$OUT/tpsh_coll$i.csv" || return 1
      # NCCL on memory and a stream like tpsh's (pool, middle priority), small sizes: what NCCL costs there
      c_ref $small --pool --mid-priority --csv "$OUT/pool_ref$i.csv" > /dev/null || return 1
    done
    # Small sizes only, SMALL_REPEATS more times each, alternately: up to 1 MiB both sides are limited by
    # the host, and one process's host speed differs from the next one's by up to 2x on this machine
    # (a C run gave 6 us per call, the next 12 us, each steady within itself), so the best of five runs
    # a side can still compare a fast run with a slow one. The best of fifteen rarely does.
    for i in $(seq "${SMALL_REPEATS:-10}"); do
      c_ref $small --csv "$OUT/nccl_ref_small$i.csv" > /dev/null || return 1
      # and with an untimed event recorded after every call: NCCL plus what the Work contract costs
      c_ref $small --end-event --csv "$OUT/event_ref$i.csv" > /dev/null || return 1
      tpsh_bench $small --csv "$OUT/tpsh_coll_small$i.csv" > /dev/null || return 1
    done
    # best busbw of each side per (collective, size); small sizes compare time, large ones busbw
    awk -F, 'FNR == 1 { kind = FILENAME ~ /nccl_ref/ ? "c" : FILENAME ~ /pool_ref/ ? "p" : FILENAME ~ /event_ref/ ? "e" : "t"; next }
      { k = $1 " " $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
        if ($7 + 0 > bw[kind, k] + 0) { bw[kind, k] = $7; us[kind, k] = $5; enq[kind, k] = kind == "t" ? $8 : $9 } }
      END { printf "%-26s %10s %10s %10s %10s %7s %7s %8s %8s %10s %8s %10s %7s\n", "collective size", "C us", "tpsh us", "C busbw", "tpsh busbw", "bw x", "time x", "C enq", "tpsh enq", "C pool us", "pool enq", "C+event us", "x that"
        for (i = 1; i <= n; i++) { k = order[i]; split(k, p, " ")
          rb = bw["t", k] / bw["c", k]; rt = us["t", k] / us["c", k]; re = us["e", k] > 0 ? us["t", k] / us["e", k] : 0
          printf "%-26s %10.1f %10.1f %10.2f %10.2f %7.3f %7.3f %8.2f %8.2f %10.1f %8.2f %10.1f %7.3f\n", k, us["c", k], us["t", k], bw["c", k], bw["t", k], rb, rt, enq["c", k], enq["t", k], us["p", k], enq["p", k], us["e", k], re
          if (p[2] >= 67108864 && (!(p[1] in lo) || rb < lo[p[1]])) lo[p[1]] = rb
          if (p[2] <= 4096 && (!(p[1] in hi) || rt > hi[p[1]])) hi[p[1]] = rt
          if (p[2] <= 4096 && (!(p[1] in he) || re > he[p[1]])) he[p[1]] = re }
        for (c in lo) printf "ratio %-15s busbw >= 64 MiB: lowest %.3f (target >= 0.98); time <= 4 KiB: highest %.3f (target <= 1.1); against NCCL + an end event per call: %.3f\n", c, lo[c], hi[c], he[c] }' \
      "$OUT"/nccl_ref*.csv "$OUT"/tpsh_coll*.csv "$OUT"/pool_ref*.csv "$OUT"/event_ref*.csv
  }
  export -f coll
  step collectives 300 coll
fi

# ---- collectives: tpsh against the same C loop in its own process, round by round ------------------
# bench_collectives.lua --ref loads libtpsh_nccl_ref.so (scripts/bench/nccl_ref_loop.c, nccl_ref's loop) and
# times it on tpsh's communicator, stream and buffers alternately with tpsh's calls: what one process's
# host speed does to both sides cancels (the collectives step above compares two processes, whose
# small-message times differ by up to 2x for reasons of the machine's). PAIRED_RUNS processes (default
# 3), each with PAIRED_ROUNDS rounds a size (default 9); a round's ratio is tpsh's time over the C
# loop's in the same round. The summary's figure is the highest over the processes of the median
# ratio at 1-4 KiB. A third side, the C loop with an end event after every call (--ref-event), tells
# what tpsh costs beyond NCCL and the Work contract (a line under each collective's).
if want paired && [ "$NP" -ge 2 ]; then
  paired() {
    local i
    for i in $(seq "${PAIRED_RUNS:-3}"); do
      mpiexec -n "$NP" "$TP" --backend cuda scripts/bench/bench_collectives.lua --ops all_gather,all_reduce,reduce_scatter \
        --min 1K --max 1G --rounds "${PAIRED_ROUNDS:-9}" --ref "$BUILD/libtpsh_nccl_ref.so" --ref-event \
        --csv "$OUT/paired$i.csv" || return 1
    done
    # Per collective and process: at 1-4 KiB, the median of every round's ratio (3 sizes x the rounds:
    # the figure to judge by) and the highest per-size median (the least favourable size); at 64 MiB and
    # above, the lowest busbw ratio (C time / tpsh time, per-size medians).
    awk -F, 'function median(s,   a, m, i, j, t) { m = split(s, a, ";")
          for (i = 2; i <= m; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
          return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
      FNR == 1 { run++; next }
      { c = $1; if (!(c in seen)) { seen[c] = 1; order[++n] = c }
        if ($2 <= 4096) { pool[c, run] = pool[c, run] (pool[c, run] == "" ? "" : ";") $12; if ($11 > hi[c, run]) hi[c, run] = $11
          if (NF >= 15) pool_ev[c, run] = pool_ev[c, run] (pool_ev[c, run] == "" ? "" : ";") $15 }
        if ($2 >= 67108864 && (!((c, run) in lo) || 1 / $11 < lo[c, run])) lo[c, run] = 1 / $11 }
      END { for (i = 1; i <= n; i++) { c = order[i]; p = h = l = ""; worst = worst_size = 0; least = 9
          for (r = 1; r <= run; r++) { m = median(pool[c, r]); p = p sprintf(" %.3f", m); h = h sprintf(" %.3f", hi[c, r])
            l = l sprintf(" %.3f", lo[c, r]); if (m > worst) worst = m; if (hi[c, r] > worst_size) worst_size = hi[c, r]
            if (lo[c, r] < least) least = lo[c, r] }
          printf "ratio in-process %-15s time <= 4 KiB: %.3f (target <= 1.1; median of sizes x rounds, per process:%s; worst size per process:%s); busbw >= 64 MiB: lowest %.3f (per process:%s)\n", c, worst, p, h, least, l
          if ((c, 1) in pool_ev) { e = ""; for (r = 1; r <= run; r++) e = e sprintf(" %.3f", median(pool_ev[c, r]))
            printf "  %s against the C loop + an end event per call (what the Work contract costs), <= 4 KiB, per process:%s\n", c, e } } }' \
      "$OUT"/paired*.csv
  }
  export -f paired
  step paired 300 paired
fi

# ---- host cost per op: tpsh from Lua, the tpsh C API, plain CUDA, PyTorch ------------------------
overhead() {
  local iters=50000
  "$TP" --backend cuda scripts/bench/bench_overhead.lua $iters || return 1
  [ -x "$BUILD/bench_overhead_ref" ] && "$BUILD/bench_overhead_ref" $iters --backend cuda
  "$BUILD/overhead_ref" $iters || return 1
  # the same CUDA loops inside tpsh's process, alternately with the Lua loops: the ratios to judge by
  "$TP" --backend cuda scripts/bench/bench_overhead.lua $iters --ref "$BUILD/libtpsh_overhead_ref.so" | sed 's/^paired/ratio in-process/' || return 1
  env -u LD_LIBRARY_PATH python3 - $iters <<'PY' || echo "torch: not measured"
import sys, time, torch
n = int(sys.argv[1]); x = torch.ones(16, device="cuda"); y = torch.ones(16, device="cuda")
side = torch.cuda.Stream(); ev = torch.cuda.Event()
def run(fn):
  best = []
  for _ in range(6):
      torch.cuda.synchronize(); t0 = time.perf_counter()
      for _ in range(n): fn()
      best.append((time.perf_counter() - t0) * 1e6 / n); torch.cuda.synchronize()
  return sorted(best[1:])[2]
cases = [("add_ (in place)", lambda: x.add_(y)), ("a + b (allocates)", lambda: x + y),
       ("event record + stream wait", lambda: (ev.record(), side.wait_event(ev)))]
for name, fn in cases: print("torch %-28s %8.3f us/op" % (name, run(fn)))
PY
}
if want overhead; then
  export -f overhead
  step overhead 240 overhead
  awk '/us\/op/ { name = $0; sub(/^[a-z]+ +/, "", name); sub(/ +[0-9.]+ us\/op$/, "", name); v[$1, name] = $(NF-1); names[name] = 1 }
  END { for (nm in names) if (v["cuda", nm] > 0) printf "ratio lua/cuda %-28s %6.2fx (lua %s us, cuda %s us, torch %s us)\n", nm, v["lua", nm] / v["cuda", nm], v["lua", nm], v["cuda", nm], v["torch", nm] }' \
    "$OUT/overhead.log" | tee -a "$OUT/overhead.log"
fi

# ---- where a small collective's host time goes (NCCL + core, the Work's end event, Lua) -------------
if want diag && [ "$NP" -ge 2 ]; then
  step diag 120 mpiexec -n "$NP" "$TP" --backend cuda scripts/diag/diag_host_cost.lua
fi

# ---- the machine's slow state: chunks of the C loop and of tpsh, with the main thread's CPU, steal
# time and the other threads' CPU use per chunk; GPU clocks logged beside, and each CPU's interrupts
# over the step (scripts/diag/diag_slow_state.lua). SLOW_CPUS: placements to run, "none" (as mpiexec places
# the ranks), "core" (mpiexec -bind-to core), "fixed" (address space layout not randomised: setarch -R,
# so that every run lays out memory alike) or a CPU per rank, "16,17" (through taskset; default
# "none 0,1 16,17"); SLOW_CHUNKS: chunks a run (default 40).
slow_placed() {
  local diag=("$TP" --backend cuda scripts/diag/diag_slow_state.lua)
  case $1 in
    none) mpiexec -n "$NP" "${diag[@]}" ;;
    core) mpiexec -bind-to core -n "$NP" "${diag[@]}" ;;
    fixed) mpiexec -n "$NP" setarch "$(uname -m)" -R "${diag[@]}" ;;
    *) CPUS=$1 mpiexec -n "$NP" bash -c 'exec taskset -c "$(echo "$CPUS" | cut -d, -f$((PMI_RANK + 1)))" "$@"' \
         _ "${diag[@]}" ;;
  esac
}
export -f slow_placed
if want slow && [ "$NP" -ge 2 ]; then
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,utilization.gpu,pstate \
    --format=csv,noheader -lms 100 > "$OUT/slow_clocks.csv" 2>&1 &
  SMI=$!
  cp /proc/interrupts "$OUT/interrupts.before"
  k=0
  for placement in ${SLOW_CPUS:-none 0,1 16,17}; do
    k=$((k + 1))
    step "slow${k}_${placement/,/_}" 120 slow_placed "$placement"
  done
  cp /proc/interrupts "$OUT/interrupts.after"
  kill "$SMI" 2>/dev/null
fi

# ---- the slow state on demand: the paired comparison at 1-4 KiB while other CPUs stream through memory
# (scripts/diag/diag_memory_pressure.sh; PRESSURE_LEVELS: numbers of streamers, default "0 12 24";
# PRESSURE_REPS, default 3). Not in the default steps: it is a diagnostic, about 2 minutes.
if want pressure && [ "$NP" -ge 2 ]; then
  step pressure 400 env OUT="$OUT/pressure" LEVELS="${PRESSURE_LEVELS:-0 12 24}" REPS="${PRESSURE_REPS:-3}" \
    scripts/diag/diag_memory_pressure.sh
fi

# ---- PyTorch's small collectives against the same C loop, in PyTorch's process (context) -----------
# python3 with torch is on the GPU machine; tpsh's runtime path is dropped for it (PyTorch brings its
# own NCCL and CUDA libraries, which the C loop's library then uses too).
if want torch && [ "$NP" -ge 2 ]; then
  step torch 180 mpiexec -n "$NP" env -u LD_LIBRARY_PATH python3 scripts/bench/torch_collectives.py \
    --ref "$(realpath "$BUILD/libtpsh_nccl_ref.so")" --rounds 9
fi

# ---- allocation: fresh outputs against preallocated ones, tpsh (cache on, then off: the driver's pool
# alone) beside PyTorch's caching allocator on the same GPU, and the CPU backend on this machine's CPUs --
alloc() {
  "$TP" --backend cuda scripts/bench/bench_alloc.lua
  echo "-- cache off (TPSH_NO_MEMORY_CACHING=1: cudaMallocAsync from the device's pool each time)"
  TPSH_NO_MEMORY_CACHING=1 "$TP" --backend cuda scripts/bench/bench_alloc.lua | grep -E 'ratio|host'
  echo "-- x * x into preallocated outputs in turn (scripts/diag/diag_alloc_rotation.lua: the L2's share of fresh outputs)"
  "$TP" --backend cuda scripts/diag/diag_alloc_rotation.lua
  echo "-- PyTorch"
  env -u LD_LIBRARY_PATH python3 scripts/bench/torch_alloc.py
  echo "-- CPU backend"
  "$TP" --backend cpu scripts/bench/bench_alloc.lua | grep -vE '^(  |tpsh memory)'
  env -u LD_LIBRARY_PATH python3 scripts/bench/torch_alloc.py --device cpu
}
export -f alloc
want alloc && step alloc 300 alloc

# ---- element-wise ops on 64 MiB tensors: tpsh beside PyTorch on the same GPU, GB/s --------------------
# (scripts/bench/bench_pointwise.lua, torch_pointwise.py: the same cases, tensors counted alike); a ratio line
# per case and dtype, tpsh GB/s / PyTorch GB/s, and the lowest of them.
pointwise() {
  "$TP" --backend cuda scripts/bench/bench_pointwise.lua || return 1
  env -u LD_LIBRARY_PATH python3 scripts/bench/torch_pointwise.py || echo "torch: not measured"
}
export -f pointwise
if want pointwise; then
  step pointwise 240 pointwise
  awk '$7 == "GB/s" && $1 == "tpsh" { k = $2 " " $3; t[k] = $6; order[++n] = k }
    $7 == "GB/s" && $1 == "torch" { p[$2 " " $3] = $6 }
    END { lo = 9; for (i = 1; i <= n; i++) { k = order[i]; if (!(p[k] > 0)) continue; r = t[k] / p[k]
            printf "ratio pointwise %-28s %6.3f (tpsh %.1f GB/s, torch %.1f GB/s; target >= 0.80)\n", k, r, t[k], p[k]
            if (r < lo) { lo = r; lk = k } }
          if (lk != "") printf "ratio pointwise lowest: %.3f (%s; target >= 0.80)\n", lo, lk }' \
    "$OUT/pointwise.log" | tee -a "$OUT/pointwise.log"
fi

# ---- softmax, norms and reductions along a dim (GB/s), addmm and bmm (TFLOP/s), beside PyTorch on the
# same GPU: scripts/bench/bench_reduce.lua and torch_reduce.py print the same "case NAME ms T ..." lines, joined
# here by NAME into one ratio line each (tpsh's time over PyTorch's: below 1 is faster) -----------------
reduce() {
  "$TP" --backend cuda scripts/bench/bench_reduce.lua > "$OUT/reduce_tpsh.txt" 2>&1 || { cat "$OUT/reduce_tpsh.txt"; return 1; }
  env -u LD_LIBRARY_PATH python3 scripts/bench/torch_reduce.py > "$OUT/reduce_torch.txt" 2>&1 || echo "torch: not measured"
  cat "$OUT/reduce_tpsh.txt" "$OUT/reduce_torch.txt"
  awk '$1 == "case" { if (FILENAME ~ /tpsh/) t[$2] = $4; else p[$2] = $4; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
    END { for (i = 1; i <= n; i++) { k = order[i]; if ((k in t) && (k in p))
      printf "ratio reduce %-34s time tpsh / torch %6.3f (tpsh %.4f ms, torch %.4f ms)\n", k, t[k] / p[k], t[k], p[k] } }' \
    "$OUT/reduce_tpsh.txt" "$OUT/reduce_torch.txt"
}
export -f reduce
want reduce && step reduce 300 reduce

# ---- graphs (tp.graph): the specs on cuda (a CUDA graph a replay; in check mode the record enqueued
# again, for the sanitizer), then 100 small add_ and 100 small all_reduce (a world of one rank) eager
# against captured and replayed, tpsh (scripts/bench/bench_graph.lua) beside PyTorch's CUDA graphs on the same
# GPU (scripts/bench/torch_graph.py). Ratio lines: each side's graph against its eager loop, and tpsh's replay
# against PyTorch's, host cost and wall time per op (the target: a replay's host cost <= 1 us per op).
graphs() {
  local specs=(tests/graph_spec.lua tests/gpu/graph_spec.lua)
  mpiexec -n 1 "$TP" --backend cuda test -o plain "${specs[@]}" || return 1
  if [ "$NP" -ge 2 ]; then mpiexec -n "$NP" "$TP" --backend cuda test -o plain "${specs[@]}" || return 1; fi
  mpiexec -n 1 "$TP" --backend cuda --check test -o plain "${specs[@]}" || return 1
  "$TP" --backend cuda scripts/bench/bench_graph.lua > "$OUT/graph_tpsh.txt" || { cat "$OUT/graph_tpsh.txt"; return 1; }
  cat "$OUT/graph_tpsh.txt"
  env -u LD_LIBRARY_PATH python3 scripts/bench/torch_graph.py > "$OUT/graph_torch.txt" 2>&1 || echo "torch: not measured"
  cat "$OUT/graph_torch.txt"
  awk '$1 == "graph-bench" { k = $3 " " $4; h[$2, k, $5] = $7; w[$2, k, $5] = $11; cases[k] = 1 }
    END { for (c in cases) if (h["torch", c, "graph"] > 0)
      printf "ratio graph tpsh/torch %-16s replay host per op %.3f (tpsh %.3f us, torch %.3f us), wall per op %.3f (tpsh %.3f us, torch %.3f us)\n", c,
        h["tpsh", c, "graph"] / h["torch", c, "graph"], h["tpsh", c, "graph"], h["torch", c, "graph"],
        w["tpsh", c, "graph"] / w["torch", c, "graph"], w["tpsh", c, "graph"], w["torch", c, "graph"] }' \
    "$OUT/graph_tpsh.txt" "$OUT/graph_torch.txt"
}
export -f graphs
want graph && step graph 300 graphs

# ---- CPU collectives against MPI from C on this machine's CPUs (issue 46; not in the default STEPS) ---
# Step cpu_collectives: scripts/bench/bench_collectives.sh -r 3 at 2, 4 and 8 ranks, 4 KiB to 64 MiB, the
# CPU backend against bench_collectives_ref alternately; lines "ratio <collective> <n> ranks <bytes> B:
# tpsh / C" and "lowest ratio" per collective (targets: >= 0.97 at >= 1 MiB, >= 0.95 at 4-64 KiB). Step
# cpu_collectives_split: the same at 2 and 8 ranks from 1 MiB for reduce_scatter, all_to_all and
# broadcast, with the C reference in tpsh's conditions beside it (MPI_THREAD_MULTIPLE; + calls from a
# second thread; + buffers placed as tpsh's): lines "C[<options>] / C" tell which condition costs what.
cpu_coll() { scripts/bench/bench_collectives.sh -b "$BUILD" -n "${CPU_COLL_NPS:-2 4 8}" -r 3 --min 4K --max 64M; }
cpu_coll_split() {
  scripts/bench/bench_collectives.sh -b "$BUILD" -n "2 8" -r 3 -V --thread-multiple -V "--thread-multiple --worker" \
    -V "--thread-multiple --worker --tpsh-buffers" --ops reduce_scatter,all_to_all,broadcast --min 1M --max 64M
}
# Step cpu_paired: the same sizes at the same rank counts, each compared inside one process (bench_collectives.sh
# -P 5: the C loop of libtpsh_mpi_ref.so and tpsh's calls alternately, 5 rounds a size, and the C loop's calls
# handed to a thread of their own, --ref-thread); lines "ratio in-process ...", "in-process lowest ratio" and
# "in-process lowest tpsh / C on a thread" per collective. With TPSH_CPU_SPIN_US=0 again at 4-64 KiB (the
# threads sleep at once: what polling gives, docs/design.md).
cpu_paired() {
  scripts/bench/bench_collectives.sh -b "$BUILD" -n "${CPU_COLL_NPS:-2 4 8}" -P "${CPU_PAIRED_ROUNDS:-5}" --ref-thread --min 4K --max 64M
  echo "-- TPSH_CPU_SPIN_US=0"
  TPSH_CPU_SPIN_US=0 scripts/bench/bench_collectives.sh -b "$BUILD" -n "${CPU_COLL_NPS:-2 4 8}" -P "${CPU_PAIRED_ROUNDS:-5}" --min 4K --max 64K |
    sed 's/in-process lowest/in-process (no polling) lowest/'
}
export -f cpu_coll cpu_coll_split cpu_paired
want cpu_paired && step cpu_paired 540 cpu_paired
want cpu_collectives && step cpu_collectives 540 cpu_coll
want cpu_collectives_split && step cpu_collectives_split 540 cpu_coll_split

# ---- overlap: all_gather 256 MiB per rank with a bf16 8192^3 matmul -------------------------------
if want overlap && [ "$NP" -ge 2 ]; then
  step overlap 120 mpiexec -n "$NP" "$TP" --backend cuda examples/overlap.lua 8192 256 bf16 10
fi

# ---- the overlap lab: pipeline schedules with a trace picture, and what tracing costs ------------------
if want lab && [ "$NP" -ge 2 ]; then
  step overlap_traced 120 mpiexec -n "$NP" "$TP" --backend cuda --trace "$OUT/overlap-gpu.svg" examples/overlap.lua 8192 256 bf16 10
  step pipeline 180 mpiexec -n "$NP" "$TP" --backend cuda --trace "$OUT/pipeline-gpu.svg" examples/pipeline.lua 4096 8192 8192 4 20 bf16
  step trace_overhead 240 mpiexec -n "$NP" "$TP" --backend cuda scripts/bench/bench_trace.lua 5 4096 8192 8192 4 20 bf16
  step gather 60 mpiexec -n "$NP" "$TP" --backend cuda examples/gather.lua
fi

# ---- pipeline.lua on one GPU, traced (not in the default STEPS: STEPS=pipeline1): at the lab's sizes, where
# the own rows' matmul covers the gather, and at a narrow W (N = 1024), where the gather is the longer part;
# a world of one rank gathers by a copy, so the lines "parts alone" and the trace show each part's cost ---
if want pipeline1; then
  step pipeline1 150 mpiexec -n 1 "$TP" --backend cuda --trace "$OUT/pipeline-1gpu.svg" examples/pipeline.lua 4096 8192 8192 4 20 bf16
  step pipeline1_narrow 150 mpiexec -n 1 "$TP" --backend cuda examples/pipeline.lua 4096 8192 1024 4 20 bf16
fi

# ---- the schedules of examples/schedules/ at 1 rank, and one layer's kernels beside PyTorch's (not in the
# default STEPS: STEPS=schedules scripts/gpu/gpu_check.sh) ----------------------------------------------
want schedules && step schedules 400 env OUT="$OUT/schedules" scripts/gpu/gpu_schedules.sh

{
  echo
  echo "== gpu_check $(date -u +%Y-%m-%dT%H:%MZ), $NGPU GPU(s), logs in $OUT"
  printf '%s\n' "${SUMMARY[@]}"
} | tee -a "$OUT/all.log"
grep -h '^ratio' "$OUT"/collectives.log "$OUT"/paired.log "$OUT"/overhead.log "$OUT"/pointwise.log "$OUT"/reduce.log "$OUT"/graph.log "$OUT"/alloc.log 2>/dev/null | tee -a "$OUT/all.log"
grep -hE 'lowest (ratio|tpsh)' "$OUT"/cpu_collectives*.log "$OUT"/cpu_paired.log 2>/dev/null | tee -a "$OUT/all.log"

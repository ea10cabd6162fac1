#!/bin/sh
# fuzz_api.sh: scripts/ci/fuzz_api.lua over many seeds, on 1, 2 and 3 ranks (docs/design.md, "Fuzzing the API").
#
#   scripts/ci/fuzz_api.sh [TPSH [FIRST_SEED [SEEDS [ITERS]]]]     defaults: build/tpsh 1 20 2000
#
# For each seed: the single-rank part on 1 rank (ITERS calls) and on 2 ranks (each its own sequence);
# the collectives on 2 and 3 ranks (ITERS / 10 steps, --timeout 20); and one deliberate mismatch on 2
# and 3 ranks, once with a short watchdog (--timeout 5) and once in check mode. A run fails when it
# does not end within its limit (a hang); when a matched run ends with any status but 0 (1: findings,
# printed with their call; a crash, an abort, the watchdog: another); when a mismatched run is ended by
# a signal, or ends with 0 where the fuzzer did not say that the mismatch may go unnoticed. Each
# failing run's command and the last lines of its output are printed; the exit status is the number of
# failing runs (at most 255).
TPSH=${1:-build/tpsh}
# Each rank's address space is capped: the fuzzer replaces valid allocations of 16 MiB to 1 TiB, and a
# slip in that would otherwise take the machine's memory (larger ones fail at once, as they should).
# Not under AddressSanitizer (ASAN_OPTIONS set), whose shadow memory needs terabytes of address space:
# there ASAN_OPTIONS' max_allocation_size_mb caps allocations (scripts/ci/sanitize.sh sets it).
# OpenBLAS starts a thread per core when it is loaded, before tpsh sets its one thread, each with a
# buffer of up to 128 MiB of address space: on the 64-core GPU machine that alone passed the cap, and
# thread creation failed in MPI_Init. The fuzzer needs no BLAS threads, so it gets one from the start.
[ -n "${ASAN_OPTIONS:-}" ] || ulimit -v 8000000
export OPENBLAS_NUM_THREADS=1
FIRST=${2:-1}
SEEDS=${3:-20}
ITERS=${4:-2000}
DIR=$(dirname "$0")
FAILS=0

# run LIMIT EXPECT NP ARGS...: EXPECT is "ok" (status 0) or "fail" (a status other than 0, within LIMIT s;
# 0 too where the fuzzer says the mismatch may go unnoticed). The time decides a hang, not the status:
# the watchdog ends a run with 124, as timeout(1) does.
run() {
  limit=$1; expect=$2; np=$3; shift 3
  t0=$(date +%s)
  out=$(timeout -k 5 "$limit" mpiexec -n "$np" "$TPSH" --backend cpu "$@" 2>&1)
  rc=$?
  took=$(( $(date +%s) - t0 ))
  bad=""
  if [ $took -ge "$limit" ]; then bad="did not end within $limit s"
  elif [ $rc -gt 128 ]; then bad="status $rc (a signal)"
  elif [ "$expect" = ok ] && [ $rc -ne 0 ]; then bad="status $rc"
  elif [ "$expect" = fail ] && [ $rc -eq 0 ] && ! echo "$out" | grep -q "status 0 allowed"; then
    bad="status 0 after a mismatch"
  fi
  if [ -n "$bad" ]; then
    FAILS=$((FAILS + 1))
    echo "FAIL ($bad): mpiexec -n $np $TPSH --backend cpu $*"
    echo "$out" | grep -v '^\[rank [0-9]*\] *\(stack traceback\|	\)' | tail -15 | sed 's/^/    /'
  fi
}

seed=$FIRST
while [ "$seed" -lt $((FIRST + SEEDS)) ]; do
  echo "seed $seed"
  run 300 ok 1 "$DIR/fuzz_api.lua" --quiet --seed "$seed" --iters "$ITERS"
  run 300 ok 2 "$DIR/fuzz_api.lua" --quiet --seed "$seed" --iters "$ITERS"
  for np in 2 3; do
    run 300 ok "$np" --timeout 20 "$DIR/fuzz_api.lua" --quiet --collectives --seed "$seed" --iters $((ITERS / 10))
    run 60 fail "$np" --timeout 5 "$DIR/fuzz_api.lua" --quiet --collectives --mismatch --seed "$seed" --iters 40
    run 60 fail "$np" --timeout 10 --check "$DIR/fuzz_api.lua" --quiet --collectives --mismatch --seed "$seed" --iters 40
  done
  seed=$((seed + 1))
done
echo "$FAILS failing runs"
[ $FAILS -gt 255 ] && FAILS=255
exit $FAILS

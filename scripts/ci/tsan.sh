#!/usr/bin/env bash
# Builds tpsh with ThreadSanitizer (CPU backend only) and runs the C tests and the specs under it: on 1
# and 2 ranks, and on 2 in check mode. Any report fails the run, a child process's too (log_path).
#   scripts/ci/tsan.sh [build dir]          (default build dir: build-tsan)
# What this needs besides the flags (found by the TSan audit of 2026-12-01):
# - UCX_MEM_EVENTS=no: UCX's libucm hooks madvise(), which glibc calls while a thread exits (its stack's
#   advise_stack_range), after TSan has torn that thread's state down: every process that ended a thread
#   died of SIGSEGV in __tsan::MutexPreReadLock under ucm_event_enter. tpsh needs no UCX memory events
#   on one host.
# - exitcode=0: TSan's default exit status for a run with reports is 66, tpsh's own status for check
#   mode's reports, and the specs check their children's statuses. The reports are counted below instead.
# - allocator_may_return_null / max_allocation_size_mb, and ASAN_OPTIONS set (to nothing): specs ask for
#   absurd sizes and expect a refusal; fuzz_spec caps its children with `ulimit -v` unless ASAN_OPTIONS
#   is set, and TSan cannot map its shadow memory under that cap.
# - Tests that race on purpose are left out (--exclude): check_spec's "wrong schedules" and "check mode
#   off records nothing", check_streams_spec's four races on recycled clock slots (added after the
#   audit; their reports, two streams filling and reading one tensor unordered, are the test's own),
#   and runner_spec's tests that run a racing fixture or -e chunk under --check; chaos_spec's races and
#   runner_spec's --chaos tests, whose scripts race on purpose for chaos mode to expose; watchdog_spec's
#   "when MPI_Finalize hangs", whose second child races on purpose for check mode's status 66 (a worker
#   that takes its whole queue at once no longer orders the two streams by the lock, by chance).
# - runner_spec's SIGTERM sent twice to `-e 'while true do end'`: TSan delivers a signal at the thread's
#   next intercepted call, which a loop of Lua alone never makes, so the child never ends.
#   Their reports are races of the test's own script (two streams touching one tensor unordered), which
#   is what check mode exists to report; no suppression could tell them from a race of tpsh's own.
# - The > 2 GiB send/recv test is left out: under TSan it needs about 8 GiB of resident memory a rank.
# No suppression is needed: MPICH, UCX, OpenBLAS and LuaJIT gave no report of their own (UCX's eager
# handler appears only as the writer of a collective's output that a racing test reads unordered).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${1:-build-tsan}
mkdir -p "$build"
build=$(cd "$build" && pwd)
cmake -S . -B "$build" -G Ninja -DTPSH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build "$build" -j2

logs="$build/tsan-logs"
rm -rf "$logs"
mkdir -p "$logs"
export UCX_MEM_EVENTS=no HWLOC_COMPONENTS=-pci TPSH_BACKEND=cpu TPSH_TIMEOUT=300 ASAN_OPTIONS=
export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 exitcode=0 allocator_may_return_null=1 max_allocation_size_mb=8192 log_path=$logs/tsan"
excl=(--exclude "wrong schedules" --exclude "check mode off records nothing" --exclude "in check mode %(%-%-check%)"
      --exclude "status 66 when check mode" --exclude "more than 2 GiB"
      --exclude "race between two streams on reused slots" --exclude "knew a slot's old owner"
      --exclude "synchronised a slot's old owner" --exclude "same race on a new stream each time"
      --exclude "every race of the sanitizer's corpus gives a wrong result" --exclude "^%-%-chaos and TPSH_CHAOS"
      --exclude "ended by SIGTERM' once when the signal comes twice" --exclude "when MPI_Finalize hangs")

. "$root/scripts/ci/sanitizer_steps.sh"        # step, run_c_tests, failed
run_c_tests
step specs_np1 mpiexec -n 1 "$build/tpsh" test -o plain "${excl[@]}" tests/
step specs_np2 mpiexec -n 2 "$build/tpsh" test -o plain "${excl[@]}" tests/
step specs_check_np2 mpiexec -n 2 "$build/tpsh" --check test -o plain "${excl[@]}" tests/

reports=$(grep -l 'WARNING: ThreadSanitizer' "$logs"/tsan.* 2>/dev/null || true)
if [ -n "$reports" ]; then
  echo "ThreadSanitizer reports:"
  grep -h 'SUMMARY: ThreadSanitizer' $reports | sort | uniq -c
  for f in $reports; do echo "== $f"; head -60 "$f"; done
  failed=1
fi
[ $failed = 0 ] && echo "no ThreadSanitizer reports" || echo "tsan.sh: FAILED"
exit $failed

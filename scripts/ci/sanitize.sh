#!/usr/bin/env bash
# Builds tpsh with AddressSanitizer and UndefinedBehaviorSanitizer (CPU backend only) and runs the C tests
# and the specs under them: on 1 and 2 ranks by default; with --all also on 3 ranks, on 3 in check mode,
# the REPL through a pty and the examples. Any report fails the run, also one from a child process that a
# spec expects to fail (those are written to files, not only to the spec's captured output).
#   scripts/ci/sanitize.sh [--all] [build dir]          (default build dir: build-asan)
# Leaks of MPICH and the libraries under it are suppressed by scripts/ci/lsan.supp; tpsh's own are not.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
all=0
if [ "${1:-}" = --all ]; then all=1; shift; fi
build=${1:-build-asan}
mkdir -p "$build"
build=$(cd "$build" && pwd)

san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$build" -G Ninja -DTPSH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j2

logs="$build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
# allocator_may_return_null: specs ask for absurd sizes on purpose and expect malloc to say no, as it does
#   in the normal build (ASan would abort instead).
# max_allocation_size_mb: what `ulimit -v` does for the fuzz spec in the normal build (ASan's shadow memory
#   needs terabytes of address space, so no ulimit there): a larger allocation is refused, not attempted.
# verify_asan_link_order=0: watchdog_spec preloads libtpsh_hung_finalize.so (an MPI_Finalize that hangs)
#   ahead of the ASan runtime; it replaces no allocation function, so the order does not matter.
# log_path: every process's reports land in a file of its own, checked below.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:max_allocation_size_mb=8192:verify_asan_link_order=0:log_path=$logs/asan"
export LSAN_OPTIONS="suppressions=$root/scripts/ci/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan"
# hwloc's PCI plugin (libpciaccess) leaks, and hwloc unloads the plugin before exit, so the leak's stack
# shows an "<unknown module>" that no suppression can name. tpsh on one host needs no PCI topology.
export HWLOC_COMPONENTS=-pci
export TPSH_BACKEND=cpu

. "$root/scripts/ci/sanitizer_steps.sh"        # step, run_c_tests, failed

run_c_tests
nps="1 2"
[ $all = 1 ] && nps="1 2 3"
# One rank with the caching allocator (its own code under the sanitizers), more without it
# (TPSH_NO_MEMORY_CACHING=1: each tensor its own allocation of its exact size, so AddressSanitizer sees
# an access past a tensor's end, which a cached block of a larger size class would hide). The tests that
# start a child job run once, on one rank (their child is the same at every rank count: CMakeLists.txt).
for n in $nps; do
  nocache=$([ "$n" = 1 ] && echo 0 || echo 1)
  children=$([ "$n" = 1 ] && echo 1 || echo 0)
  step "specs_np$n" env TPSH_NO_MEMORY_CACHING=$nocache TPSH_SPEC_CHILD_JOBS=$children mpiexec -n "$n" "$build/tpsh" --timeout 300 test -o plain tests/
done
if [ $all = 1 ]; then
  step specs_check_np3 env TPSH_SPEC_CHILD_JOBS=0 mpiexec -n 3 "$build/tpsh" --timeout 300 --check test -o plain tests/
  step repl python3 tests/repl_test.py "$build/tpsh" "$(command -v mpiexec)"
  for e in examples/*.lua; do
    step "example_$(basename "$e" .lua)" mpiexec -n 2 "$build/tpsh" --timeout 300 "$e"
  done
fi

# The reports. allocator_may_return_null leaves a warning for each refused allocation: not a report.
reports=$(grep -lE 'ERROR: |runtime error' "$logs"/asan.* "$logs"/ubsan.* 2>/dev/null || true)
if [ -n "$reports" ]; then
  echo "sanitizer reports:"
  for f in $reports; do echo "== $f"; head -60 "$f"; done
  failed=1
fi
[ $failed = 0 ] && echo "no sanitizer reports" || echo "sanitize.sh: FAILED"
exit $failed

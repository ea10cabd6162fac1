#!/usr/bin/env bash
# Prepares the GPU proof on the build machine: builds with the CUDA backend, copies the binaries that
# scripts/gpu/gpu_check.sh runs into .gpu/build (object files stay behind: the carried tree must stay under
# 64 MiB), and packs the runtime libraries the GPU machine lacks (MPICH, LuaJIT, OpenBLAS, luassert),
# and perf and strace where this machine has them (the diagnostics' tools).
#   scripts/gpu/gpu_prepare.sh [build dir]          then carry [".gpu"] and run scripts/gpu/gpu_check.sh there
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
[ -f "$build/build.ninja" ] || [ -f "$build/Makefile" ] || cmake -S . -B "$build" -G Ninja >/dev/null
cmake --build "$build" -j2
for b in tpsh nccl_ref overhead_ref; do
  [ -x "$build/$b" ] || { echo "gpu_prepare: $build/$b is missing: is the CUDA backend on (nvcc and NCCL found)?" >&2; exit 1; }
done
rm -rf .gpu/build && mkdir -p .gpu/build
for b in tpsh nccl_ref overhead_ref diag_end_marker bench_overhead_ref bench_collectives_ref libtpsh_hung_finalize.so libtpsh_nccl_ref.so libtpsh_overhead_ref.so libtpsh_mpi_ref.so; do
  [ -x "$build/$b" ] && cp "$build/$b" .gpu/build/
done
../shared/device/pack-runtime.sh "$build/tpsh" .gpu >/dev/null
# perf and strace for the diagnostics (scripts/diag/profile_collective.sh, syscalls_collective.sh), where
# the build machine has them (Debian's linux-perf and strace): the binaries and their libraries, less
# the C library's own, which the GPU machine has in a newer version
tools=$(for t in perf strace; do command -v $t; done || true)
if [ -n "$tools" ] && [ ! -f .gpu/tools.tar.xz ]; then
  pack=$(mktemp -d) && mkdir -p "$pack/perfpack/lib" && cp $tools "$pack/perfpack/" &&
    for t in $tools; do ldd "$t"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' | xargs -I{} cp -L {} "$pack/perfpack/lib/" &&
    tar cJf .gpu/tools.tar.xz -C "$pack" perfpack
  rm -rf "$pack"
fi
rm -f .gpu/perf.tar.xz                                               # the older pack, perf alone
git check-ignore -q .gpu || echo /.gpu/ >> .git/info/exclude     # the run tool carries ignored paths only when asked
du -sh .gpu .gpu/build .gpu/runtime.tar.xz

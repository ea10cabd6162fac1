#!/usr/bin/env bash
# Prepares the GPU proof on the build machine: builds with the CUDA backend, copies the binaries that
# scripts/gpu_check.sh runs into .gpu/build (object files stay behind: the carried tree must stay under
# 64 MiB), and packs the runtime libraries the GPU machine lacks (MPICH, LuaJIT, OpenBLAS, luassert),
# and perf where this machine has it (scripts/profile_collective.sh).
#   scripts/gpu_prepare.sh [build dir]          then carry [".gpu"] and run scripts/gpu_check.sh there
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/build.ninja" ] || [ -f "$build/Makefile" ] || cmake -S . -B "$build" -G Ninja >/dev/null
cmake --build "$build" -j2
for b in tpsh nccl_ref overhead_ref; do
  [ -x "$build/$b" ] || { echo "gpu_prepare: $build/$b is missing: is the CUDA backend on (nvcc and NCCL found)?" >&2; exit 1; }
done
rm -rf .gpu/build && mkdir -p .gpu/build
for b in tpsh nccl_ref overhead_ref bench_overhead_ref bench_collectives_ref libtpsh_hung_finalize.so libtpsh_nccl_ref.so libtpsh_overhead_ref.so; do
  [ -x "$build/$b" ] && cp "$build/$b" .gpu/build/
done
../shared/device/pack-runtime.sh "$build/tpsh" .gpu >/dev/null
# perf for scripts/profile_collective.sh, where the build machine has it (Debian's linux-perf): the
# binary and its libraries, less the C library's own, which the GPU machine has in a newer version
if command -v perf > /dev/null && [ ! -f .gpu/perf.tar.xz ]; then
  pack=$(mktemp -d) && mkdir -p "$pack/perfpack/lib" && cp "$(command -v perf)" "$pack/perfpack/" &&
    ldd "$(command -v perf)" | awk '$3 ~ /^\// {print $3}' |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' | xargs -I{} cp -L {} "$pack/perfpack/lib/" &&
    tar cJf .gpu/perf.tar.xz -C "$pack" perfpack
  rm -rf "$pack"
fi
git check-ignore -q .gpu || echo /.gpu/ >> .git/info/exclude     # the run tool carries ignored paths only when asked
du -sh .gpu .gpu/build .gpu/runtime.tar.xz

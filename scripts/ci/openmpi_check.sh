#!/usr/bin/env bash
# Builds tpsh against Open MPI (beside the default MPICH build) and runs two spec files on 2 ranks with
# Open MPI's launcher: the check that tpsh builds and passes against both MPI libraries (a few minutes on
# 2 cores; CI runs it after the MPICH suite).
#   scripts/ci/openmpi_check.sh [build dir]        (needs libopenmpi-dev and openmpi-bin)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-openmpi}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPSH_CUDA=OFF -DTPSH_MPI=openmpi >/dev/null
cmake --build "$build" -j2 --target tpsh
# Open MPI refuses to run as root unless told, and counts slots by cores. The specs' child jobs run
# `mpiexec` from PATH: it must be Open MPI's too, which a directory of one link puts first.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
ln -s "$(command -v mpiexec.openmpi)" "$bin/mpiexec"
PATH="$bin:$PATH" TPSH_TIMEOUT=120 timeout 600 mpiexec -n 2 "$build/tpsh" --backend cpu test -o plain \
  tests/collectives_spec.lua tests/stream_spec.lua

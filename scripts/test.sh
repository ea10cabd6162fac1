#!/usr/bin/env bash
# Builds tpsh and runs every test: the C tests of the core, the specs under mpiexec with 1, 2, 3 and 4
# ranks on the CPU backend (and with 3 in check mode), and the REPL through a pty (ctest drives them
# all; see CMakeLists.txt).
#   scripts/test.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2
ctest --test-dir "$build" --output-on-failure --timeout 900

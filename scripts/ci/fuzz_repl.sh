#!/bin/sh
# fuzz_repl.sh: the REPL's fuzz (tests/repl_test.py's fuzz) run long and alone: random lines, Ctrl-C and
# exits through a real pseudo-terminal under mpiexec; every line must get its prompt back and every
# session end with its exit's status. CI runs a short one inside tests/repl_test.py.
#
#   scripts/ci/fuzz_repl.sh [-b BUILD_DIR] [-n NP] [SESSIONS [LINES [SEED]]]      (defaults: 20 sessions of 300 lines)
set -eu
BUILD=build NP=2
while [ $# -gt 0 ]; do
  case "$1" in
    -b) BUILD=$2; shift 2 ;;
    -n) NP=$2; shift 2 ;;
    *) break ;;
  esac
done
cd "$(dirname "$0")/../.."
TPSH_REPL_FUZZ_ONLY=1 TPSH_REPL_NP=$NP TPSH_REPL_FUZZ_SESSIONS=${1:-20} TPSH_REPL_FUZZ_LINES=${2:-300} \
  TPSH_REPL_FUZZ_SEED=${3:-} exec python3 tests/repl_test.py "$BUILD/tpsh" mpiexec

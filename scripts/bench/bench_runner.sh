#!/usr/bin/env bash
# What `tpsh test` costs a test: N trivial tests (default 10,000, in one describe block) run by tpsh on 1
# and 2 ranks and by Debian's busted (when installed) in one process, on the same machine in the same
# run. Each figure is the best wall time of R runs (default 3), start-up included; docs/perf.md keeps them.
#   scripts/bench/bench_runner.sh [build dir] [N] [R]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
n=${2:-10000}
runs=${3:-3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/trivial_spec.lua" <<LUA
describe("trivial", function()
  for i = 1, $n do it("test " .. i, function() assert.is_true(true) end) end
end)
LUA
best() {   # best wall time in seconds of "$@", run $runs times; its output's last line must say all passed
  local b=""
  for _ in $(seq "$runs"); do
    local t0 t1 last
    t0=$(date +%s.%N)
    last=$("$@" 2>&1 | tail -1)
    t1=$(date +%s.%N)
    case "$last" in *"$n passed, 0 failed"*|*"$n success"*) ;; *) echo "failed: $* -> $last" >&2; exit 1 ;; esac
    b=$(echo "$t0 $t1 $b" | awk '{ t = $2 - $1; if ($3 == "" || t < $3) print t; else print $3 }')
  done
  printf '%.2f' "$b"
}
echo "$n trivial tests, best of $runs runs (s):"
echo "  tpsh test, 1 rank:   $(best mpiexec -n 1 "$build/tpsh" --backend cpu test -o plain "$dir/trivial_spec.lua")"
echo "  tpsh test, 2 ranks:  $(best mpiexec -n 2 "$build/tpsh" --backend cpu test -o plain "$dir/trivial_spec.lua")"
if command -v busted >/dev/null; then
  echo "  busted, 1 process:   $(best busted -o plainTerminal "$dir/trivial_spec.lua")"
fi

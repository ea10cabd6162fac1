# sanitizer_steps.sh: sourced by scripts/ci/sanitize.sh and scripts/ci/tsan.sh (not run on its own). Each step
# runs a command with its output in $logs/NAME.out, prints ok or FAIL with its time, and a failure sets
# failed=1; run_c_tests runs every C test of the build ($build/test_*) as a step.
failed=0
step() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$logs/$name.out" 2>&1; then
    echo "ok    $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL  $name ($((SECONDS - t0)) s): status $?; its output is in $logs/$name.out"
    tail -20 "$logs/$name.out"
    failed=1
  fi
}
run_c_tests() {
  for t in "$build"/test_*; do
    [ -x "$t" ] && step "$(basename "$t")" "$t"
  done
}

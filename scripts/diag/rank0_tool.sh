# rank0_tool.sh: sourced by the diagnostics that run rank 0 of scripts/diag/profile_loop.lua under a tool
# (profile_collective.sh: perf; syscalls_collective.sh: strace and perf stat). The tools are not on the
# GPU machine: scripts/gpu/gpu_prepare.sh packs the build machine's, with their libraries, into
# .gpu/tools.tar.xz, unpacked here into /tmp/perfpack.
#   need_tool NAME                 unpacks the pack unless NAME is there already; exits when it cannot
#   rank0 MODE CALLS TOOL ARGS...  profile_loop.lua MODE CALLS on 2 ranks, rank 0 under TOOL ARGS
#                                  (the tools' libraries for the tool only: tpsh gets the caller's back)
BUILD=${BUILD:-$( [ -x .gpu/build/tpsh ] && echo .gpu/build || echo build )}
export BUILD TPSH_NCCL_REF=$(realpath "$BUILD/libtpsh_nccl_ref.so")

need_tool() {
  [ -x "/tmp/perfpack/$1" ] || tar xJf .gpu/tools.tar.xz -C /tmp ||
    { echo "no $1: run scripts/gpu/gpu_prepare.sh where it is installed"; exit 1; }
}

rank0() {
  local m=$1 n=$2; shift 2
  mpiexec -n 2 bash -c 'm=$1 n=$2; shift 2; if [ "$PMI_RANK" = 0 ]; then
      L=${LD_LIBRARY_PATH:-}; LD_LIBRARY_PATH=/tmp/perfpack/lib "$@" env LD_LIBRARY_PATH="$L" \
        "$BUILD/tpsh" --backend cuda scripts/diag/profile_loop.lua "$m" "$n"
    else exec "$BUILD/tpsh" --backend cuda scripts/diag/profile_loop.lua "$m" "$n"; fi' _ "$m" "$n" "$@"
}

#!/usr/bin/env bash
# The schedules of examples/schedules/ on one GPU, and the kernels of one layer against PyTorch's:
#
#   tar xJf .gpu/runtime.tar.xz -C /tmp && source /tmp/tpsh-rt/env.sh && scripts/gpu/gpu_schedules.sh
#
# (as scripts/gpu/gpu_check.sh, whose step `schedules` runs this). Every schedule at 1 rank with --backend
# cuda at GPU sizes (bf16): each prints its check against the f64 reference and its tp.compare table;
# at 1 rank the collectives are copies, so the tables show what the kernels and the schedules'
# structure (chunks, rings of one, buckets) cost, not the overlap. Then scripts/bench/bench_layer.lua (tpsh)
# and scripts/bench/torch_schedules.py (PyTorch, the same kernels and sizes) and one table joining them:
# `tpsh / torch` per kernel (above 1: tpsh slower). Env: BUILD (default .gpu/build if it exists, else
# build), OUT (default /tmp/gpu_schedules), ITERS (default 20), BACKEND (default cuda; cpu tries the script
# on the build machine, where PyTorch is missing), SIZES=small (small sizes, for a
# quick try).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-$( [ -x .gpu/build/tpsh ] && echo .gpu/build || echo build )}
TP=$BUILD/tpsh
OUT=${OUT:-/tmp/gpu_schedules}
ITERS=${ITERS:-20}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT"
if ldd "$TP" | grep -q 'not found'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
  done
  export LD_LIBRARY_PATH
fi
export TPSH_TIMEOUT=${TPSH_TIMEOUT:-300}
rc=0

if [ "${SIZES:-}" = small ]; then
  L="rows=64 hidden=128 ffn=512"
  runs=("sp_mlp.lua rows=64 hidden=128 ffn=512 chunks=2"
        "collective_matmul.lua m=64 k=128 n=128 chunks=2"
        "fsdp.lua layers=4 hidden=128 batch=64"
        "ddp.lua layers=8 hidden=128 batch=64 bucket=0.125")
else
  # A GPT-3 6.7B-sized MLP (hidden 4096, ffn 4 x 4096) on 4096 tokens; pipeline.lua's GEMM for the
  # collective matmul; 8 layers of 4096^2 for FSDP; 8 of 2048^2 for DDP (8 MiB of bf16 gradient a layer:
  # DDP's default bucket of 25 MiB takes 4 of them).
  L="rows=4096 hidden=4096 ffn=16384"
  runs=("sp_mlp.lua rows=4096 hidden=4096 ffn=16384 chunks=4"
        "collective_matmul.lua m=4096 k=8192 n=8192 chunks=4"
        "fsdp.lua layers=8 hidden=4096 batch=4096"
        "ddp.lua layers=8 hidden=2048 batch=8192 bucket=25")
fi

for r in "${runs[@]}"; do
  name=${r%%.lua*}
  echo "== $r dtype=bf16 iters=$ITERS"
  # shellcheck disable=SC2086
  mpiexec -n 1 "$TP" --backend "$BACKEND" examples/schedules/$r dtype=bf16 iters="$ITERS" warmup=3 > "$OUT/$name.log" 2>&1
  st=$?
  cat "$OUT/$name.log"
  [ $st = 0 ] || { echo "FAIL: $name (status $st)"; rc=1; }
done

echo "== the kernels of one sp_mlp layer ($L bf16): tpsh, then PyTorch"
# shellcheck disable=SC2086
"$TP" --backend "$BACKEND" scripts/bench/bench_layer.lua $L dtype=bf16 iters="$ITERS" > "$OUT/layer_tpsh.log" 2>&1 || rc=1
cat "$OUT/layer_tpsh.log"
# PyTorch brings its own CUDA libraries: tpsh's runtime path is dropped for it
# shellcheck disable=SC2086
env -u LD_LIBRARY_PATH python3 scripts/bench/torch_schedules.py $(echo $L | sed 's/\([a-z]*\)=/--\1 /g') --dtype bf16 \
  --iters "$ITERS" > "$OUT/layer_torch.log" 2>&1 || rc=1
cat "$OUT/layer_torch.log"
echo "== tpsh / torch per kernel (median ms)"
# rows are "name ... <ms> ms <rate> <unit>": the name is everything before the number that precedes "ms"
awk 'FNR == 1 { next }
     { n = ""; for (i = 1; i < NF; i++) { if ($(i + 1) == "ms") { ms = $i; break } n = n (n == "" ? "" : " ") $i }
       if (FNR == NR) t[n] = ms; else if (n in t) printf "%-16s tpsh %9.3f  torch %9.3f  tpsh/torch %6.2f\n", n, t[n], ms, t[n] / ms }' \
  "$OUT/layer_tpsh.log" "$OUT/layer_torch.log"
exit $rc

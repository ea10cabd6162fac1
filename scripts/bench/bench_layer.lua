-- bench_layer.lua: the kernels of one layer of examples/schedules/sp_mlp.lua (one rank's share, no
-- communication), each timed with tp.time, in the rows that scripts/bench/torch_schedules.py prints for
-- PyTorch at the same sizes, so that the two outputs compare line by line (scripts/gpu/gpu_schedules.sh
-- joins them).
--
--   tpsh --backend cuda scripts/bench/bench_layer.lua [rows=4096 hidden=4096 ffn=16384 dtype=bf16 iters=20]
--
-- Each row: the median device time of the kernel on the current stream over `iters` iterations after
-- `warmup`, and its rate (TFLOP/s for a GEMM, 2 m n k flops; GB/s for the element-wise ops, the bytes
-- read and written once). Outputs are preallocated. The element-wise ops are the schedules' own
-- (common.lua's S.act and S.act_backward).
local here = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local S = dofile(here .. "../../examples/schedules/common.lua")
local knobs = {
  { "rows", 4096, "tokens (rows of X)" },
  { "hidden", 4096, "hidden size" },
  { "ffn", 16384, "FFN width" },
  { "dtype", "bf16", "element type" },
  { "iters", 20, "timed iterations per kernel" },
  { "warmup", 3, "untimed iterations before them", min = 0 },
  { "quiet", false, "print nothing" },
}
local o = S.options("bench_layer.lua", knobs, ...)
local m, H, F, dt = o.rows, o.hidden, o.ffn, o.dtype
local E = function(shape) return tp.empty(shape, dt) end
local X, dY = S.randn({ m, H }, dt, 1), S.randn({ m, H }, dt, 2)
local W1, W2 = S.randn({ H, F }, dt, 3, 1 / math.sqrt(H)), S.randn({ F, H }, dt, 4, 1 / math.sqrt(F))
local A, Z, Y, dZ, dA, dX, dW1, dW2 = E { m, F }, E { m, F }, E { m, H }, E { m, F }, E { m, F }, E { m, H }, E { H, F }, E { F, H }
local es = X:nbytes() / X:numel()
local gemm = function(a, b, c) return 2 * a * b * c end

-- { name, fn, flops or nil, bytes or nil }
local kernels = {
  { "fwd X@W1", function() tp.matmul(X, W1, A) end, gemm(m, H, F) },
  { "fwd gelu", function() S.act(A, Z) end, nil, 2 * m * F * es },
  { "fwd Z@W2", function() tp.matmul(Z, W2, Y) end, gemm(m, F, H) },
  { "bwd dY@W2^T", function() tp.matmul(dY, W2:t(), dZ) end, gemm(m, H, F) },
  { "bwd Z^T@dY", function() tp.matmul(Z:t(), dY, dW2) end, gemm(F, m, H) },
  { "bwd gelu'", function() S.act_backward(dZ, A, dA) end, nil, 3 * m * F * es },
  { "bwd dA@W1^T", function() tp.matmul(dA, W1:t(), dX) end, gemm(m, F, H) },
  { "bwd X^T@dA", function() tp.matmul(X:t(), dA, dW1) end, gemm(H, m, F) },
}
local all = {}
for i, kk in ipairs(kernels) do all[i] = kk[2] end
kernels[#kernels + 1] = { "layer fwd+bwd", function() for _, f in ipairs(all) do f() end end, 6 * gemm(m, H, F) }

S.say("# tpsh %s, backend %s%s: rows=%d hidden=%d ffn=%d %s, median of %d", tp.version, tp.backend,
  tp.backend == "cuda" and (" (device " .. tp.device .. ")") or "", m, H, F, dt, o.iters)
for _, kk in ipairs(kernels) do
  local r = tp.time(kk[2], { iters = o.iters, warmup = o.warmup })
  local rate = kk[3] and ("%9.3g TFLOP/s"):format(kk[3] / r.median / 1e9) or ("%9.3g GB/s"):format(kk[4] / r.median / 1e6)
  S.say("%-16s %10.3f ms %s", kk[1], r.median, rate)
end

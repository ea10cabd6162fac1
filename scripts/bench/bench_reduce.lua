-- bench_reduce.lua: softmax, layer_norm, rms_norm and reductions along a dim (GB/s), addmm and bmm
-- (TFLOP/s), each into a preallocated output (out =), the figures beside PyTorch's from
-- scripts/bench/torch_reduce.py on the same GPU (scripts/gpu/gpu_check.sh, step "reduce", joins the two).
--
--   tpsh --backend cuda scripts/bench/bench_reduce.lua [--n N] [--rounds R] [--dtypes bf16,f32] [--gemm M]
--
-- A case runs its op ITERS times between two timing events, R rounds (default 7), and prints the
-- median per-op time as one line "case NAME ms T rate X UNIT" (NAME without spaces, the same as
-- torch_reduce.py's). Rows are N x N (default 8192); GB/s counts the bytes read and written once
-- (an input and an output of N x N, a reduction's output of N); a GEMM is M x M x M (default 8192; bmm:
-- 16 products of M/4 cubed), TFLOP/s = 2mnk / time, f32 without TF32 as PyTorch's default.
local N, ROUNDS, DTYPES, M = 8192, 7, { "bf16", "f32" }, 8192
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--n" then N = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--rounds" then ROUNDS = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--gemm" then M = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--dtypes" then
    DTYPES = {}
    for d in arg[i + 1]:gmatch("[^,]+") do DTYPES[#DTYPES + 1] = d end
    i = i + 1
  else error("unknown argument " .. a .. " (expected --n N, --rounds R, --dtypes LIST, --gemm M)", 0) end
  i = i + 1
end

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or 0.5 * (xs[n / 2] + xs[n / 2 + 1])
end

local t0, t1 = tp.event { timing = true }, tp.event { timing = true }
local function per_op_ms(iters, fn)
  fn()                                               -- warm: cuBLAS's heuristics, first-use costs
  tp.synchronize()
  local ms = {}
  for r = 1, ROUNDS do
    t0:record()
    for _ = 1, iters do fn() end
    t1:record()
    t1:synchronize()
    ms[r] = t0:elapsed(t1) / iters
  end
  return median(ms)
end

local function report(name, ms, amount, unit)
  print(("case %-36s ms %10.4f rate %10.2f %s"):format(name, ms, amount / ms / 1e6, unit))
end

print(("tpsh %s on %s, rank %d, rows %dx%d, gemm %d"):format(tp.version, tp.backend, tp.rank, N, N, M))
local iters = tp.backend == "cuda" and 20 or 2
for _, d in ipairs(DTYPES) do
  local es = ({ f32 = 4, f64 = 8, f16 = 2, bf16 = 2 })[d]
  local x = tp.randn({ N, N }, d, { seed = 1 })
  local w, b = tp.randn({ N }, d, { seed = 2 }), tp.randn({ N }, d, { seed = 3 })
  local o, r, rc = tp.empty({ N, N }, d), tp.empty({ N }, d), tp.empty({ N }, d)
  local rw = 2 * N * N * es                          -- one read and one write of N x N
  local shape = ("%s/%dx%d"):format(d, N, N)
  report("softmax/" .. shape, per_op_ms(iters, function() tp.softmax(x, 2, { out = o }) end), rw, "GB/s")
  report("log_softmax/" .. shape, per_op_ms(iters, function() tp.log_softmax(x, 2, { out = o }) end), rw, "GB/s")
  report("layer_norm/" .. shape, per_op_ms(iters, function() tp.layer_norm(x, { weight = w, bias = b, out = o }) end),
    rw, "GB/s")
  report("rms_norm/" .. shape, per_op_ms(iters, function() tp.rms_norm(x, { weight = w, out = o }) end), rw, "GB/s")
  local rd = (N * N + N) * es
  report("sum_dim2/" .. shape, per_op_ms(iters, function() x:sum(2, { out = r }) end), rd, "GB/s")
  report("sum_dim1/" .. shape, per_op_ms(iters, function() x:sum(1, { out = rc }) end), rd, "GB/s")
  report("amax_dim2/" .. shape, per_op_ms(iters, function() x:amax(2, { out = r }) end), rd, "GB/s")
  x, o = nil, nil
  collectgarbage()
  collectgarbage()

  local a, bm, c = tp.randn({ M, M }, d, { seed = 4 }), tp.randn({ M, M }, d, { seed = 5 }), tp.randn({ M, M }, d, { seed = 6 })
  local flops = 2 * M ^ 3
  local gi = (tp.backend == "cuda" and (d == "f32" and 3 or 10)) or 1
  local g = ("%s/%d^3"):format(d, M)
  report("addmm/" .. g, per_op_ms(gi, function() tp.addmm(c, a, bm, { out = c, beta = 1 }) end), flops / 1e3, "TFLOP/s")
  local at = a:t()                                   -- read as it lies, through the transpose flag
  report("addmm_at/" .. g, per_op_ms(gi, function() tp.addmm(c, at, bm, { out = c, beta = 1 }) end), flops / 1e3, "TFLOP/s")
  a, bm, c, at = nil, nil, nil, nil
  collectgarbage()
  collectgarbage()
  local q, B = math.floor(M / 4), 16
  local ba, bb = tp.randn({ B, q, q }, d, { seed = 7 }), tp.randn({ B, q, q }, d, { seed = 8 })
  local bo = tp.empty({ B, q, q }, d)
  report(("bmm/%s/%dx%d^3"):format(d, B, q), per_op_ms(gi, function() tp.bmm(ba, bb, bo) end), 2 * B * q ^ 3 / 1e3,
    "TFLOP/s")
  ba, bb, bo = nil, nil, nil
  collectgarbage()
  collectgarbage()
end

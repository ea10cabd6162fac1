-- bench_pointwise.lua: element-wise ops on 64 MiB tensors, in GB/s, on the current backend.
--
--   tpsh --backend cuda scripts/bench/bench_pointwise.lua [--mib M] [--iters I] [--dtypes f32,bf16,f16] [--filter TEXT]
--   tpsh --backend cpu  scripts/bench/bench_pointwise.lua [--ref build/libtpsh_kernels_ref.so] [--rounds R] ...
--
-- Each case times one op into a preallocated output (out=, or in place) with tp.time: the median device
-- time of I iterations (default 20 on CUDA, 3 on the CPU). GB/s counts every tensor the op reads or
-- writes once (a unary op moves two of M MiB, a binary one three; a bias row is left out), as
-- scripts/bench/torch_pointwise.py counts them for PyTorch's same ops, whose lines scripts/gpu/gpu_check.sh
-- (step "pointwise") pairs with these ("ratio pointwise ..."). On the CPU each case runs beside the plain
-- C loop of the same formula (scripts/bench/bench_kernels_ref.c, loaded through the FFI, on the tensors' own
-- memory) for the f32 and bf16 cases that have one, alternately over R rounds (default 3), as
-- bench_kernels.lua does; the ratio is the median of the rounds' tpsh / C times. Lines:
--   tpsh <case> <dtype> <ms> ms <GB/s> GB/s [C <GB/s> GB/s ratio <tpsh/C time>]
local ffi = require "ffi"
local MIB, ITERS, ROUNDS, filter = 64, tp.backend == "cuda" and 20 or 3, 3, nil
local dtypes = tp.backend == "cuda" and { "f32", "bf16", "f16" } or { "f32", "bf16" }
local ref_path = tp.backend == "cpu" and "build/libtpsh_kernels_ref.so" or nil
local i = 1
while arg and arg[i] do
  local a, v = arg[i], arg[i + 1]
  if a == "--mib" then MIB = tonumber(v)
  elseif a == "--iters" then ITERS = tonumber(v)
  elseif a == "--rounds" then ROUNDS = tonumber(v)
  elseif a == "--filter" then filter = v
  elseif a == "--ref" then ref_path = v
  elseif a == "--no-ref" then ref_path, i = nil, i - 1
  elseif a == "--dtypes" then dtypes = {}; for d in v:gmatch("[^,]+") do dtypes[#dtypes + 1] = d end
  else error("unknown argument " .. a .. " (expected --mib M, --iters I, --rounds R, --dtypes LIST, --filter TEXT, --ref LIB, --no-ref)", 0) end
  i = i + 2
end

local R, ref
if ref_path and tp.backend == "cpu" then
  ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/kernels_ref_lib.lua")
  R = ref.load(ref_path)
end
local C = ffi.C
local U = function(n) return C.tpsh_unary_op(n) end
local B = function(n) return C.tpsh_binary_op(n) end
local COLS = 4096                                       -- the bias row's length

-- { name, tensors moved, tpsh fn(x, y, o, row), C unary op or binary op id (f32/bf16 refs) }
local cases = {
  { "relu", 2, function(x, _, o) tp.relu(x, { out = o }) end, { unary = U "relu" } },
  { "relu_ (in place)", 2, function(x) x:relu_() end, { unary = U "relu", in_place = true } },
  { "gelu", 2, function(x, _, o) tp.gelu(x, { out = o }) end, { unary = U "gelu" } },
  { "gelu tanh", 2, function(x, _, o) tp.gelu(x, { approximate = "tanh", out = o }) end, { unary = U "gelu_tanh" } },
  { "silu", 2, function(x, _, o) tp.silu(x, { out = o }) end, { unary = U "silu" } },
  { "sigmoid", 2, function(x, _, o) tp.sigmoid(x, { out = o }) end, { unary = U "sigmoid" } },
  { "exp", 2, function(x, _, o) tp.exp(x, { out = o }) end, { unary = U "exp" } },
  { "x * 2.5", 2, function(x, _, o) tp.mul(x, 2.5, { out = o }) end, nil },
  { "x / 3", 2, function(x, _, o) tp.div(x, 3, { out = o }) end, { unary = U "div", p = 3 } },
  { "pow 2", 2, function(x, _, o) tp.pow(x, 2, { out = o }) end, { unary = U "pow", p = 2 } },
  { "a + b", 3, function(x, y, o) tp.add(x, y, { out = o }) end, nil },
  { "a * b", 3, function(x, y, o) tp.mul(x, y, { out = o }) end, nil },
  { "a / b", 3, function(x, y, o) tp.div(x, y, { out = o }) end, { binary = B "div" } },
  { "maximum", 3, function(x, y, o) tp.maximum(x, y, { out = o }) end, { binary = B "maximum" } },
  { "gelu_backward", 3, function(x, y, o) tp.gelu_backward(y, x, { out = o }) end, { binary = B "gelu_backward", swap = true } },
  { "add_ (in place)", 3, function(x, y) x:add_(y) end, nil },
  { "matrix + bias row", 2, function(x, _, o, row) tp.add(x, row, { out = o }) end, { row = true } },
}

local median = require("tpsh.measure").median
local function gbps(tensors, bytes, ms) return tensors * bytes / (ms * 1e-3) / 1e9 end
-- the C loop of a case for x, y, o (nil: none)
local function c_loop(c, dt, x, y, o, row, n)
  local r = c[4]
  if not R or not r or (dt ~= "f32" and dt ~= "bf16") then return nil end
  local ct = dt == "f32" and "float *" or "uint16_t *"
  local function p(t) return ffi.cast(ct, t:data_ptr()) end
  local sfx = dt == "f32" and "f32" or "bf16"
  if r.row then
    if dt ~= "f32" then return nil end
    return function() R.ref_add_row_f32(p(o), p(x), p(row), n / COLS, COLS) end
  end
  local out = r.in_place and x or o
  if r.unary then return function() R["ref_unary_" .. sfx](r.unary, p(out), p(x), n, r.p or 0) end end
  local a, b = x, y
  if r.swap then a, b = y, x end
  return function() R["ref_binary_" .. sfx](r.binary, p(o), p(a), p(b), n) end
end

print(("bench_pointwise on %s: %d MiB a tensor, %d iterations a case (median device time)%s"):format(
  tp.backend, MIB, ITERS, R and (", beside the C loop over " .. ROUNDS .. " rounds") or ""))
for _, dt in ipairs(dtypes) do
  local bytes = MIB * 2 ^ 20
  local n = bytes / tp.empty({ 1 }, dt):nbytes()
  -- values where every op is defined and nothing overflows: x in (0.5, 1.5), y in (-1, 1)
  local x = (tp.rand({ n }, "f32", { seed = 1 }) + 0.5):to(dt)
  local y = (tp.rand({ n }, "f32", { seed = 2 }) * 2 - 1):to(dt)
  local o = tp.empty({ n }, dt)
  local row = tp.rand({ COLS }, dt, { seed = 3 })
  local xm, om = x:view({ n / COLS, COLS }), o:view({ n / COLS, COLS })
  for _, c in ipairs(cases) do
    local name = c[1]
    if not filter or name:find(filter, 1, true) then
      local fn = function() c[3](x, y, o) end
      if c[4] and c[4].row then fn = function() c[3](xm, nil, om, row) end end
      local cfn = c_loop(c, dt, x, y, o, row, n)
      local ms, ratios, cms = {}, {}, {}
      for k = 1, cfn and ROUNDS or 1 do
        if cfn and k % 2 == 1 then cms[k] = ref.time(cfn) end
        ms[k] = tp.time(fn, { iters = ITERS, warmup = 1 }).median
        if cfn and k % 2 == 0 then cms[k] = ref.time(cfn) end
        if cfn then ratios[k] = ms[k] / cms[k] end
      end
      local t = median(ms)
      local line = ("tpsh %-20s %-5s %9.3f ms %9.1f GB/s"):format(name:gsub(" ", "_"), dt, t, gbps(c[2], bytes, t))
      if cfn then
        line = line .. ("   C %9.1f GB/s   ratio %6.2f"):format(gbps(c[2], bytes, median(cms)), median(ratios))
      end
      print(line)
    end
  end
  x, y, o, xm, om = nil, nil, nil, nil, nil
  collectgarbage()
end

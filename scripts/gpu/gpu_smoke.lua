-- gpu_smoke.lua: every tensor op on every dtype, printed in one canonical form per line, so that the
-- CUDA backend can be checked against the CPU backend by running this twice and diffing:
--
--   tpsh --backend cpu  scripts/gpu/gpu_smoke.lua > cpu.txt
--   tpsh --backend cuda scripts/gpu/gpu_smoke.lua > cuda.txt
--   diff cpu.txt cuda.txt          (scripts/gpu/gpu_check.sh does this)
--
-- The kernels promise the CPU's bits (cpu_kernels.h): casts with rounding, saturation and wrap-around,
-- fills, arange, rand, elementwise math, integer matmul, strided copies and cat. Where the two backends
-- legitimately differ in the last bits (f64 normals through libm vs CUDA's log/cos; float sums in a
-- different order; float matmul through OpenBLAS vs cuBLAS), the line is printed at reduced precision,
-- or checked here against a double-precision reference and printed as "ok". A line starting with
-- "FAIL" is a failure on its own, whatever the diff says.
local dtypes = { "f32", "f16", "bf16", "f64", "i32", "i64", "u8" }
local floats = { f32 = true, f16 = true, bf16 = true, f64 = true }
local failures = 0

local function flat(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flat(v[i], out) end
  else
    out[#out + 1] = v
  end
  return out
end

local function fmt(v, digits)
  -- an i64 past 2^53 is read whole, as an int64_t cdata (docs/api.md): printed whole, without its LL
  if type(v) == "cdata" then return (tostring(v):gsub("[LU]+$", "")) end
  if v ~= v then return "nan" end                 -- the sign of a NaN is not part of the contract
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if v == 0 then return (1 / v < 0) and "-0" or "0" end
  return string.format("%." .. (digits or 17) .. "g", v)
end

local function dump(name, t, digits)
  local vals = flat(t:totable())
  local parts = {}
  for i, v in ipairs(vals) do parts[i] = fmt(v, digits) end
  print(("%s %s [%s]: %s"):format(name, t.dtype, table.concat(t.shape, ","), table.concat(parts, " ")))
end

local function check(name, ok, detail)
  if ok then
    print(name .. ": ok")
  else
    failures = failures + 1
    print("FAIL " .. name .. ": " .. tostring(detail))
  end
end

local nan, inf = 0 / 0, math.huge
local specials = { 0, -0.0, 0.5, 1.5, 2.5, -1.5, -1, 1e-8, 6e-5, 65504, 65520, 70000, 300.7, -300.7, 255.5,
  2 ^ 31, -2 ^ 31 - 1, 2 ^ 53 + 2, 1e20, -1e20, 3.14159265358979, 1 / 3, nan, inf, -inf }

-- ==== casts: every pair of dtypes, through special values =========================================
local x64 = tp.from(specials, "f64")
for _, a in ipairs(dtypes) do
  local xa = x64:to(a)
  dump("cast f64->" .. a, xa)
  for _, b in ipairs(dtypes) do dump("cast f64->" .. a .. "->" .. b, xa:to(b)) end
end

-- ==== fill and arange ==============================================================================
-- integer dtypes take only the values they hold (tp.full refuses the rest: tests/tensor_spec.lua); the
-- special values reach them through the casts above
local holds = { u8 = { 0, 255 }, i32 = { -2 ^ 31, 2 ^ 31 - 1 }, i64 = { -2 ^ 63, 2 ^ 62 } }
local function fits(v, d) return not holds[d] or (v > holds[d][1] - 1 and v < holds[d][2] + 1) end
for _, d in ipairs(dtypes) do
  for _, v in ipairs { 0, -0.0, 1, 1.5, -1, 300.7, 1e-8, 70000, nan, -inf } do
    if fits(v, d) then dump("full " .. fmt(v), tp.full({ 5 }, v, d)) end
  end
  dump("arange", tp.arange(300, d))
  dump("zeros strided", tp.zeros({ 3, 4 }, d):transpose(1, 2):contiguous())
end

-- ==== random =======================================================================================
for _, d in ipairs(dtypes) do   -- floating dtypes only: rand/randn refuse integer ones
  if floats[d] then
    dump("rand seed 42", tp.rand({ 2000 }, d, { seed = 42 }))
    -- f64 normals pass through log and cos, whose last bit may differ between libm and CUDA
    dump("randn seed 7", tp.randn({ 2000 }, d, { seed = 7 }), d == "f64" and 12 or nil)
  end
end

-- ==== elementwise ==================================================================================
local ints = {
  i32 = { 2147483647, -2147483648, 7, -7, 100000, 3 },
  i64 = { 2 ^ 62, -2 ^ 62, 7, -7, 100000, 3 },
  u8 = { 200, 255, 7, 0, 100, 3 },
}
for _, d in ipairs(dtypes) do
  local a, b
  if floats[d] then
    a = (tp.rand({ 4, 250 }, "f64", { seed = 1 }) * 100):to(d)
    b = (tp.randn({ 4, 250 }, "f64", { seed = 2 }) * 10):to(d)
  else
    a = tp.from(ints[d], d)
    -- through i64: tp.from refuses values outside u8, and the cast wraps them as it always did
    b = tp.from({ 1, 1, 3, -4, 100000, 250 }, "i64"):to(d)
  end
  -- b comes from f64 normals (last bit may differ, see above): results that involve it, in f64, are
  -- compared at 12 digits; in narrower dtypes the rounding hides that bit
  local p = d == "f64" and 12 or nil
  dump("a+b", a + b, p)
  dump("a-b", a - b, p)
  dump("a*b", a:clone():mul_(b), p)
  dump("a*2.5", a * 2.5)
  dump("a*3", a * 3)
  dump("a+0.5b", a:clone():add_(b, 0.5), p)
  dump("a+1e30", a + 1e30)
  -- strided operands: a transposed view as output, the others row-major
  if a:dim() == 2 then
    local o = tp.zeros({ 250, 4 }, d)
    o:transpose(1, 2):copy_(a)
    dump("copy into transposed", o)
    local s = tp.zeros({ 250, 4 }, d):transpose(1, 2)
    s:add_(a)
    s:add_(b, -2)
    dump("add_ strided", s:contiguous(), p)
  end
end

-- ==== element-wise ops of core/pointwise.h ==========================================================
-- Exact ones (relu, abs, neg, sqrt, division, maximum, minimum, pow by 2, 3, 0.5, -1, -2: IEEE results
-- in f32/f64, rounded once to f16/bf16) must give the CPU's bits, through the dense kernel (contiguous),
-- the strided one (a transposed view, broadcast operands) and the tail of a length that is no multiple
-- of a vector. The others go through libm on the CPU and CUDA's math library on the GPU, whose last bits
-- differ: each is checked here against an f64 reference computed on the host from the operands' values
-- (and printed as "ok"), as matmul is.
do
  local pw_specials = { 0, -0.0, 0.5, 1.5, -1.5, -1, 1e-8, 6e-5, 65504, 70000, 300.7, -300.7, 1e20, -1e20,
    3.14159265358979, 1 / 3, nan, inf, -inf }
  local function pw_operands(d)
    local x = tp.from(pw_specials, "f64"):to(d)
    local a = ((tp.rand({ 4, 250 }, "f64", { seed = 11 }) - 0.5) * 20):to(d)
    local b = ((tp.randn({ 4, 250 }, "f64", { seed = 12 }) * 3)):to(d)
    return x, a, b
  end
  for _, d in ipairs(dtypes) do
    -- b's f64 normals may differ in the last bit (above): f64 results are compared at 12 digits
    local dump = function(name, t) dump(name, t, d == "f64" and 12 or nil) end
    if floats[d] then
      local x, a, b = pw_operands(d)
      local at = a:t():contiguous():t()                      -- a's values, column-major: the strided kernel
      for _, name in ipairs { "relu", "abs", "neg", "sqrt" } do
        dump(name, tp[name](x))
        dump(name .. " [4,250]", tp[name](a))
        dump(name .. " strided", tp[name](at))
      end
      for _, p_ in ipairs { 2, 3, 0.5, -1, -2 } do dump("pow " .. p_, tp.pow(a, p_)) end
      dump("x / 3", x / 3)
      dump("3 / x", 3 / x)
      -- a number on one side: the rows mul, add and rsub (the number rounded to f32 below f64)
      dump("x * 0.1", x * 0.1)
      dump("x * -0.0", x * -0.0)
      dump("x + 0.1", x + 0.1)
      dump("x - 3", x - 3)
      dump("0.1 - x", 0.1 - x)
      dump("a * 2.5 strided", at * 2.5)
      dump("a + 0.1 tail", a:view({ -1 }):narrow(1, 1, 13) + 0.1)
      dump("a / b", a / b)
      dump("a / b strided", at / b)
      dump("maximum", tp.maximum(a, b))
      dump("minimum", tp.minimum(at, b))
      dump("maximum specials", tp.maximum(x, x:narrow(1, 1, 1):expand({ #pw_specials })))
      dump("minimum specials", tp.minimum(x, tp.from({ nan }, "f64"):to(d)))
      dump("a + row", a + b:select(1, 2))
      dump("a * column", a * b:narrow(2, 7, 1))
      dump("a / row", a / b:narrow(1, 3, 1))
      -- rows of 256 (a multiple of every dtype's vector): cuda_pointwise.cu's row kernel, either side
      local w, r = a:view({ -1 }):narrow(1, 1, 768):view({ 3, 256 }), b:view({ -1 }):narrow(1, 1, 256)
      dump("w + row256", w + r)
      dump("row256 - w", r - w)
      dump("w / row256", w / r)
      dump("row256 * w [2,3,256]", r * w:view({ 1, 3, 256 }):expand({ 2, 3, 256 }):contiguous())
      local y2 = w:clone()
      y2:add_(r)
      dump("add_ row256", y2)
      dump("a - row strided", at - b:select(1, 4))
      local o = tp.zeros({ 250, 4 }, d):t()
      tp.maximum(a, b, { out = o })
      dump("maximum into a transposed out", o:contiguous())
      local y = a:clone()
      y:div_(b:select(1, 1))
      y:relu_()
      dump("div_ row, relu_", y)
    else
      local a = ints[d] and tp.from(ints[d], d)
      local b = tp.from({ 1, 1, 3, -4, 100000, 250 }, "i64"):to(d)
      dump("maximum", tp.maximum(a, b))
      dump("minimum", tp.minimum(a, b))
      dump("relu", tp.relu(a))
      dump("abs", tp.abs(a))
      dump("neg", tp.neg(a))
      dump("a / b", a / b)
      dump("a / 7", a / 7)
      dump("maximum broadcast", tp.maximum(a:view({ 6, 1 }), b:view({ 1, 6 })))
    end
  end

  -- the others, against f64 on the host
  local ffi = require "ffi"
  pcall(ffi.cdef, "double erf(double); double tanh(double);")
  local libm = ffi.C
  local SQRT1_2, BETA, KAPPA = math.sqrt(0.5), math.sqrt(2 / math.pi), 0.044715
  local function ggrad(v) return 0.5 * (1 + libm.erf(v * SQRT1_2)) + v * math.exp(-0.5 * v * v) / math.sqrt(2 * math.pi) end
  local function gtgrad(v)
    local th = libm.tanh(BETA * (v + KAPPA * v ^ 3))
    return 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * BETA * (1 + 3 * KAPPA * v * v)
  end
  local inexact = {
    { "gelu", function(t) return tp.gelu(t) end, function(v) return 0.5 * v * (1 + libm.erf(v * SQRT1_2)) end },
    { "gelu tanh", function(t) return tp.gelu(t, { approximate = "tanh" }) end,
      function(v) return 0.5 * v * (1 + libm.tanh(BETA * (v + KAPPA * v ^ 3))) end },
    { "silu", function(t) return tp.silu(t) end, function(v) return v / (1 + math.exp(-v)) end },
    { "sigmoid", function(t) return tp.sigmoid(t) end, function(v) return 1 / (1 + math.exp(-v)) end },
    { "tanh", function(t) return tp.tanh(t) end, function(v) return libm.tanh(v) end },
    { "exp", function(t) return tp.exp(t * 0.25) end, function(v) return math.exp(v * 0.25) end },
    { "log", function(t) return tp.log(tp.abs(t)) end, function(v) return math.log(math.abs(v)) end },
    { "rsqrt", function(t) return tp.rsqrt(tp.abs(t)) end, function(v) return 1 / math.sqrt(math.abs(v)) end },
    { "pow 1.5", function(t) return tp.pow(tp.abs(t), 1.5) end, function(v) return math.abs(v) ^ 1.5 end },
    { "pow -0.5", function(t) return tp.pow(tp.abs(t), -0.5) end, function(v) return math.abs(v) ^ -0.5 end },
    { "gelu_backward", function(t, g) return tp.gelu_backward(g, t) end, function(v, w) return w * ggrad(v) end },
    -- its two terms cancel where x < -3 (in f32, to 1e-5 of each: PyTorch's steps do the same), so the
    -- absolute tolerance there is 1e-5 of the gradient's size
    { "gelu_backward tanh", function(t, g) return tp.gelu_backward(g, t, { approximate = "tanh" }) end,
      function(v, w) return w * gtgrad(v) end, 1e-5 },
  }
  local ptol = { f64 = { 1e-12, 1e-14 }, f32 = { 1e-5, 1e-6 }, f16 = { 1e-3, 1e-5 }, bf16 = { 8e-3, 1e-4 } }
  for _, d in ipairs { "f32", "f16", "bf16", "f64" } do
    local _, a, b = pw_operands(d)
    a = a * 0.5                                           -- within exp's range in every dtype
    local va, vb = flat(a:to("f64"):totable()), flat(b:to("f64"):totable())
    for _, c in ipairs(inexact) do
      for _, layout in ipairs { "dense", "strided" } do
        local x = layout == "dense" and a or a:t():contiguous():t()
        local got = flat(c[2](x, b):to("f64"):totable())
        local worst, at_ = 0, nil
        for i = 1, #got do
          local w = c[3](va[i], vb[i])
          local atol = math.max(ptol[d][2], (d ~= "f64" and c[4] or 0) * math.abs(vb[i]))
          local bad = (w ~= w) ~= (got[i] ~= got[i]) or (w == w and math.abs(got[i] - w) > atol + ptol[d][1] * math.abs(w))
          if bad then worst, at_ = worst + 1, at_ or i end
        end
        check(("%s %s %s"):format(c[1], d, layout), worst == 0,
          at_ and ("%d elements off, first %d: %.17g, expected %.17g"):format(worst, at_, got[at_], c[3](va[at_], vb[at_])))
      end
    end
  end
end

-- ==== sum ==========================================================================================
for _, d in ipairs(dtypes) do
  local t = floats[d] and tp.rand({ 1000, 1000 }, d, { seed = 3 }) or tp.arange(1000000, d):view({ 1000, 1000 })
  local digits = floats[d] and (d == "f64" and 12 or 6) or nil
  dump("sum", t:sum(), digits)
  dump("sum strided", t:narrow(1, 3, 500):transpose(1, 2):sum(), digits)
  dump("sum empty", tp.empty({ 0 }, d):sum())
end
dump("sum nan", tp.from({ 1, nan, 2 }):sum())
dump("sum inf", tp.from({ 1, inf, 2 }):sum())
dump("sum inf-inf", tp.from({ 1, inf, -inf }):sum())

-- ==== views, copies and cat ========================================================================
for _, d in ipairs(dtypes) do
  local t = tp.arange(2 * 3 * 4 * 5, d):view({ 2, 3, 4, 5 })
  dump("transpose", t:transpose(2, 4):contiguous())
  dump("narrow select", t:narrow(3, 2, 2):select(1, 2):contiguous())
  dump("cat dim1", tp.cat({ t, t:narrow(1, 1, 1) }, 1))
  dump("cat dim3", tp.cat({ t:narrow(3, 1, 1), t, t:narrow(3, 4, 1) }, 3))
  dump("to f64 strided", t:transpose(1, 4):to("f64"))
end

-- ==== compare ======================================================================================
local p = tp.from({ 1, 2, 3, nan, inf, -inf, 5 })
local q = tp.from({ 1, 2.5, 3, nan, inf, inf, 5.001 })
print("allclose", tp.allclose(p, p), tp.allclose(p:narrow(1, 1, 3), q:narrow(1, 1, 3), 0, 0.6))
print("equal", tp.equal(p:narrow(1, 1, 3), p:narrow(1, 1, 3)), tp.equal(p, q))
print("max_abs_diff", fmt(p:narrow(1, 1, 3):max_abs_diff(q:narrow(1, 1, 3))), fmt(p:max_abs_diff(q)))
print("max_abs_diff inf", fmt(p:narrow(1, 5, 3):max_abs_diff(q:narrow(1, 5, 3))))

-- ==== matmul =======================================================================================
-- Integers must match the CPU exactly; floats are checked against a double-precision product here.
local function ref_matmul(a, b)
  local A, B = a:to("f64"):totable(), b:to("f64"):totable()
  local m, k, n = #A, #B, #B[1]
  local C = {}
  for i = 1, m do
    C[i] = {}
    for j = 1, n do
      local s = 0
      for p_ = 1, k do s = s + A[i][p_] * B[p_][j] end
      C[i][j] = s
    end
  end
  return C
end

local function operands(d, layout)
  local a, b
  if floats[d] then
    a, b = tp.randn({ 33, 17 }, "f64", { seed = 5 }):to(d), tp.randn({ 17, 9 }, "f64", { seed = 6 }):to(d)
  else
    -- integers in [0, 256) for u8, [-128, 128) for the others (tp.rand gives floating dtypes only)
    local shift = d == "u8" and 0 or -128
    a = (tp.rand({ 33, 17 }, "f64", { seed = 5 }) * 256 + shift):to(d)
    b = (tp.rand({ 17, 9 }, "f64", { seed = 6 }) * 256 + shift):to(d)
  end
  if layout == "transposed" then            -- column-major operands: cuBLAS reads them with op = T
    a = a:transpose(1, 2):contiguous():transpose(1, 2)
    b = b:transpose(1, 2):contiguous():transpose(1, 2)
  elseif layout == "strided" then           -- no unit stride at all: staged through a copy
    a = tp.cat({ a:view({ 33, 17, 1 }), a:view({ 33, 17, 1 }) }, 3):select(3, 2)
    b = tp.cat({ b:view({ 17, 9, 1 }), b:view({ 17, 9, 1 }) }, 3):select(3, 1)
  end
  return a, b
end

local tol = { f64 = 1e-12, f32 = 1e-5, f16 = 2e-2, bf16 = 1e-1 }
for _, d in ipairs(dtypes) do
  for _, layout in ipairs { "row-major", "transposed", "strided" } do
    local a, b = operands(d, layout)
    local c = tp.matmul(a, b)
    local out_t = tp.empty({ 9, 33 }, d):transpose(1, 2)     -- a column-major output
    tp.matmul(a, b, out_t)
    if floats[d] then
      local R = tp.from(ref_matmul(a, b), "f64")
      local err = c:to("f64"):max_abs_diff(R)
      local err_t = out_t:to("f64"):max_abs_diff(R)
      check(("matmul %s %s"):format(d, layout), err <= tol[d] * 8 and err_t <= tol[d] * 8,
        ("max |err| %g / %g"):format(err, err_t))
    else
      dump("matmul " .. layout, c)
      check(("matmul %s %s column-major out"):format(d, layout), tp.equal(c, out_t:contiguous()), "outputs differ")
    end
  end
  dump("matmul k=0", tp.matmul(tp.ones({ 3, 0 }, d), tp.ones({ 0, 2 }, d)))
end

-- ==== addmm and bmm (alpha, beta, bias rows, transposed and batched operands) ========================
do
  local C_ = require("tpsh.capi").C
  local function gemm_ref(a, b, c, alpha, beta)
    local P, Cv = ref_matmul(a, b), c and c:to("f64"):totable()
    for i = 1, #P do
      for j = 1, #P[i] do
        local cij = Cv and (type(Cv[1]) == "table" and Cv[i][j] or Cv[j]) or 0
        P[i][j] = alpha * P[i][j] + (beta ~= 0 and beta * cij or 0)
      end
    end
    return tp.from(P, "f64")
  end
  -- within the output's rounding (and f32 accumulation) of the largest value
  local rtol = { f64 = 1e-11, f32 = 2e-5, f16 = 4e-3, bf16 = 2e-2 }
  local function near(name, d, got, ref)
    local err, big = got:to("f64"):max_abs_diff(ref), ref:max_abs_diff(ref * 0)
    check(name .. " " .. d, err <= rtol[d] * (1 + big), ("max |err| %g (largest value %g)"):format(err, big))
  end
  for _, d in ipairs { "f32", "f16", "bf16", "f64" } do
    for _, layout in ipairs { "row-major", "transposed", "strided" } do
      local a, b = operands(d, layout)
      local c = tp.randn({ 33, 9 }, "f64", { seed = 8 }):to(d)
      near("addmm alpha beta " .. layout, d, tp.addmm(c, a, b, { alpha = 0.5, beta = -2 }), gemm_ref(a, b, c, 0.5, -2))
      local acc = c:clone()
      tp.addmm(acc, a, b, { out = acc })
      near("addmm into c " .. layout, d, acc, gemm_ref(a, b, c, 1, 1))
      local ct = tp.empty({ 9, 33 }, d):t()                  -- accumulating into a column-major c
      ct:copy_(c)
      ct:addmm_(a, b, { beta = 3 })
      near("addmm_ column-major c " .. layout, d, ct, gemm_ref(a, b, c, 1, 3))
      local bias = tp.randn({ 9 }, "f64", { seed = 10 }):to(d)
      near("addmm bias row " .. layout, d, tp.addmm(bias, a, b), gemm_ref(a, b, bias, 1, 1))
      local junk = tp.full({ 33, 9 }, 0 / 0, d)
      near("addmm beta 0 " .. layout, d, tp.addmm(junk, a, b, { beta = 0, out = junk }), gemm_ref(a, b, nil, 1, 0))
    end
    local a3 = tp.randn({ 4, 33, 17 }, "f64", { seed = 11 }):to(d)
    local b3 = tp.randn({ 4, 9, 17 }, "f64", { seed = 12 }):to(d):transpose(2, 3)   -- column-major matrices
    local before = tonumber(C_.tpsh_matmul_staged())
    local p3 = tp.bmm(a3, b3)
    tp.synchronize()
    if d == "f32" or d == "f64" then        -- (the CPU backend stages f16 and bf16 through f32)
      check("bmm " .. d .. " transposed operand read in place", tonumber(C_.tpsh_matmul_staged()) == before,
        "staged " .. (tonumber(C_.tpsh_matmul_staged()) - before))
    end
    for i = 1, 4 do near("bmm batch " .. i, d, p3:select(1, i), gemm_ref(a3:select(1, i), b3:select(1, i), nil, 1, 0)) end
  end
  dump("bmm i32", tp.bmm((tp.rand({ 3, 5, 4 }, "f64", { seed = 13 }) * 200 - 100):to("i32"),
    (tp.rand({ 3, 4, 6 }, "f64", { seed = 14 }) * 200 - 100):to("i32")))
  dump("addmm k=0", tp.addmm(tp.ones({ 3, 2 }), tp.ones({ 3, 0 }), tp.ones({ 0, 2 }), { beta = 2.5 }))
end

-- ==== reductions along a dim, softmax, layer_norm, rms_norm ========================================
-- Rows of every length the CUDA kernels split on: a warp per row up to 1024 elements, a block above,
-- the row kept in shared memory up to 48 KiB a block and read twice beyond, 16-byte loads where the
-- rows allow them (1000 and 3000 elements) and not (33); and strided rows (a reduction along dim 1,
-- transposed inputs). amax, amin and the indices of max and min involve no arithmetic: dumped whole;
-- the rest is checked against f64 references computed here from the same inputs.
do
  local rtol = { f64 = 1e-10, f32 = 3e-5, f16 = 4e-3, bf16 = 3e-2 }
  local function rows_of(v, dim)             -- a 2-D table's rows along dim
    if dim == 2 then return v end
    local r = {}
    for j = 1, #v[1] do
      r[j] = {}
      for i = 1, #v do r[j][i] = v[i][j] end
    end
    return r
  end
  -- tables of rows (numbers allowed for one-value rows); scale: per row, the magnitude an error is
  -- relative to where it is not the result's own (a sum's rounding is bounded by the sum of |x|, which
  -- cancellation can make far larger than the result)
  local function worst(got, ref, scale)
    local w = 0
    for i = 1, #ref do
      local gi, ri = got[i], ref[i]
      if type(ri) ~= "table" then gi, ri = { gi }, { ri } end
      for j = 1, #ri do
        local g, r = gi[j], ri[j]
        local e = (g ~= g or r ~= r) and ((g ~= g) == (r ~= r) and 0 or math.huge) or
          (g == r and 0 or math.abs(g - r) / (1 + (scale and scale[i] or math.abs(r))))
        if e > w then w = e end
      end
    end
    return w
  end
  local function sum(r) local s = 0 for _, x in ipairs(r) do s = s + x end return s end
  local function abs_sum(r) local s = 0 for _, x in ipairs(r) do s = s + math.abs(x) end return s end
  local function maxv(r) local m = r[1] for _, x in ipairs(r) do if x ~= x then return x end if x > m then m = x end end return m end
  local refs = {
    sum = sum,
    mean = function(r) return sum(r) / #r end,
    softmax = function(r, log)
      local m, s, y = maxv(r), 0, {}
      for _, x in ipairs(r) do s = s + math.exp(x - m) end
      for j, x in ipairs(r) do y[j] = log and x - m - math.log(s) or math.exp(x - m) / s end
      return y
    end,
    norm = function(r, rms, eps, w, b)
      local n, y, mean, var = #r, {}, 0, 0
      if not rms then mean = sum(r) / n end
      for _, x in ipairs(r) do var = var + (x - mean) ^ 2 end
      local k = 1 / math.sqrt(var / n + eps)
      for j, x in ipairs(r) do y[j] = (x - mean) * k * (w and w[j] or 1) + (b and b[j] or 0) end
      return y
    end,
  }
  local function map(rows, fn, ...)
    local out = {}
    for i, r in ipairs(rows) do out[i] = fn(r, ...) end
    return out
  end
  local function within(name, d, got, ref, scale)
    local e = worst(got, ref, scale)
    check(name .. " " .. d, e <= rtol[d], ("max relative error %g"):format(e))
  end
  for _, d in ipairs { "f32", "f16", "bf16", "f64" } do
    for _, shape in ipairs { { 37, 1000 }, { 7, 33 }, { 5, 3000 }, { 3, 20000 }, { 300, 2 } } do
      local x = (tp.randn(shape, "f64", { seed = 15 }) * 3):to(d)
      local xt = x:t():contiguous():t()            -- the same values, column-major
      local v = x:to("f64"):totable()
      local tag = ("%dx%d"):format(shape[1], shape[2])
      for _, layout in ipairs { { "", x }, { " column-major", xt } } do
        local t = layout[2]
        for _, dim in ipairs { 2, 1 } do
          local rows = rows_of(v, dim)
          local at = (" %s dim %d%s"):format(tag, dim, layout[1])
          local mags = map(rows, abs_sum)
          within("sum" .. at, d, t:sum(dim):to("f64"):totable(), map(rows, refs.sum), mags)
          within("mean" .. at, d, t:mean(dim, { keepdim = true }):to("f64"):view({ -1 }):totable(), map(rows, refs.mean),
            map(mags, function(m) return m / #rows[1] end))
          -- (the inputs are f64 normals: f64 at 12 digits)
          dump("amax" .. at, t:amax(dim), d == "f64" and 12 or nil)
          dump("amin" .. at, t:amin(dim), d == "f64" and 12 or nil)
          local _, imax = t:max(dim)
          local _, imin = t:min(dim, { keepdim = true })
          dump("max indices" .. at, imax)
          dump("min indices" .. at, imin)
          within("softmax" .. at, d, rows_of(tp.softmax(t, dim):to("f64"):totable(), dim), map(rows, refs.softmax))
          within("log_softmax" .. at, d, rows_of(t:log_softmax(dim):to("f64"):totable(), dim), map(rows, refs.softmax, true))
        end
        local n = shape[2]
        local w = tp.randn({ n }, "f64", { seed = 16 }):to(d)
        local b = tp.randn({ n }, "f64", { seed = 17 }):to(d)
        local wv, bv = w:to("f64"):totable(), b:to("f64"):totable()
        local at = " " .. tag .. layout[1]
        within("layer_norm" .. at, d, tp.layer_norm(t, { weight = w, bias = b }):to("f64"):totable(),
          map(v, refs.norm, false, 1e-5, wv, bv))
        within("layer_norm plain" .. at, d, tp.layer_norm(t):to("f64"):totable(), map(v, refs.norm, false, 1e-5))
        within("rms_norm" .. at, d, tp.rms_norm(t, { weight = w, eps = 1e-6 }):to("f64"):totable(),
          map(v, refs.norm, true, 1e-6, wv))
      end
    end
    -- NaN and infinities: NaN wins max and min at its first index; a row of -inf has a NaN softmax
    local nan, inf = 0 / 0, math.huge
    local y = tp.from({ { 1, 3, 3, -inf, 2 }, { 2, nan, 5, nan, 1 }, { -inf, -inf, -inf, -inf, -inf }, { inf, 1, 2, 3, 4 } }, d)
    local yv = y:to("f64"):totable()
    dump("amax specials", y:amax(2))
    dump("amin specials", y:amin(2))
    dump("max indices specials", select(2, y:max(2)))
    dump("min indices specials", select(2, y:min(2)))
    within("softmax specials", d, tp.softmax(y, 2):to("f64"):totable(), map(yv, refs.softmax))
    within("log_softmax specials", d, tp.log_softmax(y, 2):to("f64"):totable(), map(yv, refs.softmax, true))
    within("sum specials", d, y:sum(2):to("f64"):totable(), map(yv, refs.sum))
    dump("sum over an empty dim", tp.empty({ 3, 0 }, d):sum(2))
    dump("mean over an empty dim", tp.empty({ 3, 0 }, d):mean(2))
  end
end

-- ==== transfers larger than the staging buffers (16 MiB) ===========================================
do
  local n = 5000000                                 -- 40 MB of f64: three staging chunks
  local t = tp.arange(n, "f64")
  local v = t:totable()
  local bad = 0
  for i = 1, n do if v[i] ~= i - 1 then bad = bad + 1 end end
  check("to_host 40 MB", bad == 0 and #v == n, bad .. " wrong values")
  local back = tp.from(v, "f64")
  check("from_host 40 MB", tp.equal(back, t), "round trip differs")
  local strided = t:view({ 1000, 5000 }):transpose(1, 2)
  check("to_host strided", strided:select(1, 5000):totable()[1000] == 999 * 5000 + 4999, "wrong element")
end

-- ==== spin =========================================================================================
do
  local a, b = tp.event { timing = true }, tp.event { timing = true }
  a:record(); tp.spin(50); b:record(); b:synchronize()
  local ms = a:elapsed(b)
  check("spin 50 ms", ms > 45 and ms < 80, ("%.2f ms"):format(ms))
end

tp.synchronize()
print(("smoke: %d failure(s) on %s"):format(failures, tp.backend))
if failures > 0 then os.exit(1) end

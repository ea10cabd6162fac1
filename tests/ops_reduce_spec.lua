-- Reductions along a dim, softmax, norms, addmm and bmm (src/core/ops_reduce.c) on every float dtype,
-- against f64 references computed here in Lua from the very inputs (rounded to the dtype first), so
-- that a tolerance covers only the op's own arithmetic and its output's rounding. Small tensors.
local C = require("tpsh.capi").C

local FLOATS = { "f32", "f64", "f16", "bf16" }
-- relative tolerances: the output's rounding (half an ulp) and f32 arithmetic on GPUs, with room
local RTOL = { f64 = 1e-12, f32 = 1e-5, f16 = 2e-3, bf16 = 1.6e-2 }
local nan, inf = 0 / 0, math.huge

-- t's values (through f64) as a flat row-major list, and its shape
local function flat(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for i = 1, #v do walk(v[i]) end else out[#out + 1] = v end
  end
  walk(t:to("f64"):totable())
  return out, t.shape
end

-- For each position of shape without dim d (row-major), fn(row) over the elements along d; the results
-- (one value, or a list of one per element of the row when fn returns a table) as a tensor of `shape`
-- without d (keepdim: with size 1) or, for rows, of the input's shape.
local function along(t, d, fn)
  local v, shape = flat(t)
  local nd = #shape
  if d < 0 then d = nd + d + 1 end
  local stride = {}
  local s = 1
  for i = nd, 1, -1 do stride[i] = s; s = s * shape[i] end
  local outer = {}
  for i = 1, nd do if i ~= d then outer[#outer + 1] = i end end
  local results, rows_out = {}, {}
  local idx = {}
  for i = 1, nd do idx[i] = 0 end
  local total = 1
  for _, i in ipairs(outer) do total = total * shape[i] end
  for _ = 1, total do
    local base = 0
    for _, i in ipairs(outer) do base = base + idx[i] * stride[i] end
    local row = {}
    for j = 0, shape[d] - 1 do row[j + 1] = v[base + j * stride[d] + 1] end
    local r = fn(row)
    if type(r) == "table" then
      for j = 0, shape[d] - 1 do rows_out[base + j * stride[d] + 1] = r[j + 1] end
    else
      results[#results + 1] = r
    end
    for k = #outer, 1, -1 do                   -- the next position, row-major
      local i = outer[k]
      idx[i] = idx[i] + 1
      if idx[i] < shape[i] then break end
      idx[i] = 0
    end
  end
  local reduced = {}
  for _, i in ipairs(outer) do reduced[#reduced + 1] = shape[i] end
  if #rows_out > 0 then return tp.from(rows_out, "f64"):view(shape) end
  return tp.from(results, "f64"):view(reduced)
end

local function sum(r) local s = 0 for _, x in ipairs(r) do s = s + x end return s end
local function first_extreme(r, is_min)
  local best, at = r[1], 1
  for j, x in ipairs(r) do
    if x ~= x then return x, j end
    if (is_min and x < best) or (not is_min and x > best) then best, at = x, j end
  end
  return best, at
end
local function softmax_ref(log)
  return function(r)
    local m = first_extreme(r)
    local s = 0
    for _, x in ipairs(r) do s = s + math.exp(x - m) end
    local y = {}
    for j, x in ipairs(r) do y[j] = log and x - m - math.log(s) or math.exp(x - m) / s end
    return y
  end
end
local function norm_ref(rms, eps, w, b)
  return function(r)
    local n, y = #r, {}
    if rms then
      local ss = 0
      for _, x in ipairs(r) do ss = ss + x * x end
      local k = 1 / math.sqrt(ss / n + eps)
      for j, x in ipairs(r) do y[j] = x * k * (w and w[j] or 1) end
      return y
    end
    local mean = sum(r) / n
    local var = 0
    for _, x in ipairs(r) do var = var + (x - mean) ^ 2 end
    local k = 1 / math.sqrt(var / n + eps)
    for j, x in ipairs(r) do y[j] = (x - mean) * k * (w and w[j] or 1) + (b and b[j] or 0) end
    return y
  end
end

local function close(got, ref, dt, what, atol)
  assert.are.same(ref.shape, got.shape, what)
  assert.tensor_close(got:to("f64"), ref, RTOL[dt], atol or RTOL[dt], what)
end

local function errs(fn, needle)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error with " .. needle)
  assert.truthy(tostring(err):find(needle, 1, true), "error was: " .. tostring(err))
end

-- a 3 x 4 x 5 input of dtype dt, and a non-contiguous view of the same shape (transposed, narrowed)
local function inputs(dt, seed)
  local x = tp.randn({ 3, 4, 5 }, dt, { seed = seed })
  local big = tp.randn({ 7, 4, 3 }, dt, { seed = seed + 1 })
  return x, big:narrow(1, 2, 5):transpose(1, 3)          -- [3, 4, 5], strides (1, 3, 12)
end

describe("reductions along a dim", function()
  it("sum, mean, amax and amin every dim of contiguous and strided inputs in every float dtype", function()
    for _, dt in ipairs(FLOATS) do
      local x, xs = inputs(dt, 10)
      assert.is_false(xs:is_contiguous())
      for _, t in ipairs { x, xs } do
        for _, d in ipairs { 1, 2, 3, -1, -3 } do
          local what = ("%s dim %d"):format(dt, d)
          close(t:sum(d), along(t, d, sum), dt, "sum " .. what, 1e-2)
          close(t:mean(d), along(t, d, function(r) return sum(r) / #r end), dt, "mean " .. what, 1e-2)
          close(t:amax(d), along(t, d, function(r) return (first_extreme(r)) end), dt, "amax " .. what)
          close(t:amin(d), along(t, d, function(r) return (first_extreme(r, true)) end), dt, "amin " .. what)
        end
      end
      -- keepdim keeps the dim with size 1; the output is the input's dtype
      local k = x:sum(2, { keepdim = true })
      assert.are.same({ 3, 1, 5 }, k.shape)
      assert.are.equal(dt, k.dtype)
      assert.are.same({ 1, 4, 1 }, x:amax(-1, { keepdim = true }):narrow(2, 1, 4):narrow(1, 1, 1).shape)
    end
  end)

  it("max and min give values and 1-based i64 indices of the first extreme; NaN wins", function()
    for _, dt in ipairs(FLOATS) do
      local x, xs = inputs(dt, 20)
      for _, t in ipairs { x, xs } do
        for _, d in ipairs { 1, 2, -1 } do
          local v, i = t:max(d)
          assert.are.equal("i64", i.dtype)
          close(v, along(t, d, function(r) return (first_extreme(r)) end), dt, "max values")
          assert.are.same(along(t, d, function(r) return select(2, first_extreme(r)) end):totable(), i:to("f64"):totable())
          local vm, im = t:min(d, { keepdim = true })
          assert.are.same(t:amin(d, { keepdim = true }):totable(), vm:totable())
          assert.are.same(vm.shape, im.shape)
          assert.are.equal(3, #im.shape)
        end
      end
      local y = tp.from({ { 1, 3, 3, -inf }, { 2, nan, 5, nan }, { -inf, -inf, -inf, -inf } }, dt)
      local v, i = y:max(2)
      assert.are.same({ 2, 2, 1 }, i:totable())           -- the first of equal maxima; the first NaN
      local vt = v:totable()
      assert.are.equal(3, vt[1]); assert.is_true(vt[2] ~= vt[2]); assert.are.equal(-inf, vt[3])
      local _, j = y:min(2)
      assert.are.same({ 4, 2, 1 }, j:totable())
      assert.is_true(y:amax(2):totable()[2] ~= y:amax(2):totable()[2])
      assert.is_true(y:sum(2):totable()[2] ~= y:sum(2):totable()[2])
    end
  end)

  it("writes into out =, reduces every element without a dim, and keeps tensor:sum()", function()
    local x = tp.from({ { 1, 2, 3 }, { 4, 5, 6 } }, "f64")
    local o = tp.full({ 2 }, 7, "f64")
    assert.are.equal(o, x:sum(2, { out = o }))
    assert.are.same({ 6, 15 }, o:totable())
    local ok = tp.empty({ 1, 3 }, "f64")
    x:mean(1, { keepdim = true, out = ok })
    assert.are.same({ { 2.5, 3.5, 4.5 } }, ok:totable())
    local vals, idx = tp.empty({ 3 }, "f64"), tp.empty({ 3 }, "i64")
    local rv, ri = x:max(1, { out = { vals, idx } })
    assert.are.equal(vals, rv); assert.are.equal(idx, ri)
    assert.are.same({ 2, 2, 2 }, idx:totable())
    -- no dim: every element, a 0-d result (of the input's shape with keepdim), strided inputs too
    assert.are.equal(3.5, x:mean():item())
    assert.are.equal(6, x:t():amax():item())
    assert.are.equal(6, x:max():item())
    assert.are.equal(1, x:min():item())
    assert.are.same({ 1, 1 }, x:amin(nil, { keepdim = true }).shape)
    assert.are.equal(21, x:sum():item())
    assert.are.equal(21, tp.arange(7, "i32"):sum():item())            -- integers keep the whole sum
    -- a dim of size 0: sums are 0, means NaN, a max has no identity
    local e = tp.empty({ 2, 0 }, "f32")
    assert.are.same({ 0, 0 }, e:sum(2):totable())
    assert.is_true(e:mean(2):totable()[1] ~= e:mean(2):totable()[1])
    errs(function() e:amax(2) end, "tensor:amax: the max over dimension 2 of shape [2, 0] takes no elements")
  end)

  it("refuses bad dims, dtypes, outputs and options with the shapes in the message", function()
    local x = tp.zeros({ 2, 3 })
    errs(function() x:sum(3) end, "tensor:sum: dimension 3 out of range for a tensor of 2 dimensions")
    errs(function() x:mean(1.5) end, "tensor:mean: expected an integer dimension")
    errs(function() x:sum(1, { out = tp.empty({ 2 }) }) end, "tensor:sum: out: expected shape [3], got [2]")
    errs(function() x:sum(1, { keepdim = true, out = tp.empty({ 3 }) }) end, "out: expected shape [1, 3], got [3]")
    errs(function() x:amax(1, { out = tp.empty({ 3 }, "f64") }) end, "out: expected dtype f32, got f64")
    errs(function() x:max(1, { out = { tp.empty({ 3 }), tp.empty({ 3 }, "i32") } }) end,
      "tensor:max: indices: expected dtype i64, got i32")
    errs(function() x:max(1, { out = tp.empty({ 3 }) }) end, "opts.out must be a table {values, indices}")
    errs(function() x:sum(1, { keep_dim = true }) end, 'tensor:sum: unknown option "keep_dim"')
    errs(function() x:sum(1, { keepdim = 1 }) end, "opts.keepdim must be true or false")
    errs(function() tp.arange(6, "i32"):view({ 2, 3 }):sum(1) end,
      "tensor:sum: tensor: expected a float dtype (f32, f64, f16 or bf16), got i32")
    errs(function() x:mean(nil, { out = tp.empty({ 2 }) }) end, "opts.out must hold one element")
  end)
end)

describe("softmax and log_softmax", function()
  it("normalise along every dim of contiguous and strided inputs in every float dtype", function()
    for _, dt in ipairs(FLOATS) do
      local x, xs = inputs(dt, 30)
      for _, t in ipairs { x, xs } do
        for _, d in ipairs { 1, 2, -1 } do
          close(tp.softmax(t, d), along(t, d, softmax_ref(false)), dt, "softmax " .. dt, 1e-3)
          close(t:log_softmax(d), along(t, d, softmax_ref(true)), dt, "log_softmax " .. dt, 1e-2)
        end
      end
    end
  end)

  it("subtracts the max (large inputs stay finite), writes out = (x itself too) and propagates NaN", function()
    local x = tp.from({ { 1000, 1001, 1002 }, { -1000, -1001, -1002 } }, "f32")
    local ref = along(x, 2, softmax_ref(false))
    close(x:softmax(2), ref, "f32", "large")
    local o = tp.empty({ 2, 3 })
    assert.are.equal(o, tp.softmax(x, 2, { out = o }))
    tp.log_softmax(x, 2, { out = x })                         -- in place
    close(x, along(tp.from({ { 1000, 1001, 1002 }, { -1000, -1001, -1002 } }, "f32"), 2, softmax_ref(true)), "f32", "in place")
    local y = tp.from({ { 1, nan, 2 }, { 1, 2, 3 } }):softmax(2):totable()
    assert.is_true(y[1][1] ~= y[1][1] and y[1][3] ~= y[1][3])
    assert.is_true(y[2][3] == y[2][3])
  end)

  it("refuses a missing dim, a wrong out and an integer tensor", function()
    local x = tp.zeros({ 2, 3 })
    errs(function() tp.softmax(x) end, "tp.softmax: expected the dimension")
    errs(function() tp.softmax(x, 2, { out = tp.empty({ 3, 2 }) }) end, "tp.softmax: out: expected shape [2, 3], got [3, 2]")
    errs(function() x:log_softmax(2, { out = tp.empty({ 2, 3 }, "bf16") }) end, "out: expected dtype f32, got bf16")
    errs(function() tp.softmax(tp.zeros({ 3 }, "i64"), 1) end, "expected a float dtype")
    errs(function() tp.softmax(x, 2, { dim = 1 }) end, 'unknown option "dim"')
  end)
end)

describe("layer_norm and rms_norm", function()
  it("normalise the last dim with and without weight and bias, contiguous and strided, every float dtype", function()
    for _, dt in ipairs(FLOATS) do
      local x, xs = inputs(dt, 40)
      local w, b = tp.randn({ 5 }, dt, { seed = 41 }), tp.randn({ 5 }, dt, { seed = 42 })
      local wv, bv = flat(w), flat(b)
      for _, t in ipairs { x, xs } do
        close(tp.layer_norm(t), along(t, -1, norm_ref(false, 1e-5)), dt, "layer_norm " .. dt, 1e-2)
        close(tp.layer_norm(t, { weight = w, bias = b, eps = 1e-3 }), along(t, -1, norm_ref(false, 1e-3, wv, bv)), dt,
          "layer_norm affine " .. dt, 2e-2)
        close(tp.layer_norm(t, { bias = b }), along(t, -1, norm_ref(false, 1e-5, nil, bv)), dt, "layer_norm bias", 2e-2)
        local eps = ({ f32 = 2 ^ -23, f64 = 2 ^ -52, f16 = 2 ^ -10, bf16 = 2 ^ -7 })[dt]
        close(tp.rms_norm(t), along(t, -1, norm_ref(true, eps)), dt, "rms_norm " .. dt, 1e-2)
        close(tp.rms_norm(t, { weight = w, eps = 0.1 }), along(t, -1, norm_ref(true, 0.1, wv)), dt, "rms_norm w " .. dt, 2e-2)
      end
      local o = tp.empty({ 3, 4, 5 }, dt)
      assert.are.equal(o, tp.rms_norm(x, { out = o }))
    end
  end)

  it("refuses parameters of the wrong shape or dtype, naming them with their shapes", function()
    local x = tp.zeros({ 4, 8 })
    errs(function() tp.layer_norm(x, { weight = tp.ones({ 4 }) }) end, "tp.layer_norm: weight: expected shape [8], got [4]")
    errs(function() tp.layer_norm(x, { bias = tp.ones({ 1, 8 }) }) end, "bias: expected shape [8], got [1, 8]")
    errs(function() tp.rms_norm(x, { weight = tp.ones({ 8 }, "f64") }) end, "tp.rms_norm: weight: expected dtype f32, got f64")
    errs(function() tp.rms_norm(x, { bias = tp.ones({ 8 }) }) end, 'tp.rms_norm: unknown option "bias"')
    errs(function() tp.layer_norm(x, { eps = -1 }) end, "eps must be a finite number >= 0")
    errs(function() tp.layer_norm(x, { out = tp.empty({ 8, 4 }) }) end, "out: expected shape [4, 8], got [8, 4]")
    errs(function() tp.layer_norm(x, { weight = 1 }) end, "opts.weight must be a tensor, got number")
  end)
end)

-- the f64 product alpha * a @ b + beta * c, c broadcast as a row when 1-D
local function gemm_ref(a, b, c, alpha, beta)
  local A, B = a:to("f64"):totable(), b:to("f64"):totable()
  local Cv = c and c:to("f64"):totable()
  local R = {}
  for i = 1, #A do
    R[i] = {}
    for j = 1, #B[1] do
      local s = 0
      for p = 1, #B do s = s + A[i][p] * B[p][j] end
      local cij = Cv and (type(Cv[1]) == "table" and Cv[i][j] or Cv[j]) or 0
      R[i][j] = alpha * s + (beta ~= 0 and beta * cij or 0)
    end
  end
  return tp.from(R, "f64")
end

local function staged() return tonumber(C.tpsh_matmul_staged()) end

describe("addmm, bmm and transposed operands", function()
  it("computes beta * c + alpha * a @ b into a new tensor, or accumulates into c with out = c", function()
    for _, dt in ipairs(FLOATS) do
      local a, b = tp.randn({ 6, 5 }, dt, { seed = 50 }), tp.randn({ 5, 7 }, dt, { seed = 51 })
      local c = tp.randn({ 6, 7 }, dt, { seed = 52 })
      local c0 = c:clone()
      local r = tp.addmm(c, a, b, { alpha = 0.5, beta = 2 })
      close(r, gemm_ref(a, b, c, 0.5, 2), dt, "addmm " .. dt, 5e-2)
      assert.are.same(c0:totable(), c:totable())                -- c is not written without out = c
      assert.are.equal(c, tp.addmm(c, a, b, { out = c }))        -- beta = 1: c += a @ b
      close(c, gemm_ref(a, b, c0, 1, 1), dt, "addmm into c " .. dt, 5e-2)
      c:addmm_(a, b, { beta = -1 })
      close(c, gemm_ref(a, b, gemm_ref(a, b, c0, 1, 1), 1, -1), dt, "addmm_ " .. dt, 1e-1)
      -- a 1-D c is a bias row; beta = 0 reads nothing of c, NaN included
      local bias = tp.randn({ 7 }, dt, { seed = 53 })
      close(tp.addmm(bias, a, b), gemm_ref(a, b, bias, 1, 1), dt, "bias row " .. dt, 5e-2)
      local junk = tp.full({ 6, 7 }, nan, dt)
      close(tp.addmm(junk, a, b, { beta = 0, alpha = 3 }), gemm_ref(a, b, nil, 3, 0), dt, "beta 0 " .. dt, 5e-2)
      close(tp.addmm(junk, a, b, { beta = 0, out = junk }), gemm_ref(a, b, nil, 1, 0), dt, "beta 0 into c " .. dt, 5e-2)
      close(c:addmm(a, b, { beta = 0 }), gemm_ref(a, b, nil, 1, 0), dt, "method " .. dt, 5e-2)
      -- k = 0: beta * c
      local e = tp.addmm(c0, tp.empty({ 6, 0 }, dt), tp.empty({ 0, 7 }, dt), { beta = 2 })
      close(e, gemm_ref(tp.zeros({ 6, 1 }, dt), tp.zeros({ 1, 7 }, dt), c0, 1, 2), dt, "k = 0 " .. dt)
    end
  end)

  it("reads transposed f32/f64 operands in place (no copy), and copies only strided ones", function()
    for _, dt in ipairs { "f32", "f64" } do
      local at = tp.randn({ 5, 6 }, dt, { seed = 60 }):t()       -- [6, 5], column-major
      local bt = tp.randn({ 7, 5 }, dt, { seed = 61 }):t()       -- [5, 7]
      local out = tp.empty({ 7, 6 }, dt):t()                     -- a column-major output
      local before = staged()
      tp.matmul(at, bt, out)
      local c = tp.randn({ 6, 7 }, dt, { seed = 62 })
      tp.addmm(c, at, bt, { out = c, alpha = 2 })
      local rows = tp.randn({ 4, 6, 5 }, dt, { seed = 63 }):narrow(1, 2, 2)     -- batch stride 30
      local bat = tp.randn({ 2, 7, 5 }, dt, { seed = 64 }):transpose(2, 3)       -- [2, 5, 7] column-major
      local prod = tp.bmm(rows, bat)
      tp.synchronize()
      assert.are.equal(before, staged(), "a transposed view was copied")
      close(out, gemm_ref(at, bt, nil, 1, 0), dt, "transposed matmul")
      assert.is_false(out:is_contiguous())
      close(prod:select(1, 2), gemm_ref(rows:select(1, 2), bat:select(1, 2), nil, 1, 0), dt, "bmm transposed")
      -- no unit stride at all (every other element of each row): staged through a copy, and still right
      local m = tp.randn({ 5, 6 }, dt, { seed = 65 }):view({ 5, 6, 1 })
      local s2 = tp.cat({ m, m }, 3):select(3, 2)                -- [5, 6], strides (12, 2)
      local rhs = tp.randn({ 6, 4 }, dt, { seed = 66 })
      before = staged()
      local r = tp.matmul(s2, rhs)
      tp.synchronize()
      assert.are.equal(before + 1, staged())
      close(r, gemm_ref(s2, rhs, nil, 1, 0), dt, "strided operand")
    end
  end)

  it("multiplies batches with bmm in every dtype, integers included", function()
    for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i32" } do
      local a = (tp.randn({ 3, 4, 5 }, "f64", { seed = 70 }) * 4):to(dt)
      local b = (tp.randn({ 3, 5, 2 }, "f64", { seed = 71 }) * 4):to(dt)
      local r = a:bmm(b)
      assert.are.same({ 3, 4, 2 }, r.shape)
      for i = 1, 3 do
        if dt == "i32" then
          assert.are.same(tp.matmul(a:select(1, i), b:select(1, i)):totable(), r:select(1, i):totable())
        else
          close(r:select(1, i), gemm_ref(a:select(1, i), b:select(1, i), nil, 1, 0), dt, "bmm " .. dt, 1e-1)
        end
      end
      local o = tp.empty({ 3, 4, 2 }, dt)
      assert.are.equal(o, tp.bmm(a, b, o))
    end
  end)

  it("refuses mismatched shapes and dtypes with both shapes in the message", function()
    local a, b = tp.zeros({ 4, 3 }), tp.zeros({ 3, 5 })
    errs(function() tp.addmm(tp.zeros({ 4, 4 }), a, b) end, "tp.addmm: c: shape [4, 4] does not broadcast to the product's [4, 5]")
    errs(function() tp.addmm(tp.zeros({ 4, 5 }), a, a) end, "tp.addmm: inner dimensions differ: [4, 3] @ [4, 3]")
    errs(function() tp.addmm(tp.zeros({ 4, 5 }, "f64"), a, b) end, "tp.addmm: c: expected dtype f32, got f64")
    errs(function() tp.addmm(tp.zeros({ 4, 5 }), a, b, { out = tp.empty({ 5, 4 }) }) end, "out: expected shape [4, 5], got [5, 4]")
    errs(function() tp.addmm(tp.zeros({ 3, 3 }, "i32"), tp.zeros({ 3, 3 }, "i32"), tp.zeros({ 3, 3 }, "i32")) end,
      "tp.addmm: a: expected a float dtype")
    errs(function() tp.addmm(a, a, b, { gamma = 1 }) end, 'unknown option "gamma"')
    errs(function() tp.addmm(tp.zeros({ 4, 5 }), a, b, { alpha = "2" }) end, "opts.alpha must be a number")
    errs(function() tp.zeros({ 4, 3 }):addmm_(a, b) end, "tensor:addmm_: out: expected shape [4, 5], got [4, 3]")
    errs(function() tp.bmm(tp.zeros({ 2, 4, 3 }), tp.zeros({ 3, 3, 5 })) end,
      "tp.bmm: batch or inner dimensions differ: [2, 4, 3] @ [3, 3, 5]")
    errs(function() tp.bmm(a, b) end, "tp.bmm: expected 3-D operands, got 2-D and 2-D")
    local x = tp.zeros({ 2, 4, 3 })
    errs(function() tp.bmm(x, tp.zeros({ 2, 3, 4 }), x:narrow(3, 1, 3):narrow(2, 1, 4)) end,
      "out: expected shape [2, 4, 4], got [2, 4, 3]")
  end)
end)

describe("the stream sanitizer sees what these ops write", function()
  local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
  local cm = dofile(here .. "support/check_mode.lua")
  local at = cm.at_of("ops_reduce_spec%.lua")
  before_each(cm.on)
  after_each(cm.off)

  it("max's indices and addmm's accumulated output are writes", function()
    local side = tp.stream { name = "side" }
    local x = tp.randn({ 4, 8 })
    local v, i = tp.empty({ 4 }), tp.empty({ 4 }, "i64")
    side:wait_stream(tp.current_stream())
    tp.spin(20)
    local w = cm.next_line()
    x:max(2, { out = { v, i } })
    local bad = cm.next_line()
    tp.with_stream(side, function() return i + 1 end)
    cm.expect_report(at, "read%-after%-write", bad, w)
    tp.check.clear()
    local c, a = tp.zeros({ 4, 4 }), tp.ones({ 4, 8 })
    side:wait_stream(tp.current_stream())
    local r = cm.next_line()
    tp.with_stream(side, function() tp.spin(20); return c * 2 end)
    local bad2 = cm.next_line()
    tp.addmm(c, a, a:t(), { out = c })
    cm.expect_report(at, "write%-after%-read", bad2, r)
    tp.check.clear()
    tp.synchronize()
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() return tp.softmax(x, 2) end)
    tp.current_stream():wait_stream(side)
    tp.layer_norm(x, { out = x })
    cm.expect_none()
  end)
end)

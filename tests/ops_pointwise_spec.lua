-- Element-wise ops (lua/tpsh/ops_pointwise.lua, src/core/ops_pointwise.c, the kernels of
-- src/core/pointwise.h): every op in every float dtype against an f64 reference computed here (libm
-- through the FFI, or Lua's math) from the operands as the dtype holds them; broadcasting, out=, in-place
-- forms, transposed operands, integers, and the messages of bad calls. Small tensors: the spec runs at
-- 1 to 4 ranks.
local ffi = require "ffi"
ffi.cdef [[ double erf(double); double tanh(double); ]]
local libm = ffi.C

local floats = { "f32", "f64", "f16", "bf16" }
-- relative and absolute tolerance: f16/bf16/f32 compute in f32 and round once to the dtype
local tol = { f64 = { 1e-12, 1e-14 }, f32 = { 1e-5, 1e-6 }, f16 = { 1e-3, 1e-5 }, bf16 = { 8e-3, 1e-4 } }
local nan, inf = 0 / 0, math.huge

local function flat(v, out)
  out = out or {}
  if type(v) ~= "table" then out[#out + 1] = v return out end
  for i = 1, #v do flat(v[i], out) end
  return out
end
local function values(t) return flat(t:to("f64"):totable()) end

local function close(got, want, dt, atol)
  if want ~= want then return got ~= got end
  if want == inf or want == -inf then return got == want end
  local r, a = tol[dt][1], math.max(tol[dt][2], atol or 0)
  return math.abs(got - want) <= a + r * math.abs(want)
end

-- got (a tensor) element by element against ref applied to the operands' values; atol_of(x, y): a
-- larger absolute tolerance for an element, or nil
local function check_against(got, dt, ref, xs, ys, what, atol_of)
  local g = values(got)
  assert.are.equal(#xs, #g, what)
  for i = 1, #g do
    local w = ref(xs[i], ys and ys[i])
    if not close(g[i], w, dt, atol_of and atol_of(xs[i], ys and ys[i])) then
      error(("%s %s: element %d of %s%s is %.17g, expected %.17g"):format(what, dt, i, tostring(xs[i]),
        ys and (", " .. tostring(ys[i])) or "", g[i], w), 2)
    end
  end
end

local SQRT1_2, BETA, KAPPA = math.sqrt(0.5), math.sqrt(2 / math.pi), 0.044715
local function gelu(x) return 0.5 * x * (1 + libm.erf(x * SQRT1_2)) end
local function gelu_tanh(x) return 0.5 * x * (1 + libm.tanh(BETA * (x + KAPPA * x ^ 3))) end
local function gelu_grad(x) return 0.5 * (1 + libm.erf(x * SQRT1_2)) + x * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) end
local function gelu_tanh_grad(x)
  local th = libm.tanh(BETA * (x + KAPPA * x ^ 3))
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * BETA * (1 + 3 * KAPPA * x * x)
end

local anywhere = { -6, -3, -2.5, -1, -0.5, -0.1, -0.0, 0, 1e-3, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, nan }
local positive = { -1, 0, 1e-3, 0.1, 0.25, 0.5, 1, 2, 3, 7.5, 100, inf, nan }
local unary = {
  relu = { function(x) return x ~= x and x or x <= 0 and 0 or x end, anywhere },
  gelu = { gelu, anywhere },
  silu = { function(x) return x / (1 + math.exp(-x)) end, anywhere },
  sigmoid = { function(x) return 1 / (1 + math.exp(-x)) end, anywhere },
  tanh = { function(x) return libm.tanh(x) end, anywhere },
  exp = { math.exp, anywhere },
  log = { function(x) return x < 0 and nan or math.log(x) end, positive },
  sqrt = { function(x) return x < 0 and nan or math.sqrt(x) end, positive },
  rsqrt = { function(x) return x < 0 and nan or 1 / math.sqrt(x) end, positive },
  abs = { math.abs, anywhere },
  neg = { function(x) return -x end, anywhere },
}

describe("element-wise ops", function()
  describe("unary", function()
    it("computes every op in every float dtype, from a function, a method, out= and in place", function()
      for name, case in pairs(unary) do
        local ref, domain = case[1], case[2]
        for _, dt in ipairs(floats) do
          local x = tp.from(domain, dt)
          local xs = values(x)
          check_against(tp[name](x), dt, ref, xs, nil, "tp." .. name)
          check_against(x[name](x), dt, ref, xs, nil, "x:" .. name .. "()")
          local o = tp.empty({ #domain }, dt)
          assert.are.equal(o, tp[name](x, { out = o }))
          check_against(o, dt, ref, xs, nil, "tp." .. name .. " out=")
          local y = x:clone()
          assert.are.equal(y, y[name .. "_"](y))
          check_against(y, dt, ref, xs, nil, "x:" .. name .. "_()")
        end
      end
    end)

    it("computes gelu in its erf and tanh forms, and gelu_backward in both", function()
      local g = { 1, -2, 0.5, 3, 1, 1, -1, 2, 0.25, 1, 1, -0.5, 1, 2, 1, 1, 3 }
      for _, dt in ipairs(floats) do
        local x = tp.from({ anywhere }, dt):narrow(2, 1, 17)       -- no NaN: g * NaN is NaN either way
        local grad = tp.from({ g }, dt)
        local xs, gs = values(x), values(grad)
        check_against(tp.gelu(x, { approximate = "none" }), dt, gelu, xs, nil, "gelu none")
        check_against(tp.gelu(x, { approximate = "tanh" }), dt, gelu_tanh, xs, nil, "gelu tanh")
        check_against(x:gelu({ approximate = "tanh" }), dt, gelu_tanh, xs, nil, "x:gelu tanh")
        check_against(x:clone():gelu_({ approximate = "tanh" }), dt, gelu_tanh, xs, nil, "x:gelu_ tanh")
        check_against(tp.gelu_backward(grad, x), dt, function(a, b) return b * gelu_grad(a) end, xs, gs, "gelu_backward")
        -- the tanh form's two terms cancel below x = -3, in f32 to 1e-5 of the gradient (PyTorch's steps too)
        check_against(tp.gelu_backward(grad, x, { approximate = "tanh" }), dt,
          function(a, b) return b * gelu_tanh_grad(a) end, xs, gs, "gelu_backward tanh",
          dt ~= "f64" and function(_, b) return 1e-5 * math.abs(b) end or nil)
      end
    end)

    it("reads transposed and narrowed operands and writes a transposed output", function()
      for _, dt in ipairs(floats) do
        local base = tp.from({ { -2, -1, 0.5, 3 }, { 1, 2, -0.25, 4 }, { 0, -3, 5, 0.125 } }, dt)
        local x = base:t()                                          -- [4, 3], strides {1, 4}
        local xs = values(x)
        check_against(tp.gelu(x), dt, gelu, xs, nil, "gelu of x:t()")
        check_against(tp.exp(base:narrow(2, 2, 2)), dt, math.exp, values(base:narrow(2, 2, 2)), nil, "exp narrowed")
        local o = tp.empty({ 3, 4 }, dt):t()
        tp.silu(x, { out = o })
        check_against(o, dt, function(v) return v / (1 + math.exp(-v)) end, xs, nil, "silu into a transposed out")
      end
    end)

    it("raises to a number, the exact exponents included", function()
      local xs = { 0.5, 1, 2, 3, 10, 0.1, 4 }
      for _, dt in ipairs(floats) do
        local x = tp.from(xs, dt)
        local v = values(x)
        for _, p in ipairs { 2, 3, 0.5, -0.5, -1, -2, 1.5, 0, 1 } do
          check_against(tp.pow(x, p), dt, function(a) return a ^ p end, v, nil, "pow " .. p)
        end
        check_against(x ^ 2, dt, function(a) return a * a end, v, nil, "x ^ 2")
        check_against(x:pow(3), dt, function(a) return a ^ 3 end, v, nil, "x:pow(3)")
        check_against(x:clone():pow_(0.5), dt, math.sqrt, v, nil, "x:pow_(0.5)")
      end
    end)

    it("takes integers in relu, abs and neg (wrapping as integer arithmetic does), not in the others", function()
      assert.are.same({ 0, 0, 3, 127 }, tp.relu(tp.from({ -5, 0, 3, 127 }, "i32")):totable())
      assert.are.same({ 5, 0, 3 }, tp.abs(tp.from({ -5, 0, 3 }, "i64")):totable())
      assert.are.same({ 251, 0, 253 }, tp.neg(tp.from({ 5, 0, 3 }, "u8")):totable())
      assert.are.same({ -2147483648 }, tp.abs(tp.from({ -2147483648 }, "i32")):totable())   -- wraps
      local ok, err = pcall(tp.exp, tp.arange(3, "i32"))
      assert.is_false(ok)
      assert.truthy(err:find("tp.exp: expected a floating dtype (f32, f16, bf16 or f64), got i32", 1, true), err)
    end)
  end)

  describe("binary", function()
    it("divides, takes maximum and minimum in every float dtype, NaN propagating", function()
      local as = { 1, -2, 3, nan, 0, -0.0, 7, 1, 5, -1 }
      local bs = { 2, 3, nan, 1, -0.0, 0, -7, 3, 0, 4 }
      for _, dt in ipairs(floats) do
        local a, b = tp.from(as, dt), tp.from(bs, dt)
        local va, vb = values(a), values(b)
        check_against(a / b, dt, function(x, y) return x / y end, va, vb, "a / b")
        check_against(tp.div(a, b), dt, function(x, y) return x / y end, va, vb, "tp.div")
        check_against(tp.maximum(a, b), dt, function(x, y) return (x ~= x or y ~= y) and nan or math.max(x, y) end,
          va, vb, "maximum")
        check_against(a:minimum(b), dt, function(x, y) return (x ~= x or y ~= y) and nan or math.min(x, y) end,
          va, vb, "minimum")
        check_against(a / 4, dt, function(x) return x / 4 end, va, nil, "a / 4")
        check_against(2 / b, dt, function(_, y) return 2 / y end, va, vb, "2 / b")
        check_against(tp.div(3, b), dt, function(_, y) return 3 / y end, va, vb, "tp.div(3, b)")
        check_against(a:clone():div_(b), dt, function(x, y) return x / y end, va, vb, "a:div_(b)")
        check_against(a:clone():div_(0.5), dt, function(x) return x / 0.5 end, va, nil, "a:div_(0.5)")
      end
    end)

    it("takes maximum and minimum of integers, and divides integers into f32 (PyTorch's true division)", function()
      local a, b = tp.from({ 3, -7, 100, 0 }, "i32"), tp.from({ 5, -9, 2, 0 }, "i32")
      assert.are.same({ 5, -7, 100, 0 }, tp.maximum(a, b):totable())
      assert.are.same({ 3, -9, 2, 0 }, tp.minimum(a, b):totable())
      assert.are.same({ 200, 9 }, tp.maximum(tp.from({ 200, 3 }, "u8"), tp.from({ 7, 9 }, "u8")):totable())
      local q = a / b
      assert.are.equal("f32", q.dtype)
      check_against(q, "f32", function(x, y) return x / y end, { 3, -7, 100, 0 }, { 5, -9, 2, 0 }, "i32 / i32")
      assert.are.same({ 1.5, -3.5, 50, 0 }, (a / 2):totable())
      assert.are.equal("f32", (2 / tp.arange(3, "i64")).dtype)
      local ok, err = pcall(function() return a:div_(b) end)
      assert.is_false(ok)
      assert.truthy(err:find("tensor:div_: output: expected dtype f32 (integers divide into f32), got i32", 1, true), err)
    end)

    it("subtracts and adds with alpha, into out, with numbers on either side", function()
      local a, b = tp.from({ { 1, 2, 3 }, { 4, 5, 6 } }), tp.from({ 10, 20, 30 })
      local o = tp.empty({ 2, 3 })
      assert.are.equal(o, tp.add(a, b, { alpha = 2, out = o }))
      assert.are.same({ { 21, 42, 63 }, { 24, 45, 66 } }, o:totable())
      assert.are.same({ { -9, -18, -27 }, { -6, -15, -24 } }, tp.sub(a, b):totable())
      assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, tp.sub(a, b, { alpha = 0 }):totable())
      assert.are.same({ { 10, 40, 90 }, { 40, 100, 180 } }, a:mul(b):totable())
      assert.are.same({ { 9, 8, 7 }, { 6, 5, 4 } }, tp.sub(10, a):totable())
      assert.are.same({ { 3, 4, 5 }, { 6, 7, 8 } }, tp.add(a, 2):totable())
      tp.mul(a, 2, { out = o })
      assert.are.same({ { 2, 4, 6 }, { 8, 10, 12 } }, o:totable())
      tp.div(b, a, { out = o })
      assert.are.same({ { 10, 10, 10 }, { 2.5, 4, 5 } }, o:totable())
      local x = a:clone()
      x:sub_(b)
      x:sub_(1, 2)
      assert.are.same({ { -11, -20, -29 }, { -8, -17, -26 } }, x:totable())
    end)
  end)

  describe("broadcasting", function()
    it("adds a bias row to a matrix, and broadcasts every binary op as PyTorch does", function()
      local m = tp.from({ { 1, 2, 3 }, { 4, 5, 6 }, { 7, 8, 9 }, { 10, 11, 12 } })
      local bias = tp.from({ 100, 200, 300 })
      assert.are.same({ { 101, 202, 303 }, { 104, 205, 306 }, { 107, 208, 309 }, { 110, 211, 312 } }, (m + bias):totable())
      assert.are.same({ { 101, 202, 303 }, { 104, 205, 306 }, { 107, 208, 309 }, { 110, 211, 312 } }, (bias + m):totable())
      local col = tp.from({ { 1 }, { 2 }, { 3 }, { 4 } })                   -- [4, 1] against [1, 3]
      local row = tp.from({ { 10, 20, 30 } })
      assert.are.same({ 4, 3 }, (col * row).shape)
      assert.are.same({ { 10, 20, 30 }, { 20, 40, 60 }, { 30, 60, 90 }, { 40, 80, 120 } }, (col * row):totable())
      assert.are.same({ { -9, -19, -29 }, { -8, -18, -28 }, { -7, -17, -27 }, { -6, -16, -26 } }, (col - row):totable())
      assert.are.same({ { 10, 20, 30 }, { 10, 20, 30 }, { 10, 20, 30 }, { 10, 20, 30 } }, tp.maximum(col, row):totable())
      check_against(col:narrow(1, 1, 2) / row, "f32", function(x, y) return x / y end, { 1, 1, 1, 2, 2, 2 },
        { 10, 20, 30, 10, 20, 30 }, "[2, 1] / [1, 3]")
      -- new leading dims, a 0-d operand, an empty dimension
      assert.are.same({ 2, 4, 3 }, (tp.ones({ 2, 1, 3 }) + tp.ones({ 4, 1 })).shape)
      assert.are.same({ { 2, 3 } }, (tp.from({ { 1, 2 } }) + tp.ones({ 1 }):view({})):totable())
      assert.are.same({ 0, 3 }, (tp.ones({ 0, 1 }) + tp.ones({ 3 })).shape)
      -- gelu_backward's operands broadcast too
      assert.are.same({ 2, 3 }, tp.gelu_backward(tp.ones({ 3 }), tp.zeros({ 2, 3 })).shape)
      -- transposed operands with a broadcast one
      local t = m:t()                                                       -- [3, 4]
      assert.are.same({ { 2, 5, 8, 11 }, { 4, 7, 10, 13 }, { 6, 9, 12, 15 } },
        (t + tp.from({ { 1 }, { 2 }, { 3 } })):totable())
    end)

    it("broadcasts in every float dtype and for integers", function()
      for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i32", "i64", "u8" } do
        local m = tp.arange(6, dt):view({ 2, 3 })
        local r = tp.from({ 1, 2, 3 }, dt)
        assert.are.same({ { 1, 3, 5 }, { 4, 6, 8 } }, (m + r):totable(), dt)
        assert.are.same({ { 0, 2, 6 }, { 3, 8, 15 } }, (m * r):totable(), dt)
        assert.are.same({ { 1, 2, 3 }, { 3, 4, 5 } }, tp.maximum(m, r):totable(), dt)
      end
    end)

    it("broadcasts the second operand of an in-place op, never the tensor written", function()
      local m = tp.zeros({ 2, 3 })
      m:add_(tp.from({ 1, 2, 3 }))
      m:mul_(tp.from({ { 2 }, { 3 } }))
      m:sub_(tp.from({ 1 }))
      m:div_(tp.from({ 1, 2, 4 }))
      assert.are.same({ { 1, 1.5, 1.25 }, { 2, 2.5, 2 } }, m:totable())
      local ok, err = pcall(function() return tp.zeros({ 3 }):add_(tp.ones({ 2, 3 })) end)
      assert.is_false(ok)
      assert.truthy(err:find("tensor:add_: output with shape [3] does not match the broadcast shape [2, 3] (of [3] and [2, 3])",
        1, true), err)
    end)

    it("shows both shapes when they do not broadcast, and the expected output", function()
      local function fails(pattern, fn)
        local ok, err = pcall(fn)
        assert.is_false(ok)
        assert.truthy(tostring(err):find(pattern, 1, true), "message was: " .. tostring(err))
        assert.truthy(tostring(err):find("ops_pointwise_spec.lua:%d+"), "no location in: " .. tostring(err))
      end
      local a, b = tp.ones({ 4, 3 }), tp.ones({ 4 })
      fails("tp.add: shapes [4, 3] and [4] do not broadcast (dimension 1 from the end: 3 against 4)",
        function() return tp.add(a, b) end)
      fails("tensor +: shapes [4, 3] and [4] do not broadcast", function() return a + b end)
      fails("tp.maximum: shapes [4, 3] and [4] do not broadcast", function() return tp.maximum(a, b) end)
      fails("tensor /: shapes [2, 3] and [3, 2] do not broadcast", function() return tp.ones({ 2, 3 }) / tp.ones({ 3, 2 }) end)
      fails("tp.mul: output with shape [3] does not match the broadcast shape [4, 3] (of [4, 3] and [3])",
        function() return tp.mul(a, tp.ones({ 3 }), { out = tp.empty({ 3 }) }) end)
      fails("tp.relu: output: expected shape [4, 3], got [3, 4]", function() return tp.relu(a, { out = tp.empty({ 3, 4 }) }) end)
      fails("tp.gelu: output: expected dtype f32, got f64", function() return tp.gelu(a, { out = tp.empty({ 4, 3 }, "f64") }) end)
      fails("tp.add: second operand: expected dtype f32, got f16", function() return tp.add(a, tp.ones({ 3 }, "f16")) end)
      fails("tp.add: opts.out must be a tensor, got number", function() return tp.add(a, a, { out = 3 }) end)
      fails('tp.add: unknown option "alhpa" (expected alpha, out)', function() return tp.add(a, a, { alhpa = 2 }) end)
      fails('tp.gelu: opts.approximate must be "none" or "tanh", got "erf"', function() return tp.gelu(a, { approximate = "erf" }) end)
      fails('tensor:gelu_: unknown option "out"', function() return a:gelu_({ out = a }) end)
      fails("tp.pow: expected a number as the exponent (pow by a number), got", function() return tp.pow(a, a) end)
      fails("tensor ^: expected a tensor raised to a number", function() return 2 ^ a end)
      fails("tp.maximum: expected a tensor as argument 2, got number", function() return tp.maximum(a, 1) end)
      fails("tensor:relu: expected a tensor as self", function() return a.relu() end)
    end)

    it("refuses an output that overlaps an operand without being the same view, a broadcast one too", function()
      local x = tp.arange(12):view({ 3, 4 })
      local ok, err = pcall(function() return x:add_(x:select(1, 2)) end)
      assert.is_false(ok)
      assert.truthy(err:find("tensor:add_: second operand overlaps the output in memory without being the same view", 1, true), err)
      ok, err = pcall(function() return tp.exp(x, { out = x:t():contiguous():t() }) end)
      assert.is_true(ok, err)                                   -- another storage: fine
      local flat_x = x:view({ 12 })
      ok, err = pcall(function() return tp.relu(flat_x:narrow(1, 1, 6), { out = flat_x:narrow(1, 2, 6) }) end)
      assert.is_false(ok)
      assert.truthy(err:find("tp.relu: operand overlaps the output", 1, true), err)
      -- the same view, broadcast or not, is in place
      local row = tp.from({ { 1, 2, 3 } })
      row:add_(row:view({ 3 }))
      assert.are.same({ { 2, 4, 6 } }, row:totable())
      assert.are.same({ 0, 1, 2, 3 }, x:select(1, 1):totable())  -- nothing was written by the refused calls
    end)
  end)

  describe("t:expand", function()
    it("views size-1 dimensions repeated, with stride 0, and new dimensions in front", function()
      local r = tp.from({ { 1, 2, 3 } })
      local e = r:expand({ 4, -1 })
      assert.are.same({ 4, 3 }, e.shape)
      assert.are.same({ 0, 1 }, e:stride())
      assert.are.equal(r:storage_id(), e:storage_id())
      assert.are.same({ { 1, 2, 3 }, { 1, 2, 3 }, { 1, 2, 3 }, { 1, 2, 3 } }, e:totable())
      assert.are.same({ 2, 4, 3 }, r:expand({ 2, 4, 3 }).shape)
      assert.are.same({ { 2, 4, 6 }, { 2, 4, 6 }, { 2, 4, 6 }, { 2, 4, 6 } }, (e + e):totable())
      assert.are.same({ { 1, 2, 3 }, { 1, 2, 3 } }, e:narrow(1, 1, 2):contiguous():totable())
    end)

    it("refuses a size other than 1 changed, and writes into an expanded view", function()
      local r = tp.ones({ 2, 3 })
      local ok, err = pcall(function() return r:expand({ 2, 5 }) end)
      assert.is_false(ok)
      assert.truthy(err:find("tensor:expand: cannot expand shape [2, 3] to [2, 5]: dimension 2 has a size other than 1", 1, true), err)
      ok, err = pcall(function() return r:expand({ 3 }) end)
      assert.is_false(ok)
      assert.truthy(err:find("cannot expand a tensor of shape [2, 3] to 1 dimensions", 1, true), err)
      ok, err = pcall(function() return r:expand({ -1, 2, 3 }) end)
      assert.is_false(ok)
      assert.truthy(err:find("dimension 1 is new and needs a size >= 0", 1, true), err)
      local e = tp.ones({ 1, 3 }):expand({ 4, 3 })
      for _, f in ipairs {
        function() return e:add_(1) end, function() return e:relu_() end, function() return e:fill_(2) end,
        function() return e:copy_(tp.zeros({ 4, 3 })) end, function() return tp.exp(r, { out = e:narrow(1, 1, 2) }) end,
      } do
        ok, err = pcall(f)
        assert.is_false(ok)
        assert.truthy(err:find("an expanded view (stride 0 along dimension 1) cannot be written", 1, true), err)
      end
    end)
  end)
end)

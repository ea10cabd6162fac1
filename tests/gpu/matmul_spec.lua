-- cuBLAS matmul on the GPU against double-precision references. CUDA only (skipped on the CPU).
if tp.backend ~= "cuda" then
  describe("cuda matmul", function() pending("needs --backend cuda") end)
  return
end

-- the f64 product of row i of a and column j of b, computed with tpsh's own f64 kernels (not cuBLAS)
local function dot64(a64, b64, i, j)
  return (a64:select(1, i) * b64:select(2, j):contiguous()):sum():item()
end

describe("cuda matmul", function()
  it("computes a bf16 8192x8192 product within bf16 tolerance of an f64 reference", function()
    local n = 8192
    local a = tp.randn({ n, n }, "bf16", { seed = 11 })
    local b = tp.randn({ n, n }, "bf16", { seed = 12 })
    local c = tp.matmul(a, b)
    local t0, t1 = tp.event { timing = true }, tp.event { timing = true }
    t0:record()
    for _ = 1, 5 do tp.matmul(a, b, c) end
    t1:record()
    t1:synchronize()
    local ms = t0:elapsed(t1) / 5
    print(("    bf16 %d^3: %.3f ms, %.0f TFLOP/s"):format(n, ms, 2 * n ^ 3 / ms / 1e9))
    local a64, b64 = a:to("f64"), b:to("f64")
    local worst = 0
    for s = 1, 64 do
      local i, j = (s * 7919) % n + 1, (s * 104729) % n + 1
      local ref = dot64(a64, b64, i, j)
      local got = c:select(1, i):narrow(1, j, 1):to("f64"):totable()[1]
      -- bf16 output: half an ulp is 2^-9 relative; f32 accumulation over 8192 terms adds little
      local err = math.abs(got - ref)
      worst = math.max(worst, err / (math.abs(ref) + 1))
      assert.is_true(err <= math.abs(ref) / 128 + 0.5, ("c[%d][%d] = %g, f64 reference %g"):format(i, j, got, ref))
    end
    print(("    worst relative error over 64 samples: %.2e"):format(worst))
  end)

  it("keeps f32 exact to f32 rounding unless TF32 is allowed", function()
    local a = tp.randn({ 512, 768 }, "f32", { seed = 3 })
    local b = tp.randn({ 768, 256 }, "f32", { seed = 4 })
    local c = tp.matmul(a, b):to("f64")
    local ref = tp.matmul(a:to("f64"), b:to("f64"))
    -- TF32 would give errors near 1e-2 here; full f32 stays near 1e-5
    assert.is_true(c:max_abs_diff(ref) < 1e-3, "max |err| " .. c:max_abs_diff(ref))
  end)

  it("accepts transposed and strided operands and outputs", function()
    for _, d in ipairs { "f32", "f16", "bf16", "f64", "i32" } do
      local a = (tp.rand({ 300, 200 }, "f64", { seed = 1 }) * 4):to(d)
      local b = (tp.rand({ 200, 100 }, "f64", { seed = 2 }) * 4):to(d)
      local want = tp.matmul(a:to("f64"), b:to("f64"))
      local at = a:transpose(1, 2):contiguous():transpose(1, 2)
      local bs = tp.cat({ b:view({ 200, 100, 1 }), b:view({ 200, 100, 1 }) }, 3):select(3, 2)
      local out = tp.empty({ 100, 300 }, d):transpose(1, 2)
      tp.matmul(at, bs, out)
      local rtol = ({ f16 = 1e-2, bf16 = 3e-2 })[d] or 1e-5
      assert.tensor_close(out:to("f64"), want, rtol, rtol)
    end
  end)
end)

-- bench_kernels.lua: CPU kernels against plain C over the same bytes, in one process.
--
--   mpiexec -n 1 build/tpsh --backend cpu scripts/bench/bench_kernels.lua [--ref build/libtpsh_kernels_ref.so]
--                                                          [--rounds R] [--filter TEXT] [--n ELEMENTS]
--
-- Each case pairs a tpsh op (timed with tp.time: the stream's device time, median of 3 iterations) with
-- a C loop from scripts/bench/bench_kernels_ref.c (loaded through the FFI, compiled -O2, run on the host
-- thread on the tensors' own memory, median of 3 calls). The two alternate R rounds (default 5), the
-- order swapped every round, and each line prints both medians and the median of the per-round ratios
-- tpsh / C: on a shared machine only ratios taken in the same round mean anything. Outputs are
-- preallocated, so that the first touch of fresh memory (slow on a VM) is not timed. Figures:
-- docs/perf.md, "CPU: kernels against plain C".
local ffi = require "ffi"
local ref_path, ROUNDS, filter, N = "build/libtpsh_kernels_ref.so", 5, nil, 4 * 1024 * 1024
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--ref" then ref_path = arg[i + 1]; i = i + 1
  elseif a == "--rounds" then ROUNDS = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--filter" then filter = arg[i + 1]; i = i + 1
  elseif a == "--n" then N = tonumber(arg[i + 1]); i = i + 1
  else error("unknown argument " .. a .. " (expected --ref LIB, --rounds R, --filter TEXT, --n N)", 0) end
  i = i + 1
end
if tp.backend ~= "cpu" then error("bench_kernels compares the CPU backend with C on the host", 0) end
local ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/kernels_ref_lib.lua")
local R = ref.load(ref_path)

local function p(t, ct) return ffi.cast(ct or "void *", t:data_ptr()) end
tp.manual_seed(1)
local f32, f32b, o32 = tp.randn({ N }), tp.randn({ N }), tp.empty({ N })
local o64 = tp.empty({ N }, "f64")
local f16, f16b, o16 = f32:to("f16"), f32b:to("f16"), tp.empty({ N }, "f16")
local bf, bfb, obf = f32:to("bf16"), f32b:to("bf16"), tp.empty({ N }, "bf16")
local i32, i32b, oi32 = (f32 * 100):to("i32"), (f32b * 100):to("i32"), tp.empty({ N }, "i32")
local i64, u8 = i32:to("i64"), i32:to("u8")
local F, I, U = "float *", "int32_t *", "uint16_t *"
local rows = N % 2048 == 0 and 2048 or 1      -- a square 2048 x 2048 at the default N
local f32t = f32:view({ rows, N / rows }):t()

-- { name, tpsh fn, C fn }; the C side does the same work on the same bytes (the casts' reference for an
-- integer or u8 source is the i32 -> f32 loop, which reads at least as many bytes)
local cases = {
  { "copy f32 -> f32 (memcpy)", function() o32:copy_(f32) end, function() R.ref_memcpy(p(o32), p(f32), N * 4) end },
  { "cast f32 -> f64", function() o64:copy_(f32) end, function() R.ref_f32_to_f64(p(o64, "double *"), p(f32, F), N) end },
  { "cast f32 -> bf16", function() obf:copy_(f32) end, function() R.ref_f32_to_bf16(p(obf, U), p(f32, F), N) end },
  { "cast bf16 -> f32", function() o32:copy_(bf) end, function() R.ref_bf16_to_f32(p(o32, F), p(bf, U), N) end },
  { "cast f32 -> f16", function() o16:copy_(f32) end, function() R.ref_f32_to_f16(p(o16, U), p(f32, F), N) end },
  { "cast f16 -> f32", function() o32:copy_(f16) end, function() R.ref_f16_to_f32(p(o32, F), p(f16, U), N) end },
  { "cast f32 -> i32", function() oi32:copy_(f32) end, function() R.ref_f32_to_i32(p(oi32, I), p(f32, F), N) end },
  { "cast i32 -> f32", function() o32:copy_(i32) end, function() R.ref_i32_to_f32(p(o32, F), p(i32, I), N) end },
  { "cast i64 -> f32", function() o32:copy_(i64) end, function() R.ref_i32_to_f32(p(o32, F), p(i32, I), N) end },
  { "cast u8 -> f32", function() o32:copy_(u8) end, function() R.ref_i32_to_f32(p(o32, F), p(i32, I), N) end },
  { "a + b f32 (add_)", function() o32:copy_(f32); o32:add_(f32b) end,
    function() R.ref_memcpy(p(o32), p(f32), N * 4); R.ref_add_f32(p(o32, F), p(o32, F), p(f32b, F), N) end },
  { "a + b bf16 (add_)", function() obf:copy_(bf); obf:add_(bfb) end,
    function() R.ref_memcpy(p(obf), p(bf), N * 2); R.ref_add_bf16(p(obf, U), p(obf, U), p(bfb, U), N) end },
  { "a + b f16 (add_)", function() o16:copy_(f16); o16:add_(f16b) end,
    function() R.ref_memcpy(p(o16), p(f16), N * 2); R.ref_add_f16(p(o16, U), p(o16, U), p(f16b, U), N) end },
  { "a + b i32 (add_)", function() oi32:copy_(i32); oi32:add_(i32b) end,
    function() R.ref_memcpy(p(oi32), p(i32), N * 4); R.ref_add_i32(p(oi32, I), p(oi32, I), p(i32b, I), N) end },
  -- the output allocated by the op: fresh memory, first touched by the kernel (docs/perf.md,
  -- "Allocation"); the C loop writes a preallocated output
  { "a + b f32 (allocates the output)", function() local _ = f32 + f32b end,
    function() R.ref_add_f32(p(o32, F), p(f32, F), p(f32b, F), N) end },
  { "sum f32", function() f32:sum() end, function() R.ref_sum_f32(p(f32, F), N) end },
  { "sum bf16 (Neumaier, in order)", function() bf:sum() end, function() R.ref_sum_neumaier_bf16(p(bf, U), N) end },
  { "sum f16 (Neumaier, in order)", function() f16:sum() end, function() R.ref_sum_neumaier_f16(p(f16, U), N) end },
  { "sum i32", function() i32:sum() end, function() R.ref_sum_i32(p(i32, I), N) end },
  -- a transposed view of the same bytes: the sum walks memory in stride order (core/tensor.c's
  -- tpsh_tensor_memory_order), so its reference is the contiguous sum's loop
  { "sum f32 transposed, x:t()", function() f32t:sum() end, function() R.ref_sum_f32(p(f32, F), N) end },
}

local median = require("tpsh.measure").median
local c_time = ref.time
local function tp_time(fn) return tp.time(fn, { iters = 3, warmup = 1 }).median end

print(("bench_kernels: %d elements a tensor, %d rounds; ms are medians over rounds, ratio the median of "
  .. "per-round tpsh / C"):format(N, ROUNDS))
for _, c in ipairs(cases) do
  if not filter or c[1]:find(filter, 1, true) then
    local a, b, r = {}, {}, {}
    for k = 1, ROUNDS do
      if k % 2 == 1 then b[k] = c_time(c[3]) end
      a[k] = tp_time(c[2])
      if k % 2 == 0 then b[k] = c_time(c[3]) end
      r[k] = a[k] / b[k]
    end
    print(("%-32s tpsh %8.3f ms   C %8.3f ms   ratio %6.2f"):format(c[1], median(a), median(b), median(r)))
  end
end

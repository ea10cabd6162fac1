-- kernels_ref_lib.lua: for the scripts that time tpsh's CPU kernels beside plain C loops in one process
-- (bench_kernels.lua, bench_pointwise.lua): the declarations of libtpsh_kernels_ref.so
-- (scripts/bench/bench_kernels_ref.c, built -O2 beside tpsh), its loader, and the timing of a C call.
--   local ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/kernels_ref_lib.lua")
--   ref.load(path)   the library; an error naming path when it does not load
--   ref.time(fn)     the median ms of 3 calls of fn on the host, after one untimed
local ffi = require "ffi"

ffi.cdef [[
void ref_memcpy(void *dst, const void *src, int64_t bytes);
void ref_f32_to_f64(double *o, const float *a, int64_t n);
void ref_f32_to_i32(int32_t *o, const float *a, int64_t n);
void ref_i32_to_f32(float *o, const int32_t *a, int64_t n);
void ref_f32_to_bf16(uint16_t *o, const float *a, int64_t n);
void ref_bf16_to_f32(float *o, const uint16_t *a, int64_t n);
void ref_f32_to_f16(uint16_t *o, const float *a, int64_t n);
void ref_f16_to_f32(float *o, const uint16_t *a, int64_t n);
void ref_add_f32(float *o, const float *a, const float *b, int64_t n);
void ref_add_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n);
void ref_add_f16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n);
void ref_add_i32(int32_t *o, const int32_t *a, const int32_t *b, int64_t n);
double ref_sum_f32(const float *a, int64_t n);
double ref_sum_neumaier_bf16(const uint16_t *a, int64_t n);
double ref_sum_neumaier_f16(const uint16_t *a, int64_t n);
int64_t ref_sum_i32(const int32_t *a, int64_t n);
void ref_unary_f32(int op, float *o, const float *a, int64_t n, float p);
void ref_binary_f32(int op, float *o, const float *a, const float *b, int64_t n);
void ref_unary_bf16(int op, uint16_t *o, const uint16_t *a, int64_t n, float p);
void ref_binary_bf16(int op, uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n);
void ref_add_row_f32(float *o, const float *a, const float *row, int64_t rows, int64_t cols);
]]

local M = {}

function M.load(path)
  local ok, lib = pcall(ffi.load, path)
  if not ok then error("--ref: cannot load " .. path .. " (build it: ninja -C build tpsh_kernels_ref): " .. tostring(lib), 0) end
  return lib
end

local median = require("tpsh.measure").median
function M.time(fn)
  fn()
  local ts = {}
  for k = 1, 3 do
    local t0 = tp.now()
    fn()
    ts[k] = tp.now() - t0
  end
  return median(ts)
end

return M

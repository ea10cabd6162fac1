-- ops_reduce.lua: reductions along a dim (sum, mean, amax, amin, max, min), softmax and log_softmax,
-- layer_norm and rms_norm, tp.addmm and tp.bmm: functions of tp and methods of tensors.
--
-- Each op is one FFI call into src/core/ops_reduce.c, which checks shapes and dtypes; this file checks
-- the Lua types and the options, turns the 1-based dims (negative from the end) into C's, and makes the
-- output unless `out` gives it. A method of tensor.lua's table is added here, not there (one concern per
-- file); t:sum() without a dim stays the whole tensor's sum.
local ffi = require "ffi"
local capi = require "tpsh.capi"
local tensor = require "tpsh.tensor"
local stream = require "tpsh.stream"
local C, check, raise = capi.C, capi.check, capi.raise
local T, want, is_tensor = tensor.methods, tensor.want, tensor.is_tensor
local empty_raw, new_like, cdim, want_self = tensor.empty_raw, tensor.new_like, tensor.cdim, tensor.want_self
local cur = stream.current_stream

local M = {}
local sizes = ffi.new("int64_t[8]")

-- ==== options ====================================================================================
-- type(), not opts ~= nil: a NULL pointer cdata equals nil
local function options(name, opts, allowed)
  if type(opts) == "nil" then return nil end
  if type(opts) ~= "table" then
    raise(name, "expected an options table as the last argument, got " .. capi.describe(opts))
  end
  capi.check_options(name, opts, allowed)
  return opts
end

local function tensor_opt(name, opts, key)
  local v = opts and opts[key]
  if type(v) ~= "nil" and not is_tensor(v) then
    raise(name, ("opts.%s must be a tensor, got %s"):format(key, capi.describe(v)))
  end
  return v
end

local function number_opt(name, opts, key, default)
  local v = opts and opts[key]
  if type(v) == "nil" then return default end
  if type(v) ~= "number" then raise(name, ("opts.%s must be a number, got %s"):format(key, capi.describe(v))) end
  return v
end

-- ==== reductions along a dim =====================================================================
local REDUCE_OPTS = { keepdim = true, out = true }

-- A new tensor of t's shape without dim d (0-based), or with size 1 there when keepdim.
local function reduced(name, t, d, keepdim, dtype_id)
  local n = 0
  for i = 0, t.ndim - 1 do
    if i ~= d then sizes[n] = t.sizes[i]; n = n + 1
    elseif keepdim then sizes[n] = 1; n = n + 1 end
  end
  return empty_raw(n, sizes, dtype_id or t.dtype_id, name)
end

-- A tensor whose memory is gone, refused here where a method of its own would name itself instead.
local function want_alive(name, t, what)
  if C.tpsh_tensor_alive(t) == 0 then raise(name, (what or "the tensor") .. " was freed") end
end

-- The whole tensor, as one dim: t's elements in a contiguous 1-D view (a copy when t is not contiguous).
local function flat(t)
  return t:contiguous():view({ tonumber(C.tpsh_tensor_numel(t)) })
end

-- A reduction over every element: a 0-d result (all dims of size 1 with keepdim), or `out` holding one
-- element. sum keeps tensor:sum's f64 accumulation over the whole tensor (integers too).
local function reduce_all(name, op, t, keepdim, out)
  want_alive(name, t)
  if out then want_alive(name, out, "opts.out") end
  if out and C.tpsh_tensor_numel(out) ~= 1 then
    raise(name, ("opts.out must hold one element for a reduction over every element, got shape [%s]")
      :format(table.concat(out.shape, ", ")))
  end
  local r = out and out:view({}) or empty_raw(0, sizes, t.dtype_id, name)
  if op == C.TPSH_SUM then
    check(C.tpsh_sum(cur(), r, t), name)
  else
    check(C.tpsh_reduce_dim(cur(), op, r, nil, flat(t), 0, 0), name)
  end
  if out then return out end
  if keepdim then
    local ones = {}
    for i = 1, t.ndim do ones[i] = 1 end
    return r:view(ones)
  end
  return r
end

local function reduce(name, op, t, dim, opts)
  want_self(t, name)
  opts = options(name, opts, REDUCE_OPTS)
  local keepdim = opts and capi.want_flag(name, opts, "keepdim") or false
  local out = tensor_opt(name, opts, "out")
  if dim == nil then return reduce_all(name, op, t, keepdim, out) end
  local d = cdim(t, dim, name)
  out = out or reduced(name, t, d, keepdim)
  check(C.tpsh_reduce_dim(cur(), op, out, nil, t, d, keepdim and 1 or 0), name)
  return out
end

-- max and min along a dim: values and 1-based i64 indices (the first max or min; a NaN is both), as
-- torch.max(x, dim); out = {values, indices}. Without a dim: the value over every element.
local function extreme(name, op, t, dim, opts)
  want_self(t, name)
  if dim == nil then return reduce(name, op, t, nil, opts) end
  opts = options(name, opts, REDUCE_OPTS)
  local keepdim = opts and capi.want_flag(name, opts, "keepdim") or false
  local d = cdim(t, dim, name)
  local out = opts and opts.out
  local values, indices
  if type(out) ~= "nil" then
    if type(out) ~= "table" or not is_tensor(out[1]) or not is_tensor(out[2]) then
      raise(name, "opts.out must be a table {values, indices} of two tensors, got " .. capi.describe(out))
    end
    values, indices = out[1], out[2]
  else
    values, indices = reduced(name, t, d, keepdim), reduced(name, t, d, keepdim, C.TPSH_I64)
  end
  check(C.tpsh_reduce_dim(cur(), op, values, indices, t, d, keepdim and 1 or 0), name)
  return values, indices
end

local whole_sum = T.sum
function T.sum(t, dim, opts)
  if dim == nil and opts == nil then return whole_sum(t) end
  return reduce("tensor:sum", C.TPSH_SUM, t, dim, opts)
end
function T.mean(t, dim, opts) return reduce("tensor:mean", C.TPSH_AVG, t, dim, opts) end
function T.amax(t, dim, opts) return reduce("tensor:amax", C.TPSH_MAX, t, dim, opts) end
function T.amin(t, dim, opts) return reduce("tensor:amin", C.TPSH_MIN, t, dim, opts) end
function T.max(t, dim, opts) return extreme("tensor:max", C.TPSH_MAX, t, dim, opts) end
function T.min(t, dim, opts) return extreme("tensor:min", C.TPSH_MIN, t, dim, opts) end

-- ==== softmax ====================================================================================
local OUT_OPTS = { out = true }

local function softmax(name, log, x, dim, opts)
  opts = options(name, opts, OUT_OPTS)
  if dim == nil then raise(name, "expected the dimension to normalise along (as torch.softmax(x, dim))") end
  local d = cdim(x, dim, name)
  local out = tensor_opt(name, opts, "out") or new_like(x, nil, name)
  check(C.tpsh_softmax(cur(), out, x, d, log), name)
  return out
end

function M.softmax(x, dim, opts) return softmax("tp.softmax", 0, want(x, "tp.softmax", 1), dim, opts) end
function M.log_softmax(x, dim, opts) return softmax("tp.log_softmax", 1, want(x, "tp.log_softmax", 1), dim, opts) end
function T.softmax(x, dim, opts)
  want_self(x, "tensor:softmax")
  return softmax("tensor:softmax", 0, x, dim, opts)
end
function T.log_softmax(x, dim, opts)
  want_self(x, "tensor:log_softmax")
  return softmax("tensor:log_softmax", 1, x, dim, opts)
end

-- ==== layer_norm and rms_norm over the last dim ==================================================
local LAYER_NORM_OPTS = { weight = true, bias = true, eps = true, out = true }
local RMS_NORM_OPTS = { weight = true, eps = true, out = true }
-- rms_norm's eps by default, as torch.nn.functional.rms_norm's: the dtype's machine epsilon
local EPSILON = { f32 = 2 ^ -23, f64 = 2 ^ -52, f16 = 2 ^ -10, bf16 = 2 ^ -7 }

function M.layer_norm(x, opts)
  local name = "tp.layer_norm"
  want(x, name, 1)
  opts = options(name, opts, LAYER_NORM_OPTS)
  local w, b = tensor_opt(name, opts, "weight"), tensor_opt(name, opts, "bias")
  local eps = number_opt(name, opts, "eps", 1e-5)
  local out = tensor_opt(name, opts, "out") or new_like(x, nil, name)
  check(C.tpsh_layer_norm(cur(), out, x, w, b, eps), name)
  return out
end

function M.rms_norm(x, opts)
  local name = "tp.rms_norm"
  want(x, name, 1)
  opts = options(name, opts, RMS_NORM_OPTS)
  local w = tensor_opt(name, opts, "weight")
  local eps = number_opt(name, opts, "eps", EPSILON[x.dtype] or 0)
  local out = tensor_opt(name, opts, "out") or new_like(x, nil, name)
  check(C.tpsh_rms_norm(cur(), out, x, w, eps), name)
  return out
end

-- ==== addmm and bmm ==============================================================================
local ADDMM_OPTS = { alpha = true, beta = true, out = true }

-- A new (m, n) product of a and b, shaped here only when they are 2-D (C explains any other mistake).
local function product_out(name, a, b, nd)
  if a.ndim ~= nd or b.ndim ~= nd then
    raise(name, ("expected %d-D operands, got %d-D and %d-D"):format(nd, a.ndim, b.ndim))
  end
  for i = 0, nd - 2 do sizes[i] = a.sizes[i] end
  sizes[nd - 1] = b.sizes[nd - 1]
  return empty_raw(nd, sizes, a.dtype_id, name)
end

-- out = beta * c + alpha * a @ b; a new out unless given (PyTorch's addmm): {out = c} accumulates in c.
local function addmm(name, c, a, b, opts, into_c)
  opts = options(name, opts, ADDMM_OPTS)
  local alpha, beta = number_opt(name, opts, "alpha", 1), number_opt(name, opts, "beta", 1)
  local out = tensor_opt(name, opts, "out")
  if into_c then
    if out then raise(name, "takes no opts.out: it writes c (tp.addmm(c, a, b, {out = o}) writes o)") end
    out = c
  end
  out = out or product_out(name, a, b, 2)
  check(C.tpsh_addmm(cur(), out, c, a, b, alpha, beta), name)
  return out
end

function M.addmm(c, a, b, opts)
  local name = "tp.addmm"
  return addmm(name, want(c, name, 1), want(a, name, 2), want(b, name, 3), opts)
end
function T.addmm(c, a, b, opts)
  want_self(c, "tensor:addmm")
  return addmm("tensor:addmm", c, want(a, "tensor:addmm", 1), want(b, "tensor:addmm", 2), opts)
end
function T.addmm_(c, a, b, opts)
  want_self(c, "tensor:addmm_")
  return addmm("tensor:addmm_", c, want(a, "tensor:addmm_", 1), want(b, "tensor:addmm_", 2), opts, true)
end

local function bmm(name, a, b, out)
  if type(out) ~= "nil" then
    if not is_tensor(out) then raise(name, "expected a tensor as out, got " .. capi.describe(out)) end
  else
    out = product_out(name, a, b, 3)
  end
  check(C.tpsh_bmm(cur(), out, a, b), name)
  return out
end

function M.bmm(a, b, out) return bmm("tp.bmm", want(a, "tp.bmm", 1), want(b, "tp.bmm", 2), out) end
function T.bmm(a, b, out)
  want_self(a, "tensor:bmm")
  return bmm("tensor:bmm", a, want(b, "tensor:bmm", 1), out)
end

function M.install(tp)
  for _, name in ipairs { "softmax", "log_softmax", "layer_norm", "rms_norm", "addmm", "bmm" } do tp[name] = M[name] end
end

return M

-- ops_pointwise.lua: the element-wise ops of docs/api.md: tp.add, tp.sub, tp.mul, tp.div, tp.pow,
-- tp.maximum, tp.minimum, the unary ops (tp.relu, tp.gelu, ...), tp.gelu_backward, their methods and
-- in-place forms (x:relu_(), x:add_(y)), the arithmetic operators (+ - * / ^) and t:expand.
-- tensor.lua attaches it to the tensor module and its methods.
--
-- Each op is one FFI call that enqueues on the current stream. C (src/core/ops_pointwise.c) broadcasts
-- the operands with PyTorch's rules, checks shapes, dtypes and an output given as {out = t}, and says
-- what it expected; the unary and binary ops are the rows of src/core/pointwise.h, found here by name.
local ffi = require "ffi"
local capi = require "tpsh.capi"
local stream = require "tpsh.stream"
local C, check, raise = capi.C, capi.check, capi.raise
local cur = stream.current_stream

local M = {}

-- The functions of tp this module makes (init.lua copies them from the tensor module).
M.names = { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "gelu", "gelu_backward" }
-- unary ops without options but out: tp.NAME(x, {out =}), x:NAME(), x:NAME_()
local PLAIN = { "relu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "neg" }
for _, n in ipairs(PLAIN) do M.names[#M.names + 1] = n end

-- ids of the table's rows, by name; a name missing there is a build that disagrees with itself
local function ids(find, list)
  local t = {}
  for _, n in ipairs(list) do
    t[n] = find(n)
    assert(t[n] >= 0, "tpsh: the element-wise op " .. n .. " is not in src/core/pointwise.h")
  end
  return t
end
local U = ids(C.tpsh_unary_op, { "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "log", "sqrt",
  "rsqrt", "abs", "neg", "pow", "div", "rdiv" })
local B = ids(C.tpsh_binary_op, { "div", "maximum", "minimum", "gelu_backward", "gelu_tanh_backward" })

function M.attach(tensor, T, h)
  local is_tensor, want, want_self, new_like = tensor.is_tensor, tensor.want, h.want_self, h.new_like
  local int_operand, is_int_dtype = h.int_operand, h.is_int_dtype

  -- ==== options =================================================================================
  -- Checked without a loop over pairs(), which LuaJIT does not compile (group.lua says what that did to
  -- loops of collectives): every call takes at most two options, so a third key is always unknown.
  local function bad_option(name, k, allowed)
    local names = {}
    for a in pairs(allowed) do names[#names + 1] = a end
    table.sort(names)
    raise(name, ("unknown option %s (expected %s)"):format(capi.show(k), table.concat(names, ", ")))
  end
  local function read_opts(name, opts, allowed)
    local ty = type(opts)         -- type(), not opts ~= nil: a NULL pointer cdata equals nil
    if ty == "nil" then return nil end
    if ty ~= "table" then raise(name, "expected an options table such as {out = t}, got " .. capi.describe(opts)) end
    local k = next(opts)
    if k == nil then return opts elseif not allowed[k] then bad_option(name, k, allowed) end
    k = next(opts, k)
    if k == nil then return opts elseif not allowed[k] then bad_option(name, k, allowed) end
    k = next(opts, k)
    if k ~= nil then bad_option(name, k, allowed) end
    return opts
  end
  local function out_of(name, opts)
    local out = opts and opts.out
    if out ~= nil and not is_tensor(out) then
      raise(name, "opts.out must be a tensor, got " .. capi.describe(out))
    end
    return out
  end
  local OUT, OUT_ALPHA, OUT_APPROX = { out = true }, { out = true, alpha = true }, { out = true, approximate = true }
  local APPROX = { approximate = true }

  -- the operand of a function (argument n) or a method (self)
  local function want_x(x, name, method)
    if method then want_self(x, name) else want(x, name, 1) end
  end

  -- ==== allocation: outputs of a result dtype, of the operands' broadcast shape =================
  local function new_broadcast(a, b, d, name) return h.made(C.tpsh_tensor_init_broadcast, name, a, b, d) end
  local function result_dtype(d, name)
    if d < 0 then raise(name, capi.last_error()) end
    return d
  end

  -- ==== unary ops ================================================================================
  local function unary(name, op, x, p, out)
    if out == nil then out = new_like(x, result_dtype(C.tpsh_unary_dtype(op, x.dtype_id), name), name) end
    check(C.tpsh_unary(cur(), out, x, op, p), name)
    return out
  end

  for _, n in ipairs(PLAIN) do
    local op, fname, mname, iname = U[n], "tp." .. n, "tensor:" .. n, "tensor:" .. n .. "_"
    tensor[n] = function(x, opts)
      want(x, fname, 1)
      return unary(fname, op, x, 0, out_of(fname, read_opts(fname, opts, OUT)))
    end
    T[n] = function(x, opts)
      want_self(x, mname)
      return unary(mname, op, x, 0, out_of(mname, read_opts(mname, opts, OUT)))
    end
    T[n .. "_"] = function(x)
      want_self(x, iname)
      unary(iname, op, x, 0, x)
      return x
    end
  end

  -- gelu: PyTorch's approximate = "none" (the erf form) or "tanh"
  local function gelu_form(name, opts, none, tanh)
    local a = opts and opts.approximate
    if a == nil or a == "none" then return none elseif a == "tanh" then return tanh end
    raise(name, ('opts.approximate must be "none" or "tanh", got %s'):format(capi.show(a)))
  end
  local function gelu(name, x, opts, method)
    want_x(x, name, method)
    opts = read_opts(name, opts, OUT_APPROX)
    return unary(name, gelu_form(name, opts, U.gelu, U.gelu_tanh), x, 0, out_of(name, opts))
  end
  function tensor.gelu(x, opts) return gelu("tp.gelu", x, opts) end
  function T.gelu(x, opts) return gelu("tensor:gelu", x, opts, true) end
  function T.gelu_(x, opts)
    want_self(x, "tensor:gelu_")
    unary("tensor:gelu_", gelu_form("tensor:gelu_", read_opts("tensor:gelu_", opts, APPROX), U.gelu, U.gelu_tanh), x, 0, x)
    return x
  end

  -- ==== binary ops of the table ======================================================================
  local function binary(name, op, a, b, out)
    if out == nil then out = new_broadcast(a, b, result_dtype(C.tpsh_binary_dtype(op, a.dtype_id), name), name) end
    check(C.tpsh_binary(cur(), out, a, b, op), name)
    return out
  end

  -- gelu_backward(grad, x): the gradient of gelu at x times grad, as torch's gelu_backward
  function tensor.gelu_backward(grad, x, opts)
    local name = "tp.gelu_backward"
    want(grad, name, 1)
    want(x, name, 2)
    opts = read_opts(name, opts, OUT_APPROX)
    return binary(name, gelu_form(name, opts, B.gelu_backward, B.gelu_tanh_backward), grad, x, out_of(name, opts))
  end

  for _, n in ipairs { "maximum", "minimum" } do
    local op, fname, mname = B[n], "tp." .. n, "tensor:" .. n
    tensor[n] = function(a, b, opts)
      want(a, fname, 1)
      want(b, fname, 2)
      return binary(fname, op, a, b, out_of(fname, read_opts(fname, opts, OUT)))
    end
    T[n] = function(a, b, opts)
      want_self(a, mname)
      want(b, mname, 1)
      return binary(mname, op, a, b, out_of(mname, read_opts(mname, opts, OUT)))
    end
  end

  -- ==== arithmetic: add, sub, mul, div, with numbers on either side ===============================
  -- A number added or subtracted is added whole (tpsh_scale_add: floats in f32 with the number rounded
  -- to f32 below f64, as PyTorch; integers wrap, a fraction truncates the result): filled into a tensor
  -- of the dtype first, it was rounded (f16 2048 + 1.0003 gave 2048, not 2050) or truncated (i32 5 - 2.5
  -- gave 3, not 2) before the add.
  -- kind: "add" (a + alpha * b; sub is alpha -1), "mul" or "div". out: nil (a new tensor) or the output.
  local function arith(name, kind, a, b, alpha, out)
    local na, nb = type(a) == "number", type(b) == "number"
    if na and not nb then                          -- number op tensor
      want(b, name, 2)
      local id = b.dtype_id
      if kind == "div" then return unary(name, U.rdiv, b, a, out) end
      out = out or new_like(b, nil, name)
      if kind == "mul" then
        check(C.tpsh_scale(cur(), out, b, int_operand(name, id, a)), name)
      else                                         -- a + alpha * b
        check(C.tpsh_scale_add(cur(), out, b, int_operand(name, id, alpha), int_operand(name, id, a)), name)
      end
      return out
    end
    want(a, name, 1)
    local id = a.dtype_id
    if nb then                                     -- tensor op number
      if kind == "div" then return unary(name, U.div, a, b, out) end
      if kind == "mul" then
        out = out or new_like(a, nil, name)
        check(C.tpsh_scale(cur(), out, a, int_operand(name, id, b)), name)
        return out
      end
      if is_int_dtype(id) and alpha ~= 1 and alpha ~= -1 then
        -- an integer tensor with an alpha: b and alpha apart, as their product in a double would lose
        -- the low bits (b is then truncated before the add)
        local c = new_like(a, nil, name)
        check(C.tpsh_fill(cur(), c, int_operand(name, id, b)), name)
        b = c
      else
        -- out = a + alpha * b; int_operand takes -b modulo 2^64 (the lowest int64's negation is itself)
        out = out or new_like(a, nil, name)
        check(C.tpsh_scale_add(cur(), out, a, 1, int_operand(name, id, alpha * b)), name)
        return out
      end
    else
      want(b, name, 2)
    end
    if kind == "div" then return binary(name, B.div, a, b, out) end
    out = out or new_broadcast(a, b, -1, name)
    if kind == "mul" then check(C.tpsh_mul(cur(), out, a, b), name)
    else check(C.tpsh_add(cur(), out, a, b, int_operand(name, id, alpha)), name) end
    return out
  end

  local function want_alpha(name, opts)
    local alpha = opts and opts.alpha
    if alpha == nil then return 1 end
    if type(alpha) ~= "number" then raise(name, "opts.alpha must be a number, got " .. capi.describe(alpha)) end
    return alpha
  end

  -- tp.add(a, b, {alpha =, out =}) and the rest; methods take the same arguments after self
  local function define(kind, fname, mname, sign, allowed)
    tensor[kind] = function(a, b, opts)
      opts = read_opts(fname, opts, allowed)
      return arith(fname, sign and "add" or kind, a, b, sign and sign * want_alpha(fname, opts) or 1, out_of(fname, opts))
    end
    T[kind] = function(a, b, opts)
      want_self(a, mname)
      opts = read_opts(mname, opts, allowed)
      return arith(mname, sign and "add" or kind, a, b, sign and sign * want_alpha(mname, opts) or 1, out_of(mname, opts))
    end
  end
  define("add", "tp.add", "tensor:add", 1, OUT_ALPHA)
  define("sub", "tp.sub", "tensor:sub", -1, OUT_ALPHA)
  define("mul", "tp.mul", "tensor:mul", nil, OUT)
  define("div", "tp.div", "tensor:div", nil, OUT)

  -- in place: x:add_(y[, alpha]), x:sub_(y[, alpha]) (alpha a number, as before options), x:mul_(y),
  -- x:div_(y); y broadcasts to x's shape
  local function in_place(name, kind, t, x, alpha)
    want_self(t, name)
    -- type(), not alpha ~= nil: a NULL pointer cdata equals nil, and reached C as "cannot convert"
    local ta = type(alpha)
    if ta ~= "nil" and ta ~= "number" then raise(name, "alpha must be a number") end
    if type(x) ~= "number" and not is_tensor(x) then
      raise(name, "expected a tensor or a number as argument 1, got " .. capi.describe(x))
    end
    if kind == "sub" then kind, alpha = "add", -(alpha or 1) end
    arith(name, kind, t, x, alpha or 1, t)
    return t
  end
  function T.add_(t, x, alpha) return in_place("tensor:add_", "add", t, x, alpha) end
  function T.sub_(t, x, alpha) return in_place("tensor:sub_", "sub", t, x, alpha) end
  function T.mul_(t, x) return in_place("tensor:mul_", "mul", t, x) end
  function T.div_(t, x) return in_place("tensor:div_", "div", t, x) end

  -- ==== pow by a number ==========================================================================
  local function want_exponent(name, p)
    if type(p) ~= "number" then
      raise(name, "expected a number as the exponent (pow by a number), got " .. capi.describe(p))
    end
    return p
  end
  function tensor.pow(x, p, opts)
    want(x, "tp.pow", 1)
    return unary("tp.pow", U.pow, x, want_exponent("tp.pow", p), out_of("tp.pow", read_opts("tp.pow", opts, OUT)))
  end
  function T.pow(x, p)
    want_self(x, "tensor:pow")
    return unary("tensor:pow", U.pow, x, want_exponent("tensor:pow", p))
  end
  function T.pow_(x, p)
    want_self(x, "tensor:pow_")
    unary("tensor:pow_", U.pow, x, want_exponent("tensor:pow_", p), x)
    return x
  end

  -- ==== t:expand(shape): a view, size 1 dimensions repeated (stride 0), -1 keeps a size ============
  local sizes = ffi.new("int64_t[8]")
  function T.expand(t, shape)
    want_self(t, "tensor:expand")
    if type(shape) == "number" then shape = { shape } end
    if type(shape) ~= "table" then raise("tensor:expand", "expected a shape table, got " .. capi.describe(shape)) end
    local n = #shape
    if n > 8 then raise("tensor:expand", ("expected at most 8 dimensions, got %d"):format(n)) end
    h.want_no_hole(shape, n, "tensor:expand")
    for i = 1, n do
      local s = shape[i]
      if not h.is_int(s) or s < -1 then
        raise("tensor:expand", ("size of dimension %d must be an integer >= 0 or -1, got %s"):format(i, capi.show(s)))
      end
      sizes[i - 1] = s
    end
    return h.wrap(capi.checkp(C.tpsh_tensor_expand(t, n, sizes), "tensor:expand"))
  end

  -- ==== the operators ============================================================================
  local ops = {}
  local function operator(name, kind, sign)
    return function(a, b)
      if capi.locate then capi.locate() end        -- check mode: operators pass the user's line down
      return arith(name, kind, a, b, sign or 1)
    end
  end
  ops.add = operator("tensor +", "add")
  ops.sub = operator("tensor -", "add", -1)
  ops.mul = operator("tensor *", "mul")
  ops.div = operator("tensor /", "div")
  -- -t is t * -1, not 0 - t: -(+0) is -0 (0 - 0 is +0); integers wrap alike either way
  ops.unm = function(a)
    if capi.locate then capi.locate() end
    return arith("tensor -", "mul", a, -1, 1)
  end
  ops.pow = function(a, p)
    if capi.locate then capi.locate() end
    if not is_tensor(a) then
      raise("tensor ^", "expected a tensor raised to a number (t ^ p), got " .. capi.describe(a) .. " ^ a tensor")
    end
    return unary("tensor ^", U.pow, a, want_exponent("tensor ^", p))
  end
  return ops
end

return M

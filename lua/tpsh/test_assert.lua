-- tpsh.test_assert: the assertions of `tpsh test`: luassert (busted's), with assert.tensor_close.
local M = {}
local concat, fmt = table.concat, string.format

function M.luassert()
  local ok, luassert = pcall(require, "luassert")
  if not ok then   -- the Debian location, in case the host's package.path lacks it
    package.path = package.path .. ";/usr/share/lua/5.1/?.lua;/usr/share/lua/5.1/?/init.lua"
    luassert = require "luassert"
  end
  return luassert
end

local function shape_str(t)
  local ok, shape = pcall(function() return t.shape end)
  return ok and type(shape) == "table" and ("{" .. concat(shape, ",") .. "}") or "?"
end

function M.register_tensor_close(luassert, tp)
  local say = require "say"
  say:set("assertion.tensor_close.positive", "Expected tensors to be close (rtol=%s, atol=%s).\n%s\n%s\n%s")
  say:set("assertion.tensor_close.negative", "Expected tensors not to be close (rtol=%s, atol=%s).\n%s\n%s\n%s")
  local function is_tensor(x)
    if tp.is_tensor then return tp.is_tensor(x) end
    return type(x) ~= "nil" and pcall(function() return x.shape and x.dtype end)
  end
  local function show(label, x)
    if not is_tensor(x) then return fmt("%s: (%s) %s  -- not a tensor", label, type(x), tostring(x)) end
    return fmt("%s: shape %s dtype %s\n  %s", label, shape_str(x), tostring(x.dtype),
      (tostring(x):gsub("\n", "\n  ")))
  end
  -- The arguments are rewritten in place into the text luassert prints (it formats them after the
  -- callback returns), so the message carries shapes, dtypes and the max abs diff.
  -- Misuse (a tolerance that is not a number >= 0, tensors that cannot be compared: not tensors,
  -- shapes that differ, freed) is an error, not an answer: read as "not close" it let the negated form
  -- pass on anything.
  local function misuse(msg) error("assert.tensor_close: " .. msg, 0) end
  local function tolerance(v, default, what)
    if v == nil then return default end
    if type(v) ~= "number" or not (v >= 0) then misuse(fmt("expected %s as a number >= 0, got %s", what, tostring(v))) end
    return v
  end
  local function tensor_close(state, args)
    local a, b = args[1], args[2]
    local rtol, atol = tolerance(args[3], 1e-5, "rtol (argument 3)"), tolerance(args[4], 1e-8, "atol (argument 4)")
    local close, diff = false, "n/a"
    if is_tensor(a) and is_tensor(b) then
      local ok, res = pcall(tp.allclose, a, b, rtol, atol)
      if not ok then
        misuse(fmt("the tensors cannot be compared: %s\n%s\n%s", (tostring(res):gsub("^[^:\n]+:%d+: ", "")),
          show("a", a), show("b", b)))
      end
      close = res == true
      local okd, d = pcall(a.max_abs_diff, a, b)
      diff = okd and tostring(d) or ("n/a (" .. tostring(d) .. ")")
    elseif state.mod == false then
      misuse("expected two tensors, got " .. type(a) .. " and " .. type(b))
    end
    if args[5] ~= nil then rawset(state, "failure_message", args[5]) end
    local text = { tostring(rtol), tostring(atol), show("a", a), show("b", b), "max abs diff: " .. diff }
    for i = 1, math.max(args.n or 0, 5) do args[i] = text[i] end
    args.n, args.nofmt = 5, { true, true, true, true, true }
    return close
  end
  luassert:register("assertion", "tensor_close", tensor_close,
    "assertion.tensor_close.positive", "assertion.tensor_close.negative")
end

return M

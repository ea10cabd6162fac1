-- tensor.lua: tensors as Lua sees them.
--
-- A tensor is a `tpsh_tensor *` with a metatype: shapes are read straight from the C descriptor, and
-- every op is one FFI call that enqueues on the current stream. The API is 1-based for dimensions and
-- indices (Torch7); C is 0-based, and the conversion happens here, once. Argument checks that need
-- Lua types happen here; checks of shapes and dtypes happen in C (src/core/ops.c), before anything is
-- enqueued, and come back as errors that name the Lua call.
local ffi = require "ffi"
local capi = require "tpsh.capi"
local stream = require "tpsh.stream"
local C, check, checkp, raise = capi.C, capi.check, capi.checkp, capi.raise

local M = {}
local T = {}          -- methods
M.methods = T

-- The Lua handle is the descriptor itself, in GC-managed memory (see tpsh_tensor_move_into).
local tensor_ct = ffi.typeof("tpsh_tensor")
local function is_tensor(v) return ffi.istype(tensor_ct, v) end
M.is_tensor = is_tensor

local cur = stream.current_stream

-- ==== dtypes =====================================================================================
local dtype_name = {}
for i = 0, C.TPSH_NDTYPES - 1 do dtype_name[i] = ffi.string(C.tpsh_dtype_name(i)) end
local ctype_of = { f32 = "float", f64 = "double", i32 = "int32_t", i64 = "int64_t", u8 = "uint8_t" }
local is_float = { f32 = true, f64 = true, f16 = true, bf16 = true }

local function dtype_id(d, name)
  if d == nil then return C.TPSH_F32 end
  if type(d) ~= "string" then
    raise(name, "dtype must be a string such as \"f32\", got " .. type(d))
  end
  local id = C.tpsh_dtype_from_name(d)
  if id < 0 then
    raise(name, ("unknown dtype %q: expected f32, f16, bf16, f64, i32, i64 or u8"):format(d))
  end
  return id
end
M.dtype_id = dtype_id

-- ==== construction helpers =======================================================================
-- Tensor memory is invisible to Lua's garbage collector, which sees only small cdata: memory.lua paces
-- the collector by the bytes of the tensors made (a comparison per tensor, a step now and then).
local pace = require "tpsh.memory"
local stats = pace.stats

local function collect_if_needed()
  if stats.bytes_since_step > pace.step_bytes then pace.step() end
end

-- A descriptor returned by a C function becomes a GC-owned Lua tensor.
local function wrap(p)
  local t = tensor_ct()
  C.tpsh_tensor_move_into(t, p)
  collect_if_needed()
  return t
end

local shape_buf = ffi.new("int64_t[8]")

-- Integers that C receives as int64 must be exact in a double: beyond 2^53 (and for inf and NaN) the
-- conversion would hand C another number than the user wrote.
local MAX_INT = 2 ^ 53
local function is_int(v) return type(v) == "number" and v == math.floor(v) and v > -MAX_INT and v < MAX_INT end

local function bad_size(name, i, s)
  -- a whole number past 2^53 is an integer too: say what the limit is rather than that it is not one
  local why = type(s) == "number" and s >= MAX_INT and s < math.huge and " below 2^53" or ""
  raise(name, ("size of dimension %d must be a non-negative integer%s, got %s"):format(i, why, capi.show(s)))
end

-- The length of a shape list with a hole ({2, nil, 3}) is any of its borders, 1 or 3, and {2, nil, 3}
-- was read as {2}. A shape has at most 8 sizes, so looking at the places up to 9 after the length
-- finds every hole that matters, whichever border # picked (without next() or table.maxn, which
-- would keep the hot paths that make tensors out of traces); the hole is then a nil size, as when #
-- picks the far border.
local function want_no_hole(shape, n, name)
  for i = n + 2, 9 do
    if shape[i] ~= nil then bad_size(name, n + 1, nil) end
  end
end

-- Reads a Lua shape ({4, 1024}, or a number for 1-D) into shape_buf; returns ndim.
local function read_shape(shape, name)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" then
    raise(name, "expected a shape table such as {4, 1024}, got " .. capi.describe(shape))
  end
  local n = #shape
  if n > 8 then raise(name, ("expected at most 8 dimensions, got %d"):format(n)) end
  want_no_hole(shape, n, name)
  for i = 1, n do
    local s = shape[i]
    if not is_int(s) or s < 0 then bad_size(name, i, s) end
    shape_buf[i - 1] = s
  end
  -- {} is a 0-d shape; a table with no list part but other keys ({n = 3}) is a mistake. (Keys beside a
  -- list part are not looked for: next() would keep the hot paths that make tensors out of traces.)
  if n == 0 and next(shape) ~= nil then
    raise(name, "expected a shape as a list of sizes such as {4, 1024}, got a table with no list part")
  end
  return n
end

-- A new tensor built in place (no C-side descriptor to copy) by init, a tpsh_tensor_init_* of C, with
-- the arguments x, y, z and the current stream; name: the call to blame (it said "tensor", which names
-- none: "tensor: out of host memory ...").
-- On out-of-memory, tensors that are garbage but not yet collected may hold the memory: collect once
-- and retry before reporting (the C side has already waited for blocks freed in stream order). These
-- are separate functions, not closures in the hot paths below: a closure capturing their locals would
-- make LuaJIT close upvalues on every return, which its trace compiler does not handle.
local function collect_for_retry()
  collectgarbage()
  collectgarbage()
  stats.bytes_since_step = 0
end

local function retry(init, t, x, y, z)
  collect_for_retry()
  return init(t, x, y, z, cur())
end

local function made(init, name, x, y, z)
  local t = tensor_ct()
  local rc = init(t, x, y, z, cur())
  if rc == C.TPSH_ENOMEM then rc = retry(init, t, x, y, z) end
  check(rc, name)
  collect_if_needed()
  return t
end

local function empty_raw(ndim, sizes, id, name) return made(C.tpsh_tensor_init_empty, name, ndim, sizes, id) end
M.empty_raw = empty_raw

local function new(shape, dtype, name)
  local n = read_shape(shape, name)
  local id = dtype_id(dtype, name)
  return empty_raw(n, shape_buf, id, name)
end

-- contiguous, t's shape, of t's dtype or another (a broadcast of t alone)
local function new_like(t, dtype_id_, name) return made(C.tpsh_tensor_init_broadcast, name, t, nil, dtype_id_ or -1) end
M.new_like = new_like

-- A method called with a dot (t.numel() for t:numel()) has no tensor as self, and the FFI would hand
-- C a NULL for the nil: every method checks its self first.
local function want_self(t, name)
  if not is_tensor(t) then capi.not_self(name, "tensor", "t", t) end
end
M.want_self = want_self

local function want(v, name, argn)
  if not is_tensor(v) then
    raise(name, ("expected a tensor as argument %d, got %s"):format(argn, capi.describe(v)))
  end
  return v
end
M.want = want

-- 1-based (negative from the end) dimension -> 0-based
local function cdim(t, d, name)
  local nd = t.ndim
  if not is_int(d) then raise(name, "expected an integer dimension, got " .. capi.show(d)) end
  local k = d < 0 and nd + d + 1 or d
  if k < 1 or k > nd then
    raise(name, ("dimension %d out of range for a tensor of %d dimensions"):format(d, nd))
  end
  return k - 1
end
M.cdim = cdim

-- An integer position or length argument, checked before C sees it.
local function int_arg(v, name, what)
  if not is_int(v) then raise(name, ("expected an integer %s, got %s"):format(what, capi.show(v))) end
  return v
end

-- ==== creation ===================================================================================
function M.empty(shape, dtype) return new(shape, dtype, "tp.empty") end

function M.zeros(shape, dtype)
  local t = new(shape, dtype, "tp.zeros")
  check(C.tpsh_fill(cur(), t, 0), "tp.zeros")
  return t
end

function M.ones(shape, dtype)
  local t = new(shape, dtype, "tp.ones")
  check(C.tpsh_fill(cur(), t, 1), "tp.ones")
  return t
end

-- The values each integer dtype holds: a fill outside them would wrap (300 as u8 is 44), so it is
-- refused as PyTorch refuses it. Fractions are truncated toward zero, as a cast does.
local int_range = {     -- lowest, one past the highest (exact in doubles), and how to say it
  [C.TPSH_U8] = { 0, 256, "0 to 255" }, [C.TPSH_I32] = { -2 ^ 31, 2 ^ 31, "-2147483648 to 2147483647" },
  [C.TPSH_I64] = { -2 ^ 63, 2 ^ 63, "-2^63 to 2^63 - 1" },
}
local function in_range(id, v)
  local r = int_range[id]
  return not r or ((v >= r[1] or v > r[1] - 1) and v < r[2])
end
-- where: " at data[2]" or "", for the message.
local function want_in_range(name, id, v, where)
  local r = int_range[id]
  if not in_range(id, v) then
    raise(name, ("value %s%s does not fit dtype %s (%s)"):format(capi.show(v), where, dtype_name[id], r[3]))
  end
end

-- A number operand of integer arithmetic (add_, mul_, +, -, *) on a tensor of dtype id: NaN and the
-- infinities are refused (no integer means them: NaN added nothing, inf multiplied to -1), and a
-- number past the int64 range is taken modulo 2^64, exactly (fmod of a double is exact), so that the
-- result wraps modulo 2^bits as for any other operand: C saturated it first (5 + 1e30 in i32 was 4,
-- not 5 + 2^30). Float tensors take the number as it is.
local TWO64, TWO63 = 2 ^ 64, 2 ^ 63
local function int_operand(name, id, v)
  if not int_range[id] then return v end
  if v ~= v or v == math.huge or v == -math.huge then
    raise(name, ("expected a finite number with an %s tensor, got %s"):format(dtype_name[id], capi.show(v)))
  end
  if v >= TWO63 or v < -TWO63 then
    v = math.fmod(v, TWO64)
    if v >= TWO63 then v = v - TWO64 elseif v < -TWO63 then v = v + TWO64 end
  end
  return v
end

local function want_fill_value(name, id, v)
  if type(v) ~= "number" then raise(name, "expected a number as value, got " .. capi.describe(v)) end
  want_in_range(name, id, v, "")
end

function M.full(shape, value, dtype)
  want_fill_value("tp.full", dtype_id(dtype, "tp.full"), value)
  local t = new(shape, dtype, "tp.full")
  check(C.tpsh_fill(cur(), t, value), "tp.full")
  return t
end

function M.arange(n, dtype)
  if type(n) ~= "number" or n < 0 or n ~= math.floor(n) then
    raise("tp.arange", "expected a non-negative integer count, got " .. tostring(n))
  end
  local t = new({ n }, dtype, "tp.arange")
  -- An integer dtype wraps modulo 2^bits, as its arithmetic does (tp.arange(300, "u8") ends 43): the
  -- cheap way to a patterned tensor of any length (tests/gpu/memory_spec.lua: 2^31 + 16 u8 elements).
  check(C.tpsh_arange(cur(), t, 0, 1), "tp.arange")
  return t
end

-- *_like take no dtype (docs/api.md): one given was ignored, and tp.zeros_like(t, "f64") made f32.
local function like_arg(t, extra, name, maker)
  want(t, name, 1)
  -- (its shape and dtype are still readable, and a freed tensor's "copy" was taken for a live one)
  if C.tpsh_tensor_alive(t) == 0 then raise(name, "the tensor was freed") end
  if extra ~= nil then
    raise(name, ("expected one argument, the tensor, got %s as argument 2 (for another dtype: "
      .. "%s(t.shape, dtype))"):format(capi.show(extra), maker))
  end
end

function M.empty_like(t, extra)
  like_arg(t, extra, "tp.empty_like", "tp.empty")
  return new_like(t, nil, "tp.empty_like")
end
function M.zeros_like(t, extra)
  like_arg(t, extra, "tp.zeros_like", "tp.zeros")
  local z = new_like(t, nil, "tp.zeros_like")
  check(C.tpsh_fill(cur(), z, 0), "tp.zeros_like")
  return z
end

-- Random numbers: counter-based (src/core/random.h), so a (seed, offset) pair names the numbers on any
-- backend. Without a seed, each rank draws from its own sequence (seed 0x7073 + rank) and successive
-- calls continue it; with {seed = s}, the numbers depend on s alone (the same on every rank).
local gen = { seed = 0, offset = 0 }
local RANDOM_OPTIONS = { seed = true }
-- A seed is an integer in [0, 2^53): C takes it as a uint64, and a negative, fractional or huge double
-- would reach it as some other number (many seeds would then give the same numbers).
local function want_seed(seed, name, what)
  if not is_int(seed) or seed < 0 then
    raise(name, ("%s must be an integer in [0, 2^53), got %s"):format(what, capi.show(seed)))
  end
  return seed
end
function M.manual_seed(seed)
  gen.seed, gen.offset = want_seed(seed, "tp.manual_seed", "the seed"), 0
end
function M._init_seed(rank) gen.seed, gen.offset = 0x7073 + rank, 0 end

local function random(name, normal, shape, dtype, opts)
  if type(dtype) == "table" and opts == nil then dtype, opts = nil, dtype end
  -- type(), not opts ~= nil: a NULL pointer cdata equals nil and then was indexed ("'void *' has no
  -- member named 'seed'")
  if type(opts) ~= "nil" and type(opts) ~= "table" then raise(name, "expected an options table, got " .. type(opts)) end
  if opts ~= nil then capi.check_options(name, opts, RANDOM_OPTIONS) end
  local t = new(shape, dtype, name)
  local n = tonumber(C.tpsh_tensor_numel(t))
  local seeded = opts and opts.seed ~= nil
  local seed, offset = gen.seed, gen.offset
  if seeded then seed, offset = want_seed(opts.seed, name, "opts.seed"), 0 end
  -- gen.offset counts uniforms, and normal number j of the kernel's counter c takes the uniforms 2(c + j)
  -- and 2(c + j) + 1 (random.h): randn starts at the first even uniform not drawn yet and moves on by 2n.
  -- Counted as one a number, a randn at offset o took uniforms [2o, 2o + 2n) while the sequence went on
  -- from o + n, so the rands drawn next returned the very uniforms of its values (tp.rand after tp.randn
  -- gave each normal's u1 and u2).
  if normal == 1 and not seeded then offset = math.ceil(offset / 2) end
  check(C.tpsh_random(cur(), t, normal, seed, offset), name)   -- refuses integer dtypes
  -- after the check: a refused call (tp.rand(n, "i32")) does not move the sequence on
  if not seeded then gen.offset = normal == 1 and 2 * (offset + n) or gen.offset + n end
  return t
end
function M.rand(shape, dtype, opts) return random("tp.rand", 0, shape, dtype, opts) end
function M.randn(shape, dtype, opts) return random("tp.randn", 1, shape, dtype, opts) end

-- tp.from(nested table, dtype): the shape is read from the nesting; ragged tables are an error.
function M.from(data, dtype)
  local id = dtype_id(dtype, "tp.from")
  if type(data) == "number" then data = { data } end
  if type(data) ~= "table" then raise("tp.from", "expected a (nested) table of numbers, got " .. type(data)) end
  -- The limit is checked inside the loop: a table that holds itself (a[1] = a) would never end it.
  local shape, probe = {}, data
  -- LuaJIT's # does not call __len: a proxy table's length read 0 (tp.from gave shape [0])
  local function plain(v, where)
    local mt = getmetatable(v)
    if type(mt) == "table" and rawget(mt, "__len") ~= nil then
      raise("tp.from", ("expected plain tables, got one with a __len metamethod at %s, which # does not call "
        .. "(its length cannot be read): copy it into a plain table"):format(where))
    end
  end
  while type(probe) == "table" do
    plain(probe, #shape == 0 and "data" or "data" .. ("[1]"):rep(#shape))
    if #shape == 8 then
      raise("tp.from", "expected at most 8 levels of nesting, got a table nested deeper than 8 levels "
        .. "(or one that holds itself)")
    end
    shape[#shape + 1] = #probe
    probe = probe[1]
  end
  -- The path of an item ("data[2][3]") is made only for an error message: made for every item, as it
  -- was, the string concatenations took most of the time (tp.from of 2^18 numbers: ~420 ns a number,
  -- 25x a loop that copies the numbers; docs/perf.md, "CPU: kernels against plain C").
  -- The values go straight into the buffer of doubles: the shape, read above, gives its size (a ragged
  -- table raises before it could write past it: each list's length is checked before its items).
  local count = 1
  for l = 1, #shape do count = count * shape[l] end
  local buf, nflat, at = ffi.new("double[?]", math.max(count, 1)), 0, {}
  local function path_to(level)
    local parts = { "data" }
    for l = 1, level - 1 do parts[#parts + 1] = "[" .. at[l] .. "]" end
    return table.concat(parts)
  end
  local function walk(v, level)
    if level > #shape then
      if type(v) ~= "number" then raise("tp.from", ("expected a number at %s, got %s"):format(path_to(level), type(v))) end
      -- refused as fill_ refuses it: the cast would wrap (300 as u8 is 44)
      if not in_range(id, v) then want_in_range("tp.from", id, v, " at " .. path_to(level)) end
      buf[nflat] = v
      nflat = nflat + 1
      return
    end
    if type(v) == "table" then plain(v, path_to(level)) end
    if type(v) ~= "table" or #v ~= shape[level] then
      raise("tp.from", ("ragged table: expected %d items at %s, got %s"):format(shape[level], path_to(level),
        type(v) == "table" and tostring(#v) or type(v)))
    end
    -- # of a list with a hole is any border: {1, nil, 3} was read as {1}
    local last = table.maxn(v)
    if last ~= #v then
      local path = path_to(level)
      raise("tp.from", ("expected a list without holes at %s, got nil at %s[%d] before an item at %s[%s]")
        :format(path, path, #v + 1, path, capi.show(last)))
    end
    for i = 1, #v do
      at[level] = i
      walk(v[i], level + 1)
    end
  end
  walk(data, 1)
  -- Values travel as doubles (exact for every dtype but i64 beyond 2^53) and are cast on the device.
  local dbl = new(shape, "f64", "tp.from")
  check(C.tpsh_from_host(cur(), dbl, buf), "tp.from")
  if id == C.TPSH_F64 then return dbl end
  local t = new_like(dbl, id, "tp.from")
  check(C.tpsh_copy(cur(), t, dbl), "tp.from")
  return t
end

-- ==== inspection =================================================================================
local props = {}
function props.shape(t)
  local s = {}
  for d = 0, t.ndim - 1 do s[d + 1] = tonumber(t.sizes[d]) end
  return s
end
function props.dtype(t) return dtype_name[t.dtype_id] end
function props.device_name(t) return t.device < 0 and "cpu" or ("cuda:" .. t.device) end

function T.dim(t) want_self(t, "tensor:dim") return t.ndim end
function T.size(t, d)
  want_self(t, "tensor:size")
  if d == nil then return props.shape(t) end
  return tonumber(t.sizes[cdim(t, d, "tensor:size")])
end
function T.stride(t, d)
  want_self(t, "tensor:stride")
  if d == nil then
    local s = {}
    for i = 0, t.ndim - 1 do s[i + 1] = tonumber(t.strides[i]) end
    return s
  end
  return tonumber(t.strides[cdim(t, d, "tensor:stride")])
end
function T.numel(t) want_self(t, "tensor:numel") return tonumber(C.tpsh_tensor_numel(t)) end
-- The address of element 0 (device memory on CUDA), a void * cdata, for FFI interop; an error once freed.
function T.data_ptr(t)
  want_self(t, "tensor:data_ptr")
  -- asked before tpsh_tensor_data, which reads the storage: a descriptor without one (tp.is_tensor's
  -- type made by ffi.new) crashed there
  if C.tpsh_tensor_alive(t) == 0 then raise("tensor:data_ptr", "the tensor was freed") end
  return C.tpsh_tensor_data(t)
end
function T.nbytes(t)
  want_self(t, "tensor:nbytes")
  return tonumber(C.tpsh_tensor_numel(t)) * C.tpsh_dtype_size(t.dtype_id)
end
function T.is_contiguous(t)
  want_self(t, "tensor:is_contiguous")
  return C.tpsh_tensor_is_contiguous(t) ~= 0
end
function T.is_alive(t) want_self(t, "tensor:is_alive") return C.tpsh_tensor_alive(t) ~= 0 end
function T.storage_id(t)
  want_self(t, "tensor:storage_id")
  return tonumber(C.tpsh_tensor_storage_id(t))
end

-- ==== views ======================================================================================
function T.view(t, shape)
  want_self(t, "tensor:view")
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" then raise("tensor:view", "expected a shape table, got " .. capi.describe(shape)) end
  want_no_hole(shape, #shape, "tensor:view")     -- s below copies 1..#shape only
  -- one -1 is inferred from the element count
  local known, infer = 1, nil
  local s = {}
  for i = 1, #shape do
    s[i] = shape[i]
    if shape[i] == -1 then
      if infer then raise("tensor:view", "only one dimension can be -1") end
      infer = i
    elseif not is_int(shape[i]) or shape[i] < 0 then
      bad_size("tensor:view", i, shape[i])   -- before -1 is inferred from it ({-1, -2} named dimension 1)
    else
      known = known * shape[i]
    end
  end
  if infer then
    local numel = tonumber(C.tpsh_tensor_numel(t))
    if known == 0 or numel % known ~= 0 then
      raise("tensor:view", ("cannot infer -1: %d elements do not split into parts of %d"):format(numel, known))
    end
    s[infer] = numel / known
  end
  local n = read_shape(s, "tensor:view")
  return wrap(checkp(C.tpsh_tensor_view(t, n, shape_buf), "tensor:view"))
end

function T.narrow(t, dim, start, len)
  want_self(t, "tensor:narrow")
  local d = cdim(t, dim, "tensor:narrow")
  int_arg(start, "tensor:narrow", "start")
  int_arg(len, "tensor:narrow", "length")
  return wrap(checkp(C.tpsh_tensor_narrow(t, d, start - 1, len), "tensor:narrow"))
end

function T.select(t, dim, i)
  want_self(t, "tensor:select")
  local d = cdim(t, dim, "tensor:select")
  int_arg(i, "tensor:select", "index")
  if i < 0 then
    local n = tonumber(t.sizes[d])
    -- said here, as C says it for the others: C would be handed the converted index (0 for -3 of 2)
    if i < -n then raise("tensor:select", ("index %d is outside dimension %d of size %d"):format(i, d + 1, n)) end
    i = n + i + 1
  end
  return wrap(checkp(C.tpsh_tensor_select(t, d, i - 1), "tensor:select"))
end

function T.transpose(t, d1, d2)
  want_self(t, "tensor:transpose")
  local a = cdim(t, d1 or 1, "tensor:transpose")
  local b = cdim(t, d2 or 2, "tensor:transpose")
  return wrap(checkp(C.tpsh_tensor_transpose(t, a, b), "tensor:transpose"))
end
-- t:t() is transpose(1, 2) of a 2-d tensor, and says so in its own name (a 1-d tensor's error
-- blamed tensor:transpose's dimension 2, which the caller never passed).
function T.t(t)
  want_self(t, "tensor:t")
  if t.ndim ~= 2 then
    raise("tensor:t", ("expected a 2-d tensor, got a %d-d one (t:transpose(d1, d2) swaps any two dimensions)"):format(t.ndim))
  end
  return wrap(checkp(C.tpsh_tensor_transpose(t, 0, 1), "tensor:t"))
end

function T.chunk(t, n, dim)
  want_self(t, "tensor:chunk")
  if not is_int(n) or n < 1 then
    raise("tensor:chunk", "expected a positive integer number of chunks, got " .. capi.show(n))
  end
  local d = cdim(t, dim or 1, "tensor:chunk")
  local size = tonumber(t.sizes[d])
  local step = math.ceil(size / n)
  local out = {}
  local start = 0
  while start < size do
    local len = math.min(step, size - start)
    out[#out + 1] = wrap(checkp(C.tpsh_tensor_narrow(t, d, start, len), "tensor:chunk"))
    start = start + len
  end
  if size == 0 then out[1] = wrap(checkp(C.tpsh_tensor_narrow(t, d, 0, 0), "tensor:chunk")) end
  return out
end

function T.contiguous(t)
  want_self(t, "tensor:contiguous")
  if C.tpsh_tensor_alive(t) == 0 then raise("tensor:contiguous", "the tensor was freed") end
  if C.tpsh_tensor_is_contiguous(t) ~= 0 then return t end
  local c = new_like(t, nil, "tensor:contiguous")
  check(C.tpsh_copy(cur(), c, t), "tensor:contiguous")
  return c
end

function T.clone(t)
  want_self(t, "tensor:clone")
  local c = new_like(t, nil, "tensor:clone")
  check(C.tpsh_copy(cur(), c, t), "tensor:clone")
  return c
end

-- ==== ops ========================================================================================
function T.copy_(t, src)
  want_self(t, "tensor:copy_")
  want(src, "tensor:copy_", 1)
  check(C.tpsh_copy(cur(), t, src), "tensor:copy_")
  return t
end

function T.fill_(t, v)
  want_self(t, "tensor:fill_")
  want_fill_value("tensor:fill_", t.dtype_id, v)
  check(C.tpsh_fill(cur(), t, v), "tensor:fill_")
  return t
end

function T.sum(t)
  want_self(t, "tensor:sum")
  local out = empty_raw(0, shape_buf, t.dtype_id, "tensor:sum")
  check(C.tpsh_sum(cur(), out, t), "tensor:sum")
  return out
end

function T.to(t, dtype)
  want_self(t, "tensor:to")
  -- (dtype_id takes nil for the default, f32: t:to() and t:to(nil) converted to f32 without a word)
  if dtype == nil then raise("tensor:to", 'expected a dtype (e.g. t:to("f64")), got nil') end
  local id = dtype_id(dtype, "tensor:to")
  if id == t.dtype_id then return t end
  local out = new_like(t, id, "tensor:to")
  check(C.tpsh_copy(cur(), out, t), "tensor:to")
  return out
end

function M.matmul(a, b, out)
  want(a, "tp.matmul", 1)
  want(b, "tp.matmul", 2)
  if out == nil then
    if a.ndim ~= 2 or b.ndim ~= 2 then
      raise("tp.matmul", ("expected 2-D operands, got %d-D and %d-D"):format(a.ndim, b.ndim))
    end
    shape_buf[0], shape_buf[1] = a.sizes[0], b.sizes[1]
    out = empty_raw(2, shape_buf, a.dtype_id, "tp.matmul")
  else
    want(out, "tp.matmul", 3)
  end
  check(C.tpsh_matmul(cur(), out, a, b), "tp.matmul")
  return out
end
T.matmul = M.matmul

local list_buf = ffi.new("tpsh_tensor *[?]", 64)
function M.cat(list, dim)
  if type(list) ~= "table" then raise("tp.cat", "expected a list of tensors, got " .. capi.describe(list)) end
  local n = #list
  if n == 0 then raise("tp.cat", "expected a non-empty list of tensors") end
  for i = 1, n do
    if not is_tensor(list[i]) then
      raise("tp.cat", ("item %d: expected a tensor, got %s"):format(i, capi.describe(list[i])))
    end
  end
  local first = list[1]
  local d = cdim(first, dim or 1, "tp.cat")
  local total = 0
  for i = 1, n do total = total + (list[i].ndim == first.ndim and tonumber(list[i].sizes[d]) or 0) end
  for i = 0, first.ndim - 1 do shape_buf[i] = first.sizes[i] end
  shape_buf[d] = total
  local out = empty_raw(first.ndim, shape_buf, first.dtype_id, "tp.cat")
  -- The pointers go into buf after the last allocation before the call: the collector does not see
  -- them, and once list is dead (the JIT keeps no dead slot, nor a sunk list table) an allocation
  -- between could free a temporary of the list, { x + 1, x * 2 }, under them.
  local s = cur()
  local buf = n <= 64 and list_buf or ffi.new("tpsh_tensor *[?]", n)
  for i = 1, n do buf[i - 1] = list[i] end
  check(C.tpsh_cat(s, out, n, buf, d), "tp.cat")
  return out
end

function M.spin(ms)
  if type(ms) ~= "number" or not (ms >= 0 and ms <= C.TPSH_SPIN_MAX_MS) then    -- why the bound: tpsh.h
    raise("tp.spin", ("expected a number of milliseconds from 0 to %d (about 2.8 hours), got %s"):format(
      C.TPSH_SPIN_MAX_MS, capi.show(ms)))
  end
  check(C.tpsh_spin(cur(), ms), "tp.spin")
end

-- ==== to the host ================================================================================
-- Reads t into a Lua-owned buffer of a type Lua can index (f16/bf16 go through f32 on the device).
-- ffi.new makes at most 2^31 - 1 bytes: a larger read raised LuaJIT's own "bad argument #1 to 'new'
-- (size of C type is unknown or too large)", naming no call (an f16 tensor after a copy to f32 of
-- twice its size). Refused first, with the way out.
local MAX_HOST_BYTES = 2 ^ 31 - 1
local function fetch(t, name)
  local src, ct = t, ctype_of[dtype_name[t.dtype_id]]
  local n = tonumber(C.tpsh_tensor_numel(t))
  if n * ffi.sizeof(ct or "float") > MAX_HOST_BYTES then
    raise(name, ("a tensor of %d elements takes %d bytes on the host, more than a LuaJIT buffer holds "
      .. "(2^31 - 1): read it in parts (narrow)"):format(n, n * ffi.sizeof(ct or "float")))
  end
  if not ct then
    src = new_like(t, C.TPSH_F32, name)
    check(C.tpsh_copy(cur(), src, t), name)
    ct = "float"
  end
  local buf = ffi.new(ct .. "[?]", math.max(n, 1))
  check(C.tpsh_to_host(cur(), src, buf), name)
  return buf, n, ct
end

-- A reader of element i of a fetched buffer. A float or double keeps its NaN payload when read, and
-- LuaJIT's NaN-tagged values take some payloads (all bits set, as in uninitialised memory from
-- tp.empty or a read that races a write) for another type: such an element came back as nil, printed
-- as "[]" or crashed tostring. Any NaN is read as Lua's own NaN.
-- exact: an int64_t element is returned as its cdata (printing reads it exactly; a Lua number holds
-- 53 bits, and 2^53 + 1 printed as 9.007199254741e+15).
local NAN, band = 0 / 0, bit.band
local function reader(buf, ct, exact)
  if exact and ct == "int64_t" then return function(i) return buf[i] end end
  if ct == "float" then
    local u = ffi.cast("uint32_t *", buf)
    return function(i)
      local w = u[i]
      if band(w, 0x7f800000) == 0x7f800000 and band(w, 0x7fffff) ~= 0 then return NAN end
      return tonumber(buf[i])
    end
  elseif ct == "double" then
    local u = ffi.cast("uint32_t *", buf)          -- little-endian: the high word is 2i + 1
    return function(i)
      local hi = u[2 * i + 1]
      if band(hi, 0x7ff00000) == 0x7ff00000 and (band(hi, 0xfffff) ~= 0 or u[2 * i] ~= 0) then return NAN end
      return tonumber(buf[i])
    end
  end
  if ct == "int64_t" then
    -- an i64 that a double cannot hold exactly stays an int64_t cdata (LuaJIT's 64-bit integer: it
    -- compares with numbers and does integer arithmetic); tonumber rounded it while print showed it whole
    return function(i)
      local v = buf[i]
      if v > 9007199254740992LL or v < -9007199254740992LL then return v end
      return tonumber(v)
    end
  end
  return function(i) return tonumber(buf[i]) end
end

-- t's values as nested tables (a number for 0-d); name is the call to blame.
-- A tensor with no elements still has its shape's nested tables, and nothing bounds their number
-- ({2^31, 2^31, 0} views an empty tensor): building them ran until LuaJIT was out of memory, which ended
-- the run. Counted first, and refused past 2^24 (a tensor with elements has fewer tables than values).
local MAX_EMPTY_TABLES = 2 ^ 24
local function want_few_tables(t, name)
  local tables, level = 1, 1
  for d = 0, t.ndim - 2 do
    level = level * tonumber(t.sizes[d])
    tables = tables + level
  end
  if tables > MAX_EMPTY_TABLES then
    raise(name, ("a tensor of shape [%s] has no elements but would make %.17g nested tables (at most %d)")
      :format(table.concat(props.shape(t), ", "), tables, MAX_EMPTY_TABLES))
  end
end

-- A Lua table holds at most 2^27 + 2^26 entries (LuaJIT's array and hash parts): a longer dimension
-- raised "table overflow", naming no call, after a minute of building (3 GiB for a 1-D u8 tensor of
-- 2^28 elements, 256 MiB on the device).
local MAX_TABLE_ENTRIES = 2 ^ 27 + 2 ^ 26
local function totable(t, name, exact)
  if C.tpsh_tensor_numel(t) == 0 then want_few_tables(t, name) end
  for d = 0, t.ndim - 1 do
    if t.sizes[d] > MAX_TABLE_ENTRIES then
      raise(name, ("dimension %d has %d entries, more than a Lua table holds (2^27 + 2^26): read it in parts "
        .. "(narrow)"):format(d + 1, tonumber(t.sizes[d])))
    end
  end
  local buf, _, ct = fetch(t, name)
  local at = reader(buf, ct, exact)
  local nd = t.ndim
  if nd == 0 then return at(0) end
  local sizes = props.shape(t)
  local pos = 0
  local function build(d)
    local out = {}
    if d == nd then
      for i = 1, sizes[d] do out[i] = at(pos); pos = pos + 1 end
    else
      for i = 1, sizes[d] do out[i] = build(d + 1) end
    end
    return out
  end
  return build(1)
end

function T.totable(t)
  want_self(t, "tensor:totable")
  return totable(t, "tensor:totable")
end

function T.item(t)
  want_self(t, "tensor:item")
  local n = tonumber(C.tpsh_tensor_numel(t))
  if n ~= 1 then raise("tensor:item", ("expected a tensor of one element, got %d elements"):format(n)) end
  local buf, _, ct = fetch(t, "tensor:item")
  return reader(buf, ct)(0)
end

local cmp = ffi.new("double[2]")
local function compare(name, a, b, rtol, atol)
  want(a, name, 1)
  want(b, name, 2)
  check(C.tpsh_compare(cur(), a, b, rtol, atol, cmp), name)
  return cmp[0], cmp[1]
end

-- rtol or atol v (default when nil), checked; tp.compare checks its options with it too.
local function tolerance(v, default, name, what)
  if v == nil then return default end
  if type(v) ~= "number" or not (v >= 0) then
    raise(name, ("%s must be a number >= 0, got %s"):format(what, capi.show(v)))
  end
  return v
end

M.tolerance = tolerance

function M.allclose(a, b, rtol, atol)
  local bad = compare("tp.allclose", a, b, tolerance(rtol, 1e-5, "tp.allclose", "rtol"),
    tolerance(atol, 1e-8, "tp.allclose", "atol"))
  return bad == 0
end

function M.equal(a, b)
  want(a, "tp.equal", 1)
  want(b, "tp.equal", 2)
  if a.dtype_id ~= b.dtype_id or a.ndim ~= b.ndim then return false end
  for d = 0, a.ndim - 1 do if a.sizes[d] ~= b.sizes[d] then return false end end
  local bad = compare("tp.equal", a, b, 0, 0)
  return bad == 0
end

function T.max_abs_diff(a, b)
  want_self(a, "tensor:max_abs_diff")
  local _, m = compare("tensor:max_abs_diff", a, b, 0, 0)
  return m
end

-- ==== lifetime ===================================================================================
function T.free(t)
  want_self(t, "tensor:free")
  check(C.tpsh_tensor_free(t), "tensor:free")
end

function T.record_stream(t, s)
  want_self(t, "tensor:record_stream")
  stream.want_stream(s, "tensor:record_stream")
  check(C.tpsh_record_stream(t, s), "tensor:record_stream")
end

-- ==== printing ===================================================================================
-- A preview like PyTorch's: at most 3 leading and 3 trailing entries per dimension, gathered on the
-- device (narrow + cat) so that printing a huge tensor reads only a few values.
local EDGE = 3
local function summarize(t)
  local cut = {}
  for d = 0, t.ndim - 1 do
    local n = tonumber(t.sizes[d])
    if n > 2 * EDGE then
      cut[d + 1] = true
      local head = wrap(checkp(C.tpsh_tensor_narrow(t, d, 0, EDGE), "tostring"))
      local tail = wrap(checkp(C.tpsh_tensor_narrow(t, d, n - EDGE, EDGE), "tostring"))
      t = M.cat({ head, tail }, d + 1)
    end
  end
  return t, cut
end

local function fmt_number(v, float)
  if not float then return ("%d"):format(v) end           -- v: a number, or an int64_t cdata (i64)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if v == math.floor(v) and math.abs(v) < 1e8 then return ("%.0f."):format(v) end
  return ("%.4g"):format(v)
end

local function tensor_tostring(t)
  local head = ("tensor(shape=[%s], dtype=%s, device=%s"):format(table.concat(props.shape(t), ", "),
    dtype_name[t.dtype_id], props.device_name(t))
  if C.tpsh_tensor_alive(t) == 0 then return head .. ", freed)" end
  -- print(t) reads t (on the current stream, then on the host), and a failure raises as any other
  -- read's does. It was shown inside the text: the read had taken the stream's error, so a failed
  -- collective printed as a line of output and the script went on and ended with status 0. In check
  -- mode the read is checked at the caller's line.
  if capi.locate then capi.locate() end
  local s, cut = summarize(t)
  local vals = totable(s, "tostring", true)
  local float = is_float[dtype_name[t.dtype_id]]
  if t.ndim == 0 then return head .. ")\n" .. fmt_number(vals, float) end
  local function render(v, d, indent)
    if d == t.ndim then
      local parts = {}
      for i = 1, #v do
        parts[#parts + 1] = fmt_number(v[i], float)
        if cut[d] and i == EDGE then parts[#parts + 1] = "..." end
      end
      return "[" .. table.concat(parts, ", ") .. "]"
    end
    local parts = {}
    for i = 1, #v do
      parts[#parts + 1] = render(v[i], d + 1, indent .. " ")
      if cut[d] and i == EDGE then parts[#parts + 1] = "..." end
    end
    return "[" .. table.concat(parts, ",\n" .. indent .. " ") .. "]"
  end
  return head .. ")\n" .. render(vals, 1, "")
end

-- ==== element-wise ops =============================================================================
-- tp.add ... tp.gelu, their methods (x:relu(), x:add_(y)), the arithmetic operators and t:expand live in
-- ops_pointwise.lua, which takes the helpers it shares with this file.
local pointwise = require("tpsh.ops_pointwise").attach(M, T, {
  want_self = want_self, new_like = new_like, made = made, int_operand = int_operand, wrap = wrap,
  is_int = is_int, is_int_dtype = function(id) return int_range[id] ~= nil end, want_no_hole = want_no_hole,
})

-- t[i] read nil, which a script then used as a value (a PyTorch habit): it is refused, with the calls
-- that do read elements.
local function no_subscript(k)
  raise("tensor[]", ("a tensor is not indexed with [] (got t[%s]): read elements with t:totable(), t:item() or "
    .. "t:select(dim, i):item(); make views with t:select and t:narrow"):format(capi.show(k)))
end

ffi.metatype("struct tpsh_tensor", {
  __index = capi.indexer(T, props, no_subscript),
  __newindex = capi.no_new_fields("tensor"),
  __tostring = tensor_tostring,
  __gc = (package.loaded["tpsh.native"] or {}).tensor_gc or C.tpsh_tensor_drop,
  __add = pointwise.add,
  __sub = pointwise.sub,
  __mul = pointwise.mul,
  __div = pointwise.div,
  __unm = pointwise.unm,
  __pow = pointwise.pow,
  __len = function(t) return t.ndim > 0 and tonumber(t.sizes[0]) or 0 end,
  -- (without these, LuaJIT's own "attempt to compare 'struct tpsh_tensor' ..." named no call and no way)
  __lt = function() raise("tensor <", "tensors are not ordered with < or <=; compare values with "
    .. "t:totable() or t:item(), or closeness with tp.allclose(a, b)") end,
  __le = function() raise("tensor <=", "tensors are not ordered with < or <=; compare values with "
    .. "t:totable() or t:item(), or closeness with tp.allclose(a, b)") end,
  __concat = function() raise("tensor ..", "a tensor is not concatenated with ..; tostring(t) .. s for its "
    .. "text, tp.cat to join tensors") end,
})

return M

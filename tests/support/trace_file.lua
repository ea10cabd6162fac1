-- trace_file.lua: what the specs of tp.trace share (trace_spec, range_spec): a strict JSON decoder of
-- their own (no dependency), trace files that every rank agrees on and rank 0 reads, and checks made on
-- rank 0 with their verdict on every rank. Not a spec itself (discovery takes *_spec.lua); a spec loads
-- it with dofile from its own directory.
local M = {}
-- ==== a small JSON decoder, strict enough to reject a broken file ====
local function decode_json(s)
  local pos = 1
  local function fail(what) error(("JSON: %s at byte %d: %q"):format(what, pos, s:sub(pos, pos + 20)), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    pos = pos + 1
    local out = {}
    while true do
      local c = s:sub(pos, pos)
      if c == "" then fail("unterminated string") end
      if c == '"' then pos = pos + 1; return table.concat(out) end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local map = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
        if map[e] then out[#out + 1] = map[e]; pos = pos + 2
        elseif e == "u" and s:sub(pos + 2, pos + 5):match("^%x%x%x%x$") then
          out[#out + 1] = string.char(tonumber(s:sub(pos + 2, pos + 5), 16) % 256); pos = pos + 6
        else fail("bad escape") end
      elseif c:byte() < 32 then fail("control character in string")
      else out[#out + 1] = c; pos = pos + 1 end
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local obj = {}
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return obj end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("expected a key") end
        local k = str(); ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        obj[k] = value(); ws()
        local d = s:sub(pos, pos); pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      local arr = {}
      pos = pos + 1; ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return arr end
      while true do
        arr[#arr + 1] = value(); ws()
        local d = s:sub(pos, pos); pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return nil
    else
      local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      if not num or num == "" then fail("unexpected character") end
      pos = pos + #num
      return tonumber(num)
    end
  end
  local v = value(); ws()
  if pos <= #s then fail("trailing characters") end
  return v
end

local function read_all(path)
  local f = assert(io.open(path))
  local s = f:read("*a")
  f:close()
  return s
end

-- A file name that every rank agrees on (rank 0 writes).
local function shared_tmp(ext)
  return tp.bcast(tp.rank == 0 and (os.tmpname() .. ext) or nil)
end

-- Traces fn() on every rank, writes the trace of all ranks (tp.trace.svg for ".svg", else save) and
-- returns the file's text on rank 0, which removes the file (nil on the other ranks). A file that
-- cannot be read gives text that says so, for the checks in on_rank0 to fail on (an error raised here,
-- on rank 0 alone, would leave the other ranks waiting in on_rank0).
local function traced_file(ext, fn)
  local path = shared_tmp(ext)
  tp.trace.start()
  fn()
  tp.trace.stop()
  if ext == ".svg" then tp.trace.svg(path) else tp.trace.save(path) end
  tp.barrier()
  if tp.rank ~= 0 then return nil end
  local ok, text = pcall(read_all, path)
  os.remove(path)
  return ok and text or ("(no trace file: " .. tostring(text) .. ")")
end

-- Runs check() on rank 0 (which reads what rank 0 wrote) and fails on every rank with its error.
local function on_rank0(check)
  local verdict = "ok"
  if tp.rank == 0 then
    local ok, err = pcall(check)
    if not ok then verdict = tostring(err) end
  end
  assert.are.equal("ok", tp.bcast(verdict))
end

M.decode_json, M.read_all, M.shared_tmp, M.traced_file, M.on_rank0 = decode_json, read_all, shared_tmp, traced_file,
  on_rank0
return M

-- repl.lua: the interactive session across ranks (`mpiexec -n N tpsh`, or `tpsh -i script.lua`).
--
-- Rank 0 reads a chunk (line editing, history and Ctrl-C come from src/host/repl*.c), every rank runs it
-- with its output captured, and rank 0 prints what each rank printed. The C side also carries the REPL's
-- messages between ranks on a private communicator and interrupts chunks; the header comments of
-- src/host/repl.c (which file does what), repl_term.c and repl_interrupt.c explain why those parts are
-- C and what Ctrl-C does under the launcher.
--
-- Output: each rank's whole output of a chunk (and its error, if any) is one unit; ranks whose units are
-- identical are shown once, prefixed with the collapsed ranks ([0-3], [0,2]), in the order of their
-- lowest rank. Whole outputs rather than single lines are compared so that one rank's lines are never
-- interleaved with another's: a multi-line result (a tensor, a table of timings) stays readable.
--
-- When no terminal is found (stdin is a pipe or a file), the whole input is one script, sent to every
-- rank and run there with its output left alone, as `tpsh script.lua` would.
local ffi = require "ffi"
local buffer = require "string.buffer"
local tp = require "tpsh"
local issued = require "tpsh.issued"

ffi.cdef [[
int tpsh_repl_term_open(const char *history_file);
void tpsh_repl_set_line_max(int64_t n);
int tpsh_repl_readline(const char *prompt, const char **line);
void tpsh_repl_history_add(const char *line);
void tpsh_repl_write(const char *s, int64_t n);
int tpsh_repl_start(double timeout);
void tpsh_repl_stop(int quit);
int tpsh_repl_post(const char *buf, int64_t len);
int64_t tpsh_repl_next(void **out);
int tpsh_repl_reply(const char *buf, int64_t len);
int tpsh_repl_collect(void **out, int64_t *lens);
void tpsh_repl_busy(int on, int every);
void tpsh_repl_tell_error(const char *msg, int64_t len);
void tpsh_repl_running(int on);
void tpsh_repl_free(void *p);
const char *tpsh_repl_hostname(void);
]]
local C = ffi.C

local M = {}

local PROMPT, CONTINUE = "tpsh> ", ">> "

-- ==== output capture ==============================================================================
-- print, io.write and io.stdout:write (also through a reference kept earlier) append to `capture` while
-- a chunk runs; outside chunks, and for other files, they behave as always (io.stderr too: it goes
-- straight to the terminal, uncaptured, as C code's own messages do).
--
-- Standard input belongs to the session: on rank 0 the reader thread of src/host/repl_interrupt.c reads
-- it (a chunk reading it would wait forever, beyond Ctrl-C's reach, while its keys go to the next
-- prompt), and other ranks have none. So during the session io.read, io.lines() and io.stdin:read/lines
-- raise an error on every rank instead; reading files works as always.
local capture
local real_print, real_iowrite, stdout = print, io.write, io.stdout
local real_ioread, real_iolines, stdin = io.read, io.lines, io.stdin
local real_osexit = os.exit
local file_methods = getmetatable(io.stdout).__index
local real_fwrite, real_fread, real_flines = file_methods.write, file_methods.read, file_methods.lines

local function put_values(sep, ...)
  for i = 1, select("#", ...) do
    if i > 1 then capture:put(sep) end
    capture:put(tostring((select(i, ...))))
  end
end

-- os.exit in a chunk ends the session, not the process: a rank that finalized MPI on its own would leave
-- the others waiting for its result (`:on 1 os.exit(0)`), and its REPL threads would still make MPI
-- calls while MPI finalizes (a segfault). So during the session os.exit records its status (reduced as
-- main.c's l_exit reduces it) and unwinds the chunk; after the command rank 0 ends the session on every
-- rank with that status (exit_status). A pcall in the chunk that catches the unwinding cannot keep the
-- session: the status stays recorded.
local exit_request            -- the status an os.exit of the current command asked for, or nil
local EXIT = setmetatable({}, { __tostring = function() return "os.exit" end })

local function session_exit(code)
  local c
  if code == nil then c = 0
  elseif type(code) == "boolean" then c = code and 0 or 1
  else
    c = tonumber(code)
    if not c then error("bad argument #1 to 'exit' (number expected, got " .. type(code) .. ")", 2) end
    c = c >= 0 and math.floor(c) or math.ceil(c)
  end
  exit_request = exit_request or (c == 0 and 0 or (c % 256 ~= 0 and c % 256 or 1))
  error(EXIT, 0)
end

local function install_capture()
  os.exit = session_exit
  print = function(...)
    if not capture then return real_print(...) end
    put_values("\t", ...)
    capture:put("\n")
  end
  io.write = function(...)
    if not capture or io.output() ~= stdout then return real_iowrite(...) end
    put_values("", ...)
    return stdout
  end
  file_methods.write = function(f, ...)
    if not capture or f ~= stdout then return real_fwrite(f, ...) end
    put_values("", ...)
    return f
  end
  local function no_stdin(name)
    error(name .. ": the interactive session owns standard input; read a file instead", 3)
  end
  io.read = function(...)
    if io.input() == stdin then no_stdin("io.read") end
    return real_ioread(...)
  end
  io.lines = function(name, ...)
    if name == nil and io.input() == stdin then no_stdin("io.lines") end
    return real_iolines(name, ...)
  end
  file_methods.read = function(f, ...)
    if f == stdin then no_stdin("io.stdin:read") end
    return real_fread(f, ...)
  end
  file_methods.lines = function(f, ...)
    if f == stdin then no_stdin("io.stdin:lines") end
    return real_flines(f, ...)
  end
end

local function remove_capture()
  print, io.write, io.read, io.lines, os.exit = real_print, real_iowrite, real_ioread, real_iolines, real_osexit
  file_methods.write, file_methods.read, file_methods.lines = real_fwrite, real_fread, real_flines
end

-- ==== running a command on one rank ===============================================================
-- Never raises: an error object's __tostring may itself fail (or return something else than a string).
local function err_message(e)
  if type(e) == "string" then return e end
  local mt = getmetatable(e)
  if mt and mt.__tostring then
    local ok, s = pcall(tostring, e)
    if ok and type(s) == "string" then return s end
    return "(error object is a " .. type(e) .. " value; its __tostring failed: " ..
      (type(s) == "string" and s or type(s) .. " value") .. ")"
  end
  return "(error object is a " .. type(e) .. " value)"
end

local function selected(ranks)
  if not ranks then return true end
  for _, r in ipairs(ranks) do if r == tp.rank then return true end end
  return false
end

local function ms(x) return ("%.3f ms"):format(x) end
local function identity(...) return ... end

-- Runs req.code under the interrupt flag. Returns the error message or nil; puts values, timing into
-- the capture. The outer pcall catches an interrupt that lands between the chunk's end and the flag's
-- reset (the hook only fires while the flag is set, but the flag is reset from Lua).
local function run_chunk(req)
  local f, err = load(req.code, "=stdin")
  if not f then return err end
  -- LuaJIT does not check hooks inside compiled traces, so an interrupt could never stop a loop typed
  -- here once it is compiled: what is typed at the prompt (and every function it defines) runs in the
  -- interpreter. Modules, scripts and tpsh itself are compiled as usual.
  if jit then jit.off(f, true) end
  local ev0, ev1, t0, t1
  if req.time then
    ev0, ev1 = tp.event { timing = true }, tp.event { timing = true }
    ev0:record()
  end
  local res, parts, fok, ferr = nil, nil, true, nil
  local ok, e = pcall(function()
    C.tpsh_repl_running(1)
    t0 = tp.now()
    res = { n = 0 }
    res = (function(ok2, ...)
      return { ok = ok2, n = select("#", ...), ... }
    end)(xpcall(f, function(m) return err_message(m) end, identity))
    t1 = tp.now()
    -- A value's __tostring runs user code too, and may fail: formatted apart, under pcall. Still
    -- "running": printing a tensor reads it, a host wait that may hang behind a collective that not
    -- every rank issued (`t:sum()` after `:on 0 g:all_reduce(t)`). Marked done before this, rank 0
    -- would count as finished (the divergence line would name the other ranks as the ones still
    -- running) and Ctrl-C would not interrupt the wait.
    if res.ok and req.expr and res.n > 0 then
      parts = {}
      fok, ferr = pcall(function()
        for i = 1, res.n do
          local s = tostring(res[i])
          if type(s) ~= "string" then error("'__tostring' must return a string", 0) end
          parts[i] = s
        end
      end)
      if not fok then parts = nil end
    end
    C.tpsh_repl_running(0)
  end)
  C.tpsh_repl_running(0)
  if not ok then return err_message(e) end
  if not res.ok then return res[1] end
  if not fok then return err_message(ferr) end
  if parts then capture:put(table.concat(parts, "\t"), "\n") end
  if req.time then
    local dev = "?"
    local tok, terr = pcall(function()
      ev1:record()
      ev1:synchronize()
      dev = ms(ev0:elapsed(ev1))
    end)
    if not tok then dev = "? (" .. err_message(terr) .. ")" end
    capture:put("host ", ms(t1 - t0), ", device ", dev, " (current stream)\n")
  end
  return nil
end

-- One command on this rank: returns { out = captured text, err = message or nil }.
local function execute(req)
  capture = buffer.new()
  exit_request = nil
  local err
  if req.cmd == "ranks" then
    capture:put(("host %s, backend %s, device %d, local rank %d of %d\n"):format(
      ffi.string(C.tpsh_repl_hostname()), tp.backend, tp.device, tp.local_rank, tp.size))
  elseif selected(req.ranks) then
    err = run_chunk(req)
    if err and not req.ranks and not exit_request then C.tpsh_repl_tell_error(err, #err) end   -- for rank 0's divergence line
  end
  C.tpsh_repl_running(0)        -- also on ranks that :on left out: rank 0 then starts the straggler clock
  local out = capture:tostring()
  capture = nil
  if exit_request then err = nil end            -- (the unwinding's error, or what a pcall made of it)
  -- (the collectives this rank has issued: rank 0 compares every rank's after each command)
  return { out = out, err = err, exit = exit_request,
           colls = tp.size > 1 and req.cmd ~= "ranks" and issued.mine() or nil }
end

-- The status that the command's os.exit calls ask the session to end with (the lowest rank's non-zero
-- one, else 0), and a line naming them; nil when no rank called os.exit.
local function exit_status(results)
  local code, ranks, codes = nil, {}, {}
  for r = 0, #results - 1 do
    local c = results[r + 1].exit
    if c then
      ranks[#ranks + 1], codes[#codes + 1] = r, c
      if code == nil or (code == 0 and c ~= 0) then code = c end
    end
  end
  if code == nil then return nil end
  return code, ("tpsh: os.exit on rank(s) %s: ending the session on every rank with status %d\n")
    :format(table.concat(ranks, ","), code)
end

-- ==== showing the results on rank 0 ===============================================================
-- {0,1,2,5} -> "0-2,5"
local function rank_list(ranks)
  local parts, i = {}, 1
  while i <= #ranks do
    local j = i
    while j < #ranks and ranks[j + 1] == ranks[j] + 1 do j = j + 1 end
    parts[#parts + 1] = j - i >= 1 and (ranks[i] .. "-" .. ranks[j]) or tostring(ranks[i])
    i = j + 1
  end
  return table.concat(parts, ",")
end
M._rank_list = rank_list

local function show(results)
  local groups, order = {}, {}
  for r = 0, #results - 1 do
    local res = results[r + 1]
    if res.out ~= "" or res.err then
      local key = res.out .. "\0" .. (res.err or "")
      local g = groups[key]
      if not g then g = { res = res, ranks = {} }; groups[key] = g; order[#order + 1] = g end
      g.ranks[#g.ranks + 1] = r
    end
  end
  local b = buffer.new()
  for _, g in ipairs(order) do
    local prefix = "[" .. rank_list(g.ranks) .. "] "
    local text = g.res.out
    if g.res.err then
      if text ~= "" and text:sub(-1) ~= "\n" then text = text .. "\n" end
      text = text .. "error: " .. g.res.err
    end
    for line in (text:sub(-1) == "\n" and text or text .. "\n"):gmatch("(.-)\n") do
      b:put(prefix, line, "\n")
    end
  end
  if #b > 0 then C.tpsh_repl_write(b:ref(), #b) end
end

local function say(s) C.tpsh_repl_write(s, #s) end

-- After each command, rank 0 compares what the ranks have issued on each group (tpsh.issued), as the
-- test runner does after each test: a collective that not every member called (on a stream, the
-- command returns everywhere) waits for the others, and each later one on the group is then paired with
-- the wrong call; one called differently (a reduce op, a root) may complete with results not to be
-- trusted. Neither raises anywhere without check mode. state: { seen = issued.different's record,
-- said = the uneven counts last said, not repeated while they stand }.
local function compare_issued(results, state)
  local groups = issued.listed(results)
  local uneven, lines = issued.uneven(groups), {}
  -- The collective watchdog runs in the session too: a collective left waiting ends the session once it
  -- has waited the timeout, at the prompt as well, which is said here before it happens.
  for _, gr in ipairs(uneven or {}) do
    lines[#lines + 1] = ("tpsh: the ranks have issued different numbers of collectives on group %s (world ranks %s): "
      .. "%s. The ones that not every rank called wait for the others, and each later one on the group will be "
      .. "paired with the wrong call; the watchdog ends the session once one has waited %g s (--timeout)\n")
      :format(gr.id, gr.ranks, issued.counts_text(gr), tp.check.timeout())
  end
  local text = table.concat(lines)
  if text ~= "" and text ~= state.said then say(text) end
  state.said = text
  local skip = {}        -- (the groups with uneven counts: compared again once they have caught up)
  for _, gr in ipairs(uneven or {}) do skip[gr.key] = true end
  for _, f in ipairs(issued.different(groups, state.seen, skip) or {}) do
    say(("tpsh: in this command the ranks issued different collectives on group %s (world ranks %s): as many as "
      .. "each other, but rank %d's and rank %d's differ in the kind, element type, count, root or reduce op of at "
      .. "least one. MPI or NCCL completed them, so their results are not to be trusted (--check names the call)\n")
      :format(f.group.id, f.group.ranks, f.a, f.b))
  end
end

-- ==== reading commands on rank 0 ==================================================================
-- Returns the source to run and whether it is an expression, or nil and "incomplete", or nil and a
-- syntax error. As luajit.c does: `=expr` means `return expr`; a chunk that compiles as `return chunk`
-- is an expression; a syntax error at '<eof>' means the chunk goes on.
-- An expression runs as `return (...)(expr)`, the chunk's argument being a function that returns its
-- arguments: unlike `return expr`, that is no tail call, so an error raised by a function called there
-- still names its position ("stdin:1: boom"). The `)` goes on the expression's last line, where LuaJIT
-- places the expression's own instructions (an index of nil on the line after it read "stdin:2" for a
-- one-line chunk); only when a trailing comment would eat it does it go on a line of its own.
-- Whether the chunk is incomplete is asked of `return chunk` as well as of the chunk: `=1 +` and `1 +`
-- go on at the next line, where the wrapped form fails near the `)` and the statement near the `1`.
local function eof_error(err) return err:sub(-7) == "'<eof>'" end
local function compile(src)
  local forced = src:sub(1, 1) == "="
  if forced then src = src:sub(2) end
  -- (`return (...)()` compiles: `=` alone printed nothing at all)
  if forced and not src:match("%S") then return nil, "tpsh: = expects an expression after it, e.g. =tp.rank" end
  for _, close in ipairs { ")", "\n)" } do
    local expr = "return (...)(" .. src .. close
    if load(expr, "=stdin") then return expr, true end
  end
  local _, rerr = load("return " .. src, "=stdin")      -- (no error for `;`, which `return ;` takes)
  if rerr and eof_error(rerr) then return nil, "incomplete" end
  if forced then                                 -- `=` promised an expression: its error, not a statement's
    return nil, rerr or select(2, load("return (...)(" .. src .. "\n)", "=stdin"))
  end
  local f, err = load(src, "=stdin")
  if f then return src, src:match("^%s*return[%s;]") ~= nil end
  if eof_error(err) then return nil, "incomplete" end
  return nil, err
end
M._compile = compile

local function parse_ranks(spec)
  local ranks, seen = {}, {}
  local bad = "bad rank list '" .. spec .. "' (expected e.g. 1,3 or 0-2)"
  if not spec:match("^[^,]") or not spec:match("[^,]$") or spec:find(",,", 1, true) then return nil, bad end
  for item in spec:gmatch("[^,]+") do
    local sa, sb = item:match("^(%d+)%-(%d+)$")
    if not sa then sa = item:match("^%d+$"); sb = sa end
    local a, b = tonumber(sa), tonumber(sb)
    if not a or b < a then return nil, bad end
    -- the rank as typed: a number too large for an integer would print as garbage through %d
    if b >= tp.size then
      local bad = a >= tp.size and sa or sb
      return nil, ("rank %s does not exist (ranks 0-%d)"):format(bad, tp.size - 1)
    end
    for r = a, b do
      if not seen[r] then seen[r] = true; ranks[#ranks + 1] = r end
    end
  end
  table.sort(ranks)
  return ranks
end

-- The :commands, one row each, in the order :help lists them: name (and a short alias), the usage and
-- the line :help shows, and the handler. A handler gets the rest of the line and the request being made;
-- it returns the request to send to every rank, nil when there is nothing to run (it has said why), or
-- the chunk that follows the command on the line (the request then carries the command's options, and
-- the chunk is read as any other, continuation lines included).
local HELP
local COMMANDS = {
  { name = "on", usage = ":on 1,3 chunk",
    help = "run it on ranks 1 and 3 only (ranges too: :on 0-2); the others stay in step",
    run = function(rest, req)
      local spec, chunk = rest:match("^(%S+)%s*(.*)$")
      if not spec or not chunk:match("%S") then
        say("tpsh: :on: expected a rank list and a chunk, e.g. :on 1,3 print(tp.rank)\n"); return nil
      end
      local ranks, err = parse_ranks(spec)
      if not ranks then say("tpsh: :on: " .. err .. "\n"); return nil end
      req.ranks = ranks
      return chunk
    end },
  { name = "time", usage = ":time chunk",
    help = "run it and show, per rank, host time and device time (events on the current stream)",
    run = function(rest, req)
      -- nothing to time: a usage line, as :on gives, rather than 0.000 ms of an empty chunk on every rank
      if not rest:match("%S") then say("tpsh: :time: expected a chunk, e.g. :time x:add_(y)\n"); return nil end
      req.time = true
      return rest
    end },
  { name = "ranks", usage = ":ranks", help = "rank, host, backend and device of every rank",
    run = function() return { cmd = "ranks" } end },
  { name = "help", alias = "h", usage = ":help", help = "this text",
    run = function() say(HELP .. "\n"); return nil end },
  { name = "quit", alias = "q", usage = ":quit", help = "end the session on every rank (Ctrl-D too)",
    run = function() return { cmd = "quit" } end },
}
local COMMAND = {}            -- name or alias -> row
for _, c in ipairs(COMMANDS) do
  COMMAND[c.name] = c
  if c.alias then COMMAND[c.alias] = c end
end

HELP = (function()
  local b = buffer.new()
  b:put("Every rank runs what you type; rank 0 shows each rank's output prefixed [rank], identical outputs once.\n")
  b:putf("  %-16s %s\n", "chunk", "run a Lua chunk on every rank (a bare expression or =expr prints its value)")
  for _, c in ipairs(COMMANDS) do b:putf("  %-16s %s\n", c.usage, c.help) end
  b:put([[
A chunk that is not complete continues on the next line (prompt >>). Ctrl-C discards the line being
typed, or interrupts the running chunk on every rank; a rank blocked outside Lua (in a collective that
not every rank entered) cannot be interrupted: a second Ctrl-C then ends the session. With --timeout S
(TPSH_TIMEOUT), ranks still running S seconds after the first one finished are interrupted the same way.]])
  return b:tostring()
end)()

local linep = ffi.new("const char *[1]")

-- Returns the next request for every rank ({cmd = "run" | "ranks" | "quit", ...}), or nil after a
-- command that only rank 0 answers.
local function read_request()
  local prompt, lines, req = PROMPT, {}, nil
  while true do
    local rc = C.tpsh_repl_readline(prompt, linep)
    if rc == 0 then return { cmd = "quit" } end
    if rc == 2 then return nil end                        -- Ctrl-C: the chunk being typed is dropped
    local line = ffi.string(linep[0])
    if line:match("%S") then C.tpsh_repl_history_add(line) end
    if not req then
      req = { cmd = "run" }
      local word, rest = line:match("^%s*:(%a+)%s*(.-)%s*$")
      if word then
        local c = COMMAND[word]
        if not c then say("tpsh: unknown command :" .. word .. " (:help lists them)\n"); return nil end
        local r = c.run(rest, req)
        if type(r) ~= "string" then return r end
        line = r
      elseif not line:match("%S") then
        return nil
      end
    end
    lines[#lines + 1] = line
    local src, expr = compile(table.concat(lines, "\n"))
    if src then
      req.code, req.expr = src, expr
      return req
    elseif expr ~= "incomplete" then
      say(expr .. "\n")
      return nil
    end
    prompt = CONTINUE
  end
end

-- ==== the sessions ================================================================================
local function script_mode()
  local src = tp.bcast(tp.rank == 0 and io.read("*a") or nil)
  local f, err = load(src, "=stdin")
  if not f then error(err, 0) end
  f()
  return 0
end

local function rank0_loop()
  say(("tpsh %s on %d rank%s (%s). :help lists the commands; Ctrl-D ends the session.\n"):format(
    tp.version or "?", tp.size, tp.size == 1 and "" or "s", tp.backend))
  local outp, lens = ffi.new("void *[1]"), ffi.new("int64_t[?]", tp.size)
  local compared = { seen = {}, said = "" }
  while true do
    local req = read_request()
    if req then
      local msg = buffer.encode(req)
      C.tpsh_repl_post(msg, #msg)
      if req.cmd == "quit" then return end
      C.tpsh_repl_busy(1, (req.cmd == "run" and not req.ranks) and 1 or 0)
      local results = { execute(req) }
      C.tpsh_repl_collect(outp, lens)
      C.tpsh_repl_busy(0, 0)
      local base, at = ffi.cast("const char *", outp[0]), 0
      for r = 1, tp.size - 1 do
        results[r + 1] = buffer.decode(ffi.string(base + at, lens[r]))
        at = at + tonumber(lens[r])
      end
      C.tpsh_repl_free(outp[0])
      show(results)
      if tp.size > 1 and req.cmd ~= "ranks" then compare_issued(results, compared) end
      local code, line = exit_status(results)
      if code then
        say(line)
        msg = buffer.encode { cmd = "quit", status = code }
        C.tpsh_repl_post(msg, #msg)
        return code
      end
    end
  end
end

local function worker_loop()
  local outp = ffi.new("void *[1]")
  while true do
    local n = C.tpsh_repl_next(outp)
    local req = buffer.decode(ffi.string(outp[0], n))
    C.tpsh_repl_free(outp[0])
    if req.cmd == "quit" then return req.status or 0 end
    local msg = buffer.encode(execute(req))
    C.tpsh_repl_reply(msg, #msg)
  end
end

function M.main(args)
  local interactive = false
  if tp.rank == 0 then
    local home = os.getenv("HOME")
    local hist = os.getenv("TPSH_HISTORY")
    if hist == "" then hist = nil end                     -- set but empty: the default, as for all TPSH_*
    hist = hist or (home and home ~= "" and home .. "/.tpsh_history") or nil
    -- the longest line the session takes (bytes; src/host/repl_input.c's long lines), 16 MiB by default
    local max = os.getenv("TPSH_REPL_LINE_MAX")
    if max and max ~= "" then
      local n = tonumber(max)
      if not n or n < 1 or n ~= math.floor(n) then
        error("TPSH_REPL_LINE_MAX: expected a number of bytes (a positive integer), got '" .. max .. "'", 0)
      end
      C.tpsh_repl_set_line_max(n)
    end
    interactive = C.tpsh_repl_term_open(hist) == 1
  end
  if not tp.bcast(interactive) then return script_mode() end
  C.tpsh_repl_start(tonumber(tp.config.timeout) or 0)
  install_capture()
  local ok, err = pcall(tp.rank == 0 and rank0_loop or worker_loop)
  remove_capture()
  C.tpsh_repl_stop(ok and 1 or 0)
  if not ok then error(err, 0) end
  return err or 0              -- (the status of an os.exit, which every rank has: main.c ends with it)
end

return M

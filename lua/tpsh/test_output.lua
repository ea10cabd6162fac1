-- tpsh.test_output: the formatters of `tpsh test` (busted's utfTerminal, plainTerminal, TAP, junit, json
-- and gtest).
--
-- The runner (tpsh.test) hands every formatter the same records, already merged across ranks:
--   rec = { name =, classname =, file =, line =, status = "pass"|"fail"|"skip",
--           ranks = {failing ranks}, failures = {{msg =, ranks = {...}}, ...},
--           reason = (pending text), time = (seconds, max over ranks) }
-- A formatter is { start(info), result(rec), finish(summary) } and writes through `out`, which the
-- runner makes a no-op on every rank but 0. Every text format ends with the line
-- "N passed, N failed, N skipped" so that scripts and the runner's own spec can rely on it; junit and
-- json are documents, whole on standard output, with nothing after them (a line after the XML would make
-- it invalid). A failure's record names its ranks in every format.

local M = {}

local concat, fmt = table.concat, string.format

---------------------------------------------------------------------------------------------------
-- Helpers shared by the formats
---------------------------------------------------------------------------------------------------

-- {0,1,2,5,7,8} -> "0-2,5,7,8": runs of three or more collapse into a range, as the REPL does.
function M.ranks_str(ranks)
  local parts, i, n = {}, 1, #ranks
  while i <= n do
    local j = i
    while j < n and ranks[j + 1] == ranks[j] + 1 do j = j + 1 end
    if j - i >= 2 then
      parts[#parts + 1] = ranks[i] .. "-" .. ranks[j]
    else
      for k = i, j do parts[#parts + 1] = tostring(ranks[k]) end
    end
    i = j + 1
  end
  return "[" .. concat(parts, ",") .. "]"
end

function M.summary_line(s)
  return fmt("%d passed, %d failed, %d skipped", s.passed, s.failed, s.skipped)
end

local function indent(text, pad)
  return pad .. tostring(text):gsub("\n", "\n" .. pad)
end

-- The failure text of a record: one message per distinct text, each naming its ranks. With a world
-- of one rank the rank header is noise, so it is left out.
local function failure_text(rec, size)
  if #rec.failures == 1 and size == 1 then return rec.failures[1].msg end
  local parts = {}
  for _, f in ipairs(rec.failures) do
    parts[#parts + 1] = "on rank" .. (#f.ranks > 1 and "s " or " ") .. M.ranks_str(f.ranks) .. ":\n"
      .. indent(f.msg, "  ")
  end
  return concat(parts, "\n")
end
M.failure_text = failure_text

-- The first line of a record's first failure message: the short form (plain's recap, junit's message).
-- A message whose first line only announces what follows ("the stream sanitizer reported:") brings
-- its second along: the recap line said nothing else.
local function first_line(rec)
  local msg = rec.failures[1] and rec.failures[1].msg or ""
  local first, second = msg:match("^([^\n]*):\n%s*([^\n]+)")
  if first then return first .. ": " .. second end
  return msg:match("^[^\n]*")
end

local function where(rec)
  return rec.file and (rec.file .. ((rec.line or 0) > 0 and (":" .. rec.line) or "")) or "?"
end

local function seconds(t) return fmt("%.3f", t or 0) end

-- utf's and plain's first line when the order was shuffled ("" when it was not)
local function seed_line(info)
  if not info.seed then return "" end
  return fmt("Randomized with seed %d (rerun with --shuffle --seed %d)\n", info.seed, info.seed)
end

---------------------------------------------------------------------------------------------------
-- Failure records: outcomes merged across ranks
---------------------------------------------------------------------------------------------------

-- entries: list of {rank, msg} -> ranks (sorted), failures {{msg, ranks}} in order of first rank.
function M.merge(entries)
  table.sort(entries, function(x, y) return x[1] < y[1] end)
  local ranks, failures, by_msg = {}, {}, {}
  for _, e in ipairs(entries) do
    if ranks[#ranks] ~= e[1] then ranks[#ranks + 1] = e[1] end
    -- Table addresses in luassert's messages differ from rank to rank; they must not split a
    -- message that is otherwise the same.
    local key = e[2]:gsub("0x%x+", "0x?")
    local f = by_msg[key]
    if not f then f = { msg = e[2], ranks = {} }; by_msg[key] = f; failures[#failures + 1] = f end
    if f.ranks[#f.ranks] ~= e[1] then f.ranks[#f.ranks + 1] = e[1] end
  end
  return ranks, failures
end

function M.fail_record(name, classname, file, line, entries, time)
  local ranks, failures = M.merge(entries)
  return { name = name, classname = classname, file = file, line = line, status = "fail",
           ranks = ranks, failures = failures, time = time or 0 }
end

---------------------------------------------------------------------------------------------------
-- utf: busted's utfTerminal, one symbol per test while running, details at the end
---------------------------------------------------------------------------------------------------

local function utf(out, opts)
  local c = opts.color and {
    pass = "\27[32m", fail = "\27[31m", skip = "\27[33m", bold = "\27[1m", off = "\27[0m",
  } or { pass = "", fail = "", skip = "", bold = "", off = "" }
  local sym = { pass = "●", fail = "◼", skip = "○" }
  local fails, skips, info = {}, {}, nil
  local self = {}
  function self.start(i)
    info = i
    out(seed_line(i))
  end
  function self.result(rec)
    out(c[rec.status] .. sym[rec.status] .. c.off)
    if rec.status == "fail" then fails[#fails + 1] = rec
    elseif rec.status == "skip" then skips[#skips + 1] = rec end
  end
  function self.finish(s)
    out("\n")
    for _, rec in ipairs(skips) do
      out(fmt("\n%sPending → %s%s\n%s\n", c.skip, where(rec), c.off, rec.name))
      if rec.reason and rec.reason ~= "" and rec.reason ~= rec.name then out(indent(rec.reason, "  ") .. "\n") end
    end
    for _, rec in ipairs(fails) do
      out(fmt("\n%sFailure → %s%s\n%s%s %s%s\n%s\n", c.fail, where(rec), c.off, c.bold, rec.name,
        M.ranks_str(rec.ranks), c.off, failure_text(rec, info.size)))
    end
    out(fmt("\n%d test%s in %s s on %d rank%s\n", s.total, s.total == 1 and "" or "s", seconds(s.time),
      info.size, info.size == 1 and "" or "s"))
    out(M.summary_line(s) .. "\n")
  end
  return self
end

---------------------------------------------------------------------------------------------------
-- plain: one line per test as it finishes; failure details indented under their FAIL line
---------------------------------------------------------------------------------------------------

-- With failures, a recap ("Failed:", one line each) comes just before the summary: a log that keeps
-- only its last lines (a CI job's, `| tail`) still names what failed and where.
local function plain(out)
  local info, fails = nil, {}
  local self = {}
  function self.start(i)
    info = i
    out(seed_line(i))
  end
  function self.result(rec)
    if rec.status == "pass" then
      out("PASS " .. rec.name .. "\n")
    elseif rec.status == "skip" then
      out("SKIP " .. rec.name .. "\n")
    else
      out(fmt("FAIL %s %s\n    at %s\n%s\n", rec.name, M.ranks_str(rec.ranks), where(rec),
        indent(failure_text(rec, info.size), "    ")))
      fails[#fails + 1] = rec
    end
  end
  function self.finish(s)
    if #fails > 0 then
      out(fmt("Failed (%d):\n", #fails))
      for _, rec in ipairs(fails) do
        local at = where(rec)
        local first = first_line(rec)
        if first:sub(1, #at + 2) == at .. ": " then first = first:sub(#at + 3) end  -- said once
        out(fmt("  %s %s at %s: %s\n", rec.name, M.ranks_str(rec.ranks), at, first))
      end
    end
    out(M.summary_line(s) .. "\n")
  end
  return self
end

---------------------------------------------------------------------------------------------------
-- tap: TAP version 13; the plan goes last because load and teardown failures add entries
---------------------------------------------------------------------------------------------------

-- A "#" in a description would start a TAP directive (tags are "#slow"): escape it, as TAP 13 says.
local function tap_desc(s) return (s:gsub("\\", "\\\\"):gsub("#", "\\#"):gsub("\n", " ")) end

local function tap(out)
  local n, info = 0, nil
  local self = {}
  function self.start(i)
    info = i
    out("TAP version 13\n")
    if i.seed then out(fmt("# Randomized with seed %d\n", i.seed)) end
  end
  function self.result(rec)
    n = n + 1
    if rec.status == "pass" then
      out(fmt("ok %d - %s\n", n, tap_desc(rec.name)))
    elseif rec.status == "skip" then
      local reason = rec.reason and rec.reason ~= rec.name and (" " .. tap_desc(rec.reason)) or ""
      out(fmt("ok %d - %s # SKIP%s\n", n, tap_desc(rec.name), reason))
    else
      out(fmt("not ok %d - %s\n  ---\n  ranks: %s\n  at: %s\n  duration_ms: %.1f\n  message: |\n%s\n  ...\n",
        n, tap_desc(rec.name), M.ranks_str(rec.ranks), where(rec), (rec.time or 0) * 1000,
        indent(failure_text(rec, info.size), "    ")))
    end
  end
  function self.finish(s)
    out(fmt("1..%d\n", n))
    out(M.summary_line(s) .. "\n")
  end
  return self
end

---------------------------------------------------------------------------------------------------
-- junit: one testsuite; written whole at the end (its attributes need the totals)
---------------------------------------------------------------------------------------------------

local clean = require("tpsh.utf8").clean   -- bytes that are not well-formed UTF-8 become U+FFFD

-- XML 1.0 allows neither most control characters nor unescaped markup in attributes or text, and the
-- file says it is UTF-8: a name or message with other bytes would make it unreadable.
local function xml_escape(s)
  s = clean(tostring(s)):gsub("[%z\1-\8\11\12\14-\31]", "")
  return (s:gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
    ['"'] = "&quot;", ["'"] = "&apos;" }))
end
M.xml_escape = xml_escape

function M.junit_xml(records, s, info)
  local b = { '<?xml version="1.0" encoding="UTF-8"?>\n' }
  local function add(...) for i = 1, select("#", ...) do b[#b + 1] = select(i, ...) end end
  add(fmt('<testsuites tests="%d" failures="%d" errors="0" skipped="%d" time="%s">\n',
    s.total, s.failed, s.skipped, seconds(s.time)))
  add(fmt('  <testsuite name="tpsh" tests="%d" failures="%d" errors="0" skipped="%d" time="%s" timestamp="%s">\n',
    s.total, s.failed, s.skipped, seconds(s.time), os.date("!%Y-%m-%dT%H:%M:%S")))
  add('    <properties>\n', fmt('      <property name="ranks" value="%d"/>\n', info.size))
  if info.seed then add(fmt('      <property name="seed" value="%d"/>\n', info.seed)) end
  add('    </properties>\n')
  for _, rec in ipairs(records) do
    add(fmt('    <testcase classname="%s" name="%s" file="%s" line="%s" time="%s"',
      xml_escape(rec.classname or ""), xml_escape(rec.name), xml_escape(rec.file or ""),
      rec.line or 0, seconds(rec.time)))
    if rec.status == "pass" then
      add('/>\n')
    elseif rec.status == "skip" then
      add('>\n', fmt('      <skipped message="%s"/>\n', xml_escape(rec.reason or "pending")), '    </testcase>\n')
    else
      local first = first_line(rec)
      add('>\n', fmt('      <failure message="%s" type="failure">%s</failure>\n',
        xml_escape("ranks " .. M.ranks_str(rec.ranks) .. ": " .. first),
        xml_escape(failure_text(rec, info.size))), '    </testcase>\n')
    end
  end
  add('  </testsuite>\n</testsuites>\n')
  return concat(b)
end

local function junit(out)
  local records, info = {}, nil
  local self = {}
  function self.start(i) info = i end
  function self.result(rec) records[#records + 1] = rec end
  function self.finish(s) out(M.junit_xml(records, s, info)) end
  return self
end

---------------------------------------------------------------------------------------------------
-- json: busted's document (successes, failures, errors, pendings, duration), each element with its ranks
---------------------------------------------------------------------------------------------------

local function json_string(s)
  return '"' .. clean(tostring(s)):gsub('[%c"\\]', function(c)
    local named = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r" }
    return named[c] or fmt("\\u%04x", c:byte())
  end) .. '"'
end

-- v: a string, number, boolean, list (a table with [1], or empty when marked) or object
local EMPTY_LIST = {}
local function json(v)
  local t = type(v)
  if t == "string" then return json_string(v) end
  if t == "number" then return v ~= v and "null" or fmt("%.17g", v) end
  if t == "boolean" then return tostring(v) end
  if t ~= "table" then return "null" end
  if v == EMPTY_LIST or v[1] ~= nil then
    local parts = {}
    for i = 1, #v do parts[i] = json(v[i]) end
    return "[" .. concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = json_string(k) .. ":" .. json(v[k]) end
  return "{" .. concat(parts, ",") .. "}"
end
M.json = json

local function json_element(rec, size)
  local e = { name = rec.name, element = { name = rec.name, trace = { short_src = rec.file or "?",
    currentline = rec.line or 0 } }, duration = rec.time or 0 }
  if rec.status == "fail" then
    e.message = failure_text(rec, size)
    e.ranks = #rec.ranks > 0 and rec.ranks or EMPTY_LIST
    e.failures = {}
    for i, f in ipairs(rec.failures) do e.failures[i] = { message = f.msg, ranks = f.ranks } end
  elseif rec.status == "skip" then
    e.message = rec.reason or "pending"
  end
  return e
end

local function json_out(out)
  local info, lists = nil, { successes = {}, failures = {}, pendings = {} }
  local self = {}
  function self.start(i) info = i end
  function self.result(rec)
    local l = rec.status == "pass" and lists.successes or rec.status == "fail" and lists.failures or lists.pendings
    l[#l + 1] = json_element(rec, info.size)
  end
  function self.finish(s)
    local doc = { duration = s.time or 0, ranks = info.size, errors = EMPTY_LIST }
    for k, l in pairs(lists) do doc[k] = #l > 0 and l or EMPTY_LIST end
    if info.seed then doc.seed = info.seed end
    out(json(doc) .. "\n")
  end
  return self
end

---------------------------------------------------------------------------------------------------
-- gtest: busted's Google Test style lines
---------------------------------------------------------------------------------------------------

local function gtest(out)
  local info, fails, skips = nil, {}, {}
  local self = {}
  local function plural(n, w) return n .. " " .. w .. (n == 1 and "" or "s") end
  function self.start(i)
    info = i
    out(seed_line(i))
    out("[==========] Running tests from scanned files.\n[----------] Global test environment setup.\n")
  end
  function self.result(rec)
    local ms = (rec.time or 0) * 1000
    out(fmt("[ RUN      ] %s\n", rec.name))
    if rec.status == "pass" then out(fmt("[       OK ] %s (%.2f ms)\n", rec.name, ms))
    elseif rec.status == "skip" then skips[#skips + 1] = rec; out(fmt("[ SKIPPED  ] %s (%.2f ms)\n", rec.name, ms))
    else
      fails[#fails + 1] = rec
      out(fmt("%s\n[  FAILED  ] %s %s (%.2f ms)\n", indent(failure_text(rec, info.size), "  "), rec.name,
        M.ranks_str(rec.ranks), ms))
    end
  end
  function self.finish(s)
    out(fmt("[----------] Global test environment teardown.\n[==========] %s ran. (%.2f ms total)\n",
      plural(s.total, "test"), (s.time or 0) * 1000))
    out(fmt("[  PASSED  ] %s.\n", plural(s.passed, "test")))
    if #skips > 0 then
      out(fmt("[ SKIPPED  ] %s, listed below:\n", plural(#skips, "test")))
      for _, rec in ipairs(skips) do out(fmt("[ SKIPPED  ] %s\n", rec.name)) end
    end
    if #fails > 0 then
      out(fmt("[  FAILED  ] %s, listed below:\n", plural(#fails, "test")))
      for _, rec in ipairs(fails) do out(fmt("[  FAILED  ] %s %s\n", rec.name, M.ranks_str(rec.ranks))) end
    end
    out(M.summary_line(s) .. "\n")
  end
  return self
end

---------------------------------------------------------------------------------------------------

M.formats = { utf = utf, plain = plain, tap = tap, junit = junit, json = json_out, gtest = gtest }

-- busted's names of the formats, and tpsh's own short ones
local NAMES = { utfTerminal = "utf", plainTerminal = "plain", TAP = "tap", utf = "utf", plain = "plain",
  tap = "tap", junit = "junit", json = "json", gtest = "gtest" }
function M.canonical(name) return NAMES[name] end

-- out: function(string) that writes (and flushes) the text; opts.color for utf.
function M.new(name, out, opts)
  local make = M.formats[name]
  if not make then return nil end
  return make(out, opts or {})
end

return M

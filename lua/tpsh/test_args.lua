-- tpsh.test_args: the command line of `tpsh test`, and busted's .busted configuration file.
--
-- The options are busted 2.1's where tpsh has them (same names, same meaning); -r/--run NAME takes the
-- task NAME of the .busted file, the file's `default` task applies first, and what the command line
-- gives wins over both, as in busted.
local output = require "tpsh.test_output"

local M = {}
local insert = table.insert

M.USAGE = [[
usage: tpsh test [options] [paths...]       (mpiexec -n N tpsh test ...)
Runs the *_spec.lua files found under paths (files or directories; default: the ROOT of .busted's
task, else tests/ or spec/). Hidden files and directories are skipped, as busted does.
  --filter PATTERN        run only tests whose full name matches the Lua pattern (repeatable)
  --filter-out PATTERN    skip tests whose full name matches (repeatable; also --exclude)
  -t, --tags T1,T2        run only tests whose name holds #T1 or #T2 (a prefix: #T1 matches #T1x)
  --exclude-tags T1,T2    skip tests whose name holds one of these tags
  -l, --list              print the full names of the selected tests, run nothing
  --repeat N              run the selected tests N times
  --shuffle               shuffle tests within each describe block (same order on every rank)
  --seed N                seed of the shuffle, in [0, 2^53) (implies --shuffle; default: chosen, printed)
  -o, --output FORMAT     utfTerminal | plainTerminal | TAP | junit | json | gtest (also utf, plain,
                          tap; default: utfTerminal on a terminal, else plainTerminal)
  --junit FILE            also write a JUnit XML report to FILE
  -p, --pattern PATTERN   Lua pattern for spec file names in directories (default: _spec)
  -m, --lpath PATH        prepended to package.path (default: ./src/?.lua;./src/?/?.lua;./src/?/init.lua)
  --cpath PATH            prepended to package.cpath (default: ./csrc/?.so;./csrc/?/?.so;)
  --helper PATH           a Lua file (or module) run on every rank before the specs
  --[no-]auto-insulate    run each spec file insulated: globals and package.loaded reset after it (default)
  -r, --run NAME          take the options of task NAME of the configuration file
  -f, --config-file FILE  the configuration file (default: .busted in this directory, if there is one)
  -h, --help              this text
A test passes when it passes on every rank; failures name the ranks. Exit status 1 when any failed.
]]

-- busted's defaults (its --help and documentation)
M.DEFAULT_LPATH = "./src/?.lua;./src/?/?.lua;./src/?/init.lua"
M.DEFAULT_CPATH = "./csrc/?.so;./csrc/?/?.so;"

local function csv(list, s)
  for w in tostring(s):gmatch("[^,%s]+") do list[#list + 1] = (w:gsub("^#", "")) end
end

-- One pass over args (the command line, or the configuration turned into options); returns the
-- options and the set of fields they gave.
local function parse(args)
  local o, given = {}, {}
  local function set(k, v) o[k] = v; given[k] = true end
  local function add(k, v) o[k] = o[k] or {}; given[k] = true; insert(o[k], v) end
  local i = 1
  while i <= #args do
    local a, inline = args[i], nil
    local name, v = a:match("^(%-%-[%w%-]+)=(.*)$")
    if name then a, inline = name, v end
    local function val()
      if inline then return inline end
      i = i + 1
      if args[i] == nil then error("option " .. a .. " needs a value", 0) end
      return args[i]
    end
    if a == "-h" or a == "--help" then set("help", true)
    elseif a == "--filter" then add("filters", val())
    elseif a == "--exclude" or a == "--filter-out" then add("excludes", val())
    elseif a == "-t" or a == "--tags" then o.tags = o.tags or {}; given.tags = true; csv(o.tags, val())
    elseif a == "--exclude-tags" then o.exclude_tags = o.exclude_tags or {}; given.exclude_tags = true
      csv(o.exclude_tags, val())
    elseif a == "-l" or a == "--list" then set("list", true)
    elseif a == "--repeat" then
      local n = tonumber(val())
      if not n or n < 1 or n % 1 ~= 0 then error("--repeat needs a positive integer", 0) end
      set("rep", n)
    elseif a == "--shuffle" or a == "--shuffle-tests" then set("shuffle", true)
    elseif a == "--no-shuffle" or a == "--no-shuffle-tests" then set("shuffle", false)
    elseif a == "--seed" then
      local s = val()
      local n = tonumber(s)
      -- as tp.manual_seed: beyond 2^53 a double is no longer every integer, and the printed seed
      -- would not give the order back
      if not n or n % 1 ~= 0 or n < 0 or n >= 2 ^ 53 then
        error("--seed needs an integer in [0, 2^53), got " .. s, 0)
      end
      set("seed", n); set("shuffle", true)
    elseif a == "-o" or a == "--output" then
      local f = val()
      if not output.canonical(f) then error("unknown output format '" .. f .. "'", 0) end
      set("format", output.canonical(f))
    elseif a == "--junit" then
      local f = val()
      -- written over at the end of the run: a spec file given here (`--junit a_spec.lua`, the file name
      -- forgotten) would be overwritten with the report; refused, as --trace refuses a script's
      local why = f == "" and "an empty one" or f:lower():match("%.lua$") and "a Lua file (" .. f .. ")"
      if why then error("--junit expects the report's file name (.xml), got " .. why, 0) end
      set("junit", f)
    elseif a == "-p" or a == "--pattern" then add("patterns", val())
    elseif a == "-m" or a == "--lpath" then set("lpath", val())
    elseif a == "--cpath" then set("cpath", val())
    elseif a == "--helper" then set("helper", val())
    elseif a == "--auto-insulate" then set("auto_insulate", true)
    elseif a == "--no-auto-insulate" then set("auto_insulate", false)
    elseif a == "-r" or a == "--run" then set("run", val())
    elseif a == "-f" or a == "--config-file" then set("config", val())
    elseif a:sub(1, 1) == "-" and a ~= "-" then error("unknown option " .. a, 0)
    else add("paths", a) end
    i = i + 1
  end
  return o, given
end

-- busted's configuration keys (its long option names) turned into options for parse; ROOT gives paths.
local function task_args(t, where)
  local args = {}
  for k, v in pairs(t) do
    if type(k) ~= "string" then error(where .. ": a key that is not an option name (" .. tostring(k) .. ")", 0) end
    local vals = type(v) == "table" and v or { v }
    for _, x in ipairs(vals) do
      if k == "ROOT" then insert(args, tostring(x))
      elseif x == true then insert(args, "--" .. k)
      elseif x == false then insert(args, "--no-" .. k)
      else insert(args, "--" .. k .. "=" .. tostring(x)) end
    end
  end
  -- option names that tpsh does not know (busted's --coverage, --verbose, ...) are left out rather
  -- than refused: a project's .busted serves busted too
  local kept = {}
  for _, a in ipairs(args) do
    local ok = a:sub(1, 1) ~= "-" or pcall(parse, { a })
    if ok then insert(kept, a) end
  end
  return kept
end

-- The task options of the configuration file (nil where there is none and none was named).
local function config_options(cli)
  local path = cli.config or ".busted"
  local f = io.open(path, "r")
  if not f then
    if cli.config then error("cannot read the configuration file " .. path, 0) end
    if cli.run then error("-r/--run " .. cli.run .. ": there is no .busted file in this directory", 0) end
    return nil
  end
  f:close()
  local chunk, err = loadfile(path)
  if not chunk then error("the configuration file " .. err, 0) end
  local ok, cfg = pcall(chunk)
  if not ok then error("the configuration file " .. path .. " raised: " .. tostring(cfg), 0) end
  if type(cfg) ~= "table" then error("the configuration file " .. path .. " must return a table of tasks", 0) end
  local args = {}
  if type(cfg.default) == "table" then
    for _, a in ipairs(task_args(cfg.default, path .. ": task default")) do insert(args, a) end
  end
  if cli.run then
    if type(cfg[cli.run]) ~= "table" then error("task '" .. cli.run .. "' not found in " .. path, 0) end
    for _, a in ipairs(task_args(cfg[cli.run], path .. ": task " .. cli.run)) do insert(args, a) end
  end
  local o, given = parse(args)
  return o, given
end

-- The options: the command line over the configuration's tasks over the defaults.
function M.parse(args)
  local cli, given = parse(args)
  local o = { filters = {}, excludes = {}, tags = {}, exclude_tags = {}, patterns = {}, paths = {}, rep = 1,
              auto_insulate = true, lpath = M.DEFAULT_LPATH, cpath = M.DEFAULT_CPATH }
  if not cli.help then
    local cfg, cgiven = config_options(cli)
    for k in pairs(cgiven or {}) do o[k] = cfg[k] end
  end
  for k in pairs(given) do o[k] = cli[k] end
  if #o.patterns == 0 then o.patterns = { "_spec" } end
  -- A bad pattern would otherwise raise in the middle of selection.
  for _, list in ipairs { o.filters, o.excludes, o.patterns } do
    for _, p in ipairs(list) do
      if not pcall(string.find, "", p) then error("bad Lua pattern '" .. p .. "'", 0) end
    end
  end
  for _, list in ipairs { o.tags, o.exclude_tags } do
    for _, t in ipairs(list) do
      if not pcall(string.find, "", "#" .. t) then error("bad tag '" .. t .. "' (tags are Lua patterns, as busted's)", 0) end
    end
  end
  return o
end

return M

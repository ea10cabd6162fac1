-- tpsh.test_select: which spec files `tpsh test` finds, which tests it selects, and in what order.
--
-- Discovery runs on rank 0 only (tpsh.test broadcasts the list); selection and order are computed alike
-- on every rank from the same names and the same seed, so no exchange is needed for them.
local M = {}
local insert = table.insert

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function exists(p) local f = io.open(p, "r"); if f then f:close() end return f ~= nil end

-- Directories give their .lua files whose base name matches one of the patterns, sorted bytewise
-- (LC_ALL=C) so that the order never depends on a locale; a file named explicitly is taken whatever its
-- name. Files and directories whose name starts with a dot below a given directory are skipped, as
-- busted skips them (.git, .luarocks, editors' backups). Symbolic links are followed (find -L).
function M.discover(paths, patterns)
  if #paths == 0 then
    local dir = exists("tests") and "tests" or exists("spec") and "spec"
    -- neither: no spec files, said as such (a missing "tests" counted as a failed test)
    if not dir then return { files = {}, missing = {}, no_default = true } end
    paths = { dir }
  end
  local files, missing, seen = {}, {}, {}
  for _, p in ipairs(paths) do
    if not exists(p) then
      insert(missing, p)
    else
      local pipe = io.popen("find -L " .. shell_quote(p) .. " -type f 2>/dev/null | LC_ALL=C sort")
      for f in pipe:lines() do
        local explicit = f == p
        local base = f:match("[^/]*$")
        local wanted = explicit or (base:find("%.lua$") and not f:find("/%.[^/]", #p) and (function()
          for _, pat in ipairs(patterns) do if base:find(pat) then return true end end
          return false
        end)())
        if wanted and not seen[f] then
          seen[f] = true
          insert(files, f)
        end
      end
      pipe:close()
    end
  end
  return { files = files, missing = missing }
end

-- busted's selection: --filter and --filter-out are Lua patterns found in the full name; a tag T
-- is selected where '#' .. T is found in the full name (a pattern too, so #slow matches #slowest).
function M.selected(o, t)
  local name = t.full
  local function any(list, f) for _, x in ipairs(list) do if f(x) then return true end end return false end
  local function tagged(g) return name:find("#" .. g) ~= nil end
  if #o.filters > 0 and not any(o.filters, function(p) return name:find(p) end) then return false end
  if any(o.excludes, function(p) return name:find(p) end) then return false end
  if #o.tags > 0 and not any(o.tags, tagged) then return false end
  return not any(o.exclude_tags, tagged)
end

-- Park-Miller: exact in doubles, so every rank (and every LuaJIT) draws the same numbers, and it
-- leaves math.random alone for the specs.
function M.new_rng(seed)
  local s = seed % 2147483646 + 1
  return function(n) s = s * 16807 % 2147483647; return s % n + 1 end
end

-- Shuffles list in place (Fisher-Yates) with rng.
function M.shuffle(list, rng)
  for i = #list, 2, -1 do local j = rng(i); list[i], list[j] = list[j], list[i] end
end

return M

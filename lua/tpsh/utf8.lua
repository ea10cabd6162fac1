-- tpsh.utf8: text that must be well-formed UTF-8 whatever bytes a script put in it (the trace's JSON
-- and SVG, the JUnit XML of `tpsh test`: their parsers refuse the whole file otherwise). Plain Lua,
-- no C: the test formatters load it without the rest of tpsh.
local M = {}

-- s with every byte that does not start a well-formed UTF-8 sequence (a stray byte, a character cut
-- short, an overlong form, a surrogate) replaced by U+FFFD.
local REPLACEMENT = "\239\191\189"
M.REPLACEMENT = REPLACEMENT
function M.clean(s)
  s = tostring(s)
  if not s:find("[\128-\255]") then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi = 1, 0x80, 0xBF          -- lo, hi: the allowed range of the second byte
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c == 0xE0 then len, lo = 3, 0xA0
    elseif c >= 0xE1 and c <= 0xEC or c == 0xEE or c == 0xEF then len = 3
    elseif c == 0xED then len, hi = 3, 0x9F     -- no surrogates
    elseif c == 0xF0 then len, lo = 4, 0x90
    elseif c >= 0xF1 and c <= 0xF3 then len = 4
    elseif c == 0xF4 then len, hi = 4, 0x8F
    else len = 0 end
    local ok = len > 0 and i + len - 1 <= n
    if ok and len > 1 then
      local b = s:byte(i + 1)
      ok = b >= lo and b <= hi
      for k = i + 2, i + len - 1 do ok = ok and s:byte(k) >= 0x80 and s:byte(k) <= 0xBF end
    end
    if ok then out[#out + 1] = s:sub(i, i + len - 1); i = i + len
    else out[#out + 1] = REPLACEMENT; i = i + 1 end
  end
  return table.concat(out)
end

return M

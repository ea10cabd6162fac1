-- The errors of the script's ffi.gc finalizers that run when the Lua state closes.
--
-- What a global still holds at the end of a script is finalized only by lua_close, and LuaJIT's
-- lua_close drops a finalizer's error: the run ended with status 0. So ffi.gc wraps a Lua finalizer in a
-- pcall that, while the state closes (main.c says when), hands the error to the host, which reports it
-- and ends the rank with status 1; and raises it again, so that during the run a finalizer's error does
-- what it did (it reaches the code that was running when the collector ran it). C functions given to
-- ffi.gc (tpsh's own releases) are kept as they are: they raise nothing, and are the common case.
local ffi = require "ffi"

local raw_gc = ffi.gc

-- note(err): the host's hook; it keeps the first error of the close and ignores one raised before.
return function(note)
  ffi.gc = function(cdata, finalizer)
    if type(finalizer) ~= "function" then return raw_gc(cdata, finalizer) end
    return raw_gc(cdata, function(x)
      local ok, err = pcall(finalizer, x)
      if not ok then
        note(err)
        error(err, 0)
      end
    end)
  end
end

-- diag_fresh_tensor.lua: one loop for callgrind to count, to split a fresh tensor's host cost
-- (docs/design.md, "A fresh tensor's host cost"). arg[1] = fresh (`x + y` of arg[3] f32, default 16, into
-- a new tensor) | prealloc (the same add into a preallocated output, the C op that an out= calls) | empty
-- (tp.empty{16}, freed by the collector) | cycles (full collections, arg[3] long-lived tensors kept),
-- arg[2] = count.
-- Instructions an op: the difference of two runs' totals (both threads) over the difference of counts:
--   for n in 20000 40000; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
--     build/tpsh --backend cpu scripts/diag/diag_fresh_tensor.lua fresh $n 2>&1 | grep Collected; done
local C = require("tpsh.capi").C
local mode, n = arg[1], tonumber(arg[2] or 20000)
local size = mode ~= "cycles" and tonumber(arg[3] or 16) or 16
local live = mode == "cycles" and tonumber(arg[3] or 0) or 0
local x, y, w = tp.ones { size }, tp.ones { size }, tp.empty { size }
local cur = tp.current_stream
local fn
if mode == "fresh" then fn = function() local _ = x + y end
elseif mode == "prealloc" then fn = function() C.tpsh_add(cur(), w, x, y, 1) end
elseif mode == "empty" then fn = function() local _ = tp.empty { 16 } end
elseif mode == "cycles" then fn = collectgarbage
else error("diag_fresh_tensor.lua: expected fresh, prealloc, empty or cycles, got " .. tostring(mode), 0) end
local keep = {}
for i = 1, live do keep[i] = tp.empty { 1 } end
for _ = 1, 3 do collectgarbage() end           -- the kept tensors are old by now
for _ = 1, n do fn() end
tp.synchronize()

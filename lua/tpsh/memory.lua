-- memory.lua: tensor memory as Lua sees it: the collector paced by tensor bytes, and tp.memory_stats,
-- tp.memory_summary, tp.empty_cache, tp.reset_peak_memory_stats (docs/api.md "Memory").
local ffi = require "ffi"
local capi = require "tpsh.capi"
local C, raise = capi.C, capi.raise
local function backend_name() return ffi.string(C.tpsh_backend_name()) end

local M = {}
local stats = C.tpsh_alloc_stats_get()
M.stats = stats

-- ==== the collector ===============================================================================
-- Lua's collector sees a tensor as a small cdata, not the memory behind it: on its own it would let
-- garbage temporaries hold their blocks until the Lua heap grew enough, and the cache with them.
-- tensor.lua calls M.step whenever bytes_since_step passes M.step_bytes; the step pays collector debt
-- in proportion to the tensor bytes allocated, so that a whole cycle runs about once per half budget
-- of tensor bytes. The budget is the larger of what live tensors held when the last cycle ended (the
-- collector's own pause lets the heap double between cycles too) and M.heap_ratio times the Lua heap,
-- at least M.least and at most M.most: a cycle costs about 0.16 us per KiB of heap, about what the CPU
-- backend's cheapest op spends per byte it writes, while a GPU writes a hundred times faster, so its
-- budget is that much larger for the same share of the host's time (docs/perf.md, "Allocation").
-- Incremental steps: never a full collection on the op path. (tp.time collects between iterations,
-- so its timed iterations start with no garbage whatever the budget.)
M.least, M.most = 4 * 2 ^ 20, 4 * 2 ^ 30      -- (fields: scripts/bench/bench_alloc.lua and specs set them)
M.heap_ratio = nil                             -- set at the first step, by backend
local RATIO = { cpu = 48, cuda = 8192 }
local STEPS_PER_BUDGET = 64
local estimate = 0
M.step_bytes = M.least / STEPS_PER_BUDGET
M.cycles = 0                  -- cycles these steps finished

-- heap_kb: collectgarbage("count"), when the caller has it
function M.budget(heap_kb)
  M.heap_ratio = M.heap_ratio or RATIO[backend_name()] or 48
  local b = math.min(math.max(M.least, M.heap_ratio * 1024 * (heap_kb or collectgarbage("count"))), M.most)
  -- what live tensors held then, unless they hold less now (large tensors freed since)
  local live = estimate < stats.allocated and estimate or stats.allocated
  return live > b and live or b
end

function M.step()
  local bytes = stats.bytes_since_step
  stats.bytes_since_step = 0
  local heap_kb = collectgarbage("count")
  local budget = M.budget(heap_kb)
  -- a cycle's work is about the heap's size; collectgarbage("step", k) pays k KiB of debt at the
  -- collector's step multiplier (2 units of work a byte): this finishes a cycle in half a budget
  stats.gc_steps = stats.gc_steps + 1
  if collectgarbage("step", math.ceil(heap_kb * bytes / budget)) then
    M.cycles = M.cycles + 1
    estimate = stats.allocated
  end
  M.step_bytes = budget / STEPS_PER_BUDGET
end

-- ==== tp.memory_stats and friends =================================================================
local function check_device(name, device)
  if device == nil then return end
  local mine = C.tpsh_device()
  if device ~= mine then
    raise(name, ("this rank has one device, %d (%s backend); got %s"):format(mine, backend_name(),
      capi.show(device)))
  end
end

local FIELDS = { "allocated", "allocated_peak", "reserved", "reserved_peak", "requested_peak", "allocations",
  "frees", "cache_hits", "cache_misses", "backend_frees", "cached_blocks", "cached_bytes", "pending_blocks",
  "gc_steps", "flushes" }

function M.memory_stats(device)
  check_device("tp.memory_stats", device)
  local r = {}
  for _, k in ipairs(FIELDS) do r[k] = stats[k] end
  r.requested = stats.bytes_live
  r.tensors = stats.tensors_allocated
  r.gc_cycles = M.cycles
  r.gc_budget = M.budget()
  r.caching = stats.caching ~= 0
  r.device = C.tpsh_device()
  r.backend = backend_name()
  return r
end

local function bytes(n)
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local u = 1
  while math.abs(n) >= 1024 and u < #units do n, u = n / 1024, u + 1 end
  return u == 1 and ("%d B"):format(n) or ("%.2f %s"):format(n, units[u])
end

function M.memory_summary(device)
  check_device("tp.memory_summary", device)
  local s = M.memory_stats()
  local hit = s.allocations > 0 and 100 * s.cache_hits / s.allocations or 0
  local lines = {
    ("tpsh memory, rank %d, %s device %d (caching %s)"):format(C.tpsh_rank(), s.backend, s.device,
      s.caching and "on" or "off: TPSH_NO_MEMORY_CACHING=1"),
    ("  %-28s %14s %14s"):format("", "current", "peak"),
    ("  %-28s %14s %14s"):format("allocated (live blocks)", bytes(s.allocated), bytes(s.allocated_peak)),
    ("  %-28s %14s %14s"):format("requested (by tensors)", bytes(s.requested), bytes(s.requested_peak)),
    ("  %-28s %14s %14s"):format("reserved (from the backend)", bytes(s.reserved), bytes(s.reserved_peak)),
    ("  %-28s %14s %14s"):format("cached (free blocks)", bytes(s.cached_bytes), ("%d blocks"):format(s.cached_blocks)),
    ("  allocations %d: %d from the cache (%.1f%%), %d from the backend; frees %d; %d given back"):format(
      s.allocations, s.cache_hits, hit, s.cache_misses, s.frees, s.backend_frees),
    ("  frees waiting for other streams: %d; cache given back for lack of memory: %d times"):format(
      s.pending_blocks, s.flushes),
    ("  collector steps for tensor memory: %d (%d cycles finished); %d tensors made"):format(s.gc_steps,
      s.gc_cycles, s.tensors),
  }
  return table.concat(lines, "\n")
end

function M.empty_cache()
  if C.tpsh_graph_capture_active() ~= 0 then capi.check(C.tpsh_graph_refuse("waits on the host"), "tp.empty_cache") end
  return C.tpsh_empty_cache()
end

function M.reset_peak_memory_stats() C.tpsh_reset_peak_memory_stats() end

function M.install(tp)
  tp.memory_stats = M.memory_stats
  tp.memory_summary = M.memory_summary
  tp.empty_cache = M.empty_cache
  tp.reset_peak_memory_stats = M.reset_peak_memory_stats
end

return M

-- bench_graph.lua: what a graph (tp.graph) saves a schedule of small ops: 100 small add_ and 100 small
-- all_reduce (on the world; one rank on the GPU machine), run eagerly against the same 100 captured once
-- and replayed.
--
--   tpsh [--backend cuda] scripts/bench/bench_graph.lua [--iters N] [--size ELEMENTS]
--
-- Each side is timed by tp.time (N synchronised iterations after a warm-up): host is the median time
-- for the call to return (the eager loop's 100 enqueues, or one g:replay()), device the median time
-- the stream took (events around the call), wall the median of call plus synchronisation. Per op means
-- divided by 100. Prints a "graph-bench" line per side (scripts/gpu/gpu_check.sh's graph step reads them
-- beside scripts/bench/torch_graph.py's) and a "ratio" line per case; the target is a replay's host cost per op
-- of at most 1 us.
local ITERS, SIZE, OPS = 30, 256, 100
local i = 1
while arg and arg[i] do
  if arg[i] == "--iters" then ITERS = tonumber(arg[i + 1]); i = i + 1
  elseif arg[i] == "--size" then SIZE = tonumber(arg[i + 1]); i = i + 1
  else error("unknown argument " .. arg[i] .. " (expected [--iters N] [--size ELEMENTS])", 0) end
  i = i + 1
end

local function per_op(r)
  return { host = r.host * 1e3 / OPS, device = r.median * 1e3 / OPS, wall = r.wall * 1e3 / OPS }
end

local function line(case, side, p)
  if tp.rank ~= 0 then return end
  print(("graph-bench tpsh %-22s %-6s host_us_per_op %8.3f device_us_per_op %8.3f wall_us_per_op %8.3f"):format(
    case, side, p.host, p.device, p.wall))
end

-- eager: fn run as it is; graph: fn captured once (after one eager run: NCCL connects and cuBLAS
-- chooses on first use, as PyTorch's warm-up before a capture), then replayed.
local function case(name, fn)
  fn()
  tp.synchronize()
  local g = tp.graph(fn, { name = name })
  local opts = { iters = ITERS, warmup = 5 }
  local e = per_op(tp.time(fn, opts))
  local r = per_op(tp.time(g, opts))
  line(name, "eager", e)
  line(name, "graph", r)
  if tp.rank == 0 then
    print(("ratio %-22s graph/eager: host %.3f, wall %.3f, device %.3f; graph host per op %.3f us (target <= 1)")
      :format(name, r.host / e.host, r.wall / e.wall, r.device / e.device, r.host))
  end
  g:free()
end

if tp.rank == 0 then
  print(("bench_graph: backend %s, %d rank(s), %d ops of %d f32 elements, %d iterations"):format(tp.backend, tp.size,
    OPS, SIZE, ITERS))
end

local x, y = tp.ones { SIZE }, tp.ones { SIZE }
case(("add_ x%d"):format(OPS), function() for _ = 1, OPS do x:add_(y) end end)

local z = tp.ones { SIZE }
case(("all_reduce x%d"):format(OPS), function() for _ = 1, OPS do tp.world:all_reduce(z) end end)

-- fsdp.lua: fully sharded data parallelism (ZeRO-3: Rajbhandari et al., SC 2020; PyTorch FSDP: Zhao et
-- al., VLDB 2023) on a stack of layers: each rank holds 1/P of every layer's weight, gathers a layer's
-- whole weight just before the layer runs (forward, and again in the backward) and reduce-scatters its
-- gradient (averaged over the ranks) right after the backward computed it. Checked against the stack
-- run on one rank in f64 on every rank's batch without communication.
--
--   mpiexec -n 2 tpsh examples/schedules/fsdp.lua [layers=4 hidden=128 batch=32 ...]
--   mpiexec -n 2 tpsh --trace fsdp.svg examples/schedules/fsdp.lua
--
-- A layer's weight is FSDP's flat parameter: hidden^2 elements padded to a multiple of P, of which rank
-- r holds elements r * shard + 1 on; its gradient the same, with zeros in the padding. Schedules, one
-- training step (forward and backward) each:
--   serial          each all_gather and reduce_scatter on the current stream, where it is needed
--   async RS        the reduce_scatter of layer i's gradient on the comm stream (async) while the
--                   backward goes on with layer i - 1
--   prefetch        also the all_gather of the next layer's weight (layer i + 1 forward, i - 1
--                   backward) issued on the comm stream before layer i's compute, which it runs
--                   during (FSDP's forward and backward prefetch); two gather buffers in turn
local S = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "common.lua")

local knobs = S.stack_knobs(4, {})
local o = S.options("fsdp.lua", knobs, ...)
local g, P, me = tp.world, tp.world.size, tp.world.rank
local L, H, dt = o.layers, o.hidden, o.dtype
local numel = H * H
local shard = math.ceil(numel / P)
local padded = P * shard
S.header("fsdp.lua", knobs, o)

-- This rank's shard of every layer's flat weight.
local shards = {}
for i = 1, L do
  local flat = tp.zeros({ padded }, dt)
  flat:narrow(1, 1, numel):copy_(S.stack_weight(o, i):view(-1))
  shards[i] = flat:narrow(1, me * shard + 1, shard):clone()
end
local x, dy = S.stack_data(o, me)
local function as_weight(flat) return flat:narrow(1, 1, numel):view({ H, H }) end

local function fsdp(async_rs, prefetch)
  local slots = { tp.empty({ padded }, dt), tp.empty({ padded }, dt) }   -- gathered weights, in turn
  local gslots = { tp.zeros({ padded }, dt), tp.zeros({ padded }, dt) }  -- gradients (padding stays 0)
  local gshards, st = {}, S.stack_buffers(o)
  for i = 1, L do gshards[i] = tp.empty({ shard }, dt) end
  local n, pending, reducing = 0, {}, {}

  local function gather(i)  -- layer i's weight into the next slot
    n = n + 1
    local slot = slots[n % 2 + 1]
    return { as_weight(slot), g:all_gather(slot, shards[i], { async = prefetch }) }
  end
  -- layer i's weight: gathered now, or prefetched earlier (then the next one's gather starts here)
  local function weight(i, next_i, first)
    if not prefetch then return gather(i)[1] end
    if i == first then pending[i] = gather(i) end
    local W, w = pending[i][1], pending[i][2]
    pending[i] = nil
    w:wait()
    if next_i then pending[next_i] = gather(next_i) end
    return W
  end
  local function grad(i)     -- a gradient slot, once the reduce_scatter that read it last is done
    local s = i % 2 + 1
    if reducing[s] then reducing[s]:wait(); reducing[s] = nil end
    return as_weight(gslots[s])
  end
  local function reduce(i)
    local s = i % 2 + 1
    reducing[s] = g:reduce_scatter(gshards[i], gslots[s], { op = "avg", async = async_rs })
  end

  local v = { outs = {} }
  function v.step()
    local out = S.stack_forward(st, x, function(i) return weight(i, i < L and i + 1 or nil, 1) end)
    S.stack_backward(st, dy, function(i) return weight(i, i > 1 and i - 1 or nil, L) end, grad, reduce)
    for s = 1, 2 do
      if reducing[s] then reducing[s]:wait(); reducing[s] = nil end
    end
    return out
  end
  v.outs[1] = { "out", st.h[L + 1] }
  for i = 1, L do v.outs[i + 1] = { "dW" .. i, gshards[i] } end
  return v
end

local variants = {
  { "serial", fsdp(false, false) },
  { "async RS", fsdp(true, false) },
  { "prefetch + async RS", fsdp(true, true) },
}

local out_ref, grads = S.stack_reference(o)
local ref = { out_ref }
for i = 1, L do
  local flat = tp.zeros({ padded }, "f64")
  flat:narrow(1, 1, numel):copy_(grads[i]:view(-1))
  ref[i + 1] = flat:narrow(1, me * shard + 1, shard)
end
local rows, timed = S.stack_rows(variants, ref)
local errs = S.verify(rows, dt, "the stack on one rank in f64 on every rank's batch, without communication")
S.say("timing: one training step (forward + backward) of %d layers, %d elements of weight per layer and rank",
  L, shard)
return { errors = errs, timings = S.compare(timed, o) }

-- ddp.lua: data parallelism with the gradients all-reduced in buckets during the backward (PyTorch
-- DDP: Li et al., VLDB 2020), on a stack of layers whose weights every rank holds whole. Checked
-- against the stack run on one rank in f64 on every rank's batch without communication.
--
--   mpiexec -n 2 tpsh examples/schedules/ddp.lua [layers=8 bucket=0.25 ...]
--   mpiexec -n 2 tpsh --trace ddp.svg examples/schedules/ddp.lua bucket=1
--
-- The gradients live in one flat buffer in the order the backward makes them (the last layer first),
-- each layer's a view of it (DDP's gradient_as_bucket_view), so a bucket is a contiguous stretch of
-- layers that one all_reduce (op avg) takes without a copy. A bucket is closed once it holds `bucket`
-- MiB or more (DDP's bucket_cap_mb, 25 by default there) or reaches the first layer. Schedules, one
-- training step (forward and backward) each:
--   after backward   one all_reduce of the whole buffer on the current stream once the backward is done
--   per layer        each layer's gradient all-reduced on the comm stream (async) as soon as it is made
--   buckets          each bucket all-reduced on the comm stream as soon as its last layer's gradient is
--                    made (fewer, larger collectives than per layer; later start than per layer)
local S = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "common.lua")

local knobs = S.stack_knobs(8, { { "bucket", 0.25, "bucket size in MiB (DDP's bucket_cap_mb)", real = true } })
local o = S.options("ddp.lua", knobs, ...)
local g = tp.world
local L, H, dt = o.layers, o.hidden, o.dtype
local numel = H * H
S.header("ddp.lua", knobs, o)

local Ws = {}
for i = 1, L do Ws[i] = S.stack_weight(o, i) end
local x, dy = S.stack_data(o, g.rank)
local esize = tp.empty({ 1 }, dt):nbytes()

-- cap: bytes a bucket holds at least (0: a bucket per layer, math.huge: one bucket); nil: no bucket,
-- one all_reduce after the backward.
local function ddp(cap)
  local flat = tp.empty({ L * numel }, dt)
  local function grad(i) return flat:narrow(1, (L - i) * numel + 1, numel):view({ H, H }) end
  -- closes[i]: the bucket whose last layer (in the backward's order) is i
  local closes, first, buckets = {}, nil, 0
  for i = L, 1, -1 do
    first = first or i
    if cap and ((first - i + 1) * numel * esize >= cap or i == 1) then
      closes[i] = flat:narrow(1, (L - first) * numel + 1, (first - i + 1) * numel)
      buckets, first = buckets + 1, nil
    end
  end
  local st, works = S.stack_buffers(o), {}
  local function done(i)
    if closes[i] then works[#works + 1] = g:all_reduce(closes[i], { op = "avg", async = true }) end
  end
  local v = { buckets = buckets, outs = { { "out", st.h[L + 1] } } }
  for i = 1, L do v.outs[i + 1] = { "dW" .. i, grad(i) } end
  function v.step()
    S.stack_forward(st, x, function(i) return Ws[i] end)
    S.stack_backward(st, dy, function(i) return Ws[i] end, grad, cap and done or nil)
    if not cap then g:all_reduce(flat, { op = "avg" }) end
    for j = 1, #works do works[j]:wait(); works[j] = nil end
  end
  return v
end

local bucketed = ddp(o.bucket * 2 ^ 20)
local variants = {
  { "after backward", ddp(nil) },
  { "per layer", ddp(0) },
  { ("buckets (%d)"):format(bucketed.buckets), bucketed },
}

local out_ref, grads = S.stack_reference(o)
local ref = { out_ref }
for i = 1, L do ref[i + 1] = grads[i] end
local rows, timed = S.stack_rows(variants, ref)
local errs = S.verify(rows, dt, "the stack on one rank in f64 on every rank's batch, without communication")
S.say("timing: one training step (forward + backward) of %d layers, %.2f MiB of gradient, buckets of %g MiB: %d",
  L, L * numel * esize / 2 ^ 20, o.bucket, bucketed.buckets)
return { errors = errs, timings = S.compare(timed, o) }

-- sp_mlp.lua: the MLP block of a Megatron-LM transformer layer with tensor and sequence parallelism
-- (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023),
-- forward and backward, in three schedules, each checked against the whole layer computed on one rank
-- in f64 without communication.
--
--   mpiexec -n 2 tpsh examples/schedules/sp_mlp.lua [rows=64 hidden=128 ffn=128 chunks=2 pass=both ...]
--   mpiexec -n 2 tpsh --trace sp_mlp.svg examples/schedules/sp_mlp.lua      (the timeline)
--   tpsh examples/schedules/sp_mlp.lua help                                 (the knobs)
--
-- Each rank holds x, its rows of the sequence (rows x hidden), W1, its columns of the first linear
-- layer (hidden x ffn), and W2, its rows of the second (ffn x hidden). Forward (g and g-bar of the paper):
--   X = all_gather(x); A = X @ W1; Z = gelu(A); y = reduce_scatter(Z @ W2)
-- backward, from dy (rows x hidden, the gradient of this rank's rows of y):
--   dY = all_gather(dy); dZ = dY @ W2^T; dW2 = Z^T @ dY; dA = gelu'(A) dZ;
--   dx = reduce_scatter(dA @ W1^T); X = all_gather(x) again (sequence parallelism keeps only x for the
--   backward); dW1 = X^T @ dA
-- Schedules:
--   serial     every collective on the current stream, in the order above
--   megatron   Megatron-LM's own overlap (LinearWithGradAccumulationAndAsyncCommunication): in the
--              backward the all_gather of x runs during the dX GEMM and the reduce_scatter of dX during
--              the dW1 GEMM; the forward is serial
--   pipelined  the rows in k chunks, each chunk a layer of its own end to end: chunk j's all_gather,
--              its GEMM -> GELU -> GEMM, its reduce_scatter (async), so that chunk j's collectives run
--              during the GEMMs of the others (the backward likewise: dy's and x's gathers per chunk,
--              dX's reduce_scatter per chunk, the weight gradients summed over chunks). The layout is
--              that of pipeline.lua: the all_gather of chunk j holds rows j of every rank, and its
--              reduce_scatter leaves this rank rows j of y, so no row is copied.
local S = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "common.lua")

local knobs = S.common_knobs {
  { "rows", 64, "tokens per rank (sequence x batch / ranks): x is rows x hidden" },
  { "hidden", 128, "hidden size" },
  { "ffn", 128, "FFN width per rank (the layer's is ffn x ranks; Megatron's 4 hidden / ranks)" },
  { "chunks", 2, "chunks of the pipelined schedule (must divide rows)" },
  { "pass", "both", "what is timed: fwd, bwd or both", choices = { "fwd", "bwd", "both" } },
}
local o = S.options("sp_mlp.lua", knobs, ...)
local g, P, me = tp.world, tp.world.size, tp.world.rank
local m, H, F, k, dt = o.rows, o.hidden, o.ffn, o.chunks, o.dtype
if m % k ~= 0 then error(("sp_mlp.lua: rows (%d) must be a multiple of chunks (%d)"):format(m, k), 0) end
local c = m / k
S.header("sp_mlp.lua", knobs, o)

-- Rank q's data and weights, from seeds of its own (the reference draws every rank's).
local function x_of(q, d) return S.randn({ m, H }, d or dt, 100 + q) end
local function dy_of(q, d) return S.randn({ m, H }, d or dt, 200 + q) end
local function w1_of(q, d) return S.randn({ H, F }, d or dt, 10 + q, 1 / math.sqrt(H)) end
local function w2_of(q, d) return S.randn({ F, H }, d or dt, 20 + q, 1 / math.sqrt(F * P)) end
local x, dy, W1, W2 = x_of(me), dy_of(me), w1_of(me), w2_of(me)
local E = function(shape) return tp.empty(shape, dt) end

-- ==== serial and megatron: one buffer per tensor of the layer ====================================
local function whole(overlap)
  local X, A, Z, Yp, y = E { P * m, H }, E { P * m, F }, E { P * m, F }, E { P * m, H }, E { m, H }
  local dY, dZ, dA, dX = E { P * m, H }, E { P * m, F }, E { P * m, F }, E { P * m, H }
  local dx, dW1, dW2 = E { m, H }, E { H, F }, E { F, H }
  local v = { outs = { { "y", y }, { "dx", dx }, { "dW1", dW1 }, { "dW2", dW2 } } }
  function v.fwd()
    g:all_gather(X, x)
    tp.matmul(X, W1, A)
    S.act(A, Z)
    tp.matmul(Z, W2, Yp)
    g:reduce_scatter(y, Yp)
  end
  function v.bwd()
    g:all_gather(dY, dy)
    tp.matmul(dY, W2:t(), dZ)
    tp.matmul(Z:t(), dY, dW2)
    S.act_backward(dZ, A, dA)
    if not overlap then
      tp.matmul(dA, W1:t(), dX)
      g:reduce_scatter(dx, dX)
      g:all_gather(X, x)
      tp.matmul(X:t(), dA, dW1)
      return
    end
    local wx = g:all_gather(X, x, { async = true })  -- x gathered again during the dX GEMM
    tp.matmul(dA, W1:t(), dX)
    wx:wait()
    local wr = g:reduce_scatter(dx, dX, { async = true }) -- dX scattered during the dW1 GEMM
    tp.matmul(X:t(), dA, dW1)
    wr:wait()
  end
  return v
end

-- ==== pipelined: every tensor of P x rows rows in k chunks of P x c rows ==========================
local function pipelined()
  local y, dx, dW1, dW2 = E { m, H }, E { m, H }, E { H, F }, E { F, H }
  local xs, dys, ys, dxs = x:chunk(k, 1), dy:chunk(k, 1), y:chunk(k, 1), dx:chunk(k, 1)
  local X, A, Z, Yp, dY, dX = {}, {}, {}, {}, {}, {}
  for j = 1, k do
    X[j], A[j], Z[j], Yp[j] = E { P * c, H }, E { P * c, F }, E { P * c, F }, E { P * c, H }
    dY[j], dX[j] = E { P * c, H }, E { P * c, H }
  end
  local dZ, dA = E { P * c, F }, E { P * c, F }
  local v = { outs = { { "y", y }, { "dx", dx }, { "dW1", dW1 }, { "dW2", dW2 } } }
  function v.fwd()
    local wg, wr = {}, {}
    for j = 1, k do wg[j] = g:all_gather(X[j], xs[j], { async = true }) end
    for j = 1, k do
      wg[j]:wait()
      tp.matmul(X[j], W1, A[j])
      S.act(A[j], Z[j])
      tp.matmul(Z[j], W2, Yp[j])
      wr[j] = g:reduce_scatter(ys[j], Yp[j], { async = true })
    end
    for j = 1, k do wr[j]:wait() end
  end
  function v.bwd()
    local wd, wx, wr = {}, {}, {}
    for j = 1, k do
      wd[j] = g:all_gather(dY[j], dys[j], { async = true })
      wx[j] = g:all_gather(X[j], xs[j], { async = true })
    end
    for j = 1, k do
      wd[j]:wait()
      tp.matmul(dY[j], W2:t(), dZ)
      S.matmul_acc(Z[j]:t(), dY[j], dW2, j > 1)
      S.act_backward(dZ, A[j], dA)
      tp.matmul(dA, W1:t(), dX[j])
      wr[j] = g:reduce_scatter(dxs[j], dX[j], { async = true })
      wx[j]:wait()
      S.matmul_acc(X[j]:t(), dA, dW1, j > 1)
    end
    for j = 1, k do wr[j]:wait() end
  end
  return v
end

-- ==== the reference: the whole layer on one rank, in f64, from every rank's x, dy and weights ======
local function reference()
  local d, xq, dyq, w1q, w2q = "f64", {}, {}, {}, {}
  for q = 0, P - 1 do
    xq[q + 1], dyq[q + 1] = x_of(q):to(d), dy_of(q):to(d)
    w1q[q + 1], w2q[q + 1] = w1_of(q):to(d), w2_of(q):to(d)
  end
  local X, dY, W1f, W2f = tp.cat(xq, 1), tp.cat(dyq, 1), tp.cat(w1q, 2), tp.cat(w2q, 1)
  local A = tp.matmul(X, W1f)
  local Z = S.act(A, tp.empty_like(A))
  local Y = tp.matmul(Z, W2f)
  local dA = S.act_backward(tp.matmul(dY, W2f:t()), A, tp.empty_like(A))
  local dX, dW1f, dW2f = tp.matmul(dA, W1f:t()), tp.matmul(X:t(), dA), tp.matmul(Z:t(), dY)
  return { Y:narrow(1, me * m + 1, m), dX:narrow(1, me * m + 1, m), dW1f:narrow(2, me * F + 1, F),
           dW2f:narrow(1, me * F + 1, F) }
end

local variants = {
  { "serial", whole(false) },
  { "megatron (async bwd)", whole(true) },
  { ("pipelined (chunks=%d)"):format(k), pipelined() },
}
local ref = reference()
local rows = {}
for i, v in ipairs(variants) do
  v[2].fwd()
  v[2].bwd()
  local outs = {}
  for n, out in ipairs(v[2].outs) do outs[n] = { out[1], out[2], ref[n] } end
  rows[i] = { v[1], outs }
end
local errs = S.verify(rows, dt, "the layer on one rank in f64, without communication")

local timed = {}
for i, v in ipairs(variants) do
  local fwd, bwd = v[2].fwd, v[2].bwd
  local fn = o.pass == "fwd" and fwd or o.pass == "bwd" and bwd or function() fwd(); bwd() end
  timed[i] = { v[1], fn }
end
S.say("timing: %s", o.pass == "both" and "forward + backward" or o.pass == "fwd" and "forward" or "backward")
return { errors = errs, timings = S.compare(timed, o) }

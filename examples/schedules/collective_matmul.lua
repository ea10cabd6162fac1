-- collective_matmul.lua: an all_gather followed by a GEMM, and a GEMM followed by a reduce_scatter,
-- decomposed so that the communication runs during the GEMM (Wang et al., "Overlap Communication with
-- Dependent Computation via Decomposition in Large Deep Learning Models", ASPLOS 2023), each checked
-- against the GEMM computed on one rank in f64 without communication.
--
--   mpiexec -n 4 tpsh examples/schedules/collective_matmul.lua [op=both m=64 k=128 n=128 chunks=2 ...]
--   mpiexec -n 4 tpsh --trace cm.svg examples/schedules/collective_matmul.lua op=ag
--
-- AG+GEMM (op=ag): Y = all_gather(x) @ W, x m x k per rank, W k x n (a column-parallel layer's shard):
--   serial     all_gather, then one GEMM
--   chunked    x in `chunks` pieces, one async all_gather each; this rank's own rows are multiplied
--              first (they need no communication), then each chunk's rows once its gather is in
--              (examples/pipeline.lua)
--   ring       the paper's decomposition: P - 1 steps, in each of which every rank sends the block it
--              holds to the next rank and receives the previous rank's (send/recv in one batch, on the
--              comm stream) while it multiplies the block it has
--   bidirectional ring   the paper's bidirectional form: blocks travel both ways round the ring, so
--              every one is in after ceil((P - 1) / 2) steps, two GEMMs a step
-- GEMM+RS (op=rs): y = reduce_scatter(X @ W), X P m x k per rank, W k x n (a row-parallel layer's
-- shard: the ranks' products are partial sums):
--   serial     one GEMM, then reduce_scatter
--   chunked    the product in `chunks` pieces, each the rows j of every rank's block (P GEMMs of
--              m / chunks rows), reduce-scattered (async) while the next piece is computed
--   ring       P steps: in step s a rank computes the partial product of block (rank - s - 1) mod P,
--              adds the partial sum that came from the previous rank and sends the total on while it
--              computes the next block; after the last step it holds its own block, summed over ranks
--   bidirectional ring   that ring on each half of the columns at once, the halves going opposite ways
--              (half the bytes on each link and direction; n >= 2)
local S = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "common.lua")

local knobs = S.common_knobs {
  { "op", "both", "which collective matmul: ag (AG+GEMM), rs (GEMM+RS) or both", choices = { "ag", "rs", "both" } },
  { "m", 64, "rows per rank (x is m x k for AG+GEMM; y is m x n for GEMM+RS)" },
  { "k", 128, "inner dimension" },
  { "n", 128, "columns of W" },
  { "chunks", 2, "chunks of the chunked schedules (must divide m)" },
}
local o = S.options("collective_matmul.lua", knobs, ...)
local g, P, me = tp.world, tp.world.size, tp.world.rank
local m, K, N, ch, dt = o.m, o.k, o.n, o.chunks, o.dtype
if m % ch ~= 0 then error(("collective_matmul.lua: m (%d) must be a multiple of chunks (%d)"):format(m, ch), 0) end
local c = m / ch
S.header("collective_matmul.lua", knobs, o)
local E = function(shape) return tp.empty(shape, dt) end
local function block(t, r) return t:narrow(1, r * m + 1, m) end

-- ==== AG+GEMM ====================================================================================
local function ag_gemm()
  local function x_of(q, d) return S.randn({ m, K }, d or dt, 100 + q) end
  local x, W = x_of(me), S.randn({ K, N }, dt, 10 + me, 1 / math.sqrt(K))
  local X = E { P * m, K }
  local xs, pieces = x:chunk(ch, 1), {}
  for j = 1, ch do pieces[j] = E { P * c, K } end
  local recv, recv_back = { E { m, K }, E { m, K } }, { E { m, K }, E { m, K } }

  local function serial(Y)
    g:all_gather(X, x)
    tp.matmul(X, W, Y)
  end
  local function chunked(Y)
    local w = {}
    for j = 1, ch do w[j] = g:all_gather(pieces[j], xs[j], { async = true }) end
    tp.matmul(x, W, block(Y, me))
    for j = 1, ch do
      w[j]:wait()
      for r = 0, P - 1 do
        if r ~= me then tp.matmul(pieces[j]:narrow(1, r * c + 1, c), W, S.block_rows(Y, m, r, j, c)) end
      end
    end
  end
  local function ring(Y)
    -- step s: the block of rank me - s arrives (in recv[s % 2 + 1]) while that of me - s + 1 is multiplied
    local have = x
    for s = 0, P - 1 do
      local w
      if s < P - 1 then w = S.shift(g, have, recv[s % 2 + 1]) end
      tp.matmul(have, W, block(Y, (me - s) % P))
      if w then
        w:wait()
        have = recv[s % 2 + 1]
      end
    end
  end

  local function bidirectional(Y)
    -- the blocks of ranks me - 1, me - 2, ... come from the previous rank and those of me + 1, me + 2,
    -- ... from the next, so every block is in after ceil((P - 1) / 2) steps instead of P - 1; step s
    -- multiplies what step s - 1 brought while the next two blocks travel
    local n_cw, n_ccw = math.ceil((P - 1) / 2), math.floor((P - 1) / 2)
    local cw, ccw, todo = x, x, { { x, me } }
    for s = 1, n_cw + 1 do
      local w, a, b
      if s <= n_cw then
        a, b = recv[s % 2 + 1], s <= n_ccw and recv_back[s % 2 + 1] or nil
        w = S.shift(g, cw, a, b and ccw, b)
      end
      for _, t in ipairs(todo) do tp.matmul(t[1], W, block(Y, t[2])) end
      if w then
        w:wait()
        todo = { { a, (me - s) % P } }
        if b then todo[2] = { b, (me + s) % P } end
        cw, ccw = a, b or ccw
      end
    end
  end

  local function reference()
    local xq = {}
    for q = 0, P - 1 do xq[q + 1] = x_of(q):to("f64") end
    return tp.matmul(tp.cat(xq, 1), W:to("f64"))
  end
  return { "AG+GEMM", { { "serial", serial }, { ("chunked (chunks=%d)"):format(ch), chunked },
    { "ring (send/recv)", ring }, { "bidirectional ring", bidirectional } }, function() return E { P * m, N } end, reference,
    ("Y = all_gather(x) @ W: x %dx%d per rank, W %dx%d"):format(m, K, K, N) }
end

-- ==== GEMM+RS ====================================================================================
local function gemm_rs()
  local function X_of(q, d) return S.randn({ P * m, K }, d or dt, 300 + q) end
  local function w_of(q, d) return S.randn({ K, N }, d or dt, 30 + q, 1 / math.sqrt(K * P)) end
  local X, W = X_of(me), w_of(me)
  local Yp = E { P * m, N }
  local bufs = {}
  for j = 1, ch do bufs[j] = E { P * c, N } end
  local part, recv = { E { m, N }, E { m, N } }, { E { m, N }, E { m, N } }
  -- the bidirectional ring's halves: columns 1..h go round one way, the rest the other way
  local h = math.ceil(N / 2)
  local halves = {}
  for i, cols in ipairs { { 1, h }, { h + 1, N - h } } do
    halves[i] = { W = W:narrow(2, cols[1], cols[2]), cols = cols,
      part = { E { m, cols[2] }, E { m, cols[2] } }, recv = { E { m, cols[2] }, E { m, cols[2] } } }
  end

  local function serial(y)
    tp.matmul(X, W, Yp)
    g:reduce_scatter(y, Yp)
  end
  local function chunked(y)
    local ys, w = y:chunk(ch, 1), {}
    for j = 1, ch do
      for r = 0, P - 1 do
        tp.matmul(S.block_rows(X, m, r, j, c), W, bufs[j]:narrow(1, r * c + 1, c))
      end
      w[j] = g:reduce_scatter(ys[j], bufs[j], { async = true })
    end
    for j = 1, ch do w[j]:wait() end
  end
  local function ring(y)
    -- step s: the partial product of block b = me - s - 1, plus the previous rank's partial sum of the
    -- same block (received during this step's GEMM), is sent on; the last step's block is this rank's
    local w
    for s = 0, P - 1 do
      local b = (me - s - 1) % P
      local acc = s == P - 1 and y or part[s % 2 + 1]
      tp.matmul(block(X, b), W, acc)
      if w then
        w:wait()
        acc:add_(recv[(s - 1) % 2 + 1])
      end
      if s < P - 1 then w = S.shift(g, acc, recv[s % 2 + 1]) end
    end
  end

  local function bidirectional(y)
    -- the ring above on each half of the columns at once, one half sent to the next rank and the other
    -- to the previous: the same P - 1 steps, each link carrying half the bytes in each direction
    local w, L, R = nil, halves[1], halves[2]
    local yl, yr = y:narrow(2, 1, h), y:narrow(2, h + 1, N - h)
    for s = 0, P - 1 do
      local last = s == P - 1
      local al, ar = last and yl or L.part[s % 2 + 1], last and yr or R.part[s % 2 + 1]
      tp.matmul(block(X, (me - s - 1) % P), L.W, al)
      tp.matmul(block(X, (me + s + 1) % P), R.W, ar)
      if w then
        w:wait()
        al:add_(L.recv[(s - 1) % 2 + 1])
        ar:add_(R.recv[(s - 1) % 2 + 1])
      end
      if not last then w = S.shift(g, al, L.recv[s % 2 + 1], ar, R.recv[s % 2 + 1]) end
    end
  end

  local function reference()
    local sum
    for q = 0, P - 1 do
      local p = tp.matmul(block(X_of(q), me):to("f64"), w_of(q):to("f64"))
      sum = sum and sum:add_(p) or p
    end
    return sum
  end
  local variants = { { "serial", serial }, { ("chunked (chunks=%d)"):format(ch), chunked },
    { "ring (send/recv)", ring } }
  if N >= 2 then variants[4] = { "bidirectional ring", bidirectional } end
  return { "GEMM+RS", variants, function() return E { m, N } end, reference,
    ("y = reduce_scatter(X @ W): X %dx%d per rank, W %dx%d"):format(P * m, K, K, N) }
end

-- ==== run ========================================================================================
local result, ops = {}, {}
if o.op ~= "rs" then ops[#ops + 1] = ag_gemm end
if o.op ~= "ag" then ops[#ops + 1] = gemm_rs end
for _, make in ipairs(ops) do
  local name, variants, out, reference, what = unpack(make())
  S.say("%s, %s", name, what)
  local ref, rows, timed = reference(), {}, {}
  for i, v in ipairs(variants) do
    local Y = out()
    v[2](Y)
    rows[i] = { v[1], { { name == "AG+GEMM" and "Y" or "y", Y, ref } } }
    timed[i] = { v[1], function() v[2](Y) end }
  end
  local errs = S.verify(rows, dt, "the GEMM on one rank in f64, without communication")
  result[name] = { errors = errs, timings = S.compare(timed, o) }
end
return result

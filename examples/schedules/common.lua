-- common.lua: what the schedules of examples/schedules/ share: the option parser, the layer's
-- element-wise ops (the one place they live), the chunked row layout, the ring shift, the check against
-- a reference and the compare call. A schedule loads it from its own directory:
--
--   local S = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./") .. "common.lua")
--
-- (its source path, not arg[0], so that a spec that loads the schedule with loadfile finds it too).
local S = {}

S.floats = { f32 = true, f64 = true, f16 = true, bf16 = true }

-- What a schedule's result may differ from its reference by, normwise (S.verify): f32 sums in another
-- order (chunks, rings, the weight gradients summed chunk by chunk) differ by a few ulps; f16 and bf16
-- round every GEMM's and GELU's output, and each partial sum on its way round a ring, once more.
S.rel_tol = { f64 = 1e-12, f32 = 1e-5, f16 = 4e-3, bf16 = 3e-2 }

-- ==== options ====================================================================================
-- knobs: a list of { name, default, help[, min = n] [, real = true] [, choices = {...}] }. The kind
-- follows the default: an integer (>= min, default 1; real = true takes any number > 0), another number
-- (> 0), a boolean, a dtype name (a float dtype), or a string (one of choices, when given). Arguments are name=value or --name=value; -h, --help or help
-- prints the knobs and ends the script.
local function usage(path, knobs)
  local lines = { ("usage: mpiexec -n N tpsh %s [name=value ...]"):format(path) }
  for _, k in ipairs(knobs) do
    lines[#lines + 1] = ("  %-10s %-8s %s"):format(k[1], tostring(k[2]), k[3])
  end
  return table.concat(lines, "\n")
end

local function parse_value(script, k, v)
  local name, default = k[1], k[2]
  local function bad(what)
    error(("%s: %s=%s: expected %s"):format(script, name, v, what), 0)
  end
  if type(default) == "boolean" then
    if v == "true" or v == "1" then return true elseif v == "false" or v == "0" then return false end
    bad("true or false")
  elseif type(default) == "number" then
    local n = tonumber(v)
    local least = k.min or 1
    if default == math.floor(default) and not k.real then
      if not n or n ~= math.floor(n) or n < least then bad(("an integer >= %d"):format(least)) end
    elseif not n or not (n > 0) or n == math.huge then
      bad("a number > 0")
    end
    return n
  elseif S.floats[default] then
    if not S.floats[v] then bad("a float dtype (f32, f64, f16 or bf16)") end
    return v
  elseif k.choices then
    for _, c in ipairs(k.choices) do if v == c then return v end end
    bad("one of " .. table.concat(k.choices, ", "))
  end
  return v
end

function S.options(script, knobs, ...)
  local path = debug.getinfo(2, "S").source:match("^@(.*)") or script
  local o, by_name = {}, {}
  for _, k in ipairs(knobs) do o[k[1]], by_name[k[1]] = k[2], k end
  for i = 1, select("#", ...) do
    local a = select(i, ...)
    if a == "-h" or a == "--help" or a == "help" then
      if tp.rank == 0 then print(usage(path, knobs)) end
      os.exit(0)
    end
    local name, v = tostring(a):match("^%-*([%w_]+)=(.*)$")
    if not name then
      error(("%s: argument %d (%s): expected name=value\n%s"):format(script, i, tostring(a), usage(path, knobs)), 0)
    end
    local k = by_name[name]
    if not k then
      local names = {}
      for _, kk in ipairs(knobs) do names[#names + 1] = kk[1] end
      error(("%s: unknown option %q (options: %s)"):format(script, name, table.concat(names, ", ")), 0)
    end
    o[name] = parse_value(script, k, v)
  end
  S.quiet = o.quiet
  return o
end

-- One line of what ran, on rank 0: the script, ranks, backend and every knob's value.
function S.header(script, knobs, o)
  local parts = {}
  for _, k in ipairs(knobs) do parts[#parts + 1] = ("%s=%s"):format(k[1], tostring(o[k[1]])) end
  S.say("%s on %d rank%s, backend %s: %s", script, tp.size, tp.size == 1 and "" or "s", tp.backend,
    table.concat(parts, " "))
end

function S.say(fmt, ...)
  if tp.rank == 0 and not S.quiet then print(fmt:format(...)) end
end

-- ==== the layer's element-wise ops ===============================================================
-- The activation, out = gelu(a) (the erf form, PyTorch's default), and its backward, out = dz *
-- gelu'(a), each into a preallocated out (no temporary in a timed loop). Every schedule calls these two
-- and nothing else element-wise.
function S.act(a, out)
  return tp.gelu(a, { out = out })
end

function S.act_backward(dz, a, out)
  return tp.gelu_backward(dz, a, { out = out })
end

-- c = a @ b, or c += a @ b when accumulate (one GEMM with beta = 1): a weight gradient summed over
-- chunks.
function S.matmul_acc(a, b, c, accumulate)
  if accumulate then return c:addmm_(a, b) end
  return tp.matmul(a, b, c)
end

-- ==== layouts ====================================================================================
-- Chunk j (of c rows) of rank r's block of `per` rows, in t whose rows are the ranks' blocks one after
-- the other (an all_gather's output, a reduce_scatter's input): row r * per + (j - 1) * c + 1 on.
function S.block_rows(t, per, r, j, c)
  return t:narrow(1, r * per + (j - 1) * c + 1, c)
end

-- The ring's next step: send `send` to the next rank while `recv` comes from the previous one, and, for
-- a bidirectional ring, `back` to the previous rank while `recv_back` comes from the next, all on the
-- group's comm stream in one batch (a ring of plain sends could wait for each other: NCCL's sends, and
-- MPI's past its eager size, complete only once received). Returns the Work.
function S.shift(g, send, recv, back, recv_back)
  local nxt, prv = (g.rank + 1) % g.size, (g.rank - 1) % g.size
  return g:batch(function()
    g:send(send, nxt)
    g:recv(recv, prv)
    if back then
      g:send(back, prv)
      g:recv(recv_back, nxt)
    end
  end, { async = true })
end

-- ==== data =======================================================================================
-- Rank q's tensors are drawn from seeds of their own, so that every rank can draw every other rank's
-- (the reference computes the whole layer without communication): seed base + q.
function S.randn(shape, dtype, seed, scale)
  local t = tp.randn(shape, dtype, { seed = seed })
  if scale and scale ~= 1 then t:mul_(scale) end
  return t
end

-- ==== a stack of layers (fsdp.lua, ddp.lua) =====================================================
-- `layers` layers h_{i+1} = gelu(h_i @ W_i), W_i hidden x hidden, on a batch of `batch` rows per rank;
-- the gradient of the output is dy. Rank q's batch and dy, and the weights, come from seeds of their
-- own (S.randn), so that the reference can run every rank's batch.
function S.stack_data(o, q)
  local x = S.randn({ o.batch, o.hidden }, o.dtype, 100 + q)
  local dy = S.randn({ o.batch, o.hidden }, o.dtype, 200 + q)
  return x, dy
end

function S.stack_weight(o, i, dtype)
  return S.randn({ o.hidden, o.hidden }, dtype or o.dtype, 10 + i, 1 / math.sqrt(o.hidden))
end

-- The activations a forward keeps for its backward, and the backward's buffers.
function S.stack_buffers(o)
  local B, H, dt = o.batch, o.hidden, o.dtype
  local st = { h = {}, a = {}, g = tp.empty({ B, H }, dt), dh = { tp.empty({ B, H }, dt), tp.empty({ B, H }, dt) } }
  for i = 1, o.layers do st.a[i], st.h[i + 1] = tp.empty({ B, H }, dt), tp.empty({ B, H }, dt) end
  return st
end

-- weight(i) gives layer i's weight once the schedule has it (a wait for its all_gather, say).
function S.stack_forward(st, x, weight)
  st.h[1] = x
  for i = 1, #st.a do
    tp.matmul(st.h[i], weight(i), st.a[i])
    S.act(st.a[i], st.h[i + 1])
  end
  return st.h[#st.h]
end

-- From the last layer to the first: layer i's weight gradient goes to grad(i), and done(i) is called
-- once it is enqueued (where a schedule starts its reduction); then the input gradient of layer i.
function S.stack_backward(st, dy, weight, grad, done)
  local dh = dy
  for i = #st.a, 1, -1 do
    local W = weight(i)
    S.act_backward(dh, st.a[i], st.g)
    tp.matmul(st.h[i]:t(), st.g, grad(i))
    if done then done(i) end
    if i > 1 then
      local nd = st.dh[i % 2 + 1]
      tp.matmul(st.g, W:t(), nd)
      dh = nd
    end
  end
end

-- Data parallelism's reference, in f64 without communication: every rank's batch through the whole
-- stack; returns this rank's output and each layer's weight gradient averaged over the ranks.
function S.stack_reference(o)
  local d, L, P = "f64", o.layers, tp.size
  local Ws, mean, out = {}, {}, nil
  for i = 1, L do Ws[i] = S.stack_weight(o, i):to(d) end
  for q = 0, P - 1 do
    local x, dy = S.stack_data(o, q)
    local h, a = { x:to(d) }, {}
    for i = 1, L do
      a[i] = tp.matmul(h[i], Ws[i])
      h[i + 1] = S.act(a[i], tp.empty_like(a[i]))
    end
    if q == tp.rank then out = h[L + 1] end
    local dh = dy:to(d)
    for i = L, 1, -1 do
      local gi = S.act_backward(dh, a[i], tp.empty_like(a[i]))
      local dW = tp.matmul(h[i]:t(), gi)
      mean[i] = mean[i] and mean[i]:add_(dW) or dW
      dh = tp.matmul(gi, Ws[i]:t())
    end
  end
  for i = 1, L do mean[i]:mul_(1 / P) end
  return out, mean
end

-- The stack's variants ({name, {step =, outs = {{label, tensor}, ...}}}) run once each, their outputs
-- beside the reference (ref[j] for outs[j]): the rows S.verify takes and the list S.compare times.
function S.stack_rows(variants, ref)
  local rows, timed = {}, {}
  for i, v in ipairs(variants) do
    v[2].step()
    local outs = {}
    for j, out in ipairs(v[2].outs) do outs[j] = { out[1], out[2], ref[j] } end
    rows[i] = { v[1], outs }
    timed[i] = { v[1], v[2].step }
  end
  return rows, timed
end

-- The stack's knobs, then the schedule's own (knobs), then the common ones.
function S.stack_knobs(layers, knobs)
  local all = {
    { "layers", layers, "layers of the stack" },
    { "hidden", 128, "hidden size: each layer's weight is hidden x hidden" },
    { "batch", 32, "rows of each rank's batch" },
  }
  for _, k in ipairs(knobs) do all[#all + 1] = k end
  return S.common_knobs(all)
end

-- ==== the check ==================================================================================
-- rows: a list of { variant name, { {label, got, ref}, ... } }, ref in f64. Prints, on rank 0, each
-- variant's largest absolute difference from the reference over its outputs and the ranks, and the
-- relative error of its worst output, ||got - ref|| / ||ref|| over every rank's part (Frobenius
-- norms); raises when that exceeds S.rel_tol[dtype]. Normwise, not elementwise: the largest of a
-- million rounding errors grows with the size, their norm does not, while a wrong block or chunk (a
-- schedule's mistake) moves the norm by its share of the tensor. Returns { [variant] = relative error }.
local function sumsq(t) return (t * t):sum():item() end

function S.verify(rows, dtype, what)
  local tol = S.rel_tol[dtype]
  local errs, failed = {}, {}
  S.say("check against %s:", what or "the reference")
  S.say("  %-24s %-6s %14s %15s", "variant", "worst", "max abs error", "relative error")
  for _, row in ipairs(rows) do
    local name, outs = row[1], row[2]
    local mine = {}
    for i, o in ipairs(outs) do
      local got, ref = o[2]:to("f64"), o[3]
      mine[i] = { got:max_abs_diff(ref), sumsq(got - ref), sumsq(ref) }
    end
    -- every rank's figures, the same on all of them: the largest difference, and the norms summed
    local all = tp.allgather(mine)
    local abs, rel, at = 0, 0, "-"
    for i, o in ipairs(outs) do
      local d2, r2 = 0, 0
      for _, r in ipairs(all) do
        abs, d2, r2 = math.max(abs, r[i][1]), d2 + r[i][2], r2 + r[i][3]
      end
      local e = math.sqrt(d2 / (r2 > 0 and r2 or 1))
      if e > rel or e ~= e then rel, at = e, o[1] end
    end
    errs[name] = rel
    local ok = rel <= tol
    if not ok then failed[#failed + 1] = name end
    S.say("  %-24s %-6s %14.3e %15.3e  %s", name, at, abs, rel, ok and "ok" or "TOO LARGE")
  end
  S.say("  (largest difference over the ranks; relative: ||got - ref|| / ||ref||, at most %.0e for %s)", tol, dtype)
  if #failed > 0 then
    error(("the result of %s differs from the reference: relative error above %.0e (%s)"):format(
      table.concat(failed, ", "), tol, dtype), 0)
  end
  return errs
end

-- One step of each variant (after `warmup` untimed ones), traced alone and drawn to PREFIX-NAME.svg,
-- NAME the variant's name in lower case with a dash for each run of other characters: a picture of
-- each schedule at a scale where its ops can be told apart (--trace draws the whole run).
local function draw_each(variants, o)
  if tp.config.trace then
    error(("svg=%s draws each variant's own trace: run without --trace"):format(o.svg), 0)
  end
  for _, v in ipairs(variants) do
    for _ = 1, o.warmup do v[2]() end
    tp.synchronize()
    tp.barrier()
    tp.trace.clear()
    tp.trace.start()
    tp.trace.span(v[1], v[2])
    tp.synchronize()
    tp.trace.stop()
    local file = ("%s-%s.svg"):format(o.svg, v[1]:lower():gsub("[^%w]+", "-"):gsub("%-$", ""))
    tp.trace.svg(file, { title = v[1] })
    tp.trace.clear()
    S.say("drew one step of %s to %s", v[1], file)
  end
end

-- tp.compare with the schedule's iters and warmup, printed unless quiet; iters=0 checks without timing.
function S.compare(variants, o)
  if o.svg ~= "" then draw_each(variants, o) end
  if o.iters == 0 then return nil end
  return tp.compare(variants, { iters = o.iters, warmup = o.warmup, quiet = S.quiet })
end

-- The knobs every schedule has.
function S.common_knobs(knobs)
  for _, k in ipairs {
    { "dtype", "f32", "element type: f32, f64, f16 or bf16" },
    { "iters", 10, "timed iterations of each variant (0: check only)", min = 0 },
    { "warmup", 2, "untimed iterations before them", min = 0 },
    { "quiet", false, "print nothing (the spec runs so)" },
    { "svg", "", "PREFIX: one step of each variant drawn to PREFIX-<variant>.svg (not with --trace)" },
  } do knobs[#knobs + 1] = k end
  return knobs
end

return S

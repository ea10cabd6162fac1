-- schedules_spec.lua: the reference schedules of examples/schedules/ at small sizes, on every rank count
-- CI runs (each schedule checks every variant against its reference computed without communication and
-- raises where one differs; in check mode a race in a schedule fails the test), and their shared
-- module's check and option parser. One timed iteration each, no warm-up: the timing is the scripts'
-- business, not the spec's.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local DIR = here .. "../examples/schedules/"

-- Checked only (iters=0), unless the arguments ask for timed iterations: on 3 ranks of a 2-core machine
-- a collective takes about 10 ms, and a timed run would double the spec's time.
local function run(name, ...)
  local chunk = assert(loadfile(DIR .. name))
  return chunk("quiet=true", "iters=0", "warmup=0", ...)
end

-- every variant within the dtype's tolerance (the script raises otherwise), and timed where asked
local function assert_ran(r, variants, tol)
  local n = 0
  for name, e in pairs(r.errors) do
    n = n + 1
    assert.is_true(e >= 0 and e <= (tol or 1e-5), ("%s: relative error %g"):format(name, e))
  end
  assert.equal(variants, n)
  if r.timings then
    assert.equal(variants, #r.timings)
    for _, row in ipairs(r.timings) do assert.is_true(row.median >= 0, row.name) end
  end
end

describe("examples/schedules", function()
  it("sp_mlp: serial, megatron and pipelined forward and backward match the layer without communication", function()
    local r = run("sp_mlp.lua", "rows=8", "hidden=16", "ffn=8", "chunks=2", "iters=1")
    assert_ran(r, 3)
    assert.is_table(r.timings)
  end)

  it("sp_mlp: bf16", function()
    assert_ran(run("sp_mlp.lua", "rows=4", "hidden=8", "ffn=8", "chunks=2", "dtype=bf16"), 3, 3e-2)
  end)

  it("collective_matmul: AG+GEMM and GEMM+RS, serial, chunked and the send/recv rings", function()
    -- n odd: the bidirectional GEMM+RS ring's halves differ in width
    local r = run("collective_matmul.lua", "m=4", "k=8", "n=7", "chunks=2")
    assert_ran(r["AG+GEMM"], 4)
    assert_ran(r["GEMM+RS"], 4)
  end)

  it("fsdp: a weight that does not split evenly (padded shards), serial, async and prefetching", function()
    assert_ran(run("fsdp.lua", "layers=3", "hidden=7", "batch=4"), 3)
  end)

  it("ddp: after the backward, per layer and in buckets", function()
    -- a layer's gradient is 256 bytes: buckets of two layers and of one
    assert_ran(run("ddp.lua", "layers=3", "hidden=8", "batch=4", "bucket=0.0005"), 3)
  end)

  it("svg= draws one step of each variant to a picture of its own", function()
    local prefix = tp.bcast(tp.rank == 0 and os.tmpname() or nil, 0)
    run("ddp.lua", "layers=1", "hidden=4", "batch=2", "svg=" .. prefix)
    if tp.rank == 0 then
      for _, v in ipairs { "after-backward", "per-layer", "buckets-1" } do
        local f = io.open(prefix .. "-" .. v .. ".svg")
        assert.is_truthy(f, v)
        assert.matches("<svg", f:read("*a"))
        f:close()
        os.remove(prefix .. "-" .. v .. ".svg")
      end
      os.remove(prefix)
    end
  end)

  it("the check raises on a result that differs, naming the variant", function()
    local S = dofile(DIR .. "common.lua")
    S.quiet = true
    local ref = tp.ones({ 4 }, "f64")
    local rows = { { "good", { { "y", tp.ones({ 4 }), ref } } }, { "off by one", { { "y", tp.full({ 4 }, 2), ref } } } }
    assert.has_error(function() S.verify(rows, "f32") end,
      "the result of off by one differs from the reference: relative error above 1e-05 (f32)")
  end)

  it("options: an unknown name or a bad value is an error that names it", function()
    local S = dofile(DIR .. "common.lua")
    local knobs = { { "rows", 8, "rows" }, { "dtype", "f32", "dtype" }, { "pass", "both", "pass", choices = { "fwd", "both" } } }
    assert.same({ rows = 4, dtype = "bf16", pass = "fwd" }, S.options("x.lua", knobs, "rows=4", "--dtype=bf16", "pass=fwd"))
    assert.has_error(function() S.options("x.lua", knobs, "rws=4") end, 'x.lua: unknown option "rws" (options: rows, dtype, pass)')
    assert.has_error(function() S.options("x.lua", knobs, "rows=0") end, "x.lua: rows=0: expected an integer >= 1")
    assert.has_error(function() S.options("x.lua", knobs, "dtype=i32") end,
      "x.lua: dtype=i32: expected a float dtype (f32, f64, f16 or bf16)")
    assert.has_error(function() S.options("x.lua", knobs, "pass=bwd") end, "x.lua: pass=bwd: expected one of fwd, both")
  end)
end)

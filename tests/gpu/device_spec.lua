-- GPU selection: which device a rank runs on, and a --device that names none. CUDA only: on the CPU
-- backend this is reported as skipped. The bad --device runs as a child job (tests/support/child_job.lua),
-- since it ends that job at start-up.
if tp.backend ~= "cuda" then
  describe("cuda device", function() pending("needs --backend cuda") end)
  return
end

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local child = dofile(here .. "../support/child_job.lua")
local EXE = os.getenv("TPSH_EXE")

describe("cuda device", function()
  it("reports the GPU this rank runs on", function()
    assert.is_true(tp.device >= 0)
  end)

  it("refuses a --device that names no visible GPU, instead of taking it modulo the count", function()
    if not EXE then return pending("needs TPSH_EXE") end
    -- Taken modulo the count, --device 4099 ran on GPU 4099 % n without a word.
    local res = child.run(child.quote(EXE) .. " --backend cuda --device 4099 -e 'print(\"ran on\", tp.device)' 2>&1", 60)
    assert.are_not.equal(0, res.status, res.output)
    assert.is_nil(res.output:find("ran on", 1, true), res.output)
    assert.is_truthy(res.output:find("%-%-device 4099: rank 0 sees %d+ GPUs? %(indices 0 to %d+%)"), res.output)
  end)
end)

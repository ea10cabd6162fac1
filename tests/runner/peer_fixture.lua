-- Fixture for tests/runner_spec.lua (mpiexec -n 2 or 3): a test that fails on rank 1 before a
-- collective leaves the other ranks waiting in it; the run must end within seconds, quoting rank 1's
-- failure, not after the watchdog's timeout. The first two tests must not end it: rank 1 fails while
-- rank 0 waits 1.5 s for its own stream (long enough for its watchdog to ask the others, and find
-- nothing that waits for rank 1), and a failure after the collective leaves nobody waiting.
describe("peer fixture", function()
  it("fails on rank 1 while rank 0 waits for its stream", function()
    if tp.rank == 1 then error("rank 1 failed early") end
    tp.spin(1500)
    tp.synchronize()
  end)
  it("fails on rank 1 after the collective", function()
    local x = tp.ones({ 4 })
    tp.world:all_reduce(x)
    assert.are.equal(4 * tp.size, x:sum():item())
    assert.are_not.equal(1, tp.rank)
  end)
  it("fails on rank 1 before the collective", function()
    if tp.rank == 1 then assert.are.equal("the value rank 1 expected", "what it got") end
    local x = tp.ones({ 4 })
    tp.world:all_reduce(x)
    assert.are.equal(4 * tp.size, x:sum():item())
  end)
  it("is never reached", function() end)
end)

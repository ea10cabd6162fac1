-- Fixture for tests/runner_spec.lua (mpiexec -n 2): a test raises on rank 0 after enqueuing a
-- collective that rank 1 never calls. Nothing blocks in the test, so it simply fails; but that
-- all_reduce waits for rank 1 forever, and would pair with rank 1's next all_reduce: the runner must
-- say so after the test and stop, and every rank must end (not hang at shut-down).
describe("dangle fixture", function()
  it("enqueues an all_reduce on rank 0 only, then raises there", function()
    if tp.rank == 0 then
      tp.world:all_reduce(tp.ones({ 4 }))
      error("rank 0 raised after its all_reduce")
    end
  end)
  it("is never reached", function()
    local x = tp.ones({ 4 })
    tp.world:all_reduce(x)
    assert.are.equal(4 * tp.size, x:sum():item())
  end)
end)

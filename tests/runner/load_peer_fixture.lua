-- Fixture for tests/runner_spec.lua (mpiexec -n 2 or 3): a describe body raises on rank 1 before a
-- tp.barrier that the other ranks then wait in, while rank 1 waits at the runner's exchange after the
-- loading. The run must end within seconds naming the loading and quoting rank 1's error, not wait for
-- --timeout (600 s by default) with nothing on the screen.
describe("load peer fixture", function()
  if tp.rank == 1 then error("the describe body fails on rank 1") end
  tp.barrier()
  it("is never reached", function() end)
end)

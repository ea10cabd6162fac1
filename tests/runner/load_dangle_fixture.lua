-- Fixture for tests/runner_spec.lua (mpiexec -n 2): a describe body enqueues an all_reduce on rank 0
-- only. Nothing blocks while the files load; the runner must say after the loading that the collective
-- is left waiting (not blame the first test, which issued nothing) and stop.
describe("load dangle fixture", function()
  if tp.rank == 0 then tp.world:all_reduce(tp.ones({ 4 })) end
  it("issues nothing", function() end)
end)

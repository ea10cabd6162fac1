-- Fixture for tests/runner_spec.lua (mpiexec -n 2): rank 1 names a test otherwise, as many tests on
-- every rank; the error must say which test differs, not only the counts (2 against 2).
describe("names fixture", function()
  it(tp.rank == 1 and "named b" or "named a", function() end)
  it("c", function() end)
end)

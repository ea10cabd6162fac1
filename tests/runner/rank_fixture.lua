-- Fixture for tests/runner_spec.lua: fails only on rank 1, raises only on rank 2.
describe("rank fixture", function()
  it("passes on every rank", function() assert.is_number(tp.rank) end)
  it("fails on rank 1", function() assert.are_not.equal(1, tp.rank) end)
  it("raises on rank 2", function() if tp.rank == 2 then error("rank 2 raised") end end)
  it("still runs collectives afterwards", function()
    assert.are.equal(tp.size, #tp.allgather(tp.rank))
  end)
end)

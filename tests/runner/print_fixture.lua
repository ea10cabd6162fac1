-- Fixture for tests/runner_spec.lua: the ranks other than 0 print in the last test, as a spec that
-- prints its results on every rank does; the summary must still be the last line of stdout.
describe("print fixture", function()
  it("prints on every rank but 0", function()
    if tp.rank ~= 0 then
      for i = 1, 3 do print(("rank %d's line %d"):format(tp.rank, i)) end
    end
  end)
end)

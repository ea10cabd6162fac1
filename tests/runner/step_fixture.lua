-- Fixture for tests/runner_spec.lua (mpiexec -n 2, a test picked with --filter): collectives that only
-- one rank calls must never pair with the runner's own exchanges, and ranks whose runner is at another
-- test are reported as out of step.
describe("step fixture", function()
  it("calls tp.allgather on rank 1 only, then fails there", function()
    if tp.rank == 1 then tp.allgather({ ok = true }); error("fails on rank 1") end
  end)
  it("calls tp.allgather on rank 0 only", function()
    if tp.rank == 0 then tp.allgather(tp.rank) end
  end)
  it("passes", function() end)

  -- A runner out of step, made by hand: rank 1 removes the next test from the block's children as the runner holds them (found
  -- with the debug library), so that it runs "is never reached" while rank 0 runs "is dropped".
  it("drops the next test on rank 1", function()
    if tp.rank ~= 1 then return end
    for level = 2, 50 do
      if not debug.getinfo(level, "f") then break end
      for i = 1, 250 do
        local k, v = debug.getlocal(level, i)
        if not k then break end
        if k == "kids" and type(v) == "table" then
          for j, t in ipairs(v) do
            if type(t) == "table" and t.full == "step fixture is dropped on rank 1" then
              table.remove(v, j)
              return
            end
          end
        end
      end
    end
    error("the runner's list of tests was not found")
  end)
  it("is dropped on rank 1", function() end)
  it("is never reached", function() end)
end)

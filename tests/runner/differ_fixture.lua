-- Fixture for tests/runner_spec.lua (mpiexec -n 2 or 3): collectives that MPI completes although the
-- ranks passed different reduce ops or roots. The runner compares what each test issued on each group.
local ffi = require "ffi"
local mpich = ffi.string(ffi.C.tpsh_versions()):find("MPICH", 1, true)

describe("differ fixture", function()
  it("agrees", function() tp.world:all_reduce(tp.ones({4})) end)
  it("reduces with sum on rank 0 and max elsewhere", function()
    tp.world:all_reduce(tp.ones({4}), { op = tp.rank == 0 and "sum" or "max" })
  end)
  it("agrees after the test that differed", function()
    local x = tp.ones({4})
    tp.world:all_reduce(x)
    tp.world:all_reduce(x)
  end)
  it("issues different collectives on groups of one rank each, which share an id", function()
    local solo, x = tp.world:split(tp.rank), tp.ones({4})
    if tp.rank == 0 then solo:all_reduce(x) else solo:broadcast(x, { root = 0 }) end
  end)
  it("reduces with min on the last rank and max elsewhere, in a group of its own", function()
    local g = tp.world:split(0)
    g:all_reduce(tp.ones({4}), { op = tp.rank == tp.size - 1 and "min" or "max" })
  end)

  -- MPICH reports the broadcast's truncation on the last rank only (it holds 2 elements, the root sends
  -- 4): that rank is left out of the comparison, the other two are still compared
  it("reduces differently on ranks 0 and 1 after a broadcast failed on the last rank only", function()
    if not (tp.size >= 3 and tp.backend == "cpu" and mpich) then return end
    pcall(function()
      tp.world:broadcast(tp.ones({ tp.rank == tp.size - 1 and 2 or 4 }), { root = 0 })
      tp.synchronize()
    end)
    tp.world:all_reduce(tp.ones({4}), { op = tp.rank == 1 and "max" or "sum" })
  end)
end)

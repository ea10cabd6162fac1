-- Fixture for tests/runner_spec.lua (mpiexec -n 3): sends and receives, compared pair by pair after
-- every test (issued.p2p_unmatched). The matched ones pass; the unmatched one stops the run (a later
-- receive from rank 0 would take its message), so the test after it does not run.
describe("p2p fixture", function()
  it("passes a ring in a batch, and sends to oneself", function()
    local a, b, n = tp.ones({4}), tp.empty({4}), tp.size
    tp.world:batch(function() tp.world:send(a, (tp.rank + 1) % n); tp.world:recv(b, (tp.rank - 1) % n) end)
    local g = tp.world:split(0)
    g:batch(function() g:send(a, g.rank); g:recv(b, g.rank) end)
    tp.synchronize()
  end)
  it("sends from rank 0 to rank 2, which receives nothing", function()
    if tp.rank == 0 then tp.world:send(tp.ones({4}), 2) end
  end)
  it("never runs", function() end)
end)

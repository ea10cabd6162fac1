-- An asynchronous error (NCCL's, found by one of tpsh's own queries: cuda_nccl.c notes it so) during a
-- test that raises it nowhere: the test fails with it, and the next test does not inherit it. The note
-- is made here through the same C entry the CUDA backend uses, since no communicator of a CPU run fails
-- asynchronously (runner_spec runs this).
local ffi = require "ffi"
ffi.cdef "void tpsh_async_error_note(const char *message);"

describe("async error fixture", function()
  it("notes an error that none of its calls raises", function()
    tp.world:all_reduce(tp.ones { 4 }, { async = true })
    ffi.C.tpsh_async_error_note("NCCL asynchronous error (noted by the fixture)")
  end)

  it("runs on without it", function()
    local x = tp.ones { 4 }
    tp.world:all_reduce(x)
    assert.are.equal(4 * tp.size, x:sum():item())
  end)

  it("raises it from w:elapsed, not as a Work not yet complete", function()
    local w = tp.world:all_reduce(tp.ones { 4 }, { async = true, timing = true })
    w:block()
    ffi.C.tpsh_async_error_note("NCCL asynchronous error (noted again)")
    assert.has_error(function() w:elapsed() end, "work:elapsed: NCCL asynchronous error (noted again)")
    tp.synchronize()                             -- raised once: told
  end)
end)

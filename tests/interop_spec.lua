-- Native handles for FFI interop (t:data_ptr(), s:handle(), g:handle()): each is checked by handing it
-- to the library that owns it (CUDA, NCCL, MPI) through LuaJIT's FFI.
local ffi = require "ffi"
ffi.cdef [[
  int MPI_Comm_size(int comm, int *size);            /* MPICH: MPI_Comm is an int */
  int MPI_Comm_rank(int comm, int *rank);
  int cudaMemsetAsync(void *p, int value, size_t n, void *stream);
  int ncclCommCount(void *comm, int *count);
  int ncclCommUserRank(void *comm, int *rank);
]]
local cuda = tp.backend == "cuda"

describe("interop handles", function()
  it("t:data_ptr() is element 0's address, views included", function()
    local t = tp.arange(12, "f64"):view({ 3, 4 })
    local row = t:select(1, 2)
    local gap = ffi.cast("char *", row:data_ptr()) - ffi.cast("char *", t:data_ptr())
    assert.are.equal(4 * 8, tonumber(gap))
    if not cuda then
      tp.synchronize()                               -- the CPU backend's streams are threads
      assert.are.equal(5, ffi.cast("double *", row:data_ptr())[1])
    end
  end)

  it("t:data_ptr() on a freed tensor is an error naming the call", function()
    local t = tp.ones { 4 }
    t:free()
    assert.has_error(function() t:data_ptr() end, "tensor:data_ptr: the tensor was freed")
  end)

  it("s:handle() is the native stream: a cudaStream_t on CUDA, nil on the CPU", function()
    local s = tp.stream { name = "interop" }
    if not cuda then
      assert.is_nil(s:handle())
      assert.are.equal(1, select("#", s:handle()))       -- one value: tostring(s:handle()) works
      return
    end
    assert.is_not_nil(s:handle())
    assert.are_not.equal(s:handle(), tp.current_stream():handle())
    -- Zero a tensor of ones with cudaMemsetAsync on s, in order after a spin on s.
    local x = tp.ones({ 1024 }, "f32")
    tp.synchronize()
    tp.with_stream(s, function()
      tp.spin(20)
      assert.are.equal(0, ffi.C.cudaMemsetAsync(x:data_ptr(), 0, x:nbytes(), s:handle()))
    end)
    s:synchronize()
    assert.are.equal(0, x:sum():item())
  end)

  it("g:handle() is the communicator: NCCL's on CUDA, the MPI_Comm on the CPU", function()
    local h = tp.world:handle()
    assert.is_not_nil(h)
    local n = ffi.new("int[1]")
    if cuda then
      assert.are.equal(0, ffi.C.ncclCommCount(h, n))
    else
      assert.are.equal(0, ffi.C.MPI_Comm_size(ffi.cast("int *", h)[0], n))
    end
    assert.are.equal(tp.size, n[0])
  end)

  -- the native communicator of a subgroup numbers the ranks as the group does (on CUDA it is split
  -- from the parent's with each rank's group rank as the key: a key reversed here, a list reversed there)
  local function native_rank_and_size(g)
    local n, r = ffi.new("int[1]"), ffi.new("int[1]")
    if cuda then
      assert.are.equal(0, ffi.C.ncclCommCount(g:handle(), n))
      assert.are.equal(0, ffi.C.ncclCommUserRank(g:handle(), r))
    else
      local c = ffi.cast("int *", g:handle())[0]
      assert.are.equal(0, ffi.C.MPI_Comm_size(c, n))
      assert.are.equal(0, ffi.C.MPI_Comm_rank(c, r))
    end
    return r[0], n[0]
  end

  it("g:handle() of a subgroup numbers its ranks as the group does", function()
    local byparity = tp.world:split(tp.rank % 2, -tp.rank)
    local rank, size = native_rank_and_size(byparity)
    assert.are.same({ byparity.rank, byparity.size }, { rank, size })
    local ranks = {}
    for r = tp.size - 1, 0, -1 do ranks[#ranks + 1] = r end
    local rev = tp.new_group(ranks)
    rank, size = native_rank_and_size(rev)
    assert.are.same({ tp.size - 1 - tp.rank, tp.size }, { rank, size })
    local sub = rev:split(0, tp.rank)                -- a split of a subgroup
    rank, size = native_rank_and_size(sub)
    assert.are.same({ tp.rank, tp.size }, { rank, size })
    assert.is_nil(rev:split(-1))                      -- no member: every rank takes part, none gets one
  end)
end)

# torch_collectives.py: PyTorch's small collectives (torch.distributed, NCCL backend) against the
# same C loop that bench_collectives.lua --ref times tpsh against, in PyTorch's own process: the C
# reference (libtpsh_nccl_ref.so, scripts/bench/nccl_ref_loop.c) runs on PyTorch's communicator, stream and
# buffers, alternately with PyTorch's calls, round by round, the order swapped every round. Context
# for tpsh's own ratio (docs/perf.md); one rank per GPU, started by MPICH's mpiexec:
#   mpiexec -n 2 env -u LD_LIBRARY_PATH python3 scripts/bench/torch_collectives.py [--ref LIB] [--rounds 9]
import ctypes, os, statistics, sys, time

import torch
import torch.distributed as dist

args = sys.argv[1:]
ref_path = args[args.index("--ref") + 1] if "--ref" in args else None
rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 9
rank, size = int(os.environ.get("PMI_RANK", 0)), int(os.environ.get("PMI_SIZE", 1))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
torch.cuda.set_device(rank)
dev = torch.device("cuda", rank)
dist.init_process_group("nccl", rank=rank, world_size=size, device_id=dev)
ITERS = 1000

# The C loop on PyTorch's communicator, when PyTorch hands it out (ProcessGroupNCCL._comm_ptr).
ref, comm = None, None
if ref_path:
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
        comm = ctypes.c_void_p(backend._comm_ptr())
        ref = ctypes.CDLL(ref_path)
        ref.tpsh_nccl_ref_time.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                           ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double)]
        ref.tpsh_nccl_ref_error.restype = ctypes.c_char_p
    except Exception as e:  # an older PyTorch, or the library did not load: PyTorch alone
        if rank == 0:
            print("torch_collectives: no in-process C loop (%s)" % e)
        ref = None


def time_torch(fn):
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / ITERS


OPS = {"all_gather": 0, "all_reduce": 1, "reduce_scatter": 2}    # nccl_ref_loop.h's numbering


def time_ref(op, a, b, count):
    ms, enq = ctypes.c_double(), ctypes.c_double()
    torch.cuda.synchronize()
    dist.barrier()
    st = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    # ncclFloat32 = 7; count = the whole buffer's elements, as bench_collectives.lua passes it
    if ref.tpsh_nccl_ref_time(OPS[op], a.data_ptr(), b.data_ptr(), count, 7, 4, size, comm, st, ITERS, 0,
                              ctypes.byref(ms), ctypes.byref(enq)) != 0:
        raise RuntimeError(ref.tpsh_nccl_ref_error().decode())
    return ms.value * 1e3


def slowest(us):
    t = torch.tensor([us], device=dev, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


for op in ("all_gather", "all_reduce", "reduce_scatter"):
    for nbytes in (1024, 2048, 4096):
        whole = nbytes // 4                      # nccl-tests' size: the gathered output, the input
        piece = whole // size
        if op == "all_gather":
            a, b = torch.ones(piece, device=dev), torch.empty(whole, device=dev)
            fn = lambda: dist.all_gather_into_tensor(b, a)
            ra, rb = a, b
        elif op == "all_reduce":
            a = torch.ones(whole, device=dev)
            fn = lambda: dist.all_reduce(a)
            ra, rb = a, a
        else:
            a, b = torch.ones(whole, device=dev), torch.empty(piece, device=dev)
            fn = lambda: dist.reduce_scatter_tensor(b, a)
            ra, rb = a, b
        for _ in range(100):
            fn()
        if ref:
            time_ref(op, ra, rb, whole)
        ts, cs, ratios = [], [], []
        for r in range(rounds):
            if ref and r % 2:
                c = slowest(time_ref(op, ra, rb, whole)); t = slowest(time_torch(fn))
            else:
                t = slowest(time_torch(fn)); c = slowest(time_ref(op, ra, rb, whole)) if ref else 0.0
            ts.append(t); cs.append(c)
            if ref:
                ratios.append(t / c)
        if rank == 0:
            line = "torch %-15s %5d B: %.2f us a call" % (op, nbytes, statistics.median(ts))
            if ref:
                line += ", C loop %.2f us, torch / C %.3f (median of %d rounds, each in turn)" % (
                    statistics.median(cs), statistics.median(ratios), rounds)
            print(line, flush=True)
dist.destroy_process_group()

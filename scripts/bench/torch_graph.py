# torch_graph.py: scripts/bench/bench_graph.lua's cases in PyTorch on the same GPU: 100 small add_ and 100
# small all_reduce (torch.distributed on NCCL, a world of one rank) run eagerly, against the same 100
# captured once in a torch.cuda.CUDAGraph and replayed. The figures are bench_graph.lua's (tp.time's):
# host = the median time for the call to return (from the start event's record), device = the median
# time between two events around it, wall = the median of call plus synchronisation, each per op, over
# N synchronised iterations after a warm-up; printed as the same "graph-bench" lines, which
# scripts/gpu/gpu_check.sh's graph step sets beside tpsh's.
#   python3 scripts/bench/torch_graph.py [--iters N] [--size ELEMENTS]
import os, statistics, sys, time

import torch
import torch.distributed as dist

args = sys.argv[1:]
iters = int(args[args.index("--iters") + 1]) if "--iters" in args else 30
size = int(args[args.index("--size") + 1]) if "--size" in args else 256
OPS = 100
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)


def timed(fn, warmup=5):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host, device, wall = [], [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        fn()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6 / OPS)
        wall.append((t2 - t0) * 1e6 / OPS)
        device.append(start.elapsed_time(end) * 1e3 / OPS)
    return {"host": statistics.median(host), "device": statistics.median(device), "wall": statistics.median(wall)}


def line(case, side, p):
    print("graph-bench torch %-22s %-6s host_us_per_op %8.3f device_us_per_op %8.3f wall_us_per_op %8.3f"
          % (case, side, p["host"], p["device"], p["wall"]))


def case(name, fn):
    # PyTorch's recipe: warm up on a side stream (NCCL connects, the allocator fills), then capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        fn()
    e, r = timed(fn), timed(g.replay)
    line(name, "eager", e)
    line(name, "graph", r)
    print("ratio torch %-16s graph/eager: host %.3f, wall %.3f, device %.3f; graph host per op %.3f us"
          % (name, r["host"] / e["host"], r["wall"] / e["wall"], r["device"] / e["device"], r["host"]))


print("torch_graph: torch %s on %s, %d ops of %d f32 elements, %d iterations"
      % (torch.__version__, torch.cuda.get_device_name(), OPS, size, iters))
x, y = torch.ones(size, device=dev), torch.ones(size, device=dev)


def adds():
    for _ in range(OPS):
        x.add_(y)


case("add_ x%d" % OPS, adds)
z = torch.ones(size, device=dev)


def reduces():
    for _ in range(OPS):
        dist.all_reduce(z)


case("all_reduce x%d" % OPS, reduces)
dist.destroy_process_group()

# torch_alloc.py: PyTorch's figures for the cases of scripts/bench/bench_alloc.lua, on the same GPU in the
# same run (its CUDACachingAllocator is the reference tpsh's allocator follows): each op into a fresh
# output against the same op with out=, the median per-op time over rounds (the time of a round
# includes the synchronisation after its last op), and the host cost of a cached allocation and free.
#   python3 scripts/bench/torch_alloc.py [--rounds R] [--device cpu|cuda]
import statistics, sys, time

import torch

args = sys.argv[1:]
rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 15
dev = torch.device(args[args.index("--device") + 1] if "--device" in args else "cuda")
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)


def per_op_us(n, fn):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / n


def pair(name, n, fresh, prealloc):
    for _ in range(3):
        per_op_us(n, fresh)
        per_op_us(n, prealloc)
    f, p = [], []
    for r in range(rounds):
        if r % 2:
            f.append(per_op_us(n, fresh)); p.append(per_op_us(n, prealloc))
        else:
            p.append(per_op_us(n, prealloc)); f.append(per_op_us(n, fresh))
    mf, mp = statistics.median(f), statistics.median(p)
    print(f"{name:34s} fresh {mf:10.2f} us  preallocated {mp:10.2f} us  ratio {mf / mp:.3f}")


print(f"torch {torch.__version__} on {dev}" + (f" ({torch.cuda.get_device_name()})" if dev.type == "cuda" else ""))
a, b, c = (torch.randn(512, 512, device=dev) for _ in range(3))
pair("matmul 512x512 f32", 20, lambda: torch.matmul(a, b), lambda: torch.matmul(a, b, out=c))
x, y = torch.randn(1 << 20, device=dev), torch.randn(1 << 20, device=dev)
pair("x * x, 1M f32", 20, lambda: x * x, lambda: torch.mul(x, x, out=y))
u, v, w = (torch.randn(1024, device=dev) for _ in range(3))
pair("a + b, 4 KiB f32", 2000, lambda: u + v, lambda: torch.add(u, v, out=w))


def host_us(n):
    t0 = time.perf_counter()
    for _ in range(n):
        t = torch.empty(1024, device=dev)
        del t
    return (time.perf_counter() - t0) * 1e6 / n


print(f"{'cached alloc + free, host':34s} {statistics.median(host_us(100000) for _ in range(rounds)):.3f} us")

# torch_reduce.py: PyTorch's figures for the cases of scripts/bench/bench_reduce.lua, on the same GPU in the
# same run: the same ops, shapes, dtypes, iteration counts and timing (ITERS ops between two CUDA events,
# the median over rounds), printed as the same "case NAME ms T rate X UNIT" lines, which
# scripts/gpu/gpu_check.sh (step "reduce") joins by NAME. Outputs are preallocated (out=) where PyTorch takes
# one; softmax and the norms have no out= and allocate from PyTorch's cache, which costs no device time.
#   python3 scripts/bench/torch_reduce.py [--n N] [--rounds R] [--dtypes bf16,f32] [--gemm M] [--device cpu|cuda]
import statistics, sys

import torch
import torch.nn.functional as F

args = sys.argv[1:]


def opt(name, default):
    return args[args.index(name) + 1] if name in args else default


N, ROUNDS, M = int(opt("--n", 8192)), int(opt("--rounds", 7)), int(opt("--gemm", 8192))
DTYPES = opt("--dtypes", "bf16,f32").split(",")
dev = torch.device(opt("--device", "cuda"))
cuda = dev.type == "cuda"
DT = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16, "f64": torch.float64}
torch.backends.cuda.matmul.allow_tf32 = False     # tpsh's f32 GEMM is full f32, as PyTorch's default


def per_op_ms(iters, fn):
    import time
    fn()
    if cuda:
        torch.cuda.synchronize()
    ms = []
    for _ in range(ROUNDS):
        if cuda:
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(iters):
                fn()
            t1.record()
            t1.synchronize()
            ms.append(t0.elapsed_time(t1) / iters)
        else:
            s = time.perf_counter()
            for _ in range(iters):
                fn()
            ms.append((time.perf_counter() - s) * 1e3 / iters)
    return statistics.median(ms)


def report(name, ms, amount, unit):
    print(f"case {name:36s} ms {ms:10.4f} rate {amount / ms / 1e6:10.2f} {unit}")


print(f"torch {torch.__version__} on {dev}" + (f" ({torch.cuda.get_device_name()})" if cuda else "")
      + f", rows {N}x{N}, gemm {M}")
iters = 20 if cuda else 2
for d in DTYPES:
    dt, es = DT[d], torch.finfo(DT[d]).bits // 8
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(N, N, device=dev, dtype=dt, generator=g)
    w, b = torch.randn(N, device=dev, dtype=dt, generator=g), torch.randn(N, device=dev, dtype=dt, generator=g)
    r, rc = torch.empty(N, device=dev, dtype=dt), torch.empty(N, device=dev, dtype=dt)
    rw, rd, shape = 2 * N * N * es, (N * N + N) * es, f"{d}/{N}x{N}"
    report(f"softmax/{shape}", per_op_ms(iters, lambda: torch.softmax(x, 1)), rw, "GB/s")
    report(f"log_softmax/{shape}", per_op_ms(iters, lambda: torch.log_softmax(x, 1)), rw, "GB/s")
    report(f"layer_norm/{shape}", per_op_ms(iters, lambda: F.layer_norm(x, (N,), w, b, 1e-5)), rw, "GB/s")
    if hasattr(F, "rms_norm"):
        report(f"rms_norm/{shape}", per_op_ms(iters, lambda: F.rms_norm(x, (N,), w)), rw, "GB/s")
    report(f"sum_dim2/{shape}", per_op_ms(iters, lambda: torch.sum(x, 1, out=r)), rd, "GB/s")
    report(f"sum_dim1/{shape}", per_op_ms(iters, lambda: torch.sum(x, 0, out=rc)), rd, "GB/s")
    report(f"amax_dim2/{shape}", per_op_ms(iters, lambda: torch.amax(x, 1, out=r)), rd, "GB/s")
    del x
    a, bm, c = (torch.randn(M, M, device=dev, dtype=dt, generator=g) for _ in range(3))
    gi = (3 if d == "f32" else 10) if cuda else 1
    flops, gs = 2 * M ** 3, f"{d}/{M}^3"
    report(f"addmm/{gs}", per_op_ms(gi, lambda: torch.addmm(c, a, bm, out=c)), flops / 1e3, "TFLOP/s")
    at = a.t()
    report(f"addmm_at/{gs}", per_op_ms(gi, lambda: torch.addmm(c, at, bm, out=c)), flops / 1e3, "TFLOP/s")
    del a, bm, c, at
    q, B = M // 4, 16
    ba, bb = torch.randn(B, q, q, device=dev, dtype=dt, generator=g), torch.randn(B, q, q, device=dev, dtype=dt, generator=g)
    bo = torch.empty(B, q, q, device=dev, dtype=dt)
    report(f"bmm/{d}/{B}x{q}^3", per_op_ms(gi, lambda: torch.bmm(ba, bb, out=bo)), 2 * B * q ** 3 / 1e3, "TFLOP/s")
    del ba, bb, bo

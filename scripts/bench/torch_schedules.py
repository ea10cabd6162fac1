# torch_schedules.py: PyTorch's reference for the kernels of one layer of examples/schedules/sp_mlp.lua
# (one rank's share: GEMM -> GELU -> GEMM forward, and the backward's five kernels), at the sizes that
# scripts/bench/bench_layer.lua times in tpsh, in the same rows, on one GPU. Each kernel runs on its own with
# preallocated outputs (out=), timed with CUDA events around each iteration; the row gives the median
# over the iterations after a warm-up and the rate (TFLOP/s for a GEMM, 2 m n k flops; GB/s for the
# element-wise ops, the bytes read and written once). GELU is the erf form (approximate='none'), as
# tp.gelu's default.
#   python3 scripts/bench/torch_schedules.py [--rows 4096 --hidden 4096 --ffn 16384 --dtype bf16 --iters 20 --warmup 3]
import argparse
import statistics

import torch

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=4096)
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--ffn", type=int, default=16384)
p.add_argument("--dtype", default="bf16", choices=["f32", "f64", "f16", "bf16"])
p.add_argument("--iters", type=int, default=20)
p.add_argument("--warmup", type=int, default=3)
a = p.parse_args()
dt = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
# tpsh runs its GEMMs without TF32 (docs/api.md, tp.matmul): the same here
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
m, H, F = a.rows, a.hidden, a.ffn
g = torch.Generator(device=dev).manual_seed(1)


def randn(*shape, scale=1.0):
    return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale).to(dt)


X, dY = randn(m, H), randn(m, H)
W1, W2 = randn(H, F, scale=H ** -0.5), randn(F, H, scale=F ** -0.5)
E = lambda *s: torch.empty(*s, device=dev, dtype=dt)
A, Z, Y, dZ, dA, dX, dW1, dW2 = E(m, F), E(m, F), E(m, H), E(m, F), E(m, F), E(m, H), E(H, F), E(F, H)
es = X.element_size()
gemm = lambda x, y, z: 2 * x * y * z

kernels = [
    ("fwd X@W1", lambda: torch.matmul(X, W1, out=A), gemm(m, H, F), None),
    ("fwd gelu", lambda: torch._C._nn.gelu(A, out=Z), None, 2 * m * F * es),
    ("fwd Z@W2", lambda: torch.matmul(Z, W2, out=Y), gemm(m, F, H), None),
    ("bwd dY@W2^T", lambda: torch.matmul(dY, W2.t(), out=dZ), gemm(m, H, F), None),
    ("bwd Z^T@dY", lambda: torch.matmul(Z.t(), dY, out=dW2), gemm(F, m, H), None),
    ("bwd gelu'", lambda: torch.ops.aten.gelu_backward.grad_input(dZ, A, grad_input=dA), None, 3 * m * F * es),
    ("bwd dA@W1^T", lambda: torch.matmul(dA, W1.t(), out=dX), gemm(m, F, H), None),
    ("bwd X^T@dA", lambda: torch.matmul(X.t(), dA, out=dW1), gemm(H, m, F), None),
]
fns = [k[1] for k in kernels]


def layer():
    for f in fns:
        f()


kernels.append(("layer fwd+bwd", layer, 6 * gemm(m, H, F), None))


def median_ms(fn):
    for _ in range(a.warmup):
        fn()
    times = []
    for _ in range(a.iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


print(f"# torch {torch.__version__} ({torch.cuda.get_device_name()}): rows={m} hidden={H} ffn={F} {a.dtype}, median of {a.iters}")
for name, fn, flops, nbytes in kernels:
    t = median_ms(fn)
    rate = f"{flops / t / 1e9:9.3g} TFLOP/s" if flops else f"{nbytes / t / 1e6:9.3g} GB/s"
    print(f"{name:16s} {t:10.3f} ms {rate}")

# torch_pointwise.py: PyTorch's figures for the cases of scripts/bench/bench_pointwise.lua, on the same GPU in
# the same run: each op into a preallocated output (out=, or in place) on 64 MiB tensors, the median of
# per-iteration CUDA-event times, GB/s counting every tensor the op reads or writes once, as
# bench_pointwise.lua counts them. scripts/gpu/gpu_check.sh (step "pointwise") pairs the lines.
#   python3 scripts/bench/torch_pointwise.py [--mib M] [--iters I] [--dtypes f32,bf16,f16] [--device cpu|cuda]
# Lines: torch <case> <dtype> <ms> ms <GB/s> GB/s
import statistics, sys, time

import torch

args = sys.argv[1:]
def opt(name, default):
    return args[args.index(name) + 1] if name in args else default

MIB = int(opt("--mib", 64))
dev = torch.device(opt("--device", "cuda"))
ITERS = int(opt("--iters", 20 if dev.type == "cuda" else 3))
DTYPES = opt("--dtypes", "f32,bf16,f16" if dev.type == "cuda" else "f32,bf16").split(",")
TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
COLS = 4096


def median_ms(fn):
    fn()
    times = []
    for _ in range(ITERS):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter(); fn(); times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# name, tensors moved, fn(x, y, o, xm, om, row): the cases of bench_pointwise.lua, in its order
cases = [
    # torch.relu has no out=; it is clamp_min(x, 0) (aten's relu calls it), which has
    ("relu", 2, lambda x, y, o, xm, om, row: torch.clamp_min(x, 0, out=o)),
    ("relu_ (in place)", 2, lambda x, y, o, xm, om, row: x.relu_()),
    ("gelu", 2, lambda x, y, o, xm, om, row: torch._C._nn.gelu(x, out=o)),
    ("gelu tanh", 2, lambda x, y, o, xm, om, row: torch._C._nn.gelu(x, approximate="tanh", out=o)),
    ("silu", 2, lambda x, y, o, xm, om, row: torch._C._nn.silu(x, out=o)),
    ("sigmoid", 2, lambda x, y, o, xm, om, row: torch.sigmoid(x, out=o)),
    ("exp", 2, lambda x, y, o, xm, om, row: torch.exp(x, out=o)),
    ("x * 2.5", 2, lambda x, y, o, xm, om, row: torch.mul(x, 2.5, out=o)),
    ("x / 3", 2, lambda x, y, o, xm, om, row: torch.div(x, 3, out=o)),
    ("pow 2", 2, lambda x, y, o, xm, om, row: torch.pow(x, 2, out=o)),
    ("a + b", 3, lambda x, y, o, xm, om, row: torch.add(x, y, out=o)),
    ("a * b", 3, lambda x, y, o, xm, om, row: torch.mul(x, y, out=o)),
    ("a / b", 3, lambda x, y, o, xm, om, row: torch.div(x, y, out=o)),
    ("maximum", 3, lambda x, y, o, xm, om, row: torch.maximum(x, y, out=o)),
    ("gelu_backward", 3, lambda x, y, o, xm, om, row: torch.ops.aten.gelu_backward.grad_input(y, x, grad_input=o)),
    ("add_ (in place)", 3, lambda x, y, o, xm, om, row: x.add_(y)),
    ("matrix + bias row", 2, lambda x, y, o, xm, om, row: torch.add(xm, row, out=om)),
]

print(f"torch {torch.__version__} on {dev}" + (f" ({torch.cuda.get_device_name()})" if dev.type == "cuda" else "")
      + f": {MIB} MiB a tensor, {ITERS} iterations a case (median)")
for dt in DTYPES:
    td = TORCH_DTYPE[dt]
    nbytes = MIB * 2 ** 20
    n = nbytes // torch.tensor([], dtype=td).element_size()
    g = torch.Generator(device=dev).manual_seed(1)
    x = (torch.rand(n, device=dev, generator=g) + 0.5).to(td)
    y = (torch.rand(n, device=dev, generator=g) * 2 - 1).to(td)
    o = torch.empty(n, device=dev, dtype=td)
    row = torch.rand(COLS, device=dev, generator=g).to(td)
    xm, om = x.view(n // COLS, COLS), o.view(n // COLS, COLS)
    for name, tensors, fn in cases:
        try:
            ms = median_ms(lambda: fn(x, y, o, xm, om, row))
        except Exception as e:      # an op this PyTorch lacks (an older version's names): the other cases go on
            print(f"torch {name.replace(' ', '_'):20s} {dt:5s} failed: {e}")
            continue
        print(f"torch {name.replace(' ', '_'):20s} {dt:5s} {ms:9.3f} ms {tensors * nbytes / (ms * 1e-3) / 1e9:9.1f} GB/s")
    del x, y, o, xm, om

#!/usr/bin/env python3
"""torch_cuda_ops.py: the PyTorch anchor of benchmarks/bench_cuda_ops.cpp on cuda:0: the same workloads,
sizes, byte counts and timing (3 warm-up calls, then the median over 7 batches of the time per call,
each batch between two device synchronizations), one JSON line per result with "impl":"pytorch".
    python3 torch_cuda_ops.py [--quick]
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def time_per_call(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        per_call.append((time.perf_counter() - t0) / reps)
    return statistics.median(per_call)


def report(op, dtype, shape, seconds, unit, amount):
    print(json.dumps({"bench": "cuda_ops", "impl": "pytorch", "op": op, "dtype": dtype, "shape": shape,
                      "ms": round(seconds * 1e3, 4), unit: round(amount / seconds / 1e9, 1)}), flush=True)


def main():
    quick = "--quick" in sys.argv[1:]
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(0)
    for name, dtype, tf32 in (("float32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bfloat16", torch.bfloat16, False), ("float16", torch.float16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for n in (1024, 2048, 4096, 8192):
            if quick and n > 2048:
                break
            a = torch.rand(n, n, device=dev, generator=g).to(dtype)
            b = torch.rand(n, n, device=dev, generator=g).to(dtype)
            flop = 2.0 * n ** 3
            reps = max(2, int(2e12 / flop / (20 if dtype == torch.float32 and not tf32 else 1)))
            report("gemm", name, str(n), time_per_call(lambda: torch.matmul(a, b), min(reps, 200)), "tflops", flop / 1e3)
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        tokens, d_in, d_out = (2048 if quick else 8192), 768, 3072
        x = torch.randn(tokens, d_in, device=dev, generator=g).to(dtype)
        w = torch.randn(d_out, d_in, device=dev, generator=g).to(dtype)
        bias = torch.randn(d_out, device=dev, generator=g).to(dtype)
        report("linear", name, f"{tokens}x768x3072", time_per_call(lambda: F.linear(x, w, bias), 100), "tflops",
               2.0 * tokens * d_in * d_out / 1e3)
        report("linear_gelu", name, f"{tokens}x768x3072",
               time_per_call(lambda: F.gelu(F.linear(x, w, bias), approximate="tanh"), 100), "tflops",
               2.0 * tokens * d_in * d_out / 1e3)
    count = 1 << 24
    pageable = torch.randn(count, generator=torch.Generator().manual_seed(0))
    pinned = pageable.pin_memory()
    dev_t = pinned.to(dev)
    report("h2d", "pageable", "64MiB", time_per_call(lambda: pageable.to(dev), 20), "gbps", 4.0 * count)
    report("h2d", "pinned", "64MiB", time_per_call(lambda: pinned.to(dev, non_blocking=True), 20), "gbps", 4.0 * count)
    report("d2h", "pageable", "64MiB", time_per_call(lambda: dev_t.to("cpu"), 20), "gbps", 4.0 * count)
    report("d2h", "pinned", "64MiB", time_per_call(lambda: dev_t.to("cpu", non_blocking=True), 20), "gbps",
           4.0 * count)

    n = (1 << 24) if quick else (1 << 26)
    f = 4.0
    a = torch.randn(n, device=dev, generator=g)
    b = torch.randn(n, device=dev, generator=g)
    report("add", "float32", str(n), time_per_call(lambda: a + b, 50), "gbps", 3 * f * n)
    report("gelu", "float32", str(n), time_per_call(lambda: F.gelu(a), 50), "gbps", 2 * f * n)
    report("clone", "float32", str(n), time_per_call(lambda: a.clone(), 50), "gbps", 2 * f * n)
    report("sum", "float32", str(n), time_per_call(lambda: a.sum(), 50), "gbps", f * n)
    ah, bh = a.bfloat16(), b.bfloat16()
    report("add", "bfloat16", str(n), time_per_call(lambda: ah + bh, 50), "gbps", 3 * 2.0 * n)

    rows, cols = (2048 if quick else 8192), 4096
    rs = f"{rows}x{cols}"
    x = torch.randn(rows, cols, device=dev, generator=g)
    report("softmax", "float32", rs, time_per_call(lambda: x.softmax(1), 50), "gbps", 2 * f * rows * cols)
    bias_row = torch.randn(cols, device=dev, generator=g)
    report("add_bias", "float32", rs, time_per_call(lambda: x + bias_row, 50), "gbps", 2 * f * rows * cols)
    w, bias = torch.ones(cols, device=dev), torch.zeros(cols, device=dev)
    report("layer_norm", "float32", rs, time_per_call(lambda: F.layer_norm(x, (cols,), w, bias), 50), "gbps",
           2 * f * rows * cols)
    # Forward and backward (the input's gradient), five passes, as bench_cuda_ops.
    xg, gy = x.clone().requires_grad_(), torch.randn(rows, cols, device=dev, generator=g)
    report("softmax_fwd_bwd", "float32", rs,
           time_per_call(lambda: torch.autograd.grad(xg.softmax(1), xg, gy), 20), "gbps", 5 * f * rows * cols)
    report("layer_norm_fwd_bwd", "float32", rs,
           time_per_call(lambda: torch.autograd.grad(F.layer_norm(xg, (cols,), w, bias), xg, gy), 20), "gbps",
           5 * f * rows * cols)
    target = torch.randint(0, cols, (rows,), device=dev, generator=g)
    report("cross_entropy", "float32", rs, time_per_call(lambda: F.cross_entropy(x, target), 50), "gbps",
           f * rows * cols)
    report("sum_rows", "float32", rs, time_per_call(lambda: x.sum(0), 50), "gbps", f * rows * cols)
    # GPT-2's c_attn bias gradient: (batch 16 x 1024 tokens, 2304) in bfloat16, summed over the rows.
    tokens = 2048 if quick else 16384
    xb = torch.randn(tokens, 2304, device=dev, generator=g).to(torch.bfloat16)
    report("sum_rows", "bfloat16", f"{tokens}x2304", time_per_call(lambda: xb.sum(0), 50), "gbps", 2.0 * tokens * 2304)

    params = []
    for _ in range(16):
        p = torch.randn(1 << 22, device=dev, generator=g).requires_grad_()
        p.grad = torch.randn(1 << 22, device=dev, generator=g)
        params.append(p)
    opt = torch.optim.AdamW(params, foreach=True)
    report("adamw", "float32", "16x4194304", time_per_call(opt.step, 20), "gbps", 7 * f * 16 * (1 << 22))
    fused = torch.optim.AdamW(params, fused=True)
    report("adamw_fused", "float32", "16x4194304", time_per_call(fused.step, 20), "gbps", 7 * f * 16 * (1 << 22))


if __name__ == "__main__":
    main()

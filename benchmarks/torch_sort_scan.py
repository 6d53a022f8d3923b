#!/usr/bin/python3
# benchmarks/torch_sort_scan.py: PyTorch's side of bench_sort_scan.cpp (same shapes, parts and timing
# rule: median of 7 runs after 2 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_sort_scan.py [threads] (default 2).
import json
import sys

import torch
import torch_timing

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)


def report(part, fn):
    ms = torch_timing.median_ms(fn, 2, 7)
    print(json.dumps({"bench": "sort_scan", "impl": "torch " + torch.__version__, "device": "cpu",
                      "threads": threads, "part": part, "ms": round(ms, 3)}), flush=True)


torch.manual_seed(0)
square, line = torch.randn(1024, 1024), torch.randn(1 << 20)
logits = torch.randn(64, 50257)
with torch.no_grad():
    report("sort_1024x1024_last", lambda: torch.sort(square, dim=-1, stable=True))
    report("sort_1024x1024_dim0", lambda: torch.sort(square, dim=0, stable=True))
    report("sort_2^20", lambda: torch.sort(line, dim=0, stable=True))
    report("topk_50_of_64x50257", lambda: torch.topk(logits, 50))
    report("topk_1000_of_64x50257", lambda: torch.topk(logits, 1000))
    report("median_1024x1024_rows", lambda: torch.median(square, 1))
    report("cumsum_1024x1024_last", lambda: torch.cumsum(square, -1))
    report("cumsum_1024x1024_dim0", lambda: torch.cumsum(square, 0))
    report("cummax_1024x1024_last", lambda: torch.cummax(square, -1))
    report("logcumsumexp_1024x1024_last", lambda: torch.logcumsumexp(square, -1))
    q, k = torch.randn(8, 12, 256, 64), torch.randn(8, 12, 256, 64)
    report("einsum_bhqd_bhkd", lambda: torch.einsum("bhqd,bhkd->bhqk", q, k))
    x1, w, x2 = torch.randn(256, 64), torch.randn(32, 64, 48), torch.randn(256, 48)
    report("einsum_bilinear", lambda: torch.einsum("bi,kij,bj->bk", x1, w, x2))
x = square.clone().requires_grad_()
near_one = (square * 0.01 + 1).requires_grad_()


def fwd_bwd(t, fn):
    def run():
        t.grad = None
        fn(t).sum().backward()
    return run


report("cumsum_1024x1024_last_forward_backward", fwd_bwd(x, lambda t: torch.cumsum(t, -1)))
report("cumprod_1024x1024_last_forward_backward", fwd_bwd(near_one, lambda t: torch.cumprod(t, -1)))

#!/usr/bin/python3
# benchmarks/torch_linalg.py: PyTorch's side of bench_linalg.cpp (same shapes, parts and timing rule:
# median of 7 runs after 2 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_linalg.py [threads] (default 2).
import json
import sys

import torch
import torch_timing

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)


def report(part, fn):
    ms = torch_timing.median_ms(fn, 2, 7)
    print(json.dumps({"bench": "linalg", "impl": "torch " + torch.__version__, "device": "cpu",
                      "threads": threads, "part": part, "ms": round(ms, 3)}), flush=True)


torch.manual_seed(0)
with torch.no_grad():
    for n in (8, 128):
        batch, tag = (256, "256x8x8") if n == 8 else (1, "128x128")
        x, b = torch.randn(batch, n, n, dtype=torch.float64), torch.randn(batch, n, 8, dtype=torch.float64)
        a = x + n * torch.eye(n, dtype=torch.float64)
        spd = x @ x.mT + n * torch.eye(n, dtype=torch.float64)
        l = torch.linalg.cholesky(spd)
        report("solve_" + tag, lambda: torch.linalg.solve(a, b))
        if n == 8:
            report("inv_" + tag, lambda: torch.linalg.inv(a))
            report("det_" + tag, lambda: torch.linalg.det(a))
        report("cholesky_" + tag, lambda: torch.linalg.cholesky(spd))
        if n == 8:
            report("solve_triangular_" + tag, lambda: torch.linalg.solve_triangular(l, b, upper=False))
            report("cholesky_solve_" + tag, lambda: torch.cholesky_solve(b, l))
        report("eigh_" + tag, lambda: torch.linalg.eigh(spd))
        report("qr_" + tag, lambda: torch.linalg.qr(a))
        lu, pivots = torch.linalg.lu_factor(a)
        report("lu_factor_" + tag, lambda: torch.linalg.lu_factor(a))
        report("lu_solve_" + tag, lambda: torch.linalg.lu_solve(lu, pivots, b))
        report("matrix_exp_" + tag, lambda: torch.linalg.matrix_exp(x))
        report("svd_" + tag, lambda: torch.linalg.svd(x, full_matrices=False))
        report("svdvals_" + tag, lambda: torch.linalg.svdvals(x))
        report("pinv_" + tag, lambda: torch.linalg.pinv(x))
        report("lstsq_" + tag, lambda: torch.linalg.lstsq(x, b, driver="gelsd"))
    tall, rhs = torch.randn(1024, 64, dtype=torch.float64), torch.randn(1024, 8, dtype=torch.float64)
    report("svd_1024x64", lambda: torch.linalg.svd(tall, full_matrices=False))
    report("svdvals_1024x64", lambda: torch.linalg.svdvals(tall))
    report("lstsq_1024x64", lambda: torch.linalg.lstsq(tall, rhs, driver="gelsd"))

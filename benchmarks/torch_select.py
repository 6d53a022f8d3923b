#!/usr/bin/python3
# benchmarks/torch_select.py: PyTorch's side of bench_select.cpp (same shapes, distributions, parts and
# timing rule: median of 7 runs after 2 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_select.py [threads] (default 2).
import json
import sys

import torch
import torch_timing

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)


def report(part, fn):
    ms = torch_timing.median_ms(fn, 2, 7)
    print(json.dumps({"bench": "select", "impl": "torch " + torch.__version__, "device": "cpu",
                      "threads": threads, "part": part, "ms": round(ms, 3)}), flush=True)


torch.manual_seed(0)
mask = torch.rand(1 << 24) < 0.5
big, big_mask = torch.randn(4096, 4096), torch.rand(4096, 4096) < 0.5
ints, rows = torch.randint(0, 1000, (1 << 20,)), torch.randint(0, 8, (65536, 4))
boundaries, probes = torch.sort(torch.randn(1000))[0], torch.randn(1 << 20)
square, q = torch.randn(1024, 1024), torch.tensor([0.1, 0.5, 0.9])
values = torch.randn(1 << 20)
with torch.no_grad():
    report("nonzero_2^24", lambda: torch.nonzero(mask))
    report("masked_select_4096x4096", lambda: torch.masked_select(big, big_mask))
    report("unique_2^20_int64", lambda: torch.unique(ints, sorted=True, return_inverse=True, return_counts=True))
    report("unique_rows_65536x4", lambda: torch.unique(rows, sorted=True, return_inverse=True, return_counts=True,
                                                       dim=0))
    report("searchsorted_2^20_into_1000", lambda: torch.searchsorted(boundaries, probes))
    report("quantile_3q_1024x1024_rows", lambda: torch.quantile(square, q, dim=1))
    report("bincount_2^20_into_1000", lambda: torch.bincount(ints))
    report("histc_2^20_100_bins", lambda: torch.histc(values, 100, -3, 3))
x = torch.randn(1024, 1024).requires_grad_()
x_mask = torch.rand(1024, 1024) < 0.5


def masked_select_fwd_bwd():
    x.grad = None
    torch.masked_select(x, x_mask).sum().backward()


report("masked_select_1024x1024_forward_backward", masked_select_fwd_bwd)

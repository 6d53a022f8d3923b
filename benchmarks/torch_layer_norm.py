#!/usr/bin/python3
# benchmarks/torch_layer_norm.py: PyTorch's side of bench_layer_norm.cpp (same shapes, dtypes, parts and
# timing rule: median of 101 runs after 10 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_layer_norm.py [threads] (default 2).
import json
import sys

import torch
import torch.nn.functional as F
import torch_timing

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)


def median_ms(fn):
    return torch_timing.median_ms(fn, 10, 101)


for dtype, name in ((torch.float32, "float32"), (torch.float64, "float64")):
    for rows, width in ((2048, 128), (512, 768)):
        torch.manual_seed(0)
        x, cot = torch.randn(rows, width, dtype=dtype), torch.randn(rows, width, dtype=dtype)
        w = torch.randn(width, dtype=dtype, requires_grad=True)
        b = torch.randn(width, dtype=dtype, requires_grad=True)
        xg = x.clone().requires_grad_()

        def forward():
            with torch.no_grad():
                F.layer_norm(x, (width,), w, b)

        def forward_backward():
            for p in (xg, w, b):
                p.grad = None
            F.layer_norm(xg, (width,), w, b).backward(cot)

        for part, fn in (("forward", forward), ("forward_backward", forward_backward)):
            print(json.dumps({"bench": "layer_norm", "impl": "pytorch", "device": "cpu", "threads": threads,
                              "dtype": name, "rows": rows, "width": width, "part": part,
                              "ms_median": round(median_ms(fn), 4)}))

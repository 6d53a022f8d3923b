#!/usr/bin/python3
# benchmarks/torch_rnn.py: PyTorch's side of bench_rnn.cpp (same shapes, parts and timing rule: median
# of 7 runs after 2 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_rnn.py [threads] (default 2).
import json
import sys

import torch
import torch_timing

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)


def median_ms(fn):
    return torch_timing.median_ms(fn, 2, 7)


def report(part, ms):
    print(json.dumps({"bench": "rnn", "impl": "torch " + torch.__version__, "device": "cpu", "threads": threads,
                      "part": part, "ms": round(ms, 3)}), flush=True)


torch.manual_seed(0)
x = torch.randn(64, 32, 256).requires_grad_()
for name, layer in (("lstm", torch.nn.LSTM(256, 256, 2)), ("gru", torch.nn.GRU(256, 256, 2))):
    def forward():
        with torch.no_grad():
            layer(x)

    def forward_backward():
        layer.zero_grad()
        x.grad = None
        layer(x)[0].sum().backward()

    report(name + "_forward", median_ms(forward))
    report(name + "_forward_backward", median_ms(forward_backward))
cell = torch.nn.LSTMCell(256, 256)
step = torch.randn(32, 256)


def cell_forward():
    with torch.no_grad():
        cell(step)


report("lstm_cell_forward", median_ms(cell_forward))

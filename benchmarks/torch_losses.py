#!/usr/bin/python3
# benchmarks/torch_losses.py: PyTorch's side of bench_losses.cpp (same shapes, parts and timing rule:
# median of 7 runs after 2 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_losses.py [threads] (default 2).
import json
import sys

import torch
import torch.nn.functional as F
import torch_timing

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)


def median_ms(fn):
    return torch_timing.median_ms(fn, 2, 7)


def report(part, ms):
    print(json.dumps({"bench": "losses", "impl": "torch " + torch.__version__, "device": "cpu", "threads": threads,
                      "part": part, "ms": round(ms, 3)}), flush=True)


def fwd_bwd(part, inputs, fn):
    inputs = [t.requires_grad_() for t in inputs]

    def run():
        for t in inputs:
            t.grad = None
        fn(*inputs).backward()

    report(part, median_ms(run))


torch.manual_seed(0)
for frames, samples, classes, length in ((50, 16, 20, 10), (200, 32, 30, 40)):
    targets = torch.tensor([1 + (i * 7) % (classes - 1) for i in range(samples * length)]).view(samples, length)
    in_len = torch.full((samples,), frames)
    tgt_len = torch.full((samples,), length)
    fwd_bwd(f"ctc_T{frames}_forward_backward", [torch.randn(frames, samples, classes)],
            lambda x: F.ctc_loss(x.log_softmax(2), targets, in_len, tgt_len))
signs = (torch.randn(1024) > 0).float() * 2 - 1
fwd_bwd("triplet_margin_forward_backward", [torch.randn(1024, 128) for _ in range(3)], F.triplet_margin_loss)
classes100 = torch.randint(0, 100, (1024,))
fwd_bwd("multi_margin_forward_backward", [torch.randn(1024, 100)], lambda x: F.multi_margin_loss(x, classes100))
listed = torch.randint(0, 64, (256, 64))
listed[:, 8] = -1
fwd_bwd("multilabel_margin_forward_backward", [torch.randn(256, 64)], lambda x: F.multilabel_margin_loss(x, listed))
fwd_bwd("cosine_embedding_forward_backward", [torch.randn(1024, 256), torch.randn(1024, 256)],
        lambda a, b: F.cosine_embedding_loss(a, b, signs))
fwd_bwd("gaussian_nll_forward_backward", [torch.randn(1024, 256), torch.randn(1024, 256), torch.rand(1024, 256) + 0.1],
        F.gaussian_nll_loss)
fwd_bwd("cosine_similarity_forward_backward", [torch.randn(1024, 256), torch.randn(1024, 256)],
        lambda a, b: F.cosine_similarity(a, b).mean())

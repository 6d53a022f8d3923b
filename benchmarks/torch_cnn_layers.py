#!/usr/bin/python3
# benchmarks/torch_cnn_layers.py: PyTorch's side of bench_cnn_layers.cpp (same layers, shapes, parts and
# timing rule: median of 15 runs after 3 warm-up runs), for Debian's /usr/bin/python3 with torch.
# Usage: /usr/bin/python3 benchmarks/torch_cnn_layers.py [threads] [--autocast bf16] (threads default 2);
# --autocast bf16 as bench_cnn_layers: the CNN's parts under bfloat16 autocast, the rest skipped.
import json
import sys

import torch
import torch.nn.functional as F
import torch_timing

args = sys.argv[1:]
bf16 = args[-2:] == ["--autocast", "bf16"]
if bf16:
    args = args[:-2]
threads = int(args[0]) if args else 2
torch.set_num_threads(threads)
torch.manual_seed(0)
x = torch.randn(128, 1, 28, 28)
w1 = (torch.randn(32, 1, 3, 3) * 0.3).requires_grad_()
b1 = torch.zeros(32, requires_grad=True)
w2 = (torch.randn(64, 32, 3, 3) * 0.06).requires_grad_()
b2 = torch.zeros(64, requires_grad=True)
cot = torch.randn(128, 64, 7, 7)


def forward():
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
    return F.max_pool2d(F.relu(F.conv2d(h, w2, b2, padding=1)), 2)


def median_ms(fn):
    return torch_timing.median_ms(fn, 3, 15)


def report(part, ms):
    line = {"bench": "cnn_layers", "impl": "torch " + torch.__version__, "device": "cpu",
            "threads": threads, "batch": 128}
    if bf16:
        line["autocast"] = "bf16"
    line.update({"part": part, "ms": round(ms, 3)})
    print(json.dumps(line))


def fwd_bwd():
    for p in (w1, b1, w2, b2):
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = forward()
    out.backward(cot)


report("forward_backward", median_ms(fwd_bwd))
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
    report("forward", median_ms(forward))
    c1 = F.relu(F.conv2d(x, w1, b1, padding=1))
    p1 = F.max_pool2d(c1, 2)
    c2 = F.relu(F.conv2d(p1, w2, b2, padding=1))
    report("conv1_forward", median_ms(lambda: F.conv2d(x, w1, b1, padding=1)))
    report("pool1_forward", median_ms(lambda: F.max_pool2d(c1, 2)))
    report("conv2_forward", median_ms(lambda: F.conv2d(p1, w2, b2, padding=1)))
    report("pool2_forward", median_ms(lambda: F.max_pool2d(c2, 2)))
    g2 = torch.randn(c2.shape).to(c2.dtype)
    w2_used = w2.to(c2.dtype)
    report("conv2_backward_input",
           median_ms(lambda: torch.nn.grad.conv2d_input(p1.shape, w2_used, g2, padding=1)))
    report("conv2_backward_weight",
           median_ms(lambda: torch.nn.grad.conv2d_weight(p1, w2.shape, g2, padding=1)))
if bf16:
    sys.exit(0)

# Beyond the CNN, as bench_cnn_layers.cpp: conv3d, conv_transpose2d, a stride-2 conv2d, adaptive max
# pooling, gather and scatter_add, upsampling, reflect padding, 3-D pooling, overlapping 2-D average
# pooling, conv_transpose3d, unfold and fold.
x3 = torch.randn(4, 16, 16, 32, 32)
w3 = (torch.randn(32, 16, 3, 3, 3) * 0.05).requires_grad_()
cot3 = torch.randn(4, 32, 16, 32, 32)
a = torch.randn(128, 32, 28, 28).requires_grad_()
cot_a = torch.randn(128, 32, 5, 5)


def conv3d_fwd_bwd():
    w3.grad = None
    F.conv3d(x3, w3, None, 1, 1).backward(cot3)


xt = torch.randn(32, 64, 14, 14)
wt = (torch.randn(64, 32, 4, 4) * 0.05).requires_grad_()
cot_t = torch.randn(32, 32, 28, 28)


def conv_transpose_fwd_bwd():
    wt.grad = None
    F.conv_transpose2d(xt, wt, None, 2, 1).backward(cot_t)


xs = torch.randn(64, 32, 28, 28).requires_grad_()
ws = (torch.randn(64, 32, 3, 3) * 0.06).requires_grad_()
cot_s = torch.randn(64, 64, 14, 14)


def conv_stride2_fwd_bwd():
    xs.grad = None
    ws.grad = None
    F.conv2d(xs, ws, None, 2, 1).backward(cot_s)


def adaptive_max_fwd_bwd():
    a.grad = None
    F.adaptive_max_pool2d(a, 5).backward(cot_a)


report("conv3d_forward_backward", median_ms(conv3d_fwd_bwd))
report("conv_transpose2d_forward_backward", median_ms(conv_transpose_fwd_bwd))
report("conv_stride2_forward_backward", median_ms(conv_stride2_fwd_bwd))
report("adaptive_max_pool_forward_backward", median_ms(adaptive_max_fwd_bwd))
with torch.no_grad():
    report("conv3d_forward", median_ms(lambda: F.conv3d(x3, w3, None, 1, 1)))
    report("conv_transpose2d_forward", median_ms(lambda: F.conv_transpose2d(xt, wt, None, 2, 1)))
    report("adaptive_max_pool_forward", median_ms(lambda: F.adaptive_max_pool2d(a, 5)))
    src = torch.randn(2048, 2048)
    picks = torch.randint(0, 2048, (2048, 2048))
    base = torch.zeros(2048, 2048)
    report("gather_dim1", median_ms(lambda: src.gather(1, picks)))
    report("gather_dim0", median_ms(lambda: src.gather(0, picks)))
    report("scatter_add_dim1", median_ms(lambda: base.scatter_add(1, picks, src)))
u = torch.randn(8, 32, 64, 64).requires_grad_()
cot_u, cot_p = torch.randn(8, 32, 128, 128), torch.randn(8, 32, 70, 70)


def upsample_fwd_bwd():
    u.grad = None
    F.interpolate(u, scale_factor=2, mode="bilinear").backward(cot_u)


def pad_reflect_fwd_bwd():
    u.grad = None
    F.pad(u, (3, 3, 3, 3), mode="reflect").backward(cot_p)


report("upsample_bilinear_forward_backward", median_ms(upsample_fwd_bwd))
report("pad_reflect_forward_backward", median_ms(pad_reflect_fwd_bwd))
with torch.no_grad():
    report("upsample_bilinear_forward", median_ms(lambda: F.interpolate(u, scale_factor=2, mode="bilinear")))
    report("upsample_nearest_forward", median_ms(lambda: F.interpolate(u, scale_factor=2)))
    report("pad_reflect_forward", median_ms(lambda: F.pad(u, (3, 3, 3, 3), mode="reflect")))
v = x3.clone().requires_grad_()
cot_v = torch.randn(4, 16, 8, 16, 16)
xd = torch.randn(4, 32, 8, 16, 16)
wd = (torch.randn(32, 16, 4, 4, 4) * 0.05).requires_grad_()
cot_d = torch.randn(4, 16, 16, 32, 32)


def max_pool3d_fwd_bwd():
    v.grad = None
    F.max_pool3d(v, 2).backward(cot_v)


def conv_transpose3d_fwd_bwd():
    wd.grad = None
    F.conv_transpose3d(xd, wd, None, 2, 1).backward(cot_d)


xa = torch.randn(64, 16, 32, 32).requires_grad_()
cot_xa = torch.randn(64, 16, 16, 16)


def avg_pool2d_fwd_bwd():
    xa.grad = None
    F.avg_pool2d(xa, 3, 2, 1).backward(cot_xa)


report("avg_pool2d_forward_backward", median_ms(avg_pool2d_fwd_bwd))
report("max_pool3d_forward_backward", median_ms(max_pool3d_fwd_bwd))
report("conv_transpose3d_forward_backward", median_ms(conv_transpose3d_fwd_bwd))
with torch.no_grad():
    report("max_pool3d_forward", median_ms(lambda: F.max_pool3d(x3, 2)))
    report("avg_pool3d_forward", median_ms(lambda: F.avg_pool3d(x3, 3, 2, 1)))
    report("avg_pool2d_forward", median_ms(lambda: F.avg_pool2d(xa, 3, 2, 1)))
    report("conv_transpose3d_forward", median_ms(lambda: F.conv_transpose3d(xd, wd, None, 2, 1)))
    img = torch.randn(32, 64, 28, 28)
    cols = F.unfold(img, 3, padding=1)
    report("unfold_forward", median_ms(lambda: F.unfold(img, 3, padding=1)))
    report("fold_forward", median_ms(lambda: F.fold(cols, (28, 28), 3, padding=1)))

#!/usr/bin/env python3
"""torch_gpt2.py: the PyTorch anchor of Kiln's bench_gpt2 (BENCHMARKS.md "gpt2_124m", on a GPU).

GPT-2 124M: L 12 layers, H 12 heads, C 768 channels, T 1024 context, V 50257 tokens padded to 50304;
x = wte[idx] + wpe[pos]; pre-LN blocks x += c_proj(attn(ln_1(x))), x += mlp.c_proj(gelu_tanh(c_fc(ln_2(x))));
attention through F.scaled_dot_product_attention(is_causal=True) (PyTorch picks its flash kernel);
ln_f; logits = x wte^T (tied). Init: Linear and embedding weights N(0, 0.02), the two c_proj weights
N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorms 1 and 0. Batch 16 of synthetic token ids drawn on the
host each step, forward and loss under torch.autocast("cuda", torch.bfloat16), mean cross-entropy,
zero_grad, backward, torch.optim.AdamW(lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1,
fused=True), loss.item(). ms_per_step is the median of the steps after --warmup. --compile wraps the
model in torch.compile (the "aiming at" figure of BENCHMARKS.md).

Prints one JSON line with bench_gpt2's keys and "impl": "pytorch" (or "pytorch-compile"). FLOPs per
token and MFU are counted as in bench_gpt2.cpp: 6 N (N without wpe) + 12 L T C, against 989.4 TFLOP/s.
--breakdown times the parts of one block instead, then the parts outside the blocks (embeddings, the
tied head, the loss, the fused AdamW step over a whole model's parameters), as bench_gpt2 --breakdown
does. --kernels prints one step's GPU time per kernel from torch.profiler, as bench_gpt2 --kernels
prints Kiln's.

    python3 benchmarks/anchors/torch_gpt2.py [--steps 30] [--warmup 5] [--batch 16] [--seq 1024]
        [--layers 12] [--autocast bf16|fp16|none] [--compile] [--breakdown] [--kernels]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16 = 989.4e12
VOCAB, PADDED_VOCAB, CONTEXT, CHANNELS, HEADS = 50257, 50304, 1024, 768, 12


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(CHANNELS, 3 * CHANNELS)
        self.c_proj = nn.Linear(CHANNELS, CHANNELS)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(CHANNELS)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(CHANNELS)
        self.c_fc = nn.Linear(CHANNELS, 4 * CHANNELS)
        self.mlp_proj = nn.Linear(4 * CHANNELS, CHANNELS)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, CHANNELS)
        self.wpe = nn.Embedding(CONTEXT, CHANNELS)
        self.h = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(CHANNELS)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(1.0)  # LayerNorm weights
                elif name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                    p.normal_(0.0, 0.02 / math.sqrt(2 * n_layer))
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, idx):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe.weight[:t]
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def breakdown(args, dev):
    """One JSON line per part of a block, then per part outside the blocks: the median ms of forward +
    backward under autocast (--autocast: bf16, fp16, or none for float32), as bench_gpt2 --breakdown."""
    b, t, c = args.batch, args.seq, CHANNELS
    low = torch.float16 if args.autocast == "fp16" else torch.bfloat16
    act = torch.float32 if args.autocast == "none" else low  # the activations autocast hands the parts
    torch.manual_seed(0)
    block = Block().to(dev)
    x = torch.randn(b, t, c, device=dev, requires_grad=True)
    q, k, v = (torch.randn(b, HEADS, t, c // HEADS, device=dev, dtype=act, requires_grad=True) for _ in range(3))
    h4 = torch.randn(b, t, 4 * c, device=dev, dtype=act, requires_grad=True)
    parts = [
        ("block", lambda: block(x)),
        ("ln_1", lambda: block.ln_1(x)),
        ("c_attn", lambda: block.attn.c_attn(x)),
        ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("attn", lambda: block.attn(x)),
        ("mlp", lambda: block.mlp_proj(F.gelu(block.c_fc(x), approximate="tanh"))),
        ("c_fc", lambda: block.c_fc(x)),
        ("gelu", lambda: F.gelu(h4, approximate="tanh")),
        ("mlp.c_proj", lambda: block.mlp_proj(h4)),
        ("residual_add", lambda: x + x),
    ]
    def timed(fn):
        ms = []
        for i in range(23):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if i >= 3:
                ms.append((time.perf_counter() - start) * 1e3)
        return round(statistics.median(ms), 3)

    def fwd_bwd(f):
        def run():
            with torch.autocast("cuda", low, enabled=args.autocast != "none"):
                y = f()
            y.backward(torch.ones_like(y))
        return run

    def report(name, key, ms):
        print(json.dumps({"bench": "gpt2_124m_breakdown", "impl": "pytorch", "part": name, "batch": b,
                          "seq": t, key: ms}), flush=True)

    for name, f in parts:
        report(name, "ms_fwd_bwd", timed(fwd_bwd(f)))
    # Outside the blocks, with a whole model's parameters (GPT-2 124M's at --layers 12).
    model = GPT(args.layers).to(dev)
    ids = torch.randint(0, VOCAB, (b, t), device=dev)
    targets = torch.randint(0, VOCAB, (b, t), device=dev)
    logits = torch.randn(b, t, PADDED_VOCAB, device=dev).to(act).requires_grad_()
    outside = [
        ("embedding", lambda: model.wte(ids) + model.wpe.weight[:t]),
        ("head", lambda: x @ model.wte.weight.t()),
        ("loss", lambda: F.cross_entropy(logits.view(-1, PADDED_VOCAB), targets.view(-1))),
    ]
    for name, f in outside:
        report(name, "ms_fwd_bwd", timed(fwd_bwd(f)))
    with torch.no_grad():
        for p in model.parameters():
            p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    report("adamw", "ms_step", timed(opt.step))


def kernel_profile(args, train_step):
    """--kernels: after --warmup steps, one step under torch.profiler (CUPTI, as Kiln's
    cuda::KernelProfiler), one JSON line per kernel (the 40 with the most GPU time) and an "(all)" line
    with the step's total GPU time and wall time."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(args.warmup):
        train_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        train_step()  # ends in loss.item(): the GPU's work is done
        step_ms = (time.perf_counter() - start) * 1e3
        torch.cuda.synchronize()
    kernels = []
    for evt in prof.key_averages():
        total_us = getattr(evt, "device_time_total", None)
        if total_us is None:
            total_us = getattr(evt, "cuda_time_total", 0)
        if total_us > 0 and getattr(evt, "device_type", None) == torch.autograd.DeviceType.CUDA:
            kernels.append((evt.key, evt.count, total_us / 1e3))
    kernels.sort(key=lambda k: -k[2])
    for name, calls, ms in kernels[:40]:
        print(json.dumps({"bench": "gpt2_124m_kernels", "impl": "pytorch", "autocast": args.autocast,
                          "kernel": name, "calls": calls, "ms": round(ms, 4)}))
    print(json.dumps({"bench": "gpt2_124m_kernels", "impl": "pytorch", "autocast": args.autocast, "kernel": "(all)",
                      "kernels": len(kernels), "calls": sum(k[1] for k in kernels),
                      "ms": round(sum(k[2] for k in kernels), 4), "step_ms": round(step_ms, 3)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--autocast", choices=["bf16", "fp16", "none"], default="bf16",
                    help="fp16 with torch.amp.GradScaler; none: float32")
    ap.add_argument("--breakdown", action="store_true", help="time the parts of one block instead")
    ap.add_argument("--kernels", action="store_true", help="one step's GPU time per kernel (torch.profiler)")
    args = ap.parse_args()
    if args.steps <= args.warmup or not 1 <= args.seq <= CONTEXT:
        ap.error("need --steps > --warmup and 1 <= --seq <= 1024")
    dev = torch.device("cuda")
    if args.breakdown:
        breakdown(args, dev)
        return
    torch.manual_seed(0)
    model = GPT(args.layers).to(dev)
    params = sum(p.numel() for p in model.parameters())
    n = params - CONTEXT * CHANNELS
    flops_per_token = 6.0 * n + 12.0 * args.layers * args.seq * CHANNELS
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)
    step_model = torch.compile(model) if args.compile else model
    low = torch.float16 if args.autocast == "fp16" else torch.bfloat16
    # torch.amp.GradScaler("cuda") since PyTorch 2.3; torch.cuda.amp's spelling warns there.
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda", enabled=args.autocast == "fp16")
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=args.autocast == "fp16")
    gen = torch.Generator().manual_seed(0)
    torch.cuda.reset_peak_memory_stats()

    def train_step():
        ids = torch.randint(0, VOCAB, (args.batch, args.seq + 1), generator=gen).to(dev)
        x, y = ids[:, :-1], ids[:, 1:]
        with torch.autocast("cuda", low, enabled=args.autocast != "none"):
            logits = step_model(x)
            loss = F.cross_entropy(logits.float().view(-1, PADDED_VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)  # opt.step() when the scaler is off
        scaler.update()
        return loss.item()

    if args.kernels:
        kernel_profile(args, train_step)
        return
    ms, losses = [], []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        losses.append(train_step())
        if step > args.warmup:
            ms.append((time.perf_counter() - start) * 1e3)
    step_ms = statistics.median(ms)
    tokens_per_s = args.batch * args.seq / (step_ms / 1e3)
    print(json.dumps({
        "bench": "gpt2_124m", "impl": "pytorch-compile" if args.compile else "pytorch",
        "torch": torch.__version__, "device": torch.cuda.get_device_name(), "n_layer": args.layers,
        "batch": args.batch, "seq": args.seq, "params": params, "autocast": args.autocast, "steps": args.steps,
        "ms_per_step": round(step_ms, 2), "tokens_per_s": round(tokens_per_s),
        "flops_per_token": flops_per_token, "mfu": round(flops_per_token * tokens_per_s / PEAK_BF16, 4),
        "loss_first": round(losses[0], 4), "loss_final": round(losses[-1], 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)


if __name__ == "__main__":
    main()

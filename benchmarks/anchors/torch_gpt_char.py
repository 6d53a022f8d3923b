#!/usr/bin/python3
"""torch_gpt_char.py: the PyTorch (Python) anchor of Kiln's "e. gpt_char" benchmark, and the anchor
of "f. checkpointing_mem" with and without activation checkpointing (LibTorch 1.13 has no C++
checkpointing, so this is that benchmark's only anchor). Siblings: anchor_gpt_char.cpp is the same
program in LibTorch C++ (its header states the workload in full); scripts/make_fortunes_corpus.sh
documents the corpus rule; scripts/bench_compare.py runs this script against bench_gpt_char and
bench_checkpointing_mem.

Run it with Debian's Python and python3-torch 1.13 (/usr/bin/python3), not another python3 on PATH:
    /usr/bin/python3 benchmarks/anchors/torch_gpt_char.py [--bench gpt_char|checkpointing_mem]
        [--checkpoint] [--layers N] [--steps N] [--corpus PATH] [--device cpu|cuda]
        [--autocast none|bf16]

Dimensions: B batch (16), T time (128), C channels (128), H heads (4), D = C / H (32), V vocabulary
(256), L layers (4; 8 for checkpointing_mem). x = wte[idx] + wpe[pos]; pre-LN blocks
x += proj(attn(ln1(x))), x += fc2(gelu(fc(ln2(x)))) with causal attention written out; final
LayerNorm; logits = x wte^T. Init: every >= 2-D parameter N(0, 0.02), LayerNorm weight 1, biases 0.
Mean cross-entropy; AdamW lr 3e-4, (0.9, 0.999), eps 1e-8, weight decay 0.1 on all parameters. Each
step draws B offsets uniform in [0, N-T-1) with a generator seeded with 0. A timed step is batch
drawing, forward, backward, optimizer step and loss.item(); ms_per_step is the median of steps
11..steps. The modules are built, initialised and the batches drawn in the same order as in
anchor_gpt_char.cpp, so the two draw the same random numbers.

--checkpoint wraps every block in torch.utils.checkpoint.checkpoint (use_reentrant left at 1.13's
default, True). --autocast bf16 runs forward and loss under torch.autocast(device, torch.bfloat16),
as bench_gpt_char --autocast bf16 does, the line then carrying "autocast": "bf16". Prints one JSON line with the keys of anchor_gpt_char and "impl":"pytorch";
checkpointing_mem lines carry "ckpt": false or true.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

THREADS = 2
VOCAB = 256        # V
CHANNELS = 128     # C
HEADS = 4          # H
CONTEXT = 128      # T
BATCH = 16         # B
WARMUP_STEPS = 10  # steps 1..10 are not in the median

CORPUS_SIZE = 2813994
FORTUNES = "/usr/share/games/fortunes"
LICENSES = "/usr/share/common-licenses"
CORPUS_HINT = ("install Debian's fortunes 1:1.99.1-7.3 (apt-get install fortunes), or pass "
               "--corpus PATH (scripts/make_fortunes_corpus.sh writes it)")


def sorted_regular_files(folder, skip_suffix):
    """The regular files directly in folder (not symbolic links), minus names ending in skip_suffix,
    sorted by path bytewise (the C locale)."""
    with os.scandir(folder) as entries:
        paths = [e.path for e in entries if e.is_file(follow_symlinks=False)
                 and not (skip_suffix and e.name.endswith(skip_suffix))]
    return sorted(paths, key=os.fsencode)


def load_corpus(path):
    """The corpus bytes from path, or built from the installed packages (the rule of
    scripts/make_fortunes_corpus.sh) when path is None; exits naming the fix if the size is
    wrong."""
    try:
        if path:
            with open(path, "rb") as f:
                data = f.read()
            source = path
        else:
            files = sorted_regular_files(FORTUNES, ".dat") + sorted_regular_files(LICENSES, "")
            parts = []
            for name in files:
                with open(name, "rb") as f:
                    parts.append(f.read())
            data = b"".join(parts)
            source = "%s and %s" % (FORTUNES, LICENSES)
    except OSError as err:
        sys.exit("torch_gpt_char.py: %s; %s" % (err, CORPUS_HINT))
    if len(data) != CORPUS_SIZE:
        sys.exit("torch_gpt_char.py: the corpus from %s is %d bytes, not %d; %s"
                 % (source, len(data), CORPUS_SIZE, CORPUS_HINT))
    return data


class Block(nn.Module):
    """One pre-LN transformer block."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(CHANNELS)                 # weight, bias (C)
        self.qkv = nn.Linear(CHANNELS, 3 * CHANNELS)      # weight (3C, C), bias (3C)
        self.proj = nn.Linear(CHANNELS, CHANNELS)         # weight (C, C), bias (C)
        self.ln2 = nn.LayerNorm(CHANNELS)                 # weight, bias (C)
        self.fc = nn.Linear(CHANNELS, 4 * CHANNELS)       # weight (4C, C), bias (4C)
        self.fc2 = nn.Linear(4 * CHANNELS, CHANNELS)      # weight (C, 4C), bias (C)

    def attention(self, x):
        """Causal multi-head self-attention: (B, T, C) -> (B, T, C)."""
        b, t, _ = x.shape
        d = CHANNELS // HEADS
        q, k, v = self.qkv(x).split(CHANNELS, dim=2)
        q = q.view(b, t, HEADS, d).transpose(1, 2)  # (B, H, T, D)
        k = k.view(b, t, HEADS, d).transpose(1, 2)
        v = v.view(b, t, HEADS, d).transpose(1, 2)
        att = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d))                    # (B, H, T, T)
        above = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)  # (T, T), True above the diagonal
        att = att.masked_fill(above, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, CHANNELS)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))  # exact (erf) GELU


class Gpt(nn.Module):
    def __init__(self, n_layer, checkpoint):
        super().__init__()
        self.checkpoint = checkpoint
        self.wte = nn.Parameter(torch.empty(VOCAB, CHANNELS))    # (V, C), also the output head
        self.wpe = nn.Parameter(torch.empty(CONTEXT, CHANNELS))  # (T, C)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(CHANNELS)                       # weight, bias (C)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                elif name.endswith("weight"):
                    p.fill_(1.0)  # a LayerNorm weight: the only 1-D weights
                else:
                    p.zero_()

    def forward(self, idx):
        """idx (B, T) int64 -> logits (B, T, V)."""
        t = idx.size(1)
        x = self.wte[idx] + self.wpe[:t]
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x) if self.checkpoint else block(x)
        return self.ln_f(x) @ self.wte.t()


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="gpt_char", choices=["gpt_char", "checkpointing_mem"])
    ap.add_argument("--layers", type=int, help="layers (default 4; 8 for checkpointing_mem)")
    ap.add_argument("--steps", type=int, help="steps (default 200; 30 for checkpointing_mem)")
    ap.add_argument("--corpus", help="the corpus file (default: built from the packages)")
    ap.add_argument("--checkpoint", action="store_true", help="checkpoint every block")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the model and batches live (cuda: the GPU figure of BENCHMARKS.md)")
    ap.add_argument("--autocast", default="none", choices=["none", "bf16"],
                    help="forward and loss under bfloat16 autocast")
    args = ap.parse_args()
    ckpt_bench = args.bench == "checkpointing_mem"
    args.layers = args.layers or (8 if ckpt_bench else 4)
    args.steps = args.steps or (30 if ckpt_bench else 200)
    if args.layers < 1 or args.steps < 1:
        ap.error("--layers and --steps must be positive")
    return args


def main():
    args = parse_args()
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    data = load_corpus(args.corpus)
    n = len(data)
    corpus = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # (N)
    del data

    model = Gpt(args.layers, args.checkpoint).to(args.device)
    params = sum(p.numel() for p in model.parameters())
    c = CHANNELS
    per_block = 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (
        4 * c * c + c)
    expected = VOCAB * c + CONTEXT * c + 2 * c + args.layers * per_block  # 842,496 for L = 4
    if params != expected:
        sys.exit("torch_gpt_char.py: %d parameters, expected %d" % (params, expected))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.1)

    generator = torch.Generator().manual_seed(0)
    positions = torch.arange(CONTEXT + 1)  # (T+1)
    ms = []
    loss_first = loss_final = None
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        offsets = torch.randint(0, n - CONTEXT - 1, (BATCH,), generator=generator)  # (B)
        window = corpus[offsets.unsqueeze(1) + positions].long()                    # (B, T+1)
        window = window.to(args.device)
        x, y = window[:, :CONTEXT], window[:, 1:]                                    # (B, T)
        optimizer.zero_grad()
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            logits = model(x)  # (B, T, V)
            loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
        loss.backward()
        optimizer.step()
        value = loss.item()
        ms.append((time.perf_counter() - start) * 1e3)
        if step == 1:
            loss_first = value
        loss_final = value
    timed = ms[min(WARMUP_STEPS, len(ms) - 1):]

    result = {"bench": args.bench, "impl": "pytorch", "device": args.device,
              "threads": torch.get_num_threads(), "n_layer": args.layers, "steps": args.steps}
    if args.bench == "checkpointing_mem":
        result["ckpt"] = args.checkpoint
    if args.autocast != "none":
        result["autocast"] = args.autocast
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    result.update({"ms_per_step": round(statistics.median(timed), 3),
                   "loss_final": round(loss_final, 4), "loss_first": round(loss_first, 4),
                   "peak_rss_mib": round(peak_rss_mib, 1), "params": params})
    print(json.dumps(result, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""torch_cnn_fmnist.py: the PyTorch eager anchor of bench_cnn_fmnist on a GPU (or the CPU): the same
network (Conv(1->32, 3x3, pad 1)-ReLU-MaxPool2 - Conv(32->64)-ReLU-MaxPool2 - Linear(3136,128)-ReLU-
Linear(128,10)), PyTorch's default init, Adam lr 1e-3, batches of 128 of a fresh seeded shuffle each
epoch, the last partial batch kept, pixels / 255; each batch is cut on the CPU and copied to the device
as Kiln's DataLoader does. Reads the IDX files itself (gzip + numpy). Prints the same JSON keys.
    python3 torch_cnn_fmnist.py [--epochs 1] [--data DIR] [--device cuda]
"""
import argparse
import gzip
import json
import os
import resource
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root, split):
    images = read_idx(os.path.join(root, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(root, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.f1 = nn.Linear(64 * 7 * 7, 128)
        self.f2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.c1(x)), 2)
        h = F.max_pool2d(F.relu(self.c2(h)), 2)
        return self.f2(F.relu(self.f1(h.flatten(1))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False  # strict float32, as Kiln
    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "t10k")
    net = Cnn().to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    seconds, loss, steps = [], None, 0
    for _ in range(args.epochs):
        net.train()
        steps = 0
        start = time.perf_counter()
        for idx in torch.randperm(len(x_train), generator=gen).split(128):
            x, y = x_train[idx].to(dev), y_train[idx].to(dev)
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            steps += 1
        loss_final = loss.item()
        seconds.append(time.perf_counter() - start)
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x_test), 1000):
            correct += (net(x_test[i:i + 1000].to(dev)).argmax(1) == y_test[i:i + 1000].to(dev)).sum().item()
    print(json.dumps({"bench": "cnn_fmnist", "impl": "pytorch", "device": str(dev), "epochs": args.epochs,
                      "steps_per_epoch": steps, "s_per_epoch": [round(s, 4) for s in seconds],
                      "s_epoch_median": round(statistics.median(seconds), 4), "loss_final": round(loss_final, 4),
                      "test_acc": correct / len(x_test),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


if __name__ == "__main__":
    main()

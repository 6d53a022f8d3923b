#!/usr/bin/python3
"""PyTorch's figures for bench_collectives and bench_ddp, on the same machine (torch.distributed
with the gloo backend: Debian's python3-torch has no MPI backend, and the CPU has no NCCL).

    /usr/bin/python3 benchmarks/anchors/torch_distributed.py collectives [--ranks 2] [--max-bytes N]
    /usr/bin/python3 benchmarks/anchors/torch_distributed.py ddp [--ranks 2] [--steps 30]

collectives: all_reduce and all_gather (gloo has no reduce_scatter, and all_gather only as a list), float32, 1 KiB to
256 MiB, timed as bench_collectives times them (2 warm-ups, then about 0.3 s of back-to-back calls,
at least 3; the slowest rank's mean). ddp: the MLP 784-1024-1024-1024-10 of bench_ddp, micro-batch
64 per rank, SGD momentum 0.9, DistributedDataParallel with 2 MB buckets, one thread per rank; ms
per step = the median over the steps after 3 warm-ups, the slowest rank's. One JSON line per
result, with "impl": "pytorch".
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def slowest(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_op(fn):
    for _ in range(2):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    once = slowest(time.perf_counter() - t0)
    reps = min(2000, max(3, int(0.3 / max(once, 1e-7))))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return slowest((time.perf_counter() - t0) / reps)


def collectives(rank, p, args):
    bytes_ = 1024
    while bytes_ <= args.max_bytes:
        n = bytes_ // 4 // p * p
        full = torch.full((n,), 1.0 + rank)
        part = torch.full((n // p,), 1.0 + rank)
        for op in ("all_reduce", "all_gather"):
            if op == "all_reduce":
                secs = time_op(lambda: dist.all_reduce(full))
                factor = 2.0 * (p - 1) / p
            else:
                outs = list(full.chunk(p))  # gloo has only the list form: views of one buffer
                secs = time_op(lambda: dist.all_gather(outs, part))
                factor = (p - 1) / p
            algbw = n * 4 / secs / 1e9
            if rank == 0:
                print(json.dumps({"bench": "collectives", "impl": "pytorch", "device": "cpu", "backend": "gloo",
                                  "ranks": p, "op": op, "algo": "native", "bytes": n * 4,
                                  "us": round(secs * 1e6, 2), "algbw_gbps": round(algbw, 4),
                                  "busbw_gbps": round(algbw * factor, 4)}), flush=True)
        bytes_ *= 4


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.f1, self.f2 = torch.nn.Linear(784, 1024), torch.nn.Linear(1024, 1024)
        self.f3, self.f4 = torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 10)

    def forward(self, x):
        r = torch.relu
        return self.f4(r(self.f3(r(self.f2(r(self.f1(x)))))))


def ddp(rank, p, args):
    torch.manual_seed(1)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    net = Mlp()
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=2)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    ms = []
    for s in range(args.steps + 3):
        dist.barrier()
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if s >= 3:
            ms.append((time.perf_counter() - t0) * 1e3)
    step = slowest(statistics.median(ms))
    if rank == 0:
        print(json.dumps({"bench": "ddp", "impl": "pytorch", "device": "cpu", "backend": "gloo", "ranks": p,
                          "model": "mlp 784-1024x3-10", "micro_batch": 64, "overlap": True,
                          "ms_per_step": round(step, 3)}), flush=True)


def worker(rank, p, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=p)
    (collectives if args.what == "collectives" else ddp)(rank, p, args)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["collectives", "ddp"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.ranks, a), nprocs=a.ranks, join=True)

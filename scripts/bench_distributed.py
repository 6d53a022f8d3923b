#!/usr/bin/python3
"""Runs Kiln's distributed benchmarks and PyTorch's (gloo) side by side, alternating, and prints
a summary with the ratios. Every JSON line goes to --out as well.

    /usr/bin/python3 scripts/bench_distributed.py --build build/release --ranks 2 --rounds 3 \\
        --out benchmarks/results/cpu-DATE-distributed.jsonl

Per round: bench_collectives (Kiln, under kiln-run), torch_distributed.py collectives, bench_ddp
and torch_distributed.py ddp. The summary takes, per (op, size) and per DDP mode, the median over
the rounds.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    bin_ = os.path.join(a.build, "bin")
    launch = [os.path.join(bin_, "kiln-run"), "-n", str(a.ranks)]
    anchor = ["/usr/bin/python3", os.path.join(ROOT, "benchmarks/anchors/torch_distributed.py")]
    rows = []
    for r in range(a.rounds):
        for cmd in (launch + [os.path.join(bin_, "bench_collectives"), str(a.max_bytes)],
                    anchor + ["collectives", "--ranks", str(a.ranks), "--max-bytes", str(a.max_bytes)],
                    launch + [os.path.join(bin_, "bench_ddp"), "30"],
                    anchor + ["ddp", "--ranks", str(a.ranks), "--steps", "30"]):
            for row in run(cmd, env):
                row["round"] = r + 1
                rows.append(row)
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    meta = {"meta": True, "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit, "command": " ".join(sys.argv),
            "machine": f"{os.cpu_count()} cpus, {platform.processor() or platform.machine()}"}
    with open(a.out, "w") as f:
        f.write(json.dumps(meta) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")

    # Collectives: median busbw per (op, bytes, impl/algo).
    bw = {}
    for row in rows:
        if row["bench"] == "collectives" and "summary" not in row:
            bw.setdefault((row["op"], row["bytes"], row["impl"] + "/" + row["algo"]), []).append(row["busbw_gbps"])
    print("op              bytes      kiln native  kiln ring  pytorch gloo   ring/native  kiln/pytorch  (busbw GB/s, medians)")
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for b in sorted({k[1] for k in bw if k[0] == op}):
            med = {impl: statistics.median(v) for (o, bb, impl), v in bw.items() if o == op and bb == b}
            n, g, t = med.get("kiln/native"), med.get("kiln/ring"), med.get("pytorch/native")
            print(f"{op:15s} {b:>10d} {n:11.3f} {g:10.3f} {t if t else float('nan'):12.3f}   {g / n:11.2f}"
                  f"  {(n / t) if t else float('nan'):12.2f}")
    ddp = {}
    for row in rows:
        if row["bench"] == "ddp" and "ms_per_step" in row:
            ddp.setdefault((row["impl"], row["overlap"]), []).append(row["ms_per_step"])
        if row["bench"] == "ddp" and row.get("summary") == "overlap":
            ddp.setdefault(("hidden", None), []).append(row["hidden_share"])
            ddp.setdefault(("allreduce_only", None), []).append(row["allreduce_only_ms"])
    for k, v in sorted(ddp.items(), key=str):
        print(f"ddp {k}: median {statistics.median(v):.3f} over {v}")
    on, off = statistics.median(ddp[("kiln", True)]), statistics.median(ddp[("kiln", False)])
    torch_ms = statistics.median(ddp[("pytorch", True)])
    print(f"ddp: kiln overlap {on:.2f} ms, no overlap {off:.2f} ms (x{off / on:.3f}); pytorch {torch_ms:.2f} ms; "
          f"kiln/pytorch {on / torch_ms:.3f}")


if __name__ == "__main__":
    main()

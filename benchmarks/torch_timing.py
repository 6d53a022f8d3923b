# benchmarks/torch_timing.py: the timing rule of the torch_*.py scripts, as kiln_bench::median_ms in
# bench_util.h is the C++ benchmarks': the median of `runs` calls of fn after `warmup` calls, in ms.
import statistics
import time


def median_ms(fn, warmup, runs):
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)

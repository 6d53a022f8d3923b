// bench_op_overhead: BENCHMARKS.md workload "b. op_overhead" for Kiln: c = a + b, 100,000 times, on
// float32 tensors of shape [1] and [64], with and without requires_grad (c is overwritten each time,
// so each result and its graph are freed); us per op = median of 3 loops / 1e5.
// One JSON line per case. Anchor: benchmarks/anchors/anchor_op_overhead.cpp.
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

using namespace kiln;

int main() {
  const int64_t iters = 100000;
  using Clock = std::chrono::steady_clock;
  for (int64_t numel : {1, 64}) {
    for (bool grad : {false, true}) {
      Tensor a = rand({numel}).requires_grad_(grad), b = rand({numel}).requires_grad_(grad);
      Tensor c;
      for (int i = 0; i < 1000; ++i) c = a + b;  // warm-up
      std::vector<double> us;
      for (int loop = 0; loop < 3; ++loop) {
        auto t0 = Clock::now();
        for (int64_t i = 0; i < iters; ++i) c = a + b;
        us.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters * 1e6);
      }
      std::sort(us.begin(), us.end());
      std::printf("{\"bench\":\"op_overhead\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,"
                  "\"numel\":%lld,\"requires_grad\":%s,\"us_n%lld_%s\":%.4f,\"iters\":%lld}\n",
                  get_num_threads(), static_cast<long long>(numel), grad ? "true" : "false",
                  static_cast<long long>(numel), grad ? "grad" : "nograd", us[1],
                  static_cast<long long>(iters));
    }
  }
  return 0;
}

// bench_op_overhead: BENCHMARKS.md workload "b. op_overhead" for Kiln: c = a + b, 100,000 times, on
// float32 tensors of shape [1] and [64], with and without requires_grad (c is overwritten each time,
// so each result and its graph are freed); us per op = median of 3 loops / 1e5.
// Besides the workload, a view op, c = a.narrow(0, 1, 32) on a [64] tensor, under no_grad and in
// inference mode on a tensor made there (keys us_narrow_nograd, us_narrow_inference): what
// InferenceMode saves (Note [inference mode] in core/grad_mode.h).
// One JSON line per case. Anchor: benchmarks/anchors/anchor_op_overhead.cpp.
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

using namespace kiln;

namespace {

using Clock = std::chrono::steady_clock;

// The median over 3 loops of `iters` calls of f, in microseconds per call, after 1000 warm-up calls.
template <typename F>
double median_us(int64_t iters, F&& f) {
  for (int i = 0; i < 1000; ++i) f();
  std::vector<double> us;
  for (int loop = 0; loop < 3; ++loop) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) f();
    us.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(iters) * 1e6);
  }
  std::sort(us.begin(), us.end());
  return us[1];
}

}  // namespace

int main() {
  const int64_t iters = 100000;
  for (int64_t numel : {1, 64}) {
    for (bool grad : {false, true}) {
      Tensor a = rand({numel}).requires_grad_(grad), b = rand({numel}).requires_grad_(grad);
      Tensor c;
      const double us = median_us(iters, [&] { c = a + b; });
      std::printf("{\"bench\":\"op_overhead\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,"
                  "\"numel\":%lld,\"requires_grad\":%s,\"us_n%lld_%s\":%.4f,\"iters\":%lld}\n",
                  get_num_threads(), static_cast<long long>(numel), grad ? "true" : "false",
                  static_cast<long long>(numel), grad ? "grad" : "nograd", us,
                  static_cast<long long>(iters));
    }
  }
  for (bool inference : {false, true}) {
    std::optional<NoGradGuard> no_grad;
    std::optional<InferenceMode> inference_mode;
    if (inference) inference_mode.emplace();
    else no_grad.emplace();
    Tensor a = rand({64});
    Tensor c;
    const double us = median_us(iters, [&] { c = a.narrow(0, 1, 32); });
    std::printf("{\"bench\":\"op_overhead\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,"
                "\"us_narrow_%s\":%.4f,\"iters\":%lld}\n",
                get_num_threads(), inference ? "inference" : "nograd", us, static_cast<long long>(iters));
  }
  return 0;
}

// bench_layer_norm: layer_norm on the CPU at the widths of BENCHMARKS.md's GPTs, 2,048 rows of 128
// (gpt_char: tokens x d_model) and 512 rows of 768 (GPT-2 124M's d_model), float32 and float64, with
// weight and bias: the forward alone, and forward + backward (the gradients of input, weight and bias
// for a fixed random cotangent). ms_median: the median of 101 runs after 10 warm-up runs. One JSON
// line per result. Its PyTorch counterpart: benchmarks/torch_layer_norm.py (same shapes, parts and
// timing rule).
// Usage: bench_layer_norm [threads] (default 2).
#include <kiln/kiln.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"

using namespace kiln;

static double median_ms(const std::function<void()>& fn) { return kiln_bench::median_ms(fn, 10, 101); }

int main(int argc, char** argv) {
  const int threads = kiln_bench::threads_arg(argc, argv);
  if (threads == 0) return 2;
  set_num_threads(threads);
  for (DType dt : {kFloat32, kFloat64}) {
    for (auto [rows, width] : std::vector<std::pair<int64_t, int64_t>>{{2048, 128}, {512, 768}}) {
      Generator gen(0);
      const Tensor x = randn({rows, width}, dt, &gen), cot = randn({rows, width}, dt, &gen);
      Tensor w = randn({width}, dt, &gen).requires_grad_(), b = randn({width}, dt, &gen).requires_grad_();
      Tensor xg = x.clone().requires_grad_();
      auto report = [&](const char* part, double ms) {
        std::printf("{\"bench\":\"layer_norm\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,\"dtype\":\"%s\","
                    "\"rows\":%lld,\"width\":%lld,\"part\":\"%s\",\"ms_median\":%.4f}\n",
                    get_num_threads(), std::string(dtype_name(dt)).c_str(), static_cast<long long>(rows), static_cast<long long>(width),
                    part, ms);
      };
      report("forward", median_ms([&] {
               NoGradGuard no_grad;
               layer_norm(x, {width}, w, b);
             }));
      report("forward_backward", median_ms([&] {
               for (Tensor* p : {&xg, &w, &b}) p->set_grad(Tensor());
               layer_norm(xg, {width}, w, b).backward(cot);
             }));
    }
  }
}

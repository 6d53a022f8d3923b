// bench_sort_scan: the ops of ops/sort.cpp and ops/einsum.cpp on the CPU: sort along the last dim and
// along dim 0 (strided lines) of a (1024, 1024) float32 tensor and of one line of 2^20, topk of 50 and
// of 1000 over (64, 50257) (sampling from GPT-2's vocabulary), the median of each row, cumsum forward
// and forward + backward along either dim, cumprod forward + backward, cummax and logcumsumexp, and
// einsum for attention scores and a bilinear form. ms: the median of 7 runs after 2 warm-up runs. One
// JSON line per result. Its PyTorch counterpart: benchmarks/torch_sort_scan.py (same shapes, parts and
// timing rule; PyTorch's sort with stable=True, as Kiln's sort is stable).
// Usage: bench_sort_scan [threads] (default 2).
#include <kiln/kiln.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"

using namespace kiln;

int main(int argc, char** argv) {
  const int threads = kiln_bench::threads_arg(argc, argv);
  if (threads == 0) return 2;
  set_num_threads(threads);
  auto report = [&](const std::string& part, const std::function<void()>& fn) {
    kiln_bench::report_cpu_part("sort_scan", threads, part, fn);
  };
  Generator gen(0);
  const Tensor square = randn({1024, 1024}, {}, &gen), line = randn({1 << 20}, {}, &gen);
  const Tensor logits = randn({64, 50257}, {}, &gen);
  auto no_grad = std::make_unique<NoGradGuard>();
  report("sort_1024x1024_last", [&] { (void)sort(square, -1); });
  report("sort_1024x1024_dim0", [&] { (void)sort(square, 0); });
  report("sort_2^20", [&] { (void)sort(line, 0); });
  report("topk_50_of_64x50257", [&] { (void)topk(logits, 50); });
  report("topk_1000_of_64x50257", [&] { (void)topk(logits, 1000); });
  report("median_1024x1024_rows", [&] { (void)median(square, 1); });
  report("cumsum_1024x1024_last", [&] { (void)cumsum(square, -1); });
  report("cumsum_1024x1024_dim0", [&] { (void)cumsum(square, 0); });
  report("cummax_1024x1024_last", [&] { (void)cummax(square, -1); });
  report("logcumsumexp_1024x1024_last", [&] { (void)logcumsumexp(square, -1); });
  const Tensor q = randn({8, 12, 256, 64}, {}, &gen), k = randn({8, 12, 256, 64}, {}, &gen);
  report("einsum_bhqd_bhkd", [&] { (void)einsum("bhqd,bhkd->bhqk", {q, k}); });
  const Tensor x1 = randn({256, 64}, {}, &gen), w = randn({32, 64, 48}, {}, &gen), x2 = randn({256, 48}, {}, &gen);
  report("einsum_bilinear", [&] { (void)einsum("bi,kij,bj->bk", {x1, w, x2}); });
  no_grad.reset();
  {
    Tensor x = square.detach().requires_grad_(), near_one = (square * 0.01 + 1).detach().requires_grad_();
    report("cumsum_1024x1024_last_forward_backward", [&] {
      x.set_grad(Tensor());
      cumsum(x, -1).sum().backward();
    });
    report("cumprod_1024x1024_last_forward_backward", [&] {
      near_one.set_grad(Tensor());
      cumprod(near_one, -1).sum().backward();
    });
  }
  return 0;
}

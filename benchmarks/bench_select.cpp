// bench_select: the ops of ops/select.cpp and the searches and quantiles of ops/sort.cpp on the CPU:
// nonzero of a 2^24 mask about half true, masked_select of a (4096, 4096) float32 tensor by such a
// mask and its forward + backward over (1024, 1024), unique of 2^20 int64 values in [0, 1000) with
// inverse and counts, unique rows of (65536, 4) int64 values in [0, 8), searchsorted of 2^20 float32
// values into 1000 sorted boundaries, quantile (3 q's) of each row of (1024, 1024), bincount of 2^20
// values into 1000 bins and histc of 2^20 values into 100 bins. ms: the median of 7 runs after 2
// warm-up runs. One JSON line per result. Its PyTorch counterpart: benchmarks/torch_select.py (same
// shapes, distributions, parts and timing rule; the data are each library's own random draws).
// Usage: bench_select [threads] (default 2).
#include <kiln/kiln.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "bench_util.h"

using namespace kiln;

int main(int argc, char** argv) {
  const int threads = kiln_bench::threads_arg(argc, argv);
  if (threads == 0) return 2;
  set_num_threads(threads);
  auto report = [&](const std::string& part, const std::function<void()>& fn) {
    kiln_bench::report_cpu_part("select", threads, part, fn);
  };
  Generator gen(0);
  const Tensor mask = rand({1 << 24}, {}, &gen).lt(0.5);
  const Tensor big = randn({4096, 4096}, {}, &gen), big_mask = rand({4096, 4096}, {}, &gen).lt(0.5);
  const Tensor ints = randint(0, 1000, {1 << 20}, kInt64, &gen), rows = randint(0, 8, {65536, 4}, kInt64, &gen);
  const Tensor boundaries = std::get<0>(sort(randn({1000}, {}, &gen))), probes = randn({1 << 20}, {}, &gen);
  const Tensor square = randn({1024, 1024}, {}, &gen), q = tensor({0.1, 0.5, 0.9});
  const Tensor values = randn({1 << 20}, {}, &gen);
  {
    NoGradGuard no_grad;
    report("nonzero_2^24", [&] { (void)nonzero(mask); });
    report("masked_select_4096x4096", [&] { (void)masked_select(big, big_mask); });
    report("unique_2^20_int64", [&] { (void)unique(ints); });
    report("unique_rows_65536x4", [&] { (void)unique(rows, 0); });
    report("searchsorted_2^20_into_1000", [&] { (void)searchsorted(boundaries, probes); });
    report("quantile_3q_1024x1024_rows", [&] { (void)quantile(square, q, 1); });
    report("bincount_2^20_into_1000", [&] { (void)bincount(ints); });
    report("histc_2^20_100_bins", [&] { (void)histc(values, 100, -3, 3); });
  }
  Tensor x = randn({1024, 1024}, {}, &gen).requires_grad_();
  const Tensor x_mask = rand({1024, 1024}, {}, &gen).lt(0.5);
  report("masked_select_1024x1024_forward_backward", [&] {
    x.set_grad(Tensor());
    masked_select(x, x_mask).sum().backward();
  });
  return 0;
}

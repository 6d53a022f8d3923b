// anchor_op_overhead: the LibTorch anchor for Kiln's "b. op_overhead" benchmark (BENCHMARKS.md).
// Siblings: anchor_gemm.cpp, CMakeLists.txt and README.md in benchmarks/anchors/; the Kiln
// counterpart is the bench_op_overhead program; scripts/bench_compare.py runs the two side by side.
//
// Times c = a + b, 100,000 times in a loop, on fp32 tensors of shape [1] and [64], with and
// without requires_grad. c is overwritten each time, so each call's result (and, with grad, its
// one-node graph) is freed by the next. µs per op = median of 3 loops / 100,000.
// Prints one JSON line per case:
//   {"bench":"op_overhead","impl":"libtorch","device":"cpu","threads":2,"numel":1,
//    "requires_grad":false,"us_n1_nograd":...,"iters":100000}
// (keys us_n1_nograd, us_n1_grad, us_n64_nograd, us_n64_grad).
// Then c = a.narrow(0, 1, 32) on a [64] tensor, under torch::NoGradGuard and under
// c10::InferenceMode on a tensor made there (keys us_narrow_nograd, us_narrow_inference).
//
// LibTorch at its best: 2 intra-op threads, as in anchor_gemm (an add this small never goes
// parallel, but the setting matches the other anchors), and the comparison script sets
// OMP_WAIT_POLICY=passive.

#include <c10/core/InferenceMode.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 2;
constexpr int kWarmupIters = 1000;
constexpr int kLoops = 3;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  if (values.size() % 2 == 1) return values[mid];
  return 0.5 * (values[mid - 1] + values[mid]);
}

// Runs c = a + b `iters` times and returns the seconds the loop took.
double TimeAddLoop(const torch::Tensor& a, const torch::Tensor& b, int64_t iters) {
  using Clock = std::chrono::steady_clock;
  torch::Tensor c;
  Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < iters; ++i) c = a + b;
  std::chrono::duration<double> elapsed = Clock::now() - start;
  return elapsed.count();
}

// c = a.narrow(0, 1, 32) under no_grad, or in inference mode on an inference tensor.
void BenchNarrow(bool inference, int64_t iters) {
  std::optional<torch::NoGradGuard> no_grad;
  std::optional<c10::InferenceMode> inference_mode;
  if (inference) inference_mode.emplace();
  else no_grad.emplace();
  torch::Tensor a = torch::rand({64});
  auto time_loop = [&](int64_t n) {
    using Clock = std::chrono::steady_clock;
    torch::Tensor c;
    Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < n; ++i) c = a.narrow(0, 1, 32);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  time_loop(kWarmupIters);
  std::vector<double> us_per_op;
  for (int loop = 0; loop < kLoops; ++loop) {
    us_per_op.push_back(time_loop(iters) / static_cast<double>(iters) * 1e6);
  }
  std::printf("{\"bench\":\"op_overhead\",\"impl\":\"libtorch\",\"device\":\"cpu\",\"threads\":%d,"
              "\"us_narrow_%s\":%.4f,\"iters\":%lld}\n",
              torch::get_num_threads(), inference ? "inference" : "nograd", Median(us_per_op),
              static_cast<long long>(iters));
  std::fflush(stdout);
}

void BenchOneCase(int64_t numel, bool requires_grad, int64_t iters) {
  torch::Tensor a = torch::rand({numel}, torch::requires_grad(requires_grad));
  torch::Tensor b = torch::rand({numel}, torch::requires_grad(requires_grad));

  TimeAddLoop(a, b, kWarmupIters);
  std::vector<double> us_per_op;
  for (int loop = 0; loop < kLoops; ++loop) {
    us_per_op.push_back(TimeAddLoop(a, b, iters) / static_cast<double>(iters) * 1e6);
  }

  std::printf(
      "{\"bench\":\"op_overhead\",\"impl\":\"libtorch\",\"device\":\"cpu\",\"threads\":%d,"
      "\"numel\":%lld,\"requires_grad\":%s,\"us_n%lld_%s\":%.4f,\"iters\":%lld}\n",
      torch::get_num_threads(), static_cast<long long>(numel), requires_grad ? "true" : "false",
      static_cast<long long>(numel), requires_grad ? "grad" : "nograd", Median(us_per_op),
      static_cast<long long>(iters));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t iters = 100000;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--iters" && i + 1 < argc) {
      char* end = nullptr;
      iters = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || iters <= 0) {
        std::fprintf(stderr, "%s: bad --iters value '%s'\n", argv[0], argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--iters 100000]\n", argv[0]);
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }

  torch::set_num_threads(kThreads);
  torch::manual_seed(0);
  for (int64_t numel : {1, 64}) {
    for (bool requires_grad : {false, true}) BenchOneCase(numel, requires_grad, iters);
  }
  for (bool inference : {false, true}) BenchNarrow(inference, iters);
  return 0;
}

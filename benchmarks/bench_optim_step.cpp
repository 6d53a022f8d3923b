// bench_optim_step: the time of one optimizer step on the parameter sets of BENCHMARKS.md's
// mlp_fmnist (SGD lr 0.05 momentum 0.9, 535,818 parameters) and cnn_fmnist (Adam lr 1e-3,
// 421,642 parameters), plus AdamW on the CNN set. Grads are fixed random tensors; ms per step =
// median of 5 loops of 100 steps after 20 warm-up steps. One JSON line per case.
// Usage: bench_optim_step [threads] (default: every core).
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

using namespace kiln;

namespace {

std::vector<Tensor> make_params(const std::vector<Shape>& shapes) {
  std::vector<Tensor> params;
  for (const Shape& s : shapes) {
    Tensor p = randn(s).mul_(0.05).requires_grad_();
    p.set_grad(randn(s).mul_(0.01));
    params.push_back(p);
  }
  return params;
}

int64_t count(const std::vector<Tensor>& params) {
  int64_t n = 0;
  for (const Tensor& p : params) n += p.numel();
  return n;
}

void bench(const char* name, const std::vector<Tensor>& params, optim::Optimizer& opt) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 20; ++i) opt.step();
  std::vector<double> ms;
  for (int loop = 0; loop < 5; ++loop) {
    auto t0 = Clock::now();
    for (int i = 0; i < 100; ++i) opt.step();
    ms.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 100 * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "{\"bench\":\"optim_step\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,"
      "\"case\":\"%s\",\"params\":%lld,\"tensors\":%zu,\"ms_per_step\":%.4f}\n",
      get_num_threads(), name, static_cast<long long>(count(params)), params.size(), ms[2]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) set_num_threads(std::max(1, std::atoi(argv[1])));
  const std::vector<Shape> mlp = {{512, 784}, {512}, {256, 512}, {256}, {10, 256}, {10}};
  const std::vector<Shape> cnn = {{32, 1, 3, 3}, {32},  {64, 32, 3, 3}, {64},
                                  {128, 3136},   {128}, {10, 128},      {10}};
  {
    auto params = make_params(mlp);
    optim::SGD opt(params, {.lr = 0.05, .momentum = 0.9});
    bench("mlp_sgd_momentum", params, opt);
  }
  {
    auto params = make_params(cnn);
    optim::Adam opt(params, {.lr = 1e-3});
    bench("cnn_adam", params, opt);
  }
  {
    auto params = make_params(cnn);
    optim::AdamW opt(params, {.lr = 1e-3});
    bench("cnn_adamw", params, opt);
  }
  return 0;
}

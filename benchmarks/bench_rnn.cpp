// bench_rnn: the recurrent layers on the CPU: LSTM and GRU of 2 layers, 256 inputs and 256 hidden
// features, over a (64, 32, 256) sequence (L, N, input), and an LSTM cell step on (32, 256); the
// forward alone (no grad) and forward + backward (the gradients of every parameter and the input for
// the sum of the output). ms: the median of 7 runs after 2 warm-up runs. One JSON line per result.
// Its PyTorch counterpart: benchmarks/torch_rnn.py (same shapes, parts and timing rule).
// Usage: bench_rnn [threads] (default 2).
#include <kiln/kiln.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "bench_util.h"

using namespace kiln;

static double median_ms(const std::function<void()>& fn) { return kiln_bench::median_ms(fn, 2, 7); }

int main(int argc, char** argv) {
  const int threads = kiln_bench::threads_arg(argc, argv);
  if (threads == 0) return 2;
  set_num_threads(threads);
  auto report = [&](const std::string& part, double ms) {
    std::printf("{\"bench\":\"rnn\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,\"part\":\"%s\",\"ms\":%.3f}\n",
                threads, part.c_str(), ms);
    std::fflush(stdout);
  };
  Generator gen(0);
  Tensor x = randn({64, 32, 256}, {}, &gen).requires_grad_();
  nn::LSTM lstm(256, 256, {.num_layers = 2});
  nn::GRU gru(256, 256, {.num_layers = 2});
  for (auto [name, layer] : {std::pair<const char*, nn::Module*>{"lstm", &lstm}, {"gru", &gru}}) {
    report(std::string(name) + "_forward", median_ms([&] {
             NoGradGuard no_grad;
             (*layer)(x);
           }));
    report(std::string(name) + "_forward_backward", median_ms([&] {
             layer->zero_grad();
             x.set_grad(Tensor());
             (*layer)(x).sum().backward();
           }));
  }
  nn::LSTMCell cell(256, 256);
  const Tensor step = randn({32, 256}, {}, &gen);
  report("lstm_cell_forward", median_ms([&] {
           NoGradGuard no_grad;
           cell(step);
         }));
  return 0;
}

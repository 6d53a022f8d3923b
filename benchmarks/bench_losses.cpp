// bench_losses: the losses of nn/loss.cpp on the CPU, forward + backward of the mean loss with respect
// to the input(s): CTC over (T, N, C) log-softmax outputs (T = 50 and 200; its fused kernels, and with
// fusion off its composition of ops), triplet margin, multi-margin, multi-label margin (one (N, C, C)
// tensor of hinges), cosine embedding, Gaussian NLL and cosine similarity. ms: the median of 7 runs
// after 2 warm-up runs. One JSON line per result. Its PyTorch counterpart: benchmarks/torch_losses.py
// (same shapes, parts and timing rule; no composed parts).
// Usage: bench_losses [threads] (default 2).
#include <kiln/kiln.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"

using namespace kiln;

static double median_ms(const std::function<void()>& fn) { return kiln_bench::median_ms(fn, 2, 7); }

// Labels 1 + (7 i) mod (classes - 1): no blank (0), with repeats.
static Tensor ctc_targets(int64_t samples, int64_t length, int64_t classes) {
  std::vector<int64_t> v(samples * length);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1 + (static_cast<int64_t>(i) * 7) % (classes - 1);
  return from_vector(v, {samples, length});
}

int main(int argc, char** argv) {
  const int threads = kiln_bench::threads_arg(argc, argv);
  if (threads == 0) return 2;
  set_num_threads(threads);
  auto report = [&](const std::string& part, double ms) {
    std::printf("{\"bench\":\"losses\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,\"part\":\"%s\",\"ms\":%.3f}\n",
                threads, part.c_str(), ms);
    std::fflush(stdout);
  };
  Generator gen(0);
  // Forward + backward of fn(inputs), the inputs' gradients reset each run.
  auto fwd_bwd = [&](const std::string& part, std::vector<Tensor> inputs,
                     const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
    for (Tensor& t : inputs) t.requires_grad_();
    report(part, median_ms([&] {
             for (Tensor& t : inputs) t.set_grad(Tensor());
             fn(inputs).backward();
           }));
  };
  for (auto [frames, samples, classes, length] : std::vector<std::array<int64_t, 4>>{{50, 16, 20, 10}, {200, 32, 30, 40}}) {
    const Tensor targets = ctc_targets(samples, length, classes);
    const Tensor in_len = full({samples}, frames, kInt64), tgt_len = full({samples}, length, kInt64);
    const Tensor logits = randn({frames, samples, classes}, {}, &gen);
    const auto ctc = [&](const std::vector<Tensor>& in) {
      return nn::ctc_loss(log_softmax(in[0], 2), targets, in_len, tgt_len);
    };
    fwd_bwd("ctc_T" + std::to_string(frames) + "_forward_backward", {logits}, ctc);
    set_fusion(false);  // the recursion composed from ops (Note [ctc as ops] in nn/loss.cpp)
    fwd_bwd("ctc_T" + std::to_string(frames) + "_composed_forward_backward", {logits}, ctc);
    set_fusion(true);
  }
  const Tensor signs = (randn({1024}, {}, &gen).gt(0).to(kFloat32) * 2 - 1);
  fwd_bwd("triplet_margin_forward_backward",
          {randn({1024, 128}, {}, &gen), randn({1024, 128}, {}, &gen), randn({1024, 128}, {}, &gen)},
          [](const std::vector<Tensor>& in) { return nn::triplet_margin_loss(in[0], in[1], in[2]); });
  const Tensor classes100 = randint(0, 100, {1024}, kInt64, &gen);
  fwd_bwd("multi_margin_forward_backward", {randn({1024, 100}, {}, &gen)},
          [&](const std::vector<Tensor>& in) { return nn::multi_margin_loss(in[0], classes100); });
  // Each row lists 8 classes, then -1.
  Tensor listed = randint(0, 64, {256, 64}, kInt64, &gen);
  listed.narrow(1, 8, 1).fill_(-1);
  fwd_bwd("multilabel_margin_forward_backward", {randn({256, 64}, {}, &gen)},
          [&](const std::vector<Tensor>& in) { return nn::multilabel_margin_loss(in[0], listed); });
  fwd_bwd("cosine_embedding_forward_backward", {randn({1024, 256}, {}, &gen), randn({1024, 256}, {}, &gen)},
          [&](const std::vector<Tensor>& in) { return nn::cosine_embedding_loss(in[0], in[1], signs); });
  fwd_bwd("gaussian_nll_forward_backward",
          {randn({1024, 256}, {}, &gen), randn({1024, 256}, {}, &gen), rand({1024, 256}, {}, &gen) + 0.1},
          [](const std::vector<Tensor>& in) { return nn::gaussian_nll_loss(in[0], in[1], in[2]); });
  fwd_bwd("cosine_similarity_forward_backward", {randn({1024, 256}, {}, &gen), randn({1024, 256}, {}, &gen)},
          [](const std::vector<Tensor>& in) { return nn::cosine_similarity(in[0], in[1]).mean(); });
  return 0;
}

// bench_fusion: each fused op of docs/fusion.md against its unfused composition (set_fusion), forward
// and backward, at the sizes of a GPT step: gpt_char's (2,048 tokens, d_model 128, MLP 512, vocab
// 256; causal attention over windows of 128 tokens in heads of 32, without dropout and with dropout
// 0.1; the softmax of its attention scores, rows of 128) by default, or --tokens/--dim/--vocab
// (attention takes whole windows and heads: tokens a multiple of 128 or below it, dim a multiple of
// 32 or below it). On CUDA, attention with dropout is composed both ways (the CUDA kernel takes no
// dropout). One JSON line per op and setting, with the median time of a forward + backward over
// --reps repetitions, and the ratio fused / unfused.
//
//   bench_fusion [--tokens 2048] [--dim 128] [--vocab 256] [--reps 200] [--threads N] [--device cpu|cuda]
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "bench_util.h"

using namespace kiln;

namespace {

// Median seconds of one forward + backward of `step` (which returns a scalar loss).
double time_step(const std::function<Tensor()>& step, int reps, Device device) {
  std::vector<double> times;
  for (int i = 0; i < reps + 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Tensor loss = step();
    loss.backward();
    if (device.is_cuda()) cuda::synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 5) times.push_back(s);  // the first five warm the allocator and caches
  }
  return kiln_bench::median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 2048, dim = 128, vocab = 256;
  int reps = 200;
  std::string device_name = "cpu";
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_fusion: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::stoll(next());
    else if (!std::strcmp(argv[i], "--dim")) dim = std::stoll(next());
    else if (!std::strcmp(argv[i], "--vocab")) vocab = std::stoll(next());
    else if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(next());
    else if (!std::strcmp(argv[i], "--device")) device_name = next();
    else if (!std::strcmp(argv[i], "--threads")) set_num_threads(std::stoi(next()));
    else {
      std::fprintf(stderr, "usage: %s [--tokens 2048] [--dim 128] [--vocab 256] [--reps 200] [--threads N] [--device cpu|cuda]\n",
                   argv[0]);
      return 2;
    }
  }
  const Device device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  Generator gen(1);
  auto param = [&](const Shape& s) { return randn(s, kFloat32, &gen).to(device).requires_grad_(); };
  Tensor x = param({tokens, dim}), r = param({tokens, dim}), w = param({dim}), b = param({dim});
  Tensor h = param({tokens, 4 * dim}), hb = param({4 * dim});
  Tensor logits = param({tokens, vocab});
  Tensor target = randint(0, vocab, {tokens}, kInt64, &gen).to(device);
  // Causal attention as gpt_char's blocks run it: windows of 128 tokens, heads of 32.
  const int64_t T = std::min<int64_t>(tokens, 128), heads = std::max<int64_t>(dim / 32, 1);
  if (tokens % T != 0 || dim % heads != 0) {
    std::fprintf(stderr, "bench_fusion: attention needs --tokens a multiple of 128 (or below it) and --dim split "
                         "into max(dim / 32, 1) equal heads; got %lld and %lld\n",
                 static_cast<long long>(tokens), static_cast<long long>(dim));
    return 2;
  }
  const Shape qkv_shape{tokens / T, heads, T, dim / heads};
  Tensor q = param(qkv_shape), k = param(qkv_shape), v = param(qkv_shape);
  Tensor cot_a = randn(qkv_shape, kFloat32, &gen).to(device);
  // The attention probabilities' softmax, as a composed attention (a mask) takes it: rows of T.
  const Shape scores_shape{tokens / T, heads, T, T};
  Tensor scores = param(scores_shape), cot_s = randn(scores_shape, kFloat32, &gen).to(device);
  // Each loss is a weighted sum, so that backward gets a full, non-uniform gradient.
  Tensor cot_d = randn({tokens, dim}, kFloat32, &gen).to(device), cot_h = randn({tokens, 4 * dim}, kFloat32, &gen).to(device);
  struct Case {
    const char* name;
    std::function<Tensor()> step;
  };
  std::vector<Case> cases = {
      {"layer_norm", [&] { return (layer_norm(x, {dim}, w, b) * cot_d).sum(); }},
      {"add_layer_norm",
       [&] {
         auto [s, y] = add_layer_norm(x, r, {dim}, w, b);
         return (s * cot_d).sum() + (y * cot_d).sum();
       }},
      {"bias_gelu", [&] { return (bias_gelu(h, hb) * cot_h).sum(); }},
      {"cross_entropy", [&] { return nn::functional::cross_entropy(logits, target); }},
      {"softmax", [&] { return (softmax(scores, -1) * cot_s).sum(); }},
      {"attention", [&] { return (scaled_dot_product_attention(q, k, v, {}, 0.0, true) * cot_a).sum(); }},
      {"attention_dropout",
       [&] { return (scaled_dot_product_attention(q, k, v, {}, 0.1, true, {}, &gen) * cot_a).sum(); }},
  };
  for (const Case& c : cases) {
    double t[2];
    for (int fused = 1; fused >= 0; --fused) {
      set_fusion(fused == 1);
      t[fused] = time_step(c.step, reps, device);
      std::printf("{\"bench\": \"fusion\", \"impl\": \"kiln\", \"device\": \"%s\", \"op\": \"%s\", \"fused\": %s, "
                  "\"tokens\": %lld, \"dim\": %lld, \"vocab\": %lld, \"us_fwd_bwd\": %.1f}\n",
                  device.str().c_str(), c.name, fused ? "true" : "false", static_cast<long long>(tokens),
                  static_cast<long long>(dim), static_cast<long long>(vocab), t[fused] * 1e6);
    }
    std::printf("{\"bench\": \"fusion\", \"impl\": \"kiln\", \"device\": \"%s\", \"op\": \"%s\", "
                "\"fused_over_unfused\": %.3f}\n",
                device.str().c_str(), c.name, t[1] / t[0]);
    std::fflush(stdout);
  }
  set_fusion(true);
  return 0;
}

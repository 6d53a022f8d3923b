// tests/models/test_flops_profiler.cpp: the ops' counts of multiply-accumulates and flops (DeepSpeed's
// rules, ops/flops.h), and nn::FlopsProfiler on an MLP and on GPT against their counts by hand.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/gpt.h"
#include "ops/flops.h"
#include "support.h"

using namespace kiln;
using kiln::test::check_error;

namespace {

// The counts of what fn runs.
flops::Counts counted(const std::function<void()>& fn) {
  flops::Counts c;
  flops::Counting on(&c);
  fn();
  return c;
}

}  // namespace

TEST_CASE("flops: each op counts its MACs and flops by DeepSpeed's rules, once, and backward counts nothing",
          "[models]") {
  manual_seed(1);
  Tensor a = randn({2, 3}), b = randn({3, 4}), bias = randn({4});
  flops::Counts c = counted([&] { matmul(a, b); });
  CHECK(c.macs == 2 * 3 * 4);
  CHECK(c.flops == 2 * 24);
  c = counted([&] { bmm(randn({5, 2, 3}), randn({5, 3, 4})); });
  CHECK(c.macs == 5 * 24);
  // addmm: the product and the bias's add (8 elements), wherever the bias is added.
  c = counted([&] { addmm(bias, a, b); });
  CHECK(c.macs == 24);
  CHECK(c.flops == 48 + 8);
  c = counted([&] { nn::functional::linear(randn({7, 2, 3}), randn({4, 3}), bias); });
  CHECK(c.macs == 7 * 2 * 3 * 4);
  CHECK(c.flops == 2 * c.macs + 7 * 2 * 4);
  // The GELU's epilogue or its composition (a product, then bias_gelu): counted once either way.
  c = counted([&] { addmm_gelu(bias, a, b, "tanh"); });
  CHECK(c.macs == 24);
  CHECK(c.flops == 48 + 2 * 8);

  // conv2d: per output element, C_in / groups x kH x kW products, and the bias.
  Tensor x = randn({2, 3, 8, 8}), w = randn({6, 3, 3, 3});
  c = counted([&] { conv2d(x, w, randn({6}), {1, 1}, {1, 1}); });
  const int64_t out = 2 * 6 * 8 * 8;
  CHECK(c.macs == out * 3 * 3 * 3);
  CHECK(c.flops == 2 * c.macs + out);
  c = counted([&] { conv2d(x, randn({6, 1, 3, 3}), Tensor(), {2, 2}, {1, 1}, {1, 1}, 3); });  // groups 3
  CHECK(c.macs == 2 * 6 * 4 * 4 * 1 * 3 * 3);
  // conv3d is a conv2d over the depth's taps: the same count as its own formula.
  c = counted([&] { conv3d(randn({1, 2, 5, 6, 6}), randn({4, 2, 3, 3, 3})); });
  CHECK(c.macs == (4 * 3 * 4 * 4) * (2 * 3 * 3 * 3));

  // conv_transpose2d: per input element, C_out / groups x kH x kW products; the bias per output
  // element. The (1, 4, 5, 5) input to 6 channels, stride 2: a (1, 6, 11, 11) output.
  c = counted([&] { conv_transpose2d(randn({1, 4, 5, 5}), randn({4, 6, 3, 3}), randn({6}), {2, 2}); });
  CHECK(c.macs == 4 * 5 * 5 * 6 * 3 * 3);
  CHECK(c.flops == 2 * c.macs + 6 * 11 * 11);
  c = counted([&] { conv_transpose1d(randn({2, 4, 7}), randn({4, 3, 3})); });  // as a 2-D one of height 1
  CHECK(c.macs == 2 * 4 * 7 * 3 * 3);

  // Attention: per head, L x S x (E + Ev) products and L x S softmax flops; causal counts them all.
  Tensor q = randn({2, 3, 5, 8}), k = randn({2, 3, 7, 8}), v = randn({2, 3, 7, 4});
  c = counted([&] { scaled_dot_product_attention(q, k, v); });
  CHECK(c.macs == 2 * 3 * 5 * 7 * (8 + 4));
  CHECK(c.flops == 2 * c.macs + 2 * 3 * 5 * 7);
  c = counted([&] { scaled_dot_product_attention(q, q, q, Tensor(), 0.0, /*is_causal=*/true); });
  CHECK(c.macs == 2 * 3 * 5 * 5 * 16);

  // One flop per element: elementwise (the output's), softmax, reductions, pooling (the input's);
  // norms 5 per element with an affine weight, else 4. Copies and views count nothing.
  Tensor m = randn({3, 10});
  CHECK(counted([&] { relu(m); }).flops == 30);
  CHECK(counted([&] { randn({4, 1}) + randn({1, 5}); }).flops == 20);
  CHECK(counted([&] { softmax(m, 1); }).flops == 30);
  CHECK(counted([&] { m.sum(); }).flops == 30);
  CHECK(counted([&] { max_pool2d(x, {2, 2}); }).flops == x.numel());
  CHECK(counted([&] { layer_norm(m, {10}, ones({10}), zeros({10})); }).flops == 150);
  CHECK(counted([&] { layer_norm(m, {10}); }).flops == 120);
  CHECK(counted([&] { m.t().contiguous().view({30}); }).flops == 0);
  CHECK(counted([&] { dropout(m, 0.5); }).flops == 0);
  CHECK(counted([&] { nn::functional::embedding(randint(0, 10, {4}), m.t().contiguous()); }).flops == 0);
  CHECK(counted([&] { m.lt(0.5); }).flops == 0);  // a comparison's result is not floating

  // Backward counts nothing; nested scopes count their own.
  Tensor p = randn({3, 4}).requires_grad_();
  Tensor loss = matmul(a, p).sum();
  flops::Counts outer;
  {
    flops::Counting on(&outer);
    loss.backward();
    CHECK(outer.flops == 0);
    flops::Counts inner = counted([&] { matmul(a, b); });
    CHECK(inner.macs == 24);
    matmul(a, b);
  }
  CHECK(outer.macs == 24);
  CHECK_FALSE(flops::counting());
}

TEST_CASE("FlopsProfiler: an MLP's modules, and their profile printed and written", "[models]") {
  manual_seed(2);
  nn::Sequential mlp;
  mlp.push_back(nn::Linear(8, 16));
  mlp.push_back(nn::ReLU());
  mlp.push_back(nn::Linear(16, 4));
  Tensor x = randn({5, 8});
  nn::FlopsProfiler prof(mlp);
  mlp(x);  // before start_profile: not counted
  prof.start_profile();
  mlp(x);
  prof.stop_profile();
  mlp(x);  // after stop_profile: the hooks see it, the counts do not
  const int64_t macs = 5 * 8 * 16 + 5 * 16 * 4;
  CHECK(prof.get_total_macs() == macs);
  CHECK(prof.get_total_flops() == 2 * macs + 5 * 16 + 5 * 16 + 5 * 4);  // the biases' adds, the ReLU
  CHECK(prof.get_total_params() == 8 * 16 + 16 + 16 * 4 + 4);
  CHECK(prof.get_total_duration() > 0);
  const auto& modules = prof.modules();
  REQUIRE(modules.size() == 4);
  CHECK(modules[0].name.empty());
  CHECK(modules[0].depth == 0);
  CHECK(modules[0].calls == 1);
  CHECK(modules[1].name == "0");
  CHECK(modules[1].depth == 1);
  CHECK(modules[1].counts.macs == 5 * 8 * 16);
  CHECK(modules[1].params == 8 * 16 + 16);
  CHECK(modules[2].counts.flops == 5 * 16);  // the ReLU
  CHECK(modules[3].counts.macs == 5 * 16 * 4);

  const std::string text = prof.model_profile(3, -1, 2, true);
  INFO(text);
  CHECK(text.find("Profile Summary at step 3:") != std::string::npos);
  CHECK(text.find(fmt::format("{:<62}{}", "fwd MACs per device:", "960.00 MACs")) != std::string::npos);
  CHECK(text.find(fmt::format("{:<62}{}", "params per device:", "212.00")) != std::string::npos);
  CHECK(text.find("depth 1:\n    params      - {'0': '144.00', '2': '68.00'}") != std::string::npos);
  CHECK(text.find("  (0): Linear(144.00, 67.92% Params, 640.00 MACs, 66.67% MACs") != std::string::npos);
  // module_depth 0: the model only.
  const std::string top = prof.model_profile(1, 0, 1, true);
  CHECK(top.find("depth 1:") == std::string::npos);
  CHECK(top.find("(0): Linear") == std::string::npos);

  const std::filesystem::path file = std::filesystem::temp_directory_path() / "kiln_flops_profile.txt";
  prof.print_model_profile(3, -1, 2, true, file.string());
  std::ifstream in(file);
  std::stringstream written;
  written << in.rdbuf();
  CHECK(written.str() == text);
  std::filesystem::remove(file);
  check_error([&] { prof.print_model_profile(1, -1, 1, true, "/nonexistent-dir/profile.txt"); },
              {"FlopsProfiler: cannot write '/nonexistent-dir/profile.txt': No such file", "directory exists"});
  // A directory where the file should go: an Error with the reason, and no temporary file left.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("kiln_flops_dir_{}", ::getpid());
  std::filesystem::create_directories(dir);
  check_error([&] { prof.print_model_profile(1, -1, 1, true, dir.string()); },
              {fmt::format("FlopsProfiler: cannot write '{}': Is a directory; it is unchanged", dir.string())});
  int left = 0;  // temporary files beside it
  for (const auto& e : std::filesystem::directory_iterator(dir.parent_path())) {
    left += e.path().filename().string().rfind(dir.filename().string() + ".tmp", 0) == 0;
  }
  CHECK(left == 0);
  std::filesystem::remove(dir);
  check_error([&] { prof.model_profile(1, -1, 0); }, {"top_modules must be >= 1, not 0"});

  // A second start_profile starts from zero, also without a stop_profile between (it counted
  // nothing after that once); end_profile removes the hooks.
  prof.start_profile();
  mlp(x);
  prof.start_profile();
  mlp(x);
  mlp(x);
  prof.end_profile();
  CHECK(prof.get_total_macs() == 2 * macs);
  CHECK(prof.modules()[0].calls == 2);

  // Two profilers whose scopes interleave (a starts, b starts, a stops): b keeps counting.
  {
    nn::FlopsProfiler a(mlp), b(mlp);
    a.start_profile();
    b.start_profile();
    a.stop_profile();
    mlp(x);
    b.stop_profile();
    CHECK(a.get_total_macs() == 0);
    CHECK(b.get_total_macs() == macs);
    CHECK_FALSE(flops::counting());
  }
  nn::FlopsProfiler unused(mlp);
  check_error([&] { unused.model_profile(); }, {"nothing was profiled; call start_profile()"});
}

TEST_CASE("FlopsProfiler: GPT's MACs are 12 d^2 per token and layer, attention's 2 T^2 d per layer, and the head's",
          "[models]") {
  models::GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 20};
  manual_seed(3);
  models::GPT gpt(c);
  const int64_t B = 3, T = 8, d = c.n_embd, L = c.n_layer, V = c.vocab_size;
  Tensor idx = randint(0, V, {B, T});
  nn::FlopsProfiler prof(gpt);
  prof.start_profile();
  models::GPT::loss(gpt(idx), randint(0, V, {B, T})).backward();  // the loss and backward count nothing
  prof.stop_profile();
  const int64_t block = B * T * 12 * d * d + 2 * B * T * T * d;
  CHECK(prof.get_total_macs() == L * block + B * T * d * V);
  int64_t params = 0;
  for (const Tensor& p : gpt.parameters()) params += p.numel();
  CHECK(prof.get_total_params() == params);
  int found = 0;
  for (const auto& m : prof.modules()) {
    INFO(m.name);
    if (m.name == "transformer.h.0" || m.name == "transformer.h.1") {
      ++found;
      CHECK(m.counts.macs == block);
      CHECK(m.depth == 3);
    }
    if (m.name == "transformer.h.1.attn") {
      ++found;
      CHECK(m.counts.macs == B * T * 4 * d * d + 2 * B * T * T * d);  // c_attn, attention, c_proj
    }
    if (m.name == "transformer.h.0.attn.c_attn") {
      ++found;
      CHECK(m.counts.macs == B * T * d * 3 * d);
    }
  }
  CHECK(found == 4);
}

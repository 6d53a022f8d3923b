// tests/cuda/test_cuda_transformer.cpp: attention and GPT on cuda:0 against the CPU: the composed
// scaled_dot_product_attention (CUDA has no fused kernel yet) against the CPU's fused one, forward and
// gradients; a tiny GPT's logits and parameter gradients; and activation offload (SaveOnCpu): the same
// gradients, the saved activations copied to the host, and less device memory held by the graph.
// Skipped (exit 77) without a GPU, like test_cuda.cpp.
#include "models/gpt.h"
#include "support.h"

using namespace kiln;
using models::GPT;
using models::GPTConfig;

namespace {
const Device kGpu = Device::cuda(0);
}

TEST_CASE("scaled_dot_product_attention on cuda:0 equals the CPU's fused kernel", "[gpu][attention]") {
  Generator gen(4);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    Tensor q = randn({2, 3, 70, 16}, kFloat64, &gen), k = randn({2, 3, 70, 16}, kFloat64, &gen);
    Tensor v = randn({2, 3, 70, 16}, kFloat64, &gen), cot = randn({2, 3, 70, 16}, kFloat64, &gen);
    Tensor qc = q.clone().requires_grad_(), kc = k.clone().requires_grad_(), vc = v.clone().requires_grad_();
    Tensor qg = q.to(kGpu).requires_grad_(), kg = k.to(kGpu).requires_grad_(), vg = v.to(kGpu).requires_grad_();
    Tensor yc = scaled_dot_product_attention(qc, kc, vc, {}, 0.0, causal);
    Tensor yg = scaled_dot_product_attention(qg, kg, vg, {}, 0.0, causal);
    test::check_close(yg.cpu(), yc, {1e-10, 1e-10});
    auto gc = autograd::grad({yc}, {qc, kc, vc}, {cot});
    auto gg = autograd::grad({yg}, {qg, kg, vg}, {cot.to(kGpu)});
    for (int i = 0; i < 3; ++i) test::check_close(gg[i].cpu(), gc[i], {1e-10, 1e-10});
  }
}

TEST_CASE("GPT on cuda:0: logits and gradients equal the CPU's", "[gpu][gpt]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 40};
  GPT cpu(c), gpu(c);
  gpu.load_state_dict(cpu.state_dict());
  gpu.to(kGpu);
  Tensor idx = randint(0, 40, {3, 16}), targets = randint(0, 40, {3, 16});
  Tensor lc = GPT::loss(cpu(idx), targets), lg = GPT::loss(gpu(idx.to(kGpu)), targets.to(kGpu));
  CHECK(lg.item<double>() == Approx(lc.item<double>()).epsilon(1e-5));
  lc.backward();
  lg.backward();
  auto pc = cpu.named_parameters(), pg = gpu.named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].first);
    test::check_close(pg[i].second.grad().cpu(), pc[i].second.grad(), {1e-3, 1e-5});
  }
}

TEST_CASE("activation offload (SaveOnCpu) on cuda:0: same gradients, activations held on the host", "[gpu][offload]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 64, .block_size = 32, .vocab_size = 50};
  GPT model(c);
  model.to(kGpu);
  Tensor idx = randint(0, 50, {8, 32}).to(kGpu), targets = randint(0, 50, {8, 32}).to(kGpu);
  auto run = [&](bool offload, int64_t* held, int64_t* bytes) {
    model.zero_grad();
    const int64_t before = memory::stats(kGpu).allocated_bytes;
    Tensor loss;
    {
      std::optional<autograd::SaveOnCpu> guard;
      if (offload) guard.emplace();
      loss = GPT::loss(model(idx), targets);
      if (bytes) *bytes = guard ? guard->offloaded_bytes() : 0;
    }
    *held = memory::stats(kGpu).allocated_bytes - before;  // what the graph keeps on the device
    loss.backward();
    std::vector<Tensor> grads;
    for (const auto& p : model.parameters()) grads.push_back(p.grad().cpu());
    return grads;
  };
  int64_t held_plain = 0, held_offload = 0, bytes = 0;
  auto plain = run(false, &held_plain, nullptr);
  auto offloaded = run(true, &held_offload, &bytes);
  CHECK(bytes > 0);
  CHECK(held_offload < held_plain / 2);
  for (size_t i = 0; i < plain.size(); ++i) test::check_close(offloaded[i], plain[i], {1e-6, 1e-7});
}

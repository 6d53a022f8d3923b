// tests/cuda/test_cuda_transformer.cpp: attention and GPT on cuda:0 against the CPU: the composed
// scaled_dot_product_attention (float64 on CUDA) against the CPU's fused one, forward and gradients;
// the CUDA flash kernels (float16, bfloat16, float32) against a float64 composition of the same
// rounded inputs (the 16-bit ones in both kernel sets of KILN_CUDA_ATTENTION), also reading the heads
// of one projection in place, and their memory; a tiny GPT's logits and parameter gradients, with
// dropout (the CPU's masks, checkpointed or not) and under float16 and bfloat16 autocast; and
// activation offload (SaveOnCpu): the same gradients, the saved activations copied to the host, and
// less device memory held by the graph. One case checks every head dim row by row, on peaked scores,
// tails and broadcast key and value heads (its 16-bit gradients against a float64 reference that
// takes FlashAttention's delta from the kernel's own rounded output).
// Skipped (exit 77) without a GPU, like test_cuda.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

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

namespace {
// |a - b| / max(|b|, 1) over all elements (Frobenius norms): relative, except where the reference is
// (near) zero, as the gradients of q and k are with a single key (softmax over one key is constant).
double relative_error(const Tensor& a, const Tensor& b) {
  const Tensor d = a.to(kFloat64).cpu() - b.to(kFloat64).cpu();
  const double norm_b = std::sqrt((b.to(kFloat64) * b.to(kFloat64)).sum().item<double>());
  return std::sqrt((d * d).sum().item<double>()) / std::max(norm_b, 1.0);
}

// The dtypes and kernel sets the flash attention tests run: the 16-bit dtypes with both sets of
// KILN_CUDA_ATTENTION (the WMMA kernels and the register-tiled ones, Note [register-tiled attention]
// in cuda/attention.cu), float32 with its own kernels (the variable unset).
std::vector<std::pair<DType, const char*>> kernel_sets() {
  return {{kBFloat16, "wmma"}, {kBFloat16, "mma"}, {kFloat16, "wmma"}, {kFloat16, "mma"}, {kFloat32, nullptr}};
}
std::string set_name(const char* kernels) {
  return kernels != nullptr ? std::string(kernels) + " kernels" : "float32 kernels";
}
}  // namespace

TEST_CASE("the CUDA flash attention kernels (float16, bfloat16, float32) match a float64 composition",
          "[gpu][attention]") {
  // Inputs rounded to the dtype first; the reference composes in float64 from those values, so what
  // remains is the kernel's own rounding: P, dS and the results held in 16 bits (unit roundoff 2^-8
  // for bfloat16, 2^-11 for float16), or float32 sums and exponentials. A wrong index or mask gives
  // errors of order 1.
  Generator gen(11);
  struct Case {
    int64_t L, S, D;
  };
  for (const auto& [dt, kernels] : kernel_sets()) {
    test::EnvGuard env("KILN_CUDA_ATTENTION", kernels);
    const double bound = dt == kBFloat16 ? 2e-2 : dt == kFloat16 ? 4e-3 : 1e-5;
    for (Case c : {Case{1, 1, 32}, Case{7, 7, 64}, Case{65, 65, 96}, Case{200, 200, 128}, Case{130, 70, 64},
                   Case{70, 130, 64}, Case{256, 256, 64}}) {
      for (bool causal : {false, true}) {
        INFO(dtype_name(dt) << " (" << set_name(kernels) << "), L " << c.L << ", S " << c.S << ", D " << c.D
                            << ", causal " << causal);
        Tensor q = randn({2, 3, c.L, c.D}, kFloat64, &gen).to(dt), k = randn({2, 3, c.S, c.D}, kFloat64, &gen).to(dt);
        Tensor v = randn({2, 3, c.S, c.D}, kFloat64, &gen).to(dt), cot = randn({2, 3, c.L, c.D}, kFloat64, &gen).to(dt);
        Tensor q64 = q.to(kFloat64).requires_grad_(), k64 = k.to(kFloat64).requires_grad_();
        Tensor v64 = v.to(kFloat64).requires_grad_();
        test::FusionGuard composed(false);  // the float64 reference op by op
        Tensor y64 = scaled_dot_product_attention(q64, k64, v64, {}, 0.0, causal);
        auto g64 = autograd::grad({y64}, {q64, k64, v64}, {cot.to(kFloat64)});
        test::FusionGuard fused(true);
        Tensor qg = q.to(kGpu).requires_grad_(), kg = k.to(kGpu).requires_grad_(), vg = v.to(kGpu).requires_grad_();
        Tensor yg = scaled_dot_product_attention(qg, kg, vg, {}, 0.0, causal);
        CHECK(yg.dtype() == dt);
        CHECK(relative_error(yg, y64) < bound);
        auto gg = autograd::grad({yg}, {qg, kg, vg}, {cot.to(kGpu)});
        for (int i = 0; i < 3; ++i) {
          INFO("gradient " << i << ", relative error " << relative_error(gg[i], g64[i]));
          CHECK(gg[i].dtype() == dt);
          CHECK(relative_error(gg[i], g64[i]) < bound);
        }
      }
    }
  }
}

namespace {
// The largest error of one row: |a - b| / max(|b|, 1) over the last dim (Euclidean norms), the
// largest over all rows. A whole-tensor norm would let one bad row among thousands pass.
double row_error(const Tensor& a, const Tensor& b) {
  const Tensor b64 = b.to(kFloat64).cpu(), d = a.to(kFloat64).cpu() - b64;
  const Tensor err = (d * d).sum(Shape{-1}).sqrt() / (b64 * b64).sum(Shape{-1}).sqrt().clamp(1.0);
  return err.max().item<double>();
}

// The gradients of q, k and v that the flash backward computes, in float64, for key and value heads
// k and v (expanded to q's heads where they broadcast: their gradients are summed back over the
// heads when `broadcast`), with delta = rowsum(dO * out). FlashAttention's backward takes delta from
// the output as it stored it, rounded to its dtype, not from the exact O: dS = P * (dP - delta)
// cancels where P is peaked (the top key's dS is (1 - P) times small terms), so a 16-bit O's rounding
// (2^-9 of |O| in bfloat16, summed over D terms of dO * O) would dominate a comparison with the exact
// gradients (row errors up to 0.7 in bfloat16 on an H200) and hide what the kernel itself adds. So
// `out` is the kernel's own output (the exact O gives the exact gradients); p is P in float64
// (attention_probabilities64).
// P = softmax(q k^T / sqrt(D)) (masked when causal), [B, H, L, S], from the float64 composition: the
// attention of an identity matrix, whose rows are P's.
Tensor attention_probabilities64(const Tensor& q, const Tensor& k, bool causal) {
  const int64_t B = q.size(0), H = q.size(1), S = k.size(2);
  return scaled_dot_product_attention(q, k, eye(S, {}, kFloat64).expand({B, H, S, S}), {}, 0.0, causal);
}

std::vector<Tensor> flash_gradients64(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cot,
                                      const Tensor& p, const Tensor& out, bool broadcast) {
  const int64_t D = q.size(3);
  const Tensor delta = (cot * out.to(kFloat64).cpu()).sum(Shape{-1}, true);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Tensor ds = p * (cot.matmul(v.transpose(-2, -1)) - delta) * scale;
  Tensor gk = ds.transpose(-2, -1).matmul(q), gv = p.transpose(-2, -1).matmul(cot);
  if (broadcast) {
    gk = gk.sum(Shape{1}, true);
    gv = gv.sum(Shape{1}, true);
  }
  return {ds.matmul(k), gk, gv};
}
}  // namespace

TEST_CASE("the CUDA flash attention kernels at every head dim: tails, peaked scores, broadcast heads, row by row",
          "[gpu][attention]") {
  // Values m / 64 with |m| <= 256: exact in bfloat16, float16 and float32, so one float64 reference
  // serves every kernel set. Their scores have a standard deviation of about 5 whatever D is, so the
  // running maximum moves from key tile to key tile (randn inputs barely move it). Shapes: one query
  // over three key tiles (decoding), more queries than keys with a one-key tail, and 1023 (a tail in
  // both); key and value heads broadcast (stride 0) in the second. Each row is checked on its own:
  // the output against the exact one, the gradients against flash_gradients64 (delta from the
  // kernel's own output, as the kernels take it).
  Generator gen(17);
  struct Case {
    int64_t L, S;
    bool broadcast;
  };
  auto exact = [&](const Shape& shape) { return randint(-256, 257, shape, kInt64, &gen).to(kFloat64) / 64.0; };
  for (Case c : {Case{1, 130, false}, Case{300, 65, true}, Case{1023, 1023, false}}) {
    for (int64_t D : {32, 64, 96, 128}) {
      for (bool causal : {false, true}) {
        const int64_t B = 1, H = 2, KH = c.broadcast ? 1 : H;
        Tensor q = exact({B, H, c.L, D}), k = exact({B, KH, c.S, D}), v = exact({B, KH, c.S, D});
        Tensor cot = exact({B, H, c.L, D});
        auto heads = [&](const Tensor& t) { return c.broadcast ? t.expand({B, H, c.S, D}) : t; };
        test::FusionGuard composed(false);  // the float64 reference op by op
        const Tensor y64 = scaled_dot_product_attention(q, heads(k), heads(v), {}, 0.0, causal);
        const Tensor p64 = attention_probabilities64(q, heads(k), causal);
        for (const auto& [dt, kernels] : kernel_sets()) {
          test::EnvGuard env("KILN_CUDA_ATTENTION", kernels);
          // Twice the whole-tensor bounds above: one row's error has no others to average with. A
          // wrong index or mask still gives errors of order 1.
          const double bound = dt == kBFloat16 ? 4e-2 : dt == kFloat16 ? 8e-3 : 2e-5;
          INFO(dtype_name(dt) << " (" << set_name(kernels) << "), L " << c.L << ", S " << c.S << ", D " << D
                              << ", causal " << causal << ", broadcast " << c.broadcast);
          Tensor qg = q.to(dt).to(kGpu).requires_grad_(), kg = k.to(dt).to(kGpu).requires_grad_();
          Tensor vg = v.to(dt).to(kGpu).requires_grad_();
          Tensor yg;
          std::vector<Tensor> gg;
          {
            test::FusionGuard fused(true);
            yg = scaled_dot_product_attention(qg, heads(kg), heads(vg), {}, 0.0, causal);
            gg = autograd::grad({yg}, {qg, kg, vg}, {cot.to(dt).to(kGpu)});
          }
          INFO("output row error " << row_error(yg, y64));
          CHECK(row_error(yg, y64) < bound);
          // In every dtype delta comes from the kernel's own output. In float32 too: O's error of
          // about 1e-6 of |O| (from P's), summed over D terms of dO * O up to 16 each, moved delta by
          // up to 5e-4, and the gradients against the exact ones by 3e-5 to 5e-4 on an H200
          // (2026-12-04), while against this reference they were within 3e-5. So float32's gradients
          // get five times its output's bound, still far below a wrong index's or mask's error.
          const auto g64 = flash_gradients64(q, heads(k), heads(v), cot, p64, yg, c.broadcast);
          const double grad_bound = dt == kFloat32 ? 1e-4 : bound;
          for (int i = 0; i < 3; ++i) {
            INFO("gradient " << i << ", row error " << row_error(gg[i], g64[i]));
            CHECK(row_error(gg[i], g64[i]) < grad_bound);
          }
        }
      }
    }
  }
}

TEST_CASE("the CUDA flash attention kernels take more (batch, head) pairs than a grid's y holds", "[gpu][attention]") {
  // Over gridDim.y's 65535 pairs (cuda/attention.cu, in_slices), forward and backward, the last slice
  // shorter: 1093 x 60 = 65580 pairs in slices of whole batch elements, and one batch element of
  // 65600 heads in runs of heads.
  Generator gen(19);
  auto exact = [&](const Shape& shape) { return randint(-64, 65, shape, kInt64, &gen).to(kFloat64) / 64.0; };
  for (auto [B, H] : {std::pair<int64_t, int64_t>{1093, 60}, {1, 65600}}) {
    const int64_t L = 3, S = 5, D = 32;
    Tensor q = exact({B, H, L, D}), k = exact({B, H, S, D}), v = exact({B, H, S, D}), cot = exact({B, H, L, D});
    Tensor q64 = q.clone().requires_grad_(), k64 = k.clone().requires_grad_(), v64 = v.clone().requires_grad_();
    test::FusionGuard composed(false);
    Tensor y64 = scaled_dot_product_attention(q64, k64, v64, {}, 0.0, true);
    auto g64 = autograd::grad({y64}, {q64, k64, v64}, {cot});
    test::FusionGuard fused(true);
    for (const auto& [dt, kernels] : kernel_sets()) {
      test::EnvGuard env("KILN_CUDA_ATTENTION", kernels);
      const double bound = dt == kBFloat16 ? 4e-2 : dt == kFloat16 ? 8e-3 : 2e-5;
      INFO(dtype_name(dt) << " (" << set_name(kernels) << "), B " << B << ", H " << H);
      Tensor qg = q.to(dt).to(kGpu).requires_grad_(), kg = k.to(dt).to(kGpu).requires_grad_();
      Tensor vg = v.to(dt).to(kGpu).requires_grad_();
      Tensor yg = scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true);
      CHECK(row_error(yg, y64) < bound);
      auto gg = autograd::grad({yg}, {qg, kg, vg}, {cot.to(dt).to(kGpu)});
      for (int i = 0; i < 3; ++i) {
        INFO("gradient " << i);
        CHECK(row_error(gg[i], g64[i]) < bound);
      }
    }
  }
}

TEST_CASE("the CUDA flash attention kernels read heads where a (B, T, 3 C) projection holds them", "[gpu][attention]") {
  // Note [attention layout] (ops/attention.cpp): q, k and v split from one projection go to the
  // kernels as strided views, out comes back in (B, T, H, D) memory; with the projection shifted by
  // one element its 16-bit rows are off 16-byte boundaries and are copied first. Against a float64
  // composition of the same rounded values, with the bounds of the test above.
  Generator gen(13);
  const int64_t B = 2, T = 70, H = 3;
  for (const auto& [dt, kernels] : kernel_sets()) {
    test::EnvGuard env("KILN_CUDA_ATTENTION", kernels);
    const double bound = dt == kBFloat16 ? 2e-2 : dt == kFloat16 ? 4e-3 : 1e-5;
    for (int64_t D : {32, 64}) {
      for (int64_t shift : {0, 1}) {
        const int64_t C = H * D;
        INFO(dtype_name(dt) << " (" << set_name(kernels) << "), D " << D << ", shift " << shift);
        Tensor x = randn({B, T, 3 * C + shift}, kFloat64, &gen).to(dt);
        Tensor cot = randn({B, T, C}, kFloat64, &gen).to(dt);
        auto run = [&](const Tensor& proj) {
          std::vector<Tensor> qkv;
          for (const Tensor& part : proj.narrow(2, shift, 3 * C).split(C, 2))
            qkv.push_back(part.view({B, T, H, D}).transpose(1, 2));
          return scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, true);
        };
        Tensor x64 = x.to(kFloat64).requires_grad_();
        test::FusionGuard composed(false);
        Tensor y64 = run(x64);
        auto g64 = autograd::grad({y64}, {x64}, {cot.to(kFloat64).view({B, T, H, D}).transpose(1, 2)});
        test::FusionGuard fused(true);
        Tensor xg = x.to(kGpu).requires_grad_();
        Tensor yg = run(xg);
        CHECK(yg.dtype() == dt);
        const bool copied = shift != 0 && dt != kFloat32;  // 16-bit rows off 16-byte boundaries
        CHECK((copied ? yg.is_contiguous() : yg.transpose(1, 2).is_contiguous()));
        CHECK(relative_error(yg, y64) < bound);
        auto gg = autograd::grad({yg}, {xg}, {cot.to(kGpu).view({B, T, H, D}).transpose(1, 2)});
        INFO("gradient relative error " << relative_error(gg[0], g64[0]));
        CHECK(relative_error(gg[0], g64[0]) < bound);
      }
    }
  }
}

TEST_CASE("the CUDA flash attention kernel holds no L x S matrix", "[gpu][attention]") {
  // B H = 4, L = S = 2048, D = 64, bfloat16: q, k, v, out and their gradients are 1 MiB each, the
  // float32 lse 32 KiB; one (L, S) float32 score matrix per head would be 64 MiB.
  Generator gen(12);
  auto make = [&] { return randn({4, 2048, 64}, kFloat32, &gen).to(kBFloat16).to(kGpu).requires_grad_(); };
  Tensor q = make(), k = make(), v = make();
  Tensor cot = randn({4, 2048, 64}, kFloat32, &gen).to(kBFloat16).to(kGpu);
  for (const char* kernels : {"wmma", "mma"}) {
    test::EnvGuard env("KILN_CUDA_ATTENTION", kernels);
    cuda::synchronize();
    memory::reset_peak(kGpu);
    const int64_t before = memory::stats(kGpu).allocated_bytes;
    {
      test::FusionGuard fused(true);
      Tensor y = scaled_dot_product_attention(q, k, v, {}, 0.0, true);
      auto g = autograd::grad({y}, {q, k, v}, {cot});
      cuda::synchronize();
    }
    const int64_t peak = memory::stats(kGpu).peak_allocated_bytes - before;
    INFO(kernels << " kernels: peak increment " << peak << " bytes");
    CHECK(peak < (16 << 20));
  }
}

TEST_CASE("KILN_CUDA_ATTENTION names a kernel set or is an Error", "[gpu][attention]") {
  Tensor q = randn({1, 2, 16, 32}, kFloat32).to(kBFloat16).to(kGpu);
  test::FusionGuard fused(true);
  {
    test::EnvGuard env("KILN_CUDA_ATTENTION", "fast");
    test::check_error([&] { scaled_dot_product_attention(q, q, q, {}, 0.0, true); },
                      {"KILN_CUDA_ATTENTION=fast", "'wmma'", "'mma'"});
  }
  // Both sets give the same attention up to the order of their float32 sums.
  Tensor y[2];
  int i = 0;
  for (const char* kernels : {"wmma", "mma"}) {
    test::EnvGuard env("KILN_CUDA_ATTENTION", kernels);
    y[i++] = scaled_dot_product_attention(q, q, q, {}, 0.0, true).to(kFloat32).cpu();
  }
  test::check_close(y[1], y[0], {1e-2, 1e-3});
}

namespace {

// A GPT of config c on the CPU and a copy on cuda:0, each run on the same batch from the same
// generator state: the same loss (and generator offset after), and every parameter's gradient.
void check_gpt_on_gpu(const GPTConfig& c, const std::vector<bool>& checkpointed) {
  GPT cpu(c), gpu(c);
  gpu.load_state_dict(cpu.state_dict());
  gpu.to(kGpu);
  Tensor idx = randint(0, c.vocab_size, {3, c.block_size}), targets = randint(0, c.vocab_size, {3, c.block_size});
  for (bool on : checkpointed) {
    INFO("checkpointed " << on);
    gpu.set_checkpointing(on);
    cpu.zero_grad();
    gpu.zero_grad();
    const Generator::State state = default_generator().get_state();
    Tensor lc = GPT::loss(cpu(idx), targets);
    const uint64_t cpu_end = default_generator().offset();
    default_generator().set_state(state);
    Tensor lg = GPT::loss(gpu(idx.to(kGpu)), targets.to(kGpu));
    CHECK(default_generator().offset() == cpu_end);
    CHECK(lg.item<double>() == Approx(lc.item<double>()).epsilon(1e-5));
    lc.backward();
    lg.backward();
    auto pc = cpu.named_parameters(), pg = gpu.named_parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      INFO(pc[i].first);
      test::check_close(pg[i].second.grad().cpu(), pc[i].second.grad(), {1e-3, 1e-5});
    }
  }
}

}  // namespace

TEST_CASE("GPT on cuda:0: logits and gradients equal the CPU's", "[gpu][gpt]") {
  check_gpt_on_gpu({.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 40}, {false});
}

// The CUDA random numbers are the CPU's (Philox, the same element mapping), so from one generator
// state a GPT with dropout drops the same elements on both devices: on the CPU the attention
// probabilities' mask is drawn inside the fused kernel, on CUDA by dropout on the composed
// probabilities, so this also holds the two to one mask. Activation checkpointing on CUDA replays
// the masks.
TEST_CASE("GPT with dropout on cuda:0, checkpointed or not: the CPU's loss and gradients from the same state",
          "[gpu][gpt]") {
  check_gpt_on_gpu({.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 40, .dropout = 0.2},
                   {false, true});
}

// Autocast's policy on CUDA (PyTorch's): the GEMMs and attention in the 16-bit dtype, the norms,
// softmax and the loss in float32; the loss and gradients near float32's, the weights float32.
TEST_CASE("GPT under float16 and bfloat16 autocast on cuda:0: near float32's loss and gradients",
          "[gpu][gpt][autocast]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 64, .block_size = 32, .vocab_size = 50};
  GPT model(c);
  model.to(kGpu);
  Tensor idx = randint(0, 50, {4, 32}).to(kGpu), targets = randint(0, 50, {4, 32}).to(kGpu);
  auto run = [&](std::optional<DType> low) {
    model.zero_grad();
    Tensor loss;
    {
      AutocastGuard ac(DeviceType::CUDA, low.value_or(kFloat16), low.has_value());
      Tensor logits = model(idx);
      CHECK(logits.dtype() == (low ? *low : kFloat32));  // the head is a GEMM
      loss = GPT::loss(logits, targets);
      CHECK(loss.dtype() == kFloat32);  // cross-entropy runs in float32
    }
    loss.backward();
    std::vector<Tensor> grads;
    for (const auto& p : model.parameters()) {
      CHECK(p.grad().dtype() == kFloat32);
      grads.push_back(p.grad().cpu());
    }
    return std::pair{loss.item<double>(), grads};
  };
  const auto [loss32, grads32] = run(std::nullopt);
  for (DType low : {kFloat16, kBFloat16}) {
    INFO(dtype_name(low));
    const auto [loss, grads] = run(low);
    CHECK(loss == Approx(loss32).epsilon(low == kFloat16 ? 2e-3 : 1e-2));
    for (size_t i = 0; i < grads.size(); ++i) {
      // Relative to the largest gradient of each weight: 16-bit products, float32 sums.
      const double scale = grads32[i].abs().max().item<double>();
      test::check_close(grads[i], grads32[i], {0, (low == kFloat16 ? 2e-2 : 8e-2) * scale});
    }
  }
}

TEST_CASE("activation offload (SaveOnCpu) on cuda:0: same gradients, activations held on the host, pinned or not",
          "[gpu][offload]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 64, .block_size = 32, .vocab_size = 50};
  GPT model(c);
  model.to(kGpu);
  Tensor idx = randint(0, 50, {8, 32}).to(kGpu), targets = randint(0, 50, {8, 32}).to(kGpu);
  auto run = [&](bool offload, int64_t* held, int64_t* bytes, bool pin = false) {
    model.zero_grad();
    const int64_t before = memory::stats(kGpu).allocated_bytes;
    Tensor loss;
    {
      std::optional<autograd::SaveOnCpu> guard;
      if (offload) guard.emplace(pin);
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
  // Pinned: the copies are queued without the host waiting (Note [non_blocking copies]).
  const int64_t pinned_before = cuda::host_memory_stats().allocated_bytes;
  int64_t held_pinned = 0, bytes_pinned = 0;
  auto pinned = run(true, &held_pinned, &bytes_pinned, /*pin=*/true);
  CHECK(bytes_pinned == bytes);
  CHECK(held_pinned < held_plain / 2);
  CHECK(cuda::host_memory_stats().allocated_bytes == pinned_before);  // the host copies are gone after backward
  for (size_t i = 0; i < plain.size(); ++i) test::check_close(pinned[i], plain[i], {1e-6, 1e-7});
}

// DeepSpeed's cpu_checkpointing: each checkpointed block's input waits for backward in pinned host
// memory (autograd::keep_on_cpu) instead of on the device.
TEST_CASE("GPT checkpointed on cuda:0 with cpu_checkpointing: same gradients, the blocks' inputs on the host",
          "[gpu][offload]") {
  GPTConfig c{.n_layer = 3, .n_head = 2, .n_embd = 64, .block_size = 32, .vocab_size = 50};
  GPT model(c);
  model.to(kGpu);
  model.set_checkpointing(true);
  Tensor idx = randint(0, 50, {8, 32}).to(kGpu), targets = randint(0, 50, {8, 32}).to(kGpu);
  auto run = [&](bool on_cpu, int64_t* held) {
    model.configure_checkpointing({.partition_activations = false, .cpu_checkpointing = on_cpu});
    model.zero_grad();
    const int64_t before = memory::stats(kGpu).allocated_bytes;
    Tensor loss = GPT::loss(model(idx), targets);
    *held = memory::stats(kGpu).allocated_bytes - before;
    loss.backward();
    std::vector<Tensor> grads;
    for (const auto& p : model.parameters()) grads.push_back(p.grad().cpu());
    return grads;
  };
  const int64_t pinned_before = cuda::host_memory_stats().allocated_bytes;
  int64_t held_device = 0, held_host = 0;
  auto kept = run(false, &held_device);
  auto moved = run(true, &held_host);
  // The 3 blocks' (8, 32, 64) float32 inputs: 64 KiB each, no longer on the device.
  CHECK(held_device - held_host == 3 * 8 * 32 * 64 * 4);
  CHECK(cuda::host_memory_stats().allocated_bytes == pinned_before);  // the host copies are gone after backward
  for (size_t i = 0; i < kept.size(); ++i) test::check_close(moved[i], kept[i], {1e-6, 1e-7});
}

// DeepSpeed's synchronize_checkpoint_boundary and profile: each checkpointed block waits for the
// device at its boundaries and is timed; the gradients are the same (within the run-to-run
// differences of atomic sums).
TEST_CASE("GPT checkpointed on cuda:0 with synchronize_checkpoint_boundary and profile: same gradients, each block "
          "counted", "[gpu]") {
  GPTConfig c{.n_layer = 3, .n_head = 2, .n_embd = 64, .block_size = 32, .vocab_size = 50};
  GPT model(c);
  model.to(kGpu);
  model.set_checkpointing(true);
  Tensor idx = randint(0, 50, {8, 32}).to(kGpu), targets = randint(0, 50, {8, 32}).to(kGpu);
  auto run = [&](const nn::ActivationCheckpointing& options) {
    model.configure_checkpointing(options);
    model.zero_grad();
    GPT::loss(model(idx), targets).backward();
    std::vector<Tensor> grads;
    for (const auto& p : model.parameters()) grads.push_back(p.grad().cpu());
    return grads;
  };
  auto plain = run({});
  auto profile = std::make_shared<autograd::CheckpointProfile>();
  auto timed = run({.synchronize_checkpoint_boundary = true, .profile = profile});
  CHECK(profile->forwards == 3);
  CHECK(profile->backwards == 3);
  CHECK(profile->recompute_s > 0);
  CHECK(profile->backward_s > 0);
  for (size_t i = 0; i < plain.size(); ++i) test::check_close(timed[i], plain[i], {1e-6, 1e-7});
}

// tests/ops/test_autocast.cpp: autocast (ops/autocast.h). The policy table, op by op: inside a
// bfloat16 CPU scope each op's output equals the same op run outside on inputs cast by hand as the
// policy says (dtype and values); outside nothing changes. Then nesting and enabled = false, the
// CUDA column of the table, the cast cache (one cast per parameter per scope, dropped at the exit,
// after a backward and after an in-place update), gradients back to the float32 parameters against a
// float32 run, backward inside a scope, and checkpoint's recompute under autocast.
#include <functional>
#include <set>
#include <string>

#include "support.h"

using namespace kiln;
using autocast::Policy;

namespace {

// One row's op and its inputs. make(d) builds the inputs with the floating ones in dtype d.
struct Case {
  std::string name;
  std::function<std::vector<Tensor>(DType)> make;
  std::function<Tensor(const std::vector<Tensor>&)> run;
};

Tensor s(const Shape& shape, DType d, double seed = 0.5) { return test::sample(shape, kFloat32, seed).to(d); }
Tensor positive(const Shape& shape, DType d, double seed = 0.5) {
  return (test::sample(shape, kFloat32, seed).abs() + 0.5).to(d);
}
Tensor labels(const Shape& shape, int64_t classes) {  // 0, 1, ..., classes - 1, 0, 1, ...
  std::vector<int64_t> v(shape.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i) % classes;
  return from_vector(v).view(shape);
}

std::vector<Case> cases() {
  using V = std::vector<Tensor>;
  return {
      {"matmul", [](DType d) { return V{s({3, 4}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return matmul(v[0], v[1]); }},
      {"mm", [](DType d) { return V{s({3, 4}, d), s({4, 5}, d, 1)}; }, [](const V& v) { return mm(v[0], v[1]); }},
      {"addmm", [](DType d) { return V{s({5}, d, 2), s({3, 4}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return addmm(v[0], v[1], v[2]); }},
      {"addmm_gelu", [](DType d) { return V{s({5}, d, 2), s({3, 4}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return addmm_gelu(v[0], v[1], v[2]); }},
      {"bmm", [](DType d) { return V{s({2, 3, 4}, d), s({2, 4, 5}, d, 1)}; },
       [](const V& v) { return bmm(v[0], v[1]); }},
      {"linear", [](DType d) { return V{s({3, 4}, d), s({5, 4}, d, 1), s({5}, d, 2)}; },
       [](const V& v) { return nn::linear(v[0], v[1], v[2]); }},
      {"conv1d", [](DType d) { return V{s({2, 3, 8}, d), s({4, 3, 3}, d, 1), s({4}, d, 2)}; },
       [](const V& v) { return conv1d(v[0], v[1], v[2], 1, 1); }},
      {"conv2d", [](DType d) { return V{s({2, 3, 6, 6}, d), s({4, 3, 3, 3}, d, 1), s({4}, d, 2)}; },
       [](const V& v) { return conv2d(v[0], v[1], v[2], {1, 1}, {1, 1}); }},
      {"conv3d", [](DType d) { return V{s({2, 3, 4, 5, 5}, d), s({4, 3, 3, 3, 3}, d, 1), s({4}, d, 2)}; },
       [](const V& v) { return conv3d(v[0], v[1], v[2], {1, 1, 1}, {1, 1, 1}); }},
      {"conv_transpose2d", [](DType d) { return V{s({2, 3, 4, 4}, d), s({3, 4, 3, 3}, d, 1), s({4}, d, 2)}; },
       [](const V& v) { return conv_transpose2d(v[0], v[1], v[2], {2, 2}, {1, 1}, {1, 1}); }},
      {"exp", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return exp(v[0]); }},
      {"expm1", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return expm1(v[0]); }},
      {"log", [](DType d) { return V{positive({4, 5}, d)}; }, [](const V& v) { return log(v[0]); }},
      {"log1p", [](DType d) { return V{positive({4, 5}, d)}; }, [](const V& v) { return log1p(v[0]); }},
      {"reciprocal", [](DType d) { return V{positive({4, 5}, d)}; }, [](const V& v) { return reciprocal(v[0]); }},
      {"rsqrt", [](DType d) { return V{positive({4, 5}, d)}; }, [](const V& v) { return rsqrt(v[0]); }},
      {"pow", [](DType d) { return V{positive({4, 5}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return pow(v[0], v[1]) + pow(v[0], 1.5); }},
      {"softplus", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return softplus(v[0]); }},
      {"tan", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return tan(v[0]); }},
      {"asin", [](DType d) { return V{s({4, 5}, d) / 3}; }, [](const V& v) { return asin(v[0]); }},
      {"acos", [](DType d) { return V{s({4, 5}, d) / 3}; }, [](const V& v) { return acos(v[0]); }},
      {"sinh", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return sinh(v[0]); }},
      {"cosh", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return cosh(v[0]); }},
      {"log2", [](DType d) { return V{positive({4, 5}, d)}; }, [](const V& v) { return log2(v[0]); }},
      {"log10", [](DType d) { return V{positive({4, 5}, d)}; }, [](const V& v) { return log10(v[0]); }},
      {"erfinv", [](DType d) { return V{s({4, 5}, d) / 3}; }, [](const V& v) { return erfinv(v[0]); }},
      {"sum", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return sum(v[0], {1}); }},
      {"cumsum", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return cumsum(v[0], 1); }},
      {"cumprod", [](DType d) { return V{positive({4, 5}, d)}; }, [](const V& v) { return cumprod(v[0], 1); }},
      {"prod", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return prod(v[0], 1); }},
      {"norm", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return norm(v[0], 2, {1}); }},
      {"logsumexp", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return logsumexp(v[0], {1}); }},
      {"softmax", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return softmax(v[0], 1); }},
      {"log_softmax", [](DType d) { return V{s({4, 5}, d)}; }, [](const V& v) { return log_softmax(v[0], 1); }},
      {"layer_norm", [](DType d) { return V{s({4, 6}, d), s({6}, d, 1), s({6}, d, 2)}; },
       [](const V& v) { return layer_norm(v[0], {6}, v[1], v[2]); }},
      {"group_norm", [](DType d) { return V{s({2, 4, 3}, d), s({4}, d, 1), s({4}, d, 2)}; },
       [](const V& v) { return group_norm(v[0], 2, v[1], v[2]); }},
      {"nll_loss", [](DType d) { return V{s({6, 4}, d), labels({6}, 4), positive({4}, d, 1)}; },
       [](const V& v) { return nn::nll_loss(v[0], v[1], {.weight = v[2]}); }},
      {"cross_entropy", [](DType d) { return V{s({6, 4}, d), labels({6}, 4)}; },
       [](const V& v) { return nn::cross_entropy(v[0], v[1], {.label_smoothing = 0.1}); }},
      {"mse_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return nn::mse_loss(v[0], v[1]); }},
      {"l1_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return nn::l1_loss(v[0], v[1]); }},
      {"smooth_l1_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return nn::smooth_l1_loss(v[0], v[1]); }},
      {"binary_cross_entropy_with_logits", [](DType d) { return V{s({4, 5}, d), positive({4, 5}, d, 1) / 3}; },
       [](const V& v) { return nn::binary_cross_entropy_with_logits(v[0], v[1]); }},
      {"huber_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return nn::huber_loss(v[0], v[1], {.delta = 0.5}); }},
      {"kl_div", [](DType d) { return V{s({4, 5}, d), positive({4, 5}, d, 1) / 5}; },
       [](const V& v) { return nn::kl_div(v[0], v[1], {.reduction = "batchmean"}); }},
      {"cosine_similarity", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1)}; },
       [](const V& v) { return nn::cosine_similarity(v[0], v[1]); }},
      {"soft_margin_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1).sign()}; },
       [](const V& v) { return nn::soft_margin_loss(v[0], v[1]); }},
      {"margin_ranking_loss", [](DType d) { return V{s({6}, d), s({6}, d, 1), s({6}, d, 2).sign()}; },
       [](const V& v) { return nn::margin_ranking_loss(v[0], v[1], v[2], {.margin = 0.1}); }},
      {"hinge_embedding_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1).sign()}; },
       [](const V& v) { return nn::hinge_embedding_loss(v[0], v[1]); }},
      {"cosine_embedding_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1), s({4}, d, 2).sign()}; },
       [](const V& v) { return nn::cosine_embedding_loss(v[0], v[1], v[2]); }},
      {"multilabel_margin_loss",
       [](DType d) { return V{s({3, 4}, d), from_vector<int64_t>({3, 0, -1, 1, 1, -1, 0, 0, 0, 1, 2, 3}, {3, 4})}; },
       [](const V& v) { return nn::multilabel_margin_loss(v[0], v[1]); }},
      {"multi_margin_loss", [](DType d) { return V{s({6, 4}, d), labels({6}, 4), positive({4}, d, 1)}; },
       [](const V& v) { return nn::multi_margin_loss(v[0], v[1], {.weight = v[2]}); }},
      {"triplet_margin_loss", [](DType d) { return V{s({4, 5}, d), s({4, 5}, d, 1), s({4, 5}, d, 2)}; },
       [](const V& v) { return nn::triplet_margin_loss(v[0], v[1], v[2]); }},
      {"poisson_nll_loss", [](DType d) { return V{s({4, 5}, d), positive({4, 5}, d, 1)}; },
       [](const V& v) { return nn::poisson_nll_loss(v[0], v[1]); }},
      {"ctc_loss", [](DType d) { return V{s({6, 2, 4}, d).log_softmax(2), from_vector<int64_t>({1, 2, 3, 1}, {2, 2})}; },
       [](const V& v) {
         return nn::ctc_loss(v[0], v[1], from_vector<int64_t>({6, 5}), from_vector<int64_t>({2, 2}));
       }},
      {"binary_cross_entropy", [](DType d) { return V{(s({4, 5}, kFloat32).sigmoid()).to(d), positive({4, 5}, d, 1) / 3}; },
       [](const V& v) { return nn::binary_cross_entropy(v[0], v[1]); }},
      {"scaled_dot_product_attention", [](DType d) { return V{s({2, 5, 4}, d), s({2, 6, 4}, d, 1), s({2, 6, 3}, d, 2)}; },
       [](const V& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, 0.0, true); }},
      // The promote rows: one input in d, the other float16, so the widest is d (float32) or
      // promote_types(bfloat16, float16) = float32.
      {"cat", [](DType d) { return V{s({2, 3}, d), s({2, 3}, kFloat16, 1)}; }, [](const V& v) { return cat(v, 1); }},
      {"stack", [](DType d) { return V{s({2, 3}, d), s({2, 3}, kFloat16, 1)}; }, [](const V& v) { return stack(v); }},
      // scatter_add promotes on CUDA only; on the CPU it needs one dtype, as outside autocast.
      {"scatter_add", [](DType d) { return V{s({3, 4}, d), labels({2, 4}, 3), s({2, 4}, d, 1)}; },
       [](const V& v) { return scatter_add(v[0], 0, v[1], v[2]); }},
      // atan2 promotes on CUDA only; on the CPU it promotes by itself, as outside autocast.
      {"atan2", [](DType d) { return V{s({2, 3}, d), s({2, 3}, d, 1)}; }, [](const V& v) { return atan2(v[0], v[1]); }},
  };
}

// The inputs as the policy casts them (eligible: floating, not float64), built by hand.
std::vector<Tensor> cast_by_hand(const std::vector<Tensor>& inputs, Policy p, DType lower) {
  DType to = kFloat32;
  if (p == Policy::LowerPrecision) to = lower;
  if (p == Policy::Promote) {
    bool first = true;
    for (const Tensor& t : inputs) {
      if (!t.is_floating_point()) continue;
      to = first ? t.dtype() : promote_types(to, t.dtype());
      first = false;
    }
  }
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(p != Policy::None && t.is_floating_point() ? t.to(to) : t);
  return out;
}

}  // namespace

TEST_CASE("autocast policy table: every row's op, inside a bfloat16 CPU scope and outside", "[ops][autocast]") {
  std::set<std::string> tested;
  for (const Case& c : cases()) {
    tested.insert(c.name);
    const Policy p = autocast::policy(c.name, DeviceType::CPU);
    for (DType d : {kFloat32, kBFloat16}) {
      INFO(c.name << " (" << autocast::policy_name(p) << ") on " << dtype_name(d) << " inputs");
      const std::vector<Tensor> inputs = c.make(d);
      const Tensor outside = c.run(inputs);
      Tensor inside;
      {
        AutocastGuard ac(Device::cpu(), kBFloat16);
        inside = c.run(inputs);
      }
      CHECK(c.run(inputs).dtype() == outside.dtype());  // after the scope, as before it
      switch (p) {
        case Policy::LowerPrecision: CHECK(inside.dtype() == kBFloat16); break;
        case Policy::Float32: CHECK(inside.dtype() == kFloat32); break;
        case Policy::Promote: CHECK(inside.dtype() == kFloat32); break;
        case Policy::None: CHECK(inside.dtype() == outside.dtype()); break;
        case Policy::Banned: FAIL("no op is banned on the CPU"); break;
      }
      // The same values as the op run outside on the inputs cast by hand: autocast only casts.
      test::check_equal(inside, c.run(cast_by_hand(inputs, p, kBFloat16)));
    }
  }
  // Every row of the table has a case here.
  for (std::string_view name : autocast::op_names()) {
    INFO("table row " << name);
    CHECK(tested.count(std::string(name)) == 1);
  }
}

TEST_CASE("autocast policy table: the rows that follow PyTorch's CPU and CUDA lists", "[ops][autocast]") {
  struct Row {
    const char* op;
    Policy cpu, cuda;
  };
  const Policy L = Policy::LowerPrecision, F = Policy::Float32, P = Policy::Promote, N = Policy::None;
  for (const Row& r : std::vector<Row>{{"matmul", L, L},
                                       {"linear", L, L},
                                       {"conv2d", L, L},
                                       {"conv3d", L, L},
                                       {"conv_transpose2d", L, L},
                                       {"scaled_dot_product_attention", L, L},
                                       {"softmax", N, F},
                                       {"layer_norm", N, F},
                                       {"exp", N, F},
                                       {"tan", N, F},
                                       {"erfinv", N, F},
                                       {"log10", N, F},
                                       {"atan2", N, P},
                                       {"sum", N, F},
                                       {"cumsum", N, F},
                                       {"cumprod", N, F},
                                       {"prod", F, F},
                                       {"cross_entropy", F, F},
                                       {"mse_loss", F, F},
                                       {"huber_loss", F, F},
                                       {"kl_div", F, F},
                                       {"triplet_margin_loss", F, F},
                                       {"cosine_similarity", N, F},
                                       {"ctc_loss", F, N},
                                       {"binary_cross_entropy", F, Policy::Banned},
                                       {"cat", P, N},
                                       {"scatter_add", N, P},
                                       {"relu", N, N},
                                       {"batch_norm", N, N},
                                       {"rms_norm", N, N},
                                       {"mean", N, N}}) {
    INFO(r.op);
    CHECK(autocast::policy(r.op, DeviceType::CPU) == r.cpu);
    CHECK(autocast::policy(r.op, DeviceType::CUDA) == r.cuda);
  }
}

TEST_CASE("autocast: off by default, nested guards restore, enabled = false turns it off inside", "[ops][autocast]") {
  Tensor a = test::sample({3, 4}), b = test::sample({4, 2}, kFloat32, 1);
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
  CHECK(autocast::dtype(DeviceType::CPU) == kBFloat16);
  CHECK(autocast::dtype(DeviceType::CUDA) == kFloat16);
  CHECK(matmul(a, b).dtype() == kFloat32);
  {
    AutocastGuard outer(Device::cpu(), kBFloat16);
    CHECK(autocast::is_enabled(DeviceType::CPU));
    CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));
    CHECK(matmul(a, b).dtype() == kBFloat16);
    {
      AutocastGuard off(Device::cpu(), std::nullopt, /*enabled=*/false);
      CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
      CHECK(matmul(a, b).dtype() == kFloat32);
      {
        AutocastGuard half(Device::cpu(), kFloat16);
        CHECK(autocast::dtype(DeviceType::CPU) == kFloat16);
        CHECK(matmul(a, b).dtype() == kFloat16);
        test::check_equal(matmul(a, b), matmul(a.to(kFloat16), b.to(kFloat16)));
      }
      CHECK(matmul(a, b).dtype() == kFloat32);
    }
    CHECK(autocast::dtype(DeviceType::CPU) == kBFloat16);
    CHECK(matmul(a, b).dtype() == kBFloat16);
    // A CUDA scope does not touch CPU tensors (they are not eligible), and leaves the CPU state.
    {
      AutocastGuard cuda(DeviceType::CUDA, kBFloat16, true);
      CHECK(autocast::is_enabled(DeviceType::CUDA));
      CHECK(autocast::dtype(DeviceType::CUDA) == kBFloat16);
      CHECK(matmul(a, b).dtype() == kBFloat16);  // still the CPU scope's doing
    }
    CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));
    CHECK(autocast::dtype(DeviceType::CUDA) == kFloat16);
  }
  {
    AutocastGuard cuda_only(DeviceType::CUDA);
    CHECK(matmul(a, b).dtype() == kFloat32);
    CHECK(softmax(a.to(kBFloat16), 1).dtype() == kBFloat16);
  }
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
  CHECK(matmul(a, b).dtype() == kFloat32);
}

TEST_CASE("autocast: float64 and integer inputs are not cast, undefined optional inputs pass", "[ops][autocast]") {
  AutocastGuard ac(Device::cpu());
  Tensor a = test::sample({3, 4}, kFloat64), b = test::sample({4, 2}, kFloat64, 1);
  CHECK(matmul(a, b).dtype() == kFloat64);
  CHECK(matmul(arange(6).view({2, 3}), arange(3).view({3, 1})).dtype() == kInt64);
  CHECK(nn::linear(test::sample({2, 4}), test::sample({3, 4}, kFloat32, 1)).dtype() == kBFloat16);  // no bias
  CHECK(nn::cross_entropy(test::sample({3, 4}, kBFloat16), labels({3}, 4)).dtype() == kFloat32);
}

TEST_CASE("autocast: bad arguments are Errors", "[ops][autocast]") {
  test::check_error([] { AutocastGuard ac(Device::cpu(), kFloat32); },
                    {"AutocastGuard(cpu)", "kBFloat16 or kFloat16", "float32"});
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));  // a failed guard leaves the state alone
  // The banned op (CUDA's binary_cross_entropy) refuses with the alternative, on CUDA tensors only.
  test::check_error([] {
    AutocastGuard on(DeviceType::CUDA, kFloat16);  // OpScope does nothing while autocast is off
    autocast::OpScope ac(autocast::Op::BinaryCrossEntropy, Device::cuda());
  },
                    {"binary_cross_entropy is unsafe to autocast on cuda:0", "binary_cross_entropy_with_logits"});
}

TEST_CASE("autocast cache: a parameter used twice is cast once per scope", "[ops][autocast]") {
  Tensor w = test::sample({4, 4}).requires_grad_();
  Tensor v = test::sample({4, 4}, kFloat32, 1).requires_grad_();
  Tensor x = test::sample({2, 4}, kFloat32, 2);
  Tensor y1, y2, y3;
  {
    AutocastGuard ac(Device::cpu());
    y1 = nn::linear(x, w);
    y2 = matmul(y1, w);  // w again, through another op
    CHECK(autocast::cache_size() == 1);
    {
      AutocastGuard inner(Device::cpu());  // nesting shares the outer scope's cache
      y3 = nn::linear(y2, v);
    }
    CHECK(autocast::cache_size() == 2);
    // The two uses of w read one cast: the same ToCopyBackward node feeds both ops.
    const auto& cast_in_linear = y1.grad_fn()->next_edges[1].fn;
    const auto& cast_in_matmul = y2.grad_fn()->next_edges[1].fn;
    REQUIRE(cast_in_linear != nullptr);
    CHECK(std::string(cast_in_linear->name()) == "ToCopyBackward");
    CHECK(cast_in_linear == cast_in_matmul);
    // Not cached: tensors that are not parameters (x's cast), and casts made under no_grad.
    {
      NoGradGuard no_grad;
      nn::linear(x, test::sample({3, 4}, kFloat32, 3).requires_grad_());
    }
    CHECK(autocast::cache_size() == 2);
  }
  CHECK(autocast::cache_size() == 0);  // dropped at the outermost exit

  // The gradient of the parameter used twice is the sum over both uses (against a float32 run
  // with the same 16-bit rounding of w done by hand).
  (y3.to(kFloat32) * test::sample({2, 4}, kFloat32, 4)).sum().backward();
  CHECK(w.grad().dtype() == kFloat32);
  Tensor w16 = w.detach().to(kBFloat16).requires_grad_();
  Tensor r = matmul(matmul(x.to(kBFloat16), w16.t()), w16);
  r = matmul(r, v.detach().to(kBFloat16).t());
  (r.to(kFloat32) * test::sample({2, 4}, kFloat32, 4)).sum().backward();
  test::check_equal(w.grad(), w16.grad().to(kFloat32));
}

TEST_CASE("autocast cache: an in-place update of the parameter, or a backward, drops its cast", "[ops][autocast]") {
  Tensor w = test::sample({3, 3}).requires_grad_();
  Tensor x = test::sample({2, 3}, kFloat32, 1);
  AutocastGuard ac(Device::cpu());
  Tensor y1 = matmul(x, w);
  {
    NoGradGuard no_grad;
    w.mul_(2.0);  // an optimizer's step does this
  }
  Tensor y2 = matmul(x, w);
  CHECK(y1.grad_fn()->next_edges[1].fn != y2.grad_fn()->next_edges[1].fn);
  test::check_equal(y2, matmul(x.to(kBFloat16), w.detach().to(kBFloat16)));
  // Forward and backward twice in one scope (a training loop inside autocast): the engine drops the
  // cache at the start of each backward, so the second forward casts again.
  Tensor g1, g2;
  for (Tensor* g : {&g1, &g2}) {
    w.set_grad(Tensor());
    matmul(x, w).to(kFloat32).sum().backward();
    *g = w.grad();
  }
  test::check_equal(g1, g2);
  CHECK(autocast::cache_size() == 0);  // the last backward dropped it

  // set_data gives the parameter other memory without moving its version (ZeRO stage 3 swaps its
  // parameters so): the stale cast gave [[2, 2]] and then the old shape. PyTorch keeps it stale.
  Tensor p = ones({2, 2}).requires_grad_();
  Tensor ones_row = ones({1, 2});
  test::check_equal(matmul(ones_row, p).to(kFloat32), full({1, 2}, 2.0));
  p.set_data(full({2, 2}, 3.0));
  test::check_equal(matmul(ones_row, p).to(kFloat32), full({1, 2}, 6.0));
  p.set_data(ones({2, 3}));
  CHECK(matmul(ones_row, p).sizes() == Shape{1, 3});
}

TEST_CASE("autocast cache: two graphs built in one scope both run backward through the shared cast", "[ops][autocast]") {
  // The first backward freed the shared cast node, and the second failed with "backward through the
  // graph a second time ... retain_graph", which was not what happened. PyTorch runs both.
  nn::Linear lin(4, 4);
  Tensor x = ones({2, 4});
  Tensor l1, l2;
  {
    AutocastGuard ac(Device::cpu(), kBFloat16);
    l1 = lin(x).to(kFloat32).sum();
    l2 = lin(x * 2).to(kFloat32).sum();
  }
  l1.backward();
  l2.backward();
  // d(l1 + l2)/dW[i][j] = sum over the batch of x[j] + 2 x[j] = 2 + 4 (exact in bfloat16).
  test::check_equal(lin.weight.grad(), full({4, 4}, 6.0));
  test::check_equal(lin.bias.grad(), full({4}, 4.0));
  // A node that saved tensors still refuses a second run.
  Tensor w = ones({2}).requires_grad_();
  Tensor y = (w * w).sum();
  y.backward();
  test::check_error([&] { y.backward(); }, {"second time", "retain_graph"});
}

TEST_CASE("autocast: gradients reach float32 parameters in float32, close to a float32 run", "[ops][autocast]") {
  // x (16, 32) -> linear 32->64 -> gelu -> linear 64->8 -> cross_entropy; then a layer_norm branch.
  auto run = [](bool use_autocast) {
    manual_seed(3);
    nn::Linear l1(32, 64), l2(64, 8);
    Tensor x = test::sample({16, 32}, kFloat32, 0.7), y = labels({16}, 8);
    Tensor loss;
    {
      AutocastGuard ac(Device::cpu(), kBFloat16, use_autocast);
      Tensor h = gelu(l1.forward(x));
      Tensor logits = l2.forward(h);
      if (use_autocast) CHECK(logits.dtype() == kBFloat16);
      loss = nn::cross_entropy(logits, y);
      CHECK(loss.dtype() == kFloat32);
    }
    loss.backward();  // outside the scope, as PyTorch recommends
    return std::vector<Tensor>{loss.detach(), l1.weight.grad(), l1.bias.grad(), l2.weight.grad(), l2.bias.grad()};
  };
  std::vector<Tensor> mixed = run(true), full = run(false);
  for (size_t i = 0; i < mixed.size(); ++i) {
    INFO("result " << i << " (0: loss, then the gradients of l1.weight, l1.bias, l2.weight, l2.bias)");
    CHECK(mixed[i].dtype() == kFloat32);
    // bfloat16 keeps 8 significant bits: each rounded input is off by up to 2^-9 relative, and a dot
    // product's error is relative to the size of its terms, not of its sum. So the bound is bf16's
    // rtol, with an atol of the same relative size of the largest element.
    const double scale = full[i].abs().max().item<double>();
    test::check_close(mixed[i], full[i], test::Tolerance{1.6e-2, 1.6e-2 * scale});
  }
}

TEST_CASE("autocast: backward inside the scope runs the backward ops in the forward's dtypes", "[ops][autocast]") {
  Tensor w = test::sample({4, 3}).requires_grad_();
  Tensor x = test::sample({5, 4}, kFloat32, 1);
  Tensor inside_grad, outside_grad;
  {
    AutocastGuard ac(Device::cpu());
    Tensor h = matmul(x, w);
    bool on_during_backward = true;
    h.register_hook([&](const Tensor& g) {
      on_during_backward = autocast::is_enabled(DeviceType::CPU);
      CHECK(g.dtype() == kBFloat16);  // the gradient of a bfloat16 output
      return Tensor();
    });
    Tensor loss = nn::mse_loss(h.softmax(1), test::sample({5, 3}, kFloat32, 2));
    loss.backward();
    CHECK_FALSE(on_during_backward);  // the engine turned autocast off
    inside_grad = w.grad();
    CHECK(autocast::is_enabled(DeviceType::CPU));  // restored after the backward
  }
  w.set_grad(Tensor());
  Tensor loss;
  {
    AutocastGuard ac(Device::cpu());
    loss = nn::mse_loss(matmul(x, w).softmax(1), test::sample({5, 3}, kFloat32, 2));
  }
  loss.backward();
  outside_grad = w.grad();
  test::check_equal(inside_grad, outside_grad);
}

TEST_CASE("autocast: checkpoint recomputes under the forward's autocast state", "[ops][autocast]") {
  Tensor w = test::sample({6, 6}).requires_grad_();
  Tensor x = test::sample({3, 6}, kFloat32, 1).requires_grad_();
  auto block = [&w](const autograd::TensorList& in) -> autograd::TensorList {
    return {nn::linear(in[0], w).tanh()};
  };
  auto grads = [&](bool checkpointed) {
    w.set_grad(Tensor());
    x.set_grad(Tensor());
    Tensor y;
    {
      AutocastGuard ac(Device::cpu());
      y = checkpointed ? autograd::checkpoint(block, {x})[0] : block({x})[0];
      CHECK(y.dtype() == kBFloat16);
    }
    (y.to(kFloat32) * test::sample({3, 6}, kFloat32, 2)).sum().backward();
    return std::make_pair(w.grad(), x.grad());
  };
  auto [w_plain, x_plain] = grads(false);
  auto [w_ckpt, x_ckpt] = grads(true);
  test::check_equal(w_ckpt, w_plain);
  test::check_equal(x_ckpt, x_plain);
}

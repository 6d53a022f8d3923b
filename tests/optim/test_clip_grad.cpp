// tests/optim/test_clip_grad.cpp: nn::utils::clip_grad_norm_ and clip_grad_value_ against PyTorch.
#include <cmath>
#include <limits>

#include "optim_golden.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;

TEST_CASE(
    "clip_grad_norm_ returns PyTorch's total norm and scales the grads as it does (2, inf, 1, 3)") {
  const auto& clips = OptimGolden::get().clips;
  REQUIRE(clips.size() == 5);
  for (const auto& c : clips) {
    INFO("case " << c.id);
    std::vector<Tensor> params;
    for (const Tensor& g : c.before) {
      Tensor p = zeros(g.sizes()).requires_grad_();
      p.set_grad(g.clone());
      params.push_back(p);
    }
    params.push_back(zeros({7}).requires_grad_());  // no grad: skipped
    Tensor total = nn::utils::clip_grad_norm_(params, c.max_norm, c.norm_type);
    CHECK(total.dim() == 0);
    CHECK(std::abs(total.item<double>() - c.total_norm) <= 2e-6 * c.total_norm);
    for (size_t i = 0; i < c.after.size(); ++i) check_close(params[i].grad(), c.after[i]);
    CHECK(!params.back().grad().defined());
  }
}

TEST_CASE("clip_grad_norm_: non-finite norms, no grads, bad norm_type") {
  Tensor p = zeros({3}).requires_grad_();
  p.set_grad(tensor({1.0, std::numeric_limits<double>::infinity(), 2.0}));
  check_error([&] { nn::utils::clip_grad_norm_({p}, 1.0, 2.0, true); },
              {"clip_grad_norm_", "non-finite", "error_if_nonfinite = false"});
  check_equal(p.grad(), tensor({1.0, std::numeric_limits<double>::infinity(), 2.0}));  // unchanged
  Tensor total = nn::utils::clip_grad_norm_({p}, 1.0);  // as PyTorch: scaled by 1 / inf
  CHECK(std::isinf(total.item<double>()));
  CHECK(p.grad().to_vector<float>()[0] == 0.0f);
  Tensor q = zeros({2}).requires_grad_();
  CHECK(nn::utils::clip_grad_norm_({q}, 1.0).item<double>() == 0.0);
  check_error([&] { nn::utils::clip_grad_norm_({q}, 1.0, std::nan("")); }, {"norm_type", "NaN"});
}

TEST_CASE("clip_grad_norm_ of a negative order, as PyTorch's vector_norm") {
  // torch.nn.utils.clip_grad_norm_([p], 10.0, norm_type=-1) with p.grad = [1, 2, -3]: 0.5454545
  // ((1 + 1/2 + 1/3)^-1); with -inf: 1.0, the smallest |g|
  Tensor p = zeros({3}).requires_grad_();
  p.set_grad(tensor({1.0, 2.0, -3.0}));
  CHECK(nn::utils::clip_grad_norm_({p}, 10.0, -1.0).item<double>() == Approx(0.5454545454).epsilon(1e-6));
  CHECK(nn::utils::clip_grad_norm_({p}, 10.0, -std::numeric_limits<double>::infinity()).item<double>() == 1.0);
  check_equal(p.grad(), tensor({1.0, 2.0, -3.0}));  // both under max_norm: unchanged
}

TEST_CASE("clip_grad_norm_ of order 0 counts the grads that hold a nonzero, as PyTorch does") {
  // PyTorch 1.13: clip_grad_norm_([a, b, c], 1.0, norm_type=0) with these grads returns 2.0 and
  // scales by 1 / (2 + 1e-6); with [a] alone it returns 1.0 (the norm of the one count).
  Tensor a = zeros({3}).requires_grad_(), b = zeros({4}).requires_grad_(), c = zeros({2}).requires_grad_();
  a.set_grad(tensor({1.0, 0.0, 2.0}));
  b.set_grad(tensor({0.0, 0.0, 0.0, 3.0}));
  c.set_grad(zeros({2}));
  Tensor total = nn::utils::clip_grad_norm_({a, b, c}, 1.0, 0.0);
  CHECK(total.item<double>() == 2.0);
  check_close(a.grad(), tensor({0.4999997615814209, 0.0, 0.9999995231628418}));
  check_close(b.grad(), tensor({0.0, 0.0, 0.0, 1.4999992847442627}));
  a.set_grad(tensor({1.0, 0.0, 2.0}));
  CHECK(nn::utils::clip_grad_norm_({a}, 1.0, 0.0).item<double>() == 1.0);
  check_close(a.grad(), tensor({0.9999990463256836, 0.0, 1.9999980926513672}));
}

TEST_CASE("clip_grad_value_ clamps every grad to [-v, v]") {
  Tensor a = zeros({4}).requires_grad_(), b = zeros({2}).requires_grad_(),
         c = zeros({1}).requires_grad_();
  a.set_grad(tensor({-3.0, -0.5, 0.25, 2.0}));
  b.set_grad(tensor({1.5, -1.0}));
  nn::utils::clip_grad_value_({a, b, c}, 1.0);
  check_equal(a.grad(), tensor({-1.0, -0.5, 0.25, 1.0}));
  check_equal(b.grad(), tensor({1.0, -1.0}));
  CHECK(!c.grad().defined());
}

TEST_CASE("clip_grad_norm_ measures 16-bit grads in float32, and clip_grad_value_ refuses NaN") {
  // A float16 total past 65504 was inf, and max_norm / inf scaled every grad to 0 without a word.
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    Tensor p = zeros({2}, dt).requires_grad_();
    p.set_grad(full({2}, 60000.0, dt));
    const double want = std::sqrt(2.0) * p.grad().to(kFloat64)[0].item<double>();  // 84852.8 in float16
    Tensor total = nn::utils::clip_grad_norm_({p}, 1.0);
    CHECK(total.dtype() == kFloat32);
    CHECK(total.item<double>() == Approx(want).epsilon(1e-6));
    check_close(p.grad().to(kFloat32), full({2}, 1 / std::sqrt(2.0)), {1e-2, 1e-2});
  }
  Tensor a = zeros({2}).requires_grad_();
  a.set_grad(tensor({3.0, -3.0}));
  check_error([&] { nn::utils::clip_grad_value_({a}, std::nan("")); }, {"clip_grad_value_: clip_value must be a number"});
  check_equal(a.grad(), tensor({3.0, -3.0}));
}

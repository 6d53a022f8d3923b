// tests/ops/test_fused.cpp: the fused kernels of cpu/fused.cpp behind layer_norm, rms_norm,
// add_layer_norm, bias_gelu and softmax_cross_entropy, and the one-pass backwards of relu, softmax
// and log_softmax. Each is checked
// against its unfused composition (the same op with set_fusion(false), whose pieces the op table checks
// against PyTorch), forward and every gradient with a random cotangent, in float64 to 1e-12 and in
// float32 to 1e-5, at odd sizes; gradcheck and gradgradcheck (the create_graph path) in float64;
// column sums that do not depend on the thread count; and the errors.
#include <cmath>

#include "support.h"

using namespace kiln;
using test::FusionGuard;
using test::ThreadsGuard;
using autograd::TensorList;

namespace {

test::Tolerance tol_for(DType dt) { return dt == kFloat64 ? test::Tolerance{1e-12, 1e-12} : test::Tolerance{1e-5, 1e-5}; }

// Runs fn on fresh leaves (copies of `inputs`, requiring grad where `grad` says) with fusion on and
// off, and checks the outputs and the gradients of <outputs, cotangents> for every leaf.
using Fn = std::function<TensorList(const TensorList&)>;
void check_fused_equals_composed(const Fn& fn, const TensorList& inputs, const std::vector<bool>& grad,
                                 uint64_t seed) {
  auto run = [&](bool fused) {
    FusionGuard guard(fused);
    TensorList leaves;
    std::vector<Tensor> wrt;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor t = inputs[i].defined() ? inputs[i].clone() : Tensor();
      if (t.defined() && grad[i]) {
        t.requires_grad_();
        wrt.push_back(t);
      }
      leaves.push_back(t);
    }
    TensorList out = fn(leaves);
    Generator gen(seed);
    std::vector<Tensor> outs, cots;
    for (auto& o : out) {
      outs.push_back(o);
      cots.push_back(randn(o.sizes(), o.dtype(), &gen));
    }
    TensorList grads = autograd::grad(outs, wrt, cots);
    return std::make_pair(out, grads);
  };
  auto [fused_out, fused_grads] = run(true);
  auto [plain_out, plain_grads] = run(false);
  const test::Tolerance tol = tol_for(inputs[0].dtype());
  for (size_t i = 0; i < fused_out.size(); ++i) {
    INFO("output " << i);
    test::check_close(fused_out[i], plain_out[i], tol);
  }
  REQUIRE(fused_grads.size() == plain_grads.size());
  for (size_t i = 0; i < fused_grads.size(); ++i) {
    INFO("gradient " << i);
    test::check_close(fused_grads[i], plain_grads[i], tol);
  }
}

}  // namespace

TEST_CASE("layer_norm and rms_norm: the fused kernel equals the composition, forward and backward",
          "[ops][fused]") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (auto [rows, m] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 5}, {33, 1023}, {70, 128}}) {
      for (int affine = 0; affine < 3; ++affine) {  // weight and bias, weight only, neither
        INFO(dtype_name(dt) << ", rows " << rows << ", M " << m << ", affine " << affine);
        Generator gen(static_cast<uint64_t>(rows * 31 + m));
        Tensor x = randn({rows, m}, dt, &gen) * 3 + 5;  // |mean| > std, as the statistics must handle
        Tensor w = affine < 2 ? randn({m}, dt, &gen) : Tensor();
        Tensor b = affine < 1 ? randn({m}, dt, &gen) : Tensor();
        check_fused_equals_composed(
            [m](const TensorList& t) -> TensorList { return {layer_norm(t[0], {m}, t[1], t[2], 1e-5)}; }, {x, w, b},
            {true, true, true}, 7);
        check_fused_equals_composed([m](const TensorList& t) -> TensorList { return {rms_norm(t[0], {m}, t[1])}; },
                                    {x, w}, {true, true}, 8);
      }
    }
  }
  // A 3-D input normalised over its last two dims, with a transposed (non-contiguous) input.
  Generator gen(3);
  Tensor x = randn({5, 4, 6}, kFloat64, &gen).transpose(1, 2);
  Tensor w = randn({6, 4}, kFloat64, &gen), b = randn({6, 4}, kFloat64, &gen);
  check_fused_equals_composed(
      [](const TensorList& t) -> TensorList { return {layer_norm(t[0], {6, 4}, t[1], t[2], 1e-5)}; }, {x, w, b},
      {true, true, true}, 9);
}

TEST_CASE("add_layer_norm: the residual add and the norm equal their composition", "[ops][fused]") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (int64_t m : {1, 7, 128, 1023}) {
      INFO(dtype_name(dt) << ", M " << m);
      Generator gen(static_cast<uint64_t>(m));
      Tensor x = randn({3, 11, m}, dt, &gen), r = randn({3, 11, m}, dt, &gen);
      Tensor w = randn({m}, dt, &gen), b = randn({m}, dt, &gen);
      auto both = [m](const TensorList& t) -> TensorList {
        auto [h, y] = add_layer_norm(t[0], t[1], {m}, t[2], t[3]);
        return {h, y};
      };
      check_fused_equals_composed(both, {x, r, w, b}, {true, true, true, true}, 11);
      // Only the normalised output used (the sum's gradient never arrives), then only the sum.
      check_fused_equals_composed(
          [m](const TensorList& t) -> TensorList { return {std::get<1>(add_layer_norm(t[0], t[1], {m}, t[2], t[3]))}; },
          {x, r, w, b}, {true, true, true, true}, 12);
      check_fused_equals_composed(
          [m](const TensorList& t) -> TensorList {
            return {std::get<0>(add_layer_norm(t[0], t[1], {m}, t[2], t[3])) * 2};
          },
          {x, r, w, b}, {true, false, false, false}, 13);
    }
  }
  // The sum is x + residual exactly, and the norm is layer_norm of it.
  Tensor x = test::sample({4, 9}, kFloat32, 0.1), r = test::sample({4, 9}, kFloat32, 0.7);
  auto [h, y] = add_layer_norm(x, r, {9});
  test::check_equal(h, x + r);
  test::check_close(y, layer_norm(x + r, {9}), {1e-6, 1e-6});
}

TEST_CASE("layer_norm and rms_norm against long double at every tail of the row sums' 16 lanes",
          "[ops][fused]") {
  // The row statistics and the backward's row sums run in 16 lanes plus a tail (Note [lane sums] in
  // cpu/row_sums.h); fused and composed share them, so the reference here is long double: mean, var,
  // xhat and the gradients of <y, g> from the same rounded inputs, fusion on and off.
  for (bool fused : {true, false}) {
    FusionGuard guard(fused);
    for (DType dt : {kFloat64, kFloat32}) {
      for (int64_t m : {1, 7, 15, 16, 17, 31, 32, 33, 100, 769}) {
        for (bool rms : {false, true}) {
          INFO((fused ? "fused" : "composed") << ", " << dtype_name(dt) << ", M " << m << (rms ? ", rms" : ""));
          const int64_t rows = 3;
          Generator gen(static_cast<uint64_t>(m * 7 + rms));
          // |mean| = 10 std: the two passes must not lose the variance to it.
          const Tensor x = (randn({rows, m}, kFloat64, &gen) + 10).to(dt), w = randn({m}, kFloat64, &gen).to(dt),
                       b = randn({m}, kFloat64, &gen).to(dt), g = randn({rows, m}, kFloat64, &gen).to(dt);
          const double eps = 1e-5;
          Tensor xl = x.clone().requires_grad_(), wl = w.clone().requires_grad_(), bl = b.clone().requires_grad_();
          const Tensor y = rms ? rms_norm(xl, {m}, wl, eps) : layer_norm(xl, {m}, wl, bl, eps);
          y.backward(g);
          const std::vector<double> xv = x.to(kFloat64).to_vector<double>(), wv = w.to(kFloat64).to_vector<double>(),
                                    bv = b.to(kFloat64).to_vector<double>(), gv = g.to(kFloat64).to_vector<double>();
          std::vector<double> want_y(xv.size()), want_gx(xv.size()), want_gw(static_cast<size_t>(m), 0),
              want_gb(static_cast<size_t>(m), 0);
          for (int64_t r = 0; r < rows; ++r) {
            const size_t o = static_cast<size_t>(r * m);
            long double mean = 0, var = 0;
            for (int64_t i = 0; i < m; ++i) mean += xv[o + i];
            mean = rms ? 0 : mean / m;
            for (int64_t i = 0; i < m; ++i) var += (xv[o + i] - mean) * (xv[o + i] - mean);
            const long double rstd = 1 / std::sqrt(var / m + eps);
            long double sum_gx = 0, sum_gx_xhat = 0;
            for (int64_t i = 0; i < m; ++i) {
              const long double xhat = (xv[o + i] - mean) * rstd, gx = gv[o + i] * wv[i];
              want_y[o + i] = static_cast<double>(xhat * wv[i] + (rms ? 0 : bv[i]));
              sum_gx += gx;
              sum_gx_xhat += gx * xhat;
              want_gw[i] += static_cast<double>(gv[o + i] * xhat);
              want_gb[i] += gv[o + i];
            }
            for (int64_t i = 0; i < m; ++i) {
              const long double xhat = (xv[o + i] - mean) * rstd, gx = gv[o + i] * wv[i];
              want_gx[o + i] = static_cast<double>(rstd * (gx - (rms ? 0 : sum_gx / m) - xhat * sum_gx_xhat / m));
            }
          }
          // float32: the kernels round x - mean and each product to float32, about ulp(10) = 1e-6.
          const test::Tolerance tol = dt == kFloat64 ? test::Tolerance{1e-11, 1e-11} : test::Tolerance{2e-5, 2e-5};
          test::check_close(y.to(kFloat64), from_vector(want_y, {rows, m}), tol);
          test::check_close(xl.grad().to(kFloat64), from_vector(want_gx, {rows, m}), tol);
          test::check_close(wl.grad().to(kFloat64), from_vector(want_gw, {m}), tol);
          if (!rms) test::check_close(bl.grad().to(kFloat64), from_vector(want_gb, {m}), tol);
        }
      }
    }
  }
}

TEST_CASE("bias_gelu: gelu(x + bias) fused equals the composition, both forms", "[ops][fused]") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (const char* approx : {"none", "tanh"}) {
      for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 13}, {65, 1023}}) {
        INFO(dtype_name(dt) << ", " << approx << ", rows " << rows << ", N " << n);
        Generator gen(static_cast<uint64_t>(rows + n));
        Tensor x = randn({rows, n}, dt, &gen) * 3;  // both sides of -1, where the erf form switches
        Tensor b = randn({n}, dt, &gen);
        check_fused_equals_composed(
            [approx](const TensorList& t) -> TensorList { return {bias_gelu(t[0], t[1], approx)}; }, {x, b},
            {true, true}, 21);
      }
    }
  }
  // A 3-D input: the bias runs along the last dim; equal to gelu(x + b) with fusion on too.
  Tensor x = test::sample({2, 3, 5}, kFloat64, 0.3), b = test::sample({5}, kFloat64, 1.1);
  test::check_close(bias_gelu(x, b), gelu(x + b), {1e-15, 1e-15});
}

TEST_CASE("softmax_cross_entropy: the fused rows equal the composition", "[ops][fused]") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (double eps : {0.0, 0.1}) {
      for (auto [rows, c] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {9, 7}, {64, 256}, {5, 4097}}) {
        INFO(dtype_name(dt) << ", eps " << eps << ", rows " << rows << ", C " << c);
        Generator gen(static_cast<uint64_t>(rows * 7 + c));
        Tensor logits = randn({rows, c}, dt, &gen) * 4;
        Tensor target = randint(0, c, {rows}, kInt64, &gen);
        if (rows > 2) target[1].fill_(-100);  // an ignored row: loss 0, no gradient
        check_fused_equals_composed(
            [target, eps](const TensorList& t) -> TensorList { return {softmax_cross_entropy(t[0], target, -100, eps)}; },
            {logits}, {true}, 31);
      }
    }
  }
}

TEST_CASE("softmax_cross_entropy: values against log_softmax, ignore_index, large logits", "[ops][fused]") {
  // loss = -(1 - eps) logp[t] - eps / C sum logp, from log_softmax (the op table's) in float64.
  Tensor logits = test::sample({6, 5}, kFloat64, 0.2) * 10;
  Tensor target = from_vector<int64_t>({4, 0, 7, 2, 1, 3}, {6});
  const double eps = 0.2;
  Tensor loss = softmax_cross_entropy(logits, target, 7, eps);
  Tensor logp = log_softmax(logits, 1);
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t t = target[r].item<int64_t>();
    const double want = t == 7 ? 0.0 : -(1 - eps) * logp[r][t].item<double>() - eps / 5 * logp[r].sum().item<double>();
    CHECK(loss[r].item<double>() == Approx(want).epsilon(1e-14).margin(1e-14));
  }
  // float32 logits of 1e4 do not overflow: the row's max is taken out first.
  Tensor big = from_vector<float>({1e4f, -1e4f, 0.0f, 1e4f - 1.0f}, {1, 4});
  Tensor l = softmax_cross_entropy(big, from_vector<int64_t>({3}, {1}));
  CHECK(l.item<float>() == Approx(1.0 + std::log1p(std::exp(-1.0))).epsilon(1e-6));
  // int32 targets are taken as well.
  test::check_equal(softmax_cross_entropy(logits, target.to(kInt32), 7, eps), loss);
}

TEST_CASE("softmax_cross_entropy of float16 and bfloat16 logits: float32's on the same values, a float32 loss",
          "[ops][fused]") {
  // The 16-bit rows are read into float32 (exactly), so the loss is the float32 op's on x.to(float32)
  // to the bit, and the gradient is float32's rounded once to the logits' dtype; with fusion off the
  // composition runs in float32 too.
  for (DType dt : {kFloat16, kBFloat16}) {
    for (bool fused : {true, false}) {
      for (auto [rows, c] : std::vector<std::pair<int64_t, int64_t>>{{9, 7}, {5, 4097}}) {
        INFO(dtype_name(dt) << ", fused " << fused << ", rows " << rows << ", C " << c);
        FusionGuard guard(fused);
        Generator gen(static_cast<uint64_t>(rows + c));
        Tensor x = (randn({rows, c}, kFloat32, &gen) * 4).to(dt).requires_grad_();
        Tensor target = randint(0, c, {rows}, kInt64, &gen);
        target[1].fill_(-100);
        Tensor x32 = x.detach().to(kFloat32).requires_grad_();
        const Tensor loss = softmax_cross_entropy(x, target, -100, 0.1);
        const Tensor loss32 = softmax_cross_entropy(x32, target, -100, 0.1);
        CHECK(loss.dtype() == kFloat32);
        test::check_equal(loss, loss32);
        const Tensor cot = randn({rows}, kFloat32, &gen);
        const Tensor g = autograd::grad({loss}, {x}, {cot})[0];
        const Tensor g32 = autograd::grad({loss32}, {x32}, {cot})[0];
        CHECK(g.dtype() == dt);
        test::check_equal(g, g32.to(dt));
      }
    }
  }
}

TEST_CASE("nn::functional::cross_entropy of 16-bit logits: the logits' dtype, or float32 under autocast",
          "[ops][fused]") {
  // As PyTorch: bfloat16 logits give a bfloat16 loss (float32's rounded), and under autocast, whose
  // policy for losses is float32, a float32 loss; autocast reads them as they are (no float32 copy)
  // and gives the same value and gradient as the float32 logits.
  Generator gen(8);
  Tensor x = (randn({6, 300}, kFloat32, &gen) * 3).to(kBFloat16).requires_grad_();
  Tensor target = randint(0, 300, {6}, kInt64, &gen);
  Tensor x32 = x.detach().to(kFloat32).requires_grad_();
  const Tensor loss32 = nn::functional::cross_entropy(x32, target);
  const Tensor plain = nn::functional::cross_entropy(x, target);
  CHECK(plain.dtype() == kBFloat16);
  test::check_equal(plain, loss32.to(kBFloat16));
  Tensor autocast_loss;
  {
    AutocastGuard ac(Device::cpu(), kBFloat16);
    autocast_loss = nn::functional::cross_entropy(x, target);
  }
  CHECK(autocast_loss.dtype() == kFloat32);
  test::check_equal(autocast_loss, loss32);
  const Tensor g = autograd::grad({autocast_loss}, {x})[0];
  const Tensor g32 = autograd::grad({loss32}, {x32})[0];
  test::check_equal(g, g32.to(kBFloat16));
}

TEST_CASE("relu's one-pass backward equals g * (y > 0)", "[ops][fused]") {
  Generator gen(9);
  for (DType dt : {kFloat32, kFloat64}) {
    for (Shape shape : {Shape{1}, Shape{7, 5}, Shape{33, 1023}}) {
      INFO(dtype_name(dt) << " " << shape.str());
      Tensor x = randn(shape, dt, &gen);
      check_fused_equals_composed([](const TensorList& t) -> TensorList { return {relu(t[0])}; }, {x}, {true}, 3);
      // Strided: the input transposed, the gradient reaching relu through a transpose as well.
      if (shape.size() == 2) {
        check_fused_equals_composed([](const TensorList& t) -> TensorList { return {relu(t[0].t()).t() * 2}; },
                                    {x}, {true}, 4);
      }
    }
  }
  // Exactly zero where relu is flat (x <= 0), the incoming gradient where it is not; a NaN gradient
  // where relu is flat gives 0, as PyTorch's threshold_backward.
  FusionGuard fused(true);
  Tensor x = tensor({-1.0, 0.0, 2.0, 3.0}).requires_grad_();
  Tensor g = tensor({5.0, 6.0, 7.0, std::nan("")});
  relu(x).backward(g);
  Tensor gx = x.grad();
  CHECK(gx[0].item<double>() == 0);
  CHECK(gx[1].item<double>() == 0);
  CHECK(gx[2].item<double>() == 7);
  CHECK(std::isnan(gx[3].item<double>()));
  Tensor y = tensor({-1.0, 2.0}).requires_grad_();
  relu(y).backward(tensor({std::nan(""), 1.0}));
  CHECK(y.grad()[0].item<double>() == 0);
}

TEST_CASE("softmax and log_softmax: the one-pass backward equals the composition", "[ops][fused]") {
  // Every dim of a 3-D tensor (rows along a contiguous dim and across strided ones), a transposed
  // input, a gradient broadcast along the rows (from a sum), and the 16-bit types, whose rows are
  // taken in float32.
  Generator gen(12);
  for (DType dt : {kFloat32, kFloat64}) {
    for (bool log : {false, true}) {
      auto sm = [log](const Tensor& x, int64_t d) { return log ? log_softmax(x, d) : softmax(x, d); };
      INFO(dtype_name(dt) << (log ? " log_softmax" : " softmax"));
      Tensor x = randn({5, 7, 33}, dt, &gen) * 3;
      for (int64_t d : {0, 1, 2, -1}) {
        INFO("dim " << d);
        check_fused_equals_composed([&](const TensorList& t) -> TensorList { return {sm(t[0], d)}; }, {x}, {true}, 5);
      }
      check_fused_equals_composed([&](const TensorList& t) -> TensorList { return {sm(t[0].transpose(0, 2), 2)}; },
                                  {x}, {true}, 6);
      check_fused_equals_composed(
          [&](const TensorList& t) -> TensorList { return {sm(t[0], 2).sum({2}, true) * 1.5}; }, {x}, {true}, 7);
      Tensor wide = randn({3, 1025}, dt, &gen);
      check_fused_equals_composed([&](const TensorList& t) -> TensorList { return {sm(t[0], 1)}; }, {wide}, {true}, 8);
    }
  }
  // 16 bits: the fused rows compute in float32 and round once, so the gradient is the formula's on
  // the (rounded) output y, rounded to the dtype. (The composition rounds g * y, its sum and the
  // difference to 16 bits on the way, and is further off.)
  FusionGuard fused(true);
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor x = (randn({6, 40}, kFloat32, &gen) * 2).to(dt);
    Tensor g = randn({6, 40}, kFloat32, &gen).to(dt);
    for (bool log : {false, true}) {
      INFO(dtype_name(dt) << (log ? " log_softmax" : " softmax"));
      Tensor leaf = x.clone().requires_grad_();
      Tensor y = log ? log_softmax(leaf, 1) : softmax(leaf, 1);
      Tensor dx = autograd::grad({y}, {leaf}, {g})[0];
      REQUIRE(dx.dtype() == dt);
      Tensor y64 = y.detach().to(kFloat64), g64 = g.to(kFloat64);
      Tensor expected = log ? g64 - y64.exp() * g64.sum({1}, true) : y64 * (g64 - (g64 * y64).sum({1}, true));
      test::check_close(dx.to(kFloat64), expected.to(dt).to(kFloat64), test::tolerance_for(dt));
    }
  }
}

TEST_CASE("nn::functional::cross_entropy through the fused rows equals the unfused path", "[ops][fused]") {
  Generator gen(5);
  Tensor logits = randn({12, 10}, kFloat64, &gen);
  Tensor target = randint(0, 10, {12}, kInt64, &gen);
  target[3].fill_(-100);
  for (const char* reduction : {"mean", "sum", "none"}) {
    for (double eps : {0.0, 0.3}) {
      INFO(reduction << ", eps " << eps);
      nn::CrossEntropyOptions o{.reduction = reduction, .label_smoothing = eps};
      check_fused_equals_composed(
          [&](const TensorList& t) -> TensorList { return {nn::functional::cross_entropy(t[0], target, o)}; },
          {logits}, {true}, 41);
      // The same as the weighted path with all weights 1 (ops' nll, which the nn goldens check).
      o.weight = ones({10}, kFloat64);
      Tensor weighted = nn::functional::cross_entropy(logits, target, o);
      o.weight = {};
      test::check_close(nn::functional::cross_entropy(logits, target, o), weighted, {1e-12, 1e-12});
    }
  }
}

TEST_CASE("fused ops: gradcheck and gradgradcheck in float64", "[ops][fused]") {
  FusionGuard fused(true);
  Generator gen(17);
  Tensor x = randn({4, 6}, kFloat64, &gen).requires_grad_();
  Tensor r = randn({4, 6}, kFloat64, &gen).requires_grad_();
  Tensor w = randn({6}, kFloat64, &gen).requires_grad_();
  Tensor b = randn({6}, kFloat64, &gen).requires_grad_();
  autograd::DifferentiableFn ln = [](const TensorList& t) -> TensorList { return {layer_norm(t[0], {6}, t[1], t[2])}; };
  CHECK(autograd::gradcheck(ln, {x, w, b}));
  CHECK(autograd::gradgradcheck(ln, {x, w, b}));
  autograd::DifferentiableFn rms = [](const TensorList& t) -> TensorList { return {rms_norm(t[0], {6}, t[1])}; };
  CHECK(autograd::gradcheck(rms, {x, w}));
  CHECK(autograd::gradgradcheck(rms, {x, w}));
  autograd::DifferentiableFn add_ln = [](const TensorList& t) -> TensorList {
    auto [h, y] = add_layer_norm(t[0], t[1], {6}, t[2], t[3]);
    return {h, y};
  };
  CHECK(autograd::gradcheck(add_ln, {x, r, w, b}));
  CHECK(autograd::gradgradcheck(add_ln, {x, r, w, b}));
  for (const char* approx : {"none", "tanh"}) {
    autograd::DifferentiableFn bg = [approx](const TensorList& t) -> TensorList { return {bias_gelu(t[0], t[1], approx)}; };
    CHECK(autograd::gradcheck(bg, {x, b}));
    CHECK(autograd::gradgradcheck(bg, {x, b}));
  }
  Tensor target = from_vector<int64_t>({2, -100, 5, 0}, {4});
  autograd::DifferentiableFn ce = [target](const TensorList& t) -> TensorList {
    return {softmax_cross_entropy(t[0], target, -100, 0.1)};
  };
  CHECK(autograd::gradcheck(ce, {x}));
  CHECK(autograd::gradgradcheck(ce, {x}));
}

TEST_CASE("fused ops: the column sums do not depend on the thread count", "[ops][fused]") {
  FusionGuard fused(true);
  Generator gen(23);
  Tensor x = randn({301, 96}, kFloat32, &gen), w = randn({96}, kFloat32, &gen), b = randn({96}, kFloat32, &gen);
  Tensor cot = randn({301, 96}, kFloat32, &gen);
  auto grads = [&](int threads) {
    ThreadsGuard t(threads);
    Tensor xl = x.clone().requires_grad_(), wl = w.clone().requires_grad_(), bl = b.clone().requires_grad_();
    TensorList g = autograd::grad({layer_norm(xl, {96}, wl, bl)}, {xl, wl, bl}, {cot});
    TensorList g2 = autograd::grad({bias_gelu(xl, bl)}, {xl, bl}, {cot});
    g.insert(g.end(), g2.begin(), g2.end());
    return g;
  };
  TensorList one = grads(1), two = grads(2), three = grads(3);
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("gradient " << i);
    test::check_equal(two[i], one[i]);
    test::check_equal(three[i], one[i]);
  }
}

TEST_CASE("fused ops: errors name what is wrong", "[ops][fused]") {
  Tensor x = zeros({3, 4});
  test::check_error([&] { bias_gelu(x, zeros({3})); }, {"bias_gelu", "bias must be 1-D", "[3, 4]", "[3]"});
  test::check_error([&] { bias_gelu(x, zeros({4}), "fast"); }, {"bias_gelu", "approximate", "fast"});
  test::check_error([&] { add_layer_norm(x, zeros({4, 3}), {4}); }, {"add_layer_norm", "one shape"});
  test::check_error([&] { add_layer_norm(x, zeros({3, 4}), {3}); }, {"normalized_shape", "last 1 dims"});
  test::check_error([&] { softmax_cross_entropy(x, from_vector<int64_t>({0, 4, 1}, {3})); },
                    {"cross_entropy", "target 4 at position 1", "[0, 4)"});
  test::check_error([&] { softmax_cross_entropy(x, zeros({3})); }, {"softmax_cross_entropy", "int64", "float32"});
  test::check_error([&] { softmax_cross_entropy(x, from_vector<int64_t>({0, 1}, {2})); },
                    {"softmax_cross_entropy", "shape (3)"});
}

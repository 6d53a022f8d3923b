// tests/nn/test_losses.cpp: each loss with its options against PyTorch (value and input gradients for a
// random cotangent), gradcheck in float64, and the errors on bad input.
#include <cmath>

#include "nn_golden.h"

using namespace kiln;
using autograd::TensorList;

using test::check_loss;

TEST_CASE("Losses match torch for every reduction and option", "[nn][losses]") {
  for (std::string red : {"mean", "sum", "none"}) {
    INFO("reduction " << red);
    check_loss("ce_" + red, [&](auto& in) { return nn::cross_entropy(in[0], in[1], {.reduction = red}); });
    check_loss("ce_weight_ignore_" + red,
               [&](auto& in) { return nn::cross_entropy(in[0], in[1], {.weight = in[2], .reduction = red}); });
    check_loss("ce_smooth_weight_ignore_" + red, [&](auto& in) {
      return nn::cross_entropy(in[0], in[1], {.weight = in[2], .reduction = red, .label_smoothing = 0.2});
    });
    check_loss("ce_probs_" + red, [&](auto& in) {
      return nn::cross_entropy(in[0], in[1], {.weight = in[2], .reduction = red, .label_smoothing = 0.1});
    });
    check_loss("nll_" + red, [&](auto& in) {
      return nn::nll_loss(in[0], in[1], {.weight = in[2], .ignore_index = 1, .reduction = red});
    });
    check_loss("mse_" + red, [&](auto& in) { return nn::mse_loss(in[0], in[1], {.reduction = red}); });
    check_loss("l1_" + red, [&](auto& in) { return nn::l1_loss(in[0], in[1], {.reduction = red}); });
    check_loss("smooth_l1_" + red,
               [&](auto& in) { return nn::smooth_l1_loss(in[0], in[1], {.reduction = red, .beta = 0.7}); });
    check_loss("bce_" + red, [&](auto& in) {
      return nn::binary_cross_entropy(in[0], in[1], {.weight = in[2], .reduction = red});
    });
    check_loss("bce_logits_" + red, [&](auto& in) {
      return nn::functional::binary_cross_entropy_with_logits(
          in[0], in[1], {.weight = in[2], .pos_weight = in[3], .reduction = red});
    });
  }
  for (std::string red : {"mean", "sum", "none"}) {
    check_loss("huber_" + red, [&](auto& in) { return nn::huber_loss(in[0], in[1], {.reduction = red, .delta = 0.8}); });
  }
  for (std::string red : {"batchmean", "sum", "none", "mean"}) {
    check_loss("kl_div_" + red, [&](auto& in) { return nn::kl_div(in[0], in[1], {.reduction = red}); });
  }
  check_loss("kl_div_target_grad", [](auto& in) { return nn::kl_div(in[0], in[1], {.reduction = "batchmean"}); });
  check_loss("kl_div_log_target",
             [](auto& in) { return nn::kl_div(in[0], in[1], {.reduction = "batchmean", .log_target = true}); });
  check_loss("ce_spatial", [](auto& in) { return nn::cross_entropy(in[0], in[1], {.ignore_index = 1}); });
  check_loss("ce_1d", [](auto& in) { return nn::functional::cross_entropy(in[0], in[1]); });
  check_loss("smooth_l1_beta0", [](auto& in) { return nn::smooth_l1_loss(in[0], in[1], {.beta = 0}); });
  check_loss("bce_logits_large", [](auto& in) {
    return nn::binary_cross_entropy_with_logits(in[0], in[1], {.reduction = "none"});
  });
}

TEST_CASE("Losses pass gradcheck in float64", "[nn][losses][gradcheck]") {
  Tensor logits = test::sample({4, 5}, kFloat64, 0.3).requires_grad_();
  Tensor labels = from_vector<int64_t>({1, -100, 4, 0}, {4});
  Tensor w = test::sample({5}, kFloat64, 1.1).abs() + 0.5;
  Tensor probs = softmax(test::sample({4, 5}, kFloat64, 2.0), 1).requires_grad_();
  CHECK(autograd::gradcheck(
      [&](const TensorList& in) {
        return TensorList{nn::cross_entropy(in[0], labels, {.weight = w, .label_smoothing = 0.1})};
      },
      {logits}));
  auto ce = [&](const TensorList& in) { return TensorList{nn::cross_entropy(in[0], labels, {.reduction = "sum"})}; };
  CHECK(autograd::gradcheck(ce, {logits}));
  CHECK(autograd::gradgradcheck(ce, {logits}));
  // The hot path is one node over the rows (ops::softmax_cross_entropy, fused), then the reduction.
  Tensor loss = nn::cross_entropy(logits, from_vector<int64_t>({1, 2, 4, 0}, {4}), {.reduction = "none"});
  CHECK(std::string(loss.grad_fn()->name()) == "CrossEntropyBackward");
  CHECK(autograd::gradcheck(
      [&](const TensorList& in) { return TensorList{nn::cross_entropy(in[0], in[1], {.label_smoothing = 0.2})}; },
      {logits, probs}));
  CHECK(autograd::gradcheck(
      [&](const TensorList& in) {
        return TensorList{nn::nll_loss(log_softmax(in[0], 1), labels, {.weight = w, .reduction = "none"})};
      },
      {logits}));
  Tensor a = test::sample({3, 4}, kFloat64, 0.1).requires_grad_();
  Tensor b = test::sample({3, 4}, kFloat64, 0.9).requires_grad_();
  CHECK(autograd::gradcheck([](const TensorList& in) { return TensorList{nn::mse_loss(in[0], in[1])}; }, {a, b}));
  CHECK(autograd::gradcheck([](const TensorList& in) { return TensorList{nn::l1_loss(in[0], in[1])}; }, {a, b}));
  CHECK(autograd::gradcheck(
      [](const TensorList& in) { return TensorList{nn::smooth_l1_loss(in[0], in[1], {.beta = 0.5})}; }, {a, b}));
  Tensor p = (sigmoid(test::sample({3, 4}, kFloat64, 0.4))).detach().requires_grad_();
  Tensor t = sigmoid(test::sample({3, 4}, kFloat64, 1.7)).requires_grad_();
  CHECK(autograd::gradcheck(
      [](const TensorList& in) { return TensorList{nn::binary_cross_entropy(in[0], in[1], {.reduction = "sum"})}; },
      {p, t}));
  Tensor pw = test::sample({4}, kFloat64, 0.2).abs() + 0.5;
  CHECK(autograd::gradcheck(
      [&](const TensorList& in) {
        return TensorList{nn::binary_cross_entropy_with_logits(in[0], in[1], {.weight = pw, .pos_weight = pw})};
      },
      {a, t}));
}

TEST_CASE("Losses reject bad input with a clear error", "[nn][losses][errors]") {
  Tensor logits = test::sample({4, 5});
  test::check_error([&] { nn::cross_entropy(logits, from_vector<int64_t>({1, 2, 3}, {3})); },
                    {"cross_entropy", "shape [4]", "got [3]"});
  test::check_error([&] { nn::cross_entropy(logits, from_vector<int64_t>({1, 2, 3, 0}, {4}), {.reduction = "avg"}); },
                    {"reduction 'avg'"});
  test::check_error([&] { nn::cross_entropy(logits, from_vector<int64_t>({1, 2, 3, 0}, {4}), {.weight = ones({3})}); },
                    {"weight", "5 elements"});
  test::check_error([&] { nn::cross_entropy(logits, from_vector<int64_t>({1, 2, 3, 0}, {4}), {.label_smoothing = 1.5}); },
                    {"label_smoothing", "[0, 1]"});
  test::check_error([&] { nn::mse_loss(logits, zeros({4, 1})); }, {"mse_loss", "[4, 1]", "[4, 5]"});
  test::check_error([&] { nn::smooth_l1_loss(logits, logits, {.beta = -1}); }, {"beta must be >= 0"});
  test::check_error([&] { nn::huber_loss(logits, logits, {.delta = 0}); }, {"huber_loss", "delta must be > 0"});
  test::check_error([&] { nn::kl_div(logits, logits, {.reduction = "avg"}); }, {"kl_div", "'batchmean'"});
  // As PyTorch: a class weight of another dtype, a per-element weight that would grow the loss, and
  // integer regression inputs (the Error came from an inner mean).
  test::check_error(
      [&] { nn::cross_entropy(logits, from_vector<int64_t>({1, 2, 3, 0}), {.weight = ones({5}, kFloat64)}); },
      {"cross_entropy", "weight (float64 on cpu)", "input's dtype and device (float32 on cpu)"});
  test::check_error([&] { nn::nll_loss(logits, from_vector<int64_t>({1, 2, 3, 0}), {.weight = ones({5}, kFloat64)}); },
                    {"nll_loss", "weight (float64"});
  test::check_error([] { nn::binary_cross_entropy(full({3}, 0.5), zeros({3}), {.weight = ones({2, 3})}); },
                    {"binary_cross_entropy", "weight of shape [2, 3]", "input's shape [3]"});
  test::check_error(
      [] { nn::binary_cross_entropy_with_logits(zeros({3}), zeros({3}), {.weight = ones({2, 3})}); },
      {"binary_cross_entropy_with_logits", "weight of shape [2, 3]"});
  CHECK(nn::binary_cross_entropy(full({2, 3}, 0.5), zeros({2, 3}), {.weight = ones({3})}).item<float>() ==
        Approx(std::log(2.0)));  // a weight that broadcasts is fine
  test::check_error([] { nn::mse_loss(zeros({3}, kInt64), zeros({3}, kInt64)); },
                    {"mse_loss", "floating-point input or target", "int64 and int64"});
  // One floating side is promoted to, as PyTorch does.
  CHECK(nn::l1_loss(full({3}, 0.5), from_vector<int64_t>({1, 0, 2})).item<double>() == Approx(2.5 / 3));
}

TEST_CASE("Losses refuse targets and inputs outside their domain, as PyTorch", "[nn][losses][errors]") {
  Tensor logp = log_softmax(test::sample({2, 3}), 1);
  test::check_error([&] { nn::nll_loss(logp, from_vector<int64_t>({0, 3})); },
                    {"nll_loss", "target 3 at position 1", "[0, 3)", "ignore_index (-100)"});
  // A negative target other than ignore_index would have picked the last class.
  test::check_error([&] { nn::nll_loss(logp, from_vector<int64_t>({-1, 0})); }, {"nll_loss", "target -1 at position 0"});
  CHECK(std::isfinite(nn::nll_loss(logp, from_vector<int64_t>({-100, 2})).item<float>()));  // ignored
  for (bool fused : {true, false}) {
    INFO("fusion " << fused);
    test::FusionGuard fusion(fused);
    test::check_error([&] { nn::cross_entropy(logp, from_vector<int64_t>({-1, 0})); },
                      {"cross_entropy", "target -1 at position 0"});
  }
  test::check_error([] { nn::binary_cross_entropy(tensor({1.5, 0.5}), tensor({1.0, 0.0})); },
                    {"binary_cross_entropy", "between 0 and 1", "binary_cross_entropy_with_logits"});
  test::check_error([] { nn::binary_cross_entropy(tensor({NAN}), tensor({1.0})); }, {"between 0 and 1"});
  CHECK(nn::binary_cross_entropy(tensor({0.0, 1.0}), tensor({0.0, 1.0})).item<float>() == 0.0f);  // the ends are in
  test::check_error([] { nn::binary_cross_entropy_with_logits(zeros({2, 3}), zeros({2, 3}), {.pos_weight = ones({2})}); },
                    {"binary_cross_entropy_with_logits: pos_weight", "[2]", "[2, 3]"});
  test::check_error([] { nn::binary_cross_entropy_with_logits(zeros({2, 3}), zeros({2, 3}), {.pos_weight = ones({4, 1, 3})}); },
                    {"pos_weight of shape [4, 1, 3]", "input's shape [2, 3]"});
}

TEST_CASE("cross_entropy stays finite for huge logits", "[nn][losses]") {
  Tensor logits = tensor({{1000.0, -1000.0, 0.0}, {-5000.0, 5000.0, 1.0}});
  Tensor loss = nn::cross_entropy(logits, from_vector<int64_t>({1, 1}, {2}), {.reduction = "none"});
  test::check_close(loss, tensor({2000.0, 0.0}));
}

TEST_CASE("A batch whose every target is ignored gives a zero gradient, as PyTorch, not nan", "[nn][losses]") {
  // The loss is 0 / 0 = nan in both; PyTorch's gradient is 0, so one all-padding batch cannot poison
  // the weights. Kiln's was nan on the weighted, K-dim and label-smoothing paths.
  Tensor w = from_vector<double>({0.5, 1.0, 2.0});
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> cases = {
      {"nll_loss with weight",
       [&](const Tensor& x) { return nn::nll_loss(log_softmax(x, 1), full({2}, -100, kInt64), {.weight = w}); }},
      {"cross_entropy with weight",
       [&](const Tensor& x) { return nn::cross_entropy(x, full({2}, -100, kInt64), {.weight = w}); }},
      {"cross_entropy (N, C, d)",
       [&](const Tensor& x) { return nn::cross_entropy(x.view({2, 3, 1}), full({2, 1}, -100, kInt64)); }},
      {"cross_entropy with label smoothing and weight",
       [&](const Tensor& x) {
         return nn::cross_entropy(x, full({2}, 7, kInt64), {.weight = w, .ignore_index = 7, .label_smoothing = 0.1});
       }},
  };
  for (const auto& [name, loss_of] : cases) {
    INFO(name);
    Tensor x = from_vector<double>({0.1, 0.2, 0.3, 0.3, 0.2, 0.1}, {2, 3}).requires_grad_();
    Tensor loss = loss_of(x);
    CHECK(std::isnan(loss.item<double>()));
    loss.backward();
    test::check_equal(x.grad(), zeros({2, 3}, kFloat64));
  }
}

TEST_CASE("An ignored element gets no gradient even when the one coming in is not finite", "[nn][losses]") {
  // The usual masked mean, loss_none.sum() / mask.sum(), with an empty mask sends inf (0 / 0 -> nan) to
  // every element; PyTorch's and the fused (N, C) path's gradient there is 0.
  Tensor w = from_vector<double>({0.5, 1.0, 2.0});
  for (bool weighted : {false, true}) {
    INFO((weighted ? "weighted" : "unweighted") << ", (N, C, d)");
    Tensor x = from_vector<double>({0.1, 0.2, 0.3, 0.3, 0.2, 0.1}, {2, 3, 1}).requires_grad_();
    Tensor target = full({2, 1}, -100, kInt64);
    Tensor per = nn::cross_entropy(x, target, {.weight = weighted ? w : Tensor(), .reduction = "none"});
    Tensor mask = target.ne(-100).to(kFloat64);
    (per.sum() / mask.sum()).backward();
    test::check_equal(x.grad(), zeros({2, 3, 1}, kFloat64));
  }
}

TEST_CASE("The loss nodes give each gradient in its input's dtype, float16 too", "[nn][losses]") {
  // A float64 target or pos_weight must not make a float32 input's gradient float64 (PyTorch's is float32).
  Tensor x = from_vector<float>({-2, 0.5, 3}).requires_grad_();
  Tensor pw = full({3}, 2.0, kFloat64).requires_grad_();
  Tensor t = from_vector<double>({0, 1, 1}).requires_grad_();
  nn::binary_cross_entropy_with_logits(x, t, {.pos_weight = pw}).backward();
  CHECK(x.grad().dtype() == kFloat32);
  CHECK(t.grad().dtype() == kFloat64);
  CHECK(pw.grad().dtype() == kFloat64);
  Tensor p = from_vector<float>({0.25, 0.5, 0.75}).requires_grad_();
  nn::binary_cross_entropy(p, from_vector<double>({0, 1, 1})).backward();
  CHECK(p.grad().dtype() == kFloat32);
  // float16 cannot hold the 1e-12 floor: the gradient is computed in float32 and rounded once.
  Tensor h = from_vector<float>({0, 1, 0.5, 0.25}).to(kFloat16).requires_grad_();
  nn::binary_cross_entropy(h, from_vector<float>({0, 1, 0.5, 1}).to(kFloat16), {.reduction = "sum"}).backward();
  CHECK(h.grad().dtype() == kFloat16);
  test::check_close(h.grad().to(kFloat32), from_vector<float>({0, 0, 0, -0.75f / (0.25f * 0.75f)}), {1e-3, 0});
}

TEST_CASE("binary_cross_entropy's gradient at a saturated p of 0 or 1 is PyTorch's, finite", "[nn][losses]") {
  // PyTorch: (p - t) / max(p (1 - p), 1e-12); the clamped log's derivative was 0 * inf = nan.
  Tensor p = from_vector<double>({0.0, 1.0, 0.0, 1.0, 0.25}).requires_grad_();
  Tensor t = from_vector<double>({0.0, 1.0, 1.0, 0.0, 0.5});
  Tensor loss = nn::binary_cross_entropy(p, t, {.reduction = "sum"});
  CHECK(loss.item<double>() == Approx(200 + std::log(4.0 / 3) / 2 + std::log(4.0) / 2).epsilon(1e-15));
  loss.backward();
  // torch 1.13 gives -1000000003995.8029 where Kiln's 1e-12 is float64's, not float32's.
  test::check_close(p.grad(), from_vector<double>({0, 0, -1e12, 1e12, (0.25 - 0.5) / (0.25 * 0.75)}),
                    {1e-8, 0});
}

TEST_CASE("binary_cross_entropy_with_logits' float32 gradient keeps its relative accuracy for large |x|", "[nn][losses]") {
  // The composed (1 - t) - sigmoid(-x) cancelled: 17% off at x = -15, and 0 instead of 4.1e-8 at
  // x = -17. Checked relative to float64 on the same float32 values.
  Tensor x32 = from_vector<float>({-5, -10, -12, -15, -17, -30, 3, 17}).requires_grad_();
  Tensor x64 = x32.detach().to(kFloat64).requires_grad_();
  for (double target : {0.0, 1.0}) {
    for (bool pos : {false, true}) {
      INFO("target " << target << (pos ? ", pos_weight 2.5" : ""));
      nn::functional::BCEWithLogitsLossOptions o32{.reduction = "sum"}, o64{.reduction = "sum"};
      if (pos) {
        o32.pos_weight = full({8}, 2.5, kFloat32);
        o64.pos_weight = full({8}, 2.5, kFloat64);
      }
      Tensor g32 = autograd::grad({nn::binary_cross_entropy_with_logits(x32, full({8}, target, kFloat32), o32)},
                                  {x32})[0];
      Tensor g64 = autograd::grad({nn::binary_cross_entropy_with_logits(x64, full({8}, target, kFloat64), o64)},
                                  {x64})[0];
      // Relative at both ends: (1 - t) sigmoid(x) - pw t sigmoid(-x) cancels nowhere, so t = 1 at
      // large x is -pw * 4.1e-8 too (PyTorch's lw sigmoid(x) - pw t gives 0 there).
      test::check_close(g32.to(kFloat64), g64, {2e-6, 1e-30});
    }
  }
}

TEST_CASE("An ignored element whose log-probability or class weight is not finite leaves the loss alone, as PyTorch",
          "[nn][losses]") {
  // The ignored elements were masked by a product with 0, and 0 * nan (a padded position's logits) or
  // 0 * inf (class 0's weight, which ignored elements index) is nan. Goldens: PyTorch 1.13.
  const Tensor with_nan = from_vector<float>({0, NAN, 1, 2}, {1, 2, 2});  // (N, C, d): position 1 is NaN
  const Tensor target = from_vector<int64_t>({1, -100}, {1, 2});
  test::check_close(nn::cross_entropy(with_nan, target), scalar_tensor(0.31326165795326233, kFloat32));
  test::check_close(nn::cross_entropy(with_nan, target, {.reduction = "none", .label_smoothing = 0.1}),
                    from_vector<float>({0.3632616400718689f, 0}, {1, 2}));
  test::check_close(nn::nll_loss(from_vector<float>({-1, -2, NAN, -1}, {2, 2}), from_vector<int64_t>({0, -100})),
                    scalar_tensor(1.0, kFloat32));
  Tensor x = from_vector<float>({1, 2, 3, 4, 1, 2, 3, 4}, {2, 4}).requires_grad_();
  Tensor loss = nn::cross_entropy(x, from_vector<int64_t>({-100, 1}), {.weight = from_vector<float>({INFINITY, 1, 1, 1})});
  test::check_close(loss, scalar_tensor(2.4401895999908447, kFloat32));
  loss.backward();
  test::check_close(x.grad(), from_vector<float>({0, 0, 0, 0, 0.032058607786893845f, -0.9128556847572327f,
                                                  0.23688280582427979f, 0.6439142823219299f},
                                                 {2, 4}));
  // nll_loss takes class indices only: its message offers no class probabilities.
  test::check_error([] { nn::nll_loss(zeros({3, 4}), zeros({3})); }, {"nll_loss: class-index targets must be int64 or int32, got float32"});
  try {
    nn::nll_loss(zeros({3, 4}), zeros({3}));
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("probabilities") == std::string::npos);
  }
}

TEST_CASE("kl_div of a negative or NaN target is NaN, as PyTorch's xlogy, not 0", "[nn][losses]") {
  const Tensor logq = from_vector<float>({0.2f, 0.3f, 0.5f, 0.1f, 0.6f, 0.3f}, {2, 3}).log();
  for (float bad : {NAN, -0.2f}) {
    INFO(bad);
    Tensor loss = nn::kl_div(logq, from_vector<float>({bad, 0.5f, 0.3f, 0, 0.9f, 0.1f}, {2, 3}), {.reduction = "none"});
    const std::vector<float> v = loss.to_vector<float>();
    CHECK(std::isnan(v[0]));
    test::check_close(loss.narrow(1, 1, 2).flatten().narrow(0, 0, 2),
                      from_vector<float>({0.2554128170013428f, -0.15324769914150238f}));
    CHECK(v[3] == 0);  // a target of 0 adds 0
    test::check_close(loss.select(0, 1), from_vector<float>({0, 0.3649185001850128f, -0.10986122488975525f}));
  }
  Tensor q = logq.clone().requires_grad_();
  Tensor loss = nn::kl_div(q, from_vector<float>({0.2f, 0.5f, 0.3f, 0, 0.9f, 0.1f}, {2, 3}), {.reduction = "sum"});
  test::check_close(loss, scalar_tensor(0.35722237825393677, kFloat32));
  loss.backward();
  test::check_close(q.grad(), from_vector<float>({-0.2f, -0.5f, -0.3f, 0, -0.9f, -0.1f}, {2, 3}));
}

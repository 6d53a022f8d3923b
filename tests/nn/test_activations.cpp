// tests/nn/test_activations.cpp: torch.nn's other activations (ReLU6 ... RReLU) and the channel dropouts
// (Dropout1d/2d/3d): against PyTorch 1.13 (tests/fixtures/gen_nn_golden.py) in float64, by hand at the
// points where PyTorch's own kernels disagree, against the random draws they are defined by, and their
// Errors.
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nn_golden.h"

using namespace kiln;
using kiln::test::check_layer;
namespace F = kiln::nn::functional;

TEST_CASE("ReLU6 ... RReLU match torch, output and gradient, at their kinks too", "[nn][layers][activations]") {
  // The fixture's input holds 0, -3, 6, +-0.5 and +-25 (see gen_nn_golden.py).
  nn::ReLU6 relu6;
  check_layer(relu6, "relu6");
  nn::SELU selu;
  check_layer(selu, "selu");
  nn::CELU celu(2.0);
  check_layer(celu, "celu");
  nn::Mish mish;
  check_layer(mish, "mish");
  nn::Hardswish hardswish;
  check_layer(hardswish, "hardswish");
  nn::Hardsigmoid hardsigmoid;  // PyTorch's gradient 1/6 is a float32 constant: 3e-8 off, inside 1e-7
  check_layer(hardsigmoid, "hardsigmoid");
  nn::Softsign softsign;
  check_layer(softsign, "softsign");
  nn::Tanhshrink tanhshrink;
  check_layer(tanhshrink, "tanhshrink");
  nn::Threshold threshold(0.5, 9.0);
  check_layer(threshold, "threshold");
  nn::LogSigmoid logsigmoid;
  check_layer(logsigmoid, "logsigmoid");
  nn::Hardshrink hardshrink(0.5);
  check_layer(hardshrink, "hardshrink");
  nn::Softshrink softshrink(0.5);
  check_layer(softshrink, "softshrink");
  nn::RReLU rrelu(0.1, 0.3);
  check_layer(rrelu, "rrelu_eval", false);
  nn::PReLU prelu({.num_parameters = 3});
  check_layer(prelu, "prelu_channels");
  check_layer(prelu, "prelu_channels_2d");
  nn::PReLU prelu_one({.init = 0.1});
  test::check_equal(prelu_one.weight, full({1}, 0.1f));
  check_layer(prelu_one, "prelu_one");
  nn::GLU glu(1);
  check_layer(glu, "glu");
  nn::GLU glu_last;
  check_layer(glu_last, "glu_last");
  nn::Softmin softmin(1);
  check_layer(softmin, "softmin");
  nn::LogSoftmax log_softmax(0);
  check_layer(log_softmax, "log_softmax");
  nn::Softmax2d softmax2d;
  check_layer(softmax2d, "softmax2d");
  check_layer(softmax2d, "softmax2d_unbatched");

  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::ReLU6>());
  reprs.push_back(std::make_shared<nn::SELU>());
  reprs.push_back(std::make_shared<nn::CELU>());
  reprs.push_back(std::make_shared<nn::CELU>(0.5));
  reprs.push_back(std::make_shared<nn::Mish>());
  reprs.push_back(std::make_shared<nn::Hardswish>());
  reprs.push_back(std::make_shared<nn::Hardsigmoid>());
  reprs.push_back(std::make_shared<nn::Softsign>());
  reprs.push_back(std::make_shared<nn::Tanhshrink>());
  reprs.push_back(std::make_shared<nn::Threshold>(0.1, 20.0));
  reprs.push_back(std::make_shared<nn::Threshold>(0.5, 2.5));
  reprs.push_back(std::make_shared<nn::LogSigmoid>());
  reprs.push_back(std::make_shared<nn::Hardshrink>());
  reprs.push_back(std::make_shared<nn::Softshrink>(0.3));
  reprs.push_back(std::make_shared<nn::PReLU>());
  reprs.push_back(std::make_shared<nn::PReLU>(nn::PReLUOptions{.num_parameters = 3}));
  reprs.push_back(std::make_shared<nn::GLU>());
  reprs.push_back(std::make_shared<nn::GLU>(1));
  reprs.push_back(std::make_shared<nn::Softmin>(1));
  reprs.push_back(std::make_shared<nn::LogSoftmax>(-1));
  reprs.push_back(std::make_shared<nn::Softmax2d>());
  reprs.push_back(std::make_shared<nn::RReLU>());
  reprs.push_back(std::make_shared<nn::RReLU>(0.1, 0.2));
  reprs.push_back(std::make_shared<nn::Dropout1d>());
  reprs.push_back(std::make_shared<nn::Dropout2d>(0.2));
  reprs.push_back(std::make_shared<nn::Dropout3d>(0.25));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("activation2_reprs").strings.at("repr"));
}

namespace {

// f(x) and d sum(f(x)) / dx for float64 x.
std::pair<Tensor, Tensor> value_and_slope(const std::function<Tensor(const Tensor&)>& f, std::vector<double> x) {
  Tensor in = from_vector<double>(x).requires_grad_();
  Tensor y = f(in);
  y.sum().backward();
  return {y.detach(), in.grad()};
}

}  // namespace

TEST_CASE("the activations at the points PyTorch's kernels disagree on, at NaN and far out", "[nn][layers][activations]") {
  // PyTorch 1.13's scalar CPU kernels (the definition; its vectorized ones differ at hardswish's 3
  // and at NaN): hardswish's slope is x / 3 + 1/2 on [-3, 3]; NaN passes the gradient in relu6 (as
  // hardtanh), hardswish, threshold and hardshrink, and not in hardsigmoid; softshrink maps NaN to 0
  // without a gradient (the vectorized kernel's: no 0 computed from a NaN can carry one).
  const double nan = NAN, inf = INFINITY;
  auto [hs, hs_slope] = value_and_slope(F::hardswish, {3, -3, nan, inf, -inf, 1});
  const test::Tolerance exact{0, 0};  // check_close, not check_equal: NaN matches NaN
  test::check_close(hs, from_vector<double>({3, -0.0, nan, inf, 0, 4.0 / 6}), exact);
  test::check_close(hs_slope, from_vector<double>({1.5, -0.5, 1, 1, 0, 1.0 / 3 + 0.5}), {1e-15, 0});
  auto [r6, r6_slope] = value_and_slope(F::relu6, {nan, 0, 6, 3});
  test::check_equal(r6_slope, from_vector<double>({1, 0, 0, 1}));
  CHECK(std::isnan(r6[0].item<double>()));
  auto [th, th_slope] = value_and_slope([](const Tensor& x) { return F::threshold(x, 0.5, 9); }, {nan, 0.5, 0.6});
  test::check_close(th, from_vector<double>({nan, 9, 0.6}), exact);
  test::check_equal(th_slope, from_vector<double>({1, 0, 1}));
  auto [hk, hk_slope] = value_and_slope([](const Tensor& x) { return F::hardshrink(x, 0.5); }, {nan, 0.5, -0.6});
  test::check_close(hk, from_vector<double>({nan, 0, -0.6}), exact);
  test::check_equal(hk_slope, from_vector<double>({1, 0, 1}));
  auto [sk, sk_slope] = value_and_slope([](const Tensor& x) { return F::softshrink(x, 0.5); }, {nan, -0.5, -0.75, inf});
  test::check_equal(sk, from_vector<double>({0, 0, -0.25, inf}));
  test::check_equal(sk_slope, from_vector<double>({0, 0, 1, 1}));
  auto [hg, hg_slope] = value_and_slope(F::hardsigmoid, {nan, -3, 3, 0, 1.5, 7});
  test::check_close(hg, from_vector<double>({nan, 0, 1, 0.5, 0.75, 1}), exact);
  test::check_equal(hg_slope, from_vector<double>({0, 0, 0, 1.0 / 6, 1.0 / 6, 0}));  // 1/6 in float64

  // logsigmoid is exact past softplus's threshold of 20: -30 - log1p(exp(-30)), not -30.
  auto [ls, ls_slope] = value_and_slope(F::logsigmoid, {-30, -800, 800, 0});
  test::check_close(ls, from_vector<double>({-30 - std::log1p(std::exp(-30.0)), -800, 0, -std::log(2.0)}), {1e-16, 0});
  test::check_close(ls_slope, from_vector<double>({1 - 1 / (1 + std::exp(30.0)), 1, 0, 0.5}), {1e-16, 0});

  // No NaN gradient from a branch where() does not take.
  Generator gen(3);
  for (const auto& f : std::vector<std::function<Tensor(const Tensor&)>>{
           F::selu, [](const Tensor& x) { return F::celu(x, 0.5); }, F::mish, F::hardswish, F::softsign,
           [&](const Tensor& x) { return F::rrelu(x, 0.1, 0.3, true, &gen); }}) {
    auto [y, slope] = value_and_slope(f, {800, -800});
    CHECK_FALSE(slope.isnan().any().item<bool>());
  }
  // prelu at +-inf: the slope's gradient sums x g over x <= 0 only (an inf on the other branch is not
  // 0 x inf = NaN there); rrelu while training gives a NaN its gradient 1, as PyTorch's noise of 1.
  Tensor weight = from_vector<double>({0.25}).requires_grad_();
  Tensor x = from_vector<double>({inf, -2, 3}).requires_grad_();
  F::prelu(x, weight).sum().backward();
  test::check_equal(weight.grad(), from_vector<double>({-2}));
  test::check_equal(x.grad(), from_vector<double>({1, 0.25, 1}));
  auto [rr, rr_slope] = value_and_slope([&](const Tensor& v) { return F::rrelu(v, 0.1, 0.3, true, &gen); }, {nan, 2});
  test::check_equal(rr_slope, from_vector<double>({1, 1}));
}

TEST_CASE("the activations keep float32 and equal a float64 evaluation, and differentiate twice", "[nn][layers][activations]") {
  const Tensor x64 = test::sample({3, 7}, kFloat64) * 4;
  const Tensor w = from_vector<double>({0.2, -0.3, 1.1});
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> fns = {
      {"relu6", F::relu6},
      {"selu", F::selu},
      {"celu", [](const Tensor& x) { return F::celu(x, 1.5); }},
      {"mish", F::mish},
      {"hardswish", F::hardswish},
      {"hardsigmoid", F::hardsigmoid},
      {"softsign", F::softsign},
      {"tanhshrink", F::tanhshrink},
      {"threshold", [](const Tensor& x) { return F::threshold(x, 0.1, -2); }},
      {"logsigmoid", F::logsigmoid},
      {"hardshrink", [](const Tensor& x) { return F::hardshrink(x, 1); }},
      {"softshrink", [](const Tensor& x) { return F::softshrink(x, 1); }},
      {"prelu", [&](const Tensor& x) { return F::prelu(x.t(), w.to(x.dtype())); }},
      {"glu", [](const Tensor& x) { return F::glu(x.narrow(1, 0, 6), 1); }},
      {"softmin", [](const Tensor& x) { return F::softmin(x, 0); }},
      {"rrelu_eval", [](const Tensor& x) { return F::rrelu(x); }},
  };
  for (const auto& [name, f] : fns) {
    INFO(name);
    Tensor y32 = f(x64.to(kFloat32));
    CHECK(y32.dtype() == kFloat32);
    test::check_close(y32, f(x64).to(kFloat32));
    if (name == "glu" || name == "prelu") continue;  // their shapes need the 3 x 7 input: below
    // Second derivatives (sample() keeps off the kinks).
    const Tensor x = test::sample({2, 3}, kFloat64, 0.9).requires_grad_();
    const auto fn = [&](const autograd::TensorList& in) { return autograd::TensorList{f(in.at(0))}; };
    CHECK(autograd::gradcheck(fn, {x}));
    CHECK(autograd::gradgradcheck(fn, {x}));
  }
  const Tensor x = test::sample({4, 3}, kFloat64, 0.3).requires_grad_();
  const Tensor slopes = from_vector<double>({0.2, -0.3, 1.1}).requires_grad_();
  CHECK(autograd::gradgradcheck([](const autograd::TensorList& in) { return autograd::TensorList{F::prelu(in[0], in[1])}; }, {x, slopes}));
  CHECK(autograd::gradgradcheck([](const autograd::TensorList& in) { return autograd::TensorList{F::glu(in[0], 0)}; }, {x}));
}

TEST_CASE("rrelu while training draws each slope from the generator, between lower and upper", "[nn][layers][activations]") {
  Tensor x = test::sample({5, 8}, kFloat64).requires_grad_();
  Generator gen(17), same(17);
  Tensor y = F::rrelu(x, 0.1, 0.3, true, &gen);
  y.sum().backward();
  const Tensor slope = rand({5, 8}, kFloat64, &same) * 0.2 + 0.1;
  const Tensor positive = x.detach().gt(0);
  test::check_close(y, where(positive, x.detach(), x.detach() * slope), {1e-15, 0});
  test::check_close(x.grad(), where(positive, ones_like(slope), slope), {1e-15, 0});
  CHECK(gen.offset() == same.offset());
  // The module draws from the default generator: the negative elements' slopes lie in [lower, upper).
  nn::RReLU module(0.2, 0.25);
  const Tensor negatives = -test::sample({100}, kFloat64).abs() - 0.1;
  const Tensor ratio = module(negatives) / negatives;
  CHECK(ratio.min().item<double>() >= 0.2);
  CHECK(ratio.max().item<double>() < 0.25);
  CHECK(ratio.std().item<double>() > 0.005);  // drawn, not one slope
  module.eval();
  test::check_close(module(negatives) / negatives, full({100}, 0.225, kFloat64), {1e-15, 0});
}

TEST_CASE("Dropout1d/2d/3d zero whole channels, drawn from the generator as bernoulli(1 - p)", "[nn][layers][dropout]") {
  struct Case {
    Shape shape;
    Shape mask;  // the shape of one draw per (sample, channel)
    std::function<Tensor(const Tensor&, double, bool, Generator*)> dropout;
  };
  const std::vector<Case> cases = {
      {{4, 6, 5}, {4, 6, 1}, F::dropout1d},           {{6, 5}, {6, 1}, F::dropout1d},
      {{3, 5, 2, 4}, {3, 5, 1, 1}, F::dropout2d},     {{3, 5, 7}, {3, 5, 1}, F::dropout2d},  // (N, C, L)
      {{2, 3, 2, 2, 3}, {2, 3, 1, 1, 1}, F::dropout3d}, {{4, 2, 3, 2}, {4, 1, 1, 1}, F::dropout3d},
  };
  for (const auto& c : cases) {
    INFO(c.shape.str());
    Tensor x = (test::sample(c.shape, kFloat64) + 3).requires_grad_();
    Generator gen(5), same(5);
    Tensor y = c.dropout(x, 0.4, true, &gen);
    const Tensor mask = bernoulli(c.mask, 0.6, kFloat64, &same) / 0.6;
    test::check_close(y, x.detach() * mask, {1e-15, 0});
    y.backward(ones_like(y));
    test::check_close(x.grad(), mask.expand(c.shape), {1e-15, 0});
    CHECK(c.dropout(x, 0.4, false, &gen).is_same(x));
    CHECK(c.dropout(x, 0.0, true, &gen).is_same(x));
    test::check_equal(c.dropout(x, 1.0, true, &gen), zeros(c.shape, kFloat64));
  }
  // The share of channels dropped is p's.
  Generator gen(9);
  const Tensor planes = F::dropout2d(ones({40, 100, 2, 2}), 0.3, true, &gen);
  const double dropped = planes.eq(0).to(kFloat64).mean().item<double>();
  CHECK(dropped > 0.27);
  CHECK(dropped < 0.33);
  // The modules: whole planes while training, the identity in evaluation.
  nn::Dropout2d layer(0.5);
  Tensor y = layer(ones({2, 8, 3, 3}));
  const Tensor per_plane = y.amax({2, 3});
  test::check_equal(y.amin({2, 3}), per_plane);
  CHECK(per_plane.eq(0).logical_or(per_plane.eq(2)).all().item<bool>());
  layer.eval();
  const Tensor z = ones({2, 8, 3, 3});
  CHECK(layer(z).is_same(z));
}

TEST_CASE("the activations and channel dropouts refuse bad arguments with Errors that say what to pass", "[nn][layers][errors]") {
  const Tensor x = test::sample({2, 3});
  test::check_error([&] { F::celu(x, 0); }, {"celu", "alpha must not be 0"});
  test::check_error([] { nn::CELU(0.0); }, {"nn::CELU", "alpha"});
  test::check_error([&] { F::softshrink(x, -1); }, {"softshrink", "lambd must be >= 0", "-1"});
  test::check_error([] { nn::Softshrink(-0.5); }, {"nn::Softshrink", "-0.5"});
  test::check_error([&] { F::glu(test::sample({2, 5}), 1); }, {"glu", "dim 1", "even", "5"});
  test::check_error([] { F::glu(scalar_tensor(1.0f)); }, {"glu", "0-d"});
  test::check_error([&] { F::prelu(x, ones({2})); }, {"prelu", "2 slopes", "3 channel(s)"});
  test::check_error([] { F::prelu(ones({3}), ones({3})); }, {"prelu", "3 slopes", "1 channel(s)"});
  test::check_error([&] { F::prelu(x, ones({1, 3})); }, {"prelu", "0-d or 1-D", "2-D"});
  test::check_error([&] { F::prelu(x, Tensor()); }, {"prelu", "undefined"});
  test::check_error([] { nn::PReLU({.num_parameters = 0}); }, {"nn::PReLU", "num_parameters", ">= 1"});
  test::check_error([&] { F::rrelu(x, 0.5, 0.1); }, {"rrelu", "lower (0.5)", "upper (0.1)"});
  test::check_error([] { nn::RReLU(0.1, NAN); }, {"nn::RReLU", "finite"});
  test::check_error([] { F::rrelu(ones({3}, kInt64), 0.1, 0.2, true); }, {"rrelu", "floating-point", "int64"});
  test::check_error([] { nn::Softmax2d()(ones({2, 3})); }, {"Softmax2d", "(C, H, W)", "2-D"});
  test::check_error([] { F::dropout1d(ones({2, 3, 4, 5}), 0.5); }, {"dropout1d", "(N, C, L)", "4-D"});
  test::check_error([] { F::dropout1d(ones({2, 3, 4, 5}), 0.5, false); }, {"dropout1d", "4-D"});  // eval too
  test::check_error([] { F::dropout2d(ones({2, 3}), 0.5); }, {"dropout2d", "(N, C, H, W)", "2-D"});
  test::check_error([] { F::dropout3d(ones({2, 3, 4}), 0.5); }, {"dropout3d", "(C, D, H, W)", "3-D"});
  test::check_error([] { F::dropout2d(ones({2, 3, 4}), 1.5); }, {"dropout2d", "p must be in [0, 1]", "1.5"});
  test::check_error([] { F::dropout2d(ones({2, 3, 4}, kInt32), 0.5); }, {"dropout2d", "floating-point", "int32"});
  test::check_error([] { nn::Dropout3d(-0.1); }, {"nn::Dropout3d", "p must be in [0, 1]"});
}

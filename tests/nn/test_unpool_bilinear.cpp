// tests/nn/test_unpool_bilinear.cpp: MaxUnpool1d/2d/3d, Bilinear and AlphaDropout / FeatureAlphaDropout
// against PyTorch 1.13 (tests/fixtures/gen_nn_golden.py) in float64, alpha dropout against the random
// draws it is defined by, gradcheck and gradgradcheck, and their Errors.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "nn_golden.h"

using namespace kiln;
namespace F = kiln::nn::functional;

namespace {

// The case's values and indices unpooled by `unpool`: out, and the values' gradient of <out, cot>.
void check_unpool(const std::string& name, const std::function<Tensor(const Tensor&, const Tensor&)>& unpool) {
  INFO(name);
  const test::NnCase& c = test::nn_case(name);
  Tensor values = c.at("in.0").clone().requires_grad_();
  Tensor out = unpool(values, c.at("in.1"));
  test::check_close(out, c.at("out"), {1e-15, 0});
  out.backward(c.at("cot"));
  test::check_close(values.grad(), c.at("g.in.0"), {1e-15, 0});
}

}  // namespace

TEST_CASE("MaxUnpool1d/2d/3d match torch: strides, padding, output_size, unbatched, and print as torch's",
          "[nn][layers][pool]") {
  nn::MaxUnpool2d two({2, 3}, {.stride = nn::Size2{2, 1}, .padding = nn::Size2{0, 1}});
  check_unpool("max_unpool2d", [&](const Tensor& v, const Tensor& i) { return two.forward(v, i); });
  nn::MaxUnpool2d plain(2);
  check_unpool("max_unpool2d_output_size", [&](const Tensor& v, const Tensor& i) {
    return plain.forward(v, i, {5, 5});
  });
  check_unpool("max_unpool2d_output_size",  // all four dims, as PyTorch takes them too
               [&](const Tensor& v, const Tensor& i) {
                 return plain.forward(v, i, {1, 2, 5, 5});
               });
  check_unpool("max_unpool2d_unbatched", [&](const Tensor& v, const Tensor& i) { return plain.forward(v, i); });
  nn::MaxUnpool1d one(3, {.stride = 2, .padding = 1});
  check_unpool("max_unpool1d", [&](const Tensor& v, const Tensor& i) { return one.forward(v, i); });
  nn::MaxUnpool3d three(2);
  check_unpool("max_unpool3d", [&](const Tensor& v, const Tensor& i) { return three.forward(v, i); });
  nn::MaxUnpool3d three_padded({2, 3, 2}, {.stride = nn::Size3{1, 2, 2}, .padding = nn::Size3{1, 1, 0}});
  check_unpool("max_unpool3d_padding", [&](const Tensor& v, const Tensor& i) { return three_padded.forward(v, i); });
  // The functional forms take the same arguments.
  check_unpool("max_unpool2d", [](const Tensor& v, const Tensor& i) {
    return F::max_unpool2d(v, i, {2, 3}, {2, 1}, {0, 1});
  });
  check_unpool("max_unpool1d", [](const Tensor& v, const Tensor& i) { return F::max_unpool1d(v, i, 3, 2, 1); });
  check_unpool("max_unpool3d_padding", [](const Tensor& v, const Tensor& i) {
    return F::max_unpool3d(v, i, {2, 3, 2}, {1, 2, 2}, {1, 1, 0});
  });

  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::MaxUnpool1d>(3));
  reprs.push_back(std::make_shared<nn::MaxUnpool1d>(3, nn::MaxUnpool1dOptions{.stride = 2, .padding = 1}));
  reprs.push_back(std::make_shared<nn::MaxUnpool2d>(2));
  reprs.push_back(
      std::make_shared<nn::MaxUnpool2d>(nn::Size2{2, 3}, nn::MaxUnpool2dOptions{.stride = 1, .padding = {1, 0}}));
  reprs.push_back(std::make_shared<nn::MaxUnpool3d>(2));
  reprs.push_back(std::make_shared<nn::MaxUnpool3d>(
      nn::Size3{1, 2, 3}, nn::MaxUnpool3dOptions{.stride = nn::Size3{2, 1, 1}, .padding = 1}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("unpool_reprs").strings.at("repr"));
}

TEST_CASE("max unpooling inverts MaxPool's forward_with_indices, in float32 too, and is differentiable twice",
          "[nn][layers][pool]") {
  // Every maximum goes back where it was and everything else is zero: unpool(pool(x)) = x where x is its
  // window's maximum.
  Tensor x = test::sample({2, 3, 6, 8});
  nn::MaxPool2d pool(2);
  auto [values, indices] = pool.forward_with_indices(x);
  test::check_equal(values, pool.forward(x));
  Tensor back = nn::MaxUnpool2d(2).forward(values, indices);
  Tensor is_max = x.eq(F::interpolate(values, {.scale_factor = {2}}));
  test::check_equal(back, where(is_max, x, zeros_like(x)));
  nn::MaxPool1d pool1(3, {.stride = 2});
  Tensor x1 = test::sample({2, 4, 11});
  auto [v1, i1] = pool1.forward_with_indices(x1);
  test::check_equal(gather(x1, 2, i1), v1);
  test::check_equal(gather(F::max_unpool1d(v1, i1, 3, 2), 2, i1), v1);

  // Differentiable twice: the values squared first, so that the second derivative is not zero.
  auto [vd, id] = F::max_pool2d_with_indices(test::sample({1, 2, 4, 6}, kFloat64), Shape{2});
  auto fn = [id = id](const autograd::TensorList& in) {
    return autograd::TensorList{F::max_unpool2d(in[0] * in[0], id, {2})};
  };
  Tensor vg = vd.clone().requires_grad_();
  CHECK(autograd::gradcheck(fn, {vg}));
  CHECK(autograd::gradgradcheck(fn, {vg}));
}

TEST_CASE("max unpooling's Errors name the argument and what to do", "[nn][layers][pool][errors]") {
  Tensor x = test::sample({1, 2, 5, 5});
  auto [v, i] = F::max_pool2d_with_indices(x, Shape{2});
  test::check_error([&] { F::max_unpool2d(v, i, {2}); }, {"max_unpool2d", "index", "outside the output plane of 16",
                                                          "[1, 2, 4, 4]", "same kernel_size, stride and padding"});
  test::check_error(
      [&] {
        F::max_unpool2d(v, i, {2}, {}, {0}, {7, 5});
      },
      {"max_unpool2d", "invalid output_size [7, 5]", "dim 0", "strictly between 2 and 6"});
  test::check_error([&] { F::max_unpool2d(v, i, {2}, {}, {0}, {5}); },
                    {"max_unpool2d", "output_size", "2 spatial sizes or 4", "[5]"});
  test::check_error([&] { F::max_unpool2d(v, -i - 1, {2}, {}, {0}, {5, 5}); }, {"max_unpool2d", "index -"});
  test::check_error([&] { F::max_unpool2d(v, i.to(kInt32), {2}); }, {"max_unpool2d", "int64", "int32"});
  test::check_error([&] { F::max_unpool2d(v, i.narrow(2, 0, 1), {2}); },
                    {"max_unpool2d", "input's shape [1, 2, 2, 2]", "[1, 2, 1, 2]"});
  test::check_error([&] { F::max_unpool2d(v.flatten(), i.flatten(), {2}); }, {"max_unpool2d", "(N, C, H, W)", "[8]"});
  test::check_error([&] { F::max_unpool2d(v, i, {2, 2, 2}); }, {"max_unpool2d", "kernel_size", "one or two elements"});
  test::check_error(
      [&] {
        F::max_unpool3d(v.unsqueeze(2), i.unsqueeze(2), {1, 2, 2}, {0, 2, 2});
      },
      {"max_unpool3d", "stride must be positive"});
  test::check_error([&] { F::max_unpool1d(v.flatten(2), i.flatten(2), 1, 1, 3); },
                    {"max_unpool1d", "dim 2 would have size -2"});
  test::check_error([&] { nn::MaxUnpool2d(2)(v); }, {"nn::MaxUnpool2d", "forward(input, indices)"});
  test::check_error([] { F::max_unpool1d(zeros({1, 2, 0}), zeros({1, 2, 0}, kInt64), 3, 1); },
                    {"max_unpool1d", "no empty dim but the first", "dim 2"});
  CHECK(F::max_unpool2d(zeros({0, 2, 2, 2}), zeros({0, 2, 2, 2}, kInt64), {2}).sizes() == Shape{0, 2, 4, 4});
}

TEST_CASE("Bilinear matches torch: output and every gradient, batched and one sample, and prints as torch's",
          "[nn][layers]") {
  for (const std::string name : {"bilinear", "bilinear_one_sample_no_bias"}) {
    INFO(name);
    const test::NnCase& c = test::nn_case(name);
    const bool bias = c.has("p.bias");
    nn::Bilinear layer(c.at("p.weight").size(1), c.at("p.weight").size(2), c.at("p.weight").size(0), {.bias = bias});
    layer.to(kFloat64);
    layer.load_state_dict(c.state());
    Tensor x1 = c.at("in.0").clone().requires_grad_(), x2 = c.at("in.1").clone().requires_grad_();
    Tensor y = layer.forward(x1, x2);
    test::check_close(y, c.at("out"));
    y.backward(c.at("cot"));
    test::check_close(x1.grad(), c.at("g.in.0"));
    test::check_close(x2.grad(), c.at("g.in.1"));
    test::check_close(layer.weight.grad(), c.at("g.weight"));
    if (bias) test::check_close(layer.bias.grad(), c.at("g.bias"));
    CHECK(layer.bias.defined() == bias);
  }
  // PyTorch's initialisation: both U(+-1/sqrt(in1_features)).
  nn::Bilinear wide(16, 3, 200);
  CHECK(wide.weight.sizes() == Shape{200, 16, 3});
  CHECK(wide.weight.abs().max().item<float>() <= 0.25f);
  CHECK(wide.weight.abs().max().item<float>() > 0.24f);
  CHECK(wide.bias.abs().max().item<float>() <= 0.25f);
  CHECK(wide.bias.abs().max().item<float>() > 0.2f);
  // Differentiable twice in every argument.
  auto fn = [](const autograd::TensorList& in) {
    return autograd::TensorList{F::bilinear(in[0], in[1], in[2], in[3])};
  };
  CHECK(autograd::gradgradcheck(
      fn,
      {test::sample({2, 3}, kFloat64).requires_grad_(), test::sample({2, 2}, kFloat64, 0.3).requires_grad_(),
       test::sample({4, 3, 2}, kFloat64, 0.7).requires_grad_(), test::sample({4}, kFloat64, 0.9).requires_grad_()}));

  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::Bilinear>(3, 4, 5));
  reprs.push_back(std::make_shared<nn::Bilinear>(2, 2, 1, nn::BilinearOptions{.bias = false}));
  reprs.push_back(std::make_shared<nn::AlphaDropout>());
  reprs.push_back(std::make_shared<nn::AlphaDropout>(0.2));
  reprs.push_back(std::make_shared<nn::FeatureAlphaDropout>(0.25));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("bilinear_reprs").strings.at("repr"));

  const Tensor w = ones({5, 3, 4});
  test::check_error([&] { F::bilinear(ones({2, 3}), ones({4}), w); }, {"bilinear", "same number of dims"});
  test::check_error([&] { F::bilinear(ones({2, 3}), ones({3, 4}), w); }, {"bilinear", "leading (batch) dims", "dim 0"});
  test::check_error([&] { F::bilinear(ones({2, 2}), ones({2, 4}), w); }, {"bilinear", "input1's last dim is 2", "3"});
  test::check_error([&] { F::bilinear(ones({2, 3}), ones({2, 2}), w); }, {"bilinear", "input2's last dim is 2", "4"});
  test::check_error([&] { F::bilinear(ones({2, 3}), ones({2, 4}), w, ones({4})); }, {"bilinear", "bias", "5", "[4]"});
  test::check_error([&] { F::bilinear(ones({2, 3}), ones({2, 4}), ones({5, 12})); }, {"bilinear", "3-D", "[5, 12]"});
  test::check_error([] { nn::Bilinear(2, 2, 2)(ones({2, 2})); }, {"nn::Bilinear", "forward(input1, input2)"});
}

TEST_CASE("alpha dropout gives PyTorch's two values per element, with dropout's mask, and keeps mean and variance",
          "[nn][layers][dropout]") {
  struct Case {
    const char* name;
    DType dtype;
    bool feature;
  };
  for (const Case& k : {Case{"alpha_dropout_f32", kFloat32, false}, Case{"alpha_dropout_f64", kFloat64, false},
                        Case{"feature_alpha_dropout_f32", kFloat32, true}}) {
    INFO(k.name);
    const test::NnCase& c = test::nn_case(k.name);
    const double p = c.at("p").item<double>();
    Tensor x = c.at("in.0").to(k.dtype).requires_grad_();
    Shape mask_shape = x.sizes();
    if (k.feature) mask_shape = {x.size(0), x.size(1), 1, 1};
    Generator gen(21), same(21);
    Tensor y = k.feature ? F::feature_alpha_dropout(x, p, true, &gen) : F::alpha_dropout(x, p, true, &gen);
    const Tensor keep = bernoulli(mask_shape, 1 - p, k.dtype, &same).ne(0).expand(x.sizes());
    CHECK(keep.any().item<bool>());
    CHECK(!keep.all().item<bool>());
    // PyTorch's values to the last bit: the same operations in the same order.
    test::check_close(y, where(keep, c.at("kept").to(k.dtype), c.at("dropped").to(k.dtype)), {0, 0});
    y.backward(ones_like(y));
    const double a = 1 / std::sqrt((1.7580993408473766 * 1.7580993408473766 * p + 1) * (1 - p));
    test::check_close(x.grad(), where(keep, full(x.sizes(), a, k.dtype), zeros_like(x)), {1e-7, 0});
  }
  // A standard normal input keeps its mean 0 and variance 1.
  Generator gen(4);
  const Tensor z = randn({400000}, {}, &gen);
  for (double p : {0.1, 0.5, 0.8}) {
    INFO(p);
    const Tensor y = F::alpha_dropout(z, p, true, &gen).to(kFloat64);
    CHECK(std::abs(y.mean().item<double>()) < 0.01);
    CHECK(std::abs(y.var().item<double>() - 1) < 0.02);
  }
  // The identity when not training or p = 0 (PyTorch's functional default is train = false); zeros at p = 1.
  const Tensor x = test::sample({3, 4});
  CHECK(F::alpha_dropout(x, 0.5).is_same(x));
  CHECK(F::feature_alpha_dropout(x, 0.0, true).is_same(x));
  test::check_equal(F::alpha_dropout(x, 1.0, true), zeros_like(x));
  test::check_equal(F::feature_alpha_dropout(ones({3}), 1.0, true), zeros({3}));  // the rank is not checked at 1
  nn::AlphaDropout layer(0.5);
  const Tensor trained = layer(x);
  CHECK(trained.ne(x).any().item<bool>());
  layer.eval();
  CHECK(layer(x).is_same(x));
  nn::FeatureAlphaDropout features(0.5);
  const Tensor planes = features(ones({4, 6, 3, 3}));
  test::check_equal(planes.amin({2, 3}), planes.amax({2, 3}));  // one draw per (sample, channel)

  test::check_error([] { F::alpha_dropout(ones({3}), 1.5, true); }, {"alpha_dropout", "[0, 1]", "1.5"});
  test::check_error([] { F::alpha_dropout(ones({3}), std::nan(""), false); }, {"alpha_dropout", "[0, 1]"});
  test::check_error([] { F::feature_alpha_dropout(ones({3}), 0.5, true); },
                    {"feature_alpha_dropout", "at least 2 dims", "[3]"});
  test::check_error([] { F::alpha_dropout(ones({3}, kInt64), 0.5, true); }, {"alpha_dropout", "floating", "int64"});
  test::check_error([] { nn::FeatureAlphaDropout(2.0); }, {"nn::FeatureAlphaDropout", "p must be in [0, 1]"});
}

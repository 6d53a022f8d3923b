// tests/nn/test_resample.cpp: the padding layers, Upsample, PixelShuffle/PixelUnshuffle, InstanceNorm and
// BatchNorm3d (nn/resample.h, nn/norm.h). The functional forms behind them (pad's modes, interpolate,
// pixel_shuffle, instance_norm) are checked against PyTorch by the op table (tests/fixtures/gen_golden.py);
// here: the layers against those forms, InstanceNorm's running statistics against PyTorch, and the errors.
#include <cmath>

#include "support.h"

using namespace kiln;

namespace {

// x[i] = 2 sin(0.37 i) + 0.1 i in float64, of the given shape.
Tensor ramp(const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 2 * std::sin(0.37 * static_cast<double>(i)) + 0.1 * static_cast<double>(i);
  return from_vector(v, shape);
}

}  // namespace

TEST_CASE("padding layers, Upsample and PixelShuffle equal their functional forms and print as PyTorch's",
          "[nn][layers][resample]") {
  const Tensor x = ramp({2, 3, 4, 5});
  test::check_equal(nn::ReflectionPad2d(2)(x), pad(x, {2, 2, 2, 2}, "reflect"));
  test::check_equal(nn::ReplicationPad2d({1, 0, 3, 2})(x), pad(x, {1, 0, 3, 2}, "replicate"));
  test::check_equal(nn::CircularPad1d({2, 1})(x[0]), pad(x[0], {2, 1}, "circular"));
  test::check_equal(nn::ReflectionPad1d(3)(x[0]), pad(x[0], {3, 3}, "reflect"));
  test::check_equal(nn::ReplicationPad3d(1)(x), pad(x, {1, 1, 1, 1, 1, 1}, "replicate"));
  test::check_equal(nn::ZeroPad2d({1, 2, 0, 1})(x), pad(x, {1, 2, 0, 1}));
  test::check_equal(nn::ConstantPad1d({1, 2}, 3.5)(x), pad(x, {1, 2}, 3.5));
  // reflect: the edge element is not repeated; replicate repeats it; circular wraps.
  const Tensor row = from_vector<double>({0, 1, 2, 3}, {1, 1, 4});
  test::check_equal(pad(row, {2, 1}, "reflect"), from_vector<double>({2, 1, 0, 1, 2, 3, 2}, {1, 1, 7}));
  test::check_equal(pad(row, {2, 1}, "replicate"), from_vector<double>({0, 0, 0, 1, 2, 3, 3}, {1, 1, 7}));
  test::check_equal(pad(row, {2, 1}, "circular"), from_vector<double>({2, 3, 0, 1, 2, 3, 0}, {1, 1, 7}));

  nn::Upsample up({.scale_factor = {2}, .mode = "bilinear", .align_corners = true});
  test::check_equal(up(x), nn::interpolate(x, {.scale_factor = {2}, .mode = "bilinear", .align_corners = true}));
  CHECK(up(x).sizes() == Shape{2, 3, 8, 10});
  nn::PixelShuffle shuffle(2);
  nn::PixelUnshuffle unshuffle(2);
  const Tensor y = ramp({1, 8, 2, 3});
  CHECK(shuffle(y).sizes() == Shape{1, 2, 4, 6});
  test::check_equal(unshuffle(shuffle(y)), y);
  // Output pixel (h, w) of channel c comes from input channel c r^2 + (h % r) r + (w % r).
  CHECK(shuffle(y)[0][1][3][4].item<double>() == y[0][4 + 1 * 2 + 0][1][2].item<double>());

  nn::Sequential seq{nn::ReflectionPad2d({1, 2, 3, 4}), nn::ConstantPad1d(2, 3.5),
                     nn::Upsample({.size = {4, 6}, .mode = "nearest"}), nn::PixelShuffle(3),
                     nn::ZeroPad2d({1, 2, 0, 1}), nn::Upsample({.scale_factor = {2}, .mode = "bilinear"})};
  // PyTorch 1.13's lines for the same layers.
  const std::string printed = seq.to_string();
  CHECK(printed.find("(0): ReflectionPad2d((1, 2, 3, 4))\n") != std::string::npos);
  CHECK(printed.find("(1): ConstantPad1d(padding=(2, 2), value=3.5)\n") != std::string::npos);
  CHECK(printed.find("(2): Upsample(size=(4, 6), mode=nearest)\n") != std::string::npos);
  CHECK(printed.find("(3): PixelShuffle(upscale_factor=3)\n") != std::string::npos);
  CHECK(printed.find("(4): ZeroPad2d((1, 2, 0, 1))\n") != std::string::npos);
  CHECK(printed.find("(5): Upsample(scale_factor=2.0, mode=bilinear)\n") != std::string::npos);
}

TEST_CASE("InstanceNorm2d: running statistics, eval and unbatched input as PyTorch's", "[nn][layers][norm]") {
  // Golden: PyTorch 1.13, nn.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=0.3),
  // float64, weight [1.5, -0.5, 2], bias [0.1, 0.2, -0.3], trained on x then on x * 0.5 + 1, then eval.
  nn::InstanceNorm2d norm(3, {.momentum = 0.3, .affine = true, .track_running_stats = true});
  norm.to(kFloat64);
  {
    NoGradGuard no_grad;
    norm.weight.copy_(from_vector<double>({1.5, -0.5, 2.0}));
    norm.bias.copy_(from_vector<double>({0.1, 0.2, -0.3}));
  }
  const Tensor x = ramp({2, 3, 4, 5});
  const Tensor y = norm(x);
  norm(x * 0.5 + 1);
  test::check_close(norm.running_mean, from_vector<double>({1.7124020142318421, 2.442257776588036, 3.171824080235748}),
                    {1e-12, 1e-12});
  test::check_close(norm.running_var, from_vector<double>({1.1311940588088936, 1.2139837392465362, 1.1276559332599765}),
                    {1e-12, 1e-12});
  CHECK(norm.num_batches_tracked.item<int64_t>() == 0);  // PyTorch's InstanceNorm does not count
  // The outputs to 1e-8: PyTorch 1.13's module applies its affine in a way that lands 3e-9 (relative)
  // away from its own F.instance_norm(x) * weight + bias; Kiln's equal that composition to 1e-15.
  CHECK(y[0][1][2][3].item<double>() == Approx(0.4034806383782006).epsilon(1e-8));
  CHECK(y[1][2][0][0].item<double>() == Approx(-3.9274166970055977).epsilon(1e-8));
  test::check_close(y, nn::instance_norm(x) * norm.weight.reshape({3, 1, 1}) + norm.bias.reshape({3, 1, 1}),
                    {1e-14, 1e-14});
  norm.eval();
  const Tensor e = norm(x);
  // Eval: the running statistics above (PyTorch's to 1e-12) in the f64 formula. (PyTorch's module gives
  // 0.1273961576887605 for e[0][1][2][3], 2.3e-8 away from that formula's 0.12739615470852822.)
  const Tensor rs = (norm.running_var + 1e-5).sqrt().reshape({3, 1, 1});
  test::check_close(e, (x - norm.running_mean.reshape({3, 1, 1})) / rs * norm.weight.reshape({3, 1, 1}) +
                           norm.bias.reshape({3, 1, 1}), {1e-13, 1e-13});
  CHECK(e[0][1][2][3].item<double>() == Approx(0.12739615470852822).epsilon(1e-13));
  test::check_equal(norm(x[1]), e[1]);
  CHECK(norm(x[1]).sizes() == Shape{3, 4, 5});

  // Without running statistics each plane has mean 0 and (biased) variance 1 in eval too.
  nn::InstanceNorm1d plain(4);
  plain.eval();
  const Tensor z = plain(ramp({2, 4, 7}).to(kFloat32));
  test::check_close(z.mean({2}), zeros({2, 4}), {1e-5, 1e-5});
  test::check_close(z.var({2}, 0), ones({2, 4}), {1e-4, 1e-4});
  CHECK(norm.to_string().find("InstanceNorm2d(3, eps=1e-05, momentum=0.3, affine=True, track_running_stats=True)") !=
        std::string::npos);
}

TEST_CASE("BatchNorm3d normalises (N, C, D, H, W) per channel as batch_norm", "[nn][layers][norm]") {
  nn::BatchNorm3d bn(2);
  const Tensor x = ramp({3, 2, 2, 3, 2}).to(kFloat32);
  const Tensor y = bn(x);
  test::check_close(y, batch_norm(x, {}, {}, bn.weight, bn.bias, true, 0.1, 1e-5), {1e-6, 1e-6});
  test::check_close(bn.running_mean, x.mean({0, 2, 3, 4}) * 0.1, {1e-6, 1e-6});
  test::check_error([&] { bn(ramp({3, 2, 4}).to(kFloat32)); }, {"BatchNorm3d", "5D"});
}

TEST_CASE("resampling and instance norm: bad arguments are Errors that say what is wrong", "[nn][resample][errors]") {
  const Tensor x = ramp({1, 2, 4, 5});
  test::check_error([&] { pad(x[0], {5, 1}, "reflect"); }, {"reflect", "below its size 5"});
  test::check_error([&] { pad(x, {1, 1}, "wrap"); }, {"mode must be", "\"wrap\""});
  test::check_error([&] { pad(x[0], {1, 1}, "reflect", 2.0); }, {"takes no value"});
  test::check_error([&] { pad(x, {1, 1, 1, 1, 1, 1, 1, 1}, "replicate"); }, {"1, 2 or 3 trailing dims"});
  test::check_error([&] { pad(x[0], {1, 1, 1, 1, 1, 1}, "replicate"); }, {"4-D or 5-D input", "[2, 4, 5]"});
  test::check_error([&] { pad(x[0], {-3, 3}, "circular"); }, {"circular", "at most the size left after cropping, 2"});
  test::check_error([&] { nn::interpolate(x, {.size = {8, 8}, .scale_factor = {2}}); }, {"either size or scale_factor"});
  test::check_error([&] { nn::interpolate(x, {.scale_factor = {2}, .mode = "linear"}); }, {"\"linear\" takes a 3-D"});
  test::check_error([&] { nn::interpolate(x, {.scale_factor = {2}, .align_corners = true}); },
                    {"align_corners", "not mode \"nearest\""});
  test::check_error([&] { nn::interpolate(x.to(kInt64), {.size = {3, 3}, .mode = "bilinear"}); },
                    {"floating input", "int64"});
  test::check_error([&] { nn::interpolate(x, {.scale_factor = {0.1}}); }, {"sizes must be above 0"});
  test::check_error([&] { nn::interpolate(x, {.size = {2, 3, 4}}); }, {"one value or one per spatial dim (2)"});
  test::check_error([&] { nn::interpolate(ramp({1, 1, 2, 2, 2}), {.size = {1}, .mode = "area"}); }, {"area", "4-D"});
  test::check_error([&] { nn::interpolate(x, {.size = {3}, .mode = "cubic"}); }, {"mode must be", "\"cubic\""});
  test::check_error([&] { pixel_shuffle(x, 2); }, {"channels (2)", "upscale_factor^2 (4)"});
  test::check_error([&] { pixel_unshuffle(x, 2); }, {"width 5", "downscale_factor 2"});
  test::check_error([&] { nn::instance_norm(ramp({2, 3, 1})); }, {"more than one spatial element"});
  test::check_error([&] { nn::ReflectionPad2d({1, 2, 3}); }, {"one padding or 4"});
  nn::InstanceNorm2d affine(3, {.affine = true});
  test::check_error([&] { affine(x); }, {"InstanceNorm2d", "expected 3 channels", "[1, 2, 4, 5]"});
  test::check_error([&] { affine(ramp({3, 4})); }, {"expected 4D (batched) or 3D (unbatched)"});
}

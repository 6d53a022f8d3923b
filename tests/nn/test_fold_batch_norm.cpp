// tests/nn/test_fold_batch_norm.cpp: nn::utils::fuse_conv_bn_eval and fuse_linear_bn_eval (nn/fusion.h)
// against the composition they replace, bn(layer(x)) in evaluation mode, in float64: every convolution
// kind (a transposed one in groups, which PyTorch's transpose = True does not fold), with and without
// a bias, a BatchNorm without affine, Linear; and the Errors.
#include "support.h"

using namespace kiln;

namespace {

// A BatchNorm in evaluation mode with running statistics and affine parameters that are not the
// defaults, as after training.
template <class BN>
void trained(BN& bn, double seed) {
  NoGradGuard no_grad;
  const int64_t c = bn.num_features;
  bn.running_mean.copy_(test::sample({c}, kFloat64, seed));
  bn.running_var.copy_(test::sample({c}, kFloat64, seed + 1).abs() + 0.2);
  if (bn.weight.defined()) bn.weight.copy_(test::sample({c}, kFloat64, seed + 2));
  if (bn.bias.defined()) bn.bias.copy_(test::sample({c}, kFloat64, seed + 3));
  bn.eval();
}

// layer then bn, and then layer alone after folding bn into it: the same outputs.
template <class Layer, class BN>
void check_fold(Layer& layer, BN& bn, const Tensor& x) {
  layer.to(kFloat64);
  bn.to(kFloat64);
  trained(bn, 0.7);
  layer.eval();
  const Tensor before = bn(layer(x));
  const Tensor weight = layer.weight;  // the handle, which the fold keeps
  if constexpr (std::is_same_v<Layer, nn::Linear>) {
    nn::utils::fuse_linear_bn_eval(layer, bn);
  } else {
    nn::utils::fuse_conv_bn_eval(layer, bn);
  }
  CHECK(weight.is_same(layer.weight));
  REQUIRE(layer.bias.defined());
  CHECK(layer.get_parameter("bias").is_same(layer.bias));
  test::check_close(layer(x), before, {1e-12, 1e-12});
}

}  // namespace

TEST_CASE("fuse_conv_bn_eval and fuse_linear_bn_eval give what the BatchNorm after the layer gave",
          "[nn][fusion_utils]") {
  const Tensor images = test::sample({2, 4, 6, 5}, kFloat64, 0.2);
  {
    nn::Conv2d conv(4, 6, 3, {.padding = 1});
    nn::BatchNorm2d bn(6);
    check_fold(conv, bn, images);
  }
  {
    nn::Conv2d conv(4, 6, {3, 2}, {.stride = 2, .groups = 2, .bias = false});  // a bias is added
    nn::BatchNorm2d bn(6, {.affine = false});
    check_fold(conv, bn, images);
    CHECK(conv.to_string().starts_with("Conv2d(4, 6, kernel_size=(3, 2), stride=(2, 2), groups=2)"));
  }
  {
    nn::Conv1d conv(4, 3, 3);
    nn::BatchNorm1d bn(3);
    check_fold(conv, bn, test::sample({2, 4, 9}, kFloat64, 0.4));
  }
  {
    nn::Conv3d conv(2, 3, 2);
    nn::BatchNorm3d bn(3);
    check_fold(conv, bn, test::sample({1, 2, 4, 3, 5}, kFloat64, 0.5));
  }
  {
    nn::ConvTranspose2d conv(4, 6, 3, {.stride = 2, .groups = 2});  // weight (4, 3, 3, 3)
    nn::BatchNorm2d bn(6);
    check_fold(conv, bn, images);
  }
  {
    nn::ConvTranspose1d conv(4, 2, 3, {.bias = false});
    nn::BatchNorm1d bn(2);
    check_fold(conv, bn, test::sample({2, 4, 7}, kFloat64, 0.6));
  }
  {
    nn::ConvTranspose3d conv(2, 4, 2);
    nn::BatchNorm3d bn(4);
    check_fold(conv, bn, test::sample({1, 2, 3, 3, 2}, kFloat64, 0.8));
  }
  {
    nn::Linear linear(5, 4);
    nn::BatchNorm1d bn(4);
    check_fold(linear, bn, test::sample({3, 5}, kFloat64, 0.9));
  }
}

TEST_CASE("fuse_conv_bn_eval refuses training mode, other channels and BatchNorms without statistics",
          "[nn][fusion_utils][errors]") {
  nn::Conv2d conv(3, 4, 3);
  nn::BatchNorm2d bn(4);
  test::check_error([&] { nn::utils::fuse_conv_bn_eval(conv, bn); },
                    {"fuse_conv_bn_eval", "evaluation only", "eval()"});
  conv.eval();
  bn.eval();
  nn::BatchNorm2d five(5);
  five.eval();
  test::check_error([&] { nn::utils::fuse_conv_bn_eval(conv, five); },
                    {"fuse_conv_bn_eval", "BatchNorm has 5 channels but the layer 4 outputs"});
  nn::BatchNorm2d batch_only(4, {.track_running_stats = false});
  batch_only.eval();
  test::check_error([&] { nn::utils::fuse_conv_bn_eval(conv, batch_only); },
                    {"fuse_conv_bn_eval", "no running statistics"});
  test::check_error(
      [] {
        nn::utils::fuse_conv_bn_weights(ones({4, 3, 3, 3}), {}, zeros({5}), ones({5}), 1e-5, {}, {});
      },
      {"fuse_conv_bn_weights", "4 output channels (dim 0), the BatchNorm 5"});
}

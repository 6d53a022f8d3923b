// tests/nn/test_conv_norm.cpp: the convolution, pooling, normalisation and dropout layers against
// PyTorch (gen_nn_golden.py), and their train/eval behaviour.
#include "nn_golden.h"

using namespace kiln;
using kiln::test::check_layer;

TEST_CASE("Conv2d matches torch: stride, padding, dilation, groups, 'same' (even kernels) and 'valid'",
          "[nn][layers][conv]") {
  nn::Conv2d plain(2, 3, 3);
  check_layer(plain, "conv2d");
  nn::Conv2d strided(2, 4, {3, 2}, {.stride = {2, 1}, .padding = {1, 2}});
  check_layer(strided, "conv2d_stride_pad");
  nn::Conv2d grouped(4, 6, 3, {.dilation = 2, .groups = 2, .bias = false});
  check_layer(grouped, "conv2d_dilation_groups");
  nn::Conv2d same_even(2, 3, {4, 2}, {.padding = "same"});
  check_layer(same_even, "conv2d_same_even");
  nn::Conv2d same_dilated(2, 2, 3, {.padding = "same", .dilation = {1, 2}});
  check_layer(same_dilated, "conv2d_same_dilated");
  nn::Conv2d valid(2, 2, 3, {.padding = "valid"});
  check_layer(valid, "conv2d_valid");
}

TEST_CASE("Conv1d matches torch", "[nn][layers][conv]") {
  nn::Conv1d a(3, 4, 3, {.stride = 2, .padding = 1});
  check_layer(a, "conv1d");
  nn::Conv1d same(2, 2, 4, {.padding = "same", .groups = 2});
  check_layer(same, "conv1d_same_even");
}

TEST_CASE("ConvTranspose2d and ConvTranspose1d match torch: every option, unbatched, output_size, and their reprs",
          "[nn][layers][conv]") {
  nn::ConvTranspose2d plain(3, 2, 3);
  check_layer(plain, "conv_transpose2d");
  CHECK(plain.weight.sizes() == Shape{3, 2, 3, 3});  // (C_in, C_out / groups, kH, kW)
  nn::ConvTranspose2d opts(4, 6, {3, 2},
                           {.stride = {2, 3}, .padding = {1, 0}, .output_padding = {1, 2}, .groups = 2, .bias = false,
                            .dilation = {1, 2}});
  check_layer(opts, "conv_transpose2d_opts");
  nn::ConvTranspose2d unbatched(2, 3, 2, {.stride = 2});
  check_layer(unbatched, "conv_transpose2d_unbatched");
  nn::ConvTranspose1d one_d(3, 4, 3, {.stride = 2, .padding = 1, .output_padding = 1});
  check_layer(one_d, "conv_transpose1d");
  // output_size picks the output padding: (4 - 1) * 2 - 2 + 2 + 1 = 7 rows at least, 8 asked for.
  const test::NnCase& c = test::nn_case("conv_transpose2d_output_size");
  nn::ConvTranspose2d sized(2, 3, 3, {.stride = 2, .padding = 1});
  sized.to(kFloat64);
  sized.load_state_dict(c.state());
  test::check_close(sized.forward(c.at("in.0"), Shape{8, 10}), c.at("out"));
  test::check_close(sized.forward(c.at("in.0"), Shape{1, 3, 8, 10}), c.at("out"));
  test::check_error([&] { sized.forward(c.at("in.0"), Shape{9, 10}); },
                    {"nn::ConvTranspose2d", "output size of [9, 10]", "from 7 to 8"});
  test::check_error([&] { sized.forward(c.at("in.0"), Shape{8}); }, {"nn::ConvTranspose2d", "2 or 4 elements"});
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::ConvTranspose2d>(3, 2, 3));
  reprs.push_back(std::make_shared<nn::ConvTranspose2d>(
      4, 6, nn::Size2{3, 2},
      nn::ConvTranspose2dOptions{
          .stride = {2, 3}, .padding = {1, 0}, .output_padding = {1, 2}, .groups = 2, .bias = false, .dilation = {1, 2}}));
  reprs.push_back(std::make_shared<nn::ConvTranspose1d>(
      3, 4, 3, nn::ConvTranspose1dOptions{.stride = 2, .padding = 1, .output_padding = 1}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("conv_transpose_reprs").strings.at("repr"));
  // Bad arguments: Errors that name them.
  test::check_error([] { nn::ConvTranspose2d(3, 4, 3, {.groups = 2}); }, {"nn::ConvTranspose2d", "divisible by groups"});
  test::check_error([] { nn::functional::conv_transpose2d(ones({1, 2, 4, 4}), ones({3, 2, 2, 2})); },
                    {"conv_transpose2d", "2 channels", "expects 3"});
  test::check_error([] { nn::functional::conv_transpose2d(ones({1, 2, 4, 4}), ones({2, 2, 2})); },
                    {"conv_transpose2d", "4-D weight"});
  test::check_error([] { nn::functional::conv_transpose2d(ones({1, 2, 4, 4}), ones({2, 2, 2, 2}), {}, {2, 2}, {0, 0},
                                                          {2, 0}); },
                    {"conv_transpose2d", "output_padding [2, 0]", "smaller than either stride or dilation"});
  test::check_error([] { nn::functional::conv_transpose2d(ones({1, 2, 2, 2}), ones({2, 2, 2, 2}), {}, {1, 1}, {3, 3}); },
                    {"conv_transpose2d", "output would be empty"});
  test::check_error([] { nn::functional::conv_transpose2d(ones({1, 2, 4, 4}), ones({2, 2, 2, 2}), ones({3})); },
                    {"conv_transpose2d", "bias", "2 elements"});
  test::check_error([] { nn::functional::conv_transpose1d(ones({1, 2, 4}), ones({2, 2, 2}), {}, 1, -1); },
                    {"conv_transpose1d", "non-negative"});
  test::check_error([] { nn::functional::conv_transpose1d(ones({1, 3, 4}), ones({2, 2, 2})); },
                    {"conv_transpose1d", "[1, 3, 4] has 3 channels", "expects 2"});
  test::check_error([] { nn::functional::conv_transpose1d(ones({1, 2, 4}), ones({2, 2, 2}), {}, 2, 0, 2); },
                    {"conv_transpose1d", "output_padding 2", "stride (2) or dilation (1)"});
  test::check_error([] { nn::functional::conv_transpose2d(ones({1, 2, 4, 4}), ones({2, 2, 0, 2})); },
                    {"conv_transpose2d", "kernel sizes must be positive"});
  test::check_error([] { nn::functional::conv_transpose2d(ones({1, 2, 0, 4}), ones({2, 2, 2, 2})); },
                    {"conv_transpose2d", "non-empty height and width"});
}

TEST_CASE("ConvTranspose3d matches torch: every option on each dim, unbatched, output_size, and its repr",
          "[nn][layers][conv]") {
  nn::ConvTranspose3d full(4, 6, {2, 3, 2},
                           {.stride = {2, 1, 2}, .padding = {0, 1, 1}, .output_padding = {1, 0, 1}, .groups = 2,
                            .dilation = {1, 1, 2}});
  check_layer(full, "conv_transpose3d");
  nn::ConvTranspose3d unbatched(2, 3, 2, {.bias = false});
  check_layer(unbatched, "conv_transpose3d_unbatched");
  // output_size picks the output padding: depth (3 - 1) * 2 - 2 + 2 + 1 = 5 at least, 6 asked for.
  const test::NnCase& c = test::nn_case("conv_transpose3d_output_size");
  nn::ConvTranspose3d sized(2, 3, 3, {.stride = 2, .padding = 1});
  sized.to(kFloat64);
  sized.load_state_dict(c.state());
  test::check_close(sized.forward(c.at("in.0"), Shape{6, 8, 4}), c.at("out"));
  test::check_error([&] { sized.forward(c.at("in.0"), Shape{7, 8, 4}); },
                    {"nn::ConvTranspose3d", "output size of [7, 8, 4]", "from 5 to 6"});
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::ConvTranspose3d>(3, 2, 3));
  reprs.push_back(std::make_shared<nn::ConvTranspose3d>(
      4, 6, nn::Size3{2, 3, 2},
      nn::ConvTranspose3dOptions{.stride = {2, 1, 2},
                                 .padding = {0, 1, 1},
                                 .output_padding = {1, 0, 1},
                                 .groups = 2,
                                 .bias = false,
                                 .dilation = {1, 1, 2}}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("conv_transpose3d_reprs").strings.at("repr"));
  // It is conv3d's adjoint: <conv3d(x, w), y> == <x, conv_transpose3d(y, w)> with the same arguments.
  const Tensor x = test::sample({2, 4, 5, 6, 7}, kFloat64), w = test::sample({6, 2, 2, 3, 2}, kFloat64, 1.3);
  const Shape stride{2, 1, 3}, padding{1, 1, 0}, dilation{2, 1, 1};
  const Tensor y = conv3d(x, w, {}, stride, padding, dilation, 2);
  const Tensor cot = test::sample(y.sizes(), kFloat64, 0.7);
  const Tensor back = nn::functional::conv_transpose3d(cot, w, {}, stride, padding, {0, 0, 2}, 2, dilation);
  REQUIRE(back.sizes() == x.sizes());
  CHECK((y * cot).sum().item<double>() == Approx((x * back).sum().item<double>()).epsilon(1e-12));
  // Bad arguments: Errors that name them.
  using nn::functional::conv_transpose3d;
  test::check_error([] { conv_transpose3d(ones({1, 2, 3, 3, 3}), ones({3, 2, 2, 2, 2})); },
                    {"conv_transpose3d", "2 channels", "expects 3"});
  test::check_error([] { conv_transpose3d(ones({1, 2, 3, 3, 3}), ones({2, 2, 2, 2})); },
                    {"conv_transpose3d", "5-D weight"});
  test::check_error([] { conv_transpose3d(ones({2, 3, 3, 3}), ones({2, 2, 2, 2, 2}), {}, {2}, {0}, {2}); },
                    {"conv_transpose3d", "output_padding [2]", "smaller than either stride or dilation"});
  test::check_error([] { conv_transpose3d(ones({1, 2, 2, 3, 3}), ones({2, 2, 2, 2, 2}), {}, {1}, {3, 0, 0}); },
                    {"conv_transpose3d", "output depth would be", "padding [3, 0, 0]"});
  test::check_error([] { conv_transpose3d(ones({1, 2, 2, 3, 3}), ones({2, 2, 2, 2, 2}), ones({3})); },
                    {"conv_transpose3d", "bias", "2 elements"});
  test::check_error([] { conv_transpose3d(ones({1, 2, 2, 3, 3}), ones({2, 2, 2, 2, 2}), {}, {1, 1}); },
                    {"conv_transpose3d", "stride", "one or three"});
  test::check_error([] { conv_transpose3d(ones({1, 3, 2, 3, 3}), ones({3, 2, 2, 2, 2}), {}, {1}, {0}, {0}, 2); },
                    {"conv_transpose3d", "3 input channels", "divisible by groups 2"});
  test::check_error([] { nn::ConvTranspose3d(3, 4, 3, {.groups = 2}); }, {"nn::ConvTranspose3d", "divisible by groups"});
}

TEST_CASE("Conv3d matches torch: every option on each dim, 'same', 'valid', unbatched, and its repr",
          "[nn][layers][conv]") {
  nn::Conv3d plain(2, 3, 3);
  check_layer(plain, "conv3d");
  nn::Conv3d opts(4, 6, {3, 2, 3}, {.stride = {2, 1, 1}, .padding = {1, 0, 2}, .dilation = {1, 2, 1}, .groups = 2,
                                    .bias = false});
  check_layer(opts, "conv3d_opts");
  nn::Conv3d same(2, 2, {4, 3, 2}, {.padding = "same"});  // even kernels: the extra element on the right
  check_layer(same, "conv3d_same");
  nn::Conv3d valid(2, 2, 2, {.padding = "valid"});
  check_layer(valid, "conv3d_unbatched");
  CHECK(opts.weight.sizes() == Shape{6, 2, 3, 2, 3});
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::Conv3d>(2, 3, 3));
  reprs.push_back(std::make_shared<nn::Conv3d>(
      4, 6, nn::Size3{3, 2, 3},
      nn::Conv3dOptions{.stride = {2, 1, 1}, .padding = {1, 0, 2}, .dilation = {1, 2, 1}, .groups = 2, .bias = false}));
  reprs.push_back(std::make_shared<nn::Conv3d>(2, 2, 3, nn::Conv3dOptions{.padding = "same"}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("conv3d_reprs").strings.at("repr"));
  test::check_error([] { nn::Conv3d(3, 4, 3, {.groups = 2}); }, {"nn::Conv3d", "divisible by groups"});
  test::check_error([] { nn::Conv3d(2, 2, 3, {.stride = 2, .padding = "same"}); }, {"nn::Conv3d", "'same'", "strided"});
  test::check_error([] { nn::functional::conv3d(ones({1, 2, 4, 4}), ones({3, 2, 2, 2})); },
                    {"conv3d", "5-D weight", "[3, 2, 2, 2]"});
  test::check_error([] { nn::functional::conv3d(ones({1, 3, 4, 4, 4}), ones({3, 2, 2, 2, 2})); },
                    {"conv3d", "3 channels", "expects 2"});
  test::check_error([] { nn::functional::conv3d(ones({1, 2, 2, 4, 4}), ones({3, 2, 3, 2, 2})); },
                    {"conv3d", "smaller than the dilated kernel", "(2 x 4 x 4)", "(3 x 2 x 2)"});
  test::check_error([] { nn::functional::conv3d(ones({1, 2, 4, 4, 4}), ones({3, 2, 2, 2, 2}), {}, {1, 2}); },
                    {"conv3d", "stride", "one or three"});
  test::check_error([] { nn::functional::conv3d(ones({1, 2, 4, 4, 4}), ones({3, 2, 0, 2, 2})); },
                    {"conv3d", "kernel sizes must be positive", "[3, 2, 0, 2, 2]"});
}

TEST_CASE("Pooling layers match torch", "[nn][layers][pool]") {
  nn::MaxPool2d mp(2);
  check_layer(mp, "maxpool2d");
  nn::MaxPool2d mp_opts(3, {.stride = 2, .padding = 1, .ceil_mode = true});
  check_layer(mp_opts, "maxpool2d_opts");
  nn::AvgPool2d ap(2);
  check_layer(ap, "avgpool2d");
  nn::AvgPool2d ap_opts(3, {.stride = 2, .padding = 1, .count_include_pad = false});
  check_layer(ap_opts, "avgpool2d_opts");
  nn::AdaptiveAvgPool2d aap({2, 3});
  check_layer(aap, "adaptive_avgpool2d");
  nn::AdaptiveAvgPool2d aap1(1);
  check_layer(aap1, "adaptive_avgpool2d_1");
}

TEST_CASE("Adaptive poolings with nullopt (Python's None) in the output size keep the input's size there",
          "[nn][layers][pool]") {
  nn::AdaptiveAvgPool2d avg2({std::nullopt, 3});
  check_layer(avg2, "adaptive_avg_pool2d_none");  // (2, 3, 5, 7) -> (2, 3, 5, 3)
  nn::AdaptiveMaxPool2d max2({4, std::nullopt});
  check_layer(max2, "adaptive_max_pool2d_none");  // unbatched (3, 6, 5) -> (3, 4, 5)
  nn::AdaptiveAvgPool3d avg3({std::nullopt, 2, std::nullopt});
  check_layer(avg3, "adaptive_avg_pool3d_none");
  nn::AdaptiveMaxPool3d max3({2, std::nullopt, 3});
  check_layer(max3, "adaptive_max_pool3d_none");  // unbatched
  CHECK(std::get<1>(max2.forward_with_indices(randn({3, 6, 5}))).sizes() == Shape{3, 4, 5});
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::AdaptiveAvgPool2d>(nn::OptionalSize2{std::nullopt, 3}));
  reprs.push_back(std::make_shared<nn::AdaptiveMaxPool2d>(nn::OptionalSize2{4, std::nullopt}));
  reprs.push_back(std::make_shared<nn::AdaptiveAvgPool3d>(nn::OptionalSize3{std::nullopt, 2, std::nullopt}));
  reprs.push_back(std::make_shared<nn::AdaptiveMaxPool3d>(nn::OptionalSize3{2, std::nullopt, 3}));
  reprs.push_back(std::make_shared<nn::AdaptiveAvgPool2d>(5));
  reprs.push_back(std::make_shared<nn::AdaptiveMaxPool3d>(2));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) ==
        test::nn_case("adaptive_pool_none_reprs").strings.at("repr"));
  // A None with an input of too few dims: the pooling's own Error about the input.
  test::check_error([&] { avg2(ones({4})); }, {"adaptive_avg_pool2d", "3-D"});
}

TEST_CASE("Adaptive max pooling layers match torch, indices and reprs included", "[nn][layers][pool]") {
  nn::AdaptiveMaxPool2d amp({3, 2});
  check_layer(amp, "adaptive_maxpool2d");
  nn::AdaptiveMaxPool2d amp_larger(4);  // overlapping windows: a gradient from several cells adds up
  check_layer(amp_larger, "adaptive_maxpool2d_larger");
  nn::AdaptiveMaxPool1d amp1(3);
  check_layer(amp1, "adaptive_maxpool1d");
  // The indices into H * W, for sin(0..209) as (2, 3, 7, 5) (torch's, as float64 in the fixture).
  Tensor x = arange(210, kFloat64).sin().view({2, 3, 7, 5});
  auto [values, indices] = amp.forward_with_indices(x);
  test::check_equal(indices.to(kFloat64), test::nn_case("adaptive_maxpool2d_indices").at("out"));
  test::check_equal(values, amp(x));
  // Ties: the first maximum in the window, as torch (ones(1, 1, 4, 4) to (2, 3); ones(2, 5) to 3).
  Tensor tie_indices = std::get<1>(nn::functional::adaptive_max_pool2d_with_indices(ones({1, 1, 4, 4}), {2, 3}));
  CHECK(tie_indices.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 8, 9, 10});
  CHECK(std::get<1>(amp1.forward_with_indices(ones({2, 5}))).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 3, 0, 1, 3});
  // An output size of 0 gives an empty result, as torch.
  CHECK(nn::functional::adaptive_max_pool2d(x, {0, 2}).sizes() == Shape{2, 3, 0, 2});
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::AdaptiveMaxPool2d>(nn::Size2{3, 2}));
  reprs.push_back(std::make_shared<nn::AdaptiveMaxPool2d>(1));
  reprs.push_back(std::make_shared<nn::AdaptiveMaxPool1d>(4));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("adaptive_maxpool_reprs").strings.at("repr"));
  test::check_error([] { nn::functional::adaptive_max_pool2d(ones({4}), {2}); }, {"adaptive_max_pool2d", "3-D", "[4]"});
  test::check_error([] { nn::functional::adaptive_max_pool2d(ones({1, 4, 4}), {1, 2, 3}); },
                    {"adaptive_max_pool2d", "output_size", "one or two"});
  test::check_error([] { nn::functional::adaptive_max_pool1d(ones({1, 4}), -1); },
                    {"adaptive_max_pool1d", "non-negative", "-1"});
  test::check_error([] { nn::functional::adaptive_max_pool1d(ones({4}), 2); }, {"adaptive_max_pool1d", "2-D", "[4]"});
}

TEST_CASE("1-D pooling layers match torch, and print as torch's", "[nn][layers][pool]") {
  nn::MaxPool1d mp(2);
  check_layer(mp, "maxpool1d");
  nn::MaxPool1d mp_opts(3, {.stride = 2, .padding = 1, .dilation = 2, .ceil_mode = true});
  check_layer(mp_opts, "maxpool1d_opts");
  nn::AvgPool1d ap_opts(3, {.stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false});
  check_layer(ap_opts, "avgpool1d_opts");
  nn::AvgPool1d ap(2);
  check_layer(ap, "avgpool1d_unbatched");
  nn::AdaptiveAvgPool1d aap(3);
  check_layer(aap, "adaptive_avgpool1d");
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::MaxPool1d>(3));
  reprs.push_back(std::make_shared<nn::MaxPool1d>(
      3, nn::MaxPool1dOptions{.stride = 2, .padding = 1, .dilation = 2, .ceil_mode = true}));
  reprs.push_back(std::make_shared<nn::AvgPool1d>(3));
  reprs.push_back(std::make_shared<nn::AvgPool1d>(3, nn::AvgPool1dOptions{.stride = 2, .padding = 1}));
  reprs.push_back(std::make_shared<nn::AdaptiveAvgPool1d>(4));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("pool1d_reprs").strings.at("repr"));
  // max_pool1d's indices index L, as torch's: the maxima of [0, 3, 1, 2, 5] in windows of 2 are at 1 and 3.
  auto [values, indices] = nn::functional::max_pool1d_with_indices(from_vector<float>({0, 3, 1, 2, 5}, {1, 5}), 2);
  CHECK(values.to_vector<float>() == std::vector<float>{3, 2});
  CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{1, 3});
}

TEST_CASE("LPPool1d/2d and the Upsample shorthands match torch, and print as torch's", "[nn][layers][pool]") {
  nn::LPPool1d lp1(2.0, 3, {.stride = 2});
  check_layer(lp1, "lppool1d");
  nn::LPPool1d lp1_ceil(1.5, 3, {.ceil_mode = true});
  check_layer(lp1_ceil, "lppool1d_ceil_unbatched");
  nn::LPPool2d lp2(2.0, {3, 2}, {.stride = {2, 1}});
  check_layer(lp2, "lppool2d");
  nn::LPPool2d lp2_ceil(3.0, 2, {.ceil_mode = true});
  check_layer(lp2_ceil, "lppool2d_ceil");
  nn::UpsamplingNearest2d nearest({.scale_factor = {2}});
  check_layer(nearest, "upsampling_nearest2d");
  nn::UpsamplingBilinear2d bilinear({.size = {5, 7}, .mode = "nearest", .align_corners = false});  // both overridden
  check_layer(bilinear, "upsampling_bilinear2d");
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::UpsamplingNearest2d>(nn::UpsampleOptions{.scale_factor = {2}}));
  reprs.push_back(std::make_shared<nn::UpsamplingBilinear2d>(nn::UpsampleOptions{.size = {5, 7}}));
  reprs.push_back(std::make_shared<nn::LPPool1d>(2.0, 3));
  reprs.push_back(std::make_shared<nn::LPPool1d>(1.5, 3, nn::LPPool1dOptions{.stride = 2, .ceil_mode = true}));
  reprs.push_back(std::make_shared<nn::LPPool2d>(2.0, 3));
  reprs.push_back(std::make_shared<nn::LPPool2d>(2.0, nn::Size2{3, 2}, nn::LPPool2dOptions{.stride = {2, 1}}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("lppool_upsampling_reprs").strings.at("repr"));
  test::check_error([] { nn::functional::lp_pool1d(ones({1, 4}), 0, 2); }, {"lp_pool1d", "norm_type must not be 0"});
  test::check_error([] { nn::functional::lp_pool2d(ones({1, 4, 4}), 2, {1, 2, 3}); },
                    {"lp_pool2d", "kernel_size", "one number or two"});
  test::check_error([] { nn::LPPool1d(2, 0); }, {"nn::LPPool1d", "kernel_size must be positive"});
  test::check_error([] { nn::LPPool2d(2, {2, -1}); }, {"nn::LPPool2d", "kernel_size must be positive"});
}

TEST_CASE("3-D pooling layers match torch, index D H W, and print as torch's", "[nn][layers][pool]") {
  nn::MaxPool3d mp({2, 3, 2}, {.stride = nn::Size3{1, 2, 2},
                               .padding = nn::Size3{1, 1, 0},
                               .dilation = nn::Size3{1, 1, 2},
                               .ceil_mode = true});
  check_layer(mp, "maxpool3d");
  nn::AvgPool3d ap(3, {.stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false});
  check_layer(ap, "avgpool3d");
  nn::AdaptiveAvgPool3d aap({2, 3, 4});
  check_layer(aap, "adaptive_avgpool3d");
  nn::AdaptiveMaxPool3d amp({3, 2, 2});
  check_layer(amp, "adaptive_maxpool3d");  // unbatched (C, D, H, W)
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::MaxPool3d>(3));
  reprs.push_back(std::make_shared<nn::MaxPool3d>(
      nn::Size3{2, 3, 1}, nn::MaxPool3dOptions{.stride = nn::Size3{1, 2, 1},
                                               .padding = nn::Size3{1, 1, 0},
                                               .dilation = nn::Size3{2, 1, 1},
                                               .ceil_mode = true}));
  reprs.push_back(std::make_shared<nn::AvgPool3d>(2));
  reprs.push_back(
      std::make_shared<nn::AvgPool3d>(nn::Size3{2, 3, 3}, nn::AvgPool3dOptions{.stride = 1, .padding = 1}));
  reprs.push_back(std::make_shared<nn::AdaptiveAvgPool3d>(2));
  reprs.push_back(std::make_shared<nn::AdaptiveAvgPool3d>(nn::Size3{2, 3, 4}));
  reprs.push_back(std::make_shared<nn::AdaptiveMaxPool3d>(nn::Size3{1, 2, 3}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("pool3d_reprs").strings.at("repr"));
  // The indices index D H W: gathering the input at them gives the maxima.
  const Tensor x = test::sample({2, 3, 5, 6, 7});
  for (auto [values, indices] : {mp.forward_with_indices(x), amp.forward_with_indices(x)}) {
    const Tensor gathered = x.reshape({2, 3, -1}).gather(2, indices.reshape({2, 3, -1})).reshape(values.sizes());
    test::check_equal(gathered, values);
  }
}

TEST_CASE("BatchNorm matches torch in train and eval mode, running statistics included", "[nn][layers][norm]") {
  nn::BatchNorm2d train_bn(3, {.momentum = 0.2});
  check_layer(train_bn, "batchnorm2d_train");  // also checks running_mean/var after the step
  CHECK(train_bn.num_batches_tracked.item<int64_t>() == 1);
  nn::BatchNorm2d eval_bn(3);
  check_layer(eval_bn, "batchnorm2d_eval", /*train=*/false);
  CHECK(eval_bn.num_batches_tracked.item<int64_t>() == 0);  // eval does not count
  nn::BatchNorm1d bn1(4);
  check_layer(bn1, "batchnorm1d_train");
  nn::BatchNorm1d bn1_3d(3, {.affine = false});
  CHECK(bn1_3d.parameters().empty());
  check_layer(bn1_3d, "batchnorm1d_3d_noaffine");
  nn::BatchNorm2d untracked(2, {.track_running_stats = false});
  CHECK(untracked.buffers().empty());
  check_layer(untracked, "batchnorm2d_no_running", /*train=*/false);  // batch statistics even in eval
  test::check_error([&] { train_bn(zeros({2, 3, 4})); }, {"BatchNorm2d", "expected 4D input (got 3D input)"});
  test::check_error([&] { train_bn(zeros({2, 5, 4, 4})); }, {"expected 3 channels", "[2, 5, 4, 4]"});
}

TEST_CASE("BatchNorm with momentum none keeps a cumulative average", "[nn][layers][norm]") {
  nn::BatchNorm1d bn(2, {.momentum = std::nullopt, .affine = false});
  Tensor a = tensor({{1.0, 2.0}, {3.0, 6.0}}), b = tensor({{5.0, 0.0}, {7.0, 0.0}});
  bn(a);
  bn(b);
  // Batch means (2, 4) then (6, 0): their average (4, 2).
  test::check_close(bn.running_mean, tensor({4.0, 2.0}));
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);
}

TEST_CASE("LayerNorm, RMSNorm and GroupNorm match torch", "[nn][layers][norm]") {
  nn::LayerNorm ln(Shape{3, 4});
  check_layer(ln, "layernorm");
  nn::LayerNorm ln_plain(6, {.eps = 1e-3, .elementwise_affine = false});
  check_layer(ln_plain, "layernorm_noaffine");
  nn::RMSNorm rms(4, {.eps = 1e-5});
  check_layer(rms, "rmsnorm");
  nn::RMSNorm rms_default(Shape{2, 3});
  check_layer(rms_default, "rmsnorm_default_eps");
  nn::GroupNorm gn(2, 4);
  check_layer(gn, "groupnorm");
}

TEST_CASE("Dropout drops while training and is the identity in eval", "[nn][layers][dropout]") {
  nn::Dropout drop(0.25);
  Tensor x = ones({200, 500});
  Tensor y = drop(x);
  std::vector<float> v = y.to_vector<float>();
  int64_t zeros_seen = 0, wrong = 0;
  for (float e : v) {
    if (e == 0) ++zeros_seen;
    else if (std::fabs(e - 1 / 0.75f) > 1e-6f) ++wrong;  // the kept ones are scaled by 1 / (1 - p)
  }
  CHECK(wrong == 0);
  double frac = static_cast<double>(zeros_seen) / static_cast<double>(v.size());
  CHECK(std::fabs(frac - 0.25) < 5 * std::sqrt(0.25 * 0.75 / static_cast<double>(v.size())));
  drop.eval();
  test::check_equal(drop(x), x);
}

TEST_CASE("a BatchNorm or InstanceNorm state dict without num_batches_tracked loads, the counter set to 0",
          "[nn][layers][state_dict]") {
  // PyTorch's _NormBase fills the counter in with 0 for such (older, or converted) state dicts; every
  // other missing key is still an Error.
  nn::BatchNorm2d src(3), dst(3);
  {
    NoGradGuard no_grad;
    src.running_mean.fill_(0.5);
    dst.num_batches_tracked.fill_(7);
  }
  TensorDict without;
  for (const auto& [k, t] : src.state_dict())
    if (k != "num_batches_tracked") without.insert(k, t);
  dst.load_state_dict(without);
  CHECK(dst.num_batches_tracked.item<int64_t>() == 0);
  test::check_equal(dst.running_mean, full({3}, 0.5));
  nn::Sequential nested{nn::Linear(2, 3), nn::InstanceNorm1d(3, {.track_running_stats = true})};
  TensorDict nested_without;
  for (const auto& [k, t] : nested.state_dict())
    if (k != "1.num_batches_tracked") nested_without.insert(k, t);
  nested.load_state_dict(nested_without);
  TensorDict no_mean;
  for (const auto& [k, t] : src.state_dict())
    if (k != "running_mean") no_mean.insert(k, t);
  test::check_error([&] { dst.load_state_dict(no_mean); }, {"missing key(s)", "running_mean"});
}

// tests/nn/test_unfold.cpp: the sliding blocks, Unfold (im2col) and Fold (col2im), against PyTorch
// (gen_nn_golden.py; the functional forms and Tensor.unfold are rows of the op table), by the
// identities that define them (a convolution is a matmul of unfold's columns; fold is unfold's
// adjoint), Tensor.unfold's overlapping windows, and their Errors.
#include <string>

#include "nn_golden.h"

using namespace kiln;
using kiln::test::check_layer;

TEST_CASE("Unfold and Fold match torch, and print as torch's", "[nn][layers][unfold]") {
  nn::Unfold unfold({2, 3}, {.dilation = {1, 2}, .padding = 1, .stride = {2, 1}});
  check_layer(unfold, "unfold_layer");
  nn::Fold fold({4, 5}, 2, {.padding = {0, 1}, .stride = {1, 2}});
  check_layer(fold, "fold_layer");
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::Unfold>(3));
  reprs.push_back(std::make_shared<nn::Unfold>(nn::Size2{2, 3}, nn::UnfoldOptions{.dilation = 2, .padding = 1,
                                                                                    .stride = {1, 2}}));
  reprs.push_back(std::make_shared<nn::Fold>(nn::Size2{5, 6}, 2));
  reprs.push_back(std::make_shared<nn::Fold>(7, nn::Size2{2, 3}, nn::FoldOptions{.padding = {1, 0}}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("unfold_fold_reprs").strings.at("repr"));
}

TEST_CASE("unfold's columns times the weight are conv2d, and fold is unfold's adjoint", "[nn][unfold]") {
  // conv2d(x, w) == w (C_out, C kh kw) @ unfold(x), every option on.
  const Tensor x = test::sample({2, 3, 7, 8}, kFloat64);
  const Tensor w = test::sample({4, 3, 2, 3}, kFloat64, 1.1);
  const Shape stride{2, 1}, padding{1, 2}, dilation{1, 2};
  const Tensor conv = conv2d(x, w, {}, stride, padding, dilation);
  const Tensor cols = nn::unfold(x, {2, 3}, dilation, padding, stride);
  const Tensor as_matmul = matmul(w.reshape({4, -1}), cols).reshape(conv.sizes());
  test::check_close(as_matmul, conv, {1e-13, 1e-13});
  // <unfold(x), y> == <x, fold(y)> for any y: fold is the adjoint, so unfold's backward.
  const Tensor y = test::sample(cols.sizes(), kFloat64, 0.3);
  const Tensor folded = nn::fold(y, {7, 8}, {2, 3}, dilation, padding, stride);
  CHECK(folded.sizes() == x.sizes());
  CHECK(folded.is_contiguous());
  CHECK((cols * y).sum().item<double>() == Approx((x * folded).sum().item<double>()).epsilon(1e-13));
  // fold(unfold(ones)) counts the blocks that cover each pixel: 3 x 3 kernel, stride 1, on 4 x 4.
  const Tensor counts = nn::fold(nn::unfold(ones({1, 1, 4, 4}), {3}), {4, 4}, {3});
  test::check_equal(counts[0][0], from_vector<float>({1, 2, 2, 1, 2, 4, 4, 2, 2, 4, 4, 2, 1, 2, 2, 1}, {4, 4}));
  // float32 and unbatched inputs keep their dtype and drop the batch dim.
  CHECK(nn::unfold(test::sample({3, 4, 4}), {2}).sizes() == Shape{12, 9});
  CHECK(nn::fold(test::sample({12, 9}), {4, 4}, {2}).dtype() == kFloat32);
}

TEST_CASE("Tensor::unfold is a view of overlapping windows whose gradient sums them", "[nn][unfold]") {
  Tensor x = arange(10, kFloat64).requires_grad_();
  Tensor windows = x.unfold(0, 4, 2);  // (4, 4): 0-3, 2-5, 4-7, 6-9
  CHECK(windows.sizes() == Shape{4, 4});
  CHECK(windows.strides() == Shape{2, 1});
  CHECK(windows.data_ptr() == x.data_ptr());
  test::check_equal(windows.select(1, 0), from_vector<double>({0, 2, 4, 6}));
  windows.sum().backward();
  // Elements 2-7 lie in two windows, the others in one.
  test::check_equal(x.grad(), from_vector<double>({1, 1, 2, 2, 2, 2, 2, 2, 1, 1}));
  // Patches of an image, as a ViT cuts them: (C, H, W) -> (C, H / p, W / p, p, p).
  const Tensor image = test::sample({3, 8, 12});
  const Tensor patches = image.unfold(1, 4, 4).unfold(2, 4, 4);
  CHECK(patches.sizes() == Shape{3, 2, 3, 4, 4});
  test::check_equal(patches[1][1][2], image[1].narrow(0, 4, 4).narrow(1, 8, 4));
  // A 0-d tensor is one window of one element, as PyTorch's.
  CHECK(scalar_tensor(5.0).unfold(0, 1, 1).sizes() == Shape{1});
}

TEST_CASE("unfold, fold and Tensor::unfold refuse bad arguments with Errors that say what to pass",
          "[nn][unfold][errors]") {
  const Tensor x = test::sample({1, 2, 3, 3});
  test::check_error([&] { nn::unfold(x, {4}); }, {"unfold", "(3, 3)", "(4, 4) kernel", "at least one"});
  test::check_error([&] { nn::unfold(x, {2}, {1}, {-1}); }, {"unfold", "padding must be non-negative"});
  test::check_error([&] { nn::unfold(x, {2}, {0}); }, {"unfold", "dilation must be positive"});
  test::check_error([&] { nn::unfold(x, {2, 2, 2}); }, {"unfold", "kernel_size", "one or two elements"});
  test::check_error([&] { nn::unfold(ones({2, 3}), {2}); }, {"unfold", "(N, C, H, W)", "2-D"});
  test::check_error([&] { nn::unfold(x, {1}, {int64_t{1} << 40}, {int64_t{1} << 61}); }, {"unfold", "too large"});
  test::check_error([] { nn::fold(ones({1, 5, 4}), {3, 3}, {2}); }, {"fold", "dim 1 (5)", "multiple", "2 x 2 = 4"});
  test::check_error([] { nn::fold(ones({1, 8, 5}), {3, 3}, {2}); },
                    {"fold", "dim 2 (5)", "number of blocks, 2 x 2 = 4", "output_size (3, 3)"});
  test::check_error([] { nn::fold(ones({1, 8, 5, 1}), {3, 3}, {2}); }, {"fold", "(N, C kh kw, L)", "4-D"});
  test::check_error([] { nn::fold(ones({1, 4, 1}), {-3, 3}, {2}); }, {"fold", "output_size must be non-negative"});
  const Tensor v = arange(10);
  test::check_error([&] { v.unfold(0, 11, 1); }, {"unfold", "size 11", "[0, 10]"});
  test::check_error([&] { v.unfold(0, 2, 0); }, {"unfold", "step must be > 0"});
  test::check_error([&] { v.unfold(1, 2, 1); }, {"unfold", "out of range"});
  test::check_error([] { scalar_tensor(1.0).unfold(0, 2, 1); }, {"unfold", "size 2", "0-d"});
}

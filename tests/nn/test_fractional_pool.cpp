// tests/nn/test_fractional_pool.cpp: nn::functional::fractional_max_pool2d / 3d and the
// FractionalMaxPool2d / 3d layers (nn/fractional_pool.cpp) against PyTorch 1.13 (goldens of
// tests/fixtures/gen_nn_golden.py, given PyTorch's _random_samples: values, indices, the input's
// gradient; output_size and output_ratio, unbatched, a single row, ties, float32), drawn samples, and
// the Errors.
#include <cmath>

#include "nn/nn_golden.h"
#include "support.h"

using namespace kiln;
using test::nn_case;

namespace {

// Runs the case's input and samples (in `dtype`) through the 2-D or 3-D function and checks the
// values, the indices and the input's gradient of <out, cot>.
void check_fmp(const std::string& name, int dims, const Shape& kernel_size, const Shape& output_size,
               const std::vector<double>& output_ratio, DType dtype = kFloat64) {
  INFO(name);
  const test::NnCase& c = nn_case(name);
  const Tensor x = c.at("in.0").to(dtype).requires_grad_(true);
  const Tensor samples = c.at("samples").to(dtype);
  auto [values, indices] =
      dims == 2
          ? nn::functional::fractional_max_pool2d_with_indices(x, kernel_size, output_size, output_ratio, samples)
          : nn::functional::fractional_max_pool3d_with_indices(x, kernel_size, output_size, output_ratio, samples);
  test::check_equal(indices, c.at("indices"));
  test::check_equal(values.to(kFloat64), c.at("out"));  // each value is one of the input's
  (values * c.at("cot").to(dtype)).sum().backward();
  const double tol = dtype == kFloat64 ? 1e-14 : 1e-6;  // overlapping windows sum several cotangents
  test::check_close(x.grad().to(kFloat64), c.at("g.in.0"), {tol, tol});
}

}  // namespace

TEST_CASE("fractional_max_pool2d and 3d match torch given its random samples: values, indices, gradients",
          "[nn][pool][fractional]") {
  check_fmp("fractional_max_pool2d", 2, {3}, {4, 5}, {});
  check_fmp("fractional_max_pool2d_ratio", 2, {2, 3}, {}, {0.5, 0.7});  // 5 x 6 windows
  check_fmp("fractional_max_pool2d_unbatched", 2, {2}, {4}, {});        // (C, H, W), samples (1, C, 2)
  check_fmp("fractional_max_pool2d_one_row", 2, {2, 2}, {1, 5}, {});    // one window: it starts at in - k
  check_fmp("fractional_max_pool2d_ties", 2, {3}, {4, 4}, {});          // equal maxima: the first is taken
  check_fmp("fractional_max_pool2d_float32", 2, {2}, {31, 29}, {}, kFloat32);
  // Samples whose window starts in float32 arithmetic (PyTorch's for a float32 input) differ from float64's.
  check_fmp("fractional_max_pool2d_float32_rounding", 2, {2}, {48, 29}, {}, kFloat32);
  check_fmp("fractional_max_pool3d", 3, {2, 3, 2}, {3, 4, 5}, {});
  check_fmp("fractional_max_pool3d_ratio_unbatched", 3, {2}, {}, {0.5, 0.6, 0.75});
  check_fmp("fractional_max_pool3d_float32", 3, {2}, {13, 11, 12}, {}, kFloat32);
}

TEST_CASE("FractionalMaxPool2d and 3d keep their samples as PyTorch's buffer and print as torch's",
          "[nn][pool][fractional]") {
  const test::NnCase& c = nn_case("fractional_max_pool2d");
  nn::FractionalMaxPool2d pool(3, {.output_size = {4, 5}, ._random_samples = c.at("samples")});
  CHECK(test::names_of(pool.named_buffers()) == std::vector<std::string>{"_random_samples"});
  auto [values, indices] = pool.forward_with_indices(c.at("in.0"));
  test::check_equal(values, c.at("out"));
  test::check_equal(indices, c.at("indices"));
  test::check_equal(pool(c.at("in.0")), c.at("out"));
  CHECK(pool.to_string().substr(0, 21) == "FractionalMaxPool2d()");

  const test::NnCase& c3 = nn_case("fractional_max_pool3d_ratio_unbatched");
  nn::FractionalMaxPool3d pool3(2, {.output_ratio = {0.5, 0.6, 0.75}, ._random_samples = c3.at("samples")});
  test::check_equal(pool3(c3.at("in.0")), c3.at("out"));
  // Without samples the layer has no buffer, and draws new ones at each call.
  nn::FractionalMaxPool3d drawn(nn::Size3(1, 2, 2), {.output_size = nn::Size3(2, 3, 3)});
  CHECK(drawn.named_buffers().empty());
  CHECK(drawn(randn({2, 3, 4, 7, 6})).sizes() == Shape{2, 3, 2, 3, 3});
}

TEST_CASE("fractional max pooling with drawn samples takes the maximum of windows that tile the input",
          "[nn][pool][fractional]") {
  // The values are the input's at the indices, and each window lies where its start can: with 16 rows,
  // 10 windows of 2, a = 14 / 9, window i starts at floor((i + u) a) - floor(u a), in [i, i + 6], so its
  // maximum's row (and column) is in [i, i + 7].
  Generator gen(7);
  const Tensor x = randn({3, 4, 16, 16}, {}, &gen);
  for (int trial = 0; trial < 5; ++trial) {
    auto [values, indices] = nn::functional::fractional_max_pool2d_with_indices(x, {2}, {10}, {}, {}, &gen);
    REQUIRE(values.sizes() == Shape{3, 4, 10, 10});
    test::check_equal(values, x.flatten(2).gather(2, indices.flatten(2)).view({3, 4, 10, 10}));
    const std::vector<int64_t> at = indices.to_vector<int64_t>();
    for (int64_t plane = 0; plane < 12; ++plane) {
      for (int64_t i = 0; i < 10; ++i) {
        for (int64_t j = 0; j < 10; ++j) {
          const int64_t q = at[(plane * 10 + i) * 10 + j], row = q / 16, col = q % 16;
          CHECK((row >= i && row <= i + 7));
          CHECK((col >= j && col <= j + 7));
        }
      }
    }
  }
  // The same generator state gives the same windows.
  Generator a(3), b(3);
  test::check_equal(nn::functional::fractional_max_pool2d(x, {3}, {}, {0.5}, {}, &a),
                    nn::functional::fractional_max_pool2d(x, {3}, {}, {0.5}, {}, &b));
  CHECK(nn::functional::fractional_max_pool2d(x, {3}, {}, {0.5}, {}, &a).sizes() == Shape{3, 4, 8, 8});
}

TEST_CASE("fractional max pooling takes the first of equal maxima and the last NaN, as PyTorch 1.13",
          "[nn][pool][fractional]") {
  // One window over each 2 x 2 plane: [1, NaN, 3, NaN] -> the NaN at 3; [2, 5, 5, 1] -> the 5 at 1 (PyTorch's
  // indices for these planes), and the gradient goes to that element only.
  const Tensor x = from_vector(std::vector<double>{1, NAN, 3, NAN, 2, 5, 5, 1}, {2, 1, 2, 2}).requires_grad_(true);
  auto [values, indices] = nn::functional::fractional_max_pool2d_with_indices(x, {2}, {1}, {}, rand({2, 1, 2}));
  CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{3, 1});
  CHECK(std::isnan(values.to_vector<double>()[0]));
  CHECK(values.to_vector<double>()[1] == 5.0);
  values.sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 1, 0, 1, 0, 0});
}

TEST_CASE("fractional max pooling's Errors name the argument and what to do", "[nn][pool][fractional][errors]") {
  namespace F = nn::functional;
  const Tensor x = randn({2, 3, 8, 8});
  const Tensor s = rand({2, 3, 2});
  test::check_error([&] { F::fractional_max_pool2d(x, {2}); },
                    {"fractional_max_pool2d", "output_size or an output_ratio"});
  test::check_error([&] { F::fractional_max_pool2d(x, {2}, {4}, {0.5}); },
                    {"only one of output_size and output_ratio"});
  test::check_error([&] { F::fractional_max_pool2d(x, {2}, {}, {1.0}); }, {"output_ratio must be between 0 and 1"});
  test::check_error([&] { F::fractional_max_pool2d(x, {2}, {}, {0.05}); }, {"output height is 0", "at least 1"});
  test::check_error([&] { F::fractional_max_pool2d(x, {4}, {6}); }, {"pool height 4 too large", "input height 8"});
  test::check_error([&] { F::fractional_max_pool2d(x, {2, 2, 2}, {4}); }, {"kernel_size must have one or two elements"});
  test::check_error([&] { F::fractional_max_pool2d(x, {0}, {4}); }, {"kernel_size must be positive"});
  test::check_error([&] { F::fractional_max_pool2d(x.flatten(1), {2}, {4}); }, {"expected a 3-D", "or 4-D"});
  test::check_error([&] { F::fractional_max_pool2d(x.to(kInt64), {2}, {4}); }, {"floating input", "int64"});
  test::check_error([&] { F::fractional_max_pool2d(randn({2, 0, 8, 8}), {2}, {4}); }, {"non-zero sizes"});
  test::check_error(
      [&] {
        F::fractional_max_pool2d(x, {2}, {4}, {}, rand({1, 3, 2}));
      },
      {"_random_samples must have shape (2, 3, 2)", "got [1, 3, 2]"});
  test::check_error([&] { F::fractional_max_pool2d(x, {2}, {4}, {}, s + 1.0); }, {"must lie in [0, 1)"});
  test::check_error([&] { F::fractional_max_pool3d(x.flatten(2), {2}, {4}); },
                    {"fractional_max_pool3d", "4-D (unbatched"});
  test::check_error([&] { nn::FractionalMaxPool2d(2, {}); }, {"FractionalMaxPool2d requires specifying either"});
  test::check_error([&] { nn::FractionalMaxPool2d(2, {.output_size = 4, .output_ratio = {0.5}}); },
                    {"only one of output_size and output_ratio"});
  test::check_error(
      [&] {
        nn::FractionalMaxPool3d(2, {.output_ratio = {0.5, 1.5, 0.5}});
      },
      {"FractionalMaxPool3d", "output_ratio must be between 0 and 1 (got 1.5)"});
}

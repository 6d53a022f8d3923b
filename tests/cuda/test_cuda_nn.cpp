// tests/cuda/test_cuda_nn.cpp: the CUDA nn kernels (cuda/conv.cu, pool.cu, norm.cu) against the CPU
// oracle, through the public ops: each case runs the op on the CPU and on cuda:0 with the same
// inputs, compares the outputs, then back-propagates the same cotangent and compares every input's
// gradient. float32 and float64; 16-bit floats run in float32 (ops/) and are checked once. Skipped
// (exit 77) without a GPU, like test_cuda.cpp.
#include <cmath>
#include <functional>

#include "support.h"

using namespace kiln;

namespace {

const Device kGpu = Device::cuda(0);

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// fn on CPU leaves and on GPU leaves holding the same values: outputs, then (with the same
// cotangent) each input's gradient, within tol.
void check_against_cpu(const std::vector<Tensor>& inputs, const Fn& fn, test::Tolerance tol) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& t : inputs) {
    cpu.push_back(t.detach().clone().requires_grad_());
    gpu.push_back(t.detach().to(kGpu).requires_grad_());
  }
  Tensor y = fn(cpu), yg = fn(gpu);
  REQUIRE(yg.device() == kGpu);
  {
    INFO("forward");
    test::check_close(yg.cpu(), y, tol);
  }
  Tensor cotangent = test::sample(y.sizes(), y.dtype(), 0.7);
  y.backward(cotangent);
  yg.backward(cotangent.to(kGpu));
  for (size_t i = 0; i < inputs.size(); ++i) {
    INFO("gradient of input " << i);
    REQUIRE(gpu[i].grad().defined());
    test::check_close(gpu[i].grad().cpu(), cpu[i].grad(), tol);
  }
}

test::Tolerance conv_tolerance(DType dt) {
  return dt == kFloat32 ? test::Tolerance{1e-4, 1e-4} : test::tolerance_for(dt);
}

struct ConvCase {
  const char* name;
  Shape x, w;
  bool bias;
  Shape stride, padding, dilation;
  int64_t groups;
};

}  // namespace

TEST_CASE("CUDA conv2d and its gradients match the CPU", "[gpu][conv]") {
  const ConvCase cases[] = {
      {"stride 2, padding 1", {2, 4, 9, 11}, {6, 4, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 1},
      {"\"same\" (3x3, padding 1)", {2, 3, 8, 8}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {"dilation 2, padding 2", {1, 3, 7, 9}, {5, 3, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}, 1},
      {"groups 2", {5, 4, 8, 8}, {6, 2, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 2},
      {"depthwise", {2, 4, 7, 9}, {4, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4},
      {"depthwise, multiplier 2, stride 2", {2, 4, 7, 9}, {8, 1, 3, 3}, false, {2, 2}, {1, 1}, {1, 1}, 4},
      {"no bias, 1x3x7x9", {1, 3, 7, 9}, {2, 3, 3, 3}, false, {1, 1}, {0, 0}, {1, 1}, 1},
      {"1x1, batch 5", {5, 3, 7, 9}, {4, 3, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1},
      {"asymmetric: kernel 2x5, stride (2, 1), padding (0, 2), dilation (1, 2)",
       {3, 2, 9, 13}, {3, 2, 2, 5}, true, {2, 1}, {0, 2}, {1, 2}, 1},
      {"kernel as large as the padded input", {2, 2, 5, 4}, {3, 2, 7, 6}, true, {1, 1}, {1, 1}, {1, 1}, 1},
  };
  for (DType dt : {kFloat32, kFloat64}) {
    for (const ConvCase& c : cases) {
      INFO(c.name << ", " << dtype_name(dt));
      std::vector<Tensor> inputs = {test::sample(c.x, dt, 0.1), test::sample(c.w, dt, 0.9)};
      if (c.bias) inputs.push_back(test::sample({c.w[0]}, dt, 2.3));
      check_against_cpu(
          inputs,
          [&](const std::vector<Tensor>& in) {
            return conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.padding, c.dilation,
                          c.groups);
          },
          conv_tolerance(dt));
    }
  }
}

TEST_CASE("CUDA conv2d with nn::Conv2d's \"same\" padding (even kernel: one extra row and column)",
          "[gpu][conv]") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    nn::Conv2d conv{3, 4, 4, {.padding = "same"}};
    conv.to(dt);
    Tensor x = test::sample({2, 3, 7, 9}, dt, 0.4);
    Tensor y = conv.forward(x);
    conv.to(kGpu);
    Tensor yg = conv.forward(x.to(kGpu));
    CHECK(yg.sizes() == Shape{2, 4, 7, 9});
    test::check_close(yg.cpu(), y, conv_tolerance(dt));
  }
}

TEST_CASE("CUDA conv1d and the double backward of conv2d match the CPU", "[gpu][conv]") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    check_against_cpu({test::sample({3, 4, 17}, dt, 0.2), test::sample({6, 2, 5}, dt, 1.1)},
                      [](const std::vector<Tensor>& in) { return conv1d(in[0], in[1], {}, 2, 2, 1, 2); },
                      conv_tolerance(dt));
    // The gradients of conv2d_backward_input are a conv2d and a conv2d_backward_weight.
    check_against_cpu({test::sample({2, 6, 4, 5}, dt, 0.3), test::sample({6, 3, 3, 3}, dt, 1.7)},
                      [](const std::vector<Tensor>& in) {
                        return conv2d_backward_input(in[0], in[1], {2, 3, 8, 9}, {2, 2}, {1, 1}, {1, 1}, 1);
                      },
                      conv_tolerance(dt));
  }
}

TEST_CASE("CUDA max_pool2d: values, indices and gradients match the CPU", "[gpu][pool]") {
  struct Case {
    const char* name;
    Shape x, kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  const Case cases[] = {
      {"2x2, stride 2", {2, 3, 8, 10}, {2, 2}, {}, {0, 0}, {1, 1}, false},
      {"3x3, stride 2, padding 1", {2, 3, 9, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {"3x3, stride 1, padding 1, dilation 2", {1, 2, 9, 8}, {3, 3}, {1, 1}, {1, 1}, {2, 2}, false},
      {"3x2, stride (2, 3), ceil_mode", {2, 2, 10, 11}, {3, 2}, {2, 3}, {0, 1}, {1, 1}, true},
      {"2x2, stride 2, ceil_mode on odd sizes", {1, 3, 7, 9}, {2, 2}, {}, {0, 0}, {1, 1}, true},
      {"overlapping 3x3, stride 1", {2, 2, 6, 7}, {3, 3}, {1, 1}, {0, 0}, {1, 1}, false},
  };
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Case& c : cases) {
      INFO(c.name << ", " << dtype_name(dt));
      Tensor x = test::sample(c.x, dt, 0.6);
      auto [y, idx] = max_pool2d_with_indices(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
      auto [yg, idxg] =
          max_pool2d_with_indices(x.to(kGpu), c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
      test::check_equal(yg.cpu(), y);
      test::check_equal(idxg.cpu(), idx);
      check_against_cpu(
          {x},
          [&](const std::vector<Tensor>& in) {
            return max_pool2d(in[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
          },
          test::tolerance_for(dt));
    }
  }
}

TEST_CASE("CUDA max_pool2d lets NaN win, as the CPU", "[gpu][pool]") {
  std::vector<double> values(2 * 6 * 6);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.7 * static_cast<double>(i));
  values[7] = NAN;
  values[6] = NAN;  // two NaNs in one window (rows 0-1, columns 0-1): the later one's index
  values[40] = -INFINITY;
  Tensor x = from_vector(values, {1, 2, 6, 6}).to(kFloat32);
  auto [y, idx] = max_pool2d_with_indices(x, {2, 2}, {}, {0, 0}, {1, 1}, false);
  auto [yg, idxg] = max_pool2d_with_indices(x.to(kGpu), {2, 2}, {}, {0, 0}, {1, 1}, false);
  test::check_close(yg.cpu(), y, test::Tolerance{0, 0});
  test::check_equal(idxg.cpu(), idx);
}

TEST_CASE("CUDA avg_pool2d and its gradient match the CPU", "[gpu][pool]") {
  struct Case {
    const char* name;
    Shape x, kernel, stride, padding;
    bool ceil_mode, count_include_pad;
    std::optional<int64_t> divisor;
  };
  const Case cases[] = {
      {"2x2", {2, 3, 8, 10}, {2, 2}, {}, {0, 0}, false, true, {}},
      {"3x3, stride 2, padding 1", {2, 3, 9, 11}, {3, 3}, {2, 2}, {1, 1}, false, true, {}},
      {"3x3, padding 1, count_include_pad false", {2, 3, 9, 11}, {3, 3}, {2, 2}, {1, 1}, false, false, {}},
      {"3x3, padding 1, divisor_override 5", {1, 2, 7, 9}, {3, 3}, {1, 1}, {1, 1}, false, true, 5},
      {"3x2, stride 2, padding (1, 1), ceil_mode", {2, 2, 10, 11}, {3, 2}, {2, 2}, {1, 1}, true, true, {}},
      {"3x3, stride 2, ceil_mode, count_include_pad false", {1, 3, 8, 8}, {3, 3}, {2, 2}, {1, 1}, true, false, {}},
      {"overlapping 4x3, stride 1, divisor_override -3", {2, 1, 7, 6}, {4, 3}, {1, 1}, {2, 1}, false, false, -3},
  };
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Case& c : cases) {
      INFO(c.name << ", " << dtype_name(dt));
      check_against_cpu(
          {test::sample(c.x, dt, 0.8)},
          [&](const std::vector<Tensor>& in) {
            return avg_pool2d(in[0], c.kernel, c.stride, c.padding, c.ceil_mode, c.count_include_pad,
                              c.divisor);
          },
          test::tolerance_for(dt));
    }
  }
}

TEST_CASE("CUDA adaptive_avg_pool2d and its gradient match the CPU", "[gpu][pool]") {
  const Shape sizes[] = {{3, 4}, {5, 2}, {1, 1}, {7, 9}, {9, 11}, {4, 7}};
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Shape& out : sizes) {
      INFO("7x9 -> " << out.str() << ", " << dtype_name(dt));
      check_against_cpu(
          {test::sample({2, 3, 7, 9}, dt, 1.3)},
          [&](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], out); },
          test::tolerance_for(dt));
    }
  }
  // Unbatched (C, H, W).
  check_against_cpu({test::sample({3, 10, 5}, kFloat64, 0.2)},
                    [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {3, 3}); },
                    test::tolerance_for(kFloat64));
}

namespace {

// Rows of length M: mostly N(0, 1)-like values; with shifted, |mean| = 1e4 and std about 1. Built in
// float64 so that both devices see the same values of dt.
Tensor norm_input(const Shape& shape, DType dt, bool shifted, double seed = 0.3) {
  Tensor x = test::sample(shape, kFloat64, seed) * 1.4;
  if (shifted) x = x + 1e4;
  return x.to(dt);
}

}  // namespace

TEST_CASE("CUDA layer_norm and rms_norm match the CPU for rows of 1, 7, 1023, 2000, 4096 and 4097",
          "[gpu][norm]") {
  // A warp per row up to 1023; a block holding the row in registers for 2000 and 4096; a block
  // walking the row for 4097.
  for (DType dt : {kFloat32, kFloat64}) {
    for (int64_t M : {1, 7, 1023, 2000, 4096, 4097}) {
      for (bool shifted : {false, true}) {
        INFO("M = " << M << (shifted ? ", |mean| = 1e4" : "") << ", " << dtype_name(dt));
        const Shape shape{3, 37, M};  // 111 rows: several blocks of warps
        check_against_cpu({norm_input(shape, dt, shifted), test::sample({M}, dt, 1.9),
                           test::sample({M}, dt, 2.9)},
                          [&](const std::vector<Tensor>& in) {
                            return layer_norm(in[0], {M}, in[1], in[2]);
                          },
                          test::tolerance_for(dt));
        check_against_cpu({norm_input(shape, dt, shifted), test::sample({M}, dt, 1.9)},
                          [&](const std::vector<Tensor>& in) { return rms_norm(in[0], {M}, in[1]); },
                          test::tolerance_for(dt));
      }
    }
    INFO("layer_norm over the last two dims, " << dtype_name(dt));
    check_against_cpu({norm_input({4, 5, 6}, dt, false)},
                      [](const std::vector<Tensor>& in) { return layer_norm(in[0], {5, 6}); },
                      test::tolerance_for(dt));
  }
}

TEST_CASE("CUDA layer_norm's statistics of a row with |mean| = 1e4 and std 1", "[gpu][norm]") {
  // The normalised row has mean 0 and variance 1: no digits lost to the large mean. In float32 the
  // mean itself is rounded to float32 (half an ulp of 1e4 is 4.9e-4), which shifts the row by that.
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    const double bound = dt == kFloat32 ? 2e-3 : 1e-9;
    Tensor x = norm_input({2, 4097}, dt, true, 0.1).to(kGpu);
    Tensor y = layer_norm(x, {4097}, {}, {}, 0.0).to(kFloat64).cpu();
    CHECK(std::fabs(y.mean().item<double>()) < bound);
    CHECK(y.var({1}, 0).sub(1.0).abs().max().item<double>() < bound);
  }
}

TEST_CASE("CUDA group_norm matches the CPU for groups of 1, 7, 1023 and 4097 elements", "[gpu][norm]") {
  struct Case {
    Shape x;
    int64_t groups;
  };
  const Case cases[] = {
      {{3, 4, 1, 1}, 4},      // M = 1
      {{3, 7, 1, 1}, 1},      // M = 7
      {{2, 6, 11, 31}, 2},    // M = 3 * 341 = 1023
      {{2, 2, 17, 241}, 2},   // M = 4097
      {{2, 6, 5}, 3},         // (N, C, L)
  };
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Case& c : cases) {
      for (bool shifted : {false, true}) {
        INFO(c.x.str() << " in " << c.groups << " groups" << (shifted ? ", |mean| = 1e4" : "") << ", "
                       << dtype_name(dt));
        const int64_t C = c.x[1];
        check_against_cpu({norm_input(c.x, dt, shifted), test::sample({C}, dt, 1.5), test::sample({C}, dt, 2.5)},
                          [&](const std::vector<Tensor>& in) {
                            return group_norm(in[0], c.groups, in[1], in[2]);
                          },
                          test::tolerance_for(dt));
      }
    }
  }
}

TEST_CASE("CUDA batch_norm (training and eval) matches the CPU, running statistics included",
          "[gpu][norm]") {
  const Shape shapes[] = {{7, 3}, {3, 5, 11, 31}, {17, 2, 241}, {2, 4, 3, 3}};  // 7, 1023, 4097, 18 per channel
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Shape& shape : shapes) {
      for (bool shifted : {false, true}) {
        INFO(shape.str() << (shifted ? ", |mean| = 1e4" : "") << ", " << dtype_name(dt));
        const int64_t C = shape[1];
        Tensor rm = test::sample({C}, dt, 0.5), rv = test::sample({C}, dt, 0.6).abs() + 0.5;
        Tensor rm_cpu = rm.clone(), rv_cpu = rv.clone();
        Tensor rm_gpu = rm.to(kGpu), rv_gpu = rv.to(kGpu);
        std::vector<Tensor> inputs = {norm_input(shape, dt, shifted), test::sample({C}, dt, 1.5),
                                      test::sample({C}, dt, 2.5)};
        check_against_cpu(inputs,
                          [&](const std::vector<Tensor>& in) {
                            const bool gpu = in[0].device() == kGpu;
                            return batch_norm(in[0], gpu ? rm_gpu : rm_cpu, gpu ? rv_gpu : rv_cpu, in[1],
                                              in[2], true, 0.1, 1e-5);
                          },
                          test::tolerance_for(dt));
        test::check_close(rm_gpu.cpu(), rm_cpu, test::tolerance_for(dt));
        test::check_close(rv_gpu.cpu(), rv_cpu, test::tolerance_for(dt));
        check_against_cpu(inputs,
                          [&](const std::vector<Tensor>& in) {
                            const bool gpu = in[0].device() == kGpu;
                            return batch_norm(in[0], gpu ? rm_gpu : rm_cpu, gpu ? rv_gpu : rv_cpu, in[1],
                                              in[2], false, 0.1, 1e-5);
                          },
                          test::tolerance_for(dt));
      }
    }
  }
}

TEST_CASE("CUDA nn ops take 16-bit floats (run in float32) as the CPU does", "[gpu][conv][pool][norm]") {
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    Tensor x = test::sample({2, 4, 9, 9}, dt, 0.3), w = test::sample({4, 2, 3, 3}, dt, 0.8);
    Tensor xg = x.to(kGpu), wg = w.to(kGpu);
    // One rounding to the 16-bit type apart at most.
    const test::Tolerance tol = dt == kFloat16 ? test::Tolerance{2e-3, 2e-3} : test::Tolerance{1.6e-2, 1e-2};
    test::check_close(conv2d(xg, wg, {}, {1, 1}, {1, 1}, {1, 1}, 2).cpu(),
                      conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, 2), tol);
    test::check_close(max_pool2d(xg, {3, 3}, {2, 2}, {1, 1}).cpu(), max_pool2d(x, {3, 3}, {2, 2}, {1, 1}), tol);
    test::check_close(avg_pool2d(xg, {3, 3}, {2, 2}, {1, 1}).cpu(), avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}), tol);
    test::check_close(adaptive_avg_pool2d(xg, {4, 5}).cpu(), adaptive_avg_pool2d(x, {4, 5}), tol);
    test::check_close(layer_norm(xg, {9}).cpu(), layer_norm(x, {9}), tol);
    test::check_close(group_norm(xg, 2).cpu(), group_norm(x, 2), tol);
  }
}

TEST_CASE("CUDA fractional max pooling and adaptive pooling with a None size match the CPU", "[gpu][pool]") {
  // Compositions of gather, max and the adaptive kernels (nn/fractional_pool.cpp, nn/conv.cpp): the same
  // samples give the same windows on both devices.
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    const Tensor x2 = test::sample({2, 3, 11, 9}, dt, 0.6), s2 = rand({2, 3, 2}, TensorOptions(dt));
    const Tensor x3 = test::sample({2, 2, 7, 8, 6}, dt, 0.6), s3 = rand({2, 2, 3}, TensorOptions(dt));
    auto [y2, i2] = nn::functional::fractional_max_pool2d_with_indices(x2, {3}, {5, 4}, {}, s2);
    auto [y2g, i2g] = nn::functional::fractional_max_pool2d_with_indices(x2.to(kGpu), {3}, {5, 4}, {}, s2);
    test::check_equal(y2g.cpu(), y2);
    test::check_equal(i2g.cpu(), i2);
    check_against_cpu(
        {x2},
        [&](const std::vector<Tensor>& in) {
          return nn::functional::fractional_max_pool2d(in[0], {3}, {5, 4}, {}, s2);
        },
        test::tolerance_for(dt));
    check_against_cpu(
        {x3},
        [&](const std::vector<Tensor>& in) { return nn::functional::fractional_max_pool3d(in[0], {2}, {}, {0.6}, s3); },
        test::tolerance_for(dt));
    nn::AdaptiveAvgPool2d avg({std::nullopt, 3});
    nn::AdaptiveMaxPool3d max3({2, std::nullopt, 3});
    check_against_cpu(
        {x2}, [&](const std::vector<Tensor>& in) { return avg(in[0]); }, test::tolerance_for(dt));
    check_against_cpu(
        {x3}, [&](const std::vector<Tensor>& in) { return max3(in[0]); }, test::tolerance_for(dt));
  }
}

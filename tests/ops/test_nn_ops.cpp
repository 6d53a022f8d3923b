// tests/ops/test_nn_ops.cpp: what the op table (op_table.cpp) cannot say about the nn ops:
// dropout's randomness (its exact relation to the bernoulli mask, its statistics, determinism for
// a seeded Generator, dropout_part's parts of the whole mask), the number forms of the pooling
// kernel size, and the CNN-sized conv and pool paths (the multi-threaded batch split, the 2x2
// pooling loop, im2col's spans) against an independent float64 computation, the bfloat16
// convolution kernels against float64, the 16-bit max pooling kernels against float32's, and the
// contiguous fast paths of the index kernels against their strided path and an explicit loop.
#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/scalar_math.h"
#include "support.h"

using namespace kiln;
using test::ThreadsGuard;

TEST_CASE("dropout is input * mask / (1 - p) with the Generator's bernoulli(1 - p) mask", "[ops][dropout]") {
  Tensor x = test::sample({7, 33});
  Generator g(1234), g_mask(1234);
  Tensor out = dropout(x, 0.3, true, &g);
  Tensor mask = bernoulli(x.sizes(), 0.7, x.options(), &g_mask);
  test::check_close(out, x * (mask / 0.7), test::Tolerance{0, 0});
  // Determinism: the same seed gives the same result, another seed another one.
  Generator again(1234), other(99);
  test::check_close(dropout(x, 0.3, true, &again), out, test::Tolerance{0, 0});
  CHECK_FALSE(dropout(x, 0.3, true, &other).eq(out).all().item<bool>());
}

TEST_CASE("dropout's statistics: about p of the elements are zero, the rest scaled by 1 / (1 - p)", "[ops][dropout]") {
  Generator g(7);
  const int64_t n = 200000;
  for (double p : {0.1, 0.5, 0.8}) {
    INFO("p = " << p);
    Tensor out = dropout(ones({n}), p, true, &g);
    const double zeros_fraction = out.eq(0.0).to(kFloat64).mean().item<double>();
    CHECK(zeros_fraction == Approx(p).margin(0.005));  // ~5 standard deviations at n = 200000
    CHECK(out.max().item<double>() == Approx(1 / (1 - p)).epsilon(1e-6));
    CHECK(out.masked_fill(out.eq(0.0), 1 / (1 - p)).min().item<double>() == Approx(1 / (1 - p)).epsilon(1e-6));
    CHECK(out.mean().item<double>() == Approx(1.0).margin(0.03));
  }
}

TEST_CASE("dropout: eval and p = 0 return the input, p = 1 zeros, the gradient is the scaled mask", "[ops][dropout]") {
  Tensor x = test::sample({4, 5}).requires_grad_();
  CHECK(dropout(x, 0.5, false).impl_ptr() == x.impl_ptr());
  CHECK(dropout(x, 0.0, true).impl_ptr() == x.impl_ptr());
  Tensor all_dropped = dropout(x, 1.0, true);
  test::check_close(all_dropped, zeros({4, 5}), test::Tolerance{0, 0});
  Generator g(5), g_mask(5);
  Tensor out = dropout(x, 0.25, true, &g);
  out.sum().backward();
  Tensor mask = bernoulli({4, 5}, 0.75, kFloat32, &g_mask);
  test::check_close(x.grad(), mask / 0.75, test::Tolerance{0, 0});
}

TEST_CASE("dropout_part: each part's mask is that part of the whole tensor's, and the generator moves as for it",
          "[ops][dropout]") {
  // Odd sizes, so that most parts start in the middle of a counter's pair of words.
  const Shape whole_shape{3, 7, 5, 3};
  for (int64_t dim : {0, 1, 2, 3, -1}) {
    for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
      INFO("dim " << dim << ", " << dtype_name(dt));
      Tensor x = test::sample(whole_shape).to(dt);
      const int64_t d = dim < 0 ? dim + 4 : dim, n = whole_shape[static_cast<size_t>(d)];
      Generator g_whole(42);
      Tensor expected = dropout(x, 0.4, true, &g_whole);
      // Cut into parts of 1, 2, ... along the dim (whatever is left the last).
      for (int64_t start = 0, len = 1; start < n; start += len, ++len) {
        len = std::min(len, n - start);
        INFO("part [" << start << ", " << start + len << ")");
        Generator g(42);
        Tensor out = dropout_part(x.narrow(d, start, len), 0.4, true, dim, start, n, &g);
        test::check_close(out, expected.narrow(d, start, len), test::Tolerance{0, 0});
        CHECK(g.offset() == g_whole.offset());
      }
    }
  }
  // The gradient is the part of the scaled mask; eval and p = 0 return the input, p = 1 zeros.
  Tensor x = test::sample({4, 6}).requires_grad_();
  Generator g(3), g_mask(3);
  dropout_part(x.narrow(1, 1, 3), 0.25, true, 1, 1, 6, &g).sum().backward();
  Tensor mask = bernoulli({4, 6}, 0.75, kFloat32, &g_mask) / 0.75;
  test::check_close(x.grad().narrow(1, 1, 3), mask.narrow(1, 1, 3), test::Tolerance{0, 0});
  CHECK(dropout_part(x, 0.5, false, 1, 0, 6).impl_ptr() == x.impl_ptr());
  CHECK(dropout_part(x, 0.0, true, 1, 0, 6).impl_ptr() == x.impl_ptr());
  test::check_close(dropout_part(x, 1.0, true, 1, 0, 6), zeros({4, 6}), test::Tolerance{0, 0});
  // Default generator: the same as dropout's from the same state.
  manual_seed(11);
  Tensor expected = dropout(x, 0.5, true);
  manual_seed(11);
  test::check_close(dropout_part(x.narrow(0, 2, 2), 0.5, true, 0, 2, 4), expected.narrow(0, 2, 2),
                    test::Tolerance{0, 0});
  test::check_error([&] { dropout_part(x, 0.5, true, 1, 1, 6); }, {"indices [1, 7) of dim 1", "whole tensor 6 long"});
  test::check_error([&] { dropout_part(x, 0.5, true, 2, 0, 6); }, {"dropout_part", "dim 2"});
  test::check_error([&] { dropout_part(x, 1.5, true, 1, 0, 6); }, {"dropout_part", "[0, 1]", "1.5"});
  test::check_error([&] { dropout_part(tensor({1.0f}).reshape({}), 0.5, true, 0, 0, 1); }, {"a scalar has none"});
  // A wrong cut is an Error in evaluation too.
  test::check_error([&] { dropout_part(x, 0.5, false, 1, 4, 6); }, {"indices [4, 10) of dim 1"});
}

TEST_CASE("pooling takes the kernel size as one number", "[ops][pool]") {
  Tensor x = test::sample({2, 3, 6, 6});
  test::check_close(max_pool2d(x, 2), max_pool2d(x, Shape{2, 2}, Shape{2, 2}), test::Tolerance{0, 0});
  test::check_close(avg_pool2d(x, 2), avg_pool2d(x, Shape{2, 2}, Shape{2, 2}), test::Tolerance{0, 0});
  CHECK(max_pool2d(x, 2).sizes() == Shape{2, 3, 3, 3});
}

// Average pooling by windows, in float64 through narrow and sum: each output's window clipped to the
// input, divided by PyTorch's divisor. An independent check of cpu/pool.cpp's column sums (Note
// [average pooling is separable]) and, through autograd, of its backward.
struct AvgRef {
  int64_t kh, kw, sh, sw, ph = 0, pw = 0;
  bool count_include_pad = true;
  int64_t divisor = 0;
  bool adaptive = false;
};
static Tensor avg_reference(const Tensor& x, int64_t Ho, int64_t Wo, const AvgRef& a) {
  const int64_t H = x.size(2), W = x.size(3);
  std::vector<Tensor> cells;
  for (int64_t oh = 0; oh < Ho; ++oh) {
    for (int64_t ow = 0; ow < Wo; ++ow) {
      int64_t h0, h1, w0, w1, div;
      if (a.adaptive) {
        h0 = oh * H / Ho, h1 = ((oh + 1) * H + Ho - 1) / Ho, w0 = ow * W / Wo, w1 = ((ow + 1) * W + Wo - 1) / Wo;
        div = (h1 - h0) * (w1 - w0);
      } else {
        h0 = oh * a.sh - a.ph, w0 = ow * a.sw - a.pw;
        h1 = std::min(h0 + a.kh, H + a.ph), w1 = std::min(w0 + a.kw, W + a.pw);
        const int64_t padded = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0), h1 = std::min(h1, H), w1 = std::min(w1, W);
        div = a.divisor != 0 ? a.divisor : a.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
      }
      cells.push_back(x.narrow(2, h0, h1 - h0).narrow(3, w0, w1 - w0).sum({2, 3}) / static_cast<double>(div));
    }
  }
  return stack(cells, 2).view({x.size(0), x.size(1), Ho, Wo});
}

TEST_CASE("average pooling of many planes on two threads matches a float64 sum of each window", "[ops][pool]") {
  ThreadsGuard threads(2);
  // 256 planes of 9 x 10: more than one chunk of planes, each with its own row of column sums.
  Tensor x64 = test::sample({4, 64, 9, 10}, kFloat64, 7).requires_grad_();
  Tensor x32 = x64.detach().to(kFloat32).requires_grad_();
  struct Case {
    const char* name;
    AvgRef ref;
    std::function<Tensor(const Tensor&)> pool;
  };
  const std::vector<Case> cases = {
      {"3x3 stride 2 padding 1", {3, 3, 2, 2, 1, 1}, [](const Tensor& t) { return avg_pool2d(t, {3}, {2}, {1}); }},
      {"ceil_mode without the padding", {3, 3, 2, 2, 1, 1, false},
       [](const Tensor& t) { return avg_pool2d(t, {3}, {2}, {1}, true, false); }},
      {"divisor_override 3", {2, 2, 1, 1, 1, 1, true, 3},
       [](const Tensor& t) { return avg_pool2d(t, {2}, {1}, {1}, false, true, 3); }},
      {"rectangular 3x2, stride (1, 2)", {3, 2, 1, 2, 1, 0},
       [](const Tensor& t) { return avg_pool2d(t, {3, 2}, {1, 2}, {1, 0}); }},
      {"adaptive to 4x3", {0, 0, 0, 0, 0, 0, true, 0, true}, [](const Tensor& t) { return adaptive_avg_pool2d(t, {4, 3}); }},
      {"adaptive to 13x7", {0, 0, 0, 0, 0, 0, true, 0, true},
       [](const Tensor& t) { return adaptive_avg_pool2d(t, {13, 7}); }},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    x64.set_grad(Tensor()), x32.set_grad(Tensor());
    Tensor y32 = c.pool(x32);
    Tensor ref = avg_reference(x64, y32.size(2), y32.size(3), c.ref);
    test::check_close(y32, ref, test::Tolerance{1e-6, 1e-6});
    test::check_close(c.pool(x64), ref, test::Tolerance{1e-13, 1e-13});
    Tensor cot = test::sample(y32.sizes(), kFloat64, 8);
    ref.backward(cot);
    y32.backward(cot.to(kFloat32));
    test::check_close(x32.grad(), x64.grad(), test::Tolerance{1e-6, 1e-6});
    x64.set_grad(Tensor());
    c.pool(x64).backward(cot);
    Tensor ref_grad = x64.grad();
    x64.set_grad(Tensor());
    avg_reference(x64, y32.size(2), y32.size(3), c.ref).backward(cot);
    test::check_close(ref_grad, x64.grad(), test::Tolerance{1e-13, 1e-13});
  }
}

// conv2d at stride 1 as a sum of shifted products, group by group, in float64: an independent check
// of the im2col + GEMM kernel. out[:, o] = the sum over (i, j) of w[o, :, i, j] @ the shifted input.
struct ConvRef {
  int64_t pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
};
static Tensor conv_reference(const Tensor& x, const Tensor& w, const ConvRef& a) {
  Tensor xp = a.pad_h > 0 || a.pad_w > 0 ? kiln::pad(x, {a.pad_w, a.pad_w, a.pad_h, a.pad_h}) : x;
  const int64_t kh = w.sizes()[2], kw = w.sizes()[3];
  const int64_t Ho = xp.sizes()[2] - a.dil_h * (kh - 1), Wo = xp.sizes()[3] - a.dil_w * (kw - 1);
  const int64_t cg = x.sizes()[1] / a.groups, og = w.sizes()[0] / a.groups;
  std::vector<Tensor> outs;
  for (int64_t grp = 0; grp < a.groups; ++grp) {
    Tensor xg = xp.narrow(1, grp * cg, cg), wg = w.narrow(0, grp * og, og);
    Tensor out = zeros({x.sizes()[0], og, Ho * Wo}, kFloat64);
    for (int64_t i = 0; i < kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) {
        Tensor patch = xg.narrow(2, i * a.dil_h, Ho).narrow(3, j * a.dil_w, Wo).flatten(2);  // (N, Cg, Ho*Wo)
        out = out + matmul(wg.select(3, j).select(2, i), patch);                              // (N, Og, Ho*Wo)
      }
    }
    outs.push_back(out.view({x.sizes()[0], og, Ho, Wo}));
  }
  return cat(outs, 1);
}

TEST_CASE("the CNN's conv and pool at batch 32 on several threads match a float64 reference", "[ops][conv]") {
  ThreadsGuard two_threads(2);
  Tensor x = test::sample({32, 4, 14, 14}, kFloat64);
  Tensor w = test::sample({8, 4, 3, 3}, kFloat64, 1.7) * 0.2;
  Tensor y = conv2d(x.to(kFloat32), w.to(kFloat32), {}, {1, 1}, {1, 1});
  test::check_close(y, conv_reference(x, w, {.pad_h = 1, .pad_w = 1}).to(kFloat32));
  // Backward against the reference's autograd (matmul, narrow, pad), in float64.
  Tensor xa = x.clone().requires_grad_(), wa = w.clone().requires_grad_();
  Tensor xb = x.clone().requires_grad_(), wb = w.clone().requires_grad_();
  Tensor cot = test::sample({32, 8, 14, 14}, kFloat64, 0.3);
  (conv2d(xa, wa, {}, {1, 1}, {1, 1}) * cot).sum().backward();
  (conv_reference(xb, wb, {.pad_h = 1, .pad_w = 1}) * cot).sum().backward();
  test::check_close(xa.grad(), xb.grad());
  test::check_close(wa.grad(), wb.grad());
  // 2x2 max pooling's fast loop against the general one (a 2x2 window given with padding 0 as 3 numbers
  // takes the same loop, so compare with amax over the window instead).
  Tensor pooled = max_pool2d(y, 2);
  Tensor windows = y.unflatten(3, {7, 2}).unflatten(2, {7, 2}).amax({3, 5});
  test::check_close(pooled, windows, test::Tolerance{0, 0});
}

TEST_CASE("one large image (the GEMMs split over the threads) matches a float64 reference", "[ops][conv]") {
  ThreadsGuard two_threads(2);
  Tensor x = test::sample({1, 4, 32, 32}, kFloat64);
  Tensor w = test::sample({8, 4, 3, 3}, kFloat64, 1.7) * 0.2;
  Tensor xa = x.clone().requires_grad_(), wa = w.clone().requires_grad_();
  Tensor xb = x.clone().requires_grad_(), wb = w.clone().requires_grad_();
  Tensor ya = conv2d(xa.squeeze(0), wa, {}, {1, 1}, {1, 1});  // unbatched
  Tensor yb = conv_reference(xb, wb, {.pad_h = 1, .pad_w = 1}).squeeze(0);
  test::check_close(ya, yb);
  Tensor cot = test::sample(ya.sizes(), kFloat64, 0.3);
  (ya * cot).sum().backward();
  (yb * cot).sum().backward();
  test::check_close(xa.grad(), xb.grad());
  test::check_close(wa.grad(), wb.grad());
}

TEST_CASE("stride-1 convolutions as wide as their input (im2col in spans) match a float64 reference", "[ops][conv]") {
  // cpu/conv.cpp's Note [im2col in spans]: one copy (one add, in col2im) per column row, the padding's
  // columns zeroed after. Geometries where whole rows or columns of a kernel offset fall in the padding,
  // where the output is lower than the input, dilation, rectangular kernels and groups; forward and both
  // gradients against a composition of pad, narrow and matmul in float64.
  struct Geo {
    Shape x, w;
    ConvRef a;
  };
  const std::vector<Geo> geos{
      {{3, 4, 14, 14}, {8, 4, 3, 3}, {1, 1, 1, 1, 1}},  // the CNN's second convolution, smaller
      {{2, 3, 9, 11}, {4, 3, 5, 5}, {2, 2, 1, 1, 1}},
      {{2, 3, 8, 10}, {4, 3, 3, 3}, {2, 2, 2, 2, 1}},
      {{2, 2, 2, 5}, {3, 2, 3, 3}, {3, 3, 3, 3, 1}},    // offsets +-3 leave no input row at all
      {{2, 2, 4, 1}, {3, 2, 3, 3}, {1, 1, 1, 1, 1}},    // offsets +-1 leave no input column
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {0, 1, 1, 1, 1}},    // output 5 rows high, 6 wide
      {{2, 3, 6, 7}, {4, 3, 1, 3}, {0, 1, 1, 1, 1}},
      {{2, 4, 6, 6}, {6, 2, 3, 3}, {1, 1, 1, 1, 2}},
      {{2, 3, 3, 6}, {4, 3, 3, 3}, {3, 1, 1, 1, 1}},    // output 7 rows high: whole rows of padding both ends
      {{1, 2, 2, 3}, {2, 2, 1, 3}, {5, 1, 1, 1, 1}},    // output 12 rows high, 2 of them from the input
      {{2, 4, 6, 6}, {32, 2, 3, 3}, {1, 1, 1, 1, 2}},   // 16 outputs per group: the weight's gradient transposed
  };
  for (DType dt : {kFloat32, kFloat64}) {
    for (size_t n = 0; n < geos.size(); ++n) {
      const Geo& g = geos[n];
      INFO(dtype_name(dt) << " geometry " << n);
      Tensor x = test::sample(g.x, kFloat64), w = test::sample(g.w, kFloat64, 1.3) * 0.3;
      Tensor xa = x.to(dt).clone().requires_grad_(), wa = w.to(dt).clone().requires_grad_();
      Tensor ya = conv2d(xa, wa, {}, {1, 1}, {g.a.pad_h, g.a.pad_w}, {g.a.dil_h, g.a.dil_w}, g.a.groups);
      REQUIRE(ya.size(3) == g.x[3]);
      Tensor xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_();
      Tensor yr = conv_reference(xr, wr, g.a);
      // float32: sums of up to 3 x 14 x 14 products, summed in other orders than float64's.
      const test::Tolerance tol = dt == kFloat32 ? test::Tolerance{1e-4, 1e-4} : test::tolerance_for(kFloat64);
      test::check_close(ya, yr.detach().to(dt), tol);
      Tensor cot = test::sample(yr.sizes(), kFloat64, 0.7);
      (ya * cot.to(dt)).sum().backward();
      (yr * cot).sum().backward();
      test::check_close(xa.grad(), xr.grad().to(dt), tol);
      test::check_close(wa.grad(), wr.grad().to(dt), tol);
    }
  }
}

TEST_CASE("gelu's fused backward (both forms) equals the float64 formula, in float32 and float64", "[ops][gelu]") {
  for (const char* form : {"none", "tanh"}) {
    for (DType dt : {kFloat32, kFloat64}) {
      INFO(form << " " << dtype_name(dt));
      Tensor x64 = linspace(-7, 7, 10001, kFloat64);  // contiguous runs: the vectorized path, and x < -1
      Tensor g64 = test::sample({10001}, kFloat64);
      Tensor x = x64.to(dt).requires_grad_();
      Tensor grad = autograd::grad({gelu(x, form)}, {x}, {g64.to(dt)})[0];
      // The reference: the op-composed derivative (what create_graph runs), in float64.
      Tensor xr = x64.clone().requires_grad_();
      Tensor first = autograd::grad({gelu(xr, form)}, {xr}, {g64}, true, true)[0];
      test::check_close(grad, first.detach().to(dt), dt == kFloat32 ? test::Tolerance{1e-5, 1e-5} : test::Tolerance{1e-12, 1e-13});
      // (float32: where tanh(u) rounds to -1 the tanh form loses its last ~1e-6 of value, as PyTorch's.)
      // A strided input takes the scalar loop.
      Tensor xs = x64.to(dt).narrow(0, 0, 10000).view({100, 100}).t().requires_grad_();
      Tensor gs = autograd::grad({gelu(xs, form)}, {xs}, {g64.narrow(0, 0, 10000).view({100, 100}).t().to(dt)})[0];
      test::check_close(gs, first.detach().narrow(0, 0, 10000).view({100, 100}).t().to(dt),
                        dt == kFloat32 ? test::Tolerance{1e-5, 1e-5} : test::Tolerance{1e-12, 1e-13});
    }
  }
}

TEST_CASE("gelu's Gaussian tail (x < -1) in float32 keeps its relative accuracy, forward and backward", "[ops][gelu]") {
  // Below -1, 1 + erf(x / sqrt 2) cancels; the float32 kernels take a vectorized erfc there (cpu/
  // elementwise.cpp, Note [GELU's Gaussian tail]). Checked relative to float64 (scalar erfc) on the
  // same float32 values, down to x = -12 where gelu(x) is about -2e-32: an absolute tolerance would
  // hide a lost tail.
  Tensor x32 = linspace(-12, -1.001, 6007, kFloat32);  // odd length: the chunks' tails too
  Tensor x64 = x32.to(kFloat64);
  Tensor g64 = test::sample({6007}, kFloat64) + 3.0;  // nonzero cotangents
  auto worst_relative = [](const Tensor& actual, const Tensor& expected) {
    return ((actual.to(kFloat64) - expected).abs() / expected.abs()).max().item<double>();
  };
  const double fwd = worst_relative(gelu(x32), gelu(x64));
  Tensor xr32 = x32.clone().requires_grad_(), xr64 = x64.clone().requires_grad_();
  Tensor d32 = autograd::grad({gelu(xr32)}, {xr32}, {g64.to(kFloat32)})[0];
  Tensor d64 = autograd::grad({gelu(xr64)}, {xr64}, {g64.to(kFloat32).to(kFloat64)})[0];
  const double bwd = worst_relative(d32, d64);
  INFO("worst relative error: forward " << fwd << ", backward " << bwd);
  CHECK(fwd < 1e-6);
  CHECK(bwd < 1e-6);
}

// Note [GELU's erf form in float] (core/scalar_math.h): the float GELU of the scalar loops and of the
// CUDA kernels, and the 16-bit types' (float inside). Every 4093rd float in [-16, 16] against long
// double: forward relative to gelu(x) where that is a normal float, backward relative to |Phi| +
// |x phi| (gelu' crosses 0 at x = -0.75, where no relative bound holds). Here on the host the
// reciprocal and exp2 are exact; on the GPU they are the hardware's, which the note's measurement
// takes into account.
TEST_CASE("gelu's erf form in float, the scalar form the GPU shares, is accurate to 1e-6 from -16 to 16", "[ops][gelu]") {
  auto cdf = [](long double x) { return 0.5L * std::erfc(-x / std::sqrt(2.0L)); };
  auto pdf = [](long double x) { return std::exp(-0.5L * x * x) * 0.398942280401432677940L; };
  double worst_forward = 0, worst_backward = 0;
  float at_forward = 0, at_backward = 0;
  int64_t checked = 0;
  for (uint32_t bits = 0; bits < 0x41800000u; bits += 4093) {  // |x| from 0 to 16
    for (float sign : {1.0f, -1.0f}) {
      float x;
      std::memcpy(&x, &bits, sizeof x);
      x *= sign;
      const long double xl = x, forward = xl * cdf(xl), backward = cdf(xl) + xl * pdf(xl);
      const float f = math::unary<float>(UnaryOp::GeluErf, x, 0, 0);
      const float b = math::binary<float>(BinaryOp::GeluErfBackward, 1.0f, x, 1.0f);
      if (std::fabs(static_cast<double>(forward)) >= std::numeric_limits<float>::min()) {
        const double e = static_cast<double>(std::fabs((f - forward) / forward));
        if (e > worst_forward) worst_forward = e, at_forward = x;
      }
      const long double scale = cdf(xl) + std::fabs(xl) * pdf(xl);
      if (scale >= std::numeric_limits<float>::min()) {
        const double e = static_cast<double>(std::fabs((b - backward) / scale));
        if (e > worst_backward) worst_backward = e, at_backward = x;
      }
      ++checked;
    }
  }
  INFO(checked << " values; worst forward " << worst_forward << " at " << at_forward << ", backward "
               << worst_backward << " at " << at_backward);
  CHECK(checked > 500000);
  CHECK(worst_forward < 1e-6);
  CHECK(worst_backward < 1e-6);

  // The special values as the erfc form gives them (and PyTorch's 0.5 x (1 + erf(x / sqrt 2))).
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto gelu_f = [](float x) { return math::unary<float>(UnaryOp::GeluErf, x, 0, 0); };
  auto slope_f = [](float x) { return math::binary<float>(BinaryOp::GeluErfBackward, 1.0f, x, 1.0f); };
  CHECK(gelu_f(inf) == inf);
  CHECK(std::isnan(gelu_f(-inf)));
  CHECK(std::isnan(gelu_f(nan)));
  CHECK(std::isnan(slope_f(inf)));
  CHECK(std::isnan(slope_f(-inf)));
  CHECK(std::isnan(slope_f(nan)));
  CHECK(gelu_f(0.0f) == 0.0f);
  CHECK(std::signbit(gelu_f(-0.0f)));
  CHECK(std::fabs(slope_f(0.0f) - 0.5f) < 5e-7f);  // Phi(0), from the fit
  CHECK(gelu_f(-20.0f) == 0.0f);  // gelu(-20) = -5.5e-88: below float's range
  CHECK(gelu_f(20.0f) == 20.0f);
  CHECK(slope_f(20.0f) == 1.0f);
  // A subnormal result: gelu(-13.5) = -1.1e-40, within a unit of its last place.
  const double expected = static_cast<double>(-13.5L * cdf(-13.5L));
  CHECK(std::fabs(gelu_f(-13.5f) - expected) <= std::numeric_limits<float>::denorm_min());
  // The float GELU of a strided float32 tensor goes through this scalar form on the CPU: the tail
  // keeps its relative accuracy there too.
  Tensor x32 = linspace(-13, -1.001, 6006, kFloat32).view({2, 3003}).t();
  Tensor ref = gelu(x32.to(kFloat64));
  CHECK(((gelu(x32).to(kFloat64) - ref).abs() / ref.abs()).max().item<double>() < 1e-6);
}

namespace {
bool all_nan(const Tensor& t) { return t.ne(t).all().item<bool>(); }
}  // namespace

// Note [Eigen's exp below its range] (cpu/exact_math.h): Eigen's vectorized exp gave exp(-88.72) =
// 2.9e-39 (float) or 5.6e-309 (double) for every smaller x, -inf included. Lengths 4099 and 17 put
// values in the vectorized body and in the scalar tail.
TEST_CASE("exp below Eigen's range: subnormals rounded once, 0 at -inf, in float32 and float64", "[ops][exp]") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    const bool f32 = dt == kFloat32;
    Tensor x = linspace(f32 ? -120.0 : -760.0, f32 ? -70.0 : -690.0, 4099, dt);
    const std::vector<double> xs = x.to(kFloat64).to_vector<double>();
    const std::vector<double> ys = exp(x).to(kFloat64).to_vector<double>();
    const double smallest = f32 ? 1.4012984643e-45 : 4.9406564584124654e-324;  // one subnormal ulp
    for (size_t i = 0; i < xs.size(); ++i) {
      const double expected = f32 ? static_cast<double>(static_cast<float>(std::exp(xs[i]))) : std::exp(xs[i]);
      INFO("x = " << xs[i] << ": " << ys[i] << " vs " << expected);
      CHECK(std::abs(ys[i] - expected) <= (f32 ? 1e-6 : 1e-15) * expected + smallest);
    }
    Tensor inf = full({17}, -INFINITY, dt);
    CHECK(exp(inf).eq(0).all().item<bool>());
    CHECK(sigmoid(inf).eq(0).all().item<bool>());
    CHECK(sigmoid(-inf).eq(1).all().item<bool>());
    // As PyTorch: silu(-inf) = -inf * sigmoid(-inf) and gelu'(-inf) = Phi + x * phi = -inf * 0 are nan.
    CHECK(all_nan(silu(inf)));
    Tensor xr = inf.clone().requires_grad_();
    CHECK(all_nan(autograd::grad({gelu(xr)}, {xr}, {ones({17}, dt)})[0]));
  }
}

TEST_CASE("float32 sigmoid is within 4e-7 relatively of float64's on [-30, 30]", "[ops][exp]") {
  // Eigen's logistic() was off by up to 7e-4 (sigmoid(-8.9)) in its vectorized body only, so one
  // element and sixteen gave different values.
  Tensor x32 = linspace(-30.0, 30.0, 60001, kFloat32);
  Tensor expected = sigmoid(x32.to(kFloat64));
  const double worst = ((sigmoid(x32).to(kFloat64) - expected).abs() / expected).max().item<double>();
  INFO("worst relative error " << worst);
  CHECK(worst < 4e-7);  // 1.8e-7 measured on an AVX2 CPU; Eigen's exp may differ by a bit elsewhere
  CHECK(sigmoid(full({16}, -8.0)).eq(sigmoid(full({1}, -8.0))[0]).all().item<bool>());
}

TEST_CASE("softmax gives -inf logits exactly 0 and a row of only -inf nan, as PyTorch, at every row length", "[ops][softmax]") {
  for (DType dt : {kFloat32, kFloat64}) {
    for (int64_t n : {1, 3, 8, 9, 17, 33}) {
      INFO(dtype_name(dt) << ", rows of " << n);
      std::vector<double> odd(n);
      for (int64_t i = 0; i < n; ++i) odd[i] = static_cast<double>(i % 2);
      Tensor masked = arange(n, dt).sin().masked_fill(from_vector(odd).eq(1), -INFINITY).view({1, n});
      Tensor all = full({1, n}, -INFINITY, dt);
      Tensor x = cat({masked, all}, 0);
      Tensor p = softmax(x, 1), lp = log_softmax(x, 1);
      for (int64_t i = 1; i < n; i += 2) {
        CHECK(p[0][i].item<double>() == 0.0);
        CHECK(lp[0][i].item<double>() == -INFINITY);
      }
      CHECK(std::abs(p[0].sum().item<double>() - 1) < 1e-6);
      CHECK(all_nan(p[1]));
      CHECK(all_nan(lp[1]));
    }
  }
}

TEST_CASE("relu's gradient passes through a NaN input, as PyTorch's threshold_backward", "[ops][relu]") {
  for (bool fused : {true, false}) {
    INFO((fused ? "fused backward" : "backward as ops"));
    test::FusionGuard guard(fused);
    Tensor x = from_vector<float>({NAN, -1, 0, 2, NAN, -0.5f, 3, 1e-30f, -1e-30f}).requires_grad_();
    relu(x).backward(full({9}, 3.0));
    test::check_equal(x.grad(), from_vector<float>({3, 0, 0, 3, 3, 0, 3, 3, 0}));
  }
}

TEST_CASE("log and rsqrt of subnormal inputs are exact, in float32 and float64", "[ops][exp]") {
  // Eigen's vector log treated a subnormal as the smallest normal number (log(1e-40f) = -87.34, not
  // -92.10), and its rsqrt as 0 (inf; -inf for a negative one, not nan). Note [Eigen's log of
  // subnormals] in cpu/exact_math.h.
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    const bool f32 = dt == kFloat32;
    const double tiny = f32 ? 1e-40 : 1e-310, smallest_normal = f32 ? 1.1754943508e-38 : 2.2250738585072014e-308;
    std::vector<double> v;
    for (int i = 0; i < 17; ++i) v.push_back(tiny * (i + 1));
    v.push_back(smallest_normal);
    v.push_back(0.0);
    v.push_back(-tiny);
    Tensor x = from_vector(v).to(dt);
    const std::vector<double> xs = x.to(kFloat64).to_vector<double>();
    const std::vector<double> logs = log(x).to(kFloat64).to_vector<double>();
    const std::vector<double> rs = rsqrt(x).to(kFloat64).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      INFO("x = " << xs[i] << ": log " << logs[i] << ", rsqrt " << rs[i]);
      if (xs[i] < 0) {
        CHECK(std::isnan(logs[i]));
        CHECK(std::isnan(rs[i]));
      } else if (xs[i] == 0) {
        CHECK(logs[i] == -INFINITY);
        CHECK(rs[i] == INFINITY);
      } else {
        CHECK(std::abs(logs[i] - std::log(xs[i])) <= (f32 ? 1e-6 : 1e-15) * std::abs(std::log(xs[i])));
        CHECK(std::abs(rs[i] - 1 / std::sqrt(xs[i])) <= (f32 ? 1e-6 : 1e-15) / std::sqrt(xs[i]));
      }
    }
  }
}

TEST_CASE("index_select and index_add take the same values on their contiguous fast path as on the strided one",
          "[ops][index]") {
  // Large enough that the 2 threads split the rows mid-row; inner runs of 1 (the last dim) and of 7.
  ThreadsGuard threads(2);
  for (int64_t dim : {1, 0}) {
    // dim 1: (7, 300), runs of 1; dim 0: (300, 7), runs of 7. Both contiguous.
    Tensor x = dim == 1 ? test::sample({300, 7}, kFloat64).t().contiguous() : test::sample({300, 7}, kFloat64);
    const int64_t size = x.size(dim), n = 40000;
    std::vector<int64_t> picks(n);
    for (int64_t i = 0; i < n; ++i) picks[i] = (i * 7919 + 13) % size;
    Tensor index = from_vector(picks);
    Tensor strided = x.t().contiguous().t();  // the same values through strides: the generic path
    test::check_equal(x.index_select(dim, index), strided.index_select(dim, index));
    Tensor src = test::sample(x.index_select(dim, index).sizes(), kFloat64, 1.7);
    Tensor fast = index_add(zeros(x.sizes(), kFloat64), dim, index, src);
    Tensor slow = index_add(zeros(x.sizes(), kFloat64).t().contiguous().t(), dim, index, src.t().contiguous().t());
    test::check_close(fast, slow, {1e-12, 1e-12});
  }
}

TEST_CASE("index_select and index_add on views whose leading dims are permuted copy and add whole rows",
          "[ops][index]") {
  // (6, 5, 9, 1, 8) indexed along dim 2: three layouts of the same values: contiguous, dims 0 and 1
  // swapped (the rows after dim 2 stay dense, with a size-1 dim among them: conv_transpose3d's
  // index_add reads such a view), and the last two dims swapped as well (rows not dense: element by
  // element). Each against an explicit loop.
  ThreadsGuard threads(2);
  const int64_t A = 6, B = 5, D = 9, E = 8, n = 13;
  Tensor x = test::sample({A, B, D, 1, E}, kFloat64);
  std::vector<int64_t> picks(n);
  for (int64_t j = 0; j < n; ++j) picks[j] = (j * 5 + 3) % D;  // repeats: index_add sums them
  Tensor index = from_vector(picks);
  Tensor src = test::sample({A, B, n, 1, E}, kFloat64, 1.3);
  std::vector<double> xv = x.to_vector<double>(), sv = src.to_vector<double>();
  std::vector<double> selected(A * B * n * E), added(A * B * D * E, 0.0);
  for (int64_t a = 0; a < A; ++a) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t e = 0; e < E; ++e) {
          selected[((a * B + b) * n + j) * E + e] = xv[((a * B + b) * D + picks[j]) * E + e];
          added[((a * B + b) * D + picks[j]) * E + e] += sv[((a * B + b) * n + j) * E + e];
        }
      }
    }
  }
  const Tensor want_selected = from_vector(selected, {A, B, n, 1, E});
  const Tensor want_added = from_vector(added, {A, B, D, 1, E});
  // A view of t's values whose memory is laid out with the dims in `order`.
  auto laid_out = [](const Tensor& t, const Shape& order) { return t.permute(order).contiguous().permute(order); };
  for (const Shape& order : {Shape{0, 1, 2, 3, 4}, Shape{1, 0, 2, 3, 4}, Shape{1, 0, 2, 4, 3}}) {
    INFO("memory order " << order.str());
    test::check_equal(laid_out(x, order).index_select(2, index), want_selected);
    Tensor out = laid_out(zeros({A, B, D, 1, E}, kFloat64), order);
    test::check_close(index_add(out, 2, index, laid_out(src, order)), want_added, {1e-14, 1e-14});
  }
}

TEST_CASE("gather, scatter and scatter_add take the same values on their contiguous fast path as on the strided one",
          "[ops][index]") {
  // (40, 50, 60) with dim 0, 1 or 2: outer and inner runs of every kind. The index is smaller than the
  // input along dim (31), as for the gradient of a gather; the reference is an explicit loop.
  ThreadsGuard threads(2);
  const std::vector<int64_t> sizes{40, 50, 60};
  for (int dim : {0, 1, 2}) {
    INFO("dim = " << dim);
    Tensor x = test::sample({sizes[0], sizes[1], sizes[2]}, kFloat64);
    std::vector<int64_t> isz = sizes;
    isz[dim] = 31;
    const int64_t numel = isz[0] * isz[1] * isz[2];
    std::vector<int64_t> picks(numel);
    for (int64_t q = 0; q < numel; ++q) picks[q] = (q * 7919 + 13) % sizes[dim];
    Tensor index = from_vector(picks, {isz[0], isz[1], isz[2]});
    Tensor src = test::sample({isz[0], isz[1], isz[2]}, kFloat64, 1.7);

    std::vector<double> xv = x.to_vector<double>(), sv = src.to_vector<double>();
    std::vector<double> gathered(numel), scattered(xv), added(x.numel(), 0.0);
    for (int64_t a = 0, q = 0; a < isz[0]; ++a) {
      for (int64_t b = 0; b < isz[1]; ++b) {
        for (int64_t c = 0; c < isz[2]; ++c, ++q) {
          int64_t at[3] = {a, b, c};
          at[dim] = picks[q];
          const int64_t off = (at[0] * sizes[1] + at[1]) * sizes[2] + at[2];
          gathered[q] = xv[off];
          scattered[off] = sv[q];  // the last write wins, as the serial kernel's
          added[off] += sv[q];
        }
      }
    }
    const Shape xs{sizes[0], sizes[1], sizes[2]};
    Tensor strided_x = x.transpose(0, 2).contiguous().transpose(0, 2);  // the generic path
    test::check_equal(x.gather(dim, index), from_vector(gathered, index.sizes()));
    test::check_equal(strided_x.gather(dim, index), from_vector(gathered, index.sizes()));
    test::check_equal(x.scatter(dim, index, src), from_vector(scattered, xs));
    test::check_equal(strided_x.scatter(dim, index, src), from_vector(scattered, xs));
    test::check_close(scatter_add(zeros(xs, kFloat64), dim, index, src), from_vector(added, xs), {1e-12, 1e-12});
    test::check_close(scatter_add(zeros(xs, kFloat64).transpose(0, 2).contiguous().transpose(0, 2), dim, index, src),
                      from_vector(added, xs), {1e-12, 1e-12});
  }
  // A bad index on the fast path is an Error naming the op, the index and the size.
  Tensor x = test::sample({4, 5}, kFloat64);
  Tensor bad = from_vector<int64_t>({0, 1, 5, 2}, {4, 1});
  test::check_error([&] { x.gather(1, bad); }, {"gather", "index 5", "size 5"});
  test::check_error([&] { x.scatter_add(1, bad, zeros({4, 1}, kFloat64)); }, {"scatter_add", "index 5", "size 5"});
}

TEST_CASE("max pooling's indices are saved for backward: changed in place, backward is an Error", "[ops][pool]") {
  // As PyTorch's saved result1: the indices handed back are the ones the gradient goes to.
  for (bool adaptive : {false, true}) {
    INFO("adaptive " << adaptive);
    Tensor x = test::sample({1, 2, 4, 4}, kFloat64).requires_grad_();
    auto [out, indices] = adaptive ? adaptive_max_pool2d_with_indices(x, {2}) : max_pool2d_with_indices(x, {2});
    {
      NoGradGuard no_grad;
      indices.add_(1);
    }
    test::check_error([&] { out.sum().backward(); },
                      {adaptive ? "AdaptiveMaxPool2DBackward" : "MaxPool2DBackward",
                       "modified by an in-place operation"});
  }
}

TEST_CASE("max pooling of float16 and bfloat16 on the CPU: the float32 kernels' values and indices, gradients summed in float32",
          "[ops][pool]") {
  // The float16 kernels compare keys of the bits, the bfloat16 ones the float32s that a shift of the
  // bits makes (cpu/pool.cpp); the float32 kernels, on the same values widened exactly, are the
  // reference. Values from a small set, so windows hold ties, -0 beside +0, infinities and NaNs of
  // both signs; widths 2 to 37 take the 2x2 loop through whole runs of 16 outputs and every length of
  // a run's tail.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> pool_of_values{-2.0f, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 3.0f, 3.0f, inf, -inf, nan, -nan};
  std::mt19937 rng(11);
  auto values = [&](int64_t n, bool specials) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = pool_of_values[rng() % (specials ? pool_of_values.size() : 9)];
    return v;
  };
  // Same values; same indices, so the same elements: a -0 chosen where a -0 was.
  auto check_same = [](const std::tuple<Tensor, Tensor>& got, const std::tuple<Tensor, Tensor>& want) {
    const auto& [v16, i16] = got;
    const auto& [v32, i32] = want;
    test::check_close(v16.to(kFloat32), v32, test::Tolerance{0, 0});
    test::check_equal(i16, i32);
    const std::vector<float> a = v16.to(kFloat32).to_vector<float>(), b = v32.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == 0.0f && std::signbit(a[i]) != std::signbit(b[i])) FAIL("the sign of a zero differs at " << i);
    }
  };
  int64_t cases = 0;
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    for (int64_t H : {2, 3, 5, 8}) {
      for (int64_t W = 2; W <= 37; ++W) {
        INFO("H " << H << " W " << W);
        Tensor x32 = from_vector<float>(values(2 * 3 * H * W, W % 3 != 0), {2, 3, H, W});
        Tensor x16 = x32.to(dt);
        x32 = x16.to(kFloat32);  // -NaN and NaN as the 16-bit type holds them
        check_same(max_pool2d_with_indices(x16, {2}), max_pool2d_with_indices(x32, {2}));
        check_same(max_pool2d_with_indices(x16, {3}, {2}, {1}), max_pool2d_with_indices(x32, {3}, {2}, {1}));
        check_same(max_pool2d_with_indices(x16, {2}, {2}, {0}, {1}, true),
                   max_pool2d_with_indices(x32, {2}, {2}, {0}, {1}, true));
        check_same(adaptive_max_pool2d_with_indices(x16, {2, 3}), adaptive_max_pool2d_with_indices(x32, {2, 3}));
        ++cases;
      }
    }
    // Backward: overlapping 3x3 windows at stride 2 send several gradients to one input; they are
    // summed in float32 and rounded once, as backward through float32 copies was.
    Tensor x32 = from_vector<float>(values(2 * 3 * 11 * 13, false), {2, 3, 11, 13});
    Tensor x16 = x32.to(dt).requires_grad_();
    Tensor xf = x16.detach().to(kFloat32).requires_grad_();
    Tensor out16 = max_pool2d(x16, {3}, {2}, {1});
    Tensor g16 = test::sample(out16.sizes(), kFloat32, 0.3).to(dt);
    out16.backward(g16);
    max_pool2d(xf, {3}, {2}, {1}).backward(g16.to(kFloat32));
    REQUIRE(x16.grad().dtype() == dt);
    test::check_close(x16.grad(), xf.grad().to(dt), test::Tolerance{0, 0});
    // No float32 copy in the graph: the pooling's own node, not a cast's.
    CHECK(std::string(out16.grad_fn()->name()) == "MaxPool2DBackward");
  }
  CHECK(cases == 2 * 4 * 36);  // every geometry ran
}

TEST_CASE("2x2 max pooling of rows longer than one run of 16 outputs matches amax over the windows", "[ops][pool]") {
  // An independent reference for the second run of a row and its tail (38 columns: 16 + 3 outputs),
  // in every dtype the kernel takes; the indices must point at the maxima.
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    Tensor x = test::sample({2, 3, 36, 38}, kFloat64).to(dt);
    auto [out, indices] = max_pool2d_with_indices(x, {2});
    REQUIRE(out.sizes() == Shape{2, 3, 18, 19});
    Tensor windows = x.unflatten(3, {19, 2}).unflatten(2, {18, 2}).amax({3, 5});
    test::check_close(out, windows, test::Tolerance{0, 0});
    test::check_close(x.flatten(2).gather(2, indices.flatten(2)).view(out.sizes()), out, test::Tolerance{0, 0});
  }
}

namespace {

// |actual - exact| <= 2 (k + 1) u s + (|exact| + that) 2^-8, u = 2^-24, s the same op on the operands'
// absolute values: a float32 sum of k exact products (any order), rounded once to bfloat16.
void check_bf16_sum(const char* what, const Tensor& actual, const Tensor& exact, const Tensor& abs_sums, int64_t k) {
  REQUIRE(actual.dtype() == kBFloat16);
  Tensor sum_err = abs_sums * (2.0 * static_cast<double>(k + 1) * std::ldexp(1.0, -24)) + 1e-30;
  test::check_within(what, actual, exact, sum_err + (exact.abs() + sum_err) * std::ldexp(1.0, -8));
}

}  // namespace

TEST_CASE("bfloat16 cpu conv2d: forward and both backwards read bfloat16, against float64",
          "[ops][conv][autocast]") {
  // Note [bfloat16 convolution] in cpu/conv.cpp: bfloat16 columns and operands, float32 sums
  // (cpu/bf16gemm.cpp's AMX or AVX512-BF16 kernel where the CPU takes it; CTest runs this once more
  // with KILN_CPU_BF16_GEMM=float, float32 copies of the operands), each result rounded once. Batches split over the threads and a single image whose
  // GEMMs split their columns instead; 1x1 (no columns), groups, stride, padding, dilation; several
  // images' columns side by side (Note [images side by side]).
  struct Case {
    Shape x, w;
    Shape stride, padding, dilation;
    int64_t groups;
  };
  for (const Case& c : std::vector<Case>{{{5, 3, 12, 12}, {8, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
                                         {{1, 32, 14, 14}, {64, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
                                         {{3, 16, 9, 7}, {24, 16, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
                                         {{2, 6, 11, 10}, {4, 3, 3, 2}, {2, 1}, {1, 0}, {1, 2}, 2},
                                         {{4, 40, 8, 8}, {33, 40, 5, 5}, {1, 1}, {2, 2}, {1, 1}, 1},
                                         // Small planes: the forward and the input's gradient multiply
                                         // 22 images' columns side by side (31 at stride 2), then the
                                         // rest of a thread's piece (of 25-35 images on 2 threads).
                                         {{60, 3, 6, 6}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
                                         {{50, 4, 5, 7}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2},
                                         {{70, 3, 9, 9}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1}}) {
    INFO("x " << c.x.str() << ", w " << c.w.str() << ", groups " << c.groups);
    Tensor x = test::sample(c.x, kFloat32, 0.3).to(kBFloat16), w = test::sample(c.w, kFloat32, 0.6).to(kBFloat16);
    Tensor b = test::sample({c.w[0]}, kFloat32, 0.9).to(kBFloat16);
    Tensor x64 = x.to(kFloat64), w64 = w.to(kFloat64), b64 = b.to(kFloat64);
    Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    const int64_t K = c.w[1] * c.w[2] * c.w[3];
    check_bf16_sum("forward", y, conv2d(x64, w64, b64, c.stride, c.padding, c.dilation, c.groups),
                   conv2d(x64.abs(), w64.abs(), b64.abs(), c.stride, c.padding, c.dilation, c.groups), K + 1);
    Tensor g = test::sample(y.sizes(), kFloat32, 0.4).to(kBFloat16), g64 = g.to(kFloat64);
    const int64_t per_input = c.w[0] / c.groups * c.w[2] * c.w[3];
    check_bf16_sum("grad of the input", conv2d_backward_input(g, w, c.x, c.stride, c.padding, c.dilation, c.groups),
                   conv2d_backward_input(g64, w64, c.x, c.stride, c.padding, c.dilation, c.groups),
                   conv2d_backward_input(g64.abs(), w64.abs(), c.x, c.stride, c.padding, c.dilation, c.groups),
                   per_input);
    const int64_t per_weight = y.size(0) * y.size(2) * y.size(3);
    check_bf16_sum("grad of the weight", conv2d_backward_weight(g, x, c.w, c.stride, c.padding, c.dilation, c.groups),
                   conv2d_backward_weight(g64, x64, c.w, c.stride, c.padding, c.dilation, c.groups),
                   conv2d_backward_weight(g64.abs(), x64.abs(), c.w, c.stride, c.padding, c.dilation, c.groups),
                   per_weight);
  }
}

namespace {

// A 3-D convolution by its definition, in float64 loops: out = conv3d(x, w, b), and for the
// cotangent g (out's shape) the gradients of <g, out> with respect to x and w.
struct Conv3dGeometry {
  Shape x, w;
  std::array<int64_t, 3> stride, padding, dilation;
  int64_t groups;
  Shape out() const {
    Shape o{x[0], w[0]};
    for (int i = 0; i < 3; ++i)
      o.push_back((x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) / stride[i] + 1);
    return o;
  }
};
struct Conv3dValues {
  Tensor out, gx, gw;
};
Conv3dValues conv3d_by_definition(const Conv3dGeometry& c, const Tensor& x, const Tensor& w, const Tensor& b,
                                  const Tensor& g) {
  const Shape o = c.out();
  Tensor xs = x.to(kFloat64).contiguous(), ws = w.to(kFloat64).contiguous(), gs = g.to(kFloat64).contiguous();
  Tensor out = zeros(o, kFloat64), gx = zeros(c.x, kFloat64), gw = zeros(c.w, kFloat64);
  const double *xp = xs.data_ptr<double>(), *wp = ws.data_ptr<double>(), *gp = gs.data_ptr<double>();
  double *op = out.data_ptr<double>(), *gxp = gx.data_ptr<double>(), *gwp = gw.data_ptr<double>();
  const int64_t Cg = c.w[1], Og = c.w[0] / c.groups;
  for (int64_t n = 0; n < o[0]; ++n)
    for (int64_t oc = 0; oc < o[1]; ++oc)
      for (int64_t t = 0; t < o[2]; ++t)
        for (int64_t h = 0; h < o[3]; ++h)
          for (int64_t v = 0; v < o[4]; ++v) {
            const int64_t oi = (((n * o[1] + oc) * o[2] + t) * o[3] + h) * o[4] + v;
            double sum = b.defined() ? b.to(kFloat64)[oc].item<double>() : 0.0;
            for (int64_t ci = 0; ci < Cg; ++ci)
              for (int64_t kd = 0; kd < c.w[2]; ++kd)
                for (int64_t kh = 0; kh < c.w[3]; ++kh)
                  for (int64_t kw = 0; kw < c.w[4]; ++kw) {
                    const int64_t z = t * c.stride[0] + kd * c.dilation[0] - c.padding[0];
                    const int64_t y = h * c.stride[1] + kh * c.dilation[1] - c.padding[1];
                    const int64_t q = v * c.stride[2] + kw * c.dilation[2] - c.padding[2];
                    if (z < 0 || z >= c.x[2] || y < 0 || y >= c.x[3] || q < 0 || q >= c.x[4]) continue;
                    const int64_t channel = oc / Og * Cg + ci;
                    const int64_t xi = (((n * c.x[1] + channel) * c.x[2] + z) * c.x[3] + y) * c.x[4] + q;
                    const int64_t wi = (((oc * Cg + ci) * c.w[2] + kd) * c.w[3] + kh) * c.w[4] + kw;
                    sum += xp[xi] * wp[wi];
                    gxp[xi] += gp[oi] * wp[wi];
                    gwp[wi] += gp[oi] * xp[xi];
                  }
            op[oi] = sum;
          }
  return {out, gx, gw};
}

}  // namespace

TEST_CASE("cpu 3-D convolution kernels: forward and both gradients against the definition, float32, float64 and "
          "bfloat16, on 1 and 2 threads",
          "[ops][conv]") {
  // Note [3-D convolution] in cpu/conv.cpp: each (sample, output depth) an image of the 2-D kernels,
  // its columns read from the depth planes where they lie (zero rows for depths in the padding), its
  // output a depth plane of out. Geometries: a 'same' 3x3x3 (columns in spans); depth stride,
  // dilation and padding with groups; a pointwise one (the input planes are the columns, D H W
  // apart); one sample (fewer than the threads: the input gradient's GEMMs split their columns);
  // whole output depths in the padding; a stride past the kernel; 16 and more output channels per
  // group, whose float32 weight gradient is summed transposed (Note [the weight's gradient
  // transposed]). bfloat16 multiplies several images' columns side by side, across samples.
  const std::vector<Conv3dGeometry> geos{
      {{3, 4, 5, 6, 7}, {6, 4, 3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1},
      {{2, 4, 7, 6, 5}, {6, 2, 3, 2, 3}, {2, 1, 2}, {1, 0, 2}, {2, 1, 1}, 2},
      {{3, 6, 4, 5, 5}, {4, 6, 1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, 1},
      {{1, 3, 6, 8, 8}, {5, 3, 3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {2, 1, 1}, 1},
      {{2, 2, 3, 4, 4}, {3, 2, 3, 3, 3}, {1, 1, 1}, {3, 1, 1}, {1, 1, 1}, 1},
      {{4, 3, 5, 2, 3}, {2, 3, 2, 1, 2}, {3, 1, 1}, {0, 0, 0}, {1, 1, 1}, 1},
      {{2, 3, 4, 6, 5}, {20, 3, 3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1},
      {{2, 8, 3, 5, 5}, {32, 4, 3, 1, 3}, {1, 2, 1}, {1, 0, 1}, {1, 1, 1}, 2},
  };
  for (int threads : {1, 2}) {
    ThreadsGuard guard(threads);
    for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
      for (size_t i = 0; i < geos.size(); ++i) {
        const Conv3dGeometry& c = geos[i];
        INFO(dtype_name(dt) << ", geometry " << i << ", threads " << threads);
        Tensor x = test::sample(c.x, kFloat32, 0.3).to(dt), w = test::sample(c.w, kFloat32, 0.6).to(dt);
        Tensor b = test::sample({c.w[0]}, kFloat32, 0.9).to(dt), g = test::sample(c.out(), kFloat32, 0.4).to(dt);
        Tensor xa = x.clone().requires_grad_(), wa = w.clone().requires_grad_();
        Tensor y = conv3d(xa, wa, b, Shape(c.stride), Shape(c.padding), Shape(c.dilation), c.groups);
        REQUIRE(y.sizes() == c.out());
        CHECK(std::string(y.grad_fn()->name()) == "Conv3dBackward");
        y.backward(g);
        const Conv3dValues exact = conv3d_by_definition(c, x, w, b, g);
        if (dt == kBFloat16) {  // each a float32 sum of exact products, rounded once (Note [bfloat16 convolution])
          const Conv3dValues abs = conv3d_by_definition(c, x.abs(), w.abs(), b.abs(), g.abs());
          const int64_t taps = c.w[2] * c.w[3] * c.w[4];
          check_bf16_sum("forward", y, exact.out, abs.out, c.w[1] * taps + 1);
          check_bf16_sum("grad of the input", xa.grad(), exact.gx, abs.gx, c.w[0] / c.groups * taps);
          check_bf16_sum("grad of the weight", wa.grad(), exact.gw, abs.gw, c.out().numel() / c.out()[1]);
        } else {
          const test::Tolerance tol = dt == kFloat32 ? test::Tolerance{1e-4, 1e-4} : test::tolerance_for(kFloat64);
          test::check_close(y, exact.out.to(dt), tol);
          test::check_close(xa.grad(), exact.gx.to(dt), tol);
          test::check_close(wa.grad(), exact.gw.to(dt), tol);
        }
      }
    }
  }
}

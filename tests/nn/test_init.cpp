// tests/nn/test_init.cpp: nn::init and the layers' default initialisation, checked by their distributions:
// exact bounds, and moments within a few standard errors on large tensors (Kiln's Philox numbers differ
// from torch's, so the values themselves cannot be compared).
#include <cmath>

#include "nn_golden.h"

using namespace kiln;

namespace {

struct Moments {
  double min, max, mean, var;
};
Moments moments(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  Moments m{v[0], v[0], 0, 0};
  for (double x : v) {
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
    m.mean += x;
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

// Uniform on [-bound, bound): the bounds hold, are nearly reached, and the moments match.
void check_uniform(const Tensor& t, double lo, double hi) {
  Moments m = moments(t);
  double n = static_cast<double>(t.numel()), width = hi - lo;
  CHECK(m.min >= lo);
  CHECK(m.max <= hi);
  CHECK(m.min < lo + width * 1e-3);
  CHECK(m.max > hi - width * 1e-3);
  double var = width * width / 12;
  CHECK(std::fabs(m.mean - (lo + hi) / 2) < 5 * std::sqrt(var / n));
  CHECK(std::fabs(m.var / var - 1) < 5 * std::sqrt(0.8 / n));  // var of the sample variance: 4/5 var^2 / n
}

void check_normal(const Tensor& t, double mean, double std) {
  Moments m = moments(t);
  double n = static_cast<double>(t.numel());
  CHECK(std::fabs(m.mean - mean) < 5 * std / std::sqrt(n));
  CHECK(std::fabs(m.var / (std * std) - 1) < 5 * std::sqrt(2 / n));
}

}  // namespace

TEST_CASE("calculate_gain and fans follow PyTorch", "[nn][init]") {
  CHECK(nn::init::calculate_gain("linear") == 1);
  CHECK(nn::init::calculate_gain("conv2d") == 1);
  CHECK(nn::init::calculate_gain("sigmoid") == 1);
  CHECK(nn::init::calculate_gain("tanh") == Approx(5.0 / 3));
  CHECK(nn::init::calculate_gain("relu") == Approx(std::sqrt(2.0)));
  CHECK(nn::init::calculate_gain("leaky_relu") == Approx(std::sqrt(2.0 / (1 + 0.0001))));
  CHECK(nn::init::calculate_gain("leaky_relu", std::sqrt(5.0)) == Approx(std::sqrt(1.0 / 3)));
  CHECK(nn::init::calculate_gain("selu") == 0.75);
  test::check_error([] { nn::init::calculate_gain("swish"); }, {"unsupported nonlinearity 'swish'"});
  auto f = nn::init::calculate_fan_in_and_fan_out(empty({8, 3, 5, 2}));
  CHECK(f.fan_in == 30);
  CHECK(f.fan_out == 80);
  test::check_error([] { nn::init::calculate_fan_in_and_fan_out(empty({4})); }, {"fewer than 2 dimensions"});
}

TEST_CASE("Initialisers draw from the right distributions, in place, under no_grad", "[nn][init]") {
  Generator gen(42);
  Tensor w = empty({400, 500}).requires_grad_();  // a leaf that requires grad, like a parameter
  Tensor& same = nn::init::uniform_(w, -0.5, 1.5, &gen);
  CHECK(&same == &w);
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  check_uniform(w, -0.5, 1.5);

  nn::init::normal_(w, 2.0, 0.5, &gen);
  check_normal(w, 2.0, 0.5);

  nn::init::kaiming_uniform_(w, 0, "fan_in", "relu", &gen);  // bound sqrt(2) * sqrt(3 / 500)
  double b = std::sqrt(2.0) * std::sqrt(3.0 / 500);
  check_uniform(w, -b, b);
  nn::init::kaiming_uniform_(w, std::sqrt(5.0), "fan_out", "leaky_relu", &gen);  // 1 / sqrt(fan_out)
  check_uniform(w, -1 / std::sqrt(400.0), 1 / std::sqrt(400.0));
  nn::init::kaiming_normal_(w, 0, "fan_out", "relu", &gen);
  check_normal(w, 0, std::sqrt(2.0) / std::sqrt(400.0));
  nn::init::xavier_uniform_(w, 2.0, &gen);
  double xb = 2.0 * std::sqrt(6.0 / 900);
  check_uniform(w, -xb, xb);
  nn::init::xavier_normal_(w, 0.5, &gen);
  check_normal(w, 0, 0.5 * std::sqrt(2.0 / 900));

  nn::init::constant_(w, 0.25);
  test::check_equal(w.detach(), full({400, 500}, 0.25));
  nn::init::zeros_(w);
  CHECK(w.abs().max().item<double>() == 0);
  nn::init::ones_(w);
  CHECK(w.min().item<double>() == 1);
  test::check_error([&] { nn::init::kaiming_uniform_(w, 0, "fan_avg"); }, {"mode 'fan_avg'"});
  Tensor idx = zeros({3, 3}, kInt64);
  test::check_error([&] { nn::init::normal_(idx); }, {"normal_", "floating", "int64"});
}

TEST_CASE("trunc_normal_ gives the truncated normal distribution, on wide, narrow and far intervals", "[nn][init]") {
  // (mean, std, a, b): PyTorch's default, one side of the mean, a narrow interval far out (redrawing
  // until inside took seconds for 100 elements of it), both tails beyond 5 std, and a half-line.
  struct Case {
    double mean, std, a, b;
  };
  for (const Case& c : {Case{0.0, 1.0, -2.0, 2.0}, Case{0.5, 1.0, 0.0, 3.0}, Case{0.0, 1.0, 3.0, 3.001},
                        Case{1.0, 2.0, -19.0, -15.0}, Case{0.0, 1.0, 6.0, 7.5}, Case{0.0, 0.02, -INFINITY, -0.01}}) {
    INFO("mean " << c.mean << ", std " << c.std << ", [" << c.a << ", " << c.b << "]");
    Generator gen(3);
    Tensor w = empty({200000}, kFloat64);
    nn::init::trunc_normal_(w, c.mean, c.std, c.a, c.b, &gen);
    Moments m = moments(w);
    CHECK(m.min >= c.a);
    CHECK(m.max <= c.b);
    // Moments of N(mean, std^2) restricted to [a, b], from the upper tail when the interval is above
    // the mean (where 1 - cdf would cancel).
    auto pdf = [](double x) { return std::isinf(x) ? 0.0 : std::exp(-x * x / 2) / std::sqrt(2 * M_PI); };
    auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
    const double al = (c.a - c.mean) / c.std, be = (c.b - c.mean) / c.std;
    const double z = al > 0 ? cdf(-al) - cdf(-be) : cdf(be) - cdf(al);
    const double term = [](double x, double p) { return std::isinf(x) ? 0.0 : x * p; }(al, pdf(al)) -
                        [](double x, double p) { return std::isinf(x) ? 0.0 : x * p; }(be, pdf(be));
    const double emean = c.mean + c.std * (pdf(al) - pdf(be)) / z;
    const double evar = c.std * c.std * (1 + term / z - std::pow((pdf(al) - pdf(be)) / z, 2));
    const double n = static_cast<double>(w.numel());
    CHECK(std::fabs(m.mean - emean) < 5 * std::sqrt(evar / n));
    CHECK(std::fabs(m.var / evar - 1) < 5 * std::sqrt(2 / n));
  }
  Tensor w = empty({4});
  test::check_error([&] { nn::init::trunc_normal_(w, 0, 1, 40, 41); }, {"trunc_normal_", "40 std", "nearer the mean"});
  // Near 38 std the quantile's refinement step overflows; the values stay finite and inside.
  for (double lo : {37.7, -38.2, 38.45}) {
    Tensor far = empty({1000}, kFloat64);
    nn::init::trunc_normal_(far, 0, 1, lo, lo + 0.2);
    CHECK(far.ge(lo).logical_and(far.le(lo + 0.2)).all().item<bool>());  // false for a NaN
  }
  test::check_error([&] { nn::init::trunc_normal_(w, 0, 1, 1, 1); }, {"trunc_normal_", "a < b"});
  test::check_error([&] { nn::init::trunc_normal_(w, 0, -1); }, {"trunc_normal_", "std > 0"});
}

TEST_CASE("uniform_ and normal_ refuse an empty range or a negative std, kaiming_ and xavier_ skip empty tensors", "[nn][init]") {
  Tensor w = empty({4});
  test::check_error([&] { nn::init::uniform_(w, 1, -1); }, {"uniform_", "a <= b", "a=1, b=-1"});
  test::check_error([&] { nn::init::uniform_(w, 0, INFINITY); }, {"uniform_", "finite"});
  test::check_error([&] { nn::init::normal_(w, 0, -1); }, {"normal_", "std >= 0", "std=-1"});
  nn::init::uniform_(w, 0.5, 0.5);  // PyTorch allows a == b
  CHECK(w.eq(0.5).all().item<bool>());
  Tensor none = empty({4, 0});  // fan_in 0: the bound would be inf; PyTorch returns the tensor
  nn::init::kaiming_uniform_(none);
  nn::init::kaiming_normal_(none);
  nn::init::xavier_uniform_(none);
  nn::init::xavier_normal_(none);
  CHECK(none.numel() == 0);
  Tensor flat = empty({0});  // as PyTorch: no fans below 2 dims, empty or not
  test::check_error([&] { nn::init::xavier_uniform_(flat); }, {"fan in and fan out", "fewer than 2 dimensions"});
}

TEST_CASE("A generator makes initialisation reproducible", "[nn][init]") {
  Generator g1(5), g2(5);
  Tensor a = empty({10, 10}), b = empty({10, 10});
  nn::init::kaiming_normal_(a, 0, "fan_in", "relu", &g1);
  nn::init::kaiming_normal_(b, 0, "fan_in", "relu", &g2);
  test::check_equal(a, b);
}

TEST_CASE("Layers initialise as PyTorch: U(+-1/sqrt(fan_in)) weights and biases, N(0, 1) embeddings",
          "[nn][init][layers]") {
  manual_seed(11);
  nn::Linear lin(256, 512);
  check_uniform(lin.weight.detach(), -1 / 16.0, 1 / 16.0);
  Moments bm = moments(lin.bias.detach());
  CHECK(bm.min >= -1 / 16.0);
  CHECK(bm.max <= 1 / 16.0);
  nn::Conv2d conv(16, 64, 5, {.groups = 2});  // fan_in = 8 * 25 = 200
  CHECK(conv.weight.sizes() == Shape{64, 8, 5, 5});
  double cb = 1 / std::sqrt(200.0);
  check_uniform(conv.weight.detach(), -cb, cb);
  Moments cbm = moments(conv.bias.detach());
  CHECK(cbm.min >= -cb);
  CHECK(cbm.max <= cb);
  nn::Embedding emb(1000, 200);
  check_normal(emb.weight.detach(), 0, 1);
  nn::BatchNorm2d bn(4);
  test::check_equal(bn.weight.detach(), ones({4}));
  test::check_equal(bn.bias.detach(), zeros({4}));
  test::check_equal(bn.running_var, ones({4}));
}

TEST_CASE("eye_ and dirac_ match torch", "[nn][init]") {
  for (const char* name : {"init_eye_3x5", "init_eye_5x3"}) {
    const Tensor& want = test::nn_case(name).at("out");
    Tensor t = full(want.sizes(), 7.0, kFloat64);
    nn::init::eye_(t);
    test::check_equal(t, want);
  }
  struct Dirac {
    const char* name;
    int64_t groups;
  };
  for (const Dirac& d : {Dirac{"init_dirac_groups2", 2}, Dirac{"init_dirac_3d", 1}, Dirac{"init_dirac_5d", 1}}) {
    INFO(d.name);
    const Tensor& want = test::nn_case(d.name).at("out");
    Tensor t = full(want.sizes(), 7.0, kFloat64).requires_grad_();  // a parameter: written under no_grad
    nn::init::dirac_(t, d.groups);
    test::check_equal(t.detach(), want);
  }
  // A dirac_ convolution passes its input through (the first min(out, in) channels).
  Tensor w = empty({3, 3, 3, 3});
  nn::init::dirac_(w);
  Tensor x = test::sample({2, 3, 5, 5}, kFloat32, 0.5);
  test::check_close(nn::functional::conv2d(x, w, {}, {1, 1}, {1, 1}), x, {1e-6, 1e-6});
  test::check_error([] { Tensor t = empty({3}); nn::init::eye_(t); }, {"nn::init::eye_", "2-D", "[3]"});
  test::check_error([] { Tensor t = empty({3, 3}); nn::init::dirac_(t); }, {"nn::init::dirac_", "3-D, 4-D or 5-D"});
  test::check_error([] { Tensor t = empty({3, 2, 3}); nn::init::dirac_(t, 2); },
                    {"nn::init::dirac_", "3 output channels", "groups 2"});
}

namespace {

// W (rows x cols, of a tensor seen as rows = size(0) by the rest) is what PyTorch's orthogonal_ makes of
// the normal draw A that the same generator gives: with M = A (rows >= cols) or A^T (rows < cols) and
// Q = W^T / gain or W / gain accordingly, Q has orthonormal columns, R = Q^T M is upper triangular with a
// positive diagonal, and Q R = M. That QR is unique, so this pins W down.
void check_orthogonal(const Shape& shape, double gain, uint64_t seed) {
  INFO("shape " << shape.str() << ", gain " << gain);
  Generator g(seed), replay(seed);
  Tensor t = empty(shape, kFloat64);
  nn::init::orthogonal_(t, gain, &g);
  const int64_t rows = shape[0], cols = shape.numel() / rows;
  Tensor w = t.reshape({rows, cols});
  Tensor a = randn({rows, cols}, TensorOptions(kFloat64), &replay);
  Tensor m = rows >= cols ? a : a.t();
  Tensor q = (rows >= cols ? w : w.t()) / gain;
  const int64_t n = q.size(1);
  test::check_close(matmul(q.t(), q), eye(n, n, TensorOptions(kFloat64)), {0, 1e-12});
  Tensor r = matmul(q.t(), m);
  std::vector<double> rv = r.contiguous().to_vector<double>();
  for (int64_t i = 0; i < n; ++i) {
    CHECK(rv[i * n + i] > 0);
    for (int64_t j = 0; j < i; ++j) CHECK(std::fabs(rv[i * n + j]) < 1e-12);
  }
  test::check_close(matmul(q, r), m, {0, 1e-12});
}

}  // namespace

TEST_CASE("orthogonal_ is PyTorch's: the Q of the normal draw's QR with R's diagonal positive", "[nn][init]") {
  check_orthogonal({7, 4}, 1.0, 3);
  check_orthogonal({5, 5}, 2.0, 4);
  check_orthogonal({3, 2, 2, 2}, 0.5, 5);  // rows < cols: the QR of the transpose
  check_orthogonal({1, 6}, 1.0, 6);
  check_orthogonal({64, 64}, 1.0, 7);
  // float32 and a parameter: written under no_grad, orthonormal to float32's precision.
  Tensor w = empty({40, 30}).requires_grad_();
  nn::init::orthogonal_(w);
  test::check_close(matmul(w.detach().t(), w.detach()), eye(30), {0, 1e-5});
  Tensor none = empty({0, 3});
  nn::init::orthogonal_(none);  // nothing to fill, as PyTorch
  test::check_error([] { Tensor t = empty({4}); nn::init::orthogonal_(t); },
                    {"nn::init::orthogonal_", "at least 2 dimensions", "[4]"});
}

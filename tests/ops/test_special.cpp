// tests/ops/test_special.cpp: erfinv, digamma, polygamma and lgamma (core/special_math.h) beyond the
// op table's PyTorch goldens: their defining identities over wide grids in float64 (erf(erfinv(y)) = y,
// erfc(erfinv(y)) = 1 - y deep in the tail, the recurrences and reflections of the gamma functions),
// known constants, float32 as the float64 value rounded once, and the Errors of the pointwise ops.
#include <cmath>
#include <vector>

#include "support.h"

using namespace kiln;

namespace {

std::vector<double> values_of(const Tensor& t) {
  const Tensor c = t.to(kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

Tensor f64(const std::vector<double>& v) { return from_vector<double>(v); }

// Points of (lo, hi) spread evenly, n of them.
std::vector<double> grid(double lo, double hi, int n) {
  std::vector<double> v;
  for (int i = 1; i <= n; ++i) v.push_back(lo + (hi - lo) * i / (n + 1));
  return v;
}
// The multiples of 1/256 in (lo, hi) that are not integers: x + 1 and 1 - x are exact for them, so
// the identities below compare the functions, not the rounding of their arguments near a pole.
std::vector<double> fractions(int lo, int hi) {
  std::vector<double> v;
  for (int k = lo * 256 + 1; k < hi * 256; ++k) {
    if (k % 256 != 0) v.push_back(k / 256.0);
  }
  return v;
}

constexpr double kPi = 3.14159265358979323846;
constexpr double kEulerGamma = 0.57721566490153286061;

}  // namespace

TEST_CASE("erfinv: erf(erfinv(y)) = y on (-1, 1), erfc(erfinv(y)) = 1 - y to 1 - 1e-15", "[ops][special]") {
  const std::vector<double> ys = grid(-1, 1, 20001);
  const std::vector<double> x = values_of(erfinv(f64(ys)));
  double worst = 0;
  for (size_t i = 0; i < ys.size(); ++i) worst = std::max(worst, std::abs(std::erf(x[i]) - ys[i]));
  CHECK(worst <= 4e-16);  // erf's own rounding near |y| = 1
  // The tail, where erf(x) - y cancels: 1 - y and its erfc agree relatively. (PyTorch 1.13's
  // erfinv(1 - 1e-14) = 5.47281 has erfc 9.963e-15 against 9.992e-15: 3e-3 off.)
  for (int k = 1; k <= 15; ++k) {
    const double y = 1 - std::pow(10.0, -k);
    const double root = erfinv(f64({y, -y})).data_ptr<double>()[0];
    INFO("y = 1 - 1e-" << k << ", erfinv " << root);
    CHECK(std::abs(std::erfc(root) / (1 - y) - 1) < 1e-12);
    CHECK(erfinv(f64({-y})).item<double>() == -root);
  }
  // Float32: the float64 value rounded once (after one Newton step, within 1e-13 of it: an ulp at most).
  const Tensor y32 = test::sample({4001}, kFloat32, 0.3) / 2;
  test::check_close(erfinv(y32), erfinv(y32.to(kFloat64)).to(kFloat32), {1.2e-7, 0});
  CHECK(std::signbit(erfinv(f64({-0.0})).item<double>()));
}

TEST_CASE("digamma and lgamma: recurrences, reflection and constants over negative and positive x", "[ops][special]") {
  std::vector<double> xs = fractions(-30, 30);
  xs.push_back(1e-8), xs.push_back(1e8), xs.push_back(-1e-8), xs.push_back(123456.75);
  std::vector<double> next;
  for (double x : xs) next.push_back(x + 1);
  const std::vector<double> d = values_of(digamma(f64(xs))), d1 = values_of(digamma(f64(next)));
  const std::vector<double> l = values_of(lgamma(f64(xs))), l1 = values_of(lgamma(f64(next)));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    if (x == std::round(x)) continue;
    INFO("x = " << x << ": digamma " << d[i] << ", digamma(x + 1) " << d1[i]);
    // digamma(x + 1) = digamma(x) + 1 / x; lgamma(x + 1) = lgamma(x) + log |x|. The terms may be far
    // larger than the difference (near the poles), so the bound scales with them.
    CHECK(std::abs(d1[i] - d[i] - 1 / x) <= 1e-13 * (std::abs(d1[i]) + std::abs(d[i]) + std::abs(1 / x)));
    CHECK(std::abs(l1[i] - l[i] - std::log(std::abs(x))) <= 1e-13 * (std::abs(l1[i]) + std::abs(l[i]) + 1));
  }
  // digamma(1 - x) - digamma(x) = pi / tan(pi x)
  const std::vector<double> near = fractions(-5, 5);
  std::vector<double> reflected;
  for (double x : near) reflected.push_back(1 - x);
  const std::vector<double> a = values_of(digamma(f64(near))), b = values_of(digamma(f64(reflected)));
  for (size_t i = 0; i < near.size(); ++i) {
    const double want = kPi / std::tan(kPi * near[i]);
    CHECK(std::abs(b[i] - a[i] - want) <= 1e-12 * (std::abs(a[i]) + std::abs(b[i]) + std::abs(want)));
  }
  const std::vector<double> known = values_of(digamma(f64({1.0, 0.5, 2.0, 0.0, -0.0, -3.0})));
  CHECK(std::abs(known[0] + kEulerGamma) < 1e-15);
  CHECK(std::abs(known[1] + kEulerGamma + 2 * std::log(2.0)) < 1e-15);
  CHECK(std::abs(known[2] - (1 - kEulerGamma)) < 1e-15);
  CHECK(known[3] == -INFINITY);
  CHECK(known[4] == INFINITY);
  CHECK(std::isnan(known[5]));
  // Float32: the float64 value rounded once (from fewer terms, within 1e-9 of it: an ulp at most).
  const Tensor x32 = test::sample({4001}, kFloat32, 0.7) * 7;
  test::check_close(digamma(x32), digamma(x32.to(kFloat64)).to(kFloat32), {1.2e-7, 1e-7});
  test::check_close(polygamma(3, x32), polygamma(3, x32.to(kFloat64)).to(kFloat32), {1.2e-7, 1e-7});
}

TEST_CASE("polygamma: zeta values at 1, the recurrence in x for n up to 10, derivatives of each other",
          "[ops][special]") {
  // polygamma(n, 1) = (-1)^(n+1) n! zeta(n + 1).
  const std::vector<double> at1 = {values_of(polygamma(1, f64({1.0})))[0], values_of(polygamma(2, f64({1.0})))[0],
                                   values_of(polygamma(3, f64({1.0})))[0]};
  CHECK(std::abs(at1[0] - kPi * kPi / 6) < 1e-15);
  CHECK(std::abs(at1[1] + 2.4041138063191885708) < 4e-15);  // -2 zeta(3)
  CHECK(std::abs(at1[2] - std::pow(kPi, 4) / 15) < 1e-14);
  // polygamma(n, x + 1) = polygamma(n, x) + (-1)^n n! / x^(n+1) (digamma's recurrence differentiated
  // n times), x on both sides of 0.
  const std::vector<double> xs = fractions(-6, 12);
  std::vector<double> next;
  for (double x : xs) next.push_back(x + 1);
  for (int n = 1; n <= 10; ++n) {
    const std::vector<double> p = values_of(polygamma(n, f64(xs))), p1 = values_of(polygamma(n, f64(next)));
    double factorial = 1;
    for (int i = 2; i <= n; ++i) factorial *= i;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double step = (n % 2 == 0 ? factorial : -factorial) / std::pow(xs[i], n + 1);
      INFO("n = " << n << ", x = " << xs[i]);
      // The terms of the zeta sum reach n! 2^(n+1) (at 1/2 from a pole) and may cancel to far less (at
      // half-integers, for even n): the bound counts them too.
      const double terms = factorial * std::pow(2.0, n + 1);
      CHECK(std::abs(p1[i] - p[i] - step) <= 1e-12 * (std::abs(p1[i]) + std::abs(p[i]) + std::abs(step) + terms));
    }
  }
  // Each polygamma is the derivative of the one before: a central difference on (0.5, 8).
  const std::vector<double> points = grid(0.5, 8, 50);
  for (int n = 0; n <= 4; ++n) {
    const double h = 1e-5;
    std::vector<double> up, down;
    for (double x : points) up.push_back(x + h), down.push_back(x - h);
    const std::vector<double> fu = values_of(polygamma(n, f64(up))), fd = values_of(polygamma(n, f64(down)));
    const std::vector<double> derivative = values_of(polygamma(n + 1, f64(points)));
    for (size_t i = 0; i < points.size(); ++i) {
      CHECK(std::abs((fu[i] - fd[i]) / (2 * h) - derivative[i]) <= 1e-6 * (1 + std::abs(derivative[i])));
    }
  }
  test::check_equal(polygamma(0, f64(points)), digamma(f64(points)));
  const std::vector<double> poles = values_of(polygamma(2, f64({0.0, -1.0, -7.0, INFINITY})));
  CHECK(poles[0] == -INFINITY);  // -2! zeta(3, pole) = -inf, as PyTorch's
  CHECK(poles[1] == -INFINITY);
  CHECK(poles[2] == -INFINITY);
  CHECK(polygamma(3, f64({-4.0})).item<double>() == INFINITY);
  CHECK(poles[3] == 0);
}

TEST_CASE("pointwise math: Errors, integer inputs to float32, the CPU's strided and 16-bit paths", "[ops][special]") {
  test::check_error([] { polygamma(-1, f64({1.0})); }, {"polygamma", "non-negative"});
  test::check_error([] { isclose(f64({1.0}), f64({1.0}).to(kFloat32)); }, {"isclose", "float64", "float32"});
  test::check_error([] { isclose(f64({1.0}), f64({1.0}), -1e-5); }, {"isclose", "rtol", "non-negative"});
  test::check_error([] { atan2(f64({1.0, 2.0}), f64({1.0, 2.0, 3.0})); }, {"atan2", "broadcast"});
  CHECK(lgamma(from_vector<int64_t>({1, 2, 3})).dtype() == kFloat32);
  CHECK(atan2(from_vector<int64_t>({1}), from_vector<int64_t>({1})).dtype() == kFloat32);
  CHECK(xlogy(from_vector<int64_t>({2}), f64({3.0})).dtype() == kFloat64);
  CHECK(allclose(f64({1.0, 2.0}), f64({1.0, 2.0 + 1e-9})));
  CHECK_FALSE(allclose(f64({1.0, NAN}), f64({1.0, NAN})));
  CHECK(allclose(f64({1.0, NAN}), f64({1.0, NAN}), 1e-5, 1e-8, true));
  // The gradients at the points gradcheck cannot reach: xlogy's in a is 0 where a = 0 and b <= 0
  // (log b is -inf or NaN there), PyTorch's; sinc's at 0 is 0, not the 0 / 0 of its quotient.
  {
    Tensor a = f64({0.0, 0.0, 2.0, 0.0}).requires_grad_(), b = f64({-1.0, 0.0, 3.0, 2.0}).requires_grad_();
    xlogy(a, b).sum().backward();
    test::check_close(a.grad(), f64({0.0, 0.0, std::log(3.0), std::log(2.0)}), {1e-15, 0});
    test::check_close(b.grad(), f64({-0.0, NAN, 2.0 / 3.0, 0.0}), {1e-15, 0});  // a / b, 0 / 0 at the second
    Tensor x = f64({0.0, 0.5}).requires_grad_();
    sinc(x).sum().backward();
    test::check_close(x.grad(), f64({0.0, (0.5 * kPi * std::cos(0.5 * kPi) - std::sin(0.5 * kPi)) / (0.25 * kPi)}),
                      {1e-15, 1e-15});
  }
  // A strided input and a contiguous copy of it give the same values (the scalar loop and its views).
  const Tensor x = test::sample({6, 8}, kFloat64, 0.4).mT() * 3;
  for (auto f : {+[](const Tensor& t) { return erfinv(t / 4); }, +[](const Tensor& t) { return digamma(t); },
                 +[](const Tensor& t) { return polygamma(2, t); }, +[](const Tensor& t) { return lgamma(t); }}) {
    test::check_close(f(x), f(x.contiguous()), {0, 0});  // NaN where x leaves the domain
    // float16 and bfloat16: computed in float32 and rounded once.
    for (DType d : {kFloat16, kBFloat16}) test::check_close(f(x.to(d)), f(x.to(d).to(kFloat32)).to(d), {0, 0});
  }
}

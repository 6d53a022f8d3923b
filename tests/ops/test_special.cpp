// tests/ops/test_special.cpp: erfinv, digamma, polygamma and lgamma, and torch.special's Bessel, error,
// normal-distribution, zeta and incomplete gamma functions (core/special_math.h) beyond the op table's
// PyTorch goldens: their defining identities over wide grids in float64 (erf(erfinv(y)) = y,
// erfc(erfinv(y)) = 1 - y deep in the tail, the recurrences and reflections of the gamma functions,
// I0 and I1 as integrals, ndtri as ndtr's inverse down to 1e-300, zeta's recurrence in q, the
// incomplete gamma functions' closed forms), known constants, float32 as the float64 value rounded
// once, and the Errors of the pointwise ops.
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

TEST_CASE("lgamma and digamma: a contiguous run, a block at a time, against the scalar loop on a strided copy",
          "[ops][special]") {
  // Contiguous runs take cpu/vector_special.cpp's fixed steps for x > 0 (Note [log Gamma a block at a
  // time]) and the scalar function for the rest of each block; strided runs glibc's lgamma_r and
  // digamma_f64 element by element. Both sides of each switch (1, 2, 3, 10), next to the zeros of lgamma
  // (1, 2) and digamma (1.4616...), tiny and huge x, poles, the reflection, +-0, +-inf and NaN.
  std::vector<double> sweep = grid(-20, 40, 1500);
  for (double edge : {1.0, 2.0, 3.0, 10.0, 1.4616321449683623}) {
    for (int k = -8; k <= 8; ++k) sweep.push_back(edge + k * 0x1p-50);
  }
  for (double v : {1e-300, 4.9e-324, 1e-8, 0.5, 0.0, -0.0, -3.0, -2.5, 1e8, 1e15, 1e200, 2.5e305, 3e305,
                   double(INFINITY), -double(INFINITY), double(NAN)}) {
    sweep.push_back(v);
  }
  const Tensor run = f64(sweep), strided = stack({run, run}, 1).select(1, 0);
  const Tensor run32 = run.to(kFloat32), strided32 = stack({run32, run32}, 1).select(1, 0);
  // Each side within 4e-16 of mpmath's value (scripts in the Note); digamma's near its zero within
  // 8e-16 absolutely. Float32 blocks: the float64 value rounded once (from fewer terms: an ulp apart at
  // most); the strided float32 lgamma is glibc's lgammaf, within 2 ulp.
  test::check_close(lgamma(run), lgamma(strided), {1e-15, 0});
  test::check_close(digamma(run), digamma(strided), {1e-15, 2e-15});
  test::check_close(lgamma(run32), lgamma(run32.to(kFloat64)).to(kFloat32), {1.2e-7, 0});
  test::check_close(lgamma(run32), lgamma(strided32), {2.4e-7, 0});
  test::check_close(digamma(run32), digamma(strided32), {1.2e-7, 1e-7});
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
  // polygamma(1, x) of a contiguous run takes the fixed-length sums of cpu/vector_special.cpp for x > 0
  // (and the scalar function for the rest of its block), a strided run the scalar loop: the same
  // values to rounding, from near 0 to far out, poles, the reflection, NaN and inf in between.
  std::vector<double> sweep = grid(-20, 40, 1500);
  for (double v : {1e-300, 1e-8, 0.0, -0.0, -3.0, 1e8, 1e15, 1e200, double(INFINITY), -double(INFINITY), double(NAN)}) {
    sweep.push_back(v);
  }
  const Tensor run = f64(sweep), strided = stack({run, run}, 1).select(1, 0);
  const Tensor run32 = run.to(kFloat32), strided32 = stack({run32, run32}, 1).select(1, 0);
  test::check_close(polygamma(1, run), polygamma(1, strided), {2e-15, 0});
  test::check_close(polygamma(1, run32), polygamma(1, strided32), {1.2e-7, 0});
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

namespace {

// e^(-|x| scaled) I_nu(x) = (1 / N) sum_k e^(x cos t_k - scaled |x|) cos(nu t_k), t_k = 2 pi k / N: the
// trapezoidal rule on a periodic integrand, exact to float64 once N is well past x (error about I_N(x)).
Tensor bessel_i_integral(const std::vector<double>& xs, int nu, bool scaled) {
  const int64_t n = 2048;
  const Tensor t = arange(0, n, 1, kFloat64) * (2 * kPi / n);
  const Tensor x = f64(xs).unsqueeze(1);
  Tensor e = (x * t.cos().unsqueeze(0) - (scaled ? x.abs() : zeros_like(x))).exp();
  if (nu == 1) e = e * t.cos().unsqueeze(0);
  return e.mean({1});
}

}  // namespace

TEST_CASE("special::i0, i0e, i1, i1e: the integral over the circle, both sides of |x| = 8, odd and even",
          "[ops][special]") {
  std::vector<double> xs = grid(-45, 45, 57);
  for (double x : {1e-3, 0.25, 7.99, 8.0, 8.01, -8.01, 30.0, 100.0, 400.0, 700.0}) xs.push_back(x);
  const Tensor x = f64(xs);
  // e^x I0 overflows past 709.78, where I0 itself is still finite: up to 700 the unscaled forms.
  test::check_close(special::i0(x), bessel_i_integral(xs, 0, false), {2e-14, 0});
  test::check_close(special::i1(x), bessel_i_integral(xs, 1, false), {2e-14, 1e-16});
  test::check_close(special::i0e(x), bessel_i_integral(xs, 0, true), {2e-14, 0});
  test::check_close(special::i1e(x), bessel_i_integral(xs, 1, true), {2e-14, 1e-16});
  // I0 is even, I1 odd; I0 is finite up to 713.98 (e^x alone is not), scaled forms tend to 0 at inf.
  test::check_close(special::i0(-x), special::i0(x), {0, 0});
  test::check_close(special::i1(-x), -special::i1(x), {0, 0});
  CHECK(std::isfinite(special::i0(f64({713.0})).item<double>()));
  CHECK(std::isinf(special::i0(f64({714.0})).item<double>()));
  // The limits at +-inf (PyTorch 1.13's i0 and i1 give NaN there).
  const std::vector<double> limits = values_of(special::i1(f64({INFINITY, -INFINITY})));
  CHECK(limits[0] == INFINITY);
  CHECK(limits[1] == -INFINITY);
  CHECK(special::i0(f64({-INFINITY})).item<double>() == INFINITY);
  test::check_close(special::i0e(f64({1e300, INFINITY, -INFINITY})), f64({1 / std::sqrt(2 * kPi * 1e300), 0.0, 0.0}),
                    {1e-15, 0});
  CHECK(std::signbit(special::i1(f64({-0.0})).item<double>()));
  // A contiguous run goes through cpu/vector_special.cpp, 64 elements at a time, a strided one through
  // core/bessel_math.h element by element: the same series, so the same values to rounding (e^x is
  // Eigen's in one, glibc's in the other; where the series' terms cancel, 20-fold near x = 8, the two
  // differ by up to 1.1e-15 relatively in the ASan build, at -O2), in blocks that need one series, the
  // other or both.
  std::vector<double> sweep = grid(-720, 720, 1001);
  for (double v : grid(-9, 9, 300)) sweep.push_back(v);
  for (double v : {0.0, -0.0, 1e-300, double(INFINITY), -double(INFINITY), double(NAN)}) sweep.push_back(v);
  const Tensor contiguous = f64(sweep), pairs = stack({contiguous, contiguous}, 1);
  const Tensor strided = pairs.select(1, 0), strided32 = pairs.to(kFloat32).select(1, 0);
  REQUIRE_FALSE(strided.is_contiguous());
  REQUIRE_FALSE(strided32.is_contiguous());
  for (auto f : {+[](const Tensor& t) { return special::i0(t); }, +[](const Tensor& t) { return special::i0e(t); },
                 +[](const Tensor& t) { return special::i1(t); }, +[](const Tensor& t) { return special::i1e(t); }}) {
    test::check_close(f(contiguous), f(strided), {4e-15, 0});
    test::check_close(f(contiguous.to(kFloat32)), f(strided32), {2.4e-7, 0});
  }
  // The gradients at x = 0, where I1 / x is taken as its limit: d I1 = d i1e = 1/2.
  for (auto f : {+[](const Tensor& t) { return special::i1(t); }, +[](const Tensor& t) { return special::i1e(t); }}) {
    Tensor z = f64({0.0}).requires_grad_();
    f(z).sum().backward();
    CHECK(z.grad().item<double>() == 0.5);
  }
}

TEST_CASE("special::bessel_j0, j1, y0, y1, modified_bessel_k0, k1, scaled: integrals and Wronskians",
          "[ops][special]") {
  // Both sides of each switch (J, Y at 2 and 8; K at 1), small and large x.
  std::vector<double> xs = grid(0.02, 60, 83);
  for (double x : {1e-6, 0.999, 1.001, 1.999, 2.001, 7.999, 8.001, 150.0, 1e3}) xs.push_back(x);
  const Tensor x = f64(xs);
  // J_nu(x) = (1 / 2pi) int_0^2pi cos(nu t - x sin t) dt, by the trapezoidal rule (exact, N well past x).
  const int64_t n = 4096;
  const Tensor t = (arange(0, n, 1, kFloat64) * (2 * kPi / n)).unsqueeze(0);
  const Tensor xc = x.unsqueeze(1);
  // (x sin t rounds to 1e-13 at x = 1e3: the mean of 4096 such terms is within 4e-15.)
  test::check_close(special::bessel_j0(x), (xc * t.sin()).cos().mean({1}), {0, 4e-15});
  test::check_close(special::bessel_j1(x), (t - xc * t.sin()).cos().mean({1}), {0, 4e-15});
  // The Wronskians J1 Y0 - J0 Y1 = 2 / (pi x) and I0 K1 + I1 K0 = 1 / x (scaled: no overflow).
  const Tensor j0 = special::bessel_j0(x), j1 = special::bessel_j1(x);
  const Tensor y0 = special::bessel_y0(x), y1 = special::bessel_y1(x);
  test::check_close(j1 * y0 - j0 * y1, 2 / (kPi * x), {1e-13, 0});
  test::check_close(
      special::i0e(x) * special::scaled_modified_bessel_k1(x) + special::i1e(x) * special::scaled_modified_bessel_k0(x),
      1 / x, {1e-14, 0});
  test::check_close(special::modified_bessel_k0(x), special::scaled_modified_bessel_k0(x) * (-x).exp(), {1e-15, 0});
  test::check_close(special::modified_bessel_k1(x), special::scaled_modified_bessel_k1(x) * (-x).exp(), {1e-15, 0});
  // Parity, the limits (PyTorch 1.13 gives NaN for J and Y at +-inf; these are the functions' limits), the
  // domain, and spherical j0 = sin(x) / x.
  test::check_close(special::bessel_j0(-x), j0, {0, 0});
  test::check_close(special::bessel_j1(-x), -j1, {0, 0});
  const std::vector<double> ends = values_of(special::bessel_j0(f64({INFINITY, -INFINITY, 0.0})));
  CHECK(ends[0] == 0);
  CHECK(ends[1] == 0);
  CHECK(ends[2] == 1);
  CHECK(special::bessel_y1(f64({INFINITY})).item<double>() == 0);
  CHECK(special::bessel_y0(f64({0.0})).item<double>() == -INFINITY);
  CHECK(std::isnan(special::bessel_y0(f64({-1.0})).item<double>()));
  CHECK(special::modified_bessel_k1(f64({0.0})).item<double>() == INFINITY);
  CHECK(std::isnan(special::scaled_modified_bessel_k0(f64({-1.0})).item<double>()));
  test::check_close(special::spherical_bessel_j0(x), x.sin() / x, {1e-15, 0});
  // Contiguous runs take glibc's vector sin (cpu/vector_math.cpp), strided ones the scalar loop.
  const Tensor sweep = f64(grid(-1e3, 1e3, 2001)), pairs = stack({sweep, sweep}, 1);
  test::check_close(special::spherical_bessel_j0(pairs.select(1, 0)), special::spherical_bessel_j0(sweep), {1e-15, 0});
  test::check_close(special::spherical_bessel_j0(pairs.to(kFloat32).select(1, 0)),
                    special::spherical_bessel_j0(sweep.to(kFloat32)), {2.4e-7, 0});
  test::check_close(special::modified_bessel_i0(x), special::i0(x), {0, 0});
  test::check_close(special::modified_bessel_i1(x), special::i1(x), {0, 0});
  // J, Y and K of contiguous runs take cpu/vector_special.cpp's blocks (Note [J, Y and K a block at a
  // time]), strided ones the scalar loop: the same to rounding on both sides of each switch (1, 2, 8),
  // near 0, far out (Hankel's sin x and cos x reduced exactly to x = 1e300), the edges of the domain,
  // subnormal K, +-inf and NaN. J and Y against their envelope (their zeros), K relatively.
  std::vector<double> points = grid(-30, 60, 1800);
  for (double edge : {1.0, 2.0, 8.0}) {
    for (int k = -4; k <= 4; ++k) points.push_back(edge + k * 0x1p-49);
  }
  for (double v : {1e-300, 4.9e-324, 1e-8, 0.0, -0.0, -1.0, -8.5, 700.0, 740.0, 1e5, 1e10, 1e22, 1e300,
                   double(INFINITY), -double(INFINITY), double(NAN)}) {
    points.push_back(v);
  }
  const Tensor run = f64(points), strided = stack({run, run}, 1).select(1, 0);
  const Tensor run32 = run.to(kFloat32), strided32 = stack({run32, run32}, 1).select(1, 0);
  using Unary = Tensor (*)(const Tensor&);
  const std::vector<Unary> functions = {special::bessel_j0,
                                        special::bessel_j1,
                                        special::bessel_y0,
                                        special::bessel_y1,
                                        special::modified_bessel_k0,
                                        special::modified_bessel_k1,
                                        special::scaled_modified_bessel_k0,
                                        special::scaled_modified_bessel_k1};
  for (size_t f = 0; f < functions.size(); ++f) {
    const std::vector<double> got = values_of(functions[f](run)), want = values_of(functions[f](strided));
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("function " << f << ", x = " << points[i] << ": " << got[i] << " against " << want[i]);
      if (std::isfinite(want[i])) {
        const double size =
            f < 4 ? std::max(std::abs(want[i]), 1 / std::sqrt(std::max(std::abs(points[i]), 1.0))) : std::abs(want[i]);
        CHECK(std::abs(got[i] - want[i]) <= 2e-15 * size + 1e-320);
      } else {
        CHECK((got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))));
      }
    }
    // Float32: each the float64 value rounded once (from fewer terms: an ulp apart at most).
    test::check_close(functions[f](run32), functions[f](strided32), {1.2e-7, 1e-30});
  }
  // The gradients at 0, where J1 / x and (cos x - j0) / x take their limits.
  Tensor z = f64({0.0, 0.0}).requires_grad_();
  (special::bessel_j1(z.select(0, 0)) + special::spherical_bessel_j0(z.select(0, 1))).backward();
  test::check_close(z.grad(), f64({0.5, 0.0}), {0, 0});
}

TEST_CASE("special::erfcx, ndtr, log_ndtr, ndtri: compositions, inverses to the far tail, symmetry", "[ops][special]") {
  // Multiples of 1/16, whose squares are exact: e^(x^2) erfc(x) composed is then within a few ulps.
  std::vector<double> xs;
  for (int k = -80; k <= 128; ++k) xs.push_back(k / 16.0);
  const Tensor x = f64(xs);
  test::check_close(special::erfcx(x), (x * x).exp() * erfc(x), {1e-14, 0});
  // Elsewhere x^2 rounds (by x^2 2^-53, 7e-14 at 25, in e^(x^2)): against long double's product.
  std::vector<double> odd = grid(1, 25.9, 41), reference;
  for (double v : odd) {
    const long double lv = v;
    reference.push_back(static_cast<double>(std::exp(lv * lv) * std::erfc(lv)));
  }
  test::check_close(special::erfcx(f64(odd)), f64(reference), {1e-14, 0});
  // The asymptotic series from 26 meets the product below it; 1 / (x sqrt pi) at large x; +inf left of -26.6.
  const double below = special::erfcx(f64({std::nextafter(26.0, 0.0)})).item<double>();
  CHECK(std::abs(special::erfcx(f64({26.0})).item<double>() / below - 1) < 1e-14);
  CHECK(std::abs(special::erfcx(f64({1e10})).item<double>() * 1e10 * std::sqrt(kPi) - 1) < 1e-15);
  CHECK(std::isinf(special::erfcx(f64({-27.0})).item<double>()));
  CHECK(std::isfinite(special::erfcx(f64({-26.6})).item<double>()));

  // ndtr = erfc(-x / sqrt 2) / 2, and log_ndtr = log(ndtr) where ndtr is representable.
  const Tensor t = f64(grid(-30, 8, 77));
  test::check_close(special::ndtr(t), erfc(t * -std::sqrt(0.5)) / 2, {1e-15, 0});
  // (Right of 0 log(ndtr) loses digits to ndtr's rounding near 1: there log1p(-ndtr(-x)).)
  const Tensor left_half = f64(grid(-30, 0, 61)), right_half = f64(grid(0, 8, 33));
  test::check_close(special::log_ndtr(left_half), special::ndtr(left_half).log(), {1e-13, 0});
  test::check_close(special::log_ndtr(right_half), (-special::ndtr(-right_half)).log1p(), {1e-14, 0});
  // Below, log_ndtr(x) = -x^2 / 2 - log(-x sqrt(2 pi)) + log(1 - 1/x^2 + 3/x^4 - 15/x^6 + ...).
  for (double v : {-50.0, -1e3, -1e5}) {
    const double z = 1 / (v * v);
    const double series = z * (-1 + z * (3 + z * (-15 + z * (105 + z * (-945 + z * 10395)))));
    const double asymptotic = -v * v / 2 - std::log(-v * std::sqrt(2 * kPi)) + std::log1p(series);
    CHECK(std::abs(special::log_ndtr(f64({v})).item<double>() / asymptotic - 1) < 1e-14);
  }
  // ndtri inverts ndtr (left tail: ndtr keeps its digits there), down to p = 1e-300 through log_ndtr.
  const Tensor left = f64(grid(-37, 0, 75));
  test::check_close(special::ndtri(special::ndtr(left)), left, {1e-13, 1e-15});
  std::vector<double> ps;
  for (int k = 1; k <= 300; k += 7) ps.push_back(std::pow(10.0, -k));
  const Tensor p = f64(ps);
  test::check_close(special::log_ndtr(special::ndtri(p)), p.log(), {1e-13, 0});
  // 1 - p is exact for these: ndtri(1 - p) = -ndtri(p), ndtri(1/2) = 0; the limits and NaN outside.
  const Tensor q = f64(fractions(0, 1));
  test::check_close(special::ndtri(1 - q), -special::ndtri(q), {0, 0});
  const std::vector<double> ends = values_of(special::ndtri(f64({0.5, 0.0, 1.0, -1e-300, 1.5})));
  CHECK(ends[0] == 0);
  CHECK(ends[1] == -INFINITY);
  CHECK(ends[2] == INFINITY);
  CHECK(std::isnan(ends[3]));
  CHECK(std::isnan(ends[4]));
  // float32: the float64 value rounded once (the float32 steps stop at 1e-10), to 1e-38.
  const Tensor p32 = f64({1e-38, 1e-20, 1e-7, 0.3, 0.5, 0.9, 0.9999}).to(kFloat32);
  for (auto f :
       {+[](const Tensor& v) { return special::ndtri(v); }, +[](const Tensor& v) { return special::log_ndtr(v); },
        +[](const Tensor& v) { return special::erfcx(v); }, +[](const Tensor& v) { return special::i0e(v); }}) {
    test::check_close(f(p32), f(p32.to(kFloat64)).to(kFloat32), {1.2e-7, 0});
  }
  // A float32 run of ndtri or erfinv goes through cpu/vector_math.cpp's loop, which leaves 0, 1 (+-1),
  // NaN, the outside and ndtri's far tail (p < 2^-25) to the scalar function; a strided one through
  // the scalar loop: the same steps, so the same values to rounding.
  std::vector<double> mixed = grid(0, 1, 1999);
  for (double v : {0.0, 1.0, 1e-30, 0x1p-25, 0x1p-26, 1 - 0x1p-24, -0.5, 1.5, double(NAN)}) mixed.push_back(v);
  const Tensor run = f64(mixed).to(kFloat32), signed_run = (f64(mixed) * 2 - 1).to(kFloat32);
  const Tensor strided = stack({run, run}, 1).select(1, 0),
               signed_strided = stack({signed_run, signed_run}, 1).select(1, 0);
  REQUIRE_FALSE(strided.is_contiguous());
  test::check_close(special::ndtri(strided), special::ndtri(run), {2.4e-7, 0});
  test::check_close(erfinv(signed_strided), erfinv(signed_run), {2.4e-7, 0});
  // erfcx and log_ndtr of contiguous runs: SIMD loops that take both of erfcx's forms and keep one
  // (cpu/vector_math.cpp); strided runs the scalar functions. Both sides of 26 and of -1, where
  // e^(x^2) overflows (-26.6), far out, +-inf and NaN.
  std::vector<double> wide = grid(-40, 60, 2000);
  for (double v : {26.0, -26.0, 26 - 1e-12, -26.6, -26.7, -27.5, -1.0, -1 - 1e-15, 0.0, -0.0, 1e10, 1e300, -1e300,
                   double(INFINITY), -double(INFINITY), double(NAN)}) {
    wide.push_back(v);
  }
  const Tensor wide_run = f64(wide), wide_strided = stack({wide_run, wide_run}, 1).select(1, 0);
  const Tensor wide32 = wide_run.to(kFloat32), wide_strided32 = stack({wide32, wide32}, 1).select(1, 0);
  for (auto f :
       {+[](const Tensor& v) { return special::erfcx(v); }, +[](const Tensor& v) { return special::log_ndtr(v); }}) {
    test::check_close(f(wide_run), f(wide_strided), {4e-15, 0});
    test::check_close(f(wide32), f(wide_strided32), {1.2e-7, 0});
  }
}

TEST_CASE("special::entr, xlog1py: their compositions, zeros, the gradient at 0", "[ops][special]") {
  const Tensor x = f64(grid(0.01, 5, 40));
  test::check_close(special::entr(x), -x * x.log(), {1e-15, 0});
  const std::vector<double> e = values_of(special::entr(f64({0.0, -1e-300, NAN})));
  CHECK(e[0] == 0);
  CHECK(e[1] == -INFINITY);
  CHECK(std::isnan(e[2]));
  // entr and ndtr of a contiguous run take glibc's SIMD log and erfc (cpu/vector_math.cpp), a strided
  // run the scalar loop: the same values to rounding, special values included.
  std::vector<double> sweep = grid(-40, 40, 1999);
  for (double v : {0.0, -0.0, 1e-300, -1e-300, double(INFINITY), -double(INFINITY), double(NAN)}) sweep.push_back(v);
  for (DType d : {kFloat64, kFloat32}) {
    const Tensor run = f64(sweep).to(d), strided = stack({run, run}, 1).select(1, 0);
    const test::Tolerance tol = d == kFloat64 ? test::Tolerance{1e-15, 1e-300} : test::Tolerance{2.4e-7, 1e-38};
    test::check_close(special::entr(run), special::entr(strided), tol);
    test::check_close(special::ndtr(run), special::ndtr(strided), tol);
    // xlog1py too (glibc's SIMD log1p), with 0 and NaN among the x and y below -1 among the y.
    const Tensor y = run.flip({0}) / 20, y_strided = stack({y, y}, 1).select(1, 0);
    test::check_close(special::xlog1py(run, y), special::xlog1py(strided, y_strided), tol);
  }
  Tensor z = f64({0.0, 1.0}).requires_grad_();
  special::entr(z).sum().backward();
  test::check_close(z.grad(), f64({INFINITY, -1.0}), {0, 0});  // -(1 + log x), PyTorch's
  const Tensor a = f64(grid(-3, 3, 13)), b = f64(grid(-0.9, 4, 13));
  test::check_close(special::xlog1py(a, b), a * b.log1p(), {1e-15, 0});
  CHECK(special::xlog1py(f64({0.0}), f64({-1.0})).item<double>() == 0);
  CHECK(std::isnan(special::xlog1py(f64({0.0}), f64({NAN})).item<double>()));
  // The gradient in a is log1p(b), but 0 where a = 0 and b <= -1 (log1p is -inf or NaN there), as
  // PyTorch's; in b it is a / (1 + b).
  {
    Tensor ga = f64({0.0, 0.0, 2.0, 0.0}).requires_grad_(), gb = f64({-1.0, -2.0, 3.0, 1.0}).requires_grad_();
    special::xlog1py(ga, gb).sum().backward();
    test::check_close(ga.grad(), f64({0.0, 0.0, std::log(4.0), std::log(2.0)}), {1e-15, 0});
    test::check_close(gb.grad(), f64({NAN, -0.0, 0.5, 0.0}), {1e-15, 0});  // 0 / 0 at the first
  }
  // 1e-20: log1p keeps it (log(1 + b) would give 0).
  CHECK(special::xlog1py(f64({3.0}), f64({1e-20})).item<double>() == 3.0 * 1e-20);
}

TEST_CASE("special::zeta: Riemann's values, the recurrence in q, negative q, large x and q, polygamma",
          "[ops][special]") {
  const std::vector<double> z =
      values_of(special::zeta(f64({2.0, 4.0, 2.0, 2.0, 6.0}), f64({1.0, 1.0, 0.5, -0.5, 2.0})));
  CHECK(std::abs(z[0] / (kPi * kPi / 6) - 1) < 1e-15);
  CHECK(std::abs(z[1] / (std::pow(kPi, 4) / 90) - 1) < 1e-15);
  CHECK(std::abs(z[2] / (kPi * kPi / 2) - 1) < 1e-15);      // (2^2 - 1) zeta(2)
  CHECK(std::abs(z[3] / (kPi * kPi / 2 + 4) - 1) < 1e-15);  // and (-1/2)^-2 more
  CHECK(std::abs(z[4] / (std::pow(kPi, 6) / 945 - 1) - 1) < 1e-14);
  // zeta(x, q) - zeta(x, q + 1) = q^-x over real x and q, with q + 1 exact.
  std::vector<double> xs, qs;
  for (double xv : grid(1.05, 25, 9)) {
    for (double qv : {0.125, 0.75, 1.5, 3.25, 9.5, 40.0, 2e3}) {
      xs.push_back(xv);
      qs.push_back(qv);
    }
  }
  const Tensor xt = f64(xs), qt = f64(qs);
  test::check_close(special::zeta(xt, qt) - special::zeta(xt, qt + 1), qt.pow(-xt), {5e-13, 1e-300});
  // The sum for q < 0 taken through three positive ones: q = -1e15 + 1/2 (1e15 terms one by one) sums
  // to pi^2 less its tail from 1e15 (1e-15).
  CHECK(std::abs(special::zeta(f64({2.0}), f64({-1e15 + 0.5})).item<double>() / (kPi * kPi) - 1) < 1e-14);
  CHECK(std::isnan(special::zeta(f64({2.5}), f64({-0.5})).item<double>()));  // x not whole for q < 0
  // Large x: the first terms are the sum; large q: q^(1 - x) / (x - 1) + q^-x / 2 + ....
  const double big = special::zeta(f64({60.0}), f64({1.5})).item<double>();
  CHECK(std::abs(big / (std::pow(1.5, -60) + std::pow(2.5, -60) + std::pow(3.5, -60)) - 1) < 1e-15);
  CHECK(special::zeta(f64({1e6}), f64({1.5})).item<double>() == 0);
  const double far = special::zeta(f64({2.0}), f64({1e10})).item<double>();
  CHECK(std::abs(far / (1e-10 + 0.5e-20) - 1) < 1e-15);
  // Past q = 2^60 the first two terms through one power, which does not underflow where q^-x does:
  // zeta(2, 1e200) = 1e-200, zeta(3, 1e160) = 5e-321 (a subnormal), polygamma(1, 1e200) = 1e-200.
  test::check_close(special::zeta(f64({2.0, 3.0, 2.0}), f64({1e200, 1e160, 0x1p61})),
                    f64({1e-200, 5e-321, 1 / 0x1p61 + 0.5 / 0x1p122}), {1e-15, 1e-323});
  test::check_close(polygamma(1, f64({1e200})), f64({1e-200}), {1e-15, 0});
  // polygamma(n, x) = (-1)^(n+1) n! zeta(n + 1, x).
  const Tensor g = f64(grid(0.3, 12, 11));
  test::check_close(polygamma(3, g), special::zeta(full_like(g, 4.0), g) * 6, {1e-14, 0});
  // The gradient in q is -x zeta(x + 1, q); in x it is an Error, as in PyTorch.
  Tensor q = f64({1.5}).requires_grad_();
  special::zeta(f64({3.0}), q).backward();
  CHECK(std::abs(q.grad().item<double>() / (-3 * special::zeta(f64({4.0}), f64({1.5})).item<double>()) - 1) < 1e-15);
  test::check_error(
      [] {
        Tensor s = f64({3.0}).requires_grad_();
        special::zeta(s, f64({1.5})).backward();
      },
      {"zeta", "gradient with respect to x", "detach"});
}

TEST_CASE("special::gammainc, gammaincc: P + Q = 1, closed forms, the recurrence in a up to a = 5000",
          "[ops][special]") {
  std::vector<double> as, xs;
  for (double av : {0.05, 0.5, 1.0, 2.5, 7.0, 15.0, 60.0, 400.0}) {
    for (double r : {0.01, 0.3, 0.9, 1.0, 1.1, 2.0, 5.0}) {
      as.push_back(av);
      xs.push_back(av * r);
    }
  }
  const Tensor a = f64(as), x = f64(xs);
  const Tensor p = special::gammainc(a, x), q = special::gammaincc(a, x);
  test::check_close(p + q, ones_like(p), {0, 4e-16});
  // a = 1: P = 1 - e^-x; a = 1/2: P = erf(sqrt x), Q = erfc(sqrt x) (x = (k/16)^2: sqrt exact).
  const Tensor t = f64(grid(0.01, 40, 31));
  test::check_close(special::gammainc(ones_like(t), t), -(-t).expm1(), {1e-14, 0});
  test::check_close(special::gammaincc(ones_like(t), t), (-t).exp(), {1e-14, 0});
  std::vector<double> squares;
  for (int k = 1; k <= 96; ++k) squares.push_back(k * k / 256.0);
  const Tensor sq = f64(squares);
  test::check_close(special::gammainc(full_like(sq, 0.5), sq), erf(sq.sqrt()), {1e-14, 0});
  test::check_close(special::gammaincc(full_like(sq, 0.5), sq), erfc(sq.sqrt()), {1e-13, 0});
  // Whole a = n: Q = e^-x sum_{k < n} x^k / k!.
  for (int n : {2, 5, 12, 30}) {
    const Tensor v = f64(grid(0.2, 3.0 * n, 17));
    Tensor term = ones_like(v), sum = ones_like(v);
    for (int k = 1; k < n; ++k) {
      term = term * v / k;
      sum = sum + term;
    }
    INFO("n = " << n);
    test::check_close(special::gammaincc(full_like(v, n), v), sum * (-v).exp(), {1e-13, 0});
  }
  // P(a + 1, x) = P(a, x) - x^a e^-x / Gamma(a + 1), at large a (Stirling's form of the factor) and x
  // on both sides of a (the series and the continued fraction).
  for (double av : {50.0, 500.0, 5000.0}) {
    const Tensor v = f64({0.8 * av, 0.97 * av, av, 1.03 * av, 1.2 * av});
    const Tensor av_t = full_like(v, av);
    const Tensor density = (av_t * v.log() - v - lgamma(av_t + 1)).exp();
    INFO("a = " << av);
    test::check_close(special::gammainc(av_t + 1, v), special::gammainc(av_t, v) - density, {1e-11, 1e-300});
  }
  // The edges, as PyTorch's.
  const std::vector<double> e =
      values_of(special::gammainc(f64({0.0, 1.0, INFINITY, 2.0, -1.0}), f64({1.0, 0.0, 1.0, INFINITY, 1.0})));
  CHECK(e[0] == 1);
  CHECK(e[1] == 0);
  CHECK(e[2] == 0);
  CHECK(e[3] == 1);
  CHECK(std::isnan(e[4]));
  // The gradient in x is the density x^(a-1) e^-x / Gamma(a); in a it is an Error, as in PyTorch.
  Tensor xg = f64({2.0}).requires_grad_();
  special::gammaincc(f64({3.0}), xg).backward();
  CHECK(std::abs(xg.grad().item<double>() / (-4 * std::exp(-2.0) / 2) - 1) < 1e-15);
  test::check_error(
      [] {
        Tensor ag = f64({3.0}).requires_grad_();
        special::gammainc(ag, f64({1.5})).backward();
      },
      {"gammainc", "gradient with respect to a", "detach"});
  CHECK(igamma(f64({2.0}), f64({1.0})).item<double>() == special::gammainc(f64({2.0}), f64({1.0})).item<double>());
  CHECK(igammac(f64({2.0}), f64({1.0})).item<double>() == special::gammaincc(f64({2.0}), f64({1.0})).item<double>());
}

TEST_CASE("special::multigammaln: lgamma sums and its Errors, and special's aliases", "[ops][special]") {
  const Tensor a = f64(grid(2, 9, 15));
  test::check_close(special::multigammaln(a, 1), lgamma(a), {0, 1e-15});
  test::check_close(special::multigammaln(a, 3), lgamma(a) + lgamma(a - 0.5) + lgamma(a - 1) + 1.5 * std::log(kPi),
                    {1e-15, 1e-14});
  test::check_close(mvlgamma(a, 2), special::multigammaln(a, 2), {0, 0});
  test::check_error([] { special::multigammaln(f64({3.0}), 0); }, {"multigammaln", "p must be at least 1"});
  test::check_error(
      [] {
        special::multigammaln(f64({3.0, 1.4}), 4);
      },
      {"multigammaln", "greater than (p - 1) / 2", "1.5"});
  CHECK(special::multigammaln(from_vector<int64_t>({3}), 2).dtype() == kFloat32);
  const Tensor x = f64(grid(-3, 3, 7));
  test::check_close(special::expit(x), sigmoid(x), {0, 0});
  test::check_close(special::psi(a), digamma(a), {0, 0});
  test::check_close(special::gammaln(a), lgamma(a), {0, 0});
  test::check_close(i0(x), special::i0(x), {0, 0});
  // Integers become float32; float16 and bfloat16 compute in float32 and round once.
  CHECK(special::i0(from_vector<int64_t>({1, 2})).dtype() == kFloat32);
  CHECK(special::zeta(from_vector<int64_t>({2}), from_vector<int64_t>({1})).dtype() == kFloat32);
  const Tensor h = test::sample({4, 5}, kFloat32, 0.3) * 3;
  for (auto f :
       {+[](const Tensor& v) { return special::i1(v); }, +[](const Tensor& v) { return special::erfcx(v); },
        +[](const Tensor& v) { return special::log_ndtr(v); }, +[](const Tensor& v) { return special::entr(v); }}) {
    for (DType d : {kFloat16, kBFloat16}) test::check_close(f(h.to(d)), f(h.to(d).to(kFloat32)).to(d), {0, 0});
  }
}

namespace {
using PolynomialFn = Tensor (*)(const Tensor&, const Tensor&);
// d^k/dx^k of f(x, n) at x, by autograd (each order a call of the next derivative op).
Tensor derivative(PolynomialFn f, const Tensor& x, const Tensor& n, int k) {
  Tensor leaf = x.detach().requires_grad_();
  Tensor y = f(leaf, n);
  for (int i = 0; i < k; ++i) y = autograd::grad({y.sum()}, {leaf}, {}, {}, true).at(0);
  return y.detach();
}

// The size of the three-term recurrence's terms at x (Note [the orthogonal polynomials]): the same
// recurrence with |a x + b| and |c|, M_{k+1} = (|a x + b| M_k + |c| M_{k-1}) / d. Each step's rounding
// is within an ulp of it. family: 0-3 Chebyshev's T, U, V, W, 4-7 the same shifted, 8 H, 9 He, 10 L, 11 P.
double recurrence_size(size_t family, double x, double n) {
  if (family >= 4 && family < 8) family -= 4, x = 2 * x - 1;
  const double first[12][2] = {{1, 0}, {2, 0}, {2, -1}, {2, 1}, {}, {}, {}, {}, {2, 0}, {1, 0}, {-1, 1}, {1, 0}};
  double p = 1, q = std::abs(first[family][0] * x + first[family][1]);
  for (double k = 1; k < n; ++k) {
    double a = 2, b = 0, c = 1, d = 1;  // Chebyshev's
    if (family == 8) c = 2 * k;
    if (family == 9) a = 1, c = k;
    if (family == 10) a = -1, b = 2 * k + 1, c = k, d = k + 1;
    if (family == 11) a = 2 * k + 1, c = k, d = k + 1;
    const double r = (std::abs(a * x + b) * q + c * p) / d;
    p = q;
    q = r;
  }
  return q + 1;
}

}  // namespace

TEST_CASE("special's orthogonal polynomials: recurrences across the closed forms, relations, limits, Errors",
          "[ops][special]") {
  // Inside and outside [-1, 1], and at the ends, for n = 1 .. 40 (Chebyshev's closed forms from 16):
  // each family's three-term recurrence holds between the op's own values.
  std::vector<double> xs = grid(-1.6, 1.6, 29);
  for (double v : {-1.0, 1.0, -0.999999, 1.000001}) xs.push_back(v);
  const Tensor x = f64(xs);
  auto at = [&](PolynomialFn f, int n) { return f(x, scalar_tensor(n, kFloat64)); };
  for (int k = 1; k < 40; ++k) {
    INFO("k = " << k);
    for (PolynomialFn f : {+[](const Tensor&a, const Tensor&n) { return special::chebyshev_polynomial_t(a, n); },
                           +[](const Tensor&a, const Tensor&n) { return special::chebyshev_polynomial_u(a, n); },
                           +[](const Tensor&a, const Tensor&n) { return special::chebyshev_polynomial_v(a, n); },
                           +[](const Tensor&a, const Tensor&n) { return special::chebyshev_polynomial_w(a, n); }}) {
      const Tensor next = at(f, k + 1), scale = at(f, k).abs() + at(f, k - 1).abs() + 1;
      test::check_close((next - (2 * x * at(f, k) - at(f, k - 1))) / scale, zeros_like(x), {0, 1e-13});
    }
    const double kd = k;
    test::check_close(at(special::hermite_polynomial_h, k + 1),
                      2 * x * at(special::hermite_polynomial_h, k) - 2 * kd * at(special::hermite_polynomial_h, k - 1),
                      {1e-12, 1e-12});
    test::check_close(
        at(special::legendre_polynomial_p, k + 1) * (kd + 1),
        (2 * kd + 1) * x * at(special::legendre_polynomial_p, k) - kd * at(special::legendre_polynomial_p, k - 1),
        {1e-12, 1e-12});
    test::check_close(
        at(special::laguerre_polynomial_l, k + 1) * (kd + 1),
        (2 * kd + 1 - x) * at(special::laguerre_polynomial_l, k) - kd * at(special::laguerre_polynomial_l, k - 1),
        {1e-12, 1e-12});
  }
  // Closed forms: T_n(cos t) = cos(n t), U_n(cosh t) = sinh((n + 1) t) / sinh t; V and W through U;
  // H_n(x) = 2^(n/2) He_n(sqrt(2) x); shifted p_n(x) = p_n(2x - 1).
  const Tensor t = f64(grid(0.05, 3.1, 23)), n20 = scalar_tensor(20.0, kFloat64);
  test::check_close(special::chebyshev_polynomial_t(t.cos(), n20), (t * 20).cos(), {0, 1e-13});
  test::check_close(special::chebyshev_polynomial_u(t.cosh(), n20), (t * 21).sinh() / t.sinh(), {1e-13, 0});
  for (double n : {3.0, 17.0, 40.0}) {
    const Tensor nn = scalar_tensor(n, kFloat64), before = scalar_tensor(n - 1, kFloat64);
    const Tensor u = special::chebyshev_polynomial_u(x, nn), u1 = special::chebyshev_polynomial_u(x, before);
    const Tensor scale = u.abs() + u1.abs() + 1;
    test::check_close((special::chebyshev_polynomial_v(x, nn) - (u - u1)) / scale, zeros_like(x), {0, 1e-13});
    test::check_close((special::chebyshev_polynomial_w(x, nn) - (u + u1)) / scale, zeros_like(x), {0, 1e-13});
    // H_n's recurrence cancels (at x = -1.07 its terms reach 1.6e4 times H_17): a bound of n ulp of them.
    const std::vector<double> h = values_of(special::hermite_polynomial_h(x, nn)),
                              he = values_of(std::pow(2.0, n / 2) *
                                             special::hermite_polynomial_he(x * std::sqrt(2.0), nn));
    for (size_t i = 0; i < xs.size(); ++i) {
      INFO("H_" << n << "(" << xs[i] << ")");
      CHECK(std::abs(h[i] - he[i]) <= 4e-16 * n * recurrence_size(8, xs[i], n));
    }
    const Tensor s = (x + 1) / 2;
    test::check_close(special::shifted_chebyshev_polynomial_t(s, nn), special::chebyshev_polynomial_t(2 * s - 1, nn),
                      {0, 0});
    test::check_close(special::shifted_chebyshev_polynomial_w(s, nn), special::chebyshev_polynomial_w(2 * s - 1, nn),
                      {0, 0});
  }
  // Values from mpmath at 50 digits: far past 16 (U at n = 5000 just outside [-1, 1]); the leading term
  // past |x| = 2^400 and 1e40 below it; values past float64's range as +-inf with their sign, where
  // PyTorch 1.13's recurrence makes inf - inf = NaN; and a finite value reached through such scalings.
  auto value = [](PolynomialFn f, double x, double n) {
    return f(f64({x}), scalar_tensor(n, kFloat64)).item<double>();
  };
  CHECK(std::abs(value(special::chebyshev_polynomial_u, -1.0000001, 5000) / 10346.089477434352 - 1) < 1e-13);
  CHECK(std::abs(value(special::chebyshev_polynomial_t, 1e40, 7) / 6.4e281 - 1) < 1e-15);
  CHECK(std::abs(value(special::laguerre_polynomial_l, 1e40, 7) / -1.9841269841269845e276 - 1) < 1e-15);
  CHECK(std::abs(value(special::legendre_polynomial_p, -1e40, 7) / -2.6812500000000006e281 - 1) < 1e-15);
  CHECK(std::abs(value(special::hermite_polynomial_h, 1e200, 1) / 2e200 - 1) < 1e-15);
  // Below 2^400 the recurrence: L_7(1e13) is 5e-12 from its leading term there.
  CHECK(std::abs(value(special::laguerre_polynomial_l, 1e13, 7) / -1.9841269841172619e87 - 1) < 1e-15);
  // Chebyshev's quotients through their logarithms where the numerator passes e^700 and the value does
  // not overflow (x = cosh(1/2) rounded, mpmath's values; the phase n t = 700 carries 1e-13).
  const double c = 1.1276259652063807;
  CHECK(std::abs(value(special::chebyshev_polynomial_u, c, 1400) / 1.6044914859506180e304 - 1) < 5e-13);
  CHECK(std::abs(value(special::chebyshev_polynomial_t, c, 1401) / 8.3609298103355363e303 - 1) < 5e-13);
  CHECK(std::abs(value(special::chebyshev_polynomial_v, c, 1401) / 1.0408677555934213e304 - 1) < 5e-13);
  CHECK(std::abs(value(special::chebyshev_polynomial_w, c, 1401) / 4.2498507274946573e304 - 1) < 5e-13);
  CHECK(std::abs(value(special::laguerre_polynomial_l, -5, 1000) / 7.7049554067913034e58 - 1) < 1e-12);
  CHECK(std::abs(value(special::legendre_polynomial_p, 1.001, 3000) / 6.4414365455732847e56 - 1) < 1e-12);
  CHECK(value(special::hermite_polynomial_h, 0.5, 1000) == -INFINITY);  // -3.5e1433
  CHECK(value(special::hermite_polynomial_he, 2.5, 777) == INFINITY);
  CHECK(value(special::hermite_polynomial_h, 0.0, 1001) == 0);
  CHECK(value(special::chebyshev_polynomial_t, -2.0, 1001) == -INFINITY);
  CHECK(value(special::legendre_polynomial_p, -1.5, 2001) == -INFINITY);
  // The limits at +-inf (PyTorch 1.13: NaN): the leading term's sign; degree 0 is 1 everywhere.
  CHECK(value(special::chebyshev_polynomial_t, -INFINITY, 3) == -INFINITY);
  CHECK(value(special::laguerre_polynomial_l, INFINITY, 3) == -INFINITY);
  CHECK(value(special::laguerre_polynomial_l, -INFINITY, 4) == INFINITY);
  CHECK(value(special::hermite_polynomial_he, -INFINITY, 2) == INFINITY);
  CHECK(value(special::legendre_polynomial_p, NAN, 0) == 1);
  // n: its whole part; 0 below 0; NaN for NaN and +inf (PyTorch 1.13: 0).
  CHECK(value(special::chebyshev_polynomial_t, 0.5, 7.9) == value(special::chebyshev_polynomial_t, 0.5, 7));
  CHECK(value(special::legendre_polynomial_p, 0.5, -0.5) == 1);
  CHECK(value(special::hermite_polynomial_h, 0.5, -3) == 0);
  CHECK(std::isnan(value(special::chebyshev_polynomial_t, 0.5, NAN)));
  CHECK(std::isnan(value(special::chebyshev_polynomial_w, 0.5, INFINITY)));
  CHECK(value(special::chebyshev_polynomial_t, 1.0, 1e300) == 1);  // any degree in closed form
  CHECK(value(special::chebyshev_polynomial_u, -1.0, 1e15 + 1) == -(1e15 + 2));

  // The recurrence's families take n <= 2^24; so do the gradients of all.
  test::check_error([] { special::hermite_polynomial_h(f64({0.5}), f64({16777217.0})); },
                    {"hermite_polynomial_h", "at most 2^24", "16777217", "three-term recurrence"});
  test::check_error([] { special::laguerre_polynomial_l(f64({0.5}), from_vector<int64_t>({int64_t{1} << 40})); },
                    {"laguerre_polynomial_l", "at most 2^24"});
  test::check_error([] { special::legendre_polynomial_p(f64({0.5}), f64({INFINITY})); }, {"at most 2^24"});
  Tensor leaf = f64({0.5}).requires_grad_();
  Tensor far = special::chebyshev_polynomial_t(leaf, f64({1e9}));
  CHECK(std::isfinite(far.item<double>()));
  test::check_error([&] { far.backward(); }, {"chebyshev_polynomial_t", "at most 2^24", "for a gradient"});

  // Numbers for x or n: the same values; an integer n keeps x's dtype, a number x with an integer n gives
  // float32, as in PyTorch.
  const Tensor n = from_vector<int64_t>({0, 3, 8, 17});
  const Tensor x32 = test::sample({4}, kFloat32, 0.6);
  test::check_close(special::legendre_polynomial_p(x32, 5), special::legendre_polynomial_p(x32, full({4}, 5.0)),
                    {0, 0});
  CHECK(special::legendre_polynomial_p(x32, 5).dtype() == kFloat32);
  CHECK(special::legendre_polynomial_p(x, 5).dtype() == kFloat64);
  const Tensor by_number = special::chebyshev_polynomial_w(0.25, n);
  CHECK(by_number.dtype() == kFloat32);
  test::check_close(by_number, special::chebyshev_polynomial_w(full({4}, 0.25), n), {0, 0});
  CHECK(special::hermite_polynomial_he(from_vector<int64_t>({2}), from_vector<int64_t>({3})).item<float>() == 2);
  // zeta, xlog1py and xlogy take a number on either side too.
  const Tensor q = f64({0.5, 1.0, 3.0});
  test::check_close(special::zeta(2.0, q), special::zeta(full_like(q, 2.0), q), {0, 0});
  test::check_close(special::zeta(q + 1.5, 1.0), special::zeta(q + 1.5, ones_like(q)), {0, 0});
  test::check_close(special::xlog1py(q, 2.0), q * std::log1p(2.0), {1e-15, 0});
  test::check_close(special::xlog1py(3.0, q), 3.0 * q.log1p(), {1e-15, 0});
  test::check_close(xlogy(q, 2.0), q * std::log(2.0), {1e-15, 0});
  test::check_close(xlogy(0.0, q), zeros_like(q), {0, 0});
  CHECK(special::zeta(2, from_vector<int64_t>({1, 2})).dtype() == kFloat32);
  for (DType d : {kFloat16, kBFloat16}) {
    test::check_close(special::laguerre_polynomial_l(x32.to(d), n),
                      special::laguerre_polynomial_l(x32.to(d).to(kFloat32), n).to(d), {0, 0});
  }
}

TEST_CASE("special's orthogonal polynomials: a contiguous run of one degree, a block at a time, against strided",
          "[ops][special]") {
  // A contiguous x with one degree takes cpu/vector_special.cpp's recurrence across a block's lanes, or
  // from degree 16 Chebyshev's closed forms through glibc's SIMD functions (Note [the orthogonal
  // polynomials a block at a time]); a strided x the scalar loop. Every family and shift, degrees on
  // both sides of 16, x inside and beyond [-1, 1], at +-1, past 2^400 (the leading term), +-inf, NaN,
  // and where the plain recurrence overflows (H_300(50), beyond float64; L_300(1000), which the scaled
  // recurrence brings back into range).
  std::vector<double> xs = grid(-1.5, 1.5, 301);
  for (double v : {-1.0, 1.0, 0.0, -0.0, 0.5, 50.0, -50.0, 1e3, 0x1p401, -0x1p401, 1e300, double(INFINITY),
                   -double(INFINITY), double(NAN)}) {
    xs.push_back(v);
  }
  const Tensor run = f64(xs), strided = stack({run, run}, 1).select(1, 0);
  const Tensor run32 = run.to(kFloat32), strided32 = stack({run32, run32}, 1).select(1, 0);
  using Fn = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<Fn> families = {special::chebyshev_polynomial_t,         special::chebyshev_polynomial_u,
                                    special::chebyshev_polynomial_v,         special::chebyshev_polynomial_w,
                                    special::shifted_chebyshev_polynomial_t, special::shifted_chebyshev_polynomial_u,
                                    special::shifted_chebyshev_polynomial_v, special::shifted_chebyshev_polynomial_w,
                                    special::hermite_polynomial_h,           special::hermite_polynomial_he,
                                    special::laguerre_polynomial_l,          special::legendre_polynomial_p};
  for (size_t f = 0; f < families.size(); ++f) {
    for (double n : {1.0, 2.0, 3.0, 10.0, 15.0, 16.0, 17.7, 50.0, 300.0}) {
      INFO("family " << f << ", n = " << n);
      const Tensor degree = scalar_tensor(n, kFloat64);
      const std::vector<double> got = values_of(families[f](run, degree)),
                                want = values_of(families[f](strided, degree));
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("x = " << xs[i] << ": " << got[i] << " against " << want[i]);
        if (std::isfinite(want[i])) {
          // The closed forms' cos(n t) carries acos's rounding n-fold: n ulp of the value's size. The
          // recurrence rounds each step (fused or not, as each loop compiles): n ulp of its terms' size.
          const bool closed_form = f < 8 && n >= 16;
          const double size = closed_form ? std::abs(want[i]) + 1 : recurrence_size(f, xs[i], n);
          CHECK(std::abs(got[i] - want[i]) <= 4e-16 * n * size);
        } else {
          CHECK((got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))));
        }
      }
      test::check_close(families[f](run32, degree.to(kFloat32)), families[f](strided32, degree.to(kFloat32)),
                        {1.2e-7, 1.2e-7});
    }
  }
}

TEST_CASE("special's orthogonal polynomials: derivatives to the third order against their ODEs and relations",
          "[ops][special]") {
  const Tensor x = f64(grid(-0.98, 0.98, 17)), wide = f64(grid(-2.5, 2.5, 19)), y = f64(grid(0.05, 8, 15));
  // sum(terms) = 0 to tol of the terms' largest size over the grid (near a root each term has the
  // absolute error of its values elsewhere).
  auto check_zero = [](const std::vector<Tensor>& terms, double tol) {
    Tensor total = zeros_like(terms[0]);
    double size = 1;
    for (const Tensor& t : terms) {
      total = total + t;
      size += t.abs().max().item<double>();
    }
    test::check_close(total / size, zeros_like(total), {0, tol});
  };
  for (int n : {0, 1, 2, 5, 16, 23}) {
    INFO("n = " << n);
    const double nd = n;
    const Tensor nn = scalar_tensor(nd, kFloat64), before = scalar_tensor(nd - 1, kFloat64);
    auto d = [&](PolynomialFn f, const Tensor& at, int k) { return derivative(f, at, nn, k); };
    // T' = n U_(n-1); Chebyshev's equations (1 - x^2) T'' - x T' + n^2 T = 0, differentiated once for the
    // third derivative, and (1 - x^2) U'' - 3x U' + n (n + 2) U = 0.
    test::check_close(d(special::chebyshev_polynomial_t, wide, 1), nd * special::chebyshev_polynomial_u(wide, before),
                      {1e-12, 1e-12});
    const Tensor t1 = d(special::chebyshev_polynomial_t, x, 1), t2 = d(special::chebyshev_polynomial_t, x, 2);
    check_zero({(1 - x * x) * t2, -x * t1, nd * nd * special::chebyshev_polynomial_t(x, nn)}, 1e-14);
    check_zero({(1 - x * x) * d(special::chebyshev_polynomial_t, x, 3), -3 * x * t2, (nd * nd - 1) * t1}, 1e-14);
    check_zero(
        {(1 - x * x) * d(special::chebyshev_polynomial_u, x, 2), -3 * x * d(special::chebyshev_polynomial_u, x, 1),
         nd * (nd + 2) * special::chebyshev_polynomial_u(x, nn)},
        1e-14);
    // Hermite: H' = 2n H_(n-1), He' = n He_(n-1), H'' - 2x H' + 2n H = 0.
    test::check_close(d(special::hermite_polynomial_h, wide, 1), 2 * nd * special::hermite_polynomial_h(wide, before),
                      {1e-12, 1e-12});
    test::check_close(d(special::hermite_polynomial_he, wide, 1), nd * special::hermite_polynomial_he(wide, before),
                      {1e-12, 1e-12});
    check_zero({d(special::hermite_polynomial_h, wide, 2), -2 * wide * d(special::hermite_polynomial_h, wide, 1),
                2 * nd * special::hermite_polynomial_h(wide, nn)},
               1e-14);
    // Legendre's (1 - x^2) P'' - 2x P' + n (n + 1) P = 0 and Laguerre's x L'' + (1 - x) L' + n L = 0.
    check_zero({(1 - x * x) * d(special::legendre_polynomial_p, x, 2), -2 * x * d(special::legendre_polynomial_p, x, 1),
                nd * (nd + 1) * special::legendre_polynomial_p(x, nn)},
               1e-14);
    check_zero({y * d(special::laguerre_polynomial_l, y, 2), (1 - y) * d(special::laguerre_polynomial_l, y, 1),
                nd * special::laguerre_polynomial_l(y, nn)},
               1e-14);
    // Shifted: d^2/dx^2 p_n(2x - 1) = 4 p_n''(2x - 1); W = U_n + U_(n-1), so W' = U_n' + U_(n-1)'.
    const Tensor s = (x + 1) / 2;
    test::check_close(d(special::shifted_chebyshev_polynomial_v, s, 2), 4 * d(special::chebyshev_polynomial_v, x, 2),
                      {1e-12, 1e-12});
    test::check_close(
        d(special::chebyshev_polynomial_w, x, 1),
        d(special::chebyshev_polynomial_u, x, 1) + derivative(special::chebyshev_polynomial_u, x, before, 1),
        {1e-12, 1e-12});
  }
  // At the leading term's side of 2^400 and at +-inf: n! / (n - k)! c_n x^(n - k).
  CHECK(derivative(special::chebyshev_polynomial_t, f64({INFINITY}), f64({3.0}), 3).item<double>() == 24);
  CHECK(derivative(special::chebyshev_polynomial_t, f64({-INFINITY}), f64({4.0}), 2).item<double>() == INFINITY);
  CHECK(derivative(special::legendre_polynomial_p, f64({1e121}), f64({2.0}), 2).item<double>() == 3);
  // n gets a zero gradient; past the seventh derivative an Error.
  Tensor n = f64({3.5, 2.0}).requires_grad_();
  special::hermite_polynomial_he(f64({0.7, 1.1}), n).sum().backward();
  test::check_close(n.grad(), f64({0.0, 0.0}), {0, 0});
  test::check_error([] { derivative(special::chebyshev_polynomial_t, f64({0.3}), f64({9.0}), 8); },
                    {"chebyshev_polynomial_t", "order above 7"});
}

TEST_CASE("special::airy_ai: Airy's equation, values at 0 and the zeros, the integral, limits", "[ops][special]") {
  // Ai(0) = 1 / (3^(2/3) Gamma(2/3)), Ai'(0) = -1 / (3^(1/3) Gamma(1/3)) (DLMF 9.2.3, 9.2.4).
  Tensor z = f64({0.0}).requires_grad_();
  const Tensor a0 = special::airy_ai(z);
  CHECK(std::abs(a0.item<double>() - 0.35502805388781723926) < 1e-16);
  CHECK(std::abs(autograd::grad({a0}, {z}).at(0).item<double>() + 0.25881940379280679840) < 1e-16);
  // Ai'' = x Ai, through the derivative's own gradient, on each side of the switches at -2 and 2.
  const Tensor x = f64(grid(-30, 60, 181));
  Tensor leaf = x.detach().requires_grad_();
  const Tensor d1 = autograd::grad({special::airy_ai(leaf).sum()}, {leaf}, {}, {}, true).at(0);
  const Tensor d2 = autograd::grad({d1.sum()}, {leaf}).at(0);
  test::check_close(d2, x * special::airy_ai(x), {0, 0});
  // Ai' from the tables against Ai's central differences (h = 1e-5: error 1e-10 relative).
  const Tensor y = f64(grid(-12, 12, 97));
  const double h = 1e-5;
  test::check_close(derivative(
                        +[](const Tensor& a, const Tensor&) { return special::airy_ai(a); }, y, y, 1),
                    (special::airy_ai(y + h) - special::airy_ai(y - h)) / (2 * h), {1e-7, 1e-10});
  // At its zeros a_1, a_2, a_10 (DLMF table 9.9.1) rounded to float64: mpmath's values there, 3e-17,
  // -2.7e-16 and -4.2e-16 (the roundings times Ai'(a_k)).
  test::check_close(special::airy_ai(f64({-2.338107410459767038, -4.087949444130970617, -12.828776752865757200})),
                    f64({2.7433e-17, -2.7203e-16, -4.2219e-16}), {0, 1.5e-16});
  // The integral over [0, inf) is 1/3 (DLMF 9.10.11): Simpson's rule on [0, 40], h = 1/2000 (its error
  // about 40 h^4 / 180 = 1.4e-14).
  const int steps = 80000;
  std::vector<double> nodes;
  for (int i = 0; i <= steps; ++i) nodes.push_back(40.0 * i / steps);
  const std::vector<double> f = values_of(special::airy_ai(f64(nodes)));
  double sum = f.front() + f.back();
  for (int i = 1; i < steps; ++i) sum += (i % 2 ? 4 : 2) * f[i];
  CHECK(std::abs(sum * (40.0 / steps) / 3 - 1.0 / 3) < 5e-14);
  // Far right, e^-zeta with zeta carried to twice float64's precision (rounded, 1e-13 off at 96.5):
  // mpmath's Ai and Ai'.
  const Tensor right = f64({20.5, 50.25, 96.5});
  test::check_close(special::airy_ai(right),
                    f64({1.772136354314942104e-28, 7.8001500149504749667e-105, 3.0979822162318944528e-276}),
                    {2e-15, 0});
  test::check_close(derivative(
                        +[](const Tensor& a, const Tensor&) { return special::airy_ai(a); }, right, right, 1),
                    f64({-8.0451567937554895894e-28, -5.5331845153115389072e-104, -3.0440867188788630031e-275}),
                    {2e-15, 0});
  // Limits (PyTorch 1.13: NaN at +-inf), the subnormal values up to 107.7 (PyTorch 1.13: 0 past 103.9)
  // and 0 beyond, and float32 as float64 rounded once.
  const std::vector<double> ends = values_of(special::airy_ai(f64({INFINITY, -INFINITY, 105.0, 107.8, NAN})));
  CHECK(ends[0] == 0);
  CHECK(ends[1] == 0);
  CHECK(std::abs(ends[2] / 2.7006204174325602e-313 - 1) < 1e-10);  // subnormal: 1e-11 of its digits are gone
  CHECK(ends[3] == 0);
  CHECK(std::isnan(ends[4]));
  const Tensor w = f64(grid(-50, 50, 41)).to(kFloat32);
  test::check_close(special::airy_ai(w), special::airy_ai(w.to(kFloat64)).to(kFloat32), {1.2e-7, 1e-30});
}

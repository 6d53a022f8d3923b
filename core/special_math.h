// core/special_math.h: the special functions of the elementwise ops that neither C++ nor CUDA
// provides (digamma, polygamma, erfinv), on one element, for the CPU's loops and CUDA's kernels alike
// (core/scalar_math.h calls them). Each computes in float64 whatever T is and rounds once; for a
// float32 result (float16 and bfloat16 compute in float32) it takes fewer terms and Newton steps, enough
// to be within 1e-9 of the float64 value before that rounding. PyTorch's float32 kernels compute in
// float32, so they agree to float32's accuracy, not bit for bit.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "core/half.h"

namespace kiln::math {

// Out of line, also in CUDA kernels: math::unary's switch inlines every case, and these loops would
// raise the register count of the generic kernel that every unary op shares.
#define KILN_SPECIAL_FN KILN_HOST_DEVICE inline __attribute__((noinline))

// log |Gamma(x)|. On the host through lgamma_r, which does not write the global signgam as lgamma
// does (a data race between the threads of one op); CUDA's lgamma writes nothing.
template <typename T>
KILN_HOST_DEVICE inline T log_abs_gamma(T x) {
#if defined(__CUDA_ARCH__)
  return lgamma(x);
#else
  int sign;
  if constexpr (std::is_same_v<T, float>) {
    return lgammaf_r(x, &sign);
  } else {
    return lgamma_r(x, &sign);
  }
#endif
}

// Note [digamma by recurrence and asymptotic series]
// digamma(x) = d/dx log Gamma(x). For x >= 10 the asymptotic series
//   ln x - 1/(2x) - sum_k B_2k / (2k x^2k)  (B_2k the Bernoulli numbers)
// cut after x^-14 is exact to float64 (the next term is below 1e-17 there; for a float32 result x >= 6
// is enough, the term 4e-13); smaller x is carried up by
// digamma(x) = digamma(x + 1) - 1/x, and negative x by the reflection
//   digamma(x) = digamma(1 - x) - pi / tan(pi x),
// with tan taken of x's fractional part (the same value, tan having period pi, without the rounding
// of pi x for large x). PyTorch's (and SciPy's) values at the poles: +-inf at +-0 (the sign of -x),
// NaN at the negative integers.
KILN_SPECIAL_FN double digamma_f64(double x, bool float32_result = false) {
  constexpr double kPi = 3.14159265358979323846;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  using std::log, std::tan, std::trunc;
  if (x == 0) return std::signbit(x) ? kInf : -kInf;
  double result = 0;
  if (x < 0) {
    if (x == trunc(x)) return std::numeric_limits<double>::quiet_NaN();  // also -inf
    result = -kPi / tan(kPi * (x - trunc(x)));
    x = 1 - x;
  }
  const double start = float32_result ? 6 : 10;  // the series' error there: 4e-13, 1e-17
  while (x < start) {
    result -= 1 / x;
    x += 1;
  }
  if (x == kInf) return kInf;
  const double z = 1 / (x * x);
  // B_2k / 2k for k = 1..7: 1/12, -1/120, 1/252, -1/240, 1/132, -691/32760, 1/12
  const double series =
      z *
      (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 - z * (691.0 / 32760 - z / 12))))));
  return result + log(x) - 0.5 / x - series;  // NaN stays NaN through the sums
}

// Note [polygamma as a Hurwitz zeta]
// polygamma(n, x), the n-th derivative of digamma (n >= 1), is (-1)^(n+1) n! zeta(n + 1, x) with
// Hurwitz's zeta(s, q) = sum_{k >= 0} (q + k)^-s. The sum is taken term by term until
// a = q + k >= max(9, s + 4), then its tail from a by the Euler-Maclaurin formula:
//   a^(1-s) / (s - 1) + a^-s / 2 + sum_j B_2j / (2j)! s (s + 1) ... (s + 2j - 2) a^(1 - s - 2j),
// at most twelve terms of which reach float64's accuracy there. At q = 0, -1, -2, ... (a pole of every
// polygamma) zeta is +inf, so polygamma is +inf for odd n and -inf for even n, as PyTorch's for n >= 2
// (its n = 1 takes another formula, which gives a large finite number there). At x = +inf polygamma is
// its limit, 0 (PyTorch's zeta gives NaN there for n >= 2).
KILN_SPECIAL_FN double hurwitz_zeta_f64(int s, double q, bool float32_result = false) {
  using std::floor, std::abs;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (q != q) return q;
  if (q <= 0 && q == floor(q)) return kInf;
  if (q == kInf) return 0;
  // B_2j / (2j)! for j = 1..12.
  constexpr double kB[12] = {1.0 / 12,
                             -1.0 / 720,
                             1.0 / 30240,
                             -1.0 / 1209600,
                             1.0 / 47900160,
                             -691.0 / 1307674368000.0,
                             1.0 / 74724249600.0,
                             -3617.0 / 10670622842880000.0,
                             43867.0 / 5109094217170944000.0,
                             -174611.0 / 802857662698291200000.0,
                             77683.0 / 14101100039391805440000.0,
                             -236364091.0 / 1693824136731743669452800000.0};
  // a^-s by squaring (s is a whole number here): pow() took 19x PyTorch's time for polygamma(1, x).
  auto inverse_power = [s](double a) {
    double r = 1;
    for (int e = s; e > 0; e >>= 1, a *= a) {
      if (e & 1) r *= a;
    }
    return 1 / r;
  };
  // The tail's series needs a larger a for a larger s: from a = 9 alone it is 2e-11 off for s = 12 at
  // q = 9; from a >= max(9, s + 4) it is within 1e-14 for s up to 21 (checked against mpmath). A
  // float32 result starts it at max(4, s + 2) and stops at 1e-9 (within 4e-10): half the terms.
  const double start = float32_result ? (s + 2 > 4 ? s + 2 : 4) : (s + 4 > 9 ? s + 4 : 9);
  const double tolerance = float32_result ? 1e-9 : 1e-17;
  double sum = 0, a = q;
  for (; a < start; a += 1) sum += inverse_power(a);
  const double a_s = inverse_power(a), inverse_a2 = 1 / (a * a);
  sum += a * a_s / (s - 1.0) + a_s / 2;
  // factor = s (s + 1) ... (s + 2j - 2) a^(1 - s - 2j), built up two factors and a^-2 at a time.
  double factor = s * a_s / a;
  for (int j = 0; j < 12; ++j) {
    const double term = kB[j] * factor;
    sum += term;
    if (abs(term) <= tolerance * abs(sum)) break;
    factor *= (s + 2.0 * j + 1) * (s + 2.0 * j + 2) * inverse_a2;
  }
  return sum;
}

KILN_SPECIAL_FN double polygamma_f64(int n, double x, bool float32_result = false) {
  if (n == 0) return digamma_f64(x, float32_result);
  double factorial = 1;
  for (int i = 2; i <= n; ++i) factorial *= i;
  return (n % 2 == 1 ? factorial : -factorial) * hurwitz_zeta_f64(n + 1, x, float32_result);
}

// Note [erfinv by an approximation and Newton steps]
// erfinv(y) for |y| < 1 starts from Giles's single-precision polynomials in w = -log((1 - y)(1 + y))
// ("Approximating the erfinv function", GPU Computing Gems, 2011; relative error about 1e-7 where
// float32 can hold y, w < 16), and Newton steps make it float64-exact, two or three where |y| <= 0.5
// (each squares the relative error). Above |y| = 0.5 the steps solve log erfc(x) = log(1 - |y|)
// instead: 1 - |y| is exact there, where erf(x) - y would cancel to nothing, and log erfc is nearly a
// parabola in the tail, so the steps converge from the polynomials' poor start in float64's deep tail
// (|y| = 1 - 1e-14, w = 31.5: 5.425 where the root is 5.473). A float32 result takes one step.
// erfinv(+-1) = +-inf; |y| > 1 and NaN give NaN.
KILN_SPECIAL_FN double erfinv_f64(double y, bool float32_result = false) {
  using std::log, std::sqrt, std::erf, std::erfc, std::exp, std::abs;
  const double ay = abs(y);
  if (!(ay <= 1)) return std::numeric_limits<double>::quiet_NaN();
  if (ay == 1) return y * std::numeric_limits<double>::infinity();
  double w = -log((1 - ay) * (1 + ay)), p;
  if (w < 5) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double x = p * ay;
  constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
  // A float32 result takes one step on erf(x) = y, even in the tail: 1 - y >= 6e-8 there, so erf(x) - y
  // keeps 9 digits in float64, and the polynomials' 1e-7 becomes 1e-13, past float32's need.
  const bool erf_form = float32_result || ay <= 0.5;
  const double log_tail = erf_form ? 0 : log(1 - ay);
  const int steps = float32_result ? 1 : 12;
  for (int step = 0; step < steps && x != 0; ++step) {
    const double slope = kTwoOverSqrtPi * exp(-x * x);  // erf'(x)
    double dx;
    if (erf_form) {
      dx = (erf(x) - ay) / slope;
    } else {
      const double tail = erfc(x);
      dx = (log_tail - log(tail)) * tail / slope;  // d log erfc / dx = -slope / erfc
    }
    x -= dx;
    if (abs(dx) <= 1e-16 * abs(x)) break;
  }
  return std::signbit(y) ? -x : x;  // -0 stays -0
}

}  // namespace kiln::math

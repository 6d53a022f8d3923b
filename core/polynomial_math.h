// core/polynomial_math.h: torch.special's classical orthogonal polynomials p_n(x) (Chebyshev's T, U, V,
// W, Hermite's H and He, Laguerre's L, Legendre's P) and their derivatives, on one element, for the CPU's
// loops and CUDA's kernels alike (core/scalar_math.h calls them). float64 throughout; rounded once.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/special_math.h"

namespace kiln::math {

enum class Polynomial : uint8_t {
  ChebyshevT, ChebyshevU, ChebyshevV, ChebyshevW, HermiteH, HermiteHe, LaguerreL, LegendreP
};

// The largest degree evaluated by the recurrence (n steps per element), and the highest derivative
// (each backward asks for one more); ops/ checks both and says so in an Error.
constexpr double kMaxRecurrenceDegree = 16777216;  // 2^24
constexpr int kMaxPolynomialDerivative = 7;

// Note [the orthogonal polynomials]
// Each family obeys a three-term recurrence d p_{k+1} = (a x + b) p_k - c p_{k-1} from p_0 = 1 and its
// own p_1 (DLMF 18.9.1, 18.9.2 and table 18.9.1):
//   T, U, V, W  a = 2, c = 1                  p_1 = x, 2x, 2x - 1, 2x + 1
//   H           a = 2, c = 2k                 p_1 = 2x
//   He          a = 1, c = k                  p_1 = x
//   L           a = -1, b = 2k + 1, c = k,    d = k + 1,  p_1 = 1 - x
//   P           a = 2k + 1, c = k,            d = k + 1,  p_1 = x
// n is the whole part of the second argument, as PyTorch (7.9 -> 7); n < 0 gives 0, and p_0 = 1 even at
// x = NaN. A NaN n, or n = +inf, gives NaN (PyTorch 1.13: 0, from a float -> int64 conversion that C++
// leaves undefined).
//   Chebyshev's, from degree 16, have closed forms (DLMF 18.5.1-18.5.4) with x = cos t on [-1, 1]:
// T = cos(n t), U = sin((n+1) t) / sin t, V = cos((n+1/2) t) / cos(t/2), W = sin((n+1/2) t) / sin(t/2),
// and with x = cosh t beyond, cosh and sinh for cos and sin; so any n costs the same, as in PyTorch,
// which switches at degrees 6 and 8. At x = +-1 their exact values.
// The others run the recurrence, n steps, which is why ops/ limits n to 2^24 for them.
//   Where |x| > 2^400 (and at +-inf) p_n(x) is its leading term c_n x^n to float64's precision (the next
// is n^2 / x below it, for L). Where the recurrence overflows, it runs again scaling any value beyond
// 2^500 down by 2^500 and counting the scalings (a step multiplies by at most (2n + 1) x < 2^425), so
// that values beyond float64's range still come out as +-inf with the right sign (PyTorch's recurrence
// makes NaN there, inf - inf: H_1000(0.5)), and ones that come back into range are not lost.
//   The m-th derivative (m >= 1, for the gradients) comes from the recurrence differentiated m times:
// d p_{k+1}^(j) = (a x + b) p_k^(j) + j a p_k^(j-1) - c p_{k-1}^(j), for any family and any x; at
// |x| > 2^400 from the leading term, n! / (n - m)! c_n x^(n - m).

struct PolynomialStep {
  double a, b, c, d;
};
template <Polynomial F>
KILN_HOST_DEVICE inline PolynomialStep polynomial_step(double k) {
  if constexpr (F == Polynomial::HermiteH) return {2, 0, 2 * k, 1};
  else if constexpr (F == Polynomial::HermiteHe) return {1, 0, k, 1};
  else if constexpr (F == Polynomial::LaguerreL) return {-1, 2 * k + 1, k, k + 1};
  else if constexpr (F == Polynomial::LegendreP) return {2 * k + 1, 0, k, k + 1};
  else return {2, 0, 1, 1};  // Chebyshev's
}
// p_1(x) = slope x + offset.
template <Polynomial F>
KILN_HOST_DEVICE inline PolynomialStep polynomial_first() {
  switch (F) {
    case Polynomial::ChebyshevU: return {2, 0, 0, 0};
    case Polynomial::ChebyshevV: return {2, -1, 0, 0};
    case Polynomial::ChebyshevW: return {2, 1, 0, 0};
    case Polynomial::HermiteH: return {2, 0, 0, 0};
    case Polynomial::LaguerreL: return {-1, 1, 0, 0};
    default: return {1, 0, 0, 0};  // T, He, P
  }
}

// The m-th derivative of the leading term c_n x^n, n! / (n - m)! c_n x^(n - m), for |x| > 2^400 and
// +-inf. Past degree 200 its size there is beyond float64 whatever c_n is (1 / n! for L), so +-inf.
KILN_HOST_DEVICE inline double polynomial_leading_term(Polynomial f, double x, double n, int m) {
  using std::abs;
  if (n < m) return 0;
  const double power = n - m;
  const double sign = x < 0 && std::fmod(power, 2.0) != 0 ? -1 : 1;
  if (n > 200) return sign * std::numeric_limits<double>::infinity();
  double c = 1;  // c_n: 2^(n-1) for T, 2^n for U, V, W, H, 1 for He, (-1)^n / n! for L, (2n - 1)!! / n! for P
  switch (f) {
    case Polynomial::ChebyshevT: c = std::ldexp(1.0, static_cast<int>(n) - 1); break;
    case Polynomial::HermiteHe: break;
    case Polynomial::LaguerreL:
      for (double k = 1; k <= n; ++k) c /= -k;
      break;
    case Polynomial::LegendreP:
      for (double k = 1; k <= n; ++k) c *= (2 * k - 1) / k;
      break;
    default: c = std::ldexp(1.0, static_cast<int>(n)); break;
  }
  for (int i = 0; i < m; ++i) c *= n - i;
  return sign * c * std::pow(abs(x), power);
}

// v 2^scale, scale >= 0 (the recurrence's scalings by 2^-500 counted): +-inf past float64's range.
KILN_HOST_DEVICE inline double scaled_back(double v, int64_t scale) {
  return scale == 0 ? v : std::ldexp(v, scale > 4200 ? 4200 : static_cast<int>(scale));
}

// The three-term recurrence to degree n >= 1 (whole, at most kMaxRecurrenceDegree), the value only:
// first as it is, then, if that overflowed (an inf or NaN at the end, which no overflow avoids), again
// with the scalings. (Checking every step for them took 25% longer; one loop templated on whether it
// scales, called twice, took 12% longer than these two at degree 10: 23.1 against 20.6 ms for 2^22
// float32 T_10(x) in bench_special, so the step is written twice.)
template <Polynomial F>
KILN_SPECIAL_FN double polynomial_value(double x, double n) {
  using std::abs;
  const PolynomialStep first = polynomial_first<F>();
  double p = 1, q = first.a * x + first.b;
  for (double k = 1; k < n; ++k) {
    const PolynomialStep s = polynomial_step<F>(k);
    const double r = ((s.a * x + s.b) * q - s.c * p) * (1 / s.d);  // 1 / d off the chain of dependent steps
    p = q;
    q = r;
  }
  if (std::isfinite(q)) return q;
  p = 1;
  q = first.a * x + first.b;
  int64_t scale = 0;
  for (double k = 1; k < n; ++k) {
    const PolynomialStep s = polynomial_step<F>(k);
    const double r = ((s.a * x + s.b) * q - s.c * p) * (1 / s.d);
    p = q;
    q = r;
    if (abs(q) > 0x1p500) {
      p *= 0x1p-500;
      q *= 0x1p-500;
      scale += 500;
    }
  }
  return scaled_back(q, scale);
}

// The m-th derivative, 1 <= m <= kMaxPolynomialDerivative, by the differentiated recurrence.
template <Polynomial F>
KILN_SPECIAL_FN double polynomial_derivative(double x, double n, int m) {
  using std::abs;
  if (n < m) return 0;
  const PolynomialStep first = polynomial_first<F>();
  double p[kMaxPolynomialDerivative + 1] = {1}, q[kMaxPolynomialDerivative + 1] = {first.a * x + first.b, first.a};
  int64_t scale = 0;
  for (double k = 1; k < n; ++k) {
    const PolynomialStep s = polynomial_step<F>(k);
    const double linear = s.a * x + s.b, inverse_d = 1 / s.d;
    double largest = 0;
    for (int j = m; j >= 0; --j) {  // downwards, so q[j - 1] is still p_k's
      const double r = (linear * q[j] + (j > 0 ? j * s.a * q[j - 1] : 0) - s.c * p[j]) * inverse_d;
      p[j] = q[j];
      q[j] = r;
      largest = abs(r) > largest ? abs(r) : largest;
    }
    if (largest > 0x1p500) {
      for (int j = 0; j <= m; ++j) {
        p[j] *= 0x1p-500;
        q[j] *= 0x1p-500;
      }
      scale += 500;
    }
  }
  return scaled_back(q[m], scale);
}

// Chebyshev's closed forms (Note [the orthogonal polynomials]), degree n >= 16, the value only. At
// x < 0 through p_n(x) = (-1)^n p_n(-x) for T and U, V_n(x) = (-1)^n W_n(-x) and W's mirror image, so
// that t = acos(x) stays in [0, pi/2] and no denominator nears 0 but at x = 1, where t is exact.
KILN_SPECIAL_FN double chebyshev_closed_form(Polynomial f, double x, double n) {
  using std::abs, std::acos, std::acosh, std::cos, std::sin, std::cosh, std::sinh, std::exp, std::log1p;
  const double sign = x < 0 && std::fmod(n, 2.0) != 0 ? -1 : 1;
  if (x < 0 && f == Polynomial::ChebyshevV) f = Polynomial::ChebyshevW;
  else if (x < 0 && f == Polynomial::ChebyshevW) f = Polynomial::ChebyshevV;
  x = abs(x);
  if (x == 1) {
    switch (f) {
      case Polynomial::ChebyshevU: return sign * (n + 1);
      case Polynomial::ChebyshevW: return sign * (2 * n + 1);
      default: return sign;  // T, V
    }
  }
  if (x < 1) {
    const double t = acos(x);
    switch (f) {
      case Polynomial::ChebyshevU: return sign * sin((n + 1) * t) / sin(t);
      case Polynomial::ChebyshevV: return sign * cos((n + 0.5) * t) / cos(t / 2);
      case Polynomial::ChebyshevW: return sign * sin((n + 0.5) * t) / sin(t / 2);
      default: return sign * cos(n * t);
    }
  }
  // x = cosh t. Where the numerator's argument passes 700 its e^-(...) half is gone, and the quotient
  // is taken through its logarithm, so that a finite value whose numerator alone overflows stays finite.
  const double t = acosh(x);
  switch (f) {
    case Polynomial::ChebyshevU:
      return sign * ((n + 1) * t < 700 ? sinh((n + 1) * t) / sinh(t) : exp(n * t - log1p(-exp(-2 * t))));
    case Polynomial::ChebyshevV:
      return sign * ((n + 0.5) * t < 700 ? cosh((n + 0.5) * t) / cosh(t / 2) : exp(n * t - log1p(exp(-t))));
    case Polynomial::ChebyshevW:
      return sign * ((n + 0.5) * t < 700 ? sinh((n + 0.5) * t) / sinh(t / 2) : exp(n * t - log1p(-exp(-t))));
    default: return sign * (n * t < 700 ? cosh(n * t) : exp(n * t - 0.69314718055994530942));
  }
}

template <Polynomial F>
KILN_HOST_DEVICE inline double polynomial_of(double x, double n, int m) {
  if (m > 0) return polynomial_derivative<F>(x, n, m);
  constexpr bool chebyshev = F == Polynomial::ChebyshevT || F == Polynomial::ChebyshevU ||
                             F == Polynomial::ChebyshevV || F == Polynomial::ChebyshevW;
  if (chebyshev && n >= 16) return chebyshev_closed_form(F, x, n);
  return polynomial_value<F>(x, n);
}

// d^m/dx^m p_n(x) for the whole part of n (m = 0: p_n itself), shifted: p_n(2x - 1) (Chebyshev's
// shifted polynomials, on [0, 1]).
KILN_HOST_DEVICE inline double orthogonal_polynomial_f64(Polynomial f, double x, double n, int m, bool shifted) {
  using std::abs;
  if (n != n || n == std::numeric_limits<double>::infinity()) return std::numeric_limits<double>::quiet_NaN();
  n = std::trunc(n);
  if (n < 0) return 0;
  if (n == 0) return m == 0 ? 1 : 0;
  if (x != x) return x;
  double chain = 1;  // d/dx of 2x - 1, m times
  if (shifted) {
    x = 2 * x - 1;
    chain = std::ldexp(1.0, m);
  }
  if (abs(x) > 0x1p400) return chain * polynomial_leading_term(f, x, n, m);
  double value;
  switch (f) {
    case Polynomial::ChebyshevT: value = polynomial_of<Polynomial::ChebyshevT>(x, n, m); break;
    case Polynomial::ChebyshevU: value = polynomial_of<Polynomial::ChebyshevU>(x, n, m); break;
    case Polynomial::ChebyshevV: value = polynomial_of<Polynomial::ChebyshevV>(x, n, m); break;
    case Polynomial::ChebyshevW: value = polynomial_of<Polynomial::ChebyshevW>(x, n, m); break;
    case Polynomial::HermiteH: value = polynomial_of<Polynomial::HermiteH>(x, n, m); break;
    case Polynomial::HermiteHe: value = polynomial_of<Polynomial::HermiteHe>(x, n, m); break;
    case Polynomial::LaguerreL: value = polynomial_of<Polynomial::LaguerreL>(x, n, m); break;
    default: value = polynomial_of<Polynomial::LegendreP>(x, n, m); break;
  }
  return chain * value;
}

}  // namespace kiln::math

// core/bessel_math.h: the Bessel functions of torch.special on one element, for the CPU's loops and
// CUDA's kernels alike (core/scalar_math.h calls them): I0, I1 and their e^-|x| scalings, J0, J1,
// Y0, Y1, K0, K1 and their e^x scalings, and the spherical j0. Each computes in float64 and rounds
// once; a float32 result stops its series at 1e-10 instead of 1e-17. Absolute accuracy about 1e-16
// where the functions oscillate (J, Y: near their zeros the relative error grows, as any method
// that does not store the zeros gives), relative elsewhere.
#pragma once

#include <cmath>
#include <limits>

#include "core/special_math.h"

namespace kiln::math {

// Note [the modified Bessel functions I0 and I1]
// I_nu(x) for nu = 0, 1, and e^-|x| I_nu(x) (scaled; special::i0e, i1e). Up to |x| = 30 the series
// sum_k (x/2)^(2k + nu) / (k! (k + nu)!), all of whose terms are positive (at most 60 of them); beyond,
// Hankel's expansion e^|x| / sqrt(2 pi |x|) sum_k (-1)^k a_k(nu) / |x|^k with
// a_k = prod_{j <= k} (4 nu^2 - (2j - 1)^2) / (k! 8^k), whose terms fall below 1e-17 of the sum before
// k = 30 there. e^|x| is applied in two halves, so I0 is finite up to x = 713.98 as it should be (e^x
// alone overflows at 709.78). I1 is odd, I0 even.
KILN_SPECIAL_FN double bessel_i_f64(int nu, double x, bool scaled, bool float32_result = false) {
  using std::abs, std::exp, std::sqrt;
  if (x != x) return x;
  const double ax = abs(x);
  const double tolerance = float32_result ? 1e-10 : 1e-17;
  double value;
  if (ax == std::numeric_limits<double>::infinity()) {
    value = scaled ? 0 : ax;
  } else if (ax <= 30) {
    const double t = ax * ax / 4;
    double term = nu == 0 ? 1 : ax / 2, sum = term;
    for (int k = 1; k < 100 && term > tolerance * sum; ++k) {
      term *= t / (k * (k + nu));
      sum += term;
    }
    value = scaled ? sum * exp(-ax) : sum;
  } else {
    const double four_nu2 = 4.0 * nu * nu;
    double term = 1, sum = 1;
    for (int k = 1; k < 40; ++k) {
      term *= -(four_nu2 - (2 * k - 1) * (2 * k - 1)) / (8 * k * ax);
      sum += term;
      if (abs(term) <= tolerance * sum) break;
    }
    const double base = sum / sqrt(6.28318530717958647693 * ax);  // 0 at x = inf
    if (scaled) {
      value = base;
    } else {
      const double half = exp(ax / 2);
      value = half * base * half;
    }
  }
  return nu == 1 && std::signbit(x) ? -value : value;
}

// Note [J0, J1, Y0 and Y1: series, Miller's recurrence, Hankel's expansion]
// For 0 < x <= 2 the power series (DLMF 10.2.2, 10.8.1, 10.8.2), whose terms fall from the first:
//   J_nu = sum_k (-1)^k (x/2)^(2k + nu) / (k! (k + nu)!),
//   Y0 = (2/pi) (log(x/2) + gamma) J0 + (2/pi) sum_{k >= 1} (-1)^(k+1) H_k (x^2/4)^k / (k!)^2,
//   Y1 = -2 / (pi x) + (2/pi) log(x/2) J1 - (x / 2pi) sum_k (psi(k+1) + psi(k+2)) (-x^2/4)^k / (k! (k+1)!)
// (H_k the harmonic numbers, psi(k + 1) = H_k - gamma). For 2 < x < 25 Miller's algorithm: the
// recurrence J_(n-1) = (2n / x) J_n - J_(n+1), run downwards from arbitrary values at an n well past x
// (where J_n is negligible), is soon dominated by J_n, and 1 = J0 + 2 sum_k J_2k normalizes it. The
// same sequence gives Neumann's series for Y0 (DLMF section 10.23) and, differentiated, for Y1 = -Y0':
//   Y0 = (2/pi) (log(x/2) + gamma) J0 - (4/pi) sum_{k >= 1} (-1)^k J_2k / k,
//   Y1 = (2/pi) ((log(x/2) + gamma) J1 - J0 / x) + (2/pi) sum_{k >= 1} (-1)^k (J_(2k-1) - J_(2k+1)) / k.
// From x = 25 Hankel's expansion (DLMF 10.17.3, 10.17.4) with chi = x - (nu/2 + 1/4) pi:
//   J_nu = sqrt(2 / (pi x)) (P cos chi - Q sin chi), Y_nu = sqrt(2 / (pi x)) (P sin chi + Q cos chi),
// P = sum_k (-1)^k a_2k / x^2k, Q = sum_k (-1)^k a_(2k+1) / x^(2k+1), a_k = prod_{j <= k} (4 nu^2 -
// (2j - 1)^2) / (k! 8^k), whose terms fall below 1e-17 before k = 30 there; cos chi and sin chi are
// formed from cos x and sin x (reduced exactly) rather than taken of x - pi/4 rounded.
struct BesselPair {
  double first, second;  // nu = 0 and nu = 1
};

KILN_HOST_DEVICE inline void bessel_jy_positive(double x, bool want_y, double tolerance, BesselPair& j, BesselPair& y) {
  using std::log, std::sqrt, std::sin, std::cos, std::abs;
  constexpr double kPi = 3.14159265358979323846;
  constexpr double kEulerGamma = 0.57721566490153286061;
  if (x <= 2) {
    const double t = -x * x / 4;
    double term0 = 1, term1 = x / 2, harmonic = 0, psi_sum = 1 - 2 * kEulerGamma;  // psi(1) + psi(2)
    double y0_sum = 0, y1_sum = psi_sum;
    j = {term0, term1};
    for (int k = 1; k < 40; ++k) {
      term0 *= t / (static_cast<double>(k) * k);
      term1 *= t / (static_cast<double>(k) * (k + 1));
      harmonic += 1.0 / k;
      psi_sum += 1.0 / k + 1.0 / (k + 1);
      j.first += term0;
      j.second += term1;
      y0_sum -= harmonic * term0;           // (-1)^(k+1) H_k (x^2/4)^k / (k!)^2
      y1_sum += psi_sum * term1 / (x / 2);  // (psi(k+1) + psi(k+2)) (-x^2/4)^k / (k! (k+1)!)
      if (abs(term0) <= tolerance * abs(j.first) && abs(term1) <= tolerance * abs(j.second)) break;
    }
    if (want_y) {
      const double log_half = log(x / 2);
      y.first = 2 / kPi * ((log_half + kEulerGamma) * j.first + y0_sum);
      y.second = -2 / (kPi * x) + 2 / kPi * log_half * j.second - x / (2 * kPi) * y1_sum;
    }
    return;
  }
  if (x < 25) {
    // J_n for n = 0..top up to a common factor; top = x + 26 + 2 sqrt(x) leaves J_top below 1e-18.
    constexpr int kMaxTop = 64;
    double v[kMaxTop + 2];
    int top = static_cast<int>(x + 26 + 2 * sqrt(x));
    top += top % 2;
    v[top + 1] = 0;
    v[top] = 1e-300;
    for (int n = top; n >= 1; --n) v[n - 1] = 2.0 * n / x * v[n] - v[n + 1];
    double norm = v[0];
    for (int n = 2; n <= top; n += 2) norm += 2 * v[n];
    const double scale = 1 / norm;
    j = {v[0] * scale, v[1] * scale};
    if (want_y) {
      double sum0 = 0, sum1 = 0;
      for (int k = 1; 2 * k + 1 <= top; ++k) {
        const double sign = k % 2 == 0 ? 1.0 : -1.0;
        sum0 += sign * v[2 * k] / k;
        sum1 += sign * (v[2 * k - 1] - v[2 * k + 1]) / k;
      }
      const double log_term = log(x / 2) + kEulerGamma;
      y.first = 2 / kPi * (log_term * j.first) - 4 / kPi * sum0 * scale;
      y.second = 2 / kPi * (log_term * j.second - j.first / x) + 2 / kPi * sum1 * scale;
    }
    return;
  }
  // Hankel's expansion for nu = 0 and 1 together: a_k(0) and a_k(1) have the same recurrence in k.
  double p[2] = {1, 1}, q[2] = {0, 0};
  for (int nu = 0; nu < 2; ++nu) {
    const double four_nu2 = 4.0 * nu * nu;
    double term = 1;
    for (int k = 1; k < 60; ++k) {
      term *= (four_nu2 - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k * x);  // a_k / x^k
      // (-1)^(k/2) into P for even k, (-1)^((k-1)/2) into Q for odd k.
      const double signed_term = (k / 2) % 2 == 0 ? term : -term;
      if (k % 2 == 0) {
        p[nu] += signed_term;
      } else {
        q[nu] += signed_term;
      }
      if (abs(term) <= tolerance) break;
    }
  }
  const double c = cos(x), s = sin(x), factor = sqrt(1 / (kPi * x));  // sqrt(2 / (pi x)) / sqrt 2
  // chi = x - pi/4: cos chi = (c + s) / sqrt 2, sin chi = (s - c) / sqrt 2;
  // chi = x - 3pi/4: cos chi = (s - c) / sqrt 2, sin chi = -(s + c) / sqrt 2.
  j = {factor * (p[0] * (c + s) - q[0] * (s - c)), factor * (p[1] * (s - c) + q[1] * (s + c))};
  if (want_y) y = {factor * (p[0] * (s - c) + q[0] * (c + s)), factor * (-p[1] * (s + c) + q[1] * (s - c))};
}

// J0 (even) and J1 (odd): 1 and 0 at 0, 0 at +-inf.
KILN_SPECIAL_FN double bessel_j_f64(int nu, double x, bool float32_result = false) {
  using std::abs;
  if (x != x) return x;
  const double ax = abs(x);
  if (ax == std::numeric_limits<double>::infinity()) return 0;
  if (ax == 0) return nu == 0 ? 1 : x;
  BesselPair j{0, 0}, y{0, 0};
  bessel_jy_positive(ax, false, float32_result ? 1e-10 : 1e-17, j, y);
  if (nu == 0) return j.first;
  return x < 0 ? -j.second : j.second;
}

// Y0 and Y1: -inf at 0, NaN for x < 0, 0 at +inf.
KILN_SPECIAL_FN double bessel_y_f64(int nu, double x, bool float32_result = false) {
  if (x != x) return x;
  if (x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return 0;
  BesselPair j{0, 0}, y{0, 0};
  bessel_jy_positive(x, true, float32_result ? 1e-10 : 1e-17, j, y);
  return nu == 0 ? y.first : y.second;
}

// Note [K0 and K1: series, an integral by the trapezoidal rule, Hankel's expansion]
// For 0 < x <= 1 the series (DLMF 10.31.1)
//   K0 = -(log(x/2) + gamma) I0 + sum_{k >= 1} H_k (x^2/4)^k / (k!)^2,
//   K1 = 1/x + log(x/2) I1 - (x/4) sum_k (psi(k+1) + psi(k+2)) (x^2/4)^k / (k! (k+1)!).
// For 1 < x < 25 the integral e^x K_nu(x) = int_0^inf e^(-2x sinh^2(t/2)) cosh(nu t) dt (DLMF 10.32.9),
// by the trapezoidal rule, which converges geometrically in the step for an integrand analytic in a
// strip and decaying this fast: step 0.1 leaves it within 1e-15 of mpmath's values here (the series
// up to x = 2 was 2e-15 off near 2, from cancellation), and the terms fall below 1e-17 of the sum
// before t = 5. Every term is positive.
// From x = 25 Hankel's expansion (DLMF 10.40.2) e^x K_nu = sqrt(pi / 2x) sum_k a_k(nu) / x^k.
// K0 and K1 are +inf at 0 and NaN for x < 0; scaled, e^x K.
KILN_SPECIAL_FN double bessel_k_f64(int nu, double x, bool scaled, bool float32_result = false) {
  using std::log, std::sqrt, std::exp, std::sinh, std::cosh, std::abs;
  constexpr double kPi = 3.14159265358979323846;
  constexpr double kEulerGamma = 0.57721566490153286061;
  if (x != x) return x;
  if (x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return 0;
  const double tolerance = float32_result ? 1e-10 : 1e-17;
  double value;
  if (x <= 1) {
    const double t = x * x / 4, log_half = log(x / 2);
    double term0 = 1, term1 = x / 2, harmonic = 0, psi_sum = 1 - 2 * kEulerGamma;
    double i0 = 1, i1 = x / 2, sum0 = 0, sum1 = psi_sum * (x / 2);
    for (int k = 1; k < 40; ++k) {
      term0 *= t / (static_cast<double>(k) * k);
      term1 *= t / (static_cast<double>(k) * (k + 1));
      harmonic += 1.0 / k;
      psi_sum += 1.0 / k + 1.0 / (k + 1);
      i0 += term0;
      i1 += term1;
      sum0 += harmonic * term0;
      sum1 += psi_sum * term1;
      if (term0 <= tolerance * i0 && term1 <= tolerance * i1) break;
    }
    value = nu == 0 ? -(log_half + kEulerGamma) * i0 + sum0 : 1 / x + log_half * i1 - sum1 / 2;
    return scaled ? value * exp(x) : value;
  }
  if (x < 25) {
    constexpr double kStep = 0.1;
    double sum = 0.5;  // the t = 0 term, halved
    for (int k = 1; k < 200; ++k) {
      const double t = k * kStep, sh = sinh(t / 2);
      const double term = exp(-2 * x * sh * sh) * (nu == 0 ? 1 : cosh(t));
      sum += term;
      if (term <= tolerance * sum) break;
    }
    value = kStep * sum;  // e^x K_nu(x)
  } else {
    const double four_nu2 = 4.0 * nu * nu;
    double term = 1, sum = 1;
    for (int k = 1; k < 60; ++k) {
      term *= (four_nu2 - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k * x);
      sum += term;
      if (abs(term) <= tolerance * sum) break;
    }
    value = sqrt(kPi / (2 * x)) * sum;
  }
  return scaled ? value : value * exp(-x);
}

// sin(x) / x, 1 at 0, 0 at +-inf.
KILN_SPECIAL_FN double spherical_bessel_j0_f64(double x) {
  using std::sin, std::abs;
  if (x != x) return x;
  if (abs(x) == std::numeric_limits<double>::infinity()) return 0;
  if (x == 0) return 1;
  return sin(x) / x;
}

}  // namespace kiln::math

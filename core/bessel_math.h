// core/bessel_math.h: the Bessel functions of torch.special on one element, for the CPU's loops and
// CUDA's kernels alike (core/scalar_math.h calls them): I0, I1 and their e^-|x| scalings, J0, J1,
// Y0, Y1, K0, K1 and their e^x scalings, the spherical j0, and Airy's Ai and Ai'. Each computes in
// float64 and rounds once; a float32 result stops its series at 1e-10 instead of 1e-17 (and its
// Chebyshev series at 1e-11). Absolute accuracy about 1e-16 where the functions oscillate (J, Y, Ai:
// near their zeros the relative error grows, as any method that does not store the zeros gives),
// relative elsewhere.
#pragma once

#include <cmath>
#include <limits>

#include "core/bessel_tables.h"
#include "core/special_math.h"

namespace kiln::math {

// Note [the modified Bessel functions I0 and I1]
// I_nu(x) for nu = 0, 1, and e^-|x| I_nu(x) (scaled; special::i0e, i1e), from two Chebyshev series of
// the scaled function (core/bessel_tables.h): e^-x I0(x) and e^-x I1(x) / x for 0 <= x <= 8 in
// t = x / 4 - 1 (32 terms, 23 for a float32 result), sqrt(x) e^-x I_nu(x), which tends to
// 1 / sqrt(2 pi), for x > 8 in t = 16 / x - 1 (29 terms, 11). The unscaled function is the scaled one
// times e^|x|, applied in two halves, so I0 is finite up to x = 713.98 as it should be (e^x alone
// overflows at 709.78). I1 is odd, I0 even. Relatively within 8e-16 of mpmath's I0, 2e-15 of its I1 (near
// x = 8, where e^-x I1(x) / x has fallen to a thirtieth of its value at 0). (The power series and
// Hankel's expansion, which this replaced, took up to 60 terms with a division each.)
// cpu/vector_special.cpp sums the same series for a block of elements at a time.
KILN_SPECIAL_FN double bessel_i_f64(int nu, double x, bool scaled, bool float32_result = false) {
  using std::abs, std::exp, std::sqrt;
  if (x != x) return x;
  const double ax = abs(x);
  if (ax == std::numeric_limits<double>::infinity()) return scaled ? 0 : nu == 0 ? ax : x;
  double value;
  if (ax <= 8) {
    const double t = ax / 4 - 1;
    value = nu == 0 ? chebyshev_i0_small(t, float32_result) : x * chebyshev_i1_small(t, float32_result);
  } else {
    const double t = 16 / ax - 1;
    value = (nu == 0 ? chebyshev_i0_large(t, float32_result) : chebyshev_i1_large(t, float32_result)) / sqrt(ax);
    if (nu == 1 && x < 0) value = -value;
  }
  if (scaled) return value;
  const double half = exp(ax / 2);
  return half * value * half;
}

// Note [J0, J1, Y0 and Y1: series, Chebyshev series, Hankel's form]
// For 0 < x <= 2 the power series (DLMF 10.2.2, 10.8.1, 10.8.2), whose terms fall from the first:
//   J_nu = sum_k (-1)^k (x/2)^(2k + nu) / (k! (k + nu)!),
//   Y0 = (2/pi) (log(x/2) + gamma) J0 + (2/pi) sum_{k >= 1} (-1)^(k+1) H_k (x^2/4)^k / (k!)^2,
//   Y1 = -2 / (pi x) + (2/pi) log(x/2) J1 - (x / 2pi) sum_k (psi(k+1) + psi(k+2)) (-x^2/4)^k / (k! (k+1)!)
// (H_k the harmonic numbers, psi(k + 1) = H_k - gamma). For 2 < x <= 8 Chebyshev series of each
// function in t = (x - 5) / 3 (core/bessel_tables.h, 25 to 43 terms). Beyond, Hankel's form (DLMF
// 10.17) with chi = x - (nu/2 + 1/4) pi,
//   J_nu = sqrt(2 / (pi x)) (P cos chi - Q sin chi), Y_nu = sqrt(2 / (pi x)) (P sin chi + Q cos chi),
// where P and x Q are smooth in 1/x^2 and tend to 1 and (4 nu^2 - 1) / 8: Chebyshev series in
// t = 128 / x^2 - 1 (15 to 18 terms), fitted to P and Q as J and Y define them (not to Hankel's
// asymptotic series, which diverges). cos chi and sin chi are formed from cos x and sin x (reduced
// exactly) rather than taken of x - pi/4 rounded. (Miller's backward recurrence, which this replaced
// for 2 < x < 25, took 4.1x PyTorch's time for J0 and 6.3x for Y1 of float32 inputs.)
// The power series behind J, Y (s = -x^2/4) and I, K (s = x^2/4) for x <= 2, each term falling from the
// first: f_nu = sum_k s^k (x/2)^nu / (k! (k + nu)!) (J_nu or I_nu), h0 = sum_k H_k s^k / (k!)^2 and
// h1 = sum_k (psi(k+1) + psi(k+2)) s^k (x/2) / (k! (k+1)!).
struct BesselSeries {
  double f0, f1, h0, h1;
};
KILN_HOST_DEVICE inline BesselSeries bessel_series(double x, double s, double tolerance) {
  using std::abs;
  constexpr double kEulerGamma = 0.57721566490153286061;
  double term0 = 1, term1 = x / 2, harmonic = 0, psi_sum = 1 - 2 * kEulerGamma;  // psi(1) + psi(2)
  BesselSeries r{term0, term1, 0, psi_sum * term1};
  for (int k = 1; k < 40; ++k) {
    term0 *= s / (static_cast<double>(k) * k);
    term1 *= s / (static_cast<double>(k) * (k + 1));
    harmonic += 1.0 / k;
    psi_sum += 1.0 / k + 1.0 / (k + 1);
    r.f0 += term0;
    r.f1 += term1;
    r.h0 += harmonic * term0;
    r.h1 += psi_sum * term1;
    if (abs(term0) <= tolerance * abs(r.f0) && abs(term1) <= tolerance * abs(r.f1)) break;
  }
  return r;
}

// J_nu (second_kind false) or Y_nu of x > 0.
KILN_HOST_DEVICE inline double bessel_jy_positive(int nu, bool second_kind, double x, bool float32_result) {
  using std::sqrt, std::sin, std::cos;
  if (x <= 2) {
    constexpr double kPi = 3.14159265358979323846, kEulerGamma = 0.57721566490153286061;
    const BesselSeries r = bessel_series(x, -x * x / 4, float32_result ? 1e-10 : 1e-17);
    if (!second_kind) return nu == 0 ? r.f0 : r.f1;
    const double log_half = std::log(x / 2);
    if (nu == 0) return 2 / kPi * ((log_half + kEulerGamma) * r.f0 - r.h0);
    return -2 / (kPi * x) + 2 / kPi * log_half * r.f1 - r.h1 / kPi;
  }
  if (x <= 8) {
    const double t = (x - 5) / 3;
    if (nu == 0) return second_kind ? chebyshev_y0_middle(t, float32_result) : chebyshev_j0_middle(t, float32_result);
    return second_kind ? chebyshev_y1_middle(t, float32_result) : chebyshev_j1_middle(t, float32_result);
  }
  const double t = 128 / (x * x) - 1;
  const double p = nu == 0 ? chebyshev_p0(t, float32_result) : chebyshev_p1(t, float32_result);
  const double q = (nu == 0 ? chebyshev_xq0(t, float32_result) : chebyshev_xq1(t, float32_result)) / x;
  // sqrt 2 cos chi and sqrt 2 sin chi: chi = x - pi/4 gives c + s and s - c; chi = x - 3pi/4, s - c and -(s + c).
  const double c = cos(x), s = sin(x);
  const double cos_chi = nu == 0 ? c + s : s - c, sin_chi = nu == 0 ? s - c : -(s + c);
  const double factor = sqrt(1 / (3.14159265358979323846 * x));  // sqrt(2 / (pi x)) / sqrt 2
  return second_kind ? factor * (p * sin_chi + q * cos_chi) : factor * (p * cos_chi - q * sin_chi);
}

// J0 (even) and J1 (odd): 1 and 0 at 0, 0 at +-inf.
KILN_SPECIAL_FN double bessel_j_f64(int nu, double x, bool float32_result = false) {
  using std::abs;
  if (x != x) return x;
  const double ax = abs(x);
  if (ax == std::numeric_limits<double>::infinity()) return 0;
  if (ax == 0) return nu == 0 ? 1 : x;
  const double value = bessel_jy_positive(nu, false, ax, float32_result);
  return nu == 1 && x < 0 ? -value : value;
}

// Y0 and Y1: -inf at 0, NaN for x < 0, 0 at +inf.
KILN_SPECIAL_FN double bessel_y_f64(int nu, double x, bool float32_result = false) {
  if (x != x) return x;
  if (x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return 0;
  return bessel_jy_positive(nu, true, x, float32_result);
}

// Note [K0 and K1: series, Chebyshev series]
// For 0 < x <= 1 the series (DLMF 10.31.1; bessel_series, shared with J and Y)
//   K0 = -(log(x/2) + gamma) I0 + sum_{k >= 1} H_k (x^2/4)^k / (k!)^2,
//   K1 = 1/x + log(x/2) I1 - (x/4) sum_k (psi(k+1) + psi(k+2)) (x^2/4)^k / (k! (k+1)!).
// Beyond, sqrt(x) e^x K_nu(x), smooth in 1/x and tending to sqrt(pi / 2), as a Chebyshev series in
// t = 2 / x - 1 (core/bessel_tables.h, 37 terms, 17 or 18 for a float32 result). (The trapezoidal rule
// on e^x K_nu(x) = int_0^inf e^(-2x sinh^2(t/2)) cosh(nu t) dt, which this replaced, needed 45
// exponentials an element: 19x PyTorch's time.) K0 and K1 are +inf at 0 and NaN for x < 0; scaled,
// e^x K.
KILN_SPECIAL_FN double bessel_k_f64(int nu, double x, bool scaled, bool float32_result = false) {
  using std::log, std::sqrt, std::exp;
  constexpr double kEulerGamma = 0.57721566490153286061;
  if (x != x) return x;
  if (x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return 0;
  if (x <= 1) {
    const BesselSeries r = bessel_series(x, x * x / 4, float32_result ? 1e-10 : 1e-17);
    const double log_half = log(x / 2);
    const double value = nu == 0 ? -(log_half + kEulerGamma) * r.f0 + r.h0 : 1 / x + log_half * r.f1 - r.h1 / 2;
    return scaled ? value * exp(x) : value;
  }
  const double t = 2 / x - 1;
  const double value = (nu == 0 ? chebyshev_k0(t, float32_result) : chebyshev_k1(t, float32_result)) / sqrt(x);
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

// Note [the Airy function]
// Ai(x) (special::airy_ai) and, for its gradient, Ai'(x) (Ai'' = x Ai). On [-2, 2] Chebyshev series of
// Ai and Ai' themselves. Beyond, with zeta = 2/3 |x|^(3/2) (DLMF 9.7.5-9.7.11, 9.8.20):
//   x > 2:   Ai(x) = e^-zeta / (2 sqrt(pi) x^(1/4)) f(x),   Ai'(x) = -x^(1/4) e^-zeta / (2 sqrt pi) g(x),
//   x < -2:  Ai(x) = M(x) cos(zeta - pi/4 + theta(x)) / (sqrt(pi) |x|^(1/4)),
//            Ai'(x) = N(x) |x|^(1/4) sin(zeta - pi/4 + phi(x)) / sqrt(pi),
// where f, g, M, N tend to 1 and theta, phi to 0 as |x| grows: each is a Chebyshev series in
// t = 2 (2 / |x|)^(3/2) - 1 = 2 zeta(2) / zeta - 1, fitted to mpmath's values (M and theta from the
// modulus and phase of Ai - i Bi; scripts/gen_chebyshev_tables.py). zeta is carried to twice float64's
// precision (against mpmath: 1e-15 relative for x > -2, 4e-16 absolute against the envelope where Ai
// oscillates, to x = -1e4). Ai is subnormal from x = 103.9 (PyTorch 1.13: 0 there) and 0 past 107.7
// (zeta = 745.2); at +inf Ai and Ai' are 0, at -inf Ai is 0 (PyTorch 1.13: NaN) and Ai' NaN, having no
// limit; past x = -3.2e205 zeta overflows, and Ai there, below 1e-51 whatever its phase, is given as 0.
KILN_SPECIAL_FN double airy_ai_f64(double x, bool derivative, bool float32_result = false) {
  using std::abs, std::sqrt, std::exp, std::cos, std::sin;
  constexpr double inv_sqrt_pi = 0.56418958354775628695, quarter_pi = 0.78539816339744830962;
  if (x != x) return x;
  if (abs(x) <= 2) {
    return derivative ? chebyshev_airy_prime_middle(x / 2, float32_result)
                      : chebyshev_airy_middle(x / 2, float32_result);
  }
  const double ax = abs(x), root = sqrt(ax), quarter = sqrt(root);
  // zeta = zeta_hi + zeta_lo to twice float64's precision (the roundings of sqrt, of the product and of
  // the division by 3 recovered by fma), so that e^-zeta and cos(zeta + ...) keep float64's accuracy
  // for large |x| (with zeta alone rounded: 1e-13 relative at x = 96).
  const double power = ax * root;  // |x|^(3/2)
  const double power_lo = std::fma(ax, root, -power) + ax * (std::fma(-root, root, ax) / (2 * root));
  const double zeta = 2 * power / 3;
  const double zeta_lo = (std::fma(-3.0, zeta, 2 * power) + 2 * power_lo) / 3;
  const double t = 5.6568542494923801952 / power - 1;  // 4 sqrt(2) / |x|^(3/2) - 1
  if (x > 0) {
    if (zeta > 745.2) return derivative ? -0.0 : 0.0;  // e^-zeta underflows (and at +inf)
    const double decay = exp(-zeta) * (1 - zeta_lo) * inv_sqrt_pi / 2;
    return derivative ? -quarter * decay * chebyshev_airy_prime_positive(t, float32_result)
                      : decay / quarter * chebyshev_airy_positive(t, float32_result);
  }
  if (zeta == std::numeric_limits<double>::infinity()) {
    return derivative ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  }
  // cos(zeta + s) through cos zeta and sin zeta, zeta being exact: zeta + s rounded would lose up to
  // half an ulp of zeta (2e-13 at x = -300).
  const double s =
      zeta_lo - quarter_pi +
      (derivative ? chebyshev_airy_prime_phase(t, float32_result) : chebyshev_airy_phase(t, float32_result));
  const double cos_zeta = cos(zeta), sin_zeta = sin(zeta), cos_s = cos(s), sin_s = sin(s);
  if (derivative) {
    return chebyshev_airy_prime_modulus(t, float32_result) * quarter * inv_sqrt_pi *
           (sin_zeta * cos_s + cos_zeta * sin_s);
  }
  return chebyshev_airy_modulus(t, float32_result) / quarter * inv_sqrt_pi * (cos_zeta * cos_s - sin_zeta * sin_s);
}

}  // namespace kiln::math

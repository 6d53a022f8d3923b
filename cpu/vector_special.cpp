// cpu/vector_special.cpp: special functions over contiguous float32 and float64 runs, kLanes elements
// at a time in float64 (Eigen fixed-size arrays, which stay in vector registers), where core's scalar
// functions branch element by element: special::i0, i0e, i1 and i1e (modified_bessel_i0, i1), the
// Bessel functions J0, J1, Y0, Y1, K0, K1 and the scaled K, lgamma, digamma, polygamma(1, x), and the
// orthogonal polynomials of one degree. For I a block sums the Chebyshev series of core/bessel_tables.h
// for all its lanes side by side (T an Eigen array there), each of the two series where any lane of the
// block needs it, and each lane keeps the one its |x| calls for: the series and steps of bessel_i_f64
// in core/bessel_math.h (Note [the modified Bessel functions I0 and I1]), which strided runs and CUDA
// take element by element. The others: Note [J, Y and K a block at a time], Note [trigamma a block at
// a time], Note [log Gamma a block at a time], digamma's comment, Note [the orthogonal polynomials a
// block at a time]. benchmarks/results/README.md has the runs against PyTorch.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/bessel_tables.h"
#include "core/gamma_tables.h"
#include "core/scalar_math.h"
#include "core/special_math.h"
#include "cpu/exact_math.h"
#include "cpu/vector_math.h"

namespace kiln::cpu {

namespace {

// 64 lanes: eight chains of Clenshaw's recurrence in flight per series (8 doubles to an AVX-512
// register), enough to hide the latency of each step's multiply-add.
constexpr int64_t kLanes = 64;
using Lanes = Eigen::Array<double, kLanes, 1>;

// Each block function inlines all it calls (Eigen's expression and assignment templates, the series'
// Clenshaw steps), so that a block's arrays stay in registers: left to GCC's heuristics, which weigh
// the whole file, an array copy became a call of its own once the file grew (lgamma 15.5 ms -> 42).
#define KILN_BLOCK_FN [[gnu::flatten]]

// I_nu(x) lane by lane, or e^-|x| I_nu(x) where scaled.
template <int nu>
KILN_BLOCK_FN Lanes bessel_i(const Lanes& x, bool scaled, bool float32_result) {
  using math::chebyshev_i0_large, math::chebyshev_i0_small, math::chebyshev_i1_large, math::chebyshev_i1_small;
  const Lanes ax = x.abs();
  // Each series at an argument clamped into its own interval, so that every lane's sum is finite; a
  // series no lane of the block needs is skipped (the large one, for most data).
  const Lanes large_x = ax.max(8.0);
  Lanes small = Lanes::Zero(), large = Lanes::Zero();
  if ((ax <= 8).any()) {
    const Lanes t = ax.min(8.0) / 4.0 - 1.0;
    small = nu == 0 ? chebyshev_i0_small(t, float32_result) : Lanes(x * chebyshev_i1_small(t, float32_result));
  }
  if ((ax > 8).any()) {
    const Lanes t = 16.0 / large_x - 1.0;
    large = (nu == 0 ? chebyshev_i0_large(t, float32_result) : chebyshev_i1_large(t, float32_result)) / large_x.sqrt();
    if (nu == 1) large = (x < 0).select(-large, large);
  }
  Lanes value = (ax <= 8).select(small, large);
  if (!scaled) {
    const Lanes half = exact_exp(Lanes(ax / 2));
    // At +-inf the limits +inf (I0) and +-inf (I1), where the product is inf * 0.
    value = (ax == std::numeric_limits<double>::infinity()).select(nu == 0 ? ax : x, half * value * half);
  } else {
    value = (ax == std::numeric_limits<double>::infinity()).select(0.0, value);
  }
  return (x != x).select(x, value);
}

// y = f(x) over a contiguous run, kLanes elements at a time, in float64 (the last, partial block padded
// with 1s); f maps Lanes to Lanes.
template <typename T, typename F>
void run_blocks(const T* x, T* y, int64_t n, const F& f) {
  using Block = Eigen::Array<T, kLanes, 1>;
  int64_t start = 0;
  for (; start + kLanes <= n; start += kLanes) {
    Eigen::Map<Block>(y + start) = f(Eigen::Map<const Block>(x + start).template cast<double>()).template cast<T>();
  }
  if (start == n) return;
  Lanes in = Lanes::Ones();
  for (int64_t i = start; i < n; ++i) in[i - start] = static_cast<double>(x[i]);
  const Lanes out = f(in);
  for (int64_t i = start; i < n; ++i) y[i] = static_cast<T>(out[i - start]);
}

// Note [J, Y and K a block at a time]
// bessel_j0, j1, y0, y1 and modified_bessel_k0, k1 (and their scalings) take the regions of
// bessel_jy_positive and bessel_k_f64 (core/bessel_math.h: Note [J0, J1, Y0 and Y1: series, Chebyshev
// series, Hankel's form], Note [K0 and K1: series, Chebyshev series]) for all lanes of a block, each
// region's sums where some lane of the block needs them, each lane keeping its own region's value.
// The power series, to x = 2 (J, Y) and 1 (K), take a fixed number of terms (series_terms), where the
// scalar function stops at a tolerance: 13 (the last below 3e-20 of the sum at x = 2), 9 for a float32
// result (below 4e-11). Hankel's cos x and sin x come from glibc's SIMD functions (vector_sin_cos), whose
// argument reduction is exact as the scalar ones' is. Lanes at 0, beyond the domain, +-inf and NaN go
// to the scalar function, lane by lane.
int series_terms(bool float32_result) { return float32_result ? 9 : 13; }

// bessel_series of core/bessel_math.h for nu = 0 or 1, lane by lane, with a fixed number of terms:
// f = sum_k s^k (x/2)^nu / (k! (k + nu)!) and, where wanted, h = the same terms weighted by H_k (nu = 0)
// or psi(k + 1) + psi(k + 2) (nu = 1).
template <int nu>
std::pair<Lanes, Lanes> bessel_series(const Lanes& x, const Lanes& s, bool with_h, int terms) {
  constexpr double kEulerGamma = 0.57721566490153286061;
  Lanes term = nu == 0 ? Lanes(Lanes::Ones()) : Lanes(x / 2.0), f = term, h = Lanes::Zero();
  double weight = nu == 0 ? 0 : 1 - 2 * kEulerGamma;  // H_0, or psi(1) + psi(2)
  if (with_h) h = weight * term;
  for (int k = 1; k < terms; ++k) {
    term *= s * (1.0 / (double(k) * (k + nu)));
    weight += nu == 0 ? 1.0 / k : 1.0 / k + 1.0 / (k + 1);
    f += term;
    if (with_h) h += weight * term;
  }
  return {f, h};
}

// J_nu (second_kind false) or Y_nu lane by lane.
template <int nu, bool second_kind>
KILN_BLOCK_FN Lanes bessel_jy(const Lanes& input, bool float32_result) {
  constexpr double kPi = 3.14159265358979323846, kEulerGamma = 0.57721566490153286061;
  const Lanes x = second_kind ? input : Lanes(input.abs());
  Lanes small = Lanes::Zero(), middle = Lanes::Zero(), large = Lanes::Zero();
  if ((x <= 2.0).any()) {
    const Lanes xs = x.min(2.0);
    const auto [f, h] = bessel_series<nu>(xs, -xs.square() / 4.0, second_kind, series_terms(float32_result));
    if constexpr (!second_kind) {
      small = f;
    } else {
      const Lanes log_half = exact_log(Lanes(xs / 2.0));
      small = nu == 0 ? Lanes(2 / kPi * ((log_half + kEulerGamma) * f - h))
                      : Lanes(-2 / kPi / xs + 2 / kPi * log_half * f - h / kPi);
    }
  }
  if ((x > 2.0 && x <= 8.0).any()) {
    const Lanes t = (x.max(2.0).min(8.0) - 5.0) / 3.0;
    if constexpr (nu == 0) {
      middle =
          second_kind ? math::chebyshev_y0_middle(t, float32_result) : math::chebyshev_j0_middle(t, float32_result);
    } else {
      middle =
          second_kind ? math::chebyshev_y1_middle(t, float32_result) : math::chebyshev_j1_middle(t, float32_result);
    }
  }
  if ((x > 8.0).any()) {
    const Lanes xl = x.max(8.0), t = 128.0 / xl.square() - 1.0;
    const Lanes p = nu == 0 ? math::chebyshev_p0(t, float32_result) : math::chebyshev_p1(t, float32_result);
    const Lanes q = (nu == 0 ? math::chebyshev_xq0(t, float32_result) : math::chebyshev_xq1(t, float32_result)) / xl;
    Lanes c, s;
    vector_sin_cos(xl.data(), s.data(), c.data(), kLanes);
    // sqrt 2 cos chi and sqrt 2 sin chi, as bessel_jy_positive forms them
    const Lanes cos_chi = nu == 0 ? Lanes(c + s) : Lanes(s - c), sin_chi = nu == 0 ? Lanes(s - c) : Lanes(-(s + c));
    const Lanes factor = (1.0 / (kPi * xl)).sqrt();
    large = second_kind ? Lanes(factor * (p * sin_chi + q * cos_chi)) : Lanes(factor * (p * cos_chi - q * sin_chi));
  }
  Lanes value = (x <= 2.0).select(small, (x <= 8.0).select(middle, large));
  if (nu == 1 && !second_kind) value = (input < 0.0).select(-value, value);  // J1 is odd
  if (!(x > 0.0 && x < std::numeric_limits<double>::infinity()).all()) {
    for (int64_t i = 0; i < kLanes; ++i) {
      if (!(x[i] > 0 && x[i] < std::numeric_limits<double>::infinity())) {
        value[i] = second_kind ? math::bessel_y_f64(nu, input[i], float32_result)
                               : math::bessel_j_f64(nu, input[i], float32_result);
      }
    }
  }
  return value;
}

// K_nu lane by lane, or e^x K_nu where scaled.
template <int nu>
KILN_BLOCK_FN Lanes bessel_k(const Lanes& x, bool scaled, bool float32_result) {
  constexpr double kEulerGamma = 0.57721566490153286061;
  Lanes small = Lanes::Zero(), large = Lanes::Zero();
  if ((x <= 1.0).any()) {
    const Lanes xs = x.min(1.0);  // (lanes at or below 0 go to the scalar function)
    const auto [f, h] = bessel_series<nu>(xs, xs.square() / 4.0, true, series_terms(float32_result));
    const Lanes log_half = exact_log(Lanes(xs / 2.0));
    small = nu == 0 ? Lanes(-(log_half + kEulerGamma) * f + h) : Lanes(xs.inverse() + log_half * f - h / 2.0);
    if (scaled) small *= exact_exp(xs);
  }
  if ((x > 1.0).any()) {
    const Lanes xl = x.max(1.0), t = 2.0 / xl - 1.0;
    large = (nu == 0 ? math::chebyshev_k0(t, float32_result) : math::chebyshev_k1(t, float32_result)) / xl.sqrt();
    if (!scaled) large *= exact_exp(Lanes(-xl));
  }
  Lanes value = (x <= 1.0).select(small, large);
  if (!(x > 0.0 && x < std::numeric_limits<double>::infinity()).all()) {
    for (int64_t i = 0; i < kLanes; ++i) {
      if (!(x[i] > 0 && x[i] < std::numeric_limits<double>::infinity())) {
        value[i] = math::bessel_k_f64(nu, x[i], scaled, float32_result);
      }
    }
  }
  return value;
}

// Note [trigamma a block at a time]
// polygamma(1, x) = zeta(2, x) for x > 0 as Note [polygamma as a Hurwitz zeta] sums it, with fixed
// lengths: the first kShift terms of the sum, then the Euler-Maclaurin tail from a = x + kShift,
// 1/a + 1/(2 a^2) + sum_j B_2j / a^(2j + 1) (its series at s = 2), to kTerms terms. A float32 result
// takes 6 and 6 (the first term left out is below 3e-12 of the sum from a = 6); float64 takes 10 and
// 10 (below 1e-18). The scalar function stops each sum as soon as its terms are small enough, a branch
// per term, where a block takes every term for every lane. x <= 0 (the reflection) and NaN go to the
// scalar function, lane by lane.
template <bool float32_result>
KILN_BLOCK_FN Lanes trigamma(const Lanes& x) {
  constexpr int kShift = float32_result ? 6 : 10, kTerms = float32_result ? 6 : 10;
  Lanes sum = Lanes::Zero();
  for (int k = 0; k < kShift; ++k) sum += (x + double(k)).square().inverse();
  const Lanes inverse_a = (x + double(kShift)).inverse(), inverse_a2 = inverse_a.square();
  sum += inverse_a + 0.5 * inverse_a2;
  Lanes factor = 2.0 * inverse_a * inverse_a2;  // s a^-s / a, then times (s + 2j + 1)(s + 2j + 2) / a^2
  for (int j = 0; j < kTerms; ++j) {
    sum += math::bernoulli_over_factorial(j) * factor;
    factor *= (3.0 + 2 * j) * (4.0 + 2 * j) * inverse_a2;
  }
  if (!(x > 0).all()) {
    for (int64_t i = 0; i < kLanes; ++i) {
      if (!(x[i] > 0)) sum[i] = math::polygamma_f64(1, x[i], float32_result);
    }
  }
  return sum;
}

// Note [log Gamma a block at a time]
// lgamma(x) for x > 0 with the same steps in every lane, where glibc's lgamma_r branches on x's range
// (and PyTorch's float32 lgamma calls it element by element):
// - 1 <= x < 3: (x - 1) (x - 2) g(x - 2), g(z) = log Gamma(z) / ((z - 1) (z - 2)) on [1, 3] as a
//   Chebyshev series (core/gamma_tables.h: 31 terms, 18 for a float32 result). The factors carry the
//   zeros at 1 and 2, so the result keeps its relative accuracy next to them; x - 1 and x - 2 are exact.
// - 0 < x < 1: lgamma(x + 1) - log x, lgamma(x + 1) taken as x (x - 1) g(x - 1) (the same factors, for
//   z = x + 1, from x itself: x + 1 would round).
// - 3 <= x < 10: down to y = x - m in [2, 3), m = floor(x - 2), by lgamma(x) = lgamma(x - 1) + log(x - 1):
//   lgamma(y) + log((x - 1)(x - 2)...(x - m)), y from the series. y is exact; the product rounds once
//   a factor.
// - x >= 10: Stirling's series (x - 1/2) log x - x + log(2 pi) / 2 + sum_k B_2k / (2k (2k - 1) x^(2k-1)),
//   to k = 7 (the next term is below 3e-17 of lgamma(10)), k = 3 for a float32 result (5e-12).
// Each lane takes one log: of x (below 1, and from 10), or of the product (3 to 10; 1 for x in [1, 3),
// whose log is 0). x <= 0 (the reflection and the poles) and NaN go to glibc's lgamma_r, lane by lane
// (its float64 form for float32 too, so that every float32 result is the float64 value rounded once);
// +inf is +inf. Against mpmath (40 digits) on 3,800 points from 1e-300 to 1e300, dense in (0, 10)
// and next to 1 and 2: within 3.5e-16 relative (glibc's lgamma_r, the strided loop's: 2.8e-16).
template <bool float32_result>
KILN_BLOCK_FN Lanes lgamma(const Lanes& x) {
  constexpr double kStirling = 10, kHalfLog2Pi = 0.91893853320467274178;
  constexpr int kSteps = int(kStirling) - 3;
  const bool below = (x < kStirling).any(), above = (x >= kStirling).any();
  // 3 <= x < 10 steps down to y = x - m in [2, 3), m = floor(x - 2) from 1 to 7; below 3 m = 0, and
  // from 10 (Stirling's lanes) m = 7, unused. Selects on comparisons, not arrays of bool, which
  // compile to a branch per lane.
  Lanes m = Lanes::Zero(), product = Lanes::Ones();
  if (below) {
    m = (x - 2.0).floor().max(0.0).min(double(kSteps));
    for (int j = 1; j <= kSteps; ++j) product *= (m >= double(j)).select(x - double(j), 1.0);
  }
  // Every lane's one log: of x below 1 and from 10, of the product between.
  const Lanes log_part = exact_log(Lanes((x < 1.0 || x >= kStirling).select(x, product)));
  Lanes value = Lanes::Zero();
  if (below) {
    const Lanes t = (x < 1.0).select(x - 1.0, x - m - 2.0);
    const Lanes series = (x < 1.0).select(x, t + 1.0) * t * math::chebyshev_lgamma(t, float32_result);
    value = (x < 1.0).select(series - log_part, series + log_part);
  }
  if (above) {
    const Lanes large = x.max(kStirling), inverse = large.inverse(), z = inverse.square();
    // B_2k / (2k (2k - 1)) for k = 1..7: 1/12, -1/360, 1/1260, -1/1680, 1/1188, -691/360360, 1/156
    const Lanes tail =
        float32_result
            ? Lanes(1.0 / 12 - z * (1.0 / 360 - z * (1.0 / 1260)))
            : Lanes(1.0 / 12 -
                    z * (1.0 / 360 -
                         z * (1.0 / 1260 - z * (1.0 / 1680 - z * (1.0 / 1188 - z * (691.0 / 360360 - z / 156))))));
    const Lanes stirling = large * (log_part - 1.0) - 0.5 * log_part + kHalfLog2Pi + tail * inverse;
    value = (x >= kStirling).select(stirling, value);
  }
  value = (x == std::numeric_limits<double>::infinity()).select(x, value);
  if (!(x > 0).all()) {
    for (int64_t i = 0; i < kLanes; ++i) {
      if (!(x[i] > 0)) value[i] = math::log_abs_gamma(x[i]);  // in float64 for a float32 result too
    }
  }
  return value;
}

// digamma(x) for x > 0 as Note [digamma by recurrence and asymptotic series] sums it, with a fixed shift:
// digamma(x) = digamma(x + kShift) - sum_{k < kShift} 1 / (x + k), the asymptotic series at x + kShift
// and its 7 terms (6 steps for a float32 result, where the scalar function stops at 6 too; 10 for
// float64). The reciprocals add up as fractions of kGroup terms, one division each: one fraction
// for a float32 result, two for float64, of x clamped to 1e50 (where the reciprocals, below 1e-49, no
// longer change the result) so that the denominators, (x + 9)^5 at most, stay finite. x <= 0 and NaN
// go to the scalar function, lane by lane; +inf is +inf.
template <bool float32_result>
KILN_BLOCK_FN Lanes digamma(const Lanes& x) {
  constexpr int kShift = float32_result ? 6 : 10, kGroup = float32_result ? 6 : 5;
  const Lanes clamped = x.min(1e50);
  Lanes reciprocals = Lanes::Zero();
  for (int first = 0; first < kShift; first += kGroup) {
    Lanes numerator = Lanes::Ones(), denominator = clamped + double(first);
    for (int k = first + 1; k < first + kGroup; ++k) {
      const Lanes term = clamped + double(k);
      numerator = numerator * term + denominator;
      denominator *= term;
    }
    reciprocals += numerator / denominator;
  }
  const Lanes a = x + double(kShift), inverse = a.inverse(), z = inverse.square();
  // B_2k / 2k for k = 1..7, as digamma_f64's
  const Lanes series =
      z * (1.0 / 12 -
           z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 - z * (691.0 / 32760 - z / 12))))));
  Lanes value = exact_log(a) - 0.5 * inverse - series - reciprocals;
  value = (x == std::numeric_limits<double>::infinity()).select(x, value);
  if (!(x > 0).all()) {
    for (int64_t i = 0; i < kLanes; ++i) {
      if (!(x[i] > 0)) value[i] = math::digamma_f64(x[i], float32_result);
    }
  }
  return value;
}

// Note [the orthogonal polynomials a block at a time]
// p_n(x) over a contiguous run with one degree n (a number, or a tensor of one value broadcast: the
// common case) takes Note [the orthogonal polynomials]'s steps for a block of lanes side by side: the
// recurrence, k outer and lanes inner, or from degree 16 Chebyshev's closed forms through glibc's
// SIMD acos, cos and sin (cpu/vector_math.cpp). The lanes whose recurrence overflowed (an inf or NaN at
// the end), and those outside (-1, 1) for a closed form, are computed again by the scalar function.
// (Past |x| = 2^400, where the scalar function takes the leading term, the recurrence overflows from
// n = 2, and at n = 1 is that term to the last bit.) The scalar loop, where math::binary's switch picks
// the family for every element and the recurrence runs one element at a time, took 21 to 23 ms for 2^22
// float32 T_10(x) and H_10(x) on two threads (the Xeon of session 79: 1.9x PyTorch's time for H_10).
template <math::Polynomial F>
KILN_BLOCK_FN Lanes recurrence(const Lanes& x, double n) {
  const math::PolynomialStep first = math::polynomial_first<F>();
  Lanes p = Lanes::Ones(), q = first.a * x + first.b;
  // Two steps a round, each writing over the older value, so that no array is copied.
  double k = 1;
  for (; k + 1 < n; k += 2) {
    math::PolynomialStep s = math::polynomial_step<F>(k);
    p = ((s.a * x + s.b) * q - s.c * p) * (1 / s.d);
    s = math::polynomial_step<F>(k + 1);
    q = ((s.a * x + s.b) * p - s.c * q) * (1 / s.d);
  }
  if (k < n) {
    const math::PolynomialStep s = math::polynomial_step<F>(k);
    return ((s.a * x + s.b) * q - s.c * p) * (1 / s.d);
  }
  return q;
}

Lanes recurrence(math::Polynomial family, const Lanes& x, double n) {
  using math::Polynomial;
  switch (family) {
    case Polynomial::ChebyshevT: return recurrence<Polynomial::ChebyshevT>(x, n);
    case Polynomial::ChebyshevU: return recurrence<Polynomial::ChebyshevU>(x, n);
    case Polynomial::ChebyshevV: return recurrence<Polynomial::ChebyshevV>(x, n);
    case Polynomial::ChebyshevW: return recurrence<Polynomial::ChebyshevW>(x, n);
    case Polynomial::HermiteH: return recurrence<Polynomial::HermiteH>(x, n);
    case Polynomial::HermiteHe: return recurrence<Polynomial::HermiteHe>(x, n);
    case Polynomial::LaguerreL: return recurrence<Polynomial::LaguerreL>(x, n);
    default: return recurrence<Polynomial::LegendreP>(x, n);
  }
}

template <typename T>
bool polynomial_run(BinaryOp op, const T* x, T* y, int64_t count, double degree) {
  if (!(degree >= 1) || degree == std::numeric_limits<double>::infinity()) return false;
  const double n = std::trunc(degree);
  const math::PolynomialKind kind = math::polynomial_kind(op);
  const bool closed_form = kind.family <= math::Polynomial::ChebyshevW && n >= 16;
#if !KILN_HAVE_LIBMVEC
  if (closed_form) return false;
#endif
  run_blocks(x, y, count, [&](const Lanes& in) {
    const Lanes v = kind.shifted ? Lanes(2.0 * in - 1.0) : in;
    Lanes value;
    bool redo;
#if KILN_HAVE_LIBMVEC
    if (closed_form) {
      redo = vector_chebyshev_closed_form(kind.family, v.data(), value.data(), kLanes, n);
    } else
#endif
    {
      value = recurrence(kind.family, v, n);
      redo = !value.isFinite().all();
    }
    if (redo) {
      for (int64_t i = 0; i < kLanes; ++i) {
        const bool done = closed_form ? std::abs(v[i]) < 1 : std::isfinite(value[i]);
        if (!done) value[i] = math::polynomial(op, in[i], degree, 0);
      }
    }
    return value;
  });
  return true;
}

template <typename T>
bool special_run(UnaryOp op, const T* x, T* y, int64_t n, double a) {
  constexpr bool float32_result = std::is_same_v<T, float>;
  const bool scaled = op == UnaryOp::I0e || op == UnaryOp::I1e || op == UnaryOp::BesselK0e || op == UnaryOp::BesselK1e;
  switch (op) {
    case UnaryOp::I0:
    case UnaryOp::I0e:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_i<0>(in, scaled, float32_result); });
      return true;
    case UnaryOp::I1:
    case UnaryOp::I1e:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_i<1>(in, scaled, float32_result); });
      return true;
    case UnaryOp::Polygamma:
      if (a != 1) return false;  // the scalar loop's Hurwitz zeta
      run_blocks(x, y, n, trigamma<float32_result>);
      return true;
    case UnaryOp::BesselJ0:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_jy<0, false>(in, float32_result); });
      return true;
    case UnaryOp::BesselJ1:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_jy<1, false>(in, float32_result); });
      return true;
    case UnaryOp::BesselY0:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_jy<0, true>(in, float32_result); });
      return true;
    case UnaryOp::BesselY1:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_jy<1, true>(in, float32_result); });
      return true;
    case UnaryOp::BesselK0:
    case UnaryOp::BesselK0e:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_k<0>(in, scaled, float32_result); });
      return true;
    case UnaryOp::BesselK1:
    case UnaryOp::BesselK1e:
      run_blocks(x, y, n, [&](const Lanes& in) { return bessel_k<1>(in, scaled, float32_result); });
      return true;
    case UnaryOp::Lgamma: run_blocks(x, y, n, lgamma<float32_result>); return true;
    case UnaryOp::Digamma: run_blocks(x, y, n, digamma<float32_result>); return true;
    default: return false;
  }
}

}  // namespace

bool vector_special(UnaryOp op, const float* x, float* y, int64_t n, double a) { return special_run(op, x, y, n, a); }
bool vector_special(UnaryOp op, const double* x, double* y, int64_t n, double a) {
  return special_run(op, x, y, n, a);
}
bool vector_polynomial(BinaryOp op, const float* x, float* y, int64_t count, double degree) {
  return polynomial_run(op, x, y, count, degree);
}
bool vector_polynomial(BinaryOp op, const double* x, double* y, int64_t count, double degree) {
  return polynomial_run(op, x, y, count, degree);
}

}  // namespace kiln::cpu

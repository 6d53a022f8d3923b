// cpu/vector_special.cpp: special functions over contiguous float32 and float64 runs, kLanes elements
// at a time in float64 (Eigen fixed-size arrays, which stay in vector registers), where core's scalar
// functions branch element by element: special::i0, i0e, i1 and i1e (modified_bessel_i0, i1), and
// polygamma(1, x). For I a block sums the Chebyshev series of core/bessel_tables.h for all its lanes
// side by side (T an Eigen array there), each of the two series where any lane of the block needs it,
// and each lane keeps the one its |x| calls for: the series and steps of bessel_i_f64 in
// core/bessel_math.h (Note [the modified Bessel functions I0 and I1]), which strided runs and CUDA take
// element by element. For polygamma(1, x), Note [trigamma a block at a time] below. 2^22 float32
// elements on two threads (benchmarks/results/README.md): i1e 7.1 ms, where the scalar loop of the
// power series this replaced took 75; polygamma(1, x) 11.6 ms, 74 as the scalar loop.
#include <Eigen/Core>
#include <algorithm>
#include <limits>
#include <type_traits>

#include "core/bessel_tables.h"
#include "core/special_math.h"
#include "cpu/exact_math.h"
#include "cpu/vector_math.h"

namespace kiln::cpu {

namespace {

// 64 lanes: eight chains of Clenshaw's recurrence in flight per series (8 doubles to an AVX-512
// register), enough to hide the latency of each step's multiply-add.
constexpr int64_t kLanes = 64;
using Lanes = Eigen::Array<double, kLanes, 1>;

// I_nu(x) lane by lane, or e^-|x| I_nu(x) where scaled.
template <int nu>
Lanes bessel_i(const Lanes& x, bool scaled, bool float32_result) {
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

// Note [trigamma a block at a time]
// polygamma(1, x) = zeta(2, x) for x > 0 as Note [polygamma as a Hurwitz zeta] sums it, with fixed
// lengths: the first kShift terms of the sum, then the Euler-Maclaurin tail from a = x + kShift,
// 1/a + 1/(2 a^2) + sum_j B_2j / a^(2j + 1) (its series at s = 2), to kTerms terms. A float32 result
// takes 6 and 6 (the first term left out is below 3e-12 of the sum from a = 6); float64 takes 10 and
// 10 (below 1e-18). The scalar function stops each sum as soon as its terms are small enough, a branch
// per term, where a block takes every term for every lane. x <= 0 (the reflection) and NaN go to the
// scalar function, lane by lane.
template <bool float32_result>
Lanes trigamma(const Lanes& x) {
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

template <typename T>
bool bessel_i_run(UnaryOp op, const T* x, T* y, int64_t n) {
  const bool scaled = op == UnaryOp::I0e || op == UnaryOp::I1e, float32_result = std::is_same_v<T, float>;
  if (op == UnaryOp::I0 || op == UnaryOp::I0e) {
    run_blocks(x, y, n, [&](const Lanes& in) { return bessel_i<0>(in, scaled, float32_result); });
  } else if (op == UnaryOp::I1 || op == UnaryOp::I1e) {
    run_blocks(x, y, n, [&](const Lanes& in) { return bessel_i<1>(in, scaled, float32_result); });
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool vector_bessel_i(UnaryOp op, const float* x, float* y, int64_t n) { return bessel_i_run(op, x, y, n); }
bool vector_bessel_i(UnaryOp op, const double* x, double* y, int64_t n) { return bessel_i_run(op, x, y, n); }

bool vector_trigamma(const float* x, float* y, int64_t n) {
  run_blocks(x, y, n, trigamma<true>);
  return true;
}
bool vector_trigamma(const double* x, double* y, int64_t n) {
  run_blocks(x, y, n, trigamma<false>);
  return true;
}

}  // namespace kiln::cpu

// cpu/row_sums.h: sums along one contiguous row in double, for the row kernels of norm.cpp and
// fused.cpp (private to cpu/).
//
// Note [lane sums]: a sum kept in one double is a chain of dependent adds, one element per add's
// latency (about four cycles), and the compiler may not reorder it (no -ffast-math): layer_norm's row
// statistics ran at a quarter of an element per cycle, and a float32 (512, 768) layer_norm took 3.5x
// PyTorch's time (0.54x with the lanes). Here kLanes = 16 independent sums, two vectors of eight,
// take elements j, j + 16, j + 32, ... of the row's first multiple of 16, one more sum takes the
// rest, and they are added in one fixed tree at the end: the order of the adds, and so the result's
// last bits, depend on the row alone, never on threads or alignment.
// (The sum reduction's sum_lanes in reduce.cpp is the same idea for a plain sum.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace kiln::cpu {

inline constexpr int kLanes = 16;

// Eight doubles as one value (GCC's and Clang's vector extension): one AVX-512 register, two AVX
// ones or four SSE ones, whatever the target; each lane's arithmetic is the scalar one.
using Lanes8 = double __attribute__((vector_size(64)));

// v = x[0..8) widened to double. (Lanes8 travels by reference: passed by value it would take
// AVX-512's calling convention where the target has it and another where not, which GCC warns of.)
template <typename T>
inline void load8(const T* x, Lanes8& v) {
  if constexpr (std::is_same_v<T, double>) {
    std::memcpy(&v, x, sizeof v);
  } else {
    static_assert(std::is_same_v<T, float>);
#ifdef __AVX512F__
    // One conversion, not two halves. (The zero-masking form with every lane kept: GCC 12's
    // _mm512_cvtps_pd starts from _mm512_undefined_pd, which -Wmaybe-uninitialized reports, bug 105593.)
    v = reinterpret_cast<Lanes8>(_mm512_maskz_cvtps_pd(__mmask8(0xFF), _mm256_loadu_ps(x)));
#else
    using Float8 = float __attribute__((vector_size(32)));
    Float8 f;
    std::memcpy(&f, x, sizeof f);
    v = __builtin_convertvector(f, Lanes8);
#endif
  }
}

// The total of the kLanes lanes lo[0..8), hi[0..8) plus tail, pairwise in a fixed order.
inline double lane_total(const Lanes8& lo, const Lanes8& hi, double tail) {
  const Lanes8 s = lo + hi;
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])) + tail;
}

// sum_a = sum of (a[i] - shift) and sum_ab = sum of (a[i] - shift) * (b[i] - shift) over i < n, in
// double (with shift 0 the sums of a and of a * b: subtracting 0 is exact).
template <typename T>
inline void shifted_sums(const T* a, const T* b, double shift, int64_t n, double& sum_a, double& sum_ab) {
  const int64_t body = n - n % kLanes;
  Lanes8 a0 = {}, a1 = {}, ab0 = {}, ab1 = {};
  for (int64_t i = 0; i < body; i += kLanes) {
    Lanes8 x0, x1, y0, y1;
    load8(a + i, x0);
    load8(a + i + 8, x1);
    load8(b + i, y0);
    load8(b + i + 8, y1);
    x0 -= shift;
    x1 -= shift;
    a0 += x0;
    a1 += x1;
    ab0 += x0 * (y0 - shift);
    ab1 += x1 * (y1 - shift);
  }
  double ta = 0, tab = 0;
  for (int64_t i = body; i < n; ++i) {
    const double x = static_cast<double>(a[i]) - shift;
    ta += x;
    tab += x * (static_cast<double>(b[i]) - shift);
  }
  sum_a = lane_total(a0, a1, ta);
  sum_ab = lane_total(ab0, ab1, tab);
}

// The statistics of one row of M values, in double and in two passes (a one-pass sum of squares loses
// digits when |mean| >> std): mean (0 when rms) and rstd = 1 / sqrt(mean((x - mean)^2) + eps). The
// second pass also sums d = x - m, which is the first pass's rounding error times M: it corrects the
// mean (m + sum d / M) and, by the corrected two-pass formula, the variance
// (sum d^2 - (sum d)^2 / M) / M, so that a float64 row of 1e7 + noise normalizes to its last digits
// and a constant row to 0.
template <typename T>
inline void row_statistics(const T* x, int64_t M, bool rms, double eps, double& mean, double& rstd) {
  const int64_t body = M - M % kLanes;
  double m = 0;
  if (!rms) {
    Lanes8 s0 = {}, s1 = {};
    for (int64_t i = 0; i < body; i += kLanes) {
      Lanes8 x0, x1;
      load8(x + i, x0);
      load8(x + i + 8, x1);
      s0 += x0;
      s1 += x1;
    }
    double tail = 0;
    for (int64_t i = body; i < M; ++i) tail += static_cast<double>(x[i]);
    m = lane_total(s0, s1, tail) / static_cast<double>(M);
  }
  double drift = 0, ss = 0;
  shifted_sums(x, x, m, M, drift, ss);
  if (rms) drift = 0;  // the mean square of x itself
  mean = m + drift / static_cast<double>(M);
  // >= 0 in exact arithmetic; rounding can leave a constant row a hair below.
  const double var = std::max(0.0, ss - drift * drift / static_cast<double>(M)) / static_cast<double>(M);
  rstd = 1.0 / std::sqrt(var + eps);
}

}  // namespace kiln::cpu

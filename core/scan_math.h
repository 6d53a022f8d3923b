// core/scan_math.h: the order of Backend::sort and the step of Backend::scan, written once for the CPU
// (cpu/sort.cpp) and CUDA (cuda/sort.cu) kernels, so both order and accumulate alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/backend.h"
#include "core/half.h"
#include "core/scalar_math.h"

namespace kiln {

// The type a key is compared in: float for the 16-bit floats, the type itself otherwise.
template <typename T>
using sort_key_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

// True when key a at position i goes before key b at position j in the sort's total order: NaN above
// every number, and equal keys (0 and -0 among them) by position, so that any sort with this order
// is stable and any partial sort gives the full sort's first elements.
template <typename K>
KILN_HOST_DEVICE inline bool sorts_before(K a, int64_t i, K b, int64_t j, bool descending) {
  if constexpr (std::is_floating_point_v<K>) {
    const bool a_nan = a != a, b_nan = b != b;
    if (a_nan || b_nan) return a_nan == b_nan ? i < j : (descending ? a_nan : b_nan);
  }
  if (descending) return b < a || (!(a < b) && i < j);
  return a < b || (!(b < a) && i < j);
}

// The accumulator of a running sum or product: double for float32 and float64, float for the 16-bit
// floats, the type itself for integers (int64 unless cumsum or cumprod was given another dtype).
template <typename T>
using scan_acc_t = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, double>, double,
                                      std::conditional_t<std::is_floating_point_v<sort_key_t<T>>, float, T>>;

// log(exp(a) + exp(b)) without overflow; NaN in, NaN out; two equal infinities stay themselves.
template <typename A>
KILN_HOST_DEVICE inline A log_add_exp(A a, A b) {
  using std::exp;
  using std::log1p;
  if (a != a || b != b) return a != a ? a : b;
  const A lo = a < b ? a : b, hi = a < b ? b : a;
  if (lo == hi && !(lo - lo == 0)) return hi;  // both +inf or both -inf
  return hi + log1p(exp(lo - hi));
}

// One line's running reduction: step(x, j) takes element j (in order from 0) and returns the value to
// write at j; `index` is the running extreme's position (Max and Min).
template <typename T>
struct ScanStep {
  using A = scan_acc_t<T>;
  ScanKind kind;
  A acc{};
  sort_key_t<T> best{};
  int64_t index = 0;

  KILN_HOST_DEVICE explicit ScanStep(ScanKind k) : kind(k) {
    if (k == ScanKind::Prod) acc = A(1);
    if (k == ScanKind::LogSumExp) {
      if constexpr (std::is_floating_point_v<A>) acc = -std::numeric_limits<A>::infinity();
    }
  }

  // step() for a kind known at compile time (the CPU's loops pick it once a call).
  template <ScanKind kKind>
  KILN_HOST_DEVICE T step_as(T value, int64_t j) {
    using K = sort_key_t<T>;
    const K x = static_cast<K>(value);
    if constexpr (kKind == ScanKind::Sum || kKind == ScanKind::Prod) {
      if constexpr (std::is_same_v<A, bool>) {
        return value;  // ops/ sends no bool
      } else if constexpr (std::is_integral_v<A>) {
        acc = kKind == ScanKind::Sum ? math::wrap_add(acc, static_cast<A>(x)) : math::wrap_mul(acc, static_cast<A>(x));
      } else {
        acc = kKind == ScanKind::Sum ? acc + static_cast<A>(x) : acc * static_cast<A>(x);
      }
      return static_cast<T>(acc);
    } else if constexpr (kKind == ScanKind::LogSumExp) {
      if constexpr (std::is_floating_point_v<A>) acc = log_add_exp(acc, static_cast<A>(x));
      return static_cast<T>(acc);
    } else {  // Max, Min
      bool take = j == 0;
      if (!take) {
        if constexpr (std::is_floating_point_v<K>) {
          if (best != best)
            take = x != x;  // a NaN stays until the next NaN
          else
            take = x != x || (kKind == ScanKind::Max ? !(x < best) : !(best < x));
        } else {
          take = kKind == ScanKind::Max ? !(x < best) : !(best < x);
        }
      }
      if (take) {
        best = x;
        index = j;
      }
      return static_cast<T>(best);
    }
  }

  KILN_HOST_DEVICE T step(T value, int64_t j) {
    switch (kind) {
      case ScanKind::Sum:
        return step_as<ScanKind::Sum>(value, j);
      case ScanKind::Prod:
        return step_as<ScanKind::Prod>(value, j);
      case ScanKind::LogSumExp:
        return step_as<ScanKind::LogSumExp>(value, j);
      case ScanKind::Max:
        return step_as<ScanKind::Max>(value, j);
      case ScanKind::Min:
        return step_as<ScanKind::Min>(value, j);
    }
    return value;
  }
};

}  // namespace kiln

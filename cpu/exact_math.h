// cpu/exact_math.h: exp and log for Eigen array expressions, vectorized like Eigen's own, but exact
// where Eigen's are not (private to cpu/).
//
// Note [Eigen's exp below its range]: Eigen 3.4's vectorized exp clamps its argument to -88.72
// (float) or -709.78 (double) and so returns exp(-88.72) = 2.9e-39 (5.6e-309) for every x below,
// -inf included, where the true value is a subnormal or 0; the scalar std::exp is right. The
// difference reached results: softmax gave masked (-inf) logits a probability of 2.9e-39, a row of
// nothing but -inf gave 1/n in its vectorized part and nan in its scalar tail, and gelu's backward at
// -inf was -inf * 2.9e-39 = -inf where PyTorch gives nan. exact_exp computes exp(x + s) * exp(-s)
// for x below -80 (-700), where x + s is inside Eigen's range: s = 32 (64) gives the subnormals
// rounded once, and 0 for x below the subnormals (exp(-inf + s) is the clamped value, times exp(-s)
// it rounds to 0). NaN stays NaN.
//
// Note [Eigen's exp near its top]: at the other end, Eigen's vectorized float exp returned inf for x
// in [88.38, 88.72], where exp(x) is still below FLT_MAX (3.4e38): x / ln 2 rounds to 128 there,
// and 2^128 overflows before the rest of the product scales it down. exact_exp mirrors the low
// end: above 80 (700 for double) it computes exp(x - s) * exp(s), rounded twice (within 3e-7
// relative for float, as Eigen's own exp just below it).
// Cost: two compares and a branch per packet; where a lane is past either end, an add, a multiply
// and four blends more.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <type_traits>

namespace kiln::cpu {

template <typename T>
struct ExactExpOp {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  static constexpr T kLow = std::is_same_v<T, float> ? T(-80) : T(-700);  // inside Eigen's range
  static constexpr T kShift = std::is_same_v<T, float> ? T(32) : T(64);
  static constexpr T kUnshift = std::is_same_v<T, float> ? T(1.26641655490941755e-14)   // exp(-32)
                                                         : T(1.60381089054863793e-28);  // exp(-64)
  static constexpr T kHigh = -kLow;                                                      // Note [Eigen's exp near its top]
  static constexpr T kReshift = std::is_same_v<T, float> ? T(78962960182680.6952)        // exp(32)
                                                         : T(6.23514908081161688e27);    // exp(64)

  T operator()(const T& x) const { return std::exp(x); }
  template <typename Packet>
  Packet packetOp(const Packet& x) const {
    namespace in = Eigen::internal;
    const Packet low = in::pcmp_lt(x, in::pset1<Packet>(kLow));
    const Packet high = in::pcmp_lt(in::pset1<Packet>(kHigh), x);
    if (!in::predux_any(in::por(low, high))) return in::pexp(x);  // the common case
    const Packet zero = in::pset1<Packet>(T(0)), one = in::pset1<Packet>(T(1));
    // Other lanes add 0 and multiply by 1, which changes no value (exp(-0) = exp(0)).
    const Packet shift =
        in::pselect(low, in::pset1<Packet>(kShift), in::pselect(high, in::pset1<Packet>(-kShift), zero));
    const Packet scale =
        in::pselect(low, in::pset1<Packet>(kUnshift), in::pselect(high, in::pset1<Packet>(kReshift), one));
    return in::pmul(in::pexp(in::padd(x, shift)), scale);
  }
};

// exact_exp(a): as a.exp(), exact below Eigen's range and finite up to its top; a an Eigen array
// expression of float or double.
template <typename Derived>
auto exact_exp(const Eigen::ArrayBase<Derived>& a) {
  return a.unaryExpr(ExactExpOp<typename Derived::Scalar>{});
}

// expm1 as Eigen's, but through exact_exp above 80 (700), where Eigen's overflowed early as its exp
// (Note [Eigen's exp near its top]) and where expm1(x) rounds to exp(x).
template <typename T>
struct ExactExpm1Op {
  T operator()(const T& x) const { return std::expm1(x); }
  template <typename Packet>
  Packet packetOp(const Packet& x) const {
    namespace in = Eigen::internal;
    const Packet high = in::pcmp_lt(in::pset1<Packet>(ExactExpOp<T>::kHigh), x);
    const Packet y = in::pexpm1(x);
    return in::predux_any(high) ? in::pselect(high, ExactExpOp<T>{}.packetOp(x), y) : y;
  }
};

template <typename Derived>
auto exact_expm1(const Eigen::ArrayBase<Derived>& a) {
  return a.unaryExpr(ExactExpm1Op<typename Derived::Scalar>{});
}

// Note [Eigen's log of subnormals]: Eigen 3.4's vectorized log treats a subnormal x as the smallest
// normal number, so log(1e-40f) was -87.34 instead of -92.10 (and log(1e-310) -708.40 instead of
// -713.80): the log of a probability that underflowed. exact_log scales such an x by 2^24 (2^54) into
// the normal range and subtracts 24 ln 2 (54 ln 2). 0, negative numbers and NaN keep Eigen's answers
// (-inf, NaN, NaN): scaling does not change them.
template <typename T>
struct ExactLogOp {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  static constexpr T kSmallest = std::numeric_limits<T>::min();  // the smallest normal number
  static constexpr T kScale = std::is_same_v<T, float> ? T(16777216.0) : T(18014398509481984.0);  // 2^24, 2^54
  static constexpr T kLogScale = std::is_same_v<T, float> ? T(16.635532333438686)    // 24 ln 2
                                                          : T(37.4299477502370479);  // 54 ln 2

  T operator()(const T& x) const { return std::log(x); }
  template <typename Packet>
  Packet packetOp(const Packet& x) const {
    namespace in = Eigen::internal;
    const Packet tiny = in::pcmp_lt(x, in::pset1<Packet>(kSmallest));
    const Packet y = in::plog(in::pselect(tiny, in::pmul(x, in::pset1<Packet>(kScale)), x));
    return in::pselect(tiny, in::psub(y, in::pset1<Packet>(kLogScale)), y);
  }
};

template <typename Derived>
auto exact_log(const Eigen::ArrayBase<Derived>& a) {
  return a.unaryExpr(ExactLogOp<typename Derived::Scalar>{});
}

}  // namespace kiln::cpu

namespace Eigen::internal {
template <typename T>
struct functor_traits<kiln::cpu::ExactExpOp<T>> {
  enum { Cost = functor_traits<scalar_exp_op<T>>::Cost + 5 * NumTraits<T>::AddCost,
         PacketAccess = packet_traits<T>::HasExp && packet_traits<T>::HasCmp };  // pselect is generic
};
template <typename T>
struct functor_traits<kiln::cpu::ExactExpm1Op<T>> {
  enum { Cost = functor_traits<scalar_expm1_op<T>>::Cost + 6 * NumTraits<T>::AddCost,
         PacketAccess = packet_traits<T>::HasExpm1 && packet_traits<T>::HasExp && packet_traits<T>::HasCmp };
};
template <typename T>
struct functor_traits<kiln::cpu::ExactLogOp<T>> {
  enum { Cost = functor_traits<scalar_log_op<T>>::Cost + 4 * NumTraits<T>::AddCost,
         PacketAccess = packet_traits<T>::HasLog && packet_traits<T>::HasCmp };
};
}  // namespace Eigen::internal

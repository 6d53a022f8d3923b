// core/scalar_math.h: the math of every elementwise op, on one element, defined once.
//
// The CPU backend's scalar loops and the CUDA backend's kernels both call these, so "what gelu is"
// has one definition. T is the op-math type (float for the 16-bit floats). Vectorized CPU fast paths
// (cpu/elementwise.cpp) are checked against these in the op tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/backend.h"
#include "core/half.h"
#include "core/bessel_math.h"
#include "core/polynomial_math.h"
#include "core/special_math.h"

namespace kiln::math {

template <typename T>
KILN_HOST_DEVICE inline T sigmoid(T x) {
  using std::exp;
  return T(1) / (T(1) + exp(-x));
}

// Integer power by squaring, wrapping on overflow (as two's complement, like PyTorch); a negative
// exponent gives 1 / x^|e| truncated: 1 for x = 1, +-1 for x = -1, else 0.
template <typename T>
KILN_HOST_DEVICE inline T int_pow(T x, T e) {
  using U = std::make_unsigned_t<T>;
  if constexpr (std::is_signed_v<T>) {
    if (e < 0) return x == 1 ? T(1) : x == -1 ? ((e & 1) ? T(-1) : T(1)) : T(0);
  }
  U result = 1, base = static_cast<U>(x);
  for (U n = static_cast<U>(e); n > 0; n >>= 1) {
    if (n & 1) result *= base;
    base *= base;
  }
  return static_cast<T>(result);
}

// +, - and * of signed integers wrap as two's complement (PyTorch's results: int64 2^62 * 4 is 0),
// computed in the unsigned type, where C++ defines the wrap (in the signed type it is undefined).
template <typename T>
KILN_HOST_DEVICE inline T wrap_add(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
}
template <typename T>
KILN_HOST_DEVICE inline T wrap_sub(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(x) - static_cast<U>(y)));
}
template <typename T>
KILN_HOST_DEVICE inline T wrap_mul(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
}

// Floor division and remainder (Python's // and %: the quotient rounded toward -inf, the remainder
// with y's sign) and C's truncating remainder, for integers; y != 0 (ops/ checks). y == -1 is taken
// apart: min / -1 overflows, which traps on x86; the quotient wraps, as two's complement.
template <typename T>
KILN_HOST_DEVICE inline T int_floor_divide(T x, T y) {
  if constexpr (std::is_signed_v<T>) {
    if (y == T(-1)) return wrap_sub(T(0), x);
    const T q = static_cast<T>(x / y);
    return (x % y != 0 && ((x < 0) != (y < 0))) ? static_cast<T>(q - 1) : q;
  } else {
    return static_cast<T>(x / y);
  }
}
template <typename T>
KILN_HOST_DEVICE inline T int_trunc_divide(T x, T y) {
  if constexpr (std::is_signed_v<T>) {
    if (y == T(-1)) return wrap_sub(T(0), x);
  }
  return static_cast<T>(x / y);
}
template <typename T>
KILN_HOST_DEVICE inline T int_remainder(T x, T y, bool floor) {
  if constexpr (std::is_signed_v<T>) {
    if (y == T(-1)) return T(0);
    const T r = static_cast<T>(x % y);
    return floor && r != 0 && ((r < 0) != (y < 0)) ? static_cast<T>(r + y) : r;
  } else {
    return static_cast<T>(x % y);
  }
}

// The same for floating x and y, as PyTorch computes them: the remainder from fmod (exact), the
// floor quotient from (x - fmod(x, y)) / y, nudged to the nearest integer; y = 0 gives IEEE's
// x / y (inf or nan) for the quotient and nan for the remainders.
template <typename T>
KILN_HOST_DEVICE inline T float_remainder(T x, T y) {
  using std::fmod;
  T mod = fmod(x, y);
  if (mod != T(0) && ((y < T(0)) != (mod < T(0)))) mod += y;
  return mod;
}
template <typename T>
KILN_HOST_DEVICE inline T float_floor_divide(T x, T y) {
  using std::fmod, std::floor, std::copysign;
  if (y == T(0)) return x / y;
  const T mod = fmod(x, y);
  T div = (x - mod) / y;
  if (mod != T(0) && ((y < T(0)) != (mod < T(0)))) div -= T(1);
  if (div == T(0)) return copysign(T(0), x / y);
  T q = floor(div);
  if (div - q > T(0.5)) q += T(1);
  return q;
}

// Note [GELU's erf form in float]: gelu(x) = x Phi(x) and gelu'(x) = Phi(x) + x phi(x), with
// Phi(x) = erfc(-x / sqrt 2) / 2 and phi(x) = exp(-x^2 / 2) / sqrt(2 pi). In float, erfcf(-x / sqrt 2)
// has two costs. Its argument is rounded before erfc sees it, and erfc(a) ~ exp(-a^2) turns a's
// relative error u into 2 a^2 u of the result: 1.2e-5 relatively at x = -13, against long double.
// And it is long: 52 instructions an element on sm_90 (two reciprocals refined to IEEE, a degree-10
// polynomial, an exp with its range checks): at 4.2 TB/s about as much issue time as the memory
// takes, the likely reason GELU ran at 0.81x PyTorch's erf form on an H200. Here, with
// a = |x| / sqrt 2,
//   Phi(-|x|) = t exp(-x^2 / 2 + P(t)) / 2,  t = 1 / (1 + a / 2),
// P the degree-9 Chebyshev fit of Numerical Recipes' erfcc (fractional error below 1.2e-7 for every
// a >= 0; cpu/elementwise.cpp's vectorized tail takes the same fit in double), and Phi(|x|) =
// 1 - Phi(-|x|). x^2 / 2 is split exactly (x^2 = sq + sq_lo by an fma) and exp's large part reduced
// by n ln 2 in two pieces, so the big exponent is never rounded; what is left, r, lies within ln 2 / 2
// of 0. exp2 then takes r log2 e + P(t) log2 e - 1 (the coefficients are P's times log2 e, the - 1 is
// the / 2), and the result is scaled by 2^n. Where 2^n would be subnormal (n < -126, |x| > 13.2) the
// rest of n goes into exp2's argument, which then rounds to about 1e-6, as the result is subnormal or
// nearly so. The last multiplications keep inf and NaN as the erfc form has them: gelu(inf) = inf,
// gelu(-inf) = NaN (-inf * 0), gelu'(+-inf) = NaN; |x| is clamped to 64 first, where the result has
// long underflowed (Phi(-14.5) < 1e-47), so that no inf - inf arises inside.
// On the GPU the reciprocal is the approximate instruction and one Newton step, and exp2 the
// hardware's (Note [exp2 on the GPU]; its argument is above -30 where it matters). Measured
// over every 997th float in [-16, 16] against long double, the reciprocal taken 1 ulp off and exp2
// 2 ulp off either way: relative error below 8.9e-7 forward and 8.7e-7 of |Phi| + |x phi| backward
// (the largest near x = 0, where P's fit and exp2 show most), against 1.2e-5 and 3.9e-6 for the
// erfcf form (in the tail); 36 instructions an element on sm_90 forward, against 52.
inline constexpr float kLog2e = 1.44269504088896340736f;
inline constexpr float kLn2 = 0.69314718055994530942f;

// Note [exp2 on the GPU]: 2^v as the hardware's ex2.approx.ftz on the GPU (one instruction, within
// 2 ulp, results below 2^-126 flushed to 0), std::exp2 on the host. An accurate expf is about ten
// instructions, which the memory-bound GPU kernels cannot always afford (SASS, sm_90): GELU (below),
// the attention kernels (Note [exp2 in the register-tiled kernels]), the cross-entropy (Note [the
// logits a chunk at a time]) and the softmax rows (Note [softmax rows in few instructions]) take
// this one. fast_exp(v) is exp(v) through it in float, and exp itself in double.
KILN_HOST_DEVICE inline float fast_exp2(float v) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(v));
  return y;
#else
  return std::exp2(v);
#endif
}
template <typename T>
KILN_HOST_DEVICE inline T fast_exp(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return fast_exp2(v * kLog2e);
  } else {
    using std::exp;
    return exp(v);
  }
}

namespace detail {
KILN_HOST_DEVICE inline float approx_reciprocal(float d) {  // d in [1, 2^126)
#ifdef __CUDA_ARCH__
  float t;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(d));
  return fmaf(t, fmaf(-d, t, 1.0f), t);  // one Newton step: within an ulp
#else
  return 1.0f / d;
#endif
}
KILN_HOST_DEVICE inline float pow2_float(float k) {  // 2^k for an integer k in [-126, 127]
  const uint32_t bits = static_cast<uint32_t>(static_cast<int>(k) + 127) << 23;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// The pieces of Phi(-|x|) and phi(x), each times 2^-n: Phi(-|x|) = q * scale, phi(x) = pdf * scale.
struct NormalParts {
  float q, pdf, scale;
};
KILN_HOST_DEVICE inline NormalParts normal_parts(float x, bool with_pdf) {
  constexpr float kLn2Hi = 0.693145751953125f;          // 16 bits: n * kLn2Hi is exact for |n| < 2^8
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;  // ln 2 - kLn2Hi
  const float ax = fminf(fabsf(x), 64.0f);              // NaN gives 64 here; x carries it out
  const float sq = ax * ax, sq_lo = fmaf(ax, ax, -sq);  // x^2 = sq + sq_lo exactly
  const float n = rintf(sq * (-0.5f * kLog2e));
  float r = fmaf(n, -kLn2Lo, fmaf(n, -kLn2Hi, -0.5f * sq));
  r = fmaf(sq_lo, -0.5f, r);  // -x^2 / 2 - n ln 2
  const float n_scale = fmaxf(n, -126.0f), n_rest = n - n_scale;
  const float t = approx_reciprocal(fmaf(ax, 0.35355339059327376220f, 1.0f));
  // P(t) log2 e - 1: Numerical Recipes' coefficients times log2 e, the constant less 1.
  float p = fmaf(t, 0.246517298f, -1.18611495f);
  p = fmaf(t, p, 2.14747446f);
  p = fmaf(t, p, -1.63775315f);
  p = fmaf(t, p, 0.402321582f);
  p = fmaf(t, p, -0.26875686f);
  p = fmaf(t, p, 0.139630057f);
  p = fmaf(t, p, 0.539700616f);
  p = fmaf(t, p, 1.4427292f);
  p = fmaf(t, p, -2.82574822f);
  NormalParts out;
  out.q = t * fast_exp2(fmaf(r, kLog2e, p + n_rest));
  // phi = exp(r) 2^n / sqrt(2 pi): log2(1 / sqrt(2 pi)) = -1.32574806
  out.pdf = with_pdf ? fast_exp2(fmaf(r, kLog2e, -1.32574806f + n_rest)) : 0.0f;
  out.scale = pow2_float(n_scale);
  return out;
}
}  // namespace detail

KILN_HOST_DEVICE inline float gelu_erf_float(float x) {  // See Note [GELU's erf form in float]
  const detail::NormalParts g = detail::normal_parts(x, false);
  if (x > 0.0f) return x * (1.0f - g.q * g.scale);
  return x * g.q * g.scale;
}

KILN_HOST_DEVICE inline float gelu_erf_backward_float(float grad, float x) {  // grad * gelu'(x)
  const detail::NormalParts g = detail::normal_parts(x, true);
  const float x_pdf = x * g.pdf * g.scale;  // pdf is 0 beyond |x| = 14.5: +-inf gives inf * 0 = NaN
  const float slope = x > 0.0f ? (1.0f - g.q * g.scale) + x_pdf : g.q * g.scale + x_pdf;
  return grad * slope;
}

template <typename T>
KILN_HOST_DEVICE inline T unary(UnaryOp op, T x, double a, double b) {
  using std::abs, std::exp, std::log, std::log1p, std::expm1, std::sqrt, std::sin, std::cos, std::tanh, std::erf,
      std::erfc, std::pow, std::floor, std::ceil, std::trunc, std::nearbyint, std::tan, std::asin, std::acos, std::atan,
      std::sinh, std::cosh, std::asinh, std::acosh, std::atanh, std::log2, std::log10, std::exp2;
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case UnaryOp::Neg: return wrap_sub(T(0), x);  // -INT64_MIN wraps to itself, as PyTorch
      case UnaryOp::Abs:
        if constexpr (std::is_unsigned_v<T>) return x;
        else return x < 0 ? wrap_sub(T(0), x) : x;
      case UnaryOp::Sign:
        if constexpr (std::is_unsigned_v<T>) return static_cast<T>(x > 0);
        else return static_cast<T>((x > 0) - (x < 0));
      case UnaryOp::Relu: return x > 0 ? x : T(0);
      case UnaryOp::Square: return wrap_mul(x, x);
      case UnaryOp::PowScalar: return int_pow(x, static_cast<T>(a));
      case UnaryOp::BitwiseNot: return static_cast<T>(~x);
      // floor, ceil, trunc and round leave an integer as it is; ops/ promotes integers to float for
      // every other op, and clamps integers exactly through maximum and minimum (ops/elementwise.cpp).
      default: return x;
    }
  } else {
    constexpr T kSqrt1_2 = T(0.70710678118654752440);
    constexpr T kSqrt2OverPi = T(0.79788456080286535588);
    switch (op) {
      case UnaryOp::Neg: return -x;
      case UnaryOp::Abs: return abs(x);
      case UnaryOp::Sign: return x != x ? x : static_cast<T>((x > 0) - (x < 0));
      case UnaryOp::Exp: return exp(x);
      case UnaryOp::Log: return log(x);
      case UnaryOp::Log1p: return log1p(x);
      case UnaryOp::Expm1: return expm1(x);
      case UnaryOp::Sqrt: return sqrt(x);
      case UnaryOp::Rsqrt: return T(1) / sqrt(x);
      case UnaryOp::Reciprocal: return T(1) / x;
      case UnaryOp::Sin: return sin(x);
      case UnaryOp::Cos: return cos(x);
      case UnaryOp::Tanh: return tanh(x);
      case UnaryOp::Sigmoid: return sigmoid(x);
      case UnaryOp::Relu: return x > 0 ? x : (x != x ? x : T(0));
      // x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2: for negative x, 1 + erf(x / sqrt 2) would
      // cancel (1 - 0.99...) and lose the low bits that erfc keeps. Float (and the 16-bit types,
      // whose op-math is float) takes Note [GELU's erf form in float].
      case UnaryOp::GeluErf:
        if constexpr (std::is_same_v<T, float>) {
          return gelu_erf_float(x);
        } else {
          return T(0.5) * x * erfc(-x * kSqrt1_2);
        }
      case UnaryOp::GeluTanh:
        return T(0.5) * x * (T(1) + tanh(kSqrt2OverPi * (x + T(0.044715) * x * x * x)));
      case UnaryOp::Silu: return x / (T(1) + exp(-x));  // silu(-inf) = nan, as PyTorch
      case UnaryOp::Softplus: return x > T(20) ? x : log1p(exp(x));  // PyTorch's threshold 20
      case UnaryOp::Erf: return erf(x);
      case UnaryOp::Square: return x * x;
      case UnaryOp::PowScalar:  // PyTorch's special exponents (and pow(-inf, 0.5) = nan, as sqrt)
        if (a == 2) return x * x;
        if (a == 0.5) return sqrt(x);
        if (a == -0.5) return T(1) / sqrt(x);
        if (a == -1) return T(1) / x;
        return pow(x, static_cast<T>(a));
      case UnaryOp::Clamp: {
        if (x != x) return x;
        T lo = static_cast<T>(a), hi = static_cast<T>(b);
        T v = x < lo ? lo : x;
        return v > hi ? hi : v;  // max wins when min > max, as in PyTorch
      }
      case UnaryOp::Floor: return floor(x);
      case UnaryOp::Ceil: return ceil(x);
      case UnaryOp::Trunc: return trunc(x);
      case UnaryOp::Round: return nearbyint(x);  // the default rounding mode: halves to even
      case UnaryOp::BitwiseNot: return x;         // ops/ sends integers only
      case UnaryOp::LogicalNot: return x == T(0) ? T(1) : T(0);
      case UnaryOp::Tan: return tan(x);
      case UnaryOp::Asin: return asin(x);
      case UnaryOp::Acos: return acos(x);
      case UnaryOp::Atan: return atan(x);
      case UnaryOp::Sinh: return sinh(x);
      case UnaryOp::Cosh: return cosh(x);
      case UnaryOp::Asinh: return asinh(x);
      case UnaryOp::Acosh: return acosh(x);
      case UnaryOp::Atanh: return atanh(x);
      case UnaryOp::Log2: return log2(x);
      case UnaryOp::Log10: return log10(x);
      case UnaryOp::Exp2: return exp2(x);
      case UnaryOp::Erfc: return erfc(x);
      case UnaryOp::Lgamma: return log_abs_gamma(x);  // +inf at the poles 0, -1, -2, ..., as PyTorch
      // core/special_math.h: in float64 (to float32's need for a float32 result), rounded once.
      case UnaryOp::Erfinv: return static_cast<T>(erfinv_f64(static_cast<double>(x), std::is_same_v<T, float>));
      case UnaryOp::Digamma: return static_cast<T>(digamma_f64(static_cast<double>(x), std::is_same_v<T, float>));
      case UnaryOp::Polygamma:
        return static_cast<T>(polygamma_f64(static_cast<int>(a), static_cast<double>(x), std::is_same_v<T, float>));
      // core/bessel_math.h: nu = 0 or 1, scaled or not.
      case UnaryOp::I0:
      case UnaryOp::I0e:
      case UnaryOp::I1:
      case UnaryOp::I1e:
        return static_cast<T>(bessel_i_f64(op == UnaryOp::I0 || op == UnaryOp::I0e ? 0 : 1, static_cast<double>(x),
                                           op == UnaryOp::I0e || op == UnaryOp::I1e, std::is_same_v<T, float>));
      case UnaryOp::BesselJ0:
      case UnaryOp::BesselJ1:
        return static_cast<T>(
            bessel_j_f64(op == UnaryOp::BesselJ0 ? 0 : 1, static_cast<double>(x), std::is_same_v<T, float>));
      case UnaryOp::BesselY0:
      case UnaryOp::BesselY1:
        return static_cast<T>(
            bessel_y_f64(op == UnaryOp::BesselY0 ? 0 : 1, static_cast<double>(x), std::is_same_v<T, float>));
      case UnaryOp::BesselK0:
      case UnaryOp::BesselK1:
      case UnaryOp::BesselK0e:
      case UnaryOp::BesselK1e:
        return static_cast<T>(bessel_k_f64(op == UnaryOp::BesselK0 || op == UnaryOp::BesselK0e ? 0 : 1,
                                           static_cast<double>(x), op == UnaryOp::BesselK0e || op == UnaryOp::BesselK1e,
                                           std::is_same_v<T, float>));
      case UnaryOp::SphericalBesselJ0: return static_cast<T>(spherical_bessel_j0_f64(static_cast<double>(x)));
      case UnaryOp::AiryAi:
      case UnaryOp::AiryAiPrime:
        return static_cast<T>(
            airy_ai_f64(static_cast<double>(x), op == UnaryOp::AiryAiPrime, std::is_same_v<T, float>));
      case UnaryOp::Erfcx: return static_cast<T>(erfcx_f64(static_cast<double>(x)));
      case UnaryOp::Ndtr: return static_cast<T>(ndtr_f64(static_cast<double>(x)));
      case UnaryOp::LogNdtr: return static_cast<T>(log_ndtr_f64(static_cast<double>(x)));
      case UnaryOp::Ndtri: return static_cast<T>(ndtri_f64(static_cast<double>(x), std::is_same_v<T, float>));
      case UnaryOp::Entr:  // -x log x; 0 at 0, -inf left of it, NaN stays NaN
        if (x != x) return x;
        if (x > T(0)) return -x * log(x);
        return x == T(0) ? T(0) : -std::numeric_limits<T>::infinity();
    }
    return x;
  }
}

// The binary ops that only floating types reach (ops/ promotes integers), PyTorch's definitions.
template <typename T>
KILN_HOST_DEVICE inline T float_binary(BinaryOp op, T x, T y) {
  using std::atan2, std::hypot, std::copysign, std::log, std::log1p, std::exp, std::exp2, std::abs;
  switch (op) {
    case BinaryOp::Atan2: return atan2(x, y);
    case BinaryOp::Hypot: return hypot(x, y);
    case BinaryOp::Copysign: return copysign(x, y);
    // max + log(1 + e^-|x - y|); two equal infinities give themselves, not inf - inf = NaN.
    case BinaryOp::LogAddExp:
      if (x == y && abs(x) == std::numeric_limits<T>::infinity()) return x;
      return (x > y ? x : y) + log1p(exp(-abs(x - y)));
    case BinaryOp::LogAddExp2:
      if (x == y && abs(x) == std::numeric_limits<T>::infinity()) return x;
      return (x > y ? x : y) + log1p(exp2(-abs(x - y))) * T(1.44269504088896340736);  // / ln 2
    case BinaryOp::Xlogy:
      if (y != y) return y;
      if (x == T(0)) return T(0);
      return x * log(y);
    case BinaryOp::Xlog1py:
      if (y != y) return y;
      if (x == T(0)) return T(0);
      return x * log1p(y);
    // core/special_math.h: in float64 (to float32's need for a float32 result), rounded once.
    case BinaryOp::Zeta:
      return static_cast<T>(zeta_f64(static_cast<double>(x), static_cast<double>(y), std::is_same_v<T, float>));
    case BinaryOp::Gammainc:
    case BinaryOp::Gammaincc:
      return static_cast<T>(incomplete_gamma_f64(static_cast<double>(x), static_cast<double>(y),
                                                 op == BinaryOp::Gammaincc, std::is_same_v<T, float>));
    default: return x;
  }
}

// Whether op is an orthogonal polynomial: BinaryOp's ChebyshevT ... LegendreP, declared in a row.
KILN_HOST_DEVICE constexpr bool is_polynomial(BinaryOp op) {
  return op >= BinaryOp::ChebyshevT && op <= BinaryOp::LegendreP;
}

// The family of an orthogonal polynomial op, and whether it is shifted: p_n(2x - 1).
struct PolynomialKind {
  Polynomial family;
  bool shifted;
};
KILN_HOST_DEVICE inline PolynomialKind polynomial_kind(BinaryOp op) {
  const bool shifted = op >= BinaryOp::ShiftedChebyshevT && op <= BinaryOp::ShiftedChebyshevW;
  switch (op) {
    case BinaryOp::ChebyshevT:
    case BinaryOp::ShiftedChebyshevT: return {Polynomial::ChebyshevT, shifted};
    case BinaryOp::ChebyshevU:
    case BinaryOp::ShiftedChebyshevU: return {Polynomial::ChebyshevU, shifted};
    case BinaryOp::ChebyshevV:
    case BinaryOp::ShiftedChebyshevV: return {Polynomial::ChebyshevV, shifted};
    case BinaryOp::ChebyshevW:
    case BinaryOp::ShiftedChebyshevW: return {Polynomial::ChebyshevW, shifted};
    case BinaryOp::HermiteH: return {Polynomial::HermiteH, false};
    case BinaryOp::HermiteHe: return {Polynomial::HermiteHe, false};
    case BinaryOp::LaguerreL: return {Polynomial::LaguerreL, false};
    default: return {Polynomial::LegendreP, false};
  }
}

// The orthogonal polynomial ops: the m-th derivative of p_n(x).
KILN_HOST_DEVICE inline double polynomial(BinaryOp op, double x, double n, int m) {
  const PolynomialKind kind = polynomial_kind(op);
  return orthogonal_polynomial_f64(kind.family, x, n, m, kind.shifted);
}

template <typename T>
KILN_HOST_DEVICE inline T binary(BinaryOp op, T x, T y, T alpha) {
  using std::pow;
  switch (op) {
    case BinaryOp::Add:
      if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) return wrap_add(x, wrap_mul(alpha, y));
      else return static_cast<T>(x + alpha * y);
    case BinaryOp::Sub:
      if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) return wrap_sub(x, wrap_mul(alpha, y));
      else return static_cast<T>(x - alpha * y);
    case BinaryOp::Mul:
      if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) return wrap_mul(x, y);
      else return static_cast<T>(x * y);
    case BinaryOp::Div: return static_cast<T>(x / y);
    case BinaryOp::Pow:
      if constexpr (std::is_integral_v<T>) {
        return int_pow(x, y);
      } else {
        return pow(x, y);
      }
    case BinaryOp::Maximum:
      if (x != x) return x;  // NaN propagates
      return x > y ? x : y;  // and y when y is NaN
    case BinaryOp::Minimum:
      if (x != x) return x;
      return x < y ? x : y;
    // d/dy y Phi(y) = Phi(y) + y phi(y);  d/dy 0.5 y (1 + tanh(u)), u = k (y + c y^3):
    // 0.5 (1 + t) + 0.5 y (1 - t^2) k (1 + 3 c y^2), t = tanh(u). ops/ only sends floating types.
    case BinaryOp::GeluErfBackward:
      if constexpr (std::is_same_v<T, float>) {
        return gelu_erf_backward_float(x, y);  // Note [GELU's erf form in float]
      } else if constexpr (std::is_floating_point_v<T>) {
        using std::erfc, std::exp;
        return x * (T(0.5) * erfc(-y * T(0.70710678118654752440)) + y * exp(T(-0.5) * y * y) * T(0.39894228040143267794));
      } else {
        return x;
      }
    case BinaryOp::GeluTanhBackward:
      if constexpr (std::is_floating_point_v<T>) {
        using std::tanh;
        constexpr T k = T(0.79788456080286535588), c = T(0.044715);
        const T t = tanh(k * (y + c * y * y * y));
        return x * (T(0.5) * (T(1) + t) + T(0.5) * y * (T(1) - t * t) * k * (T(1) + T(3) * c * y * y));
      } else {
        return x;
      }
    // PyTorch's threshold_backward: 0 where y <= 0 (a NaN gradient there too), g elsewhere, a NaN y
    // included (relu passes NaN through, and so does its gradient).
    case BinaryOp::ReluBackward: return y <= T(0) ? T(0) : x;
    case BinaryOp::Remainder:
    case BinaryOp::Fmod:
      if constexpr (std::is_integral_v<T>) {
        return int_remainder(x, y, op == BinaryOp::Remainder);
      } else {
        using std::fmod;
        return op == BinaryOp::Remainder ? float_remainder(x, y) : fmod(x, y);
      }
    case BinaryOp::FloorDivide:
      if constexpr (std::is_integral_v<T>) {
        return int_floor_divide(x, y);
      } else {
        return float_floor_divide(x, y);
      }
    case BinaryOp::TruncDivide:
      if constexpr (std::is_integral_v<T>) {
        return int_trunc_divide(x, y);
      } else {
        using std::trunc;
        return trunc(x / y);
      }
    case BinaryOp::BitwiseAnd:
    case BinaryOp::BitwiseOr:
    case BinaryOp::BitwiseXor:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(op == BinaryOp::BitwiseAnd ? (x & y) : op == BinaryOp::BitwiseOr ? (x | y) : (x ^ y));
      } else {
        return x;  // ops/ sends integers only
      }
    case BinaryOp::Atan2:
    case BinaryOp::Hypot:
    case BinaryOp::Copysign:
    case BinaryOp::LogAddExp:
    case BinaryOp::LogAddExp2:
    case BinaryOp::Xlogy:
    case BinaryOp::Xlog1py:
    case BinaryOp::Zeta:
    case BinaryOp::Gammainc:
    case BinaryOp::Gammaincc:
      if constexpr (std::is_floating_point_v<T>) {
        return float_binary(op, x, y);
      } else {
        return x;  // ops/ sends floating types only
      }
    case BinaryOp::ChebyshevT:
    case BinaryOp::ChebyshevU:
    case BinaryOp::ChebyshevV:
    case BinaryOp::ChebyshevW:
    case BinaryOp::ShiftedChebyshevT:
    case BinaryOp::ShiftedChebyshevU:
    case BinaryOp::ShiftedChebyshevV:
    case BinaryOp::ShiftedChebyshevW:
    case BinaryOp::HermiteH:
    case BinaryOp::HermiteHe:
    case BinaryOp::LaguerreL:
    case BinaryOp::LegendreP:
      if constexpr (std::is_floating_point_v<T>) {
        return static_cast<T>(
            polynomial(op, static_cast<double>(x), static_cast<double>(y), static_cast<int>(alpha)));
      } else {
        return x;  // ops/ sends floating types only
      }
    default: return x;  // comparisons go through compare()
  }
}

template <typename T>
KILN_HOST_DEVICE inline bool compare(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::Eq: return x == y;
    case BinaryOp::Ne: return x != y;
    case BinaryOp::Lt: return x < y;
    case BinaryOp::Le: return x <= y;
    case BinaryOp::Gt: return x > y;
    case BinaryOp::Ge: return x >= y;
    case BinaryOp::LogicalAnd: return (x != T(0)) && (y != T(0));
    case BinaryOp::LogicalOr: return (x != T(0)) || (y != T(0));
    default: return false;
  }
}

// addcmul, addcdiv and lerp (TernaryOp) on one element, v already in T. addcmul associates as
// PyTorch's kernels do, (v * b) * c; addcdiv as its CUDA kernel, v * (b / c) (its CPU kernel takes
// (v * b) / c, which may differ in the last bit). lerp takes the end nearer the weight, so that
// w = 1 gives b exactly. Integers only reach Addcmul (ops/ checks the rest), which wraps on
// overflow, as two's complement.
template <typename T>
KILN_HOST_DEVICE inline T ternary(TernaryOp op, T a, T b, T c, T v) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(static_cast<U>(v) * static_cast<U>(b)) *
                                                               static_cast<U>(c)));
  } else {
    switch (op) {
      case TernaryOp::Addcmul: return a + v * b * c;
      case TernaryOp::Addcdiv: return a + v * (b / c);
      case TernaryOp::Lerp: v = c; [[fallthrough]];
      case TernaryOp::LerpScalar: return (v < T(0) ? -v : v) < T(0.5) ? a + v * (b - a) : b - (b - a) * (T(1) - v);
    }
    return a;
  }
}

// One element of a fused Adam / AdamW step (Backend::adam_step; core/backend.h has the rule), with
// the coefficients already in T. vmax is read and written only with amsgrad.
template <typename T>
struct AdamCoefficients {
  T lr_wd, one_minus_lr_wd, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bc2_sqrt;
  bool decoupled, amsgrad, maximize;
};

template <typename T>
KILN_HOST_DEVICE inline void adam_update(T& p, T g, T& m, T& v, T* vmax, const AdamCoefficients<T>& c) {
  using std::sqrt;
  if (c.maximize) g = -g;
  if (c.decoupled) {
    p = p * c.one_minus_lr_wd;
  } else if (c.lr_wd != T(0)) {
    g = g + c.lr_wd * p;  // lr_wd holds weight_decay alone here (Adam's L2 term)
  }
  m = m * c.beta1 + c.one_minus_beta1 * g;
  v = v * c.beta2 + c.one_minus_beta2 * (g * g);
  T denom_sq = v;
  if (c.amsgrad) {
    *vmax = *vmax > v ? *vmax : v;
    denom_sq = *vmax;
  }
  const T denom = sqrt(denom_sq) / c.bc2_sqrt + c.eps;
  p = p + (-c.step_size) * (m / denom);
}

template <typename T>
inline AdamCoefficients<T> adam_coefficients(const AdamStepArgs& a) {
  AdamCoefficients<T> c{};
  c.lr_wd = static_cast<T>(a.decoupled ? a.lr * a.weight_decay : a.weight_decay);
  c.one_minus_lr_wd = static_cast<T>(1 - a.lr * a.weight_decay);
  c.beta1 = static_cast<T>(a.beta1);
  c.one_minus_beta1 = static_cast<T>(1 - a.beta1);
  c.beta2 = static_cast<T>(a.beta2);
  c.one_minus_beta2 = static_cast<T>(1 - a.beta2);
  c.eps = static_cast<T>(a.eps);
  c.step_size = static_cast<T>(a.step_size);
  c.bc2_sqrt = static_cast<T>(a.bias_correction2_sqrt);
  c.decoupled = a.decoupled;
  c.amsgrad = a.amsgrad;
  c.maximize = a.maximize;
  return c;
}

// One element of a fused SGD step (Backend::sgd_step; core/backend.h has the rule), with the
// coefficients already in T. The flags that pick the rule's shape are template arguments, so that a
// loop over a tensor has no branch on them: buf is read or written only with kMomentum, and its old
// value is not read with kFirstStep. Each line rounds as the unfused step's op of optim/sgd.cpp.
template <typename T>
struct SgdCoefficients {
  T neg_lr, momentum, one_minus_dampening, weight_decay;
  bool maximize;
};

template <bool kMomentum, bool kNesterov, bool kFirstStep, typename T>
KILN_HOST_DEVICE inline void sgd_update(T& p, T g, T* buf, const SgdCoefficients<T>& c) {
  if (c.maximize) g = -g;
  if (c.weight_decay != T(0)) g = g + c.weight_decay * p;
  if constexpr (kMomentum) {
    if constexpr (kFirstStep) {
      *buf = g;
    } else {
      *buf = *buf * c.momentum + c.one_minus_dampening * g;
    }
    if constexpr (kNesterov) {
      g = g + c.momentum * *buf;
    } else {
      g = *buf;
    }
  }
  p = p + c.neg_lr * g;
}

template <typename T>
inline SgdCoefficients<T> sgd_coefficients(const SgdStepArgs& a) {
  SgdCoefficients<T> c{};
  c.neg_lr = static_cast<T>(-a.lr);
  c.momentum = static_cast<T>(a.momentum);
  c.one_minus_dampening = static_cast<T>(1 - a.dampening);
  c.weight_decay = static_cast<T>(a.weight_decay);
  c.maximize = a.maximize;
  return c;
}

// Calls f(momentum, nesterov, first_step) with the step's flags as std::bool_constant values, for a
// kernel that takes them as template arguments (kMomentum = decltype(momentum)::value). Without a
// momentum the other two do not matter: five variants in all.
template <typename F>
inline void with_sgd_flags(const SgdStepArgs& a, const F& f) {
  using Y = std::true_type;
  using N = std::false_type;
  if (a.momentum == 0) {
    f(N{}, N{}, N{});
  } else if (a.nesterov) {
    a.first_step ? f(Y{}, Y{}, Y{}) : f(Y{}, Y{}, N{});
  } else {
    a.first_step ? f(Y{}, N{}, Y{}) : f(Y{}, N{}, N{});
  }
}

}  // namespace kiln::math

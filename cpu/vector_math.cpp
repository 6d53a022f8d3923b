// cpu/vector_math.cpp: the pointwise functions that <cmath> has and Eigen does not vectorize, and those
// made of them (logaddexp, xlogy, xlog1py, entr, ndtr, log_ndtr, erfcx, the spherical j0, float32 erfinv
// and ndtri, Chebyshev's closed forms), over contiguous float32 and float64 runs, through glibc's vector
// math library (libmvec). Each loop below calls a function this file declares with GCC's simd
// attribute, so GCC compiles it to calls of the function's SIMD variant (_ZGVdN8v_tanf: 8 float32
// lanes of AVX2, _ZGVeN16v_tanf 16 of AVX-512), the same functions glibc's <math.h> declares that way
// under -ffast-math, here without it. glibc's own tests bound these variants' errors at a few ulp (its
// scalar functions at 1 or 2); the op table's PyTorch goldens check them at float32's and float64's
// tolerances, special values included, since each variant hands NaN, infinities and out-of-range inputs
// to the scalar function. Built where CMake finds libmvec (KILN_HAVE_LIBMVEC); without it these return
// false and the scalar loop of cpu/elementwise.cpp computes the same functions one element at a time.
#include "cpu/vector_math.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/polynomial_math.h"
#include "core/special_math.h"
#include "cpu/widen.h"

#if KILN_HAVE_LIBMVEC
#define KILN_SIMD __attribute__((simd("notinbranch")))
extern "C" {
KILN_SIMD float tanf(float) noexcept;
KILN_SIMD float asinf(float) noexcept;
KILN_SIMD float acosf(float) noexcept;
KILN_SIMD float atanf(float) noexcept;
KILN_SIMD float sinhf(float) noexcept;
KILN_SIMD float coshf(float) noexcept;
KILN_SIMD float asinhf(float) noexcept;
KILN_SIMD float acoshf(float) noexcept;
KILN_SIMD float atanhf(float) noexcept;
KILN_SIMD float log2f(float) noexcept;
KILN_SIMD float log10f(float) noexcept;
KILN_SIMD float exp2f(float) noexcept;
KILN_SIMD float expf(float) noexcept;
KILN_SIMD float log1pf(float) noexcept;
KILN_SIMD float logf(float) noexcept;
KILN_SIMD float erfcf(float) noexcept;
KILN_SIMD float atan2f(float, float) noexcept;
KILN_SIMD float hypotf(float, float) noexcept;
KILN_SIMD double tan(double) noexcept;
KILN_SIMD double asin(double) noexcept;
KILN_SIMD double acos(double) noexcept;
KILN_SIMD double atan(double) noexcept;
KILN_SIMD double sinh(double) noexcept;
KILN_SIMD double cosh(double) noexcept;
KILN_SIMD double asinh(double) noexcept;
KILN_SIMD double acosh(double) noexcept;
KILN_SIMD double atanh(double) noexcept;
KILN_SIMD double log2(double) noexcept;
KILN_SIMD double log10(double) noexcept;
KILN_SIMD double exp2(double) noexcept;
KILN_SIMD double exp(double) noexcept;
KILN_SIMD double log1p(double) noexcept;
KILN_SIMD double log(double) noexcept;
KILN_SIMD double erfc(double) noexcept;
KILN_SIMD double sin(double) noexcept;
KILN_SIMD double cos(double) noexcept;
KILN_SIMD double erf(double) noexcept;
KILN_SIMD double atan2(double, double) noexcept;
KILN_SIMD double hypot(double, double) noexcept;
}
#endif

namespace kiln::cpu {

#if KILN_HAVE_LIBMVEC
namespace {

// y[i] = f(x[i]) and y[i] = f(a[i], b[i]) over a contiguous run, as SIMD loops. std::tan(float) and
// the other overloads call tanf..., which the declarations above make SIMD functions.
#define KILN_MAP1(f)                                                    \
  do {                                                                  \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]); \
  } while (0)
#define KILN_MAP2(f)                                                          \
  do {                                                                        \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]); \
  } while (0)

// special::spherical_bessel_j0, sin(x) / x, as core/bessel_math.h's: in float64 for float32 too
// (through_double), 1 at 0 and 0 at +-inf. (A loop that converts float32 to float64 in it and selects
// does not vectorize: GCC 12 reports control flow.)
void spherical_bessel_j0(const double* x, double* y, int64_t n) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    const double v = x[i], r = std::sin(v) / v;
    y[i] = v == 0 ? 1.0 : std::abs(v) == kInf ? 0.0 : r;
  }
}

// special::entr, -x log x as math::unary's Entr (in T): 0 at 0, -inf left of it, NaN stays NaN.
template <typename T>
void entr(const T* x, T* y, int64_t n) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    const T v = x[i], r = -v * std::log(v);
    y[i] = v > T(0) ? r : (v == T(0) ? T(0) : (v != v ? v : -kInf));
  }
}

constexpr double kInverseSqrt2 = 0.70710678118654752440;

// special::ndtr, core/special_math.h's ndtr_f64 (in float64 for float32 too, through_double).
void ndtr(const double* x, double* y, int64_t n) {
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) y[i] = 0.5 * std::erfc(-x[i] * kInverseSqrt2);
}

// special::erfcx (Note [erfcx without overflow]) and special::log_ndtr as core/special_math.h's
// erfcx_f64 and log_ndtr_f64 compute them, in float64 for float32 too (through_double): both of
// erfcx's forms taken for every element and one kept. Left of 0 erfcx is 2 e^(x^2) - erfcx(|x|), +inf
// where e^(x^2) overflows (x < -26.6; set from -27 on, where the split square is inf - inf), as the
// scalar function's; NaN stays NaN through every form.
inline double erfcx_nonnegative(double ax, double square) {  // square: e^(ax^2), exp_of_square(ax)
  const double product = square * std::erfc(ax), asymptotic = math::erfcx_asymptotic(ax);
  return ax < 26 ? product : asymptotic;
}
void erfcx(const double* x, double* y, int64_t n) {
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    const double v = x[i], ax = std::abs(v), square = math::exp_of_square(ax);
    const double positive = erfcx_nonnegative(ax, square);
    const double left = v < -27 ? std::numeric_limits<double>::infinity() : 2 * square - positive;
    y[i] = v < 0 ? left : positive;
  }
}
// log_ndtr takes two loops: the form through erfcx for every element (at |x|, where each is defined),
// then the other where x >= -1. (In one loop GCC computes each side of the select for its lanes only,
// the other lanes' arguments zeroed, and a vector log of 0 hands each lane to the scalar function: 36
// ms for 2^22 float32 elements on two threads.)
void log_ndtr(const double* x, double* y, int64_t n) {
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    const double t = x[i] * kInverseSqrt2, at = std::abs(t);  // at = -t where x < -1
    y[i] = std::log(erfcx_nonnegative(at, math::exp_of_square(at)) / 2) - t * t;
  }
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    y[i] = x[i] < -1 ? y[i] : std::log1p(-std::erfc(x[i] * kInverseSqrt2) / 2);
  }
}

// f(in, out, m) over float64 copies of a float32 run (through_wider, cpu/widen.h), each result rounded once.
template <typename F>
void through_double(const float* x, float* y, int64_t n, const F& f) {
  constexpr int64_t kChunk = 256;
  through_wider<double, kChunk>(std::array<const float*, 1>{x}, y, n,
                                [&](const double (&in)[1][kChunk], double* out, int64_t m) {
                                  f(in[0], out, m);
                                  return true;
                                });
}

// erfinv and ndtri for a float32 result, in float64 (through_double): the start of Note [erfinv by an
// approximation and Newton steps] (both of Giles's polynomials taken, one kept) and its one Newton step
// on erf(x) = |y|, as erfinv_positive takes them where q = 1 - |y| >= 2^-24: every float32 y in
// (-1, 1), and ndtri's p from 2^-25 to 1 - 2^-25. The other elements (+-1, NaN, outside the domain,
// and ndtri's far tail, whose steps solve for log erfc) the scalar function then computes again.
template <bool kNdtri>
void inverse_erf_float32(const double* v, double* y, int64_t n) {
  constexpr double kSqrt2 = 1.41421356237309504880;
  auto complement = [](double u) { return kNdtri ? (u < 0.5 ? 2 * u : 2 * (1 - u)) : 1 - std::abs(u); };
  int outside = 0;
  _Pragma("omp simd reduction(|:outside)") for (int64_t i = 0; i < n; ++i) {
    const double u = v[i], q = complement(u), ay = 1 - q;
    const double w = -std::log(q * (2 - q));
    const double start = (w < 5 ? math::erfinv_start_central(w) : math::erfinv_start_tail(w)) * ay;
    const double x = start - math::erf_newton_delta(start, ay);
    y[i] = kNdtri ? (u < 0.5 ? -kSqrt2 * x : kSqrt2 * x) : std::copysign(x, u);
    outside |= !(q >= 0x1p-24);
  }
  if (!outside) return;
  for (int64_t i = 0; i < n; ++i) {
    if (!(complement(v[i]) >= 0x1p-24)) y[i] = kNdtri ? math::ndtri_f64(v[i], true) : math::erfinv_f64(v[i], true);
  }
}

// Chebyshev's T, U, V or W of degree n >= 16 by its closed form at |x| < 1, as core/polynomial_math.h's
// chebyshev_closed_form takes it (t = acos |x|, the sign and V's and W's mirror images for x < 0).
// Returns whether some x was not inside (+-1, beyond, NaN): its y is then not the polynomial's.
template <math::Polynomial F>
bool chebyshev_closed_form(const double* x, double* y, int64_t count, double n) {
  using math::Polynomial;
  const bool odd = std::fmod(n, 2.0) != 0;
  int outside = 0;
  _Pragma("omp simd reduction(|:outside)") for (int64_t i = 0; i < count; ++i) {
    const double v = x[i], t = std::acos(std::abs(v)), sign = (v < 0) & odd ? -1.0 : 1.0;
    double r;
    if constexpr (F == Polynomial::ChebyshevT) {
      r = std::cos(n * t);
    } else if constexpr (F == Polynomial::ChebyshevU) {
      r = std::sin((n + 1) * t) / std::sin(t);
    } else {  // V, or W: each the other's mirror image
      const double c = std::cos((n + 0.5) * t) / std::cos(0.5 * t), s = std::sin((n + 0.5) * t) / std::sin(0.5 * t);
      r = (F == Polynomial::ChebyshevV) == (v < 0) ? s : c;
    }
    y[i] = sign * r;
    outside |= !(std::abs(v) < 1);
  }
  return outside;
}

template <typename T>
bool unary_run(UnaryOp op, const T* x, T* y, int64_t n) {
  switch (op) {
    case UnaryOp::Erfinv:
    case UnaryOp::Ndtri:
      if constexpr (std::is_same_v<T, float>) {
        through_double(x, y, n, op == UnaryOp::Ndtri ? inverse_erf_float32<true> : inverse_erf_float32<false>);
        return true;
      }
      return false;  // float64: the scalar loop's two or three steps
    case UnaryOp::SphericalBesselJ0:
    case UnaryOp::Erfcx:
    case UnaryOp::LogNdtr:
    case UnaryOp::Ndtr: {
      const auto f = op == UnaryOp::Ndtr      ? ndtr
                     : op == UnaryOp::Erfcx   ? erfcx
                     : op == UnaryOp::LogNdtr ? log_ndtr
                                              : spherical_bessel_j0;
      if constexpr (std::is_same_v<T, float>) {
        through_double(x, y, n, f);
      } else {
        f(x, y, n);
      }
      return true;
    }
    case UnaryOp::Entr: entr(x, y, n); return true;
    case UnaryOp::Tan: KILN_MAP1(std::tan); return true;
    case UnaryOp::Asin: KILN_MAP1(std::asin); return true;
    case UnaryOp::Acos: KILN_MAP1(std::acos); return true;
    case UnaryOp::Atan: KILN_MAP1(std::atan); return true;
    case UnaryOp::Sinh: KILN_MAP1(std::sinh); return true;
    case UnaryOp::Cosh: KILN_MAP1(std::cosh); return true;
    case UnaryOp::Asinh: KILN_MAP1(std::asinh); return true;
    case UnaryOp::Acosh: KILN_MAP1(std::acosh); return true;
    case UnaryOp::Atanh: KILN_MAP1(std::atanh); return true;
    case UnaryOp::Log2: KILN_MAP1(std::log2); return true;
    case UnaryOp::Log10: KILN_MAP1(std::log10); return true;
    case UnaryOp::Exp2: KILN_MAP1(std::exp2); return true;
    case UnaryOp::Erfc: KILN_MAP1(std::erfc); return true;
    default: return false;
  }
}

// log(e^a + e^b) (base 2 with base2) as math::binary's LogAddExp: max + log1p(e^-|a - b|), a where a and
// b are the same infinity; a log b and a log1p(b) as its Xlogy and Xlog1py: NaN where b is NaN, else 0
// where a = 0. Selects, not branches, so that the loops vectorize.
template <typename T, bool base2>
void log_add_exp(const T* a, const T* b, T* y, int64_t n) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  constexpr T kLog2e = T(1.44269504088896340736);
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    const T u = a[i], v = b[i];
    const T m = u > v ? u : v, d = -std::abs(u - v);
    const T r = base2 ? m + std::log1p(std::exp2(d)) * kLog2e : m + std::log1p(std::exp(d));
    const bool same_infinity = (u == v) & (std::abs(u) == kInf);  // & not &&: no branch, so it vectorizes
    y[i] = same_infinity ? u : r;
  }
}
template <typename T, bool kLog1p>
void x_log(const T* a, const T* b, T* y, int64_t n) {
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    const T u = a[i], v = b[i], r = u * (kLog1p ? std::log1p(v) : std::log(v));
    y[i] = v != v ? v : (u == T(0) ? T(0) : r);
  }
}

template <typename T>
bool binary_run(BinaryOp op, const T* a, const T* b, T* y, int64_t n) {
  switch (op) {
    case BinaryOp::Atan2: KILN_MAP2(std::atan2); return true;
    case BinaryOp::Hypot: KILN_MAP2(std::hypot); return true;
    case BinaryOp::LogAddExp: log_add_exp<T, false>(a, b, y, n); return true;
    case BinaryOp::LogAddExp2: log_add_exp<T, true>(a, b, y, n); return true;
    case BinaryOp::Xlogy: x_log<T, false>(a, b, y, n); return true;
    case BinaryOp::Xlog1py: x_log<T, true>(a, b, y, n); return true;
    default: return false;
  }
}

}  // namespace

bool vector_unary(UnaryOp op, const float* x, float* y, int64_t n) { return unary_run(op, x, y, n); }
bool vector_unary(UnaryOp op, const double* x, double* y, int64_t n) { return unary_run(op, x, y, n); }
bool vector_binary(BinaryOp op, const float* a, const float* b, float* y, int64_t n) {
  return binary_run(op, a, b, y, n);
}
bool vector_binary(BinaryOp op, const double* a, const double* b, double* y, int64_t n) {
  return binary_run(op, a, b, y, n);
}
bool vector_chebyshev_closed_form(math::Polynomial family, const double* x, double* y, int64_t n, double degree) {
  using math::Polynomial;
  switch (family) {
    case Polynomial::ChebyshevT: return chebyshev_closed_form<Polynomial::ChebyshevT>(x, y, n, degree);
    case Polynomial::ChebyshevU: return chebyshev_closed_form<Polynomial::ChebyshevU>(x, y, n, degree);
    case Polynomial::ChebyshevV: return chebyshev_closed_form<Polynomial::ChebyshevV>(x, y, n, degree);
    default: return chebyshev_closed_form<Polynomial::ChebyshevW>(x, y, n, degree);
  }
}

#else  // no libmvec: the scalar loops compute these

bool vector_unary(UnaryOp, const float*, float*, int64_t) { return false; }
bool vector_unary(UnaryOp, const double*, double*, int64_t) { return false; }
bool vector_binary(BinaryOp, const float*, const float*, float*, int64_t) { return false; }
bool vector_binary(BinaryOp, const double*, const double*, double*, int64_t) { return false; }

#endif

// Through glibc's SIMD sin and cos where declared so above; their scalar forms otherwise.
void vector_sin_cos(const double* x, double* s, double* c, int64_t n) {
  _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {
    s[i] = std::sin(x[i]);
    c[i] = std::cos(x[i]);
  }
}

}  // namespace kiln::cpu

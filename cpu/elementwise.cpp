// cpu/elementwise.cpp: elementwise unary and binary ops (broadcasting already in the strides) and
// where(). The math is core/scalar_math.h's, shared with cuda/elementwise.cu; contiguous float32 and
// float64 runs of the transcendental unary ops take Eigen's vectorized (AVX-512 here) versions of the
// same functions (float16 and bfloat16 runs too, widened to float32 in chunks; the Bessel functions I,
// J, Y and K, lgamma, digamma, polygamma(1, x) and the orthogonal polynomials of one degree a block of
// elements at a time, cpu/vector_special.cpp), and the contiguous and scalar-broadcast runs of binary
// ops are plain loops the compiler vectorizes.
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/scalar_math.h"
#include "core/convert.h"
#include "cpu/exact_math.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"
#include "cpu/vector_math.h"
#include "cpu/widen.h"

namespace kiln::cpu {

// ======== unary ========

namespace {

// Note [GELU's Gaussian tail]: gelu(x) = x Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2 takes
// Eigen's vectorized erf, accurate where x >= -1 (1 + erf >= 0.31). Below -1 the sum cancels, so there
// Phi(x) = erfc(-x / sqrt 2) / 2, which Eigen 3.4 does not vectorize. For double the tail takes the
// scalar erfc of core/scalar_math.h. For float it is vectorized: erfc(z) = t exp(-z^2 + P(t)),
// t = 1 / (1 + z / 2), with P the degree-9 Chebyshev fit published in Numerical Recipes (erfcc:
// fractional error below 1.2e-7 for every z >= 0), evaluated in double so that float32 rounding adds
// nothing to it; the result is rounded to float once. Before it, the scalar erfcf was half of
// bias_gelu's profile when a quarter of the inputs were below -1 (docs/fusion.md).
constexpr int64_t kTailChunk = 256;
using TailArray = Eigen::Array<double, Eigen::Dynamic, 1, 0, kTailChunk, 1>;  // on the stack
using TailArrayF = Eigen::Array<float, Eigen::Dynamic, 1, 0, kTailChunk, 1>;

// Phi(x) for x <= -1 (and anything finite for other x, which the callers do not use).
TailArray normal_cdf_tail(const TailArray& x) {
  const TailArray z = (x * -0.70710678118654752440).max(0.0);
  const TailArray t = 1.0 / (1.0 + 0.5 * z);
  const TailArray p =
      -1.26551223 +
      t * (1.00002368 +
           t * (0.37409196 +
                t * (0.09678418 +
                     t * (-0.18628806 +
                          t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  return 0.5 * t * exact_exp(p - z.square());
}

// Overwrites y[i] where x[i] < -1 with the tail form of gelu (g == nullptr) or of g * gelu'(x).
// (Each Eigen expression below stays within one scalar type: a cast inside an expression makes Eigen
// evaluate the whole of it one element at a time.)
template <typename T>
void gelu_erf_tail(const T* g, const T* x, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i0 = 0; i0 < n; i0 += kTailChunk) {
      const int64_t len = std::min(kTailChunk, n - i0);
      Eigen::Map<const Eigen::ArrayXf> xs(x + i0, len);
      if (!(xs < -1.0f).any()) continue;
      const TailArray xd = xs.cast<double>();
      const TailArray phi = normal_cdf_tail(xd);
      TailArray v;
      if (g == nullptr) {
        v = xd * phi;
      } else {  // Phi(x) + x phi(x), times g
        const TailArray gd = Eigen::Map<const Eigen::ArrayXf>(g + i0, len).cast<double>();
        const TailArray density = exact_exp(-0.5 * xd.square());
        v = gd * (phi + 0.39894228040143267794 * xd * density);
      }
      const TailArrayF vf = v.cast<float>();
      Eigen::Map<Eigen::ArrayXf> ys(y + i0, len);
      ys = (xs < -1.0f).select(vf, ys);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] >= T(-1)) continue;
      y[i] = g == nullptr ? math::unary<T>(UnaryOp::GeluErf, x[i], 0, 0)
                          : math::binary<T>(BinaryOp::GeluErfBackward, g[i], x[i], T(1));
    }
  }
}

// Eigen's array expression for op on a contiguous run; false when there is none (scalar loop).
template <typename T>
bool unary_vectorized(UnaryOp op, const T* x, T* y, int64_t n, UnaryArgs args) {
  using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<const Arr> in(x, n);
  Eigen::Map<Arr> out(y, n);
  const T a = static_cast<T>(args.a), b = static_cast<T>(args.b);
  // Not here: sqrt and rsqrt. Eigen 3.4's AVX-512 sqrt goes through rsqrt and gives sqrt(inf) = nan,
  // and its rsqrt treats a subnormal x as 0 (rsqrt(1e-40f) = inf, rsqrt(-1e-40f) = -inf, not nan);
  // the scalar loop's std::sqrt is exact.
  switch (op) {
    case UnaryOp::Neg: out = -in; return true;
    case UnaryOp::Abs: out = in.abs(); return true;
    case UnaryOp::Exp: out = exact_exp(in); return true;  // Note [Eigen's exp below its range]
    case UnaryOp::Log: out = exact_log(in); return true;  // Note [Eigen's log of subnormals]
    case UnaryOp::Log1p: out = in.log1p(); return true;
    case UnaryOp::Expm1: out = exact_expm1(in); return true;  // Note [Eigen's exp near its top]
    case UnaryOp::Reciprocal: out = in.inverse(); return true;
    case UnaryOp::Sin: out = in.sin(); return true;
    case UnaryOp::Cos: out = in.cos(); return true;
    case UnaryOp::Tanh: out = in.tanh(); return true;
    // Not Eigen's logistic(), whose float32 form is off by up to 7e-4 relatively (sigmoid(-8.9)):
    // PyTorch's form, exact to a few ulp, and 0 at -inf.
    case UnaryOp::Sigmoid: out = (T(1) + exact_exp(-in)).inverse(); return true;
    case UnaryOp::Erf: out = in.erf(); return true;
    case UnaryOp::Square: out = in.square(); return true;
    case UnaryOp::GeluErf:  // See Note [GELU's Gaussian tail]
      out = T(0.5) * in * (T(1) + (in * T(0.70710678118654752440)).erf());
      gelu_erf_tail<T>(nullptr, x, y, n);
      return true;
    case UnaryOp::Silu: out = in / (T(1) + exact_exp(-in)); return true;  // -inf gives nan, as PyTorch
    case UnaryOp::Relu:  // NaN stays NaN, as in PyTorch
      out = (in != in).select(in, in.max(T(0)));
      return true;
    case UnaryOp::Clamp: out = (in != in).select(in, in.max(a).min(b)); return true;
    case UnaryOp::PowScalar:
      if (args.a == 2) { out = in.square(); return true; }
      if (args.a == 1) { out = in; return true; }
      return false;
    case UnaryOp::I0:
    case UnaryOp::I0e:
    case UnaryOp::I1:
    case UnaryOp::I1e:
    case UnaryOp::BesselJ0:
    case UnaryOp::BesselJ1:
    case UnaryOp::BesselY0:
    case UnaryOp::BesselY1:
    case UnaryOp::BesselK0:
    case UnaryOp::BesselK1:
    case UnaryOp::BesselK0e:
    case UnaryOp::BesselK1e:
    case UnaryOp::Lgamma:
    case UnaryOp::Digamma:
    case UnaryOp::Polygamma: return vector_special(op, x, y, n, args.a);  // cpu/vector_special.cpp
    default: return vector_unary(op, x, y, n);  // glibc's SIMD functions (cpu/vector_math.cpp), or false
  }
}

// Note [16-bit runs through float32]: float16 and bfloat16 compute in float anyway, so a contiguous
// run of them goes through float32 buffers of kHalfChunk elements and a float32 kernel, whose vector
// math (GELU's erf, exp, tanh) then serves them too; each result is the float32 one rounded once
// (through_wider, cpu/widen.h, whose f may decline an op it lacks).
constexpr int64_t kHalfChunk = 512;

template <typename T, size_t N, typename F>
int64_t through_float32(const std::array<const T*, N>& in, T* out, int64_t n, const F& f) {
  return through_wider<float, kHalfChunk>(in, out, n, f);
}

template <typename T>
void unary_typed(UnaryOp op, const StridedLoop<2>& loop, UnaryArgs args) {
  using M = opmath_t<T>;
  loop.parallel_run([op, args](char* const* p, const int64_t* s, int64_t n) {
    constexpr int64_t kSize = sizeof(T);
    int64_t start = 0;  // where the scalar loop begins
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (s[0] == kSize && s[1] == kSize &&
          unary_vectorized<T>(op, reinterpret_cast<const T*>(p[1]), reinterpret_cast<T*>(p[0]), n, args)) {
        return;
      }
    } else if constexpr (std::is_same_v<M, float>) {  // Note [16-bit runs through float32]
      if (s[0] == kSize && s[1] == kSize) {
        start = through_float32<T, 1>({reinterpret_cast<const T*>(p[1])}, reinterpret_cast<T*>(p[0]), n,
                                      [&](const float (&in)[1][kHalfChunk], float* out, int64_t m) {
                                        return unary_vectorized<float>(op, in[0], out, m, args);
                                      });
      }
    }
    // The scalar loop, with the op fixed at compile time for the floating ops that only it computes, so
    // that math::unary's switch folds away (it took as long as lgamma itself, 8 ns an element).
    auto run = [&]<UnaryOp kOp>() {
      for (int64_t i = start; i < n; ++i) {
        M x = static_cast<M>(at<T>(p[1], i * s[1]));
        at<T>(p[0], i * s[0]) = static_cast<T>(math::unary<M>(kOp, x, args.a, args.b));
      }
    };
    if constexpr (std::is_floating_point_v<M>) {
      switch (op) {
        case UnaryOp::Sqrt: return run.template operator()<UnaryOp::Sqrt>();
        case UnaryOp::Rsqrt: return run.template operator()<UnaryOp::Rsqrt>();
        case UnaryOp::Lgamma: return run.template operator()<UnaryOp::Lgamma>();
        case UnaryOp::Digamma: return run.template operator()<UnaryOp::Digamma>();
        case UnaryOp::Polygamma: return run.template operator()<UnaryOp::Polygamma>();
        case UnaryOp::Erfinv: return run.template operator()<UnaryOp::Erfinv>();
        case UnaryOp::I0: return run.template operator()<UnaryOp::I0>();
        case UnaryOp::I0e: return run.template operator()<UnaryOp::I0e>();
        case UnaryOp::I1: return run.template operator()<UnaryOp::I1>();
        case UnaryOp::I1e: return run.template operator()<UnaryOp::I1e>();
        case UnaryOp::Erfcx: return run.template operator()<UnaryOp::Erfcx>();
        case UnaryOp::Ndtri: return run.template operator()<UnaryOp::Ndtri>();
        case UnaryOp::LogNdtr: return run.template operator()<UnaryOp::LogNdtr>();
        case UnaryOp::BesselJ0: return run.template operator()<UnaryOp::BesselJ0>();
        case UnaryOp::BesselJ1: return run.template operator()<UnaryOp::BesselJ1>();
        case UnaryOp::BesselY0: return run.template operator()<UnaryOp::BesselY0>();
        case UnaryOp::BesselY1: return run.template operator()<UnaryOp::BesselY1>();
        case UnaryOp::BesselK0: return run.template operator()<UnaryOp::BesselK0>();
        case UnaryOp::BesselK1: return run.template operator()<UnaryOp::BesselK1>();
        case UnaryOp::BesselK0e: return run.template operator()<UnaryOp::BesselK0e>();
        case UnaryOp::BesselK1e: return run.template operator()<UnaryOp::BesselK1e>();
        case UnaryOp::AiryAi: return run.template operator()<UnaryOp::AiryAi>();
        default: break;
      }
    }
    for (int64_t i = start; i < n; ++i) {
      M x = static_cast<M>(at<T>(p[1], i * s[1]));
      at<T>(p[0], i * s[0]) = static_cast<T>(math::unary<M>(op, x, args.a, args.b));
    }
  });
}

}  // namespace

void unary_kernel(UnaryOp op, const View& in, const View& out, UnaryArgs args) {
  StridedLoop<2> loop({&out, &in});
  if (op == UnaryOp::LogicalNot) {  // any dtype in, bool out
    KILN_DISPATCH_ALL_TYPES(in.dtype, "logical_not", [&] {
      loop.parallel_run([](char* const* p, const int64_t* s, int64_t n) {
        for (int64_t i = 0; i < n; ++i) at<bool>(p[0], i * s[0]) = !convert<bool>(at<scalar_t>(p[1], i * s[1]));
      });
    });
    return;
  }
  KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "unary op", [&] { unary_typed<scalar_t>(op, loop, args); });
}

// ======== binary ========

namespace {

// out[i] = f(a[i], b[i]) over one run, with the three common stride patterns specialized.
template <typename T, typename R, typename F>
inline void binary_run(char* const* p, const int64_t* s, int64_t n, const F& f) {
  constexpr int64_t kT = sizeof(T), kR = sizeof(R);
  R* out = reinterpret_cast<R*>(p[0]);
  const T* a = reinterpret_cast<const T*>(p[1]);
  const T* b = reinterpret_cast<const T*>(p[2]);
  if (s[0] == kR && s[1] == kT && s[2] == kT) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  } else if (s[0] == kR && s[1] == kT && s[2] == 0) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], bv);
  } else if (s[0] == kR && s[1] == 0 && s[2] == kT) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) out[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) at<R>(p[0], i * s[0]) = f(at<T>(p[1], i * s[1]), at<T>(p[2], i * s[2]));
  }
}

// g * gelu'(x) over contiguous runs with Eigen's vectorized erf / tanh / exp (float, double). The erf
// form takes Phi(x) = (1 + erf(x / sqrt 2)) / 2 where that is accurate (x >= -1) and the tail form
// below, as the forward does (Note [GELU's Gaussian tail]).
template <typename T>
void gelu_backward_vectorized(BinaryOp op, const T* g, const T* x, T* y, int64_t n) {
  using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<const Arr> gv(g, n), xv(x, n);
  Eigen::Map<Arr> out(y, n);
  if (op == BinaryOp::GeluTanhBackward) {
    const T k = T(0.79788456080286535588), c = T(0.044715);
    const Arr t = (k * (xv + c * xv.cube())).tanh();
    out = gv * (T(0.5) * (T(1) + t) + T(0.5) * k * xv * (T(1) - t.square()) * (T(1) + T(3) * c * xv.square()));
    return;
  }
  out = gv * (T(0.5) * (T(1) + (xv * T(0.70710678118654752440)).erf()) +
              xv * exact_exp(T(-0.5) * xv.square()) * T(0.39894228040143267794));
  gelu_erf_tail<T>(g, x, y, n);
}

template <typename T>
void arithmetic(BinaryOp op, const StridedLoop<3>& loop, double alpha_d) {
  using M = opmath_t<T>;
  const M alpha = static_cast<M>(alpha_d);
  auto run = [&](auto f) {
    loop.parallel_run([&](char* const* p, const int64_t* s, int64_t n) { binary_run<T, T>(p, s, n, f); });
  };
  auto cvt = [](M v) { return static_cast<T>(v); };
  if constexpr (std::is_integral_v<M> && std::is_signed_v<M>) {  // they wrap (math::wrap_add in scalar_math.h)
    switch (op) {
      case BinaryOp::Add: return run([&](T x, T y) { return cvt(math::wrap_add(M(x), math::wrap_mul(alpha, M(y)))); });
      case BinaryOp::Sub: return run([&](T x, T y) { return cvt(math::wrap_sub(M(x), math::wrap_mul(alpha, M(y)))); });
      case BinaryOp::Mul: return run([&](T x, T y) { return cvt(math::wrap_mul(M(x), M(y))); });
      default: break;
    }
  }
  // The orthogonal polynomials' values (alpha, the derivative's order, 0) of a contiguous x with one
  // degree, a block at a time (Note [the orthogonal polynomials a block at a time]).
  if (math::is_polynomial(op)) {
    return loop.parallel_run([&](char* const* p, const int64_t* s, int64_t n) {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        const T* a = reinterpret_cast<const T*>(p[1]);
        if (alpha == M(0) && s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == 0 &&
            vector_polynomial(op, a, reinterpret_cast<T*>(p[0]), n, double(*reinterpret_cast<const T*>(p[2])))) {
          return;
        }
      }
      binary_run<T, T>(p, s, n, [&](T x, T z) { return cvt(math::binary<M>(op, M(x), M(z), alpha)); });
    });
  }
  // The hot ops get their own loops so the compiler sees straight-line arithmetic.
  switch (op) {
    case BinaryOp::Add:
      if (alpha == M(1)) return run([&](T x, T y) { return cvt(M(x) + M(y)); });
      return run([&](T x, T y) { return cvt(M(x) + alpha * M(y)); });
    case BinaryOp::Sub:
      if (alpha == M(1)) return run([&](T x, T y) { return cvt(M(x) - M(y)); });
      return run([&](T x, T y) { return cvt(M(x) - alpha * M(y)); });
    case BinaryOp::Mul: return run([&](T x, T y) { return cvt(M(x) * M(y)); });
    case BinaryOp::Div: return run([&](T x, T y) { return cvt(M(x) / M(y)); });
    case BinaryOp::ReluBackward: return run([&](T x, T y) { return M(y) <= M(0) ? T(0) : x; });  // scalar_math.h
    case BinaryOp::GeluErfBackward:
    case BinaryOp::GeluTanhBackward:
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        return loop.parallel_run([&](char* const* p, const int64_t* s, int64_t n) {
          if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
            gelu_backward_vectorized<T>(op, reinterpret_cast<const T*>(p[1]), reinterpret_cast<const T*>(p[2]),
                                        reinterpret_cast<T*>(p[0]), n);
          } else {
            binary_run<T, T>(p, s, n, [&](T x, T y) { return math::binary<T>(op, x, y, T(1)); });
          }
        });
      } else if constexpr (std::is_same_v<M, float>) {  // Note [16-bit runs through float32]
        return loop.parallel_run([&](char* const* p, const int64_t* s, int64_t n) {
          if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
            through_float32<T, 2>({reinterpret_cast<const T*>(p[1]), reinterpret_cast<const T*>(p[2])},
                                  reinterpret_cast<T*>(p[0]), n,
                                  [&](const float (&in)[2][kHalfChunk], float* out, int64_t m) {
                                    gelu_backward_vectorized<float>(op, in[0], in[1], out, m);
                                    return true;
                                  });
          } else {
            binary_run<T, T>(p, s, n, [&](T x, T y) { return cvt(math::binary<M>(op, M(x), M(y), M(1))); });
          }
        });
      }
      [[fallthrough]];
    default: return run([&](T x, T y) { return cvt(math::binary<M>(op, M(x), M(y), alpha)); });
    // glibc's SIMD functions over contiguous runs (cpu/vector_math.cpp), float16 and bfloat16 through
    // float32; other runs, and builds without them, take math::binary one element at a time.
    case BinaryOp::Atan2:
    case BinaryOp::Hypot:
    case BinaryOp::LogAddExp:
    case BinaryOp::LogAddExp2:
    case BinaryOp::Xlogy:
    case BinaryOp::Xlog1py:
      return loop.parallel_run([&](char* const* p, const int64_t* s, int64_t n) {
        const bool contiguous = s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T);
        const T* a = reinterpret_cast<const T*>(p[1]);
        const T* b = reinterpret_cast<const T*>(p[2]);
        T* y = reinterpret_cast<T*>(p[0]);
        int64_t start = 0;  // where the scalar loop begins
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          if (contiguous && vector_binary(op, a, b, y, n)) return;
        } else if constexpr (std::is_same_v<M, float>) {  // Note [16-bit runs through float32]
          if (contiguous) {
            start = through_float32<T, 2>({a, b}, y, n, [&](const float (&in)[2][kHalfChunk], float* out, int64_t m) {
              return vector_binary(op, in[0], in[1], out, m);
            });
          }
        }
        if (start == 0) {
          return binary_run<T, T>(p, s, n, [&](T x, T z) { return cvt(math::binary<M>(op, M(x), M(z), alpha)); });
        }
        for (int64_t i = start; i < n; ++i) y[i] = cvt(math::binary<M>(op, M(a[i]), M(b[i]), alpha));
      });
  }
}

}  // namespace

template <typename T>
void gelu_run(const T* x, T* y, int64_t n, bool tanh) {
  const UnaryOp op = tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf;
  if (unary_vectorized<T>(op, x, y, n, {})) return;
  for (int64_t i = 0; i < n; ++i) y[i] = math::unary<T>(op, x[i], 0, 0);
}

template <typename T>
void gelu_backward_run(const T* g, const T* x, T* y, int64_t n, bool tanh) {
  gelu_backward_vectorized<T>(tanh ? BinaryOp::GeluTanhBackward : BinaryOp::GeluErfBackward, g, x, y, n);
}

template void gelu_run<float>(const float*, float*, int64_t, bool);
template void gelu_run<double>(const double*, double*, int64_t, bool);
template void gelu_backward_run<float>(const float*, const float*, float*, int64_t, bool);
template void gelu_backward_run<double>(const double*, const double*, double*, int64_t, bool);

void binary_kernel(BinaryOp op, const View& a, const View& b, const View& out, double alpha) {
  StridedLoop<3> loop({&out, &a, &b});
  if (is_comparison(op)) {
    KILN_DISPATCH_ALL_TYPES(a.dtype, "comparison", [&] {
      using M = opmath_t<scalar_t>;
      loop.parallel_run([op](char* const* p, const int64_t* s, int64_t n) {
        binary_run<scalar_t, bool>(p, s, n, [op](scalar_t x, scalar_t y) {
          return math::compare<M>(op, static_cast<M>(x), static_cast<M>(y));
        });
      });
    });
    return;
  }
  KILN_DISPATCH_NUMERIC_TYPES(a.dtype, "binary op", [&] { arithmetic<scalar_t>(op, loop, alpha); });
}

void where_kernel(const View& cond, const View& a, const View& b, const View& out) {
  StridedLoop<4> loop({&out, &cond, &a, &b});
  KILN_DISPATCH_ALL_TYPES(out.dtype, "where", [&] {
    loop.parallel_run([](char* const* p, const int64_t* s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        at<scalar_t>(p[0], i * s[0]) =
            at<bool>(p[1], i * s[1]) ? at<scalar_t>(p[2], i * s[2]) : at<scalar_t>(p[3], i * s[3]);
      }
    });
  });
}

// out = op(a, b, c, v) (out may be a). Each op gets its own loop, so the switch of math::ternary
// folds away and a contiguous run is straight-line arithmetic the compiler vectorizes.
void ternary_kernel(TernaryOp op, const View& a, const View& b, const View& c, const View& out, double v) {
  StridedLoop<4> loop({&out, &a, &b, &c});
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "ternary op", [&] {
    using T = scalar_t;
    using M = opmath_t<T>;
    const M vm = static_cast<M>(v);
    auto run = [&]<TernaryOp kOp>() {
      loop.parallel_run([vm](char* const* p, const int64_t* s, int64_t n) {
        auto f = [vm](T x, T y, T z) { return static_cast<T>(math::ternary<M>(kOp, M(x), M(y), M(z), vm)); };
        constexpr int64_t kT = sizeof(T);
        if (s[0] == kT && s[1] == kT && s[2] == kT && s[3] == kT) {
          T* o = reinterpret_cast<T*>(p[0]);
          const T* x = reinterpret_cast<const T*>(p[1]);
          const T* y = reinterpret_cast<const T*>(p[2]);
          const T* z = reinterpret_cast<const T*>(p[3]);
          for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i], z[i]);
        } else if (s[0] == kT && s[1] == kT && s[2] == kT && s[3] == 0) {
          // the third operand constant along the run: a lerp weight or addcmul factor per row (as the
          // linear modes of interpolate weigh the rows of a dim other than the last)
          T* o = reinterpret_cast<T*>(p[0]);
          const T* x = reinterpret_cast<const T*>(p[1]);
          const T* y = reinterpret_cast<const T*>(p[2]);
          const T z = *reinterpret_cast<const T*>(p[3]);
          for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i], z);
        } else {
          for (int64_t i = 0; i < n; ++i) {
            at<T>(p[0], i * s[0]) = f(at<T>(p[1], i * s[1]), at<T>(p[2], i * s[2]), at<T>(p[3], i * s[3]));
          }
        }
      });
    };
    switch (op) {
      case TernaryOp::Addcmul: return run.template operator()<TernaryOp::Addcmul>();
      case TernaryOp::Addcdiv: return run.template operator()<TernaryOp::Addcdiv>();
      case TernaryOp::Lerp: return run.template operator()<TernaryOp::Lerp>();
      case TernaryOp::LerpScalar: return run.template operator()<TernaryOp::LerpScalar>();
    }
  });
}

}  // namespace kiln::cpu

// cpu/unary.cpp: elementwise unary ops. The math is core/scalar_math.h's; contiguous float32 and
// float64 runs take Eigen's vectorized (AVX-512 here) versions of the same functions.
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>
#include <limits>

#include "core/scalar_math.h"
#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {
namespace {

// Eigen's array expression for op on a contiguous run; false when there is none (scalar loop).
template <typename T>
bool unary_vectorized(UnaryOp op, const T* x, T* y, int64_t n, UnaryArgs args) {
  using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<const Arr> in(x, n);
  Eigen::Map<Arr> out(y, n);
  const T a = static_cast<T>(args.a), b = static_cast<T>(args.b);
  switch (op) {
    case UnaryOp::Neg: out = -in; return true;
    case UnaryOp::Abs: out = in.abs(); return true;
    case UnaryOp::Exp: out = in.exp(); return true;
    case UnaryOp::Log: out = in.log(); return true;
    case UnaryOp::Log1p: out = in.log1p(); return true;
    case UnaryOp::Expm1: out = in.expm1(); return true;
    case UnaryOp::Sqrt: out = in.sqrt(); return true;
    case UnaryOp::Rsqrt: out = in.rsqrt(); return true;
    case UnaryOp::Reciprocal: out = in.inverse(); return true;
    case UnaryOp::Sin: out = in.sin(); return true;
    case UnaryOp::Cos: out = in.cos(); return true;
    case UnaryOp::Tanh: out = in.tanh(); return true;
    case UnaryOp::Sigmoid: out = in.logistic(); return true;
    case UnaryOp::Erf: out = in.erf(); return true;
    case UnaryOp::Square: out = in.square(); return true;
    case UnaryOp::GeluErf: out = T(0.5) * in * (T(1) + (in * T(0.70710678118654752440)).erf()); return true;
    case UnaryOp::Silu: out = in * in.logistic(); return true;
    case UnaryOp::Relu:  // NaN stays NaN, as in PyTorch
      out = (in != in).select(in, in.max(T(0)));
      return true;
    case UnaryOp::Clamp: out = (in != in).select(in, in.max(a).min(b)); return true;
    case UnaryOp::PowScalar:
      if (args.a == 2) { out = in.square(); return true; }
      if (args.a == 0.5) { out = in.sqrt(); return true; }
      if (args.a == 1) { out = in; return true; }
      return false;
    default: return false;
  }
}

template <typename T>
void unary_typed(UnaryOp op, const StridedLoop<2>& loop, UnaryArgs args) {
  using M = opmath_t<T>;
  loop.parallel_run([op, args](char* const* p, const int64_t* s, int64_t n) {
    constexpr int64_t kSize = sizeof(T);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (s[0] == kSize && s[1] == kSize &&
          unary_vectorized<T>(op, reinterpret_cast<const T*>(p[1]), reinterpret_cast<T*>(p[0]), n, args)) {
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
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
  if (op == UnaryOp::Clamp) {  // "no bound" is +-infinity
    if (std::isnan(args.a)) args.a = -std::numeric_limits<double>::infinity();
    if (std::isnan(args.b)) args.b = std::numeric_limits<double>::infinity();
  }
  KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "unary op", [&] { unary_typed<scalar_t>(op, loop, args); });
}

}  // namespace kiln::cpu

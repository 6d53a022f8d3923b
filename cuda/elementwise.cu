// cuda/elementwise.cu: the elementwise kernels of the CUDA backend: copy with dtype conversion (on
// one device), fill, arange, random draws, unary and binary ops, where. CPU siblings: cpu/copy.cpp,
// cpu/random.cpp, cpu/unary.cpp, cpu/binary.cpp. The math is core/scalar_math.h's (shared with the
// CPU), computed in opmath_t; strided and broadcast (stride 0) views go through OffsetCalc
// (cuda/loops.cuh). One kernel per output dtype: the op and, for copies, the source dtype are
// runtime values every thread shares, which keeps the instantiations (and the build) small.
// Siblings: backend.cu (the Backend class, matmul), copy.cpp (host<->device copies), reduce.cu,
// index.cu.
#include <cmath>
#include <limits>

#include "core/philox.h"
#include "core/scalar_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {

// ---- kernels ----
// Every kernel here is elementwise_kernel (cuda/loops.cuh) with a per-element lambda below.

namespace {

// Note [random element mapping] (core/generator.h), element i: the same arithmetic as
// cpu/random.cpp, in double, so a seed gives the same tensor on both devices.
template <typename T>
__device__ inline double random_value(RandomKind kind, uint64_t seed, uint64_t offset, uint64_t i,
                                      double a, double b) {
  uint32_t w0, w1;
  Philox4x32::element_words(seed, offset, i, w0, w1);
  switch (kind) {
    case RandomKind::Uniform: {
      double u;
      if constexpr (std::is_same_v<T, double>) {
        u = static_cast<double>((static_cast<uint64_t>(w0) << 21) ^ (w1 >> 11)) * 0x1.0p-53;
      } else {
        u = static_cast<double>(w0 >> 8) * 0x1.0p-24;
      }
      return a + (b - a) * u;
    }
    case RandomKind::Normal: {
      double u1 = static_cast<double>((w0 >> 8) + 1) * 0x1.0p-24;
      double u2 = static_cast<double>(w1 >> 8) * 0x1.0p-24;
      return a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }
    case RandomKind::Randint: {
      uint64_t word = (static_cast<uint64_t>(w0) << 32) | w1;
      auto range = static_cast<uint64_t>(b - a);
      return a + static_cast<double>(word % range);
    }
    case RandomKind::Bernoulli:
      return (static_cast<double>(w0 >> 8) * 0x1.0p-24) < a ? 1 : 0;
  }
  return 0;
}

// A drawn value rounded to the output dtype, as cpu/random.cpp stores it.
template <typename T>
__device__ inline T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else {
    return static_cast<T>(static_cast<opmath_t<T>>(v));
  }
}

}  // namespace

// ---- launchers ----

void copy_on_device(const View& src, const View& dst, const Stream& s) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<2>({&dst, &src});
  const void* x = src.data;
  const DType src_dtype = src.dtype;
  KILN_DISPATCH_ALL_TYPES(dst.dtype, "copy", [&] {
    scalar_t* y = dst.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = load_as<scalar_t>(x, o[1], src_dtype);
    });
  });
}

void fill_launch(const View& out, const Scalar& value, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<1>({&out});
  KILN_DISPATCH_ALL_TYPES(out.dtype, "fill", [&] {
    const scalar_t v = value.to<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s),
                       [=] __device__(int64_t, const int64_t* o) { y[o[0]] = v; });
  });
}

void arange_launch(const View& out, double start, double step, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<1>({&out});
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype, "arange", [&] {
    using M = opmath_t<scalar_t>;
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t i, const int64_t* o) {
      y[o[0]] = static_cast<scalar_t>(static_cast<M>(start + static_cast<double>(i) * step));
    });
  });
}

void random_launch(RandomKind kind, const View& out, uint64_t seed, uint64_t offset, double a,
                   double b, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KILN_CHECK(kind != RandomKind::Randint || b > a,
             "randint: the range [{}, {}) is empty; high must be greater than low", a, b);
  // Element i is the i-th in row-major order of out, whatever out's strides.
  const auto calc = make_offset_calc<1>({&out});
  KILN_DISPATCH_ALL_TYPES(out.dtype, "random", [&] {
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t i, const int64_t* o) {
      y[o[0]] = from_double<scalar_t>(
          random_value<scalar_t>(kind, seed, offset, static_cast<uint64_t>(i), a, b));
    });
  });
}

void unary_launch(UnaryOp op, const View& in, const View& out, UnaryArgs args, const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<2>({&out, &in});
  if (op == UnaryOp::LogicalNot) {  // any dtype in, bool out
    KILN_DISPATCH_ALL_TYPES(in.dtype, "logical_not", [&] {
      const scalar_t* x = in.ptr<scalar_t>();
      bool* y = out.ptr<bool>();
      launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
        y[o[0]] = !convert<bool>(x[o[1]]);
      });
    });
    return;
  }
  if (op == UnaryOp::Clamp) {  // "no bound" is +-infinity
    if (std::isnan(args.a)) args.a = -std::numeric_limits<double>::infinity();
    if (std::isnan(args.b)) args.b = std::numeric_limits<double>::infinity();
  }
  const double a = args.a, b = args.b;
  KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "unary op", [&] {
    using M = opmath_t<scalar_t>;
    const scalar_t* x = in.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = static_cast<scalar_t>(math::unary<M>(op, static_cast<M>(x[o[1]]), a, b));
    });
  });
}

void binary_launch(BinaryOp op, const View& a, const View& b, const View& out, double alpha,
                   const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto calc = make_offset_calc<3>({&out, &a, &b});
  if (is_comparison(op)) {  // any dtype in, bool out
    KILN_DISPATCH_ALL_TYPES(a.dtype, "comparison", [&] {
      using M = opmath_t<scalar_t>;
      const scalar_t* x = a.ptr<scalar_t>();
      const scalar_t* z = b.ptr<scalar_t>();
      bool* y = out.ptr<bool>();
      launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
        y[o[0]] = math::compare<M>(op, static_cast<M>(x[o[1]]), static_cast<M>(z[o[2]]));
      });
    });
    return;
  }
  KILN_DISPATCH_NUMERIC_TYPES(a.dtype, "binary op", [&] {
    using M = opmath_t<scalar_t>;
    const M alpha_m = static_cast<M>(alpha);
    const scalar_t* x = a.ptr<scalar_t>();
    const scalar_t* z = b.ptr<scalar_t>();
    scalar_t* y = out.ptr<scalar_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = static_cast<scalar_t>(
          math::binary<M>(op, static_cast<M>(x[o[1]]), static_cast<M>(z[o[2]]), alpha_m));
    });
  });
}

void where_launch(const View& cond, const View& a, const View& b, const View& out,
                  const Stream& s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KILN_CHECK(cond.dtype == kBool, "where: the condition must be bool, got {}",
             dtype_name(cond.dtype));
  const auto calc = make_offset_calc<4>({&out, &cond, &a, &b});
  const bool* c = cond.ptr<bool>();
  // where only moves elements: dispatch on the element size.
  KILN_DISPATCH_BY_SIZE(out.dtype, "where", [&] {
    const bits_t* x = a.ptr<bits_t>();
    const bits_t* z = b.ptr<bits_t>();
    bits_t* y = out.ptr<bits_t>();
    launch_elementwise(n, calc, stream_of(s), [=] __device__(int64_t, const int64_t* o) {
      y[o[0]] = c[o[1]] ? x[o[2]] : z[o[3]];
    });
  });
}

}  // namespace kiln::cuda

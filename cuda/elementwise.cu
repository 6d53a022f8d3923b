// cuda/elementwise.cu: the elementwise kernels of the CUDA backend: unary and binary ops, where.
// CPU sibling: cpu/elementwise.cpp. The math is core/scalar_math.h's (shared with the CPU),
// computed in opmath_t; strided and broadcast (stride 0) views go through OffsetCalc
// (cuda/loops.cuh). One kernel per output dtype: the op is a runtime value every thread shares,
// which keeps the instantiations (and the build) small.
#include <cmath>
#include <limits>

#include "core/scalar_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {

// ---- launchers ----
// Every kernel here is elementwise_kernel (cuda/loops.cuh) with a per-element lambda below.

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

// ops/host_linalg.h: what the linear-algebra ops that compute on the host share (ops/solve.cpp,
// ops/decompose.cpp, ops/lu.cpp, ops/svd.cpp): a one-pass host copy of a tensor to factor in place, a
// batch's shape, and PyTorch's checks of a batch of (square) matrices. Private to ops/.
#pragma once

#include <span>

#include "ops/ops.h"

namespace kiln::host_linalg {

// A contiguous copy of t on the host, made in one pass whatever t's strides and device (the kernels
// work on it in place); no gradient is recorded through it.
inline Tensor host_copy(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor c = empty(t.sizes(), TensorOptions(t.dtype()));
  c.copy_(t);
  return c;
}

// t's sizes without their last `drop` dims (a batch's shape).
inline Shape leading(const Tensor& t, int drop) {
  return Shape(std::span<const int64_t>(t.sizes().begin(), t.sizes().end() - drop));
}

// PyTorch's checks of a batch of matrices: at least 2-D, float32 or float64; `what` names it ("A", "B").
inline void check_float_matrices(const Tensor& t, const char* what, const char* op) {
  KILN_CHECK(t.dim() >= 2, "{}: {} must have at least 2 dimensions (a batch of matrices), got shape {}", op, what,
             t.sizes().str());
  KILN_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64,
             "{}: {} must be float32 or float64 (PyTorch's CPU kernels take no 16-bit or integer ones), got {}; "
             "convert with .to(kFloat32)",
             op, what, dtype_name(t.dtype()));
}

// PyTorch's checks of A: floating (float32 or float64 here), at least 2-D, square.
inline void check_square(const Tensor& a, const char* op) {
  KILN_CHECK(a.dim() >= 2, "{}: A must have at least 2 dimensions (a batch of square matrices), got shape {}", op,
             a.sizes().str());
  KILN_CHECK(a.size(-1) == a.size(-2), "{}: A must be a batch of square matrices, but they are {} by {}", op,
             a.size(-2), a.size(-1));
  KILN_CHECK(a.dtype() == kFloat32 || a.dtype() == kFloat64,
             "{}: takes float32 or float64 matrices (PyTorch's CPU kernels take no 16-bit or integer ones), got {}; "
             "convert with .to(kFloat32)",
             op, dtype_name(a.dtype()));
}

}  // namespace kiln::host_linalg

// ops/linalg.cpp: matmul with PyTorch's rank rules, and mm/bmm. One kernel entry does the work:
// c[..., M, N] = a[..., M, K] @ b[..., K, N] with batch dims already broadcast (stride 0), so a
// transposed or expanded operand is never copied here.
#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using autograd::TensorList;

namespace {

std::string paren(const Shape& s) {  // (4, 3), the way the error messages write shapes
  std::string r = s.str();
  r.front() = '(';
  r.back() = ')';
  return r;
}

// Both operands have >= 2 dims.
Tensor matmul_nd(const Tensor& a, const Tensor& b, const Shape& shape_a, const Shape& shape_b) {
  const int na = a.dim(), nb = b.dim();
  const int64_t M = a.sizes()[na - 2], K = a.sizes()[na - 1], K2 = b.sizes()[nb - 2], N = b.sizes()[nb - 1];
  if (K != K2) {
    bool plain = shape_a.size() == 2 && shape_b.size() == 2;
    KILN_FAIL("matmul: shapes {} and {} cannot be multiplied: dim {} of the first ({}) must equal dim {} of "
              "the second ({})",
              paren(shape_a), paren(shape_b), plain ? "1" : "-1", K, plain ? "0" : "-2", K2);
  }
  Shape batch = broadcast_shapes(Shape(std::span<const int64_t>(a.sizes().data(), na - 2)),
                                 Shape(std::span<const int64_t>(b.sizes().data(), nb - 2)), "matmul");
  Shape sa = batch, sb = batch, sc = batch;
  sa.push_back(M), sa.push_back(K);
  sb.push_back(K), sb.push_back(N);
  sc.push_back(M), sc.push_back(N);
  Tensor out = empty_tensor(sc, a.dtype(), a.device());
  backend_for(a.device()).matmul(broadcast_view(a, sa), broadcast_view(b, sb), view_of(out), stream_for(a.device()));
  if (should_record(a, b)) {
    record("MatmulBackward", {a, b}, {out},
           [sa_ = SavedTensor(b.requires_grad() ? a : Tensor(), false),
            sb_ = SavedTensor(a.requires_grad() ? b : Tensor(), false), shape_a = a.sizes(),
            shape_b = b.sizes()](const Grads& g) -> TensorList {
             Tensor ga, gb;
             if (g.needs_grad(0)) ga = sum_to(matmul(g[0], sb_.unpack("MatmulBackward").mT()), shape_a);  // dA = dC B^T
             if (g.needs_grad(1)) gb = sum_to(matmul(sa_.unpack("MatmulBackward").mT(), g[0]), shape_b);  // dB = A^T dC
             return {ga, gb};
           });
  }
  return out;
}

}  // namespace

inline namespace ops {

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (autocast::is_enabled(a.device().type)) {  // See Note [autocast] in ops/autocast.h
    if (autocast::OpScope ac{autocast::Op::Matmul, a.device()}) return matmul(ac.cast(a), ac.cast(b));
  }
  check_same_device("matmul", a, b);
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1,
             "matmul: both arguments need at least 1 dimension, got shapes {} and {}", a.sizes().str(),
             b.sizes().str());
  KILN_CHECK(a.dtype() == b.dtype(), "matmul: both arguments must have the same dtype, got {} and {}",
             dtype_name(a.dtype()), dtype_name(b.dtype()));
  KILN_CHECK(a.dtype() != kBool, "matmul: not defined for bool tensors");
  if (a.dim() == 1 && b.dim() == 1) {
    KILN_CHECK(a.numel() == b.numel(), "matmul: 1-D vectors of sizes {} and {} cannot be multiplied (dot)",
               a.numel(), b.numel());
    return matmul_nd(a.unsqueeze(0), b.unsqueeze(1), a.sizes(), b.sizes()).reshape({});
  }
  if (a.dim() == 1) return matmul_nd(a.unsqueeze(0), b, a.sizes(), b.sizes()).squeeze(-2);
  if (b.dim() == 1) return matmul_nd(a, b.unsqueeze(-1), a.sizes(), b.sizes()).squeeze(-1);
  return matmul_nd(a, b, a.sizes(), b.sizes());
}

Tensor mm(const Tensor& a, const Tensor& b) {
  if (autocast::is_enabled(a.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Mm, a.device()}) return mm(ac.cast(a), ac.cast(b));
  }
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expects 2-D matrices, got shapes {} and {}; use matmul",
             a.sizes().str(), b.sizes().str());
  return matmul(a, b);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (autocast::is_enabled(a.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Bmm, a.device()}) return bmm(ac.cast(a), ac.cast(b));
  }
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expects 3-D batches, got shapes {} and {}; use matmul",
             a.sizes().str(), b.sizes().str());
  KILN_CHECK(a.sizes()[0] == b.sizes()[0], "bmm: batch sizes {} and {} differ", a.sizes()[0], b.sizes()[0]);
  return matmul(a, b);
}

}  // namespace ops
}  // namespace kiln

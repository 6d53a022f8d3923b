// ops/linalg.cpp: matmul with PyTorch's rank rules, mm/bmm, addmm (bias + a @ b, the bias possibly
// in the GEMM's epilogue: Backend::matmul_bias) and addmm_gelu (gelu(bias + a @ b), bias and GELU
// possibly in the epilogue: Backend::matmul_bias_gelu). One kernel entry does the rest of the work:
// c[..., M, N] = a[..., M, K] @ b[..., K, N] with batch dims already broadcast (stride 0), so a
// transposed or expanded operand is never copied here.
#include "core/grad_mode.h"
#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/flops.h"
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
  flops::Op count(batch.numel() * M * K * N, 0);
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

// Whether a's dims but the last merge into one without a copy (a.reshape({-1, K}) is a view).
bool leading_dims_fold(const Tensor& a) {
  int64_t outer_stride = -1;  // the stride the next outer dim of size > 1 must have
  for (int d = a.dim() - 2; d >= 0; --d) {
    const int64_t size = a.sizes()[d];
    if (size == 1) continue;
    if (outer_stride != -1 && a.strides()[d] != outer_stride) return false;
    outer_stride = a.strides()[d] * size;
  }
  return true;
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
  if (a.dim() >= 3 && b.dim() <= 2 && a.numel() > 0 && leading_dims_fold(a)) {
    // (..., M, K) @ (K, N) as one (rows, K) @ (K, N) GEMM, as PyTorch folds it: b's gradient is then
    // one GEMM over all the rows, where the batched form would write a (K, N) product per batch
    // element and sum them (for GPT-2's tied head, 16 products of 768 x 50304).
    Shape out_shape(std::span<const int64_t>(a.sizes().data(), a.dim() - 1));
    const Tensor rows = a.reshape({-1, a.size(-1)});
    if (b.dim() == 1) return matmul_nd(rows, b.unsqueeze(-1), a.sizes(), b.sizes()).view(out_shape);
    out_shape.push_back(b.size(1));
    return matmul_nd(rows, b, a.sizes(), b.sizes()).view(out_shape);
  }
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

// The checks of addmm and addmm_out, under `op`'s name.
static void check_addmm(const char* op, const Tensor& bias, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "{}: expects 2-D matrices, got shapes {} and {}; use matmul", op,
             a.sizes().str(), b.sizes().str());
  KILN_CHECK(a.size(1) == b.size(0),
             "{}: shapes {} and {} cannot be multiplied: dim 1 of the first ({}) must equal dim 0 of the second ({})",
             op, paren(a.sizes()), paren(b.sizes()), a.size(1), b.size(0));
  check_same_device(op, a, b);
  check_same_device(op, bias, a);
  KILN_CHECK(a.dtype() == b.dtype() && bias.dtype() == a.dtype(),
             "{}: expects one dtype, got {} (bias), {} and {}; convert with .to(dtype)", op, dtype_name(bias.dtype()),
             dtype_name(a.dtype()), dtype_name(b.dtype()));
  const Shape shape{a.size(0), b.size(1)};
  KILN_CHECK(broadcast_shapes(bias.sizes(), shape, op) == shape,
             "{}: the bias of shape {} cannot be broadcast to the product's shape {}", op, bias.sizes().str(),
             shape.str());
}

// out = bias + a @ b for checked operands, recording nothing: the bias in the GEMM's epilogue where the
// backend can (Backend::matmul_bias), else matmul and add_.
static void addmm_into(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) {
  flops::Op count(a.size(0) * a.size(1) * b.size(1), out.numel());  // the product, and the bias's add
  Backend& backend = backend_for(a.device());
  const Stream s = stream_for(a.device());
  if (bias.dim() == 1 && bias.size(0) == out.size(1)) {  // what a backend may fuse
    const Tensor bc = bias.contiguous();
    if (backend.matmul_bias(view_of(a), view_of(b), view_of(bc), view_of(out), s)) {
      out.bump_version();
      return;
    }
  }
  backend.matmul(view_of(a), view_of(b), view_of(out), s);
  NoGradGuard no_grad;
  Tensor target = out;
  target.add_(bias);  // bumps the version
}

// The gradients of bias + a @ b, given the gradient dC of that sum, for those inputs that need one:
// bias's (dC summed to its shape), a's (dC B^T) and b's (A^T dC). sa and sb hold a and b where the
// other's gradient needs them. For AddmmBackward and AddmmGeluBackward.
static TensorList addmm_grads(const Grads& g, const Tensor& dc, const Shape& bias_shape, const SavedTensor& sa,
                              const SavedTensor& sb, const char* name) {
  TensorList r(3);
  if (g.needs_grad(0)) r[0] = dc.sizes() == bias_shape ? dc : sum_to(dc, bias_shape);
  if (g.needs_grad(1)) r[1] = matmul(dc, sb.unpack(name).mT());
  if (g.needs_grad(2)) r[2] = matmul(sa.unpack(name).mT(), dc);
  return r;
}

Tensor addmm_out(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) {
  check_addmm("addmm_out", bias, a, b);
  const Shape shape{a.size(0), b.size(1)};
  KILN_CHECK(out.sizes() == shape && out.dtype() == a.dtype() && out.device() == a.device(),
             "addmm_out: out must be a {} tensor of shape {} on {}, got {} of shape {} on {}", dtype_name(a.dtype()),
             shape.str(), a.device().str(), dtype_name(out.dtype()), out.sizes().str(), out.device().str());
  KILN_CHECK(!should_record({bias, a, b}),
             "addmm_out: writing into out records no gradient (as PyTorch's out= forms); call addmm, or run this "
             "under NoGradGuard");
  check_no_internal_overlap(out, "addmm_out");
  check_inference_write(out, "addmm_out");
  // The product reads each element of a and b many times while it writes out, and the bias is read
  // after it (when not in its epilogue): an operand in out's memory is read from a copy.
  auto apart = [&](const Tensor& operand) {
    if (operand.impl()->storage != out.impl()->storage) return operand;
    NoGradGuard no_grad;
    return operand.clone();
  };
  addmm_into(out, apart(bias), apart(a), apart(b));
  return out;
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b) {
  if (autocast::is_enabled(a.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Addmm, a.device()}) return addmm(ac.cast(bias), ac.cast(a), ac.cast(b));
  }
  check_addmm("addmm", bias, a, b);
  Tensor out = empty_tensor({a.size(0), b.size(1)}, a.dtype(), a.device());
  addmm_into(out, bias, a, b);
  if (should_record({bias, a, b})) {
    record("AddmmBackward", {bias, a, b}, {out},
           [sa = SavedTensor(b.requires_grad() ? a : Tensor(), false),
            sb = SavedTensor(a.requires_grad() ? b : Tensor(), false),
            bias_shape = bias.sizes()](const Grads& g) -> TensorList {
             return addmm_grads(g, g[0], bias_shape, sa, sb, "AddmmBackward");
           });
  }
  return out;
}

Tensor addmm_gelu(const Tensor& bias, const Tensor& a, const Tensor& b, std::string_view approximate) {
  if (autocast::is_enabled(a.device().type)) {
    if (autocast::OpScope ac{autocast::Op::AddmmGelu, a.device()}) {
      return addmm_gelu(ac.cast(bias), ac.cast(a), ac.cast(b), approximate);
    }
  }
  const char* op = "addmm_gelu";
  const bool tanh_form = parse_gelu_approximate(approximate, op);
  check_addmm(op, bias, a, b);
  KILN_CHECK(bias.dim() == 1 && bias.size(0) == b.size(1),
             "{}: bias must be 1-D with as many elements as the product has columns ({}), got shape {}", op, b.size(1),
             bias.sizes().str());
  const int64_t M = a.size(0), N = b.size(1);
  // The epilogue exists for the tanh form only (cuBLASLt's), and not on the CPU, where no buffers
  // are made for it; fusion off measures the composition.
  if (tanh_form && fusion_enabled() && !a.is_cpu() && M > 0 && N > 0 && a.size(1) > 0) {
    Tensor out = empty_tensor({M, N}, a.dtype(), a.device()), pre = empty_tensor({M, N}, a.dtype(), a.device());
    const Tensor bc = bias.contiguous();
    if (backend_for(a.device())
            .matmul_bias_gelu(view_of(a), view_of(b), view_of(bc), view_of(out), view_of(pre), stream_for(a.device()))) {
      flops::Op count(M * a.size(1) * N, 2 * M * N);  // the product, the bias's add and the GELU
      if (should_record({bias, a, b})) {
        // Saves the GELU's input pre (written by the same GEMM), not recomputed: as bias_gelu saves
        // its input, the same bytes.
        record("AddmmGeluBackward", {bias, a, b}, {out},
               [sp = SavedTensor(pre, false), sa = SavedTensor(b.requires_grad() ? a : Tensor(), false),
                sb = SavedTensor(a.requires_grad() ? b : Tensor(), false)](const Grads& g) -> TensorList {
                 const Tensor gp = gelu_backward(g[0], sp.unpack("AddmmGeluBackward"), /*tanh_form=*/true);
                 return addmm_grads(g, gp, Shape{gp.size(1)}, sa, sb, "AddmmGeluBackward");
               });
      }
      return out;
    }
  }
  // Composed: where bias_gelu has its one fused pass, the GEMM and that pass; else addmm (its bias
  // in the epilogue where the backend can) and gelu.
  if (bias_gelu_fuses(a.dtype())) {
    return bias_gelu(matmul(a, b), bias, approximate);
  }
  return gelu(addmm(bias, a, b), approximate);
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

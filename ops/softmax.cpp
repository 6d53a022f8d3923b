// ops/softmax.cpp: softmax and log_softmax along a dim, with their backward (kernels: cpu/reduce.cpp,
// cuda/reduce.cu):
//   softmax:     dx = y * (g - sum(g * y))
//   log_softmax: dx = g - exp(y) * sum(g)
// The backward is one kernel (Backend::softmax_backward) while fusion is on and no create_graph
// backward runs; else these formulas as ops, which can themselves be differentiated.
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

static Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  KILN_CHECK(is_floating(x.dtype()), "{}: needs a floating-point input, got {}", name, dtype_name(x.dtype()));
  int d = wrap_dim(dim, x.dim(), name);
  if (x.dim() == 0) return softmax_impl(x.reshape({1}), 0, log).reshape({});
  flops::Op count(0, x.numel());
  Tensor out = empty_tensor(x.sizes(), x.dtype(), x.device());
  // No elements, no rows to visit (an empty tensor's other dims may still hold 2^62 of them).
  if (x.numel() > 0) backend_for(x.device()).softmax(view_of(x), view_of(out), d, log, stream_for(x.device()));
  if (should_record(x)) {
    record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {x}, {out},
           [d, log, ys = SavedTensor(out, true)](const Grads& g) -> TensorList {
             Tensor y = ys.unpack("SoftmaxBackward");
             if (fused_backward()) {
               Tensor grad = g[0].to(y.dtype());
               Tensor dx = empty_tensor(y.sizes(), y.dtype(), y.device());
               flops::Op count(0, 4 * y.numel());  // as the composition's four passes
               if (y.numel() > 0) {
                 backend_for(y.device())
                     .softmax_backward(view_of(y), broadcast_view(grad, y.sizes()), view_of(dx), d, log,
                                       stream_for(y.device()));
               }
               return {dx};
             }
             if (log) return {g[0] - y.exp() * g[0].sum({d}, true)};
             return {y * (g[0] - (g[0] * y).sum({d}, true))};
           });
  }
  return out;
}

inline namespace ops {
Tensor softmax(const Tensor& x, int64_t dim) {
  if (autocast::is_enabled(x.device().type)) {  // See Note [autocast] in ops/autocast.h
    if (autocast::OpScope ac{autocast::Op::Softmax, x.device()}) return softmax(ac.cast(x), dim);
  }
  return softmax_impl(x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::LogSoftmax, x.device()}) return log_softmax(ac.cast(x), dim);
  }
  return softmax_impl(x, dim, true);
}

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                             double label_smoothing) {
  const char* op = "softmax_cross_entropy";
  flops::Op count(0, logits.numel());  // as its log_softmax
  KILN_CHECK(logits.dim() == 2 && is_floating(logits.dtype()),
             "{}: logits must be floating (R, C), got {} {}", op, dtype_name(logits.dtype()), logits.sizes().str());
  KILN_CHECK(target.dim() == 1 && target.size(0) == logits.size(0) &&
                 (target.dtype() == kInt64 || target.dtype() == kInt32),
             "{}: target must be int64 (or int32) class indices of shape ({}), got {} {}", op, logits.size(0),
             dtype_name(target.dtype()), target.sizes().str());
  KILN_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "{}: label_smoothing must be in [0, 1], got {}", op,
             label_smoothing);
  check_same_device(op, logits, target);
  const int64_t C = logits.size(1);
  const double eps = label_smoothing;
  // 16-bit logits are read as they are and computed in float32, the loss float32: what autocast's
  // float32 policy for losses gives, without the float32 copy of the logits (GPT-2's are 1.6 GB in
  // bfloat16). Their gradient comes back in their dtype, rounded once.
  const bool low = logits.dtype() == kFloat16 || logits.dtype() == kBFloat16;
  const DType math = low ? kFloat32 : logits.dtype();
  if (!fusion_enabled()) {  // the composition: log_softmax, a gather of the targets' column, the smoothing term
    check_class_targets(target, C, ignore_index, "cross_entropy");
    Tensor logp = log_softmax(logits.to(math), 1);
    Tensor keep = target.ne(ignore_index);
    Tensor index = target.masked_fill(keep.logical_not(), 0).to(kInt64).unsqueeze(1);
    Tensor loss = gather(logp, 1, index).squeeze(1) * -(1 - eps);
    if (eps > 0) loss = loss - logp.sum({1}) * (eps / static_cast<double>(C));
    return loss.masked_fill(keep.logical_not(), 0);
  }
  Tensor x = logits.contiguous(), t = target.to(kInt64).contiguous();
  const int64_t R = x.size(0);
  if (!x.device().is_cpu()) check_class_targets(t, C, ignore_index, "cross_entropy");  // the CPU kernel checks
  Tensor loss = empty_tensor({R}, math, x.device()), lse = empty_tensor({R}, math, x.device());
  if (R > 0 && C > 0) {
    backend_for(x.device()).cross_entropy(view_of(x), view_of(t), view_of(loss), view_of(lse), ignore_index, eps,
                                          stream_for(x.device()));
  } else if (R > 0) {  // no classes: PyTorch's log_softmax of an empty row
    KILN_FAIL("{}: logits have no classes (shape {})", op, x.sizes().str());
  }
  if (should_record(logits)) {
    record("CrossEntropyBackward", {x}, {loss},
           [xs = SavedTensor(x, false), t, lse, ignore_index, eps, C, math](const Grads& g) -> TensorList {
             Tensor xv = xs.unpack("CrossEntropyBackward");
             if (GradMode::is_enabled()) {  // create_graph: as ops, differentiable again
               Tensor xm = xv.to(math);
               Tensor keep = t.ne(ignore_index).unsqueeze(1);
               Tensor index = t.masked_fill(t.eq(ignore_index), 0).unsqueeze(1);
               Tensor target_part = zeros_like(xm).scatter(1, index, full_like(xm, 1 - eps).narrow(1, 0, 1));
               Tensor d = softmax(xm, 1) - target_part - eps / static_cast<double>(C);
               return {(d * g[0].unsqueeze(1)).masked_fill(keep.logical_not(), 0).to(xv.dtype())};
             }
             Tensor gl = g[0].to(math).contiguous();
             Tensor gx = empty_tensor(xv.sizes(), xv.dtype(), xv.device());
             if (gx.numel() > 0) {
               backend_for(xv.device()).cross_entropy_backward(view_of(xv), view_of(t), view_of(lse), view_of(gl),
                                                               view_of(gx), ignore_index, eps, stream_for(xv.device()));
             }
             return {gx};
           });
  }
  return loss;
}

}  // namespace ops

}  // namespace kiln

// ops/softmax.cpp: softmax and log_softmax along a dim, with their backward (kernels: cpu/reduce.cpp,
// cuda/reduce.cu):
//   softmax:     dx = y * (g - sum(g * y))
//   log_softmax: dx = g - exp(y) * sum(g)
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

static Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  KILN_CHECK(is_floating(x.dtype()), "{}: needs a floating-point input, got {}", name, dtype_name(x.dtype()));
  int d = wrap_dim(dim, x.dim(), name);
  if (x.dim() == 0) return softmax_impl(x.reshape({1}), 0, log).reshape({});
  Tensor out = empty_tensor(x.sizes(), x.dtype(), x.device());
  backend_for(x.device()).softmax(view_of(x), view_of(out), d, log, stream_for(x.device()));
  if (should_record(x)) {
    record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {x}, {out},
           [d, log, ys = SavedTensor(out, true)](const Grads& g) -> TensorList {
             Tensor y = ys.unpack("SoftmaxBackward");
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
}  // namespace ops

}  // namespace kiln

// ops/reduce.cpp: reductions. The kernels (ReduceKind) do sum, prod, max, min, argmax, argmin, all and
// any; mean, var, std, norm and logsumexp are compositions of those with elementwise ops, so their
// gradients come from the pieces'.
#include <cmath>

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

// Which dims a reduction removes, and the shapes of its result with and without keepdim.
struct Plan {
  bool reduced[kMaxDims] = {};
  Shape keep_shape;  // the input's shape with 1 in each reduced dim
  Shape out_shape;   // keep_shape without the reduced dims, unless keepdim
  int64_t count = 1; // elements reduced into each output
};

Plan make_plan(const Tensor& x, const Shape& dims, bool keepdim, const char* op) {
  Plan p;
  const int nd = x.dim();
  if (dims.empty()) {
    for (int d = 0; d < nd; ++d) p.reduced[d] = true;
  } else {
    for (int64_t d : dims) {
      int w = wrap_dim(d, nd, op);
      if (nd == 0) continue;
      KILN_CHECK(!p.reduced[w], "{}: dim {} appears more than once in the dims {}", op, w, dims.str());
      p.reduced[w] = true;
    }
  }
  for (int d = 0; d < nd; ++d) {
    p.keep_shape.push_back(p.reduced[d] ? 1 : x.sizes()[d]);
    if (p.reduced[d]) p.count *= x.sizes()[d];
    if (!p.reduced[d] || keepdim) p.out_shape.push_back(p.reduced[d] ? 1 : x.sizes()[d]);
  }
  return p;
}

Tensor reduce_raw(ReduceKind op, const Tensor& x, const Plan& plan, DType out_dtype) {
  flops::Op count(0, is_floating(out_dtype) ? x.numel() : 0);
  Tensor out = empty_tensor(plan.keep_shape, out_dtype, x.device());
  backend_for(x.device()).reduce(op, view_of(x), view_of(out), stream_for(x.device()));
  return out.sizes() == plan.out_shape ? out : out.view(plan.out_shape);
}

// A reduced result (or its gradient) brought back to the input's shape.
Tensor expand_back(const Tensor& r, const Shape& keep_shape, const Shape& input_shape) {
  return r.reshape(keep_shape).expand(input_shape);
}

void check_nonempty(const Tensor& x, const Plan& p, const char* op) {
  for (int d = 0; d < x.dim(); ++d) {
    KILN_CHECK(!(p.reduced[d] && x.sizes()[d] == 0),
               "{}: cannot reduce over dim {} of size 0 (the result would be undefined); shape {}", op, d,
               x.sizes().str());
  }
  KILN_CHECK(x.numel() > 0 || x.dim() > 0, "{}: the input is empty", op);
}

Tensor floating_input(const Tensor& x, const char* op) {
  KILN_CHECK(is_floating(x.dtype()),
             "{}: needs a floating-point input, got {}; convert it first, e.g. x.to(kFloat32)", op,
             dtype_name(x.dtype()));
  return x;
}

Shape reduced_dims(const Plan& p, int nd) {
  Shape d;
  for (int i = 0; i < nd; ++i)
    if (p.reduced[i]) d.push_back(i);
  return d;
}

// amax / amin: the gradient is shared evenly among the elements equal to the extreme.
Tensor extreme(const Tensor& x, const Shape& dims, bool keepdim, bool is_max) {
  const char* name = is_max ? "amax" : "amin";
  // bool as PyTorch: the extreme of the values as 0 and 1 (any / all along the dims), a bool result.
  if (x.dtype() == kBool) return extreme(x.to(kUInt8), dims, keepdim, is_max).to(kBool);
  Plan p = make_plan(x, dims, keepdim, name);
  check_nonempty(x, p, name);
  Tensor out = reduce_raw(is_max ? ReduceKind::Max : ReduceKind::Min, x, p, x.dtype());
  if (should_record(x)) {
    record(is_max ? "AmaxBackward" : "AminBackward", {x}, {out},
           [p, xs = SavedTensor(x, false), ys = SavedTensor(out, true)](const Grads& g) -> TensorList {
             Tensor xv = xs.unpack("AmaxBackward"), yv = ys.unpack("AmaxBackward");
             Tensor mask = xv.eq(expand_back(yv, p.keep_shape, xv.sizes())).to(g[0].dtype());
             Tensor counts = ops::sum(mask, reduced_dims(p, xv.dim()), true);
             return {expand_back(g[0], p.keep_shape, xv.sizes()) * mask / counts};
           });
  }
  return out;
}

}  // namespace

inline namespace ops {

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim, std::optional<DType> dtype) {
  // See Note [autocast] in ops/autocast.h; a sum given an explicit dtype is not autocast (PyTorch).
  if (!dtype && autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Sum, x.device()}) return sum(ac.cast(x), dims, keepdim);
  }
  DType out_dtype = dtype.value_or(is_floating(x.dtype()) ? x.dtype() : kInt64);
  Plan p = make_plan(x, dims, keepdim, "sum");
  Tensor in = x;
  if (x.dtype() != out_dtype) {
    NoGradGuard no_grad;
    in = x.to(out_dtype);
  }
  Tensor out = reduce_raw(ReduceKind::Sum, in, p, out_dtype);
  if (is_floating(out_dtype) && should_record(x)) {
    Shape shape = x.sizes();
    DType in_dtype = x.dtype();
    record("SumBackward", {x}, {out}, [p, shape, in_dtype](const Grads& g) -> TensorList {
      Tensor r = expand_back(g[0], p.keep_shape, shape);
      return {r.dtype() == in_dtype ? r : r.to(in_dtype)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  floating_input(x, "mean");
  Plan p = make_plan(x, dims, keepdim, "mean");
  if (is_reduced_float(x.dtype())) {  // sum and divide in float32: a float16 sum overflows at 65504
    return (sum(x, dims, keepdim, kFloat32) / static_cast<double>(p.count)).to(x.dtype());
  }
  return sum(x, dims, keepdim) / static_cast<double>(p.count);
}

Tensor prod(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Prod, x.device()}) return prod(ac.cast(x), dim, keepdim);
  }
  Shape dims = dim ? Shape{*dim} : Shape{};
  Plan p = make_plan(x, dims, keepdim, "prod");
  if (!is_floating(x.dtype()) && x.dtype() != kInt64) return prod(x.to(kInt64), dim, keepdim);  // as sum (bool too)
  Tensor out = reduce_raw(ReduceKind::Prod, x, p, x.dtype());
  if (should_record(x)) {
    // d prod / d x_i = product of the others: prod / x_i where x_i != 0; where a slice has exactly one
    // zero, that element gets the product of the rest and the others 0; with two zeros, all 0.
    std::optional<int64_t> d = dim ? std::optional<int64_t>(wrap_dim(*dim, x.dim(), "prod")) : std::nullopt;
    record("ProdBackward", {x}, {out}, [p, d, xs = SavedTensor(x, false)](const Grads& g) -> TensorList {
      Tensor xv = xs.unpack("ProdBackward");
      Tensor is_zero = xv.eq(0);
      Tensor zeros_in_slice = expand_back(ops::sum(is_zero, reduced_dims(p, xv.dim()), true), p.keep_shape, xv.sizes());
      Tensor masked = where(is_zero, ones({}, xv.options()), xv);
      Tensor nonzero_prod = expand_back(d ? ops::prod(masked, d, true) : ops::prod(masked), p.keep_shape, xv.sizes());
      Tensor zero = zeros({}, xv.options());
      Tensor others = where(zeros_in_slice.eq(0), nonzero_prod / xv,
                            where(zeros_in_slice.eq(1).logical_and(is_zero), nonzero_prod, zero));
      return {expand_back(g[0], p.keep_shape, xv.sizes()) * others};
    });
  }
  return out;
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) { return extreme(x, dims, keepdim, true); }
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) { return extreme(x, dims, keepdim, false); }
Tensor max(const Tensor& x) { return extreme(x, {}, false, true); }
Tensor min(const Tensor& x) { return extreme(x, {}, false, false); }

static Tensor arg_extreme(const Tensor& x, std::optional<int64_t> dim, bool keepdim, bool is_max) {
  const char* name = is_max ? "argmax" : "argmin";
  if (x.dtype() == kBool) return arg_extreme(x.to(kUInt8), dim, keepdim, is_max);  // false < true, as PyTorch
  if (!dim) {  // over the flattened tensor
    KILN_CHECK(x.numel() > 0, "{}: cannot take the {} of an empty tensor", name, name);
    Tensor flat = x.reshape({-1});
    Plan p = make_plan(flat, {}, false, name);
    Tensor idx = reduce_raw(is_max ? ReduceKind::ArgMax : ReduceKind::ArgMin, flat.detach(), p, kInt64);
    return keepdim ? idx.reshape(Shape::filled(x.dim(), 1)) : idx;
  }
  Plan p = make_plan(x, {*dim}, keepdim, name);
  check_nonempty(x, p, name);
  return reduce_raw(is_max ? ReduceKind::ArgMax : ReduceKind::ArgMin, x.detach(), p, kInt64);
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return arg_extreme(x, dim, keepdim, true); }
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return arg_extreme(x, dim, keepdim, false); }

static std::tuple<Tensor, Tensor> extreme_dim(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  int d = wrap_dim(dim, x.dim(), is_max ? "max" : "min");
  Tensor idx = arg_extreme(x, d, true, is_max);
  Tensor values = x.dim() == 0 ? x.clone() : x.gather(d, idx);  // gather carries the gradient
  if (!keepdim && x.dim() > 0) return {values.squeeze(d), idx.squeeze(d)};
  return {values, idx};
}
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim(x, dim, keepdim, true); }
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim(x, dim, keepdim, false); }

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  floating_input(x, "var");
  Plan p = make_plan(x, dims, keepdim, "var");
  // By the corrected two-pass formula (sum c^2 - (sum c)^2 / n) / (n - correction), c = x - mean:
  // the mean is rounded, by d, and sum c^2 then holds n d^2 more than the variance (for float32
  // columns of 1e4 +- 0.005, 3% of it); sum c is n d, and the correction takes that back out. Its
  // gradient is 0, as sum c is. 16-bit inputs are centered in float32 (PyTorch's opmath).
  const Tensor xw = is_reduced_float(x.dtype()) ? x.to(kFloat32) : x;
  Tensor centered = xw - xw.mean(dims, true);
  // In double: count - correction overflows int64 for a correction near INT64_MIN.
  double denom = std::max<double>(0, static_cast<double>(p.count) - static_cast<double>(correction));
  // The explicit dtype keeps CUDA autocast's float32 sum out: var is not on its list.
  Tensor drift = sum(centered, dims, keepdim, centered.dtype());
  Tensor squares = sum(centered * centered, dims, keepdim, centered.dtype());
  return ((squares - drift * drift / static_cast<double>(p.count)) / denom).to(x.dtype());
}
Tensor std(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  const Tensor v = var(x, dims, correction, keepdim);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = v.sqrt();
  }
  if (should_record(v)) {
    // PyTorch's std backward: 0 where the deviation is 0 (a constant slice), where sqrt's derivative
    // is inf and var's gradient 0 would make it nan.
    record("StdBackward", {v}, {out}, [ss = SavedTensor(out, true)](const Grads& g) -> TensorList {
      const Tensor s = ss.unpack("StdBackward");
      return {where(s.eq(0), zeros({}, s.options()), g[0] / (s * 2))};
    });
  }
  return out;
}

Tensor norm(const Tensor& x, double p, const Shape& dims, bool keepdim) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Norm, x.device()}) return norm(ac.cast(x), p, dims, keepdim);
  }
  floating_input(x, "norm");
  if (std::isinf(p)) return p > 0 ? amax(x.abs(), dims, keepdim) : amin(x.abs(), dims, keepdim);
  if (p == 0) {  // the count of nonzeros: recorded, so that backward from it runs, but it sends x no
                 // gradient (PyTorch's leaves x.grad undefined too)
    Tensor out = sum(x.ne(0), dims, keepdim).to(x.dtype());
    if (should_record(x)) {
      record("NormBackward", {x}, {out}, [](const Grads&) -> TensorList { return {Tensor()}; });
    }
    return out;
  }
  if (p == 1) return sum(x.abs(), dims, keepdim);
  if (p == 2) {
    // sqrt(sum x^2), with the gradient x / norm taken as 0 where the norm is 0 (as PyTorch).
    Plan plan = make_plan(x, dims, keepdim, "norm");
    Tensor out;
    {
      NoGradGuard no_grad;
      // 16-bit inputs square in float32 (as PyTorch's opmath): 2^-20 squared underflows float16.
      const Tensor xm = is_reduced_float(x.dtype()) ? x.to(kFloat32) : x;
      out = sum(xm * xm, dims, keepdim).sqrt().to(x.dtype());
    }
    if (should_record(x)) {
      record("NormBackward", {x}, {out}, [plan, xs = SavedTensor(x, false), ns = SavedTensor(out, true)](const Grads& g) -> TensorList {
        Tensor xv = xs.unpack("NormBackward");
        Tensor n = expand_back(ns.unpack("NormBackward"), plan.keep_shape, xv.sizes());
        Tensor scale = where(n.eq(0), zeros({}, xv.options()), expand_back(g[0], plan.keep_shape, xv.sizes()) / n);
        return {xv * scale};
      });
    }
    return out;
  }
  if (is_reduced_float(x.dtype())) return norm(x.to(kFloat32), p, dims, keepdim).to(x.dtype());  // as for p = 2
  Plan plan = make_plan(x, dims, keepdim, "norm");
  Tensor out;
  {
    NoGradGuard no_grad;
    out = sum(x.abs().pow(p), dims, keepdim).pow(1.0 / p);
  }
  if (should_record(x)) {
    // d ||x||_p / dx = sgn(x) |x|^(p-1) / ||x||_p^(p-1), as PyTorch: 0 where the norm is 0, and 0 at
    // x = 0 (for p < 1, where |x|^(p-1) is inf there). Composed, 0^(1/p - 1) at a zero norm made NaN.
    record("NormBackward", {x}, {out},
           [plan, p, xs = SavedTensor(x, false), ns = SavedTensor(out, true)](const Grads& g) -> TensorList {
             Tensor xv = xs.unpack("NormBackward");
             Tensor n = expand_back(ns.unpack("NormBackward"), plan.keep_shape, xv.sizes());
             Tensor zero = zeros({}, xv.options());
             Tensor scale = where(n.eq(0), zero, expand_back(g[0], plan.keep_shape, xv.sizes()) / n.pow(p - 1));
             return {where(xv.eq(0), zero, xv.sign() * xv.abs().pow(p - 1)) * scale};
           });
  }
  return out;
}

Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim) {
  if (autocast::is_enabled(x.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Logsumexp, x.device()}) return logsumexp(ac.cast(x), dims, keepdim);
  }
  // Integers and bool as PyTorch: computed in the default float dtype, float32.
  if (!is_floating(x.dtype())) return logsumexp(x.to(kFloat32), dims, keepdim);
  Plan p = make_plan(x, dims, keepdim, "logsumexp");
  // Shifted by the max for range; over no elements the sum is 0 and the result -inf (as PyTorch),
  // where amax would have no value, so the shift is then 0.
  Tensor m = p.count == 0 ? zeros(p.keep_shape, x.options()) : amax(x.detach(), dims, true);
  m = where(m.abs().eq(std::numeric_limits<double>::infinity()), zeros({}, m.options()), m);
  Tensor r = (x - m).exp().sum(dims, true).log() + m;  // d/dx = softmax(x); m is a constant
  if (keepdim) return r;
  return r.reshape(p.out_shape);
}

Tensor all(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Tensor b = x.dtype() == kBool ? x : x.ne(0);
  Plan p = make_plan(b, dim ? Shape{*dim} : Shape{}, keepdim, "all");
  return reduce_raw(ReduceKind::All, b.detach(), p, kBool).to(x.dtype() == kUInt8 ? kUInt8 : kBool);  // as PyTorch
}
Tensor any(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Tensor b = x.dtype() == kBool ? x : x.ne(0);
  Plan p = make_plan(b, dim ? Shape{*dim} : Shape{}, keepdim, "any");
  return reduce_raw(ReduceKind::Any, b.detach(), p, kBool).to(x.dtype() == kUInt8 ? kUInt8 : kBool);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const int lead = x.dim() - shape.size();
  KILN_CHECK(lead >= 0, "sum_to: cannot sum shape {} to the larger shape {}", x.sizes().str(), shape.str());
  Shape dims;
  for (int d = 0; d < x.dim(); ++d) {
    KILN_CHECK(d < lead || shape[d - lead] == 1 || shape[d - lead] == x.sizes()[d],
               "sum_to: shape {} does not broadcast to {}; a gradient of the wrong shape?", shape.str(),
               x.sizes().str());
    if (d < lead || (shape[d - lead] == 1 && x.sizes()[d] != 1)) dims.push_back(d);
  }
  Tensor r = dims.empty() ? x : sum(x, dims, true);
  return r.reshape(shape);
}

}  // namespace ops
}  // namespace kiln

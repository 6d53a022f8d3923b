// ops/norm.cpp: layer_norm, rms_norm, add_layer_norm, group_norm and batch_norm.
//
// While fusion is on (set_fusion), layer_norm, rms_norm and add_layer_norm of float32/float64 tensors
// are one kernel each way (Backend::layer_norm / layer_norm_backward: cpu/fused.cpp, cuda/fused.cu),
// affine and residual add included; see fused_norm below. Otherwise, and for group_norm and batch_norm, all
// of them normalise the rows of a (R, M) matrix with one kernel (norm_rows: cpu/norm.cpp), which also
// returns each row's mean and rstd = 1 / sqrt(var + eps), and then apply the affine weight and bias as
// ordinary broadcasting ops:
//   layer_norm / rms_norm: rows = the trailing normalized_shape dims
//   group_norm:            rows = (N * G, C / G * spatial)
//   batch_norm (training): rows = (C, N * spatial), on the input with C moved first
// The row normalisation y = (x - mean) * rstd records its backward, written with ops from the saved
// output and rstd:  dx = rstd * (g - mean(g) - y * mean(g * y))  (rms: without the mean(g) term); under
// create_graph it recomputes y and rstd from x with ops, so double backward is exact.
// batch_norm in eval mode is only broadcasting ops with the running statistics.
#include <limits>

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


// y = (x - mean) * rstd per row of x (R, M); mean and rstd (R) returned when asked for.
Tensor normalize_rows(const Tensor& x2d, double eps, bool rms, Tensor* mean_out = nullptr,
                      Tensor* rstd_out = nullptr) {
  if (is_reduced_float(x2d.dtype())) {
    Tensor y = normalize_rows(x2d.to(kFloat32), eps, rms, mean_out, rstd_out);
    if (mean_out) *mean_out = mean_out->to(x2d.dtype());
    if (rstd_out) *rstd_out = rstd_out->to(x2d.dtype());
    return y.to(x2d.dtype());
  }
  Tensor x = x2d.contiguous();
  const int64_t R = x.sizes()[0];
  Tensor y = empty_tensor(x.sizes(), x.dtype(), x.device());
  Tensor mean = empty_tensor({R}, x.dtype(), x.device()), rstd = empty_tensor({R}, x.dtype(), x.device());
  if (x.numel() > 0) {
    backend_for(x.device()).norm_rows(view_of(x), view_of(y), view_of(mean), view_of(rstd), eps, rms,
                                      stream_for(x.device()));
  }
  if (should_record(x2d)) {
    record(rms ? "RmsNormBackward" : "NormBackward", {x2d}, {y},
           [xs = SavedTensor(x2d, false), ys = SavedTensor(y, true), rstd, rms, eps](const Grads& g) -> TensorList {
             Tensor yv, r;
             if (GradMode::is_enabled()) {
               // create_graph: the statistics again, from x with ops, so that the gradient's own
               // gradient sees how mean and rstd depend on x (double backward).
               Tensor x = xs.unpack("NormBackward");
               Tensor centred = rms ? x : x - x.mean({1}, true);
               r = (centred.square().mean({1}, true) + eps).rsqrt();
               yv = centred * r;
             } else {
               yv = ys.unpack("NormBackward");
               r = rstd.unsqueeze(1);
             }
             Tensor inner = g[0] - yv * (g[0] * yv).mean({1}, true);
             if (!rms) inner = inner - g[0].mean({1}, true);
             return {r * inner};
           });
  }
  if (mean_out) *mean_out = mean;
  if (rstd_out) *rstd_out = rstd;
  return y;
}

void check_affine(const Tensor& t, const char* what, const Shape& shape, const Tensor& input, const char* op) {
  if (!t.defined()) return;
  KILN_CHECK(t.sizes() == shape, "{}: {} must have shape {}, got {}", op, what, shape.str(), t.sizes().str());
  check_same_device(op, input, t);
}

// Whether the trailing-dims norm of `x` (with these affine tensors, each maybe undefined) takes the
// fused kernel (Backend::layer_norm): fusion on, one float32 or float64 dtype.
bool fusable(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType dt = x.dtype();
  return fusion_enabled() && (dt == kFloat32 || dt == kFloat64) &&
         (!weight.defined() || weight.dtype() == dt) && (!bias.defined() || bias.dtype() == dt);
}

// The fused norm of the rows of x (R, M), after adding residual (R, M) when it is defined:
// returns (x + residual or undefined, out). weight and bias are (M) or undefined. Its backward is one
// kernel too (Backend::layer_norm_backward), or under create_graph the formula of NormBackward above
// plus the affine's, as ops.
std::tuple<Tensor, Tensor> fused_norm(const Tensor& x2d, const Tensor& residual, const Tensor& weight,
                                      const Tensor& bias, double eps, bool rms) {
  const char* name = rms ? "RmsNormBackward" : "LayerNormBackward";
  Tensor x = x2d.contiguous();
  Tensor res = residual.defined() ? residual.contiguous() : Tensor();
  Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  const int64_t R = x.size(0), M = x.size(1);
  const Device device = x.device();
  Tensor out = empty_tensor({R, M}, x.dtype(), device);
  Tensor sum = res.defined() ? empty_tensor({R, M}, x.dtype(), device) : Tensor();
  Tensor mean = empty_tensor({R}, x.dtype(), device), rstd = empty_tensor({R}, x.dtype(), device);
  if (out.numel() > 0) {
    backend_for(device).layer_norm(view_of(x), view_or_none(res), view_or_none(w), view_or_none(b), view_of(out),
                                   view_or_none(sum), view_of(mean), view_of(rstd), eps, rms, stream_for(device));
  }
  std::vector<Tensor> inputs{x};
  if (res.defined()) inputs.push_back(res);
  if (w.defined()) inputs.push_back(w);
  if (b.defined()) inputs.push_back(b);
  if (autograd::should_record(inputs)) {
    const bool has_res = res.defined(), has_w = w.defined(), has_b = b.defined();
    std::vector<Tensor> outputs{out};
    if (has_res) outputs.insert(outputs.begin(), sum);
    // h is what was normalised: x, or the sum, which is this node's own output (Note [saving outputs]).
    record(name, inputs, outputs,
           [hs = has_res ? SavedTensor(sum, true) : SavedTensor(x, false), ws = has_w ? SavedTensor(w, false) : SavedTensor(),
            mean, rstd, has_res, has_w, has_b, rms, eps, name](const Grads& g) -> TensorList {
             const size_t iw = has_res ? 2 : 1, ib = iw + (has_w ? 1 : 0);
             const Tensor& g_out = g[has_res ? 1 : 0];
             Tensor g_sum = has_res ? g[0] : Tensor();
             Tensor gi, gw, gb;
             if (!g_out.defined()) {  // only the residual stream's gradient arrived
               gi = g_sum;
             } else {
               Tensor h = hs.unpack(name);
               Tensor wv = has_w ? ws.unpack(name) : Tensor();
               const bool want_w = has_w && g.needs_grad(iw), want_b = has_b && g.needs_grad(ib);
               if (GradMode::is_enabled()) {  // create_graph: as ops, differentiable again
                 Tensor centred = rms ? h : h - h.mean({1}, true);
                 Tensor r = (centred.square().mean({1}, true) + eps).rsqrt();
                 Tensor xhat = centred * r;
                 Tensor gx = has_w ? g_out * wv : g_out;
                 Tensor inner = gx - xhat * (gx * xhat).mean({1}, true);
                 if (!rms) inner = inner - gx.mean({1}, true);
                 gi = r * inner;
                 if (g_sum.defined()) gi = gi + g_sum;
                 if (want_w) gw = (g_out * xhat).sum({0});
                 if (want_b) gb = g_out.sum({0});
               } else {
                 Tensor go = g_out.contiguous(), gs = g_sum.defined() ? g_sum.contiguous() : Tensor();
                 gi = empty_tensor(h.sizes(), h.dtype(), h.device());
                 const int64_t M = h.size(1);
                 if (want_w) gw = empty_tensor({M}, h.dtype(), h.device());
                 if (want_b) gb = empty_tensor({M}, h.dtype(), h.device());
                 if (h.numel() > 0) {
                   backend_for(h.device()).layer_norm_backward(view_of(go), view_or_none(gs), view_of(h),
                                                               view_or_none(wv), view_of(mean), view_of(rstd),
                                                               view_of(gi), view_or_none(gw), view_or_none(gb), rms,
                                                               stream_for(h.device()));
                 } else {
                   if (gw.defined()) gw.zero_();
                   if (gb.defined()) gb.zero_();
                 }
               }
             }
             TensorList grads{gi};
             if (has_res) grads.push_back(gi);  // d(x + residual) is the same for both
             if (has_w) grads.push_back(gw);
             if (has_b) grads.push_back(gb);
             return grads;
           });
  }
  return {sum, out};
}

// The checks of a trailing-dims norm, input (..., normalized_shape) with an affine of
// normalized_shape: returns M, the number of elements a row normalises.
int64_t check_trailing(const Tensor& input, const Shape& normalized_shape, const Tensor& weight,
                       const Tensor& bias, const char* op) {
  KILN_CHECK(is_floating(input.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(input.dtype()));
  const int k = normalized_shape.size();
  KILN_CHECK(k >= 1, "{}: normalized_shape must have at least one dim", op);
  bool matches = input.dim() >= k;
  for (int i = 0; matches && i < k; ++i) matches = input.sizes()[input.dim() - k + i] == normalized_shape[i];
  KILN_CHECK(matches, "{}: normalized_shape {} must equal the last {} dims of the input, whose shape is {}", op,
             normalized_shape.str(), k, input.sizes().str());
  check_affine(weight, "weight", normalized_shape, input, op);
  check_affine(bias, "bias", normalized_shape, input, op);
  return normalized_shape.numel();
}

// The trailing-dims norms: input (..., normalized_shape).
Tensor trailing_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                     double eps, bool rms, const char* op) {
  flops::Op count(0, input.numel() * (weight.defined() ? 5 : 4));
  const int64_t M = check_trailing(input, normalized_shape, weight, bias, op);
  const int64_t R = M == 0 ? 0 : input.numel() / M;
  if (fusable(input, weight, bias)) {
    auto flat = [M](const Tensor& t) { return t.defined() ? t.reshape({M}) : Tensor(); };
    return std::get<1>(fused_norm(input.reshape({R, M}), {}, flat(weight), flat(bias), eps, rms)).reshape(input.sizes());
  }
  Tensor y = normalize_rows(input.reshape({R, M}), eps, rms).reshape(input.sizes());
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

// Shape (C, 1, ..., 1) that broadcasts a per-channel vector against an (N, C, ...) input of `dim` dims.
Tensor per_channel(const Tensor& v, int dim) {
  Shape s = Shape::filled(dim - 1, 1);
  s[0] = v.numel();
  return v.reshape(s);
}

}  // namespace

inline namespace ops {

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (autocast::is_enabled(input.device().type)) {  // See Note [autocast] in ops/autocast.h
    if (autocast::OpScope ac{autocast::Op::LayerNorm, input.device()})
      return layer_norm(ac.cast(input), normalized_shape, ac.cast(weight), ac.cast(bias), eps);
  }
  return trailing_norm(input, normalized_shape, weight, bias, eps, false, "layer_norm");
}

std::tuple<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                          const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "add_layer_norm";
  KILN_CHECK(x.sizes() == residual.sizes(), "{}: x and residual must have one shape, got {} and {}", op,
             x.sizes().str(), residual.sizes().str());
  check_same_device(op, x, residual);
  if (autocast::is_enabled(x.device().type)) {  // as layer_norm: in float32
    if (autocast::OpScope ac{autocast::Op::LayerNorm, x.device()})
      return add_layer_norm(ac.cast(x), ac.cast(residual), normalized_shape, ac.cast(weight), ac.cast(bias), eps);
  }
  if (x.dtype() != residual.dtype() || !fusable(x, weight, bias)) {
    Tensor h = x + residual;
    return {h, layer_norm(h, normalized_shape, weight, bias, eps)};
  }
  const int64_t M = check_trailing(x, normalized_shape, weight, bias, op), R = M == 0 ? 0 : x.numel() / M;
  auto flat = [M](const Tensor& t) { return t.defined() ? t.reshape({M}) : Tensor(); };
  flops::Op count(0, x.numel() * (weight.defined() ? 6 : 5));  // the add, then layer_norm's
  auto [sum, out] = fused_norm(x.reshape({R, M}), residual.reshape({R, M}), flat(weight), flat(bias), eps, false);
  return {sum.reshape(x.sizes()), out.reshape(x.sizes())};
}

Tensor rms_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight,
                std::optional<double> eps) {
  double e = 0;
  if (eps) {
    e = *eps;
  } else {
    switch (input.dtype()) {
      case DType::Float64: e = std::numeric_limits<double>::epsilon(); break;
      case DType::Float16: e = 0.0009765625; break;  // 2^-10
      case DType::BFloat16: e = 0.0078125; break;    // 2^-7
      default: e = std::numeric_limits<float>::epsilon(); break;
    }
  }
  return trailing_norm(input, normalized_shape, weight, {}, e, true, "rms_norm");
}

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::GroupNorm, input.device()})
      return group_norm(ac.cast(input), num_groups, ac.cast(weight), ac.cast(bias), eps);
  }
  flops::Op count(0, input.numel() * (weight.defined() ? 5 : 4));
  const char* op = "group_norm";
  KILN_CHECK(input.dim() >= 2, "{}: expected an input of at least 2 dims (N, C, *), got shape {}", op,
             input.sizes().str());
  KILN_CHECK(is_floating(input.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(input.dtype()));
  const int64_t N = input.sizes()[0], C = input.sizes()[1];
  KILN_CHECK(num_groups >= 1 && C % num_groups == 0,
             "{}: the {} channels of the input {} must divide into num_groups = {} groups", op, C,
             input.sizes().str(), num_groups);
  for (const Tensor* t : {&weight, &bias}) {
    KILN_CHECK(!t->defined() || t->dim() != 1 || t->numel() == C,
               "{}: the input {} has {} channels (dim 1) but the {} has {}: the layer was made for another "
               "number of channels", op, input.sizes().str(), C, t == &weight ? "weight" : "bias", t->numel());
  }
  check_affine(weight, "weight", {C}, input, op);
  check_affine(bias, "bias", {C}, input, op);
  const int64_t M = input.numel() / std::max<int64_t>(N * num_groups, 1);
  Tensor y = normalize_rows(input.reshape({N * num_groups, M}), eps, false).reshape(input.sizes());
  if (weight.defined()) y = y * per_channel(weight, input.dim());
  if (bias.defined()) y = y + per_channel(bias, input.dim());
  return y;
}

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  const char* op = "batch_norm";
  flops::Op count(0, input.numel() * (weight.defined() ? 5 : 4));
  KILN_CHECK(input.dim() >= 2, "{}: expected an input of at least 2 dims (N, C) or (N, C, *), got shape {}", op,
             input.sizes().str());
  KILN_CHECK(is_floating(input.dtype()), "{}: needs a floating-point input, got {}", op, dtype_name(input.dtype()));
  const int64_t C = input.sizes()[1];
  check_affine(weight, "weight", {C}, input, op);
  check_affine(bias, "bias", {C}, input, op);
  check_affine(running_mean, "running_mean", {C}, input, op);
  check_affine(running_var, "running_var", {C}, input, op);
  KILN_CHECK(running_mean.defined() == running_var.defined(),
             "{}: give both running_mean and running_var, or neither", op);
  const int d = input.dim();
  Tensor y;
  const int64_t values = input.numel() / std::max<int64_t>(C, 1);  // per channel
  KILN_CHECK(!training || values != 1, "{}: expected more than 1 value per channel when training, got input of shape {}",
             op, input.sizes().str());
  if (training && values == 0) {
    // An empty batch gives an empty output and leaves the running statistics as they are, as
    // PyTorch.
    y = input.clone();
  } else if (training) {
    Tensor xc = input.transpose(0, 1).reshape({C, values}).contiguous();  // channel rows
    Tensor mean, rstd;
    Tensor yc = normalize_rows(xc, eps, false, &mean, &rstd);
    Shape moved = input.sizes();
    std::swap(moved[0], moved[1]);
    y = yc.reshape(moved).transpose(0, 1).contiguous();
    if (running_mean.defined()) {
      NoGradGuard no_grad;
      Tensor unbiased_var = xc.detach().var({1}, 1);
      Tensor rm = running_mean, rv = running_var;  // handles to the caller's buffers, updated in place
      rm.mul_(1 - momentum).add_(mean.to(rm.dtype()), momentum);
      rv.mul_(1 - momentum).add_(unbiased_var.to(rv.dtype()), momentum);
    }
  } else {
    KILN_CHECK(running_mean.defined(), "{}: running_mean and running_var are needed in evaluation mode", op);
    y = (input - per_channel(running_mean, d)) * per_channel((running_var + eps).rsqrt(), d);
  }
  if (weight.defined()) y = y * per_channel(weight, d);
  if (bias.defined()) y = y + per_channel(bias, d);
  return y;
}

}  // namespace ops
}  // namespace kiln

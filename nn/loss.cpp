// nn/loss.cpp: the losses of nn/functional.h (cross-entropy, regression, binary, margin, embedding and
// likelihood losses), the distances (normalize, cosine_similarity, pairwise_distance) and the loss
// modules of nn/loss.h. Compositions of ops, so they run on any device and differentiate twice, except
// where one recorded node gives a cheaper or more exact gradient (nll_loss, binary_cross_entropy and
// binary_cross_entropy_with_logits).
#include "nn/loss.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/grad_mode.h"
#include "nn/functional.h"
#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln::nn {
inline namespace functional {

namespace {

// Under autocast, with a float32 policy for `op` on the first input's device type: fn of the inputs
// cast by the policy (undefined ones stay so), run with autocast off; nullopt otherwise, and the loss
// runs on its inputs as given.
template <class Fn, class... Tensors>
std::optional<Tensor> under_autocast(autocast::Op op, const Fn& fn, const Tensor& first, const Tensors&... rest) {
  if (!autocast::is_enabled(first.device().type)) return std::nullopt;
  autocast::OpScope ac{op, first.device()};
  if (!ac) return std::nullopt;
  return fn(ac.cast(first), ac.cast(rest)...);
}

enum class Reduction { None, Mean, Sum };

Reduction parse_reduction(const std::string& r, const char* op) {
  if (r == "mean") return Reduction::Mean;
  if (r == "sum") return Reduction::Sum;
  if (r == "none") return Reduction::None;
  KILN_FAIL("{}: reduction '{}' is not one of 'mean', 'sum', 'none'", op, r);
}

Tensor reduce(const Tensor& loss, Reduction r) {
  switch (r) {
    case Reduction::Mean: return loss.mean();
    case Reduction::Sum: return loss.sum();
    case Reduction::None: break;
  }
  return loss;
}

void check_same_shape(const Tensor& input, const Tensor& target, const char* op) {
  KILN_CHECK(input.sizes() == target.sizes(),
             "{}: the target's shape {} must equal the input's {} (Kiln does not broadcast losses)", op,
             target.sizes().str(), input.sizes().str());
}

// The regression losses: one shape, and a floating input or target (the other is promoted to it, as
// in PyTorch; two integer tensors were an Error from an inner mean).
void check_regression(const Tensor& input, const Tensor& target, const char* op) {
  KILN_CHECK(input.is_floating_point() || target.is_floating_point(),
             "{}: needs a floating-point input or target, got {} and {}; convert them with .to(kFloat32)", op,
             dtype_name(input.dtype()), dtype_name(target.dtype()));
  check_same_shape(input, target, op);
}

// Shape (1, C, 1, ...) of a per-class vector, to broadcast against (N, C, d1, ...).
Tensor along_classes(const Tensor& w, int ndim) {
  Shape s = Shape::filled(ndim, 1);
  s[ndim == 1 ? 0 : 1] = w.numel();
  return w.view(s);
}

void check_class_weight(const Tensor& weight, const Tensor& input, int64_t classes, const char* op) {
  KILN_CHECK(weight.dim() == 1 && weight.numel() == classes,
             "{}: weight must be a 1-D tensor of {} elements (one per class), got shape {}", op, classes,
             weight.sizes().str());
  KILN_CHECK(weight.dtype() == input.dtype() && weight.device() == input.device(),
             "{}: weight ({} on {}) must have the input's dtype and device ({} on {}); convert it with .to()", op,
             dtype_name(weight.dtype()), weight.device().str(), dtype_name(input.dtype()), input.device().str());
}

// A per-element weight of binary_cross_entropy(_with_logits) (`what`: "<op>: weight" or "<op>:
// pos_weight"): it broadcasts to the input's shape and leaves it unchanged (PyTorch refuses one that
// would grow the loss).
void check_element_weight(const Tensor& weight, const Tensor& input, const char* what) {
  KILN_CHECK(broadcast_shapes(weight.sizes(), input.sizes(), what) == input.sizes(),
             "{} of shape {} must broadcast to the input's shape {}", what, weight.sizes().str(), input.sizes().str());
}

// The negative log-likelihood of class-index targets given log-probabilities (N, C, d...) or (C), reduced,
// recorded as one node: it is linear in logp, so its gradient is -w[t] (times the reduction's factor) at
// each target class and zero elsewhere: one scatter. Also returns the per-element weights w[t] (1 without
// a weight; 0 where target == ignore_index), which label smoothing reuses.
struct Nll {
  Tensor loss;
  Tensor weights;  // shape of target
};

Nll nll(const Tensor& logp, const Tensor& target, const Tensor& weight, int64_t ignore_index, Reduction r,
        const char* op) {
  const bool probabilities = std::string_view(op) == "cross_entropy";  // nll_loss takes class indices only
  KILN_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, "{}: class-index targets must be int64 or int32, got {}{}",
             op, dtype_name(target.dtype()),
             probabilities ? "; for class probabilities pass a floating target of the input's shape" : "");
  KILN_CHECK(logp.dim() >= 1, "{}: input must be log-probabilities of shape (N, C, ...) or (C), got a 0-dimensional "
             "tensor", op);
  int cdim = logp.dim() == 1 ? 0 : 1;
  Shape expected = logp.sizes();
  expected.erase(cdim);
  KILN_CHECK(target.sizes() == expected,
             "{}: for input of shape {} the class-index target must have shape {}, got {}", op,
             logp.sizes().str(), expected.str(), target.sizes().str());
  if (weight.defined()) check_class_weight(weight, logp, logp.size(cdim), op);
  check_class_targets(target, logp.size(cdim), ignore_index, op);

  Nll out;
  Tensor index, denom, keep;
  {
    NoGradGuard no_grad;
    // Ignored targets index class 0 (with weight 0), so gather stays in range. They are masked
    // with masked_fill, not by a product with 0: a NaN or inf log-probability there (a padded
    // position's), or an inf weight of class 0, would make 0 times it NaN; PyTorch skips them.
    keep = target.ne(ignore_index);
    const Tensor ignored = keep.logical_not();
    Tensor safe = target.masked_fill(ignored, 0);
    index = safe.unsqueeze(cdim);
    out.weights = weight.defined() ? index_select(weight, 0, safe.reshape({-1})).view(target.sizes()).masked_fill(ignored, 0)
                                   : keep.to(logp.dtype());
    Tensor picked = (gather(logp, cdim, index).squeeze(cdim) * out.weights).masked_fill(ignored, 0);  // -loss
    switch (r) {
      case Reduction::Mean:  // PyTorch's weighted mean
        denom = out.weights.sum();
        out.loss = picked.sum().div_(denom).neg_();
        break;
      case Reduction::Sum: out.loss = picked.sum().neg_(); break;
      case Reduction::None: out.loss = picked.neg_(); break;
    }
  }
  if (autograd::should_record(logp)) {
    autograd::record("NllLossBackward", {logp}, {out.loss},
                     [index, w = out.weights, denom, keep, cdim, sizes = logp.sizes(), options = logp.options()](
                         const autograd::Grads& g) -> autograd::TensorList {
                       Tensor coef = denom.defined() ? g[0] / denom * w : g[0] * w;
                       // An ignored element has no gradient, as in PyTorch, even when every element
                       // is ignored and g / denom is inf, or the incoming gradient there is not
                       // finite (w = 0 times either would be nan).
                       coef = coef.masked_fill(keep.logical_not(), 0);
                       return {zeros(sizes, options).scatter(cdim, index, -coef.unsqueeze(cdim))};
                     });
  }
  return out;
}

}  // namespace

// ---- losses ----

// The losses run in float32 under autocast (See Note [autocast] in ops/autocast.h): each casts its
// floating inputs, weights included, and calls itself again with autocast off.

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::NllLoss, input.device()}) {
      NLLLossOptions o = options;
      o.weight = ac.cast(options.weight);
      return nll_loss(ac.cast(input), target, o);
    }
  }
  Reduction r = parse_reduction(options.reduction, "nll_loss");
  return nll(input, target, options.weight, options.ignore_index, r, "nll_loss").loss;
}

namespace {
// Class indices without class weights, logits (N, C) or (C): the rows ops::softmax_cross_entropy takes.
bool class_rows(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options) {
  if (options.weight.defined() || input.dim() < 1 || input.dim() > 2 || !input.is_floating_point()) return false;
  const int64_t classes = input.size(input.dim() == 1 ? 0 : 1);
  return (target.dtype() == kInt64 || target.dtype() == kInt32) &&
         target.numel() == input.numel() / std::max<int64_t>(classes, 1) && target.dim() == input.dim() - 1;
}

// cross_entropy of class_rows: one op over the rows, fused while fusion is on
// (ops::softmax_cross_entropy: log-softmax, the target's pick and the smoothing in one pass). For
// 16-bit logits its loss is float32; reduced in float32, it is returned in the logits' dtype as
// PyTorch does, or kept in float32 under autocast (whose policy for losses is float32).
Tensor class_rows_cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options,
                                bool float32_result) {
  const Reduction r = parse_reduction(options.reduction, "cross_entropy");
  KILN_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1,
             "cross_entropy: label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  const Tensor per_row = softmax_cross_entropy(input.dim() == 1 ? input.unsqueeze(0) : input, target.reshape({-1}),
                                               options.ignore_index, options.label_smoothing);
  Tensor loss;
  switch (r) {
    case Reduction::Mean: loss = per_row.sum() / target.ne(options.ignore_index).sum().to(per_row.dtype()); break;
    case Reduction::Sum: loss = per_row.sum(); break;
    case Reduction::None: loss = target.dim() == 1 ? per_row : per_row.reshape(target.sizes()); break;
  }
  return float32_result ? loss : loss.to(input.dtype());
}
}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::CrossEntropy, input.device()}) {
      // Class-index rows: the 16-bit logits go to softmax_cross_entropy as they are (it computes in
      // float32, as after the cast, and gives a float32 loss), saving a float32 copy of them.
      const bool low = input.dtype() == kFloat16 || input.dtype() == kBFloat16;  // what the policy casts
      if (low && class_rows(input, target, options)) {
        return class_rows_cross_entropy(input, target, options, true);
      }
      CrossEntropyOptions o = options;
      o.weight = ac.cast(options.weight);
      return cross_entropy(ac.cast(input), ac.cast(target), o);  // class-index targets stay integers
    }
  }
  const char* op = "cross_entropy";
  Reduction r = parse_reduction(options.reduction, op);
  double eps = options.label_smoothing;
  KILN_CHECK(eps >= 0 && eps <= 1, "cross_entropy: label_smoothing must be in [0, 1], got {}", eps);
  KILN_CHECK(input.dim() >= 1 && input.is_floating_point(),
             "cross_entropy: input must be floating logits of shape (N, C, ...) or (C), got {} {}",
             dtype_name(input.dtype()), input.sizes().str());
  int cdim = input.dim() == 1 ? 0 : 1;
  int64_t classes = input.size(cdim);
  if (class_rows(input, target, options)) return class_rows_cross_entropy(input, target, options, false);
  Tensor logp = log_softmax(input, cdim);

  if (target.is_floating_point()) {  // class probabilities
    check_same_shape(input, target, op);
    Tensor t = eps > 0 ? target * (1 - eps) + eps / classes : target;
    Tensor prod = logp * t;
    if (options.weight.defined()) {
      check_class_weight(options.weight, input, classes, op);
      prod = prod * along_classes(options.weight, input.dim());
    }
    Tensor loss = -prod.sum({cdim});
    // The mean over the rows, input.numel() / classes of them: with no classes 0 / 0, NaN, as PyTorch
    // (and as for no rows), computed in double so that no integer divides by zero.
    if (r == Reduction::Mean) return loss.sum() / (static_cast<double>(input.numel()) / static_cast<double>(classes));
    return reduce(loss, r);
  }

  Nll nl = nll(logp, target, options.weight, options.ignore_index, r, op);
  if (eps == 0) return nl.loss;
  // Label smoothing: (1 - eps) * nll + eps / C * (-sum_c w_c logp_c), ignored elements masked.
  Tensor all = options.weight.defined() ? logp * along_classes(options.weight, input.dim()) : logp;
  // masked_fill, not a product with the mask: its gradient is 0 at an ignored element even when the
  // mean's 1 / (sum of weights) is inf because every element is ignored (as PyTorch).
  Tensor smooth = (-all.sum({cdim})).masked_fill(target.eq(options.ignore_index), 0);
  Tensor smooth_reduced;
  switch (r) {
    case Reduction::Mean:
      smooth_reduced = smooth.sum() / nl.weights.sum();
      break;
    case Reduction::Sum: smooth_reduced = smooth.sum(); break;
    case Reduction::None: smooth_reduced = smooth; break;
  }
  return nl.loss * (1 - eps) + smooth_reduced * (eps / classes);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const LossOptions& options) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::MseLoss, input.device()})
      return mse_loss(ac.cast(input), ac.cast(target), options);
  }
  Reduction r = parse_reduction(options.reduction, "mse_loss");
  check_regression(input, target, "mse_loss");
  return reduce((input - target).square(), r);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, const LossOptions& options) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::L1Loss, input.device()})
      return l1_loss(ac.cast(input), ac.cast(target), options);
  }
  Reduction r = parse_reduction(options.reduction, "l1_loss");
  check_regression(input, target, "l1_loss");
  return reduce((input - target).abs(), r);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const SmoothL1LossOptions& options) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::SmoothL1Loss, input.device()})
      return smooth_l1_loss(ac.cast(input), ac.cast(target), options);
  }
  Reduction r = parse_reduction(options.reduction, "smooth_l1_loss");
  check_regression(input, target, "smooth_l1_loss");
  KILN_CHECK(options.beta >= 0, "smooth_l1_loss: beta must be >= 0, got {}", options.beta);
  Tensor d = (input - target).abs();
  if (options.beta == 0) return reduce(d, r);
  Tensor loss = where(d.lt(options.beta), d.square() * (0.5 / options.beta), d - 0.5 * options.beta);
  return reduce(loss, r);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, const HuberLossOptions& options) {
  const auto again = [&](const Tensor& x, const Tensor& t) { return huber_loss(x, t, options); };
  if (auto cast = under_autocast(autocast::Op::HuberLoss, again, input, target)) return *cast;
  Reduction r = parse_reduction(options.reduction, "huber_loss");
  check_regression(input, target, "huber_loss");
  KILN_CHECK(options.delta > 0, "huber_loss: delta must be > 0, got {}", options.delta);
  Tensor d = (input - target).abs();
  Tensor loss = where(d.lt(options.delta), d.square() * 0.5, (d - 0.5 * options.delta) * options.delta);
  return reduce(loss, r);
}

Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivLossOptions& options) {
  const auto again = [&](const Tensor& x, const Tensor& t) { return kl_div(x, t, options); };
  if (auto cast = under_autocast(autocast::Op::KlDiv, again, input, target)) return *cast;
  const char* op = "kl_div";
  const std::string& red = options.reduction;
  KILN_CHECK(red == "mean" || red == "batchmean" || red == "sum" || red == "none",
             "{}: reduction '{}' is not one of 'mean', 'batchmean', 'sum', 'none'", op, red);
  check_regression(input, target, op);
  Tensor loss;
  if (options.log_target) {
    loss = target.exp() * (target - input);
  } else {
    // target * log(target) as 0 at target = 0, with the log taken of 1 there so that no 0 * -inf
    // reaches the gradient. A negative or NaN target gives NaN, as PyTorch's xlogy: bad targets
    // show in the loss rather than count as 0.
    Tensor nonzero = target.ne(0);  // NaN too
    loss = where(nonzero, target * (where(nonzero, target, 1.0).log() - input), 0.0);
  }
  if (red == "none") return loss;
  if (red == "sum") return loss.sum();
  if (red == "mean") return loss.mean();
  return loss.sum() / static_cast<double>(input.dim() == 0 ? 1 : input.size(0));  // batchmean
}

namespace {

// (1 - t) x + lw softplus(-x) (lw undefined: 1), binary_cross_entropy_with_logits's loss per element,
// as one node. softplus(-x) = -log sigmoid(x) never overflows (the identity above 20), and the forward
// keeps the low bits that log1p(exp(-|x|)) + max(-x, 0) or softplus(x) - t x would lose. Its
// x-gradient is PyTorch's lw sigmoid(x) - pw t written as (1 - t) sigmoid(x) - pw t sigmoid(-x), with
// pw t = lw - 1 + t: no term cancels at either end. The composition's (1 - t) - lw sigmoid(-x) was 17%
// off at x = -15 in float32 and 0 at -17; PyTorch's form is 0 for t = 1 at large x.
Tensor bce_with_logits_terms(const Tensor& x, const Tensor& t, const Tensor& lw) {
  Tensor loss;
  {
    NoGradGuard no_grad;
    Tensor neg_log_sigmoid = softplus(-x);
    loss = (1 - t) * x + (lw.defined() ? lw * neg_log_sigmoid : neg_log_sigmoid);
  }
  const bool weighted = lw.defined();
  if (!autograd::should_record(x, t) && !(weighted && autograd::should_record(lw))) return loss;
  auto backward = [xs = autograd::SavedTensor(x, false), ts = autograd::SavedTensor(t, false),
                   ws = weighted ? autograd::SavedTensor(lw, false) : autograd::SavedTensor()](
                      const autograd::Grads& g) -> autograd::TensorList {
    const char* name = "BinaryCrossEntropyWithLogitsBackward";
    Tensor xv = xs.unpack(name), tv = ts.unpack(name), wv = ws.defined() ? ws.unpack(name) : Tensor();
    // Each gradient in its input's dtype (a float64 target must not make a float32 x's grad float64),
    // and only those asked for.
    autograd::TensorList out(wv.defined() ? 3 : 2);
    if (g.needs_grad(0)) {
      Tensor up = (1 - tv) * sigmoid(xv), down = sigmoid(-xv);
      out[0] = (g[0] * (up - (wv.defined() ? wv - 1 + tv : tv) * down)).to(xv.dtype());
    }
    if (g.needs_grad(1)) out[1] = (g[0] * -xv).to(tv.dtype());
    if (wv.defined() && g.needs_grad(2)) out[2] = (g[0] * softplus(-xv)).to(wv.dtype());
    return out;
  };
  if (weighted) {
    autograd::record("BinaryCrossEntropyWithLogitsBackward", {x, t, lw}, {loss}, std::move(backward));
  } else {
    autograd::record("BinaryCrossEntropyWithLogitsBackward", {x, t}, {loss}, std::move(backward));
  }
  return loss;
}

}  // namespace

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BCELossOptions& options) {
  if (autocast::is_enabled(input.device().type)) {  // float32 on the CPU, an Error on CUDA
    if (autocast::OpScope ac{autocast::Op::BinaryCrossEntropy, input.device()}) {
      BCELossOptions o = options;
      o.weight = ac.cast(options.weight);
      return binary_cross_entropy(ac.cast(input), ac.cast(target), o);
    }
  }
  Reduction r = parse_reduction(options.reduction, "binary_cross_entropy");
  check_same_shape(input, target, "binary_cross_entropy");
  {  // probabilities only, as PyTorch (one pass over the input; nan fails too)
    NoGradGuard no_grad;
    KILN_CHECK(input.ge(0).logical_and(input.le(1)).all().item<bool>(),
               "binary_cross_entropy: all elements of input should be between 0 and 1; for logits, use "
               "binary_cross_entropy_with_logits");
  }
  // log(p) and log(1 - p) clamped at -100, so p = 0 or 1 gives a finite loss (PyTorch's rule).
  Tensor loss;
  {
    NoGradGuard no_grad;
    loss = -(target * input.log().clamp(-100.0) + (1 - target) * (1 - input).log().clamp(-100.0));
  }
  // PyTorch's gradients rather than the composition's: d/dp is (p - t) / max(p (1 - p), 1e-12), finite
  // at a saturated p of 0 or 1 (the clamped log's was 0 * inf = nan there), and d/dt is -logit(p).
  if (autograd::should_record(input, target)) {
    autograd::record("BinaryCrossEntropyBackward", {input, target}, {loss},
                     [p = autograd::SavedTensor(input, false), t = autograd::SavedTensor(target, false)](
                         const autograd::Grads& g) -> autograd::TensorList {
                       const Tensor pv = p.unpack("BinaryCrossEntropyBackward");
                       const Tensor tv = t.unpack("BinaryCrossEntropyBackward");
                       // In float32 at least: float16 cannot hold the 1e-12 floor (it would divide by 0).
                       const bool half = pv.dtype() == kFloat16 || pv.dtype() == kBFloat16;
                       const Tensor pc = half ? pv.to(kFloat32) : pv, tc = half ? tv.to(kFloat32) : tv;
                       autograd::TensorList out(2);
                       if (g.needs_grad(0)) out[0] = (g[0] * (pc - tc) / (pc * (1 - pc)).clamp(1e-12)).to(pv.dtype());
                       if (g.needs_grad(1)) out[1] = (g[0] * ((1 - pc).log() - pc.log())).to(tv.dtype());
                       return out;
                     });
  }
  if (options.weight.defined()) {
    check_element_weight(options.weight, input, "binary_cross_entropy: weight");
    loss = loss * options.weight;
  }
  return reduce(loss, r);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsLossOptions& options) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::BinaryCrossEntropyWithLogits, input.device()}) {
      BCEWithLogitsLossOptions o = options;
      o.weight = ac.cast(options.weight);
      o.pos_weight = ac.cast(options.pos_weight);
      return binary_cross_entropy_with_logits(ac.cast(input), ac.cast(target), o);
    }
  }
  Reduction r = parse_reduction(options.reduction, "binary_cross_entropy_with_logits");
  check_same_shape(input, target, "binary_cross_entropy_with_logits");
  Tensor log_weight;  // 1 + (pos_weight - 1) t, composed so that its gradients reach pos_weight and t
  if (options.pos_weight.defined()) {
    check_element_weight(options.pos_weight, input, "binary_cross_entropy_with_logits: pos_weight");
    log_weight = (options.pos_weight - 1) * target + 1;
  }
  Tensor loss = bce_with_logits_terms(input, target, log_weight);
  if (options.weight.defined()) {
    check_element_weight(options.weight, input, "binary_cross_entropy_with_logits: weight");
    loss = loss * options.weight;
  }
  return reduce(loss, r);
}

// ---- margin, embedding and likelihood losses ----

namespace {

void check_floating_input(const Tensor& input, const char* op, const char* what = "input") {
  KILN_CHECK(input.is_floating_point(), "{}: {} must be floating, got {}; convert it with .to(kFloat32)", op, what,
             dtype_name(input.dtype()));
}

void check_index_dtype(const Tensor& target, const char* op) {
  KILN_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32,
             "{}: target must hold class indices (int64 or int32), got {}", op, dtype_name(target.dtype()));
}

// input (N, C) or (C) of classes C >= 1.
void check_class_matrix(const Tensor& input, const char* op) {
  check_floating_input(input, op);
  KILN_CHECK((input.dim() == 1 || input.dim() == 2) && input.size(-1) > 0,
             "{}: input must be (N, C) or (C) with C >= 1 classes, got shape {}", op, input.sizes().str());
}

// max(z, 0) with no gradient at z = 0, as the native kernels of multi_margin_loss and
// multilabel_margin_loss (a clamp's passes there, and equal logits put every hinge at 0).
Tensor positive_part(const Tensor& z) { return where(z.gt(0), z, 0.0); }

// x (*, n) -> a detached (*, 1) that broadcasts against x: [i == j] for j the last-dim index.
Tensor is_index(const Tensor& index_column, int64_t n) {
  return arange(n, kInt64, index_column.device()).eq(index_column);
}

}  // namespace

Tensor soft_margin_loss(const Tensor& input, const Tensor& target, const LossOptions& options) {
  const auto again = [&](const Tensor& x, const Tensor& t) { return soft_margin_loss(x, t, options); };
  if (auto cast = under_autocast(autocast::Op::SoftMarginLoss, again, input, target)) return *cast;
  const char* op = "soft_margin_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_regression(input, target, op);
  return reduce(softplus(-input * target, 1.0, INFINITY), r);  // log1p(exp(-y x)) without its overflow
}

Tensor margin_ranking_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                           const MarginRankingLossOptions& options) {
  const auto again = [&](const Tensor& a, const Tensor& b, const Tensor& t) {
    return margin_ranking_loss(a, b, t, options);
  };
  if (auto cast = under_autocast(autocast::Op::MarginRankingLoss, again, input1, input2, target)) return *cast;
  const char* op = "margin_ranking_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_floating_input(input1, op, "input1");
  check_floating_input(input2, op, "input2");
  KILN_CHECK(input1.dim() == input2.dim() && input1.dim() == target.dim(),
             "{}: input1, input2 and target must have one number of dims, got shapes {}, {} and {}", op,
             input1.sizes().str(), input2.sizes().str(), target.sizes().str());
  return reduce((-target * (input1 - input2) + options.margin).clamp(0.0), r);
}

Tensor hinge_embedding_loss(const Tensor& input, const Tensor& target, const HingeEmbeddingLossOptions& options) {
  const auto again = [&](const Tensor& x, const Tensor& t) { return hinge_embedding_loss(x, t, options); };
  if (auto cast = under_autocast(autocast::Op::HingeEmbeddingLoss, again, input, target)) return *cast;
  const char* op = "hinge_embedding_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_floating_input(input, op);
  check_same_shape(input, target, op);
  Tensor below_margin = (options.margin - input).clamp(0.0);
  return reduce(where(target.ne(1), below_margin, 0.0) + where(target.ne(-1), input, 0.0), r);
}

Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                             const CosineEmbeddingLossOptions& options) {
  const auto again = [&](const Tensor& a, const Tensor& b, const Tensor& t) {
    return cosine_embedding_loss(a, b, t, options);
  };
  if (auto cast = under_autocast(autocast::Op::CosineEmbeddingLoss, again, input1, input2, target)) return *cast;
  const char* op = "cosine_embedding_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_floating_input(input1, op, "input1");
  check_floating_input(input2, op, "input2");
  KILN_CHECK(target.dim() <= 1, "{}: target must be 0-D or 1-D (one label per pair), got shape {}", op,
             target.sizes().str());
  const int d = target.dim();  // the feature dim
  KILN_CHECK(input1.dim() == d + 1 && input1.sizes() == input2.sizes() && (d == 0 || input1.size(0) == target.size(0)),
             "{}: a target of shape {} needs input1 and input2 of one shape {}, got {} and {}", op,
             target.sizes().str(), d == 0 ? std::string("(D)") : fmt::format("({}, D)", target.size(0)),
             input1.sizes().str(), input2.sizes().str());
  constexpr double kEps = 1e-12;  // PyTorch's, added to each squared magnitude
  Tensor dot = (input1 * input2).sum({d});
  Tensor cos = dot / (((input1 * input1).sum({d}) + kEps) * ((input2 * input2).sum({d}) + kEps)).sqrt();
  Tensor loss = where(target.eq(1), 1.0 - cos, 0.0) + where(target.eq(-1), (cos - options.margin).clamp(0.0), 0.0);
  return reduce(loss, r);
}

Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target,
                                   const MultiLabelSoftMarginLossOptions& options) {
  const char* op = "multilabel_soft_margin_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_floating_input(input, op);
  KILN_CHECK(input.dim() >= 1, "{}: input must be (N, C) or (C), got a 0-dimensional tensor", op);
  check_same_shape(input, target, op);
  Tensor loss = -(target * logsigmoid(input) + (1.0 - target) * logsigmoid(-input));
  if (options.weight.defined()) {
    check_element_weight(options.weight, input, "multilabel_soft_margin_loss: weight");
    loss = loss * options.weight;
  }
  const int cdim = input.dim() - 1;
  return reduce(loss.sum({cdim}) / static_cast<double>(input.size(cdim)), r);
}

Tensor multilabel_margin_loss(const Tensor& input, const Tensor& target, const LossOptions& options) {
  const auto again = [&](const Tensor& x) { return multilabel_margin_loss(x, target, options); };
  if (auto cast = under_autocast(autocast::Op::MultilabelMarginLoss, again, input)) return *cast;
  const char* op = "multilabel_margin_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_class_matrix(input, op);
  check_index_dtype(target, op);
  check_same_shape(input, target, op);
  const int64_t classes = input.size(-1);
  check_class_targets(target, classes, std::nullopt, op, -1);
  const Tensor x = input.dim() == 1 ? input.unsqueeze(0) : input;  // (N, C)
  // (N, K), K the longest list: which target entries precede the row's first -1; them, else 0. (N, C):
  // which classes are targets.
  Tensor listed, safe, is_target;
  {
    NoGradGuard no_grad;
    const Tensor t = (target.dim() == 1 ? target.unsqueeze(0) : target).to(kInt64);
    const Tensor ended = t.lt(0);
    const Tensor first_end = where(ended.any(1, true), ended.to(kInt64).argmax(1, true), classes);
    const int64_t longest = x.size(0) == 0 ? 0 : first_end.max().item<int64_t>();  // the hinges cover K rows, not C
    listed = arange(longest, kInt64, t.device()).lt(first_end);
    safe = t.narrow(1, 0, longest).masked_fill(listed.logical_not(), 0);
    is_target = zeros(x.sizes(), x.options()).scatter_add(1, safe, listed.to(x.dtype())).gt(0);
  }
  // hinge[n, k, i] = max(0, 1 - x[n, target k] + x[n, i]), for listed k and non-target classes i.
  const Tensor hinge = positive_part(1.0 - x.gather(1, safe).unsqueeze(2) + x.unsqueeze(1));
  const Tensor counted = listed.unsqueeze(2).logical_and(is_target.logical_not().unsqueeze(1));
  Tensor loss = where(counted, hinge, 0.0).sum({1, 2}) / static_cast<double>(classes);
  return reduce(input.dim() == 1 ? loss.squeeze(0) : loss, r);
}

Tensor multi_margin_loss(const Tensor& input, const Tensor& target, const MultiMarginLossOptions& options) {
  const auto again = [&](const Tensor& x, const Tensor& w) {
    MultiMarginLossOptions o = options;
    o.weight = w;
    return multi_margin_loss(x, target, o);
  };
  if (auto cast = under_autocast(autocast::Op::MultiMarginLoss, again, input, options.weight)) return *cast;
  const char* op = "multi_margin_loss";
  Reduction r = parse_reduction(options.reduction, op);
  KILN_CHECK(options.p == 1 || options.p == 2, "{}: p must be 1 or 2, got {}", op, options.p);
  check_class_matrix(input, op);
  check_index_dtype(target, op);
  const int64_t classes = input.size(-1), rows = input.dim() == 2 ? input.size(0) : 1;
  KILN_CHECK(target.numel() == rows && target.dim() <= 1,
             "{}: for input of shape {} the target must have shape ({}){}, got {}", op, input.sizes().str(), rows,
             rows == 1 ? " or ()" : "", target.sizes().str());
  if (options.weight.defined()) check_class_weight(options.weight, input, classes, op);
  check_class_targets(target, classes, std::nullopt, op);
  const Tensor x = input.reshape({rows, classes});
  const Tensor y = target.reshape({rows, 1}).to(kInt64);
  Tensor hinge = positive_part(options.margin - x.gather(1, y) + x);  // (N, C); its target column is dropped below
  if (options.p == 2) hinge = hinge.square();
  if (options.weight.defined()) hinge = hinge * options.weight.index_select(0, y.reshape({-1})).unsqueeze(1);
  Tensor loss = hinge.masked_fill(is_index(y, classes), 0.0).sum({1}) / static_cast<double>(classes);
  return reduce(loss.reshape(target.sizes()), r);
}

Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           const TripletMarginLossOptions& options) {
  const auto again = [&](const Tensor& a, const Tensor& p, const Tensor& n) {
    return triplet_margin_loss(a, p, n, options);
  };
  if (auto cast = under_autocast(autocast::Op::TripletMarginLoss, again, anchor, positive, negative)) return *cast;
  const char* op = "triplet_margin_loss";
  Reduction r = parse_reduction(options.reduction, op);
  KILN_CHECK(anchor.dim() == positive.dim() && anchor.dim() == negative.dim(),
             "{}: anchor, positive and negative must have one number of dims, got shapes {}, {} and {}", op,
             anchor.sizes().str(), positive.sizes().str(), negative.sizes().str());
  const PairwiseDistanceOptions d{.p = options.p, .eps = options.eps};
  Tensor to_negative = pairwise_distance(anchor, negative, d);
  if (options.swap) to_negative = minimum(to_negative, pairwise_distance(positive, negative, d));
  return reduce((pairwise_distance(anchor, positive, d) - to_negative + options.margin).clamp(0.0), r);
}

Tensor triplet_margin_with_distance_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                                         const TripletMarginWithDistanceLossOptions& options) {
  const char* op = "triplet_margin_with_distance_loss";
  Reduction r = parse_reduction(options.reduction, op);
  const auto distance = [&](const Tensor& a, const Tensor& b) {
    return options.distance_function ? options.distance_function(a, b) : pairwise_distance(a, b);
  };
  Tensor to_positive = distance(anchor, positive), to_negative = distance(anchor, negative);
  if (options.swap) to_negative = minimum(to_negative, distance(positive, negative));
  KILN_CHECK(to_positive.sizes() == to_negative.sizes(),
             "{}: the distance function gave shapes {} and {} for the positive and negative pairs; it must give "
             "one distance per pair",
             op, to_positive.sizes().str(), to_negative.sizes().str());
  return reduce((to_positive - to_negative + options.margin).clamp(0.0), r);
}

Tensor poisson_nll_loss(const Tensor& input, const Tensor& target, const PoissonNLLLossOptions& options) {
  const auto again = [&](const Tensor& x, const Tensor& t) { return poisson_nll_loss(x, t, options); };
  if (auto cast = under_autocast(autocast::Op::PoissonNllLoss, again, input, target)) return *cast;
  const char* op = "poisson_nll_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_regression(input, target, op);
  Tensor loss = options.log_input ? input.exp() - target * input : input - target * (input + options.eps).log();
  if (options.full) {
    // Stirling's approximation of log(target!), where target > 1 only. The log reads 2 elsewhere, so
    // that no 0 * -inf of target = 0 reaches the gradient (PyTorch's masked_fill leaves a NaN there).
    const Tensor above_one = target.gt(1);
    const Tensor t = where(above_one, target, 2.0);
    loss = loss + where(above_one, t * t.log() - t + 0.5 * (t * (2 * M_PI)).log(), 0.0);
  }
  return reduce(loss, r);
}

Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var,
                         const GaussianNLLLossOptions& options) {
  const char* op = "gaussian_nll_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_regression(input, target, op);
  check_floating_input(var, op, "var");
  Tensor v = var;
  if (var.sizes() != input.sizes()) {
    Shape rows = input.sizes();
    if (input.dim() >= 1) rows.erase(input.dim() - 1);
    const bool per_row = input.dim() >= 1 && var.sizes() == rows;
    bool per_row_column = false;
    if (input.dim() >= 1 && var.dim() == input.dim() && var.size(-1) == 1) {
      Shape var_rows = var.sizes();
      var_rows.erase(var.dim() - 1);
      per_row_column = var_rows == rows;
    }
    KILN_CHECK(per_row || per_row_column,
               "{}: var of shape {} must have the input's shape {}, or that without the last dim, or with a last "
               "dim of 1",
               op, var.sizes().str(), input.sizes().str());
    if (per_row) v = var.unsqueeze(-1);
  }
  {
    NoGradGuard no_grad;
    KILN_CHECK(!var.lt(0).any().item<bool>(), "{}: var has negative entries; variances must be >= 0", op);
  }
  // max(var, eps) in value, with var's gradient passed through unchanged where it is clamped: PyTorch
  // clamps a clone in place under no_grad.
  v = v + (v.clamp(options.eps) - v).detach();
  Tensor loss = 0.5 * (v.log() + (input - target).square() / v);
  if (options.full) loss = loss + 0.5 * std::log(2 * M_PI);
  return reduce(loss, r);
}

// Note [ctc as ops]
// CTC's forward recursion (Graves et al., 2006, eq. 6-7) over the extended target l' = (blank, t1,
// blank, t2, ..., blank) of L = 2S + 1 states, in log space, for the whole batch at once: alpha (N, L)
// starts as log 1 at state 0 "before frame 0", and each frame t sets
//   alpha[s] <- logsumexp(alpha[s], alpha[s - 1], alpha[s - 2] where l'[s] is a label unlike l'[s - 2])
//               + log_probs[t, l'[s]]
// for the samples with t < input_length; the others keep theirs, so each sample's alpha ends at its own
// last frame. The loss is -logsumexp(alpha[L_n - 1], alpha[L_n - 2]) with L_n = 2 target_length + 1.
// Each frame is a few ops on (N, L), and autograd differentiates the recursion: that is the
// forward-backward algorithm's beta pass, without writing it. Unreachable states hold kUnreachable
// (-1e30) instead of -inf, so that a logsumexp of unreachable states has a finite gradient (0 / 0 with
// -inf); a loss still at that size is an impossible alignment, returned as inf (or 0) with no gradient.
// That is ctc_loss with fusion off (set_fusion(false)), and the reference of the fused kernels that
// run while it is on (ops::ctc_nll: cpu/ctc.cpp, cuda/ctc.cu), which do the same recursion state by
// state, then the beta pass and the gradient, instead of a dozen ops on (N, L) per frame each way.
namespace {
constexpr double kUnreachable = -1e30;

// A length per sample, on the host.
std::vector<int64_t> host_lengths(const Tensor& lengths, int64_t samples, bool batched, const char* what) {
  KILN_CHECK(!lengths.is_floating_point() && lengths.dtype() != kBool, "ctc_loss: {} must be an integer tensor, got {}",
             what, dtype_name(lengths.dtype()));
  KILN_CHECK(batched ? lengths.dim() == 1 && lengths.size(0) == samples : lengths.numel() == 1,
             "ctc_loss: {} must have {}, got shape {}", what,
             batched ? fmt::format("one entry per sample: shape ({})", samples) : std::string("one entry"),
             lengths.sizes().str());
  return lengths.to_vector<int64_t>();
}

// ops::ctc_nll's loss (N) composed from ops (Note [ctc as ops]): padded (N, S) the labels, lengths
// (N, 1) the target lengths, in_len on the host; >= -kUnreachable / 2 where the target is impossible.
Tensor ctc_nll_composed(const Tensor& lp, const Tensor& padded, const Tensor& lengths,
                        const std::vector<int64_t>& in_len, int64_t frames_used, int64_t blank) {
  const int64_t frames = lp.size(0), samples = lp.size(1), classes = lp.size(2), longest = padded.size(1);
  const Device device = lp.device();
  const TensorOptions index_options = TensorOptions(kInt64).device(device);
  const Tensor listed = arange(longest, kInt64, device).lt(lengths);  // (N, S)
  {
    NoGradGuard no_grad;
    Tensor bad = listed.logical_and(padded.lt(0).logical_or(padded.ge(classes)));
    KILN_CHECK(!bad.any().item<bool>(), "ctc_loss: a target is not a class index in [0, {})", classes);
  }
  const Tensor labels = padded.masked_fill(listed.logical_not(), blank);

  // The extended targets (N, L) and where a state may be reached from two states back.
  const int64_t states = 2 * longest + 1;
  const Tensor blanks = full({samples, longest}, blank, index_options);
  const Tensor extended =
      cat({stack({blanks, labels}, 2).view({samples, 2 * longest}), full({samples, 1}, blank, index_options)}, 1);
  Tensor skip = zeros({samples, states}, TensorOptions(kBool).device(device));
  if (states > 2) {
    const Tensor from = extended.narrow(1, 0, states - 2), to = extended.narrow(1, 2, states - 2);
    skip = cat({skip.narrow(1, 0, 2), to.ne(blank).logical_and(to.ne(from))}, 1);
  }
  const Tensor emit = lp.gather(2, extended.unsqueeze(0).expand({frames, samples, states}).contiguous());  // (T, N, L)

  const TensorOptions value_options = lp.options();
  const Tensor unreachable_column = full({samples, 1}, kUnreachable, value_options);
  Tensor alpha = cat({zeros({samples, 1}, value_options), full({samples, states - 1}, kUnreachable, value_options)}, 1);
  const Tensor frames_of = from_vector(in_len, {samples, 1}, device);
  for (int64_t t = 0; t < frames_used; ++t) {
    const Tensor stay = alpha;
    const Tensor step = cat({unreachable_column, alpha.narrow(1, 0, states - 1)}, 1);
    const Tensor jump =
        states > 2 ? where(skip, cat({unreachable_column, unreachable_column, alpha.narrow(1, 0, states - 2)}, 1),
                           kUnreachable)
                   : full({samples, states}, kUnreachable, value_options);
    const Tensor next = logsumexp(stack({stay, step, jump}), {0}) + emit.select(0, t);
    alpha = where(frames_of.gt(t), next, alpha);
  }
  // The last state and the one before it (a final blank, or the last label) of each sample.
  const Tensor last = lengths * 2;                          // L_n - 1
  const Tensor ends = cat({last, (last - 1).clamp(0)}, 1);  // (N, 2)
  const Tensor no_label =
      cat({zeros({samples, 1}, TensorOptions(kBool).device(device)), lengths.eq(0)}, 1);  // no state L_n - 2
  const Tensor end_alpha = alpha.gather(1, ends).masked_fill(no_label, kUnreachable);
  return -logsumexp(end_alpha, {1});
}
}  // namespace

Tensor ctc_loss(const Tensor& log_probs, const Tensor& targets, const Tensor& input_lengths,
                const Tensor& target_lengths, const CTCLossOptions& options) {
  const auto again = [&](const Tensor& lp) { return ctc_loss(lp, targets, input_lengths, target_lengths, options); };
  if (auto cast = under_autocast(autocast::Op::CtcLoss, again, log_probs)) return *cast;
  const char* op = "ctc_loss";
  Reduction r = parse_reduction(options.reduction, op);
  check_floating_input(log_probs, op, "log_probs");
  KILN_CHECK(log_probs.dim() == 3 || log_probs.dim() == 2,
             "{}: log_probs must be (T, N, C) or (T, C) (frames, samples, classes), got shape {}", op,
             log_probs.sizes().str());
  const bool batched = log_probs.dim() == 3;
  // 16-bit log-probabilities in float32 (the sentinel and the sums need its range), the loss in their dtype.
  const bool low = log_probs.dtype() == kFloat16 || log_probs.dtype() == kBFloat16;
  const Tensor lp = (low ? log_probs.to(kFloat32) : log_probs).view(
      {log_probs.size(0), batched ? log_probs.size(1) : 1, log_probs.size(-1)});
  const int64_t frames = lp.size(0), samples = lp.size(1), classes = lp.size(2);
  KILN_CHECK(frames >= 1 && classes >= 1, "{}: log_probs of shape {} has no frames or no classes", op,
             log_probs.sizes().str());
  KILN_CHECK(options.blank >= 0 && options.blank < classes, "{}: blank {} is not a class index in [0, {})", op,
             options.blank, classes);
  const std::vector<int64_t> in_len = host_lengths(input_lengths, samples, batched, "input_lengths");
  const std::vector<int64_t> tgt_len = host_lengths(target_lengths, samples, batched, "target_lengths");
  int64_t longest = 0, total = 0, frames_used = 0;
  for (int64_t n = 0; n < samples; ++n) {
    KILN_CHECK(in_len[n] >= 0 && in_len[n] <= frames,
               "{}: input_lengths[{}] is {}; it must be in [0, {}], the frames of log_probs", op, n, in_len[n], frames);
    KILN_CHECK(tgt_len[n] >= 0, "{}: target_lengths[{}] is {}; it must be >= 0", op, n, tgt_len[n]);
    longest = std::max(longest, tgt_len[n]);
    frames_used = std::max(frames_used, in_len[n]);
    total += tgt_len[n];
  }
  check_index_dtype(targets, op);
  // The targets as (N, longest) int64, with the blank past each sample's length.
  Tensor padded;
  if (targets.dim() == 1) {  // concatenated (an unbatched target is one sample's)
    KILN_CHECK(targets.numel() == total, "{}: the 1-D targets hold {} labels but target_lengths sum to {}", op,
               targets.numel(), total);
    std::vector<int64_t> at(samples * longest, 0);  // where each (n, s) is in targets
    for (int64_t n = 0, offset = 0; n < samples; offset += tgt_len[n], ++n) {
      for (int64_t s = 0; s < tgt_len[n]; ++s) at[n * longest + s] = offset + s;
    }
    padded = total == 0 ? zeros({samples, longest}, TensorOptions(kInt64).device(targets.device()))
                        : targets.to(kInt64).index_select(0, from_vector(at, {samples * longest}, targets.device()))
                              .view({samples, longest});
  } else {
    KILN_CHECK(targets.dim() == 2 && targets.size(0) == samples, "{}: targets must be {}, got shape {}", op,
               batched ? fmt::format("({}, S) padded or 1-D concatenated", samples)
                       : std::string("(S) or (1, S) (unbatched)"),
               targets.sizes().str());
    KILN_CHECK(longest <= targets.size(-1), "{}: a target length of {} exceeds the targets' {} columns", op, longest,
               targets.size(-1));
    padded = targets.to(kInt64).narrow(1, 0, longest);
  }
  const Device device = lp.device();
  padded = padded.to(device);  // targets may be on the CPU for log_probs on a GPU, as in PyTorch
  const Tensor lengths = from_vector(tgt_len, {samples, 1}, device);
  Tensor loss = fusion_enabled()  // (N), >= -kUnreachable / 2 (inf from the kernel) where impossible
                    ? ops::ctc_nll(lp, padded, from_vector(in_len, {samples}, device), lengths.view({samples}),
                                   options.blank)
                    : ctc_nll_composed(lp, padded, lengths, in_len, frames_used, options.blank);
  const Tensor impossible = loss.detach().ge(-kUnreachable / 2);
  loss = where(impossible.logical_not(), loss, options.zero_infinity ? 0.0 : INFINITY);
  if (!batched) loss = loss.squeeze(0);
  switch (r) {
    case Reduction::Mean:
      loss = (loss / lengths.reshape(loss.sizes()).clamp(1).to(loss.dtype())).mean();
      break;
    case Reduction::Sum: loss = loss.sum(); break;
    case Reduction::None: break;
  }
  return low ? loss.to(log_probs.dtype()) : loss;
}

// ---- distances ----

Tensor normalize(const Tensor& input, const NormalizeOptions& options) {
  return input / input.norm(options.p, {options.dim}, true).clamp(options.eps);
}

namespace {

// Note [cosine similarity's clamped norm]
// PyTorch 1.13's cosine_similarity divides each input by its 2-norm clamped at eps, clamping in place
// under no_grad: the value is max(|x|, eps), and the gradient the norm's backward evaluated at that
// clamped value, x / max(|x|, eps). Below eps that is neither an ordinary clamp's 0 nor x / |x|, and
// no function has that value with that gradient. So where the norm is below eps it is written as
//   h = |x|^2 / (2 eps) + eps / 2   (|x|^2 as the norm squared: one pass over x, not two),
// whose gradient is x / eps, plus (eps - h) detached, which makes the value eps. Elsewhere it is the
// norm itself, so value, gradient and second derivative are the plain norm's; a zero vector gets
// PyTorch's finite gradient (1 / eps times the other input's direction).
Tensor clamped_norm(const Tensor& x, int64_t dim, double eps) {
  const Tensor norm = x.norm(2, {dim}, true);
  const Tensor h = norm.square() / (2 * eps) + eps / 2;  // |x|^2 through the norm: its gradient is x / eps too
  return where(norm.detach().ge(eps), norm, h + (eps - h).detach());
}

}  // namespace

Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, const CosineSimilarityOptions& options) {
  const auto again = [&](const Tensor& a, const Tensor& b) { return cosine_similarity(a, b, options); };
  if (auto cast = under_autocast(autocast::Op::CosineSimilarity, again, x1, x2)) return *cast;
  const char* op = "cosine_similarity";
  KILN_CHECK(x1.is_floating_point() || x2.is_floating_point(),
             "{}: x1 or x2 must be floating (the other is promoted to it), got {} and {}", op,
             dtype_name(x1.dtype()), dtype_name(x2.dtype()));
  const Shape shape = broadcast_shapes(x1.sizes(), x2.sizes(), op);
  KILN_CHECK(shape.size() >= 1, "{}: x1 and x2 are 0-dimensional; they need a dim to compare along", op);
  const int64_t dim = options.dim < 0 ? options.dim + static_cast<int64_t>(shape.size()) : options.dim;
  KILN_CHECK(dim >= 0 && dim < static_cast<int64_t>(shape.size()), "{}: dim {} is out of range for shapes {} and {}",
             op, options.dim, x1.sizes().str(), x2.sizes().str());
  // 16-bit inputs in float32 (as PyTorch's norms accumulate), the result in their dtype.
  const DType dtype = result_type(x1, x2);
  const bool low = dtype == kFloat16 || dtype == kBFloat16;
  const DType compute = low ? kFloat32 : dtype;
  const Tensor a = x1.to(compute).expand(shape), b = x2.to(compute).expand(shape);
  const Tensor cos = ((a / clamped_norm(a, dim, options.eps)) * (b / clamped_norm(b, dim, options.eps))).sum({dim});
  return low ? cos.to(dtype) : cos;
}

Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, const PairwiseDistanceOptions& options) {
  const int last = std::max(x1.dim(), x2.dim()) - 1;
  const Tensor d = x1 - x2 + options.eps;
  return last < 0 ? d.norm(options.p, {}, options.keepdim) : d.norm(options.p, {last}, options.keepdim);
}

}  // namespace functional
}  // namespace kiln::nn

namespace kiln::nn {

// ---- the modules ----

Tensor Loss::forward(const Tensor&) {
  KILN_FAIL("nn::{}: this loss takes {} tensors, not one: call it with all of them (its forward in nn/loss.h)",
            name(), arity_);
}

Tensor Loss::weight_buffer(const std::string& name, const Tensor& weight) {
  return weight.defined() ? register_buffer(name, weight) : weight;
}

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyOptions options) : Loss(2), options(std::move(options)) {
  weight_buffer("weight", this->options.weight);
}
NLLLoss::NLLLoss(NLLLossOptions options) : Loss(2), options(std::move(options)) {
  weight_buffer("weight", this->options.weight);
}
BCELoss::BCELoss(BCELossOptions options) : Loss(2), options(std::move(options)) {
  weight_buffer("weight", this->options.weight);
}
BCEWithLogitsLoss::BCEWithLogitsLoss(BCEWithLogitsLossOptions options) : Loss(2), options(std::move(options)) {
  weight_buffer("weight", this->options.weight);
  weight_buffer("pos_weight", this->options.pos_weight);
}
MultiLabelSoftMarginLoss::MultiLabelSoftMarginLoss(MultiLabelSoftMarginLossOptions options)
    : Loss(2), options(std::move(options)) {
  weight_buffer("weight", this->options.weight);
}
MultiMarginLoss::MultiMarginLoss(MultiMarginLossOptions options) : Loss(2), options(std::move(options)) {
  weight_buffer("weight", this->options.weight);
}

Tensor L1Loss::forward(const Tensor& input, const Tensor& target) { return l1_loss(input, target, options); }
Tensor MSELoss::forward(const Tensor& input, const Tensor& target) { return mse_loss(input, target, options); }
Tensor SmoothL1Loss::forward(const Tensor& input, const Tensor& target) {
  return smooth_l1_loss(input, target, options);
}
Tensor HuberLoss::forward(const Tensor& input, const Tensor& target) { return huber_loss(input, target, options); }
Tensor SoftMarginLoss::forward(const Tensor& input, const Tensor& target) {
  return soft_margin_loss(input, target, options);
}
Tensor KLDivLoss::forward(const Tensor& input, const Tensor& target) { return kl_div(input, target, options); }
Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  return cross_entropy(input, target, options);
}
Tensor NLLLoss::forward(const Tensor& input, const Tensor& target) { return nll_loss(input, target, options); }
Tensor BCELoss::forward(const Tensor& input, const Tensor& target) {
  return binary_cross_entropy(input, target, options);
}
Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) {
  return binary_cross_entropy_with_logits(input, target, options);
}
Tensor MultiLabelSoftMarginLoss::forward(const Tensor& input, const Tensor& target) {
  return multilabel_soft_margin_loss(input, target, options);
}
Tensor MultiLabelMarginLoss::forward(const Tensor& input, const Tensor& target) {
  return multilabel_margin_loss(input, target, options);
}
Tensor MultiMarginLoss::forward(const Tensor& input, const Tensor& target) {
  return multi_margin_loss(input, target, options);
}
Tensor HingeEmbeddingLoss::forward(const Tensor& input, const Tensor& target) {
  return hinge_embedding_loss(input, target, options);
}
Tensor PoissonNLLLoss::forward(const Tensor& log_input, const Tensor& target) {
  return poisson_nll_loss(log_input, target, options);
}
Tensor MarginRankingLoss::forward(const Tensor& input1, const Tensor& input2, const Tensor& target) {
  return margin_ranking_loss(input1, input2, target, options);
}
Tensor CosineEmbeddingLoss::forward(const Tensor& input1, const Tensor& input2, const Tensor& target) {
  return cosine_embedding_loss(input1, input2, target, options);
}
Tensor TripletMarginLoss::forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative) {
  return triplet_margin_loss(anchor, positive, negative, options);
}
Tensor TripletMarginWithDistanceLoss::forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative) {
  return triplet_margin_with_distance_loss(anchor, positive, negative, options);
}
Tensor GaussianNLLLoss::forward(const Tensor& input, const Tensor& target, const Tensor& var) {
  return gaussian_nll_loss(input, target, var, options);
}
Tensor CTCLoss::forward(const Tensor& log_probs, const Tensor& targets, const Tensor& input_lengths,
                        const Tensor& target_lengths) {
  return ctc_loss(log_probs, targets, input_lengths, target_lengths, options);
}

Tensor CosineSimilarity::forward(const Tensor&) {
  KILN_FAIL("nn::CosineSimilarity: forward takes two inputs: call it as similarity(x1, x2)");
}
Tensor PairwiseDistance::forward(const Tensor&) {
  KILN_FAIL("nn::PairwiseDistance: forward takes two inputs: call it as distance(x1, x2)");
}

}  // namespace kiln::nn

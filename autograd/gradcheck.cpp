// autograd/gradcheck.cpp: finite-difference gradient checks in float64.
//
// With a random cotangent v for each output, the backward gives the vector-Jacobian product
// v^T J for every input element at once; central differences give it one element at a time:
//   numeric_k = sum_j < v_j, (f_j(x + eps e_k) - f_j(x - eps e_k)) / (2 eps) >
// A random v (not ones) catches a gradient that is right in sum but wrongly placed.
#include <algorithm>
#include <cmath>

#include "autograd/autograd.h"
#include "ops/ops.h"

namespace kiln::autograd {
namespace {

double vjp_dot(const TensorList& outs, const TensorList& vs) {
  double total = 0;
  for (size_t j = 0; j < outs.size(); ++j) {
    if (!vs[j].defined()) continue;
    total += (outs[j].detach().to(kFloat64) * vs[j]).sum().item<double>();
  }
  return total;
}

}  // namespace

bool gradcheck(const DifferentiableFn& fn, const TensorList& inputs, const GradcheckOptions& opt) {
  KILN_CHECK(fn != nullptr, "gradcheck: the function is empty; pass a callable");
  KILN_CHECK(opt.eps > 0 && std::isfinite(opt.eps),
             "gradcheck: eps must be a positive finite step, got {}; 1e-6 (the default) suits float64", opt.eps);
  // As PyTorch: with no input requiring grad there is nothing to check, and passing would say nothing.
  KILN_CHECK(std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.defined() && t.requires_grad(); }),
             "gradcheck: no input requires grad, so there is no gradient to check; call requires_grad_() on the "
             "float64 inputs to check");
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(!inputs[i].defined() || !inputs[i].requires_grad() || inputs[i].dtype() == kFloat64,
               "gradcheck: input {} is {}; finite differences need float64 inputs (x.to(kFloat64))", i,
               dtype_name(inputs[i].dtype()));
    KILN_CHECK(!inputs[i].defined() || inputs[i].is_cpu(),
               "gradcheck: input {} is on {}; run the check on CPU inputs (the function may move them)", i,
               inputs[i].device().str());
  }
  TensorList outs = fn(inputs);
  Generator gen(opt.seed);
  TensorList vs, diff_outs, diff_vs;
  for (const auto& o : outs) {
    Tensor v = (o.defined() && o.is_floating_point()) ? randn(o.sizes(), TensorOptions(kFloat64).device(o.device()), &gen)
                                                      : Tensor();
    vs.push_back(v);
    if (v.defined() && o.requires_grad()) {
      diff_outs.push_back(o);
      diff_vs.push_back(v.to(o.dtype()));
    }
  }
  TensorList wrt;
  std::vector<size_t> wrt_index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      wrt.push_back(inputs[i]);
      wrt_index.push_back(i);
    }
  }
  TensorList analytic;
  if (!diff_outs.empty() && !wrt.empty()) analytic = grad(diff_outs, wrt, diff_vs, false, false, true);
  analytic.resize(wrt.size());

  // The numeric side perturbs copies, one element at a time. They keep requires_grad, since fn may
  // itself differentiate (gradgradcheck's fn does).
  TensorList probe;
  for (const auto& t : inputs) {
    probe.push_back(t.defined() ? t.detach().clone().requires_grad_(t.requires_grad()) : t);
  }
  for (size_t w = 0; w < wrt.size(); ++w) {
    Tensor& x = probe[wrt_index[w]];
    Tensor a = analytic[w].defined() ? analytic[w].to(kFloat64).contiguous() : zeros(x.sizes(), kFloat64);
    double* px = x.data_ptr<double>();
    const double* pa = a.to(Device::cpu()).data_ptr<double>();
    for (int64_t k = 0; k < x.numel(); ++k) {
      double orig = px[k];
      px[k] = orig + opt.eps;
      double plus = vjp_dot(fn(probe), vs);
      px[k] = orig - opt.eps;
      double minus = vjp_dot(fn(probe), vs);
      px[k] = orig;
      double numeric = (plus - minus) / (2 * opt.eps);
      if (!(std::fabs(pa[k] - numeric) <= opt.atol + opt.rtol * std::fabs(numeric))) {
        if (!opt.raise_exception) return false;
        KILN_FAIL("gradcheck: the gradient of input {} disagrees at element {}: analytic {:.10g}, numeric {:.10g} "
                  "(|diff| {:.3g} > atol {} + rtol {} * |numeric|)",
                  wrt_index[w], k, pa[k], numeric, std::fabs(pa[k] - numeric), opt.atol, opt.rtol);
      }
    }
  }
  return true;
}

bool gradgradcheck(const DifferentiableFn& fn, const TensorList& inputs, const GradcheckOptions& opt) {
  KILN_CHECK(fn != nullptr, "gradgradcheck: the function is empty; pass a callable");
  // G(inputs, v) = d<fn(inputs), v>/d inputs, built with create_graph so it can be differentiated.
  TensorList outs = fn(inputs);
  Generator gen(opt.seed + 1);
  TensorList extended = inputs;
  size_t n_out = 0;
  for (const auto& o : outs) {
    if (o.defined() && o.requires_grad()) {
      extended.push_back(randn(o.sizes(), TensorOptions(kFloat64).device(o.device()), &gen).requires_grad_());
      ++n_out;
    }
  }
  const size_t n_in = inputs.size();
  auto vjp = [&fn, n_in, n_out](const TensorList& args) -> TensorList {
    TensorList xs(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(n_in));
    TensorList vs(args.begin() + static_cast<std::ptrdiff_t>(n_in), args.end());
    TensorList ys = fn(xs), diff_ys;
    for (const auto& y : ys)
      if (y.defined() && y.requires_grad()) diff_ys.push_back(y);
    TensorList wrt;
    for (const auto& x : xs)
      if (x.defined() && x.requires_grad()) wrt.push_back(x);
    if (diff_ys.empty() || wrt.empty() || diff_ys.size() != n_out) return {};
    TensorList gs = grad(diff_ys, wrt, vs, true, true, true);
    TensorList out;
    for (size_t i = 0; i < gs.size(); ++i) out.push_back(gs[i].defined() ? gs[i] : zeros_like(wrt[i]));
    return out;
  };
  GradcheckOptions inner = opt;
  inner.seed = opt.seed + 2;
  return gradcheck(vjp, extended, inner);
}

}  // namespace kiln::autograd

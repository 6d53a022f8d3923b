// optim/adam.cpp: the option checks and the update of Adam and AdamW (see adam.h for the rule).
#include "optim/adam.h"

#include <cmath>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::optim {

namespace {

std::vector<std::pair<std::string, double>> checked_options(const char* name, double lr,
                                                            double beta1, double beta2, double eps,
                                                            double weight_decay, bool amsgrad,
                                                            bool maximize, bool fused) {
  KILN_CHECK(lr >= 0, "{}: invalid learning rate {}; lr must be >= 0", name, lr);
  KILN_CHECK(eps >= 0, "{}: invalid epsilon value {}; eps must be >= 0", name, eps);
  KILN_CHECK(beta1 >= 0 && beta1 < 1,
             "{}: invalid beta parameter at index 0: {}; it must be in [0, 1)", name, beta1);
  KILN_CHECK(beta2 >= 0 && beta2 < 1,
             "{}: invalid beta parameter at index 1: {}; it must be in [0, 1)", name, beta2);
  KILN_CHECK(weight_decay >= 0, "{}: invalid weight_decay value {}; it must be >= 0", name,
             weight_decay);
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0},
          {"fused", fused ? 1.0 : 0.0}};
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Optimizer("Adam") {
  add_param_group(std::move(params), options);
}

Adam::Adam(std::vector<GroupSpec<AdamOptions>> groups) : Optimizer("Adam") {
  KILN_CHECK(!groups.empty(), "Adam: got no parameter groups");
  for (auto& group : groups) add_param_group(std::move(group.params), group.options);
}

void Adam::add_param_group(std::vector<Tensor> params, AdamOptions o) {
  add_group(std::move(params), checked_options("Adam", o.lr, o.beta1, o.beta2, o.eps,
                                               o.weight_decay, o.amsgrad, o.maximize, o.fused));
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : Adam("AdamW") {
  add_param_group(std::move(params), options);
}

AdamW::AdamW(std::vector<GroupSpec<AdamWOptions>> groups) : Adam("AdamW") {
  KILN_CHECK(!groups.empty(), "AdamW: got no parameter groups");
  for (auto& group : groups) add_param_group(std::move(group.params), group.options);
}

void AdamW::add_param_group(std::vector<Tensor> params, AdamWOptions o) {
  add_group(std::move(params), checked_options("AdamW", o.lr, o.beta1, o.beta2, o.eps,
                                               o.weight_decay, o.amsgrad, o.maximize, o.fused));
}

void Adam::step() { step_impl(false); }
void AdamW::step() { step_impl(true); }

void Adam::step_impl(bool decoupled_weight_decay) {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2");
    const double eps = group.get("eps"), weight_decay = group.get("weight_decay");
    const bool amsgrad = group.get("amsgrad") != 0, maximize = group.get("maximize") != 0;
    const bool fused = group.has("fused") && group.get("fused") != 0;
    // The fused step's batches: params of one device, dtype and step count.
    struct Batch {
      std::vector<Tensor> p, g, m, v, vmax;
    };
    std::map<std::tuple<std::string, int, int64_t>, Batch> batches;
    for (Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (fused && (p.dtype() == kFloat32 || p.dtype() == kFloat64) && p.is_contiguous() &&
          grad.dtype() == p.dtype() && grad.device() == p.device()) {
        ParamState& st = state(p);
        if (st.buffers.empty()) {
          st.buffers.insert("exp_avg", zeros_like(p));
          st.buffers.insert("exp_avg_sq", zeros_like(p));
          if (amsgrad) st.buffers.insert("max_exp_avg_sq", zeros_like(p));
        }
        Batch& b = batches[{p.device().str(), static_cast<int>(p.dtype()), ++st.step}];
        b.p.push_back(p);
        b.g.push_back(grad.contiguous());
        b.m.push_back(st.buffers.at("exp_avg"));
        b.v.push_back(st.buffers.at("exp_avg_sq"));
        if (amsgrad) b.vmax.push_back(st.buffers.at("max_exp_avg_sq"));
        continue;
      }
      if (maximize) grad = neg(grad);
      ParamState& st = state(p);
      if (st.buffers.empty()) {
        st.buffers.insert("exp_avg", zeros_like(p));
        st.buffers.insert("exp_avg_sq", zeros_like(p));
        if (amsgrad) st.buffers.insert("max_exp_avg_sq", zeros_like(p));
      }
      Tensor exp_avg = st.buffers.at("exp_avg"), exp_avg_sq = st.buffers.at("exp_avg_sq");
      const double t = static_cast<double>(++st.step);

      if (decoupled_weight_decay) {
        p.mul_(1 - lr * weight_decay);
      } else if (weight_decay != 0) {
        grad = add(grad, p, weight_decay);
      }
      exp_avg.mul_(beta1).add_(grad, 1 - beta1);
      exp_avg_sq.mul_(beta2).add_(grad * grad, 1 - beta2);  // addcmul_(grad, grad, 1 - beta2)

      const double step_size = lr / (1 - std::pow(beta1, t));
      const double bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, t));
      Tensor denom;
      if (amsgrad) {
        Tensor max_exp_avg_sq = st.buffers.at("max_exp_avg_sq");
        max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq));
        denom = sqrt(max_exp_avg_sq);
      } else {
        denom = sqrt(exp_avg_sq);
      }
      denom.div_(bias_correction2_sqrt).add_(eps);
      p.add_(exp_avg / denom, -step_size);  // addcdiv_(exp_avg, denom, -step_size)
    }
    for (auto& [key, b] : batches) {
      const double t = static_cast<double>(std::get<2>(key));
      AdamStepArgs args;
      args.lr = lr;
      args.beta1 = beta1;
      args.beta2 = beta2;
      args.eps = eps;
      args.weight_decay = weight_decay;
      args.step_size = lr / (1 - std::pow(beta1, t));
      args.bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, t));
      args.decoupled = decoupled_weight_decay;
      args.amsgrad = amsgrad;
      args.maximize = maximize;
      fused_adam_(b.p, b.g, b.m, b.v, b.vmax, args);
    }
  }
}

}  // namespace kiln::optim

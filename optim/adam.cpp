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
  KILN_CHECK(std::isfinite(lr) && lr >= 0, "{}: invalid learning rate {}; lr must be finite and >= 0", name, lr);
  KILN_CHECK(eps >= 0, "{}: invalid epsilon value {}; eps must be >= 0", name, eps);
  KILN_CHECK(beta1 >= 0 && beta1 < 1,
             "{}: invalid beta parameter at index 0: {}; it must be in [0, 1)", name, beta1);
  KILN_CHECK(beta2 >= 0 && beta2 < 1,
             "{}: invalid beta parameter at index 1: {}; it must be in [0, 1)", name, beta2);
  KILN_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
             "{}: invalid weight_decay value {}; it must be finite and >= 0", name,
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

void Adam::check_group(const ParamGroup& g) const {
  (void)checked_options(name_.c_str(), g.get("lr"), g.get("beta1"), g.get("beta2"), g.get("eps"),
                        g.get("weight_decay"), flag(g, "amsgrad"), flag(g, "maximize"), flag(g, "fused"));
}

std::optional<Optimizer::BufferNames> Adam::buffer_names(const ParamGroup& g) const {
  BufferNames names{{"exp_avg", "exp_avg_sq"}, {}};
  if (flag(g, "amsgrad")) names.required.emplace_back("max_exp_avg_sq");
  return names;
}

void Adam::step() { step_impl(false); }
void AdamW::step() { step_impl(true); }

void Adam::step_impl(bool decoupled_weight_decay) {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    AdamStepArgs args;  // the group's options; step_size and bias_correction2_sqrt per step count
    args.lr = group.get("lr");
    args.beta1 = group.get("beta1");
    args.beta2 = group.get("beta2");
    args.eps = group.get("eps");
    args.weight_decay = group.get("weight_decay");
    args.decoupled = decoupled_weight_decay;
    args.amsgrad = group.get("amsgrad") != 0;
    args.maximize = group.get("maximize") != 0;
    const bool fused = wants_fused(group);
    auto at_step = [&args](int64_t step) {
      AdamStepArgs a = args;
      const double t = static_cast<double>(step);
      a.step_size = a.lr / (1 - std::pow(a.beta1, t));
      a.bias_correction2_sqrt = std::sqrt(1 - std::pow(a.beta2, t));
      return a;
    };
    // The fused step's batches: params of one device, dtype and step count.
    struct Batch {
      std::vector<Tensor> p, g, m, v, vmax;
    };
    std::map<std::tuple<std::string, int, int64_t>, Batch> batches;
    for (Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ParamState& st = state(p);
      if (st.buffers.empty()) {
        st.buffers.insert("exp_avg", zeros_like(p));
        st.buffers.insert("exp_avg_sq", zeros_like(p));
        if (args.amsgrad) st.buffers.insert("max_exp_avg_sq", zeros_like(p));
      }
      Tensor exp_avg = st.buffers.at("exp_avg"), exp_avg_sq = st.buffers.at("exp_avg_sq");
      Tensor max_exp_avg_sq = args.amsgrad ? st.buffers.at("max_exp_avg_sq") : Tensor();
      const int64_t step = ++st.step;
      if (fused && fusable(p, grad)) {
        Batch& b = batches[{p.device().str(), static_cast<int>(p.dtype()), step}];
        b.p.push_back(p);
        b.g.push_back(grad.contiguous());
        b.m.push_back(exp_avg);
        b.v.push_back(exp_avg_sq);
        if (args.amsgrad) b.vmax.push_back(max_exp_avg_sq);
        continue;
      }
      const AdamStepArgs a = at_step(step);
      if (a.maximize) grad = neg(grad);
      if (a.decoupled) {
        p.mul_(1 - a.lr * a.weight_decay);
      } else if (a.weight_decay != 0) {
        grad = add(grad, p, a.weight_decay);
      }
      exp_avg.lerp_(grad.to(exp_avg.dtype()), 1 - a.beta1);  // to(): grad itself when the dtypes agree
      exp_avg_sq.mul_(a.beta2).addcmul_(grad, grad, 1 - a.beta2);
      Tensor denom;
      if (a.amsgrad) {
        max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq));
        denom = sqrt(max_exp_avg_sq);
      } else {
        denom = sqrt(exp_avg_sq);
      }
      denom.div_(a.bias_correction2_sqrt).add_(a.eps);
      p.addcdiv_(exp_avg, denom, -a.step_size);
    }
    for (auto& [key, b] : batches) fused_adam_(b.p, b.g, b.m, b.v, b.vmax, at_step(std::get<2>(key)));
  }
}

}  // namespace kiln::optim

// optim/adagrad.cpp: Adagrad's option checks and update (see adagrad.h for the rule).
#include "optim/adagrad.h"

#include <cmath>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::optim {

Adagrad::Adagrad(std::vector<Tensor> params, AdagradOptions options) : Optimizer("Adagrad") {
  add_param_group(std::move(params), options);
}

Adagrad::Adagrad(std::vector<GroupSpec<AdagradOptions>> groups) : Optimizer("Adagrad") {
  KILN_CHECK(!groups.empty(), "Adagrad: got no parameter groups");
  for (auto& group : groups) add_param_group(std::move(group.params), group.options);
}

namespace {

void check_options(const AdagradOptions& o) {
  KILN_CHECK(std::isfinite(o.lr) && o.lr >= 0, "Adagrad: invalid learning rate {}; lr must be finite and >= 0",
             o.lr);
  KILN_CHECK(std::isfinite(o.lr_decay) && o.lr_decay >= 0,
             "Adagrad: invalid lr_decay value {}; it must be finite and >= 0", o.lr_decay);
  KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
             "Adagrad: invalid weight_decay value {}; it must be finite and >= 0",
             o.weight_decay);
  KILN_CHECK(o.initial_accumulator_value >= 0,
             "Adagrad: invalid initial_accumulator_value value {}; it must be >= 0",
             o.initial_accumulator_value);
  KILN_CHECK(o.eps >= 0, "Adagrad: invalid epsilon value {}; eps must be >= 0", o.eps);
}

}  // namespace

void Adagrad::add_param_group(std::vector<Tensor> params, AdagradOptions o) {
  check_options(o);
  add_group(std::move(params), {{"lr", o.lr},
                                {"lr_decay", o.lr_decay},
                                {"eps", o.eps},
                                {"weight_decay", o.weight_decay},
                                {"initial_accumulator_value", o.initial_accumulator_value},
                                {"maximize", o.maximize ? 1.0 : 0.0}});
  // As PyTorch, every parameter gets its accumulator when it joins (even one never given a grad).
  for (const Tensor& p : groups_.back().params) {
    state(p).buffers.insert("sum", full_like(p.detach(), o.initial_accumulator_value));
  }
}

void Adagrad::check_group(const ParamGroup& g) const {
  check_options({.lr = g.get("lr"),
                 .lr_decay = g.get("lr_decay"),
                 .weight_decay = g.get("weight_decay"),
                 .initial_accumulator_value = g.get("initial_accumulator_value"),
                 .eps = g.get("eps"),
                 .maximize = flag(g, "maximize")});
}

std::optional<Optimizer::BufferNames> Adagrad::buffer_names(const ParamGroup&) const {
  return BufferNames{{"sum"}, {}};
}

void Adagrad::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.get("lr"), lr_decay = group.get("lr_decay"), eps = group.get("eps");
    const double weight_decay = group.get("weight_decay");
    const bool maximize = group.get("maximize") != 0;
    for (Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ParamState& st = state(p);
      const double t = static_cast<double>(++st.step);
      if (maximize) grad = neg(grad);
      if (weight_decay != 0) grad = add(grad, p, weight_decay);

      const double clr = lr / (1 + (t - 1) * lr_decay);
      // A parameter whose state a loaded state dict did not hold starts as at construction.
      if (!st.buffers.contains("sum")) {
        st.buffers.insert("sum", full_like(p.detach(), group.get("initial_accumulator_value")));
      }
      Tensor sum = st.buffers.at("sum");
      sum.addcmul_(grad, grad);
      Tensor std = sqrt(sum);
      std.add_(eps);
      p.addcdiv_(grad, std, -clr);
    }
  }
}

}  // namespace kiln::optim

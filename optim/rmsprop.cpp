// optim/rmsprop.cpp: RMSprop's option checks and update (see rmsprop.h for the rule).
#include "optim/rmsprop.h"

#include <cmath>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::optim {

RMSprop::RMSprop(std::vector<Tensor> params, RMSpropOptions options) : Optimizer("RMSprop") {
  add_param_group(std::move(params), options);
}

RMSprop::RMSprop(std::vector<GroupSpec<RMSpropOptions>> groups) : Optimizer("RMSprop") {
  KILN_CHECK(!groups.empty(), "RMSprop: got no parameter groups");
  for (auto& group : groups) add_param_group(std::move(group.params), group.options);
}

namespace {

void check_options(const RMSpropOptions& o) {
  KILN_CHECK(std::isfinite(o.lr) && o.lr >= 0, "RMSprop: invalid learning rate {}; lr must be finite and >= 0",
             o.lr);
  KILN_CHECK(o.eps >= 0, "RMSprop: invalid epsilon value {}; eps must be >= 0", o.eps);
  KILN_CHECK(std::isfinite(o.momentum) && o.momentum >= 0,
             "RMSprop: invalid momentum value {}; it must be finite and >= 0", o.momentum);
  KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
             "RMSprop: invalid weight_decay value {}; it must be finite and >= 0",
             o.weight_decay);
  // alpha > 1 makes square_avg = alpha v + (1 - alpha) g^2 negative, and its sqrt NaN.
  KILN_CHECK(o.alpha >= 0 && o.alpha <= 1, "RMSprop: invalid alpha value {}; it must be in [0, 1]", o.alpha);
}

}  // namespace

void RMSprop::add_param_group(std::vector<Tensor> params, RMSpropOptions o) {
  check_options(o);
  add_group(std::move(params), {{"lr", o.lr},
                                {"alpha", o.alpha},
                                {"eps", o.eps},
                                {"weight_decay", o.weight_decay},
                                {"momentum", o.momentum},
                                {"centered", o.centered ? 1.0 : 0.0},
                                {"maximize", o.maximize ? 1.0 : 0.0}});
}

void RMSprop::check_group(const ParamGroup& g) const {
  check_options({.lr = g.get("lr"),
                 .alpha = g.get("alpha"),
                 .eps = g.get("eps"),
                 .weight_decay = g.get("weight_decay"),
                 .momentum = g.get("momentum"),
                 .centered = flag(g, "centered"),
                 .maximize = flag(g, "maximize")});
}

std::optional<Optimizer::BufferNames> RMSprop::buffer_names(const ParamGroup& g) const {
  BufferNames names{{"square_avg"}, {}};
  if (g.get("momentum") > 0) names.required.emplace_back("momentum_buffer");
  if (flag(g, "centered")) names.required.emplace_back("grad_avg");
  return names;
}

void RMSprop::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.get("lr"), alpha = group.get("alpha"), eps = group.get("eps");
    const double weight_decay = group.get("weight_decay"), momentum = group.get("momentum");
    const bool centered = group.get("centered") != 0, maximize = group.get("maximize") != 0;
    for (Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (maximize) grad = neg(grad);
      ParamState& st = state(p);
      if (st.buffers.empty()) {
        st.buffers.insert("square_avg", zeros_like(p));
        if (momentum > 0) st.buffers.insert("momentum_buffer", zeros_like(p));
        if (centered) st.buffers.insert("grad_avg", zeros_like(p));
      }
      ++st.step;
      if (weight_decay != 0) grad = add(grad, p, weight_decay);

      Tensor square_avg = st.buffers.at("square_avg");
      square_avg.mul_(alpha).addcmul_(grad, grad, 1 - alpha);
      Tensor avg;
      if (centered) {
        Tensor grad_avg = st.buffers.at("grad_avg");
        grad_avg.lerp_(grad.to(grad_avg.dtype()), 1 - alpha);
        avg = addcmul(square_avg, grad_avg, grad_avg, -1);
        avg.sqrt_();
      } else {
        avg = sqrt(square_avg);
      }
      avg.add_(eps);
      if (momentum > 0) {
        Tensor buf = st.buffers.at("momentum_buffer");
        buf.mul_(momentum).addcdiv_(grad, avg);
        p.add_(buf, -lr);
      } else {
        p.addcdiv_(grad, avg, -lr);
      }
    }
  }
}

}  // namespace kiln::optim

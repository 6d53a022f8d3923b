// optim/sgd.cpp: SGD's option checks and update (see sgd.h for the rule).
#include "optim/sgd.h"

#include <cmath>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : Optimizer("SGD") {
  add_param_group(std::move(params), options);
}

SGD::SGD(std::vector<GroupSpec<SGDOptions>> groups) : Optimizer("SGD") {
  KILN_CHECK(!groups.empty(), "SGD: got no parameter groups");
  for (auto& group : groups) add_param_group(std::move(group.params), group.options);
}

void SGD::add_param_group(std::vector<Tensor> params, SGDOptions o) {
  KILN_CHECK(!std::isnan(o.lr),
             "SGD: lr is required (PyTorch's SGD has no default); pass {{.lr = ...}}");
  KILN_CHECK(o.lr >= 0, "SGD: invalid learning rate {}; lr must be >= 0", o.lr);
  KILN_CHECK(o.momentum >= 0, "SGD: invalid momentum value {}; momentum must be >= 0", o.momentum);
  KILN_CHECK(o.weight_decay >= 0, "SGD: invalid weight_decay value {}; it must be >= 0",
             o.weight_decay);
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
             "SGD: Nesterov momentum requires a momentum and zero dampening (got momentum {}, "
             "dampening {})",
             o.momentum, o.dampening);
  add_group(std::move(params), {{"lr", o.lr},
                                {"momentum", o.momentum},
                                {"dampening", o.dampening},
                                {"weight_decay", o.weight_decay},
                                {"nesterov", o.nesterov ? 1.0 : 0.0},
                                {"maximize", o.maximize ? 1.0 : 0.0}});
}

void SGD::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.get("lr"), momentum = group.get("momentum");
    const double dampening = group.get("dampening"), weight_decay = group.get("weight_decay");
    const bool nesterov = group.get("nesterov") != 0, maximize = group.get("maximize") != 0;
    for (Tensor& p : group.params) {
      Tensor d_p = p.grad();
      if (!d_p.defined()) continue;
      if (maximize) d_p = neg(d_p);
      if (weight_decay != 0) d_p = add(d_p, p, weight_decay);
      if (momentum != 0) {
        // Plain SGD keeps no state; the buffer starts as the first step's gradient.
        ParamState& st = state(p);
        Tensor* slot = st.buffers.find("momentum_buffer");
        Tensor buf;
        if (slot == nullptr) {
          buf = d_p.clone();
          st.buffers.insert("momentum_buffer", buf);
        } else {
          buf = *slot;
          buf.mul_(momentum).add_(d_p, 1 - dampening);
        }
        d_p = nesterov ? add(d_p, buf, momentum) : buf;
      }
      p.add_(d_p, -lr);
    }
  }
}

}  // namespace kiln::optim

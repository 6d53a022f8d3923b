// optim/sgd.cpp: SGD's option checks and update (see sgd.h for the rule).
#include "optim/sgd.h"

#include <cmath>
#include <map>
#include <tuple>

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

namespace {

void check_options(const SGDOptions& o) {
  KILN_CHECK(!std::isnan(o.lr),
             "SGD: lr is required (PyTorch's SGD has no default); pass {{.lr = ...}}");
  KILN_CHECK(std::isfinite(o.lr) && o.lr >= 0, "SGD: invalid learning rate {}; lr must be finite and >= 0", o.lr);
  KILN_CHECK(std::isfinite(o.momentum) && o.momentum >= 0,
             "SGD: invalid momentum value {}; momentum must be finite and >= 0", o.momentum);
  KILN_CHECK(std::isfinite(o.dampening), "SGD: invalid dampening value {}; it must be finite", o.dampening);
  KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
             "SGD: invalid weight_decay value {}; it must be finite and >= 0",
             o.weight_decay);
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
             "SGD: Nesterov momentum requires a momentum and zero dampening (got momentum {}, "
             "dampening {})",
             o.momentum, o.dampening);
}

}  // namespace

void SGD::add_param_group(std::vector<Tensor> params, SGDOptions o) {
  check_options(o);
  add_group(std::move(params), {{"lr", o.lr},
                                {"momentum", o.momentum},
                                {"dampening", o.dampening},
                                {"weight_decay", o.weight_decay},
                                {"nesterov", o.nesterov ? 1.0 : 0.0},
                                {"maximize", o.maximize ? 1.0 : 0.0},
                                {"fused", o.fused ? 1.0 : 0.0}});
}

void SGD::check_group(const ParamGroup& g) const {
  check_options({.lr = g.get("lr"),
                 .momentum = g.get("momentum"),
                 .dampening = g.get("dampening"),
                 .weight_decay = g.get("weight_decay"),
                 .nesterov = flag(g, "nesterov"),
                 .maximize = flag(g, "maximize"),
                 .fused = flag(g, "fused")});
}

std::optional<Optimizer::BufferNames> SGD::buffer_names(const ParamGroup&) const {
  return BufferNames{{}, {"momentum_buffer"}};  // without it, momentum restarts from the next gradient
}

void SGD::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.get("lr"), momentum = group.get("momentum");
    const double dampening = group.get("dampening"), weight_decay = group.get("weight_decay");
    const bool nesterov = group.get("nesterov") != 0, maximize = group.get("maximize") != 0;
    const bool fused = wants_fused(group);
    SgdStepArgs args{.lr = lr,
                     .momentum = momentum,
                     .dampening = dampening,
                     .weight_decay = weight_decay,
                     .nesterov = nesterov,
                     .maximize = maximize};  // and first_step per batch
    // The fused step's batches: params of one device, dtype and first step (a new buffer or not).
    struct Batch {
      std::vector<Tensor> p, g, buf;
    };
    std::map<std::tuple<std::string, int, bool>, Batch> batches;
    for (Tensor& p : group.params) {
      Tensor d_p = p.grad();
      if (!d_p.defined()) continue;
      // Plain SGD keeps no state; the buffer starts as the first step's gradient.
      Tensor* slot = momentum != 0 ? state(p).buffers.find("momentum_buffer") : nullptr;
      if (fused && fusable(p, d_p) && (slot == nullptr || (fusable(p, *slot) && slot->is_contiguous()))) {
        const bool first_step = momentum != 0 && slot == nullptr;
        Batch& b = batches[{p.device().str(), static_cast<int>(p.dtype()), first_step}];
        b.p.push_back(p);
        b.g.push_back(d_p.contiguous());
        if (first_step) {
          b.buf.push_back(empty_like(p));  // written, not read, by the first step
          state(p).buffers.insert("momentum_buffer", b.buf.back());
        } else if (slot != nullptr) {
          b.buf.push_back(*slot);
        }
        continue;
      }
      if (maximize) d_p = neg(d_p);
      if (weight_decay != 0) d_p = add(d_p, p, weight_decay);
      if (momentum != 0) {
        Tensor buf;
        if (slot == nullptr) {
          buf = d_p.clone();
          state(p).buffers.insert("momentum_buffer", buf);
        } else {
          buf = *slot;
          buf.mul_(momentum).add_(d_p, 1 - dampening);
        }
        d_p = nesterov ? add(d_p, buf, momentum) : buf;
      }
      p.add_(d_p, -lr);
    }
    for (auto& [key, b] : batches) {
      args.first_step = std::get<2>(key);
      fused_sgd_(b.p, b.g, b.buf, args);
    }
  }
}

}  // namespace kiln::optim

// optim/rmsprop.h: RMSprop (torch.optim.RMSprop of PyTorch 1.13, its single-tensor update).
#pragma once

#include "optim/optimizer.h"

namespace kiln::optim {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool maximize = false;
};

// Per parameter, with g its grad:
//   g = maximize ? -g : g;  g += weight_decay * p
//   v = alpha * v + (1 - alpha) * g * g
//   avg = sqrt(v) + eps, or, centered: gbar = alpha * gbar + (1 - alpha) * g
//                                      avg = sqrt(v - gbar^2) + eps
//   momentum > 0: buf = momentum * buf + g / avg; p -= lr * buf
//   otherwise:    p -= lr * g / avg
// State: "square_avg", "momentum_buffer" (momentum > 0), "grad_avg" (centered).
class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, RMSpropOptions options = {});
  explicit RMSprop(std::vector<GroupSpec<RMSpropOptions>> groups);

  void add_param_group(std::vector<Tensor> params, RMSpropOptions options);
  void step() override;
  void check_group(const ParamGroup& group) const override;
  std::optional<BufferNames> buffer_names(const ParamGroup& group) const override;
};

}  // namespace kiln::optim

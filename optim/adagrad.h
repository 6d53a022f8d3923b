// optim/adagrad.h: Adagrad (torch.optim.Adagrad of PyTorch 1.13, its single-tensor dense update).
#pragma once

#include "optim/optimizer.h"

namespace kiln::optim {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool maximize = false;
};

// Per parameter, with g its grad and t its step count (from 1):
//   g = maximize ? -g : g;  g += weight_decay * p
//   clr = lr / (1 + (t - 1) * lr_decay)
//   sum += g * g;  p -= clr * g / (sqrt(sum) + eps)
// State: "sum" (starts at initial_accumulator_value).
class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, AdagradOptions options = {});
  explicit Adagrad(std::vector<GroupSpec<AdagradOptions>> groups);

  void add_param_group(std::vector<Tensor> params, AdagradOptions options);
  void step() override;
  void check_group(const ParamGroup& group) const override;
  std::optional<BufferNames> buffer_names(const ParamGroup& group) const override;
};

}  // namespace kiln::optim

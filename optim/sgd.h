// optim/sgd.h: stochastic gradient descent with momentum, dampening, Nesterov and weight decay
// (torch.optim.SGD of PyTorch 1.13, its single-tensor update).
#pragma once

#include <limits>

#include "optim/optimizer.h"

namespace kiln::optim {

struct SGDOptions {
  double lr = std::numeric_limits<double>::quiet_NaN();  // required, as in PyTorch
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

// Per parameter, with g its grad:
//   g = maximize ? -g : g;  g += weight_decay * p
//   if momentum: buf = (first step) ? g : momentum * buf + (1 - dampening) * g
//                g = nesterov ? g + momentum * buf : buf
//   p -= lr * g
// State: "momentum_buffer" (only with momentum, from the first step on); no step count, as PyTorch.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  explicit SGD(std::vector<GroupSpec<SGDOptions>> groups);

  void add_param_group(std::vector<Tensor> params, SGDOptions options);
  void step() override;
};

}  // namespace kiln::optim

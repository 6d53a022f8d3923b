// optim/sgd.h: stochastic gradient descent with momentum, dampening, Nesterov and weight decay
// (torch.optim.SGD of PyTorch 1.13, its single-tensor update, or fused).
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
  bool fused = false;  // one fused kernel per step over float32/float64 params (Backend::sgd_step)
};

// Per parameter, with g its grad:
//   g = maximize ? -g : g;  g += weight_decay * p
//   if momentum: buf = (first step) ? g : momentum * buf + (1 - dampening) * g
//                g = nesterov ? g + momentum * buf : buf
//   p -= lr * g
// State: "momentum_buffer" (only with momentum, from the first step on); no step count, as PyTorch.
// fused (PyTorch 2's name): the step of all of a group's float32 and float64 params with gradients,
// per device, dtype and first step (a new buffer or not), is one kiln::fused_sgd_ call (a
// multi-tensor kernel on CUDA, one pass per tensor on the CPU) instead of up to six elementwise ops
// per param; the result equals the unfused step to rounding. Other dtypes and non-contiguous params
// take the unfused path.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  explicit SGD(std::vector<GroupSpec<SGDOptions>> groups);

  void add_param_group(std::vector<Tensor> params, SGDOptions options);
  void step() override;
  void check_group(const ParamGroup& group) const override;
  std::optional<BufferNames> buffer_names(const ParamGroup& group) const override;
};

}  // namespace kiln::optim

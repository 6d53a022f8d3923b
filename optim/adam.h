// optim/adam.h: Adam and AdamW (torch.optim.Adam / AdamW of PyTorch 1.13, single-tensor updates,
// or fused).
// They differ in the weight decay only: Adam adds it to the gradient (L2), AdamW shrinks the
// parameter by lr * weight_decay before the update (decoupled, Loshchilov & Hutter).
#pragma once

#include "optim/optimizer.h"

namespace kiln::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;    // PyTorch's betas[0]
  double beta2 = 0.999;  // PyTorch's betas[1]
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  bool fused = false;  // one fused kernel per step over float32/float64 params (Backend::adam_step)
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  bool fused = false;  // one fused kernel per step over float32/float64 params (Backend::adam_step)
};

// Per parameter, with g its grad and t its step count (from 1):
//   g = maximize ? -g : g
//   Adam: g += weight_decay * p          AdamW: p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;     v = beta2 * v + (1 - beta2) * g * g
//   vmax = max(vmax, v) with amsgrad (then used in place of v)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State: "exp_avg", "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq".
// fused (PyTorch's name): the step of all of a group's float32 and float64 params with gradients,
// per device, dtype and step count, is one kiln::fused_adam_ call (a multi-tensor kernel on CUDA,
// one pass per tensor on the CPU) instead of about ten elementwise ops per param; the result equals
// the unfused step to rounding. Other dtypes and non-contiguous params take the unfused path.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  explicit Adam(std::vector<GroupSpec<AdamOptions>> groups);

  void add_param_group(std::vector<Tensor> params, AdamOptions options);
  void step() override;
  void check_group(const ParamGroup& group) const override;  // Adam's and AdamW's, under name()
  std::optional<BufferNames> buffer_names(const ParamGroup& group) const override;

 protected:
  explicit Adam(std::string name) : Optimizer(std::move(name)) {}
  void step_impl(bool decoupled_weight_decay);
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<GroupSpec<AdamWOptions>> groups);

  void add_param_group(std::vector<Tensor> params, AdamWOptions options);
  void step() override;
};

}  // namespace kiln::optim

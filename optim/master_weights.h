// optim/master_weights.h: float32 master weights for a model kept in 16 bits (model.to(kBFloat16)),
// as DeepSpeed's FP16_Optimizer and Apex's O2 keep them.
//
//   net.to(kBFloat16);                                   // weights, activations, grads: 2 bytes each
//   optim::MasterWeights opt(net.parameters(), [](std::vector<Tensor> masters) {
//     return std::make_unique<optim::AdamW>(std::move(masters), optim::AdamWOptions{.lr = 1e-3});
//   });
//   opt.zero_grad();  loss.backward();  opt.step();     // or scaler.step(opt) with a GradScaler
//
// Why: an update smaller than half a unit in the last place of the weight is lost when it is added
// in 16 bits. bfloat16 has 8 significant bits: a weight of 1.0 cannot move by less than 2^-8, so
// Adam's steps of lr = 1e-3 round away to nothing, step after step. The master copies hold the
// weights in float32 (24 bits), where those steps accumulate; the model gets them rounded.
//
// step(): (1) the model's 16-bit grads are copied into float32 grads of the masters (grads(); a
// GradScaler unscales these float32 copies, so small gradients do not underflow on the way), (2)
// the inner optimizer steps the masters, its state (Adam's moments) in float32 too, (3) each master
// is copied back into its model parameter, rounded to nearest even. Parameters already in float32
// or float64 are their own masters: the inner optimizer steps them directly.
//
// Memory per 16-bit parameter with Adam (DeepSpeed's accounting, ZeRO paper): 2 bytes of weight +
// 2 of gradient + 4 of float32 master + 8 of Adam state (exp_avg, exp_avg_sq) = 16 bytes, against
// 4 + 4 + 8 = 16 for plain float32 training: the saving is in activations and in the speed of
// 16-bit math, not in the optimizer. The float32 master grads (4 bytes) live only from the copy
// to the end of step(), as DeepSpeed's, which frees its float32 grads after each step.
//
// Schedulers and state dicts work on this optimizer: its parameter groups mirror the inner
// optimizer's (same order, model parameters in place of masters) and their options are pushed to
// the inner optimizer at each step. state_dict() is the inner one's plus "master.<i>" (float32) for
// each 16-bit parameter i.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace kiln::optim {

class MasterWeights : public Optimizer {
 public:
  // Builds the inner optimizer over the masters; it must use exactly the tensors it is given.
  using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor> masters)>;

  MasterWeights(std::vector<Tensor> params, const MakeOptimizer& make_optimizer);

  void step() override;
  void zero_grad(bool set_to_none = true) override;  // the model's grads and the masters'
  // The float32 grads the inner optimizer will read, copied from the model's grads when those changed
  // since the last copy (so a second call returns the same tensors, and GradScaler's unscale_ acts on
  // what step() uses). To clip, clip these (the master grads), after unscale_ when a scaler is used:
  // clipping the model's 16-bit grads after the copy does not reach the step.
  std::vector<Tensor> grads() override;
  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& dict) override;
  void check_group(const ParamGroup& group) const override { inner_->check_group(group); }

  Optimizer& inner() { return *inner_; }
  // The float32 tensor stepped for `param` (param itself when it is float32 or float64).
  const Tensor& master(const Tensor& param) const;
  std::vector<Tensor> master_params() const;

 private:
  struct Pair {
    Tensor param;   // the model's (16-bit) parameter
    Tensor master;  // its float32 copy, or param itself
    // The model grad that master.grad() was copied from, at which version: the copy is current while
    // param.grad() is still that tensor, unmodified (however the user cleared or accumulated it).
    Tensor copied_from;
    uint64_t copied_version = 0;
    bool own() const { return param.is_same(master); }
  };
  void copy_grads();

  std::unique_ptr<Optimizer> inner_;
  std::vector<Pair> pairs_;  // in the order of the parameter groups
};

}  // namespace kiln::optim

// optim/grad_scaler.h: loss scaling for float16 training: PyTorch's GradScaler API with DeepSpeed's
// dynamic loss scaling rule (deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler).
//
//   optim::GradScaler scaler;                         // 2^16, window 1000, hysteresis 2, min 1
//   for (auto& [x, y] : loader) {
//     opt.zero_grad();
//     Tensor loss;
//     { AutocastGuard ac(Device::cuda(), kFloat16);  loss = nn::cross_entropy(net.forward(x), y); }
//     scaler.scale(loss).backward();                  // gradients scaled by get_scale()
//     scaler.step(opt);                               // unscale_, then step unless inf/NaN (skipped)
//     scaler.update();                                // the scale for the next iteration
//   }
//
// Why: float16 has 5 exponent bits; gradients below 2^-24 flush to zero. Multiplying the loss by S
// multiplies every gradient by S (the chain rule is linear), lifting small gradients into range;
// unscale_ divides by S again before the optimizer reads them. Too large an S overflows to inf,
// which the scaler detects, and then it skips that step and lowers S. bfloat16 has float32's
// exponent range and needs no scaling (DeepSpeed's bf16 mode has none).
//
// The dynamic rule, as DeepSpeed's update_scale(overflow), once per update():
//   overflow: the step was skipped (skipped_steps() counts it). If hysteresis == 1 or
//             cur_hysteresis == 1, the scale drops: scale = max(scale / scale_factor, min_loss_scale)
//             (an Error instead if it is already at min_loss_scale and raise_error_at_min_scale);
//             otherwise cur_hysteresis -= 1 and the scale stays. The iteration is remembered.
//   no overflow: with consecutive_hysteresis, cur_hysteresis = hysteresis. When the number of
//             iterations since the last overflow is a multiple of loss_scale_window (a window of
//             good steps), scale *= scale_factor and (without consecutive_hysteresis)
//             cur_hysteresis = hysteresis.
// So hysteresis is refilled only when the scale grows (or after every good step with
// consecutive_hysteresis): once it is down to 1, every further overflow halves the scale.
// Static scaling (loss_scale > 0): the scale never changes; a step with inf/NaN gradients is still
// skipped and counted (as PyTorch's GradScaler; DeepSpeed's static scaler would step).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "core/tensor.h"
#include "core/tensor_dict.h"
#include "optim/optimizer.h"

namespace kiln::optim {

// The keys of ds_config's "fp16" section, with DeepSpeed's defaults, so the engine can fill them
// from JSON; then two arguments of DeepSpeed's DynamicLossScaler that the config does not expose.
struct GradScalerOptions {
  double loss_scale = 0;                // 0: dynamic; > 0: this fixed (static) scale
  int initial_scale_power = 16;         // dynamic: the scale starts at 2^initial_scale_power
  int64_t loss_scale_window = 1000;     // dynamic: good steps in a row before the scale grows
  int hysteresis = 2;                   // dynamic: overflows absorbed before the scale drops
  bool consecutive_hysteresis = false;  // refill the hysteresis after every good step
  double min_loss_scale = 1;            // dynamic: the scale never drops below this
  double scale_factor = 2;              // what a drop divides by and a growth multiplies by
  bool raise_error_at_min_scale = true; // an overflow at min_loss_scale stops training (an Error)
  bool enabled = true;                  // false: scale/unscale_ do nothing, step() always steps
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  virtual ~GradScaler() = default;

  // loss * get_scale() (in float32 when the loss is 16-bit, so the scaled value itself is finite).
  Tensor scale(const Tensor& loss) const;
  // Divides the gradients optimizer.step() will read by the scale and records whether any of them
  // holds an inf or a NaN (Optimizer::unscale_grads_: the grads(), in place; a ZeroOptimizer that
  // converts its gradients a sub-group at a time in its step applies the division there). At most
  // once per optimizer between update()s; call it before clipping gradients. Works on any device:
  // one sum per gradient (an inf or NaN anywhere makes the sum non-finite) and one read of the
  // total.
  void unscale_(Optimizer& optimizer);
  // unscale_ (unless done already), then optimizer.step() unless the gradients held inf/NaN.
  // Returns whether it stepped; a skipped step leaves the parameters and the optimizer state as
  // they were and counts in skipped_steps().
  bool step(Optimizer& optimizer);
  // The next scale, from whether any optimizer's gradients overflowed since the last update().
  void update();

  double get_scale() const { return enabled_ ? scale_ : 1.0; }
  bool is_enabled() const { return enabled_; }
  bool is_dynamic() const { return dynamic_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int cur_hysteresis() const { return cur_hysteresis_; }

  // "scale", "cur_iter", "last_overflow_iter", "cur_hysteresis", "skipped_steps" and the options
  // (0-d float64 / int64); empty for a disabled scaler, as PyTorch's.
  TensorDict state_dict() const;
  void load_state_dict(const TensorDict& dict);

 protected:
  // Whether any gradient anywhere held an inf or a NaN, given this process's answer: itself here;
  // distributed::ShardedGradScaler asks every rank (each sees only its partition).
  virtual bool found_inf_anywhere(bool found_inf_here) { return found_inf_here; }

 private:
  struct Record {  // per optimizer, since the last update()
    bool unscaled = false, stepped = false, found_inf = false, has_grads = false;
  };

  bool enabled_, dynamic_;
  double scale_, scale_factor_, min_loss_scale_;
  int64_t loss_scale_window_;
  int hysteresis_, cur_hysteresis_;
  bool consecutive_hysteresis_, raise_error_at_min_scale_;
  int64_t cur_iter_ = 0, last_overflow_iter_ = -1, skipped_steps_ = 0;
  std::unordered_map<const Optimizer*, Record> records_;
};

}  // namespace kiln::optim

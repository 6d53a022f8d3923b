// optim/grad_scaler.cpp: GradScaler (see grad_scaler.h for the rule, with DeepSpeed's names).
#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::optim {

GradScaler::GradScaler(GradScalerOptions o)
    : enabled_(o.enabled),
      dynamic_(o.loss_scale == 0),
      scale_(o.loss_scale == 0 ? std::ldexp(1.0, o.initial_scale_power) : o.loss_scale),
      scale_factor_(o.scale_factor),
      min_loss_scale_(o.min_loss_scale),
      loss_scale_window_(o.loss_scale_window),
      hysteresis_(o.hysteresis),
      cur_hysteresis_(o.hysteresis),
      consecutive_hysteresis_(o.consecutive_hysteresis),
      raise_error_at_min_scale_(o.raise_error_at_min_scale) {
  KILN_CHECK(o.loss_scale >= 0 && std::isfinite(o.loss_scale),
             "GradScaler: loss_scale must be 0 (dynamic) or a positive fixed scale, got {}", o.loss_scale);
  KILN_CHECK(o.initial_scale_power >= 0 && o.initial_scale_power <= 64,
             "GradScaler: initial_scale_power must be in [0, 64] (the scale starts at 2^power), got {}",
             o.initial_scale_power);
  KILN_CHECK(o.loss_scale_window >= 1, "GradScaler: loss_scale_window must be >= 1, got {}",
             o.loss_scale_window);
  KILN_CHECK(o.hysteresis >= 1, "GradScaler: hysteresis must be >= 1 (1: drop at the first overflow), got {}",
             o.hysteresis);
  KILN_CHECK(o.min_loss_scale > 0 && std::isfinite(o.min_loss_scale),
             "GradScaler: min_loss_scale must be a finite number > 0, got {}", o.min_loss_scale);
  KILN_CHECK(o.scale_factor > 1 && std::isfinite(o.scale_factor),
             "GradScaler: scale_factor must be a finite number > 1, got {}", o.scale_factor);
  KILN_CHECK(!dynamic_ || scale_ >= min_loss_scale_,
             "GradScaler: the initial scale 2^{} = {} is below min_loss_scale {}", o.initial_scale_power, scale_,
             min_loss_scale_);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!enabled_) return loss;
  KILN_CHECK(loss.is_floating_point(), "GradScaler.scale: the loss must be a floating tensor, got {}",
             dtype_name(loss.dtype()));
  return is_reduced_float(loss.dtype()) ? loss.to(kFloat32) * scale_ : loss * scale_;
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!enabled_) return;
  Record& r = records_[&optimizer];
  KILN_CHECK(!r.unscaled, "GradScaler.unscale_: already called on this optimizer ({}) since the last update()",
             optimizer.name());
  KILN_CHECK(!r.stepped, "GradScaler.unscale_: called after step() on this optimizer ({}); call it before",
             optimizer.name());
  const Optimizer::Unscaled u = optimizer.unscale_grads_(1.0 / scale_);
  r.unscaled = true;
  r.has_grads = u.has_grads;
  r.found_inf = found_inf_anywhere(u.found_inf);
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return true;
  }
  KILN_CHECK(!records_[&optimizer].stepped,
             "GradScaler.step: already called on this optimizer ({}) since the last update()", optimizer.name());
  if (!records_[&optimizer].unscaled) unscale_(optimizer);
  Record& r = records_[&optimizer];
  // As PyTorch ("No inf checks were recorded for this optimizer"): stepping on no gradient at all is
  // a training loop that skipped backward, not a step to count.
  KILN_CHECK(r.has_grads,
             "GradScaler.step: none of the parameters of this optimizer ({}) has a gradient, so no inf check "
             "was recorded; call scaler.scale(loss).backward() before step",
             optimizer.name());
  r.stepped = true;
  if (r.found_inf) {
    ++skipped_steps_;
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!enabled_) return;
  KILN_CHECK(!records_.empty(),
             "GradScaler.update: no inf checks were recorded since the last update(); call step(optimizer) "
             "(or unscale_) first");
  bool overflow = false;
  for (const auto& [opt, r] : records_) overflow = overflow || r.found_inf;
  records_.clear();
  if (!dynamic_) return;
  // DeepSpeed's DynamicLossScaler.update_scale(overflow).
  if (overflow) {
    if (hysteresis_ == 1 || cur_hysteresis_ == 1) {
      KILN_CHECK(!(scale_ == min_loss_scale_ && raise_error_at_min_scale_),
                 "GradScaler.update: the gradients overflowed at the minimum loss scale {}, which cannot drop "
                 "further; the model diverged (lower the learning rate, or pass raise_error_at_min_scale = "
                 "false to keep skipping steps)",
                 min_loss_scale_);
      scale_ = std::max(scale_ / scale_factor_, min_loss_scale_);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
    if ((cur_iter_ - last_overflow_iter_) % loss_scale_window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
      // A scale that would overflow stays where it is (PyTorch grows only to a finite scale).
      if (std::isfinite(scale_ * scale_factor_)) scale_ *= scale_factor_;
    }
  }
  ++cur_iter_;
}

TensorDict GradScaler::state_dict() const {
  if (!enabled_) return {};
  auto f64 = [](double v) { return scalar_tensor(v, kFloat64); };
  auto i64 = [](int64_t v) { return scalar_tensor(v, kInt64); };
  return TensorDict{{"scale", f64(scale_)},
                    {"cur_iter", i64(cur_iter_)},
                    {"last_overflow_iter", i64(last_overflow_iter_)},
                    {"cur_hysteresis", i64(cur_hysteresis_)},
                    {"skipped_steps", i64(skipped_steps_)},
                    {"dynamic", i64(dynamic_ ? 1 : 0)},
                    {"loss_scale_window", i64(loss_scale_window_)},
                    {"hysteresis", i64(hysteresis_)},
                    {"consecutive_hysteresis", i64(consecutive_hysteresis_ ? 1 : 0)},
                    {"min_loss_scale", f64(min_loss_scale_)},
                    {"scale_factor", f64(scale_factor_)},
                    {"raise_error_at_min_scale", i64(raise_error_at_min_scale_ ? 1 : 0)}};
}

void GradScaler::load_state_dict(const TensorDict& dict) {
  if (!enabled_) return;
  KILN_CHECK(dict.size() > 0,
             "GradScaler.load_state_dict: the state dict is empty, possibly because it was saved from a disabled "
             "GradScaler");
  const TensorDict mine = state_dict();
  for (const auto& [key, t] : dict) {
    KILN_CHECK(mine.contains(key), "GradScaler.load_state_dict: unexpected entry '{}'; expected {}", key,
               fmt::join(mine.keys(), ", "));
    KILN_CHECK(t.numel() == 1, "GradScaler.load_state_dict: '{}' should hold one number, got shape {}", key,
               t.sizes().str());
  }
  for (const std::string& key : mine.keys()) {
    KILN_CHECK(dict.contains(key), "GradScaler.load_state_dict: the state dict lacks '{}'", key);
  }
  auto num = [&](const char* key) { return dict.at(key).item<double>(); };
  // A count saved as a floating number must be a whole one: 2.5 was read as 2.
  auto integer = [&](const char* key) {
    const Tensor& t = dict.at(key);
    if (!t.is_floating_point()) return t.item<int64_t>();
    const double v = t.item<double>();
    KILN_CHECK(std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 0x1p62,
               "GradScaler.load_state_dict: '{}' is {}, but it must be a whole number; the state dict is damaged", key,
               v);
    return static_cast<int64_t>(v);
  };
  // The values are checked as the constructor checks its options, and all of them before any is
  // taken, so that a damaged state dict leaves this scaler as it was.
  auto check = [](bool ok, const char* key, double value, const char* rule) {
    KILN_CHECK(ok, "GradScaler.load_state_dict: '{}' is {}, but it must be {}; the state dict is damaged", key,
               value, rule);
  };
  const double scale = num("scale"), min_loss_scale = num("min_loss_scale"), scale_factor = num("scale_factor");
  const int64_t cur_iter = integer("cur_iter"), last_overflow_iter = integer("last_overflow_iter"),
                cur_hysteresis = integer("cur_hysteresis"), skipped_steps = integer("skipped_steps"),
                window = integer("loss_scale_window"), hysteresis = integer("hysteresis");
  check(std::isfinite(scale) && scale > 0, "scale", scale, "a positive finite number");
  check(std::isfinite(min_loss_scale) && min_loss_scale > 0, "min_loss_scale", min_loss_scale,
        "a positive finite number");
  check(std::isfinite(scale_factor) && scale_factor > 1, "scale_factor", scale_factor, "a finite number > 1");
  check(window >= 1, "loss_scale_window", static_cast<double>(window), ">= 1");
  check(hysteresis >= 1 && hysteresis <= std::numeric_limits<int>::max(), "hysteresis",
        static_cast<double>(hysteresis), ">= 1");
  check(cur_hysteresis >= 1 && cur_hysteresis <= hysteresis, "cur_hysteresis", static_cast<double>(cur_hysteresis),
        "in [1, hysteresis]");
  check(cur_iter >= 0 && cur_iter < (int64_t{1} << 62), "cur_iter", static_cast<double>(cur_iter), "in [0, 2^62)");
  check(last_overflow_iter >= -1 && last_overflow_iter <= cur_iter, "last_overflow_iter",
        static_cast<double>(last_overflow_iter), "in [-1, cur_iter]");
  check(skipped_steps >= 0, "skipped_steps", static_cast<double>(skipped_steps), ">= 0");
  for (const char* flag : {"dynamic", "consecutive_hysteresis", "raise_error_at_min_scale"}) {
    const int64_t v = integer(flag);
    check(v == 0 || v == 1, flag, static_cast<double>(v), "0 or 1");
  }
  scale_ = scale;
  cur_iter_ = cur_iter;
  last_overflow_iter_ = last_overflow_iter;
  cur_hysteresis_ = static_cast<int>(cur_hysteresis);
  skipped_steps_ = skipped_steps;
  dynamic_ = integer("dynamic") != 0;
  loss_scale_window_ = window;
  hysteresis_ = static_cast<int>(hysteresis);
  consecutive_hysteresis_ = integer("consecutive_hysteresis") != 0;
  min_loss_scale_ = min_loss_scale;
  scale_factor_ = scale_factor;
  raise_error_at_min_scale_ = integer("raise_error_at_min_scale") != 0;
  records_.clear();
}

}  // namespace kiln::optim

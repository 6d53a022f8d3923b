// optim/warmup_lr.h: DeepSpeed's warmup schedules (deepspeed/runtime/lr_schedules.py, v0.12.6):
// WarmupLR, WarmupDecayLR and WarmupCosineLR, with the option names of a DeepSpeed config's
// "scheduler.params".
//
// They behave as DeepSpeed's, not as PyTorch's schedulers: building one leaves the optimizer's lr
// untouched and takes no step; the first step() is iteration 0 (last_epoch() is DeepSpeed's
// last_batch_iteration). state_dict() holds "last_epoch" (and the base class's counters).
#pragma once

#include <string>
#include <vector>

#include "optim/lr_scheduler.h"

namespace kiln::optim {

struct WarmupLROptions {
  double warmup_min_lr = 0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;  // DeepSpeed uses max(2, warmup_num_steps)
  std::string warmup_type = "log";  // "log" or "linear"
  // One value per param group (DeepSpeed's list form); when given, they replace the two above.
  std::vector<double> warmup_min_lrs{}, warmup_max_lrs{};
};

// lr = min_lr + (max_lr - min_lr) * gamma, where at iteration i < warmup_num_steps
//   gamma = log(i + 1) / log(warmup_num_steps)   ("log")   or   i / warmup_num_steps   ("linear")
// and gamma = 1 afterwards. Every group gets the same lr, unless the per-group lists are given.
class WarmupLR : public LRScheduler {
 public:
  WarmupLR(Optimizer& optimizer, WarmupLROptions options = {});

 protected:
  WarmupLR(Optimizer& optimizer, WarmupLROptions options, const char* name);
  std::vector<double> get_lr() override;
  double warmup_gamma() const;  // gamma during the warmup
  virtual double gamma() const;

  WarmupLROptions options_;
  int64_t warmup_num_steps_;
  std::vector<double> min_lrs_, max_lrs_;  // per group
};

struct WarmupDecayLROptions {
  int64_t total_num_steps = 0;  // required
  double warmup_min_lr = 0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";
  std::vector<double> warmup_min_lrs{}, warmup_max_lrs{};  // per group, as WarmupLROptions
};

// WarmupLR, then a linear decay to 0 at total_num_steps: after the warmup,
//   gamma = max(0, (total_num_steps - i) / max(1, total_num_steps - warmup_num_steps)).
class WarmupDecayLR : public WarmupLR {
 public:
  WarmupDecayLR(Optimizer& optimizer, WarmupDecayLROptions options);

 protected:
  double gamma() const override;

 private:
  int64_t total_num_steps_;
};

struct WarmupCosineLROptions {
  int64_t total_num_steps = 0;  // required, > warmup_num_steps
  double warmup_min_ratio = 0;
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 1e-4;
  std::string warmup_type = "log";
};

// lr = (each group's lr when the scheduler was built) * ratio. During the warmup
// (i < warmup_num_steps), ratio = warmup_min_ratio + (1 - warmup_min_ratio) * gamma (WarmupLR's
// gamma); afterwards, with s = i - warmup_num_steps + 1 and n = total_num_steps - warmup_num_steps,
//   ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * s / n)) / 2).
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, WarmupCosineLROptions options);

 protected:
  std::vector<double> get_lr() override;

 private:
  WarmupCosineLROptions options_;
  int64_t warmup_num_steps_;
};

}  // namespace kiln::optim

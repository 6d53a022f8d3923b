// optim/lr_scheduler.h: learning-rate schedulers, torch.optim.lr_scheduler of PyTorch 1.13: the
// LRScheduler base and StepLR, MultiStepLR, ConstantLR, ExponentialLR, CosineAnnealingLR,
// CosineAnnealingWarmRestarts, LinearLR, PolynomialLR, LambdaLR, MultiplicativeLR, CyclicLR,
// OneCycleLR, SequentialLR, ChainedScheduler; and ReduceLROnPlateau, which is stepped with a metric and, as in PyTorch
// 1.13, is not an LRScheduler. DeepSpeed's warmup schedules are in warmup_lr.h.
//
// As in PyTorch, building a scheduler records each group's "initial_lr" (the base lr) and takes the
// first step (last_epoch 0), so the optimizer's lr is already the schedule's first value; call
// opt.step() then sched.step() once per epoch (or batch). get_lr() is PyTorch's recursive
// ("chainable") form, which reads the group's current lr, so several schedulers can share a group.
//
// state_dict(): a TensorDict of the scheduler's counters: "last_epoch" and "step_count" (int64
// 0-d), "base_lrs" and "last_lr" (float64, one per group), and SequentialLR's children as
// "schedulers.<k>.<key>". The configuration (gamma, milestones...) is not saved: build the
// scheduler with the same arguments, load the optimizer's state_dict (which holds the lr and the
// schedule's group entries such as initial_lr), then the scheduler's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor_dict.h"
#include "optim/optimizer.h"

namespace kiln::optim {

// One value per param group: `list` when it is given (an Error naming `scheduler` and `what` unless it
// has one value per group), else `value` for every group (PyTorch's scalar-or-list arguments).
std::vector<double> values_per_group(const Optimizer& optimizer, const std::vector<double>& list, double value,
                                     const char* scheduler, const char* what);

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances last_epoch by one and sets each group's lr to the schedule's value.
  virtual void step();
  // The lr of each group set by the last step(); an Error before the first step.
  const std::vector<double>& get_last_lr() const;
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }
  const std::string& name() const { return name_; }

  virtual TensorDict state_dict() const;
  // An Error naming the entry when one is missing or has the wrong number of groups.
  virtual void load_state_dict(const TensorDict& dict);

 protected:
  // record_initial_lr: PyTorch's schedulers set each group's "initial_lr" (when absent) and take
  // their base lrs from it; DeepSpeed's do neither.
  LRScheduler(Optimizer& optimizer, std::string name, bool record_initial_lr = true);
  // PyTorch's _initial_step: step_count 0, then one step. Derived constructors call it last.
  void initial_step();
  // The schedule's values at last_epoch, in PyTorch's recursive form.
  virtual std::vector<double> get_lr() = 0;
  // The closed form, used by step_to (PyTorch's step(epoch)); get_lr() when a schedule has none.
  virtual std::vector<double> closed_form_lr() { return get_lr(); }
  // Sets last_epoch to `epoch` and the lrs to the closed form (how SequentialLR restarts a child).
  void step_to(int64_t epoch);
  void apply(const std::vector<double>& lrs);
  // An Error when the optimizer's groups are not the ones the scheduler was made for.
  void check_groups() const;

  Optimizer& optimizer_;
  std::string name_;
  std::vector<double> base_lrs_, last_lr_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;

  friend class ComposedScheduler;
  friend class SequentialLR;
};

// lr *= gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr *= gamma at each milestone (a milestone listed k times multiplies by gamma^k).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr = base_lr * factor for the first total_iters epochs, then base_lr.
class ConstantLR : public LRScheduler {
 public:
  ConstantLR(Optimizer& optimizer, double factor = 1.0 / 3, int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  double factor_;
  int64_t total_iters_;
};

// lr *= gamma every epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  double gamma_;
};

// eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2, computed recursively from the
// current lr as PyTorch 1.13's get_lr does (so it keeps cycling past T_max).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// SGDR: cosine annealing from base_lr to eta_min over T_i epochs, then a restart at base_lr with
// T_i *= T_mult (T_0 first). Its state_dict adds "T_cur" and "T_i" (int64 0-d).
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t T_0, int64_t T_mult = 1, double eta_min = 0);

  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& dict) override;

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  std::vector<double> annealed() const;

  int64_t T_0_, T_mult_;
  double eta_min_;
  int64_t T_cur_ = 0, T_i_ = 0;  // epochs into the current cycle, and its length
};

// The lr factor goes linearly from start_factor to end_factor over total_iters epochs.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// lr = base_lr * (1 - min(epoch, total_iters) / total_iters)^power: to 0 at total_iters.
class PolynomialLR : public LRScheduler {
 public:
  PolynomialLR(Optimizer& optimizer, int64_t total_iters = 5, double power = 1.0);

 protected:
  std::vector<double> get_lr() override;
  std::vector<double> closed_form_lr() override;

 private:
  int64_t total_iters_;
  double power_;
};

// lr = base_lr * lr_lambda(epoch); one function for every group, or one per group.
class LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  LambdaLR(Optimizer& optimizer, Lambda lr_lambda);
  LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas);

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<Lambda> lr_lambdas_;
};

// lr *= lr_lambda(epoch) at each step after the first; one function for every group, or one per
// group.
class MultiplicativeLR : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  MultiplicativeLR(Optimizer& optimizer, Lambda lr_lambda);
  MultiplicativeLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas);

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<Lambda> lr_lambdas_;
};

struct CyclicLROptions {
  double base_lr = 0;              // the cycle's bottom, for every group (required > 0 unless base_lrs)...
  std::vector<double> base_lrs{};  // ...or one per group
  double max_lr = 0;               // its top (required >= base_lr unless max_lrs)...
  std::vector<double> max_lrs{};
  int64_t step_size_up = 2000;     // steps from bottom to top
  int64_t step_size_down = 0;      // steps from top to bottom; 0: step_size_up
  std::string mode = "triangular";  // "triangular", "triangular2" (the height halves each cycle) or
                                    // "exp_range" (times gamma^step); ignored when scale_fn is given
  double gamma = 1.0;
  std::function<double(double)> scale_fn{};  // the height's factor, of the cycle (1, 2, ...) or the step
  std::string scale_mode = "cycle";          // "cycle" or "iterations": scale_fn's argument
  bool cycle_momentum = true;  // the group's "momentum" moves against the lr (SGD, RMSprop)
  double base_momentum = 0.8;
  double max_momentum = 0.9;
};

// The cyclical learning rate policy (Smith, 2017), stepped per batch: the lr goes from base_lr up to
// max_lr in step_size_up steps and back in step_size_down, the height scaled by the mode. Sets each
// group's lr to base_lr (and momentum to base_momentum) when built, as PyTorch does.
class CyclicLR : public LRScheduler {
 public:
  CyclicLR(Optimizer& optimizer, CyclicLROptions options);

 protected:
  std::vector<double> get_lr() override;

 private:
  double scale(double cycle) const;

  CyclicLROptions options_;
  std::vector<double> max_lrs_;
  double total_size_, step_ratio_;
};

struct OneCycleLROptions {
  double max_lr = 0;              // required (> 0), unless max_lrs is given
  std::vector<double> max_lrs{};  // one per param group (PyTorch's list form); overrides max_lr
  int64_t total_steps = 0;  // or epochs * steps_per_epoch
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // "cos" or "linear"
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

// The 1cycle policy: lr warms from max_lr / div_factor to max_lr over pct_start of the steps, then
// anneals to initial_lr / final_div_factor (three_phase: back to initial_lr first, then down).
// With cycle_momentum, the momentum (SGD's "momentum" or Adam's "beta1") moves inversely between
// max_momentum and base_momentum. Writes initial_lr, max_lr, min_lr, max_momentum and base_momentum
// into each group, as PyTorch does. Stepping past total_steps is an Error.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options);

 protected:
  std::vector<double> get_lr() override;

 private:
  struct Phase {
    double end_step;
    const char *start_lr, *end_lr, *start_momentum, *end_momentum;  // group option names
  };
  double anneal(double start, double end, double pct) const;

  OneCycleLROptions options_;
  int64_t total_steps_;
  std::vector<Phase> phases_;
  const char* momentum_name_ = nullptr;  // "beta1" or "momentum"
};

// A scheduler made of others, all driving one optimizer: SequentialLR and ChainedScheduler. Its
// state_dict holds last_epoch, last_lr and each child's entries as "schedulers.<k>.<key>".
class ComposedScheduler : public LRScheduler {
 public:
  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& dict) override;

 protected:
  // An Error for no schedulers, a null one, or one driving another optimizer.
  ComposedScheduler(Optimizer& optimizer, std::string name, std::vector<std::shared_ptr<LRScheduler>> schedulers);
  std::vector<double> get_lr() override { return last_lr_; }

  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

// Runs schedulers one after another: schedulers[k] from milestones[k-1] on, restarted (epoch 0, its
// closed form) at its milestone. All must drive `optimizer`.
class SequentialLR : public ComposedScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);

  void step() override;

 private:
  std::vector<int64_t> milestones_;
};

// Steps every scheduler at each step(), in order, on their one optimizer (their effects compose, as
// the recursive forms allow).
class ChainedScheduler : public ComposedScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);

  void step() override;
};

struct ReduceLROnPlateauOptions {
  std::string mode = "min";  // "min": the metric should fall (a loss); "max": rise (an accuracy)
  double factor = 0.1;       // new lr = lr * factor, in [0, 1)
  int64_t patience = 10;     // epochs without improvement tolerated before a reduction
  double threshold = 1e-4;   // how much better than the best a metric must be to count
  std::string threshold_mode = "rel";  // "rel": best * (1 -/+ threshold); "abs": best -/+ threshold
  int64_t cooldown = 0;                // epochs after a reduction in which bad epochs are not counted
  double min_lr = 0;                   // the lr's floor, for every group...
  std::vector<double> min_lrs{};       // ...or one per param group (PyTorch's list form)
  double eps = 1e-8;                   // a reduction smaller than eps is not made
};

// torch.optim.lr_scheduler.ReduceLROnPlateau of PyTorch 1.13: step(metric) once per epoch with a
// validation metric; when it has not improved on the best seen for more than `patience` epochs,
// each group's lr becomes max(lr * factor, min_lr) (unless that changes it by eps or less), and
// `cooldown` epochs follow in which bad epochs are not counted. A NaN metric is never an
// improvement. Unlike the schedulers above it takes no step when built and does not write
// "initial_lr". state_dict() holds its counters: "last_epoch", "num_bad_epochs",
// "cooldown_counter" (int64 0-d), "best" (float64 0-d) and "last_lr" (float64, one per group;
// empty before the first step). Build it with the same options before loading one.
class ReduceLROnPlateau {
 public:
  explicit ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options = {});

  void step(double metric);
  // A tensor of one element (such as a loss); its value is read on the host.
  void step(const Tensor& metric);
  // The lr of each group after the last step(); an Error before the first step.
  const std::vector<double>& get_last_lr() const;
  int64_t last_epoch() const { return last_epoch_; }
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  bool in_cooldown() const { return cooldown_counter_ > 0; }
  Optimizer& optimizer() const { return optimizer_; }

  TensorDict state_dict() const;
  // An Error naming the entry when one is missing, damaged or has the wrong number of groups.
  void load_state_dict(const TensorDict& dict);

 private:
  bool is_better(double metric) const;

  Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_, last_lr_;
  double best_;
  int64_t last_epoch_ = 0;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
};

}  // namespace kiln::optim

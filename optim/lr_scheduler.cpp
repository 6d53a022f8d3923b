// optim/lr_scheduler.cpp: PyTorch 1.13's schedulers (see lr_scheduler.h). Each get_lr() follows
// torch.optim.lr_scheduler's get_lr (the recursive form) and closed_form_lr() its
// _get_closed_form_lr; ReduceLROnPlateau follows its step, _reduce_lr and is_better.
#include "optim/lr_scheduler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/error.h"
#include "ops/ops.h"

namespace kiln::optim {

// ---- helpers shared by every scheduler, ReduceLROnPlateau included ----

std::vector<double> values_per_group(const Optimizer& optimizer, const std::vector<double>& list, double value,
                                     const char* scheduler, const char* what) {
  const size_t groups = optimizer.param_groups().size();
  if (list.empty()) return std::vector<double>(groups, value);
  KILN_CHECK(list.size() == groups, "{}: {} has {} values but {} has {} param groups; give one per group", scheduler,
             what, list.size(), optimizer.name(), groups);
  return list;
}

// A scheduler indexes its per-group values by group: one added after it was made has none (CosineAnnealingLR
// read past the end of base_lrs_).
static void check_group_count(const Optimizer& optimizer, size_t made_for, const std::string& name) {
  KILN_CHECK(optimizer.param_groups().size() == made_for,
             "{}: the optimizer has {} parameter groups but the scheduler was made for {}; build the "
             "scheduler after adding every group",
             name, optimizer.param_groups().size(), made_for);
}

// An entry of a scheduler's state dict; an Error naming it when it is missing.
static const Tensor& state_entry(const TensorDict& dict, const char* key, const std::string& name) {
  const Tensor* t = dict.find(key);
  KILN_CHECK(t != nullptr, "{}.load_state_dict: the state dict lacks '{}'", name, key);
  return *t;
}

// Learning rates read from a state dict are finite and >= 0.
static void check_loaded_lrs(const std::vector<double>& lrs, const char* key, const std::string& name) {
  for (double lr : lrs) {
    KILN_CHECK(std::isfinite(lr) && lr >= 0,
               "{}.load_state_dict: '{}' holds {}, but learning rates are finite and >= 0; the state dict is "
               "damaged", name, key, lr);
  }
}

// ---- LRScheduler ----

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name, bool record_initial_lr)
    : optimizer_(optimizer), name_(std::move(name)) {
  for (ParamGroup& group : optimizer_.param_groups()) {
    if (record_initial_lr && !group.has("initial_lr")) group.set("initial_lr", group.lr());
    base_lrs_.push_back(record_initial_lr ? group.get("initial_lr") : group.lr());
  }
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  auto& groups = optimizer_.param_groups();
  KILN_CHECK(lrs.size() == groups.size(),
             "{}: computed {} lrs for {} parameter groups; build the "
             "scheduler after adding every group",
             name_, lrs.size(), groups.size());
  // A NaN or infinite lr (from a LambdaLR's function, say) is an Error where it is written: a step with
  // it makes every parameter NaN, and a state dict holding it does not load. A negative one goes
  // through, as in PyTorch: OneCycleLR's linear anneal ends below 0 on the last step PyTorch allows.
  for (size_t g = 0; g < groups.size(); ++g) {
    KILN_CHECK(std::isfinite(lrs[g]), "{}: computed the learning rate {} for parameter group {} at step {}; a "
               "learning rate must be finite (check the scheduler's arguments, or its lambda)", name_, lrs[g], g,
               last_epoch_);
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_lr(lrs[g]);
  last_lr_ = lrs;
}

void LRScheduler::step() {
  check_groups();
  ++step_count_;
  ++last_epoch_;
  apply(get_lr());
}

void LRScheduler::step_to(int64_t epoch) {
  check_groups();
  ++step_count_;
  last_epoch_ = epoch;
  apply(closed_form_lr());
}

// Before get_lr, which indexes base_lrs_ by group.
void LRScheduler::check_groups() const { check_group_count(optimizer_, base_lrs_.size(), name_); }

const std::vector<double>& LRScheduler::get_last_lr() const {
  KILN_CHECK(!last_lr_.empty(), "{}: get_last_lr() before the first step(); call step() first",
             name_);
  return last_lr_;
}

TensorDict LRScheduler::state_dict() const {
  TensorDict dict;
  dict.insert("last_epoch", scalar_tensor(last_epoch_, kInt64));
  dict.insert("step_count", scalar_tensor(step_count_, kInt64));
  dict.insert("base_lrs", from_vector(base_lrs_));
  dict.insert("last_lr", from_vector(last_lr_));
  return dict;
}

void LRScheduler::load_state_dict(const TensorDict& dict) {
  auto entry = [&](const char* key) -> const Tensor& { return state_entry(dict, key, name_); };
  const Tensor& base = entry("base_lrs");
  const Tensor& last = entry("last_lr");
  KILN_CHECK(base.numel() == static_cast<int64_t>(base_lrs_.size()),
             "{}.load_state_dict: 'base_lrs' has {} values but the optimizer has {} groups", name_,
             base.numel(), base_lrs_.size());
  KILN_CHECK(last.numel() == 0 || last.numel() == static_cast<int64_t>(base_lrs_.size()),
             "{}.load_state_dict: 'last_lr' has {} values but the optimizer has {} groups", name_,
             last.numel(), base_lrs_.size());
  const int64_t last_epoch = entry("last_epoch").item<int64_t>(), step_count = entry("step_count").item<int64_t>();
  std::vector<double> base_lrs = base.to(kFloat64).to_vector<double>(), last_lr = last.to(kFloat64).to_vector<double>();
  // Checked before any is taken, so that a damaged state dict leaves the scheduler as it was.
  constexpr int64_t kMaxSteps = int64_t{1} << 53;  // beyond any run, and far from wrapping at the next step
  KILN_CHECK(last_epoch >= -1 && step_count >= 0 && last_epoch < kMaxSteps && step_count < kMaxSteps,
             "{}.load_state_dict: 'last_epoch' is {} and 'step_count' {}, but they must be in [-1, 2^53) and "
             "[0, 2^53); the state dict is damaged", name_, last_epoch, step_count);
  check_loaded_lrs(base_lrs, "base_lrs", name_);
  check_loaded_lrs(last_lr, "last_lr", name_);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = std::move(base_lrs);
  last_lr_ = std::move(last_lr);
}

// Each group's current lr.
static std::vector<double> current_lrs(const Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const ParamGroup& group : optimizer.param_groups()) lrs.push_back(group.lr());
  return lrs;
}

// ---- StepLR ----

namespace {
// A decay factor or an lr floor: finite and >= 0, or every lr after it is NaN or negative.
void check_factor(const char* scheduler, const char* name, double value) {
  KILN_CHECK(std::isfinite(value) && value >= 0, "{}: {} must be finite and >= 0, got {}", scheduler, name, value);
}
}  // namespace

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  KILN_CHECK(step_size > 0, "StepLR: step_size must be positive, got {}", step_size);
  check_factor("StepLR", "gamma", gamma);
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  std::vector<double> lrs = current_lrs(optimizer_);
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

std::vector<double> StepLR::closed_form_lr() {
  std::vector<double> lrs;
  for (double base : base_lrs_) {
    lrs.push_back(base * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));
  }
  return lrs;
}

// ---- MultiStepLR ----

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer, "MultiStepLR"), milestones_(std::move(milestones)), gamma_(gamma) {
  check_factor("MultiStepLR", "gamma", gamma);
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  std::vector<double> lrs = current_lrs(optimizer_);
  const auto count = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  if (count == 0) return lrs;
  for (double& lr : lrs) lr *= std::pow(gamma_, static_cast<double>(count));
  return lrs;
}

std::vector<double> MultiStepLR::closed_form_lr() {
  // bisect_right: the milestones <= last_epoch.
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * std::pow(gamma_, static_cast<double>(passed)));
  return lrs;
}

// ---- ExponentialLR ----

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  check_factor("ExponentialLR", "gamma", gamma);
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  std::vector<double> lrs = current_lrs(optimizer_);
  if (last_epoch_ == 0) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

std::vector<double> ExponentialLR::closed_form_lr() {
  std::vector<double> lrs;
  for (double base : base_lrs_)
    lrs.push_back(base * std::pow(gamma_, static_cast<double>(last_epoch_)));
  return lrs;
}

// ---- CosineAnnealingLR ----

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingLR"), T_max_(T_max), eta_min_(eta_min) {
  KILN_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, got {}", T_max);
  check_factor("CosineAnnealingLR", "eta_min", eta_min);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  constexpr double pi = std::numbers::pi;
  const double T = static_cast<double>(T_max_), e = static_cast<double>(last_epoch_);
  std::vector<double> lrs = current_lrs(optimizer_);
  if (last_epoch_ == 0) return lrs;
  if (step_count_ == 1 && last_epoch_ > 0) return closed_form_lr();
  for (size_t g = 0; g < lrs.size(); ++g) {
    if ((last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0) {
      // The bottom of a cycle: the recursive ratio below would divide by zero.
      lrs[g] += (base_lrs_[g] - eta_min_) * (1 - std::cos(pi / T)) / 2;
    } else {
      lrs[g] = (1 + std::cos(pi * e / T)) / (1 + std::cos(pi * (e - 1) / T)) * (lrs[g] - eta_min_) +
               eta_min_;
    }
  }
  return lrs;
}

std::vector<double> CosineAnnealingLR::closed_form_lr() {
  constexpr double pi = std::numbers::pi;
  std::vector<double> lrs;
  for (double base : base_lrs_) {
    lrs.push_back(eta_min_ + (base - eta_min_) *
                                 (1 + std::cos(pi * static_cast<double>(last_epoch_) /
                                               static_cast<double>(T_max_))) /
                                 2);
  }
  return lrs;
}

// ---- LinearLR ----

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer, "LinearLR"),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  KILN_CHECK(start_factor > 0 && start_factor <= 1,
             "LinearLR: start_factor must be in (0, 1], got {}", start_factor);
  KILN_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got {}",
             end_factor);
  KILN_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got {}", total_iters);
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  std::vector<double> lrs = current_lrs(optimizer_);
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr *= start_factor_;
    return lrs;
  }
  if (last_epoch_ > total_iters_) return lrs;
  const double delta = end_factor_ - start_factor_;
  const double factor = 1.0 + delta / (static_cast<double>(total_iters_) * start_factor_ +
                                       static_cast<double>(last_epoch_ - 1) * delta);
  for (double& lr : lrs) lr *= factor;
  return lrs;
}

std::vector<double> LinearLR::closed_form_lr() {
  std::vector<double> lrs;
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  for (double base : base_lrs_) {
    lrs.push_back(base * (start_factor_ + (end_factor_ - start_factor_) * done /
                                              static_cast<double>(total_iters_)));
  }
  return lrs;
}

// ---- LambdaLR, MultiplicativeLR ----

// One function per group, each set: LambdaLR's and MultiplicativeLR's argument check.
static void check_lambdas(const std::vector<std::function<double(int64_t)>>& lambdas, const Optimizer& optimizer,
                          const char* name) {
  KILN_CHECK(lambdas.size() == optimizer.param_groups().size(), "{}: expected {} lr_lambdas (one per group), got {}",
             name, optimizer.param_groups().size(), lambdas.size());
  for (size_t g = 0; g < lambdas.size(); ++g) {
    KILN_CHECK(static_cast<bool>(lambdas[g]), "{}: lr_lambda {} is empty", name, g);
  }
}

LambdaLR::LambdaLR(Optimizer& optimizer, Lambda lr_lambda)
    : LambdaLR(optimizer, std::vector<Lambda>(optimizer.param_groups().size(), lr_lambda)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas)
    : LRScheduler(optimizer, "LambdaLR"), lr_lambdas_(std::move(lr_lambdas)) {
  check_lambdas(lr_lambdas_, optimizer, "LambdaLR");
  initial_step();
}

MultiplicativeLR::MultiplicativeLR(Optimizer& optimizer, Lambda lr_lambda)
    : MultiplicativeLR(optimizer, std::vector<Lambda>(optimizer.param_groups().size(), lr_lambda)) {}

MultiplicativeLR::MultiplicativeLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas)
    : LRScheduler(optimizer, "MultiplicativeLR"), lr_lambdas_(std::move(lr_lambdas)) {
  check_lambdas(lr_lambdas_, optimizer, "MultiplicativeLR");
  initial_step();
}

std::vector<double> MultiplicativeLR::get_lr() {
  std::vector<double> lrs = current_lrs(optimizer_);
  if (last_epoch_ > 0) {
    for (size_t g = 0; g < lrs.size(); ++g) lrs[g] *= lr_lambdas_[g](last_epoch_);
  }
  return lrs;
}

// ---- ConstantLR ----

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer, "ConstantLR"), factor_(factor), total_iters_(total_iters) {
  // PyTorch takes a factor of 0, then divides by it at total_iters (ZeroDivisionError).
  KILN_CHECK(factor > 0 && factor <= 1, "ConstantLR: factor must be in (0, 1], got {}", factor);
  KILN_CHECK(total_iters >= 0, "ConstantLR: total_iters must be >= 0, got {}", total_iters);
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  std::vector<double> lrs = current_lrs(optimizer_);
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr *= factor_;
  } else if (last_epoch_ == total_iters_) {
    for (double& lr : lrs) lr *= 1.0 / factor_;
  }
  return lrs;
}

std::vector<double> ConstantLR::closed_form_lr() {
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * (last_epoch_ >= total_iters_ ? 1.0 : factor_));
  return lrs;
}

// ---- PolynomialLR ----

PolynomialLR::PolynomialLR(Optimizer& optimizer, int64_t total_iters, double power)
    : LRScheduler(optimizer, "PolynomialLR"), total_iters_(total_iters), power_(power) {
  KILN_CHECK(total_iters > 0, "PolynomialLR: total_iters must be positive, got {}", total_iters);
  KILN_CHECK(std::isfinite(power) && power >= 0, "PolynomialLR: power must be finite and >= 0, got {}", power);
  initial_step();
}

std::vector<double> PolynomialLR::get_lr() {
  std::vector<double> lrs = current_lrs(optimizer_);
  if (last_epoch_ == 0 || last_epoch_ > total_iters_) return lrs;
  const double T = static_cast<double>(total_iters_), e = static_cast<double>(last_epoch_);
  const double decay = std::pow((1.0 - e / T) / (1.0 - (e - 1) / T), power_);
  for (double& lr : lrs) lr *= decay;
  return lrs;
}

std::vector<double> PolynomialLR::closed_form_lr() {
  std::vector<double> lrs;
  const double T = static_cast<double>(total_iters_);
  for (double base : base_lrs_) {
    lrs.push_back(base * std::pow(1.0 - static_cast<double>(std::min(total_iters_, last_epoch_)) / T, power_));
  }
  return lrs;
}

// ---- CosineAnnealingWarmRestarts ----

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t T_0, int64_t T_mult,
                                                         double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingWarmRestarts"), T_0_(T_0), T_mult_(T_mult), eta_min_(eta_min) {
  KILN_CHECK(T_0 > 0, "CosineAnnealingWarmRestarts: T_0 must be positive, got {}", T_0);
  KILN_CHECK(T_mult >= 1, "CosineAnnealingWarmRestarts: T_mult must be >= 1, got {}", T_mult);
  check_factor("CosineAnnealingWarmRestarts", "eta_min", eta_min);
  initial_step();
}

std::vector<double> CosineAnnealingWarmRestarts::annealed() const {
  std::vector<double> lrs;
  const double phase = std::numbers::pi * static_cast<double>(T_cur_) / static_cast<double>(T_i_);
  for (double base : base_lrs_) lrs.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(phase)) / 2);
  return lrs;
}

// PyTorch's step(): epoch 0 starts the first cycle, each later step moves one epoch and restarts at the
// cycle's end.
std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  if (last_epoch_ == 0) {
    T_cur_ = 0;
    T_i_ = T_0_;
  } else if (++T_cur_ >= T_i_) {
    T_cur_ -= T_i_;
    T_i_ *= T_mult_;
  }
  return annealed();
}

// PyTorch's step(epoch): the cycle that holds the epoch, found from the epoch alone.
std::vector<double> CosineAnnealingWarmRestarts::closed_form_lr() {
  T_i_ = T_0_;
  T_cur_ = last_epoch_;
  while (T_cur_ >= T_i_) {  // at most log_T_mult(epoch) cycles, or epoch / T_0 when T_mult is 1
    if (T_mult_ == 1) {
      T_cur_ %= T_i_;
      break;
    }
    T_cur_ -= T_i_;
    T_i_ *= T_mult_;
  }
  return annealed();
}

TensorDict CosineAnnealingWarmRestarts::state_dict() const {
  TensorDict dict = LRScheduler::state_dict();
  dict.insert("T_cur", scalar_tensor(T_cur_, kInt64));
  dict.insert("T_i", scalar_tensor(T_i_, kInt64));
  return dict;
}

void CosineAnnealingWarmRestarts::load_state_dict(const TensorDict& dict) {
  const Tensor* cur = dict.find("T_cur");
  const Tensor* len = dict.find("T_i");
  KILN_CHECK(cur != nullptr && len != nullptr && cur->numel() == 1 && len->numel() == 1,
             "CosineAnnealingWarmRestarts.load_state_dict: the state dict lacks 'T_cur' or 'T_i'");
  const int64_t T_cur = cur->item<int64_t>(), T_i = len->item<int64_t>();
  KILN_CHECK(T_i >= T_0_ && T_cur >= 0 && T_cur < T_i,
             "CosineAnnealingWarmRestarts.load_state_dict: 'T_cur' {} and 'T_i' {} do not make a cycle of this "
             "scheduler (T_0 = {}); the state dict is damaged or was saved with other arguments", T_cur, T_i, T_0_);
  LRScheduler::load_state_dict(dict);
  T_cur_ = T_cur;
  T_i_ = T_i;
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g)
    lrs.push_back(base_lrs_[g] * lr_lambdas_[g](last_epoch_));
  return lrs;
}

// ---- CyclicLR ----

CyclicLR::CyclicLR(Optimizer& optimizer, CyclicLROptions options)
    : LRScheduler(optimizer, "CyclicLR", /*record_initial_lr=*/false), options_(std::move(options)) {
  const CyclicLROptions& o = options_;
  auto& groups = optimizer.param_groups();
  const std::vector<double> base_lrs = values_per_group(optimizer, o.base_lrs, o.base_lr, "CyclicLR", "base_lrs");
  max_lrs_ = values_per_group(optimizer, o.max_lrs, o.max_lr, "CyclicLR", "max_lrs");
  for (size_t g = 0; g < groups.size(); ++g) {
    KILN_CHECK(base_lrs[g] > 0 && max_lrs_[g] >= base_lrs[g] && std::isfinite(max_lrs_[g]),
               "CyclicLR: group {} needs 0 < base_lr <= max_lr, got base_lr {} and max_lr {}", g, base_lrs[g],
               max_lrs_[g]);
  }
  KILN_CHECK(o.step_size_up > 0 && o.step_size_down >= 0,
             "CyclicLR: step_size_up must be positive and step_size_down >= 0 (0: step_size_up), got {} and {}",
             o.step_size_up, o.step_size_down);
  KILN_CHECK(o.scale_fn || o.mode == "triangular" || o.mode == "triangular2" || o.mode == "exp_range",
             "CyclicLR: mode must be 'triangular', 'triangular2' or 'exp_range' (or give a scale_fn), got '{}'", o.mode);
  KILN_CHECK(!o.scale_fn || o.scale_mode == "cycle" || o.scale_mode == "iterations",
             "CyclicLR: scale_mode must be 'cycle' or 'iterations', got '{}'", o.scale_mode);
  const double up = static_cast<double>(o.step_size_up);
  total_size_ = up + static_cast<double>(o.step_size_down > 0 ? o.step_size_down : o.step_size_up);
  step_ratio_ = up / total_size_;
  if (o.cycle_momentum) {
    KILN_CHECK(o.base_momentum >= 0 && o.max_momentum >= 0 && std::isfinite(o.base_momentum) &&
                   std::isfinite(o.max_momentum),
               "CyclicLR: base_momentum and max_momentum must be finite and >= 0, got {} and {}", o.base_momentum,
               o.max_momentum);
    KILN_CHECK(groups.at(0).has("momentum"),
               "CyclicLR: {} has no momentum to cycle; pass cycle_momentum = false (PyTorch 1.13 cycles only "
               "\"momentum\")", optimizer.name());
  }
  // As PyTorch: the lr (and momentum) start at the bottom, and base_lr is each group's initial_lr.
  base_lrs_ = base_lrs;
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].set_lr(base_lrs[g]);
    if (!groups[g].has("initial_lr")) groups[g].set("initial_lr", base_lrs[g]);
    if (o.cycle_momentum) groups[g].set("momentum", o.base_momentum);
  }
  initial_step();
}

// The height's factor: the given scale_fn, or the mode's (of the cycle, or of the step for exp_range).
double CyclicLR::scale(double cycle) const {
  const CyclicLROptions& o = options_;
  const double step = static_cast<double>(last_epoch_);
  if (o.scale_fn) return o.scale_fn(o.scale_mode == "cycle" ? cycle : step);
  if (o.mode == "triangular") return 1.0;
  if (o.mode == "triangular2") return 1.0 / std::pow(2.0, cycle - 1);
  return std::pow(o.gamma, step);  // exp_range
}

std::vector<double> CyclicLR::get_lr() {
  const double e = static_cast<double>(last_epoch_);
  const double cycle = std::floor(1 + e / total_size_);
  const double x = 1.0 + e / total_size_ - cycle;
  const double factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double s = scale(cycle);
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g) lrs.push_back(base_lrs_[g] + (max_lrs_[g] - base_lrs_[g]) * factor * s);
  if (options_.cycle_momentum) {
    const double top = options_.max_momentum, bottom = options_.base_momentum;
    for (ParamGroup& group : optimizer_.param_groups()) group.set("momentum", top - (top - bottom) * factor * s);
  }
  return lrs;
}

// ---- OneCycleLR ----

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions options)
    : LRScheduler(optimizer, "OneCycleLR", /*record_initial_lr=*/false),
      options_(std::move(options)) {
  const OneCycleLROptions& o = options_;
  if (o.total_steps > 0) {
    total_steps_ = o.total_steps;
  } else {
    KILN_CHECK(o.total_steps == 0, "OneCycleLR: expected a positive total_steps, got {}",
               o.total_steps);
    KILN_CHECK(
        o.epochs > 0 && o.steps_per_epoch > 0,
        "OneCycleLR: define either total_steps or (epochs and steps_per_epoch), all positive "
        "(got epochs {}, steps_per_epoch {})",
        o.epochs, o.steps_per_epoch);
    total_steps_ = o.epochs * o.steps_per_epoch;
  }
  const size_t groups = optimizer.param_groups().size();
  const std::vector<double> max_lrs = values_per_group(optimizer, o.max_lrs, o.max_lr, "OneCycleLR", "max_lrs");
  if (o.max_lrs.empty()) {
    KILN_CHECK(o.max_lr > 0, "OneCycleLR: max_lr is required and must be positive, got {}", o.max_lr);
  }
  for (size_t g = 0; g < groups; ++g) {
    KILN_CHECK(max_lrs[g] > 0 && std::isfinite(max_lrs[g]), "OneCycleLR: max_lrs[{}] must be positive and finite, "
               "got {}", g, max_lrs[g]);
  }
  KILN_CHECK(o.pct_start >= 0 && o.pct_start <= 1,
             "OneCycleLR: expected pct_start in [0, 1], got {}", o.pct_start);
  KILN_CHECK(o.anneal_strategy == "cos" || o.anneal_strategy == "linear",
             "OneCycleLR: anneal_strategy must be 'cos' or 'linear', got '{}'", o.anneal_strategy);
  // The lr starts at max_lr / div_factor and ends at that / final_div_factor: both finite and > 0
  // (PyTorch's division by 0 raises ZeroDivisionError).
  KILN_CHECK(o.div_factor > 0 && std::isfinite(o.div_factor) && o.final_div_factor > 0 &&
                 std::isfinite(o.final_div_factor),
             "OneCycleLR: div_factor and final_div_factor must be positive and finite, got {} and {}", o.div_factor,
             o.final_div_factor);
  const double total = static_cast<double>(total_steps_);
  if (o.three_phase) {
    phases_ = {
        {o.pct_start * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
        {2 * o.pct_start * total - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"},
        {total - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"}};
  } else {
    phases_ = {{o.pct_start * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
               {total - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"}};
  }
  if (o.cycle_momentum) {
    const ParamGroup& first = optimizer.param_groups().at(0);
    momentum_name_ = first.has("beta1") ? "beta1" : first.has("momentum") ? "momentum" : nullptr;
    KILN_CHECK(momentum_name_ != nullptr,
               "OneCycleLR: {} has no momentum or beta1 to cycle; pass "
               "cycle_momentum = false",
               optimizer.name());
    // What the optimizer itself accepts: beta1 in [0, 1), a momentum >= 0.
    const double top = std::string(momentum_name_) == "beta1" ? 1.0 : std::numeric_limits<double>::infinity();
    KILN_CHECK(o.base_momentum >= 0 && o.max_momentum >= 0 && o.base_momentum < top && o.max_momentum < top,
               "OneCycleLR: base_momentum and max_momentum become {}'s {}, which must be {}; got {} and {}",
               optimizer.name(), momentum_name_, top == 1.0 ? "in [0, 1)" : "finite and >= 0", o.base_momentum,
               o.max_momentum);
  }
  base_lrs_.clear();
  for (size_t g = 0; g < groups; ++g) {
    ParamGroup& group = optimizer.param_groups()[g];
    const double max_lr = max_lrs[g];
    group.set("initial_lr", max_lr / o.div_factor);
    group.set("max_lr", max_lr);
    group.set("min_lr", group.get("initial_lr") / o.final_div_factor);
    if (momentum_name_ != nullptr) {
      group.set(momentum_name_, o.max_momentum);
      group.set("max_momentum", o.max_momentum);
      group.set("base_momentum", o.base_momentum);
    }
    base_lrs_.push_back(group.get("initial_lr"));
  }
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == "cos")
    return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
  return (end - start) * pct + start;
}

std::vector<double> OneCycleLR::get_lr() {
  KILN_CHECK(last_epoch_ <= total_steps_,
             "OneCycleLR: tried to step {} times; the specified number of total steps is {}",
             last_epoch_ + 1, total_steps_);
  const double step_num = static_cast<double>(last_epoch_);
  std::vector<double> lrs;
  for (ParamGroup& group : optimizer_.param_groups()) {
    double start_step = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (step_num <= phase.end_step || i + 1 == phases_.size()) {
        // PyTorch divides by zero here (ZeroDivisionError); the lr would be NaN.
        KILN_CHECK(phase.end_step != start_step,
                   "OneCycleLR: step {} falls in phase {} of {}, which has no length (total_steps {}, pct_start "
                   "{}{}); use more total_steps or another pct_start",
                   last_epoch_, i + 1, phases_.size(), total_steps_, options_.pct_start,
                   options_.three_phase ? ", three_phase" : "");
        // Past 1 on the one step beyond the last phase that PyTorch allows (last_epoch == total_steps),
        // as PyTorch's: the anneal goes on past min_lr there (below 0 for the linear one).
        const double pct = (step_num - start_step) / (phase.end_step - start_step);
        lrs.push_back(anneal(group.get(phase.start_lr), group.get(phase.end_lr), pct));
        if (momentum_name_ != nullptr) {
          group.set(momentum_name_,
                    anneal(group.get(phase.start_momentum), group.get(phase.end_momentum), pct));
        }
        break;
      }
      start_step = phase.end_step;
    }
  }
  return lrs;
}

// ---- SequentialLR ----

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : ComposedScheduler(optimizer, "SequentialLR", std::move(schedulers)), milestones_(std::move(milestones)) {
  KILN_CHECK(milestones_.size() + 1 == schedulers_.size(),
             "SequentialLR: expects one milestone fewer than schedulers, got {} schedulers and {} "
             "milestones",
             schedulers_.size(), milestones_.size());
  last_epoch_ = 0;
  // Undo the first step each child took when built, then start the first one again.
  for (ParamGroup& group : optimizer.param_groups()) group.set_lr(group.get("initial_lr"));
  for (auto& s : schedulers_) --s->last_epoch_;
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

void SequentialLR::step() {
  ++last_epoch_;
  const size_t k =
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  LRScheduler& s = *schedulers_[k];
  if (k > 0 && milestones_[k - 1] == last_epoch_) {
    s.step_to(0);
  } else {
    s.step();
  }
  last_lr_ = s.get_last_lr();
}

// ---- ComposedScheduler, ChainedScheduler ----

ComposedScheduler::ComposedScheduler(Optimizer& optimizer, std::string name,
                                     std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler(optimizer, std::move(name), /*record_initial_lr=*/false), schedulers_(std::move(schedulers)) {
  KILN_CHECK(!schedulers_.empty(), "{}: got no schedulers", name_);
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    KILN_CHECK(schedulers_[k] != nullptr, "{}: scheduler {} is null", name_, k);
    KILN_CHECK(&schedulers_[k]->optimizer_ == &optimizer,
               "{}: scheduler {} ({}) drives another optimizer; all must drive the one {} drives", name_, k,
               schedulers_[k]->name_, name_);
  }
}

TensorDict ComposedScheduler::state_dict() const {
  TensorDict dict;
  dict.insert("last_epoch", scalar_tensor(last_epoch_, kInt64));
  dict.insert("last_lr", from_vector(last_lr_));
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    for (const auto& [key, t] : schedulers_[k]->state_dict()) {
      dict.insert(fmt::format("schedulers.{}.{}", k, key), t);
    }
  }
  return dict;
}

void ComposedScheduler::load_state_dict(const TensorDict& dict) {
  std::vector<TensorDict> children(schedulers_.size());
  for (const auto& [key, t] : dict) {
    if (key.rfind("schedulers.", 0) != 0) continue;
    const size_t dot = key.find('.', 11);
    size_t k = 0;
    const auto [end, ec] =
        std::from_chars(key.data() + 11, key.data() + std::min(dot, key.size()), k);
    KILN_CHECK(dot != std::string::npos && ec == std::errc() && end == key.data() + dot,
               "{}.load_state_dict: malformed entry '{}'; expected schedulers.<k>.<name>", name_, key);
    KILN_CHECK(k < schedulers_.size(), "{}.load_state_dict: '{}' names scheduler {} but there are {}", name_, key,
               k, schedulers_.size());
    children[k].insert(key.substr(dot + 1), t);
  }
  const Tensor* last_epoch = dict.find("last_epoch");
  const Tensor* last_lr = dict.find("last_lr");
  KILN_CHECK(last_epoch != nullptr && last_lr != nullptr,
             "{}.load_state_dict: the state dict lacks 'last_epoch' or 'last_lr'", name_);
  const int64_t epoch = last_epoch->item<int64_t>();
  KILN_CHECK(epoch >= -1 && epoch < (int64_t{1} << 53),
             "{}.load_state_dict: 'last_epoch' is {}, but it must be in [-1, 2^53); the state dict is damaged", name_,
             epoch);
  for (size_t k = 0; k < schedulers_.size(); ++k) schedulers_[k]->load_state_dict(children[k]);
  last_epoch_ = epoch;
  last_lr_ = last_lr->to(kFloat64).to_vector<double>();
}

// The optimizer of the first scheduler (an Error for none).
static Optimizer& first_optimizer(const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  KILN_CHECK(!schedulers.empty() && schedulers[0] != nullptr, "ChainedScheduler: got no schedulers");
  return schedulers[0]->optimizer();
}

ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers)
    // A copy, not a move: the order in which arguments are evaluated is unspecified.
    : ComposedScheduler(first_optimizer(schedulers), "ChainedScheduler", schedulers) {
  last_lr_ = current_lrs(optimizer_);  // each child has taken its first step
}

void ChainedScheduler::step() {
  for (auto& s : schedulers_) s->step();
  last_lr_ = current_lrs(optimizer_);
}

// ---- ReduceLROnPlateau ----

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : optimizer_(optimizer), options_(std::move(options)) {
  const ReduceLROnPlateauOptions& o = options_;
  KILN_CHECK(o.mode == "min" || o.mode == "max",
             "ReduceLROnPlateau: mode must be \"min\" (a metric that should fall, such as a loss) or "
             "\"max\" (one that should rise, such as an accuracy), got \"{}\"", o.mode);
  KILN_CHECK(o.threshold_mode == "rel" || o.threshold_mode == "abs",
             "ReduceLROnPlateau: threshold_mode must be \"rel\" or \"abs\", got \"{}\"",
             o.threshold_mode);
  KILN_CHECK(o.factor >= 0 && o.factor < 1, "ReduceLROnPlateau: factor must be in [0, 1), got {}",
             o.factor);
  KILN_CHECK(o.patience >= 0, "ReduceLROnPlateau: patience must be >= 0, got {}", o.patience);
  KILN_CHECK(o.cooldown >= 0, "ReduceLROnPlateau: cooldown must be >= 0, got {}", o.cooldown);
  KILN_CHECK(std::isfinite(o.threshold) && o.threshold >= 0,
             "ReduceLROnPlateau: threshold must be finite and >= 0, got {}", o.threshold);
  KILN_CHECK(std::isfinite(o.eps) && o.eps >= 0, "ReduceLROnPlateau: eps must be finite and >= 0, got {}",
             o.eps);
  min_lrs_ = values_per_group(optimizer_, o.min_lrs, o.min_lr, "ReduceLROnPlateau", "min_lrs");
  for (double m : min_lrs_) {
    KILN_CHECK(std::isfinite(m) && m >= 0, "ReduceLROnPlateau: a min_lr must be finite and >= 0, got {}",
               m);
  }
  best_ = o.mode == "min" ? std::numeric_limits<double>::infinity()
                          : -std::numeric_limits<double>::infinity();
}

// PyTorch's is_better; false for a NaN metric, whose comparisons are all false.
bool ReduceLROnPlateau::is_better(double metric) const {
  const ReduceLROnPlateauOptions& o = options_;
  const bool rel = o.threshold_mode == "rel";
  if (o.mode == "min") return metric < (rel ? best_ * (1 - o.threshold) : best_ - o.threshold);
  return metric > (rel ? best_ * (o.threshold + 1) : best_ + o.threshold);
}

void ReduceLROnPlateau::step(double metric) {
  check_group_count(optimizer_, min_lrs_.size(), "ReduceLROnPlateau");
  auto& groups = optimizer_.param_groups();
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (in_cooldown()) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad epochs in cooldown are not counted
  }
  if (num_bad_epochs_ > options_.patience) {
    for (size_t g = 0; g < groups.size(); ++g) {
      const double old_lr = groups[g].lr();
      const double new_lr = std::max(old_lr * options_.factor, min_lrs_[g]);
      if (old_lr - new_lr > options_.eps) groups[g].set_lr(new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_ = current_lrs(optimizer_);
}

void ReduceLROnPlateau::step(const Tensor& metric) {
  KILN_CHECK(metric.defined() && metric.numel() == 1,
             "ReduceLROnPlateau.step: the metric must be a tensor of one element, got {}",
             metric.defined() ? "shape " + metric.sizes().str() : std::string("an undefined tensor"));
  step(metric.item<double>());
}

const std::vector<double>& ReduceLROnPlateau::get_last_lr() const {
  KILN_CHECK(!last_lr_.empty(), "ReduceLROnPlateau: get_last_lr() before the first step(); call step(metric) first");
  return last_lr_;
}

TensorDict ReduceLROnPlateau::state_dict() const {
  TensorDict dict;
  dict.insert("last_epoch", scalar_tensor(last_epoch_, kInt64));
  dict.insert("num_bad_epochs", scalar_tensor(num_bad_epochs_, kInt64));
  dict.insert("cooldown_counter", scalar_tensor(cooldown_counter_, kInt64));
  dict.insert("best", scalar_tensor(best_, kFloat64));
  dict.insert("last_lr", from_vector(last_lr_));
  return dict;
}

void ReduceLROnPlateau::load_state_dict(const TensorDict& dict) {
  auto entry = [&](const char* key, bool single) -> const Tensor& {
    const Tensor* t = &state_entry(dict, key, "ReduceLROnPlateau");
    KILN_CHECK(!single || t->numel() == 1,
               "ReduceLROnPlateau.load_state_dict: '{}' has {} values, expected one; the state dict is damaged",
               key, t->numel());
    return *t;
  };
  const int64_t last_epoch = entry("last_epoch", true).item<int64_t>();
  const int64_t bad = entry("num_bad_epochs", true).item<int64_t>();
  const int64_t cooldown = entry("cooldown_counter", true).item<int64_t>();
  const double best = entry("best", true).item<double>();
  std::vector<double> last_lr = entry("last_lr", false).to(kFloat64).to_vector<double>();
  // Checked before any is taken, so that a damaged state dict leaves the scheduler as it was.
  KILN_CHECK(last_epoch >= 0 && bad >= 0 && cooldown >= 0 && cooldown <= options_.cooldown &&
                 last_epoch < (int64_t{1} << 53) && bad < (int64_t{1} << 53),
             "ReduceLROnPlateau.load_state_dict: 'last_epoch' {}, 'num_bad_epochs' {} and 'cooldown_counter' {} "
             "must be >= 0 (and the last at most this scheduler's cooldown, {}); the state dict is damaged or "
             "was saved with other options",
             last_epoch, bad, cooldown, options_.cooldown);
  KILN_CHECK(!std::isnan(best), "ReduceLROnPlateau.load_state_dict: 'best' is NaN; the state dict is damaged");
  KILN_CHECK(last_lr.empty() || last_lr.size() == min_lrs_.size(),
             "ReduceLROnPlateau.load_state_dict: 'last_lr' has {} values but the optimizer has {} groups",
             last_lr.size(), min_lrs_.size());
  check_loaded_lrs(last_lr, "last_lr", "ReduceLROnPlateau");
  last_epoch_ = last_epoch;
  num_bad_epochs_ = bad;
  cooldown_counter_ = cooldown;
  best_ = best;
  last_lr_ = std::move(last_lr);
}

}  // namespace kiln::optim

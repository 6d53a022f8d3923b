// optim/warmup_lr.cpp: DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (see warmup_lr.h).
#include "optim/warmup_lr.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace kiln::optim {

namespace {

// DeepSpeed's warmup fraction at iteration i of n: log(i + 1) / log(n), or i / n.
double warmup_fraction(const std::string& type, int64_t i, int64_t n) {
  if (type == "log") return std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(n));
  return static_cast<double>(i) / static_cast<double>(n);
}

void check_warmup_type(const char* name, const std::string& type) {
  // DeepSpeed falls back to "log" with a warning on an unknown type; a typo here is an Error.
  KILN_CHECK(type == "log" || type == "linear",
             "{}: warmup_type must be 'log' or 'linear', got '{}'", name, type);
}

}  // namespace

// ---- WarmupLR ----

WarmupLR::WarmupLR(Optimizer& optimizer, WarmupLROptions options)
    : WarmupLR(optimizer, std::move(options), "WarmupLR") {}

WarmupLR::WarmupLR(Optimizer& optimizer, WarmupLROptions options, const char* name)
    : LRScheduler(optimizer, name, /*record_initial_lr=*/false),
      options_(std::move(options)),
      warmup_num_steps_(std::max<int64_t>(2, options_.warmup_num_steps)) {
  check_warmup_type(name, options_.warmup_type);
  min_lrs_ = values_per_group(optimizer, options_.warmup_min_lrs, options_.warmup_min_lr, name, "warmup_min_lrs");
  max_lrs_ = values_per_group(optimizer, options_.warmup_max_lrs, options_.warmup_max_lr, name, "warmup_max_lrs");
}

double WarmupLR::warmup_gamma() const {
  return warmup_fraction(options_.warmup_type, last_epoch_, warmup_num_steps_);
}

double WarmupLR::gamma() const { return last_epoch_ < warmup_num_steps_ ? warmup_gamma() : 1.0; }

std::vector<double> WarmupLR::get_lr() {
  const double g = gamma();
  std::vector<double> lrs;
  for (size_t i = 0; i < min_lrs_.size(); ++i) lrs.push_back(min_lrs_[i] + (max_lrs_[i] - min_lrs_[i]) * g);
  return lrs;
}

// ---- WarmupDecayLR ----

WarmupDecayLR::WarmupDecayLR(Optimizer& optimizer, WarmupDecayLROptions o)
    : WarmupLR(optimizer,
               {.warmup_min_lr = o.warmup_min_lr,
                .warmup_max_lr = o.warmup_max_lr,
                .warmup_num_steps = o.warmup_num_steps,
                .warmup_type = o.warmup_type,
                .warmup_min_lrs = o.warmup_min_lrs,
                .warmup_max_lrs = o.warmup_max_lrs},
               "WarmupDecayLR"),
      total_num_steps_(o.total_num_steps) {
  KILN_CHECK(o.total_num_steps > 0,
             "WarmupDecayLR: total_num_steps is required and must be "
             "positive, got {}",
             o.total_num_steps);
}

double WarmupDecayLR::gamma() const {
  if (last_epoch_ < warmup_num_steps_) return warmup_gamma();
  return std::max(0.0,
                  static_cast<double>(total_num_steps_ - last_epoch_) /
                      std::max(1.0, static_cast<double>(total_num_steps_ - warmup_num_steps_)));
}

// ---- WarmupCosineLR ----

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, WarmupCosineLROptions options)
    : LRScheduler(optimizer, "WarmupCosineLR", /*record_initial_lr=*/false),
      options_(std::move(options)),
      warmup_num_steps_(std::max<int64_t>(2, options_.warmup_num_steps)) {
  check_warmup_type("WarmupCosineLR", options_.warmup_type);
  // DeepSpeed divides by total_num_steps - warmup_num_steps after the warmup.
  KILN_CHECK(options_.total_num_steps > warmup_num_steps_,
             "WarmupCosineLR: total_num_steps ({}) must exceed warmup_num_steps ({})",
             options_.total_num_steps, warmup_num_steps_);
}

std::vector<double> WarmupCosineLR::get_lr() {
  const WarmupCosineLROptions& o = options_;
  double ratio;
  if (last_epoch_ < warmup_num_steps_) {
    ratio = o.warmup_min_ratio + (1.0 - o.warmup_min_ratio) *
                                     warmup_fraction(o.warmup_type, last_epoch_, warmup_num_steps_);
  } else {
    const double s = static_cast<double>(last_epoch_ - warmup_num_steps_ + 1);
    const double n = static_cast<double>(o.total_num_steps - warmup_num_steps_);
    ratio = std::max(0.0, o.cos_min_ratio + (1.0 - o.cos_min_ratio) *
                                                (1 + std::cos(std::numbers::pi * s / n)) / 2);
  }
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * ratio);
  return lrs;
}

}  // namespace kiln::optim

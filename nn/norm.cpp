// nn/norm.cpp: see nn/norm.h.
#include "nn/norm.h"

#include <fmt/format.h>

#include "core/grad_mode.h"
#include "nn/functional.h"
#include "nn/linear.h"  // py_float
#include "ops/ops.h"

namespace kiln::nn {

namespace {

std::string py_tuple(const Shape& s) {  // (8,) or (3, 4)
  std::string out = "(";
  for (int i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

void check_normalized_shape(const Shape& shape, const char* layer) {
  for (int64_t n : shape) {
    KILN_CHECK(n >= 0, "nn::{}: normalized_shape must have non-negative sizes, got {}", layer, shape.str());
  }
}

// BatchNorm's and InstanceNorm's per-channel state, as PyTorch's: weight (ones) and bias (zeros) when
// affine; running_mean (zeros), running_var (ones) and num_batches_tracked (int64 0) when tracking.
void register_channel_state(Module& m, int64_t channels, bool affine, bool track, Tensor& weight, Tensor& bias,
                            Tensor& running_mean, Tensor& running_var, Tensor& num_batches_tracked) {
  if (affine) {
    weight = m.register_parameter("weight", ones({channels}));
    bias = m.register_parameter("bias", zeros({channels}));
  }
  if (track) {
    running_mean = m.register_buffer("running_mean", zeros({channels}));
    running_var = m.register_buffer("running_var", ones({channels}));
    num_batches_tracked = m.register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

}  // namespace

BatchNormBase::BatchNormBase(int64_t num_features, BatchNormOptions options)
    : num_features(num_features), options(options) {
  KILN_CHECK(num_features > 0, "nn::BatchNorm: num_features must be positive, got {}", num_features);
  register_channel_state(*this, num_features, options.affine, options.track_running_stats, weight, bias,
                         running_mean, running_var, num_batches_tracked);
}

Tensor BatchNormBase::forward(const Tensor& input) {
  check_input(input);
  KILN_CHECK(input.size(1) == num_features, "nn::{}: expected {} channels (dim 1), got input of shape {}", name(),
             num_features, input.sizes().str());
  double factor = options.momentum.value_or(0.0);
  if (is_training() && options.track_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    if (!options.momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  // Batch statistics while training, and always when there are no running statistics; across the
  // processes of `sync` while training, as PyTorch's SyncBatchNorm.
  if (is_training() && sync) {
    return sync->batch_norm(input, running_mean, running_var, weight, bias, factor, options.eps);
  }
  bool use_batch_stats = is_training() || !options.track_running_stats;
  return batch_norm(input, running_mean, running_var, weight, bias, use_batch_stats, factor, options.eps);
}

std::string BatchNormBase::name() const { return sync ? "SyncBatchNorm" : Module::name(); }

std::string BatchNormBase::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features,
                     py_float(options.eps), options.momentum ? py_float(*options.momentum) : "None",
                     py_bool(options.affine), py_bool(options.track_running_stats));
}

void BatchNorm1d::check_input(const Tensor& input) const {
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, "nn::BatchNorm1d: expected 2D or 3D input (got {}D input)",
             input.dim());
}

void BatchNorm2d::check_input(const Tensor& input) const {
  KILN_CHECK(input.dim() == 4, "nn::BatchNorm2d: expected 4D input (got {}D input)", input.dim());
}

void BatchNorm3d::check_input(const Tensor& input) const {
  KILN_CHECK(input.dim() == 5, "nn::BatchNorm3d: expected 5D input (got {}D input)", input.dim());
}

InstanceNormBase::InstanceNormBase(int64_t num_features, InstanceNormOptions options, int spatial_dims)
    : num_features(num_features), options(options), spatial_dims_(spatial_dims) {
  KILN_CHECK(num_features > 0, "nn::InstanceNorm: num_features must be positive, got {}", num_features);
  register_channel_state(*this, num_features, options.affine, options.track_running_stats, weight, bias,
                         running_mean, running_var, num_batches_tracked);
}

Tensor InstanceNormBase::forward(const Tensor& input) {
  const int batched = spatial_dims_ + 2;
  KILN_CHECK(input.dim() == batched || input.dim() == batched - 1,
             "nn::{}: expected {}D (batched) or {}D (unbatched) input, got shape {}", name(), batched, batched - 1,
             input.sizes().str());
  const Tensor x = input.dim() == batched ? input : input.unsqueeze(0);
  // PyTorch only warns when the channels differ without affine or statistics, which then never match.
  KILN_CHECK(x.size(1) == num_features || (!options.affine && !options.track_running_stats),
             "nn::{}: expected {} channels, got input of shape {}", name(), num_features, input.sizes().str());
  const Tensor out = instance_norm(x, running_mean, running_var, weight, bias,
                                   is_training() || !options.track_running_stats, options.momentum, options.eps);
  return input.dim() == batched ? out : out.squeeze(0);
}

std::string InstanceNormBase::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features,
                     py_float(options.eps), py_float(options.momentum), py_bool(options.affine),
                     py_bool(options.track_running_stats));
}

LayerNorm::LayerNorm(Shape normalized_shape, LayerNormOptions options)
    : normalized_shape(normalized_shape), options(options) {
  check_normalized_shape(normalized_shape, "LayerNorm");
  if (options.elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    if (options.bias) bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  return layer_norm(input, normalized_shape, weight, bias, options.eps);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}{}", py_tuple(normalized_shape), py_float(options.eps),
                     py_bool(options.elementwise_affine),
                     options.elementwise_affine && !options.bias ? ", bias=False" : "");
}

RMSNorm::RMSNorm(Shape normalized_shape, RMSNormOptions options) : normalized_shape(normalized_shape), options(options) {
  check_normalized_shape(normalized_shape, "RMSNorm");
  if (options.elementwise_affine) weight = register_parameter("weight", ones(normalized_shape));
}

Tensor RMSNorm::forward(const Tensor& input) { return rms_norm(input, normalized_shape, weight, options.eps); }

std::string RMSNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", py_tuple(normalized_shape),
                     options.eps ? py_float(*options.eps) : "None", py_bool(options.elementwise_affine));
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options)
    : num_groups(num_groups), num_channels(num_channels), options(options) {
  KILN_CHECK(num_groups > 0 && num_channels % num_groups == 0,
             "nn::GroupNorm: num_channels ({}) must be divisible by num_groups ({})", num_channels, num_groups);
  if (options.affine) {
    weight = register_parameter("weight", ones({num_channels}));
    bias = register_parameter("bias", zeros({num_channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& input) { return group_norm(input, num_groups, weight, bias, options.eps); }

LocalResponseNorm::LocalResponseNorm(int64_t size, LocalResponseNormOptions options) : size(size), options(options) {
  KILN_CHECK(size > 0, "nn::LocalResponseNorm: size must be positive, got {}", size);
}
Tensor LocalResponseNorm::forward(const Tensor& input) {
  return local_response_norm(input, size, options.alpha, options.beta, options.k);
}
std::string LocalResponseNorm::extra_repr() const {
  return fmt::format("{}, alpha={}, beta={}, k={}", size, py_float(options.alpha), py_float(options.beta),
                     py_float(options.k));
}

std::string GroupNorm::extra_repr() const {
  return fmt::format("{}, {}, eps={}, affine={}", num_groups, num_channels, py_float(options.eps),
                     py_bool(options.affine));
}

DropoutBase::DropoutBase(double p, const char* layer) : p(p) {
  KILN_CHECK(p >= 0 && p <= 1, "nn::{}: p must be in [0, 1], got {}", layer, p);
}

std::string DropoutBase::extra_repr() const { return fmt::format("p={}, inplace=False", py_float(p)); }

Tensor Dropout::forward(const Tensor& input) { return dropout(input, p, is_training()); }
Tensor Dropout1d::forward(const Tensor& input) { return dropout1d(input, p, is_training()); }
Tensor Dropout2d::forward(const Tensor& input) { return dropout2d(input, p, is_training()); }
Tensor Dropout3d::forward(const Tensor& input) { return dropout3d(input, p, is_training()); }
Tensor AlphaDropout::forward(const Tensor& input) { return alpha_dropout(input, p, is_training()); }
Tensor FeatureAlphaDropout::forward(const Tensor& input) { return feature_alpha_dropout(input, p, is_training()); }

}  // namespace kiln::nn

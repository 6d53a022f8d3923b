// nn/norm.h: BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d, LayerNorm, RMSNorm and GroupNorm over the ops of
// ops/ops.h (norm.cpp) and nn::functional::instance_norm, LocalResponseNorm, and the dropout layers (Dropout,
// Dropout1d/2d/3d, AlphaDropout, FeatureAlphaDropout). Affine weights start at one and biases at zero,
// as PyTorch.
#pragma once

#include <memory>
#include <optional>

#include "nn/module.h"

namespace kiln::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  // Weight of the new batch in the running statistics; none: a cumulative average (1 / batches seen).
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learnable weight and bias (C)
  bool track_running_stats = true;  // running_mean, running_var (C) and num_batches_tracked (int64)
};

// Batch statistics shared by several processes (PyTorch's SyncBatchNorm): a training BatchNorm that
// holds one normalises with the statistics of the whole batch, every process's part of it. nn knows
// only this interface; distributed::convert_sync_batchnorm and distributed::SyncBatchNorm
// (distributed/ddp/sync_batch_norm.h) give BatchNorms one that runs collectives.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // What batch_norm(input, running_mean, running_var, weight, bias, true, momentum, eps) gives on the
  // concatenation of every process's input along dim 0: this process's rows of it, and the running
  // statistics updated with the whole batch's.
  virtual Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& weight, const Tensor& bias, double momentum, double eps) = 0;
};

// Normalises each channel over the batch (and spatial dims). Training: batch statistics, and the running
// statistics are updated (by batch_norm) and num_batches_tracked counts the batches; eval: the running
// statistics. Without running statistics the batch statistics are used in both modes.
class BatchNormBase : public Module {
 public:
  BatchNormBase(int64_t num_features, BatchNormOptions options);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  std::string name() const override;  // "SyncBatchNorm" while `sync` is set, as PyTorch's converted layers

  int64_t num_features;
  BatchNormOptions options;
  Tensor weight, bias;                 // (C) when affine
  Tensor running_mean, running_var;    // (C) when tracking
  Tensor num_batches_tracked;          // () int64 when tracking
  // Set: while training, the batch statistics span every process that shares it (BatchNormSync).
  std::shared_ptr<BatchNormSync> sync;

 protected:
  virtual void check_input(const Tensor& input) const = 0;
  bool zero_when_missing(const std::string& buffer) const override { return buffer == "num_batches_tracked"; }
};

// input (N, C) or (N, C, L).
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {}) : BatchNormBase(num_features, options) {}

 protected:
  void check_input(const Tensor& input) const override;
};

// input (N, C, H, W).
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {}) : BatchNormBase(num_features, options) {}

 protected:
  void check_input(const Tensor& input) const override;
};

// input (N, C, D, H, W).
class BatchNorm3d : public BatchNormBase {
 public:
  explicit BatchNorm3d(int64_t num_features, BatchNormOptions options = {}) : BatchNormBase(num_features, options) {}

 protected:
  void check_input(const Tensor& input) const override;
};

struct InstanceNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;              // weight of the new batch's mean statistics in the running ones
  bool affine = false;                // learnable weight and bias (C)
  bool track_running_stats = false;  // running_mean, running_var (C) and num_batches_tracked, as PyTorch's
};

// Normalises each channel of each sample over its own spatial dims (nn::functional::instance_norm).
// Training, or without running statistics: each plane's own statistics (and the running statistics,
// when tracked, take their mean over the batch); eval with running statistics: those. The input is
// batched (N, C, *) or, one dim fewer, a single sample.
class InstanceNormBase : public Module {
 public:
  InstanceNormBase(int64_t num_features, InstanceNormOptions options, int spatial_dims);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t num_features;
  InstanceNormOptions options;
  Tensor weight, bias;               // (C) when affine
  Tensor running_mean, running_var;  // (C) when tracking
  Tensor num_batches_tracked;        // () int64 when tracking (kept at 0, as PyTorch's)

 protected:
  bool zero_when_missing(const std::string& buffer) const override { return buffer == "num_batches_tracked"; }

 private:
  int spatial_dims_;
};

// input (N, C, L) or (C, L).
class InstanceNorm1d : public InstanceNormBase {
 public:
  explicit InstanceNorm1d(int64_t num_features, InstanceNormOptions options = {})
      : InstanceNormBase(num_features, options, 1) {}
};
// input (N, C, H, W) or (C, H, W).
class InstanceNorm2d : public InstanceNormBase {
 public:
  explicit InstanceNorm2d(int64_t num_features, InstanceNormOptions options = {})
      : InstanceNormBase(num_features, options, 2) {}
};
// input (N, C, D, H, W) or (C, D, H, W).
class InstanceNorm3d : public InstanceNormBase {
 public:
  explicit InstanceNorm3d(int64_t num_features, InstanceNormOptions options = {})
      : InstanceNormBase(num_features, options, 3) {}
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // weight and bias of normalized_shape
  bool bias = true;                // with elementwise_affine: false keeps the weight only (PyTorch 2.1's option)
};
// Normalises over the trailing normalized_shape dims of each sample.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {});
  explicit LayerNorm(int64_t normalized_size, LayerNormOptions options = {})
      : LayerNorm(Shape{normalized_size}, options) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Shape normalized_shape;
  LayerNormOptions options;
  Tensor weight, bias;  // normalized_shape
};

struct RMSNormOptions {
  std::optional<double> eps = {};  // none: the machine epsilon of the input's dtype (PyTorch)
  bool elementwise_affine = true;  // a weight of normalized_shape
};
// x / sqrt(mean(x^2 over normalized_shape) + eps) * weight.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, RMSNormOptions options = {});
  explicit RMSNorm(int64_t normalized_size, RMSNormOptions options = {}) : RMSNorm(Shape{normalized_size}, options) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Shape normalized_shape;
  RMSNormOptions options;
  Tensor weight;  // normalized_shape
};

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;  // weight and bias (C)
};
// input (N, C, *): normalises each of num_groups groups of C / num_groups channels per sample.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t num_groups, num_channels;
  GroupNormOptions options;
  Tensor weight, bias;  // (C)
};

struct LocalResponseNormOptions {
  double alpha = 1e-4;
  double beta = 0.75;
  double k = 1.0;
};
// nn::functional::local_response_norm over windows of `size` channels (AlexNet's); no parameters.
class LocalResponseNorm : public Module {
 public:
  explicit LocalResponseNorm(int64_t size, LocalResponseNormOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t size;
  LocalResponseNormOptions options;
};

// The dropout layers' common part (PyTorch's _DropoutNd): p, checked in [0, 1] when the layer is made,
// and the repr "p=0.5, inplace=False".
class DropoutBase : public Module {
 public:
  std::string extra_repr() const override;

  double p;

 protected:
  DropoutBase(double p, const char* layer);
};

// Zeroes elements with probability p while training (scaling the rest by 1 / (1 - p)); the identity in eval.
class Dropout : public DropoutBase {
 public:
  explicit Dropout(double p = 0.5) : DropoutBase(p, "Dropout") {}
  Tensor forward(const Tensor& input) override;
};

// Channel dropout (torch.nn.Dropout1d/2d/3d): while training, every element of a (sample, channel)
// plane is zeroed together with probability p, the rest scaled by 1 / (1 - p); the identity in eval.
// Inputs as nn::functional::dropout1d/2d/3d.
class Dropout1d : public DropoutBase {
 public:
  explicit Dropout1d(double p = 0.5) : DropoutBase(p, "Dropout1d") {}
  Tensor forward(const Tensor& input) override;
};

class Dropout2d : public DropoutBase {
 public:
  explicit Dropout2d(double p = 0.5) : DropoutBase(p, "Dropout2d") {}
  Tensor forward(const Tensor& input) override;
};

class Dropout3d : public DropoutBase {
 public:
  explicit Dropout3d(double p = 0.5) : DropoutBase(p, "Dropout3d") {}
  Tensor forward(const Tensor& input) override;
};

// Alpha dropout for self-normalizing (SELU) networks, as nn::functional::alpha_dropout (each element)
// and feature_alpha_dropout (each (sample, channel)'s elements together); the identity in eval.
class AlphaDropout : public DropoutBase {
 public:
  explicit AlphaDropout(double p = 0.5) : DropoutBase(p, "AlphaDropout") {}
  Tensor forward(const Tensor& input) override;
};

class FeatureAlphaDropout : public DropoutBase {
 public:
  explicit FeatureAlphaDropout(double p = 0.5) : DropoutBase(p, "FeatureAlphaDropout") {}
  Tensor forward(const Tensor& input) override;
};

}  // namespace kiln::nn

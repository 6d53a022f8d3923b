// nn/fusion.cpp: see nn/fusion.h.
#include "nn/fusion.h"

#include <vector>

#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::nn::utils {

namespace {

// The per-output-channel factor (C) reshaped to multiply w: (C, 1, 1, ...), or for a transposed
// convolution's (C_in, C / groups, ...) weight, w seen as (groups, C_in / groups, C / groups, ...).
Tensor scaled_weight(const Tensor& w, const Tensor& factor, int64_t transposed_groups) {
  std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
  if (transposed_groups == 0) {
    shape[0] = -1;
    return w * factor.reshape(shape);
  }
  const int64_t groups = transposed_groups, c_in = w.size(0), per_group = w.size(1);
  KILN_CHECK(c_in % groups == 0 && per_group * groups == factor.numel(),
             "fuse_conv_bn_weights: a transposed weight of shape {} in {} groups has {} output channels, not the "
             "BatchNorm's {}",
             w.sizes().str(), groups, per_group * groups, factor.numel());
  std::vector<int64_t> grouped = {groups, c_in / groups};
  for (int64_t d = 1; d < w.dim(); ++d) grouped.push_back(w.size(d));
  std::vector<int64_t> factor_shape(grouped.size(), 1);
  factor_shape[0] = groups;
  factor_shape[2] = per_group;
  return (w.reshape(grouped) * factor.reshape(factor_shape)).reshape(w.sizes());
}

void check_eval(const Module& layer, const BatchNormBase& bn, int64_t outputs, const char* op) {
  KILN_CHECK(!layer.is_training() && !bn.is_training(),
             "{}: fusion is for evaluation only; call eval() on both the layer and the BatchNorm first", op);
  KILN_CHECK(bn.running_mean.defined(),
             "{}: the BatchNorm has no running statistics (track_running_stats = false): it normalises by each "
             "batch, which no fixed weight can do",
             op);
  KILN_CHECK(bn.num_features == outputs, "{}: the BatchNorm has {} channels but the layer {} outputs", op,
             bn.num_features, outputs);
}

// The fused weight and bias put into the layer: the weight's data replaced behind its handle, the
// bias too, or registered where the layer had none.
void install(Module& layer, Tensor& weight, Tensor& bias, std::pair<Tensor, Tensor> fused) {
  weight.set_data(fused.first.to(weight.dtype()));
  if (bias.defined()) {
    bias.set_data(fused.second.to(bias.dtype()));
  } else {
    bias = layer.register_parameter("bias", fused.second.to(weight.dtype()));
  }
}

template <class Conv>
void fuse_conv(Conv& conv, const BatchNormBase& bn, int64_t transposed_groups, const char* op) {
  check_eval(conv, bn, conv.out_channels, op);
  install(conv, conv.weight, conv.bias,
          fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.options.eps, bn.weight,
                               bn.bias, transposed_groups));
}

}  // namespace

std::pair<Tensor, Tensor> fuse_conv_bn_weights(const Tensor& w, const Tensor& b, const Tensor& bn_rm,
                                               const Tensor& bn_rv, double bn_eps, const Tensor& bn_w,
                                               const Tensor& bn_b, int64_t transposed_groups) {
  NoGradGuard no_grad;
  KILN_CHECK(w.defined() && w.dim() >= 2 && bn_rm.defined() && bn_rv.defined(),
             "fuse_conv_bn_weights: needs a weight of at least 2 dims and the BatchNorm's running mean and variance");
  const int64_t channels = bn_rm.numel();
  KILN_CHECK(transposed_groups > 0 || w.size(0) == channels,
             "fuse_conv_bn_weights: the weight of shape {} has {} output channels (dim 0), the BatchNorm {}",
             w.sizes().str(), w.size(0), channels);
  const Tensor rsqrt = (bn_rv + bn_eps).rsqrt();
  const Tensor scale = bn_w.defined() ? bn_w * rsqrt : rsqrt;
  const Tensor shift = bn_b.defined() ? bn_b : zeros_like(bn_rm);
  const Tensor bias = b.defined() ? b : zeros_like(bn_rm);
  return {scaled_weight(w, scale, transposed_groups), (bias - bn_rm) * scale + shift};
}

std::pair<Tensor, Tensor> fuse_linear_bn_weights(const Tensor& w, const Tensor& b, const Tensor& bn_rm,
                                                 const Tensor& bn_rv, double bn_eps, const Tensor& bn_w,
                                                 const Tensor& bn_b) {
  KILN_CHECK(w.defined() && w.dim() == 2, "fuse_linear_bn_weights: needs a 2-D (out, in) weight");
  return fuse_conv_bn_weights(w, b, bn_rm, bn_rv, bn_eps, bn_w, bn_b);
}

void fuse_conv_bn_eval(Conv1d& conv, const BatchNormBase& bn) { fuse_conv(conv, bn, 0, "fuse_conv_bn_eval"); }
void fuse_conv_bn_eval(Conv2d& conv, const BatchNormBase& bn) { fuse_conv(conv, bn, 0, "fuse_conv_bn_eval"); }
void fuse_conv_bn_eval(Conv3d& conv, const BatchNormBase& bn) { fuse_conv(conv, bn, 0, "fuse_conv_bn_eval"); }
void fuse_conv_bn_eval(ConvTranspose1d& conv, const BatchNormBase& bn) {
  fuse_conv(conv, bn, conv.options.groups, "fuse_conv_bn_eval");
}
void fuse_conv_bn_eval(ConvTranspose2d& conv, const BatchNormBase& bn) {
  fuse_conv(conv, bn, conv.options.groups, "fuse_conv_bn_eval");
}
void fuse_conv_bn_eval(ConvTranspose3d& conv, const BatchNormBase& bn) {
  fuse_conv(conv, bn, conv.options.groups, "fuse_conv_bn_eval");
}

void fuse_linear_bn_eval(Linear& linear, const BatchNormBase& bn) {
  check_eval(linear, bn, linear.out_features, "fuse_linear_bn_eval");
  install(linear, linear.weight, linear.bias,
          fuse_linear_bn_weights(linear.weight, linear.bias, bn.running_mean, bn.running_var, bn.options.eps, bn.weight,
                                 bn.bias));
}

}  // namespace kiln::nn::utils

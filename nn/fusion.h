// nn/fusion.h: torch.nn.utils.fusion: an evaluation-mode BatchNorm folded into the convolution or
// Linear before it, so that inference runs one layer where it ran two:
//   conv.eval();  bn.eval();
//   nn::utils::fuse_conv_bn_eval(conv, bn);   // conv(x) now gives what bn(conv(x)) gave
// PyTorch's fuse_conv_bn_eval returns a fused deep copy of the convolution; C++ modules are not
// copied (Note [module ownership] in nn/module.h), so these change the layer itself: its weight's
// data (the same handle, as `param.data = ...`) and its bias (registered where it had none), and
// leave bn alone. The BatchNorm must track running statistics.
#pragma once

#include <utility>

#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/norm.h"

namespace kiln::nn::utils {

// The weight and bias of the layer whose output is bn's of (w, b)'s, with the statistics and affine
// of an evaluation-mode BatchNorm: each output channel's weights times bn_w / sqrt(bn_rv + eps), and
// b = (b - bn_rm) bn_w / sqrt(bn_rv + eps) + bn_b. Output channels are dim 0 of a convolution's or
// Linear's weight; with `transposed_groups` > 0, w is a transposed convolution's (C_in, C_out /
// groups, ...) weight of that many groups (PyTorch's `transpose = True`, there only for groups = 1).
// b, bn_w and bn_b may be undefined (0, 1 and 0). No gradient is recorded.
std::pair<Tensor, Tensor> fuse_conv_bn_weights(const Tensor& w, const Tensor& b, const Tensor& bn_rm,
                                               const Tensor& bn_rv, double bn_eps, const Tensor& bn_w,
                                               const Tensor& bn_b, int64_t transposed_groups = 0);
std::pair<Tensor, Tensor> fuse_linear_bn_weights(const Tensor& w, const Tensor& b, const Tensor& bn_rm,
                                                 const Tensor& bn_rv, double bn_eps, const Tensor& bn_w,
                                                 const Tensor& bn_b);

// bn folded into the layer before it; both in evaluation mode, bn's channels the layer's outputs.
void fuse_conv_bn_eval(Conv1d& conv, const BatchNormBase& bn);
void fuse_conv_bn_eval(Conv2d& conv, const BatchNormBase& bn);
void fuse_conv_bn_eval(Conv3d& conv, const BatchNormBase& bn);
void fuse_conv_bn_eval(ConvTranspose1d& conv, const BatchNormBase& bn);
void fuse_conv_bn_eval(ConvTranspose2d& conv, const BatchNormBase& bn);
void fuse_conv_bn_eval(ConvTranspose3d& conv, const BatchNormBase& bn);
void fuse_linear_bn_eval(Linear& linear, const BatchNormBase& bn);

}  // namespace kiln::nn::utils

// ops/conv.cpp: conv2d, conv1d (a conv2d over a height-1 image) and conv3d (the backend's 3-D kernels
// where it has them, as the CPU's; else one conv2d, Note [conv3d as conv2d]), conv_transpose2d and
// conv_transpose1d (conv2d's backward, Note [transposed convolution]), and the two ops that are a
// convolution's backward: the gradient with respect to the input and with respect to the weight
// (kernels: cpu/conv.cpp). Those three are linear in each argument, so each one's backward is written
// with the other two:
//   out = conv2d(x, w):                 dx = backward_input(g, w),  dw = backward_weight(g, x)
//   gx = backward_input(g, w):          dg = conv2d(ggx, w),        dw = backward_weight(g, ggx)
//   gw = backward_weight(g, x):         dg = conv2d(x, ggw),        dx = backward_input(g, ggw)
// which gives double backward (gradient penalties) for free. float16 (and bfloat16 on CUDA) run in
// float32.
#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <vector>

#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/flops.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using autograd::TensorList;

namespace {

ConvArgs conv_args(const Shape& stride, const Shape& padding, const Shape& dilation, int64_t groups, const char* op) {
  ConvArgs a;
  pair_arg(stride, op, "stride", 1, a.stride_h, a.stride_w);
  pair_arg(padding, op, "padding", 0, a.pad_h, a.pad_w);
  pair_arg(dilation, op, "dilation", 1, a.dilation_h, a.dilation_w);
  KILN_CHECK(groups >= 1, "{}: groups must be positive, got {}", op, groups);
  a.groups = groups;
  return a;
}

// Note [convolution geometry in 128 bits]
// Sizes, strides, paddings and dilations are any int64 a caller passes, and a tensor with no elements
// may have a dim of 2^62: dil * (k - 1), in + 2 * pad and (in - 1) * stride can pass 2^63, where a
// signed int64 overflows (undefined, and in practice a wrapped size that some later check names
// wrongly). So the geometry is computed in 128 bits, where no product of two int64 overflows, and a
// result is narrowed to int64 only once it is known to fit.
using Wide = __int128;
constexpr Wide kMaxSize = std::numeric_limits<int64_t>::max();

// The output length (in + 2 pad - dil (k - 1) - 1) / stride + 1; the caller checked that the padded
// input holds the dilated kernel.
int64_t conv_out_size(int64_t in, int64_t k, int64_t pad, int64_t dil, int64_t stride, const char* op) {
  const Wide n = (Wide{in} + 2 * Wide{pad} - Wide{dil} * (Wide{k} - 1) - 1) / stride + 1;
  KILN_CHECK(n <= kMaxSize, "{}: the output would be {} long (input {}, padding {}): past 2^63", op, n, in, pad);
  return static_cast<int64_t>(n);
}

// The output shape of a 2-D (4-D input) or 3-D (5-D input) convolution; checks the channels and the
// sizes (the backward ops' given shapes too).
Shape conv_output_shape(const Shape& in, const Shape& w, const ConvArgs& a, const char* op) {
  const int dims = in.size() - 2;  // 2 or 3 spatial dims, the weight's last ones
  for (int i = 0; i < in.size(); ++i) {
    KILN_CHECK(in[i] >= 0 && w[i] >= 0, "{}: sizes must be non-negative, got input {} and weight {}", op, in.str(),
               w.str());
  }
  KILN_CHECK(w[0] % a.groups == 0, "{}: the weight's {} output channels are not divisible by groups {}", op,
             w[0], a.groups);
  KILN_CHECK(Wide{in[1]} == Wide{w[1]} * a.groups,
             "{}: the input {} has {} channels, but the weight {} with groups {} expects {} (weight dim 1 times "
             "groups)",
             op, in.str(), in[1], w.str(), a.groups, Wide{w[1]} * a.groups);
  // Per spatial dim (depth, height, width; a 2-D convolution's are the last two).
  const std::array<int64_t, 3> stride{a.stride_d, a.stride_h, a.stride_w}, pad{a.pad_d, a.pad_h, a.pad_w},
      dil{a.dilation_d, a.dilation_h, a.dilation_w};
  std::string padded, eff;
  bool fits = true;
  for (int i = 0; i < dims; ++i) {
    const int arg = 3 - dims + i;
    const Wide e = Wide{dil[arg]} * (Wide{w[2 + i]} - 1) + 1, p = Wide{in[2 + i]} + 2 * Wide{pad[arg]};
    fits = fits && p >= e;
    padded += (i ? " x " : "") + fmt::format("{}", p);
    eff += (i ? " x " : "") + fmt::format("{}", e);
  }
  KILN_CHECK(fits, "{}: the padded input ({}) is smaller than the dilated kernel ({}); input {}, weight {}", op,
             padded, eff, in.str(), w.str());
  Shape out{in[0], w[0]};
  for (int i = 0; i < dims; ++i) {
    const int arg = 3 - dims + i;
    out.push_back(conv_out_size(in[2 + i], w[2 + i], pad[arg], dil[arg], stride[arg], op));
  }
  return out;
}

Shape stride_of(const ConvArgs& a) { return {a.stride_h, a.stride_w}; }
Shape padding_of(const ConvArgs& a) { return {a.pad_h, a.pad_w}; }
Shape dilation_of(const ConvArgs& a) { return {a.dilation_h, a.dilation_w}; }


void check_float_pair(const char* op, const Tensor& a, const Tensor& b, const char* names = "input and weight") {
  check_same_device(op, a, b);
  KILN_CHECK(is_floating(a.dtype()), "{}: needs floating-point tensors, got {}", op, dtype_name(a.dtype()));
  KILN_CHECK(a.dtype() == b.dtype(), "{}: the {} must have the same dtype, got {} and {}", op, names,
             dtype_name(a.dtype()), dtype_name(b.dtype()));
}

// Whether t's 16-bit dtype goes through float32 copies to the kernels: float16 always, bfloat16 on
// CUDA; the CPU's kernels read bfloat16 as it is (Note [bfloat16 convolution] in cpu/conv.cpp).
bool through_float32(const Tensor& t) {
  return is_reduced_float(t.dtype()) && !(t.dtype() == kBFloat16 && t.device().is_cpu());
}

Tensor conv_backward_input_impl(const Tensor& grad_output, const Tensor& weight, const Shape& input_shape,
                                const ConvArgs& a, const char* op);
Tensor conv_backward_weight_impl(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                                 const ConvArgs& a, const char* op);

// The names of a 2-D (4-D tensors) or 3-D (5-D) convolution's ops and autograd nodes.
struct ConvNames {
  const char *forward, *backward_input, *backward_weight, *node, *input_node, *weight_node;
};
const ConvNames& conv_names(const Shape& shape) {
  static const ConvNames two{"conv2d",         "conv2d_backward_input",       "conv2d_backward_weight",
                             "Conv2dBackward", "Conv2dBackwardInputBackward", "Conv2dBackwardWeightBackward"};
  static const ConvNames three{"conv3d",         "conv3d_backward_input",       "conv3d_backward_weight",
                               "Conv3dBackward", "Conv3dBackwardInputBackward", "Conv3dBackwardWeightBackward"};
  return shape.size() == 5 ? three : two;
}

// A 2-D convolution of a 4-D input, or (on a backend with conv3d_kernels()) a 3-D one of a 5-D input.
Tensor conv_impl(const Tensor& input, const Tensor& weight, const Tensor& bias, const ConvArgs& a, const char* op) {
  check_float_pair(op, input, weight);
  if (bias.defined()) {
    check_float_pair(op, input, bias, "input and bias");
    KILN_CHECK(bias.dim() == 1 && bias.sizes()[0] == weight.sizes()[0],
               "{}: bias must have shape [{}] (one per output channel), got {}", op, weight.sizes()[0],
               bias.sizes().str());
  }
  Shape out_shape = conv_output_shape(input.sizes(), weight.sizes(), a, op);
  if (through_float32(input)) {
    Tensor b = bias.defined() ? bias.to(kFloat32) : Tensor();
    return conv_impl(input.to(kFloat32), weight.to(kFloat32), b, a, op).to(input.dtype());
  }
  Tensor x = input.contiguous(), w = weight.contiguous(), b = bias.defined() ? bias.contiguous() : Tensor();
  Tensor out = empty_tensor(out_shape, x.dtype(), x.device());
  // Per output element, (C_in / groups) x kH x kW (x kD) products; and the bias's add.
  flops::Op count(out.numel() * w.numel() / w.size(0), b.defined() ? out.numel() : 0);
  View bias_view;
  if (b.defined()) bias_view = view_of(b);
  if (out.numel() > 0) {
    backend_for(x.device()).conv(view_of(x), view_of(w), bias_view, view_of(out), a, stream_for(x.device()));
  }
  if (should_record({input, weight, bias})) {
    const ConvNames& names = conv_names(x.sizes());
    record(names.node, {input, weight, bias}, {out},
           [xs = SavedTensor(weight.requires_grad() ? x : Tensor(), false),
            ws = SavedTensor(input.requires_grad() ? w : Tensor(), false), a, in_shape = x.sizes(),
            w_shape = w.sizes(), &names](const Grads& g) -> TensorList {
             Tensor gx, gw, gb;
             if (g.needs_grad(0))
               gx = conv_backward_input_impl(g[0], ws.unpack(names.node), in_shape, a, names.backward_input);
             if (g.needs_grad(1))
               gw = conv_backward_weight_impl(g[0], xs.unpack(names.node), w_shape, a, names.backward_weight);
             if (g.needs_grad(2)) gb = in_shape.size() == 5 ? g[0].sum({0, 2, 3, 4}) : g[0].sum({0, 2, 3});
             return {gx, gw, gb};
           });
  }
  return out;
}

// A convolution's two backward ops: grad_output and weight 4-D or 5-D alike, checked against the
// input shape (Note at the top of this file for their own backward).
Tensor conv_backward_input_impl(const Tensor& grad_output, const Tensor& weight, const Shape& input_shape,
                                const ConvArgs& a, const char* op) {
  check_float_pair(op, grad_output, weight);
  Shape out_shape = conv_output_shape(input_shape, weight.sizes(), a, op);
  KILN_CHECK(grad_output.sizes() == out_shape, "{}: grad_output has shape {}, but the convolution's output is {}",
             op, grad_output.sizes().str(), out_shape.str());
  if (through_float32(weight)) {
    return conv_backward_input_impl(grad_output.to(kFloat32), weight.to(kFloat32), input_shape, a, op)
        .to(weight.dtype());
  }
  Tensor g = grad_output.contiguous(), w = weight.contiguous();
  Tensor gx = empty_tensor(input_shape, w.dtype(), w.device());
  if (gx.numel() > 0) {
    if (g.numel() == 0 || w.numel() == 0) {
      gx.zero_();
    } else {
      backend_for(w.device()).conv_backward_input(view_of(g), view_of(w), view_of(gx), a, stream_for(w.device()));
    }
  }
  if (should_record(grad_output, weight)) {
    const ConvNames& names = conv_names(input_shape);
    record(names.input_node, {grad_output, weight}, {gx},
           [gs = SavedTensor(weight.requires_grad() ? g : Tensor(), false),
            ws = SavedTensor(grad_output.requires_grad() ? w : Tensor(), false), a, w_shape = w.sizes(),
            &names](const Grads& gg) -> TensorList {
             Tensor dg, dw;
             if (gg.needs_grad(0)) dg = conv_impl(gg[0], ws.unpack(names.input_node), {}, a, names.forward);
             if (gg.needs_grad(1)) {
               dw = conv_backward_weight_impl(gs.unpack(names.input_node), gg[0], w_shape, a, names.backward_weight);
             }
             return {dg, dw};
           });
  }
  return gx;
}

Tensor conv_backward_weight_impl(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                                 const ConvArgs& a, const char* op) {
  check_float_pair(op, grad_output, input);
  Shape out_shape = conv_output_shape(input.sizes(), weight_shape, a, op);
  KILN_CHECK(grad_output.sizes() == out_shape, "{}: grad_output has shape {}, but the convolution's output is {}",
             op, grad_output.sizes().str(), out_shape.str());
  if (through_float32(input)) {
    return conv_backward_weight_impl(grad_output.to(kFloat32), input.to(kFloat32), weight_shape, a, op)
        .to(input.dtype());
  }
  Tensor g = grad_output.contiguous(), x = input.contiguous();
  Tensor gw = empty_tensor(weight_shape, x.dtype(), x.device());
  if (gw.numel() > 0) {
    if (g.numel() == 0) {
      gw.zero_();
    } else {
      backend_for(x.device()).conv_backward_weight(view_of(g), view_of(x), view_of(gw), a, stream_for(x.device()));
    }
  }
  if (should_record(grad_output, input)) {
    const ConvNames& names = conv_names(weight_shape);
    record(names.weight_node, {grad_output, input}, {gw},
           [gs = SavedTensor(input.requires_grad() ? g : Tensor(), false),
            xs = SavedTensor(grad_output.requires_grad() ? x : Tensor(), false), a, x_shape = x.sizes(),
            &names](const Grads& gg) -> TensorList {
             Tensor dg, dx;
             if (gg.needs_grad(0)) dg = conv_impl(xs.unpack(names.weight_node), gg[0], {}, a, names.forward);
             if (gg.needs_grad(1)) {
               dx = conv_backward_input_impl(gs.unpack(names.weight_node), gg[0], x_shape, a, names.backward_input);
             }
             return {dg, dx};
           });
  }
  return gw;
}

}  // namespace

inline namespace ops {

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              const Shape& padding, const Shape& dilation, int64_t groups) {
  if (autocast::is_enabled(input.device().type)) {  // See Note [autocast] in ops/autocast.h
    if (autocast::OpScope ac{autocast::Op::Conv2d, input.device()})
      return conv2d(ac.cast(input), ac.cast(weight), ac.cast(bias), stride, padding, dilation, groups);
  }
  KILN_CHECK(input.dim() == 3 || input.dim() == 4,
             "conv2d: expected a 3-D (unbatched C, H, W) or 4-D (batched N, C, H, W) input, got shape {}",
             input.sizes().str());
  KILN_CHECK(weight.dim() == 4, "conv2d: expected a 4-D weight (C_out, C_in / groups, kH, kW), got shape {}",
             weight.sizes().str());
  ConvArgs a = conv_args(stride, padding, dilation, groups, "conv2d");
  if (input.dim() == 3) return conv_impl(input.unsqueeze(0), weight, bias, a, "conv2d").squeeze(0);
  return conv_impl(input, weight, bias, a, "conv2d");
}

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Conv1d, input.device()})
      return conv1d(ac.cast(input), ac.cast(weight), ac.cast(bias), stride, padding, dilation, groups);
  }
  KILN_CHECK(input.dim() == 2 || input.dim() == 3,
             "conv1d: expected a 2-D (unbatched C, L) or 3-D (batched N, C, L) input, got shape {}",
             input.sizes().str());
  KILN_CHECK(weight.dim() == 3, "conv1d: expected a 3-D weight (C_out, C_in / groups, k), got shape {}",
             weight.sizes().str());
  KILN_CHECK(stride >= 1 && dilation >= 1 && padding >= 0,
             "conv1d: stride ({}) and dilation ({}) must be positive and padding ({}) non-negative", stride, dilation,
             padding);
  ConvArgs a = conv_args({1, stride}, {0, padding}, {1, dilation}, groups, "conv1d");
  // The channel and length checks here, so that their messages show the 1-D shapes.
  const Shape& in = input.sizes();
  const Shape& w = weight.sizes();
  const int64_t channels = in[in.size() - 2], length = in[in.size() - 1];
  KILN_CHECK(w[0] % groups == 0, "conv1d: the weight's {} output channels are not divisible by groups {}", w[0],
             groups);
  KILN_CHECK(Wide{channels} == Wide{w[1]} * groups,
             "conv1d: the input {} has {} channels, but the weight {} with groups {} expects {} (weight dim 1 times "
             "groups)",
             in.str(), channels, w.str(), groups, Wide{w[1]} * groups);
  const Wide padded = Wide{length} + 2 * Wide{padding}, eff = Wide{dilation} * (w[2] - 1) + 1;
  KILN_CHECK(padded >= eff,
             "conv1d: the padded input length {} is shorter than the dilated kernel ({}); input {}, weight {}",
             padded, eff, in.str(), w.str());
  Tensor x = input.dim() == 2 ? input.unsqueeze(0) : input;
  Tensor out = conv_impl(x.unsqueeze(2), weight.unsqueeze(2), bias, a, "conv1d").squeeze(2);
  return input.dim() == 2 ? out.squeeze(0) : out;
}

// Note [conv3d as conv2d]
// On a backend without 3-D kernels (CUDA; the CPU's are Note [3-D convolution] in cpu/conv.cpp):
// a 3-D convolution is one 2-D convolution once the depth windows are moved into the channels: output
// depth t reads input depths t * sD + kd * dD - pD for kd < kD, so those kD slices of every channel,
// stacked as (kD, C) channels (group by group), are a 2-D image per (n, t), and the weight
// (C_out, C_in / groups, kD, kH, kW) read as (C_out, kD * C_in / groups, kH, kW) is its 2-D kernel.
// The stacked input is kD / sD times the input's size (the depth-only form of im2col). Built from
// views (slice, view, permute) and one stack, it is differentiable twice over through conv2d's own
// backward, and runs on any device conv2d runs on.
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              const Shape& padding, const Shape& dilation, int64_t groups) {
  const char* op = "conv3d";
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::Conv3d, input.device()})
      return conv3d(ac.cast(input), ac.cast(weight), ac.cast(bias), stride, padding, dilation, groups);
  }
  KILN_CHECK(input.dim() == 4 || input.dim() == 5,
             "conv3d: expected a 4-D (unbatched C, D, H, W) or 5-D (batched N, C, D, H, W) input, got shape {}",
             input.sizes().str());
  KILN_CHECK(weight.dim() == 5, "conv3d: expected a 5-D weight (C_out, C_in / groups, kD, kH, kW), got shape {}",
             weight.sizes().str());
  check_float_pair(op, input, weight);
  const auto s = triple_arg(stride, op, "stride", 1), p = triple_arg(padding, op, "padding", 0),
             d = triple_arg(dilation, op, "dilation", 1);
  KILN_CHECK(groups >= 1, "conv3d: groups must be positive, got {}", groups);
  Tensor x = input.dim() == 4 ? input.unsqueeze(0) : input;
  const Shape in = x.sizes(), w = weight.sizes();
  KILN_CHECK(w[0] % groups == 0, "conv3d: the weight's {} output channels are not divisible by groups {}", w[0],
             groups);
  KILN_CHECK(Wide{in[1]} == Wide{w[1]} * groups,
             "conv3d: the input {} has {} channels, but the weight {} with groups {} expects {} (weight dim 1 times "
             "groups)",
             in.str(), in[1], w.str(), groups, Wide{w[1]} * groups);
  std::array<Wide, 3> padded, eff;
  for (int i = 0; i < 3; ++i) padded[i] = Wide{in[2 + i]} + 2 * Wide{p[i]}, eff[i] = Wide{d[i]} * (w[2 + i] - 1) + 1;
  for (int i = 0; i < 3; ++i) {
    KILN_CHECK(padded[i] >= eff[i],
               "conv3d: the padded input ({} x {} x {}) is smaller than the dilated kernel ({} x {} x {}); input {}, "
               "weight {}",
               padded[0], padded[1], padded[2], eff[0], eff[1], eff[2], in.str(), w.str());
  }
  KILN_CHECK(w[2] > 0 && w[3] > 0 && w[4] > 0, "conv3d: the weight's kernel sizes must be positive, got weight {}",
             w.str());
  if (backend_for(x.device()).conv3d_kernels()) {  // Note [3-D convolution] in cpu/conv.cpp
    ConvArgs a;
    a.stride_d = s[0], a.stride_h = s[1], a.stride_w = s[2], a.pad_d = p[0], a.pad_h = p[1], a.pad_w = p[2];
    a.dilation_d = d[0], a.dilation_h = d[1], a.dilation_w = d[2], a.groups = groups;
    Tensor out = conv_impl(x, weight, bias, a, op);
    return input.dim() == 4 ? out.squeeze(0) : out;
  }
  const int64_t N = in[0], C = in[1], H = in[3], W = in[4], kD = w[2], O = w[0];
  const int64_t Do = conv_out_size(in[2], kD, p[0], d[0], s[0], op);
  if (p[0] > 0) x = pad(x, {0, 0, 0, 0, p[0], p[0]});
  // Each tap is a view (N, Do, groups, C / groups, H, W) of x; stacked at dim 3 they are one contiguous
  // (N, Do, groups, kD, C / groups, H, W) tensor, so the stack is the only copy.
  std::vector<Tensor> taps;
  for (int64_t kd = 0; kd < kD; ++kd) {
    taps.push_back(x.slice(2, kd * d[0], kd * d[0] + s[0] * (Do - 1) + 1, s[0])  // (N, C, Do, H, W)
                       .view({N, groups, C / groups, Do, H, W})
                       .permute({0, 3, 1, 2, 4, 5}));
  }
  Tensor image = stack(taps, 3).view({N * Do, C * kD, H, W});
  Tensor kernel = weight.permute({0, 2, 1, 3, 4}).reshape({O, kD * w[1], w[3], w[4]});
  Tensor out = conv2d(image, kernel, bias, {s[1], s[2]}, {p[1], p[2]}, {d[1], d[2]}, groups);  // (N Do, O, Ho, Wo)
  out = out.view({N, Do, O, out.size(2), out.size(3)}).permute({0, 2, 1, 3, 4}).contiguous();
  return input.dim() == 4 ? out.squeeze(0) : out;
}

// Note [transposed convolution]
// conv_transpose2d is the adjoint of conv2d: the gradient of conv2d(z, weight) with respect to z,
// applied to the input. Its weight (C_in, C_out / groups, kH, kW) is that conv2d's weight as it is
// (conv2d maps C_out channels back to C_in), and its output size is the smallest z whose conv2d has
// the input's size, (H - 1) * stride - 2 * padding + dilation * (k - 1) + 1, plus output_padding
// (< stride or < dilation, as PyTorch). conv2d of that z has H + output_padding / stride rows, so the
// input gets that many zero rows at the end first (their windows add nothing): then the gradient is
// taken at the full output size, and with padding the padded-on rows get what the windows put there.
// Differentiable twice over through pad's and conv2d_backward_input's backward.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
                        const Shape& padding, const Shape& output_padding, int64_t groups, const Shape& dilation) {
  const char* op = "conv_transpose2d";
  if (autocast::is_enabled(input.device().type)) {
    if (autocast::OpScope ac{autocast::Op::ConvTranspose2d, input.device()}) {
      return conv_transpose2d(ac.cast(input), ac.cast(weight), ac.cast(bias), stride, padding, output_padding,
                              groups, dilation);
    }
  }
  KILN_CHECK(input.dim() == 3 || input.dim() == 4,
             "conv_transpose2d: expected a 3-D (unbatched C, H, W) or 4-D (batched N, C, H, W) input, got shape {}",
             input.sizes().str());
  KILN_CHECK(weight.dim() == 4,
             "conv_transpose2d: expected a 4-D weight (C_in, C_out / groups, kH, kW), got shape {}",
             weight.sizes().str());
  check_float_pair(op, input, weight);
  if (bias.defined()) check_float_pair(op, input, bias, "input and bias");
  const ConvArgs a = conv_args(stride, padding, dilation, groups, op);
  int64_t op_h = 0, op_w = 0;
  pair_arg(output_padding, op, "output_padding", 0, op_h, op_w);
  KILN_CHECK((op_h < a.stride_h || op_h < a.dilation_h) && (op_w < a.stride_w || op_w < a.dilation_w),
             "conv_transpose2d: output_padding {} must be smaller than either stride or dilation in each dim "
             "(stride ({}, {}), dilation ({}, {}))",
             output_padding.str(), a.stride_h, a.stride_w, a.dilation_h, a.dilation_w);
  Tensor x = input.dim() == 3 ? input.unsqueeze(0) : input;
  const Shape& in = x.sizes();
  const Shape& w = weight.sizes();
  KILN_CHECK(in[2] > 0 && in[3] > 0, "conv_transpose2d: expected a non-empty height and width, got input {}",
             in.str());
  KILN_CHECK(w[2] > 0 && w[3] > 0, "conv_transpose2d: the weight's kernel sizes must be positive, got weight {}",
             w.str());
  KILN_CHECK(in[1] == w[0],
             "conv_transpose2d: the input {} has {} channels, but the weight {} expects {} (its dim 0, C_in)",
             in.str(), in[1], w.str(), w[0]);
  KILN_CHECK(w[0] >= groups && w[0] % groups == 0,
             "conv_transpose2d: the weight's {} input channels are not divisible by groups {}", w[0], groups);
  const Wide channels_out = Wide{w[1]} * groups;
  KILN_CHECK(channels_out <= kMaxSize, "conv_transpose2d: the weight {} with groups {} gives more output channels "
             "than fit in 64 bits", w.str(), groups);
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == channels_out),
             "conv_transpose2d: the bias must be 1-D with {} elements (the output channels), got shape {}",
             channels_out, bias.defined() ? bias.sizes().str() : std::string());
  const Wide out_h = Wide{in[2] - 1} * a.stride_h - 2 * Wide{a.pad_h} + Wide{a.dilation_h} * (w[2] - 1) + 1 + op_h;
  const Wide out_w = Wide{in[3] - 1} * a.stride_w - 2 * Wide{a.pad_w} + Wide{a.dilation_w} * (w[3] - 1) + 1 + op_w;
  KILN_CHECK(out_h > 0 && out_w > 0,
             "conv_transpose2d: the output would be empty ({} x {}): padding {} is too large for input {} and "
             "weight {}",
             out_h, out_w, padding.str(), in.str(), w.str());
  int64_t out_numel = 0;  // also the bias add's flop count
  KILN_CHECK(out_h <= kMaxSize && out_w <= kMaxSize &&
                 !__builtin_mul_overflow(in[0], static_cast<int64_t>(channels_out), &out_numel) &&
                 !__builtin_mul_overflow(out_numel, static_cast<int64_t>(out_h), &out_numel) &&
                 !__builtin_mul_overflow(out_numel, static_cast<int64_t>(out_w), &out_numel),
             "conv_transpose2d: the output ({} x {} x {} x {}) would have more elements than fit in 64 bits; input {}, "
             "weight {}, stride {}", in[0], channels_out, out_h, out_w, in.str(), w.str(), stride.str());
  if (is_reduced_float(input.dtype())) {  // in float32, the bias added before rounding, as PyTorch's kernels
    Tensor out = conv_transpose2d(x.to(kFloat32), weight.to(kFloat32), bias.defined() ? bias.to(kFloat32) : bias,
                                  stride, padding, output_padding, groups, dilation);
    out = out.to(input.dtype());
    return input.dim() == 3 ? out.squeeze(0) : out;
  }
  // Each input element times (C_out / groups) x kH x kW weights; and the bias's add.
  flops::Op count(input.numel() * weight.numel() / w[0], bias.defined() ? out_numel : 0);
  const int64_t extra_h = op_h / a.stride_h, extra_w = op_w / a.stride_w;  // zero rows and columns of x
  if (extra_h > 0 || extra_w > 0) x = pad(x, {0, extra_w, 0, extra_h});
  const Shape out_shape{in[0], static_cast<int64_t>(channels_out), static_cast<int64_t>(out_h),
                        static_cast<int64_t>(out_w)};
  Tensor out = conv2d_backward_input(x, weight, out_shape, stride_of(a), padding_of(a), dilation_of(a), groups);
  if (bias.defined()) out = out + bias.view({1, -1, 1, 1});
  return input.dim() == 3 ? out.squeeze(0) : out;
}

Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride,
                        int64_t padding, int64_t output_padding, int64_t groups, int64_t dilation) {
  KILN_CHECK(input.dim() == 2 || input.dim() == 3,
             "conv_transpose1d: expected a 2-D (unbatched C, L) or 3-D (batched N, C, L) input, got shape {}",
             input.sizes().str());
  KILN_CHECK(weight.dim() == 3, "conv_transpose1d: expected a 3-D weight (C_in, C_out / groups, k), got shape {}",
             weight.sizes().str());
  KILN_CHECK(stride >= 1 && dilation >= 1 && padding >= 0 && output_padding >= 0,
             "conv_transpose1d: stride ({}) and dilation ({}) must be positive, padding ({}) and output_padding ({}) "
             "non-negative",
             stride, dilation, padding, output_padding);
  KILN_CHECK(output_padding < stride || output_padding < dilation,
             "conv_transpose1d: output_padding {} must be smaller than either stride ({}) or dilation ({})",
             output_padding, stride, dilation);
  const int64_t channels = input.size(-2), length = input.size(-1);
  KILN_CHECK(channels == weight.size(0),
             "conv_transpose1d: the input {} has {} channels, but the weight {} expects {} (its dim 0, C_in)",
             input.sizes().str(), channels, weight.sizes().str(), weight.size(0));
  KILN_CHECK(length > 0 && weight.size(2) > 0, "conv_transpose1d: expected a non-empty length and kernel, got input "
             "{} and weight {}", input.sizes().str(), weight.sizes().str());
  const Wide out_length =
      Wide{length - 1} * stride - 2 * Wide{padding} + Wide{dilation} * (weight.size(2) - 1) + 1 + output_padding;
  KILN_CHECK(out_length > 0, "conv_transpose1d: the output would be empty (length {}): padding {} is too large for "
             "input {} and weight {}", out_length, padding, input.sizes().str(), weight.sizes().str());
  // A height-1 image with a height-1 kernel: the height dim's stride 1 allows no output padding there.
  return conv_transpose2d(input.unsqueeze(-2), weight.unsqueeze(2), bias, {1, stride}, {0, padding},
                          {0, output_padding}, groups, {1, dilation})
      .squeeze(-2);
}

// Note [conv_transpose3d as conv_transpose2d]
// conv_transpose3d is conv3d's adjoint: input depth t sends its values through the kernel's depth tap
// kd to output depth t sD + kd dD - pD. For one (t, kd) pair that is the 2-D transposed convolution of
// depth slice t with the weight's slice kd, and all kD taps at once are one conv_transpose2d over the
// (n, t) slices as a batch, whose weight (C_in, C_out / groups, kD, kH, kW) is read as (C_in,
// kD C_out / groups, kH, kW): per group its output channels come out as (kd, c). An index_add sums
// each (t, kd) slice into its output depth, the padding crops the depths, and the last
// output_padding depths hold only the bias. conv_transpose2d handles height and width, with their
// padding and output padding. Differentiable twice over, on any device conv_transpose2d runs on.
Tensor conv_transpose3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
                        const Shape& padding, const Shape& output_padding, int64_t groups, const Shape& dilation) {
  const char* op = "conv_transpose3d";
  KILN_CHECK(input.dim() == 4 || input.dim() == 5,
             "{}: expected a 4-D (unbatched C, D, H, W) or 5-D (batched N, C, D, H, W) input, got shape {}", op,
             input.sizes().str());
  KILN_CHECK(weight.dim() == 5, "{}: expected a 5-D weight (C_in, C_out / groups, kD, kH, kW), got shape {}", op,
             weight.sizes().str());
  if (!autocast::is_enabled(input.device().type)) {  // else conv_transpose2d casts
    check_float_pair(op, input, weight);
    if (bias.defined()) check_float_pair(op, input, bias, "input and bias");
  }
  const auto s = triple_arg(stride, op, "stride", 1), p = triple_arg(padding, op, "padding", 0),
             d = triple_arg(dilation, op, "dilation", 1);
  const auto o = triple_arg(output_padding, op, "output_padding", 0);
  KILN_CHECK(o[0] < s[0] || o[0] < d[0],
             "{}: output_padding {} must be smaller than either stride or dilation in each dim (stride {}, dilation {})",
             op, output_padding.str(), stride.str(), dilation.str());
  KILN_CHECK(groups >= 1, "{}: groups must be positive, got {}", op, groups);
  const Tensor x = input.dim() == 4 ? input.unsqueeze(0) : input;
  const Shape in = x.sizes(), w = weight.sizes();
  KILN_CHECK(in[1] == w[0], "{}: the input {} has {} channels, but the weight {} expects {} (its dim 0, C_in)", op,
             in.str(), in[1], w.str(), w[0]);
  KILN_CHECK(in[2] > 0 && w[2] > 0, "{}: expected a non-empty depth and kernel depth, got input {} and weight {}", op,
             in.str(), w.str());
  KILN_CHECK(w[0] % groups == 0, "{}: the weight's {} input channels are not divisible by groups {}", op, w[0],
             groups);
  const int64_t N = in[0], C = in[1], D = in[2], kD = w[2], per_group = w[1];
  const Wide full_depth = Wide{D - 1} * s[0] + Wide{d[0]} * (kD - 1) + 1 + o[0];
  KILN_CHECK(full_depth - 2 * Wide{p[0]} > 0 && full_depth <= kMaxSize,
             "{}: the output depth would be {}: padding {} does not fit input {} and weight {}", op,
             static_cast<int64_t>(std::clamp<Wide>(full_depth - 2 * Wide{p[0]}, -kMaxSize, kMaxSize)), padding.str(),
             in.str(), w.str());
  const Wide channels_out = Wide{per_group} * groups;
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == channels_out),
             "{}: the bias must be 1-D with {} elements (the output channels), got shape {}", op,
             static_cast<int64_t>(std::min<Wide>(channels_out, kMaxSize)), bias.defined() ? bias.sizes().str() : "");
  // Every tap at once: (C_in, C_out / groups, kD, kH, kW) as (C_in, kD C_out / groups, kH, kW).
  const Tensor taps = weight.permute({0, 2, 1, 3, 4}).reshape({C, kD * per_group, w[3], w[4]});
  const Tensor slices = x.permute({0, 2, 1, 3, 4}).reshape({N * D, C, in[3], in[4]});
  Tensor y = conv_transpose2d(slices, taps, {}, {s[1], s[2]}, {p[1], p[2]}, {o[1], o[2]}, groups, {d[1], d[2]});
  const int64_t Ho = y.size(2), Wo = y.size(3);
  // (N D, groups kD per_group, Ho, Wo) -> (N, groups per_group, D kD, Ho, Wo), each (t, kd) to t sD + kd dD.
  y = y.view({N, D, groups, kD, per_group, Ho, Wo})
          .permute({0, 2, 4, 1, 3, 5, 6})
          .reshape({N, groups * per_group, D * kD, Ho, Wo});
  Tensor depths = empty({D * kD}, kInt64);
  int64_t* next = depths.data_ptr<int64_t>();
  for (int64_t t = 0; t < D; ++t) {
    for (int64_t kd = 0; kd < kD; ++kd) *next++ = t * s[0] + kd * d[0];
  }
  Tensor out = index_add(zeros({N, groups * per_group, static_cast<int64_t>(full_depth), Ho, Wo}, y.options()), 2,
                         depths.to(y.device()), y);
  if (p[0] > 0) out = out.narrow(2, p[0], static_cast<int64_t>(full_depth) - 2 * p[0]).contiguous();
  if (bias.defined()) out = out + bias.to(out.dtype()).view({1, -1, 1, 1, 1});
  return input.dim() == 4 ? out.squeeze(0) : out;
}

Tensor conv2d_backward_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_shape,
                             const Shape& stride, const Shape& padding, const Shape& dilation, int64_t groups) {
  const char* op = "conv2d_backward_input";
  KILN_CHECK(weight.dim() == 4 && input_shape.size() == 4 && grad_output.dim() == 4,
             "{}: expected a 4-D grad_output, weight and input shape, got {}, {} and {}", op,
             grad_output.sizes().str(), weight.sizes().str(), input_shape.str());
  return conv_backward_input_impl(grad_output, weight, input_shape, conv_args(stride, padding, dilation, groups, op),
                                  op);
}

Tensor conv2d_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                              const Shape& stride, const Shape& padding, const Shape& dilation, int64_t groups) {
  const char* op = "conv2d_backward_weight";
  KILN_CHECK(input.dim() == 4 && weight_shape.size() == 4 && grad_output.dim() == 4,
             "{}: expected a 4-D grad_output, input and weight shape, got {}, {} and {}", op,
             grad_output.sizes().str(), input.sizes().str(), weight_shape.str());
  return conv_backward_weight_impl(grad_output, input, weight_shape, conv_args(stride, padding, dilation, groups, op),
                                   op);
}

}  // namespace ops
}  // namespace kiln

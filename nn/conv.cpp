// nn/conv.cpp: see nn/conv.h.
#include "nn/conv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "nn/functional.h"
#include "nn/init.h"
#include "nn/linear.h"  // py_float
#include "ops/ops.h"

namespace kiln::nn {

namespace {

// "same" padding of one spatial dim: total d * (k - 1), the smaller half on the left; an odd total puts
// the extra element on the right (PyTorch's rule), done by padding the input first.
struct SamePad {
  int64_t left, extra;
};
SamePad same_pad(int64_t kernel, int64_t dilation) {
  int64_t total = dilation * (kernel - 1);
  return {total / 2, total - 2 * (total / 2)};
}

// The input and the padding a convolution runs with, for its padding `mode`: "same" (the extra element
// of an odd total padded onto the right of the input first), "valid", or the explicit `sizes` (mode
// empty). `kernel` and `dilation` are over the last kernel.size() dims of the input.
std::pair<Tensor, Shape> resolve_padding(const Tensor& input, const std::string& mode, const Shape& sizes,
                                         const Shape& kernel, const Shape& dilation) {
  if (mode.empty()) return {input, sizes};
  const int n = kernel.size();
  Shape padding = Shape::filled(n, 0);
  if (mode == "valid") return {input, padding};
  std::vector<int64_t> extra(2 * static_cast<size_t>(n), 0);  // pad()'s order: the last dim first
  bool any_extra = false;
  for (int i = 0; i < n; ++i) {
    const SamePad p = same_pad(kernel[i], dilation[i]);
    padding[i] = p.left;
    extra[2 * static_cast<size_t>(n - 1 - i) + 1] = p.extra;
    any_extra = any_extra || p.extra != 0;
  }
  return {any_extra ? pad(input, extra) : input, padding};
}

void check_mode(const std::string& mode, bool strided, const char* layer) {
  KILN_CHECK(mode.empty() || mode == "same" || mode == "valid",
             "nn::{}: padding '{}' is not a number, 'same' or 'valid'", layer, mode);
  KILN_CHECK(mode != "same" || !strided,
             "nn::{}: padding='same' is not supported for strided convolutions; use stride 1 or a number", layer);
}

void check_channels(int64_t in, int64_t out, int64_t groups, const Shape& kernel, const char* layer) {
  KILN_CHECK(in >= 0 && out >= 0, "nn::{}: in_channels ({}) and out_channels ({}) must be non-negative", layer, in,
             out);
  for (int64_t k : kernel) KILN_CHECK(k > 0, "nn::{}: kernel_size must be positive, got {}", layer, kernel.str());
  KILN_CHECK(groups > 0 && in % groups == 0 && out % groups == 0,
             "nn::{}: in_channels ({}) and out_channels ({}) must both be divisible by groups ({})", layer, in, out,
             groups);
}

// PyTorch's initialisation of a convolution's (or linear's) weight and bias.
void reset_conv(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).fan_in;
    double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
    init::uniform_(bias, -bound, bound);
  }
}

// A Python tuple: "(3,)", "(3, 2)", "(3, 3, 2)".
std::string tuple_str(const Shape& s) {
  std::string out = "(";
  for (int i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// PyTorch's repr of a ConvNd: padding shown when it is a mode or not all 0, dilation when not all 1.
std::string conv_repr(int64_t in, int64_t out, const Shape& kernel, const Shape& stride, const std::string& mode,
                      const Shape& padding, const Shape& dilation, int64_t groups, bool bias,
                      const Shape& output_padding = {}) {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", in, out, tuple_str(kernel), tuple_str(stride));
  auto all = [](const Shape& v, int64_t x) {
    return std::all_of(v.begin(), v.end(), [x](int64_t e) { return e == x; });
  };
  if (!mode.empty()) {
    s += ", padding=" + mode;
  } else if (!all(padding, 0)) {
    s += ", padding=" + tuple_str(padding);
  }
  if (!all(dilation, 1)) s += ", dilation=" + tuple_str(dilation);
  if (!all(output_padding, 0)) s += ", output_padding=" + tuple_str(output_padding);
  if (groups != 1) s += fmt::format(", groups={}", groups);
  if (!bias) s += ", bias=False";
  return s;
}

// The output_padding with which a transposed convolution of `input` gives `output_size` (its last
// kernel.size() numbers; PyTorch's rule): each size must lie in [smallest, smallest + stride - 1].
Shape output_padding_for(const Tensor& input, const Shape& output_size, const Shape& kernel, const Shape& stride,
                         const Shape& padding, const Shape& dilation, const char* layer) {
  const int n = kernel.size();
  const int batch_dims = input.dim() == n + 2 ? 2 : 1;
  KILN_CHECK(output_size.size() == n || output_size.size() == n + batch_dims,
             "nn::{}: for a {}-D input, output_size must have {} or {} elements, got {}", layer, input.dim(), n,
             n + batch_dims, output_size.str());
  Shape result = Shape::filled(n, 0);
  for (int d = 0; d < n; ++d) {
    const int64_t want = output_size[output_size.size() - n + d];
    const int64_t smallest =
        (input.size(input.dim() - n + d) - 1) * stride[d] - 2 * padding[d] + dilation[d] * (kernel[d] - 1) + 1;
    KILN_CHECK(want >= smallest && want <= smallest + stride[d] - 1,
               "nn::{}: requested an output size of {}, but valid sizes range from {} to {} in dim {} (for an "
               "input of {})",
               layer, output_size.str(), smallest, smallest + stride[d] - 1, d, input.sizes().str());
    result[d] = want - smallest;
  }
  return result;
}

std::string size_or_pair(const Size2& s) { return s.h == s.w ? std::to_string(s.h) : s.str(); }

}  // namespace

std::string Size2::str() const { return fmt::format("({}, {})", h, w); }

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Conv2dOptions options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(std::move(options)) {
  check_channels(in_channels, out_channels, this->options.groups, {kernel_size.h, kernel_size.w}, "Conv2d");
  check_mode(this->options.padding.mode, this->options.stride.h != 1 || this->options.stride.w != 1, "Conv2d");
  weight = register_parameter(
      "weight", empty({out_channels, in_channels / this->options.groups, kernel_size.h, kernel_size.w}));
  if (this->options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_conv(weight, bias);
}

Tensor Conv2d::forward(const Tensor& input) {
  const Conv2dOptions& o = options;
  auto [x, padding] =
      resolve_padding(input, o.padding.mode, o.padding.size.shape(), kernel_size.shape(), o.dilation.shape());
  return conv2d(x, weight, bias, o.stride.shape(), padding, o.dilation.shape(), o.groups);
}

std::string Conv2d::extra_repr() const {
  const Conv2dOptions& o = options;
  return conv_repr(in_channels, out_channels, kernel_size.shape(), o.stride.shape(), o.padding.mode,
                   o.padding.size.shape(), o.dilation.shape(), o.groups, bias.defined());
}

Conv1d::Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv1dOptions options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(std::move(options)) {
  check_channels(in_channels, out_channels, this->options.groups, {kernel_size}, "Conv1d");
  check_mode(this->options.padding.mode, this->options.stride != 1, "Conv1d");
  weight = register_parameter("weight", empty({out_channels, in_channels / this->options.groups, kernel_size}));
  if (this->options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_conv(weight, bias);
}

Tensor Conv1d::forward(const Tensor& input) {
  const Conv1dOptions& o = options;
  auto [x, padding] = resolve_padding(input, o.padding.mode, {o.padding.size}, {kernel_size}, {o.dilation});
  return conv1d(x, weight, bias, o.stride, padding[0], o.dilation, o.groups);
}

std::string Conv1d::extra_repr() const {
  const Conv1dOptions& o = options;
  return conv_repr(in_channels, out_channels, {kernel_size}, {o.stride}, o.padding.mode, {o.padding.size},
                   {o.dilation}, o.groups, bias.defined());
}

std::string Size3::str() const { return fmt::format("({}, {}, {})", d, h, w); }

namespace {
std::string size_or_none(std::optional<int64_t> v) { return v ? std::to_string(*v) : "None"; }
int64_t or_input(std::optional<int64_t> v, const Tensor& input, int64_t from_end) {
  return v ? *v : input.dim() >= from_end ? input.size(-from_end) : 0;  // 0: the pooling's own Error on the input
}
}  // namespace

Shape OptionalSize2::resolve(const Tensor& input) const { return {or_input(h, input, 2), or_input(w, input, 1)}; }
std::string OptionalSize2::str() const {
  return h && w && *h == *w ? std::to_string(*h) : fmt::format("({}, {})", size_or_none(h), size_or_none(w));
}
Shape OptionalSize3::resolve(const Tensor& input) const {
  return {or_input(d, input, 3), or_input(h, input, 2), or_input(w, input, 1)};
}
std::string OptionalSize3::str() const {
  return d && h && w && *d == *h && *h == *w
             ? std::to_string(*d)
             : fmt::format("({}, {}, {})", size_or_none(d), size_or_none(h), size_or_none(w));
}

Conv3d::Conv3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, Conv3dOptions options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(std::move(options)) {
  check_channels(in_channels, out_channels, this->options.groups, kernel_size.shape(), "Conv3d");
  const Size3& stride = this->options.stride;
  check_mode(this->options.padding.mode, stride.d != 1 || stride.h != 1 || stride.w != 1, "Conv3d");
  weight = register_parameter("weight", empty({out_channels, in_channels / this->options.groups, kernel_size.d,
                                               kernel_size.h, kernel_size.w}));
  if (this->options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_conv(weight, bias);
}

Tensor Conv3d::forward(const Tensor& input) {
  const Conv3dOptions& o = options;
  auto [x, padding] =
      resolve_padding(input, o.padding.mode, o.padding.size.shape(), kernel_size.shape(), o.dilation.shape());
  return conv3d(x, weight, bias, o.stride.shape(), padding, o.dilation.shape(), o.groups);
}

std::string Conv3d::extra_repr() const {
  const Conv3dOptions& o = options;
  return conv_repr(in_channels, out_channels, kernel_size.shape(), o.stride.shape(), o.padding.mode,
                   o.padding.size.shape(), o.dilation.shape(), o.groups, bias.defined());
}

MaxPool2d::MaxPool2d(Size2 kernel_size, MaxPool2dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride.has_value()) this->options.stride = kernel_size;
}

Tensor MaxPool2d::forward(const Tensor& input) {
  return max_pool2d(input, kernel_size.shape(), options.stride.shape(), options.padding.shape(),
                    options.dilation.shape(), options.ceil_mode);
}
std::tuple<Tensor, Tensor> MaxPool2d::forward_with_indices(const Tensor& input) {
  return max_pool2d_with_indices(input, kernel_size.shape(), options.stride.shape(), options.padding.shape(),
                                 options.dilation.shape(), options.ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation={}, ceil_mode={}", size_or_pair(kernel_size),
                     size_or_pair(options.stride), size_or_pair(options.padding), size_or_pair(options.dilation),
                     options.ceil_mode ? "True" : "False");
}

AvgPool2d::AvgPool2d(Size2 kernel_size, AvgPool2dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride.has_value()) this->options.stride = kernel_size;
}

Tensor AvgPool2d::forward(const Tensor& input) {
  return avg_pool2d(input, kernel_size.shape(), options.stride.shape(), options.padding.shape(), options.ceil_mode,
                    options.count_include_pad, options.divisor_override);
}

std::string AvgPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", size_or_pair(kernel_size), size_or_pair(options.stride),
                     size_or_pair(options.padding));
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) {
  return adaptive_avg_pool2d(input, output_size.resolve(input));
}

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + output_size.str(); }

Tensor AdaptiveMaxPool2d::forward(const Tensor& input) {
  return adaptive_max_pool2d(input, output_size.resolve(input));
}
std::tuple<Tensor, Tensor> AdaptiveMaxPool2d::forward_with_indices(const Tensor& input) {
  return adaptive_max_pool2d_with_indices(input, output_size.resolve(input));
}
std::string AdaptiveMaxPool2d::extra_repr() const { return "output_size=" + output_size.str(); }

MaxPool1d::MaxPool1d(int64_t kernel_size, MaxPool1dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride) this->options.stride = kernel_size;
}

Tensor MaxPool1d::forward(const Tensor& input) {
  return max_pool1d(input, kernel_size, options.stride, options.padding, options.dilation, options.ceil_mode);
}
std::tuple<Tensor, Tensor> MaxPool1d::forward_with_indices(const Tensor& input) {
  return max_pool1d_with_indices(input, kernel_size, options.stride, options.padding, options.dilation,
                                 options.ceil_mode);
}

std::string MaxPool1d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation={}, ceil_mode={}", kernel_size,
                     options.stride.value_or(kernel_size), options.padding, options.dilation,
                     options.ceil_mode ? "True" : "False");
}

AvgPool1d::AvgPool1d(int64_t kernel_size, AvgPool1dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride) this->options.stride = kernel_size;
}

Tensor AvgPool1d::forward(const Tensor& input) {
  return avg_pool1d(input, kernel_size, options.stride, options.padding, options.ceil_mode,
                    options.count_include_pad);
}

// PyTorch's AvgPool1d keeps its sizes as 1-tuples, and prints them so.
std::string AvgPool1d::extra_repr() const {
  return fmt::format("kernel_size=({},), stride=({},), padding=({},)", kernel_size,
                     options.stride.value_or(kernel_size), options.padding);
}

Tensor AdaptiveAvgPool1d::forward(const Tensor& input) { return adaptive_avg_pool1d(input, output_size); }

std::string AdaptiveAvgPool1d::extra_repr() const { return fmt::format("output_size={}", output_size); }

Tensor AdaptiveMaxPool1d::forward(const Tensor& input) { return adaptive_max_pool1d(input, output_size); }
std::tuple<Tensor, Tensor> AdaptiveMaxPool1d::forward_with_indices(const Tensor& input) {
  return adaptive_max_pool1d_with_indices(input, output_size);
}
std::string AdaptiveMaxPool1d::extra_repr() const { return fmt::format("output_size={}", output_size); }

LPPool1d::LPPool1d(double norm_type, int64_t kernel_size, LPPool1dOptions options)
    : norm_type(norm_type), kernel_size(kernel_size), options(options) {
  KILN_CHECK(kernel_size > 0, "nn::LPPool1d: kernel_size must be positive, got {}", kernel_size);
}
Tensor LPPool1d::forward(const Tensor& input) {
  return lp_pool1d(input, norm_type, kernel_size, options.stride, options.ceil_mode);
}
std::string LPPool1d::extra_repr() const {  // as PyTorch's: the sizes as given, an unset stride None
  return fmt::format("norm_type={}, kernel_size={}, stride={}, ceil_mode={}", py_float(norm_type), kernel_size,
                     options.stride ? std::to_string(*options.stride) : "None", options.ceil_mode ? "True" : "False");
}

LPPool2d::LPPool2d(double norm_type, Size2 kernel_size, LPPool2dOptions options)
    : norm_type(norm_type), kernel_size(kernel_size), options(options) {
  KILN_CHECK(kernel_size.has_value() && kernel_size.h > 0 && kernel_size.w > 0,
             "nn::LPPool2d: kernel_size must be positive, got {}", kernel_size.str());
}
Tensor LPPool2d::forward(const Tensor& input) {
  return lp_pool2d(input, norm_type, kernel_size.shape(),
                   options.stride.has_value() ? options.stride.shape() : Shape{}, options.ceil_mode);
}
std::string LPPool2d::extra_repr() const {
  return fmt::format("norm_type={}, kernel_size={}, stride={}, ceil_mode={}", py_float(norm_type),
                     size_or_pair(kernel_size), options.stride.has_value() ? size_or_pair(options.stride) : "None",
                     options.ceil_mode ? "True" : "False");
}

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
                                 ConvTranspose2dOptions options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(std::move(options)) {
  check_channels(in_channels, out_channels, this->options.groups, kernel_size.shape(), "ConvTranspose2d");
  weight = register_parameter(
      "weight", empty({in_channels, out_channels / this->options.groups, kernel_size.h, kernel_size.w}));
  if (this->options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_conv(weight, bias);
}

Tensor ConvTranspose2d::forward(const Tensor& input) {
  const ConvTranspose2dOptions& o = options;
  return conv_transpose2d(input, weight, bias, o.stride.shape(), o.padding.shape(), o.output_padding.shape(),
                          o.groups, o.dilation.shape());
}

Tensor ConvTranspose2d::forward(const Tensor& input, const Shape& output_size) {
  const ConvTranspose2dOptions& o = options;
  KILN_CHECK(input.dim() == 3 || input.dim() == 4,
             "nn::ConvTranspose2d: expected a 3-D (unbatched) or 4-D (batched) input, got shape {}",
             input.sizes().str());
  const Shape output_padding = output_padding_for(input, output_size, kernel_size.shape(), o.stride.shape(),
                                                  o.padding.shape(), o.dilation.shape(), "ConvTranspose2d");
  return conv_transpose2d(input, weight, bias, o.stride.shape(), o.padding.shape(), output_padding, o.groups,
                          o.dilation.shape());
}

std::string ConvTranspose2d::extra_repr() const {
  const ConvTranspose2dOptions& o = options;
  return conv_repr(in_channels, out_channels, kernel_size.shape(), o.stride.shape(), "", o.padding.shape(),
                   o.dilation.shape(), o.groups, bias.defined(), o.output_padding.shape());
}

ConvTranspose3d::ConvTranspose3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size,
                                 ConvTranspose3dOptions options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(std::move(options)) {
  check_channels(in_channels, out_channels, this->options.groups, kernel_size.shape(), "ConvTranspose3d");
  weight = register_parameter("weight", empty({in_channels, out_channels / this->options.groups, kernel_size.d,
                                               kernel_size.h, kernel_size.w}));
  if (this->options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_conv(weight, bias);
}

Tensor ConvTranspose3d::forward(const Tensor& input) {
  const ConvTranspose3dOptions& o = options;
  return conv_transpose3d(input, weight, bias, o.stride.shape(), o.padding.shape(), o.output_padding.shape(),
                          o.groups, o.dilation.shape());
}

Tensor ConvTranspose3d::forward(const Tensor& input, const Shape& output_size) {
  const ConvTranspose3dOptions& o = options;
  KILN_CHECK(input.dim() == 4 || input.dim() == 5,
             "nn::ConvTranspose3d: expected a 4-D (unbatched) or 5-D (batched) input, got shape {}",
             input.sizes().str());
  const Shape output_padding = output_padding_for(input, output_size, kernel_size.shape(), o.stride.shape(),
                                                  o.padding.shape(), o.dilation.shape(), "ConvTranspose3d");
  return conv_transpose3d(input, weight, bias, o.stride.shape(), o.padding.shape(), output_padding, o.groups,
                          o.dilation.shape());
}

std::string ConvTranspose3d::extra_repr() const {
  const ConvTranspose3dOptions& o = options;
  return conv_repr(in_channels, out_channels, kernel_size.shape(), o.stride.shape(), "", o.padding.shape(),
                   o.dilation.shape(), o.groups, bias.defined(), o.output_padding.shape());
}

ConvTranspose1d::ConvTranspose1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                                 ConvTranspose1dOptions options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(std::move(options)) {
  check_channels(in_channels, out_channels, this->options.groups, {kernel_size}, "ConvTranspose1d");
  weight = register_parameter("weight", empty({in_channels, out_channels / this->options.groups, kernel_size}));
  if (this->options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_conv(weight, bias);
}

Tensor ConvTranspose1d::forward(const Tensor& input) {
  const ConvTranspose1dOptions& o = options;
  return conv_transpose1d(input, weight, bias, o.stride, o.padding, o.output_padding, o.groups, o.dilation);
}

Tensor ConvTranspose1d::forward(const Tensor& input, const Shape& output_size) {
  const ConvTranspose1dOptions& o = options;
  KILN_CHECK(input.dim() == 2 || input.dim() == 3,
             "nn::ConvTranspose1d: expected a 2-D (unbatched) or 3-D (batched) input, got shape {}",
             input.sizes().str());
  const Shape output_padding = output_padding_for(input, output_size, {kernel_size}, {o.stride}, {o.padding},
                                                  {o.dilation}, "ConvTranspose1d");
  return conv_transpose1d(input, weight, bias, o.stride, o.padding, output_padding[0], o.groups, o.dilation);
}

std::string ConvTranspose1d::extra_repr() const {
  const ConvTranspose1dOptions& o = options;
  return conv_repr(in_channels, out_channels, {kernel_size}, {o.stride}, "", {o.padding}, {o.dilation}, o.groups,
                   bias.defined(), {o.output_padding});
}

namespace {

std::string size_or_triple(const Size3& s) { return s.d == s.h && s.h == s.w ? std::to_string(s.d) : s.str(); }

}  // namespace

MaxPool3d::MaxPool3d(Size3 kernel_size, MaxPool3dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride) this->options.stride = kernel_size;
}

Tensor MaxPool3d::forward(const Tensor& input) { return std::get<0>(forward_with_indices(input)); }

std::tuple<Tensor, Tensor> MaxPool3d::forward_with_indices(const Tensor& input) {
  return max_pool3d_with_indices(input, kernel_size.shape(), options.stride->shape(), options.padding.shape(),
                                 options.dilation.shape(), options.ceil_mode);
}

std::string MaxPool3d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation={}, ceil_mode={}", size_or_triple(kernel_size),
                     size_or_triple(*options.stride), size_or_triple(options.padding),
                     size_or_triple(options.dilation), options.ceil_mode ? "True" : "False");
}

AvgPool3d::AvgPool3d(Size3 kernel_size, AvgPool3dOptions options) : kernel_size(kernel_size), options(options) {
  if (!this->options.stride) this->options.stride = kernel_size;
}

Tensor AvgPool3d::forward(const Tensor& input) {
  return avg_pool3d(input, kernel_size.shape(), options.stride->shape(), options.padding.shape(), options.ceil_mode,
                    options.count_include_pad, options.divisor_override);
}

// PyTorch 1.13's AvgPool3d prints these three only.
std::string AvgPool3d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", size_or_triple(kernel_size),
                     size_or_triple(*options.stride), size_or_triple(options.padding));
}

Tensor AdaptiveAvgPool3d::forward(const Tensor& input) {
  return adaptive_avg_pool3d(input, output_size.resolve(input));
}
std::string AdaptiveAvgPool3d::extra_repr() const { return "output_size=" + output_size.str(); }

Tensor AdaptiveMaxPool3d::forward(const Tensor& input) {
  return adaptive_max_pool3d(input, output_size.resolve(input));
}
std::tuple<Tensor, Tensor> AdaptiveMaxPool3d::forward_with_indices(const Tensor& input) {
  return adaptive_max_pool3d_with_indices(input, output_size.resolve(input));
}
std::string AdaptiveMaxPool3d::extra_repr() const { return "output_size=" + output_size.str(); }

Tensor Unfold::forward(const Tensor& input) {
  return unfold(input, kernel_size.shape(), options.dilation.shape(), options.padding.shape(), options.stride.shape());
}

std::string Unfold::extra_repr() const {
  return fmt::format("kernel_size={}, dilation={}, padding={}, stride={}", size_or_pair(kernel_size),
                     size_or_pair(options.dilation), size_or_pair(options.padding), size_or_pair(options.stride));
}

Tensor Fold::forward(const Tensor& input) {
  return fold(input, output_size.shape(), kernel_size.shape(), options.dilation.shape(), options.padding.shape(),
              options.stride.shape());
}

std::string Fold::extra_repr() const {
  return fmt::format("output_size={}, kernel_size={}, dilation={}, padding={}, stride={}", size_or_pair(output_size),
                     size_or_pair(kernel_size), size_or_pair(options.dilation), size_or_pair(options.padding),
                     size_or_pair(options.stride));
}

}  // namespace kiln::nn

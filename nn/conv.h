// nn/conv.h: Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d and the pooling
// layers (MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, AdaptiveMaxPool2d, their 1-D and 3-D forms, LPPool1d
// and LPPool2d), over
// the ops of ops/ops.h (conv.cpp, pool.cpp), MaxUnpool1d/2d/3d (nn/unpool.cpp), FractionalMaxPool2d/3d
// (nn/fractional_pool.cpp), and Unfold and Fold
// (nn::functional::unfold, fold). Options follow PyTorch's keyword arguments:
//   nn::Conv2d c1{1, 32, 3, {.padding = 1}};
//   nn::Conv2d c2{32, 32, {3, 2}, {.stride = {2, 1}, .padding = {1, 0}}};
//   nn::Conv2d c3{32, 32, 4, {.padding = "same", .dilation = 2}};  // "same": stride 1 only
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "nn/module.h"

namespace kiln::nn {

// A 2-D size given as one number (3 means (3, 3)) or as a pair ({3, 2}); default-constructed: unset.
class Size2 {
 public:
  Size2() = default;
  Size2(int64_t v) : h(v), w(v), set_(true) {}  // NOLINT: `.stride = 2`
  Size2(int64_t h, int64_t w) : h(h), w(w), set_(true) {}
  bool has_value() const { return set_; }
  Shape shape() const { return {h, w}; }
  std::string str() const;  // "(3, 2)"
  int64_t h = 0, w = 0;

 private:
  bool set_ = false;
};

// Padding: a number, a pair, or PyTorch's mode strings "same" (output size = input size; stride 1)
// and "valid" (no padding).
class Padding2d {
 public:
  Padding2d(int64_t v) : size(v) {}  // NOLINT
  Padding2d(int64_t h, int64_t w) : size(h, w) {}
  template <size_t N> Padding2d(const char (&m)[N]) : mode(m) {}  // NOLINT: `.padding = "same"`
  explicit Padding2d(std::string m) : mode(std::move(m)) {}
  Size2 size{0};
  std::string mode;  // empty: explicit size
};
class Padding1d {
 public:
  Padding1d(int64_t v) : size(v) {}  // NOLINT
  template <size_t N> Padding1d(const char (&m)[N]) : mode(m) {}  // NOLINT
  explicit Padding1d(std::string m) : mode(std::move(m)) {}
  int64_t size = 0;
  std::string mode;
};

struct Conv2dOptions {
  Size2 stride = 1;
  Padding2d padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

// input (N, C_in, H, W) or (C_in, H, W) -> (N, C_out, H', W'). weight (C_out, C_in / groups, kH, kW) and
// bias (C_out) ~ U(+-1/sqrt(fan_in)), fan_in = C_in / groups * kH * kW, as PyTorch.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Conv2dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size2 kernel_size;
  Conv2dOptions options;
  Tensor weight;  // (C_out, C_in / groups, kH, kW)
  Tensor bias;    // (C_out), undefined without bias
};

struct Conv1dOptions {
  int64_t stride = 1;
  Padding1d padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

// input (N, C_in, L) or (C_in, L) -> (N, C_out, L'). weight (C_out, C_in / groups, k).
class Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv1dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels, kernel_size;
  Conv1dOptions options;
  Tensor weight;  // (C_out, C_in / groups, k)
  Tensor bias;    // (C_out)
};

// A 3-D size: one number (3 means (3, 3, 3)) or three ({3, 3, 2}).
class Size3 {
 public:
  Size3(int64_t v) : d(v), h(v), w(v) {}  // NOLINT: `.stride = 2`
  Size3(int64_t d, int64_t h, int64_t w) : d(d), h(h), w(w) {}
  Shape shape() const { return {d, h, w}; }
  std::string str() const;  // "(3, 3, 2)"
  int64_t d = 0, h = 0, w = 0;
};
// An adaptive pooling's output size: a size per dim, or nullopt (Python's None) for a dim that keeps the
// input's size, as torch.nn.AdaptiveAvgPool2d((None, 7)) and LibTorch's {c10::nullopt, 7}:
//   nn::AdaptiveAvgPool2d pool({std::nullopt, 7});
class OptionalSize2 {
 public:
  OptionalSize2(int64_t v) : h(v), w(v) {}                                          // NOLINT
  OptionalSize2(const Size2& s) : h(s.h), w(s.w) {}                                 // NOLINT
  OptionalSize2(std::optional<int64_t> h, std::optional<int64_t> w) : h(h), w(w) {}
  Shape resolve(const Tensor& input) const;  // each nullopt: the input's size there (its last two dims)
  std::string str() const;                   // "7", "(3, 4)", "(None, 7)", as PyTorch prints them
  std::optional<int64_t> h, w;
};
class OptionalSize3 {
 public:
  OptionalSize3(int64_t v) : d(v), h(v), w(v) {}                                    // NOLINT
  OptionalSize3(const Size3& s) : d(s.d), h(s.h), w(s.w) {}                         // NOLINT
  OptionalSize3(std::optional<int64_t> d, std::optional<int64_t> h, std::optional<int64_t> w) : d(d), h(h), w(w) {}
  Shape resolve(const Tensor& input) const;  // each nullopt: the input's size there (its last three dims)
  std::string str() const;
  std::optional<int64_t> d, h, w;
};
class Padding3d {
 public:
  Padding3d(int64_t v) : size(v) {}  // NOLINT
  Padding3d(int64_t d, int64_t h, int64_t w) : size(d, h, w) {}
  template <size_t N> Padding3d(const char (&m)[N]) : mode(m) {}  // NOLINT: `.padding = "same"`
  explicit Padding3d(std::string m) : mode(std::move(m)) {}
  Size3 size{0};
  std::string mode;  // empty: explicit size
};

struct Conv3dOptions {
  Size3 stride = 1;
  Padding3d padding = 0;
  Size3 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

// input (N, C_in, D, H, W) or (C_in, D, H, W) -> (N, C_out, D', H', W'); weight (C_out, C_in / groups,
// kD, kH, kW), initialised as Conv2d's. The op is one conv2d (Note [conv3d as conv2d], ops/conv.cpp).
class Conv3d : public Module {
 public:
  Conv3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, Conv3dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size3 kernel_size;
  Conv3dOptions options;
  Tensor weight;  // (C_out, C_in / groups, kD, kH, kW)
  Tensor bias;    // (C_out), undefined without bias
};

struct ConvTranspose2dOptions {  // LibTorch's order
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Size2 dilation = 1;
};

// input (N, C_in, H, W) or (C_in, H, W) -> (N, C_out, H', W') with H' = (H - 1) * stride - 2 * padding +
// dilation * (kH - 1) + output_padding + 1: conv_transpose2d (Note [transposed convolution],
// ops/conv.cpp). weight (C_in, C_out / groups, kH, kW) and bias (C_out), initialised as PyTorch's
// (fan_in = C_out / groups * kH * kW). forward(input, output_size) picks the output_padding that gives
// output_size (its last two numbers), as PyTorch's.
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, ConvTranspose2dOptions options = {});
  Tensor forward(const Tensor& input) override;
  Tensor forward(const Tensor& input, const Shape& output_size);
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size2 kernel_size;
  ConvTranspose2dOptions options;
  Tensor weight;  // (C_in, C_out / groups, kH, kW)
  Tensor bias;    // (C_out), undefined without bias
};

struct ConvTranspose1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  int64_t dilation = 1;
};

// input (N, C_in, L) or (C_in, L) -> (N, C_out, L'). weight (C_in, C_out / groups, k).
class ConvTranspose1d : public Module {
 public:
  ConvTranspose1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, ConvTranspose1dOptions options = {});
  Tensor forward(const Tensor& input) override;
  Tensor forward(const Tensor& input, const Shape& output_size);
  std::string extra_repr() const override;

  int64_t in_channels, out_channels, kernel_size;
  ConvTranspose1dOptions options;
  Tensor weight;  // (C_in, C_out / groups, k)
  Tensor bias;    // (C_out)
};

struct ConvTranspose3dOptions {  // LibTorch's order
  Size3 stride = 1;
  Size3 padding = 0;
  Size3 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Size3 dilation = 1;
};

// input (N, C_in, D, H, W) or (C_in, D, H, W) -> (N, C_out, D', H', W'); weight (C_in, C_out / groups,
// kD, kH, kW). The op is one conv_transpose2d and an index_add (Note [conv_transpose3d as
// conv_transpose2d], ops/conv.cpp).
class ConvTranspose3d : public Module {
 public:
  ConvTranspose3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, ConvTranspose3dOptions options = {});
  Tensor forward(const Tensor& input) override;
  Tensor forward(const Tensor& input, const Shape& output_size);
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size3 kernel_size;
  ConvTranspose3dOptions options;
  Tensor weight;  // (C_in, C_out / groups, kD, kH, kW)
  Tensor bias;    // (C_out), undefined without bias
};

struct MaxPool2dOptions {
  Size2 stride = {};  // unset: kernel_size
  Size2 padding = 0;
  Size2 dilation = 1;
  bool ceil_mode = false;
};
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, MaxPool2dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);  // indices into H W
  std::string extra_repr() const override;

  Size2 kernel_size;
  MaxPool2dOptions options;
};

struct AvgPool2dOptions {
  Size2 stride = {};  // unset: kernel_size
  Size2 padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override = {};
};
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, AvgPool2dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Size2 kernel_size;
  AvgPool2dOptions options;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(OptionalSize2 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  OptionalSize2 output_size;
};

// forward_with_indices also gives the indices (int64 into H * W), as LibTorch's.
class AdaptiveMaxPool2d : public Module {
 public:
  explicit AdaptiveMaxPool2d(OptionalSize2 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);
  std::string extra_repr() const override;

  OptionalSize2 output_size;
};

// The 1-D poolings: input (N, C, L) or (C, L).
struct MaxPool1dOptions {
  std::optional<int64_t> stride = {};  // unset: kernel_size
  int64_t padding = 0;
  int64_t dilation = 1;
  bool ceil_mode = false;
};
class MaxPool1d : public Module {
 public:
  explicit MaxPool1d(int64_t kernel_size, MaxPool1dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);  // indices into L
  std::string extra_repr() const override;

  int64_t kernel_size;
  MaxPool1dOptions options;
};

struct AvgPool1dOptions {
  std::optional<int64_t> stride = {};  // unset: kernel_size
  int64_t padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
};
class AvgPool1d : public Module {
 public:
  explicit AvgPool1d(int64_t kernel_size, AvgPool1dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t kernel_size;
  AvgPool1dOptions options;
};

class AdaptiveAvgPool1d : public Module {
 public:
  explicit AdaptiveAvgPool1d(int64_t output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t output_size;
};

class AdaptiveMaxPool1d : public Module {
 public:
  explicit AdaptiveMaxPool1d(int64_t output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);  // indices into L
  std::string extra_repr() const override;

  int64_t output_size;
};

// Fractional max pooling (torch.nn.FractionalMaxPool2d / 3d; nn::functional::fractional_max_pool2d):
// windows of kernel_size at pseudo-random starts, output_size of them per dim, or the input's size times
// output_ratio (each in (0, 1)) rounded down; one of the two. _random_samples, (N, C, 2) or (N, C, 3) in
// [0, 1) (N = 1 for an unbatched input), fixes the starts and is kept as a buffer of that name, as in
// PyTorch; unset, each forward draws new ones. forward_with_indices also gives the indices (int64 into
// H * W, or D * H * W).
struct FractionalMaxPool2dOptions {
  Size2 output_size = {};                 // unset: output_ratio
  std::vector<double> output_ratio = {};  // one for both dims, or two
  Tensor _random_samples = {};
};
class FractionalMaxPool2d : public Module {
 public:
  FractionalMaxPool2d(Size2 kernel_size, FractionalMaxPool2dOptions options);
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);

  Size2 kernel_size;
  FractionalMaxPool2dOptions options;
};
struct FractionalMaxPool3dOptions {
  std::optional<Size3> output_size = {};  // unset: output_ratio
  std::vector<double> output_ratio = {};  // one for all three dims, or three
  Tensor _random_samples = {};
};
class FractionalMaxPool3d : public Module {
 public:
  FractionalMaxPool3d(Size3 kernel_size, FractionalMaxPool3dOptions options);
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);

  Size3 kernel_size;
  FractionalMaxPool3dOptions options;
};

// Power-average pooling (nn::functional::lp_pool1d / lp_pool2d): each window's (sum of x^p)^(1/p).
struct LPPool1dOptions {
  std::optional<int64_t> stride = {};  // unset: kernel_size
  bool ceil_mode = false;
};
class LPPool1d : public Module {
 public:
  LPPool1d(double norm_type, int64_t kernel_size, LPPool1dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  double norm_type;
  int64_t kernel_size;
  LPPool1dOptions options;
};

struct LPPool2dOptions {
  Size2 stride = {};  // unset: kernel_size
  bool ceil_mode = false;
};
class LPPool2d : public Module {
 public:
  LPPool2d(double norm_type, Size2 kernel_size, LPPool2dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  double norm_type;
  Size2 kernel_size;
  LPPool2dOptions options;
};

// The 3-D poolings: input (N, C, D, H, W) or (C, D, H, W); two 2-D poolings each (Note [3-D pooling is
// separable], ops/pool.cpp).
struct MaxPool3dOptions {
  std::optional<Size3> stride = {};  // unset: kernel_size
  Size3 padding = 0;
  Size3 dilation = 1;
  bool ceil_mode = false;
};
class MaxPool3d : public Module {
 public:
  explicit MaxPool3d(Size3 kernel_size, MaxPool3dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);  // indices into D H W
  std::string extra_repr() const override;

  Size3 kernel_size;
  MaxPool3dOptions options;
};

struct AvgPool3dOptions {
  std::optional<Size3> stride = {};  // unset: kernel_size
  Size3 padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override = {};
};
class AvgPool3d : public Module {
 public:
  explicit AvgPool3d(Size3 kernel_size, AvgPool3dOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Size3 kernel_size;
  AvgPool3dOptions options;
};

class AdaptiveAvgPool3d : public Module {
 public:
  explicit AdaptiveAvgPool3d(OptionalSize3 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  OptionalSize3 output_size;
};

class AdaptiveMaxPool3d : public Module {
 public:
  explicit AdaptiveMaxPool3d(OptionalSize3 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::tuple<Tensor, Tensor> forward_with_indices(const Tensor& input);  // indices into D H W
  std::string extra_repr() const override;

  OptionalSize3 output_size;
};

// Max unpooling (nn::functional::max_unpool1d/2d/3d, Note [max unpooling is a scatter] in
// nn/unpool.cpp): forward(input, indices[, output_size]) with the values and indices of the max
// pooling of the same kernel_size, stride and padding (MaxPool*d::forward_with_indices).
struct MaxUnpool1dOptions {
  std::optional<int64_t> stride = {};  // unset: kernel_size
  int64_t padding = 0;
};
class MaxUnpool1d : public Module {
 public:
  explicit MaxUnpool1d(int64_t kernel_size, MaxUnpool1dOptions options = {});
  Tensor forward(const Tensor& input) override;  // an Error: the indices are needed
  Tensor forward(const Tensor& input, const Tensor& indices, const Shape& output_size = {});
  std::string extra_repr() const override;

  int64_t kernel_size;
  MaxUnpool1dOptions options;
};

struct MaxUnpool2dOptions {
  Size2 stride = {};  // unset: kernel_size
  Size2 padding = 0;
};
class MaxUnpool2d : public Module {
 public:
  explicit MaxUnpool2d(Size2 kernel_size, MaxUnpool2dOptions options = {});
  Tensor forward(const Tensor& input) override;  // an Error: the indices are needed
  Tensor forward(const Tensor& input, const Tensor& indices, const Shape& output_size = {});
  std::string extra_repr() const override;

  Size2 kernel_size;
  MaxUnpool2dOptions options;
};

struct MaxUnpool3dOptions {
  std::optional<Size3> stride = {};  // unset: kernel_size
  Size3 padding = 0;
};
class MaxUnpool3d : public Module {
 public:
  explicit MaxUnpool3d(Size3 kernel_size, MaxUnpool3dOptions options = {});
  Tensor forward(const Tensor& input) override;  // an Error: the indices are needed
  Tensor forward(const Tensor& input, const Tensor& indices, const Shape& output_size = {});
  std::string extra_repr() const override;

  Size3 kernel_size;
  MaxUnpool3dOptions options;
};

// The sliding blocks as layers: Unfold (im2col) and Fold (col2im), nn::functional::unfold and fold.
struct UnfoldOptions {  // LibTorch's and PyTorch's order after kernel_size
  Size2 dilation = 1;
  Size2 padding = 0;
  Size2 stride = 1;
};
class Unfold : public Module {
 public:
  explicit Unfold(Size2 kernel_size, UnfoldOptions options = {}) : kernel_size(kernel_size), options(options) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Size2 kernel_size;
  UnfoldOptions options;
};

using FoldOptions = UnfoldOptions;
class Fold : public Module {
 public:
  Fold(Size2 output_size, Size2 kernel_size, FoldOptions options = {})
      : output_size(output_size), kernel_size(kernel_size), options(options) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Size2 output_size, kernel_size;
  FoldOptions options;
};

}  // namespace kiln::nn

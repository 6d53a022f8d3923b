// nn/resample.h: the layers that change a feature map's spatial size without weights: the padding
// layers (ConstantPad, ZeroPad2d, ReflectionPad, ReplicationPad, CircularPad), Upsample (with
// UpsamplingNearest2d and UpsamplingBilinear2d), PixelShuffle / PixelUnshuffle and ChannelShuffle, as
// PyTorch's. Their functional forms are ops::pad, nn::functional::interpolate, ops::pixel_shuffle and
// nn::functional::channel_shuffle.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/functional.h"
#include "nn/module.h"

namespace kiln::nn {

// Pads the last `dims` dims of its input with ops::pad in `mode`: padding is (left, right) pairs from the
// last dim, 2 * dims values, or one number for every side. The layers below fix dims and mode:
// nn::ReflectionPad2d({1, 1, 2, 2}), nn::ReplicationPad1d(3).
class PadBase : public Module {
 public:
  // valued: a ConstantPad layer, printed with its value as PyTorch's.
  PadBase(int dims, std::string mode, std::vector<int64_t> padding, double value = 0, bool valued = false);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  std::vector<int64_t> padding;  // 2 * dims values
  std::string mode;
  double value;

 private:
  bool valued_;
};

class ReflectionPad1d : public PadBase {
 public:
  explicit ReflectionPad1d(std::vector<int64_t> padding) : PadBase(1, "reflect", std::move(padding)) {}
  explicit ReflectionPad1d(int64_t padding) : PadBase(1, "reflect", {padding}) {}
};

class ReflectionPad2d : public PadBase {
 public:
  explicit ReflectionPad2d(std::vector<int64_t> padding) : PadBase(2, "reflect", std::move(padding)) {}
  explicit ReflectionPad2d(int64_t padding) : PadBase(2, "reflect", {padding}) {}
};

class ReflectionPad3d : public PadBase {
 public:
  explicit ReflectionPad3d(std::vector<int64_t> padding) : PadBase(3, "reflect", std::move(padding)) {}
  explicit ReflectionPad3d(int64_t padding) : PadBase(3, "reflect", {padding}) {}
};

class ReplicationPad1d : public PadBase {
 public:
  explicit ReplicationPad1d(std::vector<int64_t> padding) : PadBase(1, "replicate", std::move(padding)) {}
  explicit ReplicationPad1d(int64_t padding) : PadBase(1, "replicate", {padding}) {}
};

class ReplicationPad2d : public PadBase {
 public:
  explicit ReplicationPad2d(std::vector<int64_t> padding) : PadBase(2, "replicate", std::move(padding)) {}
  explicit ReplicationPad2d(int64_t padding) : PadBase(2, "replicate", {padding}) {}
};

class ReplicationPad3d : public PadBase {
 public:
  explicit ReplicationPad3d(std::vector<int64_t> padding) : PadBase(3, "replicate", std::move(padding)) {}
  explicit ReplicationPad3d(int64_t padding) : PadBase(3, "replicate", {padding}) {}
};

class CircularPad1d : public PadBase {
 public:
  explicit CircularPad1d(std::vector<int64_t> padding) : PadBase(1, "circular", std::move(padding)) {}
  explicit CircularPad1d(int64_t padding) : PadBase(1, "circular", {padding}) {}
};

class CircularPad2d : public PadBase {
 public:
  explicit CircularPad2d(std::vector<int64_t> padding) : PadBase(2, "circular", std::move(padding)) {}
  explicit CircularPad2d(int64_t padding) : PadBase(2, "circular", {padding}) {}
};

class CircularPad3d : public PadBase {
 public:
  explicit CircularPad3d(std::vector<int64_t> padding) : PadBase(3, "circular", std::move(padding)) {}
  explicit CircularPad3d(int64_t padding) : PadBase(3, "circular", {padding}) {}
};

class ZeroPad2d : public PadBase {
 public:
  explicit ZeroPad2d(std::vector<int64_t> padding) : PadBase(2, "constant", std::move(padding)) {}
  explicit ZeroPad2d(int64_t padding) : PadBase(2, "constant", {padding}) {}
};

// Pads with a constant value: ConstantPad2d(2, 3.5) or ConstantPad2d({1, 1, 2, 0}, 3.5).

class ConstantPad1d : public PadBase {
 public:
  ConstantPad1d(std::vector<int64_t> padding, double value)
      : PadBase(1, "constant", std::move(padding), value, true) {}
  ConstantPad1d(int64_t padding, double value) : PadBase(1, "constant", {padding}, value, true) {}
};

class ConstantPad2d : public PadBase {
 public:
  ConstantPad2d(std::vector<int64_t> padding, double value)
      : PadBase(2, "constant", std::move(padding), value, true) {}
  ConstantPad2d(int64_t padding, double value) : PadBase(2, "constant", {padding}, value, true) {}
};

class ConstantPad3d : public PadBase {
 public:
  ConstantPad3d(std::vector<int64_t> padding, double value)
      : PadBase(3, "constant", std::move(padding), value, true) {}
  ConstantPad3d(int64_t padding, double value) : PadBase(3, "constant", {padding}, value, true) {}
};

// nn::Upsample({.scale_factor = {2}, .mode = "bilinear"}): nn::functional::interpolate with these options.
using UpsampleOptions = InterpolateOptions;
class Upsample : public Module {
 public:
  explicit Upsample(UpsampleOptions options = {});
  Tensor forward(const Tensor& input) override { return interpolate(input, options); }
  std::string extra_repr() const override;

  UpsampleOptions options;
};

// PyTorch's older shorthands for Upsample: nearest, and bilinear with align_corners = true
// (nn::UpsamplingBilinear2d({.scale_factor = {2}})); the options' mode and align_corners are theirs.
class UpsamplingNearest2d : public Upsample {
 public:
  explicit UpsamplingNearest2d(UpsampleOptions options);
};
class UpsamplingBilinear2d : public Upsample {
 public:
  explicit UpsamplingBilinear2d(UpsampleOptions options);
};

class PixelShuffle : public Module {
 public:
  explicit PixelShuffle(int64_t upscale_factor);
  Tensor forward(const Tensor& input) override { return pixel_shuffle(input, upscale_factor); }
  std::string extra_repr() const override;

  int64_t upscale_factor;
};

class PixelUnshuffle : public Module {
 public:
  explicit PixelUnshuffle(int64_t downscale_factor);
  Tensor forward(const Tensor& input) override { return pixel_unshuffle(input, downscale_factor); }
  std::string extra_repr() const override;

  int64_t downscale_factor;
};

// nn::functional::channel_shuffle: (N, C, *) with the channels' groups interleaved (ShuffleNet's).
class ChannelShuffle : public Module {
 public:
  explicit ChannelShuffle(int64_t groups);
  Tensor forward(const Tensor& input) override { return functional::channel_shuffle(input, groups); }
  std::string extra_repr() const override;

  int64_t groups;
};

}  // namespace kiln::nn

// nn/resample.cpp: nn::functional::interpolate and the layers of nn/resample.h.
//
// Note [interpolation is separable]: every mode of interpolate resamples one spatial dim at a time:
// output position o of a dim reads a few input positions (taps) along that dim and weighs them, the
// same taps and weights for every other coordinate. So each dim is a sum over taps of
// index_select(x, dim, tap's positions) * tap's weights (a tensor along that dim only): nearest has one
// tap of weight 1, linear two (summed as one lerp), bicubic four. Written with ops, it runs on any
// device and its backward (index_select's is an index_add) is differentiable again. The positions
// and weights follow PyTorch's upsample kernels: source x = scale * (o + 0.5) - 0.5 (clamped at 0 for
// linear), or scale * o with align_corners, where scale is 1 / scale_factor when that was given, else
// in / out.
#include "nn/resample.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/linear.h"
#include "ops/ops.h"

namespace kiln::nn {
inline namespace functional {

namespace {

// One spatial dim's resampling, on the CPU: index[k][o] is the input position tap k of output o reads
// (int64) and weight[k][o] its weight (float64; none for nearest). Tensors, not std::vectors: a size
// too large for memory is then the allocator's Error.
struct Taps {
  std::vector<Tensor> index, weight;
};

// ((a + 2) t - (a + 3)) t^2 + 1 for |t| <= 1 and ((a t - 5a) t + 8a) t - 4a for 1 < |t| < 2: Keys'
// cubic convolution kernel with a = -0.75, as PyTorch's bicubic.
double cubic_near(double t) {
  constexpr double a = -0.75;
  return ((a + 2) * t - (a + 3)) * t * t + 1;
}
double cubic_far(double t) {
  constexpr double a = -0.75;
  return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
}

Taps taps_for(const std::string& mode, int64_t in, int64_t out, std::optional<double> scale_factor,
              bool align_corners) {
  Taps t;
  if (mode == "nearest" || mode == "nearest-exact") {
    // In float, as PyTorch's nearest_idx computes it, so that positions on a boundary round alike.
    const float scale = scale_factor ? static_cast<float>(1.0 / *scale_factor)
                                     : static_cast<float>(in) / static_cast<float>(out);
    const float shift = mode == "nearest" ? 0.0f : 0.5f;
    t.index.push_back(empty(Shape{out}, kInt64));
    int64_t* index = t.index[0].data_ptr<int64_t>();
    for (int64_t o = 0; o < out; ++o) {
      const auto src = static_cast<int64_t>(std::floor((static_cast<float>(o) + shift) * scale));
      index[o] = std::min(src, in - 1);
    }
    return t;
  }
  const bool cubic = mode == "bicubic";
  const double scale = align_corners ? (out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0)
                       : scale_factor ? 1.0 / *scale_factor
                                      : static_cast<double>(in) / static_cast<double>(out);
  const int k = cubic ? 4 : 2;
  std::vector<int64_t*> index;
  std::vector<double*> weight;
  for (int j = 0; j < k; ++j) {
    t.index.push_back(empty(Shape{out}, kInt64));
    t.weight.push_back(empty(Shape{out}, kFloat64));
    index.push_back(t.index.back().data_ptr<int64_t>());
    weight.push_back(t.weight.back().data_ptr<double>());
  }
  for (int64_t o = 0; o < out; ++o) {
    double src = align_corners ? scale * static_cast<double>(o) : scale * (static_cast<double>(o) + 0.5) - 0.5;
    if (cubic) {
      const double base = std::floor(src), f = src - base;
      const double w[4] = {cubic_far(f + 1), cubic_near(f), cubic_near(1 - f), cubic_far(2 - f)};
      for (int j = 0; j < 4; ++j) {
        index[j][o] = std::clamp<int64_t>(static_cast<int64_t>(base) - 1 + j, 0, in - 1);
        weight[j][o] = w[j];
      }
    } else {
      src = std::max(src, 0.0);
      const auto i0 = static_cast<int64_t>(src);  // src >= 0: the floor
      const double f = src - static_cast<double>(i0);
      index[0][o] = i0;
      index[1][o] = i0 < in - 1 ? i0 + 1 : i0;
      weight[0][o] = 1 - f;
      weight[1][o] = f;
    }
  }
  return t;
}

// x resampled along dim d (Note [interpolation is separable]).
Tensor resample_dim(const Tensor& x, int d, const Taps& taps) {
  const Device device = x.device();
  if (taps.weight.empty()) return index_select(x, d, taps.index[0].to(device));
  Shape along = Shape::filled(x.dim(), 1);  // the weights vary along d only
  along[d] = taps.index[0].numel();
  if (taps.index.size() == 2) {  // linear: x0 + w1 (x1 - x0), one pass (its weights sum to 1)
    return lerp(index_select(x, d, taps.index[0].to(device)), index_select(x, d, taps.index[1].to(device)),
                taps.weight[1].reshape(along).to(device).to(x.dtype()));
  }
  Tensor sum;
  for (size_t k = 0; k < taps.index.size(); ++k) {
    const Tensor w = taps.weight[k].reshape(along).to(device).to(x.dtype());
    const Tensor term = index_select(x, d, taps.index[k].to(device)) * w;
    sum = sum.defined() ? sum + term : term;
  }
  return sum;
}

}  // namespace

Tensor interpolate(const Tensor& input, const InterpolateOptions& options) {
  const std::string& mode = options.mode;
  const int spatial = input.dim() - 2;
  KILN_CHECK(spatial >= 1 && spatial <= 3,
             "interpolate: expects an input (N, C, d1[, d2[, d3]]) of 3 to 5 dims, got shape {}", input.sizes().str());
  int wanted = 0;  // the spatial dims a mode requires; 0: any
  if (mode == "linear") wanted = 1;
  else if (mode == "bilinear" || mode == "bicubic") wanted = 2;
  else if (mode == "trilinear") wanted = 3;
  else
    KILN_CHECK(mode == "nearest" || mode == "nearest-exact" || mode == "area",
               "interpolate: mode must be \"nearest\", \"nearest-exact\", \"linear\", \"bilinear\", \"bicubic\", "
               "\"trilinear\" or \"area\", got \"{}\"", mode);
  KILN_CHECK(wanted == 0 || wanted == spatial, "interpolate: mode \"{}\" takes a {}-D input, got shape {}", mode,
             wanted + 2, input.sizes().str());
  KILN_CHECK(!options.align_corners || wanted != 0,
             "interpolate: align_corners is for the linear modes and bicubic, not mode \"{}\"", mode);
  KILN_CHECK(wanted == 0 || is_floating(input.dtype()), "interpolate: mode \"{}\" needs a floating input, got {}",
             mode, dtype_name(input.dtype()));
  KILN_CHECK(options.size.empty() != options.scale_factor.empty(),
             "interpolate: give either size or scale_factor (got {})",
             options.size.empty() ? "neither" : "both");
  const size_t given = options.size.empty() ? options.scale_factor.size() : options.size.size();
  KILN_CHECK(given == 1 || given == static_cast<size_t>(spatial),
             "interpolate: {} needs one value or one per spatial dim ({}), got {}",
             options.size.empty() ? "scale_factor" : "size", spatial, given);
  std::vector<int64_t> out(static_cast<size_t>(spatial));
  std::vector<std::optional<double>> factor(static_cast<size_t>(spatial));
  for (int i = 0; i < spatial; ++i) {
    const size_t j = given == 1 ? 0 : static_cast<size_t>(i);
    const int64_t in = input.size(2 + i);
    if (!options.size.empty()) {
      out[i] = options.size[j];
    } else {
      const double f = options.scale_factor[j];
      KILN_CHECK(std::isfinite(f) && f > 0, "interpolate: scale_factor must be positive and finite, got {}", f);
      const double o = std::floor(static_cast<double>(in) * f);
      KILN_CHECK(o < 9.2e18, "interpolate: scale_factor {} makes dim {} of size {} too large", f, 2 + i, in);
      out[i] = static_cast<int64_t>(o);
      if (!options.recompute_scale_factor.value_or(false)) factor[i] = f;
    }
    KILN_CHECK(in > 0 && out[i] > 0, "interpolate: input and output sizes must be above 0, got input {} and "
               "output size {} in dim {}", input.sizes().str(), out[i], 2 + i);
  }
  if (mode == "area") {  // PyTorch's area mode is adaptive average pooling
    KILN_CHECK(spatial <= 2, "interpolate: mode \"area\" takes a 3-D or 4-D input, got shape {}",
               input.sizes().str());
    return spatial == 1 ? adaptive_avg_pool1d(input, out[0]) : adaptive_avg_pool2d(input, Shape{out[0], out[1]});
  }
  Tensor x = input;
  bool resampled = false;
  for (int i = spatial - 1; i >= 0; --i) {  // the last dim first, as PyTorch's kernels weigh
    if (out[i] == input.size(2 + i) && wanted == 0) continue;  // nearest at the same size: the identity
    x = resample_dim(x, 2 + i, taps_for(mode, input.size(2 + i), out[i], factor[i],
                                        options.align_corners.value_or(false)));
    resampled = true;
  }
  return resampled ? x : input.clone();  // a new tensor, as PyTorch's
}

}  // namespace functional

PadBase::PadBase(int dims, std::string mode, std::vector<int64_t> padding, double value, bool valued)
    : padding(std::move(padding)), mode(std::move(mode)), value(value), valued_(valued) {
  if (this->padding.size() == 1) this->padding.assign(static_cast<size_t>(2 * dims), this->padding[0]);
  KILN_CHECK(this->padding.size() == static_cast<size_t>(2 * dims),
             "nn: a {}-D padding layer takes one padding or {} ((left, right) pairs from the last dim), got {}",
             dims, 2 * dims, this->padding.size());
}

Tensor PadBase::forward(const Tensor& input) { return pad(input, padding, mode, value); }

std::string PadBase::extra_repr() const {
  const std::string tuple = fmt::format("({})", fmt::join(padding, ", "));
  return valued_ ? "padding=" + tuple + ", value=" + py_float(value) : tuple;
}

Upsample::Upsample(UpsampleOptions options) : options(std::move(options)) {}

std::string Upsample::extra_repr() const {  // as PyTorch's: size=4, size=(4, 6), scale_factor=2.0
  std::vector<std::string> values;
  for (int64_t v : options.size) values.push_back(std::to_string(v));
  for (double v : options.scale_factor) values.push_back(py_float(v));
  const std::string joined = fmt::format("{}", fmt::join(values, ", "));
  return fmt::format("{}={}, mode={}", options.size.empty() ? "scale_factor" : "size",
                     values.size() == 1 ? joined : "(" + joined + ")", options.mode);
}

namespace {
UpsampleOptions with_mode(UpsampleOptions options, const char* mode, std::optional<bool> align_corners) {
  options.mode = mode;
  options.align_corners = align_corners;
  return options;
}
}  // namespace

UpsamplingNearest2d::UpsamplingNearest2d(UpsampleOptions options)
    : Upsample(with_mode(std::move(options), "nearest", std::nullopt)) {}
UpsamplingBilinear2d::UpsamplingBilinear2d(UpsampleOptions options)
    : Upsample(with_mode(std::move(options), "bilinear", true)) {}

PixelShuffle::PixelShuffle(int64_t upscale_factor) : upscale_factor(upscale_factor) {
  KILN_CHECK(upscale_factor > 0, "nn::PixelShuffle: upscale_factor must be positive, got {}", upscale_factor);
}
std::string PixelShuffle::extra_repr() const { return fmt::format("upscale_factor={}", upscale_factor); }

PixelUnshuffle::PixelUnshuffle(int64_t downscale_factor) : downscale_factor(downscale_factor) {
  KILN_CHECK(downscale_factor > 0, "nn::PixelUnshuffle: downscale_factor must be positive, got {}",
             downscale_factor);
}
std::string PixelUnshuffle::extra_repr() const { return fmt::format("downscale_factor={}", downscale_factor); }

ChannelShuffle::ChannelShuffle(int64_t groups) : groups(groups) {
  KILN_CHECK(groups > 0, "nn::ChannelShuffle: groups must be positive, got {}", groups);
}
std::string ChannelShuffle::extra_repr() const { return fmt::format("groups={}", groups); }

}  // namespace kiln::nn

// data/synthetic.cpp: SyntheticImages.
#include "data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <numbers>

#include "core/philox.h"
#include "ops/ops.h"

namespace kiln::data {
namespace {

// Uniform [0, 1) from element i of the Philox stream (seed, offset): Note [random element mapping].
double uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  uint32_t w0, w1;
  Philox4x32::element_words(seed, offset, i, w0, w1);
  return (w0 >> 8) * 0x1.0p-24;
}

constexpr uint64_t kNoiseOffset = uint64_t{1} << 32;  // the patterns use counters below this

}  // namespace

SyntheticImages::SyntheticImages(int64_t size, Shape shape, int64_t num_classes, uint64_t seed,
                                 double noise)
    : size_(size), num_classes_(num_classes), shape_(shape), seed_(seed), noise_(noise) {
  KILN_CHECK(size >= 0, "SyntheticImages: size must be non-negative, got {}", size);
  KILN_CHECK(shape.size() == 3 && shape[0] > 0 && shape[1] > 0 && shape[2] > 0,
             "SyntheticImages: shape must be (C, H, W) with positive sizes, got {}", shape.str());
  KILN_CHECK(num_classes >= 1, "SyntheticImages: num_classes must be at least 1, got {}",
             num_classes);
  KILN_CHECK(noise >= 0, "SyntheticImages: noise must be non-negative, got {}", noise);
  int64_t pattern_floats = 0;  // one (C, H, W) pattern a class, in float32
  KILN_CHECK(!__builtin_mul_overflow(shape[0], shape[1], &numel_) && !__builtin_mul_overflow(numel_, shape[2], &numel_) &&
                 !__builtin_mul_overflow(numel_, num_classes, &pattern_floats) && pattern_floats <= (int64_t{1} << 40),
             "SyntheticImages: {} classes of images of shape {} are more than it can hold; ask for smaller images",
             num_classes, shape.str());
  try {
    patterns_.resize(static_cast<size_t>(pattern_floats));
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(fmt::format("SyntheticImages: out of CPU memory for {} patterns of shape {} ({:.1f} GiB)",
                                       num_classes, shape.str(), pattern_floats * 4.0 / (1 << 30)));
  }
  const double two_pi = 2 * std::numbers::pi;
  for (int64_t c = 0; c < num_classes; ++c) {
    double f[6];  // two waves: x frequency, y frequency, phase
    for (int k = 0; k < 6; ++k) f[k] = uniform(seed, 0, c * 6 + k) * (k % 3 == 2 ? two_pi : 4.0);
    for (int64_t ch = 0; ch < shape[0]; ++ch) {
      for (int64_t y = 0; y < shape[1]; ++y) {
        for (int64_t x = 0; x < shape[2]; ++x) {
          const double u = static_cast<double>(x) / shape[2], v = static_cast<double>(y) / shape[1];
          const double w = std::sin(two_pi * (f[0] * u + f[1] * v) + f[2] + ch) +
                           std::sin(two_pi * (f[3] * u + f[4] * v) + f[5]);
          patterns_[(c * shape[0] + ch) * shape[1] * shape[2] + y * shape[2] + x] =
              static_cast<float>(0.5 + 0.25 * w);
        }
      }
    }
  }
}

Example SyntheticImages::get(int64_t index) const {
  Example batch = get_batch({index});
  return {batch.data[0], batch.target[0]};
}

Example SyntheticImages::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t batch = static_cast<int64_t>(indices.size());
  Shape batch_shape = shape_;
  batch_shape.insert(0, batch);
  Tensor data = empty(batch_shape, kFloat32);
  Tensor target = empty({batch}, kInt64);
  float* x = data.data_ptr<float>();
  int64_t* y = target.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t i = indices[b];
    check_index("SyntheticImages", i, size_);
    const int64_t label = i % num_classes_;
    const float* pattern = patterns_.data() + label * numel_;
    const uint64_t first = static_cast<uint64_t>(i) * numel_;
    for (int64_t p = 0; p < numel_; ++p) {
      const double n = (2 * uniform(seed_, kNoiseOffset, first + p) - 1) * noise_;
      x[b * numel_ + p] = static_cast<float>(std::clamp(pattern[p] + n, 0.0, 1.0));
    }
    y[b] = label;
  }
  return {data, target};
}

}  // namespace kiln::data

// data/synthetic.h: SyntheticImages, a learnable stand-in for Fashion-MNIST (kiln-train's
// `synthetic` dataset when the package is absent): same layout, no files.
//
// Class c has a fixed pattern: a sum of two plane waves whose frequencies and phases come from the
// seed. Sample i has label i % num_classes (balanced) and is clamp(pattern + noise, 0, 1), with
// uniform noise in [-noise, noise] drawn from Philox counters of its own, so sample i is the same
// whatever the order or thread that asks for it, and nothing is stored.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace kiln::data {

class SyntheticImages : public Dataset {
 public:
  // shape: (C, H, W) of one sample. Sample i: data float32 `shape` in [0, 1], target int64.
  SyntheticImages(int64_t size, Shape shape = {1, 28, 28}, int64_t num_classes = 10,
                  uint64_t seed = 0, double noise = 0.5);

  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;

  int64_t num_classes() const { return num_classes_; }

 private:
  int64_t size_, num_classes_, numel_;
  Shape shape_;
  uint64_t seed_;
  double noise_;
  std::vector<float> patterns_;  // (num_classes, C*H*W)
};

}  // namespace kiln::data

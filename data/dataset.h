// data/dataset.h: Example (one sample or one batch: data and target), the abstract Dataset, and
// TensorDataset. The DataLoader (data/dataloader.h) batches any Dataset.
//
// A Dataset is read by the DataLoader's worker threads at the same time: get() and get_batch() are
// const and must be safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace kiln::data {

// One sample (data [...], target []) or one batch (data [B, ...], target [B]).
struct Example {
  Tensor data;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // The samples at `indices`, stacked along a new dim 0. The default stacks get()s; datasets that
  // can build a batch directly (from bytes in memory, say) override it for speed.
  virtual Example get_batch(const std::vector<int64_t>& indices) const;
};

// Sample i is (data[i], target[i]); both tensors share dim 0. Like torch.utils.data.TensorDataset.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor data, Tensor target);
  int64_t size() const override { return data_.size(0); }
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;

 private:
  Tensor data_;    // (N, ...)
  Tensor target_;  // (N, ...)
};

// The samples of `dataset` at `indices`, in that order: sample i is dataset[indices[i]]. Like
// torch.utils.data.Subset (kiln-train's --limit-train takes the first N samples this way).
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices);
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;

 private:
  std::shared_ptr<const Dataset> dataset_;
  std::vector<int64_t> indices_;
};

// The Error a Dataset raises for an index outside [0, size).
void check_index(const char* dataset, int64_t index, int64_t size);

}  // namespace kiln::data

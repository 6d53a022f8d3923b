// data/dataset.cpp: Dataset's default get_batch and TensorDataset.
#include "data/dataset.h"

#include "ops/ops.h"

namespace kiln::data {

void check_index(const char* dataset, int64_t index, int64_t size) {
  KILN_CHECK(index >= 0 && index < size, "{}: index {} is out of range for a dataset of {} samples",
             dataset, index, size);
}

Example Dataset::get_batch(const std::vector<int64_t>& indices) const {
  KILN_CHECK(!indices.empty(), "Dataset::get_batch: no indices");
  std::vector<Tensor> data, target;
  data.reserve(indices.size());
  target.reserve(indices.size());
  for (int64_t i : indices) {
    Example e = get(i);
    data.push_back(std::move(e.data));
    target.push_back(std::move(e.target));
  }
  return {stack(data), stack(target)};
}

TensorDataset::TensorDataset(Tensor data, Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  KILN_CHECK(data_.defined() && target_.defined(),
             "TensorDataset: data and target must be defined");
  KILN_CHECK(data_.dim() >= 1 && target_.dim() >= 1 && data_.size(0) == target_.size(0),
             "TensorDataset: data {} and target {} must have the same size in dim 0",
             data_.sizes().str(), target_.sizes().str());
}

Example TensorDataset::get(int64_t index) const {
  check_index("TensorDataset", index, size());
  return {data_[index], target_[index]};
}

Example TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices) check_index("TensorDataset", i, size());
  Tensor idx = from_vector(indices).to(data_.device());
  return {data_.index_select(0, idx), target_.index_select(0, idx.to(target_.device()))};
}

Subset::Subset(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices)
    : dataset_(std::move(dataset)), indices_(std::move(indices)) {
  KILN_CHECK(dataset_ != nullptr, "Subset: the dataset is null");
  for (int64_t i : indices_) check_index("Subset: an index into its dataset", i, dataset_->size());
}

Example Subset::get(int64_t index) const {
  check_index("Subset", index, size());
  return dataset_->get(indices_[static_cast<size_t>(index)]);
}

Example Subset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<int64_t> inner;
  inner.reserve(indices.size());
  for (int64_t i : indices) {
    check_index("Subset", i, size());
    inner.push_back(indices_[static_cast<size_t>(i)]);
  }
  return dataset_->get_batch(inner);
}

}  // namespace kiln::data

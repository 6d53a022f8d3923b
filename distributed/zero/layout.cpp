// distributed/zero/layout.cpp: the flat layout's arithmetic (see layout.h for the picture).
#include "distributed/zero/layout.h"

#include <algorithm>

#include "core/error.h"

namespace kiln::distributed {

FlatRange intersect(FlatRange range, FlatRange within) {
  const int64_t begin = std::max(range.begin, within.begin), end = std::min(range.end, within.end);
  if (end > begin) return {begin, end};
  const int64_t at = std::clamp(begin, range.begin, range.end);  // empty, but inside `range`
  return {at, at};
}

FlatLayout::FlatLayout(std::vector<int64_t> numels, int partitions)
    : numels_(std::move(numels)), partitions_(partitions) {
  KILN_CHECK(partitions_ >= 1, "FlatLayout: the number of partitions must be >= 1, not {}", partitions_);
  offsets_.reserve(numels_.size());
  for (size_t i = 0; i < numels_.size(); ++i) {
    KILN_CHECK(numels_[i] >= 0, "FlatLayout: parameter {} has {} elements", i, numels_[i]);
    offsets_.push_back(numel_);
    numel_ += numels_[i];
  }
  padded_numel_ = (numel_ + partitions_ - 1) / partitions_ * partitions_;
}

std::vector<GradBucket> make_grad_buckets(const FlatLayout& layout, int64_t bucket_numel) {
  KILN_CHECK(bucket_numel >= 1, "make_grad_buckets: the bucket size must be >= 1 element, not {}", bucket_numel);
  std::vector<GradBucket> buckets;
  for (int64_t i = layout.num_params(); i-- > 0;) {
    const FlatRange p = layout.param(i);
    // Parameters are laid out in order, so walking them backwards extends a bucket downwards.
    if (buckets.empty() ||
        (!buckets.back().params.empty() && buckets.back().range.size() + p.size() > bucket_numel)) {
      buckets.push_back(GradBucket{.params = {}, .range = {p.end, p.end}});
    }
    buckets.back().params.push_back(i);
    buckets.back().range.begin = p.begin;
  }
  return buckets;
}

}  // namespace kiln::distributed

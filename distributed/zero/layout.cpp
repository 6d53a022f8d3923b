// distributed/zero/layout.cpp: the flat layout's arithmetic (see layout.h for the picture).
#include "distributed/zero/layout.h"

#include <algorithm>
#include <map>

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

int64_t numel_of(const std::vector<FlatRange>& ranges) {
  int64_t n = 0;
  for (const FlatRange& r : ranges) n += r.size();
  return n;
}

int64_t GradBucket::numel() const { return numel_of(ranges); }

std::vector<GradBucket> make_grad_buckets(const FlatLayout& layout, int64_t bucket_numel,
                                          const std::vector<int>& groups) {
  KILN_CHECK(bucket_numel >= 1, "make_grad_buckets: the bucket size must be >= 1 element, not {}", bucket_numel);
  KILN_CHECK(groups.empty() || static_cast<int64_t>(groups.size()) == layout.num_params(),
             "make_grad_buckets: {} groups for {} parameters; give one per parameter, or none", groups.size(),
             layout.num_params());
  std::vector<GradBucket> buckets;
  std::map<int, size_t> open;  // per group: the bucket it fills
  for (int64_t i = layout.num_params(); i-- > 0;) {
    const FlatRange p = layout.param(i);
    const int group = groups.empty() ? 0 : groups[static_cast<size_t>(i)];
    auto it = open.find(group);
    if (it == open.end() || buckets[it->second].numel() + p.size() > bucket_numel) {
      it = open.insert_or_assign(group, buckets.size()).first;
      buckets.emplace_back();
    }
    GradBucket& b = buckets[it->second];
    const bool first = b.params.empty();
    b.params.push_back(i);
    // Walking backwards, each parameter lies below the bucket's ranges: it extends the lowest one
    // downwards where it ends where that begins, or goes before it.
    if (p.empty() && !first) continue;
    if (!b.ranges.empty() && b.ranges.front().begin == p.end) b.ranges.front().begin = p.begin;
    else b.ranges.insert(b.ranges.begin(), p);
  }
  // A bucket is complete when its first parameter has its gradient; backward goes down the layout.
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const GradBucket& a, const GradBucket& b) { return a.params.back() > b.params.back(); });
  return buckets;
}

std::vector<FlatRange> make_sub_groups(const FlatLayout& layout, int partition, int64_t sub_group_size) {
  KILN_CHECK(sub_group_size >= 0, "make_sub_groups: sub_group_size must be >= 0, not {}", sub_group_size);
  KILN_CHECK(partition >= 0 && partition < layout.num_partitions(), "make_sub_groups: partition {} is not in [0, {})",
             partition, layout.num_partitions());
  const FlatRange part = layout.partition(partition);
  std::vector<int64_t> piece_ends;  // where each parameter's piece in the partition ends (offsets)
  for (int64_t i = 0; i < layout.num_params(); ++i) {
    const FlatRange piece = intersect(layout.param(i), part);
    if (!piece.empty()) piece_ends.push_back(piece.end - part.begin);
  }
  std::vector<FlatRange> groups;
  int64_t begin = 0;
  if (sub_group_size < part.size()) {
    for (size_t k = 0; k + 1 < piece_ends.size(); ++k) {  // the last piece's group runs to the end
      if (piece_ends[k] - begin < sub_group_size) continue;
      groups.push_back({begin, piece_ends[k]});
      begin = piece_ends[k];
    }
  }
  groups.push_back({begin, part.size()});
  return groups;
}

}  // namespace kiln::distributed

// distributed/zero/layout.h: ZeRO's arithmetic, with no tensors in it: where each parameter lives in
// the flat buffer, which rank owns which slice of it, and how gradients are cut into buckets.
//
//   parameters (registration order)   |  p0  |    p1    | p2 |  p3  |pad|      numel T, padded_numel Tp
//   partitions (world_size N = 3)     |   rank 0   |   rank 1   |   rank 2   |  Tp / N = P each
//   buckets (reverse order, ~B each)  |  bucket 2  |  bucket 1   | bucket 0  |  (B: reduce_bucket_size)
//
// The parameters are laid end to end in registration order (T elements), padded with zeros to a
// multiple of N (Tp), and cut into N equal partitions of P = Tp / N: rank r owns [r P, (r + 1) P).
// A parameter may straddle two partitions; that is fine, because everything ZeRO does to a partition
// (Adam's update, the norm, the all-gather) is elementwise. Buckets group whole parameters in reverse
// order of registration, the order in which backward produces their gradients, so each bucket is a
// contiguous range of the flat buffer, and its reduce-scatter gives each rank the part of the range
// that falls in its partition (possibly nothing). The rest of ZeRO (zero_optimizer.h,
// grad_reducer.h, param_gatherer.h) is this layout applied to tensors.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::distributed {

// The elements [begin, end) of a flat buffer.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const FlatRange&) const = default;
};

// The part of `range` inside `within`. When they do not meet it is empty and still lies within
// `range`, so that a slice of a buffer holding `range` at it is a valid empty slice.
FlatRange intersect(FlatRange range, FlatRange within);
// The elements of several ranges together.
int64_t numel_of(const std::vector<FlatRange>& ranges);

class FlatLayout {
 public:
  // numels: each parameter's number of elements, in registration order (each >= 0).
  // partitions: how many equal slices the buffer is cut into (the world size; 1 for no sharding).
  FlatLayout(std::vector<int64_t> numels, int partitions);

  int64_t num_params() const { return static_cast<int64_t>(numels_.size()); }
  int num_partitions() const { return partitions_; }
  int64_t numel() const { return numel_; }                 // T: the parameters' elements
  int64_t padded_numel() const { return padded_numel_; }   // Tp: T rounded up to a multiple of N
  int64_t partition_numel() const { return padded_numel_ / partitions_; }  // P = Tp / N

  FlatRange param(int64_t i) const { return {offsets_[i], offsets_[i] + numels_[i]}; }
  FlatRange partition(int rank) const { return {rank * partition_numel(), (rank + 1) * partition_numel()}; }

 private:
  std::vector<int64_t> numels_, offsets_;
  int partitions_;
  int64_t numel_ = 0, padded_numel_ = 0;
};

// A gradient bucket: whole parameters, in reverse registration order.
struct GradBucket {
  std::vector<int64_t> params;    // parameter indices, in the order backward produces them (descending)
  std::vector<FlatRange> ranges;  // the flat elements they cover, ascending; one range unless grouped
  int64_t numel() const;
};

// Buckets of at most `bucket_numel` elements each (a larger parameter gets a bucket of its own),
// filled from the last parameter backwards: bucket 0 holds the last parameters registered, and each
// bucket is one range of the flat buffer. groups (one number per parameter, or empty): a bucket
// holds parameters of one group only (buckets that travel in different dtypes:
// ZeroOptions::autocast_dtype). Each group then fills its own bucket, skipping over the others'
// parameters, so a bucket may cover several ranges; the buckets are ordered by when backward
// completes them (their first parameter, the last to get its gradient: descending).
std::vector<GradBucket> make_grad_buckets(const FlatLayout& layout, int64_t bucket_numel,
                                          const std::vector<int>& groups = {});

// Stage 3's sub-groups of partition `partition` (DeepSpeed's sub_group_size): the parameters' pieces
// in it, in order, are gathered into a group until it holds >= sub_group_size elements, so a group
// is whole pieces (one piece when sub_group_size is 0 or a piece is larger) and the last group runs
// to the partition's end, padding included. The ranges are offsets into the partition and cover it
// end to end; one range, the whole partition, where sub_group_size >= partition_numel().
std::vector<FlatRange> make_sub_groups(const FlatLayout& layout, int partition, int64_t sub_group_size);

}  // namespace kiln::distributed

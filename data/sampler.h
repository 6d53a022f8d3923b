// data/sampler.h: which dataset indices a DataLoader visits in an epoch, and in what order
// (PyTorch's Sampler), and DistributedSampler, which gives each data-parallel rank its shard.
//
//   data::DataLoader loader(train, {.batch_size = 64, .sampler = std::make_shared<data::DistributedSampler>(
//                                       data::DistributedSamplerOptions{.num_replicas = comm->size(),
//                                                                       .rank = comm->rank()})});
//   loader.set_epoch(e);   // a new shuffle each epoch, the same on every rank
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The dataset indices of epoch `epoch`, in the order the loader visits them.
  virtual std::vector<int64_t> indices(int64_t dataset_size, int64_t epoch) const = 0;
  // How many indices() returns.
  virtual int64_t size(int64_t dataset_size) const = 0;
};

struct DistributedSamplerOptions {
  int64_t num_replicas = 1;  // the data-parallel world size
  int64_t rank = 0;          // this rank among them
  bool shuffle = true;       // a permutation per epoch, drawn from (seed, epoch): equal on every rank
  uint64_t seed = 0;
  // false: repeat the first indices so that every rank gets ceil(n / num_replicas) of them;
  // true: drop the last n % num_replicas indices instead.
  bool drop_last = false;
};

// Rank r of R takes the indices at positions r, r + R, r + 2R, ... of the (shuffled, padded or
// cut) epoch order, as PyTorch's DistributedSampler: the shards are disjoint (apart from padding)
// and equal in size, so every rank runs the same number of steps.
class DistributedSampler final : public Sampler {
 public:
  explicit DistributedSampler(DistributedSamplerOptions options);
  std::vector<int64_t> indices(int64_t dataset_size, int64_t epoch) const override;
  int64_t size(int64_t dataset_size) const override;
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  DistributedSamplerOptions options_;
};

}  // namespace kiln::data

// data/dataloader.h: DataLoader, batches of a Dataset in a seeded order, optionally built ahead of
// the training loop by background threads.
//
//   data::DataLoader loader(data::FashionMNIST::train(), {.batch_size = 128, .shuffle = true});
//   for (auto& [x, y] : loader) { ... }          // x (128, 1, 28, 28) float32, y (128) int64
//
// Note [data loader order]
// Each pass over the loader (each begin()) is one epoch. With shuffle, epoch e visits the samples
// in randperm(n) drawn from a Philox generator with key `seed` and counters starting at e * 2^40,
// so the order depends only on (seed, epoch): not on num_workers, not on timing. Batch b of the
// epoch is order[b * batch_size, (b + 1) * batch_size); workers build batches in any order but the
// loader delivers them in order. The position (epoch, batches delivered in it, seed) is
// state_dict(); a loader given it by load_state_dict() continues with exactly the batches that were
// left.
//
// A begin() while an earlier pass is unfinished (the loop broke early) ends that pass and starts
// the next epoch, as a Python DataLoader starts a fresh iteration. One consumer thread at a time.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"

namespace kiln::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  // Seed of the shuffle order; when absent, drawn once at construction from kiln's default
  // generator (so kiln::manual_seed makes a run reproducible, as torch.manual_seed does for
  // PyTorch).
  std::optional<uint64_t> seed = {};
  bool drop_last = false;  // drop the last batch when it is smaller than batch_size
  int num_workers = 0;     // background threads building batches; 0 builds them in the loop
  int prefetch = 2;        // batches each worker keeps in flight (PyTorch's prefetch_factor)
  // Builds a batch from its samples (PyTorch's collate_fn). When empty, the loader calls the
  // dataset's get_batch(indices), which is the fast path.
  std::function<Example(std::vector<Example>)> collate = {};
  // Which indices an epoch visits, in what order (e.g. a DistributedSampler's shard); replaces
  // shuffle, which must then be false (as PyTorch). Its indices() get the loader's epoch.
  std::shared_ptr<const Sampler> sampler = {};
};

class DataLoader {
 public:
  // Where the loader is: the next batch it delivers is batch `batch` of epoch `epoch`.
  struct State {
    int64_t epoch = 0;
    int64_t batch = 0;  // batches already delivered in this epoch
    uint64_t seed = 0;
  };

  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  template <std::derived_from<Dataset> D>
  DataLoader(D dataset, DataLoaderOptions options = {})
      : DataLoader(std::make_shared<const D>(std::move(dataset)), std::move(options)) {}
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  class Pass;
  class Iterator {
   public:
    using value_type = Example;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    Example& operator*() const { return *get(); }
    Example* operator->() const { return get(); }
    Iterator& operator++();
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return current_ == nullptr; }

   private:
    friend class DataLoader;
    Example* get() const;  // an Error at the end of a pass
    std::shared_ptr<Pass> pass_;        // stops its workers when the last iterator lets go
    std::shared_ptr<Example> current_;  // null at the end
  };

  Iterator begin();
  std::default_sentinel_t end() const { return {}; }

  int64_t size() const;  // batches per epoch (PyTorch's len(loader))
  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }

  void set_epoch(int64_t epoch);  // the next begin() starts this epoch from its first batch
  State state_dict() const { return state_; }
  void load_state_dict(const State& state);

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  State state_;
  bool fresh_ = true;  // state_ names a pass not yet begun (else begin() moves to the next epoch)
  std::weak_ptr<Pass> pass_;  // the pass in progress, stopped when the loader goes away
};

}  // namespace kiln::data

// data/dataloader.cpp: DataLoader and one pass over it (Pass): the epoch's order, the worker
// threads and the in-order hand-over of their batches. See Note [data loader order] in
// data/dataloader.h.
#include "data/dataloader.h"

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <system_error>
#include <thread>

#include "core/generator.h"
#include "ops/ops.h"

namespace kiln::data {

// One epoch: batches first_batch .. num_batches - 1 of `order`. With workers, batch b is built by
// whichever worker claims it, at most `window` batches ahead of the consumer, and handed over in
// order through `ready_`.
class DataLoader::Pass {
 public:
  Pass(DataLoader* loader, std::vector<int64_t> order, int64_t first_batch, int64_t num_batches)
      : loader_(loader),
        dataset_(loader->dataset_),
        options_(loader->options_),
        order_(std::move(order)),
        num_batches_(num_batches),
        next_(first_batch),
        next_claim_(first_batch),
        window_(static_cast<int64_t>(options_.num_workers) * options_.prefetch) {
    try {
      for (int w = 0; w < options_.num_workers; ++w) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {  // the system's limit on threads (or their memory)
      stop();  // joins those that started: a joinable std::thread destroyed would terminate
      KILN_FAIL("DataLoader: could not start worker thread {} of num_workers = {} ({}); ask for fewer workers",
                workers_.size() + 1, options_.num_workers, e.what());
    }
  }
  ~Pass() { stop(); }

  // The next batch, or null at the end. A worker's exception is rethrown here, as it was thrown.
  std::shared_ptr<Example> next() {
    int64_t b;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return nullptr;  // ended early: the loader's position stays where it was
      b = next_;
    }
    if (b >= num_batches_) {
      finish();
      return nullptr;
    }
    std::shared_ptr<Example> batch;
    if (workers_.empty()) {
      batch = std::make_shared<Example>(build(b));
      next_ = b + 1;
    } else {
      Slot slot;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_cv_.wait(lock, [&] { return stopping_ || ready_.count(b) > 0; });
        if (stopping_) return nullptr;
        auto it = ready_.find(b);
        slot = std::move(it->second);
        ready_.erase(it);
        next_ = b + 1;
      }
      work_cv_.notify_all();
      if (slot.error) {
        stop();
        std::rethrow_exception(slot.error);
      }
      batch = std::move(slot.batch);
    }
    if (loader_ != nullptr) loader_->state_.batch = b + 1;
    return batch;
  }

  // Ends the pass: wakes and joins the workers. Idempotent.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    ready_cv_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
  }
  // The loader is gone or has moved on: this pass no longer updates its position.
  void detach() { loader_ = nullptr; }

 private:
  struct Slot {
    std::shared_ptr<Example> batch;
    std::exception_ptr error;
  };

  Example build(int64_t b) const {
    const int64_t n = static_cast<int64_t>(order_.size());
    const int64_t begin = b * options_.batch_size;
    const int64_t end = begin + std::min(n - begin, options_.batch_size);  // no overflow
    std::vector<int64_t> indices(order_.begin() + begin, order_.begin() + end);
    if (!options_.collate) return dataset_->get_batch(indices);
    std::vector<Example> samples;
    samples.reserve(indices.size());
    for (int64_t i : indices) samples.push_back(dataset_->get(i));
    return options_.collate(std::move(samples));
  }

  void work() {
    for (;;) {
      int64_t b;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [&] {
          return stopping_ || (next_claim_ < num_batches_ && next_claim_ < next_ + window_);
        });
        if (stopping_) return;
        b = next_claim_++;
      }
      Slot slot;
      try {
        slot.batch = std::make_shared<Example>(build(b));
      } catch (...) {
        slot.error = std::current_exception();  // handed to the consumer in batch order
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.emplace(b, std::move(slot));
      }
      ready_cv_.notify_all();
    }
  }

  // The last batch has been delivered: the loader moves to the start of the next epoch.
  void finish() {
    stop();
    if (loader_ != nullptr) {
      loader_->state_.epoch += 1;
      loader_->state_.batch = 0;
      loader_->fresh_ = true;
      loader_ = nullptr;
    }
  }

  DataLoader* loader_;
  const std::shared_ptr<const Dataset> dataset_;
  const DataLoaderOptions options_;
  const std::vector<int64_t> order_;  // the epoch's sample order
  const int64_t num_batches_;

  std::mutex mutex_;  // guards everything below
  std::condition_variable work_cv_, ready_cv_;
  int64_t next_;        // the batch the consumer takes next
  int64_t next_claim_;  // the batch the next free worker builds
  const int64_t window_;
  bool stopping_ = false;
  std::map<int64_t, Slot> ready_;  // built, not yet taken
  std::vector<std::thread> workers_;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  KILN_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  KILN_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got {}",
             options_.batch_size);
  KILN_CHECK(options_.num_workers >= 0, "DataLoader: num_workers must be non-negative, got {}",
             options_.num_workers);
  KILN_CHECK(options_.prefetch >= 1, "DataLoader: prefetch must be at least 1, got {}",
             options_.prefetch);
  KILN_CHECK(!(options_.sampler && options_.shuffle),
             "DataLoader: sampler and shuffle exclude each other; shuffle in the sampler (DistributedSampler "
             "shuffles by default) and leave shuffle false");
  // Drawn from the default generator's next counters, so manual_seed fixes it.
  state_.seed = options_.seed ? *options_.seed
                              : static_cast<uint64_t>(randint(0, int64_t{1} << 53, {1}).item<int64_t>());
}

DataLoader::~DataLoader() {
  if (auto pass = pass_.lock()) {
    pass->detach();
    pass->stop();
  }
}

int64_t DataLoader::size() const {
  const int64_t n = options_.sampler ? options_.sampler->size(dataset_->size()) : dataset_->size();
  return options_.drop_last ? n / options_.batch_size
                            : n / options_.batch_size + (n % options_.batch_size != 0);  // no overflow
}

DataLoader::Iterator DataLoader::begin() {
  if (auto pass = pass_.lock()) {  // an unfinished pass ends here
    pass->detach();
    pass->stop();
  }
  if (!fresh_) {
    state_.epoch += 1;
    state_.batch = 0;
  }
  fresh_ = false;

  const int64_t n = dataset_->size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (options_.sampler) {
    order = options_.sampler->indices(n, state_.epoch);
    const int64_t promised = options_.sampler->size(n);
    KILN_CHECK(static_cast<int64_t>(order.size()) == promised,
               "DataLoader: the sampler's indices() gave {} indices but its size() says {}; the two must agree",
               order.size(), promised);
    for (int64_t i : order) {
      KILN_CHECK(i >= 0 && i < n, "DataLoader: the sampler gave index {} for a dataset of {} samples", i, n);
    }
  } else if (options_.shuffle) {
    Generator gen(state_.seed);
    gen.set_state({state_.seed, static_cast<uint64_t>(state_.epoch) << 40});
    order = randperm(n, kInt64, &gen).to_vector<int64_t>();
  } else {
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  auto pass = std::make_shared<Pass>(this, std::move(order), state_.batch, size());
  pass_ = pass;
  Iterator it;
  it.pass_ = pass;
  ++it;
  return it;
}

Example* DataLoader::Iterator::get() const {
  KILN_CHECK(current_ != nullptr, "DataLoader: an iterator at the end of its pass has no batch; compare it with "
             "end() before dereferencing it");
  return current_.get();
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  current_ = pass_ ? pass_->next() : nullptr;
  if (current_ == nullptr) pass_.reset();
  return *this;
}

void DataLoader::set_epoch(int64_t epoch) {
  KILN_CHECK(epoch >= 0, "DataLoader::set_epoch: epoch must be non-negative, got {}", epoch);
  load_state_dict({.epoch = epoch, .batch = 0, .seed = state_.seed});
}

void DataLoader::load_state_dict(const State& state) {
  KILN_CHECK(state.epoch >= 0 && state.batch >= 0 && state.batch <= size(),
             "DataLoader::load_state_dict: position (epoch {}, batch {}) is not in [0, {}] batches "
             "per epoch; was the state saved with another dataset or batch size?",
             state.epoch, state.batch, size());
  if (auto pass = pass_.lock()) {
    pass->detach();
    pass->stop();
  }
  state_ = state;
  fresh_ = true;
}

}  // namespace kiln::data

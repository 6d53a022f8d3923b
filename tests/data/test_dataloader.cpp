// tests/data/test_dataloader.cpp: DataLoader: the order (Note [data loader order]) whatever the
// worker count, batching, drop_last, collate, resuming from a position, early exits and errors.
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "support.h"

using namespace kiln;
using namespace kiln::test;
using data::DataLoader;

namespace {

// Sample i: data [i, -i] float32, target i.
data::TensorDataset numbered(int64_t n) {
  Tensor i = arange(n);
  return data::TensorDataset(stack({i.to(kFloat32), -i.to(kFloat32)}, 1), i);
}

// Every batch of one pass, as its targets.
std::vector<std::vector<int64_t>> one_epoch(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (auto& [x, y] : loader) {
    auto ids = y.to_vector<int64_t>();
    CHECK(x.sizes() == Shape{static_cast<int64_t>(ids.size()), 2});
    CHECK(x.select(1, 0).to_vector<float>() == std::vector<float>(ids.begin(), ids.end()));
    out.push_back(ids);
  }
  return out;
}

// The documented order: randperm(n) from Philox key `seed`, counters from epoch * 2^40.
std::vector<int64_t> expected_order(int64_t n, uint64_t seed, int64_t epoch) {
  Generator gen(seed);
  gen.set_state({seed, static_cast<uint64_t>(epoch) << 40});
  return randperm(n, kInt64, &gen).to_vector<int64_t>();
}

std::vector<std::vector<int64_t>> batches_of(const std::vector<int64_t>& order, int64_t batch,
                                             bool drop_last) {
  std::vector<std::vector<int64_t>> out;
  for (size_t b = 0; b < order.size(); b += batch) {
    const size_t e = std::min(order.size(), b + batch);
    if (drop_last && e - b < static_cast<size_t>(batch)) break;
    out.emplace_back(order.begin() + b, order.begin() + e);
  }
  return out;
}

// get() sleeps, so that workers are busy when the consumer leaves; throws at `bad` if set.
class SlowDataset : public data::Dataset {
 public:
  explicit SlowDataset(int64_t n, int64_t bad = -1) : n_(n), bad_(bad) {}
  int64_t size() const override { return n_; }
  data::Example get(int64_t i) const override {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    KILN_CHECK(i != bad_, "SlowDataset: bad sample {}", i);
    ++calls;
    return {full({2}, static_cast<double>(i)), scalar_tensor(i, kInt64)};
  }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t n_, bad_;
};

}  // namespace

TEST_CASE("DataLoader: without shuffle, batches in order and the last partial batch kept",
          "[data]") {
  DataLoader loader(numbered(10), {.batch_size = 4});
  CHECK(loader.size() == 3);
  auto got = one_epoch(loader);
  CHECK(got == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
}

TEST_CASE("DataLoader: a batch_size beyond the dataset gives one batch of it all", "[data]") {
  for (int64_t batch_size : {int64_t{10}, int64_t{11}, INT64_MAX - 8, INT64_MAX}) {
    INFO(batch_size);
    DataLoader loader(numbered(10), {.batch_size = batch_size});
    CHECK(loader.size() == 1);
    CHECK(one_epoch(loader) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}});
    DataLoader dropped(numbered(10), {.batch_size = batch_size, .drop_last = true});
    CHECK(dropped.size() == (batch_size == 10 ? 1 : 0));
  }
}

TEST_CASE("DataLoader: drop_last drops the short batch", "[data]") {
  DataLoader loader(numbered(10), {.batch_size = 4, .drop_last = true});
  CHECK(loader.size() == 2);
  CHECK(one_epoch(loader) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  DataLoader exact(numbered(8), {.batch_size = 4, .drop_last = true});
  CHECK(exact.size() == 2);
  CHECK(one_epoch(exact).size() == 2);
}

TEST_CASE("DataLoader: the same seed gives the same batches for 0, 1 and 3 workers", "[data]") {
  const int64_t n = 23, batch = 4;
  const uint64_t seed = 7;
  for (bool drop_last : {false, true}) {
    for (int workers : {0, 1, 3}) {
      CAPTURE(drop_last, workers);
      DataLoader loader(numbered(n), {.batch_size = batch,
                                      .shuffle = true,
                                      .seed = seed,
                                      .drop_last = drop_last,
                                      .num_workers = workers});
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        CAPTURE(epoch);
        auto got = one_epoch(loader);
        CHECK(got == batches_of(expected_order(n, seed, epoch), batch, drop_last));
        CHECK(static_cast<int64_t>(got.size()) == loader.size());
      }
    }
  }
}

TEST_CASE("DataLoader: each epoch is a different permutation of every sample", "[data]") {
  DataLoader loader(numbered(50), {.batch_size = 8, .shuffle = true, .seed = 1, .num_workers = 2});
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> all;
    for (auto& ids : one_epoch(loader)) all.insert(all.end(), ids.begin(), ids.end());
    std::vector<int64_t> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> iota(50);
    std::iota(iota.begin(), iota.end(), 0);
    CHECK(sorted == iota);
    CHECK(all != iota);
    epochs.push_back(all);
  }
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);
  DataLoader other(numbered(50), {.batch_size = 8, .shuffle = true, .seed = 2});
  std::vector<int64_t> first;
  for (auto& ids : one_epoch(other)) first.insert(first.end(), ids.begin(), ids.end());
  CHECK(first != epochs[0]);
}

TEST_CASE("DataLoader: without a seed, the default generator's seed decides", "[data]") {
  manual_seed(11);
  DataLoader a(numbered(30), {.batch_size = 5, .shuffle = true});
  manual_seed(11);
  DataLoader b(numbered(30), {.batch_size = 5, .shuffle = true, .num_workers = 2});
  CHECK(a.state_dict().seed == b.state_dict().seed);
  CHECK(one_epoch(a) == one_epoch(b));
}

TEST_CASE("DataLoader: set_epoch chooses the next pass's permutation", "[data]") {
  DataLoader loader(numbered(20), {.batch_size = 6, .shuffle = true, .seed = 3});
  loader.set_epoch(5);
  CHECK(one_epoch(loader) == batches_of(expected_order(20, 3, 5), 6, false));
  CHECK(loader.state_dict().epoch == 6);
  check_error([&] { loader.set_epoch(-1); }, {"set_epoch", "-1"});
}

TEST_CASE("DataLoader: a custom collate builds batches from the samples", "[data]") {
  for (int workers : {0, 2}) {
    DataLoader loader(numbered(7), {.batch_size = 3,
                                    .num_workers = workers,
                                    .collate = [](std::vector<data::Example> samples) {
                                      std::vector<Tensor> xs;
                                      int64_t total = 0;
                                      for (auto& s : samples) {
                                        xs.push_back(s.data * 10);
                                        total += s.target.item<int64_t>();
                                      }
                                      return data::Example{cat(xs), scalar_tensor(total, kInt64)};
                                    }});
    std::vector<std::vector<float>> data;
    std::vector<int64_t> totals;
    for (auto& [x, y] : loader) {
      data.push_back(x.to_vector<float>());
      totals.push_back(y.item<int64_t>());
    }
    CHECK(totals == std::vector<int64_t>{0 + 1 + 2, 3 + 4 + 5, 6});
    CHECK(data[2] == std::vector<float>{60, -60});
    CHECK(data[0] == std::vector<float>{0, 0, 10, -10, 20, -20});
  }
}

TEST_CASE("DataLoader: resuming from state_dict continues with exactly the batches left",
          "[data]") {
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    data::DataLoaderOptions options{
        .batch_size = 4, .shuffle = true, .seed = 99, .num_workers = workers};
    DataLoader a(numbered(30), options);
    CHECK(a.state_dict().epoch == 0);  // a new loader's position
    CHECK(a.state_dict().batch == 0);
    one_epoch(a);  // epoch 0
    DataLoader::State saved;
    std::vector<std::vector<int64_t>> rest;
    int seen = 0;
    for (auto& [x, y] : a) {  // epoch 1: save after 3 batches
      if (++seen == 3) saved = a.state_dict();
      if (seen > 3) rest.push_back(y.to_vector<int64_t>());
    }
    CHECK(saved.epoch == 1);
    CHECK(saved.batch == 3);
    CHECK(saved.seed == 99);
    const auto epoch1 = batches_of(expected_order(30, 99, 1), 4, false);  // 8 batches
    CHECK(rest == std::vector<std::vector<int64_t>>(epoch1.begin() + 3, epoch1.end()));
    auto epoch2 = one_epoch(a);

    options.seed = 12345;  // the state's seed wins
    DataLoader b(numbered(30), options);
    b.load_state_dict(saved);
    CHECK(one_epoch(b) == rest);
    CHECK(b.state_dict().epoch == 2);
    CHECK(b.state_dict().batch == 0);
    CHECK(one_epoch(b) == epoch2);
    // Saved after the last batch of an epoch: nothing is left of it, then the next epoch.
    DataLoader c(numbered(30), options);
    c.load_state_dict({.epoch = 1, .batch = c.size(), .seed = 99});
    CHECK(one_epoch(c).empty());
    CHECK(one_epoch(c) == epoch2);
  }
}

TEST_CASE("DataLoader: breaking out ends the pass and the next begin() starts the next epoch",
          "[data]") {
  DataLoader loader(numbered(40), {.batch_size = 4, .shuffle = true, .seed = 5, .num_workers = 3});
  int seen = 0;
  for (auto& batch : loader) {
    (void)batch;
    if (++seen == 2) break;
  }
  CHECK(loader.state_dict().epoch == 0);
  CHECK(loader.state_dict().batch == 2);
  CHECK(one_epoch(loader) == batches_of(expected_order(40, 5, 1), 4, false));
}

TEST_CASE("DataLoader: workers stop when the loop breaks or the loader is destroyed", "[data]") {
  auto dataset = std::make_shared<SlowDataset>(2000);
  for (int round = 0; round < 5; ++round) {
    DataLoader loader(
        dataset, {.batch_size = 8, .shuffle = true, .seed = 1, .num_workers = 3, .prefetch = 4});
    for (auto& [x, y] : loader) {
      CHECK(x.sizes() == Shape{8, 2});
      break;
    }
    // The loader goes out of scope right after a break, with workers mid-batch.
  }
  {
    auto loader = std::make_unique<DataLoader>(
        dataset, data::DataLoaderOptions{.batch_size = 8, .num_workers = 2});
    auto it = loader->begin();
    CHECK((*it).target.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
    loader.reset();  // the iterator outlives its loader: the workers are joined now
    const int64_t calls = dataset->calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(dataset->calls == calls);  // nobody is still building batches
  }
  // The workers build no further than prefetch * num_workers batches ahead of the consumer.
  dataset->calls = 0;
  DataLoader loader(dataset, {.batch_size = 4, .num_workers = 2, .prefetch = 1});
  auto it = loader.begin();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(dataset->calls <= 4 * (1 + 2));
}

TEST_CASE("DataLoader: an exception in a worker reaches the loop as the same Error", "[data]") {
  auto dataset = std::make_shared<SlowDataset>(40, /*bad=*/13);
  for (int workers : {0, 1, 3}) {
    CAPTURE(workers);
    DataLoader loader(dataset, {.batch_size = 4, .num_workers = workers});
    std::vector<int64_t> firsts;
    check_error(
        [&] {
          for (auto& [x, y] : loader) firsts.push_back(y.to_vector<int64_t>()[0]);
        },
        {"SlowDataset: bad sample 13"});
    CHECK(firsts == std::vector<int64_t>{0, 4, 8});  // the batches before, in order
    CHECK(loader.state_dict().batch == 3);
  }
}

namespace {
// A sampler whose size() promises more indices than indices() gives.
struct ShortSampler : data::Sampler {
  std::vector<int64_t> indices(int64_t, int64_t) const override { return {0, 1}; }
  int64_t size(int64_t) const override { return 50; }
};
}  // namespace

TEST_CASE("DataLoader: a sampler whose size() disagrees, and the end iterator, are Errors", "[data]") {
  DataLoader lying(numbered(4), {.batch_size = 1, .sampler = std::make_shared<ShortSampler>()});
  check_error([&] { lying.begin(); }, {"sampler", "gave 2 indices", "size() says 50"});
  DataLoader loader(numbered(2), {.batch_size = 2});
  auto it = loader.begin();
  CHECK(it->data.size(0) == 2);
  ++it;
  CHECK(it == loader.end());
  check_error([&] { (void)it->data; }, {"DataLoader", "end of its pass", "end()"});
  check_error([&] { (void)*it; }, {"end of its pass"});
}

TEST_CASE("DataLoader: bad options and positions are Errors", "[data]") {
  check_error([] { DataLoader(numbered(3), {.batch_size = 0}); }, {"batch_size", "0"});
  check_error([] { DataLoader(numbered(3), {.num_workers = -1}); }, {"num_workers"});
  check_error([] { DataLoader(numbered(3), {.prefetch = 0}); }, {"prefetch"});
  DataLoader loader(numbered(10), {.batch_size = 4});
  check_error([&] { loader.load_state_dict({.epoch = 0, .batch = 4, .seed = 1}); },
              {"load_state_dict", "batch 4", "[0, 3]"});
  DataLoader empty(numbered(0), {.batch_size = 4, .shuffle = true, .seed = 1});
  CHECK(empty.size() == 0);
  CHECK(one_epoch(empty).empty());
}

// tests/data/test_sampler.cpp: DistributedSampler's shards, and the DataLoader driven by a sampler.
#include <algorithm>
#include <set>

#include "support.h"

using namespace kiln;
using kiln::test::check_error;

TEST_CASE("DistributedSampler: equal, disjoint shards that cover the dataset, as PyTorch's", "[data]") {
  for (int64_t n : {10, 12, 3}) {
    for (int64_t R : {1, 3, 4}) {
      for (bool shuffle : {false, true}) {
        INFO("n " << n << ", replicas " << R << ", shuffle " << shuffle);
        std::vector<int64_t> all;
        for (int64_t r = 0; r < R; ++r) {
          data::DistributedSampler s({.num_replicas = R, .rank = r, .shuffle = shuffle, .seed = 7});
          auto idx = s.indices(n, 0);
          CHECK(static_cast<int64_t>(idx.size()) == (n + R - 1) / R);  // padded to equal shards
          CHECK(s.size(n) == static_cast<int64_t>(idx.size()));
          all.insert(all.end(), idx.begin(), idx.end());
        }
        std::set<int64_t> distinct(all.begin(), all.end());
        CHECK(static_cast<int64_t>(distinct.size()) == n);  // every sample somewhere
        CHECK(*distinct.begin() == 0);
        CHECK(*distinct.rbegin() == n - 1);
        CHECK(static_cast<int64_t>(all.size()) - n == ((n + R - 1) / R) * R - n);  // only the padding repeats
      }
    }
  }
  // Without shuffle: rank r takes r, r + R, ...; the padding repeats the first indices.
  data::DistributedSampler s1({.num_replicas = 4, .rank = 1, .shuffle = false});
  CHECK(s1.indices(10, 0) == std::vector<int64_t>{1, 5, 9});
  data::DistributedSampler s3({.num_replicas = 4, .rank = 3, .shuffle = false});
  CHECK(s3.indices(10, 0) == std::vector<int64_t>{3, 7, 1});  // position 11 = index 1 (10 + 1 wraps)
  data::DistributedSampler d3({.num_replicas = 4, .rank = 3, .shuffle = false, .drop_last = true});
  CHECK(d3.indices(10, 0) == std::vector<int64_t>{3, 7});
}

TEST_CASE("DistributedSampler: a new permutation per epoch, the same on every rank", "[data]") {
  data::DistributedSampler a({.num_replicas = 2, .rank = 0, .seed = 3});
  data::DistributedSampler b({.num_replicas = 2, .rank = 1, .seed = 3});
  auto a0 = a.indices(100, 0), b0 = b.indices(100, 0), a1 = a.indices(100, 1);
  CHECK(a0 != a1);
  CHECK(a0 == a.indices(100, 0));
  std::vector<int64_t> both = a0;
  both.insert(both.end(), b0.begin(), b0.end());
  std::sort(both.begin(), both.end());
  for (int64_t i = 0; i < 100; ++i) CHECK(both[static_cast<size_t>(i)] == i);  // disjoint halves of one permutation
  check_error([] { data::DistributedSampler bad({.num_replicas = 2, .rank = 2}); }, {"rank 2 is not in [0, 2)"});
  check_error([] { data::DistributedSampler bad({.num_replicas = 0}); }, {"num_replicas must be at least 1"});
}

TEST_CASE("DataLoader: a sampler chooses the indices of each epoch, shuffle with it is an Error", "[data]") {
  Tensor x = arange(10, kFloat32).unsqueeze(1);
  Tensor y = arange(10, kInt64);
  auto sampler = std::make_shared<data::DistributedSampler>(
      data::DistributedSamplerOptions{.num_replicas = 3, .rank = 2, .shuffle = false});
  data::DataLoader loader(data::TensorDataset(x, y), {.batch_size = 2, .sampler = sampler});
  CHECK(loader.size() == 2);  // 4 indices: 2, 5, 8 and the padding 1
  std::vector<int64_t> got;
  for (auto& [bx, by] : loader) {
    for (int64_t v : by.to_vector<int64_t>()) got.push_back(v);
  }
  CHECK(got == std::vector<int64_t>{2, 5, 8, 1});
  check_error([&] { data::DataLoader bad(data::TensorDataset(x, y), {.shuffle = true, .sampler = sampler}); },
              {"sampler and shuffle exclude each other"});
}

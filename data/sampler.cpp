// data/sampler.cpp: DistributedSampler.
#include "data/sampler.h"

#include <numeric>

#include "core/error.h"
#include "core/generator.h"
#include "ops/ops.h"

namespace kiln::data {

DistributedSampler::DistributedSampler(DistributedSamplerOptions options) : options_(options) {
  KILN_CHECK(options_.num_replicas >= 1, "DistributedSampler: num_replicas must be at least 1, not {}",
             options_.num_replicas);
  KILN_CHECK(options_.rank >= 0 && options_.rank < options_.num_replicas,
             "DistributedSampler: rank {} is not in [0, {}) (num_replicas {})", options_.rank, options_.num_replicas,
             options_.num_replicas);
}

int64_t DistributedSampler::size(int64_t n) const {
  const int64_t r = options_.num_replicas;
  return options_.drop_last ? n / r : (n + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::indices(int64_t n, int64_t epoch) const {
  KILN_CHECK(n >= 0, "DistributedSampler: negative dataset size {}", n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (options_.shuffle && n > 0) {
    Generator gen(options_.seed);
    gen.set_state({options_.seed, static_cast<uint64_t>(epoch) << 40});
    order = randperm(n, kInt64, &gen).to_vector<int64_t>();
  } else {
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t per_rank = size(n), total = per_rank * options_.num_replicas;
  if (total > n) {  // pad by repeating the order from its start (as often as needed)
    KILN_CHECK(n > 0, "DistributedSampler: the dataset is empty");
    for (int64_t i = n; i < total; ++i) order.push_back(order[static_cast<size_t>(i % n)]);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t i = options_.rank; i < total; i += options_.num_replicas) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace kiln::data

// core/generator.h: Generator, the state of random number generation: a seed and an offset.
//
// Note [random element mapping]
// A random op over n elements reserves counters [offset, offset + ceil(n / 2)) and advances the
// offset past them; element i uses the two 32-bit words of counter offset + i / 2 (the first or the
// second pair of Philox's four words). From those two words:
//   uniform float:  (w0 >> 8) * 2^-24                     in [0, 1)
//   uniform double: ((w0 << 21) ^ (w1 >> 11)) * 2^-53      in [0, 1)
//   normal:         Box-Muller on u1 = ((w0 >> 8) + 1) * 2^-24 in (0, 1], u2 = (w1 >> 8) * 2^-24,
//                   computed in double, rounded to the output dtype
//   integers:       low + (w0 << 32 | w1) mod (high - low), in 64-bit integers, so any int64
//                   range is exact; other dtypes take that integer, converted
// randperm(n) is Fisher-Yates on one such draw, keys in [0, 2^63 - 1): position i (from n - 1 down)
// swaps with position key_i mod (i + 1).
// Element i depends on (seed, offset, i) alone, so a tensor may hold only some elements of a draw
// (RandomArgs::draw_index in core/backend.h; ops::dropout_part): a rank's part of a larger mask.
// The CPU and CUDA backends implement this same mapping, so a seed gives the same tensor anywhere.
// The numbers differ from PyTorch's (which uses Mersenne Twister on the CPU).
#pragma once

#include <cstdint>
#include <mutex>

namespace kiln {

class Generator {
 public:
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;  // PyTorch's default seed

  explicit Generator(uint64_t seed = kDefaultSeed) : seed_(seed) {}

  void manual_seed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(mutex_);
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return seed_;
  }
  uint64_t offset() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return offset_;
  }

  struct State {
    uint64_t seed;
    uint64_t offset;
  };
  State get_state() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {seed_, offset_};
  }
  void set_state(State s) {
    std::lock_guard<std::mutex> lock(mutex_);
    seed_ = s.seed;
    offset_ = s.offset;
  }
  // Reserves the counters for `numel` elements; returns the state the draw must use.
  State reserve(int64_t numel) {
    std::lock_guard<std::mutex> lock(mutex_);
    State s{seed_, offset_};
    offset_ += static_cast<uint64_t>(numel + 1) / 2;
    return s;
  }

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();  // the process-wide generator every random op uses by default
void manual_seed(uint64_t seed);  // seeds it, like torch::manual_seed

}  // namespace kiln

// bench_philox: the cost of the CPU's random numbers per element, single-threaded: the words of
// Philox4x32-10 made one scalar block per element (Philox4x32::element_words, which the CPU's draws
// did before) against 8 counters at a time (Philox4x32::words8: 16 elements), and a whole
// bernoulli() draw through the CPU backend (which uses words8). Medians over --reps.
//
//   bench_philox [--elements 16777216] [--reps 5]
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/philox.h"

using namespace kiln;

namespace {

template <typename F>
double median_ns_per_element(F&& run, uint64_t elements, int reps) {
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                    static_cast<double>(elements));
  }
  return kiln_bench::median(times);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = uint64_t{1} << 24;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--elements") && i + 1 < argc) n = std::stoull(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--elements 16777216] [--reps 5]\n", argv[0]);
      return 2;
    }
  }
  n -= n % 16;  // whole groups of words8's 16 elements
  set_num_threads(1);
  uint64_t sink = 0;  // every word feeds it, so that no loop is optimized away
  const double scalar = median_ns_per_element(
      [&] {
        for (uint64_t i = 0; i < n; ++i) {
          uint32_t w0, w1;
          Philox4x32::element_words(7, 3, i, w0, w1);
          sink += w0 ^ w1;
        }
      },
      n, reps);
  const double batched = median_ns_per_element(
      [&] {
        uint32_t w[4][8];
        for (uint64_t c = 0; c < n / 2; c += 8) {
          Philox4x32::words8(7, 3 + c, w);
          for (int k = 0; k < 8; ++k) sink += (w[0][k] ^ w[1][k]) + (w[2][k] ^ w[3][k]);
        }
      },
      n, reps);
  Generator gen(7);
  const double draw = median_ns_per_element(
      [&] { sink += static_cast<uint64_t>(bernoulli({static_cast<int64_t>(n)}, 0.9, kFloat32, &gen).numel()); }, n,
      reps);
  std::printf("{\"bench\": \"philox\", \"impl\": \"kiln\", \"elements\": %llu, \"threads\": 1, "
              "\"ns_per_element_scalar_block\": %.2f, \"ns_per_element_words8\": %.2f, "
              "\"ns_per_element_bernoulli_float32\": %.2f, \"scalar_over_words8\": %.2f, \"sink\": %llu}\n",
              static_cast<unsigned long long>(n), scalar, batched, draw, scalar / batched,
              static_cast<unsigned long long>(sink % 10));
  return 0;
}

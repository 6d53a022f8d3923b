// bench_util.h: what every benchmark program measures with: the median of a set of timings (or of
// repeated calls of a function) and the process's peak resident set size.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace kiln_bench {

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// The median time of `runs` calls of fn, in milliseconds, after `warmup` calls that are not timed.
inline double median_ms(const std::function<void()>& fn, int warmup, int runs) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return median(ms);
}

// Times fn as median_ms(fn, 2, 7) and prints one JSON line: {"bench": bench, "impl": "kiln", "device":
// "cpu", "threads": threads, "part": part, "ms": the median} (the CPU benchmarks measured side by side
// with a PyTorch script printing the same keys).
inline void report_cpu_part(const char* bench, int threads, const std::string& part, const std::function<void()>& fn) {
  const double ms = median_ms(fn, 2, 7);
  std::printf("{\"bench\":\"%s\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,\"part\":\"%s\",\"ms\":%.3f}\n",
              bench, threads, part.c_str(), ms);
  std::fflush(stdout);
}

// The optional thread count of a program called as `prog [threads]` (2 when absent); 0 after printing
// the usage line for anything else, for main to return 2.
inline int threads_arg(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && std::atoi(argv[1]) <= 0)) {
    std::fprintf(stderr, "usage: %s [threads]\n", argv[0]);
    return 0;
  }
  return argc == 2 ? std::atoi(argv[1]) : 2;
}

// Peak resident set size of the whole process so far, in MiB (ru_maxrss is in KiB on Linux).
inline double peak_rss_mib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

}  // namespace kiln_bench

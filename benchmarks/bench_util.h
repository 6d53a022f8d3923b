// bench_util.h: what every benchmark program measures with: the median of a set of timings and the
// process's peak resident set size.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <vector>

namespace kiln_bench {

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// Peak resident set size of the whole process so far, in MiB (ru_maxrss is in KiB on Linux).
inline double peak_rss_mib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

}  // namespace kiln_bench

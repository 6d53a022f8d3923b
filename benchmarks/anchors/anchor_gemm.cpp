// anchor_gemm: the LibTorch anchor for Kiln's "a. gemm" benchmark (BENCHMARKS.md).
// Siblings: anchor_op_overhead.cpp, CMakeLists.txt and README.md in benchmarks/anchors/; the Kiln
// counterpart is the bench_gemm program; scripts/bench_compare.py runs the two side by side.
//
// C = A B for square n x n fp32 matrices, uniform [0, 1), n in {256, 512, 1024, 2048}
// (--sizes 256,512 changes the list); --dtype bf16 multiplies bfloat16 matrices instead (LibTorch
// hands those to oneDNN, which uses AMX where the CPU has it). 2 warm-up calls, then single calls
// are timed until there are at least 5 of them and at least 1 s in all; GFLOP/s = 2 n^3 / median
// seconds. Prints one JSON line per n:
//   {"bench":"gemm","impl":"libtorch","device":"cpu","dtype":"float32","threads":2,"n":256,
//    "gflops_256":...,"median_s":...,"calls":...}
//
// LibTorch at its best: 2 intra-op threads (its default here would be 1), and the comparison
// script sets OMP_WAIT_POLICY=passive so LibTorch's OpenMP threads do not spin against
// OpenBLAS's. The product is written into a preallocated C with mm_out, so no call allocates.

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 2;
constexpr int kWarmupCalls = 2;
constexpr int kMinCalls = 5;
constexpr double kMinSeconds = 1.0;

// Parses a comma-separated list of positive sizes such as "256,512". Returns false if malformed.
bool ParseSizes(const std::string& text, std::vector<int64_t>* sizes) {
  sizes->clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value <= 0) return false;
    sizes->push_back(value);
    start = comma + 1;
  }
  return !sizes->empty();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  if (values.size() % 2 == 1) return values[mid];
  return 0.5 * (values[mid - 1] + values[mid]);
}

// dtype: "float32" or "bfloat16", the names bench_gemm prints.
void BenchOneSize(int64_t n, const std::string& dtype) {
  using Clock = std::chrono::steady_clock;
  const torch::ScalarType type = dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  torch::Tensor a = torch::rand({n, n}).to(type);
  torch::Tensor b = torch::rand({n, n}).to(type);
  torch::Tensor c = torch::empty({n, n}, torch::TensorOptions().dtype(type));

  for (int i = 0; i < kWarmupCalls; ++i) torch::mm_out(c, a, b);

  std::vector<double> seconds;
  double total = 0.0;
  while (static_cast<int>(seconds.size()) < kMinCalls || total < kMinSeconds) {
    Clock::time_point start = Clock::now();
    torch::mm_out(c, a, b);
    std::chrono::duration<double> elapsed = Clock::now() - start;
    seconds.push_back(elapsed.count());
    total += elapsed.count();
  }

  double median_s = Median(seconds);
  double gflops = 2.0 * static_cast<double>(n) * n * n / median_s * 1e-9;
  std::printf(
      "{\"bench\":\"gemm\",\"impl\":\"libtorch\",\"device\":\"cpu\",\"dtype\":\"%s\","
      "\"threads\":%d,\"n\":%lld,\"gflops_%lld\":%.2f,\"median_s\":%.6e,\"calls\":%zu}\n",
      dtype.c_str(), torch::get_num_threads(), static_cast<long long>(n), static_cast<long long>(n), gflops,
      median_s, seconds.size());
  std::fflush(stdout);
}

void PrintUsage(const char* program) {
  std::fprintf(stderr, "usage: %s [--sizes 256,512,1024,2048] [--dtype f32|bf16]\n", program);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {256, 512, 1024, 2048};
  std::string dtype = "float32";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    if (arg == "--dtype" && i + 1 < argc &&
        (std::strcmp(argv[i + 1], "f32") == 0 || std::strcmp(argv[i + 1], "bf16") == 0)) {
      dtype = std::strcmp(argv[++i], "bf16") == 0 ? "bfloat16" : "float32";
      continue;
    }
    if (arg == "--sizes" && i + 1 < argc) {
      value = argv[++i];
    } else if (arg.rfind("--sizes=", 0) == 0) {
      value = arg.substr(std::strlen("--sizes="));
    } else {
      PrintUsage(argv[0]);
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
    if (!ParseSizes(value, &sizes)) {
      std::fprintf(stderr, "%s: bad --sizes list '%s'\n", argv[0], value.c_str());
      return 2;
    }
  }

  torch::set_num_threads(kThreads);
  torch::manual_seed(0);
  for (int64_t n : sizes) BenchOneSize(n, dtype);
  return 0;
}

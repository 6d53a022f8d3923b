// bench_gemm: BENCHMARKS.md workload "a. gemm" for Kiln: C = A B, square float32 n x n, inputs
// uniform [0, 1); 2 warm-up calls, then single calls timed until at least 5 calls and 1 s;
// GFLOP/s = 2 n^3 / median. One JSON line per n. Anchor: benchmarks/anchors/anchor_gemm.cpp.
// --dtype bf16 multiplies bfloat16 A and B instead (cpu/bf16gemm.cpp's AMX kernel where the CPU has
// AMX, its AVX512-BF16 kernel where it has that at the FMA's rate (AMD Zen 4 and 5), else through float32;
// KILN_CPU_BF16_GEMM=own|float as in Note [which bfloat16 GEMM] in cpu/matmul.cpp).
//   bench_gemm [--sizes 256,512,1024,2048] [--threads N] [--dtype f32|bf16]
//   (N: the pool's threads, default every core)
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

using namespace kiln;

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {256, 512, 1024, 2048};
  DType dtype = kFloat32;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoll(item));
    } else if (arg == "--threads" && i + 1 < argc) {
      set_num_threads(std::stoi(argv[++i]));
    } else if (arg == "--dtype" && i + 1 < argc && (std::string(argv[i + 1]) == "f32" || std::string(argv[i + 1]) == "bf16")) {
      dtype = std::string(argv[++i]) == "bf16" ? kBFloat16 : kFloat32;
    } else {
      std::fprintf(stderr, "usage: %s [--sizes 256,512,1024,2048] [--threads N] [--dtype f32|bf16]\n", argv[0]);
      return 2;
    }
  }
  using Clock = std::chrono::steady_clock;
  for (int64_t n : sizes) {
    Tensor a = rand({n, n}).to(dtype), b = rand({n, n}).to(dtype);
    for (int w = 0; w < 2; ++w) matmul(a, b);
    std::vector<double> times;
    auto start = Clock::now();
    while (times.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < 1.0) {
      auto t0 = Clock::now();
      Tensor c = matmul(a, b);
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    double median = times[times.size() / 2];
    std::printf("{\"bench\":\"gemm\",\"impl\":\"kiln\",\"device\":\"cpu\",\"dtype\":\"%s\",\"threads\":%d,\"n\":%lld,"
                "\"gflops_%lld\":%.2f,\"median_s\":%.6g,\"calls\":%zu}\n",
                std::string(dtype_name(dtype)).c_str(), get_num_threads(), static_cast<long long>(n), static_cast<long long>(n),
                2.0 * n * n * n / median / 1e9, median, times.size());
    std::fflush(stdout);
  }
  return 0;
}

// tests/main.cpp: the Catch2 session shared by every test executable (compiled once, in
// kiln_test_main). Each executable's own main (main_cpu.cpp or main_gpu.cpp) calls run_tests; a GPU
// test binary exits 77, which CTest reports as skipped, when no CUDA device is present.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "cuda/cuda.h"

int run_tests(int argc, char** argv, bool needs_gpu) {
  if (needs_gpu && !kiln::cuda::is_available()) {
    std::puts("no CUDA device: GPU tests skipped");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

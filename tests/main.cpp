// tests/main.cpp: the Catch2 session shared by every test executable (compiled once, in
// kiln_test_main). Each executable's own main (main_cpu.cpp or main_gpu.cpp) calls run_tests; a GPU
// test binary exits 77, which CTest reports as skipped, when no CUDA device is present.
//
// A name filter that matches no test case fails (exit 2): CTest runs each TEST_CASE by its name, and a
// name CMake's test discovery cut in two (a ';' in it is a list separator, an unbalanced '[' joins the
// names that follow) must not pass as "No tests ran". Keep ';' and unbalanced brackets out of names.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "cuda/cuda.h"

int run_tests(int argc, char** argv, bool needs_gpu) {
  if (needs_gpu && !kiln::cuda::is_available()) {
    std::puts("no CUDA device: GPU tests skipped");
    return 77;
  }
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  auto& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoTests);
  return session.run();
}

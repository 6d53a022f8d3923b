// tests/main_mpi.cpp: main of the distributed tests, which CTest runs under mpiexec at
// world sizes 1 to 4. Every rank runs every test case in the same order (collectives inside them
// must match); a rank whose check fails exits non-zero, and so does mpiexec. The CUDA-tensor cases
// (test_comm_cuda.cpp) are hidden from the default run; asked for with "[gpu]", they exit 77
// (skipped) on every rank where there is no GPU.
#include <kiln/kiln.h>

#include <string_view>

int run_tests(int argc, char** argv, bool needs_gpu);

int main(int argc, char** argv) {
  // Several ranks share the two cores of a CI machine: one compute thread each.
  if (kiln::distributed::world_info().size > 1) kiln::set_num_threads(1);
  bool gpu = false;
  for (int i = 1; i < argc; ++i) gpu = gpu || std::string_view(argv[i]).find("[gpu]") != std::string_view::npos;
  return run_tests(argc, argv, gpu);
}

// tests/main_mpi.cpp: main of the distributed tests, which CTest runs under mpiexec at
// world sizes 1 to 4. Every rank runs every test case in the same order (collectives inside them
// must match); a rank whose check fails exits non-zero, and so does mpiexec.
#include <kiln/kiln.h>

int run_tests(int argc, char** argv, bool needs_gpu);

int main(int argc, char** argv) {
  // Several ranks share the two cores of a CI machine: one compute thread each.
  if (kiln::distributed::world_info().size > 1) kiln::set_num_threads(1);
  return run_tests(argc, argv, false);
}

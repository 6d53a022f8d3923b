// tests/distributed/faults/comm_faults.cpp: a small data-parallel loop that goes wrong on purpose,
// run by fault_check.cmake under kiln-run. Every rank must stop, non-zero, with a message.
//   comm_faults kill   rank 1 kills itself (SIGKILL) in step 5
//   comm_faults skip   rank 1 skips the all-reduce of step 5 and waits: a rank that hangs
//   comm_faults skip-error  the same with abort_on_timeout = false: the others get an Error
//   comm_faults skip-split  in step 5 the others split the communicator and rank 1 hangs
//   comm_faults split-unchecked  check_collectives off; in step 5 rank 0 splits, the others barrier
//   comm_faults ok     nothing goes wrong (the control run)
// An Error from distributed::init is printed, exit code 2.
#include <csignal>
#include <cstring>
#include <thread>

#include <kiln/kiln.h>

using namespace kiln;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  std::shared_ptr<distributed::Communicator> comm;
  try {
    comm = distributed::init("mpi", {.check_collectives = mode != "split-unchecked",
                                     .abort_on_timeout = mode != "skip-error"});
  } catch (const Error& e) {  // the launcher's environment and MPI disagree, say
    std::fprintf(stderr, "comm_faults: error: %s\n", e.what());
    return 2;
  }
  const int r = comm->rank();
  for (int step = 0; step < 10; ++step) {
    if (r == 1 && step == 5 && mode == "kill") std::raise(SIGKILL);
    if (r == 1 && step == 5 && mode.starts_with("skip")) std::this_thread::sleep_for(std::chrono::minutes(10));
    Tensor g = full({1000}, static_cast<double>(r), kFloat32);
    try {
      if (step == 5 && mode == "skip-split") (void)comm->split(0, r);
      if (step == 5 && mode == "split-unchecked") r == 0 ? (void)comm->split(0, r) : comm->barrier();
      comm->all_reduce(g, distributed::ReduceOp::Avg);
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d caught: %s\n", r, e.what());
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (r == 0) std::printf("all steps done\n");
  return 0;
}

// distributed/comm/backends.h: the backends' entry points (internal to distributed/comm).
// mpi.cpp or mpi_stub.cpp, and nccl.cpp or nccl_stub.cpp, define them, depending on the build.
#pragma once

#include <memory>

#include "distributed/comm/communicator.h"

namespace kiln::distributed {

bool mpi_available();
std::shared_ptr<Communicator> mpi_world(const CommOptions& options);
[[noreturn]] void mpi_abort(int exit_code);  // distributed::abort_job
bool nccl_available();
std::shared_ptr<Communicator> nccl_world(const CommOptions& options);

}  // namespace kiln::distributed

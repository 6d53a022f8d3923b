// distributed/comm/mpi_stub.cpp: the MPI backend in a build without MPI: using it is an Error that
// says what to install.
#include <cstdio>
#include <cstdlib>

#include "distributed/comm/backends.h"

namespace kiln::distributed {

bool mpi_available() { return false; }

void mpi_abort(int exit_code) {
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

std::shared_ptr<Communicator> mpi_world(const CommOptions&) {
  KILN_FAIL("distributed::init(\"mpi\"): this Kiln was built without MPI; install Open MPI "
            "(apt-get install libopenmpi-dev openmpi-bin) and build again");
}

}  // namespace kiln::distributed

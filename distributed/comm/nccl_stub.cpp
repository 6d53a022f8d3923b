// distributed/comm/nccl_stub.cpp: the NCCL backend where it is not built: using it is an Error that
// says what to use instead.
#include "distributed/comm/backends.h"

namespace kiln::distributed {

bool nccl_available() { return false; }

std::shared_ptr<Communicator> nccl_world(const CommOptions&) {
  KILN_FAIL("distributed::init(\"nccl\"): this Kiln has no NCCL backend (it needs a build with CUDA and NCCL); "
            "use init(\"mpi\"), which also carries CUDA tensors through host memory");
}

}  // namespace kiln::distributed

// cuda/stub.cpp: the CUDA backend of a build without CUDA: nothing is available, and asking for a
// CUDA tensor is a clear Error rather than a crash.
#include "core/error.h"
#include "cuda/cuda.h"

namespace kiln::cuda {

[[noreturn]] static void unavailable() {
  KILN_FAIL("Kiln was built without CUDA; reconfigure with -DKILN_WITH_CUDA=ON (needs the CUDA "
            "toolkit) to use cuda devices");
}

bool is_available() { return false; }
int device_count() { return 0; }
void synchronize(int) { unavailable(); }
void set_matmul_allow_tf32(bool) {}  // no CUDA matmuls to switch
bool matmul_allow_tf32() { return false; }
Backend& backend() { unavailable(); }

}  // namespace kiln::cuda

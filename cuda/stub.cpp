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
MemoryStats host_memory_stats() { return {}; }  // nothing can be pinned, so nothing is
void host_empty_cache() {}
DeviceProperties get_device_properties(int) { unavailable(); }

struct CudaStream::Impl {};
CudaStream::CudaStream(int) { unavailable(); }
CudaStream CudaStream::default_stream(int) { unavailable(); }
int CudaStream::device_index() const { unavailable(); }
void* CudaStream::handle() const { unavailable(); }
bool CudaStream::query() const { unavailable(); }
void CudaStream::synchronize() const { unavailable(); }
void CudaStream::wait_event(const CudaEvent&) const { unavailable(); }
void CudaStream::wait_stream(const CudaStream&) const { unavailable(); }
CudaStream current_stream(int) { unavailable(); }
StreamGuard::StreamGuard(const CudaStream& stream) : previous_(stream) { unavailable(); }
StreamGuard::~StreamGuard() = default;

struct CudaEvent::Impl {};
CudaEvent::CudaEvent(bool) { unavailable(); }
void CudaEvent::record() { unavailable(); }
void CudaEvent::record(const CudaStream&) { unavailable(); }
bool CudaEvent::query() const { unavailable(); }
void CudaEvent::synchronize() const { unavailable(); }
float CudaEvent::elapsed_time(const CudaEvent&) const { unavailable(); }

}  // namespace kiln::cuda

// cuda/allocator.cpp: the CUDA allocator of each device: cudaMalloc / cudaFree with the statistics
// every allocator keeps (MemoryCounter, core/allocator.h). No cache yet: reserved
// equals allocated, and every allocate() is a cudaMalloc. The caching allocator (size classes,
// block splitting, stream-aware reuse) replaces this file later; see Note [CUDA streams] in
// cuda/context.h for why freeing a buffer with queued kernels is safe here.
#include <vector>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cuda.h"

namespace kiln::cuda {
namespace {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device_index) : device_index_(device_index) {}

  void* allocate(size_t nbytes) override {
    DeviceGuard guard(device_index_, "allocate");
    void* p = nullptr;
    // Never hand out null, even for 0 bytes: Storage frees only non-null buffers and the counts
    // must pair up.
    cudaError_t status = cudaMalloc(&p, nbytes == 0 ? 1 : nbytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      (void)cudaGetLastError();
      constexpr double kMiB = 1 << 20;
      KILN_FAIL("CUDA out of memory on cuda:{}: could not allocate {} bytes ({:.1f} MiB); Kiln "
                "tensors hold {:.1f} MiB, the device has {:.1f} MiB free of {:.1f} MiB. Use a "
                "smaller batch, free tensors, or try activation checkpointing",
                device_index_, nbytes, static_cast<double>(nbytes) / kMiB,
                static_cast<double>(counter_.stats().allocated_bytes) / kMiB,
                static_cast<double>(free_bytes) / kMiB, static_cast<double>(total_bytes) / kMiB);
    }
    KILN_CUDA_CHECK(status);
    counter_.on_allocate(nbytes);
    return p;
  }

  // Never throws (Storage calls it from a destructor): a failing cudaFree (the driver already shut
  // down at process exit, say) is ignored.
  void deallocate(void* ptr, size_t nbytes) override {
    int previous = -1;
    bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_index_ &&
                    cudaSetDevice(device_index_) == cudaSuccess;
    (void)cudaFree(ptr);
    if (switched) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
    counter_.on_free(nbytes);
  }

  MemoryStats stats() const override { return counter_.stats(); }  // reserved = allocated
  void reset_peak() override { counter_.reset_peak(); }

 private:
  int device_index_;
  MemoryCounter counter_;
};

}  // namespace

Allocator& device_allocator(int device_index) {
  // Made once for every device and never destroyed: a tensor that outlives static destruction
  // still finds its allocator.
  static std::vector<CudaAllocator*>* allocators = [] {
    auto* v = new std::vector<CudaAllocator*>();
    for (int i = 0, n = device_count(); i < n; ++i) v->push_back(new CudaAllocator(i));
    return v;
  }();
  check_device(device_index, "CUDA allocator");
  return *(*allocators)[static_cast<size_t>(device_index)];
}

}  // namespace kiln::cuda

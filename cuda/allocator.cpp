// cuda/allocator.cpp: the CUDA allocator of each device: cudaMalloc / cudaFree with the CPU
// allocator's statistics (core/allocator.cpp), kept in relaxed atomics. No cache yet: reserved
// equals allocated, and every allocate() is a cudaMalloc. The caching allocator (size classes,
// block splitting, stream-aware reuse) replaces this file later; see Note [CUDA streams] in
// cuda/context.h for why freeing a buffer with queued kernels is safe here.
#include <atomic>
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
                static_cast<double>(allocated_.load(std::memory_order_relaxed)) / kMiB,
                static_cast<double>(free_bytes) / kMiB, static_cast<double>(total_bytes) / kMiB);
    }
    KILN_CUDA_CHECK(status);
    int64_t now = allocated_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
                  static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
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
    allocated_.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    frees_.fetch_add(1, std::memory_order_relaxed);
  }

  MemoryStats stats() const override {
    MemoryStats s;
    s.allocated_bytes = allocated_.load(std::memory_order_relaxed);
    s.reserved_bytes = s.allocated_bytes;  // no cache: what is allocated is what is held
    s.peak_allocated_bytes = peak_.load(std::memory_order_relaxed);
    s.allocation_count = allocations_.load(std::memory_order_relaxed);
    s.free_count = frees_.load(std::memory_order_relaxed);
    return s;
  }
  void reset_peak() override { peak_.store(allocated_.load(std::memory_order_relaxed)); }

 private:
  int device_index_;
  std::atomic<int64_t> allocated_{0}, peak_{0}, allocations_{0}, frees_{0};
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

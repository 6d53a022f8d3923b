// core/allocator.cpp: the CPU allocator: 64-byte aligned blocks from the C library, with statistics
// kept in relaxed atomics (exact totals, no lock on the hot path).
#include "core/allocator.h"

#include <atomic>
#include <cstdlib>

#include "core/error.h"

namespace kiln {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    // aligned_alloc wants a multiple of the alignment; never hand out null, even for 0 bytes.
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    KILN_CHECK(p != nullptr, "out of CPU memory: could not allocate {} bytes ({:.1f} MiB)", nbytes,
               static_cast<double>(nbytes) / (1 << 20));
    int64_t now = allocated_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
                  static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
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
  std::atomic<int64_t> allocated_{0}, peak_{0}, allocations_{0}, frees_{0};
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

}  // namespace kiln

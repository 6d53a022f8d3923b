// core/allocator.h: the Allocator interface, memory statistics, and the CPU allocator.
//
// Each device has one allocator; Storage returns its buffer to the allocator that made it.
// Statistics are what ZeRO and checkpointing are judged by: memory::stats(device) (ops/memory.h)
// reads them. The CUDA caching allocator lives in cuda/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kiln {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // bytes in live tensors' buffers now
  int64_t reserved_bytes = 0;        // allocated plus the bytes of cached free blocks
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since the last reset_peak
  int64_t allocation_count = 0;      // allocate() calls since start
  int64_t free_count = 0;            // deallocate() calls since start
};

// The statistics every allocator keeps, in relaxed atomics: exact totals, no lock on the hot path.
class MemoryCounter {
 public:
  void on_allocate(size_t nbytes) {
    int64_t now = allocated_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
                  static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  void on_free(size_t nbytes) {
    allocated_.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    frees_.fetch_add(1, std::memory_order_relaxed);
  }
  // reserved: what the allocator holds from the system (equal to allocated without a cache).
  MemoryStats stats(int64_t reserved) const {
    MemoryStats s;
    s.allocated_bytes = allocated_.load(std::memory_order_relaxed);
    s.reserved_bytes = reserved;
    s.peak_allocated_bytes = peak_.load(std::memory_order_relaxed);
    s.allocation_count = allocations_.load(std::memory_order_relaxed);
    s.free_count = frees_.load(std::memory_order_relaxed);
    return s;
  }
  MemoryStats stats() const { return stats(allocated_.load(std::memory_order_relaxed)); }
  void reset_peak() { peak_.store(allocated_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> allocated_{0}, peak_{0}, allocations_{0}, frees_{0};
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;  // throws kiln::Error when out of memory
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached free blocks to the system (allocators without a cache have nothing to do).
  virtual void empty_cache() {}
  // Page-locked ("pinned") host memory, which a GPU copies to and from directly and asynchronously
  // (Tensor::is_pinned). Only the CUDA backend's host allocator says yes.
  virtual bool is_pinned() const { return false; }
};

inline constexpr size_t kCpuAlignment = 64;  // one cache line; every AVX-512 load is aligned

// The process-wide CPU allocator (64-byte aligned, thread-safe statistics, large and small freed
// blocks cached for reuse: Notes [CPU block cache] and [small CPU blocks] in core/allocator.cpp).
Allocator& cpu_allocator();

}  // namespace kiln

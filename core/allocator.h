// core/allocator.h: the Allocator interface, memory statistics, and the CPU allocator.
//
// Each device has one allocator; Storage returns its buffer to the allocator that made it.
// Statistics are what ZeRO and checkpointing are judged by: memory::stats(device) (ops/memory.h)
// reads them. The CUDA caching allocator lives in cuda/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // bytes in live tensors' buffers now
  int64_t reserved_bytes = 0;        // bytes held from the system (>= allocated for caching allocators)
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since the last reset_peak
  int64_t allocation_count = 0;      // allocate() calls since start
  int64_t free_count = 0;            // deallocate() calls since start
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;  // throws kiln::Error when out of memory
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
};

inline constexpr size_t kCpuAlignment = 64;  // one cache line; every AVX-512 load is aligned

// The process-wide CPU allocator (64-byte aligned, thread-safe statistics).
Allocator& cpu_allocator();

}  // namespace kiln

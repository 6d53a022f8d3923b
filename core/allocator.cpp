// core/allocator.cpp: the CPU allocator: 64-byte aligned blocks from the C library, with statistics
// (MemoryCounter, core/allocator.h).
#include "core/allocator.h"

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
    counter_.on_allocate(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
    counter_.on_free(nbytes);
  }
  MemoryStats stats() const override { return counter_.stats(); }  // no cache: reserved = allocated
  void reset_peak() override { counter_.reset_peak(); }

 private:
  MemoryCounter counter_;
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

}  // namespace kiln

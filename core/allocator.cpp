// core/allocator.cpp: the CPU allocator: 64-byte aligned blocks from the C library, with statistics
// (MemoryCounter, core/allocator.h), and a cache of large blocks.
//
// Note [CPU block cache]
// A training step allocates the same large buffers (activations, gradients, im2col columns) every
// step. The C library returns blocks that large to the system on free (munmap), so each step would
// fault every page in again and have the kernel zero it: about a tenth of the CNN benchmark's time.
// So a freed block of at least kCacheMin bytes is kept, by size class (the size rounded up to
// kClassStep), and handed to the next request of that class. The cache never makes the process hold
// more than its high-water mark: before a block of a new class is taken from the system, cached
// blocks are released (largest first) until reserved + the new block fits under the highest
// reserved so far. memory::empty_cache() releases everything. Built with AddressSanitizer, the
// cache is off, so that a use after free is still caught.
#include "core/allocator.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace kiln {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheEnabled = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kCacheEnabled = false;
#else
constexpr bool kCacheEnabled = true;
#endif
#else
constexpr bool kCacheEnabled = true;
#endif

constexpr size_t kCacheMin = size_t{256} << 10;  // smaller blocks: the C library reuses them well
constexpr size_t kClassStep = size_t{64} << 10;

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t size = block_size(nbytes);
    void* p = nullptr;
    if (cached(size)) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(size);
      if (it != cache_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) cache_.erase(it);  // cache_ holds no empty lists
        cached_bytes_ -= size;
      } else {
        // A new block: first give back cached ones so the footprint stays under its high-water mark.
        while (cached_bytes_ > 0 && held_bytes_ + size > high_water_) release_largest();
        held_bytes_ += size;
        if (held_bytes_ > high_water_) high_water_ = held_bytes_;
      }
    }
    if (p == nullptr) p = system_alloc(size, nbytes);
    counter_.on_allocate(nbytes);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    counter_.on_free(nbytes);
    const size_t size = block_size(nbytes);
    if (cached(size)) {
      std::lock_guard<std::mutex> lock(mutex_);
      cache_[size].push_back(ptr);
      cached_bytes_ += size;
      return;
    }
    std::free(ptr);
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    MemoryStats s = counter_.stats();
    s.reserved_bytes += static_cast<int64_t>(cached_bytes_);
    return s;
  }
  void reset_peak() override { counter_.reset_peak(); }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    while (cached_bytes_ > 0) release_largest();
  }

 private:
  static bool cached(size_t size) { return kCacheEnabled && size >= kCacheMin; }
  // aligned_alloc wants a multiple of the alignment; cached blocks are whole size classes.
  static size_t block_size(size_t nbytes) {
    const size_t step = nbytes >= kCacheMin ? kClassStep : kCpuAlignment;
    const size_t rounded = (nbytes + step - 1) / step * step;
    return rounded == 0 ? kCpuAlignment : rounded;  // never hand out null, even for 0 bytes
  }

  void* system_alloc(size_t size, size_t nbytes) {
    void* p = std::aligned_alloc(kCpuAlignment, size);
    if (p == nullptr && cached(size)) {  // the cache may be what is in the way
      empty_cache();
      p = std::aligned_alloc(kCpuAlignment, size);
    }
    if (p == nullptr) {
      if (cached(size)) {
        std::lock_guard<std::mutex> lock(mutex_);
        held_bytes_ -= size;
      }
      KILN_FAIL("out of CPU memory: could not allocate {} bytes ({:.1f} MiB)", nbytes,
                static_cast<double>(nbytes) / (1 << 20));
    }
    return p;
  }

  // Frees one block of the largest cached class (mutex_ held, cache_ not empty).
  void release_largest() {
    auto it = std::prev(cache_.end());
    std::free(it->second.back());
    it->second.pop_back();
    cached_bytes_ -= it->first;
    held_bytes_ -= it->first;
    if (it->second.empty()) cache_.erase(it);
  }

  MemoryCounter counter_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> cache_;  // size class -> free blocks (guarded by mutex_)
  size_t cached_bytes_ = 0;  // in cache_
  size_t held_bytes_ = 0;    // cacheable blocks from the system: live ones and cached ones
  size_t high_water_ = 0;    // the most held_bytes_ has been
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

}  // namespace kiln

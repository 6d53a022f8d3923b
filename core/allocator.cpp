// core/allocator.cpp: the CPU allocator: 64-byte aligned blocks from the C library, with statistics
// (MemoryCounter, core/allocator.h), a cache of large blocks and lists of small ones.
//
// Note [CPU block cache]
// A training step allocates the same large buffers (activations, gradients, im2col columns) every
// step. The C library returns blocks that large to the system on free (munmap), so each step would
// fault every page in again and have the kernel zero it: about a tenth of the CNN benchmark's time.
// So blocks of at least kCacheMin bytes come from segments that the allocator keeps:
// - a segment is one block from the C library, cut into blocks of whole kClassStep units;
// - a request takes the smallest free block that fits (best fit) and leaves the rest of it free;
// - a freed block merges with its free neighbours in the segment, so memory freed as two halves
//   serves one request of the whole next time, and sizes that change from step to step still reuse
//   pages already mapped;
// - when no free block fits, the wholly free segments are given back to the system and one new
//   segment is taken, as large as the request or as what was given back, whichever is larger. The
//   footprint grows only by what the request lacks, and the free pieces gather into fewer, larger
//   segments. (An earlier cache kept whole blocks by exact size class: the CNN's step, whose classes
//   peak at different moments, still faulted about 60 MB in every step.)
// memory::empty_cache() gives back every wholly free segment, and the small blocks (Note [small CPU
// blocks]). Built with AddressSanitizer, both caches are off, so that a use after free is still caught.
#include "core/allocator.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <set>
#include <unordered_map>
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

// glibc maps blocks from 128 KiB up afresh on every call (its default M_MMAP_THRESHOLD); smaller ones it
// reuses well.
constexpr size_t kCacheMin = size_t{128} << 10;
constexpr size_t kClassStep = size_t{64} << 10;
constexpr size_t kSmallMax = 1024, kSmallKeep = 256;  // Note [small CPU blocks]

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t size = block_size(nbytes);
    void* p = nullptr;
    if (cached(size)) {
      std::lock_guard<std::mutex> lock(mutex_);
      p = take(size);
    } else if (small(size)) {
      p = take_small(size);
      if (p == nullptr) p = system_alloc(size, nbytes);
    } else {
      p = system_alloc(size, nbytes);
    }
    counter_.on_allocate(nbytes);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    counter_.on_free(nbytes);
    const size_t size = block_size(nbytes);
    if (cached(size)) {
      std::lock_guard<std::mutex> lock(mutex_);
      give(ptr);
      return;
    }
    if (small(size) && give_small(ptr, size)) return;
    std::free(ptr);
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    MemoryStats s = counter_.stats();
    s.reserved_bytes += static_cast<int64_t>(free_bytes_);
    return s;
  }
  void reset_peak() override { counter_.reset_peak(); }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_free_segments();
    release_small();
  }

 private:
  // A piece of a segment; the blocks of a segment form a list in address order.
  struct Block {
    char* ptr;
    size_t size;
    bool free;
    Block* prev;  // the neighbours in the segment (nullptr at its ends)
    Block* next;
    bool whole_segment() const { return prev == nullptr && next == nullptr; }
  };
  struct BySize {  // best fit: the smallest, then the lowest address
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };

  static bool cached(size_t size) { return kCacheEnabled && size >= kCacheMin; }
  static bool small(size_t size) { return kCacheEnabled && size <= kSmallMax; }

  // Note [small CPU blocks]: a tensor of a few elements (a scalar loss, a bias, an op on [1] or [64]
  // elements) gets a 64-byte aligned block, and glibc's aligned_alloc serves those through its
  // memalign path (over-allocate, split, free the rest), which with the matching free took about a
  // sixth of op_overhead's profile. Freed blocks of up to kSmallMax bytes are kept in a list per size
  // (kSmallKeep at most each) and handed out again.
  void* take_small(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& list = small_[size / kCpuAlignment - 1];
    if (list.empty()) return nullptr;
    void* p = list.back();
    list.pop_back();
    free_bytes_ -= size;
    return p;
  }
  bool give_small(void* ptr, size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& list = small_[size / kCpuAlignment - 1];
    if (list.size() >= kSmallKeep) return false;
    list.push_back(ptr);
    free_bytes_ += size;
    return true;
  }
  void release_small() {  // mutex_ held
    for (size_t i = 0; i < small_.size(); ++i) {
      for (void* p : small_[i]) std::free(p);
      free_bytes_ -= small_[i].size() * (i + 1) * kCpuAlignment;
      small_[i].clear();
    }
  }
  // aligned_alloc wants a multiple of the alignment; cached blocks are whole kClassStep units.
  static size_t block_size(size_t nbytes) {
    const size_t step = nbytes >= kCacheMin ? kClassStep : kCpuAlignment;
    const size_t rounded = (nbytes + step - 1) / step * step;
    return rounded == 0 ? kCpuAlignment : rounded;  // never hand out null, even for 0 bytes
  }

  [[noreturn]] static void out_of_memory(size_t nbytes) {
    throw OutOfMemoryError(fmt::format("out of CPU memory: could not allocate {} bytes ({:.1f} MiB)", nbytes,
                                       static_cast<double>(nbytes) / (1 << 20)));
  }

  void* system_alloc(size_t size, size_t nbytes) {
    void* p = std::aligned_alloc(kCpuAlignment, size);
    if (p == nullptr) {  // the cache may be what is in the way
      empty_cache();
      p = std::aligned_alloc(kCpuAlignment, size);
    }
    if (p == nullptr) out_of_memory(nbytes);
    return p;
  }

  // A block of `size` bytes from the segments (mutex_ held).
  void* take(size_t size) {
    Block probe{nullptr, size, true, nullptr, nullptr};
    auto it = free_.lower_bound(&probe);
    Block* b = nullptr;
    if (it != free_.end()) {
      b = *it;
      free_.erase(it);
      free_bytes_ -= b->size;
    } else {
      // Nothing fits: give back the wholly free segments and take one segment in their place.
      const size_t released = release_free_segments();
      const size_t segment = std::max(size, released);
      void* p = std::aligned_alloc(kCpuAlignment, segment);
      if (p == nullptr) {  // the system is short: try once more for the request alone
        p = segment > size ? std::aligned_alloc(kCpuAlignment, size) : nullptr;
        if (p == nullptr) out_of_memory(size);
        b = new Block{static_cast<char*>(p), size, true, nullptr, nullptr};
      } else {
        b = new Block{static_cast<char*>(p), segment, true, nullptr, nullptr};
      }
    }
    if (b->size > size) {  // split: the rest stays free
      Block* rest = new Block{b->ptr + size, b->size - size, true, b, b->next};
      if (b->next != nullptr) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      free_.insert(rest);
      free_bytes_ += rest->size;
    }
    b->free = false;
    live_.emplace(b->ptr, b);
    return b->ptr;
  }

  // Returns a block taken by take() and merges it with its free neighbours (mutex_ held).
  void give(void* ptr) {
    auto it = live_.find(ptr);
    KILN_CHECK(it != live_.end(), "CPU allocator: freeing {} which it did not hand out", ptr);
    Block* b = it->second;
    live_.erase(it);
    b->free = true;
    if (b->prev != nullptr && b->prev->free) b = merge(b->prev, b);
    if (b->next != nullptr && b->next->free) b = merge(b, b->next);
    free_.insert(b);
    free_bytes_ += b->size;
  }

  // Joins two adjacent blocks into the first, taking either out of free_ if it is there.
  Block* merge(Block* a, Block* b) {
    for (Block* x : {a, b}) {
      if (free_.erase(x) != 0) free_bytes_ -= x->size;
    }
    a->size += b->size;
    a->next = b->next;
    if (b->next != nullptr) b->next->prev = a;
    delete b;
    return a;
  }

  // Frees every segment with no block in use; returns their bytes (mutex_ held).
  size_t release_free_segments() {
    size_t released = 0;
    for (auto it = free_.begin(); it != free_.end();) {
      Block* b = *it;
      if (!b->whole_segment()) {
        ++it;
        continue;
      }
      it = free_.erase(it);
      free_bytes_ -= b->size;
      released += b->size;
      std::free(b->ptr);
      delete b;
    }
    return released;
  }

  MemoryCounter counter_;
  mutable std::mutex mutex_;
  // Guarded by mutex_:
  std::set<Block*, BySize> free_;              // the free blocks of all segments
  std::unordered_map<void*, Block*> live_;     // the blocks in use, by address
  size_t free_bytes_ = 0;                      // in free_ and small_
  std::array<std::vector<void*>, kSmallMax / kCpuAlignment> small_;  // free small blocks, by size
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: a tensor in a static object may be freed after this function's statics are.
  static CpuAllocator* allocator = new CpuAllocator();
  return *allocator;
}

}  // namespace kiln

// cuda/host_allocator.cpp: pinned (page-locked) host memory, the allocator behind
// Tensor::pin_memory() and TensorOptions::pinned_memory(true).
//
// Note [pinned host memory]
// A GPU's copy engines read and write page-locked host memory directly. A copy from ordinary
// (pageable) memory goes through a staging buffer of the driver's, and cudaMemcpyAsync returns only
// once the driver has taken the data, so it cannot overlap the host's work. From pinned memory the
// copy is queued on a stream and the call returns at once (Note [non_blocking copies] in copy.cpp).
// cudaHostAlloc and cudaFreeHost are slow: they map and unmap the pages for every device, and
// cudaFreeHost waits for the device. So, like the device allocator (allocator.cpp), this one caches:
// - Sizes round up to a power of two, at least 512 bytes; a request takes a cached free block of
//   its size class, else a new cudaHostAlloc (portable: pinned for every device). Nothing goes back
//   to CUDA until host_empty_cache().
// - A copy queued on a stream may still read or write a block after its tensor is freed (a host
//   tensor handed to x.to(cuda, non_blocking=true) and dropped at once, say). Every asynchronous
//   copy therefore records an event on its stream against the block (record_host_use), and a freed
//   block is handed out again only when all its events have completed. The same events order
//   copies of one block on different streams: an asynchronous copy first makes its stream wait for
//   them (wait_host_uses), so a copy to the device from a block reads what a copy from the device on
//   another stream wrote into it.
// - Statistics (cuda::host_memory_stats): allocated counts the bytes tensors asked for, reserved
//   the bytes of every block, cached or not.
// The memory is ordinary host memory to the CPU backend: a pinned tensor is a CPU tensor.
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cuda.h"

namespace kiln::cuda {
namespace {

constexpr size_t kMinBlock = 512;

size_t size_class(size_t nbytes) {
  size_t size = kMinBlock;
  while (size < nbytes) size <<= 1;
  return size;
}

struct HostBlock {
  size_t size = 0;
  bool allocated = false;
  std::vector<cudaEvent_t> events;  // record_host_use's, not yet known to have completed
};

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t size = size_class(nbytes);
    char* ptr = take_free(size);
    if (ptr == nullptr) ptr = fresh(size, nbytes);
    HostBlock& block = blocks_[ptr];
    block.allocated = true;
    counter_.on_allocate(nbytes);
    return ptr;
  }

  // Never throws (Storage calls it from a destructor).
  void deallocate(void* ptr, size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(static_cast<char*>(ptr));
    if (it == blocks_.end() || !it->second.allocated) return;  // not ours
    it->second.allocated = false;
    free_[it->second.size].push_back(it->first);
    counter_.on_free(nbytes);
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return counter_.stats(static_cast<int64_t>(reserved_));
  }
  void reset_peak() override { counter_.reset_peak(); }
  bool is_pinned() const override { return true; }

  // Returns every free block whose copies have finished to CUDA.
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    empty_cache_locked();
  }

  // Whether [ptr, ptr + nbytes) lies in one live block of this allocator.
  bool contains(const void* ptr, size_t nbytes) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = find(ptr);
    return it != blocks_.end() && static_cast<const char*>(ptr) + nbytes <= it->first + it->second.size;
  }

  // The live block holding ptr is not handed out again before the work queued on `stream` so far
  // has finished.
  void record_use(const void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = find(ptr);
    KILN_CHECK(it != blocks_.end(), "record_host_use: {} is not in a live block of pinned memory", ptr);
    HostBlock& block = it->second;
    events_done(block);  // a long-lived staging buffer must not gather one event per copy
    // The copy is queued already: without an event, wait for the stream rather than leave the block
    // unguarded (as allocator.cpp's deallocate does).
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    if (cudaEventRecord(event, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaEventDestroy(event);
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    block.events.push_back(event);
  }

  // Work queued on `stream` from now on waits for every copy recorded against ptr's block.
  void wait_uses(const void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = find(ptr);
    if (it == blocks_.end()) return;
    events_done(it->second);
    for (cudaEvent_t e : it->second.events) KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
  }

 private:
  // The allocated block that holds ptr, or end().
  std::map<char*, HostBlock>::const_iterator find(const void* ptr) const {
    const char* p = static_cast<const char*>(ptr);
    auto it = blocks_.upper_bound(const_cast<char*>(p));
    if (it == blocks_.begin()) return blocks_.end();
    --it;
    return it->second.allocated && p < it->first + it->second.size ? it : blocks_.end();
  }
  std::map<char*, HostBlock>::iterator find(const void* ptr) {
    auto it = std::as_const(*this).find(ptr);
    return it == blocks_.cend() ? blocks_.end() : blocks_.find(it->first);
  }

  // Destroys the block's completed events; true when none is left pending.
  static bool events_done(HostBlock& block) {
    auto& ev = block.events;
    for (auto e = ev.begin(); e != ev.end();) {
      const cudaError_t q = cudaEventQuery(*e);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        ++e;
        continue;
      }
      (void)cudaGetLastError();  // an error here (a dead context) leaves nothing to wait for
      (void)cudaEventDestroy(*e);
      e = ev.erase(e);
    }
    return ev.empty();
  }

  void empty_cache_locked() {
    for (auto& [size, ptrs] : free_) {
      for (auto p = ptrs.begin(); p != ptrs.end();) {
        HostBlock& block = blocks_.at(*p);
        if (!events_done(block)) {
          ++p;
          continue;
        }
        (void)cudaFreeHost(*p);
        (void)cudaGetLastError();
        reserved_ -= block.size;
        blocks_.erase(*p);
        p = ptrs.erase(p);
      }
    }
  }

  char* take_free(size_t size) {
    auto list = free_.find(size);
    if (list == free_.end()) return nullptr;
    auto& ptrs = list->second;
    for (auto p = ptrs.begin(); p != ptrs.end(); ++p) {
      if (events_done(blocks_.at(*p))) {
        char* ptr = *p;
        ptrs.erase(p);
        return ptr;
      }
    }
    return nullptr;
  }

  char* fresh(size_t size, size_t nbytes) {
    void* ptr = nullptr;
    cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (err != cudaSuccess) {  // give back what is cached and try once more
      (void)cudaGetLastError();
      empty_cache_locked();
      err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      std::string message = fmt::format(
          "pin_memory: cannot allocate {} bytes of pinned host memory ({}; {} bytes pinned already): {}. "
          "Pin less (host_empty_cache() returns cached blocks), or leave the tensor unpinned",
          nbytes, cudaGetErrorName(err), reserved_, cudaGetErrorString(err));
      if (err == cudaErrorMemoryAllocation) throw OutOfMemoryError(std::move(message));
      KILN_FAIL("{}", message);
    }
    reserved_ += size;
    blocks_[static_cast<char*>(ptr)].size = size;
    return static_cast<char*>(ptr);
  }

  mutable std::mutex mutex_;
  std::map<char*, HostBlock> blocks_;                   // every block, by address
  std::map<size_t, std::vector<char*>> free_;           // free blocks by size class
  size_t reserved_ = 0;
  MemoryCounter counter_;
};

HostAllocator& host_allocator_instance() {
  static auto* instance = new HostAllocator;  // never destroyed: tensors may outlive static destructors
  return *instance;
}

}  // namespace

Allocator& host_allocator() { return host_allocator_instance(); }

bool is_pinned_host(const void* ptr, size_t nbytes) { return host_allocator_instance().contains(ptr, nbytes); }
void record_host_use(const void* ptr, cudaStream_t stream) { host_allocator_instance().record_use(ptr, stream); }
void wait_host_uses(const void* ptr, cudaStream_t stream) { host_allocator_instance().wait_uses(ptr, stream); }

MemoryStats host_memory_stats() { return host_allocator_instance().stats(); }
void host_empty_cache() { host_allocator_instance().empty_cache(); }

}  // namespace kiln::cuda

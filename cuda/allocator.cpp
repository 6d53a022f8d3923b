// cuda/allocator.cpp: the caching allocator of each device.
//
// Note [CUDA caching allocator]
// cudaMalloc is slow and cudaFree waits for the whole device, so a training step that allocated
// every activation with them would spend its time there. Instead each device's allocator keeps the
// memory it got from CUDA ("segments") and hands out pieces of it ("blocks"):
// - Sizes round up to 512 bytes. Requests up to 1 MiB are "small" and come from 2 MiB segments;
//   larger ones from 20 MiB segments when under 10 MiB, else from a segment of their own size
//   rounded up to 2 MiB. Small and large blocks live in separate pools, so small tensors do not
//   fragment the large segments.
// - A request takes the best-fitting free block of its pool (the smallest that fits, then the lowest
//   address). What is left over is split off as a free block when it is worth keeping (at least
//   512 bytes for small blocks, more than 1 MiB for large ones); otherwise the request gets it all.
// - A freed block merges with its free neighbours in the segment, so splitting does not fragment
//   memory for good.
// - Streams: a block belongs to the stream it was allocated on and is reused only for that stream.
//   Work on one stream runs in issue order, so whatever kernel last used a freed block was issued,
//   and runs, before any kernel of a later owner: the host never waits. A block that a kernel on
//   another stream also uses must be named with record_stream(); when it is freed, an event is
//   recorded on each such stream and the block stays off the free lists until all have completed.
// - Out of memory: the free segments go back to CUDA (empty_cache) and cudaMalloc is tried once
//   more; failing that, an Error with the numbers.
// - Statistics (memory::stats): allocated counts the bytes tensors asked for, reserved the bytes of
//   all segments; memory::empty_cache(device) returns every wholly free segment to CUDA.
// - KILN_CUDA_NO_CACHING=1 in the environment turns the cache off: every buffer is its own
//   cudaMalloc, freed with cudaFree. Slow, but a memory checker (compute-sanitizer) then sees each
//   tensor's bounds, not a whole segment's.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cuda.h"

namespace kiln::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kRound = 512;               // every block's size is a multiple of this
constexpr size_t kSmallRequest = kMiB;       // requests up to here are small
constexpr size_t kSmallSegment = 2 * kMiB;   // the segment small blocks come from
constexpr size_t kLargeSegment = 20 * kMiB;  // ... and large ones under kLargeAlone
constexpr size_t kLargeAlone = 10 * kMiB;    // requests from here get a segment of their own
constexpr size_t kLargeRound = 2 * kMiB;     // ... rounded up to this

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

struct Block {
  Block() = default;
  Block(char* p, size_t n, cudaStream_t s, bool is_small) : ptr(p), size(n), stream(s), small(is_small) {}
  char* ptr = nullptr;
  size_t size = 0;
  cudaStream_t stream = nullptr;  // the stream it belongs to
  bool small = false;
  bool allocated = false;
  int pending_events = 0;                  // events still to complete before it is free
  std::vector<cudaStream_t> other_streams;  // record_stream's
  Block* prev = nullptr;                   // neighbours in the same segment
  Block* next = nullptr;
};

// Free blocks by (stream, size, address): lower_bound finds the best fit on a stream.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};
using Pool = std::set<Block*, BlockOrder>;

// Makes `device` current for its lifetime, never throwing: deallocate runs from destructors, and the
// events it records must be made on the block's device.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) {
    switched_ = cudaGetDevice(&previous_) == cudaSuccess && previous_ != device && cudaSetDevice(device) == cudaSuccess;
  }
  ~QuietDeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device_index) : device_index_(device_index) {
    const char* off = std::getenv("KILN_CUDA_NO_CACHING");
    caching_ = off == nullptr || std::strcmp(off, "0") == 0 || *off == '\0';
  }

  void* allocate(size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceGuard guard(device_index_, "allocate");
    poll_pending();
    const size_t size = round_up(std::max<size_t>(nbytes, 1), kRound);  // never null, even for 0 bytes
    const bool small = size <= kSmallRequest;
    Pool& pool = small ? small_free_ : large_free_;
    cudaStream_t stream = current_stream_handle(device_index_);  // Note [CUDA streams]
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    Block* block = nullptr;
    if (!caching_) {
      block = new_segment(size, small, stream, nbytes, /*exact=*/true);
    } else if (it != pool.end() && (*it)->stream == stream) {
      block = *it;
      pool.erase(it);
    } else {
      block = new_segment(size, small, stream, nbytes);
    }
    const size_t rest = block->size - size;
    if (small ? rest >= kRound : rest > kSmallRequest) {
      auto* tail = new Block(block->ptr + size, rest, stream, small);
      tail->prev = block;
      tail->next = block->next;
      if (block->next) block->next->prev = tail;
      block->next = tail;
      block->size = size;
      pool.insert(tail);
    }
    block->allocated = true;
    live_.emplace(block->ptr, block);
    counter_.on_allocate(nbytes);
    return block->ptr;
  }

  // Never throws (Storage calls it from a destructor).
  void deallocate(void* ptr, size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours: nothing sensible to do in a destructor
    Block* block = it->second;
    live_.erase(it);
    counter_.on_free(nbytes);
    block->allocated = false;
    QuietDeviceGuard on_device(device_index_);
    if (!caching_) {  // no cache: straight back to CUDA (cudaFree waits for the device)
      (void)cudaFree(block->ptr);
      (void)cudaGetLastError();
      reserved_ -= block->size;
      delete block;
      return;
    }
    for (cudaStream_t s : block->other_streams) {
      // Without an event to wait on, wait for the stream now: the block must not be reused early.
      cudaEvent_t event = nullptr;
      if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaStreamSynchronize(s);
        continue;
      }
      if (cudaEventRecord(event, s) != cudaSuccess) {
        (void)cudaEventDestroy(event);
        (void)cudaStreamSynchronize(s);
        continue;
      }
      ++block->pending_events;
      pending_.push_back({event, block});
    }
    (void)cudaGetLastError();
    block->other_streams.clear();
    if (block->pending_events == 0) release(block);
  }

  void record_stream(void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    KILN_CHECK(it != live_.end(), "record_stream: {} is not the start of a live buffer of cuda:{}", ptr,
               device_index_);
    Block* block = it->second;
    if (stream != block->stream &&
        std::find(block->other_streams.begin(), block->other_streams.end(), stream) == block->other_streams.end()) {
      block->other_streams.push_back(stream);
    }
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return counter_.stats(static_cast<int64_t>(reserved_));
  }
  void reset_peak() override { counter_.reset_peak(); }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceGuard guard(device_index_, "empty_cache");
    for (auto& [event, block] : pending_) (void)cudaEventSynchronize(event);
    poll_pending();
    free_segments();
  }

 private:
  struct Pending {
    cudaEvent_t event;
    Block* block;
  };

  // A new segment for a request of `size` (rounded) bytes, `nbytes` as asked; `exact`: of that size.
  Block* new_segment(size_t size, bool small, cudaStream_t stream, size_t nbytes, bool exact = false) {
    const size_t bytes = exact   ? size
                         : small ? kSmallSegment
                         : size < kLargeAlone ? kLargeSegment
                                              : round_up(size, kLargeRound);
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {  // return the cache, as empty_cache() does, and retry
      (void)cudaGetLastError();
      for (auto& pending : pending_) (void)cudaEventSynchronize(pending.event);
      poll_pending();
      free_segments();
      status = cudaMalloc(&p, bytes);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      (void)cudaGetLastError();
      const double mib = static_cast<double>(kMiB);
      throw OutOfMemoryError(fmt::format(
          "CUDA out of memory on cuda:{}: could not allocate {} bytes ({:.1f} MiB); Kiln tensors hold "
          "{:.1f} MiB and Kiln has {:.1f} MiB reserved; the device has {:.1f} MiB free of {:.1f} MiB. Use a "
          "smaller batch, free tensors, or try activation checkpointing",
          device_index_, nbytes, static_cast<double>(nbytes) / mib,
          static_cast<double>(counter_.stats().allocated_bytes) / mib, static_cast<double>(reserved_) / mib,
          static_cast<double>(free_bytes) / mib, static_cast<double>(total_bytes) / mib));
    }
    KILN_CUDA_CHECK(status);
    reserved_ += bytes;
    return new Block(static_cast<char*>(p), bytes, stream, small);
  }

  // A block nobody uses any more: merged with its free neighbours and put back in its pool.
  void release(Block* block) {
    Pool& pool = block->small ? small_free_ : large_free_;
    for (Block* other : {block->prev, block->next}) {
      if (!other || other->allocated || other->pending_events > 0) continue;
      pool.erase(other);
      if (other == block->prev) {
        other->size += block->size;
        other->next = block->next;
        if (block->next) block->next->prev = other;
        delete block;
        block = other;
      } else {
        block->size += other->size;
        block->next = other->next;
        if (other->next) other->next->prev = block;
        delete other;
      }
    }
    pool.insert(block);
  }

  void poll_pending() {
    for (size_t i = 0; i < pending_.size();) {
      const cudaError_t status = cudaEventQuery(pending_[i].event);
      if (status == cudaErrorNotReady) {
        ++i;
        continue;
      }
      (void)cudaGetLastError();
      (void)cudaEventDestroy(pending_[i].event);
      Block* block = pending_[i].block;
      pending_[i] = pending_.back();
      pending_.pop_back();
      if (--block->pending_events == 0 && !block->allocated) release(block);
    }
  }

  // Returns every wholly free segment to CUDA.
  void free_segments() {
    for (Pool* pool : {&small_free_, &large_free_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* block = *it;
        if (block->prev || block->next) {
          ++it;
          continue;
        }
        (void)cudaFree(block->ptr);
        (void)cudaGetLastError();
        reserved_ -= block->size;
        it = pool->erase(it);
        delete block;
      }
    }
  }

  int device_index_;
  bool caching_ = true;
  mutable std::mutex mutex_;
  MemoryCounter counter_;
  size_t reserved_ = 0;
  Pool small_free_, large_free_;
  std::unordered_map<void*, Block*> live_;
  std::vector<Pending> pending_;
};

std::vector<CachingAllocator*>& allocators() {
  // Made once for every device and never destroyed: a tensor that outlives static destruction
  // still finds its allocator.
  static std::vector<CachingAllocator*>* all = [] {
    auto* v = new std::vector<CachingAllocator*>();
    for (int i = 0, n = device_count(); i < n; ++i) v->push_back(new CachingAllocator(i));
    return v;
  }();
  return *all;
}

}  // namespace

Allocator& device_allocator(int device_index) {
  check_device(device_index, "CUDA allocator");
  return *allocators()[static_cast<size_t>(device_index)];
}

void record_stream(int device_index, void* ptr, cudaStream_t stream) {
  check_device(device_index, "record_stream");
  allocators()[static_cast<size_t>(device_index)]->record_stream(ptr, stream);
}

}  // namespace kiln::cuda

// cuda/cuda.h: the CUDA backend's entry points and its runtime API: devices and their properties,
// streams (the current stream of each device, per thread, is where every op on that device is
// queued), and events. Built without CUDA (cuda/stub.cpp), is_available() is false, device_count()
// is 0, and everything else throws an Error saying how to build with CUDA. The names follow
// torch.cuda's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/backend.h"

namespace kiln::cuda {

bool is_available();  // a CUDA device is present and the driver works
int device_count();
void synchronize(int device_index = 0);  // waits for all work queued on the device
// float32 matmuls on TF32 tensor cores (10-bit mantissa inputs, float32 accumulation): off by default,
// as torch.backends.cuda.matmul.allow_tf32 is. Process-wide.
void set_matmul_allow_tf32(bool allow);
bool matmul_allow_tf32();
Backend& backend();   // for ops/dispatch.cpp
// Pinned (page-locked) host memory, the memory of pin_memory() tensors (Note [pinned host memory]
// in cuda/host_allocator.cpp): its statistics, as torch.cuda.host_memory_stats(), and
// host_empty_cache(), which gives its cached free blocks back to CUDA.
MemoryStats host_memory_stats();
void host_empty_cache();

struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;  // compute capability (9.0 for an H100)
  int multiprocessor_count = 0;
  int64_t total_memory = 0;  // bytes
};
DeviceProperties get_device_properties(int device_index = 0);

class CudaEvent;

// A stream of one device: work queued on it runs in order. Copies of a CudaStream share one CUDA
// stream, destroyed (after its queued work) with the last copy. Streams made here do not
// synchronize with the default stream: order them with wait_stream / wait_event, as in PyTorch.
class CudaStream {
 public:
  explicit CudaStream(int device_index = 0);          // a new stream
  static CudaStream default_stream(int device_index = 0);  // the device's default (legacy) stream
  int device_index() const;
  void* handle() const;  // the cudaStream_t
  bool query() const;    // whether all work queued so far has finished
  void synchronize() const;
  void wait_event(const CudaEvent& event) const;   // later work waits for the event
  void wait_stream(const CudaStream& other) const;  // later work waits for other's work queued so far
  bool operator==(const CudaStream& other) const {
    return handle() == other.handle() && device_index() == other.device_index();
  }
  bool operator!=(const CudaStream& other) const { return !(*this == other); }

  struct Impl;
 private:
  explicit CudaStream(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
  friend CudaStream current_stream(int device_index);
  friend class StreamGuard;
};

// The stream that ops on cuda:device_index queue their work on, in this thread (the default stream
// unless a StreamGuard says otherwise).
CudaStream current_stream(int device_index = 0);

// Makes `stream` the current stream of its device in this thread for a scope.
class StreamGuard {
 public:
  explicit StreamGuard(const CudaStream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  CudaStream previous_;
};

// A marker in a stream's work: recorded on a stream, it completes when the work queued before it
// has. With enable_timing, two events give the device time between them.
class CudaEvent {
 public:
  explicit CudaEvent(bool enable_timing = false);
  void record();                      // on the current stream of the current device
  void record(const CudaStream& stream);
  bool query() const;                 // recorded and completed (true if never recorded)
  void synchronize() const;           // waits for it on the host
  float elapsed_time(const CudaEvent& end) const;  // milliseconds from this event to `end`

  struct Impl;
 private:
  std::shared_ptr<Impl> impl_;
  friend class CudaStream;
};

}  // namespace kiln::cuda

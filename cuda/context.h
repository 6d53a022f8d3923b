// cuda/context.h: the per-device state of the CUDA backend and the helpers every file in cuda/
// uses (private to cuda/): the device guard, the default stream, the per-device allocators and the
// backend instance. Plain C++ against the CUDA runtime: runtime.cpp, allocator.cpp and backend.cu
// implement it; copy.cpp and the .cu files use it.
//
// Note [CUDA streams]
// Each device's current stream is, per thread, its legacy default stream (handle nullptr) unless a
// cuda::StreamGuard names another, as in PyTorch: work on one stream runs in issue order, and the
// default stream waits for (and is waited for by) every other blocking stream of the device, so a
// kernel never races a cudaMemcpy or another kernel. Streams made with cuda::Stream are
// non-blocking: the user orders them with wait_stream / wait_event. Kernels launch on the Stream
// they are given, so a caller with its own stream (a communicator, say) is honoured. Copies that hand
// data to or from the host, or between two devices, synchronize before returning (PyTorch's
// non_blocking=false): `x.to(Device::cpu())` and `item()` see finished results; only a
// non_blocking copy between pinned memory and a device does not (Note [non_blocking copies] in
// copy.cpp). Indexing ops synchronize too, to check their indices (Note [index checks on the
// device] in index.cu). Freed device buffers go back to the caching allocator, which reuses a
// buffer only for work on the stream it was allocated on (Note [CUDA caching allocator] in
// allocator.cpp), so dropping a tensor whose kernels are still queued is safe without waiting; a
// buffer that another stream also uses must be named with record_stream().
#pragma once

#include <vector>

#include <cuda_runtime_api.h>

#include "core/backend.h"

namespace kiln::cuda {

// Makes `device_index` the current device for a scope and restores the previous one. Throws an
// Error naming `what` (the op) when the index names no device of this machine.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device_index, const char* what = "cuda");
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// Throws a clear Error when `device_index` is not a device of this machine, naming `what`.
void check_device(int device_index, const char* what);
// The devices this process has queued work on: those a DeviceGuard has entered, and the current
// one. Waiting for these, and not for every visible device, makes no context on a GPU the process
// never used (cudaSetDevice would make one on each).
std::vector<int> devices_in_use();

inline cudaStream_t stream_of(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }
// This thread's current stream of the device (cuda::current_stream's handle): where ops queue their
// work and whose buffers the allocator hands out. nullptr: the default stream.
cudaStream_t current_stream_handle(int device_index);
inline Stream current_stream_of(int device_index) {
  return {Device::cuda(device_index), current_stream_handle(device_index)};
}

// The allocator of one device (allocator.cpp); throws for a bad index.
Allocator& device_allocator(int device_index);
// Marks the live buffer starting at `ptr` as used by `stream` too: once freed, it is reused only
// after the work queued on `stream` by then has finished.
void record_stream(int device_index, void* ptr, cudaStream_t stream);

// The allocator of pinned host memory (host_allocator.cpp), shared by every device.
Allocator& host_allocator();
// Whether [ptr, ptr + nbytes) lies in one live pinned block of host_allocator().
bool is_pinned_host(const void* ptr, size_t nbytes);
// The pinned block holding ptr is not handed out again before the work queued on `stream` so far
// has finished. An asynchronous copy calls it, after queueing itself, for the host memory it reads
// or writes (Note [non_blocking copies] in copy.cpp).
void record_host_use(const void* ptr, cudaStream_t stream);
// Work queued on `stream` from now on waits for the copies recorded against ptr's pinned block on
// any stream (a block written by a copy on one stream and read by a copy on another, as
// SaveOnCpu(pin_memory) does when forward and backward run on different streams). A copy from or
// into a pinned block, asynchronous or not, calls it before queueing itself.
void wait_host_uses(const void* ptr, cudaStream_t stream);

// The CudaBackend (backend.cu); cuda::backend() in runtime.cpp returns it.
Backend& backend_instance();

// A device buffer from the device's allocator, returned to it at scope exit: the staging space of
// copies and matmuls, the partial results of split reductions, cuDNN's workspace. It counts in
// memory::stats like any tensor's buffer.
class DeviceBuffer {
 public:
  DeviceBuffer(int device_index, size_t nbytes)
      : allocator_(&device_allocator(device_index)), nbytes_(nbytes),
        data_(allocator_->allocate(nbytes)) {}
  ~DeviceBuffer() { allocator_->deallocate(data_, nbytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }

 private:
  Allocator* allocator_;
  size_t nbytes_;
  void* data_;
};

}  // namespace kiln::cuda

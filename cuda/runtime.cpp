// cuda/runtime.cpp: the CUDA backend's entry points of cuda/cuda.h (is_available, device_count,
// synchronize, backend, device properties, streams and events) and the device helpers of
// cuda/context.h. Plain C++ against cudart.
// Siblings: backend.cu (the Backend class, matmul), copy.cpp (copies), elementwise.cu, reduce.cu,
// index.cu (kernels), allocator.cpp. A build without CUDA links cuda/stub.cpp instead of them all.
#include <atomic>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cuda.h"

namespace kiln::cuda {

namespace {

// The number of devices, or 0 (never an exception) when there is no driver, no device, or the
// driver is too old for this runtime. The failed call's error is cleared so it does not surface
// in a later check. Counted once: the set of visible devices is fixed for the process.
int count_devices() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

}  // namespace

bool is_available() { return count_devices() > 0; }

int device_count() { return count_devices(); }

void check_device(int device_index, const char* what) {
  int n = count_devices();
  KILN_CHECK(n > 0,
             "{}: cuda:{} was asked for but no CUDA device is available (no GPU or no working "
             "driver); check with cuda::is_available() and use Device::cpu() instead",
             what, device_index);
  KILN_CHECK(device_index >= 0 && device_index < n,
             "{}: cuda:{} does not exist; this machine has {} CUDA device{} (cuda:0..cuda:{})",
             what, device_index, n, n == 1 ? "" : "s", n - 1);
}

void synchronize(int device_index) {
  DeviceGuard guard(device_index, "synchronize");
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

Backend& backend() { return backend_instance(); }

DeviceProperties get_device_properties(int device_index) {
  check_device(device_index, "get_device_properties");
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  DeviceProperties p;
  p.name = prop.name;
  p.major = prop.major;
  p.minor = prop.minor;
  p.multiprocessor_count = prop.multiProcessorCount;
  p.total_memory = static_cast<int64_t>(prop.totalGlobalMem);
  return p;
}

// ---- streams ----

struct CudaStream::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  bool owned = false;  // made by CudaStream(device): destroyed with the last copy
  ~Impl() {
    if (!owned) return;
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                          cudaSetDevice(device) == cudaSuccess;
    // Its queued work finishes first: a buffer freed for it may then be reused safely.
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
    if (switched) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
  }
};

namespace {

// The default stream of every device, made once.
const std::shared_ptr<CudaStream::Impl>& default_impl(int device_index) {
  static const std::vector<std::shared_ptr<CudaStream::Impl>>* defaults = [] {
    auto* v = new std::vector<std::shared_ptr<CudaStream::Impl>>();
    for (int i = 0, n = count_devices(); i < n; ++i) {
      auto impl = std::make_shared<CudaStream::Impl>();
      impl->device = i;
      v->push_back(std::move(impl));
    }
    return v;
  }();
  return (*defaults)[static_cast<size_t>(device_index)];
}

// The answer of cudaStreamQuery / cudaEventQuery: finished, not yet, or an Error.
bool finished(cudaError_t status) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(status);
  return true;
}

// This thread's current stream of each device; null: the default stream.
std::vector<std::shared_ptr<CudaStream::Impl>>& thread_currents() {
  thread_local std::vector<std::shared_ptr<CudaStream::Impl>> currents;
  if (currents.empty()) currents.resize(static_cast<size_t>(count_devices()));
  return currents;
}

}  // namespace

CudaStream::CudaStream(int device_index) {
  DeviceGuard guard(device_index, "CudaStream");
  auto impl = std::make_shared<Impl>();
  impl->device = device_index;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  impl->owned = true;
  impl_ = std::move(impl);
}

CudaStream CudaStream::default_stream(int device_index) {
  check_device(device_index, "default_stream");
  return CudaStream(default_impl(device_index));
}

int CudaStream::device_index() const { return impl_->device; }
void* CudaStream::handle() const { return impl_->stream; }

bool CudaStream::query() const {
  DeviceGuard guard(impl_->device, "CudaStream::query");
  return finished(cudaStreamQuery(impl_->stream));
}

void CudaStream::synchronize() const {
  DeviceGuard guard(impl_->device, "CudaStream::synchronize");
  KILN_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

CudaStream current_stream(int device_index) {
  check_device(device_index, "current_stream");
  const auto& current = thread_currents()[static_cast<size_t>(device_index)];
  return current ? CudaStream(current) : CudaStream::default_stream(device_index);
}

cudaStream_t current_stream_handle(int device_index) {
  const auto& currents = thread_currents();
  if (device_index < 0 || device_index >= static_cast<int>(currents.size())) return nullptr;
  const auto& current = currents[static_cast<size_t>(device_index)];
  return current ? current->stream : nullptr;
}

StreamGuard::StreamGuard(const CudaStream& stream) : previous_(current_stream(stream.device_index())) {
  thread_currents()[static_cast<size_t>(stream.device_index())] = stream.impl_;
}

StreamGuard::~StreamGuard() { thread_currents()[static_cast<size_t>(previous_.device_index())] = previous_.impl_; }

// ---- events ----

struct CudaEvent::Impl {
  bool timing = false;
  int device = -1;  // of the first record
  cudaEvent_t event = nullptr;
  ~Impl() {
    if (event) (void)cudaEventDestroy(event);
    (void)cudaGetLastError();
  }
};

CudaEvent::CudaEvent(bool enable_timing) : impl_(std::make_shared<Impl>()) { impl_->timing = enable_timing; }

void CudaEvent::record() {
  KILN_CHECK(count_devices() > 0, "CudaEvent::record: no CUDA device is available (no GPU or no working driver); "
             "check with cuda::is_available()");
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  record(current_stream(device));
}

void CudaEvent::record(const CudaStream& stream) {
  DeviceGuard guard(stream.device_index(), "CudaEvent::record");
  if (!impl_->event) {
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->event, impl_->timing ? cudaEventDefault : cudaEventDisableTiming));
    impl_->device = stream.device_index();
  }
  KILN_CHECK(impl_->device == stream.device_index(),
             "CudaEvent::record: the event belongs to cuda:{}, the stream to cuda:{}; use an event per device",
             impl_->device, stream.device_index());
  KILN_CUDA_CHECK(cudaEventRecord(impl_->event, static_cast<cudaStream_t>(stream.handle())));
}

bool CudaEvent::query() const { return !impl_->event || finished(cudaEventQuery(impl_->event)); }

void CudaEvent::synchronize() const {
  if (impl_->event) KILN_CUDA_CHECK(cudaEventSynchronize(impl_->event));
}

float CudaEvent::elapsed_time(const CudaEvent& end) const {
  KILN_CHECK(impl_->timing && end.impl_->timing,
             "CudaEvent::elapsed_time: both events must be made with CudaEvent(/*enable_timing=*/true)");
  KILN_CHECK(impl_->event && end.impl_->event, "CudaEvent::elapsed_time: both events must be recorded first");
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->event, end.impl_->event));
  return ms;
}

void CudaStream::wait_event(const CudaEvent& event) const {
  if (!event.impl_->event) return;  // never recorded: nothing to wait for
  DeviceGuard guard(impl_->device, "CudaStream::wait_event");
  KILN_CUDA_CHECK(cudaStreamWaitEvent(impl_->stream, event.impl_->event, 0));
}

void CudaStream::wait_stream(const CudaStream& other) const {
  if (*this == other) return;
  CudaEvent event;
  event.record(other);
  wait_event(event);
}

namespace {
std::atomic<uint64_t> g_guarded{0};  // bit d: a DeviceGuard entered device d (the first 64)
}  // namespace

std::vector<int> devices_in_use() {
  int current = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&current));
  const uint64_t guarded = g_guarded.load(std::memory_order_relaxed);
  std::vector<int> devices;
  for (int d = 0; d < device_count(); ++d) {
    if (d == current || (d < 64 ? (guarded >> d) & 1 : true)) devices.push_back(d);
  }
  return devices;
}

DeviceGuard::DeviceGuard(int device_index, const char* what) {
  check_device(device_index, what);
  if (device_index < 64) g_guarded.fetch_or(uint64_t{1} << device_index, std::memory_order_relaxed);
  KILN_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_index) {
    KILN_CUDA_CHECK(cudaSetDevice(device_index));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);  // a destructor never throws
}

}  // namespace kiln::cuda

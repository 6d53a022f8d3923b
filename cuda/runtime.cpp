// cuda/runtime.cpp: the CUDA backend's entry points of cuda/cuda.h (is_available, device_count,
// synchronize, backend) and the device helpers of cuda/context.h. Plain C++ against cudart.
// Siblings: backend.cu (the Backend class, matmul), copy.cpp (copies), elementwise.cu, reduce.cu,
// index.cu (kernels), allocator.cpp. A build without CUDA links cuda/stub.cpp instead of them all.
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

DeviceGuard::DeviceGuard(int device_index, const char* what) {
  check_device(device_index, what);
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

// core/tensor_options.h: dtype, device, requires_grad and pinned_memory for a new tensor, as in
// LibTorch:
//   zeros({2, 3})                                   float32 on the CPU
//   zeros({2, 3}, kFloat64)                         a DType or a Device converts implicitly
//   zeros({2, 3}, TensorOptions().device(Device::cuda()).requires_grad(true))
#pragma once

#include "core/device.h"
#include "core/dtype.h"

namespace kiln {

class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType d) : dtype_(d) {}    // NOLINT: implicit, as in LibTorch
  TensorOptions(Device d) : device_(d) {}  // NOLINT

  TensorOptions dtype(DType d) const {
    auto o = *this;
    o.dtype_ = d;
    return o;
  }
  TensorOptions device(Device d) const {
    auto o = *this;
    o.device_ = d;
    return o;
  }
  TensorOptions requires_grad(bool r) const {
    auto o = *this;
    o.requires_grad_ = r;
    return o;
  }
  // Page-locked host memory (Tensor::is_pinned): for CPU tensors, where a CUDA device is usable.
  TensorOptions pinned_memory(bool p) const {
    auto o = *this;
    o.pinned_memory_ = p;
    return o;
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }
  bool pinned_memory() const { return pinned_memory_; }

 private:
  DType dtype_ = kFloat32;
  Device device_ = Device::cpu();
  bool requires_grad_ = false;
  bool pinned_memory_ = false;
};

}  // namespace kiln

// ops/copy.cpp: copies and conversions: contiguous, clone, to(device / dtype), detach, copy_, item,
// to_vector. A copy between devices goes to the device backend (the CPU backend knows no GPU).
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::should_record;
using autograd::TensorList;

// dst = src (broadcast, converted), with no autograd.
static void raw_copy(const Tensor& src, const Tensor& dst) {
  Device dev = src.is_cuda() ? src.device() : dst.device();
  backend_for(dev).copy(broadcast_view(src, dst.sizes()), src.device(), view_of(dst), dst.device(),
                        stream_for(dev));
}

inline namespace ops {

Tensor clone(const Tensor& t) {
  Tensor out = empty_tensor(t.sizes(), t.dtype(), t.device());
  raw_copy(t, out);
  if (should_record(t)) {
    autograd::record("CloneBackward", {t}, {out}, [](const Grads& g) -> TensorList { return {g[0]}; });
  }
  return out;
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor to(const Tensor& t, Device device, DType dtype) {
  if (t.device() == device && t.dtype() == dtype) return t;
  Tensor out = empty_tensor(t.sizes(), dtype, device);
  raw_copy(t, out);
  if (is_floating(dtype) && should_record(t)) {
    Device from_device = t.device();
    DType from_dtype = t.dtype();
    autograd::record("ToCopyBackward", {t}, {out}, [from_device, from_dtype](const Grads& g) -> TensorList {
      return {g[0].to(from_device, from_dtype)};
    });
  }
  return out;
}

Tensor detach(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->sizes = t.sizes();
  impl->strides = t.strides();
  impl->offset = t.storage_offset();
  impl->dtype = t.dtype();
  impl->is_view = t.impl()->is_view;
  return Tensor(std::move(impl));
}

}  // namespace ops

Tensor Tensor::contiguous() const { return ops::contiguous(*this); }
Tensor Tensor::clone() const { return ops::clone(*this); }
Tensor Tensor::to(DType dtype) const { return ops::to(*this, device(), dtype); }
Tensor Tensor::to(Device device) const { return ops::to(*this, device, dtype()); }
Tensor Tensor::to(Device device, DType dtype) const { return ops::to(*this, device, dtype); }
Tensor Tensor::detach() const { return ops::detach(*this); }
Tensor& Tensor::detach_() {
  impl_->grad_fn.reset();
  impl_->requires_grad = false;
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  KILN_CHECK(broadcast_shapes(src.sizes(), sizes(), "copy_") == sizes(),
             "copy_: the source of shape {} cannot be broadcast to the destination's shape {}",
             src.sizes().str(), sizes().str());
  check_no_internal_overlap(*this, "copy_");
  if (!should_record(*this, src)) {
    raw_copy(unaliased(src, *this), *this);
    bump_version();
    return *this;
  }
  autograd::check_inplace(*this, "copy_");
  Tensor result = src.expand(sizes()).to(device(), dtype());  // differentiable path to src
  raw_copy(result, *this);
  bump_version();
  impl_->grad_fn = result.grad_fn();
  impl_->output_nr = result.output_nr();
  if (!impl_->grad_fn) impl_->requires_grad = false;
  return *this;
}

Scalar Tensor::item() const {
  KILN_CHECK(numel() == 1,
             "item: only a tensor with one element converts to a number; this one has shape {} ({} "
             "elements). Reduce it first (sum(), mean()) or index one element",
             sizes().str(), numel());
  Tensor c = is_cpu() ? *this : to(Device::cpu());
  return KILN_DISPATCH_ALL_TYPES(c.dtype(), "item", [&]() -> Scalar {
    return Scalar(*static_cast<const scalar_t*>(c.data_ptr()));
  });
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = ops::contiguous(to(Device::cpu(), dtype_of<T>()));
  const T* p = static_cast<const T*>(c.data_ptr());
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int32_t> Tensor::to_vector() const;
template std::vector<int64_t> Tensor::to_vector() const;
template std::vector<Half> Tensor::to_vector() const;
template std::vector<BFloat16> Tensor::to_vector() const;
template <>
std::vector<bool> Tensor::to_vector() const {
  Tensor c = ops::contiguous(to(Device::cpu(), kBool));
  const bool* p = static_cast<const bool*>(c.data_ptr());
  return std::vector<bool>(p, p + c.numel());
}

}  // namespace kiln

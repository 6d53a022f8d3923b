// ops/copy.cpp: copies and conversions: contiguous, clone, pin_memory, to(device / dtype), detach, copy_,
// item, to_vector. A copy between devices goes to the device backend (the CPU backend knows no GPU).
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::should_record;
using autograd::TensorList;

// dst = src (broadcast, converted), with no autograd; non_blocking: Backend::copy_non_blocking.
static void raw_copy(const Tensor& src, const Tensor& dst, bool non_blocking = false) {
  Device dev = src.is_cuda() ? src.device() : dst.device();
  Backend& b = backend_for(dev);
  const View from = broadcast_view(src, dst.sizes()), to = view_of(dst);
  if (non_blocking) return b.copy_non_blocking(from, src.device(), to, dst.device(), stream_for(dev));
  b.copy(from, src.device(), to, dst.device(), stream_for(dev));
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

Tensor pin_memory(const Tensor& t) {
  KILN_CHECK(t.is_cpu(), "pin_memory: only CPU tensors can be pinned; this one is on {}", t.device().str());
  if (t.is_pinned()) return t;
  Tensor out = empty_pinned(t.sizes(), t.dtype(), "pin_memory");
  raw_copy(t, out);
  if (should_record(t)) {
    autograd::record("PinMemoryBackward", {t}, {out}, [](const Grads& g) -> TensorList { return {g[0]}; });
  }
  return out;
}

Tensor to(const Tensor& t, Device device, DType dtype, bool non_blocking) {
  if (t.device() == device && t.dtype() == dtype) return t;
  // As PyTorch: a non-blocking copy from a GPU to the CPU lands in pinned memory, which the GPU can
  // write without the host waiting.
  const bool pin_out = non_blocking && t.is_cuda() && device.is_cpu();
  Tensor out = empty_tensor(t.sizes(), TensorOptions(dtype).device(device).pinned_memory(pin_out));
  raw_copy(t, out, non_blocking);
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
  KILN_CHECK(t.defined(), "detach: the tensor is undefined (default-constructed, or a grad that was never computed)");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->sizes = t.sizes();
  impl->strides = t.strides();
  impl->offset = t.storage_offset();
  impl->dtype = t.dtype();
  if (t.impl()->counts_as_view) impl->count_as_view();  // a detached view is still a view of its base
  else impl->is_view = t.impl()->is_view;
  return Tensor(std::move(impl));
}

}  // namespace ops

Tensor Tensor::contiguous() const { return ops::contiguous(*this); }
Tensor Tensor::clone() const { return ops::clone(*this); }
Tensor Tensor::to(DType dtype) const { return ops::to(*this, device(), dtype); }
Tensor Tensor::to(Device device) const { return ops::to(*this, device, dtype()); }
Tensor Tensor::to(Device device, DType dtype, bool non_blocking) const {
  return ops::to(*this, device, dtype, non_blocking);
}
Tensor Tensor::pin_memory() const { return ops::pin_memory(*this); }
Tensor Tensor::detach() const { return ops::detach(*this); }
Tensor& Tensor::detach_() {
  KILN_CHECK(defined(), "detach_: the tensor is undefined (default-constructed, or a grad that was never computed)");
  KILN_CHECK(!impl_->is_view || !requires_grad(),
             "detach_: a view that takes part in autograd cannot be detached in place (its base keeps its "
             "history); use detach(), which returns a new handle, as PyTorch asks");
  impl_->grad_fn.reset();
  impl_->requires_grad = false;
  if (impl_->view_base) {  // no longer follows its base's history: a view made without autograd
    impl_->view_base.reset();
    impl_->count_as_view();
  }
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  check_inference_write(*this, "copy_");
  KILN_CHECK(broadcast_shapes(src.sizes(), sizes(), "copy_") == sizes(),
             "copy_: the source of shape {} cannot be broadcast to the destination's shape {}",
             src.sizes().str(), sizes().str());
  check_no_internal_overlap(*this, "copy_");
  if (!should_record(*this, src)) {
    raw_copy(unaliased(src, *this), *this, non_blocking);
    bump_version();
    return *this;
  }
  autograd::check_inplace(*this, "copy_");
  // The differentiable path to src. Non-blocking only towards a device: a temporary copied to the
  // host without waiting could not be read by the host copy below before the device had written it.
  const bool async = non_blocking && is_cuda();
  Tensor result = src.expand(sizes()).to(device(), dtype(), async);
  raw_copy(result, *this, async);
  if (!result.requires_grad() && is_floating_point()) {
    // A source without grad into a tensor with history: the tensor stays in the graph, as PyTorch's
    // CopyBackwards, passing a zero gradient to what it was before.
    result = ops::detach(*this);
    autograd::record("CopyBackwards", {*this}, {result},
                     [](const autograd::Grads& g) -> autograd::TensorList { return {zeros_like(g[0])}; });
  }
  bump_version();
  autograd::rebase_history(*this, result);
  if (!impl_->grad_fn) impl_->requires_grad = false;  // an integer destination has no gradient
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
template std::vector<uint8_t> Tensor::to_vector() const;
template std::vector<int8_t> Tensor::to_vector() const;
template std::vector<Half> Tensor::to_vector() const;
template std::vector<BFloat16> Tensor::to_vector() const;
template <>
std::vector<bool> Tensor::to_vector() const {
  Tensor c = ops::contiguous(to(Device::cpu(), kBool));
  const bool* p = static_cast<const bool*>(c.data_ptr());
  return std::vector<bool>(p, p + c.numel());
}

}  // namespace kiln

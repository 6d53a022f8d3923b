// ops/dispatch.cpp: THE DISPATCH BOUNDARY. backend_for() is the only place in Kiln that chooses a
// backend by device; everything below it (cpu/, cuda/) sees raw views only.
#include "ops/dispatch.h"

#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "ops/ops.h"

namespace kiln {

Backend& backend_for(Device device) {
  switch (device.type) {
    case DeviceType::CPU: return cpu::backend();
    case DeviceType::CUDA: return cuda::backend();
  }
  KILN_FAIL("unknown device type");
}

Stream stream_for(Device device) { return backend_for(device).current_stream(device.index); }

View view_of(const Tensor& t) {
  View v;
  v.data = t.data_ptr();
  v.dtype = t.dtype();
  v.sizes = t.sizes();
  v.strides = t.strides();
  return v;
}

View broadcast_view(const Tensor& t, const Shape& shape) {
  View v;
  v.data = t.data_ptr();
  v.dtype = t.dtype();
  v.sizes = shape;
  v.strides = Shape::filled(shape.size(), 0);
  const int lead = shape.size() - t.dim();
  for (int d = 0; d < t.dim(); ++d) {
    if (t.sizes()[d] != 1) v.strides[lead + d] = t.strides()[d];
  }
  return v;
}

Tensor empty_tensor(const Shape& shape, DType dtype, Device device) {
  int64_t numel = 1, nbytes_signed = 0;
  for (int64_t s : shape) {
    KILN_CHECK(s >= 0, "empty: sizes must be non-negative, got {}", shape.str());
    KILN_CHECK(!__builtin_mul_overflow(numel, s, &numel), "empty: shape {} has more elements than fit in 64 bits",
               shape.str());
  }
  KILN_CHECK(!__builtin_mul_overflow(numel, itemsize(dtype), &nbytes_signed) && nbytes_signed < (int64_t{1} << 60),
             "empty: shape {} of {} needs more bytes than any device has", shape.str(), dtype_name(dtype));
  size_t nbytes = static_cast<size_t>(nbytes_signed);
  Allocator& alloc = backend_for(device).allocator(device.index);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(alloc.allocate(nbytes), nbytes, device, &alloc);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.device() == b.device(),
             "{}: expected all tensors on one device, got {} and {}; move one with .to(device)", op,
             a.device().str(), b.device().str());
}

namespace memory {
MemoryStats stats(Device device) { return backend_for(device).allocator(device.index).stats(); }
void reset_peak(Device device) { backend_for(device).allocator(device.index).reset_peak(); }
}  // namespace memory

}  // namespace kiln

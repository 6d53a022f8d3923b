// ops/dispatch.cpp: THE DISPATCH BOUNDARY. backend_for() is the only place in Kiln that chooses a
// backend by device; everything below it (cpu/, cuda/) sees raw views only.
#include "ops/dispatch.h"

#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "core/grad_mode.h"
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
  v.strides.resize(shape.size());  // zeros, written in place: Note [copying a fresh Shape]
  const int lead = shape.size() - t.dim();
  for (int d = 0; d < t.dim(); ++d) {
    if (t.sizes()[d] != 1) v.strides[lead + d] = t.strides()[d];
  }
  return v;
}

int64_t checked_numel(const Shape& shape, const char* op) {
  int64_t numel = 1;
  for (int64_t s : shape) {
    KILN_CHECK(s >= 0, "{}: sizes must be non-negative, got {}", op, shape.str());
    KILN_CHECK(!__builtin_mul_overflow(numel, s, &numel), "{}: shape {} has more elements than fit in 64 bits", op,
               shape.str());
  }
  return numel;
}

static Tensor allocate_tensor(const Shape& shape, DType dtype, Device device, Allocator& alloc) {
  const int64_t numel = checked_numel(shape, "empty");
  int64_t nbytes_signed = 0;
  KILN_CHECK(!__builtin_mul_overflow(numel, itemsize(dtype), &nbytes_signed) && nbytes_signed < (int64_t{1} << 60),
             "empty: shape {} of {} needs more bytes than any device has", shape.str(), dtype_name(dtype));
  size_t nbytes = static_cast<size_t>(nbytes_signed);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(alloc.allocate(nbytes), nbytes, device, &alloc);
  impl->sizes = shape;
  set_contiguous_strides(shape, impl->strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor empty_tensor(const Shape& shape, DType dtype, Device device) {
  return allocate_tensor(shape, dtype, device, backend_for(device).allocator(device.index));
}

// The pinned host allocator, for a tensor that would be on `device`; `op` names the caller in the
// Errors: a device tensor, or no usable CUDA device.
static Allocator& pinned_allocator(Device device, const char* op) {
  KILN_CHECK(device.is_cpu(),
             "{}: only CPU tensors can be pinned (pinned memory is host memory that a GPU copies from and to "
             "directly); this one would be on {}. Drop pinned_memory(true) for device tensors",
             op, device.str());
  KILN_CHECK(cuda::is_available(),
             "{}: pinned memory is page-locked host memory for copies to and from a CUDA device, and no CUDA "
             "device is usable here (cuda::is_available() is false); use ordinary CPU tensors",
             op);
  Allocator* pinned = cuda::backend().host_allocator();
  KILN_CHECK(pinned != nullptr, "{}: the CUDA backend has no pinned host allocator", op);
  return *pinned;
}

Tensor empty_tensor(const Shape& shape, const TensorOptions& options) {
  if (!options.pinned_memory()) return empty_tensor(shape, options.dtype(), options.device());
  return allocate_tensor(shape, options.dtype(), Device::cpu(), pinned_allocator(options.device(), "pinned_memory"));
}

Tensor empty_pinned(const Shape& shape, DType dtype, const char* op) {
  return allocate_tensor(shape, dtype, Device::cpu(), pinned_allocator(Device::cpu(), op));
}

void check_pinned_memory(const TensorOptions& options) {
  if (options.pinned_memory()) (void)pinned_allocator(options.device(), "pinned_memory");
}

bool fused_backward() { return fusion_enabled() && !GradMode::is_enabled(); }

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.device() == b.device(),
             "{}: expected all tensors on one device, got {} and {}; move one with .to(device)", op,
             a.device().str(), b.device().str());
}

void check_class_targets(const Tensor& target, int64_t classes, std::optional<int64_t> ignore_index, const char* op,
                         int64_t low) {
  if (target.numel() == 0) return;
  NoGradGuard no_grad;
  Tensor bad = target.lt(low).logical_or(target.ge(classes));
  if (ignore_index) bad = bad.logical_and(target.ne(*ignore_index));
  if (!bad.any().item<bool>()) return;
  const int64_t at = bad.reshape({-1}).to(kInt64).argmax().item<int64_t>();
  KILN_FAIL("{}: target {} at position {} is out of range: it must be in [{}, {}){}", op,
            target.reshape({-1})[at].item<int64_t>(), at, low, classes,
            ignore_index ? fmt::format(" or equal to ignore_index ({})", *ignore_index) : std::string());
}

int first_expanded_dim(const Tensor& t) {
  for (int d = 0; d < t.dim(); ++d) {
    if (t.sizes()[d] > 1 && t.strides()[d] == 0) return d;
  }
  return -1;
}

void check_no_internal_overlap(const Tensor& self, const char* op) {
  const int d = first_expanded_dim(self);
  KILN_CHECK(d < 0,
             "{}: more than one element of the written tensor refers to one memory location (dim {} is "
             "expanded); clone() it before writing",
             op, d);
}

void throw_undefined_write(const char* op) {
  KILN_FAIL("{}: the tensor to change in place is undefined (default-constructed, or a grad that was never "
            "computed); give it values first, e.g. with zeros(shape)",
            op);
}

void throw_inference_write(const char* op) {
  KILN_FAIL("{}: this is an inference tensor (made in inference mode), and an in-place change of one is "
            "allowed only inside an InferenceMode scope; clone() it to get a normal tensor first",
            op);
}

std::pair<int64_t, int64_t> element_span(const Shape& sizes, const Shape& strides, int64_t offset) {
  int64_t lo = offset, hi = offset;
  for (int d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return {0, -1};
    (strides[d] < 0 ? lo : hi) += (sizes[d] - 1) * strides[d];
  }
  return {lo, hi};
}
static std::pair<int64_t, int64_t> element_span(const Tensor& t) {
  return element_span(t.sizes(), t.strides(), t.storage_offset());
}

Tensor unaliased(const Tensor& operand, const Tensor& self) {
  if (operand.impl()->storage != self.impl()->storage) return operand;
  bool same_layout = operand.storage_offset() == self.storage_offset() && operand.sizes() == self.sizes() &&
                     operand.strides() == self.strides() && operand.dtype() == self.dtype();
  if (same_layout) return operand;  // x.add_(x): each element reads itself before writing it
  auto [a_lo, a_hi] = element_span(operand);
  auto [b_lo, b_hi] = element_span(self);
  if (a_hi < b_lo || b_hi < a_lo) return operand;  // disjoint parts of one buffer
  NoGradGuard no_grad;
  return operand.clone();
}

namespace memory {
MemoryStats stats(Device device) { return backend_for(device).allocator(device.index).stats(); }
void reset_peak(Device device) { backend_for(device).allocator(device.index).reset_peak(); }
void empty_cache(Device device) { backend_for(device).allocator(device.index).empty_cache(); }
}  // namespace memory

void pair_arg(const Shape& s, const char* op, const char* name, int64_t min, int64_t& h, int64_t& w) {
  KILN_CHECK(s.size() == 1 || s.size() == 2, "{}: {} must have one or two elements, got {}", op, name, s.str());
  h = s[0];
  w = s.size() == 2 ? s[1] : s[0];
  KILN_CHECK(h >= min && w >= min, "{}: {} must be {}, got {}", op, name, min == 0 ? "non-negative" : "positive",
             s.str());
}

std::array<int64_t, 3> triple_arg(const Shape& v, const char* op, const char* name, int64_t min) {
  KILN_CHECK(v.size() == 1 || v.size() == 3, "{}: {} must have one or three elements, got {}", op, name, v.str());
  std::array<int64_t, 3> t{v[0], v[v.size() == 3 ? 1 : 0], v[v.size() == 3 ? 2 : 0]};
  for (int64_t e : t) {
    KILN_CHECK(e >= min, "{}: {} must be {}, got {}", op, name, min == 0 ? "non-negative" : "positive", v.str());
  }
  return t;
}

std::vector<int64_t> dims_arg(const Shape& v, int dims, const char* op, const char* name, int64_t min) {
  if (dims == 3) {
    const std::array<int64_t, 3> t = triple_arg(v, op, name, min);
    return {t.begin(), t.end()};
  }
  if (dims == 2) {
    std::vector<int64_t> hw(2);
    pair_arg(v, op, name, min, hw[0], hw[1]);
    return hw;
  }
  KILN_CHECK(v.size() == 1 && v[0] >= min, "{}: {} must be one number >= {}, got {}", op, name, min, v.str());
  return {v[0]};
}

}  // namespace kiln

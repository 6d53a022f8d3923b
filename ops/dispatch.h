// ops/dispatch.h: the helpers every op uses: the backend of a device (the one switch), the raw View of
// a tensor, broadcast views, and output allocation.
#pragma once

#include <array>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/grad_mode.h"
#include "core/tensor.h"

namespace kiln {

Backend& backend_for(Device device);  // cpu::backend() or cuda::backend()
Stream stream_for(Device device);     // the device's current stream

View view_of(const Tensor& t);
// view_of(t), or an absent view (data == nullptr) for an undefined tensor: an optional operand.
inline View view_or_none(const Tensor& t) { return t.defined() ? view_of(t) : View{}; }
// t's view stretched to `shape` (right-aligned, stride 0 where t has size 1 or no dim).
View broadcast_view(const Tensor& t, const Shape& shape);

// The element count of `shape`, whose sizes must be non-negative: an Error naming `op` when one is
// negative or the product does not fit in 64 bits. For the ops that make a shape from numbers
// (empty, expand, as_strided).
int64_t checked_numel(const Shape& shape, const char* op);

// A new contiguous tensor, uninitialized, on `device`.
Tensor empty_tensor(const Shape& shape, DType dtype, Device device);
// The same from options' dtype and device, in pinned host memory when options.pinned_memory() (an
// Error unless the device is the CPU and a CUDA device is usable); requires_grad is the caller's.
Tensor empty_tensor(const Shape& shape, const TensorOptions& options);
// A new contiguous CPU tensor in pinned host memory; `op` names the caller in the Error raised
// where no CUDA device is usable.
Tensor empty_pinned(const Shape& shape, DType dtype, const char* op);
// The Errors empty_tensor(shape, options) would raise for options' pinned_memory, without allocating.
void check_pinned_memory(const TensorOptions& options);

// Whether a backward formula may run as one fused kernel: fusion is on (set_fusion) and the backward
// is not itself being differentiated (create_graph), which needs it written as ops.
bool fused_backward();

// "add: expected all tensors on one device, got cpu and cuda:0 (move one with .to(device))"
void check_same_device(const char* op, const Tensor& a, const Tensor& b);

// Class-index targets (cross_entropy, nll_loss, the margin losses): each in [low, classes) (low is 0,
// or -1 where a -1 ends a list of targets: multilabel_margin_loss) or equal to ignore_index where one
// is given, else an Error naming `op`, the first bad target and its position. One pass, and a sync on
// a GPU (whose kernels cannot throw, and whose gather would wrap a negative index).
void check_class_targets(const Tensor& target, int64_t classes, std::optional<int64_t> ignore_index, const char* op,
                         int64_t low = 0);

// In-place writes. The written tensor must not have two elements at one memory location (an
// expanded tensor); an operand that shares memory with it other than element for element (x.t()
// read while x is written) is read from a copy instead.
void check_no_internal_overlap(const Tensor& self, const char* op);
// The first dim along which t is expanded (size > 1, stride 0), or -1 if there is none.
int first_expanded_dim(const Tensor& t);
Tensor unaliased(const Tensor& operand, const Tensor& self);
// Every in-place entry point calls this before it writes: the tensor written must be defined, and
// an inference tensor can be written only in inference mode (Note [inference mode] in
// core/grad_mode.h).
[[noreturn]] void throw_undefined_write(const char* op);
[[noreturn]] void throw_inference_write(const char* op);
inline void check_inference_write(const Tensor& self, const char* op) {
  if (self.impl() == nullptr) [[unlikely]] throw_undefined_write(op);
  if (self.impl()->storage->inference && !InferenceMode::is_enabled()) [[unlikely]] throw_inference_write(op);
}
// The range of storage elements [lo, hi] a layout reaches (hi < lo when it has no elements).
std::pair<int64_t, int64_t> element_span(const Shape& sizes, const Shape& strides, int64_t offset);

// A 2-D op's size argument (kernel_size, stride, padding, dilation): one number for both dims, or two,
// each >= min, into h and w; else an Error naming op and argument. The 2-D convolutions and poolings.
void pair_arg(const Shape& s, const char* op, const char* name, int64_t min, int64_t& h, int64_t& w);
// A 3-D op's size argument (kernel_size, stride, padding, ...): one number for all three dims, or
// three, each >= min; else an Error naming op and argument. conv3d, conv_transpose3d, the 3-D poolings.
std::array<int64_t, 3> triple_arg(const Shape& v, const char* op, const char* name, int64_t min);
// A size argument of a 1-, 2- or 3-D op as `dims` numbers: one number >= min for 1 dim, else pair_arg's
// or triple_arg's rule. max_unpool1d/2d/3d and fractional_max_pool2d/3d.
std::vector<int64_t> dims_arg(const Shape& v, int dims, const char* op, const char* name, int64_t min);

// GELU's pieces shared by gelu, bias_gelu (elementwise.cpp) and addmm_gelu (linalg.cpp):
// whether `approximate` ("none" or "tanh", else an Error naming `op`) is the tanh form;
// grad * gelu'(x), one fused pass while fusion is on and no create_graph backward is running,
// else the formula as differentiable ops; and whether bias_gelu runs as its one fused pass for
// inputs of `dtype` (fusion on, float32 or float64).
inline namespace ops {
bool parse_gelu_approximate(std::string_view approximate, const char* op);
Tensor gelu_backward(const Tensor& grad, const Tensor& x, bool tanh_form);
bool bias_gelu_fuses(DType dtype);
}  // namespace ops

}  // namespace kiln

// core/tensor.cpp: the Tensor methods that need no backend: dims, autograd fields, saved tensors.
#include "core/tensor.h"

#include <vector>

#include "core/grad_mode.h"
#include "core/rebind.h"
#include "core/saved_tensor.h"

namespace kiln {

void Tensor::throw_undefined_tensor() {
  KILN_FAIL("an undefined Tensor (default-constructed, or a grad that was never computed) was used where a "
            "tensor is needed; check .defined() first");
}

int64_t Tensor::size(int64_t dim) const {
  KILN_CHECK(this->dim() > 0, "size: a 0-dimensional tensor has no dim {}", dim);
  return get().sizes[wrap_dim(dim, this->dim(), "size")];
}
int64_t Tensor::stride(int64_t dim) const {
  KILN_CHECK(this->dim() > 0, "stride: a 0-dimensional tensor has no dim {}", dim);
  return get().strides[wrap_dim(dim, this->dim(), "stride")];
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  KILN_CHECK(is_leaf() || requires_grad,
             "requires_grad_: a non-leaf tensor (made by {}) always requires grad; use detach() "
             "to get a tensor without history",
             grad_fn()->name());
  KILN_CHECK(!requires_grad || is_floating(dtype()),
             "requires_grad_: only floating-point tensors can require gradients, this one is {}; "
             "convert it first, e.g. x.to(kFloat32)",
             dtype_name(dtype()));
  KILN_CHECK(!requires_grad || !is_inference() || InferenceMode::is_enabled(),
             "requires_grad_: setting requires_grad on an inference tensor (made in inference mode) is allowed "
             "only inside an InferenceMode scope; clone() it to get a normal tensor first");
  get().requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  return get().grad ? Tensor(get().grad) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    KILN_CHECK(grad.sizes() == sizes() && grad.dtype() == dtype() && grad.device() == device(),
               "set_grad: the gradient ({} {} on {}) must match the tensor ({} {} on {})",
               grad.sizes().str(), dtype_name(grad.dtype()), grad.device().str(), sizes().str(),
               dtype_name(dtype()), device().str());
    // As PyTorch ("can't assign Variable as its own grad"): backward would accumulate into the tensor.
    KILN_CHECK(!grad.is_same(*this), "set_grad: a tensor cannot be its own gradient; pass a copy (t.clone())");
  }
  get().grad = grad.impl_ptr();
}

// d reads s's storage with s's layout and dtype, uncounted as a view (the callers count it again).
static void read_data_of(TensorImpl* d, const TensorImpl* s) {
  d->uncount_view();
  d->storage = s->storage;
  d->sizes = s->sizes;
  d->strides = s->strides;
  d->offset = s->offset;
  d->dtype = s->dtype;
}

void Tensor::set_data(const Tensor& new_data) const {
  TensorImpl* d = &get();
  KILN_CHECK(new_data.defined(), "set_data: the new data is an undefined tensor");
  const TensorImpl* s = new_data.impl();
  // As PyTorch: only floating data can require grad (a backward and an optimizer step would pass
  // an int64 parameter by without a word).
  KILN_CHECK(!d->requires_grad || is_floating(s->dtype),
             "set_data: this tensor requires grad, so its data must be floating, not {}; call requires_grad_(false) "
             "first", dtype_name(s->dtype));
  if (s == d) return;
  const bool same_kind = d->dtype == s->dtype && d->device() == s->device();
  const bool counted = d->counts_as_view;  // the view count moves with the data (a parameter that is a view)
  read_data_of(d, s);
  if (counted) d->count_as_view();
  d->view_base.reset();  // no longer reads its base's storage (Note [views and in-place ops], ops/views.cpp)
  if (!same_kind) d->grad_accumulator.reset();
}

void rebind(const Tensor& handle, const Tensor& value) {
  KILN_CHECK(handle.defined() && value.defined(), "rebind: both the handle and the value must be defined tensors");
  TensorImpl* d = handle.impl();
  const TensorImpl* s = value.impl();
  if (d == s) return;
  read_data_of(d, s);
  if (s->counts_as_view) d->count_as_view();
  d->is_view = s->is_view;
  d->view_base = s->view_base;
  d->view_version = s->view_version;
  d->requires_grad = s->requires_grad;
  d->grad_fn = s->grad_fn;
  d->output_nr = s->output_nr;
  d->retains_grad = false;
  d->grad.reset();
  d->grad_accumulator.reset();
  d->leaf_hooks.clear();
  d->post_accumulate_hooks.clear();
}

namespace autograd::detail {
void (*make_view_grad_fn)(const Tensor& view) = nullptr;
}

void Tensor::refresh_view_grad_fn() const {
  KILN_CHECK(autograd::detail::make_view_grad_fn != nullptr, "internal: a view exists but ops/views.cpp is not linked");
  autograd::detail::make_view_grad_fn(*this);
}

namespace autograd {

// A new TensorImpl on the same storage and layout, with no autograd history.
static Tensor alias_of(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->sizes = t.sizes();
  impl->strides = t.strides();
  impl->offset = t.storage_offset();
  impl->dtype = t.dtype();
  impl->is_view = true;
  return Tensor(std::move(impl));
}

namespace {
thread_local std::vector<SavedTensorHooks> hook_stack;
}

SavedTensorHooksGuard::SavedTensorHooksGuard(SavedTensorHooks hooks) {
  KILN_CHECK(hooks.pack != nullptr && hooks.unpack != nullptr,
             "SavedTensorHooksGuard: both hooks, pack and unpack, must be callable (one is empty)");
  hook_stack.push_back(std::move(hooks));
}
SavedTensorHooksGuard::~SavedTensorHooksGuard() { hook_stack.pop_back(); }

SavedTensor::SavedTensor(const Tensor& t, bool is_output, uint32_t output_nr) {
  if (!t.defined()) return;
  KILN_CHECK(!t.is_inference(),
             "an inference tensor (made in inference mode) cannot be saved for backward, as this op's "
             "backward needs it; clone() it outside inference mode to get a normal tensor, and use that");
  storage_ = t.impl()->storage;
  saved_version_ = t.impl()->storage->version;
  is_output_ = is_output;
  // An output saved before its node is attached will require grad once it is (see the Note).
  requires_grad_ = t.requires_grad() || (is_output && is_floating(t.dtype()) && GradMode::is_enabled());
  // An output's node, and so its place, may not be set yet: the saver says which output it is.
  output_nr_ = is_output && !t.grad_fn() ? output_nr : t.output_nr();
  // A leaf that requires grad (a parameter) is kept as it is, hooks or not: it stays alive anyway,
  // and only the tensor itself can carry double backward to its .grad().
  const bool parameter = t.is_leaf() && t.requires_grad();
  bool hooked = !hook_stack.empty() && !parameter;
  if (is_output) {
    grad_fn_ = t.grad_fn();
    data_ = alias_of(t);  // no grad_fn: see Note [saving outputs]
  } else if (parameter || (hooked && !t.grad_fn())) {
    data_ = t;  // a pack hook is given a leaf itself, a non-leaf as an alias without grad_fn (below)
  } else if (hooked) {
    grad_fn_strong_ = t.grad_fn();  // unpack re-attaches it to what unpack_hook_ returns
    data_ = alias_of(t);
  } else {
    // An alias, not the caller's TensorImpl, whose handle may later be pointed at other data
    // (core/rebind.h: weight_norm recomputes a layer's weight into the layer's handle before each
    // forward, while the graphs of earlier forwards still need theirs). It carries t's grad_fn
    // itself (no cycle: that is an earlier node), so unpack gives it back as it is.
    data_ = alias_of(t);
    data_.impl()->grad_fn = t.grad_fn();
    data_.impl()->output_nr = t.output_nr();
  }
  if (hooked) {
    data_ = hook_stack.back().pack(data_);
    KILN_CHECK(data_.defined(), "the saved-tensor pack hook returned an undefined tensor; it must return what "
               "unpack can turn back into the tensor it was given");
    unpack_hook_ = hook_stack.back().unpack;
  }
}

Tensor SavedTensor::unpack(const char* op) const {
  if (!data_.defined()) return {};
  auto storage = storage_.lock();
  KILN_CHECK(!storage || storage->version == saved_version_,
             "{}: a tensor it saved for backward was modified by an in-place operation: it is at "
             "version {}, it was at version {} when saved. Use the out-of-place form (x = x.mul(y) "
             "instead of x.mul_(y)) or clone() the tensor before changing it",
             op, storage ? storage->version : 0, saved_version_);
  Tensor t = unpack_hook_ ? unpack_hook_(data_) : data_;
  // What an unpack hook returns stands for the saved tensor: PyTorch raises a TypeError for nothing.
  KILN_CHECK(!unpack_hook_ || t.defined(),
             "{}: the saved-tensor unpack hook returned an undefined tensor; it must return the tensor that "
             "pack was given (or one of its shape, dtype and values)",
             op);
  std::shared_ptr<Node> fn = grad_fn_strong_;
  if (is_output_) {
    fn = grad_fn_.lock();
    if (!fn && current_node() != nullptr) fn = current_node()->shared_from_this();
  }
  if (requires_grad_ && fn) {
    Tensor attached = alias_of(t);
    attached.impl()->grad_fn = std::move(fn);
    attached.impl()->output_nr = output_nr_;
    return attached;
  }
  return t;
}

}  // namespace autograd
}  // namespace kiln

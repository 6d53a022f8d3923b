// core/tensor_impl.h: TensorImpl, what a Tensor handle points to.
//
//   storage ──► one buffer, shared with every view of it
//   sizes, strides, offset (in elements), dtype: how this tensor reads that buffer
//   autograd fields: requires_grad, grad, grad_fn (the Node that made it), output_nr
//
// A view is a second TensorImpl on the same Storage. The autograd fields are declared here because
// ops/ records graphs, but the Node type they point to is only an interface (core/node.h); the
// engine that runs the graph lives in autograd/.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace kiln {

class Tensor;
namespace autograd {
struct Node;
}

using TensorHook = std::function<Tensor(const Tensor&)>;
// Runs on a leaf after its .grad() has been updated by a backward (PyTorch's post-accumulate-grad hook).
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

struct TensorImpl {
  TensorImpl() = default;
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;
  ~TensorImpl() {
    if (counts_as_view && storage) storage->live_views.fetch_sub(1, std::memory_order_relaxed);
  }
  // Makes this a view that its storage counts while it lives (after `storage` is set). A view of an
  // inference tensor is not counted: autograd never records an in-place op on one, which is all the
  // count is for (Note [inference mode] in core/grad_mode.h).
  void count_as_view() {
    is_view = true;
    if (storage->inference) return;
    counts_as_view = true;
    storage->live_views.fetch_add(1, std::memory_order_relaxed);
  }
  // Undoes count_as_view; the tensor stays a view.
  void uncount_view() {
    if (!counts_as_view) return;
    counts_as_view = false;
    storage->live_views.fetch_sub(1, std::memory_order_relaxed);
  }

  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = kFloat32;

  // --- autograd ---
  bool requires_grad = false;  // leaves only; a non-leaf requires grad iff it has a grad_fn
  bool retains_grad = false;
  bool is_view = false;  // shares storage with another tensor (made by a view op, or detach of a view)
  bool counts_as_view = false;  // counted in storage->live_views (count_as_view)
  uint32_t output_nr = 0;                      // which output of grad_fn this tensor is
  std::shared_ptr<autograd::Node> grad_fn;     // null for leaves
  std::weak_ptr<autograd::Node> grad_accumulator;  // a leaf's AccumulateGrad, made on first use
  std::shared_ptr<TensorImpl> grad;
  // (handle, hook): run on a leaf's gradient before it is accumulated
  std::vector<std::pair<uint64_t, TensorHook>> leaf_hooks;
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> post_accumulate_hooks;  // (handle, hook)

  // --- differentiable views (Note [views and in-place ops] in ops/views.cpp) ---
  // Set on a view made with grad mode on: the tensor at the root of its chain of views (never itself
  // such a view). An in-place op on this view rewrites the base's history too, and when the storage's
  // version moves past view_version (an in-place op on the base or on another of its views), this
  // view's grad_fn is made anew from the base's on its next use (Tensor::grad_fn).
  std::shared_ptr<TensorImpl> view_base;
  uint64_t view_version = 0;  // the storage's version when grad_fn was last set

  Device device() const { return storage->device; }
  int64_t numel() const { return sizes.numel(); }
  void* data() const {
    return static_cast<char*>(storage->data) + offset * itemsize(dtype);
  }
  bool is_contiguous() const;
};

}  // namespace kiln

// ops/record.h: how an op records itself on the autograd tape.
//
// An op that has an input requiring grad (and grad mode on) calls record() with its inputs, its
// outputs and a backward formula: a lambda from the output gradients to the input gradients,
// written with ops:: calls so that it runs on any device and can itself be differentiated
// (create_graph). Typical use, in ops/elementwise.cpp:
//
//   Tensor y = unary_forward(UnaryOp::Exp, x);
//   if (should_record(x)) {
//     record("ExpBackward", {x}, {y}, [y = SavedTensor(y, true)](const Grads& g) -> TensorList {
//       return {g[0] * y.unpack("ExpBackward")};  // d exp(x)/dx = exp(x)
//     });
//   }
//
// The engine (autograd/engine.cpp) runs the nodes; AccumulateGrad ends every path at a leaf.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "core/grad_mode.h"
#include "core/node.h"
#include "core/saved_tensor.h"
#include "core/tensor.h"

namespace kiln::autograd {

// What a backward formula receives: one gradient per forward output (undefined where none
// arrived), and which inputs need a gradient (compute only those; return {} for the rest).
struct Grads {
  TensorList grads;
  std::vector<bool> needs;
  const Tensor& operator[](size_t i) const { return grads[i]; }
  bool needs_grad(size_t i) const { return needs[i]; }
};

inline bool should_record(const Tensor& a) { return GradMode::is_enabled() && a.requires_grad(); }
inline bool should_record(const Tensor& a, const Tensor& b) {
  return GradMode::is_enabled() && (a.requires_grad() || (b.defined() && b.requires_grad()));
}
bool should_record(const std::vector<Tensor>& inputs);

// Pieces of FunctionNode::apply that do not depend on the lambda's type (ops/record.cpp).
namespace detail {
void check_not_released(bool has_formula, const char* name);
Grads grads_for(TensorList&& grads, const std::vector<Edge>& next_edges);
// A gradient hook may change a gradient's values, not its dtype, device or shape (LibTorch's
// check_variable_result): returns `result`, or throws an Error that says what changed.
Tensor checked_hook_result(const Tensor& grad, Tensor result);
}  // namespace detail

// A node whose backward is a lambda F, held in the node itself: recording an op makes one
// allocation for both (Note [the node holds its lambda], ops/record.cpp). release_saved() destroys
// the lambda and what it captured; a lambda that captured only trivially destructible values
// (dtypes, devices, shapes: no tensor), or one recorded with record_no_tensors (vectors of sizes),
// holds nothing to free and is kept, so its node can run again, as PyTorch runs again a node that
// saved no tensors.
template <typename F, bool kHoldsNoTensors = false>
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, F fn) : name_(name), fn_(std::move(fn)) {}
  const char* name() const override { return name_; }
  TensorList apply(TensorList&& grads) override {
    detail::check_not_released(fn_.has_value(), name_);
    CurrentNodeGuard running(this);  // outputs this node saved are re-attached to it
    TensorList out = (*fn_)(detail::grads_for(std::move(grads), next_edges));
    out.resize(next_edges.size());
    return out;
  }
  void release_saved() override {
    if constexpr (!kHoldsNoTensors && !std::is_trivially_destructible_v<F>) fn_.reset();
  }

 private:
  const char* name_;
  std::optional<F> fn_;
};

// The end of every path at a leaf: runs the leaf's hooks and adds the gradient into leaf.grad().
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) { num_outputs = 1; }
  const char* name() const override { return "AccumulateGrad"; }
  TensorList apply(TensorList&& grads) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// Where the gradient of `t` goes: its grad_fn, its leaf's AccumulateGrad, or nowhere.
Edge gradient_edge(const Tensor& t);
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);

// Attaches `node` to `outputs` (each gets grad_fn and its output_nr) with edges to `inputs`.
void attach(const std::shared_ptr<Node>& node, std::span<const Tensor> inputs, std::span<const Tensor> outputs);

// Records a FunctionNode named `name` whose backward is `fn`, a callable from const Grads& to one
// gradient per input. The braced form, record(name, {a, b}, {out}, fn), builds no vectors.
template <typename F>
void record(const char* name, std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs, F fn) {
  attach(std::make_shared<FunctionNode<F>>(name, std::move(fn)), {inputs.begin(), inputs.size()},
         {outputs.begin(), outputs.size()});
}
template <typename F>
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, F fn) {
  attach(std::make_shared<FunctionNode<F>>(name, std::move(fn)), inputs, outputs);
}
// record() for a backward whose captures hold no tensor, only values such as vectors of sizes or
// offsets (cat, split, pad): its node survives a backward without retain_graph and can run again.
template <typename F>
void record_no_tensors(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                       F fn) {
  attach(std::make_shared<FunctionNode<F, true>>(name, std::move(fn)), inputs, outputs);
}

// In-place ops with autograd: refuses leaves that require grad and views of them, expanded views,
// views made under no_grad, and tensors whose storage has such views alive (see ops/elementwise.cpp
// and Note [views and in-place ops] in ops/views.cpp).
void check_inplace(const Tensor& self, const char* op);
// After an in-place op recorded as `result`: self takes result's place in the graph, and a gradient
// that self retains (retain_grad) is from now on the one that reaches the new place, as PyTorch's.
// A differentiable view's base also takes the change into its history (record_copy_slices).
void rebase_history(const Tensor& self, const Tensor& result);
// The base of the differentiable view `view` gets a CopySlices node: its new value is its old one with
// the view's elements replaced by `result` (ops/views.cpp).
void record_copy_slices(const Tensor& view, const Tensor& result);
namespace detail {
// Makes the new TensorImpl `view`, on base's storage, a view of base: a differentiable one (holding
// the root base) with grad mode on, else one counted in Storage::live_views (ops/views.cpp).
void mark_view(TensorImpl& view, const Tensor& base);
}  // namespace detail
// retain_grad's hook on t's grad_fn: adds the gradient arriving there into t.grad(), as long as
// t's grad_fn is still that node (an in-place op moves t elsewhere; see rebase_history).
void add_retain_grad_hook(const Tensor& t);

}  // namespace kiln::autograd

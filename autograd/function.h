// autograd/function.h: user-defined differentiable functions, as LibTorch's torch::autograd::Function:
//
//   struct Cube : autograd::Function<Cube> {
//     static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x) {
//       ctx->save_for_backward({x});
//       return x * x * x;
//     }
//     static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
//       Tensor x = ctx->get_saved_variables()[0];
//       return {g[0] * 3 * x * x};
//     }
//   };
//   Tensor y = Cube::apply(x);
//
// forward runs with recording off and returns a Tensor or a TensorList; backward returns one gradient
// per forward argument, where a TensorList argument counts as one argument per element, as in
// LibTorch (an undefined Tensor for arguments that are not tensors or need none; extra undefined ones
// at the end are dropped). As in PyTorch: backward gets zeros for outputs that received no gradient
// (unless ctx->set_materialize_grads(false)), a gradient that broadcasts to its argument's shape is
// summed down to it, one of another dtype is cast to the argument's, and a node that saved no tensor
// can run backward again. An output that is an input itself comes back as a view of it (autograd then
// refuses in-place changes to either), unless forward changed that input in place and said so with
// ctx->mark_dirty({x}): then the output is x itself, which takes the node as its grad_fn (as an
// in-place op's result does; a leaf that requires grad, a view or a tensor with views is an Error).
// Outputs passed to ctx->mark_non_differentiable get no grad_fn (an integer output never has one); an
// input returned as such an output comes back detached.
#pragma once

#include <any>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/grad_mode.h"
#include "core/node.h"
#include "core/saved_tensor.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "ops/record.h"  // gradient_edge, should_record

namespace kiln::autograd {

class AutogradContext {
 public:
  void save_for_backward(TensorList tensors) { to_save_ = std::move(tensors); }
  TensorList get_saved_variables() const;
  bool needs_input_grad(size_t i) const { return i < needs_.size() && needs_[i]; }
  // forward changed these inputs in place and returns them (see the top of this file).
  void mark_dirty(const TensorList& inputs) { dirty_ = inputs; }
  // These outputs get no gradient (e.g. an index or mask output).
  void mark_non_differentiable(const TensorList& outputs) { non_differentiable_ = outputs; }
  // false: backward gets an undefined Tensor, not zeros, for an output that received no gradient.
  void set_materialize_grads(bool value) { materialize_grads_ = value; }
  std::unordered_map<std::string, std::any> saved_data;  // anything else backward needs

 private:
  template <class T> friend struct Function;
  template <class T> friend class CppNode;
  void wire_saved(const TensorList& outputs);
  static bool contains(const TensorList& list, const Tensor& t) {
    for (const auto& x : list) {
      if (x.defined() && x.is_same(t)) return true;
    }
    return false;
  }
  TensorList to_save_;
  std::vector<SavedTensor> saved_;
  std::vector<bool> needs_;
  TensorList dirty_;               // cleared once the outputs are wired
  TensorList non_differentiable_;  // likewise
  bool materialize_grads_ = true;
  bool released_ = false;
};

template <class T>
class CppNode final : public Node {
 public:
  const char* name() const override { return "CppFunction"; }
  TensorList apply(TensorList&& grads) override {
    KILN_CHECK(!ctx.released_,
               "CppFunction: trying to backward through the graph a second time; pass retain_graph=true "
               "to the first backward()");
    ctx.needs_.resize(next_edges.size());
    for (size_t i = 0; i < next_edges.size(); ++i) ctx.needs_[i] = next_edges[i].valid();
    for (size_t i = 0; ctx.materialize_grads_ && i < grads.size() && i < outputs.size(); ++i) {
      const Input& o = outputs[i];
      if (!grads[i].defined() && o.defined) grads[i] = zeros(o.shape, TensorOptions(o.dtype).device(o.device));
    }
    TensorList out = T::backward(&ctx, std::move(grads));
    while (out.size() > next_edges.size() && !out.back().defined()) out.pop_back();
    KILN_CHECK(out.size() == next_edges.size(),
               "CppFunction: backward returned {} gradients but forward took {} arguments (return one per "
               "argument, one per element of a TensorList argument, undefined for those that need none)",
               out.size(), next_edges.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].defined() || !next_edges[i].valid()) continue;
      const Input& in = inputs[i];
      if (out[i].sizes() != in.shape && out[i].dim() >= in.shape.size()) {
        try {  // a gradient that broadcasts to the argument's shape is summed down to it, as PyTorch
          if (broadcast_shapes(in.shape, out[i].sizes(), "CppFunction") == out[i].sizes()) {
            out[i] = sum_to(out[i], in.shape);
          }
        } catch (const Error&) {
        }
      }
      KILN_CHECK(out[i].sizes() == in.shape,
                 "CppFunction: backward returned a gradient of shape {} for argument {} of shape {}",
                 out[i].sizes().str(), i, in.shape.str());
      KILN_CHECK(out[i].device() == in.device,
                 "CppFunction: backward returned a gradient on {} for argument {} on {}", out[i].device().str(), i,
                 in.device.str());
      if (out[i].dtype() != in.dtype) out[i] = out[i].to(in.dtype);  // as PyTorch: cast to the argument's dtype
    }
    return out;
  }
  void release_saved() override {  // a node that saved no tensor can run again, as in PyTorch
    if (ctx.saved_.empty()) return;
    ctx.saved_.clear();
    ctx.released_ = true;
  }
  AutogradContext ctx;
  struct Input {  // of a forward's tensor argument or output (defaults for the others)
    Shape shape;
    DType dtype = kFloat32;
    Device device = Device::cpu();
    bool defined = false;
  };
  std::vector<Input> inputs;
  std::vector<Input> outputs;  // the zeros for an output that received no gradient
};

template <class T>
struct Function {
  template <typename... Args>
  static auto apply(Args&&... args) {
    auto node = std::make_shared<CppNode<T>>();
    TensorList inputs;
    (append_inputs(inputs, args), ...);
    const bool record = should_record(inputs);
    for (const auto& t : inputs) node->ctx.needs_.push_back(record && t.defined() && t.requires_grad());
    using Out = decltype(T::forward(&node->ctx, std::forward<Args>(args)...));
    Out out = [&] {
      AutoGradMode off(false);
      return T::forward(&node->ctx, std::forward<Args>(args)...);
    }();
    AutogradContext& ctx = node->ctx;
    TensorList outputs;
    if constexpr (std::is_same_v<Out, Tensor>) outputs = {out};
    else outputs = out;
    for (const auto& d : ctx.dirty_) d.bump_version();  // first: forward has changed them, whatever follows
    for (const auto& d : ctx.dirty_) {
      KILN_CHECK(AutogradContext::contains(inputs, d) && AutogradContext::contains(outputs, d),
                 "CppFunction: a tensor passed to mark_dirty must be an argument of forward that forward changed "
                 "in place and returns as an output; return it (or do not mark it)");
      if (record) check_inplace(d, "CppFunction (mark_dirty)");
    }
    if (record) {
      for (const auto& t : inputs) {
        node->next_edges.push_back(gradient_edge(t));
        node->inputs.push_back(t.defined() ? typename CppNode<T>::Input{t.sizes(), t.dtype(), t.device(), true}
                                           : typename CppNode<T>::Input{});
      }
      node->num_outputs = static_cast<uint32_t>(outputs.size());
      // A dirty input's place in the graph before it took the node, restored if anything below throws
      // (a saved-tensor hook in wire_saved), so that it is not left on a half-built node.
      std::vector<std::pair<Tensor, Edge>> rebased;
      try {
        for (size_t i = 0; i < outputs.size(); ++i) {
          const Tensor& o = outputs[i];
          node->outputs.push_back(o.defined() ? typename CppNode<T>::Input{o.sizes(), o.dtype(), o.device(), true}
                                              : typename CppNode<T>::Input{});
          if (!outputs[i].defined()) continue;
          const bool dirty = AutogradContext::contains(ctx.dirty_, o);
          const bool differentiable = o.is_floating_point() && !AutogradContext::contains(ctx.non_differentiable_, o);
          if (AutogradContext::contains(inputs, o)) {  // forward returned an input as is
            if (!differentiable) {  // no gradient: a detached tensor sharing its data, as PyTorch's
              outputs[i] = o.detach();
              continue;
            }
            if (!dirty) outputs[i] = ops::alias(o);  // a view of it (a dirty one takes the node itself)
          }
          if (!differentiable) continue;
          if (dirty) rebased.emplace_back(outputs[i], Edge{outputs[i].grad_fn(), outputs[i].output_nr()});
          outputs[i].impl()->grad_fn = node;
          outputs[i].impl()->output_nr = static_cast<uint32_t>(i);
          if (dirty) outputs[i].impl()->view_version = outputs[i].impl()->storage->version;  // is current
          if (dirty && outputs[i].retains_grad()) add_retain_grad_hook(outputs[i]);  // as rebase_history
        }
        ctx.wire_saved(outputs);
        // A dirty differentiable view carries the change to its base's history, as rebase_history.
        for (const auto& entry : rebased)
          if (entry.first.impl()->view_base) record_copy_slices(entry.first, entry.first);
      } catch (...) {
        for (auto& [t, old] : rebased) {
          t.impl()->grad_fn = std::move(old.fn);
          t.impl()->output_nr = old.input_nr;
        }
        ctx.to_save_.clear();  // may hold outputs that point at the node: no cycle left behind
        ctx.dirty_.clear();
        ctx.non_differentiable_.clear();
        throw;
      }
      if constexpr (std::is_same_v<Out, Tensor>) out = outputs[0];
      else out = outputs;
    } else {
      ctx.wire_saved({});
    }
    ctx.dirty_.clear();
    ctx.non_differentiable_.clear();
    return out;
  }

 private:
  // One graph input per tensor argument, per element of a TensorList argument, and an undefined
  // one per other argument (its slot in backward's result), as LibTorch's extract_vars.
  template <typename A>
  static void append_inputs(TensorList& inputs, const A& a) {
    if constexpr (std::is_convertible_v<const A&, const Tensor&>) {
      inputs.push_back(a);
    } else if constexpr (std::is_convertible_v<const A&, const TensorList&>) {
      const TensorList& list = a;
      inputs.insert(inputs.end(), list.begin(), list.end());
    } else if constexpr (std::is_convertible_v<const A&, const std::optional<Tensor>&>) {
      const std::optional<Tensor>& opt = a;
      inputs.push_back(opt ? *opt : Tensor());
    } else {
      inputs.push_back(Tensor());
    }
  }
};

}  // namespace kiln::autograd

// ops/record.cpp: graph recording: edges, AccumulateGrad, and the function node.
#include "ops/record.h"

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace kiln::autograd {

bool should_record(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace detail {

void check_not_released(bool has_formula, const char* name) {
  KILN_CHECK(has_formula,
             "{}: trying to backward through the graph a second time (or after its saved tensors "
             "were freed). Pass retain_graph=true to the first backward() if you need to run it again",
             name);
}

Grads grads_for(TensorList&& grads, const std::vector<Edge>& next_edges) {
  Grads g{std::move(grads), std::vector<bool>(next_edges.size())};
  for (size_t i = 0; i < next_edges.size(); ++i) g.needs[i] = next_edges[i].valid();
  return g;
}

Tensor checked_hook_result(const Tensor& grad, Tensor result) {
  auto fail = [&](const char* what, const std::string& was, const std::string& got) {
    KILN_FAIL("register_hook: a hook changed the {} of the gradient (was {}, got {}); a hook may change a "
              "gradient's values, not its dtype, device or shape", what, was, got);
  };
  if (result.dtype() != grad.dtype()) {
    fail("dtype", std::string(dtype_name(grad.dtype())), std::string(dtype_name(result.dtype())));
  }
  if (result.device() != grad.device()) fail("device", grad.device().str(), result.device().str());
  if (result.sizes() != grad.sizes()) fail("shape", grad.sizes().str(), result.sizes().str());
  return result;
}

}  // namespace detail

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor g = std::move(grads[0]);
  // A leaf that stopped requiring grad after the forward (requires_grad_(false)) gets nothing, as in PyTorch.
  if (!g.defined() || !leaf_->requires_grad) return {};
  // Copied first: a hook may remove itself (or register another) while it runs.
  auto hooks = leaf_->leaf_hooks;
  for (const auto& [handle, hook] : hooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = detail::checked_hook_result(g, std::move(replaced));
  }
  Tensor leaf(leaf_);
  // The gradient has the shape the leaf had when the forward used it; set_data can have given the
  // leaf another since (PyTorch then stores a .grad of the old shape).
  const Shape& want = leaf.sizes();
  bool fits = g.dim() >= static_cast<int>(want.size());
  for (int d = 0; fits && d < static_cast<int>(want.size()); ++d) {
    const int64_t have = g.sizes()[g.dim() - static_cast<int>(want.size()) + d];
    fits = want[d] == have || want[d] == 1;
  }
  KILN_CHECK(fits, "backward: the gradient for a leaf of shape {} has shape {}: the leaf's data was replaced "
             "(set_data) with another shape after the forward that used it; replace it before that forward, or "
             "after the backward", want.str(), g.sizes().str());
  if (!leaf_->grad) {
    // Keep the incoming gradient if nothing else holds it; otherwise copy, so that later in-place
    // accumulation cannot write into a tensor someone else sees.
    bool exclusive = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 &&
                     g.is_contiguous() && g.sizes() == leaf.sizes();
    // With create_graph the gradient keeps its history, but it is still copied: the tensor that
    // arrives may be shared with another leaf's gradient or be an expanded view.
    Tensor stored = GradMode::is_enabled() ? g.clone() : (exclusive ? g.detach() : g.detach().clone());
    if (stored.sizes() != leaf.sizes()) stored = sum_to(stored, leaf.sizes()).contiguous();
    leaf_->grad = stored.impl_ptr();
  } else if (GradMode::is_enabled()) {  // create_graph: keep the sum differentiable
    leaf_->grad = add(Tensor(leaf_->grad), g).impl_ptr();
  } else {
    Tensor(leaf_->grad).add_(g);
  }
  // Copied first: a hook may remove itself (or register another) while it runs.
  auto post_hooks = leaf_->post_accumulate_hooks;
  for (const auto& [handle, hook] : post_hooks) hook(leaf);
  return {};
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  auto acc = leaf.impl()->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    leaf.impl()->grad_accumulator = acc;
  }
  return acc;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  return {grad_accumulator(t), 0};
}

// Note [the node holds its lambda]
// In op_overhead's `c = a + b` with grad, recording took about 0.3 us of the 0.69 us an add took on
// a 2-vCPU Zen 1 (0.38 us without grad), and each add made and freed four heap blocks for it: the
// node, a std::function holding the backward lambda (a block of its own once the captures pass 16
// bytes, as two InputInfos do), and vectors for the braced {a, b} and {out}. Now FunctionNode<F>
// holds the lambda, so make_shared puts both in one block with the control block, and the braced
// lists reach attach() as spans of their initializer lists: 0.56-0.58 us per add with grad. What is
// left per node is that block and its next_edges.
void attach(const std::shared_ptr<Node>& node, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  node->next_edges.reserve(inputs.size());
  for (const auto& t : inputs) node->next_edges.push_back(gradient_edge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) continue;
    outputs[i].impl()->grad_fn = node;
    outputs[i].impl()->output_nr = static_cast<uint32_t>(i);
  }
}

void check_inplace(const Tensor& self, const char* op) {
  KILN_CHECK(!(self.is_leaf() && self.requires_grad()),
             "{}: a leaf tensor that requires grad cannot be changed in place while grad mode is on; "
             "do the update inside a NoGradGuard (as optimizers do) or use the out-of-place form",
             op);
  if (self.impl()->view_base) {
    const Tensor base(self.impl()->view_base);
    KILN_CHECK(!(base.is_leaf() && base.requires_grad()),
               "{}: this tensor is a view of a leaf tensor that requires grad, and changing it in place "
               "would change the leaf; do the update inside a NoGradGuard or use the out-of-place form",
               op);
    check_no_internal_overlap(self, op);
  } else {
    KILN_CHECK(!self.impl()->is_view,
               "{}: this view was made under no_grad or in inference mode (or is a detached view, or an "
               "input a custom Function or checkpoint passed through), so autograd cannot carry an "
               "in-place change of it to its base; make the view with grad mode on, or clone() it first",
               op);
  }
  // Note [views taken without autograd]: a view made under no_grad has no history and no link to
  // its base (Note [views and in-place ops] in ops/views.cpp). After an in-place op that autograd
  // records on the base, it would read the new values but pass no gradient to the op's inputs:
  // `NoGradGuard g; v = buf[1];` then `buf.add_(w)` would leave w without the gradient of whatever
  // uses v. PyTorch rebuilds such a view's history; Kiln refuses the op while such a view is
  // alive. What a custom Function or checkpoint passed through (ops::alias) counts the same way.
  KILN_CHECK(self.impl()->storage->live_views.load(std::memory_order_relaxed) == 0,
             "{}: this tensor has live views made without autograd (under no_grad or in inference mode, by "
             "detach() of a view, or an input a custom Function or checkpoint passed through), and an "
             "in-place change recorded now would not reach their gradients; use the out-of-place form, or "
             "change the tensor once those views are gone",
             op);
}

void rebase_history(const Tensor& self, const Tensor& result) {
  TensorImpl& s = *self.impl();
  if (s.view_base) {
    record_copy_slices(self, result);
    s.view_version = s.storage->version;  // self's own grad_fn is set below; other views are remade
  }
  s.grad_fn = result.grad_fn();
  s.output_nr = result.output_nr();
  if (s.retains_grad && s.grad_fn) add_retain_grad_hook(self);
}

void add_retain_grad_hook(const Tensor& t) {
  std::weak_ptr<TensorImpl> weak = t.impl_ptr();  // weak: the node must not keep its own output alive
  const Node* node = t.impl()->grad_fn.get();
  t.impl()->grad_fn->pre_hooks.push_back({t.impl()->output_nr, [weak, node](const Tensor& g) -> Tensor {
                                            auto impl = weak.lock();
                                            if (!impl || impl->grad_fn.get() != node) return Tensor();
                                            Tensor copy = GradMode::is_enabled() ? g : g.detach().clone();
                                            impl->grad = impl->grad ? add(Tensor(impl->grad), copy).impl_ptr()
                                                                    : copy.impl_ptr();
                                            return Tensor();
                                          }});
}

}  // namespace kiln::autograd

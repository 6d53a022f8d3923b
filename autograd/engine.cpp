// autograd/engine.cpp: runs a recorded graph backward.
//
// 1. Walk the graph from the roots and count, for each node, how many edges point at it.
// 2. Start from the roots with their gradients; a node runs once every edge into it has delivered
//    (its count reaches 0). Among ready nodes the most recently created runs first, as in PyTorch.
// 3. A node's outputs are added into the input buffers of the nodes its edges point to.
// 4. Unless retain_graph, each node frees what it saved once it has run; running it again is the
//    "backward through the graph a second time" Error (a node that saved no tensor can run again).
// grad() runs the same walk but only the nodes that lead to the requested inputs, and reads the
// gradients arriving there instead of accumulating into leaves; backward(inputs=) runs that part of
// the graph too, and accumulates into the inputs' .grad() (their AccumulateGrad nodes run, and a
// non-leaf input retains its gradient, as PyTorch's run_backward does).
// With anomaly detection on, every node's outputs are checked for NaN as soon as it has run.
#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/autograd.h"
#include "ops/autocast.h"
#include "ops/flops.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln::autograd {

TensorList AutogradContext::get_saved_variables() const {
  TensorList out;
  for (const auto& s : saved_) out.push_back(s.unpack("CppFunction"));
  return out;
}

void AutogradContext::wire_saved(const TensorList& outputs) {
  for (const auto& t : to_save_) {
    bool is_output = false;
    for (const auto& o : outputs) is_output |= t.defined() && o.defined() && t.is_same(o);
    saved_.emplace_back(t, is_output);  // outputs without their grad_fn: see Note [saving outputs]
  }
  to_save_.clear();
}

namespace {

// queue_callback(): the callbacks of the backward running on this thread (a backward started from
// inside a hook gets its own list; a checkpoint's recompute joins the outer one's:
// detail::JoinOuterCallbacks).
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;
thread_local bool t_join_outer = false;

class CallbackScope {
 public:
  CallbackScope() : outer_(t_callbacks), joins_(t_join_outer && t_callbacks != nullptr) {
    t_join_outer = false;  // a backward started further in has its own, unless it joins too
    if (!joins_) t_callbacks = &mine_;
  }
  ~CallbackScope() { t_callbacks = outer_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
  void run() {  // in order; a callback may queue more. A joined list is the outer backward's to run.
    if (joins_) return;
    for (size_t i = 0; i < mine_.size(); ++i) {
      auto fn = std::move(mine_[i]);
      fn();
    }
    mine_.clear();
  }

 private:
  std::vector<std::function<void()>>* outer_;
  bool joins_;
  std::vector<std::function<void()>> mine_;
};

// grad() and backward(inputs=): the gradient arriving at (node, input_nr). Held, not borrowed: a
// leaf's AccumulateGrad is made on demand and held only weakly by the leaf, so for an input the
// outputs do not use, this is its only owner.
struct Capture {
  std::shared_ptr<Node> node;
  uint32_t input_nr;
};

// Whether the backward running on this thread is a grad() or a backward(inputs=)
// (detail::in_partial_backward).
thread_local bool t_partial = false;

std::atomic<bool> g_anomaly{false};

// Anomaly detection: an Error naming the first node output that holds a NaN.
void check_anomaly(const Node& n, const TensorList& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    if (!o.defined() || !o.is_floating_point() || o.numel() == 0) continue;
    if (!ops::isnan(o).any().item<bool>()) continue;
    const Edge e = i < n.next_edges.size() ? n.next_edges[i] : Edge{};
    KILN_FAIL("autograd anomaly detection: {} returned nan values in its {}th output (the gradient for input {} "
              "of its forward op{}{}). The forward op or its backward formula produced a NaN: look for a "
              "log, sqrt, division or pow at that point of the model",
              n.name(), i, i, e.valid() ? ", which goes on to " : "", e.valid() ? e.fn->name() : "");
  }
}

// captures: grad()'s (read the gradients arriving there) or backward(inputs=)'s (accumulate: the
// inputs' AccumulateGrad nodes run as well).
TensorList run(const std::vector<Edge>& roots, const TensorList& root_grads, bool keep_graph, bool create_graph,
               const std::vector<Capture>* captures, bool accumulate) {
  struct Partial {
    bool outer = t_partial;
    ~Partial() { t_partial = outer; }
  } partial;
  t_partial = captures != nullptr;
  // Backward ops run in the dtypes their forward ops ran in, so autocast is off during a backward;
  // its cast cache is dropped, since this backward frees the nodes of those casts.
  // See Note [autocast] in ops/autocast.h.
  autocast::clear_cache();
  autocast::StateGuard no_autocast(autocast::State{});
  flops::Paused not_counted;  // a flops count holds the forward's ops (ops/flops.h)
  // 1. Dependencies.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::shared_ptr<Node>> alive;  // keeps every node alive while we run
  std::vector<Node*> stack;
  for (const auto& e : roots) {
    if (alive.emplace(e.fn.get(), e.fn).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges) {
      if (!e.valid()) continue;
      ++deps[e.fn.get()];
      if (alive.emplace(e.fn.get(), e.fn).second) stack.push_back(e.fn.get());
    }
  }
  // grad() and backward(inputs=): a node is needed (runs) when one of its edges leads to a captured
  // gradient or to a needed node; a captured node itself only runs if it is needed so (PyTorch runs
  // nothing past the inputs: their nodes may have been freed by an earlier backward, and their hooks
  // must not fire).
  // Visiting the nodes in topological order (Kahn's algorithm on the counts above) and deciding in
  // reverse sees every node's children before the node: one pass.
  std::unordered_set<Node*> needed, captured_nodes;
  if (captures) {
    std::unordered_set<Node*> targets;
    for (const auto& c : *captures) targets.insert(c.node.get());
    std::unordered_map<Node*, int> left = deps;
    std::vector<Node*> topo;
    for (const auto& e : roots) {
      if (left[e.fn.get()] == 0 && std::find(topo.begin(), topo.end(), e.fn.get()) == topo.end()) {
        topo.push_back(e.fn.get());
      }
    }
    for (size_t i = 0; i < topo.size(); ++i) {
      for (const auto& e : topo[i]->next_edges) {
        if (e.valid() && --left[e.fn.get()] == 0) topo.push_back(e.fn.get());
      }
    }
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      bool need = false;
      for (const auto& e : (*it)->next_edges) {
        need = need || (e.valid() && (targets.count(e.fn.get()) != 0 || needed.count(e.fn.get()) != 0));
      }
      if (need) needed.insert(*it);
    }
    if (accumulate) {
      for (Node* t : targets) {
        if (dynamic_cast<AccumulateGrad*>(t) != nullptr) needed.insert(t);
      }
    }
    captured_nodes = std::move(targets);
  }
  TensorList captured(captures ? captures->size() : 0);

  // 2. Input buffers and the ready queue.
  std::unordered_map<Node*, TensorList> buffers;
  auto deliver = [&](Node* n, uint32_t slot, Tensor g) {
    TensorList& buf = buffers[n];
    if (buf.empty()) buf.resize(n->num_outputs);
    KILN_CHECK(slot < buf.size(), "autograd: internal error: gradient slot {} of {} ({} slots)", slot, n->name(),
               buf.size());
    if (!g.defined()) return;
    buf[slot] = buf[slot].defined() ? ops::add(buf[slot], g) : std::move(g);
  };
  auto later_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  for (size_t i = 0; i < roots.size(); ++i) deliver(roots[i].fn.get(), roots[i].input_nr, root_grads[i]);
  std::unordered_set<Node*> started;
  for (const auto& e : roots) {
    if (deps[e.fn.get()] == 0 && started.insert(e.fn.get()).second) ready.push(e.fn.get());
  }

  AutoGradMode mode(create_graph);
  CallbackScope callbacks;
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    TensorList grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(n->num_outputs);
    const bool runs = !captures || needed.count(n) != 0;
    // Copied first (when there are any): a hook may remove itself (or register another) while it runs.
    const std::vector<PreHook> hooks = n->pre_hooks.empty() ? std::vector<PreHook>{} : n->pre_hooks;
    for (const auto& hook : hooks) {
      if (!runs && captured_nodes.count(n) == 0) break;  // grad(): nodes past the inputs do nothing
      if (hook.output_nr < grads.size() && grads[hook.output_nr].defined()) {
        Tensor r = hook.fn(grads[hook.output_nr]);
        if (r.defined()) grads[hook.output_nr] = detail::checked_hook_result(grads[hook.output_nr], std::move(r));
      }
    }
    if (captures) {
      for (size_t i = 0; i < captures->size(); ++i) {
        const Capture& c = (*captures)[i];
        if (c.node.get() == n && c.input_nr < grads.size()) captured[i] = grads[c.input_nr];
      }
    }
    bool any_grad = false;
    for (const auto& g : grads) any_grad |= g.defined();
    TensorList outputs;
    // Under grad() a leaf's AccumulateGrad is never needed (.grad() stays as it is); under
    // backward(inputs=) only the inputs' are.
    if (any_grad && runs) {
      outputs = n->apply(std::move(grads));
      if (!keep_graph) n->release_saved();
      if (g_anomaly.load(std::memory_order_relaxed)) check_anomaly(*n, outputs);
    }
    outputs.resize(n->next_edges.size());
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.valid()) continue;
      deliver(e.fn.get(), e.input_nr, std::move(outputs[i]));
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
  callbacks.run();
  return captured;
}

// The given gradient for output i, of that shape, dtype and device: checked, and in its dtype as
// PyTorch casts it.
Tensor checked_root_grad(const Tensor& given, const Shape& shape, DType dtype, Device device, size_t i) {
  KILN_CHECK(given.sizes() == shape, "backward: the gradient for output {} has shape {} but the output has shape {}",
             i, given.sizes().str(), shape.str());
  KILN_CHECK(given.device() == device, "backward: the gradient for output {} is on {} but the output is on {}", i,
             given.device().str(), device.str());
  KILN_CHECK(given.is_floating_point(), "backward: the gradient for output {} is {}; it must be floating", i,
             dtype_name(given.dtype()));
  return given.dtype() == dtype ? given : given.to(dtype);
}

// The root gradient for `t`: the given one (checked_root_grad), or 1 for a single element.
Tensor root_grad(const Tensor& t, const Tensor& given, size_t i) {
  if (given.defined()) return checked_root_grad(given, t.sizes(), t.dtype(), t.device(), i);
  KILN_CHECK(t.numel() == 1,
             "backward: a gradient can be created implicitly only for single-element outputs; output {} has "
             "shape {}, so pass a gradient of that shape (e.g. ones_like(out))",
             i, t.sizes().str());
  return ones_like(t);
}

std::vector<Edge> root_edges(const TensorList& tensors, const char* op) {
  std::vector<Edge> roots;
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].defined() && tensors[i].requires_grad(),
               "{}: element {} of the outputs does not require grad and has no grad_fn: nothing to "
               "differentiate (was it computed under no_grad, or from tensors without requires_grad?)",
               op, i);
    roots.push_back(gradient_edge(tensors[i]));
  }
  return roots;
}

}  // namespace

void backward(const TensorList& tensors, const TensorList& grad_tensors, bool retain_graph, bool create_graph,
              const TensorList& inputs) {
  KILN_CHECK(grad_tensors.empty() || grad_tensors.size() == tensors.size(),
             "backward: got {} gradients for {} outputs", grad_tensors.size(), tensors.size());
  std::vector<Edge> roots = root_edges(tensors, "backward");
  TensorList grads;
  for (size_t i = 0; i < tensors.size(); ++i) {
    grads.push_back(root_grad(tensors[i], grad_tensors.empty() ? Tensor() : grad_tensors[i], i));
  }
  if (inputs.empty()) {
    run(roots, grads, retain_graph || create_graph, create_graph, nullptr, /*accumulate=*/true);
    return;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {  // all checked before any is changed
    KILN_CHECK(inputs[i].defined() && inputs[i].requires_grad(),
               "backward: inputs[{}] does not require grad, so no gradient can be accumulated into it; call "
               "requires_grad_() on it before computing, or leave it out of inputs", i);
  }
  std::vector<Capture> captures;
  for (const auto& input : inputs) {
    if (!input.is_leaf()) input.retain_grad();  // as PyTorch: its gradient lands in .grad()
    Edge e = gradient_edge(input);
    captures.push_back({std::move(e.fn), e.input_nr});
  }
  run(roots, grads, retain_graph || create_graph, create_graph, &captures, /*accumulate=*/true);
}

GradientEdge get_gradient_edge(const Tensor& t) {
  KILN_CHECK(t.defined() && t.requires_grad(),
             "get_gradient_edge: the tensor does not require grad and has no grad_fn: backward cannot start there");
  return {gradient_edge(t), t.sizes(), t.dtype(), t.device()};
}

void backward(const GradientEdge& root, const Tensor& grad) {
  KILN_CHECK(root.edge.valid(), "backward: the gradient edge is empty; take it with get_gradient_edge(t)");
  KILN_CHECK(grad.defined(), "backward: from a gradient edge, pass the gradient (of shape {})", root.shape.str());
  run({root.edge}, {checked_root_grad(grad, root.shape, root.dtype, root.device, 0)}, /*retain_graph=*/false,
      /*create_graph=*/false, nullptr, /*accumulate=*/true);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                std::optional<bool> retain_graph, bool create_graph, bool allow_unused) {
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
             "grad: got {} grad_outputs for {} outputs", grad_outputs.size(), outputs.size());
  std::vector<Edge> roots = root_edges(outputs, "grad");
  TensorList grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    grads.push_back(root_grad(outputs[i], grad_outputs.empty() ? Tensor() : grad_outputs[i], i));
  }
  std::vector<Capture> captures;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].defined() && inputs[i].requires_grad(),
               "grad: input {} does not require grad; call requires_grad_() on it before computing", i);
    Edge e = gradient_edge(inputs[i]);
    captures.push_back({std::move(e.fn), e.input_nr});
  }
  TensorList result = run(roots, grads, retain_graph.value_or(create_graph), create_graph, &captures,
                          /*accumulate=*/false);
  for (size_t i = 0; i < result.size(); ++i) {
    KILN_CHECK(result[i].defined() || allow_unused,
               "grad: input {} was not used to compute the outputs; pass allow_unused=true if that is expected", i);
  }
  return result;
}

bool detail::in_partial_backward() { return t_partial; }

detail::JoinOuterCallbacks::JoinOuterCallbacks() { t_join_outer = true; }
detail::JoinOuterCallbacks::~JoinOuterCallbacks() { t_join_outer = false; }

bool AnomalyMode::is_enabled() { return g_anomaly.load(std::memory_order_relaxed); }
void AnomalyMode::set_enabled(bool enabled) { g_anomaly.store(enabled, std::memory_order_relaxed); }

void queue_callback(std::function<void()> fn) {
  KILN_CHECK(t_callbacks != nullptr,
             "queue_callback: no backward is running on this thread; call it from a hook during backward");
  KILN_CHECK(fn != nullptr, "queue_callback: the callback is empty; pass a callable");
  t_callbacks->push_back(std::move(fn));
}

}  // namespace kiln::autograd

namespace kiln {

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph,
                      const std::vector<Tensor>& inputs) const {
  autograd::backward({*this}, gradient.defined() ? autograd::TensorList{gradient} : autograd::TensorList{},
                     retain_graph, create_graph, inputs);
}

namespace {
uint64_t next_hook_handle() {  // unique over both kinds of hooks; 0 means none
  static std::atomic<uint64_t> next{1};
  return next++;
}
}  // namespace

uint64_t Tensor::register_hook(TensorHook fn) const {
  KILN_CHECK(fn != nullptr, "register_hook: the hook is empty; pass a callable");
  KILN_CHECK(requires_grad(), "register_hook: the tensor does not require grad, so no gradient will reach it");
  const uint64_t handle = next_hook_handle();
  if (is_leaf()) impl_->leaf_hooks.emplace_back(handle, std::move(fn));
  else impl_->grad_fn->pre_hooks.push_back({impl_->output_nr, std::move(fn), handle});
  return handle;
}

// Looks on the leaf and on the current grad_fn. A non-leaf's hook registered before an in-place op
// stays on the node it was registered on (as in PyTorch: it sees the gradient of the old value),
// which is no longer this tensor's grad_fn, so that hook can no longer be removed.
void Tensor::remove_hook(uint64_t handle) const {
  TensorImpl& t = get();  // an undefined tensor is an Error
  std::erase_if(t.leaf_hooks, [&](const auto& h) { return h.first == handle; });
  if (t.grad_fn) {
    // retain_grad's hooks have handle 0, which register_hook never gives
    std::erase_if(t.grad_fn->pre_hooks,
                  [&](const autograd::PreHook& h) { return h.handle != 0 && h.handle == handle; });
  }
}

uint64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook fn) const {
  KILN_CHECK(fn != nullptr, "register_post_accumulate_grad_hook: the hook is empty; pass a callable");
  KILN_CHECK(is_leaf() && requires_grad(),
             "register_post_accumulate_grad_hook: only a leaf that requires grad accumulates a gradient "
             "(this tensor is {}); register it on a parameter",
             is_leaf() ? "a leaf without requires_grad" : "the result of an op");
  const uint64_t handle = next_hook_handle();
  impl_->post_accumulate_hooks.emplace_back(handle, std::move(fn));
  return handle;
}

void Tensor::remove_post_accumulate_grad_hook(uint64_t handle) const {
  auto& hooks = get().post_accumulate_hooks;
  std::erase_if(hooks, [&](const auto& h) { return h.first == handle; });
}

void Tensor::retain_grad() const {
  KILN_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  if (is_leaf() || impl_->retains_grad) return;  // leaves keep .grad() anyway
  impl_->retains_grad = true;
  autograd::add_retain_grad_hook(*this);
}

}  // namespace kiln

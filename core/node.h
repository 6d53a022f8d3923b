// core/node.h: the autograd graph's vocabulary: Node and Edge.
//
// A Node is the backward of one op call. It receives one gradient per output of the forward op and
// returns one gradient per input; `next_edges[i]` says where input i's gradient goes (the Node that
// produced input i, and which of its outputs it was). Leaves end in an AccumulateGrad node
// (ops/record.h). ops/ creates nodes when it records; autograd/engine.cpp runs them. Only this
// interface lives in core, so that ops/ can record without depending on the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln {
class Tensor;
}

namespace kiln::autograd {

using TensorList = std::vector<Tensor>;

struct Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which of fn's gradient inputs (= fn's forward outputs) this feeds
  bool valid() const { return fn != nullptr; }
};

// A pre-hook sees (and may replace) the gradient of one forward output before the node runs.
struct PreHook {
  uint32_t output_nr;
  std::function<Tensor(const Tensor&)> fn;
  uint64_t handle = 0;  // Tensor::register_hook's handle for Tensor::remove_hook (0: none)
};

struct Node : std::enable_shared_from_this<Node> {
  Node();
  virtual ~Node();  // frees a long chain of nodes without recursing once per node
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual const char* name() const = 0;  // "MulBackward", "AccumulateGrad", ...
  // grads: one per forward output (undefined where none arrived). Returns one per next_edge.
  virtual TensorList apply(TensorList&& grads) = 0;
  // Frees what the backward saved; called after a backward without retain_graph.
  virtual void release_saved() {}

  uint32_t num_outputs = 1;  // of the forward op: the number of gradients apply() receives
  std::vector<Edge> next_edges;
  std::vector<PreHook> pre_hooks;
  uint64_t sequence_nr;  // creation order; the engine runs later nodes first
};

// The node whose backward is running on this thread (set by the nodes that support saving their
// own outputs, see Note [saving outputs] in core/saved_tensor.h).
Node* current_node();
class CurrentNodeGuard {
 public:
  explicit CurrentNodeGuard(Node* n);
  ~CurrentNodeGuard();
  CurrentNodeGuard(const CurrentNodeGuard&) = delete;
  CurrentNodeGuard& operator=(const CurrentNodeGuard&) = delete;

 private:
  Node* prev_;
};

}  // namespace kiln::autograd

// autograd/autograd.h: running recorded graphs backward (the engine), grad(), queue_callback,
// activation checkpointing, gradcheck, Graphviz export. Recording itself happens in ops/ (ops/record.h); the graph's types are in core/node.h.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "autograd/function.h"
#include "core/grad_mode.h"
#include "core/saved_tensor.h"
#include "core/tensor.h"

namespace kiln::autograd {

// Accumulates d(sum_i <tensors[i], grad_tensors[i]>)/d(leaf) into every leaf's .grad(). An empty
// grad_tensors means ones for single-element tensors. retain_graph keeps saved tensors for another
// backward; create_graph records the backward itself, for higher-order derivatives. inputs (PyTorch's
// argument of that name): when not empty, the gradient is accumulated into these tensors' .grad()
// only (a non-leaf among them retains its gradient, as with retain_grad()), and only the nodes that
// lead to them run; other leaves' .grad() and hooks are left alone (a non-leaf on the way that
// retains its gradient still gets it, as in PyTorch).
void backward(const TensorList& tensors, const TensorList& grad_tensors = {}, bool retain_graph = false,
              bool create_graph = false, const TensorList& inputs = {});

// Where backward enters the graph at `t` (PyTorch's torch.autograd.graph.get_gradient_edge): the
// node that made t and which of its outputs t is, with t's shape, dtype and device to check the
// gradient against. Kept instead of t, it keeps the graph behind t but not t's values: a pipeline
// stage lets its output go once it is sent (Megatron-LM's deallocate_output_tensor) and starts
// backward from the edge. t must require grad.
struct GradientEdge {
  Edge edge;
  Shape shape;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};
GradientEdge get_gradient_edge(const Tensor& t);
// backward({t}, {grad}) for the t that `root` was taken from (PyTorch's backward given a
// GradientEdge): the gradient accumulates into the leaves' .grad(); the graph is freed.
void backward(const GradientEdge& root, const Tensor& grad);

// d(sum_i <outputs[i], grad_outputs[i]>)/d(inputs[j]) for each j, without touching .grad().
// retain_graph defaults to create_graph, as in PyTorch. allow_unused: an input the outputs do not
// depend on gets an undefined tensor instead of an Error.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                std::optional<bool> retain_graph = {}, bool create_graph = false, bool allow_unused = false);

namespace detail {
// Whether the backward running on this thread is a grad() or a backward(inputs=), which must leave
// the .grad() of tensors other than the inputs alone.
bool in_partial_backward();
// While it lives, the next backward started on this thread queues its callbacks (queue_callback)
// on the backward running now, if one is: autograd::checkpoint's recompute, whose backward runs
// inside the outer one, holds it, so that "when backward has finished" means the outer backward.
class JoinOuterCallbacks {
 public:
  JoinOuterCallbacks();
  ~JoinOuterCallbacks();
  JoinOuterCallbacks(const JoinOuterCallbacks&) = delete;
  JoinOuterCallbacks& operator=(const JoinOuterCallbacks&) = delete;
};
}  // namespace detail

// Anomaly detection (PyTorch's torch.autograd.set_detect_anomaly, LibTorch's AnomalyMode): while it is
// on, the engine checks every gradient a node returns and throws an Error naming the node (its
// forward op's backward, e.g. "DivBackward"), which output holds a NaN, and where that gradient was
// going. The check reads every gradient back (a device synchronization per node on CUDA), so it is
// for debugging. On for the whole process, as in PyTorch.
struct AnomalyMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};
// RAII: anomaly detection on for a scope (LibTorch's DetectAnomalyGuard).
class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard() : prev_(AnomalyMode::is_enabled()) { AnomalyMode::set_enabled(true); }
  ~DetectAnomalyGuard() { AnomalyMode::set_enabled(prev_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_;
};

// Runs fn when the backward now running on this thread has finished with every node (PyTorch's
// Variable._execution_engine.queue_callback). Call it from a hook; DistributedDataParallel waits
// for its last all-reduce this way, so that backward() returns with the gradients averaged. From
// inside a checkpointed function's recompute, whose backward runs within the outer one, fn waits
// for the outer backward (a reducer whose first gradient comes from a checkpointed layer must not
// finish before the layers after it); a backward a hook starts itself has callbacks of its own.
void queue_callback(std::function<void()> fn);

// Activation checkpointing (PyTorch's torch.utils.checkpoint): returns fn(inputs), but records
// only the inputs; backward runs fn again (with the random generator as it was, so dropout draws
// the same masks when preserve_rng_state) to get the activations it needs. Parameters that fn uses
// get their gradients as without checkpointing. fn must compute the same thing both times and
// return floating tensors; higher-order gradients (create_graph) and autograd::grad() through it
// (gradcheck included) are not supported (Errors). An input changed in place between the forward
// and the backward is an Error (the recompute would read the new values); an output that is an
// input itself comes back as a view of it (ops::alias), so the input stays as it was (a leaf stays
// a leaf) and in-place changes to either are refused while the view lives. The recompute saves
// its tensors plainly, whatever saved-tensor hooks are on when backward runs (a SaveOnCpu around a
// whole training step would copy them to the host and straight back). See autograd/checkpoint.cpp.
using CheckpointFn = std::function<TensorList(const TensorList&)>;
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, bool preserve_rng_state = true);
// The same, with backward running `recompute` instead of fn: a function that records fn's graph
// and computes every value backward reads, but may leave the values of its outputs uncomputed
// (Note [a recompute computes what backward reads] in autograd/checkpoint.cpp).
TensorList checkpoint(const CheckpointFn& fn, const CheckpointFn& recompute, const TensorList& inputs,
                      bool preserve_rng_state = true);
// How a checkpoint keeps an input from the forward to the backward: called in forward with the
// input, it returns what backward calls to get the input back, which must have its shape, dtype and
// device. DeepSpeed's "activation_checkpointing" options are two of them: cpu_checkpointing keeps a
// host copy (keep_on_cpu below), partition_activations keeps this rank's part of the input and
// all-gathers it in backward (distributed::keep_partitioned). An input that is a leaf requiring grad
// (a parameter) is kept as it is. An input changed in place while its storage lives is still an
// Error in backward.
using KeepInput = std::function<std::function<Tensor()>(const Tensor&)>;
// What checkpoints given it (CheckpointOptions::profile; DeepSpeed's activation_checkpointing
// "profile") measured, summed over every checkpoint that ran: the forwards (without recording),
// and in their backwards the recompute (bringing the kept inputs back and running the function
// again) and the backward through the recomputed graph. Each time waits for the inputs' device
// at both ends, as DeepSpeed's timers do, so that a GPU's queued work counts where it was queued.
struct CheckpointProfile {
  int64_t forwards = 0;
  double forward_s = 0;
  int64_t backwards = 0;
  double recompute_s = 0;
  double backward_s = 0;
};
struct CheckpointOptions {
  bool preserve_rng_state = true;
  KeepInput keep_input;  // empty: the inputs themselves are kept
  // DeepSpeed's synchronize_checkpoint_boundary: wait for the inputs' device (a GPU; the CPU has
  // nothing queued) before and after the forward and the backward, so that each block's device
  // work lies between its boundaries in a profiler's timeline.
  bool synchronize = false;
  std::shared_ptr<CheckpointProfile> profile = nullptr;  // where set, the checkpoint adds its times to it
};
TensorList checkpoint(const CheckpointFn& fn, const CheckpointFn& recompute, const TensorList& inputs,
                      const CheckpointOptions& options);
// Keeps a host copy of a device input (DeepSpeed's cpu_checkpointing), made and copied back as
// SaveOnCpu does (pinned and non-blocking with pin_memory); a CPU input is kept as it is.
KeepInput keep_on_cpu(bool pin_memory = true);

// Activation offload (PyTorch's torch.autograd.graph.save_on_cpu): while a SaveOnCpu lives, every
// tensor that an op saves for backward (but the parameters, which are saved as they are) is copied
// to host memory when it is saved and back to its device when backward needs it, so that the device
// holds no activations between forward and backward. Tensors already on the CPU stay where they are
// (as PyTorch's). With pin_memory (PyTorch's argument of the same name) the host copies live in
// pinned memory and both copies are queued on the device's stream without the host waiting
// (non_blocking), so they overlap the host's work; without it they are synchronous. Forward and
// backward may run on different streams: the copy back waits for the copy out's event (Note
// [non_blocking copies] in cuda/copy.cpp). The pinned blocks stay cached for the next step
// (cuda::host_empty_cache() returns them). See autograd/offload.cpp.
class SaveOnCpu {
 public:
  explicit SaveOnCpu(bool pin_memory = false);
  SaveOnCpu(const SaveOnCpu&) = delete;
  SaveOnCpu& operator=(const SaveOnCpu&) = delete;
  // Bytes copied to the host by this guard so far (0 when everything was on the CPU already).
  int64_t offloaded_bytes() const;

  struct State;  // autograd/offload.cpp

 private:
  std::shared_ptr<State> state_;
  SavedTensorHooksGuard guard_;
};

// Finite-difference checks in float64 (central differences), against the backward with a random
// cotangent: pass when |analytic - numeric| <= atol + rtol * |numeric| everywhere.
struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  uint64_t seed = 0;            // of the random cotangents
  bool raise_exception = true;  // throw an Error describing the first mismatch (else return false)
};
using DifferentiableFn = std::function<TensorList(const TensorList&)>;
bool gradcheck(const DifferentiableFn& fn, const TensorList& inputs, const GradcheckOptions& options = {});
// The same check applied to the backward of fn (derivatives of the vector-Jacobian product).
bool gradgradcheck(const DifferentiableFn& fn, const TensorList& inputs, const GradcheckOptions& options = {});

// The graph that produced `t`, in Graphviz's DOT language (`dot -Tpng graph.dot -o graph.png`).
std::string to_dot(const Tensor& t);

}  // namespace kiln::autograd

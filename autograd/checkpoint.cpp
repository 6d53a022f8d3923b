// autograd/checkpoint.cpp: activation checkpointing (PyTorch's torch.utils.checkpoint, reentrant
// form). Trade compute for memory: run a block forward without recording, keep only its inputs,
// and run it again in backward to get the graph that backward needs.
//
//   forward:   inputs --fn (no_grad: nothing saved)--> outputs   + one node "CheckpointBackward"
//   backward:  CheckpointBackward(grads of outputs):
//                1. set the random generator to its state before the forward (dropout draws
//                   the same masks) and autocast to its state then (the same dtypes), run fn
//                   again with grad mode on, on detached inputs;
//                2. backward through that fresh graph with the incoming grads: parameters used
//                   inside fn accumulate into .grad() as usual, the inputs' gradients are read
//                   from the detached copies and passed on to the rest of the graph.
// The activations inside fn live only from step 1 to the end of step 2 instead of from the
// forward to the backward: with k checkpointed blocks, roughly one block's activations at a time.
//
// Note [a recompute computes what backward reads]
// Step 1 costs one more forward of fn, but step 2 never reads the values of fn's outputs: it only
// sends gradients into their nodes. An op whose backward formula does not read its own output
// (linear: dx = gy W, dW = gy^T x; add) need not compute it in the recompute, only record its
// node. A caller that knows where such ops end fn passes a second function, `recompute`, which
// builds the same graph but leaves those values out. GPT's checkpointed blocks and
// nn::CheckpointWrapper pass the module's nn::Module::forward_for_recompute, which
// nn::TransformerBlock overrides: it records its MLP's last projection with nn::linear_graph_only
// and so skips its GEMM, a third of the block's weight FLOPs. The recompute's outputs must have the
// shapes and dtypes of fn's; their values are never read.
//
// What the checkpoint keeps of its inputs can be less than the inputs (CheckpointOptions::
// keep_input): a host copy (keep_on_cpu, DeepSpeed's cpu_checkpointing), or this rank's part of an
// input that every rank of a tensor-parallel group holds whole (distributed::keep_partitioned,
// DeepSpeed's partition_activations and Megatron-LM's --distribute-saved-activations). With k
// checkpointed blocks those inputs are most of what stays between forward and backward.
//
// DeepSpeed's two other switches for checkpointed blocks are CheckpointOptions::synchronize
// (synchronize_checkpoint_boundary: the forward and the backward wait for the device at both ends)
// and CheckpointOptions::profile ("profile": the time of the forward, of the recompute and of the
// backward through the recomputed graph, each measured between two such waits).
#include "autograd/autograd.h"

#include <chrono>

#include <fmt/format.h>

#include "core/generator.h"
#include "core/tensor_impl.h"
#include "cuda/cuda.h"
#include "ops/autocast.h"
#include "ops/record.h"

namespace kiln::autograd {

namespace {

// One input of a checkpointed function, from the forward to the backward: a detached handle, or
// what a KeepInput made of it, with the input's storage (weakly: a keeper that copies the input
// lets it go) and version, to refuse an input changed in place in between.
class Kept {
 public:
  Kept(const Tensor& t, const KeepInput& keep) {
    if (!t.defined()) return;
    storage_ = t.impl()->storage;
    version_ = t._version();
    shape_ = t.shape();
    dtype_ = t.dtype();
    device_ = t.device();
    if (keep && !(t.is_leaf() && t.requires_grad())) {
      restore_ = keep(t.detach());
      KILN_CHECK(restore_ != nullptr, "checkpoint: the keep_input function returned no way back for an input of {}",
                 t.shape().str());
    } else {
      tensor_ = t.detach();
    }
  }

  // The input again (undefined where it was); `i` numbers it in Errors.
  Tensor get(size_t i) const {
    if (!tensor_.defined() && restore_ == nullptr) return {};
    // Ranks whose keepers gather (distributed::keep_partitioned) ran the same forward, so they pass
    // or fail this check alike: one rank failing alone would leave the others in the gather until
    // the communicator's timeout.
    const std::shared_ptr<Storage> storage = storage_.lock();
    KILN_CHECK(storage == nullptr || storage->version == version_,
               "CheckpointBackward: input {} of the checkpointed function was modified by an in-place operation "
               "after the forward (it is at version {}, it was at version {}){}. Use the out-of-place form, or "
               "clone() the input before changing it",
               i, storage == nullptr ? 0 : storage->version, version_,
               restore_ == nullptr ? ", so the recompute would use other values"
                                   : "; a checkpointed input must stay as it was until backward, kept in another "
                                     "form (keep_input) or not");
    
    if (restore_ == nullptr) return tensor_.detach();
    Tensor t = restore_();
    KILN_CHECK(t.defined() && t.shape() == shape_ && t.dtype() == dtype_ && t.device() == device_,
               "CheckpointBackward: input {} came back from its keep_input function as {}, but it was a {} {} tensor "
               "on {}; the function must give back the tensor it was given",
               i, t.defined() ? fmt::format("a {} {} tensor on {}", t.shape().str(), dtype_name(t.dtype()), t.device().str())
                              : std::string("an undefined tensor"),
               shape_.str(), dtype_name(dtype_), device_.str());
    return t.detach();
  }

 private:
  Tensor tensor_;
  std::function<Tensor()> restore_;
  std::weak_ptr<Storage> storage_;
  uint64_t version_ = 0;
  Shape shape_;
  DType dtype_ = DType::Float32;
  Device device_ = Device::cpu();
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The device of the first defined input: the one whose queued work a checkpoint's boundaries wait
// for. The CPU's ops have finished when they return.
Device device_of(const TensorList& inputs) {
  for (const Tensor& t : inputs) {
    if (t.defined()) return t.device();
  }
  return Device::cpu();
}
void wait_for(Device device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

}  // namespace

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, bool preserve_rng_state) {
  return checkpoint(fn, fn, inputs, preserve_rng_state);
}

TensorList checkpoint(const CheckpointFn& fn, const CheckpointFn& recompute, const TensorList& inputs,
                      bool preserve_rng_state) {
  CheckpointOptions options;
  options.preserve_rng_state = preserve_rng_state;
  return checkpoint(fn, recompute, inputs, options);
}

TensorList checkpoint(const CheckpointFn& fn, const CheckpointFn& recompute, const TensorList& inputs,
                      const CheckpointOptions& options) {
  const bool preserve_rng_state = options.preserve_rng_state;
  KILN_CHECK(fn != nullptr && recompute != nullptr, "checkpoint: the function{} is empty",
             fn != nullptr ? " to run again in backward" : "");
  const Generator::State rng = default_generator().get_state();
  const autocast::State autocast_state = autocast::current_state();  // the recompute runs under it
  const std::shared_ptr<CheckpointProfile> profile = options.profile;
  const bool waits = options.synchronize || profile != nullptr;
  const Device device = device_of(inputs);
  if (waits) wait_for(device);
  const auto forward_start = Clock::now();
  TensorList outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  if (waits) wait_for(device);
  if (profile) {
    ++profile->forwards;
    profile->forward_s += seconds_since(forward_start);
  }
  KILN_CHECK(!outputs.empty(), "checkpoint: the function returned no tensors");
  for (size_t i = 0; i < outputs.size(); ++i) {
    KILN_CHECK(outputs[i].defined() && outputs[i].is_floating_point(),
               "checkpoint: output {} of the function is {}; a checkpointed function returns floating tensors", i,
               outputs[i].defined() ? std::string(dtype_name(outputs[i].dtype())) : "undefined");
  }
  if (!GradMode::is_enabled()) return outputs;
  // An output that fn did not make (one of the inputs itself, which fn returned or an op such as
  // contiguous() or a same-dtype to() passed through, or a tensor it captured: under no_grad a
  // fresh output has no history, so one that requires grad came from outside) becomes a view of it:
  // the node below must not be attached to the caller's tensor (a parameter would stop being a
  // leaf, and a recompute returning it again would reach this node from itself, without end), and as
  // a view it refuses in-place changes (which would change the original).
  for (Tensor& out : outputs) {
    bool outside = out.requires_grad() || out.grad_fn() != nullptr;
    for (const Tensor& in : inputs) outside = outside || (in.defined() && out.is_same(in));
    if (outside) out = ops::alias(out);
  }

  // The backward keeps the inputs (as detached handles, which share their version counters, or in
  // what options.keep_input makes of them) and fn.
  std::vector<Kept> kept;
  std::vector<bool> wants;  // which inputs get a gradient
  for (const auto& t : inputs) {
    kept.push_back(Kept(t, options.keep_input));
    wants.push_back(t.defined() && t.requires_grad());
  }
  record("CheckpointBackward", inputs, outputs,
         [recompute, kept, wants, rng, preserve_rng_state, autocast_state, waits, device, profile](const Grads& g) {
    KILN_CHECK(!GradMode::is_enabled(),
               "checkpoint: backward with create_graph=true (higher-order gradients) is not supported through "
               "a checkpointed function; call it without checkpoint for that");
    KILN_CHECK(!detail::in_partial_backward(),
               "checkpoint: autograd::grad() or backward(inputs=) through a checkpointed function is not "
               "supported: its recompute runs backward(), which accumulates into the .grad() of every parameter it "
               "uses (PyTorch's reentrant checkpoint refuses them too); use backward() without inputs");
    if (waits) wait_for(device);
    const auto recompute_start = Clock::now();
    TensorList again;
    for (size_t i = 0; i < kept.size(); ++i) {
      Tensor d = kept[i].get(i);
      if (wants[i]) d.requires_grad_();
      again.push_back(d);
    }
    TensorList outs;
    {
      // The generator goes back to where it is now even if the recompute throws.
      struct RngRestore {
        Generator::State now = default_generator().get_state();
        ~RngRestore() { default_generator().set_state(now); }
      } restore;
      if (preserve_rng_state) default_generator().set_state(rng);
      // What the recompute saves lives until the backward below: offloading it (a SaveOnCpu still
      // on in backward) would only copy it out and back.
      auto keep = [](const Tensor& t) { return t; };
      SavedTensorHooksGuard plain({keep, keep});
      AutoGradMode on(true);
      autocast::StateGuard forward_autocast(autocast_state);  // the engine turned it off
      outs = recompute(again);
    }
    KILN_CHECK(outs.size() == g.grads.size(),
               "checkpoint: the function returned {} tensors when run again in backward but {} in forward; it "
               "must compute the same thing both times",
               outs.size(), g.grads.size());
    for (size_t i = 0; i < outs.size(); ++i) {  // g[i] has the forward output's shape and dtype
      if (!g[i].defined()) continue;
      KILN_CHECK(outs[i].defined() && outs[i].sizes() == g[i].sizes() && outs[i].dtype() == g[i].dtype(),
                 "checkpoint: output {} of the function was {} {} in forward but {} when run again in backward; it "
                 "must compute the same thing both times",
                 i, dtype_name(g[i].dtype()), g[i].sizes().str(),
                 outs[i].defined() ? fmt::format("{} {}", dtype_name(outs[i].dtype()), outs[i].sizes().str())
                                   : std::string("undefined"));
    }
    if (profile) {
      wait_for(device);
      profile->recompute_s += seconds_since(recompute_start);
    }
    const auto backward_start = Clock::now();
    TensorList roots, root_grads;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (g[i].defined() && outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        root_grads.push_back(g[i]);
      }
    }
    if (!roots.empty()) {
      detail::JoinOuterCallbacks join;  // a reducer's end-of-backward waits for the outer backward
      backward(roots, root_grads);
    }
    if (waits) wait_for(device);
    if (profile) {
      ++profile->backwards;
      profile->backward_s += seconds_since(backward_start);
    }
    TensorList result;
    for (size_t i = 0; i < again.size(); ++i) result.push_back(wants[i] ? again[i].grad() : Tensor());
    return result;
  });
  return outputs;
}

KeepInput keep_on_cpu(bool pin_memory) {
  return [pin_memory](const Tensor& t) -> std::function<Tensor()> {
    if (t.device().is_cpu()) return [t] { return t; };
    Tensor host = t.to(Device::cpu(), /*non_blocking=*/pin_memory);  // as SaveOnCpu (autograd/offload.cpp)
    return [host, device = t.device(), pin_memory] { return host.to(device, /*non_blocking=*/pin_memory); };
  };
}

}  // namespace kiln::autograd

// distributed/zero/param_gatherer.h: ZeRO stage 3's hook set on the modules: each rank keeps only
// its partition of the weights (the shard), and a layer's parameters are all-gathered just before
// they are used and dropped just after.
//
//   forward:   pre-hook of a module that owns parameters   gather its parameters
//              its forward hook                            drop them; hook its output's gradient
//   backward:  that output's gradient arrives              gather them again (its backward reads them)
//              a parameter's gradient is accumulated       drop it (GradReducer has reduced its gradient)
//
// Gathering parameter i (its range [a, b) of the flat layout) is one all-gather of uneven pieces:
// rank r contributes [a, b) ∩ its partition, from its shard. A dropped parameter holds 0 elements of
// its dtype (Tensor::set_data swaps the data behind the handle that modules and autograd hold), so
// the forward hooks must cover every use: a module that reads a parameter it does not own (GPT's
// tied head reads the embedding's weight) declares it with register_external_parameter, as with
// DeepSpeed's deepspeed.zero.register_external_parameter. A parameter already gathered is not
// gathered twice, and one is dropped after a forward only when no module forward that reads it is
// still running (a count per parameter). Every rank runs the same hooks in the same order, so the all-gathers match.
#pragma once

#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/zero/layout.h"
#include "nn/module.h"

namespace kiln::distributed {

class ParamGatherer {
 public:
  // params: the parameters the layout describes (of `model`), in its order; shard: this rank's
  // partition of their flat weights (layout.partition_numel() elements). Drops every parameter.
  ParamGatherer(Communicator& comm, const FlatLayout& layout, std::vector<Tensor> params, Tensor shard,
                nn::Module& model);
  ~ParamGatherer();  // removes the hooks and gathers every parameter (not while an Error unwinds)
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Makes `module`'s forward (and its backward) gather `param` too.
  void register_external_parameter(nn::Module& module, const Tensor& param);
  void gather_all();
  void release_all();  // drops every parameter, whatever forwards were running
  // Gathers every parameter and keeps it while pinned: the hooks then neither gather nor drop, so a
  // forward on one rank alone (evaluation, generation) runs no collective. Every rank calls it.
  void pin_all();
  void unpin_all();
  bool is_gathered(size_t k) const { return gathered_[k]; }

 private:
  void hook_module(nn::Module& module, std::vector<size_t> owned);
  void gather(const std::vector<size_t>& ks);
  void gather(size_t k);
  void release(size_t k);
  size_t index_of(const Tensor& param) const;

  Communicator& comm_;
  const FlatLayout& layout_;
  std::vector<Tensor> params_;
  std::vector<Shape> shapes_;
  std::vector<bool> gathered_;
  std::vector<int> users_;  // per parameter: module forwards running that read it
  Tensor shard_;
  std::vector<nn::RemovableHandle> module_hooks_;
  std::vector<uint64_t> grad_hooks_;
  // Per hooked module: the parameters its hooks gather (shared with the hooks, so that
  // register_external_parameter can extend them).
  std::vector<std::pair<nn::Module*, std::shared_ptr<std::vector<size_t>>>> owned_;
};

}  // namespace kiln::distributed

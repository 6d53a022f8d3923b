// distributed/zero/param_gatherer.h: ZeRO stage 3's hook set on the modules: each rank keeps only
// its partition of the weights (the shard), and a layer's parameters are all-gathered just before
// they are used and dropped just after.
//
//   forward:   pre-hook of a module that owns parameters   fetch its parameters
//              its forward hook                            drop them; hook its output's gradient
//   backward:  that output's gradient arrives              fetch them again (its backward reads them)
//              a parameter's gradient is accumulated       drop it (GradReducer has reduced its gradient)
//
// Gathering parameter i (its range [a, b) of the flat layout) is one all-gather of uneven pieces:
// rank r contributes [a, b) ∩ its partition, from its shard. A dropped parameter holds 0 elements of
// its dtype (Tensor::set_data swaps the data behind the handle that modules and autograd hold), so
// the forward hooks must cover every use: a module that reads a parameter it does not own (GPT's
// tied head reads the embedding's weight) declares it with register_external_parameter, as with
// DeepSpeed's deepspeed.zero.register_external_parameter. A parameter already gathered is not
// gathered twice, and one is dropped after a forward only when no module forward that reads it is
// still running (a count per parameter). Every rank runs the same hooks in the same order, so the
// all-gathers match.
//
// Prefetch (DeepSpeed's stage3_* options; Note [the fetch trace] in param_gatherer.cpp). The first
// iteration (up to the first step()) records the order of the fetches, forward and backward: the
// trace. Later iterations replay it: after each fetch, the all-gathers of the parameters the next
// fetches need are started at once, asynchronous, up to prefetch_bucket_size elements in flight, so
// that they move while this layer computes. A parameter whose next use in the trace comes within
// max_reuse_distance elements of other fetches is kept instead of dropped (no gather to redo), and
// parameters of at most param_persistence_threshold elements are never dropped (each is one
// all-gather per step instead of two per use). A fetch that differs from the trace (the model took
// another path) stops the prefetching until the next step records a new trace.
//
// ZeRO++'s hierarchical partitioning (hpZ; Options::secondary): besides its shard of the weights
// (1/N of them), each rank keeps a secondary shard, its 1/h of them among a group of h ranks (a
// node's). A gather from the shard, over all N ranks, also refreshes this rank's secondary piece of
// the parameter; a backward fetch then gathers from the secondary shards, over the h ranks alone,
// while they are fresh: from the forward gather of the same step to the next step (release_all),
// which changes the weights.
//
// The shard may live in host memory while the parameters live on a GPU (offload_param, ZeRO-
// Infinity's parameter offload). A communicator that carries host memory (MPI) then gathers each
// parameter on the host and the whole of it is copied to the GPU once, when it is needed; one that
// carries device memory (NCCL) gets this rank's piece copied to the GPU first and gathers there.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/zero/layout.h"
#include "distributed/zero/quantize.h"
#include "nn/module.h"

namespace kiln::distributed {

class ParamGatherer {
 public:
  // DeepSpeed's zero_optimization.stage3_* keys of the same names, in elements. The defaults here
  // turn every technique off (ZeroOptions holds DeepSpeed's defaults).
  struct Options {
    int64_t prefetch_bucket_size = 0;         // elements in flight ahead of their use; 0: no prefetch
    int64_t param_persistence_threshold = 0;  // parameters of at most this many elements stay gathered,
    int64_t model_persistence_threshold = std::numeric_limits<int64_t>::max();  // up to this many in all
    int64_t max_live_parameters = std::numeric_limits<int64_t>::max();  // gathered + in flight: prefetch stops here
    int64_t max_reuse_distance = 0;  // keep a parameter whose next use is nearer than this; 0: drop at once
    // Per parameter, in the layout's order: the dtype its gathers for a module's forward and
    // backward travel in (empty: the shard's). A 16-bit one halves a float32 model's bytes, and the
    // parameter then holds its weights rounded to it (in the shard's dtype) while gathered so;
    // DeepSpeed's torch_autocast gathers its lower_precision_safe_modules' weights that way, which
    // autocast's ops round to the same 16 bits anyway (ZeroOptions::autocast_dtype). gather_all,
    // pin_all and gathered_copy gather the weights exactly.
    std::vector<DType> gather_dtypes;
    // hpZ (DeepSpeed's zero_hpz_partition_size): a group of the ranks over which a secondary copy of
    // the weights is partitioned, for the backward gathers; null: none. It must hold this rank, and
    // its size must divide the shard's communicator's.
    Communicator* secondary = nullptr;
    // qwZ (DeepSpeed's zero_quantized_weights): the gathers from the shards (not gather_all's,
    // pin_all's or gathered_copy's, not the persistent parameters', not hpZ's secondary ones) carry
    // int8 values, one float32 scale per block of kQuantBlock elements of each rank's piece
    // (symmetric: scale = max |w| / 127, values rounded to nearest). The parameter then holds the
    // dequantized weights, each within scale / 2 of its own, and counts as rounded, as with
    // gather_dtypes (which it overrides).
    bool quantized_weights = false;
  };
  static constexpr int64_t kQuantBlock = distributed::kQuantBlock;  // quantize.h
  // What the hooks did since construction (every rank's are the same).
  struct Stats {
    int64_t gathers = 0;        // all-gathers started where the parameter was needed (a wait for each)
    int64_t prefetches = 0;     // all-gathers started ahead of their use
    int64_t kept_for_reuse = 0; // drops skipped because the parameter is used again soon
    int64_t trace_misses = 0;   // fetches that differed from the trace (prefetch stopped until the next step)
    int64_t secondary_gathers = 0;  // of the gathers and prefetches, those from hpZ's secondary shards
    int64_t quantized_gathers = 0;  // of the gathers and prefetches, those in int8 (qwZ)
    int64_t gathered_bytes = 0;  // what the gathers and prefetches brought: whole parameters, in their wire
                                 // dtype (and qwZ's int8 values with their scales)
    double wait_seconds = 0;    // spent waiting for all-gathers to complete (what prefetch did not hide)
  };

  // params: the parameters the layout describes (of `model`), in its order, all on one device;
  // shard: this rank's partition of their flat weights (layout.partition_numel() elements), on
  // that device or in pinned host memory. Drops every parameter but the persistent ones.
  ParamGatherer(Communicator& comm, const FlatLayout& layout, std::vector<Tensor> params, Tensor shard,
                nn::Module& model, Options options);
  ~ParamGatherer();  // removes the hooks and gathers every parameter (not while an Error unwinds)
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Makes `module`'s forward (and its backward) gather `param` too.
  void register_external_parameter(nn::Module& module, const Tensor& param);
  void gather_all();
  // Completes the all-gathers in flight. Call it before the shard changes: they read it.
  void finish_pending();
  // The shard has changed (a step, a load): drops every gathered parameter, whatever forwards were
  // running, gathers the persistent ones anew, and ends the iteration for the trace.
  void release_all();
  // Gathers every parameter and keeps it while pinned: the hooks then neither gather nor drop (nor
  // trace), so a forward on one rank alone (evaluation, generation) runs no collective. Every rank
  // calls it.
  void pin_all();
  void unpin_all();
  bool is_gathered(size_t k) const { return gathered_[k]; }
  // Parameter k's whole weights in a new tensor, from an all-gather of its own; the parameter and the
  // trace are left as they are. Every rank calls it, for the same k.
  Tensor gathered_copy(size_t k);
  int64_t persistent_bytes() const;  // of the parameters that stay gathered
  int64_t secondary_bytes() const;   // of hpZ's secondary shard (0 without)
  const Stats& stats() const { return stats_; }

 private:
  enum class TraceState { kRecord, kReplay, kMissed };
  struct Pending {
    Work work;
    Tensor full;   // where the all-gather writes: on gather_device_
    Tensor input;  // what this rank sends, kept until the all-gather has completed
    bool rounded = false;  // in Options::gather_dtypes' dtype, narrower than the shard's, or quantized
    bool from_secondary = false;  // hpZ: gathered from the secondary shards
    // qwZ: the int8 values (into q, for `full` once dequantized) and the scales of every rank's
    // blocks, each all-gathered by a work of its own; what this rank sends is kept until they end.
    bool quantized = false;
    Work scale_work;
    Tensor q, scales, q_input, scale_input;
  };

  void hook_module(nn::Module& module, std::vector<size_t> owned);
  void fetch(size_t event, const std::vector<size_t>& ks);  // event: 2 * hooked module + (backward ? 1 : 0)
  void follow_trace(size_t event);
  void prefetch();
  // exact: in the shard's dtype, whatever gather_dtypes says; backward: for a backward fetch (hpZ's
  // secondary shards serve it where they are fresh).
  void start(size_t k, bool exact = false, bool backward = false);
  void finish(size_t k);
  void done_with(size_t k);  // no forward reads it any more: drop it, unless it persists or returns soon
  void release(size_t k);
  size_t index_of(const Tensor& param) const;
  // Starts the all-gather of parameter k's partitions into a new flat tensor (the returned `full`),
  // in gather_dtypes' dtype unless exact.
  Pending all_gather_param(size_t k, bool exact, bool backward = false);
  // A completed all-gather's flat tensor on the parameters' device.
  Tensor on_device(const Tensor& full) const;

  Communicator& comm_;
  const FlatLayout& layout_;
  Options options_;
  std::vector<Tensor> params_;
  Device device_;         // the parameters'
  Device gather_device_;  // the all-gathers': the shard's on a host communicator, else device_
  std::vector<Shape> shapes_;
  std::vector<bool> gathered_;
  std::vector<bool> persistent_;
  std::vector<bool> rounded_;  // gathered in a narrower dtype (Options::gather_dtypes)
  // hpZ: the secondary layout (h partitions) and this rank's secondary shard, and per parameter
  // whether its piece there holds the current weights (0: stale; 1: exact; 2: rounded to
  // gather_dtypes' dtype, as the forward gather brought them).
  std::unique_ptr<FlatLayout> secondary_layout_;
  Tensor secondary_shard_;
  std::vector<uint8_t> secondary_state_;
  std::vector<std::optional<Pending>> pending_;
  std::vector<int> users_;  // per parameter: module forwards running that read it
  int64_t in_flight_numel_ = 0;  // elements of the prefetches not yet waited for
  int64_t live_numel_ = 0;       // elements gathered or in flight, persistent ones aside
  bool pinned_ = false;
  Tensor shard_;
  std::vector<nn::RemovableHandle> module_hooks_;
  std::vector<uint64_t> grad_hooks_;
  // Per hooked module: the parameters its hooks gather (shared with the hooks, so that
  // register_external_parameter can extend them).
  std::vector<std::pair<nn::Module*, std::shared_ptr<std::vector<size_t>>>> owned_;

  TraceState trace_state_ = TraceState::kRecord;
  std::vector<size_t> trace_;          // the events of the recorded iteration, in order
  std::vector<int64_t> trace_numel_;   // before event i: the elements its predecessors fetch
  std::vector<std::vector<size_t>> uses_;  // per parameter: the trace positions that fetch it
  size_t cursor_ = 0;                  // the trace position of the next event
  Stats stats_;
};

}  // namespace kiln::distributed

// distributed/zero/zero_optimizer.h: ZeRO (Rajbhandari et al., 2020), DeepSpeed's sharded data
// parallelism: an optimizer wrapper that averages the gradients over the ranks, as DDP does, but
// keeps on each rank only its share of what training holds per parameter.
//
//   auto comm = distributed::init();
//   distributed::ZeroOptimizer opt(net, comm, [](std::vector<Tensor> masters) {
//     return std::make_unique<optim::AdamW>(std::move(masters), optim::AdamWOptions{.lr = 1e-3});
//   }, {.stage = 2});
//   for (auto& [x, y] : loader) {                     // each rank: its shard of the data
//     Tensor loss = nn::cross_entropy(net(x), y);
//     opt.zero_grad();  loss.backward();  opt.step();  // the same update on every rank
//   }
//
// What a rank holds, per parameter, training a model kept in 16 bits with Adam on N ranks (the ZeRO
// paper's accounting, Psi parameters): weights 2 bytes, gradients 2, float32 master weights 4, and
// Adam's two moments 8 (12 in all for the "optimizer states"):
//
//   stage 0  plain data parallelism      2 + 2 + 12         = 16 Psi bytes      all-reduce
//   stage 1  optimizer states sharded    2 + 2 + 12 / N                         reduce-scatter + all-gather
//   stage 2  ... and gradients           2 + (2 + 12) / N                       the same
//   stage 3  ... and the weights         (2 + 2 + 12) / N  = 16 Psi / N bytes   + an all-gather per layer
//
// (MiCS, ZeroOptions::mics_shard_size = s: stage 3 within groups of s ranks, 16 Psi / s bytes, and
// one all-reduce of each rank's gradient partition across the N / s groups per step. ZeRO++'s hpZ,
// zero_hpz_partition_size = h: stage 3 plus a secondary shard of the weights per group of h ranks,
// 2 Psi / h more bytes, from which backward's all-gathers read within the group. ZeRO++'s qwZ,
// zero_quantized_weights: stage 3's weight all-gathers in int8 blocks with a scale each; its qgZ,
// zero_quantized_gradients: stage 3's gradient reduce-scatters as int8 all-to-alls.)
//
// How (layout.h has the picture): the trainable parameters are laid end to end in one flat buffer,
// padded to a multiple of N and cut into N equal partitions; rank r owns partition r. It keeps the
// float32 master weights of its partition only (in float32 and float64 models, the partition of the
// flat buffer is its own master: no copy), and the inner optimizer (any of Kiln's: SGD, Adam,
// AdamW, ...) is built over that one tensor, so its state is a partition too (at stage 3, one inner
// optimizer per sub-group of the partition: ZeroOptions::sub_group_size). Every one of those
// optimizers is elementwise, so updating each partition on its own rank is the same arithmetic as
// updating the whole model on one. The gradients are averaged over the ranks during backward by
// GradReducer (grad_reducer.h): all-reduced (stage 0) or reduce-scattered so that each rank
// receives just its partition's average (1 and up). step() updates the partition, rounds it into
// the model's dtype, and all-gathers the partitions so that every rank has every weight again
// (stages 1 and 2); at stage 3 the weights stay sharded and each layer's are all-gathered just
// before they are used, forward and backward, and freed after (ParamGatherer, param_gatherer.h;
// DeepSpeed's stage3_* options prefetch them, keep the small ones and keep those used again soon).
//
// Under ZeRO a parameter's .grad() is not the averaged gradient (at stage 2 and 3 it is dropped as
// soon as it is reduced); grads() gives this rank's averaged share, which is what step() uses. At
// stage 3 a parameter holds 0 elements outside the layers' forward and backward: gather them with
// a GatheredParameters guard to read or save the weights. Every rank builds the same model (checked
// at construction) and starts from rank 0's weights and buffers, and every rank must run the same
// modules in the same order, forward and backward: the gradient buckets and stage 3's all-gathers
// are collectives started from hooks (DeepSpeed's stage 3 requires the same).
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/ddp/ddp.h"
#include "distributed/zero/layout.h"
#include "distributed/zero/param_gatherer.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace kiln::distributed {

class GradReducer;

// The keys of a DeepSpeed config's "zero_optimization" section that Kiln implements, with
// DeepSpeed's defaults (sizes in elements).
struct ZeroOptions {
  int stage = 1;                               // 0, 1, 2 or 3 (see the table above)
  int64_t reduce_bucket_size = 500'000'000;    // elements per gradient bucket
  int64_t allgather_bucket_size = 500'000'000; // elements per rank in each all-gather of step()
  bool overlap_comm = false;                   // run each bucket's reduction while backward goes on
  // How the gradients are averaged: top-level keys of a DeepSpeed config, which Engine passes here
  // (grad_reducer.h has the arithmetic). By default each bucket is averaged by the communicator
  // (ReduceOp::Avg) in the model's dtype. communication_data_type: the dtype the buckets travel in
  // (float16, bfloat16 or float32: half the bytes of a float32 model's, or a 16-bit model's
  // gradients summed in float32), converted before and back after. prescale_gradients: divide by
  // the number of ranks before summing; gradient_predivide_factor f: divide by f before summing and
  // by (ranks / f) after (1: off). DeepSpeed applies the last two where it all-reduces (stage 0, and
  // stages 1 and 2 with reduce_scatter false) and refuses them with its reduce-scatter; Kiln, which
  // reduce-scatters from stage 1 on, applies them at every stage.
  std::optional<DType> communication_data_type = std::nullopt;
  // DeepSpeed's torch_autocast (the model float32, its forward under autocast to this 16-bit dtype):
  // the parameters of the modules whose class is listed in lower_precision_safe_modules (by name(),
  // "Linear"; DeepSpeed's default list is Linear, Conv1d, Conv2d, Conv3d) have their gradients
  // averaged in autocast_dtype, and at stage 3 their weights gathered for forward and backward in
  // it: half the bytes, and no change to what autocast's ops compute with them, which round the
  // weights to that dtype anyway. The other parameters travel as communication_data_type says
  // (which must then be float32 or unset, as DeepSpeed's). The buckets hold one dtype's each.
  std::optional<DType> autocast_dtype = std::nullopt;
  std::vector<std::string> lower_precision_safe_modules = {"Linear", "Conv1d", "Conv2d", "Conv3d"};
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // The dtype the gradients accumulate in over the micro-batches of a step (DeepSpeed's
  // data_types.grad_accum_dtype): the model's (unset: the default here) or, for a 16-bit model,
  // float32, whose flat gradient buffer (stages 0 and 1) or partition (2 and 3) then takes 4 bytes
  // per element instead of 2, and the step needs no float32 copy of the gradients. They still
  // travel in the model's dtype unless communication_data_type says otherwise, as in DeepSpeed.
  // Engine sets float32 for bfloat16 at stage 0 where the config leaves it unset, as DeepSpeed does.
  std::optional<DType> grad_accum_dtype = std::nullopt;
  // ZeRO-Offload: keep the float32 master partition and the optimizer state in host memory and
  // step there; the gradients' partition is copied to the host and the weights back. On a CPU
  // model it changes nothing.
  bool offload_optimizer = false;
  // ZeRO-Infinity's parameter offload (stage 3): keep the weights' shard in pinned host memory; each
  // all-gather copies what it needs to the device (ParamGatherer), and the step writes the shard on
  // the host (from a host master with offload_optimizer, which a float32 model's shard then is).
  // The device holds only the parameters gathered at the time. A CPU model's shard is in host
  // memory already, so it changes nothing there. At stages 0-2 it is an Error (DeepSpeed reads it at
  // stage 3 only).
  bool offload_param = false;
  // Stage 3 steps each rank's partition a sub-group at a time: whole parameters' pieces, gathered
  // until a group holds >= sub_group_size elements (0: one parameter each; make_sub_groups in
  // layout.h), as DeepSpeed's stage 3. Each sub-group has its own inner optimizer, and the float32
  // copy of a 16-bit model's gradients (or of a CUDA model's, offloaded), the inner step's
  // temporaries and the rounding back into the shard are made for one sub-group at a time, which
  // bounds the step's extra memory by the largest group instead of the partition. The update is
  // the same at any size (every Kiln optimizer is elementwise), and so is the checkpoint. Stages
  // 0-2 step the partition whole, as DeepSpeed's.
  int64_t sub_group_size = 1'000'000'000;
  // Stage 3's prefetching and keeping of gathered weights (param_gatherer.h has how): elements
  // fetched ahead of their use, parameters small enough to stay gathered (and how many elements of
  // them in all), the most gathered or in flight at once, and how near a parameter's next use must
  // be for it to be kept. 0 turns prefetch, persistence and reuse off.
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_model_persistence_threshold = std::numeric_limits<int64_t>::max();  // persistent elements in all
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  // Whether Engine::save_16bit_model writes the model at stage 3 (it gathers every weight onto rank
  // 0); when false it writes nothing there and returns false, as DeepSpeed's. The optimizer itself
  // does not read it.
  bool stage3_gather_16bit_weights_on_model_save = false;
  // MiCS (Zhang et al., 2022; DeepSpeed's mics_shard_size), stage 3 only: shard the model states
  // over groups of this many consecutive ranks instead of over all N, and replicate them across the
  // N / mics_shard_size groups. The all-gathers of the weights and the gradients' reduce-scatters
  // then span one group (fewer, nearer ranks: within a node, where the links are fast), and once a
  // step, after the last backward of the accumulation, each rank's gradient partition is averaged
  // with its replicas' (the ranks of the same place in the other groups) by one all-reduce. A rank
  // holds 16 Psi / mics_shard_size bytes instead of 16 Psi / N. -1: off (DeepSpeed's default);
  // N: plain stage 3. It must divide the number of ranks.
  int64_t mics_shard_size = -1;
  // ZeRO++'s hierarchical partitioning (hpZ; Wang et al., 2023; DeepSpeed's
  // zero_hpz_partition_size), stage 3 only: each rank also keeps a secondary shard of the weights,
  // its 1/h among h consecutive ranks (a node), refreshed by each forward all-gather (over all N);
  // the backward all-gathers then read the secondary shards, over those h ranks alone. 2 Psi / h
  // more bytes per rank for a 16-bit model, and backward's gathers stay within the group (the
  // gradients are still reduce-scattered over all N). 1: off (DeepSpeed's default). It must divide
  // the number of ranks; with mics_shard_size it is an Error.
  int64_t zero_hpz_partition_size = 1;
  // ZeRO++'s quantized weights (qwZ; DeepSpeed's zero_quantized_weights), stage 3 only: the weights'
  // all-gathers from the shards carry int8 values with a float32 scale per block of 2048 (a quarter
  // of a float32 model's bytes, about half of a 16-bit one's), and forward and backward compute with
  // the dequantized weights, each within half its block's scale (max |w| / 127) of its own. The
  // shards, the optimizer's step and checkpoints stay exact, and so do GatheredParameters,
  // consolidated_state_dict and the persistent parameters (stage3_param_persistence_threshold), which
  // DeepSpeed never partitions. hpZ's secondary shards hold the dequantized weights.
  bool zero_quantized_weights = false;
  // ZeRO++'s quantized gradients (qgZ; DeepSpeed's zero_quantized_gradients), stage 3 only: each
  // bucket's pieces travel to their ranks as int8 values with a float32 scale per block of 2048,
  // by two all-to-alls in place of the reduce-scatter, and each rank sums the N dequantized pieces
  // of its part in float32 (Note [quantized gradients] in grad_reducer.cpp): a quarter of a float32
  // model's gradient bytes, about half of a 16-bit one's, each averaged gradient within the mean of
  // the ranks' half block scales (max |g| / 254) of the exact average.
  bool zero_quantized_gradients = false;
};

class ZeroOptimizer : public optim::Optimizer {
 public:
  // Builds an inner optimizer over this rank's masters (one tensor: the master partition, or at
  // stage 3 one sub-group of it, once per sub-group); it must use exactly them.
  using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> masters)>;

  // Trains the parameters of `model` that require grad, which must share one floating dtype and one
  // device. `model` must outlive this optimizer, and must not be moved to another device or dtype
  // after it is built (as DeepSpeed, build it once the model is where it trains).
  ZeroOptimizer(nn::Module& model, std::shared_ptr<Communicator> comm, const MakeOptimizer& make_optimizer,
                ZeroOptions options = {});
  ~ZeroOptimizer() override;

  // Updates this rank's partition from its averaged gradients, then shares the new weights.
  void step() override;
  // Zeroes the gradients (this rank's partition, and the flat buffer at stages 0 and 1, whose views
  // the parameters' .grad() stay: set_to_none does not free them, as DeepSpeed's contiguous buffers).
  void zero_grad(bool set_to_none = true) override;
  // This rank's averaged gradients as the inner optimizers read them (one float32 tensor of
  // partition_numel elements). Where the step makes its float32 copy a sub-group at a time (stage 3,
  // several sub-groups, a 16-bit model), this makes the whole copy at once, and the step uses it.
  std::vector<Tensor> grads() override;
  // GradScaler::unscale_: multiplies the gradients by factor and checks them for inf/NaN. Where the
  // step converts the gradients a sub-group at a time, each sub-group is checked as it will be
  // (converted and multiplied), and the factor is kept and applied in the step, as DeepSpeed's
  // stage 3 unscales each sub-group in its step.
  Unscaled unscale_grads_(double factor) override;
  // Scales the gradients so that their norm over every rank's partition is at most max_norm, as
  // nn::utils::clip_grad_norm_ would on one process; returns that norm (a 0-d float64 tensor).
  // With sub-groups converted in the step (see grads()), the norm is summed a sub-group at a time
  // and the scaling is kept and applied in the step.
  // Every rank calls it (an all-reduce). model_parallel: the ranks that hold the model's other
  // parts (a pipeline's other stages, a layer's other tensor-parallel slices), whose squared norms
  // add to this one's, one communicator after the other; a parameter for which counted(param) is
  // false is left out here (a whole parameter that each rank of a tensor group holds is counted
  // on one of them).
  Tensor clip_grad_norm_(double max_norm, const std::vector<Communicator*>& model_parallel = {},
                         const std::function<bool(const Tensor& param)>& counted = {});

  // Stages 0 and 1: whether the next backward ends a gradient accumulation (then it reduces; before
  // that, gradients accumulate locally). Stages 2 and 3 reduce in every backward. Default true.
  void set_gradient_accumulation_boundary(bool boundary);
  // Stages 0 and 1: averages now the gradients that backwards accumulated with the boundary false,
  // as a backward at the boundary would have (DeepSpeed's reduce_gradients), for a caller that
  // changes them between backward and the reduction (a pipeline's tied weights). Once per step.
  void reduce_gradients();
  // Stages 0 and 1, between the backwards and reduce_gradients: adds g (param's shape, any floating
  // dtype) to param's accumulating gradient, in grad_accum_dtype where that is wider than the model
  // (GradReducer::add_to_gradient). For a pipeline's tied weight, whose other copy's gradient
  // arrives from another stage.
  void add_to_gradient(const Tensor& param, const Tensor& g);

  // This rank's shard of the training state: the inner optimizer's state dict (its state is of the
  // partition; with several sub-groups, their inner optimizers' buffers end to end, so the file is
  // the same at any sub_group_size) and "master" (the float32 master partition), with "zero.rank",
  // "zero.world_size", "zero.numel" and "zero.stage". Saved per rank (Engine::save_checkpoint).
  TensorDict state_dict() const override;
  // This rank's own shard (same world size and stage family: partitioned or not).
  void load_state_dict(const TensorDict& dict) override;
  // Every rank's state_dict() of a run at any world size and stage, in rank order: each rank cuts
  // its partition out of the old ones (the model must be the same). Every rank calls it.
  void load_sharded_state_dict(const std::vector<TensorDict>& shards);

  // The model's state_dict() with every weight whole (in the model's dtype) copied to the host, on
  // rank `dst`; the other ranks get an empty dict. DeepSpeed's consolidated 16-bit state dict, which
  // Engine::save_16bit_model and Engine::save_checkpoint write. At stage 3 the parameters are
  // all-gathered one at a time, so beyond dst's host copy no rank holds more than one extra whole
  // parameter. exclude_frozen_parameters leaves out the parameters that do not require grad.
  // Every rank calls it.
  TensorDict consolidated_state_dict(int dst = 0, bool exclude_frozen_parameters = false);

  // Stage 3: makes `module`'s forward (and backward) gather `param` too, for a module that reads a
  // parameter it does not own (DeepSpeed's deepspeed.zero.register_external_parameter). Nothing at
  // stages 0-2.
  void register_external_parameter(nn::Module& module, const Tensor& param);

  int stage() const { return options_.stage; }
  const ZeroOptions& options() const { return options_; }
  // The dtype each parameter's gradient is averaged in (and, at stage 3, its weights gathered in
  // for forward and backward), in the layout's order: the model's, communication_data_type's, or
  // for lower_precision_safe_modules' parameters autocast_dtype's.
  const std::vector<DType>& communication_dtypes() const { return communication_dtypes_; }
  const FlatLayout& layout() const { return *layout_; }
  Communicator& comm() { return *comm_; }
  // The ranks the partitions are spread over: comm() itself, or with mics_shard_size this rank's
  // shard group (its rank there is the partition it holds). The replicas of this rank's partition,
  // one per shard group, form replica_comm() (null without MiCS).
  Communicator& shard_comm() { return *shard_comm_; }
  Communicator* replica_comm() { return replica_comm_.get(); }
  // hpZ's group of zero_hpz_partition_size ranks (null without hpZ).
  Communicator* hpz_comm() { return hpz_comm_.get(); }
  // The inner optimizer of sub-group k (one per sub-group; one in all, over master(), except at
  // stage 3 with a sub_group_size smaller than the partition), and the sub-groups as ranges of the
  // partition.
  optim::Optimizer& inner(size_t k = 0) { return *sub_groups_.at(k).inner; }
  std::vector<FlatRange> sub_groups() const;
  const Tensor& master() const { return master_; }  // this rank's float32 master partition
  // The elements of parameter p whole, also while stage 3 has dropped it (DeepSpeed's ds_numel);
  // p.numel() for a tensor this optimizer does not train.
  int64_t full_numel(const Tensor& p) const;

  // Bytes this rank holds for training, by kind (DeepSpeed's "model states"), on its device or, where
  // offloaded, in host memory: weights (the flat buffer, or at stage 3 the shard, the persistent
  // parameters and hpZ's secondary shard), gradients (the flat buffer, or the partition's), float32 masters (0 where the
  // partition is its own master) and optimizer state. Stage 2's buckets in flight and stage 3's
  // gathered layers are transient and not counted.
  struct ModelStateBytes {
    int64_t params = 0, grads = 0, master = 0, optimizer_state = 0;
    int64_t total() const { return params + grads + master + optimizer_state; }
  };
  ModelStateBytes model_state_bytes() const;
  // Buckets of the last reducing backward whose reduction started before backward had finished.
  int64_t buckets_started_during_backward() const;
  // Stage 3: how many all-gathers started at the point of use and ahead of it, and the other
  // counts of ParamGatherer::Stats, since construction. All zero at stages 0-2.
  ParamGatherer::Stats stage3_stats() const;
  // The bytes the gradient reductions have sent to the other ranks since construction
  // (GradReducer::sent_bytes): what zero_quantized_gradients cuts. MiCS's all-reduce of each
  // partition across the replica groups is not counted.
  int64_t gradient_bytes_sent() const;

  // Stage 3: gathers every parameter into the model while it lives (DeepSpeed's
  // deepspeed.zero.GatheredParameters), to print or save the weights, or to evaluate or generate on
  // one rank alone (the forward hooks run no collective meanwhile); every rank must create it.
  // Changes made to the weights meanwhile are lost: the partitions are the truth. Does nothing at
  // stages 0-2.
  class GatheredParameters {
   public:
    explicit GatheredParameters(ZeroOptimizer& opt);
    ~GatheredParameters();
    GatheredParameters(const GatheredParameters&) = delete;
    GatheredParameters& operator=(const GatheredParameters&) = delete;

   private:
    ZeroOptimizer& opt_;
  };

 private:
  // Before the averaged gradients are read (the step, grads(), unscaling, clipping): checks that no
  // .grad() was left out (GradReducer::check_no_grads) and, with MiCS, averages the partition with
  // its replicas, once per step.
  void gradients_complete();
  void prepare_master_grads();
  // Whether the float32 gradients are made a sub-group at a time, in the step: several sub-groups,
  // a gradient partition that is not already the masters' dtype and device, and no whole copy made
  // by grads() since the last step.
  bool converts_per_sub_group() const;
  // Sub-group k's gradients as its inner optimizer reads them: a view of the whole ones where they
  // are ready (prepare_master_grads), else a float32 copy with the pending factors applied.
  Tensor sub_group_grad(size_t k) const;
  void load_partitions(const std::vector<std::pair<int64_t, const TensorDict*>>& shards);  // (partition, its dict)

  nn::Module& model_;
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<Communicator> shard_comm_;    // comm_, or MiCS's shard group
  std::shared_ptr<Communicator> replica_comm_;  // MiCS's replica group; null without MiCS
  std::shared_ptr<Communicator> hpz_comm_;      // hpZ's secondary group; null without hpZ
  bool replicas_averaged_ = false;              // since the last step or zero_grad
  int64_t averaged_after_ = 0;                  // the reducer's reductions() when they were
  ZeroOptions options_;
  std::vector<DType> communication_dtypes_;  // per parameter (communication_dtypes())
  std::vector<Tensor> params_;  // the trainable parameters, in the layout's order
  std::unique_ptr<FlatLayout> layout_;
  Tensor flat_params_;  // stages 0-2: padded_numel elements in the model's dtype; params are views of it
  Tensor shard_;        // this rank's partition of the weights, in the model's dtype
  Tensor flat_grads_;   // stages 0 and 1: padded_numel elements; params' .grad() are views of it
                        // (unless it is wider: grad_accum_dtype)
  Tensor grad_shard_;   // this rank's averaged gradients, in grad_accum_dtype
  Tensor master_;       // float32 (or float64) master partition
  bool master_grad_ready_ = false;
  // The partition's sub-groups, each with its master (master_ itself where there is one group, else
  // a view of it) and its inner optimizer over that one tensor.
  struct SubGroup {
    FlatRange range;  // offsets into the partition
    Tensor master;
    std::unique_ptr<optim::Optimizer> inner;
  };
  std::vector<SubGroup> sub_groups_;
  // Factors unscale_grads_ and clip_grad_norm_ kept for the step's per-sub-group conversion, in the
  // order they came (each a multiplication, as on the whole copy); cleared by step and zero_grad.
  std::vector<double> pending_factors_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ParamGatherer> gatherer_;
};

// A GradScaler whose inf/NaN check spans every rank (PyTorch's ShardedGradScaler): each rank sees
// only its partition of the gradients, but all must skip the same steps. Every rank calls unscale_
// (or step) on its ZeroOptimizer.
class ShardedGradScaler : public optim::GradScaler {
 public:
  ShardedGradScaler(std::shared_ptr<Communicator> comm, optim::GradScalerOptions options = {});

 protected:
  bool found_inf_anywhere(bool found_inf_here) override;

 private:
  std::shared_ptr<Communicator> comm_;
};

}  // namespace kiln::distributed

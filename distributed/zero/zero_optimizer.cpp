// distributed/zero/zero_optimizer.cpp: ZeroOptimizer, the sharded optimizer of ZeRO stages 0-3 (see
// zero_optimizer.h; the layout is layout.h, the gradient hooks grad_reducer.h, stage 3's weight
// hooks param_gatherer.h).
#include "distributed/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/grad_mode.h"
#include "distributed/comm/comms_logger.h"
#include "distributed/zero/grad_reducer.h"
#include "distributed/zero/param_gatherer.h"
#include "ops/ops.h"

namespace kiln::distributed {

namespace {

Tensor int64_scalar(int64_t v) { return scalar_tensor(v, kInt64); }

int64_t read_int(const TensorDict& dict, const char* key, const char* who) {
  const Tensor* t = dict.find(key);
  KILN_CHECK(t != nullptr && t->numel() == 1,
             "{}: the state dict has no '{}'; it was not saved by ZeroOptimizer::state_dict()", who, key);
  return t->item<int64_t>();
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(nn::Module& model, std::shared_ptr<Communicator> comm, const MakeOptimizer& make_optimizer,
                             ZeroOptions options)
    : Optimizer("ZeRO"), model_(model), comm_(std::move(comm)), options_(options) {
  KILN_CHECK(comm_ != nullptr, "ZeRO: the communicator is null; pass distributed::init()");
  KILN_CHECK(make_optimizer != nullptr, "ZeRO: the function that makes the inner optimizer is empty");
  KILN_CHECK(options_.stage >= 0 && options_.stage <= 3, "ZeRO: stage must be 0, 1, 2 or 3, not {}", options_.stage);
  KILN_CHECK(options_.reduce_bucket_size >= 1 && options_.allgather_bucket_size >= 1,
             "ZeRO: reduce_bucket_size and allgather_bucket_size must be >= 1 element, not {} and {}",
             options_.reduce_bucket_size, options_.allgather_bucket_size);
  KILN_CHECK(!options_.offload_param || options_.stage == 3,
             "ZeRO: offload_param is for stage 3, where the weights are partitioned (DeepSpeed reads it there only); "
             "this is stage {}: remove offload_param, or use stage 3", options_.stage);
  KILN_CHECK(options_.sub_group_size >= 0, "ZeRO: sub_group_size must be >= 0, not {}", options_.sub_group_size);
  if (const auto& wire = options_.communication_data_type) {
    KILN_CHECK(*wire == kFloat16 || *wire == kBFloat16 || *wire == kFloat32,
               "ZeRO: communication_data_type must be float16, bfloat16 or float32 (DeepSpeed's fp16, bf16, fp32), "
               "not {}", dtype_name(*wire));
  }
  if (const auto& low = options_.autocast_dtype) {
    KILN_CHECK(*low == kFloat16 || *low == kBFloat16,
               "ZeRO: autocast_dtype (DeepSpeed's torch_autocast.dtype) must be float16 or bfloat16, not {}",
               dtype_name(*low));
    KILN_CHECK(!options_.communication_data_type || *options_.communication_data_type == kFloat32,
               "ZeRO: with torch_autocast, the lower_precision_safe_modules' gradients travel in {} and the others "
               "in float32; communication_data_type is {}: remove it, or set it to fp32 (DeepSpeed requires the same)",
               dtype_name(*low), dtype_name(*options_.communication_data_type));
  }
  KILN_CHECK(std::isfinite(options_.gradient_predivide_factor) && options_.gradient_predivide_factor > 0,
             "ZeRO: gradient_predivide_factor must be a finite number > 0 (1: off), not {}",
             options_.gradient_predivide_factor);
  KILN_CHECK(!options_.prescale_gradients || options_.gradient_predivide_factor == 1.0,
             "ZeRO: prescale_gradients divides the gradients by the number of ranks before the sum, and "
             "gradient_predivide_factor {} asks to divide them by another number; use one of the two",
             options_.gradient_predivide_factor);
  verify_same_model(*comm_, model_, "ZeRO");
  // MiCS: shard groups of consecutive ranks, and replica groups of the ranks at the same place in
  // each (DeepSpeed's layout). Without it the partitions span every rank.
  shard_comm_ = comm_;
  if (options_.mics_shard_size != -1) {
    const int64_t s = options_.mics_shard_size, n = comm_->size();
    KILN_CHECK(s >= 1, "ZeRO: mics_shard_size must be -1 (off) or a number of ranks >= 1, not {}", s);
    KILN_CHECK(options_.stage == 3,
               "ZeRO: mics_shard_size shards stage 3's model states over groups of ranks, and this is stage {} "
               "(DeepSpeed's MiCS is a stage 3 optimizer too); remove it, or use stage 3", options_.stage);
    KILN_CHECK(n % s == 0,
               "ZeRO: mics_shard_size {} does not divide the {} data-parallel ranks; use a divisor of {} (each group "
               "of {} consecutive ranks holds one copy of the model states)", s, n, n, s);
    const int rank = comm_->rank();
    shard_comm_ = comm_->split(static_cast<int>(rank / s), static_cast<int>(rank % s));
    replica_comm_ = comm_->split(static_cast<int>(rank % s), static_cast<int>(rank / s));
    if (replica_comm_->size() == 1) replica_comm_.reset();  // one group: plain stage 3
  }
  // hpZ: groups of consecutive ranks for the secondary shards (DeepSpeed's layout, a node each).
  if (options_.zero_hpz_partition_size != 1) {
    const int64_t h = options_.zero_hpz_partition_size, n = comm_->size();
    KILN_CHECK(h >= 1, "ZeRO: zero_hpz_partition_size must be 1 (off) or a number of ranks > 1, not {}", h);
    KILN_CHECK(options_.stage == 3,
               "ZeRO: zero_hpz_partition_size keeps a secondary shard of stage 3's partitioned weights, and this is "
               "stage {} (DeepSpeed's hpZ is for stage 3 too); remove it, or use stage 3", options_.stage);
    KILN_CHECK(options_.mics_shard_size == -1,
               "ZeRO: zero_hpz_partition_size and mics_shard_size both keep the weights' gathers within a group of "
               "ranks, in two ways; use one (hpZ shards over all ranks and keeps a copy per group; MiCS shards "
               "within each group)");
    KILN_CHECK(n % h == 0,
               "ZeRO: zero_hpz_partition_size {} does not divide the {} data-parallel ranks; use a divisor of {} (the "
               "ranks of a node, usually)", h, n, n);
    const int rank = comm_->rank();
    hpz_comm_ = comm_->split(static_cast<int>(rank / h), static_cast<int>(rank % h));
  }
  KILN_CHECK(!options_.zero_quantized_weights || options_.stage == 3,
             "ZeRO: zero_quantized_weights quantizes stage 3's weight all-gathers, and stage {} gathers no weights; "
             "remove it, or use stage 3", options_.stage);
  KILN_CHECK(!options_.zero_quantized_gradients || options_.stage == 3,
             "ZeRO: zero_quantized_gradients quantizes stage 3's gradient reduction (DeepSpeed's qgZ is for stage 3), "
             "and this is stage {}; remove it, or use stage 3", options_.stage);

  std::vector<int64_t> numels;
  for (const auto& [name, p] : model_.named_parameters()) {
    if (!p.requires_grad()) continue;
    if (!params_.empty()) {
      KILN_CHECK(p.dtype() == params_[0].dtype() && p.device() == params_[0].device(),
                 "ZeRO: parameter '{}' is {} on {} but the first trainable one is {} on {}; ZeRO keeps every "
                 "trainable parameter in one flat buffer, so they must share a dtype and a device (model.to(...))",
                 name, dtype_name(p.dtype()), p.device().str(), dtype_name(params_[0].dtype()),
                 params_[0].device().str());
    }
    params_.push_back(p);
    numels.push_back(p.numel());
  }
  KILN_CHECK(!params_.empty(), "ZeRO: the model has no parameter that requires grad; there is nothing to train");
  // Each parameter's wire dtype: the model's or communication_data_type's, and with torch_autocast
  // autocast_dtype for the parameters of the modules it lists (of the classes by name()).
  communication_dtypes_.assign(params_.size(), options_.communication_data_type.value_or(params_[0].dtype()));
  if (const auto& low = options_.autocast_dtype) {
    KILN_CHECK(params_[0].dtype() == kFloat32,
               "ZeRO: torch_autocast runs a float32 model's forward under autocast, and this model's parameters are "
               "{}; keep the model in float32 (and remove the \"fp16\" or \"bf16\" section)",
               dtype_name(params_[0].dtype()));
    const auto& listed = options_.lower_precision_safe_modules;
    std::set<std::string> classes;  // of the modules that hold parameters, for the message
    bool matched = false;
    for (nn::Module* m : model_.modules()) {
      const auto own = m->parameters(/*recurse=*/false);
      if (own.empty()) continue;
      classes.insert(m->name());
      if (std::find(listed.begin(), listed.end(), m->name()) == listed.end()) continue;
      matched = true;
      for (const Tensor& p : own) {
        for (size_t k = 0; k < params_.size(); ++k) {
          if (params_[k].is_same(p)) communication_dtypes_[k] = *low;
        }
      }
    }
    KILN_CHECK(listed.empty() || matched,
               "ZeRO: torch_autocast's lower_precision_safe_modules lists {}, and no module of this model is of "
               "those classes; the classes that hold parameters here are {}: list those whose gradients may travel "
               "in {}", fmt::join(listed, ", "), fmt::join(classes, ", "), dtype_name(*low));
  }
  const int world = shard_comm_->size(), rank = shard_comm_->rank();
  const bool sharded = options_.stage > 0;
  layout_ = std::make_unique<FlatLayout>(std::move(numels), sharded ? world : 1);
  const FlatRange part = layout_->partition(sharded ? rank : 0);
  const TensorOptions model_options = params_[0].options();
  const DType accumulate = options_.grad_accum_dtype.value_or(model_options.dtype());
  KILN_CHECK(accumulate == model_options.dtype() || (accumulate == kFloat32 && is_reduced_float(model_options.dtype())),
             "ZeRO: grad_accum_dtype is {} for a {} model; the gradients accumulate in the model's dtype or, for a "
             "16-bit model, in float32", dtype_name(accumulate), dtype_name(model_options.dtype()));
  NoGradGuard no_grad;
  // The flat weights, rank 0's everywhere; the parameters become views of them.
  flat_params_ = zeros({layout_->padded_numel()}, model_options);
  for (size_t k = 0; k < params_.size(); ++k) {
    const FlatRange r = layout_->param(static_cast<int64_t>(k));
    Tensor view = flat_params_.narrow(0, r.begin, r.size()).view(params_[k].sizes());
    view.copy_(params_[k]);
    params_[k].set_data(view);
  }
  CommCaller caller("rank 0's weights to every rank");
  comm_->broadcast(flat_params_, 0);
  for (const Tensor& b : model_.buffers()) comm_->broadcast(b, 0);
  shard_ = flat_params_.narrow(0, part.begin, part.size());
  if (options_.stage == 3) {
    // Stage 3's own shard: on the model's device, or with offload_param in pinned host memory, from
    // which ParamGatherer copies what it gathers to the device.
    if (options_.offload_param && !model_options.device().is_cpu()) {
      Tensor host = empty({part.size()}, TensorOptions(model_options.dtype()).pinned_memory(true));
      host.copy_(shard_);
      shard_ = host;
    } else {
      shard_ = shard_.clone();
    }
  }

  // The master partition: the shard itself where it is already float32 or float64 and where the
  // step runs (no copy: a float32 model with both offloads steps its host shard), else a float32
  // copy (in host memory with offload_optimizer).
  const DType master_dtype = is_reduced_float(model_options.dtype()) ? kFloat32 : model_options.dtype();
  const Device master_device = options_.offload_optimizer ? Device::cpu() : model_options.device();
  if (master_dtype == shard_.dtype() && master_device == shard_.device()) {
    master_ = shard_.detach().requires_grad_();
  } else {
    master_ = shard_.to(master_device, master_dtype).contiguous().requires_grad_();
  }

  if (options_.stage <= 1) {
    flat_grads_ = zeros({layout_->padded_numel()}, model_options.dtype(accumulate));
    grad_shard_ = flat_grads_.narrow(0, part.begin, part.size());
  } else {
    grad_shard_ = zeros({part.size()}, model_options.dtype(accumulate));
  }

  // One inner optimizer per sub-group (stage 3 may cut the partition; make_sub_groups), each over
  // its part of the master partition, or over master_ itself where there is one group.
  const std::vector<FlatRange> ranges = options_.stage == 3
                                            ? make_sub_groups(*layout_, rank, options_.sub_group_size)
                                            : std::vector<FlatRange>{{0, part.size()}};
  for (const FlatRange& range : ranges) {
    SubGroup sg{.range = range,
                .master = ranges.size() == 1 ? master_
                                             : master_.detach().narrow(0, range.begin, range.size()).requires_grad_(),
                .inner = nullptr};
    sg.inner = make_optimizer({sg.master});
    KILN_CHECK(sg.inner != nullptr, "ZeRO: the function that makes the inner optimizer returned null");
    const auto& groups = sg.inner->param_groups();
    KILN_CHECK(groups.size() == 1 && groups[0].params.size() == 1 && groups[0].params[0].is_same(sg.master),
               "ZeRO: the inner optimizer ({}) must hold exactly the one master tensor it was given, in one group",
               sg.inner->name());
    sub_groups_.push_back(std::move(sg));
  }
  name_ = fmt::format("ZeRO-{}({})", options_.stage, sub_groups_[0].inner->name());
  add_group(params_, sub_groups_[0].inner->param_groups()[0].options);

  const auto mode = options_.stage == 0   ? GradReducer::Mode::kAllReduce
                    : options_.stage == 1 ? GradReducer::Mode::kReduceScatter
                                          : GradReducer::Mode::kBucketed;
  // Accumulated wider than the model, the gradients travel in the model's dtype unless
  // communication_data_type says otherwise, as DeepSpeed's (its default is the model's dtype).
  const GradAveraging averaging{
      .dtype = options_.communication_data_type ? options_.communication_data_type
                                                : std::optional<DType>(model_options.dtype()),
      .param_dtypes = options_.autocast_dtype ? communication_dtypes_ : std::vector<DType>{},
      .predivide = options_.gradient_predivide_factor == 1.0 ? 0.0 : options_.gradient_predivide_factor,
      .prescale = options_.prescale_gradients,
      .quantized = options_.zero_quantized_gradients};
  reducer_ = std::make_unique<GradReducer>(*shard_comm_, *layout_, params_, mode, options_.reduce_bucket_size,
                                           options_.overlap_comm, flat_grads_, grad_shard_, averaging);
  if (options_.stage == 3) {
    gatherer_ = std::make_unique<ParamGatherer>(
        *shard_comm_, *layout_, params_, shard_, model_,
        ParamGatherer::Options{.prefetch_bucket_size = options_.stage3_prefetch_bucket_size,
                               .param_persistence_threshold = options_.stage3_param_persistence_threshold,
                               .model_persistence_threshold = options_.stage3_model_persistence_threshold,
                               .max_live_parameters = options_.stage3_max_live_parameters,
                               .max_reuse_distance = options_.stage3_max_reuse_distance,
                               .gather_dtypes = options_.autocast_dtype ? communication_dtypes_ : std::vector<DType>{},
                               .secondary = hpz_comm_.get(),
                               .quantized_weights = options_.zero_quantized_weights});
    flat_params_ = Tensor();  // the parameters were its last views: the full weights are gone
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::set_gradient_accumulation_boundary(bool boundary) { reducer_->set_sync(boundary); }

void ZeroOptimizer::reduce_gradients() { reducer_->reduce(); }

void ZeroOptimizer::add_to_gradient(const Tensor& param, const Tensor& g) { reducer_->add_to_gradient(param, g); }

int64_t ZeroOptimizer::buckets_started_during_backward() const { return reducer_->buckets_started_during_backward(); }

int64_t ZeroOptimizer::gradient_bytes_sent() const { return reducer_->sent_bytes(); }

ParamGatherer::Stats ZeroOptimizer::stage3_stats() const { return gatherer_ ? gatherer_->stats() : ParamGatherer::Stats{}; }

void ZeroOptimizer::register_external_parameter(nn::Module& module, const Tensor& param) {
  if (gatherer_) gatherer_->register_external_parameter(module, param);
}

std::vector<FlatRange> ZeroOptimizer::sub_groups() const {
  std::vector<FlatRange> out;
  for (const SubGroup& sg : sub_groups_) out.push_back(sg.range);
  return out;
}

void ZeroOptimizer::gradients_complete() {
  reducer_->check_no_grads();
  if (!replica_comm_) return;
  if (replicas_averaged_) {
    KILN_CHECK(reducer_->reductions() == averaged_after_,
               "ZeRO: a backward ran after the gradients were read (grads(), unscaling or clip_grad_norm_) and before "
               "step() or zero_grad(); with mics_shard_size each gradient partition is averaged with its replicas in the "
               "other shard groups once a step, when first read, so read them after the accumulation's last backward");
    return;
  }
  // The shard group's average, averaged with the other groups': the average over every rank.
  NoGradGuard no_grad;
  CommCaller caller("MiCS gradient partitions over the replicas");
  replica_comm_->all_reduce(grad_shard_, ReduceOp::Avg);
  replicas_averaged_ = true;
  averaged_after_ = reducer_->reductions();
}

bool ZeroOptimizer::converts_per_sub_group() const {
  const bool own = master_.dtype() == grad_shard_.dtype() && master_.device() == grad_shard_.device();
  return sub_groups_.size() > 1 && !own && !master_grad_ready_;
}

void ZeroOptimizer::prepare_master_grads() {
  gradients_complete();  // also where the copy is made already: with MiCS, a backward since is an Error
  if (master_grad_ready_) return;
  NoGradGuard no_grad;
  const bool own = master_.dtype() == grad_shard_.dtype() && master_.device() == grad_shard_.device();
  Tensor g = own ? grad_shard_ : grad_shard_.to(master_.device(), master_.dtype());
  for (double f : pending_factors_) g.mul_(f);  // kept by unscale_grads_ and clip_grad_norm_
  pending_factors_.clear();
  master_.set_grad(g);
  master_grad_ready_ = true;
}

Tensor ZeroOptimizer::sub_group_grad(size_t k) const {
  const FlatRange r = sub_groups_[k].range;
  if (master_grad_ready_) return master_.grad().narrow(0, r.begin, r.size());
  // A copy (converts_per_sub_group: the dtype or the device differs).
  Tensor g = grad_shard_.narrow(0, r.begin, r.size()).to(master_.device(), master_.dtype());
  for (double f : pending_factors_) g.mul_(f);  // as they were applied to the whole copy, in order
  return g;
}

std::vector<Tensor> ZeroOptimizer::grads() {
  prepare_master_grads();
  return {master_.grad()};
}

optim::Optimizer::Unscaled ZeroOptimizer::unscale_grads_(double factor) {
  if (!converts_per_sub_group()) return Optimizer::unscale_grads_(factor);
  gradients_complete();
  NoGradGuard no_grad;
  // Each sub-group as the step will read it (the factor is applied there): an inf or NaN anywhere
  // makes its sum inf or NaN. The sums are float64, which float32 elements cannot overflow, added
  // up where they are and read once.
  Tensor total;
  for (size_t k = 0; k < sub_groups_.size(); ++k) {
    Tensor g = sub_group_grad(k);
    Tensor s = g.mul_(factor).sum(kFloat64);
    total = total.defined() ? total + s : s;
  }
  pending_factors_.push_back(factor);
  return {.has_grads = true, .found_inf = !std::isfinite(total.item<double>())};
}

Tensor ZeroOptimizer::clip_grad_norm_(double max_norm, const std::vector<Communicator*>& model_parallel,
                                      const std::function<bool(const Tensor& param)>& counted) {
  KILN_CHECK(max_norm > 0, "ZeRO.clip_grad_norm_: max_norm must be > 0, not {}", max_norm);
  const bool per_sub_group = converts_per_sub_group();
  if (per_sub_group) gradients_complete();
  else prepare_master_grads();
  NoGradGuard no_grad;
  const FlatRange part = layout_->partition(options_.stage > 0 ? shard_comm_->rank() : 0);
  // The squares of g, the gradients of the partition's offsets r, less the parameters counted
  // elsewhere (their elements there).
  auto squares = [&](const Tensor& g, FlatRange r) {
    Tensor sq = g.square().sum(kFloat64);
    if (!counted) return sq;
    const FlatRange here{part.begin + r.begin, part.begin + r.end};
    for (size_t k = 0; k < params_.size(); ++k) {
      if (counted(params_[k])) continue;
      const FlatRange mine = intersect(layout_->param(static_cast<int64_t>(k)), here);
      if (!mine.empty()) sq = sq - g.narrow(0, mine.begin - here.begin, mine.size()).square().sum(kFloat64);
    }
    return sq;
  };
  // The squares of this rank's partition, summed over the ranks: every element of the model is in
  // exactly one partition (the padding is zeros), so this is the whole model's squared norm. (With
  // MiCS, over the shard group: the other groups hold the same partitions, averaged alike.)
  Tensor sq;
  if (!per_sub_group) {
    sq = squares(master_.grad(), {0, part.size()});
  } else {
    for (size_t k = 0; k < sub_groups_.size(); ++k) {
      Tensor s = squares(sub_group_grad(k), sub_groups_[k].range);
      sq = sq.defined() ? sq + s : s;
    }
  }
  sq = sq.reshape({1}).to(comm_->device());
  CommCaller caller("gradient norm");
  if (options_.stage > 0) shard_comm_->all_reduce(sq, ReduceOp::Sum);
  for (Communicator* c : model_parallel) {
    if (c->size() > 1) c->all_reduce(sq, ReduceOp::Sum);
  }
  const double total = std::sqrt(sq.item<double>());
  const double coef = max_norm / (total + 1e-6);  // torch.nn.utils.clip_grad_norm_'s rule
  if (coef < 1) {
    if (per_sub_group) pending_factors_.push_back(coef);  // applied in the step
    else master_.grad().mul_(coef);
  }
  return scalar_tensor(total, kFloat64);
}

void ZeroOptimizer::step() {
  if (gatherer_) gatherer_->finish_pending();  // the all-gathers in flight read the shard the step writes
  if (converts_per_sub_group()) gradients_complete();
  else prepare_master_grads();
  NoGradGuard no_grad;
  const bool rounds = !master_.is_same(shard_) && master_.data_ptr() != shard_.data_ptr();
  // A sub-group at a time: its float32 gradients (where they are made here), its inner step, and
  // its new weights rounded into the shard, so the step's temporaries are one sub-group's.
  for (size_t k = 0; k < sub_groups_.size(); ++k) {
    SubGroup& sg = sub_groups_[k];
    sg.inner->param_groups()[0].options = groups_[0].options;  // what schedulers changed
    if (sub_groups_.size() > 1) sg.master.set_grad(sub_group_grad(k));  // one group: master_ holds it
    sg.inner->step();
    if (sub_groups_.size() > 1) sg.master.set_grad(Tensor());
    if (rounds) shard_.narrow(0, sg.range.begin, sg.range.size()).copy_(sg.master);
  }
  pending_factors_.clear();
  if (options_.stage == 1 || options_.stage == 2) {
    // Every rank's new partition to every rank, in chunks of at most allgather_bucket_size.
    const int64_t P = layout_->partition_numel();
    const int rank = shard_comm_->rank();
    CommCaller caller("ZeRO updated partitions");
    if (options_.allgather_bucket_size >= P) {
      shard_comm_->all_gather_into_tensor(flat_params_, shard_);
    } else {
      for (int64_t c0 = 0; c0 < P; c0 += options_.allgather_bucket_size) {
        const int64_t len = std::min(options_.allgather_bucket_size, P - c0);
        std::vector<Tensor> outputs;
        for (int r = 0; r < shard_comm_->size(); ++r) outputs.push_back(flat_params_.narrow(0, r * P + c0, len));
        shard_comm_->all_gather(outputs, flat_params_.narrow(0, rank * P + c0, len));
      }
    }
  }
  if (gatherer_) gatherer_->release_all();  // any weight still gathered is stale now
  if (master_.grad().defined() && !master_.grad().is_same(grad_shard_)) master_.set_grad(Tensor());
  master_grad_ready_ = false;
  replicas_averaged_ = false;
}

void ZeroOptimizer::zero_grad(bool /*set_to_none*/) {
  NoGradGuard no_grad;
  if (flat_grads_.defined()) flat_grads_.zero_();
  else grad_shard_.zero_();
  reducer_->attach_grads();
  if (master_.grad().defined() && !master_.grad().is_same(grad_shard_)) master_.set_grad(Tensor());
  master_grad_ready_ = false;
  replicas_averaged_ = false;
  pending_factors_.clear();
}

int64_t ZeroOptimizer::full_numel(const Tensor& p) const {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (params_[k].is_same(p)) return layout_->param(static_cast<int64_t>(k)).size();
  }
  return p.numel();
}

ZeroOptimizer::ModelStateBytes ZeroOptimizer::model_state_bytes() const {
  ModelStateBytes b;
  b.params = options_.stage == 3 ? shard_.nbytes() + gatherer_->persistent_bytes() + gatherer_->secondary_bytes()
                                 : flat_params_.nbytes();
  b.grads = flat_grads_.defined() ? flat_grads_.nbytes() : grad_shard_.nbytes();
  b.master = master_.data_ptr() == shard_.data_ptr() ? 0 : master_.nbytes();
  for (const SubGroup& sg : sub_groups_) {
    if (const optim::ParamState* st = sg.inner->find_state(sg.master)) {
      for (const auto& [name, t] : st->buffers) b.optimizer_state += t.nbytes();
    }
  }
  return b;
}

// ---- state ----

TensorDict ZeroOptimizer::consolidated_state_dict(int dst, bool exclude_frozen_parameters) {
  KILN_CHECK(dst >= 0 && dst < comm_->size(), "consolidated_state_dict: dst {} is not a rank of this world of {}",
             dst, comm_->size());
  // Each name of the state dict to its parameter, through the modules that hold it: a parameter
  // that two modules share has two names, and each must find it.
  std::map<std::string, size_t> trainable;  // name -> index in params_
  std::set<std::string> frozen;
  for (const auto& [prefix, m] : model_.named_modules()) {
    for (const auto& [own, p] : m->named_parameters(/*recurse=*/false)) {
      const std::string name = prefix.empty() ? own : prefix + "." + own;
      if (!p.requires_grad()) {
        frozen.insert(name);
        continue;
      }
      for (size_t k = 0; k < params_.size(); ++k) {
        if (params_[k].is_same(p)) trainable.emplace(name, k);
      }
    }
  }
  if (gatherer_) gatherer_->finish_pending();
  const bool here = comm_->rank() == dst;
  NoGradGuard no_grad;
  TensorDict out;
  for (const auto& [name, t] : model_.state_dict()) {
    if (exclude_frozen_parameters && frozen.count(name)) continue;
    const auto it = trainable.find(name);
    // The same order on every rank (the state dict's), so the all-gathers match.
    Tensor whole = gatherer_ && it != trainable.end() && !gatherer_->is_gathered(it->second)
                       ? gatherer_->gathered_copy(it->second)
                       : t;
    if (here) out.insert(name, whole.is_cpu() && whole.is_same(t) ? t.clone() : whole.to(Device::cpu()).contiguous());
  }
  return out;
}

TensorDict ZeroOptimizer::state_dict() const {
  TensorDict dict = Optimizer::state_dict();  // param_groups.*: this optimizer's (the schedulers') options
  // The inner state: the one inner optimizer's (its buffers shared), or the sub-groups' buffers end
  // to end (copies), so that the file is that of one group whatever sub_group_size was.
  std::vector<TensorDict> inner;
  for (const SubGroup& sg : sub_groups_) inner.push_back(sg.inner->state_dict());
  for (const auto& [key, t] : inner[0]) {
    if (key.rfind("state.", 0) != 0) continue;
    if (sub_groups_.size() == 1 || t.dim() != 1) {
      dict.insert(key, t);  // a 0-d entry (the step count): the same in every sub-group, which step together
      continue;
    }
    std::vector<Tensor> parts;
    for (const TensorDict& d : inner) parts.push_back(d.at(key));
    dict.insert(key, cat(parts, 0));
  }
  dict.insert("master", master_.detach());
  dict.insert("zero.stage", int64_scalar(options_.stage));
  dict.insert("zero.rank", int64_scalar(shard_comm_->rank()));  // the partition's number
  dict.insert("zero.world_size", int64_scalar(comm_->size()));
  dict.insert("zero.partitions", int64_scalar(layout_->num_partitions()));
  dict.insert("zero.numel", int64_scalar(layout_->numel()));
  return dict;
}

void ZeroOptimizer::load_state_dict(const TensorDict& dict) {
  const int64_t partitions = read_int(dict, "zero.partitions", "ZeRO.load_state_dict");
  const int64_t rank = read_int(dict, "zero.rank", "ZeRO.load_state_dict");
  const int64_t here = layout_->num_partitions() == 1 ? 0 : shard_comm_->rank();
  KILN_CHECK(partitions == layout_->num_partitions() && (partitions == 1 || rank == here),
             "ZeRO.load_state_dict: the state dict is rank {}'s shard of {} partition(s), but this rank ({} of {}) "
             "has partition {} of {}; to load shards saved at another world size or stage, pass every rank's to "
             "load_sharded_state_dict (Engine::load_checkpoint does)",
             rank, partitions, comm_->rank(), comm_->size(), here, layout_->num_partitions());
  load_partitions({{partitions == 1 ? 0 : rank, &dict}});
}

void ZeroOptimizer::load_sharded_state_dict(const std::vector<TensorDict>& shards) {
  KILN_CHECK(!shards.empty(), "ZeRO.load_sharded_state_dict: no shard given; pass every rank's state_dict()");
  const int64_t partitions = read_int(shards[0], "zero.partitions", "ZeRO.load_sharded_state_dict");
  KILN_CHECK(static_cast<int64_t>(shards.size()) >= partitions,
             "ZeRO.load_sharded_state_dict: the checkpoint has {} partitions but {} shard(s) were given; pass every "
             "rank's, in rank order", partitions, shards.size());
  std::vector<std::pair<int64_t, const TensorDict*>> by_partition;
  for (int64_t q = 0; q < partitions; ++q) {
    KILN_CHECK(read_int(shards[q], "zero.rank", "ZeRO.load_sharded_state_dict") == q || partitions == 1,
               "ZeRO.load_sharded_state_dict: shard {} is not rank {}'s; pass the shards in rank order", q, q);
    by_partition.emplace_back(q, &shards[q]);
  }
  load_partitions(by_partition);
}

void ZeroOptimizer::load_partitions(const std::vector<std::pair<int64_t, const TensorDict*>>& shards) {
  const char* who = "ZeRO.load_state_dict";
  const TensorDict& head = *shards[0].second;
  const int64_t numel = read_int(head, "zero.numel", who);
  KILN_CHECK(numel == layout_->numel(),
             "{}: the checkpoint's model has {} trainable elements but this one has {}; load it into the model it "
             "was saved from", who, numel, layout_->numel());
  const int64_t old_p = head.at("master").numel();
  const FlatRange part = layout_->partition(layout_->num_partitions() == 1 ? 0 : shard_comm_->rank());

  // An entry of the old partitions' size is partitioned: this rank's new partition is cut from the
  // old ones that overlap it. Anything else (a step count) is the same on every rank: the first's.
  auto repartition = [&](const std::string& key) {
    Tensor out = zeros({part.size()}, TensorOptions(head.at(key).dtype()));
    for (const auto& [q, dict] : shards) {
      const Tensor& t = dict->at(key);
      KILN_CHECK(t.numel() == old_p, "{}: '{}' of shard {} has {} elements, not {}", who, key, q, t.numel(), old_p);
      const FlatRange old_part{q * old_p, (q + 1) * old_p};
      const FlatRange both = intersect(intersect(old_part, part), FlatRange{0, numel});
      if (both.empty()) continue;
      out.narrow(0, both.begin - part.begin, both.size())
          .copy_(t.reshape({-1}).narrow(0, both.begin - old_part.begin, both.size()));
    }
    return out;
  };

  TensorDict groups_only, for_inner;
  Tensor master;
  for (const auto& [key, t] : head) {
    if (key.rfind("zero.", 0) == 0) continue;
    if (key == "master") {
      master = repartition(key);
    } else if (key.rfind("param_groups.", 0) == 0) {
      groups_only.insert(key, t);
      if (key != "param_groups.0.params") for_inner.insert(key, t);
    } else {
      KILN_CHECK(key.rfind("state.0.", 0) == 0,
                 "{}: unexpected entry '{}'; a ZeRO shard holds param_groups.*, state.0.*, master and zero.*", who, key);
      for_inner.insert(key, t.dim() == 1 && t.numel() == old_p ? repartition(key) : t);
    }
  }
  for_inner.insert("param_groups.0.params", from_vector<int64_t>({0}));
  // Each sub-group's inner optimizer gets its part of the partition's buffers; it checks the
  // options and the state's shapes, then copies them.
  for (const SubGroup& sg : sub_groups_) {
    if (sub_groups_.size() == 1) {
      sg.inner->load_state_dict(for_inner);
      break;
    }
    TensorDict mine;
    for (const auto& [key, t] : for_inner) {
      const bool per_element = key.rfind("state.", 0) == 0 && t.dim() == 1 && t.numel() == part.size();
      mine.insert(key, per_element ? t.narrow(0, sg.range.begin, sg.range.size()) : t);
    }
    sg.inner->load_state_dict(mine);
  }
  Optimizer::load_state_dict(groups_only);
  NoGradGuard no_grad;
  if (gatherer_) gatherer_->finish_pending();
  master_.copy_(master);
  if (master_.data_ptr() != shard_.data_ptr()) shard_.copy_(master_);
  if (options_.stage == 1 || options_.stage == 2) shard_comm_->all_gather_into_tensor(flat_params_, shard_);
  if (gatherer_) gatherer_->release_all();
}

// ---- stage 3: gathered weights ----

ZeroOptimizer::GatheredParameters::GatheredParameters(ZeroOptimizer& opt) : opt_(opt) {
  if (opt_.gatherer_) opt_.gatherer_->pin_all();
}

ZeroOptimizer::GatheredParameters::~GatheredParameters() {
  if (opt_.gatherer_) opt_.gatherer_->unpin_all();
}

// ---- ShardedGradScaler ----

ShardedGradScaler::ShardedGradScaler(std::shared_ptr<Communicator> comm, optim::GradScalerOptions options)
    : GradScaler(options), comm_(std::move(comm)) {
  KILN_CHECK(comm_ != nullptr, "ShardedGradScaler: the communicator is null; pass distributed::init()");
}

bool ShardedGradScaler::found_inf_anywhere(bool found_inf_here) {
  Tensor flag = from_vector<int32_t>({found_inf_here ? 1 : 0}).to(comm_->device());
  CommCaller caller("loss scaler overflow check");
  comm_->all_reduce(flag, ReduceOp::Max);
  return flag.item<int32_t>() != 0;
}

}  // namespace kiln::distributed

// distributed/zero/param_gatherer.cpp: stage 3's gathering, prefetching and dropping of weights
// (see param_gatherer.h).
#include "distributed/zero/param_gatherer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <unordered_map>
#include <vector>

#include "core/grad_mode.h"
#include "distributed/comm/comms_logger.h"
#include "ops/ops.h"

namespace kiln::distributed {

namespace {

constexpr size_t kMaxTraceEvents = size_t{1} << 20;

int64_t numel_of(const FlatLayout& layout, size_t k) { return layout.param(static_cast<int64_t>(k)).size(); }

// Each rank's piece of parameter range `range` in `layout` (its partitions), as offsets into the
// gathered parameter (`at`), with that piece's first quantization block among the pieces' blocks
// laid one rank after another (`block`, qwZ's scales). Empty pieces keep their place.
struct Piece {
  int64_t at, size, block, blocks;
};
std::vector<Piece> pieces_of(const FlatRange& range, const FlatLayout& layout, int ranks) {
  std::vector<Piece> pieces;
  pieces.reserve(static_cast<size_t>(ranks));
  int64_t block = 0;
  for (int r = 0; r < ranks; ++r) {
    const FlatRange piece = intersect(range, layout.partition(r));
    const int64_t at = piece.empty() ? 0 : piece.begin - range.begin;
    pieces.push_back({at, piece.size(), block, quant_blocks(piece.size())});
    block += pieces.back().blocks;
  }
  return pieces;
}
}  // namespace

// Note [the fetch trace]
// ~~~~~~~~~~~~~~~~~~~~~~
// A fetch is an event: hooked module m's forward (2m) or its backward (2m + 1). Training runs the
// same events in the same order every iteration, and every rank runs the same ones, so the order
// seen in one iteration predicts the next (DeepSpeed's PartitionedParameterCoordinator records it
// the same way). The trace is in one of three states:
//
//   kRecord   each event is appended. The next step() (release_all) ends the iteration: the trace
//             is complete and the state turns kReplay (with nothing recorded, it stays kRecord).
//             Past kMaxTraceEvents without a step, it gives up: kMissed.
//   kReplay   each event is checked against trace_[cursor_] and advances the cursor. After it, the
//             parameters of the events ahead are started, in trace order, while fewer than
//             prefetch_bucket_size elements are in flight and at most max_live_parameters are
//             gathered or in flight. An event equal to trace_[0] where the trace expected another
//             starts the trace again (an iteration without a step: fp16 skipped the step, or an
//             evaluation forward had no backward). Any other difference is a miss: kMissed.
//   kMissed   nothing is prefetched or kept for reuse until the next step, which records anew.
//
// Every decision (what to prefetch, what to keep) is a function of the trace, the cursor and which
// parameters are gathered or in flight, and those evolve the same on every rank: the all-gathers
// stay matched across ranks. A prefetch is never wrong, only early: the weights do not change
// between steps, and step() completes the prefetches in flight (finish_pending) before it writes
// the shard they read.
//
// Keeping (max_reuse_distance): when no running forward reads a parameter any more, it is dropped
// unless the trace uses it again within max_reuse_distance elements of other fetches (trace_numel_
// holds the running sums). Its forward use and its backward use are the whole model apart at the
// last layer and a few layers apart at the first, so DeepSpeed's default (1e9 elements) keeps a
// small model's weights from their forward to their backward: fewer all-gathers, more memory.
// Outside grad mode nothing is kept: a forward under NoGradGuard has no backward to come.

ParamGatherer::ParamGatherer(Communicator& comm, const FlatLayout& layout, std::vector<Tensor> params, Tensor shard,
                             nn::Module& model, Options options)
    : comm_(comm),
      layout_(layout),
      options_(options),
      params_(std::move(params)),
      device_(params_.empty() ? shard.device() : params_[0].device()),
      gather_device_(comm.device().is_cpu() ? shard.device() : device_),
      gathered_(params_.size(), true),
      persistent_(params_.size(), false),
      rounded_(params_.size(), false),
      pending_(params_.size()),
      users_(params_.size(), 0),
      shard_(std::move(shard)),
      uses_(params_.size()) {
  auto check = [](int64_t v, const char* key) {
    KILN_CHECK(v >= 0, "ZeRO stage 3: {} must be >= 0 elements, not {}", key, v);
  };
  check(options_.prefetch_bucket_size, "stage3_prefetch_bucket_size");
  check(options_.param_persistence_threshold, "stage3_param_persistence_threshold");
  check(options_.model_persistence_threshold, "stage3_model_persistence_threshold");
  check(options_.max_live_parameters, "stage3_max_live_parameters");
  check(options_.max_reuse_distance, "stage3_max_reuse_distance");
  KILN_CHECK(options_.gather_dtypes.empty() || options_.gather_dtypes.size() == params_.size(),
             "ZeRO stage 3: {} gather dtypes for {} parameters; give one per parameter, or none",
             options_.gather_dtypes.size(), params_.size());
  for (DType d : options_.gather_dtypes) {
    KILN_CHECK(is_floating(d), "ZeRO stage 3: parameters are gathered in a floating dtype, not {}", dtype_name(d));
  }
  secondary_state_.assign(params_.size(), 0);
  if (Communicator* group = options_.secondary) {
    KILN_CHECK(comm_.size() % group->size() == 0,
               "ZeRO stage 3: hpZ's secondary group of {} ranks does not divide the {} ranks of the shards",
               group->size(), comm_.size());
    std::vector<int64_t> numels;
    for (size_t k = 0; k < params_.size(); ++k) numels.push_back(numel_of(layout_, k));
    secondary_layout_ = std::make_unique<FlatLayout>(std::move(numels), group->size());
    // Where the gathers read: beside the shard on a host communicator, else on the device.
    secondary_shard_ = zeros({secondary_layout_->partition_numel()}, TensorOptions(shard_.dtype()).device(gather_device_));
  }
  std::unordered_map<const TensorImpl*, size_t> index;
  int64_t persistent_numel = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    shapes_.push_back(params_[k].sizes());
    index.emplace(params_[k].impl(), k);
    // In the layout's order, while the persistent ones stay within model_persistence_threshold.
    persistent_[k] = params_[k].numel() <= options_.param_persistence_threshold &&
                     params_[k].numel() <= options_.model_persistence_threshold - persistent_numel;
    (persistent_[k] ? persistent_numel : live_numel_) += params_[k].numel();
  }
  // Every module that owns trainable parameters gathers them around its forward. A tied parameter
  // is owned by each module that registered it.
  for (nn::Module* m : model.modules()) {
    std::vector<size_t> owned;
    for (const Tensor& p : m->parameters(/*recurse=*/false)) {
      if (auto it = index.find(p.impl()); it != index.end()) owned.push_back(it->second);
    }
    if (!owned.empty()) hook_module(*m, std::move(owned));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    grad_hooks_.push_back(params_[k].register_post_accumulate_grad_hook([this, k](const Tensor&) {
      if (users_[k] == 0) done_with(k);
    }));
  }
  release_all();
}

ParamGatherer::~ParamGatherer() {
  for (auto& h : module_hooks_) h.remove();
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_post_accumulate_grad_hook(grad_hooks_[k]);
  // Leave the model usable without ZeRO, unless this rank is unwinding from an Error the others may
  // not share: they would never join the all-gathers (the weights then stay dropped).
  if (std::uncaught_exceptions() == 0) gather_all();
}

void ParamGatherer::hook_module(nn::Module& module, std::vector<size_t> owned) {
  const size_t event = 2 * owned_.size();
  auto ks = std::make_shared<std::vector<size_t>>(std::move(owned));
  owned_.emplace_back(&module, ks);
  module_hooks_.push_back(module.register_forward_pre_hook([this, event, ks](nn::Module&, const Tensor&) {
    for (size_t k : *ks) ++users_[k];
    fetch(event, *ks);
    return Tensor();
  }));
  module_hooks_.push_back(
      module.register_forward_hook([this, event, ks](nn::Module&, const Tensor&, const Tensor& output) {
        // A parameter that an enclosing module's forward still reads (GPT's tied head reads the
        // embedding's weight after the embedding has run) stays until that forward ends too.
        for (size_t k : *ks) {
          if (--users_[k] == 0) done_with(k);
        }
        // The gradient of the output arrives just before backward enters this module's nodes,
        // which read the weights: fetch them then.
        if (output.defined() && output.requires_grad()) {
          output.register_hook([this, event, ks](const Tensor&) {
            fetch(event + 1, *ks);
            return Tensor();
          });
        }
        return Tensor();
      }));
}

void ParamGatherer::register_external_parameter(nn::Module& module, const Tensor& param) {
  const size_t k = index_of(param);
  for (auto& [m, ks] : owned_) {
    if (m != &module) continue;
    if (std::find(ks->begin(), ks->end(), k) == ks->end()) ks->push_back(k);
    return;
  }
  hook_module(module, {k});
}

size_t ParamGatherer::index_of(const Tensor& param) const {
  for (size_t k = 0; k < params_.size(); ++k)
    if (params_[k].is_same(param)) return k;
  KILN_FAIL("ZeRO stage 3: register_external_parameter: the tensor is not one of the trainable parameters this "
            "optimizer partitions; pass a parameter of the model it was built over");
}

void ParamGatherer::fetch(size_t event, const std::vector<size_t>& ks) {
  if (!pinned_) follow_trace(event);
  // Start what is neither here nor on its way, then wait for all of it: the all-gathers of one
  // module move together.
  for (size_t k : ks) {
    if (!gathered_[k] && !pending_[k]) {
      start(k, /*exact=*/pinned_, /*backward=*/event % 2 == 1);
      ++stats_.gathers;
    }
  }
  for (size_t k : ks) {
    if (pending_[k]) finish(k);
  }
  if (trace_state_ == TraceState::kReplay && !pinned_) prefetch();
}

void ParamGatherer::follow_trace(size_t event) {
  switch (trace_state_) {
    case TraceState::kRecord:
      trace_.push_back(event);
      // Forwards without a step (evaluation only) would grow it without end.
      if (trace_.size() > kMaxTraceEvents) trace_state_ = TraceState::kMissed;
      return;
    case TraceState::kMissed:
      return;
    case TraceState::kReplay:
      if (cursor_ < trace_.size() && trace_[cursor_] == event) {
        ++cursor_;
      } else if (trace_[0] == event) {
        cursor_ = 1;  // an iteration that began without a step (Note [the fetch trace])
      } else {
        ++stats_.trace_misses;
        trace_state_ = TraceState::kMissed;
      }
      return;
  }
}

void ParamGatherer::prefetch() {
  for (size_t j = cursor_; j < trace_.size(); ++j) {
    for (size_t k : *owned_[trace_[j] / 2].second) {
      if (in_flight_numel_ >= options_.prefetch_bucket_size) return;
      if (gathered_[k] || pending_[k]) continue;
      if (!persistent_[k] && live_numel_ + numel_of(layout_, k) > options_.max_live_parameters)
        return;
      start(k, /*exact=*/false, /*backward=*/trace_[j] % 2 == 1);
      ++stats_.prefetches;
    }
  }
}

ParamGatherer::Pending ParamGatherer::all_gather_param(size_t k, bool exact, bool backward) {
  NoGradGuard no_grad;
  Pending p;
  // hpZ: a backward fetch reads the secondary shards of this rank's group where they hold this
  // step's weights (and, for an exact gather, hold them exactly); otherwise the shards of all.
  p.from_secondary = backward && secondary_state_[k] != 0 && !(exact && secondary_state_[k] == 2);
  Communicator& comm = p.from_secondary ? *options_.secondary : comm_;
  const FlatLayout& layout = p.from_secondary ? *secondary_layout_ : layout_;
  const Tensor& shard = p.from_secondary ? secondary_shard_ : shard_;
  const FlatRange range = layout.param(static_cast<int64_t>(k));
  const FlatRange part = layout.partition(comm.rank());
  // qwZ: the gathers from the shards that may round, in int8 (see the end of this function), but not
  // the persistent parameters', which DeepSpeed never partitions (nor quantizes).
  p.quantized = options_.quantized_weights && !exact && !p.from_secondary && !persistent_[k];
  const DType wire = exact || p.quantized || options_.gather_dtypes.empty() ? shard_.dtype() : options_.gather_dtypes[k];
  p.rounded = wire != shard_.dtype() || p.quantized;
  // Gathered on the host for a GPU, it goes to the GPU from pinned memory without the host waiting.
  p.full = empty({range.size()}, TensorOptions(wire)
                                      .device(gather_device_)
                                      .pinned_memory(gather_device_.is_cpu() && device_.is_cuda()));
  const std::vector<Piece> pieces = pieces_of(range, layout, comm.size());
  const FlatRange mine = intersect(range, part);
  p.input = mine.empty() ? shard.narrow(0, 0, 0) : shard.narrow(0, mine.begin - part.begin, mine.size());
  if (p.input.device() != gather_device_) p.input = p.input.to(gather_device_, /*non_blocking=*/p.input.is_pinned());
  if (p.quantized) {
    // Each rank's piece is quantized in blocks of its own: the values land at the piece's place, the
    // scales one rank after another (Piece::block); finish() dequantizes into full.
    p.q = empty({range.size()}, TensorOptions(kInt8).device(gather_device_));
    p.scales = empty({pieces.back().block + pieces.back().blocks}, TensorOptions(kFloat32).device(gather_device_));
    std::vector<Tensor> q_outputs, scale_outputs;
    for (const Piece& piece : pieces) {
      q_outputs.push_back(p.q.narrow(0, piece.at, piece.size));
      scale_outputs.push_back(p.scales.narrow(0, piece.block, piece.blocks));
    }
    Quantized mine_q = quantize_blocks(p.input);
    p.q_input = std::move(mine_q.q);
    p.scale_input = std::move(mine_q.scales);
    CommCaller caller("ZeRO-3 parameter gather (qwZ int8)");
    p.work = comm.all_gather(q_outputs, p.q_input, /*async_op=*/true);
    p.scale_work = comm.all_gather(scale_outputs, p.scale_input, /*async_op=*/true);
    return p;
  }
  if (p.rounded) p.input = p.input.to(wire);
  std::vector<Tensor> outputs;
  for (const Piece& piece : pieces) outputs.push_back(p.full.narrow(0, piece.at, piece.size));
  CommCaller caller(p.from_secondary ? "ZeRO-3 parameter gather (hpZ secondary)" : "ZeRO-3 parameter gather");
  p.work = comm.all_gather(outputs, p.input, /*async_op=*/true);
  return p;
}

Tensor ParamGatherer::on_device(const Tensor& full) const {
  NoGradGuard no_grad;
  Tensor there = full.device() == device_ ? full : full.to(device_, /*non_blocking=*/full.is_pinned());
  return there.dtype() == shard_.dtype() ? there : there.to(shard_.dtype());  // widened back from gather_dtypes'
}

void ParamGatherer::start(size_t k, bool exact, bool backward) {
  Pending p = all_gather_param(k, exact, backward);
  if (p.from_secondary) ++stats_.secondary_gathers;
  if (p.quantized) ++stats_.quantized_gathers;
  stats_.gathered_bytes += p.quantized ? p.q.nbytes() + p.scales.nbytes() : p.full.nbytes();
  in_flight_numel_ += p.full.numel();
  if (!persistent_[k]) live_numel_ += p.full.numel();
  pending_[k] = std::move(p);
}

Tensor ParamGatherer::gathered_copy(size_t k) {
  Pending p = all_gather_param(k, /*exact=*/true);
  p.work.wait();
  return on_device(p.full).view(shapes_[k]);
}

void ParamGatherer::finish(size_t k) {
  Pending p = std::move(*pending_[k]);
  pending_[k].reset();
  in_flight_numel_ -= p.full.numel();
  const auto t0 = std::chrono::steady_clock::now();
  p.work.wait();
  if (p.quantized) p.scale_work.wait();
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NoGradGuard no_grad;
  if (p.quantized) {
    for (const Piece& piece : pieces_of(layout_.param(static_cast<int64_t>(k)), layout_, comm_.size())) {
      dequantize_into(p.q.narrow(0, piece.at, piece.size), p.scales.narrow(0, piece.block, piece.blocks),
                      p.full.narrow(0, piece.at, piece.size));
    }
  }
  if (secondary_layout_ && !p.from_secondary) {
    // hpZ: this rank's piece of the secondary shard, from the weights just gathered.
    const FlatRange range = layout_.param(static_cast<int64_t>(k));
    const FlatRange part = secondary_layout_->partition(options_.secondary->rank());
    const FlatRange mine = intersect(range, part);
    if (!mine.empty()) {
      secondary_shard_.narrow(0, mine.begin - part.begin, mine.size())
          .copy_(p.full.narrow(0, mine.begin - range.begin, mine.size()));
    }
    secondary_state_[k] = p.rounded ? 2 : 1;
  }
  params_[k].set_data(on_device(p.full).view(shapes_[k]));
  gathered_[k] = true;
  rounded_[k] = p.rounded;
}

void ParamGatherer::done_with(size_t k) {
  if (persistent_[k] || !gathered_[k]) return;
  // Without grad mode no backward will come: the trace's next use may never happen.
  if (trace_state_ == TraceState::kReplay && options_.max_reuse_distance > 0 && GradMode::is_enabled()) {
    const std::vector<size_t>& uses = uses_[k];
    const auto next = std::lower_bound(uses.begin(), uses.end(), cursor_);
    if (next != uses.end() && trace_numel_[*next] - trace_numel_[cursor_] < options_.max_reuse_distance) {
      ++stats_.kept_for_reuse;
      return;
    }
  }
  release(k);
}

void ParamGatherer::release(size_t k) {
  if (!gathered_[k]) return;
  params_[k].set_data(empty({0}, TensorOptions(shard_.dtype()).device(device_)));
  gathered_[k] = false;
  if (!persistent_[k]) live_numel_ -= numel_of(layout_, k);
}

void ParamGatherer::finish_pending() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (pending_[k]) finish(k);
  }
}

void ParamGatherer::gather_all() {
  finish_pending();  // a prefetch may be rounded (gather_dtypes): what it brings is gathered again
  for (size_t k = 0; k < params_.size(); ++k) {
    if (gathered_[k] && rounded_[k]) release(k);
    if (!gathered_[k]) start(k, /*exact=*/true);
  }
  finish_pending();
}

void ParamGatherer::release_all() {
  finish_pending();
  std::fill(secondary_state_.begin(), secondary_state_.end(), 0);  // the weights change
  std::fill(users_.begin(), users_.end(), 0);  // after a forward that threw, say
  for (size_t k = 0; k < params_.size(); ++k) release(k);
  // The iteration ends (Note [the fetch trace]).
  if (trace_state_ == TraceState::kRecord && !trace_.empty()) {
    trace_numel_.assign(trace_.size() + 1, 0);
    for (auto& u : uses_) u.clear();
    for (size_t i = 0; i < trace_.size(); ++i) {
      int64_t numel = 0;
      for (size_t k : *owned_[trace_[i] / 2].second) {
        numel += numel_of(layout_, k);
        uses_[k].push_back(i);
      }
      trace_numel_[i + 1] = trace_numel_[i] + numel;
    }
    trace_state_ = TraceState::kReplay;
  } else if (trace_state_ == TraceState::kMissed) {
    trace_.clear();
    trace_state_ = TraceState::kRecord;
  }
  cursor_ = 0;
  // The persistent parameters, from the new shard: all started, then all waited for.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (persistent_[k]) start(k);
  }
  finish_pending();
}

int64_t ParamGatherer::secondary_bytes() const {
  return secondary_shard_.defined() ? secondary_shard_.nbytes() : 0;
}

int64_t ParamGatherer::persistent_bytes() const {
  int64_t bytes = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (persistent_[k]) bytes += numel_of(layout_, k) * itemsize(shard_.dtype());
  }
  return bytes;
}

void ParamGatherer::pin_all() {
  pinned_ = true;
  for (size_t k = 0; k < params_.size(); ++k) ++users_[k];
  gather_all();
}

void ParamGatherer::unpin_all() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (users_[k] > 0 && --users_[k] == 0 && !persistent_[k]) release(k);
  }
  pinned_ = false;
}

}  // namespace kiln::distributed

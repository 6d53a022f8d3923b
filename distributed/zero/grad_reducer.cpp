// distributed/zero/grad_reducer.cpp: the gradient hooks and buckets of ZeRO (see grad_reducer.h).
#include "distributed/zero/grad_reducer.h"

#include <algorithm>

#include "autograd/autograd.h"
#include "core/grad_mode.h"
#include "distributed/comm/comms_logger.h"
#include "distributed/zero/quantize.h"
#include "ops/ops.h"

namespace kiln::distributed {

namespace {
// With overlap, a bucket's operation runs while backward goes on; at most this many run at once
// (DeepSpeed double-buffers its bucket the same way), so stage 2's gradient memory stays at a few
// buckets even when the network is faster than backward.
constexpr size_t kMaxInFlight = 2;

// The parts of `ranges` (ascending) inside `within`, ascending, empty ones left out.
std::vector<FlatRange> pieces_in(const std::vector<FlatRange>& ranges, FlatRange within) {
  std::vector<FlatRange> out;
  for (const FlatRange& r : ranges) {
    const FlatRange piece = intersect(r, within);
    if (!piece.empty()) out.push_back(piece);
  }
  return out;
}

// Where flat position `at` (inside one of `ranges`) lies when the ranges are laid end to end.
int64_t offset_in(const std::vector<FlatRange>& ranges, int64_t at) {
  int64_t before = 0;
  for (const FlatRange& r : ranges) {
    if (at >= r.begin && at <= r.end) return before + (at - r.begin);
    before += r.size();
  }
  KILN_FAIL("GradReducer: flat position {} is in none of the bucket's ranges", at);  // the layout's own arithmetic
}
}  // namespace

// Note [buckets of several ranges]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A bucket is usually one range of the flat buffer, and everything below is a view of it: stage
// 0's all-reduce runs in place, and rank r's input to a reduce-scatter is the part of the range in
// partition r. Where buckets are grouped by the dtype they travel in (torch_autocast), a group's
// bucket skips the other groups' parameters and covers several ranges. Its gradients are then laid
// end to end in ascending flat order (the bucket's own order: stage 2's buffer is laid out so),
// and for a reduce-scatter the wire holds rank 0's pieces of every range, then rank 1's, ...: each
// rank's input is one contiguous part, and what each receives is its pieces end to end, copied
// into its partition piece by piece.

// Note [quantized gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// ZeRO++'s qgZ (DeepSpeed's zero_quantized_gradients) replaces a bucket's reduce-scatter. A
// reduce-scatter adds as it goes, in the wire's dtype, so it cannot carry values quantized with
// scales of their own; instead each rank quantizes its input for rank r (int8 blocks of
// kQuantBlock from the piece's start, a float32 scale each: quantize.h) and two all-to-alls bring
// rank r the N pieces of its part, values and scales. r dequantizes each and sums them in float32
// (then divides by N, or multiplies by the after-factor of GradAveraging's predivide), so each
// element of the average is within the mean over ranks of s_i / 2 of the exact one, s_i being the
// scale of the block that held it on rank i. The bytes a rank sends for the others fall to a quarter
// of float32's (about half of a 16-bit wire) plus 4 per block; DeepSpeed's qgZ goes further, with
// int4 values and two hops (within a node, then across nodes) to keep the all-to-all's messages
// large. Kiln takes int8 (qwZ's blocks) and one hop, over the communicator the gradients are
// reduced on (MiCS: its shard group).

struct GradReducer::Bucket {
  GradBucket spec;
  std::optional<DType> wire_dtype;  // the dtype it travels in (GradAveraging), unset: its own
  std::vector<FlatRange> mine;  // spec.ranges' pieces in this rank's partition (kAllReduce: all of them)
  int64_t mine_numel = 0;
  size_t pending = 0;   // gradients still to arrive in this backward
  Tensor buffer;        // kBucketed: the bucket's gradients (its ranges end to end), made when the first arrives
  Tensor wire;          // what the operation reads (kAllReduce: and writes): the bucket, or its copy
                        // in GradAveraging::dtype, or its pieces by rank (Note [buckets of several ranges])
  Tensor output;        // kReduceScatter, kBucketed: this rank's averaged pieces (mine_numel elements)
  // qgZ (Note [quantized gradients]): what each rank sent this one, its values and its scales.
  std::vector<Tensor> q_from, scales_from;
  std::vector<Tensor> q_to, scales_to;  // this rank's pieces for each rank, kept until the exchange ends
  Work scale_work;
  Work work;
  bool launched = false, completed = false;

  void drop_exchange() {  // qgZ's tensors and its second operation, once over
    q_from.clear();
    scales_from.clear();
    q_to.clear();
    scales_to.clear();
    scale_work = Work();
  }
};

GradReducer::GradReducer(Communicator& comm, const FlatLayout& layout, std::vector<Tensor> params, Mode mode,
                         int64_t bucket_numel, bool overlap, Tensor flat_grads, Tensor grad_shard,
                         GradAveraging averaging)
    : comm_(comm),
      layout_(layout),
      params_(std::move(params)),
      mode_(mode),
      overlap_(overlap),
      averaging_(averaging),
      flat_grads_(std::move(flat_grads)),
      grad_shard_(std::move(grad_shard)) {
  KILN_CHECK(static_cast<int64_t>(params_.size()) == layout_.num_params(),
             "GradReducer: {} parameters for a layout of {}", params_.size(), layout_.num_params());
  KILN_CHECK(mode_ == Mode::kBucketed || flat_grads_.defined(),
             "GradReducer: stages 0 and 1 reduce a flat gradient buffer; none was given");
  // ZeroOptimizer checks the options, with their names; here only what the arithmetic needs.
  KILN_CHECK(!averaging_.dtype || is_floating(*averaging_.dtype), "GradReducer: buckets travel in a floating dtype");
  KILN_CHECK(averaging_.param_dtypes.empty() || averaging_.param_dtypes.size() == params_.size(),
             "GradReducer: {} per-parameter dtypes for {} parameters", averaging_.param_dtypes.size(), params_.size());
  std::vector<int> groups;
  for (DType d : averaging_.param_dtypes) {
    KILN_CHECK(is_floating(d), "GradReducer: buckets travel in a floating dtype, not {}", dtype_name(d));
    groups.push_back(static_cast<int>(d));
  }
  KILN_CHECK(averaging_.predivide >= 0, "GradReducer: the predivide factor is negative");
  KILN_CHECK(!averaging_.quantized || mode_ == Mode::kBucketed, "GradReducer: quantized gradients are for kBucketed");
  const double f = averaging_.prescale ? comm_.size() : averaging_.predivide;
  if (f > 0) {  // a sum between two multiplications, else the communicator's average
    before_ = 1.0 / f;
    after_ = f / comm_.size();
    op_ = ReduceOp::Sum;
  }
  const FlatRange part = mode_ == Mode::kAllReduce ? FlatRange{0, layout_.padded_numel()}
                                                   : layout_.partition(comm_.rank());
  bucket_of_.assign(params_.size(), 0);
  offset_in_bucket_.assign(params_.size(), 0);
  for (GradBucket& spec : make_grad_buckets(layout_, bucket_numel, groups)) {
    auto b = std::make_unique<Bucket>();
    b->mine = pieces_in(spec.ranges, part);
    b->mine_numel = numel_of(b->mine);
    b->wire_dtype = groups.empty() ? averaging_.dtype
                                   : std::optional<DType>(averaging_.param_dtypes[static_cast<size_t>(spec.params[0])]);
    for (int64_t k : spec.params) {
      bucket_of_[k] = buckets_.size();
      // An empty parameter may lie between the ranges of its group's bucket: it holds nothing anywhere.
      offset_in_bucket_[k] = layout_.param(k).empty() ? 0 : offset_in(spec.ranges, layout_.param(k).begin);
    }
    b->spec = std::move(spec);
    buckets_.push_back(std::move(b));
  }
  ready_.assign(params_.size(), false);
  wide_ = mode_ != Mode::kBucketed && flat_grads_.dtype() != params_.at(0).dtype();
  if (mode_ != Mode::kBucketed) {
    for (size_t k = 0; k < params_.size(); ++k) {
      const FlatRange r = layout_.param(static_cast<int64_t>(k));
      slots_.push_back(flat_grads_.narrow(0, r.begin, r.size()).view(params_[k].sizes()));
    }
  }
  attach_grads();
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.push_back(params_[k].register_post_accumulate_grad_hook([this, k](const Tensor&) { grad_ready(k); }));
  }
}

GradReducer::~GradReducer() {
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_post_accumulate_grad_hook(hooks_[k]);
}

void GradReducer::attach_grads() {
  if (in_backward_) {  // a backward threw before its end: let its operations finish, then forget it
    for (auto& b : buckets_) {
      b->work.wait();        // a default Work (nothing in flight) returns at once
      b->scale_work.wait();  // qgZ's scales, which may have started even where launch() then threw
      b->work = Work();
      b->drop_exchange();
      b->buffer = b->wire = b->output = Tensor();
    }
    in_backward_ = false;
  }
  reduced_ = false;
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].set_grad(mode_ == Mode::kBucketed || wide_ ? Tensor() : slots_[k]);
  }
}

void GradReducer::begin_backward() {
  start_reduction();
  autograd::queue_callback([this] { finish(); });
}

void GradReducer::reduce() {
  KILN_CHECK(mode_ != Mode::kBucketed, "ZeRO: reduce_gradients is for stages 0 and 1; stages 2 and 3 reduce in "
             "every backward");
  KILN_CHECK(!in_backward_, "ZeRO: reduce_gradients was called during a backward; call it after backward");
  start_reduction();
  finish();  // every parameter as one without a gradient in a backward: its slot holds its sum
}

void GradReducer::add_to_gradient(const Tensor& param, const Tensor& g) {
  KILN_CHECK(mode_ != Mode::kBucketed, "ZeRO: add_to_gradient is for stages 0 and 1, whose gradients accumulate "
             "until the reduction; stages 2 and 3 reduce in every backward");
  KILN_CHECK(!in_backward_, "ZeRO: add_to_gradient was called during a backward; call it after backward");
  const auto it = std::find_if(params_.begin(), params_.end(), [&](const Tensor& p) { return p.is_same(param); });
  KILN_CHECK(it != params_.end(), "ZeRO: add_to_gradient was given a tensor that is not one of the parameters it "
             "trains");
  const size_t k = static_cast<size_t>(it - params_.begin());
  KILN_CHECK(g.sizes() == param.sizes() && g.device() == param.device() && g.is_floating_point(),
             "ZeRO: add_to_gradient: parameter {} is {} on {} and was given a {} gradient of shape {} on {}; give it "
             "a floating-point one of the parameter's shape and device", k, param.sizes().str(), param.device().str(),
             dtype_name(g.dtype()), g.sizes().str(), g.device().str());
  NoGradGuard no_grad;
  if (wide_) {
    add_into_slot(k);  // a .grad() already set, first
    slots_[k].add_(g.to(slots_[k].dtype()));
    return;
  }
  Tensor p = param;
  if (p.grad().defined()) {
    p.grad().add_(g.to(p.dtype()));
  } else {  // dropped since the step: the slot takes g (a copy, never g itself) and is .grad() again
    slots_[k].copy_(g);
    p.set_grad(slots_[k]);
  }
}

void GradReducer::start_reduction() {
  KILN_CHECK(mode_ != Mode::kReduceScatter || !reduced_,
             "ZeRO stage 1: a second backward reduces before zero_grad(); stage 1 averages the gradients once per "
             "accumulation: call set_gradient_accumulation_boundary(false) before the backwards that do not end it "
             "(Engine does), or zero_grad() between steps");
  in_backward_ = true;
  ++reductions_;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : buckets_) {
    b->pending = b->spec.params.size();
    b->launched = b->completed = false;
    b->work = Work();
  }
  next_to_launch_ = 0;
  started_during_backward_ = 0;
}

void GradReducer::grad_ready(size_t k) {
  if (wide_) add_into_slot(k);  // every backward's gradient, at once
  if (!sync_ && mode_ != Mode::kBucketed) return;  // accumulating: the gradients stay in the flat buffer
  if (!in_backward_) begin_backward();
  if (ready_[k]) {
    // A second gradient in one backward (a parameter used inside a checkpointed block and outside
    // it gets one from each backward): added to the first while its bucket waits (stages 0 and 1
    // accumulated it in the slot already); too late once the bucket is on its way, as in DeepSpeed.
    Bucket& b = *buckets_[bucket_of_[k]];
    KILN_CHECK(!b.launched,
               "ZeRO: parameter {} received a second gradient in this backward after its bucket's reduction had "
               "started (a parameter used both inside and outside a checkpointed block gets one from each); use it "
               "on one side of the checkpoint only", k);
    if (mode_ == Mode::kBucketed) {
      const Tensor g = params_[k].grad();
      check_grad(k, g);
      NoGradGuard no_grad;
      in_bucket(b, k).add_(g.reshape({-1}));
      params_[k].set_grad(Tensor());
    }
    return;
  }
  ready_[k] = true;
  const Tensor& p = params_[k];
  Bucket& b = *buckets_[bucket_of_[k]];
  if (!wide_) {
    Tensor g = p.grad();
    check_grad(k, g);
    NoGradGuard no_grad;
    if (mode_ == Mode::kBucketed) {
      if (!b.buffer.defined()) b.buffer = zeros({b.spec.numel()}, p.options());
      in_bucket(b, k).copy_(g.reshape({-1}));
      params_[k].set_grad(Tensor());  // the point of stage 2: no full gradient outlives its bucket copy
    } else if (!g.is_same(slots_[k])) {
      // Replaced since the last step (model.zero_grad() drops .grad(), say): it holds this
      // accumulation's whole gradient, so it takes the slot's place.
      slots_[k].copy_(g);
      params_[k].set_grad(slots_[k]);
    }
  }
  if (--b.pending == 0) launch_ready();
}

Tensor GradReducer::in_bucket(const Bucket& b, size_t k) const {
  return b.buffer.narrow(0, offset_in_bucket_[k], layout_.param(static_cast<int64_t>(k)).size());
}

void GradReducer::check_no_grads() const {
  if (!wide_) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    KILN_CHECK(!params_[k].grad().defined(),
               "ZeRO: parameter {} holds a .grad() set after its gradients were reduced; with grad_accum_dtype wider "
               "than the model, a step reads the {} gradient buffer, not .grad(). Add a gradient before the reduction: "
               "backward with set_gradient_accumulation_boundary(false), set it, then reduce_gradients()",
               k, dtype_name(flat_grads_.dtype()));
  }
}

void GradReducer::add_into_slot(size_t k) {
  const Tensor g = params_[k].grad();
  if (!g.defined()) return;
  check_grad(k, g);
  NoGradGuard no_grad;
  slots_[k].add_(g.to(slots_[k].dtype()));
  params_[k].set_grad(Tensor());
}

// The gradient has its parameter's dtype, device and number of elements (the layout's: at stage 3
// the parameter itself may hold none when its gradient arrives).
void GradReducer::check_grad(size_t k, const Tensor& g) const {
  const Tensor& p = params_[k];
  KILN_CHECK(g.dtype() == p.dtype() && g.device() == p.device(),
             "ZeRO: parameter {} has a {} gradient on {} but is {} on {}; a gradient must have its parameter's dtype "
             "and device", k, dtype_name(g.dtype()), g.device().str(), dtype_name(p.dtype()), p.device().str());
  const int64_t numel = layout_.param(static_cast<int64_t>(k)).size();
  KILN_CHECK(g.numel() == numel, "ZeRO: parameter {} has a gradient of shape {} ({} elements) for its {} elements", k,
             g.sizes().str(), g.numel(), numel);
}

void GradReducer::launch_ready() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_]->pending == 0) {
    launch(*buckets_[next_to_launch_++]);
  }
}

void GradReducer::launch(Bucket& b) {
  size_t in_flight = 0;
  for (auto& o : buckets_) in_flight += o->launched && !o->completed;
  for (auto& o : buckets_) {  // oldest first
    if (in_flight < kMaxInFlight) break;
    if (o->launched && !o->completed) {
      complete(*o);
      --in_flight;
    }
  }
  const std::vector<FlatRange>& ranges = b.spec.ranges;
  if (mode_ == Mode::kBucketed && !b.buffer.defined()) b.buffer = zeros({b.spec.numel()}, params_[0].options());
  {
    NoGradGuard no_grad;
    // The bucket's gradients in its own order: its buffer, or the flat buffer's range (a view) or
    // ranges (a copy).
    Tensor bucket = b.buffer;
    if (mode_ != Mode::kBucketed) {
      std::vector<Tensor> parts;
      for (const FlatRange& r : ranges) parts.push_back(flat_grads_.narrow(0, r.begin, r.size()));
      bucket = parts.size() == 1 ? parts[0] : cat(parts);
    }
    if (ranges.size() > 1 && mode_ != Mode::kAllReduce) {  // rank by rank (Note [buckets of several ranges])
      std::vector<Tensor> parts;
      for (int r = 0; r < comm_.size(); ++r) {
        for (const FlatRange& piece : pieces_in(ranges, layout_.partition(r))) {
          parts.push_back(bucket.narrow(0, offset_in(ranges, piece.begin), piece.size()));
        }
      }
      bucket = parts.empty() ? bucket.narrow(0, 0, 0) : cat(parts);
    }
    // The bucket itself in its own dtype; qgZ quantizes it as it is (its int8 blocks replace the
    // wire's dtype: a 16-bit wire would round float32 gradients twice).
    b.wire = b.wire_dtype && !averaging_.quantized ? bucket.to(*b.wire_dtype) : bucket;
    if (!b.wire.is_same(b.buffer) && mode_ == Mode::kBucketed) b.buffer = Tensor();  // the copy is all it needs
    if (before_ != 1) b.wire.mul_(before_);
  }
  CommCaller caller("gradient reduction");
  if (mode_ == Mode::kAllReduce) {
    sent_bytes_ += 2 * (comm_.size() - 1) * b.wire.nbytes() / comm_.size();  // a ring's share
    b.work = comm_.all_reduce(b.wire, op_, /*async_op=*/true);
  } else {
    std::vector<Tensor> inputs;
    int64_t at = 0;
    for (int r = 0; r < comm_.size(); ++r) {
      if (ranges.size() == 1) {  // rank r's part of the range (maybe empty, but inside it)
        const FlatRange piece = intersect(ranges[0], layout_.partition(r));
        inputs.push_back(b.wire.narrow(0, piece.begin - ranges[0].begin, piece.size()));
      } else {
        const int64_t n = numel_of(pieces_in(ranges, layout_.partition(r)));
        inputs.push_back(b.wire.narrow(0, at, n));
        at += n;
      }
    }
    if (averaging_.quantized) {  // Note [quantized gradients]
      b.drop_exchange();
      const auto on = [&](DType d) { return TensorOptions(d).device(b.wire.device()); };
      for (int r = 0; r < comm_.size(); ++r) {
        Quantized q = quantize_blocks(inputs[static_cast<size_t>(r)]);
        if (r != comm_.rank()) sent_bytes_ += q.q.nbytes() + q.scales.nbytes();
        b.q_to.push_back(std::move(q.q));
        b.scales_to.push_back(std::move(q.scales));
        b.q_from.push_back(empty({b.mine_numel}, on(kInt8)));
        b.scales_from.push_back(empty({quant_blocks(b.mine_numel)}, on(kFloat32)));
      }
      b.wire = Tensor();  // the quantized pieces are all the exchange needs
      CommCaller q_caller("gradient reduction (qgZ int8)");
      b.work = comm_.all_to_all(b.q_from, b.q_to, /*async_op=*/true);
      b.scale_work = comm_.all_to_all(b.scales_from, b.scales_to, /*async_op=*/true);
    } else {
      for (int r = 0; r < comm_.size(); ++r) {
        if (r != comm_.rank()) sent_bytes_ += inputs[static_cast<size_t>(r)].nbytes();
      }
      b.output = empty({b.mine_numel}, b.wire.options());
      b.work = comm_.reduce_scatter(b.output, inputs, op_, /*async_op=*/true);
    }
  }
  b.launched = true;
  if (in_backward_) ++started_during_backward_;
  if (!overlap_) complete(b);
}

void GradReducer::complete(Bucket& b) {
  b.work.wait();
  b.scale_work.wait();  // qgZ's scales (a default Work, complete, otherwise)
  b.completed = true;
  NoGradGuard no_grad;
  if (averaging_.quantized && mode_ == Mode::kBucketed) {  // Note [quantized gradients]: sum, then average
    // On the wire's device, as a reduce-scatter's output would be.
    Tensor sum = zeros({b.mine_numel}, TensorOptions(kFloat32).device(b.q_from.at(0).device()));
    for (size_t r = 0; r < b.q_from.size(); ++r) sum.add_(dequantize(b.q_from[r], b.scales_from[r]));
    if (op_ == ReduceOp::Avg) sum.div_(static_cast<double>(comm_.size()));
    b.output = sum;
    b.drop_exchange();
  }
  if (mode_ == Mode::kAllReduce) {  // averaged in place, or in the copy that goes back
    if (after_ != 1) b.wire.mul_(after_);
    if (b.spec.ranges.size() > 1 || b.wire.dtype() != flat_grads_.dtype()) {  // a copy (launch)
      int64_t at = 0;
      for (const FlatRange& r : b.spec.ranges) {
        flat_grads_.narrow(0, r.begin, r.size()).copy_(b.wire.narrow(0, at, r.size()));
        at += r.size();
      }
    }
    b.wire = Tensor();
    return;
  }
  if (b.mine_numel > 0) {
    if (after_ != 1) b.output.mul_(after_);
    const int64_t part_begin = layout_.partition(comm_.rank()).begin;
    int64_t at = 0;
    for (const FlatRange& piece : b.mine) {
      Tensor dst = grad_shard_.narrow(0, piece.begin - part_begin, piece.size());
      const Tensor src = b.output.narrow(0, at, piece.size());
      // Stage 1 overwrites its partition's local sum with the average; stage 2 accumulates micro-batches.
      if (mode_ == Mode::kReduceScatter) dst.copy_(src);
      else dst.add_(src.to(dst.dtype()));
      at += piece.size();
    }
  }
  b.buffer = Tensor();
  b.wire = Tensor();
  b.output = Tensor();
}

// Runs when backward has finished with every node.
void GradReducer::finish() {
  in_backward_ = false;
  // Parameters without a gradient in this backward: their slots count as they are (zeros in a
  // stage 2 bucket), so that every rank launches every bucket in the same order.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (ready_[k]) continue;
    ready_[k] = true;
    --buckets_[bucket_of_[k]]->pending;
    if (wide_) {
      add_into_slot(k);  // a .grad() set since its hook ran (a tied weight's, added by Engine), if any
    } else if (mode_ != Mode::kBucketed && !params_[k].grad().is_same(slots_[k])) {
      // .grad() dropped since the last step: no gradient, not the old one; or (reduce(), after
      // backwards without sync) replaced: it holds the accumulation's gradient.
      NoGradGuard no_grad;
      const Tensor g = params_[k].grad();
      if (g.defined()) {
        check_grad(k, g);
        slots_[k].copy_(g);
      } else {
        slots_[k].zero_();
      }
      params_[k].set_grad(slots_[k]);
    }
  }
  launch_ready();
  for (auto& b : buckets_) {
    if (!b->completed) complete(*b);
  }
  reduced_ = true;
}

}  // namespace kiln::distributed

// distributed/zero/grad_reducer.h: ZeRO's hook set on the gradients: how each rank ends backward
// holding the average over ranks of the gradients of its partition (layout.h).
//
// A post-accumulate-grad hook on every parameter marks its gradient ready; when a bucket's
// parameters are all ready (make_grad_buckets: reverse registration order, so the first buckets
// fill first), the bucket is reduced at once, during backward. What "reduced" means is the stage:
//
//   kAllReduce      (stage 0)  the gradients are views of one flat buffer (params' .grad() are
//                              views into it); each bucket's range of it is all-reduced in place,
//                              so every rank gets every averaged gradient, as DDP.
//   kReduceScatter  (stage 1)  the same flat buffer; each bucket's range is reduce-scattered, and
//                              each rank keeps only the average of the part in its partition,
//                              written over its own sum in the buffer as each bucket completes.
//   kBucketed       (stages 2, 3) no flat gradient buffer: the hook copies a parameter's fresh
//                              gradient into its bucket's buffer and drops .grad() at once, the
//                              bucket is reduce-scattered (or, with GradAveraging::quantized,
//                              exchanged in int8 by all-to-alls and summed in float32), and each
//                              rank adds its part into its partition's gradient buffer. Gradients of the whole model never
//                              exist at once: at most the buckets in flight do.
//
// "Averaged" is, by default, the communicator's ReduceOp::Avg on the bucket as it is. With
// GradAveraging (DeepSpeed's communication_data_type, prescale_gradients, gradient_predivide_factor),
// a bucket travels in another dtype (converted before the operation, and its result back after;
// the dtype may be set per parameter, and buckets then hold one dtype's parameters each),
// and/or is summed between two multiplications, as DeepSpeed's engine does it:
//
//   x * (1 / f)  ->  ReduceOp::Sum over the N ranks  ->  * (f / N)     f: the predivide factor
//
// (prescale_gradients is f = N: all of the division before the sum, none after). Dividing first
// keeps a 16-bit sum of large gradients from overflowing; dividing after keeps small ones from
// underflowing. Where a bucket is reduced in place (stages 0 and 1, no conversion), the division
// before the sum also scales the flat buffer's parts outside this rank's partition, which no one
// reads after the reduction.
//
// With overlap (DeepSpeed's overlap_comm) a bucket's operation runs while backward computes the
// next gradients and is waited for when backward has finished (an autograd callback); without, it
// is waited for at once. Stages 0 and 1 reduce only in a backward that ends an accumulation
// (set_sync(true)); in the others the gradients accumulate locally in the flat buffer. Stage 1
// reduces once between two attach_grads() (zero_grad): a second reducing backward would add the
// ranks' new local sums to one rank's average, so it is an Error. Stage 2 reduces in every
// backward and accumulates in the partition (DeepSpeed does the same).
// A parameter that gets no gradient in a backward contributes what its slot holds (stages 0 and
// 1: its gradient accumulated so far, or the .grad() that replaced the slot since; zeros once
// .grad() was dropped, except with a wider buffer, below) or zeros (2 and 3), so every rank starts
// the same buckets in the same order, provided every rank ran the same modules. A parameter with
// two gradients in one backward (used inside a checkpointed block and outside it: the recompute's
// backward gives one, the outer graph the other) has the second added to the first while its
// bucket waits; after the bucket has started, it is an Error (DeepSpeed refuses it too).
//
// A wider flat buffer (stages 0 and 1; DeepSpeed's data_types.grad_accum_dtype, float32 for a
// 16-bit model): the parameters' .grad() cannot be views of it, so each hook adds the fresh 16-bit
// gradient into the parameter's float32 slot and drops .grad(), in every backward; the micro-batches
// accumulate in float32 instead of rounding to 16 bits at each one. A parameter whose hook did not
// run in a reduction (every one, for reduce()) has a .grad() set since then (a tied weight's,
// added by Engine) added too. .grad() is otherwise undefined, and one found at the step is an
// Error (check_no_grads); zero the gradients with zero_grad() (attach_grads), not the model's. At
// stages 2 and 3 the partition's buffer may be wider the same way: each backward's reduced part is
// added into it.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/zero/layout.h"

namespace kiln::distributed {

// How a bucket is averaged (see above); the default is ReduceOp::Avg in the bucket's own dtype.
struct GradAveraging {
  std::optional<DType> dtype = std::nullopt;  // the dtype the buckets travel in (a floating one)
  // Per parameter, in the layout's order: the dtype its gradient travels in instead of `dtype`
  // (empty: `dtype` for every one). A bucket then holds parameters of one such dtype only
  // (make_grad_buckets' groups). DeepSpeed's torch_autocast: ZeroOptions::autocast_dtype.
  std::vector<DType> param_dtypes;
  double predivide = 0;  // f > 0: multiply by 1/f, sum, multiply by f/N; 0: ReduceOp::Avg
  bool prescale = false;  // f = N (DeepSpeed's prescale_gradients); predivide must then be 0
  // ZeRO++'s quantized gradients (qgZ; kBucketed only): each rank's piece of a bucket for rank r is
  // quantized in int8 blocks (quantize.h) and sent to r by an all-to-all, with its scales by a
  // second; r dequantizes the N pieces and sums them in float32. In place of the reduce-scatter:
  // Note [quantized gradients] in grad_reducer.cpp. The bucket is quantized in the parameters'
  // dtype: `dtype` and `param_dtypes` then only group the buckets.
  bool quantized = false;
};

class GradReducer {
 public:
  enum class Mode { kAllReduce, kReduceScatter, kBucketed };

  // params: the parameters the layout describes, in its order. flat_grads (kAllReduce,
  // kReduceScatter): the flat gradient buffer (padded_numel elements) whose views the parameters'
  // .grad() are (or, wider than they, which their gradients are added into); undefined for
  // kBucketed. grad_shard: where this rank's averaged gradients go (the partition's slice of
  // flat_grads, or a buffer of partition_numel elements for kBucketed).
  GradReducer(Communicator& comm, const FlatLayout& layout, std::vector<Tensor> params, Mode mode,
              int64_t bucket_numel, bool overlap, Tensor flat_grads, Tensor grad_shard, GradAveraging averaging = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Whether the next backward reduces (stages 0 and 1; the others always do).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  // Stages 0 and 1: reduces now, outside backward, the gradients that backwards without sync left
  // in the flat buffer (and any .grad() set since), as a backward with sync would have at its end.
  // kiln::Engine calls it once it has added a tied weight's gradient from another pipeline stage.
  void reduce();
  // Stages 0 and 1, before the reduction: g (param's shape and device, any floating dtype) added to
  // param's gradient as it accumulates: into its slot with a wider buffer (in the buffer's dtype,
  // so a float32 g is not rounded to 16 bits), else into its .grad(). kiln::Engine adds a tied
  // weight's gradient from another pipeline stage this way.
  void add_to_gradient(const Tensor& param, const Tensor& g);
  // Puts every parameter's .grad() back on its view of the flat buffer (kAllReduce, kReduceScatter)
  // or drops it (kBucketed), and forgets a backward that did not finish (it threw). The buffer's
  // values are left as they are. ZeroOptimizer::zero_grad calls it after zeroing them.
  void attach_grads();
  size_t num_buckets() const { return buckets_.size(); }
  // With a wider flat buffer: an Error naming a parameter that holds a .grad(), which its slot did
  // not take (set after the reduction) and the step would not see. ZeroOptimizer calls it before
  // a step.
  void check_no_grads() const;
  // Buckets whose operation started before backward had finished, in the last reducing backward.
  int64_t buckets_started_during_backward() const { return started_during_backward_; }
  // How many reductions have started since construction (one per reducing backward, or reduce()).
  int64_t reductions() const { return reductions_; }
  // The bytes this rank's buckets have sent to the other ranks since construction, counted as the
  // usual algorithms send them: a reduce-scatter's pieces for the others (a ring sends as many), with
  // qgZ their int8 values and scales, an all-reduce's 2 (N - 1) / N of its bucket (a ring's).
  int64_t sent_bytes() const { return sent_bytes_; }

 private:
  struct Bucket;
  void grad_ready(size_t k);
  void check_grad(size_t k, const Tensor& g) const;  // its parameter's dtype, device and size
  void add_into_slot(size_t k);  // wide_: .grad() added into the parameter's slot, then dropped
  Tensor in_bucket(const Bucket& b, size_t k) const;  // kBucketed: parameter k's part of b's buffer
  void begin_backward();
  void start_reduction();  // begin_backward without the callback at backward's end
  void launch_ready();
  void launch(Bucket& b);
  void complete(Bucket& b);
  void finish();

  Communicator& comm_;
  const FlatLayout& layout_;
  std::vector<Tensor> params_;
  Mode mode_;
  bool overlap_;
  GradAveraging averaging_;
  double before_ = 1, after_ = 1;  // the multiplications around a summing reduction
  ReduceOp op_ = ReduceOp::Avg;     // Sum between them (GradAveraging), else the communicator's Avg
  Tensor flat_grads_, grad_shard_;
  std::vector<Tensor> slots_;  // per parameter: its view of the flat gradient buffer (stages 0 and 1)
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<size_t> bucket_of_;  // per parameter
  std::vector<int64_t> offset_in_bucket_;  // per parameter: where it starts in its bucket's own order
  std::vector<uint64_t> hooks_;
  std::vector<bool> ready_;
  size_t next_to_launch_ = 0;
  bool wide_ = false;  // stages 0 and 1 with a flat buffer wider than the parameters (float32 for 16 bits)
  bool sync_ = true, in_backward_ = false;
  bool reduced_ = false;  // kReduceScatter: a backward has reduced since attach_grads
  int64_t started_during_backward_ = 0;
  int64_t reductions_ = 0;
  int64_t sent_bytes_ = 0;
};

}  // namespace kiln::distributed

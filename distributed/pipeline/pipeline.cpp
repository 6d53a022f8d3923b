// distributed/pipeline/pipeline.cpp: the GPipe, 1F1B and interleaved 1F1B schedules over send/recv (see
// pipeline.h).
#include "distributed/pipeline/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>

#include "autograd/autograd.h"
#include "core/generator.h"
#include "core/grad_mode.h"
#include "distributed/comm/comms_logger.h"
#include "ops/ops.h"

namespace kiln::distributed {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int kActivationTag = 0, kGradientTag = 1;
constexpr int64_t kMaxDims = 8;

}  // namespace

struct Pipeline::MicroBatch {
  Tensor input;   // what this stage received (or cut from the batch): its gradient goes back
  Tensor output;  // the last stage's result in eval_batch; a sent output without deallocate_outputs
  // Where backward enters the graph at a sent output: all that backward needs of it. The output
  // itself is kept only without PipelineOptions::deallocate_outputs; else the send lets its values
  // go when it completes.
  autograd::GradientEdge output_edge;
  Tensor loss;    // the last stage's loss / m
};

Pipeline::Pipeline(nn::Module& stage, std::shared_ptr<Communicator> comm, LossFn loss_fn, PipelineOptions options)
    : Pipeline(std::vector<nn::Module*>{&stage}, std::move(comm), std::move(loss_fn), std::move(options)) {}

Pipeline::Pipeline(std::vector<nn::Module*> chunks, std::shared_ptr<Communicator> comm, LossFn loss_fn,
                   PipelineOptions options)
    : chunks_(std::move(chunks)), comm_(std::move(comm)), loss_fn_(std::move(loss_fn)), options_(std::move(options)) {
  KILN_CHECK(comm_ != nullptr, "Pipeline: the communicator is null; pass distributed::init()");
  // The stages compare what the schedule depends on first (one all-reduce), so that options given
  // differently on some stage are an Error on every stage, not stages waiting for each other's
  // messages until the communicator's timeout; the checks below then fail or pass everywhere alike.
  const PipelineSchedule schedule = options_.schedule;
  const char* schedule_name = schedule == PipelineSchedule::kGPipe             ? "kGPipe"
                              : schedule == PipelineSchedule::k1F1B            ? "k1F1B"
                              : schedule == PipelineSchedule::kInterleaved1F1B ? "kInterleaved1F1B"
                                                                               : "(not a PipelineSchedule)";
  const std::string agreed = fmt::format("micro_batches {}, schedule {}, recv_ahead {}, {} model chunk(s)",
                                         options_.micro_batches, schedule_name, options_.recv_ahead, chunks_.size());
  KILN_CHECK(same_on_every_rank(*comm_, agreed), "Pipeline: the stages were given different options (stage {}: {}); "
             "every stage must pass the same micro_batches, schedule and recv_ahead, and as many model chunks",
             comm_->rank(), agreed);
  KILN_CHECK(options_.micro_batches >= 1, "Pipeline: micro_batches must be >= 1, not {}", options_.micro_batches);
  KILN_CHECK(loss_fn_ != nullptr, "Pipeline: the loss function is empty");
  KILN_CHECK(!chunks_.empty(), "Pipeline: no model chunks; pass this rank's stage, or its chunks for the interleaved "
             "schedule");
  for (size_t c = 0; c < chunks_.size(); ++c) {
    KILN_CHECK(chunks_[c] != nullptr, "Pipeline: model chunk {} of {} is null; pass a module for every chunk", c,
               chunks_.size());
  }
  auto draws_as_whole = [](nn::Module* chunk) { return dynamic_cast<DrawsAsWholeModel*>(chunk) != nullptr; };
  draws_as_whole_model_ = draws_as_whole(chunks_[0]);
  for (size_t c = 1; c < chunks_.size(); ++c) {
    KILN_CHECK(draws_as_whole(chunks_[c]) == draws_as_whole_model_,
               "Pipeline: model chunk 0 is {}a DrawsAsWholeModel and chunk {} is {}; the pipeline positions the "
               "generator for every chunk of a rank or for none, so make them all one kind",
               draws_as_whole_model_ ? "" : "not ", c, draws_as_whole(chunks_[c]) ? "" : "not");
  }
  if (chunks_.size() > 1) {
    KILN_CHECK(options_.schedule == PipelineSchedule::kInterleaved1F1B,
               "Pipeline: {} model chunks on a rank need the schedule kInterleaved1F1B; GPipe and 1F1B run one stage "
               "per rank", chunks_.size());
    KILN_CHECK(options_.micro_batches % num_stages() == 0,
               "Pipeline: the interleaved schedule takes micro-batches {} at a time (one per stage), and {} is not a "
               "multiple of {}; set micro_batches to a multiple of the number of stages", num_stages(),
               options_.micro_batches, num_stages());
  }
}

// ---- messages: a header (dtype, number of dims, the dims), then the tensor ----
//
// Note [receiving ahead]
// A receive posted only when the stage needs the tensor puts the whole transfer on the critical
// path: on MPI a large message waits for its receive before it moves (rendezvous), so each of a
// stage's 2m messages a batch (2 m v with v chunks) would add its transfer to the bubble. With
// recv_ahead, a stage posts the receive of message i + 1 of a direction as soon as message i is in,
// guessing i's dtype and shape (micro-batches are equal, so the guess holds unless the output shape
// depends on the data or, with chunks, differs between chunks: a channel's messages change chunk
// every p). Both sides know the guess, since both saw message i. The sender of a message that does
// not match it sends its header, then a filler of the guessed dtype and shape (which the receive
// posted ahead takes), then the tensor; the receiver, seeing the header differ, drops the filler
// and receives the tensor. The receives ahead stop at the batch's last message of the direction
// (expected_: m, or m v, less m where this rank holds the first or last virtual stage), so none is
// left over between batches.
// NCCL runs send and recv in call order on one stream, where a receive posted early would hold back
// this stage's own sends (and deadlock 1F1B): there the receives are posted when needed.

void Pipeline::start_batch() {
  // A batch that threw part-way may leave receives posted ahead: they would take this batch's first
  // messages. (The other stages are out of step with this one after such an Error anyway.)
  for (const Channel& c : received_) {
    KILN_CHECK(!c.ahead, "Pipeline: stage {}'s previous batch stopped part-way with receives posted ahead "
               "(recv_ahead), which would take this batch's messages; make a new communicator and Pipeline",
               stage_id());
  }
  for (Channel& c : sent_) c = Channel();
  for (Channel& c : received_) c = Channel();
  for (auto& queue : local_) queue.clear();
  // Each virtual stage but the first receives an activation per micro-batch, each but the last a
  // gradient (train_batch).
  const int64_t m = options_.micro_batches, v = num_chunks();
  expected_[kActivationTag] = m * v - (is_first_stage() ? m : 0);
  expected_[kGradientTag] = m * v - (is_last_stage() ? m : 0);
  device_ = Device::cpu();
  for (nn::Module* chunk : chunks_) {
    const auto params = chunk->parameters();
    if (!params.empty()) {
      device_ = params[0].device();
      break;
    }
  }
}

void Pipeline::send(const Tensor& t, int dst, int tag) {
  CommCaller caller("pipeline");
  if (dst == stage_id()) {  // one rank, several chunks: the next (or previous) chunk is here
    local_[tag].push_back(t);
    return;
  }
  KILN_CHECK(t.dim() <= kMaxDims, "Pipeline: stage {} sends a tensor of {} dims; at most {} are supported",
             stage_id(), t.dim(), kMaxDims);
  std::vector<int64_t> header(2 + kMaxDims, 0);
  header[0] = static_cast<int64_t>(t.dtype());
  header[1] = t.dim();
  for (int d = 0; d < t.dim(); ++d) header[2 + d] = t.size(d);
  // Finished sends let go of their buffers now, not at the end of the batch: an activation or a
  // gradient sent is otherwise alive until then, m of them under either schedule.
  for (size_t i = 0; i < sends_.size();) {
    if (sends_[i].is_completed()) {
      sends_[i].wait();  // rethrows its Error, if any
      sends_.erase(sends_.begin() + static_cast<std::ptrdiff_t>(i));
      send_buffers_.erase(send_buffers_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  auto post = [&](const Tensor& buffer) {
    sends_.push_back(comm_->send(buffer, dst, tag, /*async_op=*/true));
    send_buffers_.push_back(buffer);
  };
  Channel& c = sent_[tag];
  post(from_vector<int64_t>(header).to(comm_->device()));
  if (receives_ahead() && c.count > 0 && (t.dtype() != c.dtype || t.sizes() != c.shape)) {
    post(zeros(c.shape, TensorOptions(c.dtype).device(t.device())));  // the filler the receiver guessed
  }
  post(t.contiguous());
  ++c.count;
  c.dtype = t.dtype();
  c.shape = t.sizes();
}

Tensor Pipeline::header_buffer() const { return empty({2 + kMaxDims}, TensorOptions(kInt64).device(comm_->device())); }

std::pair<DType, Shape> Pipeline::decode_header(const Tensor& h, int src) const {
  const std::vector<int64_t> header = h.to_vector<int64_t>();
  KILN_CHECK(header[0] >= 0 && header[0] <= static_cast<int64_t>(DType::Float64) && header[1] >= 0 &&
                 header[1] <= kMaxDims,
             "Pipeline: stage {} received a malformed header from stage {}; every rank must run the same Pipeline",
             stage_id(), src);
  Shape shape;
  for (int64_t d = 0; d < header[1]; ++d) shape.push_back(header[2 + d]);
  return {static_cast<DType>(header[0]), shape};
}

Tensor Pipeline::recv(int src, int tag) {
  CommCaller caller("pipeline");
  if (src == stage_id()) {
    KILN_CHECK(!local_[tag].empty(), "Pipeline: stage {} expected a message from itself that it never sent", src);
    Tensor t = local_[tag].front();
    local_[tag].pop_front();
    return t;
  }
  const auto t0 = Clock::now();
  Channel& c = received_[tag];
  Tensor t;
  if (c.ahead) {
    c.header_work.wait();
    const auto [dtype, shape] = decode_header(c.header, src);
    c.data_work.wait();
    if (dtype == c.data.dtype() && shape == c.data.sizes()) {
      t = c.data;
    } else {  // c.data holds the sender's filler
      t = empty(shape, TensorOptions(dtype).device(device_));
      comm_->recv(t, src, tag);
    }
    c.header = c.data = Tensor();
    c.header_work = c.data_work = Work();
    c.ahead = false;
  } else {
    Tensor h = header_buffer();
    comm_->recv(h, src, tag);
    const auto [dtype, shape] = decode_header(h, src);
    t = empty(shape, TensorOptions(dtype).device(device_));
    comm_->recv(t, src, tag);
  }
  ++c.count;
  c.dtype = t.dtype();
  c.shape = t.sizes();
  if (receives_ahead() && c.count < expected_[tag]) {
    c.header = header_buffer();
    c.data = empty(c.shape, TensorOptions(c.dtype).device(device_));
    c.header_work = comm_->recv(c.header, src, tag, /*async_op=*/true);
    c.data_work = comm_->recv(c.data, src, tag, /*async_op=*/true);
    c.ahead = true;
  }
  stats_.wait_seconds += seconds_since(t0);
  return t;
}

void Pipeline::wait_sends() {
  for (Work& w : sends_) w.wait();
  sends_.clear();
  send_buffers_.clear();
}

// ---- one micro-batch ----

// A micro-batch's activations come from the previous virtual stage, on rank s - 1 (for chunk 0 of
// rank 0, the batch), and go to the next, on rank s + 1 (rank p - 1 sends to rank 0's next chunk);
// gradients the other way.
void Pipeline::forward_step(int64_t chunk, MicroBatch& mb, const Tensor& input, const Tensor& target,
                            bool keep_graph) {
  const int p = num_stages(), s = stage_id();
  chunk_ = chunk;
  Tensor x = first_virtual(chunk) ? input : recv((s + p - 1) % p, kActivationTag);
  if (!first_virtual(chunk) && keep_graph && x.is_floating_point()) x.requires_grad_();
  const auto t0 = Clock::now();
  Tensor y = (*chunks_[static_cast<size_t>(chunk)])(x);
  if (last_virtual(chunk)) {
    if (keep_graph) {
      Tensor loss = loss_fn_(y, target);
      KILN_CHECK(loss.numel() == 1, "Pipeline: the loss function must return one element (a mean), not shape {}",
                 loss.sizes().str());
      mb.loss = loss / static_cast<double>(options_.micro_batches);
    } else {
      mb.output = y;
    }
    stats_.compute_seconds += seconds_since(t0);
  } else {
    stats_.compute_seconds += seconds_since(t0);
    send(y.detach(), (s + 1) % p, kActivationTag);
    if (keep_graph) {
      if (y.requires_grad()) mb.output_edge = autograd::get_gradient_edge(y);
      if (!options_.deallocate_outputs) mb.output = y;  // kept only to be measured against
    }
  }
  if (keep_graph) mb.input = x;
}

void Pipeline::backward_step(int64_t chunk, MicroBatch& mb) {
  const int p = num_stages(), s = stage_id();
  chunk_ = chunk;
  if (last_virtual(chunk)) {
    loss_sum_ += mb.loss.item<double>();
    const auto t0 = Clock::now();
    mb.loss.backward();
    stats_.compute_seconds += seconds_since(t0);
  } else {
    Tensor g = recv((s + 1) % p, kGradientTag);
    KILN_CHECK(mb.output_edge.edge.valid(), "Pipeline: stage {}'s output does not require grad, so its gradient from "
               "the next stage has nowhere to go; let a parameter of the stage require grad", stage_id());
    KILN_CHECK(g.sizes() == mb.output_edge.shape,
               "Pipeline: stage {} got a gradient of shape {} for its output of shape {}", stage_id(), g.sizes().str(),
               mb.output_edge.shape.str());
    const auto t0 = Clock::now();
    autograd::backward(mb.output_edge, g);
    stats_.compute_seconds += seconds_since(t0);
  }
  if (!first_virtual(chunk)) {
    Tensor gi = mb.input.grad();
    send(gi.defined() ? gi : zeros_like(mb.input), (s + p - 1) % p, kGradientTag);
  }
  mb = MicroBatch();  // this micro-batch's activations go
}

// ---- schedules ----

namespace {

// The micro-batches of a batch, along dim 0; every rank of a stage that reads it calls this.
std::vector<Tensor> cut(const Tensor& t, int64_t m, const char* what, int stage, const char* op) {
  KILN_CHECK(t.defined() && t.dim() >= 1, "Pipeline.{}: stage {} needs the {} (a tensor with the batch in dim 0)", op,
             stage, what);
  KILN_CHECK(t.size(0) % m == 0,
             "Pipeline.{}: the {}'s {} rows do not split into {} equal micro-batches; use a batch that is a "
             "multiple of micro_batches", op, what, t.size(0), m);
  return t.split(t.size(0) / m, 0);
}

// Interleaved 1F1B's order of ops on a rank (Megatron-LM's): its k-th forward (or backward) of the
// batch's m v is micro-batch (k / (p v)) p + k % p of chunk (k % (p v)) / p (for backwards, counted
// from the last chunk). So the ranks take micro-batches p at a time, and each group goes through
// every chunk before the next starts.
struct ChunkOp {
  int64_t chunk, micro_batch;
};
ChunkOp interleaved_op(int64_t k, int p, int64_t v, bool backward) {
  const int64_t group = k % (p * v), chunk = group / p;
  return {backward ? v - 1 - chunk : chunk, k / (p * v) * p + k % p};
}

}  // namespace

Tensor Pipeline::train_batch(const Tensor& input, const Tensor& target) {
  const int64_t m = options_.micro_batches, v = num_chunks();
  const int s = stage_id(), p = num_stages();
  std::vector<Tensor> inputs(m), targets(m);
  if (is_first_stage()) inputs = cut(input, m, "input", s, "train_batch");
  if (is_last_stage()) targets = cut(target, m, "target", s, "train_batch");
  stats_ = Stats();
  start_batch();
  loss_sum_ = 0;
  const auto t0 = Clock::now();
  std::vector<MicroBatch> mbs(m * v);  // chunk c's micro-batch i at c m + i
  int64_t in_flight = 0;
  // DrawsAsWholeModel: micro-batch i's forwards start at the batch's state plus i times what a
  // forward moves the generator, measured by the first (every schedule's first is chunk 0's of
  // micro-batch 0, which starts at the batch's state).
  Generator& gen = default_generator();
  const Generator::State start = gen.get_state();
  struct RestoreOnThrow {  // a batch that throws leaves the generator as it found it
    Generator& gen;
    const Generator::State& start;
    int uncaught = std::uncaught_exceptions();
    ~RestoreOnThrow() {
      if (std::uncaught_exceptions() > uncaught) gen.set_state(start);
    }
  } restore{gen, start};
  std::optional<uint64_t> per_forward;
  auto forward = [&](int64_t chunk, int64_t i) {
    if (draws_as_whole_model_ && per_forward) {
      gen.set_state({start.seed, start.offset + static_cast<uint64_t>(i) * *per_forward});
    }
    const uint64_t before = gen.offset();
    forward_step(chunk, mbs[chunk * m + i], inputs[i], targets[i], /*keep_graph=*/true);
    if (draws_as_whole_model_) {
      KILN_CHECK(gen.seed() == start.seed && gen.offset() >= before,
                 "Pipeline: stage {}'s chunk {} reseeded the default generator or moved it back in its forward of "
                 "micro-batch {}; a DrawsAsWholeModel module must only draw or reserve", s, chunk, i);
      const uint64_t moved = gen.offset() - before;
      if (!per_forward) per_forward = moved;
      KILN_CHECK(moved == *per_forward,
                 "Pipeline: stage {}'s chunk {} moved the default generator by {} counters in its forward of "
                 "micro-batch {}, and the batch's first forward by {}; a DrawsAsWholeModel module must draw or "
                 "reserve a whole model forward's random numbers in each forward (are the chunks all in training "
                 "mode, and built from one config?)", s, chunk, moved, i, *per_forward);
    }
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight);
  };
  auto backward = [&](int64_t chunk, int64_t i) {
    chunk_ = chunk;
    if (options_.before_backward) options_.before_backward(i, i == m - 1);
    backward_step(chunk, mbs[chunk * m + i]);
    --in_flight;
  };
  if (options_.schedule == PipelineSchedule::kGPipe) {
    for (int64_t i = 0; i < m; ++i) forward(0, i);
    for (int64_t i = 0; i < m; ++i) backward(0, i);
  } else if (v == 1) {
    // 1F1B: the warm-up fills the pipeline ahead of this stage; then each forward is followed by
    // the backward of the oldest micro-batch, so at most p - s are alive here.
    const int64_t warmup = std::min<int64_t>(p - s - 1, m);
    for (int64_t i = 0; i < warmup; ++i) forward(0, i);
    for (int64_t i = warmup; i < m; ++i) {
      forward(0, i);
      backward(0, i - warmup);
    }
    for (int64_t i = m - warmup; i < m; ++i) backward(0, i);
  } else {
    // Interleaved 1F1B: the same three phases over the m v ops of each kind; the warm-up fills the
    // v p virtual stages ahead of this rank's first backward.
    const int64_t total = m * v, warmup = std::min<int64_t>(int64_t{p - s - 1} * 2 + (v - 1) * p, total);
    auto forward_k = [&](int64_t k) {
      const ChunkOp op = interleaved_op(k, p, v, /*backward=*/false);
      forward(op.chunk, op.micro_batch);
    };
    auto backward_k = [&](int64_t k) {
      const ChunkOp op = interleaved_op(k, p, v, /*backward=*/true);
      backward(op.chunk, op.micro_batch);
    };
    for (int64_t k = 0; k < warmup; ++k) forward_k(k);
    for (int64_t k = warmup; k < total; ++k) {
      forward_k(k);
      backward_k(k - warmup);
    }
    for (int64_t k = total - warmup; k < total; ++k) backward_k(k);
  }
  chunk_ = 0;
  if (draws_as_whole_model_) {  // where m forwards of one process leave it
    gen.set_state({start.seed, start.offset + static_cast<uint64_t>(m) * per_forward.value_or(0)});
  }
  wait_sends();
  stats_.seconds = seconds_since(t0);
  // The last stage's sum of loss / m: the batch's mean.
  Tensor total = full({1}, loss_sum_, TensorOptions(kFloat64).device(comm_->device()));
  CommCaller caller("pipeline loss");
  comm_->broadcast(total, p - 1);
  return total.reshape({}).to(Device::cpu(), kFloat32);
}

Tensor Pipeline::eval_batch(const Tensor& input) {
  NoGradGuard no_grad;
  // In eval mode, as DeepSpeed's eval_batch (dropout off, so no random numbers are drawn either);
  // every chunk's mode is put back however the batch ends.
  struct RestoreModes {
    std::vector<std::pair<nn::Module*, bool>> modes;
    ~RestoreModes() {
      for (auto [chunk, training] : modes) chunk->train(training);
    }
  } restore;
  for (nn::Module* chunk : chunks_) restore.modes.emplace_back(chunk, chunk->is_training());
  for (nn::Module* chunk : chunks_) chunk->eval();
  const int64_t m = options_.micro_batches, v = num_chunks();
  std::vector<Tensor> inputs(m);
  if (is_first_stage()) inputs = cut(input, m, "input", stage_id(), "eval_batch");
  start_batch();
  std::vector<Tensor> outputs;
  // The forwards in the training schedules' order: micro-batch order for one chunk, groups of p
  // through every chunk in turn when interleaved.
  for (int64_t k = 0; k < m * v; ++k) {
    const ChunkOp op = v == 1 ? ChunkOp{0, k} : interleaved_op(k, num_stages(), v, /*backward=*/false);
    MicroBatch mb;
    forward_step(op.chunk, mb, inputs[op.micro_batch], Tensor(), /*keep_graph=*/false);
    if (last_virtual(op.chunk)) outputs.push_back(mb.output);
  }
  chunk_ = 0;
  wait_sends();
  return is_last_stage() ? cat(outputs, 0) : Tensor();
}

// ---- tied weights ----

namespace {

constexpr int kTiedTag = 2;

void check_list(const std::vector<TiedWeight>& tied, int s, int p, const char* who) {
  for (const TiedWeight& t : tied) {
    KILN_CHECK(t.owner >= 0 && t.owner < p && t.user >= 0 && t.user < p && t.owner != t.user,
               "{}: a tie between stages {} (owner) and {} (user) in a pipeline of {}; they must be two different "
               "stages of it", who, t.owner, t.user, p);
    KILN_CHECK(s == t.owner || s == t.user,
               "{}: stage {} lists a tie between stages {} and {}; a stage lists only the ties it holds a copy of",
               who, s, t.owner, t.user);
    KILN_CHECK(t.weight.defined(), "{}: stage {} lists a tie (owner {}, user {}) without its weight", who, s,
               t.owner, t.user);
    KILN_CHECK(t.weight.dim() <= kMaxDims, "{}: a tied weight of {} dims; at most {} are supported", who,
               t.weight.dim(), kMaxDims);
  }
}

// A header (dtype, number of dims, the dims) and the tensor, sent without waiting; the Works and
// what they read go to `sends` and `buffers` until they complete.
void send_tied(Communicator& c, const Tensor& t, int dst, std::vector<Work>& sends, std::vector<Tensor>& buffers) {
  std::vector<int64_t> h(2 + kMaxDims, 0);
  h[0] = static_cast<int64_t>(t.dtype());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[static_cast<size_t>(2 + d)] = t.size(d);
  Tensor header = from_vector<int64_t>(h).to(c.device());
  Tensor data = t.contiguous();
  sends.push_back(c.send(header, dst, kTiedTag, /*async_op=*/true));
  sends.push_back(c.send(data, dst, kTiedTag, /*async_op=*/true));
  buffers.push_back(header);
  buffers.push_back(data);
}

// What send_tied sent, whatever its dtype and shape (so that the sender is never left waiting);
// the caller checks it against its copy.
Tensor recv_tied(Communicator& c, int src, const Device& device) {
  Tensor header = empty({2 + kMaxDims}, TensorOptions(kInt64).device(c.device()));
  c.recv(header, src, kTiedTag);
  const std::vector<int64_t> h = header.to_vector<int64_t>();
  KILN_CHECK(h[0] >= 0 && h[0] <= static_cast<int64_t>(DType::Float64) && h[1] >= 0 && h[1] <= kMaxDims,
             "tied weights: stage {} received a malformed message from stage {}; every rank must run the same "
             "program", c.rank(), src);
  Shape shape;
  for (int64_t d = 0; d < h[1]; ++d) shape.push_back(h[static_cast<size_t>(2 + d)]);
  Tensor t = empty(shape, TensorOptions(static_cast<DType>(h[0])).device(device));
  c.recv(t, src, kTiedTag);
  return t;
}

// got against the copy `like`: its shape, and `dtype` (the copy's, or the one its gradient travels in).
void check_received(const Tensor& got, const Tensor& like, DType dtype, int stage, int src, const char* who) {
  KILN_CHECK(got.sizes() == like.sizes() && got.dtype() == dtype,
             "{}: stage {}'s copy of a tied weight is {} of shape {}{}, and stage {} sent {} of shape {}; the two "
             "stages of a tie must hold the same weight (and accumulate its gradient in the same dtype)", who, stage,
             dtype_name(like.dtype()), like.sizes().str(),
             dtype == like.dtype() ? std::string() : fmt::format(", its gradient travelling as {}", dtype_name(dtype)),
             src, dtype_name(got.dtype()), got.sizes().str());
}

// Every send of this stage's ties first (so that ties in both directions, or in a cycle, cannot
// wait on each other over MPI; NCCL, whose send and recv run in call order, would need them in one
// group, which no tie list here calls for), then every receive; each received tensor, once all
// are in, goes to apply(tie, tensor). A mismatch is an Error after that, so no sender is left
// waiting.
void exchange_tied(const std::vector<TiedWeight>& tied, Communicator& pipeline, const char* who,
                   const std::function<std::optional<std::pair<Tensor, int>>(const TiedWeight&)>& outgoing,
                   const std::function<int(const TiedWeight&)>& source,
                   const std::function<void(const TiedWeight&, const Tensor&)>& apply,
                   std::optional<DType> dtype = std::nullopt) {
  check_list(tied, pipeline.rank(), pipeline.size(), who);
  std::vector<Work> sends;
  std::vector<Tensor> buffers;
  for (const TiedWeight& t : tied) {
    if (auto out = outgoing(t)) send_tied(pipeline, out->first, out->second, sends, buffers);
  }
  std::vector<std::pair<const TiedWeight*, Tensor>> received;
  std::exception_ptr failure;
  for (const TiedWeight& t : tied) {
    const int src = source(t);
    if (src < 0) continue;
    try {
      received.emplace_back(&t, recv_tied(pipeline, src, t.weight.device()));
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  for (Work& s : sends) s.wait();
  if (failure) std::rethrow_exception(failure);
  for (const auto& [t, got] : received) {
    check_received(got, t->weight, dtype.value_or(t->weight.dtype()), pipeline.rank(), source(*t), who);
  }
  NoGradGuard no_grad;
  for (const auto& [t, got] : received) apply(*t, got);
}

}  // namespace

void check_tied_weights(const std::vector<TiedWeight>& tied, Communicator& pipeline, const char* who) {
  const int s = pipeline.rank(), p = pipeline.size();
  std::exception_ptr wrong;
  try {
    check_list(tied, s, p, who);
  } catch (...) {
    wrong = std::current_exception();
  }
  // Each stage's count of the ties it lists per (owner, user) pair, and whether its list is well
  // formed (the last element), to every stage; an Error everywhere after, never a wait.
  const int64_t n = static_cast<int64_t>(p) * p + 1;
  std::vector<int64_t> mine(static_cast<size_t>(n), 0);
  mine.back() = wrong ? 0 : 1;
  if (!wrong) {
    for (const TiedWeight& t : tied) ++mine[static_cast<size_t>(t.owner * p + t.user)];
  }
  Tensor all = empty({p * n}, TensorOptions(kInt64).device(pipeline.device()));
  pipeline.all_gather_into_tensor(all, from_vector<int64_t>(mine).to(pipeline.device()));
  if (wrong) std::rethrow_exception(wrong);
  const std::vector<int64_t> counts = all.to_vector<int64_t>();
  auto count = [&](int stage, int owner, int user) { return counts[stage * n + owner * p + user]; };
  for (int k = 0; k < p; ++k) {
    KILN_CHECK(counts[k * n + n - 1] == 1, "{}: stage {}'s list of tied weights is wrong; its Error says why", who, k);
  }
  for (int o = 0; o < p; ++o) {
    for (int u = 0; u < p; ++u) {
      KILN_CHECK(o == u || count(o, o, u) == count(u, o, u),
                 "{}: stage {} lists {} tie(s) that it owns and stage {} uses, and stage {} lists {}; both stages of "
                 "a tie must list it, in the same order", who, o, count(o, o, u), u, u, count(u, o, u));
    }
  }
}

void add_tied_gradients(const std::vector<TiedWeight>& tied, Communicator& pipeline, const TiedGradients* gradients) {
  const int s = pipeline.rank();
  exchange_tied(
      tied, pipeline, "add_tied_gradients",
      [&](const TiedWeight& t) -> std::optional<std::pair<Tensor, int>> {
        if (s != t.user) return std::nullopt;
        if (gradients != nullptr) return std::pair{gradients->take(t), t.owner};
        Tensor w = t.weight;
        const Tensor g = w.grad();
        w.set_grad(Tensor());  // the owner has it now
        return std::pair{g.defined() ? g : zeros_like(w), t.owner};
      },
      [&](const TiedWeight& t) { return s == t.owner ? t.user : -1; },
      [&](const TiedWeight& t, const Tensor& g) {
        if (gradients != nullptr) return gradients->add(t, g);
        Tensor w = t.weight;
        if (w.grad().defined()) w.grad().add_(g);
        else w.set_grad(g);
      },
      gradients != nullptr ? std::optional(gradients->dtype) : std::nullopt);
}

void copy_tied_weights(const std::vector<TiedWeight>& tied, Communicator& pipeline) {
  const int s = pipeline.rank();
  exchange_tied(
      tied, pipeline, "copy_tied_weights",
      [&](const TiedWeight& t) -> std::optional<std::pair<Tensor, int>> {
        if (s != t.owner) return std::nullopt;
        return std::pair{t.weight.detach(), t.user};
      },
      [&](const TiedWeight& t) { return s == t.user ? t.owner : -1; },
      [](const TiedWeight& t, const Tensor& w) { Tensor(t.weight).copy_(w); });
}

}  // namespace kiln::distributed

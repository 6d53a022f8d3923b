// distributed/pipeline/pipeline.h: pipeline parallelism: the model's layers cut into p stages, one
// per rank, and each batch cut into m micro-batches that flow through the stages, so that the
// stages work at once on different micro-batches (GPipe, Huang et al. 2019; 1F1B, PipeDream-Flush,
// Narayanan et al. 2021). DeepSpeed's PipelineEngine.train_batch and torch's pipelining schedules.
//
//   auto comm = distributed::init();                  // rank s runs stage s
//   MyStage stage(comm->rank());                      // e.g. layers [s L/p, (s+1) L/p) of a model
//   auto loss_fn = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
//   distributed::Pipeline pipe(stage, comm, loss_fn, {.micro_batches = 8});
//   optim::AdamW opt(stage.parameters());
//   for (auto& [x, y] : loader) {                     // the whole batch, on every rank (the first
//     opt.zero_grad();                                // stage reads x, the last y)
//     Tensor loss = pipe.train_batch(x, y);           // forward and backward of every micro-batch
//     opt.step();                                     // each stage steps its own layers
//   }
//
// Stage s receives each micro-batch's activation from stage s - 1 (the first stage cuts its own
// from the input), runs its layers, and sends the result to s + 1; the last stage computes the loss,
// divided by m so that the gradients add up to the whole batch's mean. Backward flows the other
// way: the gradient of the activation comes from s + 1 and the gradient of the stage's input goes
// to s - 1. Each message is a small header (dtype and shape) and the tensor, sent asynchronously,
// so a stage never blocks on a send (with both directions in flight, blocking sends could deadlock).
// With recv_ahead, receives are posted one message ahead: as soon as a message (an activation or a
// gradient) is in, the receive of the next one from the same neighbour is posted with its dtype
// and shape, so that it can arrive while this stage computes instead of after (see Note [receiving
// ahead] in pipeline.cpp).
//
// Schedules, for p stages and m micro-batches (F = forward, B = backward, . = idle; p = 3, m = 4):
//
//   GPipe: all forwards, then all backwards
//   stage 0  F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
//   stage 1  .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .
//   stage 2  .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .
//   1F1B: p - s - 1 warm-up forwards, then one forward and one backward in turn, then the rest
//   stage 0  F0 F1 F2 .  .  B0 F3 .  B1 .  B2 .  B3
//   stage 2  .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .
//
// Both leave each stage idle for the same share of the time, the bubble (p - 1) / (m + p - 1)
// when every stage's forward and backward take as long; 1F1B keeps at most p - s micro-batches'
// activations alive on stage s instead of m. Gradients of the stage's parameters accumulate over
// the micro-batches; the optimizer steps after train_batch, each rank its own stage.
//
// Interleaved 1F1B (Megatron-LM's virtual pipeline stages, Narayanan et al. 2021, section 2.2):
// each rank holds v model chunks instead of one stage; chunk c of rank s is virtual stage c p + s,
// so a micro-batch goes round the ranks v times (rank p - 1 sends to rank 0 for the next chunk,
// and gradients come back the same way). Each op is then 1/v of a stage's work, and the fill and
// drain take 1/v as long: the bubble is (p - 1) / (v m + p - 1), for v - 1 more messages per
// micro-batch each way. m must be a multiple of p: the ranks take micro-batches p at a time, each
// group through chunk 0, then chunk 1, ... (backwards through the chunks the other way round). The
// warm-up runs (p - s - 1) 2 + (v - 1) p forwards. p = 2, v = 2 (chunks a and b, each half a
// stage's layers), m = 4, an op half as long as above:
//   stage 0  F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a .   B2b .   B3b B2a B3a
//   stage 1  .   F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a .
// (1F1B with the same layers, p = 2 and m = 4 takes 10 of the old steps, this 9; the bubbles are
// 1/5 and 1/9.) Each micro-batch crosses between ranks v p - 1 times each way instead of p - 1.
// Rank s keeps up to min((p - s - 1) 2 + (v - 1) p + 1, m v) chunk micro-batches' activations alive,
// each about 1/v of a stage's: more than 1F1B's p - s stages' worth, as Megatron's interleaving
// does too. Tested over MPI only: NCCL runs one rank here (one GPU).
//
// Random numbers (dropout): a stage's forwards draw from the default generator in the order they
// run. With one stage per rank that is micro-batch order, as on one process; a rank's chunks run
// out of that order (above, chunk b of micro-batch 0 after chunk a of micro-batch 1). Chunks that
// draw their micro-batch's numbers where the whole model would (DrawsAsWholeModel, below) have each
// forward started where one process's forward of that micro-batch starts, so their masks are one
// process's under every schedule. A train_batch that throws leaves the generator where it found it,
// so that a caller who catches the Error and runs the batch again draws the same numbers.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/comm/communicator.h"
#include "nn/module.h"

namespace kiln::distributed {

enum class PipelineSchedule { kGPipe, k1F1B, kInterleaved1F1B };

struct PipelineOptions {
  int64_t micro_batches = 4;                        // m: the batch's dim 0 is cut into m chunks
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  // Post each receive one message ahead of need, so that transfers can overlap computation. Off
  // by default: with 2 stages on 2 cores (bench_pipeline) it lowered 1F1B's bubble by 0.02-0.06
  // but not the time per batch, as the stages' computation slowed by as much (it shares the cores
  // with the polling of the receives in flight). Ignored where send and recv run in call order
  // (NCCL): an early receive would hold back the sends called after it. Every rank must pass the
  // same value (compared when the Pipeline is made).
  bool recv_ahead = false;
  // Called on this stage just before each micro-batch's backward, with its index and whether it is
  // the batch's last backward here (the backwards run in micro-batch order in every schedule; with
  // several chunks, whether it is the chunk's last, chunk_index() saying which chunk it is).
  // kiln::Engine uses it to have the gradients reduced over the data-parallel ranks during the last
  // backward only.
  std::function<void(int64_t micro_batch, bool last)> before_backward = {};
  // A stage other than the last keeps, of each output it sent, only where backward enters the
  // graph there (autograd::get_gradient_edge), not the output's values: backward needs only the
  // graph and the gradient that comes back (Megatron-LM's --deallocate-pipeline-outputs, on by
  // default as there). false keeps the outputs, to measure what this saves.
  bool deallocate_outputs = true;
};

class Pipeline {
 public:
  // loss_fn(output, target) -> a single-element mean loss (the last stage's). comm: the pipeline's
  // ranks, stage s = rank s. `stage` must outlive the pipeline.
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
  Pipeline(nn::Module& stage, std::shared_ptr<Communicator> comm, LossFn loss_fn, PipelineOptions options = {});
  // Interleaved 1F1B: this rank's v model chunks, chunk c being virtual stage c p + s (c = 0 holds the
  // layers nearest the input). Every rank must pass as many chunks, and the schedule
  // kInterleaved1F1B (with one chunk it runs 1F1B). The chunks must outlive the pipeline.
  // Every rank of comm constructs its stage's Pipeline (an all-reduce compares the ranks' options
  // and chunk counts: a difference is an Error on every rank).
  Pipeline(std::vector<nn::Module*> chunks, std::shared_ptr<Communicator> comm, LossFn loss_fn,
           PipelineOptions options = {});

  // One batch, forward and backward, on every stage (every rank calls it): `input` is read on the
  // first stage and `target` on the last (the others may pass undefined tensors). Returns the
  // batch's mean loss on every rank. The stage's (every chunk's) parameters get the gradient of that
  // loss.
  Tensor train_batch(const Tensor& input, const Tensor& target);
  // Forward only (no graph kept), with the stage (every chunk) in eval mode: the last stage's
  // outputs of every micro-batch, concatenated along dim 0; undefined on the other stages.
  // Afterwards each chunk is in the mode it was in, every submodule with it (Module::train), as
  // DeepSpeed's train_batch puts the whole module back in training mode.
  Tensor eval_batch(const Tensor& input);

  int stage_id() const { return comm_->rank(); }
  int num_stages() const { return comm_->size(); }
  int64_t num_chunks() const { return static_cast<int64_t>(chunks_.size()); }  // v: 1 but when interleaved
  // The chunk whose forward or backward is running (0 outside them): for before_backward.
  int64_t chunk_index() const { return chunk_; }
  bool is_first_stage() const { return stage_id() == 0; }
  bool is_last_stage() const { return stage_id() == num_stages() - 1; }

  // Measured in the last train_batch on this stage. The stages' batches end at different moments
  // (the last stage is done once it has sent its last gradient back), so a stage's bubble is best
  // taken against the slowest stage's seconds: 1 - compute_seconds / that (bench_pipeline does).
  struct Stats {
    double seconds = 0;          // the whole train_batch on this stage
    double compute_seconds = 0;  // in the stage's forward, the loss and backward: the rest is idle or messages
    double wait_seconds = 0;     // of the rest, blocked in receives: waiting for a neighbour
    int64_t peak_in_flight = 0;  // micro-batches (with chunks: a chunk's micro-batches) alive at once
  };
  Stats last_stats() const { return stats_; }

 private:
  struct MicroBatch;
  // One direction of messages of this stage (tag kActivationTag or kGradientTag) in the current
  // batch: how many went, the dtype and shape of the last, and, on the receiving side, the receive
  // posted ahead for the next.
  struct Channel {
    int64_t count = 0;
    DType dtype = DType::Float32;
    Shape shape;
    Tensor header, data;
    Work header_work, data_work;
    bool ahead = false;
  };
  void start_batch();
  bool receives_ahead() const { return options_.recv_ahead && !comm_->p2p_in_call_order(); }
  Tensor header_buffer() const;  // what a message's header is received into
  std::pair<DType, Shape> decode_header(const Tensor& h, int src) const;
  // Virtual stage c p + s: the first reads the batch's input, the last computes the loss.
  bool first_virtual(int64_t chunk) const { return chunk == 0 && is_first_stage(); }
  bool last_virtual(int64_t chunk) const { return chunk == num_chunks() - 1 && is_last_stage(); }
  void forward_step(int64_t chunk, MicroBatch& mb, const Tensor& input, const Tensor& target, bool keep_graph);
  void backward_step(int64_t chunk, MicroBatch& mb);
  void send(const Tensor& t, int dst, int tag);
  Tensor recv(int src, int tag);
  void wait_sends();

  std::vector<nn::Module*> chunks_;  // one but when interleaved
  int64_t chunk_ = 0;
  std::shared_ptr<Communicator> comm_;
  LossFn loss_fn_;
  PipelineOptions options_;
  std::vector<Work> sends_;           // in flight
  std::vector<Tensor> send_buffers_;  // what each of them reads (the same index), alive until it completes
  Channel sent_[2], received_[2];  // by tag
  int64_t expected_[2] = {0, 0};   // receives of each tag in the current batch (where receives ahead stop)
  std::deque<Tensor> local_[2];    // one rank with several chunks: its messages to itself, by tag, in order
  bool draws_as_whole_model_ = false;  // every chunk is a DrawsAsWholeModel
  Device device_ = Device::cpu();   // where this stage's parameters are: received tensors go there (per batch)
  double loss_sum_ = 0;  // the last stage's, over the micro-batches of train_batch
  Stats stats_;
};

// What a stage or chunk module implements (it has nothing to override) when each of its forwards
// moves the default generator as a forward of the whole model does: it draws its own layers' random
// numbers where the whole model draws them, and reserves the others' (Generator::reserve), as
// models::ParallelGPT does for dropout. The pipeline then starts the forward of micro-batch i from
// the batch's starting state plus i times what the first forward moved it, in whatever order the
// schedule runs the forwards, and leaves the generator after the batch where m forwards of one
// process leave it. A forward that moves the generator by another amount than the batch's first is
// an Error naming the chunk (on that rank: the others stop at the communicator's timeout, or at
// once where the program aborts the job on an Error, as kiln-train and train_gpt do). Either every
// chunk of a rank implements it or none does.
class DrawsAsWholeModel {
 public:
  virtual ~DrawsAsWholeModel() = default;
};

// A weight that two stages use, each holding a copy of it: GPT's token embedding, which the last
// stage uses again as its head (DeepSpeed's TiedLayerSpec, Megatron's shared embedding). The owner
// stage trains it; the user stage's copy takes part in forward and backward, but its gradient is
// added to the owner's before the step (add_tied_gradients) and the owner's new weight is copied
// into it after (copy_tied_weights), so that the two stay equal and the step is the one a single
// process takes with one weight used twice. kiln::Engine does both, and keeps the copy out of the
// user stage's optimizer.
struct TiedWeight {
  Tensor weight;  // this stage's copy (a parameter of its module)
  int owner = 0;  // the stage that trains it
  int user = 0;   // the stage that holds a copy
};

// What a stage module whose weights are tied to another stage's implements, so that the engine
// finds its ties. Both stages of a tie list it, in the same order as every other tie between them.
class TiedWeights {
 public:
  virtual ~TiedWeights() = default;
  virtual std::vector<TiedWeight> tied_weights() = 0;  // this stage's; empty where it has none
};

// Checks the stages' lists: stages in range, a stage in each of its ties, the weights defined, and
// both stages of a pair listing as many ties. Every stage calls it (an all-gather); when anything
// is wrong every stage gets an Error naming it. The two below check only the caller's own list.
void check_tied_weights(const std::vector<TiedWeight>& tied, Communicator& pipeline,
                        const char* who = "tied weights");
// Where add_tied_gradients finds a copy's gradient and puts the one it receives, when that is not
// the weights' .grad(): kiln::Engine, whose gradients accumulate in float32 for a 16-bit model
// (DeepSpeed's grad_accum_dtype), sums the user's copy's micro-batches in float32 and adds the sum
// into the owner's float32 gradient, as DeepSpeed's pipeline all-reduces a tied weight's
// high-precision gradient.
struct TiedGradients {
  DType dtype = kFloat32;  // what take gives, and travels
  std::function<Tensor(const TiedWeight&)> take;             // the user's gradient (zeros if none); reset after
  std::function<void(const TiedWeight&, const Tensor&)> add;  // the owner adds what it received
};
// Over the pipeline's ranks (stage s = rank s), for each tie of this stage: the user sends its
// copy's gradient (zeros where it got none) and drops it, and the owner adds it to its weight's
// .grad(); or, given gradients, what gradients.take gives goes to gradients.add. Only the two
// stages of a tie take part; each calls it with its own list. A copy whose shape differs from the
// other stage's is an Error (after every message is in), as is a dtype other than the copy's (or,
// given gradients, than gradients.dtype).
void add_tied_gradients(const std::vector<TiedWeight>& tied, Communicator& pipeline,
                        const TiedGradients* gradients = nullptr);
// For each tie of this stage: the owner's weight into the user's copy (the same Errors).
void copy_tied_weights(const std::vector<TiedWeight>& tied, Communicator& pipeline);

}  // namespace kiln::distributed

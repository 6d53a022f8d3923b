// distributed/engine/engine.h: Engine, DeepSpeed's training engine: one object that applies what a
// ds_config.json asks for (mixed precision, gradient accumulation, clipping, a ZeRO stage, optimizer
// offload, the optimizer and its schedule) around a model, on every rank of the job.
//
//   auto comm = distributed::init();
//   auto engine = kiln::initialize(model, Config::from_file("ds_config.json"), comm);
//   for (auto& [x, y] : loader) {            // micro-batches of train_micro_batch_size_per_gpu
//     Tensor loss = nn::cross_entropy(engine(x), y);
//     engine.backward(loss);                 // scaled by 1 / gradient_accumulation_steps (and the loss scale)
//     engine.step();                         // steps the optimizer at the end of each accumulation
//   }
//   engine.save_checkpoint("ckpt");          // resumable at another world size or ZeRO stage
//   engine.save_16bit_model("out");          // the whole model, one file, for inference
//
// As DeepSpeed's: fp16 or bf16 convert the model to that dtype (float32 master weights live in the
// ZeRO optimizer, partitioned from stage 1; with bf16 at stage 0 the gradients accumulate in
// float32 unless data_types.grad_accum_dtype says otherwise); with fp16 the loss is scaled dynamically
// (ShardedGradScaler, DeepSpeed's rule) and a step whose gradients overflow on any rank is skipped
// on all; step() is called after every backward and acts only at the accumulation boundary, where
// it unscales, clips the global gradient norm, steps the optimizer and the schedule and zeroes the
// gradients. Stage 0 is plain data parallelism (gradients all-reduced during backward). The engine
// owns the optimizer; zero_grad() is part of step(). Rank 0 prints every steps_per_print steps: the
// step, lr, loss scale and gradient norm; with wall_clock_breakdown the time in forward, backward
// and step (waiting for a GPU at each phase's ends); with memory_breakdown the tensor memory now
// and its peak since the last print (the largest over the ranks, on the model's device and, for a
// GPU model, the host); with activation_checkpointing's profile, rank 0's checkpointed blocks'
// forward, recompute and backward times (nn::ActivationCheckpointing::profile). With
// "flops_profiler", rank 0 profiles one forward (nn::FlopsProfiler) and prints the profile at the
// end of its step, as DeepSpeed's engine does (not on a pipeline: profile a stage's module itself).
// With "comms_logger", the engine's communication is timed (comms_logger(), log_summary()); with
// "tensorboard" or "csv_monitor", rank 0 writes the loss, lr, loss scale and phase times at each
// step (distributed/engine/monitor.h). With "curriculum_learning" (curriculum.h), a training
// forward keeps the first curriculum_seqlen() positions of its (B, T) input, a length that grows by
// the schedule (train_batch cuts the targets too). With "torch_autocast", the model stays float32 and forward
// (train_batch and eval_batch on a pipeline) runs under autocast to its dtype; the ZeRO optimizer
// averages the gradients of its lower_precision_safe_modules in that dtype (ZeroOptions::
// autocast_dtype), and with float16 the loss is scaled by PyTorch's GradScaler rule.
//
// Pipeline and tensor parallel (DeepSpeed's PipelineEngine, Megatron's 3D parallelism): built from
// this rank's stage and a ParallelGrid, the engine runs each batch through a 1F1B Pipeline
// (distributed/pipeline/pipeline.h) along the grid's pipeline axis, its gradient_accumulation_steps
// micro-batches of train_micro_batch_size_per_gpu each, and does the rest as above over the grid's
// data axis. The stage's layers may be tensor-parallel over the grid's tensor axis
// (distributed/tensor_parallel/tensor_parallel.h):
//
//   auto world = distributed::init();
//   distributed::ParallelGrid grid(world, {.pipeline = 2});          // data = world size / 2
//   MyStage stage(grid.pipeline_rank());                              // this rank's layers
//   auto engine = kiln::initialize(stage, config, grid, loss_fn);
//   for (auto& [x, y] : loader) engine.train_batch(x, y);  // one optimizer step; returns the loss
//
// Given this rank's model chunks instead of one stage (kiln::initialize({&a, &b}, config, grid,
// loss_fn)), the pipeline runs interleaved 1F1B (Megatron-LM's virtual stages; pipeline.h), chunk c
// of rank s being virtual stage c p + s; gradient_accumulation_steps must then be a multiple of the
// pipeline's size. module() is then a module whose children "0", "1", ... are the chunks, and the
// checkpoints name each chunk's weights with that prefix.
//
// The gradients are reduced over the data axis during each stage's last backward (with chunks, or
// tied weights, after the pipeline: a reducing backward reduces every bucket at its end, and the
// chunks' last backwards come at different times); the clipping
// norm and fp16's overflow check span every stage and slice (a parameter that every rank of a
// tensor group holds whole counts once). A stage that implements distributed::TiedWeights (GPT's
// embedding, used again as the head on the last stage) has each copy's gradient added to the
// owner's before its reduction, which then runs after the pipeline, and the owner's new weight
// copied back after the step; the copies are not in their stage's optimizer. Where gradients
// accumulate in float32 for a 16-bit model (grad_accum_dtype), a copy's micro-batches are summed
// in float32 too, and the sum travels and is added in float32. As DeepSpeed, ZeRO
// stages 2 and 3 do not go with a pipeline, and forward, backward and step are Errors there:
// train_batch does all three.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/engine/config.h"
#include "distributed/grid/grid.h"
#include "distributed/pipeline/pipeline.h"
#include "distributed/zero/zero_optimizer.h"
#include "optim/lr_scheduler.h"

namespace kiln::nn {
class FlopsProfiler;  // nn/flops_profiler.h
}

namespace kiln {

class MonitorMaster;  // distributed/engine/monitor.h
class AutocastGuard;  // ops/autocast.h

class Engine {
 public:
  // comm: the data-parallel ranks (nullptr: distributed::init(), NCCL for a CUDA model where
  // built with it, else MPI). `model` must outlive the engine; it is converted to the config's dtype.
  Engine(nn::Module& model, const Config& config, std::shared_ptr<distributed::Communicator> comm = nullptr);
  // Pipeline (and tensor) parallel: `stage` is this rank's stage (grid.pipeline_rank()), its layers
  // tensor-parallel over grid.tensor() where the grid has a tensor axis, and must outlive the
  // engine; `loss_fn(output, target)` gives the last stage's mean loss of a micro-batch. Every rank
  // of the grid builds it.
  Engine(nn::Module& stage, const Config& config, const distributed::ParallelGrid& grid,
         distributed::Pipeline::LossFn loss_fn);
  // Interleaved 1F1B: this rank's model chunks (chunk c: virtual stage c p + s of the grid's p
  // pipeline ranks; every rank must pass as many, else every rank gets an Error), which must
  // outlive the engine. One chunk is the constructor above.
  Engine(std::vector<nn::Module*> chunks, const Config& config, const distributed::ParallelGrid& grid,
         distributed::Pipeline::LossFn loss_fn);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The model's forward (with fp16.auto_cast, floating inputs are cast to float16 first).
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  // Backward of one micro-batch's loss (a single element).
  void backward(const Tensor& loss);
  // Counts the micro-batch; at the accumulation boundary updates the weights (see above).
  void step();

  // Pipeline parallel: one optimizer step on a batch of micro-batch x gradient_accumulation_steps
  // rows (this data-parallel rank's), forward and backward through every stage: `input` is read on
  // the first stage and `target` on the last (others may pass undefined tensors). Returns the
  // batch's mean loss, averaged over the data-parallel ranks, on every rank.
  Tensor train_batch(const Tensor& input, const Tensor& target);
  // Pipeline parallel: forward only; the last stage's outputs (undefined on the other stages).
  Tensor eval_batch(const Tensor& input);
  bool is_pipeline_parallel() const { return pipeline_ != nullptr; }

  bool is_gradient_accumulation_boundary() const {
    return (micro_steps_ + 1) % batch_.gradient_accumulation_steps == 0;
  }
  int64_t global_steps() const { return global_steps_; }  // optimizer steps taken or skipped
  int64_t micro_steps() const { return micro_steps_; }
  int64_t skipped_steps() const { return scaler_->skipped_steps(); }
  std::vector<double> get_lr() const;   // per parameter group
  double loss_scale() const { return scaler_->get_scale(); }
  // The gradients' global norm before clipping, at the last step (-1 before the first).
  double get_global_grad_norm() const { return global_grad_norm_; }
  int64_t train_batch_size() const { return batch_.train_batch_size; }
  int64_t train_micro_batch_size_per_gpu() const { return batch_.micro_batch_size; }
  int64_t gradient_accumulation_steps() const { return batch_.gradient_accumulation_steps; }
  DType dtype() const { return dtype_; }  // the model's weights
  std::optional<DType> autocast_dtype() const { return autocast_dtype_; }  // torch_autocast's, when on
  // "curriculum_learning": the schedule's current sequence length, at most which positions the last
  // training forward kept (cut its loss's targets as its output); 0 when off. The scheduler, or nullptr.
  int64_t curriculum_seqlen() const { return curriculum_ ? curriculum_->get_current_difficulty() : 0; }
  const CurriculumScheduler* curriculum_scheduler() const { return curriculum_.get(); }

  nn::Module& module() { return model_; }  // with chunks, the module that holds them as "0", "1", ...
  distributed::ZeroOptimizer& optimizer() { return *optimizer_; }
  optim::LRScheduler* lr_scheduler() { return scheduler_.get(); }
  distributed::Communicator& comm() { return *comm_; }  // the data-parallel ranks
  // "comms_logger": the logger that times the engine's communication (nullptr when not enabled).
  // The engine's communicators (data parallel, the whole job, the pipeline's and the tensor
  // group's) go through it; a stage's own tensor-parallel layers talk on the grid's communicators
  // directly and are not logged.
  distributed::CommsLogger* comms_logger() { return comms_logger_.get(); }
  // DeepSpeed's deepspeed.comm.log_summary(show_straggler): rank 0 of the job prints its logger's
  // table (nothing without "comms_logger"); not a collective, call it on any ranks. With
  // show_straggler, then the breakdown of each operation into transfer and waiting for the slowest
  // rank (CommsLogger::straggler_summary): a collective, every rank calls it, and not on a
  // pipeline-parallel engine, whose stages log different messages (an Error on every rank).
  void log_summary(bool show_straggler = false);
  // "tensorboard" and "csv_monitor": rank 0's monitors (nullptr elsewhere, and without them).
  MonitorMaster* monitor() { return monitor_.get(); }
  // DeepSpeed's global_samples: samples of the steps taken (or skipped), global_steps x train_batch_size.
  int64_t global_samples() const { return global_steps_ * batch_.train_batch_size; }
  const Config& config() const { return config_; }

  // Writes dir/tag/ (tag "" is DeepSpeed's "global_step<N>"): model.safetensors (rank 0: every
  // weight and buffer, gathered at stage 3), zero_rank_<r>.safetensors (each rank's shard of the
  // optimizer: float32 masters and state) and engine.safetensors (rank 0: the step count, schedule,
  // loss scale), then dir/latest naming the tag, once every rank has written. With a grid, each
  // stage's files go to dir/tag/stage_<s>/ (and each tensor slice's to tensor_<t>/ in it; the ranks
  // named by their data-parallel rank), and a load needs as many stages and slices. Call it after a
  // step (the gradients of an accumulation in progress are not saved). Each file is written whole
  // or not at all, and `latest` moves last, so a save cut off leaves the previous one loadable.
  // Every rank calls it, with the same tag: the config's checkpoint.tag_validation (DeepSpeed's,
  // "Warn" by default) compares the ranks' tags, and a mismatch is a warning, or with "Fail" an Error.
  void save_checkpoint(const std::string& dir, const std::string& tag = "");
  // DeepSpeed's save_16bit_model: rank 0 writes save_dir/save_filename, a safetensors file of the
  // model's state_dict() with every weight whole, in the model's dtype (16 bits under fp16 or bf16),
  // which a single-process model (or Hugging Face's loaders, for a matching model) loads as it is.
  // At stage 3 this needs "stage3_gather_16bit_weights_on_model_save": true (the weights are
  // gathered one parameter at a time); without it nothing is written and it returns false, as
  // DeepSpeed's. exclude_frozen_parameters leaves out the parameters that do not require grad.
  // With a grid, each stage writes its own layers to save_dir/stage_<s>/save_filename (each
  // tensor slice in tensor_<t>/ there; with chunks, their names prefixed "0.", "1.", ... as
  // module() holds them).
  // Every rank calls it; written whole or not at all.
  bool save_16bit_model(const std::string& save_dir, const std::string& save_filename = "model.safetensors",
                        bool exclude_frozen_parameters = false);
  // Loads dir/tag (tag "": the one dir/latest names), saved at any world size and ZeRO stage with
  // the same model and optimizer; returns the tag. Training resumes at the step after the saved
  // one's, at an accumulation boundary. Every rank calls it.
  std::string load_checkpoint(const std::string& dir, const std::string& tag = "");

 private:
  Engine(std::unique_ptr<nn::Module> holder, const std::vector<nn::Module*>& chunks, const Config& config,
         const distributed::ParallelGrid& grid, distributed::Pipeline::LossFn loss_fn);
  void init(std::shared_ptr<distributed::Communicator> world);
  void sum_tied_gradients(DType wide);  // tied_sums_ and tied_gradients_
  // load_checkpoint's work on this rank: reading this stage's files (no collective), then loading
  // what was read into the model, optimizer, scaler and scheduler.
  struct StageFiles;
  StageFiles read_stage(const std::string& dir, const std::string& tag) const;
  void load_stage(StageFiles& files);
  void optimizer_step();  // at an accumulation boundary: unscale, clip, step, schedule, zero_grad
  void report();
  void print_flops_profile(double step_seconds);
  std::string stage_folder(const std::string& dir, const std::string& tag) const;
  std::vector<distributed::Communicator*> model_parallel() const;  // the tensor and pipeline axes

  std::unique_ptr<nn::Module> chunk_holder_;  // with several chunks: model_, their parent
  nn::Module& model_;
  Config config_;
  std::shared_ptr<distributed::Communicator> comm_;   // data parallel
  std::shared_ptr<distributed::Communicator> world_;  // every rank (comm_ without a pipeline)
  std::shared_ptr<distributed::Communicator> pipeline_comm_, tensor_comm_;  // with a grid
  std::unique_ptr<distributed::Pipeline> pipeline_;
  int64_t chunks_ = 1;  // model chunks per pipeline rank (interleaved 1F1B when more than 1)
  std::function<bool(const Tensor&)> counted_;  // in the gradient norm on this rank (tensor parallel)
  std::vector<distributed::TiedWeight> tied_;   // this stage's weights tied to another's (pipeline)
  // With gradients accumulating wider than the model (grad_accum_dtype): each of this stage's
  // copies of a tied weight sums its micro-batches' gradients in that dtype (a hook adds each one
  // and drops .grad()), and the sum goes to the owner, which adds it to its own wide gradient.
  // A copy frozen when the engine was built has no hook (one needs a leaf that requires grad), and
  // sends its .grad() as it is. The hook goes with the sum, even when a constructor throws.
  struct TiedSum {
    Tensor weight, sum;
    uint64_t hook = 0;
    TiedSum(Tensor w, Tensor s) : weight(std::move(w)), sum(std::move(s)) {}
    TiedSum(const TiedSum&) = delete;
    TiedSum& operator=(const TiedSum&) = delete;
    ~TiedSum() {
      if (hook != 0) weight.remove_post_accumulate_grad_hook(hook);
    }
  };
  std::vector<std::unique_ptr<TiedSum>> tied_sums_;
  std::unique_ptr<distributed::TiedGradients> tied_gradients_;  // set with them, on owners too
  Config::Batch batch_;
  DType dtype_;
  std::optional<DType> autocast_dtype_;  // "torch_autocast": forward runs under autocast to it
  std::unique_ptr<CurriculumScheduler> curriculum_;  // "curriculum_learning"
  // A training batch's input (and a pipeline's target) cut to the sequence length of this step
  // (s = optimizer steps + 1, as DeepSpeed's): the schedule moves, and dim 1 keeps that many
  // positions. An input of one dim is an Error; a target of one dim is left whole.
  std::pair<Tensor, Tensor> apply_curriculum(const Tensor& input, const Tensor& target, const char* who);
  // Autocast for the model's forwards, while "torch_autocast" is on; nothing (an outer scope's
  // state stays) when it is off.
  std::optional<AutocastGuard> forward_autocast() const;
  std::unique_ptr<distributed::ZeroOptimizer> optimizer_;
  std::unique_ptr<optim::LRScheduler> scheduler_;
  std::unique_ptr<distributed::ShardedGradScaler> scaler_;
  int64_t global_steps_ = 0, micro_steps_ = 0;
  double global_grad_norm_ = -1;
  // wall_clock_breakdown: seconds since the last report, each phase timed from and to a moment when
  // the model's device had finished what was queued (as DeepSpeed's SynchronizedWallClockTimer), so
  // that a GPU's work counts in the phase that queued it
  double forward_s_ = 0, backward_s_ = 0, step_s_ = 0;
  Device device_ = Device::cpu();  // the model's, when the engine was built
  // "flops_profiler": made at the forward it profiles; the backward and step after it are timed,
  // and the step prints the profile and ends it.
  std::unique_ptr<nn::FlopsProfiler> flops_profiler_;
  enum class Profiling { kNotYet, kForwardDone, kBackwardDone, kDone } profiling_ = Profiling::kNotYet;
  double profiled_backward_s_ = 0;
  std::shared_ptr<distributed::CommsLogger> comms_logger_;
  std::unique_ptr<MonitorMaster> monitor_;
  // Rank 0's micro-batch losses of this step, each / gradient_accumulation_steps, summed on the
  // loss's device and read once, at the boundary (as DeepSpeed's): no wait for a GPU at each.
  Tensor monitor_loss_;
  double monitored_forward_s_ = 0, monitored_backward_s_ = 0, monitored_step_s_ = 0;  // the phases' sums at the last write
  void write_step_events();  // after an optimizer step, rank 0: lr, loss scale, phase times
  std::chrono::steady_clock::time_point now() const;
  double seconds_since(std::chrono::steady_clock::time_point t0) const;
};

// DeepSpeed's deepspeed.initialize: the engine for `model` (returned by value; an Engine is not
// copied or moved, and `auto engine = kiln::initialize(...)` builds it in place).
Engine initialize(nn::Module& model, const Config& config, std::shared_ptr<distributed::Communicator> comm = nullptr);
// ... and DeepSpeed's initialize of a PipelineModule: the pipeline-parallel engine (see above).
Engine initialize(nn::Module& stage, const Config& config, const distributed::ParallelGrid& grid,
                  distributed::Pipeline::LossFn loss_fn);
// ... with this rank's model chunks: interleaved 1F1B (see above).
Engine initialize(std::vector<nn::Module*> chunks, const Config& config, const distributed::ParallelGrid& grid,
                  distributed::Pipeline::LossFn loss_fn);

}  // namespace kiln

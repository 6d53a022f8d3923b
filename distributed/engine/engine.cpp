// distributed/engine/engine.cpp: the DeepSpeed-style engine (see engine.h): what a config turns on,
// applied around one ZeroOptimizer.
#include "distributed/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <tuple>

#include "core/grad_mode.h"
#include "cuda/cuda.h"
#include "data/safetensors.h"
#include "distributed/comm/comms_logger.h"
#include "distributed/comm/peer_error.h"
#include "distributed/engine/monitor.h"
#include "distributed/tensor_parallel/tensor_parallel.h"
#include "nn/flops_profiler.h"
#include "ops/autocast.h"
#include "ops/ops.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

// Runs `work` on the ranks where `mine` is true, then tells every rank of `world` how it went: when
// it failed anywhere, that rank throws its own Error and every other rank one that points to it (a
// distributed::PeerError),
// instead of going on to wait in a collective for a rank that has stopped. (A collective itself: it
// also keeps every rank from going on before the work is done.)
void run_and_agree(distributed::Communicator& world, bool mine, const char* who, const std::string& what,
                   const std::function<void()>& work) {
  std::exception_ptr failure;
  if (mine) {
    try {
      work();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  Tensor ok = from_vector<int32_t>({failure ? 0 : 1}).to(world.device());
  distributed::CommCaller caller("Engine: every rank's outcome");
  world.all_reduce(ok, distributed::ReduceOp::Min);
  if (failure) std::rethrow_exception(failure);
  if (ok.item<int32_t>() != 1) {
    throw distributed::PeerError(fmt::format("{}: {} failed on another rank; its Error says why", who, what));
  }
}

distributed::ZeroOptimizer::MakeOptimizer make_inner(const Config::Optimizer& o) {
  return [o](std::vector<Tensor> masters) -> std::unique_ptr<optim::Optimizer> {
    if (o.type == "adam" && !o.adam_w_mode) {
      const auto& a = o.adam;
      return std::make_unique<optim::Adam>(std::move(masters), optim::AdamOptions{
          .lr = a.lr, .beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps, .weight_decay = a.weight_decay,
          .amsgrad = a.amsgrad, .maximize = false, .fused = true});
    }
    if (o.type == "adam" || o.type == "adamw") {
      optim::AdamWOptions a = o.adam;
      a.fused = true;  // DeepSpeed's FusedAdam
      return std::make_unique<optim::AdamW>(std::move(masters), a);
    }
    if (o.type == "sgd") {
      optim::SGDOptions s = o.sgd;
      s.fused = true;
      return std::make_unique<optim::SGD>(std::move(masters), s);
    }
    if (o.type == "adagrad") return std::make_unique<optim::Adagrad>(std::move(masters), o.adagrad);
    return std::make_unique<optim::RMSprop>(std::move(masters), o.rmsprop);
  };
}

std::unique_ptr<optim::LRScheduler> make_scheduler(const Config::Scheduler& s, optim::Optimizer& opt) {
  if (s.type == "WarmupLR") return std::make_unique<optim::WarmupLR>(opt, s.warmup_lr);
  if (s.type == "WarmupDecayLR") return std::make_unique<optim::WarmupDecayLR>(opt, s.warmup_decay_lr);
  return std::make_unique<optim::WarmupCosineLR>(opt, s.warmup_cosine_lr);
}

std::shared_ptr<distributed::Communicator> default_comm(const nn::Module& model) {
  bool on_cuda = false;
  for (const Tensor& p : model.parameters()) on_cuda = on_cuda || p.is_cuda();
  return distributed::init(on_cuda && distributed::is_available("nccl") ? "nccl" : "mpi");
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    KILN_CHECK(out.good(), "save_checkpoint: cannot write '{}'; check that the directory is writable", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  KILN_CHECK(!ec, "save_checkpoint: cannot rename '{}' to '{}': {}", tmp, path, ec.message());
}

// The parent of an interleaved pipeline's chunks, so that the optimizer, the dtype conversion and
// the checkpoints see this rank's chunks as one module, children "0", "1", ... (borrowed).
class ChunkHolder : public nn::Module {
 public:
  explicit ChunkHolder(const std::vector<nn::Module*>& chunks) {
    for (size_t c = 0; c < chunks.size(); ++c) register_module(std::to_string(c), *chunks[c]);
  }
  Tensor forward(const Tensor&) override {
    KILN_FAIL("Engine: a pipeline's model chunks run through Engine.train_batch and eval_batch, not as one module");
  }
};

// The holder of several chunks; nullptr for one (the engine's model is then the chunk itself).
std::unique_ptr<nn::Module> chunk_holder(const std::vector<nn::Module*>& chunks) {
  KILN_CHECK(!chunks.empty(), "Engine: no model chunks; pass this rank's stage, or its chunks for interleaved 1F1B");
  for (size_t c = 0; c < chunks.size(); ++c) {
    KILN_CHECK(chunks[c] != nullptr, "Engine: model chunk {} of {} is null; pass a module for every chunk", c,
               chunks.size());
  }
  if (chunks.size() == 1) return nullptr;
  return std::make_unique<ChunkHolder>(chunks);
}

}  // namespace

Engine::Engine(nn::Module& model, const Config& config, std::shared_ptr<distributed::Communicator> comm)
    : model_(model), config_(config), comm_(comm ? std::move(comm) : default_comm(model)) {
  init(comm_);
}

Engine::Engine(nn::Module& stage, const Config& config, const distributed::ParallelGrid& grid,
               distributed::Pipeline::LossFn loss_fn)
    : Engine(nullptr, {&stage}, config, grid, std::move(loss_fn)) {}

Engine::Engine(std::vector<nn::Module*> chunks, const Config& config, const distributed::ParallelGrid& grid,
               distributed::Pipeline::LossFn loss_fn)
    : Engine(chunk_holder(chunks), chunks, config, grid, std::move(loss_fn)) {}

Engine::Engine(std::unique_ptr<nn::Module> holder, const std::vector<nn::Module*>& chunks, const Config& config,
               const distributed::ParallelGrid& grid, distributed::Pipeline::LossFn loss_fn)
    : chunk_holder_(std::move(holder)),
      model_(chunk_holder_ ? *chunk_holder_ : *chunks.at(0)),
      config_(config),
      comm_(grid.data()),
      pipeline_comm_(grid.pipeline()),
      tensor_comm_(grid.tensor()),
      chunks_(static_cast<int64_t>(chunks.size())) {
  KILN_CHECK(config_.zero_optimization.stage <= 1,
             "Engine: ZeRO stage {} does not go with pipeline parallelism (nor does it in DeepSpeed): set "
             "\"zero_optimization\": {{\"stage\": 0}} or 1", config_.zero_optimization.stage);
  KILN_CHECK(loss_fn != nullptr, "Engine: the pipeline's loss function is empty; pass loss_fn(output, target) "
             "returning the last stage's mean loss of a micro-batch");
  // Weights this stage shares with another (DeepSpeed's TiedLayerSpec): checked on every rank first,
  // so that a wrong list stops them all rather than a stage waiting for its partner.
  for (nn::Module* chunk : chunks) {
    if (auto* holder = dynamic_cast<distributed::TiedWeights*>(chunk)) {
      for (const distributed::TiedWeight& t : holder->tied_weights()) tied_.push_back(t);
    }
  }
  run_and_agree(*grid.world(), true, "Engine", "checking the stage's tied weights",
                [&] { distributed::check_tied_weights(tied_, *pipeline_comm_, "Engine"); });
  // Every pipeline rank must hold as many chunks, or the ranks would wait on each other's messages
  // until the timeout: the counts are compared (the largest and the smallest) on every rank.
  Tensor counts = from_vector<int64_t>({chunks_, -chunks_}).to(pipeline_comm_->device());
  pipeline_comm_->all_reduce(counts, distributed::ReduceOp::Max);
  const std::vector<int64_t> extremes = counts.to_vector<int64_t>();
  KILN_CHECK(extremes[0] == -extremes[1], "Engine: the pipeline's ranks hold from {} to {} model chunks (this one "
             "{}); every rank must pass as many", -extremes[1], extremes[0], chunks_);
  // Checked before init() converts the chunks and builds the optimizer, so that a bad config
  // leaves the caller's modules as they were.
  const int64_t accumulation = config_.resolve_batch(comm_->size()).gradient_accumulation_steps;
  KILN_CHECK(chunks_ == 1 || accumulation % pipeline_comm_->size() == 0,
             "Engine: interleaved 1F1B takes the micro-batches {} at a time (one per pipeline stage), and "
             "gradient_accumulation_steps is {}; make it a multiple of {}", pipeline_comm_->size(), accumulation,
             pipeline_comm_->size());
  init(grid.world());
  distributed::PipelineOptions options{
      .micro_batches = batch_.gradient_accumulation_steps,
      .schedule = chunks_ > 1 ? distributed::PipelineSchedule::kInterleaved1F1B : distributed::PipelineSchedule::k1F1B};
  // The micro-batches' gradients accumulate on each stage and are reduced over the data-parallel
  // ranks during the last one's backward; on a stage with tied weights, after the pipeline (in
  // train_batch), once the other stage's gradient of each is in; with several chunks, after the
  // pipeline too (a reducing backward reduces every bucket at its end, and the chunks' last
  // backwards come one after another).
  options.before_backward = [this](int64_t, bool last) {
    optimizer_->set_gradient_accumulation_boundary(last && tied_.empty() && chunks_ == 1);
  };
  auto scaled = [this, loss_fn = std::move(loss_fn)](const Tensor& output, const Tensor& target) {
    return scaler_->scale(loss_fn(output, target));
  };
  KILN_CHECK(!config_.flops_profiler.enabled,
             "Engine: \"flops_profiler\" profiles the forward that Engine.forward runs, and a pipeline-parallel "
             "engine runs its stages' forwards inside train_batch; remove the section, and profile a stage's module "
             "with nn::FlopsProfiler around a forward of your own");
  pipeline_ = std::make_unique<distributed::Pipeline>(chunks, pipeline_comm_, scaled, options);
  // The parameters whole on every rank of the tensor group add to the norm on its first rank alone.
  if (tensor_comm_->size() > 1) {
    std::vector<Tensor> slices = distributed::tensor_parallel_slices(model_);
    counted_ = [slices = std::move(slices), first = tensor_comm_->rank() == 0](const Tensor& p) {
      return first || std::any_of(slices.begin(), slices.end(), [&](const Tensor& s) { return s.is_same(p); });
    };
  }
  // The copies start as the owners' weights (a user stage's copy may have been made from other
  // random numbers).
  run_and_agree(*world_, true, "Engine", "copying the tied weights",
                [&] { distributed::copy_tied_weights(tied_, *pipeline_comm_); });
}

void Engine::init(std::shared_ptr<distributed::Communicator> world) {
  world_ = std::move(world);
  // "comms_logger": every communicator the engine and what it builds (the ZeRO optimizer, the
  // pipeline, the scaler) talk on goes through the logger from here on.
  if (config_.comms_logger.enabled) {
    comms_logger_ = std::make_shared<distributed::CommsLogger>(config_.comms_logger, world_->rank() == 0);
    const bool same = world_ == comm_;
    comm_ = distributed::log_communication(comm_, comms_logger_);
    world_ = same ? comm_ : distributed::log_communication(world_, comms_logger_);
    if (pipeline_comm_) pipeline_comm_ = distributed::log_communication(pipeline_comm_, comms_logger_);
    if (tensor_comm_) tensor_comm_ = distributed::log_communication(tensor_comm_, comms_logger_);
  }
  batch_ = config_.resolve_batch(comm_->size());
  KILN_CHECK(config_.optimizer.has_value(),
             "Engine: the config has no \"optimizer\" section; add one, e.g. \"optimizer\": {{\"type\": \"AdamW\", "
             "\"params\": {{\"lr\": 1e-3}}}}");
  // "activation_checkpointing", where given: to every module of the model (the chunks, with
  // several) that takes it; asked for, it must reach one. Its profile is this engine's own.
  if (auto& keeping = config_.activation_checkpointing) {
    if (keeping->profile) keeping->profile = std::make_shared<autograd::CheckpointProfile>();
    int configured = 0;
    for (nn::Module* m : model_.modules()) {
      if (auto* c = dynamic_cast<nn::ConfiguresCheckpointing*>(m)) {
        c->configure_checkpointing(*keeping);
        ++configured;
      }
    }
    KILN_CHECK(configured > 0 || !(keeping->partition_activations || keeping->cpu_checkpointing ||
                                   keeping->synchronize_checkpoint_boundary || keeping->profile),
               "Engine: the config's \"activation_checkpointing\" says how checkpointed blocks keep their inputs "
               "or are timed, but no module of this model checkpoints blocks that way ({} does not implement "
               "nn::ConfiguresCheckpointing; models::GPT and models::ParallelGPT do); remove the section, or set "
               "autograd::CheckpointOptions (keep_input, synchronize, profile) where you checkpoint", model_.name());
  }
  // "flops_profiler": rank 0 writes output_file after the profiled step; a directory that is not
  // there is an Error now, on every rank.
  if (const auto& f = config_.flops_profiler; f.enabled && !f.output_file.empty()) {
    run_and_agree(*world_, world_->rank() == 0, "Engine", "checking flops_profiler.output_file", [&] {
      const std::filesystem::path dir = std::filesystem::path(f.output_file).parent_path();
      KILN_CHECK(dir.empty() || std::filesystem::is_directory(dir),
                 "Engine: \"flops_profiler.output_file\" is '{}', but the directory '{}' does not exist; create it, "
                 "or give another path", f.output_file, dir.string());
    });
  }
  // "tensorboard" and "csv_monitor": rank 0 makes their directories now; one it cannot make stops
  // every rank.
  if (config_.tensorboard.enabled || config_.csv_monitor.enabled) {
    run_and_agree(*world_, world_->rank() == 0, "Engine", "creating the monitors' directories", [&] {
      auto monitors = std::make_unique<MonitorMaster>();
      if (const auto& m = config_.tensorboard; m.enabled) {
        monitors->add(std::make_unique<TensorBoardMonitor>(m.output_path, m.job_name));
      }
      if (const auto& m = config_.csv_monitor; m.enabled) {
        monitors->add(std::make_unique<CsvMonitor>(m.output_path, m.job_name));
      }
      monitor_ = std::move(monitors);
    });
  }
  // DeepSpeed converts the module itself: weights, activations and gradients in 16 bits.
  if (config_.fp16.enabled) model_.to(kFloat16);
  if (config_.bf16.enabled) model_.to(kBFloat16);
  const auto params = model_.parameters();
  KILN_CHECK(!params.empty(), "Engine: the model has no parameters");
  dtype_ = params[0].dtype();
  device_ = params[0].device();
  // A user stage's copy of a tied weight stays out of its optimizer (the owner trains the weight):
  // ZeroOptimizer trains what requires grad, so the copy does not while it is built.
  std::vector<Tensor> copies;
  for (const auto& t : tied_) {
    if (t.user == pipeline_comm_->rank() && t.weight.requires_grad()) copies.push_back(t.weight);
  }
  // DeepSpeed's default where data_types.grad_accum_dtype is unset: bfloat16 without ZeRO (its
  // BF16_Optimizer) accumulates the gradients in float32; everything else in the model's dtype.
  distributed::ZeroOptions zero = config_.zero_optimization;
  if (!zero.grad_accum_dtype && dtype_ == kBFloat16 && zero.stage == 0) zero.grad_accum_dtype = kFloat32;
  // "torch_autocast": dtype unset is torch.autocast's default for the device. ZeroOptimizer checks
  // that the model is float32 and applies the dtype to the listed modules' communication.
  if (const auto& t = config_.torch_autocast; t.enabled) {
    autocast_dtype_ = t.dtype.value_or(device_.is_cuda() ? kFloat16 : kBFloat16);
    zero.autocast_dtype = autocast_dtype_;
    if (t.lower_precision_safe_modules) zero.lower_precision_safe_modules = *t.lower_precision_safe_modules;
  }
  {
    struct Hidden {  // back to requiring grad however the optimizer's construction ends
      std::vector<Tensor>& copies;
      ~Hidden() {
        for (Tensor& c : copies) c.requires_grad_(true);
      }
    } hidden{copies};
    for (Tensor& c : copies) c.requires_grad_(false);
    optimizer_ = std::make_unique<distributed::ZeroOptimizer>(model_, comm_, make_inner(*config_.optimizer), zero);
  }
  if (!tied_.empty() && zero.grad_accum_dtype && *zero.grad_accum_dtype != dtype_) {
    sum_tied_gradients(*zero.grad_accum_dtype);
  }
  if (config_.scheduler) scheduler_ = make_scheduler(*config_.scheduler, *optimizer_);
  if (config_.curriculum_learning.enabled) {
    curriculum_ = std::make_unique<CurriculumScheduler>(config_.curriculum_learning);
  }
  optim::GradScalerOptions scaling = config_.fp16.scaler;
  scaling.enabled = config_.fp16.enabled;
  if (autocast_dtype_ == kFloat16) {
    // DeepSpeed scales float16 autocast's loss with torch.amp.GradScaler: 2^16, halved at every
    // overflow (no hysteresis, no floor, no Error), doubled after 2000 steps without one.
    scaling = optim::GradScalerOptions{.loss_scale = 0, .initial_scale_power = 16, .loss_scale_window = 2000,
                                       .hysteresis = 1, .min_loss_scale = std::numeric_limits<float>::min(),
                                       .raise_error_at_min_scale = false, .enabled = true};
  }
  // An overflow on any rank, of any stage, skips the step on all.
  scaler_ = std::make_unique<distributed::ShardedGradScaler>(world_, scaling);
}

// The copies' gradients summed in `wide` (see tied_sums_); both stages of a tie exchange them so.
void Engine::sum_tied_gradients(DType wide) {
  for (const auto& t : tied_) {
    if (t.user != pipeline_comm_->rank()) continue;
    const bool listed = std::any_of(tied_sums_.begin(), tied_sums_.end(),
                                    [&](const auto& s) { return s->weight.is_same(t.weight); });
    if (listed) continue;  // one sum a copy, however many ties list it
    Tensor sum = zeros(t.weight.sizes(), TensorOptions(wide).device(t.weight.device()));
    auto s = std::make_unique<TiedSum>(t.weight, std::move(sum));
    if (t.weight.requires_grad()) {
      s->hook = t.weight.register_post_accumulate_grad_hook([s = s.get()](const Tensor& leaf) {
        if (!leaf.grad().defined()) return;
        NoGradGuard no_grad;
        s->sum.add_(leaf.grad().to(s->sum.dtype()));
        Tensor(leaf).set_grad(Tensor());
      });
    }
    tied_sums_.push_back(std::move(s));
  }
  auto take = [this](const distributed::TiedWeight& t) {
    for (auto& s : tied_sums_) {
      if (!s->weight.is_same(t.weight)) continue;
      Tensor sum = s->sum;
      s->sum = zeros_like(sum);  // the one sent stays as it is until its send is done
      Tensor w = t.weight;
      if (w.grad().defined()) {  // a copy without the hook (frozen when the engine was built)
        NoGradGuard no_grad;
        sum.add_(w.grad().to(sum.dtype()));
        w.set_grad(Tensor());
      }
      return sum;
    }
    KILN_FAIL("Engine: a tied weight's copy on stage {} has no sum of its gradients", t.user);  // every copy has one
  };
  auto add = [this](const distributed::TiedWeight& t, const Tensor& g) {
    if (t.weight.requires_grad()) optimizer_->add_to_gradient(t.weight, g);  // what the optimizer trains
  };
  tied_gradients_ = std::make_unique<distributed::TiedGradients>(distributed::TiedGradients{wide, take, add});
}

Engine::~Engine() = default;

Clock::time_point Engine::now() const {
  if (config_.wall_clock_breakdown && device_.is_cuda()) cuda::synchronize(device_.index);
  return Clock::now();
}
double Engine::seconds_since(Clock::time_point t0) const {
  return std::chrono::duration<double>(now() - t0).count();
}

std::pair<Tensor, Tensor> Engine::apply_curriculum(const Tensor& input, const Tensor& target, const char* who) {
  const int64_t len = curriculum_->update_difficulty(global_steps_ + 1);
  KILN_CHECK(!input.defined() || input.dim() >= 2, "{}: curriculum_learning's seqlen keeps the first positions of "
             "dim 1 of a (batch, sequence, ...) input, and this one has shape {}; remove the section, or pass "
             "sequences", who, input.sizes().str());
  auto cut = [len](const Tensor& t) { return t.defined() && t.dim() >= 2 && t.size(1) > len ? t.narrow(1, 0, len) : t; };
  return {cut(input), cut(target)};
}

std::optional<AutocastGuard> Engine::forward_autocast() const {
  if (!autocast_dtype_) return std::nullopt;
  return std::optional<AutocastGuard>(std::in_place, device_, autocast_dtype_);
}

Tensor Engine::forward(const Tensor& input) {
  KILN_CHECK(!pipeline_, "Engine.forward: a pipeline-parallel engine runs whole batches: call train_batch(input, "
             "target) (or eval_batch), as DeepSpeed's PipelineEngine");
  const auto t0 = now();
  Tensor x = input;
  // As DeepSpeed's: a training forward only (the module in training mode, gradients on).
  if (curriculum_ && model_.is_training() && GradMode::is_enabled()) {
    x = apply_curriculum(x, Tensor(), "Engine.forward").first;
  }
  if (config_.fp16.enabled && config_.fp16.auto_cast && x.is_floating_point()) x = x.to(kFloat16);
  // DeepSpeed's flops profiler: rank 0's first forward once profile_step steps have been taken.
  const bool profile = config_.flops_profiler.enabled && profiling_ == Profiling::kNotYet &&
                       global_steps_ == config_.flops_profiler.profile_step && world_->rank() == 0;
  if (profile) {
    flops_profiler_ = std::make_unique<nn::FlopsProfiler>(
        model_, [this](const Tensor& p) { return optimizer_->full_numel(p); });  // stage 3 drops them
    flops_profiler_->start_profile();
  }
  Tensor out;
  {
    const auto autocast = forward_autocast();
    out = model_(x);
  }
  if (profile) {
    flops_profiler_->stop_profile();
    profiling_ = Profiling::kForwardDone;
  }
  forward_s_ += seconds_since(t0);
  return out;
}

void Engine::backward(const Tensor& loss) {
  KILN_CHECK(loss.defined() && loss.numel() == 1,
             "Engine.backward: the loss must be a single element (reduce it, e.g. with mean()), not shape {}",
             loss.defined() ? loss.sizes().str() : "undefined");
  KILN_CHECK(!pipeline_, "Engine.backward: a pipeline-parallel engine runs whole batches: call train_batch(input, "
             "target), as DeepSpeed's PipelineEngine");
  const auto t0 = now();
  optimizer_->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
  Tensor scaled = loss;
  // The mean over the accumulated micro-batches, as one batch of gradient_accumulation_steps times
  // their size would give (DeepSpeed's scale_wrt_gas).
  if (batch_.gradient_accumulation_steps > 1) scaled = scaled / static_cast<double>(batch_.gradient_accumulation_steps);
  scaler_->scale(scaled).backward();
  backward_s_ += seconds_since(t0);
  // The monitors' train_loss: rank 0's micro-batch losses averaged over the step, written at its
  // boundary with the samples before the step (as DeepSpeed's backward writes it).
  if (monitor_) {
    NoGradGuard no_grad;
    const Tensor part = loss.detach().reshape({}).to(kFloat64) / static_cast<double>(batch_.gradient_accumulation_steps);
    monitor_loss_ = monitor_loss_.defined() ? monitor_loss_ + part : part;
    if (is_gradient_accumulation_boundary()) {
      monitor_->write_events({{"Train/Samples/train_loss", monitor_loss_.item<double>(), global_samples()}});
      monitor_loss_ = Tensor();
    }
  }
  if (profiling_ == Profiling::kForwardDone) {  // the profiled forward's backward, all its device work
    if (device_.is_cuda()) cuda::synchronize(device_.index);
    profiled_backward_s_ = std::chrono::duration<double>(Clock::now() - t0).count();
    profiling_ = Profiling::kBackwardDone;
  }
}

void Engine::step() {
  KILN_CHECK(!pipeline_, "Engine.step: a pipeline-parallel engine runs whole batches: call train_batch(input, "
             "target), which steps, as DeepSpeed's PipelineEngine");
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  if (boundary) optimizer_step();
}

Tensor Engine::train_batch(const Tensor& input, const Tensor& target) {
  KILN_CHECK(pipeline_, "Engine.train_batch: this engine has no pipeline; call forward, backward and step (or "
             "build it with a ParallelGrid and the stage's loss function)");
  // Checked on every rank that is given the tensor (the first stage reads the input, the last the
  // target), and agreed on by all, so that one rank's bad batch stops every rank.
  const int64_t rows = batch_.micro_batch_size * batch_.gradient_accumulation_steps;
  run_and_agree(*world_, true, "Engine.train_batch", "checking the batch's size", [&] {
    for (const auto& [t, what] : {std::pair{&input, "input"}, std::pair{&target, "target"}}) {
      KILN_CHECK(!t->defined() || (t->dim() >= 1 && t->size(0) == rows),
                 "Engine.train_batch: the {} has {} rows; a batch is train_micro_batch_size_per_gpu {} x "
                 "gradient_accumulation_steps {} = {} rows (per data-parallel rank)", what,
                 t->dim() >= 1 ? t->size(0) : 0, batch_.micro_batch_size, batch_.gradient_accumulation_steps, rows);
    }
  });
  Tensor x = input, y = target;
  if (curriculum_) std::tie(x, y) = apply_curriculum(x, y, "Engine.train_batch");  // the stages' input, the loss's target
  if (config_.fp16.enabled && config_.fp16.auto_cast && x.defined() && x.is_floating_point()) x = x.to(kFloat16);
  const double scale = scaler_->is_enabled() ? scaler_->get_scale() : 1.0;
  const auto t0 = now();
  Tensor loss;
  {
    // The stages' forwards under autocast; the autograd engine runs their backwards without it.
    const auto autocast = forward_autocast();
    loss = pipeline_->train_batch(x, y);  // the gradients are reduced during the last backward
  }
  if (!tied_.empty() || chunks_ > 1) {  // ... or now, with each tied weight's gradient from the other stage added
    if (!tied_.empty()) distributed::add_tied_gradients(tied_, *pipeline_comm_, tied_gradients_.get());
    optimizer_->reduce_gradients();
  }
  backward_s_ += seconds_since(t0);  // forward and backward, interleaved by the schedule
  micro_steps_ += batch_.gradient_accumulation_steps;
  optimizer_step();
  if (!tied_.empty()) distributed::copy_tied_weights(tied_, *pipeline_comm_);  // the owners' new weights
  // The mean over the data-parallel ranks of their batches' losses.
  Tensor mean = full({1}, loss.item<double>() / scale, TensorOptions(kFloat64).device(comm_->device()));
  if (comm_->size() > 1) {
    distributed::CommCaller caller("Engine.train_batch: the mean loss");
    comm_->all_reduce(mean, distributed::ReduceOp::Avg);
  }
  Tensor result = mean.reshape({}).to(Device::cpu(), kFloat32);
  // As DeepSpeed's PipelineEngine: the batch's loss, at the samples after the step.
  if (monitor_) monitor_->write_events({{"Train/Samples/train_loss", result.item<double>(), global_samples()}});
  return result;
}

Tensor Engine::eval_batch(const Tensor& input) {
  KILN_CHECK(pipeline_, "Engine.eval_batch: this engine has no pipeline; call the model (or forward)");
  Tensor x = input;
  if (config_.fp16.enabled && config_.fp16.auto_cast && x.defined() && x.is_floating_point()) x = x.to(kFloat16);
  const auto autocast = forward_autocast();
  return pipeline_->eval_batch(x);
}

void Engine::optimizer_step() {
  const auto t0 = now();
  scaler_->unscale_(*optimizer_);  // nothing without fp16; with it, an overflow anywhere is seen everywhere
  global_grad_norm_ = optimizer_->clip_grad_norm_(config_.gradient_clipping > 0 ? config_.gradient_clipping
                                                                                 : std::numeric_limits<double>::infinity(),
                                                  model_parallel(), counted_)
                          .item<double>();
  const bool stepped = scaler_->step(*optimizer_);
  scaler_->update();
  if (stepped && scheduler_) scheduler_->step();  // DeepSpeed does not advance the schedule on a skipped step
  optimizer_->zero_grad();
  ++global_steps_;
  const double seconds = seconds_since(t0);
  step_s_ += seconds;
  if (flops_profiler_ && profiling_ == Profiling::kBackwardDone) print_flops_profile(seconds);
  if (monitor_) write_step_events();
  if (global_steps_ % config_.steps_per_print == 0) report();
}

// DeepSpeed's events after a step, at the samples after it: the first group's lr, fp16's loss
// scale, and with wall_clock_breakdown each phase's milliseconds in this step (a pipeline
// interleaves forward and backward: their sum is the backward's).
void Engine::write_step_events() {
  const int64_t samples = global_samples();
  std::vector<MonitorEvent> events{{"Train/Samples/lr", get_lr().at(0), samples}};
  if (scaler_->is_enabled()) events.push_back({"Train/Samples/loss_scale", loss_scale(), samples});
  if (config_.wall_clock_breakdown) {
    if (!pipeline_) {
      events.push_back({"Train/Samples/elapsed_time_ms_forward", 1e3 * (forward_s_ - monitored_forward_s_), samples});
    }
    events.push_back({"Train/Samples/elapsed_time_ms_backward", 1e3 * (backward_s_ - monitored_backward_s_), samples});
    events.push_back({"Train/Samples/elapsed_time_ms_step", 1e3 * (step_s_ - monitored_step_s_), samples});
    monitored_forward_s_ = forward_s_;
    monitored_backward_s_ = backward_s_;
    monitored_step_s_ = step_s_;
  }
  monitor_->write_events(events);
}

void Engine::log_summary(bool show_straggler) {
  if (!comms_logger_) return;
  std::string text = comms_logger_->summary();
  if (show_straggler) {
    KILN_CHECK(!pipeline_, "Engine.log_summary: show_straggler compares each operation across the ranks, and a "
               "pipeline's stages send different messages; call log_summary() without it");
    text += comms_logger_->straggler_summary(*world_);
  }
  if (world_->rank() != 0) return;
  std::printf("%s", text.c_str());
  std::fflush(stdout);
}

void Engine::print_flops_profile(double step_s) {
  const Config::FlopsProfiler& f = config_.flops_profiler;
  const double fwd_s = flops_profiler_->get_total_duration(), bwd_s = profiled_backward_s_;
  const double flops = static_cast<double>(flops_profiler_->get_total_flops());
  auto line = [](const std::string& label, const std::string& value) {
    return fmt::format("{:<62}{}", label + ": ", value);
  };
  auto rate = [](double n, double s) { return s > 0 ? fmt::format("{:.2f} GFLOPS", n / s / 1e9) : std::string("-"); };
  const std::vector<std::string> extra = {
      line("bwd latency", fmt::format("{:.2f} ms", 1e3 * bwd_s)),
      line("bwd FLOPS per device = 2 * fwd flops per device / bwd latency", rate(2 * flops, bwd_s)),
      line(fmt::format("fwd+bwd FLOPS per device = {:g} * fwd flops per device / (fwd+bwd latency)",
                       3 + f.recompute_fwd_factor),
           rate((3 + f.recompute_fwd_factor) * flops, fwd_s + bwd_s)),
      line("step latency", fmt::format("{:.2f} ms", 1e3 * step_s)),
      line("iter latency", fmt::format("{:.2f} ms", 1e3 * (fwd_s + bwd_s + step_s))),
      line("world size", std::to_string(world_->size())),
      line("data parallel size", std::to_string(comm_->size())),
      line("batch size per device", std::to_string(batch_.micro_batch_size)),
  };
  flops_profiler_->print_model_profile(global_steps_, f.module_depth, f.top_modules, f.detailed, f.output_file, extra);
  flops_profiler_->end_profile();
  profiling_ = Profiling::kDone;
}

std::vector<double> Engine::get_lr() const {
  std::vector<double> lrs;
  for (const auto& g : optimizer_->param_groups()) lrs.push_back(g.lr());
  return lrs;
}

void Engine::report() {
  // memory_breakdown: each figure the largest over the ranks (a collective: every rank reports at
  // the same steps), for the model's device and, where that is a GPU, the host; then the peaks are
  // reset, as DeepSpeed's see_memory_usage does.
  std::vector<std::string> memory_lines;
  if (config_.memory_breakdown) {
    const Device device = model_.parameters().at(0).device();
    std::vector<Device> devices{device};
    if (!device.is_cpu()) devices.push_back(Device::cpu());
    for (const Device& d : devices) {
      const MemoryStats s = memory::stats(d);
      Tensor most = from_vector<double>({static_cast<double>(s.allocated_bytes),
                                         static_cast<double>(s.peak_allocated_bytes),
                                         static_cast<double>(s.reserved_bytes)})
                        .to(world_->device());
      world_->all_reduce(most, distributed::ReduceOp::Max);
      memory::reset_peak(d);
      const std::vector<double> mib = most.to_vector<double>();
      memory_lines.push_back(fmt::format(
          "[kiln] memory on {} (MiB{}): allocated {:.2f} | peak {:.2f} since the last print | reserved {:.2f}",
          d.str(), world_->size() > 1 ? fmt::format(", the largest over {} ranks", world_->size()) : "",
          mib[0] / (1 << 20), mib[1] / (1 << 20), mib[2] / (1 << 20)));
    }
  }
  if (world_->rank() == 0) {
    std::string lrs;
    for (double lr : get_lr()) lrs += fmt::format("{}{:.6g}", lrs.empty() ? "" : ", ", lr);
    std::printf("[kiln] step=%lld, skipped=%lld, lr=[%s], loss_scale=%g, grad_norm=%.4g\n",
                static_cast<long long>(global_steps_), static_cast<long long>(skipped_steps()), lrs.c_str(),
                loss_scale(), global_grad_norm_);
    if (config_.wall_clock_breakdown) {
      const double n = static_cast<double>(config_.steps_per_print);
      if (pipeline_) {  // the pipeline interleaves the two
        std::printf("[kiln] time per step (ms, mean of %lld): forward+backward %.2f | step %.2f\n",
                    static_cast<long long>(config_.steps_per_print), 1e3 * backward_s_ / n, 1e3 * step_s_ / n);
      } else {
        std::printf("[kiln] time per step (ms, mean of %lld): forward %.2f | backward %.2f | step %.2f\n",
                    static_cast<long long>(config_.steps_per_print), 1e3 * forward_s_ / n, 1e3 * backward_s_ / n,
                    1e3 * step_s_ / n);
      }
    }
    for (const std::string& line : memory_lines) std::printf("%s\n", line.c_str());
    // activation_checkpointing's "profile": this rank's blocks (DeepSpeed logs each block's times on
    // rank 0 as it runs; here they are summed over the steps since the last print).
    if (const auto& keeping = config_.activation_checkpointing; keeping && keeping->profile) {
      const autograd::CheckpointProfile& p = *keeping->profile;
      const double n = static_cast<double>(config_.steps_per_print);
      std::printf("[kiln] checkpointed blocks (ms per step, mean of %lld; %.4g forwards and %.4g backwards a step): "
                  "forward %.2f | recompute %.2f | backward %.2f\n",
                  static_cast<long long>(config_.steps_per_print), static_cast<double>(p.forwards) / n,
                  static_cast<double>(p.backwards) / n, 1e3 * p.forward_s / n, 1e3 * p.recompute_s / n,
                  1e3 * p.backward_s / n);
    }
    std::fflush(stdout);
  }
  forward_s_ = backward_s_ = step_s_ = 0;
  monitored_forward_s_ = monitored_backward_s_ = monitored_step_s_ = 0;
  if (const auto& keeping = config_.activation_checkpointing; keeping && keeping->profile) *keeping->profile = {};
}

// ---- checkpoints ----

void Engine::save_checkpoint(const std::string& dir, const std::string& tag_in) {
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", global_steps_) : tag_in;
  // DeepSpeed's checkpoint.tag_validation: the ranks compare their tags (one all-reduce of a hash).
  if (config_.checkpoint_tag_validation != "ignore" && !distributed::same_on_every_rank(*world_, tag)) {
    const std::string why = fmt::format(
        "save_checkpoint: the checkpoint tag '{}' (rank {}) is not the same on every rank; pass one tag on every "
        "rank (a tag that names the rank breaks the checkpoint's folder, and a load at another world size)",
        tag, world_->rank());
    KILN_CHECK(config_.checkpoint_tag_validation != "fail", "{} (\"checkpoint\": {{\"tag_validation\": \"Fail\"}})",
               why);
    std::fprintf(stderr, "[kiln] warning: %s\n", why.c_str());
  }
  KILN_CHECK(tag.find('/') == std::string::npos && tag != "." && tag != "..",
             "save_checkpoint: the tag '{}' must be a plain name, not a path", tag);
  // Each step is agreed on by every rank (run_and_agree), so that a rank that cannot write stops
  // them all with its Error.
  const std::filesystem::path folder = stage_folder(dir, tag);
  const std::string in_folder = fmt::format("writing into '{}'", folder.string());
  run_and_agree(*world_, comm_->rank() == 0, "save_checkpoint", in_folder, [&] {
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    KILN_CHECK(!ec, "save_checkpoint: cannot create '{}': {}", folder.string(), ec.message());
  });
  run_and_agree(*world_, true, "save_checkpoint", in_folder, [&] {
    safetensors::save_file(optimizer_->state_dict(),
                           (folder / fmt::format("zero_rank_{}.safetensors", comm_->rank())).string());
  });
  const TensorDict model_state = optimizer_->consolidated_state_dict();  // on rank 0; stage 3: every rank gathers
  run_and_agree(*world_, comm_->rank() == 0, "save_checkpoint", in_folder, [&] {
    safetensors::save_file(model_state, (folder / "model.safetensors").string());
    TensorDict engine_state;
    engine_state.insert("global_steps", scalar_tensor(global_steps_, kInt64));
    for (const auto& [key, t] : scaler_->state_dict()) engine_state.insert("scaler." + key, t);
    if (scheduler_) {
      for (const auto& [key, t] : scheduler_->state_dict()) engine_state.insert("scheduler." + key, t);
    }
    safetensors::save_file(engine_state, (folder / "engine.safetensors").string(),
                           {{"world_size", std::to_string(comm_->size())},
                            {"zero_stage", std::to_string(optimizer_->stage())},
                            {"pipeline_stages", std::to_string(pipeline_ ? pipeline_->num_stages() : 1)},
                            {"pipeline_chunks", std::to_string(chunks_)},
                            {"tensor_parallel", std::to_string(tensor_comm_ ? tensor_comm_->size() : 1)}});
  });
  // Every shard (of every stage) is on disk before `latest` names this checkpoint.
  const std::string latest = (std::filesystem::path(dir) / "latest").string();
  run_and_agree(*world_, world_->rank() == 0, "save_checkpoint", fmt::format("writing '{}'", latest),
                [&] { write_text_atomically(latest, tag); });
}

std::string Engine::stage_folder(const std::string& dir, const std::string& tag) const {
  std::filesystem::path folder = std::filesystem::path(dir) / tag;
  if (pipeline_) folder /= fmt::format("stage_{}", pipeline_->stage_id());
  if (tensor_comm_ && tensor_comm_->size() > 1) folder /= fmt::format("tensor_{}", tensor_comm_->rank());
  return folder.string();
}

std::vector<distributed::Communicator*> Engine::model_parallel() const {
  std::vector<distributed::Communicator*> comms;
  for (const auto& c : {tensor_comm_, pipeline_comm_}) {
    if (c && c->size() > 1) comms.push_back(c.get());
  }
  return comms;
}

bool Engine::save_16bit_model(const std::string& save_dir, const std::string& save_filename,
                              bool exclude_frozen_parameters) {
  const std::filesystem::path name(save_filename);
  KILN_CHECK(!save_filename.empty() && name.filename() == name && name.extension() == ".safetensors",
             "save_16bit_model: the file name '{}' must be a plain name ending in .safetensors, such as "
             "model.safetensors (Kiln writes safetensors, not DeepSpeed's pickled pytorch_model.bin)",
             save_filename);
  // With a pipeline, each stage's own layers, in save_dir/stage_<s>/ (and each slice in tensor_<t>/).
  const std::string folder = pipeline_ ? stage_folder(save_dir, "") : save_dir;
  const std::string path = (std::filesystem::path(folder) / name).string();
  if (optimizer_->stage() == 3 && !config_.zero_optimization.stage3_gather_16bit_weights_on_model_save) {
    if (comm_->rank() == 0) {
      std::fprintf(stderr, "[kiln] save_16bit_model: did not save %s: at ZeRO stage 3 each rank holds a shard of "
                   "the weights; set \"stage3_gather_16bit_weights_on_model_save\": true in \"zero_optimization\" "
                   "to gather them on rank 0 and save, or save_checkpoint to save the shards\n", path.c_str());
    }
    return false;
  }
  const TensorDict state = optimizer_->consolidated_state_dict(0, exclude_frozen_parameters);
  run_and_agree(*world_, comm_->rank() == 0, "save_16bit_model", fmt::format("writing '{}'", path), [&] {
    std::error_code ec;
    std::filesystem::create_directories(folder.empty() ? "." : folder, ec);
    KILN_CHECK(!ec, "save_16bit_model: cannot create '{}': {}", folder, ec.message());
    // Hugging Face's loaders ask for the format of a safetensors file's tensors.
    safetensors::save_file(state, path, {{"format", "pt"}});
  });
  return true;
}

// What load_checkpoint reads from this stage's folder before it changes anything.
struct Engine::StageFiles {
  std::string tag;
  TensorDict untrained;              // the model's buffers and frozen parameters
  std::vector<TensorDict> shards;    // zero_rank_<r>.safetensors of every rank that saved
  TensorDict engine_state;
};

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag_in) {
  // The ranks agree on each phase's outcome, so that a rank that cannot load (a folder missing,
  // another model) stops every rank with its Error instead of leaving the others waiting for it.
  // Reading takes no collective, so a rank given a path the others were not fails alone there,
  // and the communicator stays in step; loading what was read may gather (ZeRO stage 3, the tied
  // weights) and fails alike on every rank, as the model is the same on all of them.
  StageFiles files;
  run_and_agree(*world_, true, "load_checkpoint", "reading this stage's checkpoint",
                [&] { files = read_stage(dir, tag_in); });
  run_and_agree(*world_, true, "load_checkpoint", "loading this stage's checkpoint", [&] { load_stage(files); });
  // A tied weight's copy is not trained here: it is the owner's, loaded above.
  if (!tied_.empty()) distributed::copy_tied_weights(tied_, *pipeline_comm_);
  return files.tag;
}

Engine::StageFiles Engine::read_stage(const std::string& dir, const std::string& tag_in) const {
  StageFiles files;
  std::string& tag = files.tag;
  tag = tag_in;
  if (tag.empty()) {
    std::ifstream in(std::filesystem::path(dir) / "latest");
    KILN_CHECK(in.good(), "load_checkpoint: '{}/latest' does not exist; is '{}' a checkpoint directory written by "
               "save_checkpoint? (or pass the tag)", dir, dir);
    std::getline(in, tag);
  }
  const std::filesystem::path folder = stage_folder(dir, tag);
  const std::string engine_file = (folder / "engine.safetensors").string();
  KILN_CHECK(std::filesystem::exists(engine_file), "load_checkpoint: '{}' has no engine.safetensors; it is not a "
             "checkpoint written by save_checkpoint{}", folder.string(),
             pipeline_ ? " with as many pipeline stages as this engine has" : "");
  const auto meta = safetensors::load_metadata(engine_file);
  KILN_CHECK(meta.count("world_size") != 0, "load_checkpoint: '{}' has no world_size in its metadata", engine_file);
  const int stages = meta.count("pipeline_stages") ? std::stoi(meta.at("pipeline_stages")) : 1;
  const int slices = meta.count("tensor_parallel") ? std::stoi(meta.at("tensor_parallel")) : 1;
  const int64_t chunks = meta.count("pipeline_chunks") ? std::stoll(meta.at("pipeline_chunks")) : 1;
  const int my_stages = pipeline_ ? pipeline_->num_stages() : 1, my_slices = tensor_comm_ ? tensor_comm_->size() : 1;
  KILN_CHECK(stages == my_stages && slices == my_slices && chunks == chunks_,
             "load_checkpoint: '{}' was saved by {} pipeline stage(s) of {} chunk(s) x {} tensor-parallel rank(s), and "
             "this engine has {} of {} x {}; load it with as many (each holds its own layers and slices)", engine_file,
             stages, chunks, slices, my_stages, chunks_, my_slices);
  const int old_world = std::stoi(meta.at("world_size"));
  // The model's buffers and frozen parameters; the trainable weights come from the optimizer's
  // float32 masters (at stage 3 the parameters hold nothing to load into).
  const TensorDict model_state = safetensors::load_file((folder / "model.safetensors").string());
  std::vector<std::string> trainable;
  for (const auto& [name, p] : model_.named_parameters())
    if (p.requires_grad()) trainable.push_back(name);
  const TensorDict current = model_.state_dict();
  for (const auto& [name, t] : model_state) {
    if (std::find(trainable.begin(), trainable.end(), name) != trainable.end()) continue;
    KILN_CHECK(current.find(name) != nullptr, "load_checkpoint: the checkpoint has '{}', which this model does not",
               name);
    files.untrained.insert(name, t);
  }
  for (int r = 0; r < old_world; ++r) {
    files.shards.push_back(safetensors::load_file((folder / fmt::format("zero_rank_{}.safetensors", r)).string()));
  }
  files.engine_state = safetensors::load_file(engine_file);
  KILN_CHECK(files.engine_state.find("global_steps") != nullptr, "load_checkpoint: '{}' has no global_steps; the "
             "checkpoint is damaged", engine_file);
  return files;
}

void Engine::load_stage(StageFiles& files) {
  {
    NoGradGuard no_grad;
    const TensorDict current = model_.state_dict();
    for (const auto& [name, t] : files.untrained) Tensor(*current.find(name)).copy_(t);
  }
  optimizer_->load_sharded_state_dict(files.shards);
  TensorDict scaler_state, scheduler_state;
  for (const auto& [key, t] : files.engine_state) {
    if (key.rfind("scaler.", 0) == 0) scaler_state.insert(key.substr(7), t);
    if (key.rfind("scheduler.", 0) == 0) scheduler_state.insert(key.substr(10), t);
  }
  global_steps_ = files.engine_state.at("global_steps").item<int64_t>();
  // At an accumulation boundary, whatever the accumulation was then: at another world size the same
  // train_batch_size may mean another gradient_accumulation_steps (and the gradients of a part-done
  // accumulation were not saved).
  micro_steps_ = global_steps_ * batch_.gradient_accumulation_steps;
  if (!scaler_state.empty()) scaler_->load_state_dict(scaler_state);
  KILN_CHECK(scheduler_state.empty() == (scheduler_ == nullptr),
             "load_checkpoint: the checkpoint was saved {} a scheduler but this engine has {}; use the same "
             "\"scheduler\" section", scheduler_state.empty() ? "without" : "with", scheduler_ ? "one" : "none");
  if (scheduler_) scheduler_->load_state_dict(scheduler_state);
  optimizer_->zero_grad();
}

Engine initialize(nn::Module& model, const Config& config, std::shared_ptr<distributed::Communicator> comm) {
  return Engine(model, config, std::move(comm));
}

Engine initialize(nn::Module& stage, const Config& config, const distributed::ParallelGrid& grid,
                  distributed::Pipeline::LossFn loss_fn) {
  return Engine(stage, config, grid, std::move(loss_fn));
}

Engine initialize(std::vector<nn::Module*> chunks, const Config& config, const distributed::ParallelGrid& grid,
                  distributed::Pipeline::LossFn loss_fn) {
  return Engine(std::move(chunks), config, grid, std::move(loss_fn));
}

}  // namespace kiln

// distributed/engine/engine.cpp: the DeepSpeed-style engine (see engine.h): what a config turns on,
// applied around one ZeroOptimizer.
#include "distributed/engine/engine.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>

#include "core/grad_mode.h"
#include "data/safetensors.h"
#include "ops/ops.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs `write` on rank 0 and tells every rank how it went: when it fails, rank 0 throws its Error
// and the other ranks one that points to it, instead of going on to wait for rank 0.
void write_on_rank0(distributed::Communicator& comm, const char* who, const std::string& what,
                    const std::function<void()>& write) {
  std::exception_ptr failure;
  if (comm.rank() == 0) {
    try {
      write();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  Tensor ok = from_vector<int32_t>({failure ? 0 : 1}).to(comm.device());
  comm.broadcast(ok, 0);
  if (failure) std::rethrow_exception(failure);
  KILN_CHECK(ok.item<int32_t>() == 1, "{}: rank 0 could not write '{}'; its Error says why", who, what);
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

}  // namespace

Engine::Engine(nn::Module& model, const Config& config, std::shared_ptr<distributed::Communicator> comm)
    : model_(model), config_(config), comm_(comm ? std::move(comm) : default_comm(model)) {
  batch_ = config_.resolve_batch(comm_->size());
  KILN_CHECK(config_.optimizer.has_value(),
             "Engine: the config has no \"optimizer\" section; add one, e.g. \"optimizer\": {{\"type\": \"AdamW\", "
             "\"params\": {{\"lr\": 1e-3}}}}");
  // DeepSpeed converts the module itself: weights, activations and gradients in 16 bits.
  if (config_.fp16.enabled) model_.to(kFloat16);
  if (config_.bf16.enabled) model_.to(kBFloat16);
  const auto params = model_.parameters();
  KILN_CHECK(!params.empty(), "Engine: the model has no parameters");
  dtype_ = params[0].dtype();
  optimizer_ = std::make_unique<distributed::ZeroOptimizer>(model_, comm_, make_inner(*config_.optimizer),
                                                            config_.zero_optimization);
  if (config_.scheduler) scheduler_ = make_scheduler(*config_.scheduler, *optimizer_);
  optim::GradScalerOptions scaling = config_.fp16.scaler;
  scaling.enabled = config_.fp16.enabled;
  scaler_ = std::make_unique<distributed::ShardedGradScaler>(comm_, scaling);
}

Engine::~Engine() = default;

Tensor Engine::forward(const Tensor& input) {
  const auto t0 = Clock::now();
  Tensor x = input;
  if (config_.fp16.enabled && config_.fp16.auto_cast && x.is_floating_point()) x = x.to(kFloat16);
  Tensor out = model_(x);
  forward_s_ += seconds_since(t0);
  return out;
}

void Engine::backward(const Tensor& loss) {
  KILN_CHECK(loss.defined() && loss.numel() == 1,
             "Engine.backward: the loss must be a single element (reduce it, e.g. with mean()), not shape {}",
             loss.defined() ? loss.sizes().str() : "undefined");
  const auto t0 = Clock::now();
  optimizer_->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
  Tensor scaled = loss;
  // The mean over the accumulated micro-batches, as one batch of gradient_accumulation_steps times
  // their size would give (DeepSpeed's scale_wrt_gas).
  if (batch_.gradient_accumulation_steps > 1) scaled = scaled / static_cast<double>(batch_.gradient_accumulation_steps);
  scaler_->scale(scaled).backward();
  backward_s_ += seconds_since(t0);
}

void Engine::step() {
  const auto t0 = Clock::now();
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  if (!boundary) return;
  scaler_->unscale_(*optimizer_);  // nothing without fp16; with it, an overflow anywhere is seen everywhere
  global_grad_norm_ = optimizer_->clip_grad_norm_(config_.gradient_clipping > 0 ? config_.gradient_clipping
                                                                                 : std::numeric_limits<double>::infinity())
                          .item<double>();
  const bool stepped = scaler_->step(*optimizer_);
  scaler_->update();
  if (stepped && scheduler_) scheduler_->step();  // DeepSpeed does not advance the schedule on a skipped step
  optimizer_->zero_grad();
  ++global_steps_;
  step_s_ += seconds_since(t0);
  if (global_steps_ % config_.steps_per_print == 0) report();
}

std::vector<double> Engine::get_lr() const {
  std::vector<double> lrs;
  for (const auto& g : optimizer_->param_groups()) lrs.push_back(g.lr());
  return lrs;
}

void Engine::report() {
  if (comm_->rank() == 0) {
    std::string lrs;
    for (double lr : get_lr()) lrs += fmt::format("{}{:.6g}", lrs.empty() ? "" : ", ", lr);
    std::printf("[kiln] step=%lld, skipped=%lld, lr=[%s], loss_scale=%g, grad_norm=%.4g\n",
                static_cast<long long>(global_steps_), static_cast<long long>(skipped_steps()), lrs.c_str(),
                loss_scale(), global_grad_norm_);
    if (config_.wall_clock_breakdown) {
      const double n = static_cast<double>(config_.steps_per_print);
      std::printf("[kiln] time per step (ms, mean of %lld): forward %.2f | backward %.2f | step %.2f\n",
                  static_cast<long long>(config_.steps_per_print), 1e3 * forward_s_ / n, 1e3 * backward_s_ / n,
                  1e3 * step_s_ / n);
    }
    std::fflush(stdout);
  }
  forward_s_ = backward_s_ = step_s_ = 0;
}

// ---- checkpoints ----

void Engine::save_checkpoint(const std::string& dir, const std::string& tag_in) {
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", global_steps_) : tag_in;
  KILN_CHECK(tag.find('/') == std::string::npos && tag != "." && tag != "..",
             "save_checkpoint: the tag '{}' must be a plain name, not a path", tag);
  const std::filesystem::path folder = std::filesystem::path(dir) / tag;
  if (comm_->rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    KILN_CHECK(!ec, "save_checkpoint: cannot create '{}': {}", folder.string(), ec.message());
  }
  comm_->barrier();
  safetensors::save_file(optimizer_->state_dict(), (folder / fmt::format("zero_rank_{}.safetensors", comm_->rank())).string());
  const TensorDict model_state = optimizer_->consolidated_state_dict();  // on rank 0; stage 3: every rank gathers
  write_on_rank0(*comm_, "save_checkpoint", folder.string(), [&] {
    safetensors::save_file(model_state, (folder / "model.safetensors").string());
    TensorDict engine_state;
    engine_state.insert("global_steps", scalar_tensor(global_steps_, kInt64));
    for (const auto& [key, t] : scaler_->state_dict()) engine_state.insert("scaler." + key, t);
    if (scheduler_) {
      for (const auto& [key, t] : scheduler_->state_dict()) engine_state.insert("scheduler." + key, t);
    }
    safetensors::save_file(engine_state, (folder / "engine.safetensors").string(),
                           {{"world_size", std::to_string(comm_->size())},
                            {"zero_stage", std::to_string(optimizer_->stage())}});
  });
  comm_->barrier();  // every shard is on disk before `latest` names this checkpoint
  if (comm_->rank() == 0) write_text_atomically((std::filesystem::path(dir) / "latest").string(), tag);
  comm_->barrier();
}

bool Engine::save_16bit_model(const std::string& save_dir, const std::string& save_filename,
                              bool exclude_frozen_parameters) {
  const std::filesystem::path name(save_filename);
  KILN_CHECK(!save_filename.empty() && name.filename() == name && name.extension() == ".safetensors",
             "save_16bit_model: the file name '{}' must be a plain name ending in .safetensors, such as "
             "model.safetensors (Kiln writes safetensors, not DeepSpeed's pickled pytorch_model.bin)",
             save_filename);
  const std::string path = (std::filesystem::path(save_dir) / name).string();
  if (optimizer_->stage() == 3 && !config_.zero_optimization.stage3_gather_16bit_weights_on_model_save) {
    if (comm_->rank() == 0) {
      std::fprintf(stderr, "[kiln] save_16bit_model: did not save %s: at ZeRO stage 3 each rank holds a shard of "
                   "the weights; set \"stage3_gather_16bit_weights_on_model_save\": true in \"zero_optimization\" "
                   "to gather them on rank 0 and save, or save_checkpoint to save the shards\n", path.c_str());
    }
    return false;
  }
  const TensorDict state = optimizer_->consolidated_state_dict(0, exclude_frozen_parameters);
  write_on_rank0(*comm_, "save_16bit_model", path, [&] {
    std::error_code ec;
    std::filesystem::create_directories(save_dir.empty() ? "." : save_dir, ec);
    KILN_CHECK(!ec, "save_16bit_model: cannot create '{}': {}", save_dir, ec.message());
    // Hugging Face's loaders ask for the format of a safetensors file's tensors.
    safetensors::save_file(state, path, {{"format", "pt"}});
  });
  return true;
}

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag_in) {
  std::string tag = tag_in;
  if (tag.empty()) {
    std::ifstream in(std::filesystem::path(dir) / "latest");
    KILN_CHECK(in.good(), "load_checkpoint: '{}/latest' does not exist; is '{}' a checkpoint directory written by "
               "save_checkpoint? (or pass the tag)", dir, dir);
    std::getline(in, tag);
  }
  const std::filesystem::path folder = std::filesystem::path(dir) / tag;
  const std::string engine_file = (folder / "engine.safetensors").string();
  KILN_CHECK(std::filesystem::exists(engine_file), "load_checkpoint: '{}' has no engine.safetensors; it is not a "
             "checkpoint written by save_checkpoint", folder.string());
  const auto meta = safetensors::load_metadata(engine_file);
  KILN_CHECK(meta.count("world_size") != 0, "load_checkpoint: '{}' has no world_size in its metadata", engine_file);
  const int old_world = std::stoi(meta.at("world_size"));
  // The model's buffers and frozen parameters; the trainable weights come from the optimizer's
  // float32 masters below (at stage 3 the parameters hold nothing to load into).
  TensorDict model_state = safetensors::load_file((folder / "model.safetensors").string());
  TensorDict untrained;
  std::vector<std::string> trainable;
  for (const auto& [name, p] : model_.named_parameters())
    if (p.requires_grad()) trainable.push_back(name);
  for (const auto& [name, t] : model_state) {
    if (std::find(trainable.begin(), trainable.end(), name) == trainable.end()) untrained.insert(name, t);
  }
  {
    NoGradGuard no_grad;
    const TensorDict current = model_.state_dict();
    for (const auto& [name, t] : untrained) {
      const Tensor* dst = current.find(name);
      KILN_CHECK(dst != nullptr, "load_checkpoint: the checkpoint has '{}', which this model does not", name);
      Tensor(*dst).copy_(t);
    }
  }
  std::vector<TensorDict> shards;
  for (int r = 0; r < old_world; ++r) {
    shards.push_back(safetensors::load_file((folder / fmt::format("zero_rank_{}.safetensors", r)).string()));
  }
  optimizer_->load_sharded_state_dict(shards);
  const TensorDict engine_state = safetensors::load_file(engine_file);
  TensorDict scaler_state, scheduler_state;
  for (const auto& [key, t] : engine_state) {
    if (key.rfind("scaler.", 0) == 0) scaler_state.insert(key.substr(7), t);
    if (key.rfind("scheduler.", 0) == 0) scheduler_state.insert(key.substr(10), t);
  }
  global_steps_ = engine_state.at("global_steps").item<int64_t>();
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
  return tag;
}

Engine initialize(nn::Module& model, const Config& config, std::shared_ptr<distributed::Communicator> comm) {
  return Engine(model, config, std::move(comm));
}

}  // namespace kiln

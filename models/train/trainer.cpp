// models/train/trainer.cpp: see trainer.h.
#include "models/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include <unistd.h>

#include <kiln/kiln.h>

#include "models/train/checkpoint.h"
#include "models/train/progress.h"
#include "models/vision.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::vector<std::string> Choices::model = models::vision_model_names();
const std::vector<std::string> Choices::dataset = {"fashion-mnist", "synthetic"};
const std::vector<std::string> Choices::optimizer = {"sgd", "adam", "adamw", "rmsprop", "adagrad"};
const std::vector<std::string> Choices::scheduler = {"none", "step", "cosine", "onecycle", "warmup-cosine",
                                                     "plateau"};

namespace {

// The settings a checkpoint fixes: a resumed run takes these from the checkpoint.
json config_of(const TrainOptions& o) {
  return {{"model", o.model},         {"dataset", o.dataset},     {"data_root", o.data_root},
          {"batch_size", o.batch_size}, {"optimizer", o.optimizer}, {"lr", o.lr},
          {"momentum", o.momentum},   {"weight_decay", o.weight_decay}, {"scheduler", o.scheduler},
          {"seed", o.seed},           {"limit_train", o.limit_train}, {"limit_test", o.limit_test},
          {"total_epochs", o.epochs},
          // As JSON, so that a resumed run compares configs, not their spacing.
          {"deepspeed_config", o.deepspeed_config.empty() ? json(nullptr) : json::parse(o.deepspeed_config)}};
}

void apply_config(const json& c, TrainOptions& o) {
  try {
    o.model = c.at("model").get<std::string>();
    o.dataset = c.at("dataset").get<std::string>();
    o.data_root = c.at("data_root").get<std::string>();
    o.batch_size = c.at("batch_size").get<int64_t>();
    o.optimizer = c.at("optimizer").get<std::string>();
    // JSON has no NaN: nlohmann writes it as null, meaning "the optimizer's default".
    auto number = [&](const char* key) {
      return c.at(key).is_null() ? std::nan("") : c.at(key).get<double>();
    };
    o.lr = number("lr");
    o.momentum = number("momentum");
    o.weight_decay = number("weight_decay");
    o.scheduler = c.at("scheduler").get<std::string>();
    o.seed = c.at("seed").get<uint64_t>();
    o.limit_train = c.at("limit_train").get<int64_t>();
    o.limit_test = c.at("limit_test").get<int64_t>();
    if (o.epochs == 0) o.epochs = c.value("total_epochs", int64_t{1});
    const json ds = c.value("deepspeed_config", json(nullptr));  // absent from older checkpoints
    o.deepspeed_config = ds.is_null() ? std::string() : ds.dump();
  } catch (const json::exception& e) {
    KILN_FAIL("the checkpoint's configuration is incomplete ({}): was it written by kiln-train?", e.what());
  }
}

void check_options(const TrainOptions& o) {
  auto one_of = [](const char* flag, const std::string& v, const std::vector<std::string>& choices) {
    for (const std::string& c : choices) {
      if (v == c) return;
    }
    KILN_FAIL("--{} must be one of {}, not '{}'", flag, fmt::format("{}", fmt::join(choices, ", ")), v);
  };
  one_of("model", o.model, Choices::model);
  one_of("dataset", o.dataset, Choices::dataset);
  one_of("optimizer", o.optimizer, Choices::optimizer);
  one_of("scheduler", o.scheduler, Choices::scheduler);
  KILN_CHECK(o.epochs >= 1, "--epochs must be at least 1, not {}", o.epochs);
  KILN_CHECK(o.batch_size >= 1, "--batch-size must be at least 1, not {}", o.batch_size);
  KILN_CHECK(o.threads >= 0, "--threads must be 0 (every core) or more, not {}", o.threads);
  KILN_CHECK(o.num_workers >= 0, "--workers must be 0 or more, not {}", o.num_workers);
  KILN_CHECK(std::isnan(o.lr) || o.lr > 0, "--lr must be positive, not {}", o.lr);
  KILN_CHECK(std::isnan(o.momentum) || o.optimizer == "sgd" || o.optimizer == "rmsprop",
             "--momentum applies to sgd and rmsprop, not to {} (in adam and adamw, beta1 plays its part)", o.optimizer);
  KILN_CHECK(o.log_every >= 1, "log_every must be at least 1, not {}", o.log_every);
  KILN_CHECK(o.limit_train >= 0 && o.limit_test >= 0 && o.max_steps >= 0,
             "--limit-train, --limit-test and --max-steps must be 0 (no limit) or more");
  if (!o.deepspeed_config.empty()) {
    for (const char* f : {"batch-size", "optimizer", "lr", "momentum", "weight-decay", "scheduler"}) {
      KILN_CHECK(std::find(o.given.begin(), o.given.end(), f) == o.given.end(),
                 "--{} and a DeepSpeed config are both given (--deepspeed-config, or the one the resumed checkpoint "
                 "was trained with); the config sets it (DeepSpeed's train_micro_batch_size_per_gpu, "
                 "gradient_accumulation_steps, \"optimizer\", \"scheduler\"): drop --{}", f, f);
    }
  }
}

// The first `limit` samples of `ds` (all when limit is 0 or too large).
std::shared_ptr<const data::Dataset> first(std::shared_ptr<const data::Dataset> ds, int64_t begin,
                                           int64_t limit) {
  const int64_t n = limit > 0 ? std::min(limit, ds->size() - begin) : ds->size() - begin;
  if (begin == 0 && n == ds->size()) return ds;
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = begin + i;
  return std::make_shared<data::Subset>(std::move(ds), std::move(indices));
}

struct Data {
  std::shared_ptr<const data::Dataset> train, test;
};

Data make_data(const TrainOptions& o) {
  if (o.dataset == "fashion-mnist") {
    try {
      return {first(std::make_shared<data::FashionMNIST>(data::FashionMNIST::train(o.data_root)), 0, o.limit_train),
              first(std::make_shared<data::FashionMNIST>(data::FashionMNIST::test(o.data_root)), 0, o.limit_test)};
    } catch (const Error& e) {
      KILN_FAIL("{} (or train on --dataset synthetic, which needs no files)", e.what());
    }
  }
  // Synthetic: one set of class patterns; the test samples are the ones after the training samples.
  const int64_t n_train = o.limit_train > 0 ? o.limit_train : 12000;
  const int64_t n_test = o.limit_test > 0 ? o.limit_test : 2000;
  // The samples are made as they are read, but their index tables are not: 8 bytes a sample for
  // the subsets, and 8 more a training sample for the shuffled order.
  check_fits_in_memory(16.0L * n_train + 8.0L * n_test,
                       fmt::format("{} synthetic training and {} test samples' index tables", n_train, n_test),
                       "choose a smaller --limit-train or --limit-test");
  auto all = std::make_shared<data::SyntheticImages>(n_train + n_test, Shape{1, 28, 28}, 10, o.seed);
  return {first(all, 0, n_train), first(all, n_train, n_test)};
}

double default_lr(const TrainOptions& o) {
  if (!std::isnan(o.lr)) return o.lr;
  return o.optimizer == "sgd" ? 0.05 : o.optimizer == "rmsprop" || o.optimizer == "adagrad" ? 1e-2 : 1e-3;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<Tensor> params) {
  const double lr = default_lr(o);
  auto or_default = [](double v, double d) { return std::isnan(v) ? d : v; };
  if (o.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(std::move(params),
        optim::SGDOptions{.lr = lr, .momentum = or_default(o.momentum, 0.9),
                          .weight_decay = or_default(o.weight_decay, 0)});
  }
  if (o.optimizer == "adam") {
    return std::make_unique<optim::Adam>(std::move(params),
        optim::AdamOptions{.lr = lr, .weight_decay = or_default(o.weight_decay, 0)});
  }
  if (o.optimizer == "adamw") {
    return std::make_unique<optim::AdamW>(std::move(params),
        optim::AdamWOptions{.lr = lr, .weight_decay = or_default(o.weight_decay, 1e-2)});
  }
  if (o.optimizer == "rmsprop") {
    return std::make_unique<optim::RMSprop>(std::move(params),
        optim::RMSpropOptions{.lr = lr, .weight_decay = or_default(o.weight_decay, 0),
                              .momentum = or_default(o.momentum, 0)});
  }
  return std::make_unique<optim::Adagrad>(std::move(params),
      optim::AdagradOptions{.lr = lr, .weight_decay = or_default(o.weight_decay, 0)});
}

// Schedules advance once per batch over the whole run.
std::unique_ptr<optim::LRScheduler> make_scheduler(const TrainOptions& o, optim::Optimizer& opt,
                                                   int64_t steps_per_epoch, int64_t total_steps) {
  if (o.scheduler == "step") return std::make_unique<optim::StepLR>(opt, steps_per_epoch, 0.5);
  if (o.scheduler == "cosine") return std::make_unique<optim::CosineAnnealingLR>(opt, total_steps);
  if (o.scheduler == "onecycle") {
    // Adagrad has no momentum to cycle.
    return std::make_unique<optim::OneCycleLR>(opt, optim::OneCycleLROptions{.max_lr = default_lr(o),
                                                                             .total_steps = total_steps,
                                                                             .cycle_momentum = o.optimizer != "adagrad"});
  }
  if (o.scheduler == "warmup-cosine") {
    return std::make_unique<optim::WarmupCosineLR>(opt, optim::WarmupCosineLROptions{
        .total_num_steps = total_steps, .warmup_num_steps = std::max<int64_t>(1, total_steps / 20)});
  }
  return nullptr;  // none, or plateau: see make_plateau
}

// --scheduler plateau: the lr halves after an epoch whose test loss is not 0.01% below the best so
// far (ReduceLROnPlateau's default relative threshold).
std::unique_ptr<optim::ReduceLROnPlateau> make_plateau(const TrainOptions& o, optim::Optimizer& opt) {
  if (o.scheduler != "plateau") return nullptr;
  return std::make_unique<optim::ReduceLROnPlateau>(opt, optim::ReduceLROnPlateauOptions{.factor = 0.5,
                                                                                         .patience = 0});
}

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// `dtype`: the model's (16 bits under a DeepSpeed config's fp16 or bf16); the loss is taken in float32.
Evaluation evaluate(nn::Module& model, data::DataLoader& loader, Device device, DType dtype) {
  InferenceMode inference;  // nothing made here outlives the loop
  model.eval();
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  for (auto& [x, y] : loader) {
    Tensor yd = y.to(device);
    Tensor logits = model(x.to(device, dtype)).to(kFloat32);
    loss_sum += nn::cross_entropy(logits, yd, {.reduction = "sum"}).item<double>();
    correct += eq(argmax(logits, 1), yd).sum().item<int64_t>();
    seen += y.size(0);
  }
  model.train();
  return {seen ? loss_sum / static_cast<double>(seen) : 0, seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0};
}

}  // namespace

Device device_flag(const std::string& value) {
  const Device device = Device::parse(value);
  KILN_CHECK(!device.is_cuda() || cuda::is_available(),
             "--device {}: this machine has no usable CUDA GPU (none found, or the driver does not answer); use "
             "--device cpu", value);
  return device;
}

void check_fits_in_memory(long double bytes, std::string_view what, std::string_view remedy) {
  const long double have =
      static_cast<long double>(sysconf(_SC_PHYS_PAGES)) * static_cast<long double>(sysconf(_SC_PAGE_SIZE));
  KILN_CHECK(have <= 0 || bytes <= have, "{} need about {:.3g} GiB, more than this machine's {:.3g} GiB; {}", what,
             static_cast<double>(bytes / (1 << 30)), static_cast<double>(have / (1 << 30)), remedy);
}

TrainResult train(const TrainOptions& options, std::FILE* out) {
  TrainOptions o = options;
  std::optional<Checkpoint> ckpt;
  if (!o.resume.empty()) {
    ckpt = load_checkpoint(o.resume);
    const std::string wanted_root = o.data_root;
    const std::string wanted = config_of(o).dump();
    apply_config(json::parse(ckpt->config), o);
    std::vector<std::pair<std::string, std::string>> given;  // (flag, config key)
    bool root_given = false;
    for (const std::string& flag : o.given) {
      if (flag == "data-root") {  // a path: the data may have moved, and the flag's value holds
        root_given = true;
        continue;
      }
      std::string key = flag;
      std::replace(key.begin(), key.end(), '-', '_');
      given.emplace_back(flag, key);
    }
    check_resume_flags(config_of(o).dump(), wanted, given, o.resume);
    if (root_given) o.data_root = wanted_root;
  }
  check_options(o);
  // Under kiln-run, mpirun or srun with more than one rank: data parallel. Each rank trains on its
  // shard (DistributedSampler) with --batch-size samples per step, and DDP (or the engine) averages
  // the gradients; rank 0 alone prints, evaluates and writes files.
  std::optional<Config> ds_config;
  if (!o.deepspeed_config.empty()) ds_config = Config::from_string(o.deepspeed_config, "the DeepSpeed config");
  KILN_CHECK(!ds_config || !ds_config->curriculum_learning.enabled,
             "kiln-train: the DeepSpeed config enables curriculum_learning, whose seqlen cuts dim 1 of a batch of "
             "sequences; kiln-train's images have none. Remove the section (train_gpt takes it)");
  const distributed::WorldInfo world = distributed::world_info();
  std::shared_ptr<distributed::Communicator> comm;
  if (world.size > 1 || ds_config) comm = distributed::init("mpi");  // the engine needs one, at any size
  const bool parallel = comm && comm->size() > 1;
  const bool main_rank = !comm || comm->rank() == 0;
  int64_t accumulation = 1;  // micro-batches per step (the engine's gradient_accumulation_steps)
  if (ds_config) {
    const Config::Batch b = ds_config->resolve_batch(comm->size());
    o.batch_size = b.micro_batch_size;
    accumulation = b.gradient_accumulation_steps;
  }
  if (!main_rank) {
    o.quiet = true;
    o.plot = false;
  }
  if (o.threads > 0) set_num_threads(o.threads);
  else if (parallel) set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world.local_size));
  const Device device = device_flag(o.device);
  manual_seed(o.seed);

  Data ds = make_data(o);
  std::optional<OutDirLock> out_lock;  // made ready, and one run at a time in it
  if (main_rank) out_lock.emplace(o.out_dir);
  std::shared_ptr<nn::Module> model = models::make_vision_model(o.model);
  model->to(device);
  const int64_t num_parameters = model->num_parameters();  // counted before ZeRO stage 3 shards them
  std::unique_ptr<optim::Optimizer> opt;  // with a DeepSpeed config, the engine's (made below)
  if (!ds_config) opt = make_optimizer(o, model->parameters());
  // A step reads every micro-batch of its accumulation at once: a smaller last batch would not cut
  // into equal micro-batches, so it is dropped when accumulating.
  data::DataLoaderOptions train_options{.batch_size = o.batch_size * accumulation, .shuffle = true, .seed = o.seed,
                                        .drop_last = accumulation > 1, .num_workers = o.num_workers};
  if (parallel) {
    train_options.shuffle = false;  // the sampler shuffles, the same way on every rank
    train_options.sampler = std::make_shared<data::DistributedSampler>(data::DistributedSamplerOptions{
        .num_replicas = comm->size(), .rank = comm->rank(), .shuffle = true, .seed = o.seed});
  }
  data::DataLoader train_loader(ds.train, train_options);
  data::DataLoader test_loader(ds.test, {.batch_size = 1000, .num_workers = o.num_workers});
  const int64_t steps_per_epoch = train_loader.size();
  KILN_CHECK(o.epochs <= std::numeric_limits<int64_t>::max() / std::max<int64_t>(steps_per_epoch, 1),
             "--epochs {} times {} steps per epoch is more steps than fit in 64 bits; ask for fewer epochs (or stop "
             "early with --max-steps)", o.epochs, steps_per_epoch);
  KILN_CHECK(steps_per_epoch > 0 || !ds_config,
             "the training set's {} samples make no whole step of {} micro-batches of {} on {} rank{}; use more "
             "samples or a smaller train_micro_batch_size_per_gpu or gradient_accumulation_steps",
             ds.train->size(), accumulation, o.batch_size, comm->size(), parallel ? "s" : "");
  std::unique_ptr<optim::LRScheduler> sched =
      opt ? make_scheduler(o, *opt, steps_per_epoch, o.epochs * steps_per_epoch) : nullptr;
  std::unique_ptr<optim::ReduceLROnPlateau> plateau = opt ? make_plateau(o, *opt) : nullptr;

  int64_t step = 0, epoch = 0, epoch_batches = 0, window_steps = 0;
  double epoch_loss_sum = 0, window_sum = 0;
  History history;
  if (ckpt) {
    model->load_state_dict(ckpt->model);
    if (opt) opt->load_state_dict(ckpt->optimizer);  // before the scheduler's: see optim/lr_scheduler.h
    if (sched) sched->load_state_dict(ckpt->scheduler);
    if (plateau) plateau->load_state_dict(ckpt->scheduler);
    train_loader.load_state_dict(ckpt->loader);
    default_generator().set_state(ckpt->rng);
    step = ckpt->step;
    epoch = ckpt->epoch;
    KILN_CHECK(epoch < o.epochs && (o.max_steps == 0 || step < o.max_steps),
               "the checkpoint is at epoch {}, step {}, and the run asks for {} epoch{} in all{}: nothing is left to "
               "train. Ask for more with --epochs or --max-steps",
               epoch, step, o.epochs, o.epochs == 1 ? "" : "s",
               o.max_steps > 0 ? fmt::format(" and at most {} steps", o.max_steps) : "");
    try {
      const json extra = json::parse(ckpt->extra);
      epoch_batches = extra.value("epoch_batches", int64_t{0});
      // Mid-epoch, the data loader's position is a batch of this rank's shard: on another number of
      // ranks the shards differ, and samples would be seen twice or not at all.
      // (Checkpoints from before the world size was saved are not checked.)
      const int64_t world_now = comm ? comm->size() : 1;
      const int64_t saved_world = extra.value("world_size", world_now);
      KILN_CHECK(epoch_batches == 0 || saved_world == world_now,
                 "{}: the checkpoint was saved in the middle of an epoch on {} rank{}; resume it on {} (a "
                 "checkpoint saved at the end of an epoch resumes on any number)", o.resume, saved_world,
                 saved_world == 1 ? "" : "s", saved_world);
      epoch_loss_sum = extra.value("epoch_loss_sum", 0.0);
      window_steps = extra.value("window_steps", int64_t{0});
      window_sum = extra.value("window_sum", 0.0);
      history.step = extra.value("history_step", std::vector<double>{});
      history.loss = extra.value("history_loss", std::vector<double>{});
      history.epoch = extra.value("history_epoch", std::vector<double>{});
      history.test_loss = extra.value("history_test_loss", std::vector<double>{});
      history.test_accuracy = extra.value("history_test_accuracy", std::vector<double>{});
      KILN_CHECK(history.step.size() == history.loss.size() && history.epoch.size() == history.test_loss.size() &&
                     history.epoch.size() == history.test_accuracy.size(),
                 "{}/checkpoint.json: its history's columns have different lengths ({} steps, {} losses; {} epochs, "
                 "{} test losses, {} accuracies): the checkpoint is damaged", o.resume, history.step.size(),
                 history.loss.size(), history.epoch.size(), history.test_loss.size(), history.test_accuracy.size());
    } catch (const json::exception& e) {
      KILN_FAIL("{}/checkpoint.json: its \"trainer\" entry is not kiln-train's running state ({}): the "
                "checkpoint is damaged", o.resume, e.what());
    }
  }
  // After loading: DDP (or the engine) starts by giving every rank rank 0's parameters.
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  if (parallel && !ds_config) ddp = std::make_unique<distributed::DistributedDataParallel>(*model, comm);
  nn::Module& net = ddp ? static_cast<nn::Module&>(*ddp) : *model;
  // With a DeepSpeed config: the engine, its optimizer's state in checkpoint-engine/ (one ZeRO shard
  // per rank), under the tag that checkpoint/ names.
  const std::string ckpt_dir = (fs::path(o.out_dir) / "checkpoint").string();
  std::optional<Engine> engine;
  if (ds_config) {
    engine.emplace(*model, *ds_config, comm);
    if (ckpt) engine->load_checkpoint(engine_dir_of(o.resume), engine_tag_of(*ckpt, o.resume));
  }
  const DType dtype = engine ? engine->dtype() : model->parameters()[0].dtype();

  const std::string metrics_path = (fs::path(o.out_dir) / "metrics.jsonl").string();
  std::FILE* metrics = main_rank ? open_metrics(metrics_path, ckpt.has_value(), step) : nullptr;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> metrics_guard(metrics, [](std::FILE* f) {
    return f ? std::fclose(f) : 0;
  });
  auto log = [&](const json& line) { write_metrics_line(metrics, metrics_path, line.dump()); };

  auto save = [&] {
    const std::string tag = fmt::format("step{}", step);
    if (engine) engine->save_checkpoint(engine_dir_of(ckpt_dir), tag);  // every rank its shard
    if (!main_rank) return;
    Checkpoint c;
    // With the engine, the whole weights it has just gathered and written (at stage 3 no rank
    // holds them otherwise).
    c.model = engine ? safetensors::load_file((fs::path(engine_dir_of(ckpt_dir)) / tag / "model.safetensors").string())
                     : model->state_dict();
    if (opt) c.optimizer = opt->state_dict();
    if (sched) c.scheduler = sched->state_dict();
    if (plateau) c.scheduler = plateau->state_dict();
    c.step = step;
    c.epoch = epoch;
    c.loader = train_loader.state_dict();
    c.rng = default_generator().get_state();
    c.config = config_of(o).dump();
    json extra{{"epoch_batches", epoch_batches}, {"epoch_loss_sum", epoch_loss_sum},
               {"window_steps", window_steps}, {"window_sum", window_sum}, {"world_size", comm ? comm->size() : 1},
               {"history_step", history.step}, {"history_loss", history.loss},
               {"history_epoch", history.epoch}, {"history_test_loss", history.test_loss},
               {"history_test_accuracy", history.test_accuracy}};
    if (engine) extra["engine_tag"] = tag;
    c.extra = extra.dump();
    save_checkpoint(ckpt_dir, c);
    if (engine) remove_other_engine_checkpoints(ckpt_dir, tag);  // those checkpoint/ no longer names
  };

  const bool terminal = !o.quiet && is_terminal(out);
  const char* lr_setting = engine ? "the DeepSpeed config's optimizer.params.lr" : "--lr";
  if (!o.quiet) {
    const std::string recipe =
        engine ? fmt::format("DeepSpeed config: ZeRO stage {}, {} lr {:g}{}, micro-batch {} x accumulation {}",
                             engine->optimizer().stage(), engine->optimizer().name(), engine->get_lr()[0],
                             dtype == kFloat32 ? "" : fmt::format(", {}", dtype_name(dtype)), o.batch_size,
                             accumulation)
               : fmt::format("{} lr {:g}, batch {}", o.optimizer, default_lr(o), o.batch_size);
    std::fprintf(out, "kiln-train: %s (%lld parameters) on %s: %lld training / %lld test samples; %s, %lld epoch%s, "
                 "%d threads, %s%s%s\n",
                 o.model.c_str(), static_cast<long long>(num_parameters), o.dataset.c_str(),
                 static_cast<long long>(ds.train->size()), static_cast<long long>(ds.test->size()), recipe.c_str(),
                 static_cast<long long>(o.epochs), o.epochs == 1 ? "" : "s", get_num_threads(),
                 device.str().c_str(), ckpt ? fmt::format(", resumed at step {}", step).c_str() : "",
                 parallel ? fmt::format("; data parallel on {} ranks ({} {} per rank)", comm->size(),
                                        engine ? "micro-batch" : "batch", o.batch_size).c_str()
                          : "");
  }

  TrainResult result;
  Tensor loss;
  bool stopped = false;
  while (epoch < o.epochs && !stopped) {
    ProgressBar bar(fmt::format("epoch {}/{}", epoch + 1, o.epochs), steps_per_epoch, terminal, out);
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& [x, y] : train_loader) {
      double l = 0;
      if (engine) {  // the batch's micro-batches, accumulated: the engine steps after the last
        const int64_t micro = x.size(0) / accumulation;
        const Tensor xd = x.to(device, dtype), yd = y.to(device);
        for (int64_t k = 0; k < accumulation; ++k) {
          loss = nn::cross_entropy((*engine)(xd.narrow(0, k * micro, micro)).to(kFloat32),
                                   yd.narrow(0, k * micro, micro));
          engine->backward(loss);
          engine->step();
          l += loss.item<double>() / static_cast<double>(accumulation);
        }
      } else {
        Tensor logits = net(x.to(device));
        loss = nn::cross_entropy(logits, y.to(device));
        opt->zero_grad();
        loss.backward();
        opt->step();
        if (sched) sched->step();
        l = loss.item<double>();
      }
      ++step;
      ++epoch_batches;
      if (parallel) {  // report the mean over the ranks: the loss of the whole batch
        Tensor mean = full({1}, l, kFloat64);
        comm->all_reduce(mean, distributed::ReduceOp::Avg);
        l = mean.item<double>();
      }
      KILN_CHECK(std::isfinite(l),  // every rank sees the same mean
                 "step {}: the loss is {}: training diverged; lower {} (the last checkpoint, if any, is from "
                 "before it)", step, l, lr_setting);
      epoch_loss_sum += l;
      result.last_loss = l;
      window_sum += l;
      ++window_steps;
      if (step % o.log_every == 0) {  // the mean loss of the steps since the last line
        const double mean = window_sum / static_cast<double>(window_steps);
        history.step.push_back(static_cast<double>(step));
        history.loss.push_back(mean);
        log({{"type", "step"}, {"step", step}, {"epoch", epoch + 1}, {"loss", mean},
             {"lr", engine ? engine->get_lr()[0] : opt->param_groups()[0].lr()}});
        window_sum = 0;
        window_steps = 0;
      }
      if (!o.quiet) bar.update(epoch_batches, l);
      if (o.max_steps > 0 && step >= o.max_steps && epoch_batches < steps_per_epoch) {
        stopped = true;
        break;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.train_seconds += seconds;
    if (!o.quiet) bar.finish();
    if (stopped) break;

    Evaluation ev;
    {
      // Stage 3: every rank gathers the weights while rank 0 alone evaluates.
      std::optional<distributed::ZeroOptimizer::GatheredParameters> gathered;
      if (engine) gathered.emplace(engine->optimizer());
      if (main_rank) ev = evaluate(*model, test_loader, device, dtype);
    }
    if (parallel) {  // rank 0's numbers, so that every rank returns the same result
      Tensor numbers = tensor({ev.loss, ev.accuracy}, kFloat64);
      comm->broadcast(numbers, 0);
      ev = {numbers[0].item<double>(), numbers[1].item<double>()};
    }
    const double train_loss = epoch_batches ? epoch_loss_sum / static_cast<double>(epoch_batches) : 0;
    // A training step that made the weights inf or nan shows here first: stop before saving them.
    KILN_CHECK(std::isfinite(ev.loss), "epoch {}: the test loss is {}: training diverged; lower {} (the last "
               "checkpoint, if any, is from before it)", epoch + 1, ev.loss, lr_setting);
    if (plateau) plateau->step(ev.loss);  // every rank has rank 0's ev, so the same lr
    ++epoch;
    history.epoch.push_back(static_cast<double>(epoch));
    history.test_loss.push_back(ev.loss);
    history.test_accuracy.push_back(ev.accuracy);
    log({{"type", "epoch"}, {"epoch", epoch}, {"step", step}, {"train_loss", train_loss},
         {"test_loss", ev.loss}, {"test_accuracy", ev.accuracy}, {"epoch_seconds", seconds}});
    if (!o.quiet) {
      std::fprintf(out, "epoch %lld/%lld: train loss %.4f, test loss %.4f, test accuracy %.4f (%.1f s)\n",
                   static_cast<long long>(epoch), static_cast<long long>(o.epochs), train_loss, ev.loss,
                   ev.accuracy, seconds);
    }
    result.test_loss = ev.loss;
    result.test_accuracy = ev.accuracy;
    epoch_batches = 0;
    epoch_loss_sum = 0;
    train_loader.set_epoch(epoch);
    if (o.max_steps > 0 && step >= o.max_steps) stopped = true;
    if (epoch < o.epochs && !stopped) save();  // the last one is saved below
  }
  save();
  result.steps = step;
  result.epochs = epoch;
  result.checkpoint_dir = ckpt_dir;
  if (o.plot) {
    std::string why;
    result.plot_path = plot_history(history, o.out_dir, &why);
    if (result.plot_path.empty() && !o.quiet) std::fprintf(out, "kiln-train: no plot: %s\n", why.c_str());
  }
  if (!o.quiet) {
    std::fprintf(out, "kiln-train: %lld steps; checkpoint %s; metrics %s%s%s\n", static_cast<long long>(step),
                 ckpt_dir.c_str(), metrics_path.c_str(), result.plot_path.empty() ? "" : "; plot ",
                 result.plot_path.c_str());
  }
  // The DeepSpeed config's comms_logger table, if any, and how much of it was waiting for the
  // slowest rank: a collective, so every rank calls it (rank 0 prints).
  if (engine) engine->log_summary(/*show_straggler=*/true);
  return result;
}

}  // namespace kiln::train

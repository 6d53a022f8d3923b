// models/train_gpt.cpp: train_gpt, a byte-level GPT trained on a text corpus: by default BENCHMARKS.md's
// gpt_char model on the fortunes corpus (Debian's `fortunes` package; --corpus FILE for any text). A
// progress bar, validation losses, metrics as JSON lines, a plot, checkpoints to resume from, and a
// generated sample at the end. `train_gpt --help` lists the flags.
//
//   train_gpt --steps 2000 --out runs/gpt                 # gpt_char, 16 x 128 bytes per step
//   train_gpt --resume runs/gpt/checkpoint --steps 4000 --out runs/gpt
//   train_gpt --grad-accum 4 --clip 1.0 --checkpoint-activations --no-fusion   # the techniques
//   train_gpt --device cuda --offload-activations --autocast bf16
//   kiln-run -n 2 train_gpt --out runs/gpt-ddp           # data parallel on 2 ranks
//   kiln-run -n 4 train_gpt --deepspeed-config configs/ds_zero2.json   # DeepSpeed's config: ZeRO, bf16, ...
//   kiln-run -n 4 train_gpt --deepspeed-config ds.json --tensor-parallel 2 --pipeline-parallel 2   # 3D
//   kiln-run -n 2 train_gpt --deepspeed-config ds.json --pipeline-parallel 2 --virtual-stages 2   # interleaved
//
// The last tenth of the corpus is held out: every --eval-every steps the validation loss is the mean
// over --eval-batches fixed windows of it. A step is --grad-accum micro-batches of --batch-size
// windows, each loss divided by --grad-accum so the gradients add up to the mean over the whole
// batch; then clipping (--clip, the global norm) and AdamW. With --deepspeed-config the step is
// kiln::Engine's (distributed/engine/engine.h): batch sizes, accumulation, optimizer, schedule,
// clipping, fp16/bf16 and the ZeRO stage come from that file, and its checkpoint (each rank's ZeRO
// shard) goes beside checkpoint/, in checkpoint-engine/. With --tensor-parallel T and
// --pipeline-parallel P as well, the ranks form a data x pipeline x tensor grid and the model is
// models::ParallelGPT (models/gpt_parallel.h): each rank holds its stage's blocks, its slices of
// them, and the engine runs each step as a pipeline of the accumulation's micro-batches
// (Engine::train_batch); --sequence-parallel cuts the activations between the tensor-parallel
// layers along the sequence; --virtual-stages V gives each pipeline rank V chunks of the blocks
// (stage c P + s of P V) and the engine runs interleaved 1F1B (gradient_accumulation_steps a
// multiple of P). The ranks of one data-parallel replica draw the same windows; the
// validation loss comes through the pipeline; the weights are saved in the engine's checkpoint
// alone (one folder per stage and slice); the sample comes from the whole model, gathered from the
// stages and slices onto rank 0 (ParallelGPT::gather_chunks).
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <kiln/kiln.h>
#include <nlohmann/json.hpp>

#include "models/gpt.h"
#include "models/gpt_parallel.h"
#include "models/train/checkpoint.h"
#include "models/train/flags.h"
#include "models/train/plot.h"
#include "models/train/progress.h"
#include "models/train/trainer.h"

using namespace kiln;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The settings a checkpoint keeps: a resumed run takes the model, data and optimizer settings from
// it. (How long to run, and how often to evaluate, log and save, come from the command line.)
struct Run {
  std::string config = "gpt_char";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, context = 0;  // 0: the config's
  double dropout = 0;
  std::string corpus;  // "" = the fortunes corpus
  int64_t batch_size = 16, grad_accum = 1;
  double lr = 3e-4, weight_decay = 0.1, clip = 0;
  bool checkpoint_activations = false, offload_activations = false, fusion = true, fused_adam = false;
  std::string autocast = "none";  // none | bf16 | fp16 (fp16 with dynamic loss scaling)
  uint64_t seed = 0;
  std::string device = "cpu";
  std::string deepspeed_config;  // the text of the --deepspeed-config file ("" = none)
  int64_t tensor_parallel = 1, pipeline_parallel = 1;  // the grid's tensor and pipeline sizes
  int64_t virtual_stages = 1;  // model chunks per pipeline rank (interleaved 1F1B when more than 1)
  bool sequence_parallel = false;  // between the tensor-parallel layers, 1 / tensor_parallel of the positions
  // Whether a pipeline keeps the head tied to the embedding (a copy on the last stage). New runs
  // do; a checkpoint written before they could (no such key) holds an untied head, and resumes so.
  bool head_tied_across_stages = false;
};
// to_json / from_json; a key missing from an older checkpoint keeps its default.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Run, config, n_layer, n_head, n_embd, context, dropout, corpus,
                                                batch_size, grad_accum, lr, weight_decay, clip,
                                                checkpoint_activations, offload_activations, fusion, fused_adam,
                                                autocast, seed, device, deepspeed_config, tensor_parallel,
                                                pipeline_parallel, sequence_parallel, head_tied_across_stages,
                                                virtual_stages)

models::GPTConfig model_config(const Run& r) {
  KILN_CHECK(r.config == "gpt_char" || r.config == "gpt2",
             "--config must be gpt_char or gpt2, got '{}'", r.config);
  models::GPTConfig c = r.config == "gpt2" ? models::GPTConfig::gpt2() : models::GPTConfig::gpt_char();
  if (r.n_layer > 0) c.n_layer = r.n_layer;
  if (r.n_head > 0) c.n_head = r.n_head;
  if (r.n_embd > 0) c.n_embd = r.n_embd;
  if (r.context > 0) c.block_size = r.context;
  c.dropout = r.dropout;
  if (r.pipeline_parallel > 1 && !r.head_tied_across_stages) c.tie_weights = false;
  KILN_CHECK(c.vocab_size >= 256, "a byte-level corpus needs vocab_size >= 256");
  return c;
}

// The settings a checkpoint brings, checked as the flags are: a damaged or hand-edited manifest
// gets an Error naming the field instead of a run that trains on nonsense.
void check_resumed(const Run& r, const std::string& manifest) {
  auto check = [&](bool ok, const char* field, const std::string& value, const char* rule) {
    KILN_CHECK(ok, "{}: config.{} is {}, but it must be {}; the checkpoint is damaged", manifest, field, value, rule);
  };
  // The flags' bounds (parse_run): a value past them would overflow a product or run for ever.
  check(r.n_layer >= 0 && r.n_layer <= (1 << 16), "n_layer", std::to_string(r.n_layer), "in [0, 2^16]");
  check(r.n_head >= 0 && r.n_head <= (1 << 16), "n_head", std::to_string(r.n_head), "in [0, 2^16]");
  check(r.n_embd >= 0 && r.n_embd <= (1 << 20), "n_embd", std::to_string(r.n_embd), "in [0, 2^20]");
  check(r.context >= 0 && r.context <= (1 << 24), "context", std::to_string(r.context), "in [0, 2^24]");
  check(r.batch_size >= 1 && r.batch_size <= (1 << 24), "batch_size", std::to_string(r.batch_size), "in [1, 2^24]");
  check(r.grad_accum >= 1 && r.grad_accum <= (1 << 20), "grad_accum", std::to_string(r.grad_accum), "in [1, 2^20]");
  check(std::isfinite(r.dropout) && r.dropout >= 0 && r.dropout < 1, "dropout", fmt::format("{}", r.dropout),
        "in [0, 1)");
  check(std::isfinite(r.lr) && r.lr >= 0, "lr", fmt::format("{}", r.lr), "finite and >= 0");
  check(std::isfinite(r.weight_decay) && r.weight_decay >= 0, "weight_decay", fmt::format("{}", r.weight_decay),
        "finite and >= 0");
  check(std::isfinite(r.clip) && r.clip >= 0, "clip", fmt::format("{}", r.clip), "finite and >= 0");
  check(r.autocast == "none" || r.autocast == "bf16" || r.autocast == "fp16", "autocast", "'" + r.autocast + "'",
        "none, bf16 or fp16");
  check(r.tensor_parallel >= 1 && r.pipeline_parallel >= 1 && r.tensor_parallel <= (1 << 16) &&
            r.pipeline_parallel <= (1 << 16),
        "tensor_parallel", fmt::format("{} (pipeline_parallel {})", r.tensor_parallel, r.pipeline_parallel),
        "in [1, 2^16], as pipeline_parallel");
  check(r.virtual_stages >= 1 && r.virtual_stages <= (1 << 16), "virtual_stages", std::to_string(r.virtual_stages),
        "in [1, 2^16]");
}

// On --resume the checkpoint's settings hold. One given on the command line that differs from
// them is an Error, not ignored; the corpus and the device may change (a file that moved, a run
// taken to a GPU), and the flags' values replace the checkpoint's.
void merge_resumed(Run& resumed, const Run& given, const train::Flags& flags, const std::string& manifest) {
  const json wanted = given;
  std::vector<std::pair<std::string, std::string>> set;  // (flag, key) of the settings the flags gave
  for (const auto& [key, value] : wanted.items()) {
    if (key == "head_tied_across_stages") continue;  // no flag: how the checkpoint's model was built
    std::string flag = key == "fusion" ? "no-fusion" : key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (key != "corpus" && key != "device" && flags.given(flag)) set.emplace_back(flag, key);
  }
  train::check_resume_flags(json(resumed).dump(), wanted.dump(), set, manifest);
  if (flags.given("corpus")) resumed.corpus = given.corpus;
  if (flags.given("device")) resumed.device = given.device;
}

// The model's weights, gradients and AdamW's two moments take 16 bytes a parameter in float32: a
// size that cannot fit is an Error before the first layer is built, not a process that grows
// until the system stops it.
void check_fits(const models::GPTConfig& c) {
  const long double C = static_cast<long double>(c.n_embd);
  const long double params = static_cast<long double>(c.n_layer) * (12 * C * C + 13 * C) +
                             static_cast<long double>(c.vocab_size + c.block_size) * C;
  train::check_fits_in_memory(16 * params,
                              fmt::format("a GPT of {} layers {} wide has about {:.3g} parameters, whose weights, "
                                          "gradients and AdamW state", c.n_layer, c.n_embd,
                                          static_cast<double>(params)),
                              "choose a smaller --n-layer or --n-embd");
}

// GPT's parameter count, from its config: each block 12 C^2 + 13 C, the embeddings, ln_f, and an
// untied head.
int64_t gpt_parameters(const models::GPTConfig& c) {
  const int64_t C = c.n_embd;
  return c.n_layer * (12 * C * C + 13 * C) + (c.vocab_size + c.block_size) * C + 2 * C +
         (c.tie_weights ? 0 : c.vocab_size * C);
}

// The mean loss over fixed windows of the held-out text, in evaluation mode.
double validation_loss(models::GPT& model, const data::ByteText& val, int64_t batches, int64_t batch_size,
                       Device device) {
  InferenceMode inference;  // nothing made here outlives the loop
  const bool was_training = model.is_training();
  model.eval();
  Generator fixed(1234);  // the same windows every time
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    data::Example b = val.sample(batch_size, model.config.block_size, fixed);
    sum += models::GPT::loss(model(b.data.to(device)), b.target.to(device)).item<double>();
  }
  model.train(was_training);
  return sum / static_cast<double>(batches);
}

// The same for a model split over a grid: each batch of windows goes through the engine's pipeline,
// and the last stage's loss reaches every rank. Every rank calls it; `rows` must cut into the
// engine's micro-batches.
double validation_loss(Engine& engine, const distributed::ParallelGrid& grid, const data::ByteText& val,
                       int64_t batches, int64_t rows, int64_t context, Device device) {
  Generator fixed(1234);  // the same windows every time
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    data::Example b = val.sample(rows, context, fixed);
    const Tensor logits = engine.eval_batch(b.data.to(device));  // on the last stage
    Tensor loss = full({1}, logits.defined() ? models::GPT::loss(logits, b.target.to(device)).item<double>() : 0.0,
                       TensorOptions(kFloat64).device(grid.pipeline()->device()));
    grid.pipeline()->broadcast(loss, grid.pipeline_size() - 1);
    sum += loss.item<double>();
  }
  return sum / static_cast<double>(batches);
}

std::string printable(const std::vector<int64_t>& bytes) {
  std::string s;
  for (int64_t b : bytes) s += (b == '\n' || b == '\t' || (b >= 32 && b < 127)) ? static_cast<char>(b) : '?';
  return s;
}

int run(int argc, char** argv) {
  train::Flags flags("train_gpt", "Trains a byte-level GPT on a text corpus with Kiln.");
  flags.add("config", "gpt_char", "gpt_char (BENCHMARKS.md e: 4 layers, 128 wide, context 128) or gpt2 (124M)");
  flags.add("n-layer", "0", "blocks (0: the config's)");
  flags.add("n-head", "0", "attention heads (0: the config's)");
  flags.add("n-embd", "0", "width (0: the config's)");
  flags.add("context", "0", "context length in bytes (0: the config's)");
  flags.add("dropout", "0", "dropout on embeddings, attention and residual branches");
  flags.add("corpus", "", "a text file to train on (default: the fortunes corpus of Debian's fortunes package)");
  flags.add("steps", "200", "optimizer steps in all (a resumed run continues up to this number)");
  flags.add("batch-size", "16", "windows per micro-batch (per rank when data parallel)");
  flags.add("grad-accum", "1", "micro-batches per step: gradient accumulation, the loss scaled by 1/N");
  flags.add("lr", "3e-4", "AdamW learning rate (constant)");
  flags.add("weight-decay", "0.1", "AdamW weight decay, on every parameter");
  flags.add("clip", "0", "clip the gradients' global norm to this (0: no clipping)");
  flags.add_switch("checkpoint-activations", "activation checkpointing of every block: less memory, more time");
  flags.add_switch("offload-activations", "keep the activations saved for backward in host memory (a GPU run)");
  flags.add("autocast", "none", "mixed precision: none, bf16, or fp16 (with dynamic loss scaling, DeepSpeed's rule)");
  flags.add_switch("no-fusion", "run the fused ops (attention, gelu's backward) as their unfused compositions");
  flags.add_switch("fused-adam", "AdamW as one fused multi-tensor kernel");
  flags.add("seed", "0", "seed of the initialisation and the windows drawn");
  flags.add("device", "cpu", "cpu, cuda or cuda:N");
  flags.add("threads", "0", "CPU threads (0: every core, shared out among the ranks of a machine)");
  flags.add("eval-every", "100", "steps between validation losses (0: only at the end)");
  flags.add("eval-batches", "8", "batches of held-out windows per validation loss");
  flags.add("log-every", "10", "steps between lines of metrics.jsonl (their mean loss)");
  flags.add("save-every", "0", "steps between checkpoints (0: only at the end)");
  flags.add("sample", "300", "bytes to generate at the end (0: none; at most 1048576)");
  flags.add("prompt", "\n", "the text the sample starts from");
  flags.add("temperature", "0.8", "sampling temperature (0: greedy)");
  flags.add("top-k", "40", "sample among the k most likely bytes (0: all)");
  flags.add("out", "runs/train_gpt", "output directory: metrics.jsonl, training.png, checkpoint/, sample.txt");
  flags.add("deepspeed-config", "", "a DeepSpeed ds_config.json: batch sizes, accumulation, optimizer, schedule, "
            "clipping, fp16/bf16 and the ZeRO stage come from it (then --batch-size, --grad-accum, --lr, "
            "--weight-decay, --clip, --autocast and --fused-adam are refused)");
  flags.add("tensor-parallel", "1", "ranks that split each block's heads and MLP (Megatron's tensor "
            "parallelism; with --deepspeed-config)");
  flags.add("pipeline-parallel", "1", "pipeline stages the blocks are cut into, the last holding a copy of the "
            "embedding for the tied head (with --deepspeed-config; its gradient_accumulation_steps are the "
            "micro-batches)");
  flags.add("virtual-stages", "1", "with --pipeline-parallel 2 or more: model chunks per pipeline rank, run "
            "as Megatron's interleaved 1F1B (the accumulation's micro-batches a multiple of the stages)");
  flags.add_switch("sequence-parallel", "with --tensor-parallel: between the tensor-parallel layers each rank "
                   "keeps its part of the sequence (Megatron's sequence parallelism)");
  flags.add("resume", "", "continue from this checkpoint directory, with its settings (--corpus and --device may change)");
  flags.add_switch("quiet", "no progress output");
  flags.parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.help().c_str(), stdout);
    return 0;
  }
  Run r;
  r.config = flags.get("config");
  r.n_layer = flags.get_int("n-layer", 0, 1 << 16);
  r.n_head = flags.get_int("n-head", 0, 1 << 16);
  r.n_embd = flags.get_int("n-embd", 0, 1 << 20);
  r.context = flags.get_int("context", 0, 1 << 24);
  r.dropout = flags.get_double("dropout");
  r.corpus = flags.get("corpus");
  r.batch_size = flags.get_int("batch-size", 1, 1 << 24);
  r.grad_accum = flags.get_int("grad-accum", 1, 1 << 20);
  r.lr = flags.get_double("lr");
  r.weight_decay = flags.get_double("weight-decay");
  r.clip = flags.get_double("clip");
  r.checkpoint_activations = flags.get_switch("checkpoint-activations");
  r.offload_activations = flags.get_switch("offload-activations");
  r.autocast = flags.get_choice("autocast", {"none", "bf16", "fp16"});
  r.fusion = !flags.get_switch("no-fusion");
  r.fused_adam = flags.get_switch("fused-adam");
  r.seed = static_cast<uint64_t>(flags.get_int("seed", 0));
  r.device = flags.get("device");
  r.tensor_parallel = flags.get_int("tensor-parallel", 1, 1 << 16);
  r.pipeline_parallel = flags.get_int("pipeline-parallel", 1, 1 << 16);
  r.virtual_stages = flags.get_int("virtual-stages", 1, 1 << 16);
  r.sequence_parallel = flags.get_switch("sequence-parallel");
  r.head_tied_across_stages = true;
  if (const std::string& path = flags.get("deepspeed-config"); !path.empty()) {
    r.deepspeed_config = train::read_flag_file(path, "deepspeed-config");
    Config::from_string(r.deepspeed_config, path);  // its mistakes now, before anything starts
  }
  const int64_t steps = flags.get_int("steps", 1);
  const int64_t eval_every = flags.get_int("eval-every", 0), eval_batches = flags.get_int("eval-batches", 1);
  const int64_t log_every = flags.get_int("log-every", 1), save_every = flags.get_int("save-every", 0);
  const std::string out_dir = flags.get("out");
  bool quiet = flags.get_switch("quiet");
  // The sample's settings are checked now, not after the training.
  const int64_t sample = flags.get_int("sample", 0, 1 << 20), top_k = flags.get_int("top-k", 0);
  const double temperature = flags.get_double("temperature");
  KILN_CHECK(temperature >= 0, "--temperature must be >= 0 (0: greedy), not {}", temperature);

  std::optional<train::Checkpoint> ckpt;
  if (!flags.get("resume").empty()) {
    ckpt = train::load_checkpoint(flags.get("resume"));
    const std::string manifest = (fs::path(flags.get("resume")) / "checkpoint.json").string();
    try {
      const Run given = r;
      r = json::parse(ckpt->config).get<Run>();
      merge_resumed(r, given, flags, manifest);
    } catch (const json::exception& e) {
      KILN_FAIL("{}: its config does not hold train_gpt's settings ({}); resume train_gpt from a checkpoint "
                "that train_gpt wrote", manifest, e.what());
    }
    check_resumed(r, manifest);
  }
  KILN_CHECK(r.clip >= 0, "--clip must be >= 0, got {}", r.clip);
  if (!r.deepspeed_config.empty()) {
    for (const char* f : {"batch-size", "grad-accum", "lr", "weight-decay", "clip", "autocast", "fused-adam"}) {
      KILN_CHECK(!flags.given(f), "--{} and a DeepSpeed config are both given (--deepspeed-config, or the one the "
                 "resumed checkpoint was trained with); the config sets it (DeepSpeed's train_micro_batch_size_per_gpu, "
                 "gradient_accumulation_steps, optimizer, gradient_clipping, fp16/bf16): drop --{}", f, f);
    }
  }

  // Data parallel under kiln-run / mpirun / srun: each rank draws its own windows; DDP averages.
  const distributed::WorldInfo world = distributed::world_info();
  std::shared_ptr<distributed::Communicator> comm;
  std::optional<Config> ds;
  if (!r.deepspeed_config.empty()) ds = Config::from_string(r.deepspeed_config, "the DeepSpeed config");
  if (world.size > 1 || ds) comm = distributed::init("mpi");  // the engine needs one, at any size
  const bool main_rank = !comm || comm->rank() == 0;
  if (!main_rank) quiet = true;
  KILN_CHECK(!r.sequence_parallel || r.tensor_parallel > 1, "--sequence-parallel splits the sequence among the "
             "tensor-parallel ranks: give --tensor-parallel 2 or more");
  KILN_CHECK(r.virtual_stages == 1 || r.pipeline_parallel > 1, "--virtual-stages cuts each pipeline rank's blocks "
             "into chunks: give --pipeline-parallel 2 or more");
  // Tensor and pipeline parallel: the ranks as a grid, the rest of them data parallel.
  std::unique_ptr<distributed::ParallelGrid> grid;
  if (r.tensor_parallel * r.pipeline_parallel > 1) {
    KILN_CHECK(ds.has_value(), "--tensor-parallel and --pipeline-parallel train through the engine: give a "
               "--deepspeed-config too");
    KILN_CHECK(comm->size() % (r.tensor_parallel * r.pipeline_parallel) == 0,
               "{} ranks do not make a grid of tensor {} x pipeline {}; run a multiple of {} ranks (kiln-run -n N)",
               comm->size(), r.tensor_parallel, r.pipeline_parallel, r.tensor_parallel * r.pipeline_parallel);
    grid = std::make_unique<distributed::ParallelGrid>(
        comm, distributed::GridSizes{.tensor = static_cast<int>(r.tensor_parallel),
                                     .pipeline = static_cast<int>(r.pipeline_parallel)});
  }
  if (const int64_t t = flags.get_int("threads", 0, INT_MAX); t > 0) {
    set_num_threads(static_cast<int>(t));
  } else if (world.size > 1) {
    set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world.local_size));
  }
  set_fusion(r.fusion);
  const Device device = train::device_flag(r.device);

  // The corpus: the first 90% trains, the last 10% validates.
  data::ByteText text = r.corpus.empty() ? data::ByteText::fortunes() : data::ByteText(r.corpus);
  const auto split = static_cast<std::ptrdiff_t>(text.size() * 9 / 10);
  data::ByteText train_text({text.bytes().begin(), text.bytes().begin() + split}, "training text");
  data::ByteText val_text({text.bytes().begin() + split, text.bytes().end()}, "validation text");
  const models::GPTConfig config = model_config(r);
  // Checked now, not when the first evaluation samples it after the training.
  KILN_CHECK(val_text.size() >= config.block_size + 2,
             "the corpus has {} bytes; its last 10%, the validation text, has {}, fewer than context + 2 = {}; "
             "use a longer corpus or a shorter --context",
             text.size(), val_text.size(), config.block_size + 2);
  check_fits(config);

  if (ds) {  // what the engine will do, in the settings the run prints and saves
    const Config::Batch b = ds->resolve_batch(grid ? grid->data_size() : comm->size());
    r.batch_size = b.micro_batch_size;
    r.grad_accum = b.gradient_accumulation_steps;
    r.clip = ds->gradient_clipping;
    r.autocast = ds->fp16.enabled ? "fp16" : ds->bf16.enabled ? "bf16" : "none";
    if (const auto& t = ds->torch_autocast; t.enabled) {  // the model stays float32; forward under autocast
      r.autocast = t.dtype.value_or(device.is_cuda() ? kFloat16 : kBFloat16) == kFloat16 ? "fp16" : "bf16";
    }
  }

  manual_seed(r.seed);
  // One model, or with a grid this rank's stage and slices of it (the same weights from the seed).
  std::unique_ptr<models::GPT> whole;
  std::vector<std::unique_ptr<models::ParallelGPT>> chunks;  // this rank's stage, or its chunks
  std::vector<models::ParallelGPT*> chunk_pointers;
  if (grid) {
    KILN_CHECK(!r.sequence_parallel || config.block_size % r.tensor_parallel == 0,
               "--sequence-parallel: the context ({}) must be a multiple of --tensor-parallel ({}); change --context",
               config.block_size, r.tensor_parallel);
    const int p = grid->pipeline_size(), v = static_cast<int>(r.virtual_stages);
    KILN_CHECK(p * v <= config.n_layer, "--pipeline-parallel {} x --virtual-stages {} = {} stages, and the model has "
               "{} blocks; each stage needs one: lower --virtual-stages or raise --n-layer", p, v, p * v,
               config.n_layer);
    // Each chunk draws the whole model and keeps its part: all from the same generator state.
    const Generator::State before = default_generator().get_state();
    for (int c = 0; c < v; ++c) {
      default_generator().set_state(before);
      chunks.push_back(std::make_unique<models::ParallelGPT>(config, grid->tensor(), c * p + grid->pipeline_rank(),
                                                             p * v, r.sequence_parallel, v));
      chunks.back()->set_checkpointing(r.checkpoint_activations);
      chunk_pointers.push_back(chunks.back().get());
    }
  } else {
    whole = std::make_unique<models::GPT>(config);
    whole->set_checkpointing(r.checkpoint_activations);
  }
  nn::Module& model = grid ? static_cast<nn::Module&>(*chunks[0]) : *whole;
  for (const auto& chunk : chunks) chunk->to(device);
  if (whole) whole->to(device);
  std::unique_ptr<optim::AdamW> opt;  // without a DeepSpeed config; with one, the engine's optimizer
  if (!ds) opt = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{
                     .lr = r.lr, .weight_decay = r.weight_decay, .fused = r.fused_adam});
  // fp16 needs its gradients scaled up so that small ones do not flush to zero (optim/grad_scaler.h).
  optim::GradScaler scaler({.enabled = r.autocast == "fp16" && !ds});  // the engine has its own
  const DType low = r.autocast == "fp16" ? kFloat16 : kBFloat16;
  // A stream per data-parallel replica: the ranks of one pipeline and tensor group need the same windows.
  Generator windows(r.seed * 1000003 + static_cast<uint64_t>(grid ? grid->data_rank() : comm ? comm->rank() : 0));
  int64_t step = 0;
  train::LossHistory history;
  if (ckpt) {
    if (!grid) model.load_state_dict(ckpt->model);  // with a grid, the weights are in the engine's checkpoint
    if (opt) opt->load_state_dict(ckpt->optimizer);  // the engine's is in checkpoint-engine/, loaded below
    // The loss scale and its counters go on where they were; a checkpoint from before they were saved
    // (or from a run without fp16) has none, and the scaler starts afresh.
    if (!ckpt->scaler.empty()) scaler.load_state_dict(ckpt->scaler);
    // Each rank draws from its own stream (seeded by its rank above); the checkpoint, rank 0's, holds
    // how far the streams have gone, which is the same on every rank.
    windows.set_state({windows.get_state().seed, ckpt->rng.offset});
    step = ckpt->step;
    KILN_CHECK(step < steps, "the checkpoint is at step {}, and --steps {} counts steps in all: nothing is left to "
               "train; ask for more with --steps", step, steps);
    try {
      const json extra = json::parse(ckpt->extra);
      history.step = extra.value("step", std::vector<double>{});
      history.loss = extra.value("loss", std::vector<double>{});
      history.eval_step = extra.value("eval_step", std::vector<double>{});
      history.eval_loss = extra.value("eval_loss", std::vector<double>{});
      KILN_CHECK(history.step.size() == history.loss.size() && history.eval_step.size() == history.eval_loss.size(),
                 "the checkpoint's loss history has columns of different lengths ({} steps, {} losses; {} "
                 "validation steps, {} losses): the checkpoint is damaged", history.step.size(), history.loss.size(),
                 history.eval_step.size(), history.eval_loss.size());
      // Dropout's masks go on from where they were (the same state on every rank); a checkpoint
      // from before the state was saved resumes them from the seed's.
      if (extra.contains("dropout_rng")) {
        default_generator().set_state({extra.at("dropout_rng").at("seed").get<uint64_t>(),
                                       extra.at("dropout_rng").at("offset").get<uint64_t>()});
      }
    } catch (const json::exception& e) {
      KILN_FAIL("{}/checkpoint.json: its \"trainer\" entry is not train_gpt's loss history ({}): the checkpoint "
                "is damaged", flags.get("resume"), e.what());
    }
  }
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  if (comm && !ds) ddp = std::make_unique<distributed::DistributedDataParallel>(model, comm);
  nn::Module& net = ddp ? static_cast<nn::Module&>(*ddp) : model;
  // With a DeepSpeed config: the engine, and its checkpoints beside checkpoint/ (one ZeRO shard per
  // rank; checkpoint.json names the tag that goes with it).
  std::optional<Engine> engine;
  // Counted before ZeRO stage 3 shards them; with a grid, the whole model's (models::GPT's formula).
  const int64_t num_parameters = grid ? gpt_parameters(config) : model.num_parameters();
  if (grid) {
    engine.emplace(std::vector<nn::Module*>(chunk_pointers.begin(), chunk_pointers.end()), *ds, *grid,
                   models::ParallelGPT::loss);
  } else if (ds) {
    engine.emplace(model, *ds, comm);
    // At stage 3 the tied head reads the embedding's weight inside GPT's own forward.
    if (config.tie_weights) engine->optimizer().register_external_parameter(model, whole->transformer.wte.weight);
  }
  if (engine && ckpt) {
    const std::string& resume = flags.get("resume");
    engine->load_checkpoint(train::engine_dir_of(resume), train::engine_tag_of(*ckpt, resume));
  }
  // Stage 3 keeps a shard of each weight per rank: gathered on every rank while one rank alone
  // evaluates, samples or saves.
  auto gathered = [&] {
    return engine ? std::make_unique<distributed::ZeroOptimizer::GatheredParameters>(engine->optimizer()) : nullptr;
  };

  std::optional<train::OutDirLock> out_lock;  // made ready, and one run at a time in it
  if (main_rank) out_lock.emplace(out_dir);
  const std::string metrics_path = (fs::path(out_dir) / "metrics.jsonl").string();
  std::FILE* metrics = main_rank ? train::open_metrics(metrics_path, ckpt.has_value(), step) : nullptr;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> metrics_guard(metrics, [](std::FILE* f) { return f ? std::fclose(f) : 0; });
  auto log = [&](const json& line) { train::write_metrics_line(metrics, metrics_path, line.dump()); };
  const std::string ckpt_dir = (fs::path(out_dir) / "checkpoint").string();
  auto save = [&] {
    const std::string tag = fmt::format("step{}", step);
    if (engine) engine->save_checkpoint(train::engine_dir_of(ckpt_dir), tag);  // every rank its shard
    auto all = gathered();
    if (!main_rank) return;
    train::Checkpoint c;
    if (!grid) c.model = model.state_dict();
    if (opt) c.optimizer = opt->state_dict();
    c.scaler = scaler.state_dict();  // empty unless fp16
    c.step = step;
    c.rng = windows.get_state();
    c.config = json(r).dump();
    json extra{{"step", history.step}, {"loss", history.loss}, {"eval_step", history.eval_step},
               {"eval_loss", history.eval_loss}};
    const Generator::State dropout_rng = default_generator().get_state();
    extra["dropout_rng"] = {{"seed", dropout_rng.seed}, {"offset", dropout_rng.offset}};
    if (engine) extra["engine_tag"] = tag;
    c.extra = extra.dump();
    train::save_checkpoint(ckpt_dir, c);
    if (engine) train::remove_other_engine_checkpoints(ckpt_dir, tag);  // those checkpoint/ no longer names
  };
  auto evaluate = [&] {
    auto all = gathered();
    double v = grid ? validation_loss(*engine, *grid, val_text, eval_batches, r.batch_size * r.grad_accum,
                                      config.block_size, device)
           : main_rank ? validation_loss(*whole, val_text, eval_batches, r.batch_size, device) : 0;
    // A step that made the weights inf or nan shows here first: stop before saving them.
    KILN_CHECK(std::isfinite(v), "step {}: the validation loss is {}: training diverged; lower --lr or clip the "
               "gradients with --clip (the last checkpoint, if any, is from before it)", step, v);
    history.eval_step.push_back(static_cast<double>(step));
    history.eval_loss.push_back(v);
    log({{"type", "eval"}, {"step", step}, {"val_loss", v}});
    return v;
  };

  const models::GPTConfig& c = config;
  if (!quiet) {
    std::printf("train_gpt: %s, %lld layers x %lld heads x %lld wide, context %lld (%lld parameters) on %s; "
                "%lld training / %lld validation bytes; %lld x %lld windows per step%s; %s; %d threads%s%s%s%s%s%s\n",
                r.config.c_str(), static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
                static_cast<long long>(c.n_embd), static_cast<long long>(c.block_size),
                static_cast<long long>(num_parameters), device.str().c_str(),
                static_cast<long long>(train_text.size()), static_cast<long long>(val_text.size()),
                static_cast<long long>(r.grad_accum), static_cast<long long>(r.batch_size),
                comm && comm->size() > 1 ? fmt::format(" per rank, {} ranks", comm->size()).c_str() : "",
                ds ? fmt::format("DeepSpeed config: ZeRO stage {}, {} lr {}{}", ds->zero_optimization.stage,
                                 engine->optimizer().name(), engine->get_lr()[0],
                                 grid ? fmt::format(", grid tensor {} x pipeline {}{} x data {}", grid->tensor_size(),
                                                    grid->pipeline_size(),
                                                    r.virtual_stages > 1
                                                        ? fmt::format(" (interleaved, {} chunks each)", r.virtual_stages)
                                                        : "",
                                                    grid->data_size())
                                      : "").c_str()
                   : fmt::format("AdamW lr {}", r.lr).c_str(),
                get_num_threads(),
                r.checkpoint_activations ? ", activation checkpointing" : "",
                r.offload_activations ? ", activation offload" : "",
                r.autocast == "none" ? "" : fmt::format(", autocast {}", r.autocast).c_str(), r.fusion ? "" : ", fusion off",
                r.clip > 0 ? fmt::format(", clip {}", r.clip).c_str() : "",
                ckpt ? fmt::format(", resumed at step {}{}", step,
                                   scaler.is_enabled() || (ds && r.autocast == "fp16")
                                       ? fmt::format(" (loss scale {})", engine ? engine->loss_scale() : scaler.get_scale())
                                       : "").c_str()
                     : "");
  }

  const bool terminal = !quiet && train::is_terminal(stdout);
  train::ProgressBar bar("train", steps, terminal, stdout);
  double window_sum = 0;
  int64_t window_steps = 0;
  double last_loss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t first = step;
  while (step < steps) {
    if (opt) opt->zero_grad();
    double loss_sum = 0;
    if (grid) {  // the step's micro-batches through the pipeline, and the step
      data::Example b = train_text.sample(r.batch_size * r.grad_accum, c.block_size, windows);
      // Offload: what the forwards save goes to host memory (a checkpointed block's recompute in
      // backward saves plainly: autograd::checkpoint).
      std::optional<autograd::SaveOnCpu> offload;
      if (r.offload_activations) offload.emplace(/*pin_memory=*/device.is_cuda());
      loss_sum = engine->train_batch(b.data.to(device), b.target.to(device)).item<double>();
    }
    for (int64_t m = 0; engine && !grid && m < r.grad_accum; ++m) {  // the engine's step: it accumulates, clips, steps
      data::Example b = train_text.sample(r.batch_size, c.block_size, windows);
      std::optional<autograd::SaveOnCpu> offload;
      if (r.offload_activations) offload.emplace(/*pin_memory=*/device.is_cuda());
      Tensor logits = (*engine)(b.data.to(device));
      Tensor target = b.target.to(device);
      // curriculum_learning: the engine kept the first curriculum_seqlen() positions; so do the targets.
      if (engine->curriculum_seqlen() > 0) target = target.narrow(1, 0, logits.size(1));
      Tensor loss;
      {
        // With torch_autocast, the loss under the forward's autocast too (float32, by its policy),
        // as a model that computes its loss in forward would.
        AutocastGuard ac(device, engine->autocast_dtype(), engine->autocast_dtype().has_value());
        loss = models::GPT::loss(logits, target);
      }
      offload.reset();
      engine->backward(loss);
      engine->step();
      loss_sum += loss.item<double>() / static_cast<double>(r.grad_accum);
    }
    for (int64_t m = 0; !engine && m < r.grad_accum; ++m) {
      data::Example b = train_text.sample(r.batch_size, c.block_size, windows);
      // With DDP, only the last micro-batch all-reduces (no_sync for the others).
      std::optional<distributed::DistributedDataParallel::NoSync> no_sync;
      if (ddp && m + 1 < r.grad_accum) no_sync.emplace(*ddp);
      std::optional<autograd::SaveOnCpu> offload;
      if (r.offload_activations) offload.emplace(/*pin_memory=*/device.is_cuda());
      Tensor loss;
      {
        AutocastGuard ac(device, low, r.autocast != "none");
        loss = models::GPT::loss(net(b.data.to(device)), b.target.to(device));
      }
      offload.reset();
      if (r.grad_accum > 1) loss = loss / static_cast<double>(r.grad_accum);
      scaler.scale(loss).backward();
      loss_sum += loss.item<double>();
    }
    if (opt) {
      if (r.clip > 0) {
        scaler.unscale_(*opt);  // clip the true gradients, not the scaled ones
        nn::utils::clip_grad_norm_(model.parameters(), r.clip);
      }
      scaler.step(*opt);
      scaler.update();
    }
    ++step;
    if (comm) {
      Tensor mean = full({1}, loss_sum, kFloat64);
      comm->all_reduce(mean, distributed::ReduceOp::Avg);
      loss_sum = mean.item<double>();
    }
    // Every rank sees the same mean. With fp16's loss scaling an overflow skips the step instead.
    KILN_CHECK(std::isfinite(loss_sum) || scaler.is_enabled() || r.autocast == "fp16",
               "step {}: the loss is {}: training diverged; lower --lr or clip the gradients with --clip (the "
               "last checkpoint, if any, is from before it)",
               step, loss_sum);
    last_loss = loss_sum;
    window_sum += loss_sum;
    ++window_steps;
    if (step % log_every == 0 || step == steps) {
      const double mean = window_sum / static_cast<double>(window_steps);
      history.step.push_back(static_cast<double>(step));
      history.loss.push_back(mean);
      log({{"type", "step"}, {"step", step}, {"loss", mean}});
      window_sum = 0;
      window_steps = 0;
    }
    if (!quiet) bar.update(step, loss_sum);
    if (eval_every > 0 && step % eval_every == 0 && step < steps) evaluate();
    if (save_every > 0 && step % save_every == 0 && step < steps) save();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet) bar.finish();
  const double val = evaluate();
  save();
  if (!quiet) {
    std::printf("train_gpt: %lld steps (%.1f ms/step this run), train loss %.4f, validation loss %.4f%s\n",
                static_cast<long long>(step), step > first ? 1e3 * seconds / static_cast<double>(step - first) : 0.0,
                last_loss, val,
                r.autocast == "fp16"
                    ? fmt::format("; loss scale {}, {} steps skipped", engine ? engine->loss_scale() : scaler.get_scale(),
                                  engine ? engine->skipped_steps() : scaler.skipped_steps()).c_str()
                    : "");
  }
  // The DeepSpeed config's comms_logger table, if any, and (without a pipeline) how much of it was
  // waiting for the slowest rank: a collective, so every rank calls it (rank 0 prints).
  if (engine) engine->log_summary(/*show_straggler=*/!engine->is_pipeline_parallel());
  std::string why;
  const std::string png = main_rank ? train::plot_losses(history, out_dir, &why) : "";
  if (main_rank && png.empty() && !quiet) std::printf("train_gpt: no plot: %s\n", why.c_str());

  // With a grid, the stages and slices are gathered into one GPT on the first stage's ranks; rank 0,
  // one of them, samples from it.
  auto all = sample > 0 && !grid ? gathered() : nullptr;
  std::unique_ptr<models::GPT> joined;
  if (sample > 0 && grid) {
    joined = models::ParallelGPT::gather_chunks(chunk_pointers, *grid->pipeline());
    if (!main_rank) joined.reset();  // the other ranks of the first stage get a copy too
    if (joined) joined->to(device);
  }
  models::GPT* sampler = grid ? joined.get() : whole.get();
  if (main_rank && sample > 0) {
    KILN_CHECK(sampler != nullptr, "train_gpt: internal error: rank 0 is not on the grid's first stage");
    const std::string& given = flags.get("prompt");
    std::vector<int64_t> ids(given.begin(), given.end());
    if (ids.empty()) ids.push_back('\n');
    for (auto& id : ids) id = static_cast<uint8_t>(id);
    if (static_cast<int64_t>(ids.size()) > c.block_size) ids.erase(ids.begin(), ids.end() - c.block_size);
    Generator g(r.seed);
    Tensor out = sampler->generate(from_vector(ids, {1, static_cast<int64_t>(ids.size())}, device), sample,
                                   {.temperature = temperature, .top_k = top_k}, &g);
    const std::vector<int64_t> bytes = out.to(Device::cpu()).to_vector<int64_t>();
    std::string raw;  // the file gets the bytes as generated (UTF-8 prompts stay whole); the terminal '?'s
    for (int64_t b : bytes) raw += static_cast<char>(b);
    train::write_file_atomic((fs::path(out_dir) / "sample.txt").string(), raw + "\n");
    const std::string text_out = printable(bytes);
    if (!quiet) std::printf("---- sample (%lld bytes, temperature %g, top-k %lld) ----\n%s\n----\n",
                            static_cast<long long>(sample), temperature, static_cast<long long>(top_k),
                            text_out.c_str());
  }
  if (!quiet) {
    std::printf("train_gpt: checkpoint %s; metrics %s%s%s\n", ckpt_dir.c_str(), metrics_path.c_str(),
                png.empty() ? "" : "; plot ", png.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (...) {
    return train::exit_on_exception("train_gpt", "The run does not fit in this machine's memory: lower "
                                    "--batch-size (--grad-accum keeps the windows per step), --context, "
                                    "--n-layer or --n-embd, or add --checkpoint-activations");
  }
}

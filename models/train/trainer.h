// models/train/trainer.h: the training loop of kiln-train, as a library so that tests can run it:
// build the data, the model, the optimizer and the schedule from TrainOptions; train with a progress
// bar; evaluate after each epoch; write metrics, a plot and checkpoints; resume from a checkpoint.
//
// Started with several ranks (kiln-run -n N, mpirun, srun), it trains data parallel: each rank
// draws its shard of every epoch (DistributedSampler), DistributedDataParallel averages the
// gradients, and rank 0 alone prints, evaluates and writes files. With a DeepSpeed config
// (TrainOptions::deepspeed_config) kiln::Engine does the averaging and the step instead, at any
// ZeRO stage; its sharded checkpoint goes beside checkpoint/, in checkpoint-engine/.
//
// One step is what DESIGN.md §2 shows: forward, cross-entropy, zero_grad, backward, optimizer step
// (docs/training-step.md follows one step through Module, autograd and Optimizer).
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "models/train/plot.h"

namespace kiln::train {

// The values of TrainOptions' named choices; kiln-train's flags and train()'s checks both use them.
struct Choices {
  static const std::vector<std::string> model, dataset, optimizer, scheduler;
};

struct TrainOptions {
  std::string model = "cnn";               // mlp | cnn | resnet
  std::string dataset = "fashion-mnist";   // fashion-mnist | synthetic
  std::string data_root = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 1;  // 0 with resume: the checkpoint's (the number the run was started with)
  int64_t batch_size = 128;  // per rank when data parallel
  std::string optimizer = "adam";  // sgd | adam | adamw | rmsprop | adagrad
  double lr = std::numeric_limits<double>::quiet_NaN();  // NaN: 0.05 for sgd, 1e-3 for the others
  double momentum = std::numeric_limits<double>::quiet_NaN();      // NaN: 0.9 (sgd), 0 (rmsprop)
  double weight_decay = std::numeric_limits<double>::quiet_NaN();  // NaN: 0.01 (adamw), 0 (others)
  // none | step | cosine | onecycle | warmup-cosine (stepped per batch) | plateau (ReduceLROnPlateau
  // on the test loss, per epoch)
  std::string scheduler = "none";
  uint64_t seed = 0;
  std::string device = "cpu";  // cpu | cuda | cuda:N
  int threads = 0;             // 0: every core (shared out among the ranks of a machine)
  int num_workers = 1;         // data-loader threads
  int64_t limit_train = 0;     // > 0: only the first N training samples
  int64_t limit_test = 0;      // > 0: only the first N test samples
  int64_t max_steps = 0;       // > 0: stop (and checkpoint) after this many steps in all
  // The text of a DeepSpeed ds_config.json ("" = none). With one, kiln::Engine trains
  // (distributed/engine/engine.h): the config sets the micro-batch per rank, the gradient
  // accumulation, the optimizer and its schedule, fp16 or bf16, clipping and the ZeRO stage, so
  // batch_size, optimizer, lr, momentum, weight_decay and scheduler must not be given. Each step
  // reads micro-batch x accumulation samples per rank (the last, smaller batch of an epoch is
  // dropped when accumulating), cut into micro-batches.
  std::string deepspeed_config;
  std::string out_dir = "runs/kiln-train";
  std::string resume;          // a checkpoint directory to continue from
  // The settings the command line gave, by flag name ("lr", "batch-size", ...): on resume, one whose
  // value differs from the checkpoint's is an Error (kiln-train fills it; "data-root" may change).
  std::vector<std::string> given;
  int64_t log_every = 10;      // steps between "step" lines (their mean loss) in metrics.jsonl
  bool plot = true;
  bool quiet = false;          // no progress output (tests)
};

struct TrainResult {
  int64_t steps = 0, epochs = 0;
  double last_loss = 0;           // the loss of the last step
  double test_loss = 0, test_accuracy = 0;  // after the last finished epoch (0 when none)
  double train_seconds = 0;       // time in the training loop, this run only
  std::string checkpoint_dir;     // where the final checkpoint is
  std::string plot_path;          // "" when there is no plot
};

// The --device flag's value as a Device: a CUDA device on a machine without a usable GPU is an
// Error that says to use --device cpu (the programs' wording, not the library's).
Device device_flag(const std::string& value);

// Refuses, before it starts, a run whose known allocations alone (`bytes`) exceed this machine's
// physical memory, which would otherwise swap, or be killed part-way: an Error that says what needs
// them (`what`) and which flags to lower (`remedy`).
void check_fits_in_memory(long double bytes, std::string_view what, std::string_view remedy);

// Runs training as `options` says. With options.resume set, the model, data and optimizer settings
// come from the checkpoint; epochs (0: the checkpoint's), max_steps, out_dir, threads, num_workers,
// quiet and plot come from `options`. Throws kiln::Error for bad options, a missing dataset, an
// unwritable out_dir or one another run is writing to, a checkpoint with nothing left to train,
// and a test loss that is not finite (the run diverged; nothing is saved after it).
TrainResult train(const TrainOptions& options, std::FILE* out = stdout);

}  // namespace kiln::train

// models/train/checkpoint.h: a training checkpoint: everything needed to continue a run exactly where
// it stopped, so that N steps, save, load, N steps equals 2N steps bit for bit.
//
// A checkpoint is a directory:
//   model.safetensors      the model's state_dict (parameters and buffers)
//   optimizer.safetensors  the optimizer's state_dict (state tensors, group hyperparameters, steps)
//   scheduler.safetensors  the learning-rate scheduler's counters (absent when there is none)
//   scaler.safetensors     the float16 GradScaler's scale and counters (absent when there is none)
//   checkpoint.json        the manifest: format, step, epoch, data-loader position, RNG state, the
//                          run's configuration and the trainer's running sums
// A save writes a new directory beside the old one and swaps the two in one rename (Note [replacing
// a checkpoint whole] in checkpoint.cpp), so the directory always holds one whole checkpoint, never
// files of two saves; a crash mid-save leaves the previous one whole. The directory is Kiln's: a
// save replaces it with everything in it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/tensor_dict.h"
#include "data/dataloader.h"

namespace kiln::train {

struct Checkpoint {
  TensorDict model, optimizer, scheduler;
  TensorDict scaler;  // optim::GradScaler::state_dict(); empty without one (and from older checkpoints)
  int64_t step = 0;   // optimizer steps taken
  int64_t epoch = 0;  // epochs finished
  data::DataLoader::State loader;
  Generator::State rng{0, 0};
  std::string config;  // the run's configuration, a JSON object (text)
  std::string extra;   // the trainer's own state, a JSON object (text)
};

void save_checkpoint(const std::string& dir, const Checkpoint& ckpt);
// An Error naming the file and what is wrong when the directory holds no complete checkpoint.
Checkpoint load_checkpoint(const std::string& dir);

// Opens a run's metrics file (JSON lines, each with its "step") to write, and returns it: a fresh
// file, or with `resume`, the old one to append to, without the lines of steps after `step`, the
// checkpoint's. Those a run wrote after its last checkpoint before it stopped; the resumed run
// writes them again. An Error naming the path when it cannot be written.
std::FILE* open_metrics(const std::string& path, bool resume, int64_t step);

// A run's output directory (--out), made ready and held: the constructor creates it and checks that
// it can be written and that no file stands where checkpoint/ goes (Errors before any training,
// not at the first save), then takes an exclusive lock (flock on <dir>/.lock) for as long as the
// object lives, so a second run started on the same directory gets an Error naming it instead of
// mixing its metrics, checkpoints and sample with the first run's. The kernel drops the lock when
// the process ends.
class OutDirLock {
 public:
  explicit OutDirLock(const std::string& dir);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

 private:
  int fd_ = -1;
};

// On --resume the checkpoint's settings hold. `saved` and `wanted` are a run's configuration as
// JSON objects (text): the checkpoint's, and the one the command line asked for. For each (flag,
// key) in `given`, a setting the command line gave, the two must agree at `key`; otherwise an
// Error naming the flag, both values and `source` (the checkpoint's path).
void check_resume_flags(const std::string& saved, const std::string& wanted,
                        const std::vector<std::pair<std::string, std::string>>& given, const std::string& source);

// With a DeepSpeed config, kiln-train and train_gpt also save kiln::Engine's checkpoint (one ZeRO
// shard per rank) beside theirs: in <checkpoint>-engine/<tag>, the tag named by "engine_tag" in
// the checkpoint's extra JSON.
std::string engine_dir_of(const std::string& ckpt_dir);
// The engine checkpoint's tag that `ckpt` names; an Error naming `source` (its path) when it names
// none: it was written without a DeepSpeed config, or is damaged.
std::string engine_tag_of(const Checkpoint& ckpt, const std::string& source);
// Removes the engine checkpoints beside `ckpt_dir` but the one of `tag`, which it names now.
void remove_other_engine_checkpoints(const std::string& ckpt_dir, const std::string& tag);

// Appends `line` and a newline to the metrics file `f` (nothing when f is null: a rank other than 0)
// and flushes it; an Error naming `path` when the write fails (a full disk, say).
void write_metrics_line(std::FILE* f, const std::string& path, const std::string& line);

// Writes `text` to `path` atomically (temporary file in the same directory, fsync, rename, fsync of
// the directory). An Error naming the path on failure; the old file is then untouched.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace kiln::train

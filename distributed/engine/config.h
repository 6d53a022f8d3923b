// distributed/engine/config.h: Config, a DeepSpeed configuration (ds_config.json) read strictly.
//
//   auto cfg = Config::from_file("ds_config.json");   // an Error names any key that is wrong
//   auto engine = kiln::initialize(model, cfg);       // distributed/engine/engine.h
//
// The keys are DeepSpeed's (https://www.deepspeed.ai/docs/config-json/), with its defaults; Kiln
// implements this subset of them:
//
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
//   gradient_clipping, steps_per_print, wall_clock_breakdown, memory_breakdown, zero_allow_untested_optimizer
//   communication_data_type (fp16 | bf16 | fp32), prescale_gradients, gradient_predivide_factor:
//                  how the gradients are averaged, kept in zero_optimization (ZeroOptions)
//   data_types    {grad_accum_dtype}: the dtype the gradients accumulate in (ZeroOptions; unset,
//                  Engine takes DeepSpeed's default: float32 for bf16 at stage 0, else the model's)
//   optimizer     {type: Adam | AdamW | SGD | Adagrad | RMSprop, params: {lr, betas, eps, weight_decay,
//                  adam_w_mode, amsgrad, momentum, dampening, nesterov, alpha, centered, lr_decay, ...}}
//   scheduler     {type: WarmupLR | WarmupDecayLR | WarmupCosineLR, params: {...}}
//   fp16          {enabled, auto_cast, loss_scale, initial_scale_power, loss_scale_window,
//                  hysteresis, consecutive_hysteresis, min_loss_scale}
//   bf16          {enabled}
//   torch_autocast {enabled, dtype, lower_precision_safe_modules}: a float32 model's forward under
//                  autocast, the listed modules' gradients (and stage 3's gathers) in its dtype
//   curriculum_learning {enabled, curriculum_type (seqlen), min_difficulty, max_difficulty,
//                  schedule_type (fixed_linear | fixed_root | fixed_discrete), schedule_config:
//                  {total_curriculum_step, difficulty_step, root_degree, difficulty, max_step}}:
//                  the sequence length grows by the schedule (distributed/engine/curriculum.h)
//   zero_optimization {stage, reduce_bucket_size, allgather_bucket_size, overlap_comm (default: on
//                  at stage 3 only, as DeepSpeed),
//                  contiguous_gradients, reduce_scatter, allgather_partitions,
//                  offload_optimizer: {device: none | cpu, pin_memory},
//                  offload_param: {device: none | cpu, pin_memory} (stage 3),
//                  sub_group_size (stage 3 steps its partition in sub-groups of about this size),
//                  mics_shard_size (stage 3 shards over groups of this many ranks: MiCS),
//                  zero_hpz_partition_size (stage 3's backward gathers within groups of this many
//                  ranks: ZeRO++'s hpZ), zero_quantized_weights (stage 3's weight gathers in int8
//                  blocks: ZeRO++'s qwZ), zero_quantized_gradients (stage 3's gradient reduction
//                  as int8 all-to-alls: ZeRO++'s qgZ),
//                  stage3_prefetch_bucket_size, stage3_param_persistence_threshold,
//                  stage3_model_persistence_threshold,
//                  stage3_max_live_parameters, stage3_max_reuse_distance,
//                  stage3_gather_16bit_weights_on_model_save (or its older name, ..._fp16_...)}
//   activation_checkpointing {partition_activations, cpu_checkpointing,
//                  synchronize_checkpoint_boundary, profile (the blocks' times, printed every
//                  steps_per_print steps), number_checkpoints (checked, no effect);
//                  contiguous_memory_optimization only false}: how the blocks a model checkpoints keep
//                  their inputs and are timed (nn::ActivationCheckpointing); checkpointing itself is
//                  the model's switch
//   flops_profiler {enabled, profile_step, module_depth, top_modules, detailed, output_file,
//                  recompute_fwd_factor}: nn::FlopsProfiler on rank 0's forward at profile_step
//   checkpoint    {tag_validation (Warn | Ignore | Fail); load_universal, use_node_local_storage,
//                  parallel_write.pipeline_stage only false}
//   comms_logger  {enabled, verbose, prof_all, debug, prof_ops}: the engine's communication timed
//                  (distributed::CommsLogger; Engine::log_summary)
//   tensorboard, csv_monitor {enabled, output_path, job_name}: the training events written by rank 0
//                  (DeepSpeed's monitors; "wandb" and "comet" need their services and are refused)
//
// "Strictly": a key Kiln does not know is an Error naming it, where it is, the keys allowed there and
// the closest of them ("did you mean"); a DeepSpeed key that Kiln does not implement is an Error
// saying so, unless its value asks for nothing (false, null, {"enabled": false}, a factor of 1:
// DeepSpeed's "off", which configs written for it often spell out); so are a key given twice in one object (JSON allows it, and the last would silently
// win), a value of the wrong type ("stage": "2"), and one out of range. Batch sizes are checked when
// the world size is known (resolve_batch), with DeepSpeed's arithmetic shown:
//   train_batch_size 64 != micro 4 x accumulation 4 x data-parallel 2 = 32
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distributed/comm/comms_logger.h"
#include "distributed/engine/curriculum.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/container.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/rmsprop.h"
#include "optim/sgd.h"
#include "optim/warmup_lr.h"

namespace kiln {

struct Config {
  // ---- batch (any two determine the third, given the data-parallel size) ----
  std::optional<int64_t> train_batch_size;                // samples per optimizer step, all ranks
  std::optional<int64_t> train_micro_batch_size_per_gpu;  // samples per forward/backward, per rank
  std::optional<int64_t> gradient_accumulation_steps;     // micro-batches per optimizer step

  double gradient_clipping = 0;        // max global norm of the gradients; 0: no clipping
  int64_t steps_per_print = 10;        // rank 0 prints the step, lr and loss scale this often
  bool wall_clock_breakdown = false;   // ... and the time spent in forward, backward and step
  bool memory_breakdown = false;       // ... and the tensor memory: now, and the peak since the last print
  bool zero_allow_untested_optimizer = false;  // accepted for compatibility: ZeRO takes every Kiln optimizer

  // "flops_profiler" (DeepSpeed's keys and defaults): rank 0 profiles the first forward of the step
  // that starts after profile_step steps (nn::FlopsProfiler), and prints the profile with the
  // backward's and the step's latencies when that step ends (or writes it to output_file).
  struct FlopsProfiler {
    bool enabled = false;
    int64_t profile_step = 1;
    int module_depth = -1;  // -1: every depth
    int top_modules = 1;
    bool detailed = true;
    std::string output_file;  // empty: stdout
    // Checkpointed blocks run their forward again in backward: fwd+bwd flops are (3 + this) x fwd.
    double recompute_fwd_factor = 0;
  };
  FlopsProfiler flops_profiler;

  // "checkpoint": {"tag_validation": "Warn" | "Ignore" | "Fail"} (DeepSpeed's, its default Warn):
  // save_checkpoint compares the tag the ranks pass, and a mismatch is a warning from rank 0 or an
  // Error on every rank. Kept lower-case.
  std::string checkpoint_tag_validation = "warn";

    // "comms_logger" (DeepSpeed's keys and defaults): the engine's communication is timed, made
  // blocking (distributed/comm/comms_logger.h); Engine::log_summary prints the table.
  distributed::CommsLoggerOptions comms_logger;

  // "tensorboard" and "csv_monitor" (DeepSpeed's monitors): rank 0 writes the training events
  // (Train/Samples/train_loss, lr, loss_scale, ...) under output_path/job_name/
  // (distributed/engine/monitor.h).
  struct Monitor {
    bool enabled = false;
    std::string output_path;  // "": the working directory
    std::string job_name = "DeepSpeedJobName";
  };
  Monitor tensorboard, csv_monitor;

  // "optimizer": the type picks the struct its params fill (DeepSpeed's types, any case). DeepSpeed's
  // "Adam" is its FusedAdam, whose weight decay is decoupled (AdamW's) unless "adam_w_mode": false,
  // and whose weight_decay defaults to 0, for "AdamW" too.
  struct Optimizer {
    std::string type = "adam";  // "adam", "adamw", "sgd", "adagrad", "rmsprop"
    bool adam_w_mode = true;
    optim::AdamWOptions adam{.weight_decay = 0};  // "adam" and "adamw"; betas are beta1, beta2
    optim::SGDOptions sgd;                        // lr is required, as torch.optim.SGD's
    optim::AdagradOptions adagrad;
    optim::RMSpropOptions rmsprop;
  };
  std::optional<Optimizer> optimizer;

  // "scheduler": DeepSpeed's warmup schedules (optim/warmup_lr.h), stepped once per optimizer step.
  struct Scheduler {
    std::string type;  // "WarmupLR", "WarmupDecayLR" or "WarmupCosineLR"
    optim::WarmupLROptions warmup_lr;
    optim::WarmupDecayLROptions warmup_decay_lr;
    optim::WarmupCosineLROptions warmup_cosine_lr;
  };
  std::optional<Scheduler> scheduler;

  struct Fp16 {
    bool enabled = false;
    bool auto_cast = false;  // cast the floating inputs of forward to float16
    optim::GradScalerOptions scaler;  // loss_scale, initial_scale_power, ... (DeepSpeed's defaults)
  } fp16;
  struct Bf16 {
    bool enabled = false;
  } bf16;
  // "torch_autocast" (DeepSpeed's): the model stays float32 and Engine runs its forward under
  // autocast (AutocastGuard, ops/autocast.h) to dtype; the parameters of the modules of the listed
  // classes (by name(); unset, ZeroOptions' default: Linear, Conv1d, Conv2d, Conv3d) have their
  // gradients averaged, and at stage 3 their weights gathered, in dtype (ZeroOptions::autocast_dtype).
  // With float16, the loss is scaled by PyTorch's GradScaler rule (2^16, halved at each overflow,
  // doubled after 2000 good steps), as DeepSpeed's torch.amp.GradScaler.
  struct TorchAutocast {
    bool enabled = false;
    std::optional<DType> dtype;  // unset: the device's autocast default (CPU bfloat16, CUDA float16)
    std::optional<std::vector<std::string>> lower_precision_safe_modules;  // class names
  } torch_autocast;
  // "curriculum_learning" (DeepSpeed's legacy form): the sequence length grows by a schedule, and
  // Engine's forward keeps that many positions of the input's dim 1 (distributed/engine/curriculum.h).
  CurriculumOptions curriculum_learning;

  // The "zero_optimization" section, the top-level keys of how the gradients are averaged, and
  // data_types.grad_accum_dtype.
  distributed::ZeroOptions zero_optimization{.stage = 0};
  // Where the section is given, kiln::initialize passes it to the modules it trains that take it
  // (nn::ConfiguresCheckpointing); where it is not, their settings stay as they are.
  std::optional<nn::ActivationCheckpointing> activation_checkpointing;

  // Reads and checks a DeepSpeed JSON configuration; `source` names it in Errors.
  static Config from_file(const std::string& path);
  static Config from_string(const std::string& json, const std::string& source = "config");

  // The three batch sizes for `world_size` data-parallel ranks, as DeepSpeed derives them:
  // given two, the third; given only train_batch_size, accumulation 1; given only the micro-batch,
  // accumulation 1. An Error shows the arithmetic when they do not agree.
  struct Batch {
    int64_t train_batch_size, micro_batch_size, gradient_accumulation_steps;
  };
  Batch resolve_batch(int world_size) const;
};

}  // namespace kiln

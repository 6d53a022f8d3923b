// tests/distributed/test_engine.cpp: the DeepSpeed-style Config (every kind of bad key and value is
// an Error naming it) and Engine (accumulation, clipping, fp16 loss scaling, ZeRO stages, the
// schedule, checkpoints resumed at another world size), against one process doing the same
// arithmetic by hand.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/safetensors.h"
#include "data/tensorboard.h"
#include "models/gpt.h"
#include "parity.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_close;
using kiln::test::batch;
using kiln::test::check_error;
using kiln::test::Mlp;
using kiln::test::shared_temp_dir;

namespace {

// Layers `which` (0, 1, 2: f1, f2, f3) of an Mlp, copied, with its ReLUs: a stage of a pipeline (no
// layers: one that passes its input on).
struct MlpStage : nn::Module {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  bool ends_model;
  MlpStage(Mlp& whole, const std::vector<int>& which) : ends_model(!which.empty() && which.back() == 2) {
    nn::Linear* src[] = {&whole.f1, &whole.f2, &whole.f3};
    NoGradGuard no_grad;
    for (int i : which) {
      auto l = std::make_shared<nn::Linear>(src[i]->weight.size(1), src[i]->weight.size(0));
      l->weight.copy_(src[i]->weight);
      l->bias.copy_(src[i]->bias);
      register_module(fmt::format("f{}", i + 1), l);
      layers.push_back(l);
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (size_t k = 0; k < layers.size(); ++k) {
      h = (*layers[k])(h);
      if (!ends_model || k + 1 < layers.size()) h = relu(h);
    }
    return h;
  }
};

// The Mlp's layers on pipeline stage `s` of `stages` (1 or 2): all three, or f1 and f2, then f3.
std::vector<int> mlp_stage_layers(int stages, int s) {
  if (stages == 1) return {0, 1, 2};
  return s == 0 ? std::vector<int>{0, 1} : std::vector<int>{2};
}

}  // namespace

TEST_CASE("engine config: a DeepSpeed config is read with its defaults", "[distributed]") {
  const Config cfg = Config::from_string(R"({
    "train_batch_size": 64, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0, "steps_per_print": 50,
    "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100,
                                                     "warmup_max_lr": 3e-4, "warmup_type": "linear"}},
    "fp16": {"enabled": true, "initial_scale_power": 12, "hysteresis": 3},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "overlap_comm": true, "contiguous_gradients": true,
                          "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "sub_group_size": 0, "stage3_prefetch_bucket_size": 2e6, "stage3_max_reuse_distance": 0,
                          "stage3_model_persistence_threshold": 1e6}
  })");
  CHECK(*cfg.train_batch_size == 64);
  CHECK_FALSE(cfg.train_micro_batch_size_per_gpu.has_value());
  CHECK(cfg.gradient_clipping == 1.0);
  CHECK(cfg.steps_per_print == 50);
  REQUIRE(cfg.optimizer);
  CHECK(cfg.optimizer->type == "adam");
  CHECK(cfg.optimizer->adam_w_mode);  // DeepSpeed's Adam decouples its weight decay by default
  CHECK(cfg.optimizer->adam.beta1 == 0.8);
  CHECK(cfg.optimizer->adam.beta2 == 0.95);
  CHECK(cfg.optimizer->adam.weight_decay == 0.1);
  REQUIRE(cfg.scheduler);
  CHECK(cfg.scheduler->warmup_decay_lr.total_num_steps == 100);
  CHECK(cfg.scheduler->warmup_decay_lr.warmup_type == "linear");
  CHECK(cfg.fp16.enabled);
  CHECK(cfg.fp16.scaler.initial_scale_power == 12);
  CHECK(cfg.fp16.scaler.hysteresis == 3);
  CHECK(cfg.fp16.scaler.loss_scale_window == 1000);  // DeepSpeed's default
  CHECK(cfg.zero_optimization.stage == 2);
  CHECK(cfg.zero_optimization.reduce_bucket_size == 500'000'000);
  CHECK(cfg.zero_optimization.overlap_comm);
  CHECK(cfg.zero_optimization.offload_optimizer);
  CHECK_FALSE(cfg.zero_optimization.offload_param);
  CHECK(cfg.zero_optimization.sub_group_size == 0);
  CHECK(Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                                  "offload_param": {"device": "cpu", "pin_memory": true}}})")
            .zero_optimization.offload_param);
  CHECK(Config::from_string(R"({"train_batch_size": 8})").zero_optimization.sub_group_size == 1'000'000'000);
  CHECK_FALSE(Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"offload_param": {"device": "none"}}})")
                  .zero_optimization.offload_param);
  CHECK(cfg.zero_optimization.stage3_prefetch_bucket_size == 2'000'000);
  CHECK(cfg.zero_optimization.stage3_max_reuse_distance == 0);
  CHECK(cfg.zero_optimization.stage3_model_persistence_threshold == 1'000'000);
  CHECK(cfg.zero_optimization.stage3_param_persistence_threshold == 100'000);  // DeepSpeed's defaults
  CHECK(cfg.zero_optimization.stage3_max_live_parameters == 1'000'000'000);
  CHECK_FALSE(cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  CHECK(Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                                  "stage3_gather_16bit_weights_on_model_save": true}})")
            .zero_optimization.stage3_gather_16bit_weights_on_model_save);
  CHECK(Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                                  "stage3_gather_fp16_weights_on_model_save": true}})")
            .zero_optimization.stage3_gather_16bit_weights_on_model_save);  // DeepSpeed's older name
  CHECK_FALSE(cfg.activation_checkpointing.has_value());
  const Config ac = Config::from_string(R"({"train_batch_size": 8, "activation_checkpointing": {
      "partition_activations": true, "cpu_checkpointing": true, "contiguous_memory_optimization": false,
      "number_checkpoints": null, "synchronize_checkpoint_boundary": false, "profile": false}})");
  CHECK(ac.activation_checkpointing->partition_activations);
  CHECK(ac.activation_checkpointing->cpu_checkpointing);
  CHECK_FALSE(ac.activation_checkpointing->synchronize_checkpoint_boundary);
  CHECK(ac.activation_checkpointing->profile == nullptr);
  const Config timed = Config::from_string(R"({"train_batch_size": 8, "activation_checkpointing": {
      "synchronize_checkpoint_boundary": true, "profile": true}})");
  CHECK(timed.activation_checkpointing->synchronize_checkpoint_boundary);
  CHECK(timed.activation_checkpointing->profile != nullptr);
  const Config defaults =
      Config::from_string(R"({"train_batch_size": 8, "activation_checkpointing": {"number_checkpoints": 4}})");
  REQUIRE(defaults.activation_checkpointing.has_value());
  CHECK_FALSE(defaults.activation_checkpointing->partition_activations);  // DeepSpeed's defaults
  CHECK_FALSE(defaults.activation_checkpointing->cpu_checkpointing);
  const Config::Batch b = cfg.resolve_batch(2);
  CHECK(b.micro_batch_size == 8);  // 64 / 2 ranks / 4 steps
  CHECK(b.gradient_accumulation_steps == 4);
  const Config micro = Config::from_string(R"({"train_micro_batch_size_per_gpu": 4})");
  CHECK(micro.resolve_batch(3).train_batch_size == 12);
  CHECK(micro.resolve_batch(3).gradient_accumulation_steps == 1);
  CHECK(Config::from_string(R"({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2})")
            .resolve_batch(3).gradient_accumulation_steps == 2);
  CHECK(Config::from_string(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 5})")
            .resolve_batch(2).train_batch_size == 20);
}

TEST_CASE("engine config: comms_logger, tensorboard and csv_monitor are read with DeepSpeed's defaults",
          "[distributed]") {
  Config cfg = Config::from_string(R"({"train_batch_size": 8, "comms_logger": {"enabled": true},
                                       "tensorboard": {"enabled": true}, "csv_monitor": {"enabled": false}})");
  CHECK(cfg.comms_logger.enabled);
  CHECK_FALSE(cfg.comms_logger.verbose);
  CHECK(cfg.comms_logger.prof_all);
  CHECK_FALSE(cfg.comms_logger.debug);
  CHECK(cfg.comms_logger.prof_ops.empty());
  CHECK(cfg.tensorboard.enabled);
  CHECK(cfg.tensorboard.output_path.empty());
  CHECK(cfg.tensorboard.job_name == "DeepSpeedJobName");
  CHECK_FALSE(cfg.csv_monitor.enabled);
  cfg = Config::from_string(R"({"train_batch_size": 8,
      "comms_logger": {"enabled": true, "verbose": true, "prof_all": false, "debug": true,
                       "prof_ops": ["all_reduce", "all_gather_into_tensor"]},
      "csv_monitor": {"enabled": true, "output_path": "logs/", "job_name": "run1"}})");
  CHECK(cfg.comms_logger.verbose);
  CHECK_FALSE(cfg.comms_logger.prof_all);
  CHECK(cfg.comms_logger.debug);
  CHECK(cfg.comms_logger.prof_ops == std::vector<std::string>{"all_reduce", "all_gather_into_tensor"});
  CHECK(cfg.csv_monitor.output_path == "logs/");
  CHECK(cfg.csv_monitor.job_name == "run1");
  CHECK(cfg.checkpoint_tag_validation == "warn");  // DeepSpeed's default
  cfg = Config::from_string(R"({"train_batch_size": 8, "checkpoint": {"tag_validation": "FAIL",
      "load_universal": false, "use_node_local_storage": false, "parallel_write": {"pipeline_stage": false}}})");
  CHECK(cfg.checkpoint_tag_validation == "fail");
}

TEST_CASE("engine config: DeepSpeed options that Kiln does not implement are accepted where they are off",
          "[distributed]") {
  // As configs written for DeepSpeed (Megatron-DeepSpeed's, DeepSpeedExamples') carry them.
  const Config cfg = Config::from_string(R"({
    "train_batch_size": 8, "prescale_gradients": false, "gradient_predivide_factor": 1.0,
    "sparse_gradients": false, "memory_breakdown": false, "dump_state": false, "communication_data_type": null,
    "tensorboard": {"enabled": false, "output_path": "", "job_name": "x"}, "wandb": {"enabled": false},
    "csv_monitor": {"enabled": false}, "flops_profiler": {"enabled": false, "profile_step": 1, "detailed": true},
    "comms_logger": {"enabled": false}, "curriculum_learning": {"enabled": false},
    "amp": {"enabled": false, "opt_level": "O1"}, "elasticity": {"enabled": false}, "autotuning": {"enabled": false},
    "data_types": {"grad_accum_dtype": null},
    "bf16": {"enabled": false, "immediate_grad_update": false}, "fp16": {"enabled": false, "fp16_master_weights_and_grads": false},
    "zero_optimization": {"stage": 2, "round_robin_gradients": false, "elastic_checkpoint": false,
                          "cpu_offload": false, "mics_shard_size": -1, "zero_hpz_partition_size": 1,
                          "zero_quantized_weights": false, "zero_quantized_gradients": false,
                          "offload_optimizer": {"device": "cpu", "nvme_path": null, "pipeline_read": false,
                                                "fast_init": false, "ratio": 1.0}}
  })");
  CHECK(cfg.zero_optimization.stage == 2);
  CHECK(cfg.zero_optimization.offload_optimizer);
  CHECK_FALSE(cfg.fp16.enabled);
  CHECK_FALSE(cfg.tensorboard.enabled);
  CHECK_FALSE(cfg.comms_logger.enabled);
  // Still typo-checked: a key that is not DeepSpeed's is an Error whatever its value.
  check_error([] { Config::from_string(R"({"train_batch_size": 8, "tensorbord": {"enabled": false}})"); },
              {"\"tensorbord\" is not a key Kiln knows"});
}

TEST_CASE("engine: communication_data_type, prescale_gradients and gradient_predivide_factor reach ZeRO",
          "[distributed]") {
  const Config off = Config::from_string(R"({"train_batch_size": 8, "prescale_gradients": false,
                                             "gradient_predivide_factor": 1.0, "communication_data_type": null})");
  // null is DeepSpeed's default for each.
  const Config nulls = Config::from_string(R"({"train_batch_size": 8, "prescale_gradients": null,
      "gradient_predivide_factor": null, "memory_breakdown": null, "data_types": null})");
  CHECK_FALSE(nulls.zero_optimization.prescale_gradients);
  CHECK(nulls.zero_optimization.gradient_predivide_factor == 1.0);
  CHECK_FALSE(nulls.memory_breakdown);
  CHECK_FALSE(nulls.zero_optimization.grad_accum_dtype.has_value());
  CHECK_FALSE(off.zero_optimization.communication_data_type.has_value());
  CHECK_FALSE(off.zero_optimization.prescale_gradients);
  CHECK(off.zero_optimization.gradient_predivide_factor == 1.0);
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, DType>>{
           {"fp16", kFloat16}, {"BF16", kBFloat16}, {"bfp16", kBFloat16}, {"fp32", kFloat32}}) {
    INFO(name);
    const Config c = Config::from_string(R"({"train_batch_size": 8, "communication_data_type": ")" + name + "\"}");
    CHECK(c.zero_optimization.communication_data_type == dtype);
  }
  // Given at the top level, as DeepSpeed's, and applied at any stage.
  auto comm = init("mpi");
  manual_seed(1);
  Mlp m;
  Engine engine = kiln::initialize(m, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "bf16": {"enabled": true},
      "communication_data_type": "fp32", "gradient_predivide_factor": 2, "zero_optimization": {"stage": 2}})"), comm);
  CHECK(engine.optimizer().options().communication_data_type == kFloat32);
  CHECK(engine.optimizer().options().gradient_predivide_factor == 2.0);
  CHECK_FALSE(engine.optimizer().options().prescale_gradients);
  CHECK(engine.optimizer().options().stage == 2);
}

TEST_CASE("engine config: torch_autocast is read as DeepSpeed's", "[distributed]") {
  const Config off = Config::from_string(R"({"train_batch_size": 8})");
  CHECK_FALSE(off.torch_autocast.enabled);
  CHECK_FALSE(off.torch_autocast.dtype.has_value());
  CHECK_FALSE(off.torch_autocast.lower_precision_safe_modules.has_value());
  const Config on = Config::from_string(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true,
      "dtype": "bfloat16", "lower_precision_safe_modules": ["torch.nn.Linear", "torch.nn.modules.conv.Conv2d",
      "kiln::nn::Conv1d", "Embedding"]}})");
  CHECK(on.torch_autocast.enabled);
  CHECK(on.torch_autocast.dtype == kBFloat16);
  CHECK(*on.torch_autocast.lower_precision_safe_modules ==
        std::vector<std::string>{"Linear", "Conv2d", "Conv1d", "Embedding"});
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, DType>>{
           {"fp16", kFloat16}, {"torch.float16", kFloat16}, {"half", kFloat16}, {"bf16", kBFloat16},
           {"torch.bfloat16", kBFloat16}}) {
    INFO(name);
    CHECK(Config::from_string(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true, "dtype": ")" + name + "\"}}")
              .torch_autocast.dtype == dtype);
  }
  // Off, as configs written for DeepSpeed carry it, and an empty list (nothing travels in 16 bits).
  CHECK_FALSE(Config::from_string(R"({"train_batch_size": 8, "bf16": {"enabled": true},
      "torch_autocast": {"enabled": false, "dtype": "float16"}})").torch_autocast.enabled);
  CHECK(Config::from_string(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true,
      "lower_precision_safe_modules": []}})").torch_autocast.lower_precision_safe_modules->empty());
  auto bad = [](const std::string& json, const std::vector<std::string>& fragments) {
    check_error([&] { Config::from_string(json, "ds_config.json"); }, fragments);
  };
  bad(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true, "dtype": "fp32"}})",
      {"\"torch_autocast.dtype\" must be \"bfloat16\" or \"float16\"", "float32 is no autocast"});
  bad(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true, "dtype": "int8"}})",
      {"\"torch_autocast.dtype\" must be", "not \"int8\""});
  bad(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true, "lower_precision_safe_modules": "Linear"}})",
      {"\"torch_autocast.lower_precision_safe_modules\" must be a list of module classes"});
  bad(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true, "lower_precision_safe_modules": ["torch.nn."]}})",
      {"holds \"torch.nn.\", which names no class"});
  bad(R"({"train_batch_size": 8, "torch_autocast": {"enabled": true, "dtyp": "bf16"}})",
      {"\"torch_autocast.dtyp\" is not a key Kiln knows", "did you mean \"dtype\""});
  bad(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "torch_autocast": {"enabled": true}})",
      {"\"torch_autocast\" is enabled, and so is \"bf16\"", "use one of the two"});
  bad(R"({"train_batch_size": 8, "communication_data_type": "bf16", "torch_autocast": {"enabled": true}})",
      {"\"communication_data_type\" is bfloat16, and torch_autocast is enabled", "set \"fp32\""});
}

TEST_CASE("engine config: curriculum_learning is read as DeepSpeed's, and its schedules step as DeepSpeed's",
          "[distributed]") {
  auto config = [](const std::string& schedule) {
    return Config::from_string(R"({"train_batch_size": 8, "curriculum_learning": {"enabled": true,
        "curriculum_type": "seqlen", "min_difficulty": 16, "max_difficulty": 128, )" + schedule + "}}");
  };
  // DeepSpeed's arithmetic: floor(progress (max - min) + min), down to a multiple of difficulty_step.
  const Config linear = config(R"("schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8})");
  CHECK(linear.curriculum_learning.enabled);
  CHECK(linear.curriculum_learning.total_curriculum_step == 100);
  CurriculumScheduler lin(linear.curriculum_learning);
  CHECK(lin.get_current_difficulty() == 16);
  const std::vector<std::pair<int64_t, int64_t>> linear_steps = {{0, 16}, {1, 16}, {10, 24}, {50, 72}, {99, 120},
                                                                 {100, 128}, {150, 128}};
  for (const auto& [step, d] : linear_steps) {
    INFO("fixed_linear, step " << step);
    CHECK(lin.get_difficulty(step) == d);
  }
  CurriculumScheduler sqrt(config(R"("schedule_type": "fixed_root",
      "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8, "root_degree": 2})").curriculum_learning);
  const std::vector<std::pair<int64_t, int64_t>> root_steps = {{0, 16}, {1, 24}, {25, 72}, {64, 104}, {99, 120},
                                                               {100, 128}};
  for (const auto& [step, d] : root_steps) {
    INFO("fixed_root 2, step " << step);
    CHECK(sqrt.get_difficulty(step) == d);
  }
  CurriculumScheduler cube(config(R"("schedule_type": "fixed_root",
      "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8, "root_degree": 3})").curriculum_learning);
  CHECK(cube.get_difficulty(1) == 40);
  CHECK(cube.get_difficulty(8) == 64);
  CHECK(cube.get_difficulty(27) == 88);
  CurriculumScheduler discrete(config(R"("schedule_type": "fixed_discrete",
      "schedule_config": {"difficulty": [16, 64, 128], "max_step": [5, 10]})").curriculum_learning);
  for (int64_t step = 0; step <= 12; ++step) {
    INFO("fixed_discrete, step " << step);
    CHECK(discrete.get_difficulty(step) == (step <= 5 ? 16 : step <= 10 ? 64 : 128));
  }
  // The current difficulty follows the schedule until it reaches the maximum, then stays.
  CHECK(discrete.update_difficulty(6) == 64);
  CHECK(discrete.update_difficulty(2) == 16);
  CHECK(discrete.update_difficulty(11) == 128);
  CHECK(discrete.update_difficulty(3) == 128);
  // Off, with DeepSpeed's other keys, as configs carry it.
  CHECK_FALSE(Config::from_string(R"({"train_batch_size": 8, "curriculum_learning": {"enabled": false,
      "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}})").curriculum_learning.enabled);
  auto bad = [&](const std::string& schedule, const std::vector<std::string>& fragments) {
    check_error([&] { config(schedule); }, fragments);
  };
  bad(R"("schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 100})",
      {"\"curriculum_learning.schedule_config\" needs \"difficulty_step\" for the fixed_linear schedule"});
  bad(R"("schedule_type": "fixed_root", "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8})",
      {"needs \"root_degree\" for the fixed_root schedule"});
  bad(R"("schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 32})",
      {"min_difficulty 16 is below difficulty_step 32", "round down to 0"});
  bad(R"("schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [16, 64], "max_step": [5, 10]})",
      {"2 difficulties and 2 max steps"});
  bad(R"("schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [16, 64, 256], "max_step": [5, 10]})",
      {"difficulty[2] is 256", "max_difficulty 128"});
  bad(R"("schedule_type": "linear", "schedule_config": {})", {"schedule_type \"linear\" is not one of DeepSpeed's"});
  bad(R"("schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 100, "difficulty_stp": 8})",
      {"\"curriculum_learning.schedule_config.difficulty_stp\" is not a key Kiln knows",
       "did you mean \"difficulty_step\""});
  check_error([] { Config::from_string(R"({"train_batch_size": 8, "curriculum_learning": {"enabled": true,
      "curriculum_type": "seqlen", "max_difficulty": 64, "schedule_type": "fixed_linear", "schedule_config": {}}})"); },
              {"\"curriculum_learning.min_difficulty\" is required when curriculum learning is enabled"});
  check_error([] { Config::from_string(R"({"train_batch_size": 8, "curriculum_learning": {"enabled": true,
      "curriculum_type": "vocab", "min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}})"); },
              {"curriculum_type \"vocab\" is not one Kiln applies"});
}

TEST_CASE("engine: curriculum_learning cuts the training sequences to the schedule's length, forward and pipeline",
          "[distributed]") {
  auto comm = init("mpi");
  const std::string curriculum = R"("curriculum_learning": {"enabled": true, "curriculum_type": "seqlen",
      "min_difficulty": 4, "max_difficulty": 16, "schedule_type": "fixed_discrete",
      "schedule_config": {"difficulty": [4, 8, 16], "max_step": [1, 2]}})";
  // A GPT: the engine keeps the first positions of each training forward's tokens.
  models::GPTConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 16;
  c.vocab_size = 12;
  manual_seed(3);
  models::GPT gpt(c);
  Engine engine = kiln::initialize(gpt, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, )" + curriculum + "}"), comm);
  CHECK(engine.curriculum_seqlen() == 4);
  Generator data(5);
  for (int64_t step = 1; step <= 4; ++step) {
    INFO("step " << step);
    Tensor idx = randint(0, c.vocab_size, {2, 16}, kInt64, &data);
    const Tensor logits = engine(idx);
    const int64_t expected = step <= 1 ? 4 : step <= 2 ? 8 : 16;  // the schedule at global_steps + 1
    CHECK(engine.curriculum_seqlen() == expected);
    CHECK(logits.sizes() == Shape{2, expected, c.vocab_size});
    engine.backward(models::GPT::loss(logits, idx.narrow(1, 0, engine.curriculum_seqlen())));
    engine.step();
  }
  {
    NoGradGuard no_grad;  // evaluation: the whole sequence
    CHECK(engine(randint(0, c.vocab_size, {2, 16}, kInt64, &data)).size(1) == 16);
  }
  // A pipeline's train_batch cuts the input and the target; the loss is the cut sequences' loss.
  const int stages = comm->size() % 2 == 0 ? 2 : 1;
  ParallelGrid grid(comm, {.pipeline = stages});
  const int s = grid.pipeline_rank(), d = grid.data_rank();
  const std::vector<int> layers = mlp_stage_layers(stages, s);
  manual_seed(47);
  Mlp whole;
  MlpStage stage(whole, layers);
  Engine pipe = kiln::initialize(stage, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "steps_per_print": 1000, "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
      )" + curriculum + "}"), grid, [](const Tensor& out, const Tensor& y) {
    return nn::cross_entropy(out.reshape({-1, 10}), y.reshape({-1}));
  });
  Tensor x = kiln::test::sample({4 * grid.data_size(), 16, 20}, kFloat32, 0.3);
  Tensor y = ((kiln::test::sample({4 * grid.data_size(), 16}, kFloat64, 2.1) + 2) * 2.4).to(kInt64);
  const Tensor mine = x.narrow(0, 4 * d, 4), my_y = y.narrow(0, 4 * d, 4);
  for (int64_t step = 1; step <= 3; ++step) {
    INFO("pipeline, step " << step);
    const double loss = pipe.train_batch(mine, my_y).item<double>();
    const int64_t len = step <= 1 ? 4 : step <= 2 ? 8 : 16;
    CHECK(pipe.curriculum_seqlen() == len);
    double expected = 0;  // lr 0: the weights stay those of `whole`
    for (int m = 0; m < 2; ++m) {
      expected += nn::cross_entropy(whole(mine.narrow(0, 2 * m, 2).narrow(1, 0, len)).reshape({-1, 10}),
                                    my_y.narrow(0, 2 * m, 2).narrow(1, 0, len).reshape({-1}))
                      .item<double>() / 2;
    }
    Tensor mean = full({1}, expected, kFloat64);
    grid.data()->all_reduce(mean, ReduceOp::Avg);
    CHECK(std::abs(loss - mean.item<double>()) <= 1e-5 * std::abs(mean.item<double>()));
  }
  // An input without a sequence dimension is an Error that says why.
  Mlp flat;
  Engine mlp = kiln::initialize(flat, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, )" + curriculum + "}"), comm);
  check_error([&] { mlp(zeros({2})); }, {"curriculum_learning's seqlen keeps the first positions of dim 1",
                                          "shape [2]"});
}

namespace {

// Linear layers around a LayerNorm: the Linears' parameters are lower_precision_safe_modules' by
// default, the LayerNorm's are not.
struct NormMlp : kiln::test::NormNet {
  NormMlp() : NormNet(20, 32, 10) {}
};

bool all_bfloat16(const Tensor& t) {
  return (t - t.to(kBFloat16).to(kFloat32)).abs().max().item<float>() == 0;
}

}  // namespace

TEST_CASE("engine: torch_autocast runs forward in bfloat16 and averages the Linears' gradients in it, at every "
          "ZeRO stage", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t b = 3;
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    manual_seed(11);
    NormMlp m, ref;
    ref.load_state_dict(m.state_dict());
    Engine engine = kiln::initialize(m, Config::from_string(fmt::format(R"({{"train_micro_batch_size_per_gpu": {},
        "optimizer": {{"type": "SGD", "params": {{"lr": 0.1}}}}, "torch_autocast": {{"enabled": true}},
        "zero_optimization": {{"stage": {}, "reduce_bucket_size": 300}}}})", b, stage)), comm);
    CHECK(engine.autocast_dtype() == kBFloat16);  // the CPU's default, as torch.autocast's
    CHECK(engine.dtype() == kFloat32);            // the model stays float32
    CHECK(engine.optimizer().communication_dtypes() ==
          std::vector<DType>{kBFloat16, kBFloat16, kFloat32, kFloat32, kBFloat16, kBFloat16});
    auto [x, y] = batch(2, b * p);
    const Tensor mine = x.narrow(0, r * b, b), my_y = y.narrow(0, r * b, b);
    const Tensor out = engine(mine);
    CHECK(out.dtype() == kBFloat16);  // the last Linear's, under autocast
    engine.backward(nn::cross_entropy(out, my_y));
    // The reference: each rank's gradient of the same forward under autocast (the loss outside it,
    // as above), averaged over the ranks in float32.
    Tensor ref_out;
    {
      AutocastGuard autocast(Device::cpu(), kBFloat16);
      ref_out = ref(mine);
    }
    nn::cross_entropy(ref_out, my_y).backward();
    std::vector<Tensor> expected;
    for (const Tensor& q : ref.parameters()) {
      Tensor g = q.grad().clone();
      comm->all_reduce(g, ReduceOp::Avg);
      expected.push_back(g.reshape({-1}));
    }
    const FlatLayout& layout = engine.optimizer().layout();
    const FlatRange part = layout.partition(stage > 0 ? r : 0);
    const Tensor got = engine.optimizer().grads()[0];
    for (int64_t i = 0; i < layout.num_params(); ++i) {
      INFO("parameter " << i);
      const FlatRange piece = intersect(layout.param(i), part);
      if (piece.empty()) continue;
      const Tensor g = got.narrow(0, piece.begin - part.begin, piece.size());
      const Tensor e = expected[i].narrow(0, piece.begin - layout.param(i).begin, piece.size());
      if (i == 2 || i == 3) {  // the LayerNorm's, in float32
        check_close(g, e, {1e-5, 1e-6});
      } else {  // the Linears', averaged in bfloat16: each value is one, within bfloat16's rounding
        CHECK(all_bfloat16(g));
        check_close(g, e, {2e-2, 1e-3});
      }
    }
    engine.step();
    CHECK(engine.global_steps() == 1);
  }
  // The listed classes must name a module of the model.
  NormMlp m;
  check_error([&] {
    kiln::initialize(m, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "torch_autocast": {"enabled": true, "lower_precision_safe_modules": ["torch.nn.Linaer"]}})"), comm);
  }, {"lower_precision_safe_modules lists Linaer", "here are LayerNorm, Linear:"});
}

TEST_CASE("engine: torch_autocast in float16 scales the loss by PyTorch's GradScaler rule", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  manual_seed(5);
  Mlp m;
  Engine engine = kiln::initialize(m, Config::from_string(R"({"train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "torch_autocast": {"enabled": true, "dtype": "fp16"},
      "zero_optimization": {"stage": 1}})"), comm);
  CHECK(engine.autocast_dtype() == kFloat16);
  CHECK(engine.loss_scale() == 65536);  // torch.amp.GradScaler's init_scale
  auto [x, y] = batch(1, 4);
  CHECK(engine(x).dtype() == kFloat16);
  // One overflow (an inf in the last rank's partition only) halves the scale at once: no hysteresis.
  const Tensor before = engine.optimizer().master().detach().clone();
  engine.backward(nn::cross_entropy(engine(x), y));
  if (r == p - 1) engine.optimizer().grads()[0].narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
  engine.step();
  CHECK(engine.skipped_steps() == 1);
  CHECK(engine.loss_scale() == 32768);
  kiln::test::check_equal(engine.optimizer().master(), before);
  for (int k = 0; k < 3; ++k) {
    engine.backward(nn::cross_entropy(engine(x), y));
    engine.step();
  }
  CHECK(engine.skipped_steps() == 1);
  CHECK(engine.loss_scale() == 32768);  // growth after 2000 good steps
  CHECK((engine.optimizer().master() - before).abs().max().item<float>() > 1e-4f);
}

TEST_CASE("engine: memory_breakdown prints the tensor memory every steps_per_print steps, the largest over the ranks",
          "[distributed]") {
  auto comm = init("mpi");
  manual_seed(1);
  Mlp m;
  Engine engine = kiln::initialize(m, Config::from_string(R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 2,
      "memory_breakdown": true, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"), comm);
  auto [x, y] = batch(1, 4);
  const std::string out = kiln::test::captured_output(1, [&] {
    for (int k = 0; k < 5; ++k) {
      engine.backward(nn::cross_entropy(engine(x), y));
      engine.step();
    }
  });
  if (comm->rank() != 0) {
    CHECK(out.empty());  // rank 0 prints
    return;
  }
  // Steps 2 and 4: the step's line, then the memory's.
  std::istringstream lines(out);
  std::vector<std::string> memory;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[kiln] memory", 0) == 0) memory.push_back(line);
  }
  REQUIRE(memory.size() == 2);
  const std::string prefix = comm->size() > 1 ? fmt::format("[kiln] memory on cpu (MiB, the largest over {} ranks): ", comm->size())
                                              : "[kiln] memory on cpu (MiB): ";
  for (const std::string& line : memory) {
    INFO(line);
    REQUIRE(line.rfind(prefix, 0) == 0);
    double allocated = 0, peak = 0, reserved = 0;
    REQUIRE(std::sscanf(line.c_str() + prefix.size(), "allocated %lf | peak %lf since the last print | reserved %lf",
                        &allocated, &peak, &reserved) == 3);
    CHECK(allocated > 0);
    CHECK(peak >= allocated);
    CHECK(reserved >= allocated);
  }
}

namespace {

// The lines of a text file.
std::vector<std::string> lines_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "step,value" -> (step, value)
std::pair<int64_t, double> csv_row(const std::string& line) {
  const size_t comma = line.find(',');
  REQUIRE(comma != std::string::npos);
  return {std::stoll(line.substr(0, comma)), std::stod(line.substr(comma + 1))};
}

}  // namespace

TEST_CASE("engine: tensorboard and csv_monitor write rank 0's loss, lr, loss scale and times where DeepSpeed does",
          "[distributed]") {
  auto comm = init("mpi");
  const int n = comm->size(), r = comm->rank();
  const std::string dir = shared_temp_dir(*comm, "kiln-monitor");
  const int64_t micro = 2, gas = 2, tb = micro * gas * n;
  const std::string json = fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "steps_per_print": 2,
    "wall_clock_breakdown": true, "fp16": {{"enabled": true, "auto_cast": true, "initial_scale_power": 8}},
    "optimizer": {{"type": "SGD", "params": {{"lr": 0.1}}}},
    "scheduler": {{"type": "WarmupLR", "params": {{"warmup_min_lr": 0, "warmup_max_lr": 0.1, "warmup_num_steps": 4,
                                                  "warmup_type": "linear"}}}},
    "tensorboard": {{"enabled": true, "output_path": "{}/tb", "job_name": "gpt"}},
    "csv_monitor": {{"enabled": true, "output_path": "{}", "job_name": "csv"}}
  }})", micro, gas, dir, dir);
  std::vector<double> losses, lrs, scales;  // rank 0's step means, and after each step
  auto train = [&](Engine& engine, int steps) {
    for (int step = 0; step < steps; ++step) {
      double sum = 0;
      for (int k = 0; k < gas; ++k) {
        auto [x, y] = batch(10 * step + k, micro * n);
        Tensor loss = nn::cross_entropy(engine(x.narrow(0, r * micro, micro)), y.narrow(0, r * micro, micro));
        sum += loss.item<double>();
        engine.backward(loss);
        engine.step();
      }
      losses.push_back(sum / gas);
      lrs.push_back(engine.get_lr()[0]);
      scales.push_back(engine.loss_scale());
    }
  };
  {
    manual_seed(5);
    Mlp m;
    Engine engine = kiln::initialize(m, Config::from_string(json), comm);
    CHECK((engine.monitor() != nullptr) == (r == 0));
    kiln::test::captured_output(1, [&] { train(engine, 3); });
    CHECK(engine.global_samples() == 3 * tb);
  }
  comm->barrier();
  if (r == 0) {
    const std::filesystem::path csv = std::filesystem::path(dir) / "csv";
    // train_loss: at the samples before each step (DeepSpeed's backward writes it)
    auto lines = lines_of(csv / "Train_Samples_train_loss.csv");
    REQUIRE(lines.size() == 4);
    CHECK(lines[0] == "step,train_loss");
    for (size_t k = 0; k < 3; ++k) {
      const auto [step, value] = csv_row(lines[k + 1]);
      CHECK(step == static_cast<int64_t>(k) * tb);
      CHECK(value == Approx(losses[k]).epsilon(1e-12));
    }
    // lr and loss_scale: at the samples after each step
    lines = lines_of(csv / "Train_Samples_lr.csv");
    REQUIRE(lines.size() == 4);
    CHECK(lines[0] == "step,lr");
    auto scale_lines = lines_of(csv / "Train_Samples_loss_scale.csv");
    REQUIRE(scale_lines.size() == 4);
    CHECK(scale_lines[0] == "step,loss_scale");
    for (size_t k = 0; k < 3; ++k) {
      const auto [step, lr] = csv_row(lines[k + 1]);
      CHECK(step == static_cast<int64_t>(k + 1) * tb);
      CHECK(lr == lrs[k]);  // written with the shortest text that reads back as the same double
      CHECK(csv_row(scale_lines[k + 1]).second == scales[k]);
    }
    CHECK(scales[0] == 256);  // 2^initial_scale_power
    // wall_clock_breakdown: each phase's milliseconds in the step
    for (const char* phase : {"forward", "backward", "step"}) {
      INFO(phase);
      lines = lines_of(csv / fmt::format("Train_Samples_elapsed_time_ms_{}.csv", phase));
      REQUIRE(lines.size() == 4);
      CHECK(lines[0] == fmt::format("step,elapsed_time_ms_{}", phase));
      for (size_t k = 1; k < 4; ++k) CHECK(csv_row(lines[k]).second >= 0);
    }
    // TensorBoard: one event file, its first record the file version and then one per event.
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir) / "tb" / "gpt")) {
      files.push_back(e.path());
    }
    REQUIRE(files.size() == 1);
    CHECK(files[0].filename().string().rfind("events.out.tfevents.", 0) == 0);
    const std::vector<std::string> payloads = tensorboard::read_tf_records(files[0].string());
    REQUIRE(payloads.size() == 1 + 3 * 6);  // version; per step: loss, lr, scale, 3 times
    CHECK(payloads[0].find("brain.Event:2") != std::string::npos);
    CHECK(payloads[1].find("Train/Samples/train_loss") != std::string::npos);
    CHECK(payloads[2].find("Train/Samples/lr") != std::string::npos);
    CHECK(payloads[3].find("Train/Samples/loss_scale") != std::string::npos);
    CHECK(payloads[4].find("Train/Samples/elapsed_time_ms_forward") != std::string::npos);
  }
  comm->barrier();
  // A resumed run appends to the CSV files, without a second header.
  {
    manual_seed(5);
    Mlp m;
    Engine engine = kiln::initialize(m, Config::from_string(json), comm);
    kiln::test::captured_output(1, [&] { train(engine, 1); });
  }
  comm->barrier();
  if (r == 0) {
    const auto lines = lines_of(std::filesystem::path(dir) / "csv" / "Train_Samples_lr.csv");
    REQUIRE(lines.size() == 5);
    CHECK(std::count(lines.begin(), lines.end(), "step,lr") == 1);
  }
  // A directory rank 0 cannot make stops every rank.
  const std::string unwritable = fmt::format(R"({{"train_micro_batch_size_per_gpu": 2,
      "optimizer": {{"type": "SGD", "params": {{"lr": 0.1}}}},
      "csv_monitor": {{"enabled": true, "output_path": "/proc/kiln", "job_name": "x"}}}})");
  Mlp m;
  if (r == 0) {
    check_error([&] { Engine e(m, Config::from_string(unwritable), comm); },
                {"csv_monitor: cannot create the directory '/proc/kiln/x'", "give a writable output_path"});
  } else {
    check_error([&] { Engine e(m, Config::from_string(unwritable), comm); },
                {"creating the monitors' directories failed on another rank"});
  }
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("engine: checkpoint.tag_validation compares the ranks' tags, as DeepSpeed's", "[distributed]") {
  auto comm = init("mpi");
  const int n = comm->size(), r = comm->rank();
  const std::string dir = shared_temp_dir(*comm, "kiln-tags");
  for (const char* mode : {"Warn", "Ignore", "Fail"}) {
    INFO(mode);
    Mlp m;
    Engine engine = kiln::initialize(m, Config::from_string(fmt::format(R"({{"train_micro_batch_size_per_gpu": 2,
        "optimizer": {{"type": "SGD", "params": {{"lr": 0.1}}}}, "checkpoint": {{"tag_validation": "{}"}}}})", mode)),
        comm);
    engine.save_checkpoint(dir, "same");  // one tag everywhere: saved, whatever the mode
    CHECK(engine.load_checkpoint(dir) == "same");
    if (n == 1) continue;
    // A tag that names the rank.
    bool threw = false;
    std::string message;
    const std::string err = kiln::test::captured_output(2, [&] {
      try {
        engine.save_checkpoint(dir, fmt::format("{}-rank{}", mode, r));
      } catch (const Error& e) {
        threw = true;
        message = e.what();
      }
    });
    if (std::string(mode) == "Fail") {
      CHECK(threw);  // on every rank, before anything is written
      CHECK(message.find(fmt::format("the checkpoint tag 'Fail-rank{}' (rank {}) is not the same on every rank", r,
                                     r)) != std::string::npos);
      CHECK_FALSE(std::filesystem::exists(std::filesystem::path(dir) / fmt::format("Fail-rank{}", r)));
    } else {
      CHECK((err.find("[kiln] warning: save_checkpoint: the checkpoint tag") != std::string::npos) ==
            (std::string(mode) == "Warn"));
      CHECK(threw);  // the folders differ, and the ranks' writes agree that one failed
    }
    comm->barrier();
  }
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("engine: data_types.grad_accum_dtype, and DeepSpeed's float32 default for bf16 without ZeRO",
          "[distributed]") {
  auto comm = init("mpi");
  auto engine_with = [&](nn::Module& m, const std::string& keys) {
    return kiln::initialize(m, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}})" + keys + "}"), comm);
  };
  struct Case {
    std::string keys;
    DType accumulate;  // the optimizer's flat gradient buffer (stages 0 and 1) or partition (2, 3)
  };
  const std::vector<Case> cases = {
      {R"(, "bf16": {"enabled": true})", kFloat32},  // stage 0: DeepSpeed's BF16_Optimizer
      {R"(, "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"})", kBFloat16},
      {R"(, "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": null})", kFloat32},
      {R"(, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1})", kBFloat16},
      {R"(, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}, "data_types": {"grad_accum_dtype": "fp32"})",
       kFloat32},
      {R"(, "fp16": {"enabled": true})", kFloat16},
      {R"(, "fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "float32"})", kFloat32},
      {"", kFloat32},
  };
  for (const Case& c : cases) {
    INFO(c.keys);
    manual_seed(1);
    Mlp m;
    Engine engine = engine_with(m, c.keys);
    const int64_t partition = engine.optimizer().layout().partition_numel();
    const int64_t elements = engine.optimizer().stage() <= 1 ? engine.optimizer().layout().padded_numel() : partition;
    CHECK(engine.optimizer().model_state_bytes().grads == elements * itemsize(c.accumulate));
    // The step's gradients: float32 as the masters, copied or not.
    auto [x, y] = batch(1, 2);
    engine.backward(nn::cross_entropy(engine(x.to(engine.dtype())).to(kFloat32), y));
    // .grad() is a view of the flat buffer at stages 0 and 1, unless that is wider (float32
    // accumulation: added into it and dropped); stages 2 and 3 drop it once in their bucket.
    const bool views = engine.optimizer().stage() <= 1 && c.accumulate == engine.dtype();
    CHECK(m.f1.weight.grad().defined() == views);
    engine.step();
  }
  Mlp f32;
  check_error([&] { engine_with(f32, R"(, "data_types": {"grad_accum_dtype": "bf16"})"); },
              {"ZeRO: grad_accum_dtype is bfloat16 for a float32 model", "in the model's dtype or, for a 16-bit model, "
               "in float32"});
  Mlp half;
  check_error([&] { engine_with(half, R"(, "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp16"})"); },
              {"grad_accum_dtype is float16 for a bfloat16 model"});
}

TEST_CASE("engine config: the examples in configs/ read", "[distributed]") {
  const std::filesystem::path dir = std::filesystem::path(KILN_TEST_FIXTURES) / ".." / ".." / "configs";
  int read = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path());
    const Config cfg = Config::from_file(entry.path().string());
    CHECK(cfg.optimizer.has_value());
    ++read;
  }
  CHECK(read >= 5);
  const Config partitioned = Config::from_file((dir / "ds_zero1_checkpointing.json").string());
  REQUIRE(partitioned.activation_checkpointing.has_value());
  CHECK(partitioned.activation_checkpointing->partition_activations);
  CHECK_FALSE(partitioned.activation_checkpointing->cpu_checkpointing);
  const Config zeropp = Config::from_file((dir / "ds_zero3_zeropp.json").string());
  CHECK(zeropp.zero_optimization.zero_quantized_weights);
  CHECK(zeropp.zero_optimization.zero_quantized_gradients);
  CHECK(zeropp.zero_optimization.zero_hpz_partition_size == 2);
}

TEST_CASE("engine config: every mistake is an Error that names the key and what to do", "[distributed]") {
  auto bad = [](const std::string& json, const std::vector<std::string>& fragments) {
    check_error([&] { Config::from_string(json, "ds_config.json"); }, fragments);
  };
  bad(R"({"train_batch_size": 8, "zero_optimisation": {"stage": 2}})",
      {"ds_config.json", "\"zero_optimisation\" is not a key Kiln knows", "did you mean \"zero_optimization\"",
       "at the top level"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_buket_size": 10}})",
      {"\"zero_optimization.reduce_buket_size\"", "did you mean \"reduce_bucket_size\""});
  bad(R"({"train_batch_size": 8, "activation_checkpointing": {"contiguous_memory_optimization": true}})",
      {"\"activation_checkpointing.contiguous_memory_optimization\" must be false in Kiln"});
  bad(R"({"train_batch_size": 8, "activation_checkpointing": {"profile": 1}})",
      {"\"activation_checkpointing.profile\" must be true or false"});
  bad(R"({"train_batch_size": 8, "activation_checkpointing": {"number_checkpoints": 0}})",
      {"\"activation_checkpointing.number_checkpoints\" must be >= 1, not 0"});
  bad(R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activation": true}})",
      {"\"activation_checkpointing.partition_activation\" is not a key Kiln knows",
       "did you mean \"partition_activations\""});
  bad(R"({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpointing": "yes"}})",
      {"\"activation_checkpointing.cpu_checkpointing\" must be true or false"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"sub_group_size": -1}})",
      {"\"zero_optimization.sub_group_size\" must be >= 0, not -1"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"offload_param": {"device": "nvme"}}})",
      {"\"zero_optimization.offload_param.device\" must be \"none\" or \"cpu\", not \"nvme\""});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "max_in_cpu": 5}}})",
      {"zero_optimization.offload_param.max_in_cpu", "does not implement"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "ratio": 0.5}}})",
      {"\"zero_optimization.offload_param.ratio\" is not a key Kiln knows"});  // offload_optimizer's only
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
      {"\"zero_optimization.offload_param\" offloads stage 3's partitioned weights, and this is stage 2",
       "remove it, or use stage 3"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"mics_shard_size": 2}})",
      {"\"zero_optimization.mics_shard_size\" shards stage 3's model states", "this is stage 0", "use stage 3"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 0}})",
      {"\"zero_optimization.mics_shard_size\" must be -1 (off) or a number of ranks >= 1, not 0"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": -2}})",
      {"\"zero_optimization.mics_shard_size\" must be >= -1, not -2"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_hierarchical_params_gather": true}})",
      {"zero_optimization.mics_hierarchical_params_gather", "does not implement, and true asks for it"});
  // Options Kiln does not implement, switched on: each an Error naming it and the value.
  bad(R"({"train_batch_size": 8, "sparse_gradients": true})",
      {"\"sparse_gradients\" is a DeepSpeed option that Kiln does not implement, and true asks for it",
       "turn it off (false, null or {\"enabled\": false}"});
  // Options with no value that is off: present at all, or at DeepSpeed's default, they ask for something.
  bad(R"({"train_batch_size": 8, "sparse_attention": {}})", {"\"sparse_attention\" is a DeepSpeed option", "remove it"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"memory_efficient_linear": false}})",
      {"\"zero_optimization.memory_efficient_linear\" is a DeepSpeed option that Kiln does not implement; remove it"});
  bad(R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "int8"}})",
      {"\"data_types.grad_accum_dtype\" must be \"fp32\", \"fp16\" or \"bf16\"", "not \"int8\""});
  bad(R"({"train_batch_size": 8, "data_types": {"grad_accum": "fp32"}})",
      {"\"data_types.grad_accum\" is not a key Kiln knows", "the keys allowed in \"data_types\" are: grad_accum_dtype"});
  bad(R"({"train_batch_size": 8, "checkpoint": {"tag_validation": "Strict"}})",
      {"\"checkpoint.tag_validation\" must be \"Warn\", \"Ignore\" or \"Fail\", not \"strict\""});
  bad(R"({"train_batch_size": 8, "checkpoint": {"load_universal": true}})",
      {"\"checkpoint.load_universal\" must be false in Kiln", "universal checkpoints are not implemented"});
  bad(R"({"train_batch_size": 8, "checkpoint": {"tag_validaton": "Warn"}})",
      {"\"checkpoint.tag_validaton\" is not a key Kiln knows", "did you mean \"tag_validation\""});
  bad(R"({"train_batch_size": 8, "wandb": {"enabled": true, "project": "x"}})",
      {"\"wandb\" is a DeepSpeed option that Kiln does not implement"});
  // Without "enabled": false, a section with settings in it is taken as asking for the feature.
  bad(R"({"train_batch_size": 8, "comet": {"project": "x"}})", {"\"comet\" is a DeepSpeed option"});
  bad(R"({"train_batch_size": 8, "comms_logger": {"enabled": true, "prof_ops": ["allreduce"]}})",
      {"\"comms_logger.prof_ops\" names \"allreduce\", which is not a communication operation", "all_reduce, "});
  bad(R"({"train_batch_size": 8, "comms_logger": {"enabled": true, "prof_ops": "all_reduce"}})",
      {"\"comms_logger.prof_ops\" must be a list of operation names"});
  bad(R"({"train_batch_size": 8, "comms_logger": {"enabled": true, "verbos": true}})",
      {"\"comms_logger.verbos\" is not a key Kiln knows", "did you mean \"verbose\""});
  bad(R"({"train_batch_size": 8, "csv_monitor": {"enabled": true, "job_name": "a/b"}})",
      {"\"csv_monitor.job_name\" is \"a/b\"", "without '/'"});
  bad(R"({"train_batch_size": 8, "tensorboard": {"enabled": true, "output_pth": "tb"}})",
      {"\"tensorboard.output_pth\" is not a key Kiln knows", "did you mean \"output_path\""});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"zero_hpz_partition_size": 4}})",
      {"\"zero_optimization.zero_hpz_partition_size\" keeps a secondary shard of stage 3's partitioned weights",
       "this is stage 0", "use stage 3"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 0}})",
      {"\"zero_optimization.zero_hpz_partition_size\" must be >= 1, not 0"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "mics_shard_size": 2}})",
      {"\"zero_optimization.zero_hpz_partition_size\" and \"mics_shard_size\" are both set; use one"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "zero_quantized_weights": true}})",
      {"\"zero_optimization.zero_quantized_weights\" quantizes stage 3's weight all-gathers", "this is stage 2",
       "use stage 3"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_weights": 1}})",
      {"\"zero_optimization.zero_quantized_weights\" must be true or false"});
  CHECK(Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_weights": true}})")
            .zero_optimization.zero_quantized_weights);
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "zero_quantized_gradients": true}})",
      {"\"zero_optimization.zero_quantized_gradients\" quantizes stage 3's gradient reduction", "this is stage 1",
       "use stage 3"});
  CHECK(Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_gradients": true}})")
            .zero_optimization.zero_quantized_gradients);
  // How the gradients are averaged.
  bad(R"({"train_batch_size": 8, "communication_data_type": "fp8"})",
      {"\"communication_data_type\" must be \"fp32\", \"fp16\" or \"bf16\"", "not \"fp8\""});
  bad(R"({"train_batch_size": 8, "communication_data_type": 16})", {"\"communication_data_type\" must be a string"});
  bad(R"({"train_batch_size": 8, "gradient_predivide_factor": 0})",
      {"\"gradient_predivide_factor\" must be a finite number > 0", "1 is off), not 0"});
  bad(R"({"train_batch_size": 8, "gradient_predivide_factor": -2})",
      {"\"gradient_predivide_factor\" must be a finite number > 0", "not -2"});
  bad(R"({"train_batch_size": 8, "gradient_predivide_factor": "2"})",
      {"\"gradient_predivide_factor\" must be a finite number > 0", "not \"2\""});
  bad(R"({"train_batch_size": 8, "prescale_gradients": true, "gradient_predivide_factor": 2})",
      {"\"gradient_predivide_factor\" is 2, and \"prescale_gradients\" is true", "give one of the two"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"cpu_offload": true}})",
      {"\"zero_optimization.cpu_offload\" is a DeepSpeed option"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
      {"\"zero_optimization.offload_optimizer.ratio\" is a DeepSpeed option", "0.3 asks for it"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage3_gather_16bit_weights_on_model_save": true,
                                                       "stage3_gather_fp16_weights_on_model_save": true}})",
      {"\"zero_optimization.stage3_gather_fp16_weights_on_model_save\" is the older name", "keep one"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage3_gather_16bit_weights_on_model_save": 1}})",
      {"must be true or false, not an integer"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage3_prefetch_bucket_size": -1}})",
      {"\"zero_optimization.stage3_prefetch_bucket_size\" must be >= 0, not -1"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 2}})",
      {"\"stage\" appears twice in \"zero_optimization\"", "remove one"});
  bad(R"({"train_batch_size": 8, "train_batch_size": 16})", {"\"train_batch_size\" appears twice in the top level"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": "2"}})",
      {"\"zero_optimization.stage\" must be an integer, not a string (\"2\")", "without quotes"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})", {"must be 0, 1, 2 or 3, not 4"});
  bad(R"({"train_batch_size": 8.5})", {"\"train_batch_size\" must be an integer, not a number"});
  bad(R"({"train_batch_size": 0})", {"\"train_batch_size\" must be >= 1, not 0"});
  bad(R"({"train_batch_size": 8, "fp16": {"enabled": 1}})", {"\"fp16.enabled\" must be true or false, not an integer"});
  bad(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
      {"\"bf16\" and \"fp16\" are both enabled"});
  bad(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}})", {"\"optimizer.type\"", "\"Lamb\" is not an optimizer"});
  bad(R"({"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})",
      {"\"optimizer.params.lr\" is required for SGD"});
  bad(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})",
      {"\"optimizer.params.betas\" must be a list of two numbers"});
  bad(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "momentum": 0.9}}})",
      {"\"optimizer.params.momentum\" is not a key Kiln knows here", "lr"});
  bad(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {}}})",
      {"\"scheduler.params.total_num_steps\" is required for WarmupDecayLR"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"contiguous_gradients": false}})",
      {"\"zero_optimization.contiguous_gradients\" must be true in Kiln"});
  bad(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "nvme"}}})",
      {"\"zero_optimization.offload_optimizer.device\" must be \"none\" or \"cpu\", not \"nvme\""});
  bad(R"({"gradient_accumulation_steps": 2})", {"neither \"train_batch_size\" nor \"train_micro_batch_size_per_gpu\""});
  bad(R"({"train_batch_size": 8,})", {"ds_config.json: not valid JSON"});
  bad(R"([1, 2])", {"ds_config.json: \"(top level)\" must be an object"});
  check_error([] { Config::from_file("/nonexistent/ds_config.json"); }, {"cannot open '/nonexistent/ds_config.json'"});
  const Config cfg = Config::from_string(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                                              "gradient_accumulation_steps": 4})");
  check_error([&] { cfg.resolve_batch(2); },
              {"train_batch_size 64 != micro 4 x accumulation 4 x data-parallel 2 = 32"});
  CHECK(cfg.resolve_batch(4).train_batch_size == 64);
  // A product past 2^63 does not wrap into an agreeing batch (micro 2^62 + 1 x 4 was 4, 2^62 x 4 ranks 0).
  check_error([] { Config::from_string(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4611686018427387905,
                                          "gradient_accumulation_steps": 4})").resolve_batch(1); },
              {"more than fits in 64 bits"});
  check_error([] { Config::from_string(R"({"train_micro_batch_size_per_gpu": 4611686018427387904})").resolve_batch(4); },
              {"more than fits in 64 bits"});
  // Not a regular file: /dev/zero would be read forever, a FIFO would wait for a writer.
  check_error([] { Config::from_file("/dev/zero"); }, {"'/dev/zero' is not a regular file"});
  // The parser stopped at a NUL byte and took what came before it for the whole file.
  check_error([] { Config::from_string(std::string("{\"train_batch_size\": 8}\0{garbage", 32)); },
              {"not valid JSON", "NUL byte at offset 23"});
}

TEST_CASE("engine: \"activation_checkpointing\" reaches the modules that take it, and needs one", "[distributed]") {
  auto comm = init("mpi");
  const std::string with = R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                              "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true}})";
  const models::GPTConfig c{.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 4, .vocab_size = 10};
  models::GPT gpt(c);
  CHECK_FALSE(gpt.checkpointing_options().cpu_checkpointing);
  Engine engine = kiln::initialize(gpt, Config::from_string(with), comm);
  CHECK(gpt.checkpointing_options().cpu_checkpointing);
  CHECK(gpt.checkpointing_options().partition_activations);
  // Inside another module too.
  nn::Sequential outer;
  models::GPT& held = outer.push_back(std::make_shared<models::GPT>(c));
  Engine inner = kiln::initialize(outer, Config::from_string(with), comm);
  CHECK(held.checkpointing_options().cpu_checkpointing);
  // A config without the section leaves a module's own settings as they are.
  models::GPT own(c);
  own.configure_checkpointing({.partition_activations = false, .cpu_checkpointing = true});
  Engine plain = kiln::initialize(
      own, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"),
      comm);
  CHECK(own.checkpointing_options().cpu_checkpointing);
  // A model none of whose modules takes it: the section would change nothing, so it is an Error.
  Mlp mlp;
  check_error([&] { kiln::initialize(mlp, Config::from_string(with), comm); },
              {"\"activation_checkpointing\" says how checkpointed blocks keep their inputs or are timed",
               "models::GPT and models::ParallelGPT do"});
  check_error([&] {
    kiln::initialize(mlp, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "activation_checkpointing": {"profile": true}})"), comm);
  }, {"\"activation_checkpointing\" says how checkpointed blocks keep their inputs or are timed"});
}

TEST_CASE("engine: flops_profiler prints rank 0's profile of one forward at the step DeepSpeed prints it",
          "[distributed]") {
  auto comm = init("mpi");
  const models::GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 20};
  const int64_t B = 3, T = 8, d = 16, V = 20;
  // gpt's MACs per forward: 12 d^2 per token and layer, attention's 2 T^2 d per layer, the head's.
  const int64_t macs = 2 * (B * T * 12 * d * d + 2 * B * T * T * d) + B * T * d * V;
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / fmt::format("kiln_engine_flops_{}.txt", comm->size());
  for (bool to_file : {false, true}) {
    INFO("to a file: " << to_file);
    manual_seed(4);
    models::GPT gpt(c);
    Engine engine = kiln::initialize(gpt, Config::from_string(fmt::format(R"({{
        "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2, "steps_per_print": 100,
        "optimizer": {{"type": "SGD", "params": {{"lr": 0.1}}}},
        "flops_profiler": {{"enabled": true, "profile_step": 1, "module_depth": 1, "top_modules": 2,
                            "detailed": false, "output_file": {}, "recompute_fwd_factor": 0.0}}}})",
        to_file ? "\"" + file.string() + "\"" : "null")), comm);
    manual_seed(comm->rank());
    const std::string out = kiln::test::captured_output(1, [&] {
      for (int k = 0; k < 6; ++k) {  // 3 steps of 2 micro-batches
        Tensor idx = randint(0, V, {B, T});
        engine.backward(models::GPT::loss(engine(idx), randint(0, V, {B, T})));
        engine.step();
      }
    });
    comm->barrier();
    std::string text = out;
    if (to_file) {
      CHECK(out.empty());
      if (comm->rank() == 0) {
        std::ifstream in(file);
        std::stringstream written;
        written << in.rdbuf();
        text = written.str();
        std::filesystem::remove(file);
      }
    }
    if (comm->rank() != 0) {
      CHECK(out.empty());  // rank 0 profiles and prints
      continue;
    }
    INFO(text);
    auto count = [&](const std::string& what) {
      size_t n = 0;
      for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
      return n;
    };
    CHECK(count("Profile Summary at step 2:") == 1);  // profiled after 1 step, printed as DeepSpeed does
    CHECK(count("Profile Summary") == 1);
    CHECK(count(fmt::format("{:<62}{:.2f} KMACs", "fwd MACs per device:", macs / 1e3)) == 1);
    CHECK(count(fmt::format("{:<62}{}", "batch size per device:", 3)) == 1);
    CHECK(count(fmt::format("{:<62}{}", "data parallel size:", comm->size())) == 1);
    CHECK(count("\nbwd latency:") == 1);
    CHECK(count("fwd+bwd FLOPS per device = 3 * fwd flops per device / (fwd+bwd latency):") == 1);
    CHECK(count("step latency:") == 1);
    CHECK(count("depth 1:") == 1);
    CHECK(count("depth 2:") == 0);  // module_depth 1
    CHECK(count("Detailed Profile") == 0);
  }
  // ZeRO stage 3 drops the parameters between uses: the profile counts them whole.
  {
    manual_seed(4);
    models::GPT gpt(c);
    int64_t params = 0;
    for (const Tensor& p : gpt.parameters()) params += p.numel();
    Engine engine = kiln::initialize(gpt, Config::from_string(R"({"train_micro_batch_size_per_gpu": 3,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 3},
        "flops_profiler": {"enabled": true, "profile_step": 0, "detailed": false}})"), comm);
    engine.optimizer().register_external_parameter(gpt, gpt.transformer.wte.weight);  // the tied head
    const std::string out = kiln::test::captured_output(1, [&] {
      Tensor idx = randint(0, V, {B, T});
      engine.backward(models::GPT::loss(engine(idx), randint(0, V, {B, T})));
      engine.step();
    });
    if (comm->rank() == 0) {
      INFO(out);
      CHECK(out.find(fmt::format("{:<62}{:.2f} K\n", "params per device:", params / 1e3)) != std::string::npos);
      CHECK(out.find(fmt::format("{:<62}{:.2f} KMACs", "fwd MACs per device:", macs / 1e3)) != std::string::npos);
    }
  }
  // An output_file in a directory that is not there: an Error on every rank when the engine is built.
  {
    models::GPT gpt(c);
    check_error([&] {
      kiln::initialize(gpt, Config::from_string(R"({"train_micro_batch_size_per_gpu": 3,
          "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "flops_profiler": {"enabled": true, "output_file": "/nonexistent-kiln-dir/profile.txt"}})"), comm);
    }, comm->rank() == 0 ? std::vector<std::string>{"flops_profiler.output_file", "'/nonexistent-kiln-dir' does not exist"}
                         : std::vector<std::string>{"checking flops_profiler.output_file failed on another rank"});
  }
  auto bad = [](const std::string& json, const std::vector<std::string>& fragments) {
    check_error([&] { Config::from_string(json, "ds_config.json"); }, fragments);
  };
  bad(R"({"train_batch_size": 8, "flops_profiler": {"profile_step": -1}})",
      {"\"flops_profiler.profile_step\" must be >= 0, not -1"});
  bad(R"({"train_batch_size": 8, "flops_profiler": {"module_depth": -2}})",
      {"\"flops_profiler.module_depth\" must be >= -1, not -2"});
  bad(R"({"train_batch_size": 8, "flops_profiler": {"profile_steps": 3}})",
      {"\"flops_profiler.profile_steps\" is not a key Kiln knows", "did you mean \"profile_step\""});
}

TEST_CASE("engine: activation_checkpointing's profile prints the checkpointed blocks' times; it and "
          "synchronize_checkpoint_boundary leave the training as it was", "[distributed]") {
  auto comm = init("mpi");
  const models::GPTConfig c{.n_layer = 3, .n_head = 2, .n_embd = 8, .block_size = 4, .vocab_size = 10};
  const std::string base = R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 2,
                               "optimizer": {"type": "SGD", "params": {"lr": 0.1}})";
  manual_seed(comm->rank() + 7);
  const Tensor idx = randint(0, 10, {2, 4});
  const Tensor targets = randint(0, 10, {2, 4});
  std::vector<double> losses[2];
  std::string out;
  for (int timed = 0; timed < 2; ++timed) {
    manual_seed(3);
    models::GPT gpt(c);
    gpt.set_checkpointing(1, true);  // two of the three blocks
    gpt.set_checkpointing(2, true);
    const Config cfg = Config::from_string(
        base + (timed ? R"(, "activation_checkpointing": {"synchronize_checkpoint_boundary": true, "profile": true}})"
                      : "}"));
    Engine engine = kiln::initialize(gpt, cfg, comm);
    if (timed) {
      // The engine's own profile, not the one in the config (which another engine may share).
      REQUIRE(gpt.checkpointing_options().profile != nullptr);
      CHECK(gpt.checkpointing_options().profile != cfg.activation_checkpointing->profile);
      CHECK(gpt.checkpointing_options().synchronize_checkpoint_boundary);
    }
    out = kiln::test::captured_output(1, [&] {
      for (int k = 0; k < 4; ++k) {
        Tensor loss = gpt.loss(engine(idx), targets);
        losses[timed].push_back(loss.item<double>());
        engine.backward(loss);
        engine.step();
      }
    });
    if (timed) {
      // Printed at steps 2 and 4, and then reset: it holds nothing now.
      CHECK(gpt.checkpointing_options().profile->forwards == 0);
      CHECK(gpt.checkpointing_options().profile->backward_s == 0);
    }
  }
  CHECK(losses[1] == losses[0]);  // bit for bit
  if (comm->rank() != 0) {
    CHECK(out.empty());  // rank 0 prints
    return;
  }
  std::istringstream lines(out);
  std::vector<std::string> profiled;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[kiln] checkpointed blocks", 0) == 0) profiled.push_back(line);
  }
  REQUIRE(profiled.size() == 2);
  for (const std::string& line : profiled) {
    INFO(line);
    const std::string prefix = "[kiln] checkpointed blocks (ms per step, mean of 2; ";
    REQUIRE(line.rfind(prefix, 0) == 0);
    double forwards = 0, backwards = 0, forward = -1, recompute = -1, backward = -1;
    REQUIRE(std::sscanf(line.c_str() + prefix.size(),
                        "%lf forwards and %lf backwards a step): forward %lf | recompute %lf | backward %lf",
                        &forwards, &backwards, &forward, &recompute, &backward) == 5);
    CHECK(forwards == 2);  // the two checkpointed blocks, once a step
    CHECK(backwards == 2);
    CHECK(forward >= 0);
    CHECK(recompute >= 0);
    CHECK(backward >= 0);
  }
}

TEST_CASE("engine: accumulation, clipping and a warmup schedule at each ZeRO stage match one process",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t micro = 3, gas = 2;
  // Stage 3 three times: plain, with MiCS in groups of half the ranks (of 1 at odd world sizes),
  // and with hpZ's secondary shards in groups of half the ranks (of all at 2 and odd world sizes), where no
  // weight persists or is kept from forward to backward, so that backward gathers from them.
  const int64_t half = p % 2 == 0 ? p / 2 : 1, hpz = p % 2 == 0 && p > 2 ? p / 2 : p;
  struct Case {
    int stage;
    int64_t mics = -1, hpz = 1;
  };
  for (const Case c : {Case{0}, Case{1}, Case{2}, Case{3}, Case{3, half}, Case{3, -1, hpz}}) {
    const int stage = c.stage;
    const int64_t mics = c.mics;
    INFO("stage " << stage << ", mics_shard_size " << mics << ", zero_hpz_partition_size " << c.hpz);
    Config cfg = Config::from_string(fmt::format(R"({{
      "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 0.3,
      "steps_per_print": 1000,
      "optimizer": {{"type": "SGD", "params": {{"lr": 0.2, "momentum": 0.9}}}},
      "scheduler": {{"type": "WarmupLR", "params": {{"warmup_min_lr": 0.0, "warmup_max_lr": 0.2,
                                                    "warmup_num_steps": 5, "warmup_type": "linear"}}}},
      "zero_optimization": {{"stage": {}, "reduce_bucket_size": 200, "overlap_comm": true, "mics_shard_size": {},
                             "zero_hpz_partition_size": {}{}}}
    }})", micro, gas, stage, mics, c.hpz,
        c.hpz != 1 ? R"(, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0)" : ""));
    CHECK(cfg.zero_optimization.mics_shard_size == mics);
    CHECK(cfg.zero_optimization.zero_hpz_partition_size == c.hpz);
    manual_seed(21);
    Mlp ref;
    manual_seed(21);
    Mlp local;
    Engine engine = kiln::initialize(local, cfg, comm);
    CHECK(engine.train_batch_size() == micro * gas * p);
    CHECK(engine.optimizer().shard_comm().size() == (mics == -1 ? p : mics));
    CHECK((engine.optimizer().hpz_comm() != nullptr) == (c.hpz != 1));
    const int64_t secondary_before = engine.optimizer().stage3_stats().secondary_gathers;
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.2, .momentum = 0.9});
    optim::WarmupLR sched_ref(opt_ref, {.warmup_min_lr = 0, .warmup_max_lr = 0.2, .warmup_num_steps = 5,
                                        .warmup_type = "linear"});
    for (int step = 0; step < 8; ++step) {
      INFO("step " << step);
      // The reference: one batch of gas x p x micro samples, mean loss, clip, step.
      std::vector<std::pair<Tensor, Tensor>> micros;
      for (int k = 0; k < gas; ++k) micros.push_back(batch(10 * step + k, micro * p));
      Tensor xs = cat({micros[0].first, micros[1].first}, 0), ys = cat({micros[0].second, micros[1].second}, 0);
      opt_ref.zero_grad();
      nn::cross_entropy(ref(xs), ys).backward();
      const double norm_ref = nn::utils::clip_grad_norm_(ref.parameters(), 0.3).item<double>();
      opt_ref.step();
      sched_ref.step();
      for (int k = 0; k < gas; ++k) {
        CHECK(engine.is_gradient_accumulation_boundary() == (k == gas - 1));
        auto& [x, y] = micros[static_cast<size_t>(k)];
        engine.backward(nn::cross_entropy(engine(x.narrow(0, r * micro, micro)), y.narrow(0, r * micro, micro)));
        engine.step();
      }
      CHECK(engine.global_steps() == step + 1);
      CHECK(engine.get_global_grad_norm() == Approx(norm_ref).epsilon(1e-5));
      CHECK(engine.get_lr()[0] == Approx(opt_ref.param_groups()[0].lr()));
    }
    // hpZ: each of the 6 weights gathered from the secondary shards in each backward.
    if (c.hpz != 1) CHECK(engine.optimizer().stage3_stats().secondary_gathers - secondary_before == 6 * 8 * gas);
    ZeroOptimizer::GatheredParameters gathered(engine.optimizer());
    for (const auto& [name, t] : ref.named_parameters()) {
      INFO(name);
      check_close(local.state_dict().at(name), t, {1e-5, 1e-6});
    }
  }
}

TEST_CASE("engine: fp16 converts the model, scales the loss and skips overflowing steps everywhere", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  Config cfg = Config::from_string(R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "fp16": {"enabled": true, "auto_cast": true, "initial_scale_power": 8, "hysteresis": 2, "loss_scale_window": 3},
      "zero_optimization": {"stage": 2}})");
  manual_seed(5);
  Mlp m;
  Engine engine = kiln::initialize(m, cfg, comm);
  CHECK(engine.dtype() == kFloat16);
  CHECK(m.f1.weight.dtype() == kFloat16);
  CHECK(engine.optimizer().master().dtype() == kFloat32);
  CHECK(engine.loss_scale() == 256);
  auto [x, y] = batch(1, 4);
  Tensor out = engine(x);  // float32 input, cast by auto_cast
  CHECK(out.dtype() == kFloat16);
  // Two overflows (an inf in the last rank's partition of the gradients only) are absorbed by the
  // hysteresis of 2 only in part: the scale stays for the first and halves at the second; neither
  // step changes a weight on any rank.
  const Tensor before = engine.optimizer().master().detach().clone();
  for (int k = 0; k < 2; ++k) {
    engine.backward(nn::cross_entropy(engine(x).to(kFloat32), y));
    if (r == p - 1) engine.optimizer().grads()[0].narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
    engine.step();
  }
  CHECK(engine.skipped_steps() == 2);
  CHECK(engine.global_steps() == 2);
  CHECK(engine.loss_scale() == 128);
  kiln::test::check_equal(engine.optimizer().master(), before);
  // Three good steps: the weights move, and after a window of 3 the scale doubles.
  for (int k = 0; k < 3; ++k) {
    engine.backward(nn::cross_entropy(engine(x).to(kFloat32), y));
    engine.step();
  }
  CHECK(engine.skipped_steps() == 2);
  CHECK(engine.loss_scale() == 256);
  CHECK((engine.optimizer().master() - before).abs().max().item<float>() > 1e-4f);
}

TEST_CASE("engine: a checkpoint resumes where it stopped, at another ZeRO stage, and at another world size",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  if (p != 1 && p != 2 && p != 4) return;  // 8 samples split evenly (before the directory, or it is left)
  const std::string dir = shared_temp_dir(*comm, "kiln-engine");
  // 8 samples a step, split among the ranks.
  auto config = [](int stage, int world) {
    return Config::from_string(fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "steps_per_print": 1000,
        "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2, "weight_decay": 0.01}}}},
        "scheduler": {{"type": "WarmupLR", "params": {{"warmup_max_lr": 1e-2, "warmup_num_steps": 4}}}},
        "zero_optimization": {{"stage": {}}}}})", 8 / world, stage));
  };
  auto train = [&](Engine& e, int from, int to, int rank, int world) {
    for (int step = from; step < to; ++step) {
      auto [x, y] = batch(step, 8);
      const int64_t each = 8 / world;
      e.backward(nn::cross_entropy(e(x.narrow(0, rank * each, each)), y.narrow(0, rank * each, each)));
      e.step();
    }
  };
  // Uninterrupted: 6 steps at stage 2.
  manual_seed(3);
  Mlp whole;
  TensorDict expect;
  {
    Engine e = kiln::initialize(whole, config(2, p), comm);
    train(e, 0, 6, r, p);
    for (const auto& [name, t] : whole.state_dict()) expect.insert(name, t.clone());
  }
  // 3 steps at stage 2, saved; resumed at stage 3 for 3 more.
  manual_seed(3);
  Mlp first;
  {
    Engine e = kiln::initialize(first, config(2, p), comm);
    train(e, 0, 3, r, p);
    e.save_checkpoint(dir);
    CHECK(std::filesystem::exists(dir + "/global_step3/zero_rank_" + std::to_string(r) + ".safetensors"));
  }
  comm->barrier();
  {
    manual_seed(77);
    Mlp second;
    Engine e = kiln::initialize(second, config(3, p), comm);
    CHECK(e.load_checkpoint(dir) == "global_step3");
    CHECK(e.global_steps() == 3);
    train(e, 3, 6, r, p);
    ZeroOptimizer::GatheredParameters gathered(e.optimizer());
    for (const auto& [name, t] : expect) check_close(second.state_dict().at(name), t, {1e-5, 1e-6});
  }
  if (p > 1) {  // resumed at stage 3 with MiCS: groups of half the ranks, replicated twice
    Config mics = config(3, p);
    mics.zero_optimization.mics_shard_size = p / 2;
    manual_seed(76);
    Mlp fourth;
    Engine e = kiln::initialize(fourth, mics, comm);
    e.load_checkpoint(dir);
    train(e, 3, 6, r, p);
    ZeroOptimizer::GatheredParameters gathered(e.optimizer());
    for (const auto& [name, t] : expect) check_close(fourth.state_dict().at(name), t, {1e-5, 1e-6});
  }
  if (p > 1) {
    // A path that only rank 0 cannot read: its own Error there, a PeerError on the others, and the
    // communicator still in step. (Reading takes no collective; loading at stage 3 gathers, and a
    // rank that failed while the others gathered set every rank's collectives apart.)
    manual_seed(79);
    Mlp fifth;
    Engine e = kiln::initialize(fifth, config(3, p), comm);
    check_error([&] { e.load_checkpoint(r == 0 ? "/nonexistent" : dir); },
                {r == 0 ? "'/nonexistent/latest' does not exist" : "reading this stage's checkpoint failed on another "
                                                                    "rank"});
    CHECK(e.load_checkpoint(dir) == "global_step3");
    train(e, 3, 6, r, p);
    ZeroOptimizer::GatheredParameters gathered(e.optimizer());
    for (const auto& [name, t] : expect) check_close(fifth.state_dict().at(name), t, {1e-5, 1e-6});
  }
  // The same checkpoint on rank 0 alone (world size 1) at stage 1.
  auto solo = comm->split(r == 0 ? 0 : -1, 0);
  if (solo) {
    manual_seed(78);
    Mlp third;
    Engine e = kiln::initialize(third, config(1, 1), solo);
    e.load_checkpoint(dir, "global_step3");
    train(e, 3, 6, 0, 1);
    for (const auto& [name, t] : expect) check_close(third.state_dict().at(name), t, {1e-5, 1e-6});
    check_error([&] { e.load_checkpoint(dir, "no_such_tag"); }, {"no engine.safetensors"});
    check_error([&] { e.load_checkpoint("/nonexistent"); }, {"'/nonexistent/latest' does not exist"});
  }
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("engine: save_16bit_model writes the whole model in its dtype, at stage 3 only when the config asks",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const std::string dir = shared_temp_dir(*comm, "kiln-engine");
  for (int stage : {0, 2, 3}) {
    for (bool gather : {false, true}) {
      if (stage != 3 && !gather) continue;  // the switch is read at stage 3 only
      INFO("stage " << stage << ", stage3_gather_16bit_weights_on_model_save " << gather);
      const Config cfg = Config::from_string(fmt::format(R"({{"train_micro_batch_size_per_gpu": 2,
          "steps_per_print": 1000, "bf16": {{"enabled": true}},
          "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2}}}},
          "zero_optimization": {{"stage": {}, "stage3_param_persistence_threshold": 32,
                                 "stage3_gather_16bit_weights_on_model_save": {}}}}})", stage, gather));
      manual_seed(9);
      Mlp m;
      m.f2.bias.requires_grad_(false);  // a frozen parameter: whole on every rank, at every stage
      Engine e = kiln::initialize(m, cfg, comm);
      for (int step = 0; step < 3; ++step) {
        auto [x, y] = batch(step, 2 * p);
        e.backward(nn::cross_entropy(e(x.narrow(0, 2 * r, 2).to(kBFloat16)).to(kFloat32), y.narrow(0, 2 * r, 2)));
        e.step();
      }
      const std::string sub = fmt::format("{}/s{}{}", dir, stage, gather ? "g" : "");
      const bool saved = e.save_16bit_model(sub);
      CHECK(saved == (stage != 3 || gather));
      CHECK(e.save_16bit_model(sub, "trainable.safetensors", /*exclude_frozen_parameters=*/true) == saved);
      e.save_checkpoint(sub + "/ckpt");
      // What every rank sees once the weights are gathered: each file must hold exactly this.
      TensorDict expect;
      const Tensor x7 = batch(7, 4).first.to(kBFloat16);
      Tensor out7;
      {
        ZeroOptimizer::GatheredParameters gathered(e.optimizer());
        for (const auto& [name, t] : m.state_dict()) expect.insert(name, t.clone());
        NoGradGuard no_grad;
        out7 = m(x7);
      }
      CHECK(expect.at("f1.weight").dtype() == kBFloat16);
      CHECK(expect.at("f1.weight").numel() == 32 * 20);
      comm->barrier();
      if (r == 0) {
        CHECK(std::filesystem::exists(sub + "/model.safetensors") == saved);
        if (saved) {
          const TensorDict file = safetensors::load_file(sub + "/model.safetensors");
          CHECK(file.size() == expect.size());
          for (const auto& [name, t] : expect) {
            INFO(name);
            REQUIRE(file.contains(name));
            CHECK(file.at(name).dtype() == kBFloat16);
            kiln::test::check_equal(file.at(name), t);
          }
          CHECK(safetensors::load_metadata(sub + "/model.safetensors").at("format") == "pt");
          const TensorDict trainable = safetensors::load_file(sub + "/trainable.safetensors");
          CHECK(trainable.size() == expect.size() - 1);
          CHECK_FALSE(trainable.contains("f2.bias"));
          // A single-process model loads the file as it is.
          Mlp solo;
          solo.to(kBFloat16);
          solo.load_state_dict(file);
          NoGradGuard no_grad;
          kiln::test::check_equal(solo(x7), out7);
        }
        // The checkpoint's model.safetensors is the same consolidated state, at every stage.
        const TensorDict ckpt = safetensors::load_file(sub + "/ckpt/global_step3/model.safetensors");
        for (const auto& [name, t] : expect) kiln::test::check_equal(ckpt.at(name), t);
      }
      comm->barrier();
    }
  }
  // A name that is not a .safetensors file is an Error on every rank, before anything is gathered.
  manual_seed(9);
  Mlp m;
  Engine e = kiln::initialize(m, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 3,
      "stage3_gather_16bit_weights_on_model_save": true}})"), comm);
  check_error([&] { e.save_16bit_model(dir, "pytorch_model.bin"); }, {"'pytorch_model.bin'", "ending in .safetensors"});
  check_error([&] { e.save_16bit_model(dir, "sub/model.safetensors"); }, {"must be a plain name"});
  // Rank 0 failing to write (the folder is under a regular file) is an Error on every rank, not a hang.
  if (r == 0) std::ofstream(dir + "/a_file") << "x";
  comm->barrier();
  check_error([&] { e.save_16bit_model(dir + "/a_file/out"); },
              {r == 0 ? "cannot create '" + dir + "/a_file/out'"
                      : "writing '" + dir + "/a_file/out/model.safetensors' failed on another rank"});
  // So is one in save_checkpoint: every rank stops with an Error, not at the communication timeout.
  check_error([&] { e.save_checkpoint(dir + "/a_file/ckpt"); },
              {r == 0 ? "cannot create '" + dir + "/a_file/ckpt/" : "failed on another rank"});
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("engine: pipeline stages with data parallel, accumulation, clipping and a schedule match one process",
          "[distributed]") {
  auto world = init("mpi");
  const int stages = world->size() % 2 == 0 ? 2 : 1;  // and the rest data parallel
  ParallelGrid grid(world, {.pipeline = stages});
  const int data = grid.data_size(), d = grid.data_rank(), s = grid.pipeline_rank();
  const std::vector<int> layers = mlp_stage_layers(stages, s);
  const int64_t micro = 2, gas = 3, rows = micro * gas;
  auto loss_fn = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
  const std::string dir = shared_temp_dir(*world, "kiln-engine");
  // watched: with a CSV monitor and the communication logger, which must change nothing
  auto config = [&](int zero, bool watched = false) {
    const std::string watching = watched ? fmt::format(R"(, "comms_logger": {{"enabled": true, "debug": true}},
      "csv_monitor": {{"enabled": true, "output_path": "{}", "job_name": "pipe{}"}})", dir, zero) : "";
    return Config::from_string(fmt::format(R"({{
      "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 0.3,
      "steps_per_print": 1000, "optimizer": {{"type": "SGD", "params": {{"lr": 0.2, "momentum": 0.9}}}},
      "scheduler": {{"type": "WarmupLR", "params": {{"warmup_min_lr": 0.0, "warmup_max_lr": 0.2,
                                                    "warmup_num_steps": 3, "warmup_type": "linear"}}}},
      "zero_optimization": {{"stage": {}, "reduce_bucket_size": 300, "overlap_comm": true}}{}}})", micro, gas, zero,
      watching));
  };
  auto train = [&](Engine& e, int from, int to) {
    for (int step = from; step < to; ++step) {
      auto [x, y] = batch(step, rows * data);
      e.train_batch(x.narrow(0, d * rows, rows), y.narrow(0, d * rows, rows));
    }
  };
  for (int zero : {0, 1}) {
    INFO("ZeRO stage " << zero << ", " << stages << " stages x " << data << " data-parallel ranks");
    manual_seed(31);
    Mlp ref;
    MlpStage stage(ref, layers);
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.2, .momentum = 0.9});
    optim::WarmupLR sched_ref(opt_ref, {.warmup_min_lr = 0, .warmup_max_lr = 0.2, .warmup_num_steps = 3,
                                        .warmup_type = "linear"});
    Engine engine = kiln::initialize(stage, config(zero, /*watched=*/true), grid, loss_fn);
    std::vector<double> losses;
    CHECK(engine.is_pipeline_parallel());
    CHECK(engine.train_batch_size() == rows * data);
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      auto [x, y] = batch(step, rows * data);
      opt_ref.zero_grad();
      Tensor loss_ref = nn::cross_entropy(ref(x), y);
      loss_ref.backward();
      const double norm_ref = nn::utils::clip_grad_norm_(ref.parameters(), 0.3).item<double>();
      opt_ref.step();
      sched_ref.step();
      Tensor loss = engine.train_batch(x.narrow(0, d * rows, rows), y.narrow(0, d * rows, rows));
      losses.push_back(loss.item<double>());
      CHECK(loss.item<double>() == Approx(loss_ref.item<double>()).epsilon(1e-5));
      CHECK(engine.get_global_grad_norm() == Approx(norm_ref).epsilon(1e-5));
      CHECK(engine.global_steps() == step + 1);
    }
    const TensorDict want = ref.state_dict();
    for (const auto& [name, t] : stage.named_parameters()) {
      INFO(name);
      check_close(t, want.at(name), {1e-5, 1e-6});
    }
    // The pipeline's monitor: the batch's loss (every rank's), at the samples after the step.
    if (world->rank() == 0) {
      const auto lines = lines_of(std::filesystem::path(dir) / fmt::format("pipe{}", zero) / "Train_Samples_train_loss.csv");
      REQUIRE(lines.size() == 6);
      for (size_t k = 0; k < 5; ++k) {
        const auto [samples, value] = csv_row(lines[k + 1]);
        CHECK(samples == static_cast<int64_t>(k + 1) * rows * data);
        CHECK(value == Approx(losses[k]).epsilon(1e-6));  // written in float32's value
      }
      CHECK_FALSE(std::filesystem::exists(std::filesystem::path(dir) / fmt::format("pipe{}", zero) /
                                          "Train_Samples_elapsed_time_ms_forward.csv"));
    }
    std::vector<std::string> names;
    for (const auto& [name, sizes] : engine.comms_logger()->records()) names.push_back(name);
    CHECK(std::count(names.begin(), names.end(), "broadcast | [Caller: pipeline loss]") == 1);
    check_error([&] { engine.log_summary(/*show_straggler=*/true); },
                {"show_straggler compares each operation across the ranks, and a pipeline's stages"});
    // 2 steps, saved (a folder per stage), loaded by a new engine, 3 more: the same weights.
    manual_seed(31);
    Mlp again;
    MlpStage first(again, layers);
    {
      Engine e = kiln::initialize(first, config(zero), grid, loss_fn);
      train(e, 0, 2);
      e.save_checkpoint(dir, "pipe");
      CHECK(std::filesystem::exists(fmt::format("{}/pipe/stage_{}/zero_rank_{}.safetensors", dir, s, d)));
    }
    manual_seed(99);
    Mlp other;
    MlpStage second(other, layers);
    Engine e = kiln::initialize(second, config(zero), grid, loss_fn);
    CHECK(e.load_checkpoint(dir) == "pipe");
    train(e, 2, 5);
    for (const auto& [name, t] : second.named_parameters()) check_close(t, want.at(name), {1e-5, 1e-6});
    // What a pipeline engine refuses: the one-model calls, and a batch of the wrong size.
    auto [x, y] = batch(0, rows);
    check_error([&] { e.forward(x); }, {"Engine.forward: a pipeline-parallel engine runs whole batches"});
    check_error([&] { e.step(); }, {"call train_batch(input, target)"});
    check_error([&] { e.train_batch(x.narrow(0, 0, 4), y.narrow(0, 0, 4)); },
                {"the input has 4 rows; a batch is train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 3"});
    world->barrier();
  }
  check_error([&] {
    MlpStage st(*std::make_unique<Mlp>(), layers);
    kiln::initialize(st, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 2}})"), grid, loss_fn);
  }, {"ZeRO stage 2 does not go with pipeline parallelism"});
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("engine: interleaved 1F1B (2 chunks per stage) with data parallel and clipping matches one process",
          "[distributed]") {
  auto world = init("mpi");
  const int stages = world->size() % 2 == 0 ? 2 : 1;  // and the rest data parallel
  ParallelGrid grid(world, {.pipeline = stages});
  const int data = grid.data_size(), d = grid.data_rank(), s = grid.pipeline_rank();
  // Virtual stage c p + s of 2p holds these layers of the Mlp (one of 4 passes its input on).
  const std::vector<std::vector<int>> virtual_stages =
      stages == 1 ? std::vector<std::vector<int>>{{0, 1}, {2}} : std::vector<std::vector<int>>{{0}, {1}, {}, {2}};
  const int64_t micro = 2, gas = 4, rows = micro * gas;
  auto loss_fn = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
  auto config = [&](int zero, int64_t accumulation) {
    return Config::from_string(fmt::format(R"({{
      "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 0.3,
      "steps_per_print": 1000, "optimizer": {{"type": "SGD", "params": {{"lr": 0.2, "momentum": 0.9}}}},
      "zero_optimization": {{"stage": {}, "reduce_bucket_size": 300, "overlap_comm": true}}}})", micro, accumulation,
                                           zero));
  };
  // This rank's two chunks of a copy of `whole`.
  auto make_chunks = [&](Mlp& whole) {
    std::vector<std::unique_ptr<MlpStage>> chunks;
    for (int c = 0; c < 2; ++c) chunks.push_back(std::make_unique<MlpStage>(whole, virtual_stages[c * stages + s]));
    return chunks;
  };
  auto pointers = [](const std::vector<std::unique_ptr<MlpStage>>& chunks) {
    return std::vector<nn::Module*>{chunks[0].get(), chunks[1].get()};
  };
  const std::string dir = shared_temp_dir(*world, "kiln-engine-interleaved");
  for (int zero : {0, 1}) {
    INFO("ZeRO stage " << zero << ", " << stages << " stages x " << data << " data-parallel ranks");
    manual_seed(31);
    Mlp ref;
    auto chunks = make_chunks(ref);
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.2, .momentum = 0.9});
    Engine engine = kiln::initialize(pointers(chunks), config(zero, gas), grid, loss_fn);
    CHECK(engine.is_pipeline_parallel());
    // The engine's module holds the chunks as "0" and "1".
    CHECK(engine.module().named_parameters().size() == chunks[0]->parameters().size() + chunks[1]->parameters().size());
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      auto [x, y] = batch(step, rows * data);
      opt_ref.zero_grad();
      Tensor loss_ref = nn::cross_entropy(ref(x), y);
      loss_ref.backward();
      const double norm_ref = nn::utils::clip_grad_norm_(ref.parameters(), 0.3).item<double>();
      opt_ref.step();
      Tensor loss = engine.train_batch(x.narrow(0, d * rows, rows), y.narrow(0, d * rows, rows));
      CHECK(loss.item<double>() == Approx(loss_ref.item<double>()).epsilon(1e-5));
      CHECK(engine.get_global_grad_norm() == Approx(norm_ref).epsilon(1e-5));
    }
    const TensorDict want = ref.state_dict();
    for (const auto& chunk : chunks) {
      for (const auto& [name, t] : chunk->named_parameters()) {
        INFO(name);
        check_close(t, want.at(name), {1e-5, 1e-6});
      }
    }
    // Saved after 5 steps and loaded into chunks made from other random numbers: the same weights,
    // exactly.
    engine.save_checkpoint(dir, "interleaved");
    manual_seed(99);
    Mlp other;
    auto loaded = make_chunks(other);
    Engine again = kiln::initialize(pointers(loaded), config(zero, gas), grid, loss_fn);
    CHECK(again.load_checkpoint(dir) == "interleaved");
    for (size_t c = 0; c < 2; ++c) {
      const auto saved = chunks[c]->parameters(), got = loaded[c]->parameters();
      REQUIRE(saved.size() == got.size());
      for (size_t i = 0; i < saved.size(); ++i) kiln::test::check_equal(got[i], saved[i]);
    }
    // The same layers as one stage per rank: the checkpoint's chunks do not fit it.
    MlpStage single(other, mlp_stage_layers(stages, s));
    Engine one = kiln::initialize(single, config(zero, gas), grid, loss_fn);
    check_error([&] { one.load_checkpoint(dir); }, {"of 2 chunk(s)", "this engine has", "of 1 x 1"});
    world->barrier();
  }
  if (stages == 2) {
    manual_seed(31);
    Mlp whole;
    auto chunks = make_chunks(whole);
    check_error([&] { kiln::initialize(pointers(chunks), config(0, 3), grid, loss_fn); },
                {"takes the micro-batches 2 at a time", "gradient_accumulation_steps is 3; make it a multiple of 2"});
    // Ranks that pass different numbers of chunks: an Error on every rank, not a wait.
    std::vector<nn::Module*> mine = pointers(chunks);
    if (s == 1) mine.pop_back();
    check_error([&] { kiln::initialize(mine, config(0, gas), grid, loss_fn); },
                {"the pipeline's ranks hold from 1 to 2 model chunks", "every rank must pass as many"});
  }
  check_error([&] { kiln::initialize(std::vector<nn::Module*>{}, config(0, gas), grid, loss_fn); },
              {"Engine: no model chunks"});
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("engine: fp16 through a pipeline skips a step that overflows on one stage, on every stage",
          "[distributed]") {
  auto world = init("mpi");
  const int stages = world->size() % 2 == 0 ? 2 : 1;
  ParallelGrid grid(world, {.pipeline = stages});
  const int s = grid.pipeline_rank(), d = grid.data_rank();
  const std::vector<int> layers = mlp_stage_layers(stages, s);
  manual_seed(41);
  Mlp whole;
  MlpStage stage(whole, layers);
  const Config cfg = Config::from_string(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "steps_per_print": 1000, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
      "fp16": {"enabled": true, "auto_cast": true, "initial_scale_power": 8, "hysteresis": 1}})");
  Engine engine = kiln::initialize(stage, cfg, grid, [](const Tensor& out, const Tensor& y) {
    return nn::cross_entropy(out.to(kFloat32), y);
  });
  CHECK(stage.layers[0]->weight.dtype() == kFloat16);
  // The last layer's gradient becomes inf in one step, on the last stage (and data rank 0) only.
  bool poison = false;
  if (stage.ends_model && d == 0) {
    stage.layers.back()->weight.register_hook([&poison](const Tensor& g) {
      return poison ? full_like(g, std::numeric_limits<double>::infinity()) : Tensor();
    });
  }
  auto [x, y] = batch(3, 4 * grid.data_size());
  auto run = [&] { return engine.train_batch(x.narrow(0, 4 * d, 4), y.narrow(0, 4 * d, 4)).item<double>(); };
  CHECK(std::isfinite(run()));
  CHECK(engine.skipped_steps() == 0);
  const Tensor before = engine.optimizer().master().detach().clone();
  poison = true;
  CHECK(std::isfinite(run()));  // the loss itself is fine; the gradients are not
  poison = false;
  CHECK(engine.skipped_steps() == 1);  // on every rank: the check spans the stages
  CHECK(engine.loss_scale() == 128);
  kiln::test::check_equal(engine.optimizer().master(), before);
  run();
  CHECK(engine.skipped_steps() == 1);
  CHECK((engine.optimizer().master() - before).abs().max().item<float>() > 1e-5f);
}

TEST_CASE("engine: torch_autocast runs a pipeline's stages under autocast, and its loss in float32", "[distributed]") {
  auto world = init("mpi");
  const int stages = world->size() % 2 == 0 ? 2 : 1;
  ParallelGrid grid(world, {.pipeline = stages});
  const int s = grid.pipeline_rank(), d = grid.data_rank();
  const std::vector<int> layers = mlp_stage_layers(stages, s);
  manual_seed(43);
  Mlp whole;
  MlpStage stage(whole, layers);
  DType seen = kFloat32, loss_dtype = kBFloat16;
  stage.layers.back()->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    seen = out.dtype();
    return Tensor();
  });
  Engine engine = kiln::initialize(stage, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "steps_per_print": 1000, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
      "torch_autocast": {"enabled": true, "dtype": "bf16"}, "zero_optimization": {"stage": 1}})"), grid,
      [&](const Tensor& out, const Tensor& y) {
        Tensor loss = nn::cross_entropy(out, y);  // under the engine's autocast: float32, by the policy
        loss_dtype = loss.dtype();
        return loss;
      });
  CHECK(stage.layers[0]->weight.dtype() == kFloat32);
  auto [x, y] = batch(4, 4 * grid.data_size());
  const Tensor mine = x.narrow(0, 4 * d, 4), my_y = y.narrow(0, 4 * d, 4);
  const double loss = engine.train_batch(mine, my_y).item<double>();
  CHECK(seen == kBFloat16);
  if (stage.ends_model) CHECK(loss_dtype == kFloat32);
  // The same micro-batches through the whole model in one process, under autocast, averaged over
  // the data ranks: the pipeline computes the same bfloat16 products.
  double expected = 0;
  for (int m = 0; m < 2; ++m) {
    AutocastGuard autocast(Device::cpu(), kBFloat16);
    expected += nn::cross_entropy(whole(mine.narrow(0, 2 * m, 2)), my_y.narrow(0, 2 * m, 2)).item<double>() / 2;
  }
  Tensor mean = full({1}, expected, kFloat64);
  grid.data()->all_reduce(mean, ReduceOp::Avg);
  CHECK(std::abs(loss - mean.item<double>()) <= 1e-5 * std::abs(mean.item<double>()));
  seen = kFloat32;
  CHECK(engine.eval_batch(mine).defined() == stage.ends_model);
  CHECK(seen == kBFloat16);
}

TEST_CASE("engine: a checkpoint resumes with another accumulation count for the same batch", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const std::string dir = shared_temp_dir(*comm, "kiln-engine");
  // 48 samples a step: micro-batches of 48 / p / 2 (2 accumulated) or of 48 / p / 4 (4 accumulated).
  auto config = [&](int gas) {
    return Config::from_string(fmt::format(R"({{"train_batch_size": 48, "gradient_accumulation_steps": {},
        "steps_per_print": 1000, "optimizer": {{"type": "SGD", "params": {{"lr": 0.1, "momentum": 0.9}}}},
        "zero_optimization": {{"stage": 1}}}})", gas));
  };
  auto train = [&](Engine& e, int from, int to) {
    const int64_t micro = e.train_micro_batch_size_per_gpu(), gas = e.gradient_accumulation_steps();
    for (int step = from; step < to; ++step) {
      auto [x, y] = batch(step, 48);
      for (int64_t k = 0; k < gas; ++k) {  // micro-batch k of rank r: rows [(k p + r) micro, ...)
        const int64_t at = (k * p + r) * micro;
        e.backward(nn::cross_entropy(e(x.narrow(0, at, micro)), y.narrow(0, at, micro)));
        e.step();
      }
    }
  };
  manual_seed(6);
  Mlp whole;
  TensorDict expect;
  {
    Engine e = kiln::initialize(whole, config(2), comm);
    train(e, 0, 4);
    for (const auto& [name, t] : whole.state_dict()) expect.insert(name, t.clone());
  }
  manual_seed(6);
  Mlp first;
  {
    Engine e = kiln::initialize(first, config(2), comm);
    train(e, 0, 2);
    e.save_checkpoint(dir);
  }
  manual_seed(60);
  Mlp second;
  Engine e = kiln::initialize(second, config(4), comm);
  e.load_checkpoint(dir);
  CHECK(e.global_steps() == 2);
  CHECK(e.micro_steps() == 8);  // a boundary of 4, not the 4 micro-steps taken at 2
  CHECK(e.is_gradient_accumulation_boundary() == false);
  train(e, 2, 4);
  CHECK(e.global_steps() == 4);
  for (const auto& [name, t] : expect) check_close(second.state_dict().at(name), t, {1e-5, 1e-6});
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

namespace {

// A stage that lists whatever ties it is given: the engine's errors for a wrong list.
struct ListedTies : nn::Module, TiedWeights {
  std::shared_ptr<nn::Linear> lin;
  std::vector<TiedWeight> ties;
  explicit ListedTies(int64_t out, int64_t in = 20) : lin(std::make_shared<nn::Linear>(in, out)) {
    register_module("lin", lin);
  }
  Tensor forward(const Tensor& x) override { return (*lin)(x); }
  std::vector<TiedWeight> tied_weights() override { return ties; }
};

}  // namespace

TEST_CASE("engine: a wrong list of tied weights is an Error on every rank, not a wait", "[distributed]") {
  auto world = init("mpi");
  const int stages = world->size() % 2 == 0 ? 2 : 1;
  ParallelGrid grid(world, {.pipeline = stages});
  const int s = grid.pipeline_rank();
  auto loss_fn = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
  const Config cfg = Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 1}})");
  {
    ListedTies st(10);
    st.ties = {{.weight = st.lin->weight, .owner = 0, .user = 0}};
    check_error([&] { kiln::initialize(st, cfg, grid, loss_fn); },
                {"a tie between stages 0 (owner) and 0 (user)", "must be two different stages"});
  }
  {
    ListedTies st(10);
    st.ties = {{.weight = Tensor(), .owner = 0, .user = stages}};
    check_error([&] { kiln::initialize(st, cfg, grid, loss_fn); }, {"two different stages of it"});
  }
  if (stages == 2) {
    {
      ListedTies st(10);
      st.ties = {{.weight = Tensor(), .owner = 0, .user = 1}};
      check_error([&] { kiln::initialize(st, cfg, grid, loss_fn); },
                  {fmt::format("stage {} lists a tie (owner 0, user 1) without its weight", s)});
    }
    // Stage 1's copy is stage 0's weight transposed (as many elements): stage 1 says so, stage 0
    // points to it.
    ListedTies st(s == 0 ? 10 : 20, s == 0 ? 20 : 10);
    st.ties = {{.weight = st.lin->weight, .owner = 0, .user = 1}};
    if (s == 1) {
      check_error([&] { kiln::initialize(st, cfg, grid, loss_fn); },
                  {"stage 1's copy of a tied weight is float32 of shape [20, 10], and stage 0 sent float32 of shape "
                   "[10, 20]", "must hold the same weight"});
    } else {
      check_error([&] { kiln::initialize(st, cfg, grid, loss_fn); },
                  {"Engine: copying the tied weights failed on another rank"});
    }
    // A tie that only one of its stages lists.
    ListedTies lone(10);
    lone.ties = {{.weight = lone.lin->weight, .owner = 0, .user = 1}};
    if (s == 1) lone.ties.clear();
    check_error([&] { kiln::initialize(lone, cfg, grid, loss_fn); },
                {"Engine: stage 0 lists 1 tie(s) that it owns and stage 1 uses, and stage 1 lists 0"});
  }
}

namespace {

// Stage 0 scales its input by w; stage 1 adds its copy of w. With x = 0 only the copy gets a
// gradient: the sum of the target over the micro-batch, divided by the pipeline's m. Each stage
// adds a bias b of its own too (a stage must train something besides a copy).
struct ScaleThenShift : nn::Module, TiedWeights {
  Tensor w, b;
  int stage;
  explicit ScaleThenShift(int s)
      : w(register_parameter("w", zeros({1}))), b(register_parameter("b", zeros({1}))), stage(s) {}
  Tensor forward(const Tensor& x) override { return (stage == 0 ? x * w : x + w) + b; }
  std::vector<TiedWeight> tied_weights() override { return {{.weight = w, .owner = 0, .user = 1}}; }
};

}  // namespace

TEST_CASE("engine: a tied weight's copy sums its micro-batches in grad_accum_dtype, float32 end to end",
          "[distributed]") {
  auto world = init("mpi");
  if (world->size() % 2 == 1) {
    SUCCEED("an odd world size: no two-stage grid here (the even sizes run it)");
    return;
  }
  ParallelGrid grid(world, {.pipeline = 2});
  const int s = grid.pipeline_rank();
  auto loss_fn = [](const Tensor& out, const Tensor& y) { return (out * y).sum(); };
  // 4 micro-batches of one row: the copy's gradients are 1024 / 4 = 256, then 1, 1, 1. In bfloat16
  // 256 + 1 rounds back to 256 (8 significant bits), so the sum stays 256; in float32 it is 259.
  // SGD with lr 1 from w = 0 makes the float32 master -259, the bfloat16 weight -260 (to even).
  // The gradients' reduction travels in bfloat16 unless communication_data_type says fp32 (as
  // DeepSpeed's), which rounds 259 to 260 once.
  const Tensor x = zeros({4, 1}, kBFloat16);
  const Tensor y = from_vector<float>({1024, 4, 4, 4}).reshape({4, 1}).to(kBFloat16);
  struct Case {
    std::string settings;
    float master, weight;
    bool wide = true;  // float32 sums: .grad() stays undefined on both stages (else the owner's is a view)
  };
  const std::vector<Case> cases = {
      {R"("zero_optimization": {"stage": 0})", -260, -260},  // float32 sums: the bf16 default at stage 0
      {R"("zero_optimization": {"stage": 0}, "communication_data_type": "fp32")", -259, -260},
      {R"("zero_optimization": {"stage": 1}, "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"})",
       -259, -260},
      {R"("zero_optimization": {"stage": 0}, "data_types": {"grad_accum_dtype": "bf16"})", -256, -256, false}};
  for (const Case& c : cases) {
    INFO(c.settings);
    ScaleThenShift stage(s);
    const Config cfg = Config::from_string(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4, "bf16": {{"enabled": true}}, {},
        "optimizer": {{"type": "SGD", "params": {{"lr": 1.0}}}}}})", c.settings));
    Engine e = kiln::initialize(stage, cfg, grid, loss_fn);
    e.train_batch(s == 0 ? x : Tensor(), s == 1 ? y : Tensor());
    kiln::test::check_equal(stage.w, full({1}, c.weight, kBFloat16));  // the owner's new weight, and the copy of it
    // The float32 master of w: the first element of data rank 0's partition (at stage 1 too).
    if (s == 0 && grid.data_rank() == 0) kiln::test::check_equal(e.optimizer().master().narrow(0, 0, 1), full({1}, c.master));
    if (c.wide || s == 1) CHECK_FALSE(stage.w.grad().defined());
    // A second batch: the copy's sum starts again from zero (w' = -260 adds nothing to its gradient).
    e.train_batch(s == 0 ? x : Tensor(), s == 1 ? y : Tensor());
    if (s == 0 && grid.data_rank() == 0) {
      kiln::test::check_equal(e.optimizer().master().narrow(0, 0, 1), full({1}, 2 * c.master));
    }
  }
  world->barrier();
}

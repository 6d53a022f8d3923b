// distributed/engine/config.cpp: reading a DeepSpeed JSON configuration strictly (see config.h).
#include "distributed/engine/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "autograd/autograd.h"
#include "core/error.h"

namespace kiln {

namespace {

using json = nlohmann::json;

// DeepSpeed keys that Kiln does not implement, by section: naming them apart from typos tells the
// user that the key is right but the feature is not here.
const std::set<std::string> kUnsupportedTop = {
    "amp", "aio", "autotuning", "comet", "compression_training",
    "data_efficiency", "disable_allgather", "dump_state", "eigenvalue", "elasticity", "hybrid_engine", "nebula",
    "pipeline", "progressive_layer_drop", "quantize_training", "sparse_attention", "sparse_gradients",
    "wandb", "compile", "zero_force_ds_cpu_optimizer", "seq_parallel_communication_data_type",
    "weight_quantization"};
const std::set<std::string> kUnsupportedZero = {
    "round_robin_gradients", "elastic_checkpoint", "cpu_offload",
    "cpu_offload_params", "cpu_offload_use_pin_memory", "mics_hierarchical_params_gather",
    "memory_efficient_linear",
    "legacy_stage1", "use_multi_rank_bucket_allreduce", "pipeline_loading_checkpoint", "override_module_apply",
    "zeropp_loco_param", "log_trace_cache_warnings"};
// DeepSpeed's NVMe and tuning keys of "offload_optimizer" and of "offload_param".
const std::set<std::string> kUnsupportedOffloadOptimizer = {"nvme_path", "buffer_count", "pipeline_read",
                                                            "pipeline_write", "fast_init", "ratio"};
const std::set<std::string> kUnsupportedOffloadParam = {"nvme_path", "buffer_count", "buffer_size", "max_in_cpu"};

// DeepSpeed options that Kiln does not implement and that have no value asking for nothing: their
// presence asks for something (sparse_attention, pipeline, compile), or their default is on
// (DeepSpeed's memory-efficient ZeRO-3 linear, its CPU Adam check, ...).
const std::set<std::string> kNoOffValue = {"sparse_attention",
                                           "pipeline",
                                           "compile",
                                           "zero_force_ds_cpu_optimizer",
                                           "memory_efficient_linear",
                                           "use_multi_rank_bucket_allreduce",
                                           "override_module_apply"};

// The value that turns off a DeepSpeed option that Kiln does not implement, for messages.
std::string off_value(const std::string& key) {
  if (key == "ratio") return "1";
  return "false, null or {\"enabled\": false}";
}

// Whether a DeepSpeed key that Kiln does not implement asks for nothing where it is: set to
// DeepSpeed's "off" (false, null, a section with "enabled": false or holding nothing but false and
// null, or off_value's number), as configs written for DeepSpeed often carry them
// ("sparse_gradients": false, "wandb": {"enabled": false}). Such a key is accepted and does
// nothing; any other value of it is an Error.
bool asks_for_nothing(const std::string& key, const json& v) {
  if (kNoOffValue.count(key)) return false;
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_object()) {
    const auto enabled = v.find("enabled");
    if (enabled != v.end()) return enabled->is_boolean() && !enabled->get<bool>();
    // A section without the switch ("data_types": {"grad_accum_dtype": null}): off where all of it
    // is; an empty one takes every default, which may be on.
    return !v.empty() &&
           std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_null() || (x.is_boolean() && !x.get<bool>()); });
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (key == "ratio") return x == 1.0;                                      // all of the optimizer offloaded
  }
  return false;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string type_name(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string (" + v.dump() + ")";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// One section of the file ("zero_optimization", "optimizer.params", or "" at the top), read key by
// key: every key must be one that is read (or listed as known), and each typed read checks the value.
class Section {
 public:
  Section(const std::string& source, std::string where, const json& obj, std::set<std::string> unsupported = {})
      : source_(source), where_(std::move(where)), obj_(obj), unsupported_(std::move(unsupported)) {
    if (!obj_.is_object()) fail_at("", "must be an object ({...}), not " + type_name(obj_));
  }

  [[noreturn]] void fail_at(const std::string& key, const std::string& what) const {
    std::string at = where_.empty() ? key : key.empty() ? where_ : where_ + "." + key;
    KILN_FAIL("{}: \"{}\" {}", source_, at.empty() ? "(top level)" : at, what);
  }

  bool has(const std::string& key) {
    known_.insert(key);
    return obj_.contains(key);
  }
  const json& at(const std::string& key) const { return obj_.at(key); }

  void read(const std::string& key, bool& out) {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (!v.is_boolean()) fail_at(key, "must be true or false, not " + type_name(v));
    out = v.get<bool>();
  }
  // An integer; a number with an integral value is accepted too (DeepSpeed's configs write 5e8).
  void read(const std::string& key, int64_t& out, int64_t min) {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (v.is_number_integer() || v.is_number_unsigned()) {
      out = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
               std::abs(v.get<double>()) < 9.2e18) {
      out = static_cast<int64_t>(v.get<double>());
    } else {
      fail_at(key, "must be an integer, not " + type_name(v) + (v.is_string() ? "; write it without quotes" : ""));
    }
    if (out < min) fail_at(key, fmt::format("must be >= {}, not {}", min, out));
  }
  void read(const std::string& key, int& out, int min) {
    int64_t v = out;
    read(key, v, min);
    if (v > 1'000'000'000) fail_at(key, fmt::format("is too large ({})", v));
    out = static_cast<int>(v);
  }
  void read(const std::string& key, std::optional<int64_t>& out) {
    if (!has(key)) return;
    int64_t v = 0;
    read(key, v, 1);
    out = v;
  }
  void read(const std::string& key, double& out, double min) {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (!v.is_number()) {
      fail_at(key, "must be a number, not " + type_name(v) + (v.is_string() ? "; write it without quotes" : ""));
    }
    out = v.get<double>();
    if (!(out >= min) || !std::isfinite(out)) fail_at(key, fmt::format("must be a finite number >= {}, not {}", min, out));
  }
  void read(const std::string& key, std::string& out) {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (!v.is_string()) fail_at(key, "must be a string, not " + type_name(v));
    out = v.get<std::string>();
  }
  // A list of strings, or of integers (integers: true), each checked for its type; absent or null
  // leaves `out` as it is. `of_what` names the items in messages: "a list of <of_what> (<example>)".
  template <class T>
  void read_list(const std::string& key, std::vector<T>& out, const std::string& of_what, const std::string& example) {
    if (!has(key) || obj_.at(key).is_null()) return;
    const json& v = obj_.at(key);
    if (!v.is_array()) fail_at(key, fmt::format("must be a list of {} ({}), not {}", of_what, example, type_name(v)));
    std::vector<T> items;
    for (const json& x : v) {
      const bool fits = std::is_same_v<T, std::string> ? x.is_string() : (x.is_number_integer() || x.is_number_unsigned());
      if (!fits) fail_at(key, fmt::format("must be a list of {}; it holds {}", of_what, type_name(x)));
      items.push_back(x.get<T>());
    }
    out = std::move(items);
  }
  // A boolean that Kiln implements at one value only (its behaviour is fixed).
  void read_fixed(const std::string& key, bool value, const std::string& why) {
    bool v = value;
    read(key, v);
    if (v != value) fail_at(key, fmt::format("must be {} in Kiln: {}", value ? "true" : "false", why));
  }
  // One number for every parameter group, or a list of them (DeepSpeed's per-group form).
  void read(const std::string& key, double& one, std::vector<double>& list) {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (v.is_number()) {
      read(key, one, 0.0);
      return;
    }
    if (!v.is_array() || v.empty()) fail_at(key, "must be a number or a list of numbers, not " + type_name(v));
    for (const json& x : v) {
      if (!x.is_number()) fail_at(key, "must be a list of numbers; it holds " + type_name(x));
      list.push_back(x.get<double>());
    }
  }

  // Every key of the object must have been read.
  void finish() const {
    for (const auto& [key, value] : obj_.items()) {
      if (known_.count(key)) continue;
      if (unsupported_.count(key)) {
        if (asks_for_nothing(key, value)) continue;
        if (kNoOffValue.count(key)) {
          fail_at(key, "is a DeepSpeed option that Kiln does not implement; remove it (docs/zero.md lists what "
                       "Kiln reads)");
        }
        fail_at(key, fmt::format("is a DeepSpeed option that Kiln does not implement, and {} asks for it; remove "
                                 "it, or turn it off ({}; docs/zero.md lists what Kiln reads)",
                                 value.dump().size() > 60 ? "this value" : value.dump(), off_value(key)));
      }
      std::string best;
      size_t best_d = 4;
      for (const auto& k : known_) {
        const size_t d = edit_distance(lower(key), lower(k));
        if (d < best_d) best_d = d, best = k;
      }
      std::string list;
      for (const auto& k : known_) list += (list.empty() ? "" : ", ") + k;
      fail_at(key, fmt::format("is not a key Kiln knows here{}; the keys allowed {} are: {}",
                               best.empty() ? "" : " (did you mean \"" + best + "\"?)",
                               where_.empty() ? "at the top level" : "in \"" + where_ + "\"", list));
    }
  }

 private:
  const std::string& source_;
  std::string where_;
  const json& obj_;
  std::set<std::string> unsupported_;
  std::set<std::string> known_;
};

// JSON allows a key twice in one object and nlohmann keeps the last; a config that does that has a
// mistake in it, so it is refused (DeepSpeed refuses it too).
json parse_refusing_duplicates(const std::string& text, const std::string& source) {
  struct Level {
    std::string name;
    std::set<std::string> keys;
  };
  std::vector<Level> levels;
  std::string last_key, duplicate, duplicate_in;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        levels.push_back({levels.empty() ? "" : last_key, {}});
        break;
      case json::parse_event_t::object_end:
        if (!levels.empty()) levels.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!levels.empty() && !levels.back().keys.insert(last_key).second && duplicate.empty()) {
          duplicate = last_key;
          duplicate_in = levels.back().name;
        }
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, callback);
  } catch (const json::parse_error& e) {
    KILN_FAIL("{}: not valid JSON: {}", source, e.what());
  }
  KILN_CHECK(duplicate.empty(), "{}: the key \"{}\" appears twice in {}; JSON keeps only the last, so one of them "
             "is a mistake: remove one", source, duplicate,
             duplicate_in.empty() ? std::string("the top level") : "\"" + duplicate_in + "\"");
  return j;
}

void read_optimizer(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("optimizer")) return;
  Section s(source, "optimizer", top.at("optimizer"));
  Config::Optimizer opt;
  std::string type;
  if (!s.has("type")) s.fail_at("type", "is missing; name the optimizer (\"Adam\", \"AdamW\", \"SGD\", ...)");
  s.read("type", type);
  opt.type = lower(type);
  const json empty = json::object();
  Section p(source, "optimizer.params", s.has("params") ? s.at("params") : empty);
  s.finish();
  if (opt.type == "adam" || opt.type == "adamw") {
    p.read("lr", opt.adam.lr, 0.0);
    if (p.has("betas")) {
      const json& b = p.at("betas");
      if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
        p.fail_at("betas", "must be a list of two numbers, [beta1, beta2]");
      opt.adam.beta1 = b[0].get<double>();
      opt.adam.beta2 = b[1].get<double>();
    }
    p.read("eps", opt.adam.eps, 0.0);
    p.read("weight_decay", opt.adam.weight_decay, 0.0);
    p.read("amsgrad", opt.adam.amsgrad);
    p.read("adam_w_mode", opt.adam_w_mode);
    if (opt.type == "adamw" && !opt.adam_w_mode)
      p.fail_at("adam_w_mode", "cannot be false for AdamW; use \"type\": \"Adam\" for L2 weight decay");
    bool torch_adam = false;  // torch's Adam or DeepSpeed's fused one: the same arithmetic
    p.read("torch_adam", torch_adam);
    p.read_fixed("bias_correction", true, "Adam's moments are always bias-corrected");
  } else if (opt.type == "sgd") {
    p.read("lr", opt.sgd.lr, 0.0);
    p.read("momentum", opt.sgd.momentum, 0.0);
    p.read("dampening", opt.sgd.dampening, 0.0);
    p.read("weight_decay", opt.sgd.weight_decay, 0.0);
    p.read("nesterov", opt.sgd.nesterov);
    p.read("maximize", opt.sgd.maximize);
    if (!p.has("lr")) p.fail_at("lr", "is required for SGD (as torch.optim.SGD)");
  } else if (opt.type == "adagrad") {
    p.read("lr", opt.adagrad.lr, 0.0);
    p.read("lr_decay", opt.adagrad.lr_decay, 0.0);
    p.read("weight_decay", opt.adagrad.weight_decay, 0.0);
    p.read("initial_accumulator_value", opt.adagrad.initial_accumulator_value, 0.0);
    p.read("eps", opt.adagrad.eps, 0.0);
  } else if (opt.type == "rmsprop") {
    p.read("lr", opt.rmsprop.lr, 0.0);
    p.read("alpha", opt.rmsprop.alpha, 0.0);
    p.read("eps", opt.rmsprop.eps, 0.0);
    p.read("weight_decay", opt.rmsprop.weight_decay, 0.0);
    p.read("momentum", opt.rmsprop.momentum, 0.0);
    p.read("centered", opt.rmsprop.centered);
  } else {
    s.fail_at("type", fmt::format("\"{}\" is not an optimizer Kiln has; use Adam, AdamW, SGD, Adagrad or RMSprop "
                                  "(DeepSpeed's Lamb, OneBitAdam and the like are not implemented)", type));
  }
  p.finish();
  cfg.optimizer = opt;
}

void read_warmup_type(Section& p, std::string& out) {
  p.read("warmup_type", out);
  if (out != "log" && out != "linear") p.fail_at("warmup_type", fmt::format("must be \"log\" or \"linear\", not \"{}\"", out));
}

void read_scheduler(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("scheduler")) return;
  Section s(source, "scheduler", top.at("scheduler"));
  Config::Scheduler sch;
  if (!s.has("type")) s.fail_at("type", "is missing; name the schedule (\"WarmupLR\", ...)");
  s.read("type", sch.type);
  const json empty = json::object();
  Section p(source, "scheduler.params", s.has("params") ? s.at("params") : empty);
  s.finish();
  if (p.has("last_batch_iteration")) {
    const json& v = p.at("last_batch_iteration");
    if (!v.is_number_integer() || v.get<int64_t>() != -1)
      p.fail_at("last_batch_iteration", "must be -1 in Kiln (a run resumes from its checkpoint instead)");
  }
  if (sch.type == "WarmupLR" || sch.type == "WarmupDecayLR") {
    auto& w = sch.warmup_decay_lr;
    p.read("warmup_min_lr", w.warmup_min_lr, w.warmup_min_lrs);
    p.read("warmup_max_lr", w.warmup_max_lr, w.warmup_max_lrs);
    p.read("warmup_num_steps", w.warmup_num_steps, 0);
    read_warmup_type(p, w.warmup_type);
    if (sch.type == "WarmupDecayLR") {
      if (!p.has("total_num_steps")) p.fail_at("total_num_steps", "is required for WarmupDecayLR");
      p.read("total_num_steps", w.total_num_steps, 1);
    }
    sch.warmup_lr = {.warmup_min_lr = w.warmup_min_lr, .warmup_max_lr = w.warmup_max_lr,
                     .warmup_num_steps = w.warmup_num_steps, .warmup_type = w.warmup_type,
                     .warmup_min_lrs = w.warmup_min_lrs, .warmup_max_lrs = w.warmup_max_lrs};
  } else if (sch.type == "WarmupCosineLR") {
    auto& c = sch.warmup_cosine_lr;
    if (!p.has("total_num_steps")) p.fail_at("total_num_steps", "is required for WarmupCosineLR");
    p.read("total_num_steps", c.total_num_steps, 1);
    p.read("warmup_min_ratio", c.warmup_min_ratio, 0.0);
    p.read("warmup_num_steps", c.warmup_num_steps, 0);
    p.read("cos_min_ratio", c.cos_min_ratio, 0.0);
    read_warmup_type(p, c.warmup_type);
  } else {
    s.fail_at("type", fmt::format("\"{}\" is not a schedule Kiln has; use WarmupLR, WarmupDecayLR or "
                                  "WarmupCosineLR (DeepSpeed's OneCycle and LRRangeTest are not implemented)",
                                  sch.type));
  }
  p.finish();
  cfg.scheduler = sch;
}

void read_fp16(Section& top, const std::string& source, Config& cfg) {
  if (top.has("fp16")) {
    Section s(source, "fp16", top.at("fp16"), {"fp16_master_weights_and_grads"});
    auto& o = cfg.fp16.scaler;
    s.read("enabled", cfg.fp16.enabled);
    s.read("auto_cast", cfg.fp16.auto_cast);
    s.read("loss_scale", o.loss_scale, 0.0);
    s.read("initial_scale_power", o.initial_scale_power, 0);
    if (o.initial_scale_power > 127) s.fail_at("initial_scale_power", "must be at most 127 (2^128 is not a float)");
    s.read("loss_scale_window", o.loss_scale_window, 1);
    s.read("hysteresis", o.hysteresis, 1);
    s.read("consecutive_hysteresis", o.consecutive_hysteresis);
    s.read("min_loss_scale", o.min_loss_scale, 0.0);
    s.finish();
  }
  if (top.has("bf16")) {
    Section s(source, "bf16", top.at("bf16"), {"immediate_grad_update", "check_grad_overflow"});
    s.read("enabled", cfg.bf16.enabled);
    s.finish();
  }
  if (cfg.fp16.enabled && cfg.bf16.enabled)
    top.fail_at("bf16", "and \"fp16\" are both enabled; train in one of them (DeepSpeed refuses this too)");
}

void read_zero(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("zero_optimization")) return;
  Section s(source, "zero_optimization", top.at("zero_optimization"), kUnsupportedZero);
  auto& z = cfg.zero_optimization;
  s.read("stage", z.stage, 0);
  if (z.stage > 3) s.fail_at("stage", fmt::format("must be 0, 1, 2 or 3, not {}", z.stage));
  z.overlap_comm = z.stage == 3;  // DeepSpeed's default: on at stage 3 only
  s.read("reduce_bucket_size", z.reduce_bucket_size, 1);
  s.read("allgather_bucket_size", z.allgather_bucket_size, 1);
  s.read("overlap_comm", z.overlap_comm);
  s.read("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0);
  s.read("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0);
  s.read("stage3_model_persistence_threshold", z.stage3_model_persistence_threshold, 0);
  s.read("stage3_max_live_parameters", z.stage3_max_live_parameters, 0);
  s.read("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0);
  s.read("sub_group_size", z.sub_group_size, 0);
  // The fp16 name is DeepSpeed's older one for the same switch.
  if (s.has("stage3_gather_16bit_weights_on_model_save") && s.has("stage3_gather_fp16_weights_on_model_save")) {
    s.fail_at("stage3_gather_fp16_weights_on_model_save",
              "is the older name of \"stage3_gather_16bit_weights_on_model_save\", which is given too; keep one");
  }
  s.read("stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);
  s.read("stage3_gather_fp16_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);
  s.read_fixed("contiguous_gradients", true, "gradients are always copied into contiguous buckets");
  s.read_fixed("reduce_scatter", true, "gradients are always reduce-scattered from stage 1 on");
  s.read_fixed("allgather_partitions", true, "the weights are always all-gathered after a step");
  s.read_fixed("ignore_unused_parameters", true, "a parameter without a gradient in a step contributes zeros");
  s.read_fixed("load_from_fp32_weights", true, "checkpoints hold the float32 masters, and resume from them");
  // offload_optimizer and offload_param: {"device": "none" | "cpu", "pin_memory": ...}.
  auto read_offload = [&](const char* key, const std::set<std::string>& unsupported, bool& to_cpu) {
    if (!s.has(key)) return;
    Section o(source, fmt::format("zero_optimization.{}", key), s.at(key), unsupported);
    std::string device = "none";
    o.read("device", device);
    if (device != "none" && device != "cpu") {
      o.fail_at("device", fmt::format("must be \"none\" or \"cpu\", not \"{}\" (Kiln has no NVMe offload)", device));
    }
    bool pin_memory = false;  // the host copies are made through pinned staging either way
    o.read("pin_memory", pin_memory);
    o.finish();
    to_cpu = device == "cpu";
  };
  read_offload("offload_optimizer", kUnsupportedOffloadOptimizer, z.offload_optimizer);
  read_offload("offload_param", kUnsupportedOffloadParam, z.offload_param);
  if (z.offload_param && z.stage != 3) {
    s.fail_at("offload_param", fmt::format("offloads stage 3's partitioned weights, and this is stage {} (DeepSpeed "
                                           "ignores it there); remove it, or use stage 3", z.stage));
  }
  // MiCS: -1 is off; a number of ranks shards stage 3 over groups of that many (ZeroOptions).
  s.read("mics_shard_size", z.mics_shard_size, -1);
  if (z.mics_shard_size == 0) s.fail_at("mics_shard_size", "must be -1 (off) or a number of ranks >= 1, not 0");
  if (z.mics_shard_size != -1 && z.stage != 3) {
    s.fail_at("mics_shard_size", fmt::format("shards stage 3's model states over groups of ranks, and this is stage {} "
                                             "(DeepSpeed's MiCS is a stage 3 optimizer too); remove it, or use stage 3", z.stage));
  }
  // ZeRO++'s hpZ: 1 is off; a number of ranks keeps a secondary shard of the weights per group of that many.
  s.read("zero_hpz_partition_size", z.zero_hpz_partition_size, 1);
  if (z.zero_hpz_partition_size != 1 && z.stage != 3) {
    s.fail_at("zero_hpz_partition_size",
              fmt::format("keeps a secondary shard of stage 3's partitioned weights, and this is stage {} (DeepSpeed's "
                          "hpZ is for stage 3 too); remove it, or use stage 3", z.stage));
  }
  if (z.zero_hpz_partition_size != 1 && z.mics_shard_size != -1) {
    s.fail_at("zero_hpz_partition_size", "and \"mics_shard_size\" are both set; use one (hpZ shards over all ranks "
                                         "and keeps a copy of the weights per group, MiCS shards within each group)");
  }
  // ZeRO++'s qwZ: stage 3's weight gathers in int8 blocks.
  s.read("zero_quantized_weights", z.zero_quantized_weights);
  if (z.zero_quantized_weights && z.stage != 3) {
    s.fail_at("zero_quantized_weights",
              fmt::format("quantizes stage 3's weight all-gathers, and this is stage {}, which gathers no weights; "
                          "remove it, or use stage 3", z.stage));
  }
  // ZeRO++'s qgZ: stage 3's gradient reduction as int8 all-to-alls.
  s.read("zero_quantized_gradients", z.zero_quantized_gradients);
  if (z.zero_quantized_gradients && z.stage != 3) {
    s.fail_at("zero_quantized_gradients",
              fmt::format("quantizes stage 3's gradient reduction (DeepSpeed's qgZ is for stage 3), and this is stage "
                          "{}; remove it, or use stage 3", z.stage));
  }
  s.finish();
}

// DeepSpeed's "activation_checkpointing" (deepspeed.checkpointing.configure's options).
void read_activation_checkpointing(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("activation_checkpointing")) return;
  Section s(source, "activation_checkpointing", top.at("activation_checkpointing"));
  auto& a = cfg.activation_checkpointing.emplace();
  s.read("partition_activations", a.partition_activations);
  s.read("cpu_checkpointing", a.cpu_checkpointing);
  s.read_fixed("contiguous_memory_optimization", false,
               "the kept inputs are not copied into one preallocated buffer (the caching allocator reuses freed "
               "blocks); remove it");
  // Sizes contiguous_memory_optimization's buffer, which Kiln does not have: checked, no effect.
  if (s.has("number_checkpoints") && !s.at("number_checkpoints").is_null()) {
    std::optional<int64_t> n;
    s.read("number_checkpoints", n);
  }
  s.read("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  bool profile = false;
  s.read("profile", profile);
  if (profile) a.profile = std::make_shared<autograd::CheckpointProfile>();  // Engine makes its own
  s.finish();
}

// DeepSpeed's "flops_profiler": which step's forward to profile on rank 0 and what to print.
void read_flops_profiler(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("flops_profiler")) return;
  Section s(source, "flops_profiler", top.at("flops_profiler"));
  auto& f = cfg.flops_profiler;
  s.read("enabled", f.enabled);
  s.read("recompute_fwd_factor", f.recompute_fwd_factor, 0.0);
  s.read("profile_step", f.profile_step, 0);
  s.read("module_depth", f.module_depth, -1);
  s.read("top_modules", f.top_modules, 1);
  s.read("detailed", f.detailed);
  if (s.has("output_file") && !s.at("output_file").is_null()) s.read("output_file", f.output_file);
  s.finish();
}

// DeepSpeed's "checkpoint": tag_validation, and the options of its own formats and storage, which
// Kiln reads only where they are off.
void read_checkpoint(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("checkpoint") || top.at("checkpoint").is_null()) return;
  Section s(source, "checkpoint", top.at("checkpoint"));
  std::string mode = cfg.checkpoint_tag_validation;
  s.read("tag_validation", mode);
  mode = lower(mode);
  if (mode != "warn" && mode != "ignore" && mode != "fail") {
    s.fail_at("tag_validation", fmt::format("must be \"Warn\", \"Ignore\" or \"Fail\", not \"{}\"", mode));
  }
  cfg.checkpoint_tag_validation = mode;
  s.read_fixed("load_universal", false,
               "DeepSpeed's universal checkpoints are not implemented; Kiln's own load at another world size and "
               "ZeRO stage (Engine::load_checkpoint)");
  s.read_fixed("use_node_local_storage", false, "every rank writes to the checkpoint's directory");
  if (s.has("parallel_write") && !s.at("parallel_write").is_null()) {
    Section w(source, "checkpoint.parallel_write", s.at("parallel_write"));
    w.read_fixed("pipeline_stage", false, "each pipeline stage's files are written by its own ranks already");
    w.finish();
  }
  s.finish();
}

// DeepSpeed's "comms_logger": which communication operations to time (distributed/comm/comms_logger.h).
void read_comms_logger(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("comms_logger") || top.at("comms_logger").is_null()) return;
  Section s(source, "comms_logger", top.at("comms_logger"));
  auto& c = cfg.comms_logger;
  s.read("enabled", c.enabled);
  s.read("verbose", c.verbose);
  s.read("prof_all", c.prof_all);
  s.read("debug", c.debug);
  s.read_list("prof_ops", c.prof_ops, "operation names", "\"all_reduce\", ...");
  for (const std::string& op : c.prof_ops) {
    if (std::find(std::begin(distributed::kCommOpNames), std::end(distributed::kCommOpNames), op) ==
        std::end(distributed::kCommOpNames)) {
      std::string names;
      for (const char* n : distributed::kCommOpNames) names += (names.empty() ? "" : ", ") + std::string(n);
      s.fail_at("prof_ops", fmt::format("names \"{}\", which is not a communication operation; the operations are: {}",
                                        op, names));
    }
  }
  s.finish();
}

// DeepSpeed's monitors "tensorboard" and "csv_monitor": where rank 0 writes the training events.
void read_monitor(Section& top, const std::string& source, const std::string& key, Config::Monitor& m) {
  if (!top.has(key) || top.at(key).is_null()) return;
  Section s(source, key, top.at(key));
  s.read("enabled", m.enabled);
  if (s.has("output_path") && !s.at("output_path").is_null()) s.read("output_path", m.output_path);
  if (s.has("job_name") && !s.at("job_name").is_null()) s.read("job_name", m.job_name);
  if (m.job_name.empty() || m.job_name.find('/') != std::string::npos || m.job_name == "." || m.job_name == "..") {
    s.fail_at("job_name", fmt::format("is \"{}\"; it names the folder the events go to under output_path: give a "
                                      "name without '/'", m.job_name));
  }
  s.finish();
}

// A dtype named as DeepSpeed's DtypeEnum names them ("fp32", "float32", "float", "torch.float32",
// ... any case), or nothing.
std::optional<DType> dtype_named(const std::string& given) {
  const std::string name = lower(given);
  if (name == "fp32" || name == "float32" || name == "float" || name == "torch.float32") return kFloat32;
  if (name == "fp16" || name == "float16" || name == "half" || name == "torch.float16") return kFloat16;
  // bfp16: communication_data_type's older name for it
  if (name == "bf16" || name == "bfloat16" || name == "bfloat" || name == "torch.bfloat16" || name == "bfp16") {
    return kBFloat16;
  }
  return std::nullopt;
}

// A dtype key (null: unset, as DeepSpeed's default).
void read_dtype(Section& s, const std::string& key, std::optional<DType>& out) {
  if (!s.has(key) || s.at(key).is_null()) return;
  std::string given;
  s.read(key, given);
  out = dtype_named(given);
  if (!out) {
    s.fail_at(key, fmt::format("must be \"fp32\", \"fp16\" or \"bf16\" (or null: DeepSpeed's default), not \"{}\"",
                               given));
  }
}

// DeepSpeed's top-level keys for how the gradients are averaged (ZeroOptions has the arithmetic);
// null is DeepSpeed's default, as for every key here.
void read_gradient_averaging(Section& top, distributed::ZeroOptions& z) {
  if (top.has("prescale_gradients") && !top.at("prescale_gradients").is_null()) {
    top.read("prescale_gradients", z.prescale_gradients);
  }
  if (top.has("gradient_predivide_factor") && !top.at("gradient_predivide_factor").is_null()) {
    const json& v = top.at("gradient_predivide_factor");
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) {
      top.fail_at("gradient_predivide_factor", fmt::format("must be a finite number > 0 (the gradients are divided by it "
                                                           "before the sum; 1 is off), not {}", v.dump()));
    }
    z.gradient_predivide_factor = v.get<double>();
  }
  if (z.prescale_gradients && z.gradient_predivide_factor != 1.0) {
    top.fail_at("gradient_predivide_factor", fmt::format("is {}, and \"prescale_gradients\" is true: prescaling divides "
                                                         "by the number of ranks before the sum (DeepSpeed then ignores "
                                                         "the factor); give one of the two",
                                                         z.gradient_predivide_factor));
  }
  read_dtype(top, "communication_data_type", z.communication_data_type);
}

// DeepSpeed's "torch_autocast": {"enabled", "dtype", "lower_precision_safe_modules"}. The modules
// are named as Python classes ("torch.nn.Linear", "torch.nn.modules.linear.Linear") or C++ ones
// ("kiln::nn::Linear"); what counts is the class name after the last '.' or "::", which is what
// nn::Module::name() gives.
void read_torch_autocast(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("torch_autocast") || top.at("torch_autocast").is_null()) return;
  Section s(source, "torch_autocast", top.at("torch_autocast"));
  auto& t = cfg.torch_autocast;
  s.read("enabled", t.enabled);
  if (s.has("dtype") && !s.at("dtype").is_null()) {
    std::string given;
    s.read("dtype", given);
    const std::optional<DType> d = dtype_named(given);
    if (!d || *d == kFloat32) {
      s.fail_at("dtype", fmt::format("must be \"bfloat16\" or \"float16\" (\"bf16\", \"fp16\", ...; null: the "
                                     "device's default, bfloat16 on a CPU and float16 on a GPU, as torch.autocast's), "
                                     "not \"{}\"{}", given, d ? "; float32 is no autocast: set \"enabled\": false" : ""));
    }
    t.dtype = d;
  }
  if (s.has("lower_precision_safe_modules") && !s.at("lower_precision_safe_modules").is_null()) {
    std::vector<std::string> names;
    s.read_list("lower_precision_safe_modules", names, "module classes", "\"torch.nn.Linear\", ...");
    for (std::string& name : names) {
      const size_t cut = name.find_last_of(".:");
      if (cut + 1 == name.size()) {
        s.fail_at("lower_precision_safe_modules", fmt::format("holds \"{}\", which names no class; write one as "
                                                              "\"torch.nn.Linear\" or \"Linear\"", name));
      }
      if (cut != std::string::npos) name = name.substr(cut + 1);
    }
    t.lower_precision_safe_modules = std::move(names);
  }
  s.finish();
  if (!t.enabled) return;
  // DeepSpeed (runtime/torch_autocast.py) refuses these with torch_autocast too.
  if (cfg.fp16.enabled || cfg.bf16.enabled) {
    top.fail_at("torch_autocast", fmt::format("is enabled, and so is \"{}\", which keeps the model in 16 bits; "
                                              "torch_autocast keeps it in float32 and runs its forward under autocast: "
                                              "use one of the two", cfg.fp16.enabled ? "fp16" : "bf16"));
  }
  if (const auto& c = cfg.zero_optimization.communication_data_type; c && *c != kFloat32) {
    top.fail_at("communication_data_type", fmt::format("is {}, and torch_autocast is enabled: its "
                                                       "lower_precision_safe_modules' gradients travel in the autocast "
                                                       "dtype and the others in float32; remove the key, or set \"fp32\"",
                                                       dtype_name(*c)));
  }
}

// DeepSpeed's (legacy) "curriculum_learning" (distributed/engine/curriculum.h). Enabled, the keys
// DeepSpeed requires are required, and the schedule is checked by building it.
void read_curriculum(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("curriculum_learning") || top.at("curriculum_learning").is_null()) return;
  Section s(source, "curriculum_learning", top.at("curriculum_learning"));
  CurriculumOptions& c = cfg.curriculum_learning;
  s.read("enabled", c.enabled);
  s.read("curriculum_type", c.curriculum_type);
  s.read("min_difficulty", c.min_difficulty, 1);
  s.read("max_difficulty", c.max_difficulty, 1);
  s.read("schedule_type", c.schedule_type);
  if (s.has("schedule_config") && !s.at("schedule_config").is_null()) {
    Section sc(source, "curriculum_learning.schedule_config", s.at("schedule_config"));
    sc.read("total_curriculum_step", c.total_curriculum_step, 1);
    sc.read("difficulty_step", c.difficulty_step, 1);
    sc.read("root_degree", c.root_degree, 0.0);
    sc.read_list("difficulty", c.difficulty, "integers", "one per stage of the schedule");
    sc.read_list("max_step", c.max_step, "integers", "the last step of each difficulty but the last");
    sc.finish();
  }
  s.finish();
  if (!c.enabled) return;
  for (const char* key : {"curriculum_type", "min_difficulty", "max_difficulty", "schedule_type", "schedule_config"}) {
    if (!s.has(key)) s.fail_at(key, "is required when curriculum learning is enabled (as in DeepSpeed)");
  }
  // The schedule's own keys (an unknown schedule_type is the scheduler's Error below).
  const std::map<std::string, std::vector<const char*>> needed = {
      {"fixed_linear", {"total_curriculum_step", "difficulty_step"}},
      {"fixed_root", {"total_curriculum_step", "difficulty_step", "root_degree"}},
      {"fixed_discrete", {"difficulty", "max_step"}}};
  if (const auto it = needed.find(c.schedule_type); it != needed.end()) {
    for (const char* key : it->second) {
      if (!s.at("schedule_config").contains(key)) {
        s.fail_at("schedule_config", fmt::format("needs \"{}\" for the {} schedule (as in DeepSpeed)", key, c.schedule_type));
      }
    }
  }
  try {
    CurriculumScheduler check(c);
  } catch (const Error& e) {
    KILN_FAIL("{}: {}", source, e.what());
  }
}

// DeepSpeed's "data_types": {"grad_accum_dtype": ...}.
void read_data_types(Section& top, const std::string& source, Config& cfg) {
  if (!top.has("data_types") || top.at("data_types").is_null()) return;
  Section s(source, "data_types", top.at("data_types"));
  read_dtype(s, "grad_accum_dtype", cfg.zero_optimization.grad_accum_dtype);
  s.finish();
}

}  // namespace

Config Config::from_string(const std::string& text, const std::string& source) {
  // The JSON parser would stop at a NUL byte and take the text before it for the whole file.
  KILN_CHECK(text.find('\0') == std::string::npos, "{}: not valid JSON: it holds a NUL byte at offset {}", source,
             text.find('\0'));
  const json j = parse_refusing_duplicates(text, source);
  Config cfg;
  Section top(source, "", j, kUnsupportedTop);
  top.read("train_batch_size", cfg.train_batch_size);
  top.read("train_micro_batch_size_per_gpu", cfg.train_micro_batch_size_per_gpu);
  top.read("gradient_accumulation_steps", cfg.gradient_accumulation_steps);
  top.read("gradient_clipping", cfg.gradient_clipping, 0.0);
  top.read("steps_per_print", cfg.steps_per_print, 1);
  top.read("wall_clock_breakdown", cfg.wall_clock_breakdown);
  if (top.has("memory_breakdown") && !top.at("memory_breakdown").is_null()) {
    top.read("memory_breakdown", cfg.memory_breakdown);
  }
  top.read("zero_allow_untested_optimizer", cfg.zero_allow_untested_optimizer);
  read_gradient_averaging(top, cfg.zero_optimization);
  read_optimizer(top, source, cfg);
  read_scheduler(top, source, cfg);
  read_fp16(top, source, cfg);
  read_zero(top, source, cfg);
  read_activation_checkpointing(top, source, cfg);
  read_flops_profiler(top, source, cfg);
  read_checkpoint(top, source, cfg);
  read_comms_logger(top, source, cfg);
  read_monitor(top, source, "tensorboard", cfg.tensorboard);
  read_monitor(top, source, "csv_monitor", cfg.csv_monitor);
  read_data_types(top, source, cfg);
  read_torch_autocast(top, source, cfg);
  read_curriculum(top, source, cfg);
  top.finish();
  KILN_CHECK(cfg.train_batch_size || cfg.train_micro_batch_size_per_gpu,
             "{}: neither \"train_batch_size\" nor \"train_micro_batch_size_per_gpu\" is given; give at least one "
             "(DeepSpeed requires it too)", source);
  return cfg;
}

Config Config::from_file(const std::string& path) {
  // A regular file only: reading a FIFO would wait for a writer, /dev/zero would never end.
  std::error_code ec;
  KILN_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
             "Config::from_file: '{}' is not a regular file; give the path of a DeepSpeed ds_config.json", path);
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "Config::from_file: cannot open '{}'; check the path (a DeepSpeed ds_config.json)", path);
  std::ostringstream text;
  text << in.rdbuf();
  KILN_CHECK(!in.bad(), "Config::from_file: reading '{}' failed", path);
  return from_string(text.str(), path);
}

Config::Batch Config::resolve_batch(int world_size) const {
  KILN_CHECK(world_size >= 1, "Config::resolve_batch: the world size must be >= 1, not {}", world_size);
  const int64_t n = world_size;
  auto tb = train_batch_size, mb = train_micro_batch_size_per_gpu, ga = gradient_accumulation_steps;
  KILN_CHECK(tb || mb, "Config: neither train_batch_size nor train_micro_batch_size_per_gpu is set; set one");
  // micro x accumulation x ranks, checked: a product past 2^63 must not wrap into an agreeing batch.
  const auto product = [&](int64_t micro, int64_t accumulation) {
    int64_t p = 0;
    KILN_CHECK(!__builtin_mul_overflow(micro, accumulation, &p) && !__builtin_mul_overflow(p, n, &p),
               "Config: train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x {} ranks is more than "
               "fits in 64 bits; give smaller batch sizes", micro, accumulation, n);
    return p;
  };
  // DeepSpeed's order (runtime/config.py, _set_batch_related_parameters): given two, the third.
  if (tb && mb && !ga) ga = *tb / *mb / n;
  else if (tb && ga && !mb) mb = *tb / n / *ga;
  else if (mb && ga && !tb) tb = product(*mb, *ga);
  else if (tb && !mb && !ga) ga = 1, mb = *tb / n;
  else if (mb && !tb && !ga) ga = 1, tb = product(*mb, 1);
  KILN_CHECK(*mb >= 1 && *ga >= 1 && *tb >= 1 && *tb == product(*mb, *ga),
             "Config: the batch sizes do not agree: train_batch_size {} != micro {} x accumulation {} x data-parallel "
             "{} = {}; train_batch_size must be train_micro_batch_size_per_gpu x gradient_accumulation_steps x the "
             "number of ranks", *tb, *mb, *ga, n, product(*mb, *ga));
  return {*tb, *mb, *ga};
}

}  // namespace kiln

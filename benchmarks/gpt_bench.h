// gpt_bench.h: what bench_gpt_char.cpp and bench_checkpointing_mem.cpp share: BENCHMARKS.md's
// gpt_char training loop (e) and its JSON line, under the keys of the anchors
// (benchmarks/anchors/anchor_gpt_char.cpp, benchmarks/anchors/torch_gpt_char.py). Its timed step
// loop, train_steps, is bench_gpt2.cpp's too.
//
// The model is models::GPT with GPTConfig::gpt_char() (n_layer from --layers); AdamW lr 3e-4,
// (0.9, 0.999), eps 1e-8, weight decay 0.1 on every parameter; each step draws 16 windows of 128
// bytes from the corpus (data::ByteText::sample, seeded), then forward, mean cross-entropy,
// backward, optimizer step and loss.item(). ms_per_step is the median over steps 11 to the last.
// Flags measure the techniques: --checkpoint (every block), --full-recompute (checkpointed blocks run whole
// in backward, GPT::set_recompute_skips_unread(false)), --no-fusion, --fused-adam, --autocast bf16. Besides
// the anchors' keys, the line has train_increment_mib (peak RSS minus the RSS before the first step)
// and tensor_peak_increment_mib (the same from Kiln's allocator statistics: tensors and the
// kernels' scratch).
#pragma once

#include <kiln/kiln.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "models/gpt.h"

namespace gpt_bench {

constexpr int64_t kBatch = 16;

using kiln_bench::median;
using kiln_bench::peak_rss_mib;

// Resident set size now, in MiB (/proc/self/statm: pages).
inline double rss_now_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

// How a training step of a GPT runs: forward and loss under an autocast scope when `autocast`
// (in `low` precision), the activations saved for backward in host memory when `offload` (pinned on
// CUDA), the loss scaled by a GradScaler (which steps the optimizer itself when it is disabled).
struct StepOptions {
  kiln::Device device = kiln::Device::cpu();
  bool autocast = false;
  kiln::DType low = kiln::kBFloat16;
  bool offload = false;
};

// What a run of training steps measured: each timed step's milliseconds, the first and last losses.
struct StepLog {
  std::vector<double> ms;
  double loss_first = 0, loss_last = 0;
};

// Steps 1..steps of the loop every GPT benchmark times, from drawing the batch (next_batch: inputs
// and targets on the device) to loss.item(), which waits for the device; steps after `warmup` are
// timed.
inline StepLog train_steps(kiln::models::GPT& model, kiln::optim::Optimizer& opt, kiln::optim::GradScaler& scaler,
                           int64_t steps, int64_t warmup,
                           const std::function<std::pair<kiln::Tensor, kiln::Tensor>()>& next_batch,
                           const StepOptions& s) {
  using namespace kiln;
  StepLog log;
  for (int64_t step = 1; step <= steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto [x, y] = next_batch();
    Tensor loss;
    {
      std::optional<autograd::SaveOnCpu> offload;
      if (s.offload) offload.emplace(/*pin_memory=*/s.device.is_cuda());
      AutocastGuard ac(s.device, s.low, s.autocast);
      loss = models::GPT::loss(model(x), y);
    }
    opt.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(opt);  // opt.step() itself when the scaler is disabled
    scaler.update();
    const double l = loss.item<double>();
    const auto t1 = std::chrono::steady_clock::now();
    if (step == 1) log.loss_first = l;
    log.loss_last = l;
    if (step > warmup) log.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return log;
}

struct Options {
  std::string bench = "gpt_char";
  int64_t layers = 4;
  int64_t steps = 200;
  std::string corpus;  // empty: BENCHMARKS.md's corpus, built from Debian's fortunes package
  bool checkpoint = false;
  bool full_recompute = false;  // GPT::set_recompute_skips_unread(false)
  bool fusion = true;
  bool fused_adam = false;        // AdamW's fused multi-tensor step (optim::AdamWOptions::fused)
  std::string autocast = "none";  // "bf16": forward and loss under a bfloat16 autocast scope
  kiln::Device device = kiln::Device::cpu();
};

inline void usage_exit(const char* prog, const Options& d, int code) {
  std::fprintf(stderr,
               "usage: %s [--steps %lld] [--layers %lld] [--corpus FILE] [--checkpoint] [--full-recompute] [--no-fusion] "
               "[--fused-adam] [--autocast bf16] [--device cpu|cuda]\n",
               prog, static_cast<long long>(d.steps), static_cast<long long>(d.layers));
  std::exit(code);
}

inline Options parse_args(int argc, char** argv, Options defaults) {
  Options o = defaults;
  auto number = [&](int& i) {
    char* end = nullptr;
    long long v = std::strtoll(argv[++i], &end, 10);
    if (*end != '\0' || v <= 0) {
      std::fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0], argv[i], argv[i - 1]);
      std::exit(2);
    }
    return static_cast<int64_t>(v);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--steps" && has_value) {
      o.steps = number(i);
    } else if (a == "--layers" && has_value) {
      o.layers = number(i);
    } else if (a == "--corpus" && has_value) {
      o.corpus = argv[++i];
    } else if (a == "--checkpoint") {
      o.checkpoint = true;
    } else if (a == "--full-recompute") {
      o.full_recompute = true;
    } else if (a == "--no-fusion") {
      o.fusion = false;
    } else if (a == "--fused-adam") {
      o.fused_adam = true;
    } else if (a == "--autocast" && has_value && (std::string(argv[i + 1]) == "bf16" || std::string(argv[i + 1]) == "none")) {
      o.autocast = argv[++i];
    } else if (a == "--device" && has_value) {
      o.device = kiln::Device::parse(argv[++i]);
    } else {
      usage_exit(argv[0], defaults, a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

// Trains and prints the JSON line. Returns the exit status.
inline int run(const Options& o) {
  using namespace kiln;
  try {
    set_fusion(o.fusion);
    data::ByteText text = o.corpus.empty() ? data::ByteText::fortunes() : data::ByteText(o.corpus);
    manual_seed(0);
    models::GPTConfig config = models::GPTConfig::gpt_char();
    config.n_layer = o.layers;
    models::GPT model(config);
    model.to(o.device);
    model.set_checkpointing(o.checkpoint);
    model.set_recompute_skips_unread(!o.full_recompute);
    optim::AdamW opt(model.parameters(), {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1,
                                                 .fused = o.fused_adam});
    Generator gen(0);
    const double rss_before = rss_now_mib();
    memory::reset_peak(o.device);
    const double allocated_before = static_cast<double>(memory::stats(o.device).allocated_bytes) / (1 << 20);
    optim::GradScaler no_scaling({.enabled = false});
    const StepLog log = train_steps(
        model, opt, no_scaling, o.steps, /*warmup=*/10,
        [&] {
          data::Example batch = text.sample(kBatch, config.block_size, gen);
          return std::pair{batch.data.to(o.device), batch.target.to(o.device)};
        },
        {.device = o.device, .autocast = o.autocast == "bf16"});
    const double peak = peak_rss_mib();
    const double tensors_peak = static_cast<double>(memory::stats(o.device).peak_allocated_bytes) / (1 << 20);
    std::printf(
        "{\"bench\":\"%s\",\"impl\":\"kiln\",\"device\":\"%s\",\"threads\":%d,\"n_layer\":%lld,\"steps\":%lld,"
        "\"params\":%lld,\"ckpt\":%s,\"recompute\":\"%s\",\"fusion\":%s,\"fused_adam\":%s,\"autocast\":\"%s\",\"ms_per_step\":%.3f,\"loss_first\":%.4f,\"loss_final\":%.4f,"
        "\"peak_rss_mib\":%.1f,\"rss_before_train_mib\":%.1f,\"train_increment_mib\":%.1f,"
        "\"tensor_peak_increment_mib\":%.1f}\n",
        o.bench.c_str(), o.device.str().c_str(), get_num_threads(), static_cast<long long>(o.layers),
        static_cast<long long>(o.steps), static_cast<long long>(model.num_parameters()),
        o.checkpoint ? "true" : "false", o.full_recompute ? "full" : "skip", o.fusion ? "true" : "false", o.fused_adam ? "true" : "false", o.autocast.c_str(), median(log.ms), log.loss_first, log.loss_last, peak,
        rss_before, peak - rss_before, tensors_peak - allocated_before);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", o.bench.c_str(), e.what());
    return 1;
  }
}

}  // namespace gpt_bench

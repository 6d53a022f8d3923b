// nn/flops_profiler.h: DeepSpeed's flops profiler: the parameters, multiply-accumulates (MACs),
// floating-point operations and time of a model's forward, whole and module by module.
//
//   nn::FlopsProfiler prof(model);
//   prof.start_profile();
//   Tensor y = model(x);
//   prof.stop_profile();
//   prof.print_model_profile();        // the summary, the top modules by depth, the module tree
//   int64_t flops = prof.get_total_flops();
//   prof.end_profile();                // removes the hooks
//
// The ops count their own work (ops/flops.h has the rules, DeepSpeed's: 2 flops per MAC of the
// products, one per element of the elementwise ops, ...); forward hooks on every module take the
// counts and the time between a module's entry and its exit (waiting for a GPU at both, as
// DeepSpeed's hooks do). Backward is not counted, as in DeepSpeed, whose summary takes backward as
// twice the forward's flops. Counting is per thread: start_profile and stop_profile on the thread
// that runs the forward. kiln::initialize's engine runs it for the config's "flops_profiler"
// section at its profile_step, on rank 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "ops/flops.h"

namespace kiln::nn {

class FlopsProfiler {
 public:
  // numel gives a parameter's element count where numel() does not (ZeRO stage 3 drops the
  // parameters between uses: ZeroOptimizer::full_numel); empty: numel(). The profiler keeps a
  // reference to the model, which must outlive it (as a module's hooks refer to their module).
  explicit FlopsProfiler(Module& model, std::function<int64_t(const Tensor&)> numel = {});
  ~FlopsProfiler();
  FlopsProfiler(const FlopsProfiler&) = delete;
  FlopsProfiler& operator=(const FlopsProfiler&) = delete;

  // Hooks every module (on the first call) and counts this thread's forward ops from now on; the
  // figures start from zero (a second call without stop_profile restarts).
  void start_profile();
  // Stops counting; the figures stay until the next start_profile or reset_profile.
  void stop_profile();
  void reset_profile();
  void end_profile();  // stops, and removes the hooks

  int64_t get_total_flops() const;   // the model's forwards while counting
  int64_t get_total_macs() const;
  int64_t get_total_params() const;  // the model's parameters, each counted once
  double get_total_duration() const; // seconds spent in the model's forwards while counting

  // What DeepSpeed's print_model_profile prints: the summary; for each depth down to module_depth
  // (-1: every depth) the top_modules modules by params, MACs and forward latency; and with detailed,
  // the module tree with each module's figures. `extra` lines join the summary after the forward's
  // (the engine's backward and step latencies).
  std::string model_profile(int64_t profile_step = 1, int module_depth = -1, int top_modules = 1, bool detailed = true,
                            const std::vector<std::string>& extra = {}) const;
  // Prints it, or writes it to output_file (replacing it) when one is given.
  void print_model_profile(int64_t profile_step = 1, int module_depth = -1, int top_modules = 1,
                           bool detailed = true, const std::string& output_file = "",
                           const std::vector<std::string>& extra = {}) const;

  // One module's figures (the model is modules()[0], named "").
  struct ModuleProfile {
    std::string name;  // as named_modules() names it
    std::string type;  // Module::name()
    int depth = 0;     // 0 for the model
    int64_t params = 0;
    flops::Counts counts;
    double seconds = 0;
    int64_t calls = 0;
  };
  const std::vector<ModuleProfile>& modules() const { return profiles_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    flops::Counts counts;
    Clock::time_point time;
  };

  void wait_for_device() const;

  Module& model_;
  std::function<int64_t(const Tensor&)> numel_;
  Device device_ = Device::cpu();  // the model's, whose queued work the hooks wait for
  std::vector<ModuleProfile> profiles_;
  std::vector<std::vector<Entry>> open_;  // per module: its forwards running now
  std::vector<RemovableHandle> hooks_;
  flops::Counts counts_;                  // everything counted since start_profile
  std::unique_ptr<flops::Counting> counting_;
};

}  // namespace kiln::nn

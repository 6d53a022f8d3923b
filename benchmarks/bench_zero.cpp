// bench_zero: what each ZeRO stage keeps per rank, and what a step costs, on N ranks. Run it under
// the launcher at several world sizes:
//
//   kiln-run -n 4 build/release/bin/bench_zero [steps]
//
// The model is an MLP 784-1024-1024-1024-10 (2.9 M parameters) kept in bfloat16 and trained with
// AdamW (float32 masters and moments): the ZeRO paper's mixed-precision Adam, whose model states
// per rank are 16 Psi bytes at stage 0, 4 Psi + 12 Psi / N at stage 1, 2 Psi + 14 Psi / N at stage
// 2 and 16 Psi / N at stage 3 (BENCHMARKS.md's distributed target: within 5%). Measured for each
// stage: the CPU allocator's live bytes after a step minus before the model was built (weights,
// gradients, masters and Adam's state: the activations are freed by then), the peak during an
// iteration (forward, backward and step) above that, the peak of the optimizer step alone above
// what was allocated before it, ms per iteration and ms of the optimizer step alone (medians, the
// slowest rank's; the JSON keys say "step" for the iteration, as they always have), micro-batch 64
// per rank, one compute thread per rank, 2 MB gradient buckets with overlap. Stage 3 runs three
// ways: each weight all-gathered where it is used; prefetched (stage3_prefetch_bucket_size); and
// with DeepSpeed's defaults (prefetch, parameters of <= 100,000 elements persistent, weights kept
// between their forward and backward use), with the all-gathers per step started at the point of
// use and ahead, and the time per step spent waiting for them (the slowest rank's mean). Last,
// stages 0 and 2 with the gradient buckets sent in float32 (communication_data_type), and stage 2
// with them divided by the ranks before a plain sum (prescale_gradients); and stages 0 and 2 with
// the gradients accumulated in float32 (grad_accum_dtype; the formula then counts 4 bytes for them,
// not 2); and stage 3 stepped in sub-groups of one parameter each (sub_group_size 0), whose float32
// gradients are made one sub-group at a time, against the partition's at once. At an even number
// of ranks, stage 3 with MiCS (mics_shard_size half the ranks; its formula is 16 Psi / that), on
// demand and with DeepSpeed's defaults; and stage 3 with ZeRO++'s hpZ (zero_hpz_partition_size half
// the ranks; its formula adds 2 Psi / that for the secondary shard), on demand. At every number of
// ranks, stage 3 with ZeRO++'s qwZ (zero_quantized_weights: the weights' all-gathers in int8 blocks),
// on demand and with DeepSpeed's defaults, and with ZeRO++'s qgZ (zero_quantized_gradients: the
// gradient buckets as int8 all-to-alls), alone and with qwZ. Stage 3's lines give the MiB the
// all-gathers bring to a rank per step; every line the MiB its gradient reductions send to the
// other ranks per step.
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "bench_util.h"
#include "dp_bench.h"

using namespace kiln;
using namespace kiln::distributed;

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 10;
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  set_num_threads(1);
  manual_seed(1);
  const Tensor x = randn({64, 784}).to(kBFloat16);
  const Tensor y = randint(0, 10, {64});
  struct Run {
    int stage;
    const char* stage3;  // how stage 3 fetches its weights
    int64_t prefetch, persistence, reuse;
    std::optional<DType> wire = std::nullopt;  // communication_data_type
    bool prescale = false;                     // prescale_gradients
    std::optional<DType> accumulate = std::nullopt;  // grad_accum_dtype
    int64_t sub_group = 1'000'000'000;               // sub_group_size
    int64_t mics = -1;                               // mics_shard_size
    int64_t hpz = 1;                                 // zero_hpz_partition_size
    bool qwz = false;                                // zero_quantized_weights
    bool qgz = false;                                // zero_quantized_gradients
  };
  std::vector<Run> runs = {
      {0, "", 0, 0, 0},
      {1, "", 0, 0, 0},
      {2, "", 0, 0, 0},
      {3, "on demand", 0, 0, 0},
      {3, "prefetch", 50'000'000, 0, 0},
      {3, "prefetch, persistence, reuse (DeepSpeed's defaults)", 50'000'000, 100'000, 1'000'000'000},
      // How the gradients are averaged: float32 buckets (twice the bytes, two conversions) and
      // DeepSpeed's division before a plain sum, against stage 2's line above.
      {0, "", 0, 0, 0, kFloat32},
      {2, "", 0, 0, 0, kFloat32},
      {2, "", 0, 0, 0, std::nullopt, true},
      // Gradients accumulated in float32 (data_types.grad_accum_dtype; the engine's default for
      // bfloat16 at stage 0): 2 more bytes per element of the gradient buffer, no float32 copy of
      // them in the step.
      {0, "", 0, 0, 0, std::nullopt, false, kFloat32},
      {2, "", 0, 0, 0, std::nullopt, false, kFloat32},
      // Stage 3's step a parameter at a time (DeepSpeed's sub-groups, of whole parameters).
      {3, "prefetch, persistence, reuse (DeepSpeed's defaults)", 50'000'000, 100'000, 1'000'000'000, std::nullopt,
       false, std::nullopt, 0},
      // ZeRO++'s qwZ: the weights gathered as int8 values with a float32 scale per 2048.
      {3, "on demand", 0, 0, 0, std::nullopt, false, std::nullopt, 1'000'000'000, -1, 1, true},
      {3, "prefetch, persistence, reuse (DeepSpeed's defaults)", 50'000'000, 100'000, 1'000'000'000, std::nullopt,
       false, std::nullopt, 1'000'000'000, -1, 1, true},
      // ZeRO++'s qgZ: the gradient buckets as int8 all-to-alls, alone and with qwZ.
      {3, "prefetch, persistence, reuse (DeepSpeed's defaults)", 50'000'000, 100'000, 1'000'000'000, std::nullopt,
       false, std::nullopt, 1'000'000'000, -1, 1, false, true},
      {3, "prefetch, persistence, reuse (DeepSpeed's defaults)", 50'000'000, 100'000, 1'000'000'000, std::nullopt,
       false, std::nullopt, 1'000'000'000, -1, 1, true, true},
  };
  // MiCS at an even number of ranks: stage 3 in groups of half of them, replicated twice (the
  // weights' all-gathers and the buckets' reduce-scatters in a group, one all-reduce of each
  // rank's gradient partition across the groups per step).
  if (p % 2 == 0) {
    runs.push_back({3, "on demand", 0, 0, 0, std::nullopt, false, std::nullopt, 1'000'000'000, p / 2});
    runs.push_back({3, "prefetch, persistence, reuse (DeepSpeed's defaults)", 50'000'000, 100'000, 1'000'000'000,
                    std::nullopt, false, std::nullopt, 1'000'000'000, p / 2});
    // ZeRO++'s hpZ: the shards over every rank, a secondary copy in groups of half of them, which
    // backward's all-gathers read (on demand, so that backward gathers every weight).
    runs.push_back({3, "on demand", 0, 0, 0, std::nullopt, false, std::nullopt, 1'000'000'000, -1, p / 2});
  }
  for (const Run& run : runs) {
    const int stage = run.stage;
    const int64_t before = memory::stats(Device::cpu()).allocated_bytes;
    double psi = 0, states = 0, peak = 0, formula = 0, ms = 0;
    double opt_peak = 0;  // the most allocated during opt.step() above what was allocated before it
    double opt_ms = 0;    // opt.step()'s median time, the slowest rank's
    double gathers = 0, prefetches = 0;  // stage 3's all-gathers per step, at the point of use and ahead
    double secondary = 0;                // of them, hpZ's from the secondary shards
    double wait_ms = 0;                   // and the time per step spent waiting for them
    double gathered_mib = 0;              // and what they brought, per step
    double gradient_mib = 0;              // what the gradient reductions sent to the other ranks, per step
    {
      kiln_bench::Mlp784 net;
      net.to(kBFloat16);
      psi = static_cast<double>(net.num_parameters());
      ZeroOptimizer opt(net, comm, [](std::vector<Tensor> masters) {
        return std::make_unique<optim::AdamW>(std::move(masters), optim::AdamWOptions{.lr = 1e-3, .fused = true});
      }, {.stage = stage, .reduce_bucket_size = 1 << 20, .overlap_comm = true, .communication_data_type = run.wire,
          .prescale_gradients = run.prescale, .grad_accum_dtype = run.accumulate,
          .sub_group_size = run.sub_group, .stage3_prefetch_bucket_size = run.prefetch,
          .stage3_param_persistence_threshold = run.persistence, .stage3_max_reuse_distance = run.reuse,
          .mics_shard_size = run.mics, .zero_hpz_partition_size = run.hpz, .zero_quantized_weights = run.qwz,
          .zero_quantized_gradients = run.qgz});
      std::vector<double> times, step_times;  // the iterations', and the optimizer steps' alone
      ParamGatherer::Stats warm;
      int64_t warm_sent = 0;
      int64_t iteration_peak = 0, step_peak = 0;  // the last iteration's
      for (int s = 0; s < steps + 2; ++s) {
        if (s == 2) {
          warm = opt.stage3_stats();
          warm_sent = opt.gradient_bytes_sent();
        }
        comm->barrier();
        memory::reset_peak(Device::cpu());
        const auto t0 = Clock::now();
        Tensor loss = nn::cross_entropy(net(x).to(kFloat32), y);
        opt.zero_grad();
        loss.backward();
        const int64_t backward_peak = memory::stats(Device::cpu()).peak_allocated_bytes;
        memory::reset_peak(Device::cpu());  // the optimizer step's own peak
        const int64_t before_step = memory::stats(Device::cpu()).allocated_bytes;
        const auto t1 = Clock::now();
        opt.step();
        if (s >= 2) step_times.push_back(std::chrono::duration<double>(Clock::now() - t1).count() * 1e3);
        step_peak = memory::stats(Device::cpu()).peak_allocated_bytes - before_step;
        iteration_peak = std::max(backward_peak, memory::stats(Device::cpu()).peak_allocated_bytes);
        const double t = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
        if (s >= 2) times.push_back(t);  // warm-up: Adam's state is made in the first step
      }
      gathers = static_cast<double>(opt.stage3_stats().gathers - warm.gathers) / steps;
      prefetches = static_cast<double>(opt.stage3_stats().prefetches - warm.prefetches) / steps;
      secondary = static_cast<double>(opt.stage3_stats().secondary_gathers - warm.secondary_gathers) / steps;
      gathered_mib = static_cast<double>(opt.stage3_stats().gathered_bytes - warm.gathered_bytes) / steps / (1 << 20);
      gradient_mib = static_cast<double>(opt.gradient_bytes_sent() - warm_sent) / steps / (1 << 20);
      wait_ms = kiln_bench::slowest(*comm, (opt.stage3_stats().wait_seconds - warm.wait_seconds) * 1e3 / steps);
      ms = kiln_bench::slowest(*comm, kiln_bench::median(times));
      opt_ms = kiln_bench::slowest(*comm, kiln_bench::median(step_times));
      states = kiln_bench::slowest(*comm, static_cast<double>(memory::stats(Device::cpu()).allocated_bytes - before));
      peak = kiln_bench::slowest(*comm, static_cast<double>(iteration_peak - before));
      opt_peak = kiln_bench::slowest(*comm, static_cast<double>(step_peak));
      const double n = run.mics == -1 ? p : static_cast<double>(run.mics);  // the ranks a copy is sharded over
      formula = stage == 0 ? 16 * psi : stage == 1 ? 4 * psi + 12 * psi / n : stage == 2 ? 2 * psi + 14 * psi / n
                                                                                         : 16 * psi / n;
      if (run.accumulate) formula += stage <= 1 ? 2 * psi : 2 * psi / n;  // float32 gradients: 4 bytes, not 2
      if (run.hpz > 1) formula += 2 * psi / static_cast<double>(run.hpz);  // hpZ's secondary shard of the weights
    }
    if (r == 0) {
      std::printf("{\"bench\":\"zero\",\"impl\":\"kiln\",\"device\":\"cpu\",\"backend\":\"mpi\",\"ranks\":%d,"
                  "\"stage\":%d,%s%s\"model\":\"mlp 784-1024x3-10 bf16, AdamW\",\"params\":%.0f,"
                  "\"model_state_mib\":%.3f,\"formula_mib\":%.3f,\"ratio_to_formula\":%.4f,"
                  "\"peak_step_mib\":%.3f,\"optimizer_step_peak_mib\":%.3f,\"ms_per_step\":%.3f,"
                  "\"optimizer_step_ms\":%.3f,\"gradient_mib_sent_per_step\":%.3f%s}\n",
                  p, stage, stage == 3 ? fmt::format("\"stage3\":\"{}\",\"sub_group_size\":{},\"mics_shard_size\":{},"
                                                     "\"zero_hpz_partition_size\":{},\"zero_quantized_weights\":{},"
                                                     "\"zero_quantized_gradients\":{},",
                                                     run.stage3, run.sub_group, run.mics, run.hpz, run.qwz, run.qgz)
                                             .c_str()
                                    : "",
                  fmt::format("\"communication_data_type\":\"{}\",\"prescale_gradients\":{},\"grad_accum_dtype\":\"{}\",",
                              dtype_name(run.wire.value_or(kBFloat16)), run.prescale,
                              dtype_name(run.accumulate.value_or(kBFloat16))).c_str(), psi,
                  states / (1 << 20), formula / (1 << 20), states / formula, peak / (1 << 20), opt_peak / (1 << 20), ms, opt_ms,
                  gradient_mib,
                  stage == 3 ? fmt::format(",\"gathers_per_step\":{:.1f},\"prefetches_per_step\":{:.1f},"
                                           "\"secondary_gathers_per_step\":{:.1f},\"gather_wait_ms_per_step\":{:.3f},"
                                           "\"gathered_mib_per_step\":{:.3f}",
                                           gathers, prefetches, secondary, wait_ms, gathered_mib).c_str()
                             : "");
      std::fflush(stdout);
    }
  }
  return 0;
}

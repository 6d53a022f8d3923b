// bench_parallel_gpt: one GPT trained through kiln::Engine on every data x pipeline x tensor grid
// that the ranks make, to set the three kinds of parallelism side by side on the same model, batch
// and arithmetic (run it with as many ranks as cores, or the ranks share cores and the times mean
// nothing):
//
//   kiln-run -n 2 build/release/bin/bench_parallel_gpt [steps] [rounds]
//
// The model is gpt_char (BENCHMARKS.md e: 4 layers, 4 heads, 128 wide, context 128, 256 bytes),
// models::ParallelGPT, once with its head tied to the embedding (across stages on a pipeline: a copy
// on the last stage, whose gradient goes to the first and which gets the new weight back) and once
// untied, to measure what the tie costs a pipeline; and on grids with a tensor axis, tied and with
// sequence parallelism (the activations between the tensor-parallel layers cut along the sequence
// among the tensor group); and tied with dropout 0.1 (with and without sequence parallelism on the
// tensor grids), each rank drawing its part of the masks one process draws. A step is 16
// windows of 128 bytes in all, cut into 4 micro-batches per data-parallel rank, float32, AdamW
// (DeepSpeed's "AdamW", fused), clipping at 1.0, ZeRO stage 1 over the data axis. Per grid: ms per
// step (the median over rounds of each round's mean, the slowest rank's), tokens per second, the
// ratio to the data-parallel grid's time (of the same head and dropout), the ratio to the same grid's
// time with the untied head (without sequence parallelism or dropout), the ratio to the same run
// without dropout, the largest increment of a rank's tensor memory
// during a round's steps (its activations and the other transient tensors, over what the models
// hold), on grids of one stage the tensor memory that one micro-batch's forward and loss leave for
// its backward, and the loss after the last step (the same on every grid of one head, up to the summation
// order: the same training; with dropout, on every grid of one data rank, whose micro-batches and
// so masks are one process's: each run keeps its own generator state). On pipelines, without
// sequence parallelism, also as interleaved 1F1B with 2 chunks per pipeline rank (Megatron-LM's
// virtual stages), tied, without dropout and with it, with its time's ratio to the same grid's
// 1F1B of the same dropout. And tied with
// every block checkpointed (recomputed in backward): "skip_unread", the default, whose recompute
// leaves out the MLP's last GEMM and reduction, "whole", Megatron-LM's full recompute, and on grids
// with a tensor axis "skip_unread_partitioned", each tensor rank keeping half of each block's input
// (DeepSpeed's activation_checkpointing.partition_activations); each with the ratio of its time to
// the same grid's without. The runs take turns, round after round.
// PyTorch and LibTorch have no tensor or pipeline parallelism of their own to set beside this.
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "dp_bench.h"
#include "models/gpt_parallel.h"

using namespace kiln;
using namespace kiln::distributed;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  auto world = init("mpi");
  const int n = world->size();
  set_num_threads(1);
  const models::GPTConfig config = models::GPTConfig::gpt_char();
  const int64_t windows = 16, micro_batches = 4;

  struct Run {
    GridSizes sizes;
    bool tied = true, sequence_parallel = false;
    double dropout = 0;
    int chunks = 1;  // per pipeline rank: interleaved 1F1B when 2
    // 0: no checkpointing; 1: checkpointed, the recompute skips what is unread; 2: whole; 3: as 1,
    // each block's input partitioned among the tensor ranks
    int recompute = 0;
    std::unique_ptr<ParallelGrid> grid;
    std::vector<std::unique_ptr<models::ParallelGPT>> stages;  // this rank's chunks
    std::unique_ptr<Engine> engine;
    Generator::State rng{0, 0};  // where this run's dropout masks go on from (the runs take turns)
    std::vector<double> ms;  // per round
    double peak_mib = 0;     // the largest over rounds and ranks
    double kept_mib = -1;    // one stage: what a micro-batch's forward leaves for its backward
    double loss = 0;
  };
  std::vector<Run> runs;
  struct Variant {
    bool tied, sequence_parallel;
    double dropout;
    int recompute = 0;
  };
  for (const auto& [tied, sequence_parallel, dropout, recompute] :
       {Variant{true, false, 0}, {false, false, 0}, {true, true, 0}, {true, false, 0.1}, {true, true, 0.1},
        {true, false, 0, 1}, {true, false, 0, 2}, {true, false, 0, 3}}) {
    for (int t = 1; t <= n; ++t) {
      if ((sequence_parallel || recompute == 3) && t == 1) continue;
      for (int p = 1; t * p <= n; ++p) {
        if (n % (t * p) != 0 || config.n_head % t != 0 || p > config.n_layer) continue;
        const int data = n / (t * p);
        if (windows % (data * micro_batches) != 0) continue;
        for (int v : {1, 2}) {
          if (v > 1 && (p == 1 || sequence_parallel || recompute > 0 || micro_batches % p != 0 ||
                        p * v > config.n_layer)) {
            continue;
          }
          Run r;
          r.sizes = {.tensor = t, .pipeline = p};
          r.tied = tied;
          r.sequence_parallel = sequence_parallel;
          r.dropout = dropout;
          r.chunks = v;
          r.recompute = recompute;
          models::GPTConfig c = config;
          c.tie_weights = tied;
          c.dropout = dropout;
          r.grid = std::make_unique<ParallelGrid>(world, r.sizes);
          std::vector<nn::Module*> chunks;
          for (int k = 0; k < v; ++k) {
            manual_seed(7);  // each chunk draws the whole model and keeps its part
            r.stages.push_back(std::make_unique<models::ParallelGPT>(c, r.grid->tensor(), k * p + r.grid->pipeline_rank(),
                                                                     p * v, sequence_parallel, v));
            r.stages.back()->set_checkpointing(recompute > 0);
            r.stages.back()->set_recompute_skips_unread(recompute != 2);
            chunks.push_back(r.stages.back().get());
          }
          const Config cfg = Config::from_string(fmt::format(R"({{
              "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0,
              "steps_per_print": 1000000, "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4}}}},
              "zero_optimization": {{"stage": 1}},
              "activation_checkpointing": {{"partition_activations": {}}}}})",
              windows / data / micro_batches, micro_batches, recompute == 3 ? "true" : "false"));
          r.engine = std::make_unique<Engine>(chunks, cfg, *r.grid, models::ParallelGPT::loss);
          runs.push_back(std::move(r));
        }
      }
    }
  }
  // The same windows for every grid: each data rank takes its rows of them.
  Generator gen(11);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int s = 0; s < steps + 1; ++s) {
    Tensor idx = randint(0, config.vocab_size, {windows, config.block_size + 1}, kInt64, &gen);
    batches.emplace_back(idx.narrow(1, 0, config.block_size).contiguous(), idx.narrow(1, 1, config.block_size).contiguous());
  }
  // Each run draws its dropout masks from its own generator state, so that the grids of one data
  // rank draw the same masks (one process's) whatever ran in between.
  for (Run& r : runs) r.rng = {.seed = 5, .offset = 0};
  auto train = [&](Run& r, int first, int count) {
    const int data = r.grid->data_size(), d = r.grid->data_rank();
    const int64_t rows = windows / data;
    double loss = 0;
    default_generator().set_state(r.rng);
    for (int s = first; s < first + count; ++s) {
      const auto& [x, y] = batches[static_cast<size_t>(s)];
      loss = r.engine->train_batch(x.narrow(0, d * rows, rows), y.narrow(0, d * rows, rows)).item<double>();
    }
    r.rng = default_generator().get_state();
    return loss;
  };
  for (Run& r : runs) train(r, 0, 1);  // warm-up
  // On one stage: the tensor memory that one micro-batch's forward and loss leave for the backward
  // (the graph is dropped unused; the generator goes back to where it was).
  for (Run& r : runs) {
    if (r.sizes.pipeline != 1) continue;
    const int data = r.grid->data_size(), d = r.grid->data_rank();
    const int64_t rows = windows / data / micro_batches;
    const auto& [x, y] = batches[0];
    const Generator::State state = default_generator().get_state();
    const int64_t before = memory::stats(Device::cpu()).allocated_bytes;
    {
      Tensor loss = models::ParallelGPT::loss((*r.stages[0])(x.narrow(0, d * rows, rows)), y.narrow(0, d * rows, rows));
      const double mib = static_cast<double>(memory::stats(Device::cpu()).allocated_bytes - before) / (1 << 20);
      r.kept_mib = kiln_bench::slowest(*world, mib);
    }
    default_generator().set_state(state);
  }
  for (int round = 0; round < rounds; ++round) {
    for (Run& r : runs) {
      // Every round trains the same steps again from where the model is: the time is what counts.
      world->barrier();
      memory::reset_peak(Device::cpu());
      const int64_t held = memory::stats(Device::cpu()).allocated_bytes;
      const auto t0 = std::chrono::steady_clock::now();
      r.loss = train(r, 1, steps);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double mib = static_cast<double>(memory::stats(Device::cpu()).peak_allocated_bytes - held) / (1 << 20);
      r.ms.push_back(1e3 * kiln_bench::slowest(*world, s) / steps);
      r.peak_mib = std::max(r.peak_mib, kiln_bench::slowest(*world, mib));
    }
  }
  // The data-parallel grid's time for each head and dropout, each grid's time with the other head,
  // and each run's time without dropout.
  auto time_of = [&](bool tied, GridSizes sizes, bool sequence_parallel = false, double dropout = 0, int chunks = 1,
                     int recompute = 0) {
    for (const Run& r : runs) {
      if (r.tied == tied && r.sequence_parallel == sequence_parallel && r.dropout == dropout &&
          r.sizes.tensor == sizes.tensor && r.sizes.pipeline == sizes.pipeline && r.chunks == chunks &&
          r.recompute == recompute) {
        return kiln_bench::median(r.ms);
      }
    }
    return 0.0;
  };
  if (world->rank() == 0) {
    for (const Run& r : runs) {
      const double ms = kiln_bench::median(r.ms);
      const double lo = *std::min_element(r.ms.begin(), r.ms.end()), hi = *std::max_element(r.ms.begin(), r.ms.end());
      const double base = time_of(r.tied, {.tensor = 1, .pipeline = 1}, false, r.dropout, 1, r.recompute);
      const double untied = r.dropout == 0 && r.recompute == 0 ? time_of(false, r.sizes, false, 0, r.chunks) : 0.0;
      const double no_dropout = r.dropout > 0 ? time_of(r.tied, r.sizes, r.sequence_parallel, 0, r.chunks) : 0.0;
      const double one_chunk = r.chunks > 1 ? time_of(r.tied, r.sizes, false, r.dropout) : 0.0;
      const double no_checkpointing = r.recompute > 0 ? time_of(r.tied, r.sizes) : 0.0;
      std::printf("{\"bench\":\"parallel_gpt\",\"impl\":\"kiln\",\"device\":\"cpu\",\"backend\":\"mpi\",\"ranks\":%d,"
                  "\"tensor\":%d,\"pipeline\":%d,\"chunks\":%d,\"data\":%d,\"model\":\"%s\",\"sequence_parallel\":%s,\"dropout\":%.2f,"
                  "\"checkpointing\":\"%s\","
                  "\"windows_per_step\":%lld,"
                  "\"micro_batches\":%lld,\"steps\":%d,\"rounds\":%d,\"ms_per_step\":%.2f,\"ms_min\":%.2f,"
                  "\"ms_max\":%.2f,\"tokens_per_s\":%.0f,\"time_vs_data_parallel\":%.3f,\"time_vs_untied\":%.3f,"
                  "\"time_vs_no_dropout\":%.3f,\"time_vs_one_chunk\":%.3f,\"time_vs_no_checkpointing\":%.3f,"
                  "\"peak_increment_mib\":%.1f,\"kept_after_forward_mib\":%s,\"loss_after\":%.6f}\n",
                  n, r.sizes.tensor, r.sizes.pipeline, r.chunks, n / (r.sizes.tensor * r.sizes.pipeline),
                  r.tied ? "gpt_char" : "gpt_char_untied", r.sequence_parallel ? "true" : "false", r.dropout,
                  r.recompute == 0   ? "none"
                  : r.recompute == 1 ? "skip_unread"
                  : r.recompute == 2 ? "whole"
                                     : "skip_unread_partitioned",
                  static_cast<long long>(windows), static_cast<long long>(micro_batches), steps, rounds, ms, lo, hi,
                  static_cast<double>(windows * config.block_size) / (ms / 1e3), base > 0 ? ms / base : 0.0,
                  untied > 0 ? ms / untied : 0.0, no_dropout > 0 ? ms / no_dropout : 0.0,
                  one_chunk > 0 ? ms / one_chunk : 0.0, no_checkpointing > 0 ? ms / no_checkpointing : 0.0, r.peak_mib,
                  r.kept_mib < 0 ? "null" : fmt::format("{:.3f}", r.kept_mib).c_str(), r.loss);
    }
    std::fflush(stdout);
  }
  return 0;
}

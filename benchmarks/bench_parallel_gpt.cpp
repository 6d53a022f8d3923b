// bench_parallel_gpt: one GPT trained through kiln::Engine on every data x pipeline x tensor grid
// that the ranks make, to set the three kinds of parallelism side by side on the same model, batch
// and arithmetic (run it with as many ranks as cores, or the ranks share cores and the times mean
// nothing):
//
//   kiln-run -n 2 build/release/bin/bench_parallel_gpt [steps] [rounds]
//
// The model is gpt_char (BENCHMARKS.md e: 4 layers, 4 heads, 128 wide, context 128, 256 bytes),
// with an untied head so that every grid holds the same model (models::ParallelGPT). A step is 16
// windows of 128 bytes in all, cut into 4 micro-batches per data-parallel rank, float32, AdamW
// (DeepSpeed's "AdamW", fused), clipping at 1.0, ZeRO stage 1 over the data axis. Per grid: ms per
// step (the median over rounds of each round's mean, the slowest rank's), tokens per second, the
// ratio to the data-parallel grid's time, and the loss after the last step (the same on every
// grid, up to the summation order: the same training). The grids take turns, round after round.
// PyTorch and LibTorch have no tensor or pipeline parallelism of their own to set beside this.
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
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
  models::GPTConfig config = models::GPTConfig::gpt_char();
  config.tie_weights = false;
  const int64_t windows = 16, micro_batches = 4;

  struct Run {
    GridSizes sizes;
    std::unique_ptr<ParallelGrid> grid;
    std::unique_ptr<models::ParallelGPT> stage;
    std::unique_ptr<Engine> engine;
    std::vector<double> ms;  // per round
    double loss = 0;
  };
  std::vector<Run> runs;
  for (int t = 1; t <= n; ++t) {
    for (int p = 1; t * p <= n; ++p) {
      if (n % (t * p) != 0 || config.n_head % t != 0 || p > config.n_layer) continue;
      const int data = n / (t * p);
      if (windows % (data * micro_batches) != 0) continue;
      Run r;
      r.sizes = {.tensor = t, .pipeline = p};
      r.grid = std::make_unique<ParallelGrid>(world, r.sizes);
      manual_seed(7);
      r.stage = std::make_unique<models::ParallelGPT>(config, r.grid->tensor(), r.grid->pipeline_rank(), p);
      const Config cfg = Config::from_string(fmt::format(R"({{
          "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0,
          "steps_per_print": 1000000, "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4}}}},
          "zero_optimization": {{"stage": 1}}}})", windows / data / micro_batches, micro_batches));
      r.engine = std::make_unique<Engine>(*r.stage, cfg, *r.grid, models::ParallelGPT::loss);
      runs.push_back(std::move(r));
    }
  }
  // The same windows for every grid: each data rank takes its rows of them.
  Generator gen(11);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int s = 0; s < steps + 1; ++s) {
    Tensor idx = randint(0, config.vocab_size, {windows, config.block_size + 1}, kInt64, &gen);
    batches.emplace_back(idx.narrow(1, 0, config.block_size).contiguous(), idx.narrow(1, 1, config.block_size).contiguous());
  }
  auto train = [&](Run& r, int first, int count) {
    const int data = r.grid->data_size(), d = r.grid->data_rank();
    const int64_t rows = windows / data;
    double loss = 0;
    for (int s = first; s < first + count; ++s) {
      const auto& [x, y] = batches[static_cast<size_t>(s)];
      loss = r.engine->train_batch(x.narrow(0, d * rows, rows), y.narrow(0, d * rows, rows)).item<double>();
    }
    return loss;
  };
  for (Run& r : runs) train(r, 0, 1);  // warm-up
  for (int round = 0; round < rounds; ++round) {
    for (Run& r : runs) {
      // Every round trains the same steps again from where the model is: the time is what counts.
      world->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      r.loss = train(r, 1, steps);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.ms.push_back(1e3 * kiln_bench::slowest(*world, s) / steps);
    }
  }
  double base = 0;
  for (const Run& r : runs) {
    const double ms = kiln_bench::median(r.ms);
    if (r.sizes.tensor == 1 && r.sizes.pipeline == 1) base = ms;
  }
  if (world->rank() == 0) {
    for (const Run& r : runs) {
      const double ms = kiln_bench::median(r.ms);
      const double lo = *std::min_element(r.ms.begin(), r.ms.end()), hi = *std::max_element(r.ms.begin(), r.ms.end());
      std::printf("{\"bench\":\"parallel_gpt\",\"impl\":\"kiln\",\"device\":\"cpu\",\"backend\":\"mpi\",\"ranks\":%d,"
                  "\"tensor\":%d,\"pipeline\":%d,\"data\":%d,\"model\":\"gpt_char_untied\",\"windows_per_step\":%lld,"
                  "\"micro_batches\":%lld,\"steps\":%d,\"rounds\":%d,\"ms_per_step\":%.2f,\"ms_min\":%.2f,"
                  "\"ms_max\":%.2f,\"tokens_per_s\":%.0f,\"time_vs_data_parallel\":%.3f,\"loss_after\":%.6f}\n",
                  n, r.sizes.tensor, r.sizes.pipeline, n / (r.sizes.tensor * r.sizes.pipeline),
                  static_cast<long long>(windows), static_cast<long long>(micro_batches), steps, rounds, ms, lo, hi,
                  static_cast<double>(windows * config.block_size) / (ms / 1e3), base > 0 ? ms / base : 0.0, r.loss);
    }
    std::fflush(stdout);
  }
  return 0;
}

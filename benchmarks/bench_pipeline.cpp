// bench_pipeline: the pipeline bubble and activation memory of GPipe, 1F1B and interleaved 1F1B,
// measured against the theory, on p ranks (one stage each, or two chunks of half a stage each when
// interleaved; run it with as many ranks as cores, or the stages share cores and the times mean
// nothing):
//
//   kiln-run -n 2 build/release/bin/bench_pipeline [batches]
//
// Every stage is the same: 4 Linear(512, 512) + ReLU layers, so that each takes as long (when
// interleaved, each rank holds two chunks of 2 such layers: virtual stages c p + s of 2p, the same
// work per rank); each micro-batch is 512 rows, so a micro-batch costs the same whatever m. For
// m = 1, 2, 4, 8, each schedule (interleaved where p divides m), and receives posted ahead or when
// needed (PipelineOptions::recv_ahead): ms per batch (median over the batches, the slowest
// stage's); the bubble, the share of the batch (taken as long as the slowest stage's) in which a
// stage was not computing, as the mean over stages and on the busiest stage (the one that computed
// longest: the schedule's bubble without the stages' imbalance, which the mean adds), beside
// (p - 1) / (v m + p - 1) (v = 2 chunks when interleaved, else 1); the micro-batches alive at once
// on stage 0 (m for GPipe, p for 1F1B; chunks' micro-batches, 3p - 1 for 2 chunks at m >= 2p); and
// the peak of the CPU allocator's live bytes during a batch above its level before (the
// activations) on the last stage, which keeps m micro-batches alive under GPipe, 1 under 1F1B and
// up to p + 1 chunk micro-batches (half a stage's each) when interleaved (and, receiving ahead, the
// next micro-batch's input).
#include <kiln/kiln.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "dp_bench.h"

using namespace kiln;
using namespace kiln::distributed;

namespace {

struct Stage : nn::Module {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  explicit Stage(int n) {
    for (int i = 0; i < n; ++i) {
      layers.push_back(std::make_shared<nn::Linear>(512, 512));
      register_module(fmt::format("l{}", i + 1), layers.back());
    }
  }
  // The first stage's micro-batch becomes a leaf that requires grad, as every later stage's received
  // input is: each stage then also computes its input's gradient, the same work everywhere, as the
  // formula assumes. (A batch input requiring grad would not do: each micro-batch's backward through
  // the split then writes a gradient as large as the whole batch, m times on the first stage only.)
  Tensor forward(const Tensor& input) override {
    Tensor x = input.requires_grad() ? input : input.detach().requires_grad_();
    for (const auto& l : layers) x = relu((*l)(x));
    return x;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int batches = argc > 1 ? std::max(3, std::atoi(argv[1])) : 8;
  auto comm = init("mpi");
  const int p = comm->size(), s = comm->rank();
  set_num_threads(1);
  manual_seed(1);
  Stage stage(4), chunk_a(2), chunk_b(2);
  auto loss_fn = [](const Tensor& out, const Tensor& y) { return (out - y).square().mean(); };
  for (int64_t m : {1, 2, 4, 8}) {
    using enum PipelineSchedule;
    for (auto schedule : {kGPipe, k1F1B, kInterleaved1F1B}) {
      const bool interleaved = schedule == kInterleaved1F1B;
      if (interleaved && m % p != 0) continue;
      const int64_t v = interleaved ? 2 : 1;
      for (bool ahead : {true, false}) {
        std::vector<nn::Module*> chunks{&stage};
        if (interleaved) chunks = {&chunk_a, &chunk_b};
        Pipeline pipe(chunks, comm, loss_fn, {.micro_batches = m, .schedule = schedule, .recv_ahead = ahead});
        Tensor x = randn({512 * m, 512}), y = randn({512 * m, 512});
        std::vector<double> ms, bubble, busiest;
        double peak = 0;
        for (int b = 0; b < batches + 1; ++b) {
          for (nn::Module* c : chunks) c->zero_grad();
          comm->barrier();
          const int64_t before = memory::stats(Device::cpu()).allocated_bytes;
          memory::reset_peak(Device::cpu());
          pipe.train_batch(x, y);
          if (b == 0) continue;  // warm-up
          const auto st = pipe.last_stats();
          const double wall = kiln_bench::slowest(*comm, st.seconds);  // the batch, as the slowest stage saw it
          ms.push_back(wall * 1e3);
          bubble.push_back(1 - st.compute_seconds / wall);
          busiest.push_back(1 - kiln_bench::slowest(*comm, st.compute_seconds) / wall);
          peak = std::max(peak, static_cast<double>(memory::stats(Device::cpu()).peak_allocated_bytes - before));
        }
        const double ms_batch = kiln_bench::median(ms);
        // The last stage's: the first one also holds the whole batch's input gradient.
        const double last_peak = kiln_bench::slowest(*comm, s == p - 1 ? peak : 0.0);
        Tensor mean_bubble = full({1}, kiln_bench::median(bubble) / p, kFloat64);
        comm->all_reduce(mean_bubble, ReduceOp::Sum);
        const double theory = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
        if (s == 0) {
          std::printf("{\"bench\":\"pipeline\",\"impl\":\"kiln\",\"device\":\"cpu\",\"backend\":\"mpi\",\"ranks\":%d,"
                      "\"schedule\":\"%s\",\"chunks\":%lld,\"recv_ahead\":%s,\"micro_batches\":%lld,\"micro_batch_rows\":512,"
                      "\"ms_per_batch\":%.3f,\"bubble\":%.4f,\"bubble_busiest_stage\":%.4f,\"bubble_theory\":%.4f,"
                      "\"peak_in_flight_stage0\":%lld,\"peak_activation_mib_last_stage\":%.3f}\n",
                      p, schedule == kGPipe ? "gpipe" : interleaved ? "interleaved_1f1b" : "1f1b",
                      static_cast<long long>(v), ahead ? "true" : "false",
                      static_cast<long long>(m), ms_batch, mean_bubble.item<double>(), kiln_bench::median(busiest),
                      theory, static_cast<long long>(pipe.last_stats().peak_in_flight), last_peak / (1 << 20));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

// bench_ddp: one data-parallel training step (forward, backward with the gradient all-reduce,
// SGD step) with DistributedDataParallel's overlap on and off. Run it under the launcher:
//
//   kiln-run -n 2 build/release/bin/bench_ddp [steps]
//
// The model is an MLP 784-1024-1024-1024-10 (2.9 M parameters, 11.6 MB of float32 gradients;
// 25 MB buckets would make one bucket, so 2 MB buckets here), micro-batch 64 per rank, one compute
// thread per rank. For each mode: ms per step (median over the steps, the slowest rank's), the
// time backward's end waited for the all-reduces (exposed communication), and, measured apart,
// the all-reduces alone with no computation (the communication to hide). Hidden share =
// 1 - exposed(overlap on) / exposed(overlap off).
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "dp_bench.h"
using namespace kiln;
using namespace kiln::distributed;

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 30;
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  set_num_threads(1);
  manual_seed(1);
  Tensor x = randn({64, 784});
  Tensor y = randint(0, 10, {64});
  double exposed[2] = {0, 0}, step_ms[2] = {0, 0};
  for (int overlap = 1; overlap >= 0; --overlap) {
    kiln_bench::Mlp784 net;
    DistributedDataParallel ddp(net, comm, {.bucket_cap_mb = 2, .overlap = overlap == 1});
    optim::SGD opt(net.parameters(), {.lr = 0.01, .momentum = 0.9});
    std::vector<double> ms, wait;
    for (int s = 0; s < steps + 3; ++s) {
      comm->barrier();
      auto t0 = Clock::now();
      Tensor loss = nn::cross_entropy(ddp(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      const double t = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
      if (s >= 3) {  // warm-up
        ms.push_back(t);
        wait.push_back(ddp.last_stats().wait_seconds * 1e3);
      }
    }
    step_ms[overlap] = kiln_bench::slowest(*comm, kiln_bench::median(ms));
    exposed[overlap] = kiln_bench::slowest(*comm, kiln_bench::median(wait));
    if (r == 0) {
      std::printf("{\"bench\":\"ddp\",\"impl\":\"kiln\",\"device\":\"cpu\",\"backend\":\"mpi\",\"ranks\":%d,"
                  "\"model\":\"mlp 784-1024x3-10\",\"micro_batch\":64,\"overlap\":%s,\"buckets\":%zu,"
                  "\"ms_per_step\":%.3f,\"exposed_comm_ms\":%.3f}\n",
                  p, overlap ? "true" : "false", ddp.bucket_names().size(), step_ms[overlap], exposed[overlap]);
      std::fflush(stdout);
    }
  }
  // The communication alone: the same buckets all-reduced with nothing else running.
  kiln_bench::Mlp784 net;
  int64_t numel = 0;
  for (const auto& t : net.parameters()) numel += t.numel();
  std::vector<Tensor> buckets;
  for (int64_t left = numel; left > 0; left -= 2 * 1024 * 1024 / 4) {
    buckets.push_back(zeros({std::min<int64_t>(left, 2 * 1024 * 1024 / 4)}));
  }
  std::vector<double> ms;
  for (int s = 0; s < steps + 3; ++s) {
    comm->barrier();
    auto t0 = Clock::now();
    std::vector<Work> works;
    for (auto& b : buckets) works.push_back(comm->all_reduce(b, ReduceOp::Avg, true));
    for (auto& w : works) w.wait();
    if (s >= 3) ms.push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
  }
  const double comm_ms = kiln_bench::slowest(*comm, kiln_bench::median(ms));
  if (r == 0) {
    const double hidden = exposed[0] > 0 ? 1 - exposed[1] / exposed[0] : 0;
    std::printf("{\"bench\":\"ddp\",\"impl\":\"kiln\",\"device\":\"cpu\",\"backend\":\"mpi\",\"ranks\":%d,"
                "\"summary\":\"overlap\",\"params\":%lld,\"allreduce_only_ms\":%.3f,\"ms_per_step_overlap\":%.3f,"
                "\"ms_per_step_no_overlap\":%.3f,\"speedup\":%.3f,\"hidden_share\":%.3f}\n",
                p, static_cast<long long>(numel), comm_ms, step_ms[1], step_ms[0], step_ms[0] / step_ms[1], hidden);
  }
  return 0;
}

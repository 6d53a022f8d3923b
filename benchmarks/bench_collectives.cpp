// bench_collectives: all-reduce, reduce-scatter and all-gather, nccl-tests style: message sizes
// 1 KiB to 256 MiB (float32), the communicator's native collective against the ring algorithm on
// send/recv (distributed/algorithms), algbw and busbw in GB/s. Run it under the launcher:
//
//   kiln-run -n 2 build/release/bin/bench_collectives [max_bytes] [mpi|nccl] [cpu|cuda]
//
// With nccl (a build with CUDA and NCCL, one GPU per rank) the tensors are on cuda:0 of each rank
// (kiln-run gives local rank i the GPU i modulo the GPUs there are). `mpi cuda` puts them on cuda:0
// too and measures the MPI backend's staging of CUDA tensors through pinned host buffers (several
// ranks may share one GPU). On CUDA every timing ends with a device synchronisation. The device
// defaults to cuda for nccl and to cpu for mpi.
//
// Time per op: the mean of back-to-back repetitions (about 0.3 s of them, at least 3) after 2
// warm-up ones, the slowest rank's. bytes is the whole buffer (all-reduce: each rank's tensor;
// reduce-scatter: each rank's input; all-gather: each rank's output), as nccl-tests counts it;
// algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for the other two: the
// link bandwidth the algorithm needs, comparable across rank counts. The pre-collective signature
// check is off here (CommOptions::check_collectives), so both sides time the transfer alone.
// One JSON line per (op, algorithm, size), then one summary line per op with the ring/native busbw
// ratios from 1 MiB up (the target of BENCHMARKS.md: >= 0.8).
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

using namespace kiln;
using namespace kiln::distributed;

namespace {

using Clock = std::chrono::steady_clock;

bool g_on_gpu = false;

void sync() {
  if (g_on_gpu) cuda::synchronize(0);
}

// Seconds per call of fn, the slowest rank's. The timings are all-reduced as tensors on `device`,
// the one the communicator carries (NCCL takes CUDA tensors only).
double time_op(Communicator& comm, const std::function<void()>& fn, Device device) {
  const TensorOptions f64 = TensorOptions(kFloat64).device(device);
  for (int i = 0; i < 2; ++i) fn();
  sync();
  comm.barrier();
  auto t0 = Clock::now();
  fn();
  sync();
  double once = std::chrono::duration<double>(Clock::now() - t0).count();
  Tensor o = full({1}, once, f64);
  comm.all_reduce(o, ReduceOp::Max);  // every rank picks the same repetition count
  const int reps = std::clamp(static_cast<int>(0.3 / std::max(o.item<double>(), 1e-7)), 3, 2000);
  comm.barrier();
  t0 = Clock::now();
  for (int i = 0; i < reps; ++i) fn();
  sync();
  Tensor t = full({1}, std::chrono::duration<double>(Clock::now() - t0).count() / reps, f64);
  comm.all_reduce(t, ReduceOp::Max);
  return t.item<double>();
}

int run(int argc, char** argv) {
  const int64_t max_bytes = argc > 1 ? std::atoll(argv[1]) : (int64_t{256} << 20);
  const std::string backend = argc > 2 ? argv[2] : "mpi";
  const std::string device_name = argc > 3 ? argv[3] : backend == "nccl" ? "cuda" : "cpu";
  if (max_bytes < 1024 || (backend != "mpi" && backend != "nccl") || (device_name != "cpu" && device_name != "cuda") ||
      (backend == "nccl" && device_name == "cpu")) {
    std::fprintf(stderr, "usage: bench_collectives [max_bytes >= 1024] [mpi|nccl] [cpu|cuda] (nccl: cuda only)\n");
    return 2;
  }
  g_on_gpu = device_name == "cuda";
  const Device device = g_on_gpu ? Device::cuda(0) : Device::cpu();
  auto comm = init(backend, {.check_collectives = false});
  const int p = comm->size(), r = comm->rank();
  set_num_threads(1);  // the ring's reductions: one thread per rank, as the ranks share the cores
  struct Ratio {
    double log_sum = 0, min = 1e9;
    int n = 0;
  };
  std::map<std::string, Ratio> ratios;
  for (const std::string op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
      const int64_t n = bytes / 4 / p * p;  // float32 elements, a multiple of the rank count
      Tensor full_buf = full({n}, 1.0 + r, TensorOptions(kFloat32).device(device));
      Tensor part = full({n / p}, 1.0 + r, TensorOptions(kFloat32).device(device));
      double secs[2];
      for (int ring_algo = 0; ring_algo < 2; ++ring_algo) {
        std::function<void()> fn;
        if (op == "all_reduce") {
          fn = ring_algo ? std::function<void()>([&] { ring::all_reduce(*comm, full_buf); })
                         : [&] { comm->all_reduce(full_buf); };
        } else if (op == "reduce_scatter") {
          fn = ring_algo ? std::function<void()>([&] { ring::reduce_scatter(*comm, part, full_buf); })
                         : [&] { comm->reduce_scatter_tensor(part, full_buf); };
        } else {
          fn = ring_algo ? std::function<void()>([&] { ring::all_gather(*comm, full_buf, part); })
                         : [&] { comm->all_gather_into_tensor(full_buf, part); };
        }
        secs[ring_algo] = time_op(*comm, fn, device);
        const double algbw = n * 4.0 / secs[ring_algo] / 1e9;
        const double factor = op == "all_reduce" ? 2.0 * (p - 1) / p : double(p - 1) / p;
        if (r == 0) {
          std::printf("{\"bench\":\"collectives\",\"impl\":\"kiln\",\"device\":\"%s\",\"backend\":\"%s\","
                      "\"ranks\":%d,\"op\":\"%s\",\"algo\":\"%s\",\"bytes\":%lld,\"us\":%.2f,"
                      "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f}\n",
                      device.str().c_str(), backend.c_str(), p, op.c_str(), ring_algo ? "ring" : "native",
                      static_cast<long long>(n * 4), secs[ring_algo] * 1e6, algbw, algbw * factor);
          std::fflush(stdout);
        }
      }
      if (bytes >= (int64_t{1} << 20)) {
        const double ratio = secs[0] / secs[1];  // ring busbw / native busbw
        auto& q = ratios[op];
        q.log_sum += std::log(ratio);
        q.min = std::min(q.min, ratio);
        ++q.n;
      }
    }
  }
  if (r == 0) {
    for (const auto& [op, q] : ratios) {
      std::printf("{\"bench\":\"collectives\",\"impl\":\"kiln\",\"device\":\"%s\",\"backend\":\"%s\","
                  "\"ranks\":%d,\"op\":\"%s\",\"summary\":\"ring/native busbw from 1 MiB\",\"sizes\":%d,"
                  "\"ratio_geomean\":%.3f,\"ratio_min\":%.3f,\"target\":0.8,\"met\":%s}\n",
                  device.str().c_str(), backend.c_str(), p, op.c_str(), q.n, std::exp(q.log_sum / q.n), q.min,
                  q.min >= 0.8 ? "true" : "false");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a CUDA device or an NCCL build missing, a peer lost, ...
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 1;
  }
}

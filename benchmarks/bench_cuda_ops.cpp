// bench_cuda_ops: BENCHMARKS.md's GPU kernel workloads for Kiln on cuda:0, one JSON line per result.
// Anchor: benchmarks/anchors/torch_cuda_ops.py (PyTorch on the same GPU, the same sizes and timing).
//   gemm        C = A B, square n x n, float32 (strict and TF32), bfloat16 and float16; TFLOP/s = 2 n^3 / time
//   add, gelu, clone, sum, softmax, add_bias (rows + a broadcast row), layer_norm, cross_entropy, sum_rows
//               (a sum over the rows, as a bias's gradient): memory-bound; GB/s counts each input
//               read once and each output written once (the fewest bytes the op must move);
//               softmax_fwd_bwd, layer_norm_fwd_bwd: forward and the input's gradient (five passes)
//   adamw       one optimizer step over 16 float32 tensors of 2^22 elements (torch: foreach), and
//   adamw_fused the same with fused = true (torch: fused=True)
//   linear      y = x W^T + b, GPT-2's MLP up-projection (torch: F.linear); TFLOP/s of the GEMM
//   linear_gelu gelu(x W^T + b), tanh form, the same sizes (torch: F.gelu(F.linear(...), approximate="tanh"))
// Timing: warm-up calls, then batches of calls between two device synchronizations; the result is
// the median over batches of the time per call.
//   bench_cuda_ops [--quick]
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"

using namespace kiln;

namespace {

const Device kGpu = Device::cuda(0);

using kiln_bench::median;

// Seconds per call of fn: 3 warm-up calls, then 7 batches of `reps` calls.
double time_per_call(const std::function<void()>& fn, int reps) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 3; ++i) fn();
  cuda::synchronize();
  std::vector<double> per_call;
  for (int b = 0; b < 7; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    cuda::synchronize();
    per_call.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return median(per_call);
}

void report(const char* op, const std::string& dtype, const std::string& shape, double seconds, const char* unit,
            double amount) {
  std::printf("{\"bench\":\"cuda_ops\",\"impl\":\"kiln\",\"op\":\"%s\",\"dtype\":\"%s\",\"shape\":\"%s\","
              "\"ms\":%.4f,\"%s\":%.1f}\n",
              op, dtype.c_str(), shape.c_str(), seconds * 1e3, unit, amount / seconds / 1e9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (!cuda::is_available()) {
    std::fprintf(stderr, "bench_cuda_ops: no CUDA device\n");
    return 77;
  }
  Generator gen(0);
  // ---- gemm ----
  struct GemmCase {
    const char* name;
    DType dtype;
    bool tf32;
  };
  for (const GemmCase& g : {GemmCase{"float32", kFloat32, false}, GemmCase{"tf32", kFloat32, true},
                            GemmCase{"bfloat16", kBFloat16, false}, GemmCase{"float16", kFloat16, false}}) {
    cuda::set_matmul_allow_tf32(g.tf32);
    for (int64_t n : {1024, 2048, 4096, 8192}) {
      if (quick && n > 2048) break;
      Tensor a = rand({n, n}, kGpu, &gen).to(g.dtype), b = rand({n, n}, kGpu, &gen).to(g.dtype);
      Tensor c;
      const double flop = 2.0 * n * n * n;
      const int reps = std::max<int>(2, static_cast<int>(2e12 / flop / (g.dtype == kFloat32 && !g.tf32 ? 20 : 1)));
      const double t = time_per_call([&] { c = matmul(a, b); }, std::min(reps, 200));
      report("gemm", g.name, std::to_string(n), t, "tflops", flop / 1e3);
    }
  }
  cuda::set_matmul_allow_tf32(false);
  // ---- linear with bias: GPT-2 124M's MLP up-projection, 8 x 1024 tokens (the bias in the GEMM's
  // epilogue on Kiln: Note [cuBLASLt bias epilogue]) ----
  for (DType dt : {kBFloat16, kFloat32}) {
    const int64_t tokens = quick ? 2048 : 8192, in = 768, out = 3072;
    Tensor x = randn({tokens, in}, kGpu, &gen).to(dt), w = randn({out, in}, kGpu, &gen).to(dt);
    Tensor bias = randn({out}, kGpu, &gen).to(dt), y;
    const double flop = 2.0 * tokens * in * out;
    report("linear", std::string(dtype_name(dt)), std::to_string(tokens) + "x768x3072",
           time_per_call([&] { y = nn::linear(x, w, bias); }, 100), "tflops", flop / 1e3);
    // The same GEMM with the GELU after it, as nn::GeluMLP runs it: addmm_gelu, bias and GELU in the
    // epilogue (Note [cuBLASLt GELU epilogue]). Forward only, no graph recorded.
    const Tensor wt = w.t();
    report("linear_gelu", std::string(dtype_name(dt)), std::to_string(tokens) + "x768x3072",
           time_per_call([&] { y = addmm_gelu(bias, x, wt, "tanh"); }, 100), "tflops", flop / 1e3);
  }
  // ---- host <-> device copies of 64 MiB: pageable, and pinned with non_blocking ----
  {
    const int64_t count = int64_t{1} << 24;
    Tensor pageable = randn({count}, TensorOptions(), &gen), pinned = pageable.pin_memory(), dev;
    const double bytes = 4.0 * count;
    report("h2d", "pageable", "64MiB", time_per_call([&] { dev = pageable.to(kGpu); }, 20), "gbps", bytes);
    report("h2d", "pinned", "64MiB", time_per_call([&] { dev = pinned.to(kGpu, /*non_blocking=*/true); }, 20), "gbps",
           bytes);
    Tensor back;
    report("d2h", "pageable", "64MiB", time_per_call([&] { back = dev.to(Device::cpu()); }, 20), "gbps", bytes);
    report("d2h", "pinned", "64MiB", time_per_call([&] { back = dev.to(Device::cpu(), /*non_blocking=*/true); }, 20),
           "gbps", bytes);
  }

  // ---- memory-bound ----
  const int64_t n = quick ? (1 << 24) : (1 << 26);
  const std::string ns = std::to_string(n);
  const double f = sizeof(float);
  {
    Tensor a = randn({n}, kGpu, &gen), b = randn({n}, kGpu, &gen), c;
    report("add", "float32", ns, time_per_call([&] { c = a + b; }, 50), "gbps", 3 * f * n);
    report("gelu", "float32", ns, time_per_call([&] { c = gelu(a); }, 50), "gbps", 2 * f * n);
    report("clone", "float32", ns, time_per_call([&] { c = a.clone(); }, 50), "gbps", 2 * f * n);
    report("sum", "float32", ns, time_per_call([&] { c = a.sum(); }, 50), "gbps", f * n);
    Tensor ah = a.to(kBFloat16), bh = b.to(kBFloat16);
    report("add", "bfloat16", ns, time_per_call([&] { c = ah + bh; }, 50), "gbps", 3 * 2.0 * n);
  }
  const int64_t rows = quick ? 2048 : 8192, cols = 4096;
  const std::string rs = std::to_string(rows) + "x" + std::to_string(cols);
  {
    Tensor x = randn({rows, cols}, kGpu, &gen), y;
    report("softmax", "float32", rs, time_per_call([&] { y = x.softmax(1); }, 50), "gbps", 2 * f * rows * cols);
    Tensor bias_row = randn({cols}, kGpu, &gen);
    report("add_bias", "float32", rs, time_per_call([&] { y = x + bias_row; }, 50), "gbps", 2 * f * rows * cols);
    Tensor w = ones({cols}, kGpu), bias = zeros({cols}, kGpu);
    report("layer_norm", "float32", rs, time_per_call([&] { y = layer_norm(x, {cols}, w, bias); }, 50), "gbps",
           2 * f * rows * cols);
    // Forward and backward (the input's gradient, from a given one): x read and y written, then g and
    // x (y for softmax) read and the gradient written, five passes over the (rows, cols) floats.
    Tensor xg = x.clone().requires_grad_(), gy = randn({rows, cols}, kGpu, &gen);
    report("softmax_fwd_bwd", "float32", rs,
           time_per_call([&] { (void)autograd::grad({xg.softmax(1)}, {xg}, {gy}); }, 20), "gbps", 5 * f * rows * cols);
    report("layer_norm_fwd_bwd", "float32", rs,
           time_per_call([&] { (void)autograd::grad({layer_norm(xg, {cols}, w, bias)}, {xg}, {gy}); }, 20), "gbps",
           5 * f * rows * cols);
    Tensor target = randint(0, cols, {rows}, TensorOptions(kInt64).device(kGpu), &gen), loss;
    report("cross_entropy", "float32", rs, time_per_call([&] { loss = nn::cross_entropy(x, target); }, 50), "gbps",
           f * rows * cols);
    report("sum_rows", "float32", rs, time_per_call([&] { y = x.sum({0}); }, 50), "gbps", f * rows * cols);
    // GPT-2's c_attn bias gradient: (batch 16 x 1024 tokens, 2304) in bfloat16, summed over the rows.
    const int64_t tokens = quick ? 2048 : 16384;
    Tensor xb = randn({tokens, 2304}, kGpu, &gen).to(kBFloat16);
    report("sum_rows", "bfloat16", std::to_string(tokens) + "x2304", time_per_call([&] { y = xb.sum({0}); }, 50),
           "gbps", 2.0 * tokens * 2304);
  }
  // ---- AdamW: 16 tensors of 2^22 float32, gradients set ----
  {
    std::vector<Tensor> params;
    for (int i = 0; i < 16; ++i) {
      Tensor p = randn({1 << 22}, kGpu, &gen).requires_grad_();
      p.set_grad(randn({1 << 22}, kGpu, &gen));
      params.push_back(p);
    }
    // Reads param, grad, exp_avg, exp_avg_sq; writes param, exp_avg, exp_avg_sq: 7 floats per element.
    optim::AdamW opt(params, optim::AdamWOptions{});
    report("adamw", "float32", "16x4194304", time_per_call([&] { opt.step(); }, 20), "gbps", 7 * f * 16 * (1 << 22));
    optim::AdamW fused(params, optim::AdamWOptions{.fused = true});
    report("adamw_fused", "float32", "16x4194304", time_per_call([&] { fused.step(); }, 20), "gbps",
           7 * f * 16 * (1 << 22));
  }
  return 0;
}

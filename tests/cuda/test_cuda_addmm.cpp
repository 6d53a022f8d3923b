// tests/cuda/test_cuda_addmm.cpp: addmm on the GPU (Note [cuBLASLt bias epilogue] in cuda/matmul.cu):
// the bias added in cuBLASLt's epilogue where the operands allow it, and the composed matmul + add
// where they do not (a broadcast 2-D bias), against the CPU, in float32 (TF32 off and on; plain
// float32 also against the exact product, within float32 accumulation's bound), float16 and bfloat16, with transposed, misaligned and odd-sized operands; that the fused path runs at all (asked
// directly); nn::linear on top of it. Then addmm_gelu (Note [cuBLASLt GELU epilogue]): the epilogue
// asked directly in each dtype, its refusals, addmm_gelu's values and gradients against the CPU's
// whichever path it takes, and nn::GeluMLP under bfloat16 autocast; a small net under float16
// autocast, forward and backward step by step. Between them: plain matmul from two threads on two
// streams (Note [cuBLAS handles per thread]).
#include <cmath>
#include <functional>
#include <string>
#include <thread>

#include "ops/dispatch.h"
#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);

// The CPU's float32 result for the same (already rounded) values.
Tensor on_cpu(const Tensor& bias, const Tensor& a, const Tensor& b) {
  return addmm(bias.cpu().to(kFloat32), a.cpu().to(kFloat32), b.cpu().to(kFloat32));
}

// How far float32 addmm on the GPU is from the exact result of the same values, as a fraction of what
// float32 accumulation in any order allows: (k + 1) u sum |terms| per element (u = 2^-24, the terms
// bias and a_ij b_jk). cuBLAS may split k and sum the pieces in any order, so a fixed tolerance
// against the CPU's float32 result (its own order) can fail on correct results where the terms
// cancel; a wrong element is off by the size of its terms, hundreds of times this bound.
double f32_error_over_bound(const Tensor& got, const Tensor& bias, const Tensor& a, const Tensor& b) {
  const Tensor a64 = a.cpu().to(kFloat64), b64 = b.cpu().to(kFloat64), bias64 = bias.cpu().to(kFloat64);
  const Tensor exact = addmm(bias64, a64, b64);
  const Tensor allowed = (bias64.abs() + a64.abs().matmul(b64.abs())) * (static_cast<double>(a.size(1) + 1) * 0x1p-24);
  return ((got.cpu().to(kFloat64) - exact).abs() / (allowed + 1e-300)).max().item<double>();
}

// layer(x, w, bias) for float32 x (x_shape), w (n x x's last dim) and bias (n) on the CPU and on
// cuda:0 from the same values: the outputs and the three gradients (from a fixed cotangent) agree.
void check_layer(const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& layer, const Shape& x_shape,
                 int64_t n, test::Tolerance tol) {
  Tensor x = test::sample(x_shape, kFloat32, 0.1).requires_grad_(true);
  Tensor w = test::sample({n, x_shape[x_shape.size() - 1]}, kFloat32, 0.2).requires_grad_(true);
  Tensor bias = test::sample({n}, kFloat32, 0.3).requires_grad_(true);
  Tensor xg = x.detach().to(kGpu).requires_grad_(true), wg = w.detach().to(kGpu).requires_grad_(true);
  Tensor bg = bias.detach().to(kGpu).requires_grad_(true);
  Tensor y = layer(x, w, bias), yg = layer(xg, wg, bg);
  Tensor up = test::sample(y.sizes(), kFloat32, 0.4);
  test::check_close(yg.cpu(), y, tol);
  (y * up).sum().backward();
  (yg * up.to(kGpu)).sum().backward();
  test::check_close(xg.grad().cpu(), x.grad(), tol);
  test::check_close(wg.grad().cpu(), w.grad(), tol);
  test::check_close(bg.grad().cpu(), bias.grad(), tol);
}
}  // namespace

TEST_CASE("addmm on CUDA equals the CPU's, fused or composed", "[gpu][addmm]") {
  struct Shape3 {
    int64_t m, k, n;
  };
  for (const Shape3 s : {Shape3{1, 7, 1}, Shape3{7, 1, 33}, Shape3{64, 768, 2304}, Shape3{1023, 129, 4097}}) {
    for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
      INFO("m " << s.m << ", k " << s.k << ", n " << s.n << ", " << dtype_name(dt));
      const test::Tolerance tol{2e-2, 2e-2};  // float16 and bfloat16: their rounding of the result
      Tensor a = test::sample({s.m, s.k}, dt, 0.1).to(kGpu);
      Tensor w = test::sample({s.n, s.k}, dt, 0.2).to(kGpu);  // b = w.t(): transposed, as in linear
      Tensor bias = test::sample({s.n}, dt, 0.3).to(kGpu);
      Tensor b = test::sample({s.k, s.n}, dt, 0.4).to(kGpu);  // row-major b, and a transposed a
      Tensor at = test::sample({s.k, s.m}, dt, 0.5).to(kGpu).t();
      Tensor bias2 = test::sample({s.m, 1}, dt, 0.6).to(kGpu);  // a 2-D bias: composed
      if (dt == kFloat32) {
        CHECK(f32_error_over_bound(addmm(bias, a, w.t()), bias, a, w.t()) <= 1.0);
        CHECK(f32_error_over_bound(addmm(bias, at, b), bias, at, b) <= 1.0);
        CHECK(f32_error_over_bound(addmm(bias2, a, b), bias2, a, b) <= 1.0);
        continue;
      }
      test::check_close(addmm(bias, a, w.t()).cpu().to(kFloat32), on_cpu(bias, a, w.t()), tol);
      test::check_close(addmm(bias, at, b).cpu().to(kFloat32), on_cpu(bias, at, b), tol);
      test::check_close(addmm(bias2, a, b).cpu().to(kFloat32), on_cpu(bias2, a, b), tol);
    }
  }
}

TEST_CASE("addmm on CUDA: the bias epilogue runs for aligned operands, misaligned ones and TF32", "[gpu][addmm]") {
  // The fused path itself, asked directly: cuBLASLt must have an algorithm for these.
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    Tensor a = test::sample({256, 768}, dt, 0.1).to(kGpu), w = test::sample({512, 768}, dt, 0.2).to(kGpu);
    Tensor bias = test::sample({512}, dt, 0.3).to(kGpu), c = empty({256, 512}, TensorOptions(dt).device(kGpu));
    CHECK(cuda::backend().matmul_bias(view_of(a), view_of(w.t()), view_of(bias), view_of(c), stream_for(kGpu)));
    const test::Tolerance tol = dt == kFloat32 ? test::Tolerance{1e-4, 1e-5} : test::Tolerance{2e-2, 2e-2};
    test::check_close(c.cpu().to(kFloat32), on_cpu(bias, a, w.t()), tol);
  }
  // a and b one element into their buffers (4-byte alignment for float32, 2-byte for 16 bits); the bias
  // aligned: the fused path if cuBLASLt has an algorithm for these, else the composed one.
  for (DType dt : {kFloat32, kBFloat16}) {
    INFO(dtype_name(dt));
    const test::Tolerance tol = dt == kFloat32 ? test::Tolerance{1e-4, 1e-5} : test::Tolerance{2e-2, 2e-2};
    Tensor a = test::sample({65 * 96 + 1}, dt, 0.1).to(kGpu).narrow(0, 1, 65 * 96).view({65, 96});
    Tensor b = test::sample({96 * 80 + 1}, dt, 0.2).to(kGpu).narrow(0, 1, 96 * 80).view({96, 80});
    Tensor bias = test::sample({80}, dt, 0.3).to(kGpu);
    test::check_close(addmm(bias, a, b).cpu().to(kFloat32), on_cpu(bias, a, b), tol);
  }
  // TF32: each input rounded to a 10-bit mantissa, so each element's error is bounded by
  // 2 * 2^-10 * (|a| @ |b|) (plus the float32 sums' own), not by its value.
  cuda::set_matmul_allow_tf32(true);
  Tensor a = test::sample({128, 256}, kFloat32, 0.1).to(kGpu), b = test::sample({256, 64}, kFloat32, 0.2).to(kGpu);
  Tensor bias = test::sample({64}, kFloat32, 0.3).to(kGpu);
  Tensor tf32 = addmm(bias, a, b).cpu().to(kFloat64);
  cuda::set_matmul_allow_tf32(false);
  Tensor a64 = a.cpu().to(kFloat64), b64 = b.cpu().to(kFloat64);
  Tensor exact = matmul(a64, b64) + bias.cpu().to(kFloat64);
  Tensor bound = matmul(a64.abs(), b64.abs()) * (2.0 * std::ldexp(1.0, -10)) + 1e-5;
  CHECK(((tf32 - exact).abs() - bound).max().item<double>() <= 0.0);
}

TEST_CASE("nn::linear on CUDA (through addmm) matches the CPU, forward and backward", "[gpu][addmm]") {
  check_layer([](const Tensor& x, const Tensor& w, const Tensor& b) { return nn::linear(x, w, b); }, {4, 33, 96}, 80,
              {1e-4, 1e-5});
}

TEST_CASE("matmul on CUDA from two threads, each on a stream of its own, gives each thread its products",
          "[gpu][addmm]") {
  // Note [cuBLAS handles per thread] in cuda/matmul.cu: with one handle for both threads, one thread's
  // GEMM could run on the other's stream, and its copy to the host, ordered after its own stream's
  // work only, read c before the GEMM wrote it. Each product differs (x (i + 1)), so that a stale c
  // left by the iteration before cannot pass either.
  const int64_t n = 1024;
  Tensor a = test::sample({n, n}, kFloat32, 0.1), b = test::sample({n, n}, kFloat32, 0.2);
  const Tensor want = matmul(a.to(kFloat64), b.to(kFloat64));
  const Tensor ga = a.to(kGpu), gb = b.to(kGpu);
  std::string failures[2];
  auto work = [&](int t) {
    try {
      cuda::CudaStream own(0);
      own.wait_stream(cuda::CudaStream::default_stream(0));  // ga and gb were written there
      cuda::StreamGuard guard(own);
      for (int i = 0; i < 20; ++i) {
        const Tensor c = matmul(ga * static_cast<double>(i + 1), gb).cpu().to(kFloat64);
        const double err = (c - want * static_cast<double>(i + 1)).abs().max().item<double>();
        if (!(err <= 1e-3 * (i + 1))) {
          failures[t] = "thread " + std::to_string(t) + ", product " + std::to_string(i) + ": max error " +
                        std::to_string(err);
          return;
        }
      }
    } catch (const std::exception& e) {
      failures[t] = e.what();
    }
  };
  std::thread first(work, 0), second(work, 1);
  first.join();
  second.join();
  CHECK(failures[0] == std::string());  // Catch prints the message when it is not empty
  CHECK(failures[1] == std::string());
}

// ---- addmm_gelu: Note [cuBLASLt GELU epilogue] ----

TEST_CASE("addmm_gelu on CUDA: the GELU epilogue writes gelu(a @ b + bias) and its input", "[gpu][addmm]") {
  // The fused path itself, asked directly, in each dtype: cuBLASLt must have an algorithm for the
  // 16-bit ones (what GPT-2's MLP runs under autocast). For float32 the documentation does not
  // promise one; declining is then correct (addmm_gelu composes), and only the values are checked
  // when it runs.
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    const test::Tolerance tol = dt == kFloat32 ? test::Tolerance{1e-3, 1e-4} : test::Tolerance{2e-2, 2e-2};
    Tensor a = test::sample({256, 768}, dt, 0.1).to(kGpu), w = test::sample({1024, 768}, dt, 0.2).to(kGpu);
    Tensor bias = test::sample({1024}, dt, 0.3).to(kGpu);
    const TensorOptions o = TensorOptions(dt).device(kGpu);
    Tensor c = empty({256, 1024}, o), pre = empty({256, 1024}, o);
    const bool fused = cuda::backend().matmul_bias_gelu(view_of(a), view_of(w.t()), view_of(bias), view_of(c),
                                                        view_of(pre), stream_for(kGpu));
    if (dt == kFloat32 && !fused) {
      WARN("cuBLASLt declined the float32 GELU epilogue on this GPU; addmm_gelu composes it");
      continue;
    }
    REQUIRE(fused);
    const Tensor expected_pre = on_cpu(bias, a, w.t());
    test::check_close(pre.cpu().to(kFloat32), expected_pre, tol);
    test::check_close(c.cpu().to(kFloat32), gelu(expected_pre, "tanh"), tol);
  }
  // Declined, having written nothing: n % 8 != 0 (the aux matrix's leading dimension).
  Tensor a = test::sample({16, 32}, kFloat32, 0.1).to(kGpu), b = test::sample({32, 33}, kFloat32, 0.2).to(kGpu);
  Tensor bias = test::sample({33}, kFloat32, 0.3).to(kGpu);
  Tensor c = zeros({16, 33}, TensorOptions().device(kGpu)), pre = zeros({16, 33}, TensorOptions().device(kGpu));
  CHECK_FALSE(cuda::backend().matmul_bias_gelu(view_of(a), view_of(b), view_of(bias), view_of(c), view_of(pre),
                                               stream_for(kGpu)));
  CHECK(c.abs().sum().item<double>() == 0.0);
}

TEST_CASE("addmm_gelu on CUDA matches the CPU, fused or composed, forward and backward", "[gpu][addmm]") {
  // tanh with n % 8 == 0 and fusion on: the epilogue; n = 33, the erf form or fusion off: composed.
  for (const char* approximate : {"tanh", "none"}) {
    for (int64_t n : {1024, 33}) {
      for (bool fusion : {true, false}) {
        INFO(approximate << ", n " << n << ", fusion " << fusion);
        test::FusionGuard guard(fusion);
        check_layer([&](const Tensor& x, const Tensor& w, const Tensor& b) { return addmm_gelu(b, x, w.t(), approximate); },
                    {64, 96}, n, {1e-3, 1e-4});
      }
    }
  }
}

TEST_CASE("nn::GeluMLP on CUDA under bfloat16 autocast (the GELU epilogue) matches the CPU", "[gpu][addmm]") {
  nn::GeluMLP cpu_mlp(64, {.gelu_approximate = "tanh"}), gpu_mlp(64, {.gelu_approximate = "tanh"});
  gpu_mlp.load_state_dict(cpu_mlp.state_dict());
  gpu_mlp.to(kGpu);
  Tensor x = test::sample({2, 24, 64}, kFloat32, 0.1), up = test::sample({2, 24, 64}, kFloat32, 0.2);
  Tensor expected, got;
  {
    AutocastGuard ac(DeviceType::CPU, kBFloat16);
    expected = cpu_mlp.forward(x);
  }
  {
    AutocastGuard ac(DeviceType::CUDA, kBFloat16);
    got = gpu_mlp.forward(x.to(kGpu));
  }
  REQUIRE(got.dtype() == kBFloat16);
  // bfloat16 outputs (8-bit significands) computed in different orders: within a few of their ulps.
  test::check_close(got.cpu().to(kFloat32), expected.to(kFloat32), {5e-2, 5e-2});
  (expected.to(kFloat32) * up).sum().backward();
  (got.to(kFloat32) * up.to(kGpu)).sum().backward();
  const auto cpu_params = cpu_mlp.named_parameters(), gpu_params = gpu_mlp.named_parameters();
  REQUIRE(cpu_params.size() == gpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    INFO(cpu_params[i].first);
    REQUIRE(gpu_params[i].second.grad().defined());
    test::check_close(gpu_params[i].second.grad().cpu(), cpu_params[i].second.grad(), {5e-2, 5e-2});
  }
}

TEST_CASE("float16 autocast on CUDA: Linear, LayerNorm, ReLU, Linear and cross_entropy give float32's gradients",
          "[gpu][addmm]") {
  // Step by step against the CPU in float32: the output, the loss's gradient with respect to it
  // (retained), each parameter's. The loss under autocast (float32 by its policy; the kernel reads
  // the float16 logits as they are), times 64 as a loss scale would.
  manual_seed(7);
  test::NormNet cpu_net(16, 32, 8), gpu_net(16, 32, 8);
  gpu_net.load_state_dict(cpu_net.state_dict());
  gpu_net.to(kGpu);
  Generator data(3);
  Tensor x = randn({4, 16}, kFloat32, &data);
  Tensor y = randint(0, 8, {4}, kInt64, &data);
  Tensor expected = cpu_net.forward(x);
  expected.retain_grad();
  (nn::cross_entropy(expected, y) * 64.0).backward();
  Tensor got;
  {
    AutocastGuard ac(DeviceType::CUDA, kFloat16);
    got = gpu_net.forward(x.to(kGpu));
  }
  REQUIRE(got.dtype() == kFloat16);
  got.retain_grad();
  {
    INFO("output");
    test::check_close(got.cpu().to(kFloat32), expected, {2e-2, 2e-2});
  }
  Tensor loss;
  {
    AutocastGuard ac(DeviceType::CUDA, kFloat16);
    loss = nn::cross_entropy(got, y.to(kGpu)) * 64.0;
  }
  CHECK(loss.dtype() == kFloat32);
  loss.backward();
  {
    INFO("the loss's gradient with respect to the output");
    REQUIRE(got.grad().defined());
    test::check_close(got.grad().cpu().to(kFloat32), expected.grad(), {2e-2, 2e-2});
  }
  const auto cpu_params = cpu_net.named_parameters(), gpu_params = gpu_net.named_parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    INFO(cpu_params[i].first);
    REQUIRE(gpu_params[i].second.grad().defined());
    test::check_close(gpu_params[i].second.grad().cpu().to(kFloat32), cpu_params[i].second.grad(), {5e-2, 5e-2});
  }
}

// tests/cuda/test_cuda_addmm.cpp: addmm on the GPU (Note [cuBLASLt bias epilogue] in cuda/matmul.cu):
// the bias added in cuBLASLt's epilogue where the operands allow it, and the composed matmul + add
// where they do not (a broadcast 2-D bias), against the CPU, in float32 (TF32 off and on), float16 and
// bfloat16, with transposed, misaligned and odd-sized operands; that the fused path runs at all (asked
// directly); nn::linear on top of it.
#include <cmath>

#include "ops/dispatch.h"
#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);

// The CPU's float32 result for the same (already rounded) values.
Tensor on_cpu(const Tensor& bias, const Tensor& a, const Tensor& b) {
  return addmm(bias.cpu().to(kFloat32), a.cpu().to(kFloat32), b.cpu().to(kFloat32));
}
}  // namespace

TEST_CASE("addmm on CUDA equals the CPU's, fused or composed", "[gpu][addmm]") {
  struct Shape3 {
    int64_t m, k, n;
  };
  for (const Shape3 s : {Shape3{1, 7, 1}, Shape3{7, 1, 33}, Shape3{64, 768, 2304}, Shape3{1023, 129, 4097}}) {
    for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
      INFO("m " << s.m << ", k " << s.k << ", n " << s.n << ", " << dtype_name(dt));
      const test::Tolerance tol = dt == kFloat32 ? test::Tolerance{1e-4, 1e-5} : test::Tolerance{2e-2, 2e-2};
      Tensor a = test::sample({s.m, s.k}, dt, 0.1).to(kGpu);
      Tensor w = test::sample({s.n, s.k}, dt, 0.2).to(kGpu);  // b = w.t(): transposed, as in linear
      Tensor bias = test::sample({s.n}, dt, 0.3).to(kGpu);
      test::check_close(addmm(bias, a, w.t()).cpu().to(kFloat32), on_cpu(bias, a, w.t()), tol);
      Tensor b = test::sample({s.k, s.n}, dt, 0.4).to(kGpu);  // row-major b, and a transposed a
      Tensor at = test::sample({s.k, s.m}, dt, 0.5).to(kGpu).t();
      test::check_close(addmm(bias, at, b).cpu().to(kFloat32), on_cpu(bias, at, b), tol);
      // A 2-D bias: composed.
      Tensor bias2 = test::sample({s.m, 1}, dt, 0.6).to(kGpu);
      test::check_close(addmm(bias2, a, b).cpu().to(kFloat32), on_cpu(bias2, a, b), tol);
    }
  }
}

TEST_CASE("addmm on CUDA: the bias epilogue runs for aligned operands; misaligned ones and TF32", "[gpu][addmm]") {
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
  Tensor x = test::sample({4, 33, 96}, kFloat32, 0.1).requires_grad_(true);
  Tensor w = test::sample({80, 96}, kFloat32, 0.2).requires_grad_(true);
  Tensor bias = test::sample({80}, kFloat32, 0.3).requires_grad_(true);
  Tensor xg = x.detach().to(kGpu).requires_grad_(true), wg = w.detach().to(kGpu).requires_grad_(true);
  Tensor bg = bias.detach().to(kGpu).requires_grad_(true);
  Tensor up = test::sample({4, 33, 80}, kFloat32, 0.4);
  Tensor y = nn::linear(x, w, bias), yg = nn::linear(xg, wg, bg);
  test::check_close(yg.cpu(), y, {1e-4, 1e-5});
  (y * up).sum().backward();
  (yg * up.to(kGpu)).sum().backward();
  test::check_close(xg.grad().cpu(), x.grad(), {1e-4, 1e-5});
  test::check_close(wg.grad().cpu(), w.grad(), {1e-4, 1e-5});
  test::check_close(bg.grad().cpu(), bias.grad(), {1e-4, 1e-5});
}

// tests/cuda/test_cuda.cpp: the CUDA backend against the CPU oracle. The binary exits 77 (CTest:
// skipped) when no GPU is present (tests/main.cpp), so on a machine without one this reports
// "skipped", never "passed".
#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);
}

TEST_CASE("round trip host -> device -> host keeps every dtype's values", "[gpu]") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    Tensor x = test::sample({7, 13}).to(dt);
    test::check_equal(x.to(kGpu).to(Device::cpu()), x);
    test::check_equal(x.t().to(kGpu).to(Device::cpu()), x.t().contiguous());
  }
}

TEST_CASE("elementwise, reductions, matmul and softmax match the CPU", "[gpu]") {
  for (int64_t n : {1, 7, 1023, 4097}) {
    Tensor a = test::sample({n}), b = test::sample({n}, kFloat32, 2.0);
    Tensor ag = a.to(kGpu), bg = b.to(kGpu);
    test::check_close((ag + bg * 2).cpu(), a + b * 2);
    test::check_close(ag.exp().tanh().cpu(), a.exp().tanh());
    test::check_close(gelu(ag).cpu(), gelu(a));
    test::check_close(ag.sum().cpu(), a.sum(), {1e-5, 1e-4});
    test::check_close(ag.amax({0}).cpu(), a.amax({0}));
    CHECK(ag.argmax().item<int64_t>() == a.argmax().item<int64_t>());
  }
  Tensor m = test::sample({33, 65}), k = test::sample({65, 17}, kFloat32, 1.0);
  test::check_close(matmul(m.to(kGpu), k.to(kGpu)).cpu(), matmul(m, k), {1e-4, 1e-4});
  test::check_close(matmul(k.t().to(kGpu), m.t().to(kGpu)).cpu(), matmul(k.t(), m.t()), {1e-4, 1e-4});
  test::check_close(m.to(kGpu).softmax(1).cpu(), m.softmax(1));
  test::check_close(m.to(kGpu).log_softmax(0).cpu(), m.log_softmax(0));
}

TEST_CASE("random numbers are the CPU's for the same seed", "[gpu]") {
  Generator g1(99), g2(99);
  test::check_equal(rand({1000}, kGpu, &g1).cpu(), rand({1000}, {}, &g2));
  test::check_close(randn({1000}, kGpu, &g1).cpu(), randn({1000}, {}, &g2));
}

TEST_CASE("autograd runs on the GPU and matches the CPU", "[gpu]") {
  Tensor x = test::sample({4, 5}).requires_grad_();
  Tensor xg = x.detach().to(kGpu).requires_grad_();
  Tensor w = test::sample({5, 3}, kFloat32, 3.0);
  (matmul(x, w).tanh().sum()).backward();
  (matmul(xg, w.to(kGpu)).tanh().sum()).backward();
  test::check_close(xg.grad().cpu(), x.grad(), {1e-5, 1e-5});
}

TEST_CASE("the allocator's statistics return to baseline", "[gpu]") {
  MemoryStats before = memory::stats(kGpu);
  {
    Tensor t = zeros({1 << 20}, kGpu);
    CHECK(memory::stats(kGpu).allocated_bytes >= before.allocated_bytes + (4 << 20));
  }
  CHECK(memory::stats(kGpu).allocated_bytes == before.allocated_bytes);
}

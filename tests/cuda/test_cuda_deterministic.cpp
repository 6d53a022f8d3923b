// tests/cuda/test_cuda_deterministic.cpp: use_deterministic_algorithms(true) on the GPU (Note
// [deterministic index_add] in cuda/index.cu, cuda/pool.cu, Note [cuDNN algorithm choice] in
// cuda/conv.cu). index_add (embedding's backward) and max pooling's backward then give the CPU's
// bits exactly, because they add in the CPU's order and round as it does; convolution's weight
// gradient gives the same bits on every run; scatter and scatter_add (gather's backward) give the
// CPU's bits.
#include "core/deterministic.h"
#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);

// Deterministic mode for a scope (the switch is process-wide).
struct DeterministicScope {
  DeterministicScope() { use_deterministic_algorithms(true); }
  ~DeterministicScope() { use_deterministic_algorithms(false); }
};
}  // namespace

TEST_CASE("deterministic index_add and embedding backward equal the CPU bit for bit", "[gpu][deterministic]") {
  DeterministicScope on;
  CHECK(are_deterministic_algorithms_enabled());
  // 4097 positions into 37 rows: every row is hit about 110 times, in an interleaved order.
  Tensor idx = randint(0, 37, {4097});
  for (DType dt : {kFloat32, kBFloat16, kFloat16, kFloat64}) {
    INFO(dtype_name(dt));
    Tensor src = test::sample({4097, 65}, dt);
    Tensor base = test::sample({37, 65}, dt, 0.75);
    Tensor cpu = index_add(base, 0, idx, src);
    Tensor gpu = index_add(base.to(kGpu), 0, idx.to(kGpu), src.to(kGpu));
    test::check_equal(gpu.cpu(), cpu);
    // Along a middle dim, with a strided source and negative indices.
    Tensor src3 = test::sample({3, 65, 4097}, dt).transpose(1, 2);
    Tensor neg = idx - 37;
    Tensor cpu3 = index_add(zeros({3, 37, 65}, dt), 1, idx, src3);
    Tensor gpu3 = index_add(zeros({3, 37, 65}, TensorOptions(dt).device(kGpu)), 1, neg.to(kGpu), src3.to(kGpu));
    test::check_equal(gpu3.cpu(), cpu3);
  }
  // Embedding's backward: the weight's gradient.
  Tensor tokens = randint(0, 50, {8, 129});
  Tensor w = test::sample({50, 96}).requires_grad_(true);
  Tensor wg = w.detach().to(kGpu).requires_grad_(true);
  Tensor up = test::sample({8, 129, 96}, kFloat32, 0.3);
  (nn::embedding(tokens, w) * up).sum().backward();
  (nn::embedding(tokens.to(kGpu), wg) * up.to(kGpu)).sum().backward();
  test::check_equal(wg.grad().cpu(), w.grad());
  test::check_error([&] { (void)index_add(zeros({37, 65}, kGpu), 0, (idx + 37).to(kGpu), test::sample({4097, 65}).to(kGpu)); },
                    {"index_add", "out of bounds", "size 37"});
}

TEST_CASE("deterministic max_pool2d backward equals the CPU bit for bit with overlapping windows",
          "[gpu][deterministic]") {
  DeterministicScope on;
  Tensor x = test::sample({4, 6, 17, 19}).requires_grad_(true);
  Tensor xg = x.detach().to(kGpu).requires_grad_(true);
  Tensor up = test::sample({4, 6, 15, 9}, kFloat32, 0.1);
  (max_pool2d(x, {3, 3}, {1, 2}) * up).sum().backward();
  (max_pool2d(xg, {3, 3}, {1, 2}) * up.to(kGpu)).sum().backward();
  test::check_equal(xg.grad().cpu(), x.grad());
}

TEST_CASE("deterministic conv2d weight gradients repeat bit for bit", "[gpu][deterministic]") {
  DeterministicScope on;
  Tensor x = test::sample({16, 8, 28, 28}).to(kGpu);
  Tensor gy = test::sample({16, 32, 28, 28}, kFloat32, 0.2).to(kGpu);
  Tensor first = conv2d_backward_weight(gy, x, {32, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1);
  for (int run = 0; run < 3; ++run) {
    test::check_equal(conv2d_backward_weight(gy, x, {32, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1), first);
  }
  // Against the exact gradient: each element sums 16 * 28 * 28 = 12544 products, and a float32 sum
  // in any order is within n u sum |terms| of it (u = 2^-24); cuDNN's order is not the CPU's, so a
  // fixed tolerance against the CPU's float32 result can fail on a correct one. A wrong element is
  // off by the size of its terms.
  const Tensor x64 = x.cpu().to(kFloat64), gy64 = gy.cpu().to(kFloat64);
  const Tensor exact = conv2d_backward_weight(gy64, x64, {32, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1);
  const Tensor abs_sum = conv2d_backward_weight(gy64.abs(), x64.abs(), {32, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1);
  const double n = 16.0 * 28 * 28;
  CHECK(((first.cpu().to(kFloat64) - exact).abs() / (abs_sum * (n * 0x1p-24) + 1e-300)).max().item<double>() <= 1.0);
}

TEST_CASE("deterministic scatter_add, scatter and gather's backward equal the CPU bit for bit", "[gpu][deterministic]") {
  DeterministicScope on;
  // 33 rows of 3000 positions scattered into 40 columns: about 75 sources per target.
  Tensor index = randint(0, 40, {33, 3000});
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    INFO(dtype_name(dt));
    Tensor src = test::sample({33, 3000}, dt);
    Tensor base = test::sample({33, 40}, dt, 0.75);
    test::check_equal(base.to(kGpu).scatter_add(1, index.to(kGpu), src.to(kGpu)).cpu(), base.scatter_add(1, index, src));
    // scatter with repeated targets: the last source in row-major order wins, as on the CPU.
    test::check_equal(base.to(kGpu).scatter(1, index.to(kGpu), src.to(kGpu)).cpu(), base.scatter(1, index, src));
  }
  // Along dim 0, from a transposed source.
  Tensor index0 = randint(0, 7, {500, 9});
  Tensor src0 = test::sample({9, 500}).t();
  test::check_equal(zeros({7, 9}, kGpu).scatter_add(0, index0.to(kGpu), src0.to(kGpu)).cpu(),
                    zeros({7, 9}).scatter_add(0, index0, src0));
  // gather's backward is a scatter_add.
  Tensor x = test::sample({33, 40}).requires_grad_(true);
  Tensor xg = x.detach().to(kGpu).requires_grad_(true);
  Tensor up = test::sample({33, 3000}, kFloat32, 0.4);
  (x.gather(1, index) * up).sum().backward();
  (xg.gather(1, index.to(kGpu)) * up.to(kGpu)).sum().backward();
  test::check_equal(xg.grad().cpu(), x.grad());
  test::check_error([&] { (void)zeros({33, 40}, kGpu).scatter_add(1, (index + 40).to(kGpu), ones({33, 3000}, kGpu)); },
                    {"scatter_add", "out of bounds", "size 40"});
}

TEST_CASE("deterministic mode is a process-wide switch, off by default", "[gpu][deterministic]") {
  CHECK_FALSE(are_deterministic_algorithms_enabled());
  {
    DeterministicScope on;
    CHECK(are_deterministic_algorithms_enabled());
  }
  CHECK_FALSE(are_deterministic_algorithms_enabled());
}

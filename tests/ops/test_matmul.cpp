// tests/ops/test_matmul.cpp: float32 matmul on the CPU, whichever GEMM it reaches (OpenBLAS, Eigen, or
// on AVX-512 CPUs Kiln's own, cpu/sgemm.cpp; see cpu/matmul.cpp), and cpu/sgemm.cpp called directly
// wherever the CPU has AVX-512, against a float64 product of the same values: every element within
// the rounding-error bound of a float32 dot product of length k. Shapes cover the tile edges (8 x 48),
// several packed blocks of k (1,024) and of n (2,064), the unpacked path's edge panels and blocks
// of k, transposed and strided operands, batches, accumulation into c, and results that do not
// depend on the thread count. Also addmm (bias + a @ b, which nn::linear uses), against the same
// bound, with its gradients and errors, and addmm_gelu (gelu(bias + a @ b), which nn::GeluMLP uses).
// And that OpenBLAS's own thread server is down and stays down while Kiln's pool calls it. And
// bfloat16's cpu/bf16gemm.cpp, both kernels where the CPU has them (AVX512-BF16, AMX), against the
// bound of a float32 sum rounded once to bfloat16, bit for bit against a cast where the sum is
// exact, and through matmul (with KILN_CPU_BF16_GEMM=own too, a CTest entry of its own).
#include <array>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "cpu/kernels.h"
#include "support.h"

using namespace kiln;
using test::ThreadsGuard;

namespace {

// |actual - exact| <= 2 k u (|a| @ |b|) + tiny, u = 2^-24: the classic bound for a float32 dot product
// of length k (any summation order), with room for the float32 rounding of the inputs' products.
// With out_unit, the float32 sum s was then rounded once more, to a type whose rounding moves s by at
// most out_unit |s| (2^-8 for bfloat16).
void check_product(const Tensor& actual, const Tensor& a, const Tensor& b, const Tensor& c0 = Tensor(),
                   double out_unit = 0) {
  Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
  Tensor exact = matmul(a64, b64);
  if (c0.defined()) exact = exact + c0.to(kFloat64);
  Tensor bound = matmul(a64.abs(), b64.abs());
  if (c0.defined()) bound = bound + c0.to(kFloat64).abs();
  const int64_t k = a.size(-1);
  Tensor sum_err = bound * (2.0 * (k + 1) * std::ldexp(1.0, -24)) + 1e-30;
  test::check_within("shape " + std::to_string(actual.size(0)) + " x " + std::to_string(actual.size(-1)) + ", k " +
                         std::to_string(k),
                     actual, exact, sum_err + (exact.abs() + sum_err) * out_unit);
}

// a @ b for 2-D float32 a and b through cpu/sgemm.cpp itself, with the views' strides.
Tensor own_product(const Tensor& a, const Tensor& b) {
  Tensor c = zeros({a.size(0), b.size(1)});
  cpu::sgemm_avx512(a.size(0), b.size(1), a.size(1), a.data_ptr<float>(), a.stride(0), a.stride(1),
                    b.data_ptr<float>(), b.stride(0), b.stride(1), false, c.data_ptr<float>(), c.stride(0));
  return c;
}

// Both: matmul, and sgemm.cpp directly where the CPU can run it.
void check_both(const Tensor& a, const Tensor& b) {
  check_product(matmul(a, b), a, b);
  if (cpu::cpu_has_avx512()) check_product(own_product(a, b), a, b);
}

Tensor values(const Shape& shape, double seed) { return test::sample(shape, kFloat32, seed); }

}  // namespace

TEST_CASE("float32 matmul at tile and block edges, against float64") {
  // (m, k, n): single elements, thinner than a tile (BLAS), one tile, tile edges, k across 1,024-row
  // blocks with a tail, n across two 2,064-column blocks, rows across 64-row blocks of a with the
  // last block shorter than the 3 micro-panels that prefetch the next panel of b, and a product large
  // enough that matmul takes it to cpu/sgemm.cpp even beside an AVX-512 OpenBLAS.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1},      {7, 5, 3},       {8, 16, 16},     {9, 17, 33},     {16, 1, 48},   {23, 40, 49},
      {64, 300, 47},  {129, 257, 97},  {256, 256, 256}, {37, 1030, 100}, {300, 70, 4200}, {137, 90, 150},
      {1030, 1030, 1030}};
  for (const auto& [m, k, n] : shapes) {
    Tensor a = values({m, k}, 0.3), b = values({k, n}, 0.7);
    check_both(a, b);
  }
}

TEST_CASE("float32 matmul with transposed and strided operands") {
  const int64_t m = 45, k = 270, n = 100;
  Tensor a = values({m, k}, 0.1), b = values({k, n}, 0.2);
  Tensor at = values({k, m}, 0.3).t(), bt = values({n, k}, 0.4).t();  // strides (1, ld)
  // Neither stride 1: every other column of a wider matrix, transposed.
  Tensor a_strided = values({k, m, 2}, 0.5).select(2, 0).t();
  Tensor b_strided = values({n, k, 3}, 0.6).select(2, 1).t();
  REQUIRE(a_strided.stride(0) != 1);
  REQUIRE(a_strided.stride(1) != 1);
  for (const Tensor& x : {a, at, a_strided})
    for (const Tensor& y : {b, bt, b_strided}) check_both(x, y);
  // A row-sliced c's worth of a: rows of a wider matrix (leading dimension > k).
  Tensor a_wide = values({m, k + 13}, 0.8).narrow(1, 5, k);
  check_both(a_wide, b);
}

TEST_CASE("float32 batched matmul: many small products and a few large ones") {
  Tensor a = values({6, 3, 20, 33}, 0.1), b = values({6, 3, 33, 50}, 0.2);
  check_product(matmul(a, b), a, b);
  Tensor a2 = values({2, 200, 130}, 0.3), b2 = values({2, 130, 300}, 0.4);
  check_product(matmul(a2, b2), a2, b2);
  Tensor b3 = values({130, 300}, 0.5);  // broadcast b over the batch
  check_product(matmul(a2, b3), a2, b3.expand({2, 130, 300}));
}

TEST_CASE("float32 cpu::gemm accumulates into c, with transposes and leading dimensions") {
  const int64_t m = 50, n = 70, k = 300;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = ta ? values({k, m}, 0.1) : values({m, k}, 0.1);
      Tensor b = tb ? values({n, k}, 0.2) : values({k, n}, 0.2);
      Tensor c = values({m, n + 6}, 0.3);  // ldc = n + 6: the last 6 columns must not change
      Tensor c0 = c.clone();
      cpu::gemm<float>(ta, tb, m, n, k, a.data_ptr<float>(), ta ? m : k, b.data_ptr<float>(), tb ? k : n, true,
                       c.data_ptr<float>(), n + 6);
      check_product(c.narrow(1, 0, n), ta ? a.t() : a, tb ? b.t() : b, c0.narrow(1, 0, n));
      test::check_equal(c.narrow(1, n, 6), c0.narrow(1, n, 6));
    }
}

// OpenBLAS's, where Kiln links it: whether its thread server runs, and its thread count.
extern "C" int blas_server_avail __attribute__((weak));
extern "C" int openblas_get_num_threads(void) __attribute__((weak));

TEST_CASE("OpenBLAS's own threads are stopped before main and stay stopped while Kiln's pool runs GEMMs") {
  // Note [OpenBLAS's own threads] in cpu/parallel.cpp: Kiln's pool splits products and calls
  // OpenBLAS on one thread; OpenBLAS's idle workers would otherwise spin on a core at startup.
  if (&blas_server_avail == nullptr || openblas_get_num_threads == nullptr) {
    WARN("Kiln was built without a threaded OpenBLAS: nothing to check");
    return;
  }
  CHECK(blas_server_avail == 0);
  CHECK(openblas_get_num_threads() == 1);
  ThreadsGuard g(2);
  Tensor a = test::sample({300, 400}, kFloat64, 0.6), b = test::sample({400, 500}, kFloat64, 0.7);
  Tensor c = matmul(a, b);  // float64: OpenBLAS's dgemm, from each of the pool's threads
  CHECK(c.sizes() == Shape{300, 500});
  CHECK(blas_server_avail == 0);
  CHECK(openblas_get_num_threads() == 1);
}

TEST_CASE("float32 cpu/sgemm.cpp does not depend on the thread count") {
  // A property of cpu/sgemm.cpp (each element is the same sum however c is split), called directly;
  // OpenBLAS's edge kernels sum differently. b transposed in memory takes the packed loops: {1000,
  // 64, 40} and {40, 2100, 40} are small enough that on two threads each packs its own b (Note
  // [sharing b] in sgemm.cpp), the second over three blocks of k; one thread shares it. {200, 1100,
  // 2100} has two blocks of k and two of n. b with contiguous rows takes the unpacked path when it
  // is at most 512 wide (Note [unpacked products]): {256, 300, 256} split by rows, {9, 700, 500} by
  // panels on two threads (three blocks of k), {16, 600, 2000} packed again.
  if (!cpu::cpu_has_avx512()) {
    WARN("no AVX-512 on this CPU: cpu/sgemm.cpp is not used, not checked");
    return;
  }
  for (bool b_transposed : {false, true})
    for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {256, 300, 256}, {9, 700, 500}, {16, 600, 2000}, {1000, 64, 40}, {40, 2100, 40}, {200, 1100, 2100}}) {
      Tensor a = values({m, k}, 0.1), b = b_transposed ? values({n, k}, 0.2).t() : values({k, n}, 0.2);
      Tensor one, two;
      {
        ThreadsGuard g(1);
        one = own_product(a, b);
      }
      {
        ThreadsGuard g(2);
        two = own_product(a, b);
      }
      INFO("m " << m << ", k " << k << ", n " << n << (b_transposed ? ", b transposed" : ""));
      test::check_equal(one, two);
    }
}

TEST_CASE("float32 cpu/sgemm.cpp without packing: every edge panel width, blocks of k, strides, accumulation") {
  // Note [unpacked products] in cpu/sgemm.cpp: a and b with contiguous rows, b at most 512 wide, or
  // wider with at most 64 rows of a (Note [short products]). n covers no edge panel (48, 96), an
  // edge of 1..16 columns (16, 64, 100), of 17..32 (68, 512) and of 33..47 (47, 90); k covers several
  // blocks of b's rows (at n = 512 a block has 256 rows, at n = 16 1,024) with a tail; m rows under
  // and over one 8-row tile. On one thread c is split by rows; on two, the shapes with fewer than
  // four tiles of rows are split by panels of b.
  if (!cpu::cpu_has_avx512()) {
    WARN("no AVX-512 on this CPU: cpu/sgemm.cpp is not used, not checked");
    return;
  }
  // The path's rule: contiguous rows, n <= 512, and one block of k or c at most 2^18 floats; or, for
  // a wider b, at most 64 rows of c (Note [short products]).
  CHECK(cpu::sgemm_avx512_unpacked(512, 512, 512, 1, 1));
  CHECK(cpu::sgemm_avx512_unpacked(64, 513, 8, 1, 1));
  CHECK(cpu::sgemm_avx512_unpacked(8, 100000, 5000, 1, 1));
  CHECK_FALSE(cpu::sgemm_avx512_unpacked(65, 513, 8, 1, 1));
  CHECK_FALSE(cpu::sgemm_avx512_unpacked(8, 100, 8, 1, 7));
  CHECK_FALSE(cpu::sgemm_avx512_unpacked(8, 100, 8, 3, 1));
  CHECK_FALSE(cpu::sgemm_avx512_unpacked(8, 600, 8, 1, 7));
  CHECK(cpu::sgemm_avx512_unpacked(100000, 512, 256, 1, 1));
  CHECK_FALSE(cpu::sgemm_avx512_unpacked(100000, 512, 257, 1, 1));
  // The short products' b in chunks of 11 panels (528 columns): two chunks, the second only the edge
  // (529); three, with edges of 16 (1024) and 44 (1100) columns; many blocks of k (2000 rows).
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 16},      {7, 5, 47},     {9, 33, 48},     {37, 600, 512}, {64, 70, 64},   {300, 2100, 16},
      {130, 257, 90},  {20, 1030, 100}, {8, 300, 96},   {11, 700, 68},  {64, 300, 529}, {32, 432, 1024},
      {9, 2000, 1100}, {17, 40, 2000}};
  for (int threads : {1, 2}) {
    ThreadsGuard g(threads);
    for (const auto& [m, k, n] : shapes) {
      INFO("m " << m << ", k " << k << ", n " << n << ", threads " << threads);
      REQUIRE(cpu::sgemm_avx512_unpacked(m, n, k, 1, 1));
      Tensor a = values({m, k}, 0.3), b = values({k, n}, 0.7);
      check_product(own_product(a, b), a, b);
      // Accumulate into a c with a leading dimension larger than n: c += a @ b, and the columns past
      // n unchanged.
      Tensor c_wide = values({m, n + 7}, 0.9);
      Tensor c0 = c_wide.narrow(1, 0, n).clone(), tail = c_wide.narrow(1, n, 7).clone();
      cpu::sgemm_avx512(m, n, k, a.data_ptr<float>(), a.stride(0), 1, b.data_ptr<float>(), b.stride(0), 1, true,
                        c_wide.data_ptr<float>(), n + 7);
      check_product(c_wide.narrow(1, 0, n), a, b, c0);
      test::check_equal(c_wide.narrow(1, n, 7), tail);
      // Rows of wider matrices: leading dimensions larger than k and n.
      Tensor a_wide = values({m, k + 5}, 0.4).narrow(1, 3, k), b_wide = values({k, n + 19}, 0.5).narrow(1, 2, n);
      check_product(own_product(a_wide, b_wide), a_wide, b_wide);
    }
  }
}

TEST_CASE("addmm: bias + a @ b against float64, its gradients, and its errors") {
  Tensor a = values({37, 53}, 0.1), b = values({53, 29}, 0.2).t().contiguous().t();  // b transposed in memory
  Tensor bias = values({29}, 0.3);
  check_product(addmm(bias, a, b), a, b, bias.expand({37, 29}));
  Tensor full_bias = values({37, 29}, 0.4);  // any broadcastable bias
  check_product(addmm(full_bias, a, b), a, b, full_bias);
  check_product(addmm(values({37, 1}, 0.5), a, b), a, b, values({37, 1}, 0.5).expand({37, 29}));
  // nn::linear goes through addmm for a contiguous input of any rank.
  Tensor x = values({3, 5, 53}, 0.6), w = values({29, 53}, 0.7);
  test::check_close(nn::linear(x, w, bias), matmul(x, w.t()) + bias, {1e-5, 1e-6});
  // Gradients in float64, a bias of each shape.
  auto f64 = [](const Shape& s, double seed) { return test::sample(s, kFloat64, seed).requires_grad_(true); };
  for (const Shape& bias_shape : {Shape{6}, Shape{4, 6}, Shape{4, 1}}) {
    INFO("bias " << bias_shape.str());
    CHECK(autograd::gradcheck([](const autograd::TensorList& in) { return autograd::TensorList{addmm(in[0], in[1], in[2])}; },
                              {f64(bias_shape, 0.1), f64({4, 5}, 0.2), f64({5, 6}, 0.3)}));
  }
  test::check_error([&] { (void)addmm(bias, a, a); }, {"addmm", "(37, 53)", "cannot be multiplied"});
  test::check_error([&] { (void)addmm(values({30}, 0.1), a, b); }, {"addmm", "[30]", "cannot be broadcast", "[37, 29]"});
  test::check_error([&] { (void)addmm(bias.to(kFloat64), a, b); }, {"addmm", "one dtype", "float64"});
  test::check_error([&] { (void)addmm(bias, values({2, 3, 4}, 0.1), b); }, {"addmm", "2-D", "[2, 3, 4]"});
  // addmm_out: into any strided out, no gradient recorded.
  Tensor out = zeros({29, 37}).t();
  CHECK(addmm_out(out, bias, a, b).is_same(out));
  check_product(out, a, b, bias.expand({37, 29}));
  // out may be an operand (x = bias + x @ w, as PyTorch allows): the product reads every element of
  // a and b many times, so an operand sharing out's memory is read as it was before the call.
  for (int which = 0; which < 4; ++which) {
    INFO("out is operand " << which);
    Tensor x = values({16, 16}, 0.4), w = values({16, 16}, 0.5), r = values({16}, 0.6);
    const Tensor bias_in = which == 0 ? x.select(0, 3) : which == 3 ? x : r;  // a row of x, or x itself
    const Tensor a_in = which == 1 ? x : w, b_in = which == 2 ? x.t() : w;
    const Tensor expected = matmul(a_in.to(kFloat64), b_in.to(kFloat64)) + bias_in.to(kFloat64);
    addmm_out(x, bias_in, a_in, b_in);
    test::check_close(x.to(kFloat64), expected, {1e-5, 1e-6});
  }
  test::check_error([&] { (void)addmm_out(zeros({37, 30}), bias, a, b); }, {"addmm_out", "[37, 29]", "[37, 30]"});
  Tensor leaf = values({37, 53}, 0.1).requires_grad_(true);
  test::check_error([&] { (void)addmm_out(zeros({37, 29}), bias, leaf, b); }, {"addmm_out", "no gradient", "addmm"});
}

TEST_CASE("addmm_gelu: gelu(bias + a @ b) in both forms, fusion on and off, gradients, errors") {
  Tensor a = values({37, 53}, 0.1), b = values({29, 53}, 0.2).t();  // b transposed, as linear's weight
  Tensor bias = values({29}, 0.3);
  for (const char* approximate : {"tanh", "none"}) {
    INFO(approximate);
    // Against float64: the float32 product's error bound, which gelu (slope <= 1.13) keeps small.
    Tensor exact = gelu(matmul(a.to(kFloat64), b.to(kFloat64)) + bias.to(kFloat64), approximate);
    Tensor on = addmm_gelu(bias, a, b, approximate);
    test::check_close(on.to(kFloat64), exact, {1e-5, 1e-5});
    test::FusionGuard off(false);
    test::check_close(addmm_gelu(bias, a, b, approximate), on, {1e-6, 1e-6});
  }
  CHECK(addmm_gelu(bias, a, b).dtype() == kFloat32);
  test::check_close(addmm_gelu(bias, a, b), addmm_gelu(bias, a, b, "tanh"), {0, 0});  // tanh by default
  // Gradients and second derivatives in float64, both forms.
  auto f64 = [](const Shape& s, double seed) { return test::sample(s, kFloat64, seed).requires_grad_(true); };
  for (std::string approximate : {"tanh", "none"}) {
    INFO(approximate);
    autograd::DifferentiableFn f = [approximate](const autograd::TensorList& in) {
      return autograd::TensorList{addmm_gelu(in[0], in[1], in[2], approximate)};
    };
    CHECK(autograd::gradcheck(f, {f64({6}, 0.1), f64({4, 5}, 0.2), f64({5, 6}, 0.3)}));
    CHECK(autograd::gradgradcheck(f, {f64({6}, 0.1), f64({4, 5}, 0.2), f64({5, 6}, 0.3)}));
  }
  // bfloat16 (the composition in bfloat16, gelu(addmm)) against the same values in float32.
  Tensor a16 = a.to(kBFloat16), b16 = b.to(kBFloat16), bias16 = bias.to(kBFloat16);
  test::check_close(addmm_gelu(bias16, a16, b16).to(kFloat32),
                    gelu(addmm(bias16.to(kFloat32), a16.to(kFloat32), b16.to(kFloat32)), "tanh"), {2e-2, 2e-2});
  test::check_error([&] { (void)addmm_gelu(values({37, 29}, 0.4), a, b); },
                    {"addmm_gelu", "bias must be 1-D", "(29)", "[37, 29]"});
  test::check_error([&] { (void)addmm_gelu(values({1}, 0.4), a, b); }, {"addmm_gelu", "bias must be 1-D", "[1]"});
  test::check_error([&] { (void)addmm_gelu(bias, a, b, "fast"); }, {"addmm_gelu", "approximate", "fast"});
  test::check_error([&] { (void)addmm_gelu(bias, a, a); }, {"addmm_gelu", "cannot be multiplied"});
  test::check_error([&] { (void)addmm_gelu(bias.to(kFloat64), a, b); }, {"addmm_gelu", "one dtype", "float64"});
}

TEST_CASE("nn::linear through addmm: a fresh output (in-place ops recordable), any rank, in_features 0") {
  Tensor x = values({2, 3, 5}, 0.1).requires_grad_(true), w = values({4, 5}, 0.2).requires_grad_(true);
  Tensor bias = values({4}, 0.3).requires_grad_(true);
  Tensor y = nn::linear(x, w, bias);
  y.relu_();  // an in-place op on the output, recorded
  y.sum().backward();
  Tensor x2 = x.detach().requires_grad_(true), w2 = w.detach().requires_grad_(true), b2 = bias.detach().requires_grad_(true);
  relu(matmul(x2, w2.t()) + b2).sum().backward();
  test::check_close(x.grad(), x2.grad(), {1e-6, 1e-6});
  test::check_close(w.grad(), w2.grad(), {1e-6, 1e-6});
  test::check_close(bias.grad(), b2.grad(), {1e-6, 1e-6});
  // No input features: the output is the bias, as before.
  test::check_equal(nn::linear(zeros({3, 0}), zeros({4, 0}), bias.detach()), bias.detach().expand({3, 4}));
  // A bias of another dtype still adds (the composed path).
  test::check_close(nn::linear(values({3, 5}, 0.1), values({4, 5}, 0.2), values({4}, 0.3).to(kFloat64)),
                    matmul(values({3, 5}, 0.1), values({4, 5}, 0.2).t()) + values({4}, 0.3), {1e-6, 1e-6});
}

// ---- bfloat16: cpu/bf16gemm.cpp's two kernels, on CPUs with AVX512-BF16 and with AMX ----
namespace {

using Bf16Kernel = void (*)(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t,
                            int64_t, BFloat16*, int64_t);
struct NamedKernel {
  const char* name;
  Bf16Kernel gemm;
};

// The kernels this CPU can run (none: the tests say so and check nothing).
std::vector<NamedKernel> bf16_kernels() {
  std::vector<NamedKernel> kernels;
  if (cpu::cpu_has_avx512_bf16()) kernels.push_back({"AVX512-BF16", cpu::bf16gemm_avx512});
  if (cpu::cpu_has_amx_bf16()) kernels.push_back({"AMX", cpu::bf16gemm_amx});
  if (kernels.empty()) WARN("no AVX512-BF16 on this CPU: cpu/bf16gemm.cpp is not used, not checked");
  if (kernels.size() == 1) WARN("no AMX-BF16 on this CPU (or not allowed by the OS): bf16gemm.cpp's AMX kernel is not checked");
  return kernels;
}

// a @ b for 2-D bfloat16 a and b through one of cpu/bf16gemm.cpp's kernels, with the views' strides.
Tensor own_bf16_product(Bf16Kernel gemm, const Tensor& a, const Tensor& b) {
  Tensor c = zeros({a.size(0), b.size(1)}, kBFloat16);
  gemm(a.size(0), b.size(1), a.size(1), a.data_ptr<BFloat16>(), a.stride(0), a.stride(1), b.data_ptr<BFloat16>(),
       b.stride(0), b.stride(1), c.data_ptr<BFloat16>(), c.stride(0));
  return c;
}

// A bfloat16 product: a float32 sum (the instructions also flush denormals: the bound's 1e-30)
// rounded once to bfloat16, which has 8 significant bits.
void check_bf16_product(const Tensor& actual, const Tensor& a, const Tensor& b) {
  REQUIRE(actual.dtype() == kBFloat16);
  check_product(actual, a, b, Tensor(), std::ldexp(1.0, -8));
}

Tensor bf16_values(const Shape& shape, double seed) { return test::sample(shape, kFloat32, seed).to(kBFloat16); }

}  // namespace

TEST_CASE("bfloat16 cpu/bf16gemm.cpp at tile, pair and block edges, against float64") {
  // (m, k, n): k odd (a lone last row of k, its pair's high half zero) and even, k not a multiple
  // of AMX's 32 and across the 2,048-row blocks (the float32 partial sums between blocks) with an
  // odd tail, n across every edge panel width and the 2,064-column blocks, m across 8- and 16-row
  // tiles and 64-row blocks.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1},     {7, 5, 3},      {8, 2, 16},      {9, 17, 33},    {16, 1, 48},  {23, 40, 49},   {17, 32, 96},
      {65, 301, 47}, {129, 256, 97}, {37, 2049, 100}, {20, 4100, 60}, {3, 7, 2065}, {130, 64, 4200}};
  for (const auto& [name, gemm] : bf16_kernels())
    for (const auto& [m, k, n] : shapes) {
      INFO(name << " kernel");
      Tensor a = bf16_values({m, k}, 0.3), b = bf16_values({k, n}, 0.7);
      Tensor one, two;
      {
        ThreadsGuard g(1);
        one = own_bf16_product(gemm, a, b);
      }
      {
        ThreadsGuard g(2);
        two = own_bf16_product(gemm, a, b);
      }
      check_bf16_product(one, a, b);
      test::check_equal(two, one);  // the same sums however c is split between threads
    }
}

TEST_CASE("bfloat16: which CPUs' VDPBF16PS keeps the FMA's rate, from the vendor and CPUID's family fields") {
  // Note [which bfloat16 GEMM] in cpu/matmul.cpp: AMD from family 0x19 (Zen 4) on. CPUID leaf 1's eax
  // of real CPUs: the family is the base field, plus the extended field where the base is 0xf.
  struct Cpu {
    const char* name;
    bool amd;
    uint32_t eax;
    bool expected;
  };
  for (const Cpu& c : std::vector<Cpu>{
           {"AMD Zen 2 (EPYC 7002, family 0x17 model 0x31)", true, 0x00830F10, false},
           {"AMD Zen 3 (EPYC 7003, family 0x19 model 0x01; no AVX512-BF16, so never asked)", true, 0x00A00F11, true},
           {"AMD Zen 4 (EPYC 9004, family 0x19 model 0x11)", true, 0x00A10F11, true},
           {"AMD Zen 5 (EPYC 9005, family 0x1a model 0x02)", true, 0x00B00F21, true},
           {"Intel Sapphire Rapids (family 6 model 0x8f)", false, 0x000806F8, false},
           {"family 6 with the extended field set, which then does not count", true, 0x0FF00600, false},
           {"family 0xf + 0x09 = 0x18, the one below Zen 3 and 4's", true, 0x00900F00, false}}) {
    INFO(c.name);
    CHECK(cpu::bf16_dot_at_fma_rate(c.amd, c.eax) == c.expected);
  }
}

TEST_CASE("bfloat16 cpu/bf16gemm.cpp with transposed and strided operands, and matmul reaching it") {
  // Note [which bfloat16 GEMM] in cpu/matmul.cpp: AMX where the CPU has it; AVX512-BF16 where it
  // has only that and its dot product keeps the FMA's rate, or anywhere with KILN_CPU_BF16_GEMM=own
  // (CTest runs test_ops so once more); else through float32.
  const char* env = std::getenv("KILN_CPU_BF16_GEMM");
  const bool told_own = env != nullptr && std::string_view(env) == "own";
  const bool told_float = env != nullptr && std::string_view(env) == "float";
  const bool avx512 = cpu::cpu_has_avx512_bf16() && (told_own || cpu::cpu_bf16_dot_at_fma_rate());
  const cpu::Bf16Gemm expected = told_float                ? cpu::Bf16Gemm::kFloat
                                 : cpu::cpu_has_amx_bf16() ? cpu::Bf16Gemm::kAmx
                                 : avx512                  ? cpu::Bf16Gemm::kAvx512
                                                           : cpu::Bf16Gemm::kFloat;
  CHECK(cpu::bf16gemm_choice() == expected);
  for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{45, 271, 100}, {5, 40, 20}, {70, 2050, 30}}) {
    Tensor a = bf16_values({m, k}, 0.1), b = bf16_values({k, n}, 0.2);
    Tensor at = bf16_values({k, m}, 0.3).t(), bt = bf16_values({n, k}, 0.4).t();  // strides (1, ld)
    Tensor a_strided = bf16_values({k, m, 2}, 0.5).select(2, 0).t();
    Tensor b_strided = bf16_values({n, k, 3}, 0.6).select(2, 1).t();
    Tensor a_wide = bf16_values({m, k + 13}, 0.8).narrow(1, 5, k);  // rows of a wider matrix
    for (const Tensor& x : {a, at, a_strided, a_wide})
      for (const Tensor& y : {b, bt, b_strided}) {
        INFO("m " << m << ", k " << k << ", n " << n << ", a strides " << x.stride(0) << ", " << x.stride(1)
                  << ", b strides " << y.stride(0) << ", " << y.stride(1));
        for (const auto& [name, gemm] : bf16_kernels()) {
          INFO(name << " kernel");
          const Tensor own = own_bf16_product(gemm, x, y);
          check_bf16_product(own, x, y);
          const bool chosen = (expected == cpu::Bf16Gemm::kAmx && gemm == cpu::bf16gemm_amx) ||
                              (expected == cpu::Bf16Gemm::kAvx512 && gemm == cpu::bf16gemm_avx512);
          if (chosen) test::check_equal(matmul(x, y), own);
        }
        check_bf16_product(matmul(x, y), x, y);
      }
  }
  // Batched, b broadcast over the batch, and the small products split over the batch.
  Tensor a3 = bf16_values({6, 3, 20, 33}, 0.1), b3 = bf16_values({6, 3, 33, 50}, 0.2);
  Tensor c3 = matmul(a3, b3);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 3; ++j) check_bf16_product(c3.select(0, i).select(0, j), a3.select(0, i).select(0, j), b3.select(0, i).select(0, j));
  Tensor a2 = bf16_values({2, 200, 130}, 0.3), b2 = bf16_values({130, 300}, 0.5);
  Tensor c2 = matmul(a2, b2);
  for (int64_t i = 0; i < 2; ++i) check_bf16_product(c2.select(0, i), a2.select(0, i), b2);
}

TEST_CASE("bfloat16 cpu/bf16gemm.cpp's products into float32, added to c or not") {
  // bf16gemm_avx512_f32 and bf16gemm_amx_f32, the block products of the attention and convolution
  // kernels (cpu/bf16_products.h): the float32 sums unrounded, written over c or added to it, with k
  // odd and across a 2,048-row block (c holding the sums between blocks), transposed operands, and
  // c's rows wider than n.
  using F32Kernel = void (*)(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t,
                             int64_t, bool, float*, int64_t);
  std::vector<std::pair<const char*, F32Kernel>> kernels;
  if (cpu::cpu_has_avx512_bf16()) kernels.emplace_back("AVX512-BF16", cpu::bf16gemm_avx512_f32);
  if (cpu::cpu_has_amx_bf16()) kernels.emplace_back("AMX", cpu::bf16gemm_amx_f32);
  if (kernels.size() < 2) WARN("this CPU runs " << kernels.size() << " of bf16gemm.cpp's two float32-output kernels");
  for (const auto& [name, gemm] : kernels) {
    INFO(name << " kernel");
    const std::vector<std::array<int64_t, 3>> shapes = {{64, 32, 64}, {7, 70, 50}, {33, 2100, 20}, {64, 16, 48}, {9, 33, 17}};
    for (const auto& [m, k, n] : shapes) {
      Tensor a = bf16_values({m, k}, 0.2), at = bf16_values({k, m}, 0.3).t();
      Tensor b = bf16_values({k, n}, 0.4), bt = bf16_values({n, k}, 0.5).t();
      for (const Tensor& x : {a, at})
        for (const Tensor& y : {b, bt})
          for (bool accumulate : {false, true}) {
            INFO("m " << m << ", k " << k << ", n " << n << ", a strides " << x.stride(0) << ", " << x.stride(1)
                      << ", b strides " << y.stride(0) << ", " << y.stride(1) << ", accumulate " << accumulate);
            Tensor c0 = test::sample({m, n + 5}, kFloat32, 0.6);  // rows n + 5 apart; the last 5 untouched
            Tensor c = c0.clone(), c_one = c0.clone();
            auto product = [&](Tensor& out) {
              gemm(m, n, k, x.data_ptr<BFloat16>(), x.stride(0), x.stride(1), y.data_ptr<BFloat16>(), y.stride(0),
                   y.stride(1), accumulate, out.data_ptr<float>(), out.stride(0));
            };
            product(c);
            {
              ThreadsGuard one(1);
              product(c_one);
            }
            check_product(c.narrow(1, 0, n), x, y, accumulate ? c0.narrow(1, 0, n) : Tensor());
            test::check_equal(c.narrow(1, n, 5), c0.narrow(1, n, 5));
            test::check_equal(c_one, c);  // the same sums on one thread as on all
          }
    }
  }
  // k = 0: c zeroed, or left as it was when accumulating.
  for (const auto& [name, gemm] : kernels) {
    INFO(name << " kernel");
    Tensor c = test::sample({3, 4}, kFloat32, 0.1), kept = c.clone();
    const BFloat16 none{};
    gemm(3, 4, 0, &none, 0, 1, &none, 4, 1, true, c.data_ptr<float>(), 4);
    test::check_equal(c, kept);
    gemm(3, 4, 0, &none, 0, 1, &none, 4, 1, false, c.data_ptr<float>(), 4);
    test::check_equal(c, zeros({3, 4}));
  }
}

TEST_CASE("bfloat16 cpu/bf16gemm.cpp rounds as a float32-to-bfloat16 cast does, NaN and infinity kept") {
  // With k = 1 and 2 the float32 sum is the same in any order, so the product must equal, bit for
  // bit, the float32 product of the same values cast to bfloat16: to nearest even (products of two
  // bfloat16 have up to 16 significant bits, so ties occur), a NaN quiet.
  for (const auto& [name, gemm] : bf16_kernels()) {
    INFO(name << " kernel");
    for (int64_t k : {1, 2}) {
      Tensor a = (bf16_values({33, k}, 0.2) * 3.0f).to(kBFloat16), b = (bf16_values({k, 50}, 0.9) * 7.0f).to(kBFloat16);
      INFO("k " << k);
      test::check_equal(own_bf16_product(gemm, a, b), matmul(a.to(kFloat32), b.to(kFloat32)).to(kBFloat16));
    }
    Tensor a = bf16_values({9, 20}, 0.4), b = bf16_values({20, 17}, 0.6);
    a.select(0, 2).select(0, 5).fill_(std::nan(""));
    b.select(1, 4).select(0, 7).fill_(INFINITY);
    Tensor c = own_bf16_product(gemm, a, b).to(kFloat32);
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t j = 0; j < 17; ++j) {
        const float v = c.select(0, i).select(0, j).item<float>();
        INFO("c[" << i << ", " << j << "] = " << v);
        if (i == 2) {
          CHECK(std::isnan(v));  // NaN times anything finite
        } else if (j == 4) {
          CHECK((std::isinf(v) || std::isnan(v)));  // an infinity times a's row: inf, or NaN where a has 0
        } else {
          CHECK(std::isfinite(v));
        }
      }
    // k = 0: zeros.
    Tensor empty_a = zeros({4, 0}, kBFloat16), empty_b = zeros({0, 5}, kBFloat16);
    test::check_equal(own_bf16_product(gemm, empty_a, empty_b), zeros({4, 5}, kBFloat16));
  }
}

TEST_CASE("matmul of (..., M, K) by (K, N) or (K): one GEMM over all rows, values and gradients as per batch") {
  // Where a's leading dims merge (contiguous, or a view of whole rows) the product runs as one
  // (rows, K) @ (K, N) GEMM, as PyTorch folds it; other layouts keep the batched form. Either way the
  // output and both gradients equal the per-batch-element products in float64 (exact: small integers).
  auto ints = [](const Shape& shape, uint64_t seed) {
    Generator gen(seed);
    return randint(-4, 5, shape, kInt64, &gen).to(kFloat64);
  };
  const Tensor base = ints({3, 2, 5, 4}, 1), w = ints({4, 6}, 2), v = ints({4}, 3);
  struct Case {
    const char* name;
    Tensor a;
  };
  for (const Case& c : {Case{"contiguous", base}, Case{"narrowed rows", base.narrow(2, 1, 3)},
                        Case{"transposed batch dims", base.transpose(0, 1)}, Case{"rows across batches", base.transpose(1, 2)}}) {
    INFO(c.name);
    Shape out_shape = c.a.sizes();
    out_shape[3] = 6;
    const Tensor cot = ints(out_shape, 4);
    for (DType dt : {kFloat64, kFloat32}) {
      INFO(dtype_name(dt));
      Tensor a = c.a.to(dt).requires_grad_(), b = w.to(dt).requires_grad_();
      const Tensor y = matmul(a, b);
      REQUIRE(y.sizes() == out_shape);
      const auto grads = autograd::grad({y}, {a, b}, {cot.to(dt)});
      Tensor gb = zeros({4, 6}, kFloat64);
      for (int64_t i = 0; i < out_shape[0]; ++i) {
        for (int64_t j = 0; j < out_shape[1]; ++j) {
          const Tensor ai = c.a[i][j], gi = cot[i][j];
          test::check_equal(y[i][j].to(kFloat64), ai.matmul(w));
          test::check_equal(grads[0][i][j].to(kFloat64), gi.matmul(w.t()));
          gb = gb + ai.t().matmul(gi);
        }
      }
      test::check_equal(grads[1].to(kFloat64), gb);
    }
    // A 1-D right operand: (..., M, K) @ (K) is (..., M).
    test::check_equal(matmul(c.a, v), (c.a * v).sum(Shape{-1}));
  }
}

// tests/cuda/test_cuda_fused.cpp: the fused kernels of cuda/fused.cu (layer_norm, rms_norm,
// add_layer_norm, bias_gelu, softmax_cross_entropy) and cuda/ctc.cu (ctc_loss) on cuda:0 against the
// CPU's fused kernels (which tests/ops/test_fused.cpp and tests/nn/test_margin_losses.cpp check
// against the unfused compositions), forward and every gradient, in float64 and float32
// (softmax_cross_entropy also in float16 and bfloat16), at odd sizes and rows longer than a warp's
// stride; the target checks; and the composed CUDA path (fusion off) against the fused one. Skipped
// (exit 77) without a GPU.
#include <cmath>

#include "support.h"

using namespace kiln;
using test::FusionGuard;
using autograd::TensorList;

namespace {

const Device kGpu = Device::cuda(0);

using Fn = std::function<TensorList(const TensorList&)>;

// fn on CPU leaves and on their copies on cuda:0 (both fused); outputs and gradients compared.
void check_gpu_equals_cpu(const Fn& fn, const TensorList& inputs, uint64_t seed, bool fused_gpu = true) {
  auto run = [&](Device device, bool fused) {
    FusionGuard guard(fused);
    TensorList leaves;
    std::vector<Tensor> wrt;
    for (const Tensor& t : inputs) {
      Tensor l = t.to(device).clone();
      if (l.is_floating_point()) {
        l.requires_grad_();
        wrt.push_back(l);
      }
      leaves.push_back(l);
    }
    TensorList out = fn(leaves);
    Generator gen(seed);
    std::vector<Tensor> cots;
    for (auto& o : out) cots.push_back(randn(o.sizes(), o.dtype(), &gen).to(device));
    TensorList grads = autograd::grad(std::vector<Tensor>(out.begin(), out.end()), wrt, cots);
    return std::make_pair(out, grads);
  };
  auto [cpu_out, cpu_grads] = run(Device::cpu(), true);
  auto [gpu_out, gpu_grads] = run(kGpu, fused_gpu);
  const DType dt = inputs[0].dtype();
  const test::Tolerance tol = dt == kFloat64 ? test::Tolerance{1e-11, 1e-11} : test::Tolerance{2e-5, 2e-5};
  for (size_t i = 0; i < cpu_out.size(); ++i) {
    INFO("output " << i);
    test::check_close(gpu_out[i].cpu(), cpu_out[i], tol);
  }
  // 16-bit gradients computed in float32 on both devices and rounded once: a float32 difference at a
  // rounding boundary is one unit in the last place of the 16-bit value (2^-8 of it in bfloat16, 2^-11
  // in float16); the absolute part covers float16's subnormals.
  const bool low = dt == kFloat16 || dt == kBFloat16;
  const test::Tolerance grad_tol = dt == kBFloat16 ? test::Tolerance{8e-3, 1e-6}
                                   : dt == kFloat16 ? test::Tolerance{1e-3, 1e-7}
                                                    : tol;
  for (size_t i = 0; i < cpu_grads.size(); ++i) {
    INFO("gradient " << i);
    // A 1-D gradient (weight, bias) of a 2-D input is a column sum over its rows, each term of which
    // may differ by the elementwise tolerance (tanh and erf are not rounded alike on the two devices).
    // Such differences add like a random walk: the absolute tolerance grows with sqrt(rows). Without
    // it a bias gradient of 2048 rows whose terms cancel down to about 1 differs by 5e-5 in float32.
    test::Tolerance t = grad_tol;
    if (cpu_grads[i].dim() == 1 && inputs[0].dim() == 2) t.atol *= std::sqrt(static_cast<double>(inputs[0].size(0)));
    if (low) REQUIRE(gpu_grads[i].dtype() == dt);
    test::check_close(gpu_grads[i].cpu().to(kFloat64), cpu_grads[i].to(kFloat64), t);
  }
}

}  // namespace

TEST_CASE("fused layer_norm, rms_norm and add_layer_norm on cuda:0 equal the CPU's", "[gpu][fused]") {
  // float32 rows of up to 1024 are held in a warp's registers, of 1025 to 4096 in a block's, longer
  // ones walked (Note [layer_norm rows in registers]): both edges of each.
  for (DType dt : {kFloat64, kFloat32}) {
    for (auto [rows, m] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {1023, 128}, {64, 768}, {5, 1024}, {3, 1025}, {40, 3000}, {4, 4096}, {9, 4097}}) {
      INFO(dtype_name(dt) << ", rows " << rows << ", M " << m);
      Generator gen(static_cast<uint64_t>(rows + m));
      Tensor x = randn({rows, m}, dt, &gen) * 2 + 100, r = randn({rows, m}, dt, &gen);
      Tensor w = randn({m}, dt, &gen), b = randn({m}, dt, &gen);
      check_gpu_equals_cpu([m](const TensorList& t) -> TensorList { return {layer_norm(t[0], {m}, t[1], t[2])}; },
                           {x, w, b}, 1);
      check_gpu_equals_cpu([m](const TensorList& t) -> TensorList { return {layer_norm(t[0], {m}, t[1])}; }, {x, w}, 2);
      check_gpu_equals_cpu([m](const TensorList& t) -> TensorList { return {rms_norm(t[0], {m}, t[1])}; }, {x, w}, 3);
      check_gpu_equals_cpu(
          [m](const TensorList& t) -> TensorList {
            auto [h, y] = add_layer_norm(t[0], t[1], {m}, t[2], t[3]);
            return {h, y};
          },
          {x, r, w, b}, 4);
      // The composed CUDA path (fusion off) against the CPU's fused kernel.
      check_gpu_equals_cpu([m](const TensorList& t) -> TensorList { return {layer_norm(t[0], {m}, t[1], t[2])}; },
                           {x, w, b}, 5, false);
    }
  }
}

TEST_CASE("fused bias_gelu on cuda:0 equals the CPU's", "[gpu][fused]") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (const char* approx : {"none", "tanh"}) {
      for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 13}, {2048, 512}}) {
        INFO(dtype_name(dt) << ", " << approx << ", rows " << rows << ", N " << n);
        Generator gen(static_cast<uint64_t>(rows * 3 + n));
        Tensor x = randn({rows, n}, dt, &gen) * 3, b = randn({n}, dt, &gen);
        check_gpu_equals_cpu([approx](const TensorList& t) -> TensorList { return {bias_gelu(t[0], t[1], approx)}; },
                             {x, b}, 6);
      }
    }
  }
}

TEST_CASE("fused softmax_cross_entropy on cuda:0 equals the CPU's, bad targets are an Error", "[gpu][fused]") {
  // Rows of up to 1024 classes take a warp each, longer ones a block; 16-byte aligned rows (C a
  // multiple of 16 bytes: 256, 50304) are read sixteen bytes at a time, the others element by element.
  for (DType dt : {kFloat64, kFloat32, kBFloat16, kFloat16}) {
    for (double eps : {0.0, 0.1}) {
      for (auto [rows, c] : std::vector<std::pair<int64_t, int64_t>>{
               {1, 1}, {9, 7}, {2048, 256}, {5, 50257}, {3, 50304}, {70, 1032}}) {
        INFO(dtype_name(dt) << ", eps " << eps << ", rows " << rows << ", C " << c);
        Generator gen(static_cast<uint64_t>(rows + c));
        Tensor logits = (randn({rows, c}, kFloat32, &gen) * 4).to(dt);
        Tensor target = randint(0, c, {rows}, kInt64, &gen);
        if (rows > 2) target[1].fill_(-100);
        Tensor tg = target.to(kGpu);
        check_gpu_equals_cpu(
            [&](const TensorList& t) -> TensorList {
              return {softmax_cross_entropy(t[0], t[0].device().is_cpu() ? target : tg, -100, eps)};
            },
            {logits}, 7);
      }
    }
  }
  // Rows that test the one-pass log-sum-exp (Note [one pass over the logits] in cuda/fused.cu): every
  // logit -inf (lse -inf, so the loss is -inf - -inf: NaN, as on the CPU), half of them -inf, a +inf
  // (NaN), the maximum last, logits 1400 apart, -inf in the middle of the row.
  // The same at 300 classes (a warp's rows) and at 3000 (a block's), where it is 10 times wider.
  for (int64_t w : {1, 10}) {
    const double inf = std::numeric_limits<double>::infinity();
    const int64_t C = 300 * w;
    Tensor x = randn({6, C}, kFloat64) * 3;
    x[0].fill_(-inf);
    x[1].narrow(0, 0, 150 * w).fill_(-inf);
    x[2][77 * w].fill_(inf);
    x[3][C - 1].fill_(40.0);
    x[4].narrow(0, 0, 100 * w).fill_(-700.0);
    x[4].narrow(0, 100 * w, 100 * w).fill_(700.0);
    x[5].narrow(0, 40 * w, 200 * w).fill_(-inf);
    Tensor target = from_vector<int64_t>({0, 200 * w, 1, C - 1, 5, 250 * w}, {6});
    for (DType dt : {kFloat64, kFloat32}) {
      INFO(dtype_name(dt) << " special rows, C " << C);
      Tensor xd = x.to(dt);
      test::check_close(softmax_cross_entropy(xd.to(kGpu), target.to(kGpu)).cpu(), softmax_cross_entropy(xd, target));
    }
  }
  Tensor logits = zeros({3, 4}, TensorOptions().device(kGpu));
  test::check_error([&] { softmax_cross_entropy(logits, from_vector<int64_t>({0, 4, 1}, {3}).to(kGpu)); },
                    {"cross_entropy", "target 4 at position 1", "[0, 4)"});
}

TEST_CASE("fused ctc_loss on cuda:0 equals the CPU's, bad lengths and labels are an Error", "[gpu][fused][ctc]") {
  // 161 states (more than a block's 128 threads), frames past a sample's length, a target without
  // frames, one its frames cannot hold (45 distinct labels in 40 frames), an empty one; the GPU fused
  // and composed against the CPU's fused kernel (which tests/nn checks against the composition).
  const int64_t frames = 100, samples = 5, classes = 30, longest = 80;
  std::vector<int64_t> labels(samples * longest);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = 1 + (static_cast<int64_t>(i) * 7) % (classes - 1);
  const Tensor targets = from_vector(labels, {samples, longest});
  const Tensor in_len = from_vector<int64_t>({100, 90, 0, 40, 100}), tgt_len = from_vector<int64_t>({80, 30, 2, 45, 0});
  const Fn fn = [](const TensorList& t) {
    return TensorList{nn::ctc_loss(log_softmax(t[0], 2), t[1], t[2], t[3], {.reduction = "none"})};
  };
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dtype_name(dt));
    const Tensor logits = test::sample({frames, samples, classes}, dt, 0.9) * 2;
    check_gpu_equals_cpu(fn, {logits, targets, in_len, tgt_len}, 11);
    check_gpu_equals_cpu(fn, {logits, targets, in_len, tgt_len}, 11, false);
  }
  const Tensor lp = zeros({3, 2, 4}, TensorOptions().device(kGpu));
  const Tensor t = from_vector<int64_t>({1, 2, 3, 1}, {2, 2}).to(kGpu), l = from_vector<int64_t>({3, 2}).to(kGpu);
  test::check_error([&] { ops::ctc_nll(lp, t, from_vector<int64_t>({3, 4}).to(kGpu), l); },
                    {"ctc_loss", "input length is outside [0, 3]"});
  test::check_error([&] { ops::ctc_nll(lp, t, l, from_vector<int64_t>({2, 3}).to(kGpu)); },
                    {"ctc_loss", "target length is outside [0, 2]"});
  test::check_error([&] { ops::ctc_nll(lp, from_vector<int64_t>({1, 2, 4, 1}, {2, 2}).to(kGpu), l, l - l + 2); },
                    {"ctc_loss", "not a class index in [0, 4)"});
}

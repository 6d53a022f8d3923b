// bench_cnn_layers: the convolution and pooling part of BENCHMARKS.md workload "d" (the CNN) for Kiln,
// at batch 128: Conv(1->32, 3x3, pad 1)-ReLU-MaxPool2-Conv(32->64, 3x3, pad 1)-ReLU-MaxPool2 on a
// (128, 1, 28, 28) input, forward alone and forward + backward (gradients of both convolutions' weights
// and biases; the input needs none), and each layer's forward alone. ms = median of 15 runs after 3
// warm-up runs. Then conv3d, conv_transpose2d, a stride-2 conv2d, adaptive max pooling, the gather and
// scatter_add that losses and pooling backwards use, bilinear and nearest 2x upsampling, reflect
// padding, 3-D pooling, overlapping 2-D average pooling, conv_transpose3d, unfold and fold (see the
// end of main). One JSON line per result.
// Its PyTorch counterpart: benchmarks/torch_cnn_layers.py.
// Usage: bench_cnn_layers [threads] [--autocast bf16] (threads default 2). With --autocast bf16 the
// CNN's parts run under bfloat16 autocast (the backward kernels' parts on bfloat16 copies of their
// operands), each line saying "autocast":"bf16", and the parts beyond the CNN are skipped.
#include <kiln/kiln.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"

using namespace kiln;

static double median_ms(const std::function<void()>& fn) { return kiln_bench::median_ms(fn, 3, 15); }

int main(int argc, char** argv) {
  int threads = 2;
  bool bf16 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--autocast" && i + 1 < argc && std::string(argv[i + 1]) == "bf16") {
      bf16 = true;
      ++i;
    } else if (!arg.empty() && arg.find_first_not_of("0123456789") == std::string::npos && std::atoi(arg.c_str()) > 0) {
      threads = std::atoi(arg.c_str());
    } else {
      std::fprintf(stderr, "usage: %s [threads] [--autocast bf16]\n", argv[0]);
      return 2;
    }
  }
  set_num_threads(threads);
  Generator gen(0);
  Tensor x = randn({128, 1, 28, 28}, {}, &gen);
  Tensor w1 = (randn({32, 1, 3, 3}, {}, &gen) * 0.3).requires_grad_();
  Tensor b1 = zeros({32}).requires_grad_();
  Tensor w2 = (randn({64, 32, 3, 3}, {}, &gen) * 0.06).requires_grad_();
  Tensor b2 = zeros({64}).requires_grad_();
  auto forward = [&] {
    Tensor h = max_pool2d(relu(conv2d(x, w1, b1, {1, 1}, {1, 1})), 2);
    return max_pool2d(relu(conv2d(h, w2, b2, {1, 1}, {1, 1})), 2);
  };
  Tensor cot = randn({128, 64, 7, 7}, {}, &gen);
  auto report = [bf16](const char* what, double ms) {
    std::printf("{\"bench\":\"cnn_layers\",\"impl\":\"kiln\",\"device\":\"cpu\",\"threads\":%d,\"batch\":128,"
                "%s\"part\":\"%s\",\"ms\":%.3f}\n",
                get_num_threads(), bf16 ? "\"autocast\":\"bf16\"," : "", what, ms);
  };
  report("forward_backward", median_ms([&] {
           for (Tensor* p : {&w1, &b1, &w2, &b2}) p->set_grad(Tensor());
           AutocastGuard ac(DeviceType::CPU, kBFloat16, bf16);
           forward().backward(cot);
         }));
  {
    NoGradGuard no_grad;
    AutocastGuard ac(DeviceType::CPU, kBFloat16, bf16);
    report("forward", median_ms([&] { forward(); }));
    Tensor c1 = relu(conv2d(x, w1, b1, {1, 1}, {1, 1}));
    Tensor p1 = max_pool2d(c1, 2);
    Tensor c2 = relu(conv2d(p1, w2, b2, {1, 1}, {1, 1}));
    report("conv1_forward", median_ms([&] { conv2d(x, w1, b1, {1, 1}, {1, 1}); }));
    report("pool1_forward", median_ms([&] { max_pool2d(c1, 2); }));
    report("conv2_forward", median_ms([&] { conv2d(p1, w2, b2, {1, 1}, {1, 1}); }));
    report("pool2_forward", median_ms([&] { max_pool2d(c2, 2); }));
    Tensor g2 = randn(c2.sizes(), {}, &gen).to(c2.dtype()), w2_used = w2.to(c2.dtype());
    report("conv2_backward_input", median_ms([&] {
             conv2d_backward_input(g2, w2_used, p1.sizes(), {1, 1}, {1, 1}, {1, 1}, 1);
           }));
    report("conv2_backward_weight", median_ms([&] {
             conv2d_backward_weight(g2, p1, w2.sizes(), {1, 1}, {1, 1}, {1, 1}, 1);
           }));
  }
  if (bf16) return 0;
  // Beyond the CNN: conv3d (one conv2d over the stacked depth windows, ops/conv.cpp) on a
  // (4, 16, 16, 32, 32) input with a 3x3x3 kernel to 32 channels, and adaptive max pooling (its own
  // kernel, cpu/pool.cpp) of a (128, 32, 28, 28) input to 5 x 5, forward + backward (the gradient of the
  // weight, or of the input) and forward alone; conv_transpose2d of a (32, 64, 14, 14) input to 32 channels
  // with a 4x4 kernel, stride 2, padding 1 (a generator's 2x upsampling, to 28 x 28), likewise; a
  // stride-2 conv2d, forward + backward. Then gather along dim 1 and dim 0 and scatter_add along dim 1
  // of a (2048, 2048) float32 tensor at random int64 indices (cpu/index.cpp).
  Tensor x3 = randn({4, 16, 16, 32, 32}, {}, &gen);
  Tensor w3 = (randn({32, 16, 3, 3, 3}, {}, &gen) * 0.05).requires_grad_();
  Tensor cot3 = randn({4, 32, 16, 32, 32}, {}, &gen);
  Tensor a = randn({128, 32, 28, 28}, {}, &gen).requires_grad_();
  Tensor cot_a = randn({128, 32, 5, 5}, {}, &gen);
  report("conv3d_forward_backward", median_ms([&] {
           w3.set_grad(Tensor());
           conv3d(x3, w3, {}, {1, 1, 1}, {1, 1, 1}).backward(cot3);
         }));
  Tensor xt = randn({32, 64, 14, 14}, {}, &gen);
  Tensor wt = (randn({64, 32, 4, 4}, {}, &gen) * 0.05).requires_grad_();
  Tensor cot_t = randn({32, 32, 28, 28}, {}, &gen);
  report("conv_transpose2d_forward_backward", median_ms([&] {
           wt.set_grad(Tensor());
           conv_transpose2d(xt, wt, {}, {2, 2}, {1, 1}).backward(cot_t);
         }));
  // A ResNet's downsampling convolution: (64, 32, 28, 28) to 64 channels, 3x3, stride 2, padding 1,
  // forward and both gradients (columns copied row by row: no spans at stride 2).
  Tensor xs = randn({64, 32, 28, 28}, {}, &gen).requires_grad_();
  Tensor ws = (randn({64, 32, 3, 3}, {}, &gen) * 0.06).requires_grad_();
  Tensor cot_s = randn({64, 64, 14, 14}, {}, &gen);
  report("conv_stride2_forward_backward", median_ms([&] {
           xs.set_grad(Tensor());
           ws.set_grad(Tensor());
           conv2d(xs, ws, {}, {2, 2}, {1, 1}).backward(cot_s);
         }));
  report("adaptive_max_pool_forward_backward", median_ms([&] {
           a.set_grad(Tensor());
           adaptive_max_pool2d(a, {5}).backward(cot_a);
         }));
  {
    NoGradGuard no_grad;
    report("conv3d_forward", median_ms([&] { conv3d(x3, w3, {}, {1, 1, 1}, {1, 1, 1}); }));
    report("conv_transpose2d_forward", median_ms([&] { conv_transpose2d(xt, wt, {}, {2, 2}, {1, 1}); }));
    report("adaptive_max_pool_forward", median_ms([&] { adaptive_max_pool2d(a, {5}); }));
    Tensor src = randn({2048, 2048}, {}, &gen);
    Tensor picks = randint(0, 2048, {2048, 2048}, kInt64, &gen);
    Tensor base = zeros({2048, 2048});
    report("gather_dim1", median_ms([&] { src.gather(1, picks); }));
    report("gather_dim0", median_ms([&] { src.gather(0, picks); }));
    report("scatter_add_dim1", median_ms([&] { base.scatter_add(1, picks, src); }));
  }
  // A decoder's 2x upsampling and a reflect-padded 7x7 convolution's input: (8, 32, 64, 64), forward
  // alone and forward + backward (compositions of index_select, Note [interpolation is separable]).
  Tensor u = randn({8, 32, 64, 64}, {}, &gen).requires_grad_();
  Tensor cot_u = randn({8, 32, 128, 128}, {}, &gen), cot_p = randn({8, 32, 70, 70}, {}, &gen);
  report("upsample_bilinear_forward_backward", median_ms([&] {
           u.set_grad(Tensor());
           nn::interpolate(u, {.scale_factor = {2}, .mode = "bilinear"}).backward(cot_u);
         }));
  report("pad_reflect_forward_backward", median_ms([&] {
           u.set_grad(Tensor());
           pad(u, {3, 3, 3, 3}, "reflect").backward(cot_p);
         }));
  {
    NoGradGuard no_grad;
    report("upsample_bilinear_forward", median_ms([&] { nn::interpolate(u, {.scale_factor = {2}, .mode = "bilinear"}); }));
    report("upsample_nearest_forward", median_ms([&] { nn::interpolate(u, {.scale_factor = {2}}); }));
    report("pad_reflect_forward", median_ms([&] { pad(u, {3, 3, 3, 3}, "reflect"); }));
  }
  // 3-D pooling (two 2-D poolings, Note [3-D pooling is separable]) of the conv3d input above,
  // conv_transpose3d (one conv_transpose2d and an index_add) as a 3-D decoder's 2x upsampling of
  // (4, 32, 8, 16, 16) to 16 channels, and unfold / fold (index_select / index_add) of
  // (32, 64, 28, 28) with a 3x3 kernel, padding 1.
  Tensor v = x3.clone().requires_grad_();
  Tensor cot_v = randn({4, 16, 8, 16, 16}, {}, &gen);
  // Average pooling with overlapping windows (3x3, stride 2, padding 1) of (64, 16, 32, 32).
  Tensor xa = randn({64, 16, 32, 32}, {}, &gen).requires_grad_();
  Tensor cot_xa = randn({64, 16, 16, 16}, {}, &gen);
  report("avg_pool2d_forward_backward", median_ms([&] {
           xa.set_grad(Tensor());
           avg_pool2d(xa, {3}, {2}, {1}).backward(cot_xa);
         }));
  report("max_pool3d_forward_backward", median_ms([&] {
           v.set_grad(Tensor());
           max_pool3d(v, {2}).backward(cot_v);
         }));
  Tensor xd = randn({4, 32, 8, 16, 16}, {}, &gen);
  Tensor wd = (randn({32, 16, 4, 4, 4}, {}, &gen) * 0.05).requires_grad_();
  Tensor cot_d = randn({4, 16, 16, 32, 32}, {}, &gen);
  report("conv_transpose3d_forward_backward", median_ms([&] {
           wd.set_grad(Tensor());
           conv_transpose3d(xd, wd, {}, {2}, {1}).backward(cot_d);
         }));
  {
    NoGradGuard no_grad;
    report("max_pool3d_forward", median_ms([&] { max_pool3d(x3, {2}); }));
    report("avg_pool3d_forward", median_ms([&] { avg_pool3d(x3, {3}, {2}, {1}); }));
    report("avg_pool2d_forward", median_ms([&] { avg_pool2d(xa, {3}, {2}, {1}); }));
    report("conv_transpose3d_forward", median_ms([&] { conv_transpose3d(xd, wd, {}, {2}, {1}); }));
    Tensor img = randn({32, 64, 28, 28}, {}, &gen);
    Tensor cols = nn::unfold(img, {3}, {1}, {1});
    report("unfold_forward", median_ms([&] { nn::unfold(img, {3}, {1}, {1}); }));
    report("fold_forward", median_ms([&] { nn::fold(cols, {28, 28}, {3}, {1}, {1}); }));
  }
  return 0;
}

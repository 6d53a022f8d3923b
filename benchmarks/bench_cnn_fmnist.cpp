// bench_cnn_fmnist: BENCHMARKS.md workload "d. cnn_fmnist" for Kiln:
// Conv(1->32, 3x3, pad 1)-ReLU-MaxPool2 - Conv(32->64, 3x3, pad 1)-ReLU-MaxPool2 - Flatten(3136) -
// Linear(3136,128)-ReLU-Linear(128,10) on Fashion-MNIST, PyTorch's default init, Adam lr 1e-3 (its
// defaults: betas (0.9, 0.999), eps 1e-8), batches of 128, 1 epoch (--epochs, --data DIR to
// change). One JSON line with s_per_epoch, s_epoch_median, test_acc and peak_rss_mib. Shared loop:
// fmnist_bench.h. Anchor: benchmarks/anchors/anchor_cnn_fmnist.cpp.
#include "fmnist_bench.h"

using namespace kiln;

struct Cnn : nn::Module {
  nn::Conv2d c1{1, 32, 3, {.padding = 1}};   // weight (32, 1, 3, 3)
  nn::Conv2d c2{32, 64, 3, {.padding = 1}};  // weight (64, 32, 3, 3)
  nn::Linear f1{64 * 7 * 7, 128};            // weight (128, 3136)
  nn::Linear f2{128, 10};                    // weight (10, 128)
  Cnn() { register_modules({{"c1", c1}, {"c2", c2}, {"f1", f1}, {"f2", f2}}); }
  Tensor forward(const Tensor& x) override {  // x (B, 1, 28, 28)
    Tensor h = max_pool2d(relu(c1(x)), 2);    // (B, 32, 14, 14)
    h = max_pool2d(relu(c2(h)), 2);           // (B, 64, 7, 7)
    return f2(relu(f1(h.flatten(1))));        // (B, 10)
  }
};

int main(int argc, char** argv) {
  fmnist_bench::Options options = fmnist_bench::parse_args(argc, argv, /*default_epochs=*/1);
  manual_seed(fmnist_bench::kSeed);
  Cnn net;
  net.to(options.device);
  optim::Adam optimizer(net.parameters(), {.lr = 1e-3});
  return fmnist_bench::run("cnn_fmnist", net, optimizer, options);
}

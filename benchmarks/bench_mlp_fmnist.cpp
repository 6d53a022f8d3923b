// bench_mlp_fmnist: BENCHMARKS.md workload "c. mlp_fmnist" for Kiln:
// Linear(784,512)-ReLU-Linear(512,256)-ReLU-Linear(256,10) on Fashion-MNIST, PyTorch's default
// init, SGD lr 0.05 momentum 0.9, batches of 128, 3 epochs (--epochs, --data DIR to change). One
// JSON line with s_per_epoch, s_epoch_median, test_acc and peak_rss_mib. Shared loop:
// fmnist_bench.h. Anchor: benchmarks/anchors/anchor_mlp_fmnist.cpp.
#include "fmnist_bench.h"

using namespace kiln;

struct Mlp : nn::Module {
  nn::Linear fc1{784, 512};  // weight (512, 784)
  nn::Linear fc2{512, 256};  // weight (256, 512)
  nn::Linear fc3{256, 10};   // weight (10, 256)
  Mlp() { register_modules({{"fc1", fc1}, {"fc2", fc2}, {"fc3", fc3}}); }
  Tensor forward(const Tensor& x) override {  // x (B, 1, 28, 28) -> logits (B, 10)
    Tensor h = relu(fc1(x.flatten(1)));
    h = relu(fc2(h));
    return fc3(h);
  }
};

int main(int argc, char** argv) {
  fmnist_bench::Options options = fmnist_bench::parse_args(argc, argv, /*default_epochs=*/3);
  manual_seed(fmnist_bench::kSeed);
  Mlp net;
  net.to(options.device);
  optim::SGD optimizer(net.parameters(), {.lr = 0.05, .momentum = 0.9});
  return fmnist_bench::run("mlp_fmnist", net, optimizer, options);
}

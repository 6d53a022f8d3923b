// anchor_mlp_fmnist: the LibTorch anchor for Kiln's "c. mlp_fmnist" benchmark (BENCHMARKS.md).
// Siblings: anchor_cnn_fmnist.cpp and fmnist_anchor.h (data, loop, JSON line), CMakeLists.txt and
// README.md in benchmarks/anchors/; the Kiln counterpart is bench_mlp_fmnist;
// scripts/bench_compare.py runs the two side by side.
//
// Linear(784,512)-ReLU-Linear(512,256)-ReLU-Linear(256,10) on Fashion-MNIST flattened to 784,
// PyTorch's default init, SGD lr 0.05 momentum 0.9, batches of 128, 3 epochs (--epochs, --data DIR
// to change). Prints one JSON line:
//   {"bench":"mlp_fmnist","impl":"libtorch","device":"cpu","threads":2,"epochs":3,
//    "steps_per_epoch":469,"s_per_epoch":[...],"s_epoch_median":...,"loss_final":...,
//    "test_acc":...,"peak_rss_mib":...}
//
// LibTorch at its best: 2 intra-op threads (its default here would be 1), and the comparison script
// sets OMP_WAIT_POLICY=passive (without it this workload of small GEMMs is several times slower).

#include "fmnist_anchor.h"

int main(int argc, char** argv) {
  fmnist_anchor::Options options = fmnist_anchor::ParseArgs(argc, argv, /*default_epochs=*/3);
  torch::set_num_threads(fmnist_anchor::kThreads);
  torch::manual_seed(0);

  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(784, 512), torch::nn::ReLU(),
                              torch::nn::Linear(512, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 10));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return fmnist_anchor::Run("mlp_fmnist", model, optimizer, options);
}

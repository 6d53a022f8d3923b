// anchor_cnn_fmnist: the LibTorch anchor for Kiln's "d. cnn_fmnist" benchmark (BENCHMARKS.md).
// Siblings: anchor_mlp_fmnist.cpp and fmnist_anchor.h (data, loop, JSON line), CMakeLists.txt and
// README.md in benchmarks/anchors/; the Kiln counterpart is bench_cnn_fmnist;
// scripts/bench_compare.py runs the two side by side.
//
// Conv(1->32, 3x3, pad 1)-ReLU-MaxPool2 - Conv(32->64, 3x3, pad 1)-ReLU-MaxPool2 - Flatten(3136) -
// Linear(3136,128)-ReLU-Linear(128,10) on Fashion-MNIST [N,1,28,28], PyTorch's default init, Adam
// lr 1e-3 (0.9, 0.999) eps 1e-8, batches of 128, 1 epoch (--epochs, --data DIR to change).
// Prints one JSON line:
//   {"bench":"cnn_fmnist","impl":"libtorch","device":"cpu","threads":2,"epochs":1,
//    "steps_per_epoch":469,"s_per_epoch":[...],"s_epoch_median":...,"loss_final":...,
//    "test_acc":...,"peak_rss_mib":...}
//
// LibTorch at its best: 2 intra-op threads (its default here would be 1), and the comparison script
// sets OMP_WAIT_POLICY=passive.

#include "fmnist_anchor.h"

int main(int argc, char** argv) {
  fmnist_anchor::Options options = fmnist_anchor::ParseArgs(argc, argv, /*default_epochs=*/1);
  torch::set_num_threads(fmnist_anchor::kThreads);
  torch::manual_seed(0);

  namespace nn = torch::nn;
  nn::Sequential model(
      nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),  // 32x14x14
      nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),  // 64x7x7
      nn::Flatten(), nn::Linear(3136, 128), nn::ReLU(), nn::Linear(128, 10));
  torch::optim::Adam optimizer(
      model->parameters(),
      torch::optim::AdamOptions(1e-3).betas(std::make_tuple(0.9, 0.999)).eps(1e-8));
  return fmnist_anchor::Run("cnn_fmnist", model, optimizer, options);
}

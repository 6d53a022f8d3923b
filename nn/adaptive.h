// nn/adaptive.h: AdaptiveLogSoftmaxWithLoss (Grave et al., "Efficient softmax approximation for GPUs",
// 2017), as torch.nn's and LibTorch's: the frequent classes (below cutoffs[0]) in a head softmax with
// one more entry per cluster of rarer classes, and each cluster's classes in a smaller softmax of a
// projection of the input, so that a row pays for the head and the one cluster its target is in.
//
//   nn::AdaptiveLogSoftmaxWithLoss asm_(512, 50000, {2000, 10000}, {.div_value = 4.0});
//   auto [logprob, loss] = asm_.forward(hidden, targets);   // hidden (N, 512), targets (N)
//   Tensor classes = asm_.predict(hidden);                    // (N), the most likely class
#pragma once

#include <cstdint>
#include <vector>

#include "nn/container.h"
#include "nn/linear.h"

namespace kiln::nn {

struct AdaptiveLogSoftmaxWithLossOptions {
  double div_value = 4.0;  // cluster i's projection has in_features / div_value^(i+1) features
  bool head_bias = false;
};

// What forward returns: each row's log-probability of its target, and the mean of their negatives.
struct ASMoutput {
  Tensor output;
  Tensor loss;
};

// head: Linear(in_features, cutoffs[0] + clusters, bias = head_bias); tail: per cluster i a Sequential
// of Linear(in_features, in_features / div_value^(i+1)) and Linear(that, cluster size), without bias.
// cutoffs: unique, increasing, each in [1, n_classes - 1].
class AdaptiveLogSoftmaxWithLoss : public Module {
 public:
  AdaptiveLogSoftmaxWithLoss(int64_t in_features, int64_t n_classes, std::vector<int64_t> cutoffs,
                             AdaptiveLogSoftmaxWithLossOptions options = {});

  // input (N, in_features) and target (N) of class indices, or input (in_features) and a 0-d target.
  ASMoutput forward(const Tensor& input, const Tensor& target);
  Tensor forward(const Tensor& input) override;  // an Error: it takes the target too
  // The log-probability of every class: (N, n_classes), or (n_classes) for one input row.
  Tensor log_prob(const Tensor& input);
  // The most likely class of each row: int64 (N), or 0-d for one input row.
  Tensor predict(const Tensor& input);
  void reset_parameters();

  int64_t in_features, n_classes;
  std::vector<int64_t> cutoffs;  // the given ones, then n_classes
  int64_t shortlist_size, n_clusters, head_size;
  AdaptiveLogSoftmaxWithLossOptions options;
  Linear head;
  ModuleList tail;

 private:
  Tensor full_log_prob(const Tensor& input, const Tensor& head_output);
};

}  // namespace kiln::nn

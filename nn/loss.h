// nn/loss.h: the losses as modules, as torch.nn's (CrossEntropyLoss, MSELoss, ... TripletMarginLoss), and
// the distance modules CosineSimilarity and PairwiseDistance. Each keeps its functional form's options
// (nn/functional.h: PyTorch's names, keyword order and defaults) and calls it:
//   nn::CrossEntropyLoss criterion({.ignore_index = 0, .label_smoothing = 0.1});
//   Tensor loss = criterion(logits, labels);       // forward(logits, labels)
//   nn::TripletMarginLoss triplet({.margin = 0.5});
//   Tensor t = triplet(anchor, positive, negative);
// A weight given in the options is a buffer, as PyTorch's: "weight" (and BCEWithLogitsLoss's
// "pos_weight") moves with to() and is in state_dict(). The losses print as PyTorch's: "CrossEntropyLoss()".
#pragma once

#include "nn/functional.h"
#include "nn/module.h"

namespace kiln::nn {

// The base of the losses (PyTorch's _Loss): forward(input) alone is an Error that says how many tensors
// this loss takes.
class Loss : public Module {
 public:
  Tensor forward(const Tensor& input) override;

 protected:
  explicit Loss(int arity) : arity_(arity) {}
  // Registers `weight` as the buffer `name` when it is defined; returns it.
  Tensor weight_buffer(const std::string& name, const Tensor& weight);

 private:
  int arity_;  // how many tensors forward takes
};

// ---- input and target ----

class L1Loss : public Loss {
 public:
  explicit L1Loss(LossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  LossOptions options;
};

class MSELoss : public Loss {
 public:
  explicit MSELoss(LossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  LossOptions options;
};

class SmoothL1Loss : public Loss {
 public:
  explicit SmoothL1Loss(SmoothL1LossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  SmoothL1LossOptions options;
};

class HuberLoss : public Loss {
 public:
  explicit HuberLoss(HuberLossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  HuberLossOptions options;
};

class SoftMarginLoss : public Loss {
 public:
  explicit SoftMarginLoss(LossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  LossOptions options;
};

class KLDivLoss : public Loss {
 public:
  explicit KLDivLoss(KLDivLossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  KLDivLossOptions options;
};

class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  CrossEntropyOptions options;  // options.weight is the buffer "weight"
};

class NLLLoss : public Loss {
 public:
  explicit NLLLoss(NLLLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  NLLLossOptions options;  // options.weight is the buffer "weight"
};

class BCELoss : public Loss {
 public:
  explicit BCELoss(BCELossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  BCELossOptions options;  // options.weight is the buffer "weight"
};

class BCEWithLogitsLoss : public Loss {
 public:
  explicit BCEWithLogitsLoss(BCEWithLogitsLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  BCEWithLogitsLossOptions options;  // the buffers "weight" and "pos_weight"
};

class MultiLabelSoftMarginLoss : public Loss {
 public:
  explicit MultiLabelSoftMarginLoss(MultiLabelSoftMarginLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  MultiLabelSoftMarginLossOptions options;  // options.weight is the buffer "weight"
};

class MultiLabelMarginLoss : public Loss {
 public:
  explicit MultiLabelMarginLoss(LossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  LossOptions options;
};

class MultiMarginLoss : public Loss {
 public:
  explicit MultiMarginLoss(MultiMarginLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  MultiMarginLossOptions options;  // options.weight is the buffer "weight"
};

class HingeEmbeddingLoss : public Loss {
 public:
  explicit HingeEmbeddingLoss(HingeEmbeddingLossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  HingeEmbeddingLossOptions options;
};

class PoissonNLLLoss : public Loss {
 public:
  explicit PoissonNLLLoss(PoissonNLLLossOptions options = {}) : Loss(2), options(std::move(options)) {}
  Tensor forward(const Tensor& log_input, const Tensor& target);
  Tensor operator()(const Tensor& log_input, const Tensor& target) { return forward(log_input, target); }
  PoissonNLLLossOptions options;
};

// ---- three tensors ----

class MarginRankingLoss : public Loss {
 public:
  explicit MarginRankingLoss(MarginRankingLossOptions options = {}) : Loss(3), options(std::move(options)) {}
  Tensor forward(const Tensor& input1, const Tensor& input2, const Tensor& target);
  Tensor operator()(const Tensor& input1, const Tensor& input2, const Tensor& target) {
    return forward(input1, input2, target);
  }
  MarginRankingLossOptions options;
};

class CosineEmbeddingLoss : public Loss {
 public:
  explicit CosineEmbeddingLoss(CosineEmbeddingLossOptions options = {}) : Loss(3), options(std::move(options)) {}
  Tensor forward(const Tensor& input1, const Tensor& input2, const Tensor& target);
  Tensor operator()(const Tensor& input1, const Tensor& input2, const Tensor& target) {
    return forward(input1, input2, target);
  }
  CosineEmbeddingLossOptions options;
};

class TripletMarginLoss : public Loss {
 public:
  explicit TripletMarginLoss(TripletMarginLossOptions options = {}) : Loss(3), options(std::move(options)) {}
  Tensor forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative);
  Tensor operator()(const Tensor& anchor, const Tensor& positive, const Tensor& negative) {
    return forward(anchor, positive, negative);
  }
  TripletMarginLossOptions options;
};

class TripletMarginWithDistanceLoss : public Loss {
 public:
  explicit TripletMarginWithDistanceLoss(TripletMarginWithDistanceLossOptions options = {})
      : Loss(3), options(std::move(options)) {}
  Tensor forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative);
  Tensor operator()(const Tensor& anchor, const Tensor& positive, const Tensor& negative) {
    return forward(anchor, positive, negative);
  }
  TripletMarginWithDistanceLossOptions options;
};

class GaussianNLLLoss : public Loss {
 public:
  explicit GaussianNLLLoss(GaussianNLLLossOptions options = {}) : Loss(3), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target, const Tensor& var);
  Tensor operator()(const Tensor& input, const Tensor& target, const Tensor& var) {
    return forward(input, target, var);
  }
  GaussianNLLLossOptions options;
};

// ---- four tensors ----

class CTCLoss : public Loss {
 public:
  explicit CTCLoss(CTCLossOptions options = {}) : Loss(4), options(std::move(options)) {}
  Tensor forward(const Tensor& log_probs, const Tensor& targets, const Tensor& input_lengths,
                 const Tensor& target_lengths);
  Tensor operator()(const Tensor& log_probs, const Tensor& targets, const Tensor& input_lengths,
                    const Tensor& target_lengths) {
    return forward(log_probs, targets, input_lengths, target_lengths);
  }
  CTCLossOptions options;
};

// ---- distances ----

class CosineSimilarity : public Module {
 public:
  explicit CosineSimilarity(CosineSimilarityOptions options = {}) : options(options) {}
  Tensor forward(const Tensor& input) override;  // an Error: it takes two inputs
  Tensor forward(const Tensor& x1, const Tensor& x2) { return cosine_similarity(x1, x2, options); }
  Tensor operator()(const Tensor& x1, const Tensor& x2) { return forward(x1, x2); }
  CosineSimilarityOptions options;
};

class PairwiseDistance : public Module {
 public:
  explicit PairwiseDistance(PairwiseDistanceOptions options = {}) : options(options) {}
  Tensor forward(const Tensor& input) override;  // an Error: it takes two inputs
  Tensor forward(const Tensor& x1, const Tensor& x2) { return pairwise_distance(x1, x2, options); }
  Tensor operator()(const Tensor& x1, const Tensor& x2) { return forward(x1, x2); }
  PairwiseDistanceOptions options;
};

}  // namespace kiln::nn

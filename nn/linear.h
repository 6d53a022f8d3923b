// nn/linear.h: Linear, Bilinear, Embedding, EmbeddingBag, Flatten, Unflatten and Identity. Their functional
// forms are in nn/functional.h.
#pragma once

#include <optional>
#include <string>

#include "nn/module.h"

namespace kiln::nn {

struct LinearOptions {
  bool bias = true;
};

// y = x W^T + b. weight (out_features, in_features) ~ kaiming_uniform_(a = sqrt(5)), i.e.
// U(+-1/sqrt(in_features)); bias (out_features) ~ U(+-1/sqrt(in_features)), as PyTorch.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  void reset_parameters();

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features), undefined without bias
};

struct BilinearOptions {
  bool bias = true;
};

// y = x1^T W x2 + b per output feature (nn::functional::bilinear): forward(input1, input2) with input1
// (*, in1_features) and input2 (*, in2_features). weight (out_features, in1_features, in2_features) and
// bias (out_features) ~ U(+-1/sqrt(in1_features)), as PyTorch.
class Bilinear : public Module {
 public:
  Bilinear(int64_t in1_features, int64_t in2_features, int64_t out_features, BilinearOptions options = {});
  Tensor forward(const Tensor& input) override;  // an Error: it takes two inputs
  Tensor forward(const Tensor& input1, const Tensor& input2);
  std::string extra_repr() const override;
  void reset_parameters();

  int64_t in1_features, in2_features, out_features;
  Tensor weight;  // (out_features, in1_features, in2_features)
  Tensor bias;    // (out_features), undefined without bias
};

// As torch.nn.Embedding's keyword arguments (see nn::functional::EmbeddingFuncOptions).
struct EmbeddingOptions {
  std::optional<int64_t> padding_idx = {};  // that row starts at zero and receives no gradient
  std::optional<double> max_norm = {};      // referenced rows above this norm are scaled to it, in place
  double norm_type = 2;
  bool scale_grad_by_freq = false;
};

// A lookup table: indices (any shape, int64/int32) -> (*indices, embedding_dim). weight ~ N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  // PyTorch's Embedding.from_pretrained: the weight shares embeddings' storage (2-D, floating; as
  // PyTorch's Parameter(embeddings)) and is frozen (requires_grad false) unless freeze is false. The
  // padding row keeps its values.
  static std::shared_ptr<Embedding> from_pretrained(const Tensor& embeddings, bool freeze = true,
                                                    EmbeddingOptions options = {});
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // normalised to [0, num_embeddings)
  std::optional<double> max_norm;
  double norm_type;
  bool scale_grad_by_freq;
  Tensor weight;  // (num_embeddings, embedding_dim)

 private:
  Embedding(const Tensor& pretrained, bool freeze, const EmbeddingOptions& options);
  void set_options(const EmbeddingOptions& options);
};

// As torch.nn.EmbeddingBag's keyword arguments (see nn::functional::EmbeddingBagFuncOptions); sparse
// gradients are not offered.
struct EmbeddingBagOptions {
  std::optional<double> max_norm = {};
  double norm_type = 2;
  bool scale_grad_by_freq = false;
  std::string mode = "mean";  // "sum", "mean" or "max"
  bool include_last_offset = false;
  std::optional<int64_t> padding_idx = {};
};

// Bags of indices -> (bags, embedding_dim): the sum, mean or max of each bag's embeddings (for bags of
// any length, without padding them to the longest: nn::functional::embedding_bag). weight ~ N(0, 1), the
// padding row zero, as PyTorch. forward(input (B, L)), or forward(input (n), offsets (B)).
class EmbeddingBag : public Module {
 public:
  EmbeddingBag(int64_t num_embeddings, int64_t embedding_dim, EmbeddingBagOptions options = {});
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  Tensor forward(const Tensor& input, const Tensor& offsets, const Tensor& per_sample_weights = {});
  using Module::operator();  // bag(input): through the hooks
  Tensor operator()(const Tensor& input, const Tensor& offsets, const Tensor& per_sample_weights = {}) {
    return forward(input, offsets, per_sample_weights);
  }
  std::string extra_repr() const override;

  int64_t num_embeddings, embedding_dim;
  EmbeddingBagOptions options;  // padding_idx normalised to [0, num_embeddings)
  Tensor weight;                // (num_embeddings, embedding_dim)
};

struct FlattenOptions {
  int64_t start_dim = 1;
  int64_t end_dim = -1;
};
class Flatten : public Module {
 public:
  explicit Flatten(FlattenOptions options = {}) : options(options) {}
  Flatten(int64_t start_dim, int64_t end_dim = -1) : options{start_dim, end_dim} {}
  Tensor forward(const Tensor& input) override { return input.flatten(options.start_dim, options.end_dim); }
  std::string extra_repr() const override;

  FlattenOptions options;
};

// input.unflatten(dim, unflattened_size): dim split into unflattened_size (one entry may be -1), as
// torch.nn.Unflatten.
class Unflatten : public Module {
 public:
  Unflatten(int64_t dim, Shape unflattened_size) : dim(dim), unflattened_size(unflattened_size) {}
  Tensor forward(const Tensor& input) override { return input.unflatten(dim, unflattened_size); }
  std::string extra_repr() const override;

  int64_t dim;
  Shape unflattened_size;
};

class Identity : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input; }
};

// Python's repr of a float ("1e-05", "0.1", "1.0"), for extra_repr().
std::string py_float(double value);

}  // namespace kiln::nn

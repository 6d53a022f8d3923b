// nn/linear.cpp: see nn/linear.h.
#include "nn/linear.h"

#include <fmt/format.h>

#include <cmath>

#include "core/grad_mode.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace kiln::nn {

std::string py_float(double value) {
  std::string s = fmt::format("{}", value);
  if (s.find_first_of(".einas") == std::string::npos) s += ".0";  // 1 -> 1.0; inf, nan, 1e-05 stay
  return s;
}

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : in_features(in_features), out_features(out_features) {
  KILN_CHECK(in_features >= 0 && out_features >= 0, "nn::Linear: features must be >= 0, got ({}, {})",
             in_features, out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (options.bias) bias = register_parameter("bias", empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    double bound = in_features > 0 ? 1 / std::sqrt(static_cast<double>(in_features)) : 0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) { return linear(input, weight, bias); }

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features,
                     bias.defined() ? "True" : "False");
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options)
    : num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  KILN_CHECK(num_embeddings >= 0 && embedding_dim >= 0,
             "nn::Embedding: num_embeddings ({}) and embedding_dim ({}) must be non-negative", num_embeddings,
             embedding_dim);
  set_options(options);
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  init::normal_(weight);
  if (padding_idx) {
    NoGradGuard no_grad;
    weight[*padding_idx].zero_();
  }
}

Embedding::Embedding(const Tensor& pretrained, bool freeze, const EmbeddingOptions& options)
    : num_embeddings(pretrained.size(0)), embedding_dim(pretrained.size(1)) {
  set_options(options);
  weight = register_parameter("weight", pretrained.detach(), !freeze);
}

std::shared_ptr<Embedding> Embedding::from_pretrained(const Tensor& embeddings, bool freeze,
                                                      EmbeddingOptions options) {
  KILN_CHECK(embeddings.defined() && embeddings.dim() == 2 && embeddings.is_floating_point(),
             "nn::Embedding::from_pretrained: embeddings must be a 2-D floating tensor (num_embeddings, "
             "embedding_dim), got {}",
             embeddings.defined() ? fmt::format("{} of shape {}", dtype_name(embeddings.dtype()),
                                                embeddings.sizes().str())
                                  : std::string("an undefined tensor"));
  return std::shared_ptr<Embedding>(new Embedding(embeddings, freeze, options));
}

void Embedding::set_options(const EmbeddingOptions& options) {
  padding_idx = options.padding_idx;
  if (padding_idx) {
    KILN_CHECK(*padding_idx < num_embeddings && *padding_idx >= -num_embeddings,
               "nn::Embedding: padding_idx {} must be within [-{}, {})", *padding_idx, num_embeddings,
               num_embeddings);
    if (*padding_idx < 0) *padding_idx += num_embeddings;
  }
  max_norm = options.max_norm;
  KILN_CHECK(!max_norm || *max_norm >= 0, "nn::Embedding: max_norm must be non-negative, got {}",
             max_norm.value_or(0));
  norm_type = options.norm_type;
  KILN_CHECK(norm_type > 0, "nn::Embedding: norm_type must be positive, got {}", norm_type);
  scale_grad_by_freq = options.scale_grad_by_freq;
}

Tensor Embedding::forward(const Tensor& indices) {
  return embedding(indices, weight,
                   EmbeddingFuncOptions{.padding_idx = padding_idx, .max_norm = max_norm, .norm_type = norm_type,
                                        .scale_grad_by_freq = scale_grad_by_freq});
}

// As PyTorch's: the options that differ from their defaults.
std::string Embedding::extra_repr() const {
  std::string s = fmt::format("{}, {}", num_embeddings, embedding_dim);
  if (padding_idx) s += fmt::format(", padding_idx={}", *padding_idx);
  if (max_norm) s += ", max_norm=" + py_float(*max_norm);
  if (norm_type != 2) s += ", norm_type=" + py_float(norm_type);
  if (scale_grad_by_freq) s += ", scale_grad_by_freq=True";
  return s;
}

std::string Flatten::extra_repr() const {
  return fmt::format("start_dim={}, end_dim={}", options.start_dim, options.end_dim);
}

}  // namespace kiln::nn

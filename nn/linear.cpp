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

inline namespace functional {

// One matmul of input1 with the weight's (in1, out * in2) view, then a product with input2 summed
// over in2: no (*, in1, in2) outer product is formed.
Tensor bilinear(const Tensor& input1, const Tensor& input2, const Tensor& weight, const Tensor& bias) {
  KILN_CHECK(weight.dim() == 3, "bilinear: the weight must be 3-D (out_features, in1_features, in2_features), got "
             "shape {}", weight.sizes().str());
  KILN_CHECK(input1.dim() >= 1 && input1.dim() == input2.dim(),
             "bilinear: input1 {} and input2 {} must have the same number of dims (at least 1)", input1.sizes().str(),
             input2.sizes().str());
  for (int d = 0; d + 1 < input1.dim(); ++d) {
    KILN_CHECK(input1.size(d) == input2.size(d),
               "bilinear: the inputs' leading (batch) dims must match: input1 {} and input2 {} differ in dim {}",
               input1.sizes().str(), input2.sizes().str(), d);
  }
  const int64_t out = weight.size(0), in1 = weight.size(1), in2 = weight.size(2);
  KILN_CHECK(input1.size(-1) == in1, "bilinear: input1's last dim is {} but the weight {} expects in1_features = {}",
             input1.size(-1), weight.sizes().str(), in1);
  KILN_CHECK(input2.size(-1) == in2, "bilinear: input2's last dim is {} but the weight {} expects in2_features = {}",
             input2.size(-1), weight.sizes().str(), in2);
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out),
             "bilinear: the bias must be 1-D of out_features = {} elements, got shape {}", out, bias.sizes().str());
  Shape lead = input1.sizes();
  lead.resize(input1.dim() - 1);
  Shape mixed = lead;  // (*, out, in2)
  mixed.push_back(out);
  mixed.push_back(in2);
  Tensor y = (matmul(input1, weight.permute({1, 0, 2}).reshape({in1, out * in2})).view(mixed) * input2.unsqueeze(-2))
                 .sum({-1});
  return bias.defined() ? y + bias : y;
}

}  // namespace functional

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

Bilinear::Bilinear(int64_t in1_features, int64_t in2_features, int64_t out_features, BilinearOptions options)
    : in1_features(in1_features), in2_features(in2_features), out_features(out_features) {
  KILN_CHECK(in1_features >= 0 && in2_features >= 0 && out_features >= 0,
             "nn::Bilinear: features must be >= 0, got ({}, {}, {})", in1_features, in2_features, out_features);
  weight = register_parameter("weight", empty({out_features, in1_features, in2_features}));
  if (options.bias) bias = register_parameter("bias", empty({out_features}));
  reset_parameters();
}

void Bilinear::reset_parameters() {  // U(+-1/sqrt(in1_features)) for both, as PyTorch
  const double bound = in1_features > 0 ? 1 / std::sqrt(static_cast<double>(in1_features)) : 0;
  init::uniform_(weight, -bound, bound);
  if (bias.defined()) init::uniform_(bias, -bound, bound);
}

Tensor Bilinear::forward(const Tensor&) {
  KILN_FAIL("nn::Bilinear: forward takes two inputs: call forward(input1, input2)");
}

Tensor Bilinear::forward(const Tensor& input1, const Tensor& input2) { return bilinear(input1, input2, weight, bias); }

std::string Bilinear::extra_repr() const {
  return fmt::format("in1_features={}, in2_features={}, out_features={}, bias={}", in1_features, in2_features,
                     out_features, bias.defined() ? "True" : "False");
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

EmbeddingBag::EmbeddingBag(int64_t num_embeddings, int64_t embedding_dim, EmbeddingBagOptions options)
    : num_embeddings(num_embeddings), embedding_dim(embedding_dim), options(std::move(options)) {
  KILN_CHECK(num_embeddings >= 0 && embedding_dim >= 0,
             "nn::EmbeddingBag: num_embeddings ({}) and embedding_dim ({}) must be non-negative", num_embeddings,
             embedding_dim);
  const std::string& mode = this->options.mode;
  KILN_CHECK(mode == "sum" || mode == "mean" || mode == "max",
             "nn::EmbeddingBag: mode '{}' is not one of 'sum', 'mean', 'max'", mode);
  std::optional<int64_t>& padding_idx = this->options.padding_idx;
  if (padding_idx) {
    KILN_CHECK(*padding_idx < num_embeddings && *padding_idx >= -num_embeddings,
               "nn::EmbeddingBag: padding_idx {} must be within [-{}, {})", *padding_idx, num_embeddings,
               num_embeddings);
    if (*padding_idx < 0) *padding_idx += num_embeddings;
  }
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  init::normal_(weight);
  if (padding_idx) {
    NoGradGuard no_grad;
    weight[*padding_idx].zero_();
  }
}

Tensor EmbeddingBag::forward(const Tensor& input, const Tensor& offsets, const Tensor& per_sample_weights) {
  return embedding_bag(input, weight,
                       EmbeddingBagFuncOptions{.offsets = offsets,
                                               .max_norm = options.max_norm,
                                               .norm_type = options.norm_type,
                                               .scale_grad_by_freq = options.scale_grad_by_freq,
                                               .mode = options.mode,
                                               .per_sample_weights = per_sample_weights,
                                               .include_last_offset = options.include_last_offset,
                                               .padding_idx = options.padding_idx});
}

// As PyTorch's: the options that differ from their defaults, and the mode always.
std::string EmbeddingBag::extra_repr() const {
  std::string s = fmt::format("{}, {}", num_embeddings, embedding_dim);
  if (options.max_norm) s += ", max_norm=" + py_float(*options.max_norm);
  if (options.norm_type != 2) s += ", norm_type=" + py_float(options.norm_type);
  if (options.scale_grad_by_freq) s += ", scale_grad_by_freq=True";
  s += ", mode=" + options.mode;
  if (options.padding_idx) s += fmt::format(", padding_idx={}", *options.padding_idx);
  return s;
}

std::string Unflatten::extra_repr() const {
  std::string sizes;
  for (int i = 0; i < unflattened_size.size(); ++i) sizes += (i ? ", " : "") + std::to_string(unflattened_size[i]);
  return fmt::format("dim={}, unflattened_size=({}{})", dim, sizes, unflattened_size.size() == 1 ? "," : "");
}

std::string Flatten::extra_repr() const {
  return fmt::format("start_dim={}, end_dim={}", options.start_dim, options.end_dim);
}

}  // namespace kiln::nn

// nn/adaptive.cpp: see nn/adaptive.h. Which rows go to which cluster is decided on the host from the
// targets (PyTorch's nonzero does the same); the rest is ops, so autograd gives the gradients.
#include "nn/adaptive.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "ops/ops.h"

namespace kiln::nn {

namespace {

std::vector<int64_t> checked_cutoffs(std::vector<int64_t> cutoffs, int64_t n_classes) {
  KILN_CHECK(!cutoffs.empty(), "nn::AdaptiveLogSoftmaxWithLoss: cutoffs is empty; give at least one");
  const bool sorted = std::is_sorted(cutoffs.begin(), cutoffs.end());
  const bool unique = std::set<int64_t>(cutoffs.begin(), cutoffs.end()).size() == cutoffs.size();
  KILN_CHECK(sorted && unique && cutoffs.front() > 0 && cutoffs.back() <= n_classes - 1,
             "nn::AdaptiveLogSoftmaxWithLoss: cutoffs should be a sequence of unique, positive integers sorted in an "
             "increasing order, where each value is between 1 and n_classes-1 ({})",
             n_classes - 1);
  cutoffs.push_back(n_classes);
  return cutoffs;
}

Tensor index_tensor(const std::vector<int64_t>& values, Device device) {
  return from_vector(values, Shape{static_cast<int64_t>(values.size())}, device);
}

}  // namespace

AdaptiveLogSoftmaxWithLoss::AdaptiveLogSoftmaxWithLoss(int64_t in_features, int64_t n_classes,
                                                       std::vector<int64_t> cutoffs_,
                                                       AdaptiveLogSoftmaxWithLossOptions options)
    : in_features(in_features),
      n_classes(n_classes),
      cutoffs(checked_cutoffs(std::move(cutoffs_), n_classes)),
      shortlist_size(cutoffs.front()),
      n_clusters(static_cast<int64_t>(cutoffs.size()) - 1),
      head_size(shortlist_size + n_clusters),
      options(options),
      head(in_features, head_size, {.bias = options.head_bias}) {
  KILN_CHECK(options.div_value > 0, "nn::AdaptiveLogSoftmaxWithLoss: div_value must be positive, not {}",
             options.div_value);
  for (int64_t i = 0; i < n_clusters; ++i) {
    // PyTorch's int(in_features // div_value ** (i + 1)): a floor of the float quotient.
    const auto hidden = static_cast<int64_t>(
        std::floor(static_cast<double>(in_features) / std::pow(options.div_value, static_cast<double>(i + 1))));
    const int64_t size = cutoffs[i + 1] - cutoffs[i];
    tail.push_back(Sequential(Linear(in_features, hidden, {.bias = false}), Linear(hidden, size, {.bias = false})));
  }
  register_modules({{"head", head}, {"tail", tail}});
}

void AdaptiveLogSoftmaxWithLoss::reset_parameters() {
  head.reset_parameters();
  for (size_t i = 0; i < tail.size(); ++i) {
    auto& projection = tail.at<Sequential>(i);
    projection.at<Linear>(0).reset_parameters();
    projection.at<Linear>(1).reset_parameters();
  }
}

Tensor AdaptiveLogSoftmaxWithLoss::forward(const Tensor& input) {
  KILN_FAIL(
      "nn::AdaptiveLogSoftmaxWithLoss: forward takes the input and the target (forward(input, target)); "
      "log_prob(input) gives every class's log-probability");
}

ASMoutput AdaptiveLogSoftmaxWithLoss::forward(const Tensor& input_, const Tensor& target_) {
  const char* who = "nn::AdaptiveLogSoftmaxWithLoss";
  KILN_CHECK(input_.defined() && target_.defined(), "{}: the input and the target must be defined tensors", who);
  KILN_CHECK(target_.dim() <= 1, "{}: 0D or 1D target tensor expected, multi-target not supported (got {}-d)", who,
             target_.dim());
  if (target_.dim() == 1) {
    KILN_CHECK(input_.dim() == 2 && input_.size(0) == target_.size(0),
               "{}: 1D target tensor expects 2D input tensors with as many rows, but found input {} and target {}", who,
               input_.sizes().str(), target_.sizes().str());
  } else {
    KILN_CHECK(input_.dim() == 1, "{}: 0D target tensor expects 1D input tensors, but found input {}", who,
               input_.sizes().str());
  }
  KILN_CHECK(!is_floating(target_.dtype()) && target_.dtype() != kBool,
             "{}: the target must hold class indices (an integer tensor), not {}", who, dtype_name(target_.dtype()));
  KILN_CHECK(input_.size(-1) == in_features, "{}: the input has {} features, the module {}", who, input_.size(-1),
             in_features);
  const bool batched = target_.dim() == 1;
  const Tensor input = batched ? input_ : input_.unsqueeze(0);
  const std::vector<int64_t> targets = target_.to_vector<int64_t>();
  const auto [lo, hi] = std::minmax_element(targets.begin(), targets.end());
  KILN_CHECK(targets.empty() || (*lo >= 0 && *hi < n_classes),
             "{}: Target values should be in [0, {}], but values in range [{}, {}] were found", who, n_classes - 1,
             targets.empty() ? 0 : *lo, targets.empty() ? 0 : *hi);

  // The head's entry for each row: its class in the shortlist, else its cluster's.
  std::vector<int64_t> head_index(targets.size());
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(n_clusters)), within(static_cast<size_t>(n_clusters));
  for (size_t r = 0; r < targets.size(); ++r) {
    const int64_t t = targets[r];
    if (t < shortlist_size) {
      head_index[r] = t;
      continue;
    }
    const auto c = static_cast<size_t>(std::upper_bound(cutoffs.begin(), cutoffs.end(), t) - cutoffs.begin() - 1);
    head_index[r] = shortlist_size + static_cast<int64_t>(c);
    rows[c].push_back(static_cast<int64_t>(r));
    within[c].push_back(t - cutoffs[c]);
  }
  const Device device = input.device();
  const Tensor head_logprob = log_softmax(head(input), 1);
  Tensor output = head_logprob.gather(1, index_tensor(head_index, device).unsqueeze(1)).squeeze(1);
  for (size_t c = 0; c < rows.size(); ++c) {
    if (rows[c].empty()) continue;
    const Tensor picked = index_tensor(rows[c], device);
    const Tensor cluster_logprob = log_softmax(tail[c](input.index_select(0, picked)), 1);
    const Tensor local = cluster_logprob.gather(1, index_tensor(within[c], device).unsqueeze(1)).squeeze(1);
    output = index_add(output, 0, picked, local);
  }
  const Tensor loss = (-output).mean();
  return {batched ? output : output.squeeze(0), loss};
}

Tensor AdaptiveLogSoftmaxWithLoss::full_log_prob(const Tensor& input, const Tensor& head_output) {
  const Tensor head_logprob = log_softmax(head_output, 1);
  std::vector<Tensor> parts = {head_logprob.narrow(1, 0, shortlist_size)};
  for (int64_t i = 0; i < n_clusters; ++i) {
    const Tensor cluster_logprob = log_softmax(tail[static_cast<size_t>(i)](input), 1);
    parts.push_back(cluster_logprob + head_logprob.narrow(1, shortlist_size + i, 1));
  }
  return cat(parts, 1);
}

Tensor AdaptiveLogSoftmaxWithLoss::log_prob(const Tensor& input) {
  KILN_CHECK(input.defined() && (input.dim() == 1 || input.dim() == 2) && input.size(-1) == in_features,
             "nn::AdaptiveLogSoftmaxWithLoss::log_prob: the input must be (N, {}) or ({}), not {}", in_features,
             in_features, input.defined() ? input.sizes().str() : std::string("undefined"));
  const Tensor x = input.dim() == 2 ? input : input.unsqueeze(0);
  const Tensor out = full_log_prob(x, head(x));
  return input.dim() == 2 ? out : out.squeeze(0);
}

Tensor AdaptiveLogSoftmaxWithLoss::predict(const Tensor& input) {
  KILN_CHECK(input.defined() && (input.dim() == 1 || input.dim() == 2) && input.size(-1) == in_features,
             "nn::AdaptiveLogSoftmaxWithLoss::predict: the input must be (N, {}) or ({}), not {}", in_features,
             in_features, input.defined() ? input.sizes().str() : std::string("undefined"));
  const Tensor x = input.dim() == 2 ? input : input.unsqueeze(0);
  const Tensor head_output = head(x);
  std::vector<int64_t> classes = head_output.argmax(1).to_vector<int64_t>();
  // Rows whose best head entry is a cluster: their class comes from the full distribution.
  std::vector<int64_t> rare;
  for (size_t r = 0; r < classes.size(); ++r) {
    if (classes[r] >= shortlist_size) rare.push_back(static_cast<int64_t>(r));
  }
  if (!rare.empty()) {
    const Tensor picked = index_tensor(rare, x.device());
    const std::vector<int64_t> best =
        full_log_prob(x.index_select(0, picked), head_output.index_select(0, picked)).argmax(1).to_vector<int64_t>();
    for (size_t k = 0; k < rare.size(); ++k) classes[static_cast<size_t>(rare[k])] = best[k];
  }
  const Tensor out = index_tensor(classes, x.device());
  return input.dim() == 2 ? out : out.squeeze(0);
}

}  // namespace kiln::nn

// tests/nn/test_margin_losses.cpp: the margin, embedding and likelihood losses and the distances
// (soft_margin ... gaussian_nll, normalize, cosine_similarity, pairwise_distance) against PyTorch 1.13
// (value and every input gradient PyTorch has, float64), gradcheck, their Errors, and the loss modules
// of nn/loss.h (buffers, printing, the functional form they call).
#include <cmath>

#include "nn_golden.h"

using namespace kiln;
using autograd::TensorList;
using test::check_loss;

TEST_CASE("The margin, embedding and likelihood losses match torch for every reduction", "[nn][losses]") {
  for (std::string red : {"mean", "sum", "none"}) {
    INFO("reduction " << red);
    check_loss("soft_margin_" + red, [&](auto& in) { return nn::soft_margin_loss(in[0], in[1], {.reduction = red}); });
    check_loss("margin_ranking_" + red, [&](auto& in) {
      return nn::margin_ranking_loss(in[0], in[1], in[2], {.margin = 0.3, .reduction = red});
    });
    check_loss("hinge_embedding_" + red, [&](auto& in) {
      return nn::hinge_embedding_loss(in[0], in[1], {.margin = 0.8, .reduction = red});
    });
    check_loss("cosine_embedding_" + red, [&](auto& in) {
      return nn::cosine_embedding_loss(in[0], in[1], in[2], {.margin = 0.2, .reduction = red});
    });
    check_loss("multilabel_soft_margin_" + red, [&](auto& in) {
      return nn::multilabel_soft_margin_loss(in[0], in[1], {.weight = in[2], .reduction = red});
    });
    check_loss("multilabel_margin_" + red,
               [&](auto& in) { return nn::multilabel_margin_loss(in[0], in[1], {.reduction = red}); });
    check_loss("multi_margin_" + red,
               [&](auto& in) { return nn::multi_margin_loss(in[0], in[1], {.margin = 0.7, .reduction = red}); });
    check_loss("triplet_margin_" + red,
               [&](auto& in) { return nn::triplet_margin_loss(in[0], in[1], in[2], {.reduction = red}); });
    check_loss("poisson_nll_" + red, [&](auto& in) { return nn::poisson_nll_loss(in[0], in[1], {.reduction = red}); });
    check_loss("gaussian_nll_" + red,
               [&](auto& in) { return nn::gaussian_nll_loss(in[0], in[1], in[2], {.reduction = red}); });
  }
}

TEST_CASE("The margin, embedding and likelihood losses match torch for their shapes and options", "[nn][losses]") {
  check_loss("margin_ranking_broadcast", [](auto& in) {
    return nn::margin_ranking_loss(in[0], in[1], in[2], {.margin = 0.1, .reduction = "none"});
  });
  check_loss("cosine_embedding_1d", [](auto& in) {
    return nn::cosine_embedding_loss(in[0], in[1], in[2], {.margin = -0.5, .reduction = "none"});
  });
  check_loss("multilabel_soft_margin_1d",
             [](auto& in) { return nn::multilabel_soft_margin_loss(in[0], in[1], {.reduction = "none"}); });
  check_loss("multilabel_margin_1d",
             [](auto& in) { return nn::multilabel_margin_loss(in[0], in[1], {.reduction = "none"}); });
  check_loss("multi_margin_p2_weight", [](auto& in) {
    return nn::multi_margin_loss(in[0], in[1], {.p = 2, .margin = 1.5, .weight = in[2]});
  });
  check_loss("multi_margin_1d", [](auto& in) { return nn::multi_margin_loss(in[0], in[1], {.reduction = "none"}); });
  check_loss("triplet_margin_p1_swap", [](auto& in) {
    return nn::triplet_margin_loss(in[0], in[1], in[2], {.margin = 2, .p = 1, .swap = true, .reduction = "none"});
  });
  check_loss("triplet_margin_1d", [](auto& in) {
    return nn::triplet_margin_loss(in[0], in[1], in[2], {.margin = 3, .p = 3, .eps = 1e-3});
  });
  check_loss("triplet_distance_cosine_swap", [](auto& in) {
    return nn::triplet_margin_with_distance_loss(
        in[0], in[1], in[2],
        {.distance_function = [](const Tensor& x, const Tensor& y) { return 1.0 - nn::cosine_similarity(x, y); },
         .margin = 0.5,
         .swap = true,
         .reduction = "none"});
  });
  check_loss("triplet_distance_default",
             [](auto& in) { return nn::triplet_margin_with_distance_loss(in[0], in[1], in[2], {.margin = 3}); });
  check_loss("poisson_nll_full_rates", [](auto& in) {
    return nn::poisson_nll_loss(in[0], in[1], {.log_input = false, .full = true, .eps = 1e-6, .reduction = "none"});
  });
  check_loss("poisson_nll_full_log", [](auto& in) { return nn::poisson_nll_loss(in[0], in[1], {.full = true}); });
  check_loss("gaussian_nll_row_var_full", [](auto& in) {
    return nn::gaussian_nll_loss(in[0], in[1], in[2], {.full = true, .reduction = "none"});
  });
  check_loss("gaussian_nll_column_var_clamped", [](auto& in) {
    return nn::gaussian_nll_loss(in[0], in[1], in[2], {.eps = 1e-4, .reduction = "sum"});
  });
  check_loss("gaussian_nll_1d_scalar_var", [](auto& in) { return nn::gaussian_nll_loss(in[0], in[1], in[2]); });
}

TEST_CASE("normalize, cosine_similarity and pairwise_distance match torch", "[nn][losses]") {
  check_loss("cosine_similarity", [](auto& in) { return nn::cosine_similarity(in[0], in[1]); });
  check_loss("cosine_similarity_broadcast",
             [](auto& in) { return nn::cosine_similarity(in[0], in[1], {.dim = -2, .eps = 1e-6}); });
  // A zero row and a row of norm below eps: PyTorch 1.13's value and its gradient through the clamped
  // norm (Note [cosine similarity's clamped norm]).
  check_loss("cosine_similarity_clamped", [](auto& in) { return nn::cosine_similarity(in[0], in[1]); });
  check_loss("pairwise_distance", [](auto& in) { return nn::pairwise_distance(in[0], in[1]); });
  check_loss("pairwise_distance_p1_keepdim",
             [](auto& in) { return nn::pairwise_distance(in[0], in[1], {.p = 1, .eps = 0, .keepdim = true}); });
  check_loss("pairwise_distance_p3_broadcast", [](auto& in) { return nn::pairwise_distance(in[0], in[1], {.p = 3}); });
  check_loss("pairwise_distance_inf",
             [](auto& in) { return nn::pairwise_distance(in[0], in[1], {.p = INFINITY}); });
  check_loss("normalize", [](auto& in) { return nn::normalize(in[0]); });
  check_loss("normalize_p1_last", [](auto& in) { return nn::normalize(in[0], {.p = 1, .dim = -1, .eps = 1e-3}); });
}

TEST_CASE("The margin and likelihood losses pass gradcheck and gradgradcheck in float64", "[nn][losses][gradcheck]") {
  Tensor a = test::sample({3, 4}, kFloat64, 0.3).requires_grad_();
  Tensor b = test::sample({3, 4}, kFloat64, 1.3).requires_grad_();
  Tensor c = test::sample({3, 4}, kFloat64, 2.1).requires_grad_();
  Tensor signs = from_vector<double>({1, -1, -1}, {3});
  const std::vector<std::pair<std::string, std::function<TensorList(const TensorList&)>>> cases = {
      {"soft_margin_loss",
       [](const TensorList& in) { return TensorList{nn::soft_margin_loss(in[0], in[1].sign())}; }},
      {"cosine_embedding_loss",
       [&](const TensorList& in) {
         return TensorList{nn::cosine_embedding_loss(in[0], in[1], signs, {.margin = -0.9, .reduction = "sum"})};
       }},
      {"multilabel_soft_margin_loss",
       [](const TensorList& in) { return TensorList{nn::multilabel_soft_margin_loss(in[0], sigmoid(in[1]))}; }},
      {"multi_margin_loss p = 2",
       [](const TensorList& in) {
         return TensorList{nn::multi_margin_loss(in[0], from_vector<int64_t>({0, 3, 1}), {.p = 2, .margin = 3})};
       }},
      {"triplet_margin_loss with swap",
       [](const TensorList& in) {
         return TensorList{nn::triplet_margin_loss(in[0], in[1], in[2], {.margin = 5, .swap = true})};
       }},
      {"poisson_nll_loss full",
       [](const TensorList& in) {
         return TensorList{nn::poisson_nll_loss(in[0], in[1].abs() * 3, {.full = true, .reduction = "sum"})};
       }},
      {"gaussian_nll_loss",
       [](const TensorList& in) { return TensorList{nn::gaussian_nll_loss(in[0], in[1], in[2].abs() + 0.2)}; }},
      {"cosine_similarity",
       [](const TensorList& in) { return TensorList{nn::cosine_similarity(in[0], in[1], {.dim = 0})}; }},
      {"normalize", [](const TensorList& in) { return TensorList{nn::normalize(in[0], {.p = 3})}; }},
  };
  for (const auto& [name, fn] : cases) {
    INFO(name);
    CHECK(autograd::gradcheck(fn, {a, b, c}));
    CHECK(autograd::gradgradcheck(fn, {a, b, c}));
  }
}

TEST_CASE("soft_margin_loss stays finite where PyTorch's exp overflows", "[nn][losses]") {
  // log(1 + exp(800)) is inf in PyTorch (and its gradient NaN); softplus gives 800 and -1.
  Tensor x = from_vector<double>({-800, 800, 0}).requires_grad_();
  Tensor loss = nn::soft_margin_loss(x, from_vector<double>({1, 1, -1}), {.reduction = "sum"});
  CHECK(loss.item<double>() == Approx(800 + std::log(2.0)).epsilon(1e-15));
  loss.backward();
  test::check_close(x.grad(), from_vector<double>({-1, 0, 0.5}));
}

TEST_CASE("poisson_nll_loss with full has a finite target gradient at target 0", "[nn][losses]") {
  // Stirling's term is masked where target <= 1; PyTorch's masked_fill leaves 0 * log(0) = NaN in the
  // target's gradient there, Kiln's where takes its log of 2 instead.
  Tensor t = from_vector<double>({0, 0.5, 3}).requires_grad_();
  Tensor loss = nn::poisson_nll_loss(from_vector<double>({0.1, 0.2, 0.3}), t, {.full = true, .reduction = "sum"});
  loss.backward();
  test::check_close(t.grad(), from_vector<double>({-0.1, -0.2, -0.3 + std::log(3.0) + 0.5 / 3}));
}

TEST_CASE("The margin and likelihood losses refuse bad input with a clear Error", "[nn][losses][errors]") {
  Tensor x = test::sample({3, 4});
  test::check_error([&] { nn::soft_margin_loss(x, ones({4})); }, {"soft_margin_loss", "[4]", "[3, 4]"});
  test::check_error([&] { nn::hinge_embedding_loss(x, ones({3, 4}), {.reduction = "avg"}); },
                    {"hinge_embedding_loss", "reduction 'avg'"});
  test::check_error([&] { nn::hinge_embedding_loss(zeros({3}, kInt64), ones({3})); },
                    {"hinge_embedding_loss", "input must be floating", "int64"});
  test::check_error([&] { nn::margin_ranking_loss(zeros({3}), zeros({3, 1}), ones({3})); },
                    {"margin_ranking_loss", "one number of dims", "[3]", "[3, 1]"});
  test::check_error([&] { nn::cosine_embedding_loss(x, x, ones({3, 1})); },
                    {"cosine_embedding_loss", "0-D or 1-D", "[3, 1]"});
  test::check_error([&] { nn::cosine_embedding_loss(x, x, ones({4})); },
                    {"cosine_embedding_loss", "target of shape [4]", "(4, D)", "[3, 4]"});
  test::check_error([&] { nn::cosine_embedding_loss(zeros({4}), zeros({4}), ones({1})); }, {"(1, D)", "[4]"});
  test::check_error([&] { nn::multilabel_margin_loss(x, from_vector<int64_t>({0, 1, 2, 4}, {1, 4}).expand({3, 4})); },
                    {"multilabel_margin_loss", "target 4 at position 3", "[-1, 4)"});
  test::check_error([&] { nn::multilabel_margin_loss(x, zeros({3, 4})); },
                    {"multilabel_margin_loss", "class indices (int64 or int32)", "float32"});
  test::check_error([&] { nn::multilabel_margin_loss(zeros({2, 3, 4}), zeros({2, 3, 4}, kInt64)); },
                    {"multilabel_margin_loss", "(N, C) or (C)", "[2, 3, 4]"});
  test::check_error([&] { nn::multilabel_margin_loss(zeros({2, 0}), zeros({2, 0}, kInt64)); }, {"C >= 1"});
  test::check_error([&] { nn::multi_margin_loss(x, from_vector<int64_t>({0, 4, 1})); },
                    {"multi_margin_loss", "target 4 at position 1", "[0, 4)"});
  test::check_error([&] { nn::multi_margin_loss(x, from_vector<int64_t>({0, 1})); },
                    {"multi_margin_loss", "target must have shape (3)", "[2]"});
  test::check_error([&] { nn::multi_margin_loss(x, from_vector<int64_t>({0, 1, 2}), {.p = 3}); },
                    {"multi_margin_loss", "p must be 1 or 2, got 3"});
  test::check_error([&] { nn::multi_margin_loss(x, from_vector<int64_t>({0, 1, 2}), {.weight = ones({3})}); },
                    {"multi_margin_loss", "weight", "4 elements"});
  test::check_error([&] { nn::triplet_margin_loss(x, x, zeros({4})); },
                    {"triplet_margin_loss", "one number of dims", "[4]"});
  test::check_error(
      [&] {
        nn::triplet_margin_with_distance_loss(
            x, x, zeros({5, 4}), {.distance_function = [](const Tensor& p, const Tensor& q) { return q.sum({1}); }});
      },
      {"triplet_margin_with_distance_loss", "shapes [3] and [5]", "one distance per pair"});
  test::check_error([&] { nn::gaussian_nll_loss(x, x, ones({4})); },
                    {"gaussian_nll_loss", "var of shape [4]", "[3, 4]", "last dim of 1"});
  test::check_error([&] { nn::gaussian_nll_loss(x, x, full({3}, -0.5)); },
                    {"gaussian_nll_loss", "var has negative entries"});
  test::check_error([&] { nn::cosine_similarity(x, zeros({2, 4})); }, {"cosine_similarity", "[3, 4]", "[2, 4]"});
  test::check_error([&] { nn::cosine_similarity(x, x, {.dim = 2}); }, {"cosine_similarity", "dim 2 is out of range"});
  test::check_error([&] { nn::cosine_similarity(zeros({3}, kInt64), zeros({3}, kInt32)); },
                    {"cosine_similarity", "x1 or x2 must be floating", "int64 and int32"});
}

TEST_CASE("The loss modules call their functional forms with their options", "[nn][losses][modules]") {
  Tensor x = test::sample({4, 5}, kFloat64, 0.3), y = test::sample({4, 5}, kFloat64, 1.4);
  Tensor labels = from_vector<int64_t>({0, 3, 4, 1});
  Tensor w = test::sample({5}, kFloat64, 0.8).abs() + 0.5;
  auto same = [](const Tensor& module_loss, const Tensor& functional_loss) {
    test::check_equal(module_loss, functional_loss);
  };
  same(nn::CrossEntropyLoss({.weight = w, .label_smoothing = 0.1})(x, labels),
       nn::cross_entropy(x, labels, {.weight = w, .label_smoothing = 0.1}));
  same(nn::NLLLoss({.weight = w, .reduction = "sum"})(log_softmax(x, 1), labels),
       nn::nll_loss(log_softmax(x, 1), labels, {.weight = w, .reduction = "sum"}));
  same(nn::MSELoss({.reduction = "none"})(x, y), nn::mse_loss(x, y, {.reduction = "none"}));
  same(nn::L1Loss()(x, y), nn::l1_loss(x, y));
  same(nn::SmoothL1Loss({.beta = 0.3})(x, y), nn::smooth_l1_loss(x, y, {.beta = 0.3}));
  same(nn::HuberLoss({.delta = 0.3})(x, y), nn::huber_loss(x, y, {.delta = 0.3}));
  same(nn::KLDivLoss({.reduction = "batchmean"})(log_softmax(x, 1), softmax(y, 1)),
       nn::kl_div(log_softmax(x, 1), softmax(y, 1), {.reduction = "batchmean"}));
  same(nn::BCELoss({.weight = w})(sigmoid(x), sigmoid(y)), nn::binary_cross_entropy(sigmoid(x), sigmoid(y), {.weight = w}));
  same(nn::BCEWithLogitsLoss({.pos_weight = w})(x, sigmoid(y)),
       nn::binary_cross_entropy_with_logits(x, sigmoid(y), {.pos_weight = w}));
  same(nn::SoftMarginLoss()(x, y.sign()), nn::soft_margin_loss(x, y.sign()));
  same(nn::MultiLabelSoftMarginLoss({.weight = w})(x, sigmoid(y)),
       nn::multilabel_soft_margin_loss(x, sigmoid(y), {.weight = w}));
  Tensor multi = from_vector<int64_t>({3, 0, -1, 1, 2, 2, 4, -1, 0, 0, 1, 2, 3, 4, -1, -1, 0, 0, 0, 0}, {4, 5});
  same(nn::MultiLabelMarginLoss()(x, multi), nn::multilabel_margin_loss(x, multi));
  same(nn::MultiMarginLoss({.p = 2, .weight = w})(x, labels), nn::multi_margin_loss(x, labels, {.p = 2, .weight = w}));
  same(nn::HingeEmbeddingLoss({.margin = 0.5})(x, y.sign()), nn::hinge_embedding_loss(x, y.sign(), {.margin = 0.5}));
  same(nn::PoissonNLLLoss({.full = true})(x, y.abs()), nn::poisson_nll_loss(x, y.abs(), {.full = true}));
  Tensor z = test::sample({4, 5}, kFloat64, 2.2);
  same(nn::MarginRankingLoss({.margin = 0.2})(x, y, z.sign()), nn::margin_ranking_loss(x, y, z.sign(), {.margin = 0.2}));
  same(nn::CosineEmbeddingLoss({.margin = 0.1})(x, y, z.select(1, 0).sign()),
       nn::cosine_embedding_loss(x, y, z.select(1, 0).sign(), {.margin = 0.1}));
  same(nn::TripletMarginLoss({.p = 1, .swap = true})(x, y, z), nn::triplet_margin_loss(x, y, z, {.p = 1, .swap = true}));
  same(nn::TripletMarginWithDistanceLoss({.margin = 2})(x, y, z),
       nn::triplet_margin_with_distance_loss(x, y, z, {.margin = 2}));
  same(nn::GaussianNLLLoss({.full = true})(x, y, z.abs()), nn::gaussian_nll_loss(x, y, z.abs(), {.full = true}));
  const Tensor lp = log_softmax(test::sample({6, 2, 5}, kFloat64), 2), il = from_vector<int64_t>({6, 5});
  const Tensor tl = from_vector<int64_t>({2, 1}), targets = from_vector<int64_t>({1, 2, 3});
  same(nn::CTCLoss({.blank = 4, .reduction = "sum"})(lp, targets, il, tl),
       nn::ctc_loss(lp, targets, il, tl, {.blank = 4, .reduction = "sum"}));
  same(nn::CosineSimilarity({.dim = 0})(x, y), nn::cosine_similarity(x, y, {.dim = 0}));
  same(nn::PairwiseDistance({.p = 3})(x, y), nn::pairwise_distance(x, y, {.p = 3}));
}

TEST_CASE("A loss module's weight is a buffer: in state_dict, moved by to(), printed as PyTorch's", "[nn][losses][modules]") {
  const test::NnCase& c = test::nn_case("loss_reprs");
  nn::BCEWithLogitsLoss bce({.weight = ones({3}), .pos_weight = ones({3})});
  std::string keys;
  for (const auto& [name, t] : bce.state_dict()) keys += (keys.empty() ? "" : " ") + name;
  CHECK(keys == c.strings.at("keys"));
  CHECK(nn::CrossEntropyLoss().state_dict().empty());  // no weight, no buffer (PyTorch registers None)
  nn::CrossEntropyLoss ce({.weight = from_vector<float>({1, 2, 3})});
  ce.to(kFloat64);
  CHECK(ce.options.weight.dtype() == kFloat64);  // the options' weight is the buffer
  Tensor logits = test::sample({2, 3}, kFloat64);
  Tensor loss = ce(logits, from_vector<int64_t>({2, 0}));
  test::check_close(loss, nn::cross_entropy(logits, from_vector<int64_t>({2, 0}),
                                            {.weight = from_vector<double>({1, 2, 3})}));
  nn::Sequential seq;
  seq.push_back(std::make_shared<nn::CrossEntropyLoss>(nn::CrossEntropyOptions{.weight = ones({3})}));
  seq.push_back(std::make_shared<nn::TripletMarginLoss>(nn::TripletMarginLossOptions{.margin = 0.5}));
  seq.push_back(std::make_shared<nn::CosineSimilarity>(nn::CosineSimilarityOptions{.dim = 0}));
  seq.push_back(std::make_shared<nn::PairwiseDistance>(nn::PairwiseDistanceOptions{.p = 1}));
  seq.push_back(std::make_shared<nn::GaussianNLLLoss>());
  const std::string repr = seq.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == c.strings.at("repr"));
}

TEST_CASE("A loss module called with one tensor is an Error naming how many it takes", "[nn][losses][modules][errors]") {
  Tensor x = zeros({2, 3});
  nn::CrossEntropyLoss ce;
  nn::Module& as_module = ce;
  test::check_error([&] { as_module(x); }, {"nn::CrossEntropyLoss", "takes 2 tensors, not one"});
  nn::TripletMarginLoss triplet;
  nn::Module& triplet_module = triplet;
  test::check_error([&] { triplet_module(x); }, {"nn::TripletMarginLoss", "takes 3 tensors"});
  nn::CTCLoss ctc;
  nn::Module& ctc_module = ctc;
  test::check_error([&] { ctc_module(x); }, {"nn::CTCLoss", "takes 4 tensors"});
  nn::CosineSimilarity similarity;
  nn::Module& similarity_module = similarity;
  test::check_error([&] { similarity_module(x); }, {"nn::CosineSimilarity", "two inputs"});
}

TEST_CASE("ctc_loss matches torch through a log_softmax", "[nn][losses][ctc]") {
  // Labels with repeats (a blank between them is then required), samples using fewer frames than T,
  // an empty target, the 1-D concatenated targets, blank not 0, unbatched, and an impossible alignment
  // with zero_infinity.
  for (std::string red : {"mean", "sum", "none"}) {
    check_loss("ctc_padded_" + red, [&](auto& in) {
      return nn::ctc_loss(log_softmax(in[0], 2), in[1], in[2], in[3], {.reduction = red});
    });
  }
  check_loss("ctc_concatenated_blank_last", [](auto& in) {
    return nn::ctc_loss(log_softmax(in[0], 2), in[1], in[2], in[3], {.blank = 4, .reduction = "none"});
  });
  check_loss("ctc_unbatched",
             [](auto& in) { return nn::ctc_loss(log_softmax(in[0], 1), in[1], in[2], in[3], {.blank = 2}); });
  check_loss("ctc_zero_infinity", [](auto& in) {
    return nn::ctc_loss(log_softmax(in[0], 2), in[1], in[2], in[3], {.reduction = "none", .zero_infinity = true});
  });
}

TEST_CASE("ctc_loss equals the sum over every alignment, counted by brute force", "[nn][losses][ctc]") {
  // T = 4 frames, C = 3 classes (blank 0): enumerate all 3^4 paths, collapse each, and add the
  // probabilities of those that give the target. Float64; also the derivative with respect to
  // log_probs (the recursion's), against the same sum differentiated by hand: d(-log p)/d lp[t, c] =
  // -(sum of the matching paths' probabilities that pass c at t) / p.
  const Tensor lp = log_softmax(test::sample({4, 1, 3}, kFloat64, 0.7) * 2, 2);
  const std::vector<std::vector<int64_t>> targets = {{1}, {1, 1}, {1, 2}, {2, 1, 2}, {}};
  for (const auto& target : targets) {
    INFO("target of length " << target.size());
    double total = 0;
    std::vector<double> through(12, 0.0);  // [t * 3 + c]
    const std::vector<double> v = lp.to_vector<double>();
    for (int path = 0; path < 81; ++path) {
      int code = path;
      std::vector<int64_t> p(4);
      for (auto& c : p) {
        c = code % 3;
        code /= 3;
      }
      std::vector<int64_t> collapsed;
      for (int t = 0; t < 4; ++t) {
        if (p[t] != 0 && (t == 0 || p[t] != p[t - 1])) collapsed.push_back(p[t]);
      }
      if (collapsed != target) continue;
      double prob = 1;
      for (int t = 0; t < 4; ++t) prob *= std::exp(v[t * 3 + p[t]]);
      total += prob;
      for (int t = 0; t < 4; ++t) through[t * 3 + p[t]] += prob;
    }
    const int64_t length = static_cast<int64_t>(target.size());
    const Tensor x = lp.clone().requires_grad_();
    const Tensor loss =
        nn::ctc_loss(x, length == 0 ? zeros({1, 0}, kInt64) : from_vector(target, {1, length}),
                     from_vector<int64_t>({4}), from_vector<int64_t>({length}), {.reduction = "sum"});
    CHECK(loss.item<double>() == Approx(-std::log(total)).epsilon(1e-12));
    loss.backward();
    std::vector<double> expected(12);
    for (int i = 0; i < 12; ++i) expected[i] = -through[i] / total;
    test::check_close(x.grad(), from_vector(expected, {4, 1, 3}));
  }
}

TEST_CASE("ctc_loss of an impossible alignment is inf without gradient, and its inputs are checked",
          "[nn][losses][ctc][errors]") {
  Tensor lp = log_softmax(test::sample({3, 2, 4}, kFloat64), 2).requires_grad_();
  Tensor targets = from_vector<int64_t>({1, 1, 2, 3, 0, 0}, {2, 3});
  // [1, 1] needs 3 frames (1, blank, 1); 2 frames cannot hold it.
  Tensor loss = nn::ctc_loss(lp, targets, from_vector<int64_t>({2, 3}), from_vector<int64_t>({2, 1}),
                             {.reduction = "none"});
  const std::vector<double> v = loss.to_vector<double>();
  CHECK(std::isinf(v[0]));
  CHECK(std::isfinite(v[1]));
  loss.narrow(0, 0, 1).sum().backward();
  test::check_equal(lp.grad(), zeros({3, 2, 4}, kFloat64));
  // No frames: an empty target has probability 1, any other 0.
  test::check_close(nn::ctc_loss(lp, targets, from_vector<int64_t>({0, 0}), from_vector<int64_t>({0, 1}),
                                 {.reduction = "none"}),
                    from_vector<double>({0, INFINITY}));
  const Tensor il = from_vector<int64_t>({3, 3}), tl = from_vector<int64_t>({2, 1});
  test::check_error([&] { nn::ctc_loss(lp, targets, from_vector<int64_t>({4, 3}), tl); },
                    {"ctc_loss", "input_lengths[0] is 4", "[0, 3]"});
  test::check_error([&] { nn::ctc_loss(lp, targets, il, from_vector<int64_t>({4, 1})); },
                    {"ctc_loss", "target length of 4 exceeds the targets' 3 columns"});
  test::check_error([&] { nn::ctc_loss(lp, from_vector<int64_t>({1, 2}), il, tl); },
                    {"ctc_loss", "1-D targets hold 2 labels", "sum to 3"});
  test::check_error([&] { nn::ctc_loss(lp, from_vector<int64_t>({1, 4, 2, 0, 0, 0}, {2, 3}), il, tl); },
                    {"ctc_loss", "not a class index in [0, 4)"});
  test::check_error([&] { nn::ctc_loss(lp, targets, il, tl, {.blank = 4}); }, {"ctc_loss", "blank 4"});
  test::check_error([&] { nn::ctc_loss(lp, targets, from_vector<double>({3, 3}), tl); },
                    {"ctc_loss", "input_lengths must be an integer tensor", "float64"});
  test::check_error([&] { nn::ctc_loss(lp, targets, from_vector<int64_t>({3}), tl); },
                    {"ctc_loss", "input_lengths must have one entry per sample: shape (2)", "[1]"});
  test::check_error([&] { nn::ctc_loss(lp.select(1, 0), targets, il, tl); }, {"ctc_loss", "one entry", "[2]"});
  test::check_error([&] { nn::ctc_loss(zeros({3, 4}, kInt64), targets, il, tl); },
                    {"ctc_loss", "log_probs must be floating"});
  test::check_error([&] { nn::ctc_loss(lp, targets.to(kFloat32), il, tl); },
                    {"ctc_loss", "class indices (int64 or int32)"});
}

TEST_CASE("ctc_loss passes gradcheck and gradgradcheck in float64", "[nn][losses][ctc][gradcheck]") {
  const Tensor logits = test::sample({5, 2, 4}, kFloat64, 0.4).requires_grad_();
  const Tensor targets = from_vector<int64_t>({1, 1, 3, 2, 0, 0}, {2, 3});
  const auto fn = [&](const TensorList& in) {
    return TensorList{nn::ctc_loss(log_softmax(in[0], 2), targets, from_vector<int64_t>({5, 4}),
                                   from_vector<int64_t>({3, 1}))};
  };
  for (bool fused : {true, false}) {
    INFO("fusion " << fused);
    test::FusionGuard fusion(fused);
    CHECK(autograd::gradcheck(fn, {logits}));
  }
  // The fused kernel's gradient is not differentiable again (as PyTorch's): gradgradcheck composes.
  test::FusionGuard composed(false);
  CHECK(autograd::gradgradcheck(fn, {logits}));
}

TEST_CASE("ctc_loss's fused kernels equal its composition, forward and gradient", "[nn][losses][ctc][fused]") {
  // Six samples: repeated labels (no skip between them), an empty target, a target without frames, a
  // target its frames cannot hold (3 frames for a, b, b: it needs 4), a label equal to the blank (which
  // PyTorch forbids but does not check: both paths treat it as a state without a skip into it), and one
  // using every frame; padded and concatenated targets; float64 and float32; 1 and 2 threads.
  const std::vector<int64_t> labels = {1, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 4, 2, 2,
                                       3, 2, 2, 3, 0, 2, 1, 0, 2, 1, 2, 3, 4, 1, 0};
  const Tensor targets = from_vector(labels, {6, 5}).narrow(1, 0, 4);  // a view with strides (5, 1)
  const Tensor in_len = from_vector<int64_t>({9, 7, 0, 3, 9, 9}), tgt_len = from_vector<int64_t>({3, 0, 2, 3, 3, 4});
  const Tensor concatenated = from_vector<int64_t>({1, 1, 2, 0, 0, 3, 2, 2, 2, 1, 0, 2, 3, 4, 1});
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dtype_name(dt));
    const Tensor logits = test::sample({9, 6, 5}, dt, 1.3);
    const Tensor cotangent = test::sample({6}, dt, 0.5);
    auto run = [&](bool fused, const Tensor& t, bool zero_infinity) {
      test::FusionGuard fusion(fused);
      Tensor x = logits.clone().requires_grad_();
      Tensor loss = nn::ctc_loss(log_softmax(x, 2), t, in_len, tgt_len,
                                 {.reduction = "none", .zero_infinity = zero_infinity});
      // The impossible sample's loss is inf; its cotangent is 0 so the others' gradients stay finite.
      (loss.masked_fill(loss.isinf(), 0) * cotangent).sum().backward();
      return std::make_pair(loss, x.grad());
    };
    for (bool zero_infinity : {false, true}) {
      const auto [loss, grad] = run(false, targets, zero_infinity);
      CHECK(std::isinf(loss.to_vector<double>()[3]) != zero_infinity);
      for (int threads : {1, 2}) {
        INFO("threads " << threads << ", zero_infinity " << zero_infinity);
        test::ThreadsGuard pool(threads);
        for (const Tensor& t : {targets, concatenated}) {
          const auto [fused_loss, fused_grad] = run(true, t, zero_infinity);
          test::check_close(fused_loss, loss);
          test::check_close(fused_grad, grad);
        }
      }
    }
  }
}

TEST_CASE("ops::ctc_nll: the true gradient, its arguments checked, no double backward", "[nn][losses][ctc][errors]") {
  // Raw (unnormalised) log_probs: the gradient is -d log p / d log_probs itself, without PyTorch's
  // exp(log_probs) term (which a log_softmax before it cancels).
  const Tensor x = test::sample({6, 2, 4}, kFloat64, 0.8).requires_grad_();
  const Tensor targets = from_vector<int64_t>({1, 2, 2, 3, 3, 0}, {2, 3});
  const Tensor il = from_vector<int64_t>({6, 5}), tl = from_vector<int64_t>({3, 2});
  CHECK(autograd::gradcheck([&](const TensorList& in) { return TensorList{ops::ctc_nll(in[0], targets, il, tl, 0)}; },
                            {x}));
  Tensor nll = ops::ctc_nll(x, targets, il, tl);
  test::check_error([&] { autograd::grad({nll.sum()}, {x}, {}, true, true); },
                    {"ctc_loss", "cannot be differentiated again", "set_fusion(false)"});
  const Tensor lp = x.detach();
  test::check_error([&] { ops::ctc_nll(lp.to(kFloat16), targets, il, tl); },
                    {"ctc_loss", "float32 or float64 (T, N, C)", "float16"});
  test::check_error([&] { ops::ctc_nll(lp, targets.narrow(0, 0, 1), il, tl); },
                    {"ctc_loss", "targets must be int64 of shape (2, S)", "[1, 3]"});
  test::check_error([&] { ops::ctc_nll(lp, targets, il.to(kInt32), tl); },
                    {"ctc_loss", "input_lengths must be int64 of shape (2)", "int32"});
  test::check_error([&] { ops::ctc_nll(lp, targets, il, Tensor()); },
                    {"ctc_loss", "target_lengths", "undefined"});
  test::check_error([&] { ops::ctc_nll(lp, targets, il, tl, 4); }, {"ctc_loss", "blank 4", "[0, 4)"});
  test::check_error([&] { ops::ctc_nll(lp, targets, from_vector<int64_t>({6, 7}), tl); },
                    {"ctc_loss", "input_lengths[1] is 7", "[0, 6]"});
  test::check_error([&] { ops::ctc_nll(lp, targets, il, from_vector<int64_t>({-1, 2})); },
                    {"ctc_loss", "target_lengths[0] is -1", "[0, 3]"});
  test::check_error([&] { ops::ctc_nll(lp, from_vector<int64_t>({1, 2, 2, 3, 4, 0}, {2, 3}), il, tl); },
                    {"ctc_loss", "target 1 of sample 1 is 4", "[0, 4)"});
  // A label past the target's length is not read, so it may be anything.
  test::check_close(ops::ctc_nll(lp, from_vector<int64_t>({1, 2, 2, 3, 3, -7}, {2, 3}), il, tl),
                    ops::ctc_nll(lp, targets, il, tl));
}

TEST_CASE("The margin losses' hinges pass no gradient at 0, as PyTorch's kernels, and their inputs as PyTorch",
          "[nn][losses]") {
  // x = (1, 0, 0.5), class 0: multi_margin's hinge for class 1 is 1 - 1 + 0 = 0 exactly (torch 1.13:
  // the gradient is (-1/3, 0, 1/3) for both losses; a clamp's would be (-2/3, 1/3, 1/3)).
  Tensor x = from_vector<double>({1, 0, 0.5}, {1, 3}).requires_grad_();
  const Tensor expected = from_vector<double>({-1.0 / 3, 0, 1.0 / 3}, {1, 3});
  nn::multi_margin_loss(x, from_vector<int64_t>({0})).backward();
  test::check_close(x.grad(), expected);
  x.set_grad(Tensor());
  nn::multilabel_margin_loss(x, from_vector<int64_t>({0, -1, 0}, {1, 3})).backward();
  test::check_close(x.grad(), expected);
  // As PyTorch: a (1, C) input with a 0-d target, an integer x2 for cosine_similarity (promoted), and
  // an unbatched CTC input with (1, S) targets.
  CHECK(nn::multi_margin_loss(x.detach(), scalar_tensor(0, kInt64), {.reduction = "none"}).dim() == 0);
  test::check_close(nn::cosine_similarity(from_vector<double>({1, 0, 1}, {1, 3}), from_vector<int64_t>({2, 0, 0}, {1, 3})),
                    from_vector<double>({1 / std::sqrt(2.0)}));
  const Tensor lp = log_softmax(test::sample({5, 4}, kFloat64), 1);
  test::check_equal(nn::ctc_loss(lp, from_vector<int64_t>({1, 2}, {1, 2}), scalar_tensor(5, kInt64),
                                 scalar_tensor(2, kInt64)),
                    nn::ctc_loss(lp, from_vector<int64_t>({1, 2}), scalar_tensor(5, kInt64), scalar_tensor(2, kInt64)));
}

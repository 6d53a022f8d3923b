// tests/nn/test_adaptive_softmax.cpp: nn::AdaptiveLogSoftmaxWithLoss (nn/adaptive.h) against PyTorch
// 1.13 (goldens of tests/fixtures/gen_nn_golden.py: the targets' log-probabilities and the loss, the
// gradients of the input and every parameter, log_prob and predict, the repr), batched, with the
// targets all in the shortlist, unbatched and with a head bias; log_prob's rows summing to 1; Errors.
#include "nn/nn_golden.h"
#include "support.h"

using namespace kiln;
using test::nn_case;

namespace {

void check_asm(nn::AdaptiveLogSoftmaxWithLoss& m, const std::string& case_name) {
  INFO(case_name);
  const test::NnCase& c = nn_case(case_name);
  m.to(kFloat64);
  m.load_state_dict(c.state());
  m.zero_grad();
  const Tensor x = c.at("in.0").clone().requires_grad_(true);
  const nn::ASMoutput result = m.forward(x, c.at("target"));
  test::check_close(result.output, c.at("out"));
  test::check_close(result.loss, c.at("loss"));
  ((result.output * c.at("cot")).sum() + 0.5 * result.loss).backward();
  test::check_close(x.grad(), c.at("g.in.0"));
  for (const auto& [name, p] : m.named_parameters()) {
    INFO(name);
    test::check_close(p.grad().defined() ? p.grad() : zeros_like(p), c.at("g." + name));
  }
  if (c.has("log_prob")) {
    NoGradGuard no_grad;
    test::check_close(m.log_prob(c.at("in.0")), c.at("log_prob"));
    test::check_equal(m.predict(c.at("in.0")), c.at("predict"));
  }
}

}  // namespace

TEST_CASE("AdaptiveLogSoftmaxWithLoss matches torch: log-probabilities, loss, gradients, log_prob and predict",
          "[nn][adaptive_softmax]") {
  nn::AdaptiveLogSoftmaxWithLoss m(8, 10, {3, 6}, {.div_value = 2.0});
  CHECK(m.shortlist_size == 3);
  CHECK(m.n_clusters == 2);
  CHECK(m.head_size == 5);
  CHECK(m.cutoffs == std::vector<int64_t>{3, 6, 10});
  check_asm(m, "adaptive_log_softmax");
  check_asm(m, "adaptive_log_softmax_shortlist_only");  // no row reaches a cluster: zero gradients there
  check_asm(m, "adaptive_log_softmax_unbatched");       // a row (8) and a 0-d target
  nn::AdaptiveLogSoftmaxWithLoss b(6, 20, {2, 7, 12}, {.div_value = 1.5, .head_bias = true});
  check_asm(b, "adaptive_log_softmax_head_bias");
  nn::Sequential both;
  both.push_back(std::make_shared<nn::AdaptiveLogSoftmaxWithLoss>(8, 10, std::vector<int64_t>{3, 6},
                                                                  nn::AdaptiveLogSoftmaxWithLossOptions{2.0}));
  both.push_back(std::make_shared<nn::AdaptiveLogSoftmaxWithLoss>(
      6, 20, std::vector<int64_t>{2, 7, 12},
      nn::AdaptiveLogSoftmaxWithLossOptions{.div_value = 1.5, .head_bias = true}));
  const std::string repr = both.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == nn_case("adaptive_log_softmax_repr").strings.at("repr"));
}

TEST_CASE("AdaptiveLogSoftmaxWithLoss's log_prob is a distribution and forward picks from it",
          "[nn][adaptive_softmax]") {
  nn::AdaptiveLogSoftmaxWithLoss m(5, 12, {2, 4, 9}, {.div_value = 1.0, .head_bias = true});
  m.to(kFloat64);
  const Tensor x = test::sample({6, 5}, kFloat64, 0.3) * 4.0;
  const Tensor lp = m.log_prob(x);
  CHECK(lp.sizes() == Shape{6, 12});
  test::check_close(lp.exp().sum(Shape{1}), ones({6}, kFloat64));
  const Tensor target = from_vector(std::vector<int64_t>{11, 0, 3, 8, 2, 5});
  const nn::ASMoutput r = m.forward(x, target);
  test::check_close(r.output, lp.gather(1, target.unsqueeze(1)).squeeze(1));
  test::check_close(r.loss, -r.output.mean());
  test::check_equal(m.predict(x), lp.argmax(1));
  test::check_equal(m.predict(x.select(0, 0)), lp.select(0, 0).argmax());  // one row: a 0-d class
  test::check_close(m.log_prob(x.select(0, 2)), lp.select(0, 2));
}

TEST_CASE("AdaptiveLogSoftmaxWithLoss refuses bad cutoffs, targets and inputs with an Error",
          "[nn][adaptive_softmax][errors]") {
  const std::string cutoffs = "cutoffs should be a sequence of unique, positive integers sorted in an increasing order";
  test::check_error([] { nn::AdaptiveLogSoftmaxWithLoss(8, 10, {}); }, {"cutoffs is empty"});
  test::check_error([] { nn::AdaptiveLogSoftmaxWithLoss(8, 10, {3, 3}); }, {cutoffs});
  test::check_error([] { nn::AdaptiveLogSoftmaxWithLoss(8, 10, {0, 3}); }, {cutoffs});
  test::check_error([] { nn::AdaptiveLogSoftmaxWithLoss(8, 10, {3, 10}); }, {cutoffs, "between 1 and n_classes-1 (9)"});
  test::check_error([] { nn::AdaptiveLogSoftmaxWithLoss(8, 10, {6, 3}); }, {cutoffs});
  test::check_error([] { nn::AdaptiveLogSoftmaxWithLoss(8, 10, {3}, {.div_value = 0}); },
                    {"div_value must be positive"});
  nn::AdaptiveLogSoftmaxWithLoss m(8, 10, {3, 6});
  const Tensor x = zeros({2, 8});
  test::check_error(
      [&] {
        m.forward(x, from_vector(std::vector<int64_t>{1, 10}));
      },
      {"Target values should be in [0, 9], but values in range [1, 10] were found"});
  test::check_error([&] { m.forward(x, from_vector(std::vector<int64_t>{-1, 2})); }, {"values in range [-1, 2]"});
  test::check_error(
      [&] {
        m.forward(zeros({3, 8}), from_vector(std::vector<int64_t>{1, 2}));
      },
      {"1D target tensor expects 2D input tensors with as many rows", "[3, 8]"});
  test::check_error([&] { m.forward(zeros({8}), from_vector(std::vector<int64_t>{1})); },
                    {"1D target tensor expects 2D input"});
  test::check_error([&] { m.forward(x, zeros({2, 1}, kInt64)); }, {"0D or 1D target tensor expected"});
  test::check_error([&] { m.forward(x, zeros({2})); }, {"class indices", "float32"});
  test::check_error([&] { m.forward(zeros({2, 7}), zeros({2}, kInt64)); }, {"the input has 7 features, the module 8"});
  test::check_error([&] { m(x); }, {"forward takes the input and the target"});
  test::check_error([&] { m.log_prob(zeros({2, 3, 8})); }, {"log_prob", "(N, 8) or (8)"});
  test::check_error([&] { m.predict(zeros({2, 7})); }, {"predict", "[2, 7]"});
}

// tests/nn/test_orthogonal.cpp: nn::utils::parametrizations::orthogonal (nn/orthogonal.cpp) against
// PyTorch 1.13 (goldens of tests/fixtures/gen_nn_golden.py: the original and base it registers, the
// weight, a forward and its gradients, SGD steps through matrix_exp, householder, cayley, a wide weight
// and no trivialization), orthogonality of batches in float32 and float64, and the Errors.
#include <algorithm>

#include "nn/nn_golden.h"
#include "support.h"

using namespace kiln;
using test::nn_case;
namespace P = nn::utils::parametrizations;

namespace {

// A float64 Linear with the case's weight before registration ("w0") and its bias.
nn::Linear linear_from(const test::NnCase& c) {
  const Tensor w0 = c.at("w0");
  nn::Linear layer(w0.size(1), w0.size(0));
  layer.to(kFloat64);
  NoGradGuard no_grad;
  layer.weight.copy_(w0);
  layer.bias.copy_(c.at("p.bias"));  // unchanged by the registration
  return layer;
}

// A module with one parameter `weight` of any shape (a batch of matrices).
class Holder : public nn::Module {
 public:
  explicit Holder(const Tensor& w) { weight = register_parameter("weight", w); }
  Tensor forward(const Tensor& x) override { return x.matmul(weight); }
  Tensor weight;
};

// The largest |Q^T Q - I| (or |Q Q^T - I| for a wide Q) over the batch.
double orthogonality_error(const Tensor& q) {
  const bool wide = q.size(-2) < q.size(-1);
  const Tensor gram = wide ? q.matmul(q.mT()) : q.mT().matmul(q);
  const int64_t n = gram.size(-1);
  return (gram - eye(n, {}, TensorOptions(q.dtype()))).abs().max().to(kFloat64).item<double>();
}

}  // namespace

TEST_CASE("parametrizations::orthogonal registers PyTorch's original and base, and the weight they give",
          "[nn][parametrize][orthogonal]") {
  for (const char* name : {"orthogonal_register_square", "orthogonal_register_tall_no_trivialization",
                           "orthogonal_register_wide_no_trivialization"}) {
    INFO(name);
    const test::NnCase& c = nn_case(name);
    nn::Linear layer = linear_from(c);
    const bool trivialization = std::string(name) == "orthogonal_register_square";
    P::orthogonal(layer, "weight", std::nullopt, trivialization);
    // Square: base is the QR factor of the (not orthogonal) weight, the original -I, the weight base.
    // Without trivialization: the original holds the weight's Householder vectors (geqrf) with the
    // signs of R's diagonal, and the weight is the QR factor.
    const TensorDict state = layer.state_dict();
    std::vector<std::string> keys, want;
    for (const auto& [key, t] : state) keys.push_back(key);
    for (const auto& [key, t] : c.state()) want.push_back(key);
    std::sort(keys.begin(), keys.end());  // the case's keys come sorted
    CHECK(keys == want);
    for (const auto& [key, t] : c.state()) {
      INFO(key);
      test::check_close(state.at(key), t, {1e-12, 1e-12});
    }
    test::check_close(layer.weight, c.at("weight"), {1e-12, 1e-12});
    CHECK(orthogonality_error(layer.weight) < 1e-14);
  }
}

TEST_CASE("parametrizations::orthogonal's forward, gradients and SGD steps match torch",
          "[nn][parametrize][orthogonal]") {
  {
    nn::Linear layer(4, 4);
    P::orthogonal(layer);
    test::check_layer(layer, "orthogonal_square_linear");
  }
  struct Case {
    const char* name;
    int64_t in, out;
    std::optional<std::string> map;
    bool trivialization;
  };
  for (const Case& k : {Case{"orthogonal_square_sgd", 4, 4, std::nullopt, true},
                        Case{"orthogonal_tall_householder_sgd", 3, 5, std::nullopt, true},
                        Case{"orthogonal_wide_matrix_exp_sgd", 5, 3, "matrix_exp", true},
                        Case{"orthogonal_householder_no_trivialization_sgd", 3, 5, std::nullopt, false},
                        Case{"orthogonal_square_cayley_sgd", 4, 4, "cayley", true},
                        Case{"orthogonal_tall_cayley_sgd", 3, 5, "cayley", true}}) {
    INFO(k.name);
    nn::Linear layer(k.in, k.out);
    P::orthogonal(layer, "weight", k.map, k.trivialization);
    test::check_sgd_steps(layer, k.name);  // loads PyTorch's original (and base), then three steps
    CHECK(orthogonality_error(layer.weight) < 1e-12);
  }
}

TEST_CASE("parametrizations::orthogonal keeps batches of matrices orthogonal through training, in float32 too",
          "[nn][parametrize][orthogonal]") {
  Generator gen(11);
  for (DType dt : {kFloat64, kFloat32}) {
    for (const Shape& shape : {Shape{2, 5, 3}, Shape{2, 3, 5}, Shape{3, 4, 4}}) {
      for (const char* map : {"matrix_exp", "householder", "cayley"}) {
        INFO(dtype_name(dt) << " " << shape.str() << " " << map);
        Holder h(randn(shape, TensorOptions(dt), &gen));
        P::orthogonal(h, "weight", std::string(map));
        const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
        CHECK(orthogonality_error(h.weight) < tol);
        // A few steps that pull the weight away from its start keep it orthogonal.
        optim::SGD opt(h.parameters(), {.lr = 0.5});
        const Tensor x = randn({7, shape[1]}, TensorOptions(dt), &gen);
        const Tensor target = randn({shape[0], 7, shape[2]}, TensorOptions(dt), &gen);
        double first = 0, last = 0;
        for (int step = 0; step < 5; ++step) {
          opt.zero_grad();
          Tensor loss = (h(x) - target).pow(2).mean();
          loss.backward();
          opt.step();
          (step == 0 ? first : last) = loss.to(kFloat64).item<double>();
        }
        CHECK(last < first);  // the original moved
        h(x);                 // the weight of the last step's parameters
        CHECK(orthogonality_error(h.weight) < tol);
      }
    }
  }
}

TEST_CASE("parametrizations::orthogonal's matrix exponential stays orthogonal far from the start",
          "[nn][parametrize][orthogonal]") {
  // An original of norm about 30: exp of a large skew-symmetric matrix, whose Taylor polynomial alone
  // would be far off (scaling and squaring).
  Generator gen(5);
  Holder h(randn({6, 6}, TensorOptions(kFloat64), &gen));
  P::orthogonal(h);
  {
    NoGradGuard no_grad;
    for (auto& [key, p] : h.named_parameters()) {
      if (key == "parametrizations.weight.original") p.copy_(randn({6, 6}, TensorOptions(kFloat64), &gen) * 5.0);
    }
  }
  h(ones({1, 6}, kFloat64));
  CHECK(orthogonality_error(h.weight) < 1e-12);
}

TEST_CASE("parametrizations::orthogonal's Errors name what is wrong", "[nn][parametrize][orthogonal][errors]") {
  nn::Linear layer(3, 4);
  test::check_error([&] { P::orthogonal(layer, "bias"); }, {"matrix or batch of matrices", "1 dimensions"});
  test::check_error([&] { P::orthogonal(layer, "weight", std::string("cayley"), false); },
                    {"use_trivialization=false", "Cayley", "householder"});
  test::check_error([&] { P::orthogonal(layer, "weight", std::string("qr")); }, {"has to be one of", "\"qr\""});
  test::check_error([&] { P::orthogonal(layer, "kernel"); }, {"no parameter or buffer with name 'kernel'"});
  test::check_error([&] { P::orthogonal(layer, "weight", std::string("matrix_exp"), false); },
                    {"use_trivialization=false", "householder"});
  CHECK_FALSE(nn::utils::parametrize::is_parametrized(layer));  // each Error left the layer as it was
}

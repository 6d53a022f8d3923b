// tests/nn/test_parametrize.cpp: nn::utils::parametrize (register_parametrization, is_parametrized,
// remove_parametrizations) and nn::utils::parametrizations (spectral_norm, weight_norm; nn/parametrize.h)
// against PyTorch 1.13 (goldens of tests/fixtures/gen_nn_golden.py: a symmetric and a scaled symmetric
// Linear, the new spectral_norm on weights and on a bias, their gradients, SGD steps, reprs, what
// remove_parametrizations leaves), PyTorch 2.1's weight_norm against a float64 composition, buffers,
// and the Errors.
#include "nn/nn_golden.h"
#include "support.h"

using namespace kiln;
using test::check_layer;
using test::check_sgd_steps;
using test::names_of;
using test::nn_case;
namespace parametrize = nn::utils::parametrize;
namespace parametrizations = nn::utils::parametrizations;

namespace {

struct Symmetric : nn::Module {
  Tensor forward(const Tensor& x) override { return x.triu() + x.triu(1).transpose(0, 1); }
};

struct RowScale : nn::Module {  // a parametrization with a parameter of its own
  Tensor scale;
  explicit RowScale(int64_t rows) { scale = register_parameter("scale", ones({rows, 1})); }
  Tensor forward(const Tensor& x) override { return x * scale; }
};

struct Rows : nn::Module {  // changes the shape
  Tensor forward(const Tensor& x) override { return x.narrow(0, 0, 1); }
};

struct ToDouble : nn::Module {  // changes the dtype
  Tensor forward(const Tensor& x) override { return x.to(kFloat64); }
};

// exp of a log kept as the original: a parametrization whose right_inverse is not the identity.
struct Positive : parametrize::Parametrization {
  Tensor forward(const Tensor& x) override { return x.exp(); }
  std::vector<Tensor> right_inverse(const Tensor& value) override { return {value.log()}; }
};

void symmetric_scaled(nn::Linear& linear) {
  parametrize::register_parametrization(linear, "weight", std::make_shared<Symmetric>());
  parametrize::register_parametrization(linear, "weight", std::make_shared<RowScale>(3));
}

}  // namespace

TEST_CASE("register_parametrization matches torch: a symmetric weight, then scaled by a parameter of its own",
          "[nn][parametrize]") {
  nn::Linear a(3, 3);
  parametrize::register_parametrization(a, "weight", std::make_shared<Symmetric>());
  CHECK(names_of(a.named_parameters()) == std::vector<std::string>{"bias", "parametrizations.weight.original"});
  check_layer(a, "parametrize_symmetric");
  test::check_close(a.weight, a.weight.t());
  nn::Linear b(3, 3);
  symmetric_scaled(b);
  CHECK(names_of(b.named_parameters()) ==
        std::vector<std::string>{"bias", "parametrizations.weight.original", "parametrizations.weight.1.scale"});
  check_layer(b, "parametrize_symmetric_scaled");
  nn::Linear c(3, 3);
  symmetric_scaled(c);
  check_sgd_steps(c, "parametrize_symmetric_scaled_sgd");
}

TEST_CASE("parametrizations::spectral_norm matches torch: u first in the power iteration, _u and _v, a 1-d bias",
          "[nn][parametrize][spectral_norm]") {
  nn::Linear linear(4, 3);
  parametrizations::spectral_norm(linear);
  CHECK(names_of(linear.named_buffers()) ==
        std::vector<std::string>{"parametrizations.weight.0._u", "parametrizations.weight.0._v"});
  check_layer(linear, "parametrizations_spectral_linear");
  nn::ConvTranspose2d convt(3, 2, 2);  // dim 1 by default
  parametrizations::spectral_norm(convt);
  CHECK(convt.get_buffer("parametrizations.weight.0._u").sizes() == Shape{2});
  check_layer(convt, "parametrizations_spectral_conv_transpose2d_eval", /*train=*/false);
  nn::Conv2d conv(2, 3, 2);
  parametrizations::spectral_norm(conv, "weight", 3, 1e-4);
  check_layer(conv, "parametrizations_spectral_conv2d_3_iterations");
  nn::Linear bias(4, 3);
  parametrizations::spectral_norm(bias, "bias");  // a vector: normalised, no buffers
  CHECK(bias.named_buffers().empty());
  check_layer(bias, "parametrizations_spectral_bias");
  nn::Linear trained(4, 3);
  parametrizations::spectral_norm(trained);
  check_sgd_steps(trained, "parametrizations_spectral_sgd");
}

TEST_CASE("parametrized modules print as torch's", "[nn][parametrize]") {
  nn::Sequential seq;
  auto a = std::make_shared<nn::Linear>(3, 3);
  symmetric_scaled(*a);
  seq.push_back(a);
  auto b = std::make_shared<nn::Linear>(4, 3);
  parametrizations::spectral_norm(*b);
  seq.push_back(b);
  const std::string repr = seq.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == nn_case("parametrize_reprs").strings.at("repr"));
  parametrize::remove_parametrizations(*a, "weight");
  CHECK(a->to_string().rfind("Linear(in_features=3, out_features=3, bias=True)", 0) == 0);
}

TEST_CASE("remove_parametrizations leaves the parametrized value or the original, as torch", "[nn][parametrize]") {
  const test::NnCase& c = nn_case("remove_parametrizations");
  nn::Linear a(3, 3);
  symmetric_scaled(a);
  a.to(kFloat64);
  a.load_state_dict(c.state());
  const TensorImpl* handle = a.weight.impl();
  CHECK(parametrize::is_parametrized(a));
  CHECK(parametrize::is_parametrized(a, "weight"));
  CHECK_FALSE(parametrize::is_parametrized(a, "bias"));
  parametrize::remove_parametrizations(a, "weight");
  CHECK_FALSE(parametrize::is_parametrized(a));
  CHECK(a.named_children().empty());  // the ModuleDict goes with the last one
  CHECK(names_of(a.named_parameters()) == std::vector<std::string>{"bias", "weight"});
  CHECK(a.weight.impl() == handle);  // the layer's own handle, a parameter again
  CHECK(a.weight.is_leaf());
  CHECK(a.weight.requires_grad());
  test::check_close(a.weight, c.at("left"));
  nn::Linear b(3, 3);
  parametrize::register_parametrization(b, "weight", std::make_shared<Symmetric>());
  b.to(kFloat64);
  {
    NoGradGuard no_grad;
    b.get_parameter("parametrizations.weight.original").copy_(c.at("p.parametrizations.weight.original"));
  }
  parametrize::remove_parametrizations(b, "weight", /*leave_parametrized=*/false);
  test::check_close(b.weight, c.at("original"));
  // And a tensor can be parametrized again after that.
  parametrize::register_parametrization(b, "weight", std::make_shared<Symmetric>());
  CHECK(parametrize::is_parametrized(b, "weight"));
}

TEST_CASE("parametrizations::weight_norm keeps g and v as original0 and original1, PyTorch 2.1's names",
          "[nn][parametrize][weight_norm]") {
  nn::Conv1d conv(2, 3, 3);
  conv.to(kFloat64);
  const Tensor w0 = conv.weight.detach().clone();
  parametrizations::weight_norm(conv);
  CHECK(names_of(conv.named_parameters()) ==
        std::vector<std::string>{"bias", "parametrizations.weight.original0", "parametrizations.weight.original1"});
  Tensor g = conv.get_parameter("parametrizations.weight.original0");
  Tensor v = conv.get_parameter("parametrizations.weight.original1");
  CHECK(g.sizes() == Shape{3, 1, 1});
  test::check_close(v, w0);
  test::check_close(conv.weight, w0);  // g v / ||v|| is w at the start
  {
    NoGradGuard no_grad;
    g.copy_(test::sample({3, 1, 1}, kFloat64, 0.2));
    v.copy_(test::sample({3, 2, 3}, kFloat64, 0.3));
  }
  const Tensor x = test::sample({2, 2, 5}, kFloat64, 0.4);
  const Tensor out = conv(x);
  const Tensor cot = test::sample(out.sizes(), kFloat64, 0.5);
  (out * cot).sum().backward();
  auto leaf = [](const Tensor& t) { return t.detach().clone().requires_grad_(true); };
  const Tensor gr = leaf(g), vr = leaf(v);
  const Tensor ref = conv1d(x, vr * (gr / vr.norm(2, {1, 2}, true)), conv.bias.detach());
  test::check_close(out, ref);
  (ref * cot).sum().backward();
  test::check_close(g.grad(), gr.grad());
  test::check_close(v.grad(), vr.grad());
  // dim = nullopt: one norm over the whole tensor; removing it leaves g v / ||v||.
  nn::Linear linear(3, 2);
  parametrizations::weight_norm(linear, "weight", std::nullopt);
  CHECK(linear.get_parameter("parametrizations.weight.original0").dim() == 0);
  test::check_error([&] { parametrize::remove_parametrizations(linear, "weight", false); },
                    {"remove_parametrizations", "sequence of tensors"});
  const Tensor before = linear.weight.detach().clone();
  parametrize::remove_parametrizations(linear, "weight");
  test::check_close(linear.weight, before);
}

TEST_CASE("a parametrized buffer stays a buffer, and a right_inverse sets the original", "[nn][parametrize]") {
  nn::BatchNorm1d bn(3);
  bn.eval();
  {
    NoGradGuard no_grad;
    bn.running_var.copy_(tensor({0.5f, 2.0f, 4.0f}));
  }
  parametrize::register_parametrization(bn, "running_var", std::make_shared<Positive>());
  CHECK(names_of(bn.named_buffers()) ==
        std::vector<std::string>{"running_mean", "num_batches_tracked", "parametrizations.running_var.original"});
  // The original is log(value); each forward reads exp(original).
  test::check_close(bn.get_buffer("parametrizations.running_var.original"), tensor({0.5f, 2.0f, 4.0f}).log());
  {
    NoGradGuard no_grad;
    bn.get_buffer("parametrizations.running_var.original").copy_(tensor({0.0f, 0.0f, 0.0f}));
  }
  const Tensor x = test::sample({2, 3}, kFloat32, 0.3);
  test::check_close(bn(x), x * bn.weight.detach() / std::sqrt(1.0 + 1e-5) + bn.bias.detach());
  parametrize::remove_parametrizations(bn, "running_var");
  CHECK(names_of(bn.named_buffers()) == std::vector<std::string>{"running_mean", "num_batches_tracked", "running_var"});
  test::check_close(bn.running_var, ones({3}));
}

TEST_CASE("register_parametrization refuses what it cannot do with an Error and leaves the module as it was",
          "[nn][parametrize][errors]") {
  nn::Linear linear(3, 3);
  test::check_error([&] { parametrize::register_parametrization(linear, "foo", std::make_shared<Symmetric>()); },
                    {"Linear does not have a parameter, a buffer, or a parametrized element with name 'foo'"});
  test::check_error([&] { parametrize::register_parametrization(linear, "weight", std::make_shared<Rows>()); },
                    {"may not change the shape", "[3, 3] before, [1, 3] after"});
  test::check_error([&] { parametrize::register_parametrization(linear, "weight", std::make_shared<ToDouble>()); },
                    {"may not change the dtype", "float32 before, float64 after"});
  test::check_error([&] { parametrize::register_parametrization(linear, "weight", nullptr); }, {"null"});
  CHECK(names_of(linear.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(linear.named_children().empty());
  parametrize::register_parametrization(linear, "weight", std::make_shared<Rows>(), /*unsafe=*/true);
  CHECK(linear.weight.sizes() == Shape{1, 3});  // unsafe: the shape may change
  parametrize::register_parametrization(linear, "bias", std::make_shared<ToDouble>(), /*unsafe=*/true);
  CHECK(linear.bias.dtype() == kFloat64);  // unsafe: the dtype may change
  // A parametrization that fails on the tensor fails at registration, unsafe or not, with the module unchanged.
  nn::Linear d(3, 3);
  test::check_error([&] { parametrize::register_parametrization(d, "bias", std::make_shared<Symmetric>(), true); },
                    {"triu"});
  CHECK(names_of(d.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  CHECK(d.named_children().empty());
  test::check_error([&] { parametrize::remove_parametrizations(linear, "foo"); },
                    {"remove_parametrizations", "does not have a parametrization on foo"});
  // Appending: checked against the current value.
  nn::Linear b(3, 3);
  parametrize::register_parametrization(b, "weight", std::make_shared<Symmetric>());
  test::check_error([&] { parametrize::register_parametrization(b, "weight", std::make_shared<Rows>()); },
                    {"may not change the shape"});
  CHECK(b.get_submodule("parametrizations.weight").children().size() == 1);
  parametrizations::spectral_norm(b);  // appended, on the parametrized value, as PyTorch's getattr gives it
  CHECK(b.get_submodule("parametrizations.weight").children().size() == 2);
  CHECK(b.get_buffer("parametrizations.weight.1._u").sizes() == Shape{3});
  // Holders: an optimizer made first, a layer that looks its parameters up by name.
  nn::Linear early(3, 3);
  optim::SGD opt(early.parameters(), {.lr = 0.1});
  test::check_error([&] { parametrizations::spectral_norm(early); }, {"'weight' of Linear is held elsewhere as well"});
  nn::GRU gru(2, 3);
  test::check_error([&] { parametrizations::weight_norm(gru, "weight_ih_l0"); },
                    {"GRU keeps no member handle on its tensor 'weight_ih_l0'"});
  test::check_error([&] { parametrizations::spectral_norm(b, "weight", 0); }, {"n_power_iterations=0"});
  CHECK(b.get_submodule("parametrizations.weight").children().size() == 2);
  test::check_error([&] { parametrizations::spectral_norm(early, "weight", 1, 1e-12, 2); },
                    {"dim 2 is out of range", "[-2, 1]"});
  test::check_error([&] { parametrizations::weight_norm(early, "missing"); },
                    {"has no parameter or buffer with name 'missing'"});
  // Several originals need forward_originals.
  struct Split : parametrize::Parametrization {
    std::vector<Tensor> right_inverse(const Tensor& value) override { return {value, value}; }
  };
  nn::Linear c(2, 2);
  test::check_error([&] { parametrize::register_parametrization(c, "weight", std::make_shared<Split>()); },
                    {"Split's right_inverse gives 2 tensors", "forward_originals"});
}

TEST_CASE("parametrize::Cached computes a parametrized weight once per scope, and backward goes through it once",
          "[nn][parametrize]") {
  struct Counting : nn::Module {  // a symmetric weight that counts its computations
    Tensor forward(const Tensor& x) override {
      ++calls;
      return x.triu() + x.triu(1).transpose(0, 1);
    }
    int calls = 0;
  };
  const Tensor w = test::sample({3, 3}, kFloat64), x = test::sample({4, 3}, kFloat64, 0.8);
  // Three calls of the same layer, inside a scope and without one: the same outputs and gradients.
  auto run = [&](bool cached) {
    nn::Linear layer(3, 3, {.bias = false});
    layer.to(kFloat64);
    {
      NoGradGuard no_grad;
      layer.weight.copy_(w);
    }
    auto counting = std::make_shared<Counting>();
    parametrize::register_parametrization(layer, "weight", counting);
    const int at_registration = counting->calls;
    Tensor total;
    {
      std::optional<parametrize::Cached> scope;
      if (cached) scope.emplace();
      std::optional<parametrize::Cached> nested;  // a nested scope changes nothing
      if (cached) nested.emplace();
      Tensor h = x;
      for (int step = 0; step < 3; ++step) h = layer(h).tanh();
      total = h.sum();
    }
    CHECK(counting->calls - at_registration == (cached ? 1 : 3));
    total.backward();
    Tensor grad;
    for (const auto& [key, p] : layer.named_parameters()) {
      if (key == "parametrizations.weight.original") grad = p.grad();
    }
    REQUIRE(grad.defined());
    layer(x);  // after the scope: computed again
    CHECK(counting->calls - at_registration == (cached ? 2 : 4));
    return std::pair{total.detach(), grad};
  };
  auto [plain_total, plain_grad] = run(false);
  auto [cached_total, cached_grad] = run(true);
  test::check_close(cached_total, plain_total, {1e-14, 1e-14});
  test::check_close(cached_grad, plain_grad, {1e-14, 1e-14});
}

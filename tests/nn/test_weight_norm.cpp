// tests/nn/test_weight_norm.cpp: nn::utils::weight_norm, spectral_norm and their remove_* (nn/weight_norm.h)
// against PyTorch 1.13's (goldens of tests/fixtures/gen_nn_golden.py: outputs, spectral_norm's buffers
// after its power iteration, every gradient, three SGD steps, the weight remove_* leaves), the names
// and order of the parameters and buffers, the weight in the layer's own handle, a layer run twice
// before one backward against a float64 composition, and the Errors.
#include "nn/nn_golden.h"
#include "support.h"

using namespace kiln;
using test::check_layer;
using test::check_sgd_steps;
using test::names_of;
using test::nn_case;

namespace {

// The case's p.<prefix>* entries as a state dict, without the prefix.
TensorDict prefixed_state(const test::NnCase& c, const std::string& prefix) {
  TensorDict out;
  for (const auto& [key, t] : c.tensors) {
    if (key.rfind("p." + prefix, 0) == 0) out.insert(key.substr(2 + prefix.size()), t);
  }
  return out;
}

}  // namespace

TEST_CASE("weight_norm matches torch: outputs and the gradients of weight_g, weight_v, bias and the input",
          "[nn][weight_norm]") {
  nn::Linear linear(4, 3);
  nn::utils::weight_norm(linear);
  check_layer(linear, "weight_norm_linear");
  nn::Conv1d conv1(2, 3, 3);
  nn::utils::weight_norm(conv1, "weight", std::nullopt);
  CHECK(conv1.get_parameter("weight_g").dim() == 0);
  check_layer(conv1, "weight_norm_conv1d_whole");
  nn::Conv2d conv2(2, 3, 2);
  nn::utils::weight_norm(conv2, "weight", 1);
  CHECK(conv2.get_parameter("weight_g").sizes() == Shape{1, 2, 1, 1});
  check_layer(conv2, "weight_norm_conv2d_dim1");
  nn::ConvTranspose1d convt(3, 2, 3);
  nn::utils::weight_norm(convt, "weight", -2);  // dim 1 of (3, 2, 3)
  CHECK(convt.get_parameter("weight_g").sizes() == Shape{1, 2, 1});
  check_layer(convt, "weight_norm_conv_transpose1d_last");
}

TEST_CASE("weight_norm's dim -1 is one norm over the whole weight, as PyTorch's", "[nn][weight_norm]") {
  nn::Conv1d conv(2, 3, 3);
  nn::utils::weight_norm(conv, "weight", -1);
  CHECK(conv.get_parameter("weight_g").dim() == 0);
  check_layer(conv, "weight_norm_conv1d_whole");
}

TEST_CASE("spectral_norm matches torch: outputs, the power iteration's u and v, and the gradients",
          "[nn][spectral_norm]") {
  nn::Linear linear(4, 3);
  nn::utils::spectral_norm(linear);
  check_layer(linear, "spectral_norm_linear");  // after.weight_u and after.weight_v: one iteration
  nn::Linear frozen(4, 3);
  nn::utils::spectral_norm(frozen);
  check_layer(frozen, "spectral_norm_linear_eval", /*train=*/false);
  test::check_equal(frozen.get_buffer("weight_u"), nn_case("spectral_norm_linear_eval").at("p.weight_u"));
  nn::Conv2d conv(2, 3, 2);
  nn::utils::spectral_norm(conv, "weight", 3, 1e-4);
  check_layer(conv, "spectral_norm_conv2d_3_iterations");
  nn::ConvTranspose2d convt(3, 2, 2);  // rows: dim 1 by default, as PyTorch's
  nn::utils::spectral_norm(convt);
  CHECK(convt.get_buffer("weight_u").sizes() == Shape{2});
  CHECK(convt.get_buffer("weight_v").sizes() == Shape{12});
  check_layer(convt, "spectral_norm_conv_transpose2d");
  nn::Conv1d conv1(2, 3, 3);
  nn::utils::spectral_norm(conv1, "weight", 1, 1e-12, -1);  // dim 2
  CHECK(conv1.get_buffer("weight_u").sizes() == Shape{3});
  check_layer(conv1, "spectral_norm_conv1d_dim2");
}

TEST_CASE("weight_norm and spectral_norm train as torch's: three SGD steps with momentum", "[nn][weight_norm]") {
  nn::Linear a(4, 3);
  nn::utils::weight_norm(a);
  check_sgd_steps(a, "weight_norm_sgd");
  nn::Linear b(4, 3);
  nn::utils::spectral_norm(b);
  check_sgd_steps(b, "spectral_norm_sgd");
}

TEST_CASE("weight_norm and spectral_norm name their tensors as PyTorch's, and remove_* puts the weight back",
          "[nn][weight_norm]") {
  const test::NnCase& c = nn_case("remove_norms");
  nn::Linear linear(4, 3);
  nn::utils::weight_norm(linear);
  CHECK(names_of(linear.named_parameters()) == std::vector<std::string>{"bias", "weight_g", "weight_v"});
  CHECK(linear.get_parameter("weight_g").sizes() == Shape{3, 1});
  nn::Conv2d conv(2, 3, 2);
  nn::utils::spectral_norm(conv);
  CHECK(names_of(conv.named_parameters()) == std::vector<std::string>{"bias", "weight_orig"});
  CHECK(names_of(conv.named_buffers()) == std::vector<std::string>{"weight_u", "weight_v"});
  std::vector<std::string> keys;
  for (const auto& [key, t] : conv.state_dict()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"bias", "weight_orig", "weight_u", "weight_v"});
  // spectral_norm's u and v start as unit vectors; the layer reads the raw weight until its first forward.
  CHECK(conv.get_buffer("weight_u").norm().item<double>() == Approx(1.0));
  CHECK(conv.get_buffer("weight_v").norm().item<double>() == Approx(1.0));
  test::check_equal(conv.weight, conv.get_parameter("weight_orig").detach());
  CHECK_FALSE(conv.weight.requires_grad());

  linear.to(kFloat64);
  conv.to(kFloat64);
  linear.load_state_dict(prefixed_state(c, "weight_norm."));
  conv.load_state_dict(prefixed_state(c, "spectral_norm."));
  const TensorImpl* linear_handle = linear.weight.impl();
  const TensorImpl* conv_handle = conv.weight.impl();
  nn::utils::remove_weight_norm(linear);
  nn::utils::remove_spectral_norm(conv);
  CHECK(names_of(linear.named_parameters()) == std::vector<std::string>{"bias", "weight"});
  CHECK(names_of(conv.named_parameters()) == std::vector<std::string>{"bias", "weight"});
  CHECK(conv.named_buffers().empty());
  test::check_close(linear.weight, c.at("weight_norm.weight"));
  test::check_close(conv.weight, c.at("spectral_norm.weight"));  // sigma from u and v as they are
  // The layer's own handle, a leaf parameter again.
  CHECK(linear.weight.impl() == linear_handle);
  CHECK(linear.get_parameter("weight").is_same(linear.weight));
  CHECK(conv.weight.impl() == conv_handle);
  CHECK(linear.weight.is_leaf());
  CHECK(linear.weight.requires_grad());
  // And it can be normalised again.
  nn::utils::weight_norm(linear);
  CHECK(names_of(linear.named_parameters()) == std::vector<std::string>{"bias", "weight_g", "weight_v"});
  test::check_close(linear(ones({1, 4}, kFloat64)),
                    ones({1, 4}, kFloat64).matmul(c.at("weight_norm.weight").t()) + linear.bias.detach());
}

TEST_CASE("weight_norm recomputes the layer's weight before each call, from the parameters as they are now",
          "[nn][weight_norm]") {
  nn::Linear linear(3, 2);
  linear.to(kFloat64);
  nn::utils::weight_norm(linear);
  const Tensor handle = linear.weight;
  Tensor g = linear.get_parameter("weight_g"), v = linear.get_parameter("weight_v");
  {
    NoGradGuard no_grad;
    g.copy_(test::sample({2, 1}, kFloat64, 0.3));
    v.copy_(test::sample({2, 3}, kFloat64, 0.8));
  }
  const Tensor x = test::sample({4, 3}, kFloat64, 0.1);
  const Tensor y = linear(x);
  const Tensor expected_w = v.detach() * g.detach() / v.detach().norm(2, {1}, true);
  test::check_close(linear.weight, expected_w);
  CHECK(linear.weight.is_same(handle));
  CHECK_FALSE(linear.weight.is_leaf());  // a graph back to weight_g and weight_v
  test::check_close(y, x.matmul(expected_w.t()) + linear.bias.detach());
  // In a no_grad forward the weight carries no graph.
  {
    NoGradGuard no_grad;
    g.mul_(2.0);
    linear(x);
  }
  CHECK(linear.weight.is_leaf());
  CHECK_FALSE(linear.weight.requires_grad());
  test::check_close(linear.weight, expected_w * 2.0);
  // The parameters moved to float32: the next forward's weight follows.
  linear.to(kFloat32);
  CHECK(linear(x.to(kFloat32)).dtype() == kFloat32);
  CHECK(linear.weight.dtype() == kFloat32);
}

TEST_CASE("a weight-normalised layer run twice before one backward gives the composition's gradients",
          "[nn][weight_norm]") {
  // As an RNN cell over time steps: both forwards' graphs lead back to weight_g and weight_v.
  nn::Linear cell(3, 3);
  cell.to(kFloat64);
  nn::utils::weight_norm(cell, "weight", 1);
  nn::Linear head(3, 2);
  head.to(kFloat64);
  nn::utils::spectral_norm(head);
  head.eval();  // no power iteration: u and v stay, so the reference below sees the same sigma
  const Tensor x = test::sample({2, 3}, kFloat64, 0.4);
  const Tensor out = head(cell(cell(x).tanh()));
  const Tensor cot = test::sample(out.sizes(), kFloat64, 0.9);
  (out * cot).sum().backward();

  // The reference: the same functions of fresh leaves holding the same values.
  auto leaf = [](const Tensor& t) { return t.detach().clone().requires_grad_(true); };
  Tensor g = leaf(cell.get_parameter("weight_g")), v = leaf(cell.get_parameter("weight_v"));
  Tensor b = leaf(cell.bias), orig = leaf(head.get_parameter("weight_orig")), hb = leaf(head.bias);
  const Tensor u = head.get_buffer("weight_u"), hv = head.get_buffer("weight_v");
  const Tensor w = v * (g / v.norm(2, {0}, true));
  const Tensor hw = orig / (u * orig.matmul(hv)).sum();
  const Tensor h = (x.matmul(w.t()) + b).tanh().matmul(w.t()) + b;
  const Tensor ref = h.matmul(hw.t()) + hb;
  test::check_close(out, ref);
  (ref * cot).sum().backward();
  test::check_close(cell.get_parameter("weight_g").grad(), g.grad());
  test::check_close(cell.get_parameter("weight_v").grad(), v.grad());
  test::check_close(cell.bias.grad(), b.grad());
  test::check_close(head.get_parameter("weight_orig").grad(), orig.grad());
  test::check_close(head.bias.grad(), hb.grad());
}

TEST_CASE("a spectrally normalised layer run twice in training mode: each forward's graph keeps its own sigma",
          "[nn][spectral_norm]") {
  // As a GAN's discriminator on the real and then the fake batch before one backward: the second
  // forward's power iteration changes u, v and the weight, which the first graph must not see.
  nn::Linear layer(3, 3);
  layer.to(kFloat64);
  nn::utils::spectral_norm(layer);
  const Tensor x = test::sample({2, 3}, kFloat64, 0.6).requires_grad_(true);
  Tensor u = layer.get_buffer("weight_u").clone(), v = layer.get_buffer("weight_v").clone();
  const Tensor out = layer(layer(x).tanh());
  const Tensor cot = test::sample(out.sizes(), kFloat64, 0.7);
  (out * cot).sum().backward();

  const Tensor orig = layer.get_parameter("weight_orig").detach().clone().requires_grad_(true);
  const Tensor x2 = x.detach().clone().requires_grad_(true);
  const nn::functional::NormalizeOptions unit{.dim = 0};
  auto normalised = [&] {  // one power iteration from (u, v), then W / sigma
    const Tensor w = orig.detach();
    v = nn::functional::normalize(w.t().matmul(u), unit);
    u = nn::functional::normalize(w.matmul(v), unit);
    return orig / (u * orig.matmul(v)).sum();
  };
  const Tensor w1 = normalised();
  const Tensor h = (x2.matmul(w1.t()) + layer.bias.detach()).tanh();
  const Tensor w2 = normalised();
  const Tensor ref = h.matmul(w2.t()) + layer.bias.detach();
  CHECK((w1 - w2).abs().max().item<double>() > 1e-6);  // the two forwards' weights differ
  test::check_close(out, ref);
  (ref * cot).sum().backward();
  test::check_close(x.grad(), x2.grad());
  test::check_close(layer.get_parameter("weight_orig").grad(), orig.grad());
  test::check_close(layer.get_buffer("weight_u"), u);
}

TEST_CASE("spectral_norm iterates u and v in training mode only", "[nn][spectral_norm]") {
  nn::Linear linear(5, 4);
  linear.to(kFloat64);
  nn::utils::spectral_norm(linear, "weight", 2);
  const Tensor u0 = linear.get_buffer("weight_u").clone();
  const Tensor x = test::sample({3, 5}, kFloat64, 0.2);
  linear.eval();
  linear(x);
  test::check_equal(linear.get_buffer("weight_u"), u0);
  linear.train();
  for (int i = 0; i < 30; ++i) linear(x);
  // After many iterations sigma is the largest singular value: the weight's is then 1, so
  // ||W v|| = 1 for the top right singular vector v that the buffer now holds.
  const Tensor w = linear.weight.detach();
  CHECK((w.matmul(linear.get_buffer("weight_v"))).norm().item<double>() == Approx(1.0).epsilon(1e-6));
  CHECK((linear.get_buffer("weight_u") - u0).abs().max().item<double>() > 1e-3);
}

TEST_CASE("weight_norm and spectral_norm refuse what they cannot do with an Error", "[nn][weight_norm][errors]") {
  nn::Linear linear(3, 2);
  nn::utils::weight_norm(linear);
  test::check_error([&] { nn::utils::weight_norm(linear); },
                    {"weight_norm", "cannot register two weight_norm hooks on the same parameter weight"});
  test::check_error([&] { nn::utils::spectral_norm(linear); }, {"spectral_norm", "has no parameter 'weight'"});
  test::check_error([&] { nn::utils::remove_spectral_norm(linear); },
                    {"remove_spectral_norm", "spectral_norm of 'weight' not found in Linear"});
  nn::Linear plain(3, 2);
  test::check_error([&] { nn::utils::remove_weight_norm(plain); }, {"weight_norm of 'weight' not found in Linear"});
  test::check_error([&] { nn::utils::weight_norm(plain, "foo"); }, {"Linear has no parameter 'foo'"});
  test::check_error([&] { nn::utils::weight_norm(plain, "weight", 2); },
                    {"weight_norm", "dim 2 is out of range", "[-2, 1]"});
  test::check_error([&] { nn::utils::spectral_norm(plain, "weight", 0); },
                    {"expected n_power_iterations to be positive", "n_power_iterations=0"});
  test::check_error([&] { nn::utils::spectral_norm(plain, "weight", 1, 0.0); }, {"eps must be positive"});
  test::check_error([&] { nn::utils::spectral_norm(plain, "weight", 1, 1e-12, -3); },
                    {"spectral_norm", "dim -3 is out of range"});
  // Nothing changed by the refusals.
  CHECK(names_of(plain.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  // A parameter with another holder: an optimizer made first, or a tied weight.
  nn::Linear early(3, 2);
  optim::SGD opt(early.parameters(), {.lr = 0.1});
  test::check_error(
      [&] { nn::utils::weight_norm(early); },
      {"weight_norm", "'weight' of Linear is held elsewhere as well", "before tying weights or making the optimizer"});
  nn::Embedding embedding(5, 3);
  nn::Linear head(3, 5, {.bias = false});
  head.weight = head.set_parameter("weight", embedding.weight);
  test::check_error([&] { nn::utils::spectral_norm(head); }, {"spectral_norm", "held elsewhere as well", "tied"});
  CHECK(names_of(head.named_parameters()) == std::vector<std::string>{"weight"});
  // A layer that looks its parameters up by name has no handle to recompute into.
  nn::LSTM lstm(3, 4);
  test::check_error([&] { nn::utils::weight_norm(lstm, "weight_hh_l0"); },
                    {"weight_norm", "LSTM keeps no member handle on its tensor 'weight_hh_l0'"});
  nn::ParameterList list;
  list.append(zeros({2, 2}));
  test::check_error([&] { nn::utils::spectral_norm(list, "0"); }, {"spectral_norm", "looks it up by name"});
}

TEST_CASE("weight_norm applies to the weights of every layer kind that has one", "[nn][weight_norm]") {
  // Each layer's forward through module(x) reads the recomputed weight: the output equals the layer's
  // before normalisation (w = g v / ||v|| is w itself at the start).
  auto same_output = [](nn::Module& layer, const std::string& name, const Tensor& x) {
    layer.to(kFloat64);
    NoGradGuard no_grad;  // a graph would hold the weight too
    const Tensor before = layer(x);
    nn::utils::weight_norm(layer, name);
    test::check_close(layer(x), before);
    layer.get_parameter(name + "_g").detach().mul_(2.0);  // and a change of g shows in the next call
    CHECK((layer(x) - before).abs().max().item<double>() > 1e-3);
  };
  nn::Conv3d conv3(2, 2, 2);
  same_output(conv3, "weight", test::sample({1, 2, 3, 3, 3}, kFloat64, 0.1));
  nn::ConvTranspose2d convt(2, 3, 2);
  same_output(convt, "weight", test::sample({1, 2, 3, 3}, kFloat64, 0.2));
  nn::Embedding embedding(6, 3);
  same_output(embedding, "weight", full({4}, 2, kInt64));
  nn::MultiheadAttention mha(4, 2);
  same_output(mha, "in_proj_weight", test::sample({3, 1, 4}, kFloat64, 0.4));
  nn::LayerNorm norm(3);
  same_output(norm, "weight", test::sample({2, 3}, kFloat64, 0.5));  // a 1-d parameter: g = |w_i|
  CHECK(norm.get_parameter("weight_g").sizes() == Shape{3});
  test::check_close(norm.get_parameter("weight_g"), full({3}, 2.0, kFloat64));  // |1| doubled
}

// tests/nn/test_layers.cpp: every layer against PyTorch (tests/fixtures/gen_nn_golden.py): the output,
// the buffers after the forward, and the gradients of the input and of every parameter for a random
// cotangent, all in float64 with torch's weights loaded through load_state_dict.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nn_golden.h"

using namespace kiln;
using kiln::test::check_layer;

TEST_CASE("Linear matches torch (3-D input, with and without bias)", "[nn][layers]") {
  nn::Linear a(4, 5);
  check_layer(a, "linear");
  nn::Linear b(4, 3, {.bias = false});
  CHECK_FALSE(b.bias.defined());
  check_layer(b, "linear_nobias");
}

TEST_CASE("Embedding matches torch and its padding row gets no gradient", "[nn][layers]") {
  nn::Embedding e(7, 3, {.padding_idx = 2});
  check_layer(e, "embedding_padding");
  nn::Embedding fresh(7, 3, {.padding_idx = -5});  // -5 is row 2, as in PyTorch
  CHECK(*fresh.padding_idx == 2);
  test::check_equal(fresh.weight[2].detach(), zeros({3}));
  test::check_error([] { nn::Embedding(7, 3, {.padding_idx = 7}); }, {"padding_idx 7", "[-7, 7)"});
}

TEST_CASE("Embedding's max_norm, norm_type and scale_grad_by_freq match torch", "[nn][layers]") {
  // The fixture checks the weight after the forward too: the referenced rows renormalised in place.
  nn::Embedding e(6, 4, {.padding_idx = 1, .max_norm = 1.0, .scale_grad_by_freq = true});
  check_layer(e, "embedding_max_norm");
  nn::Embedding l1(6, 4, {.max_norm = 2.5, .norm_type = 1.0});
  check_layer(l1, "embedding_max_norm_l1");
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::Embedding>(
      10, 3, nn::EmbeddingOptions{.padding_idx = 2, .max_norm = 1.0, .norm_type = 3.0, .scale_grad_by_freq = true}));
  reprs.push_back(std::make_shared<nn::Embedding>(10, 3, nn::EmbeddingOptions{.max_norm = 1.5}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("embedding_reprs").strings.at("repr"));

  // float32 and int32 indices, against a float64 composition: a row above max_norm is scaled by
  // max_norm / (norm + 1e-7), a row below it and the rows not referenced keep their bits.
  Tensor w = from_vector<float>({3, 4, 0.3f, 0.4f, -6, 8, 1, 1}, {4, 2});
  const Tensor before = w.clone();
  Tensor y = nn::functional::embedding(from_vector<int32_t>({0, 1, 0}), w, {.max_norm = 2.0});
  const double s = 2.0 / (5 + 1e-7);
  test::check_close(w[0], from_vector<double>({3 * s, 4 * s}).to(kFloat32), {1e-7, 0});
  test::check_equal(w.narrow(0, 1, 3), before.narrow(0, 1, 3));
  test::check_equal(y, stack({w[0], w[1], w[0]}));
  // No indices: nothing changes. A bfloat16 table is renormalised with a float32 factor.
  nn::functional::embedding(empty({0}, kInt64), w, {.max_norm = 0.1});
  test::check_equal(w.narrow(0, 1, 3), before.narrow(0, 1, 3));
  Tensor wb = before.to(kBFloat16);
  nn::functional::embedding_renorm_(wb, from_vector<int64_t>({2}), 1.0);
  test::check_close(wb[2].to(kFloat32), from_vector<float>({-0.6f, 0.8f}), {1e-2, 0});

  // scale_grad_by_freq: row 0 is referenced twice, so each reference passes half its gradient.
  Tensor t = ones({3, 2}, kFloat64).requires_grad_();
  nn::functional::embedding(from_vector<int64_t>({0, 2, 0}), t, {.scale_grad_by_freq = true}).sum().backward();
  test::check_equal(t.grad(), from_vector<double>({1, 1, 0, 0, 1, 1}, {3, 2}));

  test::check_error([] { nn::Embedding(3, 2, {.max_norm = -1.0}); }, {"nn::Embedding", "max_norm", "-1"});
  test::check_error([] { nn::Embedding(3, 2, {.max_norm = 1.0, .norm_type = 0}); }, {"nn::Embedding", "norm_type"});
  test::check_error([] { nn::functional::embedding(from_vector<int64_t>({0, 4}), ones({3, 2}), {.max_norm = 1.0}); },
                    {"embedding: ", "index 4", "[0, num_embeddings) = [0, 3)"});
  test::check_error(
      [] {
        Tensor v = ones({3});
        nn::functional::embedding_renorm_(v, from_vector<int64_t>({0}), 1.0);
      },
      {"embedding_renorm_", "2-D", "[3]"});
}

TEST_CASE("Embedding::from_pretrained shares the table, frozen unless told otherwise", "[nn][layers]") {
  Tensor table = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  auto frozen = nn::Embedding::from_pretrained(table, true, {.padding_idx = 0});
  CHECK(frozen->num_embeddings == 3);
  CHECK(frozen->embedding_dim == 2);
  CHECK_FALSE(frozen->weight.requires_grad());
  test::check_equal(frozen->weight, table);  // the padding row keeps its values
  test::check_equal((*frozen)(from_vector<int64_t>({2, 0})), from_vector<float>({5, 6, 1, 2}, {2, 2}));
  table[1].fill_(9);  // one storage, as PyTorch's Parameter(embeddings)
  CHECK(frozen->weight[1].to_vector<float>() == std::vector<float>{9, 9});
  auto trained = nn::Embedding::from_pretrained(table, false);
  CHECK(trained->weight.requires_grad());
  CHECK(trained->parameters().size() == 1);
  test::check_error([] { nn::Embedding::from_pretrained(ones({4})); },
                    {"nn::Embedding::from_pretrained", "2-D floating", "[4]"});
  test::check_error([] { nn::Embedding::from_pretrained(ones({2, 2}), true, {.padding_idx = 2}); },
                    {"padding_idx 2", "[-2, 2)"});
}

TEST_CASE("Negative layer sizes and a padding_idx out of range are Errors that name them", "[nn][layers]") {
  test::check_error([] { nn::Conv2d(1, 1, -2); }, {"nn::Conv2d", "kernel_size must be positive", "[-2, -2]"});
  test::check_error([] { nn::Conv2d(-1, 1, 3); }, {"nn::Conv2d", "in_channels (-1)", "non-negative"});
  test::check_error([] { nn::Conv1d(1, 1, 0); }, {"nn::Conv1d", "kernel_size", "[0]"});
  test::check_error([] { nn::Embedding(-3, 2); }, {"nn::Embedding", "num_embeddings (-3)"});
  test::check_error([] { nn::LayerNorm(Shape{-4}); }, {"nn::LayerNorm", "normalized_shape", "[-4]"});
  test::check_error([] { nn::RMSNorm(Shape{2, -1}); }, {"nn::RMSNorm", "[2, -1]"});
  test::check_error([] { nn::functional::embedding(from_vector<int64_t>({0}), ones({3, 2}), 5); },
                    {"embedding", "padding_idx 5", "[-3, 3)"});
  test::check_error([] { nn::functional::embedding(from_vector<int64_t>({0}), ones({3, 2}), -4); },
                    {"padding_idx -4"});
  // Errors in the layer's terms rather than an inner op's.
  test::check_error([] { nn::functional::embedding(from_vector<int64_t>({0, 6}), ones({3, 2})); },
                    {"embedding: ", "index 6", "[0, num_embeddings) = [0, 3)"});
  test::check_error([] { nn::functional::linear(scalar_tensor(1.0, kFloat32), ones({4, 3})); },
                    {"linear", "at least 1 dim", "in_features = 3", "0-d"});
  test::check_error([] { nn::functional::conv1d(ones({1, 2, 5}), ones({2, 2, 3}), {}, 1, -1); },
                    {"conv1d", "padding (-1) non-negative"});
  nn::GroupNorm gn(2, 4);
  test::check_error([&] { gn(ones({2, 6, 3})); }, {"group_norm", "[2, 6, 3] has 6 channels", "weight has 4"});
  // -1 is the last row: it gets no gradient.
  Tensor w = ones({3, 2}).requires_grad_();
  nn::functional::embedding(from_vector<int64_t>({2, 0}), w, -1).sum().backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{1, 1, 0, 0, 0, 0});
}

TEST_CASE("Activations match torch", "[nn][layers]") {
  nn::ReLU relu;
  check_layer(relu, "relu");
  nn::GELU gelu;
  check_layer(gelu, "gelu");
  nn::GELU gelu_tanh({.approximate = "tanh"});
  check_layer(gelu_tanh, "gelu_tanh");
  nn::SiLU silu;
  check_layer(silu, "silu");
  nn::Tanh tanh;
  check_layer(tanh, "tanh");
  nn::Sigmoid sigmoid;
  check_layer(sigmoid, "sigmoid");
  nn::Softmax softmax(1);
  check_layer(softmax, "softmax");
  nn::Flatten flatten;
  check_layer(flatten, "flatten");
  test::check_error([] { nn::GELU({.approximate = "fast"}); }, {"GELU", "'fast'"});
}

TEST_CASE("Sequential matches torch and names its children 0, 1, 2", "[nn][layers]") {
  nn::Sequential seq{nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2)};
  CHECK(seq.size() == 3);
  check_layer(seq, "sequential");
  CHECK(seq.state_dict().keys() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(seq.at<nn::Linear>(2).out_features == 2);
  test::check_error([&] { seq.at<nn::Linear>(1); }, {"element 1 is a ReLU"});
  test::check_error([&] { seq[3]; }, {"index 3 is out of range (3 modules)"});
}

TEST_CASE("Identity passes its input through", "[nn][layers]") {
  nn::Identity id;
  Tensor x = test::sample({2, 3});
  CHECK(id(x).is_same(x));
}

TEST_CASE("linear and embedding record one node each and pass gradcheck and gradgradcheck", "[nn][layers][gradcheck]") {
  using autograd::TensorList;
  Tensor x = test::sample({2, 3, 4}, kFloat64, 0.2).requires_grad_();
  Tensor w = test::sample({5, 4}, kFloat64, 0.7).requires_grad_();
  Tensor b = test::sample({5}, kFloat64, 1.3).requires_grad_();
  Tensor y = nn::linear(x, w, b);
  REQUIRE(y.grad_fn());
  CHECK(std::string(y.grad_fn()->name()) == "LinearBackward");
  auto fn = [](const TensorList& in) { return TensorList{nn::linear(in[0], in[1], in[2])}; };
  CHECK(autograd::gradcheck(fn, {x, w, b}));
  CHECK(autograd::gradgradcheck(fn, {x, w, b}));
  Tensor table = test::sample({6, 3}, kFloat64, 0.4).requires_grad_();
  Tensor idx = from_vector<int64_t>({1, 4, 4, 0, 5, 1}, {2, 3});
  auto emb = [&](const TensorList& in) { return TensorList{nn::embedding(idx, in[0])}; };
  CHECK(autograd::gradcheck(emb, {table}));
  // The padding row's gradient is exactly zero even though index 4 appears twice.
  Tensor g = autograd::grad({nn::embedding(idx, table, 4)}, {table}, {ones({2, 3, 3}, kFloat64)})[0];
  test::check_equal(g[4], zeros({3}, kFloat64));
  test::check_equal(g[1], full({3}, 2.0, kFloat64));
  test::check_error([&] { nn::linear(x, zeros({5, 3}, kFloat64)); },
                    {"linear", "last dim (4)", "in_features (3)"});
}

TEST_CASE("linear_graph_only records linear's node, and its gradients, without the product", "[nn][layers]") {
  using autograd::TensorList;
  Tensor x = test::sample({2, 3, 4}, kFloat64, 0.2).requires_grad_();
  Tensor w = test::sample({5, 4}, kFloat64, 0.7).requires_grad_();
  Tensor b = test::sample({5}, kFloat64, 1.3).requires_grad_();
  Tensor r = test::sample({2, 3, 5}, kFloat64, 0.9).requires_grad_();
  Tensor gy = test::sample({2, 3, 5}, kFloat64, 2.1);
  // The residual pattern checkpoint's recompute uses it in: r + linear(x, w, b), value never read.
  TensorList full = autograd::grad({r + nn::linear(x, w, b)}, {x, w, b, r}, {gy});
  Tensor y = nn::linear_graph_only(x, w, b);
  REQUIRE(y.grad_fn());
  CHECK(std::string(y.grad_fn()->name()) == "LinearBackward");
  CHECK(y.sizes() == Shape({2, 3, 5}));
  CHECK(y.dtype() == kFloat64);
  test::check_equal(y, zeros({2, 3, 5}, kFloat64));  // the product was not computed
  TensorList graph_only = autograd::grad({r + y}, {x, w, b, r}, {gy});
  for (size_t i = 0; i < full.size(); ++i) {
    INFO("input " << i);
    test::check_equal(graph_only[i], full[i]);
  }
  // Without a bias, and under autocast: the graph of linear's casts, so bfloat16 values and the same
  // float32 gradients.
  Tensor xf = x.detach().to(kFloat32).requires_grad_(), wf = w.detach().to(kFloat32).requires_grad_();
  Tensor gf = gy.to(kBFloat16);  // the gradient of a bfloat16 result
  TensorList want, got;
  {
    AutocastGuard bf16(Device::cpu(), kBFloat16);
    want = autograd::grad({nn::linear(xf, wf)}, {xf, wf}, {gf});
    Tensor y16 = nn::linear_graph_only(xf, wf);
    CHECK(y16.dtype() == kBFloat16);
    got = autograd::grad({y16}, {xf, wf}, {gf});
  }
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(got[i].dtype() == kFloat32);
    test::check_equal(got[i], want[i]);
  }
  test::check_error([&] { nn::linear_graph_only(x, zeros({5, 3}, kFloat64)); }, {"linear", "in_features (3)"});
  test::check_error([&] { nn::linear_graph_only(x, w.detach().to(kFloat32)); },
                    {"linear", "float64", "float32", "same dtype"});
}

TEST_CASE("linear records its node when only the bias requires grad", "[nn][layers]") {
  Tensor x = test::sample({3, 4}, kFloat64, 0.2), w = test::sample({5, 4}, kFloat64, 0.7);
  Tensor b = test::sample({5}, kFloat64, 1.3).requires_grad_();
  Tensor gy = test::sample({3, 5}, kFloat64, 2.1);
  Tensor y = nn::linear(x, w, b);
  REQUIRE(y.grad_fn());
  test::check_close(autograd::grad({y}, {b}, {gy})[0], gy.sum({0}), {1e-14, 1e-14});
  CHECK_FALSE(nn::linear(x, w).grad_fn());  // nothing requires grad: no node
  {
    NoGradGuard no_grad;
    CHECK_FALSE(nn::linear(x, w, b).grad_fn());
  }
}

TEST_CASE("linear_gelu equals gelu(linear(...)) in value and gradients, with and without bias", "[nn][layers]") {
  using autograd::TensorList;
  for (std::string approximate : {"none", "tanh"}) {
    for (Shape xs : {Shape{2, 3, 4}, Shape{4}}) {
      for (bool with_bias : {true, false}) {
        INFO(approximate << " input " << xs.str() << (with_bias ? " with" : " without") << " bias");
        Tensor x = test::sample(xs, kFloat64, 0.2).requires_grad_();
        Tensor w = test::sample({5, 4}, kFloat64, 0.7).requires_grad_();
        Tensor b = with_bias ? test::sample({5}, kFloat64, 1.3).requires_grad_() : Tensor{};
        Shape ys = xs;
        ys[ys.size() - 1] = 5;
        Tensor gy = test::sample(ys, kFloat64, 2.1);
        TensorList inputs = with_bias ? TensorList{x, w, b} : TensorList{x, w};
        Tensor want = nn::gelu(nn::linear(x, w, b), approximate);
        Tensor got = nn::linear_gelu(x, w, b, approximate);
        CHECK(got.sizes() == ys);
        test::check_close(got, want, {1e-14, 1e-14});
        TensorList gwant = autograd::grad({want}, inputs, {gy});
        TensorList ggot = autograd::grad({got}, inputs, {gy});
        for (size_t i = 0; i < inputs.size(); ++i) {
          INFO("input " << i);
          test::check_close(ggot[i], gwant[i], {1e-13, 1e-13});
        }
      }
    }
  }
  Tensor x = test::sample({2, 4}, kFloat64, 0.2), w = test::sample({5, 4}, kFloat64, 0.7);
  test::check_error([&] { nn::linear_gelu(x, zeros({5, 3}, kFloat64), zeros({5}, kFloat64)); },
                    {"linear", "last dim (4)", "in_features (3)"});
  test::check_error([&] { nn::linear_gelu(x, w, zeros({4}, kFloat64)); }, {"linear", "bias", "(5)"});
  test::check_error([&] { nn::linear_gelu(x, w, zeros({5}, kFloat64), "exact"); }, {"exact"});
  // Under autocast: linear's casts come first, so a bfloat16 input with float32 weights is linear's
  // case too, and the result is bfloat16, equal to the composition's to bfloat16's precision.
  Tensor xf = test::sample({3, 4}, kFloat32, 0.2), wf = test::sample({5, 4}, kFloat32, 0.7);
  Tensor bf = test::sample({5}, kFloat32, 1.3);
  AutocastGuard bf16(Device::cpu(), kBFloat16);
  for (const Tensor& input : {xf, xf.to(kBFloat16)}) {
    Tensor got = nn::linear_gelu(input, wf, bf, "tanh");
    CHECK(got.dtype() == kBFloat16);
    test::check_close(got.to(kFloat32), nn::gelu(nn::linear(input, wf, bf), "tanh").to(kFloat32), {2e-2, 2e-2});
  }
}

TEST_CASE("Embedding's backward refuses indices modified in place after the forward", "[nn][layers]") {
  nn::Embedding e(5, 2);
  Tensor idx = from_vector<int64_t>({1, 2}, {2});
  Tensor y = e(idx);
  idx.fill_(0);
  test::check_error([&] { y.sum().backward(); }, {"EmbeddingBackward"});
}

TEST_CASE("MultiheadAttention with its masks, kdim, vdim, add_bias_kv, add_zero_attn and attention weights "
          "matches torch: output, weights and every gradient", "[nn][attention]") {
  struct Case {
    const char* name;
    int64_t embed, heads;
    nn::MultiheadAttentionOptions options;
    std::optional<bool> average;  // forward_with_weights with average_attn_weights; unset: forward
  };
  const std::vector<Case> cases = {
      {"mha_float_mask_padding", 8, 2, {.batch_first = true}, {}},
      {"mha_bool_mask_padding", 8, 4, {}, {}},
      {"mha_float_mask_3d", 8, 2, {.bias = false, .batch_first = true}, {}},
      {"mha_kdim_vdim_bias_kv_zero_attn", 8, 2,
       {.add_bias_kv = true, .add_zero_attn = true, .kdim = 5, .vdim = 3, .batch_first = true}, {}},
      {"mha_bias_kv_bool_mask_3d", 8, 4, {.add_bias_kv = true}, {}},
      {"mha_zero_attn_kdim", 6, 3, {.bias = false, .add_zero_attn = true, .kdim = 4}, {}},
      {"mha_weights_averaged", 8, 2, {.batch_first = true}, true},
      {"mha_weights_per_head_bias_kv", 8, 4, {.add_bias_kv = true, .add_zero_attn = true, .vdim = 6}, false},
      {"mha_weights_unbatched", 4, 2, {}, true},
  };
  for (const Case& k : cases) {
    INFO("golden case " << k.name);
    const test::NnCase& c = test::nn_case(k.name);
    nn::MultiheadAttention mha(k.embed, k.heads, k.options);
    mha.to(kFloat64);
    mha.load_state_dict(c.state());  // refuses a missing or extra parameter: the names are PyTorch's
    CHECK(mha.in_proj_weight.defined() == c.has("p.in_proj_weight"));
    CHECK(mha.bias_k.defined() == c.has("p.bias_k"));
    nn::MultiheadAttentionCall call;
    if (c.has("mask.attn_mask")) {
      call.attn_mask = c.at("mask.attn_mask");
      if (!call.attn_mask.is_floating_point()) call.attn_mask = call.attn_mask.to(kBool);
    }
    if (c.has("mask.key_padding_mask")) call.key_padding_mask = c.at("mask.key_padding_mask").to(kBool);
    std::vector<Tensor> in;
    for (int i = 0; i < 3; ++i) in.push_back(c.at("in." + std::to_string(i)).clone().requires_grad_());
    std::vector<Tensor> outputs, cots = {c.at("cot")};
    if (k.average) {
      call.average_attn_weights = *k.average;
      auto [y, w] = mha.forward_with_weights(in[0], in[1], in[2], call);
      test::check_close(w, c.at("weights"));
      outputs = {y, w};
      cots.push_back(c.at("cot_weights"));
      test::check_close(mha.forward(in[0], in[1], in[2], call), y);  // the fused attention: the same output
    } else {
      outputs = {mha.forward(in[0], in[1], in[2], call)};
    }
    test::check_close(outputs[0], c.at("out"));
    std::vector<Tensor> targets = in;
    std::vector<std::string> names = {"g.in.0", "g.in.1", "g.in.2"};
    for (const auto& [name, p] : mha.named_parameters()) {
      targets.push_back(p);
      names.push_back("g." + name);
    }
    auto grads = autograd::grad(outputs, targets, cots);
    for (size_t i = 0; i < grads.size(); ++i) {
      INFO("gradient " << names[i]);
      test::check_close(grads[i], c.at(names[i]));
    }
  }
  // is_causal is the (L, S) mask that hides the later keys; the appended keys stay visible.
  for (bool appended : {false, true}) {
    INFO("add_bias_kv and add_zero_attn " << appended);
    nn::MultiheadAttention causal(8, 2, {.add_bias_kv = appended, .add_zero_attn = appended});
    const Tensor q = test::sample({4, 2, 8}), kv = test::sample({4, 2, 8}, kFloat32, 0.3);
    const Tensor later = ones({4, 4}, TensorOptions().dtype(kBool)).triu(1);
    const Tensor padding = tensor({{0, 0, 0, 1}, {0, 0, 0, 0}}, kBool);
    for (const Tensor& keys_padded : {Tensor(), padding}) {
      const Tensor expected = causal.forward(q, kv, kv, {.attn_mask = later, .key_padding_mask = keys_padded});
      test::check_close(causal.forward(q, kv, kv, {.key_padding_mask = keys_padded, .is_causal = true}), expected,
                        {1e-5, 1e-6});
      auto [y, w] = causal.forward_with_weights(q, kv, kv, {.key_padding_mask = keys_padded, .is_causal = true});
      test::check_close(y, expected, {1e-5, 1e-6});
      test::check_close(w, std::get<1>(causal.forward_with_weights(q, kv, kv, {.attn_mask = later,
                                                                              .key_padding_mask = keys_padded})),
                        {1e-6, 1e-7});
    }
  }

  // In training, the weights returned are those after dropout, as PyTorch's: each 0 or 1 / (1 - p)
  // times its value in evaluation.
  nn::MultiheadAttention dropping(8, 2, {.dropout = 0.5, .batch_first = true});
  const Tensor x = test::sample({2, 5, 8});
  dropping.eval();
  const Tensor eval_w = std::get<1>(dropping.forward_with_weights(x, x, x, {.average_attn_weights = false}));
  dropping.train();
  const Tensor train_w = std::get<1>(dropping.forward_with_weights(x, x, x, {.average_attn_weights = false}));
  CHECK(train_w.eq(0).any().item<bool>());
  test::check_close(where(train_w.eq(0), zeros_like(train_w), eval_w * 2), train_w, {1e-6, 1e-6});
  // PyTorch's parameters and initialisation.
  nn::MultiheadAttention split(8, 2, {.add_bias_kv = true, .kdim = 5, .vdim = 3});
  CHECK(!split.in_proj_weight.defined());
  CHECK(split.k_proj_weight.sizes() == Shape{8, 5});
  CHECK(split.v_proj_weight.sizes() == Shape{8, 3});
  CHECK(split.bias_k.sizes() == Shape{1, 1, 8});
  std::vector<std::string> keys;
  for (const auto& [name, value] : split.state_dict()) keys.push_back(name);
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"bias_k", "bias_v", "in_proj_bias", "k_proj_weight", "out_proj.bias",
                                         "out_proj.weight", "q_proj_weight", "v_proj_weight"});
  const double bound = std::sqrt(6.0 / (8 + 5));  // xavier_uniform_ of (8, 5)
  CHECK(split.k_proj_weight.abs().max().item<float>() <= bound);
  test::check_error([&] { split.forward(ones({3, 2, 8}), ones({4, 2, 8}), ones({4, 2, 3})); },
                    {"MultiheadAttention", "kdim = 5", "[4, 2, 8]"});
  test::check_error([] { nn::MultiheadAttention(8, 2, {.kdim = 0}); }, {"MultiheadAttention", "kdim and vdim"});
}

TEST_CASE("MultiheadAttention takes one unbatched (L, E) sequence, as torch", "[nn][attention]") {
  // torch.nn.MultiheadAttention(4, 2, dtype=float64) with in_proj_weight = sin(0.37 arange(48)).reshape(12, 4),
  // in_proj_bias = 0.1 cos(0.5 arange(12)), out_proj.weight = cos(0.29 arange(16)).reshape(4, 4),
  // out_proj.bias = 0.05 arange(4); x = sin(0.7 arange(12)).reshape(3, 4), kv = cos(0.9 arange(8)).reshape(2, 4):
  // m(x, x, x, key_padding_mask=[False, False, True]) and m(x, kv, kv).
  const Tensor self_out = tensor({{1.1512678876, 1.2956588214, -0.0563862726, -1.2205612624},
                                  {-0.9463421985, -1.2995382012, -0.0315057019, 1.394507351},
                                  {1.1324786973, 1.1930789709, -0.1195254607, -1.1684093592}}, kFloat64);
  const Tensor cross_out = tensor({{0.4134621774, 0.9387926781, 0.3963979222, -0.5020658646},
                                   {0.100126267, -0.5758321156, -0.499965272, 0.2966524168},
                                   {0.4142114785, 0.8882502348, 0.3552814301, -0.4843623024}}, kFloat64);
  for (bool batch_first : {false, true}) {  // an unbatched sequence has no batch dim to put first
    INFO("batch_first " << batch_first);
    nn::MultiheadAttention m(4, 2, {.batch_first = batch_first});
    m.to(kFloat64);
    {
      NoGradGuard no_grad;
      m.in_proj_weight.copy_((arange(48, kFloat64) * 0.37).sin().reshape({12, 4}));
      m.in_proj_bias.copy_((arange(12, kFloat64) * 0.5).cos() * 0.1);
      m.out_proj.weight.copy_((arange(16, kFloat64) * 0.29).cos().reshape({4, 4}));
      m.out_proj.bias.copy_(arange(4, kFloat64) * 0.05);
    }
    const Tensor x = (arange(12, kFloat64) * 0.7).sin().reshape({3, 4});
    const Tensor kv = (arange(8, kFloat64) * 0.9).cos().reshape({2, 4});
    test::check_close(m.forward(x, x, x, {.key_padding_mask = tensor({0, 0, 1}, kBool)}), self_out,
                      {1e-9, 1e-9});
    test::check_close(m.forward(x, kv, kv), cross_out, {1e-9, 1e-9});
    test::check_error([&] { m.forward(x, kv.unsqueeze(0), kv); }, {"MultiheadAttention", "all 2-D"});
  }
}

TEST_CASE("LeakyReLU, ELU, Hardtanh and Softplus match torch, at their kinks too", "[nn][layers]") {
  // The fixture's input holds 0 (leaky_relu's and elu's kink), -0.5 and 0.7 (hardtanh's bounds, where
  // PyTorch's gradient is 0) and values past softplus's threshold.
  nn::LeakyReLU leaky(0.2);
  check_layer(leaky, "leaky_relu");
  nn::ELU elu(1.5);
  check_layer(elu, "elu");
  nn::Hardtanh hardtanh(-0.5, 0.7);
  check_layer(hardtanh, "hardtanh");
  nn::Softplus softplus(2.0, 3.0);
  check_layer(softplus, "softplus_beta");
  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::LeakyReLU>());
  reprs.push_back(std::make_shared<nn::ELU>());
  reprs.push_back(std::make_shared<nn::Hardtanh>());
  reprs.push_back(std::make_shared<nn::Softplus>());
  reprs.push_back(std::make_shared<nn::LeakyReLU>(0.2));
  reprs.push_back(std::make_shared<nn::Hardtanh>(-0.5, 0.7));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("activation_reprs").strings.at("repr"));
  // No NaN from the branch where() does not take: elu of a large x, softplus far past its threshold.
  Tensor big = from_vector<double>({800.0, -800.0}).requires_grad_();
  (nn::functional::elu(big) + nn::functional::softplus(big, 0.5, 30)).sum().backward();
  test::check_close(big.grad(), from_vector<double>({2.0, 0.0}), {1e-15, 1e-150});  // sigmoid(-400) at -800
  test::check_error([] { nn::Hardtanh(1.0, -1.0); }, {"nn::Hardtanh", "min_val (1)", "max_val (-1)"});
}

TEST_CASE("layers at their edges as PyTorch: width 0, NaN inputs, Softplus past 20, a 0-d Flatten, mask shapes",
          "[nn][layers]") {
  // Width 0: the backward reshaped to (-1, 0), which no shape satisfies. Golden: PyTorch 1.13.
  nn::Linear empty_in(0, 3);
  Tensor x = zeros({2, 0}).requires_grad_();
  empty_in(x).sum().backward();
  test::check_equal(empty_in.bias.grad(), full({3}, 2.0));
  CHECK(empty_in.weight.grad().sizes() == Shape{3, 0});
  CHECK(x.grad().sizes() == Shape{2, 0});
  nn::Linear empty_out(4, 0);
  Tensor x2 = ones({2, 4}).requires_grad_();
  empty_out(x2).sum().backward();
  test::check_equal(x2.grad(), zeros({2, 4}));
  nn::Embedding narrow(5, 0);
  narrow(from_vector<int64_t>({1, 2})).sum().backward();
  CHECK(narrow.weight.grad().sizes() == Shape{5, 0});

  // A NaN input: NaN out, and the incoming gradient passed through (PyTorch: x <= 0 ? ... : g for ELU,
  // x <= min || x >= max ? 0 : g for Hardtanh).
  for (int layer = 0; layer < 2; ++layer) {
    Tensor v = from_vector<double>({NAN, 0.5, -0.5}).requires_grad_();
    Tensor y = layer == 0 ? nn::ELU(1.0)(v) : nn::Hardtanh()(v);
    y.backward(ones({3}, kFloat64));
    CHECK(std::isnan(y[0].item<double>()));
    test::check_close(v.grad(), from_vector<double>({1, 1, layer == 0 ? 0.6065306597126334 : 1}), {1e-15, 1e-15});
  }

  // Softplus(1, 30) between 20 and the threshold is softplus, not the identity (golden: PyTorch 1.13).
  Tensor s = from_vector<double>({20.5, 25}).requires_grad_();
  Tensor sp = nn::Softplus(1.0, 30.0)(s);
  sp.sum().backward();
  test::check_close(sp, from_vector<double>({20.500000001250154, 25.000000000013888}), {1e-15, 0});
  test::check_close(s.grad(), from_vector<double>({0.99999999874984713, 0.99999999998611211}), {1e-15, 0});
  test::check_close(nn::Softplus(2.0, 50.0)(from_vector<double>({-3, 0, 4, 12})),
                    from_vector<double>({0.0012378425688652247, 0.34657359027997264, 4.000167703186448,
                                         12.000000000018876}),
                    {1e-14, 0});

  // Flatten's dims are checked on a 0-d tensor too (PyTorch: "Dimension out of range").
  test::check_error([] { nn::Flatten()(scalar_tensor(5.0)); }, {"flatten", "out of range"});
  CHECK(nn::Flatten(0, -1)(scalar_tensor(5.0)).sizes() == Shape{1});

  // attn_mask must be (L, S) or (N * heads, L, S): a (1, S) mask was broadcast silently.
  nn::MultiheadAttention mha(6, 2, {.batch_first = true});
  const Tensor q = test::sample({2, 3, 6}), k = test::sample({2, 4, 6}, kFloat32, 1.7);
  for (const Shape& bad : {Shape{1, 4}, Shape{3, 1}, Shape{4, 3, 6}}) {
    test::check_error([&] { mha.forward(q, k, k, {.attn_mask = zeros(bad, kBool)}); },
                      {"attn_mask must be (L, S) = (3, 4)", "(4, 3, 4)", bad.str()});
  }
  CHECK(mha.forward(q, k, k, {.attn_mask = zeros({3, 4}, kBool)}).sizes() == Shape{2, 3, 6});
}

// tests/nn/test_encoder_decoder.cpp: torch.nn's encoder-decoder transformer (TransformerEncoderLayer,
// TransformerDecoderLayer, TransformerEncoder, TransformerDecoder, Transformer) against PyTorch 1.13
// (tests/fixtures/gen_nn_golden.py) in float64: the output and the gradient of every input and
// parameter, with PyTorch's parameter names; the copies of a layer; the Errors.
#include <functional>
#include <string>
#include <vector>

#include "nn_golden.h"

using namespace kiln;

namespace {

// The case's masks: bool ones are stored as 0/1 integers.
Tensor mask_of(const test::NnCase& c, const std::string& name) {
  if (!c.has("mask." + name)) return {};
  const Tensor m = c.at("mask." + name);
  return m.is_floating_point() ? m : m.to(kBool);
}

// Runs `run` on the case's inputs (the case's parameters loaded into `module`) and checks the output
// and the gradients of <out, cot> for every input and parameter.
void check_case(nn::Module& module, const std::string& name,
                const std::function<Tensor(const std::vector<Tensor>&, const test::NnCase&)>& run) {
  INFO("golden case " << name);
  const test::NnCase& c = test::nn_case(name);
  const std::vector<Tensor> in = test::load_case(module, c);
  const Tensor y = run(in, c);
  test::check_close(y, c.at("out"));
  test::check_gradients({y}, {c.at("cot")}, in, module, c);
}

}  // namespace

TEST_CASE("TransformerEncoderLayer and TransformerDecoderLayer match torch: post- and pre-LN, relu and gelu, masks",
          "[nn][attention]") {
  nn::TransformerEncoderLayer post(8, 2, {.dim_feedforward = 16, .dropout = 0.0});
  check_case(post, "encoder_layer_post_relu", [&](const std::vector<Tensor>& in, const test::NnCase& c) {
    return post.forward(
        in[0], {.src_mask = mask_of(c, "src_mask"), .src_key_padding_mask = mask_of(c, "src_key_padding_mask")});
  });
  nn::TransformerEncoderLayer pre(8, 4,
                                  {.dim_feedforward = 12,
                                   .dropout = 0.0,
                                   .activation = "gelu",
                                   .layer_norm_eps = 1e-6,
                                   .batch_first = true,
                                   .norm_first = true});
  check_case(pre, "encoder_layer_pre_gelu", [&](const std::vector<Tensor>& in, const test::NnCase& c) {
    return pre.forward(in[0], {.src_mask = mask_of(c, "src_mask")});
  });
  nn::TransformerDecoderLayer dpost(8, 2, {.dim_feedforward = 16, .dropout = 0.0});
  check_case(dpost, "decoder_layer_post_relu", [&](const std::vector<Tensor>& in, const test::NnCase& c) {
    return dpost.forward(
        in[0], in[1],
        {.tgt_mask = mask_of(c, "tgt_mask"), .memory_key_padding_mask = mask_of(c, "memory_key_padding_mask")});
  });
  nn::TransformerDecoderLayer dpre(
      8, 4, {.dim_feedforward = 12, .dropout = 0.0, .activation = "gelu", .batch_first = true, .norm_first = true});
  check_case(dpre, "decoder_layer_pre_gelu", [&](const std::vector<Tensor>& in, const test::NnCase& c) {
    return dpre.forward(
        in[0], in[1],
        {.memory_mask = mask_of(c, "memory_mask"), .tgt_key_padding_mask = mask_of(c, "tgt_key_padding_mask")});
  });
}

TEST_CASE("TransformerEncoder, TransformerDecoder and Transformer match torch, with PyTorch's parameter names",
          "[nn][attention]") {
  nn::TransformerEncoder encoder(nn::TransformerEncoderLayer(8, 2, {.dim_feedforward = 16, .dropout = 0.0}), 2,
                                 std::make_shared<nn::LayerNorm>(8));
  check_case(encoder, "encoder_two_layers_norm", [&](const std::vector<Tensor>& in, const test::NnCase& c) {
    return encoder.forward(in[0], {.src_mask = mask_of(c, "mask")});
  });
  nn::TransformerDecoder decoder(
      nn::TransformerDecoderLayer(8, 2, {.dim_feedforward = 16, .dropout = 0.0, .batch_first = true}), 2);
  check_case(decoder, "decoder_two_layers",
             [&](const std::vector<Tensor>& in, const test::NnCase&) { return decoder.forward(in[0], in[1]); });
  nn::Transformer model(8, 2,
                        {.num_encoder_layers = 2, .num_decoder_layers = 1, .dim_feedforward = 16, .dropout = 0.0});
  check_case(model, "transformer", [&](const std::vector<Tensor>& in, const test::NnCase& c) {
    return model.forward(in[0], in[1],
                         {.tgt_mask = mask_of(c, "tgt_mask"),
                          .src_key_padding_mask = mask_of(c, "src_key_padding_mask"),
                          .memory_key_padding_mask = mask_of(c, "memory_key_padding_mask")});
  });
  test::check_equal(nn::Transformer::generate_square_subsequent_mask(4, kFloat64),
                    test::nn_case("square_subsequent_mask").at("out"));
}

TEST_CASE("a TransformerEncoder's layers start as copies of its layer, and the Transformer re-initialises them",
          "[nn][attention]") {
  nn::TransformerEncoderLayer layer(8, 2, {.dim_feedforward = 16});
  layer.eval();
  nn::TransformerEncoder encoder(layer, 3);
  CHECK(encoder.layers.size() == 3);
  CHECK(encoder.norm == nullptr);
  for (size_t i = 0; i < 3; ++i) {
    auto& copy = encoder.layers.at<nn::TransformerEncoderLayer>(i);
    CHECK_FALSE(copy.is_training());
    test::check_equal(copy.linear1.weight, layer.linear1.weight);
    test::check_equal(copy.self_attn.in_proj_weight, layer.self_attn.in_proj_weight);
    CHECK_FALSE(copy.linear1.weight.is_same(layer.linear1.weight));  // copies, not shared
  }
  // PyTorch's _reset_parameters: xavier_uniform_ on every parameter of 2 or more dims, so the layers differ.
  nn::Transformer model(8, 2, {.num_encoder_layers = 2, .num_decoder_layers = 2, .dim_feedforward = 16});
  auto& first = model.encoder->layers.at<nn::TransformerEncoderLayer>(0);
  auto& second = model.encoder->layers.at<nn::TransformerEncoderLayer>(1);
  CHECK(first.linear1.weight.ne(second.linear1.weight).any().item<bool>());
  const double bound = std::sqrt(6.0 / (8 + 16));  // xavier_uniform_ of linear1's (16, 8)
  CHECK(first.linear1.weight.abs().max().item<float>() <= bound);
  CHECK(first.linear1.weight.abs().max().item<float>() > 0.8 * bound);
  test::check_equal(first.norm1.weight, ones({8}));  // 1-D parameters keep their initialisation

  // Dropout in training: the output changes from draw to draw; eval is deterministic.
  nn::TransformerEncoderLayer dropping(8, 2, {.dim_feedforward = 16, .dropout = 0.5});
  const Tensor x = test::sample({3, 2, 8});
  CHECK(dropping(x).ne(dropping(x)).any().item<bool>());
  dropping.eval();
  test::check_equal(dropping(x), dropping(x));

  test::check_error([] { nn::TransformerEncoderLayer(8, 2, {.activation = "tanh"}); },
                    {"TransformerEncoderLayer", "\"relu\" or \"gelu\"", "tanh"});
  test::check_error([] { nn::TransformerEncoderLayer(8, 3); }, {"MultiheadAttention", "multiple of num_heads"});
  test::check_error([&] { nn::TransformerEncoder(layer, 0); }, {"TransformerEncoder", "num_layers", "0"});
  encoder.layers.push_back(nn::Linear(8, 8));
  test::check_error([&] { encoder(x); }, {"TransformerEncoder", "TransformerEncoderLayer", "Linear"});
  test::check_error([&] { nn::TransformerDecoderLayer(8, 2)(x); }, {"TransformerDecoderLayer", "forward(tgt, memory)"});
  test::check_error([&] { model(x); }, {"nn::Transformer", "forward(src, tgt)"});
  test::check_error(
      [&] {
        model.forward(x, test::sample({3, 4, 8}));
      },
      {"nn::Transformer", "batch number", "[3, 2, 8]"});
  test::check_error([&] { model.forward(x, test::sample({3, 2, 6})); }, {"nn::Transformer", "d_model = 8"});
}

// tests/nn/test_nested_model.cpp: a nested model with every kind of layer, written as in PyTorch
// (gen_nn_golden.py's Model): its state dict keys (names and order) and printed tree equal torch's.
#include "nn_golden.h"

using namespace kiln;

namespace {

struct Block : nn::Module {
  nn::Conv2d conv{3, 8, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d bn{8};
  nn::ReLU act;
  Block() { register_modules({{"conv", conv}, {"bn", bn}, {"act", act}}); }
  static std::shared_ptr<Block> make() { return std::make_shared<Block>(); }
};

struct Model : nn::Module {
  nn::Linear stem{4, 3};
  nn::ModuleList blocks{Block::make(), Block::make()};
  nn::ModuleDict heads;
  nn::LayerNorm norm{8};
  nn::Embedding emb{5, 8, {.padding_idx = 0}};
  nn::Dropout drop{0.1};
  nn::AdaptiveAvgPool2d pool{1};
  nn::Flatten flat;
  nn::GroupNorm gn{2, 8};
  nn::GELU gelu{{.approximate = "tanh"}};
  nn::Softmax sm{-1};
  nn::MaxPool2d mp{2};
  nn::AvgPool2d ap{2};
  nn::BatchNorm1d bn1{8, {.eps = 1e-3, .momentum = 0.3, .affine = false}};
  nn::Conv1d c1{2, 4, 3, {.stride = 2, .padding = "valid"}};
  nn::Conv2d same{2, 4, 4, {.padding = "same", .dilation = 2, .groups = 2}};
  nn::Identity ident;
  Model() {
    heads.insert("cls", nn::Linear(8, 10));
    heads.insert("box", nn::Sequential(nn::Linear(8, 4), nn::Tanh()));
    register_modules({{"stem", stem}, {"blocks", blocks}, {"heads", heads}, {"norm", norm}, {"emb", emb},
                      {"drop", drop}, {"pool", pool}, {"flat", flat}, {"gn", gn}, {"gelu", gelu}, {"sm", sm},
                      {"mp", mp}, {"ap", ap}, {"bn1", bn1}, {"c1", c1}, {"same", same}, {"ident", ident}});
  }
};

}  // namespace

TEST_CASE("A nested model's state dict names and printed tree equal torch's", "[nn][module][state][print]") {
  Model m;
  const test::NnCase& c = test::nn_case("nested_model");
  std::string keys;
  for (const std::string& k : m.state_dict().keys()) keys += (keys.empty() ? "" : " ") + k;
  CHECK(keys == c.strings.at("keys"));
  std::string repr = m.to_string();
  std::string tree = repr.substr(0, repr.rfind("\nParameters: "));
  CHECK(tree == c.strings.at("repr"));
  CHECK(repr.substr(tree.size()) == "\nParameters: " + std::to_string(m.num_parameters()) + " (" +
                                        std::to_string(m.num_parameters()) + " trainable)");
  CHECK(m.state_dict().at("blocks.1.bn.num_batches_tracked").dtype() == kInt64);

  // Round trip through a second model.
  Model other;
  {
    NoGradGuard g;
    for (Tensor& p : m.parameters()) p.copy_(randn(p.sizes()));
  }
  other.load_state_dict(m.state_dict());
  for (auto& [key, t] : m.state_dict()) {
    INFO(key);
    test::check_equal(other.state_dict().at(key), t);
  }
}

TEST_CASE("Layer options are checked when the layer is made", "[nn][layers][errors]") {
  test::check_error([] { nn::Conv2d(3, 4, 3, {.groups = 2}); }, {"Conv2d", "in_channels (3)", "groups (2)"});
  test::check_error([] { nn::Conv2d(2, 4, 3, {.stride = 2, .padding = "same"}); },
                    {"padding='same' is not supported for strided convolutions"});
  test::check_error([] { nn::Conv1d(2, 4, 3, {.padding = "full"}); }, {"padding 'full'"});
  test::check_error([] { nn::GroupNorm(3, 8); }, {"num_channels (8)", "num_groups (3)"});
  test::check_error([] { nn::Dropout(1.5); }, {"p must be in [0, 1]"});
}

// tests/nn/test_header_examples.cpp: the examples in the nn/ headers' comments, compiled and run
// (a stale comment is a bug).
#include "support.h"

using namespace kiln;

namespace {

// nn/module.h
struct Net : nn::Module {
  nn::Linear f1{784, 128};  nn::Linear f2{128, 10};
  Net() { register_modules({{"f1", f1}, {"f2", f2}}); }
  Tensor forward(const Tensor& x) override { return f2(relu(f1(x))); }
};

struct Block : nn::Module {
  nn::Linear fc{8, 8};
  Block() { register_module("fc", fc); }
};

}  // namespace

TEST_CASE("The nn headers' examples compile and run", "[nn][examples]") {
  Net net;
  CHECK(net(zeros({2, 784})).sizes() == Shape{2, 10});

  // nn/container.h
  nn::Sequential seq{nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2)};   // children "0", "1", "2"
  nn::ModuleList blocks{std::make_shared<Block>(), std::make_shared<Block>()};
  blocks.push_back(nn::Linear(8, 8));
  nn::ModuleDict heads;   heads.insert("cls", nn::Linear(8, 10));
  CHECK(seq(zeros({3, 4})).sizes() == Shape{3, 2});
  CHECK(blocks.size() == 3);
  CHECK(heads["cls"](zeros({1, 8})).sizes() == Shape{1, 10});

  // nn/conv.h
  nn::Conv2d c1{1, 32, 3, {.padding = 1}};
  nn::Conv2d c2{32, 32, {3, 2}, {.stride = {2, 1}, .padding = {1, 0}}};
  nn::Conv2d c3{32, 32, 4, {.padding = "same", .dilation = 2}};  // "same": stride 1 only
  Tensor h = c1(zeros({1, 1, 8, 8}));
  CHECK(c2(h).sizes() == Shape{1, 32, 4, 7});
  CHECK(c3(h).sizes() == Shape{1, 32, 8, 8});

  // nn/functional.h
  Tensor logits = test::sample({4, 3});
  Tensor labels = from_vector<int64_t>({0, 2, 1, 0}, {4});
  Tensor loss = nn::cross_entropy(logits, labels, {.ignore_index = 0, .reduction = "sum", .label_smoothing = 0.1});
  CHECK(loss.dim() == 0);
  Tensor image = test::sample({1, 3, 16, 20});
  CHECK(nn::interpolate(image, {.size = {64, 64}, .mode = "bilinear"}).sizes() == Shape{1, 3, 64, 64});
  CHECK(nn::interpolate(image, {.scale_factor = {2}}).sizes() == Shape{1, 3, 32, 40});

  // nn/resample.h
  CHECK(nn::ReflectionPad2d({1, 1, 2, 2})(image).sizes() == Shape{1, 3, 20, 22});
  CHECK(nn::ReplicationPad1d(3)(image[0]).sizes() == Shape{3, 16, 26});
  CHECK(nn::ConstantPad2d(2, 3.5)(image).sizes() == Shape{1, 3, 20, 24});
  CHECK(nn::ConstantPad2d({1, 1, 2, 0}, 3.5)(image).sizes() == Shape{1, 3, 18, 22});
  CHECK(nn::Upsample({.scale_factor = {2}, .mode = "bilinear"})(image).sizes() == Shape{1, 3, 32, 40});

  // nn/loss.h
  nn::CrossEntropyLoss criterion({.ignore_index = 0, .label_smoothing = 0.1});
  Tensor criterion_loss = criterion(logits, labels);
  CHECK(criterion_loss.item<float>() ==
        Approx(nn::cross_entropy(logits, labels, {.ignore_index = 0, .label_smoothing = 0.1}).item<float>()));
  Tensor anchor = test::sample({4, 6}), positive = test::sample({4, 6}, kFloat32, 1);
  Tensor negative = test::sample({4, 6}, kFloat32, 2);
  nn::TripletMarginLoss triplet({.margin = 0.5});
  Tensor t = triplet(anchor, positive, negative);
  CHECK(t.dim() == 0);

  // nn/packed_sequence.h
  nn::LSTM lstm(3, 4, {.batch_first = true});
  Tensor x = test::sample({2, 5, 3});
  Tensor lengths = from_vector<int64_t>({3, 5});
  auto packed = nn::utils::rnn::pack_padded_sequence(x, lengths, /*batch_first=*/true, /*enforce_sorted=*/false);
  auto [out, state] = lstm.forward_with_packed_input(packed);
  auto [padded, out_lengths] = nn::utils::rnn::pad_packed_sequence(out, /*batch_first=*/true);
  CHECK(padded.sizes() == Shape{2, 5, 4});
  test::check_equal(out_lengths, lengths);

  // nn/convert_parameters.h
  nn::Linear model(3, 2);
  Tensor flat = nn::utils::parameters_to_vector(model.parameters());
  nn::utils::vector_to_parameters(flat * 0.5, model.parameters());
  test::check_close(nn::utils::parameters_to_vector(model.parameters()), flat.detach() * 0.5);

  // nn/module.h, Module::set_parameter
  nn::Embedding embedding(10, 8);
  nn::Linear head(8, 10, {.bias = false});
  head.weight = head.set_parameter("weight", embedding.weight);
  CHECK(head.weight.is_same(embedding.weight));
}

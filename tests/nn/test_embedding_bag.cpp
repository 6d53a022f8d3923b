// tests/nn/test_embedding_bag.cpp: EmbeddingBag / embedding_bag, Unflatten, ChannelShuffle /
// channel_shuffle and LocalResponseNorm / local_response_norm against PyTorch 1.13 (values, and the
// gradients of the weight and per-sample weights), their reprs, and their Errors.
#include "nn_golden.h"

using namespace kiln;
using autograd::TensorList;
using test::check_loss;

TEST_CASE("embedding_bag matches torch for each mode, offsets, padding and weights", "[nn][embedding_bag]") {
  // Bags [1 2 4 5], [], [4 3 2 9], [1 1], [7 7]: an empty bag, padding-only bags, repeated indices.
  check_loss("embedding_bag_mean_padding", [](auto& in) {
    return nn::embedding_bag(in[0], in[1], {.offsets = in[2], .mode = "mean", .padding_idx = 1});
  });
  check_loss("embedding_bag_sum_weights_last_offset", [](auto& in) {
    return nn::embedding_bag(in[0], in[1],
                             {.offsets = in[2], .mode = "sum", .per_sample_weights = in[3], .include_last_offset = true});
  });
  check_loss("embedding_bag_max_2d", [](auto& in) { return nn::embedding_bag(in[0], in[1], {.mode = "max"}); });
  check_loss("embedding_bag_max_padding", [](auto& in) {
    return nn::embedding_bag(in[0], in[1], {.offsets = in[2], .mode = "max", .padding_idx = 7});
  });
  check_loss("embedding_bag_sum_scale_grad_by_freq", [](auto& in) {
    return nn::embedding_bag(in[0], in[1], {.offsets = in[2], .scale_grad_by_freq = true, .mode = "sum"});
  });
  check_loss("embedding_bag_mean_max_norm", [](auto& in) {
    return nn::embedding_bag(in[0], in[1], {.offsets = in[2], .max_norm = 1.0, .norm_type = 1.5});
  });
}

TEST_CASE("EmbeddingBag is embedding_bag over its weight, with PyTorch's init and repr", "[nn][embedding_bag]") {
  nn::EmbeddingBag bag(10, 3, {.mode = "sum", .padding_idx = -2});
  CHECK(bag.options.padding_idx == 8);
  test::check_equal(bag.weight[8], zeros({3}));  // the padding row starts at zero
  const Tensor idx = from_vector<int64_t>({1, 8, 4, 2}), offsets = from_vector<int64_t>({0, 2});
  // Bags [1, 8] and [4, 2]; 8 is padding, left out.
  test::check_close(bag(idx, offsets), stack({bag.weight[1], bag.weight[4] + bag.weight[2]}));
  const Tensor square = from_vector<int64_t>({1, 2, 3, 4}, {2, 2});
  test::check_equal(bag(square), bag.weight.index_select(0, square.reshape({-1})).view({2, 2, 3}).sum({1}));
  nn::Sequential reprs;
  reprs.push_back(nn::EmbeddingBag(10, 3));
  reprs.push_back(nn::EmbeddingBag(
      10, 3, {.max_norm = 1.0, .norm_type = 1.5, .scale_grad_by_freq = true, .mode = "max", .padding_idx = 2}));
  reprs.push_back(nn::Unflatten(1, {2, 5}));
  reprs.push_back(nn::Unflatten(-1, {3}));
  reprs.push_back(nn::ChannelShuffle(2));
  reprs.push_back(nn::LocalResponseNorm(2));
  reprs.push_back(nn::LocalResponseNorm(3, {.alpha = 0.01, .beta = 0.5, .k = 2.0}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("more_layer_reprs").strings.at("repr"));
}

TEST_CASE("channel_shuffle and local_response_norm match torch", "[nn][embedding_bag]") {
  check_loss("channel_shuffle", [](auto& in) { return nn::channel_shuffle(in[0], 3); });
  check_loss("local_response_norm_3d", [](auto& in) { return nn::local_response_norm(in[0], 2); });
  check_loss("local_response_norm_4d", [](auto& in) { return nn::local_response_norm(in[0], 3, 0.1, 0.6, 2.0); });
  // channel_shuffle by g, then by C / g, is the identity; so is its gradient (torch 1.13 has none to compare).
  const Tensor x = test::sample({2, 6, 3}, kFloat64).requires_grad_();
  const Tensor cot = test::sample({2, 6, 3}, kFloat64, 1.0);
  test::check_equal(nn::channel_shuffle(nn::channel_shuffle(x, 3), 2), x);
  const Tensor g = autograd::grad({nn::channel_shuffle(x, 3)}, {x}, {cot})[0];
  test::check_equal(g, nn::channel_shuffle(cot, 2));
  test::check_equal(nn::ChannelShuffle(3)(x), nn::channel_shuffle(x, 3));
  test::check_equal(nn::LocalResponseNorm(3, {.alpha = 0.1})(x), nn::local_response_norm(x, 3, 0.1));
  test::check_equal(nn::Unflatten(1, {2, -1})(x), x.view({2, 2, 3, 3}));
  CHECK(autograd::gradgradcheck(
      [](const TensorList& in) { return TensorList{nn::local_response_norm(in[0], 4, 0.5, 0.75, 1.5)}; }, {x}));
  const Tensor weight = test::sample({6, 4}, kFloat64, 0.2).requires_grad_();
  const Tensor psw = test::sample({5}, kFloat64, 0.3).requires_grad_();
  const Tensor idx = from_vector<int64_t>({0, 5, 5, 2, 3}), offsets = from_vector<int64_t>({0, 1, 1});
  CHECK(autograd::gradgradcheck(
      [&](const TensorList& in) {
        return TensorList{nn::embedding_bag(idx, in[0], {.offsets = offsets, .mode = "sum", .per_sample_weights = in[1]})};
      },
      {weight, psw}));
}

TEST_CASE("embedding_bag, channel_shuffle and local_response_norm refuse bad input with a clear Error",
          "[nn][embedding_bag][errors]") {
  const Tensor w = zeros({10, 3});
  const Tensor idx = from_vector<int64_t>({1, 2, 4});
  test::check_error([&] { nn::embedding_bag(idx, w, {.offsets = from_vector<int64_t>({1, 2})}); },
                    {"embedding_bag", "offsets[0] is 1", "must start at the input's start"});
  test::check_error([&] { nn::embedding_bag(idx, w, {.offsets = from_vector<int64_t>({0, 5})}); },
                    {"embedding_bag", "offsets[1] is 5, past the input's 3 indices"});
  test::check_error([&] { nn::embedding_bag(idx, w, {.offsets = from_vector<int64_t>({0, 2, 1})}); },
                    {"embedding_bag", "must not decrease", "offsets[2] = 1 < offsets[1] = 2"});
  test::check_error([&] { nn::embedding_bag(idx, w); }, {"embedding_bag", "1-D input needs offsets", "none"});
  test::check_error([&] { nn::embedding_bag(idx.view({1, 3}), w, {.offsets = from_vector<int64_t>({0})}); },
                    {"embedding_bag", "2-D input", "leave offsets undefined"});
  test::check_error([&] { nn::embedding_bag(idx, w, {.offsets = from_vector<int64_t>({0}), .mode = "avg"}); },
                    {"embedding_bag", "mode 'avg'"});
  test::check_error(
      [&] {
        nn::embedding_bag(idx, w, {.offsets = from_vector<int64_t>({0}), .per_sample_weights = ones({3})});
      },
      {"embedding_bag", "per_sample_weights needs mode 'sum'", "'mean'"});
  test::check_error(
      [&] {
        nn::embedding_bag(idx, w, {.offsets = from_vector<int64_t>({0}), .mode = "sum", .per_sample_weights = ones({2})});
      },
      {"embedding_bag", "per_sample_weights", "[2]", "input's shape [3]"});
  test::check_error([&] { nn::embedding_bag(from_vector<int64_t>({1, 10}), w, {.offsets = from_vector<int64_t>({0})}); },
                    {"embedding", "[0, 10)"});
  test::check_error([&] { nn::embedding_bag(idx, w, {.offsets = from_vector<float>({0})}); },
                    {"embedding_bag", "offsets", "float32"});
  test::check_error([&] { nn::EmbeddingBag(10, 3, {.mode = "min"}); }, {"nn::EmbeddingBag", "mode 'min'"});
  test::check_error([&] { nn::EmbeddingBag(10, 3, {.padding_idx = 10}); }, {"nn::EmbeddingBag", "padding_idx 10"});
  test::check_error([&] { nn::channel_shuffle(zeros({2, 6, 3}), 4); }, {"channel_shuffle", "groups (4)", "6 channels"});
  test::check_error([&] { nn::channel_shuffle(zeros({2, 6}), 2); }, {"channel_shuffle", "at least one dim after C"});
  test::check_error([&] { nn::local_response_norm(zeros({2, 6}), 2); }, {"local_response_norm", "[2, 6]"});
  test::check_error([&] { nn::local_response_norm(zeros({2, 6, 3}), 0); }, {"local_response_norm", "size must be positive"});
  test::check_error([&] { nn::ChannelShuffle(0); }, {"nn::ChannelShuffle", "groups must be positive"});
  // An empty input, or bags with nothing in them, give zeros, as PyTorch.
  test::check_equal(nn::embedding_bag(zeros({0}, kInt64), w, {.offsets = from_vector<int64_t>({0, 0}), .mode = "max"}),
                    zeros({2, 3}));
}

TEST_CASE("embedding_bag as PyTorch at the edges: max's ties, no bags, a 2-D input with include_last_offset",
          "[nn][embedding_bag]") {
  // Rows [1, 2] and [1, 3] in one bag: the max of column 0 ties; PyTorch's gradient goes to the first.
  const Tensor w = from_vector<double>({0, 0, 1, 2, 1, 3}, {3, 2}).requires_grad_();
  const Tensor y = nn::embedding_bag(from_vector<int64_t>({1, 2}, {1, 2}), w, {.mode = "max"});
  test::check_equal(y, from_vector<double>({1, 3}, {1, 2}));
  y.sum().backward();
  test::check_equal(w.grad(), from_vector<double>({0, 0, 1, 0, 0, 1}, {3, 2}));
  // Indices but no bags (no offsets, or only the end with include_last_offset): (0, D), as PyTorch.
  for (std::string mode : {"sum", "mean", "max"}) {
    INFO(mode);
    CHECK(nn::embedding_bag(from_vector<int64_t>({1, 2}), w, {.offsets = zeros({0}, kInt64), .mode = mode}).sizes() ==
          Shape{0, 2});
    CHECK(nn::embedding_bag(from_vector<int64_t>({1, 2}), w,
                            {.offsets = zeros({1}, kInt64), .mode = mode, .include_last_offset = true})
              .sizes() == Shape{0, 2});
  }
  // A 2-D input (3, 2) with include_last_offset: PyTorch's offsets 0, 2, 4 with the last an end, so 2 bags.
  const Tensor square = from_vector<int64_t>({0, 1, 2, 1, 2, 2}, {3, 2});
  test::check_equal(nn::embedding_bag(square, w, {.mode = "sum", .include_last_offset = true}),
                    from_vector<double>({1, 2, 2, 5}, {2, 2}));
  test::check_error([&] { nn::embedding_bag(square, w, {.scale_grad_by_freq = true, .mode = "max"}); },
                    {"embedding_bag", "mode 'max' cannot scale the gradient by frequency"});
}

// tests/nn/test_rnn.cpp: RNN, LSTM, GRU and their cells against PyTorch 1.13
// (tests/fixtures/gen_nn_golden.py) in float64: outputs, final states and the gradient of every input,
// state and parameter, with PyTorch's parameter names; gradgradcheck; dropout between layers; Errors.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "nn_golden.h"

using namespace kiln;

namespace {

using Results = std::vector<std::pair<std::string, Tensor>>;  // ("out" / "h_n" / "c_n", value)

// Runs `run` on the case's inputs (the case's parameters loaded into `module`), checks every result
// and the gradients of the sum of <result, its cotangent>.
void check_rnn(nn::Module& module, const std::string& name,
               const std::function<Results(const std::vector<Tensor>&)>& run) {
  INFO("golden case " << name);
  const test::NnCase& c = test::nn_case(name);
  const std::vector<Tensor> in = test::load_case(module, c);
  std::vector<Tensor> outputs, cots;
  for (const auto& [key, value] : run(in)) {
    INFO(key);
    test::check_close(value, c.at(key));
    outputs.push_back(value);
    cots.push_back(c.at("cot." + key));
  }
  test::check_gradients(outputs, cots, in, module, c);
}

}  // namespace

TEST_CASE("RNN, LSTM and GRU match torch: layers, directions, batch_first, proj_size, unbatched, states", "[nn][rnn]") {
  nn::RNN rnn(3, 4, {.num_layers = 2, .bidirectional = true});
  check_rnn(rnn, "rnn_tanh_2_layers_bidirectional", [&](const std::vector<Tensor>& in) {
    auto [out, h] = rnn.forward(in[0], in[1]);
    return Results{{"out", out}, {"h_n", h}};
  });
  nn::RNN relu(3, 4, {.nonlinearity = "relu", .bias = false, .batch_first = true});
  check_rnn(relu, "rnn_relu_batch_first", [&](const std::vector<Tensor>& in) {
    auto [out, h] = relu.forward(in[0], Tensor());
    return Results{{"out", out}, {"h_n", h}};
  });
  nn::LSTM lstm(3, 4, {.num_layers = 2, .bidirectional = true});
  check_rnn(lstm, "lstm_2_layers_bidirectional", [&](const std::vector<Tensor>& in) {
    auto [out, state] = lstm.forward(in[0], std::make_tuple(in[1], in[2]));
    return Results{{"out", out}, {"h_n", std::get<0>(state)}, {"c_n", std::get<1>(state)}};
  });
  nn::LSTM projected(3, 5, {.num_layers = 2, .batch_first = true, .proj_size = 2});
  CHECK(projected.layer_parameters(1, 0)[0].sizes() == Shape{20, 2});  // layer 1 reads the projected h
  check_rnn(projected, "lstm_proj_batch_first", [&](const std::vector<Tensor>& in) {
    auto [out, state] = projected.forward(in[0], std::nullopt);
    return Results{{"out", out}, {"h_n", std::get<0>(state)}, {"c_n", std::get<1>(state)}};
  });
  nn::LSTM unbatched(3, 4);
  check_rnn(unbatched, "lstm_unbatched", [&](const std::vector<Tensor>& in) {
    auto [out, state] = unbatched.forward(in[0], std::make_tuple(in[1], in[2]));
    return Results{{"out", out}, {"h_n", std::get<0>(state)}, {"c_n", std::get<1>(state)}};
  });
  nn::GRU gru(3, 4, {.num_layers = 2, .batch_first = true, .bidirectional = true});
  check_rnn(gru, "gru_2_layers_bidirectional_batch_first", [&](const std::vector<Tensor>& in) {
    auto [out, h] = gru.forward(in[0], in[1]);
    return Results{{"out", out}, {"h_n", h}};
  });
  nn::GRU gru1(3, 4, {.bias = false});
  check_rnn(gru1, "gru_unbatched", [&](const std::vector<Tensor>& in) {
    auto [out, h] = gru1.forward(in[0], Tensor());
    return Results{{"out", out}, {"h_n", h}};
  });
  // forward(x) gives the output alone (what a Sequential calls).
  test::check_close(gru1.forward(test::nn_case("gru_unbatched").at("in.0")), test::nn_case("gru_unbatched").at("out"));
}

TEST_CASE("RNNCell, LSTMCell and GRUCell match torch, batched and unbatched, with and without a state", "[nn][rnn]") {
  nn::RNNCell rnn(3, 4, {.nonlinearity = "relu"});
  check_rnn(rnn, "rnn_cell_relu", [&](const std::vector<Tensor>& in) {
    return Results{{"h_n", rnn.forward(in[0], in[1])}};
  });
  nn::LSTMCell lstm(3, 4);
  check_rnn(lstm, "lstm_cell", [&](const std::vector<Tensor>& in) {
    auto [h, c] = lstm.forward(in[0], std::make_tuple(in[1], in[2]));
    return Results{{"h_n", h}, {"c_n", c}};
  });
  nn::GRUCell gru(3, 4);
  check_rnn(gru, "gru_cell_unbatched", [&](const std::vector<Tensor>& in) {
    return Results{{"h_n", gru.forward(in[0], in[1])}};
  });
  nn::LSTMCell zero(3, 4, {.bias = false});
  check_rnn(zero, "lstm_cell_zero_state", [&](const std::vector<Tensor>& in) {
    auto [h, c] = zero.forward(in[0], std::nullopt);
    return Results{{"h_n", h}, {"c_n", c}};
  });

  nn::Sequential reprs;
  reprs.push_back(std::make_shared<nn::RNN>(3, 4));
  reprs.push_back(std::make_shared<nn::RNN>(3, 4,
                                            nn::RNNOptions{.num_layers = 2,
                                                           .nonlinearity = "relu",
                                                           .bias = false,
                                                           .batch_first = true,
                                                           .dropout = 0.5,
                                                           .bidirectional = true}));
  reprs.push_back(std::make_shared<nn::LSTM>(3, 4, nn::RNNOptions{.proj_size = 2}));
  reprs.push_back(std::make_shared<nn::GRU>(3, 4, nn::RNNOptions{.num_layers = 2}));
  reprs.push_back(std::make_shared<nn::RNNCell>(3, 4));
  reprs.push_back(std::make_shared<nn::RNNCell>(3, 4, nn::RNNCellOptions{.bias = false, .nonlinearity = "relu"}));
  reprs.push_back(std::make_shared<nn::LSTMCell>(3, 4));
  reprs.push_back(std::make_shared<nn::GRUCell>(3, 4, nn::RNNCellOptions{.bias = false}));
  const std::string repr = reprs.to_string();
  CHECK(repr.substr(0, repr.rfind("\nParameters: ")) == test::nn_case("rnn_reprs").strings.at("repr"));
}

TEST_CASE("recurrent layers are differentiable twice, drop out between layers, and check their inputs", "[nn][rnn]") {
  nn::LSTM lstm(2, 3, {.num_layers = 2, .bidirectional = true, .proj_size = 1});
  lstm.to(kFloat64);
  const Tensor x = test::sample({3, 2, 2}, kFloat64).requires_grad_();
  auto fn = [&](const autograd::TensorList& in) {
    auto [out, state] = lstm.forward(in[0], std::nullopt);
    return autograd::TensorList{out, std::get<1>(state)};
  };
  CHECK(autograd::gradcheck(fn, {x}));
  CHECK(autograd::gradgradcheck(fn, {x}));
  nn::GRU gru(2, 3);
  gru.to(kFloat64);
  CHECK(autograd::gradgradcheck([&](const autograd::TensorList& in) { return autograd::TensorList{gru(in[0])}; }, {x}));

  // Dropout on the first layer's output only, in training: every draw differs, evaluation is deterministic,
  // and a one-layer network has nothing to drop.
  nn::RNN deep(4, 8, {.num_layers = 2, .dropout = 0.5});
  const Tensor seq = test::sample({5, 3, 4});
  CHECK(deep(seq).ne(deep(seq)).any().item<bool>());
  deep.eval();
  test::check_equal(deep(seq), deep(seq));
  nn::RNN shallow(4, 8, {.dropout = 0.5});
  test::check_equal(shallow(seq), shallow(seq));

  // A parameter replaced with set_parameter (as in weight tying) is the one the layer reads: without
  // the recurrent weight each step sees its own input only.
  nn::RNN plain(4, 8, {.bias = false});
  plain.set_parameter("weight_hh_l0", zeros({8, 8}).requires_grad_());
  test::check_close(plain(seq), tanh(matmul(seq, plain.layer_parameters(0, 0)[0].t())));

  // Two parameters of one layer tied together: both directions read the one tensor.
  nn::GRU tied(4, 8, {.bidirectional = true});
  tied.set_parameter("weight_hh_l0_reverse", tied.layer_parameters(0, 0)[1]);
  CHECK(tied.layer_parameters(0, 1)[1].is_same(tied.layer_parameters(0, 0)[1]));
  CHECK(tied(seq).sizes() == Shape{5, 3, 16});
  test::check_error([&] { tied(zeros({0, 3, 4})); }, {"nn::GRU", "sequence length", "[0, 3, 4]"});

  // PyTorch's initialisation: U(+-1/sqrt(hidden_size)) for every parameter.
  nn::GRU wide(16, 25);
  float largest = 0;
  for (const Tensor& p : wide.parameters()) {
    CHECK(p.abs().max().item<float>() <= 0.2f);
    largest = std::max(largest, p.abs().max().item<float>());
  }
  CHECK(largest > 0.19f);

  test::check_error([] { nn::RNN(3, 4, {.nonlinearity = "sigmoid"}); }, {"nn::RNN", "\"tanh\" or \"relu\"", "sigmoid"});
  test::check_error([] { nn::GRU(3, 4, {.proj_size = 2}); }, {"nn::GRU", "proj_size", "LSTM"});
  test::check_error([] { nn::LSTM(3, 4, {.proj_size = 4}); }, {"nn::LSTM", "proj_size", "hidden_size = 4"});
  test::check_error([] { nn::LSTM(3, 4, {.num_layers = 0}); }, {"nn::LSTM", "num_layers"});
  test::check_error([] { nn::RNN(3, 4, {.dropout = 1.5}); }, {"nn::RNN", "dropout", "1.5"});
  test::check_error([] { nn::RNN(0, 4); }, {"nn::RNN", "positive"});
  nn::LSTM two(3, 4, {.num_layers = 2});
  test::check_error([&] { two(ones({5, 2, 4})); }, {"nn::LSTM", "input (L, N, 3)", "[5, 2, 4]"});
  test::check_error(
      [&] {
        two.forward(ones({5, 2, 3}), std::make_tuple(zeros({1, 2, 4}), zeros({2, 2, 4})));
      },
      {"nn::LSTM", "h_0", "[2, 2, 4]", "[1, 2, 4]"});
  test::check_error(
      [&] {
        two.forward(ones({5, 3}), std::make_tuple(zeros({2, 4}), zeros({2, 1, 4})));
      },
      {"nn::LSTM", "c_0", "[2, 4]"});
  test::check_error([] { nn::GRUCell(3, 4)(ones({2, 4})); }, {"nn::GRUCell", "(N, 3)", "[2, 4]"});
  test::check_error([] { nn::RNNCell(3, 4).forward(ones({2, 3}), zeros({3, 4})); }, {"nn::RNNCell", "hx", "[2, 4]"});
  test::check_error([] { nn::LSTMCell(3, 4, {.nonlinearity = "relu"}); }, {"nn::LSTMCell", "nonlinearity"});
  test::check_error([&] { two.layer_parameters(2, 0); }, {"nn::LSTM", "no layer 2"});
}

TEST_CASE("RNN, LSTM and GRU match torch on packed sequences of different lengths", "[nn][rnn][packed]") {
  namespace rnn_utils = nn::utils::rnn;
  // Each case: the padded input in.0, its lengths (unsorted: enforce_sorted false), the states in.1...
  auto packed_input = [](const Tensor& padded, const std::string& name, bool batch_first) {
    const test::NnCase& c = test::nn_case(name);
    rnn_utils::PackedSequence packed = rnn_utils::pack_padded_sequence(padded, c.at("lengths"), batch_first, false);
    test::check_equal(packed.batch_sizes, c.at("batch_sizes"));
    test::check_equal(packed.sorted_indices, c.at("sorted_indices"));
    return packed;
  };
  nn::LSTM lstm(3, 4, {.num_layers = 2, .bidirectional = true});
  check_rnn(lstm, "packed_lstm_2_layers_bidirectional", [&](const std::vector<Tensor>& in) {
    auto [out, state] =
        lstm.forward_with_packed_input(packed_input(in[0], "packed_lstm_2_layers_bidirectional", false), {{in[1], in[2]}});
    return Results{{"out", out.data}, {"h_n", std::get<0>(state)}, {"c_n", std::get<1>(state)}};
  });
  nn::GRU gru(3, 4, {.batch_first = true, .bidirectional = true});
  check_rnn(gru, "packed_gru_batch_first_bidirectional", [&](const std::vector<Tensor>& in) {
    auto [out, h] = gru.forward_with_packed_input(packed_input(in[0], "packed_gru_batch_first_bidirectional", true));
    return Results{{"out", out.data}, {"h_n", h}};
  });
  nn::RNN relu(3, 4, {.nonlinearity = "relu"});
  check_rnn(relu, "packed_rnn_relu", [&](const std::vector<Tensor>& in) {
    auto [out, h] = relu.forward_with_packed_input(packed_input(in[0], "packed_rnn_relu", false), in[1]);
    return Results{{"out", out.data}, {"h_n", h}};
  });
}

TEST_CASE("pad_sequence, pack_sequence and pad_packed_sequence match torch and invert each other", "[nn][rnn][packed]") {
  namespace rnn_utils = nn::utils::rnn;
  const test::NnCase& c = test::nn_case("padded_sequences");
  const std::vector<Tensor> seqs = {c.at("seq.0"), c.at("seq.1"), c.at("seq.2")};
  test::check_equal(rnn_utils::pad_sequence(seqs, true, -1.5), c.at("pad_sequence_batch_first"));
  const rnn_utils::PackedSequence packed = rnn_utils::pack_sequence(seqs, false);
  test::check_equal(packed.data, c.at("pack_sequence.data"));
  test::check_equal(packed.batch_sizes, c.at("pack_sequence.batch_sizes"));
  test::check_equal(packed.sorted_indices, c.at("pack_sequence.sorted_indices"));
  test::check_equal(packed.unsorted_indices, c.at("pack_sequence.unsorted_indices"));
  auto [padded, lengths] = rnn_utils::pad_packed_sequence(packed, false, 2.0, 6);
  test::check_equal(padded, c.at("pad_packed"));
  test::check_equal(lengths, c.at("pad_packed.lengths"));
  // batch_first both ways, and the gradient of the padded data reaches only the packed steps.
  const Tensor x = test::sample({2, 4, 3}, kFloat64).requires_grad_();
  const rnn_utils::PackedSequence p = rnn_utils::pack_padded_sequence(x, from_vector<int64_t>({4, 2}), true);
  CHECK_FALSE(p.sorted_indices.defined());  // enforce_sorted: the batch came sorted
  auto [back, back_lengths] = rnn_utils::pad_packed_sequence(p, true);
  const Tensor mask = from_vector<double>({1, 1, 1, 1, 1, 1, 0, 0}, {2, 4, 1});
  test::check_equal(back, x * mask);
  back.sum().backward();
  test::check_equal(x.grad(), mask.expand({2, 4, 3}));
}

TEST_CASE("A sequence in a packed batch gives what it gives alone", "[nn][rnn][packed]") {
  // The state stops at each sequence's last step and the reverse direction starts there: each sequence's
  // h_n and outputs equal those of the same layer run on that sequence alone.
  nn::LSTM lstm(3, 5, {.num_layers = 2, .bidirectional = true, .proj_size = 2});
  lstm.to(kFloat64);
  const std::vector<Tensor> seqs = {test::sample({2, 3}, kFloat64, 0.1), test::sample({5, 3}, kFloat64, 0.2),
                                    test::sample({3, 3}, kFloat64, 0.3)};
  auto [out, state] = lstm.forward_with_packed_input(nn::utils::rnn::pack_sequence(seqs, false));
  auto [padded, lengths] = nn::utils::rnn::pad_packed_sequence(out);
  for (int64_t n = 0; n < 3; ++n) {
    INFO("sequence " << n);
    auto [alone, alone_state] = lstm.forward(seqs[n], std::nullopt);  // unbatched (L, 3)
    test::check_close(padded.select(1, n).narrow(0, 0, seqs[n].size(0)), alone);
    test::check_close(std::get<0>(state).select(1, n), std::get<0>(alone_state));
    test::check_close(std::get<1>(state).select(1, n), std::get<1>(alone_state));
  }
}

TEST_CASE("Packing refuses bad lengths with a clear Error", "[nn][rnn][packed][errors]") {
  namespace rnn_utils = nn::utils::rnn;
  const Tensor x = zeros({4, 3, 2});
  test::check_error([&] { rnn_utils::pack_padded_sequence(x, from_vector<int64_t>({4, 2, 3})); },
                    {"pack_padded_sequence", "enforce_sorted", "lengths[2] = 3 > lengths[1] = 2", "enforce_sorted = false"});
  test::check_error([&] { rnn_utils::pack_padded_sequence(x, from_vector<int64_t>({4, 0, 0}), false, false); },
                    {"pack_padded_sequence", "lengths[1] is 0", "[1, 4]"});
  test::check_error([&] { rnn_utils::pack_padded_sequence(x, from_vector<int64_t>({5, 2, 1})); },
                    {"pack_padded_sequence", "lengths[0] is 5"});
  test::check_error([&] { rnn_utils::pack_padded_sequence(x, from_vector<int64_t>({4, 2})); },
                    {"pack_padded_sequence", "2 entries for a batch of 3"});
  test::check_error([&] { rnn_utils::pack_padded_sequence(x, from_vector<float>({4, 2, 1})); },
                    {"pack_padded_sequence", "lengths must be a 1-D int64 or int32 tensor"});
  test::check_error([] { rnn_utils::pad_sequence({zeros({2, 3}), zeros({2, 4})}); },
                    {"pad_sequence", "sequence 1 has trailing shape [4]", "[3]"});
  test::check_error([] { rnn_utils::pad_sequence({}); }, {"pad_sequence", "at least one"});
  const rnn_utils::PackedSequence p = rnn_utils::pack_padded_sequence(x, from_vector<int64_t>({4, 2, 1}));
  test::check_error([&] { rnn_utils::pad_packed_sequence(p, false, 0.0, 3); }, {"total_length 3", "4 steps"});
  rnn_utils::PackedSequence broken = p;
  broken.data = zeros({5, 2});
  test::check_error([&] { rnn_utils::pad_packed_sequence(broken); }, {"batch_sizes sum to 7", "data has 5 rows"});
  nn::GRU gru(3, 4);
  test::check_error([&] { gru.forward_with_packed_input(p); },
                    {"nn::GRU: expected a PackedSequence of steps (sum of the lengths, 3)", "[7, 2]"});
}

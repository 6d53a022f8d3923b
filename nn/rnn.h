// nn/rnn.h: the recurrent layers of torch.nn: RNN (tanh or relu), LSTM (with proj_size) and GRU,
// multi-layer and bidirectional, and their cells RNNCell, LSTMCell and GRUCell. Parameters under
// PyTorch's names and in its order (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ..._reverse,
// weight_hr_l0 for a projection), gates in its order (LSTM i, f, g, o; GRU r, z, n), all initialised
// U(+-1/sqrt(hidden_size)); so PyTorch's state dicts load as they are.
//
//   nn::LSTM lstm(32, 64, {.num_layers = 2, .batch_first = true});
//   auto [out, state] = lstm.forward(x, std::nullopt);  // out (N, L, 64); (h_n, c_n), (2, N, 64) each
//   auto [h_n, c_n] = state;
//
// Note [recurrence as ops]: each layer multiplies the whole input sequence by weight_ih in one GEMM,
// then steps through time with one small GEMM by weight_hh and the gates' elementwise ops per step, all
// recorded ops: so any device, the backward (through time) is autograd's, and differentiable twice.
// Sequences of different lengths go in packed (nn/packed_sequence.h) through forward_with_packed_input:
// each sequence then runs for its own length (a step past it keeps the state), so h_n is the state at
// its last step and the reverse direction starts there. A padded batch given to forward runs every
// sequence over the padding too.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "nn/module.h"
#include "nn/packed_sequence.h"

namespace kiln::nn {

// torch.nn.RNN's, LSTM's and GRU's keyword arguments after input_size and hidden_size.
struct RNNOptions {
  int64_t num_layers = 1;
  std::string nonlinearity = "tanh";  // RNN only: "tanh" or "relu"
  bool bias = true;                   // bias_ih and bias_hh
  bool batch_first = false;           // input and output (N, L, H) instead of (L, N, H); not the states
  double dropout = 0.0;               // on every layer's output but the last's, in training
  bool bidirectional = false;
  int64_t proj_size = 0;  // LSTM only: h projected to proj_size features by weight_hr (0: none)
};

// What RNN, LSTM and GRU share: the parameters of each (layer, direction), the checks of the input and
// the states, and the loop over layers and directions. Input (L, N, input_size), (N, L, input_size)
// with batch_first, or (L, input_size) unbatched; states (num_layers * directions, N, H), or without N.
class RNNBase : public Module {
 public:
  std::string extra_repr() const override;
  void reset_parameters();  // every parameter U(+-1/sqrt(hidden_size)), as PyTorch
  // The parameters of layer `layer`, direction `direction` (1: reverse): w_ih, w_hh, then b_ih and b_hh
  // with bias, then w_hr with a projection; looked up by name, so a set_parameter takes effect.
  std::vector<Tensor> layer_parameters(int64_t layer, int direction) const;

  std::string mode;  // "RNN_TANH", "RNN_RELU", "LSTM" or "GRU"
  int64_t input_size, hidden_size;
  RNNOptions options;

 protected:
  RNNBase(std::string mode, int64_t input_size, int64_t hidden_size, RNNOptions options);
  // The output and the final states (h_n, and c_n for an LSTM) for the states given (undefined: zeros).
  // With `lengths` (one per sequence), input and output are time-major (L, N, *) whatever batch_first
  // says, and sequence n runs for its first lengths[n] steps only.
  std::tuple<Tensor, Tensor, Tensor> run(const Tensor& input, const Tensor& h0, const Tensor& c0,
                                         const std::vector<int64_t>* lengths = nullptr);
  // run over a packed input; the output packed as the input.
  std::tuple<utils::rnn::PackedSequence, Tensor, Tensor> run_packed(const utils::rnn::PackedSequence& input,
                                                                   const Tensor& h0, const Tensor& c0);

 private:
  std::vector<std::vector<std::string>> names_;  // per (layer, direction), as layer_parameters
};

// Elman RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu.
class RNN : public RNNBase {
 public:
  RNN(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, Tensor())); }
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& hx);  // (output, h_n)
  // (packed output, h_n) for sequences of different lengths; hx and h_n in the batch's order.
  std::tuple<utils::rnn::PackedSequence, Tensor> forward_with_packed_input(const utils::rnn::PackedSequence& input,
                                                                           const Tensor& hx = {});
};

// LSTM: i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of the gates; c_t = f c_{t-1} + i g;
// h_t = o tanh(c_t), projected by weight_hr with proj_size.
class LSTM : public RNNBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, std::nullopt)); }
  // (output, (h_n, c_n)); hx = (h_0, c_0), zeros when unset.
  std::tuple<Tensor, std::tuple<Tensor, Tensor>> forward(const Tensor& input,
                                                         const std::optional<std::tuple<Tensor, Tensor>>& hx);
  std::tuple<utils::rnn::PackedSequence, std::tuple<Tensor, Tensor>> forward_with_packed_input(
      const utils::rnn::PackedSequence& input, const std::optional<std::tuple<Tensor, Tensor>>& hx = std::nullopt);
};

// GRU: r, z = sigmoid of their gates; n = tanh(x W_in^T + b_in + r (h W_hn^T + b_hn));
// h_t = (1 - z) n + z h_{t-1}.
class GRU : public RNNBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, Tensor())); }
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& hx);  // (output, h_n)
  std::tuple<utils::rnn::PackedSequence, Tensor> forward_with_packed_input(const utils::rnn::PackedSequence& input,
                                                                           const Tensor& hx = {});
};

struct RNNCellOptions {
  bool bias = true;
  std::string nonlinearity = "tanh";  // RNNCell only
};

// One time step (torch.nn.RNNCell, LSTMCell, GRUCell): input (N, input_size) or (input_size), state
// (N, hidden_size) or (hidden_size), zeros when undefined; parameters weight_ih, weight_hh, bias_ih,
// bias_hh, U(+-1/sqrt(hidden_size)).
class RNNCellBase : public Module {
 public:
  std::string extra_repr() const override;

  std::string mode;
  int64_t input_size, hidden_size;
  RNNCellOptions options;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;

 protected:
  RNNCellBase(std::string mode, int64_t input_size, int64_t hidden_size, RNNCellOptions options);
  // The input and a state as (N, ...) and whether the input was unbatched.
  std::tuple<Tensor, Tensor, bool> batched(const Tensor& input, const Tensor& state, const char* which) const;
};

class RNNCell : public RNNCellBase {
 public:
  RNNCell(int64_t input_size, int64_t hidden_size, RNNCellOptions options = {});
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  Tensor forward(const Tensor& input, const Tensor& hx);
};

class LSTMCell : public RNNCellBase {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, RNNCellOptions options = {});
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, std::nullopt)); }
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const std::optional<std::tuple<Tensor, Tensor>>& hx);
};

class GRUCell : public RNNCellBase {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, RNNCellOptions options = {});
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  Tensor forward(const Tensor& input, const Tensor& hx);
};

}  // namespace kiln::nn

// nn/rnn.cpp: see nn/rnn.h (Note [recurrence as ops]).
#include "nn/rnn.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "core/grad_mode.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "ops/ops.h"

namespace kiln::nn {

namespace {

int64_t gates_of(const std::string& mode) { return mode == "LSTM" ? 4 : mode == "GRU" ? 3 : 1; }

// One step of a cell: the new h (and c for an LSTM) from the input's gate pre-activations gi =
// x W_ih^T + b_ih (computed for the whole sequence at once by a layer) and the state.
std::pair<Tensor, Tensor> step(const std::string& mode, const Tensor& gi, const Tensor& h, const Tensor& c,
                               const Tensor& w_hh, const Tensor& b_hh, const Tensor& w_hr) {
  const Tensor gh = linear(h, w_hh, b_hh);
  if (mode == "RNN_TANH") return {tanh(gi + gh), {}};
  if (mode == "RNN_RELU") return {relu(gi + gh), {}};
  if (mode == "LSTM") {
    const std::vector<Tensor> g = (gi + gh).chunk(4, -1);  // i, f, g, o
    const Tensor c_next = sigmoid(g[1]) * c + sigmoid(g[0]) * tanh(g[2]);
    Tensor h_next = sigmoid(g[3]) * tanh(c_next);
    if (w_hr.defined()) h_next = linear(h_next, w_hr);
    return {h_next, c_next};
  }
  const std::vector<Tensor> x = gi.chunk(3, -1), s = gh.chunk(3, -1);  // r, z, n
  const Tensor r = sigmoid(x[0] + s[0]), z = sigmoid(x[1] + s[1]);
  const Tensor n = tanh(x[2] + r * s[2]);
  return {n + z * (h - n), {}};  // (1 - z) n + z h
}

// An Elman RNN's mode for its nonlinearity ("tanh" or "relu", else an Error naming the layer).
std::string elman_mode(const std::string& nonlinearity, const char* layer) {
  KILN_CHECK(nonlinearity == "tanh" || nonlinearity == "relu",
             "nn::{}: nonlinearity must be \"tanh\" or \"relu\", got \"{}\"", layer, nonlinearity);
  return nonlinearity == "relu" ? "RNN_RELU" : "RNN_TANH";
}

std::string repr_head(int64_t input_size, int64_t hidden_size) {
  return fmt::format("{}, {}", input_size, hidden_size);
}

}  // namespace

// ---- RNN, LSTM, GRU ----

RNNBase::RNNBase(std::string mode, int64_t input_size, int64_t hidden_size, RNNOptions options)
    : mode(std::move(mode)), input_size(input_size), hidden_size(hidden_size), options(std::move(options)) {
  const char* layer = this->mode == "LSTM" ? "LSTM" : this->mode == "GRU" ? "GRU" : "RNN";
  const RNNOptions& o = this->options;
  KILN_CHECK(input_size > 0 && hidden_size > 0, "nn::{}: input_size and hidden_size must be positive, got {} and {}",
             layer, input_size, hidden_size);
  KILN_CHECK(o.num_layers >= 1, "nn::{}: num_layers must be positive, got {}", layer, o.num_layers);
  KILN_CHECK(o.nonlinearity == "tanh" || this->mode.starts_with("RNN"),
             "nn::{}: nonlinearity is nn::RNN's option (an {} has its own gates), got \"{}\"", layer, layer,
             o.nonlinearity);
  KILN_CHECK(o.dropout >= 0 && o.dropout <= 1, "nn::{}: dropout must be in [0, 1], got {}", layer, o.dropout);
  KILN_CHECK(o.proj_size >= 0 && o.proj_size < hidden_size && (o.proj_size == 0 || this->mode == "LSTM"),
             "nn::{}: proj_size must be 0, or for an LSTM in [0, hidden_size = {}), got {}", layer, hidden_size,
             o.proj_size);
  const int64_t gate_size = gates_of(this->mode) * hidden_size;
  const int64_t real_hidden = o.proj_size > 0 ? o.proj_size : hidden_size;
  const int directions = o.bidirectional ? 2 : 1;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    for (int dir = 0; dir < directions; ++dir) {
      const std::string suffix = fmt::format("_l{}{}", l, dir == 1 ? "_reverse" : "");
      const int64_t layer_input = l == 0 ? input_size : real_hidden * directions;
      std::vector<std::pair<std::string, Shape>> w = {{"weight_ih", {gate_size, layer_input}},
                                                      {"weight_hh", {gate_size, real_hidden}}};
      if (o.bias) w.insert(w.end(), {{"bias_ih", {gate_size}}, {"bias_hh", {gate_size}}});
      if (o.proj_size > 0) w.push_back({"weight_hr", {o.proj_size, hidden_size}});
      std::vector<std::string>& names = names_.emplace_back();
      for (const auto& [stem, shape] : w) {
        names.push_back(stem + suffix);
        register_parameter(names.back(), empty(shape));
      }
    }
  }
  reset_parameters();
}

void RNNBase::reset_parameters() {
  const double bound = 1 / std::sqrt(static_cast<double>(hidden_size));
  for (Tensor& p : parameters()) init::uniform_(p, -bound, bound);
}

std::vector<Tensor> RNNBase::layer_parameters(int64_t layer, int direction) const {
  const int directions = options.bidirectional ? 2 : 1;
  KILN_CHECK(layer >= 0 && layer < options.num_layers && direction >= 0 && direction < directions,
             "nn::{}: there is no layer {} direction {} ({} layers, {} directions)", name(), layer, direction,
             options.num_layers, directions);
  std::vector<Tensor> found;
  for (const std::string& wanted : names_[static_cast<size_t>(layer * directions + direction)]) {
    found.push_back(own_parameter(wanted));
    KILN_CHECK(found.back().defined(), "nn::{}: its parameter {} is missing", name(), wanted);
  }
  return found;
}

std::string RNNBase::extra_repr() const {  // PyTorch's: the options that differ from the defaults
  const RNNOptions& o = options;
  std::string s = repr_head(input_size, hidden_size);
  if (o.proj_size != 0) s += fmt::format(", proj_size={}", o.proj_size);
  if (o.num_layers != 1) s += fmt::format(", num_layers={}", o.num_layers);
  if (!o.bias) s += ", bias=False";
  if (o.batch_first) s += ", batch_first=True";
  if (o.dropout != 0) s += ", dropout=" + py_float(o.dropout);
  if (o.bidirectional) s += ", bidirectional=True";
  return s;
}

std::tuple<Tensor, Tensor, Tensor> RNNBase::run(const Tensor& input, const Tensor& h0_in, const Tensor& c0_in,
                                                const std::vector<int64_t>* lengths) {
  const char* layer = name() == "LSTM" ? "nn::LSTM" : name() == "GRU" ? "nn::GRU" : "nn::RNN";
  const RNNOptions& o = options;
  const int directions = o.bidirectional ? 2 : 1;
  const int64_t real_hidden = o.proj_size > 0 ? o.proj_size : hidden_size;
  const bool batch_first = o.batch_first && lengths == nullptr;
  KILN_CHECK((input.dim() == 2 || input.dim() == 3) && input.size(-1) == input_size,
             "{}: expected an input ({}, {}) or unbatched (L, {}), got shape {}", layer,
             batch_first ? "N, L" : "L, N", input_size, input_size, input.sizes().str());
  const bool unbatched = input.dim() == 2;
  Tensor x = unbatched ? input.unsqueeze(1) : batch_first ? input.transpose(0, 1) : input;  // (L, N, in)
  const int64_t L = x.size(0), N = x.size(1), states = o.num_layers * directions;
  KILN_CHECK(L > 0, "{}: the sequence length must be above 0, got input {}", layer, input.sizes().str());
  // A state given (num_layers * directions, N, size), or without N for an unbatched input.
  auto state = [&](const Tensor& given, int64_t size, const char* what) {
    if (!given.defined()) return zeros({states, N, size}, x.options());
    const Shape want = unbatched ? Shape{states, size} : Shape{states, N, size};
    KILN_CHECK(given.sizes() == want, "{}: {} must have shape {} (num_layers * directions, {}{}), got {}", layer, what,
               want.str(), unbatched ? "" : "N, ", size, given.sizes().str());
    return unbatched ? given.unsqueeze(1) : given;
  };
  const Tensor h0 = state(h0_in, real_hidden, mode == "LSTM" ? "h_0" : "hx");
  const Tensor c0 = mode == "LSTM" ? state(c0_in, hidden_size, "c_0") : Tensor();
  // With lengths, a step past a sequence's end keeps its state: the forward direction's state stops at
  // its last step, and the reverse direction's stays h_0 until its last step, where it starts.
  const Tensor steps_of = lengths ? from_vector(*lengths, {N, 1}, x.device()) : Tensor();
  std::vector<Tensor> h_n, c_n;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    std::vector<Tensor> outs;
    for (int dir = 0; dir < directions; ++dir) {
      const std::vector<Tensor> w = layer_parameters(l, dir);
      const Tensor b_ih = o.bias ? w[2] : Tensor(), b_hh = o.bias ? w[3] : Tensor();
      const Tensor w_hr = o.proj_size > 0 ? w.back() : Tensor();
      const Tensor gi = linear(x, w[0], b_ih);  // every step's input gates in one GEMM
      const int64_t k = l * directions + dir;
      Tensor h = h0[k], c = c0.defined() ? c0[k] : Tensor();
      std::vector<Tensor> ys(static_cast<size_t>(L));
      for (int64_t i = 0; i < L; ++i) {
        const int64_t t = dir == 0 ? i : L - 1 - i;
        auto [h_next, c_next] = step(mode, gi[t], h, c, w[1], b_hh, w_hr);
        if (steps_of.defined()) {
          const Tensor running = steps_of.gt(t);
          h = where(running, h_next, h);
          if (c.defined()) c = where(running, c_next, c);
        } else {
          h = h_next;
          c = c_next;
        }
        ys[static_cast<size_t>(t)] = h;
      }
      outs.push_back(stack(ys, 0));
      h_n.push_back(h);
      if (c.defined()) c_n.push_back(c);
    }
    x = directions == 1 ? outs[0] : cat(outs, -1);
    if (l + 1 < o.num_layers && o.dropout > 0 && is_training()) x = dropout(x, o.dropout, true);
  }
  Tensor out = unbatched ? x.squeeze(1) : batch_first ? x.transpose(0, 1) : x;
  Tensor hn = stack(h_n, 0), cn = c_n.empty() ? Tensor() : stack(c_n, 0);
  if (unbatched) {
    hn = hn.squeeze(1);
    if (cn.defined()) cn = cn.squeeze(1);
  }
  return {out, hn, cn};
}

std::tuple<utils::rnn::PackedSequence, Tensor, Tensor> RNNBase::run_packed(const utils::rnn::PackedSequence& input,
                                                                          const Tensor& h0, const Tensor& c0) {
  KILN_CHECK(input.data.defined() && input.data.dim() == 2 && input.data.size(1) == input_size,
             "nn::{}: expected a PackedSequence of steps (sum of the lengths, {}), got data of shape {}", name(),
             input_size, input.data.defined() ? input.data.sizes().str() : std::string("none"));
  auto [padded, lengths] = utils::rnn::pad_packed_sequence(input);  // (L, N, in), the batch's order
  const std::vector<int64_t> steps = lengths.to_vector<int64_t>();
  auto [out, h, c] = run(padded, h0, c0, &steps);
  return {utils::rnn::pack_like(out, input), h, c};
}

RNN::RNN(int64_t input_size, int64_t hidden_size, RNNOptions options)
    : RNNBase(elman_mode(options.nonlinearity, "RNN"), input_size, hidden_size, options) {}

std::tuple<Tensor, Tensor> RNN::forward(const Tensor& input, const Tensor& hx) {
  auto [out, h, c] = run(input, hx, Tensor());
  return {out, h};
}

std::tuple<utils::rnn::PackedSequence, Tensor> RNN::forward_with_packed_input(const utils::rnn::PackedSequence& input,
                                                                              const Tensor& hx) {
  auto [out, h, c] = run_packed(input, hx, Tensor());
  return {out, h};
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, RNNOptions options)
    : RNNBase("LSTM", input_size, hidden_size, std::move(options)) {}

std::tuple<Tensor, std::tuple<Tensor, Tensor>> LSTM::forward(const Tensor& input,
                                                             const std::optional<std::tuple<Tensor, Tensor>>& hx) {
  auto [out, h, c] = hx ? run(input, std::get<0>(*hx), std::get<1>(*hx)) : run(input, Tensor(), Tensor());
  return {out, {h, c}};
}

std::tuple<utils::rnn::PackedSequence, std::tuple<Tensor, Tensor>> LSTM::forward_with_packed_input(
    const utils::rnn::PackedSequence& input, const std::optional<std::tuple<Tensor, Tensor>>& hx) {
  auto [out, h, c] = hx ? run_packed(input, std::get<0>(*hx), std::get<1>(*hx)) : run_packed(input, {}, {});
  return {out, {h, c}};
}

GRU::GRU(int64_t input_size, int64_t hidden_size, RNNOptions options)
    : RNNBase("GRU", input_size, hidden_size, std::move(options)) {}

std::tuple<Tensor, Tensor> GRU::forward(const Tensor& input, const Tensor& hx) {
  auto [out, h, c] = run(input, hx, Tensor());
  return {out, h};
}

std::tuple<utils::rnn::PackedSequence, Tensor> GRU::forward_with_packed_input(const utils::rnn::PackedSequence& input,
                                                                              const Tensor& hx) {
  auto [out, h, c] = run_packed(input, hx, Tensor());
  return {out, h};
}

// ---- the cells ----

RNNCellBase::RNNCellBase(std::string mode, int64_t input_size, int64_t hidden_size, RNNCellOptions options)
    : mode(std::move(mode)), input_size(input_size), hidden_size(hidden_size), options(std::move(options)) {
  const char* cell = this->mode == "LSTM" ? "LSTMCell" : this->mode == "GRU" ? "GRUCell" : "RNNCell";
  KILN_CHECK(input_size > 0 && hidden_size > 0, "nn::{}: input_size and hidden_size must be positive, got {} and {}",
             cell, input_size, hidden_size);
  KILN_CHECK(this->options.nonlinearity == "tanh" || this->mode.starts_with("RNN"),
             "nn::{}: nonlinearity is nn::RNNCell's option (an {} has its own gates), got \"{}\"", cell, cell,
             this->options.nonlinearity);
  const int64_t gate_size = gates_of(this->mode) * hidden_size;
  weight_ih = register_parameter("weight_ih", empty({gate_size, input_size}));
  weight_hh = register_parameter("weight_hh", empty({gate_size, hidden_size}));
  if (this->options.bias) {
    bias_ih = register_parameter("bias_ih", empty({gate_size}));
    bias_hh = register_parameter("bias_hh", empty({gate_size}));
  }
  const double bound = 1 / std::sqrt(static_cast<double>(hidden_size));
  for (Tensor& p : parameters()) init::uniform_(p, -bound, bound);
}

std::string RNNCellBase::extra_repr() const {
  std::string s = repr_head(input_size, hidden_size);
  if (!options.bias) s += ", bias=False";
  if (mode == "RNN_RELU") s += ", nonlinearity=relu";
  return s;
}

std::tuple<Tensor, Tensor, bool> RNNCellBase::batched(const Tensor& input, const Tensor& state,
                                                      const char* which) const {
  KILN_CHECK((input.dim() == 1 || input.dim() == 2) && input.size(-1) == input_size,
             "nn::{}: expected an input (N, {}) or unbatched ({}), got shape {}", name(), input_size, input_size,
             input.sizes().str());
  const bool unbatched = input.dim() == 1;
  const Tensor x = unbatched ? input.unsqueeze(0) : input;
  if (!state.defined()) return {x, zeros({x.size(0), hidden_size}, x.options()), unbatched};
  const Shape want = unbatched ? Shape{hidden_size} : Shape{x.size(0), hidden_size};
  KILN_CHECK(state.sizes() == want, "nn::{}: {} must have shape {}, got {}", name(), which, want.str(),
             state.sizes().str());
  return {x, unbatched ? state.unsqueeze(0) : state, unbatched};
}

RNNCell::RNNCell(int64_t input_size, int64_t hidden_size, RNNCellOptions options)
    : RNNCellBase(elman_mode(options.nonlinearity, "RNNCell"), input_size, hidden_size, options) {}

Tensor RNNCell::forward(const Tensor& input, const Tensor& hx) {
  auto [x, h, unbatched] = batched(input, hx, "hx");
  Tensor y = step(mode, linear(x, weight_ih, bias_ih), h, {}, weight_hh, bias_hh, {}).first;
  return unbatched ? y.squeeze(0) : y;
}

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, RNNCellOptions options)
    : RNNCellBase("LSTM", input_size, hidden_size, std::move(options)) {}

std::tuple<Tensor, Tensor> LSTMCell::forward(const Tensor& input, const std::optional<std::tuple<Tensor, Tensor>>& hx) {
  auto [x, h, unbatched] = batched(input, hx ? std::get<0>(*hx) : Tensor(), "h_0");
  const Tensor c = std::get<1>(batched(input, hx ? std::get<1>(*hx) : Tensor(), "c_0"));
  auto [h1, c1] = step(mode, linear(x, weight_ih, bias_ih), h, c, weight_hh, bias_hh, {});
  if (unbatched) return {h1.squeeze(0), c1.squeeze(0)};
  return {h1, c1};
}

GRUCell::GRUCell(int64_t input_size, int64_t hidden_size, RNNCellOptions options)
    : RNNCellBase("GRU", input_size, hidden_size, std::move(options)) {}

Tensor GRUCell::forward(const Tensor& input, const Tensor& hx) {
  auto [x, h, unbatched] = batched(input, hx, "hx");
  Tensor y = step(mode, linear(x, weight_ih, bias_ih), h, {}, weight_hh, bias_hh, {}).first;
  return unbatched ? y.squeeze(0) : y;
}

}  // namespace kiln::nn

// nn/transformer.cpp: see nn/transformer.h.
#include "nn/transformer.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "core/grad_mode.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace kiln::nn {

namespace {

// (B, T, C) -> (B, heads, T, C / heads): a view, no copy.
Tensor split_heads(const Tensor& x, int64_t heads) {
  const int64_t B = x.sizes()[0], T = x.sizes()[1], C = x.sizes()[2];
  return x.view({B, T, heads, C / heads}).transpose(1, 2);
}

// (B, heads, T, d) -> (B, T, heads * d): a view when y's memory is (B, T, heads, d), as the fused
// scaled_dot_product_attention returns it (Note [attention layout], ops/attention.cpp); else a copy.
Tensor merge_heads(const Tensor& y) {
  const int64_t B = y.sizes()[0], H = y.sizes()[1], T = y.sizes()[2], d = y.sizes()[3];
  return y.transpose(1, 2).reshape({B, T, H * d});
}

}  // namespace

// ---- MultiheadAttention ----

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options)
    : embed_dim(embed_dim),
      num_heads(num_heads),
      kdim(options.kdim.value_or(embed_dim)),
      vdim(options.vdim.value_or(embed_dim)),
      options(options),
      out_proj(embed_dim, embed_dim, {options.bias}) {
  KILN_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0,
             "nn::MultiheadAttention: embed_dim ({}) must be a positive multiple of num_heads ({})", embed_dim,
             num_heads);
  KILN_CHECK(options.dropout >= 0 && options.dropout < 1, "nn::MultiheadAttention: dropout must be in [0, 1), got {}",
             options.dropout);
  KILN_CHECK(kdim > 0 && vdim > 0, "nn::MultiheadAttention: kdim and vdim must be positive, got {} and {}", kdim, vdim);
  // PyTorch's order: the projections, in_proj_bias, out_proj, then bias_k and bias_v.
  if (kdim == embed_dim && vdim == embed_dim) {
    in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
    init::xavier_uniform_(in_proj_weight);
  } else {
    q_proj_weight = register_parameter("q_proj_weight", empty({embed_dim, embed_dim}));
    k_proj_weight = register_parameter("k_proj_weight", empty({embed_dim, kdim}));
    v_proj_weight = register_parameter("v_proj_weight", empty({embed_dim, vdim}));
    for (Tensor* w : {&q_proj_weight, &k_proj_weight, &v_proj_weight}) init::xavier_uniform_(*w);
  }
  if (options.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * embed_dim}));
  register_module("out_proj", out_proj);
  if (out_proj.bias.defined()) init::zeros_(out_proj.bias);
  if (options.add_bias_kv) {
    bias_k = register_parameter("bias_k", empty({1, 1, embed_dim}));
    bias_v = register_parameter("bias_v", empty({1, 1, embed_dim}));
    init::xavier_normal_(bias_k);
    init::xavier_normal_(bias_v);
  }
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const MultiheadAttentionCall& call) {
  return std::get<0>(attend(query, key, value, call, false));
}

std::tuple<Tensor, Tensor> MultiheadAttention::forward_with_weights(const Tensor& query, const Tensor& key,
                                                                    const Tensor& value,
                                                                    const MultiheadAttentionCall& call) {
  return attend(query, key, value, call, true);
}

namespace {

// m with `extra` more columns (its last dim) of zeros: false for a bool mask (attend), 0 for a float one.
Tensor with_zero_columns(const Tensor& m, int64_t extra) {
  Shape tail = m.sizes();
  tail[tail.size() - 1] = extra;
  return cat({m, zeros(tail, m.options())}, -1);
}

}  // namespace

std::tuple<Tensor, Tensor> MultiheadAttention::attend(const Tensor& query, const Tensor& key, const Tensor& value,
                                                      const MultiheadAttentionCall& call, bool need_weights) {
  const char* op = "nn::MultiheadAttention";
  if (query.dim() == 2 && key.dim() == 2 && value.dim() == 2) {
    // Unbatched, as PyTorch: (L, E) inputs, a (S) key_padding_mask, an (L, S) or (num_heads, L, S)
    // attn_mask; one sequence run as a batch of one.
    const int64_t batch_dim = options.batch_first ? 0 : 1;
    MultiheadAttentionCall one = call;
    if (call.key_padding_mask.defined()) {
      KILN_CHECK(call.key_padding_mask.dim() == 1, "{}: with unbatched (L, E) inputs key_padding_mask must be (S), got {}",
                 op, call.key_padding_mask.sizes().str());
      one.key_padding_mask = call.key_padding_mask.unsqueeze(0);
    }
    const Tensor q = query.unsqueeze(batch_dim);
    const bool self = query.is_same(key) && key.is_same(value);  // kept self-attention: one projection
    auto [out, weights] = self ? attend(q, q, q, one, need_weights)
                               : attend(q, key.unsqueeze(batch_dim), value.unsqueeze(batch_dim), one, need_weights);
    return {out.squeeze(batch_dim), weights.defined() ? weights.squeeze(0) : weights};
  }
  KILN_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
             "{}: query, key and value must be 3-D ({}), or all 2-D (L, E) for one unbatched sequence, got shapes {}, "
             "{} and {}", op, options.batch_first ? "N, L, E" : "L, N, E", query.sizes().str(), key.sizes().str(),
             value.sizes().str());
  KILN_CHECK(query.sizes()[2] == embed_dim && key.sizes()[2] == kdim && value.sizes()[2] == vdim,
             "{}: the last dim of query, key and value must be embed_dim = {}, kdim = {} and vdim = {}, got shapes "
             "{}, {} and {}", op, embed_dim, kdim, vdim, query.sizes().str(), key.sizes().str(), value.sizes().str());
  auto batch_first = [&](const Tensor& t) { return options.batch_first ? t : t.transpose(0, 1); };
  Tensor q, k, v;
  if (in_proj_weight.defined() && query.is_same(key) && key.is_same(value)) {  // one projection for the three
    auto qkv = linear(batch_first(query), in_proj_weight, in_proj_bias).chunk(3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    std::vector<Tensor> w = in_proj_weight.defined() ? in_proj_weight.chunk(3, 0)
                                                     : std::vector<Tensor>{q_proj_weight, k_proj_weight, v_proj_weight};
    std::vector<Tensor> b = in_proj_bias.defined() ? in_proj_bias.chunk(3, 0) : std::vector<Tensor>(3);
    q = linear(batch_first(query), w[0], b[0]);
    k = linear(batch_first(key), w[1], b[1]);
    v = linear(batch_first(value), w[2], b[2]);
  }
  const int64_t N = q.sizes()[0], L = q.sizes()[1], given_S = k.sizes()[1];
  KILN_CHECK(k.sizes()[0] == N && v.sizes()[0] == N && v.sizes()[1] == given_S,
             "{}: query, key and value disagree on the batch size or the key length: shapes {}, {} and {}", op,
             query.sizes().str(), key.sizes().str(), value.sizes().str());

  // PyTorch's masks say where NOT to attend (true = masked out); scaled_dot_product_attention's bool
  // mask says where to attend. A float mask is added as it is.
  Tensor mask = call.attn_mask, padding = call.key_padding_mask;
  bool causal = call.is_causal;
  if (mask.defined()) {
    KILN_CHECK(mask.sizes() == Shape({L, given_S}) || mask.sizes() == Shape({N * num_heads, L, given_S}),
               "{}: attn_mask must be (L, S) = ({}, {}) or (N * num_heads, L, S) = ({}, {}, {}), got shape {}", op,
               L, given_S, N * num_heads, L, given_S, mask.sizes().str());
    causal = false;  // PyTorch: with attn_mask, is_causal is only a hint that the mask is causal
  }
  if (padding.defined()) {
    KILN_CHECK(padding.dtype() == kBool && padding.sizes() == Shape({N, given_S}),
               "{}: key_padding_mask must be a bool (N, S) = ({}, {}) tensor, got {} of shape {}", op, N, given_S,
               dtype_name(padding.dtype()), padding.sizes().str());
  }
  // The appended keys and values (bias_k and bias_v, then a zero one per head) are attended by every
  // query: the masks get as many columns that mask nothing, as PyTorch pads them.
  const int64_t head_dim = embed_dim / num_heads;
  int64_t S = given_S;
  if (bias_k.defined()) {
    k = cat({k, bias_k.expand({N, 1, embed_dim})}, 1);
    v = cat({v, bias_v.expand({N, 1, embed_dim})}, 1);
    S += 1;
  }
  Tensor qh = split_heads(q, num_heads), kh = split_heads(k, num_heads), vh = split_heads(v, num_heads);
  if (options.add_zero_attn) {
    kh = cat({kh, zeros({N, num_heads, 1, head_dim}, kh.options())}, 2);
    vh = cat({vh, zeros({N, num_heads, 1, head_dim}, vh.options())}, 2);
    S += 1;
  }
  if (S > given_S) {
    if (causal) {  // over the given keys only
      mask = ones({L, given_S}, TensorOptions().dtype(kBool).device(q.device())).triu(1);
      causal = false;
    }
    if (mask.defined()) mask = with_zero_columns(mask, S - given_S);
    if (padding.defined()) padding = with_zero_columns(padding, S - given_S);
  }
  if (mask.defined()) {
    if (mask.dim() == 3) mask = mask.view({N, num_heads, L, S});
    if (mask.dtype() == kBool) mask = mask.logical_not();
  }
  if (padding.defined()) {
    Tensor padded = padding.view({N, 1, 1, S});
    if (causal) {
      mask = ones({L, S}, TensorOptions().dtype(kBool).device(q.device())).tril();
      causal = false;
    }
    if (!mask.defined()) {
      mask = padded.logical_not();
    } else if (mask.dtype() == kBool) {
      mask = logical_and(mask, padded.logical_not());
    } else {  // where, not masked_fill: a float (L, S) mask grows to (N, 1, L, S), as in PyTorch
      mask = where(padded.logical_not(), mask, -INFINITY);
    }
  }
  const double p = is_training() ? options.dropout : 0.0;
  Tensor y, weights;
  if (need_weights) {  // the probabilities themselves, as PyTorch's need_weights path computes them
    Tensor scores = matmul(qh * (1 / std::sqrt(static_cast<double>(head_dim))), kh.transpose(-2, -1));
    if (causal) mask = ones({L, S}, TensorOptions().dtype(kBool).device(q.device())).tril();
    if (mask.defined()) scores = mask.dtype() == kBool ? where(mask, scores, -INFINITY) : scores + mask;
    weights = softmax(scores, -1);
    if (p > 0) weights = dropout(weights, p, true);
    y = matmul(weights, vh);
    if (call.average_attn_weights) weights = weights.sum({1}) / static_cast<double>(num_heads);
  } else {
    y = scaled_dot_product_attention(qh, kh, vh, mask, p, causal);
  }
  Tensor out = out_proj(merge_heads(y));
  return {options.batch_first ? out : out.transpose(0, 1), weights};
}

std::string MultiheadAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, dropout={}, batch_first={}", embed_dim, num_heads,
                     py_float(options.dropout), options.batch_first ? "True" : "False");
}

// ---- CausalSelfAttention ----

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, TransformerOptions options)
    : n_embd(n_embd),
      n_head(n_head),
      dropout(options.dropout),
      c_attn(n_embd, 3 * n_embd, {options.bias}),
      c_proj(n_embd, n_embd, {options.bias}) {
  KILN_CHECK(n_embd > 0 && n_head > 0 && n_embd % n_head == 0,
             "nn::CausalSelfAttention: n_embd ({}) must be a positive multiple of n_head ({})", n_embd, n_head);
  KILN_CHECK(dropout >= 0 && dropout <= 1, "nn::CausalSelfAttention: dropout must be in [0, 1], got {}", dropout);
  register_modules({{"c_attn", c_attn}, {"c_proj", c_proj}});
}

Tensor CausalSelfAttention::forward(const Tensor& x, KVCache* cache) {
  KILN_CHECK(x.dim() == 3 && x.sizes()[2] == n_embd, "nn::CausalSelfAttention: expected input (B, T, {}), got shape {}",
             n_embd, x.sizes().str());
  const int64_t T = x.sizes()[1];
  auto qkv = c_attn(x).split(n_embd, 2);
  Tensor q = split_heads(qkv[0], n_head), k = split_heads(qkv[1], n_head), v = split_heads(qkv[2], n_head);
  // Query t of the new positions is position past + t: it sees keys 0 .. past + t.
  const int64_t past = cache ? cache->length() : 0;
  if (cache) {
    if (cache->k.defined()) {  // a cache of the wrong rank or shape is an Error, not replaced
      const Shape& ks = cache->k.sizes();
      KILN_CHECK(ks.size() == 4 && ks == cache->v.sizes() && ks[0] == k.sizes()[0] && ks[1] == n_head &&
                     ks[3] == k.sizes()[3] && cache->k.dtype() == k.dtype() && cache->k.device() == k.device(),
                 "nn::CausalSelfAttention: the KV cache holds keys of shape {} ({}, {}), which do not fit this "
                 "input: batch {}, {} heads of {} ({}, {}); a cache serves one batch of sequences, so start "
                 "a new one (clear it) for another",
                 ks.str(), dtype_name(cache->k.dtype()), cache->k.device().str(), k.sizes()[0], n_head,
                 k.sizes()[3], dtype_name(k.dtype()), k.device().str());
      k = cat({cache->k, k}, 2);
      v = cat({cache->v, v}, 2);
    }
    cache->k = k;
    cache->v = v;
  }
  Tensor mask;
  bool causal = T > 1;
  if (past > 0 && T > 1) {  // new rows see all the cached keys and the new ones up to themselves
    mask = ones({T, past + T}, TensorOptions().dtype(kBool).device(x.device())).tril(past);
    causal = false;
  }
  const double p = is_training() ? dropout : 0.0;
  Tensor y = merge_heads(scaled_dot_product_attention(q, k, v, mask, p, causal));
  return nn::dropout(c_proj(y), p, is_training());
}

std::string CausalSelfAttention::extra_repr() const {
  return fmt::format("n_embd={}, n_head={}, dropout={}", n_embd, n_head, py_float(dropout));
}

// ---- GeluMLP ----

GeluMLP::GeluMLP(int64_t n_embd, TransformerOptions options)
    : gelu_approximate(options.gelu_approximate),
      dropout(options.dropout),
      c_fc(n_embd, 4 * n_embd, {options.bias}),
      c_proj(4 * n_embd, n_embd, {options.bias}) {
  KILN_CHECK(gelu_approximate == "none" || gelu_approximate == "tanh",
             "nn::GeluMLP: gelu_approximate must be \"none\" or \"tanh\", got \"{}\"", gelu_approximate);
  KILN_CHECK(dropout >= 0 && dropout <= 1, "nn::GeluMLP: dropout must be in [0, 1], got {}", dropout);
  register_modules({{"c_fc", c_fc}, {"c_proj", c_proj}});
}

Tensor GeluMLP::hidden(const Tensor& x) {
  // c_fc and the GELU in one op unless c_fc has forward hooks, which must see its output.
  if (c_fc.has_forward_hooks()) return gelu(c_fc(x), gelu_approximate);
  return linear_gelu(x, c_fc.weight, c_fc.bias, gelu_approximate);
}

Tensor GeluMLP::forward(const Tensor& x) { return nn::dropout(c_proj(hidden(x)), dropout, is_training()); }

// ---- TransformerBlock ----

TransformerBlock::TransformerBlock(int64_t n_embd, int64_t n_head, TransformerOptions options)
    : ln_1(n_embd, {.eps = options.layer_norm_eps, .bias = options.bias}),
      attn(n_embd, n_head, options),
      ln_2(n_embd, {.eps = options.layer_norm_eps, .bias = options.bias}),
      mlp(n_embd, options) {
  register_modules({{"ln_1", ln_1}, {"attn", attn}, {"ln_2", ln_2}, {"mlp", mlp}});
}

std::tuple<Tensor, Tensor> TransformerBlock::attention_half(const Tensor& x, KVCache* cache) {
  Tensor a = cache ? attn.forward(ln_1(x), cache) : attn(ln_1(x));  // through its hooks, where it can
  if (ln_2.has_forward_hooks()) {  // the hooks must see ln_2's input and output
    Tensor h = x + a;
    return {h, ln_2(h)};
  }
  // The residual add and ln_2 in one op (fused while fusion is on; see ops::add_layer_norm).
  return add_layer_norm(x, a, ln_2.normalized_shape, ln_2.weight, ln_2.bias, ln_2.options.eps);
}

Tensor TransformerBlock::forward(const Tensor& x, KVCache* cache) {
  auto [h, y] = attention_half(x, cache);
  return h + mlp(y);
}

Tensor TransformerBlock::forward_for_recompute(const Tensor& x) {
  // The block ends in h + dropout(mlp.c_proj(hidden)). The add's backward reads nothing, the
  // dropout's reads its mask only, and the linear's reads its input and weight, so the projection's
  // GEMM (a third of the block's weight FLOPs) is left out. The dropout still runs, on the zeros, to
  // draw the mask forward drew. Hooks on the MLP or c_proj must see the values: then the block runs
  // whole.
  if (mlp.has_forward_hooks() || mlp.c_proj.has_forward_hooks()) return forward(x, nullptr);
  auto [h, y] = attention_half(x, nullptr);
  const Tensor projected = linear_graph_only(mlp.hidden(y), mlp.c_proj.weight, mlp.c_proj.bias);
  return h + nn::dropout(projected, mlp.dropout, mlp.is_training());
}

// ---- torch.nn's encoder-decoder transformer ----

namespace {

const TransformerLayerOptions& checked_layer_options(const TransformerLayerOptions& o, const char* layer) {
  KILN_CHECK(o.activation == "relu" || o.activation == "gelu",
             "nn::{}: activation must be \"relu\" or \"gelu\", got \"{}\"", layer, o.activation);
  KILN_CHECK(o.dim_feedforward > 0, "nn::{}: dim_feedforward must be positive, got {}", layer, o.dim_feedforward);
  return o;
}

// The feed-forward block: linear2(dropout(activation(linear1(x)))).
Tensor feed_forward(const std::string& activation, Linear& linear1, Dropout& dropout, Linear& linear2,
                    const Tensor& x) {
  Tensor h = linear1(x);
  return linear2(dropout(activation == "gelu" ? gelu(h) : relu(h)));
}

// An element of a stack's `layers` as the layer type it must be (a user may push other modules).
template <class Layer>
Layer& layer_of(const std::shared_ptr<Module>& module, const char* stack, const char* layer_name) {
  auto* layer = dynamic_cast<Layer*>(module.get());
  KILN_CHECK(layer != nullptr, "nn::{}: its layers must all be {}, found a {}", stack, layer_name, module->name());
  return *layer;
}

// num_layers copies of `layer` in `layers`: new layers of its sizes and options, given its parameters,
// buffers and mode (PyTorch deep-copies the layer).
template <class Layer>
void push_copies(ModuleList& layers, const Layer& layer, int64_t num_layers, const char* stack) {
  KILN_CHECK(num_layers >= 1, "nn::{}: num_layers must be positive, got {}", stack, num_layers);
  NoGradGuard no_grad;
  for (int64_t i = 0; i < num_layers; ++i) {
    Layer& copy = layers.push_back(std::make_shared<Layer>(layer.d_model, layer.nhead, layer.options));
    copy.load_state_dict(layer.state_dict());
    copy.train(layer.is_training());
  }
}

}  // namespace

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options)
    : d_model(d_model),
      nhead(nhead),
      options(checked_layer_options(options, "TransformerEncoderLayer")),
      self_attn(d_model, nhead, {.dropout = options.dropout, .batch_first = options.batch_first}),
      linear1(d_model, options.dim_feedforward),
      dropout(options.dropout),
      linear2(options.dim_feedforward, d_model),
      norm1(d_model, {.eps = options.layer_norm_eps}),
      norm2(d_model, {.eps = options.layer_norm_eps}),
      dropout1(options.dropout),
      dropout2(options.dropout) {
  register_modules({{"self_attn", self_attn}, {"linear1", linear1}, {"dropout", dropout}, {"linear2", linear2},
                    {"norm1", norm1}, {"norm2", norm2}, {"dropout1", dropout1}, {"dropout2", dropout2}});
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const TransformerEncoderCall& call) {
  const MultiheadAttentionCall masks{.attn_mask = call.src_mask, .key_padding_mask = call.src_key_padding_mask};
  auto attend = [&](const Tensor& x) { return dropout1(self_attn.forward(x, x, x, masks)); };
  auto ff = [&](const Tensor& x) { return dropout2(feed_forward(options.activation, linear1, dropout, linear2, x)); };
  Tensor x = src;
  if (options.norm_first) {
    x = x + attend(norm1(x));
    return x + ff(norm2(x));
  }
  x = norm1(x + attend(x));
  return norm2(x + ff(x));
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options)
    : d_model(d_model),
      nhead(nhead),
      options(checked_layer_options(options, "TransformerDecoderLayer")),
      self_attn(d_model, nhead, {.dropout = options.dropout, .batch_first = options.batch_first}),
      multihead_attn(d_model, nhead, {.dropout = options.dropout, .batch_first = options.batch_first}),
      linear1(d_model, options.dim_feedforward),
      dropout(options.dropout),
      linear2(options.dim_feedforward, d_model),
      norm1(d_model, {.eps = options.layer_norm_eps}),
      norm2(d_model, {.eps = options.layer_norm_eps}),
      norm3(d_model, {.eps = options.layer_norm_eps}),
      dropout1(options.dropout),
      dropout2(options.dropout),
      dropout3(options.dropout) {
  register_modules({{"self_attn", self_attn}, {"multihead_attn", multihead_attn}, {"linear1", linear1},
                    {"dropout", dropout}, {"linear2", linear2}, {"norm1", norm1}, {"norm2", norm2}, {"norm3", norm3},
                    {"dropout1", dropout1}, {"dropout2", dropout2}, {"dropout3", dropout3}});
}

Tensor TransformerDecoderLayer::forward(const Tensor&) {
  KILN_FAIL("nn::TransformerDecoderLayer: forward needs the encoder's output too: call forward(tgt, memory)");
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory, const TransformerDecoderCall& call) {
  const MultiheadAttentionCall self_masks{.attn_mask = call.tgt_mask, .key_padding_mask = call.tgt_key_padding_mask};
  const MultiheadAttentionCall memory_masks{.attn_mask = call.memory_mask,
                                            .key_padding_mask = call.memory_key_padding_mask};
  auto attend_self = [&](const Tensor& x) { return dropout1(self_attn.forward(x, x, x, self_masks)); };
  auto attend_memory = [&](const Tensor& x) {
    return dropout2(multihead_attn.forward(x, memory, memory, memory_masks));
  };
  auto ff = [&](const Tensor& x) { return dropout3(feed_forward(options.activation, linear1, dropout, linear2, x)); };
  Tensor x = tgt;
  if (options.norm_first) {
    x = x + attend_self(norm1(x));
    x = x + attend_memory(norm2(x));
    return x + ff(norm3(x));
  }
  x = norm1(x + attend_self(x));
  x = norm2(x + attend_memory(x));
  return norm3(x + ff(x));
}

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& layer, int64_t num_layers,
                                       std::shared_ptr<Module> norm)
    : num_layers(num_layers), norm(std::move(norm)) {
  push_copies(layers, layer, num_layers, "TransformerEncoder");
  register_module("layers", layers);
  if (this->norm) register_module("norm", this->norm);
}

Tensor TransformerEncoder::forward(const Tensor& src, const TransformerEncoderCall& call) {
  Tensor x = src;
  for (const auto& layer : layers) x = layer_of<TransformerEncoderLayer>(layer, "TransformerEncoder", "TransformerEncoderLayer").forward(x, call);
  return norm ? (*norm)(x) : x;
}

TransformerDecoder::TransformerDecoder(const TransformerDecoderLayer& layer, int64_t num_layers,
                                       std::shared_ptr<Module> norm)
    : num_layers(num_layers), norm(std::move(norm)) {
  push_copies(layers, layer, num_layers, "TransformerDecoder");
  register_module("layers", layers);
  if (this->norm) register_module("norm", this->norm);
}

Tensor TransformerDecoder::forward(const Tensor&) {
  KILN_FAIL("nn::TransformerDecoder: forward needs the encoder's output too: call forward(tgt, memory)");
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory, const TransformerDecoderCall& call) {
  Tensor x = tgt;
  for (const auto& layer : layers) {
    x = layer_of<TransformerDecoderLayer>(layer, "TransformerDecoder", "TransformerDecoderLayer").forward(x, memory, call);
  }
  return norm ? (*norm)(x) : x;
}

Transformer::Transformer(int64_t d_model, int64_t nhead, TransformerModelOptions options)
    : d_model(d_model), nhead(nhead), options(options) {
  const TransformerLayerOptions layer{.dim_feedforward = options.dim_feedforward,
                                     .dropout = options.dropout,
                                     .activation = options.activation,
                                     .layer_norm_eps = options.layer_norm_eps,
                                     .batch_first = options.batch_first,
                                     .norm_first = options.norm_first};
  const LayerNormOptions norm{.eps = options.layer_norm_eps};
  encoder = std::make_shared<TransformerEncoder>(TransformerEncoderLayer(d_model, nhead, layer),
                                                 options.num_encoder_layers, std::make_shared<LayerNorm>(d_model, norm));
  decoder = std::make_shared<TransformerDecoder>(TransformerDecoderLayer(d_model, nhead, layer),
                                                 options.num_decoder_layers, std::make_shared<LayerNorm>(d_model, norm));
  register_module("encoder", encoder);
  register_module("decoder", decoder);
  for (Tensor& p : parameters()) {
    if (p.dim() > 1) init::xavier_uniform_(p);
  }
}

Tensor Transformer::forward(const Tensor&) {
  KILN_FAIL("nn::Transformer: forward takes the source and the target: call forward(src, tgt)");
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, const TransformerCall& call) {
  const int batch = options.batch_first ? 0 : 1;
  KILN_CHECK(src.dim() == tgt.dim() && (src.dim() == 2 || src.dim() == 3),
             "nn::Transformer: src and tgt must both be batched ({}) or both unbatched (S, E), got shapes {} and {}",
             options.batch_first ? "N, S, E" : "S, N, E", src.sizes().str(), tgt.sizes().str());
  KILN_CHECK(src.dim() == 2 || src.size(batch) == tgt.size(batch),
             "nn::Transformer: the batch number of src and tgt must be equal, got shapes {} and {}", src.sizes().str(),
             tgt.sizes().str());
  KILN_CHECK(src.size(-1) == d_model && tgt.size(-1) == d_model,
             "nn::Transformer: the feature number of src and tgt must be d_model = {}, got shapes {} and {}", d_model,
             src.sizes().str(), tgt.sizes().str());
  const Tensor memory =
      encoder->forward(src, {.src_mask = call.src_mask, .src_key_padding_mask = call.src_key_padding_mask});
  return decoder->forward(tgt, memory,
                          {.tgt_mask = call.tgt_mask,
                           .memory_mask = call.memory_mask,
                           .tgt_key_padding_mask = call.tgt_key_padding_mask,
                           .memory_key_padding_mask = call.memory_key_padding_mask});
}

Tensor Transformer::generate_square_subsequent_mask(int64_t size, TensorOptions options) {
  KILN_CHECK(size >= 0, "nn::Transformer::generate_square_subsequent_mask: size must be >= 0, got {}", size);
  return full({size, size}, -INFINITY, options).triu(1);
}

}  // namespace kiln::nn

// nn/transformer.h: the attention layers and the pieces of a GPT-style decoder, over
// scaled_dot_product_attention (ops/attention.cpp).
//   MultiheadAttention    torch.nn.MultiheadAttention: packed in-projection (3E, E) (or q/k/v_proj_weight
//                         with kdim, vdim), out_proj, bias_k/v, zero attention, the weights on request
//   CausalSelfAttention   GPT-2's attention: c_attn Linear(C, 3C) -> heads -> causal attention -> c_proj,
//                         with an optional key/value cache for generation
//   GeluMLP               GPT-2's feed-forward: c_fc Linear(C, 4C) -> GELU -> c_proj Linear(4C, C)
//   TransformerBlock      pre-LN: x + attn(ln_1(x)), then x + mlp(ln_2(x))
// The GPT pieces' submodule names are GPT-2's (Hugging Face's and nanoGPT's), so state dicts line up
// with theirs. Then torch.nn's encoder-decoder layers, under PyTorch's names, so PyTorch's state
// dicts load: TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder, TransformerDecoder
// and Transformer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/norm.h"

namespace kiln::nn {

// PyTorch's keyword arguments, in its order.
struct MultiheadAttentionOptions {
  double dropout = 0.0;                // on the attention probabilities, in training mode
  bool bias = true;                    // in_proj_bias and out_proj.bias
  bool add_bias_kv = false;            // learned bias_k, bias_v (1, 1, E) appended to the keys and values
  bool add_zero_attn = false;          // a zero key and value appended to each head's
  std::optional<int64_t> kdim = {};    // the keys' features (unset: embed_dim)
  std::optional<int64_t> vdim = {};    // the values' features (unset: embed_dim)
  bool batch_first = false;            // inputs (N, L, E) instead of PyTorch's default (L, N, E)
};

// What MultiheadAttention::forward takes besides query, key and value (PyTorch's keyword arguments).
struct MultiheadAttentionCall {
  Tensor attn_mask = {};         // (L, S) or (N * num_heads, L, S): bool (true = masked out, as PyTorch) or
                                 // float (added to the scores)
  Tensor key_padding_mask = {};  // (N, S) bool, true = this key is padding
  bool is_causal = false;        // a causal mask, instead of attn_mask
  bool average_attn_weights = true;  // forward_with_weights: the weights averaged over the heads
};

// out = out_proj(concat over heads of softmax(q_h k_h^T / sqrt(E / num_heads) + mask) v_h), with q, k, v
// the in-projections of query, key and value. Parameters as PyTorch: in_proj_weight (3E, E), or with a
// kdim or vdim other than E q_proj_weight (E, E), k_proj_weight (E, kdim) and v_proj_weight (E, vdim),
// each xavier_uniform_; in_proj_bias (3E) zeros; out_proj = Linear(E, E) with its bias zeroed; with
// add_bias_kv bias_k and bias_v (1, 1, E) xavier_normal_. forward returns the output (PyTorch's
// need_weights = false; it runs the fused attention); forward_with_weights also the attention weights
// after dropout, (N, L, S) averaged over the heads or (N, num_heads, L, S) (PyTorch's need_weights =
// true), S counting the appended keys. Inputs are batched (3-D), or all 2-D ((L, E), (S, kdim),
// (S, vdim)) for one unbatched sequence, as PyTorch.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {});
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const MultiheadAttentionCall& call = {});
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }  // self-attention, no mask
  std::tuple<Tensor, Tensor> forward_with_weights(const Tensor& query, const Tensor& key, const Tensor& value,
                                                  const MultiheadAttentionCall& call = {});
  std::string extra_repr() const override;

  int64_t embed_dim, num_heads, kdim, vdim;
  MultiheadAttentionOptions options;
  Tensor in_proj_weight;                              // (3E, E) when kdim = vdim = E, else undefined
  Tensor q_proj_weight, k_proj_weight, v_proj_weight;  // otherwise these
  Tensor in_proj_bias;                                // (3E), undefined without bias
  Tensor bias_k, bias_v;                              // (1, 1, E) with add_bias_kv
  Linear out_proj;

 private:
  std::tuple<Tensor, Tensor> attend(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const MultiheadAttentionCall& call, bool need_weights);
};

// The keys and values a CausalSelfAttention has seen, (B, n_head, T_seen, head_dim) each, so that
// generation runs one new token at a time instead of the whole sequence again.
struct KVCache {
  Tensor k, v;
  int64_t length() const { return k.defined() && k.dim() == 4 ? k.sizes()[2] : 0; }  // (B, H, T, D)
};

struct TransformerOptions {
  double dropout = 0.0;                  // attention probabilities and the residual branches, in training
  bool bias = true;                      // of every Linear and LayerNorm
  std::string gelu_approximate = "none";  // "none" (erf) or "tanh" (GPT-2's gelu_new)
  double layer_norm_eps = 1e-5;
};

// x (B, T, C) -> (B, T, C): causal multi-head self-attention with n_head heads of C / n_head.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, TransformerOptions options = {});
  Tensor forward(const Tensor& x) override { return forward(x, nullptr); }
  // With a cache: x holds only the new positions; the cache's keys and values come first, and the
  // new ones are appended to it.
  Tensor forward(const Tensor& x, KVCache* cache);
  std::string extra_repr() const override;

  int64_t n_embd, n_head;
  double dropout;
  Linear c_attn, c_proj;
};

class GeluMLP : public Module {
 public:
  GeluMLP(int64_t n_embd, TransformerOptions options = {});
  Tensor forward(const Tensor& x) override;
  // GELU(c_fc(x)): forward without the last projection and its dropout.
  Tensor hidden(const Tensor& x);

  std::string gelu_approximate;
  double dropout;
  Linear c_fc, c_proj;
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t n_embd, int64_t n_head, TransformerOptions options = {});
  Tensor forward(const Tensor& x) override { return forward(x, nullptr); }
  Tensor forward(const Tensor& x, KVCache* cache);
  // For autograd::checkpoint's recompute, which only differentiates the block's output: the graph of
  // forward(x) with every value its backward reads, but the MLP's last projection is recorded without
  // being computed, so the output's value is not the block's output. See Note [a recompute computes
  // what backward reads] in autograd/checkpoint.cpp.
  Tensor forward_for_recompute(const Tensor& x) override;

  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  GeluMLP mlp;

 private:
  // x + attn(ln_1(x)) and ln_2 of it: the residual stream h and the MLP's input.
  std::tuple<Tensor, Tensor> attention_half(const Tensor& x, KVCache* cache);
};

// ---- torch.nn's encoder-decoder transformer ----

// TransformerEncoderLayer's and TransformerDecoderLayer's keyword arguments, in PyTorch's order.
struct TransformerLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;            // after attention, inside and after the feed-forward block, in training
  std::string activation = "relu";  // of the feed-forward block: "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;  // inputs (N, S, E) instead of (S, N, E)
  bool norm_first = false;   // pre-LN: x + block(norm(x)); else post-LN: norm(x + block(x))
};

// What an encoder layer or encoder takes besides src (PyTorch's keyword arguments; the masks as
// MultiheadAttentionCall's attn_mask and key_padding_mask).
struct TransformerEncoderCall {
  Tensor src_mask = {};              // (S, S) or (N * nhead, S, S)
  Tensor src_key_padding_mask = {};  // (N, S) bool
};

// What a decoder layer or decoder takes besides tgt and memory.
struct TransformerDecoderCall {
  Tensor tgt_mask = {};                  // (T, T) or (N * nhead, T, T); Transformer::generate_square_subsequent_mask
  Tensor memory_mask = {};               // (T, S) or (N * nhead, T, S)
  Tensor tgt_key_padding_mask = {};      // (N, T) bool
  Tensor memory_key_padding_mask = {};   // (N, S) bool
};

// torch.nn.TransformerEncoderLayer: self-attention, then a feed-forward block linear2(dropout(
// activation(linear1(x)))), each with dropout and a residual connection, post- or pre-LN. Its
// parameters as PyTorch's (self_attn, linear1, linear2, norm1, norm2), PyTorch's initialisation.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options = {});
  Tensor forward(const Tensor& src) override { return forward(src, TransformerEncoderCall{}); }
  Tensor forward(const Tensor& src, const TransformerEncoderCall& call);

  int64_t d_model, nhead;
  TransformerLayerOptions options;
  MultiheadAttention self_attn;
  Linear linear1;
  Dropout dropout;
  Linear linear2;
  LayerNorm norm1, norm2;
  Dropout dropout1, dropout2;
};

// torch.nn.TransformerDecoderLayer: self-attention over tgt, attention to memory (multihead_attn),
// then the feed-forward block, each with dropout and a residual connection, post- or pre-LN (norm1,
// norm2, norm3).
class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options = {});
  Tensor forward(const Tensor& tgt) override;  // an Error: the memory is needed
  Tensor forward(const Tensor& tgt, const Tensor& memory, const TransformerDecoderCall& call = {});

  int64_t d_model, nhead;
  TransformerLayerOptions options;
  MultiheadAttention self_attn, multihead_attn;
  Linear linear1;
  Dropout dropout;
  Linear linear2;
  LayerNorm norm1, norm2, norm3;
  Dropout dropout1, dropout2, dropout3;
};

// torch.nn.TransformerEncoder: num_layers copies of `layer` (the same starting parameters and mode, as
// PyTorch's deep copies) in `layers`, then `norm` when given (PyTorch's norm=). PyTorch 1.13's
// inference fast path (eval, no grad, batch_first, a src_key_padding_mask) runs on nested tensors and
// gives zeros at the padded positions; Kiln computes them as in training (the other positions agree).
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const TransformerEncoderLayer& layer, int64_t num_layers, std::shared_ptr<Module> norm = nullptr);
  Tensor forward(const Tensor& src) override { return forward(src, TransformerEncoderCall{}); }
  Tensor forward(const Tensor& src, const TransformerEncoderCall& call);

  int64_t num_layers;
  ModuleList layers;  // of TransformerEncoderLayer
  std::shared_ptr<Module> norm;
};

// torch.nn.TransformerDecoder: num_layers copies of `layer` in `layers`, then `norm` when given.
class TransformerDecoder : public Module {
 public:
  TransformerDecoder(const TransformerDecoderLayer& layer, int64_t num_layers, std::shared_ptr<Module> norm = nullptr);
  Tensor forward(const Tensor& tgt) override;  // an Error: the memory is needed
  Tensor forward(const Tensor& tgt, const Tensor& memory, const TransformerDecoderCall& call = {});

  int64_t num_layers;
  ModuleList layers;  // of TransformerDecoderLayer
  std::shared_ptr<Module> norm;
};

// torch.nn.Transformer's keyword arguments after d_model and nhead, in PyTorch's order.
struct TransformerModelOptions {
  int64_t num_encoder_layers = 6;
  int64_t num_decoder_layers = 6;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
};

// What Transformer::forward takes besides src and tgt.
struct TransformerCall {
  Tensor src_mask = {}, tgt_mask = {}, memory_mask = {};
  Tensor src_key_padding_mask = {}, tgt_key_padding_mask = {}, memory_key_padding_mask = {};
};

// torch.nn.Transformer: encoder (its layers and a final LayerNorm) over src, decoder (its layers and a
// final LayerNorm) over tgt and the encoder's output; every parameter of 2 or more dims re-initialised
// xavier_uniform_, as PyTorch's _reset_parameters.
class Transformer : public Module {
 public:
  explicit Transformer(int64_t d_model = 512, int64_t nhead = 8, TransformerModelOptions options = {});
  Tensor forward(const Tensor& src) override;  // an Error: tgt is needed
  Tensor forward(const Tensor& src, const Tensor& tgt, const TransformerCall& call = {});
  // The (size, size) float mask that hides the later positions: -inf above the diagonal, 0 elsewhere.
  static Tensor generate_square_subsequent_mask(int64_t size, TensorOptions options = {});

  int64_t d_model, nhead;
  TransformerModelOptions options;
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<TransformerDecoder> decoder;
};

}  // namespace kiln::nn

// nn/transformer.h: the attention layers and the pieces of a GPT-style decoder, over
// scaled_dot_product_attention (ops/attention.cpp).
//   MultiheadAttention    torch.nn.MultiheadAttention: packed in-projection (3E, E), out_proj
//   CausalSelfAttention   GPT-2's attention: c_attn Linear(C, 3C) -> heads -> causal attention -> c_proj,
//                         with an optional key/value cache for generation
//   GeluMLP               GPT-2's feed-forward: c_fc Linear(C, 4C) -> GELU -> c_proj Linear(4C, C)
//   TransformerBlock      pre-LN: x + attn(ln_1(x)), then x + mlp(ln_2(x))
// The submodule names are GPT-2's (Hugging Face's and nanoGPT's), so state dicts line up with theirs.
#pragma once

#include <optional>
#include <string>
#include <tuple>

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

}  // namespace kiln::nn

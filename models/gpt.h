// models/gpt.h: GPT-2, the decoder-only transformer, with the configurations of BENCHMARKS.md (gpt_char,
// GPT-2 124M), per-block activation checkpointing, text generation with a key/value cache, and
// Hugging Face GPT-2 safetensors files in and out.
//
//   idx (B, T) int64 -> x = wte[idx] + wpe[0..T) -> dropout -> n_layer x TransformerBlock (pre-LN)
//                    -> ln_f -> logits = x wte^T (the head tied to the embedding) or lm_head(x)
//
// The parameter names are GPT-2's: transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...,
// transformer.ln_f.bias (and lm_head.weight when the head is not tied).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"

namespace kiln::models {

struct GPTConfig {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t block_size = 1024;  // the context: the longest sequence (wpe has this many rows)
  int64_t vocab_size = 50257;
  double dropout = 0.0;
  bool bias = true;         // in every Linear and LayerNorm
  bool tie_weights = true;  // logits = x wte^T; false: a separate lm_head Linear(n_embd, vocab, no bias)
  std::string gelu_approximate = "tanh";  // GPT-2's gelu_new; "none" for the exact erf GELU
  double layer_norm_eps = 1e-5;
  // GPT-2's init: every Linear and embedding N(0, 0.02), biases 0, LayerNorms 1 and 0; when true, the
  // two c_proj weights of each block (which add into the residual stream) N(0, 0.02 / sqrt(2 n_layer)).
  bool scaled_residual_init = true;

  static GPTConfig gpt2();      // GPT-2 124M: 12 layers, 12 heads, 768 wide, context 1024, 50257 tokens
  static GPTConfig gpt_char();  // BENCHMARKS.md e: 4 layers, 4 heads, 128 wide, context 128, 256 bytes,
                                // erf GELU, every weight N(0, 0.02): 842,496 parameters
  int64_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }  // 0 for no heads (GPT's constructor refuses them)
};

struct GenerateOptions {
  double temperature = 1.0;  // logits / temperature before sampling; 0 = greedy (argmax)
  int64_t top_k = 0;         // sample among the k most likely tokens only; 0 = all of them
  bool use_cache = true;     // keys and values kept between steps (false: the whole window each step)
};

class GPT : public nn::Module, public nn::ConfiguresCheckpointing {
 public:
  explicit GPT(GPTConfig config);

  // idx (B, T) int64 token ids, T <= block_size -> logits (B, T, vocab_size).
  Tensor forward(const Tensor& idx) override { return forward(idx, nullptr); }
  // With caches (one per layer, empty at first): idx holds only the new tokens; see nn::KVCache.
  Tensor forward(const Tensor& idx, std::vector<nn::KVCache>* caches);

  // Mean cross-entropy of logits (B, T, V) against targets (B, T).
  static Tensor loss(const Tensor& logits, const Tensor& targets);

  // Appends max_new_tokens sampled tokens to idx (B, T0) of int64 or int32 ids and returns
  // (B, T0 + max_new_tokens). Runs in evaluation mode without recording (the mode is restored after,
  // also when it throws). Samples with `gen` (the default generator when null), on the host; logits
  // with NaN or +inf (a diverged model) are an Error, as torch.multinomial's.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, const GenerateOptions& options = {},
                  Generator* gen = nullptr);

  // Activation checkpointing (autograd::checkpoint) of every block, or of block i: in training with
  // grad recording on, a checkpointed block keeps only its input and runs again during backward.
  void set_checkpointing(bool on);
  void set_checkpointing(int64_t block, bool on);
  bool checkpointing(int64_t block) const;
  // Whether a checkpointed block's recompute leaves out the GEMM whose output its backward never
  // reads (the default; Note [a recompute computes what backward reads] in autograd/checkpoint.cpp)
  // or runs the block whole, as torch.utils.checkpoint does: the same gradients either way, so that
  // what the skip saves can be measured (bench_checkpointing_mem --full-recompute).
  void set_recompute_skips_unread(bool on) { recompute_skips_unread_ = on; }
  // How checkpointed blocks keep their inputs (DeepSpeed's "activation_checkpointing" section, which
  // kiln::initialize passes here): cpu_checkpointing keeps them in pinned host memory. On one
  // process there is no tensor-parallel group, so partition_activations changes nothing.
  void configure_checkpointing(const nn::ActivationCheckpointing& options) override { keeping_ = options; }
  const nn::ActivationCheckpointing& checkpointing_options() const { return keeping_; }

  nn::TransformerBlock& block(int64_t i) const { return transformer.h.at<nn::TransformerBlock>(static_cast<size_t>(i)); }

  struct Transformer : nn::Module {
    Transformer(const GPTConfig& c);
    std::string name() const override { return "Transformer"; }
    nn::Embedding wte, wpe;
    nn::ModuleList h;
    nn::LayerNorm ln_f;
  };

  GPTConfig config;
  Transformer transformer;
  std::shared_ptr<nn::Linear> lm_head;  // only when the head is not tied

 private:
  std::vector<bool> checkpoint_;
  bool recompute_skips_unread_ = true;
  nn::ActivationCheckpointing keeping_;
};

// ---- Hugging Face GPT-2 safetensors (model.safetensors of the "gpt2" checkpoints) ----
// Their Linear layers are "Conv1D" modules, whose weight is stored (in, out): the transpose of a
// Linear's (out, in). These four are transposed on the way in and out: attn.c_attn, attn.c_proj,
// mlp.c_fc and mlp.c_proj. Names may come with or without the "transformer." prefix (GPT2Model files
// have none); the attention-mask buffers (attn.bias, attn.masked_bias) are skipped, and so is
// lm_head.weight when the head is tied (it is wte). Any other difference (a missing or unexpected
// name, a shape that does not fit the config) is an Error naming it.
void load_hf_gpt2(GPT& model, const std::string& path);
// Writes the model as GPT2LMHeadModel would: "transformer."-prefixed names, Conv1D layout, float32
// (the model's dtype when it is 16-bit), with the config in the metadata.
void save_hf_gpt2(const GPT& model, const std::string& path);
// The renaming and transposition alone: a Hugging Face state dict <-> the model's state_dict() names.
TensorDict from_hf_gpt2(const TensorDict& hf, const GPT& model);
TensorDict to_hf_gpt2(const GPT& model);

}  // namespace kiln::models

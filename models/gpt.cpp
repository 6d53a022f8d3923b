// models/gpt.cpp: see models/gpt.h.
#include "models/gpt.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "autograd/autograd.h"
#include "core/grad_mode.h"
#include "data/safetensors.h"

namespace kiln::models {

GPTConfig GPTConfig::gpt2() { return GPTConfig{}; }

GPTConfig GPTConfig::gpt_char() {
  GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.block_size = 128;
  c.vocab_size = 256;
  c.gelu_approximate = "none";
  c.scaled_residual_init = false;
  return c;
}

namespace {

nn::TransformerOptions block_options(const GPTConfig& c) {
  return {.dropout = c.dropout, .bias = c.bias, .gelu_approximate = c.gelu_approximate,
          .layer_norm_eps = c.layer_norm_eps};
}

void check_config(const GPTConfig& c) {
  KILN_CHECK(c.n_layer >= 0 && c.n_head > 0 && c.n_embd > 0 && c.n_embd % c.n_head == 0,
             "GPT: n_embd ({}) must be a positive multiple of n_head ({}), and n_layer ({}) >= 0", c.n_embd, c.n_head,
             c.n_layer);
  KILN_CHECK(c.block_size > 0 && c.vocab_size > 0, "GPT: block_size ({}) and vocab_size ({}) must be positive",
             c.block_size, c.vocab_size);
  KILN_CHECK(c.dropout >= 0 && c.dropout < 1, "GPT: dropout must be in [0, 1), got {}", c.dropout);
  // The blocks are made one at a time, each of a few small tensors: a config of 10^9 thin layers
  // would take a day to run out of memory. Counted first (in long double: no product overflows),
  // what cannot fit is an Error at once. Per block: ln_1 and ln_2, c_attn (3 d^2), attn.c_proj
  // (d^2), mlp.c_fc (4 d^2) and mlp.c_proj (4 d^2), with their biases; then wte, wpe, ln_f and an
  // untied head.
  const long double d = static_cast<long double>(c.n_embd), L = static_cast<long double>(c.n_layer);
  const long double V = static_cast<long double>(c.vocab_size), T = static_cast<long double>(c.block_size);
  const long double params = L * (12 * d * d + (c.bias ? 13 : 2) * d) + (V + T) * d + (c.bias ? 2 : 1) * d +
                             (c.tie_weights ? 0 : V * d);
  const long double memory =
      static_cast<long double>(sysconf(_SC_PHYS_PAGES)) * static_cast<long double>(sysconf(_SC_PAGE_SIZE));
  KILN_CHECK(memory <= 0 || 4 * params <= memory,
             "GPT: this config has {:.4g} parameters, {:.4g} GiB in float32, more than this machine's memory ({:.4g} "
             "GiB); choose fewer layers (n_layer = {}) or a smaller n_embd ({}), vocab_size or block_size",
             static_cast<double>(params), static_cast<double>(4 * params / (1 << 30)),
             static_cast<double>(memory / (1 << 30)), c.n_layer, c.n_embd);
}

}  // namespace

GPT::Transformer::Transformer(const GPTConfig& c)
    : wte(c.vocab_size, c.n_embd), wpe(c.block_size, c.n_embd), ln_f(c.n_embd, {.eps = c.layer_norm_eps, .bias = c.bias}) {
  for (int64_t i = 0; i < c.n_layer; ++i) h.push_back(std::make_shared<nn::TransformerBlock>(c.n_embd, c.n_head, block_options(c)));
  register_modules({{"wte", wte}, {"wpe", wpe}, {"h", h}, {"ln_f", ln_f}});
}

GPT::GPT(GPTConfig c) : config((check_config(c), c)), transformer(c), checkpoint_(static_cast<size_t>(c.n_layer), false) {
  register_module("transformer", transformer);
  if (!c.tie_weights) {
    lm_head = std::make_shared<nn::Linear>(c.n_embd, c.vocab_size, nn::LinearOptions{false});
    register_module("lm_head", lm_head);
  }
  NoGradGuard no_grad;
  const double residual_std = c.scaled_residual_init ? 0.02 / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(c.n_layer, 1))) : 0.02;
  for (auto& [name, p] : named_parameters()) {
    Tensor t = p;
    const bool is_bias = name.ends_with(".bias");
    const bool is_norm = name.find(".ln_") != std::string::npos;
    if (is_norm && !is_bias) {
      nn::init::ones_(t);
    } else if (is_bias) {
      nn::init::zeros_(t);
    } else {
      nn::init::normal_(t, 0.0, name.ends_with("c_proj.weight") ? residual_std : 0.02);
    }
  }
}

void GPT::set_checkpointing(bool on) { std::fill(checkpoint_.begin(), checkpoint_.end(), on); }

void GPT::set_checkpointing(int64_t block, bool on) {
  KILN_CHECK(block >= 0 && block < config.n_layer, "GPT::set_checkpointing: block {} is not in [0, {})", block,
             config.n_layer);
  checkpoint_[static_cast<size_t>(block)] = on;
}

bool GPT::checkpointing(int64_t block) const {
  KILN_CHECK(block >= 0 && block < config.n_layer, "GPT::checkpointing: block {} is not in [0, {})", block,
             config.n_layer);
  return checkpoint_[static_cast<size_t>(block)];
}

Tensor GPT::forward(const Tensor& idx, std::vector<nn::KVCache>* caches) {
  KILN_CHECK(idx.dim() == 2 && (idx.dtype() == kInt64 || idx.dtype() == kInt32),
             "GPT: expected token ids (B, T) of int64 or int32, got {} of shape {}", dtype_name(idx.dtype()), idx.sizes().str());
  const int64_t T = idx.sizes()[1];
  KILN_CHECK(!caches || caches->empty() || caches->size() == static_cast<size_t>(config.n_layer),
             "GPT: the KV caches are {}, one per layer of another model; this GPT has n_layer = {}. Pass an "
             "empty vector to start new ones",
             caches ? caches->size() : 0, config.n_layer);
  const int64_t past = caches && !caches->empty() ? (*caches)[0].length() : 0;
  for (size_t i = 1; caches && i < caches->size(); ++i) {  // the positions come from layer 0's
    KILN_CHECK((*caches)[i].length() == past,
               "GPT: the KV cache of layer {} holds {} positions but layer 0's holds {}; the caches must come from "
               "one sequence's steps. Pass an empty vector to start new ones",
               i, (*caches)[i].length(), past);
  }
  KILN_CHECK(past + T <= config.block_size,
             "GPT: a sequence of {} tokens{} is longer than the context, block_size = {}; crop it to the last {}",
             past + T, past > 0 ? " (counting the cached ones)" : "", config.block_size, config.block_size);
  if (caches) caches->resize(static_cast<size_t>(config.n_layer));
  Tensor pos = arange(past, past + T, 1, kInt64, idx.device());
  Tensor x = transformer.wte(idx) + transformer.wpe(pos);
  x = nn::dropout(x, config.dropout, is_training());
  autograd::CheckpointOptions checkpointed;  // for the checkpointed blocks
  if (keeping_.cpu_checkpointing) checkpointed.keep_input = autograd::keep_on_cpu();
  checkpointed.synchronize = keeping_.synchronize_checkpoint_boundary;
  checkpointed.profile = keeping_.profile;
  for (int64_t i = 0; i < config.n_layer; ++i) {
    nn::TransformerBlock* b = &block(i);
    if (checkpoint_[static_cast<size_t>(i)] && !caches && is_training() && GradMode::is_enabled()) {
      // The recompute skips the block's last GEMM (Note [a recompute computes what backward reads] in
      // autograd/checkpoint.cpp); a block with hooks runs whole both times, hooks and all.
      x = nn::checkpoint_module(*b, x, checkpointed, recompute_skips_unread_);
    } else {
      x = caches ? b->forward(x, &(*caches)[static_cast<size_t>(i)]) : (*b)(x);  // through its hooks
    }
  }
  x = transformer.ln_f(x);
  // The tied head is a Linear with wte's weight (x W^T), as nanoGPT's: the weight's gradient comes
  // out as (vocab, n_embd) like the weight, and autocast casts the weight as it is stored.
  return lm_head ? (*lm_head)(x) : nn::linear(x, transformer.wte.weight);
}

Tensor GPT::loss(const Tensor& logits, const Tensor& targets) {
  KILN_CHECK(logits.dim() >= 1, "GPT::loss: expected logits (B, T, V) and targets (B, T), got logits of shape {}",
             logits.sizes().str());
  const int64_t V = logits.sizes()[logits.dim() - 1];
  return nn::cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}));
}

namespace {

// One token from a row of logits, on the host.
int64_t sample_row(std::vector<double> logits, const GenerateOptions& o, Generator& gen) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (o.temperature == 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (double& l : logits)
      if (l < kth) l = -INFINITY;
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (double& l : logits) total += (l = std::exp((l - top) / o.temperature));
  const double u = rand({1}, kFloat64, &gen).item<double>() * total;
  double acc = 0;
  for (int64_t i = 0; i < V; ++i) {
    acc += logits[static_cast<size_t>(i)];
    if (u < acc) return i;
  }
  return V - 1;
}

}  // namespace

Tensor GPT::generate(const Tensor& idx, int64_t max_new_tokens, const GenerateOptions& options, Generator* gen) {
  KILN_CHECK(idx.dim() == 2 && idx.sizes()[1] >= 1, "GPT::generate: expected a prompt (B, T) with T >= 1, got shape {}",
             idx.sizes().str());
  KILN_CHECK(idx.dtype() == kInt64 || idx.dtype() == kInt32, "GPT::generate: expected token ids of int64 or int32, got {}",
             dtype_name(idx.dtype()));
  // An infinite temperature would divide a top_k-masked logit's -inf into NaN (PyTorch's sampling
  // then raises); a flat distribution is top_k = 0 with a large finite temperature.
  KILN_CHECK(options.temperature >= 0 && std::isfinite(options.temperature) && options.top_k >= 0,
             "GPT::generate: temperature ({}) must be finite and >= 0 and top_k ({}) >= 0", options.temperature,
             options.top_k);
  const int64_t B = idx.sizes()[0], T0 = idx.sizes()[1];
  // The result is (B, T0 + max_new_tokens): a count that is negative, or whose tokens could not be
  // indexed, is an Error (PyTorch's nanoGPT would loop max_new_tokens times).
  KILN_CHECK(max_new_tokens >= 0 && max_new_tokens <= (int64_t{1} << 40) - T0,
             "GPT::generate: max_new_tokens must be in [0, 2^40 - T], got {}", max_new_tokens);
  if (B == 0) return empty({0, T0 + max_new_tokens}, idx.options());  // nothing to sample
  Generator& g = gen ? *gen : default_generator();
  struct ModeRestore {  // the caller's train/eval mode, also when a step throws
    GPT& model;
    bool was_training;
    ~ModeRestore() { model.train(was_training); }
  } restore{*this, is_training()};
  eval();
  NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B));
  {
    std::vector<int64_t> flat = idx.to(kInt64).to_vector<int64_t>();
    for (int64_t b = 0; b < B; ++b) seqs[b].assign(flat.begin() + b * T0, flat.begin() + (b + 1) * T0);
  }
  std::vector<nn::KVCache> caches;
  Tensor next;  // the tokens to feed: (B, n)
  auto window = [&](int64_t from) {
    const int64_t n = static_cast<int64_t>(seqs[0].size()) - from;
    std::vector<int64_t> ids;
    for (const auto& s : seqs) ids.insert(ids.end(), s.begin() + from, s.end());
    return from_vector(ids, {B, n}, idx.device());
  };
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t len = static_cast<int64_t>(seqs[0].size());
    Tensor logits;
    if (options.use_cache && len <= config.block_size) {
      // The first step feeds the whole prompt; later ones the last token alone.
      const int64_t cached = caches.empty() ? 0 : caches[0].length();
      logits = forward(window(cached), &caches);
    } else {
      // No cache, or the sequence outgrew the context: the last block_size tokens, from scratch.
      caches.clear();
      logits = forward(window(std::max<int64_t>(0, len - config.block_size)));
    }
    Tensor last = logits.select(1, logits.sizes()[1] - 1).to(kFloat64).to(Device::cpu());
    std::vector<double> rows = last.to_vector<double>();
    const int64_t V = last.sizes()[1];
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> row(rows.begin() + b * V, rows.begin() + (b + 1) * V);
      const bool usable = std::none_of(row.begin(), row.end(), [](double l) { return std::isnan(l) || l == INFINITY; }) &&
                          *std::max_element(row.begin(), row.end()) > -INFINITY;
      KILN_CHECK(usable, "GPT::generate: the logits of row {} at step {} hold NaN or inf (or are all -inf); the model "
                 "has diverged or its weights are damaged", b, step);
      seqs[b].push_back(sample_row(std::move(row), options, g));
    }
  }
  return window(0).to(idx.dtype());
}

// ---- Hugging Face GPT-2 files ----

namespace {

constexpr const char* kPrefix = "transformer.";

bool is_conv1d(const std::string& name) {
  for (const char* s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (name.ends_with(s)) return true;
  }
  return false;
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 8; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 8) s += fmt::format(", ... ({} in all)", names.size());
  return s;
}

}  // namespace

TensorDict from_hf_gpt2(const TensorDict& hf, const GPT& model) {
  TensorDict renamed;
  std::vector<std::string> unexpected;
  const TensorDict own = model.state_dict();
  for (const auto& [key, t] : hf) {
    std::string name = key.starts_with(kPrefix) || key == "lm_head.weight" ? key : kPrefix + key;
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;  // mask buffers
    if (name == "lm_head.weight" && model.config.tie_weights) continue;                 // it is wte
    if (!own.contains(name)) {
      unexpected.push_back(key);
      continue;
    }
    KILN_CHECK(!renamed.contains(name),
               "load_hf_gpt2: the file holds '{}' twice, with and without the '{}' prefix; keep one of them",
               name, kPrefix);
    renamed.insert(name, is_conv1d(name) && t.dim() == 2 ? t.t() : t);
  }
  std::vector<std::string> missing;
  for (const auto& [name, t] : own) {
    if (!renamed.contains(name)) missing.push_back(name);
  }
  KILN_CHECK(unexpected.empty() && missing.empty(),
             "load_hf_gpt2: the file does not fit this GPT (n_layer {}, bias {}, tie_weights {}): {}{}{}", model.config.n_layer,
             model.config.bias, model.config.tie_weights, missing.empty() ? "" : "missing " + join(missing),
             !missing.empty() && !unexpected.empty() ? "; " : "",
             unexpected.empty() ? "" : "unexpected " + join(unexpected));
  for (const auto& [name, t] : own) {
    const Tensor& got = *renamed.find(name);
    KILN_CHECK(got.sizes() == t.sizes(),
               "load_hf_gpt2: {} has shape {} in the file (after the Conv1D transposition) but {} in the model; check "
               "the config (n_embd {}, vocab_size {}, block_size {})",
               name, got.sizes().str(), t.sizes().str(), model.config.n_embd, model.config.vocab_size,
               model.config.block_size);
  }
  return renamed;
}

TensorDict to_hf_gpt2(const GPT& model) {
  TensorDict out;
  for (const auto& [name, t] : model.state_dict()) {
    Tensor w = t.to(Device::cpu());
    if (w.dtype() != kFloat32) w = w.to(kFloat32);
    out.insert(name, is_conv1d(name) ? w.t().contiguous() : w);
  }
  return out;
}

void load_hf_gpt2(GPT& model, const std::string& path) {
  TensorDict state = from_hf_gpt2(safetensors::load_file(path), model);
  model.load_state_dict(state, true);
}

void save_hf_gpt2(const GPT& model, const std::string& path) {
  const GPTConfig& c = model.config;
  safetensors::Metadata meta{{"format", "pt"},
                             {"n_layer", std::to_string(c.n_layer)},
                             {"n_head", std::to_string(c.n_head)},
                             {"n_embd", std::to_string(c.n_embd)},
                             {"n_positions", std::to_string(c.block_size)},
                             {"vocab_size", std::to_string(c.vocab_size)},
                             {"activation_function", c.gelu_approximate == "tanh" ? "gelu_new" : "gelu"}};
  safetensors::save_file(to_hf_gpt2(model), path, meta);
}

}  // namespace kiln::models

// models/gpt_parallel.cpp: see models/gpt_parallel.h.
#include "models/gpt_parallel.h"

#include "autograd/autograd.h"
#include "core/generator.h"
#include "core/grad_mode.h"

namespace kiln::models {

namespace {

void copy_into(Tensor& dst, const Tensor& src) {
  NoGradGuard no_grad;
  dst.copy_(src);
}

void copy_norm(nn::LayerNorm& dst, const nn::LayerNorm& src) {
  copy_into(dst.weight, src.weight);
  copy_into(dst.bias, src.bias);
}

}  // namespace

ParallelGPT::Block::Block(const GPTConfig& c, const std::shared_ptr<distributed::Communicator>& tp,
                          bool sequence_parallel)
    : ln_1(c.n_embd, {.eps = c.layer_norm_eps}),
      attn(c.n_embd, c.n_head, tp, sequence_parallel, c.dropout),
      ln_2(c.n_embd, {.eps = c.layer_norm_eps}),
      mlp(c.n_embd, 4 * c.n_embd, tp, c.gelu_approximate, sequence_parallel, c.dropout),
      tp_(tp),
      sequence_parallel_(sequence_parallel) {
  register_modules({{"ln_1", ln_1}, {"attn", attn}, {"ln_2", ln_2}, {"mlp", mlp}});
}

// Sequence parallel: the LayerNorm sees this rank's positions alone, so its weights' gradients
// are parts, summed over the tensor group by f.
Tensor ParallelGPT::Block::norm(nn::LayerNorm& ln, const Tensor& x) {
  if (!sequence_parallel_) return ln(x);
  return layer_norm(x, ln.normalized_shape, distributed::copy_to_tensor_parallel_region(ln.weight, *tp_),
                    distributed::copy_to_tensor_parallel_region(ln.bias, *tp_), ln.options.eps);
}

Tensor ParallelGPT::Block::forward(const Tensor& x) {
  Tensor h = x + attn(norm(ln_1, x));
  return h + mlp(norm(ln_2, h));
}

Tensor ParallelGPT::Block::forward_for_recompute(const Tensor& x) {
  if (mlp.has_forward_hooks()) return forward(x);
  Tensor h = x + attn(norm(ln_1, x));
  return h + mlp.forward_for_recompute(norm(ln_2, h));
}

ParallelGPT::ParallelGPT(GPTConfig c, std::shared_ptr<distributed::Communicator> tp, int stage, int num_stages,
                         bool sequence_parallel, int chunks)
    : config(c),
      tp_(tp),
      stage_(stage),
      num_stages_(num_stages),
      ranks_(chunks >= 1 ? num_stages / chunks : num_stages),
      sequence_parallel_(sequence_parallel) {
  KILN_CHECK(tp != nullptr, "ParallelGPT: the tensor-parallel communicator is null; pass grid.tensor() (or "
             "distributed::init() for tensor parallelism alone)");
  KILN_CHECK(num_stages >= 1 && stage >= 0 && stage < num_stages && num_stages <= c.n_layer,
             "ParallelGPT: stage {} of {} does not fit a model of {} blocks: each of 1 to n_layer stages needs a "
             "block, and stage must be in [0, num_stages)", stage, num_stages, c.n_layer);
  KILN_CHECK(c.bias, "ParallelGPT: bias = false is not supported; its parallel layers have biases");
  KILN_CHECK(chunks >= 1 && num_stages % chunks == 0,
             "ParallelGPT: {} stages do not cut into {} chunks per pipeline rank; num_stages is the ranks times the "
             "chunks", num_stages, chunks);
  KILN_CHECK(chunks == 1 || !c.tie_weights || ranks_ >= 2,
             "ParallelGPT: a head tied to the embedding with {} chunks on one pipeline rank would be tied to itself; "
             "use 2 or more pipeline ranks, or untie the head", chunks);
  // The whole model from the same random numbers that GPT(c) draws on one process; afterwards the
  // generator is where GPT(c) would have left it, whatever the parallel layers drew in between.
  const GPT whole(c);
  const Generator::State after = default_generator().get_state();
  first_ = stage * c.n_layer / num_stages;
  const int64_t last = (stage + 1) * c.n_layer / num_stages;
  if (is_first_stage()) {
    wte = std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd);
    wpe = std::make_shared<nn::Embedding>(c.block_size, c.n_embd);
    register_module("wte", wte);
    register_module("wpe", wpe);
  }
  for (int64_t i = first_; i < last; ++i) h.push_back(std::make_shared<Block>(c, tp, sequence_parallel));
  register_module("h", h);
  if (is_last_stage()) {
    ln_f = std::make_shared<nn::LayerNorm>(c.n_embd, nn::LayerNormOptions{.eps = c.layer_norm_eps});
    register_module("ln_f", ln_f);
    if (!c.tie_weights || num_stages > 1) {  // tied across stages: a copy of wte
      lm_head = std::make_shared<nn::Linear>(c.n_embd, c.vocab_size, nn::LinearOptions{false});
      register_module("lm_head", lm_head);
    }
  }
  default_generator().set_state(after);
  load_from(whole);
}

void ParallelGPT::load_from(const GPT& whole) {
  const GPTConfig& w = whole.config;
  KILN_CHECK(w.n_layer == config.n_layer && w.n_head == config.n_head && w.n_embd == config.n_embd &&
                 w.block_size == config.block_size && w.vocab_size == config.vocab_size &&
                 w.tie_weights == config.tie_weights && w.bias == config.bias,
             "ParallelGPT::load_from: the GPT has another shape ({} layers, {} heads, {} wide, context {}, vocab {}) "
             "than this model ({}, {}, {}, {}, {}); load one of the same config",
             w.n_layer, w.n_head, w.n_embd, w.block_size, w.vocab_size, config.n_layer, config.n_head, config.n_embd,
             config.block_size, config.vocab_size);
  if (wte) {
    copy_into(wte->weight, whole.transformer.wte.weight);
    copy_into(wpe->weight, whole.transformer.wpe.weight);
  }
  for (size_t j = 0; j < h.size(); ++j) {
    Block& mine = h.at<Block>(j);
    const nn::TransformerBlock& b = whole.block(first_ + static_cast<int64_t>(j));
    copy_norm(mine.ln_1, b.ln_1);
    mine.attn.load_full(b.attn.c_attn.weight, b.attn.c_attn.bias, b.attn.c_proj.weight, b.attn.c_proj.bias);
    copy_norm(mine.ln_2, b.ln_2);
    mine.mlp.fc.load_full(b.mlp.c_fc.weight, b.mlp.c_fc.bias);
    mine.mlp.proj.load_full(b.mlp.c_proj.weight, b.mlp.c_proj.bias);
  }
  if (ln_f) copy_norm(*ln_f, whole.transformer.ln_f);
  if (lm_head) copy_into(lm_head->weight, config.tie_weights ? whole.transformer.wte.weight : whole.lm_head->weight);
}

namespace {

// The tensors of `whole` that stage blocks [first, last) hold (and, for the last stage, ln_f's and
// an untied head's), in the order gather sends them.
std::vector<Tensor> stage_tensors(GPT& whole, int64_t first, int64_t last, bool last_stage) {
  std::vector<Tensor> out;
  for (int64_t i = first; i < last; ++i) {
    nn::TransformerBlock& b = whole.block(i);
    for (Tensor* t : {&b.ln_1.weight, &b.ln_1.bias, &b.attn.c_attn.weight, &b.attn.c_attn.bias, &b.attn.c_proj.weight,
                      &b.attn.c_proj.bias, &b.ln_2.weight, &b.ln_2.bias, &b.mlp.c_fc.weight, &b.mlp.c_fc.bias,
                      &b.mlp.c_proj.weight, &b.mlp.c_proj.bias}) {
      out.push_back(*t);
    }
  }
  if (last_stage) {
    out.push_back(whole.transformer.ln_f.weight);
    out.push_back(whole.transformer.ln_f.bias);
    if (!whole.config.tie_weights) out.push_back(whole.lm_head->weight);
  }
  return out;
}

constexpr int kGatherTag = 3;  // apart from the pipeline's activations (0), gradients (1) and ties (2)

}  // namespace

std::unique_ptr<GPT> ParallelGPT::gather(distributed::Communicator& pipeline) {
  return gather_chunks({this}, pipeline);
}

std::unique_ptr<GPT> ParallelGPT::gather_chunks(const std::vector<ParallelGPT*>& chunks,
                                                distributed::Communicator& pipeline) {
  const int p = pipeline.size(), rank = pipeline.rank();
  const int v = static_cast<int>(chunks.size());
  KILN_CHECK(v >= 1, "ParallelGPT::gather_chunks: no chunks; pass this rank's");
  for (int c = 0; c < v; ++c) {
    KILN_CHECK(chunks[static_cast<size_t>(c)] != nullptr, "ParallelGPT::gather_chunks: chunk {} of {} is null; pass "
               "this rank's chunks", c, v);
    const ParallelGPT& chunk = *chunks[static_cast<size_t>(c)];
    KILN_CHECK(chunk.num_stages_ == p * v && chunk.stage_ == c * p + rank && chunk.ranks_ == p,
               "ParallelGPT::gather: stage {} of {} needs the pipeline's communicator (grid.pipeline()), where it is "
               "chunk {} of rank {} of {}; got chunk {} of rank {} of {}", chunk.stage_, chunk.num_stages_,
               chunk.stage_ / chunk.ranks_, chunk.stage_ % chunk.ranks_, chunk.ranks_, c, rank, p);
  }
  NoGradGuard no_grad;
  // Each chunk's part, whole: the slices gathered over the tensor group, in stage_tensors' order.
  std::vector<std::vector<Tensor>> parts;
  for (ParallelGPT* chunk : chunks) parts.push_back(chunk->whole_part());
  if (rank != 0) {
    for (const auto& part : parts) {
      for (const Tensor& t : part) pipeline.send(t.to(pipeline.device(), kFloat32).contiguous(), 0, kGatherTag);
    }
    return nullptr;
  }
  const ParallelGPT& first = *chunks[0];
  const GPTConfig& config = first.config;
  const Generator::State state = default_generator().get_state();
  auto whole = std::make_unique<GPT>(config);
  default_generator().set_state(state);
  auto copy = [](Tensor dst, const Tensor& src) { dst.copy_(src.to(Device::cpu(), kFloat32)); };
  copy(whole->transformer.wte.weight, first.wte->weight);
  copy(whole->transformer.wpe.weight, first.wpe->weight);
  // Every stage's part in stage order: this rank's own, the others' each in the order its rank
  // sends them (its chunks in order).
  const int stages = p * v;
  for (int s = 0; s < stages; ++s) {
    const int64_t lo = s * config.n_layer / stages, hi = (s + 1) * config.n_layer / stages;
    const std::vector<Tensor> dst = stage_tensors(*whole, lo, hi, s == stages - 1);
    if (s % p == 0) {
      const std::vector<Tensor>& own = parts[static_cast<size_t>(s / p)];
      for (size_t i = 0; i < dst.size(); ++i) copy(dst[i], own[i]);
      continue;
    }
    for (const Tensor& t : dst) {
      Tensor buffer = empty(t.sizes(), TensorOptions(kFloat32).device(pipeline.device()));
      pipeline.recv(buffer, s % p, kGatherTag);
      copy(t, buffer);
    }
  }
  return whole;
}

std::vector<Tensor> ParallelGPT::whole_part() {
  std::vector<Tensor> mine;
  for (size_t j = 0; j < h.size(); ++j) {
    Block& b = h.at<Block>(j);
    const auto [attn_w, attn_b] = b.attn.c_attn.gather_full();
    const auto [proj_w, proj_b] = b.attn.c_proj.gather_full();
    const auto [fc_w, fc_b] = b.mlp.fc.gather_full();
    const auto [out_w, out_b] = b.mlp.proj.gather_full();
    for (const Tensor& t : {b.ln_1.weight, b.ln_1.bias, attn_w, attn_b, proj_w, proj_b, b.ln_2.weight, b.ln_2.bias,
                            fc_w, fc_b, out_w, out_b}) {
      mine.push_back(t.detach());
    }
  }
  if (is_last_stage()) {
    mine.push_back(ln_f->weight.detach());
    mine.push_back(ln_f->bias.detach());
    // A head tied across stages is a copy of the first stage's wte, which is the one trained.
    if (!config.tie_weights) mine.push_back(lm_head->weight.detach());
  }
  return mine;
}

std::vector<distributed::TiedWeight> ParallelGPT::tied_weights() {
  if (!config.tie_weights || num_stages_ == 1) return {};
  // The first stage is on rank 0, the last (virtual stage num_stages - 1) on the pipeline's last rank.
  if (is_first_stage()) return {{.weight = wte->weight, .owner = 0, .user = ranks_ - 1}};
  if (is_last_stage()) return {{.weight = lm_head->weight, .owner = 0, .user = ranks_ - 1}};
  return {};
}

// Note [dropout across stages]
// GPT's forward draws its dropout masks in order: the embeddings' (B, T, C), then for each block
// the attention probabilities' (B, n_head, T, T), the attention output's and the MLP output's
// (B, T, C). A stage draws its own blocks' masks (its tensor-parallel layers their parts, Note
// [dropout in parallel layers]) and reserves, without drawing, the counters of the other stages'
// masks: those before its blocks first, those after them last. So every stage's generator moves
// as one process's does, and each mask is the one GPT(config) draws from the same state, whatever
// the grid; a pipeline's micro-batches draw as gradient accumulation does on one process (with
// several chunks per rank, whose forwards run out of micro-batch order, because the pipeline starts
// each micro-batch's forwards where one process's start: distributed::DrawsAsWholeModel).
void ParallelGPT::reserve_dropout(int64_t first, int64_t last, bool embeddings, int64_t B, int64_t T) {
  Generator& gen = default_generator();
  const int64_t activation = B * T * config.n_embd;
  if (embeddings) gen.reserve(activation);
  for (int64_t i = first; i < last; ++i) {
    gen.reserve(B * config.n_head * T * T);
    gen.reserve(activation);
    gen.reserve(activation);
  }
}

void ParallelGPT::configure_checkpointing(const nn::ActivationCheckpointing& options) {
  KILN_CHECK(!(options.partition_activations && sequence_parallel_ && tp_->size() > 1),
             "ParallelGPT: partition_activations splits each checkpointed block's input among the tensor group's "
             "ranks, and with sequence parallelism each rank holds only its part of the sequence already (Megatron-LM "
             "refuses --distribute-saved-activations with --sequence-parallel too); set \"partition_activations\": "
             "false, or turn sequence parallelism off");
  keeping_ = options;
}

Tensor ParallelGPT::forward(const Tensor& input) {
  Tensor x = input;
  const bool drops = is_training() && config.dropout > 0;
  // The whole sequence's length, from hidden states (B, T or T / p, C) between stages.
  auto positions = [&](const Tensor& hidden) { return hidden.size(1) * (sequence_parallel_ ? tp_->size() : 1); };
  if (drops && !is_first_stage()) reserve_dropout(0, first_, true, input.size(0), positions(input));
  if (is_first_stage()) {
    KILN_CHECK(input.dim() == 2 && (input.dtype() == kInt64 || input.dtype() == kInt32),
               "ParallelGPT: the first stage expects token ids (B, T) of int64, got {} of shape {}",
               dtype_name(input.dtype()), input.sizes().str());
    const int64_t T = input.size(1);
    KILN_CHECK(T <= config.block_size, "ParallelGPT: a sequence of {} tokens is longer than the context, "
               "block_size = {}; crop it", T, config.block_size);
    KILN_CHECK(!sequence_parallel_ || T % tp_->size() == 0, "ParallelGPT: sequence parallel over {} ranks needs a "
               "sequence length that is a multiple of it, not {}", tp_->size(), T);
    x = nn::dropout((*wte)(input) + (*wpe)(arange(0, T, 1, kInt64, input.device())), config.dropout, is_training());
    if (sequence_parallel_) x = distributed::scatter_to_sequence_parallel_region(x, *tp_);
  }
  const bool recompute = checkpointing_ && is_training() && GradMode::is_enabled();
  autograd::CheckpointOptions options;
  if (recompute && keeping_.cpu_checkpointing) options.keep_input = autograd::keep_on_cpu();
  options.synchronize = keeping_.synchronize_checkpoint_boundary;
  options.profile = keeping_.profile;
  if (recompute && keeping_.partition_activations) {
    options.keep_input = distributed::keep_partitioned(tp_, options.keep_input);
  }
  for (size_t j = 0; j < h.size(); ++j) {
    Block& block = h.at<Block>(j);
    x = recompute ? nn::checkpoint_module(block, x, options, recompute_skips_unread_) : block(x);
  }
  if (drops && !is_last_stage()) {
    reserve_dropout(first_ + static_cast<int64_t>(h.size()), config.n_layer, false, x.size(0), positions(x));
  }
  if (!is_last_stage()) return x;
  // The head is whole on every rank: the gradient of the gathered positions is the same on each,
  // and each keeps its part of it.
  if (sequence_parallel_) x = distributed::gather_from_sequence_parallel_region(x, *tp_, false);
  x = (*ln_f)(x);
  if (lm_head) return (*lm_head)(x);
  KILN_CHECK(wte != nullptr, "ParallelGPT: internal error: a tied head without the embedding on its stage");
  return matmul(x, wte->weight.t());
}

}  // namespace kiln::models

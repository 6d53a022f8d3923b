// models/gpt_parallel.h: GPT-2 (models/gpt.h) with Megatron-LM's tensor parallelism, and cut into
// pipeline stages: 3D-parallel GPT for kiln::Engine over a ParallelGrid.
//
//   auto world = distributed::init();
//   distributed::ParallelGrid grid(world, {.tensor = 2, .pipeline = 2});
//   models::ParallelGPT stage(config, grid.tensor(), grid.pipeline_rank(), grid.pipeline_size());
//   auto engine = kiln::initialize(stage, ds_config, grid, models::ParallelGPT::loss);
//   Tensor loss = engine.train_batch(idx, targets);   // idx on the first stage, targets on the last
//
// Each block is GPT-2's pre-LN block with its attention heads and its MLP's hidden features split
// among the ranks of the tensor group (ParallelSelfAttention, ParallelMLP of
// distributed/tensor_parallel): two all-reduces forward and two backward per block. The
// embeddings, the LayerNorms and the head are whole on every rank of the group. Stage s of p holds
// the blocks [s L / p, (s + 1) L / p); the first stage also holds the embeddings (its input is the
// token ids), and the last one ln_f and the head (its output is the logits). A head tied to the
// embedding needs both on one stage, so a pipeline of more than one stage needs
// tie_weights = false (Megatron keeps the two copies equal with an extra all-reduce; Kiln does
// not yet). Every rank builds the model from the same seed, and each keeps its slices, so the
// ranks hold the same model that GPT(config) is on one process; load_from copies one's weights in.
// Not here: dropout (it would need a random stream per slice) and bias = false.
#pragma once

#include <memory>

#include "distributed/comm/communicator.h"
#include "distributed/tensor_parallel/tensor_parallel.h"
#include "models/gpt.h"

namespace kiln::models {

class ParallelGPT : public nn::Module {
 public:
  // Stage `stage` of `num_stages` of the model that `config` describes, its blocks tensor-parallel
  // over `tp` (n_head and 4 n_embd multiples of tp's size).
  ParallelGPT(GPTConfig config, std::shared_ptr<distributed::Communicator> tp, int stage = 0, int num_stages = 1);

  // The first stage: token ids (B, T); the others: the hidden states (B, T, n_embd) from the stage
  // before. The last stage returns logits (B, T, vocab_size), the others the hidden states.
  Tensor forward(const Tensor& input) override;
  // The mean cross-entropy of logits against targets: the pipeline's loss (GPT::loss).
  static Tensor loss(const Tensor& logits, const Tensor& targets) { return GPT::loss(logits, targets); }

  // Sets this stage's weights (this rank's slices) from a whole model of the same config.
  void load_from(const GPT& whole);

  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return stage_ == num_stages_ - 1; }
  int64_t first_block() const { return first_; }  // blocks [first_block, first_block + h.size())

  struct Block : nn::Module {
    Block(const GPTConfig& c, const std::shared_ptr<distributed::Communicator>& tp);
    Tensor forward(const Tensor& x) override;
    nn::LayerNorm ln_1;
    distributed::ParallelSelfAttention attn;
    nn::LayerNorm ln_2;
    distributed::ParallelMLP mlp;
  };

  GPTConfig config;
  std::shared_ptr<nn::Embedding> wte, wpe;  // first stage
  nn::ModuleList h;                         // this stage's blocks
  std::shared_ptr<nn::LayerNorm> ln_f;      // last stage
  std::shared_ptr<nn::Linear> lm_head;      // last stage, when the head is not tied

 private:
  int stage_, num_stages_;
  int64_t first_ = 0;
};

}  // namespace kiln::models

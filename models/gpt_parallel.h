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
// distributed/tensor_parallel): two all-reduces forward and two backward per block (with
// sequence parallelism, each a reduce-scatter and an all-gather). The embeddings, the LayerNorms
// and the head are whole on every rank of the group. Stage s of p holds the blocks
// [s L / p, (s + 1) L / p); the first stage also holds the embeddings (its input is the token
// ids), and the last one ln_f and the head (its output is the logits).
//
// A head tied to the embedding across stages is a copy of wte on the last stage (its lm_head),
// tied to the first stage's wte by tied_weights(). kiln::Engine adds the copy's gradient to wte's
// before the step and copies wte back after, so it trains as GPT's one weight does (Megatron
// all-reduces the two copies' gradients instead). Under a plain Pipeline, call add_tied_gradients
// and copy_tied_weights around the step, and leave the copy out of the optimizer.
//
// Sequence parallel (Megatron's --sequence-parallel, tensor_parallel.h): the first stage keeps
// each rank's part of the sequence of the embeddings' output, the blocks' LayerNorms and residual
// adds work on those T / p positions, each layer's all-reduce becomes a reduce-scatter and an
// all-gather, the stages pass (B, T / p, C) to each other, and the last stage gathers the
// positions before ln_f and the head. T must be a multiple of the tensor group's size.
//
// Dropout (in training) draws the masks GPT(config) draws on one process from the same generator
// state: each rank its part of them, and each stage reserves the other stages' (Note [dropout
// across stages], gpt_parallel.cpp), so the ranks' generators stay in step.
//
// Interleaved 1F1B (Megatron-LM's virtual stages, distributed/pipeline/pipeline.h): each rank builds
// v chunks, chunk c being stage c p + s of p v (num_stages = p v, chunks = v), each from the same
// state of the default generator (each draws the whole model and keeps its part), and hands them
// to kiln::initialize({&chunk0, &chunk1}, ...); gather_chunks joins them. The tied head's copy is then
// on rank p - 1, which needs p >= 2. With dropout, the masks are still one process's: each chunk's
// forward moves the generator as a whole forward does, and the pipeline starts each micro-batch's
// forwards where one process's start (distributed::DrawsAsWholeModel), whatever order the
// interleaved schedule runs them in.
//
// Every rank builds the model from the same seed, and each keeps its slices, so the ranks hold
// the same model that GPT(config) is on one process; load_from copies one's weights in. Not here:
// bias = false.
#pragma once

#include <memory>

#include "distributed/comm/communicator.h"
#include "distributed/pipeline/pipeline.h"
#include "distributed/tensor_parallel/tensor_parallel.h"
#include "models/gpt.h"

namespace kiln::models {

class ParallelGPT : public nn::Module,
                    public distributed::TiedWeights,
                    public distributed::DrawsAsWholeModel,
                    public nn::ConfiguresCheckpointing {
 public:
  // Stage `stage` of `num_stages` of the model that `config` describes, its blocks tensor-parallel
  // over `tp` (n_head and 4 n_embd multiples of tp's size). sequence_parallel: between the blocks'
  // tensor-parallel layers each rank of tp keeps its part of the sequence (see below).
  // chunks: the model chunks each pipeline rank holds (interleaved 1F1B); stage and num_stages
  // then count virtual stages, stage c p + s being chunk c of pipeline rank s.
  ParallelGPT(GPTConfig config, std::shared_ptr<distributed::Communicator> tp, int stage = 0, int num_stages = 1,
              bool sequence_parallel = false, int chunks = 1);

  // The first stage: token ids (B, T); the others: the hidden states (B, T, n_embd) from the stage
  // before (sequence parallel: (B, T / tp size, n_embd), this rank's positions). The last stage
  // returns logits (B, T, vocab_size), the others the hidden states.
  Tensor forward(const Tensor& input) override;
  // The mean cross-entropy of logits against targets: the pipeline's loss (GPT::loss).
  static Tensor loss(const Tensor& logits, const Tensor& targets) { return GPT::loss(logits, targets); }

  // Sets this stage's weights (this rank's slices) from a whole model of the same config.
  void load_from(const GPT& whole);
  // The whole model that the stages and slices make up, the inverse of load_from: a GPT of this
  // config, float32 on the CPU, on every rank of the first stage (each of its tensor ranks gets
  // one); nullptr on the other stages. Collective: every rank of each stage's tensor group and of
  // `pipeline` (the stages, stage s its rank s: grid.pipeline()) calls it. Building the copy draws
  // nothing from the default generator. For a sample, or a file in GPT-2's layout, after training.
  std::unique_ptr<GPT> gather(distributed::Communicator& pipeline);
  // The same for this rank's chunks (interleaved 1F1B), in chunk order.
  static std::unique_ptr<GPT> gather_chunks(const std::vector<ParallelGPT*>& chunks,
                                            distributed::Communicator& pipeline);

  // With a tied head and more than one stage: wte (first stage) and its copy, lm_head's weight
  // (last stage), rank 0 the owner and the last stage's rank the user; empty otherwise.
  std::vector<distributed::TiedWeight> tied_weights() override;

  // Activation checkpointing (autograd::checkpoint, as GPT::set_checkpointing) of every block of
  // this stage: in training with grad recording on, a block keeps only its input and runs again in
  // backward, its tensor-parallel collectives included (every rank of the tensor group recomputes
  // at the same point of backward), and its dropout masks the same (the generator's state is
  // replayed). Megatron-LM's full recompute of every layer (--recompute-granularity full
  // --recompute-method uniform --recompute-num-layers 1), less what backward never
  // reads: the recompute leaves out the MLP's last GEMM and its all-reduce (Block::
  // forward_for_recompute), unless set_recompute_skips_unread(false), to measure the difference.
  void set_checkpointing(bool on) { checkpointing_ = on; }
  bool checkpointing() const { return checkpointing_; }
  void set_recompute_skips_unread(bool on) { recompute_skips_unread_ = on; }
  // How the checkpointed blocks keep their inputs (DeepSpeed's "activation_checkpointing" section,
  // which kiln::initialize passes here). partition_activations: each rank of the tensor group keeps
  // 1/size of each block's input, all-gathered in backward (distributed::keep_partitioned;
  // Megatron-LM's --distribute-saved-activations); with sequence parallelism the inputs are split
  // already, and asking for it is an Error (as in Megatron-LM). cpu_checkpointing: what is kept
  // goes to pinned host memory.
  void configure_checkpointing(const nn::ActivationCheckpointing& options) override;
  const nn::ActivationCheckpointing& checkpointing_options() const { return keeping_; }

  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return stage_ == num_stages_ - 1; }
  bool sequence_parallel() const { return sequence_parallel_; }
  int64_t first_block() const { return first_; }  // blocks [first_block, first_block + h.size())

  struct Block : nn::Module {
    Block(const GPTConfig& c, const std::shared_ptr<distributed::Communicator>& tp, bool sequence_parallel);
    Tensor forward(const Tensor& x) override;
    // forward with the MLP's projection only recorded (ParallelMLP::forward_for_recompute): the
    // block ends in h + dropout(proj(...)), whose backward reads neither the add's nor the
    // projection's output. forward itself where the MLP has hooks.
    Tensor forward_for_recompute(const Tensor& x) override;
    nn::LayerNorm ln_1;
    distributed::ParallelSelfAttention attn;
    nn::LayerNorm ln_2;
    distributed::ParallelMLP mlp;

   private:
    Tensor norm(nn::LayerNorm& ln, const Tensor& x);
    std::shared_ptr<distributed::Communicator> tp_;
    bool sequence_parallel_;
  };

  GPTConfig config;
  std::shared_ptr<nn::Embedding> wte, wpe;  // first stage
  nn::ModuleList h;                         // this stage's blocks
  std::shared_ptr<nn::LayerNorm> ln_f;      // last stage
  // last stage, when the head is not tied or (a copy of wte) is tied across stages
  std::shared_ptr<nn::Linear> lm_head;

 private:
  // This stage's weights, whole (its slices gathered over the tensor group: collective there), in
  // the order gather sends them.
  std::vector<Tensor> whole_part();
  // Reserves the dropout counters of blocks [first, last) (and the embeddings') of a (B, T) batch.
  void reserve_dropout(int64_t first, int64_t last, bool embeddings, int64_t B, int64_t T);

  std::shared_ptr<distributed::Communicator> tp_;
  int stage_, num_stages_;
  int ranks_;  // the pipeline's ranks: num_stages / chunks
  bool sequence_parallel_;
  bool checkpointing_ = false;
  bool recompute_skips_unread_ = true;
  nn::ActivationCheckpointing keeping_;
  int64_t first_ = 0;
};

}  // namespace kiln::models

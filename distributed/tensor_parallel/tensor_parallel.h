// distributed/tensor_parallel/tensor_parallel.h: tensor (intra-layer) parallelism, as Megatron-LM
// (Shoeybi et al., 2019): each rank holds a slice of every weight matrix and computes a slice of
// each layer, and the ranks exchange activations inside the layer.
//
//   auto tp = distributed::init();                    // the tensor-parallel ranks
//   distributed::ColumnParallelLinear fc(768, 3072, tp);   // weight (3072 / p, 768) here
//   distributed::RowParallelLinear proj(3072, 768, tp);    // weight (768, 3072 / p) here
//   Tensor y = proj(gelu(fc(x)));                     // x and y whole on every rank; one all-reduce
//
// Two ways to cut Y = X A^T + b (A: out x in):
//   column-parallel: A by rows (output features): rank r computes Y_r = X A_r^T + b_r, its slice of
//                    Y's last dim. X must be whole on every rank.
//   row-parallel:    A by columns (input features): rank r computes X_r A_r^T from its slice of X's
//                    last dim, and Y = sum over ranks of those, + b: one all-reduce.
// A column-parallel layer followed by an elementwise function and a row-parallel one (an MLP; or
// attention, whose heads are the column slices) needs no communication in between: the column
// layer's output slice is exactly the row layer's input slice. So a transformer block costs two
// all-reduces forward and two backward.
//
// The communication is written as a conjugate pair of autograd functions (Megatron's f and g):
//   copy_to_tensor_parallel_region      forward: identity    backward: all-reduce the gradient
//   reduce_from_tensor_parallel_region  forward: all-reduce  backward: identity
// f sits where a whole X enters a column-parallel layer (each rank's slice of the computation gives
// only part of dL/dX, so the parts are summed); g ends a row-parallel layer. Two more move a tensor
// between whole and sliced along its last dim:
//   gather_from_tensor_parallel_region  forward: all-gather  backward: keep this rank's slice
//   scatter_to_tensor_parallel_region   forward: keep this rank's slice   backward: all-gather
//
// Sequence parallelism (Korthikanti et al., 2022; Megatron's --sequence-parallel). Between the
// tensor-parallel layers (the LayerNorms, the residual adds), every rank of the group would
// compute the same thing on the whole activation. With sequence_parallel each rank instead keeps
// its part of the sequence: positions [r T/p, (r+1) T/p) of dim 1 of a (B, T, C) activation.
// The all-reduce that ends a row-parallel layer becomes a reduce-scatter along the sequence, and
// the input of a column-parallel layer is first all-gathered along it. That moves the same bytes
// as the all-reduce it replaces (an all-reduce is a reduce-scatter and an all-gather), and what
// the LayerNorms and residual adds keep for backward takes 1/p of the memory. A column-parallel
// layer keeps only its input's positions too, and all-gathers them again in backward for its
// weight's gradient (as Megatron does): one more all-gather per layer, for T / p positions of
// memory instead of T. The functions:
//   gather_from_sequence_parallel_region        forward: all-gather along dim 1
//                                               backward: reduce-scatter (tensor_parallel_output_grad)
//                                               or keep this rank's part (the consumer is whole on
//                                               every rank, as a head that is not split)
//   reduce_scatter_to_sequence_parallel_region  forward: reduce-scatter along dim 1   backward: all-gather
//   scatter_to_sequence_parallel_region         forward: keep this rank's part       backward: all-gather
// A weight that every rank holds whole but applies to its own positions alone (a LayerNorm's, a
// row-parallel bias) gets only part of its gradient on each rank. Pass it through
// copy_to_tensor_parallel_region where it is used, and f sums the parts: a small all-reduce per
// such weight in each backward (Megatron sums them once, after backward).
//
// Every rank builds each layer from the same random numbers (the same seed, as Megatron's master
// weights) and keeps its slice, so p ranks hold, and compute, the same model as one process with
// nn::Linear would; load_full sets a layer's slice from whole weights, and gather_full gives the
// whole weights back from the slices.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "distributed/comm/communicator.h"
#include "nn/module.h"

namespace kiln::distributed {

Tensor copy_to_tensor_parallel_region(const Tensor& x, Communicator& comm);
Tensor reduce_from_tensor_parallel_region(const Tensor& x, Communicator& comm);
Tensor gather_from_tensor_parallel_region(const Tensor& x, Communicator& comm);
Tensor scatter_to_tensor_parallel_region(const Tensor& x, Communicator& comm);
Tensor gather_from_sequence_parallel_region(const Tensor& x, Communicator& comm,
                                            bool tensor_parallel_output_grad = true);
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, Communicator& comm);
Tensor scatter_to_sequence_parallel_region(const Tensor& x, Communicator& comm);

struct ColumnParallelLinearOptions {
  bool bias = true;
  bool gather_output = false;  // all-gather the output slices into the whole output
  // Megatron's partition stride: the weight's rows are `stride` blocks (q, k and v: 3), each cut
  // among the ranks, and a rank's slice is its piece of every block, stacked.
  int64_t stride = 1;
  // The input is this rank's positions: all-gathered along dim 1 first (and again in backward,
  // for the weight's gradient, rather than kept).
  bool sequence_parallel = false;
};

class ColumnParallelLinear : public nn::Module {
 public:
  // out_features must be a multiple of the number of ranks.
  ColumnParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<Communicator> comm,
                       ColumnParallelLinearOptions options = {});
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  // Sets this rank's slice from the whole layer's weight (out, in) and bias (out).
  void load_full(const Tensor& weight, const Tensor& bias = {});
  // The whole layer's weight (out, in) and bias (out, or undefined), from every rank's slice: the
  // inverse of load_full. Collective: each rank of the layer's calls it and gets the whole.
  std::pair<Tensor, Tensor> gather_full() const;

  Tensor weight;  // (out / p, in)
  Tensor bias;    // (out / p), or undefined

 private:
  int64_t in_features_, out_features_;
  std::shared_ptr<Communicator> comm_;
  ColumnParallelLinearOptions options_;
};

struct RowParallelLinearOptions {
  bool bias = true;
  bool input_is_parallel = true;  // the input is this rank's slice (else it is whole, and cut here)
  bool sequence_parallel = false;  // reduce-scatter the output along dim 1: each rank gets its positions
};

class RowParallelLinear : public nn::Module {
 public:
  // in_features must be a multiple of the number of ranks.
  RowParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<Communicator> comm,
                    RowParallelLinearOptions options = {});
  Tensor forward(const Tensor& input) override;
  // forward's graph without its GEMM and its all-reduce (or reduce-scatter): the output has
  // forward's shape and nodes, and holds the bias alone. For a checkpointed block's recompute, whose
  // backward never reads this layer's output (Note [a recompute computes what backward reads] in
  // autograd/checkpoint.cpp): the all-reduce's backward is the identity, the reduce-scatter's an
  // all-gather, which backward still runs. No collective in forward: call it on every rank or none.
  Tensor forward_graph_only(const Tensor& input);
  std::string extra_repr() const override;
  void load_full(const Tensor& weight, const Tensor& bias = {});
  std::pair<Tensor, Tensor> gather_full() const;  // as ColumnParallelLinear's

  Tensor weight;  // (out, in / p)
  Tensor bias;    // (out), the same on every rank (added once, after the all-reduce), or undefined

 private:
  int64_t in_features_, out_features_;
  std::shared_ptr<Communicator> comm_;
  RowParallelLinearOptions options_;
};

// Megatron's parallel MLP: fc (column-parallel) -> GELU -> proj (row-parallel) -> dropout, n_embd ->
// hidden -> n_embd, with one all-reduce forward and one backward. gelu_approximate: "none" (erf) or
// "tanh". sequence_parallel: input and output are this rank's positions (an all-gather and a
// reduce-scatter each way instead). dropout (in training) drops what nn::GeluMLP's would on one
// process from the same generator state: see Note [dropout in parallel layers].
class ParallelMLP : public nn::Module {
 public:
  ParallelMLP(int64_t n_embd, int64_t hidden, std::shared_ptr<Communicator> comm,
              std::string gelu_approximate = "none", bool sequence_parallel = false, double dropout = 0.0);
  Tensor forward(const Tensor& input) override;
  // forward with proj's GEMM and reduction only recorded (RowParallelLinear::forward_graph_only);
  // the dropout still draws forward's mask. forward itself where proj has hooks, which must see
  // the values.
  Tensor forward_for_recompute(const Tensor& input) override;
  ColumnParallelLinear fc;
  RowParallelLinear proj;

 private:
  std::string gelu_approximate_;
  double dropout_;
  bool sequence_parallel_;
  std::shared_ptr<Communicator> comm_;
};

// Causal multi-head self-attention with the heads split among the ranks (n_head a multiple of p):
// q, k, v of this rank's heads from one column-parallel projection, attention on them alone, and a
// row-parallel output projection. Input and output (B, T, C) whole on every rank (sequence_parallel:
// (B, T / p, C), this rank's positions; attention itself sees every position). dropout (in
// training) on the attention probabilities and on the output, as nn::CausalSelfAttention's.
//
// Note [dropout in parallel layers]
// Each dropout draws, from the default generator, the mask that one process would draw for the
// whole activation, and every rank keeps its part: the probabilities' (B, n_head, T, T) mask cut
// by heads (ops::scaled_dot_product_attention_part, whose fused CPU kernel draws the part block by
// block), a sequence-parallel output's (B, T, C) mask cut by positions (ops::dropout_part); an
// output whole on every rank takes the whole mask on each. So the ranks of a tensor group, seeded
// alike, stay in step and drop what nn::CausalSelfAttention and nn::GeluMLP drop on one process
// from the same state. (Megatron instead forks a generator seeded per tensor rank for the
// probabilities, so its masks change with the number of ranks.)
class ParallelSelfAttention : public nn::Module {
 public:
  ParallelSelfAttention(int64_t n_embd, int64_t n_head, std::shared_ptr<Communicator> comm,
                        bool sequence_parallel = false, double dropout = 0.0);
  Tensor forward(const Tensor& input) override;
  // Sets the slices from a whole layer's c_attn (3C, C) (q, k and v stacked, as GPT-2's) and c_proj (C, C).
  void load_full(const Tensor& attn_weight, const Tensor& attn_bias, const Tensor& proj_weight,
                 const Tensor& proj_bias);
  ColumnParallelLinear c_attn;  // (3 C / p, C): this rank's heads' q, k and v
  RowParallelLinear c_proj;     // (C, C / p)

 private:
  int64_t n_embd_, n_head_, local_heads_;
  double dropout_;
  bool sequence_parallel_;
  std::shared_ptr<Communicator> comm_;
};

// A checkpoint's way of keeping an input that every rank of `group` holds whole (autograd::
// CheckpointOptions::keep_input): each rank keeps its 1/size of the flattened input (a copy, so
// the whole one can be freed; the last part padded), passed on to `then` where given (keep_on_cpu:
// DeepSpeed's cpu_checkpointing), and backward all-gathers the parts over the group. DeepSpeed's
// partition_activations, Megatron-LM's --distribute-saved-activations. Every rank of the group runs
// the checkpointed backward at the same point (the recompute's own collectives need it anyway).
autograd::KeepInput keep_partitioned(std::shared_ptr<Communicator> group, autograd::KeepInput then = {});

// The parameters of `module` that are slices of its tensor-parallel layers: column-parallel weights
// and biases, row-parallel weights. Every other parameter is whole, the same on each rank of the
// tensor group (a row-parallel bias, a LayerNorm): a global gradient norm counts those once.
std::vector<Tensor> tensor_parallel_slices(nn::Module& module);

}  // namespace kiln::distributed

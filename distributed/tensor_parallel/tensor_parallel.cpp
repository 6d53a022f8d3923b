// distributed/tensor_parallel/tensor_parallel.cpp: the conjugate communication functions and the
// parallel layers (see tensor_parallel.h).
#include "distributed/tensor_parallel/tensor_parallel.h"

#include "autograd/function.h"
#include "core/grad_mode.h"
#include "nn/functional.h"
#include "nn/linear.h"
#include "ops/ops.h"

namespace kiln::distributed {

namespace {

Communicator& comm_of(autograd::AutogradContext* ctx) { return *std::any_cast<Communicator*>(ctx->saved_data["comm"]); }

Tensor all_reduced(const Tensor& x, Communicator& comm) {
  Tensor out = x.contiguous().clone();
  comm.all_reduce(out, ReduceOp::Sum);
  return out;
}

// Where a region cuts an activation: along its features (the last dim; tensor parallel) or its
// positions (dim 1 of a (B, T, ...) activation; sequence parallel).
enum class Cut { kFeatures, kPositions };

int64_t dim_of(const Tensor& x, Cut cut) { return cut == Cut::kFeatures ? x.dim() - 1 : 1; }

void check_cut(const Tensor& x, int64_t p, Cut cut, bool divides) {
  if (cut == Cut::kFeatures) {
    KILN_CHECK(!divides || x.size(-1) % p == 0, "tensor parallel: the last dim ({}) must be a multiple of the {} ranks",
               x.size(-1), p);
    return;
  }
  KILN_CHECK(x.dim() >= 2, "sequence parallel: sequence parallelism cuts dim 1 of a (B, T, ...) activation; got shape "
             "{}", x.sizes().str());
  KILN_CHECK(!divides || x.size(1) % p == 0,
             "sequence parallel: the sequence ({} positions, dim 1) must be a multiple of the {} ranks", x.size(1), p);
}

void check_dropout(double p, const char* layer) {
  KILN_CHECK(p >= 0 && p < 1, "{}: dropout must be in [0, 1), got {}", layer, p);
}

// The dropout that ends a parallel layer, on its output (B, T, C): whole on every rank, each rank
// drawing the same mask; sequence parallel, this rank's positions, with its part of that mask.
Tensor output_dropout(const Tensor& y, double p, bool training, bool sequence_parallel, Communicator& comm) {
  if (!sequence_parallel) return dropout(y, p, training);
  return dropout_part(y, p, training, 1, comm.rank() * y.size(1), comm.size() * y.size(1));
}

// This rank's part of x along the cut: [r n/p, (r+1) n/p).
Tensor own_part(const Tensor& x, Communicator& comm, Cut cut) {
  check_cut(x, comm.size(), cut, /*divides=*/true);
  const int64_t d = dim_of(x, cut), part = x.size(d) / comm.size();
  return x.narrow(d, comm.rank() * part, part).contiguous();
}

// Every rank's x, one after the other along the cut.
Tensor gathered(const Tensor& x, Communicator& comm, Cut cut) {
  check_cut(x, comm.size(), cut, /*divides=*/false);
  Tensor mine = x.contiguous();
  const int64_t d = dim_of(mine, cut);
  Tensor all = empty({comm.size() * mine.numel()}, mine.options());
  comm.all_gather_into_tensor(all, mine.reshape({-1}));
  // (p, ..., n, ...) -> (..., p, n, ...) -> (..., p n, ...): the ranks' blocks moved in front of dim d
  Shape split = mine.sizes();
  split.insert(0, comm.size());
  std::vector<int64_t> order;
  for (int64_t k = 1; k <= d; ++k) order.push_back(k);
  order.push_back(0);
  for (int64_t k = d + 1; k < static_cast<int64_t>(split.size()); ++k) order.push_back(k);
  Shape out_shape = mine.sizes();
  out_shape[static_cast<size_t>(d)] *= comm.size();
  return all.view(split).permute(Shape(order)).contiguous().view(out_shape);
}

// The sum over the ranks of x, of which each rank keeps its positions of dim 1.
Tensor reduce_scattered_positions(const Tensor& x, Communicator& comm) {
  check_cut(x, comm.size(), Cut::kPositions, /*divides=*/true);
  const int64_t p = comm.size();
  // (B, p t, ...) -> (B, p, t, ...) -> (p, B, t, ...): rank r's part is block r
  Shape split = x.sizes();
  split[1] /= p;
  split.insert(1, p);
  std::vector<int64_t> order{1, 0};
  for (int64_t d = 2; d < static_cast<int64_t>(split.size()); ++d) order.push_back(d);
  Tensor blocks = x.contiguous().view(split).permute(Shape(order)).contiguous();
  Shape out_shape = x.sizes();
  out_shape[1] /= p;
  Tensor out = empty(out_shape, x.options());
  comm.reduce_scatter_tensor(out, blocks.reshape({-1}), ReduceOp::Sum);
  return out;
}

// All-gather along the cut forward; backward, this rank's part of the gradient, or (sum_grad,
// positions only) the sum over the ranks of their gradients at its part.
struct Gather : autograd::Function<Gather> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x, Communicator* comm, Cut cut, bool sum_grad) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["cut"] = cut;
    ctx->saved_data["sum"] = sum_grad;
    return gathered(x, *comm, cut);
  }
  static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
    Communicator& comm = comm_of(ctx);
    const Cut cut = std::any_cast<Cut>(ctx->saved_data["cut"]);
    const bool sum = std::any_cast<bool>(ctx->saved_data["sum"]);
    return {sum ? reduce_scattered_positions(g[0], comm) : own_part(g[0], comm, cut), Tensor(), Tensor(), Tensor()};
  }
};

// This rank's part along the cut forward; all-gather backward.
struct Scatter : autograd::Function<Scatter> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x, Communicator* comm, Cut cut) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["cut"] = cut;
    return own_part(x, *comm, cut);
  }
  static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
    return {gathered(g[0], comm_of(ctx), std::any_cast<Cut>(ctx->saved_data["cut"])), Tensor(), Tensor()};
  }
};

// values = false: the output's shape without the reduction (RowParallelLinear::forward_graph_only).
struct ReduceScatterToSequence : autograd::Function<ReduceScatterToSequence> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x, Communicator* comm, bool values) {
    ctx->saved_data["comm"] = comm;
    if (values) return reduce_scattered_positions(x, *comm);
    check_cut(x, comm->size(), Cut::kPositions, /*divides=*/true);
    Shape out_shape = x.sizes();
    out_shape[1] /= comm->size();
    return zeros(out_shape, x.options());
  }
  static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
    return {gathered(g[0], comm_of(ctx), Cut::kPositions), Tensor(), Tensor()};
  }
};

// A sequence-parallel column-parallel layer, y = gathered(x) W^T + b, that keeps only this rank's
// positions x for backward and all-gathers them again there for the weight's gradient (Megatron's
// LinearWithGradAccumulationAndAsyncCommunication under sequence_parallel): T / p positions of
// memory instead of T, for one more all-gather. The input's gradient is reduce-scattered, as the
// gather's backward does.
struct GatheredLinear : autograd::Function<GatheredLinear> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        Communicator* comm) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["bias"] = bias.defined();
    ctx->save_for_backward({x, weight});
    return nn::linear(gathered(x, *comm, Cut::kPositions), weight, bias);
  }
  static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
    Communicator& comm = comm_of(ctx);
    const autograd::TensorList saved = ctx->get_saved_variables();
    const Tensor& gy = g[0];  // (..., T, out / p), in the output's dtype (autocast's, if it ran under one)
    const Tensor w = saved[1].to(gy.dtype());
    const int64_t out = w.size(0), in = w.size(1);
    // Every rank runs both collectives, whatever it needs.
    Tensor x = gathered(saved[0], comm, Cut::kPositions).to(gy.dtype());
    Tensor gx = reduce_scattered_positions(matmul(gy, w), comm);
    Tensor rows = gy.reshape({-1, out});
    Tensor gw = ctx->needs_input_grad(1) ? matmul(rows.t(), x.reshape({-1, in})) : Tensor();
    const bool bias = std::any_cast<bool>(ctx->saved_data["bias"]);
    Tensor gb = ctx->needs_input_grad(2) && bias ? rows.sum(Shape{0}) : Tensor();
    return {gx, gw, gb, Tensor()};
  }
};

// f: identity forward, all-reduce backward.
struct CopyToRegion : autograd::Function<CopyToRegion> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x, Communicator* comm) {
    ctx->saved_data["comm"] = comm;
    return x.clone();  // a new tensor: the output is not the input
  }
  static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
    return {all_reduced(g[0], comm_of(ctx)), Tensor()};
  }
};

// g: all-reduce forward, identity backward.
struct ReduceFromRegion : autograd::Function<ReduceFromRegion> {
  static Tensor forward(autograd::AutogradContext*, const Tensor& x, Communicator* comm) {
    return all_reduced(x, *comm);
  }
  static autograd::TensorList backward(autograd::AutogradContext*, autograd::TensorList g) {
    return {g[0], Tensor()};
  }
};

// Rows [r n/p, (r+1) n/p) of each of `stride` equal blocks of w's dim 0, stacked: the slice of a
// column-parallel weight (stride 3: q, k and v each cut by heads; Megatron's partition stride).
Tensor column_slice(const Tensor& w, int64_t stride, Communicator& comm) {
  const int64_t block = w.size(0) / stride, piece = block / comm.size();
  std::vector<Tensor> parts;
  for (int64_t b = 0; b < stride; ++b) parts.push_back(w.narrow(0, b * block + comm.rank() * piece, piece));
  return cat(parts, 0).contiguous();
}

void check_comm(const std::shared_ptr<Communicator>& comm, const char* who) {
  KILN_CHECK(comm != nullptr, "{}: the communicator is null; pass the tensor-parallel ranks' (distributed::init())",
             who);
}

// load_full's arguments: the whole layer's weight (out, in) and bias (out), or none.
void check_full(const char* who, const Tensor& w, const Tensor& b, int64_t out, int64_t in, bool has_bias) {
  KILN_CHECK(w.sizes() == Shape({out, in}), "{}.load_full: the weight must be ({}, {}), not {}", who, out, in,
             w.sizes().str());
  KILN_CHECK(b.defined() == has_bias && (!b.defined() || b.sizes() == Shape({out})),
             "{}.load_full: the bias must be {}", who, has_bias ? fmt::format("({})", out) : std::string("undefined"));
}

}  // namespace

Tensor copy_to_tensor_parallel_region(const Tensor& x, Communicator& comm) { return CopyToRegion::apply(x, &comm); }
Tensor reduce_from_tensor_parallel_region(const Tensor& x, Communicator& comm) {
  return ReduceFromRegion::apply(x, &comm);
}
Tensor gather_from_tensor_parallel_region(const Tensor& x, Communicator& comm) {
  return Gather::apply(x, &comm, Cut::kFeatures, false);
}
Tensor scatter_to_tensor_parallel_region(const Tensor& x, Communicator& comm) {
  return Scatter::apply(x, &comm, Cut::kFeatures);
}
Tensor gather_from_sequence_parallel_region(const Tensor& x, Communicator& comm, bool tensor_parallel_output_grad) {
  return Gather::apply(x, &comm, Cut::kPositions, tensor_parallel_output_grad);
}
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, Communicator& comm) {
  return ReduceScatterToSequence::apply(x, &comm, true);
}
Tensor scatter_to_sequence_parallel_region(const Tensor& x, Communicator& comm) {
  return Scatter::apply(x, &comm, Cut::kPositions);
}

// ---- ColumnParallelLinear ----

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features,
                                           std::shared_ptr<Communicator> comm, ColumnParallelLinearOptions options)
    : in_features_(in_features), out_features_(out_features), comm_(std::move(comm)), options_(options) {
  check_comm(comm_, "ColumnParallelLinear");
  KILN_CHECK(options_.stride >= 1 && out_features % (options_.stride * comm_->size()) == 0,
             "ColumnParallelLinear: out_features ({}) must be a multiple of stride {} x {} ranks", out_features,
             options_.stride, comm_->size());
  // The whole layer from the same random numbers on every rank (nn::Linear's init), then this
  // rank's slice of it.
  nn::Linear full(in_features, out_features, {.bias = options_.bias});
  weight = register_parameter("weight", empty({out_features / comm_->size(), in_features}));
  if (options_.bias) bias = register_parameter("bias", empty({out_features / comm_->size()}));
  load_full(full.weight, full.bias);
}

void ColumnParallelLinear::load_full(const Tensor& w, const Tensor& b) {
  check_full("ColumnParallelLinear", w, b, out_features_, in_features_, bias.defined());
  NoGradGuard no_grad;
  weight.copy_(column_slice(w, options_.stride, *comm_));
  if (b.defined()) bias.copy_(column_slice(b.reshape({-1, 1}), options_.stride, *comm_).reshape({-1}));
}

std::pair<Tensor, Tensor> ColumnParallelLinear::gather_full() const {
  NoGradGuard no_grad;
  // Rank r holds rows [b B + r n, b B + (r + 1) n) of each of the stride blocks b (B = p n): the
  // gathered (p, stride, n, ...) goes back to (stride, p, n, ...).
  const int64_t p = comm_->size(), stride = options_.stride;
  auto whole = [&](const Tensor& param) {
    const Tensor slice = param.detach().contiguous();
    Tensor all = empty({p * slice.numel()}, slice.options());
    comm_->all_gather_into_tensor(all, slice.reshape({-1}));
    Shape split{p, stride, slice.size(0) / stride};
    for (int64_t d = 1; d < slice.dim(); ++d) split.push_back(slice.size(d));
    Shape order{1, 0};
    for (int64_t d = 2; d < static_cast<int64_t>(split.size()); ++d) order.push_back(d);
    Shape out = slice.sizes();
    out[0] *= p;
    return all.view(split).permute(order).contiguous().view(out);
  };
  return {whole(weight), bias.defined() ? whole(bias) : Tensor()};
}

Tensor ColumnParallelLinear::forward(const Tensor& input) {
  Tensor y = options_.sequence_parallel ? GatheredLinear::apply(input, weight, bias, comm_.get())
                                        : nn::linear(copy_to_tensor_parallel_region(input, *comm_), weight, bias);
  return options_.gather_output ? gather_from_tensor_parallel_region(y, *comm_) : y;
}

std::string ColumnParallelLinear::extra_repr() const {
  return fmt::format("in_features={}, out_features={} ({} on each of {} ranks), bias={}, gather_output={}, "
                     "sequence_parallel={}", in_features_, out_features_, out_features_ / comm_->size(), comm_->size(),
                     bias.defined() ? "True" : "False", options_.gather_output ? "True" : "False",
                     options_.sequence_parallel ? "True" : "False");
}

// ---- RowParallelLinear ----

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<Communicator> comm,
                                     RowParallelLinearOptions options)
    : in_features_(in_features), out_features_(out_features), comm_(std::move(comm)), options_(options) {
  check_comm(comm_, "RowParallelLinear");
  KILN_CHECK(in_features % comm_->size() == 0, "RowParallelLinear: in_features ({}) must be a multiple of the {} ranks",
             in_features, comm_->size());
  KILN_CHECK(!options_.sequence_parallel || options_.input_is_parallel,
             "RowParallelLinear: sequence_parallel needs input_is_parallel (the input is this rank's slice of the "
             "features, as a column-parallel layer leaves it)");
  nn::Linear full(in_features, out_features, {.bias = options_.bias});
  weight = register_parameter("weight", empty({out_features, in_features / comm_->size()}));
  if (options_.bias) bias = register_parameter("bias", empty({out_features}));
  load_full(full.weight, full.bias);
}

void RowParallelLinear::load_full(const Tensor& w, const Tensor& b) {
  check_full("RowParallelLinear", w, b, out_features_, in_features_, bias.defined());
  NoGradGuard no_grad;
  weight.copy_(own_part(w, *comm_, Cut::kFeatures));
  if (b.defined()) bias.copy_(b);
}

std::pair<Tensor, Tensor> RowParallelLinear::gather_full() const {
  NoGradGuard no_grad;
  // The bias is whole on every rank already.
  return {gathered(weight.detach(), *comm_, Cut::kFeatures), bias.defined() ? bias.detach().clone() : Tensor()};
}

Tensor RowParallelLinear::forward(const Tensor& input) {
  Tensor x = options_.input_is_parallel ? input : scatter_to_tensor_parallel_region(input, *comm_);
  if (options_.sequence_parallel) {
    // Each rank keeps the sum at its positions, and adds the bias there: the bias's gradient is
    // then a part on each rank, which f sums.
    Tensor y = reduce_scatter_to_sequence_parallel_region(nn::linear(x, weight), *comm_);
    return bias.defined() ? y + copy_to_tensor_parallel_region(bias, *comm_) : y;
  }
  Tensor y = reduce_from_tensor_parallel_region(nn::linear(x, weight), *comm_);
  return bias.defined() ? y + bias : y;  // once, after the sum
}

Tensor RowParallelLinear::forward_graph_only(const Tensor& input) {
  Tensor x = options_.input_is_parallel ? input : scatter_to_tensor_parallel_region(input, *comm_);
  Tensor partial = nn::linear_graph_only(x, weight);  // zeros, with linear's node
  if (options_.sequence_parallel) {
    Tensor y = ReduceScatterToSequence::apply(partial, comm_.get(), false);
    return bias.defined() ? y + copy_to_tensor_parallel_region(bias, *comm_) : y;
  }
  // The all-reduce's backward is the identity: the partial sums' node takes the gradient as it is.
  return bias.defined() ? partial + bias : partial;
}

std::string RowParallelLinear::extra_repr() const {
  return fmt::format("in_features={} ({} on each of {} ranks), out_features={}, bias={}, input_is_parallel={}, "
                     "sequence_parallel={}", in_features_, in_features_ / comm_->size(), comm_->size(), out_features_,
                     bias.defined() ? "True" : "False", options_.input_is_parallel ? "True" : "False",
                     options_.sequence_parallel ? "True" : "False");
}

// ---- ParallelMLP ----

ParallelMLP::ParallelMLP(int64_t n_embd, int64_t hidden, std::shared_ptr<Communicator> comm,
                         std::string gelu_approximate, bool sequence_parallel, double dropout)
    : fc(n_embd, hidden, comm, {.sequence_parallel = sequence_parallel}),
      proj(hidden, n_embd, comm, {.sequence_parallel = sequence_parallel}),
      gelu_approximate_(std::move(gelu_approximate)),
      dropout_(dropout),
      sequence_parallel_(sequence_parallel),
      comm_(std::move(comm)) {
  KILN_CHECK(gelu_approximate_ == "none" || gelu_approximate_ == "tanh",
             "ParallelMLP: gelu_approximate must be \"none\" or \"tanh\", not \"{}\"", gelu_approximate_);
  check_dropout(dropout, "ParallelMLP");
  register_modules({{"fc", fc}, {"proj", proj}});
}

Tensor ParallelMLP::forward(const Tensor& input) {
  return output_dropout(proj(gelu(fc(input), gelu_approximate_)), dropout_, is_training(), sequence_parallel_, *comm_);
}

Tensor ParallelMLP::forward_for_recompute(const Tensor& input) {
  if (proj.has_forward_hooks()) return forward(input);
  return output_dropout(proj.forward_graph_only(gelu(fc(input), gelu_approximate_)), dropout_, is_training(),
                        sequence_parallel_, *comm_);
}

// ---- ParallelSelfAttention ----

ParallelSelfAttention::ParallelSelfAttention(int64_t n_embd, int64_t n_head, std::shared_ptr<Communicator> comm,
                                             bool sequence_parallel, double dropout)
    : c_attn((check_comm(comm, "ParallelSelfAttention"), n_embd), 3 * n_embd, comm,
             {.bias = true, .stride = 3, .sequence_parallel = sequence_parallel}),
      c_proj(n_embd, n_embd, comm, {.sequence_parallel = sequence_parallel}),
      n_embd_(n_embd),
      n_head_(n_head),
      dropout_(dropout),
      sequence_parallel_(sequence_parallel),
      comm_(std::move(comm)) {
  KILN_CHECK(n_head >= 1 && n_embd % n_head == 0 && n_head % comm_->size() == 0,
             "ParallelSelfAttention: n_head ({}) must divide n_embd ({}) and be a multiple of the {} ranks", n_head,
             n_embd, comm_->size());
  check_dropout(dropout, "ParallelSelfAttention");
  local_heads_ = n_head_ / comm_->size();
  register_modules({{"c_attn", c_attn}, {"c_proj", c_proj}});
}

void ParallelSelfAttention::load_full(const Tensor& attn_weight, const Tensor& attn_bias, const Tensor& proj_weight,
                                      const Tensor& proj_bias) {
  c_attn.load_full(attn_weight, attn_bias);
  c_proj.load_full(proj_weight, proj_bias);
}

Tensor ParallelSelfAttention::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "ParallelSelfAttention: the input must be (B, T, {}), not {}",
             n_embd_, x.sizes().str());
  Tensor qkv = c_attn(x);  // (B, T, 3 local): this rank's heads' q, then k, then v (every position)
  const int64_t B = qkv.size(0), T = qkv.size(1), d = n_embd_ / n_head_, local = local_heads_ * d;
  auto heads = [&](int64_t i) { return qkv.narrow(2, i * local, local).reshape({B, T, local_heads_, d}).transpose(1, 2); };
  // This rank's heads of the attention of all n_head heads: with dropout, their part of its mask.
  Tensor y = scaled_dot_product_attention_part(heads(0), heads(1), heads(2), comm_->rank() * local_heads_, n_head_, {},
                                               is_training() ? dropout_ : 0.0, /*is_causal=*/true);
  // (B, T, C), summed over the ranks' heads (sequence parallel: this rank's T / p positions of it)
  return output_dropout(c_proj(y.transpose(1, 2).reshape({B, T, local})), dropout_, is_training(), sequence_parallel_,
                        *comm_);
}

std::vector<Tensor> tensor_parallel_slices(nn::Module& module) {
  std::vector<Tensor> slices;
  for (nn::Module* m : module.modules()) {
    if (auto* column = dynamic_cast<ColumnParallelLinear*>(m)) {
      slices.push_back(column->weight);
      if (column->bias.defined()) slices.push_back(column->bias);
    } else if (auto* row = dynamic_cast<RowParallelLinear*>(m)) {
      slices.push_back(row->weight);
    }
  }
  return slices;
}

autograd::KeepInput keep_partitioned(std::shared_ptr<Communicator> group, autograd::KeepInput then) {
  KILN_CHECK(group != nullptr, "keep_partitioned: the communicator is null; pass the tensor-parallel group");
  return [group, then](const Tensor& t) -> std::function<Tensor()> {
    const int64_t n = group->size();
    if (n == 1) return then ? then(t) : [t] { return t; };
    const int64_t numel = t.numel();
    const int64_t part = (numel + n - 1) / n;
    const int64_t begin = std::min(numel, group->rank() * part), end = std::min(numel, begin + part);
    Tensor mine = zeros({part}, t.options());
    if (end > begin) mine.narrow(0, 0, end - begin).copy_(t.reshape({numel}).narrow(0, begin, end - begin));
    std::function<Tensor()> back = then ? then(mine) : [mine] { return mine; };
    return [group, back = std::move(back), shape = t.shape(), numel, part, n] {
      Tensor kept = back();
      Tensor gathered = empty({n * part}, kept.options());
      group->all_gather_into_tensor(gathered, kept);
      return gathered.narrow(0, 0, numel).reshape(shape);
    };
  };
}

}  // namespace kiln::distributed

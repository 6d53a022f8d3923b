// ops/attention.cpp: scaled_dot_product_attention, as torch.nn.functional.scaled_dot_product_attention:
//
//   out = softmax(q k^T * scale + mask) v,   scale = 1 / sqrt(E) unless given
//
// Two ways to compute it, with the same result within rounding:
//   composed: matmul, masked_fill / add, softmax, dropout, matmul: every step an op with its own
//             backward, and the (..., L, S) scores and probabilities (and dropout's mask) kept for
//             backward.
//   fused:    one kernel (Backend::attention; cpu/attention.cpp, cuda/attention.cu) that walks the keys in blocks with
//             an online softmax and keeps only out and the (..., L) log-sum-exp of each score row;
//             its backward rebuilds the probabilities block by block. Memory O(L) instead of O(L S).
//             With dropout (the CPU kernel) it draws each block's mask where it needs it, forward
//             and again in backward, from the draw's (seed, offset): the elements dropout would draw
//             on the composed form's probabilities, so both forms drop the same ones.
// The fused kernel runs when fusion is on (set_fusion), there is no attn_mask, and the device has the
// kernel: the CPU for every floating dtype, with or without dropout (with dropout, where value adds
// no batch dims to query's and key's, whose one mask would serve them all); CUDA without dropout, for
// float16 and bfloat16 (on tensor cores, which covers attention under autocast) and float32 (on the
// CUDA cores) with head dims 32, 64, 96 or 128 (cuda/attention.cu).
// Under create_graph (double backward) the fused node's backward is written with ops, so it can itself
// be differentiated. This file also
// holds the process-wide fusion switch (set_fusion, KILN_FUSION; ops/ops.h), which gelu reads too.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/flops.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using autograd::TensorList;

namespace {

std::atomic<bool>& fusion_flag() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("KILN_FUSION");
    return !(env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0));
  }()};
  return flag;
}


// softmax(q k^T * scale, masked) over the last dim: the causal mask (top-left aligned: column j > row i
// is masked) and/or attn_mask (bool: true = may attend; float: added to the scores).
Tensor probabilities(const Tensor& q, const Tensor& k, const Tensor& mask, bool causal, double scale) {
  Tensor scores = matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const int64_t L = q.sizes()[q.dim() - 2], S = k.sizes()[k.dim() - 2];
    scores = scores.masked_fill(ones({L, S}, TensorOptions().dtype(kBool).device(q.device())).triu(1), -INFINITY);
  }
  if (mask.defined()) {
    scores = mask.dtype() == kBool ? scores.masked_fill(mask.logical_not(), -INFINITY) : scores + mask;
  }
  return softmax(scores, -1);
}

// Which heads the batch's last dim (dim -3 of query) holds: [first, first + its size) of `whole`
// (scaled_dot_product_attention_part), or all of them (whole = 0).
struct HeadsPart {
  int64_t first = 0, whole = 0;
};

// The composed form, differentiable op by op.
Tensor attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double dropout_p,
                          bool causal, double scale, Generator* gen, HeadsPart part) {
  Tensor p = probabilities(q, k, mask, causal, scale);
  if (dropout_p > 0) {
    p = part.whole > 0 ? dropout_part(p, dropout_p, true, -3, part.first, part.whole, gen)
                       : dropout(p, dropout_p, true, gen);
  }
  return matmul(p, v);
}

// The fused kernel's dropout mask values for (B, H, L, S) probabilities (1 / (1 - p) or 0), as a
// tensor: the elements dropout_part draws on ones from the kernel's (seed, offset).
Tensor mask_values(const Shape& shape, const AttentionArgs& args, DType dtype, Device device) {
  if (shape.numel() == 0) return empty_tensor(shape, dtype, device);
  Generator replay;
  replay.set_state({args.seed, args.offset});
  const int64_t L = shape[2], S = shape[3];
  Tensor all_kept = ones({shape.numel() / (args.heads * L * S), args.heads, L, S},
                         TensorOptions().dtype(dtype).device(device));
  return dropout_part(all_kept, args.dropout, true, 1, args.first_head, args.whole_heads, &replay).reshape(shape);
}

// The gradients of the fused node, written with ops (for create_graph): the probabilities again from
// the inputs (and dropout's mask values z, if defined), then the softmax's backward.
TensorList attention_backward_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                       bool causal, double scale, const Tensor& z) {
  Tensor p = probabilities(q, k, {}, causal, scale);
  Tensor dp = matmul(g, v.transpose(-2, -1));
  if (z.defined()) dp = dp * z;
  Tensor ds = p * (dp - (dp * p).sum({-1}, true)) * scale;
  Tensor kept = z.defined() ? p * z : p;
  return {matmul(ds, k), matmul(ds.transpose(-2, -1), q), matmul(kept.transpose(-2, -1), g)};
}

// Note [attention layout]
// The kernels take (B, H, rows, cols) views with any strides on the first three dims and stride 1 on
// the last (core/backend.h), so the heads of a (B, T, 3 C) projection, split by view and transpose as
// nn::CausalSelfAttention does, are read where they lie: no copy of q, k or v. The output and the
// gradients are written in their input's order of dims: when q's heads are interleaved along its rows
// (stride of H below that of L, as in (B, T, H, E) memory), out is allocated as (B, L, H, Ev) memory
// and returned as its (B, H, L, Ev) view, so that transposing the heads back into (B, L, H * Ev) for
// the output projection is a view too. PyTorch's flash attention does the same. (Not for float16
// inputs on the CPU: its kernel takes float32 copies of them, and the result is converted back into a
// new contiguous tensor. bfloat16 it reads as it is: Note [bfloat16 attention] in cpu/attention.cpp.)
// A view is copied only when a kernel cannot read it: its last dim is not contiguous, its rows overlap
// (stride below the row length), or, for CUDA's 16-bit kernels (16-byte vector loads), its rows do
// not start on 16-byte boundaries.

// Whether the kernels can read t (B, H, rows, cols) where it lies (Note [attention layout]).
bool kernel_can_read(const Tensor& t) {
  const auto& n = t.sizes();
  const auto& st = t.strides();
  if (n[3] > 1 && st[3] != 1) return false;
  if (n[2] > 1 && st[2] < n[3]) return false;
  if (t.device().is_cpu() || !is_reduced_float(t.dtype())) return true;
  const int64_t align = 16 / t.element_size();  // elements per 16 bytes
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (n[d] > 1 && st[d] % align != 0) return false;
  return true;
}

// t itself, or a contiguous copy where the kernels cannot read it.
Tensor readable(const Tensor& t) { return kernel_can_read(t) ? t : t.contiguous(); }

// An empty (B, H, rows, cols) tensor whose memory follows like's order of the H and rows dims
// (Note [attention layout]).
Tensor empty_in_order_of(const Tensor& like, int64_t cols, DType dtype) {
  const auto& n = like.sizes();
  if (like.strides()[1] < like.strides()[2] && n[1] > 1 && n[2] > 1)
    return empty_tensor({n[0], n[2], n[1], cols}, dtype, like.device()).transpose(1, 2);
  return empty_tensor({n[0], n[1], n[2], cols}, dtype, like.device());
}

// The fused form on (B, H, L, E), (B, H, S, E), (B, H, S, Ev) tensors of one floating dtype.
Tensor attention_fused(const Tensor& q4, const Tensor& k4, const Tensor& v4, const AttentionArgs& args) {
  const DType dtype = q4.dtype();
  // The CPU kernel takes float32, float64 and bfloat16 (Note [bfloat16 attention] in
  // cpu/attention.cpp), so float16 goes through float32 there; the CUDA kernel takes the 16-bit
  // tensors themselves (tensor cores, float32 accumulation). lse is float32 whenever the inputs are
  // 16-bit.
  const DType compute = dtype == kFloat16 && q4.device().is_cpu() ? kFloat32 : dtype;
  const DType lse_dtype = is_reduced_float(dtype) ? kFloat32 : dtype;
  Tensor q = readable(q4.to(compute)), k = readable(k4.to(compute)), v = readable(v4.to(compute));
  const int64_t B = q.sizes()[0], H = q.sizes()[1], L = q.sizes()[2], Ev = v.sizes()[3];
  Tensor out = empty_in_order_of(q, Ev, compute);
  Tensor lse = empty_tensor({B, H, L}, lse_dtype, q.device());
  if (out.numel() > 0) {
    backend_for(q.device()).attention(view_of(q), view_of(k), view_of(v), view_of(out), view_of(lse), args,
                                      stream_for(q.device()));
  }
  Tensor result = out.to(dtype);
  if (should_record(std::vector<Tensor>{q4, k4, v4})) {
    record("ScaledDotProductAttentionBackward", {q4, k4, v4}, {result},
           [q = SavedTensor(q, false), k = SavedTensor(k, false), v = SavedTensor(v, false),
            out = SavedTensor(out.detach(), false), lse = SavedTensor(lse, false), args, dtype, compute](const Grads& g) -> TensorList {
             const char* name = "ScaledDotProductAttentionBackward";
             Tensor qs = q.unpack(name), ks = k.unpack(name), vs = v.unpack(name);
             Tensor go = g[0].to(compute);
             TensorList grads;
             if (GradMode::is_enabled()) {
               // Written with ops (create_graph); on the CPU a bfloat16 input's in float32, as its
               // kernel computes (the casts are recorded too).
               const DType ops_dtype = is_reduced_float(compute) && qs.device().is_cpu() ? kFloat32 : compute;
               Tensor z;
               if (args.dropout > 0) {
                 z = mask_values({qs.size(0), qs.size(1), qs.size(2), ks.size(2)}, args, ops_dtype, qs.device());
               }
               grads = attention_backward_composed(qs.to(ops_dtype), ks.to(ops_dtype), vs.to(ops_dtype), go.to(ops_dtype),
                                                   args.causal, args.scale, z);
             } else {
               go = readable(go);
               Tensor gq = empty_in_order_of(qs, qs.sizes()[3], compute);
               Tensor gk = empty_in_order_of(ks, ks.sizes()[3], compute);
               Tensor gv = empty_in_order_of(vs, vs.sizes()[3], compute);
               const Tensor saved_out = out.unpack(name);
               if (saved_out.numel() == 0) {  // no output, no gradient: the forward left lse unwritten, and
                 gq.zero_();                  // an empty key's other dims may hold 2^62 rows to visit
                 gk.zero_();
                 gv.zero_();
               } else {
                 backend_for(qs.device())
                     .attention_backward(view_of(qs), view_of(ks), view_of(vs), view_of(saved_out),
                                         view_of(lse.unpack(name)), view_of(go), view_of(gq), view_of(gk), view_of(gv),
                                         args, stream_for(qs.device()));
               }
               grads = {gq, gk, gv};
             }
             for (auto& t : grads) t = t.to(dtype);
             return grads;
           });
  }
  return result;
}

Shape batch_of(const Tensor& t) { return Shape(std::span<const int64_t>(t.sizes().data(), t.dim() - 2)); }

}  // namespace

void set_fusion(bool enabled) { fusion_flag().store(enabled); }
bool fusion_enabled() { return fusion_flag().load(std::memory_order_relaxed); }

namespace {

// scaled_dot_product_attention, of all the heads or of a part of them.
Tensor attention(const char* op, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask,
                 double dropout_p, bool is_causal, std::optional<double> scale, Generator* gen, HeadsPart part) {
  if (autocast::is_enabled(query.device().type)) {  // lower precision under autocast (ops/autocast.h)
    if (autocast::OpScope ac{autocast::Op::ScaledDotProductAttention, query.device()}) {
      return attention(op, ac.cast(query), ac.cast(key), ac.cast(value), ac.cast(attn_mask), dropout_p, is_causal,
                       scale, gen, part);
    }
  }
  KILN_CHECK(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2,
             "{}: query, key and value need at least 2 dims (..., L, E), got shapes {}, {} and {}", op,
             query.sizes().str(), key.sizes().str(), value.sizes().str());
  KILN_CHECK(is_floating(query.dtype()) && query.dtype() == key.dtype() && query.dtype() == value.dtype(),
             "{}: query, key and value must have one floating dtype, got {}, {} and {}", op,
             dtype_name(query.dtype()), dtype_name(key.dtype()), dtype_name(value.dtype()));
  check_same_device(op, query, key);
  check_same_device(op, query, value);
  const int64_t L = query.sizes()[query.dim() - 2], E = query.sizes()[query.dim() - 1];
  const int64_t S = key.sizes()[key.dim() - 2];
  KILN_CHECK(key.sizes()[key.dim() - 1] == E,
             "{}: the last dim of key ({}) must equal the last dim of query ({}); shapes {} and {}", op,
             key.sizes()[key.dim() - 1], E, key.sizes().str(), query.sizes().str());
  KILN_CHECK(value.sizes()[value.dim() - 2] == S,
             "{}: value must have as many rows as key (dim -2: {} vs {}); shapes {} and {}", op,
             value.sizes()[value.dim() - 2], S, value.sizes().str(), key.sizes().str());
  KILN_CHECK(dropout_p >= 0 && dropout_p < 1, "{}: dropout_p must be in [0, 1), got {}", op, dropout_p);
  KILN_CHECK(!(is_causal && attn_mask.defined()),
             "{}: give attn_mask or is_causal = true, not both (fold the causal mask into attn_mask)", op);
  Shape batch = broadcast_shapes(broadcast_shapes(batch_of(query), batch_of(key), op), batch_of(value), op);
  // Q Kᵀ and the product with V per head, and the softmax over the scores.
  // Counted only with elements: an empty input's other sizes may multiply past 2^63.
  const bool empty = query.numel() == 0 || key.numel() == 0 || value.numel() == 0;
  flops::Op count(empty ? 0 : batch.numel() * L * S * (E + value.sizes()[value.dim() - 1]),
                  empty ? 0 : batch.numel() * L * S);
  if (attn_mask.defined()) {
    check_same_device(op, query, attn_mask);
    KILN_CHECK(attn_mask.dtype() == kBool || attn_mask.dtype() == query.dtype(),
               "{}: attn_mask must be bool (true = may attend) or of the query's dtype {} (added to the "
               "scores), got {}",
               op, dtype_name(query.dtype()), dtype_name(attn_mask.dtype()));
    Shape scores_shape = batch;
    scores_shape.push_back(L);
    scores_shape.push_back(S);
    bool fits = attn_mask.dim() <= static_cast<int>(scores_shape.size());
    for (int i = 1; fits && i <= attn_mask.dim(); ++i) {
      const int64_t m = attn_mask.sizes()[attn_mask.dim() - i], want = scores_shape[scores_shape.size() - i];
      fits = m == want || m == 1;
    }
    KILN_CHECK(fits, "{}: attn_mask of shape {} must broadcast to the scores' shape {} (..., L, S)", op,
               attn_mask.sizes().str(), scores_shape.str());
  }
  // The batch dims of the probabilities, on which dropout draws its mask: query's and key's (and
  // attn_mask's) broadcast; value's batch dims may add more, which reuse the same mask.
  Shape probs_batch = broadcast_shapes(batch_of(query), batch_of(key), op);
  if (attn_mask.defined() && attn_mask.dim() > 2) probs_batch = broadcast_shapes(probs_batch, batch_of(attn_mask), op);
  const int64_t heads = probs_batch.empty() ? 1 : probs_batch.back();
  if (part.whole > 0) {
    KILN_CHECK(!probs_batch.empty(),
               "{}: needs the heads as a batch dim of query or key (dim -3), got shapes {}, {} and {}", op,
               query.sizes().str(), key.sizes().str(), value.sizes().str());
    KILN_CHECK(heads <= part.whole, "{}: {} heads are more than whole_heads = {}", op, heads, part.whole);
    KILN_CHECK(part.first >= 0 && part.first + heads <= part.whole,
               "{}: heads [{}, {}) do not fit {} heads in all; first_head must be in [0, {}]", op, part.first,
               part.first + heads, part.whole, part.whole - heads);
  }
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(E));

  // The CUDA kernels (cuda/attention.cu) take float16, bfloat16 and float32 with one head dim of 32,
  // 64, 96 or 128 for query, key and value; other CUDA cases (float64 among them) compose.
  const int64_t Ev = value.sizes()[value.dim() - 1];
  const bool cuda_dtype = is_reduced_float(query.dtype()) || query.dtype() == kFloat32;
  const bool kernel = query.device().is_cpu() ||
                      (cuda_dtype && Ev == E && E > 0 && E % 32 == 0 && E <= 128 && L > 0 && S > 0);
  // The kernel draws one mask per (batch, head) slice of the output, so with dropout it runs only
  // where value adds no batch dims to the probabilities'.
  const bool fused = fusion_enabled() && !attn_mask.defined() &&
                     (dropout_p == 0 || (query.device().is_cpu() && probs_batch == batch)) && kernel;
  if (!fused) return attention_composed(query, key, value, attn_mask, dropout_p, is_causal, s, gen, part);
  AttentionArgs args{.scale = s, .causal = is_causal};
  if (dropout_p > 0) {  // the counters dropout (or dropout_part) would reserve on the probabilities
    int64_t outer = 1;  // the batch dims before the heads
    for (int d = 0; d + 1 < probs_batch.size(); ++d) outer *= probs_batch[d];
    const int64_t whole = part.whole > 0 ? part.whole : heads;
    const Generator::State state = (gen ? *gen : default_generator()).reserve(outer * whole * L * S);
    args.dropout = dropout_p;
    args.seed = state.seed;
    args.offset = state.offset;
    args.heads = heads;
    args.first_head = part.first;
    args.whole_heads = whole;
  }

  // The kernels' (B, H, rows, cols) layout: batch dims broadcast, then as two dims without a copy
  // (Note [attention layout]) where there are at most two; more are flattened into H.
  auto four_d = [&](const Tensor& t) {
    Shape full = batch;
    full.push_back(t.sizes()[t.dim() - 2]);
    full.push_back(t.sizes()[t.dim() - 1]);
    Tensor e = t.expand(full);
    switch (batch.size()) {
      case 0: return e.unsqueeze(0).unsqueeze(0);
      case 1: return e.unsqueeze(0);
      case 2: return e;
      default: return e.reshape({1, batch.numel(), full[full.size() - 2], full[full.size() - 1]});
    }
  };
  Tensor out = attention_fused(four_d(query), four_d(key), four_d(value), args);
  Shape out_shape = batch;
  out_shape.push_back(L);
  out_shape.push_back(value.sizes()[value.dim() - 1]);
  return out.reshape(out_shape);
}

}  // namespace

inline namespace ops {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  return attention("scaled_dot_product_attention", query, key, value, attn_mask, dropout_p, is_causal, scale, gen,
                   {});
}

Tensor scaled_dot_product_attention_part(const Tensor& query, const Tensor& key, const Tensor& value,
                                         int64_t first_head, int64_t whole_heads, const Tensor& attn_mask,
                                         double dropout_p, bool is_causal, std::optional<double> scale,
                                         Generator* gen) {
  const char* op = "scaled_dot_product_attention_part";
  KILN_CHECK(whole_heads > 0, "{}: whole_heads must be positive, got {}", op, whole_heads);
  return attention(op, query, key, value, attn_mask, dropout_p, is_causal, scale, gen, {first_head, whole_heads});
}

}  // namespace ops
}  // namespace kiln

// ops/attention.cpp: scaled_dot_product_attention, as torch.nn.functional.scaled_dot_product_attention:
//
//   out = softmax(q k^T * scale + mask) v,   scale = 1 / sqrt(E) unless given
//
// Two ways to compute it, with the same result within rounding:
//   composed: matmul, masked_fill / add, softmax, dropout, matmul: every step an op with its own
//             backward, and the (..., L, S) scores and probabilities kept for backward.
//   fused:    one kernel (Backend::attention; cpu/attention.cpp, cuda/attention.cu) that walks the keys in blocks with
//             an online softmax and keeps only out and the (..., L) log-sum-exp of each score row;
//             its backward rebuilds the probabilities block by block. Memory O(L) instead of O(L S).
// The fused kernel runs when fusion is on (set_fusion), there is no attn_mask, no dropout, and the
// device has the kernel: the CPU for every floating dtype; CUDA for float16 and bfloat16 (on tensor
// cores, which covers attention under autocast) and float32 (on the CUDA cores) with head dims 32, 64,
// 96 or 128 (cuda/attention.cu).
// Under create_graph (double backward) the fused node's backward is written with ops, so it can itself
// be differentiated. This file also
// holds the process-wide fusion switch (set_fusion, KILN_FUSION; ops/ops.h), which gelu reads too.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ops/autocast.h"
#include "ops/dispatch.h"
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

// The composed form, differentiable op by op.
Tensor attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double dropout_p,
                          bool causal, double scale, Generator* gen) {
  Tensor p = probabilities(q, k, mask, causal, scale);
  if (dropout_p > 0) p = dropout(p, dropout_p, true, gen);
  return matmul(p, v);
}

// The gradients of the fused node, written with ops (for create_graph): the probabilities again from
// the inputs, then the softmax's backward.
TensorList attention_backward_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                       bool causal, double scale) {
  Tensor p = probabilities(q, k, {}, causal, scale);
  Tensor dp = matmul(g, v.transpose(-2, -1));
  Tensor ds = p * (dp - (dp * p).sum({-1}, true)) * scale;
  return {matmul(ds, k), matmul(ds.transpose(-2, -1), q), matmul(p.transpose(-2, -1), g)};
}

// The fused form on (B, L, E), (B, S, E), (B, S, Ev) tensors of one floating dtype.
Tensor attention_fused(const Tensor& q3, const Tensor& k3, const Tensor& v3, const AttentionArgs& args) {
  const DType dtype = q3.dtype();
  // The CPU kernel computes in float32 or float64, so 16-bit inputs go through float32 there; the CUDA
  // kernel takes the 16-bit tensors themselves (tensor cores, float32 accumulation). lse is float32
  // whenever the inputs are 16-bit.
  const DType compute = is_reduced_float(dtype) && q3.device().is_cpu() ? kFloat32 : dtype;
  const DType lse_dtype = is_reduced_float(dtype) ? kFloat32 : dtype;
  Tensor q = q3.to(compute).contiguous(), k = k3.to(compute).contiguous(), v = v3.to(compute).contiguous();
  const int64_t B = q.sizes()[0], L = q.sizes()[1], Ev = v.sizes()[2];
  Tensor out = empty_tensor({B, L, Ev}, compute, q.device());
  Tensor lse = empty_tensor({B, L}, lse_dtype, q.device());
  if (out.numel() > 0) {
    backend_for(q.device()).attention(view_of(q), view_of(k), view_of(v), view_of(out), view_of(lse), args,
                                      stream_for(q.device()));
  }
  Tensor result = out.to(dtype);
  if (should_record(std::vector<Tensor>{q3, k3, v3})) {
    record("ScaledDotProductAttentionBackward", {q3, k3, v3}, {result},
           [q = SavedTensor(q, false), k = SavedTensor(k, false), v = SavedTensor(v, false),
            out = SavedTensor(out.detach(), false), lse = SavedTensor(lse, false), args, dtype, compute](const Grads& g) -> TensorList {
             const char* name = "ScaledDotProductAttentionBackward";
             Tensor qs = q.unpack(name), ks = k.unpack(name), vs = v.unpack(name);
             Tensor go = g[0].to(compute);
             TensorList grads;
             if (GradMode::is_enabled()) {
               grads = attention_backward_composed(qs, ks, vs, go, args.causal, args.scale);
             } else {
               go = go.contiguous();
               Tensor gq = empty_tensor(qs.sizes(), compute, qs.device());
               Tensor gk = empty_tensor(ks.sizes(), compute, ks.device());
               Tensor gv = empty_tensor(vs.sizes(), compute, vs.device());
               backend_for(qs.device())
                   .attention_backward(view_of(qs), view_of(ks), view_of(vs), view_of(out.unpack(name)),
                                       view_of(lse.unpack(name)), view_of(go), view_of(gq), view_of(gk), view_of(gv), args,
                                       stream_for(qs.device()));
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

inline namespace ops {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  const char* op = "scaled_dot_product_attention";
  if (autocast::is_enabled(query.device().type)) {  // lower precision under autocast (ops/autocast.h)
    if (autocast::OpScope ac{autocast::Op::ScaledDotProductAttention, query.device()}) {
      return scaled_dot_product_attention(ac.cast(query), ac.cast(key), ac.cast(value), ac.cast(attn_mask),
                                          dropout_p, is_causal, scale, gen);
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
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(E));

  // The CUDA kernels (cuda/attention.cu) take float16, bfloat16 and float32 with one head dim of 32,
  // 64, 96 or 128 for query, key and value; other CUDA cases (float64 among them) compose.
  const int64_t Ev = value.sizes()[value.dim() - 1];
  const bool cuda_dtype = is_reduced_float(query.dtype()) || query.dtype() == kFloat32;
  const bool kernel = query.device().is_cpu() ||
                      (cuda_dtype && Ev == E && E > 0 && E % 32 == 0 && E <= 128 && L > 0 && S > 0);
  const bool fused = fusion_enabled() && !attn_mask.defined() && dropout_p == 0 && kernel;
  if (!fused) return attention_composed(query, key, value, attn_mask, dropout_p, is_causal, s, gen);

  // The kernel's (B, L, E) layout: batch dims broadcast and flattened.
  auto flat = [&](const Tensor& t) {
    Shape full = batch;
    full.push_back(t.sizes()[t.dim() - 2]);
    full.push_back(t.sizes()[t.dim() - 1]);
    return t.expand(full).reshape({batch.numel(), full[full.size() - 2], full[full.size() - 1]});
  };
  Tensor out = attention_fused(flat(query), flat(key), flat(value), {.scale = s, .causal = is_causal});
  Shape out_shape = batch;
  out_shape.push_back(L);
  out_shape.push_back(value.sizes()[value.dim() - 1]);
  return out.reshape(out_shape);
}

}  // namespace ops
}  // namespace kiln

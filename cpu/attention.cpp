// cpu/attention.cpp: scaled dot-product attention, forward and backward, in blocks, the way flash
// attention does it: the (L, S) matrix of scores is never held whole. For each block of kBlock query
// rows the keys are visited kBlock at a time, and a running ("online") softmax folds each block in:
//
//   per query row i:  m = running max of the scores seen, l = running sum of exp(score - m),
//                     o = running sum of exp(score - m) * v_j
//   a new block of scores s_j:  m' = max(m, max_j s_j);  c = exp(m - m')
//                     l = c * l + sum_j exp(s_j - m');   o = c * o + sum_j exp(s_j - m') v_j
//   at the end:       out_i = o / l,   lse_i = m + log(l)
//
// so a block needs kBlock x kBlock scores of scratch (16 KiB in float32), however long L and S are.
// Causal attention skips the key blocks that lie wholly above the diagonal.
//
// The backward rebuilds each block of probabilities from lse (p = exp(s - lse)) instead of storing
// them, and with D_i = sum_e dout[i][e] * out[i][e] (= sum_j p_ij dp_ij):
//   dv_j += p^T dout_i;   dp = dout_i v_j^T;   ds = p * (dp - D_i) * scale;
//   dq_i += ds k_j;       dk_j += ds^T q_i
//
// With dropout (AttentionArgs::dropout), each probability is kept, times 1 / (1 - dropout), or dropped,
// as its element of the mask's Philox draw says (AttentionArgs::mask_index): the forward folds the
// kept probabilities into o but every one into l, so out = (dropped p) v with p the softmax; the
// backward draws the same elements again (a counter-based draw is a function of the index: nothing
// is stored) and, with Z the block's mask values,
//   dv_j += (p Z)^T dout_i;   dp = (dout_i v_j^T) Z;   ds = p * (dp - D_i) * scale
// where D_i = sum_e dout[i][e] * out[i][e] still equals sum_j p_ij dp_ij.
// Each of the B x H (batch, head) slices is one task for the pool of cpu/parallel.h (the forward
// splits further, by query block, since its blocks are independent); the products are gemm() of
// matmul.cpp (for bfloat16, the Note below), which reads the operands' rows at their own strides
// (core/backend.h: a head of a (B, T, 3 C) projection is read where it lies).
//
// Note [bfloat16 attention]: bfloat16 q, k and v (autocast's attention) are read as they are, with
// every score, probability, running sum and gradient in float32, as the CUDA kernel does: the block
// products take bfloat16 operands and give float32 sums, so the probabilities p (and ds in the
// backward) are rounded to bfloat16 for the products that take them as an operand; out and the
// gradients are rounded once, at the end (the gradients are summed over the query blocks in float32
// scratch first). Where a bfloat16 matmul takes bf16gemm.cpp's AMX or AVX512-BF16 kernel (Note
// [which bfloat16 GEMM] in matmul.cpp), so do these products (bf16gemm_amx_f32,
// bf16gemm_avx512_f32); elsewhere they take float32 copies of the two operand blocks into
// gemm<float>. Either way the autograd graph keeps the bfloat16 inputs, half the memory of float32
// copies.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "cpu/bf16_products.h"
#include "cpu/exact_math.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kBlock = 64;

template <typename T>
using Row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

// Block scratch is a ScratchBuffer (cpu/kernels.h), 64-byte aligned as Eigen's vector loops need.
// Those start at the first aligned element and do the ones before it (and the tail) in scalar code,
// whose exp can differ from the vector exp in the last bit, and whose sum adds in another order. On
// a plain heap buffer that split would follow the buffer's address, and so would the results;
// aligned, it follows the row's offset alone.

// How many of the block's `cols` key columns (from k0) query row q0 + r may see: all of them, or with
// causal those up to its own position. The columns past that are zeroed in the block, never exp'd.
int64_t visible(int64_t r, int64_t cols, int64_t q0, int64_t k0, bool causal) {
  if (!causal) return cols;
  return std::clamp<int64_t>(q0 + r - k0 + 1, 0, cols);
}

// Writes z[0, n), the dropout mask values of elements [first, first + n) of the mask's draw: 1 /
// (1 - dropout) where the Bernoulli(1 - dropout) element is 1, 0 where it is 0 (core/philox.h's
// bernoulli_word, with the threshold computed once). Element e takes
// word 0 or 2 of counter offset + e / 2 (Note [random element mapping]); the words come from 8
// counters at a time, and the loops have no branch that depends on the draw.
template <typename T>
void mask_values(T* z, int64_t n, uint64_t first, const AttentionArgs& args) {
  const double keep = 1 - args.dropout;
  const T kept = static_cast<T>(1 / keep);
  const uint32_t threshold = bernoulli_threshold(keep);
  const uint64_t c0 = first / 2, skip = first % 2;  // element first is element skip of counter c0
  T all[kBlock + 16];
  uint32_t w[4][8];
  for (int64_t base = 0; base < static_cast<int64_t>(skip) + n; base += 16) {
    Philox4x32::words8(args.seed, args.offset + c0 + static_cast<uint64_t>(base / 2), w);
    for (int c = 0; c < 8; ++c) {
      all[base + 2 * c] = (w[0][c] >> 8) < threshold ? kept : T(0);
      all[base + 2 * c + 1] = (w[2][c] >> 8) < threshold ? kept : T(0);
    }
  }
  std::copy(all + skip, all + skip + n, z);
}

template <typename T>
void attention_typed(const View& qv, const View& kv, const View& vv, const View& ov, const View& lsev,
                     const AttentionArgs& args) {
  using F = typename ComputeOf<T>::type;
  constexpr bool kNarrow = !std::is_same_v<T, F>;  // p rounded to T for the second product
  const bool own_bf16 = own_bf16_products<T>();
  const int64_t B = qv.sizes[0] * qv.sizes[1], L = qv.sizes[2], E = qv.sizes[3], S = kv.sizes[2], Ev = vv.sizes[3];
  const auto q = attention_heads<const T>(qv), k = attention_heads<const T>(kv), v = attention_heads<const T>(vv);
  const auto out = attention_heads<T>(ov);
  F* lse = lsev.ptr<F>();
  const F scale = static_cast<F>(args.scale);
  const int64_t q_blocks = (L + kBlock - 1) / kBlock;
  parallel_for(0, B * q_blocks, 1, [&](int64_t t0, int64_t t1) {
    ScratchBuffer<F> scores(kBlock * kBlock), acc(kBlock * Ev), z(args.dropout > 0 ? kBlock : 0);
    ScratchBuffer<T> p(kNarrow ? kBlock * kBlock : 0);
    std::vector<F> m(kBlock), l(kBlock);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / q_blocks, q0 = (t % q_blocks) * kBlock, rows = std::min(kBlock, L - q0);
      const T* qb = q.slice(b) + q0 * q.ld;
      const T *kb = k.slice(b), *vb = v.slice(b);
      std::fill(acc.data(), acc.data() + rows * Ev, F(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<F>::infinity());
      std::fill(l.begin(), l.end(), F(0));
      const int64_t k_end = args.causal ? std::min(S, q0 + rows) : S;
      for (int64_t k0 = 0; k0 < k_end; k0 += kBlock) {
        const int64_t cols = std::min(kBlock, S - k0);
        mixed_gemm(own_bf16, false, true, rows, cols, E, qb, q.ld, kb + k0 * k.ld, k.ld, false, scores.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = visible(r, cols, q0, k0, args.causal);
          Row<F> s(scores.data() + r * cols, cols);
          if (n == 0) {
            s.setZero();  // this row sees none of the block: it adds nothing
            continue;
          }
          s.head(n) *= scale;
          const F m_new = std::max(m[r], s.head(n).maxCoeff());
          const F c = std::exp(m[r] - m_new);  // 0 on the row's first block (m = -inf)
          s.head(n) = exact_exp(s.head(n) - m_new);
          s.tail(cols - n).setZero();
          l[r] = c * l[r] + s.head(n).sum();
          m[r] = m_new;
          if (args.dropout > 0) {
            mask_values(z.data(), n, args.mask_index(b, q0 + r, k0, L, S), args);
            s.head(n) *= Row<F>(z.data(), n);
          }
          if (c != F(1)) Row<F>(acc.data() + r * Ev, Ev) *= c;
        }
        const T* pb = as_operand(scores.data(), p.data(), rows * cols, own_bf16);
        mixed_gemm(own_bf16, false, false, rows, Ev, cols, pb, cols, vb + k0 * v.ld, v.ld, true, acc.data(), Ev);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* o = out.slice(b) + (q0 + r) * out.ld;
        const F inv = l[r] > 0 ? F(1) / l[r] : F(0);  // a row that saw no key (S = 0) is zero
        F* a = acc.data() + r * Ev;
        Row<F>(a, Ev) *= inv;
        narrow(a, o, Ev, own_bf16);
        lse[b * L + q0 + r] = m[r] + std::log(l[r]);
      }
    }
  });
}

template <typename T>
void attention_backward_typed(const View& qv, const View& kv, const View& vv, const View& ov, const View& lsev,
                              const View& gov, const View& gqv, const View& gkv, const View& gvv,
                              const AttentionArgs& args) {
  using F = typename ComputeOf<T>::type;
  constexpr bool kNarrow = !std::is_same_v<T, F>;  // p and ds rounded to T, gradients summed in F scratch
  const bool own_bf16 = own_bf16_products<T>();
  const int64_t B = qv.sizes[0] * qv.sizes[1], L = qv.sizes[2], E = qv.sizes[3], S = kv.sizes[2], Ev = vv.sizes[3];
  const auto q = attention_heads<const T>(qv), k = attention_heads<const T>(kv), v = attention_heads<const T>(vv);
  const auto out = attention_heads<const T>(ov), gout = attention_heads<const T>(gov);
  const auto gq = attention_heads<T>(gqv), gk = attention_heads<T>(gkv), gv = attention_heads<T>(gvv);
  const F* lse = lsev.ptr<F>();
  const F scale = static_cast<F>(args.scale);
  // Rows [0, rows) of a slice, each `cols` long, set to zero.
  auto clear = [](F* m, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t i = 0; i < rows; ++i) std::fill(m + i * ld, m + i * ld + cols, F(0));
  };
  const bool dropping = args.dropout > 0;
  parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    // With dropout, z holds the block's mask values and pd = p z the kept probabilities. For bfloat16,
    // p16 and ds16 are the rounded operands, and sq, sk, sv the slice's gradients in float32.
    ScratchBuffer<F> p(kBlock * kBlock), dp(kBlock * kBlock), z(dropping ? kBlock * kBlock : 0),
        pd(dropping ? kBlock * kBlock : 0);
    ScratchBuffer<T> p16(kNarrow ? kBlock * kBlock : 0), ds16(kNarrow ? kBlock * kBlock : 0);
    ScratchBuffer<F> sq(kNarrow ? L * E : 0), sk(kNarrow ? S * E : 0), sv(kNarrow ? S * Ev : 0);
    std::vector<F> D(L);
    for (int64_t b = b0; b < b1; ++b) {
      const T *qb = q.slice(b), *kb = k.slice(b), *vb = v.slice(b), *ob = out.slice(b), *gob = gout.slice(b);
      F *gqb, *gkb, *gvb;  // where the gradients are summed, rows ld_q, ld_k, ld_v apart
      int64_t ld_q, ld_k, ld_v;
      if constexpr (kNarrow) {
        gqb = sq.data(), gkb = sk.data(), gvb = sv.data();
        ld_q = E, ld_k = E, ld_v = Ev;
      } else {
        gqb = gq.slice(b), gkb = gk.slice(b), gvb = gv.slice(b);
        ld_q = gq.ld, ld_k = gk.ld, ld_v = gv.ld;
      }
      clear(gqb, L, E, ld_q);
      clear(gkb, S, E, ld_k);
      clear(gvb, S, Ev, ld_v);
      for (int64_t i = 0; i < L; ++i) {
        F d = 0;
        for (int64_t e = 0; e < Ev; ++e) d += static_cast<F>(gob[i * gout.ld + e]) * static_cast<F>(ob[i * out.ld + e]);
        D[i] = d;
      }
      for (int64_t k0 = 0; k0 < S; k0 += kBlock) {
        const int64_t cols = std::min(kBlock, S - k0);
        // Causal: query blocks that end before k0 see none of these keys.
        const int64_t q_start = args.causal ? (k0 / kBlock) * kBlock : 0;
        for (int64_t q0 = q_start; q0 < L; q0 += kBlock) {
          const int64_t rows = std::min(kBlock, L - q0);
          const T *qi = qb + q0 * q.ld, *goi = gob + q0 * gout.ld, *kj = kb + k0 * k.ld, *vj = vb + k0 * v.ld;
          mixed_gemm(own_bf16, false, true, rows, cols, E, qi, q.ld, kj, k.ld, false, p.data(), cols);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t n = visible(r, cols, q0, k0, args.causal);
            Row<F> s(p.data() + r * cols, cols);
            s.head(n) = exact_exp(s.head(n) * scale - lse[b * L + q0 + r]);
            s.tail(cols - n).setZero();
            if (dropping) {
              Row<F> zr(z.data() + r * cols, cols);
              mask_values(zr.data(), n, args.mask_index(b, q0 + r, k0, L, S), args);
              zr.tail(cols - n).setZero();
              Row<F>(pd.data() + r * cols, cols) = s * zr;
            }
          }
          const T* kept = as_operand(dropping ? pd.data() : p.data(), p16.data(), rows * cols, own_bf16);
          mixed_gemm(own_bf16, true, false, cols, Ev, rows, kept, cols, goi, gout.ld, true, gvb + k0 * ld_v, ld_v);
          mixed_gemm(own_bf16, false, true, rows, cols, Ev, goi, gout.ld, vj, v.ld, false, dp.data(), cols);
          for (int64_t r = 0; r < rows; ++r) {
            Row<F> ds(dp.data() + r * cols, cols);
            if (dropping) ds *= Row<F>(z.data() + r * cols, cols);
            ds = Row<F>(p.data() + r * cols, cols) * (ds - D[q0 + r]) * scale;
          }
          const T* ds_op = as_operand(dp.data(), ds16.data(), rows * cols, own_bf16);
          mixed_gemm(own_bf16, false, false, rows, E, cols, ds_op, cols, kj, k.ld, true, gqb + q0 * ld_q, ld_q);
          mixed_gemm(own_bf16, true, false, cols, E, rows, ds_op, cols, qi, q.ld, true, gkb + k0 * ld_k, ld_k);
        }
      }
      if constexpr (kNarrow) {  // the float32 sums, rounded once
        for (int64_t i = 0; i < L; ++i) narrow(gqb + i * ld_q, gq.slice(b) + i * gq.ld, E, own_bf16);
        for (int64_t j = 0; j < S; ++j) {
          narrow(gkb + j * ld_k, gk.slice(b) + j * gk.ld, E, own_bf16);
          narrow(gvb + j * ld_v, gv.slice(b) + j * gv.ld, Ev, own_bf16);
        }
      }
    }
  });
}

}  // namespace

void attention_kernel(const View& q, const View& k, const View& v, const View& out, const View& lse,
                      const AttentionArgs& args) {
  switch (q.dtype) {
    case DType::Float32: return attention_typed<float>(q, k, v, out, lse, args);
    case DType::Float64: return attention_typed<double>(q, k, v, out, lse, args);
    case DType::BFloat16: return attention_typed<BFloat16>(q, k, v, out, lse, args);
    default:
      KILN_FAIL("scaled_dot_product_attention: the CPU kernel takes float32, float64 or bfloat16, got {}",
                dtype_name(q.dtype));
  }
}

void attention_backward_kernel(const View& q, const View& k, const View& v, const View& out, const View& lse,
                               const View& grad_out, const View& grad_q, const View& grad_k, const View& grad_v,
                               const AttentionArgs& args) {
  switch (q.dtype) {
    case DType::Float32:
      return attention_backward_typed<float>(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, args);
    case DType::Float64:
      return attention_backward_typed<double>(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, args);
    case DType::BFloat16:
      return attention_backward_typed<BFloat16>(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, args);
    default:
      KILN_FAIL("scaled_dot_product_attention backward: the CPU kernel takes float32, float64 or bfloat16, got {}",
                dtype_name(q.dtype));
  }
}

}  // namespace kiln::cpu

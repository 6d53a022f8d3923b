// cpu/kernels.h: the CPU kernels, one group per file (private to cpu/). backend.cpp binds them to
// the Backend contract of core/backend.h, whose comments say what each computes. Each file's CUDA
// counterpart has the same stem in cuda/ (copy, elementwise, reduce, matmul, index, random, conv,
// pool, norm, optim, fused, ctc, attention, sort).
#pragma once

#include <type_traits>

#include "core/allocator.h"
#include "core/backend.h"

namespace kiln::cpu {

// Uninitialised scratch memory for a kernel, from the CPU allocator: large buffers then come from its
// cache (Note [CPU block cache] in core/allocator.cpp) instead of pages mapped afresh on every call.
// 64-byte aligned, and counted in memory::stats like a tensor's buffer.
template <typename T>
class ScratchBuffer {
 public:
  explicit ScratchBuffer(size_t n)
      : n_(n), data_(n == 0 ? nullptr : static_cast<T*>(cpu_allocator().allocate(n * sizeof(T)))) {}
  ~ScratchBuffer() {
    if (data_ != nullptr) cpu_allocator().deallocate(data_, n_ * sizeof(T));
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  T* data() const { return data_; }

 private:
  size_t n_;
  T* data_;
};

void copy_kernel(const View& src, const View& dst);                          // copy.cpp
void fill_kernel(const View& out, const Scalar& value);                      // copy.cpp
void arange_kernel(const View& out, double start, double step);              // copy.cpp
void unary_kernel(UnaryOp op, const View& in, const View& out, UnaryArgs args);  // elementwise.cpp
void binary_kernel(BinaryOp op, const View& a, const View& b, const View& out,
                   double alpha);                                            // elementwise.cpp
void where_kernel(const View& cond, const View& a, const View& b, const View& out);  // elementwise.cpp
void ternary_kernel(TernaryOp op, const View& a, const View& b, const View& c, const View& out,
                    double v);  // elementwise.cpp
void reduce_kernel(ReduceKind op, const View& in, const View& out);            // reduce.cpp
void matmul_kernel(const View& a, const View& b, const View& c);             // matmul.cpp
void softmax_kernel(const View& in, const View& out, int dim, bool log);     // reduce.cpp
void softmax_backward_kernel(const View& y, const View& g, const View& out, int dim, bool log);  // reduce.cpp
void index_select_kernel(const View& in, int dim, const View& index, const View& out);  // index.cpp
void index_add_kernel(const View& out, int dim, const View& index, const View& src);
void gather_kernel(const View& in, int dim, const View& index, const View& out);
void scatter_kernel(const View& out, int dim, const View& index, const View& src, bool accumulate);
void nonzero_kernel(const View& mask, const View& out);
void random_kernel(RandomKind kind, const View& out, uint64_t seed, uint64_t offset,
                   const RandomArgs& args);                                  // random.cpp
// 2-D or (5-D views) 3-D
void conv_kernel(const View& input, const View& weight, const View& bias, const View& out,
                 const ConvArgs& args);                                    // conv.cpp
void conv_backward_input_kernel(const View& grad_out, const View& weight, const View& grad_input,
                                const ConvArgs& args);
void conv_backward_weight_kernel(const View& grad_out, const View& input, const View& grad_weight,
                                 const ConvArgs& args);
void max_pool2d_kernel(const View& in, const View& out, const View& indices,
                       const Pool2dArgs& args);                              // pool.cpp
void max_pool2d_backward_kernel(const View& grad_out, const View& indices, const View& grad_in);
void avg_pool2d_kernel(const View& in, const View& out, const Pool2dArgs& args);
void avg_pool2d_backward_kernel(const View& grad_out, const View& grad_in, const Pool2dArgs& args);
void adaptive_avg_pool2d_kernel(const View& in, const View& out);
void adaptive_avg_pool2d_backward_kernel(const View& grad_out, const View& grad_in);
void adaptive_max_pool2d_kernel(const View& in, const View& out, const View& indices);
void norm_rows_kernel(const View& in, const View& out, const View& mean, const View& rstd, double eps,
                      bool rms);                                             // norm.cpp
void adam_step_kernel(const std::vector<View>& params, const std::vector<View>& grads,
                      const std::vector<View>& exp_avgs, const std::vector<View>& exp_avg_sqs,
                      const std::vector<View>& max_exp_avg_sqs, const AdamStepArgs& args);  // optim.cpp
void sgd_step_kernel(const std::vector<View>& params, const std::vector<View>& grads,
                     const std::vector<View>& momentum_buffers, const SgdStepArgs& args);
void attention_kernel(const View& q, const View& k, const View& v, const View& out, const View& lse,
                      const AttentionArgs& args);                            // attention.cpp
void attention_backward_kernel(const View& q, const View& k, const View& v, const View& out, const View& lse,
                               const View& grad_out, const View& grad_q, const View& grad_k, const View& grad_v,
                               const AttentionArgs& args);
void layer_norm_kernel(const View& x, const View& residual, const View& weight, const View& bias,
                       const View& out, const View& sum, const View& mean, const View& rstd, double eps,
                       bool rms);                                            // fused.cpp
void layer_norm_backward_kernel(const View& grad_out, const View& grad_sum, const View& h, const View& weight,
                                const View& mean, const View& rstd, const View& grad_in,
                                const View& grad_weight, const View& grad_bias, bool rms);
void bias_gelu_kernel(const View& in, const View& bias, const View& out, bool tanh);
void bias_gelu_backward_kernel(const View& grad_out, const View& in, const View& bias, const View& grad_in,
                               const View& grad_bias, bool tanh);
void cross_entropy_kernel(const View& logits, const View& target, const View& loss, const View& lse,
                          int64_t ignore_index, double label_smoothing);
void cross_entropy_backward_kernel(const View& logits, const View& target, const View& lse,
                                   const View& grad_loss, const View& grad_logits, int64_t ignore_index,
                                   double label_smoothing);

// sort.cpp
void sort_kernel(const View& in, int dim, bool descending, const View& values, const View& indices);
void kthvalue_kernel(const View& in, int dim, int64_t k, const View& values, const View& indices);
void scan_kernel(ScanKind kind, const View& in, int dim, const View& out, const View& indices);
void searchsorted_kernel(const View& sorted, const View& values, bool right, const View& out);
// ctc.cpp
void ctc_loss_kernel(const View& log_probs, const View& targets, const View& input_lengths,
                     const View& target_lengths, const View& nll, const View& log_alpha, int64_t blank);
void ctc_loss_backward_kernel(const View& grad_nll, const View& log_probs, const View& targets,
                              const View& input_lengths, const View& target_lengths, const View& nll,
                              const View& log_alpha, const View& log_beta, const View& grad_log_probs,
                              int64_t blank);

// gelu(x) and g * gelu'(x) over contiguous runs of float or double, the elementwise ops' vectorized
// math (elementwise.cpp), so that the fused kernels round exactly as gelu does. y must not alias x.
template <typename T>
void gelu_run(const T* x, T* y, int64_t n, bool tanh);
template <typename T>
void gelu_backward_run(const T* g, const T* x, T* y, int64_t n, bool tanh);

// c = op(a) @ op(b) (+ c when accumulate) on row-major matrices, c (m, n) with leading dims
// lda/ldb/ldc; op transposes when ta/tb. float and double (matmul.cpp). The conv and attention
// kernels call it from their own parallel_for, where it runs on the calling thread (OpenBLAS runs
// single-threaded; sgemm_avx512 threads through parallel_for, serial when nested).
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, bool accumulate, T* c, int64_t ldc);
// The same, with the GEMM chosen by the caller: float32 goes to sgemm_avx512 when own_sgemm is true
// (ignored for double). For the pieces of one product split over threads: the choice, made once for
// the whole product (use_own_sgemm), then does not depend on how many pieces it was cut into.
template <typename T>
void gemm_chosen(bool own_sgemm, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                 const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc);

// float32 c = a @ b (+ c when accumulate) with AVX-512 (sgemm.cpp): a (m, k) has element (i, p) at
// a[i * a_rs + p * a_cs], b (k, n) likewise, c is row-major with leading dim ldc. Threads through
// parallel_for (serial when nested). Call only when cpu_has_avx512() (matmul.cpp) is true.
void sgemm_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                  const float* b, int64_t b_rs, int64_t b_cs, bool accumulate, float* c, int64_t ldc);
// Whether sgemm_avx512 multiplies c (m, n) = a (m, k) @ b (k, n) without packing (Note [unpacked
// products] in sgemm.cpp): a and b with contiguous rows (a_cs == b_cs == 1), and b at most 512
// columns wide with k one block of b's rows or c at most 1 MiB, or c at most 64 rows high (Note
// [short products]).
bool sgemm_avx512_unpacked(int64_t m, int64_t n, int64_t k, int64_t a_cs, int64_t b_cs);
bool cpu_has_avx512();
// bfloat16 c = a @ b with AVX512-BF16 (bf16gemm.cpp): float32 sums, each rounded once; a and b as
// for sgemm_avx512, c row-major with leading dim ldc. Threads through parallel_for (serial when
// nested). Call only when cpu_has_avx512_bf16() is true.
void bf16gemm_avx512(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                     const BFloat16* b, int64_t b_rs, int64_t b_cs, BFloat16* c, int64_t ldc);
// The same with AMX's tiles (Note [AMX] in bf16gemm.cpp). Call only when cpu_has_amx_bf16() is true.
void bf16gemm_amx(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                  const BFloat16* b, int64_t b_rs, int64_t b_cs, BFloat16* c, int64_t ldc);
// float32 c = a @ b (+ c when accumulate) for bfloat16 a and b: the same sums as bf16gemm_avx512's
// and bf16gemm_amx's, not rounded. For the block products of the attention and convolution kernels
// (bf16_products.h). Call only when the CPU has the kernel's instructions, as above.
void bf16gemm_avx512_f32(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                         const BFloat16* b, int64_t b_rs, int64_t b_cs, bool accumulate, float* c, int64_t ldc);
void bf16gemm_amx_f32(int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t a_rs, int64_t a_cs,
                      const BFloat16* b, int64_t b_rs, int64_t b_cs, bool accumulate, float* c, int64_t ldc);
// y[i] = x[i] rounded to bfloat16 as core/half.h rounds, for i < n, with AVX-512 (bf16gemm.cpp). Call
// only when cpu_has_amx_bf16() or cpu_has_avx512_bf16() is true.
void round_to_bf16_run(const float* x, BFloat16* y, int64_t n);
bool cpu_has_avx512_bf16();
// Whether the CPU has AMX-BF16 and the OS has let this process use the tiles (asked once).
bool cpu_has_amx_bf16();
// Whether the CPU's VDPBF16PS is known to do its 32 multiply-adds at the FMA's rate of 16, so that
// bf16gemm_avx512 outruns the way through float32: AMD's from Zen 4 (family 25, the first of theirs
// with AVX512-BF16) on, as measured on a Zen 4 and a Zen 5 (Note [which bfloat16 GEMM] in
// matmul.cpp). Asked once; bf16_dot_at_fma_rate(amd, eax) is the rule, from the vendor and CPUID
// leaf 1's eax (the family fields), for any CPU.
bool cpu_bf16_dot_at_fma_rate();
bool bf16_dot_at_fma_rate(bool amd, uint32_t cpuid1_eax);
// Where a bfloat16 matmul goes (matmul.cpp, Note [which bfloat16 GEMM]): through float32,
// bf16gemm_avx512 or bf16gemm_amx.
enum class Bf16Gemm { kFloat, kAvx512, kAmx };
Bf16Gemm bf16gemm_choice();
// Whether a float32 product c (m, n) = a (m, k) @ b (k, n), a's columns a_cs apart and b's b_cs,
// goes to sgemm_avx512 (matmul.cpp, Note [which float32 GEMM]): on an AVX-512 CPU where OpenBLAS is
// absent or runs an AVX2 kernel (or KILN_CPU_GEMM=own), when c is at least one tile's height and a
// third of its width (thinner products, matrix-vector ones among them, would mostly multiply the
// zero padding); where OpenBLAS runs an AVX-512 kernel, only products with m, n and k all at least
// 1024, and unpacked ones (sgemm_avx512_unpacked) with m, n and k all at least 256, or with 8 to 64
// rows, or with at least 8 rows and 16 to 64 columns.
bool use_own_sgemm(int64_t m, int64_t n, int64_t k, int64_t a_cs, int64_t b_cs);
// The choice gemm() makes for its arguments (float32 only), for gemm_chosen's callers.
template <typename T>
bool gemm_uses_own(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb) {
  return std::is_same_v<T, float> && use_own_sgemm(m, n, k, ta ? lda : 1, tb ? ldb : 1);
}

}  // namespace kiln::cpu

// cuda/kernels.h: the CUDA launchers, one group per file (private to cuda/), each file with the
// stem of its CPU sibling in cpu/ (copy, elementwise, reduce, matmul, index, random, conv, pool,
// norm, optim, fused, ctc, attention, sort). backend.cu binds them to the Backend contract of
// core/backend.h, whose comments say what each computes. Each launcher runs on the stream it is
// given, on the current device (the caller holds a DeviceGuard; copy_between sets the devices
// itself), and checks its launch with KILN_CUDA_CHECK(cudaGetLastError()).
#pragma once

#include "core/backend.h"
#include "core/error.h"

namespace kiln::cuda {

// copy.cpp: Backend::copy and copy_non_blocking, every direction (host code around copy_on_device).
void copy_between(const View& src, Device src_device, const View& dst, Device dst_device,
                  const Stream& s, bool non_blocking = false);

// copy.cu. copy_on_device: dst = src, both on the current device, any dtypes and strides
// (src already has dst's sizes).
void copy_on_device(const View& src, const View& dst, const Stream& s);
void fill_launch(const View& out, const Scalar& value, const Stream& s);
void arange_launch(const View& out, double start, double step, const Stream& s);

// random.cu
void random_launch(RandomKind kind, const View& out, uint64_t seed, uint64_t offset,
                   const RandomArgs& args, const Stream& s);

// elementwise.cu
void unary_launch(UnaryOp op, const View& in, const View& out, UnaryArgs args, const Stream& s);
void binary_launch(BinaryOp op, const View& a, const View& b, const View& out, double alpha,
                   const Stream& s);
void where_launch(const View& cond, const View& a, const View& b, const View& out,
                  const Stream& s);
void ternary_launch(TernaryOp op, const View& a, const View& b, const View& c, const View& out, double v,
                    const Stream& s);

// reduce.cu
void reduce_launch(ReduceKind op, const View& in, const View& out, const Stream& s);
void softmax_launch(const View& in, const View& out, int dim, bool log, const Stream& s);
void softmax_backward_launch(const View& y, const View& g, const View& out, int dim, bool log, const Stream& s);

// matmul.cu: c = a @ b on device `device` (cuBLAS for the floating dtypes).
void matmul_launch(const View& a, const View& b, const View& c, int device, const Stream& s);
// Backend::matmul_bias: c = a @ b + bias through cuBLASLt's bias epilogue, or false.
bool matmul_bias_launch(const View& a, const View& b, const View& bias, const View& c, int device, const Stream& s);
// Backend::matmul_bias_gelu: c = gelu_tanh(a @ b + bias), pre = a @ b + bias, through cuBLASLt's
// GELU_AUX_BIAS epilogue, or false.
bool matmul_bias_gelu_launch(const View& a, const View& b, const View& bias, const View& c, const View& pre,
                             int device, const Stream& s);

// index.cu. Indices are checked on the device; a bad one is an Error after the kernel (which
// synchronizes the stream: see Note [index checks on the device] in index.cu).
void index_select_launch(const View& in, int dim, const View& index, const View& out,
                         const Stream& s);
void index_add_launch(const View& out, int dim, const View& index, const View& src,
                      const Stream& s);
void gather_launch(const View& in, int dim, const View& index, const View& out, const Stream& s);
void scatter_launch(const View& out, int dim, const View& index, const View& src, bool accumulate,
                    const Stream& s);
// Backend::nonzero: the true positions of a contiguous bool mask, in order (CUB's DeviceSelect).
void nonzero_launch(const View& mask, const View& out, const Stream& s);

// The nn kernels (conv, pool, norm) take float32 and float64, as on the CPU: ops/ runs 16-bit
// floats in float32 before they reach a backend.
inline void check_nn_dtype(DType dtype, const char* op) {
  KILN_CHECK(dtype == kFloat32 || dtype == kFloat64,
             "{}: the CUDA kernel takes float32 or float64, got {}", op, dtype_name(dtype));
}

// conv.cu: through cuDNN (see the Notes there). Views as core/backend.h's contract; `device` is the
// stream's device.
void conv2d_launch(const View& input, const View& weight, const View& bias, const View& out,
                   const ConvArgs& args, int device, const Stream& s);
void conv2d_backward_input_launch(const View& grad_out, const View& weight, const View& grad_input,
                                  const ConvArgs& args, int device, const Stream& s);
void conv2d_backward_weight_launch(const View& grad_out, const View& input,
                                   const View& grad_weight, const ConvArgs& args, int device,
                                   const Stream& s);

// pool.cu: max, average, adaptive average and adaptive max pooling over contiguous (N, C, H, W) views.
void max_pool2d_launch(const View& in, const View& out, const View& indices,
                       const Pool2dArgs& args, const Stream& s);
void max_pool2d_backward_launch(const View& grad_out, const View& indices, const View& grad_in,
                                const Stream& s);
void avg_pool2d_launch(const View& in, const View& out, const Pool2dArgs& args, const Stream& s);
void avg_pool2d_backward_launch(const View& grad_out, const View& grad_in, const Pool2dArgs& args,
                                const Stream& s);
void adaptive_avg_pool2d_launch(const View& in, const View& out, const Stream& s);
void adaptive_avg_pool2d_backward_launch(const View& grad_out, const View& grad_in,
                                         const Stream& s);
void adaptive_max_pool2d_launch(const View& in, const View& out, const View& indices,
                                const Stream& s);

// norm.cu: the rows of a contiguous (R, M) view.
void norm_rows_launch(const View& in, const View& out, const View& mean, const View& rstd,
                      double eps, bool rms, const Stream& s);

// fused.cu: the fused kernels (core/backend.h's contract; contiguous float32/float64 views).
void layer_norm_launch(const View& x, const View& residual, const View& weight, const View& bias, const View& out,
                       const View& sum, const View& mean, const View& rstd, double eps, bool rms, const Stream& s);
void layer_norm_backward_launch(const View& grad_out, const View& grad_sum, const View& h, const View& weight,
                                const View& mean, const View& rstd, const View& grad_in, const View& grad_weight,
                                const View& grad_bias, bool rms, const Stream& s);
void bias_gelu_launch(const View& in, const View& bias, const View& out, bool tanh, const Stream& s);
void bias_gelu_backward_launch(const View& grad_out, const View& in, const View& bias, const View& grad_in,
                               const View& grad_bias, bool tanh, const Stream& s);
void cross_entropy_launch(const View& logits, const View& target, const View& loss, const View& lse,
                          int64_t ignore_index, double label_smoothing, const Stream& s);
void cross_entropy_backward_launch(const View& logits, const View& target, const View& lse, const View& grad_loss,
                                   const View& grad_logits, int64_t ignore_index, double label_smoothing,
                                   const Stream& s);

// ctc.cu
void ctc_loss_launch(const View& log_probs, const View& targets, const View& input_lengths, const View& target_lengths,
                     const View& nll, const View& log_alpha, int64_t blank, const Stream& s);
void ctc_loss_backward_launch(const View& grad_nll, const View& log_probs, const View& targets,
                              const View& input_lengths, const View& target_lengths, const View& nll,
                              const View& log_alpha, const View& log_beta, const View& grad_log_probs, int64_t blank,
                              const Stream& s);

// sort.cu: Backend::sort and kthvalue (Note [sorting by rank]) and Backend::scan (a thread per line).
void sort_launch(const View& in, int dim, bool descending, const View& values, const View& indices, const Stream& s);
void kthvalue_launch(const View& in, int dim, int64_t k, const View& values, const View& indices, const Stream& s);
void scan_launch(ScanKind kind, const View& in, int dim, const View& out, const View& indices, const Stream& s);
// Backend::searchsorted: a thread per value, PyTorch's binary search.
void searchsorted_launch(const View& sorted, const View& values, bool right, const View& out, const Stream& s);

// attention.cu: Backend::attention and its backward for float16, bfloat16 and float32 (B, H, L, D)
// views with any strides on their first three dims, D = 32, 64, 96 or 128, L and S > 0, lse in
// float32 (see the Notes there).
void attention_launch(const View& q, const View& k, const View& v, const View& out, const View& lse,
                      const AttentionArgs& args, const Stream& s);
void attention_backward_launch(const View& q, const View& k, const View& v, const View& out, const View& lse,
                               const View& grad_out, const View& grad_q, const View& grad_k, const View& grad_v,
                               const AttentionArgs& args, const Stream& s);

// optim.cu: the fused Adam/AdamW and SGD steps over lists of tensors (core/scalar_math.h's
// adam_update and sgd_update).
void adam_step_launch(const std::vector<View>& params, const std::vector<View>& grads,
                      const std::vector<View>& exp_avgs, const std::vector<View>& exp_avg_sqs,
                      const std::vector<View>& max_exp_avg_sqs, const AdamStepArgs& args,
                      const Stream& s);
void sgd_step_launch(const std::vector<View>& params, const std::vector<View>& grads,
                     const std::vector<View>& momentum_buffers, const SgdStepArgs& args,
                     const Stream& s);

}  // namespace kiln::cuda

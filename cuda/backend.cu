// cuda/backend.cu: CudaBackend, the CUDA implementation of the Backend contract (core/backend.h).
// Each entry makes the stream's device current (DeviceGuard) and forwards to the launcher of the
// same name: copy.cpp and copy.cu (copies in every direction, fill, arange), random.cu,
// elementwise.cu (unary, binary, where), reduce.cu (reduce, softmax), matmul.cu, index.cu
// (index_select, index_add, gather, scatter, nonzero), conv.cu (conv2d and its two backward kernels,
// through cuDNN), pool.cu (max, average, adaptive average and adaptive max pooling), norm.cu (norm_rows),
// fused.cu (layer_norm, bias_gelu, cross_entropy and their backward), ctc.cu (ctc_loss and its
// backward), optim.cu (adam_step, sgd_step), attention.cu, sort.cu (sort, kthvalue, scan, searchsorted).
// The caching allocator is allocator.cpp, the entry points of cuda/cuda.h runtime.cpp. Streams: Note
// [CUDA streams] in cuda/context.h. CPU sibling: cpu/backend.cpp.
#include <climits>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/context.h"
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

// ---- the Backend ----

class CudaBackend final : public Backend {
 public:
  Allocator& allocator(int device_index) override { return device_allocator(device_index); }
  Stream current_stream(int device_index) override {
    check_device(device_index, "current_stream");
    return {Device::cuda(device_index), current_stream_handle(device_index)};
  }
  void synchronize(int device_index) override { cuda::synchronize(device_index); }

  void copy(const View& src, Device src_device, const View& dst, Device dst_device,
            const Stream& s) override {
    copy_between(src, src_device, dst, dst_device, s);  // sets the devices itself
  }
  void copy_non_blocking(const View& src, Device src_device, const View& dst, Device dst_device,
                         const Stream& s) override {
    copy_between(src, src_device, dst, dst_device, s, /*non_blocking=*/true);
  }
  Allocator* host_allocator() override { return &cuda::host_allocator(); }
  void fill(const View& out, const Scalar& value, const Stream& s) override {
    DeviceGuard guard(s.device.index, "fill");
    fill_launch(out, value, s);
  }
  void arange(const View& out, double start, double step, const Stream& s) override {
    DeviceGuard guard(s.device.index, "arange");
    arange_launch(out, start, step, s);
  }
  void random(RandomKind kind, const View& out, uint64_t seed, uint64_t offset, const RandomArgs& args,
              const Stream& s) override {
    DeviceGuard guard(s.device.index, "random");
    random_launch(kind, out, seed, offset, args, s);
  }

  void unary(UnaryOp op, const View& in, const View& out, UnaryArgs args,
             const Stream& s) override {
    DeviceGuard guard(s.device.index, "unary op");
    unary_launch(op, in, out, args, s);
  }
  void binary(BinaryOp op, const View& a, const View& b, const View& out, double alpha,
              const Stream& s) override {
    DeviceGuard guard(s.device.index, "binary op");
    binary_launch(op, a, b, out, alpha, s);
  }
  void where(const View& cond, const View& a, const View& b, const View& out,
             const Stream& s) override {
    DeviceGuard guard(s.device.index, "where");
    where_launch(cond, a, b, out, s);
  }
  void ternary(TernaryOp op, const View& a, const View& b, const View& c, const View& out, double v,
               const Stream& s) override {
    DeviceGuard guard(s.device.index, "ternary op");
    ternary_launch(op, a, b, c, out, v, s);
  }

  void reduce(ReduceKind op, const View& in, const View& out, const Stream& s) override {
    DeviceGuard guard(s.device.index, "reduce");
    reduce_launch(op, in, out, s);
  }
  void matmul(const View& a, const View& b, const View& c, const Stream& s) override {
    DeviceGuard guard(s.device.index, "matmul");
    matmul_launch(a, b, c, s.device.index, s);
  }
  bool matmul_bias(const View& a, const View& b, const View& bias, const View& c, const Stream& s) override {
    DeviceGuard guard(s.device.index, "addmm");
    return matmul_bias_launch(a, b, bias, c, s.device.index, s);
  }
  bool matmul_bias_gelu(const View& a, const View& b, const View& bias, const View& c, const View& pre,
                        const Stream& s) override {
    DeviceGuard guard(s.device.index, "addmm_gelu");
    return matmul_bias_gelu_launch(a, b, bias, c, pre, s.device.index, s);
  }
  void softmax(const View& in, const View& out, int dim, bool log, const Stream& s) override {
    DeviceGuard guard(s.device.index, log ? "log_softmax" : "softmax");
    softmax_launch(in, out, dim, log, s);
  }
  void softmax_backward(const View& y, const View& g, const View& out, int dim, bool log, const Stream& s) override {
    DeviceGuard guard(s.device.index, log ? "log_softmax backward" : "softmax backward");
    softmax_backward_launch(y, g, out, dim, log, s);
  }

  void index_select(const View& in, int dim, const View& index, const View& out,
                    const Stream& s) override {
    DeviceGuard guard(s.device.index, "index_select");
    index_select_launch(in, dim, index, out, s);
  }
  void index_add(const View& out, int dim, const View& index, const View& src,
                 const Stream& s) override {
    DeviceGuard guard(s.device.index, "index_add");
    index_add_launch(out, dim, index, src, s);
  }
  void gather(const View& in, int dim, const View& index, const View& out,
              const Stream& s) override {
    DeviceGuard guard(s.device.index, "gather");
    gather_launch(in, dim, index, out, s);
  }
  void scatter(const View& out, int dim, const View& index, const View& src, bool accumulate,
               const Stream& s) override {
    DeviceGuard guard(s.device.index, accumulate ? "scatter_add" : "scatter");
    scatter_launch(out, dim, index, src, accumulate, s);
  }

  // The nn kernels: conv.cu (cuDNN), pool.cu and norm.cu (own kernels).
  // 2-D only (conv3d_kernels() is false: ops composes 3-D convolutions from these).
  void conv(const View& input, const View& weight, const View& bias, const View& out, const ConvArgs& args,
            const Stream& s) override {
    DeviceGuard guard(s.device.index, "conv2d");
    conv2d_launch(input, weight, bias, out, args, s.device.index, s);
  }
  void conv_backward_input(const View& grad_out, const View& weight, const View& grad_input, const ConvArgs& args,
                           const Stream& s) override {
    DeviceGuard guard(s.device.index, "conv2d_backward_input");
    conv2d_backward_input_launch(grad_out, weight, grad_input, args, s.device.index, s);
  }
  void conv_backward_weight(const View& grad_out, const View& input, const View& grad_weight, const ConvArgs& args,
                            const Stream& s) override {
    DeviceGuard guard(s.device.index, "conv2d_backward_weight");
    conv2d_backward_weight_launch(grad_out, input, grad_weight, args, s.device.index, s);
  }
  void max_pool2d(const View& in, const View& out, const View& indices, const Pool2dArgs& args,
                  const Stream& s) override {
    DeviceGuard guard(s.device.index, "max_pool2d");
    max_pool2d_launch(in, out, indices, args, s);
  }
  void max_pool2d_backward(const View& grad_out, const View& indices, const View& grad_in,
                           const Stream& s) override {
    DeviceGuard guard(s.device.index, "max_pool2d_backward");
    max_pool2d_backward_launch(grad_out, indices, grad_in, s);
  }
  void avg_pool2d(const View& in, const View& out, const Pool2dArgs& args,
                  const Stream& s) override {
    DeviceGuard guard(s.device.index, "avg_pool2d");
    avg_pool2d_launch(in, out, args, s);
  }
  void avg_pool2d_backward(const View& grad_out, const View& grad_in, const Pool2dArgs& args,
                           const Stream& s) override {
    DeviceGuard guard(s.device.index, "avg_pool2d_backward");
    avg_pool2d_backward_launch(grad_out, grad_in, args, s);
  }
  void adaptive_avg_pool2d(const View& in, const View& out, const Stream& s) override {
    DeviceGuard guard(s.device.index, "adaptive_avg_pool2d");
    adaptive_avg_pool2d_launch(in, out, s);
  }
  void adaptive_avg_pool2d_backward(const View& grad_out, const View& grad_in,
                                    const Stream& s) override {
    DeviceGuard guard(s.device.index, "adaptive_avg_pool2d_backward");
    adaptive_avg_pool2d_backward_launch(grad_out, grad_in, s);
  }
  void adaptive_max_pool2d(const View& in, const View& out, const View& indices, const Stream& s) override {
    DeviceGuard guard(s.device.index, "adaptive_max_pool2d");
    adaptive_max_pool2d_launch(in, out, indices, s);
  }
  void adam_step(const std::vector<View>& params, const std::vector<View>& grads, const std::vector<View>& exp_avgs,
                 const std::vector<View>& exp_avg_sqs, const std::vector<View>& max_exp_avg_sqs,
                 const AdamStepArgs& args, const Stream& s) override {
    DeviceGuard guard(s.device.index, "adam_step");
    adam_step_launch(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, args, s);
  }
  void sgd_step(const std::vector<View>& params, const std::vector<View>& grads,
                const std::vector<View>& momentum_buffers, const SgdStepArgs& args,
                const Stream& s) override {
    DeviceGuard guard(s.device.index, "sgd_step");
    sgd_step_launch(params, grads, momentum_buffers, args, s);
  }
  void norm_rows(const View& in, const View& out, const View& mean, const View& rstd, double eps,
                 bool rms, const Stream& s) override {
    DeviceGuard guard(s.device.index, rms ? "rms_norm" : "norm");
    norm_rows_launch(in, out, mean, rstd, eps, rms, s);
  }
  void layer_norm(const View& x, const View& residual, const View& weight, const View& bias, const View& out,
                  const View& sum, const View& mean, const View& rstd, double eps, bool rms,
                  const Stream& s) override {
    DeviceGuard guard(s.device.index, rms ? "rms_norm" : "layer_norm");
    layer_norm_launch(x, residual, weight, bias, out, sum, mean, rstd, eps, rms, s);
  }
  void layer_norm_backward(const View& grad_out, const View& grad_sum, const View& h, const View& weight,
                           const View& mean, const View& rstd, const View& grad_in, const View& grad_weight,
                           const View& grad_bias, bool rms, const Stream& s) override {
    DeviceGuard guard(s.device.index, rms ? "rms_norm backward" : "layer_norm backward");
    layer_norm_backward_launch(grad_out, grad_sum, h, weight, mean, rstd, grad_in, grad_weight, grad_bias, rms, s);
  }
  void bias_gelu(const View& in, const View& bias, const View& out, bool tanh, const Stream& s) override {
    DeviceGuard guard(s.device.index, "bias_gelu");
    bias_gelu_launch(in, bias, out, tanh, s);
  }
  void bias_gelu_backward(const View& grad_out, const View& in, const View& bias, const View& grad_in,
                          const View& grad_bias, bool tanh, const Stream& s) override {
    DeviceGuard guard(s.device.index, "bias_gelu backward");
    bias_gelu_backward_launch(grad_out, in, bias, grad_in, grad_bias, tanh, s);
  }
  void cross_entropy(const View& logits, const View& target, const View& loss, const View& lse,
                     int64_t ignore_index, double label_smoothing, const Stream& s) override {
    DeviceGuard guard(s.device.index, "cross_entropy");
    cross_entropy_launch(logits, target, loss, lse, ignore_index, label_smoothing, s);
  }
  void cross_entropy_backward(const View& logits, const View& target, const View& lse, const View& grad_loss,
                              const View& grad_logits, int64_t ignore_index, double label_smoothing,
                              const Stream& s) override {
    DeviceGuard guard(s.device.index, "cross_entropy backward");
    cross_entropy_backward_launch(logits, target, lse, grad_loss, grad_logits, ignore_index, label_smoothing, s);
  }
  void ctc_loss(const View& log_probs, const View& targets, const View& input_lengths, const View& target_lengths,
                const View& nll, const View& log_alpha, int64_t blank, const Stream& s) override {
    DeviceGuard guard(s.device.index, "ctc_loss");
    ctc_loss_launch(log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, s);
  }
  void ctc_loss_backward(const View& grad_nll, const View& log_probs, const View& targets, const View& input_lengths,
                         const View& target_lengths, const View& nll, const View& log_alpha, const View& log_beta,
                         const View& grad_log_probs, int64_t blank, const Stream& s) override {
    DeviceGuard guard(s.device.index, "ctc_loss backward");
    ctc_loss_backward_launch(grad_nll, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, log_beta,
                             grad_log_probs, blank, s);
  }
  // float16, bfloat16 and float32 (ops/attention.cpp composes float64, masked attention and attention
  // with dropout on this device).
  void attention(const View& q, const View& k, const View& v, const View& out, const View& lse,
                 const AttentionArgs& args, const Stream& s) override {
    KILN_CHECK(args.dropout == 0, "scaled_dot_product_attention: internal error: the CUDA kernel takes no "
                                  "dropout (ops/attention.cpp composes attention with dropout on CUDA)");
    DeviceGuard guard(s.device.index, "scaled_dot_product_attention");
    attention_launch(q, k, v, out, lse, args, s);
  }
  void attention_backward(const View& q, const View& k, const View& v, const View& out, const View& lse,
                          const View& grad_out, const View& grad_q, const View& grad_k, const View& grad_v,
                          const AttentionArgs& args, const Stream& s) override {
    KILN_CHECK(args.dropout == 0, "scaled_dot_product_attention backward: internal error: the CUDA kernel "
                                  "takes no dropout");
    DeviceGuard guard(s.device.index, "scaled_dot_product_attention backward");
    attention_backward_launch(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, args, s);
  }
  void sort(const View& in, int dim, bool descending, const View& values, const View& indices,
            const Stream& s) override {
    DeviceGuard guard(s.device.index, "sort");
    sort_launch(in, dim, descending, values, indices, s);
  }
  void kthvalue(const View& in, int dim, int64_t k, const View& values, const View& indices, const Stream& s) override {
    DeviceGuard guard(s.device.index, "kthvalue");
    kthvalue_launch(in, dim, k, values, indices, s);
  }
  void scan(ScanKind kind, const View& in, int dim, const View& out, const View& indices, const Stream& s) override {
    DeviceGuard guard(s.device.index, "scan");
    scan_launch(kind, in, dim, out, indices, s);
  }
  void searchsorted(const View& sorted, const View& values, bool right, const View& out, const Stream& s) override {
    DeviceGuard guard(s.device.index, "searchsorted");
    searchsorted_launch(sorted, values, right, out, s);
  }
  void nonzero(const View& mask, const View& out, const Stream& s) override {
    DeviceGuard guard(s.device.index, "nonzero");
    nonzero_launch(mask, out, s);
  }
};

}  // namespace

Backend& backend_instance() {
  static CudaBackend* instance = new CudaBackend();  // never destroyed, like the allocators
  return *instance;
}

}  // namespace kiln::cuda

// cpu/backend.cpp: the CPU implementation of the Backend contract: each entry forwards to the kernel
// of the same name in this folder.
#include "core/error.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"

namespace kiln::cpu {
namespace {

class CpuBackend final : public Backend {
 public:
  Allocator& allocator(int) override { return cpu_allocator(); }
  Stream current_stream(int) override { return {Device::cpu(), nullptr}; }
  void synchronize(int) override {}
  void copy(const View& src, Device src_device, const View& dst, Device dst_device,
            const Stream&) override {
    KILN_CHECK(src_device.is_cpu() && dst_device.is_cpu(),
               "copy: the CPU backend copies between CPU tensors only, not {} -> {}",
               src_device.str(), dst_device.str());
    copy_kernel(src, dst);
  }
  void fill(const View& out, const Scalar& value, const Stream&) override { fill_kernel(out, value); }
  void arange(const View& out, double start, double step, const Stream&) override {
    arange_kernel(out, start, step);
  }
  void random(RandomKind kind, const View& out, uint64_t seed, uint64_t offset, const RandomArgs& args,
              const Stream&) override {
    random_kernel(kind, out, seed, offset, args);
  }
  void unary(UnaryOp op, const View& in, const View& out, UnaryArgs args, const Stream&) override {
    unary_kernel(op, in, out, args);
  }
  void binary(BinaryOp op, const View& a, const View& b, const View& out, double alpha,
              const Stream&) override {
    binary_kernel(op, a, b, out, alpha);
  }
  void where(const View& cond, const View& a, const View& b, const View& out,
             const Stream&) override {
    where_kernel(cond, a, b, out);
  }
  void ternary(TernaryOp op, const View& a, const View& b, const View& c, const View& out, double v,
               const Stream&) override {
    ternary_kernel(op, a, b, c, out, v);
  }
  void reduce(ReduceKind op, const View& in, const View& out, const Stream&) override {
    reduce_kernel(op, in, out);
  }
  void matmul(const View& a, const View& b, const View& c, const Stream&) override {
    matmul_kernel(a, b, c);
  }
  void softmax(const View& in, const View& out, int dim, bool log, const Stream&) override {
    softmax_kernel(in, out, dim, log);
  }
  void softmax_backward(const View& y, const View& g, const View& out, int dim, bool log, const Stream&) override {
    softmax_backward_kernel(y, g, out, dim, log);
  }
  void index_select(const View& in, int dim, const View& index, const View& out,
                    const Stream&) override {
    index_select_kernel(in, dim, index, out);
  }
  void index_add(const View& out, int dim, const View& index, const View& src,
                 const Stream&) override {
    index_add_kernel(out, dim, index, src);
  }
  void gather(const View& in, int dim, const View& index, const View& out, const Stream&) override {
    gather_kernel(in, dim, index, out);
  }
  void scatter(const View& out, int dim, const View& index, const View& src, bool accumulate,
               const Stream&) override {
    scatter_kernel(out, dim, index, src, accumulate);
  }
  void conv(const View& input, const View& weight, const View& bias, const View& out, const ConvArgs& args,
            const Stream&) override {
    conv_kernel(input, weight, bias, out, args);
  }
  void conv_backward_input(const View& grad_out, const View& weight, const View& grad_input, const ConvArgs& args,
                           const Stream&) override {
    conv_backward_input_kernel(grad_out, weight, grad_input, args);
  }
  void conv_backward_weight(const View& grad_out, const View& input, const View& grad_weight, const ConvArgs& args,
                            const Stream&) override {
    conv_backward_weight_kernel(grad_out, input, grad_weight, args);
  }
  bool conv3d_kernels() const override { return true; }
  void max_pool2d(const View& in, const View& out, const View& indices, const Pool2dArgs& args,
                  const Stream&) override {
    max_pool2d_kernel(in, out, indices, args);
  }
  void max_pool2d_backward(const View& grad_out, const View& indices, const View& grad_in,
                           const Stream&) override {
    max_pool2d_backward_kernel(grad_out, indices, grad_in);
  }
  void avg_pool2d(const View& in, const View& out, const Pool2dArgs& args, const Stream&) override {
    avg_pool2d_kernel(in, out, args);
  }
  void avg_pool2d_backward(const View& grad_out, const View& grad_in, const Pool2dArgs& args,
                           const Stream&) override {
    avg_pool2d_backward_kernel(grad_out, grad_in, args);
  }
  void adaptive_avg_pool2d(const View& in, const View& out, const Stream&) override {
    adaptive_avg_pool2d_kernel(in, out);
  }
  void adaptive_avg_pool2d_backward(const View& grad_out, const View& grad_in, const Stream&) override {
    adaptive_avg_pool2d_backward_kernel(grad_out, grad_in);
  }
  void adaptive_max_pool2d(const View& in, const View& out, const View& indices, const Stream&) override {
    adaptive_max_pool2d_kernel(in, out, indices);
  }
  void adam_step(const std::vector<View>& params, const std::vector<View>& grads, const std::vector<View>& exp_avgs,
                 const std::vector<View>& exp_avg_sqs, const std::vector<View>& max_exp_avg_sqs,
                 const AdamStepArgs& args, const Stream&) override {
    adam_step_kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, args);
  }
  void sgd_step(const std::vector<View>& params, const std::vector<View>& grads,
                const std::vector<View>& momentum_buffers, const SgdStepArgs& args,
                const Stream&) override {
    sgd_step_kernel(params, grads, momentum_buffers, args);
  }
  void norm_rows(const View& in, const View& out, const View& mean, const View& rstd, double eps, bool rms,
                 const Stream&) override {
    norm_rows_kernel(in, out, mean, rstd, eps, rms);
  }
  void layer_norm(const View& x, const View& residual, const View& weight, const View& bias, const View& out,
                  const View& sum, const View& mean, const View& rstd, double eps, bool rms, const Stream&) override {
    layer_norm_kernel(x, residual, weight, bias, out, sum, mean, rstd, eps, rms);
  }
  void layer_norm_backward(const View& grad_out, const View& grad_sum, const View& h, const View& weight,
                           const View& mean, const View& rstd, const View& grad_in, const View& grad_weight,
                           const View& grad_bias, bool rms, const Stream&) override {
    layer_norm_backward_kernel(grad_out, grad_sum, h, weight, mean, rstd, grad_in, grad_weight, grad_bias, rms);
  }
  void bias_gelu(const View& in, const View& bias, const View& out, bool tanh, const Stream&) override {
    bias_gelu_kernel(in, bias, out, tanh);
  }
  void bias_gelu_backward(const View& grad_out, const View& in, const View& bias, const View& grad_in,
                          const View& grad_bias, bool tanh, const Stream&) override {
    bias_gelu_backward_kernel(grad_out, in, bias, grad_in, grad_bias, tanh);
  }
  void cross_entropy(const View& logits, const View& target, const View& loss, const View& lse,
                     int64_t ignore_index, double label_smoothing, const Stream&) override {
    cross_entropy_kernel(logits, target, loss, lse, ignore_index, label_smoothing);
  }
  void cross_entropy_backward(const View& logits, const View& target, const View& lse, const View& grad_loss,
                              const View& grad_logits, int64_t ignore_index, double label_smoothing,
                              const Stream&) override {
    cross_entropy_backward_kernel(logits, target, lse, grad_loss, grad_logits, ignore_index, label_smoothing);
  }
  void ctc_loss(const View& log_probs, const View& targets, const View& input_lengths, const View& target_lengths,
                const View& nll, const View& log_alpha, int64_t blank, const Stream&) override {
    ctc_loss_kernel(log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank);
  }
  void ctc_loss_backward(const View& grad_nll, const View& log_probs, const View& targets, const View& input_lengths,
                         const View& target_lengths, const View& nll, const View& log_alpha, const View& log_beta,
                         const View& grad_log_probs, int64_t blank, const Stream&) override {
    ctc_loss_backward_kernel(grad_nll, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, log_beta,
                             grad_log_probs, blank);
  }
  void attention(const View& q, const View& k, const View& v, const View& out, const View& lse,
                 const AttentionArgs& args, const Stream&) override {
    attention_kernel(q, k, v, out, lse, args);
  }
  void attention_backward(const View& q, const View& k, const View& v, const View& out, const View& lse,
                          const View& grad_out, const View& grad_q, const View& grad_k, const View& grad_v,
                          const AttentionArgs& args, const Stream&) override {
    attention_backward_kernel(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, args);
  }
  void sort(const View& in, int dim, bool descending, const View& values, const View& indices, const Stream&) override {
    sort_kernel(in, dim, descending, values, indices);
  }
  void kthvalue(const View& in, int dim, int64_t k, const View& values, const View& indices, const Stream&) override {
    kthvalue_kernel(in, dim, k, values, indices);
  }
  void scan(ScanKind kind, const View& in, int dim, const View& out, const View& indices, const Stream&) override {
    scan_kernel(kind, in, dim, out, indices);
  }
  void searchsorted(const View& sorted, const View& values, bool right, const View& out, const Stream&) override {
    searchsorted_kernel(sorted, values, right, out);
  }
  void nonzero(const View& mask, const View& out, const Stream&) override { nonzero_kernel(mask, out); }
};

}  // namespace

Backend& backend() {
  static CpuBackend instance;
  return instance;
}

}  // namespace kiln::cpu

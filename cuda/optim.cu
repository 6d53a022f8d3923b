// cuda/optim.cu: the fused optimizer steps of the CUDA backend (Backend::adam_step). CPU sibling:
// cpu/optim.cpp; the math of one element is core/scalar_math.h's adam_update, shared with it.
//
// Multi-tensor: a launch covers up to kTensors tensors cut into chunks of kChunk elements, up to
// kBlocks chunks, one block per chunk; the tensors' pointers and the block -> (tensor, chunk) table
// travel in the kernel's parameters (about 2.5 KB, under the 4 KB every device takes). A step over
// many small tensors (a network's biases and norms) is then a few launches instead of one per
// tensor, and each element is read and written once: p, g, m, v in, p, m, v out.
#include <algorithm>

#include "core/scalar_math.h"
#include "cuda/context.h"
#include "cuda/kernels.h"
#include "cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr int kTensors = 24;
constexpr int kBlocks = 256;
constexpr int64_t kChunk = 1 << 16;

template <typename T>
struct AdamBatch {
  T* p[kTensors];
  const T* g[kTensors];
  T* m[kTensors];
  T* v[kTensors];
  T* vmax[kTensors];
  int64_t n[kTensors];
  unsigned char block_tensor[kBlocks];
  int block_chunk[kBlocks];
};

template <typename T>
__global__ void adam_kernel(AdamBatch<T> batch, math::AdamCoefficients<T> c) {
  const int t = batch.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(batch.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(batch.n[t], begin + kChunk);
  T* p = batch.p[t];
  const T* g = batch.g[t];
  T* m = batch.m[t];
  T* v = batch.v[t];
  T* vmax = batch.vmax[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    T pi = p[i], mi = m[i], vi = v[i];
    math::adam_update(pi, g[i], mi, vi, vmax ? vmax + i : nullptr, c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

template <typename T>
void adam_typed(const std::vector<View>& params, const std::vector<View>& grads, const std::vector<View>& exp_avgs,
                const std::vector<View>& exp_avg_sqs, const std::vector<View>& max_exp_avg_sqs,
                const AdamStepArgs& args, cudaStream_t stream) {
  const math::AdamCoefficients<T> c = math::adam_coefficients<T>(args);
  AdamBatch<T> batch{};
  int tensors = 0, blocks = 0;
  auto flush = [&] {
    if (blocks > 0) {
      adam_kernel<T><<<blocks, kThreads, 0, stream>>>(batch, c);
      KILN_CUDA_CHECK(cudaGetLastError());
    }
    tensors = blocks = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    if (n == 0) continue;
    if (tensors == kTensors) flush();
    const int t = tensors++;
    batch.p[t] = params[i].ptr<T>();
    batch.g[t] = grads[i].ptr<T>();
    batch.m[t] = exp_avgs[i].ptr<T>();
    batch.v[t] = exp_avg_sqs[i].ptr<T>();
    batch.vmax[t] = args.amsgrad ? max_exp_avg_sqs[i].ptr<T>() : nullptr;
    batch.n[t] = n;
    for (int64_t chunk = 0; chunk * kChunk < n; ++chunk) {
      if (blocks == kBlocks) {
        // The table is full: launch it, and carry this tensor on into a fresh batch.
        const int kept = t;
        flush();
        batch.p[0] = batch.p[kept];
        batch.g[0] = batch.g[kept];
        batch.m[0] = batch.m[kept];
        batch.v[0] = batch.v[kept];
        batch.vmax[0] = batch.vmax[kept];
        batch.n[0] = batch.n[kept];
        tensors = 1;
      }
      batch.block_tensor[blocks] = static_cast<unsigned char>(tensors - 1);
      batch.block_chunk[blocks] = static_cast<int>(chunk);
      ++blocks;
    }
  }
  flush();
}

}  // namespace

void adam_step_launch(const std::vector<View>& params, const std::vector<View>& grads,
                      const std::vector<View>& exp_avgs, const std::vector<View>& exp_avg_sqs,
                      const std::vector<View>& max_exp_avg_sqs, const AdamStepArgs& args, const Stream& s) {
  if (params.empty()) return;
  const DType dtype = params[0].dtype;
  KILN_CHECK(dtype == kFloat32 || dtype == kFloat64,
             "adam_step: the fused step takes float32 and float64 tensors, got {}", dtype_name(dtype));
  for (size_t i = 0; i < params.size(); ++i) {
    KILN_CHECK(params[i].dtype == dtype && grads[i].dtype == dtype && exp_avgs[i].dtype == dtype &&
                   exp_avg_sqs[i].dtype == dtype,
               "adam_step: every tensor of one call must be {}; tensor {} is not", dtype_name(dtype), i);
  }
  if (dtype == kFloat64) {
    adam_typed<double>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, args, stream_of(s));
  } else {
    adam_typed<float>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, args, stream_of(s));
  }
}

}  // namespace kiln::cuda

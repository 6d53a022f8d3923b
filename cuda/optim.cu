// cuda/optim.cu: the fused optimizer steps of the CUDA backend (Backend::adam_step). CPU sibling:
// cpu/optim.cpp; the math of one element is core/scalar_math.h's adam_update, shared with it.
//
// Multi-tensor: a launch covers up to kTensors tensors cut into chunks of kChunk elements, up to
// kBlocks chunks, one block per chunk; the tensors' pointers and the block -> (tensor, chunk) table
// travel in the kernel's parameters (about 2.5 KB, under the 4 KB every device takes). A step over
// many small tensors (a network's biases and norms) is then a few launches instead of one per
// tensor, and each element is read and written once (p, g, m, v in; p, m, v out), in 16-byte
// vectors where the buffers are aligned.
#include <algorithm>
#include <cstdint>

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

// Block b updates chunk block_chunk[b] of tensor block_tensor[b]. When the tensor's buffers are all
// 16-byte aligned (those of the caching allocator are), in 16-byte vectors up to the chunk's last
// whole vector, then one by one.
template <typename T>
__global__ void adam_kernel(AdamBatch<T> batch, math::AdamCoefficients<T> c) {
  constexpr int V = Vec16<T>::kSize;
  const int t = batch.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(batch.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(batch.n[t], begin + kChunk);
  T* p = batch.p[t];
  const T* g = batch.g[t];
  T* m = batch.m[t];
  T* v = batch.v[t];
  T* vmax = batch.vmax[t];
  int64_t tail = begin;
  if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!vmax || aligned16(vmax))) {
    const int64_t vectors = (end - begin) / V;  // begin is a multiple of kChunk, hence of V
    for (int64_t k = threadIdx.x; k < vectors; k += blockDim.x) {
      const int64_t i = begin / V + k;
      Vec16<T> pv = reinterpret_cast<Vec16<T>*>(p)[i], mv = reinterpret_cast<Vec16<T>*>(m)[i];
      Vec16<T> vv = reinterpret_cast<Vec16<T>*>(v)[i], xv{};
      const Vec16<T> gv = reinterpret_cast<const Vec16<T>*>(g)[i];
      if (vmax) xv = reinterpret_cast<Vec16<T>*>(vmax)[i];
      KILN_CUDA_UNROLL
      for (int e = 0; e < V; ++e) math::adam_update(pv.v[e], gv.v[e], mv.v[e], vv.v[e], &xv.v[e], c);
      reinterpret_cast<Vec16<T>*>(p)[i] = pv;
      reinterpret_cast<Vec16<T>*>(m)[i] = mv;
      reinterpret_cast<Vec16<T>*>(v)[i] = vv;
      if (vmax) reinterpret_cast<Vec16<T>*>(vmax)[i] = xv;
    }
    tail = begin + vectors * V;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
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
  if (params.empty()) return;  // one dtype for all: ops/optim.cpp checked the lists
  KILN_DISPATCH_F32_F64(params[0].dtype, "adam_step", [&] {
    adam_typed<scalar_t>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, args, stream_of(s));
  });
}

}  // namespace kiln::cuda

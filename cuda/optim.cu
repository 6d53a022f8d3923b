// cuda/optim.cu: the fused optimizer steps of the CUDA backend (Backend::adam_step, sgd_step). CPU
// sibling: cpu/optim.cpp; the math of one element is core/scalar_math.h's adam_update and
// sgd_update, shared with it.
//
// Multi-tensor: a launch covers up to kTensors tensors cut into chunks of kChunk elements, up to
// kBlocks chunks, one block per chunk; the tensors' pointers and the block -> (tensor, chunk) table
// travel in the kernel's parameters (a TensorTable: about 2.5 KB for Adam's five lists, under the
// 4 KB every device takes). A step over many small tensors (a network's biases and norms) is then a
// few launches instead of one per tensor, and each element is read and written once (Adam: p, g, m,
// v in; p, m, v out), in 16-byte vectors where the buffers are aligned.
#include <algorithm>
#include <array>
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

// ---- the multi-tensor table ----

// One launch's tensors: ptr[k][t] is tensor t of list k (a step's p, g and state, in the order the
// launcher gives them; nullptr for an absent list), n[t] its element count; block b updates chunk
// block_chunk[b] of tensor block_tensor[b].
template <typename T, int N>
struct TensorTable {
  T* ptr[N][kTensors];
  int64_t n[kTensors];
  unsigned char block_tensor[kBlocks];
  int block_chunk[kBlocks];
};

// The tensor of this block, and the elements [begin, end) of its chunk (begin is a multiple of
// kChunk, hence of any Vec16's size).
template <typename T, int N>
__device__ inline int block_range(const TensorTable<T, N>& table, int64_t& begin, int64_t& end) {
  const int t = table.block_tensor[blockIdx.x];
  begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  end = min(table.n[t], begin + kChunk);
  return t;
}

// Fills tables with the tensors of `lists` (lists[k] holds one view per tensor, all of one shape
// for each index; nullptr for an absent list) and calls launch(table, blocks) for each full one and
// the last. Empty tensors are skipped. A tensor whose chunks do not fit is carried on into the
// next table.
template <typename T, int N, typename Launch>
void for_each_table(const std::array<const std::vector<View>*, N>& lists, const Launch& launch) {
  TensorTable<T, N> table{};
  int tensors = 0, blocks = 0;
  auto flush = [&] {
    if (blocks > 0) launch(table, blocks);
    tensors = blocks = 0;
  };
  for (size_t i = 0; i < lists[0]->size(); ++i) {
    const int64_t n = (*lists[0])[i].numel();
    if (n == 0) continue;
    if (tensors == kTensors) flush();
    const int t = tensors++;
    for (int k = 0; k < N; ++k) {
      table.ptr[k][t] = lists[k] ? (*lists[k])[i].template ptr<T>() : nullptr;
    }
    table.n[t] = n;
    for (int64_t chunk = 0; chunk * kChunk < n; ++chunk) {
      if (blocks == kBlocks) {
        // The table is full: launch it, and carry this tensor on into a fresh one.
        flush();
        for (int k = 0; k < N; ++k) table.ptr[k][0] = table.ptr[k][t];
        table.n[0] = table.n[t];
        tensors = 1;
      }
      table.block_tensor[blocks] = static_cast<unsigned char>(tensors - 1);
      table.block_chunk[blocks] = static_cast<int>(chunk);
      ++blocks;
    }
  }
  flush();
}

// ---- kernels ----

// The block's threads call vec(i) for each whole 16-byte vector i (in units of V elements) of
// [begin, end) when `aligned`, then elem(i) for each element left: all of them when not aligned.
template <int V, typename VecFn, typename ElemFn>
__device__ inline void vectors_then_tail(int64_t begin, int64_t end, bool aligned, const VecFn& vec,
                                         const ElemFn& elem) {
  int64_t tail = begin;
  if (aligned) {
    const int64_t vectors = (end - begin) / V;
    for (int64_t k = threadIdx.x; k < vectors; k += blockDim.x) vec(begin / V + k);
    tail = begin + vectors * V;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) elem(i);
}

// Adam's lists: p, g, m, v, vmax (vmax absent unless amsgrad). When the tensor's buffers are all
// 16-byte aligned (those of the caching allocator are), in 16-byte vectors up to the chunk's last
// whole vector, then one by one.
template <typename T>
__global__ void adam_kernel(TensorTable<T, 5> table, math::AdamCoefficients<T> c) {
  constexpr int V = Vec16<T>::kSize;
  int64_t begin, end;
  const int t = block_range(table, begin, end);
  T* p = table.ptr[0][t];
  const T* g = table.ptr[1][t];
  T* m = table.ptr[2][t];
  T* v = table.ptr[3][t];
  T* vmax = table.ptr[4][t];
  const bool aligned = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!vmax || aligned16(vmax));
  vectors_then_tail<V>(
      begin, end, aligned,
      [&](int64_t i) {
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
      },
      [&](int64_t i) {
        T pi = p[i], mi = m[i], vi = v[i];
        math::adam_update(pi, g[i], mi, vi, vmax ? vmax + i : nullptr, c);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
      });
}

// SGD's lists: p, g, buf (buf absent without momentum; only written on the first step). Vectors
// where aligned, as adam_kernel.
template <typename T, bool kMomentum, bool kNesterov, bool kFirstStep>
__global__ void sgd_kernel(TensorTable<T, 3> table, math::SgdCoefficients<T> c) {
  constexpr int V = Vec16<T>::kSize;
  int64_t begin, end;
  const int t = block_range(table, begin, end);
  T* p = table.ptr[0][t];
  const T* g = table.ptr[1][t];
  T* buf = table.ptr[2][t];
  vectors_then_tail<V>(
      begin, end, aligned16(p) && aligned16(g) && (!kMomentum || aligned16(buf)),
      [&](int64_t i) {
        Vec16<T> pv = reinterpret_cast<Vec16<T>*>(p)[i], bv{};
        const Vec16<T> gv = reinterpret_cast<const Vec16<T>*>(g)[i];
        if constexpr (kMomentum && !kFirstStep) bv = reinterpret_cast<Vec16<T>*>(buf)[i];
        KILN_CUDA_UNROLL
        for (int e = 0; e < V; ++e) {
          math::sgd_update<kMomentum, kNesterov, kFirstStep>(pv.v[e], gv.v[e], &bv.v[e], c);
        }
        reinterpret_cast<Vec16<T>*>(p)[i] = pv;
        if constexpr (kMomentum) reinterpret_cast<Vec16<T>*>(buf)[i] = bv;
      },
      [&](int64_t i) {
        T pi = p[i];
        math::sgd_update<kMomentum, kNesterov, kFirstStep>(pi, g[i], kMomentum ? buf + i : nullptr, c);
        p[i] = pi;
      });
}

// ---- launchers ----

template <typename T>
void adam_typed(const std::vector<View>& params, const std::vector<View>& grads, const std::vector<View>& exp_avgs,
                const std::vector<View>& exp_avg_sqs, const std::vector<View>& max_exp_avg_sqs,
                const AdamStepArgs& args, cudaStream_t stream) {
  const math::AdamCoefficients<T> c = math::adam_coefficients<T>(args);
  const std::vector<View>* vmax = args.amsgrad ? &max_exp_avg_sqs : nullptr;
  for_each_table<T, 5>({&params, &grads, &exp_avgs, &exp_avg_sqs, vmax},
                       [&](const TensorTable<T, 5>& table, int blocks) {
                         adam_kernel<T><<<blocks, kThreads, 0, stream>>>(table, c);
                         KILN_CUDA_CHECK(cudaGetLastError());
                       });
}

template <typename T, bool kMomentum, bool kNesterov, bool kFirstStep>
void sgd_typed(const std::vector<View>& params, const std::vector<View>& grads,
               const std::vector<View>& momentum_buffers, const SgdStepArgs& args,
               cudaStream_t stream) {
  const math::SgdCoefficients<T> c = math::sgd_coefficients<T>(args);
  const std::vector<View>* buf = kMomentum ? &momentum_buffers : nullptr;
  for_each_table<T, 3>({&params, &grads, buf}, [&](const TensorTable<T, 3>& table, int blocks) {
    sgd_kernel<T, kMomentum, kNesterov, kFirstStep><<<blocks, kThreads, 0, stream>>>(table, c);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
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

void sgd_step_launch(const std::vector<View>& params, const std::vector<View>& grads,
                     const std::vector<View>& momentum_buffers, const SgdStepArgs& args,
                     const Stream& s) {
  if (params.empty()) return;  // as adam_step_launch
  KILN_DISPATCH_F32_F64(params[0].dtype, "sgd_step", [&] {
    math::with_sgd_flags(args, [&](auto momentum, auto nesterov, auto first_step) {
      sgd_typed<scalar_t, decltype(momentum)::value, decltype(nesterov)::value,
                decltype(first_step)::value>(params, grads, momentum_buffers, args, stream_of(s));
    });
  });
}

}  // namespace kiln::cuda

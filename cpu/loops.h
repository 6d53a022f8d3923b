// cpu/loops.h: how CPU kernels walk strided views (private to cpu/).
//
// StridedLoop<N> takes N views of one shape (the output first), drops size-1 dims and merges
// neighbouring dims that are contiguous in every view, so a contiguous tensor of any rank becomes
// one flat run. run(begin, end, inner) then visits the flattened element range [begin, end) as a
// sequence of runs along the innermost dim: inner(ptrs, byte_strides, n). Kernels write `inner` for
// the fast case (all byte strides equal to the item sizes) and the general one.
#pragma once

#include <array>
#include <cstdint>

#include "core/backend.h"
#include "cpu/parallel.h"

namespace kiln::cpu {

inline constexpr int64_t kGrain = 32768;  // elements below which an elementwise op stays on one thread

template <int N>
class StridedLoop {
 public:
  explicit StridedLoop(const std::array<const View*, N>& views) {
    const View& first = *views[0];
    for (int k = 0; k < N; ++k) base_[k] = static_cast<char*>(views[k]->data);
    if (first.numel() == 0) {  // nothing to visit; its other dims' strides in bytes may pass 2^63
      ndim_ = 1;
      return;
    }
    // Innermost dim last; keep dims of size > 1 only.
    for (int d = 0; d < first.ndim(); ++d) {
      if (first.sizes[d] == 1) continue;
      sizes_[ndim_] = first.sizes[d];
      for (int k = 0; k < N; ++k) strides_[k][ndim_] = views[k]->strides[d] * itemsize(views[k]->dtype);
      ++ndim_;
    }
    // Merge dim i into i+1 when, for every view, stepping dim i equals stepping i+1 size times.
    int out = 0;
    for (int d = 1; d < ndim_; ++d) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable &= strides_[k][out] == strides_[k][d] * sizes_[d];
      if (mergeable) {
        sizes_[out] *= sizes_[d];
        for (int k = 0; k < N; ++k) strides_[k][out] = strides_[k][d];
      } else {
        ++out;
        sizes_[out] = sizes_[d];
        for (int k = 0; k < N; ++k) strides_[k][out] = strides_[k][d];
      }
    }
    if (ndim_ > 0) ndim_ = out + 1;
    if (ndim_ == 0) {  // a single element
      ndim_ = 1;
      sizes_[0] = first.numel();
      for (int k = 0; k < N; ++k) strides_[k][0] = 0;
    }
    numel_ = 1;
    for (int d = 0; d < ndim_; ++d) numel_ *= sizes_[d];
  }

  int64_t numel() const { return numel_; }
  int ndim() const { return ndim_; }
  int64_t inner_size() const { return sizes_[ndim_ - 1]; }
  int64_t inner_stride(int k) const { return strides_[k][ndim_ - 1]; }

  // inner(char* const* ptrs, const int64_t* byte_strides, int64_t n)
  template <typename F>
  void run(int64_t begin, int64_t end, F&& inner) const {
    if (begin >= end) return;
    const int last = ndim_ - 1;
    int64_t idx[kMaxDims];
    int64_t rem = begin;
    for (int d = last; d >= 0; --d) {
      idx[d] = rem % sizes_[d];
      rem /= sizes_[d];
    }
    std::array<char*, N> ptrs;
    for (int k = 0; k < N; ++k) {
      ptrs[k] = base_[k];
      for (int d = 0; d <= last; ++d) ptrs[k] += idx[d] * strides_[k][d];
    }
    std::array<int64_t, N> inner_strides;
    for (int k = 0; k < N; ++k) inner_strides[k] = strides_[k][last];
    int64_t pos = begin;
    while (pos < end) {
      int64_t n = std::min(sizes_[last] - idx[last], end - pos);
      inner(ptrs.data(), inner_strides.data(), n);
      pos += n;
      if (pos >= end) break;
      // Advance: the inner dim wrapped; carry into the outer dims.
      for (int k = 0; k < N; ++k) ptrs[k] += n * strides_[k][last];
      idx[last] += n;
      for (int d = last; d > 0 && idx[d] == sizes_[d]; --d) {
        for (int k = 0; k < N; ++k) ptrs[k] += strides_[k][d - 1] - sizes_[d] * strides_[k][d];
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  }

  // The same walk over data shifted by a byte offset per view (one output's slice, say).
  StridedLoop shifted(const std::array<int64_t, N>& byte_offsets) const {
    StridedLoop copy = *this;
    for (int k = 0; k < N; ++k) copy.base_[k] += byte_offsets[k];
    return copy;
  }

  // run() over [0, numel) cut across the pool.
  template <typename F>
  void parallel_run(F&& inner, int64_t grain = kGrain) const {
    parallel_for(0, numel_, grain, [&](int64_t b, int64_t e) { run(b, e, inner); });
  }

 private:
  int ndim_ = 0;
  int64_t numel_ = 0;
  int64_t sizes_[kMaxDims] = {};
  int64_t strides_[N][kMaxDims] = {};
  char* base_[N] = {};
};

// Element access by byte offset.
template <typename T> inline T& at(char* p, int64_t byte_offset) {
  return *reinterpret_cast<T*>(p + byte_offset);
}

}  // namespace kiln::cpu

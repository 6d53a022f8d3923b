// core/shape.h: Shape, a small fixed-capacity list of int64 used for sizes and strides.
//
// Kiln tensors have at most kMaxDims dimensions. Keeping sizes and strides inline (no heap)
// is what lets a tiny op cost a fraction of a microsecond. Strides count elements, not bytes.
//
// Note [copying a fresh Shape]
// A Shape is copied whole, in 16-byte moves. A Shape just filled entry by entry (8-byte stores) and
// copied at once makes the CPU's 16-byte loads wait for those stores to reach the cache (a failed
// store-to-load forward). On a Zen 1, perf put about 8% of op_overhead's samples on such loads, where
// broadcast_view and every new tensor built their strides in a temporary and copied it; writing them
// in place took an add without grad on [64] elements from 0.37-0.39 to 0.35 us. Where a Shape is
// made for each op, write it where it will stay (set_contiguous_strides, resize in place).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace kiln {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.size()); }  // NOLINT
  Shape(const std::vector<int64_t>& dims) { assign(dims.data(), dims.size()); }      // NOLINT
  Shape(std::span<const int64_t> dims) { assign(dims.data(), dims.size()); }         // NOLINT
  static Shape filled(int n, int64_t value) {
    Shape s;
    s.resize(n, value);
    return s;
  }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  const int64_t* data() const { return d_; }
  int64_t back() const {
    KILN_CHECK(n_ > 0, "Shape::back: the shape is empty (no dimensions)");
    return d_[n_ - 1];
  }

  void push_back(int64_t v) {
    check_capacity(n_ + 1);
    d_[n_++] = v;
  }
  void insert(int pos, int64_t v) {
    check_capacity(n_ + 1);
    KILN_CHECK(pos >= 0 && pos <= n_, "Shape::insert: position {} is out of range for a shape of {} dims (0..{})",
               pos, n_, n_);
    for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
    ++n_;
  }
  void erase(int pos) {
    KILN_CHECK(pos >= 0 && pos < n_, "Shape::erase: position {} is out of range for a shape of {} dims", pos, n_);
    for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
    d_[--n_] = 0;  // no stale entry past the end (operator== and copies compare only n_ entries)
  }
  void resize(int n, int64_t fill = 0) {
    check_capacity(n);
    for (int i = n_; i < n; ++i) d_[i] = fill;
    n_ = n;
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  operator std::span<const int64_t>() const { return {d_, static_cast<size_t>(n_)}; }  // NOLINT

  int64_t numel() const {  // product of the entries; 1 for an empty shape (a scalar)
    // In uint64: a shape with a 0 may hold dims whose product, taken before the 0, passes 2^63
    // (the permuted view of zeros({0, 1LL << 62, 4})); a tensor with elements has fewer than 2^63.
    uint64_t n = 1;
    for (int i = 0; i < n_; ++i) n *= static_cast<uint64_t>(d_[i]);
    return static_cast<int64_t>(n);
  }
  std::string str() const;  // "[2, 3]"

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.n_ != b.n_) return false;
    for (int i = 0; i < a.n_; ++i)
      if (a.d_[i] != b.d_[i]) return false;
    return true;
  }

 private:
  void assign(const int64_t* p, size_t n) {
    check_capacity(static_cast<int64_t>(n));
    n_ = static_cast<int>(n);
    for (int i = 0; i < n_; ++i) d_[i] = p[i];
  }
  static void check_capacity(int64_t n) {
    KILN_CHECK(n >= 0 && n <= kMaxDims, "Kiln tensors have 0 to {} dimensions; {} were asked for", kMaxDims, n);
  }

  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

// Row-major (C-contiguous) strides of a shape. The second form writes them into `strides` in place,
// for the paths that make every tensor: see Note [copying a fresh Shape].
Shape contiguous_strides(const Shape& sizes);
void set_contiguous_strides(const Shape& sizes, Shape& strides);

// Wraps a possibly negative dim into [0, ndim) or throws, naming the op: "sum: dim 3 is out of
// range for a tensor of 2 dimensions (expected -2..1)". ndim 0 accepts dims -1 and 0, as PyTorch.
int wrap_dim(int64_t dim, int ndim, const char* op);

}  // namespace kiln

// cpu/reduce.cpp: reductions (sum, prod, max, min, argmax, argmin, all, any) over any set of dims,
// and softmax / log_softmax (a row reduction followed by a map). CUDA sibling: cuda/reduce.cu.
//
// Two walks, chosen by where the reduced dims lie in memory:
//  - "inner": the reduced dims include the input's fastest-moving dim (sum over the last dim, or over
//    everything). Each output reduces its own slice in one pass; outputs are split across threads,
//    or, for one output, the slice is cut into pieces whose partial results merge in order.
//  - "outer": the fastest dim is kept (sum over the batch dim of (B, C)). Rows of the input are
//    added into a row of accumulators, which keeps memory access sequential.
// Floating sums and products accumulate in double, so results do not depend on the thread count
// beyond double rounding; integer ones in int64.
#include <Eigen/Core>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/convert.h"
#include "core/scalar_math.h"
#include "cpu/exact_math.h"
#include "cpu/kernels.h"
#include "cpu/loops.h"

namespace kiln::cpu {
namespace {

template <typename T>
using wide_t = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, double, int64_t>;

// An integer sum or product wraps as two's complement, as PyTorch's (math::wrap_add: in the signed
// type the overflow would be undefined).
template <typename A>
A add_wrapping(A a, A b) {
  if constexpr (std::is_integral_v<A>) return math::wrap_add(a, b);
  else return a + b;
}
template <typename A>
A mul_wrapping(A a, A b) {
  if constexpr (std::is_integral_v<A>) return math::wrap_mul(a, b);
  else return a * b;
}
template <typename T> struct SumR {
  using acc_t = wide_t<T>;
  using out_t = T;
  static acc_t init() { return 0; }
  static void update(acc_t& a, T x, int64_t) { a = add_wrapping(a, static_cast<acc_t>(static_cast<opmath_t<T>>(x))); }
  static void merge(acc_t& a, const acc_t& b) { a = add_wrapping(a, b); }
  static out_t result(acc_t a) { return static_cast<T>(static_cast<opmath_t<T>>(a)); }
};
template <typename T> struct ProdR {
  using acc_t = wide_t<T>;
  using out_t = T;
  static acc_t init() { return 1; }
  static void update(acc_t& a, T x, int64_t) { a = mul_wrapping(a, static_cast<acc_t>(static_cast<opmath_t<T>>(x))); }
  static void merge(acc_t& a, const acc_t& b) { a = mul_wrapping(a, b); }
  static out_t result(acc_t a) { return static_cast<T>(static_cast<opmath_t<T>>(a)); }
};
// Max (kMax true) or min; NaN wins, as in PyTorch.
template <typename T, bool kMax> struct ExtremeR {
  using M = opmath_t<T>;
  using acc_t = M;
  using out_t = T;
  static acc_t init() {
    if constexpr (std::is_floating_point_v<M>) return kMax ? -std::numeric_limits<M>::infinity() : std::numeric_limits<M>::infinity();
    else return kMax ? std::numeric_limits<M>::lowest() : std::numeric_limits<M>::max();
  }
  static bool better(M x, M a) {
    if (x != x) return a == a;  // x is NaN and a is not yet
    return kMax ? x > a : x < a;
  }
  static void update(acc_t& a, T x, int64_t) {
    M v = static_cast<M>(x);
    if (better(v, a)) a = v;
  }
  static void merge(acc_t& a, const acc_t& b) {
    if (better(b, a)) a = b;
  }
  static out_t result(acc_t a) { return static_cast<T>(a); }
};
// The index of the first max (or min); NaN counts as the largest, as in PyTorch.
template <typename T, bool kMax> struct ArgR {
  using M = opmath_t<T>;
  struct acc_t {
    M value;
    int64_t index;
  };
  using out_t = int64_t;
  static acc_t init() { return {ExtremeR<T, kMax>::init(), -1}; }
  static void update(acc_t& a, T x, int64_t i) {
    M v = static_cast<M>(x);
    if (a.index < 0 || ExtremeR<T, kMax>::better(v, a.value)) a = {v, i};
  }
  static void merge(acc_t& a, const acc_t& b) {
    if (b.index >= 0 && (a.index < 0 || ExtremeR<T, kMax>::better(b.value, a.value))) a = b;
  }
  static out_t result(acc_t a) { return a.index < 0 ? 0 : a.index; }
};
template <bool kAll> struct LogicalR {
  using acc_t = bool;
  using out_t = bool;
  static acc_t init() { return kAll; }
  static void update(acc_t& a, bool x, int64_t) { a = kAll ? (a && x) : (a || x); }
  static void merge(acc_t& a, const acc_t& b) { a = kAll ? (a && b) : (a || b); }
  static out_t result(acc_t a) { return a; }
};

struct Plan {
  View kept;        // the kept dims: sizes, input strides (in elements); data = in.data
  Shape kept_out_strides;
  View reduced;     // the reduced dims: sizes and input strides
  bool inner = true;
  int fastest = -1;  // the input's fastest-moving dim of size > 1
};

Plan make_plan(const View& in, const View& out) {
  Plan p;
  p.kept.data = p.reduced.data = in.data;
  p.kept.dtype = p.reduced.dtype = in.dtype;
  int fastest = -1;
  for (int d = 0; d < in.ndim(); ++d) {
    if (in.sizes[d] == 1) continue;
    if (fastest < 0 || std::llabs(in.strides[d]) < std::llabs(in.strides[fastest])) fastest = d;
    bool reduced = out.sizes[d] == 1;
    if (reduced) {
      p.reduced.sizes.push_back(in.sizes[d]);
      p.reduced.strides.push_back(in.strides[d]);
    } else {
      p.kept.sizes.push_back(in.sizes[d]);
      p.kept.strides.push_back(in.strides[d]);
      p.kept_out_strides.push_back(out.strides[d]);
    }
  }
  p.inner = fastest < 0 || out.sizes[fastest] == 1;
  p.fastest = fastest;
  return p;
}

// The sum of a contiguous run of floats (16-bit ones widened through float32) in double, in eight
// independent lanes: one chain of dependent double adds would cost ~4 cycles an element; eight
// chains vectorize. (The bias gradient of a bfloat16 convolution under autocast took 13% of the CNN
// step on the scalar chain.)
template <typename T>
double sum_lanes(const T* x, int64_t n) {
  auto wide = [](T v) { return static_cast<double>(static_cast<opmath_t<T>>(v)); };
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += wide(x[i + j]);
  }
  double tail = 0;
  for (; i < n; ++i) tail += wide(x[i]);
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7])) + tail;
}

// sum_lanes, but doubles themselves have no wider type to add in, so a long run of them is summed
// in halves, pairwise down to 4096 elements: the rounding error grows with log n, not n (1e7 times
// 0.1 was 1e-11 off, as PyTorch's cascade sum is not).
template <typename T>
double sum_run(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, double>) {
    if (n > 4096) {
      const int64_t half = n / 16 * 8;
      return sum_run(x, half) + sum_run(x + half, n - half);
    }
  }
  return sum_lanes(x, n);
}

// One output's slice, reduced over [begin, end) of its flattened reduced index.
template <typename R, typename T>
typename R::acc_t reduce_slice(const StridedLoop<1>& loop, int64_t begin, int64_t end) {
  typename R::acc_t acc = R::init();
  int64_t pos = begin;
  loop.run(begin, end, [&](char* const* p, const int64_t* s, int64_t n) {
    const char* x = p[0];
    if constexpr (std::is_same_v<R, SumR<T>> && std::is_floating_point_v<opmath_t<T>>) {
      if (s[0] == static_cast<int64_t>(sizeof(T))) {
        acc += sum_run(reinterpret_cast<const T*>(x), n);
        pos += n;
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) R::update(acc, at<T>(const_cast<char*>(x), i * s[0]), pos + i);
    pos += n;
  });
  return acc;
}

template <typename R, typename T>
void reduce_inner(const Plan& plan, const View& out) {
  using out_t = typename R::out_t;
  StridedLoop<1> slice({&plan.reduced});
  const int64_t slice_len = plan.reduced.numel();
  const int64_t outputs = plan.kept.numel();
  const int64_t in_item = itemsize(plan.kept.dtype);
  if (outputs == 1) {  // one output: cut the slice into pieces, merge the partials in order
    int pieces = parallel_pieces(slice_len, kGrain);
    std::vector<typename R::acc_t> partial(static_cast<size_t>(pieces), R::init());
    parallel_for(0, pieces, 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        partial[k] = reduce_slice<R, T>(slice, slice_len * k / pieces, slice_len * (k + 1) / pieces);
      }
    });
    typename R::acc_t acc = partial[0];
    for (int k = 1; k < pieces; ++k) R::merge(acc, partial[k]);
    *out.ptr<out_t>() = R::result(acc);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(slice_len, 1));
  parallel_for(0, outputs, grain, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      int64_t rem = k, in_off = 0, out_off = 0;
      for (int d = plan.kept.ndim() - 1; d >= 0; --d) {
        int64_t i = rem % plan.kept.sizes[d];
        rem /= plan.kept.sizes[d];
        in_off += i * plan.kept.strides[d];
        out_off += i * plan.kept_out_strides[d];
      }
      auto acc = reduce_slice<R, T>(slice.shifted({in_off * in_item}), 0, slice_len);
      out.ptr<out_t>()[out_off] = R::result(acc);
    }
  });
}

// Outer reductions: accumulate every input element into acc[its output], walking the input in
// memory order. (reduce_with splits the kept fastest dim across threads: disjoint outputs, and each
// output still sums its inputs in the same order, whatever the thread count.)
template <typename R, typename T>
void reduce_outer(const View& in, const View& out) {
  using acc_t = typename R::acc_t;
  using out_t = typename R::out_t;
  // unique_ptr rather than vector: vector<bool> has no data().
  const int64_t n_out = out.numel();
  std::unique_ptr<acc_t[]> acc(new acc_t[static_cast<size_t>(n_out)]);
  for (int64_t i = 0; i < n_out; ++i) acc[i] = R::init();
  View acc_view;  // acc laid out as `out` contiguous, broadcast (stride 0) over the reduced dims
  acc_view.data = acc.get();
  acc_view.dtype = in.dtype;  // only its item size is used below; fixed by the byte strides
  acc_view.sizes = in.sizes;
  Shape acc_strides = contiguous_strides(out.sizes);
  acc_view.strides = Shape::filled(in.ndim(), 0);
  for (int d = 0; d < in.ndim(); ++d) {
    if (out.sizes[d] != 1) {
      acc_view.strides[d] = acc_strides[d] * static_cast<int64_t>(sizeof(acc_t)) / itemsize(in.dtype);
    }
  }
  // acc strides in units of in's item size must be exact: sizeof(acc_t) is a multiple of it.
  StridedLoop<2> loop({&acc_view, &in});
  loop.run(0, loop.numel(), [](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<R, SumR<T>>) {
      // A contiguous row into contiguous accumulators (the bias gradient's column sums): the same
      // adds as R::update, in a loop the compiler vectorizes (the generic one was 8% of a bfloat16
      // GPT step).
      if (s[0] == static_cast<int64_t>(sizeof(acc_t)) && s[1] == static_cast<int64_t>(sizeof(T))) {
        acc_t* a = reinterpret_cast<acc_t*>(p[0]);
        const T* x = reinterpret_cast<const T*>(p[1]);
        for (int64_t i = 0; i < n; ++i) R::update(a[i], x[i], 0);
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) R::update(at<acc_t>(p[0], i * s[0]), at<T>(p[1], i * s[1]), 0);
  });
  StridedLoop<1> out_loop({&out});
  int64_t k = 0;
  out_loop.run(0, out_loop.numel(), [&](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) at<out_t>(p[0], i * s[0]) = R::result(acc[k++]);
  });
}

template <typename R, typename T>
void reduce_with(const View& in, const View& out, bool allow_outer) {
  Plan plan = make_plan(in, out);
  if (!plan.inner && allow_outer && sizeof(typename R::acc_t) % itemsize(in.dtype) == 0) {
    // Cut the kept fastest dim into column blocks, one reduce_outer per block and thread.
    const int f = plan.fastest;
    const int64_t cols = in.sizes[f], per_col = in.numel() / std::max<int64_t>(cols, 1);
    parallel_for(0, cols, std::max<int64_t>(1, kGrain / std::max<int64_t>(per_col, 1)), [&](int64_t c0, int64_t c1) {
      View in_block = in, out_block = out;
      in_block.data = static_cast<char*>(in.data) + c0 * in.strides[f] * itemsize(in.dtype);
      out_block.data = static_cast<char*>(out.data) + c0 * out.strides[f] * itemsize(out.dtype);
      in_block.sizes[f] = out_block.sizes[f] = c1 - c0;
      reduce_outer<R, T>(in_block, out_block);
    });
  } else {
    reduce_inner<R, T>(plan, out);
  }
}

}  // namespace

void reduce_kernel(ReduceKind op, const View& in, const View& out) {
  // No output elements, nothing to write: and the strides of an empty shape with a huge dim beside its
  // 0 ([0, 2^62], the gradient of tile or repeat of such a tensor) would overflow in the plans below.
  if (out.numel() == 0) return;
  if (op == ReduceKind::All || op == ReduceKind::Any) {
    KILN_CHECK(in.dtype == kBool, "all/any: the CPU kernel expects bool input");
    if (op == ReduceKind::All) reduce_with<LogicalR<true>, bool>(in, out, true);
    else reduce_with<LogicalR<false>, bool>(in, out, true);
    return;
  }
  KILN_DISPATCH_NUMERIC_TYPES(in.dtype, "reduce", [&] {
    using T = scalar_t;
    switch (op) {
      case ReduceKind::Sum: return reduce_with<SumR<T>, T>(in, out, true);
      case ReduceKind::Prod: return reduce_with<ProdR<T>, T>(in, out, true);
      case ReduceKind::Max: return reduce_with<ExtremeR<T, true>, T>(in, out, true);
      case ReduceKind::Min: return reduce_with<ExtremeR<T, false>, T>(in, out, true);
      case ReduceKind::ArgMax: return reduce_with<ArgR<T, true>, T>(in, out, false);
      case ReduceKind::ArgMin: return reduce_with<ArgR<T, false>, T>(in, out, false);
      default: KILN_FAIL("reduce: unexpected op");
    }
  });
}

// ======== softmax ========
// softmax and log_softmax along one dim, one row at a time: max, sum of exp(x - max), then the
// output. Rows are split across threads. Contiguous float32/float64 rows use Eigen's vectorized exp;
// other rows are gathered into a float/double buffer first.

namespace {

template <typename M>
void softmax_row(Eigen::Ref<Eigen::Array<M, Eigen::Dynamic, 1>> x, bool log) {
  if (x.size() == 0) return;
  M mx = x.maxCoeff();
  if (std::isinf(mx) && mx < 0) mx = 0;  // a row of -inf: exp(-inf - 0) = 0, as PyTorch gives nan
  if (log) {  // (x - max) - log(sum): subtracting max first keeps the low bits of large inputs
    x -= mx;
    x -= std::log(exact_exp(x).sum());
  } else {
    x = exact_exp(x - mx);
    x /= x.sum();
  }
}

template <typename T>
void softmax_typed(const View& in, const View& out, int dim, bool log) {
  using M = opmath_t<T>;
  const int64_t len = in.sizes[dim], in_step = in.strides[dim], out_step = out.strides[dim];
  View rows_in = in, rows_out = out;  // every index but `dim`
  rows_in.sizes[dim] = rows_out.sizes[dim] = 1;
  const int64_t rows = rows_in.numel();
  const int nd = in.ndim();
  parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)), [&](int64_t b, int64_t e) {
    Eigen::Array<M, Eigen::Dynamic, 1> buf(len);
    for (int64_t r = b; r < e; ++r) {
      int64_t rem = r, oi = 0, oo = 0;
      for (int d = nd - 1; d >= 0; --d) {
        int64_t i = rem % rows_in.sizes[d];
        rem /= rows_in.sizes[d];
        oi += i * in.strides[d];
        oo += i * out.strides[d];
      }
      const T* x = in.ptr<T>() + oi;
      T* y = out.ptr<T>() + oo;
      if constexpr (std::is_same_v<T, M>) {
        if (out_step == 1) {  // compute in place in the output row
          Eigen::Map<Eigen::Array<M, Eigen::Dynamic, 1>> row(y, len);
          if (in_step == 1) row = Eigen::Map<const Eigen::Array<M, Eigen::Dynamic, 1>>(x, len);
          else for (int64_t i = 0; i < len; ++i) row[i] = x[i * in_step];
          softmax_row<M>(row, log);
          continue;
        }
      }
      for (int64_t i = 0; i < len; ++i) buf[i] = static_cast<M>(x[i * in_step]);
      softmax_row<M>(buf, log);
      for (int64_t i = 0; i < len; ++i) y[i * out_step] = static_cast<T>(buf[i]);
    }
  });
}

}  // namespace

void softmax_kernel(const View& in, const View& out, int dim, bool log) {
  KILN_DISPATCH_FLOAT_TYPES(in.dtype, "softmax", [&] { softmax_typed<scalar_t>(in, out, dim, log); });
}

// ======== softmax backward ========
// One row at a time, as the forward: the row's sum (of g * y, or of g for log_softmax), then the
// gradient. Rows are read into opmath buffers (a float32/float64 row along a contiguous dim is used
// where it lies) so that Eigen's vectorized sum, exp and products apply.

namespace {

template <typename T>
void softmax_backward_typed(const View& y, const View& g, const View& out, int dim, bool log) {
  using M = opmath_t<T>;
  using Row = Eigen::Array<M, Eigen::Dynamic, 1>;
  const int64_t len = out.sizes[dim];
  const int64_t y_step = y.strides[dim], g_step = g.strides[dim], out_step = out.strides[dim];
  View rows = out;  // every index but `dim`
  rows.sizes[dim] = 1;
  const int64_t n_rows = rows.numel();
  const int nd = out.ndim();
  parallel_for(0, n_rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)), [&](int64_t b, int64_t e) {
    Row ybuf(len), gbuf(len), obuf(len);
    for (int64_t r = b; r < e; ++r) {
      int64_t rem = r, oy = 0, og = 0, oo = 0;
      for (int d = nd - 1; d >= 0; --d) {
        const int64_t i = rem % rows.sizes[d];
        rem /= rows.sizes[d];
        oy += i * y.strides[d];
        og += i * g.strides[d];
        oo += i * out.strides[d];
      }
      const T* yp = y.ptr<T>() + oy;
      const T* gp = g.ptr<T>() + og;
      T* op = out.ptr<T>() + oo;
      // A row in place when it is contiguous and already of type M; else a copy in the buffer.
      auto row_of = [len](const T* p, int64_t step, Row& buf) -> Eigen::Map<const Row> {
        if constexpr (std::is_same_v<T, M>) {
          if (step == 1) return Eigen::Map<const Row>(p, len);
        }
        for (int64_t i = 0; i < len; ++i) buf[i] = static_cast<M>(p[i * step]);
        return Eigen::Map<const Row>(buf.data(), len);
      };
      const Eigen::Map<const Row> yr = row_of(yp, y_step, ybuf), gr = row_of(gp, g_step, gbuf);
      if (log) {
        obuf = gr - exact_exp(yr) * gr.sum();  // d log_softmax: g - softmax * sum(g)
      } else {
        obuf = yr * (gr - (gr * yr).sum());  // d softmax: y * (g - <g, y>)
      }
      for (int64_t i = 0; i < len; ++i) op[i * out_step] = static_cast<T>(obuf[i]);
    }
  });
}

}  // namespace

void softmax_backward_kernel(const View& y, const View& g, const View& out, int dim, bool log) {
  KILN_DISPATCH_FLOAT_TYPES(out.dtype, "softmax backward",
                            [&] { softmax_backward_typed<scalar_t>(y, g, out, dim, log); });
}

}  // namespace kiln::cpu

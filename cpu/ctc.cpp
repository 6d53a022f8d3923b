// cpu/ctc.cpp: CTC's recursions (Graves et al., 2006) in log space, one sample per task of the pool:
// the forward (alpha) gives each sample's negative log-likelihood and keeps alpha for the backward,
// which runs the same recursion from the last frame back (beta) and writes each frame's gradient
// from alpha beta. Backend::ctc_loss in core/backend.h has the formulas; ops/ctc.cpp calls these while
// fusion is on, and nn::ctc_loss composes the same recursion from ops otherwise (Note [ctc as ops] in
// nn/loss.cpp). CUDA sibling: cuda/ctc.cu.
//
// The arguments are checked here, where the targets and lengths are read anyway: a length out of
// range or a label that is not a class index is an Error (raised from the pool's thread, rethrown
// by parallel_for), never a read out of bounds.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "cpu/exact_math.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace kiln::cpu {
namespace {

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// log(exp(a) + exp(b)), -inf when both terms are.
template <typename T>
T log_add(T a, T b) {
  if (a < b) std::swap(a, b);
  return b == kNegInf<T> ? a : a + std::log1p(std::exp(b - a));
}

// Sample n's extended target l' = (blank, l_1, blank, ..., l_S, blank): 2 S + 1 states.
struct Extended {
  const int64_t* labels;  // l_1 .. l_S
  int64_t blank;
  int64_t states;
  int64_t operator[](int64_t s) const { return s % 2 == 0 ? blank : labels[s / 2]; }
  // Whether state s may be entered from s - 2, skipping the blank between: a label unlike the one
  // before it (never a blank, and never the first label, which has no label before it).
  bool skips(int64_t s) const {
    return s % 2 == 1 && s >= 3 && labels[s / 2] != blank && labels[s / 2] != labels[s / 2 - 1];
  }
};

// The geometry of one call, and sample n's lengths checked against it.
struct Ctc {
  int64_t frames, samples, classes, longest, blank;
  const int64_t* targets;  // (N, S)
  const int64_t* input_lengths;
  const int64_t* target_lengths;

  int64_t row() const { return 2 * longest + 1; }  // log_alpha's and log_beta's last dim
  int64_t frames_of(int64_t n) const {
    const int64_t t = input_lengths[n];
    KILN_CHECK(t >= 0 && t <= frames,
               "ctc_loss: input_lengths[{}] is {}; it must be in [0, {}], the frames of log_probs", n, t, frames);
    return t;
  }
  Extended target_of(int64_t n) const {
    const int64_t length = target_lengths[n];
    KILN_CHECK(length >= 0 && length <= longest,
               "ctc_loss: target_lengths[{}] is {}; it must be in [0, {}], the targets' columns", n, length, longest);
    const int64_t* labels = targets + n * longest;
    for (int64_t i = 0; i < length; ++i) {
      KILN_CHECK(labels[i] >= 0 && labels[i] < classes,
                 "ctc_loss: target {} of sample {} is {}, not a class index in [0, {})", i, n, labels[i], classes);
    }
    return Extended{labels, blank, 2 * length + 1};
  }
};

Ctc geometry(const View& log_probs, const View& targets, const View& input_lengths, const View& target_lengths,
             int64_t blank) {
  return Ctc{
      log_probs.sizes[0],     log_probs.sizes[1],           log_probs.sizes[2],           targets.sizes[1], blank,
      targets.ptr<int64_t>(), input_lengths.ptr<int64_t>(), target_lengths.ptr<int64_t>()};
}

// Note [ctc rows in vector lanes]
// A frame's states depend only on the previous frame's (the next frame's for beta), so a frame is one
// row operation: the previous row read at s, s - 1 and s - 2 (copied after two -inf, so that the
// shifted reads start before the row) with -inf added where state s is not entered by a skip, their
// log-sum-exp as m + log(exp(a - m) + exp(b - m) + exp(c - m)) through exact_exp and exact_log in
// vector lanes (m taken as 0 where all three are -inf, which keeps the result -inf without NaN), plus
// the frame's log-probabilities of the states' classes. The gradient adds, into each state's class,
// exp(alpha + beta + nll - log_probs), the posterior of passing through that state (at most 1, so
// it is summed as it is, not in log space); a class no state has gets 0.
template <typename T>
using Row = Eigen::Array<T, Eigen::Dynamic, 1>;
template <typename T>
using RowMap = Eigen::Map<Row<T>>;
template <typename T>
using ConstRowMap = Eigen::Map<const Row<T>>;

// log(exp(a) + exp(b) + exp(c)) of three rows, elementwise.
template <typename T, typename A, typename B, typename C>
Row<T> log_add_rows(const A& a, const B& b, const C& c) {
  const Row<T> m = a.max(b).max(c);
  const Row<T> shift = (m == kNegInf<T>).select(T(0), m);
  return shift + exact_log(exact_exp(a - shift) + exact_exp(b - shift) + exact_exp(c - shift));
}

// Per sample: its extended target's classes, and 0 or -inf by whether state s is entered by a skip.
template <typename T>
struct States {
  std::vector<int64_t> label;
  Row<T> skip;
  explicit States(const Extended& l) : label(l.states), skip(l.states) {
    for (int64_t s = 0; s < l.states; ++s) {
      label[s] = l[s];
      skip[s] = l.skips(s) ? T(0) : kNegInf<T>;
    }
  }
  int64_t size() const { return static_cast<int64_t>(label.size()); }
  // The frame's log-probabilities of the states' classes.
  void emissions(const T* frame, Row<T>& out) const {
    for (int64_t s = 0; s < size(); ++s) out[s] = frame[label[s]];
  }
};

template <typename T>
void ctc_forward(const Ctc& g, const T* lp, T* nll, T* log_alpha) {
  const int64_t frame_stride = g.samples * g.classes, row = g.row();
  parallel_for(0, g.samples, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t frames = g.frames_of(n);
      const Extended l = g.target_of(n);
      if (frames == 0) {  // no frames: only an empty target is reached (with probability 1)
        nll[n] = l.states == 1 ? T(0) : std::numeric_limits<T>::infinity();
        continue;
      }
      const States<T> states(l);
      const int64_t L = states.size();
      const T* x = lp + n * g.classes;  // frame t at x + t * frame_stride
      T* alpha = log_alpha + n * g.frames * row;
      Row<T> emit(L), prev(L + 2);  // prev: two -inf, then the previous frame's row
      prev.head(2).setConstant(kNegInf<T>);
      states.emissions(x, emit);
      RowMap<T>(alpha, L) = (Eigen::ArrayXi::LinSpaced(L, 0, static_cast<int>(L - 1)) < 2).select(emit, kNegInf<T>);
      for (int64_t t = 1; t < frames; ++t) {
        prev.tail(L) = ConstRowMap<T>(alpha + (t - 1) * row, L);
        states.emissions(x + t * frame_stride, emit);
        RowMap<T>(alpha + t * row, L) =
            log_add_rows<T>(prev.segment(2, L), prev.segment(1, L), prev.head(L) + states.skip) + emit;
      }
      const T* last = alpha + (frames - 1) * row;
      nll[n] = -log_add(last[L - 1], L > 1 ? last[L - 2] : kNegInf<T>);
    }
  });
}

template <typename T>
void ctc_backward(const Ctc& g, const T* grad_nll, const T* lp, const T* nll, const T* log_alpha, T* log_beta,
                  T* grad) {
  const int64_t frame_stride = g.samples * g.classes, row = g.row();
  parallel_for(0, g.samples, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t frames = g.frames_of(n);
      const Extended l = g.target_of(n);
      const bool possible = std::isfinite(nll[n]) && frames > 0;  // the impossible ones get no gradient
      for (int64_t t = 0; t < g.frames; ++t) std::fill_n(grad + t * frame_stride + n * g.classes, g.classes, T(0));
      if (!possible) continue;
      const States<T> states(l);
      const int64_t L = states.size();
      const T* x = lp + n * g.classes;
      const T* alpha = log_alpha + n * g.frames * row;
      T* beta = log_beta + n * g.frames * row;
      Row<T> emit(L), next(L + 2), skip_ahead(L);  // next: the following frame's row, then two -inf
      next.tail(2).setConstant(kNegInf<T>);
      skip_ahead.setConstant(kNegInf<T>);  // whether state s + 2 is entered from s
      if (L > 2) skip_ahead.head(L - 2) = states.skip.tail(L - 2);
      states.emissions(x + (frames - 1) * frame_stride, emit);
      RowMap<T>(beta + (frames - 1) * row, L) =
          (Eigen::ArrayXi::LinSpaced(L, 0, static_cast<int>(L - 1)) >= static_cast<int>(L - 2))
              .select(emit, kNegInf<T>);
      for (int64_t t = frames - 2; t >= 0; --t) {
        next.head(L) = ConstRowMap<T>(beta + (t + 1) * row, L);
        states.emissions(x + t * frame_stride, emit);
        RowMap<T>(beta + t * row, L) =
            log_add_rows<T>(next.head(L), next.segment(1, L), next.segment(2, L) + skip_ahead) + emit;
      }
      // Each frame's row: -grad_nll times the posteriors of its states, added into their classes.
      const T scale = -grad_nll[n];
      Row<T> posterior(L);
      for (int64_t t = 0; t < frames; ++t) {
        states.emissions(x + t * frame_stride, emit);
        posterior =
            scale * exact_exp(ConstRowMap<T>(alpha + t * row, L) + ConstRowMap<T>(beta + t * row, L) + nll[n] - emit);
        T* gt = grad + t * frame_stride + n * g.classes;
        for (int64_t s = 0; s < L; ++s) gt[states.label[s]] += posterior[s];
      }
    }
  });
}

void check_dtypes(const View& log_probs, std::initializer_list<const View*> same, const char* op) {
  KILN_CHECK(log_probs.dtype == kFloat32 || log_probs.dtype == kFloat64,
             "{}: the CPU kernel takes float32 or float64 log_probs, got {}", op, dtype_name(log_probs.dtype));
  for (const View* v : same) {
    KILN_CHECK(v->dtype == log_probs.dtype, "{}: every floating view must be {}, got {}", op,
               dtype_name(log_probs.dtype), dtype_name(v->dtype));
  }
}

}  // namespace

void ctc_loss_kernel(const View& log_probs, const View& targets, const View& input_lengths, const View& target_lengths,
                     const View& nll, const View& log_alpha, int64_t blank) {
  check_dtypes(log_probs, {&nll, &log_alpha}, "ctc_loss");
  const Ctc g = geometry(log_probs, targets, input_lengths, target_lengths, blank);
  if (log_probs.dtype == kFloat32) {
    ctc_forward(g, log_probs.ptr<float>(), nll.ptr<float>(), log_alpha.ptr<float>());
  } else {
    ctc_forward(g, log_probs.ptr<double>(), nll.ptr<double>(), log_alpha.ptr<double>());
  }
}

void ctc_loss_backward_kernel(const View& grad_nll, const View& log_probs, const View& targets,
                              const View& input_lengths, const View& target_lengths, const View& nll,
                              const View& log_alpha, const View& log_beta, const View& grad_log_probs, int64_t blank) {
  check_dtypes(log_probs, {&grad_nll, &nll, &log_alpha, &log_beta, &grad_log_probs}, "ctc_loss backward");
  const Ctc g = geometry(log_probs, targets, input_lengths, target_lengths, blank);
  if (log_probs.dtype == kFloat32) {
    ctc_backward(g, grad_nll.ptr<float>(), log_probs.ptr<float>(), nll.ptr<float>(), log_alpha.ptr<float>(),
                 log_beta.ptr<float>(), grad_log_probs.ptr<float>());
  } else {
    ctc_backward(g, grad_nll.ptr<double>(), log_probs.ptr<double>(), nll.ptr<double>(), log_alpha.ptr<double>(),
                 log_beta.ptr<double>(), grad_log_probs.ptr<double>());
  }
}

}  // namespace kiln::cpu

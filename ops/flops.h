// ops/flops.h: counting the arithmetic of the forward ops that run, for nn::FlopsProfiler (DeepSpeed's
// flops profiler). While a flops::Counting scope lives on a thread, the ops it runs add to its
// Counts, by DeepSpeed's rules:
//   - products count their multiply-accumulates (MACs) and 2 flops per MAC: matmul, mm, bmm and
//     addmm (M·K·N per product, and one flop per element of addmm's bias add; linear is one of
//     them, or a matmul and a bias add), the convolutions (per output element, in_channels / groups
//     × the kernel's size, and one flop per element for the bias; a transposed convolution per
//     input element, out_channels / groups × the kernel's size), and scaled_dot_product_attention
//     (L·S·(E + Ev) per head: Q Kᵀ and the product with V, plus one flop per score for the softmax;
//     a causal mask's zeros are counted too, as DeepSpeed does);
//   - elementwise ops (unary and binary, floating results: one per output element), softmax,
//     log_softmax and cross-entropy (one per input element), reductions and 2-D pooling (one per
//     input element); layer_norm, rms_norm, group_norm and batch_norm 5 per element with an affine
//     weight, else 4. Copies, views, indexing and dropout count nothing.
// An op that counts itself counts what it runs inside too (a composed attention's matmuls, a layer
// norm's elementwise ops are not counted again: Op below). Backward is not counted: the autograd
// engine pauses the count while it runs (DeepSpeed profiles the forward's ops; its backward figures
// are derived as twice the forward's).
#pragma once

#include <cstdint>

namespace kiln::flops {

struct Counts {
  int64_t macs = 0;   // multiply-accumulates of products
  int64_t flops = 0;  // every floating-point operation: 2 per MAC, plus the others
};

// Counts the forward ops this thread runs into *counts while it lives; nests (the inner scope's
// counts are its own, the outer one's resume after it). Scopes may end in any order (two profilers'
// start and stop interleaved): the one made last of those still alive counts.
class Counting {
 public:
  explicit Counting(Counts* counts);
  ~Counting();
  Counting(const Counting&) = delete;
  Counting& operator=(const Counting&) = delete;
};

namespace detail {
// A Counting scope is on, and no counted op and no backward runs: one thread-local load per op
// when off (as autocast's switch).
extern thread_local constinit bool t_counting;
void add(int64_t macs, int64_t other_flops);  // and pause
void resume();
}  // namespace detail

// Whether this thread counts now.
inline bool counting() { return detail::t_counting; }

// An op's own count: adds macs and flops (2 * macs are added for the products) and stops the ops it
// runs inside from counting while it lives.
class Op {
 public:
  Op(int64_t macs, int64_t other_flops) : counted_(detail::t_counting) {
    if (counted_) detail::add(macs, other_flops);
  }
  ~Op() {
    if (counted_) detail::resume();
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

 private:
  bool counted_;
};

// Stops counting on this thread while it lives (the autograd engine's backward).
class Paused {
 public:
  Paused();
  ~Paused();
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;

 private:
  bool previous_;
};

}  // namespace kiln::flops

// cpu/parallel.h: the one CPU thread pool. Every parallel CPU kernel goes through parallel_for, so
// Kiln never has two pools spinning against each other (OpenBLAS is told to use one thread; Kiln
// splits its GEMMs itself). The pool defaults to every core; set_num_threads changes it.
#pragma once

#include <cstdint>

namespace kiln {

void set_num_threads(int n);  // n >= 1; takes effect for the next parallel op
int get_num_threads();

}  // namespace kiln

namespace kiln::cpu {

using RangeFn = void (*)(const void* ctx, int64_t begin, int64_t end);
void parallel_for_impl(int64_t begin, int64_t end, int64_t grain, RangeFn fn, const void* ctx);

// Runs fn(b, e) over [begin, end) cut into at most get_num_threads() contiguous pieces of at least
// `grain` items each; the calling thread and the pool's workers take pieces as they come (the caller
// runs them all if the workers are slow to wake). The split depends only on the range, the grain and
// the thread count, never on which thread runs a piece, so results are reproducible. Nested calls
// run serially.
// An exception thrown by fn on any thread is rethrown here.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  if (end <= begin) return;
  parallel_for_impl(
      begin, end, grain,
      [](const void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); }, &fn);
}

// How many pieces parallel_for would cut [0, n) into.
int parallel_pieces(int64_t n, int64_t grain);

}  // namespace kiln::cpu

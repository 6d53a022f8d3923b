// ops/flops.cpp: the thread's count (ops/flops.h).
#include "ops/flops.h"

namespace kiln::flops {
namespace detail {
thread_local constinit bool t_counting = false;
}  // namespace detail

namespace {

thread_local Counts* t_counts = nullptr;  // the innermost Counting scope's
thread_local bool t_paused = false;       // inside a counted op, or in backward

void update() { detail::t_counting = t_counts != nullptr && !t_paused; }

}  // namespace

namespace detail {
void add(int64_t macs, int64_t other_flops) {
  t_counts->macs += macs;
  t_counts->flops += 2 * macs + other_flops;
  t_paused = true;
  update();
}
void resume() {
  t_paused = false;
  update();
}
}  // namespace detail

Counting::Counting(Counts* counts) : previous_(t_counts) {
  t_counts = counts;
  update();
}
Counting::~Counting() {
  t_counts = previous_;
  update();
}

Paused::Paused() : previous_(t_paused) {
  t_paused = true;
  update();
}
Paused::~Paused() {
  t_paused = previous_;
  update();
}

}  // namespace kiln::flops

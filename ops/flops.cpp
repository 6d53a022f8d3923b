// ops/flops.cpp: the thread's count (ops/flops.h).
#include "ops/flops.h"

namespace kiln::flops {
namespace {

thread_local Counts* t_counts = nullptr;  // the innermost Counting scope's
thread_local bool t_paused = false;       // inside a counted op, or in backward

}  // namespace

Counting::Counting(Counts* counts) : previous_(t_counts) { t_counts = counts; }
Counting::~Counting() { t_counts = previous_; }

bool counting() { return t_counts != nullptr && !t_paused; }

Op::Op(int64_t macs, int64_t other_flops) : counted_(counting()) {
  if (!counted_) return;
  t_counts->macs += macs;
  t_counts->flops += 2 * macs + other_flops;
  t_paused = true;
}
Op::~Op() {
  if (counted_) t_paused = false;
}

Paused::Paused() : previous_(t_paused) { t_paused = true; }
Paused::~Paused() { t_paused = previous_; }

}  // namespace kiln::flops

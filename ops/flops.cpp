// ops/flops.cpp: the thread's count (ops/flops.h).
#include "ops/flops.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kiln::flops {
namespace detail {
thread_local constinit bool t_counting = false;
}  // namespace detail

namespace {

thread_local Counts* t_counts = nullptr;  // the innermost Counting scope's
thread_local bool t_paused = false;       // inside a counted op, or in backward
// The live Counting scopes of this thread, oldest first. Not a plain chain of previous pointers:
// profilers may stop in another order than they started, and the scope that ends must not take
// down the one still counting.
thread_local std::vector<std::pair<const Counting*, Counts*>> t_scopes;

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

Counting::Counting(Counts* counts) {
  t_scopes.emplace_back(this, counts);
  t_counts = counts;
  update();
}
Counting::~Counting() {
  auto it = std::find_if(t_scopes.begin(), t_scopes.end(), [this](const auto& s) { return s.first == this; });
  if (it != t_scopes.end()) t_scopes.erase(it);  // not found: ended on another thread than it began
  t_counts = t_scopes.empty() ? nullptr : t_scopes.back().second;
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

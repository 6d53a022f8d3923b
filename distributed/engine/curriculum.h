// distributed/engine/curriculum.h: DeepSpeed's (legacy) curriculum learning by sequence length: the
// first steps train on short sequences, and the length grows to the full context by a schedule
// (Li et al., "The Stability-Efficiency Dilemma", 2021). Short sequences make the early steps
// cheaper, and the paper reports they make large-batch, large-lr GPT training more stable.
//
//   "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen",
//                           "min_difficulty": 16, "max_difficulty": 128, "schedule_type": "fixed_linear",
//                           "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8}}
//
// The difficulty at step s (DeepSpeed's CurriculumScheduler, the same arithmetic):
//   fixed_linear   floor(s / total_curriculum_step * (max - min) + min), rounded down to a multiple
//                  of difficulty_step, at most max;
//   fixed_root     the same with (s / total_curriculum_step)^(1 / root_degree): faster at first;
//   fixed_discrete difficulty[i] for the steps up to max_step[i], then the last difficulty.
// Engine updates it before each training forward, with s = the optimizer steps taken + 1, and
// once it has reached max_difficulty it stays there. With "seqlen" Engine's forward keeps the first
// `difficulty` positions of dim 1 of the input (a (B, T) batch of tokens), as DeepSpeed's engine
// hands curriculum_seqlen to a Megatron model that cuts its tokens so; the loss's targets are cut
// the same way by the caller (Engine::curriculum_seqlen()). A pipeline's train_batch cuts both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// The keys of DeepSpeed's "curriculum_learning" section (its legacy form, which Megatron-DeepSpeed's
// GPT examples use).
struct CurriculumOptions {
  bool enabled = false;
  std::string curriculum_type = "seqlen";  // the only type whose difficulty Engine applies
  int64_t min_difficulty = 0, max_difficulty = 0;
  std::string schedule_type;               // "fixed_linear", "fixed_root" or "fixed_discrete"
  int64_t total_curriculum_step = 0;       // fixed_linear, fixed_root
  int64_t difficulty_step = 1;             // fixed_linear, fixed_root: the lengths are its multiples
  double root_degree = 1;                  // fixed_root
  std::vector<int64_t> difficulty, max_step;  // fixed_discrete: one more difficulty than max_step
};

class CurriculumScheduler {
 public:
  // Checks the options (an Error names what is wrong); starts at min_difficulty.
  explicit CurriculumScheduler(CurriculumOptions options);

  // The schedule's difficulty at global step s (>= 0).
  int64_t get_difficulty(int64_t s) const;
  // Moves the current difficulty to step s's, until it has reached max_difficulty; returns it.
  int64_t update_difficulty(int64_t s);
  int64_t get_current_difficulty() const { return current_; }
  const CurriculumOptions& options() const { return options_; }

 private:
  CurriculumOptions options_;
  int64_t current_;
};

}  // namespace kiln

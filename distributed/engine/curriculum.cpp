// distributed/engine/curriculum.cpp: the curriculum schedules (see curriculum.h).
#include "distributed/engine/curriculum.h"

#include <cmath>

#include "core/error.h"

namespace kiln {

CurriculumScheduler::CurriculumScheduler(CurriculumOptions options)
    : options_(std::move(options)), current_(options_.min_difficulty) {
  const CurriculumOptions& o = options_;
  KILN_CHECK(o.curriculum_type == "seqlen",
             "curriculum_learning: curriculum_type \"{}\" is not one Kiln applies; \"seqlen\" (the sequence length) is",
             o.curriculum_type);
  KILN_CHECK(o.min_difficulty >= 1 && o.max_difficulty >= o.min_difficulty,
             "curriculum_learning: min_difficulty {} and max_difficulty {} must satisfy 1 <= min <= max",
             o.min_difficulty, o.max_difficulty);
  if (o.schedule_type == "fixed_linear" || o.schedule_type == "fixed_root") {
    KILN_CHECK(o.total_curriculum_step >= 1, "curriculum_learning: schedule_config.total_curriculum_step must be >= 1, "
               "not {}", o.total_curriculum_step);
    KILN_CHECK(o.difficulty_step >= 1, "curriculum_learning: schedule_config.difficulty_step must be >= 1, not {}",
               o.difficulty_step);
    // The schedule rounds down to a multiple of difficulty_step: below it, the first lengths would be 0.
    KILN_CHECK(o.min_difficulty >= o.difficulty_step,
               "curriculum_learning: min_difficulty {} is below difficulty_step {}, so the first steps' difficulty "
               "would round down to 0; make min_difficulty at least difficulty_step", o.min_difficulty,
               o.difficulty_step);
    KILN_CHECK(o.schedule_type == "fixed_linear" || (std::isfinite(o.root_degree) && o.root_degree > 0),
               "curriculum_learning: schedule_config.root_degree must be a number > 0 (2: square root), not {}",
               o.root_degree);
  } else if (o.schedule_type == "fixed_discrete") {
    KILN_CHECK(!o.max_step.empty() && o.difficulty.size() == o.max_step.size() + 1,
               "curriculum_learning: fixed_discrete takes a list of difficulties and a list of the steps up to which "
               "each one holds, one fewer (the last difficulty holds after them); got {} difficulties and {} max "
               "steps", o.difficulty.size(), o.max_step.size());
    for (size_t i = 0; i < o.difficulty.size(); ++i) {
      KILN_CHECK(o.difficulty[i] >= 1 && o.difficulty[i] <= o.max_difficulty,
                 "curriculum_learning: schedule_config.difficulty[{}] is {}; each must be in [1, max_difficulty {}]", i,
                 o.difficulty[i], o.max_difficulty);
    }
    for (size_t i = 1; i < o.max_step.size(); ++i) {
      KILN_CHECK(o.max_step[i] > o.max_step[i - 1], "curriculum_learning: schedule_config.max_step must increase; "
                 "max_step[{}] = {} follows {}", i, o.max_step[i], o.max_step[i - 1]);
    }
  } else {
    KILN_FAIL("curriculum_learning: schedule_type \"{}\" is not one of DeepSpeed's: fixed_linear, fixed_root, "
              "fixed_discrete", o.schedule_type);
  }
}

int64_t CurriculumScheduler::get_difficulty(int64_t s) const {
  const CurriculumOptions& o = options_;
  if (o.schedule_type == "fixed_discrete") {
    for (size_t i = 0; i < o.max_step.size(); ++i) {
      if (s <= o.max_step[i]) return o.difficulty[i];
    }
    return o.difficulty.back();
  }
  const double degree = o.schedule_type == "fixed_linear" ? 1.0 : o.root_degree;
  const double progress = std::pow(static_cast<double>(s) / static_cast<double>(o.total_curriculum_step), 1.0 / degree);
  int64_t d = static_cast<int64_t>(
      std::floor(progress * static_cast<double>(o.max_difficulty - o.min_difficulty) + static_cast<double>(o.min_difficulty)));
  d -= d % o.difficulty_step;
  return std::min(d, o.max_difficulty);
}

int64_t CurriculumScheduler::update_difficulty(int64_t s) {
  if (current_ < options_.max_difficulty) current_ = get_difficulty(s);
  return current_;
}

}  // namespace kiln

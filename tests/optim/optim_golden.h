// tests/optim/optim_golden.h: reads tests/fixtures/optim_golden.txt (written by
// gen_optim_golden.py, whose header describes the format) and builds the optimizers its cases name.
#pragma once

#include <kiln/kiln.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::test {

struct OptimCase {
  std::string id, optimizer;
  std::map<std::string, double> options;                       // for every group
  std::map<int, std::map<std::string, double>> group_options;  // "gK.key" overrides
  std::vector<int> groups;                                     // parameter -> group
  std::vector<Tensor> params, targets;                         // targets undefined for "nograd"
  std::vector<std::vector<Tensor>> after;                      // [step - 1][param]
  std::map<int, std::map<std::string, Tensor>> state;          // after step 10
};

struct OptimGolden {
  std::vector<OptimCase> cases;
  std::map<std::string, std::vector<double>> sched, sched1, momentum;  // by scheduler id
  // ReduceLROnPlateau: [case id][series], series "metric", "lr0", "lr1", "best", "num_bad_epochs",
  // "cooldown_counter"
  std::map<std::string, std::map<std::string, std::vector<double>>> plateau;
  struct Clip {
    std::string id;
    double max_norm, norm_type, total_norm;
    std::vector<Tensor> before, after;
  };
  std::vector<Clip> clips;

  static const OptimGolden& get();
  const OptimCase& find(const std::string& id) const;
};

// The fixtures' gradient: (p - c) * 0.5 + p^3 * 0.1, in this order (as the generator).
Tensor golden_grad(const Tensor& p, const Tensor& c);

// The optimizer a case names, over fresh copies (leaves requiring grad) of its initial parameters,
// returned in `params`.
// fused: SGD, Adam and AdamW with their `fused` option on (the other optimizers have none).
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimCase& c, std::vector<Tensor>& params,
                                                  bool fused = false);

// One step of a case: sets each parameter's grad from its target (none for "nograd"), then steps.
void golden_step(const OptimCase& c, optim::Optimizer& opt, const std::vector<Tensor>& params);

}  // namespace kiln::test

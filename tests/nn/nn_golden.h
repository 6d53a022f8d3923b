// tests/nn/nn_golden.h: reads tests/fixtures/nn_golden.txt (written by tests/fixtures/gen_nn_golden.py;
// the format is in that script's header) and checks Kiln layers against it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "support.h"

namespace kiln::test {

struct NnCase {
  std::string name;
  std::map<std::string, Tensor> tensors;  // float64 or int64
  std::map<std::string, std::string> strings;

  const Tensor& at(const std::string& key) const;
  bool has(const std::string& key) const { return tensors.count(key) != 0; }
  // The p.* entries as a state dict (without the prefix).
  TensorDict state() const;
};

// The case of that name (the file is read once); fails the test when it is missing.
const NnCase& nn_case(const std::string& name);

// Loads the case's parameters into `layer` (made float64), runs it on in.0 (a leaf requiring grad when
// floating), checks out, every after.<buffer> and after.<param>, and the gradients g.in.0 and g.<param> of <out, cot>.
void check_layer(nn::Module& layer, const std::string& case_name, bool train = true);

// Loads the case's parameters into `module` (made float64; strictly, so the names must be PyTorch's) and
// gives the case's inputs in.0, in.1, ... as leaves that require grad.
std::vector<Tensor> load_case(nn::Module& module, const NnCase& c);
// The gradients of the sum of <outputs[i], cots[i]> with respect to `inputs` (against g.in.<i>) and
// every parameter of `module` (against g.<name>); the case must hold exactly the module's parameters.
void check_gradients(const std::vector<Tensor>& outputs, const std::vector<Tensor>& cots,
                     const std::vector<Tensor>& inputs, const nn::Module& module, const NnCase& c);

// A loss or another function of the case's inputs: runs fn on in.0, in.1, ... (those that have a
// g.in.<i> require grad) and checks out and those gradients of <out, cot>.
using LossFn = std::function<Tensor(const std::vector<Tensor>&)>;
void check_loss(const std::string& name, const LossFn& fn);

// Three steps of SGD(lr 0.2, momentum 0.5) on the mean squared error between layer(in.0) and "target",
// as gen_nn_golden.py's sgd_case: each step's loss against loss.<k>, the state dict against final.*.
void check_sgd_steps(nn::Module& layer, const std::string& case_name);

// The names of (name, tensor) pairs, in their order (named_parameters(), named_buffers()).
std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named);

}  // namespace kiln::test

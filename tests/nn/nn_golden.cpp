// tests/nn/nn_golden.cpp: see nn_golden.h.
#include "nn_golden.h"

#include <fstream>
#include <sstream>

namespace kiln::test {

namespace {

std::map<std::string, NnCase> load() {
  std::string path = std::string(KILN_TEST_FIXTURES) + "/nn_golden.txt";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::map<std::string, NnCase> cases;
  NnCase* current = nullptr;
  std::string line;
  std::getline(in, line);
  if (line != "kiln-nn-golden 1") throw std::runtime_error(path + ": bad header");
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind, key;
    ls >> kind >> key;
    if (kind == "case") {
      current = &cases[key];
      current->name = key;
      continue;
    }
    if (current == nullptr) throw std::runtime_error(path + ": a record before the first case");
    if (kind == "s") {
      std::string rest;
      std::getline(ls, rest);
      std::string text;
      for (size_t i = 1; i < rest.size(); ++i) {  // skip the separating space; unescape \n and \\ .
        if (rest[i] == '\\' && i + 1 < rest.size()) {
          text += rest[i + 1] == 'n' ? '\n' : rest[i + 1];
          ++i;
        } else {
          text += rest[i];
        }
      }
      current->strings[key] = text;
      continue;
    }
    std::string shape_text;
    ls >> shape_text;
    Shape shape;
    if (shape_text != "-") {
      std::istringstream ss(shape_text);
      std::string d;
      while (std::getline(ss, d, ',')) shape.push_back(std::stoll(d));
    }
    if (kind == "t") {
      std::vector<double> v;
      std::string tok;
      while (ls >> tok) v.push_back(std::stod(tok));
      current->tensors[key] = from_vector(v, shape);
    } else if (kind == "i") {
      std::vector<int64_t> v;
      int64_t x;
      while (ls >> x) v.push_back(x);
      current->tensors[key] = from_vector(v, shape);
    } else {
      throw std::runtime_error(path + ": unknown record '" + kind + "'");
    }
  }
  return cases;
}

}  // namespace

const Tensor& NnCase::at(const std::string& key) const {
  auto it = tensors.find(key);
  if (it == tensors.end()) FAIL("golden case " << name << " has no tensor '" << key << "'");
  return it->second;
}

TensorDict NnCase::state() const {
  TensorDict d;
  for (const auto& [key, t] : tensors)
    if (key.rfind("p.", 0) == 0) d.insert(key.substr(2), t);
  return d;
}

const NnCase& nn_case(const std::string& name) {
  static const std::map<std::string, NnCase> cases = load();
  auto it = cases.find(name);
  if (it == cases.end()) FAIL("no golden case '" << name << "' in nn_golden.txt");
  return it->second;
}

std::vector<Tensor> load_case(nn::Module& module, const NnCase& c) {
  module.to(kFloat64);
  module.load_state_dict(c.state());
  std::vector<Tensor> in;
  for (int i = 0; c.has("in." + std::to_string(i)); ++i) {
    in.push_back(c.at("in." + std::to_string(i)).clone().requires_grad_());
  }
  return in;
}

void check_gradients(const std::vector<Tensor>& outputs, const std::vector<Tensor>& cots,
                     const std::vector<Tensor>& inputs, const nn::Module& module, const NnCase& c) {
  std::vector<Tensor> targets = inputs;
  std::vector<std::string> names;
  for (size_t i = 0; i < inputs.size(); ++i) names.push_back("g.in." + std::to_string(i));
  for (const auto& [key, p] : module.named_parameters()) {
    targets.push_back(p);
    names.push_back("g." + key);
  }
  CHECK(names.size() == inputs.size() + c.state().size());
  const auto grads = autograd::grad(outputs, targets, cots);
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient " << names[i]);
    check_close(grads[i], c.at(names[i]));
  }
}

void check_layer(nn::Module& layer, const std::string& case_name, bool train) {
  INFO("golden case " << case_name);
  const NnCase& c = nn_case(case_name);
  layer.to(kFloat64);
  // The fixture's state dict is torch's: loading it strictly also checks the names match.
  layer.load_state_dict(c.state());
  layer.train(train);
  Tensor x = c.at("in.0").clone();
  if (x.is_floating_point()) x.requires_grad_();
  Tensor y = layer(x);
  check_close(y, c.at("out"));
  for (const auto& [name, buffer] : layer.named_buffers()) {
    if (c.has("after." + name)) {
      INFO("buffer " << name << " after the forward");
      check_close(buffer, c.at("after." + name));
    }
  }
  for (const auto& [name, p] : layer.named_parameters()) {  // a forward that changes them in place
    if (c.has("after." + name)) {
      INFO("parameter " << name << " after the forward");
      check_close(p, c.at("after." + name));
    }
  }
  std::vector<Tensor> targets;
  std::vector<std::string> names;
  if (x.requires_grad()) {
    targets.push_back(x);
    names.push_back("g.in.0");
  }
  for (const auto& [name, p] : layer.named_parameters()) {
    targets.push_back(p);
    names.push_back("g." + name);
  }
  if (targets.empty()) return;
  auto grads = autograd::grad({y}, targets, {c.at("cot")}, {}, false, true);
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient " << names[i]);
    Tensor g = grads[i].defined() ? grads[i] : zeros_like(targets[i]);
    check_close(g, c.at(names[i]));
  }
}

void check_loss(const std::string& name, const LossFn& fn) {
  INFO("golden case " << name);
  const NnCase& c = nn_case(name);
  std::vector<Tensor> in;
  for (int i = 0; c.has("in." + std::to_string(i)); ++i) {
    Tensor x = c.at("in." + std::to_string(i)).clone();
    if (c.has("g.in." + std::to_string(i))) x.requires_grad_();
    in.push_back(x);
  }
  Tensor y = fn(in);
  check_close(y, c.at("out"));
  std::vector<Tensor> targets;
  std::vector<std::string> names;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].requires_grad()) {
      targets.push_back(in[i]);
      names.push_back("g.in." + std::to_string(i));
    }
  }
  if (targets.empty()) return;  // torch gave no gradient (an op without a derivative in 1.13)
  auto grads = autograd::grad({y}, targets, {c.at("cot")});
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient " << names[i]);
    check_close(grads[i], c.at(names[i]));
  }
}

void check_sgd_steps(nn::Module& layer, const std::string& case_name) {
  const NnCase& c = nn_case(case_name);
  layer.to(kFloat64);
  layer.load_state_dict(c.state());
  optim::SGD opt(layer.parameters(), {.lr = 0.2, .momentum = 0.5});
  for (int k = 0; k < 3; ++k) {
    opt.zero_grad();
    Tensor loss = (layer(c.at("in.0")) - c.at("target")).pow(2).mean();
    loss.backward();
    opt.step();
    INFO("step " << k);
    check_close(loss, c.at("loss." + std::to_string(k)));
  }
  for (const auto& [key, t] : layer.state_dict()) {
    INFO(key);
    check_close(t, c.at("final." + key));
  }
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

}  // namespace kiln::test

// tests/optim/optim_golden.cpp: the reader of optim_golden.txt and the optimizer factory of its
// cases.
#include "optim_golden.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kiln::test {

namespace {

Tensor read_tensor(std::istringstream& in) {
  std::string shape_text;
  in >> shape_text;
  std::vector<int64_t> dims;
  if (shape_text != "-") {
    std::stringstream ss(shape_text);
    std::string d;
    while (std::getline(ss, d, ',')) dims.push_back(std::stoll(d));
  }
  std::vector<double> v;
  double x;
  while (in >> x) v.push_back(x);
  return from_vector(v, Shape(dims));
}

std::vector<double> read_numbers(std::istringstream& in) {
  std::vector<double> v;
  std::string x;
  while (in >> x) v.push_back(std::stod(x));
  return v;
}

OptimGolden load() {
  const std::string path = std::string(KILN_TEST_FIXTURES) + "/optim_golden.txt";
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path);
  OptimGolden g;
  OptimCase* c = nullptr;
  OptimGolden::Clip* clip = nullptr;
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "case") {
      c = &g.cases.emplace_back();
      in >> c->id >> c->optimizer;
      std::string kv;
      while (in >> kv) {
        const size_t eq = kv.find('=');
        std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
        if (key == "groups") {
          std::stringstream ss(value);
          std::string k;
          while (std::getline(ss, k, ',')) c->groups.push_back(std::stoi(k));
        } else if (key[0] == 'g' && key.find('.') != std::string::npos) {
          const size_t dot = key.find('.');
          c->group_options[std::stoi(key.substr(1, dot - 1))][key.substr(dot + 1)] =
              std::stod(value);
        } else {
          c->options[key] = std::stod(value);
        }
      }
    } else if (kind == "param" || kind == "target" || kind == "nograd") {
      size_t i;
      in >> i;
      std::vector<Tensor>& list = kind == "target" ? c->targets : c->params;
      if (list.size() <= i) list.resize(i + 1);
      if (kind != "nograd") list[i] = read_tensor(in).to(kFloat32);
      if (kind == "param" && c->targets.size() <= i) c->targets.resize(i + 1);
    } else if (kind == "after") {
      size_t step, i;
      in >> step >> i;
      if (c->after.size() < step) c->after.resize(step);
      if (c->after[step - 1].size() <= i) c->after[step - 1].resize(i + 1);
      c->after[step - 1][i] = read_tensor(in).to(kFloat32);
    } else if (kind == "state") {
      int i;
      std::string name;
      in >> i >> name;
      c->state[i][name] = read_tensor(in);
    } else if (kind == "sched" || kind == "sched1" || kind == "momentum") {
      std::string id;
      in >> id;
      auto& map = kind == "sched" ? g.sched : kind == "sched1" ? g.sched1 : g.momentum;
      map[id] = read_numbers(in);
    } else if (kind == "plateau") {
      std::string id, series;
      in >> id >> series;
      g.plateau[id][series] = read_numbers(in);
    } else if (kind == "clip") {
      clip = &g.clips.emplace_back();
      std::string norm_type;
      in >> clip->id >> clip->max_norm >> norm_type >> clip->total_norm;
      clip->norm_type = std::stod(norm_type);  // accepts "inf"
    } else if (kind == "clipgrad" || kind == "clipped") {
      size_t i;
      in >> i;
      (kind == "clipgrad" ? clip->before : clip->after).push_back(read_tensor(in).to(kFloat32));
    } else if (kind == "end") {
      c = nullptr;
      clip = nullptr;
    } else {
      throw std::runtime_error(path + ": unknown record '" + kind + "'");
    }
  }
  for (OptimCase& oc : g.cases) {
    if (oc.groups.empty()) oc.groups.assign(oc.params.size(), 0);
  }
  return g;
}

double get(const std::map<std::string, double>& o, const std::string& key, double fallback) {
  auto it = o.find(key);
  return it == o.end() ? fallback : it->second;
}

template <typename Options, typename Make>
std::vector<optim::GroupSpec<Options>> specs(const OptimCase& c, const std::vector<Tensor>& params,
                                             Make make) {
  int n = 0;
  for (int g : c.groups) n = std::max(n, g + 1);
  std::vector<optim::GroupSpec<Options>> out(n);
  for (int g = 0; g < n; ++g) {
    std::map<std::string, double> o = c.options;
    if (c.group_options.count(g)) {
      for (const auto& [k, v] : c.group_options.at(g)) o[k] = v;
    }
    out[g].options = make(o);
  }
  for (size_t i = 0; i < params.size(); ++i) out[c.groups[i]].params.push_back(params[i]);
  return out;
}

}  // namespace

const OptimGolden& OptimGolden::get() {
  static const OptimGolden golden = load();
  return golden;
}

const OptimCase& OptimGolden::find(const std::string& id) const {
  for (const OptimCase& c : cases) {
    if (c.id == id) return c;
  }
  throw std::runtime_error("optim_golden.txt has no case " + id);
}

Tensor golden_grad(const Tensor& p, const Tensor& c) { return (p - c) * 0.5 + p * p * p * 0.1; }

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimCase& c, std::vector<Tensor>& params,
                                                  bool fused) {
  params.clear();
  for (const Tensor& p : c.params) params.push_back(p.clone().requires_grad_());
  using namespace optim;
  if (c.optimizer == "SGD") {
    return std::make_unique<SGD>(specs<SGDOptions>(c, params, [fused](const auto& o) {
      return SGDOptions{.lr = get(o, "lr", 0),
                        .momentum = get(o, "momentum", 0),
                        .dampening = get(o, "dampening", 0),
                        .weight_decay = get(o, "weight_decay", 0),
                        .nesterov = get(o, "nesterov", 0) != 0,
                        .maximize = get(o, "maximize", 0) != 0,
                        .fused = fused};
    }));
  }
  if (c.optimizer == "Adam") {
    return std::make_unique<Adam>(specs<AdamOptions>(c, params, [fused](const auto& o) {
      AdamOptions d;
      return AdamOptions{.lr = get(o, "lr", d.lr),
                         .beta1 = get(o, "beta1", d.beta1),
                         .beta2 = get(o, "beta2", d.beta2),
                         .eps = get(o, "eps", d.eps),
                         .weight_decay = get(o, "weight_decay", d.weight_decay),
                         .amsgrad = get(o, "amsgrad", 0) != 0,
                         .maximize = get(o, "maximize", 0) != 0,
                         .fused = fused};
    }));
  }
  if (c.optimizer == "AdamW") {
    return std::make_unique<AdamW>(specs<AdamWOptions>(c, params, [fused](const auto& o) {
      AdamWOptions d;
      return AdamWOptions{.lr = get(o, "lr", d.lr),
                          .beta1 = get(o, "beta1", d.beta1),
                          .beta2 = get(o, "beta2", d.beta2),
                          .eps = get(o, "eps", d.eps),
                          .weight_decay = get(o, "weight_decay", d.weight_decay),
                          .amsgrad = get(o, "amsgrad", 0) != 0,
                          .maximize = get(o, "maximize", 0) != 0,
                          .fused = fused};
    }));
  }
  if (c.optimizer == "RMSprop") {
    return std::make_unique<RMSprop>(specs<RMSpropOptions>(c, params, [](const auto& o) {
      RMSpropOptions d;
      return RMSpropOptions{.lr = get(o, "lr", d.lr),
                            .alpha = get(o, "alpha", d.alpha),
                            .eps = get(o, "eps", d.eps),
                            .weight_decay = get(o, "weight_decay", 0),
                            .momentum = get(o, "momentum", 0),
                            .centered = get(o, "centered", 0) != 0,
                            .maximize = get(o, "maximize", 0) != 0};
    }));
  }
  if (c.optimizer == "Adagrad") {
    return std::make_unique<Adagrad>(specs<AdagradOptions>(c, params, [](const auto& o) {
      AdagradOptions d;
      return AdagradOptions{.lr = get(o, "lr", d.lr),
                            .lr_decay = get(o, "lr_decay", 0),
                            .weight_decay = get(o, "weight_decay", 0),
                            .initial_accumulator_value = get(o, "initial_accumulator_value", 0),
                            .eps = get(o, "eps", d.eps),
                            .maximize = get(o, "maximize", 0) != 0};
    }));
  }
  throw std::runtime_error("unknown optimizer " + c.optimizer);
}

void golden_step(const OptimCase& c, optim::Optimizer& opt, const std::vector<Tensor>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (c.targets[i].defined()) {
      NoGradGuard no_grad;
      Tensor p = params[i];
      p.set_grad(golden_grad(p, c.targets[i]));
    }
  }
  opt.step();
}

}  // namespace kiln::test

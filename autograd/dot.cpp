// autograd/dot.cpp: the graph behind a tensor in Graphviz's DOT language. Backward nodes are boxes
// (by name); leaves (AccumulateGrad) show their shape; arrows follow the gradient's flow.
#include <sstream>
#include <unordered_map>

#include "autograd/autograd.h"
#include "ops/record.h"

namespace kiln::autograd {

std::string to_dot(const Tensor& t) {
  std::ostringstream out;
  out << "digraph autograd {\n  node [shape=box, fontname=\"Helvetica\"];\n";
  out << "  output [label=\"output " << t.sizes().str() << "\", style=filled, fillcolor=lightblue];\n";
  if (!t.defined() || !t.requires_grad()) return out.str() + "}\n";
  std::unordered_map<const Node*, int> ids;
  std::vector<std::shared_ptr<Node>> stack;
  auto id_of = [&](const std::shared_ptr<Node>& n) {
    auto [it, fresh] = ids.emplace(n.get(), static_cast<int>(ids.size()));
    if (fresh) {
      std::string label = n->name();
      if (auto* acc = dynamic_cast<AccumulateGrad*>(n.get())) label += "\\n" + acc->leaf()->sizes.str();
      out << "  n" << it->second << " [label=\"" << label << "\"" << (dynamic_cast<AccumulateGrad*>(n.get()) ? ", style=filled, fillcolor=lightgrey" : "") << "];\n";
      stack.push_back(n);
    }
    return it->second;
  };
  Edge root = gradient_edge(t);
  int root_id = id_of(root.fn);
  out << "  output -> n" << root_id << ";\n";
  while (!stack.empty()) {
    auto n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges) {
      if (!e.valid()) continue;
      int from = ids[n.get()], to = id_of(e.fn);
      out << "  n" << from << " -> n" << to << ";\n";
    }
  }
  out << "}\n";
  return out.str();
}

}  // namespace kiln::autograd

// ops/einsum.cpp: einsum, PyTorch's and NumPy's Einstein summation, composed of views, sums and
// batched matrix products, so it runs on every device and differentiates through the pieces.
//
// Note [einsum as products]
// Each operand's subscripts label its dims: letters, and "..." for the dims they leave over (right-
// aligned and broadcast across operands, as PyTorch's). A letter written twice in one operand takes
// its diagonal; a dim of size 1 broadcasts against the same label's size elsewhere. The output is
// what follows "->", or else "..." and the letters written once, in ASCII order (PyTorch's implicit
// form). Labels that only one operand holds and the output lacks are summed first; then the operands
// are multiplied left to right, two at a time: the labels both hold that the output or a later
// operand needs are batch dims, those both hold and nothing later needs are summed over, and the rest
// are the rows and columns of one bmm: (batch, rows, summed) @ (batch, summed, columns).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "ops/ops.h"

namespace kiln {
namespace {

constexpr int kLetters = 52;  // 'A'..'Z' then 'a'..'z': labels 0..51; "..." dims are 52, 53, ...

int letter_label(char c) { return c >= 'A' && c <= 'Z' ? c - 'A' : (c >= 'a' && c <= 'z' ? 26 + c - 'a' : -1); }

std::string label_name(int label) {
  if (label < 26) return std::string(1, static_cast<char>('A' + label));
  if (label < kLetters) return std::string(1, static_cast<char>('a' + label - 26));
  return "... dim " + std::to_string(label - kLetters);
}

// One subscript term: its letters' labels in order, with -1 where "..." stands.
std::vector<int> parse_term(std::string_view term, std::string_view equation, bool& has_ellipsis) {
  std::vector<int> labels;
  has_ellipsis = false;
  for (size_t i = 0; i < term.size(); ++i) {
    if (term[i] == '.') {
      KILN_CHECK(term.substr(i, 3) == "...", "einsum: a '.' must be part of \"...\" in \"{}\"", equation);
      KILN_CHECK(!has_ellipsis, "einsum: \"...\" appears twice in the term \"{}\" of \"{}\"", term, equation);
      has_ellipsis = true;
      labels.push_back(-1);
      i += 2;
      continue;
    }
    const int label = letter_label(term[i]);
    KILN_CHECK(label >= 0, "einsum: subscripts are letters a-z and A-Z and \"...\", got '{}' in \"{}\"", term[i],
               equation);
    labels.push_back(label);
  }
  return labels;
}

struct Term {
  Tensor t;
  std::vector<int> labels;  // one a dim
};

int position(const std::vector<int>& labels, int label) {
  const auto it = std::find(labels.begin(), labels.end(), label);
  return it == labels.end() ? -1 : static_cast<int>(it - labels.begin());
}
bool holds(const std::vector<int>& labels, int label) { return position(labels, label) >= 0; }

// Sums the term's dims whose labels `keep` rejects.
template <typename Keep>
void sum_unneeded(Term& term, const Keep& keep) {
  Shape dims;
  std::vector<int> left;
  for (int d = 0; d < static_cast<int>(term.labels.size()); ++d) {
    if (keep(term.labels[d]))
      left.push_back(term.labels[d]);
    else
      dims.push_back(d);
  }
  if (dims.empty()) return;
  term.t = sum(term.t, dims);
  term.labels = left;
}

// The term's dims in the order of `labels` (each one it holds), reshaped into groups of sizes.
Tensor grouped(const Term& term, const std::vector<std::vector<int>>& groups) {
  Shape order, shape;
  for (const auto& group : groups) {
    int64_t size = 1;
    for (int label : group) {
      const int d = position(term.labels, label);
      order.push_back(d);
      size *= term.t.sizes()[d];
    }
    shape.push_back(size);
  }
  return term.t.permute(order).reshape(shape);
}

Term contract(Term a, Term b, const std::vector<int>& needed) {
  const auto later = [&](int label) { return holds(needed, label); };
  sum_unneeded(a, [&](int l) { return later(l) || holds(b.labels, l); });
  sum_unneeded(b, [&](int l) { return later(l) || holds(a.labels, l); });
  std::vector<int> batch, summed, rows, columns;
  for (int l : a.labels) {
    if (holds(b.labels, l))
      (later(l) ? batch : summed).push_back(l);
    else
      rows.push_back(l);
  }
  for (int l : b.labels) {
    if (!holds(a.labels, l)) columns.push_back(l);
  }
  // A size-1 dim broadcasts against the other operand's size for the same label.
  Shape a_shape = a.t.sizes(), b_shape = b.t.sizes();
  for (const auto* shared : {&batch, &summed}) {
    for (int l : *shared) {
      const int da = position(a.labels, l), db = position(b.labels, l);
      const int64_t size = std::max(a_shape[da], b_shape[db]);
      a_shape[da] = size;
      b_shape[db] = size;
    }
  }
  a.t = a.t.expand(a_shape);
  b.t = b.t.expand(b_shape);
  const Tensor product = bmm(grouped(a, {batch, rows, summed}), grouped(b, {batch, summed, columns}));
  Term out;
  Shape shape;
  for (const auto* group : {&batch, &rows}) {
    for (int l : *group) {
      out.labels.push_back(l);
      shape.push_back(a_shape[position(a.labels, l)]);
    }
  }
  for (int l : columns) {
    out.labels.push_back(l);
    shape.push_back(b_shape[position(b.labels, l)]);
  }
  out.t = product.reshape(shape);
  return out;
}

}  // namespace

inline namespace ops {

Tensor einsum(std::string_view equation_in, const std::vector<Tensor>& operands) {
  std::string equation;
  for (char c : equation_in) {
    if (c != ' ') equation.push_back(c);
  }
  KILN_CHECK(!operands.empty(), "einsum: needs at least one operand for \"{}\"", equation);
  const size_t arrow = equation.find("->");
  const std::string_view lhs = std::string_view(equation).substr(0, arrow);
  // The input terms, comma-separated.
  std::vector<std::vector<int>> terms;
  std::vector<bool> ellipsis;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    bool has = false;
    terms.push_back(
        parse_term(lhs.substr(start, comma == std::string_view::npos ? lhs.npos : comma - start), equation, has));
    ellipsis.push_back(has);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  KILN_CHECK(terms.size() == operands.size(), "einsum: \"{}\" has {} input term(s) but {} operand(s) were given",
             equation, terms.size(), operands.size());
  // Each operand's labels, "..." expanded right-aligned over the widest "..." of all operands.
  int widest = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    KILN_CHECK(operands[i].defined(), "einsum: operand {} is undefined", i);
    const int letters = static_cast<int>(terms[i].size()) - (ellipsis[i] ? 1 : 0);
    const int dims = operands[i].dim();
    KILN_CHECK(ellipsis[i] ? dims >= letters : dims == letters,
               "einsum: the term {} of \"{}\" names {} dim(s){}, but operand {} has {} (shape {})", i, equation,
               letters, ellipsis[i] ? " and \"...\"" : "", i, dims, operands[i].sizes().str());
    if (ellipsis[i]) widest = std::max(widest, dims - letters);
  }
  std::vector<Term> work;
  for (size_t i = 0; i < terms.size(); ++i) {
    Term term{operands[i], {}};
    const int spread = operands[i].dim() - (static_cast<int>(terms[i].size()) - (ellipsis[i] ? 1 : 0));
    for (int l : terms[i]) {
      if (l >= 0) {
        term.labels.push_back(l);
        continue;
      }
      for (int k = 0; k < spread; ++k) term.labels.push_back(kLetters + widest - spread + k);
    }
    work.push_back(std::move(term));
  }
  // The output's labels.
  std::vector<int> output;
  if (arrow != std::string::npos) {
    bool has = false;
    const std::vector<int> out_term = parse_term(std::string_view(equation).substr(arrow + 2), equation, has);
    for (int l : out_term) {
      if (l < 0) {
        for (int k = 0; k < widest; ++k) output.push_back(kLetters + k);
        continue;
      }
      KILN_CHECK(!holds(output, l), "einsum: the output of \"{}\" names '{}' twice", equation, label_name(l));
      bool found = false;
      for (const Term& t : work) found = found || holds(t.labels, l);
      KILN_CHECK(found, "einsum: the output of \"{}\" names '{}', which no input term has", equation, label_name(l));
      output.push_back(l);
    }
  } else {
    for (int k = 0; k < widest; ++k) output.push_back(kLetters + k);
    std::vector<int> count(kLetters, 0);
    for (const Term& t : work) {
      for (int l : t.labels) {
        if (l < kLetters) ++count[l];
      }
    }
    for (int l = 0; l < kLetters; ++l) {
      if (count[l] == 1) output.push_back(l);
    }
  }
  // Diagonals of labels written twice in one term, and the sizes each label takes.
  std::vector<int64_t> size_of(kLetters + widest, -1);
  for (size_t i = 0; i < work.size(); ++i) {
    Term& term = work[i];
    for (int p = 0; p < static_cast<int>(term.labels.size()); ++p) {
      for (int q = static_cast<int>(term.labels.size()) - 1; q > p; --q) {
        if (term.labels[q] != term.labels[p]) continue;
        const int64_t n = term.t.sizes()[p];
        KILN_CHECK(term.t.sizes()[q] == n,
                   "einsum: '{}' is written twice in term {} of \"{}\" for dims of sizes {} and {}",
                   label_name(term.labels[p]), i, equation, n, term.t.sizes()[q]);
        Shape mask_shape(std::vector<int64_t>(term.labels.size(), 1));
        mask_shape[p] = n;
        mask_shape[q] = n;
        const Tensor mask = eye(n, {}, TensorOptions(term.t.dtype()).device(term.t.device()));
        term.t = sum(term.t * mask.reshape(mask_shape), {q});
        term.labels.erase(term.labels.begin() + q);
      }
    }
    for (int d = 0; d < static_cast<int>(term.labels.size()); ++d) {
      const int l = term.labels[d];
      const int64_t n = term.t.sizes()[d];
      KILN_CHECK(size_of[l] < 0 || n == size_of[l] || n == 1 || size_of[l] == 1,
                 "einsum: '{}' of \"{}\" has size {} in operand {} but {} in an earlier one (sizes must match or be 1)",
                 label_name(l), equation, n, i, size_of[l]);
      size_of[l] = std::max(size_of[l], n);
    }
  }
  // Multiply left to right; a label is needed while the output or a later operand holds it.
  const auto needed_after = [&](size_t i) {
    std::vector<int> needed = output;
    for (size_t j = i + 1; j < work.size(); ++j)
      needed.insert(needed.end(), work[j].labels.begin(), work[j].labels.end());
    return needed;
  };
  Term result = std::move(work[0]);
  if (work.size() == 1) {
    sum_unneeded(result, [&](int l) { return holds(output, l); });
  }
  for (size_t i = 1; i < work.size(); ++i) result = contract(std::move(result), std::move(work[i]), needed_after(i));
  // Into the output's order, a size-1 dim expanded where another operand gave the label its size.
  Shape order, shape;
  for (int l : output) {
    order.push_back(position(result.labels, l));
    shape.push_back(size_of[l]);
  }
  return result.t.permute(order).expand(shape);
}

}  // namespace ops
}  // namespace kiln

// ops/print.cpp: printing tensors the way PyTorch does:
//   tensor([[0.1000, 0.2000]], requires_grad=True)
// Floats print with 4 decimals, or as "1." when all are integers, or in scientific notation when the
// values span more than 1000x (or go above 1e8 or below 1e-4); columns are aligned; tensors over
// 1000 elements show 3 items at each end of every dim; lines wrap at 80 columns. The dtype and device
// are added when they are not the defaults (float32 / int64 / bool, cpu).
#include <cmath>
#include <ostream>
#include <sstream>

#include "ops/ops.h"

namespace kiln {
namespace {

constexpr int kLineWidth = 80, kEdgeItems = 3, kThreshold = 1000;

struct Formatter {
  enum Mode { Int, Bool, FloatInt, Fixed, Sci } mode = Fixed;
  size_t width = 1;

  // Scalar, not double: int64 values beyond 2^53 print exactly.
  std::string format(const Scalar& s) const {
    if (mode == Bool) return s.to_bool() ? "True" : "False";
    if (mode == Int) return fmt::format("{}", s.to_int());
    const double v = s.to_double();
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (mode == FloatInt) return fmt::format("{:.0f}.", v);
    if (mode == Sci) return fmt::format("{:.4e}", v);
    return fmt::format("{:.4f}", v);
  }
  std::string padded(const Scalar& v) const {
    std::string s = format(v);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

// The elements a (possibly summarized) print shows, row-major.
void collect(const Tensor& t, bool summarize, std::vector<Scalar>& out) {
  if (t.dim() == 0) {
    out.push_back(t.item());
    return;
  }
  const int64_t n = t.sizes()[0];
  auto take = [&](int64_t i) {
    if (t.dim() == 1) out.push_back(t.select(0, i).item());
    else collect(t.select(0, i), summarize, out);
  };
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) take(i);
    for (int64_t i = n - kEdgeItems; i < n; ++i) take(i);
  } else {
    for (int64_t i = 0; i < n; ++i) take(i);
  }
}

Formatter make_formatter(const Tensor& t, const std::vector<Scalar>& values) {
  Formatter f;
  if (t.dtype() == kBool) f.mode = Formatter::Bool;
  else if (!is_floating(t.dtype())) f.mode = Formatter::Int;
  else {
    double lo = INFINITY, hi = 0;
    bool all_int = true, any = false;
    for (const Scalar& s : values) {
      const double v = s.to_double();
      if (!std::isfinite(v) || v == 0) continue;
      any = true;
      lo = std::min(lo, std::fabs(v));
      hi = std::max(hi, std::fabs(v));
      all_int &= std::ceil(v) == v;
    }
    if (!any) f.mode = Formatter::FloatInt;
    else if (all_int) f.mode = (hi / lo > 1000 || hi > 1e8) ? Formatter::Sci : Formatter::FloatInt;
    else f.mode = (hi / lo > 1000 || hi > 1e8 || lo < 1e-4) ? Formatter::Sci : Formatter::Fixed;
  }
  for (const Scalar& v : values) f.width = std::max(f.width, f.format(v).size());
  return f;
}

std::string body(const Tensor& t, int indent, bool summarize, const Formatter& f) {
  if (t.dim() == 0) return f.format(t.item());
  const int64_t n = t.sizes()[0];
  const bool cut = summarize && n > 2 * kEdgeItems;
  if (t.dim() == 1) {
    std::vector<std::string> items;
    for (int64_t i = 0; i < n; ++i) {
      if (cut && i == kEdgeItems) {
        items.push_back(" ...");
        i = n - kEdgeItems;
      }
      items.push_back(f.padded(t.select(0, i).item()));
    }
    const size_t per_line = std::max<size_t>(1, (kLineWidth - indent) / (f.width + 2));
    std::string s = "[";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) s += (i % per_line == 0) ? ",\n" + std::string(indent + 1, ' ') : ", ";
      s += items[i];
    }
    return s + "]";
  }
  std::vector<std::string> slices;
  for (int64_t i = 0; i < n; ++i) {
    if (cut && i == kEdgeItems) {
      slices.push_back("...");
      i = n - kEdgeItems;
    }
    slices.push_back(body(t.select(0, i), indent + 1, summarize, f));
  }
  std::string sep = "," + std::string(t.dim() - 1, '\n') + std::string(indent + 1, ' ');
  std::string s = "[";
  for (size_t i = 0; i < slices.size(); ++i) s += (i ? sep : "") + slices[i];
  return s + "]";
}

}  // namespace

inline namespace ops {

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "[ undefined Tensor ]";
  const std::string prefix = "tensor(";
  const int indent = static_cast<int>(prefix.size());
  Tensor c = t.detach().to(Device::cpu());
  std::vector<std::string> suffixes;
  std::string s;
  if (c.numel() == 0) {
    s = "[]";
    if (c.dim() != 1) {  // 2 or more dims: "(0, 3)"
      std::string size = c.sizes().str();
      suffixes.push_back("size=(" + size.substr(1, size.size() - 2) + ")");
    }
  } else {
    bool summarize = c.numel() > kThreshold;
    std::vector<Scalar> values;
    collect(c, summarize, values);
    s = body(c, indent, summarize, make_formatter(c, values));
  }
  if (t.device() != Device::cpu()) suffixes.push_back("device='" + t.device().str() + "'");
  // As PyTorch: int64 and bool values show their dtype by their look, except where there are none.
  if (t.dtype() != kFloat32 && (c.numel() == 0 || (t.dtype() != kInt64 && t.dtype() != kBool))) {
    suffixes.push_back("dtype=kiln." + std::string(dtype_name(t.dtype())));
  }
  if (t.grad_fn()) suffixes.push_back(std::string("grad_fn=<") + t.grad_fn()->name() + ">");
  else if (t.requires_grad()) suffixes.push_back("requires_grad=True");
  // PyTorch's _add_suffixes: on the same line while it fits in 80 columns.
  std::string out = prefix + s;
  size_t newline = out.rfind('\n');
  size_t last_line = newline == std::string::npos ? out.size() + 2 : out.size() - newline + 1;
  for (const auto& suffix : suffixes) {
    if (last_line + suffix.size() + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + suffix;
      last_line = indent + suffix.size();
    } else {
      out += ", " + suffix;
      last_line += suffix.size() + 2;
    }
  }
  return out + ")";
}

}  // namespace ops

std::string Tensor::str() const { return ops::to_string(*this); }
std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << ops::to_string(t); }

}  // namespace kiln

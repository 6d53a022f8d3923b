// tests/ops/golden_fixture.cpp: see golden_fixture.h.
#include "golden_fixture.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "support.h"

namespace kiln::test {
namespace {

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error("op_golden fixture: " + what); }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  parts.push_back(cur);
  return parts;
}

int64_t to_int(const std::string& s) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    bad("not an integer: '" + s + "'");
  }
  if (used != s.size()) bad("not an integer: '" + s + "'");
  return v;
}

double to_real(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') bad("not a number: '" + s + "'");
  return v;
}

std::vector<int64_t> to_ints(const std::string& s) {  // "[0,2]" or "[]"
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') bad("not a list: '" + s + "'");
  std::string inner = s.substr(1, s.size() - 2);
  std::vector<int64_t> v;
  if (inner.empty()) return v;
  for (const auto& p : split(inner, ',')) v.push_back(to_int(p));
  return v;
}

}  // namespace

// ---- GoldenCase ----

std::string GoldenCase::describe() const {
  std::ostringstream os;
  os << id() << " (";
  bool first = true;
  for (const auto& [k, v] : args) {
    os << (first ? "" : " ") << k << "=" << v;
    first = false;
  }
  os << ")";
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    os << "; input " << i << ": " << dtype_name(in.dtype) << " base " << in.shape.str();
    if (in.layout != "-") os << " layout " << in.layout;
    if (in.offset < 0) os << " = sample(seed " << in.sample_seed << ")";
  }
  return os.str();
}

const std::string& GoldenCase::str(const std::string& key) const {
  auto it = args.find(key);
  if (it == args.end()) bad("case " + id() + " has no argument '" + key + "'");
  return it->second;
}
int64_t GoldenCase::integer(const std::string& key) const { return to_int(str(key)); }
std::optional<int64_t> GoldenCase::opt_integer(const std::string& key) const {
  return has(key) ? std::optional<int64_t>(integer(key)) : std::nullopt;
}
double GoldenCase::real(const std::string& key) const { return to_real(str(key)); }
std::vector<int64_t> GoldenCase::ints(const std::string& key) const { return to_ints(str(key)); }
Scalar GoldenCase::scalar(const std::string& key) const {
  const std::string& s = str(key);
  if (s.size() < 3 || s[1] != ':') bad("case " + id() + ": not a tagged scalar: '" + s + "'");
  std::string v = s.substr(2);
  switch (s[0]) {
    case 'f': return Scalar(to_real(v));
    case 'i': return Scalar(to_int(v));
    case 'b': return Scalar(to_int(v) != 0);
  }
  bad("case " + id() + ": unknown scalar kind in '" + s + "'");
}
std::optional<Scalar> GoldenCase::opt_scalar(const std::string& key) const {
  return has(key) ? std::optional<Scalar>(scalar(key)) : std::nullopt;
}
DType GoldenCase::dtype(const std::string& key) const { return GoldenFile::parse_dtype(str(key)); }
std::optional<DType> GoldenCase::opt_dtype(const std::string& key) const {
  return has(key) ? std::optional<DType>(dtype(key)) : std::nullopt;
}

// ---- GoldenFile ----

DType GoldenFile::parse_dtype(const std::string& name) {
  static const std::map<std::string, DType> names = {
      {"float32", kFloat32}, {"float64", kFloat64}, {"float16", kFloat16}, {"bfloat16", kBFloat16},
      {"int32", kInt32},     {"int64", kInt64},     {"uint8", kUInt8},       {"int8", kInt8},
      {"bool", kBool}};
  auto it = names.find(name);
  if (it == names.end()) bad("unknown dtype '" + name + "'");
  return it->second;
}

const GoldenFile& GoldenFile::get() {
  static const GoldenFile file;
  return file;
}

GoldenFile::GoldenFile() {
  const std::string dir = KILN_TEST_FIXTURES;
  std::ifstream bin(dir + "/op_golden.bin", std::ios::binary);
  if (!bin) bad("cannot open " + dir + "/op_golden.bin (run tests/fixtures/gen_golden.py)");
  data_.assign(std::istreambuf_iterator<char>(bin), std::istreambuf_iterator<char>());

  std::ifstream txt(dir + "/op_golden.txt");
  if (!txt) bad("cannot open " + dir + "/op_golden.txt (run tests/fixtures/gen_golden.py)");
  std::string line;
  bool header = false;
  int lineno = 0;
  auto tensor_spec = [&](const std::vector<std::string>& tok, bool is_input) {
    if (tok.size() != (is_input ? 5u : 4u)) bad("line " + std::to_string(lineno) + ": wrong number of fields");
    GoldenTensor t;
    t.dtype = parse_dtype(tok[1]);
    t.shape = Shape(to_ints(tok[2]));
    if (tok[3].rfind("@", 0) == 0) {
      t.offset = to_int(tok[3].substr(1));
      int64_t bytes = t.shape.numel() * itemsize(t.dtype);
      if (t.offset < 0 || t.offset + bytes > static_cast<int64_t>(data_.size()))
        bad("line " + std::to_string(lineno) + ": data outside op_golden.bin");
    } else if (is_input && tok[3].rfind("sample:", 0) == 0) {
      t.sample_seed = to_real(tok[3].substr(7));
    } else {
      bad("line " + std::to_string(lineno) + ": bad source '" + tok[3] + "'");
    }
    if (is_input) t.layout = tok[4];
    return t;
  };
  while (std::getline(txt, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> tok = split(line, ' ');
    if (!header) {
      if (line != "kiln-op-golden 1") bad("unknown header '" + line + "'");
      header = true;
    } else if (tok[0] == "case") {
      if (tok.size() < 3) bad("line " + std::to_string(lineno) + ": a case needs an op and a name");
      GoldenCase c;
      c.op = tok[1];
      c.name = tok[2];
      for (size_t i = 3; i < tok.size(); ++i) {
        auto eq = tok[i].find('=');
        if (eq == std::string::npos) bad("line " + std::to_string(lineno) + ": not key=value: " + tok[i]);
        c.args[tok[i].substr(0, eq)] = tok[i].substr(eq + 1);
      }
      cases_.push_back(std::move(c));
    } else if (tok[0] == "in" || tok[0] == "out") {
      if (cases_.empty()) bad("line " + std::to_string(lineno) + ": a tensor before any case");
      auto& c = cases_.back();
      (tok[0] == "in" ? c.inputs : c.outputs).push_back(tensor_spec(tok, tok[0] == "in"));
    } else {
      bad("line " + std::to_string(lineno) + ": unknown record '" + tok[0] + "'");
    }
  }
  if (!header || cases_.empty()) bad("no cases in op_golden.txt");
}

Tensor GoldenFile::load(const GoldenTensor& t) const {
  if (t.offset < 0) return sample(t.shape, kFloat32, t.sample_seed).to(t.dtype);
  Tensor out = empty(t.shape, t.dtype);
  if (out.numel() > 0) std::memcpy(out.data_ptr(), data_.data() + t.offset, static_cast<size_t>(out.nbytes()));
  return out;
}

Tensor GoldenFile::apply_layout(const Tensor& base, const std::string& layout) {
  if (layout == "-") return base;
  if (layout == "mT") return base.mT();
  if (layout == "step2") return base.slice(-1, 0, std::nullopt, 2);
  auto colon = layout.find(':');
  std::string kind = layout.substr(0, colon), rest = colon == std::string::npos ? "" : layout.substr(colon + 1);
  auto list = [&] {
    std::vector<int64_t> v;
    for (const auto& p : split(rest, ',')) v.push_back(to_int(p));
    return Shape(v);
  };
  if (kind == "expand") return base.expand(list());
  if (kind == "permute") return base.permute(list());
  if (kind == "narrow") {
    auto p = split(rest, ':');
    if (p.size() != 3) bad("bad layout '" + layout + "'");
    return base.narrow(to_int(p[0]), to_int(p[1]), to_int(p[2]));
  }
  bad("unknown layout '" + layout + "'");
}

}  // namespace kiln::test

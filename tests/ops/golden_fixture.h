// tests/ops/golden_fixture.h: reads the op table's golden values, tests/fixtures/op_golden.txt (index) and
// op_golden.bin (data), written by tests/fixtures/gen_golden.py; the format is described in that script's
// header. Each case names an op, its arguments (key=value), its inputs (stored, or made by
// kiln::test::sample) with a layout that makes them non-contiguous, and PyTorch's outputs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <kiln/kiln.h>

namespace kiln::test {

struct GoldenTensor {
  DType dtype = kFloat32;
  Shape shape;                        // inputs: the stored base's shape, before the layout
  int64_t offset = -1;                // byte offset into op_golden.bin; -1: made by sample()
  double sample_seed = 0;             // when offset == -1: sample(shape, kFloat32, seed).to(dtype)
  std::string layout = "-";           // inputs only: -, mT, step2, expand:<shape>, permute:<dims>, narrow:d:s:n
};

struct GoldenCase {
  std::string op, name;
  std::map<std::string, std::string> args;
  std::vector<GoldenTensor> inputs, outputs;

  std::string id() const { return op + "/" + name; }
  std::string describe() const;  // id, args, and each input's dtype, shape and layout

  // Arguments (gen_golden.py's spellings). A missing key without a default throws std::runtime_error.
  bool has(const std::string& key) const { return args.count(key) != 0; }
  const std::string& str(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
  std::optional<int64_t> opt_integer(const std::string& key) const;
  double real(const std::string& key) const;  // accepts inf, -inf, nan
  double real(const std::string& key, double fallback) const { return has(key) ? real(key) : fallback; }
  bool flag(const std::string& key, bool fallback = false) const { return has(key) ? integer(key) != 0 : fallback; }
  std::vector<int64_t> ints(const std::string& key) const;  // [0,2]
  Shape shape(const std::string& key) const { return Shape(ints(key)); }
  Shape shape(const std::string& key, const Shape& fallback) const { return has(key) ? shape(key) : fallback; }
  Scalar scalar(const std::string& key) const;  // f:2.5, i:3, b:1
  Scalar scalar(const std::string& key, const Scalar& fallback) const { return has(key) ? scalar(key) : fallback; }
  std::optional<Scalar> opt_scalar(const std::string& key) const;
  DType dtype(const std::string& key) const;
  std::optional<DType> opt_dtype(const std::string& key) const;
  int grad_level() const { return static_cast<int>(integer("grad", 0)); }  // 1: gradcheck, 2: also gradgradcheck
};

class GoldenFile {
 public:
  // Loads KILN_TEST_FIXTURES/op_golden.{txt,bin} once; throws std::runtime_error on a malformed file.
  static const GoldenFile& get();

  const std::vector<GoldenCase>& cases() const { return cases_; }
  // The stored base of input k (contiguous, its own storage).
  Tensor base_input(const GoldenCase& c, size_t k) const { return load(c.inputs.at(k)); }
  // Input k as the op sees it: the base with the layout applied (a view: often non-contiguous).
  Tensor input(const GoldenCase& c, size_t k) const { return apply_layout(base_input(c, k), c.inputs.at(k).layout); }
  Tensor output(const GoldenCase& c, size_t k) const { return load(c.outputs.at(k)); }

  static Tensor apply_layout(const Tensor& base, const std::string& layout);
  static DType parse_dtype(const std::string& name);

 private:
  GoldenFile();
  Tensor load(const GoldenTensor& t) const;

  std::vector<GoldenCase> cases_;
  std::vector<char> data_;
};

}  // namespace kiln::test

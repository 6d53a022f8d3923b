// tests/support.h: what the tests share: closeness checks with the tolerances of DESIGN.md §8,
// checks on Error messages, and small tensor builders.
#pragma once

#include <catch2/catch.hpp>
#include <functional>
#include <optional>
#include <string>

#include <kiln/kiln.h>

namespace kiln::test {

struct Tolerance {
  double rtol, atol;
};
// f64 1e-7/1e-7, f32 1.3e-6/1e-5, f16 1e-3/1e-5, bf16 1.6e-2/1e-5 (DESIGN.md §8).
Tolerance tolerance_for(DType dtype);

// Every element of `actual` within atol + rtol * |expected| of `expected` (same shape; NaNs must
// match NaNs, infinities must match). On failure, says where and by how much.
void check_close(const Tensor& actual, const Tensor& expected, Tolerance tol);
void check_close(const Tensor& actual, const Tensor& expected);  // tolerance of actual's dtype
// Exact equality of shape, dtype and values.
void check_equal(const Tensor& actual, const Tensor& expected);
// |actual - expected| <= bound element by element (expected and bound float64, of actual's shape);
// on failure says by how much the worst element exceeds its bound, under the label `what`.
void check_within(const std::string& what, const Tensor& actual, const Tensor& expected, const Tensor& bound);

// fn() must throw kiln::Error whose message contains every one of `fragments`.
void check_error(const std::function<void()>& fn, const std::vector<std::string>& fragments);

// f2(relu(norm(f1(x)))): Linears around a LayerNorm, the small net of the mixed-precision tests (its
// Linears' parameters are autocast's and lower_precision_safe_modules' by default, the norm's are not).
struct NormNet : nn::Module {
  nn::Linear f1;
  nn::LayerNorm norm;
  nn::Linear f2;
  NormNet(int64_t in, int64_t hidden, int64_t out) : f1(in, hidden), norm(hidden), f2(hidden, out) {
    register_modules({{"f1", f1}, {"norm", norm}, {"f2", f2}});
  }
  Tensor forward(const Tensor& x) override { return f2(relu(norm(f1(x)))); }
};

// Scoped switches, restored at scope exit: kernel fusion (set_fusion) and the CPU pool's thread count.
struct FusionGuard {
  explicit FusionGuard(bool on) : previous(fusion_enabled()) { set_fusion(on); }
  ~FusionGuard() { set_fusion(previous); }
  FusionGuard(const FusionGuard&) = delete;
  FusionGuard& operator=(const FusionGuard&) = delete;
  bool previous;
};
struct ThreadsGuard {
  explicit ThreadsGuard(int n) : previous(get_num_threads()) { set_num_threads(n); }
  ~ThreadsGuard() { set_num_threads(previous); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;
  int previous;
};

// An environment variable set (value nullptr: unset) for the scope, then restored, for switches that
// are read at each call (KILN_CUDA_ATTENTION).
struct EnvGuard {
  EnvGuard(const char* name, const char* value);
  ~EnvGuard();
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  std::string name;
  std::optional<std::string> previous;
};

// What fn() writes to the file descriptor fd (1: stdout, 2: stderr), which is redirected to a
// temporary file meanwhile (the C streams flushed before and after).
std::string captured_output(int fd, const std::function<void()>& fn);

// Deterministic, non-trivial values in (-2, 2) (no RNG needed): element i gets sin(1.3 i + seed).
Tensor sample(const Shape& shape, DType dtype = kFloat32, double seed = 0.5);
// float64 sin(0.37 i + seed), requiring grad when asked: the inputs of the autograd tests' torch
// scripts (the same expression there).
Tensor sines(const Shape& shape, double seed, bool requires_grad = true);

// The folder <temp dir>/<stem>-<pid>, made on the first call for `stem` and removed, with what it
// holds, when the test program exits: a test's scratch files outlive its cases, not its process.
std::string process_scratch_dir(const std::string& stem);

}  // namespace kiln::test

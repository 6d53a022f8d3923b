// tests/support.cpp: see support.h.
#include "support.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

namespace kiln::test {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case kFloat64: return {1e-7, 1e-7};
    case kFloat16: return {1e-3, 1e-5};
    case kBFloat16: return {1.6e-2, 1e-5};
    default: return {1.3e-6, 1e-5};
  }
}

void check_close(const Tensor& actual, const Tensor& expected, Tolerance tol) {
  INFO("actual shape " << actual.sizes().str() << ", expected shape " << expected.sizes().str());
  REQUIRE(actual.sizes() == expected.sizes());
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  int64_t bad = -1;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok;
    if (std::isnan(e[i])) ok = std::isnan(a[i]);
    else if (std::isinf(e[i])) ok = a[i] == e[i];
    else ok = std::fabs(a[i] - e[i]) <= tol.atol + tol.rtol * std::fabs(e[i]);
    if (!ok && bad < 0) bad = static_cast<int64_t>(i);
    if (!ok) worst = std::max(worst, std::fabs(a[i] - e[i]));
  }
  if (bad >= 0) {
    FAIL_CHECK("element " << bad << " (flat) differs: actual " << a[bad] << ", expected " << e[bad]
                          << "; worst |diff| " << worst << " (rtol " << tol.rtol << ", atol " << tol.atol << ")");
  }
}

void check_close(const Tensor& actual, const Tensor& expected) {
  check_close(actual, expected, tolerance_for(actual.dtype()));
}

void check_equal(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.sizes() == expected.sizes());
  REQUIRE(dtype_name(actual.dtype()) == dtype_name(expected.dtype()));
  CHECK(actual.to_vector<double>() == expected.to_vector<double>());
}

void check_within(const std::string& what, const Tensor& actual, const Tensor& expected, const Tensor& bound) {
  REQUIRE(actual.sizes() == expected.sizes());
  const double worst = ((actual.to(kFloat64) - expected).abs() - bound).max().item<double>();
  INFO(what << ": the worst element exceeds its bound by " << worst);
  CHECK(worst <= 0.0);
}

void check_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) {
      INFO("message: " << msg);
      CHECK(msg.find(f) != std::string::npos);
    }
    return;
  }
  FAIL("expected a kiln::Error, but nothing was thrown");
}

EnvGuard::EnvGuard(const char* name_, const char* value) : name(name_) {
  if (const char* v = std::getenv(name_)) previous = v;
  if (value != nullptr) setenv(name_, value, 1);
  else unsetenv(name_);
}

EnvGuard::~EnvGuard() {
  if (previous) setenv(name.c_str(), previous->c_str(), 1);
  else unsetenv(name.c_str());
}

Tensor sample(const Shape& shape, DType dtype, double seed) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 2 * std::sin(1.3 * static_cast<double>(i) + seed) * 0.99;
  return from_vector(v, shape).to(dtype);
}

Tensor sines(const Shape& shape, double seed, bool requires_grad) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + seed);
  Tensor t = from_vector(v, shape);
  return requires_grad ? t.requires_grad_() : t;
}

std::string captured_output(int fd, const std::function<void()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  const int saved = ::dup(fd);
  ::dup2(::fileno(file), fd);
  struct Restore {  // however fn() ends
    int fd, saved;
    ~Restore() {
      std::fflush(stdout);
      std::fflush(stderr);
      ::dup2(saved, fd);
      ::close(saved);
    }
  };
  {
    Restore restore{fd, saved};
    fn();
  }
  std::string text;
  std::rewind(file);
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  return text;
}

std::string process_scratch_dir(const std::string& stem) {
  static struct Dirs {
    std::mutex mutex;
    std::map<std::string, std::filesystem::path> made;
    ~Dirs() {
      for (const auto& [name, path] : made) {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
      }
    }
  } dirs;
  std::lock_guard<std::mutex> lock(dirs.mutex);
  auto [it, fresh] =
      dirs.made.try_emplace(stem, std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid())));
  if (fresh) std::filesystem::create_directories(it->second);
  return it->second.string();
}

}  // namespace kiln::test

// core/error.h: kiln::Error, the one exception type Kiln throws, and the checks that raise it.
//
// Every misuse (bad shapes, dims, dtypes, devices, indices, a freed graph...) becomes a kiln::Error
// whose message names the op, the shapes/dtypes/devices involved and what to do. Never an assert,
// never an abort. KILN_CHECK(cond, fmt, args...) formats the message only when the check fails.
#pragma once

#include <fmt/core.h>

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocator that could not get memory throws this kind of Error (PyTorch's
// torch.OutOfMemoryError), so that a program can tell "too big for this machine" from misuse and say
// which of its settings to lower.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_error(std::string message);

}  // namespace kiln

#define KILN_CHECK(cond, ...)                                        \
  do {                                                               \
    if (!(cond)) [[unlikely]] ::kiln::throw_error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define KILN_FAIL(...) ::kiln::throw_error(::fmt::format(__VA_ARGS__))

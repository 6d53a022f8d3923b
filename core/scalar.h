// core/scalar.h: Scalar, a number that is not a tensor (the 2 in `x * 2`): bool, integer or float.
//
// Its kind matters for type promotion: an int tensor times 2 stays int, times 2.5 becomes float,
// as in PyTorch.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/dtype.h"

namespace kiln {

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };

  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}  // NOLINT: numbers convert implicitly
  // An integer past int64 (a uint64 above 2^63 - 1) is an Error, as PyTorch's "Overflow when
  // unpacking long", not a wrapped negative number.
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Scalar(T v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {  // NOLINT
    if constexpr (!std::in_range<int64_t>(std::numeric_limits<T>::max())) {
      KILN_CHECK(std::in_range<int64_t>(v), "the value {} is past int64's range, which scalars hold", v);
    }
  }
  template <std::floating_point T>
  Scalar(T v) : kind_(Kind::Float), d_(static_cast<double>(v)) {}  // NOLINT
  Scalar(Half v) : Scalar(static_cast<float>(v)) {}                // NOLINT
  Scalar(BFloat16 v) : Scalar(static_cast<float>(v)) {}            // NOLINT

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Int; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  double to_double() const { return kind_ == Kind::Float ? d_ : static_cast<double>(i_); }
  // A float scalar that is nan, infinite or beyond int64 is an Error, as in PyTorch ("value cannot
  // be converted to type int64_t without overflow").
  int64_t to_int() const {
    if (kind_ != Kind::Float) return i_;
    KILN_CHECK(d_ >= -0x1p63 && d_ < 0x1p63, "the value {} cannot be converted to int64 without overflow", d_);
    return static_cast<int64_t>(d_);
  }
  bool to_bool() const { return kind_ == Kind::Float ? d_ != 0 : i_ != 0; }
  // The value must fit T, as PyTorch's checked conversions (fill_, full, item): full({2}, 1e10,
  // kInt32) and full({2}, 1e10, kFloat16) are Errors, not a wrap or an inf; inf and nan go to a
  // floating type as they are.
  template <typename T> T to() const {
    if constexpr (std::is_same_v<T, bool>) {
      return to_bool();
    } else if constexpr (std::is_integral_v<T>) {
      constexpr const char* name = std::is_signed_v<T> ? "int" : "uint";
      if (kind_ == Kind::Float) {  // against T's range itself: nan, or 3e9 for int32, names int32
        const double upper = std::ldexp(1.0, std::numeric_limits<T>::digits), lower = std::is_signed_v<T> ? -upper : 0;
        KILN_CHECK(d_ >= lower && d_ < upper, "the value {} cannot be converted to {}{} without overflow", d_, name,
                   8 * sizeof(T));
        return static_cast<T>(d_);
      }
      KILN_CHECK(std::in_range<T>(i_), "the value {} cannot be converted to {}{} without overflow", i_, name,
                 8 * sizeof(T));
      return static_cast<T>(i_);
    } else {
      const double v = to_double();
      if constexpr (!std::is_same_v<T, double>) {
        KILN_CHECK(!std::isfinite(v) || std::fabs(v) <= largest_finite(dtype_of<T>()),
                   "the value {} cannot be converted to {} without overflow", v, dtype_name(dtype_of<T>()));
      }
      return static_cast<T>(static_cast<opmath_t<T>>(v));
    }
  }
  // The dtype a tensor made from this scalar gets: bool, int64 or the default float (float32).
  DType default_dtype() const {
    return kind_ == Kind::Bool ? kBool : kind_ == Kind::Int ? kInt64 : kFloat32;
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

}  // namespace kiln

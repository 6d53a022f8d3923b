// core/scalar.h: Scalar, a number that is not a tensor (the 2 in `x * 2`): bool, integer or float.
//
// Its kind matters for type promotion: an int tensor times 2 stays int, times 2.5 becomes float,
// as in PyTorch.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>

#include "core/dtype.h"

namespace kiln {

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };

  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}  // NOLINT: numbers convert implicitly
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Scalar(T v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {}  // NOLINT
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
  // To an integer type, the value must fit it: full({2}, 1e10, kInt32) is an Error, not a wrap.
  template <typename T> T to() const {
    if constexpr (std::is_same_v<T, bool>) {
      return to_bool();
    } else if constexpr (std::is_integral_v<T>) {
      const int64_t v = to_int();
      KILN_CHECK(v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max(),
                 "the value {} cannot be converted to {}{} without overflow", v,
                 std::is_signed_v<T> ? "int" : "uint", 8 * sizeof(T));
      return static_cast<T>(v);
    } else {
      return static_cast<T>(static_cast<opmath_t<T>>(to_double()));
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

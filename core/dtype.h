// core/dtype.h: the element types a Tensor can hold, their sizes and names, PyTorch's promotion
// rules, and the KILN_DISPATCH_* macros that turn a runtime DType into a C++ type `scalar_t`.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/half.h"

namespace kiln {

// The values are stable (a pipeline stage's message header carries them), so new dtypes go at the
// end; promote_types() orders them by category (bool < integers < floating), not by value.
enum class DType : uint8_t { Bool, Int32, Int64, Float16, BFloat16, Float32, Float64, UInt8, Int8 };
inline constexpr int kNumDTypes = 9;

// LibTorch's spellings.
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt8 = DType::UInt8, kByte = DType::UInt8;
inline constexpr DType kInt8 = DType::Int8, kChar = DType::Int8;
inline constexpr DType kInt32 = DType::Int32, kInt = DType::Int32;
inline constexpr DType kInt64 = DType::Int64, kLong = DType::Int64;
inline constexpr DType kFloat16 = DType::Float16, kHalf = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat32 = DType::Float32, kFloat = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64, kDouble = DType::Float64;

constexpr int64_t itemsize(DType t) {
  switch (t) {
    case DType::Bool:
    case DType::UInt8:
    case DType::Int8: return 1;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Int32:
    case DType::Float32: return 4;
    case DType::Int64:
    case DType::Float64: return 8;
  }
  return 0;
}
constexpr bool is_floating(DType t) { return t >= DType::Float16 && t <= DType::Float64; }
constexpr bool is_integral(DType t) {  // not bool
  return t == DType::UInt8 || t == DType::Int8 || t == DType::Int32 || t == DType::Int64;
}
constexpr bool is_reduced_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
// The largest finite value of a floating dtype (torch.finfo(t).max); 0 for the others.
constexpr double largest_finite(DType t) {
  switch (t) {
    case DType::Float16: return 65504.0;
    case DType::BFloat16: return 0x1.fep127;
    case DType::Float32: return 0x1.fffffep127;
    case DType::Float64: return 0x1.fffffffffffffp1023;
    default: return 0;
  }
}

std::string_view dtype_name(DType t);  // "float32", "bfloat16", "int64", "bool", ...

// torch.promote_types: the smallest type both convert to without losing category.
// f16 with bf16 gives f32, as in PyTorch.
DType promote_types(DType a, DType b);

// The C++ type of each dtype, and back.
template <DType T> struct CppType;
template <> struct CppType<DType::Bool> { using type = bool; };
template <> struct CppType<DType::UInt8> { using type = uint8_t; };
template <> struct CppType<DType::Int8> { using type = int8_t; };
template <> struct CppType<DType::Int32> { using type = int32_t; };
template <> struct CppType<DType::Int64> { using type = int64_t; };
template <> struct CppType<DType::Float16> { using type = Half; };
template <> struct CppType<DType::BFloat16> { using type = BFloat16; };
template <> struct CppType<DType::Float32> { using type = float; };
template <> struct CppType<DType::Float64> { using type = double; };

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::UInt8; }
template <> constexpr DType dtype_of<int8_t>() { return DType::Int8; }
template <> constexpr DType dtype_of<int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<Half>() { return DType::Float16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BFloat16; }
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }

// The type arithmetic happens in: float for the 16-bit floats, the type itself otherwise.
template <typename T> struct OpMath { using type = T; };
template <> struct OpMath<Half> { using type = float; };
template <> struct OpMath<BFloat16> { using type = float; };
template <typename T> using opmath_t = typename OpMath<T>::type;

}  // namespace kiln

// Dispatch: KILN_DISPATCH_FLOAT_TYPES(dtype, "op", [&] { kernel<scalar_t>(...); });
// The lambda is instantiated once per listed type with `scalar_t` bound to it.
#define KILN_DTYPE_CASE_(enum_value, ...)                                \
  case enum_value: {                                                     \
    using scalar_t = ::kiln::CppType<enum_value>::type;                  \
    return __VA_ARGS__();                                                \
  }

// Float32 and float64 only: the kernels that ops/ feeds 16-bit floats converted to float32
// (convolution, pooling, normalisation) and the fused Adam step.
#define KILN_DISPATCH_F32_F64(dtype, name, ...)                                       \
  [&] {                                                                               \
    switch (dtype) {                                                                  \
      KILN_DTYPE_CASE_(::kiln::DType::Float32, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::Float64, __VA_ARGS__)                           \
      default:                                                                        \
        KILN_FAIL("{}: the kernel takes float32 or float64, got {}", name,            \
                  ::kiln::dtype_name(dtype));                                         \
    }                                                                                 \
  }()
#define KILN_DISPATCH_FLOAT_TYPES(dtype, name, ...)                                   \
  [&] {                                                                               \
    switch (dtype) {                                                                  \
      KILN_DTYPE_CASE_(::kiln::DType::Float32, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::Float64, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::Float16, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::BFloat16, __VA_ARGS__)                          \
      default:                                                                        \
        KILN_FAIL("{}: not implemented for dtype {}; use a floating dtype", name,     \
                  ::kiln::dtype_name(dtype));                                         \
    }                                                                                 \
  }()

// Every numeric dtype except bool.
#define KILN_DISPATCH_NUMERIC_TYPES(dtype, name, ...)                                 \
  [&] {                                                                               \
    switch (dtype) {                                                                  \
      KILN_DTYPE_CASE_(::kiln::DType::Float32, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::Float64, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::Float16, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::BFloat16, __VA_ARGS__)                          \
      KILN_DTYPE_CASE_(::kiln::DType::Int32, __VA_ARGS__)                             \
      KILN_DTYPE_CASE_(::kiln::DType::Int64, __VA_ARGS__)                             \
      KILN_DTYPE_CASE_(::kiln::DType::UInt8, __VA_ARGS__)                             \
      KILN_DTYPE_CASE_(::kiln::DType::Int8, __VA_ARGS__)                              \
      default:                                                                        \
        KILN_FAIL("{}: not implemented for dtype {}", name, ::kiln::dtype_name(dtype)); \
    }                                                                                 \
  }()

#define KILN_DISPATCH_ALL_TYPES(dtype, name, ...)                                     \
  [&] {                                                                               \
    switch (dtype) {                                                                  \
      KILN_DTYPE_CASE_(::kiln::DType::Float32, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::Float64, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::Float16, __VA_ARGS__)                           \
      KILN_DTYPE_CASE_(::kiln::DType::BFloat16, __VA_ARGS__)                          \
      KILN_DTYPE_CASE_(::kiln::DType::Int32, __VA_ARGS__)                             \
      KILN_DTYPE_CASE_(::kiln::DType::Int64, __VA_ARGS__)                             \
      KILN_DTYPE_CASE_(::kiln::DType::UInt8, __VA_ARGS__)                             \
      KILN_DTYPE_CASE_(::kiln::DType::Int8, __VA_ARGS__)                              \
      KILN_DTYPE_CASE_(::kiln::DType::Bool, __VA_ARGS__)                              \
    }                                                                                 \
    KILN_FAIL("{}: unknown dtype", name);                                             \
  }()

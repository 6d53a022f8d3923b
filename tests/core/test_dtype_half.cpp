// tests/core/test_dtype_half.cpp: dtype sizes, names and promotion (PyTorch's table), and the 16-bit
// float conversions (round to nearest even, overflow, subnormals, NaN).
#include <cmath>
#include <cstring>
#include <limits>

#include "support.h"

using namespace kiln;

static float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST_CASE("dtype sizes and names") {
  CHECK(itemsize(kBool) == 1);
  CHECK(itemsize(kInt32) == 4);
  CHECK(itemsize(kInt64) == 8);
  CHECK(itemsize(kFloat16) == 2);
  CHECK(itemsize(kBFloat16) == 2);
  CHECK(itemsize(kFloat32) == 4);
  CHECK(itemsize(kFloat64) == 8);
  CHECK(dtype_name(kBFloat16) == "bfloat16");
  CHECK(dtype_name(kInt64) == "int64");
}

TEST_CASE("promote_types follows torch.promote_types") {
  // Values from torch.promote_types (PyTorch 1.13).
  CHECK(promote_types(kBool, kInt32) == kInt32);
  CHECK(promote_types(kInt32, kInt64) == kInt64);
  CHECK(promote_types(kInt64, kFloat16) == kFloat16);
  CHECK(promote_types(kFloat16, kBFloat16) == kFloat32);
  CHECK(promote_types(kBFloat16, kFloat32) == kFloat32);
  CHECK(promote_types(kFloat32, kFloat64) == kFloat64);
  CHECK(promote_types(kBool, kBool) == kBool);
  CHECK(promote_types(kInt32, kFloat32) == kFloat32);
}

TEST_CASE("result_type: dimensioned tensors decide, 0-dim tensors and scalars only raise the category") {
  Tensor i32 = zeros({3}, kInt32), f16 = zeros({3}, kFloat16);
  CHECK(result_type(i32, Scalar(2)) == kInt32);
  CHECK(result_type(i32, Scalar(2.5)) == kFloat32);
  CHECK(result_type(f16, Scalar(2.5)) == kFloat16);
  CHECK(result_type(f16, zeros({}, kFloat64)) == kFloat16);
  CHECK(result_type(i32, zeros({}, kFloat64)) == kFloat64);
  CHECK(result_type(i32, zeros({2}, kInt64)) == kInt64);
  CHECK((zeros({2}, kInt32) + 1).dtype() == kInt32);
  CHECK((zeros({2}, kInt32) / 2).dtype() == kFloat32);  // true division
}

TEST_CASE("float16 rounds to nearest even, overflows to inf, keeps subnormals and NaN") {
  auto bits = [](float f) { return Half(f).bits; };
  CHECK(bits(1.0f) == 0x3c00);
  CHECK(bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie -> even (1.0)
  CHECK(bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie -> even (1 + 2^-9)
  CHECK(bits(65504.0f) == 0x7bff);                          // largest finite
  CHECK(bits(65519.0f) == 0x7bff);
  CHECK(bits(65520.0f) == 0x7c00);  // tie between 65504 and 2^16 rounds to even: inf
  CHECK(bits(-1e6f) == 0xfc00);
  CHECK(bits(std::ldexp(1.0f, -24)) == 0x0001);       // smallest subnormal
  CHECK(bits(std::ldexp(1.0f, -25)) == 0x0000);       // tie -> even (0)
  CHECK(bits(3 * std::ldexp(1.0f, -26)) == 0x0001);   // above the tie
  CHECK(bits(std::ldexp(1.0f, -14)) == 0x0400);       // smallest normal
  CHECK(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(static_cast<float>(Half::from_bits(0x7c00)) == std::numeric_limits<float>::infinity());
  CHECK(static_cast<float>(Half::from_bits(0x0001)) == std::ldexp(1.0f, -24));
  CHECK(static_cast<float>(Half::from_bits(0x3555)) == 0.333251953125f);
}

TEST_CASE("bfloat16 rounds to nearest even and keeps NaN quiet") {
  auto bits = [](float f) { return BFloat16(f).bits; };
  CHECK(bits(1.0f) == 0x3f80);
  CHECK(bits(from_bits(0x3f808000)) == 0x3f80);  // exactly halfway, even below
  CHECK(bits(from_bits(0x3f818000)) == 0x3f82);  // exactly halfway, even above
  CHECK(bits(from_bits(0x3f808001)) == 0x3f81);  // just above halfway
  CHECK(bits(from_bits(0x7f7fffff)) == 0x7f80);  // float max rounds to inf
  CHECK(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(static_cast<float>(BFloat16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("casts between dtypes through tensors") {
  Tensor f = tensor({-2.7, -0.5, 0.0, 0.5, 2.7, 1e6});
  CHECK(f.to(kInt64).to_vector<int64_t>() == std::vector<int64_t>{-2, 0, 0, 0, 2, 1000000});  // truncation
  CHECK(f.to(kBool).to_vector<bool>() == std::vector<bool>{true, true, false, true, true, true});
  Tensor h = f.to(kFloat16);
  CHECK(h.to(kFloat32).to_vector<float>()[4] == static_cast<float>(Half(2.7f)));
  CHECK(std::isinf(h.to(kFloat32).to_vector<float>()[5]));  // 1e6 overflows float16
  CHECK(f.to(kBFloat16).to(kFloat32).to_vector<float>()[5] == 999424.0f);
  CHECK(tensor({1, 0, 1}).to(kBool).to(kInt32).to_vector<int32_t>() == std::vector<int32_t>{1, 0, 1});
}

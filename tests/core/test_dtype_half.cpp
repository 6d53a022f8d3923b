// tests/core/test_dtype_half.cpp: dtype sizes, names and promotion (PyTorch's table), and the 16-bit
// float conversions (round to nearest even, overflow, subnormals, NaN).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "support.h"

using namespace kiln;
using kiln::test::check_error;

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
  CHECK(itemsize(kUInt8) == 1);
  CHECK(itemsize(kInt8) == 1);
  CHECK(dtype_name(kByte) == "uint8");
  CHECK(dtype_name(kChar) == "int8");
  CHECK(is_integral(kUInt8));
  CHECK(is_integral(kInt8));
  CHECK(!is_floating(kUInt8));
  CHECK(!is_floating(kInt8));
  CHECK(!is_integral(kBool));
  CHECK(is_floating(kFloat64));
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
  CHECK(promote_types(kBool, kUInt8) == kUInt8);
  CHECK(promote_types(kInt8, kBool) == kInt8);
  CHECK(promote_types(kUInt8, kInt32) == kInt32);
  CHECK(promote_types(kInt64, kInt8) == kInt64);
  CHECK(promote_types(kInt8, kFloat16) == kFloat16);
  CHECK(promote_types(kBFloat16, kUInt8) == kBFloat16);
  CHECK(promote_types(kUInt8, kUInt8) == kUInt8);
  // torch.promote_types(uint8, int8) is int16, which Kiln lacks.
  check_error([] { promote_types(kUInt8, kInt8); }, {"uint8 with int8", "int16", "kInt32"});
  check_error([] { (zeros({2}, kUInt8) + zeros({2}, kInt8)); }, {"int16"});
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

// The oracle for the float16 conversions, from the format's definition in float64: a half with
// exponent field e and mantissa m is m * 2^-24 when e = 0, (1 + m/1024) * 2^(e-15) otherwise.
static double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return (h & 0x8000) ? -v : v;
}

// The half nearest to a finite float, ties to the even mantissa; inf from 65520 on (the tie between
// 65504 and 2^16 goes to the even one, 2^16, which does not exist: inf).
static uint16_t nearest_half(float f) {
  double a = std::fabs(static_cast<double>(f));
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0, hi = 0x7bff;  // the largest half whose value is <= a
  while (lo < hi) {
    uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (half_value(mid) <= a) lo = mid; else hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == 0x7bff) return sign | lo;
  double below = a - half_value(lo), above = half_value(static_cast<uint16_t>(lo + 1)) - a;
  uint16_t pick = below < above ? lo : above < below ? static_cast<uint16_t>(lo + 1)
                                                     : (lo % 2 == 0 ? lo : static_cast<uint16_t>(lo + 1));
  return sign | pick;
}

TEST_CASE("float16 conversions equal the format's definition, one at a time and over arrays") {
  // Decode: every one of the 2^16 halves, through Half and through a float16 tensor's cast (the
  // contiguous loop the compiler vectorizes; Note [branch-free half conversions]).
  Tensor all = empty({65536}, kFloat16);
  Half* hp = all.data_ptr<Half>();
  for (uint32_t h = 0; h < 65536; ++h) hp[h] = Half::from_bits(static_cast<uint16_t>(h));
  std::vector<float> widened = all.to(kFloat32).to_vector<float>();
  int64_t decode_wrong = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float one = static_cast<float>(Half::from_bits(static_cast<uint16_t>(h)));
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    bool ok;
    if (e == 0x1f && m != 0) {  // nan: the mantissa is kept, the sign too
      uint32_t u;
      std::memcpy(&u, &one, 4);
      ok = std::isnan(one) && std::isnan(widened[h]) && (u & 0x7fffffu) == (m << 13) &&
           (u >> 31) == (h >> 15);
    } else if (e == 0x1f) {
      ok = std::isinf(one) && one == widened[h] && std::signbit(one) == ((h & 0x8000) != 0);
    } else {
      double want = half_value(static_cast<uint16_t>(h));
      ok = one == want && widened[h] == want && std::signbit(one) == ((h & 0x8000) != 0);
    }
    decode_wrong += !ok;
  }
  CHECK(decode_wrong == 0);

  // Encode: floats spread over the whole bit range (every 4099th pattern), and around every half
  // the value itself, the ties to its neighbours, and one float ulp either side of each tie.
  std::vector<float> xs;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) xs.push_back(from_bits(static_cast<uint32_t>(u)));
  for (uint16_t h = 0; h < 0x7c00; ++h) {
    for (uint16_t s : {uint16_t{0}, uint16_t{0x8000}}) {
      double v = half_value(h | s), next = h < 0x7bff ? half_value(static_cast<uint16_t>((h + 1) | s))
                                                     : (s ? -65536.0 : 65536.0);
      float tie = static_cast<float>((v + next) / 2);  // exact: halves have 11 significant bits
      xs.insert(xs.end(), {static_cast<float>(v), tie, std::nextafter(tie, 0.0f),
                           std::nextafter(tie, s ? -1e9f : 1e9f)});
    }
  }
  int64_t n = static_cast<int64_t>(xs.size());
  Tensor src = empty({n}, kFloat32);
  std::memcpy(src.data_ptr(), xs.data(), xs.size() * sizeof(float));
  Tensor narrowed = src.to(kFloat16);
  const Half* np = narrowed.data_ptr<Half>();
  int64_t encode_wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    float f = xs[static_cast<size_t>(i)];
    uint16_t one = Half(f).bits, want;
    if (std::isnan(f)) want = static_cast<uint16_t>((std::signbit(f) ? 0x8000 : 0) | 0x7e00);
    else if (std::isinf(f)) want = static_cast<uint16_t>((std::signbit(f) ? 0x8000 : 0) | 0x7c00);
    else want = nearest_half(f);
    if (one != want || np[i].bits != want) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      if (++encode_wrong <= 5)
        FAIL_CHECK("float bits " << std::hex << u << ": got " << one << " and " << np[i].bits << ", want " << want);
    }
  }
  CHECK(n > 1000000);
  CHECK(encode_wrong == 0);
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

TEST_CASE("uint8 and int8: values, scalars and the bounds of what they hold") {
  Tensor u = from_vector<uint8_t>({0, 7, 200, 255}, {2, 2});
  CHECK(u.dtype() == kUInt8);
  CHECK(u.to_vector<uint8_t>() == std::vector<uint8_t>{0, 7, 200, 255});
  CHECK(u.data_ptr<uint8_t>()[3] == 255);
  CHECK(u[1][0].item<int64_t>() == 200);
  Tensor i = from_vector<int8_t>({-128, -1, 0, 127});
  CHECK(i.to_vector<int8_t>() == std::vector<int8_t>{-128, -1, 0, 127});
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{-128, -1, 0, 127});
  // An int scalar keeps the tensor's dtype and must fit it, as in PyTorch ("value cannot be
  // converted to type uint8_t without overflow").
  CHECK((u + 1).dtype() == kUInt8);
  CHECK((u + 1).to_vector<int64_t>() == std::vector<int64_t>{1, 8, 201, 0});
  check_error([&] { (void)(u + 300); }, {"300", "uint8", "overflow"});
  check_error([&] { (void)full({2}, -129, kInt8); }, {"-129", "int8"});
  CHECK((u * 0.5).dtype() == kFloat32);
  CHECK(u.sum().dtype() == kInt64);
  CHECK(u.sum().item<int64_t>() == 462);
  CHECK(i.abs().to_vector<int64_t>() == std::vector<int64_t>{-128, 1, 0, 127});  // wraps, as PyTorch
  // randint checks its range against the dtype's.
  Generator gen(7);
  Tensor r = randint(250, 256, {1000}, kUInt8, &gen);
  CHECK(r.min().item<int64_t>() >= 250);
  CHECK(r.max().item<int64_t>() == 255);
  check_error([&] { randint(0, 257, {2}, kUInt8, &gen); }, {"out of bounds", "uint8"});
  check_error([&] { randint(-129, 0, {2}, kInt8, &gen); }, {"out of bounds", "int8"});
  CHECK(randperm(256, kUInt8, &gen).sum().item<int64_t>() == 255 * 256 / 2);
  check_error([&] { randperm(257, kUInt8, &gen); }, {"randperm", "uint8"});
  check_error([&] { arange(0, 300, 1, kUInt8); }, {"arange", "uint8"});
  // Integer tensors take no gradient.
  check_error([&] { u.requires_grad_(); }, {"floating"});
}

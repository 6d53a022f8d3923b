// tests/ops/test_addc_lerp.cpp: the in-place forms of addcmul, addcdiv and lerp (their out-of-place
// values against PyTorch are in the op table: tests/fixtures/gen_golden.py). Here: each in-place form
// writes what the out-of-place op gives, through broadcast, strided and aliased operands; under autograd
// it gives the out-of-place op's gradients; lerp's weights 0 and 1 give its ends exactly.
#include "support.h"

using namespace kiln;

namespace {

using InPlace = std::function<void(Tensor&, const Tensor&, const Tensor&)>;
using OutOfPlace = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

struct Form {
  const char* name;
  InPlace in_place;
  OutOfPlace out_of_place;
};

std::vector<Form> forms() {
  return {
      {"addcmul_", [](Tensor& x, const Tensor& b, const Tensor& c) { x.addcmul_(b, c, -0.75); },
       [](const Tensor& x, const Tensor& b, const Tensor& c) { return addcmul(x, b, c, -0.75); }},
      {"addcdiv_", [](Tensor& x, const Tensor& b, const Tensor& c) { x.addcdiv_(b, c.abs() + 0.5, 2.5); },
       [](const Tensor& x, const Tensor& b, const Tensor& c) { return addcdiv(x, b, c.abs() + 0.5, 2.5); }},
      {"lerp_ (weight tensor)", [](Tensor& x, const Tensor& b, const Tensor& c) { x.lerp_(b, c); },
       [](const Tensor& x, const Tensor& b, const Tensor& c) { return lerp(x, b, c); }},
      {"lerp_ (weight 0.8)", [](Tensor& x, const Tensor& b, const Tensor&) { x.lerp_(b, 0.8); },
       [](const Tensor& x, const Tensor& b, const Tensor&) { return lerp(x, b, 0.8); }},
  };
}

}  // namespace

TEST_CASE("addcmul_, addcdiv_ and lerp_ write what addcmul, addcdiv and lerp return", "[ops]") {
  for (const Form& f : forms()) {
    for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
      INFO(f.name << " " << dtype_name(dt));
      Tensor x = test::sample({5, 6}, kFloat32, 0.5).to(dt);
      Tensor b = test::sample({6}, kFloat32, 1.7).to(dt);              // broadcast over the rows
      Tensor c = test::sample({6, 5}, kFloat32, 2.9).to(dt).t();       // strided
      Tensor expected = f.out_of_place(x, b, c);
      const uint64_t version = x._version();
      f.in_place(x, b, c);
      CHECK(x._version() > version);
      test::check_equal(x, expected);  // the same kernel on the same values: bit for bit
    }
  }
  SECTION("operands that are the tensor itself") {
    Tensor x = test::sample({4, 7}, kFloat32, 0.3);
    Tensor expected = addcmul(x, x, x, 0.5);
    x.addcmul_(x, x, 0.5);
    test::check_equal(x, expected);
    Tensor y = test::sample({4, 7}, kFloat32, 0.9), end = test::sample({4, 7}, kFloat32, 1.1);
    Tensor lerped = lerp(y, end, y);
    y.lerp_(end, y);
    test::check_equal(y, lerped);
  }
  SECTION("a float16 tensor with float32 operands: computed in float32, rounded once into it") {
    Tensor x = ones({4}, kFloat16), tiny = full({4}, 1e-8);  // 1e-8 is 0 in float16
    x.addcdiv_(tiny, tiny);
    test::check_equal(x, full({4}, 2.0, kFloat16));
  }
  SECTION("integers: addcmul_ with an integer value") {
    Tensor x = tensor({1, -2, 3}, kInt64);
    x.addcmul_(tensor({2, 3, -1}, kInt64), tensor({5, -1, 4}, kInt64), 3);
    CHECK(x.to_vector<int64_t>() == std::vector<int64_t>{31, -11, -9});
  }
}

TEST_CASE("lerp gives its ends exactly at weights 0 and 1, on both sides of 0.5", "[ops]") {
  Tensor start = test::sample({1000}, kFloat32, 0.5) * 1e3, end = test::sample({1000}, kFloat32, 1.7);
  test::check_equal(lerp(start, end, 0.0), start);
  test::check_equal(lerp(start, end, 1.0), end);  // b - (b - a) * 0, not a + (b - a), which rounds
  test::check_equal(lerp(start, end, zeros({1000})), start);
  test::check_equal(lerp(start, end, ones({1000})), end);
  Tensor x = start.clone();
  x.lerp_(end, 1.0);
  test::check_equal(x, end);
}

TEST_CASE("addcmul_, addcdiv_ and lerp_ under autograd give the out-of-place ops' gradients", "[ops][autograd]") {
  for (const Form& f : forms()) {
    INFO(f.name);
    auto leaves = [] {
      return std::vector<Tensor>{test::sample({3, 4}, kFloat64, 0.5).requires_grad_(),
                                 test::sample({4}, kFloat64, 1.7).requires_grad_(),
                                 (test::sample({3, 4}, kFloat64, 2.9) * 0.4 + 0.3).requires_grad_()};
    };
    Tensor g = test::sample({3, 4}, kFloat64, 0.1);
    std::vector<Tensor> in = leaves(), out = leaves();
    Tensor y = in[0] * 1.0;  // a non-leaf to write into
    f.in_place(y, in[1], in[2]);
    Tensor reference = f.out_of_place(out[0] * 1.0, out[1], out[2]);
    test::check_close(y, reference, {1e-15, 1e-15});
    const auto grads = autograd::grad({y}, {in[0], in[1], in[2]}, {g}, {}, false, true);
    const auto expected = autograd::grad({reference}, {out[0], out[1], out[2]}, {g}, {}, false, true);
    for (size_t k = 0; k < 3; ++k) {
      INFO("input " << k);
      CHECK(grads[k].defined() == expected[k].defined());
      if (expected[k].defined()) test::check_close(grads[k], expected[k], {1e-15, 1e-15});
    }
  }
}

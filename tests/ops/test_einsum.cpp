// tests/ops/test_einsum.cpp: einsum (ops/einsum.cpp) beyond the op table's PyTorch goldens: spaces in
// the equation, a chain of operands against matmul, a label broadcast from size 1 into a summed dim,
// and the Errors for malformed equations and mismatched operands.
#include "support.h"

using namespace kiln;

TEST_CASE("einsum: spaces, chains of products and broadcast labels against matmul and sums", "[ops][einsum]") {
  const Tensor a = test::sample({3, 4}, kFloat64, 0.1), b = test::sample({4, 5}, kFloat64, 0.7);
  const Tensor c = test::sample({5, 2}, kFloat64, 1.3), v = test::sample({2}, kFloat64, 1.9);
  test::check_close(einsum(" ij , jk -> ik ", {a, b}), a.matmul(b), test::Tolerance{1e-14, 1e-14});
  test::check_close(einsum("ij,jk,kl,l->i", {a, b, c, v}), a.matmul(b).matmul(c).matmul(v),
                    test::Tolerance{1e-13, 1e-13});
  // j has size 1 in the first operand and 4 in the second, and is summed: the single column of x
  // multiplies every row of y.
  const Tensor x = test::sample({3, 1}, kFloat64, 0.5), y = test::sample({4, 2}, kFloat64, 0.9);
  test::check_close(einsum("ij,jk->ik", {x, y}), x.matmul(y.sum({0}, true)), test::Tolerance{1e-14, 1e-14});
  // A result that only one operand makes: the sum of its elements.
  CHECK(einsum("ij->", {a}).item<double>() == Approx(a.sum().item<double>()).epsilon(1e-14));
}

TEST_CASE("einsum: malformed equations and mismatched operands are Errors naming them", "[ops][einsum]") {
  const Tensor a = test::sample({3, 4}), b = test::sample({4, 5});
  test::check_error([&] { einsum("ij,jk->ik", {a}); }, {"einsum", "2 input term(s)", "1 operand(s)"});
  test::check_error([&] { einsum("ijk,jk->ik", {a, b}); }, {"einsum", "3 dim(s)", "operand 0 has 2"});
  test::check_error([&] { einsum("ij,ik", {a, b}); }, {"einsum", "'i'", "size 4", "but 3"});
  test::check_error([&] { einsum("ij,jk->ii", {a, b}); }, {"einsum", "'i' twice"});
  test::check_error([&] { einsum("ij,jk->iz", {a, b}); }, {"einsum", "'z'", "no input term"});
  test::check_error([&] { einsum("i1,jk", {a, b}); }, {"einsum", "letters", "'1'"});
  test::check_error([&] { einsum("i.j,jk", {a, b}); }, {"einsum", "\"...\""});
  test::check_error([&] { einsum("......", {a}); }, {"einsum", "twice"});
  test::check_error([&] { einsum("ii", {test::sample({3, 4})}); }, {"einsum", "'i' is written twice", "3 and 4"});
  test::check_error([&] { einsum("ij,jk", {a, test::sample({3, 5})}); }, {"einsum", "'j'", "size 3", "but 4"});
  test::check_error([&] { einsum("i", {}); }, {"einsum", "at least one operand"});
}

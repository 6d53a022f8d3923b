// tests/ops/test_errors.cpp: every Error an op raises, one row each: the call that misuses the op and
// the fragments its message must contain (the op's name, the shapes/dtypes/values involved, and
// what to do). Errors of views, autograd and the tensor model are in tests/core and tests/autograd.
#include <cmath>
#include <cstdint>
#include <vector>

#include "support.h"

using namespace kiln;

namespace {

struct ErrorRow {
  const char* name;
  std::function<void()> call;
  std::vector<std::string> fragments;
};

Tensor f32(const Shape& s) { return zeros(s); }
Tensor i64(const Shape& s) { return zeros(s, kInt64); }
Tensor b8(const Shape& s) { return zeros(s, kBool); }

}  // namespace

TEST_CASE("every op's misuse is an Error that names the problem") {
  const std::vector<ErrorRow> rows = {
      // elementwise and promotion
      {"broadcast", [] { f32({2, 3}) + f32({4}); }, {"add", "[2, 3]", "[4]", "cannot be broadcast", "dim -1", "3 and 4"}},
      {"bool subtraction", [] { b8({2}) - b8({2}); }, {"sub", "bool tensor", "logical_not()"}},
      {"subtracting a bool", [] { f32({2}) - b8({2}); }, {"sub", "bool tensor", "logical_not()"}},
      {"bool power of bools", [] { pow(b8({2}), b8({2})); }, {"pow", "two bool tensors"}},
      {"neg of bool", [] { neg(b8({2})); }, {"neg", "bool"}},
      {"gelu of bool", [] { gelu(b8({2})); }, {"gelu", "bool"}},
      {"gelu approximate", [] { gelu(f32({2}), "fast"); }, {"gelu", "\"none\" or \"tanh\"", "fast"}},
      {"int negative power", [] { pow(i64({2}), -1); }, {"pow", "negative integer powers"}},
      {"clamp without bounds", [] { clamp(f32({2}), std::nullopt, std::nullopt); }, {"clamp", "min and max"}},
      {"where condition dtype", [] { where(f32({2}), f32({2}), f32({2})); }, {"where", "bool", "float32"}},
      {"masked_fill mask dtype", [] { masked_fill(f32({2}), i64({2}), 1); }, {"masked_fill", "bool", "int64"}},
      {"masked_fill mask shape", [] { masked_fill(f32({2}), b8({3}), 1); }, {"masked_fill", "[3]", "[2]"}},
      {"in-place result type", [] { Tensor x = i64({2}); x.add_(f32({2})); }, {"add_", "float32", "int64"}},
      {"in-place broadcast", [] { Tensor x = f32({2}); x.mul_(f32({3, 2})); }, {"mul_", "[3, 2]", "[2]"}},
      {"in-place on bool", [] { Tensor x = b8({2}); x.add_(b8({2})); }, {"add_", "bool"}},
      {"exp_ of int", [] { Tensor x = i64({2}); x.exp_(); }, {"exp_", "floating", "int64"}},
      {"sqrt_ of int", [] { Tensor x = i64({2}); x.sqrt_(); }, {"sqrt_", "floating"}},
      {"pow_ result type", [] { Tensor x = i64({2}); x.pow_(0.5); }, {"pow_", "int64"}},
      {"clamp_ without bounds", [] { Tensor x = f32({2}); x.clamp_(std::nullopt); }, {"clamp_", "min and max"}},
      {"addcdiv of integers", [] { addcdiv(f32({2}), i64({2}), i64({2})); },
       {"addcdiv", "integer division", "int64", "floating"}},
      {"addcmul float value on ints", [] { addcmul(i64({2}), i64({2}), i64({2}), 0.5); },
       {"addcmul", "int64", "must be an integer", "0.5"}},
      {"addcmul of bool", [] { addcmul(b8({2}), b8({2}), b8({2})); }, {"addcmul", "bool"}},
      {"addcmul broadcast", [] { addcmul(f32({2}), f32({3}), f32({2})); }, {"addcmul", "[2]", "[3]"}},
      {"lerp of ints", [] { lerp(i64({2}), i64({2}), 0.5); }, {"lerp", "floating", "int64"}},
      {"lerp end dtype", [] { lerp(f32({2}), zeros({2}, kFloat64), 0.5); }, {"lerp", "end is float64", "float32"}},
      {"lerp weight dtype", [] { lerp(f32({2}), f32({2}), zeros({2}, kFloat64)); },
       {"lerp", "weight is float64", "float32", ".to()"}},
      {"addcmul_ result type", [] { Tensor x = i64({2}); x.addcmul_(f32({2}), f32({2})); },
       {"addcmul_", "float32", "int64"}},
      {"addcdiv_ broadcast", [] { Tensor x = f32({2}); x.addcdiv_(f32({3, 2}), f32({2})); },
       {"addcdiv_", "[3, 2]", "[2]"}},
      {"lerp_ end dtype", [] { Tensor x = f32({2}); x.lerp_(zeros({2}, kFloat64), 0.5); }, {"lerp_", "float64"}},
      {"addcmul value beyond int8", [] { addcmul(zeros({2}, kInt8), zeros({2}, kInt8), zeros({2}, kInt8), 1000); },
       {"addcmul", "1000", "int8", "[-128, 127]"}},
      {"integer remainder by a divisor that is 0 in the result dtype",
       [] { remainder(zeros({2}, kInt8) + 5, full({}, 256, kInt64)); }, {"remainder", "division by zero", "int8"}},
      {"integer remainder by zero", [] { remainder(i64({2}) + 3, tensor({1, 0}, kInt64)); },
       {"remainder", "integer division by zero", "floating dtype"}},
      {"integer floor_divide by zero", [] { floor_divide(i64({2}), 0); }, {"floor_divide", "division by zero"}},
      {"integer fmod by zero", [] { fmod(i64({2}), i64({2})); }, {"fmod", "division by zero"}},
      {"div rounding mode", [] { div(f32({2}), f32({2}), "round"); }, {"div", "\"trunc\" or \"floor\"", "round"}},
      {"remainder of bools", [] { remainder(b8({2}), b8({2})); }, {"remainder", "bool"}},
      {"bitwise_and of floats", [] { bitwise_and(f32({2}), i64({2})); }, {"bitwise_and", "integer or bool", "float32"}},
      {"bitwise_not of floats", [] { ~f32({2}); }, {"bitwise_not", "float32"}},
      {"floor of bool", [] { floor(b8({2})); }, {"floor", "bool"}},
      // factories
      {"arange step 0", [] { arange(0, 5, 0); }, {"arange", "step must be nonzero"}},
      {"arange direction", [] { arange(5, 0, 1); }, {"arange", "[5, 0)", "step 1"}},
      {"linspace steps", [] { linspace(0, 1, -1); }, {"linspace", "-1"}},
      {"eye size", [] { eye(-2); }, {"eye", "-2"}},
      {"randn dtype", [] { randn({2}, kInt32); }, {"randn", "floating", "int32"}},
      {"bernoulli p", [] { bernoulli({2}, 1.5); }, {"bernoulli", "[0, 1]", "1.5"}},
      {"randperm n", [] { randperm(-1); }, {"randperm", "-1"}},
      // reductions
      {"duplicate dim", [] { sum(f32({2, 3}), {1, -1}); }, {"sum", "dim 1", "more than once"}},
      {"dim out of range", [] { mean(f32({2, 3}), {2}); }, {"mean", "dim 2 is out of range", "-2..1"}},
      {"amax over empty", [] { amax(f32({0, 3}), {0}); }, {"amax", "dim 0 of size 0", "[0, 3]"}},
      {"max of empty", [] { max(f32({0})); }, {"amax", "size 0"}},
      {"argmax of empty", [] { argmax(f32({0})); }, {"argmax", "empty"}},
      {"mean of int", [] { mean(i64({3})); }, {"mean", "floating-point", "int64"}},
      {"var of int", [] { var(i64({3})); }, {"var", "floating-point"}},
      {"sum_to larger", [] { sum_to(f32({3}), {2, 3}); }, {"sum_to", "[3]", "[2, 3]"}},
      // linear algebra and softmax
      {"matmul shapes", [] { matmul(f32({4, 3}), f32({4, 5})); },
       {"matmul: shapes (4, 3) and (4, 5) cannot be multiplied: dim 1 of the first (3) must equal dim 0 of the second (4)"}},
      {"matmul batched shapes", [] { matmul(f32({2, 4, 3}), f32({2, 4, 5})); }, {"matmul", "dim -1", "dim -2"}},
      {"matmul batch broadcast", [] { matmul(f32({2, 4, 3}), f32({3, 3, 5})); }, {"matmul", "cannot be broadcast"}},
      {"matmul 0-dim", [] { matmul(f32({}), f32({3})); }, {"matmul", "at least 1 dimension"}},
      {"matmul dtypes", [] { matmul(f32({2, 2}), zeros({2, 2}, kFloat64)); }, {"matmul", "same dtype", "float32", "float64"}},
      {"dot sizes", [] { matmul(f32({3}), f32({4})); }, {"matmul", "3 and 4"}},
      {"mm rank", [] { mm(f32({2, 2, 2}), f32({2, 2})); }, {"mm", "2-D", "matmul"}},
      {"bmm rank", [] { bmm(f32({2, 2}), f32({2, 2})); }, {"bmm", "3-D"}},
      {"bmm batch", [] { bmm(f32({2, 2, 2}), f32({3, 2, 2})); }, {"bmm", "2 and 3"}},
      {"softmax of int", [] { softmax(i64({3}), 0); }, {"softmax", "floating-point", "int64"}},
      {"softmax dim", [] { log_softmax(f32({3}), 1); }, {"log_softmax", "dim 1 is out of range"}},
      // shape ops
      {"cat empty list", [] { cat({}); }, {"cat", "non-empty"}},
      {"cat 0-dim", [] { cat({f32({}), f32({})}); }, {"cat", "zero-dimensional"}},
      {"cat ranks", [] { cat({f32({2, 3}), f32({3})}); }, {"cat", "tensor 1 has 1 dims", "tensor 0 has 2"}},
      {"cat sizes", [] { cat({f32({2, 3}), f32({2, 4})}, 0); }, {"cat", "except in dim 0", "[2, 3]", "[2, 4]"}},
      {"stack shapes", [] { stack({f32({2}), f32({3})}); }, {"stack", "[2]", "[3]"}},
      {"split size", [] { split(f32({4}), 0); }, {"split", "split_size", "0"}},
      {"split_with_sizes", [] { split_with_sizes(f32({4}), {1, 2}); }, {"split", "add up to 3", "size 4"}},
      {"chunk count", [] { chunk(f32({4}), 0); }, {"chunk", "positive"}},
      {"flip duplicate", [] { flip(f32({2, 2}), {0, -2}); }, {"flip", "more than once"}},
      {"repeat count", [] { repeat(f32({2, 2}), {2}); }, {"repeat", "at least as many repeats (1)", "dims (2)"}},
      {"repeat negative", [] { repeat(f32({2}), {-1}); }, {"repeat", "non-negative"}},
      {"pad pairs", [] { pad(f32({2}), {1}); }, {"pad", "(left, right) pairs", "1 values"}},
      {"pad negative size", [] { pad(f32({2}), {-2, -1}); }, {"pad", "(-2, -1)", "negative"}},
      {"tril rank", [] { tril(f32({3})); }, {"tril", "2 dims", "[3]"}},
      // indexing
      {"index dtype", [] { index_select(f32({3}), 0, f32({1})); }, {"index_select", "int64 or int32", "float32"}},
      {"index_select rank", [] { index_select(f32({3}), 0, i64({1, 1})); }, {"index_select", "1-D", "[1, 1]"}},
      {"index_select bounds", [] { index_select(f32({3}), 0, full({1}, 3, kInt64)); },
       {"index_select", "index 3 is out of bounds for dim 0 with size 3"}},
      {"gather rank", [] { gather(f32({3, 3}), 1, i64({3})); }, {"gather", "as many dims", "[3]"}},
      {"gather shape", [] { gather(f32({3, 3}), 1, i64({4, 1})); }, {"gather", "[4, 1]", "[3, 3]", "dim 0"}},
      {"gather bounds", [] { gather(f32({2, 2}), 1, full({2, 1}, -3, kInt64)); }, {"gather", "index -3", "size 2"}},
      {"scatter source shape", [] { scatter(f32({3, 3}), 1, i64({3, 2}), f32({3, 1})); }, {"scatter", "source shape", "[3, 1]"}},
      {"scatter dtypes", [] { scatter_add(f32({3}), 0, i64({3}), zeros({3}, kFloat64)); }, {"scatter_add", "float64", "float32"}},
      {"index_add shape", [] { index_add(f32({3, 2}), 0, i64({2}), f32({3, 2})); }, {"index_add", "1-D index"}},
      {"index_add source shape", [] { index_add(f32({2, 3}), 0, i64({2}), f32({2, 5})); },
       {"index_add", "[2, 5]", "[2, 3]", "outside dim 0"}},
      {"negative index", [] { index_select(f32({3}), 0, full({1}, -1, kInt64)); }, {"index_select", "index -1", "out of bounds"}},
      {"embedding weight", [] { embedding(f32({3}), i64({2})); }, {"embedding", "2-D", "[3]"}},
      {"one_hot dtype", [] { one_hot(f32({2})); }, {"one_hot", "int64", "float32"}},
      {"one_hot range", [] { one_hot(full({2}, 5, kInt64), 3); }, {"one_hot", "[0, 3)", "[5, 5]"}},
      {"huge size", [] { empty({int64_t{1} << 62, 8}); }, {"empty", "64 bits"}},
      {"huge bytes", [] { empty({int64_t{1} << 62}); }, {"empty", "more bytes than any device has"}},
      {"from_blob size", [] { float f = 0; from_blob(&f, {-1}, kFloat32); }, {"from_blob", "non-negative"}},
      // views (the rest are in tests/core/test_tensor.cpp)
      {"as_strided bounds", [] { as_strided(f32({2}), {4}, {1000000}, 0); }, {"as_strided", "outside the storage"}},
      {"as_strided negative offset", [] { as_strided(f32({4}), {2}, {-1}, 0); }, {"as_strided", "-1..0"}},
      {"as_strided huge strides", [] { as_strided(f32({4}), {3}, {(int64_t{1} << 62) + (int64_t{1} << 40)}, 0); },
       {"as_strided", "2^63 and beyond", "outside the storage"}},
      {"as_strided max strides", [] { as_strided(f32({4}), {2, 2}, {INT64_MAX, INT64_MAX}, 0); },
       {"as_strided", "outside the storage"}},
      {"expand negative", [] { f32({1}).expand({-2}); }, {"expand", "invalid size -2"}},
      {"expand too many elements", [] { f32({1, 1}).expand({int64_t{1} << 32, int64_t{1} << 32}); },
       {"expand", "more elements than fit in 64 bits"}},
      {"as_strided too many elements", [] { as_strided(f32({1}), {int64_t{1} << 32, int64_t{1} << 32}, {0, 0}, 0); },
       {"as_strided", "more elements than fit in 64 bits"}},
      {"narrow start overflow", [] { f32({5}).narrow(0, INT64_MAX, 1); }, {"narrow", "start 9223372036854775807"}},
      {"narrow length overflow", [] { f32({5}).narrow(0, 2, INT64_MAX); }, {"narrow", "out of range"}},
      {"narrow INT64_MIN", [] { f32({5}).narrow(0, INT64_MIN, 1); }, {"narrow", "start -9223372036854775808"}},
      {"randint float64 beyond 2^53", [] { randint((int64_t{1} << 60) + 1, (int64_t{1} << 60) + 9, {6}, kFloat64); },
       {"randint", "out of bounds for float64", "[-9007199254740992, 9007199254740992]"}},
      {"randint bool", [] { randint(0, 3, {3}, kBool); }, {"randint", "out of bounds for bool", "[0, 1]"}},
      {"randint int32", [] { randint(0, int64_t{1} << 40, {3}, kInt32); }, {"randint", "out of bounds for int32"}},
      {"randint float32", [] { randint(0, (int64_t{1} << 24) + 2, {3}, kFloat32); }, {"randint", "float32"}},
      {"full nan int64", [] { full({2}, NAN, kInt64); }, {"nan cannot be converted to int64"}},
      {"fill inf int32", [] { zeros({2}, kInt32).fill_(INFINITY); }, {"inf cannot be converted to int32"}},
      {"full int32 overflow", [] { full({2}, int64_t{1} << 40, kInt32); }, {"1099511627776 cannot be converted to int32"}},
      {"item nan to int", [] { (void)scalar_tensor(NAN).item<int64_t>(); }, {"nan cannot be converted"}},
      {"undefined operand", [] { (void)(f32({2}) + Tensor()); }, {"an undefined Tensor", "check .defined() first"}},
      {"undefined dim", [] { (void)Tensor().dim(); }, {"an undefined Tensor"}},
      {"unflatten 0-dim", [] { f32({}).unflatten(0, {1}); }, {"unflatten", "0-dimensional"}},
      {"view -1 twice", [] { f32({4}).view({-1, -1}); }, {"view", "only one dimension can be -1"}},
      {"narrow 0-dim", [] { f32({}).narrow(0, 0, 1); }, {"narrow", "0-dimensional"}},
      {"slice step", [] { f32({4}).slice(0, 0, 4, 0); }, {"slice", "step must be positive"}},
      {"expand rank", [] { f32({2, 3}).expand({3}); }, {"expand", "fewer dims"}},
      {"flatten order", [] { f32({2, 3}).flatten(1, 0); }, {"flatten", "start_dim 1", "end_dim 0"}},
      {"t rank", [] { f32({2, 2, 2}).t(); }, {"t:", "at most 2 dims", "transpose"}},
      {"mT rank", [] { f32({2}).mT(); }, {"mT", "at least 2 dims"}},
      // convolution
      {"conv2d input rank", [] { conv2d(f32({3, 5}), f32({2, 3, 3, 3})); }, {"conv2d", "3-D", "4-D", "[3, 5]"}},
      {"conv2d weight rank", [] { conv2d(f32({1, 3, 5, 5}), f32({2, 3, 3})); }, {"conv2d", "4-D weight", "[2, 3, 3]"}},
      {"conv2d channels", [] { conv2d(f32({1, 3, 5, 5}), f32({2, 2, 3, 3})); },
       {"conv2d", "3 channels", "[2, 2, 3, 3]", "groups 1", "expects 2"}},
      {"conv2d groups", [] { conv2d(f32({1, 4, 5, 5}), f32({3, 2, 3, 3}), {}, {1, 1}, {0, 0}, {1, 1}, 2); },
       {"conv2d", "3 output channels", "groups 2"}},
      {"conv2d groups zero", [] { conv2d(f32({1, 4, 5, 5}), f32({4, 4, 3, 3}), {}, {1, 1}, {0, 0}, {1, 1}, 0); },
       {"conv2d", "groups must be positive", "0"}},
      {"conv2d kernel too big", [] { conv2d(f32({1, 1, 2, 2}), f32({1, 1, 3, 3})); },
       {"conv2d", "padded input (2 x 2)", "dilated kernel (3 x 3)"}},
      {"conv2d stride", [] { conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), {}, {0, 1}); }, {"conv2d", "stride", "positive", "[0, 1]"}},
      {"conv2d padding", [] { conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), {}, {1, 1}, {-1}); }, {"conv2d", "padding", "non-negative"}},
      {"conv2d bias", [] { conv2d(f32({1, 1, 4, 4}), f32({2, 1, 3, 3}), f32({3})); }, {"conv2d", "bias", "[2]", "[3]"}},
      {"conv2d dtypes", [] { conv2d(f32({1, 1, 4, 4}), zeros({1, 1, 3, 3}, kFloat64)); }, {"conv2d", "float32", "float64"}},
      {"conv2d int", [] { conv2d(i64({1, 1, 4, 4}), i64({1, 1, 3, 3})); }, {"conv2d", "floating-point", "int64"}},
      {"conv1d input rank", [] { conv1d(f32({1, 2, 3, 4}), f32({1, 2, 3})); }, {"conv1d", "2-D", "3-D", "[1, 2, 3, 4]"}},
      {"conv1d channels", [] { conv1d(f32({1, 2, 8}), f32({1, 3, 3})); }, {"conv1d", "[1, 2, 8]", "2 channels", "expects 3"}},
      {"conv1d length", [] { conv1d(f32({2, 2}), f32({1, 2, 3})); }, {"conv1d", "length 2", "dilated kernel (3)"}},
      {"conv2d bias dtype", [] { conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), zeros({1}, kFloat64)); },
       {"conv2d", "input and bias", "float64"}},
      {"conv backward shape", [] { conv2d_backward_input(f32({1, 2, 3, 3}), f32({2, 1, 3, 3}), {1, 1, 6, 6}, {1, 1}, {0, 0}, {1, 1}, 1); },
       {"conv2d_backward_input", "[1, 2, 3, 3]", "[1, 2, 4, 4]"}},
      // pooling
      {"max_pool2d rank", [] { max_pool2d(f32({4, 4}), 2); }, {"max_pool2d", "3-D", "4-D", "[4, 4]"}},
      {"max_pool2d kernel", [] { max_pool2d(f32({1, 4, 4}), {0}); }, {"max_pool2d", "kernel_size", "positive", "[0]"}},
      {"max_pool2d kernel elements", [] { max_pool2d(f32({1, 4, 4}), {2, 2, 2}); },
       {"max_pool2d", "kernel_size", "one or two elements", "[2, 2, 2]"}},
      {"max_pool2d padding", [] { max_pool2d(f32({1, 4, 4}), {3}, {1}, {2}); },
       {"max_pool2d", "padding [2]", "at most half of the kernel size [3]"}},
      {"max_pool2d too small", [] { max_pool2d(f32({1, 1, 2, 2}), {3}); },
       {"max_pool2d", "output would be empty", "[1, 1, 2, 2]", "kernel 3 x 3"}},
      {"max_pool2d empty channel", [] { max_pool2d(f32({1, 0, 4, 4}), 2); }, {"max_pool2d", "non-empty", "[1, 0, 4, 4]"}},
      {"max_pool2d int", [] { max_pool2d(i64({1, 4, 4}), 2); }, {"max_pool2d", "floating-point", "int64"}},
      {"avg_pool2d padding", [] { avg_pool2d(f32({1, 4, 4}), {2}, {}, {2}); }, {"avg_pool2d", "padding [2]", "at most half"}},
      {"avg_pool2d divisor", [] { avg_pool2d(f32({1, 4, 4}), {2}, {}, {0}, false, true, 0); }, {"avg_pool2d", "divisor_override", "nonzero"}},
      {"adaptive output_size", [] { adaptive_avg_pool2d(f32({1, 4, 4}), {1, 2, 3}); },
       {"adaptive_avg_pool2d", "output_size", "one or two", "[1, 2, 3]"}},
      {"adaptive rank", [] { adaptive_avg_pool2d(f32({4}), {2}); }, {"adaptive_avg_pool2d", "3-D", "[4]"}},
      // the 1-D poolings' messages speak of L and k, not of the height-1 image they pool
      {"max_pool1d rank", [] { max_pool1d(f32({1, 2, 4, 4}), 2); }, {"max_pool1d", "2-D", "3-D", "[1, 2, 4, 4]"}},
      {"max_pool1d kernel", [] { max_pool1d(f32({1, 4}), 0); }, {"max_pool1d", "kernel_size (0)", "positive"}},
      {"max_pool1d stride", [] { max_pool1d(f32({1, 4}), 2, 0); }, {"max_pool1d", "stride (0)"}},
      {"max_pool1d padding", [] { max_pool1d(f32({1, 8}), 3, 1, 2); },
       {"max_pool1d", "padding 2", "at most half of the kernel size 3"}},
      {"max_pool1d too short", [] { max_pool1d(f32({2, 1, 2}), 3); },
       {"max_pool1d", "output would be empty", "[2, 1, 2]", "kernel 3"}},
      {"max_pool1d dilation", [] { max_pool1d_with_indices(f32({1, 5}), 3, 1, 0, 3); },
       {"max_pool1d", "output would be empty", "dilation 3"}},
      {"max_pool1d empty", [] { max_pool1d(f32({0, 4}), 2); }, {"max_pool1d", "non-empty", "[0, 4]"}},
      {"max_pool1d int", [] { max_pool1d(i64({1, 4}), 2); }, {"max_pool1d", "floating-point", "int64"}},
      {"avg_pool1d padding", [] { avg_pool1d(f32({1, 4}), 2, {}, 2); }, {"avg_pool1d", "padding 2", "at most half"}},
      {"avg_pool1d rank", [] { avg_pool1d(f32({4}), 2); }, {"avg_pool1d", "2-D", "[4]"}},
      {"adaptive_avg_pool1d size", [] { adaptive_avg_pool1d(f32({1, 4}), -1); },
       {"adaptive_avg_pool1d", "output_size", "non-negative", "-1"}},
      {"adaptive_avg_pool1d rank", [] { adaptive_avg_pool1d(f32({1, 1, 1, 4}), 2); },
       {"adaptive_avg_pool1d", "2-D", "[1, 1, 1, 4]"}},
      // normalisation and dropout
      {"layer_norm shape", [] { layer_norm(f32({2, 3}), {4}); }, {"layer_norm", "normalized_shape [4]", "last 1 dims", "[2, 3]"}},
      {"layer_norm weight", [] { layer_norm(f32({2, 3}), {3}, f32({2})); }, {"layer_norm", "weight", "[3]", "[2]"}},
      {"layer_norm empty shape", [] { layer_norm(f32({2, 3}), {}); }, {"layer_norm", "at least one dim"}},
      {"layer_norm int", [] { layer_norm(i64({2, 3}), {3}); }, {"layer_norm", "floating-point", "int64"}},
      {"rms_norm shape", [] { rms_norm(f32({2, 3}), {2, 3, 1}); }, {"rms_norm", "[2, 3, 1]", "[2, 3]"}},
      {"group_norm groups", [] { group_norm(f32({2, 6, 4}), 4); }, {"group_norm", "6 channels", "num_groups = 4"}},
      {"group_norm rank", [] { group_norm(f32({6}), 2); }, {"group_norm", "at least 2 dims", "[6]"}},
      {"group_norm bias", [] { group_norm(f32({2, 6, 4}), 3, f32({6}), f32({3})); }, {"group_norm", "6 channels", "the bias has 3"}},
      {"batch_norm running stats", [] { batch_norm(f32({4, 3}), f32({2}), f32({3}), {}, {}, true); },
       {"batch_norm", "running_mean", "[3]", "[2]"}},
      {"batch_norm one value", [] { batch_norm(f32({1, 3}), {}, {}, {}, {}, true); },
       {"batch_norm", "more than 1 value per channel", "[1, 3]"}},
      {"batch_norm eval", [] { batch_norm(f32({4, 3}), {}, {}, {}, {}, false); }, {"batch_norm", "running_mean", "evaluation"}},
      {"batch_norm rank", [] { batch_norm(f32({3}), {}, {}, {}, {}, true); }, {"batch_norm", "at least 2 dims", "[3]"}},
      {"dropout p", [] { dropout(f32({2}), 1.5); }, {"dropout", "[0, 1]", "1.5"}},
      {"dropout int", [] { dropout(i64({2}), 0.5); }, {"dropout", "floating-point", "int64"}},
  };
  for (const auto& row : rows) {
    INFO("row: " << row.name);
    test::check_error(row.call, row.fragments);
  }
}

TEST_CASE("misuse found by probing the API is an Error that names it") {
  const std::vector<ErrorRow> rows = {
      {"randperm bool", [] { randperm(5, kBool); }, {"randperm", "bool"}},
      {"randperm half", [] { randperm(5000, kFloat16); }, {"randperm", "n = 5000", "float16"}},
      {"one_hot negative", [] { one_hot(i64({1}), -5); }, {"one_hot", "num_classes", "-5"}},
      {"clamp_ int float bounds", [] { i64({2}).clamp_(0.5, 3.5); }, {"clamp_", "float32", "int64"}},
      {"clamp_ bool", [] { b8({2}).clamp_(0, 0); }, {"clamp_", "bool"}},
      {"clamp int32 bound", [] { zeros({2}, kInt32).clamp(0, int64_t{1} << 40); }, {"cannot be converted to int32"}},
      {"autocast state int", [] {
         autocast::State s;
         s.enabled = 1;
         s.dtypes[0] = kInt32;
         autocast::StateGuard g(s);
       }, {"StateGuard", "int32"}},
      {"split 0-dim", [] { split(f32({}), 1); }, {"split", "0-dimensional"}},
      {"chunk 0-dim", [] { chunk(f32({}), 2); }, {"chunk", "0-dimensional"}},
      {"split_with_sizes negative", [] { split_with_sizes(f32({4}), {5, -1}); }, {"split", "[0, 4]", "got 5"}},
      {"scatter source rank", [] { f32({2, 2}).scatter(0, i64({1, 1}), f32({2})); }, {"scatter", "source", "[2]"}},
      {"arange inf", [] { arange(0.0, INFINITY, 1.0); }, {"arange", "finite", "inf"}},
      {"arange too many", [] { arange(INT64_MIN, INT64_MAX); }, {"arange", "too many for a tensor"}},
      {"arange int32 overflow", [] { arange(0, int64_t{1} << 40, int64_t{1} << 39, kInt32); },
       {"arange", "reach 549755813888", "int32"}},
      {"max_pool2d huge kernel", [] { max_pool2d(f32({1, 1, 4, 4}), {INT64_MAX}); }, {"max_pool2d", "empty"}},
      {"from_blob null", [] { from_blob(nullptr, {2}, kFloat32); }, {"from_blob", "null", "2 elements"}},
  };
  for (const auto& row : rows) {
    INFO("row: " << row.name);
    test::check_error(row.call, row.fragments);
  }
  CHECK(from_blob(nullptr, {0}, kFloat32).numel() == 0);  // nothing to point at
}

TEST_CASE("int64 values beyond 2^53 stay exact in clamp, arange and printing") {
  const int64_t big = (int64_t{1} << 53) + 3;
  Tensor x = from_vector<int64_t>({big, INT64_MAX, -5});
  CHECK(x.clamp(0).to_vector<int64_t>() == std::vector<int64_t>{big, INT64_MAX, 0});
  CHECK(x.clamp(0, INT64_MAX - 1).to_vector<int64_t>() == std::vector<int64_t>{big, INT64_MAX - 1, 0});
  CHECK(x.clamp(big + 1, big - 1).to_vector<int64_t>() == std::vector<int64_t>(3, big - 1));  // max wins
  Tensor y = x.clone();
  y.clamp_(std::nullopt, big - 2);
  CHECK(y.to_vector<int64_t>() == std::vector<int64_t>{big - 2, big - 2, -5});
  Tensor promoted = from_vector<int64_t>({0, 5}).clamp(0.5, 3.5);  // a float bound: float32, as PyTorch
  CHECK(promoted.dtype() == kFloat32);
  CHECK(promoted.to_vector<float>() == std::vector<float>{0.5f, 3.5f});
  CHECK(zeros({2}, kInt32).clamp(1).dtype() == kInt32);
  CHECK(arange(big, big + 4).to_vector<int64_t>() == std::vector<int64_t>{big, big + 1, big + 2, big + 3});
  CHECK(arange(INT64_MAX - 2, INT64_MAX).to_vector<int64_t>() == std::vector<int64_t>{INT64_MAX - 2, INT64_MAX - 1});
  CHECK(arange(INT64_MIN, INT64_MAX, INT64_MAX).to_vector<int64_t>() ==
        std::vector<int64_t>{INT64_MIN, -1, INT64_MAX - 1});
  CHECK(arange(10, 0, -3).to_vector<int64_t>() == std::vector<int64_t>{10, 7, 4, 1});
  CHECK(from_vector<int64_t>({INT64_MAX, big}).str() == "tensor([9223372036854775807,    9007199254740995])");
}

TEST_CASE("gather, scatter and index_add on 0-dimensional tensors, as PyTorch") {
  Tensor x = scalar_tensor(3.0).requires_grad_();
  Tensor g = x.gather(0, scalar_tensor(0, kInt64));
  CHECK(g.dim() == 0);
  CHECK(g.item<double>() == 3.0);
  g.backward();
  CHECK(x.grad().item<double>() == 1.0);
  test::check_error([] { scalar_tensor(3.0).gather(0, scalar_tensor(1, kInt64)); }, {"gather", "index 1"});
  Tensor s = scalar_tensor(1.0).scatter_add(0, scalar_tensor(0, kInt64), scalar_tensor(2.0));
  CHECK(s.dim() == 0);
  CHECK(s.item<double>() == 3.0);
  // index_add: a 0-d tensor as a 1-element 1-d one (PyTorch 1.13's values: 6, 5, 5 and [0, 5, 0]).
  Tensor src = tensor({5.0, 1.0}).requires_grad_();
  Tensor a = index_add(zeros({}), 0, tensor({0, 0}, kInt64), src);
  CHECK(a.dim() == 0);
  CHECK(a.item<float>() == 6.0f);
  a.backward();
  CHECK(src.grad().to_vector<float>() == std::vector<float>{1, 1});
  CHECK(index_add(zeros({}), -1, scalar_tensor(0, kInt64), tensor({5.0})).item<float>() == 5.0f);
  CHECK(index_add(zeros({}), 0, tensor({0}, kInt64), scalar_tensor(5.0f)).item<float>() == 5.0f);
  CHECK(index_add(zeros({3}), 0, scalar_tensor(1, kInt64), scalar_tensor(5.0f)).to_vector<float>() ==
        std::vector<float>{0, 5, 0});
  test::check_error([] { index_add(zeros({}), 0, tensor({1}, kInt64), scalar_tensor(5.0f)); }, {"index_add", "1"});
  test::check_error([] { index_add(zeros({}), 0, tensor({0}, kInt64), ones({1, 1})); },
                    {"index_add", "0-d or 1-d source", "[1, 1]"});
}

TEST_CASE("edge values near the int64 limits give PyTorch's results") {
  // A step beyond the dim takes its first element; the last start takes nothing.
  CHECK(arange(5).slice(0, 0, 5, INT64_MAX).to_vector<int64_t>() == std::vector<int64_t>{0});
  CHECK(arange(5).narrow(0, 5, 0).numel() == 0);
  CHECK(arange(5).narrow(0, -5, 2).to_vector<int64_t>() == std::vector<int64_t>{0, 1});
  // randint's widest range, all of int64: every value in [low, high), spread over it.
  Tensor r = randint(INT64_MIN, INT64_MAX, {64});
  CHECK(r.lt(INT64_MAX).all().item<bool>());
  CHECK(r.min().item<int64_t>() < -(int64_t{1} << 61));
  CHECK(r.max().item<int64_t>() > (int64_t{1} << 61));
  Tensor sevens = randint(7, 8, {3}, kInt32);
  CHECK(sevens.dtype() == kInt32);
  CHECK(sevens.to_vector<int32_t>() == std::vector<int32_t>{7, 7, 7});
  // The minimum over -1: a trap in C++ (and in PyTorch 1.13's CPU kernel, a SIGFPE); here the
  // quotient wraps, as two's complement, and the remainders are 0.
  Tensor lows = tensor({0, -7, 9}, kInt64);
  lows[0].fill_(INT64_MIN);
  Tensor minus_one = full({3}, -1, kInt64);
  CHECK(floor_divide(lows, minus_one).to_vector<int64_t>() == std::vector<int64_t>{INT64_MIN, 7, -9});
  CHECK(remainder(lows, minus_one).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  CHECK(fmod(lows, minus_one).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  CHECK(div(lows, minus_one, "trunc").to_vector<int64_t>() == std::vector<int64_t>{INT64_MIN, 7, -9});
}

TEST_CASE("16-bit floats with numbers compute in float32, and their mean does not overflow") {
  Tensor h = ones({100000}, kFloat16);
  CHECK(h.mean().item<double>() == 1.0);
  CHECK(h.mean().dtype() == kFloat16);
  CHECK((ones({4}, kFloat16) / 70000).to(kFloat32).to_vector<float>()[0] == static_cast<float>(Half(1.0f / 70000)));
  CHECK((ones({4}, kBFloat16) * 0.999).to(kFloat32).to_vector<float>()[0] == static_cast<float>(BFloat16(0.999f)));
  CHECK(ones({257}, kBFloat16).mean().item<double>() == 1.0);
  Tensor in_place = ones({4}, kFloat16);
  in_place.div_(70000);  // in place too: the number stays float32
  CHECK(in_place.to(kFloat32).to_vector<float>()[0] == static_cast<float>(Half(1.0f / 70000)));
}

TEST_CASE("edge cases PyTorch defines: clamp with min > max, norm p = 0, integer powers") {
  Tensor x = tensor({-2, 0, 2});
  test::check_equal(clamp(x, 1, -1), full({3}, -1.0f));                     // max wins
  test::check_equal(clamp(x.to(kFloat16), 1, -1).to(kFloat32), full({3}, -1.0f));
  test::check_equal(clamp(x.expand({2, 3}).t(), 1, -1), full({3, 2}, -1.0f));  // strided path
  CHECK(norm(tensor({0, 2, -3}), 0).item<double>() == 2);
  test::check_equal(pow(full({2}, 2, kInt64), full({2}, -1, kInt64)), full({2}, 0, kInt64));
  test::check_equal(pow(full({2}, -1, kInt64), full({2}, -3, kInt64)), full({2}, -1, kInt64));
  test::check_equal(pow(full({2}, 1, kInt64), full({2}, int64_t{1} << 40, kInt64)), full({2}, 1, kInt64));  // no hang
  test::check_equal(pow(full({1}, 3, kInt32), 4), full({1}, 81, kInt32));
  CHECK(prod(full({3}, 2, kInt32)).dtype() == kInt64);
}

TEST_CASE("in-place ops read an overlapping operand as it was, and refuse expanded outputs") {
  Tensor x = arange(9, kFloat32).view({3, 3});
  Tensor expected = x + x.t();
  x.add_(x.t());  // reads x.t() while writing x: the operand is copied first
  test::check_equal(x, expected);
  Tensor y = arange(5, kFloat32);
  y.narrow(0, 1, 4).copy_(y.narrow(0, 0, 4));  // a shifted copy within one buffer
  test::check_equal(y, tensor({0, 0, 1, 2, 3}));
  Tensor z = zeros({3});
  test::check_error([&] { Tensor e = z.expand({2, 3}); e.add_(1); }, {"add_", "one memory location", "clone()"});
  test::check_error([&] { Tensor e = z.expand({2, 3}); e.copy_(ones({2, 3})); }, {"copy_", "expanded"});
}

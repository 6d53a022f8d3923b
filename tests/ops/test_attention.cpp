// tests/ops/test_attention.cpp: scaled_dot_product_attention. The reference is a float64 composition
// written here from matmul, masking and softmax (ops the op table checks against PyTorch); the fused
// kernel (cpu/attention.cpp) must equal it, forward and backward with a random cotangent, at the
// sizes around its 64-row blocks (1, 7, 63, 64, 65, 130), causal and not, L != S, broadcast batch
// dims; heads read in place from one projection, and the layout of what comes back; gradcheck and
// gradgradcheck in float64; dropout, fused and composed, of all the heads or of some
// (scaled_dot_product_attention_part), against the composition's mask; the same bits wherever the
// kernel's scratch lands; the switch set_fusion(false); the errors.
#include <cmath>
#include <tuple>
#include <vector>

#include "support.h"

using namespace kiln;
using test::FusionGuard;

namespace {

// softmax(q k^T * scale + causal mask) v, from ops, in float64.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  Tensor s = matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const int64_t L = q.sizes()[q.dim() - 2], S = k.sizes()[k.dim() - 2];
    Tensor above = ones({L, S}, kBool).triu(1);
    s = s.masked_fill(above, -INFINITY);
  }
  return matmul(softmax(s, -1), v);
}

// out against expected, both computed from q, k and v in float64, and their gradients for a random
// cotangent drawn from gen.
void check_forward_and_gradients(const Tensor& out, const Tensor& expected, const Tensor& q, const Tensor& k,
                                 const Tensor& v, Generator& gen) {
  test::check_close(out, expected, {1e-12, 1e-12});
  Tensor cot = randn(out.sizes(), kFloat64, &gen);
  auto got = autograd::grad({out}, {q, k, v}, {cot});
  auto want = autograd::grad({expected}, {q, k, v}, {cot});
  for (int i = 0; i < 3; ++i) {
    INFO("gradient " << i);
    test::check_close(got[i], want[i], {1e-11, 1e-11});
  }
}

// Forward and the three gradients of the fused op against the reference, both in float64.
void check_against_reference(const Shape& qs, const Shape& ks, const Shape& vs, bool causal, double seed) {
  Generator gen(static_cast<uint64_t>(seed * 1000));
  Tensor q = randn(qs, kFloat64, &gen).requires_grad_();
  Tensor k = randn(ks, kFloat64, &gen).requires_grad_();
  Tensor v = randn(vs, kFloat64, &gen).requires_grad_();
  const double scale = 1 / std::sqrt(static_cast<double>(qs[qs.size() - 1]));
  Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
  check_forward_and_gradients(out, reference(q, k, v, causal, scale), q, k, v, gen);
}

}  // namespace

TEST_CASE("scaled_dot_product_attention: the fused kernel equals the composition, forward and backward",
          "[ops][attention]") {
  FusionGuard fused(true);
  for (bool causal : {false, true}) {
    for (int64_t n : {1, 7, 63, 64, 65, 130}) {
      INFO("causal " << causal << ", L = S = " << n);
      check_against_reference({2, 3, n, 16}, {2, 3, n, 16}, {2, 3, n, 16}, causal, 0.1 * n);
    }
  }
  SECTION("L != S, Ev != E, head dims 1 and 128") {
    check_against_reference({2, 70, 8}, {2, 129, 8}, {2, 129, 5}, false, 1.5);
    check_against_reference({2, 129, 8}, {2, 70, 8}, {2, 70, 5}, true, 2.5);  // rows past S see all S keys
    check_against_reference({1, 5, 1}, {1, 9, 1}, {1, 9, 3}, true, 3.5);
    check_against_reference({1, 66, 128}, {1, 66, 128}, {1, 66, 128}, true, 4.5);
  }
  SECTION("batch dims broadcast; 2-D inputs") {
    check_against_reference({2, 1, 9, 4}, {1, 3, 9, 4}, {2, 3, 9, 4}, false, 5.5);
    check_against_reference({9, 4}, {11, 4}, {11, 6}, false, 6.5);
  }
}

TEST_CASE("scaled_dot_product_attention: strided inputs, a given scale, and large scores", "[ops][attention]") {
  FusionGuard fused(true);
  // (B, T, H, E) transposed to (B, H, T, E), as a model's heads are: not contiguous.
  Tensor q = test::sample({2, 67, 3, 8}, kFloat64, 0.1).transpose(1, 2);
  Tensor k = test::sample({2, 67, 3, 8}, kFloat64, 0.2).transpose(1, 2);
  Tensor v = test::sample({2, 67, 3, 8}, kFloat64, 0.3).transpose(1, 2);
  test::check_close(scaled_dot_product_attention(q, k, v, {}, 0.0, true, 0.7), reference(q, k, v, true, 0.7),
                    {1e-12, 1e-12});
  // Scores near 1e3 in size: the online softmax subtracts the running max, so nothing overflows.
  test::check_close(scaled_dot_product_attention(q * 30, k * 30, v, {}, 0.0, false),
                    reference(q * 30, k * 30, v, false, 1 / std::sqrt(8.0)), {1e-10, 1e-10});
}

TEST_CASE("scaled_dot_product_attention: heads read where a (B, T, 3 C) projection holds them, out in (B, T, H, E) "
          "memory",
          "[ops][attention]") {
  // Note [attention layout]: q, k and v split from one projection by view and transpose, as
  // nn::CausalSelfAttention does, go to the kernel without a copy; out and the gradients come back
  // in their input's order of dims, so merging the heads again is a view.
  FusionGuard fused(true);
  const int64_t B = 2, T = 67, H = 3, E = 8, C = H * E;
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    Tensor x = test::sample({B, T, 3 * C}, kFloat64, 0.1).requires_grad_();
    Tensor xr = x.detach().clone().requires_grad_();
    auto heads = [&](const Tensor& proj) {
      std::vector<Tensor> out;
      for (const Tensor& part : proj.split(C, 2)) out.push_back(part.view({B, T, H, E}).transpose(1, 2));
      return out;
    };
    const auto qkv = heads(x), qkv_ref = heads(xr);
    Tensor out = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, causal);
    Tensor expected = reference(qkv_ref[0], qkv_ref[1], qkv_ref[2], causal, 1 / std::sqrt(double(E)));
    test::check_close(out, expected, {1e-12, 1e-12});
    CHECK(out.transpose(1, 2).is_contiguous());  // (B, T, H, E) memory: merging the heads is a view
    Tensor cot = test::sample({B, T, C}, kFloat64, 0.2);
    (out.transpose(1, 2).reshape({B, T, C}) * cot).sum().backward();
    (expected.transpose(1, 2).reshape({B, T, C}) * cot).sum().backward();
    test::check_close(x.grad(), xr.grad(), {1e-11, 1e-11});
  }
  SECTION("views the kernel cannot read are copied first") {
    // Columns not contiguous (a transposed (E, T) matrix); rows overlapping (one key row expanded);
    // three batch dims, flattened.
    Tensor q = test::sample({2, 3, 8, 67}, kFloat64, 0.3).transpose(-1, -2);
    Tensor k = test::sample({2, 3, 1, 8}, kFloat64, 0.4).expand({2, 3, 67, 8});
    Tensor v = test::sample({2, 3, 67, 8}, kFloat64, 0.5);
    test::check_close(scaled_dot_product_attention(q, k, v, {}, 0.0, true),
                      reference(q, k, v, true, 1 / std::sqrt(8.0)), {1e-12, 1e-12});
    check_against_reference({2, 2, 3, 9, 4}, {2, 1, 3, 9, 4}, {2, 2, 1, 9, 4}, true, 7.5);
  }
}

TEST_CASE("scaled_dot_product_attention: gradcheck and gradgradcheck in float64", "[ops][attention]") {
  FusionGuard fused(true);
  Generator gen(3);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    Tensor q = randn({2, 5, 3}, kFloat64, &gen).requires_grad_();
    Tensor k = randn({2, 6, 3}, kFloat64, &gen).requires_grad_();
    Tensor v = randn({2, 6, 4}, kFloat64, &gen).requires_grad_();
    auto fn = [causal](const autograd::TensorList& in) -> autograd::TensorList {
      return {scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, causal)};
    };
    CHECK(autograd::gradcheck(fn, {q, k, v}));
    CHECK(autograd::gradgradcheck(fn, {q, k, v}));
  }
}

TEST_CASE("scaled_dot_product_attention: float32, 16-bit floats, masks, and fusion off", "[ops][attention]") {
  Tensor q = test::sample({2, 2, 70, 16}, kFloat64, 0.1), k = test::sample({2, 2, 70, 16}, kFloat64, 0.2);
  Tensor v = test::sample({2, 2, 70, 16}, kFloat64, 0.3);
  Tensor expected = reference(q, k, v, true, 0.25);
  {
    FusionGuard fused(true);
    test::check_close(scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), {}, 0.0, true),
                      expected.to(kFloat32), {1e-5, 1e-6});
    Tensor half = scaled_dot_product_attention(q.to(kBFloat16), k.to(kBFloat16), v.to(kBFloat16), {}, 0.0, true);
    CHECK(half.dtype() == kBFloat16);
    test::check_close(half.to(kFloat64), expected, {3e-2, 3e-2});
  }
  {
    FusionGuard unfused(false);
    CHECK_FALSE(fusion_enabled());
    test::check_close(scaled_dot_product_attention(q, k, v, {}, 0.0, true), expected, {1e-12, 1e-12});
  }
  // A bool mask equal to the causal one, and the same as an additive -inf mask.
  Tensor allowed = ones({70, 70}, kBool).tril();
  test::check_close(scaled_dot_product_attention(q, k, v, allowed), expected, {1e-12, 1e-12});
  Tensor additive = zeros({70, 70}, kFloat64).masked_fill(allowed.logical_not(), -INFINITY);
  test::check_close(scaled_dot_product_attention(q, k, v, additive), expected, {1e-12, 1e-12});
}

TEST_CASE("scaled_dot_product_attention: dropout draws from the Generator, scaled by 1 / (1 - p)", "[ops][attention]") {
  Tensor q = test::sample({1, 6, 4}), k = test::sample({1, 6, 4}, kFloat32, 0.7), v = test::sample({1, 6, 4}, kFloat32, 0.9);
  Generator g(11), g_ref(11);
  Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.25, false, {}, &g);
  Tensor p = softmax(matmul(q, k.transpose(-2, -1)) * 0.5, -1);
  Tensor expected = matmul(dropout(p, 0.25, true, &g_ref), v);
  test::check_close(out, expected);
}

namespace {

// The composed form with dropout, in float64, over all `whole` heads of dim -3 (the reference of the
// fused kernel's dropout): softmax, then dropout's mask drawn on the whole probabilities.
Tensor reference_dropping(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double p, Generator* gen) {
  Tensor s = matmul(q, k.transpose(-2, -1)) * (1 / std::sqrt(static_cast<double>(q.sizes()[q.dim() - 1])));
  if (causal) {
    const int64_t L = q.sizes()[q.dim() - 2], S = k.sizes()[k.dim() - 2];
    s = s.masked_fill(ones({L, S}, kBool).triu(1), -INFINITY);
  }
  return matmul(dropout(softmax(s, -1), p, true, gen), v);
}

// Heads [first, first + heads) of dim -3 of q, k, v (all heads when heads = q.size(-3)), through
// scaled_dot_product_attention_part (or scaled_dot_product_attention when they are all), against
// those heads of reference_dropping on all of them: forward and the gradients of q, k and v, and
// the generator's state after.
void check_dropping(const Shape& qs, const Shape& ks, const Shape& vs, bool causal, double p, int64_t first,
                    int64_t heads, uint64_t seed) {
  Generator data(seed);
  Tensor q = randn(qs, kFloat64, &data).requires_grad_(), k = randn(ks, kFloat64, &data).requires_grad_();
  Tensor v = randn(vs, kFloat64, &data).requires_grad_();
  const int64_t whole = qs[qs.size() - 3];
  auto part = [&](const Tensor& t) { return t.narrow(-3, first, heads); };
  Generator gen(seed + 1), gen_ref(seed + 1);
  rand({3}, kFloat32, &gen);  // a generator that has drawn before: a nonzero offset
  rand({3}, kFloat32, &gen_ref);
  Tensor out = heads == whole ? scaled_dot_product_attention(q, k, v, {}, p, causal, {}, &gen)
                              : scaled_dot_product_attention_part(part(q), part(k), part(v), first, whole, {}, p,
                                                                  causal, {}, &gen);
  Tensor expected = part(reference_dropping(q, k, v, causal, p, &gen_ref));
  CHECK(gen.offset() == gen_ref.offset());
  check_forward_and_gradients(out, expected, q, k, v, data);
}

}  // namespace

TEST_CASE("scaled_dot_product_attention: dropout in the fused kernel drops what the composition drops",
          "[ops][attention][dropout]") {
  for (bool fusion : {true, false}) {
    FusionGuard guard(fusion);
    for (bool causal : {false, true}) {
      for (int64_t n : {1, 7, 64, 65, 130}) {
        INFO("fusion " << fusion << ", causal " << causal << ", L = S = " << n);
        check_dropping({2, 3, n, 16}, {2, 3, n, 16}, {2, 3, n, 16}, causal, 0.3, 0, 3, static_cast<uint64_t>(n));
      }
    }
    INFO("fusion " << fusion);
    // L != S, Ev != E, an odd start in the draw for each row (S odd), p near 0 and near 1
    check_dropping({2, 1, 70, 8}, {2, 1, 129, 8}, {2, 1, 129, 5}, false, 0.5, 0, 1, 21);
    check_dropping({1, 2, 129, 8}, {1, 2, 67, 8}, {1, 2, 67, 5}, true, 0.05, 0, 2, 22);
    check_dropping({1, 2, 33, 8}, {1, 2, 33, 8}, {1, 2, 33, 8}, true, 0.95, 0, 2, 23);
    // Heads [first, first + heads) of all of them: one head, a middle run, the last ones; and with
    // three batch dims, which the kernel flattens (the heads stay the innermost batch dim).
    check_dropping({2, 5, 40, 8}, {2, 5, 40, 8}, {2, 5, 40, 8}, true, 0.3, 0, 1, 31);
    check_dropping({2, 5, 40, 8}, {2, 5, 40, 8}, {2, 5, 40, 8}, false, 0.3, 1, 3, 32);
    check_dropping({2, 5, 66, 8}, {2, 5, 66, 8}, {2, 5, 66, 8}, true, 0.3, 3, 2, 33);
    check_dropping({2, 3, 4, 9, 8}, {2, 3, 4, 9, 8}, {2, 3, 4, 9, 8}, true, 0.3, 1, 2, 34);
  }
}

TEST_CASE("scaled_dot_product_attention: dropout with 0 or 1 batch dims, a value that adds batch dims, no heads",
          "[ops][attention][dropout]") {
  // Each case fused and composed from one generator state: the same result and the same offset after.
  auto same_both_ways = [](const Tensor& q, const Tensor& k, const Tensor& v, int64_t first, int64_t whole) {
    Tensor got[2];
    uint64_t offset[2];
    for (int fusion = 0; fusion < 2; ++fusion) {
      FusionGuard guard(fusion == 1);
      Generator g(17);
      got[fusion] = whole > 0 ? scaled_dot_product_attention_part(q, k, v, first, whole, {}, 0.3, true, {}, &g)
                              : scaled_dot_product_attention(q, k, v, {}, 0.3, true, {}, &g);
      offset[fusion] = g.offset();
    }
    CHECK(offset[1] == offset[0]);
    test::check_close(got[1], got[0], {1e-12, 1e-12});
  };
  Tensor q2 = randn({9, 8}, kFloat64), k2 = randn({9, 8}, kFloat64), v2 = randn({9, 5}, kFloat64);
  same_both_ways(q2, k2, v2, 0, 0);                                                    // no batch dims
  same_both_ways(q2.unsqueeze(0), k2.unsqueeze(0), v2.unsqueeze(0), 2, 3);              // one: the heads
  same_both_ways(q2.unsqueeze(0), k2.unsqueeze(0), v2.expand({3, 9, 5}) * 1.0, 0, 0);  // value adds a batch dim
  same_both_ways(q2.expand({2, 1, 9, 8}), k2, v2.expand({2, 4, 9, 5}) * 1.0, 1, 3);  // ... a part of 1 head of 3
  same_both_ways(randn({2, 0, 9, 8}, kFloat64), randn({2, 0, 9, 8}, kFloat64), randn({2, 0, 9, 5}, kFloat64), 1,
                 3);  // no heads: the generator still moves as for all 3
  Generator g(17);
  scaled_dot_product_attention_part(randn({2, 0, 9, 8}, kFloat64), randn({2, 0, 9, 8}, kFloat64),
                                    randn({2, 0, 9, 5}, kFloat64), 1, 3, {}, 0.3, true, {}, &g);
  CHECK(g.offset() == static_cast<uint64_t>(2 * 3 * 9 * 9 / 2));
}

TEST_CASE("scaled_dot_product_attention: with dropout, the backward written with ops (create_graph) draws the "
          "forward's mask", "[ops][attention][dropout]") {
  FusionGuard fused(true);
  for (auto [shape, first, whole] : {std::tuple{Shape{2, 3, 4, 9, 8}, int64_t{1}, int64_t{6}},
                                     std::tuple{Shape{2, 3, 70, 8}, int64_t{2}, int64_t{5}}}) {
    INFO("shape " << shape.str());
    Generator data(4);
    Tensor q = randn(shape, kFloat64, &data).requires_grad_(), k = randn(shape, kFloat64, &data).requires_grad_();
    Tensor v = randn(shape, kFloat64, &data).requires_grad_();
    Tensor cot = randn(shape, kFloat64, &data);
    Generator g(9);
    Tensor out = scaled_dot_product_attention_part(q, k, v, first, whole, {}, 0.4, true, {}, &g);
    auto kernel = autograd::grad({out}, {q, k, v}, {cot}, true, false);   // the kernel's backward
    auto composed = autograd::grad({out}, {q, k, v}, {cot}, true, true);  // written with ops
    for (int i = 0; i < 3; ++i) {
      INFO("gradient " << i);
      test::check_close(composed[i], kernel[i], {1e-11, 1e-11});
    }
  }
}

TEST_CASE("scaled_dot_product_attention: dropout in float32 and bfloat16, gradgradcheck, and evaluation",
          "[ops][attention][dropout]") {
  FusionGuard fused(true);
  Tensor q = test::sample({2, 2, 70, 16}, kFloat64, 0.1), k = test::sample({2, 2, 70, 16}, kFloat64, 0.2);
  Tensor v = test::sample({2, 2, 70, 16}, kFloat64, 0.3);
  Generator g(5), g_ref(5);
  Tensor expected = reference_dropping(q, k, v, true, 0.2, &g_ref);
  test::check_close(scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), {}, 0.2, true, {}, &g),
                    expected.to(kFloat32), {1e-5, 1e-6});
  g.manual_seed(5);
  Tensor half = scaled_dot_product_attention(q.to(kBFloat16), k.to(kBFloat16), v.to(kBFloat16), {}, 0.2, true, {}, &g);
  CHECK(half.dtype() == kBFloat16);
  test::check_close(half.to(kFloat64), expected, {3e-2, 3e-2});
  // No draw without dropout: evaluation passes 0.
  const uint64_t offset = g.offset();
  scaled_dot_product_attention_part(q, k, v, 1, 4, {}, 0.0, true, {}, &g);
  CHECK(g.offset() == offset);
  // The fused node's backward written with ops (create_graph) draws the same mask again.
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    Tensor a = randn({2, 5, 3}, kFloat64, &g).requires_grad_(), b = randn({2, 6, 3}, kFloat64, &g).requires_grad_();
    Tensor c = randn({2, 6, 4}, kFloat64, &g).requires_grad_();
    auto fn = [causal](const autograd::TensorList& in) -> autograd::TensorList {
      Generator same(77);  // every call drops the same probabilities
      return {scaled_dot_product_attention_part(in[0].unsqueeze(1), in[1].unsqueeze(1), in[2].unsqueeze(1), 1, 3, {},
                                                0.4, causal, {}, &same)};
    };
    CHECK(autograd::gradcheck(fn, {a, b, c}));
    CHECK(autograd::gradgradcheck(fn, {a, b, c}));
  }
}

namespace {

// The fused kernel on bfloat16 q, k and v (Note [bfloat16 attention] in cpu/attention.cpp) against
// float64 on the same values, forward and the three gradients for a bfloat16 cotangent g, with
// dropout d (0: none). The bounds follow the kernel's roundings, with u = 2^-8 (twice bfloat16's
// unit roundoff, room for float32's sums and exp); p is the softmax, z the mask values (1 without
// dropout), dp = g v^T, D_i = sum_e g_ie out_ie and ds = p (dp z - D) scale:
//   out_i: the products take p z rounded:     u (sum_j p_ij z_ij |v_j| + |out_i|)
//   D_i is the kernel's, from its rounded out: off by dD_i <= sum_e |g_ie| bound(out_ie)
//   gv_j:  p z rounded:                       u (sum_i p_ij z_ij |g_i| + |gv_j|)
//   gq_i:  ds rounded, and dD:                u (sum_j |ds_ij| |k_j| + |gq_i|) + scale sum_j p_ij dD_i |k_j|
//   gk_j:  likewise:                          u (sum_i |ds_ij| |q_i| + |gk_j|) + scale sum_i p_ij dD_i |q_i|
void check_bf16_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double d, uint64_t seed) {
  Generator gen(seed), gen_ref(seed), data(seed + 1);
  Tensor out = scaled_dot_product_attention(q, k, v, {}, d, causal, {}, &gen);
  REQUIRE(out.dtype() == kBFloat16);
  Tensor g = randn(out.sizes(), kFloat64, &data).to(kBFloat16);
  // The kernel's backward, then (create_graph) the one written with ops, in float32 on the CPU.
  auto got = autograd::grad({out}, {q, k, v}, {g}, true);
  auto with_ops = autograd::grad({out}, {q, k, v}, {g}, true, true);

  Tensor q64 = q.detach().to(kFloat64), k64 = k.detach().to(kFloat64), v64 = v.detach().to(kFloat64);
  Tensor g64 = g.to(kFloat64);
  const int64_t L = q.size(-2), S = k.size(-2);
  const double scale = 1 / std::sqrt(static_cast<double>(q.size(-1)));
  Tensor s = matmul(q64, k64.transpose(-2, -1)) * scale;
  if (causal) s = s.masked_fill(ones({L, S}, kBool).triu(1), -INFINITY);
  Tensor p = softmax(s, -1);
  Tensor z = d > 0 ? dropout(ones_like(p), d, true, &gen_ref) : ones_like(p);  // the same draw as the kernel's
  Tensor pz = p * z;
  Tensor out64 = matmul(pz, v64);
  Tensor ds = p * (matmul(g64, v64.transpose(-2, -1)) * z - (g64 * out64).sum({-1}, true)) * scale;
  Tensor gq = matmul(ds, k64), gk = matmul(ds.transpose(-2, -1), q64), gv = matmul(pz.transpose(-2, -1), g64);
  const double u = std::ldexp(1.0, -8);
  Tensor b_out = (matmul(pz, v64.abs()) + out64.abs()) * u;
  Tensor pdD = p * (g64.abs() * b_out).sum({-1}, true) * scale;
  test::check_within("out", out, out64, b_out);
  test::check_within("grad of q", got[0], gq, (matmul(ds.abs(), k64.abs()) + gq.abs()) * u + matmul(pdD, k64.abs()));
  test::check_within("grad of k", got[1], gk,
               (matmul(ds.abs().transpose(-2, -1), q64.abs()) + gk.abs()) * u + matmul(pdD.transpose(-2, -1), q64.abs()));
  test::check_within("grad of v", got[2], gv, (matmul(pz.transpose(-2, -1), g64.abs()) + gv.abs()) * u);
  for (const Tensor& t : got) CHECK(t.dtype() == kBFloat16);
  // Written with ops in float32, the gradients are rounded once: within 2^-8 of float64's.
  const double unit = std::ldexp(1.0, -8);
  test::check_within("grad of q, with ops", with_ops[0], gq, gq.abs() * unit + 1e-6);
  test::check_within("grad of k, with ops", with_ops[1], gk, gk.abs() * unit + 1e-6);
  test::check_within("grad of v, with ops", with_ops[2], gv, gv.abs() * unit + 1e-6);
}

}  // namespace

TEST_CASE("bfloat16 cpu attention: the fused kernel's bfloat16 path against float64, forward and backward",
          "[ops][attention]") {
  // Through cpu/bf16gemm.cpp (AMX or AVX512-BF16) where the CPU takes it, else float32 copies of the
  // block operands; CTest runs this once more with KILN_CPU_BF16_GEMM=float, the second way on every
  // CPU. Sizes around the 64-row blocks, head dims below, at and above AMX's 32 k a step and odd,
  // Ev != E, L != S (causal too).
  FusionGuard fused(true);
  Generator gen(21);
  struct Case {
    int64_t L, S, E, Ev;
    bool causal;
    double dropout;
  };
  for (const Case& c : std::vector<Case>{{70, 70, 16, 16, true, 0.0},  {70, 70, 16, 16, false, 0.0},
                                         {130, 130, 32, 32, true, 0.0}, {5, 130, 48, 24, false, 0.0},
                                         {64, 64, 64, 64, true, 0.0},  {1, 1, 32, 32, true, 0.0},
                                         {70, 70, 32, 32, true, 0.2},  {65, 7, 40, 8, false, 0.1},
                                         {70, 130, 33, 33, true, 0.0}, {130, 70, 17, 20, true, 0.1}}) {
    INFO("L " << c.L << ", S " << c.S << ", E " << c.E << ", Ev " << c.Ev << ", causal " << c.causal << ", dropout "
              << c.dropout);
    Tensor q = randn({2, 3, c.L, c.E}, kFloat32, &gen).to(kBFloat16).requires_grad_();
    Tensor k = randn({2, 3, c.S, c.E}, kFloat32, &gen).to(kBFloat16).requires_grad_();
    Tensor v = randn({2, 3, c.S, c.Ev}, kFloat32, &gen).to(kBFloat16).requires_grad_();
    check_bf16_attention(q, k, v, c.causal, c.dropout, 100 + c.L);
  }
  // The heads of one (B, T, 3, H, E) projection, read where they lie.
  Tensor qkv = randn({2, 70, 3, 2, 32}, kFloat32, &gen).to(kBFloat16).requires_grad_();
  auto head = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
  check_bf16_attention(head(0), head(1), head(2), true, 0.0, 7);
}

TEST_CASE("scaled_dot_product_attention: the fused kernel gives the same bits wherever its scratch memory lands",
          "[ops][attention]") {
  // The kernel's block scratch comes from the heap. Eigen's vector loops start at the first aligned
  // element and do the ones before it in scalar code, whose exp can differ from the vector exp in
  // the last bit: on unaligned scratch the results followed the heap address (a GPT's loss changed
  // with what had been allocated before). Shift the heap between calls: forward and backward must
  // be bit-equal to the first call's.
  for (const Shape& shape : {Shape({8, 16, 32}), Shape({2, 50, 32})}) {
    for (bool causal : {true, false}) {
      INFO("shape " << shape.str() << ", causal " << causal);
      auto run = [&] {
        Tensor q = test::sample(shape, kFloat32, 0.1).requires_grad_(),
               k = test::sample(shape, kFloat32, 0.2).requires_grad_(),
               v = test::sample(shape, kFloat32, 0.3).requires_grad_();
        Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
        (out * test::sample(shape, kFloat32, 0.4)).sum().backward();
        return std::vector<Tensor>{out.detach(), q.grad(), k.grad(), v.grad()};
      };
      const std::vector<Tensor> first = run();
      std::vector<std::vector<float>> shifts;
      for (size_t i = 1; i <= 16; ++i) {
        shifts.emplace_back(i);  // 4 i bytes more of the heap in use
        const std::vector<Tensor> again = run();
        for (size_t j = 0; j < first.size(); ++j) test::check_equal(again[j], first[j]);
      }
    }
  }
}

TEST_CASE("scaled_dot_product_attention: errors name the shapes and what to do", "[ops][attention][errors]") {
  Tensor q = zeros({2, 4, 8}), k = zeros({2, 5, 8}), v = zeros({2, 5, 3});
  test::check_error([&] { scaled_dot_product_attention(q, zeros({2, 5, 7}), v); },
                    {"scaled_dot_product_attention", "last dim of key (7)", "query (8)"});
  test::check_error([&] { scaled_dot_product_attention(q, k, zeros({2, 6, 3})); },
                    {"value must have as many rows as key", "6 vs 5"});
  test::check_error([&] { scaled_dot_product_attention(q, k, v, ones({4, 5}, kBool), 0.0, true); },
                    {"not both"});
  test::check_error([&] { scaled_dot_product_attention(q, k, v, ones({3, 5}, kBool)); },
                    {"attn_mask of shape [3, 5]", "must broadcast"});
  test::check_error([&] { scaled_dot_product_attention(q, k.to(kFloat64), v); }, {"one floating dtype"});
  test::check_error([&] { scaled_dot_product_attention(zeros({4}), k, v); }, {"at least 2 dims"});
  test::check_error([&] { scaled_dot_product_attention(q, k, v, {}, 1.0); }, {"dropout_p must be in [0, 1)"});
  test::check_error([&] { scaled_dot_product_attention_part(q, k, v, 1, 2); },
                    {"scaled_dot_product_attention_part", "heads [1, 3) do not fit 2 heads", "first_head"});
  test::check_error([&] { scaled_dot_product_attention_part(q, k, v, -1, 4); }, {"heads [-1, 1)"});
  test::check_error([&] { scaled_dot_product_attention_part(q, k, v, 0, 0); }, {"whole_heads must be positive"});
  test::check_error([&] { scaled_dot_product_attention_part(zeros({4, 8}), zeros({5, 8}), zeros({5, 3}), 0, 1); },
                    {"needs the heads as a batch dim"});
  test::check_error([&] { scaled_dot_product_attention_part(zeros({4, 8}), zeros({5, 8}), zeros({2, 5, 3}), 0, 2); },
                    {"needs the heads as a batch dim of query or key"});
  test::check_error([&] { scaled_dot_product_attention_part(q, k, v, 0, 1); },
                    {"2 heads are more than whole_heads = 1"});
}

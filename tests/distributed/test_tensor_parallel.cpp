// tests/distributed/test_tensor_parallel.cpp: tensor parallelism (distributed/tensor_parallel/) at
// 1-4 ranks: the conjugate communication functions give exact values forward and backward, and the
// parallel layers built from the same seed compute what nn::Linear, nn::GeluMLP and
// nn::CausalSelfAttention compute on one process, forward, backward and over 20 training steps;
// and so do they with sequence parallelism, on each rank's positions of the sequence.
#include <algorithm>
#include <tuple>

#include "support.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_close;
using kiln::test::check_error;

TEST_CASE("tensor parallel: f, g, gather and scatter, forward and backward", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  // x = r + 1 everywhere, on each rank.
  Tensor x = full({2, 3}, static_cast<double>(r + 1)).requires_grad_();
  Tensor y = copy_to_tensor_parallel_region(x, *comm);
  check_close(y, full({2, 3}, static_cast<double>(r + 1)));
  (y * static_cast<double>(r + 1)).sum().backward();  // each rank's gradient r + 1; f sums them
  check_close(x.grad(), full({2, 3}, p * (p + 1) / 2.0));

  Tensor a = full({2, 3}, static_cast<double>(r + 1)).requires_grad_();
  Tensor b = reduce_from_tensor_parallel_region(a, *comm);
  check_close(b, full({2, 3}, p * (p + 1) / 2.0));
  (b * 2.0).sum().backward();  // g passes the gradient through
  check_close(a.grad(), full({2, 3}, 2.0));

  // Rank r holds columns [2r, 2r + 2) of a (2, 2p) matrix whose element (i, j) is 10 i + j.
  Tensor whole = (arange(0, 2).reshape({2, 1}) * 10.0 + arange(0, 2 * p).reshape({1, -1})).to(kFloat32);
  Tensor mine = whole.narrow(1, 2 * r, 2).contiguous().requires_grad_();
  Tensor g = gather_from_tensor_parallel_region(mine, *comm);
  check_close(g, whole);
  (g * whole).sum().backward();  // the gradient of the gather is this rank's slice of whole
  check_close(mine.grad(), whole.narrow(1, 2 * r, 2));
  Tensor w = whole.clone().requires_grad_();
  Tensor sc = scatter_to_tensor_parallel_region(w, *comm);
  check_close(sc, whole.narrow(1, 2 * r, 2));
  sc.sum().backward();  // every rank's slice of ones, gathered: ones everywhere
  check_close(w.grad(), ones({2, 2 * p}));
  if (p > 1) check_error([&] { scatter_to_tensor_parallel_region(ones({2, 2 * p + 1}), *comm); }, {"multiple of the"});
}

TEST_CASE("tensor parallel: column- and row-parallel linear layers equal nn::Linear", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  Tensor x = kiln::test::sample({5, 24}, kFloat32, 0.3);
  Tensor cot = kiln::test::sample({5, 36}, kFloat32, 0.8);
  manual_seed(3);
  nn::Linear ref(24, 36);
  manual_seed(3);
  ColumnParallelLinear col(24, 36, comm, {.gather_output = true});
  CHECK(col.weight.sizes() == Shape({36 / p, 24}));
  check_close(col.weight, ref.weight.narrow(0, r * 36 / p, 36 / p));
  Tensor xr = x.clone().requires_grad_(), xc = x.clone().requires_grad_();
  Tensor yr = ref(xr), yc = col(xc);
  check_close(yc, yr, {1e-5, 1e-6});
  (yr * cot).sum().backward();
  (yc * cot).sum().backward();
  check_close(xc.grad(), xr.grad(), {1e-5, 1e-6});  // the parts of dL/dx, all-reduced by f
  check_close(col.weight.grad(), ref.weight.grad().narrow(0, r * 36 / p, 36 / p), {1e-5, 1e-6});
  check_close(col.bias.grad(), ref.bias.grad().narrow(0, r * 36 / p, 36 / p), {1e-5, 1e-6});

  manual_seed(4);
  nn::Linear ref2(36, 24);
  manual_seed(4);
  RowParallelLinear row(36, 24, comm, {.input_is_parallel = false});
  CHECK(row.weight.sizes() == Shape({24, 36 / p}));
  Tensor h = kiln::test::sample({5, 36}, kFloat32, 0.1);
  Tensor hr = h.clone().requires_grad_(), hc = h.clone().requires_grad_();
  Tensor zr = ref2(hr), zc = row(hc);
  check_close(zc, zr, {1e-5, 1e-6});
  Tensor cot2 = kiln::test::sample({5, 24}, kFloat32, 0.6);
  (zr * cot2).sum().backward();
  (zc * cot2).sum().backward();
  check_close(hc.grad(), hr.grad(), {1e-5, 1e-6});  // gathered back by the scatter's backward
  check_close(row.weight.grad(), ref2.weight.grad().narrow(1, r * 36 / p, 36 / p), {1e-5, 1e-6});
  check_close(row.bias.grad(), ref2.bias.grad(), {1e-5, 1e-6});
}

TEST_CASE("tensor parallel: ParallelMLP trains as nn::GeluMLP over 20 steps", "[distributed]") {
  auto comm = init("mpi");
  const int r = comm->rank(), p = comm->size();
  manual_seed(9);
  nn::GeluMLP ref(12);  // 12 -> 48 -> 12
  manual_seed(9);
  ParallelMLP mlp(12, 48, comm);
  optim::SGD opt_ref(ref.parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::SGD opt(mlp.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < 20; ++step) {
    INFO("step " << step);
    Tensor x = kiln::test::sample({4, 6, 12}, kFloat32, 0.2 * step);
    Tensor target = kiln::test::sample({4, 6, 12}, kFloat32, 1.1 + step);
    Tensor loss_ref = (ref(x) - target).square().mean();
    opt_ref.zero_grad();
    loss_ref.backward();
    opt_ref.step();
    Tensor loss = (mlp(x) - target).square().mean();  // the same on every rank
    opt.zero_grad();
    loss.backward();
    opt.step();
    check_close(loss.detach(), loss_ref.detach(), {1e-5, 1e-7});
  }
  check_close(mlp.fc.weight, ref.c_fc.weight.narrow(0, r * 48 / p, 48 / p), {1e-5, 1e-6});
  check_close(mlp.proj.weight, ref.c_proj.weight.narrow(1, r * 48 / p, 48 / p), {1e-5, 1e-6});
  check_close(mlp.proj.bias, ref.c_proj.bias, {1e-5, 1e-6});
}

TEST_CASE("tensor parallel: ParallelSelfAttention splits the heads and equals nn::CausalSelfAttention",
          "[distributed]") {
  auto comm = init("mpi");
  const int r = comm->rank(), p = comm->size();
  const int64_t C = 48, H = 12;
  manual_seed(13);
  nn::CausalSelfAttention ref(C, H);
  manual_seed(13);
  ParallelSelfAttention attn(C, H, comm);
  CHECK(attn.c_attn.weight.sizes() == Shape({3 * C / p, C}));
  Tensor x = kiln::test::sample({2, 7, C}, kFloat32, 0.4);
  Tensor cot = kiln::test::sample({2, 7, C}, kFloat32, 0.9);
  Tensor xr = x.clone().requires_grad_(), xp = x.clone().requires_grad_();
  Tensor yr = ref(xr), yp = attn(xp);
  check_close(yp, yr, {1e-5, 1e-6});
  (yr * cot).sum().backward();
  (yp * cot).sum().backward();
  check_close(xp.grad(), xr.grad(), {1e-5, 1e-6});
  // This rank's q, k and v rows of c_attn's gradient: rows [r C/p, (r+1) C/p) of each third.
  for (int64_t b = 0; b < 3; ++b) {
    check_close(attn.c_attn.weight.grad().narrow(0, b * C / p, C / p),
                ref.c_attn.weight.grad().narrow(0, b * C + r * C / p, C / p), {1e-5, 1e-6});
  }
  check_close(attn.c_proj.weight.grad(), ref.c_proj.weight.grad().narrow(1, r * C / p, C / p), {1e-5, 1e-6});
}

TEST_CASE("sequence parallel: gather, reduce-scatter and scatter along the sequence, forward and backward",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  // A (2, 3p, 2) activation whose element (b, t, c) is 100 b + 10 t + c; rank r holds positions
  // [3r, 3r + 3).
  Tensor whole = (arange(0, 2).reshape({2, 1, 1}) * 100.0 + arange(0, 3 * p).reshape({1, -1, 1}) * 10.0 +
                  arange(0, 2).reshape({1, 1, 2})).to(kFloat32);
  Tensor mine = whole.narrow(1, 3 * r, 3).contiguous();
  Tensor a = mine.clone().requires_grad_();
  Tensor g = gather_from_sequence_parallel_region(a, *comm);
  kiln::test::check_equal(g, whole);
  // Backward: the gradients of every rank summed, each rank keeping its positions. Rank q's
  // gradient is (q + 1) whole, so the sum is p (p + 1) / 2 whole.
  (g * whole * static_cast<double>(r + 1)).sum().backward();
  check_close(a.grad(), mine * (p * (p + 1) / 2.0));
  // With tensor_parallel_output_grad = false the gradient is taken as whole on each rank: kept.
  Tensor a2 = mine.clone().requires_grad_();
  (gather_from_sequence_parallel_region(a2, *comm, false) * whole).sum().backward();
  check_close(a2.grad(), mine);

  // Reduce-scatter: rank q contributes (q + 1) whole; rank r gets its positions of the sum.
  Tensor c = (whole * static_cast<double>(r + 1)).requires_grad_();
  Tensor rs = reduce_scatter_to_sequence_parallel_region(c, *comm);
  check_close(rs, mine * (p * (p + 1) / 2.0));
  (rs * mine).sum().backward();  // the gradient at every rank's positions, gathered: whole
  check_close(c.grad(), whole);

  Tensor w = whole.clone().requires_grad_();
  Tensor sc = scatter_to_sequence_parallel_region(w, *comm);
  kiln::test::check_equal(sc, mine);
  (sc * 2.0).sum().backward();
  check_close(w.grad(), full({2, 3 * p, 2}, 2.0));
  if (p > 1) {
    check_error([&] { scatter_to_sequence_parallel_region(ones({2, 3 * p + 1, 2}), *comm); },
                {"the sequence (", "must be a multiple of the"});
    check_error([&] { RowParallelLinear rl(4 * p, 4, comm, {.input_is_parallel = false, .sequence_parallel = true}); },
                {"sequence_parallel needs input_is_parallel"});
  }
}

TEST_CASE("sequence parallel: ParallelMLP and ParallelSelfAttention on each rank's positions equal the whole layers",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t C = 48, H = 12, T = 4 * p;
  auto positions = [&](const Tensor& t) { return t.narrow(1, r * T / p, T / p).contiguous(); };
  const kiln::test::Tolerance tol{1e-5, 1e-6};
  {
    manual_seed(9);
    nn::GeluMLP ref(C);  // C -> 4 C -> C
    manual_seed(9);
    ParallelMLP mlp(C, 4 * C, comm, "none", /*sequence_parallel=*/true);
    Tensor x = kiln::test::sample({2, T, C}, kFloat32, 0.2), cot = kiln::test::sample({2, T, C}, kFloat32, 0.7);
    Tensor xr = x.clone().requires_grad_(), xp = positions(x).requires_grad_();
    Tensor yr = ref(xr), yp = mlp(xp);
    check_close(yp, positions(yr), tol);  // this rank's positions of the output
    (yr * cot).sum().backward();
    (yp * positions(cot)).sum().backward();
    check_close(xp.grad(), positions(xr.grad()), tol);
    check_close(mlp.fc.weight.grad(), ref.c_fc.weight.grad().narrow(0, r * 4 * C / p, 4 * C / p), tol);
    check_close(mlp.proj.weight.grad(), ref.c_proj.weight.grad().narrow(1, r * 4 * C / p, 4 * C / p), tol);
    check_close(mlp.proj.bias.grad(), ref.c_proj.bias.grad(), tol);  // the positions' parts, summed
    check_close(mlp.fc.bias.grad(), ref.c_fc.bias.grad().narrow(0, r * 4 * C / p, 4 * C / p), tol);
  }
  // A column-parallel layer keeps only this rank's positions for backward (not the gathered
  // sequence) and gathers them again there; with a bias and without, the weight frozen or not.
  for (auto [bias, frozen] : {std::pair{true, false}, {false, false}, {true, true}}) {
    INFO("bias " << bias << ", frozen weight " << frozen);
    manual_seed(17);
    nn::Linear ref(C, 2 * C, {.bias = bias});
    manual_seed(17);
    ColumnParallelLinear fc(C, 2 * C, comm, {.bias = bias, .sequence_parallel = true});
    fc.weight.requires_grad_(!frozen);
    const int64_t out = 2 * C / p;
    Tensor x = kiln::test::sample({2, T, C}, kFloat32, 0.3), cot = kiln::test::sample({2, T, 2 * C}, kFloat32, 0.8);
    Tensor xr = x.clone().requires_grad_(), xp = positions(x).requires_grad_();
    std::vector<int64_t> saved;  // the elements of each activation saved for backward (a frozen weight too)
    Tensor yp;
    {
      autograd::SavedTensorHooksGuard hooks({[&](const Tensor& t) {
                                               if (!t.is_same(fc.weight)) saved.push_back(t.numel());
                                               return t;
                                             },
                                             [](const Tensor& t) { return t; }});
      yp = fc(xp * 1.0);  // not a leaf, so its saving goes through the hooks
    }
    REQUIRE_FALSE(saved.empty());
    CHECK(*std::max_element(saved.begin(), saved.end()) == 2 * (T / p) * C);  // (B, T / p, C), not (B, T, C)
    Tensor yr = ref(xr);
    check_close(yp, yr.narrow(2, r * out, out), tol);
    (yr * cot).sum().backward();
    (yp * cot.narrow(2, r * out, out)).sum().backward();
    check_close(xp.grad(), positions(xr.grad()), tol);
    CHECK(fc.weight.grad().defined() == !frozen);
    if (!frozen) check_close(fc.weight.grad(), ref.weight.grad().narrow(0, r * out, out), tol);
    if (bias) check_close(fc.bias.grad(), ref.bias.grad().narrow(0, r * out, out), tol);
  }
  {
    manual_seed(13);
    nn::CausalSelfAttention ref(C, H);
    manual_seed(13);
    ParallelSelfAttention attn(C, H, comm, /*sequence_parallel=*/true);
    Tensor x = kiln::test::sample({2, T, C}, kFloat32, 0.4), cot = kiln::test::sample({2, T, C}, kFloat32, 0.9);
    Tensor xr = x.clone().requires_grad_(), xp = positions(x).requires_grad_();
    Tensor yr = ref(xr), yp = attn(xp);
    check_close(yp, positions(yr), tol);
    (yr * cot).sum().backward();
    (yp * positions(cot)).sum().backward();
    check_close(xp.grad(), positions(xr.grad()), tol);  // later positions' queries reach earlier keys
    // c_proj's weight gradient sums products of the attention's outputs (softmax-weighted sums of
    // values, each a sum of 48 float32 products), computed in another order here than in the whole
    // layer; where the terms cancel, that leaves a few float32 epsilons (6e-8) of the terms' size,
    // which reached 2.3e-6 in a build for a Zen 4 (-march=native): hence 5e-6 absolute here.
    check_close(attn.c_proj.weight.grad(), ref.c_proj.weight.grad().narrow(1, r * C / p, C / p), {1e-5, 5e-6});
    check_close(attn.c_proj.bias.grad(), ref.c_proj.bias.grad(), tol);
  }
}

TEST_CASE("tensor parallel: with dropout, ParallelSelfAttention and ParallelMLP drop what the whole layers drop",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t C = 48, H = 12, T = 3 * p;
  // Each rank's part of the same masks from the same generator state; sequence parallel, each
  // rank's positions. Under bfloat16 autocast too (the attention in bfloat16, as
  // scaled_dot_product_attention runs it). Fused (the CPU kernel draws the heads' part of the mask
  // block by block) and composed.
  for (auto [sequence_parallel, autocast, fusion] :
       {std::tuple{false, false, true}, {true, false, true}, {false, true, true}, {false, false, false},
        {true, false, false}, {false, true, false}}) {
    INFO("sequence parallel " << sequence_parallel << ", autocast " << autocast << ", fusion " << fusion);
    kiln::test::FusionGuard fusion_guard(fusion);
    auto part = [&](const Tensor& t) { return sequence_parallel ? t.narrow(1, r * T / p, T / p).contiguous() : t; };
    // bfloat16 rounds at other points in the split layers (the row-parallel partial sums, an
    // unfused GELU), and more so in the gradients; a wrong mask would be off by whole elements.
    const kiln::test::Tolerance tol = autocast ? kiln::test::Tolerance{2e-2, 2e-2} : kiln::test::Tolerance{1e-5, 1e-6};
    const kiln::test::Tolerance grad_tol = autocast ? kiln::test::Tolerance{1e-1, 5e-2} : tol;
    manual_seed(21);
    nn::CausalSelfAttention attn_ref(C, H, {.dropout = 0.3});
    nn::GeluMLP mlp_ref(C, {.dropout = 0.3});
    manual_seed(21);
    ParallelSelfAttention attn(C, H, comm, sequence_parallel, 0.3);
    ParallelMLP mlp(C, 4 * C, comm, "none", sequence_parallel, 0.3);
    Tensor x = kiln::test::sample({2, T, C}, kFloat32, 0.6), cot = kiln::test::sample({2, T, C}, kFloat32, 0.1);
    Tensor xr = x.clone().requires_grad_(), xp = part(x).requires_grad_();
    const Generator::State state = default_generator().get_state();
    Tensor yr, yp;
    std::vector<DType> probabilities;  // the dtypes of the (B, H / p, T, T) tensors attn saves
    {
      AutocastGuard guard(Device::cpu(), kBFloat16, autocast);
      yr = mlp_ref(attn_ref(xr));
      const uint64_t after = default_generator().offset();
      default_generator().set_state(state);
      const Shape probs_shape{2, H / p, T, T};
      autograd::SavedTensorHooksGuard hooks({[&](const Tensor& t) {
                                               if (t.sizes() == probs_shape) probabilities.push_back(t.dtype());
                                               return t;
                                             },
                                             [](const Tensor& t) { return t; }});
      yp = mlp(attn(xp));
      CHECK(default_generator().offset() == after);
      CHECK(after > state.offset);
    }
    // Composed, the probabilities are kept for backward in the attention's dtype; fused, they are not.
    CHECK(probabilities.empty() == fusion);
    for (DType dt : probabilities) CHECK(dt == (autocast ? kBFloat16 : kFloat32));
    check_close(yp.to(kFloat32), part(yr).to(kFloat32), tol);
    // The same elements dropped (in bfloat16 a row-parallel sum may also cancel to zero).
    if (!autocast) CHECK(yp.eq(0.0).sum().item<int64_t>() == part(yr).eq(0.0).sum().item<int64_t>());
    (yr.to(kFloat32) * cot).sum().backward();
    (yp.to(kFloat32) * part(cot)).sum().backward();
    check_close(xp.grad(), part(xr.grad()), grad_tol);
    check_close(attn.c_proj.weight.grad(), attn_ref.c_proj.weight.grad().narrow(1, r * C / p, C / p), grad_tol);
    check_close(mlp.fc.weight.grad(), mlp_ref.c_fc.weight.grad().narrow(0, r * 4 * C / p, 4 * C / p), grad_tol);
  }
  // In evaluation, no dropout and no draw.
  ParallelMLP mlp(C, 4 * C, comm, "none", false, 0.3);
  mlp.eval();
  const uint64_t before = default_generator().offset();
  Tensor x = kiln::test::sample({2, T, C});
  check_close(mlp(x), mlp.proj(gelu(mlp.fc(x))), {0, 0});
  CHECK(default_generator().offset() == before);
  check_error([&] { ParallelMLP(C, 4 * C, comm, "none", false, 1.0); }, {"ParallelMLP: dropout must be in [0, 1)"});
  check_error([&] { ParallelSelfAttention(C, H, comm, false, -0.1); },
              {"ParallelSelfAttention: dropout must be in [0, 1)"});
}

TEST_CASE("tensor parallel: bad sizes are Errors", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size();
  check_error([&] { ColumnParallelLinear c(4, 4, nullptr); }, {"communicator is null"});
  if (p > 1) {
    check_error([&] { ColumnParallelLinear c(4, 4 * p + 1, comm); }, {"out_features", "multiple of stride 1 x"});
    check_error([&] { RowParallelLinear rl(4 * p + 1, 4, comm); }, {"in_features", "multiple of the"});
    check_error([&] { ParallelSelfAttention a(8 * p, p + 1, comm); }, {"n_head"});
  }
  ColumnParallelLinear c(4, 4 * p, comm);
  check_error([&] { c.load_full(zeros({3, 3})); }, {"the weight must be"});
}

// tests/distributed/test_tensor_parallel.cpp: tensor parallelism (distributed/tensor_parallel/) at
// 1-4 ranks: the conjugate communication functions give exact values forward and backward, and the
// parallel layers built from the same seed compute what nn::Linear, nn::GeluMLP and
// nn::CausalSelfAttention compute on one process, forward, backward and over 20 training steps.
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

// tests/distributed/test_ddp.cpp: DistributedDataParallel against one process doing the same
// arithmetic. Every rank also trains the single-process reference itself (no communication), so
// the comparison needs no second program: N ranks with micro-batch b must match 1 process with
// batch N*b. Two models, both trained with SGD: an MLP, and gpt_char (models/gpt.h).
#include "models/gpt.h"
#include "parity.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_close;
using kiln::test::batch;
using kiln::test::check_error;
using kiln::test::Mlp;

TEST_CASE("ddp: N ranks with micro-batch b match one process with batch N*b over 20 steps", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t b = 6;
  for (bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    manual_seed(11);
    Mlp ref;
    manual_seed(100 + r);  // different on every rank: DDP must broadcast rank 0's
    Mlp local;
    if (r == 0) local.load_state_dict(ref.state_dict());
    // Small buckets: several all-reduces per step, started from backward.
    DistributedDataParallel ddp(local, comm, {.bucket_cap_mb = 0.004, .overlap = overlap});
    for (const auto& [name, t] : ref.named_parameters()) check_close(local.state_dict().at(name), t);
    REQUIRE(ddp.bucket_names().size() >= 3);
    CHECK(ddp.bucket_names().front().front() == "f3.bias");  // reverse order of registration

    optim::SGD opt_ref(ref.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_sgd(local.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 20; ++step) {
      auto [x, y] = batch(step, b * p);
      Tensor loss_ref = nn::cross_entropy(ref(x), y);
      opt_ref.zero_grad();
      loss_ref.backward();
      opt_ref.step();

      Tensor loss = nn::cross_entropy(ddp(x.narrow(0, r * b, b)), y.narrow(0, r * b, b));
      opt_sgd.zero_grad();
      loss.backward();
      opt_sgd.step();
      Tensor mean_loss = loss.detach().clone();
      comm->all_reduce(mean_loss, ReduceOp::Avg);
      check_close(mean_loss, loss_ref.detach(), {1e-6, 1e-7});
      if (overlap) CHECK(ddp.last_stats().buckets_started_during_backward >= 2);
      else CHECK(ddp.last_stats().buckets_started_during_backward == 0);
    }
    for (const auto& [name, t] : ref.named_parameters()) {
      INFO(name);
      check_close(local.state_dict().at(name), t, {1e-6, 1e-6});
    }
  }
}

// SGD, not train_gpt's AdamW: Adam's step is blind to a wrong gradient scale (m / sqrt(v) cancels
// it), so it could not catch a sum where the mean belongs; and it divides by sqrt(v) + eps, which
// multiplies the float32 rounding differences of near-zero gradients by up to lr / eps. The key bias
// has such a gradient (exactly zero in exact arithmetic: softmax ignores a shift common to a row's
// scores). With AdamW (lr 1e-3) the losses still agreed to 1.7e-7, but the parameters differed by
// up to 8e-5 after 20 steps at 2 to 4 ranks.
TEST_CASE("ddp: gpt_char on N ranks with micro-batch b matches one process with batch N*b over 20 steps",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t b = 2, T = 16;  // a small micro-batch of short sequences: fast at 4 ranks on 2 cores
  models::GPTConfig config = models::GPTConfig::gpt_char();
  config.dropout = 0;  // (gpt_char's own is 0) dropout masks would differ between a slice and the whole
  manual_seed(11);
  models::GPT ref(config);
  REQUIRE(ref.num_parameters() == 842496);
  manual_seed(100 + r);  // different on every rank: DDP must broadcast rank 0's
  models::GPT local(config);
  if (r == 0) local.load_state_dict(ref.state_dict());
  // 1 MB buckets: the 3.4 MB of gradients go out in several all-reduces, started from backward.
  DistributedDataParallel ddp(local, comm, {.bucket_cap_mb = 1});
  REQUIRE(ddp.bucket_names().size() >= 3);
  for (const auto& [name, t] : ref.named_parameters()) kiln::test::check_equal(local.state_dict().at(name), t);

  optim::SGD opt_ref(ref.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt_ddp(local.parameters(), {.lr = 0.1, .momentum = 0.9});
  Generator data(7);  // the same token stream on every rank
  for (int step = 0; step < 20; ++step) {
    INFO("step " << step);
    // The whole batch, N*b sequences of T + 1 tokens: inputs the first T, targets the last T.
    Tensor tokens = randint(0, config.vocab_size, {b * p, T + 1}, kInt64, &data);
    Tensor x = tokens.narrow(1, 0, T).contiguous(), y = tokens.narrow(1, 1, T).contiguous();
    Tensor loss_ref = models::GPT::loss(ref(x), y);
    opt_ref.zero_grad();
    loss_ref.backward();
    opt_ref.step();

    Tensor loss = models::GPT::loss(ddp(x.narrow(0, r * b, b)), y.narrow(0, r * b, b));
    opt_ddp.zero_grad();
    loss.backward();
    opt_ddp.step();
    CHECK(ddp.last_stats().buckets_started_during_backward >= 2);
    Tensor mean_loss = loss.detach().clone();  // every rank has b*T tokens: the mean of the means
    comm->all_reduce(mean_loss, ReduceOp::Avg);
    check_close(mean_loss, loss_ref.detach(), {1e-6, 0});  // measured: within 1.7e-7
  }
  // atol for the entries near zero, where a relative bound means nothing: the key bias above, ~1e-10
  // and all rounding. Measured at 1 to 4 ranks: |diff| <= 1.8e-7, within 1e-6 |x| + 9e-8.
  for (const auto& [name, t] : ref.named_parameters()) {
    INFO(name);
    check_close(local.state_dict().at(name), t, {1e-6, 5e-7});
  }
}

TEST_CASE("ddp: checkpointed layers (gradients from inside recomputes) are averaged once, at the end of backward",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size();
  const int64_t b = 6;
  for (bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    manual_seed(13);
    kiln::test::CheckpointedMlp ref, local;
    local.load_state_dict(ref.state_dict());
    DistributedDataParallel ddp(local, comm, {.bucket_cap_mb = 0.004, .overlap = overlap});
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt(local.parameters(), {.lr = 0.1, .momentum = 0.9});
    auto loss_fn = [](nn::Module& m, const Tensor& x, const Tensor& y) { return nn::cross_entropy(m(x), y); };
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      auto [x, y] = batch(step, b * p);
      kiln::test::parity_step(*comm, ref, opt_ref, ddp, opt, x, y, b, loss_fn, {1e-6, 1e-7});
    }
    for (const auto& [name, t] : ref.named_parameters()) {
      INFO(name);
      check_close(local.state_dict().at(name), t, {1e-6, 1e-6});
    }
  }
}

TEST_CASE("ddp: no_sync accumulates locally, the next backward averages the sum", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t b = 4;
  manual_seed(5);
  Mlp ref, local;
  local.load_state_dict(ref.state_dict());
  DistributedDataParallel ddp(local, comm);
  auto [x1, y1] = batch(1, b * p);
  auto [x2, y2] = batch(2, b * p);
  // Reference: the gradient of (mean loss of batch 1) + (mean loss of batch 2).
  (nn::cross_entropy(ref(x1), y1) + nn::cross_entropy(ref(x2), y2)).backward();
  {
    auto guard = ddp.no_sync();
    nn::cross_entropy(ddp(x1.narrow(0, r * b, b)), y1.narrow(0, r * b, b)).backward();
  }
  if (p > 1) {  // after the no_sync backward, each rank holds only its own gradient
    Tensor g = local.f3.weight.grad().clone(), avg = g.clone();
    comm->all_reduce(avg, ReduceOp::Avg);
    Tensor diff = (g - avg).abs().max();
    comm->all_reduce(diff, ReduceOp::Max);
    CHECK(diff.item<float>() > 1e-4f);
  }
  nn::cross_entropy(ddp(x2.narrow(0, r * b, b)), y2.narrow(0, r * b, b)).backward();
  for (const auto& [name, t] : ref.named_parameters()) {
    INFO(name);
    check_close(local.state_dict().at(name), t);
    const auto& params = local.named_parameters();
    for (const auto& [n2, lp] : params) {
      if (n2 == name) check_close(lp.grad(), t.grad(), {1e-5, 1e-6});
    }
  }
}

TEST_CASE("ddp: a parameter without a gradient is an Error naming it, unless expected", "[distributed]") {
  auto comm = init("mpi");
  struct Partial : nn::Module {
    nn::Linear used{4, 3}, unused{4, 3};
    Partial() { register_modules({{"used", used}, {"unused", unused}}); }
    Tensor forward(const Tensor& x) override { return used(x); }
  };
  Partial m1;
  DistributedDataParallel strict(m1, comm);
  check_error([&] { strict(ones({2, 4})).sum().backward(); },
              {"received no gradient", "unused.weight", "unused.bias", "find_unused_parameters = true"});

  Partial m2;
  DistributedDataParallel lenient(m2, comm, {.find_unused_parameters = true});
  lenient(ones({2, 4})).sum().backward();
  // Unused on every rank: no gradient, as PyTorch (it was a zero gradient, which an optimizer with
  // momentum or weight decay then applied).
  CHECK_FALSE(m2.unused.weight.grad().defined());
  check_close(m2.used.bias.grad(), full({3}, 2.0));  // d sum / d bias = batch size, averaged: 2
}

TEST_CASE("ddp: find_unused_parameters keeps a gradient accumulated under no_sync, and averages it", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  struct Two : nn::Module {
    nn::Linear a{4, 3}, b{4, 3};
    bool use_b = true;
    Two() { register_modules({{"a", a}, {"b", b}}); }
    Tensor forward(const Tensor& x) override { return use_b ? a(x) + b(x) : a(x); }
  };
  Two m;
  DistributedDataParallel ddp(m, comm, {.find_unused_parameters = true});
  const Tensor x = full({1, 4}, static_cast<double>(r + 1));
  {
    auto guard = ddp.no_sync();
    ddp(x).sum().backward();  // b.weight's gradient: r + 1 in every element, kept locally
  }
  m.use_b = false;
  ddp(x).sum().backward();  // b unused here: its accumulated gradient is averaged, not replaced by zeros
  check_close(m.b.weight.grad(), full({3, 4}, (p + 1) / 2.0));
  check_close(m.a.weight.grad(), full({3, 4}, 2.0 * (p + 1) / 2.0));  // two backwards of a
  // Used on rank 0 only: the others contribute zeros, and every rank gets the average.
  ddp.zero_grad();
  m.use_b = r == 0;
  ddp(x).sum().backward();
  check_close(m.b.bias.grad(), full({3}, 1.0 / p));
}

TEST_CASE("ddp: ranks whose models differ get an Error naming the difference", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  if (p == 1) return;
  // The same number of elements, another shape: rank 0's values were copied into [3, 2] silently.
  struct Shaped : nn::Module {
    Tensor w;
    explicit Shaped(Shape s) { w = register_parameter("w", zeros(s)); }
    Tensor forward(const Tensor& x) override { return x; }
  };
  Shaped m(r == 0 ? Shape({2, 3}) : Shape({3, 2}));
  check_error([&] { DistributedDataParallel d(m, comm); },
              {"the ranks' models differ", "build the same model on every rank"});
  if (r > 0) check_error([&] { DistributedDataParallel d(m, comm); }, {"rank 0 has 'parameter w: float32 [2, 3]'"});
  else check_error([&] { DistributedDataParallel d(m, comm); }, {"another rank's parameters"});
  // Another parameter frozen on rank 0: the buckets had the same size, laid out differently.
  Mlp frozen;
  (r == 0 ? frozen.f1.bias : frozen.f2.bias).requires_grad_(false);
  check_error([&] { DistributedDataParallel d(frozen, comm); },
              {r == 0 ? "another rank's parameters" : "rank 0 has 'parameter f1.bias: float32 [32] (requires_grad false)'"});
  // The communicator is still in step on every rank.
  Tensor t = full({2}, 1.0);
  comm->all_reduce(t);
  check_close(t, full({2}, static_cast<double>(p)));
}

TEST_CASE("ddp: buffers follow rank 0 and state_dict names carry the module. prefix", "[distributed]") {
  auto comm = init("mpi");
  const int r = comm->rank();
  struct WithNorm : nn::Module {
    nn::BatchNorm1d bn{3};
    WithNorm() { register_modules({{"bn", bn}}); }
    Tensor forward(const Tensor& x) override { return bn(x); }
  };
  WithNorm m;
  DistributedDataParallel ddp(m, comm);
  CHECK(ddp.state_dict().contains("module.bn.weight"));
  // Each rank normalises different data; before every forward rank 0's running stats are broadcast.
  Tensor x = kiln::test::sample({8, 3}, kFloat32, 0.2 + r);
  ddp(x);
  ddp(x);
  Tensor mean0 = m.bn.running_mean.clone();
  comm->broadcast(mean0, 0);
  // After the second forward, every rank's running mean = rank 0's after its first, updated by its own batch.
  Tensor after_first = kiln::test::sample({8, 3}, kFloat32, 0.2).mean({0}) * 0.1;
  Tensor expect = after_first * 0.9 + x.mean({0}) * 0.1;
  check_close(m.bn.running_mean, expect);
}

TEST_CASE("ddp: bad construction is an Error", "[distributed]") {
  Mlp m;
  check_error([&] { DistributedDataParallel d(m, nullptr); }, {"communicator is null"});
  check_error([&] { DistributedDataParallel d(m, init("mpi"), {.bucket_cap_mb = 0}); }, {"bucket_cap_mb must be > 0"});
  // Parameters converted after wrapping: their float64 gradients went through float32 buckets.
  nn::Linear lin(2, 1);
  DistributedDataParallel ddp(lin, init("mpi"));
  lin.to(kFloat64);
  check_error([&] { ddp(ones({1, 2}, kFloat64)).sum().backward(); },
              {"DistributedDataParallel", "float64 gradient", "float32", "before wrapping"});
}

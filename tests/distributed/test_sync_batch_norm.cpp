// tests/distributed/test_sync_batch_norm.cpp: SyncBatchNorm (distributed/ddp/sync_batch_norm.h)
// against one BatchNorm over the whole batch, which every rank also computes itself: outputs, running
// statistics, the input's gradient and its gradient's gradient, the parameters' gradients summed
// over the ranks; uneven batches; with DistributedDataParallel, training equal to one process; the
// Errors. At world size 1 it is an ordinary BatchNorm, which the same comparisons check. The first
// comparison runs on CUDA tensors too ("[gpu]": CTest's `test_distributed [gpu]` on a GPU machine).
#include "parity.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_close;
using kiln::test::check_error;

namespace {

// Rank r's first row and row count of a batch that gives rank r 2 + r rows.
std::pair<int64_t, int64_t> rows_of(int r) { return {2 * r + r * (r - 1) / 2, 2 + r}; }

// The comparison, SyncBatchNorm on `device` (through the MPI backend, which stages CUDA tensors
// through the host) against the reference on the CPU.
void check_against_one_batch_norm(Device device) {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  const int64_t total = rows_of(p).first;  // the rows of ranks 0 .. p - 1
  const auto [first, rows] = rows_of(r);
  nn::BatchNorm2d ref(3, {.momentum = 0.3});
  {
    NoGradGuard no_grad;
    ref.weight.copy_(from_vector<double>({0.5, -1.5, 2.0}).to(kFloat32));
    ref.bias.copy_(from_vector<double>({0.1, 0.2, -0.3}).to(kFloat32));
  }
  ref.to(kFloat64);
  nn::BatchNorm2d bn(3, {.momentum = 0.3});
  bn.to(kFloat64);
  bn.load_state_dict(ref.state_dict());
  bn.to(device);
  CHECK(convert_sync_batchnorm(bn, comm) == 1);
  CHECK(
      bn.to_string().starts_with("SyncBatchNorm(3, eps=1e-05, momentum=0.3, affine=True, track_running_stats=True)\n"));
  const test::Tolerance tol{1e-11, 1e-12};
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    const Tensor x_all = test::sample({total, 3, 4, 5}, kFloat64, 0.3 + step) * (1 + step) + step;
    const Tensor cot_all = test::sample({total, 3, 4, 5}, kFloat64, 1.1 + step);
    // The reference's objective is the sum of every rank's (y * cot).sum(); its gradient's square too.
    Tensor xr = x_all.clone().requires_grad_();
    Tensor y_ref = ref(xr);
    Tensor g_ref = autograd::grad({(y_ref * cot_all).sum()}, {xr}, {}, true, true)[0];
    g_ref.square().sum().backward();
    ref.zero_grad();
    (ref(x_all) * cot_all).sum().backward();  // the parameters' gradients (bn too runs two forwards a step)

    Tensor x = x_all.narrow(0, first, rows).to(device).clone().requires_grad_();
    const Tensor cot = cot_all.narrow(0, first, rows).to(device);
    Tensor y = bn(x);
    CHECK(y.device() == device);
    check_close(y, y_ref.narrow(0, first, rows), tol);
    Tensor g = autograd::grad({(y * cot).sum()}, {x}, {}, true, true)[0];
    check_close(g, g_ref.narrow(0, first, rows), tol);
    g.square().sum().backward();  // every rank runs it: the gradient's statistics are all-reduced
    check_close(x.grad(), xr.grad().narrow(0, first, rows), tol);
    bn.zero_grad();
    (bn(x.detach()) * cot).sum().backward();
    for (const char* name : {"weight", "bias"}) {
      INFO(name);
      Tensor summed = bn.get_parameter(name).grad().clone();
      comm->all_reduce(summed);
      check_close(summed, ref.get_parameter(name).grad(), tol);
    }
    for (const char* name : {"running_mean", "running_var"}) {
      INFO(name);
      check_close(bn.get_buffer(name), ref.get_buffer(name), tol);
    }
  }
  CHECK(bn.num_batches_tracked.item<int64_t>() == 4);
  // Evaluation: the running statistics, no collective.
  bn.eval();
  ref.eval();
  const Tensor x_eval = test::sample({total, 3, 4, 5}, kFloat64, 2.0);
  check_close(bn(x_eval.narrow(0, first, rows).to(device)), ref(x_eval).narrow(0, first, rows), tol);
}

}  // namespace

TEST_CASE("sync batch norm: each rank's part of one BatchNorm over every rank's rows", "[distributed][sync_bn]") {
  check_against_one_batch_norm(Device::cpu());
}

TEST_CASE("sync batch norm on CUDA tensors: each rank's part of one BatchNorm over every rank's rows",
          "[.][gpu][distributed][sync_bn]") {
  check_against_one_batch_norm(Device::cuda(0));
}

TEST_CASE("sync batch norm under DistributedDataParallel trains as one process on the whole batch",
          "[distributed][sync_bn]") {
  auto comm = init("mpi");
  const int p = comm->size();
  const int64_t b = 4;
  struct Net : nn::Module {
    nn::Linear f1{20, 16};
    nn::BatchNorm1d norm{16};
    nn::Linear f2{16, 10};
    Net() { register_modules({{"f1", f1}, {"norm", norm}, {"f2", f2}}); }
    Tensor forward(const Tensor& x) override { return f2(relu(norm(f1(x)))); }
  };
  manual_seed(3);
  Net ref;
  Net local;
  local.load_state_dict(ref.state_dict());
  CHECK(convert_sync_batchnorm(local, comm) == 1);
  DistributedDataParallel ddp(local, comm, {.bucket_cap_mb = 0.001});
  optim::SGD opt_ref(ref.parameters(), {.lr = 0.2, .momentum = 0.9});
  optim::SGD opt(local.parameters(), {.lr = 0.2, .momentum = 0.9});
  const auto loss_fn = [](nn::Module& m, const Tensor& x, const Tensor& y) { return nn::cross_entropy(m(x), y); };
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = test::batch(step, b * p);
    test::parity_step(*comm, ref, opt_ref, ddp, opt, x, y, b, loss_fn, {1e-5, 1e-6});
  }
  for (const auto& [name, t] : ref.state_dict()) {
    INFO(name);
    check_close(local.state_dict().at(name).to(kFloat64), t.to(kFloat64), {1e-4, 1e-5});
  }
}

TEST_CASE("sync batch norm: a rank with other channels is an Error on every rank, not a hang",
          "[distributed][sync_bn][errors]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  nn::BatchNorm1d plain(4);
  check_error([&] { convert_sync_batchnorm(plain, nullptr); }, {"convert_sync_batchnorm", "communicator is null"});
  check_error([&] { SyncBatchNorm(4, nullptr); }, {"SyncBatchNorm", "communicator is null"});
  SyncBatchNorm bn(3, comm);
  check_error([&] { bn(zeros({4})); }, {"SyncBatchNorm", "at least 2 dims"});
  if (p == 1) return;
  const int64_t channels = r == 1 ? 4 : 3;
  SyncBatchNorm odd(channels, comm);
  std::string expected = "have 3, 4";  // rank 1's 4 among the others' 3
  for (int rank = 2; rank < p; ++rank) expected += ", 3";
  const auto forward = [&] { odd(test::sample({2, channels})); };
  check_error(forward, {"SyncBatchNorm", expected + " channels", "must have the same"});
  // One value per channel on each rank is enough: the whole batch has p of them.
  SyncBatchNorm one(3, comm, {.affine = false});
  Tensor y = one(full({1, 3}, static_cast<double>(r)));
  check_close(y, full({1, 3}, (r - (p - 1) / 2.0) / std::sqrt((p * p - 1) / 12.0 + 1e-5)), {1e-5, 1e-6});
}

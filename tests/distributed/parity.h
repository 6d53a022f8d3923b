// tests/distributed/parity.h: what the parity tests share (test_ddp.cpp, test_zero.cpp,
// test_engine.cpp, test_grid.cpp, test_gpt_parallel.cpp): a small MLP and the batches every rank
// draws alike, from which each rank takes its rows while the single-process reference takes them
// all; a directory shared by the ranks; and the grid shapes that n ranks make.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <string>

#include "support.h"

namespace kiln::test {

struct Mlp : nn::Module {
  nn::Linear f1{20, 32}, f2{32, 32}, f3{32, 10};
  Mlp() { register_modules({{"f1", f1}, {"f2", f2}, {"f3", f3}}); }
  Tensor forward(const Tensor& x) override { return f3(relu(f2(relu(f1(x))))); }
};

// Mlp's arithmetic in two checkpointed blocks (nn::CheckpointWrapper): every parameter's gradient
// arrives inside a recompute's backward, which runs within the outer backward, so a reducer's
// end-of-backward callback queued there must still wait for the outer one.
struct CheckpointedMlp : nn::Module {
  nn::CheckpointWrapper a{nn::Sequential{nn::Linear(20, 32), nn::ReLU(), nn::Linear(32, 32), nn::ReLU()}};
  nn::CheckpointWrapper b{nn::Linear(32, 10)};
  CheckpointedMlp() { register_modules({{"a", a}, {"b", b}}); }
  Tensor forward(const Tensor& x) override { return b(a(x)); }
};

// The whole batch of step `step`, the same on every rank: `rows` samples of 20 features, classes 0..9.
inline std::pair<Tensor, Tensor> batch(int step, int64_t rows) {
  Tensor x = sample({rows, 20}, kFloat32, 0.1 * step);
  Tensor y = ((sample({rows}, kFloat64, 1.7 + step) + 2) * 2.4).to(kInt64);
  return {x, y};
}

// One training step of the single-process reference on the whole batch (x, y) and of `local` on
// this rank's b rows of it; checks that the ranks' mean loss equals the reference's. `loss_fn(model,
// x, y)` computes a loss.
template <class LossFn>
void parity_step(distributed::Communicator& comm, nn::Module& ref, optim::Optimizer& opt_ref, nn::Module& local,
                 optim::Optimizer& opt, const Tensor& x, const Tensor& y, int64_t b, LossFn loss_fn, Tolerance tol) {
  Tensor loss_ref = loss_fn(ref, x, y);
  opt_ref.zero_grad();
  loss_ref.backward();
  opt_ref.step();
  const int64_t r = comm.rank();
  Tensor loss = loss_fn(local, x.narrow(0, r * b, b), y.narrow(0, r * b, b));
  opt.zero_grad();
  loss.backward();
  opt.step();
  Tensor mean_loss = loss.detach().clone();
  comm.all_reduce(mean_loss, distributed::ReduceOp::Avg);
  check_close(mean_loss, loss_ref.detach(), tol);
}

// A directory that every rank of `comm` names alike: rank 0 makes /tmp/<stem>-XXXXXX, the others
// receive its name.
inline std::string shared_temp_dir(distributed::Communicator& comm, const std::string& stem) {
  std::string dir;
  if (comm.rank() == 0) {
    std::string tmpl = "/tmp/" + stem + "-XXXXXX";
    KILN_CHECK(tmpl.size() < 64 && mkdtemp(tmpl.data()) != nullptr, "shared_temp_dir: cannot make {}", tmpl);
    dir = tmpl;
  }
  Tensor chars = zeros({64}, kInt32);
  if (comm.rank() == 0) {
    std::vector<int32_t> v(64, 0);
    std::copy(dir.begin(), dir.end(), v.begin());
    chars.copy_(from_vector<int32_t>(v));
  }
  comm.broadcast(chars, 0);
  dir.clear();
  for (int32_t c : chars.to_vector<int32_t>()) {
    if (c == 0) break;
    dir += static_cast<char>(c);
  }
  return dir;
}

// Every (tensor, pipeline) grid that `n` ranks make (the data axis takes the rest).
inline std::vector<distributed::GridSizes> grid_shapes(int n) {
  std::vector<distributed::GridSizes> out;
  for (int t = 1; t <= n; ++t)
    for (int p = 1; t * p <= n; ++p)
      if (n % (t * p) == 0) out.push_back({.tensor = t, .pipeline = p});
  return out;
}

}  // namespace kiln::test

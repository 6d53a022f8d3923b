// dp_bench.h: what the data-parallel benchmarks share (bench_ddp, bench_zero): their model, an MLP
// 784-1024-1024-1024-10 (2.9 M parameters), and the slowest rank's figure.
#pragma once

#include <kiln/kiln.h>

namespace kiln_bench {

struct Mlp784 : kiln::nn::Module {
  kiln::nn::Linear f1{784, 1024}, f2{1024, 1024}, f3{1024, 1024}, f4{1024, 10};
  Mlp784() { register_modules({{"f1", f1}, {"f2", f2}, {"f3", f3}, {"f4", f4}}); }
  kiln::Tensor forward(const kiln::Tensor& x) override { return f4(relu(f3(relu(f2(relu(f1(x))))))); }
};

// The largest value of x over the ranks (every rank calls it).
inline double slowest(kiln::distributed::Communicator& comm, double x) {
  kiln::Tensor t = kiln::full({1}, x, kiln::kFloat64);
  comm.all_reduce(t, kiln::distributed::ReduceOp::Max);
  return t.item<double>();
}

}  // namespace kiln_bench

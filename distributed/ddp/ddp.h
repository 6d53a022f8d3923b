// distributed/ddp/ddp.h: data parallelism (PyTorch's DistributedDataParallel).
//
//   auto comm = distributed::init();
//   Net net;
//   distributed::DistributedDataParallel ddp(net, comm);   // rank 0's parameters everywhere
//   for (auto& [x, y] : loader) {                          // loader: a DistributedSampler's shard
//     Tensor loss = nn::cross_entropy(ddp(x), y);
//     opt.zero_grad();  loss.backward();  opt.step();      // backward returns with averaged gradients
//   }
//
// How: the parameters are grouped into buckets of about bucket_cap_mb, in reverse order of
// registration (the order in which backward produces their gradients). A hook on each parameter
// copies its gradient into its bucket's flat buffer once backward has accumulated it; when the
// bucket's last gradient arrives, the bucket's all-reduce (average) starts at once, asynchronously,
// while backward goes on computing the gradients of earlier layers. At the end of backward (an
// autograd callback) the reducer waits for the buckets and copies the averages back into .grad().
// Buckets start in the same order on every rank, as collectives must.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distributed/comm/communicator.h"
#include "nn/module.h"

namespace kiln::distributed {

struct DDPOptions {
  double bucket_cap_mb = 25;             // PyTorch's default
  // false: a parameter without a gradient in a backward is an Error. true: it contributes the
  // gradient it holds, or zeros; one without a gradient on every rank keeps an undefined grad().
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;         // rank 0's buffers (running statistics) before each forward
  // Start each bucket's all-reduce during backward (true, as PyTorch) or only once backward has
  // finished (false): the switch that measures how much communication the overlap hides.
  bool overlap = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  // Checks that every rank has the same parameters and buffers (names, dtypes, shapes, which
  // require grad), then broadcasts rank 0's parameters and buffers to every rank. `module` must
  // outlive this wrapper; it is registered as the child "module", so state_dict() names read
  // "module.fc1.weight" as in PyTorch (module().state_dict() gives the plain names).
  DistributedDataParallel(nn::Module& module, std::shared_ptr<Communicator> comm, DDPOptions options = {});
  ~DistributedDataParallel() override;
  DistributedDataParallel(DistributedDataParallel&&) = delete;

  Tensor forward(const Tensor& input) override;
  nn::Module& module() { return module_; }
  Communicator& comm() { return *comm_; }

  // While a NoSync guard lives, backward only accumulates gradients locally (gradient
  // accumulation); the first backward after it all-reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // The parameter names of each bucket, in the order the buckets are all-reduced.
  std::vector<std::vector<std::string>> bucket_names() const;

  // Measured in the last synchronised backward.
  struct Stats {
    int64_t buckets_started_during_backward = 0;
    double wait_seconds = 0;  // from the end of backward's computation until every bucket was in
  };
  Stats last_stats() const;

 private:
  struct Reducer;
  nn::Module& module_;
  std::shared_ptr<Communicator> comm_;
  DDPOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

// The ranks must hold the same parameters and buffers (names, dtypes, shapes, which require grad),
// as PyTorch's _verify_param_shape_across_processes: one all-reduce of a hash (same_on_every_rank);
// on a mismatch every rank throws an Error naming the first difference from rank 0's model. `who`
// begins the message ("DistributedDataParallel", "ZeRO"). DistributedDataParallel and
// ZeroOptimizer call it before they broadcast rank 0's weights.
void verify_same_model(Communicator& comm, const nn::Module& module, const char* who);

}  // namespace kiln::distributed

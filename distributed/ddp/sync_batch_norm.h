// distributed/ddp/sync_batch_norm.h: batch normalisation whose training statistics span every rank
// (PyTorch's SyncBatchNorm), for data parallelism with small per-rank batches.
//
//   auto comm = distributed::init();
//   Net net;                                               // its nn::BatchNorm2d layers as they are
//   distributed::convert_sync_batchnorm(net, comm);        // torch.nn.SyncBatchNorm.convert_sync_batchnorm
//   distributed::DistributedDataParallel ddp(net, comm);
//
// or a layer declared as such: `distributed::SyncBatchNorm bn{64, comm};` (any (N, C, *) input).
// While training, each channel is normalised with the mean and biased variance of the whole batch
// (every rank's rows), the running statistics take the whole batch's mean and unbiased variance, and
// backward sends each rank the gradient of the sum of every rank's loss with respect to its own
// input, as PyTorch's: the statistics' gradients are all-reduced too. The weight's and bias's gradients
// stay each rank's own, for DistributedDataParallel to average with the others. In evaluation, or on
// one rank, it is an ordinary BatchNorm. Every rank must run each training forward and backward, with
// inputs of the same channels (their batch sizes may differ).
//
// How: the statistics are two sum all-reduces of C numbers each, the channel sums and then the sums
// of the squares about the global mean (two passes, so the variance does not cancel), through a
// differentiable all-reduce (its backward all-reduces the gradient), and the rest is ordinary ops:
// autograd writes the backward, and differentiates it again.
#pragma once

#include <memory>

#include "distributed/comm/communicator.h"
#include "nn/norm.h"

namespace kiln::distributed {

// Gives every nn::BatchNormBase in module's tree (module itself included) batch statistics shared over
// comm's ranks while training (BatchNormBase::sync); they print as SyncBatchNorm, as PyTorch's, and
// keep their parameters, buffers and state_dict names. Returns how many it converted.
int convert_sync_batchnorm(nn::Module& module, std::shared_ptr<Communicator> comm);

// A BatchNorm over (N, C, *) inputs (at least 2 dims), synchronised over comm while training.
class SyncBatchNorm : public nn::BatchNormBase {
 public:
  SyncBatchNorm(int64_t num_features, std::shared_ptr<Communicator> comm, nn::BatchNormOptions options = {});

 protected:
  void check_input(const Tensor& input) const override;
};

}  // namespace kiln::distributed

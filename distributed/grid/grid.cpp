// distributed/grid/grid.cpp: the data x pipeline x tensor grid of ranks (see grid.h).
#include "distributed/grid/grid.h"

#include <fmt/format.h>

#include <cstdint>

#include "core/grad_mode.h"
#include "ops/ops.h"

namespace kiln::distributed {

ParallelGrid::ParallelGrid(std::shared_ptr<Communicator> world, GridSizes sizes)
    : world_(std::move(world)), sizes_(sizes) {
  KILN_CHECK(world_ != nullptr, "ParallelGrid: the communicator is null; pass distributed::init()");
  // Compared first, so that sizes given differently on some rank are an Error on every rank (the
  // checks below then fail or pass everywhere alike).
  KILN_CHECK(same_on_every_rank(*world_, fmt::format("{} {}", sizes_.tensor, sizes_.pipeline)),
             "ParallelGrid: the ranks were given different grid sizes (this rank: tensor {}, pipeline {}); every "
             "rank must pass the same GridSizes", sizes_.tensor, sizes_.pipeline);
  const int n = world_->size();
  const int64_t cell = int64_t{sizes_.tensor} * sizes_.pipeline;  // in int64: two ints' product overflows int
  KILN_CHECK(sizes_.tensor >= 1 && sizes_.pipeline >= 1 && n % cell == 0,
             "ParallelGrid: {} ranks do not make a grid of tensor {} x pipeline {} x data (the world size must be a "
             "multiple of tensor x pipeline = {})",
             n, sizes_.tensor, sizes_.pipeline, cell);
  data_size_ = static_cast<int>(n / cell);
  const int r = world_->rank();
  tensor_rank_ = r % sizes_.tensor;
  data_rank_ = (r / sizes_.tensor) % data_size_;
  pipeline_rank_ = r / (sizes_.tensor * data_size_);
  // One split per axis: the color is the rank's other two indices, the key its index on the axis.
  tensor_ = world_->split(pipeline_rank_ * data_size_ + data_rank_, tensor_rank_);
  pipeline_ = world_->split(data_rank_ * sizes_.tensor + tensor_rank_, pipeline_rank_);
  data_ = world_->split(pipeline_rank_ * sizes_.tensor + tensor_rank_, data_rank_);
}

void all_reduce_gradients(nn::Module& module, Communicator& comm) {
  const auto params = module.parameters();
  // Which parameters have a gradient, compared across the ranks first: an all-reduce of a gradient
  // that one rank lacks would pair the wrong tensors.
  std::vector<int32_t> have;
  for (const Tensor& p : params) have.push_back(p.grad().defined() ? 1 : 0);
  Tensor lo = from_vector<int32_t>(have).to(comm.device()), hi = lo.clone();
  comm.all_reduce(lo, ReduceOp::Min);
  comm.all_reduce(hi, ReduceOp::Max);
  KILN_CHECK(lo.to_vector<int32_t>() == hi.to_vector<int32_t>(),
             "all_reduce_gradients: some parameters have a gradient on some ranks and none on others; every rank "
             "must run the same forward and backward");
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    if (p.grad().defined()) comm.all_reduce(p.grad(), ReduceOp::Avg);
  }
}

}  // namespace kiln::distributed

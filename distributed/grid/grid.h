// distributed/grid/grid.h: the ranks of a job as a data x pipeline x tensor grid ("3D
// parallelism", Megatron-LM's parallel_state and DeepSpeed's PipeModelDataParallelTopology), with a
// communicator along each axis.
//
//   auto world = distributed::init();                              // 8 ranks
//   distributed::ParallelGrid grid(world, {.tensor = 2, .pipeline = 2});   // data = 8 / 4 = 2
//   MyStage stage(grid.pipeline_rank(), grid.tensor());            // its layers, tensor-parallel
//   distributed::Pipeline pipe(stage, grid.pipeline(), loss_fn);   // stages talk along the pipeline axis
//   ...
//   Tensor loss = pipe.train_batch(x_shard, y_shard);              // each data rank its own shard
//   distributed::all_reduce_gradients(stage, *grid.data());        // average over the data axis
//   opt.step();
//
// Rank order, as Megatron's: the tensor index varies fastest, then the data index, then the
// pipeline stage,
//   rank = (pipeline_rank * data_size + data_rank) * tensor_size + tensor_rank,
// so the ranks of one tensor group (which talk inside every layer) are neighbours, on one node when
// a node holds tensor_size ranks. Each axis's communicator holds the ranks that differ only in that
// index, ordered by it: tensor() the ranks of one layer's slices, pipeline() the stages of one
// pipeline, data() the replicas of one stage's slice.
#pragma once

#include <memory>

#include "distributed/comm/communicator.h"
#include "nn/module.h"

namespace kiln::distributed {

struct GridSizes {
  int tensor = 1;    // ranks that split each layer
  int pipeline = 1;  // stages
  // the data-parallel size is the rest: world size / (tensor x pipeline)
};

class ParallelGrid {
 public:
  // Every rank of `world` calls it (three splits).
  ParallelGrid(std::shared_ptr<Communicator> world, GridSizes sizes);

  int tensor_size() const { return sizes_.tensor; }
  int pipeline_size() const { return sizes_.pipeline; }
  int data_size() const { return data_size_; }
  int tensor_rank() const { return tensor_rank_; }
  int pipeline_rank() const { return pipeline_rank_; }
  int data_rank() const { return data_rank_; }

  const std::shared_ptr<Communicator>& tensor() const { return tensor_; }
  const std::shared_ptr<Communicator>& pipeline() const { return pipeline_; }
  const std::shared_ptr<Communicator>& data() const { return data_; }
  const std::shared_ptr<Communicator>& world() const { return world_; }

 private:
  std::shared_ptr<Communicator> world_, tensor_, pipeline_, data_;
  GridSizes sizes_;
  int data_size_ = 1, tensor_rank_ = 0, pipeline_rank_ = 0, data_rank_ = 0;
};

// Averages the gradient of every parameter of `module` that has one over the ranks of `comm` (one
// all-reduce per parameter, in registration order): the data-parallel step of a pipeline, after
// all of its micro-batches (DeepSpeed's pipeline engine reduces its gradients the same way). Every
// rank of comm calls it with the same model; a parameter without a gradient on every rank is left
// alone, and one with a gradient on only some ranks is an Error.
void all_reduce_gradients(nn::Module& module, Communicator& comm);

}  // namespace kiln::distributed

// distributed/algorithms/ring.h: the ring collectives, written on send and recv, for study.
//
// The p ranks stand in a ring; each sends only to its right neighbour (rank + 1) and receives only
// from its left one (rank - 1). The tensor is cut into p chunks. Then
//   reduce-scatter: p - 1 steps; in each, every rank passes one partially reduced chunk to the right
//                   and adds the chunk arriving from the left into its own copy. At the end rank r
//                   holds chunk r reduced over all ranks.
//   all-gather:     p - 1 steps; in each, every rank passes on the last finished chunk it received.
//   all-reduce:     reduce-scatter, then all-gather.
// Every rank sends and receives (p - 1) / p of the tensor in each phase, whatever p is: that is
// why the ring is bandwidth-optimal, and why all-reduce costs twice a reduce-scatter. The cost
// model (alpha-beta) is in docs/collectives.md. These functions compute what the communicator's
// native collectives compute, with the same arguments; tests hold them to bit equality on integers.
#pragma once

#include "distributed/comm/communicator.h"

namespace kiln::distributed::ring {

// output = op over ranks of input's slice number rank() (input has size() x output.numel()).
void reduce_scatter(Communicator& comm, const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum);
// output (size() x input.numel()) = the inputs of ranks 0, 1, ... one after the other.
void all_gather(Communicator& comm, const Tensor& output, const Tensor& input);
// t = op(t of every rank). Any number of elements: the chunks differ by at most one element.
void all_reduce(Communicator& comm, const Tensor& t, ReduceOp op = ReduceOp::Sum);

}  // namespace kiln::distributed::ring

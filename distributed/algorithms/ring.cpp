// distributed/algorithms/ring.cpp: ring reduce-scatter, all-gather and all-reduce on send/recv.
//
// The chunk schedule, for p ranks, rank r, chunks numbered mod p:
//
//   reduce-scatter, step s = 0 .. p-2:  send chunk r-1-s to the right,
//                                       receive chunk r-2-s from the left and reduce it into ours.
//     Chunk c is first sent by rank c+1 (where r-1-0 = c) holding that rank's contribution; each
//     step carries it one rank to the right, where that rank's contribution is added. After p-1
//     hops it holds all p contributions and sits at rank c+1+(p-1) = c (mod p): rank r ends up
//     owning chunk r, as reduce_scatter promises.
//
//   all-gather, step s = 0 .. p-2:      send chunk r-s to the right,
//                                       receive chunk r-1-s from the left (a finished chunk).
//     Rank r starts with chunk r complete and after p-1 steps has all of them.
//
//   p = 4, rank 1, reduce-scatter: sends chunks 0, 3, 2 and reduces into chunks 3, 2, 1 (the last,
//   its own, is then complete); all-gather: sends chunks 1, 0, 3 and receives chunks 0, 3, 2.
//
// Each step posts its send and its receive together (both asynchronous), so that no rank waits for
// its neighbour to be ready: all p transfers of a step run at once.
#include "distributed/algorithms/ring.h"

#include <vector>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace kiln::distributed::ring {
namespace {

int mod(int a, int p) { return ((a % p) + p) % p; }

// Chunk boundaries of n elements over p ranks: the first n % p chunks have one element more.
std::vector<int64_t> bounds(int64_t n, int p) {
  std::vector<int64_t> b(static_cast<size_t>(p) + 1, 0);
  for (int i = 0; i < p; ++i) b[i + 1] = b[i] + n / p + (i < n % p ? 1 : 0);
  return b;
}

Tensor chunk_of(const Tensor& flat, const std::vector<int64_t>& b, int i) {
  return flat.narrow(0, b[i], b[i + 1] - b[i]);
}

void reduce_into(Tensor dst, const Tensor& incoming, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: dst.add_(incoming); break;
    case ReduceOp::Max: dst.copy_(maximum(dst, incoming)); break;
    case ReduceOp::Min: dst.copy_(minimum(dst, incoming)); break;
  }
}

// Step s: receive `in` from the left, send `out` to the right, both at once. Even ranks post the
// send first and odd ranks the receive: on MPI the order does not matter (both are asynchronous),
// but NCCL runs a communicator's sends and receives one after the other, and if every rank
// received first, every rank would wait for a send queued behind its own receive.
void exchange(Communicator& comm, const Tensor& out, const Tensor& in, int step) {
  const int p = comm.size(), r = comm.rank();
  Work got, sent;
  if (r % 2 == 0) {
    sent = comm.send(out, mod(r + 1, p), step, /*async_op=*/true);
    got = comm.recv(in, mod(r - 1, p), step, /*async_op=*/true);
  } else {
    got = comm.recv(in, mod(r - 1, p), step, /*async_op=*/true);
    sent = comm.send(out, mod(r + 1, p), step, /*async_op=*/true);
  }
  sent.wait();
  got.wait();
}

// After it, chunk rank() of flat holds the reduction over all ranks.
void reduce_scatter_phase(Communicator& comm, const Tensor& flat, const std::vector<int64_t>& b, ReduceOp op) {
  const int p = comm.size(), r = comm.rank();
  Tensor incoming = empty({b[1] - b[0]}, TensorOptions(flat.dtype()).device(flat.device()));  // the largest chunk
  for (int s = 0; s + 1 < p; ++s) {
    const int send_c = mod(r - 1 - s, p), recv_c = mod(r - 2 - s, p);
    Tensor in = incoming.narrow(0, 0, b[recv_c + 1] - b[recv_c]);
    exchange(comm, chunk_of(flat, b, send_c), in, s);
    reduce_into(chunk_of(flat, b, recv_c), in, op);
  }
}

// Before it, each rank's chunk rank() of flat is complete; after it, every chunk is, everywhere.
void all_gather_phase(Communicator& comm, const Tensor& flat, const std::vector<int64_t>& b) {
  const int p = comm.size(), r = comm.rank();
  for (int s = 0; s + 1 < p; ++s) {
    exchange(comm, chunk_of(flat, b, mod(r - s, p)), chunk_of(flat, b, mod(r - 1 - s, p)), s);
  }
}

void check(const char* op, const Tensor& t) {
  KILN_CHECK(t.defined() && t.is_contiguous(), "ring::{}: the tensors must be defined and contiguous", op);
}

void check_written(const char* op, const Tensor& t) {  // as the native collectives, before the first send
  check(op, t);
  if (t.is_inference() && !InferenceMode::is_enabled()) throw_inference_write(fmt::format("ring::{}", op).c_str());
}

void check_op(const char* name, const Tensor& t, ReduceOp op) {  // as the native collectives
  KILN_CHECK(op != ReduceOp::Avg || is_floating(t.dtype()),
             "ring::{}: ReduceOp::Avg needs a floating dtype, not {}; use Sum and divide", name, dtype_name(t.dtype()));
}

}  // namespace

void reduce_scatter(Communicator& comm, const Tensor& output, const Tensor& input, ReduceOp op) {
  check_written("reduce_scatter", output);
  check("reduce_scatter", input);
  check_op("reduce_scatter", input, op);
  const int p = comm.size(), r = comm.rank();
  KILN_CHECK(input.numel() == output.numel() * p && input.dtype() == output.dtype(),
             "ring::reduce_scatter: the input must have size() x output.numel() = {} elements of the output's dtype, "
             "not {} of {}",
             output.numel() * p, input.numel(), dtype_name(input.dtype()));
  // The same schedule as reduce_scatter_phase, out of place: the input is only read. What a rank
  // sends at step s + 1 is what it reduced at step s (its chunk plus the partial sum that came in),
  // so two chunk-sized buffers take turns, and the last step reduces straight into the output.
  Tensor in = input.flatten();
  auto b = bounds(in.numel(), p);
  Tensor out = output.view({-1});
  const TensorOptions like = TensorOptions(in.dtype()).device(in.device());
  Tensor incoming = empty({out.numel()}, like), buffers[2] = {empty({out.numel()}, like), empty({out.numel()}, like)};
  Tensor sending = chunk_of(in, b, mod(r - 1, p));
  if (p == 1) out.copy_(in);
  for (int s = 0; s + 1 < p; ++s) {
    const int recv_c = mod(r - 2 - s, p);
    exchange(comm, sending, incoming, s);
    Tensor reduced = s + 2 == p ? out : buffers[s % 2];
    reduced.copy_(chunk_of(in, b, recv_c));
    reduce_into(reduced, incoming, op);
    sending = reduced;
  }
  if (op == ReduceOp::Avg) out.div_(p);
}

void all_gather(Communicator& comm, const Tensor& output, const Tensor& input) {
  check_written("all_gather", output);
  check("all_gather", input);
  const int p = comm.size();
  KILN_CHECK(output.numel() == input.numel() * p && input.dtype() == output.dtype(),
             "ring::all_gather: the output must have size() x input.numel() = {} elements of the input's dtype, "
             "not {} of {}",
             input.numel() * p, output.numel(), dtype_name(output.dtype()));
  Tensor flat = output.flatten();  // a view: the ring fills output in place
  auto b = bounds(flat.numel(), p);
  chunk_of(flat, b, comm.rank()).copy_(input.flatten());
  all_gather_phase(comm, flat, b);
}

void all_reduce(Communicator& comm, const Tensor& t, ReduceOp op) {
  check_written("all_reduce", t);
  check_op("all_reduce", t, op);
  const int p = comm.size();
  Tensor flat = t.flatten();
  auto b = bounds(flat.numel(), p);
  reduce_scatter_phase(comm, flat, b, op);
  if (op == ReduceOp::Avg) chunk_of(flat, b, comm.rank()).div_(p);  // divide p-th of the work, before sharing
  all_gather_phase(comm, flat, b);
}

}  // namespace kiln::distributed::ring

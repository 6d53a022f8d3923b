// distributed/comm/work.h: what a backend shares with a Work handle (internal to distributed/comm).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "distributed/comm/communicator.h"

namespace kiln::distributed {

struct Work::State {
  explicit State(std::string what) : what(std::move(what)) {}
  const std::string what;  // "all_reduce #3 (float32, 1024 elements, sum)"

  // Called once by the backend when the operation has finished (error: why it failed).
  void complete(std::exception_ptr error = nullptr);

  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  // Run once by the first wait(), on the waiting thread: copies staged results back to the
  // device tensors (CUDA tensors on the MPI backend).
  std::function<void()> finisher;

  // Set by a backend whose operations finish on a device stream (NCCL), before the Work is handed
  // out; see Note [NCCL Work] in nccl.cpp. wait() then rethrows an error already known and
  // otherwise calls stream_wait, which orders the caller's current stream after the operation
  // without blocking the host; is_completed() is done || query().
  std::function<void()> stream_wait;
  std::function<bool()> query;

  // Blocks until done, counted in blocked_waiters() and waking the backend's wait listener.
  void wait_done();
};

// The threads of this process blocked in Work::wait() on an operation not yet finished. A backend
// whose progress thread polls (MPI) polls hard while this is non-zero, since somebody waits for the
// transfer, and gently otherwise, since the operations then run behind computation that needs the
// cores more than the transfer needs the polls (see Note [two-speed polling] in mpi.cpp).
std::atomic<int>& blocked_waiters();
// Called by a thread that starts to block in Work::wait(), after it counted itself: a backend whose
// progress thread sleeps between polls registers one that wakes that thread (MPI). nullptr: none.
void set_wait_listener(void (*listener)());

// A CPU tensor standing in for t: t itself on the CPU, else a pinned host copy (of t's values when
// copy_in) whose contents go back into t when the Work is waited on (when copy_out), queued on the
// waiting thread's current stream.
struct Staging {
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (device tensor, host tensor)
  Tensor host(const Tensor& t, bool copy_in, bool copy_out);
  std::function<void()> finisher();  // empty when nothing was staged
};

// The signature check, shared by the backends: before a collective the ranks all-reduce (MAX) its
// signature followed by its negation; equal maxima of both mean every rank asked for the same
// thing (see mpi.cpp).
enum OpCode : int64_t { kAllReduce = 1, kBroadcast, kReduce, kAllGather, kAllGatherTensor, kReduceScatter,
                        kReduceScatterTensor, kBarrier, kSplit, kAllToAll };
constexpr int kSignatureLen = 7;  // sequence number, op, dtype, count, root, reduce op, sizes hash
using Signature = std::array<int64_t, kSignatureLen>;
// sizes: the per-rank element counts of the ops whose sizes may differ by rank (then count is 0).
Signature make_signature(uint64_t seq, OpCode code, const Tensor& t, int root, ReduceOp op,
                         const std::vector<int64_t>& sizes);
// What the ranks all-reduce (MAX): the signature, then its negation.
std::array<int64_t, 2 * kSignatureLen> signature_check_values(const Signature& sig);
// maxima: the all-reduced (MAX) 2 x kSignatureLen values. Throws the Error naming every field on
// which the ranks disagree, with `what` (the op's description).
void check_signature(const std::string& what, const Signature& mine, const int64_t* maxima);
// all_to_all's sizes pair up across ranks, not per rank, so its signature leaves them out and a
// second MAX all-reduce, once the signatures agree, compares them: 2 N^2 values for N ranks, cell
// i N + r of the first half what rank i sends to rank r (written by rank i), of the second half what
// rank r expects from rank i (written by rank r); every other rank puts a floor below every count.
// send[r] and recv[s]: this rank's element counts to rank r and from rank s. Above
// kMaxPairCheckRanks ranks (2 N^2 values would outweigh most messages) it returns no values: only
// the signature is checked. (all_to_all's signature has no element count.)
inline constexpr int kMaxPairCheckRanks = 256;
std::vector<int64_t> pair_check_values(int rank, int size, const std::vector<int64_t>& send,
                                       const std::vector<int64_t>& recv);
// maxima: the all-reduced 2 N^2 values. Throws the Error naming the first pair of ranks whose
// sizes differ.
void check_pairs(const std::string& what, int size, const int64_t* maxima);

// The pieces of an operation's description and checks, shared by the backends.
std::string describe_op(const char* op, uint64_t number, const Tensor& t, const std::string& extra);
void check_tensor(const char* op, const Tensor& t, const Tensor& like = {});
// A tensor the op writes in place (all_reduce's, broadcast's and reduce's tensor on every rank, as
// torch's c10d ops declare them, all_gather's outputs, reduce_scatter's output, recv's tensor): an
// inference tensor is writable only in inference mode, as for every in-place op.
void check_written(const char* op, const Tensor& t);
// Whether the bytes of two contiguous tensors on one device overlap: MPI and NCCL take only the
// in-place case of an overlap (this rank's slice), so the backends copy an input for any other.
bool bytes_overlap(const Tensor& a, const Tensor& b);
// A blocking send to this rank itself can only complete if the matching recv was posted first,
// which it cannot be: an Error, not a hang until the timeout.
void check_send_dst(int dst, int rank, bool async_op);
// The uneven collectives: `list` has one tensor per rank (all_gather's outputs, reduce_scatter's
// inputs), of mine's dtype and device, and entry `rank` has as many elements as `mine` (this rank's
// input, or output). Returns the per-rank element counts.
std::vector<int64_t> per_rank_counts(const char* op, const std::vector<Tensor>& list, const char* list_name,
                                     const Tensor& mine, const char* mine_name, int rank, int size);
// all_to_all's lists: one output and one input per rank, every tensor of inputs[0]'s dtype and
// device and contiguous, the outputs writable, and this rank's own pair of one size. Returns the
// element counts sent to each rank and received from each.
struct PairCounts {
  std::vector<int64_t> send, recv;
  int64_t sent = 0, received = 0;  // their sums
};
// "all_to_all #3 (float32, 12 elements out, 9 in)"
std::string describe_all_to_all(uint64_t number, DType dtype, const PairCounts& counts);
PairCounts all_to_all_counts(const char* op, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                             int rank, int size);

}  // namespace kiln::distributed

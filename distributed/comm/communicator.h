// distributed/comm/communicator.h: a group of processes that exchange tensors (PyTorch's
// ProcessGroup, DESIGN.md §6).
//
//   auto comm = distributed::init();            // the job's ranks, from mpirun / srun / kiln-run
//   Tensor t = full({4}, comm->rank());
//   comm->all_reduce(t);                        // every rank now holds 0 + 1 + ... + (size - 1)
//   Work w = comm->all_reduce(g, ReduceOp::Avg, /*async_op=*/true);  // returns at once
//   ...                                         // compute while it runs
//   w.wait();
//
// Every operation is in place on the tensors it is given, as in torch.distributed, and is called by
// every rank of the communicator in the same order (send and recv by the two ranks concerned).
// Collectives are numbered per communicator (the sequence number in error messages). Before each
// collective the ranks compare what they were asked to do (op, dtype, sizes, root, sequence
// number); a disagreement is an Error on every rank, not a hang. An operation that does not finish
// within the timeout stops the whole job with a message naming the rank, the op and its number.
// The only thing this layer knows is core/: it must not include nn or optim (DESIGN.md §1).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace kiln::distributed {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

// A handle on an operation in flight (PyTorch's Work). Copies share the operation.
class Work {
 public:
  struct State;
  Work() = default;  // a finished operation with nothing to do
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Blocks until the operation is complete; rethrows its Error. Staged results (CUDA tensors on
  // the MPI backend) are copied back into their tensors here, queued on the current CUDA stream
  // (so kernels queued after wait(), and copies to the host, see them). On the NCCL backend it does not block the host
  // (PyTorch's semantics): it makes the current CUDA stream wait for the operation, so kernels
  // queued after it, and copies to the host, see the result; an Error already known is rethrown.
  void wait() const;
  // True once the operation is complete (successfully or not); never blocks.
  bool is_completed() const;
  bool test() const { return is_completed(); }
  // "all_reduce #3 (float32, 1024 elements, sum)"
  std::string describe() const;

 private:
  std::shared_ptr<State> state_;
};

struct CommOptions {
  // How long one operation may take before the job is stopped. The environment variable
  // KILN_COMM_TIMEOUT (seconds, at least 0.001) overrides it; more than a year counts as a year.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Compare op, dtype, sizes and sequence number across ranks before each collective (one small
  // extra all-reduce; on NCCL an MPI one, which the caller's thread waits for). Turn off only to
  // measure the collective alone. split is checked either way.
  bool check_collectives = true;
  // On a timeout, print the Error and abort every rank of the job (PyTorch's NCCL async error
  // handling). false: fail the Work with the Error instead; the communicator is then unusable.
  bool abort_on_timeout = true;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl"
  // Where the small tensors that code above a communicator exchanges (flags, norms, headers) must
  // live: its CUDA device for NCCL, which carries only tensors on it; the CPU for MPI.
  virtual Device device() const { return Device::cpu(); }
  // Whether send and recv run one after the other in call order (NCCL: on the communicator's
  // stream), so that a recv posted early blocks the sends called after it until it is matched;
  // MPI posts them at once and matches them by source and tag. Code that posts receives ahead of
  // need (Pipeline) asks this.
  virtual bool p2p_in_call_order() const { return false; }

  // With async_op = false each call returns once its operation is complete (the returned Work is
  // then already complete; on NCCL, complete as the current CUDA stream sees it: wait() was called);
  // with true it returns at once and Work::wait() completes it. On NCCL, send and recv run in call
  // order on the communicator's stream: in a ring, alternate their order (even ranks send first).

  // t = op(t of every rank). Avg is Sum divided by size() (floating dtypes only).
  virtual Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum, bool async_op = false) = 0;
  // t of rank `src` copied into t of every rank.
  virtual Work broadcast(const Tensor& t, int src, bool async_op = false) = 0;
  // Rank `dst`'s t = op(t of every rank); the other ranks' t are left as they were.
  virtual Work reduce(const Tensor& t, int dst, ReduceOp op = ReduceOp::Sum, bool async_op = false) = 0;
  // outputs[r] = rank r's input, on every rank. The sizes may differ from rank to rank; every rank
  // passes the same list of shapes.
  virtual Work all_gather(const std::vector<Tensor>& outputs, const Tensor& input, bool async_op = false) = 0;
  // output (size() x input.numel() elements) = the inputs of ranks 0, 1, ... one after the other.
  // input may be this rank's slice of output (in place, as ZeRO uses it); an input that overlaps
  // output elsewhere is copied first.
  virtual Work all_gather_into_tensor(const Tensor& output, const Tensor& input, bool async_op = false) = 0;
  // output = op over ranks of their inputs[rank()]; inputs[r] and rank r's output have the same
  // number of elements, which may differ from rank to rank.
  virtual Work reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::Sum,
                              bool async_op = false) = 0;
  // output = op over ranks of their input's slice number rank() (input has size() x output.numel()).
  virtual Work reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                                     bool async_op = false) = 0;
  // outputs[r] = rank r's inputs[rank()], on every rank: inputs[r] goes to rank r (MPI_Alltoallv,
  // torch.distributed.all_to_all). The sizes may differ from pair to pair: rank i's inputs[r] and
  // rank r's outputs[i] have the same number of elements (checked with check_collectives). One
  // dtype and device for every tensor.
  virtual Work all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                          bool async_op = false) = 0;
  // Point to point; the receiver's tensor has the sender's dtype and number of elements. On MPI a
  // size that differs is an Error (NCCL does not check it); a dtype that differs with the same
  // bytes is not checked on either (the bytes are read as the receiver's dtype, as in
  // torch.distributed): send a header first where they may differ, as Pipeline does.
  virtual Work send(const Tensor& t, int dst, int tag = 0, bool async_op = false) = 0;
  virtual Work recv(const Tensor& t, int src, int tag = 0, bool async_op = false) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // A new communicator of the ranks that pass the same color, ordered by key (then by rank), as
  // MPI_Comm_split. Every rank calls it; a rank that passes a negative color gets nullptr.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // The number of collectives (barrier and split included) this communicator has started; the
  // next one's number is this + 1. send and recv are numbered apart.
  virtual uint64_t sequence_number() const = 0;
};

// Where this process sits in the job, as the launcher's environment says, first found of: Open
// MPI's mpirun (OMPI_COMM_WORLD_*), PMI launchers such as MPICH's mpiexec (PMI_RANK, PMI_SIZE),
// Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and SLURM_STEP_TASKS_PER_NODE at
// SLURM_NODEID) or torchrun (RANK, WORLD_SIZE, LOCAL_RANK); rank 0 of 1 without any (a Slurm batch
// script itself included). Half of mpirun's or PMI's rank-and-size pair is an Error.
struct WorldInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks of this node: picks the GPU, cuda(local_rank)
  int local_size = 1;
  std::string launcher = "none";  // "mpirun", "srun", "pmi", "torchrun" or "none"
};
WorldInfo world_info();
// The same, read from `getenv` (name -> value, or nullptr when unset) instead of the process's
// environment: for tests and tools.
WorldInfo world_info(const std::function<const char*(const char*)>& getenv);

// The communicator of every rank of the job ("mpi"; "nccl" for CUDA tensors where built with
// CUDA). MPI is initialised on first use and finalised at exit; the same communicator is returned
// on each call with the same backend, with the options of the first call.
std::shared_ptr<Communicator> init(const std::string& backend = "mpi", const CommOptions& options = {});
// Whether this build has the backend ("mpi" needs Open MPI, "nccl" CUDA and NCCL).
bool is_available(const std::string& backend);

// Stops every rank of the job at once with `exit_code` (MPI_Abort), after flushing stdout and
// stderr: for a rank that fails on its own (a bad flag, an unwritable file), so that the other
// ranks do not wait in their next collective until the timeout, and this one does not wait for
// them in MPI_Finalize. In a process that has not joined the job through init, it exits this
// process with exit_code, and the launcher stops the rest.
[[noreturn]] void abort_job(int exit_code);

// Whether every rank of `comm` passed the same bytes: one all-reduce (MAX) of a hash of them and
// of its negation, the trick of the collectives' own check. Every rank calls it, and all get the
// same answer (DistributedDataParallel compares the ranks' models with it).
bool same_on_every_rank(Communicator& comm, std::string_view bytes);

}  // namespace kiln::distributed

// distributed/comm/comms_logger.h: DeepSpeed's communication logger ("comms_logger" in
// ds_config.json): how long each collective took, its message size and its bandwidth, as a table.
//
//   auto logger = std::make_shared<distributed::CommsLogger>(distributed::CommsLoggerOptions{.enabled = true});
//   auto comm = distributed::log_communication(distributed::init(), logger);
//   ... train with comm (DistributedDataParallel, ZeroOptimizer, ...) ...
//   if (comm->rank() == 0) fmt::print("{}", logger->summary());   // DeepSpeed's log_summary()
//
// The engine does this itself when its config enables "comms_logger" (Engine::log_summary).
//
// As DeepSpeed's logger, every logged operation is made blocking: the call returns once the
// operation is complete (and, for a CUDA tensor, once its device is idle), so that the time is the
// operation's and not its launch's. That costs the overlap of communication with computation that
// asynchronous operations buy (DDP's and ZeRO's buckets): log to study, not in the run you time.
// The time is from the call to the completion on this rank, so it includes the wait for the
// slowest rank to arrive. Asynchronous send and recv are the exception: a pipeline posts its
// receives before the matching sends, and blocking on one would deadlock the schedule, so they are
// forwarded untimed (blocking send and recv are timed).
//
// The figures are DeepSpeed's (its calc_bw_log, after nccl-tests' PERFORMANCE.md), with n the
// communicator's size (DeepSpeed takes the world's, which differs on a sub-group):
//   all_reduce:                      algbw = 2 S / t     busbw = S / t x 2 (n - 1) / n
//   all_gather*, reduce_scatter*:    algbw = n S / t     busbw = n S / t x (n - 1) / n
//   all_to_all:                      algbw = S / t       busbw = S / t x (n - 1) / n
//   broadcast, reduce, send, recv:   algbw = busbw = S / t
//   barrier:                         S = 0
// where S is the message size: the tensor of all_reduce, broadcast, reduce, send and recv; this
// rank's piece of all_gather (its input) and of reduce_scatter (its output); the uneven ops take
// the mean piece; all_to_all, all that this rank sends (DeepSpeed's all_to_all_single rule). In Gbps (10^9 bits per second), as DeepSpeed prints them.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/comm/communicator.h"

namespace kiln::distributed {

// The "comms_logger" section's keys, with DeepSpeed's defaults.
struct CommsLoggerOptions {
  bool enabled = false;
  bool verbose = false;   // print each logged operation as it completes (rank 0 of the job)
  bool prof_all = true;   // log every operation; false: only those named in prof_ops
  bool debug = false;     // name each record after its caller too: "all_reduce | [Caller: DistributedDataParallel]"
  std::vector<std::string> prof_ops = {};  // "all_reduce", "all_gather", "reduce_scatter", "broadcast", ...
};

// The names an operation is logged under, as DeepSpeed's (torch.distributed's function names).
// Kiln's list forms (all_gather's outputs, reduce_scatter's inputs) are "all_gather" and
// "reduce_scatter"; the flat ones "all_gather_into_tensor" and "reduce_scatter_tensor".
inline constexpr const char* kCommOpNames[] = {"all_reduce", "broadcast", "reduce", "all_gather",
                                               "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                                               "all_to_all", "send", "recv", "barrier"};

class CommsLogger {
 public:
  // prints: whether verbose output goes to stdout here (the job's rank 0 only, as DeepSpeed's
  // log_dist(ranks=[0])).
  explicit CommsLogger(CommsLoggerOptions options, bool prints = true);

  bool enabled() const { return options_.enabled; }
  bool debug() const { return options_.debug; }
  // Whether an operation of this name is timed now.
  bool profiles(std::string_view op) const;
  // DeepSpeed's switches: every operation, or some by name, from now on.
  void start_profiling_comms();
  void stop_profiling_comms();
  void start_profiling_op(const std::vector<std::string>& ops);
  void stop_profiling_op(const std::vector<std::string>& ops);

  // One completed operation: op is its kCommOpNames name, record the name it is filed under (op,
  // or with debug its caller too), msg_bytes as above, n the communicator's size.
  void append(std::string_view op, const std::string& record, double latency_ms, int64_t msg_bytes, int n);

  struct Entry {
    int64_t count = 0;
    std::vector<double> latency_ms, algbw_gbps, busbw_gbps;  // one per operation
  };
  // record name -> message size in bytes -> its operations, records in the order first logged.
  std::vector<std::pair<std::string, std::map<int64_t, Entry>>> records() const;
  // DeepSpeed's log_all table: per record and message size, the count, total latency, and the
  // 10%-trimmed means of the latency, algbw and busbw. "" when nothing was logged.
  std::string summary() const;
  // DeepSpeed's "breakdown with straggler effect" (log_summary(show_straggler=True)): each logged
  // operation's latency split into the part every rank spent (the smallest over the ranks of
  // `comm`: the transfer itself, timed on the rank that arrived last) and the rest (this rank's
  // wait for a later one), per record and message size, totals and trimmed means. A collective:
  // every rank of `comm` calls it, having logged the same operations in the same order (else an
  // Error on every rank, as when pipeline stages logged different sends); a communicator that
  // logs to this logger is looked through, so that the comparison itself is not logged.
  std::string straggler_summary(Communicator& comm) const;
  void reset();

 private:
  CommsLoggerOptions options_;
  bool prints_;
  mutable std::mutex mutex_;  // operations may complete on hook threads
  std::vector<std::pair<std::string, std::map<int64_t, Entry>>> records_;
};

// DeepSpeed's calc_bw_log (see above): algbw and busbw in Gbps of one operation.
struct CommBandwidth {
  double algbw_gbps, busbw_gbps;
};
CommBandwidth comm_bandwidth(std::string_view op, double msg_bytes, double latency_ms, int n);
// DeepSpeed's convert_size: 4096 -> "4.0 KB", 1536 -> "1.5 KB", 0 -> "0B" (powers of 1024).
std::string convert_size(int64_t bytes);
// The mean of `values` without the round(n x trim) smallest and largest (DeepSpeed's trim_mean,
// rounding half to even as Python's round); 0 for none.
double trim_mean(std::vector<double> values, double trim);

// A communicator that forwards every operation to `inner` and has `logger` time those it profiles
// (see above); split() gives sub-communicators that log to the same logger. With a logger that is
// not enabled, inner itself is returned.
std::shared_ptr<Communicator> log_communication(std::shared_ptr<Communicator> inner,
                                                std::shared_ptr<CommsLogger> logger);

// Names the code that calls communication on this thread while it lives, for the records of a
// logger with debug on (DeepSpeed names the calling Python function): "DistributedDataParallel",
// "ZeRO gradients", ... Nested scopes: the innermost names.
class CommCaller {
 public:
  explicit CommCaller(const char* name);
  ~CommCaller();
  CommCaller(const CommCaller&) = delete;
  CommCaller& operator=(const CommCaller&) = delete;
  static const char* current();  // nullptr outside any scope

 private:
  const char* previous_;
};

}  // namespace kiln::distributed

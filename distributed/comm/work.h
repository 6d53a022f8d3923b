// distributed/comm/work.h: what a backend shares with a Work handle (internal to distributed/comm).
#pragma once

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
};

// A CPU tensor standing in for t: t itself on the CPU, else a host copy (of t's values when
// copy_in) whose contents go back into t when the Work is waited on (when copy_out).
struct Staging {
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (device tensor, host tensor)
  Tensor host(const Tensor& t, bool copy_in, bool copy_out);
  std::function<void()> finisher();  // empty when nothing was staged
};

// The pieces of an operation's description and checks, shared by the backends.
std::string describe_op(const char* op, uint64_t number, const Tensor& t, const std::string& extra);
void check_tensor(const char* op, const Tensor& t, const Tensor& like = {});

}  // namespace kiln::distributed

// distributed/comm/nccl.cpp: the NCCL backend, for CUDA tensors (one GPU per rank). Its sibling
// mpi.cpp carries CPU tensors (and CUDA ones through host memory); nccl_stub.cpp stands in where
// Kiln is built without CUDA or NCCL.
//
// Bootstrap through MPI: rank 0 makes the NCCL unique id, the MPI backend broadcasts it, and every
// rank joins with ncclCommInitRankConfig on its GPU, cuda(local rank % device count). An MPI
// communicator of the same ranks stays beside each NCCL one: it carries the signature check before
// each collective (the idea of mpi.cpp: every rank learns at once that the ranks disagree) and
// agrees on split().
//
// Note [NCCL streams]
// Kiln computes on each device's current stream (the default stream unless a cuda::StreamGuard
// names another; Note [CUDA streams] in cuda/context.h). Each NCCL communicator owns one
// non-blocking stream, so communication overlaps computation, and two events order the streams:
//
//   current stream:  kernels writing t --[ready]                    [wait done]-- kernels reading t
//                                           |                            ^
//                                           v                            | Work::wait()
//   comm stream:                      [wait ready]--ncclAllReduce(t)--[done]
//
// 1. ready is recorded on the current stream when the op is called: NCCL reads t only after every
//    kernel queued there before the call.
// 2. the NCCL call goes on the comm stream, and done is recorded after it.
// 3. Work::wait() makes the then current stream wait for done, without blocking the host (PyTorch's
//    semantics); is_completed() is cudaEventQuery(done). A call with async_op = false waits so
//    before it returns: later kernels, and copies to the host (which synchronize), see the result.
// The op's tensors stay alive until done fires (the watchdog holds them), even if the caller drops
// them.
//
// Note [NCCL watchdog]
// Communicators are non-blocking (config.blocking = 0): no NCCL call blocks the host, so a missing
// peer shows as an operation that never completes, never as a hang inside NCCL. One watchdog thread
// per process polls every 2 ms: each pending op's done event, and each communicator's
// ncclCommGetAsyncError (a peer's death, a network error). An op older than the timeout, or an
// error, stops it with a message naming the rank, the op and its sequence number:
//   kiln: rank 2: all_reduce #6 (float32, 1000 elements, avg) did not complete within 3 s: ...
// With CommOptions::abort_on_timeout, every communicator is aborted and the process exits with
// status 1, so mpirun stops the job (the ranks it stops name their op from the SIGTERM handler).
// Without it, only this communicator is aborted: its pending Works fail with the Error, and every
// later call on it throws.
#include <nccl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <thread>
#include <unistd.h>

#include "cuda/check.h"
#include "cuda/cuda.h"
#include "distributed/comm/backends.h"
#include "distributed/comm/work.h"
#include "ops/ops.h"

namespace kiln::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// The stream Kiln's ops on `device` are queued on in this thread (cuda::current_stream): an op
// starts after the work queued there before the call, and wait() makes it wait for the op.
cudaStream_t compute_stream(int device) { return static_cast<cudaStream_t>(cuda::current_stream(device).handle()); }

#define KILN_NCCL_CHECK(call)                                                                      \
  do {                                                                                             \
    ncclResult_t kiln_nccl_rc_ = (call);                                                           \
    if (kiln_nccl_rc_ != ncclSuccess) [[unlikely]] {                                               \
      KILN_FAIL("{}:{}: {} failed: {} ({})", __FILE__, __LINE__, #call,                            \
                ncclGetErrorString(kiln_nccl_rc_), ncclGetLastError(nullptr));                     \
    }                                                                                              \
  } while (0)

// ---- datatypes and reductions ----

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
    case kFloat16: return ncclFloat16;
    case kBFloat16: return ncclBfloat16;
    case kInt32: return ncclInt32;
    case kInt64: return ncclInt64;
    case kBool: return ncclUint8;  // one byte, 0 or 1
    case kUInt8: return ncclUint8;
    case kInt8: return ncclInt8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op, DType t, const std::string& what) {
  KILN_CHECK(op != ReduceOp::Avg || is_floating(t),
             "{}: ReduceOp::Avg needs a floating dtype, not {}; use Sum and divide", what, dtype_name(t));
  if (t == kBool) return op == ReduceOp::Min ? ncclMin : ncclMax;  // as PyTorch: sum and max are "any"
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// ---- small CUDA helpers ----

// Makes `device` current for a scope (the legacy default stream is the current device's) and
// restores the previous one. Never throws: a failure shows in the next CUDA call.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == device || cudaSetDevice(device) != cudaSuccess) {
      previous_ = -1;
    }
  }
  ~DeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// A CUDA event without timing, shared by a pending op and its Work.
struct Event {
  cudaEvent_t e = nullptr;
  Event() { KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() { (void)cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// ---- what the watchdog watches ----

// A communicator as the watchdog sees it. Every NCCL call on `comm` holds `m` (a communicator is
// not thread-safe); a failure aborts `comm` and clears it.
struct CommState {
  std::mutex m;
  ncclComm_t comm = nullptr;  // nullptr once aborted or being destroyed
  int device = 0;
  CommOptions options;
  std::string broken;  // why it stopped working; empty while it works
};

// One operation, from its call until its done event fires.
struct Pending {
  std::shared_ptr<Work::State> work;
  std::shared_ptr<CommState> comm;
  std::shared_ptr<Event> done;
  std::vector<Tensor> keep;  // the op's tensors, alive until it completes
  Clock::time_point deadline;
  std::atomic<bool> enqueued{false};  // done is recorded (before that, cudaEventQuery says "complete")
};

int g_world_rank = 0;
std::atomic<bool> g_exiting{false};  // the watchdog is gone: communicators are left to the OS

// What the SIGTERM handler, which may only call write(), prints: "kiln: rank R: stopped by the
// launcher (SIGTERM) during " + the oldest NCCL op in flight + kSigtermTail.
char g_sigterm_head[128] = "kiln: stopped by the launcher (SIGTERM) during ";
char g_current_op[256] = "";  // empty: no NCCL op in flight
constexpr char kSigtermTail[] = ": another rank failed or was killed; its message, or the launcher's, names it\n";
struct sigaction g_previous_sigterm {};

void on_sigterm(int sig) {
  if (g_current_op[0] == '\0') {  // not in NCCL: the handler before ours (the MPI backend's) speaks
    if (!(g_previous_sigterm.sa_flags & SA_SIGINFO) && g_previous_sigterm.sa_handler != SIG_DFL &&
        g_previous_sigterm.sa_handler != SIG_IGN) {
      g_previous_sigterm.sa_handler(sig);
    }
    _exit(143);
  }
  (void)!write(2, g_sigterm_head, std::strlen(g_sigterm_head));
  (void)!write(2, g_current_op, std::strlen(g_current_op));
  (void)!write(2, kSigtermTail, sizeof kSigtermTail - 1);
  _exit(143);
}

bool is_done(Work::State& w) {
  std::lock_guard<std::mutex> lock(w.m);
  return w.done;
}

std::string timeout_reason(const CommOptions& o) {
  return fmt::format("did not complete within {:.3g} s: a rank did not take part (it died, hangs, or called a "
                     "different operation); stopping. Set the limit with KILN_COMM_TIMEOUT (seconds)",
                     o.timeout.count() / 1000.0);
}

std::string nccl_reason(ncclResult_t r, ncclComm_t comm) {
  return fmt::format("failed: NCCL reports {} ({}): a peer died, the network failed, or NCCL was misused; stopping",
                     ncclGetErrorString(r), ncclGetLastError(comm));
}

// ---- the watchdog (Note [NCCL watchdog]) ----

class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog dog;
    return dog;
  }

  void watch(const std::shared_ptr<CommState>& c) {
    std::lock_guard<std::mutex> lock(m_);
    comms_.push_back(c);
  }

  void add(std::shared_ptr<Pending> p) {
    {
      std::lock_guard<std::mutex> lock(m_);
      pending_.push_back(std::move(p));
    }
    cv_.notify_one();
  }

  // Completes p (error: why it failed) unless that was done already.
  void finish(const std::shared_ptr<Pending>& p, std::exception_ptr error = nullptr) {
    {
      std::lock_guard<std::mutex> lock(m_);
      auto it = std::find(pending_.begin(), pending_.end(), p);
      if (it == pending_.end()) return;
      pending_.erase(it);
      // Freed later on a user thread: cudaFree waits for the whole device, and the watchdog must
      // not wait behind an op that hangs.
      for (auto& t : p->keep) released_.push_back(std::move(t));
      p->keep.clear();
    }
    p->work->complete(std::move(error));
  }

  // On a user thread: frees the tensors of finished ops that nobody else holds.
  void drop_released() {
    std::vector<Tensor> dead;
    {
      std::lock_guard<std::mutex> lock(m_);
      dead.swap(released_);
    }
  }

  // Stops on a failure of c during `what`. With abort_on_timeout: prints, aborts every communicator
  // and exits the process with status 1 (never returns). Otherwise aborts c, fails its pending
  // Works and returns the Error for the caller to throw. Call with neither m_ nor c.m held.
  Error fail(CommState& c, const std::string& what, const std::string& reason) {
    const std::string message = fmt::format("rank {}: {} {}", g_world_rank, what, reason);
    if (c.options.abort_on_timeout) stop_process(c, message);
    abort_comm(c, message);
    std::vector<std::shared_ptr<Pending>> mine;
    {
      std::lock_guard<std::mutex> lock(m_);
      for (const auto& p : pending_) {
        if (p->comm.get() == &c) mine.push_back(p);
      }
    }
    for (const auto& p : mine) finish(p, std::make_exception_ptr(Error(message)));
    return Error(message);
  }

  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    g_exiting = true;
  }

 private:
  Watchdog() : thread_([this] { loop(); }) {}

  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    while (!stop_) {
      cv_.wait_for(lock, pending_.empty() ? std::chrono::milliseconds(50) : std::chrono::milliseconds(2));
      if (stop_) break;
      std::vector<std::shared_ptr<Pending>> pending(pending_.begin(), pending_.end());
      std::vector<std::shared_ptr<CommState>> comms;
      std::erase_if(comms_, [](const auto& w) { return w.expired(); });
      for (const auto& w : comms_) {
        if (auto c = w.lock()) comms.push_back(std::move(c));
      }
      lock.unlock();
      try {
        poll(pending, comms);
      } catch (const std::exception& e) {  // the watchdog must not die
        std::fprintf(stderr, "kiln: rank %d: NCCL watchdog: %s\n", g_world_rank, e.what());
      }
      lock.lock();
    }
  }

  // One look at everything in flight; acts outside m_.
  void poll(const std::vector<std::shared_ptr<Pending>>& pending,
            const std::vector<std::shared_ptr<CommState>>& comms) {
    for (const auto& c : comms) {  // asynchronous errors: a peer died, the network failed
      ncclResult_t r = ncclSuccess;
      std::string reason;
      {
        std::lock_guard<std::mutex> lock(c->m);
        if (!c->comm) continue;
        DeviceScope device(c->device);
        const ncclResult_t rc = ncclCommGetAsyncError(c->comm, &r);
        if (rc != ncclSuccess) r = rc;
        if (r != ncclSuccess && r != ncclInProgress) reason = nccl_reason(r, c->comm);
      }
      if (reason.empty()) continue;
      std::string what = "the NCCL communicator, between operations,";
      for (const auto& p : pending) {
        if (p->comm == c) {
          what = p->work->what;
          break;
        }
      }
      (void)fail(*c, what, reason);
    }
    const auto now = Clock::now();
    for (const auto& p : pending) {
      if (p->enqueued) {
        DeviceScope device(p->comm->device);
        const cudaError_t e = cudaEventQuery(p->done->e);
        if (e == cudaSuccess) {
          finish(p);
          continue;
        }
        if (e == cudaErrorCudartUnloading) return;  // the process is exiting
        if (e != cudaErrorNotReady) {
          (void)cudaGetLastError();
          (void)fail(*p->comm, p->work->what,
                     fmt::format("failed on the GPU: {} ({}); stopping", cudaGetErrorString(e), cudaGetErrorName(e)));
          continue;
        }
      }
      // An op still on the host (its signature check on MPI) is declared late 50 ms early, so that
      // this message, which names the op, comes before the MPI engine's, which names the check.
      const auto late = p->enqueued ? p->deadline : p->deadline - std::chrono::milliseconds(50);
      if (now > late && !is_done(*p->work)) (void)fail(*p->comm, p->work->what, timeout_reason(p->comm->options));
    }
    set_current_op();
  }

  static void abort_comm(CommState& c, const std::string& message) {
    std::lock_guard<std::mutex> lock(c.m);
    if (c.comm) {
      DeviceScope device(c.device);
      (void)ncclCommAbort(c.comm);
      c.comm = nullptr;
    }
    if (c.broken.empty()) c.broken = message;
  }

  [[noreturn]] void stop_process(CommState& c, const std::string& message) {
    std::fprintf(stderr, "kiln: %s\n", message.c_str());
    std::fflush(stderr);
    // Never a hang: should an abort not return, this ends the process anyway.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(1);
    }).detach();
    abort_comm(c, message);
    std::vector<std::shared_ptr<CommState>> others;
    {
      std::lock_guard<std::mutex> lock(m_);
      for (const auto& w : comms_) {
        if (auto o = w.lock()) others.push_back(std::move(o));
      }
    }
    for (const auto& o : others) abort_comm(*o, message);
    std::_Exit(1);
  }

  // For the SIGTERM handler: the oldest op in flight.
  void set_current_op() {
    std::string s;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!pending_.empty()) s = pending_.front()->work->what;
    }
    const size_t n = std::min(s.size(), sizeof g_current_op - 1);
    if (std::strncmp(g_current_op, s.c_str(), n) == 0 && g_current_op[n] == '\0') return;
    std::memcpy(g_current_op, s.data(), n);
    g_current_op[n] = '\0';
  }

  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::list<std::shared_ptr<Pending>> pending_;  // in call order
  std::vector<std::weak_ptr<CommState>> comms_;
  std::vector<Tensor> released_;
  std::thread thread_;  // last: it starts once the members it uses exist
};

// NCCL finishes a call on a non-blocking communicator in the background when it returns
// ncclInProgress, and the communicator takes no other call until then. Waits for that, releasing
// `lock` (on c.m) between polls so that the watchdog can look at c and abort it; past `deadline`
// (calls no pending op covers: init, split) it fails as a timeout. Returns the call's result.
ncclResult_t settle(std::unique_lock<std::mutex>& lock, CommState& c, ncclResult_t r, const std::string& what,
                    Clock::time_point deadline = Clock::time_point::max()) {
  while (r == ncclInProgress) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (Clock::now() > deadline) throw Watchdog::get().fail(c, what, timeout_reason(c.options));
    lock.lock();
    KILN_CHECK(c.comm, "{}: this communicator stopped working: {}", what, c.broken);
    const ncclResult_t rc = ncclCommGetAsyncError(c.comm, &r);
    if (rc != ncclSuccess) r = rc;
  }
  return r;
}

// ---- the communicator ----

// Runs the calls of `body` as one NCCL group: they start together at ncclGroupEnd.
template <typename Body>
ncclResult_t group(Body body) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = body();
  const ncclResult_t end = ncclGroupEnd();
  return r == ncclSuccess ? end : r;
}

std::shared_ptr<CommState> start_comm(Communicator& mpi, int device, const CommOptions& options,
                                      const std::string& what);

class NcclCommunicator final : public Communicator {
 public:
  // state: a ready NCCL communicator; mpi: an MPI communicator of the same ranks, in the same order.
  NcclCommunicator(std::shared_ptr<CommState> state, std::shared_ptr<Communicator> mpi)
      : state_(std::move(state)), mpi_(std::move(mpi)) {
    options_ = state_->options;
    device_ = state_->device;
    rank_ = mpi_->rank();
    size_ = mpi_->size();
    int nccl_rank = -1, nccl_size = -1;
    {
      std::lock_guard<std::mutex> lock(state_->m);
      KILN_NCCL_CHECK(ncclCommUserRank(state_->comm, &nccl_rank));
      KILN_NCCL_CHECK(ncclCommCount(state_->comm, &nccl_size));
    }
    KILN_CHECK(nccl_rank == rank_ && nccl_size == size_,
               "distributed: NCCL puts this process at rank {} of {}, but MPI at rank {} of {}", nccl_rank, nccl_size,
               rank_, size_);
    DeviceScope device(device_);
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ready_ = std::make_unique<Event>();
    Watchdog::get().watch(state_);
  }

  ~NcclCommunicator() override {
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(state_->m);
      comm = std::exchange(state_->comm, nullptr);  // the watchdog leaves it alone from now on
      if (state_->broken.empty()) state_->broken = "it was destroyed";
    }
    if (g_exiting) return;  // at exit: the OS reclaims it
    DeviceScope device(device_);
    if (comm) {
      // Flush what is in flight, then free; a communicator that does not settle in time is aborted.
      ncclResult_t r = ncclCommFinalize(comm);
      const auto deadline = Clock::now() + options_.timeout;
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
      }
      (void)(r == ncclSuccess ? ncclCommDestroy(comm) : ncclCommAbort(comm));
    }
    ready_.reset();
    (void)cudaStreamDestroy(stream_);  // its resources go once its work is done
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }
  bool p2p_in_call_order() const override { return true; }
  uint64_t sequence_number() const override { return seq_; }

  Work all_reduce(const Tensor& t, ReduceOp op, bool async_op) override {
    check_cuda("all_reduce", t);
    check_written("all_reduce", t);
    std::string what = describe_op("all_reduce", ++seq_, t, reduce_op_name(op));
    const ncclRedOp_t nop = nccl_op(op, t.dtype(), what);
    const Signature sig = sign(kAllReduce, t, -1, op, {});
    return launch(std::move(what), &sig, {t}, async_op, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), nop, c, s);
    });
  }

  Work broadcast(const Tensor& t, int src, bool async_op) override {
    check_cuda("broadcast", t);
    check_written("broadcast", t);
    check_rank("broadcast", src, "src");
    std::string what = describe_op("broadcast", ++seq_, t, fmt::format("from rank {}", src));
    const Signature sig = sign(kBroadcast, t, src, ReduceOp::Sum, {});
    return launch(std::move(what), &sig, {t}, async_op, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), src, c, s);
    });
  }

  Work reduce(const Tensor& t, int dst, ReduceOp op, bool async_op) override {
    check_cuda("reduce", t);
    check_written("reduce", t);
    check_rank("reduce", dst, "dst");
    std::string what = describe_op("reduce", ++seq_, t, fmt::format("{} to rank {}", reduce_op_name(op), dst));
    const ncclRedOp_t nop = nccl_op(op, t.dtype(), what);
    const Signature sig = sign(kReduce, t, dst, op, {});
    void* out = rank_ == dst ? t.data_ptr() : nullptr;  // the other ranks' t are left as they were
    return launch(std::move(what), &sig, {t}, async_op, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduce(t.data_ptr(), out, static_cast<size_t>(t.numel()), nccl_type(t.dtype()), nop, dst, c, s);
    });
  }

  Work all_gather(const std::vector<Tensor>& outputs, const Tensor& input, bool async_op) override {
    check_cuda("all_gather", input);  // and so every output, which must share its device
    const std::vector<int64_t> counts = per_rank_counts("all_gather", outputs, "outputs", input, "input", rank_, size_);
    for (const auto& o : outputs) check_written("all_gather", o);
    std::string what = describe_op("all_gather", ++seq_, input, "");
    const Signature sig = sign(kAllGather, input, -1, ReduceOp::Sum, counts);
    std::vector<Tensor> keep = outputs;
    keep.push_back(input);
    // The sizes may differ from rank to rank: one broadcast from each rank, in one group.
    return launch(std::move(what), &sig, std::move(keep), async_op, [&](ncclComm_t c, cudaStream_t s) {
      return group([&] {
        for (int r = 0; r < size_; ++r) {
          const Tensor& out = outputs[static_cast<size_t>(r)];
          const void* in = r == rank_ ? input.data_ptr() : out.data_ptr();  // read on rank r only
          const ncclResult_t e = ncclBroadcast(in, out.data_ptr(), static_cast<size_t>(out.numel()),
                                               nccl_type(out.dtype()), r, c, s);
          if (e != ncclSuccess) return e;
        }
        return ncclSuccess;
      });
    });
  }

  Work all_gather_into_tensor(const Tensor& output, const Tensor& input, bool async_op) override {
    check_cuda("all_gather_into_tensor", input);
    check_cuda("all_gather_into_tensor", output, input);
    check_written("all_gather_into_tensor", output);
    KILN_CHECK(output.numel() == input.numel() * size_,
               "all_gather_into_tensor: the output has {} elements but {} ranks x {} input elements = {}",
               output.numel(), size_, input.numel(), input.numel() * size_);
    std::string what = describe_op("all_gather_into_tensor", ++seq_, input, "");
    const Signature sig = sign(kAllGatherTensor, input, -1, ReduceOp::Sum, {});
    // In place (input is this rank's slice of output) is NCCL's own in-place case; any other overlap
    // needs a copy (made on the current stream, so the ready event orders it), as reduce_scatter_tensor.
    const bool in_place = input.data_ptr() == static_cast<char*>(output.data_ptr()) + rank_ * input.nbytes();
    const Tensor in = bytes_overlap(input, output) && !in_place ? input.clone() : input;
    return launch(std::move(what), &sig, {output, in}, async_op, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), output.data_ptr(), static_cast<size_t>(in.numel()),
                           nccl_type(in.dtype()), c, s);
    });
  }

  Work reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op, bool async_op) override {
    check_cuda("reduce_scatter", output);  // and so every input, which must share its device
    check_written("reduce_scatter", output);
    const std::vector<int64_t> counts =
        per_rank_counts("reduce_scatter", inputs, "inputs", output, "output", rank_, size_);
    std::string what = describe_op("reduce_scatter", ++seq_, output, reduce_op_name(op));
    const ncclRedOp_t nop = nccl_op(op, output.dtype(), what);
    const Signature sig = sign(kReduceScatter, output, -1, op, counts);
    std::vector<Tensor> keep = inputs;
    keep.push_back(output);
    // The sizes may differ from rank to rank: one reduce to each rank, in one group.
    return launch(std::move(what), &sig, std::move(keep), async_op, [&](ncclComm_t c, cudaStream_t s) {
      return group([&] {
        for (int r = 0; r < size_; ++r) {
          const Tensor& in = inputs[static_cast<size_t>(r)];
          const ncclResult_t e = ncclReduce(in.data_ptr(), r == rank_ ? output.data_ptr() : nullptr,
                                            static_cast<size_t>(in.numel()), nccl_type(in.dtype()), nop, r, c, s);
          if (e != ncclSuccess) return e;
        }
        return ncclSuccess;
      });
    });
  }

  Work reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op, bool async_op) override {
    check_cuda("reduce_scatter_tensor", output);
    check_written("reduce_scatter_tensor", output);
    check_cuda("reduce_scatter_tensor", input, output);
    KILN_CHECK(input.numel() == output.numel() * size_,
               "reduce_scatter_tensor: the input has {} elements but {} ranks x {} output elements = {}", input.numel(),
               size_, output.numel(), output.numel() * size_);
    std::string what = describe_op("reduce_scatter_tensor", ++seq_, output, reduce_op_name(op));
    const ncclRedOp_t nop = nccl_op(op, output.dtype(), what);
    const Signature sig = sign(kReduceScatterTensor, output, -1, op, {});
    // NCCL works in place when output is this rank's slice of input; any other overlap needs a copy
    // (made on the current stream, so the ready event orders it).
    const bool in_place = output.data_ptr() == static_cast<char*>(input.data_ptr()) + rank_ * output.nbytes();
    const Tensor in = bytes_overlap(input, output) && !in_place ? input.clone() : input;
    return launch(std::move(what), &sig, {output, in}, async_op, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                               nccl_type(output.dtype()), nop, c, s);
    });
  }

  Work all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs, bool async_op) override {
    const PairCounts counts = all_to_all_counts("all_to_all", outputs, inputs, rank_, size_);
    check_cuda("all_to_all", inputs[0]);  // and so every tensor, which must share its device
    std::string what = describe_all_to_all(++seq_, inputs[0].dtype(), counts);
    const Signature sig = sign(kAllToAll, inputs[0], -1, ReduceOp::Sum, {});
    const std::vector<int64_t> pairs = options_.check_collectives
                                           ? pair_check_values(rank_, size_, counts.send, counts.recv)
                                           : std::vector<int64_t>{};
    std::vector<Tensor> keep = outputs;
    keep.insert(keep.end(), inputs.begin(), inputs.end());
    // One send and one receive per rank (itself included), in one group: NCCL pairs them up.
    return launch(
        std::move(what), &sig, std::move(keep), async_op,
        [&](ncclComm_t c, cudaStream_t s) {
          return group([&] {
            for (int r = 0; r < size_; ++r) {
              const Tensor& in = inputs[static_cast<size_t>(r)];
              const Tensor& out = outputs[static_cast<size_t>(r)];
              ncclResult_t e = ncclSend(in.data_ptr(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()), r, c, s);
              if (e != ncclSuccess) return e;
              e = ncclRecv(out.data_ptr(), static_cast<size_t>(out.numel()), nccl_type(out.dtype()), r, c, s);
              if (e != ncclSuccess) return e;
            }
            return ncclSuccess;
          });
        },
        pairs);
  }

  // NCCL matches sends and receives by their order between two ranks; it has no tags and does not
  // check sizes (a mismatch shows as a timeout naming the op).
  Work send(const Tensor& t, int dst, int tag, bool async_op) override {
    check_cuda("send", t);
    check_rank("send", dst, "dst");
    KILN_CHECK(tag >= 0, "send: the tag must be >= 0, not {}", tag);
    check_send_dst(dst, rank_, async_op);
    std::string what = describe_op("send", ++p2p_seq_, t, fmt::format("to rank {}, tag {}", dst, tag));
    return launch(std::move(what), nullptr, {t}, async_op, [&](ncclComm_t c, cudaStream_t s) {
      return group([&] {
        return ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), dst, c, s);
      });
    });
  }

  Work recv(const Tensor& t, int src, int tag, bool async_op) override {
    check_cuda("recv", t);
    check_written("recv", t);
    check_rank("recv", src, "src");
    KILN_CHECK(tag >= 0, "recv: the tag must be >= 0, not {}", tag);
    std::string what = describe_op("recv", ++p2p_seq_, t, fmt::format("from rank {}, tag {}", src, tag));
    return launch(std::move(what), nullptr, {t}, async_op, [&](ncclComm_t c, cudaStream_t s) {
      return group([&] {
        return ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), src, c, s);
      });
    });
  }

  // An all-reduce of one element, then the host waits for it (the watchdog ends a wait that times out).
  void barrier() override {
    std::string what = fmt::format("barrier #{}", ++seq_);
    const Signature sig = make_signature(seq_, kBarrier, Tensor(), -1, ReduceOp::Sum, {});
    Tensor one = zeros({1}, TensorOptions(kFloat32).device(Device::cuda(device_)));
    Work w = launch(std::move(what), &sig, {one}, /*async_op=*/true, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, c, s);
    });
    while (!w.is_completed()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    w.wait();  // rethrows a failure
  }

  // A sub-communicator is a new NCCL communicator made over the MPI split of the same ranks (its
  // unique id goes round on that split), rather than ncclCommSplit: a non-blocking ncclCommSplit
  // fills in the new handle from NCCL's own thread at a moment nothing reports, while a
  // non-blocking ncclCommInitRankConfig hands it back at once, to be polled like any other.
  std::shared_ptr<Communicator> split(int color, int key) override {
    check_usable("split");
    // Numbered and checked as a collective, as on MPI, so that a split against another collective
    // is an Error naming this communicator's operations (the twin's split checks again).
    const std::string what = fmt::format("split #{} (color {}, key {})", ++seq_, color, key);
    verify(what, sign(kSplit, Tensor(), -1, ReduceOp::Sum, {}));
    std::shared_ptr<Communicator> sub_mpi = mpi_->split(color, key);  // the same ranks, in the same order
    if (!sub_mpi) return nullptr;  // a negative color
    std::shared_ptr<CommState> sub = start_comm(*sub_mpi, device_, options_, what);
    return std::make_shared<NcclCommunicator>(std::move(sub), std::move(sub_mpi));
  }

 private:
  void check_rank(const char* op, int r, const char* name) const {
    KILN_CHECK(r >= 0 && r < size_, "{}: {} = {} is not a rank of this communicator (0 to {})", op, name, r, size_ - 1);
  }

  void check_cuda(const char* op, const Tensor& t, const Tensor& like = {}) const {
    check_tensor(op, t, like);
    KILN_CHECK(t.is_cuda() && t.device().index == device_,
               "{}: the tensor (shape {}) is on {}, but this NCCL communicator works on cuda:{}{}", op,
               t.sizes().str(), t.device().str(), device_,
               t.is_cpu() ? "; use init(\"mpi\") for CPU tensors" : ": move the tensor there");
  }

  void check_usable(const std::string& what) const {
    std::lock_guard<std::mutex> lock(state_->m);
    KILN_CHECK(state_->broken.empty(), "{}: this communicator stopped working: {}", what, state_->broken);
  }

  Signature sign(OpCode code, const Tensor& t, int root, ReduceOp op, const std::vector<int64_t>& sizes) const {
    return make_signature(seq_, code, t, root, op, sizes);
  }

  // The signature check of mpi.cpp, on this communicator's MPI twin: the ranks all-reduce (MAX) the
  // signature and its negation; equal maxima mean every rank asked for the same thing.
  // all_to_all's pairing check (pair_check_values) follows in a second all-reduce, once the
  // signatures agree (so that every rank's is of the same size).
  void verify(const std::string& what, const Signature& sig, const std::vector<int64_t>& pairs = {}) {
    const auto values = signature_check_values(sig);
    Tensor buf = from_vector(std::vector<int64_t>(values.begin(), values.end()));
    mpi_->all_reduce(buf, ReduceOp::Max);
    check_signature(what, sig, buf.data_ptr<int64_t>());
    if (pairs.empty()) return;
    Tensor pair_buf = from_vector(pairs);
    mpi_->all_reduce(pair_buf, ReduceOp::Max);
    check_pairs(what, size_, pair_buf.data_ptr<int64_t>());
  }

  // Runs one operation as Note [NCCL streams] draws it: checked, ordered after the current stream,
  // enqueued on the comm stream, watched until done.
  Work launch(std::string what, const Signature* sig, std::vector<Tensor> keep, bool async_op,
              const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& enqueue,
              const std::vector<int64_t>& pairs = {}) {
    Watchdog& dog = Watchdog::get();
    dog.drop_released();
    check_usable(what);
    DeviceScope device(device_);
    auto p = std::make_shared<Pending>();
    p->work = std::make_shared<Work::State>(std::move(what));
    p->comm = state_;
    p->done = std::make_shared<Event>();
    p->keep = std::move(keep);
    p->deadline = Clock::now() + options_.timeout;
    // See Note [NCCL Work] below.
    p->work->stream_wait = [done = p->done, d = device_] {
      DeviceScope scope(d);
      KILN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(d), done->e, 0));
      Watchdog::get().drop_released();
    };
    p->work->query = [done = p->done, d = device_] {
      DeviceScope scope(d);
      return cudaEventQuery(done->e) == cudaSuccess;
    };
    dog.add(p);
    const std::string& name = p->work->what;
    try {
      if (sig && options_.check_collectives) verify(name, *sig, pairs);
      std::unique_lock<std::mutex> lock(state_->m);
      KILN_CHECK(state_->comm, "{}: this communicator stopped working: {}", name, state_->broken);
      KILN_CUDA_CHECK(cudaEventRecord(ready_->e, compute_stream(device_)));
      KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_->e, 0));
      const ncclResult_t r = settle(lock, *state_, enqueue(state_->comm, stream_), name);
      if (r != ncclSuccess) {
        const std::string reason = nccl_reason(r, state_->comm);
        lock.unlock();
        throw dog.fail(*state_, name, reason);
      }
      KILN_CUDA_CHECK(cudaEventRecord(p->done->e, stream_));
      p->enqueued = true;
    } catch (...) {
      // The watchdog may have failed the op first (a timeout): its Error names the op.
      std::exception_ptr error = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(p->work->m);
        if (p->work->error) error = p->work->error;
      }
      dog.finish(p, error);
      std::rethrow_exception(error);
    }
    Work w(p->work);
    if (!async_op) w.wait();
    return w;
  }

  std::shared_ptr<CommState> state_;
  std::shared_ptr<Communicator> mpi_;  // the same ranks on MPI: signature checks, split
  CommOptions options_;
  int device_ = 0;
  int rank_ = 0, size_ = 1;
  uint64_t seq_ = 0, p2p_seq_ = 0;
  cudaStream_t stream_ = nullptr;  // the comm stream (non-blocking)
  std::unique_ptr<Event> ready_;   // recorded on the current stream before each op (under state_->m)
};

// Note [NCCL Work]
// A Work's State gets two hooks (work.h): stream_wait, which Work::wait() calls instead of
// blocking the host (it makes the current stream of the communicator's device wait for done), and
// query, which is_completed() asks (cudaEventQuery). The watchdog calls State::complete once done
// fires, or with the Error when the op fails; wait() rethrows an Error already known.

// cuda(local rank % device count), unless the program chose a device (cudaSetDevice to one other
// than 0) before init. Two ranks on one device cannot share an NCCL communicator.
int pick_device(const char* what) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  KILN_CHECK(e == cudaSuccess && count > 0,
             "{}: no CUDA device ({}); the NCCL backend carries CUDA tensors: use init(\"mpi\") on a machine "
             "without GPUs",
             what, e == cudaSuccess ? "none found" : cudaGetErrorString(e));
  const WorldInfo w = world_info();
  KILN_CHECK(w.local_size <= count,
             "{}: {} ranks on this node share {} CUDA device(s), but NCCL needs a device of its own for each "
             "rank: start at most {} ranks per node, or use init(\"mpi\")",
             what, w.local_size, count, count);
  int current = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&current));
  return current != 0 ? current : w.local_rank % count;
}

void install_sigterm_handler(int world_rank) {
  std::snprintf(g_sigterm_head, sizeof g_sigterm_head, "kiln: rank %d: stopped by the launcher (SIGTERM) during ",
                world_rank);
  struct sigaction action {};
  action.sa_handler = on_sigterm;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, &g_previous_sigterm);
}

}  // namespace

bool nccl_available() { return mpi_available(); }  // NCCL bootstraps through MPI

namespace {

// Makes the NCCL communicator of the ranks of `mpi`: its rank 0 makes the unique id, MPI broadcasts
// it, and every rank joins non-blocking (Note [NCCL watchdog]) and waits for the setup to finish.
std::shared_ptr<CommState> start_comm(Communicator& mpi, int device, const CommOptions& options,
                                      const std::string& what) {
  ncclUniqueId id{};
  static_assert(sizeof id % sizeof(int64_t) == 0);
  if (mpi.rank() == 0) KILN_NCCL_CHECK(ncclGetUniqueId(&id));
  Tensor bytes = empty({static_cast<int64_t>(sizeof id / sizeof(int64_t))}, TensorOptions(kInt64));  // no uint8 dtype
  std::memcpy(bytes.data_ptr(), &id, sizeof id);
  mpi.broadcast(bytes, 0);
  std::memcpy(&id, bytes.data_ptr(), sizeof id);

  auto state = std::make_shared<CommState>();
  state->device = device;
  state->options = options;
  DeviceScope scope(device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::unique_lock<std::mutex> lock(state->m);
  const ncclResult_t r = settle(lock, *state, ncclCommInitRankConfig(&state->comm, mpi.size(), id, mpi.rank(), &config),
                                what, Clock::now() + options.timeout);
  if (r != ncclSuccess) {
    const std::string reason = nccl_reason(r, state->comm);
    lock.unlock();
    throw Watchdog::get().fail(*state, what, reason);
  }
  return state;
}

}  // namespace

std::shared_ptr<Communicator> nccl_world(const CommOptions& options) {
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  // One world communicator per process, never destroyed: at exit the CUDA runtime and the MPI
  // engine go in an order this file does not control, and the OS reclaims it.
  static std::shared_ptr<Communicator>* world = nullptr;
  if (world) return *world;
  const char* what = "distributed::init(\"nccl\")";
  const int device = pick_device(what);
  KILN_CUDA_CHECK(cudaSetDevice(device));  // for the rest of the program too

  // MPI: the ranks, the unique id, and a twin communicator for the signature checks.
  KILN_CHECK(mpi_available(), "{}: NCCL starts through MPI, and this Kiln was built without it; install Open MPI "
             "(apt-get install libopenmpi-dev openmpi-bin) and build again", what);
  std::shared_ptr<Communicator> mpi = mpi_world(options);
  g_world_rank = mpi->rank();
  std::shared_ptr<Communicator> twin = mpi->split(0, mpi->rank());
  std::shared_ptr<CommState> state = start_comm(*mpi, device, options, what);
  install_sigterm_handler(g_world_rank);  // after the MPI backend's, which it calls outside NCCL ops
  world = new std::shared_ptr<Communicator>(std::make_shared<NcclCommunicator>(std::move(state), std::move(twin)));
  return *world;
}

}  // namespace kiln::distributed

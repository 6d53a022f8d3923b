// distributed/comm/mpi.cpp: the MPI backend (Open MPI), for CPU tensors and, through host copies,
// CUDA tensors (Debian's Open MPI is not CUDA-aware).
//
// One engine thread per process makes every MPI call (MPI_THREAD_SERIALIZED is all it needs), so
// user threads never block inside MPI and several operations can be in flight at once:
//
//   caller thread                      engine thread
//   comm->all_reduce(t, op, async) --> queue --> post MPI_Iallreduce ... poll MPI_Testall ...
//   Work::wait() <------------------------------ complete (or an Error)
//
// Each collective goes through two phases on the engine:
//   1. the check: the ranks all-reduce (MAX) a signature of the call and its negation, on a
//      communicator of its own. Equal maxima mean every rank asked for the same thing; otherwise
//      every rank learns the same thing at once and fails the call with the same Error.
//   2. the operation itself, posted as a non-blocking MPI call. MPI matches collectives on a
//      communicator by the order in which they are posted, so a collective is posted only after
//      every earlier collective of its communicator. (send and recv, which MPI matches by source
//      and tag, are posted at once: they never wait behind a collective.)
// An operation still running at its deadline stops the job (MPI_Abort) with a message naming the
// rank, the op and its sequence number: a missing or dead rank never leaves the others hanging.
// When mpirun tears the job down because a rank died, the survivors' SIGTERM handler says which
// operation they were in.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <list>
#include <thread>
#include <type_traits>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "core/half.h"
#include "distributed/comm/backends.h"
#include "distributed/comm/work.h"
#include "ops/ops.h"

namespace kiln::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// Note [two-speed polling]
// Open MPI moves a non-blocking operation forward only inside MPI_Test, so the engine thread polls
// while anything is in flight, and every pause between polls is a pause in the transfer. How hard
// to poll depends on who waits:
//  - a caller blocked in Work::wait() (blocked_waiters() > 0) needs the transfer and nothing else:
//    the engine polls without pause, yielding between polls. Sleeping 50 us between polls made a
//    lone 256 MiB all-reduce 3.5x slower than MPI's own loop.
//  - operations that run behind computation (DDP's buckets during backward, a pipeline stage's
//    sends during its next forward) share the cores with that computation. A thread that yields
//    stays runnable and takes its share of a core: polling hard there slows the computation (2
//    pipeline stages on 2 cores, GPipe, 8 micro-batches: 551 ms a batch, bubble 0.23, against
//    482 ms and 0.17 polling as follows). The engine sleeps between polls, kBackgroundPoll at
//    first and twice as long after each poll that found nothing moved, up to kBackgroundPollMax:
//    an operation that waits long for its peer, such as a receive posted ahead of need, would
//    otherwise wake this thread 20000 times a second in the middle of the computation (in a
//    trial, a 2-stage 1F1B pipeline with receives posted ahead took 25% longer a batch).
// The sleep is a wait on the engine's condition variable that a new operation (submit()) and a
// thread starting to wait (Work::wait() calls the wait listener) cut short: the engine posts the
// one, and polls hard for the other, at once. For kHardPollWindow after anything moved (an
// operation posted or finished) it polls hard whether or not anyone waits: a caller that has just
// seen one operation finish usually waits for the next a moment later (the ring algorithms: a
// step's receive, then its send), and sleeping in between would put a wake-up in the middle of
// the exchange (before this window and the wait listener, a 1 MiB ring all-gather on 2 ranks took
// 1.6x as long). The engine thread's timer slack is 1 us, so that a sleep of 50 us lasts 50 us,
// not up to the default slack's 50 more.
// blocked_waiters() counts this process's threads only: a send behind computation here is polled
// gently even while its receiver blocks. On shared memory both sides' polls move the copy; across
// nodes, where the sender's polls must drive it, this is untried.
constexpr std::chrono::microseconds kBackgroundPoll{50};
constexpr std::chrono::microseconds kBackgroundPollMax{1000};
constexpr std::chrono::microseconds kHardPollWindow{500};

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

#define KILN_MPI_CHECK(call)                                                                      \
  do {                                                                                            \
    int kiln_mpi_rc_ = (call);                                                                    \
    if (kiln_mpi_rc_ != MPI_SUCCESS) KILN_FAIL("{}: {} failed: {}", what, #call, mpi_error_string(kiln_mpi_rc_)); \
  } while (0)

// ---- datatypes and reductions ----

// float16 and bfloat16 travel as 16-bit integers; these user-defined ops reduce them in float.
// Max and Min of every floating dtype go through them too, because they propagate NaN as
// torch.maximum does: MPI_MAX's result with a NaN depends on the order in which the ranks' values
// meet, so it would depend on which rank holds the NaN.
template <typename T, int kOp>  // kOp: 0 sum, 1 max, 2 min
void reduce_floating(void* in, void* inout, int* len, MPI_Datatype*) {
  using Math = std::conditional_t<std::is_same_v<T, double>, double, float>;
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const Math x = a[i], y = b[i];
    b[i] = T(kOp == 0 ? x + y : kOp == 1 ? (x > y || x != x ? x : y) : (x < y || x != x ? x : y));
  }
}

struct MpiOps {  // [k]: the kOp above; the built-in MPI_SUM serves f32 and f64 sums
  MPI_Op half[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op bf16[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op f32[3] = {MPI_SUM, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op f64[3] = {MPI_SUM, MPI_OP_NULL, MPI_OP_NULL};
};

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case kFloat32: return MPI_FLOAT;
    case kFloat64: return MPI_DOUBLE;
    case kFloat16:
    case kBFloat16: return MPI_UINT16_T;
    case kInt32: return MPI_INT32_T;
    case kInt64: return MPI_INT64_T;
    case kBool: return MPI_C_BOOL;
    case kUInt8: return MPI_UINT8_T;
    case kInt8: return MPI_INT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(const MpiOps& ops, ReduceOp op, DType t, const char* what) {
  const int k = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;  // Avg is Sum, then a division
  if (t == kFloat16) return ops.half[k];
  if (t == kBFloat16) return ops.bf16[k];
  if (t == kFloat32) return ops.f32[k];
  if (t == kFloat64) return ops.f64[k];
  KILN_CHECK(op != ReduceOp::Avg || is_floating(t),
             "{}: ReduceOp::Avg needs a floating dtype, not {}; use Sum and divide", what, dtype_name(t));
  if (t == kBool) {  // as PyTorch: sum and max are "any", min is "all"
    return k == 2 ? MPI_LAND : MPI_LOR;
  }
  return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
}

// ReduceOp::Avg of float16 and bfloat16 is summed in float32 (the host copy is widened, and
// narrowed after the division): a 16-bit sum overflows where the average fits (float16's largest
// value is 65504), which NCCL's Avg avoids too, by scaling before it sums.
bool avg_in_float32(ReduceOp op, DType t) { return op == ReduceOp::Avg && (t == kFloat16 || t == kBFloat16); }

// The end of an Avg, on the engine thread (so a plain loop): `sum` holds the ranks' sum, in `out`
// itself (float32, float64) or in a float32 copy (avg_in_float32); out = sum / by, rounded once to
// out's dtype.
void write_average(const Tensor& sum, const Tensor& out, int by) {
  const int64_t n = out.numel();
  auto each = [&](const auto* s, auto* o) {
    using T = std::remove_pointer_t<decltype(o)>;
    for (int64_t i = 0; i < n; ++i) o[i] = T(s[i] / by);
  };
  const auto* wide = static_cast<const float*>(sum.data_ptr());
  switch (out.dtype()) {
    case kFloat32: each(wide, static_cast<float*>(out.data_ptr())); break;
    case kFloat64: each(static_cast<const double*>(sum.data_ptr()), static_cast<double*>(out.data_ptr())); break;
    case kFloat16: each(wide, static_cast<Half*>(out.data_ptr())); break;
    case kBFloat16: each(wide, static_cast<BFloat16*>(out.data_ptr())); break;
    default: break;
  }
}

// A reduction's finish: write_average for Avg, nothing for the other ops.
std::function<void()> average_finish(ReduceOp op, const Tensor& sum, const Tensor& out, int by) {
  if (op != ReduceOp::Avg) return {};
  return [sum, out, by] { write_average(sum, out, by); };
}

int to_int_count(int64_t n, const char* what) {
  KILN_CHECK(n <= INT_MAX, "{}: {} elements is more than MPI's int count allows ({}); split the tensor", what, n,
             INT_MAX);
  return static_cast<int>(n);
}

// ---- the engine ----

struct Task {
  std::shared_ptr<Work::State> work;
  MPI_Comm comm = MPI_COMM_NULL;        // whose order the operation keeps
  MPI_Comm check_comm = MPI_COMM_NULL;  // the signature check's own communicator
  bool check = false;
  // A collective is posted only after every earlier collective of its communicator (MPI matches
  // them by order). send and recv are not: MPI matches them by source and tag, in a separate
  // context, so they go out at once, past a collective still in its check.
  bool ordered = true;
  bool finish_is_collective = false;  // split's MPI_Comm_split: later collectives wait for it
  Signature signature = {};
  // all_to_all's pairing check (pair_check_values; N ranks): a MAX all-reduce on comm once the
  // signatures agree (so that every rank posts one of the same size), before the operation.
  std::vector<int64_t> pair_check;
  int pair_ranks = 0;
  bool pairs_posted = false;
  std::function<void(std::vector<MPI_Request>&)> post;  // posts the operation's requests
  std::function<void()> finish;      // after the requests complete, on the engine thread
  std::function<void()> run_now;     // instead of post: a blocking call on the engine thread
  std::shared_ptr<std::atomic<bool>> broken;  // the communicator's: set on a timeout
  Clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
  bool abort_on_timeout = true;
  int world_rank = 0;

  int phase = 0;  // 0: queued, 1: checking, 2: running
  std::vector<int64_t> check_buf;
  MPI_Request check_req = MPI_REQUEST_NULL;
  std::vector<MPI_Request> reqs;
  std::vector<MPI_Status> statuses;
};

// The operation this rank is in, for the SIGTERM handler (which may only call write()).
char g_current_op[256] = "no communication";
int g_world_rank = -1;

void on_sigterm(int) {
  char msg[512];
  const char* op = g_current_op;
  int n = 0;
  auto put = [&](const char* s) {
    while (*s && n < static_cast<int>(sizeof msg) - 1) msg[n++] = *s++;
  };
  char rank[16];
  int r = g_world_rank < 0 ? 0 : g_world_rank, k = 15;
  rank[k] = '\0';
  do { rank[--k] = static_cast<char>('0' + r % 10); r /= 10; } while (r && k > 0);
  put("kiln: rank ");
  put(rank + k);
  put(": stopped by the launcher (SIGTERM) during ");
  put(op);
  put(": another rank failed or was killed; its message, or the launcher's, names it\n");
  (void)!write(2, msg, static_cast<size_t>(n));
  _exit(143);
}

class Engine {
 public:
  static Engine& get() {
    static Engine engine;
    return engine;
  }

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  MPI_Comm world() const { return world_; }
  MPI_Comm world_check() const { return world_check_; }
  const MpiOps& ops() const { return ops_; }

  void submit(std::unique_ptr<Task> task) {
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

  // Runs fn on the engine thread (an MPI call outside the task flow: freeing a communicator) and
  // waits for it.
  void call(const char* what, std::function<void()> fn) {
    auto task = std::make_unique<Task>();
    task->work = std::make_shared<Work::State>(what);
    task->run_now = std::move(fn);
    Work w(task->work);
    submit(std::move(task));
    w.wait();
  }

  ~Engine() {
    set_wait_listener(nullptr);
    instance_.store(nullptr);
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Engine() {
    std::promise<void> ready;
    auto started = ready.get_future();
    thread_ = std::thread([this, &ready] { run(ready); });
    try {
      started.get();
    } catch (...) {
      thread_.join();
      throw;
    }
    instance_.store(this);
    set_wait_listener(&Engine::wake_listener);
  }

  void run(std::promise<void>& ready) {
    const char* what = "distributed::init(\"mpi\")";
    try {
      int initialized = 0, finalized = 0;
      MPI_Finalized(&finalized);
      KILN_CHECK(!finalized,
                 "{}: MPI has been finalised (by the program, or by an earlier distributed::init that failed) and "
                 "cannot start again in this process; start a new process",
                 what);
      MPI_Initialized(&initialized);
      if (!initialized) {
        int provided = 0;
        KILN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
        owns_mpi_ = true;
        KILN_CHECK(provided >= MPI_THREAD_SERIALIZED,
                   "{}: this MPI library provides thread level {} but Kiln's communication thread needs "
                   "MPI_THREAD_SERIALIZED",
                   what, provided);
      } else {
        int provided = 0;
        MPI_Query_thread(&provided);
        KILN_CHECK(provided >= MPI_THREAD_SERIALIZED,
                   "{}: MPI was initialised by the program with thread level {}; Kiln makes its MPI calls "
                   "from its own thread: initialise with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...) "
                   "or let Kiln initialise MPI",
                   what, provided);
      }
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
      // MPI started alone in each process (srun without PMIx, say) would train N separate models.
      const WorldInfo env = world_info();
      KILN_CHECK(env.launcher == "none" || (env.rank == world_rank_ && env.size == world_size_),
                 "{}: the launcher ({}) says this is rank {} of {}, but MPI connected it as rank {} of {}: the "
                 "processes did not find each other. Start them with kiln-run or mpirun, or under Slurm with "
                 "`srun --mpi=pmix`",
                 what, env.launcher, env.rank, env.size, world_rank_, world_size_);
      KILN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_));
      KILN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_check_));
      MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN);
      MPI_Comm_set_errhandler(world_check_, MPI_ERRORS_RETURN);
      g_world_rank = world_rank_;
      MPI_Op_create(&reduce_floating<Half, 0>, 1, &ops_.half[0]);
      MPI_Op_create(&reduce_floating<Half, 1>, 1, &ops_.half[1]);
      MPI_Op_create(&reduce_floating<Half, 2>, 1, &ops_.half[2]);
      MPI_Op_create(&reduce_floating<BFloat16, 0>, 1, &ops_.bf16[0]);
      MPI_Op_create(&reduce_floating<BFloat16, 1>, 1, &ops_.bf16[1]);
      MPI_Op_create(&reduce_floating<BFloat16, 2>, 1, &ops_.bf16[2]);
      MPI_Op_create(&reduce_floating<float, 1>, 1, &ops_.f32[1]);
      MPI_Op_create(&reduce_floating<float, 2>, 1, &ops_.f32[2]);
      MPI_Op_create(&reduce_floating<double, 1>, 1, &ops_.f64[1]);
      MPI_Op_create(&reduce_floating<double, 2>, 1, &ops_.f64[2]);
      struct sigaction old {};
      if (sigaction(SIGTERM, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGTERM, on_sigterm);
    } catch (...) {
      // Undo what was set up, so that the process can still exit cleanly.
      if (world_ != MPI_COMM_NULL) MPI_Comm_free(&world_);
      if (world_check_ != MPI_COMM_NULL) MPI_Comm_free(&world_check_);
      if (owns_mpi_) MPI_Finalize();
      ready.set_exception(std::current_exception());
      return;
    }
    ready.set_value();
#ifdef __linux__
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);  // ns; see Note [two-speed polling]
#endif
    loop();
    // Stopping: free what this engine made, then finalise (unless an operation was abandoned on a
    // timeout: MPI_Finalize would wait for it forever, and its buffers must outlive MPI, so they
    // are leaked on purpose).
    for (auto& t : abandoned_tasks_) (void)t.release();
    if (!abandoned_) {
      for (auto& op : ops_.half) MPI_Op_free(&op);
      for (auto& op : ops_.bf16) MPI_Op_free(&op);
      for (int k : {1, 2}) {
        MPI_Op_free(&ops_.f32[k]);
        MPI_Op_free(&ops_.f64[k]);
      }
      MPI_Comm_free(&world_);
      MPI_Comm_free(&world_check_);
      if (owns_mpi_) MPI_Finalize();
    }
  }

  void loop() {
    std::list<std::unique_ptr<Task>> inflight;  // in submission order
    Clock::time_point last_moved = Clock::now();
    std::chrono::microseconds pause = kBackgroundPoll;
    for (;;) {
      std::deque<std::unique_ptr<Task>> fresh;
      {
        std::unique_lock<std::mutex> lock(m_);
        if (inflight.empty()) {
          cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
          if (queue_.empty() && stop_) return;
        }
        fresh.swap(queue_);
      }
      for (auto& t : fresh) {
        if (t->run_now) {
          std::exception_ptr error;
          try {
            t->run_now();
          } catch (...) {
            error = std::current_exception();
          }
          std::shared_ptr<Work::State> work = std::move(t->work);
          t.reset();
          work->complete(std::move(error));
          continue;
        }
        t->deadline = Clock::now() + t->timeout;
        inflight.push_back(std::move(t));
      }
      bool progressed = !fresh.empty();
      std::vector<MPI_Comm> blocked;  // communicators with a collective not yet posted
      auto is_blocked = [&](MPI_Comm c) { return std::find(blocked.begin(), blocked.end(), c) != blocked.end(); };
      // A finished task is erased before its Work completes: the tensors its lambdas hold must go
      // while the caller still waits (a caller that returns from main at once would otherwise
      // race this thread's destruction of them against the allocator's own).
      auto finish = [&](std::list<std::unique_ptr<Task>>::iterator& it, std::exception_ptr error) {
        std::shared_ptr<Work::State> work = std::move((*it)->work);
        it = inflight.erase(it);
        work->complete(std::move(error));
        progressed = true;
      };
      for (auto it = inflight.begin(); it != inflight.end();) {
        Task& t = **it;
        bool done = false;
        try {
          done = advance(t, t.ordered && is_blocked(t.comm), progressed);
        } catch (...) {
          finish(it, std::current_exception());
          continue;
        }
        if (done) {
          finish(it, nullptr);
          continue;
        }
        if (t.ordered && (t.phase < 2 || t.finish_is_collective)) blocked.push_back(t.comm);
        if (Clock::now() > t.deadline) {
          std::exception_ptr error = timed_out(t);  // or aborts the job
          // MPI may still write into its buffers: the task is kept, only its Work fails.
          std::shared_ptr<Work::State> work = t.work;
          abandoned_tasks_.push_back(std::move(*it));
          it = inflight.erase(it);
          work->complete(error);
          continue;
        }
        ++it;
      }
      set_current_op(inflight);
      // Poll while operations are in flight; see Note [two-speed polling].
      if (progressed) {
        last_moved = Clock::now();
        pause = kBackgroundPoll;
      } else if (blocked_waiters().load(std::memory_order_relaxed) > 0 || Clock::now() - last_moved < kHardPollWindow) {
        std::this_thread::yield();
        pause = kBackgroundPoll;
      } else {
        // A sleep that a new operation or a thread starting to wait cuts short (submit() and
        // wake_listener notify cv_).
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait_for(lock, pause,
                     [&] { return !queue_.empty() || blocked_waiters().load(std::memory_order_relaxed) > 0; });
        pause = std::min(2 * pause, kBackgroundPollMax);
      }
    }
  }

  // Moves a task along; true when it has finished.
  bool advance(Task& t, bool blocked, bool& progressed) {
    const char* what = t.work->what.c_str();
    if (t.phase == 0) {
      if (t.check) {
        const auto values = signature_check_values(t.signature);
        t.check_buf.assign(values.begin(), values.end());
        KILN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.check_buf.data(), static_cast<int>(t.check_buf.size()),
                                      MPI_INT64_T, MPI_MAX, t.check_comm, &t.check_req));
      }
      t.phase = 1;
      progressed = true;
    }
    if (t.phase == 1) {
      if (t.check) {
        int flag = 0;
        KILN_MPI_CHECK(MPI_Test(&t.check_req, &flag, MPI_STATUS_IGNORE));
        if (!flag) return false;
        t.check = false;
        progressed = true;
        verify(t);
      }
      if (blocked) return false;  // an earlier operation of this communicator is not posted yet
      if (!t.pair_check.empty()) {
        // all_to_all's pairing check, once the signatures agree (every rank asks for all_to_all on N
        // ranks, so every rank's buffer has 2 N^2 values): on the operation's own communicator, in
        // its place among the collectives, while the task still blocks the later ones.
        if (!t.pairs_posted) {
          t.pairs_posted = true;
          progressed = true;
          KILN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.pair_check.data(), static_cast<int>(t.pair_check.size()),
                                        MPI_INT64_T, MPI_MAX, t.comm, &t.check_req));
          return false;
        }
        int flag = 0;
        KILN_MPI_CHECK(MPI_Test(&t.check_req, &flag, MPI_STATUS_IGNORE));
        if (!flag) return false;
        progressed = true;
        const std::vector<int64_t> maxima = std::move(t.pair_check);
        t.pair_check.clear();
        check_pairs(t.work->what, t.pair_ranks, maxima.data());
      }
      t.post(t.reqs);
      t.statuses.resize(t.reqs.size());
      t.phase = 2;
      progressed = true;
    }
    int flag = 1;
    if (!t.reqs.empty()) {
      int rc = MPI_Testall(static_cast<int>(t.reqs.size()), t.reqs.data(), &flag, t.statuses.data());
      if (rc == MPI_ERR_IN_STATUS) {
        for (const auto& s : t.statuses) {
          if (s.MPI_ERROR != MPI_SUCCESS) rc = s.MPI_ERROR;
        }
      }
      if (rc != MPI_SUCCESS) {
        int error_class = 0;
        MPI_Error_class(rc, &error_class);
        KILN_CHECK(error_class != MPI_ERR_TRUNCATE,
                   "{}: the message that arrived is larger than this tensor; the sender's and receiver's tensors "
                   "must have the same dtype and number of elements",
                   what);
        KILN_FAIL("{}: MPI failed: {}", what, mpi_error_string(rc));
      }
    }
    if (!flag) return false;
    if (t.finish) t.finish();
    return true;
  }

  // After the check's all-reduce: equal maxima of the signature and of its negation mean equal
  // signatures everywhere.
  static void verify(const Task& t) { check_signature(t.work->what, t.signature, t.check_buf.data()); }

  // The Error of a task past its deadline; with abort_on_timeout it stops the job instead.
  std::exception_ptr timed_out(Task& t) {
    const std::string message =
        fmt::format("kiln: rank {}: {} did not complete within {:.3g} s: a rank did not take part (it died, hangs, "
                    "or called a different operation); stopping. Set the limit with KILN_COMM_TIMEOUT (seconds)",
                    world_rank_, t.work->what, t.timeout.count() / 1000.0);
    if (t.abort_on_timeout) {
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      _exit(1);
    }
    abandoned_ = true;  // its requests stay pending: MPI cannot cancel a collective
    if (t.broken) *t.broken = true;
    return std::make_exception_ptr(Error(message.substr(6)));  // without "kiln: "
  }

  static void set_current_op(const std::list<std::unique_ptr<Task>>& inflight) {
    const std::string& s = inflight.empty() ? std::string("no communication") : inflight.front()->work->what;
    const size_t n = std::min(s.size(), sizeof g_current_op - 1);
    if (std::strncmp(g_current_op, s.c_str(), n) == 0 && g_current_op[n] == '\0') return;
    std::memcpy(g_current_op, s.data(), n);
    g_current_op[n] = '\0';
  }

  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  // The engine, for the wait listener: a thread that starts to wait in Work::wait() cuts the
  // engine's sleep between polls short (Note [two-speed polling]).
  static inline std::atomic<Engine*> instance_{nullptr};
  static void wake_listener() {
    if (Engine* e = instance_.load()) {
      { std::lock_guard<std::mutex> lock(e->m_); }  // the engine is either before its check or asleep
      e->cv_.notify_one();
    }
  }
  std::deque<std::unique_ptr<Task>> queue_;
  bool stop_ = false;
  bool owns_mpi_ = false;
  bool abandoned_ = false;
  std::vector<std::unique_ptr<Task>> abandoned_tasks_;  // timed out; leaked at exit (see run())
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm world_check_ = MPI_COMM_NULL;
  int world_rank_ = 0;
  int world_size_ = 1;
  MpiOps ops_;
};

class MpiCommunicator final : public Communicator {
 public:
  // rank and size come from the engine thread: only it calls MPI.
  MpiCommunicator(MPI_Comm comm, MPI_Comm check_comm, int rank, int size, bool owned, const CommOptions& options)
      : comm_(comm), check_comm_(check_comm), owned_(owned), options_(options), rank_(rank), size_(size) {}
  ~MpiCommunicator() override {
    if (!owned_) return;
    // Operations still queued or in flight hold comm_ in their lambdas: wait until each has
    // completed (or failed at its deadline) before the handles are freed, as PyTorch's Work keeps
    // its process group alive. Freeing first made the engine post on a freed communicator.
    for (const auto& weak : outstanding_) {
      if (auto state = weak.lock()) state->wait_done();
    }
    MPI_Comm c = comm_, k = check_comm_;
    try {
      Engine::get().call("free a communicator", [c, k]() mutable {
        MPI_Comm_free(&c);
        MPI_Comm_free(&k);
      });
    } catch (...) {  // nothing to do in a destructor: the handles go with MPI_Finalize
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  uint64_t sequence_number() const override { return seq_; }

  Work all_reduce(const Tensor& t, ReduceOp op, bool async_op) override {
    check_tensor("all_reduce", t);
    check_written("all_reduce", t);
    auto task = collective("all_reduce", t, reduce_op_name(op));
    const char* what = task->work->what.c_str();
    sign(*task, kAllReduce, t, -1, op, {});
    Staging staging;
    Tensor h = staging.host(t, true, true);
    const bool widen = avg_in_float32(op, t.dtype());
    Tensor buf = widen ? h.to(kFloat32) : h;
    MPI_Op mop = mpi_op(Engine::get().ops(), op, buf.dtype(), what);
    const int n = to_int_count(t.numel(), what);
    task->post = [buf, n, mop, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), n, mpi_type(buf.dtype()), mop, c, &reqs[0]));
    };
    task->finish = average_finish(op, buf, h, size_);
    return launch(std::move(task), staging, async_op);
  }

  Work broadcast(const Tensor& t, int src, bool async_op) override {
    check_tensor("broadcast", t);
    check_written("broadcast", t);
    check_rank("broadcast", src, "src");
    auto task = collective("broadcast", t, fmt::format("from rank {}", src));
    const char* what = task->work->what.c_str();
    sign(*task, kBroadcast, t, src, ReduceOp::Sum, {});
    Staging staging;
    Tensor h = staging.host(t, rank_ == src, rank_ != src);
    const int n = to_int_count(t.numel(), what);
    task->post = [h, n, src, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Ibcast(h.data_ptr(), n, mpi_type(h.dtype()), src, c, &reqs[0]));
    };
    return launch(std::move(task), staging, async_op);
  }

  Work reduce(const Tensor& t, int dst, ReduceOp op, bool async_op) override {
    check_tensor("reduce", t);
    check_written("reduce", t);
    check_rank("reduce", dst, "dst");
    auto task = collective("reduce", t, fmt::format("{} to rank {}", reduce_op_name(op), dst));
    const char* what = task->work->what.c_str();
    sign(*task, kReduce, t, dst, op, {});
    Staging staging;
    Tensor h = staging.host(t, true, rank_ == dst);
    const bool widen = avg_in_float32(op, t.dtype());
    Tensor buf = widen ? h.to(kFloat32) : h;
    MPI_Op mop = mpi_op(Engine::get().ops(), op, buf.dtype(), what);
    const int n = to_int_count(t.numel(), what);
    const bool root = rank_ == dst;
    task->post = [buf, n, mop, dst, root, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Ireduce(root ? MPI_IN_PLACE : buf.data_ptr(), root ? buf.data_ptr() : nullptr, n,
                                 mpi_type(buf.dtype()), mop, dst, c, &reqs[0]));
    };
    if (root) task->finish = average_finish(op, buf, h, size_);
    return launch(std::move(task), staging, async_op);
  }

  Work all_gather(const std::vector<Tensor>& outputs, const Tensor& input, bool async_op) override {
    check_tensor("all_gather", input);
    const std::vector<int64_t> counts = per_rank_counts("all_gather", outputs, "outputs", input, "input", rank_, size_);
    for (const auto& o : outputs) check_written("all_gather", o);
    auto task = collective("all_gather", input, "");
    const char* what = task->work->what.c_str();
    sign(*task, kAllGather, input, -1, ReduceOp::Sum, counts);
    Staging staging;
    Tensor in = staging.host(input, true, false);
    std::vector<Tensor> outs;
    for (const auto& o : outputs) outs.push_back(staging.host(o, false, true));
    std::vector<int> cnt, displ;
    int64_t total = 0;
    for (int64_t c : counts) {
      displ.push_back(to_int_count(total, what));
      cnt.push_back(to_int_count(c, what));
      total += c;
    }
    Tensor flat = empty({total}, TensorOptions(input.dtype()));
    task->post = [in, flat, cnt, displ, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      const MPI_Datatype ty = mpi_type(in.dtype());
      KILN_MPI_CHECK(MPI_Iallgatherv(in.data_ptr(), static_cast<int>(in.numel()), ty, flat.data_ptr(),
                                     cnt.data(), displ.data(), ty, c, &reqs[0]));
    };
    task->finish = [flat, outs, displ] {
      const auto* src = static_cast<const char*>(flat.data_ptr());
      for (size_t r = 0; r < outs.size(); ++r) {
        std::memcpy(outs[r].data_ptr(), src + displ[r] * flat.element_size(), static_cast<size_t>(outs[r].nbytes()));
      }
    };
    return launch(std::move(task), staging, async_op);
  }

  Work all_gather_into_tensor(const Tensor& output, const Tensor& input, bool async_op) override {
    check_tensor("all_gather_into_tensor", input);
    check_tensor("all_gather_into_tensor", output, input);
    check_written("all_gather_into_tensor", output);
    KILN_CHECK(output.numel() == input.numel() * size_,
               "all_gather_into_tensor: the output has {} elements but {} ranks x {} input elements = {}",
               output.numel(), size_, input.numel(), input.numel() * size_);
    auto task = collective("all_gather_into_tensor", input, "");
    const char* what = task->work->what.c_str();
    sign(*task, kAllGatherTensor, input, -1, ReduceOp::Sum, {});
    const bool in_place = input.device() == output.device() &&
                          input.data_ptr() == static_cast<char*>(output.data_ptr()) + rank_ * input.nbytes();
    Staging staging;
    Tensor out = staging.host(output, in_place, true);
    Tensor in = in_place ? Tensor() : staging.host(input, true, false);
    // MPI forbids the input overlapping the output other than as this rank's slice (MPI_IN_PLACE);
    // one overlapping elsewhere (another rank's slice) is sent from a copy.
    if (!in_place && in.is_same(input) && bytes_overlap(input, output)) in = input.clone();
    const int n = to_int_count(input.numel(), what);
    task->post = [in, out, n, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      const MPI_Datatype ty = mpi_type(out.dtype());
      KILN_MPI_CHECK(MPI_Iallgather(in.defined() ? in.data_ptr() : MPI_IN_PLACE, n, ty, out.data_ptr(), n, ty, c,
                                    &reqs[0]));
    };
    return launch(std::move(task), staging, async_op);
  }

  Work reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op, bool async_op) override {
    check_tensor("reduce_scatter", output);
    check_written("reduce_scatter", output);
    const std::vector<int64_t> counts =
        per_rank_counts("reduce_scatter", inputs, "inputs", output, "output", rank_, size_);
    auto task = collective("reduce_scatter", output, reduce_op_name(op));
    const char* what = task->work->what.c_str();
    sign(*task, kReduceScatter, output, -1, op, counts);
    Staging staging;
    Tensor out = staging.host(output, false, true);
    std::vector<Tensor> flat_parts;
    for (const auto& i : inputs) flat_parts.push_back(i.to(Device::cpu()).flatten());
    const bool widen = avg_in_float32(op, output.dtype());
    Tensor flat = cat(flat_parts, 0).contiguous();
    if (widen) flat = flat.to(kFloat32);
    Tensor buf = widen ? empty(out.sizes(), TensorOptions(kFloat32)) : out;
    std::vector<int> cnt;
    for (int64_t c : counts) cnt.push_back(to_int_count(c, what));
    MPI_Op mop = mpi_op(Engine::get().ops(), op, buf.dtype(), what);
    task->post = [flat, buf, cnt, mop, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Ireduce_scatter(flat.data_ptr(), buf.data_ptr(), cnt.data(), mpi_type(buf.dtype()), mop, c,
                                         &reqs[0]));
    };
    task->finish = average_finish(op, buf, out, size_);
    return launch(std::move(task), staging, async_op);
  }

  Work reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op, bool async_op) override {
    check_tensor("reduce_scatter_tensor", output);
    check_written("reduce_scatter_tensor", output);
    check_tensor("reduce_scatter_tensor", input, output);
    KILN_CHECK(input.numel() == output.numel() * size_,
               "reduce_scatter_tensor: the input has {} elements but {} ranks x {} output elements = {}", input.numel(),
               size_, output.numel(), output.numel() * size_);
    auto task = collective("reduce_scatter_tensor", output, reduce_op_name(op));
    const char* what = task->work->what.c_str();
    sign(*task, kReduceScatterTensor, output, -1, op, {});
    Staging staging;
    const bool widen = avg_in_float32(op, output.dtype());
    Tensor in = staging.host(input, true, false);
    // MPI forbids the output overlapping the input; ZeRO's in-place use passes a slice of it.
    if (widen) {
      in = in.to(kFloat32);  // a copy, so no overlap either
    } else if (in.is_same(input) && bytes_overlap(input, output)) {
      in = input.clone();
    }
    Tensor out = staging.host(output, false, true);
    Tensor buf = widen ? empty(out.sizes(), TensorOptions(kFloat32)) : out;
    const int n = to_int_count(output.numel(), what);
    MPI_Op mop = mpi_op(Engine::get().ops(), op, buf.dtype(), what);
    task->post = [in, buf, n, mop, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(
          MPI_Ireduce_scatter_block(in.data_ptr(), buf.data_ptr(), n, mpi_type(buf.dtype()), mop, c, &reqs[0]));
    };
    task->finish = average_finish(op, buf, out, size_);
    return launch(std::move(task), staging, async_op);
  }

  Work all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs, bool async_op) override {
    const PairCounts counts = all_to_all_counts("all_to_all", outputs, inputs, rank_, size_);
    const DType dtype = inputs[0].dtype();
    auto task = new_task(describe_all_to_all(++seq_, dtype, counts));
    const char* what = task->work->what.c_str();
    sign(*task, kAllToAll, inputs[0], -1, ReduceOp::Sum, {});
    if (task->check) {
      task->pair_check = pair_check_values(rank_, size_, counts.send, counts.recv);
      task->pair_ranks = size_;
    }
    Staging staging;
    std::vector<Tensor> ins, outs;
    for (int r = 0; r < size_; ++r) {
      ins.push_back(staging.host(inputs[static_cast<size_t>(r)], true, false).reshape({-1}));
      outs.push_back(staging.host(outputs[static_cast<size_t>(r)], false, true));
    }
    // MPI_Alltoallv takes one buffer each way, with counts and offsets per rank.
    std::vector<int> scnt, sdispl, rcnt, rdispl;
    int64_t s_at = 0, r_at = 0;
    for (int r = 0; r < size_; ++r) {
      scnt.push_back(to_int_count(counts.send[static_cast<size_t>(r)], what));
      sdispl.push_back(to_int_count(s_at, what));
      rcnt.push_back(to_int_count(counts.recv[static_cast<size_t>(r)], what));
      rdispl.push_back(to_int_count(r_at, what));
      s_at += counts.send[static_cast<size_t>(r)];
      r_at += counts.recv[static_cast<size_t>(r)];
    }
    Tensor flat_in = counts.sent == 0 ? empty({0}, TensorOptions(dtype)) : cat(ins, 0).contiguous();
    Tensor flat_out = empty({counts.received}, TensorOptions(dtype));
    task->post = [flat_in, flat_out, scnt, sdispl, rcnt, rdispl, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      const MPI_Datatype ty = mpi_type(flat_in.dtype());
      KILN_MPI_CHECK(MPI_Ialltoallv(flat_in.data_ptr(), scnt.data(), sdispl.data(), ty, flat_out.data_ptr(),
                                    rcnt.data(), rdispl.data(), ty, c, &reqs[0]));
    };
    task->finish = [flat_out, outs, rdispl] {
      const auto* src = static_cast<const char*>(flat_out.data_ptr());
      for (size_t r = 0; r < outs.size(); ++r) {
        if (outs[r].numel() == 0) continue;
        std::memcpy(outs[r].data_ptr(), src + rdispl[r] * flat_out.element_size(), static_cast<size_t>(outs[r].nbytes()));
      }
    };
    return launch(std::move(task), staging, async_op);
  }

  Work send(const Tensor& t, int dst, int tag, bool async_op) override {
    check_tensor("send", t);
    check_rank("send", dst, "dst");
    KILN_CHECK(tag >= 0, "send: the tag must be >= 0, not {}", tag);
    check_send_dst(dst, rank_, async_op);
    auto task = new_task(describe_op("send", ++p2p_seq_, t, fmt::format("to rank {}, tag {}", dst, tag)));
    task->ordered = false;
    const char* what = task->work->what.c_str();
    Staging staging;
    Tensor h = staging.host(t, true, false);
    const int n = to_int_count(t.numel(), what);
    task->post = [h, n, dst, tag, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Isend(h.data_ptr(), n, mpi_type(h.dtype()), dst, tag, c, &reqs[0]));
    };
    return launch(std::move(task), staging, async_op);
  }

  Work recv(const Tensor& t, int src, int tag, bool async_op) override {
    check_tensor("recv", t);
    check_written("recv", t);
    check_rank("recv", src, "src");
    KILN_CHECK(tag >= 0, "recv: the tag must be >= 0, not {}", tag);
    auto task = new_task(describe_op("recv", ++p2p_seq_, t, fmt::format("from rank {}, tag {}", src, tag)));
    task->ordered = false;
    const char* what = task->work->what.c_str();
    Staging staging;
    Tensor h = staging.host(t, false, true);
    const int n = to_int_count(t.numel(), what);
    Task* raw = task.get();
    task->post = [h, n, src, tag, c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Irecv(h.data_ptr(), n, mpi_type(h.dtype()), src, tag, c, &reqs[0]));
    };
    task->finish = [raw, bytes = t.nbytes(), src, what] {
      int got = 0;
      MPI_Get_count(&raw->statuses[0], MPI_BYTE, &got);
      KILN_CHECK(got == bytes,
                 "{}: rank {} sent {} bytes but this tensor has {}; the sender's and receiver's tensors must have "
                 "the same dtype and number of elements",
                 what, src, got, bytes);
    };
    return launch(std::move(task), staging, async_op);
  }

  void barrier() override {
    auto task = new_task(fmt::format("barrier #{}", ++seq_));
    task->check = options_.check_collectives;
    task->signature = make_signature(seq_, kBarrier, Tensor(), -1, ReduceOp::Sum, {});
    task->post = [c = comm_, what = task->work->what.c_str()](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Ibarrier(c, &reqs[0]));
    };
    Staging none;
    launch(std::move(task), none, false);
  }

  // MPI_Comm_split blocks until every rank of the communicator calls it, and a blocked engine
  // thread could not enforce the timeout. So split is a collective like the others: its check and
  // an MPI_Ibarrier run under the deadline, and only once the barrier is complete (every rank has
  // called split) does the engine call MPI_Comm_split, which then has every rank at hand. The
  // check runs even with check_collectives off: without it a barrier on another rank would match
  // this Ibarrier, and MPI_Comm_split would wait for a rank that never calls it. One split at a
  // time per process: two threads splitting two communicators could otherwise reach their
  // MPI_Comm_splits in opposite orders on two ranks, a deadlock beyond any deadline.
  std::shared_ptr<Communicator> split(int color, int key) override {
    static std::mutex one_at_a_time;
    std::lock_guard<std::mutex> lock(one_at_a_time);
    auto task = new_task(fmt::format("split #{} (color {}, key {})", ++seq_, color, key));
    task->check = true;
    task->signature = make_signature(seq_, kSplit, Tensor(), -1, ReduceOp::Sum, {});
    struct Made {
      MPI_Comm sub = MPI_COMM_NULL, sub_check = MPI_COMM_NULL;
      int rank = 0, size = 0;
    };
    auto made = std::make_shared<Made>();
    task->finish_is_collective = true;
    const char* what = task->work->what.c_str();
    task->post = [c = comm_, what](std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      KILN_MPI_CHECK(MPI_Ibarrier(c, &reqs[0]));
    };
    task->finish = [made, c = comm_, color, key, what] {
      KILN_MPI_CHECK(MPI_Comm_split(c, color < 0 ? MPI_UNDEFINED : color, key, &made->sub));
      if (made->sub == MPI_COMM_NULL) return;
      KILN_MPI_CHECK(MPI_Comm_dup(made->sub, &made->sub_check));
      MPI_Comm_set_errhandler(made->sub, MPI_ERRORS_RETURN);
      MPI_Comm_set_errhandler(made->sub_check, MPI_ERRORS_RETURN);
      MPI_Comm_rank(made->sub, &made->rank);
      MPI_Comm_size(made->sub, &made->size);
    };
    Staging none;
    launch(std::move(task), none, false);
    if (made->sub == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiCommunicator>(made->sub, made->sub_check, made->rank, made->size, true, options_);
  }

 private:
  void check_rank(const char* op, int r, const char* name) const {
    KILN_CHECK(r >= 0 && r < size_, "{}: {} = {} is not a rank of this communicator (0 to {})", op, name, r, size_ - 1);
  }

  std::unique_ptr<Task> new_task(std::string what) {
    KILN_CHECK(!*broken_, "{}: this communicator stopped working after an earlier operation timed out", what);
    auto task = std::make_unique<Task>();
    task->work = std::make_shared<Work::State>(std::move(what));
    task->comm = comm_;
    task->check_comm = check_comm_;
    task->broken = broken_;
    task->timeout = options_.timeout;
    task->abort_on_timeout = options_.abort_on_timeout;
    return task;
  }
  // A numbered collective (the sequence number that the signature check and error messages use).
  std::unique_ptr<Task> collective(const char* op, const Tensor& t, const std::string& extra) {
    return new_task(describe_op(op, ++seq_, t, extra));
  }

  void sign(Task& task, OpCode code, const Tensor& t, int root, ReduceOp op, const std::vector<int64_t>& sizes) {
    task.check = options_.check_collectives;
    task.signature = make_signature(seq_, code, t, root, op, sizes);
  }

  Work launch(std::unique_ptr<Task> task, Staging& staging, bool async_op) {
    task->work->finisher = staging.finisher();
    Work w(task->work);
    if (owned_) {  // for the destructor; completed operations are dropped as new ones come
      std::erase_if(outstanding_, [](const std::weak_ptr<Work::State>& s) { return s.expired(); });
      outstanding_.push_back(task->work);
    }
    Engine::get().submit(std::move(task));
    if (!async_op) w.wait();
    return w;
  }

  MPI_Comm comm_, check_comm_;
  bool owned_;
  CommOptions options_;
  int rank_ = 0, size_ = 1;
  uint64_t seq_ = 0, p2p_seq_ = 0;
  std::vector<std::weak_ptr<Work::State>> outstanding_;  // of a sub-communicator, see the destructor
  std::shared_ptr<std::atomic<bool>> broken_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

bool mpi_available() { return true; }

void mpi_abort(int exit_code) {
  std::fflush(nullptr);
  if (g_world_rank >= 0) {  // the engine is up: MPI_Abort on its thread, which makes every MPI call
    auto task = std::make_unique<Task>();
    task->work = std::make_shared<Work::State>("distributed::abort_job");
    task->run_now = [exit_code] { MPI_Abort(MPI_COMM_WORLD, exit_code); };
    Engine::get().submit(std::move(task));
    // MPI_Abort ends this process. Should the engine be stuck in a blocking call, leaving without
    // MPI_Finalize still makes the launcher stop the job.
    std::this_thread::sleep_for(std::chrono::seconds(10));
  }
  std::_Exit(exit_code);
}

std::shared_ptr<Communicator> mpi_world(const CommOptions& options) {
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  Engine& engine = Engine::get();
  // One world communicator per process, as torch.distributed's default group; it stays usable
  // until exit (the engine owns its MPI handles).
  static std::shared_ptr<Communicator> world;
  if (!world) world = std::make_shared<MpiCommunicator>(engine.world(), engine.world_check(), engine.world_rank(),
                                              engine.world_size(), false, options);
  return world;
}

}  // namespace kiln::distributed

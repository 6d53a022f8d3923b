// cpu/parallel.cpp: a small fork-join pool. Workers wait on a generation counter: they spin briefly
// after a job (the next op usually follows within microseconds), then sleep on a condition variable,
// so an idle Kiln process leaves its cores alone. The caller and the workers claim a job's pieces
// from one counter (Note [claiming pieces]), so a worker descheduled by another process delays
// nothing it has not started.
#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KILN_CPU_RELAX() _mm_pause()
#else
#define KILN_CPU_RELAX() std::this_thread::yield()
#endif

#ifdef KILN_HAVE_OPENBLAS
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" int openblas_get_num_threads(void);
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));  // absent from serial builds
#endif

namespace kiln::cpu {
namespace {

// Note [OpenBLAS's own threads]
// Kiln's pool splits a product and each of its threads calls OpenBLAS, so OpenBLAS runs on one
// thread (cpu/matmul.cpp). But OpenBLAS's pthread build starts its own worker threads when the
// library loads, and each spins on sched_yield for about 2^28 cycles waiting for work that will
// never come. perf showed one such thread busy for the first 0.2 s of op_overhead on a 2-vCPU Zen 1,
// where its first case took 0.40-0.51 us per add against 0.29-0.31 us with OPENBLAS_NUM_THREADS=1.
// So while Kiln's statics are made, before main, OpenBLAS is set to one thread and its thread server
// is shut down (blas_thread_shutdown_, what OpenBLAS itself calls before a fork). OpenBLAS 0.3.21
// starts the server again on any openblas_set_num_threads call, even with 1, so that call is made
// only when the count is not 1 already, and is followed by the shutdown again.
void openblas_on_one_thread() {
#ifdef KILN_HAVE_OPENBLAS
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();  // returns at once when it is down
#endif
}
const bool openblas_quiet_at_load = (openblas_on_one_thread(), true);

thread_local bool inside_pool_job = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(std::max(1, threads)) {
    try {
      for (int w = 1; w < threads_; ++w) workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error& e) {  // the system's limit on threads (or their memory)
      stop();  // joins those that started: a joinable std::thread destroyed would terminate
      KILN_FAIL("set_num_threads({}): could not start thread {} ({}); ask for fewer threads", threads_,
                workers_.size() + 2, e.what());
    }
  }
  ~ThreadPool() { stop(); }
  int threads() const { return threads_; }

  void run(int pieces, int64_t begin, int64_t end, RangeFn fn, const void* ctx) {
    std::lock_guard<std::mutex> one_job_at_a_time(run_mutex_);
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    Job job;
    {
      // Note [job snapshot]: a worker copies the job and its generation together under this lock,
      // and claims pieces only while the claim counter carries that generation (Note [claiming
      // pieces]), so a worker that wakes late, after its job has finished and the next one is
      // published, runs nothing of either by mistake.
      std::lock_guard<std::mutex> lock(mutex_);
      const uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
      job = Job{pieces, begin, end, fn, ctx, generation};
      job_ = job;
      claim_.store(generation << 32, std::memory_order_relaxed);
      generation_.store(generation, std::memory_order_release);
    }
    cv_.notify_all();
    int finished = 0;
    for (int piece; (piece = claim(job)) >= 0; ++finished) run_piece(job, piece);
    if (finished < pieces) done_.fetch_add(finished, std::memory_order_acq_rel);
    // The pieces left are running on workers. Spin a little, then yield: on a loaded machine the
    // worker may be waiting for this very core.
    for (int spins = 0; finished < pieces && done_.load(std::memory_order_acquire) != pieces; ++spins) {
      if (spins < kSpinsBeforeYield) {
        KILN_CPU_RELAX();
      } else {
        std::this_thread::yield();
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  static constexpr int kSpinsBeforeYield = 2000;

  struct Job {
    int pieces = 0;
    int64_t begin = 0, end = 0;
    RangeFn fn = nullptr;
    const void* ctx = nullptr;
    uint64_t generation = 0;
  };

  // Note [claiming pieces]: the caller and the workers take pieces from one counter, whose high 32
  // bits hold the job's generation and low 32 bits the next piece. Whoever comes first runs a piece:
  // the caller runs them all when the workers are slow to wake (their core busy with another
  // process), instead of waiting for them. Which thread runs a piece never changes its range, so
  // results do not depend on it. Returns the piece claimed, or -1 when none is left.
  int claim(const Job& job) {
    const uint64_t tag = job.generation << 32;
    uint64_t current = claim_.load(std::memory_order_relaxed);
    for (;;) {
      if ((current & ~uint64_t{0xffffffff}) != tag) return -1;  // another job's counter
      const auto next = static_cast<int>(current & 0xffffffff);
      if (next >= job.pieces) return -1;
      if (claim_.compare_exchange_weak(current, current + 1, std::memory_order_acq_rel)) return next;
    }
  }

  void run_piece(const Job& job, int piece) {
    int64_t n = job.end - job.begin;
    // In 128 bits: n * piece passes 2^63 for n near it (a loop over the rows of an empty tensor's
    // huge other dims).
    const auto cut = [&](int k) { return job.begin + static_cast<int64_t>(static_cast<__int128>(n) * k / job.pieces); };
    int64_t b = cut(piece), e = cut(piece + 1);
    inside_pool_job = true;
    try {
      job.fn(job.ctx, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    inside_pool_job = false;
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      // Spin about 20-50 us for the next job, then sleep.
      for (int i = 0; i < 4000 && generation_.load(std::memory_order_acquire) == seen; ++i) {
        KILN_CPU_RELAX();
      }
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        seen = generation_.load(std::memory_order_acquire);  // See Note [job snapshot]
        if (stop_) return;
        job = job_;
      }
      int finished = 0;
      for (int piece; (piece = claim(job)) >= 0; ++finished) run_piece(job, piece);
      if (finished > 0) done_.fetch_add(finished, std::memory_order_acq_rel);
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_, mutex_, error_mutex_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claim_{0};  // Note [claiming pieces]
  std::atomic<int> done_{0};        // pieces finished by workers, and by the caller once it stops
  bool stop_ = false;
  Job job_;  // the current job, guarded by mutex_
  std::exception_ptr error_;
};

// The pool is shared: a caller holds it for the length of its job, so set_num_threads can replace it
// while another thread is using the old one. The last pool is leaked at exit on purpose: joining
// threads from static destructors can hang.
std::mutex pool_mutex;
std::shared_ptr<ThreadPool>* pool = new std::shared_ptr<ThreadPool>();

int default_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

std::shared_ptr<ThreadPool> get_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (!*pool) {
    *pool = std::make_shared<ThreadPool>(default_threads());
  }
  return *pool;
}

}  // namespace

static int pieces_for(const ThreadPool& p, int64_t n, int64_t grain) {
  int64_t by_grain = n / std::max<int64_t>(grain, 1);
  return static_cast<int>(std::min<int64_t>(p.threads(), std::max<int64_t>(by_grain, 1)));
}

int parallel_pieces(int64_t n, int64_t grain) {
  if (inside_pool_job || n <= grain) return 1;
  return pieces_for(*get_pool(), n, grain);
}

void parallel_for_impl(int64_t begin, int64_t end, int64_t grain, RangeFn fn, const void* ctx) {
  if (inside_pool_job || end - begin <= grain) {  // small or nested: run here, touch no pool
    fn(ctx, begin, end);
    return;
  }
  std::shared_ptr<ThreadPool> p = get_pool();  // one pool for the whole job (set_num_threads may swap it)
  int pieces = pieces_for(*p, end - begin, grain);
  if (pieces <= 1) {
    fn(ctx, begin, end);
    return;
  }
  p->run(pieces, begin, end, fn, ctx);
}

}  // namespace kiln::cpu

namespace kiln {

void set_num_threads(int n) {
  KILN_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got {}", n);
  std::lock_guard<std::mutex> lock(cpu::pool_mutex);
  cpu::openblas_on_one_thread();
  if (*cpu::pool && (*cpu::pool)->threads() == n) return;
  *cpu::pool = std::make_shared<cpu::ThreadPool>(n);  // a job still running keeps the old one alive
}

int get_num_threads() { return cpu::get_pool()->threads(); }

}  // namespace kiln

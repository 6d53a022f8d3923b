// cpu/parallel.cpp: a small fork-join pool. Workers wait on a generation counter: they spin briefly
// after a job (the next op usually follows within microseconds), then sleep on a condition variable,
// so an idle Kiln process leaves its cores alone.
#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
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
#endif

namespace kiln::cpu {
namespace {

thread_local bool inside_pool_job = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(std::max(1, threads)) {
    for (int w = 1; w < threads_; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  void run(int pieces, int64_t begin, int64_t end, RangeFn fn, const void* ctx) {
    std::lock_guard<std::mutex> one_job_at_a_time(run_mutex_);
    pieces_ = pieces;
    begin_ = begin;
    end_ = end;
    fn_ = fn;
    ctx_ = ctx;
    error_ = nullptr;
    pending_.store(pieces - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    run_piece(0);
    while (pending_.load(std::memory_order_acquire) != 0) KILN_CPU_RELAX();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run_piece(int piece) {
    int64_t n = end_ - begin_;
    int64_t b = begin_ + n * piece / pieces_, e = begin_ + n * (piece + 1) / pieces_;
    inside_pool_job = true;
    try {
      fn_(ctx_, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    inside_pool_job = false;
  }

  void worker_loop(int w) {
    uint64_t seen = 0;
    for (;;) {
      // Spin about 20-50 us for the next job, then sleep.
      for (int i = 0; i < 4000 && generation_.load(std::memory_order_acquire) == seen; ++i) {
        KILN_CPU_RELAX();
      }
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      if (w < pieces_) {
        run_piece(w);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_, mutex_, error_mutex_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  // The current job.
  int pieces_ = 0;
  int64_t begin_ = 0, end_ = 0;
  RangeFn fn_ = nullptr;
  const void* ctx_ = nullptr;
  std::exception_ptr error_;
};

std::mutex pool_mutex;
ThreadPool* pool = nullptr;  // leaked at exit on purpose: joining threads in static destructors hangs

int default_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

ThreadPool& get_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (pool == nullptr) {
#ifdef KILN_HAVE_OPENBLAS
    openblas_set_num_threads(1);  // Kiln's pool does the splitting: see matmul.cpp
#endif
    pool = new ThreadPool(default_threads());
  }
  return *pool;
}

}  // namespace

int parallel_pieces(int64_t n, int64_t grain) {
  if (inside_pool_job || n <= grain) return 1;
  int64_t by_grain = n / std::max<int64_t>(grain, 1);
  return static_cast<int>(std::min<int64_t>(get_pool().threads(), std::max<int64_t>(by_grain, 1)));
}

void parallel_for_impl(int64_t begin, int64_t end, int64_t grain, RangeFn fn, const void* ctx) {
  int pieces = parallel_pieces(end - begin, grain);
  if (pieces <= 1) {
    fn(ctx, begin, end);
    return;
  }
  get_pool().run(pieces, begin, end, fn, ctx);
}

}  // namespace kiln::cpu

namespace kiln {

void set_num_threads(int n) {
  KILN_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got {}", n);
  std::lock_guard<std::mutex> lock(cpu::pool_mutex);
#ifdef KILN_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
  if (cpu::pool != nullptr && cpu::pool->threads() == n) return;
  delete cpu::pool;
  cpu::pool = new cpu::ThreadPool(n);
}

int get_num_threads() { return cpu::get_pool().threads(); }

}  // namespace kiln

// distributed/comm/communicator.cpp: Work, the launcher's environment, and init() choosing a
// backend.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <optional>

#include "distributed/comm/backends.h"
#include "distributed/comm/comms_logger.h"
#include "distributed/comm/work.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace kiln::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

// ---- Work ----

void Work::State::complete(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(m);
    error = std::move(e);
    done = true;
  }
  cv.notify_all();
}

std::atomic<int>& blocked_waiters() {
  static std::atomic<int> count{0};
  return count;
}

namespace {
std::atomic<void (*)()> g_wait_listener{nullptr};
}  // namespace

void set_wait_listener(void (*listener)()) { g_wait_listener.store(listener); }

void Work::State::wait_done() {
  std::unique_lock<std::mutex> lock(m);
  if (done) return;
  blocked_waiters().fetch_add(1, std::memory_order_relaxed);
  if (auto* wake = g_wait_listener.load()) {
    lock.unlock();  // the listener takes the backend's own lock
    wake();
    lock.lock();
  }
  cv.wait(lock, [&] { return done; });
  blocked_waiters().fetch_sub(1, std::memory_order_relaxed);
}

void Work::wait() const {
  if (!state_) return;
  if (state_->stream_wait) {  // a device-stream operation (NCCL): order, don't block
    {
      std::lock_guard<std::mutex> lock(state_->m);
      if (state_->error) std::rethrow_exception(state_->error);
    }
    state_->stream_wait();
    return;
  }
  state_->wait_done();
  std::unique_lock<std::mutex> lock(state_->m);
  if (state_->error) std::rethrow_exception(state_->error);
  if (state_->finisher) {
    auto finish = std::move(state_->finisher);
    state_->finisher = nullptr;
    finish();
  }
}

bool Work::is_completed() const {
  if (!state_) return true;
  {
    std::lock_guard<std::mutex> lock(state_->m);
    if (state_->done) return true;
  }
  return state_->query && state_->query();
}

std::string Work::describe() const { return state_ ? state_->what : "(nothing)"; }

// ---- shared pieces ----

// The host copy is pinned memory (Note [pinned host memory] in cuda/host_allocator.cpp): the copy in
// runs at the copy engines' speed without the driver's staging, and the copy back is queued on the
// waiting thread's current stream without the host waiting for it (Note [non_blocking copies] in
// cuda/copy.cpp), which orders later work there after it, as wait() promises.
Tensor Staging::host(const Tensor& t, bool copy_in, bool copy_out) {
  if (t.device().is_cpu()) return t;
  Tensor h = empty(t.sizes(), TensorOptions(t.dtype()).pinned_memory(true));
  if (copy_in) h.copy_(t.detach());  // synchronous: MPI reads h next
  if (copy_out) copy_back.emplace_back(t, h);
  return h;
}

std::function<void()> Staging::finisher() {
  if (copy_back.empty()) return {};
  return [pairs = std::move(copy_back)] {
    // Tensors are handles: the copies write into the originals. An inference tensor was let through
    // when the op began (check_written), so its copy back is allowed on a waiting thread outside the mode.
    for (auto [dev, h] : pairs) {
      std::optional<InferenceMode> writable;
      if (dev.is_inference()) writable.emplace();
      dev.copy_(h, /*non_blocking=*/true);
    }
  };
}

std::string describe_op(const char* op, uint64_t number, const Tensor& t, const std::string& extra) {
  return fmt::format("{} #{} ({}, {} elements{}{})", op, number, dtype_name(t.dtype()), t.numel(),
                     extra.empty() ? "" : ", ", extra);
}

namespace {
// FNV-1a of the bytes, shifted right by 2: a non-negative int64 whose negation does not overflow.
int64_t hash_bytes(const void* data, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  return static_cast<int64_t>(h >> 2);
}

int64_t hash_sizes(const std::vector<int64_t>& sizes) {  // of the per-rank element counts
  return hash_bytes(sizes.data(), sizes.size() * sizeof(int64_t));
}
}  // namespace

Signature make_signature(uint64_t seq, OpCode code, const Tensor& t, int root, ReduceOp op,
                         const std::vector<int64_t>& sizes) {
  if (code == kBarrier || code == kSplit) return {static_cast<int64_t>(seq), code, -1, 0, 0, -1, 0};
  // all_to_all's sizes pair up across ranks (check_pairs), so its count is 0 too.
  const int64_t count = sizes.empty() && code != kAllToAll ? t.numel() : 0;
  return {static_cast<int64_t>(seq), code, static_cast<int64_t>(t.dtype()), count, root,
          static_cast<int64_t>(op), sizes.empty() ? 0 : hash_sizes(sizes)};
}

std::array<int64_t, 2 * kSignatureLen> signature_check_values(const Signature& sig) {
  std::array<int64_t, 2 * kSignatureLen> v{};
  for (int i = 0; i < kSignatureLen; ++i) {
    v[static_cast<size_t>(i)] = sig[static_cast<size_t>(i)];
    v[static_cast<size_t>(kSignatureLen + i)] = -sig[static_cast<size_t>(i)];
  }
  return v;
}

void check_signature(const std::string& what, const Signature& mine, const int64_t* maxima) {
  static constexpr const char* kFields[kSignatureLen] = {"sequence number", "operation", "dtype", "element count",
                                                         "root rank", "reduce op", "per-rank sizes"};
  static constexpr const char* kOpNames[] = {"?", "all_reduce", "broadcast", "reduce", "all_gather",
                                             "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                                             "barrier", "split", "all_to_all"};
  static_assert(std::size(kOpNames) == kAllToAll + 1);
  auto differs = [&](int i) {
    const int64_t m = mine[static_cast<size_t>(i)];
    return maxima[i] != m || -maxima[kSignatureLen + i] != m;
  };
  // Different operations: their other fields do not compare (a barrier has no dtype), so the
  // message names the two operations only.
  if (differs(1)) {
    const int64_t m = mine[1], hi = maxima[1], lo = -maxima[kSignatureLen + 1];
    auto name = [](int64_t v) { return v >= 1 && v <= kAllToAll ? kOpNames[v] : "an unknown operation"; };
    KILN_FAIL("{}: the ranks called different collectives: this rank called {}, another rank {}. Every rank must call "
              "the same collectives in the same order, with matching tensors",
              what, name(m), name(hi != m ? hi : lo));
  }
  std::string diffs;
  for (int i = 0; i < kSignatureLen; ++i) {
    if (!differs(i)) continue;
    if (i == 6) {  // a hash of the lists, which says only that they differ
      diffs += fmt::format("{}per-rank sizes (the lists of every rank's element count, one per rank, are not the "
                           "same list on every rank)", diffs.empty() ? "" : "; ");
      continue;
    }
    const int64_t m = mine[static_cast<size_t>(i)], hi = maxima[i], lo = -maxima[kSignatureLen + i];
    auto show = [&](int64_t v) -> std::string {
      if (i == 2 && v >= 0 && v <= static_cast<int64_t>(kFloat64)) {
        return std::string(dtype_name(static_cast<DType>(v)));
      }
      if (i == 5 && v >= 0 && v <= static_cast<int64_t>(ReduceOp::Min)) {
        return std::string(reduce_op_name(static_cast<ReduceOp>(v)));
      }
      return std::to_string(v);
    };
    diffs += fmt::format("{}{} (this rank {}, the ranks range from {} to {})", diffs.empty() ? "" : "; ", kFields[i],
                         show(m), show(lo), show(hi));
  }
  KILN_CHECK(diffs.empty(),
             "{}: the ranks called different collectives or with different sizes: {}. Every rank must call the "
             "same collectives in the same order, with matching tensors",
             what, diffs);
}

namespace {
constexpr int64_t kNoCount = std::numeric_limits<int64_t>::min();  // below every count
}  // namespace

std::vector<int64_t> pair_check_values(int rank, int size, const std::vector<int64_t>& send,
                                       const std::vector<int64_t>& recv) {
  if (size > kMaxPairCheckRanks) return {};
  const auto n = static_cast<size_t>(size), me = static_cast<size_t>(rank);
  std::vector<int64_t> v(2 * n * n, kNoCount);
  for (size_t r = 0; r < n; ++r) v[me * n + r] = send[r];          // row me of the sends
  for (size_t s = 0; s < n; ++s) v[n * n + s * n + me] = recv[s];  // column me of the receives
  return v;
}

void check_pairs(const std::string& what, int size, const int64_t* maxima) {
  const auto n = static_cast<size_t>(size);
  for (size_t cell = 0; cell < n * n; ++cell) {
    const int64_t sent = maxima[cell], expected = maxima[n * n + cell];
    KILN_CHECK(sent == expected,
               "{}: rank {} sends {} elements to rank {} (its inputs[{}]), which expects {} (its outputs[{}]); what "
               "rank i sends to rank r must be as large as what rank r receives from rank i",
               what, cell / n, sent, cell % n, cell % n, expected, cell / n);
  }
}

void check_tensor(const char* op, const Tensor& t, const Tensor& like) {
  KILN_CHECK(t.defined(), "{}: the tensor is undefined", op);
  KILN_CHECK(t.is_contiguous(),
             "{}: the tensor (shape {}) is not contiguous; communication works in place on contiguous "
             "tensors: pass t.contiguous() and read the result from that tensor",
             op, t.sizes().str());
  if (like.defined()) {
    KILN_CHECK(t.dtype() == like.dtype() && t.device() == like.device(),
               "{}: all tensors must have one dtype and device, but got {} on {} and {} on {}", op,
               dtype_name(t.dtype()), t.device().str(), dtype_name(like.dtype()), like.device().str());
  }
}

void check_written(const char* op, const Tensor& t) { check_inference_write(t, op); }

bool bytes_overlap(const Tensor& a, const Tensor& b) {
  const char* a_begin = static_cast<const char*>(a.data_ptr());
  const char* b_begin = static_cast<const char*>(b.data_ptr());
  return a.device() == b.device() && a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

void check_send_dst(int dst, int rank, bool async_op) {
  KILN_CHECK(dst != rank || async_op,
             "send: a blocking send to this rank itself (dst = {}) never completes, because the recv that would "
             "match it cannot be posted until it returns; send with async_op = true, then recv, then wait()",
             dst);
}

PairCounts all_to_all_counts(const char* op, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                             int rank, int size) {
  KILN_CHECK(static_cast<int>(inputs.size()) == size && static_cast<int>(outputs.size()) == size,
             "{}: got {} outputs and {} inputs for {} ranks; pass one of each per rank", op, outputs.size(),
             inputs.size(), size);
  PairCounts c;
  for (int r = 0; r < size; ++r) {
    const Tensor& in = inputs[static_cast<size_t>(r)];
    const Tensor& out = outputs[static_cast<size_t>(r)];
    check_tensor(op, in, inputs[0]);
    check_tensor(op, out, inputs[0]);
    check_written(op, out);
    c.send.push_back(in.numel());
    c.recv.push_back(out.numel());
    c.sent += in.numel();
    c.received += out.numel();
  }
  const auto me = static_cast<size_t>(rank);
  KILN_CHECK(c.send[me] == c.recv[me], "{}: this rank ({}) sends {} elements to itself (inputs[{}]) but outputs[{}] has {}",
             op, rank, c.send[me], rank, rank, c.recv[me]);
  return c;
}

std::string describe_all_to_all(uint64_t number, DType dtype, const PairCounts& counts) {
  return fmt::format("all_to_all #{} ({}, {} elements out, {} in)", number, dtype_name(dtype), counts.sent,
                     counts.received);
}

std::vector<int64_t> per_rank_counts(const char* op, const std::vector<Tensor>& list, const char* list_name,
                                     const Tensor& mine, const char* mine_name, int rank, int size) {
  KILN_CHECK(static_cast<int>(list.size()) == size, "{}: got {} {} tensors for {} ranks; pass one per rank", op,
             list.size(), list_name, size);
  std::vector<int64_t> counts;
  for (const auto& t : list) {
    check_tensor(op, t, mine);
    counts.push_back(t.numel());
  }
  const int64_t expected = counts[static_cast<size_t>(rank)];
  KILN_CHECK(expected == mine.numel(), "{}: this rank's ({}) {} has {} elements but {}[{}] has {}", op, rank,
             mine_name, mine.numel(), list_name, rank, expected);
  return counts;
}

// ---- the launcher's environment ----

namespace {
using Getenv = std::function<const char*(const char*)>;

bool env_int(const Getenv& env, const char* name, int& out) {
  const char* v = env(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  KILN_CHECK(*end == '\0' && x >= 0 && x < (1 << 24),
             "distributed: the environment variable {}='{}' is not a rank or a count", name, v);
  out = static_cast<int>(x);
  return true;
}

// The tasks of this srun step on node `node` (SLURM_NODEID), from SLURM_STEP_TASKS_PER_NODE: one
// count per node, a run of equal ones written "count(xnodes)", e.g. "4(x2),3" for 4, 4 and 3.
int slurm_tasks_on_node(const Getenv& env, int node) {
  const char* name = "SLURM_STEP_TASKS_PER_NODE";
  const char* v = env(name);
  if (!v || !*v) return 1;
  const char* p = v;
  auto number = [&] {
    char* end = nullptr;
    const long x = std::strtol(p, &end, 10);
    KILN_CHECK(end != p && x >= 1 && x < (1 << 24),
               "distributed: the environment variable {}='{}' is not a list of task counts as srun writes it "
               "(like \"4(x2),3\")",
               name, v);
    p = end;
    return static_cast<int>(x);
  };
  int64_t first = 0;  // the first node of the current run
  while (true) {
    const int count = number();
    int nodes = 1;
    if (*p == '(') {
      KILN_CHECK(p[1] == 'x', "distributed: {}='{}': expected \"(x\" after a task count", name, v);
      p += 2;
      nodes = number();
      KILN_CHECK(*p == ')', "distributed: {}='{}': expected \")\" after \"(x{}\"", name, v, nodes);
      ++p;
    }
    if (node < first + nodes) return count;
    first += nodes;
    if (*p == '\0') break;
    KILN_CHECK(*p == ',', "distributed: {}='{}': expected \",\" between task counts", name, v);
    ++p;
  }
  KILN_FAIL("distributed: SLURM_NODEID={} but {}='{}' lists tasks for {} nodes", node, name, v, first);
}
}  // namespace

WorldInfo world_info() { return world_info([](const char* name) { return std::getenv(name); }); }

WorldInfo world_info(const std::function<const char*(const char*)>& env) {
  WorldInfo w;
  // Rank and size come as a pair; a launcher counts only when both of its variables are set.
  // mpirun and PMI launchers always set both, so half of their pair is a broken environment, not
  // "no launcher" (rank 0 of 1 on every rank would train the same model n times, unaware). Half of
  // Slurm's (a batch script) or torchrun's (a stray RANK) pair is no launcher.
  auto rank_and_size = [&](const char* rank, const char* size, bool pair_required = false) {
    int r = 0, n = 0;
    const bool has_rank = env_int(env, rank, r), has_size = env_int(env, size, n);
    KILN_CHECK(!pair_required || has_rank == has_size,
               "distributed: {} is set but {} is not; start the program through its launcher, or unset the "
               "variable left in the environment",
               has_rank ? rank : size, has_rank ? size : rank);
    if (!has_rank || !has_size) return false;
    w.rank = r;
    w.size = n;
    return true;
  };
  // PMI's variables come before Slurm's: MPICH's and Intel MPI's mpiexec start their per-node
  // proxies with srun, so their ranks carry the proxy's SLURM_PROCID (a node number) as well.
  if (rank_and_size("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", true)) {
    w.launcher = "mpirun";
    if (!env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", w.local_rank)) w.local_rank = w.rank;
    if (!env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", w.local_size)) w.local_size = w.size;
  } else if (rank_and_size("PMI_RANK", "PMI_SIZE", true)) {
    w.launcher = "pmi";
    if (!env_int(env, "MPI_LOCALRANKID", w.local_rank)) w.local_rank = 0;
    if (!env_int(env, "MPI_LOCALNRANKS", w.local_size)) w.local_size = 1;
  } else if (rank_and_size("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")) {
    // A task of an srun step. (A batch script has SLURM_PROCID and SLURM_NTASKS too, for the whole
    // allocation, but it is one process: only srun's steps set the SLURM_STEP_* variables.)
    w.launcher = "srun";
    if (!env_int(env, "SLURM_LOCALID", w.local_rank)) w.local_rank = 0;
    int node = 0;
    env_int(env, "SLURM_NODEID", node);
    w.local_size = slurm_tasks_on_node(env, node);
  } else if (rank_and_size("RANK", "WORLD_SIZE")) {
    w.launcher = "torchrun";
    if (!env_int(env, "LOCAL_RANK", w.local_rank)) w.local_rank = 0;
    if (!env_int(env, "LOCAL_WORLD_SIZE", w.local_size)) w.local_size = 1;
  }
  KILN_CHECK(w.size >= 1 && w.rank < w.size && w.local_rank < std::max(w.local_size, 1) && w.local_size <= w.size,
             "distributed: the launcher ({}) says rank {} of {} (local rank {} of {}), which is inconsistent; "
             "start the program through its launcher, or unset that launcher's variables left in the environment",
             w.launcher, w.rank, w.size, w.local_rank, w.local_size);
  return w;
}

// ---- init ----

bool is_available(const std::string& backend) {
  if (backend == "mpi") return mpi_available();
  if (backend == "nccl") return nccl_available();
  return false;
}

void abort_job(int exit_code) { mpi_abort(exit_code); }

bool same_on_every_rank(Communicator& comm, std::string_view bytes) {
  const int64_t h = hash_bytes(bytes.data(), bytes.size());
  Tensor extremes = from_vector<int64_t>({h, -h}).to(comm.device());  // NCCL: on its GPU
  CommCaller caller("same_on_every_rank");
  comm.all_reduce(extremes, ReduceOp::Max);
  const auto e = extremes.to_vector<int64_t>();
  return e[0] == -e[1];  // the largest hash equals the smallest
}

namespace {
constexpr double kMaxTimeoutSeconds = 365.0 * 24 * 3600;  // longer timeouts are cut to a year
}  // namespace

std::shared_ptr<Communicator> init(const std::string& backend, const CommOptions& options) {
  CommOptions o = options;
  if (const char* t = std::getenv("KILN_COMM_TIMEOUT"); t && *t) {
    char* end = nullptr;
    double seconds = std::strtod(t, &end);
    // strtod reads hexadecimal too ("0x10" is 16): a decimal number only.
    KILN_CHECK(*end == '\0' && std::strpbrk(t, "xX") == nullptr && seconds >= 0.001,
               "distributed: KILN_COMM_TIMEOUT='{}' must be a number of seconds, at least 0.001", t);
    // Past a year means "never" in practice; larger values (inf, 1e20) would overflow the deadline.
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::min(seconds, kMaxTimeoutSeconds) * 1000));
  }
  KILN_CHECK(o.timeout.count() >= 1, "distributed::init: CommOptions::timeout must be at least 1 ms, not {} ms",
             o.timeout.count());
  o.timeout = std::min(o.timeout, std::chrono::milliseconds(static_cast<int64_t>(kMaxTimeoutSeconds * 1000)));
  if (backend == "mpi") return mpi_world(o);
  if (backend == "nccl") return nccl_world(o);
  KILN_FAIL("distributed::init: unknown backend '{}'; use \"mpi\" (CPU tensors, and CUDA tensors through host "
            "memory) or \"nccl\" (CUDA tensors)",
            backend);
}

}  // namespace kiln::distributed

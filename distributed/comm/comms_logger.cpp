// distributed/comm/comms_logger.cpp: the communication logger and the communicator that feeds it
// (see comms_logger.h).
#include "distributed/comm/comms_logger.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda/cuda.h"
#include "ops/ops.h"

namespace kiln::distributed {

// ---- the figures ----

CommBandwidth comm_bandwidth(std::string_view op, double msg_bytes, double latency_ms, int n) {
  KILN_CHECK(n >= 1, "comm_bandwidth: the communicator's size is {}; it must be at least 1", n);
  if (latency_ms <= 0) return {0, 0};
  const double per_ms = msg_bytes / latency_ms;  // bytes per millisecond
  const double share = static_cast<double>(n - 1) / n;
  double algbw = 0, busbw = 0;
  if (op == "all_reduce") {
    algbw = 2 * per_ms;  // every byte goes out and comes back
    busbw = per_ms * 2 * share;
  } else if (op == "all_gather" || op == "all_gather_into_tensor" || op == "reduce_scatter" ||
             op == "reduce_scatter_tensor") {
    algbw = n * per_ms;  // the whole gathered (or scattered) tensor
    busbw = n * per_ms * share;
  } else if (op == "all_to_all") {  // DeepSpeed's all_to_all_single: S is what this rank sends
    algbw = per_ms;
    busbw = per_ms * share;
  } else if (op == "broadcast" || op == "reduce" || op == "send" || op == "recv" || op == "barrier") {
    algbw = busbw = per_ms;
  } else {
    KILN_FAIL("comm_bandwidth: '{}' is not a communication operation; the operations are all_reduce, broadcast, "
              "reduce, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all, send, recv, "
              "barrier",
              op);
  }
  // bytes/ms x 8 bits / 10^6 = 10^9 bits/s
  return {algbw * 8 / 1e6, busbw * 8 / 1e6};
}

std::string convert_size(int64_t bytes) {
  if (bytes <= 0) return "0B";
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int i = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && i + 1 < static_cast<int>(std::size(kUnits))) {
    v /= 1024;
    ++i;
  }
  // Python's str(round(v, 2)): at most two decimals, at least one.
  std::string s = fmt::format("{:.2f}", std::round(v * 100) / 100);
  if (s.back() == '0') s.pop_back();
  return s + " " + kUnits[i];
}

double trim_mean(std::vector<double> values, double trim) {
  KILN_CHECK(trim >= 0 && trim < 0.5, "trim_mean: trim is {}; it must be in [0, 0.5)", trim);
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const auto k = static_cast<size_t>(std::nearbyint(static_cast<double>(n) * trim));  // half to even
  const double sum = std::accumulate(values.begin() + static_cast<std::ptrdiff_t>(k),
                                     values.end() - static_cast<std::ptrdiff_t>(k), 0.0);
  return sum / static_cast<double>(n - 2 * k);
}

// ---- the logger ----

CommsLogger::CommsLogger(CommsLoggerOptions options, bool prints) : options_(std::move(options)), prints_(prints) {
  for (const std::string& op : options_.prof_ops) {
    KILN_CHECK(std::find(std::begin(kCommOpNames), std::end(kCommOpNames), op) != std::end(kCommOpNames),
               "comms_logger: prof_ops names '{}', which is not a communication operation; name some of all_reduce, "
               "broadcast, reduce, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, "
               "all_to_all, send, recv, barrier", op);
  }
}

bool CommsLogger::profiles(std::string_view op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!options_.enabled) return false;
  return options_.prof_all || std::find(options_.prof_ops.begin(), options_.prof_ops.end(), op) != options_.prof_ops.end();
}

void CommsLogger::start_profiling_comms() {
  std::lock_guard<std::mutex> lock(mutex_);
  options_.prof_all = true;
}
void CommsLogger::stop_profiling_comms() {
  std::lock_guard<std::mutex> lock(mutex_);
  options_.prof_all = false;
}
void CommsLogger::start_profiling_op(const std::vector<std::string>& ops) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const std::string& op : ops) {
    if (std::find(options_.prof_ops.begin(), options_.prof_ops.end(), op) == options_.prof_ops.end()) {
      options_.prof_ops.push_back(op);
    }
  }
}
void CommsLogger::stop_profiling_op(const std::vector<std::string>& ops) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(options_.prof_ops, [&](const std::string& op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); });
}

void CommsLogger::append(std::string_view op, const std::string& record, double latency_ms, int64_t msg_bytes, int n) {
  const CommBandwidth bw = comm_bandwidth(op, static_cast<double>(msg_bytes), latency_ms, n);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(records_.begin(), records_.end(), [&](const auto& r) { return r.first == record; });
    if (it == records_.end()) it = records_.insert(records_.end(), {record, {}});
    Entry& e = it->second[msg_bytes];
    ++e.count;
    e.latency_ms.push_back(latency_ms);
    e.algbw_gbps.push_back(bw.algbw_gbps);
    e.busbw_gbps.push_back(bw.busbw_gbps);
  }
  if (options_.verbose && prints_) {
    std::printf("[kiln] comm op: %s | time (ms): %.2f | msg size: %s | algbw (Gbps): %.2f | busbw (Gbps): %.2f\n",
                record.c_str(), latency_ms, convert_size(msg_bytes).c_str(), bw.algbw_gbps, bw.busbw_gbps);
  }
}

std::vector<std::pair<std::string, std::map<int64_t, CommsLogger::Entry>>> CommsLogger::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_;
}

std::string CommsLogger::summary() const {
  const auto records = this->records();
  if (records.empty()) return "";
  std::string out = fmt::format("{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}\n", "Comm. Op", "Message Size", "Count",
                                "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
  for (const auto& [name, sizes] : records) {
    out += name + "\n";
    for (const auto& [bytes, e] : sizes) {
      const double total = std::accumulate(e.latency_ms.begin(), e.latency_ms.end(), 0.0);
      out += fmt::format("{:<20}{:<20}{:<20}{:<20.2f}{:<20.2f}{:<20.2f}{:<20.2f}\n", "", convert_size(bytes), e.count,
                         total, trim_mean(e.latency_ms, 0.1), trim_mean(e.algbw_gbps, 0.1),
                         trim_mean(e.busbw_gbps, 0.1));
    }
  }
  return out;
}

namespace {
class LoggingCommunicator;
Communicator& unlogged(Communicator& comm);
}  // namespace

std::string CommsLogger::straggler_summary(Communicator& logged) const {
  Communicator& comm = unlogged(logged);
  const auto records = this->records();
  // Every rank must hold the same entries, or the element-wise minimum below would pair latencies
  // of different operations (or wait for ranks that have fewer).
  std::string layout;
  std::vector<double> latencies;
  for (const auto& [name, sizes] : records) {
    for (const auto& [bytes, e] : sizes) {
      layout += fmt::format("{}\n{}\n{}\n", name, bytes, e.count);
      latencies.insert(latencies.end(), e.latency_ms.begin(), e.latency_ms.end());
    }
  }
  KILN_CHECK(same_on_every_rank(comm, layout),
             "CommsLogger::straggler_summary: the ranks logged different operations (names, message sizes or "
             "counts differ; this rank logged {} records); the breakdown compares each operation's time across the "
             "ranks, so every rank must have logged the same ones: pipeline stages, for one, send different "
             "messages; call summary() instead", records.size());
  if (latencies.empty()) return "";
  Tensor least = from_vector<double>(latencies).to(comm.device());
  comm.all_reduce(least, ReduceOp::Min);
  const std::vector<double> mins = least.to_vector<double>();
  std::string out = "_______________________________\nBreakdown with straggler effect\n-------------------------------\n";
  out += fmt::format("{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}\n", "Comm. Op", "Message Size", "Count",
                     "Total comm lat(ms)", "Total straggler(ms)", "Avg comm lat(ms)", "Avg straggler(ms)");
  size_t at = 0;
  for (const auto& [name, sizes] : records) {
    out += name + "\n";
    for (const auto& [bytes, e] : sizes) {
      std::vector<double> comm_ms(mins.begin() + static_cast<std::ptrdiff_t>(at),
                                  mins.begin() + static_cast<std::ptrdiff_t>(at + e.latency_ms.size()));
      std::vector<double> straggler_ms(comm_ms.size());
      for (size_t k = 0; k < comm_ms.size(); ++k) straggler_ms[k] = e.latency_ms[k] - comm_ms[k];
      at += e.latency_ms.size();
      out += fmt::format("{:<20}{:<20}{:<20}{:<20.2f}{:<20.2f}{:<20.2f}{:<20.2f}\n", "", convert_size(bytes), e.count,
                         std::accumulate(comm_ms.begin(), comm_ms.end(), 0.0),
                         std::accumulate(straggler_ms.begin(), straggler_ms.end(), 0.0), trim_mean(comm_ms, 0.1),
                         trim_mean(straggler_ms, 0.1));
    }
  }
  return out;
}

void CommsLogger::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.clear();
}

// ---- the caller's name ----

namespace {
thread_local const char* t_caller = nullptr;
}  // namespace

CommCaller::CommCaller(const char* name) : previous_(t_caller) { t_caller = name; }
CommCaller::~CommCaller() { t_caller = previous_; }
const char* CommCaller::current() { return t_caller; }

// ---- the logging communicator ----

namespace {

using Clock = std::chrono::steady_clock;

int64_t bytes_of(const Tensor& t) { return t.defined() ? t.nbytes() : 0; }

class LoggingCommunicator final : public Communicator {
 public:
  LoggingCommunicator(std::shared_ptr<Communicator> inner, std::shared_ptr<CommsLogger> logger)
      : inner_(std::move(inner)), logger_(std::move(logger)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  bool p2p_in_call_order() const override { return inner_->p2p_in_call_order(); }
  uint64_t sequence_number() const override { return inner_->sequence_number(); }

  Work all_reduce(const Tensor& t, ReduceOp op, bool async_op) override {
    return timed("all_reduce", t, bytes_of(t), [&] { return inner_->all_reduce(t, op, async_op); });
  }
  Work broadcast(const Tensor& t, int src, bool async_op) override {
    return timed("broadcast", t, bytes_of(t), [&] { return inner_->broadcast(t, src, async_op); });
  }
  Work reduce(const Tensor& t, int dst, ReduceOp op, bool async_op) override {
    return timed("reduce", t, bytes_of(t), [&] { return inner_->reduce(t, dst, op, async_op); });
  }
  Work all_gather(const std::vector<Tensor>& outputs, const Tensor& input, bool async_op) override {
    return timed("all_gather", input, mean_piece(outputs), [&] { return inner_->all_gather(outputs, input, async_op); });
  }
  Work all_gather_into_tensor(const Tensor& output, const Tensor& input, bool async_op) override {
    return timed("all_gather_into_tensor", input, bytes_of(input),
                 [&] { return inner_->all_gather_into_tensor(output, input, async_op); });
  }
  Work reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op, bool async_op) override {
    return timed("reduce_scatter", output, mean_piece(inputs),
                 [&] { return inner_->reduce_scatter(output, inputs, op, async_op); });
  }
  Work reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op, bool async_op) override {
    return timed("reduce_scatter_tensor", output, bytes_of(output),
                 [&] { return inner_->reduce_scatter_tensor(output, input, op, async_op); });
  }
  Work all_to_all(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs, bool async_op) override {
    int64_t sent = 0;
    for (const Tensor& t : inputs) sent += bytes_of(t);
    return timed("all_to_all", inputs.empty() ? Tensor() : inputs[0], sent,
                 [&] { return inner_->all_to_all(outputs, inputs, async_op); });
  }
  // Asynchronous send and recv are not made blocking (comms_logger.h).
  Work send(const Tensor& t, int dst, int tag, bool async_op) override {
    if (async_op) return inner_->send(t, dst, tag, true);
    return timed("send", t, bytes_of(t), [&] { return inner_->send(t, dst, tag, false); });
  }
  Work recv(const Tensor& t, int src, int tag, bool async_op) override {
    if (async_op) return inner_->recv(t, src, tag, true);
    return timed("recv", t, bytes_of(t), [&] { return inner_->recv(t, src, tag, false); });
  }
  void barrier() override {
    timed("barrier", Tensor(), 0, [&] {
      inner_->barrier();
      return Work();
    });
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    auto sub = inner_->split(color, key);
    return sub ? std::make_shared<LoggingCommunicator>(std::move(sub), logger_) : nullptr;
  }

 private:
  // The per-rank piece of an uneven op: the mean over the ranks' tensors.
  int64_t mean_piece(const std::vector<Tensor>& list) const {
    int64_t total = 0;
    for (const Tensor& t : list) total += bytes_of(t);
    return list.empty() ? 0 : total / static_cast<int64_t>(list.size());
  }

  // Runs `call`; when the logger profiles `op`, waits for the operation to complete (and for the
  // tensor's GPU) and logs the time since the call.
  template <class Call>
  Work timed(const char* op, const Tensor& t, int64_t msg_bytes, Call&& call) {
    if (!logger_->profiles(op)) return call();
    const auto t0 = Clock::now();
    Work work = call();
    work.wait();
    if (t.defined() && t.is_cuda()) cuda::synchronize(t.device().index);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::string record = op;
    if (logger_->debug()) {
      const char* caller = CommCaller::current();
      record += fmt::format(" | [Caller: {}]", caller ? caller : "unnamed");
    }
    logger_->append(op, record, ms, msg_bytes, inner_->size());
    return work;
  }

  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<CommsLogger> logger_;

  friend Communicator& unlogged(Communicator& comm);
};

// The communicator under any logging ones.
Communicator& unlogged(Communicator& comm) {
  Communicator* c = &comm;
  while (auto* l = dynamic_cast<LoggingCommunicator*>(c)) c = l->inner_.get();
  return *c;
}

}  // namespace

std::shared_ptr<Communicator> log_communication(std::shared_ptr<Communicator> inner,
                                                std::shared_ptr<CommsLogger> logger) {
  KILN_CHECK(inner != nullptr, "log_communication: the communicator is null; pass distributed::init() or a split");
  KILN_CHECK(logger != nullptr, "log_communication: the logger is null; pass a std::shared_ptr<CommsLogger>");
  if (!logger->enabled()) return inner;
  return std::make_shared<LoggingCommunicator>(std::move(inner), std::move(logger));
}

}  // namespace kiln::distributed

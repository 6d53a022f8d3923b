// tests/distributed/test_comms_logger.cpp: the communication logger (DeepSpeed's comms_logger):
// its figures against DeepSpeed's formulas worked by hand, a logging communicator that records
// every collective with its size and leaves the results as they were, prof_ops and the callers'
// names, and the engine's "comms_logger", whose training matches an engine's without it.
#include <map>
#include <sstream>

#include "distributed/comm/comms_logger.h"
#include "parity.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::batch;
using kiln::test::check_close;
using kiln::test::check_equal;
using kiln::test::check_error;
using kiln::test::Mlp;

namespace {

const CommsLogger::Entry* find(const CommsLogger& logger, const std::string& record, int64_t bytes) {
  static CommsLogger::Entry copy;
  for (const auto& [name, sizes] : logger.records()) {
    if (name != record) continue;
    const auto it = sizes.find(bytes);
    if (it == sizes.end()) return nullptr;
    copy = it->second;
    return &copy;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("comms_logger: DeepSpeed's bandwidths, message sizes and trimmed means", "[distributed]") {
  // 10^6 bytes in 1 ms over 4 ranks: 10^6 B/ms = 8 Gbps.
  CommBandwidth b = comm_bandwidth("all_reduce", 1e6, 1.0, 4);
  CHECK(b.algbw_gbps == Approx(16));  // 2 S / t
  CHECK(b.busbw_gbps == Approx(12));  // S / t x 2 (n - 1) / n
  b = comm_bandwidth("all_gather_into_tensor", 1e6, 2.0, 4);
  CHECK(b.algbw_gbps == Approx(16));  // n S / t
  CHECK(b.busbw_gbps == Approx(12));  // n S / t x (n - 1) / n
  b = comm_bandwidth("reduce_scatter", 1e6, 2.0, 4);
  CHECK(b.busbw_gbps == Approx(12));
  b = comm_bandwidth("broadcast", 1e6, 1.0, 4);
  CHECK(b.algbw_gbps == Approx(8));
  CHECK(b.busbw_gbps == Approx(8));
  b = comm_bandwidth("all_reduce", 1e6, 1.0, 1);  // one rank moves nothing over a bus
  CHECK(b.busbw_gbps == 0);
  b = comm_bandwidth("barrier", 0, 0.5, 4);
  CHECK(b.algbw_gbps == 0);
  b = comm_bandwidth("all_to_all", 1e6, 1.0, 4);  // DeepSpeed's all_to_all_single: S / t, x (n - 1) / n
  CHECK(b.algbw_gbps == Approx(8));
  CHECK(b.busbw_gbps == Approx(6));
  CHECK_THROWS_WITH(comm_bandwidth("gather", 1, 1, 2), Catch::Contains("not a communication operation"));

  // DeepSpeed's convert_size (Python's str(round(x, 2))).
  CHECK(convert_size(0) == "0B");
  CHECK(convert_size(512) == "512.0 B");
  CHECK(convert_size(1024) == "1.0 KB");
  CHECK(convert_size(1536) == "1.5 KB");
  CHECK(convert_size(4000) == "3.91 KB");
  CHECK(convert_size(1234567) == "1.18 MB");
  CHECK(convert_size(int64_t{3} << 30) == "3.0 GB");

  // trim_mean(x, 0.1) drops round(0.1 n) values at each end, rounding half to even as Python.
  CHECK(trim_mean({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.1) == Approx(5.5));  // k = 1
  CHECK(trim_mean({1, 2, 3, 4, 100}, 0.1) == Approx(22));                  // k = round(0.5) = 0
  std::vector<double> fifteen = {0, 0, 0};
  for (int i = 1; i <= 12; ++i) fifteen.push_back(i);
  CHECK(trim_mean(fifteen, 0.1) == Approx(5));  // k = round(1.5) = 2: 0, 1, ..., 10
  CHECK(trim_mean({}, 0.1) == 0);
}

TEST_CASE("comms_logger: a logging communicator records every collective and leaves its result as it was",
          "[distributed]") {
  auto world = init("mpi");
  const int n = world->size(), r = world->rank();
  auto logger = std::make_shared<CommsLogger>(CommsLoggerOptions{.enabled = true}, r == 0);
  auto comm = log_communication(world, logger);
  REQUIRE(comm != world);
  CHECK(comm->rank() == r);
  CHECK(comm->size() == n);

  Tensor t = full({1000}, static_cast<double>(r + 1));
  comm->all_reduce(t);
  check_close(t, full({1000}, n * (n + 1) / 2.0));
  Tensor u = full({1000}, 1.0);
  Work w = comm->all_reduce(u, ReduceOp::Sum, /*async_op=*/true);
  CHECK(w.is_completed());  // logged operations are made blocking
  w.wait();
  check_close(u, full({1000}, static_cast<double>(n)));

  Tensor ids = r == 0 ? arange(10, kInt64) : zeros({10}, kInt64);
  comm->broadcast(ids, 0);
  CHECK(ids.to_vector<int64_t>() == arange(10, kInt64).to_vector<int64_t>());

  Tensor piece = full({6}, static_cast<double>(r)), gathered = empty({6 * n});
  comm->all_gather_into_tensor(gathered, piece);
  for (int k = 0; k < n; ++k) CHECK(gathered.narrow(0, 6 * k, 6).sum().item<double>() == 6.0 * k);

  Tensor whole = ones({5 * n}, kFloat64), mine = empty({5}, kFloat64);
  comm->reduce_scatter_tensor(mine, whole);
  check_close(mine, full({5}, static_cast<double>(n), kFloat64));

  // Uneven: rank k contributes k + 1 floats; the message is the mean piece.
  std::vector<Tensor> outs;
  int64_t total = 0;
  for (int k = 0; k < n; ++k) {
    outs.push_back(empty({k + 1}));
    total += 4 * (k + 1);
  }
  comm->all_gather(outs, full({r + 1}, static_cast<double>(r)));
  for (int k = 0; k < n; ++k) CHECK(outs[static_cast<size_t>(k)].sum().item<double>() == k * (k + 1.0));

  // all_to_all: 7 floats to every rank; the message is all this rank sends.
  std::vector<Tensor> to(static_cast<size_t>(n)), from(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    to[static_cast<size_t>(k)] = full({7}, static_cast<double>(r));
    from[static_cast<size_t>(k)] = empty({7});
  }
  comm->all_to_all(from, to);
  for (int k = 0; k < n; ++k) check_close(from[static_cast<size_t>(k)], full({7}, static_cast<double>(k)));

  comm->barrier();

  // Point to point: blocking is timed; asynchronous is passed on untimed (comms_logger.h).
  if (n >= 2 && r < 2) {
    Tensor msg = full({3}, 7.0);
    Tensor got = empty({3});
    if (r == 0) {
      comm->send(msg, 1);
      comm->recv(got, 1, /*tag=*/5, /*async_op=*/true).wait();
    } else {
      comm->recv(got, 0);
      comm->send(msg, 0, /*tag=*/5, /*async_op=*/true).wait();
    }
    check_close(got, msg);
  }

  // A sub-communicator logs to the same logger, with its own size in the bandwidths.
  auto sub = comm->split(r % 2, r);
  REQUIRE(sub != nullptr);
  Tensor s = ones({2000});
  sub->all_reduce(s);
  check_close(s, full({2000}, static_cast<double>(sub->size())));

  const auto* e = find(*logger, "all_reduce", 4000);
  REQUIRE(e != nullptr);
  CHECK(e->count == 2);
  for (size_t k = 0; k < 2; ++k) {
    CHECK(e->latency_ms[k] > 0);
    CHECK(e->busbw_gbps[k] == Approx(e->algbw_gbps[k] * (n - 1) / n));  // 2 S / t vs S / t x 2 (n - 1) / n
  }
  e = find(*logger, "all_reduce", 8000);
  REQUIRE(e != nullptr);
  CHECK(e->count == 1);
  CHECK(e->busbw_gbps[0] == Approx(e->algbw_gbps[0] * (sub->size() - 1) / sub->size()));
  CHECK(find(*logger, "broadcast", 80) != nullptr);
  CHECK(find(*logger, "all_gather_into_tensor", 24) != nullptr);  // this rank's piece
  CHECK(find(*logger, "reduce_scatter_tensor", 40) != nullptr);   // this rank's output
  CHECK(find(*logger, "all_gather", total / n) != nullptr);
  CHECK(find(*logger, "all_to_all", 28 * n) != nullptr);
  CHECK(find(*logger, "barrier", 0) != nullptr);
  if (n >= 2 && r < 2) {
    CHECK(find(*logger, r == 0 ? "send" : "recv", 12) != nullptr);
    CHECK(find(*logger, r == 0 ? "recv" : "send", 12) == nullptr);  // the asynchronous one
  }
  std::vector<std::string> names;
  for (const auto& [name, sizes] : logger->records()) names.push_back(name);
  REQUIRE(names.size() >= 6);
  CHECK(names[0] == "all_reduce");  // in the order first logged
  CHECK(names[1] == "broadcast");

  const std::string table = logger->summary();
  std::istringstream lines(table);
  std::string header, first, row;
  std::getline(lines, header);
  std::getline(lines, first);
  std::getline(lines, row);
  CHECK(header.rfind("Comm. Op            Message Size        Count               Total Latency(ms)", 0) == 0);
  CHECK(first == "all_reduce");
  CHECK(row.rfind(fmt::format("{:<20}{:<20}{:<20}", "", "3.91 KB", 2), 0) == 0);
  logger->reset();
  CHECK(logger->summary().empty());

  // verbose: each operation as it completes, where the logger prints.
  auto verbose = std::make_shared<CommsLogger>(CommsLoggerOptions{.enabled = true, .verbose = true}, r == 0);
  auto loud = log_communication(world, verbose);
  const std::string out = kiln::test::captured_output(1, [&] { loud->all_reduce(t); });
  if (r == 0) {
    CHECK(out.rfind("[kiln] comm op: all_reduce | time (ms): ", 0) == 0);
    CHECK(out.find(" | msg size: 3.91 KB | algbw (Gbps): ") != std::string::npos);
  } else {
    CHECK(out.empty());
  }
}

TEST_CASE("comms_logger: prof_ops picks the operations, debug names their callers, disabled logs nothing",
          "[distributed]") {
  auto world = init("mpi");
  auto logger = std::make_shared<CommsLogger>(
      CommsLoggerOptions{.enabled = true, .prof_all = false, .debug = true, .prof_ops = {"broadcast"}}, false);
  auto comm = log_communication(world, logger);
  Tensor t = ones({4});
  comm->all_reduce(t);
  comm->broadcast(t, 0);
  logger->start_profiling_op({"all_reduce"});
  {
    CommCaller caller("my loop");
    comm->all_reduce(t);
    {
      CommCaller inner("inner");
      comm->all_reduce(t);
    }
    comm->all_reduce(t);
  }
  logger->stop_profiling_op({"all_reduce", "broadcast"});
  comm->all_reduce(t);
  comm->broadcast(t, 0);
  logger->start_profiling_comms();
  comm->barrier();
  std::vector<std::pair<std::string, int64_t>> got;
  for (const auto& [name, sizes] : logger->records()) {
    for (const auto& [bytes, e] : sizes) got.emplace_back(name, e.count);
  }
  const std::vector<std::pair<std::string, int64_t>> want = {{"broadcast | [Caller: unnamed]", 1},
                                                             {"all_reduce | [Caller: my loop]", 2},
                                                             {"all_reduce | [Caller: inner]", 1},
                                                             {"barrier | [Caller: unnamed]", 1}};
  CHECK(got == want);

  auto off = std::make_shared<CommsLogger>(CommsLoggerOptions{}, false);
  CHECK(log_communication(world, off) == world);  // nothing to log: the communicator itself
  CHECK_THROWS_WITH(CommsLogger(CommsLoggerOptions{.enabled = true, .prof_ops = {"allreduce"}}),
                    Catch::Contains("prof_ops names 'allreduce'"));
  CHECK_THROWS_WITH(log_communication(nullptr, logger), Catch::Contains("the communicator is null"));
}

namespace {

// The rows of a table of summary() or straggler_summary(): record name -> its rows' numbers.
std::map<std::string, std::vector<std::vector<double>>> table_rows(const std::string& table) {
  std::map<std::string, std::vector<std::vector<double>>> rows;
  std::istringstream lines(table);
  std::string record;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.rfind("Comm. Op", 0) == 0 || line[0] == '_' || line[0] == '-' ||
        line.rfind("Breakdown", 0) == 0) {
      continue;
    }
    if (line[0] != ' ') {
      record = line;
      continue;
    }
    std::vector<double> numbers;  // the columns after the message size (whose unit has a space)
    for (size_t col = 40; col < line.size(); col += 20) numbers.push_back(std::stod(line.substr(col, 20)));
    rows[record].push_back(numbers);
  }
  return rows;
}

}  // namespace

TEST_CASE("comms_logger: the straggler breakdown splits each latency into the transfer and the wait",
          "[distributed]") {
  auto world = init("mpi");
  const int n = world->size(), r = world->rank();
  auto logger = std::make_shared<CommsLogger>(CommsLoggerOptions{.enabled = true}, false);
  auto comm = log_communication(world, logger);
  Tensor t = ones({256});
  for (int k = 0; k < 5; ++k) comm->all_reduce(t);
  comm->broadcast(t, 0);
  const std::string table = logger->summary();
  const std::string breakdown = logger->straggler_summary(*comm);
  CHECK(logger->summary() == table);  // the comparison itself is not logged
  REQUIRE(breakdown.rfind("_______________________________\nBreakdown with straggler effect\n", 0) == 0);
  const auto totals = table_rows(table), parts = table_rows(breakdown);
  REQUIRE(totals.size() == 2);
  REQUIRE(parts.size() == 2);
  for (const auto& [record, rows] : totals) {
    INFO(record);
    REQUIRE(parts.count(record) == 1);
    REQUIRE(rows.size() == 1);
    const std::vector<double>& whole = rows[0];  // count, total latency, ...
    const std::vector<double>& split = parts.at(record)[0];  // count, total comm, total straggler, ...
    CHECK(split[0] == whole[0]);
    CHECK(split[1] + split[2] == Approx(whole[1]).margin(0.016));  // each rounded to 0.01
    CHECK(split[2] >= 0);
    // The transfer is the same on every rank; the smallest wait, over the ranks, is none.
    Tensor shared = from_vector<double>({split[1], -split[1], split[2]});
    Tensor extremes = shared.clone();
    world->all_reduce(extremes, ReduceOp::Min);
    CHECK(-extremes[1].item<double>() == split[1]);
    CHECK(extremes[0].item<double>() == split[1]);
  }
  // For one operation the wait is exactly zero on the rank that arrived last: the minimum over
  // the ranks of the waits, operation by operation, comes from the records themselves.
  const auto e = logger->records()[1].second.begin()->second;  // the broadcast
  Tensor lat = from_vector<double>({e.latency_ms[0]});
  Tensor least = lat.clone();
  world->all_reduce(least, ReduceOp::Min);
  Tensor wait = lat - least;
  world->all_reduce(wait, ReduceOp::Min);
  CHECK(wait.item<double>() == 0);

  // Ranks that logged different operations: an Error on every rank, not a wait.
  if (n > 1) {
    auto solo = comm->split(r, 0);  // a communicator of one rank each
    if (r == 0) solo->barrier();    // logged on rank 0 alone
    check_error([&] { logger->straggler_summary(*comm); },
                {"straggler_summary: the ranks logged different operations", "call summary() instead"});
  }
}

TEST_CASE("engine: comms_logger times the engine's communication, names its callers, and changes no result",
          "[distributed]") {
  auto comm = init("mpi");
  const int n = comm->size(), r = comm->rank();
  const int64_t micro = 2;
  for (int stage : {0, 2}) {
    INFO("stage " << stage);
    auto config = [&](bool logged) {
      return Config::from_string(fmt::format(R"({{
        "train_micro_batch_size_per_gpu": {}, "steps_per_print": 1000, "gradient_clipping": 1.0,
        "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01}}}},
        "zero_optimization": {{"stage": {}, "reduce_bucket_size": 500}},
        "comms_logger": {{"enabled": {}, "debug": true}}
      }})", micro, stage, logged));
    };
    manual_seed(3);
    Mlp plain_model;
    manual_seed(3);
    Mlp logged_model;
    Engine plain = kiln::initialize(plain_model, config(false), comm);
    Engine logged = kiln::initialize(logged_model, config(true), comm);
    CHECK(plain.comms_logger() == nullptr);
    REQUIRE(logged.comms_logger() != nullptr);
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(step, micro * n);
      for (Engine* e : {&plain, &logged}) {
        e->backward(nn::cross_entropy((*e)(x.narrow(0, r * micro, micro)), y.narrow(0, r * micro, micro)));
        e->step();
      }
    }
    {
      ZeroOptimizer::GatheredParameters a(plain.optimizer()), b(logged.optimizer());
      for (const auto& [name, t] : plain_model.named_parameters()) {
        INFO(name);
        check_equal(logged_model.state_dict().at(name), t);  // the same operations, in the same order
      }
    }
    std::vector<std::string> names;
    for (const auto& [name, sizes] : logged.comms_logger()->records()) names.push_back(name);
    auto has = [&](const std::string& s) { return std::find(names.begin(), names.end(), s) != names.end(); };
    std::string listed;
    for (const std::string& name : names) listed += name + "; ";
    INFO(listed);
    CHECK(has("broadcast | [Caller: rank 0's weights to every rank]"));
    if (n > 1) {
      if (stage == 0) {
        CHECK(has("all_reduce | [Caller: gradient reduction]"));
      } else {
        CHECK(has("all_reduce | [Caller: gradient norm]"));  // the partitions' squares
        CHECK(has("reduce_scatter | [Caller: gradient reduction]"));
        CHECK(has("all_gather_into_tensor | [Caller: ZeRO updated partitions]"));
      }
    }
    const std::string out = kiln::test::captured_output(1, [&] { logged.log_summary(); });
    const std::string both = kiln::test::captured_output(1, [&] { logged.log_summary(/*show_straggler=*/true); });
    if (r == 0) {
      CHECK(out == logged.comms_logger()->summary());
      CHECK(both.rfind(out, 0) == 0);
      CHECK(both.find("Breakdown with straggler effect") != std::string::npos);
      CHECK(out.find("broadcast | [Caller: rank 0's weights to every rank]") != std::string::npos);
    } else {
      CHECK(out.empty());
      CHECK(both.empty());
    }
  }
}

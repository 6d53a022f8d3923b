// tests/distributed/test_comm.cpp: every collective of the MPI communicator, with exact results:
// each rank contributes values made from its rank number.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

#include "support.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_equal;
using kiln::test::check_error;

namespace {

std::shared_ptr<Communicator> world() { return init("mpi"); }

// rank + i for i = 0 .. n-1, in dtype.
Tensor ramp(int64_t n, int rank, DType dtype) { return (arange(n, kFloat64) + rank).to(dtype); }

}  // namespace

TEST_CASE("comm: rank and size agree with the launcher's environment", "[distributed]") {
  auto comm = world();
  WorldInfo w = world_info();
  CHECK(comm->rank() == w.rank);
  CHECK(comm->size() == w.size);
  CHECK(comm->backend() == "mpi");
  // CTest starts these under mpirun; by hand they may run under `srun --mpi=pmix` too.
  const char* env_rank = std::getenv(w.launcher == "srun" ? "SLURM_PROCID" : "OMPI_COMM_WORLD_RANK");
  REQUIRE((w.launcher == "mpirun" || w.launcher == "srun"));
  REQUIRE(env_rank != nullptr);
  CHECK(w.rank == std::atoi(env_rank));
  CHECK(w.local_rank < w.local_size);
  CHECK(w.local_size <= w.size);
  if (w.local_size == w.size) CHECK(w.local_rank == w.rank);  // one node (CTest's runs are)
  CHECK(init("mpi") == comm);  // one world communicator per process
}

namespace {
// world_info() in an environment of just `vars` (the process's own is left alone: Open MPI's
// threads may be reading it).
WorldInfo world_info_with(std::initializer_list<std::pair<const char*, const char*>> vars) {
  const std::map<std::string, std::string> env(vars.begin(), vars.end());
  return world_info([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}
// The fields a launcher's variables decide, checked one by one.
void check_world(const WorldInfo& w, const std::string& launcher, int rank, int size) {
  CHECK(w.launcher == launcher);
  CHECK(w.rank == rank);
  CHECK(w.size == size);
}
}  // namespace

TEST_CASE("comm: world_info reads srun's variables, node by node", "[distributed]") {
  // Rank 5 of a step with 4, 4 and 3 tasks on three nodes: the second task of node 1.
  WorldInfo w = world_info_with({{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "11"}, {"SLURM_LOCALID", "1"},
                                 {"SLURM_NODEID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"},
                                 {"SLURM_NTASKS", "12"}});
  check_world(w, "srun", 5, 11);  // the size is the step's tasks, not the allocation's
  CHECK(w.local_rank == 1);
  CHECK(w.local_size == 4);
  w = world_info_with({{"SLURM_PROCID", "10"}, {"SLURM_STEP_NUM_TASKS", "11"}, {"SLURM_LOCALID", "2"},
                       {"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"}});
  CHECK(w.local_size == 3);
  w = world_info_with({{"SLURM_PROCID", "6"}, {"SLURM_STEP_NUM_TASKS", "7"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_NODEID", "3"}, {"SLURM_STEP_TASKS_PER_NODE", "2,1,3,1"}});
  CHECK(w.local_size == 1);
  CHECK(w.local_rank == 0);

  // A batch script has SLURM_PROCID and SLURM_NTASKS but is one process, not a task of a step.
  w = world_info_with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}});
  check_world(w, "none", 0, 1);

  // mpirun's variables win over Slurm's (mpirun inside an allocation); torchrun's are read too.
  w = world_info_with({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"SLURM_PROCID", "0"},
                       {"SLURM_STEP_NUM_TASKS", "1"}});
  CHECK(w.launcher == "mpirun");
  CHECK(w.rank == 2);
  CHECK(w.local_size == 3);
  w = world_info_with({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  check_world(w, "torchrun", 3, 8);
  CHECK(w.local_rank == 1);
  CHECK(w.local_size == 4);
  // Half a pair is no launcher, and leaves nothing behind (rank 3 of 1 would be an Error).
  w = world_info_with({{"SLURM_PROCID", "3"}});
  check_world(w, "none", 0, 1);
  // MPICH's mpiexec under Slurm: its ranks carry the proxy's SLURM_PROCID (the node) too; PMI wins.
  w = world_info_with({{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}});
  check_world(w, "pmi", 5, 8);
}

TEST_CASE("comm: a launcher's environment that does not add up is an Error naming it", "[distributed]") {
  check_error([] { world_info_with({{"SLURM_PROCID", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}}); },
              {"srun", "rank 4 of 4", "inconsistent"});
  check_error([] {
    world_info_with({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2(3)"}});
  }, {"SLURM_STEP_TASKS_PER_NODE='2(3)'", "(x"});
  check_error([] {
    world_info_with({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "x"}});
  }, {"SLURM_STEP_TASKS_PER_NODE='x'", "task counts"});
  check_error([] {
    world_info_with({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_NODEID", "2"},
                     {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}});
  }, {"SLURM_NODEID=2", "tasks for 2 nodes"});
  check_error([] { world_info_with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}}); },
              {"torchrun", "local rank 0 of 4", "unset that launcher's variables"});
  check_error([] { world_info_with({{"OMPI_COMM_WORLD_RANK", "one"}, {"OMPI_COMM_WORLD_SIZE", "2"}}); },
              {"OMPI_COMM_WORLD_RANK='one'", "not a rank"});
  // mpirun and PMI launchers set both of their pair: half of it is a broken environment, not rank 0 of 1.
  check_error([] { world_info_with({{"OMPI_COMM_WORLD_RANK", "1"}}); },
              {"OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not", "unset the variable"});
  check_error([] { world_info_with({{"PMI_SIZE", "4"}, {"RANK", "1"}, {"WORLD_SIZE", "4"}}); },
              {"PMI_SIZE is set but PMI_RANK is not"});
  // A stray RANK (torchrun's name, and a common one) is no launcher, as half of Slurm's pair.
  check_world(world_info_with({{"RANK", "3"}}), "none", 0, 1);
}

TEST_CASE("comm: all_reduce sum, avg, max and min are exact for every dtype", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  const int64_t n = 7;
  Tensor i = arange(n, kFloat64);
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kInt8}) {
    INFO("dtype " << dtype_name(dt));
    Tensor t = ramp(n, r, dt);
    comm->all_reduce(t);
    check_equal(t, (i * p + p * (p - 1) / 2).to(dt));  // sum over ranks of (rank + i)
    t = ramp(n, r, dt);
    comm->all_reduce(t, ReduceOp::Max);
    check_equal(t, (i + (p - 1)).to(dt));
    t = ramp(n, r, dt);
    comm->all_reduce(t, ReduceOp::Min);
    check_equal(t, i.to(dt));
    if (is_floating(dt)) {
      t = ramp(n, r, dt) * 2;  // avg of 2 (rank + i) = 2i + (p - 1): exact in every dtype here
      comm->all_reduce(t, ReduceOp::Avg);
      check_equal(t, (i * 2 + (p - 1)).to(dt));
    }
  }
  // bool: sum and max are "any", min is "all"
  Tensor b = full({2}, r == 0 ? 1.0 : 0.0, kFloat32).to(kBool);
  Tensor any = b.clone(), all = b.clone();
  comm->all_reduce(any, ReduceOp::Sum);
  comm->all_reduce(all, ReduceOp::Min);
  CHECK(any.to(kInt64).sum().item<int64_t>() == 2);
  CHECK(all.to(kInt64).sum().item<int64_t>() == (p == 1 ? 2 : 0));
}

TEST_CASE("comm: max and min propagate NaN from whichever rank holds it, as torch.maximum does", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
      INFO("dtype " << dtype_name(dt) << ", " << reduce_op_name(op));
      // Element 0 is NaN on the last rank, element 1 on rank 0: MPI_MAX kept or dropped a NaN
      // depending on the order in which the ranks' values met.
      std::vector<double> v = {0.0 + r, 1.0 + r, 2.0 + r, 3.0 + r};
      if (r == p - 1) v[0] = nan;
      if (r == 0) v[1] = nan;
      Tensor t = from_vector(v).to(dt);
      comm->all_reduce(t, op);
      Tensor got = t.to(kFloat64);
      CHECK(std::isnan(got[0].item<double>()));
      CHECK(std::isnan(got[1].item<double>()));
      CHECK(got[2].item<double>() == (op == ReduceOp::Max ? 2.0 + (p - 1) : 2.0));
      CHECK(got[3].item<double>() == (op == ReduceOp::Max ? 3.0 + (p - 1) : 3.0));
    }
  }
}

TEST_CASE("comm: avg of float16 and bfloat16 sums in float32, so it does not overflow where the mean fits", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  // 60000 is near float16's largest value (65504): a float16 sum of two or more is inf.
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO("dtype " << dtype_name(dt));
    Tensor big = full({3}, 60000.0, dt);
    Tensor expected = full({3}, 60000.0, dt);
    Tensor t = big.clone();
    comm->all_reduce(t, ReduceOp::Avg);
    check_equal(t, expected);
    t = big.clone();
    comm->reduce(t, 0, ReduceOp::Avg);
    if (r == 0) check_equal(t, expected);
    Tensor out = zeros({3}, dt);
    comm->reduce_scatter_tensor(out, full({3 * p}, 60000.0, dt), ReduceOp::Avg);
    check_equal(out, expected);
    std::vector<Tensor> parts;
    for (int k = 0; k < p; ++k) parts.push_back(full({3}, 60000.0, dt));
    out = zeros({3}, dt);
    comm->reduce_scatter(out, parts, ReduceOp::Avg);
    check_equal(out, expected);
    // One rounding, after the division: the mean of rank + 0.25 is (p - 1) / 2 + 0.25, exact here.
    t = full({2}, r + 0.25, dt);
    comm->all_reduce(t, ReduceOp::Avg);
    check_equal(t, full({2}, (p - 1) / 2.0 + 0.25, dt));
  }
}

TEST_CASE("comm: broadcast from every root and reduce to every root", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  for (int src = 0; src < p; ++src) {
    Tensor t = full({3, 2}, r * 10.0 + 1, kInt64);
    comm->broadcast(t, src);
    check_equal(t, full({3, 2}, src * 10.0 + 1, kInt64));
  }
  for (int dst = 0; dst < p; ++dst) {
    Tensor t = full({5}, r + 1.0, kFloat64);
    comm->reduce(t, dst);
    check_equal(t, full({5}, r == dst ? p * (p + 1) / 2.0 : r + 1.0, kFloat64));  // others untouched
  }
}

TEST_CASE("comm: all_gather with uneven sizes, and into one tensor (also in place)", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  std::vector<Tensor> outs;
  for (int k = 0; k < p; ++k) outs.push_back(full({k + 1}, -1.0, kInt32));
  comm->all_gather(outs, full({r + 1}, r * 3.0, kInt32));
  for (int k = 0; k < p; ++k) check_equal(outs[static_cast<size_t>(k)], full({k + 1}, k * 3.0, kInt32));

  Tensor out = zeros({p, 4}, kFloat32);
  comm->all_gather_into_tensor(out, ramp(4, r, kFloat32));
  for (int k = 0; k < p; ++k) check_equal(out.select(0, k), ramp(4, k, kFloat32));

  Tensor buf = full({p * 4}, -1.0, kFloat32);  // this rank's slice already holds its contribution
  buf.narrow(0, r * 4, 4).copy_(ramp(4, r, kFloat32));
  comm->all_gather_into_tensor(buf, buf.narrow(0, r * 4, 4));
  check_equal(buf, out.flatten());

  // An input that is another rank's slice of the output is sent from a copy (MPI forbids the
  // overlap; rank r's slice came back as zeros where rank r - 1's input had been).
  Tensor other = full({p * 4}, -1.0, kFloat32);
  Tensor src = other.narrow(0, ((r + 1) % p) * 4, 4);
  src.copy_(ramp(4, r, kFloat32));
  comm->all_gather_into_tensor(other, src);
  check_equal(other, out.flatten());
}

TEST_CASE("comm: reduce_scatter with uneven sizes, and from one tensor", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  std::vector<Tensor> ins;
  for (int k = 0; k < p; ++k) ins.push_back(full({k + 1}, r * 10.0 + k, kInt64));
  Tensor out = zeros({r + 1}, kInt64);
  comm->reduce_scatter(out, ins);
  check_equal(out, full({r + 1}, 10.0 * p * (p - 1) / 2 + p * r, kInt64));

  // input slice k, element j = rank + 100 k + j; rank r gets slice r summed over ranks.
  Tensor in = (arange(p * 3, kFloat64).view({p, 3}) + arange(p, kFloat64).unsqueeze(1) * 97 + r).to(kFloat32);
  Tensor o = zeros({3}, kFloat32);
  comm->reduce_scatter_tensor(o, in, ReduceOp::Max);
  check_equal(o, (arange(3, kFloat64) + r * 3 + r * 97 + (p - 1)).to(kFloat32));
  comm->reduce_scatter_tensor(o, in, ReduceOp::Sum);
  check_equal(o, ((arange(3, kFloat64) + r * 3 + r * 97) * p + p * (p - 1) / 2).to(kFloat32));
  // An output that overlaps the input from before its start is computed from a copy of the input
  // (the overlap check looked only for an output starting inside the input).
  Tensor both = zeros({p * 3 + 2}, kFloat32);
  Tensor in2 = both.narrow(0, 2, p * 3), o2 = both.narrow(0, 0, 3);
  in2.copy_(in.flatten());
  comm->reduce_scatter_tensor(o2, in2, ReduceOp::Sum);
  check_equal(o2, ((arange(3, kFloat64) + r * 3 + r * 97) * p + p * (p - 1) / 2).to(kFloat32));
}

TEST_CASE("comm: all_to_all with sizes that differ from pair to pair, several in flight", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  // Rank i sends rank k (i + k + 1) elements of 1000 i + 10 k + j: each pair has its own size.
  auto piece = [](int i, int k, DType dtype) { return (arange(i + k + 1, kFloat64) + 1000 * i + 10 * k).to(dtype); };
  for (DType dtype : {kFloat32, kInt64, kBFloat16, kUInt8}) {
    INFO(dtype_name(dtype));
    // uint8: the values wrap modulo 256 (the conversion from int64), the same on both sides.
    const auto make = [&](int i, int k) { return dtype == kUInt8 ? piece(i, k, kInt64).to(kUInt8) : piece(i, k, dtype); };
    std::vector<Tensor> ins, outs;
    for (int k = 0; k < p; ++k) {
      ins.push_back(make(r, k));
      outs.push_back(zeros({k + r + 1}, dtype));
    }
    comm->all_to_all(outs, ins);
    for (int k = 0; k < p; ++k) check_equal(outs[static_cast<size_t>(k)], make(k, r));
  }
  // Several in flight, waited in reverse; empty pieces (to and from rank 0) among them.
  std::vector<std::vector<Tensor>> outs(3);
  std::vector<Work> works;
  for (int t = 0; t < 3; ++t) {
    std::vector<Tensor> ins;
    for (int k = 0; k < p; ++k) {
      const int64_t n = (r == 0 || k == 0) ? 0 : 4;
      ins.push_back(full({n}, 100.0 * t + 10 * r + k, kFloat64));
      outs[static_cast<size_t>(t)].push_back(full({n}, -1.0, kFloat64));
    }
    works.push_back(comm->all_to_all(outs[static_cast<size_t>(t)], ins, /*async_op=*/true));
  }
  for (int t = 2; t >= 0; --t) works[static_cast<size_t>(t)].wait();
  for (int t = 0; t < 3; ++t) {
    for (int k = 0; k < p; ++k) {
      const int64_t n = (r == 0 || k == 0) ? 0 : 4;
      check_equal(outs[static_cast<size_t>(t)][static_cast<size_t>(k)], full({n}, 100.0 * t + 10 * k + r, kFloat64));
    }
  }
}

TEST_CASE("comm: all_to_all whose pairs do not match is an Error naming them, not a hang", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  check_error([&] { comm->all_to_all({zeros({1})}, std::vector<Tensor>(static_cast<size_t>(p) + 1, zeros({1}))); },
              {"all_to_all", "one of each per rank"});
  std::vector<Tensor> mine(static_cast<size_t>(p), zeros({2})), other(static_cast<size_t>(p), zeros({2}));
  other[static_cast<size_t>(r)] = zeros({3});
  check_error([&] { comm->all_to_all(mine, other); },
              {"all_to_all", fmt::format("this rank ({}) sends 3 elements to itself", r)});
  other[static_cast<size_t>(r)] = zeros({2}, kInt32);
  check_error([&] { comm->all_to_all(mine, other); }, {"all_to_all", "one dtype and device"});
  if (p == 1) return;
  // Rank 1 sends rank 0 three elements where rank 0 expects two.
  std::vector<Tensor> ins(static_cast<size_t>(p), zeros({2})), outs(static_cast<size_t>(p), zeros({2}));
  if (r == 1) ins[0] = zeros({3});
  check_error([&] { comm->all_to_all(outs, ins); },
              {"all_to_all #", "rank 1 sends 3 elements to rank 0 (its inputs[0]), which expects 2 (its outputs[1])"});
  // A rank calling another collective meanwhile: the signatures say so, before any all_to_all check.
  std::vector<Tensor> same(static_cast<size_t>(p), zeros({2}));
  Tensor t = zeros({2});
  check_error([&] { r == 0 ? comm->all_reduce(t) : comm->all_to_all(same, same); },
              {"different collectives", r == 0 ? "this rank called all_reduce, another rank all_to_all"
                                               : "this rank called all_to_all, another rank all_reduce"});
  // The communicator is still usable afterwards.
  std::vector<Tensor> a(static_cast<size_t>(p)), b(static_cast<size_t>(p));
  for (int k = 0; k < p; ++k) {
    a[static_cast<size_t>(k)] = full({1}, static_cast<double>(r), kFloat32);
    b[static_cast<size_t>(k)] = zeros({1});
  }
  comm->all_to_all(b, a);
  for (int k = 0; k < p; ++k) check_equal(b[static_cast<size_t>(k)], full({1}, static_cast<double>(k), kFloat32));
}

TEST_CASE("comm: send and recv around the ring", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  Tensor got = zeros({5}, kFloat64);
  Work rw = comm->recv(got, (r + p - 1) % p, 7, /*async_op=*/true);
  Work sw = comm->send(full({5}, r + 0.5, kFloat64), (r + 1) % p, 7, /*async_op=*/true);
  sw.wait();
  rw.wait();
  check_equal(got, full({5}, (r + p - 1) % p + 0.5, kFloat64));
  CHECK(rw.is_completed());
  CHECK(rw.describe().find("recv") == 0);
}

TEST_CASE("comm: send and recv do not wait behind a collective in flight", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  if (p == 1) return;
  // Rank 0 starts an all-reduce, then sends; rank 1 receives, then joins the all-reduce. The send
  // used to wait for the all-reduce, which waited for rank 1, which waited for the send: a hang
  // until the timeout (PyTorch's gloo completes this; Kiln's NCCL backend does not, see
  // docs/distributed.md).
  Tensor t = full({6}, 1.0, kFloat32), msg = full({3}, 0.0, kInt64);
  if (r == 0) {
    Work w = comm->all_reduce(t, ReduceOp::Sum, /*async_op=*/true);
    comm->send(full({3}, 42.0, kInt64), 1, 21);
    w.wait();
  } else if (r == 1) {
    comm->recv(msg, 0, 21);
    comm->all_reduce(t);
    check_equal(msg, full({3}, 42.0, kInt64));
  } else {
    comm->all_reduce(t);
  }
  check_equal(t, full({6}, static_cast<double>(p), kFloat32));
}

TEST_CASE("comm: many operations in flight complete, whatever order they are waited in", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  const uint64_t seq0 = comm->sequence_number();
  std::vector<Tensor> ts;
  std::vector<Work> works;
  for (int k = 0; k < 12; ++k) {
    ts.push_back(full({1000 + k}, r * (k + 1.0), kInt64));
    works.push_back(comm->all_reduce(ts.back(), ReduceOp::Sum, /*async_op=*/true));
  }
  CHECK(comm->sequence_number() == seq0 + 12);
  for (int k = 11; k >= 0; --k) works[static_cast<size_t>(k)].wait();
  for (int k = 0; k < 12; ++k) {
    check_equal(ts[static_cast<size_t>(k)], full({1000 + k}, (k + 1.0) * p * (p - 1) / 2, kInt64));
    CHECK(works[static_cast<size_t>(k)].is_completed());
    CHECK(works[static_cast<size_t>(k)].describe() ==
          fmt::format("all_reduce #{} (int64, {} elements, sum)", seq0 + k + 1, 1000 + k));
  }
  comm->barrier();
}

TEST_CASE("comm: split into sub-communicators by color and key", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  // Even and odd ranks, each group ordered by descending rank (key = -rank).
  auto sub = comm->split(r % 2, -r);
  REQUIRE(sub != nullptr);
  int members = 0, above = 0, sum = 0;
  for (int k = 0; k < p; ++k) {
    if (k % 2 != r % 2) continue;
    ++members;
    sum += k;
    above += k > r;
  }
  CHECK(sub->size() == members);
  CHECK(sub->rank() == above);
  Tensor t = full({3}, static_cast<double>(r), kInt64);
  sub->all_reduce(t);
  check_equal(t, full({3}, static_cast<double>(sum), kInt64));
  // A negative color leaves a rank out.
  const uint64_t seq = comm->sequence_number();
  auto some = comm->split(r == 0 ? -1 : 0, r);
  CHECK(comm->sequence_number() == seq + 1);  // split is a numbered collective
  CHECK((some == nullptr) == (r == 0));
  if (some) CHECK(some->size() == p - 1);
  // The parent still works, and its sub-communicators are independent of it.
  Tensor u = full({2}, 1.0, kInt32);
  comm->all_reduce(u);
  check_equal(u, full({2}, static_cast<double>(p), kInt32));
}

TEST_CASE("comm: a sub-communicator dropped with operations in flight finishes them first", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  // The destructor freed the MPI handle while the all-reduces were still queued: a segfault in
  // MPI_Iallreduce on every rank.
  Tensor a = full({5}, static_cast<double>(r + 1), kFloat32), b = full({1000}, 1.0, kInt64);
  Work wa, wb;
  {
    auto sub = comm->split(0, r);
    wa = sub->all_reduce(a, ReduceOp::Sum, /*async_op=*/true);
    wb = sub->all_reduce(b, ReduceOp::Max, /*async_op=*/true);
  }
  wa.wait();
  wb.wait();
  check_equal(a, full({5}, p * (p + 1) / 2.0, kFloat32));
  check_equal(b, full({1000}, 1.0, kInt64));
}

TEST_CASE("comm: KILN_COMM_TIMEOUT: inf and huge values mean a year, below a millisecond is an Error", "[distributed]") {
  struct Restore {
    std::string old;
    bool had;
    Restore() : had(std::getenv("KILN_COMM_TIMEOUT") != nullptr) {
      if (had) old = std::getenv("KILN_COMM_TIMEOUT");
    }
    ~Restore() { had ? setenv("KILN_COMM_TIMEOUT", old.c_str(), 1) : unsetenv("KILN_COMM_TIMEOUT"); }
  } restore;
  const int p = world()->size();
  // Accepted here (the world communicator keeps the options of the process's first init, so the
  // CTest entry "KILN_COMM_TIMEOUT=inf lets every operation complete" runs a whole job under inf).
  for (const char* huge : {"inf", "1e20"}) {
    setenv("KILN_COMM_TIMEOUT", huge, 1);
    auto comm = init("mpi");
    Tensor t = full({4}, 1.0, kFloat32);
    comm->all_reduce(t);
    check_equal(t, full({4}, static_cast<double>(p), kFloat32));
  }
  for (const char* bad : {"0.0001", "0", "-3", "5s", "nan", "0x10"}) {
    setenv("KILN_COMM_TIMEOUT", bad, 1);
    check_error([] { init("mpi"); }, {"KILN_COMM_TIMEOUT", "at least 0.001"});
  }
  unsetenv("KILN_COMM_TIMEOUT");
  check_error([] { init("mpi", {.timeout = std::chrono::milliseconds(0)}); }, {"timeout must be at least 1 ms"});
}

TEST_CASE("comm: ranks that disagree on a collective get an Error, not a hang", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  if (p == 1) return;  // one rank cannot disagree with itself
  // Sizes differ: rank 0 has 5 elements, the others 6.
  Tensor t = zeros({r == 0 ? 5 : 6}, kFloat32);
  check_error([&] { comm->all_reduce(t); }, {"all_reduce #", "different", "element count (this rank"});
  // Different collectives: rank 0 broadcasts while the others all-reduce.
  Tensor u = zeros({4}, kFloat32);
  check_error([&] { r == 0 ? comm->broadcast(u, 0) : comm->all_reduce(u); },
              {"different collectives", r == 0 ? "this rank called broadcast, another rank all_reduce"
                                               : "this rank called all_reduce, another rank broadcast"});
  // A barrier against an all-reduce, and a split against a barrier: the message names the two
  // operations, not the barrier's dtype or reduce op, which it does not have.
  check_error([&] { r == 0 ? comm->barrier() : (void)comm->all_reduce(u); },
              {r == 0 ? "barrier #" : "all_reduce #", r == 0 ? "this rank called barrier, another rank all_reduce"
                                                             : "this rank called all_reduce, another rank barrier"});
  check_error([&] { r == 0 ? (void)comm->split(0, r) : comm->barrier(); },
              {r == 0 ? "split #" : "barrier #", r == 0 ? "this rank called split, another rank barrier"
                                                        : "this rank called barrier, another rank split"});
  // Different reduce ops, by name.
  check_error([&] { comm->all_reduce(u, r == 0 ? ReduceOp::Max : ReduceOp::Sum); },
              {"reduce op (this rank", "from sum to max"});
  // Different roots.
  check_error([&] { comm->broadcast(u, r == 0 ? 0 : 1); }, {"root rank"});
  // The communicator is still usable afterwards.
  Tensor v = full({4}, 1.0, kFloat32);
  comm->all_reduce(v);
  check_equal(v, full({4}, static_cast<double>(p), kFloat32));
}

TEST_CASE("comm: a recv of the wrong size is an Error naming both sizes", "[distributed]") {
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  if (p == 1) return;
  if (r == 0) comm->send(zeros({4}, kFloat32), 1, 3);
  if (r == 1) check_error([&] { comm->recv(zeros({6}, kFloat32), 0, 3); }, {"rank 0 sent 16 bytes", "has 24"});
  // Too small a tensor: MPI truncates, and the Error says why (it was MPI's bare MPI_ERR_TRUNCATE).
  if (r == 0) comm->send(zeros({6}, kFloat32), 1, 4);
  if (r == 1)
    check_error([&] { comm->recv(zeros({4}, kFloat32), 0, 4); },
                {"recv #", "larger than this tensor", "same dtype and number of elements"});
  comm->barrier();
}

TEST_CASE("comm: bad arguments are Errors before anything is sent", "[distributed]") {
  auto comm = world();
  const int p = comm->size();
  Tensor nc = zeros({4, 4}).t();
  check_error([&] { comm->all_reduce(nc); }, {"all_reduce", "not contiguous", ".contiguous()"});
  check_error([&] { comm->broadcast(zeros({2}), p); }, {"broadcast", "src = ", "not a rank"});
  check_error([&] { comm->all_reduce(zeros({2}, kInt64), ReduceOp::Avg); }, {"Avg needs a floating dtype"});
  if (p > 1) check_error([&] { comm->all_gather({zeros({1})}, zeros({1})); }, {"one per rank"});
  check_error([&] { comm->all_gather_into_tensor(zeros({p * 2 + 1}), zeros({2})); }, {"output has"});
  const int r = comm->rank();
  check_error([&] { comm->reduce_scatter(zeros({2}), std::vector<Tensor>(static_cast<size_t>(p), zeros({3}))); },
              {"reduce_scatter", fmt::format("this rank's ({}) output has 2 elements but inputs[{}] has 3", r, r)});
  check_error([&] { comm->all_gather(std::vector<Tensor>(static_cast<size_t>(p), zeros({3}, kInt64)), zeros({3})); },
              {"all_gather", "one dtype and device"});
  check_error([&] { comm->send(zeros({2}), 0, -1); }, {"tag must be >= 0"});
  // A blocking send to itself hung until the timeout once the message was too large for MPI's eager
  // protocol; asynchronous, then the recv, it completes.
  check_error([&] { comm->send(zeros({1 << 20}), r); }, {"blocking send to this rank itself", "async_op = true"});
  {
    Tensor got = zeros({1 << 20});
    Work sent = comm->send(full({1 << 20}, static_cast<double>(r)), r, 3, /*async_op=*/true);
    comm->recv(got, r, 3);
    sent.wait();
    check_equal(got, full({1 << 20}, static_cast<double>(r)));
  }
  check_error([&] { init("gloo"); }, {"unknown backend 'gloo'"});
  if (!is_available("nccl")) {
    check_error([&] { init("nccl"); }, {"no NCCL backend"});
  } else if (!cuda::is_available()) {
    check_error([&] { init("nccl"); }, {"init(\"nccl\")", "no CUDA device", "use init(\"mpi\")"});
  }
  comm->barrier();  // nothing above reached the other ranks
}

TEST_CASE("comm: an inference tensor is written only in inference mode, as by in-place ops", "[distributed]") {
  // torch's c10d refuses the same: its collectives are in-place ops on the tensors they write.
  auto comm = world();
  const int p = comm->size(), r = comm->rank();
  const double mine = r + 1.0;
  Tensor t, one, many;
  {
    InferenceMode guard;
    t = full({3}, mine);
    one = zeros({2});
    many = zeros({2 * p});
  }
  const std::vector<std::string> refused{"inference tensor", "InferenceMode", "clone()"};
  auto with = [&](const char* op) {
    std::vector<std::string> f = refused;
    f.insert(f.begin(), op);
    return f;
  };
  check_error([&] { comm->all_reduce(t); }, with("all_reduce"));
  check_error([&] { comm->broadcast(t, 0); }, with("broadcast"));
  check_error([&] { comm->reduce(t, 0); }, with("reduce"));
  check_error([&] { comm->recv(t, r); }, with("recv"));
  std::vector<Tensor> outs(static_cast<size_t>(p), zeros({2}));
  outs.back() = one;
  check_error([&] { comm->all_gather(outs, zeros({2})); }, with("all_gather"));
  check_error([&] { comm->all_gather_into_tensor(many, zeros({2})); }, with("all_gather_into_tensor"));
  check_error([&] { comm->reduce_scatter(one, std::vector<Tensor>(static_cast<size_t>(p), zeros({2}))); },
              with("reduce_scatter"));
  check_error([&] { comm->reduce_scatter_tensor(one, zeros({2 * p})); }, with("reduce_scatter_tensor"));
  check_error([&] { ring::all_reduce(*comm, t); }, with("ring::all_reduce"));
  check_error([&] { ring::all_gather(*comm, many, zeros({2})); }, with("ring::all_gather"));
  check_error([&] { ring::reduce_scatter(*comm, one, zeros({2 * p})); }, with("ring::reduce_scatter"));
  check_equal(t, full({3}, mine));  // refused before anything was written
  // Read, it is an input like any other; written inside the mode, it is allowed.
  Tensor gathered = zeros({3 * p});
  comm->all_gather_into_tensor(gathered, t);
  std::vector<double> expected;
  for (int q = 0; q < p; ++q) expected.insert(expected.end(), 3, q + 1.0);
  check_equal(gathered, from_vector(expected).to(kFloat32));
  {
    InferenceMode guard;
    comm->all_reduce(t);
    ring::all_reduce(*comm, t);
  }
  check_equal(t, full({3}, static_cast<double>(p) * p * (p + 1) / 2));
  comm->barrier();
}

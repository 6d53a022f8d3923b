// tests/distributed/test_ring.cpp: the ring algorithms (on send/recv) against the communicator's
// native collectives: bit-equal on integer payloads, for sizes that do and do not divide evenly.
#include "support.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_close;
using kiln::test::check_equal;
using kiln::test::check_error;

namespace {
// Distinct, rank-dependent integers (large enough that a misplaced chunk cannot go unnoticed).
Tensor payload(int64_t n, int rank, DType dtype) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 7919 + rank * 1000003) % 200000011;
  return from_vector(v).to(dtype);  // fits int32, and its sums over 4 ranks too
}
}  // namespace

TEST_CASE("ring: all_reduce equals the native all_reduce, bit for bit, on integers", "[distributed]") {
  auto comm = init("mpi");
  const int r = comm->rank();
  for (int64_t n : {1, 3, 7, 64, 1023, 4097}) {
    for (DType dt : {kInt64, kInt32}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
        INFO("n " << n << ", " << dtype_name(dt) << ", " << reduce_op_name(op));
        Tensor a = payload(n, r, dt), b = a.clone();
        ring::all_reduce(*comm, a, op);
        comm->all_reduce(b, op);
        check_equal(a, b);
      }
    }
  }
}

TEST_CASE("ring: reduce_scatter and all_gather equal the native ones, bit for bit", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), r = comm->rank();
  for (int64_t chunk : {1, 5, 1000}) {
    INFO("chunk " << chunk);
    Tensor in = payload(chunk * p, r, kInt64);
    Tensor mine = zeros({chunk}, kInt64), theirs = zeros({chunk}, kInt64);
    ring::reduce_scatter(*comm, mine, in);
    comm->reduce_scatter_tensor(theirs, in);
    check_equal(mine, theirs);
    check_equal(in, payload(chunk * p, r, kInt64));  // the input is left alone

    Tensor g1 = zeros({p, chunk}, kInt64), g2 = zeros({p, chunk}, kInt64);
    ring::all_gather(*comm, g1, payload(chunk, r, kInt64));
    comm->all_gather_into_tensor(g2, payload(chunk, r, kInt64));
    check_equal(g1, g2);
  }
}

TEST_CASE("ring: float all_reduce with Avg agrees with the native one within rounding", "[distributed]") {
  auto comm = init("mpi");
  const int r = comm->rank();
  Tensor a = kiln::test::sample({1001}, kFloat32, 0.3 + r), b = a.clone();
  ring::all_reduce(*comm, a, ReduceOp::Avg);
  comm->all_reduce(b, ReduceOp::Avg);
  check_close(a, b);
}

TEST_CASE("ring: Avg on integers and bool is an Error, as for the native collectives", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size();
  for (DType t : {kInt64, kInt32, kBool}) {
    check_error([&] { ring::all_reduce(*comm, zeros({4}, t), ReduceOp::Avg); },
                {"ring::all_reduce", "Avg needs a floating dtype", std::string(dtype_name(t))});
    check_error([&] { ring::reduce_scatter(*comm, zeros({2}, t), zeros({2 * p}, t), ReduceOp::Avg); },
                {"ring::reduce_scatter", "Avg needs a floating dtype"});
    check_error([&] { comm->all_reduce(zeros({4}, t), ReduceOp::Avg); }, {"Avg needs a floating dtype"});
  }
  // Nothing reached the other ranks: the communicator still works.
  Tensor v = full({3}, 1.0, kFloat32);
  comm->all_reduce(v);
  check_equal(v, full({3}, static_cast<double>(p), kFloat32));
}

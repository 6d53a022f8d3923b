// tests/cuda/test_nccl.cpp: the NCCL communicator on CUDA tensors, with exact results (each rank
// contributes values made from its rank number, as tests/distributed/test_comm.cpp does on MPI),
// and kiln::Engine at every ZeRO stage on it against one process on the CPU.
// Part of the GPU test binary, which exits 77 without a GPU; run alone it is world size 1 (an MPI
// singleton), and under mpirun every rank needs a GPU of its own.
#include <algorithm>
#include <thread>

#include "models/gpt.h"
#include "support.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_equal;
using kiln::test::check_error;

namespace {

// The NCCL world, or nullptr (the test then passes vacuously) in a build without NCCL or MPI.
std::shared_ptr<Communicator> nccl() {
  if (!is_available("nccl")) {
    WARN("this Kiln has no NCCL backend: NCCL tests skipped");
    return nullptr;
  }
  return init("nccl");
}

// The device init("nccl") picks: cuda(local rank % device count).
Device gpu() { return Device::cuda(world_info().local_rank % cuda::device_count()); }

// rank + i for i = 0 .. n-1, in dtype, on the GPU.
Tensor ramp(int64_t n, int rank, DType dtype) { return (arange(n, kFloat64) + rank).to(dtype).to(gpu()); }

// NCCL averages floats by multiplying each contribution by 1/size: exact when size is a power of 2.
void check_avg(const Tensor& actual, const Tensor& expected, int size) {
  if ((size & (size - 1)) == 0) {
    check_equal(actual.cpu(), expected);
  } else {
    kiln::test::check_close(actual.cpu(), expected);
  }
}

}  // namespace

TEST_CASE("nccl: rank, size and backend agree with the launcher", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  CHECK(comm->backend() == "nccl");
  CHECK(comm->rank() == world_info().rank);
  CHECK(comm->size() == world_info().size);
  CHECK(init("nccl") == comm);  // one world communicator per process
}

TEST_CASE("nccl: all_reduce sum, avg, max and min are exact for every dtype", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  const int64_t n = 1000;
  Tensor i = arange(n, kFloat64);
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    INFO("dtype " << dtype_name(dt));
    const int64_t m = dt == kFloat16 || dt == kBFloat16 ? 50 : n;  // sums exact in bfloat16 up to 4 ranks
    Tensor im = i.narrow(0, 0, m);
    Tensor t = ramp(m, r, dt);
    comm->all_reduce(t);
    check_equal(t.cpu(), (im * p + p * (p - 1) / 2).to(dt));
    t = ramp(m, r, dt);
    comm->all_reduce(t, ReduceOp::Max);
    check_equal(t.cpu(), (im + (p - 1)).to(dt));
    t = ramp(m, r, dt);
    comm->all_reduce(t, ReduceOp::Min);
    check_equal(t.cpu(), im.to(dt));
    if (is_floating(dt)) {
      t = ramp(m, r, dt) * 2;  // avg of 2 (rank + i) = 2i + (p - 1): exact here
      comm->all_reduce(t, ReduceOp::Avg);
      check_avg(t, (im * 2 + (p - 1)).to(dt), p);
    }
  }
  // bool: sum and max are "any", min is "all"
  Tensor b = full({2}, r == 0 ? 1.0 : 0.0, kFloat32).to(kBool).to(gpu());
  Tensor any = b.clone(), all = b.clone();
  comm->all_reduce(any, ReduceOp::Sum);
  comm->all_reduce(all, ReduceOp::Min);
  CHECK(any.cpu().to(kInt64).sum().item<int64_t>() == 2);
  CHECK(all.cpu().to(kInt64).sum().item<int64_t>() == (p == 1 ? 2 : 0));
}

TEST_CASE("nccl: the op is ordered after the kernels before it and before the kernels after wait()",
          "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  const int64_t n = 1 << 20;
  for (int round = 0; round < 3; ++round) {
    Tensor t = ramp(n, r, kFloat32) * 2 + 1;  // kernels on the default stream, not synchronized
    Work w = comm->all_reduce(t, ReduceOp::Sum, /*async_op=*/true);
    w.wait();
    Tensor u = t + 1;  // queued after the wait: sees the sum
    Tensor expected = (arange(n, kFloat64) * 2 * p + p * (p - 1) + p + 1).to(kFloat32);
    check_equal(u.cpu(), expected);
    for (int k = 0; k < 100000 && !w.is_completed(); ++k) std::this_thread::sleep_for(std::chrono::microseconds(10));
    CHECK(w.is_completed());
    CHECK(w.describe() == fmt::format("all_reduce #{} (float32, {} elements, sum)", comm->sequence_number(), n));
  }
}

TEST_CASE("nccl: broadcast from every root and reduce to every root", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  for (int src = 0; src < p; ++src) {
    Tensor t = full({3, 2}, r * 10.0 + 1, kInt64).to(gpu());
    comm->broadcast(t, src);
    check_equal(t.cpu(), full({3, 2}, src * 10.0 + 1, kInt64));
  }
  for (int dst = 0; dst < p; ++dst) {
    Tensor t = full({5}, r + 1.0, kFloat64).to(gpu());
    comm->reduce(t, dst);
    check_equal(t.cpu(), full({5}, r == dst ? p * (p + 1) / 2.0 : r + 1.0, kFloat64));  // others untouched
  }
}

TEST_CASE("nccl: all_gather with uneven sizes, and into one tensor (also in place)", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  std::vector<Tensor> outs;
  for (int k = 0; k < p; ++k) outs.push_back(full({k + 1}, -1.0, kInt32).to(gpu()));
  comm->all_gather(outs, full({r + 1}, r * 3.0, kInt32).to(gpu()));
  for (int k = 0; k < p; ++k) check_equal(outs[static_cast<size_t>(k)].cpu(), full({k + 1}, k * 3.0, kInt32));

  Tensor out = zeros({p, 4}, TensorOptions(kFloat32).device(gpu()));
  comm->all_gather_into_tensor(out, ramp(4, r, kFloat32));
  for (int k = 0; k < p; ++k) check_equal(out.select(0, k).cpu(), ramp(4, k, kFloat32).cpu());

  Tensor buf = full({p * 4}, -1.0, kFloat32).to(gpu());  // this rank's slice already holds its part
  buf.narrow(0, r * 4, 4).copy_(ramp(4, r, kFloat32));
  comm->all_gather_into_tensor(buf, buf.narrow(0, r * 4, 4));
  check_equal(buf.cpu(), out.flatten().cpu());
}

TEST_CASE("nccl: all_to_all with sizes that differ by pair, to this rank itself too", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  // Rank i sends rank k (i + k + 1) values 100 i + k (made by kernels), and nothing to rank k = 1.
  std::vector<Tensor> to, from;
  for (int k = 0; k < p; ++k) {
    const int64_t n = k == 1 || r == 1 ? 0 : r + k + 1;
    to.push_back(zeros({n}, TensorOptions(kFloat32).device(gpu())) + (100.0 * r + k));
    from.push_back(full({n}, -1.0, kFloat32).to(gpu()));
  }
  comm->all_to_all(from, to);
  for (int k = 0; k < p; ++k) {
    const int64_t n = k == 1 || r == 1 ? 0 : r + k + 1;
    check_equal(from[static_cast<size_t>(k)].cpu(), full({n}, 100.0 * k + r, kFloat32));
  }
  // int8 and an all_to_all in flight behind another, as qgZ's values and scales.
  std::vector<Tensor> qt, qf, st, sf;
  for (int k = 0; k < p; ++k) {
    qt.push_back(full({5}, static_cast<double>(r), kInt8).to(gpu()));
    qf.push_back(zeros({5}, kInt8).to(gpu()));
    st.push_back(full({2}, 0.5 + r, kFloat32).to(gpu()));
    sf.push_back(zeros({2}, kFloat32).to(gpu()));
  }
  Work a = comm->all_to_all(qf, qt, /*async_op=*/true), b = comm->all_to_all(sf, st, /*async_op=*/true);
  b.wait();
  a.wait();
  for (int k = 0; k < p; ++k) {
    check_equal(qf[static_cast<size_t>(k)].cpu(), full({5}, static_cast<double>(k), kInt8));
    check_equal(sf[static_cast<size_t>(k)].cpu(), full({2}, 0.5 + k, kFloat32));
  }
}

TEST_CASE("nccl: reduce_scatter with uneven sizes, and from one tensor, with avg", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  std::vector<Tensor> ins;
  for (int k = 0; k < p; ++k) ins.push_back(full({k + 1}, r * 10.0 + k, kInt64).to(gpu()));
  Tensor out = zeros({r + 1}, TensorOptions(kInt64).device(gpu()));
  comm->reduce_scatter(out, ins);
  check_equal(out.cpu(), full({r + 1}, 10.0 * p * (p - 1) / 2 + p * r, kInt64));

  Tensor in = (arange(p * 3, kFloat64).view({p, 3}) + arange(p, kFloat64).unsqueeze(1) * 97 + r).to(kFloat32);
  Tensor o = zeros({3}, TensorOptions(kFloat32).device(gpu()));
  comm->reduce_scatter_tensor(o, in.to(gpu()), ReduceOp::Max);
  check_equal(o.cpu(), (arange(3, kFloat64) + r * 3 + r * 97 + (p - 1)).to(kFloat32));
  comm->reduce_scatter_tensor(o, in.to(gpu()), ReduceOp::Sum);
  check_equal(o.cpu(), ((arange(3, kFloat64) + r * 3 + r * 97) * p + p * (p - 1) / 2).to(kFloat32));
  const Tensor base = arange(3, kFloat64) + r * 3 + r * 97;  // slice r's values, less the sender's rank
  comm->reduce_scatter_tensor(o, (in * 2).to(gpu()), ReduceOp::Avg);  // avg of 2 (base + rank)
  check_avg(o, (base * 2 + (p - 1)).to(kFloat32), p);

  Tensor flat = in.to(gpu()).flatten();  // in place: the output is this rank's slice of the input
  comm->reduce_scatter_tensor(flat.narrow(0, r * 3, 3), flat, ReduceOp::Sum);
  check_equal(flat.narrow(0, r * 3, 3).cpu(), (base * p + p * (p - 1) / 2).to(kFloat32));
}

TEST_CASE("nccl: send and recv around the ring", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  if (p == 1) return;
  // Each rank's ops run in call order on its comm stream: even ranks send first, odd ones receive
  // first, or every rank would wait in its recv.
  Tensor got = zeros({5}, TensorOptions(kFloat64).device(gpu()));
  Tensor mine = full({5}, r + 0.5, kFloat64).to(gpu());
  std::vector<Work> works;
  for (int step = 0; step < 2; ++step) {
    if ((step == 0) == (r % 2 == 0)) {
      works.push_back(comm->send(mine, (r + 1) % p, 0, /*async_op=*/true));
    } else {
      works.push_back(comm->recv(got, (r + p - 1) % p, 0, /*async_op=*/true));
    }
  }
  for (auto& w : works) w.wait();
  check_equal(got.cpu(), full({5}, (r + p - 1) % p + 0.5, kFloat64));
}

TEST_CASE("nccl: split, barrier and sequence numbers", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  const uint64_t before = comm->sequence_number();
  comm->barrier();
  CHECK(comm->sequence_number() == before + 1);
  auto sub = comm->split(r % 2, -r);  // by parity, in reverse rank order
  REQUIRE(sub);
  CHECK(sub->backend() == "nccl");
  CHECK(comm->sequence_number() == before + 2);  // split is numbered, as on MPI
  const int mates = (p - r % 2 + 1) / 2;
  CHECK(sub->size() == mates);
  CHECK(sub->rank() == mates - 1 - r / 2);
  Tensor t = full({4}, r + 1.0, kFloat32).to(gpu());
  sub->all_reduce(t);
  double expected = 0;
  for (int k = r % 2; k < p; k += 2) expected += k + 1;
  check_equal(t.cpu(), full({4}, expected, kFloat32));
  CHECK(comm->split(-1, 0) == nullptr);
}

TEST_CASE("nccl: CPU tensors and bad arguments are Errors before anything is sent", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size();
  check_error([&] { comm->all_reduce(zeros({2})); }, {"all_reduce", "[2]", "cpu", "init(\"mpi\")"});
  check_error([&] { comm->all_reduce(zeros({4, 4}).to(gpu()).t()); }, {"all_reduce", "not contiguous"});
  check_error([&] { comm->broadcast(zeros({2}).to(gpu()), p); }, {"broadcast", "src = ", "not a rank"});
  check_error([&] { comm->all_reduce(zeros({2}, kInt64).to(gpu()), ReduceOp::Avg); }, {"Avg needs a floating dtype"});
  comm->barrier();  // nothing above reached the other ranks
}

// kiln::Engine on the NCCL world: a small GPT (tied head) on this rank's GPU, data-parallel over
// the ranks at every ZeRO stage (gradients reduced in buckets during backward, the optimizer's
// state, the gradients and at stage 3 the weights sharded, each exchange on NCCL's stream), with
// accumulation and clipping, against GPT on one process on the CPU with the whole batch. Run alone
// it is world size 1: the collectives then copy, but every stream and event is the real one. The
// last case is stage 3 with the weights' shard and the optimizer in host memory (offload_param,
// offload_optimizer): each rank's piece goes to the GPU before its all-gather, and the step runs on
// the host in sub-groups.
TEST_CASE("nccl: the engine at every ZeRO stage trains a GPT as one process on the CPU does", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  const int p = comm->size(), r = comm->rank();
  models::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 8;
  c.vocab_size = 24;
  const int64_t micro = 2, gas = 2;
  for (int kase = 0; kase < 5; ++kase) {
    const int stage = std::min(kase, 3);
    const bool offload = kase == 4;
    INFO("ZeRO stage " << stage << (offload ? ", offloaded" : ""));
    const std::string offloading = offload ? R"(, "offload_param": {"device": "cpu"},
        "offload_optimizer": {"device": "cpu"}, "sub_group_size": 2000)" : "";
    const Config cfg = Config::from_string(fmt::format(R"({{
        "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 0.5,
        "steps_per_print": 1000, "optimizer": {{"type": "SGD", "params": {{"lr": 0.1, "momentum": 0.9}}}},
        "zero_optimization": {{"stage": {}, "reduce_bucket_size": 3000, "overlap_comm": true,
                                "stage3_param_persistence_threshold": 0{}}}}})", micro, gas, stage, offloading));
    manual_seed(5);
    models::GPT ref(c);
    manual_seed(5);
    models::GPT local(c);
    local.to(gpu());
    Engine engine = kiln::initialize(local, cfg, comm);
    // GPT's forward reads the embedding's weight for its tied head itself.
    if (stage == 3) engine.optimizer().register_external_parameter(local, local.transformer.wte.weight);
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.1, .momentum = 0.9});
    Generator data(9);
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step);
      // gas micro-batches of micro rows per rank; the reference takes them all at once.
      Tensor idx = randint(0, c.vocab_size, {gas * p * micro, c.block_size}, kInt64, &data);
      Tensor targets = randint(0, c.vocab_size, {gas * p * micro, c.block_size}, kInt64, &data);
      opt_ref.zero_grad();
      models::GPT::loss(ref(idx), targets).backward();
      const double norm_ref = nn::utils::clip_grad_norm_(ref.parameters(), 0.5).item<double>();
      opt_ref.step();
      for (int64_t k = 0; k < gas; ++k) {
        const int64_t first = (k * p + r) * micro;
        Tensor x = idx.narrow(0, first, micro).to(gpu()), y = targets.narrow(0, first, micro).to(gpu());
        engine.backward(models::GPT::loss(engine(x), y));
        engine.step();
      }
      CHECK(engine.get_global_grad_norm() == Approx(norm_ref).epsilon(1e-4));
    }
    ZeroOptimizer::GatheredParameters gathered(engine.optimizer());
    for (const auto& [name, t] : ref.named_parameters()) {
      INFO(name);
      const Tensor mine = local.state_dict().at(name);
      CHECK(mine.device() == gpu());
      kiln::test::check_close(mine.cpu(), t, {1e-4, 1e-5});
    }
  }
}

// DeepSpeed's torch_autocast on the GPU: float16 by default there, the loss scaled by
// torch.amp.GradScaler's rule, the Linears' gradients averaged in float16 through NCCL.
TEST_CASE("nccl: torch_autocast runs forward in float16 and averages the Linears' gradients in it", "[gpu][nccl]") {
  auto comm = nccl();
  if (!comm) return;
  if (comm->size() != 1) {
    WARN("the expected gradients are one rank's: run at world size 1");
    return;
  }
  for (int stage : {0, 2, 3}) {
    INFO("ZeRO stage " << stage);
    manual_seed(7);
    kiln::test::NormNet net(16, 32, 8), ref(16, 32, 8);
    ref.load_state_dict(net.state_dict());
    net.to(gpu());
    ref.to(gpu());
    Engine engine = kiln::initialize(net, Config::from_string(fmt::format(R"({{"train_micro_batch_size_per_gpu": 4,
        "optimizer": {{"type": "SGD", "params": {{"lr": 0.1}}}}, "torch_autocast": {{"enabled": true}},
        "zero_optimization": {{"stage": {}}}}})", stage)), comm);
    CHECK(engine.autocast_dtype() == kFloat16);  // torch.autocast's default on CUDA
    CHECK(engine.loss_scale() == 65536);
    Generator data(3);
    Tensor x = randn({4, 16}, kFloat32, &data).to(gpu());
    Tensor y = randint(0, 8, {4}, kInt64, &data).to(gpu());
    const Tensor out = engine(x);
    CHECK(out.dtype() == kFloat16);
    // The loss under autocast, as PyTorch asks: float32 by its policy for losses. Outside it the
    // loss of float16 logits is float16, and its own gradient, the loss scale 2^16, overflows float16
    // (max 65504): every gradient was inf or NaN on both sides (an H200, 2026-12-04; the CPU under
    // float16 autocast too). And over 2^10 (exact): scaled by 2^16, f2's float16 weight gradient
    // sums 4 rows of up to 2^14 times activations of up to about 5.6, which can pass 65504.
    Tensor loss, ref_loss;
    {
      AutocastGuard autocast(gpu(), kFloat16);
      loss = nn::cross_entropy(out, y) / 1024.0;
    }
    CHECK(loss.dtype() == kFloat32);
    engine.backward(loss);
    {
      AutocastGuard autocast(gpu(), kFloat16);
      ref_loss = nn::cross_entropy(ref(x), y) / 1024.0;
    }
    optim::GradScaler scaler;  // 2^16, scaling the loss as the engine's does
    scaler.scale(ref_loss).backward();
    const Tensor got = engine.optimizer().grads()[0].cpu();
    CHECK(got.isfinite().all().item<bool>());
    const FlatLayout& layout = engine.optimizer().layout();
    const FlatRange part = layout.partition(stage > 0 ? comm->rank() : 0);
    const auto params = ref.parameters();
    for (int64_t i = 0; i < layout.num_params(); ++i) {
      INFO("parameter " << i);
      const FlatRange piece = intersect(layout.param(i), part);
      if (piece.empty()) continue;
      const Tensor g = got.narrow(0, piece.begin - part.begin, piece.size());
      // One rank averages over itself: the Linears' gradients rounded to float16, the LayerNorm's as they are.
      Tensor e = params[static_cast<size_t>(i)].grad().cpu().reshape({-1});
      e = e.narrow(0, piece.begin - layout.param(i).begin, piece.size());
      if (i == 2 || i == 3) check_equal(g, e);
      else check_equal(g, e.to(kFloat16).to(kFloat32));
    }
    engine.step();
    CHECK(engine.global_steps() == 1);
  }
}

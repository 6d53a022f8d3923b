// tests/distributed/test_grid.cpp: the data x pipeline x tensor grid (distributed/grid/): each
// rank's coordinates and axis communicators, and "3D parallelism" put together: a model of
// tensor-parallel MLP blocks cut into pipeline stages, replicated over the data axis, trains as one
// process trains the whole model on the whole batch.
#include <climits>

#include "parity.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_close;
using kiln::test::check_error;

namespace {

constexpr int kBlocks = 4;

// The whole model on one process: in (10 -> 12), 4 residual GELU MLP blocks (12 -> 48 -> 12), head (12 -> 5).
// 48 hidden features split among 1, 2, 3 or 4 tensor ranks.
struct Whole : nn::Module {
  nn::Linear in{10, 12}, head{12, 5};
  std::vector<std::shared_ptr<nn::GeluMLP>> blocks;
  Whole() {
    register_module("in", in);
    for (int b = 0; b < kBlocks; ++b) {
      blocks.push_back(std::make_shared<nn::GeluMLP>(12));
      register_module(std::to_string(b), blocks.back());
    }
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = in(x);
    for (auto& b : blocks) h = h + (*b)(h);
    return head(h);
  }
};

// Pipeline stage s of p: the blocks [s K/p, (s+1) K/p), tensor-parallel, with `in` on the first
// stage and `head` on the last, its weights copied from the whole model's.
struct Stage : nn::Module {
  std::shared_ptr<nn::Linear> in, head;
  std::vector<std::shared_ptr<ParallelMLP>> blocks;
  int first, last;
  Stage(const Whole& whole, int s, int p, const std::shared_ptr<Communicator>& tp)
      : first(s * kBlocks / p), last((s + 1) * kBlocks / p) {
    if (s == 0) {
      in = std::make_shared<nn::Linear>(10, 12);
      register_module("in", in);
      in->load_state_dict(whole.in.state_dict());
    }
    for (int b = first; b < last; ++b) {
      auto block = std::make_shared<ParallelMLP>(12, 48, tp);
      register_module(std::to_string(b), block);
      const nn::GeluMLP& w = *whole.blocks[static_cast<size_t>(b)];
      block->fc.load_full(w.c_fc.weight, w.c_fc.bias);
      block->proj.load_full(w.c_proj.weight, w.c_proj.bias);
      blocks.push_back(block);
    }
    if (s == p - 1) {
      head = std::make_shared<nn::Linear>(12, 5);
      register_module("head", head);
      head->load_state_dict(whole.head.state_dict());
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = in ? (*in)(x) : x;
    for (auto& b : blocks) h = h + (*b)(h);
    return head ? (*head)(h) : h;
  }
};

}  // namespace

TEST_CASE("grid: every rank's coordinates and axis communicators", "[distributed]") {
  auto world = init("mpi");
  const int n = world->size(), r = world->rank();
  for (const GridSizes& sizes : kiln::test::grid_shapes(n)) {
    INFO("tensor " << sizes.tensor << ", pipeline " << sizes.pipeline);
    ParallelGrid grid(world, sizes);
    const int t = sizes.tensor, d = n / (t * sizes.pipeline);
    CHECK(grid.data_size() == d);
    CHECK(r == (grid.pipeline_rank() * d + grid.data_rank()) * t + grid.tensor_rank());
    CHECK(grid.tensor()->size() == t);
    CHECK(grid.pipeline()->size() == sizes.pipeline);
    CHECK(grid.data()->size() == d);
    CHECK(grid.tensor()->rank() == grid.tensor_rank());
    CHECK(grid.pipeline()->rank() == grid.pipeline_rank());
    CHECK(grid.data()->rank() == grid.data_rank());
    // The sum of the world ranks on each axis: the ranks that differ from this one in that index only.
    auto sum_over = [&](Communicator& c) {
      Tensor v = from_vector<int64_t>({r});
      c.all_reduce(v);
      return v.item<int64_t>();
    };
    int64_t tensor_sum = 0, pipeline_sum = 0, data_sum = 0;
    for (int i = 0; i < t; ++i) tensor_sum += r - grid.tensor_rank() + i;
    for (int i = 0; i < sizes.pipeline; ++i) pipeline_sum += r + (i - grid.pipeline_rank()) * d * t;
    for (int i = 0; i < d; ++i) data_sum += r + (i - grid.data_rank()) * t;
    CHECK(sum_over(*grid.tensor()) == tensor_sum);
    CHECK(sum_over(*grid.pipeline()) == pipeline_sum);
    CHECK(sum_over(*grid.data()) == data_sum);
  }
  if (n > 1) check_error([&] { ParallelGrid g(world, {.tensor = n + 1}); }, {"do not make a grid"});
  // tensor x pipeline is taken in int64: 2^16 x 2^16 wrapped to 0 in int (a division by zero), and
  // INT_MAX x INT_MAX to 1, which made a "grid" of every world size.
  check_error([&] { ParallelGrid g(world, {.tensor = 65536, .pipeline = 65536}); },
              {"do not make a grid", "4294967296"});
  check_error([&] { ParallelGrid g(world, {.tensor = INT_MAX, .pipeline = INT_MAX}); },
              {"do not make a grid", "4611686014132420609"});
  // Sizes given differently on some rank are an Error on every rank (the grid's axes disagreed with
  // its sizes before), and the world communicator is still in step afterwards.
  if (n > 1) {
    check_error([&] { ParallelGrid g(world, {.tensor = r == 0 ? n : 1}); }, {"different grid sizes"});
    Tensor v = from_vector<int64_t>({1});
    world->all_reduce(v);
    CHECK(v.item<int64_t>() == n);
  }
}

TEST_CASE("grid: data x pipeline x tensor parallel training matches one process over 10 steps", "[distributed]") {
  auto world = init("mpi");
  const int n = world->size();
  for (const GridSizes& sizes : kiln::test::grid_shapes(n)) {
    INFO("tensor " << sizes.tensor << ", pipeline " << sizes.pipeline << ", data " << n / (sizes.tensor * sizes.pipeline));
    ParallelGrid grid(world, sizes);
    manual_seed(17);
    Whole whole;
    Stage stage(whole, grid.pipeline_rank(), grid.pipeline_size(), grid.tensor());
    Pipeline pipe(stage, grid.pipeline(), [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); },
                  {.micro_batches = 2});
    optim::SGD opt_ref(whole.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt(stage.parameters(), {.lr = 0.1, .momentum = 0.9});
    const int64_t rows = 24, shard = rows / grid.data_size();  // 24: whole micro-batches at every data size
    for (int step = 0; step < 10; ++step) {
      INFO("step " << step);
      Tensor x = kiln::test::sample({rows, 10}, kFloat32, 0.3 * step + 0.1);
      Tensor y = ((kiln::test::sample({rows}, kFloat64, 1.3 + step) + 2) * 1.2).to(kInt64);
      opt_ref.zero_grad();
      Tensor loss_ref = nn::cross_entropy(whole(x), y);
      loss_ref.backward();
      opt_ref.step();

      opt.zero_grad();
      Tensor xs = x.narrow(0, grid.data_rank() * shard, shard), ys = y.narrow(0, grid.data_rank() * shard, shard);
      Tensor loss = pipe.train_batch(xs, ys).reshape({1});
      all_reduce_gradients(stage, *grid.data());
      opt.step();
      grid.data()->all_reduce(loss, ReduceOp::Avg);
      check_close(loss.reshape({}), loss_ref.detach(), {1e-5, 1e-7});
    }
    const int t = grid.tensor_rank(), T = grid.tensor_size();
    for (size_t i = 0; i < stage.blocks.size(); ++i) {
      const nn::GeluMLP& w = *whole.blocks[static_cast<size_t>(stage.first) + i];
      check_close(stage.blocks[i]->fc.weight, w.c_fc.weight.narrow(0, t * 48 / T, 48 / T), {1e-5, 1e-6});
      check_close(stage.blocks[i]->proj.weight, w.c_proj.weight.narrow(1, t * 48 / T, 48 / T), {1e-5, 1e-6});
    }
    if (stage.head) check_close(stage.head->weight, whole.head.weight, {1e-5, 1e-6});
    if (stage.in) check_close(stage.in->weight, whole.in.weight, {1e-5, 1e-6});
  }
}

TEST_CASE("grid: the engine trains data x pipeline x tensor parallel, clipping included, as one process",
          "[distributed]") {
  auto world = init("mpi");
  const int n = world->size();
  for (const GridSizes& sizes : kiln::test::grid_shapes(n)) {
    const int data = n / (sizes.tensor * sizes.pipeline);
    INFO("tensor " << sizes.tensor << ", pipeline " << sizes.pipeline << ", data " << data);
    ParallelGrid grid(world, sizes);
    manual_seed(19);
    Whole whole;
    Stage stage(whole, grid.pipeline_rank(), grid.pipeline_size(), grid.tensor());
    const int64_t rows = 24, shard = rows / data;  // 2 micro-batches per rank
    // Clipping at 0.2 binds in every step: the norm must count each weight once, the replicated ones
    // (in, head, the row-parallel biases) on one tensor rank only. ZeRO stage 1 over the data axis.
    const Config cfg = Config::from_string(fmt::format(R"({{
        "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 2, "gradient_clipping": 0.2,
        "steps_per_print": 1000, "optimizer": {{"type": "SGD", "params": {{"lr": 0.1, "momentum": 0.9}}}},
        "zero_optimization": {{"stage": 1}}}})", shard / 2));
    Engine engine = kiln::initialize(stage, cfg, grid,
                                     [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); });
    optim::SGD opt_ref(whole.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      Tensor x = kiln::test::sample({rows, 10}, kFloat32, 0.3 * step + 0.2);
      Tensor y = ((kiln::test::sample({rows}, kFloat64, 1.1 + step) + 2) * 1.2).to(kInt64);
      opt_ref.zero_grad();
      Tensor loss_ref = nn::cross_entropy(whole(x), y);
      loss_ref.backward();
      const double norm_ref = nn::utils::clip_grad_norm_(whole.parameters(), 0.2).item<double>();
      CHECK(norm_ref > 0.2);
      opt_ref.step();
      const int d = grid.data_rank();
      Tensor loss = engine.train_batch(x.narrow(0, d * shard, shard), y.narrow(0, d * shard, shard));
      check_close(loss, loss_ref.detach(), {1e-5, 1e-7});
      CHECK(engine.get_global_grad_norm() == Approx(norm_ref).epsilon(1e-5));
    }
    const int t = grid.tensor_rank(), T = grid.tensor_size();
    for (size_t i = 0; i < stage.blocks.size(); ++i) {
      const nn::GeluMLP& w = *whole.blocks[static_cast<size_t>(stage.first) + i];
      check_close(stage.blocks[i]->fc.weight, w.c_fc.weight.narrow(0, t * 48 / T, 48 / T), {1e-5, 1e-6});
      check_close(stage.blocks[i]->proj.weight, w.c_proj.weight.narrow(1, t * 48 / T, 48 / T), {1e-5, 1e-6});
      check_close(stage.blocks[i]->proj.bias, w.c_proj.bias, {1e-5, 1e-6});
      check_close(stage.blocks[i]->fc.bias, w.c_fc.bias.narrow(0, t * 48 / T, 48 / T), {1e-5, 1e-6});
    }
    if (stage.head) {
      check_close(stage.head->weight, whole.head.weight, {1e-5, 1e-6});
      check_close(stage.head->bias, whole.head.bias, {1e-5, 1e-6});
    }
    if (stage.in) {
      check_close(stage.in->weight, whole.in.weight, {1e-5, 1e-6});
      check_close(stage.in->bias, whole.in.bias, {1e-5, 1e-6});
    }
  }
}

// tests/distributed/test_header_examples.cpp: the examples in the comments of distributed/zero,
// engine, pipeline, tensor_parallel and grid headers, compiled and run at every world size (a stale
// comment is a bug). A loop over two batches stands for the data loader.
#include <filesystem>
#include <fstream>

#include "data/safetensors.h"
#include "parity.h"

using namespace kiln;
using kiln::test::batch;
using kiln::test::Mlp;

namespace {

// The examples' "MyStage": stage s of a pipeline of p, each an nn::Linear (the last one to 10 classes),
// its layers tensor-parallel where a tensor communicator is given.
struct MyStage : nn::Module {
  std::shared_ptr<nn::Linear> layer;
  std::shared_ptr<distributed::ParallelMLP> mlp;
  MyStage(int s, int p, std::shared_ptr<distributed::Communicator> tp = nullptr) {
    layer = std::make_shared<nn::Linear>(20, s == p - 1 ? 10 : 20);
    register_module("layer", layer);
    if (tp) {
      mlp = std::make_shared<distributed::ParallelMLP>(20, 48, tp);
      register_module("mlp", mlp);
    }
  }
  Tensor forward(const Tensor& x) override { return (*layer)(mlp ? x + (*mlp)(x) : x); }
};

}  // namespace

TEST_CASE("The distributed headers' examples compile and run", "[distributed][examples]") {
  // distributed/zero/zero_optimizer.h
  {
    auto comm = distributed::init();
    Mlp net;
    distributed::ZeroOptimizer opt(net, comm, [](std::vector<Tensor> masters) {
      return std::make_unique<optim::AdamW>(std::move(masters), optim::AdamWOptions{.lr = 1e-3});
    }, {.stage = 2});
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step, 4);
      Tensor loss = nn::cross_entropy(net(x), y);
      opt.zero_grad();  loss.backward();  opt.step();
    }
  }
  // distributed/comm/comms_logger.h (and docs/profiling.md's DistributedDataParallel)
  {
    auto logger = std::make_shared<distributed::CommsLogger>(distributed::CommsLoggerOptions{.enabled = true});
    auto comm = distributed::log_communication(distributed::init(), logger);
    Mlp model;
    distributed::DistributedDataParallel ddp(model, comm);   // its all-reduces are logged
    optim::SGD opt(ddp.parameters(), {.lr = 0.1});
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step, 4);
      Tensor loss = nn::cross_entropy(ddp(x), y);
      opt.zero_grad();  loss.backward();  opt.step();
    }
    const std::string out = kiln::test::captured_output(1, [&] {
      if (comm->rank() == 0) fmt::print("{}", logger->summary());
    });
    CHECK((comm->rank() == 0) == (out.find("all_reduce") != std::string::npos));
  }
  // distributed/engine/engine.h and config.h
  {
    auto comm = distributed::init();
    std::string dir;
    if (comm->rank() == 0) {
      char tmpl[] = "/tmp/kiln-examples-XXXXXX";
      dir = mkdtemp(tmpl);
      std::ofstream(dir + "/ds_config.json") << R"({"train_micro_batch_size_per_gpu": 4,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}})";
    }
    Tensor chars = zeros({64}, kInt32);  // the directory's name, from rank 0
    if (comm->rank() == 0) {
      std::vector<int32_t> v(64, 0);
      std::copy(dir.begin(), dir.end(), v.begin());
      chars.copy_(from_vector<int32_t>(v));
    }
    comm->broadcast(chars, 0);
    dir.clear();
    for (int32_t c : chars.to_vector<int32_t>()) if (c != 0) dir += static_cast<char>(c);
    Mlp model;
    auto engine = kiln::initialize(model, Config::from_file(dir + "/ds_config.json"), comm);
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step, engine.train_micro_batch_size_per_gpu());
      Tensor loss = nn::cross_entropy(engine(x), y);
      engine.backward(loss);
      engine.step();
    }
    engine.save_checkpoint(dir + "/ckpt");
    CHECK(engine.save_16bit_model(dir + "/out"));
    CHECK(engine.global_steps() == 2);
    if (comm->rank() == 0) CHECK(safetensors::load_file(dir + "/out/model.safetensors").size() == 6);
    CHECK(engine.load_checkpoint(dir + "/ckpt") == "global_step2");
    comm->barrier();
    if (comm->rank() == 0) std::filesystem::remove_all(dir);
  }
  // distributed/engine/engine.h, pipeline parallel (2 stages where the ranks pair up)
  {
    auto world = distributed::init();
    distributed::ParallelGrid grid(world, {.pipeline = world->size() % 2 == 0 ? 2 : 1});
    MyStage stage(grid.pipeline_rank(), grid.pipeline_size());
    auto loss_fn = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
    const Config config = Config::from_string(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
    auto engine = kiln::initialize(stage, config, grid, loss_fn);
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step, 8);
      Tensor loss = engine.train_batch(x, y);
      CHECK(std::isfinite(loss.item<double>()));
    }
    CHECK(engine.global_steps() == 2);
  }
  // distributed/pipeline/pipeline.h
  {
    auto comm = distributed::init();
    MyStage stage(comm->rank(), comm->size());
    auto loss_fn = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
    distributed::Pipeline pipe(stage, comm, loss_fn, {.micro_batches = 8});
    optim::AdamW opt(stage.parameters());
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step, 16);
      opt.zero_grad();
      Tensor loss = pipe.train_batch(x, y);
      opt.step();
      CHECK(std::isfinite(loss.item<double>()));
    }
  }
  // distributed/tensor_parallel/tensor_parallel.h
  {
    auto tp = distributed::init();
    distributed::ColumnParallelLinear fc(768, 3072, tp);
    distributed::RowParallelLinear proj(3072, 768, tp);
    Tensor x = kiln::test::sample({2, 768});
    Tensor y = proj(gelu(fc(x)));
    CHECK(fc.weight.sizes() == Shape({3072 / tp->size(), 768}));
    CHECK(y.sizes() == Shape({2, 768}));
  }
  // distributed/grid/grid.h (with as many ranks as there are: tensor 2 and pipeline 2 where they fit)
  {
    auto world = distributed::init();
    const int n = world->size();
    distributed::ParallelGrid grid(world, {.tensor = n % 2 == 0 ? 2 : 1, .pipeline = n % 4 == 0 ? 2 : 1});
    MyStage stage(grid.pipeline_rank(), grid.pipeline_size(), grid.tensor());
    auto loss_fn = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
    distributed::Pipeline pipe(stage, grid.pipeline(), loss_fn);
    optim::SGD opt(stage.parameters(), {.lr = 0.1});
    auto [x, y] = batch(0, 4 * 4 * grid.data_size());
    const int64_t shard = x.size(0) / grid.data_size();
    Tensor x_shard = x.narrow(0, grid.data_rank() * shard, shard), y_shard = y.narrow(0, grid.data_rank() * shard, shard);
    opt.zero_grad();
    Tensor loss = pipe.train_batch(x_shard, y_shard);
    distributed::all_reduce_gradients(stage, *grid.data());
    opt.step();
    CHECK(std::isfinite(loss.item<double>()));
  }
}

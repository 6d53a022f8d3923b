// tests/distributed/test_pipeline.cpp: pipeline parallelism (distributed/pipeline/) at 1-4 stages
// against one process training the whole model on the whole batch: the losses of every step and
// every weight match, for GPipe, 1F1B and interleaved 1F1B (2 and 3 chunks per rank), and each
// schedule keeps as many micro-batches alive as it should; with dropout, chunks that draw as the
// whole model does get one process's masks; a stage keeps only the gradient edges of its outputs.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support.h"

using namespace kiln;
using namespace kiln::distributed;
using kiln::test::check_close;
using kiln::test::check_error;

namespace {

constexpr int kLayers = 8;

// The whole model: 8 (or `total`) Linear layers, tanh between them. A stage holds layers [begin, end).
struct Layers : nn::Module {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  int begin, end, total;
  int eval_forwards = 0;  // forwards run in eval mode
  std::vector<std::string>* trace = nullptr;  // where a training forward writes "F" and `name`
  std::string name;
  Layers(int b, int e, int total_layers = kLayers) : begin(b), end(e), total(total_layers) {
    for (int i = b; i < e; ++i) {
      const int64_t in = i == 0 ? 12 : 16, out = i == total - 1 ? 5 : 16;
      layers.push_back(std::make_shared<nn::Linear>(in, out));
      register_module(std::to_string(i), layers.back());
    }
  }
  Tensor forward(const Tensor& x) override {
    if (!is_training()) ++eval_forwards;
    if (is_training() && trace) trace->push_back("F" + name);
    Tensor h = x;
    for (int i = begin; i < end; ++i) {
      h = (*layers[static_cast<size_t>(i - begin)])(h);
      if (i != total - 1) h = tanh(h);
    }
    return h;
  }
};

std::pair<int, int> stage_range(int s, int p, int total = kLayers) { return {s * total / p, (s + 1) * total / p}; }

std::pair<Tensor, Tensor> batch(int step, int64_t rows) {
  Tensor x = kiln::test::sample({rows, 12}, kFloat32, 0.37 * step + 0.2);
  Tensor y = ((kiln::test::sample({rows}, kFloat64, 0.9 + step) + 2) * 1.2).to(kInt64);  // classes 0..4
  return {x, y};
}

Tensor loss_fn(const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); }

// The reference: one step of the whole model on the whole batch, in one process; its loss.
Tensor reference_step(nn::Module& ref, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss = loss_fn(ref(x), y);
  loss.backward();
  opt.step();
  return loss.detach();
}

// This rank's v chunks of `ref` as modules of type L (chunk c: virtual stage c p + s of v p), each
// with its layers' weights copied from ref's, and what a Pipeline and an optimizer take of them.
template <class L>
struct Chunks {
  std::vector<std::unique_ptr<L>> modules;
  std::vector<nn::Module*> pointers;
  std::vector<Tensor> params;
};
template <class L>
Chunks<L> make_chunks(const Layers& ref, int64_t v, int p, int s) {
  Chunks<L> out;
  for (int64_t c = 0; c < v; ++c) {
    const auto [begin, end] = stage_range(static_cast<int>(c * p + s), static_cast<int>(v * p), ref.total);
    out.modules.push_back(std::make_unique<L>(begin, end, ref.total));
    for (int i = begin; i < end; ++i) {
      out.modules.back()->layers[static_cast<size_t>(i - begin)]->load_state_dict(
          ref.layers[static_cast<size_t>(i)]->state_dict());
    }
    out.pointers.push_back(out.modules.back().get());
    for (const Tensor& t : out.modules.back()->parameters()) out.params.push_back(t);
  }
  return out;
}

}  // namespace

TEST_CASE("pipeline: GPipe and 1F1B on p stages match one process over 20 steps", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), s = comm->rank();
  const auto [begin, end] = stage_range(s, p);
  const int64_t rows = 12;
  // m = 1 (fewer micro-batches than stages: 1F1B's warm-up takes them all) and m = 4.
  // Receives posted when needed (the default) and ahead of need.
  struct Case {
    PipelineSchedule schedule;
    int64_t m;
    bool recv_ahead;
  };
  using enum PipelineSchedule;
  for (auto [schedule, m, ahead] : {Case{kGPipe, 4, false}, Case{k1F1B, 4, false}, Case{k1F1B, 1, false},
                                    Case{kGPipe, 1, false}, Case{k1F1B, 4, true}, Case{kGPipe, 4, true},
                                    Case{k1F1B, 1, true}}) {
    INFO("schedule " << (schedule == PipelineSchedule::kGPipe ? "GPipe" : "1F1B") << ", m " << m << ", recv_ahead "
                     << ahead);
    manual_seed(5);
    Layers ref(0, kLayers);
    Layers stage(begin, end);
    for (int i = begin; i < end; ++i) {
      stage.layers[static_cast<size_t>(i - begin)]->load_state_dict(ref.layers[static_cast<size_t>(i)]->state_dict());
    }
    Pipeline pipe(stage, comm, loss_fn, {.micro_batches = m, .schedule = schedule, .recv_ahead = ahead});
    CHECK(pipe.is_first_stage() == (s == 0));
    CHECK(pipe.is_last_stage() == (s == p - 1));
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.2, .momentum = 0.9});
    optim::SGD opt(stage.parameters(), {.lr = 0.2, .momentum = 0.9});
    for (int step = 0; step < 20; ++step) {
      INFO("step " << step);
      auto [x, y] = batch(step, rows);
      Tensor loss_ref = reference_step(ref, opt_ref, x, y);
      opt.zero_grad();
      // Only the first stage reads the input and only the last the target.
      Tensor loss = pipe.train_batch(s == 0 ? x : Tensor(), s == p - 1 ? y : Tensor());
      opt.step();
      check_close(loss, loss_ref, {1e-5, 1e-7});
      const auto stats = pipe.last_stats();
      CHECK(stats.peak_in_flight == (schedule == PipelineSchedule::kGPipe ? m : std::min<int64_t>(p - s, m)));
      CHECK(stats.seconds >= stats.wait_seconds);
    }
    for (int i = begin; i < end; ++i) {
      INFO("layer " << i);
      check_close(stage.layers[static_cast<size_t>(i - begin)]->weight, ref.layers[static_cast<size_t>(i)]->weight,
                  {1e-5, 1e-6});
      check_close(stage.layers[static_cast<size_t>(i - begin)]->bias, ref.layers[static_cast<size_t>(i)]->bias,
                  {1e-5, 1e-6});
    }
    // Forward only: the last stage gets the whole batch's outputs. Every micro-batch runs in eval
    // mode (as DeepSpeed's eval_batch), and the stage is back in training mode afterwards.
    CHECK(stage.eval_forwards == 0);
    auto [x, y] = batch(99, rows);
    Tensor out = pipe.eval_batch(s == 0 ? x : Tensor());
    CHECK(stage.eval_forwards == m);
    CHECK(stage.is_training());
    if (s == p - 1) {
      NoGradGuard no_grad;
      check_close(out, ref(x), {1e-5, 1e-6});
    } else {
      CHECK_FALSE(out.defined());
    }
  }
}

// Megatron-LM's deallocate_output_tensor: once sent, an output's values are not needed for the
// backward, only the graph behind it. Each output the stage made is watched through its TensorImpl,
// which only the pipeline holds (the send takes a detached handle, and tanh saves its output as
// another handle): at the first backward, with deallocate_outputs none is alive, without it all m
// are. Their storage goes when the send that shares it completes (not timed here). The two train
// alike, bit for bit.
TEST_CASE("pipeline: a stage keeps only the gradient edge of each output it sent", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), s = comm->rank();
  const auto [begin, end] = stage_range(s, p);
  const int64_t m = 4;
  std::vector<Tensor> weights[2];
  for (bool deallocate : {true, false}) {
    INFO("deallocate_outputs " << deallocate);
    manual_seed(5);
    Layers stage(begin, end);
    std::vector<std::weak_ptr<TensorImpl>> outputs;
    stage.register_forward_hook([&outputs](nn::Module&, const Tensor&, const Tensor& out) {
      outputs.push_back(out.impl_ptr());
      return out;
    });
    int64_t alive = -1;
    PipelineOptions options{.micro_batches = m, .schedule = PipelineSchedule::kGPipe};
    options.deallocate_outputs = deallocate;
    options.before_backward = [&](int64_t k, bool) {
      if (k == 0) alive = std::count_if(outputs.begin(), outputs.end(), [](const auto& w) { return !w.expired(); });
    };
    Pipeline pipe(stage, comm, loss_fn, options);
    optim::SGD opt(stage.parameters(), {.lr = 0.2});
    for (int step = 0; step < 3; ++step) {
      outputs.clear();
      auto [x, y] = batch(step, 12);
      opt.zero_grad();
      pipe.train_batch(s == 0 ? x : Tensor(), s == p - 1 ? y : Tensor());
      opt.step();
      CHECK(outputs.size() == static_cast<size_t>(m));
      // The last stage's outputs feed its loss, whose graph holds them either way.
      if (s != p - 1) CHECK(alive == (deallocate ? 0 : m));
    }
    for (const Tensor& w : stage.parameters()) weights[deallocate ? 0 : 1].push_back(w.detach().clone());
  }
  for (size_t i = 0; i < weights[0].size(); ++i) kiln::test::check_equal(weights[0][i], weights[1][i]);
}

TEST_CASE("pipeline: interleaved 1F1B with 2 and 3 chunks per rank matches one process over 20 steps",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), s = comm->rank();
  constexpr int kTotal = 12;  // layers: every virtual stage holds one at least (4 ranks x 3 chunks)
  struct Case {
    int64_t v, m;
    bool recv_ahead;
  };
  // m = p (on 2 ranks, the warm-up takes every forward but on the last rank), 2p and 3p; one chunk
  // runs 1F1B (m = 3 need not be a multiple of p there).
  for (auto [v, m, ahead] : {Case{2, p, false}, Case{2, 2 * p, false}, Case{3, 2 * p, true}, Case{2, 3 * p, true},
                             Case{3, p, false}, Case{1, 3, false}}) {
    INFO("v " << v << ", m " << m << ", recv_ahead " << ahead);
    manual_seed(5);
    Layers ref(0, kTotal, kTotal);
    Chunks<Layers> made = make_chunks<Layers>(ref, v, p, s);  // chunk c: virtual stage c p + s
    auto& [chunks, pointers, params] = made;
    // The ops in the order they ran: "F<chunk>" from each chunk's forward, "B<chunk>.<micro-batch>"
    // from before_backward; and whether each backward was called its chunk's last.
    std::vector<std::string> trace;
    std::vector<bool> lasts;
    for (int64_t c = 0; c < v; ++c) {
      chunks[static_cast<size_t>(c)]->trace = &trace;
      chunks[static_cast<size_t>(c)]->name = std::to_string(c);
    }
    Pipeline* seen = nullptr;
    Pipeline pipe(pointers, comm, loss_fn,
                  {.micro_batches = m, .schedule = PipelineSchedule::kInterleaved1F1B, .recv_ahead = ahead,
                   .before_backward = [&](int64_t i, bool last) {
                     trace.push_back(fmt::format("B{}.{}", seen->chunk_index(), i));
                     lasts.push_back(last);
                   }});
    seen = &pipe;
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.2, .momentum = 0.9});
    optim::SGD opt(params, {.lr = 0.2, .momentum = 0.9});
    // Megatron-LM's order, written out: the micro-batches p at a time (all of them in turn with one
    // chunk), each group through chunks 0, 1, ... forward and ..., 1, 0 backward; a warm-up of
    // forwards, then one forward and one backward in turn, then the backwards left. At most the
    // warm-up's forwards and one more are alive.
    const int64_t warmup = v == 1 ? std::min<int64_t>(p - s - 1, m)
                                  : std::min<int64_t>(int64_t{p - s - 1} * 2 + (v - 1) * p, m * v);
    const int64_t group = v == 1 ? m : p;
    std::vector<std::string> forwards, backwards, expected;
    for (int64_t g = 0; g < m / group; ++g) {
      for (int64_t c = 0; c < v; ++c) {
        for (int64_t j = 0; j < group; ++j) {
          forwards.push_back(fmt::format("F{}", c));
          backwards.push_back(fmt::format("B{}.{}", v - 1 - c, g * group + j));
        }
      }
    }
    for (int64_t k = 0; k < m * v; ++k) {
      if (k < m * v - warmup) {
        expected.push_back(forwards[static_cast<size_t>(k + warmup)]);
        expected.push_back(backwards[static_cast<size_t>(k)]);
      } else {
        expected.push_back(backwards[static_cast<size_t>(k)]);
      }
    }
    expected.insert(expected.begin(), forwards.begin(), forwards.begin() + warmup);
    const int64_t rows = 3 * m;
    for (int step = 0; step < 20; ++step) {
      INFO("step " << step);
      auto [x, y] = batch(step, rows);
      Tensor loss_ref = reference_step(ref, opt_ref, x, y);
      opt.zero_grad();
      trace.clear();
      lasts.clear();
      Tensor loss = pipe.train_batch(s == 0 ? x : Tensor(), s == p - 1 ? y : Tensor());
      opt.step();
      check_close(loss, loss_ref, {1e-5, 1e-7});
      CHECK(pipe.last_stats().peak_in_flight == std::min(warmup + 1, m * v));
      CHECK(trace == expected);
      // A chunk's backwards run in micro-batch order: its last is micro-batch m - 1.
      REQUIRE(lasts.size() == backwards.size());
      for (size_t k = 0; k < lasts.size(); ++k) {
        CHECK(lasts[k] == backwards[k].ends_with(fmt::format(".{}", m - 1)));
      }
    }
    for (int64_t c = 0; c < v; ++c) {
      const Layers& chunk = *chunks[static_cast<size_t>(c)];
      for (int i = chunk.begin; i < chunk.end; ++i) {
        INFO("layer " << i);
        check_close(chunk.layers[static_cast<size_t>(i - chunk.begin)]->weight, ref.layers[static_cast<size_t>(i)]->weight,
                    {1e-5, 1e-6});
        check_close(chunk.layers[static_cast<size_t>(i - chunk.begin)]->bias, ref.layers[static_cast<size_t>(i)]->bias,
                    {1e-5, 1e-6});
      }
    }
    // Forward only: each chunk runs every micro-batch once, in eval mode, and is back in the mode it
    // was in (chunk 0 was put in eval mode before).
    auto [x, y] = batch(99, rows);
    chunks[0]->eval();
    Tensor out = pipe.eval_batch(s == 0 ? x : Tensor());
    for (int64_t c = 0; c < v; ++c) {
      CHECK(chunks[static_cast<size_t>(c)]->eval_forwards == m);
      CHECK(chunks[static_cast<size_t>(c)]->is_training() == (c > 0));
    }
    chunks[0]->train();
    if (s == p - 1) {
      NoGradGuard no_grad;
      check_close(out, ref(x), {1e-5, 1e-6});
    } else {
      CHECK_FALSE(out.defined());
    }
    // Training goes on after eval_batch (no receive ahead left over from it).
    auto [x2, y2] = batch(20, rows);
    Tensor loss_ref = reference_step(ref, opt_ref, x2, y2);
    opt.zero_grad();
    Tensor loss = pipe.train_batch(s == 0 ? x2 : Tensor(), s == p - 1 ? y2 : Tensor());
    opt.step();
    check_close(loss, loss_ref, {1e-5, 1e-7});
  }
}

namespace {

// A model whose activation between its two parts changes width and dtype with the data: part A is a
// Linear(12, 16) whose output keeps 16 or 8 columns, in float32 or float64, as the micro-batch's first
// two inputs say; part B reduces any width to two features and a Linear(2, 5). On p stages the first
// holds A, the last B, and those between pass the activation on: every message (activations and
// gradients) may differ from the one before, which the receives posted ahead (recv_ahead) must
// survive: they guess the last message's dtype and shape.
struct Shifting : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Shifting(bool has_a, bool has_b) {
    if (has_a) a = std::make_shared<nn::Linear>(12, 16), register_module("a", a);
    if (has_b) b = std::make_shared<nn::Linear>(2, 5), register_module("b", b);
  }
  static std::pair<int64_t, DType> form(const Tensor& x) {
    const std::vector<float> v = x.select(0, 0).narrow(0, 0, 2).to_vector<float>();
    return {v[0] > 0 ? 16 : 8, v[1] > 0.3f ? kFloat64 : kFloat32};
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x * 1.0;  // a stage between passes its input on, through the graph
    if (a) {
      auto [width, dtype] = form(x);
      h = tanh((*a)(x)).narrow(1, 0, width).to(dtype);
    }
    if (b) h = (*b)(cat({h.mean({1}, true), h.square().mean({1}, true)}, 1).to(kFloat32));
    return h;
  }
};

}  // namespace

TEST_CASE("pipeline: activations whose shape and dtype change between micro-batches", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), s = comm->rank();
  using enum PipelineSchedule;
  for (auto schedule : {kGPipe, k1F1B, kInterleaved1F1B}) {
    INFO("schedule " << (schedule == kGPipe ? "GPipe" : schedule == k1F1B ? "1F1B" : "interleaved 1F1B, 2 chunks"));
    // Interleaved: 2 chunks per rank, m a multiple of p (9 on 3 ranks).
    const int64_t v = schedule == kInterleaved1F1B ? 2 : 1, m = (8 + p - 1) / p * p, rows = 2 * m;
    manual_seed(9);
    Shifting ref(true, true);
    // A on the first virtual stage, B on the last, the chunks between passing the activation on.
    std::vector<std::unique_ptr<Shifting>> chunks;
    std::vector<nn::Module*> pointers;
    Shifting* with_a = nullptr;
    Shifting* with_b = nullptr;
    std::vector<Tensor> params;  // the chunks between have none
    for (int64_t c = 0; c < v; ++c) {
      chunks.push_back(std::make_unique<Shifting>(c == 0 && s == 0, c == v - 1 && s == p - 1));
      pointers.push_back(chunks.back().get());
      if (chunks.back()->a) with_a = chunks.back().get(), with_a->a->load_state_dict(ref.a->state_dict());
      if (chunks.back()->b) with_b = chunks.back().get(), with_b->b->load_state_dict(ref.b->state_dict());
      for (const Tensor& t : chunks.back()->parameters()) params.push_back(t);
    }
    Pipeline pipe(pointers, comm, loss_fn, {.micro_batches = m, .schedule = schedule, .recv_ahead = true});
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.3});
    std::optional<optim::SGD> opt;
    if (!params.empty()) opt.emplace(params, optim::SGDOptions{.lr = 0.3});
    int changes = 0;  // consecutive micro-batches whose activations differ in shape or dtype
    // A batch whose first two columns, which choose the width and dtype, change from micro-batch to
    // micro-batch.
    auto shifting_batch = [&](int step) {
      auto [x, y] = batch(step, rows);
      std::vector<float> forms;
      for (int64_t r = 0; r < rows; ++r) {
        forms.push_back(static_cast<float>(std::sin(2.1 * static_cast<double>(r) + step)));
        forms.push_back(static_cast<float>(std::cos(1.7 * static_cast<double>(r) + 0.5 * step)));
      }
      x.narrow(1, 0, 2).copy_(from_vector<float>(forms, {rows, 2}));
      return std::pair{x, y};
    };
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      auto [x, y] = shifting_batch(step);
      // The reference: the same micro-batches, each loss / m, in one process.
      opt_ref.zero_grad();
      Tensor loss_ref = zeros({});
      const auto xs = x.split(rows / m, 0), ys = y.split(rows / m, 0);
      for (int64_t i = 0; i < m; ++i) {
        loss_ref = loss_ref + loss_fn(ref(xs[i]), ys[i]) / static_cast<double>(m);
        if (i > 0 && Shifting::form(xs[i]) != Shifting::form(xs[i - 1])) ++changes;
      }
      loss_ref.backward();
      opt_ref.step();
      if (opt) opt->zero_grad();
      Tensor loss = pipe.train_batch(s == 0 ? x : Tensor(), s == p - 1 ? y : Tensor());
      if (opt) opt->step();
      check_close(loss, loss_ref.detach(), {1e-5, 1e-7});
    }
    // Of the 6 (m - 1) changes of micro-batch (42 or 48), most: the data does make the activations change.
    CHECK(changes >= 6 * (m - 1) * 2 / 3);
    if (with_a) check_close(with_a->a->weight, ref.a->weight, {1e-5, 1e-6});
    if (with_b) check_close(with_b->b->weight, ref.b->weight, {1e-5, 1e-6});
    // Forward only, the activations changing the same way.
    auto [x, y] = shifting_batch(7);
    Tensor out = pipe.eval_batch(s == 0 ? x : Tensor());
    if (s == p - 1) {
      NoGradGuard no_grad;
      std::vector<Tensor> outs;
      for (const Tensor& xi : x.split(rows / m, 0)) outs.push_back(ref(xi));
      check_close(out, cat(outs, 0), {1e-5, 1e-6});
    }
  }
}

namespace {

// Layers with dropout (0.3) after each hidden layer's tanh that draws as the whole model does: a
// chunk draws its own layers' masks and reserves the counters of the others', so each forward
// moves the generator as the whole model's does (DrawsAsWholeModel). reserve_others = false makes
// a chunk that breaks that promise.
struct Dropping : Layers, DrawsAsWholeModel {
  bool reserve_others = true;
  using Layers::Layers;
  Tensor forward(const Tensor& x) override {
    const int64_t rows = x.size(0);
    auto reserve = [&](int from, int to) {
      for (int i = from; i < to; ++i) {
        if (reserve_others && i != total - 1 && is_training()) default_generator().reserve(rows * 16);
      }
    };
    reserve(0, begin);
    Tensor h = x;
    for (int i = begin; i < end; ++i) {
      h = (*layers[static_cast<size_t>(i - begin)])(h);
      if (i != total - 1) h = nn::dropout(tanh(h), 0.3, is_training());
    }
    reserve(end, total);
    return h;
  }
};

}  // namespace

TEST_CASE("pipeline: chunks that draw as the whole model get one process's dropout masks under every schedule",
          "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), s = comm->rank();
  constexpr int kTotal = 12;
  struct Case {
    PipelineSchedule schedule;
    int64_t v, m;
  };
  using enum PipelineSchedule;
  for (auto [schedule, v, m] : {Case{kGPipe, 1, 3}, Case{k1F1B, 1, 4}, Case{kInterleaved1F1B, 2, p},
                                Case{kInterleaved1F1B, 2, 2 * p}, Case{kInterleaved1F1B, 3, 2 * p}}) {
    INFO("v " << v << ", m " << m << (schedule == kGPipe ? ", GPipe" : ""));
    manual_seed(8);
    Dropping ref(0, kTotal, kTotal);
    Chunks<Dropping> made = make_chunks<Dropping>(ref, v, p, s);  // chunk c: virtual stage c p + s
    auto& [chunks, pointers, params] = made;
    Pipeline pipe(pointers, comm, loss_fn, {.micro_batches = m, .schedule = schedule});
    optim::SGD opt_ref(ref.parameters(), {.lr = 0.2, .momentum = 0.9});
    optim::SGD opt(params, {.lr = 0.2, .momentum = 0.9});
    manual_seed(9);  // every rank's generator in one state (the chunks' initializations drew unequally)
    const int64_t rows = 3 * m, micro = 3;
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      auto [x, y] = batch(step, rows);
      // One process: the micro-batches in turn (gradient accumulation), each drawing its masks
      // after the one before; the pipeline starts from the same state.
      const Generator::State start = default_generator().get_state();
      opt_ref.zero_grad();
      double loss_ref = 0;
      for (int64_t i = 0; i < m; ++i) {
        Tensor l = loss_fn(ref(x.narrow(0, i * micro, micro)), y.narrow(0, i * micro, micro)) / static_cast<double>(m);
        l.backward();
        loss_ref += l.item<double>();
      }
      opt_ref.step();
      const uint64_t end = default_generator().offset();
      CHECK(end > start.offset);
      default_generator().set_state(start);
      opt.zero_grad();
      Tensor loss = pipe.train_batch(s == 0 ? x : Tensor(), s == p - 1 ? y : Tensor());
      opt.step();
      CHECK(loss.item<double>() == Approx(loss_ref).epsilon(1e-5));
      CHECK(default_generator().offset() == end);  // where one process's m forwards leave it
    }
    for (const auto& chunk : chunks) {
      for (int i = chunk->begin; i < chunk->end; ++i) {
        INFO("layer " << i);
        check_close(chunk->layers[static_cast<size_t>(i - chunk->begin)]->weight,
                    ref.layers[static_cast<size_t>(i)]->weight, {1e-5, 1e-6});
      }
    }
  }
  // Broken promises, on a pipeline of this rank alone (an Error on one rank would leave the others
  // waiting): chunks of two kinds, and a chunk that draws only its own layers' masks (chunk 0's six
  // against chunk 1's five).
  auto alone = comm->split(s, 0);
  Dropping a(0, 6, kTotal), b(6, kTotal, kTotal);
  Layers plain(6, kTotal, kTotal);
  check_error([&] { Pipeline bad({&a, &plain}, alone, loss_fn, {.schedule = kInterleaved1F1B}); },
              {"chunk 0 is a DrawsAsWholeModel and chunk 1 is not", "make them all one kind"});
  a.reserve_others = b.reserve_others = false;
  Pipeline pipe({&a, &b}, alone, loss_fn, {.micro_batches = 2, .schedule = kInterleaved1F1B});
  auto [x, y] = batch(0, 6);
  const Generator::State before = default_generator().get_state();
  check_error([&] { pipe.train_batch(x, y); },
              {"stage 0's chunk 1 moved the default generator by 120 counters in its forward of micro-batch 0, and the "
               "batch's first forward by 144", "must draw or reserve a whole model forward's random numbers"});
  // The batch threw after two forwards had drawn: the generator is back where the batch found it.
  CHECK(default_generator().seed() == before.seed);
  CHECK(default_generator().offset() == before.offset);
}

TEST_CASE("pipeline: bad use is an Error", "[distributed]") {
  auto comm = init("mpi");
  const int p = comm->size(), s = comm->rank();
  Layers stage(stage_range(s, p).first, stage_range(s, p).second);
  check_error([&] { Pipeline bad(stage, nullptr, loss_fn); }, {"communicator is null"});
  check_error([&] { Pipeline bad(stage, comm, loss_fn, {.micro_batches = 0}); }, {"micro_batches must be >= 1"});
  check_error([&] { Pipeline bad(stage, comm, nullptr); }, {"loss function is empty"});
  Layers other(stage.begin, stage.end);
  check_error([&] { Pipeline bad(std::vector<nn::Module*>{}, comm, loss_fn); }, {"no model chunks"});
  check_error([&] { Pipeline bad({&stage, nullptr}, comm, loss_fn); }, {"model chunk 1 of 2 is null"});
  check_error([&] { Pipeline bad({&stage, &other}, comm, loss_fn, {.schedule = PipelineSchedule::k1F1B}); },
              {"2 model chunks on a rank need the schedule kInterleaved1F1B"});
  if (p > 1) {
    check_error(
        [&] {
          Pipeline bad({&stage, &other}, comm, loss_fn,
                       {.micro_batches = p + 1, .schedule = PipelineSchedule::kInterleaved1F1B});
        },
        {fmt::format("micro-batches {} at a time", p), fmt::format("{} is not a multiple of {}", p + 1, p)});
    // Options that differ between stages: an Error on every stage (the stages waited for each
    // other's messages until the timeout), and the communicator still in step.
    check_error([&] { Pipeline bad(stage, comm, loss_fn, {.micro_batches = s == 0 ? 2 : 4}); },
                {"stages were given different options", fmt::format("micro_batches {}", s == 0 ? 2 : 4)});
    check_error([&] { Pipeline bad(stage, comm, loss_fn, {.recv_ahead = s == 0}); }, {"different options"});
    check_error([&] { Pipeline bad(s == 0 ? std::vector<nn::Module*>{&stage, &other} : std::vector<nn::Module*>{&stage},
                                   comm, loss_fn, {.schedule = PipelineSchedule::kInterleaved1F1B}); },
                {"different options", s == 0 ? "2 model chunk(s)" : "1 model chunk(s)"});
    Tensor v = full({1}, 1.0);
    comm->all_reduce(v);
    CHECK(v.item<double>() == p);
  }
  if (p == 1) {  // a stage alone: no other rank waits for its messages
    Pipeline pipe(stage, comm, loss_fn, {.micro_batches = 4});
    auto [x, y] = batch(0, 10);
    check_error([&] { pipe.train_batch(x, y); }, {"input's 10 rows do not split into 4 equal micro-batches"});
    check_error([&] { pipe.train_batch(Tensor(), y); }, {"Pipeline.train_batch: stage 0 needs the input"});
    check_error([&] { pipe.eval_batch(Tensor()); }, {"Pipeline.eval_batch: stage 0 needs the input"});
  }
}

TEST_CASE("pipeline: tied weights in both directions between two stages, exactly", "[distributed]") {
  auto comm = init("mpi");
  if (comm->size() < 2) {
    SUCCEED("one rank: no second stage to tie a weight to");
    return;
  }
  // Stages 0 and 1 of this communicator (the others hold no ties): stage 0 owns a (2 x 3) and
  // holds a copy of stage 1's b (4); stage 1 the other way round.
  const int s = comm->rank();
  Tensor a = full({2, 3}, s == 0 ? 1.5 : -7.0).requires_grad_();
  Tensor b = full({4}, s == 1 ? 2.5 : -9.0).requires_grad_();
  std::vector<TiedWeight> tied;
  if (s < 2) tied = {{.weight = a, .owner = 0, .user = 1}, {.weight = b, .owner = 1, .user = 0}};
  check_tied_weights(tied, *comm);
  copy_tied_weights(tied, *comm);  // every send first, so neither stage waits for the other's receive
  if (s < 2) {
    kiln::test::check_equal(a, full({2, 3}, 1.5));
    kiln::test::check_equal(b, full({4}, 2.5));
  }
  // Each stage's gradients: the owner's 10 (a) or 20 (b), the copy's 1 (a) or 2 (b).
  a.set_grad(full({2, 3}, s == 0 ? 10.0 : 1.0));
  b.set_grad(full({4}, s == 1 ? 20.0 : 2.0));
  add_tied_gradients(tied, *comm);
  if (s == 0) {
    kiln::test::check_equal(a.grad(), full({2, 3}, 11.0));
    CHECK_FALSE(b.grad().defined());  // sent to its owner and dropped
  } else if (s == 1) {
    kiln::test::check_equal(b.grad(), full({4}, 22.0));
    CHECK_FALSE(a.grad().defined());
  }
  comm->barrier();
}

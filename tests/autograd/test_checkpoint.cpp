// tests/autograd/test_checkpoint.cpp: activation checkpointing gives the gradients of the plain
// computation (dropout included, through the replayed generator) and keeps fewer bytes alive
// between forward and backward.
#include <chrono>
#include <thread>

#include "support.h"

using namespace kiln;
using kiln::test::check_error;

namespace {

struct Block {  // y = dropout(gelu(x W1^T + b1)) W2^T + x: parameters closed over, as in a model
  Tensor w1, b1, w2;
  explicit Block(int64_t d) {
    w1 = (randn({4 * d, d}) * 0.1).requires_grad_();
    b1 = zeros({4 * d}).requires_grad_();
    w2 = (randn({d, 4 * d}) * 0.1).requires_grad_();
  }
  Tensor operator()(const Tensor& x) const {
    Tensor h = dropout(gelu(nn::functional::linear(x, w1, b1)), 0.3);
    return nn::functional::linear(h, w2) + x;
  }
  std::vector<Tensor> params() const { return {w1, b1, w2}; }
};

// Runs 3 blocks on x (checkpointed or not) and returns the loss; gradients land in .grad().
Tensor run(const std::vector<Block>& blocks, const Tensor& x, bool use_checkpoint) {
  Tensor h = x;
  for (const auto& b : blocks) {
    if (use_checkpoint) {
      h = autograd::checkpoint([&b](const autograd::TensorList& in) { return autograd::TensorList{b(in[0])}; }, {h})[0];
    } else {
      h = b(h);
    }
  }
  return (h * h).mean();
}

}  // namespace

TEST_CASE("checkpoint: the same loss and gradients as without it, dropout included", "[autograd]") {
  manual_seed(3);
  std::vector<Block> blocks = {Block(16), Block(16), Block(16)};
  Tensor x = randn({8, 16}).requires_grad_();
  std::vector<Tensor> plain_grads, ckpt_grads;
  Tensor losses[2];
  for (int use = 0; use < 2; ++use) {
    for (auto& b : blocks) {
      for (auto& p : b.params()) p.set_grad(Tensor());
    }
    x.set_grad(Tensor());
    manual_seed(42);  // the same dropout masks in both runs
    losses[use] = run(blocks, x, use == 1);
    losses[use].backward();
    auto& out = use ? ckpt_grads : plain_grads;
    for (auto& b : blocks) {
      for (auto& p : b.params()) out.push_back(p.grad().clone());
    }
    out.push_back(x.grad().clone());
  }
  kiln::test::check_equal(losses[1].detach(), losses[0].detach());
  REQUIRE(ckpt_grads.size() == plain_grads.size());
  for (size_t i = 0; i < plain_grads.size(); ++i) {
    INFO("gradient " << i);
    kiln::test::check_equal(ckpt_grads[i], plain_grads[i]);  // the same ops in the same order
  }
  // Without the replayed generator the recomputed masks differ, and so do the gradients.
  manual_seed(42);
  Tensor h = autograd::checkpoint(
      [&](const autograd::TensorList& in) { return autograd::TensorList{blocks[0](in[0])}; }, {x}, false)[0];
  x.set_grad(Tensor());
  (h * h).mean().backward();
  manual_seed(42);
  Tensor x2 = x.detach().requires_grad_();
  Tensor h2 = blocks[0](x2);
  (h2 * h2).mean().backward();
  CHECK((x.grad() - x2.grad()).abs().max().item<float>() > 1e-4f);
}

TEST_CASE("checkpoint: parameters get gradients even when the input needs none", "[autograd]") {
  manual_seed(1);
  Block b(8);
  Tensor x = randn({4, 8});  // data: no requires_grad
  Tensor y = autograd::checkpoint([&](const autograd::TensorList& in) { return autograd::TensorList{b(in[0])}; },
                                  {x})[0];
  CHECK(y.requires_grad());
  y.sum().backward();
  CHECK(b.w1.grad().defined());
  CHECK(b.w2.grad().abs().sum().item<float>() > 0);
}

TEST_CASE("checkpoint: activations inside the block are not kept between forward and backward", "[autograd]") {
  manual_seed(2);
  std::vector<Block> blocks = {Block(64), Block(64), Block(64), Block(64)};
  Tensor x = randn({256, 64}).requires_grad_();
  int64_t kept[2];
  for (int use = 0; use < 2; ++use) {
    const int64_t before = memory::stats(Device::cpu()).allocated_bytes;
    Tensor loss = run(blocks, x, use == 1);
    kept[use] = memory::stats(Device::cpu()).allocated_bytes - before;
    loss.backward();
  }
  // Plain: each block keeps x W1^T + b1, gelu's output, the dropout mask and output (256 x 256
  // floats each, 256 KiB) and more; checkpointed: only each block's output (256 x 64 floats).
  INFO("plain " << kept[0] << " bytes, checkpointed " << kept[1] << " bytes");
  CHECK(kept[0] > 4 * 3 * 256 * 256 * 4);
  CHECK(kept[1] < kept[0] / 5);
}

TEST_CASE("checkpoint: misuse is an Error", "[autograd]") {
  Tensor x = randn({3}).requires_grad_();
  check_error([&] { autograd::checkpoint([](const autograd::TensorList&) { return autograd::TensorList{}; }, {x}); },
              {"checkpoint", "returned no tensors"});
  check_error(
      [&] {
        autograd::checkpoint([](const autograd::TensorList& in) { return autograd::TensorList{in[0].argmax()}; }, {x});
      },
      {"checkpoint", "output 0", "int64"});
  Tensor y = autograd::checkpoint([](const autograd::TensorList& in) { return autograd::TensorList{in[0] * in[0]}; },
                                  {x})[0];
  check_error([&] { autograd::grad({y.sum()}, {x}, {}, {}, /*create_graph=*/true); }, {"create_graph", "not supported"});
}

TEST_CASE("checkpoint: a recompute whose outputs differ in shape or dtype from the forward's is an Error naming it",
          "[autograd]") {
  // It reached the engine as "backward: the gradient for output 0 has shape ...", which named
  // neither the checkpoint nor the cause; a different dtype went through unnoticed.
  Tensor x = randn({4}).requires_grad_();
  for (int change : {0, 1}) {
    int calls = 0;
    auto fn = [&calls, change](const autograd::TensorList& in) {
      Tensor y = in[0] * 2;
      if (calls++ == 0) return autograd::TensorList{y};
      return autograd::TensorList{change == 0 ? y.narrow(0, 0, 3) : y.to(kFloat64)};
    };
    Tensor out = autograd::checkpoint(fn, {x})[0];
    check_error([&] { out.sum().backward(); },
                {"checkpoint: output 0 of the function was float32 [4] in forward but",
                 change == 0 ? "float32 [3] when run again" : "float64 [4] when run again"});
  }
}

TEST_CASE("checkpoint: an input changed in place before backward is an Error, not a wrong gradient", "[autograd]") {
  Tensor x = from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor y = x * 1;
  Tensor out = autograd::checkpoint([](const autograd::TensorList& in) { return autograd::TensorList{in[0] * in[0]}; },
                                    {y})[0];
  {
    NoGradGuard no_grad;
    y.mul_(10);  // the recompute would square 10, 20, 30: x.grad() came out [20, 40, 60], not [2, 4, 6]
  }
  check_error([&] { out.sum().backward(); }, {"CheckpointBackward", "input 0", "modified by an in-place operation"});
}

TEST_CASE("checkpoint: an output that is an input leaves the input as it was", "[autograd]") {
  // fn returning its input (or contiguous() or a same-dtype to() of it) attached the node to the
  // caller's tensor: a parameter stopped being a leaf, a data tensor started requiring grad.
  Tensor w = from_vector<float>({1, 2}).requires_grad_();
  Tensor data = ones({2});
  const autograd::CheckpointFn same = [](const autograd::TensorList& in) {
    return autograd::TensorList{in[0], in[1].contiguous()};
  };
  autograd::TensorList outs = autograd::checkpoint(same, {w, data});
  CHECK(w.is_leaf());
  CHECK(w.grad_fn() == nullptr);
  CHECK_FALSE(data.requires_grad());
  CHECK(outs[0].grad_fn() != nullptr);
  (outs[0] * 3).sum().backward();
  kiln::test::check_equal(w.grad(), full({2}, 3.0));
  // And again: the node is not left on w for a second backward to find freed.
  autograd::checkpoint(same, {w, data})[0].sum().backward();
  kiln::test::check_equal(w.grad(), full({2}, 4.0));
}

TEST_CASE("checkpoint: a recompute that throws leaves the generator where it was", "[autograd]") {
  manual_seed(1);
  Tensor x = ones({2}).requires_grad_();
  int calls = 0;
  const autograd::CheckpointFn fn = [&calls](const autograd::TensorList& in) {
    KILN_CHECK(++calls == 1, "the recompute fails");
    return autograd::TensorList{in[0] * rand({2})};
  };
  Tensor out = autograd::checkpoint(fn, {x})[0];
  rand({3});
  const Generator::State before = default_generator().get_state();
  check_error([&] { out.sum().backward(); }, {"the recompute fails"});
  CHECK(default_generator().get_state().offset == before.offset);
  CHECK(default_generator().get_state().seed == before.seed);
}

TEST_CASE("checkpoint: a callback queued inside the recompute runs once, when the outer backward has finished",
          "[autograd]") {
  // loss = sum(checkpoint(x -> x w1)(a w0)): w1's gradient comes inside the recompute's backward,
  // w0's after it, in the outer one. DDP and ZeRO queue their end of backward from the first
  // gradient they see, which here is w1's.
  Tensor w0 = randn({4, 4}).requires_grad_(), w1 = randn({4, 4}).requires_grad_();
  Tensor a = randn({3, 4});
  int calls = 0;
  bool w0_done = false;
  w1.register_hook([&](const Tensor&) {
    autograd::queue_callback([&] {
      ++calls;
      w0_done = w0.grad().defined();
    });
    return Tensor();
  });
  auto fn = [&w1](const autograd::TensorList& in) { return autograd::TensorList{matmul(in[0], w1)}; };
  autograd::checkpoint(fn, {matmul(a, w0)})[0].sum().backward();
  CHECK(calls == 1);
  CHECK(w0_done);
  // A backward that a hook starts inside the recompute has callbacks of its own, run when it ends.
  Tensor side = randn({2}).requires_grad_();
  int inner_calls = 0;
  bool inner_ran_before_outer_ended = false;
  Tensor w2 = randn({4, 4}).requires_grad_();
  w2.register_hook([&](const Tensor&) {
    AutoGradMode on(true);  // backward records nothing itself
    Tensor s = (side * 2).sum();
    side.register_hook([&](const Tensor&) {
      autograd::queue_callback([&] { ++inner_calls; });
      return Tensor();
    });
    s.backward();
    inner_ran_before_outer_ended = inner_calls == 1;
    return Tensor();
  });
  auto fn2 = [&w2](const autograd::TensorList& in) { return autograd::TensorList{matmul(in[0], w2)}; };
  autograd::checkpoint(fn2, {matmul(a, w0)})[0].sum().backward();
  CHECK(inner_ran_before_outer_ended);
  CHECK(inner_calls == 1);
}

TEST_CASE("checkpoint: the recompute saves plainly, whatever saved-tensor hooks are on in backward", "[autograd]") {
  // A SaveOnCpu around a whole step would otherwise copy what the recompute saves out and back.
  int packs = 0;
  autograd::SavedTensorHooksGuard counting({[&packs](const Tensor& t) {
                                    ++packs;
                                    return t;
                                  },
                                  [](const Tensor& t) { return t; }});
  Tensor w0 = randn({4, 4}).requires_grad_(), w1 = randn({4, 4}).requires_grad_();
  auto fn = [&w1](const autograd::TensorList& in) { return autograd::TensorList{gelu(matmul(in[0], w1))}; };
  Tensor loss = autograd::checkpoint(fn, {matmul(randn({3, 4}), w0)})[0].sum();
  const int forward_packs = packs;
  CHECK(forward_packs > 0);  // the matmul outside the checkpoint saved its operands through the hooks
  loss.backward();
  CHECK(packs == forward_packs);  // the recompute's gelu and matmul saved theirs without
  CHECK(w1.grad().defined());
}

TEST_CASE("checkpoint: keep_input keeps what it makes of each input, and backward gets the input back from it",
          "[autograd]") {
  manual_seed(4);
  std::vector<Block> blocks = {Block(16), Block(16), Block(16)};
  Tensor x0 = randn({8, 16});
  // A keeper that keeps every other element and the rest in a map, as a partition among two ranks
  // would: what is kept is a new tensor, half the input's size; backward joins the halves again.
  int kept_count = 0, restored_count = 0;
  std::vector<Tensor> others;  // the halves "the other rank" keeps
  autograd::CheckpointOptions options;
  options.keep_input = [&](const Tensor& t) -> std::function<Tensor()> {
    ++kept_count;
    Tensor flat = t.reshape({2, t.numel() / 2});
    Tensor mine = flat.narrow(0, 0, 1).clone();
    others.push_back(flat.narrow(0, 1, 1).clone());
    Tensor other = others.back();
    return [&restored_count, mine, other, shape = t.shape()] {
      ++restored_count;
      return cat({mine, other}, 0).reshape(shape);
    };
  };
  Tensor grads[2][4];
  for (int use = 0; use < 2; ++use) {
    Tensor x = x0.clone().requires_grad_();
    for (auto& b : blocks) {
      for (auto& p : b.params()) p.set_grad(Tensor());
    }
    manual_seed(42);
    Tensor h = x * 1;  // not a leaf: the keeper sees every block's input
    for (const auto& b : blocks) {
      auto fn = [&b](const autograd::TensorList& in) { return autograd::TensorList{b(in[0])}; };
      h = use == 0 ? b(h) : autograd::checkpoint(fn, fn, {h}, options)[0];
    }
    (h * h).mean().backward();
    for (size_t i = 0; i < 3; ++i) grads[use][i] = blocks[i].w1.grad().clone();
    grads[use][3] = x.grad().clone();
  }
  CHECK(kept_count == 3);
  CHECK(restored_count == 3);
  for (int i = 0; i < 4; ++i) {
    INFO("gradient " << i);
    kiln::test::check_equal(grads[1][i], grads[0][i]);
  }

  // A parameter given as an input is kept as it is: the keeper never sees it.
  kept_count = 0;
  Tensor w = randn({4}).requires_grad_();
  auto square = [](const autograd::TensorList& in) { return autograd::TensorList{in[0] * in[0]}; };
  autograd::checkpoint(square, square, {w}, options)[0].sum().backward();
  CHECK(kept_count == 0);
  kiln::test::check_close(w.grad(), w.detach() * 2);

  // keep_on_cpu keeps a CPU input as it is (on a GPU it keeps a host copy: test_cuda_transformer.cpp).
  Tensor host = randn({5});
  CHECK(autograd::keep_on_cpu()(host)().is_same(host));
  autograd::CheckpointOptions on_cpu;
  on_cpu.keep_input = autograd::keep_on_cpu();
  Tensor y = from_vector<float>({1, 2, 3}).requires_grad_();
  autograd::checkpoint(square, square, {y * 1}, on_cpu)[0].sum().backward();
  kiln::test::check_close(y.grad(), from_vector<float>({2, 4, 6}));
}

TEST_CASE("checkpoint: a keep_input that gives back another tensor, or an input changed in place, is an Error",
          "[autograd]") {
  auto square = [](const autograd::TensorList& in) { return autograd::TensorList{in[0] * in[0]}; };
  Tensor x = from_vector<float>({1, 2, 3}).requires_grad_();
  autograd::CheckpointOptions wrong;
  wrong.keep_input = [](const Tensor& t) -> std::function<Tensor()> {
    Tensor half = t.narrow(0, 0, 1).clone();
    return [half] { return half; };
  };
  Tensor out = autograd::checkpoint(square, square, {x * 1}, wrong)[0];
  check_error([&] { out.sum().backward(); },
              {"CheckpointBackward: input 0 came back from its keep_input function as a [1] float32 tensor on cpu",
               "it was a [3] float32 tensor on cpu"});
  autograd::CheckpointOptions none;
  none.keep_input = [](const Tensor&) { return std::function<Tensor()>(); };
  check_error([&] { autograd::checkpoint(square, square, {x * 1}, none); },
              {"keep_input function returned no way back for an input of [3]"});
  // The keeper copies the input, but an input changed in place while it lives is still refused,
  // as without a keeper (the gradients would not be those of the values the graph saw).
  autograd::CheckpointOptions copying;
  copying.keep_input = [](const Tensor& t) -> std::function<Tensor()> {
    Tensor c = t.clone();
    return [c] { return c; };
  };
  Tensor y = x * 1;
  Tensor z = autograd::checkpoint(square, square, {y}, copying)[0];
  {
    NoGradGuard no_grad;
    y.mul_(10);
  }
  check_error([&] { z.sum().backward(); },
              {"CheckpointBackward", "input 0", "modified by an in-place operation",
               "a checkpointed input must stay as it was until backward, kept in another form (keep_input) or not"});
}

namespace {

// x * 1, whose backward sleeps `ms` milliseconds: a backward of known least duration.
struct SlowBackward : autograd::Function<SlowBackward> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x, int ms) {
    ctx->saved_data["ms"] = ms;
    return x * 1;
  }
  static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::any_cast<int>(ctx->saved_data.at("ms"))));
    return {g[0], Tensor()};
  }
};

}  // namespace

TEST_CASE("checkpoint: profile counts forwards and backwards, and each phase's time holds that phase's work",
          "[autograd]") {
  // The forward sleeps 10 ms, the recompute 20 and the backward 40: each time is at least its own
  // sleep (sleep_for never returns early), so a timer that missed its phase would fail. No upper
  // bound is checked: timing never decides a test beyond what the clock guarantees.
  int runs = 0;
  auto fn = [&runs](const autograd::TensorList& in) {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * runs));
    return autograd::TensorList{SlowBackward::apply(in[0] * in[0], 40)};
  };
  auto profile = std::make_shared<autograd::CheckpointProfile>();
  autograd::CheckpointOptions options;
  options.profile = profile;
  options.synchronize = true;  // nothing to wait for on the CPU: the same values
  Tensor x = from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor y = autograd::checkpoint(fn, fn, {x * 1}, options)[0];
  CHECK(profile->forwards == 1);
  CHECK(profile->backwards == 0);
  CHECK(profile->forward_s >= 0.010);
  CHECK(profile->recompute_s == 0);
  y.sum().backward();
  CHECK(runs == 2);
  CHECK(profile->forwards == 1);
  CHECK(profile->backwards == 1);
  CHECK(profile->recompute_s >= 0.020);
  CHECK(profile->backward_s >= 0.040);
  kiln::test::check_close(x.grad(), from_vector<float>({2, 4, 6}));

  // A forward without grad mode is counted; it has no backward.
  runs = 0;
  {
    NoGradGuard no_grad;
    autograd::checkpoint(fn, fn, {x}, options);
  }
  CHECK(profile->forwards == 2);
  CHECK(profile->backwards == 1);
}

TEST_CASE("checkpoint: an output the function did not make (a captured tensor) stays the caller's") {
  // fn returned a captured leaf: the node was attached to it (it stopped being a leaf), and in backward
  // the recompute returned it again, reaching the node from itself until the stack ran out (SIGSEGV).
  // PyTorch's non-reentrant checkpoint gives w.grad = ones.
  Tensor x = ones({3}).requires_grad_();
  Tensor w = tensor({1.0, 2.0, 3.0}).requires_grad_();
  autograd::TensorList out = autograd::checkpoint([w](const autograd::TensorList&) { return autograd::TensorList{w}; }, {x});
  CHECK(w.is_leaf());
  (out[0] * 2).sum().backward();
  test::check_equal(w.grad(), full({3}, 2.0));
  // A captured tensor with a history of its own: the gradient flows through it to its leaf.
  Tensor v = tensor({1.0, -1.0}).requires_grad_();
  Tensor captured = v * 3;
  autograd::TensorList out2 =
      autograd::checkpoint([captured](const autograd::TensorList& in) { return autograd::TensorList{captured + in[0].sum()}; }, {x});
  out2[0].sum().backward();
  test::check_equal(v.grad(), full({2}, 3.0));
}

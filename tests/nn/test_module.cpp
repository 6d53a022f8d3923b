// tests/nn/test_module.cpp: nn::Module's registry, traversal, state dicts, placement, hooks, copy/move
// rules and printing.
#include <optional>
#include <sstream>
#include <type_traits>

#include "nn_golden.h"

using namespace kiln;

namespace {

struct Inner : nn::Module {
  nn::Linear fc{3, 4};
  Tensor scale;  // (4)
  Inner() {
    register_module("fc", fc);
    scale = register_parameter("scale", ones({4}));
    register_buffer("steps", zeros({}, kInt64));
    register_buffer("scratch", zeros({2}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return fc(x) * scale; }
};

struct Outer : nn::Module {
  Inner a;
  nn::Sequential seq{nn::Linear(4, 4), nn::Tanh(), nn::Linear(4, 2)};
  nn::ModuleDict heads;
  Outer() {
    heads.insert("x", nn::Linear(2, 1));
    heads.insert("emb", nn::Embedding(5, 2));
    register_modules({{"a", a}, {"seq", seq}, {"heads", heads}});
  }
  Tensor forward(const Tensor& x) override { return heads["x"](seq(a(x))); }
};

}  // namespace

TEST_CASE("Modules register parameters, buffers and children in PyTorch's order", "[nn][module]") {
  Outer m;
  std::vector<std::string> names;
  for (auto& [name, p] : m.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"a.scale", "a.fc.weight", "a.fc.bias", "seq.0.weight", "seq.0.bias",
                                          "seq.2.weight", "seq.2.bias", "heads.x.weight", "heads.x.bias",
                                          "heads.emb.weight"});
  CHECK(m.parameters().size() == 10);
  CHECK(m.parameters(false).empty());
  CHECK(m.a.parameters(false).size() == 1);
  names.clear();
  for (auto& [name, b] : m.named_buffers()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"a.steps", "a.scratch"});
  CHECK(m.state_dict().keys() ==
        std::vector<std::string>{"a.scale", "a.steps", "a.fc.weight", "a.fc.bias", "seq.0.weight", "seq.0.bias",
                                 "seq.2.weight", "seq.2.bias", "heads.x.weight", "heads.x.bias", "heads.emb.weight"});
  names.clear();
  for (auto& [name, mod] : m.named_modules()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"", "a", "a.fc", "seq", "seq.0", "seq.1", "seq.2", "heads", "heads.x",
                                          "heads.emb"});
  CHECK(m.children().size() == 3);
  CHECK(m.named_children()[1].first == "seq");
  CHECK(m.heads.keys() == std::vector<std::string>{"x", "emb"});
  CHECK(m.heads.contains("emb"));
  // The parameter handles are the members themselves.
  CHECK(m.named_parameters()[1].second.is_same(m.a.fc.weight));
  CHECK(m.a.fc.weight.requires_grad());
  CHECK(m.num_parameters() == 4 + 12 + 4 + 16 + 4 + 8 + 2 + 2 + 1 + 10);
  test::check_error([&] { m.a.register_parameter("scale", zeros({1})); }, {"already has an attribute 'scale'"});
  test::check_error([&] { m.a.register_buffer("a.b", zeros({1})); }, {"'a.b'", "no '.'"});
  test::check_error([&] { m.a.register_parameter("n", zeros({1}, kInt64)); }, {"parameter 'n' must be floating"});
}

TEST_CASE("Tied weights are listed once by parameters() and twice in the state dict", "[nn][module]") {
  struct Tied : nn::Module {
    nn::Embedding emb{5, 3};
    nn::Linear out{3, 5, {.bias = false}};
    Tied() {
      register_modules({{"emb", emb}, {"out", out}});
      out.weight = out.set_parameter("weight", emb.weight);
    }
    Tensor forward(const Tensor& idx) override { return out(emb(idx)); }
  } tied;
  CHECK(tied.parameters().size() == 1);
  CHECK(tied.out.weight.is_same(tied.emb.weight));
  CHECK(tied.state_dict().keys() == std::vector<std::string>{"emb.weight", "out.weight"});
  // Both uses accumulate into the one gradient.
  Tensor idx = from_vector<int64_t>({0, 3}, {2});
  Tensor cot = test::sample({2, 5});
  tied(idx).backward(cot);
  Tensor w = tied.emb.weight.detach();
  Tensor expected = matmul(cot.t(), index_select(w, 0, idx))                    // through out
                    + index_add(zeros({5, 3}), 0, idx, matmul(cot, w));         // through emb
  test::check_close(tied.emb.weight.grad(), expected);
  test::check_error([&] { tied.out.set_parameter("bias", zeros({5})); }, {"has no parameter 'bias'"});
  test::check_error([&] { tied.out.set_parameter("weight", zeros({2, 2})); }, {"'weight'", "[5, 3]", "[2, 2]"});
}

TEST_CASE("state_dict round-trips and load_state_dict reports what is wrong", "[nn][module][state]") {
  Outer a, b;
  manual_seed(7);
  for (Tensor& p : a.parameters()) {
    NoGradGuard g;
    p.copy_(randn(p.sizes()));
  }
  b.load_state_dict(a.state_dict());
  for (auto& [key, t] : a.state_dict()) {
    INFO(key);
    test::check_equal(b.state_dict().at(key), t);
  }
  // Loading copies into the existing tensors: the handles stay.
  Tensor w = b.a.fc.weight;
  b.load_state_dict(a.state_dict());
  CHECK(b.a.fc.weight.is_same(w));
  CHECK(b.state_dict().at("a.fc.weight").data_ptr() == w.data_ptr());  // state_dict shares the data

  TensorDict missing = a.state_dict();
  TensorDict partial;
  for (auto& [k, t] : missing)
    if (k != "seq.0.bias" && k != "a.steps") partial.insert(k, t);
  partial.insert("seq.9.weight", zeros({1}));
  test::check_error([&] { b.load_state_dict(partial); },
                    {"missing key(s): \"a.steps\", \"seq.0.bias\"", "unexpected key(s): \"seq.9.weight\"",
                     "strict=false"});
  b.load_state_dict(partial, /*strict=*/false);  // loads the rest
  TensorDict bad = a.state_dict();
  bad.set("seq.2.weight", zeros({3, 4}));
  test::check_error([&] { b.load_state_dict(bad, false); },
                    {"size mismatch for 'seq.2.weight'", "[3, 4]", "[2, 4]"});
  bad.set("seq.2.weight", Tensor());
  test::check_error([&] { b.load_state_dict(bad, false); },
                    {"the state dict's entry 'seq.2.weight' is an undefined tensor"});
  // A model made in inference mode: named before anything is copied (it was copy_'s "this is an
  // inference tensor"); inside an inference-mode scope it loads.
  std::optional<nn::Linear> frozen;
  {
    InferenceMode inference;
    frozen.emplace(4, 2);
  }
  nn::Linear source(4, 2);
  test::check_error([&] { frozen->load_state_dict(source.state_dict()); },
                    {"the model's 'weight' is an inference tensor", "InferenceMode"});
  {
    InferenceMode inference;
    frozen->load_state_dict(source.state_dict());
  }
  CHECK(frozen->weight.to_vector<float>() == source.weight.to_vector<float>());
}

TEST_CASE("Modules cannot be copied, leaf layers move, modules with borrowed children refuse to move",
          "[nn][module]") {
  static_assert(!std::is_copy_constructible_v<nn::Linear>);
  static_assert(!std::is_copy_assignable_v<nn::Linear>);
  static_assert(!std::is_copy_constructible_v<Outer>);
  static_assert(!std::is_copy_constructible_v<nn::Sequential>);
  nn::Linear a(3, 2);
  Tensor w = a.weight;
  nn::Linear b(std::move(a));
  CHECK(b.weight.is_same(w));
  CHECK(b.parameters().size() == 2);
  CHECK(b.parameters()[0].is_same(w));
  CHECK(a.parameters().empty());

  nn::Sequential s1{nn::Linear(2, 2), nn::ReLU()};
  nn::Sequential s2(std::move(s1));
  CHECK(s2.size() == 2);
  CHECK(s2.state_dict().size() == 2);

  Inner inner;
  test::check_error([&] { Inner moved(std::move(inner)); }, {"cannot move a Inner", "submodule 'fc'"});
  CHECK(inner.parameters().size() == 3);  // the refused move left it intact
  // Owned children can be nested through shared_ptr.
  nn::Sequential outer;
  outer.push_back(std::make_shared<Inner>());
  outer.push_back(nn::ReLU());
  CHECK(outer.state_dict().keys() == std::vector<std::string>{"0.scale", "0.steps", "0.fc.weight", "0.fc.bias"});
}

TEST_CASE("to(dtype) keeps parameter identity, so an optimizer built afterwards sees the new data",
          "[nn][module]") {
  Outer m;
  Tensor w = m.a.fc.weight;
  std::vector<float> before = w.to_vector<float>();
  m.to(kFloat64);
  CHECK(w.dtype() == kFloat64);
  CHECK(m.a.fc.weight.is_same(w));
  CHECK(m.parameters()[1].is_same(w));
  CHECK(m.state_dict().at("a.steps").dtype() == kInt64);  // integer buffers keep their dtype
  std::vector<double> after = w.to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i) CHECK(after[i] == static_cast<double>(before[i]));
  // Training still reaches the moved tensors.
  Tensor loss = m(test::sample({2, 3}, kFloat64)).sum();
  loss.backward();
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == kFloat64);
  m.to(Device::cpu());  // a no-op on the same device
  CHECK(m.a.fc.weight.is_same(w));
  test::check_error([&] { m.to(kInt32); }, {"only floating dtypes"});
}

TEST_CASE("zero_grad clears or zeroes the gradients", "[nn][module]") {
  nn::Linear l(3, 2);
  l(test::sample({4, 3})).sum().backward();
  REQUIRE(l.weight.grad().defined());
  l.zero_grad(false);
  test::check_equal(l.weight.grad(), zeros({2, 3}));
  l.zero_grad();
  CHECK_FALSE(l.weight.grad().defined());
}

TEST_CASE("train and eval reach every submodule, apply visits children first", "[nn][module]") {
  Outer m;
  CHECK(m.is_training());
  m.eval();
  for (nn::Module* sub : m.modules()) CHECK_FALSE(sub->is_training());
  m.train();
  CHECK(m.seq[1].is_training());
  std::vector<std::string> order;
  m.seq.apply([&](nn::Module& mod) { order.push_back(mod.name()); });
  CHECK(order == std::vector<std::string>{"Linear", "Tanh", "Linear", "Sequential"});
  // apply is how users initialise weights.
  m.apply([](nn::Module& mod) {
    if (auto* lin = dynamic_cast<nn::Linear*>(&mod)) nn::init::zeros_(lin->weight);
  });
  test::check_equal(m.seq.at<nn::Linear>(0).weight.detach(), zeros({4, 4}));
}

TEST_CASE("Forward hooks run around forward, can replace values and be removed", "[nn][module][hooks]") {
  nn::Linear l(3, 2);
  Tensor x = test::sample({4, 3});
  std::vector<std::string> calls;
  auto pre = l.register_forward_pre_hook([&](nn::Module& m, const Tensor& in) {
    calls.push_back("pre " + m.name());
    return in * 2;  // replaces the input
  });
  auto post = l.register_forward_hook([&](nn::Module&, const Tensor& in, const Tensor& out) {
    calls.push_back("post");
    test::check_close(out, nn::linear(in, l.weight, l.bias));  // `in` is what forward received
    return Tensor();  // keeps the output
  });
  test::check_close(l(x), nn::linear(x * 2, l.weight, l.bias));
  CHECK(calls == std::vector<std::string>{"pre Linear", "post"});
  pre.remove();
  pre.remove();  // twice is fine
  test::check_close(l(x), nn::linear(x, l.weight, l.bias));
  CHECK(calls.size() == 3);
  post.remove();
  l(x);
  CHECK(calls.size() == 3);
  // Hooks on a child run when the parent calls it; forward() itself bypasses them, as in PyTorch.
  nn::Sequential seq{nn::Linear(3, 3), nn::ReLU()};
  int relu_calls = 0;
  auto h = seq[1].register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& y) {
    ++relu_calls;
    return -y;
  });
  Tensor y = seq(x);
  CHECK(relu_calls == 1);
  CHECK(y.max().item<float>() <= 0);
  {
    nn::Linear gone(2, 2);
    h = gone.register_forward_hook([](nn::Module&, const Tensor&, const Tensor&) { return Tensor(); });
  }
  h.remove();  // after its module is gone: nothing happens
}

TEST_CASE("A module without forward says so", "[nn][module]") {
  struct NoForward : nn::Module {};
  NoForward m;
  test::check_error([&] { m(zeros({1})); }, {"NoForward has no forward"});
}

TEST_CASE("Printing shows the module tree as PyTorch, then the parameter count", "[nn][module][print]") {
  Outer m;
  std::string expected =
      "Outer(\n"
      "  (a): Inner(\n"
      "    (fc): Linear(in_features=3, out_features=4, bias=True)\n"
      "  )\n"
      "  (seq): Sequential(\n"
      "    (0): Linear(in_features=4, out_features=4, bias=True)\n"
      "    (1): Tanh()\n"
      "    (2): Linear(in_features=4, out_features=2, bias=True)\n"
      "  )\n"
      "  (heads): ModuleDict(\n"
      "    (x): Linear(in_features=2, out_features=1, bias=True)\n"
      "    (emb): Embedding(5, 2)\n"
      "  )\n"
      ")\n"
      "Parameters: 63 (63 trainable)";
  CHECK(m.to_string() == expected);
  std::ostringstream os;
  os << m.seq[0];
  CHECK(os.str() == "Linear(in_features=4, out_features=4, bias=True)\nParameters: 20 (20 trainable)");
  CHECK(nn::py_float(1e-5) == "1e-05");
  CHECK(nn::py_float(1) == "1.0");
  CHECK(nn::py_float(0.1) == "0.1");
}

TEST_CASE("Containers: ModuleList and ModuleDict take modules by value or shared_ptr", "[nn][module]") {
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::ModuleList list{nn::Linear(2, 3), shared};
  CHECK(list.size() == 2);
  CHECK(&list[1] == shared.get());  // shared, not copied
  list.push_back(nn::GELU());
  std::vector<std::string> names;
  for (auto& [name, m] : list.named_children()) names.push_back(name + ":" + m->name());
  CHECK(names == std::vector<std::string>{"0:Linear", "1:Linear", "2:GELU"});
  nn::ModuleDict dict{{"enc", std::make_shared<nn::Linear>(4, 4)}, {"act", std::make_shared<nn::ReLU>()}};
  CHECK(dict.keys() == std::vector<std::string>{"enc", "act"});
  CHECK(dict["act"].name() == "ReLU");
  test::check_error([&] { dict["dec"]; }, {"no module named 'dec'"});
  test::check_error([&] { dict.insert("enc", nn::Tanh()); }, {"already has an attribute 'enc'"});
  // ModuleList has no forward of its own; Sequential does.
  test::check_error([&] { list(zeros({1, 2})); }, {"ModuleList has no forward"});
}

TEST_CASE("Containers: ParameterList and ParameterDict hold parameters by name and print as torch's",
          "[nn][module]") {
  nn::ParameterList list{ones({3, 4}), zeros({5}, kFloat64), full({}, 2.0)};
  CHECK(list.size() == 3);
  // PyTorch 1.13's repr of the same list (and below of the dict, and of a module holding a one-item list).
  CHECK(list.to_string().starts_with(
      "ParameterList(\n"
      "    (0): Parameter containing: [torch.float32 of size 3x4]\n"
      "    (1): Parameter containing: [torch.float64 of size 5]\n"
      "    (2): Parameter containing: [torch.float32 of size ]\n"
      ")\nParameters: 18 (18 trainable)"));
  CHECK(list[-1].item<float>() == 2.0f);
  CHECK(list[1].requires_grad());
  (list[0] * 2).sum().backward();
  test::check_equal(list[0].grad(), full({3, 4}, 2.0));
  // Indexing reads the registered parameter: a loaded state dict and set_parameter show through.
  list.load_state_dict({{"0", full({3, 4}, 7.0)}, {"1", zeros({5}, kFloat64)}, {"2", full({}, 3.0)}});
  CHECK(list[0].sum().item<double>() == 84);
  list.set_parameter("2", full({}, -1.0));
  CHECK(list.values()[2].item<float>() == -1.0f);
  list.extend({ones({2})});
  CHECK(list.named_parameters().back().first == "3");
  test::check_error([&] { list[4]; }, {"nn::ParameterList", "index 4 is out of range (4 parameters)"});
  test::check_error([&] { list[-5]; }, {"nn::ParameterList", "index -5"});
  test::check_error([&] { list.append(Tensor()); }, {"nn::ParameterList", "undefined"});
  test::check_error([&] { list.append(zeros({2}, kInt64)); }, {"parameter '4' must be floating", "int64"});
  test::check_error([&] { list(zeros({1})); }, {"ParameterList has no forward"});

  nn::ParameterDict dict{{"b", ones({2})}, {"a", ones({1, 2, 3}, kFloat64)}};
  CHECK(dict.keys() == std::vector<std::string>{"b", "a"});  // insertion order, as an OrderedDict's
  CHECK(dict.to_string().starts_with(
      "ParameterDict(\n"
      "    (b): Parameter containing: [torch.FloatTensor of size 2]\n"
      "    (a): Parameter containing: [torch.DoubleTensor of size 1x2x3]\n"
      ")"));
  dict.insert("b", full({2}, 5.0));  // replaces, keeping its place
  CHECK(dict.size() == 2);
  CHECK(dict["b"].sum().item<float>() == 10.0f);
  CHECK(dict.contains("a"));
  CHECK_FALSE(dict.contains("c"));
  test::check_error([&] { dict["c"]; }, {"nn::ParameterDict", "no parameter named 'c'"});

  struct Holder : nn::Module {
    nn::Linear l{2, 3};
    nn::ParameterList p{ones({2})};
    Holder() { register_modules({{"l", l}, {"p", p}}); }
  } holder;
  CHECK(holder.to_string().starts_with(
      "Holder(\n"
      "  (l): Linear(in_features=2, out_features=3, bias=True)\n"
      "  (p): ParameterList(  (0): Parameter containing: [torch.float32 of size 2])\n"
      ")"));
  std::vector<std::string> names;
  for (const auto& [name, t] : holder.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"l.weight", "l.bias", "p.0"});
}

namespace {
// A block with a dropout in it, so that the recompute must draw the same mask.
nn::Sequential mlp_block() { return nn::Sequential{nn::Linear(8, 32), nn::GELU(), nn::Dropout(0.3), nn::Linear(32, 8)}; }

// loss of net on x with the generator at `seed`, then backward; returns the loss.
double loss_and_backward(nn::Module& net, const Tensor& x, uint64_t seed) {
  manual_seed(seed);
  Tensor loss = net(x).square().mean();
  loss.backward();
  return loss.item<double>();
}
}  // namespace

TEST_CASE("CheckpointWrapper: the plain module's state dict keys, loss and gradients, activations not kept",
          "[nn][module][checkpoint]") {
  manual_seed(4);
  nn::Sequential plain{mlp_block(), mlp_block(), nn::Linear(8, 3)};
  nn::Sequential wrapped{nn::CheckpointWrapper(mlp_block()), nn::CheckpointWrapper(std::make_shared<nn::Sequential>(mlp_block())),
                         nn::Linear(8, 3)};
  // PyTorch's names: the wrapper adds nothing to them, so either state dict loads into the other.
  std::vector<std::string> keys_plain, keys_wrapped;
  for (const auto& [k, t] : plain.state_dict()) keys_plain.push_back(k);
  for (const auto& [k, t] : wrapped.state_dict()) keys_wrapped.push_back(k);
  CHECK(keys_wrapped == keys_plain);
  CHECK(keys_wrapped.front() == "0.0.weight");
  wrapped.load_state_dict(plain.state_dict());
  auto named = wrapped.named_parameters();
  CHECK(named[0].first == "0.0.weight");
  std::vector<std::string> module_names;
  for (const auto& [name, m] : wrapped.named_modules()) module_names.push_back(name);
  CHECK(module_names[1] == "0");
  CHECK(module_names[2] == "0._checkpoint_wrapped_module");
  CHECK(wrapped.to_string().find("(_checkpoint_wrapped_module): Sequential(") != std::string::npos);
  CHECK(dynamic_cast<nn::CheckpointWrapper&>(wrapped[0]).module().name() == "Sequential");

  Tensor x = randn({64, 8});
  const double plain_loss = loss_and_backward(plain, x, 11);
  const double wrapped_loss = loss_and_backward(wrapped, x, 11);
  CHECK(wrapped_loss == plain_loss);  // the dropout masks were drawn again, the same
  auto pp = plain.named_parameters(), pw = wrapped.named_parameters();
  REQUIRE(pp.size() == pw.size());
  for (size_t i = 0; i < pp.size(); ++i) {
    INFO(pp[i].first);
    test::check_equal(pw[i].second.grad(), pp[i].second.grad());
  }
  // Between forward and backward the wrapped blocks keep only their inputs.
  int64_t kept[2];
  nn::Module* nets[2] = {&plain, &wrapped};
  for (int i = 0; i < 2; ++i) {
    const int64_t before = memory::stats(Device::cpu()).allocated_bytes;
    Tensor loss = (*nets[i])(x).square().mean();
    kept[i] = memory::stats(Device::cpu()).allocated_bytes - before;
    loss.backward();
  }
  INFO("plain " << kept[0] << " bytes, wrapped " << kept[1] << " bytes");
  CHECK(kept[0] > 2 * 3 * 64 * 32 * 4);  // each block: GELU's input, the mask, the dropout's output
  CHECK(kept[1] < kept[0] / 3);
  // Without grad recording, or in eval mode, it is the module: the same values, no node.
  wrapped.eval();
  plain.eval();
  {
    NoGradGuard no_grad;
    test::check_equal(wrapped(x), plain(x));
  }
}

TEST_CASE("CheckpointWrapper runs a TransformerBlock's forward_for_recompute in backward, hooks when there are any",
          "[nn][module][checkpoint]") {
  manual_seed(5);
  auto block = std::make_shared<nn::TransformerBlock>(16, 2);
  nn::CheckpointWrapper wrapped(block);
  CHECK(&wrapped.module() == block.get());
  Tensor x = randn({2, 5, 16}).requires_grad_();
  Tensor gy = randn({2, 5, 16});
  // The gradients of x and of every parameter from backward(gy); cleared after. (The recompute's
  // parameter gradients reach .grad() from its own backward, so autograd::grad cannot ask for them,
  // as with PyTorch's reentrant checkpoint.)
  auto params = block->parameters();
  auto grads_of = [&](const Tensor& y) {
    y.backward(gy);
    std::vector<Tensor> out{x.grad().clone()};
    for (const Tensor& p : params) out.push_back(p.grad().clone());
    x.set_grad(Tensor());
    block->zero_grad();
    return out;
  };
  const auto want = grads_of(block->forward(x));
  auto got = grads_of(wrapped(x));
  for (size_t i = 0; i < want.size(); ++i) test::check_close(got[i], want[i], {1e-6, 1e-7});
  // A hook on the wrapped module sees every run of it: the forward and the recompute.
  int calls = 0;
  auto handle = block->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    ++calls;
    return out * 2.0;  // replaces the block's output, both times
  });
  got = grads_of(wrapped(x));
  CHECK(calls == 2);
  for (size_t i = 0; i < want.size(); ++i) test::check_close(got[i], want[i] * 2.0, {1e-6, 1e-7});
  handle.remove();
  // Which function the recompute runs: forward_for_recompute, or forward (through the hooks) while
  // the module has hooks.
  struct Counting : nn::Module {
    nn::Linear fc{4, 4};
    int forwards = 0, recomputes = 0;
    Counting() { register_module("fc", fc); }
    Tensor forward(const Tensor& in) override { return ++forwards, fc(in); }
    Tensor forward_for_recompute(const Tensor& in) override { return ++recomputes, fc(in); }
  };
  auto counting = std::make_shared<Counting>();
  nn::CheckpointWrapper counted(counting);
  counted(randn({3, 4})).sum().backward();
  CHECK(counting->forwards == 1);
  CHECK(counting->recomputes == 1);
  auto noop = counting->register_forward_hook([](nn::Module&, const Tensor&, const Tensor&) { return Tensor(); });
  counted(randn({3, 4})).sum().backward();
  CHECK(counting->forwards == 3);
  CHECK(counting->recomputes == 1);
  noop.remove();
  test::check_error([] { nn::CheckpointWrapper(std::shared_ptr<nn::Module>(), true); }, {"CheckpointWrapper", "null"});
}

TEST_CASE("to(device) on a device that cannot be used fails cleanly and leaves the module where it was",
          "[nn][module]") {
  if (cuda::is_available()) return;  // on a GPU machine the move succeeds (the DESIGN test covers that)
  nn::Linear l(3, 2);
  Tensor w = l.weight;
  test::check_error([&] { l.to(Device::cuda(0)); }, {"CUDA"});
  CHECK(l.weight.is_same(w));
  CHECK(l.weight.is_cpu());
  CHECK(l(zeros({1, 3})).sizes() == Shape{1, 2});
}

TEST_CASE("Modules form a tree: registering an ancestor as a child is an Error, not endless recursion",
          "[nn][module]") {
  nn::Sequential a, b, c;
  a.register_module("b", b);
  b.register_module("c", c);
  test::check_error([&] { c.register_module("a", a); }, {"cannot register submodule 'a'", "cycle"});
  test::check_error([&] { b.register_module("a", a); }, {"cannot register submodule 'a'", "cycle"});
  CHECK(a.modules().size() == 3);  // a, b, c: unchanged by the refused registrations
  nn::Sequential d;
  c.register_module("d", d);  // a new leaf is fine
  CHECK(a.modules().size() == 4);
}

TEST_CASE("a null submodule and a parameter that is not one are Errors, not crashes", "[nn][module]") {
  // Each dereferenced the null pointer (SIGSEGV) before.
  nn::ModuleList list;
  test::check_error([&] { list.push_back(std::shared_ptr<nn::Linear>()); }, {"submodule '0'", "null pointer"});
  nn::ModuleDict dict;
  test::check_error([&] { dict.insert("a", std::shared_ptr<nn::Linear>()); }, {"submodule 'a'", "null pointer"});
  test::check_error([] { nn::ModuleDict({{"b", std::shared_ptr<nn::Module>()}}); }, {"submodule 'b'", "null pointer"});
  nn::Sequential seq;
  test::check_error([&] { seq.push_back(std::shared_ptr<nn::ReLU>()); }, {"null pointer"});
  CHECK(list.size() == 0);
  // set_parameter asks what register_parameter asks: a floating leaf.
  nn::Linear lin(2, 3);
  test::check_error([&] { lin.set_parameter("weight", zeros({3, 2}, kInt64)); }, {"set_parameter", "floating", "int64"});
  Tensor w = zeros({3, 2}).requires_grad_();
  test::check_error([&] { lin.set_parameter("weight", w * 2); }, {"set_parameter", "leaf"});
}

TEST_CASE("get_submodule, get_parameter and get_buffer find by dotted name, requires_grad_ freezes, and the "
          "to() shorthands convert",
          "[nn][module]") {
  nn::Sequential net{nn::Linear(3, 4), nn::BatchNorm1d(4), nn::Sequential{nn::ReLU(), nn::Linear(4, 2)}};
  CHECK(&net.get_submodule("") == &net);
  nn::Module& inner = net.get_submodule("2.1");
  CHECK(inner.name() == "Linear");
  CHECK(net.get_parameter("2.1.weight").is_same(dynamic_cast<nn::Linear&>(inner).weight));
  CHECK(net.get_buffer("1.running_mean").is_same(net.named_buffers()[0].second));
  test::check_error([&] { net.get_submodule("2.5"); },
                    {"get_submodule", "Sequential ('2') has no submodule '5'", "looking for '2.5'"});
  test::check_error([&] { net.get_submodule("x"); }, {"Sequential has no submodule 'x'"});
  test::check_error([&] { net.get_parameter("1.running_mean"); }, {"get_parameter", "no parameter '1.running_mean'"});
  test::check_error([&] { net.get_buffer("0.weight"); }, {"get_buffer", "no buffer '0.weight'"});
  // A tied parameter answers to both of its names (named_parameters lists it once).
  struct Tied : nn::Module {
    nn::Embedding e{5, 3};
    nn::Linear h{3, 5, {.bias = false}};
    Tied() {
      register_modules({{"e", e}, {"h", h}});
      h.weight = h.set_parameter("weight", e.weight);
    }
  } model;
  CHECK(model.named_parameters().size() == 1);
  CHECK(model.get_parameter("h.weight").is_same(model.get_parameter("e.weight")));
  // requires_grad_(false) freezes every parameter, and true thaws them.
  net.get_submodule("2").requires_grad_(false);
  CHECK_FALSE(net.get_parameter("2.1.weight").requires_grad());
  CHECK(net.get_parameter("0.weight").requires_grad());
  net.requires_grad_();
  CHECK(net.get_parameter("2.1.bias").requires_grad());
  // The shorthands: half() and bfloat16() convert the floating parameters and buffers, cpu() stays.
  net.half();
  CHECK(net.get_parameter("0.weight").dtype() == kFloat16);
  CHECK(net.get_buffer("1.num_batches_tracked").dtype() == kInt64);
  net.bfloat16().cpu();
  CHECK(net.get_buffer("1.running_var").dtype() == kBFloat16);
  CHECK(net.get_parameter("0.weight").device() == Device::cpu());
}

TEST_CASE("remove_parameter and remove_buffer unregister a tensor, as Python's del, and name what is there",
          "[nn][module]") {
  nn::BatchNorm1d bn(3);
  const Tensor weight = bn.weight;
  CHECK(bn.remove_parameter("weight").is_same(weight));  // the tensor itself, which the member still holds
  CHECK(bn.weight.is_same(weight));
  CHECK(bn.named_parameters().size() == 1);
  CHECK(bn.named_parameters()[0].first == "bias");
  CHECK(bn.remove_buffer("running_mean").defined());
  std::vector<std::string> keys;
  for (const auto& [key, t] : bn.state_dict()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"bias", "running_var", "num_batches_tracked"});
  test::check_error([&] { bn.remove_parameter("weight"); },
                    {"remove_parameter", "BatchNorm1d has no parameter 'weight'", "its own are 'bias'"});
  test::check_error([&] { bn.remove_buffer("running_mean"); },
                    {"remove_buffer", "no buffer 'running_mean'", "'running_var', 'num_batches_tracked'"});
  nn::ReLU relu;
  test::check_error([&] { relu.remove_parameter("weight"); }, {"ReLU has no parameter 'weight'", "are none"});
  // The name is free again.
  bn.register_parameter("weight", ones({3}));
  CHECK(bn.named_parameters()[1].first == "weight");
}

// models/gpt: GPT-2 against PyTorch (tests/fixtures/gen_gpt_golden.py writes the golden files): one
// forward and backward of a tiny GPT-2 loaded from a Hugging Face-layout file (logits and every
// parameter's gradient within 1e-4 relative), and a 25-step AdamW loss curve from the same init and
// data. Then what the model adds: the Hugging Face file round trip and its errors, generation with and
// without the key/value cache, activation checkpointing (same gradients, dropout masks replayed), and
// gradient accumulation (N micro-batches of b = one batch of N b), and models trained on several
// threads at once.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <barrier>
#include <thread>

#include "core/grad_mode.h"
#include "data/safetensors.h"
#include "models/gpt.h"
#include "ops/autocast.h"
#include "optim/adam.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;
using models::GPT;
using models::GPTConfig;
namespace fs = std::filesystem;

namespace {

// The tiny GPT the gradient tests share, with the gradients of one batch taken and then cleared.
struct TinyGradRun {
  GPT model{GPTConfig{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 13}};
  Tensor idx, targets;
  std::vector<Tensor> grads;  // of GPT::loss(model(idx), targets), per parameter
  explicit TinyGradRun(int64_t batch) : idx(randint(0, 13, {batch, 8})), targets(randint(0, 13, {batch, 8})) {
    GPT::loss(model(idx), targets).backward();
    for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
    model.zero_grad();
  }
};

std::string fixture(const std::string& name) { return std::string(KILN_TEST_FIXTURES) + "/" + name; }

std::string scratch(const std::string& name) {
  return (fs::path(kiln::test::process_scratch_dir("kiln-test-gpt")) / name).string();
}

int64_t meta_int(const safetensors::Metadata& m, const std::string& key) { return std::stoll(m.at(key)); }

GPTConfig config_of(const safetensors::Metadata& m, const std::string& activation) {
  GPTConfig c;
  c.n_layer = meta_int(m, "n_layer");
  c.n_head = meta_int(m, "n_head");
  c.n_embd = meta_int(m, "n_embd");
  c.block_size = meta_int(m, "n_ctx");
  c.vocab_size = meta_int(m, "vocab_size");
  c.gelu_approximate = activation;
  return c;
}

// The entries of `file` whose names start with `prefix`, with the prefix removed.
TensorDict with_prefix(const TensorDict& file, const std::string& prefix) {
  TensorDict out;
  for (const auto& [name, t] : file) {
    if (name.starts_with(prefix)) out.insert(name.substr(prefix.size()), t);
  }
  return out;
}

TensorDict weights_of(const TensorDict& file) {
  TensorDict out;
  for (const auto& [name, t] : file) {
    if (name.starts_with("transformer.")) out.insert(name, t);
  }
  return out;
}

// Within rtol of the expected values, relative to the tensor's largest value (a gradient element
// near zero has no meaningful relative error of its own).
void check_relative(const Tensor& actual, const Tensor& expected, double rtol) {
  const double scale = expected.abs().max().to(kFloat64).item<double>();
  check_close(actual, expected, {rtol, rtol * scale});
}

}  // namespace

TEST_CASE("GPT-2: logits and every gradient equal PyTorch's for a tiny model loaded from a HF file", "[models][gpt]") {
  const std::string path = fixture("gpt_tiny_golden.safetensors");
  TensorDict file = safetensors::load_file(path);
  GPT model(config_of(safetensors::load_metadata(path), "tanh"));
  model.load_state_dict(models::from_hf_gpt2(weights_of(file), model));

  Tensor logits = model(file.at("input.idx"));
  Tensor loss = GPT::loss(logits, file.at("input.targets"));
  check_relative(logits, file.at("out.logits"), 1e-4);
  CHECK(loss.item<double>() == Approx(file.at("out.loss").item<double>()).epsilon(1e-5));
  loss.backward();
  // The file's gradients are in its own (Conv1D) layout: convert them like the weights.
  TensorDict grads = models::from_hf_gpt2(with_prefix(file, "grad."), model);
  int checked = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    check_relative(p.grad(), grads.at(name), 1e-4);
    ++checked;
  }
  CHECK(checked == 2 + 2 * 12 + 2);  // wte, wpe; 12 per block; ln_f
}

TEST_CASE("GPT-2: a 25-step AdamW loss curve follows PyTorch's from the same init and batches", "[models][gpt]") {
  const std::string path = fixture("gpt_curve_golden.safetensors");
  TensorDict file = safetensors::load_file(path);
  const auto meta = safetensors::load_metadata(path);
  GPT model(config_of(meta, "none"));
  model.load_state_dict(models::from_hf_gpt2(weights_of(file), model));
  optim::AdamW opt(model.parameters(), {.lr = std::stod(meta.at("lr")),
                                        .beta1 = std::stod(meta.at("beta1")),
                                        .beta2 = std::stod(meta.at("beta2")),
                                        .eps = std::stod(meta.at("eps")),
                                        .weight_decay = std::stod(meta.at("weight_decay"))});
  Tensor xs = file.at("curve.x"), ys = file.at("curve.y");
  std::vector<float> expected = file.at("curve.loss").to_vector<float>();
  for (int64_t step = 0; step < xs.sizes()[0]; ++step) {
    opt.zero_grad();
    Tensor loss = GPT::loss(model(xs[step]), ys[step]);
    INFO("step " << step);
    CHECK(loss.item<double>() == Approx(expected[step]).epsilon(1e-4));
    loss.backward();
    opt.step();
  }
  TensorDict final_weights = models::from_hf_gpt2(with_prefix(file, "final."), model);
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    check_close(p.detach(), final_weights.at(name), {1e-3, 2e-4});
  }
}

TEST_CASE("GPT: the configurations of BENCHMARKS.md", "[models][gpt]") {
  GPT gpt_char(GPTConfig::gpt_char());
  CHECK(gpt_char.num_parameters() == 842496);
  // Every >= 2-D weight N(0, 0.02) (no scaled residual init), LayerNorms 1 and 0, biases 0.
  Tensor w = gpt_char.block(2).mlp.c_proj.weight;
  CHECK(w.std().item<double>() == Approx(0.02).epsilon(0.02));
  CHECK(gpt_char.block(0).ln_1.weight.eq(1.0).all().item<bool>());
  CHECK(gpt_char.block(3).attn.c_attn.bias.eq(0.0).all().item<bool>());
  // GPT-2 124M: 124,439,808 parameters with the tied head (Hugging Face's count).
  GPTConfig big = GPTConfig::gpt2();
  CHECK(big.n_layer == 12);
  big.n_layer = 1;  // the count per block, without building all twelve
  GPT one(big);
  const int64_t embeddings = 50257 * 768 + 1024 * 768, final_norm = 2 * 768;
  const int64_t per_block = one.num_parameters() - embeddings - final_norm;
  CHECK(embeddings + final_norm + 12 * per_block == 124439808);
  // The residual projections start smaller: std 0.02 / sqrt(2 n_layer).
  CHECK(one.block(0).attn.c_proj.weight.std().item<double>() == Approx(0.02 / std::sqrt(2.0)).epsilon(0.02));
}

TEST_CASE("GPT: Hugging Face files round trip, with or without the prefix, and misfits are errors", "[models][gpt]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 6, .vocab_size = 11};
  GPT a(c);
  const std::string path = scratch("rt.safetensors");
  models::save_hf_gpt2(a, path);
  TensorDict file = safetensors::load_file(path);
  CHECK(file.at("transformer.h.1.attn.c_attn.weight").sizes() == Shape({8, 24}));  // Conv1D (in, out)
  CHECK(file.at("transformer.h.0.mlp.c_fc.weight").sizes() == Shape({8, 32}));
  CHECK_FALSE(file.contains("lm_head.weight"));
  CHECK(safetensors::load_metadata(path).at("activation_function") == "gelu_new");
  GPT b(c);
  models::load_hf_gpt2(b, path);
  Tensor idx = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  check_equal(b(idx), a(idx));

  // A GPT2Model file: no "transformer." prefix, with the mask buffers and a tied lm_head.
  TensorDict bare;
  for (const auto& [name, t] : file) bare.insert(name.substr(std::string("transformer.").size()), t);
  bare.insert("h.0.attn.bias", ones({1, 1, 6, 6}));
  bare.insert("h.0.attn.masked_bias", full({}, -1e4));
  bare.insert("lm_head.weight", file.at("transformer.wte.weight"));
  const std::string bare_path = scratch("bare.safetensors");
  safetensors::save_file(bare, bare_path);
  GPT d(c);
  models::load_hf_gpt2(d, bare_path);
  check_equal(d(idx), a(idx));

  GPTConfig deeper = c;
  deeper.n_layer = 3;
  GPT e(deeper);
  check_error([&] { models::load_hf_gpt2(e, path); },
              {"load_hf_gpt2", "does not fit", "missing transformer.h.2.ln_1.weight"});
  GPTConfig wider = c;
  wider.vocab_size = 12;
  GPT f(wider);
  check_error([&] { models::load_hf_gpt2(f, path); },
              {"transformer.wte.weight has shape [11, 8] in the file", "[12, 8] in the model", "vocab_size 12"});
  GPTConfig shallower = c;
  shallower.n_layer = 1;
  GPT g(shallower);
  check_error([&] { models::load_hf_gpt2(g, path); }, {"unexpected transformer.h.1"});
  // One tensor named twice, with and without the prefix.
  bare.insert("transformer.h.0.ln_1.weight", file.at("transformer.h.0.ln_1.weight"));
  safetensors::save_file(bare, bare_path);
  check_error([&] { models::load_hf_gpt2(d, bare_path); },
              {"holds 'transformer.h.0.ln_1.weight' twice", "with and without the 'transformer.' prefix"});
}

TEST_CASE("GPT: the key/value cache gives the same logits and tokens as running the whole sequence", "[models][gpt]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 12, .vocab_size = 20};
  GPT model(c);
  model.eval();
  NoGradGuard no_grad;
  Tensor idx = from_vector<int64_t>({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7}, {2, 7});
  Tensor full_logits = model(idx);
  // Prompt of 4, then one token at a time, then the last two at once (T > 1 with a cache).
  std::vector<nn::KVCache> caches;
  std::vector<Tensor> pieces{model.forward(idx.narrow(1, 0, 4), &caches)};
  pieces.push_back(model.forward(idx.narrow(1, 4, 1), &caches));
  pieces.push_back(model.forward(idx.narrow(1, 5, 2), &caches));
  CHECK(caches[1].length() == 7);
  check_close(cat(pieces, 1), full_logits, {1e-5, 1e-5});

  Tensor prompt = idx.narrow(1, 0, 3);
  Tensor greedy = model.generate(prompt, 15, {.temperature = 0});  // 18 tokens: past block_size 12
  Tensor greedy_nocache = model.generate(prompt, 15, {.temperature = 0, .use_cache = false});
  CHECK(greedy.sizes() == Shape({2, 18}));
  check_equal(greedy, greedy_nocache);
  check_equal(greedy.narrow(1, 0, 3), prompt);
  // top_k = 1 is greedy whatever the temperature; a seeded generator repeats itself.
  Generator g1(5), g2(5), g3(5);
  check_equal(model.generate(prompt, 6, {.temperature = 2.0, .top_k = 1}, &g1), greedy.narrow(1, 0, 9));
  Tensor s1 = model.generate(prompt, 8, {.temperature = 1.0, .top_k = 5}, &g2);
  Tensor s2 = model.generate(prompt, 8, {.temperature = 1.0, .top_k = 5}, &g3);
  check_equal(s1, s2);
  CHECK(s1.lt(c.vocab_size).all().item<bool>());
  check_error([&] { model(zeros({1, 13}, kInt64)); }, {"longer than the context, block_size = 12"});
  // A cache serves one batch, and one model's layers: another batch size, or a deeper model's
  // caches, are Errors (a bare cat error, and silently cut to n_layer, before).
  check_error([&] { model.forward(idx.narrow(0, 0, 1).narrow(1, 6, 1), &caches); },
              {"KV cache holds keys of shape [2, 2, 7, 8]", "batch 1, 2 heads of 8", "start a new one"});
  caches.resize(3);
  check_error([&] { model.forward(idx.narrow(1, 6, 1), &caches); },
              {"the KV caches are 3", "n_layer = 2", "empty vector"});
}

TEST_CASE("GPT: generate's misuse and edge cases", "[models][gpt]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 6, .vocab_size = 11};
  GPT model(c);
  // An empty batch gives an empty result of the full width (it read seqs[0] of nothing).
  Tensor none = model.generate(zeros({0, 2}, kInt64), 3);
  CHECK(none.sizes() == Shape({0, 5}));
  CHECK(model.generate(zeros({0, 2}, kInt32), 0).dtype() == kInt32);
  // Float ids were truncated (1.7 became 1).
  check_error([&] { model.generate(tensor({1.7, 2.9}).reshape({1, 2}), 2); },
              {"GPT::generate", "expected token ids of int64", "float32"});
  // A step that throws leaves the caller's training mode as it was.
  model.train();
  check_error([&] { model.generate(from_vector<int64_t>({1, 20}, {1, 2}), 1); }, {"20"});
  CHECK(model.is_training());
  // Logits with NaN (a diverged model) are an Error, as torch.multinomial's; greedy too.
  {
    NoGradGuard no_grad;
    model.transformer.ln_f.weight.fill_(NAN);
  }
  for (double temperature : {0.0, 1.0}) {
    check_error([&] { model.generate(from_vector<int64_t>({1, 2}, {1, 2}), 2, {.temperature = temperature}); },
                {"GPT::generate", "row 0 at step 0", "NaN or inf"});
  }
  check_error([&] { model.checkpointing(2); }, {"GPT::checkpointing", "block 2 is not in [0, 2)"});
  check_error([&] { model.checkpointing(-1); }, {"GPT::checkpointing", "block -1"});
  check_error([&] { GPT::loss(scalar_tensor(1.0), zeros({1}, kInt64)); }, {"GPT::loss", "logits of shape []"});
}

// ckpt (plain's weights, some blocks checkpointed) against plain on one batch, both from the same
// generator state: the same loss, bit for bit, and every parameter's gradient within 1e-6.
static void check_checkpointed_like_plain(GPT& plain, GPT& ckpt) {
  Tensor idx = randint(0, 13, {4, 8}), targets = randint(0, 13, {4, 8});
  const Generator::State start = default_generator().get_state();
  Tensor loss_plain = GPT::loss(plain(idx), targets);
  loss_plain.backward();
  default_generator().set_state(start);
  Tensor loss_ckpt = GPT::loss(ckpt(idx), targets);
  loss_ckpt.backward();
  CHECK(loss_ckpt.item<double>() == loss_plain.item<double>());
  auto pa = plain.named_parameters(), pb = ckpt.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    check_close(pb[i].second.grad(), pa[i].second.grad(), {1e-6, 1e-7});
  }
}

TEST_CASE("GPT: activation checkpointing gives the same gradients, dropout masks included", "[models][gpt]") {
  GPTConfig c{.n_layer = 3, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 13, .dropout = 0.2};
  GPT plain(c), ckpt(c);
  ckpt.load_state_dict(plain.state_dict());
  ckpt.set_checkpointing(true);
  ckpt.set_checkpointing(1, false);  // blocks 0 and 2
  CHECK(ckpt.checkpointing(0));
  CHECK_FALSE(ckpt.checkpointing(1));
  check_checkpointed_like_plain(plain, ckpt);
}

TEST_CASE("GPT: the recompute of a checkpointed block skips its last GEMM, same gradients, with dropout too",
          "[models][gpt]") {
  GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 13};  // dropout 0
  GPT plain(c), ckpt(c);
  ckpt.load_state_dict(plain.state_dict());
  ckpt.set_checkpointing(true);
  check_checkpointed_like_plain(plain, ckpt);
  // What the recompute ran: the residual stream h = x + attn(ln_1(x)) plus a projection that was
  // recorded but not computed, so its value is h, and its graph is the block's.
  nn::TransformerBlock& b = plain.block(0);
  Tensor x = randn({2, 8, 16}).requires_grad_();
  Tensor h = x + b.attn(b.ln_1(x));
  Tensor recomputed = b.forward_for_recompute(x);
  check_close(recomputed, h, {1e-6, 1e-6});
  Tensor out = b.forward(x);
  CHECK((out - h).abs().max().item<double>() > 1e-3);  // the projection adds something in forward
  Tensor gy = randn({2, 8, 16});
  auto want = autograd::grad({out}, {x, b.mlp.c_proj.weight, b.ln_1.weight}, {gy});
  auto got = autograd::grad({recomputed}, {x, b.mlp.c_proj.weight, b.ln_1.weight}, {gy});
  for (size_t i = 0; i < want.size(); ++i) check_close(got[i], want[i], {1e-6, 1e-7});
  // With dropout in training: the dropout after the projection still runs (on the zeros), so it draws
  // the masks forward drew, and the gradients are forward's; the generator ends where forward's did.
  GPT dropped(GPTConfig{.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 13, .dropout = 0.5});
  nn::TransformerBlock& d = dropped.block(0);
  const Generator::State start = default_generator().get_state();
  auto dropped_want = autograd::grad({d.forward(x)}, {x, d.mlp.c_proj.weight, d.ln_1.weight}, {gy});
  const Generator::State after = default_generator().get_state();
  default_generator().set_state(start);
  auto dropped_got = autograd::grad({d.forward_for_recompute(x)}, {x, d.mlp.c_proj.weight, d.ln_1.weight}, {gy});
  CHECK(after.offset > start.offset);  // forward drew masks
  CHECK(default_generator().get_state().offset == after.offset);
  for (size_t i = 0; i < dropped_want.size(); ++i) check_close(dropped_got[i], dropped_want[i], {1e-6, 1e-7});
  // Hooks must see the projection's value: then the block runs whole.
  auto handle = b.mlp.c_proj.register_forward_hook([](nn::Module&, const Tensor&, const Tensor&) { return Tensor(); });
  check_equal(b.forward_for_recompute(x), out);
  handle.remove();
}

TEST_CASE("GPT: N micro-batches of b with the loss scaled by 1/N accumulate the gradient of one batch of N b",
          "[models][gpt]") {
  TinyGradRun run(6);
  auto& [model, idx, targets, whole] = run;
  for (int64_t m = 0; m < 3; ++m) {
    (GPT::loss(model(idx.narrow(0, 2 * m, 2)), targets.narrow(0, 2 * m, 2)) / 3).backward();
  }
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) check_close(params[i].grad(), whole[i], {1e-5, 1e-7});
}

TEST_CASE("GPT: activation offload (SaveOnCpu) gives the same gradients, host tensors stay where they are",
          "[models][gpt][offload]") {
  TinyGradRun run(4);
  auto& [model, idx, targets, plain] = run;
  Tensor loss;
  {
    autograd::SaveOnCpu offload;
    loss = GPT::loss(model(idx), targets);
    CHECK(offload.offloaded_bytes() == 0);  // on the CPU already: nothing to copy (tests/cuda checks a GPU)
  }
  loss.backward();
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) check_equal(params[i].grad(), plain[i]);
}

TEST_CASE("GPT: odd arguments are Errors before any work, and a malformed KV cache is not replaced", "[models][gpt]") {
  GPTConfig c{.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 6, .vocab_size = 11};
  GPTConfig none = c;
  none.n_head = 0;
  CHECK(none.head_dim() == 0);  // was a division by zero (SIGFPE)
  GPT model(c);
  const Tensor prompt = zeros({1, 2}, kInt64);
  check_error([&] { model.generate(prompt, -1); }, {"max_new_tokens", "got -1"});
  check_error([&] { model.generate(prompt, int64_t{1} << 62); }, {"max_new_tokens"});
  CHECK(model.generate(prompt, 0).sizes() == Shape{1, 2});
  // A cache of the wrong rank read as empty (its length from past the shape) and was overwritten.
  nn::KVCache cache{zeros({4}), zeros({4})};
  check_error([&] { model.block(0).attn.forward(randn({1, 2, 8}), &cache); }, {"KV cache", "[4]"});
  // Dropout outside [0, 1] is an Error when the block is built, not at its first training step.
  check_error([] { nn::CausalSelfAttention(8, 2, {.dropout = 2}); }, {"CausalSelfAttention", "dropout", "[0, 1]"});
  check_error([] { nn::GeluMLP(8, {.dropout = -1}); }, {"GeluMLP", "dropout", "[0, 1]"});
  check_error([] { nn::TransformerBlock(8, 2, {.dropout = std::nan("")}); }, {"dropout", "[0, 1]"});

  // An infinite temperature made a top_k-masked logit's -inf / inf a NaN, and the sampler then
  // returned the last token, V - 1, every time.
  check_error([&] { model.generate(prompt, 1, {.temperature = INFINITY, .top_k = 1}); },
              {"temperature (inf) must be finite"});
  // Each layer's cache must hold as many positions as layer 0's, whose length gives the positions.
  GPTConfig two = c;
  two.n_layer = 2;
  GPT deep(two);
  std::vector<nn::KVCache> a, b;
  deep.forward(ones({1, 2}, kInt64), &a);
  deep.forward(ones({1, 5}, kInt64), &b);
  a[1] = b[1];
  check_error([&] { deep.forward(ones({1, 1}, kInt64), &a); },
              {"the KV cache of layer 1 holds 5 positions but layer 0's holds 2"});
  // 10^9 thin layers: refused at once (they were built one at a time, for about a day), with the
  // parameter count: 10^9 (12 d^2 + 13 d) for d = 8, plus the embeddings and ln_f.
  GPTConfig huge = c;
  huge.n_layer = 1000000000;
  check_error([&] { GPT{huge}; }, {"GPT: this config has 8.72e+11 parameters", "more than this machine's memory"});
  huge.n_layer = int64_t{1} << 62;
  check_error([&] { GPT{huge}; }, {"GPT: this config has", "n_layer = 4611686018427387904"});
}

namespace {
// One of the runs below: a small GPT, its AdamW and its batch, made from one seed; what `kind` does
// with them: 0 trains, 1 trains under bfloat16 autocast, 2 trains with every block checkpointed, 3
// only evaluates, under NoGradGuard. Each keeps its losses (or logits' sums) step by step.
struct ThreadRun {
  int kind;
  std::unique_ptr<GPT> model;
  std::unique_ptr<optim::AdamW> opt;
  Tensor idx, targets;
  std::vector<float> trace;
  explicit ThreadRun(int kind) : kind(kind) {
    manual_seed(1000);
    model = std::make_unique<GPT>(GPTConfig{.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 16,
                                            .vocab_size = 64});
    model->set_checkpointing(kind == 2);
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2});
    idx = randint(0, 64, {3, 16});
    targets = randint(0, 64, {3, 16});
  }
  std::string error;  // what a step threw, if one did
  // `steps` steps; with `sync`, each step starts when every run has arrived at it, so that the
  // runs' steps overlap.
  void run(int steps, std::barrier<>* sync = nullptr) {
    for (int s = 0; s < steps; ++s) {
      if (sync) sync->arrive_and_wait();
      try {
        step();
      } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
      }
    }
  }
  void step() {
    if (kind == 3) {
      NoGradGuard no_grad;
      Tensor logits = (*model)(idx);
      trace.push_back(logits.requires_grad() ? -1.0f : logits.sum().item<float>());  // -1: grad mode leaked in
      return;
    }
    opt->zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(Device::cpu(), kBFloat16, /*enabled=*/kind == 1);
      loss = GPT::loss((*model)(idx), targets);
    }
    loss.backward();
    opt->step();
    trace.push_back(loss.item<float>());
  }
};
}  // namespace

TEST_CASE("GPT: models trained on four threads at once get what each gets alone, grad mode and autocast per thread",
          "[models][gpt]") {
  // Autocast's state, grad mode and the autograd engine's are the thread's own, and the CPU's pool
  // and allocator are shared: the four runs together must give, bit for bit, what each gives alone.
  const int steps = 20;
  std::vector<std::unique_ptr<ThreadRun>> alone, together;
  for (int kind = 0; kind < 4; ++kind) {
    alone.push_back(std::make_unique<ThreadRun>(kind));
    together.push_back(std::make_unique<ThreadRun>(kind));
  }
  for (auto& r : alone) r->run(steps);
  std::barrier<> sync(4);
  std::vector<std::thread> threads;
  for (auto& r : together) threads.emplace_back([&r, &sync] { r->run(steps, &sync); });
  for (auto& t : threads) t.join();
  for (int kind = 0; kind < 4; ++kind) {
    INFO("run " << kind);
    CHECK(alone[kind]->error == "");
    CHECK(together[kind]->error == "");
    CHECK(together[kind]->trace == alone[kind]->trace);
    if (kind < 3) CHECK(alone[kind]->trace.back() < alone[kind]->trace.front() - 0.5f);  // they did train
    const auto a = alone[kind]->model->parameters(), b = together[kind]->model->parameters();
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].to_vector<float>() == b[i].to_vector<float>());
  }
  // The same model and batch in each: autocast changed its own run's losses (bfloat16 products).
  CHECK(alone[1]->trace != alone[0]->trace);
}
